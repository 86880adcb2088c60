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
// assistant's tool_calls (chat.cc):
//   <|close|>response<|sep|><|open|>tools<|sep|>
//   <|open|>call tool="NAME" index="K"<|sep|><|open|>json type="object"<|sep|>ARGS<|close|>json
//   <|sep|><|close|>call<|sep|> … <|close|>tools<|sep|><|close|>message<|sep|><|end_of_msg|>
// Everything but NAME and ARGS is forced. NAME is chosen among the allowed names byte by byte
// (ordinary tokens whose bytes keep `NAME"` a prefix of an allowed one); ARGS is constrained by
// that function's parameters schema, and <|close|> is allowed once it can end. After a call, a
// named choice (or "single": parallel_tool_calls false) ends the message; "required" lets the
// model open another call or end.
//
// tool_choice "auto" (mode "auto", the default whenever tools are offered) is LAZY, as
// llama.cpp's lazy grammars: reasoning and answer stay free, and the row draws exactly what it
// would draw unconstrained (`watching()`: sample as usual, then `Permits(id)`) until a sampled
// token opens a call — an <|open|> run whose bytes start with `call ` (the parser's call tag).
// A token that would open a call whose header cannot be completed (an unknown tool name, a
// wrong index, a call past the one allowed by "single") is refused by Permits, and the row
// redraws under the mask (`Mask`), where it is excluded. Once a valid opener is taken the rest
// of the call is constrained: the header's bytes `call tool="NAME" index="K"` (NAME among the
// tools, K = the call's position in the message, any segmentation) and <|sep|>, then forced
// `<|open|>json type="object"<|sep|>`, ARGS (that tool's parameters schema), <|close|> once
// they can end and the forced `json<|sep|><|close|>call<|sep|>`; then the row is free again.
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
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/grammar/json_constraint.h"
#include "common/tokenizer/tokenizer.h"

namespace coli::k3 {

// The calls a tool-call constraint allows (from the host's {"type":"coli_tool_calls","mode":
// "required"|"named","tools":[{"name":…,"parameters":{…}},…]}).
struct ToolCallSpec {
  bool named = false;   // exactly one call (of the only tool), else one or more
  bool single = false;  // "single": true (parallel_tool_calls false): exactly (auto: at most) one
  bool lazy = false;    // mode "auto" / "none": calls the model opens itself are constrained
  bool none = false;    // mode "none": no call may open (names empty)
  std::vector<std::string> names;
  std::vector<std::shared_ptr<const grammar::JsonConstraint>> parameters;  // per name
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
  std::vector<int32_t> tools_, call_, json_, tool_attr_, index_attr_, type_attr_, eq_quote_, quote_,
      object_;
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
    kFree,    // lazy: nothing open; <|open|> runs are watched for a call opener
    kHeader,  // lazy: inside a call's opening run, `call tool="NAME" index="K"` byte by byte
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
  void AfterName();  // the name is complete: forces ` index="K"<|sep|><|open|>json …<|sep|>`
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
  bool lazy_ = false;
  bool in_run_ = false;
  std::string run_;
};

}  // namespace coli::k3

#endif  // COLI_PLUGINS_KIMI_K3_CONSTRAINED_H_
