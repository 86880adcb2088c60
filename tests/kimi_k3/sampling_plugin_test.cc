// The ABI 1.3 sampling knobs in the kimi_k3 plugin, through its C table on the tiny fixture
// (vocabulary 768). The reference for the penalties is computed here, independently of
// common/sampling, from the raw log-probabilities of every token (logprobs_top_k = the whole
// vocabulary): log_softmax is the logits minus one constant per step, so the greedy token under
// frequency / presence penalties is the first maximum of logprob - f * count - p * (count > 0)
// over the tokens generated so far. Also: logit_bias +100 forces its token at every step, -100
// on the plain greedy token moves the first token to the runner-up, rows with penalties are
// speculated on a speculative-decoding model with outputs bit for bit those of spec off, the
// same seed and knobs give the same tokens, an older host's shorter row is read as neutral, and
// bad knobs are refused naming the field.
// Where repetition must happen the model is opened with K3_LAYERS=0 (embedding, final norm and
// head only): the next greedy token is then a function of the last one, so plain greedy soon
// cycles through tokens it has generated — what the penalties are for — and a "walk prompt" (a
// start token, its greedy successors, the start again) gives prompt lookup drafts to verify.
#include <algorithm>
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

TEST_F(K3SamplingPluginTest, PenalisedRowsDraftOnASpecModel) {
  coli_model_t* spec = Open({{"spec", "4"}}, /*layers=*/0);
  coli_model_t* off = Open({}, /*layers=*/0);
  ASSERT_NE(spec, nullptr);
  ASSERT_NE(off, nullptr);
  std::vector<int32_t> prompt = {5};  // the walk prompt: 5, its greedy successors, 5
  for (const Out& o : Fresh(off, {5}, 16)) prompt.push_back(o.token);
  prompt.push_back(5);
  for (const Knobs& k : {Knobs{.frequency_penalty = 1.0f}, Knobs{.repetition_penalty = 1.05f},
                         Knobs{.presence_penalty = 0.5f},
                         Knobs{.logit_bias = {{3, 0.5f}}}}) {
    coli_session_t* a = NewSession(spec);
    Prefill(a, prompt);
    const std::vector<Out> got = Generate(a, 12, k);
    EXPECT_GT(Stats(a)["spec_drafts"], 0) << "repetition " << k.repetition_penalty;
    coli_session_t* b = NewSession(off);
    Prefill(b, prompt);
    abi_test::ExpectSameOuts(got, Generate(b, 12, k));
  }
}

// Penalised rows (greedy and seeded sampled; frequency / presence / repetition penalty,
// logit_bias) on a speculative-decoding model, 120 tokens each: tokens, finish, text, logprob and
// top logprobs bit for bit against spec off. The verify draws with a copy of the row's sampler
// and of its history, each row's token added to the copy before the next row draws, so every
// draft it accepts is what the real sampler then draws from the buffer: no rewind (a buffered
// token the real sampler does not draw would force one), and along a walk prompt — start, the
// row's own continuation of start with these knobs and seed, start — the drafts are that
// continuation again, so most of it comes from the buffer. (On the bigram model, layers = 0, the
// logits depend on the last token only; frequency and presence penalties and logit_bias read the
// output, empty at both starts, so the same knobs and seed continue the walk. The repetition
// penalty also reads the prompt, which now holds the walk: a mild one keeps the greedy walk,
// a sampled row need not come back.) Also a random prompt, on the bigram model and for two
// cases on the full stack, where drafts are mostly rejected (the full stack replays the rejected
// rows of its KDA layers and cuts its MLA caches).
TEST_F(K3SamplingPluginTest, PenalisedRowsSpeculatedSameOutputs) {
  constexpr int kLong = 120, kWalk = 40;
  coli_model_t* off = Open({}, /*layers=*/0);
  // spec_sampled_ngram 1: sampled rows draft on every match (the default policy waits for a
  // 3-token match), so their verifies run on the free-text walks and random prompts too.
  coli_model_t* on = Open({{"spec", "6"}, {"spec_sampled_ngram", "1"}}, /*layers=*/0);
  coli_model_t* full_off = Open({});
  coli_model_t* full_on = Open({{"spec", "4"}, {"spec_sampled_ngram", "1"}});
  ASSERT_NE(off, nullptr);
  ASSERT_NE(on, nullptr);
  ASSERT_NE(full_off, nullptr);
  ASSERT_NE(full_on, nullptr);
  struct Case {
    Knobs k;
    bool walk_returns;  // the walk comes back (so most of it must come from the buffer)
    bool full;          // also a random prompt on the full stack
    bool plain_walk = false;  // the plain greedy walk up to its cycle instead of the row's own
  };
  const std::vector<Case> cases = {
      {{.logprobs = 3, .frequency_penalty = 0.5f}, true, false},
      {{.logprobs = 2, .presence_penalty = 0.8f, .logit_bias = {{3, 0.5f}, {600, -1.0f}}}, true,
       false},
      {{.logprobs = 1, .repetition_penalty = 1.05f}, true, true},
      {{.temperature = 0.8f, .top_k = 8, .logprobs = 2, .seed = 11, .frequency_penalty = 0.4f,
        .presence_penalty = 0.2f},
       true, false},
      {{.temperature = 1.0f, .top_p = 0.9f, .logprobs = 3, .seed = 12, .min_p = 0.02f,
        .logit_bias = {{7, 2.0f}, {9, -1.0f}}},
       true, true},
      {{.temperature = 0.7f, .top_k = 20, .logprobs = 2, .seed = 13, .repetition_penalty = 1.05f,
        .frequency_penalty = 0.3f},
       false, false},
      // The plain greedy walk ends in a cycle (4 tokens on the fixture). The prompt stops two
      // tokens before the cycle starts, so the first verify's draft is the cycle and its repeat,
      // which a strong presence / frequency penalty forbids once emitted — here emitted earlier
      // in the same draft, which only a copy of the history advanced row by row knows: a copy
      // that is not advanced accepts the repeat, which the real sampler then does not draw (a
      // rewind). Greedy, and sampled through the sampler's cut (top_k 1, so the draws are sure).
      {{.logprobs = 2, .presence_penalty = 2.0f}, false, false, true},
      {{.temperature = 0.5f, .top_k = 1, .logprobs = 2, .seed = 14, .frequency_penalty = 1.5f,
        .presence_penalty = 0.5f},
       false, false, true},
  };
  double random_drafts = 0, full_drafts = 0;
  for (size_t c = 0; c < cases.size(); ++c) {
    const Knobs& k = cases[c].k;
    SCOPED_TRACE(::testing::Message() << "case " << c);
    // The walk prompt, generated by these knobs and seed (or plain greedy).
    std::vector<int32_t> walk = {5};
    for (const Out& o : Fresh(off, {5}, kWalk, cases[c].plain_walk ? Knobs{} : k)) {
      if (o.finish == COLI_FINISH_NONE) walk.push_back(o.token);
    }
    if (cases[c].plain_walk) {
      // The cycle starts at the first token that comes again; end the prompt with the token two
      // before it (its successor, the row's first token, is then followed by the cycle).
      size_t start = walk.size();
      for (size_t i = 0; i < walk.size() && start == walk.size(); ++i) {
        if (std::find(walk.begin() + i + 1, walk.end(), walk[i]) != walk.end()) start = i;
      }
      ASSERT_TRUE(start >= 2 && start + 6 <= walk.size())
          << "the plain walk's cycle should start after 2 tokens and repeat within kWalk";
      walk.push_back(walk[start - 2]);
    } else {
      walk.push_back(5);
    }
    const std::vector<int32_t> random = Ids(12, static_cast<int>(c) + 20);
    struct Run {
      const std::vector<int32_t>* prompt;
      coli_model_t* spec;
      coli_model_t* plain;
    };
    for (const Run& r : {Run{&walk, on, off}, Run{&random, on, off},
                         Run{&random, full_on, full_off}}) {
      const auto& [prompt, spec, plain] = r;
      if (spec == full_on && !cases[c].full) continue;
      const bool is_walk = prompt == &walk;
      SCOPED_TRACE(is_walk ? "walk" : spec == full_on ? "random, full stack" : "random");
      coli_session_t* s = NewSession(spec);
      Prefill(s, *prompt, k.seed);
      abi_test::ExpectSameOuts(Generate(s, kLong, k), Fresh(plain, *prompt, kLong, k));
      auto st = Stats(s);
      EXPECT_EQ(st["spec_rewinds"], 0);  // every accepted draft was the real sampler's draw
      if (is_walk) {
        EXPECT_GT(st["spec_drafts"], 0);
        if (cases[c].walk_returns) {
          EXPECT_GE(st["spec_accepted_tokens"], static_cast<double>(walk.size()) / 2)
              << st["spec_draft_tokens"] << " draft tokens";
        }
      } else {
        (spec == full_on ? full_drafts : random_drafts) += st["spec_drafts"];
      }
    }
  }
  EXPECT_GT(random_drafts, 0);
  EXPECT_GT(full_drafts, 0);
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
