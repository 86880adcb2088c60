#include "common/sampling/sampling.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <random>
#include <utility>
#include <vector>

#include "gtest/gtest.h"

namespace coli::sampling {
namespace {

TEST(Sampling, GreedyTakesFirstMaximum) {
  std::vector<float> l = {0.5f, 2.0f, -1.0f, 2.0f};
  EXPECT_EQ(Greedy(l), 1);
  Sampler s;
  EXPECT_EQ(s.Next(l).id, 1);
  std::vector<float> nan = {NAN, 1.0f, 3.0f};
  EXPECT_EQ(Greedy(nan), 2);
}

TEST(Sampling, LogprobsAreLogSoftmax) {
  std::vector<float> l = {1.0f, 2.0f, 3.0f, 3.0f};
  const double lse = std::log(std::exp(1.0) + std::exp(2.0) + 2 * std::exp(3.0));
  auto top = TopLogprobs(l, 3);
  ASSERT_EQ(top.size(), 3u);
  EXPECT_EQ(top[0].id, 2);  // tie: lower id first
  EXPECT_EQ(top[1].id, 3);
  EXPECT_EQ(top[2].id, 1);
  EXPECT_NEAR(top[0].logprob, 3.0 - lse, 1e-6);
  EXPECT_NEAR(top[2].logprob, 2.0 - lse, 1e-6);
  Sampler s({.logprobs = 2});
  Sample x = s.Next(l);
  EXPECT_EQ(x.id, 2);
  EXPECT_NEAR(x.logprob, 3.0 - lse, 1e-6);
  EXPECT_EQ(x.top.size(), 2u);
  EXPECT_EQ(TopLogprobs(l, 10).size(), 4u);
}

TEST(Sampling, LogprobRankCountsEveryTokenAtLeastAsLikely) {
  const std::vector<float> l = {1.0f, 2.0f, 3.0f, 3.0f, -1.0f};
  EXPECT_EQ(LogprobRank(l, 2), 2);  // ties 3: both count (vLLM's >=), lower id or not
  EXPECT_EQ(LogprobRank(l, 3), 2);
  EXPECT_EQ(LogprobRank(l, 1), 3);
  EXPECT_EQ(LogprobRank(l, 0), 4);
  EXPECT_EQ(LogprobRank(l, 4), 5);
}

TEST(Sampling, SeedMakesSamplingReproducible) {
  std::vector<float> l(50);
  for (int i = 0; i < 50; ++i) l[i] = std::sin(i * 0.7f);
  Sampler a({.temperature = 1.0f, .seed = 7}), b({.temperature = 1.0f, .seed = 7}),
      c({.temperature = 1.0f, .seed = 8});
  std::vector<int> ra, rb, rc;
  for (int i = 0; i < 40; ++i) {
    ra.push_back(a.Next(l).id);
    rb.push_back(b.Next(l).id);
    rc.push_back(c.Next(l).id);
  }
  EXPECT_EQ(ra, rb);
  EXPECT_NE(ra, rc);
}

TEST(Sampling, FrequenciesFollowTemperatureSoftmax) {
  std::vector<float> l = {0.0f, 1.0f, 2.0f};
  Sampler s({.temperature = 2.0f, .seed = 1});
  std::map<int, int> count;
  const int n = 20000;
  for (int i = 0; i < n; ++i) count[s.Next(l).id]++;
  const double z = 1 + std::exp(0.5) + std::exp(1.0);
  EXPECT_NEAR(count[0] / double(n), 1 / z, 0.015);
  EXPECT_NEAR(count[1] / double(n), std::exp(0.5) / z, 0.015);
  EXPECT_NEAR(count[2] / double(n), std::exp(1.0) / z, 0.015);
}

TEST(Sampling, TopKAndTopPCut) {
  std::vector<float> l = {3.0f, 2.9f, 0.0f, -1.0f, 2.8f};
  Sampler k({.temperature = 1.0f, .top_k = 2, .seed = 3});
  for (int i = 0; i < 2000; ++i) {
    const int id = k.Next(l).id;
    EXPECT_TRUE(id == 0 || id == 1) << id;
  }
  // p(0) ≈ 0.36: top_p 0.3 keeps only token 0.
  Sampler p({.temperature = 1.0f, .top_p = 0.3f, .seed = 3});
  for (int i = 0; i < 500; ++i) EXPECT_EQ(p.Next(l).id, 0);
  // top_p 0.5: 0.36 < 0.5, 0.36 + 0.32 >= 0.5 → keeps {0, 1}.
  Sampler q({.temperature = 1.0f, .top_p = 0.5f, .seed = 3});
  for (int i = 0; i < 2000; ++i) {
    const int id = q.Next(l).id;
    EXPECT_TRUE(id == 0 || id == 1) << id;
  }
}

// The cut written the plain way: sort every candidate, then top_k, top_p, min_p on the prefix.
// `mass` is what the draw scales its uniform variate by: the kept prefix summed in sorted order,
// or, when every candidate is kept, the total summed in index order (the sampler's rule: with no
// cut it never needs the whole list sorted to know the mass).
struct FullSortCut {
  std::vector<std::pair<double, int32_t>> cand;  // every candidate, fully sorted
  size_t keep = 0;
  double mass = 0.0;
};

FullSortCut CutByFullSort(const std::vector<float>& logits, const SamplerOptions& o) {
  const double inv_t = 1.0 / o.temperature;
  double mx = -std::numeric_limits<double>::infinity();
  for (float v : logits) mx = std::max(mx, v * inv_t);
  FullSortCut c;
  c.cand.resize(logits.size());
  double total = 0.0;
  for (size_t i = 0; i < logits.size(); ++i) {
    c.cand[i] = {std::exp(logits[i] * inv_t - mx), static_cast<int32_t>(i)};
    total += c.cand[i].first;
  }
  std::sort(c.cand.begin(), c.cand.end(), [](const auto& a, const auto& b) {
    return a.first > b.first || (a.first == b.first && a.second < b.second);
  });
  size_t keep = c.cand.size();
  if (o.top_k > 0) keep = std::min<size_t>(keep, o.top_k);
  if (o.top_p > 0.0f && o.top_p < 1.0f) {
    double cum = 0.0;
    size_t i = 0;
    while (i < keep) {
      cum += c.cand[i++].first;
      if (cum >= o.top_p * total) break;
    }
    keep = i;
  }
  if (o.min_p > 0.0f) {
    while (keep > 1 && c.cand[keep - 1].first < static_cast<double>(o.min_p) * c.cand[0].first) {
      --keep;
    }
  }
  c.keep = keep;
  if (keep == c.cand.size()) {
    c.mass = total;
  } else {
    for (size_t i = 0; i < keep; ++i) c.mass += c.cand[i].first;
  }
  return c;
}

std::vector<double> FullSortProbabilities(const std::vector<float>& logits,
                                          const SamplerOptions& o) {
  const FullSortCut c = CutByFullSort(logits, o);
  std::vector<double> probs(logits.size(), 0.0);
  for (size_t i = 0; i < c.keep; ++i) probs[c.cand[i].second] = c.cand[i].first / c.mass;
  return probs;
}

// K3's vocabulary: N(0, sigma²) logits rounded to 1/8, so many probabilities tie exactly.
std::vector<float> K3Logits(float sigma, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.f, sigma);
  std::vector<float> logits(163840);
  for (float& v : logits) v = std::round(normal(rng) * 8.f) / 8.f;
  return logits;
}

// The sampler sorts only as much of the candidate list as its cuts read; the distribution it
// draws from must be the full sort's bit for bit (K3-sized vocabulary, ties included).
TEST(Sampling, PartialSortingGivesTheFullSortsDistributionExactly) {
  const std::vector<float> logits = K3Logits(3.f, 5);
  const SamplerOptions cases[] = {
      {.temperature = 1.0f, .top_p = 0.9f},
      {.temperature = 0.7f, .top_p = 0.999f},
      {.temperature = 1.3f, .top_k = 50},
      {.temperature = 1.0f, .top_p = 0.95f, .top_k = 4000},
      {.temperature = 1.0f, .min_p = 0.05f},
      {.temperature = 2.0f, .min_p = 0.001f},
      {.temperature = 0.8f, .top_p = 0.8f, .min_p = 0.1f},
      {.temperature = 1.0f},  // no cut: the whole list
  };
  for (const SamplerOptions& o : cases) {
    const std::vector<double> got = ProcessedProbabilities(logits, o, nullptr);
    const std::vector<double> want = FullSortProbabilities(logits, o);
    ASSERT_EQ(got.size(), want.size());
    size_t kept = 0, differ = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      kept += want[i] > 0 ? 1 : 0;
      differ += std::memcmp(&got[i], &want[i], sizeof(double)) != 0 ? 1 : 0;
    }
    EXPECT_EQ(differ, 0u) << "T " << o.temperature << " top_p " << o.top_p << " top_k " << o.top_k
                          << " min_p " << o.min_p << " (" << kept << " kept)";
  }
}

// The draw sorts only as far as it walks; it must pick, draw for draw, what a plain full sort and
// a walk with the same mass pick: the same seeded uniform variate scaled by the mass, the first
// candidate in sorted order whose cumulative probability exceeds it (the last kept one when
// rounding leaves it unreached). Peaked and flat logits on K3's vocabulary with ties; no
// cut (the walk extends the sorted prefix itself, past 256 and by doubling on flat logits) and
// the cuts (whose prefix is sorted before the draw).
TEST(Sampling, DrawEqualsAFullSortWalkDrawForDraw) {
  const SamplerOptions cases[] = {
      {.temperature = 1.0f},
      {.temperature = 0.7f},
      {.temperature = 1.0f, .top_p = 0.9f},
      {.temperature = 1.3f, .top_k = 50},
      {.temperature = 1.0f, .min_p = 0.05f},
  };
  constexpr int kSeeds = 8, kDraws = 2;
  size_t past_first_step = 0;  // draws that picked beyond the walk's first sorted step (256)
  for (float sigma : {6.f, 1.f}) {
    const std::vector<float> logits = K3Logits(sigma, 11);
    for (const SamplerOptions& base : cases) {
      const FullSortCut want = CutByFullSort(logits, base);
      std::vector<size_t> rank(logits.size());
      for (size_t i = 0; i < want.cand.size(); ++i) rank[want.cand[i].second] = i;
      for (uint64_t seed = 0; seed < kSeeds; ++seed) {
        SamplerOptions o = base;
        o.seed = seed * 7919 + 1;
        Sampler sampler(o);
        std::mt19937_64 rng(o.seed);
        for (int d = 0; d < kDraws; ++d) {
          const double u = static_cast<double>(rng() >> 11) * 0x1.0p-53 * want.mass;
          double cum = 0.0;
          size_t i = 0;
          while (i < want.keep) {
            cum += want.cand[i].first;
            if (u < cum) break;
            ++i;
          }
          const int32_t expect = want.cand[std::min(i, want.keep - 1)].second;
          const int32_t got = sampler.Next(logits).id;
          ASSERT_EQ(got, expect) << "sigma " << sigma << " T " << o.temperature << " top_p "
                                 << o.top_p << " top_k " << o.top_k << " min_p " << o.min_p
                                 << " seed " << o.seed << " draw " << d;
          past_first_step += rank[expect] >= 256 ? 1 : 0;
        }
      }
    }
  }
  // The flat cases walk past the first sorted step, so the prefix extension is exercised.
  EXPECT_GT(past_first_step, 40u) << past_first_step;
}

// Draw is Next without the reports: over many seeds, every knob (penalties with a history that
// grows as the caller adds each token) and vocabularies up to K3's 163,840 ids, a sampler that
// only draws picks exactly the tokens a twin sampler's Next picks, step by step, and its RNG
// advances identically (the twins keep agreeing afterwards on flat logits, where a draw that
// skipped or added an RNG step would pick other tokens). A copy that draws (speculative decoding's
// verify) leaves the original untouched: the original's Next then draws the same tokens.
TEST(Sampling, DrawPicksNextsTokenWithTheSameRngAdvance) {
  const SamplerOptions cases[] = {
      {},  // greedy
      {.temperature = 1.0f},
      {.temperature = 0.7f, .top_p = 0.9f, .logprobs = 3},
      {.temperature = 1.3f, .top_k = 50},
      {.temperature = 1.0f, .top_p = 0.95f, .top_k = 20, .min_p = 0.05f},
      {.repetition_penalty = 1.3f, .frequency_penalty = 0.5f, .presence_penalty = 0.3f},
      {.temperature = 0.9f,
       .top_p = 0.8f,
       .logprobs = 2,
       .repetition_penalty = 1.2f,
       .frequency_penalty = 1.0f,
       .presence_penalty = -0.5f,
       .logit_bias = {{1, 5.0f}, {3, -100.0f}}},
  };
  struct Size {
    size_t vocab;
    int seeds, steps;
  };
  const Size sizes[] = {{5, 40, 30}, {768, 20, 30}, {163840, 2, 4}};
  size_t sampled_draws = 0, distinct_ids = 0;
  for (const Size& size : sizes) {
    std::mt19937_64 gen(size.vocab);
    std::normal_distribution<float> normal(0.f, 1.f);
    // Alternating peaked and flat rows (the flat ones walk far into the sorted list).
    std::vector<std::vector<float>> rows(2, std::vector<float>(size.vocab));
    for (size_t r = 0; r < rows.size(); ++r) {
      for (float& v : rows[r]) v = std::round(normal(gen) * (r == 0 ? 6.f : 0.5f) * 8.f) / 8.f;
    }
    std::vector<int32_t> prompt;
    for (int i = 0; i < 6; ++i) prompt.push_back(static_cast<int32_t>(gen() % size.vocab));
    for (const SamplerOptions& base : cases) {
      for (int seed = 0; seed < size.seeds; ++seed) {
        SamplerOptions o = base;
        o.seed = static_cast<uint64_t>(seed) * 104729 + size.vocab;
        Sampler next(o), draw(o);
        TokenHistory hn, hd;
        hn.Reset(prompt);
        hd.Reset(prompt);
        std::map<int32_t, int> seen;
        for (int step = 0; step < size.steps; ++step) {
          const std::vector<float>& l = rows[step % 2];
          const int32_t want = next.Next(l, &hn).id;
          const int32_t got = draw.Draw(l, &hd);
          ASSERT_EQ(got, want) << "vocab " << size.vocab << " T " << o.temperature << " top_p "
                               << o.top_p << " top_k " << o.top_k << " seed " << o.seed << " step "
                               << step;
          hn.AddOutput(want);
          hd.AddOutput(got);
          ++seen[got];
          sampled_draws += o.temperature > 0 ? 1 : 0;
        }
        distinct_ids += seen.size();
        // The same RNG state afterwards: both go on drawing the same from the flat row.
        for (int more = 0; more < 3; ++more) {
          ASSERT_EQ(draw.Next(rows[1], &hd).id, next.Next(rows[1], &hn).id)
              << "vocab " << size.vocab << " seed " << o.seed << " after draw " << more;
        }
        // A drawing copy spends none of the original's RNG.
        Sampler copy = next;
        TokenHistory hc = hn;
        std::vector<int32_t> by_copy, by_original;
        for (int step = 0; step < 3; ++step) {
          by_copy.push_back(copy.Draw(rows[step % 2], &hc));
          hc.AddOutput(by_copy.back());
        }
        for (int step = 0; step < 3; ++step) {
          by_original.push_back(next.Next(rows[step % 2], &hn).id);
          hn.AddOutput(by_original.back());
        }
        EXPECT_EQ(by_copy, by_original) << "vocab " << size.vocab << " seed " << o.seed;
      }
    }
  }
  EXPECT_GT(sampled_draws, 5000u);
  // The draws vary (so an RNG step skipped or added would show as another token).
  EXPECT_GT(distinct_ids, 2000u) << distinct_ids;
  std::vector<float> empty;
  Sampler s({.temperature = 1.0f});
  EXPECT_EQ(s.Draw(empty), -1);
  EXPECT_EQ(s.Draw(empty), s.Next(empty).id);
}

// Checked before the model is known (vocab_size 0), a negative id is named as negative, not as
// outside an empty range "[0, 0)" (which a gRPC client once read as its whole error).
TEST(Sampling, LogitBiasIdErrorsNameTheBoundThatFailed) {
  SamplerOptions o;
  o.logit_bias = {{-1, 1.0f}};
  absl::Status unknown_vocab = ValidatePenalties(o, /*vocab_size=*/0);
  EXPECT_EQ(unknown_vocab.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(unknown_vocab.message(), "logit_bias: token id -1 is negative");
  absl::Status known_vocab = ValidatePenalties(o, /*vocab_size=*/768);
  EXPECT_EQ(known_vocab.message(), "logit_bias: token id -1 is outside [0, 768)");
  o.logit_bias = {{768, 1.0f}};
  EXPECT_TRUE(ValidatePenalties(o, /*vocab_size=*/0).ok());  // the upper bound waits for the model
  EXPECT_EQ(ValidatePenalties(o, /*vocab_size=*/768).message(),
            "logit_bias: token id 768 is outside [0, 768)");
}

}  // namespace
}  // namespace coli::sampling
