// POST /v1/completions: one host Generate call per choice (legacy completions: text, echo,
// logprobs with text_offset).
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status/status.h"
#include "tools/coli/serve_gateway.h"

namespace coli::cli::serve {

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

namespace {

// Characters (code points, as OpenAI's Python counts them) of UTF-8 text.
int64_t CodePoints(const std::string& text) {
  int64_t n = 0;
  for (unsigned char c : text) n += (c & 0xC0) != 0x80;
  return n;
}

}  // namespace

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
      // After a stop string the host goes on until STOP reaches it, a token or two more or none
      // depending on timing: the usage counts the tokens up to the one that completed the stop
      // string (as vLLM does), so it never depends on what else is running.
      if (!stopped) out->completion_tokens = ev.finished().usage().completion_tokens();
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

}  // namespace coli::cli::serve
