// plugins/kimi_k3/constrained: enforcing an OpenAI `response_format` (ABI 1.4) on what a K3
// session generates, with common/grammar's JSON matcher and token filter.
//
//   COLI_ASSIGN_OR_RETURN(auto vocab, ConstraintVocab::Build(tokenizer, model_vocab, stop_ids));
//   // per generation (prefill):
//   COLI_ASSIGN_OR_RETURN(auto c, grammar::JsonConstraint::FromResponseFormat(format_json));
//   AnswerConstraint answer(c, *vocab, chat_parse_mode);
//   // per step, before sampling:
//   COLI_RETURN_IF_ERROR(answer.Mask(&logits));    // disallowed ids -> -inf
//   ... sample id ...
//   answer.Accept(id);
//
// K3 is a thinking model, so the constraint covers the ANSWER, not the reasoning (XTML, spec §6):
//  - plain text (mode 0) and a chat whose prompt ends in the response channel (or has no
//    generation prompt): the answer starts at the first generated token;
//  - a chat that starts in the think channel: reasoning is free text, but no structural token
//    may open anything and the message may not end there (the only special token allowed is
//    <|close|>). When the model samples <|close|>, the rest of the transition is forced:
//    `think<|sep|><|open|>response<|sep|>`, and the answer starts.
// While answering, only tokens whose bytes keep the answer a prefix of a value the format allows
// are allowed (no special token, no structure). Once the matcher can end (CanEnd) the row's stop
// tokens are allowed too and, in chat, <|close|>, after which the well-formed end of the message
// is forced (`response<|sep|><|close|>message<|sep|><|end_of_msg|>`); when it must end (MustEnd)
// those are the only choices. So a message that ends always holds one complete valid value.
//
// Tool calls (tool_choice "required" or a named function; the host passes them as the plugin
// family's response_format extension {"type":"coli_tool_calls",…}, see ToolCallSpec): after the
// reasoning, the answer is one or more calls in the vendor's form, as the renderer writes an
// assistant's tool_calls (chat.cc, spec §6.2):
//   <|close|>response<|sep|><|open|>tools<|sep|><|open|>call tool="NAME" index="K"<|sep|>BODY
//   <|close|>call<|sep|> … <|close|>tools<|sep|><|close|>message<|sep|><|end_of_msg|>
// BODY is what the model chooses among the two forms the parser reads:
//  - typed arguments, the form the renderer writes (so the one K3 was trained on): elements
//    `<|open|>argument key="KEY" type="TYPE"<|sep|>VALUE<|close|>argument<|sep|>`, each key of
//    the parameters' `properties` at most once and in any order (plus other keys when
//    additionalProperties allows them), TYPE one the key's schema allows, VALUE that schema's
//    value — a string raw (as the renderer writes it: its JSON-escaped form is what the key's
//    schema checks), anything else as JSON; the call closes once every required key is in;
//  - one `<|open|>json type="object"<|sep|>ARGS<|close|>json<|sep|>` block (ARGS the whole
//    parameters schema, its object keys in the order the model saw the tool declared: the
//    renderer key-sorts tool schemas, spec §6.2), chosen before any argument. A tool whose schema
//    does not split into per-key schemas (TypedArguments) offers only this form.
// Structure is forced where there is no choice; the tag texts (NAME, the element headers) are
// matched byte by byte (any segmentation into ordinary tokens). After a call, a named choice (or
// "single": parallel_tool_calls false) ends the message; "required" lets the model open another
// call or end.
//
// tool_choice "auto" (mode "auto", the default whenever tools are offered) is LAZY, as
// llama.cpp's lazy grammars: reasoning and answer stay free, and the row draws exactly what it
// would draw unconstrained (`watching()`: sample as usual, then `Permits(id)`) until a sampled
// token opens a call — an <|open|> run whose bytes start with `call ` (the parser's call tag).
// A token that would open a call whose header cannot be completed (an unknown tool name, a
// wrong index, a call past the one allowed by "single") is refused by Permits, and the row
// redraws under the mask (`Mask`), where it is excluded. Once a valid opener is taken the rest
// of the call is constrained: the header's bytes `call tool="NAME" index="K"` (NAME among the
// tools, K = the call's position in the message, any segmentation) and <|sep|>, then BODY as
// above and `<|close|>call<|sep|>`; then the row is free again.
// tool_choice "none" (mode "none", tools offered): the same watching, with no call allowed —
// a token that would open one is redrawn under the mask.
// "auto" together with a response_format (the extension's "response_format" member): the
// answer is the format's value OR tool calls — at the answer's first byte <|close|> is allowed
// too, and closes the (empty) response into the "required" machinery above.
#ifndef COLI_PLUGINS_KIMI_K3_CONSTRAINED_H_
#define COLI_PLUGINS_KIMI_K3_CONSTRAINED_H_

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/grammar/json_constraint.h"
#include "common/tokenizer/tokenizer.h"

namespace coli::k3 {

// XTML argument types (spec §6.2), one bit each in TypedArguments' masks.
enum XtmlArgType : uint8_t { kArgString, kArgNumber, kArgBoolean, kArgNull, kArgObject, kArgArray };
inline constexpr int kNumXtmlArgTypes = 6;

// A tool's parameters split into one schema per key, for the typed-argument form: built when the
// compiled schema's root is an object (grammar::SplitObject), each key's constraint a view into
// the whole schema's grammar. Anything else (a root anyOf, a type list) leaves the tool with the
// json-block form only.
struct TypedArguments {
  struct Key {
    std::string name;  // as in the schema
    std::string attr;  // as written inside key="…" (XTML attribute escaping)
    bool required = false;
    std::shared_ptr<const grammar::JsonConstraint> value;  // the property's schema
    uint8_t types = 0;                                     // XtmlArgType bits its value may have
  };
  std::vector<Key> keys;
  std::vector<std::pair<std::string, int>> by_attr;  // (attr, index in keys), sorted
  // Keys beyond `keys` (additionalProperties not false): 1-64 bytes of printable ASCII but `"`
  // and `&`, so they need no escaping.
  bool additional = false;
  std::shared_ptr<const grammar::JsonConstraint> additional_value;
  uint8_t additional_types = 0;
};

// The calls a tool-call constraint allows (from the host's {"type":"coli_tool_calls","mode":
// "required"|"named","tools":[{"name":…,"parameters":{…}},…]}).
struct ToolCallSpec {
  bool named = false;   // exactly one call (of the only tool), else one or more
  bool single = false;  // "single": true (parallel_tool_calls false): exactly (auto: at most) one
  bool lazy = false;    // mode "auto" / "none": calls the model opens itself are constrained
  bool none = false;    // mode "none": no call may open (names empty)
  std::vector<std::string> names;
  std::vector<std::shared_ptr<const grammar::JsonConstraint>> parameters;  // per name
  std::vector<std::shared_ptr<const TypedArguments>> typed;  // per name; null: json block only
  // Auto only: tools whose parameters schema the grammar refuses and that are not strict get
  // "any JSON object" (their names here); a strict one is refused.
  std::vector<std::string> relaxed;
  // Auto only: the request's response_format (null when none): answer = its value or calls.
  std::shared_ptr<const grammar::JsonConstraint> answer;
};
// True when `format_json` is a coli_tool_calls object (checked cheaply; Parse validates).
bool IsToolCallFormat(std::string_view format_json);
// INVALID_ARGUMENT naming the tool (a name that is not [A-Za-z0-9_.-]{1,64}, a parameters schema
// the grammar refuses, with its path — under "auto" only for a strict tool) or the malformed
// member.
absl::StatusOr<std::shared_ptr<const ToolCallSpec>> ParseToolCallSpec(std::string_view format_json);

// One model's vocabulary as the constraint sees it; built once per model, immutable after.
class ConstraintVocab {
 public:
  // `vocab_size` is the model's (ids past the tokenizer's are never allowed); `stop_ids` the
  // model-owned stops. INVALID_ARGUMENT when a stop id is outside the vocabulary.
  static absl::StatusOr<std::unique_ptr<ConstraintVocab>> Build(const tok::Tokenizer& tokenizer,
                                                                int32_t vocab_size,
                                                                std::span<const int32_t> stop_ids);

  int32_t vocab_size() const { return static_cast<int32_t>(bytes_.size()); }
  const std::string& bytes(int32_t id) const { return bytes_[id]; }  // empty for specials
  const grammar::TokenFilter& filter() const { return *filter_; }
  const std::vector<int32_t>& stop_ids() const { return stop_ids_; }
  bool has_structure() const { return open_ >= 0; }

 private:
  friend class AnswerConstraint;
  ConstraintVocab() = default;
  std::vector<std::string> bytes_;
  std::unique_ptr<grammar::TokenFilter> filter_;
  std::vector<int32_t> stop_ids_;
  // XTML (-1 / empty when the tokenizer lacks them: chat constraints are then refused).
  int32_t open_ = -1, close_ = -1, sep_ = -1, end_of_msg_ = -1;
  std::vector<int32_t> think_, response_, message_;  // the tag names' ordinary tokens
  // Tool-call pieces, each encoded alone as the renderer's segments are.
  std::vector<int32_t> tools_, call_, json_, argument_, tool_attr_, index_attr_, eq_quote_, quote_;
  // Ordinary ids whose bytes a JSON string must escape (`"`, `\`, control bytes), with their
  // escaped bytes: a raw string argument's bytes go to the matcher escaped, so the filter's
  // answer is redone for these (3,615 of K3's 163,840).
  std::vector<std::pair<int32_t, std::string>> escaped_;
  std::vector<std::vector<int32_t>> digits_;  // "0".."9"
};

// One generation's constraint. Copyable.
class AnswerConstraint {
 public:
  // `chat_parse_mode`: 0 = plain text, else the K3 ParseMode of the session's render.
  // INVALID_ARGUMENT for a chat mode when the vocabulary has no XTML tokens, or an unknown mode.
  static absl::StatusOr<AnswerConstraint> Create(
      std::shared_ptr<const grammar::JsonConstraint> constraint, const ConstraintVocab& vocab,
      int32_t chat_parse_mode);
  // A tool-call constraint; INVALID_ARGUMENT unless the chat has a generation prompt (think or
  // response; "auto" without a response_format: any chat mode) and the vocabulary has XTML
  // tokens.
  static absl::StatusOr<AnswerConstraint> CreateToolCalls(std::shared_ptr<const ToolCallSpec> spec,
                                                          const ConstraintVocab& vocab,
                                                          int32_t chat_parse_mode);

  // allowed[id] = 1 for the ids the next token may be (resized to the vocabulary).
  void Allowed(std::vector<uint8_t>* allowed) const;
  // Sets every disallowed logit to -inf (logits.size() must be the vocabulary's). INTERNAL
  // naming the answer's byte position when no token at all is allowed (a vocabulary that
  // cannot spell the value).
  absl::Status Mask(std::span<float> logits) const;
  // The token sampled. An id Allowed did not allow ends the constraint (nothing more is masked).
  void Accept(int32_t id);

  // Lazy tool calls (mode "auto"): true while no call is open, so the row samples exactly as an
  // unconstrained row and keeps the token when Permits(id); otherwise it redraws under Mask.
  bool watching() const { return phase_ == Phase::kFree; }
  // Whether `id` may be the next token (cheap while watching(); else one Allowed()).
  bool Permits(int32_t id) const;

  bool answering() const { return phase_ == Phase::kAnswer; }
  bool ended() const { return phase_ == Phase::kDone; }
  int calls() const { return calls_; }  // tool calls whose arguments were closed
  const grammar::JsonMatcher& matcher() const { return matcher_; }

 private:
  enum class Phase {
    kThink,
    kForced,
    kAnswer,
    kToolName,
    kArgs,
    kAfterCall,
    kDone,
    kFree,      // lazy: nothing open; <|open|> runs are watched for a call opener
    kHeader,    // lazy: inside a call's opening run, `call tool="NAME" index="K"` byte by byte
    kCallBody,  // inside a call, between elements: <|open|> an element or <|close|> the call
    kElement,   // inside an element's opening run: `argument key=… type=…` / `json type=…`
    kArgValue,  // a typed argument's value (matcher_: its key's schema)
  };
  bool CallsLeft() const;
  // Tools beside a response_format: the answer is the value, or calls instead.
  bool ValueOrCalls() const { return chat_ && tools_ != nullptr && tools_->answer != nullptr; }
  // Lazy: `text` (an opening run's bytes) opens a call / is a prefix of a valid header.
  static bool OpensCall(std::string_view text);
  std::vector<std::string> Headers() const;
  bool HeaderPrefix(std::string_view text, bool whole) const;
  bool FreePermits(int32_t id) const;
  void Force(std::vector<int32_t> ids, Phase after);
  void StartCall();  // forces `<|open|>call tool="` (or `call tool="` after a sampled open)
  void AfterName();  // the name is complete: forces ` index="K"<|sep|>`, then the body
  void BeginCall(const std::string& name);  // the body of a call of `name` starts
  // The call's <|close|> was taken: `ids` (the rest of its closing, up to `call<|sep|>`) are
  // forced, then another call / the end of the message / (lazy) free text.
  void EndCall(std::vector<int32_t> ids);
  // Typed body: keys still allowed, required keys all written, an element header's bytes.
  bool KeysLeft() const;
  bool RequiredDone() const;
  bool ElementPrefix(std::string_view text, bool whole) const;
  bool KeyPrefix(std::string_view key) const;
  bool ExtraKeyPrefix(std::string_view key) const;
  // The key an element names (`text` between key=" and "): its index in typed_->keys, or -1 for
  // an additional key; false when it may not be written (unknown, used, malformed).
  bool KeyOf(std::string_view key, int* index) const;
  uint8_t TypesOf(int key) const;
  void ArgValueAllowed(std::vector<uint8_t>* allowed) const;
  void JsonValueAllowed(uint8_t type, std::vector<uint8_t>* allowed) const;
  bool ArgValueAccepts(int32_t id) const;
  AnswerConstraint(std::shared_ptr<const grammar::JsonConstraint> constraint,
                   const ConstraintVocab& vocab, bool chat);
  const ConstraintVocab* vocab_;
  grammar::JsonMatcher matcher_;
  bool chat_;
  Phase phase_ = Phase::kAnswer;
  std::vector<int32_t> forced_;  // kForced: ids still to come, in order
  size_t forced_pos_ = 0;
  Phase after_forced_ = Phase::kAnswer;
  // Tool calls (null for a response_format).
  std::shared_ptr<const ToolCallSpec> tools_;
  std::string name_;  // kToolName: bytes of `NAME"` chosen so far
  int calls_ = 0;
  // Lazy (kFree / kHeader): inside an <|open|> run that may still become a call, its bytes.
  // kElement: the element's opening run so far.
  bool lazy_ = false;
  bool in_run_ = false;
  std::string run_;
  // The call being written: its tool's typed form (null: json block only), elements written,
  // declared keys used, additional keys used; the argument whose value is being read.
  size_t tool_ = 0;
  const TypedArguments* typed_ = nullptr;
  int elements_ = 0;
  std::vector<bool> used_;
  size_t keys_left_ = 0;  // declared keys not written yet that some value fits
  std::vector<std::string> extra_keys_;
  int arg_key_ = -1;  // -1: an additional key, arg_extra_
  std::string arg_extra_;
  uint8_t arg_type_ = kArgString;
};

}  // namespace coli::k3

#endif  // COLI_PLUGINS_KIMI_K3_CONSTRAINED_H_
