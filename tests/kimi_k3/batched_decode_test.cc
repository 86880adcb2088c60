// Continuous batching in the kimi_k3 plugin: one decode call with rows of several sessions must
// give every row exactly what a one-row call on a fresh session gives — token ids, logprobs and
// top logprobs bit for bit (Model::Forward's kernels are row-independent), finish reasons
// included. The plugin is loaded through the ABI (host/plugin.h Plugin::Load, then the raw C
// table, since the host's Session wrapper sends one row per call) on the tiny fixture
// (build/fixtures/k3_tiny, random weights). The reference is the same plugin decoding the same
// prompts one row per call, so a batching bug in StepBatch/Decode (rows mixed up, a state or
// position taken from the wrong row, a sampler stepped twice) changes the compared values.
#include <algorithm>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/status/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "host/plugin.h"
#include "plugin_api/coli_plugin.h"
#include "plugin_api/cpp/abi_util.h"
#include "tests/kimi_k3/batched_decode_util.h"
#include "tests/kimi_k3/plugin_abi_test_util.h"

namespace coli {
namespace {

using ::coli::testing::StatusIs;
using ::testing::HasSubstr;

using ::coli::k3::batched_test::Ids;

using k3::abi_test::Knobs;
using k3::abi_test::Out;

// One row's settings for a whole generation.
struct Spec {
  std::vector<int32_t> prompt;
  uint64_t seed = 0;
  float temperature = 0, top_p = 0;
  int32_t top_k = 0, logprobs = 3;
  int64_t max_context = 0;  // session option (0: the model's)
  Knobs knobs() const { return {temperature, top_p, top_k, logprobs, seed}; }
};

// Per row: token, finish and text equal; logprob and every top entry equal bit for bit.
void ExpectSame(const std::vector<std::vector<Out>>& got,
                const std::vector<std::vector<Out>>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t r = 0; r < got.size(); ++r) {
    SCOPED_TRACE(::testing::Message() << "row " << r);
    k3::abi_test::ExpectSameOuts(got[r], want[r]);
  }
}

// The shared plugin-ABI fixture (plugin_abi_test_util.h) plus one model per test and the
// batched/one-row runs compared here.
class BatchedDecodeTest : public k3::abi_test::PluginAbiTest {
 protected:
  void SetUp() override {
    PluginAbiTest::SetUp();
    model_ = Open({});
    ASSERT_NE(model_, nullptr);
  }

  static coli_decode_row_t Row(coli_session_t* s, const Spec& spec) {
    return PluginAbiTest::Row(s, spec.knobs());
  }
  static absl::Status Decode(std::vector<coli_decode_row_t>& rows) {
    auto args = abi::Init<coli_decode_args_t>();
    args.rows = rows.data();
    args.n_rows = rows.size();
    Error err;
    return err.Status(api().decode(&args, &err.e));
  }

  // Prefilled sessions for `specs`, on models[i] (default: the test's model).
  std::vector<coli_session_t*> Start(const std::vector<Spec>& specs,
                                     const std::vector<coli_model_t*>& models = {}) {
    std::vector<coli_session_t*> out;
    for (size_t i = 0; i < specs.size(); ++i) {
      out.push_back(NewSession(models.empty() ? model_ : models[i], specs[i].max_context));
      Prefill(out.back(), specs[i].prompt, specs[i].seed);
    }
    return out;
  }

  // Decodes `steps` steps of `sessions`: all unfinished rows in one call per step (batched), or
  // one call per row. A row stops after a finish; every call must succeed.
  static std::vector<std::vector<Out>> Run(const std::vector<coli_session_t*>& sessions,
                                           const std::vector<Spec>& specs, int steps,
                                           bool batched) {
    std::vector<std::vector<Out>> out(sessions.size());
    std::vector<bool> done(sessions.size(), false);
    for (int t = 0; t < steps; ++t) {
      std::vector<size_t> live;
      for (size_t i = 0; i < sessions.size(); ++i) {
        if (!done[i]) live.push_back(i);
      }
      if (live.empty()) break;
      std::vector<std::vector<size_t>> calls;
      if (batched) {
        calls.push_back(live);
      } else {
        for (size_t i : live) calls.push_back({i});
      }
      for (const auto& call : calls) {
        std::vector<coli_decode_row_t> rows;
        for (size_t i : call) rows.push_back(Row(sessions[i], specs[i]));
        absl::Status s = Decode(rows);
        EXPECT_OK(s) << "step " << t;
        if (!s.ok()) return out;
        for (size_t k = 0; k < call.size(); ++k) {
          out[call[k]].push_back(Copy(rows[k]));
          if (rows[k].finish != COLI_FINISH_NONE) done[call[k]] = true;
        }
      }
    }
    return out;
  }

  // The reference: fresh sessions, one row per decode call.
  std::vector<std::vector<Out>> Reference(const std::vector<Spec>& specs, int steps) {
    return Run(Start(specs), specs, steps, /*batched=*/false);
  }

  coli_model_t* model_ = nullptr;
};

constexpr int kSteps = 16;

std::vector<Spec> Greedy() {
  return {{.prompt = Ids(7, 1)}, {.prompt = Ids(12, 2)}, {.prompt = Ids(4, 3)}};
}

// Seeded sampling with different knobs per row (and one greedy row among them).
std::vector<Spec> Sampled() {
  return {{.prompt = Ids(9, 4), .seed = 11, .temperature = 0.9f, .top_p = 0.95f, .logprobs = 4},
          {.prompt = Ids(5, 5), .seed = 12, .temperature = 1.3f, .top_k = 40, .logprobs = 2},
          {.prompt = Ids(11, 6), .seed = 13, .temperature = 0, .logprobs = 3}};
}

TEST_F(BatchedDecodeTest, GreedyRowsMatchOneRowPerCall) {
  const std::vector<Spec> specs = Greedy();
  const auto want = Reference(specs, kSteps);
  const std::vector<coli_session_t*> batch = Start(specs);
  ExpectSame(Run(batch, specs, kSteps, /*batched=*/true), want);
  // The rows really shared passes: every fed step after the first sample held all three rows.
  for (coli_session_t* s : batch) {
    auto stats = Stats(s);
    EXPECT_GT(stats["batched_steps"], 0);
    EXPECT_EQ(stats["batched_rows"], 3 * stats["batched_steps"]);
  }
}

TEST_F(BatchedDecodeTest, SampledRowsMatchOneRowPerCall) {
  const std::vector<Spec> specs = Sampled();
  const auto want = Reference(specs, kSteps);
  ExpectSame(Run(Start(specs), specs, kSteps, /*batched=*/true), want);
}

// Sessions of two instances of the model in one call: one pass per model, same results.
TEST_F(BatchedDecodeTest, RowsOfTwoModelsMatchOneRowPerCall) {
  const std::vector<Spec> specs = Greedy();
  const auto want = Reference(specs, kSteps);
  coli_model_t* other = Open({});
  ASSERT_NE(other, nullptr);
  const std::vector<coli_session_t*> batch = Start(specs, {model_, other, model_});
  ExpectSame(Run(batch, specs, kSteps, /*batched=*/true), want);
  auto stats = Stats(batch[1]);  // alone on its model: never in a multi-row pass
  EXPECT_EQ(stats["batched_steps"], 0);
  EXPECT_EQ(Stats(batch[0])["batched_rows"], 2 * Stats(batch[0])["batched_steps"]);
}

// One row's session fills its context mid-generation: that row finishes with LENGTH (token -1)
// while the others go on, exactly as in one-row calls.
TEST_F(BatchedDecodeTest, ContextFullRowFinishesWhileOthersContinue) {
  std::vector<Spec> specs = Sampled();
  specs[1].max_context = static_cast<int64_t>(specs[1].prompt.size()) + 3;
  const auto want = Reference(specs, kSteps);
  ASSERT_EQ(want[1].size(), 5u);  // 4 tokens (3 of them fed), then LENGTH
  EXPECT_EQ(want[1].back().finish, COLI_FINISH_LENGTH);
  EXPECT_EQ(want[1].back().token, -1);
  ASSERT_EQ(want[0].size(), static_cast<size_t>(kSteps));
  // Keep the full row in the calls after its LENGTH too: it answers LENGTH again.
  const std::vector<coli_session_t*> batch = Start(specs);
  auto got = Run(batch, specs, 6, /*batched=*/true);
  std::vector<coli_decode_row_t> rows;
  for (size_t i = 0; i < batch.size(); ++i) rows.push_back(Row(batch[i], specs[i]));
  ASSERT_OK(Decode(rows));
  EXPECT_EQ(rows[1].finish, COLI_FINISH_LENGTH);
  EXPECT_EQ(rows[1].token, -1);
  got[0].push_back(Copy(rows[0]));
  got[2].push_back(Copy(rows[2]));
  std::vector<coli_session_t*> rest = {batch[0], batch[2]};
  std::vector<Spec> rest_specs = {specs[0], specs[2]};
  auto tail = Run(rest, rest_specs, kSteps - 7, /*batched=*/true);
  got[0].insert(got[0].end(), tail[0].begin(), tail[0].end());
  got[2].insert(got[2].end(), tail[1].begin(), tail[1].end());
  ExpectSame(got, want);
}

// A session named twice, and a session never prefilled, are refused before anything runs: the
// other sessions of the refused calls then go on exactly like the reference.
TEST_F(BatchedDecodeTest, RefusedCallsChangeNoSession) {
  const std::vector<Spec> specs = Greedy();
  const auto want = Reference(specs, kSteps);
  const std::vector<coli_session_t*> batch = Start(specs);
  auto got = Run(batch, specs, 3, /*batched=*/true);

  std::vector<coli_decode_row_t> twice = {Row(batch[0], specs[0]), Row(batch[1], specs[1]),
                                          Row(batch[0], specs[0])};
  EXPECT_THAT(Decode(twice), StatusIs(absl::StatusCode::kInvalidArgument,
                                      HasSubstr("rows 0 and 2 name the same session")));

  coli_session_t* empty = NewSession(model_, 0);
  std::vector<coli_decode_row_t> unprefilled = {
      Row(batch[0], specs[0]), Row(empty, specs[0]), Row(batch[1], specs[1]),
      Row(batch[2], specs[2])};
  EXPECT_THAT(Decode(unprefilled),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("row 1: decode before a successful prefill")));

  auto tail = Run(batch, specs, kSteps - 3, /*batched=*/true);
  for (size_t i = 0; i < got.size(); ++i) got[i].insert(got[i].end(), tail[i].begin(), tail[i].end());
  ExpectSame(got, want);
}

}  // namespace
}  // namespace coli
