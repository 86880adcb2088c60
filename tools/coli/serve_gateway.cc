// The gateway's plumbing: authorization, request bodies, routes, CORS, httplib's own errors,
// and the small endpoints (/v1/models, /tokenize, /detokenize, /apply-template, /health,
// /metrics, the page at / for `coli web`).
#include "tools/coli/serve_gateway.h"

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status/status.h"
#include "common/tokenizer/utf8.h"
#include "tools/web/web_assets.h"

namespace coli::cli::serve {

namespace {

// Compared in time that does not depend on where the first wrong byte is (a key guessed byte by
// byte over the network otherwise).
bool SameSecret(const std::string& given, const std::string& expected) {
  unsigned char diff = given.size() == expected.size() ? 0 : 1;
  for (size_t i = 0; i < expected.size(); ++i) {
    diff |= static_cast<unsigned char>(expected[i] ^ (i < given.size() ? given[i] : 0));
  }
  return diff == 0;
}

}  // namespace

bool Gateway::Authorized(const Req& req, Res& res) {
  if (api_key_.empty()) return true;
  // OpenAI's clients send the key as a bearer token, Anthropic's in x-api-key.
  const std::string auth = req.get_header_value("Authorization");
  const std::string x_api_key = req.get_header_value("x-api-key");
  if (!auth.empty() ? SameSecret(auth, "Bearer " + api_key_) : SameSecret(x_api_key, api_key_)) {
    return true;
  }
  ApiError e;
  e.http_status = 401;
  e.type = "authentication_error";
  e.code = "invalid_api_key";
  e.message = auth.empty() && x_api_key.empty()
                  ? "missing API key (Authorization: Bearer KEY, or x-api-key: KEY)"
                  : "invalid API key";
  Fail(res, e);
  return false;
}

bool Gateway::Body(const Req& req, Res& res, Json* body) {
  if (req.body.find_first_not_of(" \t\r\n") == std::string::npos) {
    Fail(res, BadField("",
                       "request body is empty: send a JSON object (Content-Type: "
                       "application/json)"));
    return false;
  }
  bool too_deep = false;
  Json parsed;
  try {  // nlohmann reports where and why a parse failed only through its exception
    parsed = Json::parse(req.body.begin(), req.body.end(),
                         [&too_deep](int depth, Json::parse_event_t, Json&) {
                           if (depth > 256) too_deep = true;
                           return !too_deep;
                         });
  } catch (const Json::exception& e) {
    // "[json.exception.parse_error.101] parse error at line 1, column 42: ... ill-formed UTF-8
    // byte; last read: ..." or "[json.exception.out_of_range.406] number overflow parsing
    // '1e400'", without the library's tag.
    std::string why = e.what();
    if (why.rfind("[json.exception.", 0) == 0 && why.find("] ") != std::string::npos) {
      why.erase(0, why.find("] ") + 2);
    }
    Fail(res, BadField("", "request body is not valid JSON: " + why));
    return false;
  }
  if (too_deep) {
    Fail(res, BadField("", "request body nests deeper than 256 levels"));
    return false;
  }
  if (!parsed.is_object()) {
    const std::string got = parsed.is_array()     ? "an array"
                            : parsed.is_string()  ? "a string"
                            : parsed.is_number()  ? "a number"
                            : parsed.is_boolean() ? "a boolean"
                                                  : "null";
    Fail(res, BadField("", "request body must be a JSON object, got " + got));
    return false;
  }
  *body = std::move(parsed);
  return true;
}

bool Gateway::ModelOk(const std::string& model, Res& res) {
  if (model.empty() || model == info_.id() ||
      std::find(aliases_.begin(), aliases_.end(), model) != aliases_.end()) {
    return true;
  }
  ApiError e;
  e.http_status = 404;
  e.code = "model_not_found";
  e.param = "model";
  e.message = "The model '" + model + "' does not exist; this server serves '" + info_.id() + "'";
  Fail(res, e);
  return false;
}

void Gateway::Models(const Req& req, Res& res) {
  if (!Authorized(req, res)) return;
  // The model under `name`: its id, or a --served-model-name (vLLM lists each).
  auto entry = [&](const std::string& name) {
    Json m;
    m["id"] = name;
    m["object"] = "model";
    m["created"] = 0;
    m["owned_by"] = "coli";
    m["max_model_len"] = info_.context_capacity();
    m["family"] = info_.family();
    // Anthropic's model object too (its SDKs' models.list / retrieve read these).
    m["type"] = "model";
    m["display_name"] = name;
    m["created_at"] = "1970-01-01T00:00:00Z";  // `created` 0, as an RFC 3339 time
    return m;
  };
  if (req.matches.size() > 1) {
    const std::string id = req.matches[1];
    if (!ModelOk(id, res)) return;
    Reply(res, 200, entry(id));
    return;
  }
  Json out;
  out["object"] = "list";
  out["data"] = Json::array({entry(info_.id())});
  for (const std::string& alias : aliases_) out["data"].push_back(entry(alias));
  // Anthropic's page fields: one page holds every model.
  out["has_more"] = false;
  out["first_id"] = out["data"].front()["id"];
  out["last_id"] = out["data"].back()["id"];
  Reply(res, 200, out);
}

void Gateway::Tokenize(const Req& req, Res& res) {
  if (!Authorized(req, res)) return;
  Json body;
  if (!Body(req, res, &body)) return;
  if (body.contains("model") && body["model"].is_string() &&
      !ModelOk(body["model"].get<std::string>(), res)) {
    return;
  }
  std::vector<int32_t> ids;
  if (body.contains("messages")) {  // a chat: the rendered prompt's ids
    ApiError error;
    if (!ParseChatParams(body, &error)) return Fail(res, error);
    grpc::ClientContext ctx;
    v1::ApplyTemplateRequest r;
    r.set_model(info_.id());
    host::ApplyRequestDefaults(request_defaults_, &body);
    r.set_request_json(Dump(body));
    r.set_add_generation_prompt(true);
    v1::ApplyTemplateResponse out;
    grpc::Status s = stub_->ApplyTemplate(&ctx, r, &out);
    if (!s.ok()) return Fail(res, FromHostStatus(s));
    ids.assign(out.ids().begin(), out.ids().end());
  } else {
    if (!body.contains("prompt") || !body["prompt"].is_string()) {
      return Fail(res, BadField("prompt", "prompt must be a string (or give messages)"));
    }
    bool allow_special = false;
    if (body.contains("allow_special")) {
      if (!body["allow_special"].is_boolean()) {
        return Fail(res, BadField("allow_special", "allow_special must be a boolean"));
      }
      allow_special = body["allow_special"].get<bool>();
    }
    grpc::ClientContext ctx;
    v1::TokenizeRequest r;
    r.set_model(info_.id());
    r.set_text(body["prompt"].get<std::string>());
    r.set_allow_special(allow_special);
    v1::TokenizeResponse out;
    grpc::Status s = stub_->Tokenize(&ctx, r, &out);
    if (!s.ok()) return Fail(res, FromHostStatus(s));
    ids.assign(out.ids().begin(), out.ids().end());
  }
  Json out;
  out["tokens"] = ids;
  out["count"] = ids.size();
  out["max_model_len"] = info_.context_capacity();
  Reply(res, 200, out);
}

void Gateway::Detokenize(const Req& req, Res& res) {
  if (!Authorized(req, res)) return;
  Json body;
  if (!Body(req, res, &body)) return;
  if (!body.contains("tokens") || !body["tokens"].is_array()) {
    return Fail(res, BadField("tokens", "tokens must be an array of token ids"));
  }
  v1::DetokenizeRequest r;
  r.set_model(info_.id());
  for (size_t i = 0; i < body["tokens"].size(); ++i) {
    const Json& t = body["tokens"][i];
    if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() >= info_.vocab_size()) {
      return Fail(res, BadField("tokens[" + std::to_string(i) + "]",
                                "a token id must be an integer in [0, " +
                                    std::to_string(info_.vocab_size()) + ")"));
    }
    r.add_ids(static_cast<int32_t>(t.get<int64_t>()));
  }
  grpc::ClientContext ctx;
  v1::DetokenizeResponse out;
  grpc::Status s = stub_->Detokenize(&ctx, r, &out);
  if (!s.ok()) return Fail(res, FromHostStatus(s));
  Reply(res, 200, Json{{"prompt", out.text()}});
}

std::string Gateway::CutCharacter(const client::ReplyTail& tail) {
  if (tail.empty()) return "";
  v1::DetokenizeRequest r;
  r.set_model(info_.id());
  for (int32_t id : tail.ids()) r.add_ids(id);
  grpc::ClientContext ctx;
  v1::DetokenizeResponse out;
  if (!stub_->Detokenize(&ctx, r, &out).ok()) return "";  // the reply stays as it was
  return client::ReplyTail::Marker(out.text());           // the tokens' own bytes, unreplaced
}

void Gateway::ApplyTemplate(const Req& req, Res& res) {
  if (!Authorized(req, res)) return;
  Json body;
  if (!Body(req, res, &body)) return;
  ApiError error;
  std::optional<SamplingFields> f = ParseChatParams(body, &error);
  if (!f) return Fail(res, error);
  if (!ModelOk(f->model, res)) return;
  grpc::ClientContext ctx;
  v1::ApplyTemplateRequest r;
  r.set_model(info_.id());
  host::ApplyRequestDefaults(request_defaults_, &body);
  r.set_request_json(Dump(body));
  r.set_add_generation_prompt(true);
  v1::ApplyTemplateResponse out;
  grpc::Status s = stub_->ApplyTemplate(&ctx, r, &out);
  if (!s.ok()) return Fail(res, FromHostStatus(s));
  Json reply;
  reply["prompt"] = out.text();
  reply["tokens"] = Json(std::vector<int32_t>(out.ids().begin(), out.ids().end()));
  Reply(res, 200, reply);
}

void Gateway::Health(const Req&, Res& res) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  v1::HealthRequest r;
  v1::HealthResponse out;
  grpc::Status s = stub_->Health(&ctx, r, &out);
  if (!s.ok() || !out.serving()) {
    Reply(res, 503, Json{{"status", "unavailable"}, {"error", s.error_message()}});
    return;
  }
  for (const v1::ModelProblem& problem : out.model_problems()) {
    if (problem.model() != info_.id()) continue;
    // Up but unable to answer (vLLM's /health fails once its engine is dead): a load balancer
    // should stop sending here, and a supervisor restart loads the model's current files.
    Reply(res, 503, Json{{"status", "unavailable"},
                         {"model", info_.id()},
                         {"error", absl::StrCat("requests fail: ", problem.error())}});
    return;
  }
  Json h;
  h["status"] = "ok";
  h["model"] = info_.id();
  h["host_version"] = out.version();
  h["abi_version"] = out.abi_version();
  h["uptime_seconds"] = out.uptime_seconds();
  Reply(res, 200, h);
}

void Gateway::Metrics(const Req& req, Res& res) {
  if (!Authorized(req, res)) return;
  grpc::ClientContext ctx;
  v1::MetricsRequest r;
  v1::MetricsResponse m;
  grpc::Status s = stub_->GetMetrics(&ctx, r, &m);
  if (!s.ok()) return Fail(res, FromHostStatus(s));
  struct Row {
    const char* name;
    const char* type;
    const char* help;
    double value;
  };
  const Row rows[] = {
      {"coli_requests_total", "counter", "generation requests accepted by the host",
       static_cast<double>(m.requests_total())},
      {"coli_requests_ok_total", "counter", "requests that finished normally",
       static_cast<double>(m.requests_ok())},
      {"coli_requests_failed_total", "counter", "requests that ended in an error",
       static_cast<double>(m.requests_failed())},
      {"coli_requests_cancelled_total", "counter", "requests cancelled (client gone or Cancel)",
       static_cast<double>(m.requests_cancelled())},
      {"coli_requests_rejected_total", "counter", "requests refused: queue full",
       static_cast<double>(m.requests_rejected())},
      {"coli_requests_active", "gauge", "requests generating now",
       static_cast<double>(m.requests_active())},
      {"coli_queue_depth", "gauge", "requests waiting", static_cast<double>(m.queue_depth())},
      {"coli_queue_capacity", "gauge", "queue capacity", static_cast<double>(m.queue_capacity())},
      {"coli_prompt_tokens_total", "counter", "prompt tokens",
       static_cast<double>(m.prompt_tokens())},
      {"coli_completion_tokens_total", "counter", "generated tokens",
       static_cast<double>(m.completion_tokens())},
      {"coli_tokens_reused_total", "counter", "prompt tokens served from kept state",
       static_cast<double>(m.tokens_reused())},
      {"coli_time_to_first_token_seconds_last", "gauge", "last request's TTFT",
       m.ttft_seconds_last()},
      {"coli_time_to_first_token_seconds_mean", "gauge", "mean TTFT", m.ttft_seconds_mean()},
      {"coli_tokens_per_second_last", "gauge", "last request's decode rate",
       m.tokens_per_second_last()},
      {"coli_tokens_per_second_mean", "gauge", "mean decode rate", m.tokens_per_second_mean()},
      {"coli_expert_hits_total", "counter", "routed-expert cache hits", m.expert_hits()},
      {"coli_expert_misses_total", "counter", "routed-expert cache misses", m.expert_misses()},
      {"coli_expert_hit_rate", "gauge", "routed-expert cache hit rate", m.expert_hit_rate()},
      {"coli_bytes_read_total", "counter", "weight bytes read from disk", m.bytes_read()},
      {"coli_uptime_seconds", "gauge", "host uptime", m.uptime_seconds()},
      {"coli_decode_calls_total", "counter", "decode calls the host made to the model plugins",
       static_cast<double>(m.decode_calls())},
      {"coli_decode_rows_total", "counter",
       "sessions' decode steps those calls carried (rows / calls = mean continuous batch)",
       static_cast<double>(m.decode_rows())},
  };
  std::string out;
  for (const Row& row : rows) AppendMetric(&out, row.name, row.type, row.help, row.value);
  // The model family's own statistics summed over sessions (kimi_k3: batched_steps /
  // batched_rows of shared decode passes, checkpoint_restores, …), by name.
  std::map<std::string, double> plugin(m.plugin().begin(), m.plugin().end());
  for (const auto& [name, value] : plugin) {
    AppendMetric(&out, "coli_plugin_stat", "gauge",
                 "the model family's statistics, summed over sessions", value,
                 "name=\"" + LabelValue(name) + "\"");
  }
  // Each model's current values (resident bytes, the Vulkan tier's occupancy …).
  for (const v1::ModelStat& stat : m.model_stats()) {
    AppendMetric(
        &out, "coli_model_stat", "gauge", "the model family's current values per model",
        stat.value(),
        "model=\"" + LabelValue(stat.model()) + "\",name=\"" + LabelValue(stat.name()) + "\"");
  }
  AppendMetric(&out, "coli_http_streams_active", "gauge", "SSE streams open now",
               streams_active_.load());
  AppendMetric(&out, "coli_http_client_disconnects_total", "counter",
               "streams whose client went away (generation cancelled)",
               static_cast<double>(disconnects_.load()));
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [code, count] : http_by_status_) {
      AppendMetric(&out, "coli_http_responses_total", "counter", "HTTP responses by status",
                   static_cast<double>(count), "code=\"" + std::to_string(code) + "\"");
    }
  }
  res.status = 200;
  res.set_content(out, "text/plain; version=0.0.4; charset=utf-8");
}

void Gateway::Add(httplib::Server* server, const std::string& method, const std::string& pattern,
                  Handler handler) {
  routes_.push_back({method, std::regex(pattern), handler});
  if (method == "GET") {
    server->Get(pattern, std::move(handler));
  } else if (method == "POST") {
    server->Post(pattern, std::move(handler));
  } else if (method == "DELETE") {
    server->Delete(pattern, std::move(handler));
  }
}

std::vector<std::string> Gateway::MethodsFor(const std::string& path) const {
  std::vector<std::string> methods;
  for (const Route& r : routes_) {
    if (std::regex_match(path, r.pattern) &&
        std::find(methods.begin(), methods.end(), r.method) == methods.end()) {
      methods.push_back(r.method);
    }
  }
  return methods;
}

namespace {

// "GET, HEAD, OPTIONS" for the Allow header (HEAD wherever GET is; OPTIONS everywhere).
std::string AllowHeader(const std::vector<std::string>& methods) {
  std::string out;
  for (const std::string& m : methods) {
    out += m + ", ";
    if (m == "GET") out += "HEAD, ";
  }
  return out + "OPTIONS";
}

bool Contains(const std::vector<std::string>& v, const std::string& s) {
  return std::find(v.begin(), v.end(), s) != v.end();
}

// The host part of a Host header or an origin's authority ("127.0.0.1:8000" -> "127.0.0.1",
// "[::1]:8000" -> "[::1]").
std::string HostName(const std::string& authority) {
  if (authority.starts_with("[")) {
    const size_t close = authority.find(']');
    return close == std::string::npos ? authority : authority.substr(0, close + 1);
  }
  return authority.substr(0, authority.find(':'));
}

// Why a browser-borne request is refused, or "" to serve it. A browser sends Origin on every
// cross-origin request that is not a GET / HEAD — also on a "simple" no-cors POST, which needs
// no preflight: without this check any web page the user visits could start generations (and
// background responses) on a keyless loopback server; it cannot read the answer, but it can spend
// the machine. Same-origin requests (the coli web page) and --allow-origin origins pass; clients
// that are not browsers send no Origin. And a keyless server answers only Host names that mean
// this machine, so a DNS-rebinding page (evil.example resolving to 127.0.0.1) is refused too.
std::string RefusedBrowserRequest(const httplib::Request& req, bool keyless, bool origin_allowed) {
  const std::string host = req.get_header_value("Host");
  if (keyless && !host.empty() && !IsLoopback(HostName(host))) {
    return "Host '" + host + "' is not this machine's loopback name: a server without --api-key " +
           "answers only localhost, 127.0.0.1 and [::1] (a guard against DNS rebinding)";
  }
  if (!req.has_header("Origin") || origin_allowed) return "";
  // Reads and preflights change nothing, and CORS keeps the answer from a foreign page.
  if (req.method == "GET" || req.method == "HEAD" || req.method == "OPTIONS") return "";
  const std::string origin = req.get_header_value("Origin");
  if (origin == "http://" + host || origin == "https://" + host) return "";  // same origin
  return "Origin '" + origin + "' may not call this server (serve with --allow-origin " + origin +
         " to let that web page use it)";
}

ApiError InvalidUrl(const httplib::Request& req) {
  ApiError e;
  e.http_status = 404;
  e.message = "Invalid URL (" + req.method + " " + req.path + "): no such endpoint";
  return e;
}

ApiError MethodNotAllowed(const httplib::Request& req, const std::vector<std::string>& methods) {
  ApiError e;
  e.http_status = 405;
  std::string allowed;
  for (const std::string& m : methods) allowed += (allowed.empty() ? "" : " or ") + m;
  e.message = "Method " + req.method + " is not allowed on " + req.path + " (use " + allowed + ")";
  return e;
}

}  // namespace

std::string Gateway::CorsOrigin(const Req& req) const {
  if (!req.has_header("Origin")) return "";
  const std::string origin = req.get_header_value("Origin");
  if (Contains(allowed_origins_, "*")) return "*";
  return Contains(allowed_origins_, origin) ? origin : "";
}

httplib::Server::HandlerResponse Gateway::PreRoute(const Req& req, Res& res) {
  using HR = httplib::Server::HandlerResponse;
  const std::string origin = CorsOrigin(req);
  if (!allowed_origins_.empty()) res.set_header("Vary", "Origin");
  if (!origin.empty()) res.set_header("Access-Control-Allow-Origin", origin);
  if (const std::string why = RefusedBrowserRequest(req, api_key_.empty(), !origin.empty());
      !why.empty()) {
    ApiError e;
    e.http_status = 403;
    e.type = "permission_error";
    e.message = why;
    Fail(res, e);
    return HR::Handled;
  }
  const std::vector<std::string> methods = MethodsFor(req.path);
  if (req.method == "OPTIONS") {
    // A CORS preflight (or a client asking what a path takes). It carries no credentials, so
    // it is answered without the API key; only an allowed origin gets the Access-Control
    // headers that let a browser go on.
    if (methods.empty()) {
      Fail(res, InvalidUrl(req));
      return HR::Handled;
    }
    res.status = 204;
    res.set_header("Allow", AllowHeader(methods));
    if (!origin.empty()) {
      res.set_header("Access-Control-Allow-Methods", AllowHeader(methods));
      const std::string asked = req.get_header_value("Access-Control-Request-Headers");
      res.set_header("Access-Control-Allow-Headers",
                     asked.empty() ? "Authorization, Content-Type" : asked);
      res.set_header("Access-Control-Max-Age", "600");
    }
    return HR::Handled;
  }
  // A request that announces no body has none (RFC 9112 §6.3: neither Content-Length nor
  // Transfer-Encoding). httplib 0.11 would read it until the client closes the connection —
  // `curl -X POST .../cancel` hung 5 s and got a 400 — so it is dispatched here as it is.
  const bool wants_body = req.method == "POST" || req.method == "PUT" || req.method == "PATCH" ||
                          req.method == "DELETE";
  if (wants_body && !req.has_header("Content-Length") && !req.has_header("Transfer-Encoding")) {
    for (const Route& route : routes_) {
      if (route.method != req.method) continue;
      Req copy = req;
      if (!std::regex_match(copy.path, copy.matches, route.pattern)) continue;
      route.handler(copy, res);
      return HR::Handled;
    }
    Fail(res, methods.empty() ? InvalidUrl(req) : MethodNotAllowed(req, methods));
    if (!methods.empty()) res.set_header("Allow", AllowHeader(methods));
    return HR::Handled;
  }
  return HR::Unhandled;
}

void Gateway::HttpError(const Req& req, Res& res) {
  if (!res.body.empty()) return;  // a handler's own error object
  ApiError e;
  e.http_status = res.status;
  const std::vector<std::string> methods =
      req.path.empty() ? std::vector<std::string>{} : MethodsFor(req.path);
  const bool wrong_method = !methods.empty() && !req.method.empty() &&
                            !Contains(methods, req.method) &&
                            !(req.method == "HEAD" && Contains(methods, "GET"));
  switch (res.status) {
    case 404:
    case 400:
      // No handler for this method (httplib says 404 for PUT/PATCH/DELETE and 400 for a method
      // it has no table for); a 400 on a path and method we serve is a request httplib could
      // not read.
      if (wrong_method) {
        e = MethodNotAllowed(req, methods);
        res.set_header("Allow", AllowHeader(methods));
      } else if (res.status == 404) {
        e = InvalidUrl(req);
      } else {
        e.message =
            "malformed HTTP request: its request line or a header could not be read (a header "
            "line may be at most 8192 bytes)";
      }
      break;
    case 413:
      e.message = "request body is larger than the 16 MiB this server accepts";
      break;
    case 414:
      e.message = "request URI is longer than the 8192 bytes this server accepts";
      break;
    default:
      e.type = res.status >= 500 ? "server_error" : "invalid_request_error";
      e.message = "HTTP " + std::to_string(res.status);
      break;
  }
  res.status = e.http_status;
  // Anthropic's clients read their own error object.
  res.set_content(req.path.rfind("/v1/messages", 0) == 0 ? Dump(AnthropicError(e)) : ErrorBody(e),
                  "application/json");
}

grpc::Status Gateway::CountPromptTokens(const Json& chat, int64_t* count) {
  grpc::ClientContext ctx;
  v1::ApplyTemplateRequest a;
  a.set_model(info_.id());
  a.set_request_json(Dump(chat));
  a.set_add_generation_prompt(true);
  v1::ApplyTemplateResponse out;
  grpc::Status s = stub_->ApplyTemplate(&ctx, a, &out);
  *count = out.ids_size();
  return s;
}

void Gateway::Register(httplib::Server* server) {
  auto bind = [this](void (Gateway::*fn)(const Req&, Res&)) {
    return [this, fn](const Req& req, Res& res) { (this->*fn)(req, res); };
  };
  Add(server, "GET", "/v1/models", bind(&Gateway::Models));
  Add(server, "GET", R"(/v1/models/(.+))", bind(&Gateway::Models));
  Add(server, "POST", "/v1/chat/completions", bind(&Gateway::ChatCompletions));
  Add(server, "POST", "/v1/completions", bind(&Gateway::Completions));
  Add(server, "POST", "/v1/responses", bind(&Gateway::Responses));
  Add(server, "POST", "/v1/responses/input_tokens", bind(&Gateway::ResponsesInputTokens));
  Add(server, "GET", R"(/v1/responses/([^/]+))", bind(&Gateway::ResponseById));
  Add(server, "GET", R"(/v1/responses/([^/]+)/input_items)", bind(&Gateway::ResponseInputItems));
  Add(server, "POST", R"(/v1/responses/([^/]+)/cancel)", bind(&Gateway::CancelResponse));
  Add(server, "DELETE", R"(/v1/responses/([^/]+))", bind(&Gateway::ResponseById));
  Add(server, "POST", "/v1/messages", bind(&Gateway::Messages));
  Add(server, "POST", "/v1/messages/count_tokens", bind(&Gateway::MessagesCountTokens));
  Add(server, "POST", "/tokenize", bind(&Gateway::Tokenize));
  Add(server, "POST", "/detokenize", bind(&Gateway::Detokenize));
  Add(server, "POST", "/apply-template", bind(&Gateway::ApplyTemplate));
  Add(server, "GET", "/health", bind(&Gateway::Health));
  Add(server, "GET", "/metrics", bind(&Gateway::Metrics));
  if (serve_web_page_) {
    // `coli web`: the chat page (embedded Vite bundle) on the same origin as the API it uses.
    Add(server, "GET", R"(/|/index\.html|/assets/.+)", [](const Req& req, Res& res) {
      const web::WebAsset* asset = web::FindWebAsset(req.path);
      if (asset == nullptr) {
        res.status = 404;
        return;
      }
      res.set_header("Cache-Control", req.path.rfind("/assets/", 0) == 0
                                          ? "public, max-age=31536000, immutable"
                                          : "no-cache");
      res.set_header("Content-Security-Policy",
                     "default-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:");
      res.set_content(std::string(asset->bytes), std::string(asset->content_type));
    });
  }
  server->set_pre_routing_handler([this](const Req& req, Res& res) { return PreRoute(req, res); });
  server->set_logger([this](const Req&, const Res& res) {
    std::lock_guard<std::mutex> lock(mu_);
    ++http_by_status_[res.status];
  });
  server->set_error_handler([this](const Req& req, Res& res) { HttpError(req, res); });
  server->set_exception_handler([](const Req&, Res& res, std::exception_ptr) {
    ApiError e;
    e.http_status = 500;
    e.type = "server_error";
    e.message = "internal error";
    res.status = 500;
    res.set_content(ErrorBody(e), "application/json");
  });
  server->set_payload_max_length(16u << 20);
}

}  // namespace coli::cli::serve
