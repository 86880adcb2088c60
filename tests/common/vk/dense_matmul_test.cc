// Tests for the dense matmul shaders of common/vk (shaders/dense_matmul.comp: f32, int8 per row,
// int4-g64) and the dense SiTU-GLU chain, on a real Vulkan device (lavapipe in CI), against the
// CPU's exact-float kernels (kernels::Matmul with idot off = K3_IDOT=0, ops::SituGlu).
//
// Tolerance: the device dequantizes each weight exactly as the CPU does ((n - 8)·s, q, w) and
// multiplies by the same f32 activations; only the summation order differs (64 strided partials
// and a tree against the CPU's 16 lanes; int8 multiplies the row scale in at the end on both
// sides). So per element |gpu − cpu| <= (cols/16 + 17)·u·Σ_c |W[r,c]·x[c]| (u = 2^-24), and
// rel-L2 <= 1e-6 per output vector of >= 32 rows (a shorter vector's norm can be one cancelling
// element). The measured maxima are printed.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <random>
#include <vector>

#include "common/kernels/kernels.h"
#include "common/ops/ops.h"
#include "common/status/status_matchers.h"
#include "common/vk/vulkan_context.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/common/vk/require_vulkan.h"

namespace coli::vulkan {
namespace {

using ::coli::testing::IsOk;
using ::coli::testing::StatusIs;
using kernels::MatrixView;
using kernels::QuantizedMatrix;
using kernels::WeightFormat;
using ::testing::HasSubstr;

constexpr double kDenseRelL2 = 1e-6;
constexpr int64_t kDenseRelL2MinRows = 32;

std::unique_ptr<VulkanContext> ContextOrNull(bool* skip) {
  absl::StatusOr<std::unique_ptr<VulkanContext>> created = VulkanContext::Create();
  *skip = !created.ok() && created.status().code() == absl::StatusCode::kUnavailable;
  if (!created.ok()) return nullptr;
  return std::move(created).value();
}

#define COLI_DENSE_CONTEXT_OR_SKIP(ctx)                            \
  bool ctx##_skip = false;                                         \
  std::unique_ptr<VulkanContext> ctx = ContextOrNull(&ctx##_skip); \
  if (ctx##_skip) {                                                \
    COLI_SKIP_UNLESS_VULKAN_REQUIRED() << "no Vulkan device";      \
  }                                                                \
  ASSERT_NE(ctx, nullptr) << "VulkanContext::Create failed on a device"

std::vector<float> Normal(int64_t n, float sigma, std::mt19937& rng) {
  std::normal_distribution<float> normal(0.0f, sigma);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = normal(rng);
  return v;
}

// A random matrix quantized by the CPU's own load-time code (kernels::QuantizedMatrix): the
// bytes the model keeps its shared experts in.
QuantizedMatrix RandomMatrix(WeightFormat format, int64_t rows, int64_t cols, std::mt19937& rng) {
  const std::vector<float> w = Normal(rows * cols, 0.05f, rng);
  absl::StatusOr<QuantizedMatrix> q = QuantizedMatrix::FromF32(w.data(), rows, cols, format);
  EXPECT_THAT(q, IsOk());
  return std::move(q).value();
}

double VectorRelL2(const float* a, const float* ref, int64_t n) {
  double diff = 0.0, norm = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    diff += (static_cast<double>(a[i]) - ref[i]) * (static_cast<double>(a[i]) - ref[i]);
    norm += static_cast<double>(ref[i]) * ref[i];
  }
  if (norm == 0.0) return diff == 0.0 ? 0.0 : INFINITY;
  return std::sqrt(diff / norm);
}

struct Measured {
  double rel_l2 = 0;       // worst rel-L2 over output vectors of >= kDenseRelL2MinRows rows
  double bound_ratio = 0;  // worst |gpu − cpu| / (u·Σ|w·x|)
};

// One resident matrix, one batch: the device against kernels::Matmul(idot=false).
void CompareDense(VulkanContext& vk, const MatrixView& w, const DeviceDenseMatrix& dw,
                  int64_t batch, std::mt19937& rng, Measured* measured) {
  const std::vector<float> x = Normal(batch * w.cols, 1.0f, rng);
  std::vector<float> gpu(batch * w.rows, NAN), cpu(batch * w.rows, NAN);
  ASSERT_THAT(vk.DenseMatmul(dw, x.data(), batch, gpu.data()), IsOk());
  ASSERT_THAT(kernels::Matmul(w, x.data(), batch, cpu.data(), {.idot = false, .threads = 1}),
              IsOk());
  const double u = std::ldexp(1.0, -24);
  const double steps = static_cast<double>(w.cols) / 16 + 17;
  std::vector<float> row(w.cols);
  for (int64_t r = 0; r < w.rows; ++r) {
    kernels::DequantizeRow(w, r, row.data());
    for (int64_t b = 0; b < batch; ++b) {
      double magnitude = 0;
      for (int64_t c = 0; c < w.cols; ++c)
        magnitude += std::fabs(static_cast<double>(row[c]) * x[b * w.cols + c]);
      const double diff = std::fabs(static_cast<double>(gpu[b * w.rows + r]) - cpu[b * w.rows + r]);
      ASSERT_LE(diff, steps * u * magnitude)
          << kernels::WeightFormatName(w.format) << " [" << w.rows << ", " << w.cols << "] batch "
          << batch << " at [" << b << ", " << r << "]: gpu " << gpu[b * w.rows + r] << " cpu "
          << cpu[b * w.rows + r];
      if (magnitude > 0)
        measured->bound_ratio = std::max(measured->bound_ratio, diff / (u * magnitude));
    }
  }
  if (w.rows < kDenseRelL2MinRows) return;
  for (int64_t b = 0; b < batch; ++b) {
    const double e = VectorRelL2(gpu.data() + b * w.rows, cpu.data() + b * w.rows, w.rows);
    EXPECT_LE(e, kDenseRelL2) << kernels::WeightFormatName(w.format) << " [" << w.rows << ", "
                              << w.cols << "] batch " << batch << " row " << b;
    measured->rel_l2 = std::max(measured->rel_l2, e);
  }
}

// Each format on odd shapes (tails of the 64-invocation stride, int8 rows that do not start on
// a word, 1-row matrices) and batches below, at and above the shader's batch tile of 8.
TEST(VulkanDenseMatmul, MatchesCpuFloatKernelOnOddShapes) {
  COLI_DENSE_CONTEXT_OR_SKIP(vk);
  std::mt19937 rng(23);
  struct FormatCase {
    WeightFormat format;
    std::vector<int64_t> cols;
  };
  const FormatCase formats[] = {
      {WeightFormat::kF32, {1, 3, 63, 100, 517}},
      {WeightFormat::kInt8Row, {1, 3, 63, 100, 517}},
      {WeightFormat::kInt4G64, {64, 192, 1024}},
  };
  for (const FormatCase& f : formats) {
    Measured measured;
    for (const int64_t rows : {1, 5, 37, 70}) {
      for (const int64_t cols : f.cols) {
        const QuantizedMatrix q = RandomMatrix(f.format, rows, cols, rng);
        ASSERT_OK_AND_ASSIGN(std::unique_ptr<DeviceDenseMatrix> dw, vk->UploadDense(q.view()));
        EXPECT_EQ(dw->rows(), rows);
        EXPECT_EQ(dw->cols(), cols);
        EXPECT_EQ(dw->format(), f.format);
        EXPECT_GE(dw->device_bytes(), kernels::ViewBytes(q.view()));
        for (const int64_t batch : {1, 3, 8, 11}) {
          CompareDense(*vk, q.view(), *dw, batch, rng, &measured);
          if (HasFatalFailure()) return;
        }
      }
    }
    std::printf("[dense %s] worst rel-L2 (vectors >= 32 rows) %.3g, worst bound ratio %.3g\n",
                kernels::WeightFormatName(f.format), measured.rel_l2, measured.bound_ratio);
  }
}

// The shared experts' shape of the tiny K3 fixture and a K3-sized row count, each matrix in its
// own format: one DenseGlu submission against gate/up matmuls, ops::SituGlu and the down matmul
// on the CPU (exact float), rel-L2 per row.
TEST(VulkanDenseGlu, MatchesCpuFloatBlock) {
  COLI_DENSE_CONTEXT_OR_SKIP(vk);
  std::mt19937 rng(5);
  constexpr int64_t kHidden = 64, kInner = 192;
  const float beta1 = 4.0f, beta2 = 25.0f;
  struct Case {
    WeightFormat gate, up, down;
  };
  const Case cases[] = {{WeightFormat::kInt4G64, WeightFormat::kInt4G64, WeightFormat::kInt4G64},
                        {WeightFormat::kInt8Row, WeightFormat::kInt8Row, WeightFormat::kInt8Row},
                        {WeightFormat::kF32, WeightFormat::kF32, WeightFormat::kF32},
                        {WeightFormat::kInt8Row, WeightFormat::kF32, WeightFormat::kInt4G64}};
  double worst = 0;
  for (const Case& c : cases) {
    const QuantizedMatrix gate = RandomMatrix(c.gate, kInner, kHidden, rng);
    const QuantizedMatrix up = RandomMatrix(c.up, kInner, kHidden, rng);
    const QuantizedMatrix down = RandomMatrix(c.down, kHidden, kInner, rng);
    const MatrixView views[] = {gate.view(), up.view(), down.view()};
    const uint64_t before_bytes = vk->resident_bytes();
    ASSERT_OK_AND_ASSIGN(std::vector<std::unique_ptr<DeviceDenseMatrix>> dm,
                         vk->UploadDenseBatch(views));
    EXPECT_EQ(vk->resident_bytes() - before_bytes,
              dm[0]->device_bytes() + dm[1]->device_bytes() + dm[2]->device_bytes());
    for (const int64_t rows : {1, 2, 8}) {
      const std::vector<float> x = Normal(rows * kHidden, 2.0f, rng);
      std::vector<float> y(rows * kHidden, NAN), ref(rows * kHidden);
      std::vector<float> g(rows * kInner), u(rows * kInner);
      const kernels::MatmulOptions exact{.idot = false, .threads = 1};
      ASSERT_THAT(kernels::Matmul(gate.view(), x.data(), rows, g.data(), exact), IsOk());
      ASSERT_THAT(kernels::Matmul(up.view(), x.data(), rows, u.data(), exact), IsOk());
      ops::SituGlu(g.data(), u.data(), rows * kInner, beta1, beta2, g.data());
      ASSERT_THAT(kernels::Matmul(down.view(), g.data(), rows, ref.data(), exact), IsOk());
      const uint64_t matmuls = vk->matmuls();
      ASSERT_THAT(vk->DenseGlu(*dm[0], *dm[1], *dm[2], x.data(), rows, beta1, beta2, y.data()),
                  IsOk());
      EXPECT_EQ(vk->matmuls() - matmuls, 3u);
      for (int64_t r = 0; r < rows; ++r) {
        const double e = VectorRelL2(y.data() + r * kHidden, ref.data() + r * kHidden, kHidden);
        EXPECT_LE(e, kDenseRelL2) << kernels::WeightFormatName(c.gate) << "/"
                                  << kernels::WeightFormatName(c.up) << "/"
                                  << kernels::WeightFormatName(c.down) << " rows " << rows
                                  << " row " << r;
        worst = std::max(worst, e);
      }
    }
  }
  std::printf("[dense glu] worst per-row rel-L2 vs the CPU float block %.3g\n", worst);
}

TEST(VulkanDenseMatmul, RefusesBadInputAndInjectedFailures) {
  COLI_DENSE_CONTEXT_OR_SKIP(vk);
  std::mt19937 rng(9);
  const QuantizedMatrix gate = RandomMatrix(WeightFormat::kInt8Row, 128, 64, rng);
  const QuantizedMatrix down = RandomMatrix(WeightFormat::kInt8Row, 64, 128, rng);
  ASSERT_OK_AND_ASSIGN(auto dg, vk->UploadDense(gate.view()));
  ASSERT_OK_AND_ASSIGN(auto dd, vk->UploadDense(down.view()));
  // Formats and views.
  std::vector<uint8_t> bytes(64 * 64 / 2, 0x11), e8m0(64 * 64 / 32, 127);
  const MatrixView mxfp4{WeightFormat::kMxfp4, 64, 64, bytes.data(), e8m0.data()};
  EXPECT_THAT(vk->UploadDense(mxfp4),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("mxfp4")));
  std::vector<float> scales(64, 1.0f);
  const MatrixView int4_bad_cols{WeightFormat::kInt4G64, 2, 32, bytes.data(), scales.data()};
  EXPECT_THAT(vk->UploadDense(int4_bad_cols),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("cols % 64")));
  const MatrixView int8_no_scales{WeightFormat::kInt8Row, 2, 32, bytes.data(), nullptr};
  EXPECT_THAT(vk->UploadDense(int8_no_scales),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("scales")));
  // Calls.
  std::vector<float> x(8 * 128, 1.0f), y(8 * 128);
  EXPECT_THAT(vk->DenseMatmul(*dg, x.data(), -1, y.data()),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("negative batch")));
  EXPECT_THAT(vk->DenseMatmul(*dg, nullptr, 1, y.data()),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(vk->DenseMatmul(*dg, nullptr, 0, nullptr), IsOk());
  EXPECT_THAT(vk->DenseGlu(*dg, *dg, *dg, x.data(), 1, 4, 25, y.data()),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("GLU block")));
  EXPECT_THAT(vk->DenseGlu(*dg, *dg, *dd, x.data(), -2, 4, 25, y.data()),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("negative rows")));
  EXPECT_THAT(vk->DenseGlu(*dg, *dg, *dd, x.data(), 1, 4, 25, nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(vk->DenseGlu(*dg, *dg, *dd, nullptr, 0, 4, 25, nullptr), IsOk());
  // A matrix of another context.
  {
    COLI_DENSE_CONTEXT_OR_SKIP(other);
    ASSERT_OK_AND_ASSIGN(auto foreign, other->UploadDense(gate.view()));
    EXPECT_THAT(vk->DenseMatmul(*foreign, x.data(), 1, y.data()),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("another VulkanContext")));
    EXPECT_THAT(vk->DenseGlu(*foreign, *dg, *dd, x.data(), 1, 4, 25, y.data()),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("another VulkanContext")));
  }
  // An injected device loss fails exactly the next submission; the context works after it.
  vk->FailSubmissionsForTesting(1);
  EXPECT_THAT(vk->DenseGlu(*dg, *dg, *dd, x.data(), 1, 4, 25, y.data()),
              StatusIs(absl::StatusCode::kInternal, HasSubstr("VK_ERROR_DEVICE_LOST")));
  EXPECT_THAT(vk->DenseGlu(*dg, *dg, *dd, x.data(), 1, 4, 25, y.data()), IsOk());
  std::vector<float> ref(64);
  ASSERT_THAT(kernels::Matmul(gate.view(), x.data(), 1, y.data(), {.idot = false}), IsOk());
  ops::SituGlu(y.data(), y.data(), 128, 4, 25, y.data());
  ASSERT_THAT(kernels::Matmul(down.view(), y.data(), 1, ref.data(), {.idot = false}), IsOk());
  std::vector<float> again(64);
  ASSERT_THAT(vk->DenseGlu(*dg, *dg, *dd, x.data(), 1, 4, 25, again.data()), IsOk());
  EXPECT_LE(VectorRelL2(again.data(), ref.data(), 64), kDenseRelL2);
}

}  // namespace
}  // namespace coli::vulkan
