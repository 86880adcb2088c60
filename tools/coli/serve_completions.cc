// POST /v1/completions: one host Generate call per prompt, carrying its n choices (legacy
// completions: text, echo, logprobs with text_offset).
#include <cstdio>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status/status.h"
#include "tools/coli/serve_gateway.h"

namespace coli::cli::serve {

v1::GenerateRequest Gateway::GenerateRequestFor(const SamplingFields& f,
                                                const CompletionPrompt& prompt,
                                                int32_t prompt_logprobs) const {
  v1::GenerateRequest r;
  r.set_model(info_.id());
  if (prompt.is_ids) {
    for (int32_t id : prompt.ids) r.add_prompt_ids(id);
  } else {
    r.set_prompt(prompt.text);
  }
  r.set_max_tokens(f.max_tokens);
  r.set_response_format(f.response_format);
  r.set_truncate_prompt_tokens(f.truncate_prompt_tokens);
  r.set_prompt_only(f.prompt_only);
  if (prompt_logprobs >= 0) r.set_prompt_logprobs(prompt_logprobs);
  r.set_report_progress(f.stream && f.return_progress);
  return r;
}

std::unique_ptr<Gateway::GenerateCall> Gateway::StartGenerate(const SamplingFields& f,
                                                              const CompletionPrompt& prompt,
                                                              int choice,
                                                              const ConnectionWatch* client,
                                                              int32_t prompt_logprobs) {
  auto call = std::make_unique<GenerateCall>();
  v1::GenerateRequest r = GenerateRequestFor(f, prompt, prompt_logprobs);
  FillSampling(f, choice, r.mutable_sampling());
  call->reader = stub_->Generate(&call->ctx, r);
  if (client) call->guard = monitor_.Watch(*client, [c = call.get()] { c->ctx.TryCancel(); });
  return call;
}

std::vector<std::shared_ptr<Gateway::GenerateCall>> Gateway::StartGenerateChoices(
    const SamplingFields& f, const CompletionPrompt& prompt, const ConnectionWatch* client,
    int32_t prompt_logprobs) {
  auto feed = std::make_shared<ChoiceFeed<v1::GenerateEvent>>(f.n);
  v1::GenerateRequest r = GenerateRequestFor(f, prompt, prompt_logprobs);
  r.set_n(f.n);
  FillSampling(f, 0, r.mutable_sampling());  // the host gives choice i seed + i
  feed->Start(stub_->Generate(&feed->ctx, r));
  return CallsPerChoice<GenerateCall>(std::move(feed), f.n, client);
}

grpc::Status Gateway::PrepareEcho(const SamplingFields& f, CompletionPrompt* prompt,
                                  std::string* first_token_text) {
  if (!f.echo) return grpc::Status::OK;
  if (prompt->is_ids) {
    grpc::ClientContext ctx;
    v1::DetokenizeRequest r;
    r.set_model(info_.id());
    for (int32_t id : prompt->ids) r.add_ids(id);
    v1::DetokenizeResponse out;
    if (grpc::Status s = stub_->Detokenize(&ctx, r, &out); !s.ok()) return s;
    prompt->text = out.text();
  } else if (f.top_logprobs >= 0) {
    // The prompt's tokens, as the host tokenizes a text prompt (special-token text stays text);
    // the request then sends them as ids.
    grpc::ClientContext ctx;
    v1::TokenizeRequest r;
    r.set_model(info_.id());
    r.set_text(prompt->text);
    r.set_allow_special(false);
    v1::TokenizeResponse out;
    if (grpc::Status s = stub_->Tokenize(&ctx, r, &out); !s.ok()) return s;
    prompt->ids.assign(out.ids().begin(), out.ids().end());
    prompt->is_ids = true;
  }
  if (f.top_logprobs >= 0 && !prompt->ids.empty()) {
    grpc::ClientContext ctx;
    v1::DetokenizeRequest r;
    r.set_model(info_.id());
    r.add_ids(prompt->ids[0]);
    v1::DetokenizeResponse out;
    if (grpc::Status s = stub_->Detokenize(&ctx, r, &out); !s.ok()) return s;
    *first_token_text = out.text();
  }
  return grpc::Status::OK;
}

namespace {

// Characters (code points, as OpenAI's Python counts them) of UTF-8 text.
int64_t CodePoints(const std::string& text) {
  int64_t n = 0;
  for (unsigned char c : text) n += (c & 0xC0) != 0x80;
  return n;
}

// Characters whose bytes are all in `bytes` (a character cut at the end is not yet counted;
// a stray byte counts as one, as its replacement character).
int64_t CompleteCharacters(const std::string& bytes) {
  int64_t n = 0;
  for (size_t i = 0; i < bytes.size(); ++n) {
    const unsigned char c = static_cast<unsigned char>(bytes[i]);
    const size_t len = c < 0x80         ? 1
                       : (c >> 5) == 6  ? 2
                       : (c >> 4) == 14 ? 3
                       : (c >> 3) == 30 ? 4
                                        : 1;
    if (i + len > bytes.size()) break;
    i += len;
  }
  return n;
}

}  // namespace

grpc::Status Gateway::RunCompletion(const SamplingFields& f, GenerateCall& call,
                                    CompletionResult* out, const v1::GenerateEvent* first,
                                    const DeltaFn& on_piece) {
  StopFilter stop(f.stop, f.include_stop_str);
  bool stopped = false, cancelled = false;
  // Characters (code points, as OpenAI's Python counts) of the text before the current token: its
  // logprobs' text_offset. The text is a prefix of the tokens' texts (a stop string only cuts it),
  // so text[offset[i], offset[i + 1]) is what token i completed: "" for the first part of a
  // character, the character for the token that ends it.
  int64_t text_chars = out->offset_base;
  v1::FinishReason reason = v1::FINISH_REASON_UNSPECIFIED;
  client::ReplyTail last_tokens = NewReplyTail();  // the last tokens (CutCharacter)
  v1::GenerateEvent ev;
  bool have = first != nullptr;
  if (have) ev = *first;
  auto emit = [&](const char* kind, const Json& payload) {
    if (cancelled || !on_piece) return;
    if (!on_piece(kind, payload)) {
      cancelled = true;
      call.TryCancel();
    }
  };
  // echo: the prompt (and its tokens' logprobs) goes first, once the prompt has been read.
  bool echoed = !f.echo;
  auto echo_once = [&] {
    if (echoed) return;
    echoed = true;
    out->text = *out->echo_text + out->text;
    Json piece{{"text", *out->echo_text}};
    if (f.top_logprobs >= 0) {
      Json tokens = Json::array(), lps = Json::array(), tops = Json::array();
      Json offsets = Json::array();
      std::string bytes;  // the prompt's bytes before the current token
      auto add = [&](const std::string& token_bytes, Json lp, Json top) {
        tokens.push_back(LogprobTokenText(token_bytes));
        lps.push_back(std::move(lp));
        tops.push_back(std::move(top));
        offsets.push_back(CompleteCharacters(bytes));
        bytes += token_bytes;
      };
      add(out->first_token_text, nullptr, nullptr);  // nothing precedes the first token
      for (const v1::TokenLogprobs& e :
           out->echo_entries ? *out->echo_entries : out->prompt_entries) {
        Json top = Json::object();
        for (int k = 0; k < e.top_size() && k < f.top_logprobs; ++k) {
          top[LogprobTokenText(e.top(k).text())] = e.top(k).logprob();
        }
        add(e.sampled().text(), e.sampled().logprob(), std::move(top));
      }
      for (size_t i = 0; i < tokens.size(); ++i) {
        out->tokens.insert(out->tokens.begin() + static_cast<std::ptrdiff_t>(i), tokens[i]);
        out->token_logprobs.insert(out->token_logprobs.begin() + static_cast<std::ptrdiff_t>(i),
                                   lps[i]);
        out->top_logprobs.insert(out->top_logprobs.begin() + static_cast<std::ptrdiff_t>(i),
                                 tops[i]);
        out->text_offset.insert(out->text_offset.begin() + static_cast<std::ptrdiff_t>(i),
                                offsets[i]);
      }
      piece["logprobs"] = Json{{"tokens", tokens},
                               {"token_logprobs", lps},
                               {"top_logprobs", tops},
                               {"text_offset", offsets}};
    }
    emit("text", piece);
  };
  while (have || call.Read(&ev)) {
    have = false;
    if (ev.has_token() || ev.has_finished()) echo_once();
    if (ev.has_progress()) {
      emit("progress", PromptProgress(ev.progress()));
    } else if (ev.has_prompt_logprobs()) {
      for (const v1::TokenLogprobs& e : ev.prompt_logprobs().tokens())
        out->prompt_entries.push_back(e);
    } else if (ev.has_started()) {
      call.request_id = ev.started().request_id();
      out->prompt_tokens = ev.started().prompt_tokens();
    } else if (ev.has_token() && !stopped) {
      ++out->completion_tokens;
      last_tokens.Push(ev.token().id());
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
        StopAtHost(call.request_id, call.feed ? call.choice : -1);
      }
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
  // A model stop token flushed the host's decoder; any other end may cut a character.
  if (!stopped && !cancelled && status.ok() && reason != v1::FINISH_REASON_STOP) {
    if (const std::string cut = CutCharacter(last_tokens); !cut.empty()) {
      const std::string visible = stop.Push(cut);
      out->text += visible;
      if (!visible.empty()) emit("text", Json{{"text", visible}});
      stopped = stop.stopped();
    }
  }
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
  auto prompts = std::make_shared<std::vector<CompletionPrompt>>();
  std::optional<SamplingFields> f =
      ParseCompletionParams(body, info_.vocab_size(), prompts.get(), &error);
  if (!f) return Fail(res, error);
  if (!ModelOk(f->model, res)) return;
  // echo: each prompt's text (and tokens, for its logprobs) before anything runs.
  auto first_texts = std::make_shared<std::vector<std::string>>(prompts->size());
  for (size_t p = 0; p < prompts->size(); ++p) {
    if (grpc::Status s = PrepareEcho(*f, &(*prompts)[p], &(*first_texts)[p]); !s.ok()) {
      return Fail(res, CompletionsError(FromHostStatus(s)));
    }
  }
  // The prompt's logprobs come with each prompt's first choice (the whole prompt is computed
  // for them); its other choices reuse them and the prompt's state.
  // vLLM's prompt_logprobs (not streamed) asks for kRankDepth alternatives, echo takes its k.
  const int32_t prompt_logprobs = !f->stream && f->prompt_logprobs >= 0 ? kRankDepth
                                  : f->echo && f->top_logprobs >= 0     ? f->top_logprobs
                                                                        : -1;
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
    int64_t prompt_tokens = 0, completion = 0, cached = 0;
    for (size_t p = 0; p < prompts->size(); ++p) {
      const CompletionPrompt& prompt = (*prompts)[p];
      std::vector<v1::TokenLogprobs> entries;  // this prompt's, from its first choice
      // n > 1 (but a prompt-only echo): ONE host call, its choices read side by side.
      const bool together = f->n > 1 && !f->prompt_only;
      std::vector<std::shared_ptr<GenerateCall>> calls;
      if (together) calls = StartGenerateChoices(*f, prompt, &watch, prompt_logprobs);
      std::vector<CompletionResult> results(f->n);
      std::vector<grpc::Status> statuses(f->n);
      auto alive = [this, &watch](const char*, const Json&) {
        return !stopping_ && !watch.PeerClosed();  // each token: is the client still there?
      };
      auto run = [&](int i) {
        CompletionResult& r = results[i];
        r.offset_base = CodePoints(prompt.text);
        r.echo_text = &prompt.text;
        r.first_token_text = (*first_texts)[p];
        // Each choice of a shared call gets the prompt's logprobs itself.
        if (i > 0 && !together) r.echo_entries = &entries;
        std::shared_ptr<GenerateCall> call =
            together ? calls[i]
                     : std::shared_ptr<GenerateCall>(
                           StartGenerate(*f, prompt, i, &watch, i == 0 ? prompt_logprobs : -1));
        statuses[i] = RunCompletion(*f, *call, &r, nullptr, alive);
        if (i == 0 && !together) entries = std::move(r.prompt_entries);
      };
      if (together) {
        std::vector<std::thread> readers;
        for (int i = 0; i < f->n; ++i) readers.emplace_back(run, i);
        for (std::thread& t : readers) t.join();
      } else {
        for (int i = 0; i < f->n && (i == 0 || statuses[i - 1].ok()); ++i) run(i);
      }
      for (const grpc::Status& s : statuses) {
        if (s.error_code() == grpc::StatusCode::CANCELLED) return Abandoned(res, s, watch);
      }
      for (const grpc::Status& s : statuses) {
        if (!s.ok()) return Fail(res, CompletionsError(FromHostStatus(s)));
      }
      if (together) entries = results[0].prompt_entries;
      for (int i = 0; i < f->n; ++i) {
        const CompletionResult& r = results[i];
        Json choice;
        choice["index"] = static_cast<int64_t>(p) * f->n + i;
        choice["text"] = r.text;
        choice["logprobs"] = f->top_logprobs >= 0 ? Json{{"tokens", r.tokens},
                                                         {"token_logprobs", r.token_logprobs},
                                                         {"top_logprobs", r.top_logprobs},
                                                         {"text_offset", r.text_offset}}
                                                  : Json(nullptr);
        choice["finish_reason"] = r.finish_reason;
        if (f->prompt_logprobs >= 0) {
          choice["prompt_logprobs"] =
              VllmPromptLogprobs(entries, f->prompt_logprobs, info_.vocab_size());
        }
        out["choices"].push_back(choice);
        if (i == 0) {  // each prompt counts once, as vLLM's
          prompt_tokens += r.prompt_tokens;
          cached += r.cached_tokens;
        }
        completion += r.completion_tokens;
      }
    }
    out["usage"] = UsageJson(prompt_tokens, completion, cached);
    Reply(res, 200, out);
    return;
  }

  // Streaming (OpenAI's legacy shape): read the first event before answering, so a refused
  // request is a plain 400. n > 1 (but a prompt-only echo): one host call per prompt, its
  // choices streamed side by side, their chunks interleaved (each names its `index`).
  const bool together = f->n > 1 && !f->prompt_only;
  auto first_calls = std::make_shared<std::vector<std::shared_ptr<GenerateCall>>>(
      together ? StartGenerateChoices(*f, (*prompts)[0], &watch, prompt_logprobs)
               : std::vector<std::shared_ptr<GenerateCall>>{std::shared_ptr<GenerateCall>(
                     StartGenerate(*f, (*prompts)[0], 0, &watch, prompt_logprobs))});
  auto first = std::make_shared<v1::GenerateEvent>();
  if (!(*first_calls)[0]->Read(first.get())) {
    grpc::Status why = (*first_calls)[0]->Finish();
    if (why.ok()) why = grpc::Status(grpc::StatusCode::INTERNAL, "host ended the stream early");
    if (why.error_code() == grpc::StatusCode::CANCELLED) return Abandoned(res, why, watch);
    return Fail(res, CompletionsError(FromHostStatus(why)));
  }
  auto fields = std::make_shared<SamplingFields>(*f);
  SendUncompressed(req);
  StreamSse(
      res, watch, Header(id, "text_completion", created), f->include_usage, f->continuous_usage,
      [this, first_calls, first, fields, prompts, first_texts, prompt_logprobs, together,
       watch](const SseSink& unlocked) {
        // The choices' threads share the stream: one frame at a time.
        std::mutex frame_mu;
        const SseSink sse = unlocked.Serialized(frame_mu);
        // `r`: the choice's result so far (its usage for continuous_usage_stats).
        auto chunk = [&](int64_t index, const std::string& text, const Json& logprobs,
                         const Json& finish, const CompletionResult& r) {
          return sse.Frame(Json{{"text", text},
                                {"index", index},
                                {"logprobs", logprobs},
                                {"finish_reason", finish}},
                           r.prompt_tokens, r.completion_tokens);
        };
        const int n = fields->n;
        StreamEnd end;
        for (size_t p = 0; p < prompts->size() && !end.gone; ++p) {
          const CompletionPrompt& prompt = (*prompts)[p];
          std::vector<std::shared_ptr<GenerateCall>> calls =
              p == 0     ? *first_calls
              : together ? StartGenerateChoices(*fields, prompt, &watch, prompt_logprobs)
                         : std::vector<std::shared_ptr<GenerateCall>>();
          std::vector<v1::TokenLogprobs> entries;
          std::vector<CompletionResult> results(n);
          std::vector<grpc::Status> statuses(n);
          std::vector<bool> gone(n, false);
          auto run = [&](int i) {
            const int64_t index = static_cast<int64_t>(p) * n + i;
            std::shared_ptr<GenerateCall> call =
                together || (p == 0 && i == 0)
                    ? calls[i]
                    : std::shared_ptr<GenerateCall>(
                          StartGenerate(*fields, prompt, i, &watch, i == 0 ? prompt_logprobs : -1));
            CompletionResult& r = results[i];
            r.offset_base = CodePoints(prompt.text);
            r.echo_text = &prompt.text;
            r.first_token_text = (*first_texts)[p];
            if (i > 0 && !together) r.echo_entries = &entries;
            statuses[i] = RunCompletion(
                *fields, *call, &r, index == 0 ? first.get() : nullptr,
                [&](const char* kind, const Json& payload) {
                  if (!std::strcmp(kind, "tick")) return sse.alive();
                  if (!std::strcmp(kind, "progress")) {
                    Json c = chunk(index, "", nullptr, nullptr, r);
                    c["prompt_progress"] = payload;
                    return sse.send(c);
                  }
                  return sse.send(
                      chunk(index, payload["text"].get<std::string>(),
                            payload.contains("logprobs") ? payload["logprobs"] : Json(nullptr),
                            nullptr, r));
                });
            if (i == 0 && !together) entries = std::move(r.prompt_entries);
            if (statuses[i].ok() && !sse.send(chunk(index, "", nullptr, r.finish_reason, r))) {
              gone[i] = true;
            }
          };
          if (together) {
            std::vector<std::thread> threads;
            for (int i = 0; i < n; ++i) threads.emplace_back(run, i);
            for (std::thread& t : threads) t.join();
          } else {
            for (int i = 0; i < n; ++i) {
              run(i);
              if (!statuses[i].ok() || gone[i]) break;
            }
          }
          // The call's first failure ends the stream (every choice then reports it: one frame).
          for (int i = 0; i < n; ++i) {
            if (gone[i]) end.gone = true;
            if (end.gone) return end;
            if (!ChoiceOk(statuses[i], sse, &end)) return end;
          }
          end.prompt_tokens += results[0].prompt_tokens;  // each prompt counts once
          end.cached_tokens += results[0].cached_tokens;
          for (const CompletionResult& r : results) end.completion_tokens += r.completion_tokens;
        }
        return end;
      });
}

}  // namespace coli::cli::serve
