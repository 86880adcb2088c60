// common/kernels internals: the prepared-activation layouts shared by the scalar reference and
// the SIMD paths, the per-ISA kernel entry points, and the test hook that forces one ISA.
// Not part of the public interface.
#ifndef COLI_COMMON_KERNELS_INTERNAL_H_
#define COLI_COMMON_KERNELS_INTERNAL_H_

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "common/kernels/kernels.h"

namespace coli::kernels::internal {

// A 64-byte aligned, zero-filled scratch buffer.
class Scratch {
 public:
  Scratch() = default;
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  ~Scratch() { std::free(p_); }
  // Grows to at least `bytes` and zero-fills the first `bytes`.
  void* Zeroed(size_t bytes) {
    if (bytes > cap_) {
      std::free(p_);
      cap_ = (bytes + 63) / 64 * 64;
      p_ = std::aligned_alloc(64, cap_);
    }
    if (bytes != 0) std::memset(p_, 0, bytes);
    return p_;
  }

 private:
  void* p_ = nullptr;
  size_t cap_ = 0;
};

// Columns per 16-lane block of each path (see kernels.h for the lane mapping).
inline constexpr int kMxfp4IdotBlock = 128;  // 4 groups of 32
inline constexpr int kInt4IdotBlock = 128;   // 2 groups of 64
inline constexpr int kInt8IdotBlock = 64;    // 1 activation group
inline constexpr int kMxfp4Group = 32;
inline constexpr int kInt4Group = 64;
inline constexpr int kInt8ActGroup = 64;

// Activations prepared once per call (shared by all rows, all threads).
//
// Integer paths, per batch row b and block k (nblocks per row, the last one zero-padded):
//   xq    + (b*nblocks + k)*bytes_per_block: int8 activations in kernel order
//           MXFP4: [group j even columns 2t (16 each) for j<4] then [odd columns], 128 bytes
//           int4:  [group j even columns (32 each) for j<2] then [odd columns], 128 bytes
//           int8:  64 columns in natural order, 64 bytes
//   corr  + (b*nblocks + k)*16: int32 per lane, −bias·Σx over the lane's columns, where the SIMD
//           paths read biased unsigned weights (MXFP4 +12, int4 +8, int8 +128 (AVX-512 only)).
//   xs    + (b*nblocks + k)*16: f32 activation scale of the lane's group (MXFP4: ·0.5).
//   qx / qs: the same quantized activations in natural order and per-group scales (scalar path).
//   xg    + b*xg_stride: f32 activation scale per group in natural order (MXFP4: ·0.5), zero-padded
//           to a multiple of 16 groups (AVX-512 only: its batch-1 kernels multiply 16 weight scales
//           by 16 activation scales at once instead of one block's lanes at a time).
// Float paths:
//   xf    + b*xf_stride: f32 activations; MXFP4 float: per group [16 even cols][16 odd cols].
struct Prepared {
  const float* x = nullptr;  // the caller's activations [batch, cols]
  bool idot = false;         // integer paths (quantized activations) vs float paths
  int64_t nblocks = 0;
  int64_t block_bytes = 0;
  const int8_t* xq = nullptr;
  const int32_t* corr = nullptr;
  const float* xs = nullptr;
  const float* xg = nullptr;
  int64_t xg_stride = 0;
  const int8_t* qx = nullptr;  // [batch, cols]
  const float* qs = nullptr;   // [batch, groups]
  int64_t qs_stride = 0;       // groups per batch row
  const float* xf = nullptr;
  int64_t xf_stride = 0;
  int row_streams = 1;  // batch 1: rows read side by side (MatmulOptions::row_streams, resolved)
};

// One kernel computes rows [row_begin, row_end) of y for every batch row.
using KernelFn = void (*)(const MatrixView& w, const Prepared& p, int64_t batch, float* y,
                          int64_t row_begin, int64_t row_end);

struct KernelSet {
  KernelFn f32 = nullptr;
  KernelFn mxfp4_float = nullptr;
  KernelFn mxfp4_idot = nullptr;
  KernelFn int8_float = nullptr;
  KernelFn int8_idot = nullptr;
  KernelFn int4_float = nullptr;
  KernelFn int4_idot = nullptr;
};

const KernelSet& ScalarKernels();
const KernelSet& Avx2Kernels();
const KernelSet& AvxVnniKernels();
const KernelSet& Avx512Kernels();

// Whether this CPU (and OS) can run `isa`'s kernels. The levels nest except AVX-VNNI: a CPU with
// the AVX-512 set may lack the VEX-encoded vpdpbusd (Ice Lake, Skylake-X).
bool IsaSupported(Isa isa);

// AVX-512 preparation of one batch row for the integer paths, straight into the block layout
// (xq, corr, xs, xg as in Prepared; buffers zeroed beforehand). Same values as the scalar
// quantizer plus BuildBlocks. False when the row holds a non-finite value.
bool PrepareIdotRowAvx512(WeightFormat format, int64_t cols, const float* x, int64_t nblocks,
                          int8_t* xq, int32_t* corr, float* xs, float* xg);

// AVX2 preparation of one batch row for the integer paths (AVX2 and AVX-VNNI levels), as
// PrepareIdotRowAvx512; xg may be null.
bool PrepareIdotRowAvx2(WeightFormat format, int64_t cols, const float* x, int64_t nblocks,
                        int8_t* xq, int32_t* corr, float* xs, float* xg);

// COLI_ISA handling: `env` (may be null) lowers `detected` to scalar|avx2|avxvnni|avx512; an
// unknown value or one above `detected` is ignored with a warning on stderr. `avxvnni`: whether
// the CPU has AVX-VNNI (avxvnni asked for without it gives avx2, with a warning); the two-argument
// form assumes it exactly when detected is avxvnni or above.
Isa ApplyIsaOverride(const char* env, Isa detected, bool avxvnni);
Isa ApplyIsaOverride(const char* env, Isa detected);

// COLI_ROW_STREAMS handling: `env` (may be null) "1", "2" or "4" replaces `measured` (this CPU's
// default); any other value is ignored with a warning on stderr.
int ApplyRowStreamsOverride(const char* env, int measured);

// Matmul with an explicit ISA (tests force each path with it). FAILED_PRECONDITION when the CPU
// lacks `isa`.
absl::Status MatmulWithIsa(Isa isa, const MatrixView& w, const float* x, int64_t batch, float* y,
                           const MatmulOptions& options);

// The fixed 16-lane reduction tree: (l, l+8), then (l, l+4), (l, l+2), (l, l+1).
inline float ReduceLanes16(const float* a) {
  float t8[8], t4[4], t2[2];
  for (int l = 0; l < 8; ++l) t8[l] = a[l] + a[l + 8];
  for (int l = 0; l < 4; ++l) t4[l] = t8[l] + t8[l + 4];
  for (int l = 0; l < 2; ++l) t2[l] = t4[l] + t4[l + 2];
  return t2[0] + t2[1];
}

// Doubled e2m1 values (exact int8) and the same biased by +12 (unsigned operand of the SIMD dots).
inline constexpr int8_t kE2m1Doubled[16] = {0, 1,  2,  3,  4,  6,  8,  12,
                                            0, -1, -2, -3, -4, -6, -8, -12};
inline constexpr float kE2m1[16] = {0.f,  0.5f,  1.f,  1.5f,  2.f,  3.f,  4.f,  6.f,
                                    -0.f, -0.5f, -1.f, -1.5f, -2.f, -3.f, -4.f, -6.f};

inline float E8m0(uint8_t s) {
  uint32_t bits = static_cast<uint32_t>(s) << 23;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

}  // namespace coli::kernels::internal

#endif  // COLI_COMMON_KERNELS_INTERNAL_H_
