// Checks every primitive of common/ops against a float64 evaluation of its formula (written
// independently here), and each fast path against its scalar reference.
#include "common/ops/ops.h"

#include <omp.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "common/kernels/kernels.h"
#include "common/ops/kda_sweep.h"
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
  for (int i = 0; i < n; ++i)
    EXPECT_NEAR(z[i], ref[i] / w[i], 1e-4 * std::fabs(ref[i] / w[i]) + 1e-6);
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
  KdaStepHeads(H, dk, dv, q.data(), k.data(), v.data(), a.data(), beta.data(), S1.data(), o1.data(),
               1);
  KdaStepHeads(H, dk, dv, q.data(), k.data(), v.data(), a.data(), beta.data(), S2.data(), o2.data(),
               3);
  EXPECT_EQ(S1, S2);
  EXPECT_EQ(o1, o2);
  std::vector<float> S3(S1.size()), o3(dv);
  S3 = Random(H * dk * dv, 5);
  KdaStepReference(dk, dv, q.data() + 2 * dk, k.data() + 2 * dk, v.data() + 2 * dv,
                   a.data() + 2 * dk, beta[2], S3.data() + 2 * dk * dv, o3.data());
  for (int j = 0; j < dv; ++j) EXPECT_EQ(o3[j], o1[2 * dv + j]);
}

// Thread count by work: one thread below two threads' worth, then one per min_work_per_thread,
// capped by the budget (0 = OpenMP's) and the items.
TEST(Ops, ParallelTeamSizedByWorkItemsAndBudget) {
  const int64_t unit = int64_t{1} << 15;
  EXPECT_EQ(ParallelTeam(0, unit, 2, 2), 1);
  EXPECT_EQ(ParallelTeam(2 * unit - 1, unit, 2, 2), 1);
  EXPECT_EQ(ParallelTeam(2 * unit, unit, 2, 2), 2);
  EXPECT_EQ(ParallelTeam(int64_t{1} << 40, unit, 2, 16), 2);  // items
  EXPECT_EQ(ParallelTeam(int64_t{1} << 40, unit, 96, 4), 4);  // budget
  EXPECT_EQ(ParallelTeam(6 * unit + 5, unit, 96, 16), 6);     // work
  EXPECT_EQ(ParallelTeam(int64_t{1} << 40, unit, 0, 4), 1);   // nothing to share
  EXPECT_EQ(ParallelTeam(int64_t{1} << 40, 1, int64_t{1} << 20, 0), omp_get_max_threads());
  // The shapes behind the defaults: the tiny fixture's decode (2 MLA heads of 64 + 16, 4 KDA
  // heads of 32×32) stays on one thread until ~1640 cached tokens (it split at 410 before) and
  // never splits its KDA row; K3's KDA row (96 heads of 128×128) takes 6 threads, its attention
  // over 4 cached tokens 1, over 16 tokens 6.
  EXPECT_EQ(ParallelTeam(2 * 1638 * 80, kLatentAttentionWorkPerThread, 2, 2), 1);
  EXPECT_EQ(ParallelTeam(2 * 1639 * 80, kLatentAttentionWorkPerThread, 2, 2), 2);
  EXPECT_EQ(ParallelTeam(4 * 32 * 32, kKdaStepSequencesWorkPerThread, 4, 2), 1);
  EXPECT_EQ(ParallelTeam(96 * 128 * 128, kKdaStepSequencesWorkPerThread, 96, 16), 6);
  EXPECT_EQ(ParallelTeam(96 * 4 * 576, kLatentAttentionWorkPerThread, 96, 16), 1);
  EXPECT_EQ(ParallelTeam(96 * 16 * 576, kLatentAttentionWorkPerThread, 96, 16), 6);
}

// Thread-count independence where the work is large enough that a team really runs (the
// ParallelTeam checks make sure the comparison is not two single-thread runs).
TEST(Ops, KdaStepHeadsAndLatentAttentionIndependentOfThreadsWhenParallel) {
  {
    const int H = 12, d = 128;
    ASSERT_EQ(ParallelTeam(int64_t{H} * d * d, kKdaStepHeadsWorkPerThread, H, 3), 3);
    auto q = Random(H * d, 1), k = Random(H * d, 2), v = Random(H * d, 3), a = Random(H * d, 4);
    for (auto& x : a) x = 1.0f / (1.0f + std::fabs(x));
    std::vector<float> beta(H, 0.4f);
    std::vector<float> S1 = Random(H * d * d, 5, 0.3f), S3 = S1, o1(H * d), o3(H * d);
    KdaStepHeads(H, d, d, q.data(), k.data(), v.data(), a.data(), beta.data(), S1.data(), o1.data(),
                 1);
    KdaStepHeads(H, d, d, q.data(), k.data(), v.data(), a.data(), beta.data(), S3.data(), o3.data(),
                 3);
    EXPECT_EQ(S1, S3);
    EXPECT_EQ(o1, o3);
  }
  {
    const int H = 6, L = 64, X = 16, T = 2048, stride = L + X;
    ASSERT_EQ(ParallelTeam(int64_t{H} * T * stride, kLatentAttentionWorkPerThread, H, 3), 3);
    auto qa = Random(H * L, 1), qx = Random(H * X, 2), cache = Random(T * stride, 3);
    std::vector<float> ctx1(H * L), ctx3(H * L);
    LatentAttention(H, T, L, X, stride, qa.data(), qx.data(), cache.data(), 0.1f, ctx1.data(), 1);
    LatentAttention(H, T, L, X, stride, qa.data(), qx.data(), cache.data(), 0.1f, ctx3.data(), 3);
    EXPECT_TRUE(std::memcmp(ctx1.data(), ctx3.data(), ctx1.size() * sizeof(float)) == 0);
  }
}

// KdaStepSequences inputs: `rows` rows of H heads, q scaled and k normalised per head as the
// model does, α in (0.0067, 1] (exp of −5·σ), β in (0, 1), S random.
struct KdaRows {
  int H, dk, dv, rows;
  std::vector<float> q, k, v, alpha, beta;
  KdaRows(int H_, int dk_, int dv_, int rows_, uint32_t seed)
      : H(H_), dk(dk_), dv(dv_), rows(rows_) {
    q = Random(int64_t{rows} * H * dk, seed);
    k = Random(int64_t{rows} * H * dk, seed + 1);
    v = Random(int64_t{rows} * H * dv, seed + 2);
    for (int r = 0; r < rows * H; ++r) {
      L2Normalize(q.data() + int64_t{r} * dk, dk, 1e-6f, 1.0f / std::sqrt(float(dk)));
      L2Normalize(k.data() + int64_t{r} * dk, dk, 1e-6f, 1.0f);
    }
    std::mt19937 rng(seed + 3);
    std::uniform_real_distribution<float> u(-6.0f, 6.0f);
    alpha.resize(q.size());
    for (auto& a : alpha) a = std::exp(-5.0f * Sigmoid(u(rng)));
    beta.resize(int64_t{rows} * H);
    for (auto& b : beta) b = Sigmoid(u(rng));
  }
};

bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

std::vector<kernels::Isa> KdaIsas() {
  std::vector<kernels::Isa> isas;
  for (kernels::Isa isa : {kernels::Isa::kScalar, kernels::Isa::kAvx2, kernels::Isa::kAvx512}) {
    if (KdaIsaSupported(isa)) isas.push_back(isa);
  }
  return isas;
}

// The sequence sweep of every ISA this CPU has equals the row-by-row KdaStepHeads (the path the
// model ran before) bit for bit: states and read-outs, one sequence of many rows and several
// sequences whose rows interleave (batched decode), d = 128 (K3), odd widths (24, 72: masked
// tails on both SIMD widths) and dk != dv, one and three threads.
TEST(Ops, KdaStepSequencesEqualsRowByRowOnEveryIsa) {
  struct Case {
    int H, dk, dv, rows, seqs;
  };
  const Case cases[] = {{3, 128, 128, 33, 1}, {2, 128, 128, 1, 1}, {4, 24, 24, 7, 2},
                        {3, 72, 72, 9, 3},    {2, 16, 40, 6, 2},   {5, 8, 8, 12, 4},
                        {2, 128, 128, 10, 5}, {1, 1, 17, 3, 1},    {3, 72, 72, 3, 3},
                        {2, 24, 40, 2, 2},    {2, 128, 200, 4, 4}, {2, 128, 128, 40, 5}};
  for (const Case& c : cases) {
    SCOPED_TRACE(::testing::Message() << "H " << c.H << " dk " << c.dk << " dv " << c.dv << " rows "
                                      << c.rows << " seqs " << c.seqs);
    KdaRows in(c.H, c.dk, c.dv, c.rows, 17u + c.dk + c.rows);
    const int64_t state = int64_t{c.H} * c.dk * c.dv;
    const std::vector<float> S0 = Random(state * c.seqs, 99, 0.3f);
    // Row r belongs to sequence r % seqs (interleaved, in order within each).
    std::vector<std::vector<int32_t>> idx(c.seqs);
    for (int r = 0; r < c.rows; ++r) idx[r % c.seqs].push_back(r);
    // Reference: the old path, KdaStepHeads row after row.
    std::vector<float> S_ref = S0, o_ref(int64_t{c.rows} * c.H * c.dv);
    for (int r = 0; r < c.rows; ++r) {
      const int64_t qk = int64_t{r} * c.H * c.dk, vo = int64_t{r} * c.H * c.dv;
      KdaStepHeads(c.H, c.dk, c.dv, in.q.data() + qk, in.k.data() + qk, in.v.data() + vo,
                   in.alpha.data() + qk, in.beta.data() + int64_t{r} * c.H,
                   S_ref.data() + (r % c.seqs) * state, o_ref.data() + vo, 1);
    }
    for (kernels::Isa isa : KdaIsas()) {
      for (int threads : {1, 3}) {
        SCOPED_TRACE(::testing::Message()
                     << kernels::IsaName(isa) << ", " << threads << " threads");
        std::vector<float> S = S0, o(o_ref.size(), -1.0f);
        std::vector<KdaSequence> seqs;
        for (int s = 0; s < c.seqs; ++s) {
          seqs.push_back({S.data() + s * state, idx[s].data(), static_cast<int>(idx[s].size())});
        }
        ASSERT_TRUE(KdaStepSequencesWithIsa(isa, c.H, c.dk, c.dv, in.q.data(), in.k.data(),
                                            in.v.data(), in.alpha.data(), in.beta.data(),
                                            seqs.data(), c.seqs, o.data(), threads)
                        .ok());
        EXPECT_TRUE(SameBits(S, S_ref)) << "state";
        EXPECT_TRUE(SameBits(o, o_ref)) << "read-out";
      }
    }
    // The default entry (kernels::ActiveIsa) too.
    std::vector<float> S = S0, o(o_ref.size());
    std::vector<KdaSequence> seqs;
    for (int s = 0; s < c.seqs; ++s) {
      seqs.push_back({S.data() + s * state, idx[s].data(), static_cast<int>(idx[s].size())});
    }
    KdaStepSequences(c.H, c.dk, c.dv, in.q.data(), in.k.data(), in.v.data(), in.alpha.data(),
                     in.beta.data(), seqs.data(), c.seqs, o.data(), 0);
    EXPECT_TRUE(SameBits(S, S_ref));
    EXPECT_TRUE(SameBits(o, o_ref));
  }
}

// Against the float64 closed form (independent of KdaStep): 40 rows of one head, K3's d.
TEST(Ops, KdaStepSequencesMatchesFloat64) {
  const int dk = 128, dv = 128, rows = 40;
  KdaRows in(1, dk, dv, rows, 5);
  std::vector<int32_t> idx(rows);
  for (int r = 0; r < rows; ++r) idx[r] = r;
  for (kernels::Isa isa : KdaIsas()) {
    SCOPED_TRACE(kernels::IsaName(isa));
    std::vector<float> S(dk * dv, 0.0f), o(rows * dv);
    const KdaSequence seq{S.data(), idx.data(), rows};
    ASSERT_TRUE(KdaStepSequencesWithIsa(isa, 1, dk, dv, in.q.data(), in.k.data(), in.v.data(),
                                        in.alpha.data(), in.beta.data(), &seq, 1, o.data(), 1)
                    .ok());
    std::vector<double> S64(dk * dv, 0.0), o64(dv);
    for (int r = 0; r < rows; ++r) {
      KdaFloat64(dk, dv, in.q.data() + r * dk, in.k.data() + r * dk, in.v.data() + r * dv,
                 in.alpha.data() + r * dk, in.beta[r], S64, o64);
      EXPECT_LT(RelL2(o64, o.data() + r * dv), 1e-5) << "row " << r;
    }
    EXPECT_LT(RelL2(S64, S.data()), 1e-5);
  }
}

// Row order within a sequence matters (the test above would notice a kernel that reordered rows
// or that advanced a state with another sequence's rows).
TEST(Ops, KdaStepSequencesRowOrderMatters) {
  KdaRows in(2, 16, 16, 4, 21);
  std::vector<float> S1(2 * 16 * 16, 0.0f), S2 = S1, o(4 * 2 * 16);
  const std::vector<int32_t> forward = {0, 1, 2, 3}, reversed = {3, 2, 1, 0};
  const KdaSequence a{S1.data(), forward.data(), 4}, b{S2.data(), reversed.data(), 4};
  KdaStepSequences(2, 16, 16, in.q.data(), in.k.data(), in.v.data(), in.alpha.data(),
                   in.beta.data(), &a, 1, o.data(), 1);
  KdaStepSequences(2, 16, 16, in.q.data(), in.k.data(), in.v.data(), in.alpha.data(),
                   in.beta.data(), &b, 1, o.data(), 1);
  EXPECT_FALSE(SameBits(S1, S2));
}

TEST(Ops, KdaSweepIsaChoiceAndRefusal) {
  EXPECT_TRUE(KdaIsaSupported(kernels::Isa::kScalar));
  EXPECT_TRUE(KdaIsaSupported(KdaActiveIsa()));
  EXPECT_NE(KdaActiveIsa(), kernels::Isa::kAvxVnni);  // runs the AVX2 sweep
  // Every CPU, through the detected ISA: a sweep runs where the CPU has its ISA (AVX-VNNI = AVX2).
  using kernels::Isa;
  const Isa all[] = {Isa::kScalar, Isa::kAvx2, Isa::kAvxVnni, Isa::kAvx512};
  for (Isa cpu : all) {
    for (Isa want : all) {
      const auto level = [](Isa i) {
        return i == Isa::kAvxVnni ? 1 : i == Isa::kAvx512 ? 2 : i == Isa::kAvx2 ? 1 : 0;
      };
      EXPECT_EQ(internal::KdaIsaSupportedOn(want, cpu), level(want) <= level(cpu))
          << kernels::IsaName(want) << " on " << kernels::IsaName(cpu);
    }
  }
  // The refusal itself, where this CPU lacks AVX-512 (not on an AVX-512 machine).
  if (KdaIsaSupported(kernels::Isa::kAvx512)) return;
  std::vector<float> S(4, 1.0f), o(2, 7.0f), x(2, 0.5f);
  const int32_t row = 0;
  const KdaSequence seq{S.data(), &row, 1};
  const absl::Status st =
      KdaStepSequencesWithIsa(kernels::Isa::kAvx512, 1, 2, 2, x.data(), x.data(), x.data(),
                              x.data(), x.data(), &seq, 1, o.data(), 1);
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(std::string(st.message()).find("avx512"), std::string::npos) << st;
  EXPECT_EQ(S, std::vector<float>(4, 1.0f));  // untouched
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
      for (int i = 0; i < L; ++i)
        ref[h * L + i] += std::exp(s[t] - mx) / sum * cache[t * stride + i];
  }
  EXPECT_LT(RelL2(ref, ctx.data()), 1e-6);
}

}  // namespace
}  // namespace coli::ops
