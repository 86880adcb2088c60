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

}  // namespace
}  // namespace coli::sampling
