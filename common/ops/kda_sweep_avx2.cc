// The KDA per-head sweep on AVX2 (kda_sweep.h, kda_sweep_kernel.inc): 8 lanes; over several rows,
// column blocks of 16 (2 ymm each for k·S, e and o: 6 accumulators + temporaries in the 16
// registers); a single row (decode) takes blocks of 64 (8 ymm: some spill, but S is read in
// longer runs, measured faster than 32); a partial last vector masked (vmaskmov). Target attributes
// per function: the file builds without -march flags and runs only when the dispatcher saw AVX2 in
// cpuid.
#include <immintrin.h>

#include "common/ops/kda_sweep.h"

#define COLI_KDA_INLINE __attribute__((target("avx2"), always_inline)) inline

namespace coli::ops {
namespace {

struct V {
  using T = __m256;
  using Mask = __m256i;
  static constexpr int kLanes = 8;
  static COLI_KDA_INLINE T Zero() { return _mm256_setzero_ps(); }
  static COLI_KDA_INLINE T Set1(float f) { return _mm256_set1_ps(f); }
  static COLI_KDA_INLINE T Load(const float* p) { return _mm256_loadu_ps(p); }
  static COLI_KDA_INLINE T LoadMask(const float* p, Mask m) { return _mm256_maskload_ps(p, m); }
  static COLI_KDA_INLINE void Store(float* p, T x) { _mm256_storeu_ps(p, x); }
  static COLI_KDA_INLINE void StoreMask(float* p, T x, Mask m) { _mm256_maskstore_ps(p, m, x); }
  static COLI_KDA_INLINE T Add(T a, T b) { return _mm256_add_ps(a, b); }
  static COLI_KDA_INLINE T Sub(T a, T b) { return _mm256_sub_ps(a, b); }
  static COLI_KDA_INLINE T Mul(T a, T b) { return _mm256_mul_ps(a, b); }
  // Lanes i < n all ones.
  static COLI_KDA_INLINE Mask MakeMask(int n) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  }
};

constexpr int kDecodeVectors = 8;
constexpr int kBlockVectors = 2;

#include "common/ops/kda_sweep_kernel.inc"

}  // namespace

namespace internal {

__attribute__((target("avx2"))) void KdaHeadAvx2(const KdaHeadArgs& a) { SweepHead(a); }

}  // namespace internal
}  // namespace coli::ops
