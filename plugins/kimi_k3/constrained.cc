// Enforcing response_format on K3 output; see constrained.h.
#include "plugins/kimi_k3/constrained.h"

#include <algorithm>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status/status.h"
#include "nlohmann/json.hpp"
#include "plugins/kimi_k3/chat.h"
#include "plugins/kimi_k3/chat_json.h"
#include "plugins/kimi_k3/chat_parser.h"

namespace coli::k3 {
namespace {

constexpr std::string_view kToolCallsType = "coli_tool_calls";

// OpenAI's function-name alphabet: nothing that XTML attribute escaping would change.
bool IsPlainToolName(const std::string& name) {
  if (name.empty() || name.size() > 64) return false;
  for (char c : name) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '_' || c == '-' || c == '.';
    if (!ok) return false;
  }
  return true;
}

void Append(std::vector<int32_t>* out, std::initializer_list<const std::vector<int32_t>*> parts) {
  for (const std::vector<int32_t>* p : parts) out->insert(out->end(), p->begin(), p->end());
}

constexpr std::string_view kXtmlTypeNames[kNumXtmlArgTypes] = {"string", "number", "boolean",
                                                               "null",   "object", "array"};
constexpr std::string_view kJsonElement = "json type=\"object\"";
constexpr std::string_view kArgElement = "argument key=\"";
constexpr size_t kMaxExtraKeyBytes = 64;
// Additional keys one call may write (so a call without required keys always can end).
constexpr size_t kMaxExtraKeys = 4096;

// Printable ASCII but `"` and `&`: nothing attribute escaping would change, and every prefix
// can still end as a key (a UTF-8 prefix could dead-end at the length limit).
bool IsExtraKeyByte(unsigned char c) { return c >= 0x20 && c < 0x7f && c != '"' && c != '&'; }

// A prefix of an additional key (whole: a complete one).
bool IsExtraKey(std::string_view key, bool whole) {
  if (key.size() > kMaxExtraKeyBytes || (whole && key.empty())) return false;
  for (unsigned char c : key) {
    if (!IsExtraKeyByte(c)) return false;
  }
  return true;
}

bool NeedsJsonEscape(unsigned char c) { return c == '"' || c == '\\' || c < 0x20; }

// A raw string argument's bytes as the grammar reads them: JSON string content escaped as
// nlohmann dumps an enum / const member, so such a member holding `\n` or `"` is reachable.
std::string JsonEscaped(std::string_view raw) {
  std::string out;
  AppendJsonStringBody(raw, &out);
  return out;
}

// Whether a JSON text starting with `first` is a value of XTML type `type` (a string argument's
// value is raw, never JSON: not asked).
bool StartsAsType(unsigned char first, uint8_t type) {
  switch (type) {
    case kArgNumber:
      return first == '-' || (first >= '0' && first <= '9');
    case kArgBoolean:
      return first == 't' || first == 'f';
    case kArgNull:
      return first == 'n';
    case kArgObject:
      return first == '{';
    case kArgArray:
      return first == '[';
    default:
      return false;
  }
}

// The XTML types a value of `c` may have (the first bytes its matcher takes).
uint8_t ValueTypes(const std::shared_ptr<const grammar::JsonConstraint>& c) {
  auto takes = [&](std::string_view first) { return grammar::JsonMatcher(c).Accept(first); };
  uint8_t types = 0;
  if (takes("\"")) types |= 1u << kArgString;
  for (char first : std::string_view("-0123456789tfn{[")) {
    for (uint8_t t = kArgNumber; t < kNumXtmlArgTypes; ++t) {
      if (StartsAsType(static_cast<unsigned char>(first), t) && takes(std::string(1, first))) {
        types |= static_cast<uint8_t>(1u << t);
      }
    }
  }
  return types;
}

// The typed-argument form of a compiled parameters schema, or null when it does not split per
// key (grammar::SplitObject: the keys' constraints share the whole schema's grammar, so `$ref`s
// mean what they mean in the whole and nothing is compiled again).
std::shared_ptr<const TypedArguments> TypedArgumentsOf(
    const std::shared_ptr<const grammar::JsonConstraint>& whole) {
  std::optional<grammar::ObjectProperties> parts = grammar::SplitObject(whole);
  if (!parts.has_value()) return nullptr;
  auto typed = std::make_shared<TypedArguments>();
  for (grammar::ObjectProperties::Property& p : parts->properties) {
    TypedArguments::Key key;
    key.name = std::move(p.name);
    key.attr = XtmlAttrEscape(key.name);
    key.required = p.required;
    key.value = std::move(p.value);
    key.types = ValueTypes(key.value);
    if (key.required && key.types == 0) return nullptr;
    typed->keys.push_back(std::move(key));
  }
  for (size_t i = 0; i < typed->keys.size(); ++i) {
    typed->by_attr.emplace_back(typed->keys[i].attr, static_cast<int>(i));
  }
  std::sort(typed->by_attr.begin(), typed->by_attr.end());
  if (parts->additional != nullptr) {
    typed->additional_value = std::move(parts->additional);
    typed->additional_types = ValueTypes(typed->additional_value);
    typed->additional = typed->additional_types != 0;  // no value fits: no other key
  }
  return typed;
}

}  // namespace

bool IsToolCallFormat(std::string_view format_json) {
  const nlohmann::json f = nlohmann::json::parse(format_json, nullptr, false);
  return f.is_object() && f.value("type", nlohmann::json()) == kToolCallsType;
}

absl::StatusOr<std::shared_ptr<const ToolCallSpec>> ParseToolCallSpec(
    std::string_view format_json) {
  const nlohmann::json f = nlohmann::json::parse(format_json, nullptr, false);
  if (!f.is_object() || f.value("type", nlohmann::json()) != kToolCallsType) {
    return absl::InvalidArgumentError("tool_choice: not a coli_tool_calls constraint");
  }
  auto spec = std::make_shared<ToolCallSpec>();
  const nlohmann::json mode = f.value("mode", nlohmann::json());
  if (mode != "required" && mode != "named" && mode != "auto" && mode != "none") {
    return absl::InvalidArgumentError(
        "tool_choice: coli_tool_calls mode must be \"required\", \"named\", \"auto\" or "
        "\"none\"");
  }
  spec->named = mode == "named";
  spec->none = mode == "none";
  const bool automatic = mode == "auto";
  if (spec->none) {
    // No call may open; the tools (if sent) are not needed.
    spec->lazy = true;
    COLI_ASSIGN_OR_RETURN(std::shared_ptr<const grammar::JsonConstraint> any,
                          grammar::JsonConstraint::FromSchema(R"({"type":"object"})"));
    spec->parameters.push_back(std::move(any));  // never used: a placeholder matcher
    return std::shared_ptr<const ToolCallSpec>(std::move(spec));
  }
  if (auto rf = f.find("response_format"); rf != f.end() && !rf->is_null()) {
    if (!automatic) {
      return absl::InvalidArgumentError(
          "tool_choice: a forced tool call cannot be combined with response_format");
    }
    COLI_ASSIGN_OR_RETURN(spec->answer,
                          grammar::JsonConstraint::FromResponseFormat(
                              rf->dump(-1, ' ', false, nlohmann::json::error_handler_t::replace)));
  }
  spec->lazy = automatic && spec->answer == nullptr;
  spec->single = spec->named || f.value("single", nlohmann::json(false)) == true;
  auto tools = f.find("tools");
  if (tools == f.end() || !tools->is_array() || tools->empty()) {
    return absl::InvalidArgumentError("tools: a tool-call constraint needs at least one tool");
  }
  if (spec->named && tools->size() != 1) {
    return absl::InvalidArgumentError("tool_choice: a named tool_choice carries exactly one tool");
  }
  for (const nlohmann::json& t : *tools) {
    const nlohmann::json name = t.is_object() ? t.value("name", nlohmann::json()) : nullptr;
    if (!name.is_string() || !IsPlainToolName(name.get<std::string>())) {
      return absl::InvalidArgumentError(
          absl::StrCat("tools: function name ",
                       name.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace),
                       " cannot be enforced (expected 1-64 of a-z A-Z 0-9 _ - .)"));
    }
    const std::string n = name.get<std::string>();
    if (std::find(spec->names.begin(), spec->names.end(), n) != spec->names.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("tools: function '", n, "' is declared twice"));
    }
    nlohmann::json params = t.value("parameters", nlohmann::json{{"type", "object"}});
    // `{}` (no keyword) is how clients declare a tool without parameters: any object.
    if (params.is_object() && params.empty()) params = {{"type", "object"}};
    absl::StatusOr<std::shared_ptr<const grammar::JsonConstraint>> c =
        grammar::JsonConstraint::FromSchema(
            params.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
    if (!c.ok() && automatic && t.value("strict", nlohmann::json(false)) != true) {
      // tool_choice auto, not strict: what the grammar cannot enforce is any JSON object.
      spec->relaxed.push_back(n);
      c = grammar::JsonConstraint::FromSchema(R"({"type":"object"})");
    }
    if (c.ok() && (ValueTypes(*c) & (1u << kArgObject)) == 0) {
      c = absl::InvalidArgumentError("schema: allows no JSON object (tool arguments are one)");
      if (automatic && t.value("strict", nlohmann::json(false)) != true) {
        spec->relaxed.push_back(n);
        c = grammar::JsonConstraint::FromSchema(R"({"type":"object"})");
      }
    }
    if (!c.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("tools: function '", n, "' parameters",
                                                     automatic ? " (strict)" : "", ": ",
                                                     c.status().message()));
    }
    spec->names.push_back(n);
    spec->typed.push_back(TypedArgumentsOf(*c));
    spec->parameters.push_back(*std::move(c));
  }
  return std::shared_ptr<const ToolCallSpec>(std::move(spec));
}

absl::StatusOr<std::unique_ptr<ConstraintVocab>> ConstraintVocab::Build(
    const tok::Tokenizer& tokenizer, int32_t vocab_size, std::span<const int32_t> stop_ids) {
  std::unique_ptr<ConstraintVocab> v(new ConstraintVocab());
  v->bytes_.resize(static_cast<size_t>(std::max(vocab_size, 0)));
  const int32_t known = std::min(vocab_size, tokenizer.vocab_size());
  for (int32_t id = 0; id < known; ++id) {
    if (!tokenizer.IsSpecial(id)) v->bytes_[id] = std::string(tokenizer.TokenBytes(id));
  }
  for (int32_t id : stop_ids) {
    if (id < 0 || id >= vocab_size) {
      return absl::InvalidArgumentError(
          absl::StrCat("response_format: stop token id ", id, " is outside [0, ", vocab_size, ")"));
    }
    v->stop_ids_.push_back(id);
  }
  if (absl::StatusOr<StructuralIds> ids = FindStructuralIds(tokenizer); ids.ok()) {
    v->open_ = ids->open;
    v->close_ = ids->close;
    v->sep_ = ids->sep;
    v->end_of_msg_ = ids->end_of_msg;
    v->think_ = tokenizer.Encode("think", false);
    v->response_ = tokenizer.Encode("response", false);
    v->message_ = tokenizer.Encode("message", false);
    v->tools_ = tokenizer.Encode("tools", false);
    v->call_ = tokenizer.Encode("call", false);
    v->json_ = tokenizer.Encode("json", false);
    v->argument_ = tokenizer.Encode("argument", false);
    v->tool_attr_ = tokenizer.Encode(" tool", false);
    v->index_attr_ = tokenizer.Encode(" index", false);
    v->eq_quote_ = tokenizer.Encode("=\"", false);
    v->quote_ = tokenizer.Encode("\"", false);
    for (char d = '0'; d <= '9'; ++d)
      v->digits_.push_back(tokenizer.Encode(std::string(1, d), false));
  }
  for (int32_t id = 0; id < vocab_size; ++id) {
    const std::string& b = v->bytes_[static_cast<size_t>(id)];
    if (std::any_of(b.begin(), b.end(), [](char c) { return NeedsJsonEscape(c); })) {
      v->escaped_.emplace_back(id, JsonEscaped(b));
    }
  }
  v->filter_ = std::make_unique<grammar::TokenFilter>(v->bytes_);
  return v;
}

AnswerConstraint::AnswerConstraint(std::shared_ptr<const grammar::JsonConstraint> constraint,
                                   const ConstraintVocab& vocab, bool chat)
    : vocab_(&vocab), matcher_(std::move(constraint)), chat_(chat) {}

absl::StatusOr<AnswerConstraint> AnswerConstraint::Create(
    std::shared_ptr<const grammar::JsonConstraint> constraint, const ConstraintVocab& vocab,
    int32_t chat_parse_mode) {
  if (constraint == nullptr) {
    return absl::InvalidArgumentError("response_format: no constraint to enforce");
  }
  if (chat_parse_mode == 0) return AnswerConstraint(std::move(constraint), vocab, false);
  if (chat_parse_mode != kParseInThink && chat_parse_mode != kParseInResponse &&
      chat_parse_mode != kParseOutside) {
    return absl::InvalidArgumentError(
        absl::StrCat("response_format: chat parse mode ", chat_parse_mode, " is not a K3 mode"));
  }
  if (!vocab.has_structure()) {
    return absl::InvalidArgumentError(
        "response_format: the tokenizer has no XTML tokens, so a chat answer cannot be found");
  }
  // Without a generation prompt the model writes its message's structure itself; the
  // constraint then covers everything it writes, as for plain text.
  AnswerConstraint a(std::move(constraint), vocab, chat_parse_mode != kParseOutside);
  if (chat_parse_mode == kParseInThink) a.phase_ = Phase::kThink;
  return a;
}

absl::StatusOr<AnswerConstraint> AnswerConstraint::CreateToolCalls(
    std::shared_ptr<const ToolCallSpec> spec, const ConstraintVocab& vocab,
    int32_t chat_parse_mode) {
  if (spec == nullptr || (spec->names.empty() && !spec->none) || spec->parameters.empty()) {
    return absl::InvalidArgumentError("tool_choice: no tool to call");
  }
  if (spec->lazy) {
    if (chat_parse_mode != kParseInThink && chat_parse_mode != kParseInResponse &&
        chat_parse_mode != kParseOutside) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tool_choice: auto tool calls need a chat (parse mode ", chat_parse_mode, ")"));
    }
    if (!vocab.has_structure()) {
      return absl::InvalidArgumentError(
          "tool_choice: the tokenizer has no XTML tokens, so a tool call cannot be found");
    }
    AnswerConstraint a(spec->parameters[0], vocab, true);
    a.tools_ = std::move(spec);
    a.lazy_ = true;
    a.phase_ = Phase::kFree;
    return a;
  }
  if (spec->answer != nullptr) {
    // The format's answer, or (closing the response at its first byte) tool calls.
    if (chat_parse_mode != kParseInThink && chat_parse_mode != kParseInResponse) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tool_choice: tools beside a response_format need a chat with a generation prompt "
          "(parse mode ",
          chat_parse_mode, ")"));
    }
    COLI_ASSIGN_OR_RETURN(AnswerConstraint a, Create(spec->answer, vocab, chat_parse_mode));
    a.tools_ = std::move(spec);
    return a;
  }
  if (chat_parse_mode != kParseInThink && chat_parse_mode != kParseInResponse) {
    return absl::InvalidArgumentError(
        absl::StrCat("tool_choice: a forced tool call needs a chat with a generation prompt "
                     "(parse mode ",
                     chat_parse_mode, ")"));
  }
  if (!vocab.has_structure()) {
    return absl::InvalidArgumentError(
        "tool_choice: the tokenizer has no XTML tokens, so a tool call cannot be written");
  }
  AnswerConstraint a(spec->parameters[0], vocab, true);
  a.tools_ = std::move(spec);
  if (chat_parse_mode == kParseInThink) {
    a.phase_ = Phase::kThink;
  } else {
    // The prompt opened the response: close it empty and open the tool calls.
    const ConstraintVocab& v = vocab;
    a.forced_ = {v.close_};
    Append(&a.forced_, {&v.response_});
    a.forced_.push_back(v.sep_);
    a.forced_.push_back(v.open_);
    Append(&a.forced_, {&v.tools_});
    a.forced_.push_back(v.sep_);
    a.forced_pos_ = 0;
    a.StartCall();
  }
  return a;
}

void AnswerConstraint::Force(std::vector<int32_t> ids, Phase after) {
  forced_ = std::move(ids);
  forced_pos_ = 0;
  after_forced_ = after;
  phase_ = forced_.empty() ? after : Phase::kForced;
}

// Appends `<|open|>call tool="` to what is being forced (kept), then chooses the name.
void AnswerConstraint::StartCall() {
  const ConstraintVocab& v = *vocab_;
  std::vector<int32_t> ids(forced_.begin() + static_cast<std::ptrdiff_t>(forced_pos_),
                           forced_.end());
  ids.push_back(v.open_);
  Append(&ids, {&v.call_, &v.tool_attr_, &v.eq_quote_});
  name_.clear();
  Force(std::move(ids), Phase::kToolName);
}

void AnswerConstraint::AfterName() {
  const ConstraintVocab& v = *vocab_;
  // ` index="K"<|sep|>`, then the body.
  std::vector<int32_t> ids;
  Append(&ids, {&v.index_attr_, &v.eq_quote_});
  for (char d : std::to_string(calls_ + 1))
    Append(&ids, {&v.digits_[static_cast<size_t>(d - '0')]});
  Append(&ids, {&v.quote_});
  ids.push_back(v.sep_);
  BeginCall(name_.substr(0, name_.size() - 1));  // without the closing quote
  Force(std::move(ids), Phase::kCallBody);
}

void AnswerConstraint::BeginCall(const std::string& name) {
  const auto it = std::find(tools_->names.begin(), tools_->names.end(), name);
  tool_ = static_cast<size_t>(it - tools_->names.begin());
  typed_ = tool_ < tools_->typed.size() ? tools_->typed[tool_].get() : nullptr;
  elements_ = 0;
  used_.assign(typed_ == nullptr ? 0 : typed_->keys.size(), false);
  keys_left_ = 0;
  for (size_t i = 0; i < used_.size(); ++i) keys_left_ += typed_->keys[i].types != 0 ? 1 : 0;
  extra_keys_.clear();
  run_.clear();
  phase_ = Phase::kCallBody;
}

void AnswerConstraint::EndCall(std::vector<int32_t> ids) {
  const ConstraintVocab& v = *vocab_;
  ++calls_;
  if (lazy_) {
    Force(std::move(ids), Phase::kFree);  // free again
    return;
  }
  if (!tools_->single) {
    Force(std::move(ids), Phase::kAfterCall);
    return;
  }
  // `<|close|>tools<|sep|><|close|>message<|sep|><|end_of_msg|>`
  ids.push_back(v.close_);
  Append(&ids, {&v.tools_});
  ids.push_back(v.sep_);
  ids.push_back(v.close_);
  Append(&ids, {&v.message_});
  ids.push_back(v.sep_);
  ids.push_back(v.end_of_msg_);
  Force(std::move(ids), Phase::kDone);
}

bool AnswerConstraint::KeysLeft() const {
  if (typed_ == nullptr) return false;
  return keys_left_ > 0 || (typed_->additional && extra_keys_.size() < kMaxExtraKeys);
}

bool AnswerConstraint::RequiredDone() const {
  if (typed_ == nullptr) return false;
  for (size_t i = 0; i < used_.size(); ++i) {
    if (typed_->keys[i].required && !used_[i]) return false;
  }
  return true;
}

bool AnswerConstraint::KeyPrefix(std::string_view key) const {
  // A declared key not written yet whose attribute text starts with `key`.
  const auto& by_attr = typed_->by_attr;
  for (auto it = std::lower_bound(by_attr.begin(), by_attr.end(), key,
                                  [](const std::pair<std::string, int>&e, std::string_view k) {
                                    return std::string_view(e.first) < k;
                                  });
       it != by_attr.end() && std::string_view(it->first).starts_with(key); ++it) {
    const size_t i = static_cast<size_t>(it->second);
    if (!used_[i] && typed_->keys[i].types != 0) return true;
  }
  return ExtraKeyPrefix(key);
}

// `key` can still end as an additional key nobody wrote: far from the length limit there are
// more completions than keys a call may write; near it, one is looked for.
bool AnswerConstraint::ExtraKeyPrefix(std::string_view key) const {
  if (!typed_->additional || !IsExtraKey(key, false)) return false;
  const size_t room = kMaxExtraKeyBytes - key.size();
  if (room >= 2) return true;  // >= 94 * 94 completions, more than kMaxExtraKeys
  int ignored = 0;
  if (KeyOf(key, &ignored)) return true;
  if (room == 0) return false;
  std::string longer(key);
  longer.push_back(' ');
  for (int c = 0x20; c < 0x7f; ++c) {
    longer.back() = static_cast<char>(c);
    if (IsExtraKeyByte(static_cast<unsigned char>(c)) && KeyOf(longer, &ignored)) return true;
  }
  return false;
}

bool AnswerConstraint::KeyOf(std::string_view key, int* index) const {
  // A declared key by the text its attribute is written as (names needing escaping differ).
  const auto& by_attr = typed_->by_attr;
  const auto it = std::lower_bound(by_attr.begin(), by_attr.end(), key,
                                   [](const std::pair<std::string, int>& e, std::string_view k) {
                                     return std::string_view(e.first) < k;
                                   });
  if (it != by_attr.end() && it->first == key) {
    const size_t i = static_cast<size_t>(it->second);
    if (used_[i] || typed_->keys[i].types == 0) return false;
    *index = it->second;
    return true;
  }
  // An additional key (its text is its name: no escaping applies to its bytes, and it is no
  // declared key's name, since such a name's attribute text would have matched above).
  if (!typed_->additional || !IsExtraKey(key, true)) return false;
  if (std::find(extra_keys_.begin(), extra_keys_.end(), key) != extra_keys_.end()) return false;
  *index = -1;
  return true;
}

uint8_t AnswerConstraint::TypesOf(int key) const {
  return key >= 0 ? typed_->keys[static_cast<size_t>(key)].types : typed_->additional_types;
}

// `text` (an element's opening run) is a prefix of (whole: equal to) an element the call may
// write next: the json block before any argument, or an argument of a key still allowed with
// one of its types.
bool AnswerConstraint::ElementPrefix(std::string_view text, bool whole) const {
  if (elements_ == 0 && (whole ? text == kJsonElement : kJsonElement.starts_with(text))) {
    return true;
  }
  if (!KeysLeft()) return false;
  if (text.size() < kArgElement.size()) return !whole && kArgElement.starts_with(text);
  if (!text.starts_with(kArgElement)) return false;
  const std::string_view rest = text.substr(kArgElement.size());
  const size_t quote = rest.find('"');
  if (quote == std::string_view::npos) return !whole && KeyPrefix(rest);
  int key = 0;
  if (!KeyOf(rest.substr(0, quote), &key)) return false;
  const std::string_view tail = rest.substr(quote);  // `" type="TYPE"`
  constexpr std::string_view kTypeAttr = "\" type=\"";
  const uint8_t types = TypesOf(key);
  for (int t = 0; t < kNumXtmlArgTypes; ++t) {
    if (((types >> t) & 1) == 0) continue;
    // tail against kTypeAttr + name + `"`, piece by piece (no string built per token).
    const std::string_view name = kXtmlTypeNames[t];
    const size_t whole_size = kTypeAttr.size() + name.size() + 1;
    if (tail.size() > whole_size || (whole && tail.size() != whole_size)) continue;
    std::string_view rest_tail = tail;
    bool match = true;
    for (std::string_view piece : {kTypeAttr, name, std::string_view("\"")}) {
      const size_t k = std::min(piece.size(), rest_tail.size());
      match = match && rest_tail.substr(0, k) == piece.substr(0, k);
      rest_tail.remove_prefix(k);
    }
    if (match) return true;
  }
  return false;
}

// A typed argument's value: a string is raw (its bytes reach the matcher JSON-escaped, after
// the opening quote fed at the start), anything else JSON of the declared type.
void AnswerConstraint::ArgValueAllowed(std::vector<uint8_t>* allowed) const {
  const ConstraintVocab& v = *vocab_;
  const size_t n = v.bytes_.size();
  if (arg_type_ == kArgString) {
    v.filter_->Allowed(matcher_, allowed);
    allowed->resize(n, 0);
    for (const auto& [id, escaped] : v.escaped_) {
      grammar::JsonMatcher m = matcher_;
      (*allowed)[id] = m.Accept(escaped) ? 1 : 0;
    }
    grammar::JsonMatcher end = matcher_;
    if (end.Accept("\"") && end.CanEnd()) (*allowed)[v.close_] = 1;
    return;
  }
  JsonValueAllowed(arg_type_, allowed);
}

// matcher_'s value as JSON of XTML type `type` (its first byte), then <|close|> once it can end.
void AnswerConstraint::JsonValueAllowed(uint8_t type, std::vector<uint8_t>* allowed) const {
  const ConstraintVocab& v = *vocab_;
  const size_t n = v.bytes_.size();
  if (matcher_.MustEnd()) {
    allowed->assign(n, 0);
  } else {
    v.filter_->Allowed(matcher_, allowed);
    allowed->resize(n, 0);
    if (matcher_.consumed() == 0) {
      for (size_t i = 0; i < n; ++i) {
        if ((*allowed)[i] != 0 && !StartsAsType(v.bytes_[i][0], type)) (*allowed)[i] = 0;
      }
    }
  }
  if (matcher_.CanEnd()) (*allowed)[v.close_] = 1;
}

bool AnswerConstraint::ArgValueAccepts(int32_t id) const {
  const ConstraintVocab& v = *vocab_;
  const std::string& b = v.bytes_[id];
  if (id == v.close_) {
    if (arg_type_ != kArgString) return matcher_.CanEnd();
    grammar::JsonMatcher end = matcher_;
    return end.Accept("\"") && end.CanEnd();
  }
  if (b.empty()) return false;
  if (arg_type_ != kArgString && matcher_.consumed() == 0 &&
      !StartsAsType(static_cast<unsigned char>(b[0]), arg_type_)) {
    return false;
  }
  return true;
}

void AnswerConstraint::Allowed(std::vector<uint8_t>* allowed) const {
  const ConstraintVocab& v = *vocab_;
  const size_t n = v.bytes_.size();
  switch (phase_) {
    case Phase::kDone:
      allowed->assign(n, 1);
      return;
    case Phase::kForced:
      allowed->assign(n, 0);
      (*allowed)[forced_[forced_pos_]] = 1;
      return;
    case Phase::kThink:
      // Free reasoning text; the only structure allowed is the <|close|> that ends it.
      allowed->resize(n);
      for (size_t i = 0; i < n; ++i) (*allowed)[i] = v.bytes_[i].empty() ? 0 : 1;
      (*allowed)[v.close_] = 1;
      return;
    case Phase::kToolName:
      // Ordinary tokens whose bytes keep `NAME"` a prefix of an allowed name's.
      allowed->assign(n, 0);
      for (const std::string& name : tools_->names) {
        const std::string cand = name + '"';
        if (cand.size() <= name_.size() || cand.compare(0, name_.size(), name_) != 0) continue;
        const std::string_view rest = std::string_view(cand).substr(name_.size());
        for (size_t i = 0; i < n; ++i) {
          const std::string& b = v.bytes_[i];
          if (!b.empty() && rest.substr(0, b.size()) == b) (*allowed)[i] = 1;
        }
      }
      return;
    case Phase::kAfterCall:
      allowed->assign(n, 0);
      if (!tools_->single) (*allowed)[v.open_] = 1;  // another call
      (*allowed)[v.close_] = 1;                      // or the end of the calls
      return;
    case Phase::kArgs:
      JsonValueAllowed(kArgObject, allowed);  // arguments are an object, whatever the schema
      return;
    case Phase::kCallBody:
      allowed->assign(n, 0);
      if (elements_ == 0 || KeysLeft()) (*allowed)[v.open_] = 1;  // an element
      if (RequiredDone()) (*allowed)[v.close_] = 1;               // the end of the call
      return;
    case Phase::kElement: {
      allowed->assign(n, 0);
      std::string text = run_;
      for (size_t i = 0; i < n; ++i) {
        const std::string& b = v.bytes_[i];
        if (b.empty()) continue;
        text.resize(run_.size());
        text += b;
        if (ElementPrefix(text, false)) (*allowed)[i] = 1;
      }
      if (ElementPrefix(run_, true)) (*allowed)[v.sep_] = 1;
      return;
    }
    case Phase::kArgValue:
      ArgValueAllowed(allowed);
      return;
    case Phase::kFree:
      allowed->resize(n);
      for (size_t i = 0; i < n; ++i) (*allowed)[i] = FreePermits(static_cast<int32_t>(i)) ? 1 : 0;
      return;
    case Phase::kHeader: {
      // The rests of the headers the bytes so far begin: a token must begin one of them.
      allowed->assign(n, 0);
      const std::vector<std::string> headers = Headers();
      std::vector<std::string_view> rests;
      for (const std::string& h : headers) {
        if (std::string_view(h).starts_with(run_)) {
          rests.push_back(std::string_view(h).substr(run_.size()));
        }
      }
      for (size_t i = 0; i < n; ++i) {
        const std::string& b = v.bytes_[i];
        if (b.empty()) continue;
        for (std::string_view rest : rests) {
          if (rest.starts_with(b)) {
            (*allowed)[i] = 1;
            break;
          }
        }
      }
      if (HeaderPrefix(run_, true)) (*allowed)[v.sep_] = 1;
      return;
    }
    case Phase::kAnswer:
      break;
  }
  if (matcher_.MustEnd()) {
    allowed->assign(n, 0);
  } else {
    v.filter_->Allowed(matcher_, allowed);
    allowed->resize(n, 0);
  }
  if (matcher_.CanEnd()) {
    for (int32_t id : v.stop_ids_) (*allowed)[id] = 1;
    if (chat_) (*allowed)[v.close_] = 1;
  }
  // Tools beside a response_format: tool calls instead of the value (an empty response).
  if (ValueOrCalls() && matcher_.consumed() == 0) (*allowed)[v.close_] = 1;
}

bool AnswerConstraint::CallsLeft() const {
  return tools_ != nullptr && !tools_->none && (!tools_->single || calls_ == 0);
}

bool AnswerConstraint::OpensCall(std::string_view text) { return text.starts_with("call "); }

// `call tool="NAME" index="K"` for each offered NAME, K the next call's position (none when no
// call is left).
std::vector<std::string> AnswerConstraint::Headers() const {
  std::vector<std::string> out;
  if (!CallsLeft()) return out;
  const std::string index = absl::StrCat("\" index=\"", calls_ + 1, "\"");
  for (const std::string& name : tools_->names) {
    out.push_back(absl::StrCat("call tool=\"", name, index));
  }
  return out;
}

// `text` is a prefix of (whole: equal to) one of the Headers().
bool AnswerConstraint::HeaderPrefix(std::string_view text, bool whole) const {
  for (const std::string& header : Headers()) {
    if (whole ? text == header : std::string_view(header).starts_with(text)) return true;
  }
  return false;
}

// Watching (kFree): every token, except one that would open a call that cannot be completed —
// an ordinary token taking an <|open|> run to `call …` off every valid header, or <|sep|>
// ending a run that reads `call` (a call with no tool).
bool AnswerConstraint::FreePermits(int32_t id) const {
  const ConstraintVocab& v = *vocab_;
  if (!in_run_) return true;
  const std::string& b = v.bytes_[id];
  if (b.empty()) return !(id == v.sep_ && run_ == "call");
  // run_ is a proper prefix of `call ` (Accept stops watching a run that is not): the token
  // opens a call when it completes `call ` — checked without a copy, the rare opener with one.
  constexpr std::string_view kOpener = "call ";
  const std::string_view missing = kOpener.substr(run_.size());
  if (b.size() < missing.size() || !std::string_view(b).starts_with(missing)) return true;
  return HeaderPrefix(run_ + b, false);
}

bool AnswerConstraint::Permits(int32_t id) const {
  if (id < 0 || id >= vocab_->vocab_size()) return false;
  if (phase_ == Phase::kFree) return FreePermits(id);
  std::vector<uint8_t> allowed;
  Allowed(&allowed);
  return allowed[id] != 0;
}

absl::Status AnswerConstraint::Mask(std::span<float> logits) const {
  std::vector<uint8_t> allowed;
  Allowed(&allowed);
  if (logits.size() != allowed.size()) {
    return absl::InternalError(absl::StrCat("response_format: ", logits.size(),
                                            " logits for a vocabulary of ", allowed.size()));
  }
  bool any = false;
  constexpr float kMinusInf = -std::numeric_limits<float>::infinity();
  for (size_t i = 0; i < logits.size(); ++i) {
    if (allowed[i] == 0) {
      logits[i] = kMinusInf;
    } else {
      any = true;
    }
  }
  if (!any) {
    return absl::InternalError(
        absl::StrCat("response_format: no token of the vocabulary continues "
                     "the answer after byte ",
                     matcher_.consumed()));
  }
  return absl::OkStatus();
}

void AnswerConstraint::Accept(int32_t id) {
  const ConstraintVocab& v = *vocab_;
  if (id < 0 || id >= static_cast<int32_t>(v.bytes_.size())) {
    phase_ = Phase::kDone;
    return;
  }
  const bool stop = std::find(v.stop_ids_.begin(), v.stop_ids_.end(), id) != v.stop_ids_.end();
  switch (phase_) {
    case Phase::kDone:
      return;
    case Phase::kForced:
      if (id != forced_[forced_pos_]) {
        phase_ = Phase::kDone;
        return;
      }
      if (++forced_pos_ == forced_.size()) phase_ = after_forced_;
      return;
    case Phase::kThink:
      if (id == v.close_) {
        // `think<|sep|><|open|>response<|sep|>`, then the answer.
        forced_ = v.think_;
        forced_.push_back(v.sep_);
        forced_.push_back(v.open_);
        forced_.insert(forced_.end(), v.response_.begin(), v.response_.end());
        forced_.push_back(v.sep_);
        forced_pos_ = 0;
        phase_ = Phase::kForced;
        after_forced_ = Phase::kAnswer;
        if (tools_ != nullptr && tools_->answer == nullptr) {
          // An empty response, then the calls: `<|close|>response<|sep|><|open|>tools<|sep|>`.
          forced_.push_back(v.close_);
          Append(&forced_, {&v.response_});
          forced_.push_back(v.sep_);
          forced_.push_back(v.open_);
          Append(&forced_, {&v.tools_});
          forced_.push_back(v.sep_);
          StartCall();
        }
      } else if (v.bytes_[id].empty()) {
        phase_ = Phase::kDone;  // not an allowed token
      }
      return;
    case Phase::kToolName: {
      name_ += v.bytes_[id];
      bool prefix = false;
      for (const std::string& name : tools_->names) {
        const std::string cand = name + '"';
        if (cand == name_) {
          AfterName();
          return;
        }
        prefix =
            prefix || (cand.size() > name_.size() && cand.compare(0, name_.size(), name_) == 0);
      }
      if (!prefix || v.bytes_[id].empty()) phase_ = Phase::kDone;
      return;
    }
    case Phase::kFree:
      if (v.bytes_[id].empty()) {
        if (in_run_ && id == v.sep_ && run_ == "call") {
          phase_ = Phase::kDone;  // not permitted
          return;
        }
        in_run_ = id == v.open_;
        run_.clear();
        return;
      }
      if (!in_run_) return;
      run_ += v.bytes_[id];
      if (OpensCall(run_)) {
        phase_ = HeaderPrefix(run_, false) ? Phase::kHeader : Phase::kDone;
      } else if (!std::string_view("call ").starts_with(run_)) {
        in_run_ = false;  // another tag: it can no longer become a call
        run_.clear();
      }
      return;
    case Phase::kHeader:
      if (id == v.sep_ && HeaderPrefix(run_, true)) {
        // The call's tool; then its body.
        const size_t from = std::string_view("call tool=\"").size();
        in_run_ = false;
        BeginCall(run_.substr(from, run_.find('"', from) - from));
        return;
      }
      if (v.bytes_[id].empty() || !HeaderPrefix(run_ + v.bytes_[id], false)) {
        phase_ = Phase::kDone;
        return;
      }
      run_ += v.bytes_[id];
      return;
    case Phase::kCallBody:
      if (id == v.open_ && (elements_ == 0 || KeysLeft())) {
        run_.clear();
        phase_ = Phase::kElement;
      } else if (id == v.close_ && RequiredDone()) {
        std::vector<int32_t> ids = v.call_;  // `call<|sep|>`
        ids.push_back(v.sep_);
        EndCall(std::move(ids));
      } else {
        phase_ = Phase::kDone;
      }
      return;
    case Phase::kElement: {
      if (id != v.sep_ || !ElementPrefix(run_, true)) {
        if (v.bytes_[id].empty() || !ElementPrefix(run_ + v.bytes_[id], false)) {
          phase_ = Phase::kDone;
          return;
        }
        run_ += v.bytes_[id];
        return;
      }
      if (run_ == kJsonElement) {
        matcher_ = grammar::JsonMatcher(tools_->parameters[tool_]);  // the whole arguments
        phase_ = Phase::kArgs;
        return;
      }
      // `argument key="KEY" type="TYPE"`
      const std::string_view rest = std::string_view(run_).substr(kArgElement.size());
      const size_t quote = rest.find('"');
      int key = -1;
      KeyOf(rest.substr(0, quote), &key);  // true: ElementPrefix checked it
      std::string_view type = rest.substr(quote + std::string_view("\" type=\"").size());
      type.remove_suffix(1);
      arg_type_ = static_cast<uint8_t>(
          std::find(std::begin(kXtmlTypeNames), std::end(kXtmlTypeNames), type) -
          std::begin(kXtmlTypeNames));
      arg_key_ = key;
      arg_extra_ = key < 0 ? std::string(rest.substr(0, quote)) : std::string();
      matcher_ = grammar::JsonMatcher(key >= 0 ? typed_->keys[static_cast<size_t>(key)].value
                                               : typed_->additional_value);
      if (arg_type_ == kArgString) matcher_.Accept("\"");  // the raw value is its content
      phase_ = Phase::kArgValue;
      return;
    }
    case Phase::kArgValue:
      if (!ArgValueAccepts(id)) {
        phase_ = Phase::kDone;
        return;
      }
      if (id == v.close_) {
        if (arg_key_ >= 0) {
          used_[static_cast<size_t>(arg_key_)] = true;
          --keys_left_;
        } else {
          extra_keys_.push_back(arg_extra_);
        }
        ++elements_;
        std::vector<int32_t> ids = v.argument_;  // `argument<|sep|>`
        ids.push_back(v.sep_);
        Force(std::move(ids), Phase::kCallBody);
        return;
      }
      if (!matcher_.Accept(arg_type_ == kArgString ? JsonEscaped(v.bytes_[id]) : v.bytes_[id])) {
        phase_ = Phase::kDone;
      }
      return;
    case Phase::kArgs:
      if (id == v.close_ && matcher_.CanEnd()) {
        // `json<|sep|><|close|>call<|sep|>`
        std::vector<int32_t> ids = v.json_;
        ids.push_back(v.sep_);
        ids.push_back(v.close_);
        Append(&ids, {&v.call_});
        ids.push_back(v.sep_);
        EndCall(std::move(ids));
        return;
      }
      if (v.bytes_[id].empty() ||
          (matcher_.consumed() == 0 &&
           !StartsAsType(static_cast<unsigned char>(v.bytes_[id][0]), kArgObject)) ||
          !matcher_.Accept(v.bytes_[id])) {
        phase_ = Phase::kDone;
      }
      return;
    case Phase::kAfterCall:
      if (id == v.open_) {
        std::vector<int32_t> ids;
        Append(&ids, {&v.call_, &v.tool_attr_, &v.eq_quote_});
        name_.clear();
        Force(std::move(ids), Phase::kToolName);
      } else if (id == v.close_) {
        // `tools<|sep|><|close|>message<|sep|><|end_of_msg|>`
        std::vector<int32_t> ids = v.tools_;
        ids.push_back(v.sep_);
        ids.push_back(v.close_);
        Append(&ids, {&v.message_});
        ids.push_back(v.sep_);
        ids.push_back(v.end_of_msg_);
        Force(std::move(ids), Phase::kDone);
      } else {
        phase_ = Phase::kDone;
      }
      return;
    case Phase::kAnswer:
      break;
  }
  if (stop) {
    phase_ = Phase::kDone;
    return;
  }
  if (id == v.close_ && ValueOrCalls() && matcher_.consumed() == 0) {
    // Tools beside a response_format: an empty response, then the calls (as "required").
    forced_ = v.response_;
    forced_.push_back(v.sep_);
    forced_.push_back(v.open_);
    Append(&forced_, {&v.tools_});
    forced_.push_back(v.sep_);
    forced_pos_ = 0;
    StartCall();
    return;
  }
  if (chat_ && id == v.close_) {
    // The well-formed end: `response<|sep|><|close|>message<|sep|><|end_of_msg|>`.
    forced_ = v.response_;
    forced_.push_back(v.sep_);
    forced_.push_back(v.close_);
    forced_.insert(forced_.end(), v.message_.begin(), v.message_.end());
    forced_.push_back(v.sep_);
    forced_.push_back(v.end_of_msg_);
    forced_pos_ = 0;
    phase_ = Phase::kForced;
    after_forced_ = Phase::kDone;
    return;
  }
  if (v.bytes_[id].empty() || !matcher_.Accept(v.bytes_[id])) phase_ = Phase::kDone;
}

}  // namespace coli::k3
