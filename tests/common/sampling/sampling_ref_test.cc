// The OpenAI / vLLM knobs (logit_bias, repetition / frequency / presence penalty, min_p) against
// the independent numpy reference tools/sampling/sampling_ref.py: the processed distribution of
// each knob alone and all together (ties, bias +-100 included) must match it to max abs 1e-6,
// and many seeded draws must pass a chi-square test against it — a test that also rejects the
// same draws against the reference's deliberately wrong orders of operations.
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/sampling/sampling.h"
#include "common/status/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace coli::sampling {
namespace {

using ::coli::testing::StatusIs;
using ::testing::HasSubstr;

struct Case {
  std::string name;
  std::vector<float> logits;
  SamplerOptions options;
  std::vector<int32_t> prompt, output;
  std::string order = "vllm";
};

std::string Hex(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%a", v);
  return buf;
}

template <typename T>
void Counted(std::ostringstream& out, const char* key, const std::vector<T>& v) {
  out << key << ' ' << v.size();
  for (const T& x : v) {
    if constexpr (std::is_floating_point_v<T>) {
      out << ' ' << Hex(x);
    } else {
      out << ' ' << x;
    }
  }
  out << '\n';
}

// Runs the reference on `cases`; name -> probabilities.
std::map<std::string, std::vector<double>> Reference(const std::vector<Case>& cases) {
  std::ostringstream text;
  for (const Case& c : cases) {
    const SamplerOptions& o = c.options;
    text << "case " << c.name << "\norder " << c.order << "\nknobs " << Hex(o.temperature) << ' '
         << Hex(o.top_p) << ' ' << o.top_k << ' ' << Hex(o.min_p) << ' '
         << Hex(o.repetition_penalty) << ' ' << Hex(o.frequency_penalty) << ' '
         << Hex(o.presence_penalty) << '\n';
    Counted(text, "logits", c.logits);
    Counted(text, "prompt", c.prompt);
    Counted(text, "output", c.output);
    text << "bias " << o.logit_bias.size();
    for (const LogitBias& b : o.logit_bias) text << ' ' << b.id << ' ' << Hex(b.bias);
    text << "\nend\n";
  }
  const std::string path =
      absl::StrCat(::testing::TempDir(), "/sampling_ref_cases_", getpid(), ".txt");
  std::ofstream(path) << text.str();
  const std::string cmd = absl::StrCat(SAMPLING_TEST_PYTHON, " ", SAMPLING_TEST_REF, " ", path);
  std::map<std::string, std::vector<double>> out;
  FILE* p = ::popen(cmd.c_str(), "r");
  if (p == nullptr) return out;
  std::string all;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) all.append(buf, n);
  const int rc = ::pclose(p);
  EXPECT_EQ(rc, 0) << cmd;
  std::istringstream lines(all);
  std::string line;
  while (std::getline(lines, line)) {
    std::istringstream fields(line);
    std::string name;
    fields >> name;
    std::vector<double> probs;
    for (double v; fields >> v;) probs.push_back(v);
    out[name] = std::move(probs);
  }
  std::remove(path.c_str());
  return out;
}

TokenHistory History(const Case& c) {
  TokenHistory h;
  h.Reset(c.prompt);
  for (int32_t id : c.output) h.AddOutput(id);
  return h;
}

// 16 logits with two exact ties (ids 4/12 and 7/13) and both signs.
const std::vector<float> kLogits = {1.5f, 0.2f, -0.7f, 2.1f, 0.9f, -1.3f, 0.0f, 1.1f,
                                    0.4f, -0.2f, 1.8f, -2.0f, 0.9f, 1.1f, -0.5f, 1.2f};
const std::vector<int32_t> kPrompt = {3, 7, 8, 2, 5};
const std::vector<int32_t> kOutput = {10, 3, 10, 5, 12, 10, 14};
// The knobs of the chi-square test: every step has an effect and every wrong order a visible one.
SamplerOptions AllKnobs() {
  return {.temperature = 1.3f,
          .top_p = 0.8f,
          .top_k = 14,
          .repetition_penalty = 1.4f,
          .frequency_penalty = 0.4f,
          .presence_penalty = 0.3f,
          .min_p = 0.25f,
          .logit_bias = {{0, 0.8f}, {5, -1.5f}, {10, 1.0f}, {6, 0.6f}}};
}

std::vector<Case> Cases() {
  std::vector<Case> cases;
  auto add = [&](std::string name, SamplerOptions o) {
    cases.push_back({std::move(name), kLogits, std::move(o), kPrompt, kOutput});
  };
  add("plain_t08", {.temperature = 0.8f});
  add("bias", {.temperature = 0.8f, .logit_bias = {{0, 2.5f}, {11, 3.0f}, {3, -1.0f}}});
  add("bias_minus100", {.temperature = 1.0f, .logit_bias = {{3, -100.0f}}});
  add("bias_plus100", {.temperature = 1.0f, .logit_bias = {{11, 100.0f}}});
  add("repetition_up", {.temperature = 0.8f, .repetition_penalty = 1.7f});
  add("repetition_down", {.temperature = 0.8f, .repetition_penalty = 0.6f});
  add("frequency", {.temperature = 0.8f, .frequency_penalty = 0.9f});
  add("frequency_negative", {.temperature = 0.8f, .frequency_penalty = -1.5f});
  add("presence", {.temperature = 0.8f, .presence_penalty = 1.2f});
  add("presence_negative", {.temperature = 0.8f, .presence_penalty = -2.0f});
  add("min_p", {.temperature = 0.8f, .min_p = 0.3f});
  add("min_p_one", {.temperature = 0.8f, .min_p = 1.0f});
  // Ties: 4 and 12 (0.9), 7 and 13 (1.1); top_k 5 cuts between 13 and ... lower id first.
  add("ties_top_k", {.temperature = 1.0f, .top_k = 5});
  add("ties_min_p", {.temperature = 1.0f, .min_p = 0.4f});
  add("greedy_frequency", {.frequency_penalty = 2.0f});
  add("greedy_repetition", {.repetition_penalty = 2.0f});
  add("greedy_bias_minus100", {.logit_bias = {{3, -100.0f}}});
  add("all", AllKnobs());
  SamplerOptions all_greedy = AllKnobs();
  all_greedy.temperature = 0.0f;
  add("all_greedy", all_greedy);
  SamplerOptions all_no_history = AllKnobs();
  cases.push_back({"all_no_history", kLogits, all_no_history, {}, {}});
  return cases;
}

TEST(SamplingReference, ProcessedDistributionMatchesNumpy) {
  const std::vector<Case> cases = Cases();
  const auto ref = Reference(cases);
  ASSERT_EQ(ref.size(), cases.size()) << "the reference answered " << ref.size() << " cases";
  for (const Case& c : cases) {
    const TokenHistory h = History(c);
    const std::vector<double> got = ProcessedProbabilities(c.logits, c.options, &h);
    const std::vector<double>& want = ref.at(c.name);
    ASSERT_EQ(got.size(), want.size()) << c.name;
    double max_abs = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      max_abs = std::max(max_abs, std::abs(got[i] - want[i]));
      // A token the reference cuts is cut here too, and the other way round.
      EXPECT_EQ(got[i] == 0.0, want[i] == 0.0) << c.name << " id " << i;
    }
    EXPECT_LE(max_abs, 1e-6) << c.name;
  }
  // Sanity of the cases themselves (so the comparison above can fail): bias -100 removes the
  // token, +100 takes all the mass, the penalties move the greedy token.
  EXPECT_LT(ref.at("bias_minus100")[3], 1e-40);
  EXPECT_GT(ref.at("bias_plus100")[11], 1.0 - 1e-12);
  EXPECT_EQ(ref.at("greedy_bias_minus100")[3], 0.0);
  EXPECT_EQ(ref.at("greedy_frequency")[3], 0.0);
  EXPECT_NE(ref.at("all"), ref.at("all_no_history"));
}

TEST(SamplingReference, GreedyTakesTheArgmaxOfThePenalisedLogits) {
  for (const Case& c : Cases()) {
    if (c.options.temperature > 0) continue;
    const TokenHistory h = History(c);
    Sampler s(c.options);
    const Sample x = s.Next(c.logits, &h);
    const std::vector<double> p = ProcessedProbabilities(c.logits, c.options, &h);
    EXPECT_EQ(p[x.id], 1.0) << c.name;
    // The reported logprob stays the raw model's.
    EXPECT_FLOAT_EQ(x.logprob, Logprob(c.logits, x.id)) << c.name;
  }
}

// Chi-square critical value at p = 0.001 (Wilson-Hilferty), df >= 1.
double ChiSquareCritical(int df) {
  const double z = 3.090232;  // the 0.999 normal quantile
  const double a = 2.0 / (9.0 * df);
  return df * std::pow(1.0 - a + z * std::sqrt(a), 3.0);
}

// Chi-square of `counts` (n draws) against `p`; infinity when a draw hit a token of p = 0.
double ChiSquare(const std::vector<int>& counts, const std::vector<double>& p, int n, int* df) {
  double chi = 0;
  *df = -1;
  for (size_t i = 0; i < p.size(); ++i) {
    if (p[i] <= 0) {
      if (counts[i] > 0) return INFINITY;
      continue;
    }
    const double e = p[i] * n;
    chi += (counts[i] - e) * (counts[i] - e) / e;
    ++*df;
  }
  return chi;
}

TEST(SamplingReference, SeededDrawsFollowTheReferenceAndNotAWrongOrder) {
  const int n = 40000;
  Case c{"all", kLogits, AllKnobs(), kPrompt, kOutput};
  c.options.seed = 20261129;
  std::vector<Case> orders = {c, c, c, c};
  orders[1].name = "wrong_bias_after_repetition";
  orders[1].order = "bias_after_repetition";
  orders[2].name = "wrong_penalties_after_temperature";
  orders[2].order = "penalties_after_temperature";
  orders[3].name = "wrong_min_p_before_top_p";
  orders[3].order = "min_p_before_top_p";
  const auto ref = Reference(orders);
  ASSERT_EQ(ref.size(), orders.size());

  const TokenHistory h = History(c);
  Sampler s(c.options);
  std::vector<int> counts(kLogits.size(), 0);
  for (int i = 0; i < n; ++i) counts[s.Next(kLogits, &h).id]++;

  int df = 0;
  const double chi = ChiSquare(counts, ref.at("all"), n, &df);
  ASSERT_GT(df, 2);
  EXPECT_LT(chi, ChiSquareCritical(df)) << "df " << df;
  for (size_t k = 1; k < orders.size(); ++k) {
    int wrong_df = 0;
    const double wrong = ChiSquare(counts, ref.at(orders[k].name), n, &wrong_df);
    EXPECT_GT(wrong, ChiSquareCritical(std::max(wrong_df, 1))) << orders[k].name;
  }
}

TEST(SamplingReference, BiasPlus100IsAlwaysDrawnAndMinus100Never) {
  const TokenHistory none;
  Sampler plus({.temperature = 1.5f, .seed = 5, .logit_bias = {{11, 100.0f}}});
  Sampler minus({.temperature = 1.5f, .seed = 5, .logit_bias = {{3, -100.0f}, {10, -100.0f}}});
  for (int i = 0; i < 5000; ++i) {
    EXPECT_EQ(plus.Next(kLogits, &none).id, 11);
    const int32_t id = minus.Next(kLogits, &none).id;
    ASSERT_NE(id, 3);
    ASSERT_NE(id, 10);
  }
}

TEST(SamplingKnobs, SameSeedAndKnobsGiveTheSameTokens) {
  const TokenHistory h = History({"", kLogits, {}, kPrompt, kOutput});
  SamplerOptions o = AllKnobs();
  o.seed = 99;
  Sampler a(o), b(o);
  for (int i = 0; i < 200; ++i) EXPECT_EQ(a.Next(kLogits, &h).id, b.Next(kLogits, &h).id);
}

TEST(SamplingKnobs, HistoryCountsOutputAndDeduplicatesPrompt) {
  TokenHistory h;
  const int32_t prompt[] = {4, 2, 4, 9};
  h.Reset(prompt);
  EXPECT_EQ(h.prompt(), (std::vector<int32_t>{2, 4, 9}));
  h.AddOutput(7);
  h.AddOutput(7);
  h.AddOutput(2);
  EXPECT_EQ(h.output(), (std::map<int32_t, int32_t>{{2, 1}, {7, 2}}));
  // A token of the prompt and of the output is divided by the repetition penalty once.
  std::vector<float> l(10, 2.0f);
  ApplyPenalties(l, {.repetition_penalty = 2.0f}, &h);
  EXPECT_EQ(l[2], 1.0f);
  EXPECT_EQ(l[7], 1.0f);
  EXPECT_EQ(l[0], 2.0f);
  h.Reset(prompt);
  EXPECT_TRUE(h.output().empty());
}

TEST(SamplingKnobs, HasPenaltiesIsFalseForNeutralKnobs) {
  EXPECT_FALSE(HasPenalties({}));
  EXPECT_FALSE(HasPenalties({.repetition_penalty = 0.0f}));  // the ABI's zero means off
  EXPECT_FALSE(HasPenalties({.min_p = 0.5f}));
  EXPECT_TRUE(HasPenalties({.repetition_penalty = 1.1f}));
  EXPECT_TRUE(HasPenalties({.frequency_penalty = -0.1f}));
  EXPECT_TRUE(HasPenalties({.presence_penalty = 0.1f}));
  EXPECT_TRUE(HasPenalties({.logit_bias = {{1, 0.0f}}}));
}

TEST(SamplingKnobs, ValidateNamesTheField) {
  EXPECT_OK(ValidatePenalties(AllKnobs(), 16));
  EXPECT_THAT(ValidatePenalties({.frequency_penalty = 2.5f}, 16),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("frequency_penalty 2.5")));
  EXPECT_THAT(ValidatePenalties({.presence_penalty = -3.0f}, 16),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("presence_penalty")));
  EXPECT_THAT(ValidatePenalties({.repetition_penalty = -1.0f}, 16),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("repetition_penalty")));
  EXPECT_THAT(ValidatePenalties({.repetition_penalty = NAN}, 16),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("repetition_penalty")));
  EXPECT_THAT(ValidatePenalties({.min_p = 1.5f}, 16),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("min_p")));
  EXPECT_THAT(ValidatePenalties({.logit_bias = {{16, 1.0f}}}, 16),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("token id 16")));
  EXPECT_THAT(ValidatePenalties({.logit_bias = {{-1, 1.0f}}}, 0),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("token id -1")));
  EXPECT_THAT(ValidatePenalties({.logit_bias = {{3, 100.5f}}}, 16),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("[-100, 100]")));
  EXPECT_THAT(ValidatePenalties({.logit_bias = {{3, 1.0f}, {3, 2.0f}}}, 16),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("more than once")));
  SamplerOptions many;
  for (int i = 0; i <= kMaxLogitBias; ++i) many.logit_bias.push_back({i, 1.0f});
  EXPECT_THAT(ValidatePenalties(many, 0),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("at most 1024")));
}

}  // namespace
}  // namespace coli::sampling
