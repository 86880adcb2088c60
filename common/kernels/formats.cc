// Weight formats of spec §4: quantizers, decoders, QuantizedMatrix, view validation.
#include <xmmintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/kernels/internal.h"
#include "common/kernels/kernels.h"

namespace coli::kernels {
namespace {

constexpr float kScaleFloor = 1e-20f;

absl::Status NonFinite(int64_t index, float value) {
  return absl::InvalidArgumentError(
      absl::StrCat("non-finite value ", value, " at column ", index, " (NaN/inf refused)"));
}

// Scale floor of spec §4.2/§4.3: max(m / d, 1e-20).
float FlooredScale(float max_abs, float divisor) {
  float s = max_abs / divisor;
  return s < kScaleFloor ? kScaleFloor : s;
}

// rint() in the default rounding mode (round half to even), then clamp. Clamping first in float
// gives the same result (lo and hi are integers), and cvtss2si rounds like rint in the current
// mode; std::nearbyint was an out-of-line libm call per value (most of a call's activation
// quantization on the scalar and AVX2 paths).
int32_t RoundClamp(float v, int32_t lo, int32_t hi) {
  v = std::min(std::max(v, static_cast<float>(lo)), static_cast<float>(hi));
  return _mm_cvtss_si32(_mm_set_ss(v));
}

// Quantizes `n` values with `scale`'s reciprocal to [lo, hi].
void QuantizeWithScale(const float* w, int64_t n, float scale, int32_t lo, int32_t hi,
                       int32_t* out) {
  const float inv = 1.0f / scale;
  for (int64_t i = 0; i < n; ++i) out[i] = RoundClamp(w[i] * inv, lo, hi);
}

absl::Status CheckShape(int64_t rows, int64_t cols, WeightFormat format) {
  if (rows < 0 || cols <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("matrix shape [", rows, ", ", cols, "]: rows must be >= 0 and cols > 0"));
  }
  if (format == WeightFormat::kInt4G64 && cols % 64 != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "int4-g64 needs cols % 64 == 0, got cols = ", cols, " (use int8 for this matrix)"));
  }
  if (format == WeightFormat::kMxfp4 && cols % 32 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("MXFP4 needs cols % 32 == 0, got cols = ", cols));
  }
  return absl::OkStatus();
}

}  // namespace

const char* WeightFormatName(WeightFormat format) {
  switch (format) {
    case WeightFormat::kF32:
      return "f32";
    case WeightFormat::kInt8Row:
      return "int8";
    case WeightFormat::kInt4G64:
      return "int4g64";
    case WeightFormat::kMxfp4:
      return "mxfp4";
  }
  return "unknown";
}

float Bf16ToF32(uint16_t bits) {
  uint32_t u = static_cast<uint32_t>(bits) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

float E2m1ToF32(uint8_t code) { return internal::kE2m1[code & 15]; }
float E8m0ToF32(uint8_t s) { return internal::E8m0(s); }

absl::Status ValidateView(const MatrixView& w) {
  switch (w.format) {
    case WeightFormat::kF32:
    case WeightFormat::kInt8Row:
    case WeightFormat::kInt4G64:
    case WeightFormat::kMxfp4:
      break;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("unknown weight format ", static_cast<int>(w.format)));
  }
  if (absl::Status s = CheckShape(w.rows, w.cols, w.format); !s.ok()) return s;
  if (w.rows > 0 && w.data == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(WeightFormatName(w.format), " matrix: data pointer is null"));
  }
  if (w.rows > 0 && w.format != WeightFormat::kF32 && w.scales == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(WeightFormatName(w.format), " matrix: scales pointer is null"));
  }
  return absl::OkStatus();
}

MatrixBytes FormatBytes(WeightFormat format, int64_t rows, int64_t cols) {
  const size_t n = static_cast<size_t>(rows) * static_cast<size_t>(cols);
  switch (format) {
    case WeightFormat::kF32:
      return {n * 4, 0};
    case WeightFormat::kInt8Row:
      return {n, static_cast<size_t>(rows) * 4};
    case WeightFormat::kInt4G64:
      return {n / 2, n / 64 * 4};
    case WeightFormat::kMxfp4:
      return {n / 2, n / 32};
  }
  return {};
}

size_t ViewBytes(const MatrixView& w) { return FormatBytes(w.format, w.rows, w.cols).total(); }

absl::Status QuantizeRowInt8(std::span<const float> w, int8_t* q, float* scale) {
  float max_abs = 0.f;
  for (size_t i = 0; i < w.size(); ++i) {
    if (!std::isfinite(w[i])) return NonFinite(static_cast<int64_t>(i), w[i]);
    max_abs = std::max(max_abs, std::fabs(w[i]));
  }
  const float s = FlooredScale(max_abs, 127.f);
  const float inv = 1.0f / s;
  for (size_t i = 0; i < w.size(); ++i)
    q[i] = static_cast<int8_t>(RoundClamp(w[i] * inv, -127, 127));
  *scale = s;
  return absl::OkStatus();
}

absl::Status QuantizeRowInt4G64(std::span<const float> w, uint8_t* packed, float* scales) {
  if (w.size() % 64 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("int4-g64 needs cols % 64 == 0, got cols = ", w.size()));
  }
  int32_t q[64];
  for (size_t g = 0; g < w.size() / 64; ++g) {
    const float* v = w.data() + g * 64;
    float max_abs = 0.f;
    for (int i = 0; i < 64; ++i) {
      if (!std::isfinite(v[i])) return NonFinite(static_cast<int64_t>(g * 64 + i), v[i]);
      max_abs = std::max(max_abs, std::fabs(v[i]));
    }
    const float s = FlooredScale(max_abs, 7.f);
    QuantizeWithScale(v, 64, s, -8, 7, q);
    for (int i = 0; i < 32; ++i) {
      packed[g * 32 + i] = static_cast<uint8_t>((q[2 * i] + 8) | ((q[2 * i + 1] + 8) << 4));
    }
    scales[g] = s;
  }
  return absl::OkStatus();
}

absl::Status QuantizeActivationsInt8Groups(std::span<const float> x, int group, int8_t* q,
                                           float* scales) {
  if (group <= 0) return absl::InvalidArgumentError("activation group must be > 0");
  const size_t n = x.size();
  for (size_t g0 = 0, gi = 0; g0 < n; g0 += group, ++gi) {
    const size_t g1 = std::min(n, g0 + static_cast<size_t>(group));
    float max_abs = 0.f;
    for (size_t i = g0; i < g1; ++i) {
      if (!std::isfinite(x[i])) return NonFinite(static_cast<int64_t>(i), x[i]);
      max_abs = std::max(max_abs, std::fabs(x[i]));
    }
    const float s = FlooredScale(max_abs, 127.f);
    const float inv = 1.0f / s;
    for (size_t i = g0; i < g1; ++i) q[i] = static_cast<int8_t>(RoundClamp(x[i] * inv, -127, 127));
    scales[gi] = s;
  }
  return absl::OkStatus();
}

void DequantizeRow(const MatrixView& w, int64_t row, float* out) {
  const int64_t cols = w.cols;
  switch (w.format) {
    case WeightFormat::kF32:
      std::memcpy(out, static_cast<const float*>(w.data) + row * cols, cols * sizeof(float));
      return;
    case WeightFormat::kInt8Row: {
      const int8_t* q = static_cast<const int8_t*>(w.data) + row * cols;
      const float s = static_cast<const float*>(w.scales)[row];
      for (int64_t c = 0; c < cols; ++c) out[c] = static_cast<float>(q[c]) * s;
      return;
    }
    case WeightFormat::kInt4G64: {
      const uint8_t* p = static_cast<const uint8_t*>(w.data) + row * cols / 2;
      const float* s = static_cast<const float*>(w.scales) + row * cols / 64;
      for (int64_t c = 0; c < cols; ++c) {
        const int n = (p[c / 2] >> (4 * (c & 1))) & 15;
        out[c] = static_cast<float>(n - 8) * s[c / 64];
      }
      return;
    }
    case WeightFormat::kMxfp4: {
      const uint8_t* p = static_cast<const uint8_t*>(w.data) + row * cols / 2;
      const uint8_t* s = static_cast<const uint8_t*>(w.scales) + row * cols / 32;
      for (int64_t c = 0; c < cols; ++c) {
        const int n = (p[c / 2] >> (4 * (c & 1))) & 15;
        out[c] = internal::kE2m1[n] * internal::E8m0(s[c / 32]);
      }
      return;
    }
  }
}

// ---- QuantizedMatrix ----

MatrixView QuantizedMatrix::view() const {
  return MatrixView{format_, rows_, cols_, data_.data(),
                    format_ == WeightFormat::kF32 ? nullptr : scales_.data()};
}

template <class RowFn>
absl::StatusOr<QuantizedMatrix> QuantizedMatrix::QuantizeRows(int64_t rows, int64_t cols,
                                                              WeightFormat format, RowFn row_fn) {
  QuantizedMatrix m;
  m.format_ = format;
  m.rows_ = rows;
  m.cols_ = cols;
  const size_t n = static_cast<size_t>(rows) * static_cast<size_t>(cols);
  switch (format) {
    case WeightFormat::kF32:
      m.data_.resize(n * sizeof(float));
      break;
    case WeightFormat::kInt8Row:
      m.data_.resize(n);
      m.scales_.resize(static_cast<size_t>(rows) * sizeof(float));
      break;
    default:  // int4-g64 (MXFP4 is refused by the callers)
      m.data_.resize(n / 2);
      m.scales_.resize(n / 64 * sizeof(float));
      break;
  }
  // One f32 row at a time, so a huge BF16 matrix never needs a full f32 copy.
  std::vector<float> row(cols);
  for (int64_t r = 0; r < rows; ++r) {
    row_fn(r, row.data());
    absl::Status st;
    if (format == WeightFormat::kF32) {
      for (int64_t c = 0; c < cols && st.ok(); ++c) {
        if (!std::isfinite(row[c])) st = NonFinite(c, row[c]);
      }
      std::memcpy(m.data_.data() + r * cols * sizeof(float), row.data(), cols * sizeof(float));
    } else if (format == WeightFormat::kInt8Row) {
      float s = 0.f;
      st = QuantizeRowInt8(row, reinterpret_cast<int8_t*>(m.data_.data()) + r * cols, &s);
      std::memcpy(m.scales_.data() + r * sizeof(float), &s, sizeof s);
    } else {
      st = QuantizeRowInt4G64(row, m.data_.data() + r * cols / 2,
                              reinterpret_cast<float*>(m.scales_.data()) + r * (cols / 64));
    }
    if (!st.ok()) return absl::InvalidArgumentError(absl::StrCat("row ", r, ": ", st.message()));
  }
  return m;
}

absl::StatusOr<QuantizedMatrix> QuantizedMatrix::FromF32(const float* w, int64_t rows, int64_t cols,
                                                         WeightFormat format) {
  if (format == WeightFormat::kMxfp4) {
    return absl::UnimplementedError(
        "MXFP4 weights come from the checkpoint as they are; they are never re-encoded");
  }
  if (absl::Status s = CheckShape(rows, cols, format); !s.ok()) return s;
  if (w == nullptr && rows > 0) return absl::InvalidArgumentError("weights pointer is null");
  return QuantizeRows(rows, cols, format, [w, cols](int64_t r, float* out) {
    std::memcpy(out, w + r * cols, cols * sizeof(float));
  });
}

absl::StatusOr<QuantizedMatrix> QuantizedMatrix::FromBf16(const uint16_t* w, int64_t rows,
                                                          int64_t cols, WeightFormat format) {
  if (format == WeightFormat::kMxfp4) {
    return absl::UnimplementedError(
        "MXFP4 weights come from the checkpoint as they are; they are never re-encoded");
  }
  if (absl::Status s = CheckShape(rows, cols, format); !s.ok()) return s;
  if (w == nullptr && rows > 0) return absl::InvalidArgumentError("weights pointer is null");
  return QuantizeRows(rows, cols, format, [w, cols](int64_t r, float* out) {
    for (int64_t c = 0; c < cols; ++c) out[c] = Bf16ToF32(w[r * cols + c]);
  });
}

absl::StatusOr<QuantizedMatrix> QuantizedMatrix::DowncastInt8ToInt4(const MatrixView& in) {
  if (absl::Status s = ValidateView(in); !s.ok()) return s;
  if (in.format != WeightFormat::kInt8Row) {
    return absl::InvalidArgumentError(absl::StrCat(
        "int8 -> int4 downcast needs an int8 matrix, got ", WeightFormatName(in.format)));
  }
  if (absl::Status s = CheckShape(in.rows, in.cols, WeightFormat::kInt4G64); !s.ok()) return s;
  const int64_t rows = in.rows, cols = in.cols;
  QuantizedMatrix m;
  m.format_ = WeightFormat::kInt4G64;
  m.rows_ = rows;
  m.cols_ = cols;
  m.data_.resize(static_cast<size_t>(rows) * cols / 2);
  m.scales_.resize(static_cast<size_t>(rows) * cols / 64 * sizeof(float));
  float* out_scales = reinterpret_cast<float*>(m.scales_.data());
  const int8_t* q8 = static_cast<const int8_t*>(in.data);
  const float* s8 = static_cast<const float*>(in.scales);
  for (int64_t r = 0; r < rows; ++r) {
    if (!std::isfinite(s8[r])) {
      return absl::InvalidArgumentError(absl::StrCat("row ", r, ": non-finite int8 scale"));
    }
    for (int64_t g = 0; g < cols / 64; ++g) {
      const int8_t* q = q8 + r * cols + g * 64;
      int max_q = 0;
      for (int i = 0; i < 64; ++i) max_q = std::max(max_q, std::abs(static_cast<int>(q[i])));
      float v[64];
      for (int i = 0; i < 64; ++i) v[i] = static_cast<float>(q[i]) * s8[r];
      const float s = FlooredScale(static_cast<float>(max_q) * s8[r], 7.f);
      int32_t q4[64];
      QuantizeWithScale(v, 64, s, -8, 7, q4);
      uint8_t* p = m.data_.data() + r * cols / 2 + g * 32;
      for (int i = 0; i < 32; ++i) {
        p[i] = static_cast<uint8_t>((q4[2 * i] + 8) | ((q4[2 * i + 1] + 8) << 4));
      }
      out_scales[r * (cols / 64) + g] = s;
    }
  }
  return m;
}

absl::StatusOr<QuantizedMatrix> QuantizedMatrix::FromParts(WeightFormat format, int64_t rows,
                                                           int64_t cols, Bytes data, Bytes scales) {
  if (absl::Status s = CheckShape(rows, cols, format); !s.ok()) return s;
  const MatrixBytes want = FormatBytes(format, rows, cols);
  const size_t want_data = want.data, want_scales = want.scales;
  if (data.size() != want_data || scales.size() != want_scales) {
    return absl::InvalidArgumentError(absl::StrCat(WeightFormatName(format), " [", rows, ", ", cols,
                                                   "]: expected ", want_data, " data bytes and ",
                                                   want_scales, " scale bytes, got ", data.size(),
                                                   " and ", scales.size()));
  }
  QuantizedMatrix m;
  m.format_ = format;
  m.rows_ = rows;
  m.cols_ = cols;
  m.data_ = std::move(data);
  m.scales_ = std::move(scales);
  return m;
}

}  // namespace coli::kernels
