// The kimi_k3 plugin behind the host, on the tiny fixture (build/fixtures/k3_tiny, random
// weights). The reference for every generated token is kimi_k3_core called directly in this
// process (Model::Load, Session::Prefill/Step, greedy sampling) — no plugin, no host, no gRPC.
#include <algorithm>
#include <condition_variable>
#include <filesystem>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/sampling/sampling.h"
#include "common/status/status_matchers.h"
#include "common/tokenizer/tokenizer.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "host/engine.h"
#include "host/service.h"
#include "nlohmann/json.hpp"
#include "plugins/kimi_k3/chat.h"
#include "plugins/kimi_k3/model.h"
#include "plugins/kimi_k3/session.h"

namespace coli::host {
namespace {

using ::testing::HasSubstr;

const char kPrompt[] = "The quick brown fox jumps over the lazy dog.";

class K3HostTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(std::filesystem::exists(std::string(COLI_K3_TINY_DIR) + "/config.json"))
        << "tiny fixture missing: build target k3_tiny_fixture";
    engine_ = std::make_unique<Engine>(
        EngineOptions{.plugin_dir = COLI_PLUGIN_DIR_FOR_TEST, .decode_delay_ms = decode_delay_ms_});
    const std::string dir = ::testing::TempDir() + "/k3_host_" + std::to_string(getpid());
    std::filesystem::create_directories(dir);
    auto server = HostServer::Start(engine_.get(), {.listen = "unix:" + dir + "/h.sock"});
    ASSERT_OK(server.status());
    server_ = std::move(server).value();
    stub_ = v1::Coli::NewStub(
        grpc::CreateChannel(server_->address(), grpc::InsecureChannelCredentials()));
    grpc::ClientContext ctx;
    v1::LoadModelRequest load;
    load.set_model_dir(COLI_K3_TINY_DIR);
    load.set_id("k3");
    auto reader = stub_->LoadModel(&ctx, load);
    v1::LoadModelEvent e;
    while (reader->Read(&e)) {
      if (e.has_loaded()) info_ = e.loaded();
    }
    grpc::Status status = reader->Finish();
    ASSERT_TRUE(status.ok()) << status.error_message();
    ASSERT_EQ(info_.family(), "kimi_k3");
  }
  void TearDown() override {
    if (server_) server_->Shutdown();
  }

  int decode_delay_ms_ = 0;  // set by a subclass's constructor (paced tests)

  // The tiny model again as "k3c8", prefilled in chunks of 8 tokens (K3_CHUNK=8).
  void LoadChunk8() {
    grpc::ClientContext ctx;
    v1::LoadModelRequest load;
    load.set_model_dir(COLI_K3_TINY_DIR);
    load.set_id("k3c8");
    load.mutable_options()->set_chunk(8);
    auto reader = stub_->LoadModel(&ctx, load);
    v1::LoadModelEvent e;
    while (reader->Read(&e)) {
    }
    grpc::Status status = reader->Finish();
    ASSERT_TRUE(status.ok()) << status.error_message();
  }

  struct Out {
    grpc::Status status;
    v1::Started started;
    std::vector<int32_t> ids;
    v1::Finished finished;
  };
  Out Generate(const v1::GenerateRequest& r, const std::function<void(int)>& on_token = nullptr) {
    grpc::ClientContext ctx;
    Out out;
    auto reader = stub_->Generate(&ctx, r);
    v1::GenerateEvent e;
    while (reader->Read(&e)) {
      if (e.has_started()) out.started = e.started();
      if (e.has_token()) {
        out.ids.push_back(e.token().id());
        if (on_token) on_token(static_cast<int>(out.ids.size()));
      }
      if (e.has_finished()) out.finished = e.finished();
    }
    out.status = reader->Finish();
    return out;
  }

  std::unique_ptr<Engine> engine_;
  std::unique_ptr<HostServer> server_;
  std::unique_ptr<v1::Coli::Stub> stub_;
  v1::ModelInfo info_;
};

// The direct reference: tokenizer + kimi_k3_core + greedy, stopping at the model's stop ids.
std::vector<int32_t> DirectGreedy(const std::vector<int32_t>& prompt, int n,
                                  const std::vector<int32_t>& stops) {
  auto model = k3::Model::Load(COLI_K3_TINY_DIR, k3::ModelOptions());
  EXPECT_TRUE(model.ok()) << model.status();
  auto session = (*model)->NewSession();
  auto logits = session->Prefill(prompt);
  EXPECT_TRUE(logits.ok()) << logits.status();
  std::vector<int32_t> out;
  for (int i = 0; i < n; ++i) {
    const int32_t next = sampling::Greedy(*logits);
    out.push_back(next);
    if (std::find(stops.begin(), stops.end(), next) != stops.end()) break;
    logits = session->Step(next);
    EXPECT_TRUE(logits.ok()) << logits.status();
  }
  return out;
}

TEST_F(K3HostTest, GenerateThroughGrpcMatchesTheCoreLibrary) {
  auto tokenizer = tok::Tokenizer::LoadDir(COLI_K3_TINY_DIR);
  ASSERT_OK(tokenizer.status());
  const std::vector<int32_t> prompt = (*tokenizer)->Encode(kPrompt, false);
  v1::GenerateRequest r;
  r.set_prompt(kPrompt);
  r.set_max_tokens(12);
  Out out = Generate(r);
  ASSERT_TRUE(out.status.ok()) << out.status.error_message();
  EXPECT_EQ(out.started.prompt_tokens(), static_cast<int64_t>(prompt.size()));
  const std::vector<int32_t> stops(info_.stop_ids().begin(), info_.stop_ids().end());
  EXPECT_EQ(out.ids, DirectGreedy(prompt, 12, stops));
  // Same again in-process through the engine (no gRPC): identical.
  std::vector<int32_t> local;
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  EventSink sink;
  sink.on_token = [&](const v1::Token& t, std::span<const v1::ChatDelta>) {
    local.push_back(t.id());
  };
  sink.on_done = [&](const absl::Status& s, const v1::Finished&) {
    EXPECT_OK(s);
    std::lock_guard<std::mutex> lock(mu);
    done = true;
    cv.notify_all();
  };
  GenerationInput in = GenerationInput::From(r);
  in.session = "in-process";
  ASSERT_OK(engine_->Submit(in, std::move(sink)).status());
  std::unique_lock<std::mutex> lock(mu);
  cv.wait(lock, [&] { return done; });
  EXPECT_EQ(local, out.ids);
}

// Decoding paced at 5 ms a token, so a cancel sent after the 2nd token lands long before
// max_tokens whatever the machine's load (unpaced, the tiny model's ~1 ms tokens could run out
// the 400 before a loaded machine delivers the cancel).
class K3HostPacedTest : public K3HostTest {
 protected:
  K3HostPacedTest() { decode_delay_ms_ = 5; }
};

TEST_F(K3HostPacedTest, FollowUpReusesThePrefixAndCancelKeepsTheSessionUsable) {
  v1::GenerateRequest first;
  first.set_prompt(kPrompt);
  first.set_max_tokens(4);
  Out a = Generate(first);
  ASSERT_TRUE(a.status.ok()) << a.status.error_message();
  // prompt + reply (the last sampled token not fed) + more text
  std::vector<int32_t> follow;
  {
    grpc::ClientContext ctx;
    v1::TokenizeRequest t;
    t.set_text(kPrompt);
    v1::TokenizeResponse ids;
    ASSERT_TRUE(stub_->Tokenize(&ctx, t, &ids).ok());
    follow.assign(ids.ids().begin(), ids.ids().end());
  }
  const size_t prompt_len = follow.size();
  follow.insert(follow.end(), a.ids.begin(), a.ids.end());
  follow.push_back(a.ids.front());  // one more token of "new turn"
  v1::GenerateRequest second;
  second.mutable_prompt_ids()->Add(follow.begin(), follow.end());
  // How many tokens arrive after the client sent the cancel depends on the machine's load; the
  // bounds below only need the cancel to land long before max_tokens (400 paced tokens: 2 s;
  // the host-side "within one token" is HostTest's, with a paced plugin).
  second.set_max_tokens(400);
  second.set_request_id("k3-cancel");
  Out b = Generate(second, [&](int n) {
    if (n == 2) {
      grpc::ClientContext ctx;
      v1::CancelRequest c;
      c.set_request_id("k3-cancel");
      v1::CancelResponse response;
      EXPECT_TRUE(stub_->Cancel(&ctx, c, &response).ok());
    }
  });
  EXPECT_EQ(b.started.tokens_reused(), static_cast<int64_t>(prompt_len + a.ids.size() - 1));
  EXPECT_EQ(b.started.tokens_computed(), 2);
  EXPECT_EQ(b.status.error_code(), grpc::StatusCode::CANCELLED);
  EXPECT_LT(b.ids.size(), 400u);
  // The session still serves, and its statistics show the cancelled request stopped early.
  v1::GenerateRequest third;
  third.set_prompt("Hello");
  third.set_max_tokens(3);
  Out c = Generate(third);
  ASSERT_TRUE(c.status.ok()) << c.status.error_message();
  EXPECT_EQ(c.ids.size(), 3u);
  const double generated = c.finished.stats().plugin().at("tokens_generated");
  // The cancelled request generated at most one token it did not deliver.
  EXPECT_LE(generated, static_cast<double>(a.ids.size() + b.ids.size() + 1 + 3));
}

// A long prompt prefilled in small chunks (K3_CHUNK=8 as a load option) reports its progress:
// strictly growing, at least the first and the final report, ending at done == total == the
// prompt's token count as the tokenizer counts it. Without report_progress nothing is sent, and
// a follow-up that reuses the session's prefix starts its reports at the reused count.
TEST_F(K3HostTest, LongPromptReportsMonotonePrefillProgress) {
  LoadChunk8();
  std::string text;
  for (int i = 0; i < 12; ++i) text += std::string(kPrompt) + " ";
  auto tokenizer = tok::Tokenizer::LoadDir(COLI_K3_TINY_DIR);
  ASSERT_OK(tokenizer.status());
  const std::vector<int32_t> ids = (*tokenizer)->Encode(text, /*allow_special=*/false);
  const int64_t n = static_cast<int64_t>(ids.size());
  ASSERT_GE(n, 200) << "the prompt must span many chunks of 8";

  struct Run {
    grpc::Status status;
    std::vector<v1::PrefillProgress> progress;
    v1::Started started;
    bool progress_after_started = false;
    std::vector<int32_t> tokens;
  };
  auto run = [&](v1::GenerateRequest r) {
    r.set_model("k3c8");
    r.set_session("progress");
    grpc::ClientContext ctx;
    Run out;
    bool started = false;
    auto reader = stub_->Generate(&ctx, r);
    v1::GenerateEvent e;
    while (reader->Read(&e)) {
      if (e.has_progress()) {
        out.progress.push_back(e.progress());
        if (started) out.progress_after_started = true;
      }
      if (e.has_started()) {
        started = true;
        out.started = e.started();
      }
      if (e.has_token()) out.tokens.push_back(e.token().id());
    }
    out.status = reader->Finish();
    return out;
  };

  v1::GenerateRequest quiet;
  quiet.set_prompt(text);
  quiet.set_max_tokens(1);
  quiet.set_session("quiet");
  Run q = run(quiet);
  ASSERT_TRUE(q.status.ok()) << q.status.error_message();
  EXPECT_TRUE(q.progress.empty()) << "progress was not asked for";

  v1::GenerateRequest r;
  r.set_prompt(text);
  r.set_max_tokens(3);
  r.set_report_progress(true);
  Run a = run(r);
  ASSERT_TRUE(a.status.ok()) << a.status.error_message();
  EXPECT_EQ(a.started.prompt_tokens(), n);
  ASSERT_GE(a.progress.size(), 2u);
  EXPECT_FALSE(a.progress_after_started);
  for (size_t i = 0; i < a.progress.size(); ++i) {
    EXPECT_EQ(a.progress[i].total(), n);
    EXPECT_EQ(a.progress[i].reused(), 0);
    EXPECT_GE(a.progress[i].elapsed_ms(), 0);
    if (i > 0) {
      EXPECT_GT(a.progress[i].done(), a.progress[i - 1].done()) << "report " << i;
      EXPECT_GE(a.progress[i].elapsed_ms(), a.progress[i - 1].elapsed_ms());
    }
  }
  EXPECT_EQ(a.progress.front().done(), 0);
  EXPECT_EQ(a.progress.back().done(), n);

  // Follow-up: the prompt, the reply but its last token (never fed), and one more token.
  std::vector<int32_t> follow = ids;
  follow.insert(follow.end(), a.tokens.begin(), a.tokens.end() - 1);
  const int64_t kept = static_cast<int64_t>(follow.size());
  follow.push_back(ids.front());
  v1::GenerateRequest f;
  f.mutable_prompt_ids()->Add(follow.begin(), follow.end());
  f.set_max_tokens(1);
  f.set_report_progress(true);
  Run b = run(f);
  ASSERT_TRUE(b.status.ok()) << b.status.error_message();
  EXPECT_EQ(b.started.tokens_reused(), kept);
  ASSERT_GE(b.progress.size(), 2u);
  EXPECT_EQ(b.progress.front().done(), kept);
  EXPECT_EQ(b.progress.front().reused(), kept);
  EXPECT_EQ(b.progress.back().done(), static_cast<int64_t>(follow.size()));
  EXPECT_EQ(b.progress.back().total(), static_cast<int64_t>(follow.size()));
}

// STOP while a long prompt is read ends the request normally (STOPPED) with no token, whether
// it lands during the prefill (which it then ends) or just after it.
TEST_F(K3HostTest, StopDuringPrefillEndsWithoutTokens) {
  LoadChunk8();
  std::string text;
  for (int i = 0; i < 12; ++i) text += std::string(kPrompt) + " ";
  v1::GenerateRequest r;
  r.set_model("k3c8");
  r.set_session("stop");
  r.set_request_id("stop-in-prefill");
  r.set_prompt(text);
  r.set_max_tokens(8);
  r.set_report_progress(true);
  grpc::ClientContext ctx;
  auto reader = stub_->Generate(&ctx, r);
  v1::GenerateEvent e;
  bool stopped = false, finished = false;
  int tokens = 0;
  while (reader->Read(&e)) {
    if (e.has_progress() && !stopped) {
      stopped = true;
      grpc::ClientContext cancel_ctx;
      v1::CancelRequest c;
      c.set_request_id("stop-in-prefill");
      c.set_stop(true);
      v1::CancelResponse response;
      EXPECT_TRUE(stub_->Cancel(&cancel_ctx, c, &response).ok());
      EXPECT_TRUE(response.found());
    }
    if (e.has_token()) ++tokens;
    if (e.has_finished()) {
      finished = true;
      EXPECT_EQ(e.finished().reason(), v1::FINISH_REASON_STOPPED);
      EXPECT_EQ(e.finished().usage().completion_tokens(), 0);
    }
  }
  grpc::Status status = reader->Finish();
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_TRUE(stopped);
  EXPECT_TRUE(finished);
  EXPECT_EQ(tokens, 0);
  // The session still serves.
  v1::GenerateRequest next;
  next.set_model("k3c8");
  next.set_session("stop");
  next.set_prompt("Hello");
  next.set_max_tokens(2);
  Out out = Generate(next);
  ASSERT_TRUE(out.status.ok()) << out.status.error_message();
  EXPECT_EQ(out.ids.size(), 2u);
}

// Recurrent-state checkpoints (COLI_K3_CKPT as the load option extra["ckpt"]): a regenerated
// reply (the same prompt after a reply) and an edited last user message restore a checkpoint
// instead of prefilling from the first token, and the tokens are still the core library's
// own greedy continuation of the new prompt from a fresh session.
TEST_F(K3HostTest, CheckpointsServeRegenerateAndAnEditedLastMessage) {
  {
    grpc::ClientContext ctx;
    v1::LoadModelRequest load;
    load.set_model_dir(COLI_K3_TINY_DIR);
    load.set_id("k3ckpt");
    load.mutable_options()->set_chunk(8);
    (*load.mutable_options()->mutable_extra())["ckpt"] = "4";
    auto reader = stub_->LoadModel(&ctx, load);
    v1::LoadModelEvent e;
    while (reader->Read(&e)) {
    }
    grpc::Status status = reader->Finish();
    ASSERT_TRUE(status.ok()) << status.error_message();
  }
  const nlohmann::json history = {{{"role", "system"}, {"content", "You are a terse assistant."}},
                                  {{"role", "user"}, {"content", "Hi there, who are you?"}},
                                  {{"role", "assistant"}, {"content", "A small test model."}}};
  auto render = [&](const std::string& last_user, bool add_generation_prompt = true) {
    nlohmann::json body = {{"messages", history}};
    if (!last_user.empty()) {
      body["messages"].push_back({{"role", "user"}, {"content", last_user}});
    }
    grpc::ClientContext ctx;
    v1::ApplyTemplateRequest apply;
    apply.set_model("k3ckpt");
    apply.set_request_json(body.dump());
    apply.set_add_generation_prompt(add_generation_prompt);
    v1::ApplyTemplateResponse rendered;
    EXPECT_TRUE(stub_->ApplyTemplate(&ctx, apply, &rendered).ok());
    return std::vector<int32_t>(rendered.ids().begin(), rendered.ids().end());
  };
  const std::vector<int32_t> first = render("Tell me about foxes, please.");
  const std::vector<int32_t> edited = render("Tell me about dogs instead.");
  const size_t common =
      std::mismatch(first.begin(), first.end(), edited.begin(), edited.end()).first - first.begin();
  ASSERT_GT(common, 16u) << "the two prompts must share their history";
  const std::vector<int32_t> stops(info_.stop_ids().begin(), info_.stop_ids().end());
  auto run = [&](const std::string& model, const std::vector<int32_t>& prompt) {
    v1::GenerateRequest r;
    r.set_model(model);
    r.set_session("ckpt-" + model);
    r.mutable_prompt_ids()->Add(prompt.begin(), prompt.end());
    r.set_max_tokens(6);
    Out out = Generate(r);
    EXPECT_TRUE(out.status.ok()) << out.status.error_message();
    return out;
  };
  const Out a = run("k3ckpt", first);
  EXPECT_EQ(a.started.tokens_reused(), 0);
  EXPECT_EQ(a.ids, DirectGreedy(first, 6, stops));

  // Regenerate: the same prompt again, after the reply went into the record.
  const Out again = run("k3ckpt", first);
  EXPECT_EQ(again.started.tokens_reused(), static_cast<int64_t>(first.size()));
  EXPECT_EQ(again.started.tokens_computed(), 0);
  EXPECT_EQ(again.ids, a.ids);
  EXPECT_EQ(again.finished.stats().plugin().at("checkpoint_restores"), 1);
  // The checkpoints held now are the model's current value (coli_model_stat), not a counter.
  EXPECT_EQ(again.finished.stats().plugin().count("checkpoint_bytes"), 0u);
  {
    grpc::ClientContext ctx;
    v1::MetricsResponse metrics;
    ASSERT_TRUE(stub_->GetMetrics(&ctx, v1::MetricsRequest(), &metrics).ok());
    double held = -1;
    for (const v1::ModelStat& stat : metrics.model_stats()) {
      if (stat.model() == "k3ckpt" && stat.name() == "checkpoint_bytes") held = stat.value();
    }
    EXPECT_GT(held, 0);
  }

  // Edit the last user message: back to where that message starts, inside the shared history.
  const Out edit = run("k3ckpt", edited);
  // The history alone, rendered without a generation prompt, ends where the last message starts.
  const std::vector<int32_t> history_ids = render("", /*add_generation_prompt=*/false);
  EXPECT_EQ(edit.started.tokens_reused(), static_cast<int64_t>(history_ids.size()));
  EXPECT_LE(edit.started.tokens_reused(), static_cast<int64_t>(common));
  EXPECT_EQ(edit.started.tokens_reused() + edit.started.tokens_computed(),
            static_cast<int64_t>(edited.size()));
  EXPECT_EQ(edit.ids, DirectGreedy(edited, 6, stops));
  EXPECT_EQ(edit.finished.stats().plugin().at("checkpoint_restores"), 2);

  // Without checkpoints the same two requests prefill from the first token.
  run("k3", first);
  EXPECT_EQ(run("k3", first).started.tokens_reused(), 0);
  const Out plain_edit = run("k3", edited);
  EXPECT_EQ(plain_edit.started.tokens_reused(), 0);
  EXPECT_EQ(plain_edit.ids, edit.ids);
}

TEST_F(K3HostTest, CheckpointSlotCountIsChecked) {
  grpc::ClientContext ctx;
  v1::LoadModelRequest load;
  load.set_model_dir(COLI_K3_TINY_DIR);
  load.set_id("k3bad");
  (*load.mutable_options()->mutable_extra())["ckpt"] = "many";
  auto reader = stub_->LoadModel(&ctx, load);
  v1::LoadModelEvent e;
  while (reader->Read(&e)) {
  }
  grpc::Status status = reader->Finish();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), HasSubstr("COLI_K3_CKPT"));
}

TEST_F(K3HostTest, ChatUsesTheXtmlRendererAndParser) {
  const std::string body = R"({"messages": [{"role": "user", "content": "Hi"}]})";
  grpc::ClientContext ctx;
  v1::ApplyTemplateRequest apply;
  apply.set_request_json(body);
  apply.set_add_generation_prompt(true);
  v1::ApplyTemplateResponse rendered;
  ASSERT_TRUE(stub_->ApplyTemplate(&ctx, apply, &rendered).ok());
  auto tokenizer = tok::Tokenizer::LoadDir(COLI_K3_TINY_DIR);
  ASSERT_OK(tokenizer.status());
  auto json = k3::ParseRequestBody(body);
  ASSERT_OK(json.status());
  auto direct = k3::RenderChat(*json, **tokenizer);
  ASSERT_OK(direct.status());
  EXPECT_EQ(std::vector<int32_t>(rendered.ids().begin(), rendered.ids().end()), direct->ids);
  EXPECT_EQ(rendered.text(), direct->text);

  grpc::ClientContext chat_ctx;
  v1::ChatRequest chat;
  chat.set_request_json(body);
  chat.set_max_tokens(8);
  auto reader = stub_->Chat(&chat_ctx, chat);
  v1::ChatEvent e;
  int tokens = 0;
  bool finished = false;
  while (reader->Read(&e)) {
    if (e.has_token()) ++tokens;
    if (e.has_finished()) finished = true;
  }
  grpc::Status status = reader->Finish();
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_TRUE(finished);
  EXPECT_GT(tokens, 0);

  grpc::ClientContext bad_ctx;
  chat.set_request_json(R"({"messages": [{"role": "robot", "content": "x"}]})");
  auto bad = stub_->Chat(&bad_ctx, chat);
  while (bad->Read(&e)) {
  }
  status = bad->Finish();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), HasSubstr("robot"));
}

// OpenAI's logprobs `bytes` are each token's own bytes, so a client can join the bytes of tokens
// that split a character. The host's logprob entries carry the raw token bytes (the top entries
// always did); the sampled one carried the streaming decoder's text: "" for the first half of a
// character, the whole character on the token that completed it.
TEST_F(K3HostTest, LogprobsCarryEachTokensOwnBytesEvenForPartialCharacters) {
  auto tokenizer = tok::Tokenizer::LoadDir(COLI_K3_TINY_DIR);
  ASSERT_OK(tokenizer.status());
  const std::string han = "\xE4\xBD\xA0";  // U+4F60, split over two tokens by the tiny vocabulary
  const std::vector<int32_t> ids = (*tokenizer)->Encode(han, false);
  ASSERT_GE(ids.size(), 2u);
  const int32_t half = ids[0];
  const std::string half_bytes((*tokenizer)->TokenBytes(half));
  ASSERT_LT(half_bytes.size(), han.size());
  ASSERT_EQ(han.compare(0, half_bytes.size(), half_bytes), 0);

  v1::GenerateRequest r;
  r.set_prompt("Hi");
  r.set_max_tokens(3);
  r.mutable_sampling()->set_logprobs(2);
  auto* bias = r.mutable_sampling()->add_logit_bias();  // every step picks the half character
  bias->set_id(half);
  bias->set_bias(100.0f);
  grpc::ClientContext ctx;
  auto reader = stub_->Generate(&ctx, r);
  v1::GenerateEvent e;
  std::vector<v1::Token> tokens;
  while (reader->Read(&e)) {
    if (e.has_token()) tokens.push_back(e.token());
  }
  grpc::Status status = reader->Finish();
  ASSERT_TRUE(status.ok()) << status.error_message();
  ASSERT_EQ(tokens.size(), 3u);
  for (const v1::Token& t : tokens) {
    ASSERT_EQ(t.id(), half);
    EXPECT_EQ(t.logprobs().sampled().id(), half);
    EXPECT_EQ(t.logprobs().sampled().text(), half_bytes);
  }
  // The token text stays the decoder's: nothing until the character can no longer complete.
  EXPECT_EQ(tokens[0].text(), "");
  EXPECT_EQ(tokens[1].text(), "\xEF\xBF\xBD");
}

// gRPC prompt_logprobs (ABI 1.7): after Started, before any token, in pieces of at most 512
// positions; each entry is what decode reports for the same token after the same prefix (the
// greedy token of a one-token request: its logprob and top alternatives, bit for bit);
// prompt_only generates nothing; fewer than 0 or more than 20 alternatives are refused.
TEST_F(K3HostTest, PromptLogprobsComeInPiecesAndAgreeWithDecode) {
  std::vector<int32_t> prompt;
  for (int i = 0; i < 530; ++i) prompt.push_back((i * 37 + 11) % 768);
  v1::GenerateRequest first;
  for (int32_t id : prompt) first.add_prompt_ids(id);
  first.set_max_tokens(1);
  first.mutable_sampling()->set_logprobs(3);
  grpc::ClientContext ctx1;
  auto reader1 = stub_->Generate(&ctx1, first);
  v1::GenerateEvent e;
  std::vector<v1::Token> tokens;
  while (reader1->Read(&e)) {
    EXPECT_FALSE(e.has_prompt_logprobs()) << "sent without being asked";
    if (e.has_token()) tokens.push_back(e.token());
  }
  ASSERT_TRUE(reader1->Finish().ok());
  ASSERT_EQ(tokens.size(), 1u);
  const v1::TokenLogprobs decoded = tokens[0].logprobs();

  v1::GenerateRequest scored;
  for (int32_t id : prompt) scored.add_prompt_ids(id);
  scored.add_prompt_ids(tokens[0].id());
  scored.set_prompt_logprobs(3);
  scored.set_prompt_only(true);
  grpc::ClientContext ctx2;
  auto reader2 = stub_->Generate(&ctx2, scored);
  std::vector<std::string> order;
  std::vector<v1::PromptLogprobs> pieces;
  v1::Finished finished;
  while (reader2->Read(&e)) {
    if (e.has_started()) order.push_back("started");
    if (e.has_prompt_logprobs()) {
      order.push_back("prompt_logprobs");
      pieces.push_back(e.prompt_logprobs());
    }
    if (e.has_token()) order.push_back("token");
    if (e.has_finished()) finished = e.finished();
  }
  grpc::Status status = reader2->Finish();
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(order, (std::vector<std::string>{"started", "prompt_logprobs", "prompt_logprobs"}));
  EXPECT_EQ(finished.reason(), v1::FINISH_REASON_LENGTH);
  EXPECT_EQ(finished.usage().completion_tokens(), 0);
  EXPECT_EQ(finished.usage().prompt_tokens(), 531);
  EXPECT_EQ(finished.usage().tokens_reused(), 0);
  ASSERT_EQ(pieces.size(), 2u);
  EXPECT_EQ(pieces[0].first(), 1);
  EXPECT_EQ(pieces[0].tokens_size(), 512);
  EXPECT_EQ(pieces[1].first(), 513);
  ASSERT_EQ(pieces[1].tokens_size(), 18);
  for (const auto& piece : pieces) {
    for (int k = 0; k < piece.tokens_size(); ++k) {
      const size_t position = static_cast<size_t>(piece.first() + k);
      const int32_t want = position < prompt.size() ? prompt[position] : tokens[0].id();
      ASSERT_EQ(piece.tokens(k).sampled().id(), want) << position;
      EXPECT_EQ(piece.tokens(k).top_size(), 3);
    }
  }
  const v1::TokenLogprobs& last = pieces[1].tokens(17);
  EXPECT_EQ(last.sampled().logprob(), decoded.sampled().logprob());
  EXPECT_EQ(last.sampled().text(), decoded.sampled().text());
  ASSERT_EQ(last.top_size(), decoded.top_size());
  for (int k = 0; k < last.top_size(); ++k) {
    EXPECT_EQ(last.top(k).id(), decoded.top(k).id());
    EXPECT_EQ(last.top(k).logprob(), decoded.top(k).logprob());
  }

  for (int32_t bad : {21, -1}) {
    scored.set_prompt_logprobs(bad);
    Out refused = Generate(scored);
    EXPECT_EQ(refused.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << bad;
    EXPECT_THAT(refused.status.error_message(), HasSubstr("prompt_logprobs")) << bad;
  }
}

}  // namespace
}  // namespace coli::host
