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

namespace coli {
namespace {

using ::coli::testing::StatusIs;
using ::testing::HasSubstr;

using ::coli::k3::batched_test::Ids;

// One row's settings for a whole generation.
struct Spec {
  std::vector<int32_t> prompt;
  uint64_t seed = 0;
  float temperature = 0, top_p = 0;
  int32_t top_k = 0, logprobs = 3;
  int64_t max_context = 0;  // session option (0: the model's)
};

// One step's outputs, copied out of the plugin.
struct Out {
  int32_t token = -1, finish = COLI_FINISH_NONE;
  float logprob = 0;
  std::vector<coli_logprob_t> top;
  std::string text;
};

bool SameBits(float a, float b) { return std::memcmp(&a, &b, sizeof(float)) == 0; }

// Token, finish and text equal; logprob and every top entry equal bit for bit.
void ExpectSame(const std::vector<std::vector<Out>>& got,
                const std::vector<std::vector<Out>>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t r = 0; r < got.size(); ++r) {
    ASSERT_EQ(got[r].size(), want[r].size()) << "row " << r << ": steps differ";
    for (size_t t = 0; t < got[r].size(); ++t) {
      const Out& a = got[r][t];
      const Out& b = want[r][t];
      SCOPED_TRACE(::testing::Message() << "row " << r << " step " << t);
      EXPECT_EQ(a.token, b.token);
      EXPECT_EQ(a.finish, b.finish);
      EXPECT_EQ(a.text, b.text);
      EXPECT_TRUE(SameBits(a.logprob, b.logprob)) << a.logprob << " vs " << b.logprob;
      ASSERT_EQ(a.top.size(), b.top.size());
      for (size_t k = 0; k < a.top.size(); ++k) {
        EXPECT_EQ(a.top[k].id, b.top[k].id);
        EXPECT_TRUE(SameBits(a.top[k].logprob, b.top[k].logprob));
      }
    }
  }
}

class BatchedDecodeTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    host::PluginReport report;
    auto plugin =
        host::Plugin::Load(std::string(COLI_PLUGIN_DIR_FOR_TEST) + "/libcoli_kimi_k3.so", &report);
    ASSERT_OK(plugin.status());
    plugin_ = std::move(plugin).value().release();
  }
  static void TearDownTestSuite() {
    delete plugin_;
    plugin_ = nullptr;
  }
  void SetUp() override {
    ASSERT_NE(plugin_, nullptr);
    model_ = OpenModel();
    ASSERT_NE(model_, nullptr);
  }
  void TearDown() override {
    for (coli_session_t* s : sessions_) api().session_destroy(s);
    for (coli_model_t* m : models_) api().model_close(m);
  }

  static const coli_plugin_api_t& api() { return plugin_->api(); }

  static absl::Status ToStatus(coli_status_t code, const coli_error_t& e) {
    if (code == 0) return absl::OkStatus();
    return absl::Status(abi::FromCode(code), std::string(e.message, std::min(e.length,
                                                                             e.capacity - 1)));
  }
  struct Error {
    char text[1024] = {};
    coli_error_t e = abi::Init<coli_error_t>();
    Error() {
      e.message = text;
      e.capacity = sizeof(text);
    }
  };

  coli_model_t* OpenModel() {
    coli_model_options_t options;
    coli_model_options_defaults(&options);
    auto args = abi::Init<coli_model_open_args_t>();
    args.model_dir = abi::Str(COLI_K3_TINY_DIR);
    args.options = &options;
    Error err;
    coli_model_t* m = nullptr;
    EXPECT_OK(ToStatus(api().model_open(&args, &m, &err.e), err.e));
    if (m != nullptr) models_.push_back(m);
    return m;
  }
  coli_session_t* NewSession(coli_model_t* m, int64_t max_context) {
    auto options = abi::Init<coli_session_options_t>();
    options.max_context = max_context;
    Error err;
    coli_session_t* s = nullptr;
    EXPECT_OK(ToStatus(api().session_create(m, &options, &s, &err.e), err.e));
    if (s != nullptr) sessions_.push_back(s);
    return s;
  }
  void Prefill(coli_session_t* s, const Spec& spec) {
    auto args = abi::Init<coli_prefill_args_t>();
    args.tokens = spec.prompt.data();
    args.n_tokens = spec.prompt.size();
    args.seed = spec.seed;
    auto result = abi::Init<coli_prefill_result_t>();
    Error err;
    ASSERT_OK(ToStatus(api().prefill(s, &args, &result, &err.e), err.e));
  }
  static coli_decode_row_t Row(coli_session_t* s, const Spec& spec) {
    auto row = abi::Init<coli_decode_row_t>();
    row.session = s;
    row.temperature = spec.temperature;
    row.top_p = spec.top_p;
    row.top_k = spec.top_k;
    row.logprobs_top_k = spec.logprobs;
    return row;
  }
  static absl::Status Decode(std::vector<coli_decode_row_t>& rows) {
    auto args = abi::Init<coli_decode_args_t>();
    args.rows = rows.data();
    args.n_rows = rows.size();
    Error err;
    return ToStatus(api().decode(&args, &err.e), err.e);
  }
  static Out Copy(const coli_decode_row_t& row) {
    Out o;
    o.token = row.token;
    o.finish = row.finish;
    o.logprob = row.logprob;
    o.top.assign(row.top_logprobs, row.top_logprobs + row.n_top_logprobs);
    o.text = std::string(abi::View(row.text));
    return o;
  }
  std::map<std::string, double> Stats(coli_session_t* s) {
    coli_stat_t stats[64];
    size_t count = 0;
    Error err;
    EXPECT_OK(ToStatus(api().session_stats(s, stats, 64, &count, &err.e), err.e));
    std::map<std::string, double> out;
    for (size_t i = 0; i < std::min<size_t>(count, 64); ++i) out[stats[i].name] = stats[i].value;
    return out;
  }

  // Prefilled sessions for `specs`, on models[i] (default: the suite's model).
  std::vector<coli_session_t*> Start(const std::vector<Spec>& specs,
                                     const std::vector<coli_model_t*>& models = {}) {
    std::vector<coli_session_t*> out;
    for (size_t i = 0; i < specs.size(); ++i) {
      out.push_back(NewSession(models.empty() ? model_ : models[i], specs[i].max_context));
      Prefill(out.back(), specs[i]);
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

  static host::Plugin* plugin_;
  coli_model_t* model_ = nullptr;
  std::vector<coli_model_t*> models_;
  std::vector<coli_session_t*> sessions_;
};

host::Plugin* BatchedDecodeTest::plugin_ = nullptr;

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
  coli_model_t* other = OpenModel();
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
