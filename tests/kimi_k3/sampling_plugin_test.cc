// The ABI 1.3 sampling knobs in the kimi_k3 plugin, through its C table on the tiny fixture
// (vocabulary 768). The reference for the penalties is computed here, independently of
// common/sampling, from the raw log-probabilities of every token (logprobs_top_k = the whole
// vocabulary): log_softmax is the logits minus one constant per step, so the greedy token under
// frequency / presence penalties is the first maximum of logprob - f * count - p * (count > 0)
// over the tokens generated so far. Also: logit_bias +100 forces its token at every step, -100
// on the plain greedy token moves the first token to the runner-up, rows with penalties never
// draft on a speculative-decoding model, the same seed and knobs give the same tokens, an older
// host's shorter row is read as neutral, and bad knobs are refused naming the field.
// Where repetition must happen the model is opened with K3_LAYERS=0 (embedding, final norm and
// head only): the next greedy token is then a function of the last one, so plain greedy soon
// cycles through tokens it has generated — what the penalties are for — and a "walk prompt" (a
// start token, its greedy successors, the start again) gives prompt lookup drafts to verify.
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/status/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "plugin_api/coli_plugin.h"
#include "tests/kimi_k3/batched_decode_util.h"
#include "tests/kimi_k3/plugin_abi_test_util.h"

namespace coli::k3 {
namespace {

using ::coli::testing::StatusIs;
using ::testing::HasSubstr;

using ::coli::k3::abi_test::Knobs;
using ::coli::k3::abi_test::Out;
using ::coli::k3::batched_test::Ids;

constexpr int kVocab = 768;
constexpr int kSteps = 24;

class K3SamplingPluginTest : public abi_test::PluginAbiTest {
 protected:
  // The full raw distribution of a step: id -> logprob.
  static std::vector<float> Raw(const Out& o) {
    std::vector<float> lp(kVocab, -INFINITY);
    for (const coli_logprob_t& t : o.top) lp[t.id] = t.logprob;
    return lp;
  }
  // The penalised greedy token: first maximum of lp - f * count - p * (count > 0).
  static int32_t PenalisedGreedy(const std::vector<float>& lp, const std::map<int32_t, int>& count,
                                 float f, float p) {
    int32_t best = -1;
    float best_v = -INFINITY;
    for (int32_t id = 0; id < kVocab; ++id) {
      float v = lp[id];
      auto c = count.find(id);
      if (c != count.end()) {
        v -= f * static_cast<float>(c->second);
        v -= p;
      }
      if (best < 0 || v > best_v) {
        best = id;
        best_v = v;
      }
    }
    return best;
  }
  // Decode calls with one row of this ABI struct_size (an older host's row when smaller).
  static absl::Status CallSized(coli_session_t* s, const Knobs& k, size_t struct_size, Out* out) {
    coli_decode_row_t row = Row(s, k);
    row.struct_size = struct_size;
    auto args = abi::Init<coli_decode_args_t>();
    args.rows = &row;
    args.n_rows = 1;
    Error err;
    COLI_RETURN_IF_ERROR(err.Status(api().decode(&args, &err.e)));
    if (out != nullptr) *out = Copy(row);
    return absl::OkStatus();
  }
};


TEST_F(K3SamplingPluginTest, GreedyFrequencyPenaltyMatchesTheReference) {
  coli_model_t* m = Open({}, /*layers=*/0);
  ASSERT_NE(m, nullptr);
  const std::vector<int32_t> prompt = Ids(12, 3);
  for (const auto& [f, p] : {std::pair{2.0f, 0.0f}, std::pair{0.0f, 1.5f},
                             std::pair{-0.5f, 2.0f}}) {
    SCOPED_TRACE(::testing::Message() << "frequency " << f << " presence " << p);
    const Knobs k{.logprobs = kVocab, .frequency_penalty = f, .presence_penalty = p};
    const std::vector<Out> got = Fresh(m, prompt, kSteps, k);
    ASSERT_FALSE(got.empty());
    std::map<int32_t, int> count;
    for (size_t i = 0; i < got.size(); ++i) {
      ASSERT_EQ(got[i].top.size(), static_cast<size_t>(kVocab)) << "step " << i;
      EXPECT_EQ(got[i].token, PenalisedGreedy(Raw(got[i]), count, f, p)) << "step " << i;
      // The reported logprob stays the raw model's.
      EXPECT_EQ(got[i].logprob, Raw(got[i])[got[i].token]) << "step " << i;
      ++count[got[i].token];
    }
  }
  // The penalty changes the tokens (so the comparison above can fail): plain greedy repeats.
  const std::vector<Out> plain = Fresh(m, prompt, kSteps, {.logprobs = 1});
  const std::vector<Out> penalised = Fresh(m, prompt, kSteps, {.frequency_penalty = 2.0f});
  std::vector<int32_t> a, b;
  for (const Out& o : plain) a.push_back(o.token);
  for (const Out& o : penalised) b.push_back(o.token);
  EXPECT_NE(a, b);
}

TEST_F(K3SamplingPluginTest, LogitBiasPlus100ForcesItsTokenEveryStep) {
  coli_model_t* m = Open({});
  ASSERT_NE(m, nullptr);
  const int32_t forced = 77;
  for (float temperature : {0.0f, 1.0f}) {
    const std::vector<Out> got = Fresh(
        m, Ids(10, 5), 12,
        {.temperature = temperature, .seed = 9, .logit_bias = {{forced, 100.0f}}});
    ASSERT_EQ(got.size(), 12u) << "temperature " << temperature;
    for (const Out& o : got) EXPECT_EQ(o.token, forced) << "temperature " << temperature;
  }
}

TEST_F(K3SamplingPluginTest, LogitBiasMinus100OnTheGreedyTokenMovesTheFirstToken) {
  coli_model_t* m = Open({});
  ASSERT_NE(m, nullptr);
  const std::vector<int32_t> prompt = Ids(10, 8);
  const std::vector<Out> plain = Fresh(m, prompt, 1, {.logprobs = 2});
  ASSERT_EQ(plain.size(), 1u);
  ASSERT_EQ(plain[0].top.size(), 2u);
  const int32_t greedy = plain[0].token;
  ASSERT_EQ(plain[0].top[0].id, greedy);
  const std::vector<Out> moved =
      Fresh(m, prompt, 1, {.logprobs = 2, .logit_bias = {{greedy, -100.0f}}});
  ASSERT_EQ(moved.size(), 1u);
  EXPECT_NE(moved[0].token, greedy);
  EXPECT_EQ(moved[0].token, plain[0].top[1].id);  // the runner-up of the raw distribution
  // Logprobs stay the raw model's: the biased token still heads the list.
  EXPECT_EQ(moved[0].top[0].id, greedy);
}

TEST_F(K3SamplingPluginTest, PenalisedRowsNeverDraftOnASpecModel) {
  coli_model_t* spec = Open({{"spec", "4"}}, /*layers=*/0);
  coli_model_t* off = Open({}, /*layers=*/0);
  ASSERT_NE(spec, nullptr);
  ASSERT_NE(off, nullptr);
  std::vector<int32_t> prompt = {5};  // the walk prompt: 5, its greedy successors, 5
  for (const Out& o : Fresh(off, {5}, 16)) prompt.push_back(o.token);
  prompt.push_back(5);
  // Plain greedy rows draft (so the zero below means something).
  coli_session_t* plain = NewSession(spec);
  Prefill(plain, prompt);
  Generate(plain, 12);
  EXPECT_GT(Stats(plain)["spec_drafts"], 0);

  for (const Knobs& k : {Knobs{.frequency_penalty = 1.0f}, Knobs{.repetition_penalty = 1.3f},
                         Knobs{.presence_penalty = 0.5f},
                         Knobs{.logit_bias = {{3, 0.5f}}}}) {
    coli_session_t* a = NewSession(spec);
    Prefill(a, prompt);
    const std::vector<Out> got = Generate(a, 12, k);
    EXPECT_EQ(Stats(a)["spec_drafts"], 0);
    coli_session_t* b = NewSession(off);
    Prefill(b, prompt);
    abi_test::ExpectSameOuts(got, Generate(b, 12, k));
  }
}

TEST_F(K3SamplingPluginTest, SameSeedAndKnobsGiveTheSameTokens) {
  coli_model_t* m = Open({});
  ASSERT_NE(m, nullptr);
  const Knobs k{.temperature = 1.2f,
                .top_p = 0.95f,
                .top_k = 50,
                .seed = 1234,
                .repetition_penalty = 1.3f,
                .frequency_penalty = 0.5f,
                .presence_penalty = 0.4f,
                .min_p = 0.02f,
                .logit_bias = {{11, 2.0f}, {12, -3.0f}}};
  const std::vector<int32_t> prompt = Ids(10, 2);
  abi_test::ExpectSameOuts(Fresh(m, prompt, 16, k), Fresh(m, prompt, 16, k));
}

TEST_F(K3SamplingPluginTest, AnOlderHostsRowIsReadAsNeutral) {
  coli_model_t* m = Open({});
  ASSERT_NE(m, nullptr);
  const std::vector<int32_t> prompt = Ids(10, 6);
  const std::vector<Out> plain = Fresh(m, prompt, 4);
  coli_session_t* s = NewSession(m);
  Prefill(s, prompt);
  // The 1.3 fields lie beyond a 1.0 row's struct_size: the plugin must not read them.
  const Knobs ignored{.frequency_penalty = 2.0f, .logit_bias = {{plain[0].token, -100.0f}}};
  for (size_t i = 0; i < plain.size(); ++i) {
    Out o;
    ASSERT_OK(CallSized(s, ignored, COLI_DECODE_ROW_SIZE_V1_0, &o));
    EXPECT_EQ(o.token, plain[i].token) << "step " << i;
  }
}

TEST_F(K3SamplingPluginTest, BadKnobsAreRefusedNamingTheField) {
  coli_model_t* m = Open({});
  ASSERT_NE(m, nullptr);
  coli_session_t* s = NewSession(m);
  Prefill(s, Ids(6, 1));
  EXPECT_THAT(CallSized(s, {.logit_bias = {{kVocab, 1.0f}}}, sizeof(coli_decode_row_t), nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("logit_bias: token id 768 is outside [0, 768)")));
  EXPECT_THAT(CallSized(s, {.frequency_penalty = 2.5f}, sizeof(coli_decode_row_t), nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("frequency_penalty")));
  Knobs null_bias;
  coli_decode_row_t row = Row(s, null_bias);
  row.n_logit_bias = 3;  // entries announced, no array
  auto args = abi::Init<coli_decode_args_t>();
  args.rows = &row;
  args.n_rows = 1;
  Error err;
  EXPECT_THAT(err.Status(api().decode(&args, &err.e)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("logit_bias")));
  // The refusals changed nothing: the session still decodes.
  EXPECT_OK(CallSized(s, {}, sizeof(coli_decode_row_t), nullptr));
}

}  // namespace
}  // namespace coli::k3
