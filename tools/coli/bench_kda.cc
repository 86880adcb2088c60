// `coli bench kda [--json] [--threads N] [--rows 1,8,32] [--layers L] [--quick] [--cpu-time]`: the
// KDA recurrence (spec §3.3 step 6) at Kimi K3's shapes against this machine's memory read
// bandwidth.
//
// K3 keeps per sequence and KDA layer S [H = 96, d = 128, d = 128] f32 = 6.3 MB, 434 MB over its 69
// KDA layers: far more than any cache, so a token's recurrence is bounded by memory traffic.
// First a streaming read of 1 GiB with the same threads (6 passes; 2 of 256 MiB with --quick)
// gives read_bw_gbs (best pass). Then, for each row count n of --rows, one "chunk" advances the
// states of all L layers (one sequence) by n rows, on two paths:
//   rowwise  the path before issue kda: per layer, row after row, ops::KdaStepHeads over all
//            heads, so the whole layer state crosses memory once per row (read + write:
//            2·state bytes per token);
//   heads    ops::KdaStepSequences: per layer, each head over all n rows while its S (64 KB)
//            stays in cache, so the state crosses memory once per chunk (2·state/n per token).
// n = 1 is a decode token. Each path is timed in 5 windows of >= 0.25 s (2 of 0.03 s with --quick),
// a 1 GiB probe pass right before each (bw_ratio_paired: median of window GB/s / that probe, which
// the host's bandwidth drifting does not skew). Reported per (path, n): tokens/s of the recurrence
// alone (the best window), ms per token and per chunk scaled to K3's 69 layers, the modelled state
// bytes moved per token, gbs = those bytes · tokens/s, bw_ratio = gbs / read_bw_gbs, and speedup
// over rowwise at the same n. Before timing, both paths advance copies of one layer's state over
// the same rows and the result must be bit-identical ("identical"; the bench fails otherwise).
// The sweep runs on kernels::ActiveIsa (COLI_ISA=scalar|avx2 forces a lower one).
//
// --cpu-time times with the process CPU clock instead of the wall clock (read probes included).
// Only meaningful with --threads 1: on a shared machine other processes' load makes wall-clock
// figures swing several-fold, while a single thread's CPU time stays comparable.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "bench/kernels/bench_util.h"
#include "common/kernels/kernels.h"
#include "common/ops/kda_sweep.h"
#include "common/ops/ops.h"
#include "tools/coli/cli_args.h"
#include "tools/coli/command.h"

namespace coli::cli {
namespace {

constexpr int kHeads = 96, kDim = 128, kK3Layers = 69;

struct Result {
  std::string path;
  int rows;
  double tokens_per_s, ms_per_token_k3, ms_per_chunk_k3, bytes_per_token, gbs, bw_ratio,
      bw_ratio_paired, speedup;
};

int Usage(std::FILE* out = stderr) {
  std::fprintf(out,
               "usage: coli bench kda [--json] [--threads N] [--rows 1,8,32] [--layers L] "
               "[--quick] [--cpu-time]\n");
  return 2;
}

// "1,8,32" -> {1, 8, 32}; false on anything else.
bool ParseRows(const char* s, std::vector<int>* rows) {
  rows->clear();
  std::string text(s);
  size_t start = 0;
  while (start <= text.size()) {
    const size_t comma = text.find(',', start);
    const std::string item =
        text.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    long v = 0;
    if (!bench::ParsePositive(item.c_str(), 4096, &v)) return false;
    rows->push_back(static_cast<int>(v));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return !rows->empty();
}

// Rows of inputs as the model makes them: q scaled and k normalised per head, α = exp(−5·σ(·)),
// β = σ(·), v ~ N(0, 1).
struct Inputs {
  std::vector<float> q, k, v, alpha, beta;
  explicit Inputs(int rows) {
    const int64_t qk = int64_t{rows} * kHeads * kDim;
    std::mt19937 rng(7);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::uniform_real_distribution<float> u(-6.0f, 6.0f);
    q.resize(qk);
    k.resize(qk);
    v.resize(qk);
    alpha.resize(qk);
    beta.resize(int64_t{rows} * kHeads);
    for (auto* x : {&q, &k, &v}) {
      for (float& f : *x) f = nd(rng);
    }
    for (int64_t r = 0; r < int64_t{rows} * kHeads; ++r) {
      ops::L2Normalize(q.data() + r * kDim, kDim, 1e-6f, 1.0f / std::sqrt(float(kDim)));
      ops::L2Normalize(k.data() + r * kDim, kDim, 1e-6f, 1.0f);
    }
    for (float& a : alpha) a = std::exp(-5.0f * ops::Sigmoid(u(rng)));
    for (float& b : beta) b = ops::Sigmoid(u(rng));
  }
};

// One chunk of n rows over every layer's state. `o` holds n rows of read-out.
void RowwiseChunk(const Inputs& in, int n, float* states, int layers, int64_t state_floats,
                  float* o, int threads) {
  const int64_t qk = int64_t{kHeads} * kDim;
  for (int l = 0; l < layers; ++l) {
    float* S = states + l * state_floats;
    for (int r = 0; r < n; ++r) {
      ops::KdaStepHeads(kHeads, kDim, kDim, in.q.data() + r * qk, in.k.data() + r * qk,
                        in.v.data() + r * qk, in.alpha.data() + r * qk,
                        in.beta.data() + int64_t{r} * kHeads, S, o + r * qk, threads);
    }
  }
}

void HeadsChunk(const Inputs& in, const std::vector<int32_t>& idx, int n, float* states, int layers,
                int64_t state_floats, float* o, int threads) {
  for (int l = 0; l < layers; ++l) {
    const ops::KdaSequence seq{states + l * state_floats, idx.data(), n};
    ops::KdaStepSequences(kHeads, kDim, kDim, in.q.data(), in.k.data(), in.v.data(),
                          in.alpha.data(), in.beta.data(), &seq, 1, o, threads);
  }
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

int RunBenchKda(int argc, char** argv) {
  bench::ComputeFlags flags = bench::DefaultComputeFlags();
  int layers = -1;
  std::vector<int> row_counts = {1, 8, 32};
  bool rows_given = false;
  if (WantsHelp(argc, argv)) {
    Usage(stdout);
    return 0;
  }
  for (int i = 1; i < argc; ++i) {
    long v = 0;
    const int taken = bench::TakeComputeFlag("coli bench kda", argc, argv, &i, &flags);
    if (taken < 0) return 2;
    if (taken > 0) {
      continue;
    } else if (!std::strcmp(argv[i], "--layers") && i + 1 < argc) {
      if (!bench::ParsePositive(argv[++i], 1024, &v)) {
        std::fprintf(stderr, "coli bench kda: --layers needs a positive integer\n");
        return 2;
      }
      layers = static_cast<int>(v);
    } else if (!std::strcmp(argv[i], "--rows") && i + 1 < argc) {
      if (!ParseRows(argv[++i], &row_counts)) {
        std::fprintf(stderr,
                     "coli bench kda: --rows needs positive row counts separated by commas, "
                     "e.g. 1,8,32 (got '%s')\n",
                     argv[i]);
        return 2;
      }
      rows_given = true;
    } else {
      std::fprintf(stderr, "coli bench kda: unknown argument '%s'\n", argv[i]);
      return Usage();
    }
  }
  const bool json = flags.json, quick = flags.quick, cpu_time = flags.cpu_time;
  const int threads = flags.threads;
  if (layers < 0) layers = quick ? 8 : kK3Layers;
  if (quick && !rows_given) row_counts = {1, 4};
  const int max_rows = *std::max_element(row_counts.begin(), row_counts.end());
  const int64_t state_floats = int64_t{kHeads} * kDim * kDim;
  const double state_bytes = static_cast<double>(state_floats) * sizeof(float);  // one layer
  const double all_state_bytes = state_bytes * layers;
  const size_t probe_bytes = quick ? size_t{256} << 20 : size_t{1} << 30;
  const int reps = quick ? 2 : 5;
  const double window_seconds = quick ? 0.03 : 0.25;
  const kernels::Isa isa = ops::KdaActiveIsa();

  std::fprintf(stderr,
               "[bench kda] isa %s, %d threads, %d layers of S [%d, %d, %d] (%.0f MB); measuring "
               "read bandwidth (%zu MiB)\n",
               kernels::IsaName(isa), threads, layers, kHeads, kDim, kDim, all_state_bytes / 1e6,
               probe_bytes >> 20);
  const bench::ReadBandwidth read_start =
      bench::MeasureReadBandwidth(probe_bytes, threads, 2 * reps, cpu_time);
  std::fprintf(stderr, "[bench kda] read bandwidth %.1f GB/s (best pass), %.1f sustained\n",
               read_start.best, read_start.mean);

  const Inputs in(max_rows);
  std::vector<int32_t> idx(max_rows);
  for (int r = 0; r < max_rows; ++r) idx[r] = r;

  // Both paths on copies of one layer's state, max_rows rows (from a non-zero state: one warm
  // chunk first): bit-identical states and read-outs, or the figures below mean nothing.
  bool identical = true;
  {
    std::vector<float> a(state_floats, 0.0f), oa(int64_t{max_rows} * kHeads * kDim);
    HeadsChunk(in, idx, max_rows, a.data(), 1, state_floats, oa.data(), threads);
    std::vector<float> b = a, ob(oa.size());
    RowwiseChunk(in, max_rows, a.data(), 1, state_floats, oa.data(), threads);
    HeadsChunk(in, idx, max_rows, b.data(), 1, state_floats, ob.data(), threads);
    identical = std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0 &&
                std::memcmp(oa.data(), ob.data(), oa.size() * sizeof(float)) == 0;
  }
  if (!identical) {
    std::fprintf(stderr,
                 "coli bench kda: the head-at-a-time sweep differs from the row-by-row "
                 "path (isa %s)\n",
                 kernels::IsaName(isa));
    return 1;
  }

  bench::AlignedBytes states(static_cast<size_t>(all_state_bytes));
  float* S = reinterpret_cast<float*>(states.data);
  {
    // First touch with the benchmark's threads (page placement), zero state.
    const int64_t total = state_floats * layers;
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t i = 0; i < total; ++i) S[i] = 0.0f;
  }
  std::vector<float> o(int64_t{max_rows} * kHeads * kDim);
  bench::ReadProbe probe(probe_bytes, threads, cpu_time);

  std::vector<Result> results;
  for (int n : row_counts) {
    double rowwise_tps = 0;
    for (const char* path : {"rowwise", "heads"}) {
      const bool heads = !std::strcmp(path, "heads");
      auto chunk = [&] {
        if (heads) {
          HeadsChunk(in, idx, n, S, layers, state_floats, o.data(), threads);
        } else {
          RowwiseChunk(in, n, S, layers, state_floats, o.data(), threads);
        }
      };
      chunk();  // warm: the state holds values, the code and inputs are in cache
      double best = 0;
      std::vector<double> paired;
      for (int rep = 0; rep < reps; ++rep) {
        const double probe_gbs = probe.Pass();
        int chunks = 0;
        const double t0 = bench::ClockSeconds(cpu_time);
        double elapsed = 0;
        while (chunks == 0 || elapsed < window_seconds) {
          chunk();
          ++chunks;
          elapsed = bench::ClockSeconds(cpu_time) - t0;
        }
        const double per_chunk = elapsed / chunks;
        const double bytes_per_chunk = heads ? 2 * all_state_bytes : 2 * all_state_bytes * n;
        paired.push_back(bytes_per_chunk / per_chunk / 1e9 / probe_gbs);
        if (rep == 0 || per_chunk < best) best = per_chunk;
      }
      Result r;
      r.path = path;
      r.rows = n;
      r.tokens_per_s = n / best;
      r.ms_per_token_k3 = 1e3 * best / n * kK3Layers / layers;
      r.ms_per_chunk_k3 = 1e3 * best * kK3Layers / layers;
      r.bytes_per_token = heads ? 2 * all_state_bytes / n : 2 * all_state_bytes;
      r.gbs = r.bytes_per_token * r.tokens_per_s / 1e9;
      r.bw_ratio_paired = Median(paired);
      if (!heads) rowwise_tps = r.tokens_per_s;
      r.speedup = r.tokens_per_s / rowwise_tps;
      r.bw_ratio = 0;  // set against the better probe below
      results.push_back(r);
      std::fprintf(stderr,
                   "[bench kda] %-7s rows %3d: %9.1f tokens/s, %8.2f ms/token (K3 69 layers), "
                   "%6.1f GB/s state (paired ratio %.2f), x%.2f\n",
                   path, n, r.tokens_per_s, r.ms_per_token_k3, r.gbs, r.bw_ratio_paired, r.speedup);
    }
  }

  const bench::ReadBandwidth read_end =
      bench::MeasureReadBandwidth(probe_bytes, threads, 2 * reps, cpu_time);
  const double read_bw = std::max(read_start.best, read_end.best);
  std::fprintf(stderr, "[bench kda] read bandwidth after: %.1f GB/s (best pass); ratios use %.1f\n",
               read_end.best, read_bw);
  for (Result& r : results) r.bw_ratio = r.gbs / read_bw;

  if (json) {
    std::printf(
        "{\"isa\": \"%s\", \"threads\": %d, \"heads\": %d, \"head_dim\": %d, \"layers\": %d, "
        "\"state_bytes\": %.0f, \"read_bw_gbs\": %.3f, \"read_bw_start_gbs\": %.3f, "
        "\"read_bw_end_gbs\": %.3f, \"identical\": %s, \"clock\": \"%s\", \"results\": [",
        kernels::IsaName(isa), threads, kHeads, kDim, layers, all_state_bytes, read_bw,
        read_start.best, read_end.best, identical ? "true" : "false", cpu_time ? "cpu" : "wall");
    for (size_t i = 0; i < results.size(); ++i) {
      const Result& r = results[i];
      std::printf(
          "%s{\"path\": \"%s\", \"rows\": %d, \"tokens_per_s\": %.3f, \"ms_per_token_k3\": %.4f, "
          "\"ms_per_chunk_k3\": %.4f, \"bytes_per_token\": %.0f, \"gbs\": %.3f, "
          "\"bw_ratio\": %.4f, \"bw_ratio_paired\": %.4f, \"speedup\": %.4f}",
          i ? ", " : "", r.path.c_str(), r.rows, r.tokens_per_s, r.ms_per_token_k3,
          r.ms_per_chunk_k3, r.bytes_per_token, r.gbs, r.bw_ratio, r.bw_ratio_paired, r.speedup);
    }
    std::printf("]}\n");
  } else {
    std::printf(
        "read bandwidth: %.1f GB/s best pass (%d threads, isa %s, %s); state %d layers x %.1f "
        "MB\n\n",
        read_bw, threads, kernels::IsaName(isa), cpu_time ? "CPU time" : "wall clock", layers,
        state_bytes / 1e6);
    std::printf(
        "| path    | rows | tokens/s | ms/token (K3) | ms/chunk (K3) | MB/token | GB/s  | "
        "bw_ratio | paired | speedup |\n");
    std::printf(
        "|---------|------|----------|---------------|---------------|----------|-------|"
        "----------|--------|---------|\n");
    for (const Result& r : results) {
      std::printf(
          "| %-7s | %4d | %8.1f | %13.2f | %13.2f | %8.1f | %5.1f | %8.2f | %6.2f | "
          "%7.2f |\n",
          r.path.c_str(), r.rows, r.tokens_per_s, r.ms_per_token_k3, r.ms_per_chunk_k3,
          r.bytes_per_token / 1e6, r.gbs, r.bw_ratio, r.bw_ratio_paired, r.speedup);
    }
  }
  return 0;
}

}  // namespace

COLI_REGISTER_BENCH(kda, "kda",
                    "KDA recurrence (K3 shapes) vs memory read bandwidth, row-by-row vs "
                    "head-at-a-time [--json] [--threads N] [--rows 1,8,32] [--layers L] [--quick] "
                    "[--cpu-time]",
                    RunBenchKda);

}  // namespace coli::cli
