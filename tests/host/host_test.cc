// The host through gRPC, on the "coli_echo" test family (tests/host/echo_plugin.cc), whose
// output is known independently: greedy generation echoes the prompt's bytes, then stops.
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <future>
#include <limits>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/status/status_matchers.h"
#include "gmock/gmock.h"
#include "grpc/health/v1/health.pb.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "host/engine.h"
#include "host/service.h"

namespace coli::host {
namespace {

using ::coli::testing::StatusIs;
using ::testing::HasSubstr;
using Clock = std::chrono::steady_clock;

std::string MakeModelDir(const std::string& name) {
  const std::string dir = ::testing::TempDir() + "/" + name + "_" + std::to_string(getpid());
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/config.json") << R"({"model_type": "coli_echo"})";
  return dir;
}

// Everything one streamed generation produced.
struct Stream {
  grpc::Status status;
  v1::Started started;
  std::vector<int32_t> ids;
  std::string text;
  std::vector<v1::ChatDelta> deltas;
  v1::Finished finished;
  bool has_finished = false;
};

class HostTest : public ::testing::Test {
 protected:
  void Start(int workers = 1, int queue = 8, std::string delay_ms = "0", int64_t max_context = 0) {
    EngineOptions options;
    options.plugin_dir = COLI_ECHO_PLUGIN_DIR;
    options.workers = workers;
    options.queue_capacity = queue;
    options.max_sessions = max_sessions_;
    engine_ = std::make_unique<Engine>(options);
    socket_dir_ = ::testing::TempDir() + "/host_test_" + std::to_string(getpid()) + "_" +
                  std::to_string(counter_++);
    std::filesystem::create_directories(socket_dir_);
    auto server = HostServer::Start(engine_.get(), {.listen = "unix:" + socket_dir_ + "/h.sock"});
    ASSERT_OK(server.status());
    server_ = std::move(server).value();
    channel_ = grpc::CreateChannel(server_->address(), grpc::InsecureChannelCredentials());
    stub_ = v1::Coli::NewStub(channel_);
    v1::LoadModelRequest load;
    load.set_model_dir(MakeModelDir("echo"));
    load.set_id("echo");
    if (delay_ms != "0") (*load.mutable_options()->mutable_extra())["delay_ms"] = delay_ms;
    if (max_context > 0) load.mutable_options()->set_max_context(max_context);
    grpc::ClientContext ctx;
    auto reader = stub_->LoadModel(&ctx, load);
    v1::LoadModelEvent event;
    int progress = 0;
    bool loaded = false;
    while (reader->Read(&event)) {
      if (event.has_progress()) ++progress;
      if (event.has_loaded()) loaded = true;
    }
    ASSERT_TRUE(reader->Finish().ok());
    ASSERT_TRUE(loaded);
    EXPECT_GT(progress, 0);
  }

  int max_sessions_ = 16;  // EngineOptions::max_sessions of the next Start

  void TearDown() override {
    if (server_) server_->Shutdown();
    server_.reset();
    engine_.reset();
  }

  v1::GenerateRequest Request(const std::string& prompt, int max_tokens = 0) {
    v1::GenerateRequest r;
    r.set_model("echo");
    r.set_prompt(prompt);
    r.set_max_tokens(max_tokens);
    return r;
  }

  // Reads a whole Generate stream; `on_token(n)` runs after the n-th token (1-based).
  Stream Generate(const v1::GenerateRequest& request, grpc::ClientContext* ctx = nullptr,
                  const std::function<void(int)>& on_token = nullptr) {
    grpc::ClientContext local;
    if (ctx == nullptr) ctx = &local;
    Stream s;
    auto reader = stub_->Generate(ctx, request);
    v1::GenerateEvent e;
    while (reader->Read(&e)) {
      if (e.has_started()) s.started = e.started();
      if (e.has_token()) {
        s.ids.push_back(e.token().id());
        s.text += e.token().text();
        if (on_token) on_token(static_cast<int>(s.ids.size()));
      }
      if (e.has_finished()) {
        s.finished = e.finished();
        s.has_finished = true;
      }
    }
    s.status = reader->Finish();
    return s;
  }

  // The same request run in-process on the engine.
  Stream GenerateInProcess(const v1::GenerateRequest& request) {
    Stream s;
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;
    EventSink sink;
    sink.on_started = [&](const v1::Started& st) { s.started = st; };
    sink.on_token = [&](const v1::Token& t, std::span<const v1::ChatDelta>) {
      s.ids.push_back(t.id());
      s.text += t.text();
    };
    sink.on_done = [&](const absl::Status& status, const v1::Finished& f) {
      std::lock_guard<std::mutex> lock(mu);
      s.status = ToGrpc(status);
      s.finished = f;
      s.has_finished = status.ok();
      done = true;
      cv.notify_all();
    };
    auto submitted = engine_->Submit(GenerationInput::From(request), std::move(sink));
    EXPECT_OK(submitted.status());
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return done; });
    return s;
  }

  // Waits (up to 20 s, a hang guard, not a timing assertion) until `pred` holds.
  template <typename Pred>
  bool WaitFor(Pred pred) {
    const auto until = Clock::now() + std::chrono::seconds(20);
    while (Clock::now() < until) {
      if (pred()) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    return false;
  }

  v1::MetricsResponse Metrics() {
    grpc::ClientContext ctx;
    v1::MetricsResponse m;
    EXPECT_TRUE(stub_->GetMetrics(&ctx, v1::MetricsRequest(), &m).ok());
    return m;
  }

  static inline int counter_ = 0;
  std::unique_ptr<Engine> engine_;
  std::unique_ptr<HostServer> server_;
  std::string socket_dir_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Coli::Stub> stub_;
};

TEST(ValidUtf8, ReplacesEachInvalidByteAndKeepsValidText) {
  EXPECT_EQ(ValidUtf8("plain"), "plain");
  EXPECT_EQ(ValidUtf8("\xC3\xA9\xE4\xBD\xA0\xF0\x9F\x98\x80"),
            "\xC3\xA9\xE4\xBD\xA0\xF0\x9F\x98\x80");
  const std::string bad = "\xEF\xBF\xBD";
  EXPECT_EQ(ValidUtf8("a\xC3"), "a" + bad);                         // truncated sequence
  EXPECT_EQ(ValidUtf8("\x80x"), bad + "x");                         // stray continuation byte
  EXPECT_EQ(ValidUtf8("\xC0\xAF"), bad + bad);                      // overlong '/'
  EXPECT_EQ(ValidUtf8("\xED\xA0\x80"), bad + bad + bad);            // UTF-16 surrogate
  EXPECT_EQ(ValidUtf8("\xF4\x90\x80\x80"), bad + bad + bad + bad);  // past U+10FFFF
}

TEST_F(HostTest, GreedyGenerateEchoesThePrompt) {
  Start();
  Stream s = Generate(Request("hello, world"));
  ASSERT_TRUE(s.status.ok()) << s.status.error_message();
  EXPECT_EQ(s.text, "hello, world");
  ASSERT_TRUE(s.has_finished);
  EXPECT_EQ(s.finished.reason(), v1::FINISH_REASON_STOP);
  EXPECT_EQ(s.finished.usage().prompt_tokens(), 12);
  EXPECT_EQ(s.finished.usage().completion_tokens(), 13);  // 12 bytes + <eos>
  EXPECT_EQ(s.ids.back(), 257);
  EXPECT_EQ(s.started.prompt_tokens(), 12);
}

TEST_F(HostTest, GrpcOutputIsIdenticalToInProcess) {
  Start();
  v1::GenerateRequest request = Request("the quick brown fox jumps over the lazy dog", 30);
  request.mutable_sampling()->set_temperature(1.5f);  // samples off the echo now and then
  request.mutable_sampling()->set_seed(1234);
  request.mutable_sampling()->set_logprobs(2);
  request.set_session("a");
  Stream remote = Generate(request);
  request.set_session("b");
  Stream local = GenerateInProcess(request);
  ASSERT_TRUE(remote.status.ok()) << remote.status.error_message();
  ASSERT_TRUE(local.status.ok()) << local.status.error_message();
  EXPECT_EQ(remote.ids, local.ids);
  EXPECT_EQ(remote.text, local.text);
  EXPECT_EQ(remote.finished.reason(), local.finished.reason());
  EXPECT_EQ(remote.ids.size(), 30u);
  EXPECT_EQ(remote.finished.reason(), v1::FINISH_REASON_LENGTH);
}

TEST_F(HostTest, LogprobsArePassedThrough) {
  Start();
  v1::GenerateRequest request = Request("ab", 1);
  request.mutable_sampling()->set_logprobs(3);
  grpc::ClientContext ctx;
  auto reader = stub_->Generate(&ctx, request);
  v1::GenerateEvent e;
  v1::Token token;
  while (reader->Read(&e)) {
    if (e.has_token()) token = e.token();
  }
  ASSERT_TRUE(reader->Finish().ok());
  // Echo logits: the target at 8, the other 259 tokens at 0.
  const double log_z = std::log(std::exp(8.0) + 259.0);
  EXPECT_EQ(token.logprobs().sampled().id(), 'a');
  EXPECT_NEAR(token.logprobs().sampled().logprob(), 8.0 - log_z, 1e-5);
  ASSERT_EQ(token.logprobs().top_size(), 3);
  EXPECT_EQ(token.logprobs().top(0).text(), "a");
  EXPECT_NEAR(token.logprobs().top(1).logprob(), -log_z, 1e-5);
}

// ABI 1.3 knobs from the gRPC request to the plugin's decode rows. Echo logits: the target at 8,
// the rest at 0; greedy takes the first maximum after logit_bias and the penalties.
TEST_F(HostTest, SamplingKnobsReachThePlugin) {
  Start();
  v1::GenerateRequest forced = Request("hi", 4);
  auto* bias = forced.mutable_sampling()->add_logit_bias();
  bias->set_id('z');
  bias->set_bias(100.0f);
  Stream s = Generate(forced);
  ASSERT_TRUE(s.status.ok()) << s.status.error_message();
  EXPECT_EQ(s.text, "zzzz");

  // 'z' at 9 beats the target 'h' (8) once; generated once it pays frequency_penalty 2 (7 < 8),
  // so the echo resumes: "z", "h", "i".
  v1::GenerateRequest penalised = Request("hi", 3);
  bias = penalised.mutable_sampling()->add_logit_bias();
  bias->set_id('z');
  bias->set_bias(9.0f);
  Stream without = Generate(penalised);
  ASSERT_TRUE(without.status.ok()) << without.status.error_message();
  EXPECT_EQ(without.text, "zzz");
  penalised.mutable_sampling()->set_frequency_penalty(2.0f);
  Stream with = Generate(penalised);
  ASSERT_TRUE(with.status.ok()) << with.status.error_message();
  EXPECT_EQ(with.text, "zhi");

  // Out of range: INVALID_ARGUMENT naming the field, before any token.
  v1::GenerateRequest bad = Request("hi", 3);
  bad.mutable_sampling()->set_presence_penalty(2.5f);
  Stream refused = Generate(bad);
  EXPECT_EQ(refused.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(refused.status.error_message(), HasSubstr("presence_penalty 2.5"));
  EXPECT_TRUE(refused.ids.empty());
  bad = Request("hi", 3);
  bias = bad.mutable_sampling()->add_logit_bias();
  bias->set_id(260);  // the echo vocabulary is 260 tokens
  bias->set_bias(1.0f);
  refused = Generate(bad);
  EXPECT_EQ(refused.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(refused.status.error_message(), HasSubstr("token id 260"));
}

// A gRPC client other than coli's own can send any numbers: each out-of-range or non-finite
// sampling field (and a negative max_tokens) is refused with INVALID_ARGUMENT naming the field
// and the value, before any event, on Generate and on Chat alike; everything coli serve and
// coli run send at the edges of their ranges is served.
TEST_F(HostTest, OutOfRangeRequestFieldsAreRefusedByNameBeforeAnyWork) {
  Start();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  struct Bad {
    std::function<void(v1::GenerateRequest*)> set;
    std::string message;
  };
  const std::vector<Bad> bad = {
      {[&](auto* r) { r->mutable_sampling()->set_temperature(nan); }, "temperature nan"},
      {[&](auto* r) { r->mutable_sampling()->set_temperature(-0.5f); }, "temperature -0.5"},
      {[&](auto* r) { r->mutable_sampling()->set_temperature(inf); }, "temperature inf"},
      {[&](auto* r) { r->mutable_sampling()->set_temperature(101.0f); }, "temperature 101"},
      {[&](auto* r) { r->mutable_sampling()->set_top_p(nan); }, "top_p nan"},
      {[&](auto* r) { r->mutable_sampling()->set_top_p(1.5f); }, "top_p 1.5"},
      {[&](auto* r) { r->mutable_sampling()->set_top_p(-0.1f); }, "top_p -0.1"},
      {[&](auto* r) { r->mutable_sampling()->set_top_k(-2); }, "top_k -2"},
      {[&](auto* r) { r->mutable_sampling()->set_logprobs(21); }, "logprobs 21"},
      {[&](auto* r) { r->mutable_sampling()->set_logprobs(-1); }, "logprobs -1"},
      {[&](auto* r) { r->mutable_sampling()->set_min_p(nan); }, "min_p nan"},
      {[&](auto* r) { r->mutable_sampling()->set_min_p(1.5f); }, "min_p 1.5"},
      {[&](auto* r) { r->mutable_sampling()->set_frequency_penalty(inf); },
       "frequency_penalty inf"},
      {[&](auto* r) { r->mutable_sampling()->set_repetition_penalty(-1.0f); },
       "repetition_penalty -1"},
      {[&](auto* r) { r->set_max_tokens(-5); }, "max_tokens -5"},
  };
  for (const Bad& b : bad) {
    SCOPED_TRACE(b.message);
    v1::GenerateRequest request = Request("hi", 3);
    b.set(&request);
    Stream refused = Generate(request);
    EXPECT_EQ(refused.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_THAT(refused.status.error_message(), HasSubstr(b.message));
    EXPECT_TRUE(refused.started.request_id().empty());  // no Started: nothing was queued
    EXPECT_TRUE(refused.ids.empty());

    // The same numbers on Chat.
    v1::ChatRequest chat;
    chat.set_model("echo");
    chat.set_request_json(R"({"messages": [{"role": "user", "content": "hi"}]})");
    chat.set_max_tokens(request.max_tokens());
    *chat.mutable_sampling() = request.sampling();
    grpc::ClientContext ctx;
    auto reader = stub_->Chat(&ctx, chat);
    v1::ChatEvent e;
    int events = 0;
    while (reader->Read(&e)) ++events;
    const grpc::Status status = reader->Finish();
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_THAT(status.error_message(), HasSubstr(b.message));
    EXPECT_EQ(events, 0);
  }
  // Nothing was tokenized or generated for them; each counts as a failed request.
  v1::MetricsResponse m = Metrics();
  EXPECT_EQ(m.requests_failed(), 2 * bad.size());
  EXPECT_EQ(m.prompt_tokens(), 0u);

  // The edges of what coli serve (temperature 2, top_p 0 = off, top_k -1, 20 top logprobs,
  // max_tokens 0 = up to the context) and coli run (temperature 100) send are served.
  v1::GenerateRequest edges = Request("hi", 0);
  edges.mutable_sampling()->set_temperature(2.0f);
  edges.mutable_sampling()->set_top_p(0.0f);
  edges.mutable_sampling()->set_top_k(-1);
  edges.mutable_sampling()->set_logprobs(20);
  edges.mutable_sampling()->set_seed(7);
  Stream served = Generate(edges);
  EXPECT_TRUE(served.status.ok()) << served.status.error_message();
  EXPECT_FALSE(served.ids.empty());
  edges.mutable_sampling()->set_temperature(100.0f);
  edges.mutable_sampling()->set_top_p(1.0f);
  edges.mutable_sampling()->set_min_p(1.0f);
  edges.mutable_sampling()->set_repetition_penalty(0.0f);  // proto3's unset
  edges.mutable_sampling()->set_frequency_penalty(-2.0f);
  edges.mutable_sampling()->set_presence_penalty(2.0f);
  served = Generate(edges);
  EXPECT_TRUE(served.status.ok()) << served.status.error_message();
  EXPECT_FALSE(served.ids.empty());
}

TEST_F(HostTest, CancelEndsWithinOneTokenAndSessionIsReusable) {
  Start(1, 8, "10");
  v1::GenerateRequest request = Request(std::string(200, 'x'));
  request.set_request_id("long-one");
  int received_at_cancel = -1;
  Stream s = Generate(request, nullptr, [&](int n) {
    if (n == 3) {
      grpc::ClientContext ctx;
      v1::CancelRequest cancel;
      cancel.set_request_id("long-one");
      v1::CancelResponse response;
      ASSERT_TRUE(stub_->Cancel(&ctx, cancel, &response).ok());
      EXPECT_TRUE(response.found());
      received_at_cancel = n;
    }
  });
  EXPECT_EQ(s.status.error_code(), grpc::StatusCode::CANCELLED) << s.status.error_message();
  EXPECT_FALSE(s.has_finished);
  ASSERT_EQ(received_at_cancel, 3);
  EXPECT_LE(s.ids.size(), 4u);  // at most the one step that was running

  // The same session serves the next request; its cumulative statistics tell how many tokens the
  // cancelled request sampled in total.
  Stream next = Generate(Request("ok"));
  ASSERT_TRUE(next.status.ok()) << next.status.error_message();
  EXPECT_EQ(next.text, "ok");
  const double generated = next.finished.stats().plugin().at("tokens_generated");
  EXPECT_LE(generated - next.finished.usage().completion_tokens(), received_at_cancel + 1);
}

TEST_F(HostTest, StopFinishesNormally) {
  Start(1, 8, "10");
  // 200 tokens at 10 ms each: the stop lands long before the end even when a loaded machine
  // delays the Cancel call by many steps (asserting <= 3 tokens failed under load).
  v1::GenerateRequest request = Request(std::string(200, 'y'));
  request.set_request_id("to-stop");
  Stream s = Generate(request, nullptr, [&](int n) {
    if (n == 2) {
      grpc::ClientContext ctx;
      v1::CancelRequest stop;
      stop.set_request_id("to-stop");
      stop.set_stop(true);
      v1::CancelResponse response;
      EXPECT_TRUE(stub_->Cancel(&ctx, stop, &response).ok());
    }
  });
  ASSERT_TRUE(s.status.ok()) << s.status.error_message();
  ASSERT_TRUE(s.has_finished);
  EXPECT_EQ(s.finished.reason(), v1::FINISH_REASON_STOPPED);
  EXPECT_GE(s.ids.size(), 2u);
  EXPECT_LT(s.ids.size(), 200u);
}

TEST_F(HostTest, ClientDisconnectCancelsItsRequest) {
  Start(1, 8, "10");
  grpc::ClientContext ctx;
  Stream s = Generate(Request(std::string(200, 'z')), &ctx, [&](int n) {
    if (n == 2) ctx.TryCancel();
  });
  EXPECT_EQ(s.status.error_code(), grpc::StatusCode::CANCELLED);
  EXPECT_TRUE(WaitFor([&] { return Metrics().requests_cancelled() == 1; }));
  // The host is free again (it would otherwise still be echoing 200 bytes at 10 ms each).
  Stream next = Generate(Request("free"));
  ASSERT_TRUE(next.status.ok()) << next.status.error_message();
  EXPECT_EQ(next.text, "free");
  EXPECT_LT(next.finished.stats().plugin().at("tokens_generated"), 200.0);
}

// Every accepted request is, in any one metrics snapshot, in exactly one place: queued, active,
// or counted as ok / failed / cancelled. A request that left `active` before its outcome was
// counted made clients that poll "active == 0, then cancelled grew" fail now and then.
TEST_F(HostTest, MetricsAccountForEveryRequestInEverySnapshot) {
  Start(/*workers=*/2, /*queue=*/64, "1");
  std::atomic<bool> done{false};
  std::atomic<int> snapshots{0};
  std::atomic<bool> any_broken{false};
  std::string broken;  // the first snapshot that failed (written once by the poller)
  std::thread poller([&] {
    while (!done.load()) {
      const v1::MetricsResponse m = engine_->Metrics();
      const uint64_t placed = m.requests_ok() + m.requests_failed() + m.requests_cancelled() +
                              static_cast<uint64_t>(m.requests_active()) +
                              static_cast<uint64_t>(m.queue_depth());
      if (placed != m.requests_total() && !any_broken.load()) {
        broken = m.DebugString();
        any_broken = true;
      }
      ++snapshots;
    }
  });
  // Rounds of four: two that finish, one cancelled while it runs, one cancelled while queued
  // behind the two workers.
  for (int round = 0; round < 40 && !any_broken.load(); ++round) {
    std::vector<std::string> ids;
    std::atomic<int> ended{0};
    for (int i = 0; i < 4; ++i) {
      EventSink sink;
      sink.on_done = [&](const absl::Status&, const v1::Finished&) { ++ended; };
      GenerationInput input = GenerationInput::From(Request(i < 2 ? "ab" : std::string(50, 'c')));
      input.request_id = absl::StrCat("r", round, "-", i);
      ids.push_back(input.request_id);
      auto submitted = engine_->Submit(std::move(input), std::move(sink));
      ASSERT_OK(submitted.status());
    }
    engine_->Cancel(ids[3], /*stop=*/false);
    std::this_thread::sleep_for(std::chrono::milliseconds(round % 5));
    engine_->Cancel(ids[2], /*stop=*/false);
    ASSERT_TRUE(WaitFor([&] { return ended.load() == 4; }));
  }
  done = true;
  poller.join();
  EXPECT_EQ(broken, "");
  EXPECT_GT(snapshots.load(), 40);
  const v1::MetricsResponse m = engine_->Metrics();
  EXPECT_EQ(m.requests_total(), 160u);
  EXPECT_EQ(m.requests_active(), 0);
  EXPECT_GE(m.requests_cancelled(), 40u);  // the queued one of every round at least
}

TEST_F(HostTest, DeadlineEndsTheRequest) {
  Start(1, 8, "10");
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(200));
  Stream s = Generate(Request(std::string(200, 'd')), &ctx);
  EXPECT_EQ(s.status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  EXPECT_TRUE(WaitFor([&] { return Metrics().requests_cancelled() == 1; }));
}

TEST_F(HostTest, FullQueueAnswersResourceExhausted) {
  Start(/*workers=*/1, /*queue=*/1, "10");
  // A: running.
  grpc::ClientContext ctx_a;
  auto a = stub_->Generate(&ctx_a, Request(std::string(200, 'a')));
  v1::GenerateEvent e;
  ASSERT_TRUE(a->Read(&e));
  ASSERT_TRUE(e.has_started());
  // B: waiting in the queue.
  grpc::ClientContext ctx_b;
  auto b = stub_->Generate(&ctx_b, Request("b"));
  ASSERT_TRUE(WaitFor([&] { return Metrics().queue_depth() == 1; }));
  // C: no room.
  Stream c = Generate(Request("c"));
  EXPECT_EQ(c.status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(c.status.error_message(), HasSubstr("queue is full"));
  EXPECT_EQ(Metrics().requests_rejected(), 1u);
  ctx_a.TryCancel();
  while (a->Read(&e)) {
  }
  EXPECT_EQ(a->Finish().error_code(), grpc::StatusCode::CANCELLED);
  std::string b_text;
  while (b->Read(&e)) {
    if (e.has_token()) b_text += e.token().text();
  }
  EXPECT_TRUE(b->Finish().ok());
  EXPECT_EQ(b_text, "b");
}

// A burst that arrives while workers are idle is not waiting for a thread: with 2 workers and a
// queue of 1, three requests at once all run (two at once, the third queued). The host counted
// the burst against the queue before the idle workers woke and refused the third (and, from a
// non-C++ client, 24 of 40 parallel requests on the default 4 workers + 16 queued).
TEST_F(HostTest, BurstOnIdleWorkersIsAdmittedUpToWorkersPlusQueue) {
  Start(/*workers=*/2, /*queue=*/1, "10", /*max_context=*/4096);
  for (int round = 0; round < 5; ++round) {
    std::mutex mu;
    std::condition_variable cv;
    int done = 0;
    std::vector<absl::Status> ends(3);
    std::vector<absl::Status> submitted;
    for (int i = 0; i < 3; ++i) {
      EventSink sink;
      sink.on_done = [&, i](const absl::Status& status, const v1::Finished&) {
        std::lock_guard<std::mutex> lock(mu);
        ends[i] = status;
        ++done;
        cv.notify_all();
      };
      auto request = engine_->Submit(GenerationInput::From(Request("burst")), std::move(sink));
      submitted.push_back(request.status());
      if (!request.ok()) {
        std::lock_guard<std::mutex> lock(mu);
        ++done;
      }
    }
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return done == 3; });
    for (int i = 0; i < 3; ++i) {
      EXPECT_OK(submitted[i]) << "round " << round << " request " << i;
      if (submitted[i].ok()) {
        EXPECT_OK(ends[i]);
      }
    }
  }
  EXPECT_EQ(Metrics().requests_rejected(), 0u);
  // Full for real: two running, one queued, the fourth is refused.
  std::vector<std::unique_ptr<grpc::ClientContext>> contexts;
  std::vector<std::unique_ptr<grpc::ClientReader<v1::GenerateEvent>>> readers;
  for (int i = 0; i < 3; ++i) {
    contexts.push_back(std::make_unique<grpc::ClientContext>());
    readers.push_back(stub_->Generate(contexts.back().get(), Request(std::string(1000, 'r'))));
  }
  ASSERT_TRUE(WaitFor([&] {
    v1::MetricsResponse m = Metrics();
    return m.requests_active() == 2 && m.queue_depth() == 1;
  }));
  Stream refused = Generate(Request("no room"));
  EXPECT_EQ(refused.status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(refused.status.error_message(), HasSubstr("1 waiting, capacity 1"));
  for (auto& ctx : contexts) ctx->TryCancel();
  v1::GenerateEvent e;
  for (auto& reader : readers) {
    while (reader->Read(&e)) {
    }
    EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::CANCELLED);
  }
}

TEST_F(HostTest, UnknownModelIsNotFound) {
  Start();
  v1::GenerateRequest request = Request("x");
  request.set_model("no-such-model");
  Stream s = Generate(request);
  EXPECT_EQ(s.status.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_THAT(s.status.error_message(), HasSubstr("no-such-model"));
  grpc::ClientContext ctx;
  v1::TokenizeRequest tok;
  tok.set_model("no-such-model");
  v1::TokenizeResponse response;
  EXPECT_EQ(stub_->Tokenize(&ctx, tok, &response).error_code(), grpc::StatusCode::NOT_FOUND);
}

// Every LoadModel call runs on a thread of its own. Those threads used to be kept joinable until
// the host shut down, each holding its 8 MiB stack mapping and its touched pages after it ended:
// a client that makes sure of its model at every start (here: the model already loaded, answered
// at once) grew a long-running host by one thread per call.
TEST_F(HostTest, LoadModelCallsKeepNoThreadAfterTheyEnd) {
  Start();
  for (int i = 0; i < 8; ++i) {
    grpc::ClientContext ctx;
    v1::LoadModelRequest load;
    load.set_model_dir(MakeModelDir("echo"));
    load.set_id("echo");
    auto reader = stub_->LoadModel(&ctx, load);
    v1::LoadModelEvent event;
    bool loaded = false;
    while (reader->Read(&event)) loaded = loaded || event.has_loaded();
    ASSERT_TRUE(reader->Finish().ok());
    EXPECT_TRUE(loaded);
  }
  // A thread ends just after its stream does: wait for that (a hang guard, not a timing assert).
  const auto guard = Clock::now() + std::chrono::seconds(30);
  while (server_->loaders_running() > 0 && Clock::now() < guard) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(server_->loaders_running(), 0);
}

TEST_F(HostTest, UnservedDirectoryIsNotFoundAndNamed) {
  Start();
  const std::string dir = ::testing::TempDir() + "/not_a_model_" + std::to_string(getpid());
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/config.json") << R"({"model_type": "something_else"})";
  grpc::ClientContext ctx;
  v1::LoadModelRequest load;
  load.set_model_dir(dir);
  auto reader = stub_->LoadModel(&ctx, load);
  v1::LoadModelEvent e;
  while (reader->Read(&e)) {
  }
  grpc::Status status = reader->Finish();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_THAT(status.error_message(), HasSubstr(dir));
  EXPECT_THAT(status.error_message(), HasSubstr("coli_echo"));
}

TEST_F(HostTest, FollowUpPromptPrefillsOnlyTheTail) {
  Start();
  Stream first = Generate(Request("hello"));
  ASSERT_TRUE(first.status.ok());
  EXPECT_EQ(first.text, "hello");
  EXPECT_EQ(first.started.tokens_reused(), 0);
  EXPECT_EQ(first.started.tokens_computed(), 5);
  // The record is now the prompt plus the fed reply tokens ("hello" + "hello"; <eos> was never
  // fed), so the follow-up that extends it computes only " more".
  Stream second = Generate(Request("hellohello more"));
  ASSERT_TRUE(second.status.ok());
  EXPECT_EQ(second.started.tokens_reused(), 10);
  EXPECT_EQ(second.started.tokens_computed(), 5);
  EXPECT_EQ(second.finished.usage().tokens_reused(), 10);
  // A prompt that diverges resets and computes everything.
  Stream third = Generate(Request("goodbye"));
  EXPECT_EQ(third.started.tokens_reused(), 0);
  EXPECT_EQ(third.started.tokens_computed(), 7);
  // Named sessions keep separate state.
  v1::GenerateRequest other = Request("hello");
  other.set_session("other");
  Stream fourth = Generate(other);
  EXPECT_EQ(fourth.started.tokens_reused(), 0);
  EXPECT_EQ(Metrics().tokens_reused(), 10u);
}

// A client that names a new session per conversation: the host keeps at most max_sessions per
// model and closes the least recently used idle one (it grew without bound: ~434 MB each on K3).
TEST_F(HostTest, SessionsPastMaxSessionsCloseTheLeastRecentlyUsed) {
  max_sessions_ = 3;
  Start();
  auto named = [this](const std::string& session, const std::string& prompt) {
    v1::GenerateRequest r = Request(prompt);
    r.set_session(session);
    Stream s = Generate(r);
    EXPECT_TRUE(s.status.ok()) << s.status.error_message();
    return s.started.tokens_reused();
  };
  for (const char* name : {"s0", "s1", "s2"}) EXPECT_EQ(named(name, "hello"), 0);
  EXPECT_EQ(named("s0", "hellohello more"), 10);  // s0 kept its state; s1 is now the oldest
  EXPECT_EQ(named("s3", "hello"), 0);             // a fourth session closes s1
  EXPECT_EQ(named("s2", "hellohello more"), 10);  // s2 was kept
  EXPECT_EQ(named("s1", "hellohello more"), 0);   // s1 starts again (and closes s0)
  const v1::MetricsResponse metrics = Metrics();
  std::map<std::string, double> stats;
  for (const v1::ModelStat& st : metrics.model_stats()) stats[st.name()] = st.value();
  EXPECT_EQ(stats["host_sessions"], 3);
  EXPECT_EQ(stats["host_sessions_closed"], 2);
}

TEST_F(HostTest, NamedErrorsAndContextClamp) {
  Start(1, 8, "0", /*max_context=*/32);
  Stream empty = Generate(Request(""));
  EXPECT_EQ(empty.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(empty.status.error_message(), "EMPTY_PROMPT");
  Stream big = Generate(Request(std::string(40, 'q')));
  EXPECT_EQ(big.status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(big.status.error_message(),
              HasSubstr("CONTEXT_EXCEEDED prompt_tokens=40 capacity=32"));
  // 30 tokens of prompt leave 2 of context: max_tokens 100 is clamped.
  Stream clamped = Generate(Request(std::string(30, 'r'), 100));
  ASSERT_TRUE(clamped.status.ok()) << clamped.status.error_message();
  EXPECT_EQ(clamped.started.max_tokens(), 2);
  EXPECT_EQ(clamped.ids.size(), 2u);
  EXPECT_EQ(clamped.finished.reason(), v1::FINISH_REASON_CONTEXT);
}

TEST_F(HostTest, ChatStreamsContentDeltasAndEndOfMessage) {
  Start();
  v1::ChatRequest request;
  request.set_model("echo");
  request.set_request_json(
      R"({"messages": [{"role": "system", "content": "be brief"},
                       {"role": "user", "content": "hi there"}]})");
  grpc::ClientContext ctx;
  auto reader = stub_->Chat(&ctx, request);
  v1::ChatEvent e;
  std::string content;
  bool end = false;
  v1::Finished finished;
  while (reader->Read(&e)) {
    if (e.has_token()) {
      for (const auto& d : e.token().deltas()) {
        if (d.channel() == v1::CHANNEL_CONTENT) content += d.text();
        end = end || d.end_of_message();
      }
    }
    if (e.has_finished()) finished = e.finished();
  }
  ASSERT_TRUE(reader->Finish().ok());
  EXPECT_EQ(content, "be briefhi there");  // the echo repeats every message's text
  EXPECT_TRUE(end);
  EXPECT_EQ(finished.reason(), v1::FINISH_REASON_STOP);

  v1::ChatRequest bad = request;
  bad.set_request_json(R"({"messages": [{"role": "wizard", "content": "x"}]})");
  grpc::ClientContext ctx2;
  auto bad_reader = stub_->Chat(&ctx2, bad);
  while (bad_reader->Read(&e)) {
  }
  grpc::Status status = bad_reader->Finish();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), HasSubstr("wizard"));
  // The prompt is made when the request is submitted; one that cannot be made still counts.
  v1::MetricsResponse m = Metrics();
  EXPECT_EQ(m.requests_total(), 2u);
  EXPECT_EQ(m.requests_ok(), 1u);
  EXPECT_EQ(m.requests_failed(), 1u);
}

// ABI 1.4: the response_format reaches the plugin's prefill from the Chat body's member (a bare
// "json_object" string becomes an object; {"type":"text"} is none), from ChatRequest's own field
// (which wins) and from GenerateRequest's. The echo family enforces none and refuses one quoting
// the text it received, so each refusal shows what the host sent.
TEST_F(HostTest, ResponseFormatReachesThePlugin) {
  Start();
  auto chat = [&](const std::string& body, const std::string& field) {
    v1::ChatRequest request;
    request.set_model("echo");
    request.set_request_json(body);
    request.set_response_format(field);
    grpc::ClientContext ctx;
    auto reader = stub_->Chat(&ctx, request);
    v1::ChatEvent e;
    std::string content;
    while (reader->Read(&e)) {
      if (!e.has_token()) continue;
      for (const auto& d : e.token().deltas()) content += d.text();
    }
    grpc::Status status = reader->Finish();
    return std::make_pair(status, content);
  };
  const std::string messages = R"("messages": [{"role": "user", "content": "hi"}])";
  auto [object, unused1] =
      chat("{" + messages + R"(, "response_format": {"type": "json_object"}})", "");
  EXPECT_EQ(object.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(
      object.error_message(),
      HasSubstr(R"(response_format: the echo family cannot enforce {"type":"json_object"})"));
  auto [bare, unused2] = chat("{" + messages + R"(, "response_format": "json_object"})", "");
  EXPECT_THAT(bare.error_message(), HasSubstr(R"(cannot enforce {"type":"json_object"})"));
  auto [field, unused3] = chat("{" + messages + R"(, "response_format": {"type": "json_object"}})",
                               R"({"type":"json_schema","json_schema":{"schema":{}}})");
  EXPECT_THAT(field.error_message(),
              HasSubstr(R"(cannot enforce {"type":"json_schema","json_schema":{"schema":{}}})"));
  auto [text, content] = chat("{" + messages + R"(, "response_format": {"type": "text"}})", "");
  EXPECT_TRUE(text.ok()) << text.error_message();
  EXPECT_EQ(content, "hi");
  auto [none, unused4] = chat("{" + messages + "}", "");
  EXPECT_TRUE(none.ok()) << none.error_message();

  v1::GenerateRequest generate = Request("hello", 3);
  generate.set_response_format(R"({"type":"json_object"})");
  Stream refused = Generate(generate);
  EXPECT_EQ(refused.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(refused.status.error_message(),
              HasSubstr(R"(cannot enforce {"type":"json_object"})"));
  EXPECT_TRUE(refused.ids.empty());
}

// tool_choice auto (or none given) with tools: the engine sends the coli_tool_calls extension
// with mode "auto" (the plugin constrains calls the model opens, docs/status/constrained.md);
// the echo family refuses every format and quotes it, which shows what travelled.
TEST_F(HostTest, ToolChoiceAutoTravelsAsTheLazyExtension) {
  Start();
  auto chat = [&](const std::string& extra) {
    v1::ChatRequest request;
    request.set_model("echo");
    request.set_request_json(
        R"({"messages": [{"role": "user", "content": "hi"}], "tools": [{"type": "function",)"
        R"( "function": {"name": "f", "parameters": {"type": "object"}, "strict": true}}])" +
        extra + "}");
    grpc::ClientContext ctx;
    auto reader = stub_->Chat(&ctx, request);
    v1::ChatEvent e;
    while (reader->Read(&e)) {
    }
    return reader->Finish();
  };
  const std::string tool = R"("tools":[{"name":"f","parameters":{"type":"object"},"strict":true}])";
  for (const std::string& extra : {std::string(), std::string(R"(, "tool_choice": "auto")")}) {
    const grpc::Status status = chat(extra);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_THAT(status.error_message(),
                HasSubstr(R"({"mode":"auto",)" + tool + R"(,"type":"coli_tool_calls"})"));
  }
  const grpc::Status single = chat(R"(, "parallel_tool_calls": false)");
  EXPECT_THAT(single.error_message(), HasSubstr(R"("single":true)"));
  EXPECT_THAT(single.error_message(), HasSubstr(R"("mode":"auto")"));
  // With a response_format, auto carries it (the answer is that value or tool calls).
  const grpc::Status format = chat(R"(, "response_format": {"type": "json_object"})");
  EXPECT_THAT(format.error_message(),
              HasSubstr(R"({"mode":"auto","response_format":{"type":"json_object"},)" + tool));
  // tool_choice none: mode none, no tools (no call may open); beside a response_format the
  // format alone.
  EXPECT_THAT(chat(R"(, "tool_choice": "none")").error_message(),
              HasSubstr(R"({"mode":"none","tools":[],"type":"coli_tool_calls"})"));
  EXPECT_THAT(chat(R"(, "tool_choice": "none", "response_format": {"type": "json_object"})")
                  .error_message(),
              HasSubstr(R"(cannot enforce {"type":"json_object"})"));
  // No tools: nothing to enforce, the echo answers.
  v1::ChatRequest plain;
  plain.set_model("echo");
  plain.set_request_json(R"({"messages": [{"role": "user", "content": "hi"}]})");
  grpc::ClientContext ctx;
  auto reader = stub_->Chat(&ctx, plain);
  v1::ChatEvent e;
  while (reader->Read(&e)) {
  }
  EXPECT_TRUE(reader->Finish().ok());
}

TEST_F(HostTest, TokenizeDetokenizeApplyTemplate) {
  Start();
  grpc::ClientContext c1;
  v1::TokenizeRequest tok;
  tok.set_text("a<eos>");
  tok.set_allow_special(true);
  v1::TokenizeResponse ids;
  ASSERT_TRUE(stub_->Tokenize(&c1, tok, &ids).ok());
  EXPECT_THAT(std::vector<int32_t>(ids.ids().begin(), ids.ids().end()),
              ::testing::ElementsAre('a', 257));
  grpc::ClientContext c2;
  v1::DetokenizeRequest detok;
  detok.add_ids('o');
  detok.add_ids('k');
  v1::DetokenizeResponse text;
  ASSERT_TRUE(stub_->Detokenize(&c2, detok, &text).ok());
  EXPECT_EQ(text.text(), "ok");
  grpc::ClientContext c3;
  v1::ApplyTemplateRequest apply;
  apply.set_request_json(R"({"messages": [{"role": "user", "content": "q"}]})");
  apply.set_add_generation_prompt(true);
  v1::ApplyTemplateResponse rendered;
  ASSERT_TRUE(stub_->ApplyTemplate(&c3, apply, &rendered).ok());
  EXPECT_EQ(rendered.text(), "<user>q<assistant>");
  EXPECT_THAT(std::vector<int32_t>(rendered.ids().begin(), rendered.ids().end()),
              ::testing::ElementsAre(258, 'q', 259));
}

TEST_F(HostTest, HealthListModelsAndMetrics) {
  Start();
  Stream s = Generate(Request("abc"));
  ASSERT_TRUE(s.status.ok());
  grpc::ClientContext c1;
  v1::HealthResponse health;
  ASSERT_TRUE(stub_->Health(&c1, v1::HealthRequest(), &health).ok());
  EXPECT_TRUE(health.serving());
  EXPECT_EQ(health.models_loaded(), 1);
  ASSERT_EQ(health.plugins_size(), 1);
  EXPECT_EQ(health.plugins(0).family(), "coli_echo");
  EXPECT_EQ(health.abi_version(), "1.11");
  // ABI 1.8: the plugin's environment switches, as it declared them.
  ASSERT_EQ(health.plugins(0).switches_size(), 2);  // and its 1.10 request default
  EXPECT_EQ(health.plugins(0).switches(0).name(), "TEST_FAMILY_KNOB");
  EXPECT_EQ(health.plugins(0).switches(0).family(), "coli_echo");
  EXPECT_EQ(health.plugins(0).switches(0).extra_key(), "knob");
  EXPECT_EQ(health.plugins(0).switches(0).int_max(), 9);
  EXPECT_EQ(health.plugins(0).switches(1).field(), COLI_SWITCH_FIELD_REQUEST);
  EXPECT_EQ(health.plugins(0).switches(1).extra_key(), "echo_greeting");
  grpc::ClientContext c2;
  v1::ListModelsResponse models;
  ASSERT_TRUE(stub_->ListModels(&c2, v1::ListModelsRequest(), &models).ok());
  ASSERT_EQ(models.models_size(), 1);
  EXPECT_EQ(models.models(0).id(), "echo");
  EXPECT_EQ(models.models(0).family(), "coli_echo");
  EXPECT_EQ(models.models(0).vocab_size(), 260);
  EXPECT_TRUE(models.models(0).chat_template());
  v1::MetricsResponse m = Metrics();
  EXPECT_EQ(m.requests_total(), 1u);
  EXPECT_EQ(m.requests_ok(), 1u);
  EXPECT_EQ(m.prompt_tokens(), 3u);
  EXPECT_EQ(m.completion_tokens(), 4u);
  EXPECT_EQ(m.plugin().at("tokens_generated"), 4.0);
  EXPECT_GT(m.ttft_seconds_last(), 0.0);
  // The standard grpc.health.v1 service answers too: an empty HealthCheckRequest (service "")
  // gets HealthCheckResponse{status: SERVING}, encoded as field 1 varint 1.
  grpc::GenericStub generic(channel_);
  grpc::ClientContext c3;
  grpc::ByteBuffer request, response;
  grpc::Slice empty("");
  request = grpc::ByteBuffer(&empty, 1);
  std::promise<grpc::Status> done;
  generic.UnaryCall(&c3, "/grpc.health.v1.Health/Check", grpc::StubOptions(), &request, &response,
                    [&](grpc::Status st) { done.set_value(st); });
  ASSERT_TRUE(done.get_future().get().ok());
  std::vector<grpc::Slice> slices;
  ASSERT_TRUE(response.Dump(&slices).ok());
  std::string bytes;
  for (const auto& slice : slices) bytes += std::string(slice.begin(), slice.end());
  EXPECT_EQ(bytes, std::string("\x08\x01", 2));
}

// Health probes name the service (grpc_health_probe -service=coli.v1.Coli, Kubernetes'
// grpc.service): it is SERVING like the server as a whole, an unknown name is NOT_FOUND.
TEST_F(HostTest, StandardHealthCheckAnswersForTheColiService) {
  Start();
  grpc::GenericStub generic(channel_);
  auto check = [&](const std::string& service) {
    grpc::health::v1::HealthCheckRequest request;
    request.set_service(service);
    const std::string bytes = request.SerializeAsString();
    grpc::Slice slice(bytes);
    grpc::ByteBuffer request_buffer(&slice, 1), response_buffer;
    grpc::ClientContext ctx;
    std::promise<grpc::Status> done;
    generic.UnaryCall(&ctx, "/grpc.health.v1.Health/Check", grpc::StubOptions(), &request_buffer,
                      &response_buffer, [&](grpc::Status st) { done.set_value(st); });
    grpc::Status status = done.get_future().get();
    grpc::health::v1::HealthCheckResponse response;
    std::vector<grpc::Slice> slices;
    if (status.ok() && response_buffer.Dump(&slices).ok()) {
      std::string out;
      for (const auto& piece : slices) out += std::string(piece.begin(), piece.end());
      EXPECT_TRUE(response.ParseFromString(out));
    }
    return std::make_pair(status, response.status());
  };
  auto [whole, whole_status] = check("");
  ASSERT_TRUE(whole.ok()) << whole.error_message();
  EXPECT_EQ(whole_status, grpc::health::v1::HealthCheckResponse::SERVING);
  auto [coli, coli_status] = check("coli.v1.Coli");
  ASSERT_TRUE(coli.ok()) << coli.error_message();
  EXPECT_EQ(coli_status, grpc::health::v1::HealthCheckResponse::SERVING);
  auto [unknown, unknown_status] = check("no.such.Service");
  EXPECT_EQ(unknown.error_code(), grpc::StatusCode::NOT_FOUND);
}

// Server reflection lists grpc.health.v1.Health; it answers from the generated descriptor pool,
// which held no file for it (gRPC's health service is built without protobuf descriptors), so
// grpcurl could list the service but not describe or call it. The host links one.
TEST(HostServer, HealthServiceDescriptorIsInTheGeneratedPool) {
  const auto* pool = google::protobuf::DescriptorPool::generated_pool();
  const auto* health = pool->FindServiceByName("grpc.health.v1.Health");
  ASSERT_NE(health, nullptr);
  EXPECT_EQ(health->file()->name(), "grpc/health/v1/health.proto");
  ASSERT_NE(health->FindMethodByName("Check"), nullptr);
  ASSERT_NE(health->FindMethodByName("Watch"), nullptr);
  EXPECT_TRUE(health->FindMethodByName("Watch")->server_streaming());
  EXPECT_NE(pool->FindServiceByName("coli.v1.Coli"), nullptr);
}

// A second host on a busy TCP port fails to start: gRPC's default SO_REUSEPORT let it start and
// take half of the connections from the first.
TEST(HostServer, SecondServerOnTheSameTcpPortIsRefused) {
  EngineOptions options;
  options.plugin_dir = COLI_ECHO_PLUGIN_DIR;
  options.workers = 1;
  Engine engine(options);
  auto first = HostServer::Start(&engine, {.listen = "127.0.0.1:0"});
  ASSERT_OK(first.status());
  const std::string address = (*first)->address();
  Engine engine2(options);
  auto second = HostServer::Start(&engine2, {.listen = address});
  EXPECT_FALSE(second.ok()) << "a second server started on " << address;
  EXPECT_THAT(second.status().message(), HasSubstr(address));
  (*first)->Shutdown();
}

// A Unix socket path: a live host's socket is never taken over (the second host used to unlink
// it, leaving the first unreachable, and unlink it again at exit); a stale socket (its listener
// gone) is replaced; a path that is not a socket is refused and kept.
TEST(HostServer, UnixSocketPathIsNeverTakenFromALiveHostOrAFile) {
  const std::string dir = ::testing::TempDir() + "/host_unix_" + std::to_string(getpid());
  std::filesystem::create_directories(dir);
  const std::string path = dir + "/h.sock";
  std::filesystem::remove(path);
  EngineOptions options;
  options.plugin_dir = COLI_ECHO_PLUGIN_DIR;
  options.workers = 1;
  Engine engine(options);
  auto first = HostServer::Start(&engine, {.listen = "unix:" + path});
  ASSERT_OK(first.status());
  Engine engine2(options);
  auto second = HostServer::Start(&engine2, {.listen = "unix:" + path});
  EXPECT_THAT(second.status(), StatusIs(absl::StatusCode::kAlreadyExists));
  EXPECT_THAT(second.status().message(), HasSubstr("another process is listening"));
  {  // the first still answers on its path
    auto stub =
        v1::Coli::NewStub(grpc::CreateChannel("unix:" + path, grpc::InsecureChannelCredentials()));
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
    v1::HealthResponse health;
    EXPECT_TRUE(stub->Health(&ctx, v1::HealthRequest(), &health).ok());
  }
  (*first)->Shutdown();

  // A stale socket: bound, never unlinked, nobody listening.
  std::filesystem::remove(path);
  const int fd = socket(AF_UNIX, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  std::memcpy(address.sun_path, path.data(), path.size());
  ASSERT_EQ(bind(fd, reinterpret_cast<const sockaddr*>(&address), sizeof(address)), 0);
  close(fd);
  ASSERT_TRUE(std::filesystem::is_socket(path));
  Engine engine3(options);
  auto third = HostServer::Start(&engine3, {.listen = "unix:" + path});
  ASSERT_OK(third.status());
  (*third)->Shutdown();

  // Not a socket: refused, the file kept.
  std::filesystem::remove(path);
  std::ofstream(path) << "precious";
  Engine engine4(options);
  auto fourth = HostServer::Start(&engine4, {.listen = "unix:" + path});
  EXPECT_THAT(fourth.status(), StatusIs(absl::StatusCode::kFailedPrecondition));
  EXPECT_THAT(fourth.status().message(), HasSubstr("not a socket"));
  std::ifstream kept(path);
  std::string content;
  kept >> content;
  EXPECT_EQ(content, "precious");
  std::filesystem::remove(path);
}

TEST_F(HostTest, ShutdownWithRequestsInFlightEndsThemCleanly) {
  Start(/*workers=*/1, /*queue=*/4, "10");
  std::vector<std::thread> clients;
  std::vector<grpc::Status> results(3);
  std::atomic<int> started{0};
  for (int i = 0; i < 3; ++i) {
    clients.emplace_back([&, i] {
      grpc::ClientContext ctx;
      v1::GenerateRequest request = Request(std::string(200, 's'));
      request.set_session("s" + std::to_string(i % 2));
      auto reader = stub_->Generate(&ctx, request);
      v1::GenerateEvent e;
      bool counted = false;
      while (reader->Read(&e)) {
        if (!counted) {
          ++started;
          counted = true;
        }
      }
      results[i] = reader->Finish();
    });
  }
  ASSERT_TRUE(WaitFor([&] { return started.load() >= 1 && Metrics().queue_depth() == 2; }));
  server_->Shutdown();
  for (auto& t : clients) t.join();
  for (const auto& status : results) {
    EXPECT_FALSE(status.ok());
    EXPECT_TRUE(status.error_code() == grpc::StatusCode::UNAVAILABLE ||
                status.error_code() == grpc::StatusCode::CANCELLED)
        << status.error_code() << " " << status.error_message();
  }
}

}  // namespace
}  // namespace coli::host
