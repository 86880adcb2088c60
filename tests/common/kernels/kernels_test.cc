// Tests of common/kernels: formats bit-exact against hand-computed cases and the spec's rules,
// every SIMD path bit-identical to the scalar reference, and every path against an independent
// double-precision reference written here from spec §4.
#include "common/kernels/kernels.h"

#include <cpuid.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/kernels/internal.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace coli::kernels {
namespace {

using ::testing::HasSubstr;

uint32_t Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

// ---- Independent reference decoders (spec §4, written from the text, not from the library) ----

double RefE2m1(int code) {
  static const double kMag[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};
  return (code & 8) ? -kMag[code & 7] : kMag[code & 7];
}
// colibri's float_from_bits(s << 23): 2^(s-127) for 1 <= s <= 254, +0 for 0, inf for 255.
double RefE8m0(int s) {
  if (s == 0) return 0.0;
  if (s == 255) return std::numeric_limits<double>::infinity();
  return std::ldexp(1.0, s - 127);
}

// Memory that ends right before a PROT_NONE page: reading one byte past the end faults.
class Guarded {
 public:
  explicit Guarded(size_t bytes) {
    const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    const size_t data_pages = (bytes + page - 1) / page;
    total_ = (data_pages + 1) * page;
    base_ = static_cast<uint8_t*>(
        mmap(nullptr, total_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
    EXPECT_NE(base_, MAP_FAILED);
    mprotect(base_ + data_pages * page, page, PROT_NONE);
    ptr_ = base_ + data_pages * page - bytes;
  }
  ~Guarded() { munmap(base_, total_); }
  uint8_t* data() { return ptr_; }

 private:
  size_t total_;
  uint8_t* base_;
  uint8_t* ptr_;
};

// A random matrix of `format` placed in guarded memory.
struct TestMatrix {
  WeightFormat format;
  int64_t rows, cols;
  std::unique_ptr<Guarded> data, scales;
  MatrixView view() const {
    return MatrixView{format, rows, cols, data->data(),
                      scales ? static_cast<const void*>(scales->data()) : nullptr};
  }
};

TestMatrix MakeMatrix(WeightFormat format, int64_t rows, int64_t cols, std::mt19937& rng) {
  TestMatrix m{format, rows, cols, nullptr, nullptr};
  std::normal_distribution<float> normal(0.f, 1.f);
  std::uniform_int_distribution<int> byte(0, 255);
  const size_t n = static_cast<size_t>(rows * cols);
  switch (format) {
    case WeightFormat::kF32: {
      m.data = std::make_unique<Guarded>(n * 4);
      float* f = reinterpret_cast<float*>(m.data->data());
      for (size_t i = 0; i < n; ++i) f[i] = normal(rng);
      break;
    }
    case WeightFormat::kInt8Row: {
      m.data = std::make_unique<Guarded>(n);
      m.scales = std::make_unique<Guarded>(rows * 4);
      for (size_t i = 0; i < n; ++i)
        m.data->data()[i] = static_cast<uint8_t>(byte(rng) % 255 + 129);
      float* s = reinterpret_cast<float*>(m.scales->data());
      for (int64_t r = 0; r < rows; ++r) s[r] = 0.01f * (1.f + std::fabs(normal(rng)));
      break;
    }
    case WeightFormat::kInt4G64: {
      m.data = std::make_unique<Guarded>(n / 2);
      m.scales = std::make_unique<Guarded>(n / 64 * 4);
      for (size_t i = 0; i < n / 2; ++i) m.data->data()[i] = static_cast<uint8_t>(byte(rng));
      float* s = reinterpret_cast<float*>(m.scales->data());
      for (size_t g = 0; g < n / 64; ++g) s[g] = 0.1f * (1.f + std::fabs(normal(rng)));
      break;
    }
    case WeightFormat::kMxfp4: {
      m.data = std::make_unique<Guarded>(n / 2);
      m.scales = std::make_unique<Guarded>(n / 32);
      for (size_t i = 0; i < n / 2; ++i) m.data->data()[i] = static_cast<uint8_t>(byte(rng));
      std::uniform_int_distribution<int> exponent(118, 130);
      for (size_t g = 0; g < n / 32; ++g) m.scales->data()[g] = static_cast<uint8_t>(exponent(rng));
      break;
    }
  }
  return m;
}

// W[r, c] in double, decoded here from the spec's rules.
double RefWeight(const TestMatrix& m, int64_t r, int64_t c) {
  const int64_t cols = m.cols;
  switch (m.format) {
    case WeightFormat::kF32:
      return reinterpret_cast<const float*>(m.data->data())[r * cols + c];
    case WeightFormat::kInt8Row:
      return static_cast<int8_t>(m.data->data()[r * cols + c]) *
             static_cast<double>(reinterpret_cast<const float*>(m.scales->data())[r]);
    case WeightFormat::kInt4G64: {
      const uint8_t byte = m.data->data()[(r * cols + c) / 2];
      const int nib = (c % 2 == 0) ? (byte & 15) : (byte >> 4);
      return (nib - 8) * static_cast<double>(
                             reinterpret_cast<const float*>(m.scales->data())[(r * cols + c) / 64]);
    }
    case WeightFormat::kMxfp4: {
      const uint8_t byte = m.data->data()[(r * cols + c) / 2];
      const int nib = (c % 2 == 0) ? (byte & 15) : (byte >> 4);
      return RefE2m1(nib) * RefE8m0(m.scales->data()[(r * cols + c) / 32]);
    }
  }
  return 0;
}

// Activation quantization written from the spec text (per group: s = max|x|/127 floored at
// 1e-20, q = rint(x * (1/s)) half-even, clamp ±127); returns the dequantized values q*s.
std::vector<double> RefQuantizedActivations(const std::vector<float>& x, int64_t cols, int group) {
  std::vector<double> out(x.size());
  for (size_t r0 = 0; r0 < x.size(); r0 += cols) {
    for (int64_t g0 = 0; g0 < cols; g0 += group) {
      const int64_t g1 = std::min<int64_t>(cols, g0 + group);
      float m = 0;
      for (int64_t c = g0; c < g1; ++c) m = std::max(m, std::fabs(x[r0 + c]));
      float s = m / 127.f;
      if (s < 1e-20f) s = 1e-20f;
      const float inv = 1.f / s;
      for (int64_t c = g0; c < g1; ++c) {
        float q = std::nearbyint(x[r0 + c] * inv);
        q = std::min(127.f, std::max(-127.f, q));
        out[r0 + c] = static_cast<double>(q) * s;
      }
    }
  }
  return out;
}

double RelL2(const std::vector<float>& got, const std::vector<double>& want) {
  double num = 0, den = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    num += (got[i] - want[i]) * (got[i] - want[i]);
    den += want[i] * want[i];
  }
  return std::sqrt(num / std::max(den, 1e-300));
}

std::vector<Isa> SupportedIsas() {
  std::vector<Isa> isas = {Isa::kScalar};
  for (Isa isa : {Isa::kAvx2, Isa::kAvxVnni, Isa::kAvx512}) {
    if (internal::IsaSupported(isa)) isas.push_back(isa);
  }
  return isas;
}

// cpuid straight from the instruction (not through the library's detection).
bool CpuidBit(unsigned leaf, unsigned subleaf, int reg, int bit) {
  unsigned r[4] = {0, 0, 0, 0};
  if (__get_cpuid_count(leaf, subleaf, &r[0], &r[1], &r[2], &r[3]) == 0) return false;
  return (r[reg] >> bit) & 1u;
}

// ---------------------------------- formats ----------------------------------

TEST(KernelFormats, Bf16ToF32) {
  EXPECT_EQ(Bf16ToF32(0x3F80), 1.0f);
  EXPECT_EQ(Bf16ToF32(0xC000), -2.0f);
  EXPECT_EQ(Bf16ToF32(0x0000), 0.0f);
  EXPECT_EQ(Bits(Bf16ToF32(0x8000)), 0x80000000u);
  EXPECT_EQ(Bf16ToF32(0x3FC0), 1.5f);
  EXPECT_TRUE(std::isinf(Bf16ToF32(0x7F80)));
  EXPECT_TRUE(std::isnan(Bf16ToF32(0x7FC0)));
}

TEST(KernelFormats, E2m1AllCodes) {
  const float want[16] = {0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0f, -0.5, -1, -1.5, -2, -3, -4, -6};
  for (int c = 0; c < 16; ++c) {
    EXPECT_EQ(Bits(E2m1ToF32(static_cast<uint8_t>(c))), Bits(want[c])) << "code " << c;
  }
}

TEST(KernelFormats, E8m0Scales) {
  EXPECT_EQ(E8m0ToF32(127), 1.0f);
  EXPECT_EQ(E8m0ToF32(128), 2.0f);
  EXPECT_EQ(E8m0ToF32(120), 1.0f / 128);
  EXPECT_EQ(E8m0ToF32(1), std::ldexp(1.0f, -126));
  EXPECT_EQ(Bits(E8m0ToF32(0)), 0u);  // colibri: bits 0 -> +0 (true value 2^-127)
  EXPECT_TRUE(std::isinf(E8m0ToF32(255)));
}

TEST(KernelFormats, Mxfp4DecodeEveryCodeTimesSeveralScales) {
  // One row of 64 columns: group 0 holds codes 0..15 twice (low nibble = even column), group 1
  // the codes in reverse; scales vary per case.
  const int scales[] = {1, 100, 126, 127, 128, 140, 254};
  for (int s0 : scales) {
    for (int s1 : scales) {
      uint8_t packed[32];
      for (int j = 0; j < 16; ++j) {
        const int even = (2 * j) % 16, odd = (2 * j + 1) % 16;
        packed[j] = static_cast<uint8_t>(even | (odd << 4));
        packed[16 + j] = static_cast<uint8_t>((15 - even) | ((15 - odd) << 4));
      }
      const uint8_t sc[2] = {static_cast<uint8_t>(s0), static_cast<uint8_t>(s1)};
      MatrixView v{WeightFormat::kMxfp4, 1, 64, packed, sc};
      float out[64];
      DequantizeRow(v, 0, out);
      for (int c = 0; c < 64; ++c) {
        const int code = c < 32 ? c % 16 : 15 - c % 16;
        const double want = RefE2m1(code) * RefE8m0(c < 32 ? s0 : s1);
        // f32 result of the exact product (6·2^127 overflows to inf, as in colibri).
        EXPECT_EQ(out[c], static_cast<float>(want)) << "col " << c << " s " << s0 << "/" << s1;
        EXPECT_EQ(std::signbit(out[c]), (code & 8) != 0) << "col " << c;
      }
    }
  }
}

TEST(KernelFormats, Int8HandComputedTiesAndClamp) {
  // max |w| = 254 -> s = 2, 1/s = 0.5: 127*0.5 = 63.5 -> 64, 1*0.5 -> 0 (tie to even),
  // 3*0.5 = 1.5 -> 2, 5*0.5 = 2.5 -> 2, -1*0.5 -> -0, 7*0.5 = 3.5 -> 4.
  const std::vector<float> w = {-254, 127, 1, 3, 5, -1, 7, 0};
  int8_t q[8];
  float s;
  ASSERT_TRUE(QuantizeRowInt8(w, q, &s).ok());
  EXPECT_EQ(s, 2.0f);
  const int8_t want[8] = {-127, 64, 0, 2, 2, 0, 4, 0};
  for (int i = 0; i < 8; ++i) EXPECT_EQ(q[i], want[i]) << i;
}

TEST(KernelFormats, Int8ZerosAllEqualAndDenormals) {
  int8_t q[4];
  float s;
  ASSERT_TRUE(QuantizeRowInt8(std::vector<float>{0, 0, -0.0f, 0}, q, &s).ok());
  EXPECT_EQ(s, 1e-20f);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(q[i], 0);
  ASSERT_TRUE(QuantizeRowInt8(std::vector<float>{3, 3, 3, 3}, q, &s).ok());
  EXPECT_EQ(s, 3.0f / 127.0f);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(q[i], 127);
  ASSERT_TRUE(QuantizeRowInt8(std::vector<float>{-2, -2, -2, -2}, q, &s).ok());
  for (int i = 0; i < 4; ++i) EXPECT_EQ(q[i], -127);
  // Denormals: 1e-40/127 is below the floor, so s = 1e-20 and every code rounds to 0.
  ASSERT_TRUE(QuantizeRowInt8(std::vector<float>{1e-40f, -1e-41f, 0, 1e-45f}, q, &s).ok());
  EXPECT_EQ(s, 1e-20f);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(q[i], 0);
  // Just above the floor: max = 2.54e-18 -> s = 2e-20, values land on exact codes.
  ASSERT_TRUE(QuantizeRowInt8(std::vector<float>{2.54e-18f, -1.27e-18f, 0, 0}, q, &s).ok());
  EXPECT_EQ(s, 2.54e-18f / 127.f);
  EXPECT_EQ(q[0], 127);
  EXPECT_EQ(q[1], -64);  // -63.5 rounds half to even
}

TEST(KernelFormats, NonFiniteRefused) {
  int8_t q[4];
  float s;
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (float bad : {inf, -inf, nan}) {
    absl::Status st = QuantizeRowInt8(std::vector<float>{1, 2, bad, 4}, q, &s);
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(st.message()), HasSubstr("column 2"));
    std::vector<float> w(2 * 64, 0.5f);
    w[64 + 5] = bad;
    for (WeightFormat f : {WeightFormat::kInt8Row, WeightFormat::kInt4G64, WeightFormat::kF32}) {
      auto m = QuantizedMatrix::FromF32(w.data(), 2, 64, f);
      ASSERT_FALSE(m.ok());
      EXPECT_THAT(std::string(m.status().message()), HasSubstr("row 1"));
      EXPECT_THAT(std::string(m.status().message()), HasSubstr("column 5"));
    }
    std::vector<float> x(64, 1.f);
    x[7] = bad;
    int8_t xq[64];
    float xs[1];
    EXPECT_FALSE(QuantizeActivationsInt8Groups(x, 32, xq, xs).ok());
  }
  std::vector<uint16_t> bf(64, 0x3F80);
  bf[3] = 0x7F80;  // +inf
  EXPECT_FALSE(QuantizedMatrix::FromBf16(bf.data(), 1, 64, WeightFormat::kInt8Row).ok());
}

TEST(KernelFormats, Int4HandComputed) {
  // max |w| = 7 -> s = 1: 7 -> 7, -3.5 -> -4 (tie to even), 2.5 -> 2, -7 -> -7, 0.5 -> 0.
  std::vector<float> w(64, 0.f);
  w[0] = 7;
  w[1] = -3.5f;
  w[2] = 2.5f;
  w[3] = -7;
  w[4] = 0.5f;
  uint8_t packed[32];
  float s;
  ASSERT_TRUE(QuantizeRowInt4G64(w, packed, &s).ok());
  EXPECT_EQ(s, 1.0f);
  EXPECT_EQ(packed[0], 0x4F);  // low nibble 7+8, high nibble -4+8
  EXPECT_EQ(packed[1], 0x1A);  // 2+8, -7+8
  EXPECT_EQ(packed[2], 0x88);  // 0+8, 0+8
  for (int i = 3; i < 32; ++i) EXPECT_EQ(packed[i], 0x88);
}

TEST(KernelFormats, Int4ZeroGroupAndShapeRefusal) {
  std::vector<float> w(128, 0.f);
  for (int i = 64; i < 128; ++i) w[i] = -1.f;
  uint8_t packed[64];
  float s[2];
  ASSERT_TRUE(QuantizeRowInt4G64(w, packed, s).ok());
  EXPECT_EQ(s[0], 1e-20f);
  EXPECT_EQ(s[1], 1.f / 7.f);
  EXPECT_EQ(packed[0], 0x88);
  EXPECT_EQ(packed[32], 0x11);  // -7 + 8 twice
  auto bad = QuantizedMatrix::FromF32(w.data(), 1, 96, WeightFormat::kInt4G64);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("cols % 64"));
  auto mx = QuantizedMatrix::FromF32(w.data(), 1, 64, WeightFormat::kMxfp4);
  EXPECT_EQ(mx.status().code(), absl::StatusCode::kUnimplemented);
}

TEST(KernelFormats, FromBf16MatchesFromF32) {
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.f, 1.f);
  std::vector<uint16_t> bf(3 * 128);
  std::vector<float> f(bf.size());
  for (size_t i = 0; i < bf.size(); ++i) {
    float v = normal(rng);
    uint32_t u;
    std::memcpy(&u, &v, 4);
    bf[i] = static_cast<uint16_t>(u >> 16);
    f[i] = Bf16ToF32(bf[i]);
  }
  for (WeightFormat fmt : {WeightFormat::kF32, WeightFormat::kInt8Row, WeightFormat::kInt4G64}) {
    auto a = QuantizedMatrix::FromBf16(bf.data(), 3, 128, fmt);
    auto b = QuantizedMatrix::FromF32(f.data(), 3, 128, fmt);
    ASSERT_TRUE(a.ok() && b.ok());
    EXPECT_EQ(a->data(), b->data());
    EXPECT_EQ(a->scales(), b->scales());
    EXPECT_EQ(a->bytes(), ViewBytes(a->view()));
  }
}

TEST(KernelFormats, DowncastEqualsInt4OfDequantizedInt8) {
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.f, 1.f);
  const int64_t rows = 5, cols = 192;
  std::vector<float> w(rows * cols);
  for (float& v : w) v = normal(rng);
  for (int c = 0; c < 64; ++c) w[2 * cols + c] = 0.f;  // an all-zero group
  auto q8 = QuantizedMatrix::FromF32(w.data(), rows, cols, WeightFormat::kInt8Row);
  ASSERT_TRUE(q8.ok());
  auto q4 = QuantizedMatrix::DowncastInt8ToInt4(q8->view());
  ASSERT_TRUE(q4.ok()) << q4.status();
  std::vector<float> deq(rows * cols);
  for (int64_t r = 0; r < rows; ++r) DequantizeRow(q8->view(), r, deq.data() + r * cols);
  auto direct = QuantizedMatrix::FromF32(deq.data(), rows, cols, WeightFormat::kInt4G64);
  ASSERT_TRUE(direct.ok());
  EXPECT_EQ(q4->data(), direct->data());
  EXPECT_EQ(q4->scales(), direct->scales());
  // Hand case: one group, q8 = [-127 .. ] with s8 = 0.5: s = 127*0.5/7, q4 = rint(q8*0.5/s).
  QuantizedMatrix::Bytes d(64, 0);
  d[0] = static_cast<uint8_t>(-127);
  d[1] = 18;  // 18*0.5 / (63.5/7) = 0.992 -> 1
  d[2] = 27;  // 1.488 -> 1
  float half = 0.5f;
  QuantizedMatrix::Bytes sb(4);
  std::memcpy(sb.data(), &half, 4);
  auto one = QuantizedMatrix::FromParts(WeightFormat::kInt8Row, 1, 64, d, sb);
  ASSERT_TRUE(one.ok());
  auto one4 = QuantizedMatrix::DowncastInt8ToInt4(one->view());
  ASSERT_TRUE(one4.ok());
  EXPECT_EQ(one4->data()[0], static_cast<uint8_t>((-7 + 8) | ((1 + 8) << 4)));
  EXPECT_EQ(one4->data()[1], static_cast<uint8_t>((1 + 8) | (8 << 4)));
  auto odd = QuantizedMatrix::FromF32(w.data(), 1, 96, WeightFormat::kInt8Row);
  ASSERT_TRUE(odd.ok());
  EXPECT_FALSE(QuantizedMatrix::DowncastInt8ToInt4(odd->view()).ok());
}

TEST(KernelFormats, FromPartsChecksSizes) {
  auto bad = QuantizedMatrix::FromParts(WeightFormat::kInt4G64, 2, 64, QuantizedMatrix::Bytes(64),
                                        QuantizedMatrix::Bytes(4));
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("expected 64 data bytes and 8"));
}

// Rounding of the quantizers on every half-integer tie and on random values: with a group whose
// max|x| is 127 the scale is 1, so each code must be nearbyint(x) (half to even).
TEST(KernelFormats, ActivationRoundingMatchesNearbyint) {
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> uni(-127.f, 127.f);
  std::vector<float> x;
  for (int t = -254; t <= 254; ++t) x.push_back(0.5f * static_cast<float>(t));  // every tie
  while (x.size() % 64 != 0 || x.size() < 4096) x.push_back(uni(rng));
  for (size_t g = 0; g < x.size(); g += 64) x[g] = 127.f;  // scale exactly 1 in every group
  std::vector<int8_t> q(x.size());
  std::vector<float> s(x.size() / 64);
  ASSERT_TRUE(QuantizeActivationsInt8Groups(x, 64, q.data(), s.data()).ok());
  for (size_t i = 0; i < x.size(); ++i) {
    ASSERT_EQ(s[i / 64], 1.f);
    EXPECT_EQ(q[i], static_cast<int8_t>(std::nearbyint(x[i]))) << "x = " << x[i];
  }
}

TEST(KernelFormats, ActivationQuantizationHandComputed) {
  // Group of 4: max 12.7 -> s = 0.1; values 0.05/0.1 = 0.5 -> 0 (even), 0.15 -> 1.5 -> 2,
  // -12.7 -> -127. Second group (short tail of 2): all zeros -> s = 1e-20.
  std::vector<float> x = {0.05f, 0.15f, 12.7f, -12.7f, 0.f, 0.f};
  int8_t q[6];
  float s[2];
  ASSERT_TRUE(QuantizeActivationsInt8Groups(x, 4, q, s).ok());
  EXPECT_EQ(s[0], 12.7f / 127.f);
  EXPECT_EQ(s[1], 1e-20f);
  const float inv = 1.f / s[0];
  EXPECT_EQ(q[0], static_cast<int8_t>(std::nearbyint(0.05f * inv)));
  EXPECT_EQ(q[2], 127);
  EXPECT_EQ(q[3], -127);
  EXPECT_EQ(q[4], 0);
  // Exact ties: max 127 -> s = 1: 0.5 -> 0, 1.5 -> 2, 2.5 -> 2, -3.5 -> -4.
  std::vector<float> t = {127, 0.5f, 1.5f, 2.5f, -3.5f};
  int8_t tq[5];
  float ts[1];
  ASSERT_TRUE(QuantizeActivationsInt8Groups(t, 8, tq, ts).ok());
  EXPECT_EQ(ts[0], 1.f);
  const int8_t want[5] = {127, 0, 2, 2, -4};
  for (int i = 0; i < 5; ++i) EXPECT_EQ(tq[i], want[i]) << i;
}

// The block layout of internal.h (Prepared) built here from the scalar quantizer's codes and
// scales, to check the SIMD preparations against.
struct PreparedRow {
  std::vector<int8_t> xq;
  std::vector<int32_t> corr;
  std::vector<float> xs, xg;
};

PreparedRow RefPreparedRow(WeightFormat f, const std::vector<float>& x) {
  const int64_t cols = static_cast<int64_t>(x.size());
  const int group = f == WeightFormat::kMxfp4 ? 32 : 64;
  const int64_t block = f == WeightFormat::kInt8Row ? 64 : 128;
  const int64_t nblocks = (cols + block - 1) / block, groups = (cols + group - 1) / group;
  std::vector<int8_t> q(cols);
  std::vector<float> s(groups);
  EXPECT_TRUE(QuantizeActivationsInt8Groups(x, group, q.data(), s.data()).ok());
  PreparedRow r{std::vector<int8_t>(nblocks * block), std::vector<int32_t>(nblocks * 16),
                std::vector<float>(nblocks * 16), std::vector<float>((groups + 15) / 16 * 16)};
  const int bias = f == WeightFormat::kInt8Row ? 128 : f == WeightFormat::kMxfp4 ? 12 : 8;
  // Lane l of block k covers: MXFP4 group 4k + l/4, columns 8(l%4)..+7; int4 group 2k + l/8,
  // columns 8(l%8)..+7; int8 columns 64k + 4l..+3. Bytes: even columns first, then odd ones
  // (MXFP4 16 per group, int4 32 per group), int8 in column order.
  for (int64_t c = 0; c < cols; ++c) {
    const int64_t g = c / group, k = c / block, cg = c % group;
    int64_t byte, lane;
    if (f == WeightFormat::kInt8Row) {
      byte = c % 64;
      lane = byte / 4;
    } else {
      const int64_t j = g % (block / group);
      byte = (cg % 2) * 64 + j * (group / 2) + cg / 2;
      lane = j * (group / 8) + cg / 8;
    }
    r.xq[k * block + byte] = q[c];
    r.corr[k * 16 + lane] -= bias * q[c];
  }
  for (int64_t k = 0; k < nblocks; ++k) {
    for (int l = 0; l < 16; ++l) {
      const int64_t g = f == WeightFormat::kInt8Row ? k
                        : f == WeightFormat::kMxfp4 ? 4 * k + l / 4
                                                    : 2 * k + l / 8;
      if (g < groups) r.xs[k * 16 + l] = (f == WeightFormat::kMxfp4 ? 0.5f : 1.f) * s[g];
    }
  }
  for (int64_t g = 0; g < groups; ++g) r.xg[g] = (f == WeightFormat::kMxfp4 ? 0.5f : 1.f) * s[g];
  return r;
}

// The AVX2 (and AVX-512) activation preparations give exactly the scalar quantizer's codes and
// scales in the block layout: ties, zeros, denormals, huge values, short tails.
TEST(KernelPrepare, SimdPreparationEqualsScalar) {
  std::mt19937 rng(31);
  std::normal_distribution<float> normal(0.f, 1.f);
  const float denorm = std::numeric_limits<float>::denorm_min();
  const float fmax = std::numeric_limits<float>::max();
  for (WeightFormat f : {WeightFormat::kMxfp4, WeightFormat::kInt4G64, WeightFormat::kInt8Row}) {
    const std::vector<int64_t> widths =
        f == WeightFormat::kMxfp4     ? std::vector<int64_t>{32, 96, 160, 32 * 71}
        : f == WeightFormat::kInt4G64 ? std::vector<int64_t>{64, 192, 64 * 35}
                                      : std::vector<int64_t>{1, 5, 63, 64, 65, 130, 64 * 33 + 5};
    for (int64_t cols : widths) {
      for (int kind = 0; kind < 6; ++kind) {
        std::vector<float> x(cols);
        for (int64_t c = 0; c < cols; ++c) {
          switch (kind) {
            case 0:  // Gaussian
              x[c] = normal(rng);
              break;
            case 1:  // every half-integer tie with scale exactly 1 (max 127 first in each group)
              x[c] = c % 32 == 0 ? 127.f : 0.5f * static_cast<float>(c % 255 - 127);
              break;
            case 2:  // zeros (scale floored at 1e-20), signed zeros
              x[c] = c % 3 == 0 ? -0.f : 0.f;
              break;
            case 3:  // denormals, some next to a tiny normal maximum
              x[c] = static_cast<float>(c % 7) * denorm * (c % 2 ? -1.f : 1.f) +
                     (c % 11 == 0 ? 1e-19f : 0.f);
              break;
            case 4:  // huge values up to FLT_MAX
              x[c] = (c % 5 == 0 ? fmax : normal(rng) * 1e37f) * (c % 2 ? -1.f : 1.f);
              break;
            default:  // mixed magnitudes within a group
              x[c] = normal(rng) * std::ldexp(1.f, static_cast<int>(c % 40) - 20);
              break;
          }
        }
        const PreparedRow want = RefPreparedRow(f, x);
        const int64_t block = f == WeightFormat::kInt8Row ? 64 : 128;
        const int64_t nblocks = (cols + block - 1) / block;
        using PrepareFn = bool (*)(WeightFormat, int64_t, const float*, int64_t, int8_t*,
                                   int32_t*, float*, float*);
        std::vector<std::pair<Isa, PrepareFn>> preps;
        if (internal::IsaSupported(Isa::kAvx2)) {
          preps.emplace_back(Isa::kAvx2, internal::PrepareIdotRowAvx2);
        }
        if (internal::IsaSupported(Isa::kAvx512)) {
          preps.emplace_back(Isa::kAvx512, internal::PrepareIdotRowAvx512);
        }
        for (const auto& [isa, prep] : preps) {
          const std::string what = std::string(IsaName(isa)) + " " + WeightFormatName(f) +
                                   " cols " + std::to_string(cols) + " kind " +
                                   std::to_string(kind);
          // 64-byte aligned, zeroed buffers, as matmul.cc gives them.
          internal::Scratch bq, bc, bs, bg;
          auto* xq = static_cast<int8_t*>(bq.Zeroed(want.xq.size()));
          auto* corr = static_cast<int32_t*>(bc.Zeroed(want.corr.size() * sizeof(int32_t)));
          auto* xs = static_cast<float*>(bs.Zeroed(want.xs.size() * sizeof(float)));
          auto* xg = static_cast<float*>(bg.Zeroed(want.xg.size() * sizeof(float)));
          ASSERT_TRUE(prep(f, cols, x.data(), nblocks, xq, corr, xs, xg)) << what;
          EXPECT_EQ(std::vector<int8_t>(xq, xq + want.xq.size()), want.xq) << what;
          EXPECT_EQ(std::vector<int32_t>(corr, corr + want.corr.size()), want.corr) << what;
          for (size_t i = 0; i < want.xs.size(); ++i) {
            ASSERT_EQ(Bits(xs[i]), Bits(want.xs[i])) << what << " xs " << i;
          }
          for (size_t i = 0; i < want.xg.size(); ++i) {
            ASSERT_EQ(Bits(xg[i]), Bits(want.xg[i])) << what << " xg " << i;
          }
          // A non-finite value anywhere is refused.
          for (float bad : {std::numeric_limits<float>::quiet_NaN(),
                            -std::numeric_limits<float>::infinity()}) {
            std::vector<float> xb = x;
            xb[cols - 1] = bad;
            EXPECT_FALSE(prep(f, cols, xb.data(), nblocks, xq, corr, xs, xg)) << what;
          }
        }
      }
    }
  }
}

// ---------------------------------- matmul ----------------------------------

struct Shape {
  int64_t rows, cols;
};

std::vector<Shape> ShapesFor(WeightFormat f) {
  switch (f) {
    case WeightFormat::kMxfp4:
      // The last two reach the batch-1 kernels' main loops (16 groups at a time) and their tails.
      return {{1, 32},  {3, 64},   {5, 96},      {4, 128},     {7, 160},
              {9, 224}, {13, 512}, {2, 32 * 13}, {3, 32 * 71}, {2, 1024}};
    case WeightFormat::kInt4G64:
      return {{1, 64},   {3, 128},    {5, 192},     {6, 320},
              {11, 512}, {2, 64 * 9}, {3, 64 * 35}, {2, 2048}};
    default:
      return {{1, 1},   {2, 5},   {3, 16},   {5, 63},   {4, 64},         {7, 65},
              {9, 130}, {6, 200}, {10, 513}, {2, 1024}, {3, 64 * 33 + 5}};
  }
}

void ExpectBitEqual(const std::vector<float>& a, const std::vector<float>& b,
                    const std::string& what) {
  ASSERT_EQ(a.size(), b.size());
  int bad = 0;
  for (size_t i = 0; i < a.size() && bad < 5; ++i) {
    if (Bits(a[i]) != Bits(b[i])) {
      ADD_FAILURE() << what << " index " << i << ": " << a[i] << " vs scalar " << b[i];
      ++bad;
    }
  }
}

// Every ISA x format x mode on odd shapes: bit-identical to the scalar reference, and the scalar
// reference within float rounding of an independent double-precision computation.
TEST(KernelMatmul, EveryPathMatchesScalarAndDoubleReference) {
  std::mt19937 rng(1234);
  std::normal_distribution<float> normal(0.f, 1.f);
  for (WeightFormat f :
       {WeightFormat::kF32, WeightFormat::kInt8Row, WeightFormat::kInt4G64, WeightFormat::kMxfp4}) {
    for (const Shape& shape : ShapesFor(f)) {
      TestMatrix m = MakeMatrix(f, shape.rows, shape.cols, rng);
      for (int64_t batch : {1, 2, 3, 9}) {
        std::vector<float> x(batch * shape.cols);
        for (float& v : x) v = normal(rng);
        for (bool idot : {false, true}) {
          const std::string what = std::string(WeightFormatName(f)) +
                                   (idot ? " idot " : " float ") + std::to_string(shape.rows) +
                                   "x" + std::to_string(shape.cols) + " batch " +
                                   std::to_string(batch);
          std::vector<float> ref(batch * shape.rows, -1.f);
          ASSERT_TRUE(internal::MatmulWithIsa(Isa::kScalar, m.view(), x.data(), batch, ref.data(),
                                              {idot, 1})
                          .ok());
          // Independent double reference (with the spec's activation quantization for idot).
          const bool quantized = idot && f != WeightFormat::kF32;
          const std::vector<double> xd =
              quantized
                  ? RefQuantizedActivations(x, shape.cols, f == WeightFormat::kMxfp4 ? 32 : 64)
                  : std::vector<double>(x.begin(), x.end());
          std::vector<double> want(batch * shape.rows), abs_sums(batch * shape.rows);
          for (int64_t b = 0; b < batch; ++b) {
            for (int64_t r = 0; r < shape.rows; ++r) {
              double acc = 0, abs_sum = 0;
              for (int64_t c = 0; c < shape.cols; ++c) {
                const double t = RefWeight(m, r, c) * xd[b * shape.cols + c];
                acc += t;
                abs_sum += std::fabs(t);
              }
              want[b * shape.rows + r] = acc;
              abs_sums[b * shape.rows + r] = abs_sum;
            }
          }
          // f32 accumulation in 16 lanes of cols/16 terms plus a 4-level tree: the error is at
          // most ~(cols/16 + 8)·eps·Σ|terms|; checked element-wise with that bound.
          for (size_t i = 0; i < want.size(); ++i) {
            EXPECT_NEAR(ref[i], want[i], 1.2e-7 * (shape.cols / 16.0 + 8) * abs_sums[i] + 1e-30)
                << what << " index " << i;
          }
          EXPECT_LE(RelL2(ref, want), 1e-6) << what;
          for (Isa isa : SupportedIsas()) {
            if (isa == Isa::kScalar) continue;
            // 3 threads: more threads than cores, rows taken in chunks and stolen (matmul.cc).
            for (int threads : {1, 2, 3}) {
              std::vector<float> got(batch * shape.rows, -2.f);
              absl::Status st = internal::MatmulWithIsa(isa, m.view(), x.data(), batch, got.data(),
                                                        {idot, threads});
              ASSERT_TRUE(st.ok()) << st;
              ExpectBitEqual(got, ref, what + " " + IsaName(isa));
            }
          }
        }
      }
    }
  }
}

// Batch 1 with several weight rows read side by side (MatmulOptions::row_streams; AVX-512 and
// AVX2 / AVX-VNNI integer paths): bit-identical to the scalar reference for every stream count,
// thread count (chunk splits, stealing) and a row count that leaves a remainder for the one-row
// kernel; shapes reach the 16-group main loops and their tails.
TEST(KernelMatmul, BatchOneRowStreamsMatchScalar) {
  std::printf("default row streams: %d\n", DefaultRowStreams());
  // The measured rule (kernels.h): 4 on Intel CPUs running the AVX-512 kernels, else 2.
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  __get_cpuid(0, &eax, &ebx, &ecx, &edx);
  const bool intel = ebx == 0x756e6547 && edx == 0x49656e69 && ecx == 0x6c65746e;  // GenuineIntel
  const int measured = ActiveIsa() == Isa::kAvx512 && intel ? 4 : 2;
  EXPECT_EQ(DefaultRowStreams(),
            internal::ApplyRowStreamsOverride(std::getenv("COLI_ROW_STREAMS"), measured));
  std::mt19937 rng(77);
  std::normal_distribution<float> normal(0.f, 1.f);
  const std::pair<WeightFormat, int64_t> cases[] = {{WeightFormat::kMxfp4, 32 * 71},
                                                    {WeightFormat::kInt4G64, 64 * 35},
                                                    {WeightFormat::kInt8Row, 64 * 33 + 5},
                                                    {WeightFormat::kF32, 517}};
  for (const auto& [f, cols] : cases) {
    for (int64_t rows : {37, 70}) {
      TestMatrix m = MakeMatrix(f, rows, cols, rng);
      std::vector<float> x(cols);
      for (float& v : x) v = normal(rng);
      for (bool idot : {false, true}) {
        std::vector<float> ref(rows, -1.f);
        ASSERT_TRUE(
            internal::MatmulWithIsa(Isa::kScalar, m.view(), x.data(), 1, ref.data(), {idot, 1})
                .ok());
        for (Isa isa : SupportedIsas()) {
          for (int streams : {0, 1, 2, 4}) {
            for (int threads : {1, 2, 3}) {
              std::vector<float> got(rows, -2.f);
              const absl::Status st = internal::MatmulWithIsa(
                  isa, m.view(), x.data(), 1, got.data(),
                  {.idot = idot, .threads = threads, .row_streams = streams});
              ASSERT_TRUE(st.ok()) << st;
              ExpectBitEqual(
                  got, ref,
                  absl::StrCat(WeightFormatName(f), idot ? " idot " : " float ", rows, "x", cols,
                               " ", IsaName(isa), " streams ", streams, " threads ", threads));
            }
          }
        }
      }
    }
  }
}

TEST(KernelMatmul, BatchRowsEqualSingleRowCalls) {
  std::mt19937 rng(99);
  std::normal_distribution<float> normal(0.f, 1.f);
  for (WeightFormat f :
       {WeightFormat::kF32, WeightFormat::kInt8Row, WeightFormat::kInt4G64, WeightFormat::kMxfp4}) {
    // 2176 columns: 17 blocks of 128 (MXFP4, int4) or 34 of 64 (int8), so the batch-1 kernels run
    // their main loops and a tail.
    constexpr int64_t kCols = 2176;
    TestMatrix m = MakeMatrix(f, 21, kCols, rng);
    const int64_t batch = 11;
    std::vector<float> x(batch * kCols);
    for (float& v : x) v = normal(rng);
    for (Isa isa : SupportedIsas()) {
      for (bool idot : {false, true}) {
        std::vector<float> all(batch * 21);
        ASSERT_TRUE(
            internal::MatmulWithIsa(isa, m.view(), x.data(), batch, all.data(), {idot, 2}).ok());
        for (int64_t b = 0; b < batch; ++b) {
          std::vector<float> one(21);
          ASSERT_TRUE(internal::MatmulWithIsa(isa, m.view(), x.data() + b * kCols, 1, one.data(),
                                              {idot, 1})
                          .ok());
          for (int r = 0; r < 21; ++r) {
            EXPECT_EQ(Bits(one[r]), Bits(all[b * 21 + r]))
                << IsaName(isa) << " " << WeightFormatName(f) << " b " << b;
          }
        }
      }
    }
  }
}

// The int8-activation error of the MXFP4 idot path against the exact-float path, per group and
// per output, on Gaussian data: the seed states ~0.4 % per group.
TEST(KernelMatmul, Mxfp4IdotErrorIsBounded) {
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.f, 1.f);
  const int64_t rows = 64, cols = 2048, batch = 4;
  TestMatrix m = MakeMatrix(WeightFormat::kMxfp4, rows, cols, rng);
  std::vector<float> x(batch * cols);
  for (float& v : x) v = normal(rng);
  std::vector<float> exact(batch * rows), idot(batch * rows);
  ASSERT_TRUE(Matmul(m.view(), x.data(), batch, exact.data(), {false, 1}).ok());
  ASSERT_TRUE(Matmul(m.view(), x.data(), batch, idot.data(), {true, 1}).ok());
  std::vector<double> exact_d(exact.begin(), exact.end());
  const double out_err = RelL2(idot, exact_d);
  // Per group: relative L2 error of the quantized activations themselves.
  const std::vector<double> xq = RefQuantizedActivations(x, cols, 32);
  double worst_group = 0, sum_group = 0;
  const int64_t groups = batch * cols / 32;
  for (int64_t g = 0; g < groups; ++g) {
    double num = 0, den = 0;
    for (int c = 0; c < 32; ++c) {
      const double d = xq[g * 32 + c] - x[g * 32 + c];
      num += d * d;
      den += static_cast<double>(x[g * 32 + c]) * x[g * 32 + c];
    }
    const double e = std::sqrt(num / den);
    worst_group = std::max(worst_group, e);
    sum_group += e;
  }
  std::printf(
      "mxfp4 idot: output rel-L2 %.4f%%, activation error per group mean %.4f%% worst %.4f%%\n",
      100 * out_err, 100 * sum_group / groups, 100 * worst_group);
  EXPECT_GT(out_err, 0.0);    // the path really quantizes
  EXPECT_LT(out_err, 0.008);  // ~0.4 % expected
  EXPECT_LT(sum_group / groups, 0.008);
  EXPECT_LT(worst_group, 0.02);
}

TEST(KernelMatmul, RefusesBadInput) {
  std::vector<uint8_t> bytes(1024);
  std::vector<float> x(64, 1.f), y(64);
  MatrixView mx{WeightFormat::kMxfp4, 2, 48, bytes.data(), bytes.data()};
  absl::Status st = Matmul(mx, x.data(), 1, y.data());
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(st.message()), HasSubstr("cols % 32"));
  MatrixView i4{WeightFormat::kInt4G64, 2, 32, bytes.data(), bytes.data()};
  EXPECT_THAT(std::string(Matmul(i4, x.data(), 1, y.data()).message()), HasSubstr("cols % 64"));
  MatrixView nodata{WeightFormat::kInt8Row, 2, 32, nullptr, bytes.data()};
  EXPECT_THAT(std::string(Matmul(nodata, x.data(), 1, y.data()).message()), HasSubstr("null"));
  MatrixView noscale{WeightFormat::kInt8Row, 2, 32, bytes.data(), nullptr};
  EXPECT_THAT(std::string(Matmul(noscale, x.data(), 1, y.data()).message()), HasSubstr("scales"));
  MatrixView ok{WeightFormat::kInt8Row, 2, 32, bytes.data(), x.data()};
  EXPECT_EQ(Matmul(ok, x.data(), -1, y.data()).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Matmul(ok, nullptr, 1, y.data()).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Matmul(ok, x.data(), 1, y.data(), {true, -1}).code(),
            absl::StatusCode::kInvalidArgument);
  for (int streams : {-1, 3, 8}) {
    st = Matmul(ok, x.data(), 1, y.data(), {.row_streams = streams});
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << streams;
    EXPECT_THAT(std::string(st.message()), HasSubstr("row_streams")) << streams;
  }
  EXPECT_TRUE(Matmul(ok, x.data(), 0, y.data()).ok());
  MatrixView zero_cols{WeightFormat::kF32, 2, 0, bytes.data(), nullptr};
  EXPECT_FALSE(Matmul(zero_cols, x.data(), 1, y.data()).ok());
  // Non-finite activation with idot names the batch row.
  std::vector<float> x2(64, 1.f);
  x2[32 + 3] = std::numeric_limits<float>::quiet_NaN();
  st = Matmul(ok, x2.data(), 2, y.data(), {true, 1});
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(st.message()), HasSubstr("batch row 1"));
  // Two threads (batch rows prepared in parallel, then rows split): the lowest bad row is named.
  std::vector<int8_t> q8(8 * 32, 1);
  std::vector<float> s8(8, 1.f), x3(3 * 32, 1.f), y3(3 * 8);
  x3[32 + 5] = std::numeric_limits<float>::infinity();
  x3[64 + 7] = std::numeric_limits<float>::quiet_NaN();
  const MatrixView eight{WeightFormat::kInt8Row, 8, 32, q8.data(), s8.data()};
  for (Isa isa : SupportedIsas()) {
    st = internal::MatmulWithIsa(isa, eight, x3.data(), 3, y3.data(), {true, 2});
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << IsaName(isa);
    EXPECT_THAT(std::string(st.message()), HasSubstr("batch row 1")) << IsaName(isa);
  }
}

TEST(KernelIsa, RowStreamsOverride) {
  using internal::ApplyRowStreamsOverride;
  EXPECT_EQ(ApplyRowStreamsOverride(nullptr, 2), 2);
  EXPECT_EQ(ApplyRowStreamsOverride("", 4), 4);
  EXPECT_EQ(ApplyRowStreamsOverride("1", 4), 1);
  EXPECT_EQ(ApplyRowStreamsOverride("2", 1), 2);
  EXPECT_EQ(ApplyRowStreamsOverride("4", 1), 4);
  for (const char* bad : {"3", "0", "8", "2x", " 2", "-1", "four"}) {
    EXPECT_EQ(ApplyRowStreamsOverride(bad, 2), 2) << bad;  // ignored, with a warning
  }
}

TEST(KernelIsa, OverrideAndDetection) {
  std::printf("detected isa: %s, active: %s\n", IsaName(DetectedIsa()), IsaName(ActiveIsa()));
  using internal::ApplyIsaOverride;
  EXPECT_EQ(ApplyIsaOverride(nullptr, Isa::kAvx512), Isa::kAvx512);
  EXPECT_EQ(ApplyIsaOverride("", Isa::kAvx2), Isa::kAvx2);
  EXPECT_EQ(ApplyIsaOverride("scalar", Isa::kAvx512), Isa::kScalar);
  EXPECT_EQ(ApplyIsaOverride("avx2", Isa::kAvx512), Isa::kAvx2);
  EXPECT_EQ(ApplyIsaOverride("avx512", Isa::kAvx512), Isa::kAvx512);
  EXPECT_EQ(ApplyIsaOverride("avx512", Isa::kAvx2), Isa::kAvx2);  // never above the CPU
  EXPECT_EQ(ApplyIsaOverride("sse9", Isa::kAvx2), Isa::kAvx2);    // unknown: ignored
  EXPECT_EQ(ApplyIsaOverride("avxvnni", Isa::kAvx512), Isa::kAvxVnni);
  EXPECT_EQ(ApplyIsaOverride("avxvnni", Isa::kAvxVnni), Isa::kAvxVnni);
  EXPECT_EQ(ApplyIsaOverride("avx2", Isa::kAvxVnni), Isa::kAvx2);
  EXPECT_EQ(ApplyIsaOverride("avx512", Isa::kAvxVnni), Isa::kAvxVnni);  // never above the CPU
  EXPECT_EQ(ApplyIsaOverride("avxvnni", Isa::kAvx2), Isa::kAvx2);
  // AVX-512 without AVX-VNNI (Ice Lake): avxvnni is not there, avx2 is.
  EXPECT_EQ(ApplyIsaOverride("avxvnni", Isa::kAvx512, false), Isa::kAvx2);
  EXPECT_EQ(ApplyIsaOverride("avx512", Isa::kAvx512, false), Isa::kAvx512);
  EXPECT_EQ(ApplyIsaOverride(nullptr, Isa::kAvx512, false), Isa::kAvx512);
  EXPECT_STREQ(IsaName(Isa::kAvxVnni), "avxvnni");
  // Detection against cpuid read here: AVX-VNNI is leaf 7 subleaf 1, EAX bit 4; AVX2 leaf 7
  // subleaf 0, EBX bit 5; AVX512F EBX bit 16.
  const bool cpu_vnni = CpuidBit(7, 1, 0, 4), cpu_avx2 = CpuidBit(7, 0, 1, 5);
  if (DetectedIsa() == Isa::kAvxVnni) {
    EXPECT_TRUE(cpu_vnni);
    EXPECT_TRUE(cpu_avx2);
  }
  if (DetectedIsa() == Isa::kAvx512) {
    EXPECT_TRUE(CpuidBit(7, 0, 1, 16));
  }
  EXPECT_EQ(internal::IsaSupported(Isa::kAvxVnni), cpu_vnni && internal::IsaSupported(Isa::kAvx2));
  if (!internal::IsaSupported(Isa::kAvxVnni)) {
    std::vector<float> w(16, 1.f), x(16, 1.f), y(1);
    MatrixView v{WeightFormat::kF32, 1, 16, w.data(), nullptr};
    EXPECT_EQ(internal::MatmulWithIsa(Isa::kAvxVnni, v, x.data(), 1, y.data(), {}).code(),
              absl::StatusCode::kFailedPrecondition);
  }
  EXPECT_LE(static_cast<int>(ActiveIsa()), static_cast<int>(DetectedIsa()));
  EXPECT_STREQ(IsaName(Isa::kAvx512), "avx512");
  if (DetectedIsa() != Isa::kAvx512) {
    std::vector<float> w(16, 1.f), x(16, 1.f), y(1);
    MatrixView v{WeightFormat::kF32, 1, 16, w.data(), nullptr};
    EXPECT_EQ(internal::MatmulWithIsa(Isa::kAvx512, v, x.data(), 1, y.data(), {}).code(),
              absl::StatusCode::kFailedPrecondition);
  }
}

}  // namespace
}  // namespace coli::kernels
