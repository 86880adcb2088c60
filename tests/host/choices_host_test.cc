// Choices (GenerationInput::n, OpenAI `n`) in the engine, on the kimi_k3 plugin and the tiny
// fixture: the prompt is prefilled ONCE, its state copied into a session per choice (plugin ABI
// 1.11 session_copy), and the choices decode together, every decode call carrying a row of each
// choice still running. The reference for choice i is the same request with seed + i and n = 1,
// alone on an engine that never batches. That the prompt ran once is read from the plugin's
// session statistics (tokens_computed / tokens_reused / session_copies, summed over the
// request's sessions); that the rows shared calls from the host's decode_calls / decode_rows.
#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "host/engine.h"
#include "host/plugin.h"

namespace coli::host {
namespace {

const std::string kPrompt = "Once upon a time, in a land far away, there lived";

// One request's events, by choice.
struct Result {
  absl::Status status = absl::UnknownError("no on_done");
  v1::Started started;
  v1::Finished finished;
  std::map<int32_t, std::vector<int32_t>> ids;            // by choice
  std::map<int32_t, v1::ChoiceFinished> choice_finished;  // by choice
  int duplicate_choice_finished = 0;
  int tokens_after_choice_finished = 0;
  bool done = false;
};

double Stat(const v1::Finished& f, const std::string& key) {
  auto it = f.stats().plugin().find(key);
  return it == f.stats().plugin().end() ? 0.0 : it->second;
}

class HostChoicesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(std::filesystem::exists(std::string(COLI_K3_TINY_DIR) + "/config.json"))
        << "tiny fixture missing: build target k3_tiny_fixture";
  }

  static std::unique_ptr<Engine> MakeEngine(
      int workers, int max_batch, const std::string& plugin_dir = COLI_PLUGIN_DIR_FOR_TEST,
      const std::string& model_dir = COLI_K3_TINY_DIR, int spare_idle_ms = 60 * 1000) {
    auto engine = std::make_unique<Engine>(EngineOptions{.plugin_dir = plugin_dir,
                                                         .workers = workers,
                                                         .max_batch = max_batch,
                                                         .spare_idle_ms = spare_idle_ms});
    v1::LoadModelRequest load;
    load.set_model_dir(model_dir);
    load.set_id("m");
    auto info = engine->LoadModel(load, nullptr);
    EXPECT_TRUE(info.ok()) << info.status();
    return engine;
  }

  static GenerationInput Input(int32_t n, float temperature, uint64_t seed, int32_t max_tokens) {
    GenerationInput in;
    // Appended: GCC 12's -Wrestrict misfires on assigning short literals here.
    in.model.append("m");
    in.request_id.append("r");
    in.prompt.append(kPrompt);
    in.n = n;
    in.max_tokens = max_tokens;
    in.sampling.set_temperature(temperature);
    in.sampling.set_top_p(temperature > 0 ? 0.95f : 0.0f);
    in.sampling.set_seed(seed);
    return in;
  }

  // Runs `in` and waits for its end; on_token calls hook(engine, choice, tokens of that choice).
  static Result Run(Engine& engine, GenerationInput in,
                    const std::function<void(Engine&, int32_t, size_t)>& hook = nullptr) {
    std::mutex mu;
    std::condition_variable cv;
    Result out;
    EventSink sink;
    sink.on_started = [&](const v1::Started& s) {
      std::lock_guard<std::mutex> lock(mu);
      out.started = s;
    };
    sink.on_token = [&](const v1::Token& t, std::span<const v1::ChatDelta>) {
      size_t count;
      {
        std::lock_guard<std::mutex> lock(mu);
        if (out.choice_finished.count(t.choice())) ++out.tokens_after_choice_finished;
        out.ids[t.choice()].push_back(t.id());
        count = out.ids[t.choice()].size();
      }
      if (hook) hook(engine, t.choice(), count);
    };
    sink.on_choice_finished = [&](const v1::ChoiceFinished& c) {
      std::lock_guard<std::mutex> lock(mu);
      if (out.choice_finished.count(c.choice())) ++out.duplicate_choice_finished;
      out.choice_finished[c.choice()] = c;
    };
    sink.on_done = [&](const absl::Status& s, const v1::Finished& f) {
      std::lock_guard<std::mutex> lock(mu);
      out.status = s;
      out.finished = f;
      out.done = true;
      cv.notify_all();
    };
    auto request = engine.Submit(std::move(in), std::move(sink));
    if (!request.ok()) {
      out.status = request.status();
      return out;
    }
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return out.done; });
    return out;
  }

  // The model stats of `engine`'s model "m", the plugin's and the host's, by name.
  static std::map<std::string, double> ModelStats(Engine& engine) {
    std::map<std::string, double> out;
    const v1::MetricsResponse metrics = engine.Metrics();
    for (const v1::ModelStat& st : metrics.model_stats()) out[st.name()] = st.value();
    return out;
  }

  // A folder the echo test family serves (it has no session_copy: each choice prefills).
  static std::string EchoDir(const std::string& name) {
    const std::string dir = ::testing::TempDir() + "/" + name + "_" + std::to_string(getpid());
    std::filesystem::create_directories(dir);
    std::ofstream(dir + "/config.json") << R"({"model_type": "coli_echo"})";
    return dir;
  }

  // Choice i alone: n = 1 with seed + i on an engine that never batches.
  static std::vector<std::vector<int32_t>> LoneRuns(int32_t n, float temperature, uint64_t seed,
                                                    int32_t max_tokens) {
    std::vector<std::vector<int32_t>> out;
    for (int32_t i = 0; i < n; ++i) {
      auto engine = MakeEngine(/*workers=*/1, /*max_batch=*/1);
      Result r = Run(*engine, Input(1, temperature, seed + static_cast<uint64_t>(i), max_tokens));
      EXPECT_OK(r.status);
      EXPECT_TRUE(r.choice_finished.empty()) << "n = 1 sends no ChoiceFinished";
      out.push_back(r.ids[0]);
    }
    return out;
  }
};

// n = 4 seeded sampling on ONE worker (n does not need free workers): the prompt is computed once
// (the three copies reuse all of it), every decode call carries the rows of all choices still
// running, and each choice's tokens equal its lone run with seed + i.
TEST_F(HostChoicesTest, OnePrefillThenChoicesDecodeAsRowsOfOneCall) {
  constexpr int32_t kN = 4, kMaxTokens = 24;
  const auto lone = LoneRuns(kN, 0.9f, 7, kMaxTokens);
  auto engine = MakeEngine(/*workers=*/1, /*max_batch=*/8);
  const Result r = Run(*engine, Input(kN, 0.9f, 7, kMaxTokens));
  ASSERT_OK(r.status);
  const int64_t prompt = r.started.prompt_tokens();
  ASSERT_GT(prompt, 4);
  EXPECT_EQ(r.started.tokens_computed(), prompt);
  size_t total = 0, longest = 0;
  for (int32_t i = 0; i < kN; ++i) {
    EXPECT_EQ(r.ids.count(i) ? r.ids.at(i) : std::vector<int32_t>(), lone[i]) << "choice " << i;
    ASSERT_TRUE(r.choice_finished.count(i)) << "choice " << i;
    EXPECT_EQ(r.choice_finished.at(i).completion_tokens(), static_cast<int64_t>(lone[i].size()));
    total += lone[i].size();
    longest = std::max(longest, lone[i].size());
  }
  EXPECT_EQ(r.duplicate_choice_finished, 0);
  EXPECT_EQ(r.tokens_after_choice_finished, 0);
  EXPECT_NE(lone[0], lone[1]) << "seeds 7 and 8 should sample differently";
  EXPECT_EQ(r.finished.usage().completion_tokens(), static_cast<int64_t>(total));
  EXPECT_EQ(r.finished.usage().prompt_tokens(), prompt);
  // One prefill: the prompt computed once, reused whole by each copy.
  EXPECT_EQ(Stat(r.finished, "tokens_computed"), static_cast<double>(prompt));
  EXPECT_EQ(Stat(r.finished, "tokens_reused"), static_cast<double>((kN - 1) * prompt));
  EXPECT_EQ(Stat(r.finished, "session_copies"), kN - 1);
  const v1::MetricsResponse m = engine->Metrics();
  EXPECT_EQ(m.plugin().at("tokens_computed"), static_cast<double>(prompt));
  // Every step is one call carrying a row per running choice (a last step may end a choice on
  // the context without a token: none here, the context is far).
  EXPECT_EQ(m.decode_rows(), total);
  EXPECT_EQ(m.decode_calls(), longest);
  // In the plugin: every pass after the first step (which feeds nothing) held all four rows;
  // each session counts the pass once in batched_steps and its rows in batched_rows.
  for (int32_t i = 0; i < kN; ++i) ASSERT_EQ(lone[i].size(), size_t{kMaxTokens}) << "choice " << i;
  EXPECT_EQ(m.plugin().at("batched_steps"), static_cast<double>(kN * (kMaxTokens - 1)));
  EXPECT_EQ(m.plugin().at("batched_rows"), static_cast<double>(kN * kN * (kMaxTokens - 1)));
}

// Greedy choices are all the same reply; with batching off each row is its own call.
TEST_F(HostChoicesTest, GreedyChoicesAreEqualAlsoWithBatchingOff) {
  const auto lone = LoneRuns(1, 0.0f, 0, 16);
  auto engine = MakeEngine(/*workers=*/2, /*max_batch=*/1);
  const Result r = Run(*engine, Input(3, 0.0f, 0, 16));
  ASSERT_OK(r.status);
  for (int32_t i = 0; i < 3; ++i) {
    EXPECT_EQ(r.ids.at(i), lone[0]) << "choice " << i;
  }
  const v1::MetricsResponse m = engine->Metrics();
  EXPECT_EQ(m.decode_calls(), m.decode_rows());
  EXPECT_EQ(m.decode_rows(), 3 * lone[0].size());
}

// A stop of one choice (a stop string matched there) ends only it, with the tokens it had; the
// others finish as alone.
TEST_F(HostChoicesTest, StoppingOneChoiceLetsTheOthersFinish) {
  constexpr int32_t kN = 3, kMaxTokens = 20;
  const auto lone = LoneRuns(kN, 0.9f, 11, kMaxTokens);
  ASSERT_GT(lone[1].size(), 4u);
  auto engine = MakeEngine(/*workers=*/1, /*max_batch=*/8);
  const Result r =
      Run(*engine, Input(kN, 0.9f, 11, kMaxTokens), [](Engine& e, int32_t choice, size_t count) {
        if (choice == 1 && count == 3) {
          EXPECT_TRUE(e.CancelChoice("r", 1));
        }
      });
  ASSERT_OK(r.status);
  EXPECT_EQ(r.ids.at(1), std::vector<int32_t>(lone[1].begin(), lone[1].begin() + 3));
  EXPECT_EQ(r.choice_finished.at(1).reason(), v1::FINISH_REASON_STOPPED);
  for (int32_t i : {0, 2}) {
    EXPECT_EQ(r.ids.at(i), lone[i]) << "choice " << i;
    EXPECT_NE(r.choice_finished.at(i).reason(), v1::FINISH_REASON_STOPPED);
  }
  EXPECT_FALSE(engine->CancelChoice("r", 1)) << "the request is over";
}

// A cancel (client gone) ends every choice at once: no token after it.
TEST_F(HostChoicesTest, CancelEndsAllChoices) {
  auto engine = MakeEngine(/*workers=*/1, /*max_batch=*/8);
  std::atomic<int> after_cancel{0};
  std::atomic<bool> cancelled{false};
  const Result r =
      Run(*engine, Input(4, 0.9f, 3, 64), [&](Engine& e, int32_t choice, size_t count) {
        if (cancelled) ++after_cancel;
        if (choice == 2 && count == 2 && !cancelled.exchange(true)) {
          EXPECT_TRUE(e.Cancel("r", /*stop=*/false));
        }
      });
  EXPECT_EQ(r.status.code(), absl::StatusCode::kCancelled) << r.status;
  // The rows of the step in flight (choice 3's, after choice 2's) still report; none after.
  EXPECT_LE(after_cancel.load(), 1);
  for (const auto& [choice, ids] : r.ids) EXPECT_LE(ids.size(), 3u) << "choice " << choice;
  EXPECT_TRUE(engine->Metrics().requests_active() == 0);
}

TEST_F(HostChoicesTest, ChoicesOutsideOneToSixteenAreRefused) {
  auto engine = MakeEngine(/*workers=*/1, /*max_batch=*/8);
  for (int32_t n : {-1, 17}) {
    const Result r = Run(*engine, Input(n, 0.0f, 0, 4));
    EXPECT_EQ(r.status.code(), absl::StatusCode::kInvalidArgument) << n;
    EXPECT_THAT(r.status.message(), ::testing::HasSubstr("n ")) << r.status;
  }
  v1::GenerateRequest unset;  // proto3's 0: one choice
  EXPECT_EQ(GenerationInput::From(unset).n, 1);
}

// The choices' sessions count against --max-sessions while they run: with room for 3, an n = 3
// request on the pooled session closes the two idle named ones first (a plugin's session holds
// ~434 MB of state on K3, so n must not grow the host past the limit the user set), and n above
// the limit, which could never run, is refused.
TEST_F(HostChoicesTest, ChoiceSessionsCountAgainstMaxSessions) {
  Engine engine(EngineOptions{
      .plugin_dir = COLI_PLUGIN_DIR_FOR_TEST, .workers = 1, .max_batch = 8, .max_sessions = 3});
  v1::LoadModelRequest load;
  load.set_model_dir(COLI_K3_TINY_DIR);
  load.set_id("m");
  ASSERT_OK(engine.LoadModel(load, nullptr).status());
  auto stats = [&] {
    std::map<std::string, double> out;
    const v1::MetricsResponse metrics = engine.Metrics();
    for (const v1::ModelStat& st : metrics.model_stats()) out[st.name()] = st.value();
    return out;
  };
  for (const char* name : {"a", "b"}) {
    GenerationInput in = Input(1, 0.0f, 0, 2);
    in.session.append(name);
    ASSERT_OK(Run(engine, std::move(in)).status);
  }
  EXPECT_EQ(stats()["host_sessions"], 2);
  EXPECT_EQ(stats()["host_sessions_closed"], 0);

  const Result three = Run(engine, Input(3, 0.0f, 0, 4));
  ASSERT_OK(three.status);
  EXPECT_EQ(three.ids.size(), 3u);
  // The pooled session + 2 choice sessions = 3: both named sessions were closed for them.
  EXPECT_EQ(stats()["host_sessions_closed"], 2);
  EXPECT_EQ(stats()["host_sessions"], 1);
  EXPECT_EQ(stats()["host_choice_sessions"], 0) << "released when the request ended";

  const Result four = Run(engine, Input(4, 0.0f, 0, 4));
  EXPECT_EQ(four.status.code(), absl::StatusCode::kInvalidArgument) << four.status;
  EXPECT_THAT(four.status.message(), ::testing::HasSubstr("--max-sessions")) << four.status;
}

// The sessions an n > 1 request made for its choices wait as spares for the next one, which
// takes them (reset) instead of asking the plugin for new ones: on K3 each new session
// allocates and page-faults ~434 MB of recurrent state. Five n = 3 requests make three plugin
// sessions in all (the echo family counts its session_create calls), not 1 + 2 per request.
TEST_F(HostChoicesTest, ChoiceSessionsAreReusedNotMadeAgain) {
  auto engine =
      MakeEngine(/*workers=*/1, /*max_batch=*/8, COLI_ECHO_PLUGIN_DIR, EchoDir("choices_spares"));
  constexpr int kRequests = 5;
  size_t prompt_tokens = 0;
  for (int k = 0; k < kRequests; ++k) {
    const std::string text = k % 2 == 0 ? "abcdef" : "xyz";
    GenerationInput in = Input(3, 0.0f, 0, 0);
    in.prompt = text;
    const Result r = Run(*engine, std::move(in));
    ASSERT_OK(r.status) << "request " << k;
    std::vector<int32_t> want(text.begin(), text.end());
    want.push_back(257);  // <eos>
    for (int32_t i = 0; i < 3; ++i) {
      EXPECT_EQ(r.ids.at(i), want) << "request " << k << " choice " << i;
    }
    prompt_tokens += 3 * text.size();
  }
  // Each choice's session is new or reset: its statistics are its request's alone.
  EXPECT_EQ(engine->Metrics().plugin().at("prompt_tokens"), static_cast<double>(prompt_tokens));
  std::map<std::string, double> stats = ModelStats(*engine);
  EXPECT_EQ(stats["sessions_created"], 3) << "the plugin's own count of session_create";
  EXPECT_EQ(stats["host_sessions_created"], 3);
  EXPECT_EQ(stats["host_sessions_reused"], 2 * (kRequests - 1));
  EXPECT_EQ(stats["host_spare_sessions"], 2);
  EXPECT_EQ(stats["host_sessions"], 1);
  EXPECT_EQ(stats["host_choice_sessions"], 0);
}

// A spare unused for EngineOptions::spare_idle_ms is freed (kept, each holds ~434 MB on K3
// until the model is unloaded): the next n = 3 request asks the plugin for new sessions.
TEST_F(HostChoicesTest, IdleSparesAreFreed) {
  auto engine = MakeEngine(/*workers=*/1, /*max_batch=*/8, COLI_ECHO_PLUGIN_DIR,
                           EchoDir("choices_spares_idle"), /*spare_idle_ms=*/200);
  GenerationInput in = Input(3, 0.0f, 0, 0);
  in.prompt = "abc";
  ASSERT_OK(Run(*engine, in).status);
  std::map<std::string, double> stats = ModelStats(*engine);
  EXPECT_EQ(stats["host_sessions_created"], 3);
  // Freed within the idle time and a sweep (a quarter of it), with room for a slow machine.
  for (int i = 0; i < 200 && stats["host_spare_sessions"] > 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    stats = ModelStats(*engine);
  }
  EXPECT_EQ(stats["host_spare_sessions"], 0);
  EXPECT_EQ(stats["host_spares_freed"], 2);
  ASSERT_OK(Run(*engine, in).status);
  stats = ModelStats(*engine);
  EXPECT_EQ(stats["host_sessions_created"], 5) << "the freed spares were not there to reuse";
  EXPECT_EQ(stats["sessions_created"], 5) << "the plugin's own count";
  EXPECT_EQ(stats["host_sessions_reused"], 0);
}

// A spare that held another, longer conversation gives the tokens (and statistics) of a new
// session: the same seeded n = 3 request on a new engine and on one whose sessions served
// another prompt first.
TEST_F(HostChoicesTest, ASpareSessionGivesTheTokensOfANewOne) {
  constexpr int32_t kN = 3, kMaxTokens = 16;
  auto fresh_engine = MakeEngine(/*workers=*/1, /*max_batch=*/8);
  const Result fresh = Run(*fresh_engine, Input(kN, 0.9f, 7, kMaxTokens));
  ASSERT_OK(fresh.status);
  EXPECT_EQ(ModelStats(*fresh_engine)["host_sessions_reused"], 0);

  auto engine = MakeEngine(/*workers=*/1, /*max_batch=*/8);
  GenerationInput other = Input(kN, 0.9f, 99, 40);
  other.prompt =
      "Zebras gallop across the wide savanna while the evening sun sinks slowly, "
      "and far behind them a storm gathers over the hills of the north";
  const Result before = Run(*engine, std::move(other));
  ASSERT_OK(before.status);
  ASSERT_GT(before.started.prompt_tokens(), fresh.started.prompt_tokens());
  const Result reused = Run(*engine, Input(kN, 0.9f, 7, kMaxTokens));
  ASSERT_OK(reused.status);
  for (int32_t i = 0; i < kN; ++i) {
    ASSERT_TRUE(fresh.ids.count(i)) << "choice " << i;
    EXPECT_EQ(reused.ids.count(i) ? reused.ids.at(i) : std::vector<int32_t>(), fresh.ids.at(i))
        << "choice " << i;
  }
  EXPECT_EQ(reused.started.tokens_reused(), fresh.started.tokens_reused());
  EXPECT_EQ(reused.started.tokens_computed(), fresh.started.tokens_computed());
  // Only the choices' sessions copy: theirs are this request's statistics alone.
  for (const char* key : {"session_copies", "session_copied_tokens"}) {
    EXPECT_EQ(Stat(reused.finished, key), Stat(fresh.finished, key)) << key;
  }
  std::map<std::string, double> stats = ModelStats(*engine);
  EXPECT_EQ(stats["host_sessions_reused"], kN - 1);
  EXPECT_EQ(stats["host_sessions_created"], kN);
}

// A session closed to stay within --max-sessions serves the request that needed the room, reset:
// "c" (a prompt that extends what "a" held) computes its whole prompt and gives the tokens a
// new engine gives, on the plugin session "a" had.
TEST_F(HostChoicesTest, AClosedSessionServesTheNewOneReset) {
  auto run_named = [&](Engine& engine, const char* name, const std::string& prompt,
                       int32_t max_tokens) {
    GenerationInput in = Input(1, 0.9f, 5, max_tokens);
    in.session.append(name);
    in.prompt = prompt;
    return Run(engine, std::move(in));
  };
  const std::string longer = kPrompt + " a fox who knew every path through the forest";
  auto fresh_engine = MakeEngine(/*workers=*/1, /*max_batch=*/8);
  const Result fresh = run_named(*fresh_engine, "c", longer, 12);
  ASSERT_OK(fresh.status);
  ASSERT_EQ(fresh.started.tokens_reused(), 0);

  Engine engine(EngineOptions{
      .plugin_dir = COLI_PLUGIN_DIR_FOR_TEST, .workers = 1, .max_batch = 8, .max_sessions = 2});
  v1::LoadModelRequest load;
  load.set_model_dir(COLI_K3_TINY_DIR);
  load.set_id("m");
  ASSERT_OK(engine.LoadModel(load, nullptr).status());
  // One token: "a"'s record is then its prompt, which "c"'s prompt extends.
  ASSERT_OK(run_named(engine, "a", kPrompt, 1).status);
  ASSERT_OK(run_named(engine, "b", "xyz", 2).status);
  const Result c = run_named(engine, "c", longer, 12);  // closes "a", the least recently used
  ASSERT_OK(c.status);
  EXPECT_EQ(c.started.tokens_reused(), 0) << "the spare kept what \"a\" held";
  EXPECT_EQ(c.ids.at(0), fresh.ids.at(0));
  std::map<std::string, double> stats = ModelStats(engine);
  EXPECT_EQ(stats["host_sessions_closed"], 1);
  EXPECT_EQ(stats["host_sessions_reused"], 1);
  EXPECT_EQ(stats["host_sessions_created"], 2);
  EXPECT_EQ(stats["host_sessions"], 2);
  EXPECT_EQ(stats["host_spare_sessions"], 0);
}

// The session copy itself (ABI 1.11): a copy right after a prefill continues exactly like its
// source; a session cannot be copied onto itself.
TEST_F(HostChoicesTest, SessionCopyContinuesLikeItsSource) {
  PluginReport report;
  auto plugin =
      Plugin::Load(std::string(COLI_PLUGIN_DIR_FOR_TEST) + "/libcoli_kimi_k3.so", &report);
  ASSERT_OK(plugin.status());
  ASSERT_EQ((*plugin)->minor(), 11u);
  auto model = (*plugin)->Open(COLI_K3_TINY_DIR, ModelOptions(), nullptr);
  ASSERT_OK(model.status());
  auto ids = (*model)->Tokenize(kPrompt, false);
  ASSERT_OK(ids.status());
  auto a = (*model)->NewSession();
  auto b = (*model)->NewSession();
  ASSERT_OK(a.status());
  ASSERT_OK(b.status());
  ASSERT_TRUE((*b)->CanCopy());
  EXPECT_EQ((*a)->CopyFrom(**a).code(), absl::StatusCode::kInvalidArgument);
  auto never = [] { return false; };
  auto pa = (*a)->Prefill(*ids, 0, 5, never);
  ASSERT_OK(pa.status());
  ASSERT_OK((*b)->CopyFrom(**a));
  auto pb = (*b)->Prefill(*ids, 0, 5, never);
  ASSERT_OK(pb.status());
  EXPECT_EQ(pb->tokens_computed, 0u);
  EXPECT_EQ(pb->tokens_reused, ids->size());
  Sampling s;
  s.temperature = 0.9f;
  for (int step = 0; step < 12; ++step) {
    auto ta = (*a)->Step(s);
    auto tb = (*b)->Step(s);
    ASSERT_OK(ta.status());
    ASSERT_OK(tb.status());
    EXPECT_EQ(ta->token, tb->token) << "step " << step;
    EXPECT_EQ(ta->logprob, tb->logprob) << "step " << step;
  }
  // A copy taken after decode steps holds the record but no logits: its prefill of the prompt
  // then computes (nothing stale is used).
  auto c = (*model)->NewSession();
  ASSERT_OK(c.status());
  ASSERT_OK((*c)->CopyFrom(**a));
  auto pc = (*c)->Prefill(*ids, 0, 5, never);
  ASSERT_OK(pc.status());
  EXPECT_GT(pc->tokens_computed, 0u);
}

// A family without session_copy (the echo test family: its table leaves the entry NULL) still
// serves n: each choice's session prefills the prompt itself.
TEST_F(HostChoicesTest, AFamilyWithoutCopyPrefillsEachChoice) {
  const std::string dir = ::testing::TempDir() + "/choices_echo_" + std::to_string(getpid());
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/config.json") << R"({"model_type": "coli_echo"})";
  auto engine = MakeEngine(/*workers=*/1, /*max_batch=*/8, COLI_ECHO_PLUGIN_DIR, dir);
  GenerationInput in = Input(3, 0.0f, 0, 0);
  in.prompt = "abcdef";
  const Result r = Run(*engine, std::move(in));
  ASSERT_OK(r.status);
  for (int32_t i = 0; i < 3; ++i) {
    EXPECT_EQ(r.ids.at(i), (std::vector<int32_t>{'a', 'b', 'c', 'd', 'e', 'f', 257}))
        << "choice " << i;  // echoes the prompt, then <eos>
  }
  EXPECT_EQ(engine->Metrics().decode_calls(), 7u);
}

// A choice whose step fails fails the request with an error naming the choice (the echo family
// with fail_feed '!': every choice's step that would feed '!' fails); nothing hangs.
TEST_F(HostChoicesTest, AFailingChoiceFailsTheRequestNamingIt) {
  const std::string dir = ::testing::TempDir() + "/choices_fail_" + std::to_string(getpid());
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/config.json") << R"({"model_type": "coli_echo"})";
  auto engine = std::make_unique<Engine>(
      EngineOptions{.plugin_dir = COLI_ECHO_PLUGIN_DIR, .workers = 1, .max_batch = 8});
  v1::LoadModelRequest load;
  load.set_model_dir(dir);
  load.set_id("m");
  (*load.mutable_options()->mutable_extra())["fail_feed"] = "!";
  ASSERT_OK(engine->LoadModel(load, nullptr).status());
  GenerationInput in = Input(2, 0.0f, 0, 0);
  in.prompt = "ab!c";
  const Result r = Run(*engine, std::move(in));
  EXPECT_EQ(r.status.code(), absl::StatusCode::kDataLoss) << r.status;
  EXPECT_THAT(r.status.message(), ::testing::HasSubstr("choice 0 of 2: "));
  EXPECT_THAT(r.status.message(), ::testing::HasSubstr("fail_feed"));
  EXPECT_EQ(r.ids.at(0), (std::vector<int32_t>{'a', 'b', '!'}));
  EXPECT_TRUE(r.choice_finished.empty());
  EXPECT_EQ(engine->Metrics().requests_failed(), 1u);
}

}  // namespace
}  // namespace coli::host
