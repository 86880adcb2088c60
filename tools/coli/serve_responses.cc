// The Responses API half of `coli serve` without networking (see serve_responses.h).
#include "tools/coli/serve_responses.h"

#include <algorithm>
#include <cstring>
#include <set>
#include <string_view>
#include <utility>

#include "common/log/log.h"
#include "tools/coli/serve_responses_disk.h"

namespace coli::cli::serve {
namespace {

std::string Dump(const Json& j) { return j.dump(-1, ' ', false, Json::error_handler_t::replace); }

const Json* Find(const Json& object, const char* key) {
  auto it = object.find(key);
  if (it == object.end() || it->is_null()) return nullptr;
  return &*it;
}

std::string Index(std::string_view root, size_t i) {
  return std::string(root) + "[" + std::to_string(i) + "]";
}

// Top-level fields of POST /v1/responses this gateway maps (kPassThrough below too).
constexpr const char* kMapped[] = {"model",
                                   "input",
                                   "instructions",
                                   "max_output_tokens",
                                   "tools",
                                   "tool_choice",
                                   "parallel_tool_calls",
                                   "stream",
                                   "store",
                                   "previous_response_id",
                                   "reasoning",
                                   "text",
                                   "metadata",
                                   "user",
                                   "safety_identifier",
                                   "truncation",
                                   "background",
                                   "service_tier",
                                   "include",
                                   "stream_options",
                                   "top_logprobs"};
// The one `include` value this engine has data for.
constexpr const char kLogprobsInclude[] = "message.output_text.logprobs";
// Fields of the Responses API this engine has no counterpart for.
constexpr const char* kUnsupported[] = {
    "conversation",         "prompt",         "prompt_cache_key",   "prompt_cache_retention",
    "prompt_cache_options", "max_tool_calls", "context_management", "moderation",
    "personality"};
// Passed to the chat body unchanged (same name, same meaning, validated by ParseChatParams):
// OpenAI's sampling fields and the vLLM extensions the chat path takes.
constexpr const char* kPassThrough[] = {"temperature",
                                        "top_p",
                                        "seed",
                                        "top_k",
                                        "min_p",
                                        "repetition_penalty",
                                        "frequency_penalty",
                                        "presence_penalty",
                                        "logit_bias"};

bool Contains(const auto& list, const std::string& key) {
  for (const char* k : list) {
    if (key == k) return true;
  }
  return false;
}

// Refuses keys of an input item (or tool) outside `allowed` that carry a value.
bool OnlyKeys(const Json& object, std::initializer_list<const char*> allowed,
              const std::string& path, ApiError* error) {
  for (auto it = object.begin(); it != object.end(); ++it) {
    if (it->is_null()) continue;
    bool ok = false;
    for (const char* a : allowed) ok = ok || it.key() == a;
    if (!ok) {
      *error = BadField(path + "." + it.key(),
                        "unknown or unsupported field '" + it.key() + "' in " + path);
      return false;
    }
  }
  return true;
}

bool RequireString(const Json& object, const char* key, const std::string& path, bool non_empty,
                   std::string* out, ApiError* error) {
  const Json* v = Find(object, key);
  if (v == nullptr || !v->is_string() || (non_empty && v->get_ref<const std::string&>().empty())) {
    *error = BadField(path + "." + key, std::string(key) + " must be a" +
                                            (non_empty ? " non-empty" : "") + " string");
    return false;
  }
  *out = v->get<std::string>();
  return true;
}

// Message (or tool output) content: a string, or text parts -> the chat path's text parts.
bool MapContent(const Json& content, const std::string& path, bool tool_output, Json* out,
                ApiError* error) {
  if (content.is_string()) {
    *out = content;
    return true;
  }
  if (!content.is_array()) {
    *error = BadField(path, "content must be a string or an array of content parts");
    return false;
  }
  *out = Json::array();
  for (size_t j = 0; j < content.size(); ++j) {
    const Json& part = content[j];
    const std::string part_path = Index(path, j);
    const Json* type = part.is_object() ? Find(part, "type") : nullptr;
    if (type == nullptr || !type->is_string()) {
      *error = BadField(part_path + ".type", "a content part needs a string type");
      return false;
    }
    const std::string& t = type->get_ref<const std::string&>();
    const bool text_part = t == "input_text" || (!tool_output && t == "output_text");
    if (!text_part) {
      *error = BadField(part_path + ".type",
                        "content part type '" + t +
                            "' is unsupported: this engine reads text only (input_text" +
                            (tool_output ? "" : ", output_text") + ")");
      return false;
    }
    if (!OnlyKeys(part, {"type", "text", "annotations", "logprobs"}, part_path, error)) {
      return false;
    }
    std::string text;
    if (!RequireString(part, "text", part_path, false, &text, error)) return false;
    out->push_back(Json{{"type", "text"}, {"text", text}});
  }
  return true;
}

// Builds the chat messages of `input` (a string or a list of items) onto r->conversation.
class InputMapper {
 public:
  explicit InputMapper(ResponsesRequest* r) : r_(r) {}

  bool Map(const Json& input, ApiError* error) {
    if (input.is_string()) {
      Push(Json{{"role", "user"}, {"content", input}}, "input", false);
      return true;
    }
    if (!input.is_array()) {
      *error = BadField("input", "input must be a string or an array of input items");
      return false;
    }
    for (size_t i = 0; i < input.size(); ++i) {
      if (!Item(input[i], Index("input", i), error)) return false;
    }
    if (!pending_path_.empty()) {
      *error = BadField(pending_path_,
                        "a reasoning item must be followed by the assistant message or "
                        "function_call it belongs to");
      return false;
    }
    return true;
  }

 private:
  bool Item(const Json& item, const std::string& path, ApiError* error) {
    if (!item.is_object()) {
      *error = BadField(path, "an input item must be an object");
      return false;
    }
    std::string type = "message";
    if (const Json* t = Find(item, "type")) {
      if (!t->is_string()) {
        *error = BadField(path + ".type", "type must be a string");
        return false;
      }
      type = t->get<std::string>();
    }
    if (type == "message") return Message(item, path, error);
    if (type == "function_call") return FunctionCall(item, path, error);
    if (type == "function_call_output") return FunctionCallOutput(item, path, error);
    if (type == "reasoning") return Reasoning(item, path, error);
    *error =
        BadField(path + ".type", "input item type '" + type +
                                     "' is unsupported (this engine takes message, function_call, "
                                     "function_call_output, reasoning and item_reference items)");
    return false;
  }

  bool Message(const Json& item, const std::string& path, ApiError* error) {
    if (!OnlyKeys(item, {"type", "role", "content", "id", "status", "phase"}, path, error)) {
      return false;
    }
    std::string role;
    if (!RequireString(item, "role", path, true, &role, error)) return false;
    if (role != "user" && role != "system" && role != "developer" && role != "assistant") {
      *error = BadField(path + ".role", "unknown role '" + role +
                                            "' (expected user, system, developer or assistant)");
      return false;
    }
    const Json* content = Find(item, "content");
    if (content == nullptr) {
      *error = BadField(path + ".content", "a message needs content");
      return false;
    }
    Json message{{"role", role}};
    if (!MapContent(*content, path + ".content", false, &message["content"], error)) return false;
    if (role != "assistant") {
      if (!NoPendingReasoning(path, error)) return false;
      Push(std::move(message), path, false);
      return true;
    }
    TakeReasoning(&message);
    Push(std::move(message), path, false);
    assistant_open_ = true;
    return true;
  }

  bool FunctionCall(const Json& item, const std::string& path, ApiError* error) {
    if (!OnlyKeys(item, {"type", "call_id", "name", "arguments", "id", "status"}, path, error)) {
      return false;
    }
    std::string call_id, name, arguments;
    if (!RequireString(item, "call_id", path, true, &call_id, error) ||
        !RequireString(item, "name", path, true, &name, error) ||
        !RequireString(item, "arguments", path, false, &arguments, error)) {
      return false;
    }
    Json call{{"id", call_id},
              {"type", "function"},
              {"function", {{"name", name}, {"arguments", arguments}}}};
    Json& messages = r_->conversation;
    if (!assistant_open_) {
      Json message{{"role", "assistant"}, {"content", nullptr}};
      TakeReasoning(&message);
      Push(std::move(message), path, false);
      assistant_open_ = true;
    }
    Json& turn = messages.back();
    if (!turn.contains("tool_calls")) turn["tool_calls"] = Json::array();
    const std::string chat_path = Index("messages", ChatIndex(messages.size() - 1)) +
                                  Index(".tool_calls", turn["tool_calls"].size());
    r_->sources.push_back({chat_path, path, false});
    turn["tool_calls"].push_back(std::move(call));
    return true;
  }

  bool FunctionCallOutput(const Json& item, const std::string& path, ApiError* error) {
    if (!OnlyKeys(item, {"type", "call_id", "output", "id", "status"}, path, error)) return false;
    if (!NoPendingReasoning(path, error)) return false;
    std::string call_id;
    if (!RequireString(item, "call_id", path, true, &call_id, error)) return false;
    const Json* output = Find(item, "output");
    if (output == nullptr) {
      *error = BadField(path + ".output", "a function_call_output needs output");
      return false;
    }
    Json message{{"role", "tool"}, {"tool_call_id", call_id}};
    if (!MapContent(*output, path + ".output", true, &message["content"], error)) return false;
    Push(std::move(message), path, true);
    return true;
  }

  // The model's thinking of the assistant turn that follows (K3 renders it in <think>).
  bool Reasoning(const Json& item, const std::string& path, ApiError* error) {
    if (!OnlyKeys(item, {"type", "id", "summary", "content", "encrypted_content", "status"}, path,
                  error)) {
      return false;
    }
    if (Find(item, "encrypted_content") != nullptr) {
      *error = BadField(path + ".encrypted_content",
                        "encrypted reasoning is not supported by this engine (send the "
                        "reasoning item's content as reasoning_text parts)");
      return false;
    }
    if (!pending_path_.empty()) {
      *error = BadField(path, "two reasoning items in a row: each belongs to one assistant turn");
      return false;
    }
    // Its text: the reasoning_text parts, or (an item without them) the summary's text.
    std::string text;
    const Json* content = Find(item, "content");
    const Json* summary = Find(item, "summary");
    const bool use_content = content != nullptr && content->is_array() && !content->empty();
    const Json* parts = use_content ? content : summary;
    const std::string parts_path = path + (use_content ? ".content" : ".summary");
    if (parts != nullptr) {
      if (!parts->is_array()) {
        *error = BadField(parts_path, "must be an array of text parts");
        return false;
      }
      for (size_t j = 0; j < parts->size(); ++j) {
        const Json& part = (*parts)[j];
        const Json* type = part.is_object() ? Find(part, "type") : nullptr;
        const char* want = use_content ? "reasoning_text" : "summary_text";
        if (type == nullptr || *type != want) {
          *error = BadField(Index(parts_path, j) + ".type",
                            std::string("a part here must be of type ") + want);
          return false;
        }
        std::string t;
        if (!RequireString(part, "text", Index(parts_path, j), false, &t, error)) return false;
        if (!use_content && !text.empty()) text += "\n\n";
        text += t;
      }
    }
    pending_reasoning_ = std::move(text);
    pending_path_ = path;
    assistant_open_ = false;  // a reasoning item starts the next assistant turn
    return true;
  }

  bool NoPendingReasoning(const std::string& path, ApiError* error) {
    assistant_open_ = false;
    if (pending_path_.empty()) return true;
    *error = BadField(pending_path_,
                      "a reasoning item must be followed by the assistant message "
                      "or function_call it belongs to, not by " +
                          path);
    return false;
  }

  void TakeReasoning(Json* message) {
    if (pending_path_.empty()) return;
    if (!pending_reasoning_.empty()) (*message)["reasoning_content"] = pending_reasoning_;
    pending_reasoning_.clear();
    pending_path_.clear();
  }

  // The message's index in the chat body (instructions, when given, come first).
  size_t ChatIndex(size_t conversation_index) const {
    return conversation_index +
           (r_->echo.contains("instructions") && !r_->echo["instructions"].is_null() ? 1 : 0);
  }

  void Push(Json message, const std::string& path, bool tool_output) {
    r_->sources.push_back(
        {Index("messages", ChatIndex(r_->conversation.size())), path, tool_output});
    r_->conversation.push_back(std::move(message));
  }

  ResponsesRequest* r_;
  bool assistant_open_ = false;  // function_call items join the last assistant turn
  std::string pending_reasoning_, pending_path_;
};

// A flat Responses function tool -> the chat path's {type, function: {...}}.
bool MapTools(const Json& tools, Json* out, ApiError* error) {
  if (!tools.is_array()) {
    *error = BadField("tools", "tools must be an array");
    return false;
  }
  *out = Json::array();
  for (size_t i = 0; i < tools.size(); ++i) {
    const Json& t = tools[i];
    const std::string path = Index("tools", i);
    const Json* type = t.is_object() ? Find(t, "type") : nullptr;
    if (type == nullptr || !type->is_string()) {
      *error = BadField(path + ".type", "a tool needs a type");
      return false;
    }
    if (*type != "function") {
      *error = BadField(path + ".type", "tool type '" + type->get<std::string>() +
                                            "' is unsupported (this engine takes function tools)");
      return false;
    }
    if (!OnlyKeys(t, {"type", "name", "description", "parameters", "strict"}, path, error)) {
      return false;
    }
    std::string name;
    if (!RequireString(t, "name", path, true, &name, error)) return false;
    Json fn{{"name", name}};
    for (const char* key : {"description", "parameters", "strict"}) {
      if (const Json* v = Find(t, key)) fn[key] = *v;
    }
    if (fn.contains("description") && !fn["description"].is_string()) {
      *error = BadField(path + ".description", "description must be a string");
      return false;
    }
    if (fn.contains("parameters") && !fn["parameters"].is_object()) {
      *error = BadField(path + ".parameters", "parameters must be a JSON Schema object");
      return false;
    }
    if (fn.contains("strict") && !fn["strict"].is_boolean()) {
      *error = BadField(path + ".strict", "strict must be a boolean");
      return false;
    }
    out->push_back(Json{{"type", "function"}, {"function", std::move(fn)}});
  }
  return true;
}

bool MapToolChoice(const Json& tc, Json* out, ApiError* error) {
  if (tc.is_string() && (tc == "none" || tc == "auto" || tc == "required")) {
    *out = tc;
    return true;
  }
  const Json* type = tc.is_object() ? Find(tc, "type") : nullptr;
  const Json* name = tc.is_object() ? Find(tc, "name") : nullptr;
  if (type != nullptr && *type == "function" && name != nullptr && name->is_string() &&
      tc.size() == 2) {
    *out = Json{{"type", "function"}, {"function", {{"name", *name}}}};
    return true;
  }
  *error = BadField("tool_choice",
                    "tool_choice must be none, auto, required or {\"type\": \"function\", "
                    "\"name\": ...} (this engine has no hosted tools)");
  return false;
}

// text.format -> response_format.
bool MapTextFormat(const Json& text, Json* out, ApiError* error) {
  if (!text.is_object()) {
    *error = BadField("text", "text must be an object");
    return false;
  }
  if (!OnlyKeys(text, {"format", "verbosity"}, "text", error)) return false;
  if (const Json* v = Find(text, "verbosity"); v != nullptr && *v != "medium") {
    *error = BadField("text.verbosity", "text.verbosity is not supported by this engine");
    return false;
  }
  const Json* format = Find(text, "format");
  if (format == nullptr) return true;
  const Json* type = format->is_object() ? Find(*format, "type") : nullptr;
  if (type == nullptr || !type->is_string()) {
    *error = BadField("text.format.type", "text.format needs a type");
    return false;
  }
  if (*type == "text" || *type == "json_object") {
    if (!OnlyKeys(*format, {"type"}, "text.format", error)) return false;
    *out = Json{{"type", *type}};
    return true;
  }
  if (*type != "json_schema") {
    *error = BadField("text.format.type", "unsupported format type '" + type->get<std::string>() +
                                              "' (expected text, json_object or json_schema)");
    return false;
  }
  if (!OnlyKeys(*format, {"type", "name", "schema", "description", "strict"}, "text.format",
                error)) {
    return false;
  }
  std::string name;
  if (!RequireString(*format, "name", "text.format", true, &name, error)) return false;
  const Json* schema = Find(*format, "schema");
  if (schema == nullptr || !schema->is_object()) {
    *error = BadField("text.format.schema", "schema must be a JSON Schema object");
    return false;
  }
  Json js{{"name", name}};
  if (const Json* d = Find(*format, "description")) js["description"] = *d;
  js["schema"] = *schema;
  if (const Json* s = Find(*format, "strict")) js["strict"] = *s;
  *out = Json{{"type", "json_schema"}, {"json_schema", std::move(js)}};
  return true;
}

// reasoning: {effort} -> reasoning_effort (the chat path's rules decide the values).
bool MapReasoning(const Json& reasoning, Json* chat, Json* echo, ApiError* error) {
  if (!reasoning.is_object()) {
    *error = BadField("reasoning", "reasoning must be an object");
    return false;
  }
  if (!OnlyKeys(reasoning, {"effort", "summary", "generate_summary"}, "reasoning", error)) {
    return false;
  }
  for (const char* key : {"summary", "generate_summary"}) {
    // "auto" leaves the choice to the server: this one gives the reasoning text, no summary.
    if (const Json* v = Find(reasoning, key); v != nullptr && *v != "auto") {
      *error = BadField(std::string("reasoning.") + key,
                        "reasoning summaries are not produced by this engine (the reasoning "
                        "item carries the model's reasoning text; use null or \"auto\")");
      return false;
    }
  }
  if (const Json* effort = Find(reasoning, "effort")) {
    if (!effort->is_string()) {
      *error = BadField("reasoning.effort", "reasoning.effort must be a string");
      return false;
    }
    (*chat)["reasoning_effort"] = *effort;
    (*echo)["effort"] = *effort;
  }
  if (const Json* s = Find(reasoning, "summary")) (*echo)["summary"] = *s;
  return true;
}

// The request fields with nothing to map that must still be neutral.
bool CheckNeutral(const Json& body, ApiError* error) {
  auto refuse = [error](const char* key, const char* why) {
    *error = BadField(key, std::string(key) + " " + why);
    return false;
  };
  if (const Json* v = Find(body, "background"); v != nullptr && !v->is_boolean()) {
    return refuse("background", "must be a boolean");
  }
  if (const Json* v = Find(body, "truncation"); v != nullptr && *v != "disabled") {
    return refuse("truncation", "is not supported by this engine (use \"disabled\")");
  }
  if (const Json* v = Find(body, "service_tier"); v != nullptr && *v != "auto" && *v != "default") {
    return refuse("service_tier", "must be auto or default on this engine");
  }
  if (const Json* v = Find(body, "include")) {
    if (!v->is_array()) return refuse("include", "must be an array of strings");
    for (const Json& what : *v) {
      if (what != kLogprobsInclude) {
        *error = BadField("include", "include value " + Dump(what) +
                                         " is not supported by this engine (it has only \"" +
                                         kLogprobsInclude + "\")");
        return false;
      }
    }
  }
  if (const Json* v = Find(body, "top_logprobs")) {
    if (!v->is_number_integer() || v->get<int64_t>() < 0 || v->get<int64_t>() > 20) {
      *error = BadField("top_logprobs",
                        "top_logprobs must be an integer between 0 and 20, got " + Dump(*v));
      return false;
    }
  }
  if (const Json* so = Find(body, "stream_options")) {
    if (!so->is_object()) return refuse("stream_options", "must be an object");
    if (!OnlyKeys(*so, {"include_obfuscation"}, "stream_options", error)) return false;
    if (const Json* o = Find(*so, "include_obfuscation"); o != nullptr && *o != false) {
      *error = BadField("stream_options.include_obfuscation",
                        "stream obfuscation is not supported by this engine (use false)");
      return false;
    }
  }
  if (const Json* m = Find(body, "metadata")) {
    if (!m->is_object() || m->size() > 16) {
      return refuse("metadata", "must be an object of at most 16 string values");
    }
    for (auto it = m->begin(); it != m->end(); ++it) {
      if (!it->is_string() || it.key().size() > 64 ||
          it->get_ref<const std::string&>().size() > 512) {
        *error = BadField("metadata." + it.key(),
                          "metadata values must be strings (keys <= 64, values <= 512 chars)");
        return false;
      }
    }
  }
  for (const char* key : {"user", "safety_identifier", "previous_response_id", "instructions"}) {
    if (const Json* v = Find(body, key); v != nullptr && !v->is_string()) {
      return refuse(key, "must be a string");
    }
  }
  if (const Json* v = Find(body, "store"); v != nullptr && !v->is_boolean()) {
    return refuse("store", "must be a boolean");
  }
  return true;
}

bool HasPrefixPath(const std::string& param, const std::string& prefix) {
  return param.compare(0, prefix.size(), prefix) == 0 &&
         (param.size() == prefix.size() || param[prefix.size()] == '.' ||
          param[prefix.size()] == '[');
}

void ReplaceFirst(std::string* s, std::string_view from, std::string_view to) {
  const size_t at = s->find(from);
  if (at != std::string::npos) s->replace(at, from.size(), to);
}

}  // namespace

// ---- the store ----------------------------------------------------------------------------

namespace {

bool IsFinished(const Json& response) {
  const Json* status = Find(response, "status");
  return status != nullptr && status->is_string() &&
         (*status == "completed" || *status == "incomplete" || *status == "failed" ||
          *status == "cancelled");
}

}  // namespace

ResponseStore::ResponseStore(size_t max_entries, size_t max_bytes)
    : max_entries_(max_entries), max_bytes_(max_bytes) {}

ResponseStore::~ResponseStore() = default;

void ResponseStore::InsertLocked(const std::string& id, Entry e, std::vector<DiskOp>* ops) {
  if (auto it = entries_.find(id); it != entries_.end()) {
    bytes_ -= it->second.bytes;
    e.events = std::move(it->second.events);  // a background response's update keeps its log
    if (e.events) e.bytes += e.events->bytes();
    entries_.erase(it);
    order_.erase(std::find(order_.begin(), order_.end(), id));
  }
  bytes_ += e.bytes;
  entries_.emplace(id, std::move(e));
  order_.push_back(id);
  // The oldest go first; the newest stays even when it alone is over max_bytes.
  while (order_.size() > 1 && (order_.size() > max_entries_ || bytes_ > max_bytes_)) {
    auto it = entries_.find(order_.front());
    bytes_ -= it->second.bytes;
    entries_.erase(it);
    if (dir_ && ResponseDir::IsResponseId(order_.front())) {
      ops->push_back({order_.front(), std::nullopt});
    }
    order_.pop_front();
  }
}

uint64_t ResponseStore::TakeDiskTurnLocked(const std::vector<DiskOp>& ops) {
  return ops.empty() ? 0 : next_turn_++;
}

void ResponseStore::ApplyDisk(uint64_t turn, const std::vector<DiskOp>& ops) {
  if (turn == 0) return;
  std::unique_lock<std::mutex> lock(disk_mu_);
  disk_cv_.wait(lock, [&] { return done_turn_ + 1 == turn; });
  for (const DiskOp& op : ops) {
    absl::Status s = op.bytes ? dir_->Write(op.id, *op.bytes) : dir_->Remove(op.id);
    if (!s.ok()) {
      COLI_LOG(kError) << "stored response '" << op.id << "' "
                       << (op.bytes ? "not written" : "not removed")
                       << " (kept in memory): " << s.message();
    }
  }
  done_turn_ = turn;
  disk_cv_.notify_all();
}

size_t ResponseStore::Persist(std::unique_ptr<ResponseDir> dir) {
  std::vector<std::string> skipped;
  std::vector<StoredResponse> loaded = dir->Load(&skipped);
  for (const std::string& line : skipped) COLI_LOG(kWarning) << "skipped " << line;
  std::vector<DiskOp> evicted;
  size_t kept = 0;
  uint64_t turn = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    dir_ = std::move(dir);
    for (StoredResponse& r : loaded) {  // oldest first, so the limits keep the newest
      Entry e;
      e.bytes = Dump(r.response).size() + Dump(r.conversation).size() + Dump(r.input_items).size();
      e.response = std::move(r.response);
      e.conversation = std::move(r.conversation);
      e.input_items = std::move(r.input_items);
      InsertLocked(r.id, std::move(e), &evicted);
    }
    kept = entries_.size();
    turn = TakeDiskTurnLocked(evicted);
  }
  ApplyDisk(turn, evicted);
  COLI_LOG(kInfo) << "responses dir '" << dir_->dir() << "': " << kept << " stored responses loaded"
                  << (evicted.empty() ? std::string()
                                      : ", " + std::to_string(evicted.size()) +
                                            " over the store's limits removed")
                  << (skipped.empty() ? std::string()
                                      : ", " + std::to_string(skipped.size()) + " files skipped");
  return kept;
}

void ResponseStore::Put(const std::string& id, Json response, Json conversation, Json input_items) {
  Entry e;
  e.bytes = Dump(response).size() + Dump(conversation).size() + Dump(input_items).size();
  std::vector<DiskOp> ops;
  // Encoded before the lock; only a finished response has a file (a running one gets its file
  // from the Put that finishes it). dir_ is set once, before the store is shared.
  if (dir_ && IsFinished(response)) {
    if (ResponseDir::IsResponseId(id)) {
      ops.push_back({id, ResponseDir::Encode(id, response, conversation, input_items)});
    } else {
      COLI_LOG(kError) << "stored response '" << id << "' not written: not a response id";
    }
  }
  e.response = std::move(response);
  e.conversation = std::move(conversation);
  e.input_items = std::move(input_items);
  uint64_t turn = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    InsertLocked(id, std::move(e), &ops);
    turn = TakeDiskTurnLocked(ops);
  }
  ApplyDisk(turn, ops);
}

void ResponseStore::SetEvents(const std::string& id,
                              std::shared_ptr<const ResponseEventLog> events) {
  std::lock_guard<std::mutex> lock(mu_);
  if (auto it = entries_.find(id); it != entries_.end()) it->second.events = std::move(events);
}

std::shared_ptr<const ResponseEventLog> ResponseStore::Events(const std::string& id) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = entries_.find(id);
  return it == entries_.end() ? nullptr : it->second.events;
}

void ResponseStore::SetLive(const std::string& id, std::shared_ptr<const ResponseBuilder> builder) {
  std::lock_guard<std::mutex> lock(mu_);
  if (auto it = entries_.find(id); it != entries_.end()) it->second.live = std::move(builder);
}

std::optional<Json> ResponseStore::Response(const std::string& id) const {
  std::shared_ptr<const ResponseBuilder> live;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = entries_.find(id);
    if (it == entries_.end()) return std::nullopt;
    if (!it->second.live) return it->second.response;
    live = it->second.live;
  }
  return live->Snapshot();  // outside mu_: the builder's lock is taken by its writer too
}

std::optional<Json> ResponseStore::Conversation(const std::string& id) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = entries_.find(id);
  if (it == entries_.end() || it->second.conversation.is_null()) return std::nullopt;
  return it->second.conversation;
}

std::optional<Json> ResponseStore::InputItems(const std::string& id) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = entries_.find(id);
  if (it == entries_.end()) return std::nullopt;
  return it->second.input_items;
}

std::optional<Json> ResponseStore::Item(const std::string& item_id) const {
  std::lock_guard<std::mutex> lock(mu_);
  // Outputs first: a client refers back to what it was given (the Vercel AI SDK does so for
  // every reasoning item and assistant message when store is on); inputs are the rarer case.
  for (const bool outputs : {true, false}) {
    for (auto id = order_.rbegin(); id != order_.rend(); ++id) {
      const Entry& e = entries_.at(*id);
      const Json* items = outputs ? Find(e.response, "output") : &e.input_items;
      if (items == nullptr || !items->is_array()) continue;
      for (const Json& item : *items) {
        const Json* item_id_field = item.is_object() ? Find(item, "id") : nullptr;
        if (item_id_field != nullptr && *item_id_field == item_id) return item;
      }
    }
  }
  return std::nullopt;
}

bool ResponseStore::Erase(const std::string& id) {
  std::vector<DiskOp> ops;
  uint64_t turn = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = entries_.find(id);
    if (it == entries_.end()) return false;  // so a client's id never reaches the folder
    bytes_ -= it->second.bytes;
    entries_.erase(it);
    order_.erase(std::find(order_.begin(), order_.end(), id));
    if (dir_ && ResponseDir::IsResponseId(id)) ops.push_back({id, std::nullopt});
    turn = TakeDiskTurnLocked(ops);
  }
  ApplyDisk(turn, ops);
  return true;
}

size_t ResponseStore::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return entries_.size();
}

// ---- the request ----------------------------------------------------------------------------

namespace {

// `input` with each `{"type": "item_reference", "id": ...}` replaced by the stored item it names
// (OpenAI's way to repeat an earlier output without resending it). A reference nobody stored is
// a 400 naming it.
std::optional<Json> ResolveItemReferences(const Json& input, const ResponseStore* store,
                                          ApiError* error) {
  if (!input.is_array()) return input;
  Json resolved = input;
  for (size_t i = 0; i < resolved.size(); ++i) {
    Json& item = resolved[i];
    const Json* type = item.is_object() ? Find(item, "type") : nullptr;
    if (type == nullptr || *type != "item_reference") continue;
    const std::string path = Index("input", i);
    std::string id;
    if (!OnlyKeys(item, {"type", "id"}, path, error) ||
        !RequireString(item, "id", path, true, &id, error)) {
      return std::nullopt;
    }
    std::optional<Json> stored = store != nullptr ? store->Item(id) : std::nullopt;
    if (!stored) {
      *error = BadField(path + ".id",
                        "Item with id '" + id +
                            "' not found: an item_reference names an item of a stored response "
                            "(store: true) that this server still keeps");
      return std::nullopt;
    }
    item = std::move(*stored);
  }
  return resolved;
}

}  // namespace

std::optional<ResponsesRequest> ParseResponsesRequest(const Json& body, const ResponseStore* store,
                                                      ApiError* error) {
  if (!body.is_object()) {
    *error = BadField("", "request body must be a JSON object");
    return std::nullopt;
  }
  for (auto it = body.begin(); it != body.end(); ++it) {
    if (Contains(kMapped, it.key()) || Contains(kPassThrough, it.key())) continue;
    if (Contains(kUnsupported, it.key())) {
      if (it->is_null()) continue;
      *error = BadField(it.key(), it.key() + " is not supported by this engine");
    } else {
      *error = BadField(it.key(), "unknown field '" + it.key() + "' for /v1/responses");
    }
    return std::nullopt;
  }
  if (!CheckNeutral(body, error)) return std::nullopt;

  ResponsesRequest r;
  Json& chat = r.chat;
  Json& echo = r.echo;
  if (const Json* m = Find(body, "model")) chat["model"] = *m;
  echo["instructions"] = nullptr;
  if (const Json* v = Find(body, "instructions")) echo["instructions"] = *v;
  if (const Json* v = Find(body, "store")) r.store = v->get<bool>();

  // The conversation: a stored response's, then this request's input.
  echo["previous_response_id"] = nullptr;
  if (const Json* prev = Find(body, "previous_response_id")) {
    const std::string id = prev->get<std::string>();
    std::optional<Json> earlier = store ? store->Conversation(id) : std::nullopt;
    if (!earlier && store != nullptr) {
      if (std::optional<Json> known = store->Response(id)) {
        // A background response still running, or one that was cancelled or failed.
        *error = BadField("previous_response_id",
                          "Previous response with id '" + id + "' has status " +
                              Dump((*known)["status"]) +
                              ": only a completed or incomplete response can be continued");
        return std::nullopt;
      }
    }
    if (!earlier) {
      *error = BadField("previous_response_id",
                        "Previous response with id '" + id +
                            "' not found (this server keeps the most recent stored responses "
                            "in memory, until it restarts)");
      error->code = "previous_response_not_found";
      return std::nullopt;
    }
    const size_t first = echo["instructions"].is_null() ? 0 : 1;
    for (size_t k = 0; k < earlier->size(); ++k) {
      r.sources.push_back({Index("messages", first + k), "previous_response_id", false});
    }
    r.conversation = std::move(*earlier);
    echo["previous_response_id"] = id;
    // The items used to make this response start with the earlier response's: its own items
    // (its chain) and its output.
    if (std::optional<Json> items = store->InputItems(id)) r.input_items = std::move(*items);
    if (std::optional<Json> known = store->Response(id); known && (*known)["output"].is_array()) {
      for (const Json& item : (*known)["output"]) r.input_items.push_back(item);
    }
  }
  const Json* input = Find(body, "input");
  std::optional<Json> resolved_input;
  if (input != nullptr) {
    resolved_input = ResolveItemReferences(*input, store, error);
    if (!resolved_input) return std::nullopt;
    input = &*resolved_input;
  }
  if (input == nullptr && r.conversation.empty()) {
    *error = BadField("input", "input is required (a string or an array of input items)");
    return std::nullopt;
  }
  if (input != nullptr && !InputMapper(&r).Map(*input, error)) return std::nullopt;
  if (input != nullptr) {
    for (Json& item : InputItemsOf(*input)) r.input_items.push_back(std::move(item));
  }
  if (r.conversation.empty()) {
    *error = BadField("input", "input must not be empty");
    return std::nullopt;
  }
  Json messages = Json::array();
  if (!echo["instructions"].is_null()) {
    r.sources.push_back({"messages[0]", "instructions", false});
    messages.push_back(Json{{"role", "system"}, {"content", echo["instructions"]}});
  }
  for (const Json& m : r.conversation) messages.push_back(m);
  chat["messages"] = std::move(messages);

  echo["max_output_tokens"] = nullptr;
  if (const Json* v = Find(body, "max_output_tokens")) {
    chat["max_completion_tokens"] = *v;
    echo["max_output_tokens"] = *v;
  }
  echo["tools"] = Json::array();
  if (const Json* v = Find(body, "tools")) {
    Json tools;
    if (!MapTools(*v, &tools, error)) return std::nullopt;
    if (!tools.empty()) chat["tools"] = std::move(tools);
    echo["tools"] = *v;
  }
  echo["tool_choice"] = "auto";
  if (const Json* v = Find(body, "tool_choice")) {
    if (!MapToolChoice(*v, &chat["tool_choice"], error)) return std::nullopt;
    echo["tool_choice"] = *v;
  }
  echo["parallel_tool_calls"] = true;
  if (const Json* v = Find(body, "parallel_tool_calls")) {
    chat["parallel_tool_calls"] = *v;
    echo["parallel_tool_calls"] = *v;
  }
  echo["text"] = Json{{"format", {{"type", "text"}}}};
  if (const Json* v = Find(body, "text")) {
    Json format;
    if (!MapTextFormat(*v, &format, error)) return std::nullopt;
    if (!format.is_null()) {
      chat["response_format"] = std::move(format);
      echo["text"]["format"] = (*v)["format"];
    }
  }
  echo["reasoning"] = Json{{"effort", nullptr}, {"summary", nullptr}};
  if (const Json* v = Find(body, "reasoning")) {
    if (!MapReasoning(*v, &chat, &echo["reasoning"], error)) return std::nullopt;
  }
  for (const char* key : kPassThrough) {
    if (const Json* v = Find(body, key)) chat[key] = *v;
  }
  if (const Json* v = Find(body, "stream")) chat["stream"] = *v;
  // Logprobs: asked for by include (OpenAI's switch) or by a top_logprobs above 0; the chat
  // path's logprobs / top_logprobs then produce the entries.
  echo["top_logprobs"] = nullptr;
  int64_t top_logprobs = 0;
  if (const Json* v = Find(body, "top_logprobs")) {
    top_logprobs = v->get<int64_t>();
    echo["top_logprobs"] = *v;
  }
  if (const Json* v = Find(body, "include")) {
    r.logprobs = std::find(v->begin(), v->end(), Json(kLogprobsInclude)) != v->end();
  }
  r.logprobs = r.logprobs || top_logprobs > 0;
  if (r.logprobs) {
    chat["logprobs"] = true;
    chat["top_logprobs"] = top_logprobs;
  }
  if (const Json* v = Find(body, "background")) r.background = v->get<bool>();
  if (r.background && !r.store) {
    *error = BadField("background", "background responses must be stored: use store true");
    return std::nullopt;
  }
  echo["temperature"] = chat.contains("temperature") ? chat["temperature"] : Json(1.0);
  echo["top_p"] = chat.contains("top_p") ? chat["top_p"] : Json(1.0);
  echo["store"] = r.store;
  echo["truncation"] = "disabled";
  echo["metadata"] = Json::object();
  if (const Json* v = Find(body, "metadata")) echo["metadata"] = *v;
  for (const char* key : {"user", "safety_identifier"}) {
    if (const Json* v = Find(body, key)) echo[key] = *v;
  }

  std::optional<SamplingFields> fields = ParseChatParams(chat, error);
  if (!fields) {
    *error = ToResponsesError(*error, r);
    return std::nullopt;
  }
  r.fields = std::move(*fields);
  return r;
}

ApiError ToResponsesError(ApiError error, const ResponsesRequest& request) {
  const std::string old_param = error.param;
  std::string p = old_param;
  // The longest chat path some input item (or the instructions) became.
  const ParamSource* best = nullptr;
  for (const ParamSource& s : request.sources) {
    if (HasPrefixPath(p, s.chat) && (best == nullptr || s.chat.size() > best->chat.size())) {
      best = &s;
    }
  }
  if (best != nullptr) {
    std::string suffix = p.substr(best->chat.size());
    const bool call = best->chat.find(".tool_calls[") != std::string::npos;
    if (call) {
      if (suffix.rfind(".function", 0) == 0) suffix.erase(0, std::strlen(".function"));
      if (suffix == ".id") suffix = ".call_id";
    } else if (best->tool_output) {
      if (suffix.rfind(".content", 0) == 0) suffix.replace(0, std::strlen(".content"), ".output");
      if (suffix == ".tool_call_id") suffix = ".call_id";
    }
    // A whole field (instructions, a string input, the stored conversation) has no sub-paths.
    p = best->responses.find('[') == std::string::npos ? best->responses : best->responses + suffix;
  } else {
    static const std::pair<const char*, const char*> kRenames[] = {
        {"max_completion_tokens", "max_output_tokens"},
        {"max_tokens", "max_output_tokens"},
        {"response_format.json_schema", "text.format"},
        {"response_format", "text.format"},
        {"reasoning_effort", "reasoning.effort"},
        {"tool_choice.function", "tool_choice"},
        {"messages", "input"}};
    for (const auto& [from, to] : kRenames) {
      if (HasPrefixPath(p, from)) {
        p = to + p.substr(std::strlen(from));
        break;
      }
    }
    // tools[i].function.x -> tools[i].x
    if (p.rfind("tools[", 0) == 0) {
      const size_t at = p.find("].function");
      if (at != std::string::npos) p.erase(at + 1, std::strlen(".function"));
    }
  }
  if (!old_param.empty() && p != old_param) ReplaceFirst(&error.message, old_param, p);
  error.param = p;
  return error;
}

Json NewResponseObject(const ResponsesRequest& request, const std::string& model,
                       int64_t created_at) {
  const Json& e = request.echo;
  Json r;
  r["id"] = NewId("resp_");
  r["object"] = "response";
  r["created_at"] = created_at;
  r["status"] = "in_progress";
  r["background"] = request.background;
  r["error"] = nullptr;
  r["incomplete_details"] = nullptr;
  r["instructions"] = e["instructions"];
  r["max_output_tokens"] = e["max_output_tokens"];
  r["model"] = model;
  r["output"] = Json::array();
  r["parallel_tool_calls"] = e["parallel_tool_calls"];
  r["previous_response_id"] = e["previous_response_id"];
  r["reasoning"] = e["reasoning"];
  r["store"] = e["store"];
  r["temperature"] = e["temperature"];
  r["text"] = e["text"];
  r["tool_choice"] = e["tool_choice"];
  r["tools"] = e["tools"];
  r["top_logprobs"] = e["top_logprobs"];
  r["top_p"] = e["top_p"];
  r["truncation"] = e["truncation"];
  r["usage"] = nullptr;
  r["metadata"] = e["metadata"];
  for (const char* key : {"user", "safety_identifier"}) {
    if (e.contains(key)) r[key] = e[key];
  }
  return r;
}

// ---- the response ---------------------------------------------------------------------------

namespace {

// A logprob entry as the stream events carry it (the SDK's ResponseTextDeltaEvent.Logprob:
// token, logprob, top_logprobs of token + logprob; the output_text part keeps the bytes).
Json EventLogprobs(const Json& entries) {
  Json out = Json::array();
  for (const Json& e : entries) {
    Json top = Json::array();
    for (const Json& t : e["top_logprobs"]) {
      top.push_back(Json{{"token", t["token"]}, {"logprob", t["logprob"]}});
    }
    out.push_back(Json{{"token", e["token"]}, {"logprob", e["logprob"]}, {"top_logprobs", top}});
  }
  return out;
}

}  // namespace

ResponseBuilder::ResponseBuilder(Json response, Sink sink, bool logprobs)
    : response_(std::move(response)), sink_(std::move(sink)), logprobs_(logprobs) {}

bool ResponseBuilder::FlushDelta() {
  if (!held_delta_) return true;
  Json event = std::move(*held_delta_);
  held_delta_.reset();
  event["logprobs"] = EventLogprobs(pending_logprobs_);
  pending_logprobs_ = Json::array();
  return Send(std::move(event));
}

bool ResponseBuilder::Send(Json event) {
  if (!sink_.send) return true;
  event["sequence_number"] = sequence_++;
  return sink_.send(event);
}

bool ResponseBuilder::Start() {
  std::lock_guard<std::mutex> lock(mu_);
  if (!Send(Json{{"type", "response.created"}, {"response", response_}})) return false;
  if (response_["status"] == "queued" &&
      !Send(Json{{"type", "response.queued"}, {"response", response_}})) {
    return false;
  }
  response_["status"] = "in_progress";
  return Send(Json{{"type", "response.in_progress"}, {"response", response_}});
}

Json ResponseBuilder::Snapshot() const {
  std::lock_guard<std::mutex> lock(mu_);
  return response_;
}

bool ResponseBuilder::OpenItem(Open kind) {
  Json item;
  Json part;
  if (kind == Open::kReasoning) {
    item = Json{{"id", NewId("rs_")},
                {"type", "reasoning"},
                {"summary", Json::array()},
                {"content", Json::array()},
                {"status", "in_progress"}};
    part = Json{{"type", "reasoning_text"}, {"text", ""}};
  } else {
    item = Json{{"id", NewId("msg_")},
                {"type", "message"},
                {"status", "in_progress"},
                {"content", Json::array()},
                {"role", "assistant"}};
    part = Json{{"type", "output_text"},
                {"annotations", Json::array()},
                {"logprobs", Json::array()},
                {"text", ""}};
  }
  Json& output = response_["output"];
  open_ = kind;
  open_index_ = static_cast<int>(output.size());
  output.push_back(item);
  output.back()["content"].push_back(part);
  if (kind == Open::kMessage && !orphan_logprobs_.empty()) {
    // Entries of tokens whose text a stop sequence held back before this item opened.
    output.back()["content"][0]["logprobs"] = std::move(orphan_logprobs_);
    orphan_logprobs_ = Json::array();
  }
  const std::string id = item["id"].get<std::string>();
  return Send(Json{{"type", "response.output_item.added"},
                   {"output_index", open_index_},
                   {"item", std::move(item)}}) &&
         Send(Json{{"type", "response.content_part.added"},
                   {"item_id", id},
                   {"output_index", open_index_},
                   {"content_index", 0},
                   {"part", std::move(part)}});
}

bool ResponseBuilder::CloseItem(const char* status) {
  if (open_ == Open::kNone) return true;
  if (open_ == Open::kFunctionCall) {
    // A streamed call that never completed (a complete one closes with "tool_call_done"): the
    // generation stopped inside it. Its arguments are the pieces that came.
    Json& item = response_["output"][open_index_];
    item["status"] = "incomplete";
    const int index = open_index_;
    open_ = Open::kNone;
    open_index_ = -1;
    return Send(
        Json{{"type", "response.output_item.done"}, {"output_index", index}, {"item", item}});
  }
  if (!FlushDelta()) return false;
  if (open_ == Open::kMessage && !pending_logprobs_.empty()) {
    // Entries that arrived after the item's last text (held back, then cut by a stop sequence):
    // an empty delta carries them so the events hold every entry the part has.
    held_delta_ = Json{{"type", "response.output_text.delta"},
                       {"item_id", response_["output"][open_index_]["id"]},
                       {"output_index", open_index_},
                       {"content_index", 0},
                       {"delta", ""}};
    if (!FlushDelta()) return false;
  }
  Json& item = response_["output"][open_index_];
  const Json& part = item["content"][0];
  const std::string id = item["id"].get<std::string>();
  Json done{{"type", open_ == Open::kReasoning ? "response.reasoning_text.done"
                                               : "response.output_text.done"},
            {"item_id", id},
            {"output_index", open_index_},
            {"content_index", 0},
            {"text", part["text"]}};
  if (open_ == Open::kMessage) done["logprobs"] = EventLogprobs(part["logprobs"]);
  item["status"] = status;
  const int index = open_index_;
  open_ = Open::kNone;
  open_index_ = -1;
  return Send(std::move(done)) &&
         Send(Json{{"type", "response.content_part.done"},
                   {"item_id", id},
                   {"output_index", index},
                   {"content_index", 0},
                   {"part", part}}) &&
         Send(Json{{"type", "response.output_item.done"}, {"output_index", index}, {"item", item}});
}

bool ResponseBuilder::Delta(const char* kind, const Json& payload) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!std::strcmp(kind, "logprob")) {
    if (!logprobs_) return true;
    pending_logprobs_.push_back(payload);
    if (open_ == Open::kMessage) {
      response_["output"][open_index_]["content"][0]["logprobs"].push_back(payload);
    } else {
      orphan_logprobs_.push_back(payload);
    }
    return true;
  }
  // Whatever comes next follows the held delta's token: its entry, if any, has arrived.
  if (!FlushDelta()) return false;
  const bool reasoning = !std::strcmp(kind, "reasoning");
  if (reasoning || !std::strcmp(kind, "content")) {
    const Open want = reasoning ? Open::kReasoning : Open::kMessage;
    if (open_ != want && !(CloseItem("completed") && OpenItem(want))) return false;
    const std::string& delta = payload.get_ref<const std::string&>();
    Json& part = response_["output"][open_index_]["content"][0];
    part["text"] = part["text"].get<std::string>() + delta;
    Json event{{"type", reasoning ? "response.reasoning_text.delta" : "response.output_text.delta"},
               {"item_id", response_["output"][open_index_]["id"]},
               {"output_index", open_index_},
               {"content_index", 0},
               {"delta", delta}};
    if (reasoning) return Send(std::move(event));
    event["logprobs"] = Json::array();
    if (!logprobs_) return Send(std::move(event));
    held_delta_ = std::move(event);  // sent with its tokens' entries (FlushDelta)
    return true;
  }
  if (!std::strcmp(kind, "tool_call_delta")) {
    const Json& fn = payload["function"];
    const std::string piece = fn["arguments"].get<std::string>();
    if (payload.contains("id")) {  // the call's first piece: its item opens
      if (!CloseItem("completed")) return false;
      Json item{{"id", NewId("fc_")}, {"type", "function_call"},  {"status", "in_progress"},
                {"arguments", ""},    {"call_id", payload["id"]}, {"name", fn["name"]}};
      Json& output = response_["output"];
      open_ = Open::kFunctionCall;
      open_index_ = static_cast<int>(output.size());
      output.push_back(item);
      if (!Send(Json{{"type", "response.output_item.added"},
                     {"output_index", open_index_},
                     {"item", std::move(item)}})) {
        return false;
      }
    }
    if (open_ != Open::kFunctionCall || piece.empty()) return true;
    Json& item = response_["output"][open_index_];
    item["arguments"] = item["arguments"].get<std::string>() + piece;
    return Send(Json{{"type", "response.function_call_arguments.delta"},
                     {"item_id", item["id"]},
                     {"output_index", open_index_},
                     {"delta", piece}});
  }
  if (!std::strcmp(kind, "tool_call_done") && open_ == Open::kFunctionCall) {
    // The whole call: the item's arguments become the call's (the pieces joined, by the ABI).
    const Json& fn = payload["function"];
    Json& item = response_["output"][open_index_];
    item["arguments"] = fn["arguments"];
    item["status"] = "completed";
    const int index = open_index_;
    open_ = Open::kNone;
    open_index_ = -1;
    return Send(Json{{"type", "response.function_call_arguments.done"},
                     {"item_id", item["id"]},
                     {"output_index", index},
                     {"name", fn["name"]},
                     {"arguments", fn["arguments"]}}) &&
           Send(Json{
               {"type", "response.output_item.done"}, {"output_index", index}, {"item", item}});
  }
  if (!std::strcmp(kind, "tool_call") || !std::strcmp(kind, "tool_call_done")) {
    if (!CloseItem("completed")) return false;
    const Json& fn = payload["function"];
    const std::string arguments = fn["arguments"].get<std::string>();
    Json item{{"id", NewId("fc_")}, {"type", "function_call"},  {"status", "in_progress"},
              {"arguments", ""},    {"call_id", payload["id"]}, {"name", fn["name"]}};
    Json& output = response_["output"];
    const int index = static_cast<int>(output.size());
    const std::string id = item["id"].get<std::string>();
    if (!Send(Json{
            {"type", "response.output_item.added"}, {"output_index", index}, {"item", item}})) {
      return false;
    }
    item["arguments"] = arguments;
    item["status"] = "completed";
    output.push_back(item);
    return Send(Json{{"type", "response.function_call_arguments.delta"},
                     {"item_id", id},
                     {"output_index", index},
                     {"delta", arguments}}) &&
           Send(Json{{"type", "response.function_call_arguments.done"},
                     {"item_id", id},
                     {"output_index", index},
                     {"name", fn["name"]},
                     {"arguments", arguments}}) &&
           Send(Json{{"type", "response.output_item.done"},
                     {"output_index", index},
                     {"item", std::move(item)}});
  }
  if (!std::strcmp(kind, "tick")) return !sink_.alive || sink_.alive();
  return true;  // progress: not requested by this endpoint
}

bool ResponseBuilder::Finish(const ResponseOutcome& outcome) {
  std::lock_guard<std::mutex> lock(mu_);
  const bool incomplete = outcome.finish_reason == "length";
  const bool open = CloseItem(incomplete ? "incomplete" : "completed");
  Json& output = response_["output"];
  int64_t reasoning_tokens = outcome.reasoning_tokens;
  if (!sink_.send && output.size() >= 2 && output[0]["type"] == "reasoning" &&
      output[1]["type"] == "message" &&
      output[0]["content"][0]["text"] == output[1]["content"][0]["text"]) {
    // The think-skip fallback re-sends the answer as content: it is not reasoning then (as the
    // chat endpoint treats it).
    output.erase(output.begin());
    reasoning_tokens = 0;
  }
  response_["status"] = incomplete ? "incomplete" : "completed";
  response_["incomplete_details"] =
      incomplete ? Json{{"reason", "max_output_tokens"}} : Json(nullptr);
  Json usage;
  usage["input_tokens"] = outcome.input_tokens;
  usage["input_tokens_details"] = Json{{"cached_tokens", outcome.cached_tokens}};
  usage["output_tokens"] = outcome.output_tokens;
  usage["output_tokens_details"] = Json{{"reasoning_tokens", reasoning_tokens}};
  usage["total_tokens"] = outcome.input_tokens + outcome.output_tokens;
  response_["usage"] = std::move(usage);
  return open && Send(Json{{"type", incomplete ? "response.incomplete" : "response.completed"},
                           {"response", response_}});
}

bool ResponseBuilder::Fail(const ApiError& error) {
  std::lock_guard<std::mutex> lock(mu_);
  const bool open = CloseItem("incomplete");
  response_["status"] = "failed";
  const char* code = error.http_status == 429   ? "rate_limit_exceeded"
                     : error.http_status == 400 ? "invalid_prompt"
                                                : "server_error";
  response_["error"] = Json{{"code", code}, {"message", error.message}};
  return open && Send(Json{{"type", "response.failed"}, {"response", response_}});
}

void ResponseBuilder::Cancel() {
  std::lock_guard<std::mutex> lock(mu_);
  held_delta_.reset();
  pending_logprobs_ = Json::array();
  const Sink sink = std::exchange(sink_, Sink{});  // no events: the API has none for this
  CloseItem("incomplete");
  sink_ = sink;
  response_["status"] = "cancelled";
}

Json ResponseBuilder::ChatMessage() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::string reasoning, content;
  bool has_message = false;
  Json calls = Json::array();
  for (const Json& item : response_["output"]) {
    if (item["type"] == "reasoning") {
      reasoning += item["content"][0]["text"].get<std::string>();
    } else if (item["type"] == "message") {
      has_message = true;
      content += item["content"][0]["text"].get<std::string>();
    } else if (item["type"] == "function_call" && item["status"] != "incomplete") {
      // (an incomplete call is a streamed one cut short: its arguments are not whole)
      calls.push_back(
          Json{{"id", item["call_id"]},
               {"type", "function"},
               {"function", {{"name", item["name"]}, {"arguments", item["arguments"]}}}});
    }
  }
  Json m{{"role", "assistant"}};
  m["content"] = has_message || calls.empty() ? Json(content) : Json(nullptr);
  if (!reasoning.empty()) m["reasoning_content"] = reasoning;
  if (!calls.empty()) m["tool_calls"] = std::move(calls);
  return m;
}

// ---- input items -----------------------------------------------------------------------------

Json InputItemsOf(const Json& input) {
  Json items = Json::array();
  if (input.is_string()) {
    items.push_back(Json{{"id", NewId("msg_")},
                         {"type", "message"},
                         {"role", "user"},
                         {"content", Json::array({Json{{"type", "input_text"}, {"text", input}}})},
                         {"status", "completed"}});
    return items;
  }
  for (const Json& given : input) {  // validated by ParseResponsesRequest
    Json item = Json::object();
    for (auto it = given.begin(); it != given.end(); ++it) {
      if (!it->is_null()) item[it.key()] = *it;
    }
    if (!item.contains("type")) item["type"] = "message";
    const std::string type = item["type"].get<std::string>();
    if (type == "message" && item["content"].is_string()) {
      const bool assistant = item["role"] == "assistant";
      Json part{{"type", assistant ? "output_text" : "input_text"}, {"text", item["content"]}};
      if (assistant) part["annotations"] = Json::array();
      item["content"] = Json::array({std::move(part)});
    }
    if (!item.contains("id") || !item["id"].is_string()) {
      const char* prefix = type == "function_call"          ? "fc_"
                           : type == "function_call_output" ? "fco_"
                           : type == "reasoning"            ? "rs_"
                                                            : "msg_";
      item["id"] = NewId(prefix);
    }
    if (!item.contains("status")) item["status"] = "completed";
    items.push_back(std::move(item));
  }
  return items;
}

std::optional<Json> ListInputItems(const Json& items, const std::string& limit,
                                   const std::string& order, const std::string& after,
                                   ApiError* error) {
  size_t count = 20;
  if (!limit.empty()) {
    size_t used = 0;
    int value = 0;
    bool ok = limit.size() <= 3 && limit.find_first_not_of("0123456789") == std::string::npos;
    if (ok) value = std::stoi(limit, &used);
    if (!ok || value < 1 || value > 100) {
      *error = BadField("limit", "limit must be an integer between 1 and 100, got '" + limit + "'");
      return std::nullopt;
    }
    count = static_cast<size_t>(value);
  }
  if (!order.empty() && order != "asc" && order != "desc") {
    *error = BadField("order", "order must be asc or desc, got '" + order + "'");
    return std::nullopt;
  }
  std::vector<const Json*> ordered;
  for (const Json& item : items) ordered.push_back(&item);
  if (order != "asc") std::reverse(ordered.begin(), ordered.end());  // desc is the default
  size_t start = 0;
  if (!after.empty()) {
    auto at = std::find_if(ordered.begin(), ordered.end(),
                           [&](const Json* item) { return (*item)["id"] == after; });
    if (at == ordered.end()) {
      *error = BadField("after", "after '" + after + "' is not an input item of this response");
      return std::nullopt;
    }
    start = static_cast<size_t>(at - ordered.begin()) + 1;
  }
  Json data = Json::array();
  for (size_t i = start; i < ordered.size() && data.size() < count; ++i)
    data.push_back(*ordered[i]);
  Json page;
  page["object"] = "list";
  const Json first = data.empty() ? Json(nullptr) : data.front()["id"];
  const Json last = data.empty() ? Json(nullptr) : data.back()["id"];
  const bool more = start + data.size() < ordered.size();
  page["data"] = std::move(data);
  page["first_id"] = first;
  page["last_id"] = last;
  page["has_more"] = more;
  return page;
}

std::optional<int64_t> ParseStartingAfter(const std::string& text) {
  if (text.empty() || text.size() > 18 ||
      text.find_first_not_of("0123456789") != std::string::npos) {
    return std::nullopt;
  }
  return std::stoll(text);
}

std::string SseEventFrame(const Json& event) {
  return "event: " + event["type"].get<std::string>() + "\ndata: " + Dump(event) + "\n\n";
}

}  // namespace coli::cli::serve
