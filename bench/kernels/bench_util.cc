#include "bench/kernels/bench_util.h"

#include <immintrin.h>
#include <omp.h>
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <random>

#include "common/memory/huge_pages.h"

namespace coli::bench {
namespace {

// xorshift64*: fast enough to fill gigabytes.
struct Rng {
  uint64_t s;
  uint64_t Next() {
    s ^= s >> 12;
    s ^= s << 25;
    s ^= s >> 27;
    return s * 0x2545F4914F6CDD1DULL;
  }
};

void FillRandom(uint8_t* p, size_t n, uint64_t seed) {
#pragma omp parallel
  {
    const size_t t = omp_get_thread_num(), nt = omp_get_num_threads();
    const size_t b = n * t / nt / 8 * 8, e = t + 1 == nt ? n : n * (t + 1) / nt / 8 * 8;
    Rng rng{seed * 0x9E3779B97F4A7C15ULL + t + 1};
    size_t i = b;
    for (; i + 8 <= e; i += 8) {
      const uint64_t v = rng.Next();
      std::memcpy(p + i, &v, 8);
    }
    for (; i < e; ++i) p[i] = static_cast<uint8_t>(rng.Next());
  }
}

// `prefetch`: also ask for the line 8 KiB ahead, as the GEMV kernels do (on some machines the
// hardware prefetchers alone do not reach the full read rate, so the probe takes the better).
__attribute__((target("avx512f"))) uint64_t ReadAvx512(const uint8_t* p, size_t n, bool prefetch) {
  __m512i a0 = _mm512_setzero_si512(), a1 = a0, a2 = a0, a3 = a0;
  size_t i = 0;
  for (; i + 256 <= n; i += 256) {
    if (prefetch) {
      _mm_prefetch(reinterpret_cast<const char*>(p + i + 8192), _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(p + i + 8192 + 64), _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(p + i + 8192 + 128), _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(p + i + 8192 + 192), _MM_HINT_T0);
    }
    a0 = _mm512_add_epi64(a0, _mm512_load_si512(p + i));
    a1 = _mm512_add_epi64(a1, _mm512_load_si512(p + i + 64));
    a2 = _mm512_add_epi64(a2, _mm512_load_si512(p + i + 128));
    a3 = _mm512_add_epi64(a3, _mm512_load_si512(p + i + 192));
  }
  const __m512i s = _mm512_add_epi64(_mm512_add_epi64(a0, a1), _mm512_add_epi64(a2, a3));
  uint64_t out[8];
  std::memcpy(out, &s, sizeof out);
  return out[0] + out[1] + out[2] + out[3] + out[4] + out[5] + out[6] + out[7];
}

__attribute__((target("avx2"))) uint64_t ReadAvx2(const uint8_t* p, size_t n) {
  __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
  size_t i = 0;
  for (; i + 128 <= n; i += 128) {
    a0 = _mm256_add_epi64(a0, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i)));
    a1 = _mm256_add_epi64(a1, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i + 32)));
    a2 = _mm256_add_epi64(a2, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i + 64)));
    a3 = _mm256_add_epi64(a3, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i + 96)));
  }
  const __m256i s = _mm256_add_epi64(_mm256_add_epi64(a0, a1), _mm256_add_epi64(a2, a3));
  uint64_t out[4];
  std::memcpy(out, &s, sizeof out);
  return out[0] + out[1] + out[2] + out[3];
}

// The slice read as kReadStreams parts side by side, 64 bytes of each in turn: on some machines
// (an Emerald Rapids Xeon: 27-28 vs 24 GB/s on 2 cores) a core pulls several streams faster than
// one, and the batch-1 kernels read that way (MatmulOptions::row_streams).
constexpr int kReadStreams = 8;
__attribute__((target("avx512f"))) uint64_t ReadAvx512Streams(const uint8_t* p, size_t n) {
  const size_t part = n / kReadStreams / 64 * 64;
  __m512i a[kReadStreams];
  for (__m512i& v : a) v = _mm512_setzero_si512();
  for (size_t i = 0; i < part; i += 64) {
    for (int s = 0; s < kReadStreams; ++s) {
      a[s] = _mm512_add_epi64(a[s], _mm512_load_si512(p + s * part + i));
    }
  }
  __m512i t = a[0];
  for (int s = 1; s < kReadStreams; ++s) t = _mm512_add_epi64(t, a[s]);
  uint64_t out[8];
  std::memcpy(out, &t, sizeof out);
  uint64_t sum = 0;
  for (uint64_t v : out) sum += v;
  return sum;
}

__attribute__((target("avx2"))) uint64_t ReadAvx2Streams(const uint8_t* p, size_t n) {
  const size_t part = n / kReadStreams / 64 * 64;
  __m256i a[kReadStreams];
  for (__m256i& v : a) v = _mm256_setzero_si256();
  for (size_t i = 0; i < part; i += 64) {
    for (int s = 0; s < kReadStreams; ++s) {
      const auto* q = reinterpret_cast<const __m256i*>(p + s * part + i);
      a[s] =
          _mm256_add_epi64(a[s], _mm256_add_epi64(_mm256_load_si256(q), _mm256_load_si256(q + 1)));
    }
  }
  __m256i t = a[0];
  for (int s = 1; s < kReadStreams; ++s) t = _mm256_add_epi64(t, a[s]);
  uint64_t out[4];
  std::memcpy(out, &t, sizeof out);
  return out[0] + out[1] + out[2] + out[3];
}

uint64_t ReadPlain(const uint8_t* p, size_t n) {
  uint64_t s = 0;
  for (size_t i = 0; i + 8 <= n; i += 8) {
    uint64_t v;
    std::memcpy(&v, p + i, 8);
    s += v;
  }
  return s;
}

}  // namespace

// Large blocks on huge pages where the system allows, as the engine keeps its weights: the probe
// and the kernels then read the same kind of memory.
AlignedBytes::AlignedBytes(size_t n) : size(n) {
  data = static_cast<uint8_t*>(memory::AllocateLarge(std::max<size_t>(64, n)));
  if (data == nullptr) throw std::bad_alloc();
}
AlignedBytes::~AlignedBytes() { memory::FreeLarge(data); }

BenchMatrices::BenchMatrices(kernels::WeightFormat format, int64_t rows, int64_t cols, int copies,
                             uint64_t seed) {
  using kernels::WeightFormat;
  const size_t n = static_cast<size_t>(rows) * static_cast<size_t>(cols);
  const kernels::MatrixBytes bytes = kernels::FormatBytes(format, rows, cols);
  const size_t data_bytes = bytes.data, scale_bytes = bytes.scales;
  for (int c = 0; c < copies; ++c) {
    auto data = std::make_unique<AlignedBytes>(data_bytes);
    auto scales = std::make_unique<AlignedBytes>(std::max<size_t>(scale_bytes, 1));
    if (c == 0) {
      FillRandom(data->data, data_bytes, seed);
      if (format == WeightFormat::kF32) {
        for (size_t i = 0; i < n; ++i) {
          uint32_t u;
          std::memcpy(&u, data->data + 4 * i, 4);
          const float f = static_cast<float>(static_cast<int32_t>(u >> 8) - (1 << 23)) * 1e-7f;
          std::memcpy(data->data + 4 * i, &f, 4);
        }
      } else if (format == WeightFormat::kInt8Row) {
        int8_t* q = reinterpret_cast<int8_t*>(data->data);
        for (size_t i = 0; i < n; ++i) q[i] = q[i] == -128 ? 127 : q[i];
        float* s = reinterpret_cast<float*>(scales->data);
        for (int64_t r = 0; r < rows; ++r) s[r] = 0.01f;
      } else if (format == WeightFormat::kInt4G64) {
        float* s = reinterpret_cast<float*>(scales->data);
        for (size_t g = 0; g < n / 64; ++g) s[g] = 0.01f + 1e-5f * static_cast<float>(g % 97);
      } else {
        for (size_t g = 0; g < scale_bytes; ++g)
          scales->data[g] = static_cast<uint8_t>(118 + g % 13);
      }
    } else {
      std::memcpy(data->data, blocks_[0]->data, data_bytes);
      std::memcpy(scales->data, blocks_[1]->data, scale_bytes);
    }
    views_.push_back(kernels::MatrixView{format, rows, cols, data->data,
                                         format == WeightFormat::kF32 ? nullptr : scales->data});
    blocks_.push_back(std::move(data));
    blocks_.push_back(std::move(scales));
  }
}

std::vector<float> RandomActivations(int64_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.f, 1.f);
  std::vector<float> x(n);
  for (float& v : x) v = normal(rng);
  return x;
}

namespace {

// How a pass reads its slice: one linear stream, the same with software prefetch (AVX-512), or
// kReadStreams streams side by side (SIMD ISAs).
enum class ReadVariant { kPlain, kPrefetch, kStreams };
constexpr int kReadVariants = 3;

// Seconds of one pass over `bytes` of `buf` with `threads` (contiguous slices per thread).
double TimedPass(const uint8_t* buf, size_t bytes, int threads, ReadVariant variant,
                 bool cpu_time) {
  const kernels::Isa isa = kernels::DetectedIsa();
  uint64_t total = 0;
  const auto t0 = std::chrono::steady_clock::now();
  timespec c0;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &c0);
#pragma omp parallel num_threads(threads) reduction(+ : total)
  {
    const size_t t = omp_get_thread_num(), nt = omp_get_num_threads();
    const size_t b = bytes * t / nt / 256 * 256, e = bytes * (t + 1) / nt / 256 * 256;
    const bool avx2 = isa == kernels::Isa::kAvx2 || isa == kernels::Isa::kAvxVnni;
    if (isa == kernels::Isa::kAvx512 && variant == ReadVariant::kStreams) {
      total += ReadAvx512Streams(buf + b, e - b);
    } else if (isa == kernels::Isa::kAvx512) {
      total += ReadAvx512(buf + b, e - b, variant == ReadVariant::kPrefetch);
    } else if (avx2 && variant == ReadVariant::kStreams) {
      total += ReadAvx2Streams(buf + b, e - b);
    } else if (avx2) {
      total += ReadAvx2(buf + b, e - b);
    } else {
      total += ReadPlain(buf + b, e - b);
    }
  }
  timespec c1;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &c1);
  static volatile uint64_t sink = 0;
  sink = sink + total;
  return cpu_time ? static_cast<double>(c1.tv_sec - c0.tv_sec) +
                        1e-9 * static_cast<double>(c1.tv_nsec - c0.tv_nsec)
                  : std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

double ClockSeconds(bool cpu_time) {
  if (!cpu_time) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
  }
  timespec t;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

ReadBandwidth MeasureReadBandwidth(size_t bytes, int threads, int reps, bool cpu_time) {
  bytes = bytes / 4096 * 4096;
  AlignedBytes buf(bytes);
  // Touch every page with the same threads (first-touch placement), random so nothing is zero-page.
  omp_set_num_threads(threads);
  FillRandom(buf.data, bytes, 42);
  double best = 0;
  double seconds[kReadVariants] = {0, 0, 0};  // per ReadVariant
  int passes[kReadVariants] = {0, 0, 0};
  for (int rep = 0; rep < reps; ++rep) {
    const int v = rep % kReadVariants;
    const double s = TimedPass(buf.data, bytes, threads, static_cast<ReadVariant>(v), cpu_time);
    best = std::max(best, static_cast<double>(bytes) / s / 1e9);
    seconds[v] += s;
    ++passes[v];
  }
  ReadBandwidth out;
  out.best = best;
  for (int v = 0; v < kReadVariants; ++v) {
    if (passes[v] > 0) {
      out.mean = std::max(out.mean, static_cast<double>(bytes) * passes[v] / seconds[v] / 1e9);
    }
  }
  return out;
}

ReadProbe::ReadProbe(size_t bytes, int threads, bool cpu_time)
    : buf_(bytes / 4096 * 4096), threads_(threads), cpu_time_(cpu_time) {
  omp_set_num_threads(threads);
  FillRandom(buf_.data, buf_.size, 43);
}

double ReadProbe::Pass() {
  // Every variant, as MeasureReadBandwidth alternates them, and the fastest.
  double fastest = 0;
  for (int v = 0; v < kReadVariants; ++v) {
    const double s =
        TimedPass(buf_.data, buf_.size, threads_, static_cast<ReadVariant>(v), cpu_time_);
    fastest = v == 0 ? s : std::min(fastest, s);
  }
  return static_cast<double>(buf_.size) / fastest / 1e9;
}

bool ParsePositive(const char* s, long max, long* out) {
  char* end = nullptr;
  const long v = std::strtol(s, &end, 10);
  if (end == s || *end != '\0' || v < 1 || v > max) return false;
  *out = v;
  return true;
}

ComputeFlags DefaultComputeFlags() {
  ComputeFlags flags;
  flags.threads = omp_get_max_threads();
  return flags;
}

int TakeComputeFlag(const char* command, int argc, char** argv, int* i, ComputeFlags* flags) {
  const char* arg = argv[*i];
  if (!std::strcmp(arg, "--json")) {
    flags->json = true;
  } else if (!std::strcmp(arg, "--quick")) {
    flags->quick = true;
  } else if (!std::strcmp(arg, "--cpu-time")) {
    flags->cpu_time = true;
  } else if (!std::strcmp(arg, "--threads") && *i + 1 < argc) {
    long v = 0;
    if (!ParsePositive(argv[*i + 1], 1024, &v)) {
      std::fprintf(stderr, "%s: --threads needs a positive integer (got '%s')\n", command,
                   argv[*i + 1]);
      return -1;
    }
    flags->threads = static_cast<int>(v);
    ++*i;
  } else {
    return 0;
  }
  return 1;
}

}  // namespace coli::bench
