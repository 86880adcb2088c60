// `coli serve`: an OpenAI-compatible HTTP gateway (cpp-httplib) over the host's gRPC API.
//
//   coli serve --model DIR [--port 8000] [--host 127.0.0.1] [--api-key KEY]
//              [--connect ADDR] [--model-id ID] [--max-background N] [--responses-dir DIR]
//
// Without --connect it starts a private `coli-host` (tools/coli/client.h), loads DIR there (the
// K3_* switches apply) and stops it on exit; with --connect it uses a running host. Endpoints:
// GET /v1/models[/ID], POST /v1/chat/completions and POST /v1/completions (SSE when
// stream=true), POST /v1/responses (OpenAI's Responses API over the chat path, see
// serve_responses.h; GET/DELETE /v1/responses/ID, GET /v1/responses/ID/input_items,
// POST /v1/responses/ID/cancel, POST /v1/responses/input_tokens; `background: true` runs at most
// --max-background responses at once, cancelled and joined when the server stops; with
// `stream: true` too its events are kept and GET /v1/responses/ID?stream=true&starting_after=N
// replays and follows them; --responses-dir keeps finished stored responses on disk across
// restarts, serve_responses_disk.h),
// POST /tokenize, /detokenize, /apply-template,
// GET /health, GET /metrics (Prometheus). Errors use OpenAI's error object and name the field.
// Loopback only unless --host names another address, which then requires --api-key (bearer).
// A client that goes away mid-stream cancels its generation at the host (within one token).
// `"return_progress": true` (llama.cpp's field) adds prefill-progress chunks to a stream: an
// empty assistant delta (chat) or empty text (completions) carrying
// "prompt_progress": {"total", "cache", "processed", "time_ms"}.
#include "tools/coli/serve.h"

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <regex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "coli/v1/coli.grpc.pb.h"
#include "common/status/status.h"
#include "grpcpp/grpcpp.h"
#include "httplib.h"
#include "tools/coli/cli_args.h"
#include "tools/coli/client.h"
#include "tools/coli/command.h"
#include "tools/coli/serve_connection.h"
#include "tools/coli/serve_openai.h"
#include "tools/coli/serve_responses.h"
#include "tools/coli/serve_responses_background.h"
#include "tools/coli/serve_responses_disk.h"
#include "tools/web/web_assets.h"

namespace coli::cli::serve {
namespace {

int64_t NowSeconds() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::string Dump(const Json& j) { return j.dump(-1, ' ', false, Json::error_handler_t::replace); }

// The type of every SSE answer. It names the charset: Python's requests (and other clients) read
// a text/* body without one as Latin-1, so `iter_lines(decode_unicode=True)` turned every
// non-ASCII character into mojibake (and U+0085 from a split character cut events short); vLLM
// and OpenAI send the charset too. See SendUncompressed.
constexpr char kEventStream[] = "text/event-stream; charset=utf-8";

// httplib 0.11 compresses every text/* answer but exactly "text/event-stream" when the client
// accepts gzip or br (curl --compressed, browsers, most SDKs), and its compressor holds the events
// back until the stream ends. So a request answered with a stream drops its Accept-Encoding: the
// events go out as they are made. httplib reads the header when it writes the answer, after the
// handler; the Request is its own non-const object, handed to handlers as const.
void SendUncompressed(const httplib::Request& req) {
  const_cast<httplib::Request&>(req).headers.erase("Accept-Encoding");
}

bool IsLoopback(const std::string& host) {
  return host == "localhost" || host == "::1" || host == "[::1]" || host.rfind("127.", 0) == 0;
}

// ---- the gateway ------------------------------------------------------------------------------

Json UsageJson(int64_t prompt_tokens, int64_t completion_tokens) {
  return Json{{"prompt_tokens", prompt_tokens},
              {"completion_tokens", completion_tokens},
              {"total_tokens", prompt_tokens + completion_tokens}};
}

// A stream's first event, read before answering so that a request the host refuses is a plain
// error response: false with the host's status in *why otherwise.
template <typename Event>
bool ReadFirstEvent(grpc::ClientReader<Event>& reader, Event* first, grpc::Status* why) {
  if (reader.Read(first)) return true;
  *why = reader.Finish();
  if (why->ok()) *why = grpc::Status(grpc::StatusCode::INTERNAL, "host ended the stream early");
  return false;
}

// llama.cpp's `prompt_progress` object (its server answers `return_progress` with it): prompt
// tokens in all, of them reused from the cache, ready so far (the cached ones included), and
// milliseconds since the prompt began to be read.
Json PromptProgress(const v1::PrefillProgress& p) {
  Json j;
  j["total"] = p.total();
  j["cache"] = p.reused();
  j["processed"] = p.done();
  j["time_ms"] = p.elapsed_ms();
  return j;
}

// One generation's accumulated result (one choice).
struct ChoiceResult {
  std::string reasoning, content;
  Json tool_calls = Json::array();
  Json logprobs = Json::array();
  std::string finish_reason;
  int64_t prompt_tokens = 0, completion_tokens = 0;
  // The tokens through the last one that carried reasoning text (the tags closing the think
  // block count as output), and the prompt tokens the host reused (/v1/responses' usage).
  int64_t reasoning_tokens = 0, cached_tokens = 0;
};

class Gateway {
 public:
  Gateway(v1::Coli::Stub* stub, v1::ModelInfo info, std::string api_key, bool serve_web_page,
          size_t max_background, std::unique_ptr<ResponseDir> responses_dir,
          std::vector<std::string> allowed_origins)
      : stub_(stub),
        info_(std::move(info)),
        api_key_(std::move(api_key)),
        serve_web_page_(serve_web_page),
        allowed_origins_(std::move(allowed_origins)),
        background_(max_background) {
    if (responses_dir) responses_.Persist(std::move(responses_dir));  // loads what it kept
    // Added tokens (named or reserved) sit above the BPE vocabulary: the lowest named one marks
    // where they start. None of them is answer text.
    first_special_ = info_.vocab_size();
    for (const auto& s : info_.special_tokens()) first_special_ = std::min(first_special_, s.id());
  }

  void Register(httplib::Server* server);
  // The methods `path` takes ("" when no endpoint has that path), for Allow and 405.
  std::vector<std::string> MethodsFor(const std::string& path) const;
  // Ends every stream at its next token or event (their clients are treated as gone), cancels
  // the background responses and joins their threads (which ends the streams that follow
  // them). Called when the server is told to stop, before the HTTP server waits for its
  // handlers, and again after (a no-op then); the host is still up.
  void Shutdown() {
    stopping_ = true;
    background_.Shutdown();
  }

 private:
  using Req = httplib::Request;
  using Res = httplib::Response;
  using Handler = std::function<void(const Req&, Res&)>;

  // One endpoint: a method and a whole-path pattern (httplib's), kept so that a wrong method is
  // a 405 naming the right ones, OPTIONS answers for every path, and a body-less POST (no
  // Content-Length, which httplib 0.11 would read until the connection closes) is dispatched
  // here with an empty body.
  struct Route {
    std::string method;
    std::regex pattern;
    Handler handler;
  };
  void Add(httplib::Server* server, const std::string& method, const std::string& pattern,
           Handler handler);
  // Before httplib routes a request: CORS headers, OPTIONS, body-less POST / DELETE.
  httplib::Server::HandlerResponse PreRoute(const Req& req, Res& res);
  // The error object for a reply httplib made itself (unknown path or method, a malformed
  // request, a body or URI over the limits).
  void HttpError(const Req& req, Res& res);
  // Access-Control-Allow-Origin for an --allow-origin origin ("" otherwise).
  std::string CorsOrigin(const Req& req) const;

  void Reply(Res& res, int status, const Json& body) {
    res.status = status;
    res.set_content(Dump(body), "application/json");
  }
  void Fail(Res& res, const ApiError& e) {
    res.status = e.http_status;
    // The host's queue is full: a client that retries (the openai SDK does) waits a second.
    if (e.http_status == 429 && e.code == "queue_full") res.set_header("Retry-After", "1");
    res.set_content(ErrorBody(e), "application/json");
  }
  // A host call ended CANCELLED: its client went away (counted; the answer goes to nobody), the
  // server stops (503), or something else cancelled it (the host's own 499).
  void Abandoned(Res& res, const grpc::Status& s, const ConnectionWatch& client) {
    if (!stopping_) {
      if (client.PeerClosed()) ++disconnects_;
      return Fail(res, FromHostStatus(s));
    }
    ApiError e;
    e.http_status = 503;
    e.type = "server_error";
    e.message = "the server is shutting down";
    Fail(res, e);
  }
  bool Authorized(const Req& req, Res& res);
  // Parses the body as a JSON object (400 otherwise).
  bool Body(const Req& req, Res& res, Json* body);
  // Checks the request's model name (404 model_not_found for another).
  bool ModelOk(const std::string& model, Res& res);

  void Models(const Req& req, Res& res);
  void ChatCompletions(const Req& req, Res& res);
  void Completions(const Req& req, Res& res);
  // /v1/responses (serve_responses.h): create, GET/DELETE by id, input_tokens.
  void Responses(const Req& req, Res& res);
  void ResponseById(const Req& req, Res& res);
  void ResponseInputItems(const Req& req, Res& res);
  void CancelResponse(const Req& req, Res& res);
  void ResponseNotFound(Res& res, const std::string& id) {
    ApiError e;
    e.http_status = 404;
    e.message = "Response with id '" + id + "' not found (store=false, evicted, or never made)";
    Fail(res, e);
  }
  void ResponsesInputTokens(const Req& req, Res& res);
  // Authorizes, parses and maps a /v1/responses body (nullopt: the error is answered).
  std::optional<ResponsesRequest> ResponsesBody(const Req& req, Res& res);
  // background: true — stores `object` as queued and generates it on a BackgroundJobs thread
  // (429 when --max-background are running).
  // With stream: true the reply is the response's event stream (FollowEvents from the start).
  void StartBackgroundResponse(std::shared_ptr<const ResponsesRequest> r, Json object, Res& res,
                               ConnectionWatch watch);
  // Answers with the events of `events` after sequence number `after` (-1: all), live ones
  // included, until the log closes or the client goes away (the response itself goes on).
  void FollowEvents(Res& res, std::shared_ptr<const ResponseEventLog> events, int64_t after,
                    ConnectionWatch watch);
  void Tokenize(const Req& req, Res& res);
  void Detokenize(const Req& req, Res& res);
  void ApplyTemplate(const Req& req, Res& res);
  void Health(const Req& req, Res& res);
  void Metrics(const Req& req, Res& res);

  void FillSampling(const SamplingFields& f, int choice, v1::SamplingParams* s) const {
    s->set_temperature(f.temperature);
    s->set_top_p(f.top_p >= 1.0f ? 0.0f : f.top_p);
    s->set_top_k(f.top_k);
    s->set_seed(f.has_seed ? f.seed + static_cast<uint64_t>(choice) : NowSeconds() * 7919 + choice);
    s->set_logprobs(f.top_logprobs < 0 ? 0 : std::max(1, f.top_logprobs));
    s->set_frequency_penalty(f.frequency_penalty);
    s->set_presence_penalty(f.presence_penalty);
    s->set_repetition_penalty(f.repetition_penalty);
    s->set_min_p(f.min_p);
    for (const auto& [id, bias] : f.logit_bias) {
      auto* entry = s->add_logit_bias();
      entry->set_id(id);
      entry->set_bias(bias);
    }
  }
  Json LogprobEntry(const v1::Token& token, int top) const;

  // One host Chat call (one choice).
  struct Call {
    grpc::ClientContext ctx;
    std::unique_ptr<grpc::ClientReader<v1::ChatEvent>> reader;
    std::string request_id;
    ConnectionMonitor::Guard guard;  // last: unwatched before ctx goes away
  };
  using DeltaFn = std::function<bool(const char* kind, const Json& payload)>;
  // `client` (nullptr for a background response): the connection whose loss cancels the call —
  // while it waits in the host's queue and in its prefill too.
  std::unique_ptr<Call> StartChat(const SamplingFields& f, const std::string& request_json,
                                  int choice, const ConnectionWatch* client);
  // Reads one choice to its end; `on_delta(kind, payload)` sees visible output as it arrives
  // ("reasoning"/"content" text, "tool_call" JSON, "logprob" JSON, "progress" prompt_progress
  // JSON, "tick" after a token that showed nothing) and returns false to cancel. A call the
  // host streams (CHANNEL_TOOL_CALL_DELTA, ABI 1.5) comes as "tool_call_delta" entries of
  // chat's delta.tool_calls (the first {index, id, type, function: {name, arguments}}, later
  // ones {index, function: {arguments}}), then "tool_call_done" with the whole call (the same
  // id; the pieces' arguments join to its arguments) instead of "tool_call"
  // (the client went away). `first` is an event already read, or nullptr.
  grpc::Status RunChoice(const SamplingFields& f, Call& call, ChoiceResult* out,
                         const v1::ChatEvent* first, const DeltaFn& on_delta);
  // One chat generation of response `r` into `b`; a finished response is stored unless store
  // is false. `first` is an event already read, or nullptr.
  // `alive` (optional) is asked at every delta: false cancels (its client went away).
  grpc::Status RunResponse(const ResponsesRequest& r, Call& call, const v1::ChatEvent* first,
                           ResponseBuilder& b, const std::function<bool()>& alive = nullptr);
  // A streamed response as its body sees it (see StreamSse).
  struct SseSink {
    Json header;  // id, object, created, model: what every frame starts with
    bool include_usage = false;
    std::function<bool(const Json&)> send;  // one `data:` frame; false once the client is gone
    std::function<bool()> alive;            // the client still reads (checked without writing)
    // A frame with one choice ("usage": null too when the request asked for the usage frame).
    Json Frame(Json choice) const {
      Json c = header;
      c["choices"] = Json::array({std::move(choice)});
      if (include_usage) c["usage"] = nullptr;
      return c;
    }
  };
  struct StreamEnd {
    int64_t prompt_tokens = 0, completion_tokens = 0;
    bool gone = false;  // the client went away
  };
  // Answers with an SSE stream: `body` sends the choices' frames and says how it ended; then,
  // unless the client went away, the usage frame (include_usage) and `data: [DONE]`.
  void StreamSse(Res& res, ConnectionWatch watch, Json header, bool include_usage,
                 std::function<StreamEnd(const SseSink&)> body);
  // After a streamed choice ended with `s`: false ends the stream (the client went away, or the
  // host's error went out as an error frame).
  static bool ChoiceOk(const grpc::Status& s, const SseSink& sse, StreamEnd* end) {
    if (s.error_code() == grpc::StatusCode::CANCELLED) {
      end->gone = true;
      return false;
    }
    if (!s.ok()) {
      if (!sse.send(Json::parse(ErrorBody(FromHostStatus(s))))) end->gone = true;
      return false;
    }
    return true;
  }
  Json Header(const std::string& id, const char* object, int64_t created) const {
    Json h;
    h["id"] = id;
    h["object"] = object;
    h["created"] = created;
    h["model"] = info_.id();
    return h;
  }

  // One host Generate call (one /v1/completions choice) and its result.
  struct GenerateCall {
    grpc::ClientContext ctx;
    std::unique_ptr<grpc::ClientReader<v1::GenerateEvent>> reader;
    std::string request_id;
    ConnectionMonitor::Guard guard;  // last: unwatched before ctx goes away
  };
  struct CompletionResult {
    std::string text, finish_reason;
    Json tokens = Json::array(), token_logprobs = Json::array(), top_logprobs = Json::array();
    Json text_offset = Json::array();
    // Where text_offset counts from: OpenAI's offsets index the prompt followed by the completion
    // (the first token of a reply to "Hello" is at 5, echo or not); vLLM's start at 0.
    int64_t offset_base = 0;
    int64_t prompt_tokens = 0, completion_tokens = 0;
  };
  std::unique_ptr<GenerateCall> StartGenerate(const SamplingFields& f, const std::string& prompt,
                                              int choice, const ConnectionWatch* client);
  // Reads one completion choice to its end; `on_piece` sees "progress" (prompt_progress JSON),
  // "text" ({"text", optional "logprobs"} per token) and "tick" (a token that showed nothing)
  // and returns false to cancel.
  grpc::Status RunCompletion(const SamplingFields& f, GenerateCall& call, CompletionResult* out,
                             const v1::GenerateEvent* first, const DeltaFn& on_piece);
  static std::string FinishReason(v1::FinishReason r, bool tool_calls, bool stopped);
  // A stop sequence matched: STOP the host's request (it finishes normally, reason STOPPED).
  void StopAtHost(const std::string& request_id) {
    v1::CancelRequest c;
    c.set_request_id(request_id);
    c.set_stop(true);
    v1::CancelResponse response;
    grpc::ClientContext ctx;
    stub_->Cancel(&ctx, c, &response);
  }

  v1::Coli::Stub* stub_;  // the client's
  v1::ModelInfo info_;
  std::string api_key_;
  bool serve_web_page_ = false;               // `coli web`
  std::vector<std::string> allowed_origins_;  // --allow-origin ("*": any)
  std::vector<Route> routes_;
  ConnectionMonitor monitor_;  // cancels host calls whose clients went away
  int32_t first_special_ = 0;

  std::mutex mu_;
  std::map<int, uint64_t> http_by_status_;
  std::atomic<int> streams_active_{0};
  std::atomic<uint64_t> disconnects_{0};
  std::atomic<bool> stopping_{false};  // Shutdown has begun: streams end
  ResponseStore responses_;            // stored /v1/responses results (previous_response_id, GET)
  // Last: destroyed first, so its threads are joined while everything they use still exists.
  BackgroundJobs background_;
};

bool Gateway::Authorized(const Req& req, Res& res) {
  if (api_key_.empty()) return true;
  const std::string auth = req.get_header_value("Authorization");
  // Compared in time that does not depend on where the first wrong byte is (a key guessed byte
  // by byte over the network otherwise).
  const std::string expected = "Bearer " + api_key_;
  unsigned char diff = auth.size() == expected.size() ? 0 : 1;
  for (size_t i = 0; i < expected.size(); ++i) {
    diff |= static_cast<unsigned char>(expected[i] ^ (i < auth.size() ? auth[i] : 0));
  }
  if (diff == 0) return true;
  ApiError e;
  e.http_status = 401;
  e.type = "authentication_error";
  e.code = "invalid_api_key";
  e.message = auth.empty() ? "missing API key (Authorization: Bearer KEY)" : "invalid API key";
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
  if (model.empty() || model == info_.id()) return true;
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
  auto entry = [&] {
    Json m;
    m["id"] = info_.id();
    m["object"] = "model";
    m["created"] = 0;
    m["owned_by"] = "coli";
    m["max_model_len"] = info_.context_capacity();
    m["family"] = info_.family();
    return m;
  };
  if (req.matches.size() > 1) {
    const std::string id = req.matches[1];
    if (!ModelOk(id, res)) return;
    Reply(res, 200, entry());
    return;
  }
  Json out;
  out["object"] = "list";
  out["data"] = Json::array({entry()});
  Reply(res, 200, out);
}

// A logprob entry's `token` as OpenAI writes it: the token's text, or for a token whose bytes are
// not UTF-8 on their own (part of a character) "bytes:" and each byte as \xNN, e.g.
// "bytes:\xe4\xbd" (clients such as HELM read that form back). `bytes` holds the raw bytes.
std::string LogprobTokenText(const std::string& bytes) {
  if (!FirstInvalidUtf8(bytes).has_value()) return bytes;
  std::string out = "bytes:";
  for (unsigned char c : bytes) {
    char hex[8];
    std::snprintf(hex, sizeof(hex), "\\x%02x", c);
    out += hex;
  }
  return out;
}

Json Gateway::LogprobEntry(const v1::Token& token, int top) const {
  auto bytes_of = [](const std::string& s) {
    Json b = Json::array();
    for (unsigned char c : s) b.push_back(static_cast<int>(c));
    return b;
  };
  const auto& lp = token.logprobs();
  Json e;
  const std::string& bytes = lp.sampled().text();  // the token's own bytes
  e["token"] = LogprobTokenText(bytes);
  e["logprob"] = lp.sampled().logprob();
  e["bytes"] = bytes_of(bytes);
  e["top_logprobs"] = Json::array();
  for (int i = 0; i < lp.top_size() && i < top; ++i) {
    Json t;
    t["token"] = LogprobTokenText(lp.top(i).text());
    t["logprob"] = lp.top(i).logprob();
    t["bytes"] = bytes_of(lp.top(i).text());
    e["top_logprobs"].push_back(std::move(t));
  }
  return e;
}

std::string Gateway::FinishReason(v1::FinishReason r, bool tool_calls, bool stopped) {
  if (stopped) return "stop";
  switch (r) {
    case v1::FINISH_REASON_LENGTH:
    case v1::FINISH_REASON_CONTEXT:
      return "length";
    case v1::FINISH_REASON_TOOL_CALLS:
      return "tool_calls";
    default:
      return tool_calls ? "tool_calls" : "stop";
  }
}

// An OpenAI tool call from the host's CHANNEL_TOOL_CALL text {"name":..., "arguments":...}.
Json ToolCallFromDelta(const std::string& text, int index) {
  Json call = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  Json out;
  out["index"] = index;
  out["id"] = NewId("call_");
  out["type"] = "function";
  std::string name, arguments = "{}";
  if (call.is_object()) {
    if (call.contains("name") && call["name"].is_string()) name = call["name"].get<std::string>();
    if (call.contains("arguments")) {
      const Json& a = call["arguments"];
      arguments = a.is_string() ? a.get<std::string>() : Dump(a);
    }
  }
  out["function"]["name"] = name;
  out["function"]["arguments"] = arguments;
  return out;
}

std::unique_ptr<Gateway::Call> Gateway::StartChat(const SamplingFields& f,
                                                  const std::string& request_json, int choice,
                                                  const ConnectionWatch* client) {
  auto call = std::make_unique<Call>();
  v1::ChatRequest r;
  r.set_model(info_.id());
  r.set_request_json(request_json);
  r.set_max_tokens(f.max_tokens);
  r.set_report_progress(f.stream && f.return_progress);
  FillSampling(f, choice, r.mutable_sampling());
  call->reader = stub_->Chat(&call->ctx, r);
  if (client) call->guard = monitor_.Watch(*client, [c = call.get()] { c->ctx.TryCancel(); });
  return call;
}

grpc::Status Gateway::RunChoice(const SamplingFields& f, Call& call, ChoiceResult* out,
                                const v1::ChatEvent* first, const DeltaFn& on_delta) {
  StopFilter stop(f.stop);
  bool stopped = false, cancelled = false, tool_calls = false;
  // Logprobs list the content's tokens. A token that is part of a character, or whose text the
  // stop filter holds, shows nothing yet and waits here: the next token that shows content claims
  // it (a reply cut inside a character lists it at the end), one that shows other text, a special
  // token that shows nothing or a stop string drops it. Whole text that shows nothing (the name
  // in a structural tag such as <|close|>response<|sep|>) is not content. So the entries' bytes
  // join to the content (a token half cut by a stop string is listed whole).
  std::vector<Json> unclaimed_logprobs;
  bool content_last = false;  // the last token that showed anything showed content
  // The call the host is streaming: its index among this choice's calls and its id (-1: none).
  int streaming_index = -1;
  std::string streaming_id;
  v1::ChatEvent ev;
  v1::FinishReason reason = v1::FINISH_REASON_UNSPECIFIED;
  bool have = first != nullptr;
  if (have) ev = *first;
  int64_t emitted = 0;  // tells whether a token showed anything
  auto emit = [&](const char* kind, const Json& payload) {
    ++emitted;
    if (cancelled) return;
    if (on_delta && !on_delta(kind, payload)) {
      cancelled = true;
      call.ctx.TryCancel();
    }
  };
  // The waiting entries, listed (each one's bytes are part of the content).
  auto claim_logprobs = [&] {
    for (const Json& entry : unclaimed_logprobs) {
      out->logprobs.push_back(entry);
      emit("logprob", entry);
    }
    unclaimed_logprobs.clear();
  };
  while (have || call.reader->Read(&ev)) {
    have = false;
    if (ev.has_progress()) {
      emit("progress", PromptProgress(ev.progress()));
    } else if (ev.has_started()) {
      call.request_id = ev.started().request_id();
      out->prompt_tokens = ev.started().prompt_tokens();
    } else if (ev.has_token()) {
      const v1::ChatToken& t = ev.token();
      ++out->completion_tokens;
      const int64_t emitted_before = emitted;
      bool showed_content = false, showed_other = false;
      // Content the stop filter let through, and whether a stop string ended the reply here.
      bool visible_content = false, stopped_here = false;
      for (const v1::ChatDelta& d : t.deltas()) {
        if (d.channel() == v1::CHANNEL_REASONING && !d.text().empty()) {
          showed_other = true;
          out->reasoning += d.text();
          out->reasoning_tokens = out->completion_tokens;
          emit("reasoning", d.text());
        } else if (d.channel() == v1::CHANNEL_CONTENT && !d.text().empty()) {
          showed_content = true;
          if (stopped) continue;
          std::string visible = stop.Push(d.text());
          out->content += visible;
          visible_content = visible_content || !visible.empty();
          if (!visible.empty()) emit("content", visible);
          if (stop.stopped()) {
            stopped = stopped_here = true;
            StopAtHost(call.request_id);
          }
        } else if (d.channel() == v1::CHANNEL_TOOL_CALL_DELTA) {
          showed_other = true;
          const Json piece = Json::parse(d.text(), nullptr, /*allow_exceptions=*/false);
          if (!piece.is_object() || !piece.contains("arguments") ||
              !piece["arguments"].is_string()) {
            continue;  // not the ABI's shape: the complete call still comes
          }
          const std::string arguments = piece["arguments"].get<std::string>();
          if (piece.contains("name")) {  // a call opens
            streaming_index = static_cast<int>(out->tool_calls.size());
            streaming_id = NewId("call_");
            const std::string name =
                piece["name"].is_string() ? piece["name"].get<std::string>() : "";
            emit("tool_call_delta", Json{{"index", streaming_index},
                                         {"id", streaming_id},
                                         {"type", "function"},
                                         {"function", {{"name", name}, {"arguments", arguments}}}});
          } else if (streaming_index >= 0 && !arguments.empty()) {
            emit("tool_call_delta",
                 Json{{"index", streaming_index}, {"function", {{"arguments", arguments}}}});
          }
        } else if (d.channel() == v1::CHANNEL_TOOL_CALL) {
          showed_other = true;
          tool_calls = true;
          const int index = static_cast<int>(out->tool_calls.size());
          Json tc = ToolCallFromDelta(d.text(), index);
          const bool streamed = streaming_index == index;
          if (streamed) tc["id"] = streaming_id;
          streaming_index = -1;
          out->tool_calls.push_back(tc);
          emit(streamed ? "tool_call_done" : "tool_call", tc);
        }
      }
      if (f.top_logprobs >= 0 && (!stopped || stopped_here)) {
        const bool special = t.token().id() >= first_special_;
        if (visible_content) {
          // Also a special token that showed content: the parser flushed a character left
          // unfinished before it (U+FFFD), whose parts wait here. The special token is not listed.
          if (!special) unclaimed_logprobs.push_back(LogprobEntry(t.token(), f.top_logprobs));
          claim_logprobs();
        } else if (stopped_here) {
          unclaimed_logprobs.clear();  // their text, and this token's, went with the stop string
        } else if (showed_content) {
          // The stop filter holds this text (it may begin a stop string): it waits with it.
          if (!special) unclaimed_logprobs.push_back(LogprobEntry(t.token(), f.top_logprobs));
        } else if (showed_other || special) {
          unclaimed_logprobs.clear();
        } else if (FirstInvalidUtf8(t.token().logprobs().sampled().text()).has_value()) {
          unclaimed_logprobs.push_back(LogprobEntry(t.token(), f.top_logprobs));
        }  // else whole text that shows nothing (a structural tag's name): not content
        if (showed_content || showed_other) content_last = showed_content;
      }
      // A token that showed nothing still lets a stream check that its client is there.
      if (emitted == emitted_before) emit("tick", nullptr);
    } else if (ev.has_finished()) {
      reason = ev.finished().reason();
      out->prompt_tokens = ev.finished().usage().prompt_tokens();
      out->completion_tokens = ev.finished().usage().completion_tokens();
      out->cached_tokens = ev.finished().usage().tokens_reused();
    }
  }
  grpc::Status status = call.reader->Finish();
  if (!stopped) {
    std::string tail = stop.Flush();
    if (!tail.empty()) {
      out->content += tail;
      emit("content", tail);
    }
    // The reply ended inside a character (max_tokens): its parts are still content tokens, one
    // entry each, as OpenAI and vLLM list every generated content token.
    if (content_last) claim_logprobs();
  }
  out->finish_reason = FinishReason(reason, tool_calls, stopped);
  if (cancelled) return grpc::Status(grpc::StatusCode::CANCELLED, "client disconnected");
  return status;
}

void Gateway::ChatCompletions(const Req& req, Res& res) {
  if (!Authorized(req, res)) return;
  Json body;
  if (!Body(req, res, &body)) return;
  ApiError error;
  std::optional<SamplingFields> f = ParseChatParams(body, &error);
  if (!f) return Fail(res, error);
  if (!ModelOk(f->model, res)) return;
  const std::string id = NewId("chatcmpl-");
  const int64_t created = NowSeconds();
  body.erase("return_progress");  // the gateway's own field, not the template's
  const std::string request_json = Dump(body);
  const ConnectionWatch watch(req.local_port, req.remote_addr, req.remote_port);

  if (!f->stream) {
    std::vector<ChoiceResult> results(f->n);
    // Nothing is written until the end: each token checks that the client still waits.
    auto alive = [this, &watch](const char*, const Json&) {
      return !stopping_ && !watch.PeerClosed();
    };
    for (int i = 0; i < f->n; ++i) {
      auto call = StartChat(*f, request_json, i, &watch);
      grpc::Status s = RunChoice(*f, *call, &results[i], nullptr, alive);
      if (s.error_code() == grpc::StatusCode::CANCELLED) return Abandoned(res, s, watch);
      if (!s.ok()) return Fail(res, FromHostStatus(s));
    }
    Json out;
    out["id"] = id;
    out["object"] = "chat.completion";
    out["created"] = created;
    out["model"] = info_.id();
    out["choices"] = Json::array();
    int64_t completion = 0;
    for (int i = 0; i < f->n; ++i) {
      ChoiceResult& r = results[i];
      // The think-skip fallback re-sends the answer as content: it is not reasoning then.
      if (!r.content.empty() && r.content == r.reasoning) r.reasoning.clear();
      Json message;
      message["role"] = "assistant";
      message["content"] =
          r.content.empty() && !r.tool_calls.empty() ? Json(nullptr) : Json(r.content);
      message["reasoning_content"] = r.reasoning.empty() ? Json(nullptr) : Json(r.reasoning);
      if (!r.tool_calls.empty()) {
        for (Json& tc : r.tool_calls) tc.erase("index");
        message["tool_calls"] = r.tool_calls;
      }
      Json choice;
      choice["index"] = i;
      choice["message"] = message;
      choice["logprobs"] = f->top_logprobs >= 0 ? Json{{"content", r.logprobs}} : Json(nullptr);
      choice["finish_reason"] = r.finish_reason;
      out["choices"].push_back(choice);
      completion += r.completion_tokens;
    }
    out["usage"] = UsageJson(results[0].prompt_tokens, completion);
    Reply(res, 200, out);
    return;
  }

  // Streaming: read the first event before answering, so a refused request is a plain 400.
  auto first_call = std::shared_ptr<Call>(StartChat(*f, request_json, 0, &watch));
  auto first = std::make_shared<v1::ChatEvent>();
  if (grpc::Status why; !ReadFirstEvent(*first_call->reader, first.get(), &why)) {
    if (why.error_code() == grpc::StatusCode::CANCELLED) return Abandoned(res, why, watch);
    return Fail(res, FromHostStatus(why));
  }
  auto fields = std::make_shared<SamplingFields>(*f);
  SendUncompressed(req);
  StreamSse(
      res, watch, Header(id, "chat.completion.chunk", created), f->include_usage,
      [this, first_call, first, fields, request_json, watch](const SseSink& sse) {
        auto chunk = [&](int index, const Json& delta, const Json& finish, const Json& logprobs) {
          return sse.Frame(Json{{"index", index},
                                {"delta", delta},
                                {"logprobs", logprobs},
                                {"finish_reason", finish}});
        };
        StreamEnd end;
        for (int i = 0; i < fields->n && !end.gone; ++i) {
          std::shared_ptr<Call> call =
              i == 0 ? first_call
                     : std::shared_ptr<Call>(StartChat(*fields, request_json, i, &watch));
          if (!sse.send(chunk(i, Json{{"role", "assistant"}, {"content", ""}}, nullptr, nullptr))) {
            end.gone = true;
            call->ctx.TryCancel();
            call->reader->Finish();
            break;
          }
          ChoiceResult r;
          grpc::Status s =
              RunChoice(*fields, *call, &r, i == 0 ? first.get() : nullptr,
                        [&](const char* kind, const Json& payload) {
                          Json delta = Json::object(), lp = nullptr;
                          if (!std::strcmp(kind, "tick")) return sse.alive();
                          if (!std::strcmp(kind, "progress")) {
                            // llama.cpp's shape: an empty assistant delta + progress.
                            Json c = chunk(i, Json{{"role", "assistant"}, {"content", nullptr}},
                                           nullptr, nullptr);
                            c["prompt_progress"] = payload;
                            return sse.send(c);
                          }
                          if (!std::strcmp(kind, "reasoning")) {
                            delta["reasoning_content"] = payload;
                          } else if (!std::strcmp(kind, "content")) {
                            delta["content"] = payload;
                          } else if (!std::strcmp(kind, "tool_call") ||
                                     !std::strcmp(kind, "tool_call_delta")) {
                            delta["tool_calls"] = Json::array({payload});
                          } else if (!std::strcmp(kind, "tool_call_done")) {
                            return sse.alive();  // its deltas said it all
                          } else {
                            lp = Json{{"content", Json::array({payload})}};
                          }
                          return sse.send(chunk(i, delta, nullptr, lp));
                        });
          if (!ChoiceOk(s, sse, &end)) break;
          end.prompt_tokens = r.prompt_tokens;
          end.completion_tokens += r.completion_tokens;
          if (!sse.send(chunk(i, Json::object(), r.finish_reason, nullptr))) end.gone = true;
        }
        return end;
      });
}

void Gateway::StreamSse(Res& res, ConnectionWatch watch, Json header, bool include_usage,
                        std::function<StreamEnd(const SseSink&)> body) {
  res.set_header("Cache-Control", "no-cache");
  res.set_chunked_content_provider(
      kEventStream, [this, watch, header = std::move(header), include_usage,
                     body = std::move(body)](size_t, httplib::DataSink& sink) {
        ++streams_active_;
        SseSink sse;
        sse.header = header;
        sse.include_usage = include_usage;
        sse.send = [this, &sink, &watch](const Json& j) {
          const std::string frame = "data: " + Dump(j) + "\n\n";
          return !stopping_ && !watch.PeerClosed() && sink.is_writable() &&
                 sink.write(frame.data(), frame.size());
        };
        sse.alive = [this, &sink, &watch] {
          return !stopping_ && !watch.PeerClosed() && sink.is_writable();
        };
        const StreamEnd end = body(sse);
        if (end.gone) {
          ++disconnects_;
        } else {
          if (include_usage) {
            Json u = header;
            u["choices"] = Json::array();
            u["usage"] = UsageJson(end.prompt_tokens, end.completion_tokens);
            sse.send(u);
          }
          static const char kDone[] = "data: [DONE]\n\n";
          if (sink.is_writable()) sink.write(kDone, sizeof(kDone) - 1);
        }
        --streams_active_;
        sink.done();
        return true;
      });
}

std::unique_ptr<Gateway::GenerateCall> Gateway::StartGenerate(const SamplingFields& f,
                                                              const std::string& prompt, int choice,
                                                              const ConnectionWatch* client) {
  auto call = std::make_unique<GenerateCall>();
  v1::GenerateRequest r;
  r.set_model(info_.id());
  r.set_prompt(prompt);
  r.set_max_tokens(f.max_tokens);
  r.set_report_progress(f.stream && f.return_progress);
  FillSampling(f, choice, r.mutable_sampling());
  call->reader = stub_->Generate(&call->ctx, r);
  if (client) call->guard = monitor_.Watch(*client, [c = call.get()] { c->ctx.TryCancel(); });
  return call;
}

// Characters (code points, as OpenAI's Python counts them) of UTF-8 text.
int64_t CodePoints(const std::string& text) {
  int64_t n = 0;
  for (unsigned char c : text) n += (c & 0xC0) != 0x80;
  return n;
}

grpc::Status Gateway::RunCompletion(const SamplingFields& f, GenerateCall& call,
                                    CompletionResult* out, const v1::GenerateEvent* first,
                                    const DeltaFn& on_piece) {
  StopFilter stop(f.stop);
  bool stopped = false, cancelled = false;
  // Characters (code points, as OpenAI's Python counts) of the text before the current token: its
  // logprobs' text_offset. The text is a prefix of the tokens' texts (a stop string only cuts it),
  // so text[offset[i], offset[i + 1]) is what token i completed: "" for the first part of a
  // character, the character for the token that ends it.
  int64_t text_chars = out->offset_base;
  v1::FinishReason reason = v1::FINISH_REASON_UNSPECIFIED;
  v1::GenerateEvent ev;
  bool have = first != nullptr;
  if (have) ev = *first;
  auto emit = [&](const char* kind, const Json& payload) {
    if (cancelled || !on_piece) return;
    if (!on_piece(kind, payload)) {
      cancelled = true;
      call.ctx.TryCancel();
    }
  };
  while (have || call.reader->Read(&ev)) {
    have = false;
    if (ev.has_progress()) {
      emit("progress", PromptProgress(ev.progress()));
    } else if (ev.has_started()) {
      call.request_id = ev.started().request_id();
      out->prompt_tokens = ev.started().prompt_tokens();
    } else if (ev.has_token() && !stopped) {
      ++out->completion_tokens;
      const bool hidden = f.skip_special_tokens && ev.token().id() >= first_special_;
      const std::string shown = hidden ? std::string() : ev.token().text();
      const int64_t offset = text_chars;
      for (unsigned char c : shown) text_chars += (c & 0xC0) != 0x80;
      const std::string visible = stop.Push(shown);
      out->text += visible;
      // One piece per token: its visible text and (with logprobs) the token's entry.
      Json piece;
      piece["text"] = visible;
      if (f.top_logprobs >= 0) {
        const auto& lp = ev.token().logprobs();
        Json top = Json::object();
        for (int k = 0; k < lp.top_size() && k < f.top_logprobs; ++k) {
          top[LogprobTokenText(lp.top(k).text())] = lp.top(k).logprob();
        }
        const std::string token_text = LogprobTokenText(lp.sampled().text());
        out->tokens.push_back(token_text);
        out->token_logprobs.push_back(lp.sampled().logprob());
        out->top_logprobs.push_back(top);
        out->text_offset.push_back(offset);
        piece["logprobs"] = Json{{"tokens", Json::array({token_text})},
                                 {"token_logprobs", Json::array({lp.sampled().logprob()})},
                                 {"top_logprobs", Json::array({top})},
                                 {"text_offset", Json::array({offset})}};
      }
      // A token that shows nothing still lets a stream check that its client is there.
      emit(!visible.empty() || piece.contains("logprobs") ? "text" : "tick", piece);
      if (stop.stopped()) {
        stopped = true;
        StopAtHost(call.request_id);
      }
    } else if (ev.has_finished()) {
      reason = ev.finished().reason();
      out->prompt_tokens = ev.finished().usage().prompt_tokens();
      out->completion_tokens = ev.finished().usage().completion_tokens();
    }
  }
  grpc::Status status = call.reader->Finish();
  if (!stopped && !cancelled) {
    const std::string tail = stop.Flush();
    if (!tail.empty()) {
      out->text += tail;
      emit("text", Json{{"text", tail}});
    }
  }
  out->finish_reason = FinishReason(reason, false, stopped);
  if (cancelled) return grpc::Status(grpc::StatusCode::CANCELLED, "client disconnected");
  return status;
}

void Gateway::Completions(const Req& req, Res& res) {
  if (!Authorized(req, res)) return;
  Json body;
  if (!Body(req, res, &body)) return;
  ApiError error;
  std::string prompt;
  std::optional<SamplingFields> f = ParseCompletionParams(body, &prompt, &error);
  if (!f) return Fail(res, error);
  if (!ModelOk(f->model, res)) return;
  const std::string id = NewId("cmpl-");
  const int64_t created = NowSeconds();
  const ConnectionWatch watch(req.local_port, req.remote_addr, req.remote_port);

  if (!f->stream) {
    Json out;
    out["id"] = id;
    out["object"] = "text_completion";
    out["created"] = created;
    out["model"] = info_.id();
    out["choices"] = Json::array();
    int64_t prompt_tokens = 0, completion = 0;
    for (int i = 0; i < f->n; ++i) {
      auto call = StartGenerate(*f, prompt, i, &watch);
      CompletionResult r;
      r.offset_base = CodePoints(prompt);
      grpc::Status s =
          RunCompletion(*f, *call, &r, nullptr, [this, &watch](const char*, const Json&) {
            return !stopping_ && !watch.PeerClosed();  // each token: is the client still there?
          });
      if (s.error_code() == grpc::StatusCode::CANCELLED) return Abandoned(res, s, watch);
      if (!s.ok()) return Fail(res, CompletionsError(FromHostStatus(s)));
      Json choice;
      choice["index"] = i;
      choice["text"] = r.text;
      choice["logprobs"] = f->top_logprobs >= 0 ? Json{{"tokens", r.tokens},
                                                       {"token_logprobs", r.token_logprobs},
                                                       {"top_logprobs", r.top_logprobs},
                                                       {"text_offset", r.text_offset}}
                                                : Json(nullptr);
      choice["finish_reason"] = r.finish_reason;
      out["choices"].push_back(choice);
      prompt_tokens = r.prompt_tokens;
      completion += r.completion_tokens;
    }
    out["usage"] = UsageJson(prompt_tokens, completion);
    Reply(res, 200, out);
    return;
  }

  // Streaming (OpenAI's legacy shape): read the first event before answering, so a refused
  // request is a plain 400.
  auto first_call = std::shared_ptr<GenerateCall>(StartGenerate(*f, prompt, 0, &watch));
  auto first = std::make_shared<v1::GenerateEvent>();
  if (grpc::Status why; !ReadFirstEvent(*first_call->reader, first.get(), &why)) {
    if (why.error_code() == grpc::StatusCode::CANCELLED) return Abandoned(res, why, watch);
    return Fail(res, CompletionsError(FromHostStatus(why)));
  }
  auto fields = std::make_shared<SamplingFields>(*f);
  SendUncompressed(req);
  StreamSse(
      res, watch, Header(id, "text_completion", created), f->include_usage,
      [this, first_call, first, fields, prompt, watch](const SseSink& sse) {
        auto chunk = [&](int index, const std::string& text, const Json& logprobs,
                         const Json& finish) {
          return sse.Frame(Json{
              {"text", text}, {"index", index}, {"logprobs", logprobs}, {"finish_reason", finish}});
        };
        StreamEnd end;
        for (int i = 0; i < fields->n && !end.gone; ++i) {
          std::shared_ptr<GenerateCall> call =
              i == 0 ? first_call
                     : std::shared_ptr<GenerateCall>(StartGenerate(*fields, prompt, i, &watch));
          CompletionResult r;
          r.offset_base = CodePoints(prompt);
          grpc::Status s = RunCompletion(
              *fields, *call, &r, i == 0 ? first.get() : nullptr,
              [&](const char* kind, const Json& payload) {
                if (!std::strcmp(kind, "tick")) return sse.alive();
                if (!std::strcmp(kind, "progress")) {
                  Json c = chunk(i, "", nullptr, nullptr);
                  c["prompt_progress"] = payload;
                  return sse.send(c);
                }
                return sse.send(chunk(
                    i, payload["text"].get<std::string>(),
                    payload.contains("logprobs") ? payload["logprobs"] : Json(nullptr), nullptr));
              });
          if (!ChoiceOk(s, sse, &end)) break;
          end.prompt_tokens = r.prompt_tokens;
          end.completion_tokens += r.completion_tokens;
          if (!sse.send(chunk(i, "", nullptr, r.finish_reason))) end.gone = true;
        }
        return end;
      });
}

std::optional<ResponsesRequest> Gateway::ResponsesBody(const Req& req, Res& res) {
  Json body;
  if (!Authorized(req, res) || !Body(req, res, &body)) return std::nullopt;
  ApiError error;
  std::optional<ResponsesRequest> r = ParseResponsesRequest(body, &responses_, &error);
  if (!r) {
    Fail(res, error);
    return std::nullopt;
  }
  if (!ModelOk(r->fields.model, res)) return std::nullopt;
  return r;
}

grpc::Status Gateway::RunResponse(const ResponsesRequest& r, Call& call, const v1::ChatEvent* first,
                                  ResponseBuilder& b, const std::function<bool()>& alive) {
  ChoiceResult out;
  grpc::Status s =
      RunChoice(r.fields, call, &out, first, [&b, &alive](const char* kind, const Json& p) {
        return (!alive || alive()) && b.Delta(kind, p);
      });
  if (!s.ok()) return s;
  b.Finish({out.finish_reason, out.prompt_tokens, out.completion_tokens, out.reasoning_tokens,
            out.cached_tokens});
  if (r.store) {
    Json conversation = r.conversation;
    conversation.push_back(b.ChatMessage());
    responses_.Put(b.response()["id"].get<std::string>(), b.response(), std::move(conversation),
                   r.input_items);
  }
  return s;
}

void Gateway::Responses(const Req& req, Res& res) {
  std::optional<ResponsesRequest> parsed = ResponsesBody(req, res);
  if (!parsed) return;
  auto r = std::make_shared<const ResponsesRequest>(std::move(*parsed));
  const std::string request_json = Dump(r->chat);
  Json object = NewResponseObject(*r, info_.id(), NowSeconds());
  const ConnectionWatch watch(req.local_port, req.remote_addr, req.remote_port);
  if (r->fields.stream) SendUncompressed(req);
  if (r->background) return StartBackgroundResponse(r, std::move(object), res, watch);
  if (!r->fields.stream) {
    auto call = StartChat(r->fields, request_json, 0, &watch);
    ResponseBuilder b(std::move(object), {}, r->logprobs);
    grpc::Status s = RunResponse(*r, *call, nullptr, b,
                                 [this, &watch] { return !stopping_ && !watch.PeerClosed(); });
    if (s.error_code() == grpc::StatusCode::CANCELLED) return Abandoned(res, s, watch);
    if (!s.ok()) return Fail(res, ToResponsesError(FromHostStatus(s), *r));
    return Reply(res, 200, b.response());
  }
  // Streaming: read the first event before answering, so a refused request is a plain 400.
  auto call = std::shared_ptr<Call>(StartChat(r->fields, request_json, 0, &watch));
  auto first = std::make_shared<v1::ChatEvent>();
  if (grpc::Status why; !ReadFirstEvent(*call->reader, first.get(), &why)) {
    if (why.error_code() == grpc::StatusCode::CANCELLED) return Abandoned(res, why, watch);
    return Fail(res, ToResponsesError(FromHostStatus(why), *r));
  }
  res.set_header("Cache-Control", "no-cache");
  res.set_chunked_content_provider(
      kEventStream, [this, call, first, object, r, watch](size_t, httplib::DataSink& sink) {
        ++streams_active_;
        ResponseBuilder::Sink events;
        events.send = [this, &sink, &watch](const Json& e) {
          const std::string frame = SseEventFrame(e);
          return !stopping_ && !watch.PeerClosed() && sink.is_writable() &&
                 sink.write(frame.data(), frame.size());
        };
        events.alive = [this, &sink, &watch] {
          return !stopping_ && !watch.PeerClosed() && sink.is_writable();
        };
        ResponseBuilder b(object, events, r->logprobs);
        grpc::Status s(grpc::StatusCode::CANCELLED, "client disconnected");
        if (b.Start()) {
          s = RunResponse(*r, *call, first.get(), b);
        } else {
          call->ctx.TryCancel();
          call->reader->Finish();
        }
        if (s.error_code() == grpc::StatusCode::CANCELLED) {
          ++disconnects_;
        } else if (!s.ok()) {
          b.Fail(FromHostStatus(s));
        }
        --streams_active_;
        sink.done();
        return true;
      });
}

void Gateway::StartBackgroundResponse(std::shared_ptr<const ResponsesRequest> r, Json object,
                                      Res& res, ConnectionWatch watch) {
  const std::string id = object["id"].get<std::string>();
  object["status"] = "queued";
  // With stream: true every event goes into a log that the POST's stream and any resumed one
  // read (the job never waits for a client).
  std::shared_ptr<ResponseEventLog> events;
  ResponseBuilder::Sink sink;
  if (r->fields.stream) {
    events = std::make_shared<ResponseEventLog>();
    sink.send = [events](const Json& e) {
      events->Append(e["sequence_number"].get<int64_t>(), SseEventFrame(e));
      return true;
    };
  }
  auto b = std::make_shared<ResponseBuilder>(object, sink, r->logprobs);
  // Stored before the job starts so a poll (or cancel) right after this reply finds it; no
  // conversation until it finishes (a follow-up cannot continue it yet).
  responses_.Put(id, object, nullptr, r->input_items);
  if (events) responses_.SetEvents(id, events);
  const bool started = background_.Start(id, [this, r, b, events, id](BackgroundJobs::Job& job) {
    b->Start();                 // response.created (queued), response.queued, response.in_progress
    responses_.SetLive(id, b);  // GET shows the output so far
    grpc::Status s(grpc::StatusCode::CANCELLED, "cancelled before it started");
    if (!job.cancelled()) {
      std::unique_ptr<Call> call = StartChat(r->fields, Dump(r->chat), 0, nullptr);
      job.OnCancel([c = call.get()] { c->ctx.TryCancel(); });
      s = RunResponse(*r, *call, nullptr, *b);  // stores the finished response
      job.OnCancel(nullptr);                    // before `call` goes away
    }
    if (!s.ok()) {
      if (s.error_code() == grpc::StatusCode::CANCELLED && job.cancelled()) {
        b->Cancel();
      } else {
        b->Fail(ToResponsesError(FromHostStatus(s), *r));
      }
      responses_.Put(id, b->Snapshot(), nullptr, r->input_items);
    }
    // Last: a stream that ends finds the final object stored.
    if (events) events->Close();
  });
  if (!started) {
    responses_.Erase(id);
    ApiError e;
    if (stopping_) {
      e.http_status = 503;
      e.type = "server_error";
      e.message = "the server is shutting down";
      return Fail(res, e);
    }
    e.http_status = 429;
    e.type = "rate_limit_error";
    e.code = "too_many_background_responses";
    e.param = "background";
    e.message = "this server runs at most " + std::to_string(background_.max_jobs()) +
                " background responses at once (coli serve --max-background): wait for one to "
                "finish or cancel one";
    return Fail(res, e);
  }
  if (events) return FollowEvents(res, events, -1, watch);
  Reply(res, 200, object);
}

void Gateway::FollowEvents(Res& res, std::shared_ptr<const ResponseEventLog> events, int64_t after,
                           ConnectionWatch watch) {
  res.set_header("Cache-Control", "no-cache");
  res.set_chunked_content_provider(
      kEventStream, [this, events, after, watch](size_t, httplib::DataSink& sink) {
        ++streams_active_;
        int64_t cursor = after;
        std::vector<std::string> frames;
        bool gone = false;
        while (!gone && events->Next(&cursor, &frames) == ResponseEventLog::Read::kEvents) {
          for (const std::string& frame : frames) {
            if (stopping_ || watch.PeerClosed() || !sink.is_writable() ||
                !sink.write(frame.data(), frame.size())) {
              gone = true;
              break;
            }
          }
          frames.clear();
        }
        if (gone) ++disconnects_;  // the background response goes on
        --streams_active_;
        sink.done();
        return true;
      });
}

void Gateway::ResponseById(const Req& req, Res& res) {
  if (!Authorized(req, res)) return;
  const std::string id = req.matches[1];
  if (req.method == "DELETE") {
    background_.CancelAndWait(id);  // a background response still running stops first
    if (responses_.Erase(id)) {
      return Reply(res, 200, Json{{"id", id}, {"object", "response.deleted"}, {"deleted", true}});
    }
  } else if (std::optional<Json> found = responses_.Response(id)) {
    const std::string stream = req.get_param_value("stream");
    if (stream != "" && stream != "false" && stream != "true") {
      return Fail(res, BadField("stream", "stream must be true or false, got '" + stream + "'"));
    }
    if (stream != "true") return Reply(res, 200, *found);
    std::shared_ptr<const ResponseEventLog> events = responses_.Events(id);
    if (!events) {
      return Fail(res, BadField("stream", "response '" + id +
                                              "' cannot be streamed: only a response created "
                                              "with background: true and stream: true can"));
    }
    int64_t after = -1;
    if (req.has_param("starting_after")) {
      std::optional<int64_t> n = ParseStartingAfter(req.get_param_value("starting_after"));
      if (!n) {
        return Fail(res, BadField("starting_after",
                                  "starting_after must be a sequence number (an integer >= 0), "
                                  "got '" +
                                      req.get_param_value("starting_after") + "'"));
      }
      after = *n;
    }
    if (after + 1 < events->first_kept()) {
      return Fail(res, BadField("starting_after",
                                "the events before sequence number " +
                                    std::to_string(events->first_kept()) + " of response '" + id +
                                    "' are no longer kept (a response keeps its last " +
                                    std::to_string(events->max_bytes() >> 20) +
                                    " MiB of events): use starting_after >= " +
                                    std::to_string(events->first_kept() - 1)));
    }
    SendUncompressed(req);
    return FollowEvents(res, events, after,
                        ConnectionWatch(req.local_port, req.remote_addr, req.remote_port));
  }
  ResponseNotFound(res, id);
}

void Gateway::ResponseInputItems(const Req& req, Res& res) {
  if (!Authorized(req, res)) return;
  const std::string id = req.matches[1];
  std::optional<Json> items = responses_.InputItems(id);
  if (!items) return ResponseNotFound(res, id);
  ApiError error;
  std::optional<Json> page =
      ListInputItems(*items, req.get_param_value("limit"), req.get_param_value("order"),
                     req.get_param_value("after"), &error);
  if (!page) return Fail(res, error);
  Reply(res, 200, *page);
}

void Gateway::CancelResponse(const Req& req, Res& res) {
  if (!Authorized(req, res)) return;
  const std::string id = req.matches[1];
  std::optional<Json> found = responses_.Response(id);
  if (!found) return ResponseNotFound(res, id);
  if ((*found)["background"] != true) {
    return Fail(res, BadField("",
                              "Only responses created with background=true can be cancelled "
                              "(response '" +
                                  id + "' was not)"));
  }
  // Stops the generation within one token and waits for the job to record how it ended.
  background_.CancelAndWait(id);
  found = responses_.Response(id);  // as the job left it (it may have finished first)
  if (!found) return ResponseNotFound(res, id);
  const Json& status = (*found)["status"];
  if (status == "cancelled") return Reply(res, 200, *found);  // cancelling twice: the same
  Fail(res, BadField("", "Cannot cancel a response with status " + Dump(status) +
                             ": only a queued or in_progress background response can be "
                             "cancelled"));
}

void Gateway::ResponsesInputTokens(const Req& req, Res& res) {
  std::optional<ResponsesRequest> r = ResponsesBody(req, res);
  if (!r) return;
  grpc::ClientContext ctx;
  v1::ApplyTemplateRequest a;
  a.set_model(info_.id());
  a.set_request_json(Dump(r->chat));
  a.set_add_generation_prompt(true);
  v1::ApplyTemplateResponse out;
  grpc::Status s = stub_->ApplyTemplate(&ctx, a, &out);
  if (!s.ok()) return Fail(res, ToResponsesError(FromHostStatus(s), *r));
  Reply(res, 200, Json{{"object", "response.input_tokens"}, {"input_tokens", out.ids_size()}});
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
  res.set_content(ErrorBody(e), "application/json");
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

std::atomic<httplib::Server*> g_server{nullptr};

void Usage(bool web, FILE* out) {
  std::fprintf(
      out,
      web ? "usage: coli web [--model DIR] [--port 8000] [--host 127.0.0.1] [--api-key KEY]\n"
            "                [--connect ADDR] [--model-id ID] [--allow-origin ORIGIN]\n"
            "                [--http-threads N]\n"
            "  the chat page and the OpenAI API on one port; without --model (or\n"
            "  COLI_MODEL) the embedded tiny Kimi K3 fixture (random weights)\n"
          : "usage: coli serve --model DIR [--port 8000] [--host 127.0.0.1] [--api-key KEY]\n"
            "                  [--connect ADDR] [--model-id ID] [--max-background N]\n"
            "                  [--responses-dir DIR] [--allow-origin ORIGIN] [--http-threads N]\n");
  std::fprintf(
      out,
      "  --model DIR    the model folder (env COLI_MODEL)\n"
      "  --port N       TCP port, 0-65535 (0 = any free one, printed at start)\n"
      "  --host ADDR    listen address; anything but loopback requires --api-key\n"
      "  --api-key KEY  require 'Authorization: Bearer KEY' (env COLI_API_KEY)\n"
      "  --connect ADDR use a running coli-host instead of starting one\n"
      "  --model-id ID  the id the model is served as (default: its folder's name)\n"
      "  --max-background N  background /v1/responses running at once, 0-1024 (default 16)\n"
      "  --responses-dir DIR  keep finished stored /v1/responses in DIR, one file each,\n"
      "                 so they survive a restart (env COLI_RESPONSES_DIR; default:\n"
      "                 in memory only)\n"
      "  --allow-origin ORIGIN  let browser pages from ORIGIN (e.g. http://localhost:3000;\n"
      "                 '*' = any) call the API: CORS headers; repeatable. Default: none\n"
      "                 (same-origin only, as the `coli web` page is)\n"
      "  --http-threads N  HTTP connections served at once, open streams included, 4-4096\n"
      "                 (default 256; more wait for a free thread)\n"
      "  Flags take --flag VALUE or --flag=VALUE; usage errors exit 2.\n");
}

// The command line of `coli serve` / `coli web`, after the environment (flags win).
struct GatewayFlags {
  bool help = false;
  std::string model_dir, host = "127.0.0.1", api_key, connect, model_id, responses_dir;
  int port = 8000;
  size_t max_background = 16;
  size_t http_threads = 256;
  std::vector<std::string> allowed_origins;
};

// INVALID_ARGUMENT (NOT_FOUND, FAILED_PRECONDITION for a model folder that is missing, a file or
// unreadable) naming the flag and the value; a usage error either way.
absl::StatusOr<GatewayFlags> ParseGatewayFlags(int argc, char** argv, bool web) {
  GatewayFlags f;
  if (const char* k = std::getenv("COLI_API_KEY"); k && *k) f.api_key = k;
  if (const char* m = std::getenv("COLI_MODEL"); m && *m) f.model_dir = m;
  if (const char* d = std::getenv("COLI_RESPONSES_DIR"); d && *d) f.responses_dir = d;
  bool model_given = false;
  cli::ArgReader args(argc, argv);
  while (args.Next()) {
    if (args.Is("--model")) {
      COLI_ASSIGN_OR_RETURN(f.model_dir, args.Value());
      model_given = true;
    } else if (args.Is("--host")) {
      COLI_ASSIGN_OR_RETURN(f.host, args.NonEmptyValue("an address to listen on"));
    } else if (args.Is("--api-key")) {
      COLI_ASSIGN_OR_RETURN(f.api_key, args.NonEmptyValue("a key"));
    } else if (args.Is("--connect")) {
      COLI_ASSIGN_OR_RETURN(f.connect, args.Value());
      COLI_RETURN_IF_ERROR(cli::CheckGrpcAddress("--connect", f.connect, /*listening=*/false));
    } else if (args.Is("--model-id")) {
      COLI_ASSIGN_OR_RETURN(f.model_id, args.NonEmptyValue("an id"));
    } else if (args.Is("--responses-dir")) {
      COLI_ASSIGN_OR_RETURN(f.responses_dir, args.NonEmptyValue("a folder"));
    } else if (args.Is("--allow-origin")) {
      COLI_ASSIGN_OR_RETURN(const std::string v, args.Value());
      // An origin is scheme://host[:port] and nothing after (a browser's Origin header never
      // has a path or a trailing slash, so such a value could never match).
      const size_t scheme = v.find("://");
      if (v != "*" && (scheme == std::string::npos || scheme == 0 ||
                       v.find('/', scheme + 3) != std::string::npos || v.size() == scheme + 3)) {
        return absl::InvalidArgumentError(
            absl::StrCat("--allow-origin '", v, "' is not an origin (scheme://host[:port] or *)"));
      }
      f.allowed_origins.push_back(v);
    } else if (args.Is("--http-threads")) {
      COLI_ASSIGN_OR_RETURN(const int64_t n, args.Int(4, 4096));
      f.http_threads = static_cast<size_t>(n);
    } else if (args.Is("--port")) {
      COLI_ASSIGN_OR_RETURN(const int64_t n, args.Int(0, 65535));
      f.port = static_cast<int>(n);
    } else if (args.Is("--max-background")) {
      COLI_ASSIGN_OR_RETURN(const int64_t n, args.Int(0, 1024));
      f.max_background = static_cast<size_t>(n);
    } else if (args.Is("--help") || args.Is("-h")) {
      COLI_RETURN_IF_ERROR(args.NoValue());
      f.help = true;
    } else if (args.IsFlag()) {
      return args.Unknown();
    } else {
      return absl::InvalidArgumentError(absl::StrCat("unexpected argument '", args.arg(),
                                                     "' (the model is given with --model DIR)"));
    }
  }
  if (f.help) return f;
  if (model_given && f.model_dir.empty()) {  // `--model "$UNSET"`: never the fixture instead
    return absl::InvalidArgumentError("--model is empty: give a folder");
  }
  if (f.model_dir.empty() && f.connect.empty()) {
    if (!web) return absl::InvalidArgumentError("--model DIR is required (or COLI_MODEL)");
    f.model_dir = client::ResolveModelDir("");  // the embedded tiny model
  }
  // A private host reads the folder here; a --connect host resolves it on its own machine.
  if (!f.model_dir.empty() && f.connect.empty()) {
    const char* env = std::getenv("COLI_MODEL");
    const char* from = model_given                      ? "--model"
                       : env != nullptr && *env != '\0' ? "COLI_MODEL"
                                                        : "the embedded tiny model";
    COLI_RETURN_IF_ERROR(cli::CheckModelDir(from, f.model_dir));
  }
  return f;
}

// `coli serve` and `coli web` share everything but the page and the default model.
int RunGateway(int argc, char** argv, bool web) {
  const char* name = web ? "coli web" : "coli serve";
  absl::StatusOr<GatewayFlags> parsed = ParseGatewayFlags(argc, argv, web);
  if (!parsed.ok()) {
    std::fprintf(stderr, "%s: %s\n(%s --help lists the flags)\n", name,
                 std::string(parsed.status().message()).c_str(), name);
    return 2;
  }
  if (parsed->help) {
    Usage(web, stdout);
    return 0;
  }
  GatewayFlags& flags = *parsed;
  const std::string& model_dir = flags.model_dir;
  const std::string& host = flags.host;
  const std::string& api_key = flags.api_key;
  const std::string& connect = flags.connect;
  const std::string& model_id = flags.model_id;
  const int port = flags.port;
  std::vector<std::string>& allowed_origins = flags.allowed_origins;
  // Any web page reading the API is as wide as any host reaching it: it needs the key too.
  if (api_key.empty() &&
      std::find(allowed_origins.begin(), allowed_origins.end(), "*") != allowed_origins.end()) {
    std::fprintf(stderr,
                 "%s: --allow-origin '*' lets every web page use this server: refusing to serve "
                 "without --api-key\n",
                 name);
    return 2;
  }
  if (!IsLoopback(host) && api_key.empty()) {
    std::fprintf(stderr,
                 "%s: --host %s is not a loopback address: refusing to serve without "
                 "--api-key\n",
                 name, host.c_str());
    return 2;
  }
  std::unique_ptr<ResponseDir> stored_dir;  // before the host starts: a bad DIR fails fast
  if (!flags.responses_dir.empty()) {
    auto opened = ResponseDir::Open(flags.responses_dir);
    if (!opened.ok()) {
      std::fprintf(stderr, "%s: --responses-dir: %s\n", name,
                   std::string(opened.status().message()).c_str());
      return 1;
    }
    stored_dir = *std::move(opened);
  }
  signal(SIGPIPE, SIG_IGN);
  // SIGINT/SIGTERM stop the HTTP server (the host process is stopped by HostProcess). Blocked
  // before any thread starts (gRPC's, httplib's) so only the waiter below takes them.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  client::ConnectOptions connect_options;
  connect_options.host = connect;  // empty: a private coli-host, stopped with `client`
  auto client = client::Client::Connect(connect_options);
  if (!client.ok()) {
    std::fprintf(stderr, "%s: %s\n", name, std::string(client.status().message()).c_str());
    return 1;
  }
  v1::ModelInfo info;
  if (!model_dir.empty()) {
    auto options = client::ModelOptionsFromEnv();
    if (!options.ok()) {
      std::fprintf(stderr, "%s: %s\n", name, std::string(options.status().message()).c_str());
      return 1;
    }
    client::ProgressDisplay bar(stderr);
    auto loaded = (*client)->LoadModel(
        model_dir, *options, [&bar](const v1::LoadProgress& p) { bar.Update(p); }, model_id);
    bar.Done();
    if (!loaded.ok()) {
      std::fprintf(stderr, "%s: %s\n", name, std::string(loaded.status().message()).c_str());
      return 1;
    }
    info = *loaded;
  } else {
    auto models = (*client)->ListModels();
    if (!models.ok() || models->empty()) {
      std::fprintf(stderr, "%s: the host at %s has no model loaded\n", name, connect.c_str());
      return 1;
    }
    info = models->front();
    for (const auto& m : *models) {
      if (m.id() == model_id) info = m;
    }
  }

  httplib::Server server;
  // httplib's default pool is max(8, cores - 1) threads, and every open stream holds one: eight
  // streams made /health and every further request wait, and a burst never reached the host's
  // queue (which answers its excess with a 429). A thread waiting on the host costs no CPU.
  server.new_task_queue = [n = flags.http_threads] { return new httplib::ThreadPool(n); };
  Gateway gateway(&(*client)->stub(), info, api_key, web, flags.max_background,
                  std::move(stored_dir), std::move(allowed_origins));
  gateway.Register(&server);
  int bound = port;
  if (port == 0) {
    bound = server.bind_to_any_port(host);
  } else if (!server.bind_to_port(host, port)) {
    bound = -1;
  }
  if (bound < 0) {
    std::fprintf(stderr, "%s: cannot listen on %s:%d: %s\n", name, host.c_str(), port,
                 std::strerror(errno));
    return 1;
  }
  // One line on stdout that scripts and tests wait for.
  // An IPv6 address goes in brackets in a URL ("http://[::1]:8000").
  const std::string url_host =
      host.find(':') != std::string::npos && host.front() != '[' ? "[" + host + "]" : host;
  std::printf("%s: listening on http://%s:%d (model %s)\n", name, url_host.c_str(), bound,
              info.id().c_str());
  if (web) std::printf("%s: open http://%s:%d/ in a browser\n", name, url_host.c_str(), bound);
  std::fflush(stdout);

  g_server = &server;
  std::thread waiter([&signals, &gateway] {
    int sig = 0;
    sigwait(&signals, &sig);
    // Streams and background responses end first: the server's stop waits for its handlers.
    gateway.Shutdown();
    if (httplib::Server* s = g_server.load()) s->stop();
  });
  server.listen_after_bind();
  g_server = nullptr;
  gateway.Shutdown();  // background responses: cancelled and joined while the host still runs
  pthread_kill(waiter.native_handle(), SIGTERM);
  waiter.join();
  return 0;  // `client` stops the private host
}

}  // namespace

int RunServe(int argc, char** argv) { return RunGateway(argc, argv, /*web=*/false); }
int RunWeb(int argc, char** argv) { return RunGateway(argc, argv, /*web=*/true); }

}  // namespace coli::cli::serve

COLI_REGISTER_COMMAND(serve, "serve", "OpenAI-compatible HTTP API over the host (--model DIR)",
                      coli::cli::serve::RunServe);
COLI_REGISTER_COMMAND(web, "web", "chat page + OpenAI API in the browser (tiny model by default)",
                      coli::cli::serve::RunWeb);
