// tools/coli/serve_gateway: the `coli serve` gateway's class and the helpers its handlers share.
// The handlers live by endpoint family: serve_gateway.cc (authorization, bodies, routes, CORS,
// httplib's own errors, /v1/models, /tokenize, /detokenize, /apply-template, /health, /metrics),
// serve_chat.cc (/v1/chat/completions and the SSE writer), serve_completions.cc
// (/v1/completions), serve_responses_routes.cc (/v1/responses and its sub-resources); serve.cc
// holds the command line and the server's life.
#ifndef COLI_TOOLS_COLI_SERVE_GATEWAY_H_
#define COLI_TOOLS_COLI_SERVE_GATEWAY_H_

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "coli/v1/coli.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "host/model_options_env.h"
#include "httplib.h"
#include "tools/coli/reply_tail.h"
#include "tools/coli/serve_connection.h"
#include "tools/coli/serve_messages.h"
#include "tools/coli/serve_openai.h"
#include "tools/coli/serve_responses.h"
#include "tools/coli/serve_responses_background.h"
#include "tools/coli/serve_responses_disk.h"
#include "tools/coli/serve_responses_stream.h"

namespace coli::cli::serve {

inline int64_t NowSeconds() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

inline std::string Dump(const Json& j) {
  return j.dump(-1, ' ', false, Json::error_handler_t::replace);
}

// The type of every SSE answer. It names the charset: Python's requests (and other clients) read
// a text/* body without one as Latin-1, so `iter_lines(decode_unicode=True)` turned every
// non-ASCII character into mojibake (and U+0085 from a split character cut events short); vLLM
// and OpenAI send the charset too. See SendUncompressed.
inline constexpr char kEventStream[] = "text/event-stream; charset=utf-8";

// httplib 0.11 compresses every text/* answer but exactly "text/event-stream" when the client
// accepts gzip or br (curl --compressed, browsers, most SDKs), and its compressor holds the events
// back until the stream ends. So a request answered with a stream drops its Accept-Encoding: the
// events go out as they are made. httplib reads the header when it writes the answer, after the
// handler; the Request is its own non-const object, handed to handlers as const.
inline void SendUncompressed(const httplib::Request& req) {
  const_cast<httplib::Request&>(req).headers.erase("Accept-Encoding");
}

inline bool IsLoopback(const std::string& host) {
  return host == "localhost" || host == "::1" || host == "[::1]" || host.rfind("127.", 0) == 0;
}

// ---- the gateway ------------------------------------------------------------------------------

// `cached_tokens`: the prompt tokens whose state the host kept (Usage.tokens_reused), as OpenAI's
// always-present prompt_tokens_details (vLLM's with prefix caching and prompt-token details on),
// which clients read for cost and latency accounting. `reasoning_tokens` (chat completions):
// OpenAI's completion_tokens_details, which the Vercel AI SDK and LangChain read to split the
// output into reasoning and text.
inline Json UsageJson(int64_t prompt_tokens, int64_t completion_tokens, int64_t cached_tokens,
                      std::optional<int64_t> reasoning_tokens = std::nullopt) {
  Json usage{{"prompt_tokens", prompt_tokens},
             {"completion_tokens", completion_tokens},
             {"total_tokens", prompt_tokens + completion_tokens},
             {"prompt_tokens_details", {{"cached_tokens", cached_tokens}}}};
  if (reasoning_tokens) {
    usage["completion_tokens_details"] = {{"reasoning_tokens", *reasoning_tokens}};
  }
  return usage;
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
inline Json PromptProgress(const v1::PrefillProgress& p) {
  Json j;
  j["total"] = p.total();
  j["cache"] = p.reused();
  j["processed"] = p.done();
  j["time_ms"] = p.elapsed_ms();
  return j;
}

// The events of one host call that carries n > 1 choices (GenerateRequest.n / ChatRequest.n),
// split by choice so each is read as if it were a call of its own (RunChoice, RunCompletion):
// a reader thread queues Started and PromptLogprobs for every choice, PrefillProgress for
// choice 0, each token for its `choice`, and each ChoiceFinished as that choice's Finished (its
// reason and tokens, the prompt's usage). The host's last Finished adds nothing then.
template <typename Event>
class ChoiceFeed {
 public:
  explicit ChoiceFeed(int n) : choices_(static_cast<size_t>(n)) {}
  ~ChoiceFeed() {
    guard = ConnectionMonitor::Guard();
    if (reader_thread_.joinable()) {
      ctx.TryCancel();  // a no-op once the call ended
      reader_thread_.join();
    }
  }
  ChoiceFeed(const ChoiceFeed&) = delete;
  ChoiceFeed& operator=(const ChoiceFeed&) = delete;

  // Starts reading `reader` (the call made with ctx).
  void Start(std::unique_ptr<grpc::ClientReader<Event>> reader) {
    reader_ = std::move(reader);
    reader_thread_ = std::thread([this] { ReadAll(); });
  }
  // The next event of `choice`; false once it has none left.
  bool Read(int choice, Event* ev) {
    std::unique_lock<std::mutex> lock(mu_);
    Queue& q = choices_[static_cast<size_t>(choice)];
    cv_.wait(lock, [&] { return !q.events.empty() || q.finished || done_; });
    if (q.events.empty()) return false;
    *ev = std::move(q.events.front());
    q.events.pop_front();
    return true;
  }
  // How `choice` ended: OK when the host finished it, else the call's status (waits for it).
  grpc::Status Finish(int choice) {
    std::unique_lock<std::mutex> lock(mu_);
    const Queue& q = choices_[static_cast<size_t>(choice)];
    cv_.wait(lock, [&] { return q.finished || done_; });
    if (q.finished) return grpc::Status::OK;
    if (status_.ok()) {  // never a silent empty choice
      return grpc::Status(grpc::StatusCode::INTERNAL,
                          "the host ended the request without ending choice " +
                              std::to_string(choice) + " (a coli-host without n > 1 support?)");
    }
    return status_;
  }

  grpc::ClientContext ctx;
  ConnectionMonitor::Guard guard;  // unwatched first in the destructor

 private:
  struct Queue {
    std::deque<Event> events;
    bool finished = false;  // its ChoiceFinished came (queued as a Finished)
  };
  static const v1::Token& TokenOf(const v1::GenerateEvent& e) { return e.token(); }
  static const v1::Token& TokenOf(const v1::ChatEvent& e) { return e.token().token(); }
  void ReadAll() {
    Event ev;
    v1::Usage prompt_usage;
    while (reader_->Read(&ev)) {
      std::lock_guard<std::mutex> lock(mu_);
      if (ev.has_started()) {
        prompt_usage.set_prompt_tokens(ev.started().prompt_tokens());
        prompt_usage.set_tokens_reused(ev.started().tokens_reused());
        prompt_usage.set_tokens_computed(ev.started().tokens_computed());
        for (Queue& q : choices_) q.events.push_back(ev);
      } else if (ev.has_progress()) {
        choices_[0].events.push_back(ev);
      } else if (ev.has_token()) {
        const size_t choice = static_cast<size_t>(TokenOf(ev).choice());
        if (choice < choices_.size()) choices_[choice].events.push_back(ev);
      } else if (ev.has_choice_finished()) {
        const v1::ChoiceFinished& c = ev.choice_finished();
        const size_t choice = static_cast<size_t>(c.choice());
        if (choice >= choices_.size()) continue;
        Event end;
        end.mutable_finished()->set_reason(c.reason());
        *end.mutable_finished()->mutable_usage() = prompt_usage;
        end.mutable_finished()->mutable_usage()->set_completion_tokens(c.completion_tokens());
        choices_[choice].events.push_back(std::move(end));
        choices_[choice].finished = true;
      } else if (!ev.has_finished()) {
        for (Queue& q : choices_) q.events.push_back(ev);  // the prompt's logprobs
      }
      cv_.notify_all();
    }
    grpc::Status status = reader_->Finish();
    std::lock_guard<std::mutex> lock(mu_);
    status_ = std::move(status);
    done_ = true;
    cv_.notify_all();
  }

  std::unique_ptr<grpc::ClientReader<Event>> reader_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Queue> choices_;
  bool done_ = false;
  grpc::Status status_;
  std::thread reader_thread_;
};

// A logprob entry's `token` as OpenAI writes it: the token's text, or "bytes:\xe4\xbd" for a
// token whose bytes are not UTF-8 on their own (serve_chat.cc).
std::string LogprobTokenText(const std::string& bytes);

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
    first_special_ = client::FirstSpecialId(info_);
  }

  void Register(httplib::Server* server);
  // The chat-request defaults of the environment (ABI 1.10 switches such as K3_THINK, e.g.
  // {"enable_thinking": false}): put into each chat request that does not set the field.
  void set_request_defaults(nlohmann::json defaults) { request_defaults_ = std::move(defaults); }
  // More names a request may give for the model (--served-model-name); replies name its id.
  void set_model_aliases(std::vector<std::string> aliases) { aliases_ = std::move(aliases); }
  // The methods `path` takes ("" when no endpoint has that path), for Allow and 405.
  std::vector<std::string> MethodsFor(const std::string& path) const;
  // Ends every stream at its next token or event (their clients are treated as gone), cancels
  // every host call a client waits on, cancels the background responses and joins their
  // threads (which ends the streams that follow them). Called when the server is told to stop,
  // before the HTTP server waits for its handlers, and again after (a no-op then); the host is
  // still up.
  void Shutdown() {
    stopping_ = true;
    monitor_.CancelAll();  // host calls still queued or in a prefill end now, not at a token
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
    Fail(res, ShuttingDownError());
  }
  // What a request the server's stop cut short gets: a 503, or in a stream that already began
  // an error frame (chat / completions) or response.failed (Responses).
  static ApiError ShuttingDownError() {
    ApiError e;
    e.http_status = 503;
    e.type = "server_error";
    e.message = "the server is shutting down";
    return e;
  }
  // A stream that ended because the server stops while its client still reads: it must say so
  // (an SSE stream that just ends reads as a whole reply without a finish_reason).
  bool CutByShutdown(const ConnectionWatch& client, httplib::DataSink& sink) const {
    return stopping_ && !client.PeerClosed() && sink.is_writable();
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
  // How many tokens the model reads for chat body `chat` (rendered by the host, the assistant's
  // turn opened): /v1/responses/input_tokens and /v1/messages/count_tokens.
  grpc::Status CountPromptTokens(const Json& chat, int64_t* count);
  // /v1/messages and /v1/messages/count_tokens (serve_messages.h): Anthropic's Messages API,
  // errors in Anthropic's shape (MessagesReply writes OpenAI's; Messages converts them).
  void Messages(const Req& req, Res& res);
  void MessagesReply(const Req& req, Res& res);
  void MessagesCountTokens(const Req& req, Res& res);
  // Authorizes, parses and maps a /v1/messages body (nullopt: the error is answered).
  std::optional<MessagesRequest> MessagesBody(const Req& req, Res& res, bool count_only);
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
    s->set_min_tokens(f.min_tokens);
    for (int32_t id : f.stop_token_ids) s->add_stop_token_ids(id);
    s->set_ignore_eos(f.ignore_eos);
    for (const auto& [id, bias] : f.logit_bias) {
      auto* entry = s->add_logit_bias();
      entry->set_id(id);
      entry->set_bias(bias);
    }
  }
  Json LogprobEntry(const v1::Token& token, int top) const;

  // One host Chat call (one choice), or one choice of an n > 1 call (`feed`).
  struct Call {
    grpc::ClientContext ctx;
    std::unique_ptr<grpc::ClientReader<v1::ChatEvent>> reader;
    std::string request_id;
    std::shared_ptr<ChoiceFeed<v1::ChatEvent>> feed;  // set: ctx and reader are unused
    int choice = 0;
    ConnectionMonitor::Guard guard;  // last: unwatched before ctx goes away
    bool Read(v1::ChatEvent* ev) { return feed ? feed->Read(choice, ev) : reader->Read(ev); }
    grpc::Status Finish() { return feed ? feed->Finish(choice) : reader->Finish(); }
    void TryCancel() { feed ? feed->ctx.TryCancel() : ctx.TryCancel(); }  // all choices
  };
  using DeltaFn = std::function<bool(const char* kind, const Json& payload)>;
  // `client` (nullptr for a background response): the connection whose loss cancels the call —
  // while it waits in the host's queue and in its prefill too.
  // `prompt_logprobs` >= 0 also asks the rendered prompt's logprobs with that many alternatives
  // (from the same prefill; RunChoice collects them).
  std::unique_ptr<Call> StartChat(const SamplingFields& f, const std::string& request_json,
                                  int choice, const ConnectionWatch* client,
                                  int32_t prompt_logprobs = -1);
  // f.n > 1: ONE host call carrying the n choices (one prefill, n decode rows), a Call per choice.
  // `prompt_logprobs` as StartChat's (their entries come with choice 0's).
  std::vector<std::shared_ptr<Call>> StartChatChoices(const SamplingFields& f,
                                                      const std::string& request_json,
                                                      const ConnectionWatch* client,
                                                      int32_t prompt_logprobs = -1);
  // The host request of StartChat / StartChatChoices, but for its sampling and n.
  v1::ChatRequest ChatRequestFor(const SamplingFields& f, const std::string& request_json,
                                 int32_t prompt_logprobs) const;
  // A call per choice of `feed` (started), which the loss of `client` cancels as a whole.
  template <typename CallT, typename Event>
  std::vector<std::shared_ptr<CallT>> CallsPerChoice(std::shared_ptr<ChoiceFeed<Event>> feed, int n,
                                                     const ConnectionWatch* client) {
    if (client) {
      feed->guard = monitor_.Watch(*client, [c = feed.get()] { c->ctx.TryCancel(); });
    }
    std::vector<std::shared_ptr<CallT>> calls;
    for (int i = 0; i < n; ++i) {
      auto call = std::make_shared<CallT>();
      call->feed = feed;
      call->choice = i;
      calls.push_back(std::move(call));
    }
    return calls;
  }
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
    bool continuous_usage = false;          // stream_options.continuous_usage_stats (vLLM's)
    // A frame with one choice ("usage": null too when the request asked for the usage frame;
    // with continuous_usage the usage so far: the prompt's tokens and the choice's).
    Json Frame(Json choice, int64_t prompt_tokens = 0, int64_t completion_tokens = 0) const {
      Json c = header;
      c["choices"] = Json::array({std::move(choice)});
      if (continuous_usage) {
        c["usage"] = Json{{"prompt_tokens", prompt_tokens},
                          {"completion_tokens", completion_tokens},
                          {"total_tokens", prompt_tokens + completion_tokens}};
      } else if (include_usage) {
        c["usage"] = nullptr;
      }
      return c;
    }
    // This sink for several threads at once (the choices of one stream): one frame at a time,
    // under `mu`. It refers to this sink and `mu`, which must outlive it.
    SseSink Serialized(std::mutex& mu) const {
      SseSink sse = *this;
      sse.send = [this, &mu](const Json& j) {
        std::lock_guard<std::mutex> lock(mu);
        return send(j);
      };
      sse.alive = [this, &mu] {
        std::lock_guard<std::mutex> lock(mu);
        return alive();
      };
      return sse;
    }
  };
  struct StreamEnd {
    int64_t prompt_tokens = 0, completion_tokens = 0;
    int64_t cached_tokens = 0;  // of prompt_tokens, reused (prompt_tokens_details)
    // Chat completions: the usage's completion_tokens_details.reasoning_tokens.
    std::optional<int64_t> reasoning_tokens;
    bool gone = false;  // the client went away
  };
  // Answers with an SSE stream: `body` sends the choices' frames and says how it ended; then,
  // unless the client went away, the usage frame (include_usage) and `data: [DONE]`.
  void StreamSse(Res& res, ConnectionWatch watch, Json header, bool include_usage,
                 bool continuous_usage, std::function<StreamEnd(const SseSink&)> body);
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

  // One host Generate call (one /v1/completions choice), or one choice of an n > 1 call.
  struct GenerateCall {
    grpc::ClientContext ctx;
    std::unique_ptr<grpc::ClientReader<v1::GenerateEvent>> reader;
    std::string request_id;
    std::shared_ptr<ChoiceFeed<v1::GenerateEvent>> feed;  // set: ctx and reader are unused
    int choice = 0;
    ConnectionMonitor::Guard guard;  // last: unwatched before ctx goes away
    bool Read(v1::GenerateEvent* ev) { return feed ? feed->Read(choice, ev) : reader->Read(ev); }
    grpc::Status Finish() { return feed ? feed->Finish(choice) : reader->Finish(); }
    void TryCancel() { feed ? feed->ctx.TryCancel() : ctx.TryCancel(); }  // all choices
  };
  struct CompletionResult {
    std::string text, finish_reason;
    int64_t cached_tokens = 0;  // prompt tokens the host reused (Usage.tokens_reused)
    Json tokens = Json::array(), token_logprobs = Json::array(), top_logprobs = Json::array();
    Json text_offset = Json::array();
    // Where text_offset counts from: OpenAI's offsets index the prompt followed by the completion
    // (the first token of a reply to "Hello" is at 5, echo or not); vLLM's start at 0.
    int64_t offset_base = 0;
    int64_t prompt_tokens = 0, completion_tokens = 0;
    // echo: the prompt's text and its tokens' logprob entries (the first token's text; then
    // the host's PromptLogprobs for tokens 1…, gathered by the choice that asked for them).
    const std::string* echo_text = nullptr;
    std::string first_token_text;
    std::vector<v1::TokenLogprobs> prompt_entries;
    const std::vector<v1::TokenLogprobs>* echo_entries = nullptr;  // used when set, else own
  };
  // `prompt_logprobs` >= 0: the host also sends the prompt tokens' logprobs with that many top
  // alternatives.
  // `n` > 1: ONE host call carrying n choices; the first result's `feed` holds it (see
  // GenerateChoices).
  std::unique_ptr<GenerateCall> StartGenerate(const SamplingFields& f,
                                              const CompletionPrompt& prompt, int choice,
                                              const ConnectionWatch* client,
                                              int32_t prompt_logprobs = -1);
  // f.n > 1: one host Generate call for the n choices of `prompt`, a GenerateCall per choice.
  std::vector<std::shared_ptr<GenerateCall>> StartGenerateChoices(const SamplingFields& f,
                                                                  const CompletionPrompt& prompt,
                                                                  const ConnectionWatch* client,
                                                                  int32_t prompt_logprobs);
  // The host request of StartGenerate / StartGenerateChoices, but for its sampling and n.
  v1::GenerateRequest GenerateRequestFor(const SamplingFields& f, const CompletionPrompt& prompt,
                                         int32_t prompt_logprobs) const;
  // echo: the prompt's text (ids detokenized) and, with logprobs, its token ids (text tokenized
  // as the host would) and the first token's text; a host error as it would fail the request.
  grpc::Status PrepareEcho(const SamplingFields& f, CompletionPrompt* prompt,
                           std::string* first_token_text);
  // vLLM's prompt_logprobs asks the host for this many alternatives whatever its k: a plugin older
  // than ABI 1.9 reports no rank, and the prompt token's rank (how many tokens are at least as
  // likely, vLLM's count) is then known from them whenever the token is among them.
  static constexpr int32_t kRankDepth = 20;
  // Chat's prompt_logprobs: the rendered prompt's entries, read by a prompt-only Generate of its
  // ids (the Chat call has no prompt logprobs; the prompt is read twice).
  // Reads one completion choice to its end; `on_piece` sees "progress" (prompt_progress JSON),
  // "text" ({"text", optional "logprobs"} per token) and "tick" (a token that showed nothing)
  // and returns false to cancel.
  grpc::Status RunCompletion(const SamplingFields& f, GenerateCall& call, CompletionResult* out,
                             const v1::GenerateEvent* first, const DeltaFn& on_piece);
  static std::string FinishReason(v1::FinishReason r, bool tool_calls, bool stopped);
  // U+FFFD when the bytes of a reply's last tokens end inside a character, else "" (the reply
  // then stays as it was when the host cannot say): client::ReplyTail.
  std::string CutCharacter(const client::ReplyTail& tail);
  client::ReplyTail NewReplyTail() const { return client::ReplyTail(first_special_); }
  // A stop sequence matched: STOP the host's request (it finishes normally, reason STOPPED), or
  // only its choice `choice` (>= 0) of an n > 1 request.
  void StopAtHost(const std::string& request_id, int choice = -1) {
    v1::CancelRequest c;
    c.set_request_id(request_id);
    c.set_stop(true);
    if (choice >= 0) c.set_choice(choice);
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
  nlohmann::json request_defaults_ = nlohmann::json::object();
  std::vector<std::string> aliases_;  // --served-model-name

  std::mutex mu_;
  std::map<int, uint64_t> http_by_status_;
  std::atomic<int> streams_active_{0};
  std::atomic<uint64_t> disconnects_{0};
  std::atomic<bool> stopping_{false};  // Shutdown has begun: streams end
  ResponseStore responses_;            // stored /v1/responses results (previous_response_id, GET)
  // Last: destroyed first, so its threads are joined while everything they use still exists.
  BackgroundJobs background_;
};

}  // namespace coli::cli::serve

#endif  // COLI_TOOLS_COLI_SERVE_GATEWAY_H_
