// Tests for the integer-dot dense path of common/vk (DenseMatmul / DenseGlu with
// MatmulNumerics::kIdot, shaders/dense_matmul_idot.comp) on a real Vulkan device (lavapipe in
// CI): int8-per-row and int4-g64 matrices must give the CPU's kernels::Matmul(idot = true) —
// what Kimi K3's shared experts run by default (K3_IDOT=1) — bit for bit. The reference is the
// CPU kernel itself (and common/ops SituGlu for the GLU block); no tolerance.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <iterator>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/kernels/kernels.h"
#include "common/ops/ops.h"
#include "common/status/status_matchers.h"
#include "common/vk/vulkan_context.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/common/vk/idot_test_util.h"
#include "tests/common/vk/require_vulkan.h"

namespace coli::vulkan {
namespace {

using ::coli::testing::IsOk;
using ::coli::testing::StatusIs;
using idot_test::Mismatches;
using idot_test::RandomActivations;
using idot_test::SameValue;
using kernels::MatrixView;
using kernels::WeightFormat;
using ::testing::HasSubstr;

// A dense matrix in the kernels.h layout, owning its bytes.
struct DenseMatrix {
  WeightFormat format = WeightFormat::kInt8Row;
  int64_t rows = 0;
  int64_t cols = 0;
  std::vector<uint8_t> data;
  std::vector<float> scales;
  MatrixView view() const {
    return MatrixView{format, rows, cols, data.data(), scales.empty() ? nullptr : scales.data()};
  }
};

// Random bytes (int8: every value, −128 included; int4: every nibble) and scales 2^k·|normal|
// with k uniform in [−spread, spread], a negative scale now and then.
DenseMatrix RandomDense(WeightFormat format, int64_t rows, int64_t cols, int spread,
                        std::mt19937& rng) {
  DenseMatrix m;
  m.format = format;
  m.rows = rows;
  m.cols = cols;
  const kernels::MatrixBytes bytes = kernels::FormatBytes(format, rows, cols);
  m.data.resize(bytes.data);
  std::uniform_int_distribution<int> byte(0, 255);
  for (uint8_t& b : m.data) b = static_cast<uint8_t>(byte(rng));
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> power(-spread, spread);
  std::uniform_int_distribution<int> pick(0, 15);
  m.scales.resize(bytes.scales / sizeof(float));
  for (float& s : m.scales) {
    s = std::ldexp(std::fabs(normal(rng)) + 0.01f, power(rng)) * (pick(rng) == 0 ? -1.0f : 1.0f);
  }
  return m;
}

std::vector<float> CpuMatmul(const MatrixView& w, const std::vector<float>& x, int64_t batch,
                             bool idot) {
  std::vector<float> y(static_cast<size_t>(batch * w.rows), NAN);
  EXPECT_THAT(kernels::Matmul(w, x.data(), batch, y.data(),
                              kernels::MatmulOptions{.idot = idot, .threads = 1}),
              IsOk());
  return y;
}

// Every (rows, cols, batch) of the lists, device vs CPU idot; returns the mismatch count and
// adds the outputs compared to *elements.
int64_t CompareShapes(VulkanContext& vk, WeightFormat format, const std::vector<int64_t>& rows_list,
                      const std::vector<int64_t>& cols_list, int scale_spread, int x_spread,
                      std::mt19937& rng, int64_t* elements) {
  int64_t mismatches = 0;
  for (int64_t rows : rows_list) {
    for (int64_t cols : cols_list) {
      const DenseMatrix m = RandomDense(format, rows, cols, scale_spread, rng);
      absl::StatusOr<std::unique_ptr<DeviceDenseMatrix>> dm = vk.UploadDense(m.view());
      EXPECT_THAT(dm, IsOk());
      if (!dm.ok()) return mismatches + 1;
      for (int64_t batch : {1, 3, 8, 11}) {
        const std::vector<float> x = RandomActivations(batch, cols, 64, x_spread, rng);
        std::vector<float> y(static_cast<size_t>(batch * rows), NAN);
        EXPECT_THAT(vk.DenseMatmul(**dm, x.data(), batch, y.data(), MatmulNumerics::kIdot), IsOk());
        mismatches += Mismatches(y, CpuMatmul(m.view(), x, batch, /*idot=*/true),
                                 absl::StrCat(kernels::WeightFormatName(format), " [", rows, ", ",
                                              cols, "] batch ", batch));
        *elements += batch * rows;
      }
    }
  }
  return mismatches;
}

// int8 takes any column count (the CPU's last 64-block may be short, its lanes past the end
// still adding 0·xscale); odd counts leave rows off word boundaries in the weight buffer.
TEST(VulkanDenseIdot, Int8MatchesCpuIdotKernelBitForBitOnOddShapes) {
  COLI_IDOT_CONTEXT_OR_SKIP(vk, VulkanContextOptions{});
  std::mt19937 rng(1201);
  int64_t elements = 0;
  const int64_t mismatches = CompareShapes(*vk, WeightFormat::kInt8Row, {1, 5, 37},
                                           {1, 3, 63, 64, 65, 130, 1001}, 6, 12, rng, &elements);
  EXPECT_EQ(mismatches, 0) << "of " << elements;
  std::printf("[int8 idot] %lld of %lld outputs differ from the CPU's\n",
              static_cast<long long>(mismatches), static_cast<long long>(elements));
}

// int4-g64: cols % 64 == 0, an odd number of groups leaving lanes 8..15 one group short.
TEST(VulkanDenseIdot, Int4MatchesCpuIdotKernelBitForBitOnOddShapes) {
  COLI_IDOT_CONTEXT_OR_SKIP(vk, VulkanContextOptions{});
  std::mt19937 rng(1202);
  int64_t elements = 0;
  const int64_t mismatches = CompareShapes(*vk, WeightFormat::kInt4G64, {1, 3, 37},
                                           {64, 128, 192, 1088}, 6, 12, rng, &elements);
  EXPECT_EQ(mismatches, 0) << "of " << elements;
  std::printf("[int4 idot] %lld of %lld outputs differ from the CPU's\n",
              static_cast<long long>(mismatches), static_cast<long long>(elements));
}

// Kimi K3's shared-expert shapes, cut in rows (gate/up [S, 7168], down [7168, S]): the f32 path
// differs from the CPU's idot bits nearly everywhere, the idot path nowhere.
TEST(VulkanDenseIdot, MatchesCpuOnSharedExpertShapes) {
  COLI_IDOT_CONTEXT_OR_SKIP(vk, VulkanContextOptions{});
  std::mt19937 rng(1203);
  struct Shape {
    WeightFormat format;
    int64_t rows, cols, batch;
  };
  for (const Shape& s :
       {Shape{WeightFormat::kInt4G64, 384, 7168, 3}, Shape{WeightFormat::kInt8Row, 384, 7168, 1},
        Shape{WeightFormat::kInt4G64, 7168, 384, 1}, Shape{WeightFormat::kInt8Row, 7168, 384, 2}}) {
    const std::string what = absl::StrCat(kernels::WeightFormatName(s.format), " [", s.rows, ", ",
                                          s.cols, "] batch ", s.batch);
    const DenseMatrix m = RandomDense(s.format, s.rows, s.cols, 4, rng);
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<DeviceDenseMatrix> dm, vk->UploadDense(m.view()));
    const std::vector<float> x = RandomActivations(s.batch, s.cols, 64, 4, rng);
    const std::vector<float> want = CpuMatmul(m.view(), x, s.batch, /*idot=*/true);
    std::vector<float> y(want.size(), NAN), f(want.size(), NAN);
    ASSERT_THAT(vk->DenseMatmul(*dm, x.data(), s.batch, y.data(), MatmulNumerics::kIdot), IsOk());
    EXPECT_EQ(Mismatches(y, want, what), 0);
    ASSERT_THAT(vk->DenseMatmul(*dm, x.data(), s.batch, f.data()), IsOk());
    int64_t float_differs = 0;
    for (size_t i = 0; i < want.size(); ++i) float_differs += SameValue(f[i], want[i]) ? 0 : 1;
    std::printf("[%s] idot 0 differ; the f32 path differs in %lld of %zu\n", what.c_str(),
                static_cast<long long>(float_differs), want.size());
  }
}

// Scales at the ends of f32: zero and negative zero, subnormal, huge (the group scale product
// or the row scale overflowing to inf), inf and NaN. Rounding, subnormals, signed zeros and
// IEEE's special cases must come out as on the CPU.
TEST(VulkanDenseIdot, ExtremeScalesRoundLikeTheCpu) {
  COLI_IDOT_CONTEXT_OR_SKIP(vk, VulkanContextOptions{});
  std::mt19937 rng(1204);
  const float kSpecial[] = {0.0f,
                            -0.0f,
                            std::numeric_limits<float>::denorm_min(),
                            -3e-41f,
                            1.1754942e-38f,
                            1e-30f,
                            2e-20f,
                            3e38f,
                            -1.7e38f,
                            std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity(),
                            std::numeric_limits<float>::quiet_NaN(),
                            1.0f};
  const int n_special = static_cast<int>(std::size(kSpecial));
  int64_t elements = 0, mismatches = 0, nan = 0, inf = 0, subnormal = 0, zero = 0;
  for (const WeightFormat format : {WeightFormat::kInt8Row, WeightFormat::kInt4G64}) {
    const int64_t rows = 3 * n_special, cols = 256;
    DenseMatrix m = RandomDense(format, rows, cols, 0, rng);
    // Row r takes special value r % n for all its scales (int8) or for group r / n % 4 (int4,
    // the others ordinary), so every special value meets each group position.
    for (int64_t r = 0; r < rows; ++r) {
      const float special = kSpecial[r % n_special];
      if (format == WeightFormat::kInt8Row) {
        m.scales[r] = special;
      } else {
        m.scales[r * 4 + (r / n_special) % 4] = special;
      }
    }
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<DeviceDenseMatrix> dm, vk->UploadDense(m.view()));
    for (const int x_spread : {0, 20}) {
      const int64_t batch = 5;
      std::vector<float> x = RandomActivations(batch, cols, 64, x_spread, rng);
      // Huge activations: the group scale product overflows against huge weight scales.
      for (int64_t c = 0; c < 64; ++c) x[c] *= 1e18f;
      const std::vector<float> want = CpuMatmul(m.view(), x, batch, /*idot=*/true);
      std::vector<float> y(want.size(), 0.0f);
      ASSERT_THAT(vk->DenseMatmul(*dm, x.data(), batch, y.data(), MatmulNumerics::kIdot), IsOk());
      mismatches += Mismatches(
          y, want,
          absl::StrCat(kernels::WeightFormatName(format), " extreme scales, x spread ", x_spread));
      elements += static_cast<int64_t>(want.size());
      for (float v : want) {
        nan += std::isnan(v) ? 1 : 0;
        inf += std::isinf(v) ? 1 : 0;
        subnormal += std::fpclassify(v) == FP_SUBNORMAL ? 1 : 0;
        zero += v == 0.0f ? 1 : 0;
      }
    }
  }
  EXPECT_EQ(mismatches, 0) << "of " << elements;
  // The cases are really there.
  EXPECT_GT(nan, 0);
  EXPECT_GT(inf, 0);
  EXPECT_GT(subnormal, 0);
  EXPECT_GT(zero, 0);
  std::printf(
      "[extreme scales] %lld of %lld differ (%lld NaN, %lld inf, %lld subnormal, %lld "
      "zero outputs)\n",
      static_cast<long long>(mismatches), static_cast<long long>(elements),
      static_cast<long long>(nan), static_cast<long long>(inf), static_cast<long long>(subnormal),
      static_cast<long long>(zero));
}

// The CPU's K3_IDOT=1 SiTU-GLU block (kernels::Matmul(idot) for gate, up and down,
// ops::SituGlu between), as plugins/kimi_k3 SituGluBlock computes it.
std::vector<float> CpuGluBlock(const DenseMatrix& gate, const DenseMatrix& up,
                               const DenseMatrix& down, const std::vector<float>& x, int64_t rows,
                               float beta1, float beta2) {
  const int64_t inter = gate.rows;
  std::vector<float> g = CpuMatmul(gate.view(), x, rows, true);
  const std::vector<float> u = CpuMatmul(up.view(), x, rows, true);
  ops::SituGlu(g.data(), u.data(), rows * inter, beta1, beta2, g.data());
  return CpuMatmul(down.view(), g, rows, true);
}

// DenseGlu(kIdot) equals the CPU's block bit for bit: each format alone and mixed per matrix
// (int8 and int4-g64 read the same codes per 64 columns, so gate and up share them), 1 and 7
// rows.
TEST(VulkanDenseIdot, DenseGluMatchesTheCpuBlockBitForBit) {
  COLI_IDOT_CONTEXT_OR_SKIP(vk, VulkanContextOptions{});
  std::mt19937 rng(1205);
  const int64_t hidden = 448, inter = 320;
  const float beta1 = 3.0f, beta2 = 9.0f;
  struct Case {
    WeightFormat gate, up, down;
  };
  for (const Case& c :
       {Case{WeightFormat::kInt8Row, WeightFormat::kInt8Row, WeightFormat::kInt8Row},
        Case{WeightFormat::kInt4G64, WeightFormat::kInt4G64, WeightFormat::kInt4G64},
        Case{WeightFormat::kInt8Row, WeightFormat::kInt4G64, WeightFormat::kInt4G64}}) {
    const DenseMatrix gate = RandomDense(c.gate, inter, hidden, 3, rng);
    const DenseMatrix up = RandomDense(c.up, inter, hidden, 3, rng);
    const DenseMatrix down = RandomDense(c.down, hidden, inter, 3, rng);
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<DeviceDenseMatrix> dg, vk->UploadDense(gate.view()));
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<DeviceDenseMatrix> du, vk->UploadDense(up.view()));
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<DeviceDenseMatrix> dd, vk->UploadDense(down.view()));
    for (const int64_t rows : {1, 7}) {
      const std::string what =
          absl::StrCat(kernels::WeightFormatName(c.gate), "/", kernels::WeightFormatName(c.up), "/",
                       kernels::WeightFormatName(c.down), " rows ", rows);
      const std::vector<float> x = RandomActivations(rows, hidden, 64, 2, rng);
      const std::vector<float> want = CpuGluBlock(gate, up, down, x, rows, beta1, beta2);
      std::vector<float> y(want.size(), NAN);
      ASSERT_THAT(vk->DenseGlu(*dg, *du, *dd, x.data(), rows, beta1, beta2, y.data(),
                               MatmulNumerics::kIdot),
                  IsOk());
      EXPECT_EQ(Mismatches(y, want, what), 0);
      // The float chain is the K3_IDOT=0 math: other bits.
      std::vector<float> f(want.size(), NAN);
      ASSERT_THAT(vk->DenseGlu(*dg, *du, *dd, x.data(), rows, beta1, beta2, f.data()), IsOk());
      EXPECT_NE(std::memcmp(f.data(), want.data(), want.size() * sizeof(float)), 0) << what;
    }
  }
}

// f32 matrices have no integer path on the CPU (Matmul keeps its f32 kernel under idot), so
// DenseMatmul / DenseGlu(kIdot) on f32 are the float path exactly — also on a device without
// shaderInt64 — and stay within f32 rounding of the CPU. An f32 gate beside int8 / int4 up and
// down (gate and up then read different activations) follows the CPU's idot block closely.
TEST(VulkanDenseIdot, F32MatricesKeepTheFloatPath) {
  for (const bool int64 : {true, false}) {
    VulkanContextOptions options;
    options.use_int64 = int64;
    COLI_IDOT_CONTEXT_OR_SKIP(vk, options);
    std::mt19937 rng(1206);
    const int64_t hidden = 192, inter = 128, rows = 3;
    DenseMatrix gate = RandomDense(WeightFormat::kF32, inter, hidden, 0, rng);
    DenseMatrix up = RandomDense(WeightFormat::kF32, inter, hidden, 0, rng);
    DenseMatrix down = RandomDense(WeightFormat::kF32, hidden, inter, 0, rng);
    // Random bytes make no sensible f32: the normal values RandomActivations gives instead.
    for (DenseMatrix* m : {&gate, &up, &down}) {
      const std::vector<float> v = RandomActivations(1, m->rows * m->cols, 64, 0, rng);
      std::memcpy(m->data.data(), v.data(), m->data.size());
    }
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<DeviceDenseMatrix> dg, vk->UploadDense(gate.view()));
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<DeviceDenseMatrix> du, vk->UploadDense(up.view()));
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<DeviceDenseMatrix> dd, vk->UploadDense(down.view()));
    const std::vector<float> x = RandomActivations(rows, hidden, 64, 2, rng);
    std::vector<float> yi(rows * inter), yf(rows * inter);
    ASSERT_THAT(vk->DenseMatmul(*dg, x.data(), rows, yi.data(), MatmulNumerics::kIdot), IsOk());
    ASSERT_THAT(vk->DenseMatmul(*dg, x.data(), rows, yf.data()), IsOk());
    EXPECT_EQ(std::memcmp(yi.data(), yf.data(), yi.size() * sizeof(float)), 0);
    std::vector<float> gi(rows * hidden), gf(rows * hidden);
    ASSERT_THAT(
        vk->DenseGlu(*dg, *du, *dd, x.data(), rows, 3.0f, 9.0f, gi.data(), MatmulNumerics::kIdot),
        IsOk());
    ASSERT_THAT(vk->DenseGlu(*dg, *du, *dd, x.data(), rows, 3.0f, 9.0f, gf.data()), IsOk());
    EXPECT_EQ(std::memcmp(gi.data(), gf.data(), gi.size() * sizeof(float)), 0);
    const std::vector<float> cpu = CpuMatmul(gate.view(), x, rows, /*idot=*/true);
    for (size_t i = 0; i < cpu.size(); ++i) {
      EXPECT_NEAR(yi[i], cpu[i], 1e-4f * (1.0f + std::fabs(cpu[i]))) << i;
    }
    if (!int64) continue;
    const DenseMatrix up8 = RandomDense(WeightFormat::kInt8Row, inter, hidden, 2, rng);
    const DenseMatrix down4 = RandomDense(WeightFormat::kInt4G64, hidden, inter, 2, rng);
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<DeviceDenseMatrix> du8, vk->UploadDense(up8.view()));
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<DeviceDenseMatrix> dd4, vk->UploadDense(down4.view()));
    ASSERT_THAT(
        vk->DenseGlu(*dg, *du8, *dd4, x.data(), rows, 3.0f, 9.0f, gi.data(), MatmulNumerics::kIdot),
        IsOk());
    const std::vector<float> block = CpuGluBlock(gate, up8, down4, x, rows, 3.0f, 9.0f);
    double diff = 0, norm = 0;
    for (size_t i = 0; i < block.size(); ++i) {
      diff += (gi[i] - block[i]) * double{gi[i] - block[i]};
      norm += block[i] * double{block[i]};
    }
    EXPECT_LE(std::sqrt(diff / norm), 1e-3) << "f32 gate, int8 up, int4 down";
  }
}

// A non-finite activation is refused as the CPU refuses it (naming the batch row); a device
// without shaderInt64 refuses kIdot on int8 / int4 with UNIMPLEMENTED naming it and K3_IDOT=0.
TEST(VulkanDenseIdot, RefusesWhatTheCpuRefusesAndDevicesWithoutInt64) {
  std::mt19937 rng(1207);
  const DenseMatrix gate = RandomDense(WeightFormat::kInt8Row, 64, 128, 2, rng);
  const DenseMatrix up = RandomDense(WeightFormat::kInt4G64, 64, 128, 2, rng);
  const DenseMatrix down = RandomDense(WeightFormat::kInt4G64, 128, 64, 2, rng);
  std::vector<float> x = RandomActivations(3, 128, 64, 2, rng);
  x[128 + 17] = std::numeric_limits<float>::infinity();
  {
    COLI_IDOT_CONTEXT_OR_SKIP(vk, VulkanContextOptions{});
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<DeviceDenseMatrix> dg, vk->UploadDense(gate.view()));
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<DeviceDenseMatrix> du, vk->UploadDense(up.view()));
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<DeviceDenseMatrix> dd, vk->UploadDense(down.view()));
    std::vector<float> y(3 * 128);
    std::vector<float> cpu_y(3 * 64);
    EXPECT_THAT(kernels::Matmul(gate.view(), x.data(), 3, cpu_y.data(), {.idot = true}),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("batch row 1")));
    EXPECT_THAT(vk->DenseMatmul(*dg, x.data(), 3, y.data(), MatmulNumerics::kIdot),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("batch row 1")));
    EXPECT_THAT(
        vk->DenseGlu(*dg, *du, *dd, x.data(), 3, 3.0f, 9.0f, y.data(), MatmulNumerics::kIdot),
        StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("batch row 1")));
    // The context works afterwards.
    x[128 + 17] = 0.5f;
    EXPECT_THAT(
        vk->DenseGlu(*dg, *du, *dd, x.data(), 3, 3.0f, 9.0f, y.data(), MatmulNumerics::kIdot),
        IsOk());
    x[128 + 17] = std::numeric_limits<float>::infinity();
  }
  VulkanContextOptions no_int64;
  no_int64.use_int64 = false;
  COLI_IDOT_CONTEXT_OR_SKIP(vk, no_int64);
  EXPECT_FALSE(vk->supports_idot());
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<DeviceDenseMatrix> dg, vk->UploadDense(gate.view()));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<DeviceDenseMatrix> du, vk->UploadDense(up.view()));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<DeviceDenseMatrix> dd, vk->UploadDense(down.view()));
  x[128 + 17] = 0.5f;
  std::vector<float> y(3 * 128);
  EXPECT_THAT(vk->DenseMatmul(*dg, x.data(), 3, y.data(), MatmulNumerics::kIdot),
              StatusIs(absl::StatusCode::kUnimplemented, HasSubstr("shaderInt64")));
  EXPECT_THAT(vk->DenseGlu(*dg, *du, *dd, x.data(), 3, 3.0f, 9.0f, y.data(), MatmulNumerics::kIdot),
              StatusIs(absl::StatusCode::kUnimplemented, HasSubstr("K3_IDOT=0")));
  // The float path still works there.
  EXPECT_THAT(vk->DenseGlu(*dg, *du, *dd, x.data(), 3, 3.0f, 9.0f, y.data()), IsOk());
}

}  // namespace
}  // namespace coli::vulkan
