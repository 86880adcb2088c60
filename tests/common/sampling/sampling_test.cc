#include "common/sampling/sampling.h"

#include <cmath>
#include <map>
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

}  // namespace
}  // namespace coli::sampling
