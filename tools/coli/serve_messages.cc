// Anthropic's Messages API mapped onto the chat path (see serve_messages.h).
#include "tools/coli/serve_messages.h"

#include <cctype>
#include <cmath>
#include <cstring>
#include <string>
#include <utility>

namespace coli::cli::serve {

namespace {

const Json* Find(const Json& object, const char* key) {
  auto it = object.find(key);
  return it == object.end() ? nullptr : &*it;
}

std::string Dump(const Json& j) { return j.dump(-1, ' ', false, Json::error_handler_t::replace); }

std::string At(const std::string& path, size_t i) { return path + "[" + std::to_string(i) + "]"; }

// The text of `content`: a string, or an array of text blocks (joined by line breaks). System
// prompts and tool results take this form.
bool TextOf(const Json& content, const std::string& path, std::string* out, ApiError* error) {
  if (content.is_string()) {
    *out = content.get<std::string>();
    return true;
  }
  if (!content.is_array()) {
    *error = BadField(path, "must be a string or an array of text blocks");
    return false;
  }
  out->clear();
  for (size_t i = 0; i < content.size(); ++i) {
    const Json& block = content[i];
    const Json* type = block.is_object() ? Find(block, "type") : nullptr;
    const Json* text = block.is_object() ? Find(block, "text") : nullptr;
    if (type == nullptr || *type != "text" || text == nullptr || !text->is_string()) {
      const std::string got = type != nullptr && type->is_string()
                                  ? "a block of type '" + type->get<std::string>() + "'"
                                  : std::string("something else");
      *error = BadField(At(path, i),
                        "expected a text block {\"type\": \"text\", \"text\": ...}, "
                        "got " +
                            got + " (this engine reads text only)");
      return false;
    }
    if (i > 0) *out += "\n";
    *out += text->get<std::string>();
  }
  return true;
}

// An object's "type" ("" when it has none, or is no object).
std::string TypeOf(const Json& object) {
  const Json* type = object.is_object() ? Find(object, "type") : nullptr;
  return type != nullptr && type->is_string() ? type->get<std::string>() : "";
}

// A content block this engine does not read in a message of `role` (`reads`: what it reads).
ApiError UnsupportedBlock(const std::string& where, const std::string& kind, const char* role,
                          const char* reads) {
  if (kind.empty())
    return BadField(where, "a content block must be an object with a string \"type\"");
  return BadField(where, "content block type '" + kind + "' is unsupported in " + role +
                             " message: this engine reads " + reads + " blocks");
}

bool ReadString(const Json& object, const char* key, const std::string& path, std::string* out,
                ApiError* error) {
  const Json* v = Find(object, key);
  if (v == nullptr || !v->is_string()) {
    *error = BadField(path + "." + key, std::string(key) + " must be a string");
    return false;
  }
  *out = v->get<std::string>();
  return true;
}

// A plain-text document block ({source: {type: "text", data}}, or {type: "content", content:
// text blocks}) as text, its title and context first; other sources (PDF, images, files) are
// refused: this engine reads text only.
bool DocumentText(const Json& block, const std::string& where, std::string* out, ApiError* error) {
  const Json* source = Find(block, "source");
  const std::string kind = source != nullptr ? TypeOf(*source) : "";
  std::string body;
  if (kind == "text") {
    if (!ReadString(*source, "data", where + ".source", &body, error)) return false;
  } else if (kind == "content") {
    const Json* content = Find(*source, "content");
    if (content == nullptr || !TextOf(*content, where + ".source.content", &body, error)) {
      if (content == nullptr) {
        *error = BadField(where + ".source.content", "a content source needs content");
      }
      return false;
    }
  } else {
    *error = BadField(where + ".source", "document source type '" + kind +
                                             "' is unsupported: this engine reads plain-text "
                                             "documents only (source type text or content)");
    return false;
  }
  out->clear();
  for (const char* key : {"title", "context"}) {
    if (const Json* v = Find(block, key); v != nullptr && v->is_string() && !v->empty()) {
      *out += v->get<std::string>() + "\n\n";
    }
  }
  *out += body;
  return true;
}

// One user message: text blocks become a user message; tool_result blocks become tool messages
// (in their order, text between them kept in place).
bool MapUserMessage(const Json& content, const std::string& path, Json* messages, ApiError* error) {
  if (content.is_string()) {
    messages->push_back(Json{{"role", "user"}, {"content", content}});
    return true;
  }
  Json parts = Json::array();
  auto flush = [&] {
    if (parts.empty()) return;
    messages->push_back(Json{{"role", "user"}, {"content", std::move(parts)}});
    parts = Json::array();
  };
  for (size_t j = 0; j < content.size(); ++j) {
    const Json& block = content[j];
    const std::string where = At(path + ".content", j);
    const std::string kind = TypeOf(block);
    if (kind == "text") {
      std::string text;
      if (!ReadString(block, "text", where, &text, error)) return false;
      parts.push_back(Json{{"type", "text"}, {"text", text}});
    } else if (kind == "document") {
      std::string text;
      if (!DocumentText(block, where, &text, error)) return false;
      parts.push_back(Json{{"type", "text"}, {"text", text}});
    } else if (kind == "tool_result") {
      std::string id, text;
      if (!ReadString(block, "tool_use_id", where, &id, error)) return false;
      if (const Json* c = Find(block, "content"); c != nullptr && !c->is_null()) {
        if (!TextOf(*c, where + ".content", &text, error)) return false;
      }
      const Json* is_error = Find(block, "is_error");
      if (is_error != nullptr && !is_error->is_boolean()) {
        *error = BadField(where + ".is_error", "is_error must be a boolean");
        return false;
      }
      // The tool failed: the model reads it as such (the chat format has no flag for it).
      if (is_error != nullptr && is_error->get<bool>()) text = "Error: " + text;
      flush();
      messages->push_back(Json{{"role", "tool"}, {"tool_call_id", id}, {"content", text}});
    } else {
      *error = UnsupportedBlock(where, kind, "a user", "text, plain-text document and tool_result");
      return false;
    }
  }
  flush();
  return true;
}

// One assistant message: text blocks to content, thinking blocks to reasoning_content (their
// signatures are not checked: this engine signs nothing), tool_use blocks to tool_calls.
bool MapAssistantMessage(const Json& content, const std::string& path, Json* messages,
                         ApiError* error) {
  if (content.is_string()) {
    messages->push_back(Json{{"role", "assistant"}, {"content", content}});
    return true;
  }
  std::string text, reasoning;
  Json calls = Json::array();
  for (size_t j = 0; j < content.size(); ++j) {
    const Json& block = content[j];
    const std::string where = At(path + ".content", j);
    const std::string kind = TypeOf(block);
    if (kind == "text") {
      std::string t;
      if (!ReadString(block, "text", where, &t, error)) return false;
      text += t;
    } else if (kind == "thinking") {
      std::string t;
      if (!ReadString(block, "thinking", where, &t, error)) return false;
      reasoning += t;
    } else if (kind == "redacted_thinking") {
      continue;  // another model's encrypted thinking: nothing this one can read
    } else if (kind == "tool_use") {
      std::string id, name;
      if (!ReadString(block, "id", where, &id, error)) return false;
      if (!ReadString(block, "name", where, &name, error)) return false;
      const Json* input = Find(block, "input");
      if (input == nullptr || !input->is_object()) {
        *error = BadField(where + ".input", "a tool_use block's input must be an object");
        return false;
      }
      calls.push_back(Json{{"id", id},
                           {"type", "function"},
                           {"function", {{"name", name}, {"arguments", Dump(*input)}}}});
    } else {
      *error = UnsupportedBlock(where, kind, "an assistant", "text, thinking and tool_use");
      return false;
    }
  }
  Json m{{"role", "assistant"}, {"content", text}};
  if (!reasoning.empty()) m["reasoning_content"] = reasoning;
  if (!calls.empty()) m["tool_calls"] = std::move(calls);
  messages->push_back(std::move(m));
  return true;
}

bool MapTools(const Json& tools, Json* chat, ApiError* error) {
  if (!tools.is_array()) {
    *error = BadField("tools", "tools must be an array");
    return false;
  }
  Json functions = Json::array();
  for (size_t i = 0; i < tools.size(); ++i) {
    const Json& t = tools[i];
    const std::string path = At("tools", i);
    if (!t.is_object()) {
      *error = BadField(path, "a tool must be an object {name, description, input_schema}");
      return false;
    }
    if (const Json* type = Find(t, "type"); type != nullptr && *type != "custom") {
      *error = BadField(path + ".type",
                        "tool type " + Dump(*type) +
                            " is one Anthropic's servers run; this server runs none: declare "
                            "a custom tool {name, description, input_schema} and run it yourself");
      return false;
    }
    std::string name;
    if (!ReadString(t, "name", path, &name, error)) return false;
    const Json* schema = Find(t, "input_schema");
    if (schema == nullptr || !schema->is_object()) {
      *error = BadField(path + ".input_schema", "input_schema must be a JSON Schema object");
      return false;
    }
    Json fn{{"name", name}, {"parameters", *schema}};
    if (const Json* d = Find(t, "description"); d != nullptr) {
      if (!d->is_string()) {
        *error = BadField(path + ".description", "description must be a string");
        return false;
      }
      fn["description"] = *d;
    }
    functions.push_back(Json{{"type", "function"}, {"function", std::move(fn)}});
  }
  if (!functions.empty()) (*chat)["tools"] = std::move(functions);
  return true;
}

bool MapToolChoice(const Json& choice, Json* chat, ApiError* error) {
  const std::string kind = TypeOf(choice);
  if (kind == "auto") {
    (*chat)["tool_choice"] = "auto";
  } else if (kind == "any") {
    (*chat)["tool_choice"] = "required";
  } else if (kind == "none") {
    (*chat)["tool_choice"] = "none";
  } else if (kind == "tool") {
    std::string name;
    if (!ReadString(choice, "name", "tool_choice", &name, error)) return false;
    (*chat)["tool_choice"] = Json{{"type", "function"}, {"function", {{"name", name}}}};
  } else {
    *error = BadField("tool_choice",
                      "tool_choice must be {\"type\": \"auto\"}, {\"type\": \"any\"}, "
                      "{\"type\": \"tool\", \"name\": ...} or {\"type\": \"none\"}");
    return false;
  }
  if (const Json* d = Find(choice, "disable_parallel_tool_use"); d != nullptr) {
    if (!d->is_boolean()) {
      *error = BadField("tool_choice.disable_parallel_tool_use",
                        "disable_parallel_tool_use must be a boolean");
      return false;
    }
    if (d->get<bool>()) (*chat)["parallel_tool_calls"] = false;
  }
  return true;
}

// The last assistant message, which the reply continues: Anthropic's rules (no trailing white
// space, which tokenizes badly) and no tool_use (a call is never continued).
bool CheckPrefill(const Json& content, const std::string& path, ApiError* error) {
  std::string text;
  if (content.is_string()) {
    text = content.get<std::string>();
  } else {
    for (size_t j = 0; j < content.size(); ++j) {
      const std::string kind = TypeOf(content[j]);
      if (kind == "tool_use") {
        *error = BadField(At(path + ".content", j),
                          "a prefilled reply (the last message, the assistant's) cannot hold "
                          "tool_use blocks");
        return false;
      }
      if (kind == "text" && content[j].contains("text") && content[j]["text"].is_string()) {
        text += content[j]["text"].get<std::string>();
      }
    }
  }
  if (!text.empty() && std::isspace(static_cast<unsigned char>(text.back()))) {
    *error =
        BadField(path + ".content", "final assistant content cannot end with trailing whitespace");
    return false;
  }
  return true;
}

// thinking {type: enabled, budget_tokens} / {type: adaptive} / {type: disabled}: whether K3
// thinks. budget_tokens is checked as Anthropic checks it and picks K3's thinking effort (below
// 4096 low, below 16384 high, else max; output_config.effort wins): K3 has no token budget, the
// effort is how it is told to think less.
bool MapThinking(const Json* thinking, int64_t max_tokens, bool count_only, Json* chat,
                 ApiError* error) {
  bool on = false;  // absent: no thinking, as in Anthropic's API
  if (thinking != nullptr) {
    const std::string kind = TypeOf(*thinking);
    if (kind == "enabled") {
      const Json* budget = Find(*thinking, "budget_tokens");
      if (budget == nullptr || !budget->is_number_integer() || budget->get<int64_t>() < 1024) {
        *error = BadField("thinking.budget_tokens",
                          "thinking.budget_tokens must be an integer of at least 1024");
        return false;
      }
      if (!count_only && budget->get<int64_t>() >= max_tokens) {
        *error = BadField("thinking.budget_tokens",
                          "thinking.budget_tokens must be less than max_tokens");
        return false;
      }
      const int64_t tokens = budget->get<int64_t>();
      (*chat)["reasoning_effort"] = tokens < 4096 ? "low" : tokens < 16384 ? "high" : "max";
      on = true;
    } else if (kind == "adaptive") {
      on = true;
    } else if (kind != "disabled") {
      *error = BadField("thinking",
                        "thinking must be {\"type\": \"enabled\", \"budget_tokens\": N}, "
                        "{\"type\": \"adaptive\"} or {\"type\": \"disabled\"}");
      return false;
    }
  }
  (*chat)["enable_thinking"] = on;
  return true;
}

// output_config {format: {type: json_schema, schema}, effort} (and the older top-level
// output_format): the format becomes response_format, which the model family enforces by
// constrained decoding; the effort becomes reasoning_effort, K3's nearest (low; medium and high
// → high; xhigh and max → max), which matters when it thinks.
bool MapOutputConfig(const Json& body, Json* chat, ApiError* error) {
  const Json* config = Find(body, "output_config");
  if (config != nullptr && !config->is_null() && !config->is_object()) {
    *error = BadField("output_config", "output_config must be an object");
    return false;
  }
  const Json* format = config != nullptr && config->is_object() ? Find(*config, "format") : nullptr;
  std::string format_path = "output_config.format";
  if (format == nullptr || format->is_null()) {
    format = Find(body, "output_format");
    format_path = "output_format";
  }
  if (format != nullptr && !format->is_null()) {
    const Json* schema = format->is_object() ? Find(*format, "schema") : nullptr;
    if (TypeOf(*format) != "json_schema" || schema == nullptr || !schema->is_object()) {
      *error = BadField(format_path,
                        "the output format must be {\"type\": \"json_schema\", \"schema\": "
                        "{...}}");
      return false;
    }
    (*chat)["response_format"] =
        Json{{"type", "json_schema"}, {"json_schema", {{"name", "output"}, {"schema", *schema}}}};
  }
  const Json* effort = config != nullptr && config->is_object() ? Find(*config, "effort") : nullptr;
  if (effort != nullptr && !effort->is_null()) {
    static const std::pair<const char*, const char*> kEfforts[] = {
        {"low", "low"}, {"medium", "high"}, {"high", "high"}, {"xhigh", "max"}, {"max", "max"}};
    const char* mapped = nullptr;
    for (const auto& [name, k3] : kEfforts) {
      if (*effort == name) mapped = k3;
    }
    if (mapped == nullptr) {
      *error = BadField("output_config.effort", "effort must be low, medium, high, xhigh or max");
      return false;
    }
    (*chat)["reasoning_effort"] = mapped;
  }
  return true;
}

// A number field in [lo, hi] copied into the chat body.
bool CopyNumber(const Json& body, const char* key, double lo, double hi, Json* chat,
                ApiError* error) {
  const Json* v = Find(body, key);
  if (v == nullptr) return true;
  if (!v->is_number() || v->get<double>() < lo || v->get<double>() > hi) {
    *error = BadField(key, std::string(key) + " must be a number in [" + Dump(Json(lo)) + ", " +
                               Dump(Json(hi)) + "]");
    return false;
  }
  (*chat)[key] = *v;
  return true;
}

}  // namespace

std::optional<MessagesRequest> ParseMessagesRequest(const Json& body, bool count_only,
                                                    ApiError* error) {
  Json chat = Json::object();
  if (const Json* m = Find(body, "model")) {
    if (!m->is_string()) {
      *error = BadField("model", "model must be a string");
      return std::nullopt;
    }
    chat["model"] = *m;
  }
  // Tools Anthropic's servers would run: this server runs none, so asking for them is refused
  // rather than answered without them.
  for (const char* key : {"mcp_servers", "container"}) {
    if (const Json* v = Find(body, key);
        v != nullptr && !v->is_null() && !(v->is_array() && v->empty())) {
      *error = BadField(key, std::string(key) +
                                 " is not supported: this server runs no tools "
                                 "(declare custom tools and run them yourself)");
      return std::nullopt;
    }
  }
  int64_t max_tokens = 0;
  if (!count_only) {
    const Json* mt = Find(body, "max_tokens");
    if (mt == nullptr || !mt->is_number_integer() || mt->get<int64_t>() < 1 ||
        mt->get<int64_t>() > (int64_t{1} << 30)) {
      *error = BadField("max_tokens", mt == nullptr
                                          ? "max_tokens is required (the most tokens to generate)"
                                          : "max_tokens must be an integer of at least 1");
      return std::nullopt;
    }
    max_tokens = mt->get<int64_t>();
    chat["max_tokens"] = max_tokens;
  }
  Json messages = Json::array();
  bool prefill = false;
  if (const Json* system = Find(body, "system"); system != nullptr && !system->is_null()) {
    std::string text;
    if (!TextOf(*system, "system", &text, error)) return std::nullopt;
    messages.push_back(Json{{"role", "system"}, {"content", text}});
  }
  const Json* in = Find(body, "messages");
  if (in == nullptr || !in->is_array() || in->empty()) {
    *error = BadField("messages", "messages must be a non-empty array");
    return std::nullopt;
  }
  for (size_t i = 0; i < in->size(); ++i) {
    const Json& m = (*in)[i];
    const std::string path = At("messages", i);
    const Json* role = m.is_object() ? Find(m, "role") : nullptr;
    if (role == nullptr || !(*role == "user" || *role == "assistant")) {
      *error = BadField(path + ".role",
                        "a message's role must be \"user\" or \"assistant\" (the system prompt "
                        "is the top-level system field)");
      return std::nullopt;
    }
    const Json* content = Find(m, "content");
    if (content == nullptr || !(content->is_string() || content->is_array())) {
      *error =
          BadField(path + ".content", "content must be a string or an array of content blocks");
      return std::nullopt;
    }
    if (*role == "user") {
      if (!MapUserMessage(*content, path, &messages, error)) return std::nullopt;
    } else {
      // A last assistant message is a "prefill": the reply continues it (the chat path's
      // continue_final_message, seed §8.3's `C` record), as Anthropic's API does.
      if (i + 1 == in->size()) {
        prefill = true;
        if (!CheckPrefill(*content, path, error)) return std::nullopt;
      }
      if (!MapAssistantMessage(*content, path, &messages, error)) return std::nullopt;
    }
  }
  chat["messages"] = std::move(messages);
  if (const Json* tools = Find(body, "tools"); tools != nullptr && !tools->is_null()) {
    if (!MapTools(*tools, &chat, error)) return std::nullopt;
  }
  if (const Json* tc = Find(body, "tool_choice"); tc != nullptr && !tc->is_null()) {
    if (!MapToolChoice(*tc, &chat, error)) return std::nullopt;
  }
  if (!MapThinking(Find(body, "thinking"), max_tokens, count_only, &chat, error)) {
    return std::nullopt;
  }
  if (prefill) {
    if (chat["enable_thinking"] == true) {
      *error = BadField("thinking",
                        "a prefilled reply (a last assistant message) cannot be combined with "
                        "thinking, as in Anthropic's API");
      return std::nullopt;
    }
    chat["continue_final_message"] = true;
  }
  if (!MapOutputConfig(body, &chat, error)) return std::nullopt;
  if (!CopyNumber(body, "temperature", 0.0, 1.0, &chat, error) ||
      !CopyNumber(body, "top_p", 0.0, 1.0, &chat, error)) {
    return std::nullopt;
  }
  if (const Json* k = Find(body, "top_k"); k != nullptr) {
    if (!k->is_number_integer() || k->get<int64_t>() < 0) {
      *error = BadField("top_k", "top_k must be an integer of at least 0");
      return std::nullopt;
    }
    chat["top_k"] = *k;
  }
  if (const Json* s = Find(body, "stream"); s != nullptr) {
    if (!s->is_boolean()) {
      *error = BadField("stream", "stream must be a boolean");
      return std::nullopt;
    }
    chat["stream"] = *s;
  }
  std::vector<std::string> stops;
  if (const Json* s = Find(body, "stop_sequences"); s != nullptr && !s->is_null()) {
    if (!s->is_array()) {
      *error = BadField("stop_sequences", "stop_sequences must be an array of strings");
      return std::nullopt;
    }
    for (size_t i = 0; i < s->size(); ++i) {
      const Json& v = (*s)[i];
      if (!v.is_string() || v.get<std::string>().empty()) {
        *error = BadField(At("stop_sequences", i), "a stop sequence must be a non-empty string");
        return std::nullopt;
      }
      stops.push_back(v.get<std::string>());
    }
  }
  if (count_only) chat["max_tokens"] = 1;  // the chat checks want one; nothing is generated
  ApiError chat_error;
  std::optional<SamplingFields> fields = ParseChatParams(chat, &chat_error);
  if (!fields) {
    *error = chat_error;
    return std::nullopt;
  }
  fields->stop = std::move(stops);
  chat.erase("stream");  // the gateway streams; the template needs not know
  return MessagesRequest{std::move(chat), std::move(*fields)};
}

Json AnthropicError(const ApiError& error) {
  std::string type;
  switch (error.http_status) {
    case 400:
      type = "invalid_request_error";
      break;
    case 401:
      type = "authentication_error";
      break;
    case 403:
      type = "permission_error";
      break;
    case 404:
      type = "not_found_error";
      break;
    case 413:
      type = "request_too_large";
      break;
    case 429:
      type = "rate_limit_error";
      break;
    case 503:
    case 529:
      type = "overloaded_error";
      break;
    default:
      type = error.http_status < 500 ? "invalid_request_error" : "api_error";
      break;
  }
  // Anthropic names the field at the start of the message ("messages.0.content: ...").
  std::string message = error.message;
  if (!error.param.empty() && message.find(error.param) == std::string::npos) {
    message = error.param + ": " + message;
  }
  return Json{{"type", "error"}, {"error", {{"type", type}, {"message", message}}}};
}

std::string AnthropicErrorBody(int http_status, const std::string& openai_body) {
  const Json j = Json::parse(openai_body, nullptr, /*allow_exceptions=*/false);
  const Json* e = j.is_object() ? Find(j, "error") : nullptr;
  if (e == nullptr || !e->is_object() || !e->contains("message") || !(*e)["message"].is_string()) {
    return openai_body;
  }
  ApiError error;
  error.http_status = http_status;
  error.message = (*e)["message"].get<std::string>();
  if (const Json* p = Find(*e, "param"); p != nullptr && p->is_string()) {
    error.param = p->get<std::string>();
  }
  return Dump(AnthropicError(error));
}

Json StopReason(const ChoiceResult& r) {
  if (!r.stop_sequence.empty()) return "stop_sequence";
  if (r.context_full) return "model_context_window_exceeded";
  if (r.finish_reason == "length") return "max_tokens";
  if (r.finish_reason == "tool_calls") return "tool_use";
  return "end_turn";
}

Json StopSequence(const ChoiceResult& r) {
  return r.stop_sequence.empty() ? Json(nullptr) : Json(r.stop_sequence);
}

Json MessageUsage(int64_t prompt_tokens, int64_t cached_tokens, int64_t output_tokens) {
  return Json{{"input_tokens", prompt_tokens - cached_tokens},
              {"cache_creation_input_tokens", 0},
              {"cache_read_input_tokens", cached_tokens},
              {"output_tokens", output_tokens}};
}

std::string ToolUseId(const Json& call) {
  std::string id = call.value("id", std::string());
  if (id.rfind("call_", 0) == 0) id = "toolu_" + id.substr(5);
  return id;
}

namespace {

// A tool call's arguments as tool_use input (an object; what is not one is kept under
// "arguments" rather than lost).
Json ToolInput(const Json& call) {
  const Json& fn = call["function"];
  const std::string arguments = fn.value("arguments", std::string("{}"));
  Json input = Json::parse(arguments, nullptr, /*allow_exceptions=*/false);
  if (!input.is_object()) input = Json{{"arguments", arguments}};
  return input;
}

Json MessageShell(const std::string& id, const std::string& model) {
  return Json{{"id", id},
              {"type", "message"},
              {"role", "assistant"},
              {"model", model},
              {"content", Json::array()},
              {"stop_reason", nullptr},
              {"stop_sequence", nullptr}};
}

}  // namespace

Json MessageFromResult(const std::string& id, const std::string& model, ChoiceResult r) {
  // The think-skip fallback re-sends the answer as content: it is not thinking then.
  if (!r.content.empty() && r.content == r.reasoning) r.reasoning.clear();
  Json m = MessageShell(id, model);
  Json& content = m["content"];
  if (!r.reasoning.empty()) {
    content.push_back(Json{{"type", "thinking"}, {"thinking", r.reasoning}, {"signature", ""}});
  }
  if (!r.content.empty() || r.tool_calls.empty()) {
    content.push_back(Json{{"type", "text"}, {"text", r.content}});
  }
  for (const Json& call : r.tool_calls) {
    content.push_back(Json{{"type", "tool_use"},
                           {"id", ToolUseId(call)},
                           {"name", call["function"].value("name", std::string())},
                           {"input", ToolInput(call)}});
  }
  m["stop_reason"] = StopReason(r);
  m["stop_sequence"] = StopSequence(r);
  m["usage"] = MessageUsage(r.prompt_tokens, r.cached_tokens, r.completion_tokens);
  return m;
}

bool MessageStream::Start(int64_t prompt_tokens, int64_t cached_tokens) {
  Json m = MessageShell(id_, model_);
  m["usage"] = MessageUsage(prompt_tokens, cached_tokens, 0);
  return Send(Json{{"type", "message_start"}, {"message", std::move(m)}}) &&
         Send(Json{{"type", "ping"}});
}

bool MessageStream::Open(Block block, Json content_block) {
  if (!Close()) return false;
  open_ = block;
  ++index_;
  return Send(Json{{"type", "content_block_start"},
                   {"index", index_},
                   {"content_block", std::move(content_block)}});
}

bool MessageStream::Close() {
  if (open_ == Block::kNone) return true;
  open_ = Block::kNone;
  streaming_call_ = -1;
  return Send(Json{{"type", "content_block_stop"}, {"index", index_}});
}

bool MessageStream::BlockDelta(Json delta) {
  return Send(
      Json{{"type", "content_block_delta"}, {"index", index_}, {"delta", std::move(delta)}});
}

bool MessageStream::Delta(const char* kind, const Json& payload) {
  if (!std::strcmp(kind, "reasoning")) {
    if (open_ != Block::kThinking &&
        !Open(Block::kThinking, Json{{"type", "thinking"}, {"thinking", ""}, {"signature", ""}})) {
      return false;
    }
    return BlockDelta(Json{{"type", "thinking_delta"}, {"thinking", payload}});
  }
  if (!std::strcmp(kind, "content")) {
    if (open_ != Block::kText && !Open(Block::kText, Json{{"type", "text"}, {"text", ""}})) {
      return false;
    }
    return BlockDelta(Json{{"type", "text_delta"}, {"text", payload}});
  }
  const bool whole = !std::strcmp(kind, "tool_call");
  if (whole || (!std::strcmp(kind, "tool_call_delta") && payload.contains("id"))) {
    // A call opens (whole, or the first piece of one the host streams).
    const int index = payload.value("index", -1);
    if (!Open(Block::kToolUse, Json{{"type", "tool_use"},
                                    {"id", ToolUseId(payload)},
                                    {"name", payload["function"].value("name", std::string())},
                                    {"input", Json::object()}})) {
      return false;
    }
    streaming_call_ = whole ? -1 : index;
    const std::string arguments = payload["function"].value("arguments", std::string());
    if (!arguments.empty() &&
        !BlockDelta(Json{{"type", "input_json_delta"}, {"partial_json", arguments}})) {
      return false;
    }
    return whole ? Close() : true;
  }
  if (!std::strcmp(kind, "tool_call_delta")) {
    if (open_ != Block::kToolUse || payload.value("index", -1) != streaming_call_) return true;
    const std::string arguments = payload["function"].value("arguments", std::string());
    if (arguments.empty()) return true;
    return BlockDelta(Json{{"type", "input_json_delta"}, {"partial_json", arguments}});
  }
  if (!std::strcmp(kind, "tool_call_done")) {
    return open_ == Block::kToolUse ? Close() : true;
  }
  return true;  // tick, progress, logprob: nothing to send
}

bool MessageStream::Finish(const ChoiceResult& r) {
  if (!Close()) return false;
  Json usage = MessageUsage(r.prompt_tokens, r.cached_tokens, r.completion_tokens);
  return Send(Json{{"type", "message_delta"},
                   {"delta", {{"stop_reason", StopReason(r)}, {"stop_sequence", StopSequence(r)}}},
                   {"usage", std::move(usage)}}) &&
         Send(Json{{"type", "message_stop"}});
}

bool MessageStream::Fail(const ApiError& e) { return Send(AnthropicError(e)); }

}  // namespace coli::cli::serve
