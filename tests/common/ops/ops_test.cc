// Checks every primitive of common/ops against a float64 evaluation of its formula (written
// independently here), and each fast path against its scalar reference.
#include "common/ops/ops.h"

#include <cmath>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace coli::ops {
namespace {

std::vector<float> Random(int64_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

double RelL2(const std::vector<double>& ref, const float* got) {
  double num = 0, den = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    num += (got[i] - ref[i]) * (got[i] - ref[i]);
    den += ref[i] * ref[i];
  }
  return std::sqrt(num / den);
}

double Sig(double x) { return 1.0 / (1.0 + std::exp(-x)); }

TEST(Ops, RmsNormMatchesFloat64) {
  const int n = 300;
  auto x = Random(n, 1), w = Random(n, 2);
  std::vector<float> y(n);
  RmsNorm(x.data(), w.data(), n, 1e-5f, y.data());
  double ss = 0;
  for (float v : x) ss += double(v) * v;
  std::vector<double> ref(n);
  for (int i = 0; i < n; ++i) ref[i] = x[i] / std::sqrt(ss / n + 1e-5) * w[i];
  EXPECT_LT(RelL2(ref, y.data()), 1e-6);
  // In place and without weight.
  std::vector<float> z = x;
  RmsNorm(z.data(), nullptr, n, 1e-5f, z.data());
  for (int i = 0; i < n; ++i) EXPECT_NEAR(z[i], ref[i] / w[i], 1e-4 * std::fabs(ref[i] / w[i]) + 1e-6);
}

TEST(Ops, RmsNormEpsilonMatters) {
  std::vector<float> x = {1e-4f, -1e-4f}, y(2);
  RmsNorm(x.data(), nullptr, 2, 1e-6f, y.data());
  const double expect = 1e-4 / std::sqrt(1e-8 + 1e-6);
  EXPECT_NEAR(y[0], expect, 1e-6);
}

TEST(Ops, SituGluAndSilu) {
  const int n = 257;
  auto g = Random(n, 3, 8.0f), u = Random(n, 4, 40.0f);
  std::vector<float> out(n);
  SituGlu(g.data(), u.data(), n, 4.0f, 25.0f, out.data());
  std::vector<double> ref(n);
  for (int i = 0; i < n; ++i)
    ref[i] = 4.0 * std::tanh(g[i] / 4.0) * Sig(g[i]) * 25.0 * std::tanh(u[i] / 25.0);
  EXPECT_LT(RelL2(ref, out.data()), 1e-6);
  std::vector<float> s = g;
  SiluInPlace(s.data(), n);
  for (int i = 0; i < n; ++i) ref[i] = g[i] * Sig(g[i]);
  EXPECT_LT(RelL2(ref, s.data()), 1e-6);
}

TEST(Ops, SoftmaxAndL2) {
  auto x = Random(100, 5, 10.0f);
  std::vector<float> p = x;
  Softmax(p.data(), 100);
  double mx = -1e300, sum = 0;
  for (float v : x) mx = std::max(mx, double(v));
  for (float v : x) sum += std::exp(v - mx);
  std::vector<double> ref(100);
  for (int i = 0; i < 100; ++i) ref[i] = std::exp(x[i] - mx) / sum;
  EXPECT_LT(RelL2(ref, p.data()), 1e-6);

  std::vector<float> l = x;
  L2Normalize(l.data(), 100, 1e-6f, 0.5f);
  double ss = 0;
  for (float v : x) ss += double(v) * v;
  for (int i = 0; i < 100; ++i) ref[i] = x[i] * 0.5 / std::sqrt(ss + 1e-6);
  EXPECT_LT(RelL2(ref, l.data()), 1e-6);
  // Epsilon inside the root keeps a zero vector finite.
  std::vector<float> zero(8, 0.0f);
  L2Normalize(zero.data(), 8, 1e-6f, 1.0f);
  for (float v : zero) EXPECT_EQ(v, 0.0f);
}

// Float64 delta rule written from the spec's closed form S = (I − βkkᵀ)Diag(α)S + βkvᵀ.
void KdaFloat64(int dk, int dv, const float* q, const float* k, const float* v, const float* a,
                float beta, std::vector<double>& S, std::vector<double>& o) {
  std::vector<double> D(dk * dv), kD(dv, 0.0);
  for (int i = 0; i < dk; ++i)
    for (int j = 0; j < dv; ++j) D[i * dv + j] = a[i] * S[i * dv + j];
  for (int j = 0; j < dv; ++j)
    for (int i = 0; i < dk; ++i) kD[j] += k[i] * D[i * dv + j];
  for (int i = 0; i < dk; ++i)
    for (int j = 0; j < dv; ++j)
      S[i * dv + j] = D[i * dv + j] - beta * k[i] * kD[j] + beta * k[i] * v[j];
  for (int j = 0; j < dv; ++j) {
    o[j] = 0;
    for (int i = 0; i < dk; ++i) o[j] += q[i] * S[i * dv + j];
  }
}

TEST(Ops, KdaStepMatchesClosedFormAndReference) {
  const int dk = 16, dv = 24, steps = 40;
  std::vector<float> S(dk * dv, 0.0f), Sref(dk * dv, 0.0f), o(dv), oref(dv);
  std::vector<double> S64(dk * dv, 0.0), o64(dv);
  std::mt19937 rng(9);
  std::uniform_real_distribution<float> ua(0.01f, 1.0f);
  for (int t = 0; t < steps; ++t) {
    auto q = Random(dk, 100 + t), k = Random(dk, 200 + t), v = Random(dv, 300 + t);
    L2Normalize(q.data(), dk, 1e-6f, 0.25f);
    L2Normalize(k.data(), dk, 1e-6f, 1.0f);
    std::vector<float> a(dk);
    for (auto& x : a) x = ua(rng);
    const float beta = ua(rng);
    KdaStep(dk, dv, q.data(), k.data(), v.data(), a.data(), beta, S.data(), o.data());
    KdaStepReference(dk, dv, q.data(), k.data(), v.data(), a.data(), beta, Sref.data(),
                     oref.data());
    KdaFloat64(dk, dv, q.data(), k.data(), v.data(), a.data(), beta, S64, o64);
    // Same f32 operations in the same order: bit-identical.
    for (int j = 0; j < dv; ++j) ASSERT_EQ(o[j], oref[j]) << "step " << t << " j " << j;
    for (int i = 0; i < dk * dv; ++i) ASSERT_EQ(S[i], Sref[i]);
    EXPECT_LT(RelL2(o64, o.data()), 1e-5) << "step " << t;
  }
}

TEST(Ops, KdaStepHeadsIndependentOfThreads) {
  const int H = 5, dk = 8, dv = 8;
  auto q = Random(H * dk, 1), k = Random(H * dk, 2), v = Random(H * dv, 3), a = Random(H * dk, 4);
  for (auto& x : a) x = 1.0f / (1.0f + std::fabs(x));
  std::vector<float> beta = {0.1f, 0.5f, 0.9f, 0.3f, 0.7f};
  std::vector<float> S1 = Random(H * dk * dv, 5), S2 = S1, o1(H * dv), o2(H * dv);
  KdaStepHeads(H, dk, dv, q.data(), k.data(), v.data(), a.data(), beta.data(), S1.data(),
               o1.data(), 1);
  KdaStepHeads(H, dk, dv, q.data(), k.data(), v.data(), a.data(), beta.data(), S2.data(),
               o2.data(), 3);
  EXPECT_EQ(S1, S2);
  EXPECT_EQ(o1, o2);
  std::vector<float> S3(S1.size()), o3(dv);
  S3 = Random(H * dk * dv, 5);
  KdaStepReference(dk, dv, q.data() + 2 * dk, k.data() + 2 * dk, v.data() + 2 * dv,
                   a.data() + 2 * dk, beta[2], S3.data() + 2 * dk * dv, o3.data());
  for (int j = 0; j < dv; ++j) EXPECT_EQ(o3[j], o1[2 * dv + j]);
}

TEST(Ops, CausalConvStepIsCausalWithZeroHistory) {
  const int C = 3, taps = 4;
  std::vector<float> w = Random(C * taps, 7), window((taps - 1) * C, 0.0f), y(C);
  std::vector<std::vector<float>> xs;
  for (int t = 0; t < 6; ++t) xs.push_back(Random(C, 50 + t));
  for (int t = 0; t < 6; ++t) {
    CausalConvStep(C, taps, w.data(), window.data(), xs[t].data(), y.data());
    for (int c = 0; c < C; ++c) {
      double ref = 0;
      for (int j = 0; j < taps; ++j) {
        const int src = t - (taps - 1) + j;  // tap taps-1 multiplies the current token
        if (src >= 0) ref += double(w[c * taps + j]) * xs[src][c];
      }
      EXPECT_NEAR(y[c], ref, 1e-5) << "t " << t << " c " << c;
    }
  }
}

TEST(Ops, LatentAttentionMatchesFloat64) {
  const int H = 3, L = 10, X = 4, T = 7, stride = L + X;
  auto qa = Random(H * L, 1), qx = Random(H * X, 2), cache = Random(T * stride, 3);
  std::vector<float> ctx(H * L);
  const float scale = 0.3f;
  LatentAttention(H, T, L, X, stride, qa.data(), qx.data(), cache.data(), scale, ctx.data(), 2);
  std::vector<double> ref(H * L, 0.0);
  for (int h = 0; h < H; ++h) {
    std::vector<double> s(T);
    double mx = -1e300, sum = 0;
    for (int t = 0; t < T; ++t) {
      double d = 0;
      for (int i = 0; i < L; ++i) d += double(qa[h * L + i]) * cache[t * stride + i];
      for (int i = 0; i < X; ++i) d += double(qx[h * X + i]) * cache[t * stride + L + i];
      s[t] = d * scale;
      mx = std::max(mx, s[t]);
    }
    for (int t = 0; t < T; ++t) sum += std::exp(s[t] - mx);
    for (int t = 0; t < T; ++t)
      for (int i = 0; i < L; ++i) ref[h * L + i] += std::exp(s[t] - mx) / sum * cache[t * stride + i];
  }
  EXPECT_LT(RelL2(ref, ctx.data()), 1e-6);
}

}  // namespace
}  // namespace coli::ops
