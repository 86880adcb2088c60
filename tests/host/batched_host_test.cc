// Continuous batching in the host (EngineOptions::max_batch): concurrent requests of one model
// share decode calls, on the kimi_k3 plugin and the tiny fixture. The reference for every
// request is the same request run alone on an engine that never batches (max_batch 1, one
// worker); the plugin guarantees batched rows are bit-identical to lone rows, so the tokens must
// be equal. That batching really happened is read from the plugin's per-session stats
// (batched_steps: steps that ran in a pass of more than one row; batched_rows: those passes'
// rows summed; decode_rides / mixed_rows: decode steps carried by another session's prefill
// chunk passes).
#include <algorithm>
#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "host/engine.h"
#include "host/plugin.h"
#include "nlohmann/json.hpp"

namespace coli::host {
namespace {

struct Spec {
  std::string id, session, prompt;
  float temperature = 0, top_p = 0;
  int32_t top_k = 0;
  uint64_t seed = 0;
  int32_t max_tokens = 32;
};

struct Out {
  absl::Status status = absl::UnknownError("no on_done");
  v1::Finished finished;
  std::vector<int32_t> ids;
  bool done = false;
};

double Stat(const v1::Finished& f, const std::string& key) {
  auto it = f.stats().plugin().find(key);
  return it == f.stats().plugin().end() ? 0.0 : it->second;
}

std::vector<Spec> Specs() {
  return {
      {"a", "sa", "The quick brown fox jumps over the lazy dog."},
      {"b", "sb", "Once upon a time, in a land far away,", 0.8f, 0.9f, 0, 7},
      {"c", "sc", "1, 2, 3, 4, 5,"},
      {"d", "sd", "Hello world! Hello world! Hello", 1.0f, 0.0f, 20, 11},
  };
}

class HostBatchedTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(std::filesystem::exists(std::string(COLI_K3_TINY_DIR) + "/config.json"))
        << "tiny fixture missing: build target k3_tiny_fixture";
  }

  // Conversations A, B and C turn by turn on unnamed requests: each turn reuses all of its
  // conversation's previous state.
  static void ExpectConversationsKeepTheirSessions(std::unique_ptr<Engine> engine);

  static std::unique_ptr<Engine> MakeEngine(int workers, int max_batch, int decode_delay_ms,
                                            int pool_sessions = 0) {
    auto engine = std::make_unique<Engine>(EngineOptions{.plugin_dir = COLI_PLUGIN_DIR_FOR_TEST,
                                                         .workers = workers,
                                                         .decode_delay_ms = decode_delay_ms,
                                                         .max_batch = max_batch,
                                                         .pool_sessions = pool_sessions});
    v1::LoadModelRequest load;
    load.set_model_dir(COLI_K3_TINY_DIR);
    load.set_id("k3");
    auto info = engine->LoadModel(load, nullptr);
    EXPECT_TRUE(info.ok()) << info.status();
    return engine;
  }

  // Runs `ids` as one unnamed request (a pooled session) on `model` and waits for its end.
  static Out RunIds(Engine& engine, const std::string& model, std::vector<int32_t> ids,
                    int max_tokens) {
    std::mutex mu;
    std::condition_variable cv;
    Out out;
    GenerationInput in;
    in.model = model;
    in.prompt_ids = std::move(ids);
    in.max_tokens = max_tokens;
    EventSink sink;
    sink.on_token = [&](const v1::Token& t, std::span<const v1::ChatDelta>) {
      std::lock_guard<std::mutex> lock(mu);
      out.ids.push_back(t.id());
    };
    sink.on_done = [&](const absl::Status& st, const v1::Finished& f) {
      std::lock_guard<std::mutex> lock(mu);
      out.status = st;
      out.finished = f;
      out.done = true;
      cv.notify_all();
    };
    EXPECT_OK(engine.Submit(std::move(in), std::move(sink)).status());
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return out.done; });
    EXPECT_OK(out.status);
    return out;
  }

  // Submits `spec` as a request whose tokens and end land in *out (under mu; cv notified);
  // on_token calls hook(count) after each token.
  static void Submit(Engine& engine, const Spec& spec, Out* out, std::mutex& mu,
                     std::condition_variable& cv,
                     const std::function<void(size_t)>& hook = nullptr) {
    GenerationInput in;
    in.model = "k3";
    in.request_id = spec.id;
    in.session = spec.session;
    in.prompt = spec.prompt;
    in.max_tokens = spec.max_tokens;
    in.sampling.set_temperature(spec.temperature);
    in.sampling.set_top_p(spec.top_p);
    in.sampling.set_top_k(spec.top_k);
    in.sampling.set_seed(spec.seed);
    EventSink sink;
    sink.on_token = [&mu, &cv, out, hook](const v1::Token& t, std::span<const v1::ChatDelta>) {
      size_t n;
      {
        std::lock_guard<std::mutex> lock(mu);
        out->ids.push_back(t.id());
        n = out->ids.size();
        cv.notify_all();
      }
      if (hook) hook(n);
    };
    sink.on_done = [&mu, &cv, out](const absl::Status& s, const v1::Finished& f) {
      std::lock_guard<std::mutex> lock(mu);
      out->status = s;
      out->finished = f;
      out->done = true;
      cv.notify_all();
    };
    auto request = engine.Submit(std::move(in), std::move(sink));
    EXPECT_TRUE(request.ok()) << request.status();
    if (!request.ok()) {
      std::lock_guard<std::mutex> lock(mu);
      out->done = true;
    }
  }

  // Submits every spec at once and waits for all; on_token of spec `i` calls hook(i, count).
  static std::vector<Out> RunAll(Engine& engine, const std::vector<Spec>& specs,
                                 const std::function<void(size_t, size_t)>& hook = nullptr) {
    std::vector<Out> outs(specs.size());
    std::mutex mu;
    std::condition_variable cv;
    for (size_t i = 0; i < specs.size(); ++i) {
      std::function<void(size_t)> each = nullptr;
      if (hook) each = [&hook, i](size_t n) { hook(i, n); };
      Submit(engine, specs[i], &outs[i], mu, cv, each);
    }
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] {
      return std::all_of(outs.begin(), outs.end(), [](const Out& o) { return o.done; });
    });
    return outs;
  }

  // Each spec alone on a fresh engine that never batches.
  static std::vector<Out> Reference(const std::vector<Spec>& specs) {
    std::vector<Out> outs;
    for (const Spec& s : specs) {
      auto engine = MakeEngine(/*workers=*/1, /*max_batch=*/1, /*decode_delay_ms=*/0);
      outs.push_back(std::move(RunAll(*engine, {s})[0]));
      EXPECT_OK(outs.back().status);
      EXPECT_EQ(Stat(outs.back().finished, "batched_steps"), 0) << s.id;
    }
    return outs;
  }
};

TEST_F(HostBatchedTest, ConcurrentRequestsShareDecodeCallsAndMatchLoneRuns) {
  const std::vector<Spec> specs = Specs();
  const std::vector<Out> ref = Reference(specs);
  // Four workers, all four requests decoding at once; a 1 ms pace keeps them overlapping.
  auto engine = MakeEngine(/*workers=*/4, /*max_batch=*/8, /*decode_delay_ms=*/1);
  const std::vector<Out> outs = RunAll(*engine, specs);
  double batched_steps = 0;
  for (size_t i = 0; i < specs.size(); ++i) {
    ASSERT_OK(outs[i].status) << specs[i].id;
    EXPECT_EQ(outs[i].ids, ref[i].ids) << specs[i].id;
    EXPECT_EQ(outs[i].finished.reason(), ref[i].finished.reason()) << specs[i].id;
    const double steps = Stat(outs[i].finished, "batched_steps");
    const double rows = Stat(outs[i].finished, "batched_rows");
    // A batched pass holds 2..4 rows here (four requests).
    EXPECT_GE(rows, 2 * steps) << specs[i].id;
    EXPECT_LE(rows, 4 * steps) << specs[i].id;
    batched_steps += steps;
  }
  EXPECT_GT(batched_steps, 0) << "no decode call carried more than one row";
  // The engine's metrics sum the sessions' stats.
  const v1::MetricsResponse m = engine->Metrics();
  EXPECT_EQ(m.plugin().at("batched_steps"), batched_steps);
  // The host's own count: every generated token is one decode row (a last step may end on the
  // context without a token), and the calls carried more than one row on average.
  uint64_t tokens = 0;
  for (const Out& o : outs) tokens += o.ids.size();
  EXPECT_GE(m.decode_rows(), tokens);
  EXPECT_LE(m.decode_rows(), tokens + specs.size());
  EXPECT_LT(m.decode_calls(), m.decode_rows());
  // A call of n >= 2 rows adds n - 1 >= n / 2 rows beyond one per call, and the batched steps
  // are the rows of exactly those calls.
  EXPECT_GE(static_cast<double>(m.decode_rows() - m.decode_calls()), batched_steps / 2.0);
}

// A long prompt does not hold the model for its whole prefill: a session that is decoding keeps
// producing tokens while another session's long prompt is read — its steps ride the prefill's
// chunk passes (mixed passes; before them, the plugin let waiting passes run between two
// chunks). The tiny model in chunks of 8 with 15 ms of pacing after each chunk: ~38 chunks.
TEST_F(HostBatchedTest, LongPrefillLetsOtherSessionsDecodeBetweenChunks) {
  // The sinks' state before the engine: an ASSERT that gives up waiting returns with requests
  // still running, and ~Engine ends them through on_done, which must find this state alive
  // (declared after the engine, it was destroyed first: a write into a dead absl::Status, seen
  // as a leak report when the 60 s wait ran out on a loaded machine).
  std::mutex mu;
  std::condition_variable cv;
  int decoder_tokens = 0, decoder_tokens_at_first_report = -1, decoder_tokens_at_started = -1;
  int reports = 0, done = 0;
  absl::Status decoder_status, reader_status;

  auto engine = std::make_unique<Engine>(EngineOptions{.plugin_dir = COLI_PLUGIN_DIR_FOR_TEST,
                                                       .workers = 2,
                                                       .prefill_delay_ms = 15,
                                                       .max_batch = 8});
  v1::LoadModelRequest load;
  load.set_model_dir(COLI_K3_TINY_DIR);
  load.set_id("k3");
  load.mutable_options()->set_chunk(8);
  ASSERT_OK(engine->LoadModel(load, nullptr).status());

  GenerationInput decoder;
  decoder.model = "k3";
  decoder.request_id = "decoder";
  decoder.session = "decoder";
  decoder.prompt = "1, 2, 3, 4, 5,";
  decoder.max_tokens = 4000;  // ends by cancel below, or by the context
  EventSink decoder_sink;
  decoder_sink.on_token = [&](const v1::Token&, std::span<const v1::ChatDelta>) {
    std::lock_guard<std::mutex> lock(mu);
    ++decoder_tokens;
    cv.notify_all();
  };
  decoder_sink.on_done = [&](const absl::Status& st, const v1::Finished&) {
    std::lock_guard<std::mutex> lock(mu);
    decoder_status = st;
    ++done;
    cv.notify_all();
  };
  auto decoding = engine->Submit(std::move(decoder), std::move(decoder_sink));
  ASSERT_OK(decoding.status());
  {
    std::unique_lock<std::mutex> lock(mu);
    ASSERT_TRUE(cv.wait_for(lock, std::chrono::seconds(30), [&] { return decoder_tokens >= 3; }));
  }

  std::string text;
  for (int i = 0; i < 30; ++i) text += "The quick brown fox jumps over the lazy dog. ";
  GenerationInput reader;
  reader.model = "k3";
  reader.request_id = "reader";
  reader.session = "reader";
  reader.prompt = text;
  reader.max_tokens = 1;
  reader.report_progress = true;
  EventSink reader_sink;
  reader_sink.on_progress = [&](const v1::PrefillProgress&) {
    std::lock_guard<std::mutex> lock(mu);
    if (reports++ == 0) decoder_tokens_at_first_report = decoder_tokens;
  };
  reader_sink.on_started = [&](const v1::Started&) {
    std::lock_guard<std::mutex> lock(mu);
    decoder_tokens_at_started = decoder_tokens;
  };
  reader_sink.on_done = [&](const absl::Status& st, const v1::Finished&) {
    std::lock_guard<std::mutex> lock(mu);
    reader_status = st;
    ++done;
    cv.notify_all();
  };
  ASSERT_OK(engine->Submit(std::move(reader), std::move(reader_sink)).status());
  {
    std::unique_lock<std::mutex> lock(mu);
    ASSERT_TRUE(cv.wait_for(lock, std::chrono::seconds(60), [&] { return done >= 1; }));
  }
  (*decoding)->Cancel(/*stop=*/true);
  {
    std::unique_lock<std::mutex> lock(mu);
    ASSERT_TRUE(cv.wait_for(lock, std::chrono::seconds(30), [&] { return done == 2; }));
  }
  ASSERT_OK(reader_status);
  ASSERT_GE(reports, 10) << "the prompt must span many paced chunks";
  ASSERT_GE(decoder_tokens_at_first_report, 0);
  ASSERT_GE(decoder_tokens_at_started, 0);
  // While the reader's ~38 chunks ran, the decoder got tokens (about one per chunk pass it rode;
  // before mixed passes it ran during the pacing: ~2000 tokens with 65 chunks). Holding the
  // model through the whole prefill (the behaviour before either) gives 0 here.
  EXPECT_GE(decoder_tokens_at_started - decoder_tokens_at_first_report, 10)
      << "first report at " << decoder_tokens_at_first_report << " tokens, started at "
      << decoder_tokens_at_started;
}

// Mixed passes (docs/status/batching.md): while a long prompt is prefilled in chunks of 4, the
// decode steps of two requests that are already generating ride its chunk passes instead of
// running passes of their own. Every request's tokens equal its lone run; the reader's session
// reports the rows its passes carried, and they are exactly the decoders' rides.
TEST_F(HostBatchedTest, LongPromptCarriesDecodeRowsAndAllMatchLoneRuns) {
  std::string text;
  for (int i = 0; i < 10; ++i) text += "The quick brown fox jumps over the lazy dog. ";
  const std::vector<Spec> specs = {
      {"a", "sa", "1, 2, 3, 4, 5,", 0, 0, 0, 0, 160},
      {"b", "sb", "Once upon a time, in a land far away,", 0.8f, 0.9f, 0, 7, 160},
      {"r", "sr", text, 0, 0, 0, 0, 4},
  };
  const std::vector<Out> ref = Reference(specs);
  // Before the engine, so that they outlive it (as in the test above).
  std::vector<Out> outs(specs.size());
  std::mutex mu;
  std::condition_variable cv;
  auto engine = std::make_unique<Engine>(
      EngineOptions{.plugin_dir = COLI_PLUGIN_DIR_FOR_TEST, .workers = 3, .max_batch = 8});
  v1::LoadModelRequest load;
  load.set_model_dir(COLI_K3_TINY_DIR);
  load.set_id("k3");
  load.mutable_options()->set_chunk(4);
  ASSERT_OK(engine->LoadModel(load, nullptr).status());
  // The decoders first; the reader once both have tokens (they still have ~150 to go, while the
  // reader's ~30 chunk passes each carry their next step).
  auto submit = [&](size_t i) { Submit(*engine, specs[i], &outs[i], mu, cv); };
  submit(0);
  submit(1);
  {
    std::unique_lock<std::mutex> lock(mu);
    ASSERT_TRUE(cv.wait_for(lock, std::chrono::seconds(30),
                            [&] { return outs[0].ids.size() >= 2 && outs[1].ids.size() >= 2; }));
  }
  submit(2);
  {
    std::unique_lock<std::mutex> lock(mu);
    ASSERT_TRUE(cv.wait_for(lock, std::chrono::seconds(120), [&] {
      return std::all_of(outs.begin(), outs.end(), [](const Out& o) { return o.done; });
    }));
  }
  double rides = 0, carried = 0;
  for (size_t i = 0; i < specs.size(); ++i) {
    ASSERT_OK(outs[i].status) << specs[i].id;
    EXPECT_EQ(outs[i].ids, ref[i].ids) << specs[i].id;
    EXPECT_EQ(outs[i].finished.reason(), ref[i].finished.reason()) << specs[i].id;
    rides += Stat(outs[i].finished, "decode_rides");
    carried += Stat(outs[i].finished, "mixed_rows");
  }
  EXPECT_GT(Stat(outs[2].finished, "mixed_rows"), 0) << "no decode row rode the long prefill";
  EXPECT_EQ(carried, rides);
}

TEST_F(HostBatchedTest, MaxBatchOneNeverBatches) {
  const std::vector<Spec> specs = Specs();
  auto engine = MakeEngine(/*workers=*/4, /*max_batch=*/1, /*decode_delay_ms=*/0);
  const std::vector<Out> outs = RunAll(*engine, specs);
  for (size_t i = 0; i < specs.size(); ++i) {
    ASSERT_OK(outs[i].status) << specs[i].id;
    EXPECT_EQ(outs[i].ids.size(), 32u) << specs[i].id;
    EXPECT_EQ(Stat(outs[i].finished, "batched_steps"), 0) << specs[i].id;
  }
  const v1::MetricsResponse m = engine->Metrics();
  EXPECT_EQ(m.decode_calls(), m.decode_rows()) << "max_batch 1: one row per call";
  EXPECT_GE(m.decode_rows(), 32u * specs.size());
  // The model's own current values (ABI 1.2 model_stats), once per model, not per session.
  std::map<std::string, double> model_stats;
  for (const v1::ModelStat& stat : m.model_stats()) {
    EXPECT_EQ(stat.model(), "k3");
    EXPECT_TRUE(model_stats.emplace(stat.name(), stat.value()).second) << stat.name();
  }
  EXPECT_GT(model_stats["weights_resident_bytes"], 0);
  EXPECT_EQ(model_stats["weights_mapped_bytes"], 0);  // not a K3_MMAP container
  EXPECT_GT(model_stats["expert_cache_bytes"], 0);
  EXPECT_EQ(model_stats["vk_tier_resident"], 0);  // no Vulkan tier asked for
}

TEST_F(HostBatchedTest, CancelOneOfSeveralEndsItWithinOneTokenOthersFinish) {
  std::vector<Spec> specs = Specs();
  for (Spec& s : specs) s.max_tokens = 24;
  const std::vector<Out> ref = Reference(specs);
  auto engine = MakeEngine(/*workers=*/4, /*max_batch=*/8, /*decode_delay_ms=*/2);
  // Request "b" is cancelled as its 5th token arrives: it must end with exactly those 5 tokens
  // (the cancel lands before its next step), while the others continue in the batches.
  const std::vector<Out> outs = RunAll(*engine, specs, [&](size_t i, size_t n) {
    if (i == 1 && n == 5) {
      EXPECT_TRUE(engine->Cancel("b", /*stop=*/false));
    }
  });
  EXPECT_EQ(outs[1].status.code(), absl::StatusCode::kCancelled) << outs[1].status;
  ASSERT_EQ(outs[1].ids.size(), 5u);
  EXPECT_EQ(outs[1].ids, std::vector<int32_t>(ref[1].ids.begin(), ref[1].ids.begin() + 5));
  for (size_t i : {0u, 2u, 3u}) {
    ASSERT_OK(outs[i].status) << specs[i].id;
    EXPECT_EQ(outs[i].ids, ref[i].ids) << specs[i].id;
  }
}

// A request waiting in the queue behind a busy worker ends as soon as it is cancelled, not when
// the worker frees: its on_done (CANCELLED, no tokens) comes while the running request still
// runs, and the queue is empty again.
TEST_F(HostBatchedTest, ACancelledQueuedRequestEndsWithoutWaitingForAWorker) {
  auto engine = MakeEngine(/*workers=*/1, /*max_batch=*/1, /*decode_delay_ms=*/20);
  std::vector<Spec> specs = Specs();
  Spec running = specs[0], queued = specs[1];
  running.max_tokens = 400;  // ~8 s at 20 ms a token: runs long past the cancel below
  std::mutex mu;
  std::condition_variable cv;
  Out a, b;
  Submit(*engine, running, &a, mu, cv);
  {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return !a.ids.empty(); });  // the worker is busy with it
  }
  Submit(*engine, queued, &b, mu, cv);
  EXPECT_EQ(engine->Metrics().queue_depth(), 1);
  EXPECT_TRUE(engine->Cancel(queued.id, /*stop=*/false));
  {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return b.done; });
    EXPECT_FALSE(a.done) << "the queued request waited for the running one";
  }
  EXPECT_EQ(b.status.code(), absl::StatusCode::kCancelled) << b.status;
  EXPECT_TRUE(b.ids.empty());
  EXPECT_EQ(engine->Metrics().queue_depth(), 0);
  EXPECT_TRUE(engine->Cancel(running.id, /*stop=*/false));
  std::unique_lock<std::mutex> lock(mu);
  cv.wait(lock, [&] { return a.done; });
  EXPECT_EQ(a.status.code(), absl::StatusCode::kCancelled) << a.status;
}

// Session::StepBatch directly: one decode call for several sessions equals each session's lone
// steps; a session named twice is refused, naming the rows, and changes nothing.
TEST_F(HostBatchedTest, SessionStepBatchMatchesLoneStepsAndRefusesDuplicates) {
  PluginSet plugins = PluginSet::LoadDir(COLI_PLUGIN_DIR_FOR_TEST);
  ASSERT_OK_AND_ASSIGN(const Plugin* plugin, plugins.ForModel(COLI_K3_TINY_DIR));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Model> model,
                       plugin->Open(COLI_K3_TINY_DIR, ModelOptions(), nullptr));
  const std::vector<Spec> specs = Specs();
  std::vector<std::unique_ptr<Session>> batched, alone;
  std::vector<Sampling> sampling;
  for (const Spec& s : specs) {
    ASSERT_OK_AND_ASSIGN(std::vector<int32_t> ids, model->Tokenize(s.prompt, false));
    for (auto* list : {&batched, &alone}) {
      ASSERT_OK_AND_ASSIGN(std::unique_ptr<Session> session, model->NewSession());
      ASSERT_OK(session->Prefill(ids, 0, s.seed, nullptr).status());
      list->push_back(std::move(session));
    }
    sampling.push_back({s.temperature, s.top_p, s.top_k, /*logprobs=*/2});
  }
  std::vector<Session*> rows;
  for (auto& s : batched) rows.push_back(s.get());
  std::vector<Session*> twice = {rows[0], rows[1], rows[0]};
  std::vector<Sampling> three(sampling.begin(), sampling.begin() + 3);
  auto refused = Session::StepBatch(twice, three);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument) << refused.status();
  EXPECT_EQ(Session::StepBatch(rows, three).status().code(), absl::StatusCode::kInvalidArgument);
  for (int step = 0; step < 12; ++step) {
    ASSERT_OK_AND_ASSIGN(std::vector<StepResult> got, Session::StepBatch(rows, sampling));
    ASSERT_EQ(got.size(), rows.size());
    for (size_t i = 0; i < rows.size(); ++i) {
      ASSERT_OK_AND_ASSIGN(StepResult want, alone[i]->Step(sampling[i]));
      EXPECT_EQ(got[i].token, want.token) << specs[i].id << " step " << step;
      EXPECT_EQ(got[i].finish, want.finish);
      EXPECT_EQ(got[i].text, want.text);
      EXPECT_EQ(got[i].logprob, want.logprob);
      ASSERT_EQ(got[i].top_logprobs.size(), want.top_logprobs.size());
      for (size_t k = 0; k < want.top_logprobs.size(); ++k) {
        EXPECT_EQ(got[i].top_logprobs[k].id, want.top_logprobs[k].id);
        EXPECT_EQ(got[i].top_logprobs[k].logprob, want.top_logprobs[k].logprob);
      }
    }
  }
  // The first step after prefill only samples (nothing to feed): 11 forward passes of 4 rows.
  ASSERT_OK_AND_ASSIGN(auto stats, batched[0]->Stats());
  EXPECT_EQ(stats.at("batched_steps"), 11);
  EXPECT_EQ(stats.at("batched_rows"), 44);
}

// The echo test family (row by row behind the table adapter) with "fail_feed": the request
// whose prompt holds '!' fails when its step would feed it. With the rows of three requests
// gathered into shared calls, that failure fails the call; the host keeps the rows the plugin
// had finished, retries the others alone, so only that request fails and the others echo their
// prompts exactly as when run alone.
TEST_F(HostBatchedTest, EchoFailingRowFailsOnlyItsRequest) {
  const std::string dir = ::testing::TempDir() + "/batched_echo_" + std::to_string(getpid());
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/config.json") << R"({"model_type": "coli_echo"})";
  auto run = [&](int workers, int max_batch) {
    Engine engine(EngineOptions{
        .plugin_dir = COLI_ECHO_PLUGIN_DIR, .workers = workers, .max_batch = max_batch});
    v1::LoadModelRequest load;
    load.set_model_dir(dir);
    load.set_id("k3");  // the name RunAll submits to
    (*load.mutable_options()->mutable_extra())["delay_ms"] = "2";
    (*load.mutable_options()->mutable_extra())["fail_feed"] = "!";
    EXPECT_TRUE(engine.LoadModel(load, nullptr).ok());
    std::vector<Spec> specs = {
        {"a", "sa", "abcdefghijkl"}, {"b", "sb", "xyz!uvw"}, {"c", "sc", "0123456789"}};
    return RunAll(engine, specs);
  };
  std::vector<Out> ref;
  for (int i = 0; i < 3; ++i) ref.push_back(run(1, 1)[i]);
  const std::vector<Out> outs = run(3, 8);
  for (size_t i : {0u, 2u}) {
    ASSERT_OK(outs[i].status);
    ASSERT_OK(ref[i].status);
    EXPECT_EQ(outs[i].ids, ref[i].ids);
  }
  // Echoes "abcdefghijkl" then <eos>.
  EXPECT_EQ(outs[0].ids.size(), 13u);
  EXPECT_EQ(outs[1].status.code(), absl::StatusCode::kDataLoss) << outs[1].status;
  EXPECT_THAT(outs[1].status.message(), ::testing::HasSubstr("fail_feed"));
  EXPECT_EQ(outs[1].ids, (std::vector<int32_t>{'x', 'y', 'z', '!'}));
}

// A request failing with DATA_LOSS (on kimi_k3: a shard changed under the running model, so
// every later request fails too) marks the model in Health until one of its requests succeeds;
// before, Health (and coli serve's /health) said all was well while every request failed.
TEST_F(HostBatchedTest, DataLossMarksTheModelInHealthUntilARequestSucceeds) {
  const std::string dir = ::testing::TempDir() + "/health_echo_" + std::to_string(getpid());
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/config.json") << R"({"model_type": "coli_echo"})";
  Engine engine(EngineOptions{.plugin_dir = COLI_ECHO_PLUGIN_DIR, .workers = 1, .max_batch = 1});
  v1::LoadModelRequest load;
  load.set_model_dir(dir);
  load.set_id("k3");
  (*load.mutable_options()->mutable_extra())["fail_feed"] = "!";
  ASSERT_TRUE(engine.LoadModel(load, nullptr).ok());
  EXPECT_EQ(engine.Health().model_problems_size(), 0);

  const Out failed = RunAll(engine, {{"b", "sb", "xyz!uvw"}})[0];
  ASSERT_EQ(failed.status.code(), absl::StatusCode::kDataLoss) << failed.status;
  v1::HealthResponse health = engine.Health();
  EXPECT_TRUE(health.serving());
  ASSERT_EQ(health.model_problems_size(), 1);
  EXPECT_EQ(health.model_problems(0).model(), "k3");
  EXPECT_THAT(health.model_problems(0).error(), ::testing::HasSubstr("fail_feed"));

  ASSERT_OK(RunAll(engine, {{"a", "sa", "abc"}})[0].status);
  EXPECT_EQ(engine.Health().model_problems_size(), 0);
}

// A client that sends its next turn the moment the last one ends (an agent; here: from inside
// on_done) finds its pooled session free: the engine frees the slot before it reports the end.
// Before, the slot was freed after on_done, so the next turn took "default#1", a fresh session,
// and re-prefilled everything (on K3 minutes of prompt) — a race the loaded CI box lost.
TEST_F(HostBatchedTest, NextTurnSentFromOnDoneReusesThePooledSession) {
  auto engine = MakeEngine(/*workers=*/4, /*max_batch=*/8, /*decode_delay_ms=*/0);
  auto prompt = engine->Tokenize("k3", "The quick brown fox jumps over the lazy dog.", false);
  ASSERT_OK(prompt.status());
  std::mutex mu;
  std::condition_variable cv;
  Out first, second;
  auto submit = [&](std::vector<int32_t> ids, Out* out, std::function<void()> then) {
    GenerationInput in;
    in.model = "k3";
    in.prompt_ids = std::move(ids);
    in.max_tokens = 4;
    EventSink sink;
    sink.on_token = [&mu, &cv, out](const v1::Token& t, std::span<const v1::ChatDelta>) {
      std::lock_guard<std::mutex> lock(mu);
      out->ids.push_back(t.id());
      cv.notify_all();
    };
    sink.on_done = [&mu, &cv, out, then](const absl::Status& st, const v1::Finished& f) {
      {
        std::lock_guard<std::mutex> lock(mu);
        out->status = st;
        out->finished = f;
      }
      if (then) then();  // before `done`: the next turn is in the queue when the test reads it
      std::lock_guard<std::mutex> lock(mu);
      out->done = true;
      cv.notify_all();
    };
    ASSERT_OK(engine->Submit(std::move(in), std::move(sink)).status());
  };
  submit(*prompt, &first, [&] {
    // The record is the prompt and every sampled token but the last (not fed yet); send it back
    // with the last one and one more, as a chat client's next turn would.
    std::vector<int32_t> next = *prompt;
    std::vector<int32_t> reply;
    {
      std::lock_guard<std::mutex> lock(mu);
      reply = first.ids;
    }
    next.insert(next.end(), reply.begin(), reply.end());
    next.push_back(reply.front());
    submit(std::move(next), &second, nullptr);
    // Still inside on_done: wait until the next turn is running, so the test does not depend on
    // which of the engine's threads picks it up first (an engine that frees the slot only after
    // on_done fails this every time).
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return !second.ids.empty() || second.done; });
  });
  std::unique_lock<std::mutex> lock(mu);
  cv.wait(lock, [&] { return first.done && second.done; });
  ASSERT_OK(first.status);
  ASSERT_OK(second.status);
  ASSERT_EQ(first.ids.size(), 4u);
  EXPECT_EQ(second.finished.usage().tokens_reused(),
            static_cast<int64_t>(prompt->size() + first.ids.size() - 1));
}

// Unnamed requests of two conversations, turn by turn (a chat page with two chats open, an
// OpenAI client — coli serve names no session): each conversation's next turn lands on the pooled
// session whose record it extends and reuses all of it. Before, every request took the first free
// session, so each turn reset it to the other conversation's prompt and re-prefilled everything.
// A third, unrelated conversation takes a session nobody used yet instead of dropping one.
TEST_F(HostBatchedTest, AlternatingConversationsEachKeepTheirPooledSession) {
  ExpectConversationsKeepTheirSessions(MakeEngine(/*workers=*/4, /*max_batch=*/8, 0));
}

// More pooled sessions than workers (coli-host --pool): one worker, three sessions, and the
// same three conversations each keep their state (with one session each turn would reset it).
TEST_F(HostBatchedTest, APoolLargerThanTheWorkersKeepsMoreConversations) {
  ExpectConversationsKeepTheirSessions(MakeEngine(/*workers=*/1, /*max_batch=*/1, 0, /*pool=*/3));
}

void HostBatchedTest::ExpectConversationsKeepTheirSessions(std::unique_ptr<Engine> engine) {
  auto run = [&](std::vector<int32_t> ids) { return RunIds(*engine, "k3", std::move(ids), 4); };
  // The next turn: the prompt, the reply (its last token not yet fed) and one more token.
  auto next = [](std::vector<int32_t> prompt, const Out& reply) {
    prompt.insert(prompt.end(), reply.ids.begin(), reply.ids.end());
    prompt.push_back(reply.ids.front());
    return prompt;
  };
  auto tokens = [&](const char* text) {
    auto ids = engine->Tokenize("k3", text, false);
    EXPECT_OK(ids.status());
    return ids.value_or(std::vector<int32_t>{});
  };
  const std::vector<int32_t> a1 = tokens("The quick brown fox jumps over the lazy dog.");
  const std::vector<int32_t> b1 = tokens("Pack my box with five dozen liquor jugs, said the cook.");
  const Out ra1 = run(a1), rb1 = run(b1);
  ASSERT_EQ(ra1.ids.size(), 4u);
  ASSERT_EQ(rb1.ids.size(), 4u);
  const std::vector<int32_t> a2 = next(a1, ra1), b2 = next(b1, rb1);
  const Out ra2 = run(a2), rb2 = run(b2);
  EXPECT_EQ(ra2.finished.usage().tokens_reused(), static_cast<int64_t>(a1.size() + 3));
  EXPECT_EQ(rb2.finished.usage().tokens_reused(), static_cast<int64_t>(b1.size() + 3));
  // A third conversation takes a fresh session; the first two still continue where they were.
  const Out rc1 = run(tokens("Sphinx of black quartz, judge my vow."));
  EXPECT_EQ(rc1.finished.usage().tokens_reused(), 0);
  const Out ra3 = run(next(a2, ra2));
  EXPECT_EQ(ra3.finished.usage().tokens_reused(), static_cast<int64_t>(a2.size() + 3));
  // The same prompt again (a regenerated reply) gives the same reply.
  const Out rb2again = run(b2);
  EXPECT_EQ(rb2again.ids, rb2.ids);
}

// Two conversations that share a long system prompt, on a pool of two sessions. The plugin says
// (ABI 1.6 session_reusable) what each session would keep of a prompt; the second conversation
// therefore goes to the unused session instead of the first one's, which shares more than half
// of its prompt but, holding no checkpoint there, would keep nothing of it and lose the first
// conversation's state (the old guess from the records took it). With the model's prefix cache
// on, the second conversation also starts from the shared system prompt.
TEST_F(HostBatchedTest, ASecondConversationSharingTheSystemPromptKeepsTheFirstOnesSession) {
  for (const bool cache : {false, true}) {
    SCOPED_TRACE(cache ? "prefix cache on" : "prefix cache off");
    auto engine = std::make_unique<Engine>(EngineOptions{
        .plugin_dir = COLI_PLUGIN_DIR_FOR_TEST, .workers = 1, .max_batch = 1, .pool_sessions = 2});
    v1::LoadModelRequest load;
    load.set_model_dir(COLI_K3_TINY_DIR);
    load.set_id("k3");
    if (cache) (*load.mutable_options()->mutable_extra())["prefix_cache"] = "64";
    ASSERT_OK(engine->LoadModel(load, nullptr).status());
    auto render = [&](const std::vector<std::pair<std::string, std::string>>& turns) {
      std::string system = "You are the help desk of a hardware shop.";
      for (int i = 0; i < 6; ++i) {
        absl::StrAppend(&system, " Rule ", i, ": answer briefly, cite the manual, never guess.");
      }
      nlohmann::json body = {{"messages", {{{"role", "system"}, {"content", system}}}}};
      for (const auto& [role, content] : turns) {
        body["messages"].push_back({{"role", role}, {"content", content}});
      }
      auto rendered = engine->ApplyTemplate("k3", body.dump(), /*add_generation_prompt=*/true);
      EXPECT_OK(rendered.status());
      return rendered.ok() ? rendered->tokens : std::vector<int32_t>{};
    };
    auto run = [&](std::vector<int32_t> ids) { return RunIds(*engine, "k3", std::move(ids), 4); };
    const std::vector<int32_t> a1 = render({{"user", "Do you sell drills?"}});
    const std::vector<int32_t> b1 = render({{"user", "What does a hammer cost?"}});
    size_t shared = 0;
    while (shared < a1.size() && shared < b1.size() && a1[shared] == b1[shared]) ++shared;
    ASSERT_GT(2 * shared, b1.size()) << "the old guess would take A's session";
    const Out ra1 = run(a1);
    ASSERT_EQ(ra1.ids.size(), 4u);
    const Out rb1 = run(b1);
    // With the cache, B starts where its last message starts (the system prompt's end).
    if (cache) {
      EXPECT_GT(rb1.finished.usage().tokens_reused(), 0);
      EXPECT_LE(rb1.finished.usage().tokens_reused(), static_cast<int64_t>(shared));
    } else {
      EXPECT_EQ(rb1.finished.usage().tokens_reused(), 0);
    }
    // A's next turn finds its whole state: the prompt, the reply (its last token not yet fed).
    std::vector<int32_t> a2 = a1;
    a2.insert(a2.end(), ra1.ids.begin(), ra1.ids.end());
    a2.push_back(ra1.ids.front());
    const Out ra2 = run(a2);
    EXPECT_EQ(ra2.finished.usage().tokens_reused(), static_cast<int64_t>(a1.size() + 3));
  }
}

// Speculative decoding on, checkpoints off, a pool of two: a turn that ended with verified draft
// tokens still buffered (max_tokens) leaves the delivered record, which the next turn extends, so
// it continues on the same session (session_reusable counts the delivered record, as Prefill).
TEST_F(HostBatchedTest, ASpeculatingConversationKeepsItsSessionWithDraftTokensBuffered) {
  auto engine = std::make_unique<Engine>(EngineOptions{
      .plugin_dir = COLI_PLUGIN_DIR_FOR_TEST, .workers = 1, .max_batch = 1, .pool_sessions = 2});
  for (const char* id : {"off", "on"}) {
    v1::LoadModelRequest load;
    load.set_model_dir(COLI_K3_TINY_DIR);
    load.set_id(id);
    load.mutable_options()->set_layers(0);  // embedding to head: a repeating walk, drafts accepted
    if (std::string(id) == "on") (*load.mutable_options()->mutable_extra())["spec"] = "6";
    ASSERT_OK(engine->LoadModel(load, nullptr).status());
  }
  auto run = [&](const char* model, std::vector<int32_t> ids, int max_tokens) {
    return RunIds(*engine, model, std::move(ids), max_tokens);
  };
  // A prompt that quotes the model's own greedy walk, so drafts from it are accepted.
  std::vector<int32_t> prompt = {9};
  for (int32_t t : run("off", {9}, 24).ids) prompt.push_back(t);
  prompt.push_back(9);
  const Out r1 = run("on", prompt, 5);
  ASSERT_EQ(r1.ids.size(), 5u);
  ASSERT_GT(Stat(r1.finished, "spec_accepted_tokens"), 0) << "nothing buffered: test is moot";
  std::vector<int32_t> next = prompt;
  next.insert(next.end(), r1.ids.begin(), r1.ids.end());
  for (int32_t t : {100, 200, 300, 400}) next.push_back(t);
  const Out r2 = run("on", next, 2);
  EXPECT_EQ(r2.finished.usage().tokens_reused(), static_cast<int64_t>(prompt.size() + 4));
}

}  // namespace
}  // namespace coli::host
