// POST /v1/messages and /v1/messages/count_tokens: Anthropic's Messages API over the chat path
// (serve_messages.h maps the request and writes the message or its events).
#include <string>

#include "tools/coli/serve_gateway.h"

namespace coli::cli::serve {

std::optional<MessagesRequest> Gateway::MessagesBody(const Req& req, Res& res, bool count_only) {
  Json body;
  if (!Authorized(req, res) || !Body(req, res, &body)) return std::nullopt;
  ApiError error;
  std::optional<MessagesRequest> r = ParseMessagesRequest(body, count_only, &error);
  if (!r) {
    Fail(res, error);
    return std::nullopt;
  }
  if (!ModelOk(r->fields.model, res)) return std::nullopt;
  return r;
}

void Gateway::Messages(const Req& req, Res& res) {
  MessagesReply(req, res);
  // The shared checks (authorization, body, model, the host's refusals) write OpenAI's error
  // object; Anthropic's SDKs read theirs.
  if (res.status >= 400 && !res.body.empty()) {
    res.body = AnthropicErrorBody(res.status, res.body);
  }
}

void Gateway::MessagesReply(const Req& req, Res& res) {
  std::optional<MessagesRequest> parsed = MessagesBody(req, res, /*count_only=*/false);
  if (!parsed) return;
  auto r = std::make_shared<const MessagesRequest>(std::move(*parsed));
  const std::string request_json = Dump(r->chat);
  const std::string id = NewId("msg_");
  const ConnectionWatch watch(req.local_port, req.remote_addr, req.remote_port);
  if (!r->fields.stream) {
    auto call = StartChat(r->fields, request_json, 0, &watch);
    ChoiceResult out;
    grpc::Status s =
        RunChoice(r->fields, *call, &out, nullptr, [this, &watch](const char*, const Json&) {
          return !stopping_ && !watch.PeerClosed();  // nothing is written until the end
        });
    if (s.error_code() == grpc::StatusCode::CANCELLED) return Abandoned(res, s, watch);
    if (!s.ok()) return Fail(res, FromHostStatus(s));
    return Reply(res, 200, MessageFromResult(id, info_.id(), std::move(out)));
  }
  // Streaming: read the first event before answering, so a refused request is a plain error.
  auto call = std::shared_ptr<Call>(StartChat(r->fields, request_json, 0, &watch));
  auto first = std::make_shared<v1::ChatEvent>();
  if (grpc::Status why; !ReadFirstEvent(*call->reader, first.get(), &why)) {
    if (why.error_code() == grpc::StatusCode::CANCELLED) return Abandoned(res, why, watch);
    return Fail(res, FromHostStatus(why));
  }
  SendUncompressed(req);
  res.set_header("Cache-Control", "no-cache");
  res.set_chunked_content_provider(
      kEventStream, [this, call, first, r, id, watch](size_t, httplib::DataSink& sink) {
        ++streams_active_;
        bool disconnected = false;  // counted after the stream leaves streams_active_
        bool last_event = false;  // the error event after the server's stop cut the stream
        auto alive = [this, &sink, &watch] {
          return !stopping_ && !watch.PeerClosed() && sink.is_writable();
        };
        MessageStream stream(id, info_.id(), [this, &sink, &watch, &last_event](const Json& e) {
          const std::string frame = SseEventFrame(e);
          return (!stopping_ || last_event) && !watch.PeerClosed() && sink.is_writable() &&
                 sink.write(frame.data(), frame.size());
        });
        // The host's Started event comes first: the prompt's size and what the host kept of it.
        int64_t prompt_tokens = 0, cached_tokens = 0;
        if (first->has_started()) {
          prompt_tokens = first->started().prompt_tokens();
          cached_tokens = first->started().tokens_reused();
        }
        ChoiceResult out;
        grpc::Status s(grpc::StatusCode::CANCELLED, "client disconnected");
        if (stream.Start(prompt_tokens, cached_tokens)) {
          s = RunChoice(r->fields, *call, &out, first.get(),
                        [&](const char* kind, const Json& payload) {
                          return alive() && stream.Delta(kind, payload);
                        });
        } else {
          call->ctx.TryCancel();
          call->reader->Finish();
        }
        if (s.ok()) {
          disconnected = !stream.Finish(out);
        } else if (s.error_code() == grpc::StatusCode::CANCELLED && CutByShutdown(watch, sink)) {
          last_event = true;
          stream.Fail(ShuttingDownError());
        } else if (s.error_code() == grpc::StatusCode::CANCELLED) {
          disconnected = true;
        } else {
          stream.Fail(FromHostStatus(s));
        }
        --streams_active_;
        // A metrics read that sees the disconnect also sees the stream closed.
        if (disconnected) ++disconnects_;
        sink.done();
        return true;
      });
}

void Gateway::MessagesCountTokens(const Req& req, Res& res) {
  std::optional<MessagesRequest> r = MessagesBody(req, res, /*count_only=*/true);
  if (r) {
    int64_t count = 0;
    if (grpc::Status s = CountPromptTokens(r->chat, &count); !s.ok()) {
      Fail(res, FromHostStatus(s));
    } else {
      Reply(res, 200, Json{{"input_tokens", count}});
    }
  }
  if (res.status >= 400 && !res.body.empty()) {
    res.body = AnthropicErrorBody(res.status, res.body);
  }
}

}  // namespace coli::cli::serve
