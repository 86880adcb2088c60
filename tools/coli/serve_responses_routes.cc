// /v1/responses over the chat path (serve_responses.h maps the request and builds the
// response): create (stored, streamed, background), GET / DELETE by id, input_items, cancel,
// input_tokens.
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status/status.h"
#include "tools/coli/serve_gateway.h"

namespace coli::cli::serve {

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
  host::ApplyRequestDefaults(request_defaults_, &r->chat);
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
        bool disconnected = false;  // counted after the stream leaves streams_active_
        ResponseBuilder::Sink events;
        bool last_event = false;  // response.failed after the server's stop cut the stream
        events.send = [this, &sink, &watch, &last_event](const Json& e) {
          const std::string frame = SseEventFrame(e);
          return (!stopping_ || last_event) && !watch.PeerClosed() && sink.is_writable() &&
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
        if (s.error_code() == grpc::StatusCode::CANCELLED && CutByShutdown(watch, sink)) {
          last_event = true;
          b.Fail(ShuttingDownError());
        } else if (s.error_code() == grpc::StatusCode::CANCELLED) {
          disconnected = true;
        } else if (!s.ok()) {
          b.Fail(FromHostStatus(s));
        }
        --streams_active_;
        // A metrics read that sees the disconnect also sees the stream closed.
        if (disconnected) ++disconnects_;
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
    if (stopping_) return Fail(res, ShuttingDownError());
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
        bool disconnected = false;  // counted after the stream leaves streams_active_
        int64_t cursor = after;
        std::vector<std::string> frames;
        bool gone = false, ended = false;  // ended: a terminal event went out
        while (!gone) {
          // A response waiting in the host's queue or in a long prefill sends nothing for a
          // while: the client is checked meanwhile, else one that left held its HTTP thread and
          // socket until the next event (every thread, with clients that retry).
          const ResponseEventLog::Read read =
              events->Next(&cursor, &frames, std::chrono::milliseconds(100));
          if (read == ResponseEventLog::Read::kWaiting) {
            gone = stopping_ || watch.PeerClosed();
            continue;
          }
          if (read != ResponseEventLog::Read::kEvents) break;
          for (const std::string& frame : frames) {
            if (stopping_ || watch.PeerClosed() || !sink.is_writable() ||
                !sink.write(frame.data(), frame.size())) {
              gone = true;
              break;
            }
            for (const char* terminal : {"event: response.completed\n",
                                         "event: response.incomplete\n",
                                         "event: response.failed\n", "event: error\n"}) {
              ended = ended || frame.rfind(terminal, 0) == 0;
            }
          }
          frames.clear();
        }
        if (!ended && CutByShutdown(watch, sink)) {
          // The server stops and cancels the response: a stream that just ended would leave its
          // client waiting for a terminal event. Responses' `error` event says why.
          const ApiError e = ShuttingDownError();
          const std::string frame = SseEventFrame(Json{{"type", "error"},
                                                       {"code", "server_error"},
                                                       {"message", e.message},
                                                       {"param", nullptr},
                                                       {"sequence_number", cursor + 1}});
          sink.write(frame.data(), frame.size());
        } else if (gone) {
          disconnected = true;  // the background response goes on
        }
        --streams_active_;
        // A metrics read that sees the disconnect also sees the stream closed.
        if (disconnected) ++disconnects_;
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
  int64_t count = 0;
  grpc::Status s = CountPromptTokens(r->chat, &count);
  if (!s.ok()) return Fail(res, ToResponsesError(FromHostStatus(s), *r));
  Reply(res, 200, Json{{"object", "response.input_tokens"}, {"input_tokens", count}});
}

}  // namespace coli::cli::serve
