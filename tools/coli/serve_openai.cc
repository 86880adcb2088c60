// The OpenAI-API half of `coli serve` (see serve_openai.h).
#include "tools/coli/serve_openai.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>

#include "common/tokenizer/utf8.h"

namespace coli::cli::serve {
namespace {

bool IsPathChar(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
         c == '.' || c == '[' || c == ']';
}

// The request field a host/renderer message names: the first "path: " piece whose root is a
// request field ("render_chat: messages[2].role: unknown role" -> "messages[2].role").
std::string ParamFromMessage(std::string_view msg) {
  static constexpr std::string_view kRoots[] = {"messages",
                                                "tools",
                                                "tool_choice",
                                                "response_format",
                                                "reasoning_effort",
                                                "enable_thinking",
                                                "chat_template_kwargs",
                                                "continue_final_message",
                                                "prompt",
                                                "max_tokens",
                                                "stop",
                                                "model",
                                                "logit_bias",
                                                "frequency_penalty",
                                                "presence_penalty",
                                                "repetition_penalty",
                                                "min_p",
                                                "top_k",
                                                "min_tokens",
                                                "stop_token_ids",
                                                "truncate_prompt_tokens"};
  size_t start = 0;
  while (start < msg.size()) {
    const size_t colon = msg.find(": ", start);
    if (colon == std::string_view::npos) break;
    std::string_view piece = msg.substr(start, colon - start);
    bool path = !piece.empty();
    for (char c : piece) path = path && IsPathChar(c);
    if (path) {
      for (std::string_view root : kRoots) {
        if (piece.substr(0, root.size()) == root &&
            (piece.size() == root.size() || piece[root.size()] == '.' ||
             piece[root.size()] == '[')) {
          return std::string(piece);
        }
      }
    }
    start = colon + 2;
  }
  return "";
}

const Json* Find(const Json& body, const char* key) {
  auto it = body.find(key);
  if (it == body.end() || it->is_null()) return nullptr;
  return &*it;
}

// A JSON integer, or a whole number written as a float (`5.0`, `1e3`: pydantic's lax mode, so
// vLLM, takes them) within int64. False otherwise; `why` then says whether it was out of range
// (2^64 parses as a float) or not a whole number.
bool IntegerValue(const char* key, const Json& v, int64_t* out, std::string* why) {
  if (v.is_number_integer()) {
    if (v.is_number_unsigned() && v.get<uint64_t>() > uint64_t{INT64_MAX}) {
      *why = std::string(key) + " " + v.dump() + " is outside the 64-bit integer range";
      return false;
    }
    *out = v.get<int64_t>();
    return true;
  }
  if (v.is_number_float() && std::isfinite(v.get<double>()) &&
      std::trunc(v.get<double>()) == v.get<double>()) {
    const double d = v.get<double>();
    if (d >= -9223372036854775808.0 && d < 9223372036854775808.0) {
      *out = static_cast<int64_t>(d);
      return true;
    }
    *why = std::string(key) + " " + v.dump() + " is outside the 64-bit integer range";
    return false;
  }
  *why = std::string(key) + " must be an integer";
  return false;
}

// Reads an optional integer field within [lo, hi].
bool OptInt(const Json& body, const char* key, int64_t lo, int64_t hi, int64_t* out,
            ApiError* error) {
  const Json* v = Find(body, key);
  if (v == nullptr) return true;
  int64_t x = 0;
  if (std::string why; !IntegerValue(key, *v, &x, &why)) {
    *error = BadField(key, why);
    return false;
  }
  if (x < lo || x > hi) {
    *error = BadField(key, std::string(key) + " must be between " + std::to_string(lo) + " and " +
                               std::to_string(hi) + ", got " + std::to_string(x));
    return false;
  }
  *out = x;
  return true;
}

bool OptNumber(const Json& body, const char* key, double lo, double hi, double* out,
               ApiError* error) {
  const Json* v = Find(body, key);
  if (v == nullptr) return true;
  if (!v->is_number()) {
    *error = BadField(key, std::string(key) + " must be a number");
    return false;
  }
  const double x = v->get<double>();
  if (!(x >= lo && x <= hi)) {
    // The value as sent (%g rounded 2.0000001 to "2": "between 0 and 2, got 2").
    char buf[160];
    std::snprintf(buf, sizeof(buf), "%s must be between %g and %g, got %s", key, lo, hi,
                  v->dump().c_str());
    *error = BadField(key, buf);
    return false;
  }
  *out = x;
  return true;
}

bool OptBool(const Json& body, const char* key, bool* out, ApiError* error) {
  const Json* v = Find(body, key);
  if (v == nullptr) return true;
  if (!v->is_boolean()) {
    *error = BadField(key, std::string(key) + " must be a boolean");
    return false;
  }
  *out = v->get<bool>();
  return true;
}

// Fields this engine cannot honour: present with a non-neutral value -> 400 naming them.
bool RefuseUnsupported(const Json& body, ApiError* error) {
  // ["text"] is OpenAI's default (clients such as LangChain's ChatOpenAI send it when set).
  if (const Json* v = Find(body, "modalities"); v != nullptr && *v != Json::array({"text"})) {
    *error = BadField("modalities", "modalities is not supported by this engine (text only)");
    return false;
  }
  for (const char* key :
       {"audio", "prediction", "web_search_options", "functions", "function_call", "suffix"}) {
    if (Find(body, key) != nullptr) {
      *error = BadField(key, std::string(key) + " is not supported by this engine");
      return false;
    }
  }
  if (const Json* v = Find(body, "best_of");
      v != nullptr && !(v->is_number_integer() && v->get<int64_t>() == 1)) {
    *error = BadField("best_of", "best_of is not supported (use 1)");
    return false;
  }
  return true;
}

// The OpenAI / vLLM knobs: frequency_penalty, presence_penalty, repetition_penalty, min_p and
// logit_bias (keys are token ids as strings; the host checks them against the vocabulary).
bool ParseKnobs(const Json& body, SamplingFields* f, ApiError* error) {
  double frequency = 0, presence = 0, repetition = 1, min_p = 0;
  if (!OptNumber(body, "frequency_penalty", -2.0, 2.0, &frequency, error)) return false;
  if (!OptNumber(body, "presence_penalty", -2.0, 2.0, &presence, error)) return false;
  if (!OptNumber(body, "min_p", 0.0, 1.0, &min_p, error)) return false;
  if (const Json* v = Find(body, "repetition_penalty")) {
    if (!v->is_number() || !(v->get<double>() > 0.0) || !std::isfinite(v->get<double>())) {
      *error = BadField("repetition_penalty",
                        "repetition_penalty must be a number greater than 0 (1 = off)");
      return false;
    }
    repetition = v->get<double>();
  }
  f->frequency_penalty = static_cast<float>(frequency);
  f->presence_penalty = static_cast<float>(presence);
  f->repetition_penalty = static_cast<float>(repetition);
  f->min_p = static_cast<float>(min_p);
  const Json* bias = Find(body, "logit_bias");
  if (bias == nullptr) return true;
  if (!bias->is_object()) {
    *error = BadField("logit_bias", "logit_bias must be an object {\"token id\": bias}");
    return false;
  }
  if (bias->size() > static_cast<size_t>(kMaxLogitBias)) {
    *error = BadField("logit_bias", "logit_bias takes at most " + std::to_string(kMaxLogitBias) +
                                        " entries, got " + std::to_string(bias->size()));
    return false;
  }
  for (auto it = bias->begin(); it != bias->end(); ++it) {
    const std::string& key = it.key();
    const std::string param = "logit_bias";
    int64_t id = -1;
    size_t used = 0;
    bool digits = !key.empty() && key.size() <= 10;
    for (char c : key) digits = digits && c >= '0' && c <= '9';
    if (digits) id = std::stoll(key, &used);
    if (!digits || used != key.size() || id > INT32_MAX) {
      *error = BadField(param, "logit_bias key '" + key + "' is not a token id");
      return false;
    }
    const double b = it.value().is_number() ? it.value().get<double>() : NAN;
    if (!(b >= -100.0 && b <= 100.0)) {
      *error = BadField(param, "logit_bias['" + key + "'] must be a number between -100 and 100");
      return false;
    }
    f->logit_bias.emplace_back(static_cast<int32_t>(id), static_cast<float>(b));
  }
  return true;
}

// vLLM's structured outputs: guided_json (a schema, or its JSON text) and structured_outputs
// {json: ...} become a json_schema response_format (*out, "" for none); the forms this engine
// cannot enforce (choice, regex, grammar, structural tags) are refused rather than ignored.
// Only one way of asking at a time. `take_response_format`: also OpenAI's response_format
// (/v1/completions; in chat the model family reads it from the body).
bool ParseGuided(const Json& body, bool take_response_format, std::string* out, ApiError* error) {
  for (const char* key : {"guided_choice", "guided_regex", "guided_grammar",
                          "guided_whitespace_pattern", "structural_tag"}) {
    if (const Json* v = Find(body, key); v != nullptr && !v->is_null()) {
      *error = BadField(key, std::string(key) +
                                 " is not supported: this engine enforces JSON schemas "
                                 "(response_format json_schema, or guided_json)");
      return false;
    }
  }
  std::vector<std::pair<std::string, Json>> asked;  // (field, schema or response_format)
  if (const Json* v = Find(body, "guided_json"); v != nullptr && !v->is_null()) {
    Json schema = v->is_string() ? Json::parse(v->get<std::string>(), nullptr, false) : *v;
    if (!schema.is_object()) {
      *error = BadField("guided_json", "guided_json must be a JSON schema (an object or its text)");
      return false;
    }
    asked.emplace_back("guided_json", std::move(schema));
  }
  if (const Json* so = Find(body, "structured_outputs"); so != nullptr && !so->is_null()) {
    if (!so->is_object()) {
      *error = BadField("structured_outputs", "structured_outputs must be an object");
      return false;
    }
    for (auto it = so->begin(); it != so->end(); ++it) {
      if (it.key() == "json") {
        Json schema = it->is_string() ? Json::parse(it->get<std::string>(), nullptr, false) : *it;
        if (!schema.is_object()) {
          *error =
              BadField("structured_outputs.json",
                       "structured_outputs.json must be a JSON schema (an object or its text)");
          return false;
        }
        asked.emplace_back("structured_outputs", std::move(schema));
      } else if (!it->is_null() && !(it->is_boolean() && !it->get<bool>())) {
        *error = BadField("structured_outputs." + it.key(),
                          "structured_outputs." + it.key() +
                              " is not supported: this engine enforces JSON schemas "
                              "(structured_outputs.json)");
        return false;
      }
    }
  }
  if (const Json* rf = Find(body, "response_format"); rf != nullptr && !rf->is_null()) {
    asked.emplace_back("response_format", *rf);
  }
  if (asked.size() > 1) {
    *error = BadField(asked[1].first,
                      "give one of response_format, guided_json and "
                      "structured_outputs.json, not " +
                          asked[0].first + " and " + asked[1].first);
    return false;
  }
  out->clear();
  if (asked.empty()) return true;
  if (asked[0].first == "response_format") {
    if (take_response_format) *out = asked[0].second.dump();
  } else {
    *out = Json{{"type", "json_schema"},
                {"json_schema", {{"name", "output"}, {"schema", asked[0].second}}}}
               .dump();
  }
  return true;
}

// vLLM's min_tokens, stop_token_ids, ignore_eos and include_stop_str_in_output (ids are
// checked against the vocabulary by the host).
bool ParseVllmStops(const Json& body, SamplingFields* f, ApiError* error) {
  int64_t truncate = 0;
  if (!OptInt(body, "truncate_prompt_tokens", -1, 1 << 30, &truncate, error)) return false;
  f->truncate_prompt_tokens = static_cast<int32_t>(truncate);
  int64_t min_tokens = 0;
  if (!OptInt(body, "min_tokens", 0, 1 << 30, &min_tokens, error)) return false;
  f->min_tokens = static_cast<int32_t>(min_tokens);
  if (f->max_tokens > 0 && f->min_tokens > f->max_tokens) {
    *error = BadField("min_tokens", "min_tokens (" + std::to_string(f->min_tokens) +
                                        ") must not exceed max_tokens (" +
                                        std::to_string(f->max_tokens) + ")");
    return false;
  }
  if (const Json* ids = Find(body, "stop_token_ids"); ids != nullptr && !ids->is_null()) {
    if (!ids->is_array() || ids->size() > static_cast<size_t>(kMaxLogitBias)) {
      *error = BadField("stop_token_ids", "stop_token_ids must be an array of at most " +
                                              std::to_string(kMaxLogitBias) + " token ids");
      return false;
    }
    for (size_t i = 0; i < ids->size(); ++i) {
      const Json& id = (*ids)[i];
      if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() > INT32_MAX) {
        *error = BadField("stop_token_ids", "stop_token_ids[" + std::to_string(i) +
                                                "] must be a token id (an integer of 0 or more)");
        return false;
      }
      f->stop_token_ids.push_back(static_cast<int32_t>(id.get<int64_t>()));
    }
  }
  return OptBool(body, "ignore_eos", &f->ignore_eos, error) &&
         OptBool(body, "include_stop_str_in_output", &f->include_stop_str, error);
}

bool ParseCommon(const Json& body, SamplingFields* f, ApiError* error) {
  if (const Json* m = Find(body, "model")) {
    if (!m->is_string()) {
      *error = BadField("model", "model must be a string");
      return false;
    }
    f->model = m->get<std::string>();
  }
  if (!RefuseUnsupported(body, error)) return false;
  if (!OptBool(body, "stream", &f->stream, error)) return false;
  // vLLM's -1 (the whole vocabulary) is not served: the host reports at most 20 alternatives.
  int64_t prompt_logprobs = -1;
  if (!OptInt(body, "prompt_logprobs", 0, 20, &prompt_logprobs, error)) return false;
  if (prompt_logprobs > 0 && f->stream) {
    *error = BadField("prompt_logprobs", "prompt_logprobs are not available when stream is true");
    return false;
  }
  f->prompt_logprobs = static_cast<int>(prompt_logprobs);
  if (const Json* so = Find(body, "stream_options")) {
    if (!so->is_object()) {
      *error = BadField("stream_options", "stream_options must be an object");
      return false;
    }
    if (!f->stream) {
      *error = BadField("stream_options", "stream_options is only allowed when stream is true");
      return false;
    }
    if (const Json* iu = Find(*so, "include_usage")) {
      if (!iu->is_boolean()) {
        *error = BadField("stream_options.include_usage", "include_usage must be a boolean");
        return false;
      }
      f->include_usage = iu->get<bool>();
    }
    if (const Json* cu = Find(*so, "continuous_usage_stats")) {
      if (!cu->is_boolean()) {
        *error = BadField("stream_options.continuous_usage_stats",
                          "continuous_usage_stats must be a boolean");
        return false;
      }
      f->continuous_usage = cu->get<bool>() && f->include_usage;
    }
  }
  if (!OptBool(body, "return_progress", &f->return_progress, error)) return false;
  int64_t max_tokens = 0;
  if (!OptInt(body, "max_tokens", 1, 1 << 30, &max_tokens, error)) return false;
  if (!OptInt(body, "max_completion_tokens", 1, 1 << 30, &max_tokens, error)) return false;
  f->max_tokens = static_cast<int32_t>(max_tokens);
  double temperature = 1.0, top_p = 1.0;
  if (!OptNumber(body, "temperature", 0.0, 2.0, &temperature, error)) return false;
  if (!OptNumber(body, "top_p", 0.0, 1.0, &top_p, error)) return false;
  if (top_p == 0.0) temperature = 0.0;  // nucleus of one token: greedy
  f->temperature = static_cast<float>(temperature);
  f->top_p = static_cast<float>(top_p);
  int64_t top_k = 0;  // vLLM's top_k (extra_body in the OpenAI SDKs); -1 and 0 switch it off
  if (!OptInt(body, "top_k", -1, 1 << 30, &top_k, error)) return false;
  f->top_k = static_cast<int32_t>(std::max<int64_t>(0, top_k));
  if (const Json* s = Find(body, "seed")) {
    // Any 64-bit pattern: an unsigned value above INT64_MAX is taken as it is.
    int64_t seed = 0;
    if (std::string why; !s->is_number_unsigned() && !IntegerValue("seed", *s, &seed, &why)) {
      *error = BadField("seed", why);
      return false;
    }
    f->seed = s->is_number_unsigned() ? s->get<uint64_t>() : static_cast<uint64_t>(seed);
    f->has_seed = true;
  }
  if (const Json* stop = Find(body, "stop")) {
    std::vector<std::string> stops;
    if (stop->is_string()) {
      stops.push_back(stop->get<std::string>());
    } else if (stop->is_array()) {
      if (stop->size() > 4) {
        *error =
            BadField("stop", "stop takes at most 4 sequences, got " + std::to_string(stop->size()));
        return false;
      }
      for (size_t i = 0; i < stop->size(); ++i) {
        if (!(*stop)[i].is_string()) {
          *error = BadField("stop[" + std::to_string(i) + "]", "a stop sequence must be a string");
          return false;
        }
        stops.push_back((*stop)[i].get<std::string>());
      }
    } else {
      *error = BadField("stop", "stop must be a string or an array of strings");
      return false;
    }
    for (const std::string& s : stops) {
      if (s.empty()) {
        *error = BadField("stop", "a stop sequence must not be empty");
        return false;
      }
    }
    f->stop = std::move(stops);
  }
  int64_t n = 1;
  if (!OptInt(body, "n", 1, 16, &n, error)) return false;
  f->n = static_cast<int>(n);
  if (!ParseVllmStops(body, f, error)) return false;
  return ParseKnobs(body, f, error);
}

}  // namespace

ApiError BadField(std::string param, std::string message) {
  ApiError e;
  e.http_status = 400;
  e.param = std::move(param);
  e.message = std::move(message);
  return e;
}

std::string ErrorBody(const ApiError& error) {
  Json body;
  body["error"]["message"] = error.message;
  body["error"]["type"] = error.type;
  body["error"]["param"] = error.param.empty() ? Json(nullptr) : Json(error.param);
  body["error"]["code"] = error.code.empty() ? Json(nullptr) : Json(error.code);
  return body.dump(-1, ' ', false, Json::error_handler_t::replace);
}

ApiError FromHostStatus(const grpc::Status& status) {
  ApiError e;
  const std::string& msg = status.error_message();
  e.message = msg.empty() ? "host error" : msg;
  switch (status.error_code()) {
    case grpc::StatusCode::INVALID_ARGUMENT:
    case grpc::StatusCode::OUT_OF_RANGE:
    case grpc::StatusCode::FAILED_PRECONDITION:
    case grpc::StatusCode::UNIMPLEMENTED:
      e.http_status = 400;
      e.param = ParamFromMessage(msg);
      if (msg.find("EMPTY_PROMPT") != std::string::npos && e.param.empty()) e.param = "messages";
      // A response_format the model cannot enforce (a schema keyword the grammar refuses, a
      // plugin older than ABI 1.4): OpenAI names the request field; the message keeps the path
      // inside the schema ("response_format.json_schema.schema.properties.a.pattern: ...").
      if (e.param.rfind("response_format", 0) == 0 ||
          (e.param.empty() && msg.find("response_format") != std::string::npos)) {
        e.param = "response_format";
      }
      return e;
    case grpc::StatusCode::RESOURCE_EXHAUSTED:
      if (msg.find("CONTEXT_EXCEEDED") != std::string::npos ||
          msg.find("context") != std::string::npos) {
        e.http_status = 400;
        e.code = "context_length_exceeded";
        e.param = "messages";
        e.message = "This model's maximum context length was exceeded: " + msg;
        return e;
      }
      e.http_status = 429;
      e.type = "rate_limit_error";
      e.code = "queue_full";
      return e;
    case grpc::StatusCode::NOT_FOUND:
      e.http_status = 404;
      e.code = "model_not_found";
      e.param = "model";
      return e;
    case grpc::StatusCode::UNAVAILABLE:
      e.http_status = 503;
      e.type = "server_error";
      return e;
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      e.http_status = 504;
      e.type = "server_error";
      return e;
    case grpc::StatusCode::CANCELLED:
      e.http_status = 499;
      e.type = "cancelled";
      return e;
    default:
      e.http_status = 500;
      e.type = "server_error";
      return e;
  }
}

ApiError CompletionsError(ApiError error) {
  if (error.param == "messages") error.param = "prompt";
  return error;
}

std::optional<SamplingFields> ParseChatParams(const Json& body, ApiError* error) {
  SamplingFields f;
  // vLLM's chat `echo` (the last message repeated in the reply) is not done here: a 400, not an
  // answer that silently lacks it. (/v1/completions takes echo.)
  if (const Json* v = Find(body, "echo"); v != nullptr && !(v->is_boolean() && !v->get<bool>())) {
    *error = BadField("echo", "echo is not supported in chat completions (use /v1/completions)");
    return std::nullopt;
  }
  const Json* messages = Find(body, "messages");
  if (messages == nullptr || !messages->is_array() || messages->empty()) {
    *error = BadField("messages", "messages must be a non-empty array");
    return std::nullopt;
  }
  for (size_t i = 0; i < messages->size(); ++i) {
    const Json& m = (*messages)[i];
    const std::string path = "messages[" + std::to_string(i) + "]";
    if (!m.is_object()) {
      *error = BadField(path, "a message must be an object");
      return std::nullopt;
    }
    const Json* content = Find(m, "content");
    // Only an assistant message (one that calls tools) may come without content; the others
    // rendered a missing or null content as empty text (OpenAI refuses it, as /v1/responses
    // does).
    if (const Json* role = Find(m, "role"); content == nullptr && role != nullptr &&
                                             role->is_string() && *role != "assistant") {
      *error = BadField(path + ".content", "a " + role->get<std::string>() +
                                               " message needs content (a string or an array of "
                                               "text parts), got " +
                                               (m.contains("content") ? "null" : "none"));
      return std::nullopt;
    }
    if (content != nullptr && content->is_array()) {
      for (size_t j = 0; j < content->size(); ++j) {
        const Json& part = (*content)[j];
        const Json* type = part.is_object() ? Find(part, "type") : nullptr;
        if (type != nullptr && type->is_string() && type->get<std::string>() != "text") {
          *error = BadField(path + ".content[" + std::to_string(j) + "]",
                            "content part type '" + type->get<std::string>() +
                                "' is unsupported: this engine reads text only");
          return std::nullopt;
        }
      }
    }
  }
  if (!ParseCommon(body, &f, error)) return std::nullopt;
  if (!ParseGuided(body, /*take_response_format=*/false, &f.response_format, error)) {
    return std::nullopt;
  }
  bool logprobs = false;
  if (!OptBool(body, "logprobs", &logprobs, error)) return std::nullopt;
  int64_t top = -1;
  if (!OptInt(body, "top_logprobs", 0, 20, &top, error)) return std::nullopt;
  if (top >= 0 && !logprobs) {
    *error = BadField("top_logprobs", "top_logprobs requires logprobs to be true");
    return std::nullopt;
  }
  if (logprobs) f.top_logprobs = top < 0 ? 0 : static_cast<int>(top);
  if (const Json* tools = Find(body, "tools")) {
    if (!tools->is_array()) {
      *error = BadField("tools", "tools must be an array");
      return std::nullopt;
    }
    for (size_t i = 0; i < tools->size(); ++i) {
      const Json& t = (*tools)[i];
      const std::string path = "tools[" + std::to_string(i) + "]";
      const Json* type = t.is_object() ? Find(t, "type") : nullptr;
      const Json* fn = t.is_object() ? Find(t, "function") : nullptr;
      if (type == nullptr || *type != "function" || fn == nullptr || !fn->is_object() ||
          Find(*fn, "name") == nullptr || !(*fn)["name"].is_string()) {
        *error = BadField(path,
                          "a tool must be {\"type\": \"function\", \"function\": "
                          "{\"name\": ...}}");
        return std::nullopt;
      }
      // OpenAI refuses these too; rendered as they were, the model saw a broken declaration.
      if (const Json* params = Find(*fn, "parameters"); params != nullptr && !params->is_object()) {
        *error = BadField(path + ".function.parameters",
                          "function parameters must be a JSON Schema object, got " +
                              std::string(params->type_name()));
        return std::nullopt;
      }
      if (const Json* d = Find(*fn, "description"); d != nullptr && !d->is_string()) {
        *error = BadField(path + ".function.description",
                          "function description must be a string, got " +
                              std::string(d->type_name()));
        return std::nullopt;
      }
    }
  }
  if (const Json* tc = Find(body, "tool_choice")) {
    const bool ok_string = tc->is_string() && (*tc == "none" || *tc == "auto" || *tc == "required");
    const bool ok_object = tc->is_object() && Find(*tc, "function") != nullptr;
    if (!ok_string && !ok_object) {
      *error =
          BadField("tool_choice",
                   "tool_choice must be none, auto, required or {\"type\": \"function\", ...}");
      return std::nullopt;
    }
  }
  if (const Json* p = Find(body, "parallel_tool_calls"); p != nullptr && !p->is_boolean()) {
    *error = BadField("parallel_tool_calls", "parallel_tool_calls must be a boolean");
    return std::nullopt;
  }
  return f;
}

namespace {

// Reads one prompt of token ids (`where` names it in errors).
bool ReadIdsPrompt(const Json& ids, int32_t vocab_size, const std::string& where,
                   CompletionPrompt* out, ApiError* error) {
  if (ids.empty()) {
    *error = BadField(where, "a prompt of token ids must not be empty");
    return false;
  }
  out->is_ids = true;
  for (size_t i = 0; i < ids.size(); ++i) {
    const Json& t = ids[i];
    // Integral floats pass as elsewhere (pydantic's lax mode): 3.0 is token 3.
    const bool integral = t.is_number_integer() ||
                          (t.is_number_float() && std::floor(t.get<double>()) == t.get<double>());
    const double v = t.is_number() ? t.get<double>() : -1;
    if (!integral || v < 0 || v >= vocab_size) {
      *error = BadField(where + "[" + std::to_string(i) + "]",
                        "a token id must be an integer in [0, " + std::to_string(vocab_size) + ")");
      return false;
    }
    out->ids.push_back(static_cast<int32_t>(v));
  }
  return true;
}

bool ReadPrompts(const Json* p, int32_t vocab_size, std::vector<CompletionPrompt>* prompts,
                 ApiError* error) {
  const char* kForms =
      "prompt must be a string, an array of strings, an array of token ids or an array of arrays "
      "of token ids";
  if (p == nullptr) {
    *error = BadField("prompt", kForms);
    return false;
  }
  if (p->is_string()) {
    prompts->push_back({p->get<std::string>(), {}, false});
  } else if (p->is_array() && !p->empty() && (*p)[0].is_number()) {
    prompts->emplace_back();
    if (!ReadIdsPrompt(*p, vocab_size, "prompt", &prompts->back(), error)) return false;
  } else if (p->is_array() && !p->empty()) {
    const bool strings = (*p)[0].is_string();
    for (size_t i = 0; i < p->size(); ++i) {
      const Json& one = (*p)[i];
      const std::string where = "prompt[" + std::to_string(i) + "]";
      if (strings && one.is_string()) {
        prompts->push_back({one.get<std::string>(), {}, false});
      } else if (!strings && one.is_array()) {
        prompts->emplace_back();
        if (!ReadIdsPrompt(one, vocab_size, where, &prompts->back(), error)) return false;
      } else {
        *error = BadField(where, std::string(kForms) + " (not a mix)");
        return false;
      }
    }
  } else {
    *error = BadField("prompt", kForms);
    return false;
  }
  for (size_t i = 0; i < prompts->size(); ++i) {
    if (!(*prompts)[i].is_ids &&
        (*prompts)[i].text.empty()) {  // (the host's refusal named messages)
      *error = BadField(
          prompts->size() == 1 && p->is_string() ? "prompt" : "prompt[" + std::to_string(i) + "]",
          "prompt must not be empty");
      return false;
    }
  }
  return true;
}

}  // namespace

std::optional<SamplingFields> ParseCompletionParams(const Json& body, int32_t vocab_size,
                                                    std::vector<CompletionPrompt>* prompts,
                                                    ApiError* error) {
  SamplingFields f;
  if (!ReadPrompts(Find(body, "prompt"), vocab_size, prompts, error)) return std::nullopt;
  if (!OptBool(body, "echo", &f.echo, error)) return std::nullopt;
  // echo with max_tokens 0 reads the prompt and generates nothing (scoring a text by its
  // logprobs); elsewhere max_tokens starts at 1.
  if (const Json* m = Find(body, "max_tokens");
      f.echo && m != nullptr && m->is_number() && m->get<double>() == 0) {
    f.prompt_only = true;
    Json rest = body;
    rest.erase("max_tokens");
    if (!ParseCommon(rest, &f, error)) return std::nullopt;
  } else if (!ParseCommon(body, &f, error)) {
    return std::nullopt;
  }
  if (f.echo && f.truncate_prompt_tokens != 0) {
    *error = BadField("truncate_prompt_tokens",
                      "truncate_prompt_tokens cannot be combined with echo (which prompt would "
                      "be echoed?)");
    return std::nullopt;
  }
  if (!OptBool(body, "skip_special_tokens", &f.skip_special_tokens, error)) return std::nullopt;
  if (!ParseGuided(body, /*take_response_format=*/true, &f.response_format, error)) {
    return std::nullopt;
  }
  int64_t logprobs = -1;
  if (!OptInt(body, "logprobs", 0, 20, &logprobs, error)) return std::nullopt;
  f.top_logprobs = static_cast<int>(logprobs);
  if (Find(body, "max_tokens") == nullptr) f.max_tokens = 16;  // the legacy API's default
  return f;
}

Json VllmPromptLogprobs(const std::vector<v1::TokenLogprobs>& entries, int top,
                        int64_t vocab_size) {
  Json list = Json::array({nullptr});
  for (const v1::TokenLogprobs& e : entries) {
    const v1::TokenLogprob& token = e.sampled();
    // vLLM's rank: how many tokens have a logprob at least the prompt token's, itself included.
    // The plugin counts it over the vocabulary (ABI 1.9: rank > 0). Otherwise the alternatives
    // (the most likely, descending) tell it when one of them is less likely than the prompt
    // token, as every token at least as likely is then among them; it is null when they cannot
    // (the token is not among them, or ties their last).
    Json rank = nullptr;
    if (token.rank() > 0) {
      rank = token.rank();
    } else {
      int64_t at_least = 0;
      bool listed = false;
      for (const v1::TokenLogprob& t : e.top()) {
        at_least += t.logprob() >= token.logprob();
        listed = listed || t.id() == token.id();
      }
      if (at_least < e.top_size() || e.top_size() >= vocab_size) {
        rank = at_least + (listed ? 0 : 1);
      }
    }
    Json position = Json::object();
    auto entry = [](const v1::TokenLogprob& t, Json rank) {
      return Json{{"logprob", t.logprob()},
                  {"rank", std::move(rank)},
                  {"decoded_token", tok::ReplaceInvalidUtf8(t.text())}};
    };
    position[std::to_string(token.id())] = entry(token, std::move(rank));
    for (int k = 0; k < e.top_size() && k < top; ++k) {
      const std::string key = std::to_string(e.top(k).id());
      if (position.contains(key)) {
        position[key]["rank"] = k + 1;
      } else {
        position[key] = entry(e.top(k), k + 1);
      }
    }
    list.push_back(std::move(position));
  }
  return list;
}

std::string StopFilter::Push(std::string_view text) {
  if (stopped_) return "";
  held_.append(text);
  size_t first = std::string::npos;
  for (const std::string& s : stops_) {
    if (const size_t at = held_.find(s); at < first) {
      first = at;
      matched_ = s;
    }
  }
  if (first != std::string::npos) {
    stopped_ = true;
    std::string out = held_.substr(0, include_match_ ? first + matched_.size() : first);
    held_.clear();
    return out;
  }
  // Keep the longest tail that is a proper prefix of some stop sequence.
  size_t keep = 0;
  for (const std::string& s : stops_) {
    for (size_t len = std::min(s.size() - 1, held_.size()); len > keep; --len) {
      if (held_.compare(held_.size() - len, len, s, 0, len) == 0) {
        keep = len;
        break;
      }
    }
  }
  std::string out = held_.substr(0, held_.size() - keep);
  held_.erase(0, held_.size() - keep);
  return out;
}

std::string StopFilter::Flush() {
  if (stopped_) return "";
  std::string out;
  out.swap(held_);
  return out;
}

std::string NewId(std::string_view prefix) {
  static thread_local std::mt19937_64 rng{std::random_device{}()};
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%016llx%08x", static_cast<unsigned long long>(rng()),
                static_cast<unsigned>(rng() & 0xffffffffu));
  return std::string(prefix) + buf;
}

std::string LabelValue(std::string_view value) {
  std::string out;
  for (char c : value) {
    if (c == '\\' || c == '"') {
      out.push_back('\\');
      out.push_back(c);
    } else if (c == '\n') {
      out.append("\\n");
    } else {
      out.push_back(c);
    }
  }
  return out;
}

void AppendMetric(std::string* out, std::string_view name, std::string_view type,
                  std::string_view help, double value, std::string_view labels) {
  if (labels.empty() ||
      out->find(std::string("# TYPE ") + std::string(name) + " ") == std::string::npos) {
    out->append("# HELP ").append(name).append(" ").append(help).append("\n");
    out->append("# TYPE ").append(name).append(" ").append(type).append("\n");
  }
  out->append(name);
  if (!labels.empty()) out->append("{").append(labels).append("}");
  char buf[64];
  if (std::isfinite(value) && value == std::floor(value) && std::fabs(value) < 1e15) {
    std::snprintf(buf, sizeof(buf), " %.0f\n", value);
  } else {
    std::snprintf(buf, sizeof(buf), " %.9g\n", value);
  }
  out->append(buf);
}

}  // namespace coli::cli::serve
