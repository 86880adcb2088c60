// Google Benchmark view of the kernels (not run in CI): one benchmark per format, shape and batch,
// weights rotated over >= 512 MB so they stream from DRAM. Counters: GFLOPS and weight GB/s.
//   build/bin/kernels_benchmark --benchmark_filter=mxfp4_idot
#include <benchmark/benchmark.h>
#include <omp.h>

#include <memory>
#include <vector>

#include "bench/kernels/bench_util.h"
#include "common/kernels/kernels.h"

namespace {

using coli::kernels::WeightFormat;

void BM_Matmul(benchmark::State& state, WeightFormat format, bool idot) {
  const int64_t rows = state.range(0), cols = state.range(1), batch = state.range(2);
  const size_t one = coli::kernels::ViewBytes({format, rows, cols, nullptr, nullptr});
  const int copies = static_cast<int>(std::min<size_t>(64, (size_t{512} << 20) / one + 1));
  coli::bench::BenchMatrices mats(format, rows, cols, copies, 7);
  const std::vector<float> x = coli::bench::RandomActivations(batch * cols, 11);
  std::vector<float> y(batch * rows);
  const coli::kernels::MatmulOptions opt{idot, omp_get_max_threads()};
  int64_t i = 0;
  for (auto _ : state) {
    absl::Status s = coli::kernels::Matmul(mats.view(static_cast<int>(i++ % copies)), x.data(),
                                           batch, y.data(), opt);
    if (!s.ok()) state.SkipWithError(std::string(s.message()).c_str());
    benchmark::DoNotOptimize(y.data());
  }
  state.counters["GFLOPS"] =
      benchmark::Counter(2.0 * rows * cols * batch, benchmark::Counter::kIsIterationInvariantRate,
                         benchmark::Counter::kIs1000);
  state.counters["weight_GBps"] =
      benchmark::Counter(static_cast<double>(one), benchmark::Counter::kIsIterationInvariantRate,
                         benchmark::Counter::kIs1000);
}

void Shapes(benchmark::internal::Benchmark* b) {
  for (auto [r, c] :
       {std::pair<int64_t, int64_t>{4096, 14336}, {3072, 3584}, {3584, 3072}, {12288, 7168}}) {
    for (int64_t batch : {1, 8, 32}) b->Args({r, c, batch});
  }
  b->UseRealTime()->Unit(benchmark::kMicrosecond);
}

BENCHMARK_CAPTURE(BM_Matmul, mxfp4, WeightFormat::kMxfp4, false)->Apply(Shapes);
BENCHMARK_CAPTURE(BM_Matmul, mxfp4_idot, WeightFormat::kMxfp4, true)->Apply(Shapes);
BENCHMARK_CAPTURE(BM_Matmul, int8, WeightFormat::kInt8Row, true)->Apply(Shapes);
BENCHMARK_CAPTURE(BM_Matmul, int4g64, WeightFormat::kInt4G64, true)->Apply(Shapes);
BENCHMARK_CAPTURE(BM_Matmul, f32, WeightFormat::kF32, false)->Apply(Shapes);
BENCHMARK_CAPTURE(BM_Matmul, int8_lm_head, WeightFormat::kInt8Row, true)
    ->Args({163840, 7168, 1})
    ->Args({163840, 7168, 8})
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond);

}  // namespace

BENCHMARK_MAIN();
