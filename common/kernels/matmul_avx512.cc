// AVX-512 (F, BW, VL, DQ, VNNI, VBMI) kernels. Each function carries its own target attribute, so
// this file builds without -march flags; the dispatcher only calls it when cpuid reports the
// features.
//
// Every kernel reproduces the scalar reference's 16-lane order exactly (kernels.h, "Numerics"):
// one zmm accumulator per (row, batch row) holds the 16 lanes; the integer paths add a block's
// exact int32 partial dots (vpdpbusd on biased unsigned weights, the bias removed by the
// activation-side correction that starts the accumulation) and scale them with one fma.
//
// Tiling: a tile is R weight rows x B batch rows; a weight block is loaded and decoded once per
// tile and used for all B batch rows, so weights stream from memory once per row tile while the
// activations (small) stay in cache.
#include <immintrin.h>

#include <algorithm>
#include <type_traits>

#include "common/kernels/internal.h"

#define COLI_AVX512 \
  __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx512vbmi,fma")))

namespace coli::kernels::internal {
namespace {

// The fixed tree of ReduceLanes16: (l, l+8), (l, l+4), (l, l+2), (l, l+1).
COLI_AVX512 inline float Reduce16(__m512 v) {
  const __m256 t8 = _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1));
  const __m128 t4 = _mm_add_ps(_mm256_castps256_ps128(t8), _mm256_extractf128_ps(t8, 1));
  const __m128 t2 = _mm_add_ps(t4, _mm_movehl_ps(t4, t4));
  const __m128 t1 = _mm_add_ss(t2, _mm_movehdup_ps(t2));
  return _mm_cvtss_f32(t1);
}

// How far ahead of the loads the weight streams are prefetched (several row streams run at once,
// more than the hardware prefetchers follow at full rate).
constexpr int64_t kPrefetchBytes = 2048;

// Batch 1 streams the weights as linear reads of whole rows in order; prefetching this far ahead
// of the loads keeps enough misses in flight to run at the read bandwidth (measured on Zen 5:
// 2 KiB reached ~0.62 of it, 8 KiB ~0.8–0.95; 4–16 KiB were alike).
constexpr int64_t kRowPrefetchBytes = 8192;

// With S row streams side by side each stream is prefetched kRowPrefetchBytes / S ahead: the bytes
// a thread has in flight ahead of its loads stay at kRowPrefetchBytes, however many streams. At
// the full distance 4 streams hold 32 KiB ahead, most of an Emerald Rapids core's 48 KiB L1, and
// lines were evicted before use: the 1/S distance ran 1.1–1.2× faster there at 4 streams (every
// format), 1.2× at 2; at one stream the distance is unchanged.
template <int S>
constexpr int64_t kRowPrefetchAhead = kRowPrefetchBytes / S;

COLI_AVX512 inline __mmask64 ByteMask(int64_t n) {
  return n >= 64 ? ~__mmask64{0} : ((__mmask64{1} << n) - 1);
}
COLI_AVX512 inline __mmask16 LaneMask(int64_t n) {
  return n >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << n) - 1);
}

// The per-batch-row half of an integer block: exact int32 partial dots started from the
// activation-side correction, then one fma per lane with the combined scale.
template <int R, int B>
COLI_AVX512 __attribute__((always_inline)) inline void DotTwoHalves(
    const Prepared& p, int64_t b0, int64_t k, const __m512i (&wl)[R], const __m512i (&wh)[R],
    const __m512 (&ws)[R], __m512 (&acc)[R][B]) {
  for (int b = 0; b < B; ++b) {
    const int64_t off = (b0 + b) * p.nblocks + k;
    const __m512i xe = _mm512_load_si512(p.xq + off * 128);
    const __m512i xo = _mm512_load_si512(p.xq + off * 128 + 64);
    const __m512i c = _mm512_load_si512(p.corr + off * 16);
    const __m512 xs = _mm512_load_ps(p.xs + off * 16);
    for (int i = 0; i < R; ++i) {
      __m512i d = _mm512_dpbusd_epi32(c, wl[i], xe);
      d = _mm512_dpbusd_epi32(d, wh[i], xo);
      acc[i][b] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(d), _mm512_mul_ps(ws[i], xs), acc[i][b]);
    }
  }
}

// ---------------------------------------------------------------- MXFP4, integer dots
struct Mxfp4Idot {
  static constexpr int kBatchTile = 4;
  static constexpr int kRowTile = 4;

  // Doubled e2m1 + 12 (unsigned), indexed by the 4-bit code, in every 128-bit lane.
  // Repeated 4 times over 64 bytes, so vpermb (which reads 6 index bits) needs no masking.
  COLI_AVX512 static __m512i Table() {
    return _mm512_broadcast_i32x4(
        _mm_setr_epi8(12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0));
  }
  COLI_AVX512 __attribute__((always_inline)) static void Decode(__m512i v, __m512i tbl, __m512i& wl,
                                                                __m512i& wh) {
    wl = _mm512_permutexvar_epi8(v, tbl);
    wh = _mm512_permutexvar_epi8(_mm512_srli_epi16(v, 4), tbl);
  }
  // For the batch-1 row kernel (IdotRow): scales of 16 groups as f32, and the permute index
  // that gives lane 4j+i of a block group j's scale.
  using Scale = uint8_t;
  static constexpr int kGroupCols = 32, kGroupsPerBlock = 4;
  COLI_AVX512 static __m512 Scales16(const uint8_t* s) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(
        _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s))), 23));
  }
  COLI_AVX512 static __m512i ScalePick() {
    return _mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0);
  }

  template <int R, int B>
  COLI_AVX512 static void Tile(const MatrixView& w, const Prepared& p, float* y, int64_t r0,
                               int64_t b0);
  // Blocks [k0, end) of rows r0.. and batch rows b0.. into acc.
  template <int R, int B>
  COLI_AVX512 __attribute__((always_inline)) static void Blocks(const MatrixView& w,
                                                                const Prepared& p, int64_t r0,
                                                                int64_t b0, int64_t k0,
                                                                __m512 (&acc)[R][B]) {
    const int64_t cols = w.cols, groups = cols / 32;
    const int64_t nfull = groups / 4, rem = groups % 4, nblk = nfull + (rem != 0);
    const uint8_t* wp[R];
    const uint8_t* sp[R];
    for (int i = 0; i < R; ++i) {
      wp[i] = static_cast<const uint8_t*>(w.data) + (r0 + i) * (cols / 2);
      sp[i] = static_cast<const uint8_t*>(w.scales) + (r0 + i) * groups;
    }
    const __m512i tbl = Table();
    int64_t k = k0;
    // Four blocks (16 groups) at a time: their 16 scale bytes widen to 16 f32 in one go, and
    // each block's lanes pick their group's scale with one permute.
    for (; k + 4 <= nfull; k += 4) {
      __m512 s16[R];
      for (int i = 0; i < R; ++i) {
        _mm_prefetch(reinterpret_cast<const char*>(sp[i] + 4 * k) + kPrefetchBytes / 16,
                     _MM_HINT_T0);
        s16[i] = Scales16(sp[i] + 4 * k);
      }
      for (int q = 0; q < 4; ++q) {
        const __m512i pick = _mm512_set_epi32(4 * q + 3, 4 * q + 3, 4 * q + 3, 4 * q + 3, 4 * q + 2,
                                              4 * q + 2, 4 * q + 2, 4 * q + 2, 4 * q + 1, 4 * q + 1,
                                              4 * q + 1, 4 * q + 1, 4 * q, 4 * q, 4 * q, 4 * q);
        __m512i wl[R], wh[R];
        __m512 ws[R];
        for (int i = 0; i < R; ++i) {
          _mm_prefetch(reinterpret_cast<const char*>(wp[i] + 64 * (k + q) + kPrefetchBytes),
                       _MM_HINT_T0);
          Decode(_mm512_loadu_si512(wp[i] + 64 * (k + q)), tbl, wl[i], wh[i]);
          ws[i] = _mm512_permutexvar_ps(pick, s16[i]);
        }
        DotTwoHalves<R, B>(p, b0, k + q, wl, wh, ws, acc);
      }
    }
    // Remaining blocks, the last one possibly short (masked loads never touch bytes past the row).
    const __m512i sctl = _mm512_set_epi8(
        -1, -1, -1, 3, -1, -1, -1, 3, -1, -1, -1, 3, -1, -1, -1, 3, -1, -1, -1, 2, -1, -1, -1, 2,
        -1, -1, -1, 2, -1, -1, -1, 2, -1, -1, -1, 1, -1, -1, -1, 1, -1, -1, -1, 1, -1, -1, -1, 1,
        -1, -1, -1, 0, -1, -1, -1, 0, -1, -1, -1, 0, -1, -1, -1, 0);
    for (; k < nblk; ++k) {
      const bool tail = k == nfull;
      const __mmask64 wm = tail ? ByteMask(16 * rem) : ~__mmask64{0};
      const __mmask16 sm = tail ? __mmask16((1u << rem) - 1) : __mmask16(0xF);
      __m512i wl[R], wh[R];
      __m512 ws[R];
      for (int i = 0; i < R; ++i) {
        Decode(_mm512_maskz_loadu_epi8(wm, wp[i] + 64 * k), tbl, wl[i], wh[i]);
        const __m128i s4 = _mm_maskz_loadu_epi8(sm, sp[i] + 4 * k);
        ws[i] = _mm512_castsi512_ps(
            _mm512_slli_epi32(_mm512_shuffle_epi8(_mm512_broadcastd_epi32(s4), sctl), 23));
      }
      DotTwoHalves<R, B>(p, b0, k, wl, wh, ws, acc);
    }
  }
};

// ---------------------------------------------------------------- int4-g64, integer dots
struct Int4Idot {
  static constexpr int kBatchTile = 4;
  static constexpr int kRowTile = 4;
  // The nibbles as stored are the unsigned operand (biased by 8).
  COLI_AVX512 static __m512i Table() { return _mm512_set1_epi8(0x0F); }
  COLI_AVX512 __attribute__((always_inline)) static void Decode(__m512i v, __m512i low4,
                                                                __m512i& wl, __m512i& wh) {
    wl = _mm512_and_si512(v, low4);
    wh = _mm512_and_si512(_mm512_srli_epi16(v, 4), low4);
  }
  // For IdotRow, as in Mxfp4Idot: lane 8j+i of a block takes group j's scale.
  using Scale = float;
  static constexpr int kGroupCols = 64, kGroupsPerBlock = 2;
  COLI_AVX512 static __m512 Scales16(const float* s) { return _mm512_loadu_ps(s); }
  COLI_AVX512 static __m512i ScalePick() {
    return _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
  }
  template <int R, int B>
  COLI_AVX512 static void Tile(const MatrixView& w, const Prepared& p, float* y, int64_t r0,
                               int64_t b0);
  template <int R, int B>
  COLI_AVX512 __attribute__((always_inline)) static void Blocks(const MatrixView& w,
                                                                const Prepared& p, int64_t r0,
                                                                int64_t b0, int64_t k0,
                                                                __m512 (&acc)[R][B]) {
    const int64_t cols = w.cols, groups = cols / 64;
    const int64_t nfull = groups / 2, rem = groups % 2, nblk = nfull + rem;
    const uint8_t* wp[R];
    const float* sp[R];
    for (int i = 0; i < R; ++i) {
      wp[i] = static_cast<const uint8_t*>(w.data) + (r0 + i) * (cols / 2);
      sp[i] = static_cast<const float*>(w.scales) + (r0 + i) * groups;
    }
    const __m512i low4 = Table(), spread = ScalePick();
    for (int64_t k = k0; k < nblk; ++k) {
      __m512i lo[R], hi[R];
      __m512 ws[R];
      for (int i = 0; i < R; ++i) {
        __m512i v;
        __m128 s2;
        if (k < nfull) {
          _mm_prefetch(reinterpret_cast<const char*>(wp[i] + 64 * k + kPrefetchBytes), _MM_HINT_T0);
          v = _mm512_loadu_si512(wp[i] + 64 * k);
          // Two f32 scales, 4-byte aligned only: movq through the unaligned-typed intrinsic.
          s2 = _mm_castsi128_ps(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(sp[i] + 2 * k)));
        } else {  // one 64-group left: 32 bytes, one scale
          v = _mm512_castsi256_si512(
              _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wp[i] + 64 * k)));
          v = _mm512_inserti64x4(v, _mm256_setzero_si256(), 1);
          s2 = _mm_load_ss(sp[i] + 2 * k);
        }
        Decode(v, low4, lo[i], hi[i]);
        ws[i] = _mm512_permutexvar_ps(spread, _mm512_castps128_ps512(s2));
      }
      DotTwoHalves<R, B>(p, b0, k, lo, hi, ws, acc);
    }
  }
};

// ---------------------------------------------------------------- int8 per row, integer dots
struct Int8Idot {
  static constexpr int kBatchTile = 6;
  static constexpr int kRowTile = 4;
  template <int R, int B>
  COLI_AVX512 static void Tile(const MatrixView& w, const Prepared& p, float* y, int64_t r0,
                               int64_t b0);
  template <int R, int B>
  COLI_AVX512 __attribute__((always_inline)) static void Blocks(const MatrixView& w,
                                                                const Prepared& p, int64_t r0,
                                                                int64_t b0, int64_t k0,
                                                                __m512 (&acc)[R][B]) {
    const int64_t cols = w.cols, nblk = p.nblocks;
    const int8_t* wp[R];
    for (int i = 0; i < R; ++i) wp[i] = static_cast<const int8_t*>(w.data) + (r0 + i) * cols;
    const __m512i bias = _mm512_set1_epi8(static_cast<char>(0x80));
    const int64_t nfull = cols / 64;
    for (int64_t k = k0; k < nblk; ++k) {
      const __mmask64 wm = k < nfull ? ~__mmask64{0} : ByteMask(cols - 64 * k);
      __m512i wu[R];
      for (int i = 0; i < R; ++i) {
        // q + 128 as unsigned; masked-off bytes meet zero activations.
        _mm_prefetch(reinterpret_cast<const char*>(wp[i] + 64 * k + kPrefetchBytes), _MM_HINT_T0);
        const __m512i q = k < nfull ? _mm512_loadu_si512(wp[i] + 64 * k)
                                    : _mm512_maskz_loadu_epi8(wm, wp[i] + 64 * k);
        wu[i] = _mm512_xor_si512(q, bias);
      }
      for (int b = 0; b < B; ++b) {
        const int64_t off = (b0 + b) * nblk + k;
        const __m512i xq = _mm512_load_si512(p.xq + off * 64);
        const __m512i c = _mm512_load_si512(p.corr + off * 16);
        const __m512 xs = _mm512_load_ps(p.xs + off * 16);
        for (int i = 0; i < R; ++i) {
          const __m512i d = _mm512_dpbusd_epi32(c, wu[i], xq);
          acc[i][b] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(d), xs, acc[i][b]);
        }
      }
    }
  }
};

// A tile of the integer paths: K::Blocks over whole rows, then the fixed tree (times the row scale
// for int8).
template <class K, int R, int B>
COLI_AVX512 void IdotTile(const MatrixView& w, const Prepared& p, float* y, int64_t r0,
                          int64_t b0) {
  __m512 acc[R][B];
  for (int i = 0; i < R; ++i)
    for (int b = 0; b < B; ++b) acc[i][b] = _mm512_setzero_ps();
  K::template Blocks<R, B>(w, p, r0, b0, 0, acc);
  const float* s = static_cast<const float*>(w.scales);
  for (int i = 0; i < R; ++i) {
    for (int b = 0; b < B; ++b) {
      const float v = Reduce16(acc[i][b]);
      y[(b0 + b) * w.rows + r0 + i] = w.format == WeightFormat::kInt8Row ? s[r0 + i] * v : v;
    }
  }
}
template <int R, int B>
COLI_AVX512 void Mxfp4Idot::Tile(const MatrixView& w, const Prepared& p, float* y, int64_t r0,
                                 int64_t b0) {
  IdotTile<Mxfp4Idot, R, B>(w, p, y, r0, b0);
}
template <int R, int B>
COLI_AVX512 void Int4Idot::Tile(const MatrixView& w, const Prepared& p, float* y, int64_t r0,
                                int64_t b0) {
  IdotTile<Int4Idot, R, B>(w, p, y, r0, b0);
}
template <int R, int B>
COLI_AVX512 void Int8Idot::Tile(const MatrixView& w, const Prepared& p, float* y, int64_t r0,
                                int64_t b0) {
  IdotTile<Int8Idot, R, B>(w, p, y, r0, b0);
}

// ---------------------------------------------------------------- float paths
// f32 / int8 / int4 weights against f32 activations; lane l <- columns ≡ l (mod 16).
template <WeightFormat F>
struct FloatWeights {
  static constexpr int kBatchTile = 4;
  static constexpr int kRowTile = 4;
  template <int R, int B>
  COLI_AVX512 static void Tile(const MatrixView& w, const Prepared& p, float* y, int64_t r0,
                               int64_t b0) {
    const int64_t cols = w.cols, nblk = (cols + 15) / 16;
    __m512 acc[R][B];
    for (int i = 0; i < R; ++i)
      for (int b = 0; b < B; ++b) acc[i][b] = _mm512_setzero_ps();
    const __m128i low4 = _mm_set1_epi8(0x0F);
    for (int64_t k = 0; k < nblk; ++k) {
      const __mmask16 m = LaneMask(cols - 16 * k);
      __m512 wv[R];
      for (int i = 0; i < R; ++i) {
        const int64_t r = r0 + i;
        if constexpr (F == WeightFormat::kF32) {
          const float* src = static_cast<const float*>(w.data) + r * cols + 16 * k;
          _mm_prefetch(reinterpret_cast<const char*>(src) + kPrefetchBytes, _MM_HINT_T0);
          wv[i] = _mm512_maskz_loadu_ps(m, src);
        } else if constexpr (F == WeightFormat::kInt8Row) {
          const int8_t* src = static_cast<const int8_t*>(w.data) + r * cols + 16 * k;
          if ((k & 3) == 0)
            _mm_prefetch(reinterpret_cast<const char*>(src) + kPrefetchBytes, _MM_HINT_T0);
          const __m128i q = _mm_maskz_loadu_epi8(m, src);
          wv[i] = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q));
        } else {  // int4-g64: 8 bytes -> 16 nibbles in column order, (n - 8) * s_g
          const uint8_t* src = static_cast<const uint8_t*>(w.data) + r * (cols / 2) + 8 * k;
          const __m128i b16 =
              _mm_cvtepu8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(src)));
          const __m128i nat =
              _mm_or_si128(_mm_and_si128(b16, low4), _mm_slli_epi16(_mm_srli_epi16(b16, 4), 8));
          const __m512i n = _mm512_sub_epi32(_mm512_cvtepu8_epi32(nat), _mm512_set1_epi32(8));
          const float s = static_cast<const float*>(w.scales)[r * (cols / 64) + k / 4];
          wv[i] = _mm512_mul_ps(_mm512_cvtepi32_ps(n), _mm512_set1_ps(s));
        }
      }
      for (int b = 0; b < B; ++b) {
        const __m512 x = _mm512_maskz_loadu_ps(m, p.xf + (b0 + b) * p.xf_stride + 16 * k);
        for (int i = 0; i < R; ++i) acc[i][b] = _mm512_fmadd_ps(wv[i], x, acc[i][b]);
      }
    }
    for (int i = 0; i < R; ++i) {
      const float s =
          F == WeightFormat::kInt8Row ? static_cast<const float*>(w.scales)[r0 + i] : 1.f;
      for (int b = 0; b < B; ++b) {
        const float v = Reduce16(acc[i][b]);
        y[(b0 + b) * w.rows + r0 + i] = F == WeightFormat::kInt8Row ? s * v : v;
      }
    }
  }
};

// MXFP4 exact float: weights e2m1·2^(s−127) (exact), even / odd columns in two accumulators.
struct Mxfp4Float {
  static constexpr int kBatchTile = 2;
  static constexpr int kRowTile = 4;
  template <int R, int B>
  COLI_AVX512 static void Tile(const MatrixView& w, const Prepared& p, float* y, int64_t r0,
                               int64_t b0) {
    const int64_t cols = w.cols, groups = cols / 32;
    const uint8_t* wp[R];
    const uint8_t* sp[R];
    for (int i = 0; i < R; ++i) {
      wp[i] = static_cast<const uint8_t*>(w.data) + (r0 + i) * (cols / 2);
      sp[i] = static_cast<const uint8_t*>(w.scales) + (r0 + i) * groups;
    }
    const __m512 tbl = _mm512_loadu_ps(kE2m1);
    __m512 ae[R][B], ao[R][B];
    for (int i = 0; i < R; ++i)
      for (int b = 0; b < B; ++b) ae[i][b] = ao[i][b] = _mm512_setzero_ps();
    // The group scales as f32, 16 groups at a time, so each group's table multiply takes its
    // scale as a broadcast memory operand (no byte -> register -> vector move per group).
    alignas(64) float sf[R][16];
    for (int64_t g0 = 0; g0 < groups; g0 += 16) {
      const int64_t ng = std::min<int64_t>(16, groups - g0);
      for (int i = 0; i < R; ++i) {
        const __m128i s16 = _mm_maskz_loadu_epi8(LaneMask(ng), sp[i] + g0);
        _mm512_store_si512(sf[i], _mm512_slli_epi32(_mm512_cvtepu8_epi32(s16), 23));
      }
      for (int64_t gi = 0; gi < ng; ++gi) {
        const int64_t g = g0 + gi;
        __m512 we[R], wo[R];
        for (int i = 0; i < R; ++i) {
          if ((g & 3) == 0) {
            _mm_prefetch(reinterpret_cast<const char*>(wp[i] + 16 * g) + kPrefetchBytes,
                         _MM_HINT_T0);
          }
          const __m512i v = _mm512_cvtepu8_epi32(
              _mm_loadu_si128(reinterpret_cast<const __m128i*>(wp[i] + 16 * g)));
          const __m512 stab = _mm512_mul_ps(tbl, _mm512_set1_ps(sf[i][gi]));
          // vpermps reads only bits 0-3 of each index: the low nibble needs no mask.
          we[i] = _mm512_permutexvar_ps(v, stab);
          wo[i] = _mm512_permutexvar_ps(_mm512_srli_epi32(v, 4), stab);
        }
        for (int b = 0; b < B; ++b) {
          const float* x = p.xf + (b0 + b) * cols + 32 * g;
          const __m512 xe = _mm512_load_ps(x), xo = _mm512_load_ps(x + 16);
          for (int i = 0; i < R; ++i) {
            ae[i][b] = _mm512_fmadd_ps(we[i], xe, ae[i][b]);
            ao[i][b] = _mm512_fmadd_ps(wo[i], xo, ao[i][b]);
          }
        }
      }
    }
    for (int i = 0; i < R; ++i)
      for (int b = 0; b < B; ++b)
        y[(b0 + b) * w.rows + r0 + i] = Reduce16(_mm512_add_ps(ae[i][b], ao[i][b]));
  }
};

// ---------------------------------------------------------------- batch 1, one row at a time
// For one activation row the weights are read as linear streams of whole rows: one stream per
// thread (IdotRow), or `Prepared::row_streams` rows far apart in memory at once (IdotRows: a core
// of an Emerald Rapids Xeon reads 4 such streams 16–28 % faster than one, a Zen 5 core 2 streams
// up to 1.4× (int4); S accumulator chains also hide the fma latency that holds one int8 row
// to ~68 GB/s in L2, 4 rows ~105; adjacent rows do not help). The combined
// scales (weight scale × activation scale) of 16 groups are formed with one multiply and spread to
// each block's lanes with one permute, which keeps loads per 64-byte block to the weights, the
// activation codes and their correction. Products and accumulation order are those of Tile.

// Keeps a value in a register (stops the compiler from re-loading a constant from memory, or
// loading the weights a second time as the memory operand of the shift, in every block).
#define COLI_IN_REG(v) asm("" : "+v"(v))

// MXFP4 and int4-g64 (F = Mxfp4Idot or Int4Idot): chunks of blocks holding 16 groups each.
template <class F>
COLI_AVX512 void IdotRow(const MatrixView& w, const Prepared& p, float* y, int64_t r) {
  constexpr int kGroups = F::kGroupsPerBlock, kChunk = 16 / kGroups;  // blocks per 16 groups
  const int64_t cols = w.cols, groups = cols / F::kGroupCols, nfull = groups / kGroups;
  const uint8_t* wp = static_cast<const uint8_t*>(w.data) + r * (cols / 2);
  const typename F::Scale* sp = static_cast<const typename F::Scale*>(w.scales) + r * groups;
  // The scale stream runs at sizeof(Scale) bytes per kGroupCols / 2 weight bytes.
  constexpr int64_t kScaleAhead =
      kRowPrefetchBytes * sizeof(typename F::Scale) / (F::kGroupCols / 2);
  const __m512i tbl = F::Table(), pick0 = F::ScalePick(), step = _mm512_set1_epi32(kGroups);
  __m512 acc[1][1] = {{_mm512_setzero_ps()}};
  int64_t k = 0;
  for (; k + kChunk <= nfull; k += kChunk) {
    _mm_prefetch(reinterpret_cast<const char*>(sp + kGroups * k) + kScaleAhead, _MM_HINT_T0);
    const __m512 sc =
        _mm512_mul_ps(F::Scales16(sp + kGroups * k), _mm512_load_ps(p.xg + kGroups * k));
    __m512i pick = pick0;
    for (int q = 0; q < kChunk; ++q) {
      COLI_IN_REG(pick);
      const uint8_t* src = wp + 64 * (k + q);
      _mm_prefetch(reinterpret_cast<const char*>(src + kRowPrefetchBytes), _MM_HINT_T0);
      __m512i v = _mm512_loadu_si512(src);
      COLI_IN_REG(v);
      __m512i wl, wh;
      F::Decode(v, tbl, wl, wh);
      const int64_t off = k + q;
      __m512i d = _mm512_dpbusd_epi32(_mm512_load_si512(p.corr + off * 16), wl,
                                      _mm512_load_si512(p.xq + off * 128));
      d = _mm512_dpbusd_epi32(d, wh, _mm512_load_si512(p.xq + off * 128 + 64));
      acc[0][0] =
          _mm512_fmadd_ps(_mm512_cvtepi32_ps(d), _mm512_permutexvar_ps(pick, sc), acc[0][0]);
      pick = _mm512_add_epi32(pick, step);
    }
  }
  F::template Blocks<1, 1>(w, p, r, 0, k, acc);
  y[r] = Reduce16(acc[0][0]);
}

// IdotRow on S rows at once (`rows`, far apart): S read streams, one set of activation loads.
// Each row's products and order are IdotRow's, so the results are bit-identical to it.
template <class F, int S>
COLI_AVX512 void IdotRows(const MatrixView& w, const Prepared& p, float* y,
                          const int64_t (&rows)[S]) {
  constexpr int kGroups = F::kGroupsPerBlock, kChunk = 16 / kGroups;
  const int64_t cols = w.cols, groups = cols / F::kGroupCols, nfull = groups / kGroups;
  const uint8_t* wp[S];
  const typename F::Scale* sp[S];
  for (int j = 0; j < S; ++j) {
    wp[j] = static_cast<const uint8_t*>(w.data) + rows[j] * (cols / 2);
    sp[j] = static_cast<const typename F::Scale*>(w.scales) + rows[j] * groups;
  }
  constexpr int64_t kScaleAhead =
      kRowPrefetchAhead<S> * sizeof(typename F::Scale) / (F::kGroupCols / 2);
  const __m512i tbl = F::Table(), pick0 = F::ScalePick(), step = _mm512_set1_epi32(kGroups);
  __m512 acc[S];
  for (int j = 0; j < S; ++j) acc[j] = _mm512_setzero_ps();
  int64_t k = 0;
  for (; k + kChunk <= nfull; k += kChunk) {
    const __m512 xg = _mm512_load_ps(p.xg + kGroups * k);
    __m512 sc[S];
    for (int j = 0; j < S; ++j) {
      _mm_prefetch(reinterpret_cast<const char*>(sp[j] + kGroups * k) + kScaleAhead, _MM_HINT_T0);
      sc[j] = _mm512_mul_ps(F::Scales16(sp[j] + kGroups * k), xg);
    }
    __m512i pick = pick0;
    for (int q = 0; q < kChunk; ++q) {
      COLI_IN_REG(pick);
      const int64_t off = k + q;
      const __m512i c = _mm512_load_si512(p.corr + off * 16);
      const __m512i xe = _mm512_load_si512(p.xq + off * 128);
      const __m512i xo = _mm512_load_si512(p.xq + off * 128 + 64);
      for (int j = 0; j < S; ++j) {
        const uint8_t* src = wp[j] + 64 * off;
        _mm_prefetch(reinterpret_cast<const char*>(src + kRowPrefetchAhead<S>), _MM_HINT_T0);
        __m512i v = _mm512_loadu_si512(src);
        COLI_IN_REG(v);
        __m512i wl, wh;
        F::Decode(v, tbl, wl, wh);
        __m512i d = _mm512_dpbusd_epi32(c, wl, xe);
        d = _mm512_dpbusd_epi32(d, wh, xo);
        acc[j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(d), _mm512_permutexvar_ps(pick, sc[j]), acc[j]);
      }
      pick = _mm512_add_epi32(pick, step);
    }
  }
  for (int j = 0; j < S; ++j) {
    __m512 tail[1][1] = {{acc[j]}};
    F::template Blocks<1, 1>(w, p, rows[j], 0, k, tail);
    y[rows[j]] = Reduce16(tail[0][0]);
  }
}

COLI_AVX512 void Int8IdotRow(const MatrixView& w, const Prepared& p, float* y, int64_t r) {
  const int64_t cols = w.cols, nfull = cols / 64;
  const int8_t* wp = static_cast<const int8_t*>(w.data) + r * cols;
  const __m512i bias = _mm512_set1_epi8(static_cast<char>(0x80));
  __m512 acc[1][1] = {{_mm512_setzero_ps()}};
  int64_t k = 0;
  for (; k < nfull; ++k) {
    const int8_t* src = wp + 64 * k;
    _mm_prefetch(reinterpret_cast<const char*>(src + kRowPrefetchBytes), _MM_HINT_T0);
    const __m512i v = _mm512_xor_si512(_mm512_loadu_si512(src), bias);
    const __m512i d = _mm512_dpbusd_epi32(_mm512_load_si512(p.corr + k * 16), v,
                                          _mm512_load_si512(p.xq + k * 64));
    acc[0][0] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(d), _mm512_set1_ps(p.xg[k]), acc[0][0]);
  }
  Int8Idot::Blocks<1, 1>(w, p, r, 0, k, acc);
  y[r] = static_cast<const float*>(w.scales)[r] * Reduce16(acc[0][0]);
}

// Int8IdotRow on S rows at once, as IdotRows.
template <int S>
COLI_AVX512 void Int8IdotRows(const MatrixView& w, const Prepared& p, float* y,
                              const int64_t (&rows)[S]) {
  const int64_t cols = w.cols, nfull = cols / 64;
  const int8_t* wp[S];
  for (int j = 0; j < S; ++j) wp[j] = static_cast<const int8_t*>(w.data) + rows[j] * cols;
  const __m512i bias = _mm512_set1_epi8(static_cast<char>(0x80));
  __m512 acc[S];
  for (int j = 0; j < S; ++j) acc[j] = _mm512_setzero_ps();
  int64_t k = 0;
  for (; k < nfull; ++k) {
    const __m512i c = _mm512_load_si512(p.corr + k * 16);
    const __m512i xq = _mm512_load_si512(p.xq + k * 64);
    const __m512 xs = _mm512_set1_ps(p.xg[k]);
    for (int j = 0; j < S; ++j) {
      const int8_t* src = wp[j] + 64 * k;
      _mm_prefetch(reinterpret_cast<const char*>(src + kRowPrefetchAhead<S>), _MM_HINT_T0);
      const __m512i v = _mm512_xor_si512(_mm512_loadu_si512(src), bias);
      acc[j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_dpbusd_epi32(c, v, xq)), xs, acc[j]);
    }
  }
  const float* s = static_cast<const float*>(w.scales);
  for (int j = 0; j < S; ++j) {
    __m512 tail[1][1] = {{acc[j]}};
    Int8Idot::Blocks<1, 1>(w, p, rows[j], 0, k, tail);
    y[rows[j]] = s[rows[j]] * Reduce16(tail[0][0]);
  }
}

// S rows far apart at a time for kernel K: IdotRows or Int8IdotRows.
template <class K, int S>
COLI_AVX512 void RowsOf(const MatrixView& w, const Prepared& p, float* y,
                        const int64_t (&rows)[S]) {
  if constexpr (std::is_same_v<K, Int8Idot>) {
    Int8IdotRows<S>(w, p, y, rows);
  } else {
    IdotRows<K, S>(w, p, y, rows);
  }
}

// Rows [rb, re) as S runs of equal length computed side by side (row i of every run together);
// returns the first row left for the one-row kernel (fewer than S).
template <class K, int S>
COLI_AVX512 int64_t InterleavedRuns(const MatrixView& w, const Prepared& p, float* y, int64_t rb,
                                    int64_t re) {
  const int64_t run = (re - rb) / S;
  for (int64_t i = 0; i < run; ++i) {
    int64_t rows[S];
    for (int j = 0; j < S; ++j) rows[j] = rb + j * run + i;
    RowsOf<K, S>(w, p, y, rows);
  }
  return rb + S * run;
}

// ---------------------------------------------------------------- driver
template <class K, int R>
COLI_AVX512 void TileB(int nb, const MatrixView& w, const Prepared& p, float* y, int64_t r0,
                       int64_t b0) {
  switch (nb) {
    case 1:
      K::template Tile<R, 1>(w, p, y, r0, b0);
      return;
    case 2:
      K::template Tile<R, 2>(w, p, y, r0, b0);
      return;
    case 3:
      K::template Tile<R, 3>(w, p, y, r0, b0);
      return;
    case 4:
      K::template Tile<R, 4>(w, p, y, r0, b0);
      return;
    default:
      break;
  }
  if constexpr (K::kBatchTile > 4) {
    switch (nb) {
      case 5:
        K::template Tile<R, 5>(w, p, y, r0, b0);
        return;
      case 6:
        K::template Tile<R, 6>(w, p, y, r0, b0);
        return;
      case 7:
        K::template Tile<R, 7>(w, p, y, r0, b0);
        return;
      case 8:
        K::template Tile<R, 8>(w, p, y, r0, b0);
        return;
      default:
        break;
    }
  }
}

using RowFn = void (*)(const MatrixView& w, const Prepared& p, float* y, int64_t r);

template <class K, RowFn Row = nullptr>
COLI_AVX512 void Drive(const MatrixView& w, const Prepared& p, int64_t batch, float* y, int64_t rb,
                       int64_t re) {
  int64_t r = rb;
  if constexpr (Row != nullptr) {
    if (batch == 1) {
      if (p.row_streams == 4) {
        r = InterleavedRuns<K, 4>(w, p, y, rb, re);
      } else if (p.row_streams == 2) {
        r = InterleavedRuns<K, 2>(w, p, y, rb, re);
      }
      for (; r < re; ++r) Row(w, p, y, r);
      return;
    }
  }
  if (batch == 1) {
    for (; r + 4 <= re; r += 4) K::template Tile<4, 1>(w, p, y, r, 0);
    for (; r < re; ++r) K::template Tile<1, 1>(w, p, y, r, 0);
    return;
  }
  constexpr int RT = K::kRowTile;
  for (; r < re; r += RT) {
    const int nr = static_cast<int>(std::min<int64_t>(RT, re - r));
    for (int64_t b0 = 0; b0 < batch; b0 += K::kBatchTile) {
      const int nb = static_cast<int>(std::min<int64_t>(K::kBatchTile, batch - b0));
      if (nr == RT) {
        TileB<K, RT>(nb, w, p, y, r, b0);
      } else {
        for (int i = 0; i < nr; ++i) TileB<K, 1>(nb, w, p, y, r + i, b0);
      }
    }
  }
}

// ---------------------------------------------------------------- activation preparation
// One group of `n` (<= 64) activations: non-finite check, scale and int8 codes exactly as
// QuantizeActivationsInt8Groups (max|x| is exact, the scale and its reciprocal are scalar IEEE
// divisions, cvtps2dq rounds half to even), codes left in 4 int32 vectors (cols 16v..16v+15).
COLI_AVX512 __attribute__((always_inline)) inline bool QuantizeGroup(const float* x, int n,
                                                                     __m512i (&q)[4],
                                                                     float* scale) {
  __m512 v[4];
  __m512 m = _mm512_setzero_ps();
  __mmask16 bad = 0;
  const int nv = (n + 15) / 16;
  for (int k = 0; k < nv; ++k) {
    v[k] = _mm512_maskz_loadu_ps(LaneMask(n - 16 * k), x + 16 * k);
    bad |= _mm512_fpclass_ps_mask(v[k], 0x99);  // QNaN | SNaN | +inf | -inf
    m = _mm512_max_ps(m, _mm512_abs_ps(v[k]));
  }
  if (bad) return false;
  float s = _mm512_reduce_max_ps(m) / 127.f;
  if (s < 1e-20f) s = 1e-20f;
  const __m512 inv = _mm512_set1_ps(1.0f / s);
  const __m512i lo = _mm512_set1_epi32(-127), hi = _mm512_set1_epi32(127);
  for (int k = 0; k < 4; ++k) {
    q[k] = k < nv ? _mm512_max_epi32(
                        lo, _mm512_min_epi32(hi, _mm512_cvtps_epi32(_mm512_mul_ps(v[k], inv))))
                  : _mm512_setzero_si512();
  }
  *scale = s;
  return true;
}

}  // namespace

COLI_AVX512 bool PrepareIdotRowAvx512(WeightFormat format, int64_t cols, const float* x,
                                      int64_t nblocks, int8_t* xq, int32_t* corr, float* xs,
                                      float* xg) {
  const __m512i ones = _mm512_set1_epi8(1);
  const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  const __m512i odd = _mm512_add_epi32(even, _mm512_set1_epi32(1));
  __m512i q[4];
  float s;
  if (format == WeightFormat::kMxfp4) {
    for (int64_t g = 0; g < cols / 32; ++g) {
      if (!QuantizeGroup(x + 32 * g, 32, q, &s)) return false;
      int8_t* blk = xq + (g / 4) * 128;
      const int j = static_cast<int>(g % 4);
      _mm_store_si128(reinterpret_cast<__m128i*>(blk + 16 * j),
                      _mm512_cvtepi32_epi8(_mm512_permutex2var_epi32(q[0], even, q[1])));
      _mm_store_si128(reinterpret_cast<__m128i*>(blk + 64 + 16 * j),
                      _mm512_cvtepi32_epi8(_mm512_permutex2var_epi32(q[0], odd, q[1])));
      _mm_store_ps(xs + (g / 4) * 16 + 4 * j, _mm_set1_ps(0.5f * s));
      xg[g] = 0.5f * s;
    }
  } else if (format == WeightFormat::kInt4G64) {
    for (int64_t g = 0; g < cols / 64; ++g) {
      if (!QuantizeGroup(x + 64 * g, 64, q, &s)) return false;
      int8_t* blk = xq + (g / 2) * 128;
      const int j = static_cast<int>(g % 2);
      _mm_store_si128(reinterpret_cast<__m128i*>(blk + 32 * j),
                      _mm512_cvtepi32_epi8(_mm512_permutex2var_epi32(q[0], even, q[1])));
      _mm_store_si128(reinterpret_cast<__m128i*>(blk + 32 * j + 16),
                      _mm512_cvtepi32_epi8(_mm512_permutex2var_epi32(q[2], even, q[3])));
      _mm_store_si128(reinterpret_cast<__m128i*>(blk + 64 + 32 * j),
                      _mm512_cvtepi32_epi8(_mm512_permutex2var_epi32(q[0], odd, q[1])));
      _mm_store_si128(reinterpret_cast<__m128i*>(blk + 64 + 32 * j + 16),
                      _mm512_cvtepi32_epi8(_mm512_permutex2var_epi32(q[2], odd, q[3])));
      _mm256_store_ps(xs + (g / 2) * 16 + 8 * j, _mm256_set1_ps(s));
      xg[g] = s;
    }
  } else {  // int8: one (possibly short) group of 64 per block, natural order
    for (int64_t k = 0; k < nblocks; ++k) {
      const int n = static_cast<int>(std::min<int64_t>(64, cols - 64 * k));
      if (!QuantizeGroup(x + 64 * k, n, q, &s)) return false;
      for (int v = 0; v < 4; ++v) {
        _mm_store_si128(reinterpret_cast<__m128i*>(xq + 64 * k + 16 * v),
                        _mm512_cvtepi32_epi8(q[v]));
      }
      _mm512_store_ps(xs + 16 * k, _mm512_set1_ps(s));
      xg[k] = s;
    }
  }
  // Corrections: lane sums of the codes (vpdpbusd with ones sums exactly the lane's columns).
  for (int64_t k = 0; k < nblocks; ++k) {
    __m512i sum;
    int32_t bias;
    if (format == WeightFormat::kInt8Row) {
      sum = _mm512_dpbusd_epi32(_mm512_setzero_si512(), ones, _mm512_load_si512(xq + 64 * k));
      bias = -128;
    } else {
      sum = _mm512_dpbusd_epi32(_mm512_setzero_si512(), ones, _mm512_load_si512(xq + 128 * k));
      sum = _mm512_dpbusd_epi32(sum, ones, _mm512_load_si512(xq + 128 * k + 64));
      bias = format == WeightFormat::kMxfp4 ? -12 : -8;
    }
    _mm512_store_si512(corr + 16 * k, _mm512_mullo_epi32(sum, _mm512_set1_epi32(bias)));
  }
  return true;
}

namespace {}  // namespace

const KernelSet& Avx512Kernels() {
  static const KernelSet set = {Drive<FloatWeights<WeightFormat::kF32>>,
                                Drive<Mxfp4Float>,
                                Drive<Mxfp4Idot, IdotRow<Mxfp4Idot>>,
                                Drive<FloatWeights<WeightFormat::kInt8Row>>,
                                Drive<Int8Idot, Int8IdotRow>,
                                Drive<FloatWeights<WeightFormat::kInt4G64>>,
                                Drive<Int4Idot, IdotRow<Int4Idot>>};
  return set;
}

}  // namespace coli::kernels::internal
