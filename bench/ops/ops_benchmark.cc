// Google Benchmark view of common/ops' threading (not run in CI): what a parallel region costs
// and, for the ops that open one (LatentAttention, KdaStepSequences), one thread against a team
// over work sizes around the threshold they apply. Compare `threads` 1 and 2 at
// the same work; run it idle and with every core busy, with and without OMP_WAIT_POLICY=passive:
//   build/bin/ops_benchmark --benchmark_filter=LatentAttention
#include <benchmark/benchmark.h>
#include <omp.h>

#include <cstdint>
#include <random>
#include <vector>

#include "common/ops/ops.h"

namespace {

std::vector<float> Random(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = dist(rng);
  return v;
}

// An empty region of `threads`: the fork and join alone.
void BM_EmptyRegion(benchmark::State& state) {
  const int threads = static_cast<int>(state.range(0));
  int sink = 0;
  for (auto _ : state) {
#pragma omp parallel num_threads(threads)
    {
      if (omp_get_thread_num() == 0) sink += omp_get_num_threads();
    }
    benchmark::DoNotOptimize(sink);
  }
}
BENCHMARK(BM_EmptyRegion)->Arg(1)->Arg(2)->UseRealTime();

// Args: heads, T, latent, extra, threads. `work` (heads·T·(latent+extra)) is what
// ops::ParallelTeam weighs.
void BM_LatentAttention(benchmark::State& state) {
  const int heads = static_cast<int>(state.range(0));
  const int64_t T = state.range(1);
  const int latent = static_cast<int>(state.range(2)), extra = static_cast<int>(state.range(3));
  const int threads = static_cast<int>(state.range(4));
  const int64_t stride = latent + extra;
  const std::vector<float> q_abs = Random(int64_t{heads} * latent, 1);
  const std::vector<float> q_x = Random(int64_t{heads} * extra, 2);
  const std::vector<float> cache = Random(T * stride, 3);
  std::vector<float> ctx(static_cast<size_t>(heads) * latent);
  for (auto _ : state) {
    coli::ops::LatentAttention(heads, T, latent, extra, stride, q_abs.data(), q_x.data(),
                               cache.data(), 0.1f, ctx.data(), threads);
    benchmark::DoNotOptimize(ctx.data());
  }
  state.counters["work"] = static_cast<double>(int64_t{heads} * T * stride);
}

void LatentShapes(benchmark::internal::Benchmark* b) {
  // The tiny fixture's MLA (2 heads, latent 64 + extra 16) over its context lengths.
  for (int64_t T : {128, 256, 410, 512, 1024, 2048, 4096, 8192}) {
    for (int threads : {1, 2}) b->Args({2, T, 64, 16, threads});
  }
  // K3's MLA (96 heads, latent 512 + extra 64) at short contexts.
  for (int64_t T : {1, 2, 4, 16, 64}) {
    for (int threads : {1, 2}) b->Args({96, T, 512, 64, threads});
  }
  b->UseRealTime()->Unit(benchmark::kMicrosecond);
}
BENCHMARK(BM_LatentAttention)->Apply(LatentShapes);

// Args: heads, head dim, rows (one sequence), threads. work = rows·heads·dk·dv.
void BM_KdaStepSequences(benchmark::State& state) {
  const int heads = static_cast<int>(state.range(0)), d = static_cast<int>(state.range(1));
  const int rows = static_cast<int>(state.range(2)), threads = static_cast<int>(state.range(3));
  const int64_t qk = int64_t{rows} * heads * d;
  const std::vector<float> q = Random(qk, 1), k = Random(qk, 2), v = Random(qk, 3);
  std::vector<float> alpha = Random(qk, 4), beta = Random(int64_t{rows} * heads, 5);
  for (float& a : alpha) a = 0.9f + 0.05f * a;  // decays in (0.85, 0.95): the state stays finite
  for (float& b : beta) b = 0.5f + 0.25f * b;
  std::vector<float> S(static_cast<size_t>(heads) * d * d, 0.0f), o(static_cast<size_t>(qk));
  std::vector<int32_t> idx(static_cast<size_t>(rows));
  for (int r = 0; r < rows; ++r) idx[r] = r;
  const coli::ops::KdaSequence seq{S.data(), idx.data(), rows};
  for (auto _ : state) {
    coli::ops::KdaStepSequences(heads, d, d, q.data(), k.data(), v.data(), alpha.data(),
                                beta.data(), &seq, 1, o.data(), threads);
    benchmark::DoNotOptimize(o.data());
  }
  state.counters["work"] = static_cast<double>(qk * d);
}

void KdaShapes(benchmark::internal::Benchmark* b) {
  for (int rows : {1, 4, 8, 16, 32, 64}) {
    for (int threads : {1, 2}) b->Args({4, 32, rows, threads});  // the tiny fixture
  }
  for (int threads : {1, 2}) b->Args({96, 128, 1, threads});  // K3, one decode row
  b->UseRealTime()->Unit(benchmark::kMicrosecond);
}
BENCHMARK(BM_KdaStepSequences)->Apply(KdaShapes);

// Args: heads, head dim, threads: one row through KdaStepHeads. work = heads·dk·dv.
void BM_KdaStepHeads(benchmark::State& state) {
  const int heads = static_cast<int>(state.range(0)), d = static_cast<int>(state.range(1));
  const int threads = static_cast<int>(state.range(2));
  const int64_t qk = int64_t{heads} * d;
  const std::vector<float> q = Random(qk, 1), k = Random(qk, 2), v = Random(qk, 3);
  std::vector<float> alpha = Random(qk, 4), beta = Random(heads, 5);
  for (float& a : alpha) a = 0.9f + 0.05f * a;
  for (float& b : beta) b = 0.5f + 0.25f * b;
  std::vector<float> S(static_cast<size_t>(heads) * d * d, 0.0f), o(static_cast<size_t>(qk));
  for (auto _ : state) {
    coli::ops::KdaStepHeads(heads, d, d, q.data(), k.data(), v.data(), alpha.data(), beta.data(),
                            S.data(), o.data(), threads);
    benchmark::DoNotOptimize(o.data());
  }
  state.counters["work"] = static_cast<double>(qk * d);
}
BENCHMARK(BM_KdaStepHeads)
    ->Args({4, 32, 1})
    ->Args({16, 32, 1})
    ->Args({16, 64, 1})
    ->Args({96, 128, 1})
    ->Args({96, 128, 2})
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond);

}  // namespace

BENCHMARK_MAIN();
