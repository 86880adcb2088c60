// AVX2 + FMA kernels (matmul_avx2_kernels.inc with vpmaddubsw + vpmaddwd dots) and the AVX2
// activation preparation of the integer paths, which the AVX-VNNI level shares.
#define COLI_SIMD_TARGET "avx2,fma"
#define COLI_SIMD_VNNI 0
#define COLI_SIMD_KERNELS Avx2Kernels
#include "common/kernels/matmul_avx2_kernels.inc"

namespace coli::kernels::internal {
namespace {

COLI_AVX2_INLINE __m256i FirstN(int n) {  // int32 lanes i < n all ones
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

// One group of `n` (<= kMax, kMax = 32 or 64) activations: non-finite check, scale and int8 codes
// exactly as QuantizeActivationsInt8Groups (max|x| is exact in any order, the scale and its
// reciprocal are the same scalar IEEE divisions, the product is clamped in f32 and cvtps2dq rounds
// half to even like cvtss2si). Codes in natural order, 32 per ymm (missing columns give 0).
template <int kMax>
COLI_AVX2_INLINE bool QuantizeGroup(const float* x, int n, __m256i (&out)[kMax / 32],
                                    float* scale) {
  constexpr int kV = kMax / 8;
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
  const __m256i max_finite = _mm256_set1_epi32(0x7F7FFFFF);
  __m256 v[kV];
  __m256 m = _mm256_setzero_ps();
  __m256i bad = _mm256_setzero_si256();
  for (int k = 0; k < kV; ++k) {
    v[k] = n >= kMax ? _mm256_loadu_ps(x + 8 * k)
                     : _mm256_maskload_ps(x + 8 * k, FirstN(n - 8 * k));
    const __m256 a = _mm256_and_ps(v[k], abs_mask);
    bad = _mm256_or_si256(bad, _mm256_cmpgt_epi32(_mm256_castps_si256(a), max_finite));
    m = _mm256_max_ps(m, a);
  }
  if (!_mm256_testz_si256(bad, bad)) return false;
  __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
  m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
  m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
  float s = _mm_cvtss_f32(m4) / 127.f;
  if (s < 1e-20f) s = 1e-20f;
  const __m256 inv = _mm256_set1_ps(1.0f / s);
  const __m256 lo = _mm256_set1_ps(-127.f), hi = _mm256_set1_ps(127.f);
  __m256i q[kV];
  for (int k = 0; k < kV; ++k) {
    q[k] = _mm256_cvtps_epi32(_mm256_min_ps(_mm256_max_ps(_mm256_mul_ps(v[k], inv), lo), hi));
  }
  // packs keep 128-bit lanes apart: dword d of the packed bytes holds q[d % 4] lanes 4(d/4)..+3.
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  for (int h = 0; h < kMax / 32; ++h) {
    const __m256i a = _mm256_packs_epi32(q[4 * h], q[4 * h + 1]);
    const __m256i b = _mm256_packs_epi32(q[4 * h + 2], q[4 * h + 3]);
    out[h] = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(a, b), order);
  }
  *scale = s;
  return true;
}

// 32 codes in column order -> low 128 bits: the 16 even columns, high: the 16 odd ones.
COLI_AVX2_INLINE __m256i EvenOdd(__m256i v) {
  const __m256i ctl = _mm256_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15, 0, 2,
                                       4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15);
  return _mm256_permute4x64_epi64(_mm256_shuffle_epi8(v, ctl), 0xD8);
}

COLI_AVX2_INLINE void Store128(int8_t* dst, __m128i v) {
  _mm_storeu_si128(reinterpret_cast<__m128i*>(dst), v);
}

}  // namespace

COLI_AVX2 bool PrepareIdotRowAvx2(WeightFormat format, int64_t cols, const float* x,
                                  int64_t nblocks, int8_t* xq, int32_t* corr, float* xs,
                                  float* xg) {
  float s;
  if (format == WeightFormat::kMxfp4) {
    __m256i q[1];
    for (int64_t g = 0; g < cols / 32; ++g) {
      if (!QuantizeGroup<32>(x + 32 * g, 32, q, &s)) return false;
      int8_t* blk = xq + (g / 4) * 128;
      const int j = static_cast<int>(g % 4);
      const __m256i eo = EvenOdd(q[0]);
      Store128(blk + 16 * j, _mm256_castsi256_si128(eo));
      Store128(blk + 64 + 16 * j, _mm256_extracti128_si256(eo, 1));
      _mm_storeu_ps(xs + (g / 4) * 16 + 4 * j, _mm_set1_ps(0.5f * s));
      if (xg != nullptr) xg[g] = 0.5f * s;
    }
  } else if (format == WeightFormat::kInt4G64) {
    __m256i q[2];
    for (int64_t g = 0; g < cols / 64; ++g) {
      if (!QuantizeGroup<64>(x + 64 * g, 64, q, &s)) return false;
      int8_t* blk = xq + (g / 2) * 128;
      const int j = static_cast<int>(g % 2);
      const __m256i a = EvenOdd(q[0]), b = EvenOdd(q[1]);
      Store128(blk + 32 * j, _mm256_castsi256_si128(a));
      Store128(blk + 32 * j + 16, _mm256_castsi256_si128(b));
      Store128(blk + 64 + 32 * j, _mm256_extracti128_si256(a, 1));
      Store128(blk + 64 + 32 * j + 16, _mm256_extracti128_si256(b, 1));
      _mm256_storeu_ps(xs + (g / 2) * 16 + 8 * j, _mm256_set1_ps(s));
      if (xg != nullptr) xg[g] = s;
    }
  } else {  // int8: one (possibly short) group of 64 per block, natural order
    __m256i q[2];
    for (int64_t k = 0; k < nblocks; ++k) {
      const int n = static_cast<int>(std::min<int64_t>(64, cols - 64 * k));
      if (!QuantizeGroup<64>(x + 64 * k, n, q, &s)) return false;
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(xq + 64 * k), q[0]);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(xq + 64 * k + 32), q[1]);
      _mm256_storeu_ps(xs + 16 * k, _mm256_set1_ps(s));
      _mm256_storeu_ps(xs + 16 * k + 8, _mm256_set1_ps(s));
      if (xg != nullptr) xg[k] = s;
    }
  }
  // Corrections −bias·Σx per lane: vpmaddubsw with ones sums byte pairs exactly (|Σ| <= 4·127
  // for the two halves together), vpmaddwd with ones the pairs of a lane.
  const __m256i ones8 = _mm256_set1_epi8(1), ones16 = _mm256_set1_epi16(1);
  const int32_t bias = format == WeightFormat::kInt8Row ? -128
                       : format == WeightFormat::kMxfp4 ? -12
                                                        : -8;
  const __m256i biasv = _mm256_set1_epi32(bias);
  for (int64_t k = 0; k < nblocks; ++k) {
    for (int h = 0; h < 2; ++h) {
      __m256i s16;
      if (format == WeightFormat::kInt8Row) {
        s16 = _mm256_maddubs_epi16(ones8, Load256(xq + 64 * k + 32 * h));
      } else {
        s16 = _mm256_add_epi16(_mm256_maddubs_epi16(ones8, Load256(xq + 128 * k + 32 * h)),
                               _mm256_maddubs_epi16(ones8, Load256(xq + 128 * k + 64 + 32 * h)));
      }
      const __m256i sum = _mm256_madd_epi16(s16, ones16);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(corr + 16 * k + 8 * h),
                          _mm256_mullo_epi32(sum, biasv));
    }
  }
  return true;
}

}  // namespace coli::kernels::internal
