// Scalar reference kernels. They define the accumulation order every SIMD path reproduces
// bit for bit (see kernels.h, "Numerics"); keep them plain and readable.
#include <cmath>

#include "common/kernels/internal.h"

namespace coli::kernels::internal {
namespace {

inline int Nibble(const uint8_t* packed_row, int64_t col) {
  return (packed_row[col >> 1] >> (4 * (col & 1))) & 15;
}

void F32Scalar(const MatrixView& w, const Prepared& p, int64_t batch, float* y, int64_t rb,
               int64_t re) {
  const int64_t cols = w.cols;
  for (int64_t r = rb; r < re; ++r) {
    const float* wr = static_cast<const float*>(w.data) + r * cols;
    for (int64_t b = 0; b < batch; ++b) {
      const float* x = p.xf + b * p.xf_stride;
      float acc[16] = {};
      for (int64_t c = 0; c < cols; ++c) acc[c % 16] = std::fma(wr[c], x[c], acc[c % 16]);
      y[b * w.rows + r] = ReduceLanes16(acc);
    }
  }
}

void Int8FloatScalar(const MatrixView& w, const Prepared& p, int64_t batch, float* y, int64_t rb,
                     int64_t re) {
  const int64_t cols = w.cols;
  for (int64_t r = rb; r < re; ++r) {
    const int8_t* q = static_cast<const int8_t*>(w.data) + r * cols;
    const float s = static_cast<const float*>(w.scales)[r];
    for (int64_t b = 0; b < batch; ++b) {
      const float* x = p.xf + b * p.xf_stride;
      float acc[16] = {};
      for (int64_t c = 0; c < cols; ++c) {
        acc[c % 16] = std::fma(static_cast<float>(q[c]), x[c], acc[c % 16]);
      }
      y[b * w.rows + r] = s * ReduceLanes16(acc);
    }
  }
}

void Int4FloatScalar(const MatrixView& w, const Prepared& p, int64_t batch, float* y, int64_t rb,
                     int64_t re) {
  const int64_t cols = w.cols;
  for (int64_t r = rb; r < re; ++r) {
    const uint8_t* q = static_cast<const uint8_t*>(w.data) + r * cols / 2;
    const float* s = static_cast<const float*>(w.scales) + r * cols / 64;
    for (int64_t b = 0; b < batch; ++b) {
      const float* x = p.xf + b * p.xf_stride;
      float acc[16] = {};
      for (int64_t c = 0; c < cols; ++c) {
        const float wv = static_cast<float>(Nibble(q, c) - 8) * s[c / 64];
        acc[c % 16] = std::fma(wv, x[c], acc[c % 16]);
      }
      y[b * w.rows + r] = ReduceLanes16(acc);
    }
  }
}

void Mxfp4FloatScalar(const MatrixView& w, const Prepared& p, int64_t batch, float* y, int64_t rb,
                      int64_t re) {
  const int64_t cols = w.cols, groups = cols / 32;
  for (int64_t r = rb; r < re; ++r) {
    const uint8_t* q = static_cast<const uint8_t*>(w.data) + r * cols / 2;
    const uint8_t* s = static_cast<const uint8_t*>(w.scales) + r * groups;
    for (int64_t b = 0; b < batch; ++b) {
      const float* x = p.x + b * cols;
      float even[16] = {}, odd[16] = {};
      for (int64_t g = 0; g < groups; ++g) {
        const float ws = E8m0(s[g]);
        for (int l = 0; l < 16; ++l) {
          const int64_t c = g * 32 + 2 * l;
          even[l] = std::fma(kE2m1[Nibble(q, c)] * ws, x[c], even[l]);
          odd[l] = std::fma(kE2m1[Nibble(q, c + 1)] * ws, x[c + 1], odd[l]);
        }
      }
      float acc[16];
      for (int l = 0; l < 16; ++l) acc[l] = even[l] + odd[l];
      y[b * w.rows + r] = ReduceLanes16(acc);
    }
  }
}

void Mxfp4IdotScalar(const MatrixView& w, const Prepared& p, int64_t batch, float* y, int64_t rb,
                     int64_t re) {
  const int64_t cols = w.cols, groups = cols / 32;
  for (int64_t r = rb; r < re; ++r) {
    const uint8_t* q = static_cast<const uint8_t*>(w.data) + r * cols / 2;
    const uint8_t* s = static_cast<const uint8_t*>(w.scales) + r * groups;
    for (int64_t b = 0; b < batch; ++b) {
      const int8_t* xq = p.qx + b * cols;
      const float* xs = p.qs + b * p.qs_stride;
      float acc[16] = {};
      for (int64_t g = 0; g < groups; ++g) {
        const float scale = E8m0(s[g]) * (0.5f * xs[g]);
        for (int i = 0; i < 4; ++i) {
          int32_t dot = 0;
          for (int c = 8 * i; c < 8 * i + 8; ++c) {
            const int64_t col = g * 32 + c;
            dot += kE2m1Doubled[Nibble(q, col)] * xq[col];
          }
          float& lane = acc[4 * (g % 4) + i];
          lane = std::fma(static_cast<float>(dot), scale, lane);
        }
      }
      y[b * w.rows + r] = ReduceLanes16(acc);
    }
  }
}

void Int4IdotScalar(const MatrixView& w, const Prepared& p, int64_t batch, float* y, int64_t rb,
                    int64_t re) {
  const int64_t cols = w.cols, groups = cols / 64;
  for (int64_t r = rb; r < re; ++r) {
    const uint8_t* q = static_cast<const uint8_t*>(w.data) + r * cols / 2;
    const float* s = static_cast<const float*>(w.scales) + r * groups;
    for (int64_t b = 0; b < batch; ++b) {
      const int8_t* xq = p.qx + b * cols;
      const float* xs = p.qs + b * p.qs_stride;
      float acc[16] = {};
      for (int64_t g = 0; g < groups; ++g) {
        const float scale = s[g] * xs[g];
        for (int i = 0; i < 8; ++i) {
          int32_t dot = 0;
          for (int c = 8 * i; c < 8 * i + 8; ++c) {
            const int64_t col = g * 64 + c;
            dot += (Nibble(q, col) - 8) * xq[col];
          }
          float& lane = acc[8 * (g % 2) + i];
          lane = std::fma(static_cast<float>(dot), scale, lane);
        }
      }
      y[b * w.rows + r] = ReduceLanes16(acc);
    }
  }
}

void Int8IdotScalar(const MatrixView& w, const Prepared& p, int64_t batch, float* y, int64_t rb,
                    int64_t re) {
  const int64_t cols = w.cols;
  const int64_t blocks = (cols + 63) / 64;
  for (int64_t r = rb; r < re; ++r) {
    const int8_t* q = static_cast<const int8_t*>(w.data) + r * cols;
    const float ws = static_cast<const float*>(w.scales)[r];
    for (int64_t b = 0; b < batch; ++b) {
      const int8_t* xq = p.qx + b * cols;
      const float* xs = p.qs + b * p.qs_stride;
      float acc[16] = {};
      for (int64_t k = 0; k < blocks; ++k) {
        for (int l = 0; l < 16; ++l) {
          int32_t dot = 0;
          for (int64_t c = k * 64 + 4 * l; c < k * 64 + 4 * l + 4 && c < cols; ++c) {
            dot += static_cast<int32_t>(q[c]) * xq[c];
          }
          acc[l] = std::fma(static_cast<float>(dot), xs[k], acc[l]);
        }
      }
      y[b * w.rows + r] = ws * ReduceLanes16(acc);
    }
  }
}

}  // namespace

const KernelSet& ScalarKernels() {
  static const KernelSet set = {F32Scalar,      Mxfp4FloatScalar, Mxfp4IdotScalar, Int8FloatScalar,
                                Int8IdotScalar, Int4FloatScalar,  Int4IdotScalar};
  return set;
}

}  // namespace coli::kernels::internal
