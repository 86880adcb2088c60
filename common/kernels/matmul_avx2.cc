// AVX2 + FMA kernels. Each function carries its own target attribute, so this file builds
// without -march flags; the dispatcher only calls it when cpuid reports AVX2 and FMA.
//
// The 16 lanes of the scalar reference live in two ymm registers (lanes 0-7 and 8-15), so the
// order of every fma and of the final tree is the reference's (kernels.h, "Numerics") and the
// results are bit-identical to it. Integer dots use vpmaddubsw + vpmaddwd: unsigned biased
// weights (MXFP4 +12, int4 +8) times signed int8 activations never saturate the int16 pairs
// (2·24·127 and 2·15·127, and two blocks' pairs summed stay below 2^15); int8 weights use the
// sign trick |w| · sign(x, w) (2·127·127 < 2^15), so no bias correction is needed there.
#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "common/kernels/internal.h"

#define COLI_AVX2 __attribute__((target("avx2,fma")))
#define COLI_AVX2_INLINE __attribute__((target("avx2,fma"), always_inline)) inline

namespace coli::kernels::internal {
namespace {

// Software prefetch distance of the weight stream (as kRowPrefetchBytes in matmul_avx512.cc).
constexpr int64_t kPrefetchBytes = 8192;

struct V16 {
  __m256 lo, hi;
};

COLI_AVX2_INLINE V16 Zero16() { return V16{_mm256_setzero_ps(), _mm256_setzero_ps()}; }

COLI_AVX2_INLINE float Reduce16(V16 v) {
  const __m256 t8 = _mm256_add_ps(v.lo, v.hi);
  const __m128 t4 = _mm_add_ps(_mm256_castps256_ps128(t8), _mm256_extractf128_ps(t8, 1));
  const __m128 t2 = _mm_add_ps(t4, _mm_movehl_ps(t4, t4));
  const __m128 t1 = _mm_add_ss(t2, _mm_movehdup_ps(t2));
  return _mm_cvtss_f32(t1);
}

// Σ over 4 bytes of u8·s8 per int32 lane, plus the same for a second pair (int16 sums safe).
COLI_AVX2_INLINE __m256i Dot2(__m256i u0, __m256i s0, __m256i u1, __m256i s1) {
  const __m256i p = _mm256_add_epi16(_mm256_maddubs_epi16(u0, s0), _mm256_maddubs_epi16(u1, s1));
  return _mm256_madd_epi16(p, _mm256_set1_epi16(1));
}

COLI_AVX2_INLINE __m256i Load256(const void* p) {
  return _mm256_loadu_si256(static_cast<const __m256i*>(p));
}

// ------------------------------------------------------------ integer paths (MXFP4, int4)
// One 128-column block of a row: two 32-byte halves, each decoded to unsigned weights for the
// even (wl) and odd (wh) columns, with per-lane weight scales.
struct IntBlock {
  __m256i wl[2], wh[2];
  __m256 ws[2];
};

COLI_AVX2_INLINE void DecodeMxfp4(const uint8_t* packed, const uint8_t* s4, IntBlock& blk) {
  const __m256i tbl = _mm256_setr_epi8(12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0,
                                       12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0);
  const __m256i low4 = _mm256_set1_epi8(0x0F);
  int32_t s;
  std::memcpy(&s, s4, 4);
  const __m256i sv = _mm256_slli_epi32(_mm256_cvtepu8_epi32(_mm_cvtsi32_si128(s)), 23);
  for (int h = 0; h < 2; ++h) {
    const __m256i v = Load256(packed + 32 * h);
    blk.wl[h] = _mm256_shuffle_epi8(tbl, _mm256_and_si256(v, low4));
    blk.wh[h] = _mm256_shuffle_epi8(tbl, _mm256_and_si256(_mm256_srli_epi16(v, 4), low4));
    const __m256i pick =
        _mm256_setr_epi32(2 * h, 2 * h, 2 * h, 2 * h, 2 * h + 1, 2 * h + 1, 2 * h + 1, 2 * h + 1);
    blk.ws[h] = _mm256_castsi256_ps(_mm256_permutevar8x32_epi32(sv, pick));
  }
}

COLI_AVX2_INLINE void DecodeInt4(const uint8_t* packed, const float* s2, int halves,
                                 IntBlock& blk) {
  const __m256i low4 = _mm256_set1_epi8(0x0F);
  for (int h = 0; h < halves; ++h) {
    const __m256i v = Load256(packed + 32 * h);
    blk.wl[h] = _mm256_and_si256(v, low4);
    blk.wh[h] = _mm256_and_si256(_mm256_srli_epi16(v, 4), low4);
    blk.ws[h] = _mm256_set1_ps(s2[h]);
  }
}

// acc += cvt(corr + dots) · (ws · xs) for the halves present.
COLI_AVX2_INLINE void AccumulateBlock(const IntBlock& blk, int halves, const Prepared& p,
                                      int64_t off, V16& acc) {
  const int8_t* xq = p.xq + off * 128;
  for (int h = 0; h < halves; ++h) {
    const __m256i c = Load256(p.corr + off * 16 + 8 * h);
    const __m256 xs = _mm256_load_ps(p.xs + off * 16 + 8 * h);
    const __m256i d = _mm256_add_epi32(
        c, Dot2(blk.wl[h], Load256(xq + 32 * h), blk.wh[h], Load256(xq + 64 + 32 * h)));
    __m256& a = h == 0 ? acc.lo : acc.hi;
    a = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d), _mm256_mul_ps(blk.ws[h], xs), a);
  }
}

template <bool kMxfp4, int R, int B>
COLI_AVX2 void IntTile(const MatrixView& w, const Prepared& p, float* y, int64_t r0, int64_t b0) {
  const int64_t cols = w.cols;
  const int64_t groups = kMxfp4 ? cols / 32 : cols / 64;
  const int64_t per_block = kMxfp4 ? 4 : 2;
  const int64_t nfull = groups / per_block, rem = groups % per_block, nblk = nfull + (rem != 0);
  V16 acc[R][B];
  for (int i = 0; i < R; ++i)
    for (int b = 0; b < B; ++b) acc[i][b] = Zero16();
  for (int64_t k = 0; k < nblk; ++k) {
    IntBlock blk[R];
    int halves = 2;
    for (int i = 0; i < R; ++i) {
      const uint8_t* packed = static_cast<const uint8_t*>(w.data) + (r0 + i) * (cols / 2) + 64 * k;
      _mm_prefetch(reinterpret_cast<const char*>(packed) + kPrefetchBytes, _MM_HINT_T0);
      if (kMxfp4) {
        const uint8_t* s = static_cast<const uint8_t*>(w.scales) + (r0 + i) * groups + 4 * k;
        if (k < nfull) {
          DecodeMxfp4(packed, s, blk[i]);
        } else {  // short last block: copy what exists into zeroed buffers
          alignas(32) uint8_t pb[64] = {};
          uint8_t sb[4] = {};
          std::memcpy(pb, packed, 16 * rem);
          std::memcpy(sb, s, rem);
          DecodeMxfp4(pb, sb, blk[i]);
          halves = rem > 2 ? 2 : 1;
        }
      } else {
        const float* s = static_cast<const float*>(w.scales) + (r0 + i) * groups + 2 * k;
        halves = k < nfull ? 2 : 1;
        DecodeInt4(packed, s, halves, blk[i]);
      }
    }
    for (int b = 0; b < B; ++b) {
      const int64_t off = (b0 + b) * p.nblocks + k;
      for (int i = 0; i < R; ++i) AccumulateBlock(blk[i], halves, p, off, acc[i][b]);
    }
  }
  for (int i = 0; i < R; ++i)
    for (int b = 0; b < B; ++b) y[(b0 + b) * w.rows + r0 + i] = Reduce16(acc[i][b]);
}

template <int R, int B>
COLI_AVX2 void Int8IdotTile(const MatrixView& w, const Prepared& p, float* y, int64_t r0,
                            int64_t b0) {
  const int64_t cols = w.cols, nblk = p.nblocks, nfull = cols / 64;
  V16 acc[R][B];
  for (int i = 0; i < R; ++i)
    for (int b = 0; b < B; ++b) acc[i][b] = Zero16();
  for (int64_t k = 0; k < nblk; ++k) {
    __m256i wv[R][2];
    for (int i = 0; i < R; ++i) {
      const int8_t* src = static_cast<const int8_t*>(w.data) + (r0 + i) * cols + 64 * k;
      _mm_prefetch(reinterpret_cast<const char*>(src) + kPrefetchBytes, _MM_HINT_T0);
      alignas(32) int8_t tail[64] = {};
      if (k >= nfull) {
        std::memcpy(tail, src, cols - 64 * k);
        src = tail;
      }
      wv[i][0] = Load256(src);
      wv[i][1] = Load256(src + 32);
    }
    for (int b = 0; b < B; ++b) {
      const int64_t off = (b0 + b) * nblk + k;
      const __m256 xs = _mm256_set1_ps(p.xs[off * 16]);
      for (int h = 0; h < 2; ++h) {
        const __m256i x = Load256(p.xq + off * 64 + 32 * h);
        for (int i = 0; i < R; ++i) {
          const __m256i prod =
              _mm256_maddubs_epi16(_mm256_abs_epi8(wv[i][h]), _mm256_sign_epi8(x, wv[i][h]));
          const __m256i d = _mm256_madd_epi16(prod, _mm256_set1_epi16(1));
          __m256& a = h == 0 ? acc[i][b].lo : acc[i][b].hi;
          a = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d), xs, a);
        }
      }
    }
  }
  const float* s = static_cast<const float*>(w.scales);
  for (int i = 0; i < R; ++i)
    for (int b = 0; b < B; ++b) y[(b0 + b) * w.rows + r0 + i] = s[r0 + i] * Reduce16(acc[i][b]);
}

// ------------------------------------------------------------ float paths
template <WeightFormat F, int R, int B>
COLI_AVX2 void FloatTile(const MatrixView& w, const Prepared& p, float* y, int64_t r0, int64_t b0) {
  const int64_t cols = w.cols, nblk = (cols + 15) / 16;
  V16 acc[R][B];
  for (int i = 0; i < R; ++i)
    for (int b = 0; b < B; ++b) acc[i][b] = Zero16();
  const __m128i low4 = _mm_set1_epi8(0x0F);
  for (int64_t k = 0; k < nblk; ++k) {
    const int64_t n = std::min<int64_t>(16, cols - 16 * k);
    const __m256i iota = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    const __m256i m0 = _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(n)), iota);
    const __m256i m1 = _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(n) - 8), iota);
    V16 wv[R];
    for (int i = 0; i < R; ++i) {
      const int64_t r = r0 + i;
      if constexpr (F == WeightFormat::kF32) {
        const float* src = static_cast<const float*>(w.data) + r * cols + 16 * k;
        wv[i].lo = _mm256_maskload_ps(src, m0);
        wv[i].hi = _mm256_maskload_ps(src + 8, m1);
      } else if constexpr (F == WeightFormat::kInt8Row) {
        alignas(16) int8_t q[16] = {};
        std::memcpy(q, static_cast<const int8_t*>(w.data) + r * cols + 16 * k, n);
        const __m128i v = _mm_load_si128(reinterpret_cast<const __m128i*>(q));
        wv[i].lo = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v));
        wv[i].hi = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(v, 8)));
      } else {  // int4-g64
        const uint8_t* src = static_cast<const uint8_t*>(w.data) + r * (cols / 2) + 8 * k;
        const __m128i b16 =
            _mm_cvtepu8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(src)));
        const __m128i nat =
            _mm_or_si128(_mm_and_si128(b16, low4), _mm_slli_epi16(_mm_srli_epi16(b16, 4), 8));
        const __m256 s =
            _mm256_set1_ps(static_cast<const float*>(w.scales)[r * (cols / 64) + k / 4]);
        const __m256i eight = _mm256_set1_epi32(8);
        wv[i].lo = _mm256_mul_ps(
            _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_cvtepu8_epi32(nat), eight)), s);
        wv[i].hi = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(
                                     _mm256_cvtepu8_epi32(_mm_srli_si128(nat, 8)), eight)),
                                 s);
      }
    }
    for (int b = 0; b < B; ++b) {
      const float* x = p.xf + (b0 + b) * p.xf_stride + 16 * k;
      const __m256 x0 = _mm256_maskload_ps(x, m0), x1 = _mm256_maskload_ps(x + 8, m1);
      for (int i = 0; i < R; ++i) {
        acc[i][b].lo = _mm256_fmadd_ps(wv[i].lo, x0, acc[i][b].lo);
        acc[i][b].hi = _mm256_fmadd_ps(wv[i].hi, x1, acc[i][b].hi);
      }
    }
  }
  for (int i = 0; i < R; ++i) {
    const float s = F == WeightFormat::kInt8Row ? static_cast<const float*>(w.scales)[r0 + i] : 1.f;
    for (int b = 0; b < B; ++b) {
      const float v = Reduce16(acc[i][b]);
      y[(b0 + b) * w.rows + r0 + i] = F == WeightFormat::kInt8Row ? s * v : v;
    }
  }
}

template <int R, int B>
COLI_AVX2 void Mxfp4FloatTile(const MatrixView& w, const Prepared& p, float* y, int64_t r0,
                              int64_t b0) {
  const int64_t cols = w.cols, groups = cols / 32;
  const __m256 mag = _mm256_setr_ps(0.f, 0.5f, 1.f, 1.5f, 2.f, 3.f, 4.f, 6.f);
  const __m256i low4 = _mm256_set1_epi32(0x0F), bit3 = _mm256_set1_epi32(8);
  V16 ae[R][B], ao[R][B];
  for (int i = 0; i < R; ++i)
    for (int b = 0; b < B; ++b) ae[i][b] = ao[i][b] = Zero16();
  for (int64_t g = 0; g < groups; ++g) {
    V16 we[R], wo[R];
    for (int i = 0; i < R; ++i) {
      const uint8_t* src = static_cast<const uint8_t*>(w.data) + (r0 + i) * (cols / 2) + 16 * g;
      const uint8_t s = static_cast<const uint8_t*>(w.scales)[(r0 + i) * groups + g];
      const __m256 stab =
          _mm256_mul_ps(mag, _mm256_castsi256_ps(_mm256_set1_epi32(static_cast<int>(s) << 23)));
      // e2m1 value: magnitude from the low 3 bits (already scaled), sign from bit 3.
      __m256 out[4];
      for (int h = 0; h < 2; ++h) {
        const __m256i v =
            _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(src + 8 * h)));
        const __m256i codes[2] = {_mm256_and_si256(v, low4), _mm256_srli_epi32(v, 4)};
        for (int e = 0; e < 2; ++e) {
          const __m256 m = _mm256_permutevar8x32_ps(stab, codes[e]);
          const __m256i sign = _mm256_slli_epi32(_mm256_and_si256(codes[e], bit3), 28);
          out[2 * e + h] = _mm256_xor_ps(m, _mm256_castsi256_ps(sign));
        }
      }
      we[i] = V16{out[0], out[1]};
      wo[i] = V16{out[2], out[3]};
    }
    for (int b = 0; b < B; ++b) {
      const float* x = p.xf + (b0 + b) * cols + 32 * g;
      const __m256 xe0 = _mm256_load_ps(x), xe1 = _mm256_load_ps(x + 8);
      const __m256 xo0 = _mm256_load_ps(x + 16), xo1 = _mm256_load_ps(x + 24);
      for (int i = 0; i < R; ++i) {
        ae[i][b].lo = _mm256_fmadd_ps(we[i].lo, xe0, ae[i][b].lo);
        ae[i][b].hi = _mm256_fmadd_ps(we[i].hi, xe1, ae[i][b].hi);
        ao[i][b].lo = _mm256_fmadd_ps(wo[i].lo, xo0, ao[i][b].lo);
        ao[i][b].hi = _mm256_fmadd_ps(wo[i].hi, xo1, ao[i][b].hi);
      }
    }
  }
  for (int i = 0; i < R; ++i) {
    for (int b = 0; b < B; ++b) {
      const V16 sum{_mm256_add_ps(ae[i][b].lo, ao[i][b].lo),
                    _mm256_add_ps(ae[i][b].hi, ao[i][b].hi)};
      y[(b0 + b) * w.rows + r0 + i] = Reduce16(sum);
    }
  }
}

// ------------------------------------------------------------ driver
// One row at a time, with up to 4 batch rows per tile (16 ymm registers). For one activation row
// that reads the weights as a single linear stream (whole rows in order), which the memory system
// follows faster than two row streams (measured: ~0.3 -> ~0.6 of the read bandwidth together with
// the software prefetch).
template <void (*T1)(const MatrixView&, const Prepared&, float*, int64_t, int64_t),
          void (*B2)(const MatrixView&, const Prepared&, float*, int64_t, int64_t),
          void (*B3)(const MatrixView&, const Prepared&, float*, int64_t, int64_t),
          void (*B4)(const MatrixView&, const Prepared&, float*, int64_t, int64_t)>
COLI_AVX2 void Drive(const MatrixView& w, const Prepared& p, int64_t batch, float* y, int64_t rb,
                     int64_t re) {
  for (int64_t r = rb; r < re; ++r) {
    for (int64_t b0 = 0; b0 < batch; b0 += 4) {
      switch (std::min<int64_t>(4, batch - b0)) {
        case 1:
          T1(w, p, y, r, b0);
          break;
        case 2:
          B2(w, p, y, r, b0);
          break;
        case 3:
          B3(w, p, y, r, b0);
          break;
        default:
          B4(w, p, y, r, b0);
          break;
      }
    }
  }
}

#define COLI_AVX2_DRIVE(T) Drive<T<1, 1>, T<1, 2>, T<1, 3>, T<1, 4>>

template <int R, int B>
COLI_AVX2 void Mxfp4IdotTile(const MatrixView& w, const Prepared& p, float* y, int64_t r0,
                             int64_t b0) {
  IntTile<true, R, B>(w, p, y, r0, b0);
}
template <int R, int B>
COLI_AVX2 void Int4IdotTile(const MatrixView& w, const Prepared& p, float* y, int64_t r0,
                            int64_t b0) {
  IntTile<false, R, B>(w, p, y, r0, b0);
}
template <int R, int B>
COLI_AVX2 void F32Tile(const MatrixView& w, const Prepared& p, float* y, int64_t r0, int64_t b0) {
  FloatTile<WeightFormat::kF32, R, B>(w, p, y, r0, b0);
}
template <int R, int B>
COLI_AVX2 void Int8FloatTile(const MatrixView& w, const Prepared& p, float* y, int64_t r0,
                             int64_t b0) {
  FloatTile<WeightFormat::kInt8Row, R, B>(w, p, y, r0, b0);
}
template <int R, int B>
COLI_AVX2 void Int4FloatTile(const MatrixView& w, const Prepared& p, float* y, int64_t r0,
                             int64_t b0) {
  FloatTile<WeightFormat::kInt4G64, R, B>(w, p, y, r0, b0);
}

}  // namespace

const KernelSet& Avx2Kernels() {
  static const KernelSet set = {COLI_AVX2_DRIVE(F32Tile),       COLI_AVX2_DRIVE(Mxfp4FloatTile),
                                COLI_AVX2_DRIVE(Mxfp4IdotTile), COLI_AVX2_DRIVE(Int8FloatTile),
                                COLI_AVX2_DRIVE(Int8IdotTile),  COLI_AVX2_DRIVE(Int4FloatTile),
                                COLI_AVX2_DRIVE(Int4IdotTile)};
  return set;
}

}  // namespace coli::kernels::internal
