// XTML rendering (spec §6.1, §6.2, §6.5). See chat.h for the contract; the rule numbers in the
// comments below are those of spec §6.2 and §6.5.
#include "plugins/kimi_k3/chat.h"

#include <algorithm>
#include <map>
#include <optional>
#include <utility>

#include "common/status/status.h"
#include "common/tokenizer/utf8.h"

namespace coli::k3 {
namespace {

// §6.2.1 body constants, byte-exact.
constexpr std::string_view kToolsHead =
    "# Tools\nHere are the available tools, described in JSONSchema.\n\n```json\n";
constexpr std::string_view kDynamicToolsHead =
    "## New Tools Available\nThe system dynamically extends the toolset via lazy-loading.\n"
    "You have access to all existing and extended tools.\n"
    "Here are the specs for the extended tools.\n\n```json\n";
constexpr std::string_view kToolsTail = "\n```";
constexpr std::string_view kEffortHead =
    "`thinking_effort` guides on how much to think in your thinking channel (not including the "
    "response channel), supported values include `low`, `medium`, `high`, and `max`.\n"
    "Now the system is invoked with `thinking_effort=";
constexpr std::string_view kEffortTail = "`.";
constexpr std::string_view kChoiceRequired =
    "The system is invoked with `tool_choice=required`.\nYou MUST call tools in the next message.";
constexpr std::string_view kChoiceNone =
    "The system is invoked with `tool_choice=none`.\n"
    "You MUST NOT call any tools in the next message.";
constexpr std::string_view kRfObject =
    "The system is invoked with `response_format=json_object`.\nYour response must be raw JSON "
    "data without markdown code blocks (```json) or any additional formatting.";
constexpr std::string_view kRfSchemaHead =
    "The system is invoked with `response_format=json_schema`.\nYour response must be raw JSON "
    "data without markdown code blocks (```json) or any additional formatting.\n"
    "The JSON data must match the following schema:\n```json\n";
constexpr std::string_view kRfSchemaTail = "\n```";

absl::Status Bad(std::string_view path, std::string_view what) {
  return absl::InvalidArgumentError(Cat(path, ": ", what));
}

std::string Path(std::string_view base, size_t index) { return Cat(base, "[", index, "]"); }

// `not str(s).strip()` in Python: empty or only (Unicode) whitespace.
bool IsBlank(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const size_t len = tok::Utf8SequenceLength(s.substr(i));
    if (len == 0) return false;  // not text at all: not blank
    if (!tok::IsPythonSpace(tok::DecodeUtf8(s.substr(i), len))) return false;
    i += len;
  }
  return true;
}

// Python truthiness of an optional JSON field (absent, null, "", [], {}, false, 0 are false).
bool Truthy(const Json& obj, std::string_view key) {
  auto it = obj.find(key);
  if (it == obj.end()) return false;
  const Json& v = *it;
  if (v.is_null()) return false;
  if (v.is_boolean()) return v.get<bool>();
  if (v.is_string() || v.is_array() || v.is_object()) return !v.empty();
  if (v.is_number_float()) return v.get<double>() != 0;
  if (v.is_number()) return v.get<int64_t>() != 0;
  return true;
}

// str(value) for an id-like field (a call id); strings as they are.
std::string IdString(const Json& v) {
  if (v.is_string()) return v.get<std::string>();
  return PyJsonDumps(v, PyJsonStyle::kSpaced);
}

// Reads an optional string field; INVALID_ARGUMENT when present with another type.
absl::StatusOr<std::optional<std::string>> OptString(const Json& obj, std::string_view key,
                                                     std::string_view path) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return std::nullopt;
  if (!it->is_string()) return Bad(path, "must be a string");
  return it->get<std::string>();
}

absl::StatusOr<std::optional<bool>> OptBool(const Json& obj, std::string_view key,
                                            std::string_view path) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return std::nullopt;
  if (!it->is_boolean()) return Bad(path, "must be a boolean");
  return it->get<bool>();
}

class SegmentBuilder {
 public:
  void Control(std::string_view token) { segments_.push_back({std::string(token), true}); }
  void Text(std::string_view text) {
    if (!text.empty()) segments_.push_back({std::string(text), false});
  }
  void OpenTag(std::string_view tag,
               std::initializer_list<std::pair<std::string_view, std::string_view>> attrs = {}) {
    Control(kOpenToken);
    Text(tag);
    for (const auto& [key, value] : attrs) Attr(key, value);
    Control(kSepToken);
  }
  // Open tag with attributes built at run time.
  void OpenTagDyn(std::string_view tag,
                  const std::vector<std::pair<std::string, std::string>>& attrs) {
    Control(kOpenToken);
    Text(tag);
    for (const auto& [key, value] : attrs) Attr(key, value);
    Control(kSepToken);
  }
  void CloseTag(std::string_view tag) {
    Control(kCloseToken);
    Text(tag);
    Control(kSepToken);
  }
  void EndOfMsg() { Control(kEndOfMsgToken); }
  // An internal system message of `type` with `body` (§6.2 "system message of type T").
  void SystemMessage(std::string_view type, std::string_view body) {
    OpenTag("message", {{"role", "system"}, {"type", type}});
    Text(body);
    CloseTag("message");
    EndOfMsg();
  }
  std::vector<Segment> Take() { return std::move(segments_); }

 private:
  // §6.1: ` key`, `="`, escaped value, `"` — four text segments (empty ones dropped).
  void Attr(std::string_view key, std::string_view value) {
    Text(Cat(" ", key));
    Text("=\"");
    Text(XtmlAttrEscape(value));
    Text("\"");
  }

  std::vector<Segment> segments_;
};

// Message content: a string, null, or a list of text parts (§6.2 "content may be a list").
absl::Status AppendContent(const Json& message, std::string_view path, SegmentBuilder* b) {
  auto it = message.find("content");
  if (it == message.end() || it->is_null()) return absl::OkStatus();
  const std::string content_path = Cat(path, ".content");
  if (it->is_string()) {
    b->Text(it->get_ref<const std::string&>());
    return absl::OkStatus();
  }
  if (!it->is_array()) {
    return Bad(content_path, "must be a string, an array of content parts or null");
  }
  for (size_t i = 0; i < it->size(); ++i) {
    const Json& part = (*it)[i];
    const std::string part_path = Path(content_path, i);
    if (!part.is_object()) return Bad(part_path, "a content part must be an object");
    COLI_ASSIGN_OR_RETURN(std::optional<std::string> type,
                          OptString(part, "type", Cat(part_path, ".type")));
    if (!type) return Bad(Cat(part_path, ".type"), "missing content part type");
    if (*type != "text") {
      return Bad(Cat(part_path, ".type"),
                 Cat("unsupported content part type '", *type,
                              "' (this engine reads text only)"));
    }
    auto text = part.find("text");
    if (text == part.end() || !text->is_string()) {
      return Bad(Cat(part_path, ".text"), "a text part needs a string 'text'");
    }
    b->Text(text->get_ref<const std::string&>());
  }
  return absl::OkStatus();
}

// Where a call's name and arguments live: `function` when present, else the call itself.
absl::StatusOr<const Json*> CallFunction(const Json& call, std::string_view path) {
  if (!call.is_object()) return Bad(path, "a tool call must be an object");
  auto fn = call.find("function");
  if (fn == call.end()) return &call;
  if (!fn->is_object()) return Bad(Cat(path, ".function"), "must be an object");
  return &*fn;
}

// §6.5.1 normalize_tool_arguments: object, null, or a JSON-object string; a string that is not
// JSON becomes a raw `json` block; anything that parses to a non-object is refused.
struct NormalizedArguments {
  Json object = Json::object();
  std::optional<std::string> raw_json_block;
};

absl::StatusOr<NormalizedArguments> NormalizeArguments(const Json& fn, std::string_view path) {
  NormalizedArguments out;
  auto it = fn.find("arguments");
  if (it == fn.end() || it->is_null()) return out;
  if (it->is_object()) {
    out.object = *it;
    return out;
  }
  if (!it->is_string()) {
    return Bad(path, "tool call arguments must be a JSON object or a JSON-object string");
  }
  const std::string& text = it->get_ref<const std::string&>();
  if (IsBlank(text)) return out;
  absl::StatusOr<Json> parsed = ParsePyJson(text);
  if (!parsed.ok()) {
    out.raw_json_block = text;
    return out;
  }
  if (!parsed->is_object()) {
    return Bad(path, "tool call arguments must be a JSON object (got another JSON value)");
  }
  out.object = std::move(*parsed);
  return out;
}

// §6.2 argument types; booleans are tested before numbers.
std::string_view XtmlType(const Json& v) {
  if (v.is_boolean()) return "boolean";
  if (v.is_null()) return "null";
  if (v.is_number()) return "number";
  if (v.is_string()) return "string";
  if (v.is_object()) return "object";
  return "array";
}

// A message with the tool name the tool-result re-sort resolved (§6.5.6).
struct MessageRef {
  const Json* message;
  size_t index;  // position in the request, for error paths
  std::optional<std::string> resolved_tool;
};

// §6.5.6: re-sort each run of consecutive tool messages by the preceding assistant's call ids.
absl::StatusOr<std::vector<MessageRef>> ResortToolResults(const Json& messages) {
  std::vector<MessageRef> out;
  struct Match {
    int position;
    std::optional<std::string> name;
  };
  std::map<std::string, Match> current;
  size_t i = 0;
  const size_t n = messages.size();
  auto role_of = [&](size_t k) -> absl::StatusOr<std::string> {
    const Json& m = messages[k];
    const std::string path = Path("messages", k);
    if (!m.is_object()) return Bad(path, "a message must be an object");
    auto role = m.find("role");
    if (role == m.end() || !role->is_string()) {
      return Bad(Cat(path, ".role"), "missing or not a string");
    }
    return role->get<std::string>();
  };
  while (i < n) {
    COLI_ASSIGN_OR_RETURN(std::string role, role_of(i));
    const Json& message = messages[i];
    if (role == "assistant") {
      current.clear();
      auto calls = message.find("tool_calls");
      if (calls != message.end() && calls->is_array()) {
        int position = 0;
        for (const Json& call : *calls) {
          ++position;  // every entry advances the position, even an id-less one
          if (!call.is_object()) continue;
          auto id = call.find("id");
          if (id == call.end() || id->is_null()) continue;
          const std::string key = IdString(*id);
          if (current.count(key)) continue;  // duplicate ids: the first call wins
          std::optional<std::string> name;
          auto fn = call.find("function");
          const Json* holder = (fn != call.end() && fn->is_object()) ? &*fn : &call;
          auto nm = holder->find("name");
          if (nm != holder->end() && nm->is_string()) name = nm->get<std::string>();
          current[key] = Match{position, name};
        }
      }
      out.push_back({&message, i, std::nullopt});
      ++i;
      continue;
    }
    if (role != "tool") {
      out.push_back({&message, i, std::nullopt});
      ++i;
      continue;
    }
    struct RunItem {
      int position;
      size_t offset;
      MessageRef ref;
    };
    std::vector<RunItem> run;
    bool unresolved = false;
    size_t offset = 0;
    while (i < n) {
      COLI_ASSIGN_OR_RETURN(std::string r, role_of(i));
      if (r != "tool") break;
      const Json& m = messages[i];
      auto id = m.find("tool_call_id");
      if (id == m.end()) id = m.find("id");
      std::optional<Match> match;
      if (id != m.end() && !id->is_null()) {
        auto found = current.find(IdString(*id));
        if (found != current.end()) match = found->second;
      }
      if (!match) {
        unresolved = true;
        run.push_back({0, offset, {&m, i, std::nullopt}});
      } else {
        run.push_back({match->position, offset, {&m, i, match->name}});
      }
      ++offset;
      ++i;
    }
    if (!unresolved) {
      std::stable_sort(run.begin(), run.end(), [](const RunItem& a, const RunItem& b) {
        return a.position != b.position ? a.position < b.position : a.offset < b.offset;
      });
    }
    for (auto& item : run) {
      if (unresolved) item.ref.resolved_tool.reset();
      out.push_back(item.ref);
    }
  }
  return out;
}

struct ThinkingChoice {
  bool thinking = true;
  std::string effort = "max";
  bool add_generation_prompt = true;
  bool add_generation_prompt_given = false;  // set by the request (true or false)
};

// §6.2.2 and §6.5.2–4: thinking on/off and the effort, as the vendor's option handling does.
absl::StatusOr<ThinkingChoice> ResolveThinking(const Json& request) {
  ThinkingChoice out;
  std::optional<bool> thinking, enable_thinking;
  std::optional<std::string> thinking_effort;
  std::string effort_path = "chat_template_kwargs.thinking_effort";
  auto kw = request.find("chat_template_kwargs");
  if (kw != request.end() && !kw->is_null()) {
    if (!kw->is_object()) return Bad("chat_template_kwargs", "must be an object");
    for (auto it = kw->begin(); it != kw->end(); ++it) {
      const std::string& key = it.key();
      if (key != "thinking" && key != "enable_thinking" && key != "thinking_effort" &&
          key != "add_generation_prompt") {
        return Bad(Cat("chat_template_kwargs.", key),
                   "unknown key (Kimi K3 accepts thinking, enable_thinking, thinking_effort, "
                   "add_generation_prompt)");
      }
    }
    COLI_ASSIGN_OR_RETURN(thinking, OptBool(*kw, "thinking", "chat_template_kwargs.thinking"));
    COLI_ASSIGN_OR_RETURN(enable_thinking, OptBool(*kw, "enable_thinking",
                                                   "chat_template_kwargs.enable_thinking"));
    COLI_ASSIGN_OR_RETURN(thinking_effort, OptString(*kw, "thinking_effort", effort_path));
    COLI_ASSIGN_OR_RETURN(std::optional<bool> agp,
                          OptBool(*kw, "add_generation_prompt",
                                  "chat_template_kwargs.add_generation_prompt"));
    if (agp) out.add_generation_prompt = *agp;
    out.add_generation_prompt_given = agp.has_value();
  }
  if (!enable_thinking) {
    COLI_ASSIGN_OR_RETURN(enable_thinking, OptBool(request, "enable_thinking", "enable_thinking"));
  }
  COLI_ASSIGN_OR_RETURN(std::optional<std::string> reasoning_effort,
                        OptString(request, "reasoning_effort", "reasoning_effort"));
  out.thinking = thinking ? *thinking : (enable_thinking ? *enable_thinking : true);
  if (reasoning_effort && *reasoning_effort == "none") {
    out.thinking = false;
  } else if (!thinking_effort && reasoning_effort) {
    thinking_effort = reasoning_effort;
    effort_path = "reasoning_effort";
  }
  if (thinking_effort) out.effort = *thinking_effort;
  if (out.effort != "low" && out.effort != "high" && out.effort != "max") {
    return Bad(effort_path, Cat("unsupported value '", out.effort,
                                         "' (Kimi K3 supports low, high, max; 'none' turns "
                                         "thinking off)"));
  }
  return out;
}

// An assistant message's reasoning. §6.5.5: an empty reasoning_content falls back to
// `reasoning`; a blank one does not.
absl::StatusOr<std::optional<std::string>> ReasoningOf(const Json& m, std::string_view path) {
  COLI_ASSIGN_OR_RETURN(std::optional<std::string> reasoning,
                        OptString(m, "reasoning_content", Cat(path, ".reasoning_content")));
  COLI_ASSIGN_OR_RETURN(std::optional<std::string> fallback,
                        OptString(m, "reasoning", Cat(path, ".reasoning")));
  if (!reasoning || reasoning->empty()) reasoning = fallback;
  return reasoning;
}

absl::Status RenderAssistant(const Json& m, std::string_view path, bool thinking,
                             SegmentBuilder* b) {
  if (thinking) {
    COLI_ASSIGN_OR_RETURN(std::optional<std::string> reasoning, ReasoningOf(m, path));
    b->OpenTag("think");
    if (reasoning && !IsBlank(*reasoning)) b->Text(*reasoning);
    b->CloseTag("think");
  }
  b->OpenTag("response");
  COLI_RETURN_IF_ERROR(AppendContent(m, path, b));
  b->CloseTag("response");

  auto calls = m.find("tool_calls");
  if (calls == m.end() || calls->is_null()) return absl::OkStatus();
  const std::string calls_path = Cat(path, ".tool_calls");
  if (!calls->is_array()) return Bad(calls_path, "must be an array");
  if (calls->empty()) return absl::OkStatus();
  b->OpenTag("tools");
  for (size_t k = 0; k < calls->size(); ++k) {
    const std::string call_path = Path(calls_path, k);
    COLI_ASSIGN_OR_RETURN(const Json* fn, CallFunction((*calls)[k], call_path));
    const std::string fn_path =
        fn == &(*calls)[k] ? call_path : Cat(call_path, ".function");
    COLI_ASSIGN_OR_RETURN(std::optional<std::string> name,
                          OptString(*fn, "name", Cat(fn_path, ".name")));
    if (!name) return Bad(Cat(fn_path, ".name"), "a tool call needs a function name");
    COLI_ASSIGN_OR_RETURN(NormalizedArguments args,
                          NormalizeArguments(*fn, Cat(fn_path, ".arguments")));
    b->OpenTagDyn("call", {{"tool", *name}, {"index", std::to_string(k + 1)}});
    if (args.raw_json_block) {
      b->OpenTag("json", {{"type", "object"}});
      b->Text(*args.raw_json_block);
      b->CloseTag("json");
    } else {
      for (auto it = args.object.begin(); it != args.object.end(); ++it) {
        const Json& value = it.value();
        b->OpenTagDyn("argument", {{"key", it.key()}, {"type", std::string(XtmlType(value))}});
        if (value.is_string()) {
          b->Text(value.get_ref<const std::string&>());
        } else {
          b->Text(PyJsonDumps(value, PyJsonStyle::kSpaced));
        }
        b->CloseTag("argument");
      }
    }
    b->CloseTag("call");
  }
  b->CloseTag("tools");
  return absl::OkStatus();
}

// The last assistant message left open for the model to continue (seed §8.3's `C` record): with
// text, the think pair (thinking on) closed and the response open with the text; with no text
// yet, the think block open with the reasoning so far. Returns whether `think` is the open tag.
absl::StatusOr<bool> RenderOpenAssistant(const Json& m, std::string_view path, bool thinking,
                                         SegmentBuilder* b) {
  if (auto calls = m.find("tool_calls");
      calls != m.end() && !calls->is_null() && !(calls->is_array() && calls->empty())) {
    return Bad(Cat(path, ".tool_calls"),
               "the message continue_final_message continues cannot hold tool calls");
  }
  SegmentBuilder content;
  COLI_RETURN_IF_ERROR(AppendContent(m, path, &content));
  const std::vector<Segment> text = content.Take();
  if (thinking) {
    COLI_ASSIGN_OR_RETURN(std::optional<std::string> reasoning, ReasoningOf(m, path));
    b->OpenTag("think");
    if (text.empty()) {
      if (reasoning) b->Text(*reasoning);  // as written: the model goes on from its last byte
      return true;
    }
    if (reasoning && !IsBlank(*reasoning)) b->Text(*reasoning);  // as RenderAssistant
    b->CloseTag("think");
  }
  b->OpenTag("response");
  for (const Segment& piece : text) b->Text(piece.text);
  return false;
}

// The n-th call's function name of the preceding assistant (positional tool-name fallback).
std::optional<std::string> PositionalToolName(const Json* tool_calls, int index) {
  if (tool_calls == nullptr || !tool_calls->is_array() || index < 1 ||
      static_cast<size_t>(index) > tool_calls->size()) {
    return std::nullopt;
  }
  const Json& call = (*tool_calls)[index - 1];
  if (!call.is_object()) return std::nullopt;
  auto fn = call.find("function");
  const Json* holder = (fn != call.end() && fn->is_object()) ? &*fn : &call;
  auto name = holder->find("name");
  if (name == holder->end() || !name->is_string()) return std::nullopt;
  return name->get<std::string>();
}

}  // namespace

std::string XtmlAttrEscape(std::string_view value) {
  std::string out;
  for (char c : value) {
    if (c == '&') {
      out += "&amp;";
    } else if (c == '"') {
      out += "&quot;";
    } else {
      out.push_back(c);
    }
  }
  return out;
}

absl::StatusOr<Json> ParseRequestBody(std::string_view body) {
  bool too_deep = false;
  Json parsed = Json::parse(
      body.begin(), body.end(),
      [&too_deep](int depth, Json::parse_event_t, Json&) {
        if (depth > 256) too_deep = true;
        return !too_deep;
      },
      /*allow_exceptions=*/false);
  if (too_deep) return absl::InvalidArgumentError("request body: JSON nested deeper than 256");
  if (parsed.is_discarded()) return absl::InvalidArgumentError("request body: not valid JSON");
  if (!parsed.is_object()) return absl::InvalidArgumentError("request body: must be a JSON object");
  return parsed;
}

absl::StatusOr<RenderedChat> BuildChatSegments(const Json& request, bool add_generation_prompt) {
  if (!request.is_object()) return absl::InvalidArgumentError("request: must be a JSON object");
  COLI_ASSIGN_OR_RETURN(ThinkingChoice choice, ResolveThinking(request));
  choice.add_generation_prompt = choice.add_generation_prompt && add_generation_prompt;
  auto messages_it = request.find("messages");
  if (messages_it == request.end() || !messages_it->is_array() || messages_it->empty()) {
    return Bad("messages", "must be a non-empty array of messages");
  }
  COLI_ASSIGN_OR_RETURN(std::vector<MessageRef> messages, ResortToolResults(*messages_it));
  COLI_ASSIGN_OR_RETURN(std::optional<bool> continue_final,
                        OptBool(request, "continue_final_message", "continue_final_message"));
  const bool continues = continue_final.value_or(false);
  if (continues) {
    const Json& last = messages_it->back();
    if (!last.is_object() || !last.contains("role") || last["role"] != "assistant") {
      return Bad("continue_final_message", "the last message must be the assistant's to continue");
    }
    if (choice.add_generation_prompt_given && choice.add_generation_prompt) {
      return Bad("continue_final_message",
                 "cannot be combined with add_generation_prompt true (the last message is "
                 "continued, no new one is opened)");
    }
  }

  SegmentBuilder b;
  // Rule 1: tool declarations.
  auto tools = request.find("tools");
  if (tools != request.end() && !tools->is_null()) {
    if (!tools->is_array()) return Bad("tools", "must be an array");
    for (size_t i = 0; i < tools->size(); ++i) {
      if (!(*tools)[i].is_object()) return Bad(Path("tools", i), "a tool must be an object");
    }
    if (!tools->empty()) {
      b.SystemMessage("tool-declare",
                      Cat(kToolsHead, PyJsonDumps(*tools, PyJsonStyle::kCompactSorted),
                                   kToolsTail));
    }
  }
  // Rule 2: the thinking-effort message.
  if (choice.thinking) {
    b.SystemMessage("thinking-effort", Cat(kEffortHead, choice.effort, kEffortTail));
  }
  // Rule 3: the messages.
  bool open_in_think = false;  // continue_final_message left the think block open
  const Json* last_tool_calls = nullptr;
  int tool_index = 0;
  for (const MessageRef& ref : messages) {
    const Json& m = *ref.message;
    const std::string path = Path("messages", ref.index);
    std::string role = m["role"].get<std::string>();
    if (role == "developer") role = "system";  // documented deviation: the vendor drops it
    COLI_ASSIGN_OR_RETURN(std::optional<std::string> name,
                          OptString(m, "name", Cat(path, ".name")));
    std::vector<std::pair<std::string, std::string>> attrs = {{"role", role}};
    if (name && !name->empty() && role != "tool") attrs.emplace_back("name", *name);
    if (role == "user" || role == "system") {
      if (role == "system" && Truthy(m, "tools")) {
        const Json& dyn = m["tools"];
        if (!dyn.is_array()) return Bad(Cat(path, ".tools"), "must be an array");
        b.SystemMessage("tool-declare",
                        Cat(kDynamicToolsHead,
                                     PyJsonDumps(dyn, PyJsonStyle::kCompactSorted), kToolsTail));
        continue;
      }
      b.OpenTagDyn("message", attrs);
      COLI_RETURN_IF_ERROR(AppendContent(m, path, &b));
      b.CloseTag("message");
      b.EndOfMsg();
    } else if (role == "assistant") {
      auto calls = m.find("tool_calls");
      last_tool_calls = calls == m.end() ? nullptr : &*calls;
      tool_index = 0;
      b.OpenTagDyn("message", attrs);
      if (continues && ref.message == &messages_it->back()) {
        COLI_ASSIGN_OR_RETURN(open_in_think, RenderOpenAssistant(m, path, choice.thinking, &b));
        continue;  // left open
      }
      COLI_RETURN_IF_ERROR(RenderAssistant(m, path, choice.thinking, &b));
      b.CloseTag("message");
      b.EndOfMsg();
    } else if (role == "tool") {
      ++tool_index;
      std::optional<std::string> tool_name = ref.resolved_tool;
      if (!tool_name) {
        auto tool_field = m.find("tool");
        if (tool_field != m.end()) {
          if (!tool_field->is_null() && !tool_field->is_string()) {
            return Bad(Cat(path, ".tool"), "must be a string");
          }
          if (tool_field->is_string()) tool_name = tool_field->get<std::string>();
        } else {
          tool_name = name;
        }
      }
      if (!tool_name) tool_name = PositionalToolName(last_tool_calls, tool_index);
      if (!tool_name) {
        return Bad(path,
                   "a tool message needs a resolvable tool name: a tool_call_id matching the "
                   "preceding assistant's tool_calls, a tool/name field, or a call at its position");
      }
      b.OpenTagDyn("message", {{"role", "tool"},
                               {"tool", *tool_name},
                               {"index", std::to_string(tool_index)}});
      COLI_RETURN_IF_ERROR(AppendContent(m, path, &b));
      b.CloseTag("message");
      b.EndOfMsg();
    } else {
      return Bad(Cat(path, ".role"),
                 Cat("unknown role '", role,
                              "' (expected system, developer, user, assistant or tool)"));
    }
  }
  // Rule 4: tool_choice.
  auto tool_choice = request.find("tool_choice");
  if (tool_choice != request.end() && !tool_choice->is_null()) {
    if (tool_choice->is_string()) {
      const std::string& tc = tool_choice->get_ref<const std::string&>();
      if (tc == "required") {
        b.SystemMessage("tool-choice", kChoiceRequired);
      } else if (tc == "none") {
        b.SystemMessage("tool-choice", kChoiceNone);
      } else if (tc != "auto") {
        return Bad("tool_choice", Cat("unsupported value '", tc,
                                               "' (expected auto, none, required or an object)"));
      }
    } else if (!tool_choice->is_object()) {
      return Bad("tool_choice", "must be a string or an object");
    }
    // An object naming one function is accepted and, as in the vendor renderer, adds nothing.
    // Continued, the reply is already under way: none of these can be kept from its start.
    if (continues && *tool_choice != "auto") {
      return Bad("tool_choice",
                 "only \"auto\" can be combined with continue_final_message (the reply it "
                 "continues has begun)");
    }
  }
  // Rule 5: response_format.
  auto rf = request.find("response_format");
  if (rf != request.end() && !rf->is_null()) {
    std::string type;
    if (rf->is_string()) {
      type = rf->get<std::string>();
    } else if (rf->is_object()) {
      COLI_ASSIGN_OR_RETURN(std::optional<std::string> t,
                            OptString(*rf, "type", "response_format.type"));
      if (!t) return Bad("response_format.type", "missing");
      type = *t;
    } else {
      return Bad("response_format", "must be an object");
    }
    if (continues && type != "text") {
      return Bad("response_format",
                 "a JSON response_format cannot be combined with continue_final_message (the "
                 "reply it continues has begun)");
    }
    if (type == "json_object") {
      b.SystemMessage("response-format", kRfObject);
    } else if (type == "json_schema") {
      Json schema = nullptr;
      if (rf->is_object()) {
        auto js = rf->find("json_schema");
        if (js != rf->end() && !js->is_null()) {
          if (js->is_object()) {
            if (js->contains("schema")) {
              schema = (*js)["schema"];
            } else if (js->contains("json_schema")) {
              schema = (*js)["json_schema"];
            } else {
              schema = *js;
            }
          } else {
            schema = *js;
          }
        }
      }
      b.SystemMessage("response-format",
                      Cat(kRfSchemaHead, PyJsonDumps(schema, PyJsonStyle::kCompactSorted),
                                   kRfSchemaTail));
    } else if (type != "text") {
      return Bad("response_format.type",
                 Cat("unsupported value '", type,
                              "' (expected text, json_object or json_schema)"));
    }
  }
  // Rule 6: the generation prompt (none when the last message is continued).
  if (choice.add_generation_prompt && !continues) {
    b.OpenTag("message", {{"role", "assistant"}});
    b.OpenTag(choice.thinking ? "think" : "response");
  }
  RenderedChat out;
  out.segments = b.Take();
  out.thinking = continues ? open_in_think : choice.thinking;
  out.add_generation_prompt = choice.add_generation_prompt && !continues;
  out.continues_final_message = continues;
  for (const Segment& s : out.segments) out.text += s.text;
  return out;
}

absl::StatusOr<std::vector<int32_t>> EncodeSegments(std::span<const Segment> segments,
                                                    const tok::Tokenizer& tokenizer) {
  std::vector<int32_t> ids;
  for (const Segment& s : segments) {
    if (s.special) {
      std::optional<int32_t> id = tokenizer.TokenId(s.text);
      if (!id || !tokenizer.IsSpecial(*id)) {
        return absl::InvalidArgumentError(
            Cat("tokenizer has no special token '", s.text, "' (XTML needs it)", kSpecialsHint));
      }
      ids.push_back(*id);
    } else {
      std::vector<int32_t> piece = tokenizer.Encode(s.text, /*allow_special=*/false);
      ids.insert(ids.end(), piece.begin(), piece.end());
    }
  }
  return ids;
}

absl::StatusOr<RenderedChat> RenderChat(const Json& request, const tok::Tokenizer& tokenizer,
                                        const RenderOptions& options) {
  COLI_ASSIGN_OR_RETURN(RenderedChat out,
                        BuildChatSegments(request, options.add_generation_prompt));
  if (options.add_bos) {
    out.segments.insert(out.segments.begin(), Segment{std::string(kBosToken), true});
    out.text.insert(0, kBosToken);
  }
  COLI_ASSIGN_OR_RETURN(out.ids, EncodeSegments(out.segments, tokenizer));
  return out;
}

std::string ErrorParam(const absl::Status& status) {
  std::string_view msg(status.message().data(), status.message().size());
  const size_t colon = msg.find(": ");
  if (colon == std::string_view::npos || colon == 0) return "";
  std::string_view head = msg.substr(0, colon);
  for (char c : head) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '_' || c == '.' || c == '[' || c == ']';
    if (!ok) return "";
  }
  return std::string(head);
}

}  // namespace coli::k3
