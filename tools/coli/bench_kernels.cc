// `coli bench kernels [--json] [--threads N] [--quick] [--cpu-time] [--row-streams N]`: the
// quantized matmul kernels against this machine's memory read bandwidth.
//
// First a streaming read of 1 GiB with the same threads, 6 passes (3 with --quick; one linear
// stream per thread, the same with software prefetch, 8 streams per thread: the fastest counts),
// gives read_bw_gbs (the best pass, as STREAM reports) and read_bw_mean_gbs (the sustained rate).
// Then, for each format and shape of issue 3 (4096x14336, the K3 expert matrices 3072x3584 and
// 3584x3072, the KDA projection 12288x7168, the int8 lm_head 163840x7168) and batch 1, 8, 32, it
// times Matmul in as many windows of 1 GiB of weights (or 80 ms) and prints GFLOPS (2·rows·cols·
// batch per call), weight GB/s (data + scale bytes per call) of the best window and bw_ratio =
// weight GB/s / read_bw_gbs, and the same over all windows against the sustained probe
// (weight_gbs_mean, bw_ratio_mean): best against best and mean against mean, since on a shared
// machine a best pass and a mean differ by 10–25 %. Calls rotate over >= 512 MB of matrix copies
// so weights come from DRAM, as streamed experts and resident dense matrices do. A probe of 1 GiB
// (the faster of a plain and a prefetching pass) also runs right before each window:
// bw_ratio_paired is the median over the windows of window GB/s / that pass's GB/s, which the
// host's bandwidth drifting between the probe and a kernel (on this VM it moved from 71 to 28 GB/s
// within one run) does not skew. Formats: mxfp4 (exact float, idot off), mxfp4_idot, int8 and
// int4g64 (both with the default integer dots), f32.
//
// --row-streams 1|2|4 sets MatmulOptions::row_streams for batch 1 (default: this CPU's,
// kernels::DefaultRowStreams(); the JSON's "row_streams" says which ran, "isa" the kernels' level
// and "threads" the thread count, so a JSON from another machine says what it measured).
//
// --cpu-time times with the process CPU clock instead of the wall clock (read probe included).
// Only meaningful with --threads 1: it is for shared machines, where other processes' load
// makes wall-clock figures meaningless but a single thread's CPU time is still comparable.
#include <omp.h>
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "bench/kernels/bench_util.h"
#include "common/kernels/kernels.h"
#include "tools/coli/cli_args.h"
#include "tools/coli/command.h"

namespace coli::cli {
namespace {

using kernels::WeightFormat;

struct Config {
  const char* name;
  WeightFormat format;
  bool idot;
};

struct Shape {
  int64_t rows, cols;
  bool int8_only;  // the lm_head runs only as int8
};

// gflops, weight_gbs: the best window (as read_bw_gbs is the best probe pass); *_mean: all
// windows together against the probe's sustained rate.
struct Result {
  std::string format;
  int64_t rows, cols, batch;
  double gflops, weight_gbs, bw_ratio, weight_gbs_mean, bw_ratio_mean, bw_ratio_paired;
};

int Usage(std::FILE* out = stderr) {
  std::fprintf(out,
               "usage: coli bench kernels [--json] [--threads N] [--quick] [--cpu-time] "
               "[--row-streams 1|2|4]\n");
  return 2;
}

int RunBenchKernels(int argc, char** argv) {
  bench::ComputeFlags flags = bench::DefaultComputeFlags();
  if (WantsHelp(argc, argv)) {
    Usage(stdout);
    return 0;
  }
  int row_streams = kernels::DefaultRowStreams();
  for (int i = 1; i < argc; ++i) {
    const int taken = bench::TakeComputeFlag("coli bench kernels", argc, argv, &i, &flags);
    if (taken < 0) return 2;
    if (taken == 0 && !std::strcmp(argv[i], "--row-streams")) {
      long v = 0;
      if (i + 1 >= argc || !bench::ParsePositive(argv[i + 1], 4, &v) || v == 3) {
        std::fprintf(stderr, "coli bench kernels: --row-streams needs 1, 2 or 4 (got '%s')\n",
                     i + 1 < argc ? argv[i + 1] : "");
        return 2;
      }
      row_streams = static_cast<int>(v);
      ++i;
      continue;
    }
    if (taken == 0) {
      std::fprintf(stderr, "coli bench kernels: unknown argument '%s'\n", argv[i]);
      return Usage();
    }
  }
  const bool json = flags.json, quick = flags.quick, cpu_time = flags.cpu_time;
  const int threads = flags.threads;
  const Config configs[] = {{"mxfp4", WeightFormat::kMxfp4, false},
                            {"mxfp4_idot", WeightFormat::kMxfp4, true},
                            {"int8", WeightFormat::kInt8Row, true},
                            {"int4g64", WeightFormat::kInt4G64, true},
                            {"f32", WeightFormat::kF32, false}};
  std::vector<Shape> shapes = {{4096, 14336, false},
                               {3072, 3584, false},
                               {3584, 3072, false},
                               {12288, 7168, false},
                               {163840, 7168, true}};
  std::vector<int64_t> batches = {1, 8, 32};
  if (quick) {
    shapes = {{4096, 14336, false}};
    batches = {1, 32};
  }
  // Weights rotate over >= 512 MB of copies: less (96 MB was tried) is partly served from this
  // VM host's caches and inflates the rates by up to 40 %.
  const size_t rotate_bytes = size_t{512} << 20;
  // Each kernel is timed in `reps` windows, as the probe is timed in `reps` passes; a window
  // ends after 1 GiB of weights (the probe's pass size) or `window_seconds`, whichever is first.
  const int reps = quick ? 3 : 6;
  const double window_bytes = static_cast<double>(size_t{1} << 30);
  const double window_seconds = quick ? 0.03 : 0.08;

  std::fprintf(stderr,
               "[bench kernels] isa %s, %d threads, %d row streams at batch 1; measuring read "
               "bandwidth (1 GiB)\n",
               kernels::IsaName(kernels::ActiveIsa()), threads, row_streams);
  // The probe runs before and after the kernels and the better one is the limit: on a shared
  // machine a neighbour can hold the memory bus during one of them.
  const bench::ReadBandwidth read_start =
      bench::MeasureReadBandwidth(size_t{1} << 30, threads, reps, cpu_time);
  std::fprintf(stderr, "[bench kernels] read bandwidth %.1f GB/s (best pass), %.1f sustained\n",
               read_start.best, read_start.mean);

  bench::ReadProbe paired_probe(size_t{1} << 30, threads, cpu_time);
  std::vector<Result> results;
  for (const Shape& shape : shapes) {
    for (const Config& cfg : configs) {
      if (shape.int8_only && cfg.format != WeightFormat::kInt8Row) continue;
      const size_t one = kernels::ViewBytes(
          kernels::MatrixView{cfg.format, shape.rows, shape.cols, nullptr, nullptr});
      const int copies = static_cast<int>(std::clamp<size_t>(rotate_bytes / one + 1, 1, 64));
      bench::BenchMatrices mats(cfg.format, shape.rows, shape.cols, copies, 7);
      for (int64_t batch : batches) {
        const std::vector<float> x = bench::RandomActivations(batch * shape.cols, 11);
        std::vector<float> y(batch * shape.rows);
        const kernels::MatmulOptions opt{
            .idot = cfg.idot, .threads = threads, .row_streams = row_streams};
        if (absl::Status s = kernels::Matmul(mats.view(0), x.data(), batch, y.data(), opt);
            !s.ok()) {
          std::fprintf(stderr, "coli bench kernels: %s\n", std::string(s.message()).c_str());
          return 1;
        }
        // The clock is read every `step` calls, about every millisecond: reading the process CPU
        // clock is a system call (~1 µs here), as long as a small expert matmul's prologue.
        int64_t calls = 0, step = 1, total_calls = 0;
        double best_per_call = 0, total_seconds = 0;
        std::vector<double> paired;  // per window: its weight GB/s / the probe pass before it
        for (int rep = 0; rep < reps; ++rep) {
          const double probe_gbs = paired_probe.Pass();
          int64_t window_calls = 0;
          double elapsed = 0;
          const double t0 = bench::ClockSeconds(cpu_time);
          while (window_calls == 0 || (static_cast<double>(window_calls * one) < window_bytes &&
                                       elapsed < window_seconds)) {
            for (int64_t i = 0; i < step; ++i, ++calls, ++window_calls) {
              (void)kernels::Matmul(mats.view(static_cast<int>(calls % mats.copies())), x.data(),
                                    batch, y.data(), opt);
            }
            elapsed = bench::ClockSeconds(cpu_time) - t0;
            step =
                std::clamp<int64_t>(static_cast<int64_t>(1e-3 * static_cast<double>(window_calls) /
                                                         std::max(elapsed, 1e-9)),
                                    1, 256);
          }
          const double per_call = elapsed / static_cast<double>(window_calls);
          paired.push_back(static_cast<double>(one) / per_call / 1e9 / probe_gbs);
          if (rep == 0 || per_call < best_per_call) best_per_call = per_call;
          total_calls += window_calls;
          total_seconds += elapsed;
        }
        const double mean_per_call = total_seconds / static_cast<double>(total_calls);
        Result r{cfg.name, shape.rows, shape.cols, batch, 0, 0, 0, 0, 0, 0};
        std::sort(paired.begin(), paired.end());
        const size_t n = paired.size();
        r.bw_ratio_paired = n % 2 ? paired[n / 2] : 0.5 * (paired[n / 2 - 1] + paired[n / 2]);
        const double flops = 2.0 * static_cast<double>(shape.rows * shape.cols * batch);
        r.gflops = flops / best_per_call / 1e9;
        r.weight_gbs = static_cast<double>(one) / best_per_call / 1e9;
        r.weight_gbs_mean = static_cast<double>(one) / mean_per_call / 1e9;
        results.push_back(r);
        std::fprintf(stderr,
                     "[bench kernels] %-10s %6lldx%-6lld batch %2lld: %8.1f GFLOPS %6.1f GB/s "
                     "%.2f (sustained %.1f GB/s %.2f, paired %.2f)\n",
                     r.format.c_str(), static_cast<long long>(r.rows),
                     static_cast<long long>(r.cols), static_cast<long long>(r.batch), r.gflops,
                     r.weight_gbs, r.weight_gbs / read_start.best, r.weight_gbs_mean,
                     r.weight_gbs_mean / read_start.mean, r.bw_ratio_paired);
      }
    }
  }

  const bench::ReadBandwidth read_end =
      bench::MeasureReadBandwidth(size_t{1} << 30, threads, reps, cpu_time);
  const double read_bw = std::max(read_start.best, read_end.best);
  const double read_bw_mean = std::max(read_start.mean, read_end.mean);
  std::fprintf(stderr,
               "[bench kernels] read bandwidth after: %.1f GB/s (best pass), %.1f sustained; "
               "ratios use %.1f and %.1f\n",
               read_end.best, read_end.mean, read_bw, read_bw_mean);
  for (Result& r : results) {
    r.bw_ratio = r.weight_gbs / read_bw;
    r.bw_ratio_mean = r.weight_gbs_mean / read_bw_mean;
  }

  if (json) {
    std::printf(
        "{\"read_bw_gbs\": %.3f, \"read_bw_start_gbs\": %.3f, \"read_bw_end_gbs\": %.3f, "
        "\"read_bw_mean_gbs\": %.3f, \"isa\": \"%s\", \"threads\": %d, \"row_streams\": %d, "
        "\"results\": [",
        read_bw, read_start.best, read_end.best, read_bw_mean,
        kernels::IsaName(kernels::ActiveIsa()), threads, row_streams);
    for (size_t i = 0; i < results.size(); ++i) {
      const Result& r = results[i];
      std::printf(
          "%s{\"format\": \"%s\", \"rows\": %lld, \"cols\": %lld, \"batch\": %lld, "
          "\"gflops\": %.3f, \"weight_gbs\": %.3f, \"bw_ratio\": %.4f, "
          "\"weight_gbs_mean\": %.3f, \"bw_ratio_mean\": %.4f, \"bw_ratio_paired\": %.4f}",
          i ? ", " : "", r.format.c_str(), static_cast<long long>(r.rows),
          static_cast<long long>(r.cols), static_cast<long long>(r.batch), r.gflops, r.weight_gbs,
          r.bw_ratio, r.weight_gbs_mean, r.bw_ratio_mean, r.bw_ratio_paired);
    }
    std::printf("]}\n");
  } else {
    std::printf(
        "read bandwidth: %.1f GB/s best pass, %.1f GB/s sustained (%d threads, isa %s, %d row "
        "streams at batch 1, %s)\n\n",
        read_bw, read_bw_mean, threads, kernels::IsaName(kernels::ActiveIsa()), row_streams,
        cpu_time ? "CPU time" : "wall clock");
    std::printf(
        "| format     | rows x cols    | batch | GFLOPS  | weight GB/s | bw_ratio | sustained "
        "GB/s | ratio | paired |\n");
    std::printf(
        "|------------|----------------|-------|---------|-------------|----------|-----------"
        "-----|-------|--------|\n");
    for (const Result& r : results) {
      char shape[32];
      std::snprintf(shape, sizeof shape, "%lldx%lld", static_cast<long long>(r.rows),
                    static_cast<long long>(r.cols));
      std::printf("| %-10s | %-14s | %5lld | %7.1f | %11.1f | %8.2f | %14.1f | %5.2f | %6.2f |\n",
                  r.format.c_str(), shape, static_cast<long long>(r.batch), r.gflops, r.weight_gbs,
                  r.bw_ratio, r.weight_gbs_mean, r.bw_ratio_mean, r.bw_ratio_paired);
    }
  }
  return 0;
}

}  // namespace

COLI_REGISTER_BENCH(kernels, "kernels",
                    "quantized matmul kernels vs memory read bandwidth [--json] [--threads N] "
                    "[--quick] [--cpu-time] [--row-streams 1|2|4]",
                    RunBenchKernels);

}  // namespace coli::cli
