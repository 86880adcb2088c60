// POST /v1/chat/completions: one host Chat call carrying the request's n choices, answered
// whole or as an SSE stream (StreamSse, which /v1/completions shares).
#include <cstdio>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status/status.h"
#include "tools/coli/cli_args.h"
#include "tools/coli/serve_gateway.h"

namespace coli::cli::serve {

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

namespace {

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

}  // namespace

v1::ChatRequest Gateway::ChatRequestFor(const SamplingFields& f, const std::string& request_json,
                                        int32_t prompt_logprobs) const {
  v1::ChatRequest r;
  r.set_model(info_.id());
  r.set_request_json(request_json);
  r.set_max_tokens(f.max_tokens);
  r.set_truncate_prompt_tokens(f.truncate_prompt_tokens);
  r.set_report_progress(f.stream && f.return_progress);
  if (prompt_logprobs >= 0) r.set_prompt_logprobs(prompt_logprobs);
  return r;
}

std::unique_ptr<Gateway::Call> Gateway::StartChat(const SamplingFields& f,
                                                  const std::string& request_json, int choice,
                                                  const ConnectionWatch* client,
                                                  int32_t prompt_logprobs) {
  auto call = std::make_unique<Call>();
  v1::ChatRequest r = ChatRequestFor(f, request_json, prompt_logprobs);
  FillSampling(f, choice, r.mutable_sampling());
  call->reader = stub_->Chat(&call->ctx, r);
  if (client) call->guard = monitor_.Watch(*client, [c = call.get()] { c->ctx.TryCancel(); });
  return call;
}

std::vector<std::shared_ptr<Gateway::Call>> Gateway::StartChatChoices(
    const SamplingFields& f, const std::string& request_json, const ConnectionWatch* client,
    int32_t prompt_logprobs) {
  auto feed = std::make_shared<ChoiceFeed<v1::ChatEvent>>(f.n);
  v1::ChatRequest r = ChatRequestFor(f, request_json, prompt_logprobs);
  r.set_n(f.n);
  FillSampling(f, 0, r.mutable_sampling());  // the host gives choice i seed + i
  feed->Start(stub_->Chat(&feed->ctx, r));
  return CallsPerChoice<Call>(std::move(feed), f.n, client);
}

grpc::Status Gateway::RunChoice(const SamplingFields& f, Call& call, ChoiceResult* out,
                                const v1::ChatEvent* first, const DeltaFn& on_delta) {
  StopFilter stop(f.stop, f.include_stop_str);
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
  // The last tokens since the last special one (CutCharacter), and the channel of the text they
  // continue (NONE after a special token or a tool call: where their bytes go is the model's
  // parser's business, and the gateway does not guess it).
  client::ReplyTail last_tokens = NewReplyTail();
  v1::Channel tail_channel = v1::CHANNEL_NONE;
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
      call.TryCancel();
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
  while (have || call.Read(&ev)) {
    have = false;
    if (ev.has_progress()) {
      emit("progress", PromptProgress(ev.progress()));
    } else if (ev.has_started()) {
      call.request_id = ev.started().request_id();
      out->prompt_tokens = ev.started().prompt_tokens();
    } else if (ev.has_prompt_logprobs()) {
      for (const v1::TokenLogprobs& e : ev.prompt_logprobs().tokens()) {
        out->prompt_entries.push_back(e);
      }
    } else if (ev.has_token() && !stopped) {  // tokens after a stop string are not the reply's
      const v1::ChatToken& t = ev.token();
      ++out->completion_tokens;
      const int64_t emitted_before = emitted;
      bool showed_content = false, showed_other = false;
      // Content the stop filter let through, and whether a stop string ended the reply here.
      bool visible_content = false, stopped_here = false;
      for (const v1::ChatDelta& d : t.deltas()) {
        if (d.text().empty() &&
            (d.channel() == v1::CHANNEL_REASONING || d.channel() == v1::CHANNEL_CONTENT)) {
          // Nothing to show yet: the channel holds the first bytes of a character.
          tail_channel = d.channel();
        } else if (d.channel() == v1::CHANNEL_REASONING && !d.text().empty()) {
          showed_other = true;
          tail_channel = v1::CHANNEL_REASONING;
          out->reasoning += d.text();
          out->reasoning_tokens = out->completion_tokens;
          emit("reasoning", d.text());
        } else if (d.channel() == v1::CHANNEL_CONTENT && !d.text().empty()) {
          showed_content = true;
          tail_channel = v1::CHANNEL_CONTENT;
          if (stopped) continue;
          std::string visible = stop.Push(d.text());
          out->content += visible;
          visible_content = visible_content || !visible.empty();
          if (!visible.empty()) emit("content", visible);
          if (stop.stopped()) {
            stopped = stopped_here = true;
            StopAtHost(call.request_id, call.feed ? call.choice : -1);
          }
        } else if (d.channel() == v1::CHANNEL_TOOL_CALL_DELTA) {
          showed_other = true;
          tail_channel = v1::CHANNEL_NONE;
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
          tail_channel = v1::CHANNEL_NONE;
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
      last_tokens.Push(t.token().id());
      if (last_tokens.empty()) tail_channel = v1::CHANNEL_NONE;  // a special token
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
      // After a stop string the host goes on until STOP reaches it, a token or two more or none
      // depending on timing: the usage counts the tokens up to the one that completed the stop
      // string (as vLLM does), so it never depends on what else is running.
      if (!stopped) out->completion_tokens = ev.finished().usage().completion_tokens();
      out->cached_tokens = ev.finished().usage().tokens_reused();
    }
  }
  grpc::Status status = call.Finish();
  // A model stop token made the host's parser flush; any other end may cut a character.
  if (!stopped && !cancelled && status.ok() && reason != v1::FINISH_REASON_STOP &&
      reason != v1::FINISH_REASON_TOOL_CALLS && tail_channel != v1::CHANNEL_NONE) {
    if (const std::string cut = CutCharacter(last_tokens); !cut.empty()) {
      if (tail_channel == v1::CHANNEL_REASONING) {
        out->reasoning += cut;
        emit("reasoning", cut);
      } else {
        const std::string visible = stop.Push(cut);
        out->content += visible;
        if (!visible.empty()) emit("content", visible);
        stopped = stop.stopped();
      }
    }
  }
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
  if (stopped) out->stop_sequence = stop.matched();
  out->context_full = !stopped && reason == v1::FINISH_REASON_CONTEXT;
  // Cut by max_tokens inside the reasoning: the tokens after its last shown text (parts of a
  // character) are reasoning too; nothing was output yet.
  if (out->finish_reason == "length" && !out->reasoning.empty() && out->content.empty() &&
      out->tool_calls.empty()) {
    out->reasoning_tokens = out->completion_tokens;
  }
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
  // vLLM's guided_json / structured_outputs.json: the model family enforces the body's
  // response_format.
  if (!f->response_format.empty()) body["response_format"] = Json::parse(f->response_format);
  host::ApplyRequestDefaults(request_defaults_, &body);
  const std::string request_json = Dump(body);
  const ConnectionWatch watch(req.local_port, req.remote_addr, req.remote_port);

  if (!f->stream) {
    std::vector<ChoiceResult> results(f->n);
    // Nothing is written until the end: each token checks that the client still waits.
    auto alive = [this, &watch](const char*, const Json&) {
      return !stopping_ && !watch.PeerClosed();
    };
    // vLLM's prompt_logprobs come with the answer, from the prefill that serves it.
    const int32_t prompt_logprobs = f->prompt_logprobs >= 0 ? kRankDepth : -1;
    if (f->n == 1) {
      auto call = StartChat(*f, request_json, 0, &watch, prompt_logprobs);
      grpc::Status s = RunChoice(*f, *call, &results[0], nullptr, alive);
      if (s.error_code() == grpc::StatusCode::CANCELLED) return Abandoned(res, s, watch);
      if (!s.ok()) return Fail(res, FromHostStatus(s));
    } else {
      // One host call, the choices read side by side (each stop string stops its own choice
      // at once).
      auto calls = StartChatChoices(*f, request_json, &watch, prompt_logprobs);
      std::vector<grpc::Status> statuses(f->n);
      std::vector<std::thread> readers;
      for (int i = 0; i < f->n; ++i) {
        readers.emplace_back(
            [&, i] { statuses[i] = RunChoice(*f, *calls[i], &results[i], nullptr, alive); });
      }
      for (std::thread& t : readers) t.join();
      for (const grpc::Status& s : statuses) {
        if (s.error_code() == grpc::StatusCode::CANCELLED) return Abandoned(res, s, watch);
      }
      for (const grpc::Status& s : statuses) {
        if (!s.ok()) return Fail(res, FromHostStatus(s));
      }
    }
    const std::vector<v1::TokenLogprobs>& prompt_entries = results[0].prompt_entries;
    if (f->prompt_logprobs >= 0 &&
        static_cast<int64_t>(prompt_entries.size()) != results[0].prompt_tokens - 1) {
      // A host older than ChatRequest.prompt_logprobs ignores the field.
      return Fail(
          res, ApiError{500,
                        absl::StrCat("the host sent ", prompt_entries.size(),
                                     " prompt logprobs for a prompt of ", results[0].prompt_tokens,
                                     " tokens (a coli-host older than chat "
                                     "prompt_logprobs?)"),
                        "server_error", "prompt_logprobs", ""});
    }
    Json out;
    out["id"] = id;
    out["object"] = "chat.completion";
    out["created"] = created;
    out["model"] = info_.id();
    out["choices"] = Json::array();
    int64_t completion = 0, reasoning = 0;
    for (int i = 0; i < f->n; ++i) {
      ChoiceResult& r = results[i];
      // The think-skip fallback re-sends the answer as content: it is not reasoning then.
      if (!r.content.empty() && r.content == r.reasoning) {
        r.reasoning.clear();
        r.reasoning_tokens = 0;
      }
      reasoning += r.reasoning_tokens;
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
    out["usage"] =
        UsageJson(results[0].prompt_tokens, completion, results[0].cached_tokens, reasoning);
    // vLLM puts the (rendered) prompt's logprobs beside the choices.
    if (f->prompt_logprobs >= 0) {
      out["prompt_logprobs"] =
          VllmPromptLogprobs(prompt_entries, f->prompt_logprobs, info_.vocab_size());
    }
    Reply(res, 200, out);
    return;
  }

  // Streaming: read the first event before answering, so a refused request is a plain 400.
  // n > 1: one host call whose choices stream side by side, their chunks interleaved (each
  // names its `index`, as OpenAI's).
  auto calls = std::make_shared<std::vector<std::shared_ptr<Call>>>(
      f->n == 1 ? std::vector<std::shared_ptr<Call>>{std::shared_ptr<Call>(
                      StartChat(*f, request_json, 0, &watch))}
                : StartChatChoices(*f, request_json, &watch));
  auto first = std::make_shared<v1::ChatEvent>();
  if (!(*calls)[0]->Read(first.get())) {
    grpc::Status why = (*calls)[0]->Finish();
    if (why.ok()) why = grpc::Status(grpc::StatusCode::INTERNAL, "host ended the stream early");
    if (why.error_code() == grpc::StatusCode::CANCELLED) return Abandoned(res, why, watch);
    return Fail(res, FromHostStatus(why));
  }
  auto fields = std::make_shared<SamplingFields>(*f);
  SendUncompressed(req);
  StreamSse(
      res, watch, Header(id, "chat.completion.chunk", created), f->include_usage,
      f->continuous_usage, [this, calls, first, fields](const SseSink& unlocked) {
        // The choices' threads share the stream: one frame at a time.
        std::mutex frame_mu;
        const SseSink sse = unlocked.Serialized(frame_mu);
        const int n = fields->n;
        std::vector<StreamEnd> ends(n);
        std::vector<ChoiceResult> results(n);
        // The prompt's size from the host's first event (Started), for every choice's usage.
        const int64_t prompt_tokens = first->has_started() ? first->started().prompt_tokens() : 0;
        auto chunk = [&](int index, const Json& delta, const Json& finish, const Json& logprobs) {
          return sse.Frame(Json{{"index", index},
                                {"delta", delta},
                                {"logprobs", logprobs},
                                {"finish_reason", finish}},
                           prompt_tokens, results[index].completion_tokens);
        };
        std::vector<grpc::Status> statuses(n);
        auto run = [&](int i) {
          Call& call = *(*calls)[i];
          StreamEnd& end = ends[i];
          if (!sse.send(chunk(i, Json{{"role", "assistant"}, {"content", ""}}, nullptr, nullptr))) {
            end.gone = true;
            call.TryCancel();
            call.Finish();
            return;
          }
          ChoiceResult& r = results[i];
          statuses[i] =
              RunChoice(*fields, call, &r, i == 0 ? first.get() : nullptr,
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
          if (statuses[i].ok() && !sse.send(chunk(i, Json::object(), r.finish_reason, nullptr))) {
            end.gone = true;
          }
        };
        if (n == 1) {
          run(0);
        } else {
          std::vector<std::thread> threads;
          for (int i = 0; i < n; ++i) threads.emplace_back(run, i);
          for (std::thread& t : threads) t.join();
        }
        StreamEnd end;
        // The call's first failure ends the stream (every choice then reports it: one frame).
        for (int i = 0; i < n && !end.gone; ++i) {
          end.gone = ends[i].gone;
          if (!end.gone && !ChoiceOk(statuses[i], sse, &end)) return end;
        }
        if (end.gone) return end;
        end.prompt_tokens = results[0].prompt_tokens;
        end.cached_tokens = results[0].cached_tokens;  // the prompt counts once
        for (const ChoiceResult& r : results) {
          end.completion_tokens += r.completion_tokens;
          end.reasoning_tokens = end.reasoning_tokens.value_or(0) + r.reasoning_tokens;
        }
        return end;
      });
}

void Gateway::StreamSse(Res& res, ConnectionWatch watch, Json header, bool include_usage,
                        bool continuous_usage, std::function<StreamEnd(const SseSink&)> body) {
  res.set_header("Cache-Control", "no-cache");
  res.set_chunked_content_provider(
      kEventStream, [this, watch, header = std::move(header), include_usage, continuous_usage,
                     body = std::move(body)](size_t, httplib::DataSink& sink) {
        ++streams_active_;
        bool disconnected = false;  // counted after the stream leaves streams_active_
        SseSink sse;
        sse.header = header;
        sse.include_usage = include_usage;
        sse.continuous_usage = continuous_usage;
        // A frame, whether or not the server stops (the last frames of a stream).
        auto write = [&sink, &watch](const Json& j) {
          const std::string frame = "data: " + Dump(j) + "\n\n";
          return !watch.PeerClosed() && sink.is_writable() &&
                 sink.write(frame.data(), frame.size());
        };
        sse.send = [this, &write](const Json& j) { return !stopping_ && write(j); };
        sse.alive = [this, &sink, &watch] {
          return !stopping_ && !watch.PeerClosed() && sink.is_writable();
        };
        const StreamEnd end = body(sse);
        if (end.gone && CutByShutdown(watch, sink)) {
          write(Json::parse(ErrorBody(ShuttingDownError())));  // the openai SDKs raise it
        } else if (end.gone) {
          disconnected = true;
        } else {
          if (include_usage) {
            Json u = header;
            u["choices"] = Json::array();
            u["usage"] = UsageJson(end.prompt_tokens, end.completion_tokens, end.cached_tokens,
                                   end.reasoning_tokens);
            write(u);
          }
          static const char kDone[] = "data: [DONE]\n\n";
          if (sink.is_writable()) sink.write(kDone, sizeof(kDone) - 1);
        }
        --streams_active_;
        // A metrics read that sees the disconnect also sees the stream closed.
        if (disconnected) ++disconnects_;
        sink.done();
        return true;
      });
}

}  // namespace coli::cli::serve
