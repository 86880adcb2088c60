// Matmul entry: validation, ISA choice, activation preparation, and the OpenMP split over rows.
#include <cpuid.h>
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/kernels/internal.h"
#include "common/kernels/kernels.h"

namespace coli::kernels {
namespace {

using internal::Prepared;
using internal::Scratch;

// AVX-VNNI: cpuid leaf 7 subleaf 1, EAX bit 4 (read directly: clang 14's __builtin_cpu_supports
// has no name for it), on top of AVX2 + FMA (whose check covers the OS saving ymm state).
bool HasAvxVnniOnce() {
  __builtin_cpu_init();
  if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma")) return false;
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (__get_cpuid_count(7, 1, &eax, &ebx, &ecx, &edx) == 0) return false;
  return (eax >> 4) & 1u;
}

bool HasAvxVnni() {
  static const bool has = HasAvxVnniOnce();
  return has;
}

Isa DetectIsaOnce() {
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
      __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512vbmi") &&
      __builtin_cpu_supports("fma")) {
    return Isa::kAvx512;
  }
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
    return HasAvxVnni() ? Isa::kAvxVnni : Isa::kAvx2;
  }
  return Isa::kScalar;
}

bool IsIntel() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (__get_cpuid(0, &eax, &ebx, &ecx, &edx) == 0) return false;
  return ebx == 0x756e6547u && edx == 0x49656e69u && ecx == 0x6c65746eu;  // "GenuineIntel"
}

Isa ChooseIsaOnce() {
  return internal::ApplyIsaOverride(std::getenv("COLI_ISA"), DetectedIsa(), HasAvxVnni());
}

bool IsSimd(Isa isa) { return isa != Isa::kScalar; }

const internal::KernelSet& KernelsFor(Isa isa) {
  switch (isa) {
    case Isa::kAvx512:
      return internal::Avx512Kernels();
    case Isa::kAvxVnni:
      return internal::AvxVnniKernels();
    case Isa::kAvx2:
      return internal::Avx2Kernels();
    case Isa::kScalar:
      break;
  }
  return internal::ScalarKernels();
}

// Per-calling-thread scratch, so concurrent Matmul calls never share buffers.
struct Buffers {
  Scratch qx, qs, xq, corr, xs, xg, xf;
};

int ActGroup(WeightFormat f) { return f == WeightFormat::kMxfp4 ? internal::kMxfp4Group : 64; }

// Rearranges one batch row's quantized activations into the SIMD block layout (internal.h).
void BuildBlocks(WeightFormat f, int64_t cols, const int8_t* qx, const float* qs, int64_t nblocks,
                 int8_t* xq, int32_t* corr, float* xs) {
  for (int64_t k = 0; k < nblocks; ++k) {
    int8_t* bx = xq + k * (f == WeightFormat::kInt8Row ? 64 : 128);
    int32_t* bc = corr + k * 16;
    float* bs = xs + k * 16;
    if (f == WeightFormat::kMxfp4) {
      for (int j = 0; j < 4; ++j) {
        const int64_t g = 4 * k + j;
        if (g >= cols / 32) break;
        const int8_t* q = qx + g * 32;
        for (int t = 0; t < 16; ++t) {
          bx[16 * j + t] = q[2 * t];
          bx[64 + 16 * j + t] = q[2 * t + 1];
        }
        for (int i = 0; i < 4; ++i) {
          int32_t sum = 0;
          for (int c = 8 * i; c < 8 * i + 8; ++c) sum += q[c];
          bc[4 * j + i] = -12 * sum;
          bs[4 * j + i] = 0.5f * qs[g];
        }
      }
    } else if (f == WeightFormat::kInt4G64) {
      for (int j = 0; j < 2; ++j) {
        const int64_t g = 2 * k + j;
        if (g >= cols / 64) break;
        const int8_t* q = qx + g * 64;
        for (int t = 0; t < 32; ++t) {
          bx[32 * j + t] = q[2 * t];
          bx[64 + 32 * j + t] = q[2 * t + 1];
        }
        for (int i = 0; i < 8; ++i) {
          int32_t sum = 0;
          for (int c = 8 * i; c < 8 * i + 8; ++c) sum += q[c];
          bc[8 * j + i] = -8 * sum;
          bs[8 * j + i] = qs[g];
        }
      }
    } else {  // int8: natural order, one activation group per block
      const int64_t c0 = k * 64;
      const int64_t n = std::min<int64_t>(64, cols - c0);
      std::memcpy(bx, qx + c0, n);
      for (int l = 0; l < 16; ++l) {
        int32_t sum = 0;
        for (int64_t c = 4 * l; c < 4 * l + 4 && c < n; ++c) sum += qx[c0 + c];
        bc[l] = -128 * sum;
        bs[l] = qs[k];
      }
    }
  }
}

// The writable side of a call's Prepared: the buffers PrepareRow fills (null where unused).
struct Layout {
  int8_t* qx = nullptr;
  float* qs = nullptr;
  int8_t* xq = nullptr;
  int32_t* corr = nullptr;
  float* xs = nullptr;
  float* xg = nullptr;
  float* xf = nullptr;  // MXFP4 float: reordered activations
};

// Lays out the prepared-activation buffers of one call (internal.h, Prepared); PrepareRow writes
// the values, batch row by batch row.
Layout PrepareLayout(Isa isa, const MatrixView& w, const float* x, int64_t batch, bool idot,
                     Buffers& buf, Prepared* p) {
  const int64_t cols = w.cols;
  Layout l;
  p->x = x;
  p->xf = x;
  p->xf_stride = cols;
  p->idot = idot && w.format != WeightFormat::kF32;
  if (!p->idot) {
    if (w.format == WeightFormat::kMxfp4 && isa != Isa::kScalar) {
      l.xf = static_cast<float*>(buf.xf.Zeroed(batch * cols * sizeof(float)));
      p->xf = l.xf;
    }
    return l;
  }
  const int group = ActGroup(w.format);
  const int64_t groups = (cols + group - 1) / group;
  const int64_t block_cols = w.format == WeightFormat::kInt8Row ? 64 : 128;
  const int64_t nblocks = (cols + block_cols - 1) / block_cols;
  p->nblocks = nblocks;
  p->block_bytes = block_cols;
  // The scalar kernels read natural-order codes; the SIMD paths quantize straight into blocks
  // (the scalar quantizer only runs there to name a non-finite value).
  if (!IsSimd(isa)) {
    l.qx = static_cast<int8_t*>(buf.qx.Zeroed(batch * cols));
    l.qs = static_cast<float*>(buf.qs.Zeroed(batch * groups * sizeof(float)));
    p->qx = l.qx;
    p->qs = l.qs;
    p->qs_stride = groups;
  }
  if (IsSimd(isa)) {
    l.xq = static_cast<int8_t*>(buf.xq.Zeroed(batch * nblocks * block_cols));
    l.corr = static_cast<int32_t*>(buf.corr.Zeroed(batch * nblocks * 16 * sizeof(int32_t)));
    l.xs = static_cast<float*>(buf.xs.Zeroed(batch * nblocks * 16 * sizeof(float)));
    p->xq = l.xq;
    p->corr = l.corr;
    p->xs = l.xs;
  }
  if (IsSimd(isa)) {
    p->xg_stride = (groups + 15) / 16 * 16;
    l.xg = static_cast<float*>(buf.xg.Zeroed(batch * p->xg_stride * sizeof(float)));
    p->xg = l.xg;
  }
  return l;
}

// Prepares batch row b: writes only row b's part of the layout's buffers.
absl::Status PrepareRow(Isa isa, const MatrixView& w, const Prepared& p, const Layout& l,
                        int64_t b) {
  const int64_t cols = w.cols;
  const float* xb = p.x + b * cols;
  if (!p.idot) {
    if (l.xf != nullptr) {
      // MXFP4 float: even / odd columns of each 32-group side by side, as the decoded nibbles
      // come out.
      float* dst = l.xf + b * cols;
      for (int64_t g = 0; g < cols / 32; ++g) {
        for (int t = 0; t < 16; ++t) {
          dst[g * 32 + t] = xb[g * 32 + 2 * t];
          dst[g * 32 + 16 + t] = xb[g * 32 + 2 * t + 1];
        }
      }
    }
    return absl::OkStatus();
  }
  const int64_t nblocks = p.nblocks, block_cols = p.block_bytes;
  int8_t* xq = l.xq != nullptr ? l.xq + b * nblocks * block_cols : nullptr;
  int32_t* corr = l.corr != nullptr ? l.corr + b * nblocks * 16 : nullptr;
  float* xs = l.xs != nullptr ? l.xs + b * nblocks * 16 : nullptr;
  if (isa == Isa::kAvx512 && internal::PrepareIdotRowAvx512(w.format, cols, xb, nblocks, xq, corr,
                                                            xs, l.xg + b * p.xg_stride)) {
    return absl::OkStatus();
  }
  if ((isa == Isa::kAvx2 || isa == Isa::kAvxVnni) &&
      internal::PrepareIdotRowAvx2(w.format, cols, xb, nblocks, xq, corr, xs,
                                   l.xg != nullptr ? l.xg + b * p.xg_stride : nullptr)) {
    return absl::OkStatus();
  }
  // Scalar quantizer (also names the bad value when the AVX-512 one refused the row).
  const int group = ActGroup(w.format);
  const int64_t groups = (cols + group - 1) / group;
  std::vector<int8_t> tmp_q;
  std::vector<float> tmp_s;
  int8_t* qb = l.qx != nullptr ? l.qx + b * cols : nullptr;
  float* sb = l.qs != nullptr ? l.qs + b * groups : nullptr;
  if (qb == nullptr) {
    tmp_q.resize(cols);
    tmp_s.resize(groups);
    qb = tmp_q.data();
    sb = tmp_s.data();
  }
  if (absl::Status s =
          QuantizeActivationsInt8Groups(std::span<const float>(xb, cols), group, qb, sb);
      !s.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("activations, batch row ", b, ": ", s.message()));
  }
  if (xq != nullptr) BuildBlocks(w.format, cols, qb, sb, nblocks, xq, corr, xs);
  return absl::OkStatus();
}

// The rows of one call in chunks of whole 4-row tiles. Thread t owns a contiguous run of chunks
// and takes them in order from the front (one linear weight stream, as a static split); a thread
// that has finished its run takes chunks from the back of the others'. On a quiet machine that is
// the static split; on a shared one a thread the OS deschedules delays the call by at most the
// chunk it holds, instead of its whole half of the matrix.
class ChunkRun {
 public:
  void Init(int64_t begin, int64_t end) { run_.store(Pack(begin, end), std::memory_order_relaxed); }
  // Next chunk from the front (owner) or the back (others); false when the run is empty.
  bool Take(bool front, int64_t* chunk) {
    uint64_t v = run_.load(std::memory_order_relaxed);
    for (;;) {
      const int64_t b = static_cast<int64_t>(v & 0xFFFFFFFFu), e = static_cast<int64_t>(v >> 32);
      if (b >= e) return false;
      const uint64_t next = front ? Pack(b + 1, e) : Pack(b, e - 1);
      if (run_.compare_exchange_weak(v, next, std::memory_order_acq_rel)) {
        *chunk = front ? b : e - 1;
        return true;
      }
    }
  }

 private:
  static uint64_t Pack(int64_t b, int64_t e) {
    return static_cast<uint64_t>(b) | (static_cast<uint64_t>(e) << 32);
  }
  alignas(64) std::atomic<uint64_t> run_{0};
};

internal::KernelFn PickKernel(const internal::KernelSet& set, WeightFormat f, bool idot) {
  switch (f) {
    case WeightFormat::kF32:
      return set.f32;
    case WeightFormat::kInt8Row:
      return idot ? set.int8_idot : set.int8_float;
    case WeightFormat::kInt4G64:
      return idot ? set.int4_idot : set.int4_float;
    case WeightFormat::kMxfp4:
      return idot ? set.mxfp4_idot : set.mxfp4_float;
  }
  return nullptr;
}

}  // namespace

const char* IsaName(Isa isa) {
  switch (isa) {
    case Isa::kScalar:
      return "scalar";
    case Isa::kAvx2:
      return "avx2";
    case Isa::kAvxVnni:
      return "avxvnni";
    case Isa::kAvx512:
      return "avx512";
  }
  return "unknown";
}

Isa DetectedIsa() {
  static const Isa isa = DetectIsaOnce();
  return isa;
}

Isa ActiveIsa() {
  static const Isa isa = ChooseIsaOnce();
  return isa;
}

// Batch-1 row streams as measured (docs/status/issue-3.md): an Emerald Rapids core reads 4
// far-apart streams 16-28 % faster than one; on Zen 5, 2 streams beat 1 (AVX-512: int4 1.24-1.40x,
// int8 1.04-1.15x, MXFP4 expert shapes 1.12-1.14x, 0.97-1.06x on the large ones; the AVX2 and
// AVX-VNNI kernels 1.00-1.37x) and 4 lost to 2 (0.85x on int4 and MXFP4 expert shapes). On an
// AVX2-only Zen 3 the same: 2 vs 1 0.96-1.16x (under 1 only on MXFP4 4096x14336), 4 vs 2
// 0.87-1.02x (COLI_ROW_STREAMS tries another count).
int MeasuredRowStreams() { return ActiveIsa() == Isa::kAvx512 && IsIntel() ? 4 : 2; }

int DefaultRowStreams() {
  static const int streams =
      internal::ApplyRowStreamsOverride(std::getenv("COLI_ROW_STREAMS"), MeasuredRowStreams());
  return streams;
}

namespace internal {

bool IsaSupported(Isa isa) {
  switch (isa) {
    case Isa::kScalar:
      return true;
    case Isa::kAvx2:
      return static_cast<int>(DetectedIsa()) >= static_cast<int>(Isa::kAvx2);
    case Isa::kAvxVnni:
      return HasAvxVnni();
    case Isa::kAvx512:
      return DetectedIsa() == Isa::kAvx512;
  }
  return false;
}

Isa ApplyIsaOverride(const char* env, Isa detected) {
  return ApplyIsaOverride(env, detected,
                          static_cast<int>(detected) >= static_cast<int>(Isa::kAvxVnni));
}

Isa ApplyIsaOverride(const char* env, Isa detected, bool avxvnni) {
  if (env == nullptr || *env == '\0') return detected;
  Isa want;
  if (std::strcmp(env, "scalar") == 0) {
    want = Isa::kScalar;
  } else if (std::strcmp(env, "avx2") == 0) {
    want = Isa::kAvx2;
  } else if (std::strcmp(env, "avxvnni") == 0) {
    want = Isa::kAvxVnni;
  } else if (std::strcmp(env, "avx512") == 0) {
    want = Isa::kAvx512;
  } else {
    std::fprintf(stderr, "[kernels] COLI_ISA='%s' is not scalar|avx2|avxvnni|avx512; using %s\n",
                 env, IsaName(detected));
    return detected;
  }
  if (static_cast<int>(want) > static_cast<int>(detected)) {
    std::fprintf(stderr, "[kernels] COLI_ISA=%s: this CPU only has %s; using %s\n", env,
                 IsaName(detected), IsaName(detected));
    return detected;
  }
  if (want == Isa::kAvxVnni && !avxvnni) {
    std::fprintf(stderr, "[kernels] COLI_ISA=avxvnni: this CPU has no AVX-VNNI; using avx2\n");
    return Isa::kAvx2;
  }
  return want;
}

int ApplyRowStreamsOverride(const char* env, int measured) {
  if (env == nullptr || *env == '\0') return measured;
  if (std::strcmp(env, "1") == 0 || std::strcmp(env, "2") == 0 || std::strcmp(env, "4") == 0) {
    return env[0] - '0';
  }
  std::fprintf(stderr, "[kernels] COLI_ROW_STREAMS='%s' is not 1, 2 or 4; using %d\n", env,
               measured);
  return measured;
}

absl::Status MatmulWithIsa(Isa isa, const MatrixView& w, const float* x, int64_t batch, float* y,
                           const MatmulOptions& options) {
  if (!IsaSupported(isa)) {
    return absl::FailedPreconditionError(
        absl::StrCat("kernels: this CPU has no ", IsaName(isa), " support"));
  }
  if (absl::Status s = ValidateView(w); !s.ok()) return s;
  if (batch < 0) return absl::InvalidArgumentError(absl::StrCat("matmul: batch ", batch, " < 0"));
  if (options.threads < 0) {
    return absl::InvalidArgumentError(absl::StrCat("matmul: threads ", options.threads, " < 0"));
  }
  if (options.row_streams != 0 && options.row_streams != 1 && options.row_streams != 2 &&
      options.row_streams != 4) {
    return absl::InvalidArgumentError(
        absl::StrCat("matmul: row_streams ", options.row_streams, " is not 0, 1, 2 or 4"));
  }
  const int row_streams = options.row_streams > 0 ? options.row_streams : DefaultRowStreams();
  if (batch == 0 || w.rows == 0) return absl::OkStatus();
  if (x == nullptr || y == nullptr) {
    return absl::InvalidArgumentError("matmul: activation or output pointer is null");
  }
  const int threads = options.threads > 0 ? options.threads : omp_get_max_threads();
  const KernelFn fn = PickKernel(KernelsFor(isa), w.format, options.idot);
  const int64_t tiles = (w.rows + 3) / 4;
  const int nt = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(threads, tiles)));
  // Every computing thread prepares the activations (all batch rows) into its own buffers. That
  // costs no time for one activation row (one thread would prepare it while the others wait) and
  // little for a batch (~1.5 us per row of 7168 columns on AVX-512, ~15 us on AVX2, against the
  // matmul's milliseconds), and leaves no barrier inside the call: on a shared machine a barrier
  // waits a whole scheduler slice for a thread the OS has descheduled.
  const auto prepare = [&](Prepared* prepared) -> absl::Status {
    thread_local Buffers buffers;
    const Layout layout = PrepareLayout(isa, w, x, batch, options.idot, buffers, prepared);
    prepared->row_streams = row_streams;
    for (int64_t b = 0; b < batch; ++b) {
      if (absl::Status s = PrepareRow(isa, w, *prepared, layout, b); !s.ok()) return s;
    }
    return absl::OkStatus();
  };
  if (nt == 1) {
    Prepared prepared;
    if (absl::Status s = prepare(&prepared); !s.ok()) return s;
    fn(w, prepared, batch, y, 0, w.rows);
    return absl::OkStatus();
  }
  // Runs are set up for nt threads before the region: if OpenMP gives fewer (nested call), the
  // others' runs are taken by stealing.
  const int64_t chunk_tiles = std::max<int64_t>(1, tiles / (8 * nt));
  const int64_t chunks = (tiles + chunk_tiles - 1) / chunk_tiles;  // about 8·nt: fits ChunkRun
  std::unique_ptr<ChunkRun[]> runs(new ChunkRun[nt]);
  for (int t = 0; t < nt; ++t) runs[t].Init(chunks * t / nt, chunks * (t + 1) / nt);
  absl::Status bad;
#pragma omp parallel num_threads(nt)
  {
    const int t = omp_get_thread_num();
    Prepared prepared;
    // Every thread meets the same first bad row; thread 0 reports it.
    if (absl::Status s = prepare(&prepared); !s.ok()) {
      if (t == 0) bad = std::move(s);
    } else {
      int64_t c;
      for (int i = 0; i < nt; ++i) {
        ChunkRun& run = runs[(t + i) % nt];
        while (run.Take(i == 0, &c)) {
          fn(w, prepared, batch, y, std::min(w.rows, c * chunk_tiles * 4),
             std::min(w.rows, (c + 1) * chunk_tiles * 4));
        }
      }
    }
  }
  return bad;
}

}  // namespace internal

absl::Status Matmul(const MatrixView& w, const float* x, int64_t batch, float* y,
                    const MatmulOptions& options) {
  return internal::MatmulWithIsa(ActiveIsa(), w, x, batch, y, options);
}

}  // namespace coli::kernels
