// Choices (OpenAI n) under interference, on the kimi_k3 plugin and the tiny fixture: n > 1
// requests side by side while their clients stop one choice, stop or cancel a whole request
// between two decode steps, and ask to stop choices that do not exist. Every request must end
// once, every choice of a finished request once and with the tokens it sent, the choices no one
// touched must give the tokens of the same request run undisturbed, and nothing may stay counted
// as running. Under AddressSanitizer (scripts/sanitize.sh) it also checks the lifetimes of the
// choices' sessions (made, copied, dropped or kept as spares while other requests decode).
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status/status_matchers.h"
#include "gtest/gtest.h"
#include "host/engine.h"

namespace coli::host {
namespace {

// absl::StrCat, not "r" + std::to_string(k): GCC 12 warns -Wrestrict (falsely) on the latter.
std::string RequestId(int k) { return absl::StrCat("r", k); }

constexpr int32_t kChoices = 3;
constexpr int32_t kMaxTokens = 24;
constexpr uint64_t kSeed = 5;

// What a client does to its request once choice `at_choice` has sent `at_count` tokens.
enum class Action { kNone, kStopOneChoice, kStopRequest, kCancelRequest };

struct Outcome {
  std::mutex mu;
  std::condition_variable cv;
  int done_calls = 0;
  absl::Status status;
  v1::Finished finished;
  std::map<int32_t, std::vector<int32_t>> ids;            // by choice
  std::map<int32_t, v1::ChoiceFinished> choice_finished;  // by choice
  int duplicate_choice_finished = 0;
  int tokens_after_choice_finished = 0;
};

GenerationInput Input(const std::string& id) {
  GenerationInput in;
  in.model.append("m");
  in.request_id.append(id);
  in.prompt.append("Once upon a time, in a land far away, there lived");
  in.n = kChoices;
  in.max_tokens = kMaxTokens;
  in.sampling.set_temperature(0.9f);
  in.sampling.set_top_p(0.95f);
  in.sampling.set_seed(kSeed);
  return in;
}

// Submits request `id`; `action` runs on the worker's thread from on_token, as a client's
// cancel would arrive between two steps.
void Submit(Engine& engine, const std::string& id, Action action, int32_t at_choice,
            size_t at_count, Outcome* out) {
  EventSink sink;
  sink.on_token = [&engine, id, action, at_choice, at_count, out](const v1::Token& t,
                                                                  std::span<const v1::ChatDelta>) {
    size_t count;
    {
      std::lock_guard<std::mutex> lock(out->mu);
      if (out->choice_finished.count(t.choice())) ++out->tokens_after_choice_finished;
      out->ids[t.choice()].push_back(t.id());
      count = out->ids[t.choice()].size();
    }
    if (t.choice() != at_choice || count != at_count) return;
    switch (action) {
      case Action::kNone:
        break;
      case Action::kStopOneChoice:
        EXPECT_TRUE(engine.CancelChoice(id, at_choice)) << id;
        break;
      case Action::kStopRequest:
        EXPECT_TRUE(engine.Cancel(id, /*stop=*/true)) << id;
        break;
      case Action::kCancelRequest:
        EXPECT_TRUE(engine.Cancel(id, /*stop=*/false)) << id;
        break;
    }
  };
  sink.on_choice_finished = [out](const v1::ChoiceFinished& c) {
    std::lock_guard<std::mutex> lock(out->mu);
    if (out->choice_finished.count(c.choice())) ++out->duplicate_choice_finished;
    out->choice_finished[c.choice()] = c;
  };
  sink.on_done = [out](const absl::Status& s, const v1::Finished& f) {
    std::lock_guard<std::mutex> lock(out->mu);
    ++out->done_calls;
    out->status = s;
    out->finished = f;
    out->cv.notify_all();
  };
  auto request = engine.Submit(Input(id), std::move(sink));
  if (!request.ok()) {  // no on_done will come: Wait must not hang
    ADD_FAILURE() << id << ": " << request.status();
    std::lock_guard<std::mutex> lock(out->mu);
    out->status = request.status();
    ++out->done_calls;
  }
}

void Wait(Outcome& out) {
  std::unique_lock<std::mutex> lock(out.mu);
  out.cv.wait(lock, [&] { return out.done_calls > 0; });
}

// `got` is the first tokens of `want`, at most `most` of them.
void ExpectPrefix(const std::vector<int32_t>& got, const std::vector<int32_t>& want, size_t most,
                  const std::string& what) {
  EXPECT_LE(got.size(), most) << what;
  ASSERT_LE(got.size(), want.size()) << what;
  EXPECT_EQ(got, std::vector<int32_t>(want.begin(), want.begin() + got.size())) << what;
}

TEST(HostChoicesStressTest, StopsAndCancelsMidStepLeaveTheOtherChoicesAndRequestsIntact) {
  ASSERT_TRUE(std::filesystem::exists(std::string(COLI_K3_TINY_DIR) + "/config.json"))
      << "tiny fixture missing: build target k3_tiny_fixture";
  // Declared before the engine: an early return destroys the engine first, whose destructor
  // ends running requests through their sinks into these.
  constexpr int kRequests = 12;
  Outcome reference;
  std::vector<std::unique_ptr<Outcome>> outcomes;
  for (int k = 0; k < kRequests; ++k) outcomes.push_back(std::make_unique<Outcome>());
  // 3 workers and room for 9 sessions: of 12 requests of 3 choices, some wait in the queue for
  // the sessions of others to come free.
  Engine engine(EngineOptions{
      .plugin_dir = COLI_PLUGIN_DIR_FOR_TEST, .workers = 3, .max_batch = 8, .max_sessions = 9});
  v1::LoadModelRequest load;
  load.set_model_dir(COLI_K3_TINY_DIR);
  load.set_id("m");
  ASSERT_OK(engine.LoadModel(load, nullptr).status());

  Submit(engine, "reference", Action::kNone, 0, 0, &reference);
  Wait(reference);
  ASSERT_OK(reference.status);
  for (int32_t i = 0; i < kChoices; ++i) {
    ASSERT_GT(reference.ids[i].size(), 4u) << "choice " << i << " ended too early to test";
  }

  std::vector<Action> actions;
  std::vector<int32_t> at_choices;
  // Requests that do not exist or choices outside [0, n), asked all along: never found.
  std::atomic<bool> running{true};
  std::atomic<int> found_bad{0};
  std::thread poker([&] {
    while (running.load()) {
      for (int k = 0; k < kRequests; ++k) {
        const std::string id = RequestId(k);
        for (int32_t bad : {-1, kChoices, 16, 1 << 30}) {
          if (engine.CancelChoice(id, bad)) ++found_bad;
        }
      }
      if (engine.CancelChoice("nobody", 0)) ++found_bad;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  });
  for (int k = 0; k < kRequests; ++k) {
    const Action action = static_cast<Action>(k % 4);
    const int32_t at_choice = k % kChoices;
    actions.push_back(action);
    at_choices.push_back(at_choice);
    Submit(engine, RequestId(k), action, at_choice, 2 + k % 3, outcomes[k].get());
  }
  for (auto& out : outcomes) Wait(*out);
  running = false;
  poker.join();
  EXPECT_EQ(found_bad.load(), 0);

  for (int k = 0; k < kRequests; ++k) {
    Outcome& out = *outcomes[k];
    const std::string what = absl::StrCat("request r", k);
    std::lock_guard<std::mutex> lock(out.mu);
    EXPECT_EQ(out.done_calls, 1) << what;
    EXPECT_EQ(out.duplicate_choice_finished, 0) << what;
    EXPECT_EQ(out.tokens_after_choice_finished, 0) << what;
    const size_t at_count = 2 + k % 3;
    if (actions[k] == Action::kCancelRequest) {
      EXPECT_EQ(out.status.code(), absl::StatusCode::kCancelled) << what << ": " << out.status;
      // The choices step together: none got past the step the cancel came in.
      for (const auto& [i, ids] : out.ids) {
        ExpectPrefix(ids, reference.ids[i], at_count, absl::StrCat(what, " choice ", i));
      }
      continue;
    }
    ASSERT_OK(out.status) << what;
    ASSERT_EQ(out.choice_finished.size(), static_cast<size_t>(kChoices)) << what;
    int64_t completion = 0;
    for (int32_t i = 0; i < kChoices; ++i) {
      const std::string choice = absl::StrCat(what, " choice ", i);
      const std::vector<int32_t>& ids = out.ids[i];
      EXPECT_EQ(out.choice_finished[i].completion_tokens(), static_cast<int64_t>(ids.size()))
          << choice;
      completion += static_cast<int64_t>(ids.size());
      const bool stopped_here = (actions[k] == Action::kStopOneChoice && i == at_choices[k]) ||
                                actions[k] == Action::kStopRequest;
      if (!stopped_here) {
        EXPECT_EQ(ids, reference.ids[i]) << choice;
        EXPECT_EQ(out.choice_finished[i].reason(), reference.choice_finished[i].reason()) << choice;
        continue;
      }
      EXPECT_EQ(out.choice_finished[i].reason(), v1::FINISH_REASON_STOPPED) << choice;
      // The choices step together: none got past the step the stop came in.
      ExpectPrefix(ids, reference.ids[i], at_count, choice);
    }
    EXPECT_EQ(out.finished.usage().completion_tokens(), completion) << what;
  }

  const v1::MetricsResponse metrics = engine.Metrics();
  EXPECT_EQ(metrics.requests_active(), 0);
  for (const v1::ModelStat& st : metrics.model_stats()) {
    if (st.name() == "host_choice_sessions") {
      EXPECT_EQ(st.value(), 0) << "released at the end";
    }
  }
}

}  // namespace
}  // namespace coli::host
