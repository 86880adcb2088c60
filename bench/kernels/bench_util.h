// Shared set-up of the kernel benchmarks (`coli bench kernels` and kernels_benchmark): random
// weight matrices in every format, and this machine's streaming memory read bandwidth.
#ifndef COLI_BENCH_KERNELS_BENCH_UTIL_H_
#define COLI_BENCH_KERNELS_BENCH_UTIL_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "common/kernels/kernels.h"

namespace coli::bench {

// A 64-byte aligned heap block (weights are streamed; alignment keeps loads on cache lines); 2 MiB
// aligned on huge pages where the system allows when it is that large (common/memory).
struct AlignedBytes {
  explicit AlignedBytes(size_t n);
  ~AlignedBytes();
  AlignedBytes(const AlignedBytes&) = delete;
  AlignedBytes& operator=(const AlignedBytes&) = delete;
  uint8_t* data = nullptr;
  size_t size = 0;
};

// `copies` independent random matrices of one format and shape (values drawn like real weights:
// MXFP4 exponents 118..130, int8 codes in ±127, int4 scales ~0.01), so a benchmark can rotate
// through more bytes than the caches hold.
class BenchMatrices {
 public:
  BenchMatrices(kernels::WeightFormat format, int64_t rows, int64_t cols, int copies,
                uint64_t seed);
  int copies() const { return static_cast<int>(views_.size()); }
  const kernels::MatrixView& view(int i) const { return views_[i]; }
  size_t bytes_per_copy() const { return kernels::ViewBytes(views_[0]); }

 private:
  std::vector<std::unique_ptr<AlignedBytes>> blocks_;
  std::vector<kernels::MatrixView> views_;
};

// Random activations N(0, 1).
std::vector<float> RandomActivations(int64_t n, uint64_t seed);

// Streaming read bandwidth in GB/s (1e9 bytes/s): `bytes` (>= 1 GiB for the report) read with
// `threads` OpenMP threads over contiguous slices, `reps` passes taking turns over three ways of
// reading a slice: one stream, one stream with software prefetch (AVX-512), 8 streams side by
// side (AVX2 / AVX-512); timed with the process CPU clock instead of the wall clock when
// `cpu_time` (single-thread use on a shared machine). `best` is the fastest pass (the STREAM
// convention); `mean` is bytes over time of all passes of the best variant, the sustained rate.
struct ReadBandwidth {
  double best = 0, mean = 0;
};
ReadBandwidth MeasureReadBandwidth(size_t bytes, int threads, int reps, bool cpu_time = false);

// Seconds on the wall clock (steady), or of this process's CPU time when `cpu_time` (for single-
// thread figures on a shared machine); only differences of two readings mean anything.
double ClockSeconds(bool cpu_time);

// A positive integer in [1, max] from `s` (the whole string); false on anything else.
bool ParsePositive(const char* s, long max, long* out);

// The flags every compute benchmark takes (`coli bench kernels`, `coli bench kda`): --json,
// --quick, --cpu-time and --threads N (1…1024; default: OpenMP's thread count).
struct ComputeFlags {
  bool json = false, quick = false, cpu_time = false;
  int threads = 1;
};
ComputeFlags DefaultComputeFlags();
// Takes argv[*i] (and the value after it) when it is one of those flags: 1 taken (*i moved past
// it), 0 not one of them (nothing moved), -1 a bad value (an error naming `command` printed).
int TakeComputeFlag(const char* command, int argc, char** argv, int* i, ComputeFlags* flags);

// One probe pass at a time over a buffer kept between passes, to time the read rate right next to
// a kernel's window (paired ratios: on a shared host the bandwidth can halve within a minute, so a
// kernel and a probe measured seconds apart disagree by more than the kernel's own gap).
class ReadProbe {
 public:
  ReadProbe(size_t bytes, int threads, bool cpu_time);
  // GB/s of the faster of two passes over the whole buffer: without and with software prefetch
  // (AVX-512; the same loop twice elsewhere), as MeasureReadBandwidth's two variants.
  double Pass();

 private:
  AlignedBytes buf_;
  int threads_;
  bool cpu_time_;
};

}  // namespace coli::bench

#endif  // COLI_BENCH_KERNELS_BENCH_UTIL_H_
