// The KDA per-head sweep on AVX-512 (kda_sweep.h, kda_sweep_kernel.inc): 16 lanes; over several
// rows, column blocks of 64 (4 zmm each for k·S, e and o: 12 accumulators + temporaries in the
// 32 registers; the block's S, 32 KB at d = 128, stays in L1); a single row (decode) takes whole
// rows of 128 (8 zmm each for k·S, then e and o); a partial last block masked. Block widths
// measured with `coli bench kda --threads 1 --cpu-time` (docs/status/kda.md). Target attributes per
// function: the file builds without -march flags and runs only when the dispatcher saw AVX-512 in
// cpuid.
#include <immintrin.h>

#include "common/ops/kda_sweep.h"

#define COLI_KDA_INLINE __attribute__((target("avx512f"), always_inline)) inline

namespace coli::ops {
namespace {

struct V {
  using T = __m512;
  using Mask = __mmask16;
  static constexpr int kLanes = 16;
  static COLI_KDA_INLINE T Zero() { return _mm512_setzero_ps(); }
  static COLI_KDA_INLINE T Set1(float f) { return _mm512_set1_ps(f); }
  static COLI_KDA_INLINE T Load(const float* p) { return _mm512_loadu_ps(p); }
  static COLI_KDA_INLINE T LoadMask(const float* p, Mask m) { return _mm512_maskz_loadu_ps(m, p); }
  static COLI_KDA_INLINE void Store(float* p, T x) { _mm512_storeu_ps(p, x); }
  static COLI_KDA_INLINE void StoreMask(float* p, T x, Mask m) { _mm512_mask_storeu_ps(p, m, x); }
  static COLI_KDA_INLINE T Add(T a, T b) { return _mm512_add_ps(a, b); }
  static COLI_KDA_INLINE T Sub(T a, T b) { return _mm512_sub_ps(a, b); }
  static COLI_KDA_INLINE T Mul(T a, T b) { return _mm512_mul_ps(a, b); }
  static COLI_KDA_INLINE Mask MakeMask(int n) {
    return n >= 16 ? Mask(0xFFFF) : Mask((1u << n) - 1u);
  }
};

constexpr int kDecodeVectors = 8;
constexpr int kBlockVectors = 4;

#include "common/ops/kda_sweep_kernel.inc"

}  // namespace

namespace internal {

__attribute__((target("avx512f"))) void KdaHeadAvx512(const KdaHeadArgs& a) { SweepHead(a); }

}  // namespace internal
}  // namespace coli::ops
