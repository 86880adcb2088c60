// Tests for common/vk: the MXFP4 matmul shader on a real Vulkan device (lavapipe in CI)
// against the CPU's exact-float MXFP4 kernel (kernels::Matmul with idot off), plus refusals.
//
// Tolerance: the device dequantizes exactly as the CPU does (e2m1 * 2^(s-127), exact in f32)
// and multiplies by the same f32 activations; only the summation order differs (64 strided
// partials and a shared-memory tree against the CPU's 16 lanes). So we assert, per element, the
// rigorous rounding bound of two f32 sums of the same terms (CompareWithCpu), and rel-L2 <= 1e-6
// per output vector of >= 32 rows (a 1- or 3-row vector's norm can be a single cancelling
// element: measured up to 2.7e-6 there, while its elements stay far inside the bound). The
// tests print the measured maxima.
#include "common/vk/vulkan_context.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <random>
#include <vector>

#include "common/kernels/kernels.h"
#include "common/status/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/common/vk/require_vulkan.h"

namespace coli::vulkan {
namespace {

using ::coli::testing::IsOk;
using ::coli::testing::StatusIs;
using kernels::MatrixView;
using kernels::WeightFormat;
using ::testing::HasSubstr;

constexpr double kRelL2Tolerance = 1e-6;
constexpr int64_t kRelL2MinRows = 32;

// Creates the context, or skips the test when this machine has no Vulkan loader or device at
// all (UNAVAILABLE). Any other failure is a test failure.
#define COLI_VK_CONTEXT_OR_SKIP(ctx)                                                  \
  std::unique_ptr<VulkanContext> ctx;                                                 \
  {                                                                                   \
    absl::StatusOr<std::unique_ptr<VulkanContext>> created = VulkanContext::Create(); \
    if (!created.ok() && created.status().code() == absl::StatusCode::kUnavailable) { \
      COLI_SKIP_UNLESS_VULKAN_REQUIRED() << "no Vulkan device: " << created.status(); \
    }                                                                                 \
    ASSERT_THAT(created, IsOk());                                                     \
    ctx = std::move(created).value();                                                 \
  }

struct Mxfp4Matrix {
  int64_t rows = 0;
  int64_t cols = 0;
  std::vector<uint8_t> data;    // rows*cols/2 e2m1 bytes, low nibble = even column
  std::vector<uint8_t> scales;  // rows*cols/32 E8M0 exponents
  MatrixView view() const {
    return MatrixView{WeightFormat::kMxfp4, rows, cols, data.data(), scales.data()};
  }
};

// Random nibbles (every e2m1 code, both signs) and exponents in 118..134 (2^-9 .. 2^7).
Mxfp4Matrix RandomMxfp4(int64_t rows, int64_t cols, std::mt19937& rng) {
  Mxfp4Matrix m;
  m.rows = rows;
  m.cols = cols;
  m.data.resize(static_cast<size_t>(rows * cols / 2));
  m.scales.resize(static_cast<size_t>(rows * cols / 32));
  std::uniform_int_distribution<int> byte(0, 255);
  std::uniform_int_distribution<int> exponent(118, 134);
  for (uint8_t& b : m.data) b = static_cast<uint8_t>(byte(rng));
  for (uint8_t& s : m.scales) s = static_cast<uint8_t>(exponent(rng));
  return m;
}

std::vector<float> RandomActivations(int64_t n, std::mt19937& rng) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(n));
  for (float& v : x) v = normal(rng);
  return x;
}

// ||a - b|| / ||b|| over one output vector (b the reference); 0 when both are exactly zero.
double RelL2(const float* a, const float* b, int64_t n) {
  double diff = 0.0, ref = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    const double d = static_cast<double>(a[i]) - b[i];
    diff += d * d;
    ref += static_cast<double>(b[i]) * b[i];
  }
  if (ref == 0.0) return diff == 0.0 ? 0.0 : INFINITY;
  return std::sqrt(diff / ref);
}

struct Agreement {
  double max_rel_l2 = 0.0;       // worst per-output-vector rel-L2 (every vector)
  double max_bound_ratio = 0.0;  // worst |gpu - cpu| / (u * sum_c |W[r,c] x[c]|)
  void Merge(const Agreement& o) {
    max_rel_l2 = std::max(max_rel_l2, o.max_rel_l2);
    max_bound_ratio = std::max(max_bound_ratio, o.max_bound_ratio);
  }
};

// Runs one shape on the device and on the CPU float kernel and checks, per element, the
// order-independent rounding bound |gpu - cpu| <= (cols/16 + 16) * u * sum_c |W[r,c] x[c]|
// (u = 2^-24: both sides sum the same exact products, in at most cols/16 + 4 and cols/64 + 6
// sequential f32 additions), and rel-L2 <= kRelL2Tolerance per output vector of at least
// kRelL2MinRows rows (a shorter vector's norm can be one cancelling element).
Agreement CompareWithCpu(VulkanContext& vk, const Mxfp4Matrix& m, int64_t batch,
                         std::mt19937& rng) {
  const std::vector<float> x = RandomActivations(batch * m.cols, rng);
  std::vector<float> y_gpu(static_cast<size_t>(batch * m.rows), NAN);
  std::vector<float> y_cpu(static_cast<size_t>(batch * m.rows), NAN);
  EXPECT_THAT(vk.Mxfp4Matmul(m.view(), x.data(), batch, y_gpu.data()), IsOk());
  EXPECT_THAT(kernels::Matmul(m.view(), x.data(), batch, y_cpu.data(),
                              kernels::MatmulOptions{.idot = false}),
              IsOk());
  const double u = std::ldexp(1.0, -24);
  const double steps = static_cast<double>(m.cols) / 16 + 16;
  Agreement agreement;
  std::vector<float> w_row(static_cast<size_t>(m.cols));
  for (int64_t r = 0; r < m.rows; ++r) {
    kernels::DequantizeRow(m.view(), r, w_row.data());
    for (int64_t b = 0; b < batch; ++b) {
      double magnitude = 0.0;
      for (int64_t c = 0; c < m.cols; ++c) {
        magnitude += std::fabs(static_cast<double>(w_row[c]) * x[b * m.cols + c]);
      }
      const double diff =
          std::fabs(static_cast<double>(y_gpu[b * m.rows + r]) - y_cpu[b * m.rows + r]);
      EXPECT_LE(diff, steps * u * magnitude)
          << "rows " << m.rows << " cols " << m.cols << " batch " << batch << " at [" << b << ", "
          << r << "]: gpu " << y_gpu[b * m.rows + r] << " cpu " << y_cpu[b * m.rows + r];
      if (magnitude > 0) {
        agreement.max_bound_ratio = std::max(agreement.max_bound_ratio, diff / (u * magnitude));
      }
    }
  }
  for (int64_t b = 0; b < batch; ++b) {
    const double e = RelL2(y_gpu.data() + b * m.rows, y_cpu.data() + b * m.rows, m.rows);
    if (m.rows >= kRelL2MinRows) {
      EXPECT_LE(e, kRelL2Tolerance)
          << "rows " << m.rows << " cols " << m.cols << " batch " << batch << " batch row " << b;
    }
    agreement.max_rel_l2 = std::max(agreement.max_rel_l2, e);
  }
  return agreement;
}

TEST(VulkanMxfp4Matmul, MatchesCpuFloatKernelOnOddShapes) {
  COLI_VK_CONTEXT_OR_SKIP(vk);
  std::mt19937 rng(20261129);
  Agreement worst, worst_long;  // worst_long: vectors of >= kRelL2MinRows rows
  // Batch 11 crosses the shader's batch tile of 8.
  for (int64_t rows : {1, 3, 37}) {
    for (int64_t cols : {32, 96, 3584}) {
      const Mxfp4Matrix m = RandomMxfp4(rows, cols, rng);
      for (int64_t batch : {1, 3, 8, 11}) {
        const Agreement a = CompareWithCpu(*vk, m, batch, rng);
        worst.Merge(a);
        if (rows >= kRelL2MinRows) worst_long.Merge(a);
      }
    }
  }
  std::printf(
      "device %s, odd shapes vs CPU float kernel: max rel-L2 %.3g over vectors of >= %d rows "
      "(tolerance %.0g), %.3g over all; max |gpu-cpu| / (u*sum|w*x|) %.3g (bound cols/16+16)\n",
      vk->device_name().c_str(), worst_long.max_rel_l2, static_cast<int>(kRelL2MinRows),
      kRelL2Tolerance, worst.max_rel_l2, worst.max_bound_ratio);
  ::testing::Test::RecordProperty("max_rel_l2", std::to_string(worst_long.max_rel_l2));
}

TEST(VulkanMxfp4Matmul, MatchesCpuFloatKernelOnExpertShape) {
  COLI_VK_CONTEXT_OR_SKIP(vk);
  std::mt19937 rng(3072);
  // A routed expert's matrix in the latent space: moe_inter 3072 rows x latent 3584 columns.
  const Mxfp4Matrix m = RandomMxfp4(3072, 3584, rng);
  const Agreement a = CompareWithCpu(*vk, m, 1, rng);
  std::printf(
      "device %s: 3072 x 3584 batch 1 vs CPU float kernel: rel-L2 %.3g (tolerance %.0g), max "
      "|gpu-cpu| / (u*sum|w*x|) %.3g\n",
      vk->device_name().c_str(), a.max_rel_l2, kRelL2Tolerance, a.max_bound_ratio);
  ::testing::Test::RecordProperty("rel_l2", std::to_string(a.max_rel_l2));
}

TEST(VulkanMxfp4Matmul, RowsBeyondOneDispatchDimension) {
  COLI_VK_CONTEXT_OR_SKIP(vk);
  // 65537 rows need a second workgroup dimension (65535 per dimension).
  std::mt19937 rng(65537);
  const Mxfp4Matrix m = RandomMxfp4(65537, 32, rng);
  EXPECT_LE(CompareWithCpu(*vk, m, 1, rng).max_rel_l2, kRelL2Tolerance);
}

TEST(VulkanMxfp4Matmul, ResidentMatrixServesManyCalls) {
  COLI_VK_CONTEXT_OR_SKIP(vk);
  std::mt19937 rng(96);
  const Mxfp4Matrix m = RandomMxfp4(37, 96, rng);
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<DeviceMxfp4Matrix> resident, vk->UploadMxfp4(m.view()));
  EXPECT_EQ(resident->rows(), 37);
  EXPECT_EQ(resident->cols(), 96);
  // At least the bytes asked for; exactly what the device allocates for that shape.
  EXPECT_GE(resident->device_bytes(), 37u * 96 / 2 + 37u * 96 / 32 * sizeof(float));
  ASSERT_OK_AND_ASSIGN(const uint64_t expected, vk->Mxfp4DeviceBytes(37, 96));
  EXPECT_EQ(resident->device_bytes(), expected);
  EXPECT_EQ(vk->resident_bytes(), expected);
  // Several calls with different activations and batch sizes on the one upload.
  for (int64_t batch : {1, 3, 9}) {
    const std::vector<float> x = RandomActivations(batch * m.cols, rng);
    std::vector<float> y_gpu(static_cast<size_t>(batch * m.rows), NAN);
    std::vector<float> y_cpu(static_cast<size_t>(batch * m.rows), NAN);
    ASSERT_THAT(vk->Mxfp4Matmul(*resident, x.data(), batch, y_gpu.data()), IsOk());
    ASSERT_THAT(kernels::Matmul(m.view(), x.data(), batch, y_cpu.data(), {.idot = false}), IsOk());
    for (int64_t b = 0; b < batch; ++b) {
      EXPECT_LE(RelL2(y_gpu.data() + b * m.rows, y_cpu.data() + b * m.rows, m.rows),
                kRelL2Tolerance)
          << "batch " << batch << " row " << b;
    }
  }
}

TEST(VulkanMxfp4Matmul, MatrixFromAnotherContextIsRefused) {
  COLI_VK_CONTEXT_OR_SKIP(vk);
  COLI_VK_CONTEXT_OR_SKIP(other);
  std::mt19937 rng(2);
  const Mxfp4Matrix m = RandomMxfp4(2, 32, rng);
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<DeviceMxfp4Matrix> resident, other->UploadMxfp4(m.view()));
  const std::vector<float> x(32, 1.0f);
  std::vector<float> y(2);
  EXPECT_THAT(vk->Mxfp4Matmul(*resident, x.data(), 1, y.data()),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("another VulkanContext")));
  MatrixView int4 = m.view();
  int4.format = WeightFormat::kInt4G64;
  EXPECT_THAT(vk->UploadMxfp4(int4),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("int4")));
}

TEST(VulkanMxfp4Matmul, SpecialExponentsDecodeLikeCpu) {
  COLI_VK_CONTEXT_OR_SKIP(vk);
  // Row 0: exponent 0 -> scale +0, so the row is exactly 0. Row 1: exponent 255 -> inf, and a
  // zero nibble times inf is NaN on both sides. Row 2: exponent 1 (2^-126, its products
  // subnormal and negligible) beside exponent 130, finite on both sides.
  Mxfp4Matrix m;
  m.rows = 3;
  m.cols = 64;
  m.data.assign(3 * 32, 0x71);  // codes 1 (0.5) and 7 (6.0)
  m.data[32] = 0x10;            // row 1, column 0: code 0
  m.scales = {0, 0, 255, 255, 1, 130};
  const std::vector<float> x(64, 1.0f);
  std::vector<float> y_gpu(3), y_cpu(3);
  ASSERT_THAT(vk->Mxfp4Matmul(m.view(), x.data(), 1, y_gpu.data()), IsOk());
  ASSERT_THAT(kernels::Matmul(m.view(), x.data(), 1, y_cpu.data(), {.idot = false}), IsOk());
  EXPECT_EQ(y_gpu[0], 0.0f);
  EXPECT_EQ(y_cpu[0], 0.0f);
  EXPECT_TRUE(std::isnan(y_gpu[1])) << y_gpu[1];
  EXPECT_TRUE(std::isnan(y_cpu[1])) << y_cpu[1];
  EXPECT_TRUE(std::isfinite(y_gpu[2])) << y_gpu[2];
  EXPECT_NEAR(y_gpu[2], y_cpu[2], 1e-6 * std::fabs(y_cpu[2]));
}

TEST(VulkanMxfp4Matmul, RefusesBadInput) {
  COLI_VK_CONTEXT_OR_SKIP(vk);
  std::mt19937 rng(7);
  const Mxfp4Matrix m = RandomMxfp4(4, 64, rng);
  const std::vector<float> x(3 * 64, 1.0f);
  std::vector<float> y(3 * 4, 0.0f);

  MatrixView bad_cols = m.view();
  bad_cols.cols = 48;  // not a multiple of 32
  EXPECT_THAT(vk->Mxfp4Matmul(bad_cols, x.data(), 1, y.data()),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("48")));

  MatrixView int8 = m.view();
  int8.format = WeightFormat::kInt8Row;
  EXPECT_THAT(vk->Mxfp4Matmul(int8, x.data(), 1, y.data()),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("int8")));

  MatrixView no_scales = m.view();
  no_scales.scales = nullptr;
  EXPECT_THAT(vk->Mxfp4Matmul(no_scales, x.data(), 1, y.data()),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("scales")));

  EXPECT_THAT(vk->Mxfp4Matmul(m.view(), x.data(), -1, y.data()),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("batch")));
  EXPECT_THAT(vk->Mxfp4Matmul(m.view(), nullptr, 1, y.data()),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("null")));
  EXPECT_THAT(vk->Mxfp4Matmul(m.view(), x.data(), 1, nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("null")));

  // A batch of 0 does nothing and leaves y alone.
  y.assign(y.size(), 42.0f);
  EXPECT_THAT(vk->Mxfp4Matmul(m.view(), x.data(), 0, y.data()), IsOk());
  EXPECT_EQ(y[0], 42.0f);

  // The context stays usable after refusals.
  CompareWithCpu(*vk, m, 3, rng);  // asserts the per-element bound
}

TEST(VulkanMxfp4Matmul, BadDeviceIndexIsRefused) {
  setenv("COLI_VK_DEVICE", "999", 1);
  absl::StatusOr<std::unique_ptr<VulkanContext>> created = VulkanContext::Create();
  unsetenv("COLI_VK_DEVICE");
  if (!created.ok() && created.status().code() == absl::StatusCode::kUnavailable) {
    COLI_SKIP_UNLESS_VULKAN_REQUIRED() << "no Vulkan device: " << created.status();
  }
  EXPECT_THAT(created, StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("COLI_VK_DEVICE")));
}

// A model family passes its switches as options: the device it names is checked the same way,
// and they win over this process's COLI_VK_DEVICE / COLI_VK_STAGING.
TEST(VulkanMxfp4Matmul, OptionsWinOverTheEnvironment) {
  VulkanContextOptions options;
  options.device_index = 999;
  absl::StatusOr<std::unique_ptr<VulkanContext>> created = VulkanContext::Create(options);
  if (!created.ok() && created.status().code() == absl::StatusCode::kUnavailable) {
    COLI_SKIP_UNLESS_VULKAN_REQUIRED() << "no Vulkan device: " << created.status();
  }
  EXPECT_THAT(created,
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("COLI_VK_DEVICE='999'")));

  setenv("COLI_VK_DEVICE", "999", 1);
  setenv("COLI_VK_STAGING", "bogus", 1);
  options.device_index = 0;
  options.force_staging = false;
  created = VulkanContext::Create(options);
  unsetenv("COLI_VK_DEVICE");
  unsetenv("COLI_VK_STAGING");
  ASSERT_THAT(created, IsOk());
  EXPECT_EQ((*created)->device_index(), 0);
}

// As COLI_VK_CONTEXT_OR_SKIP, with options.
#define COLI_VK_CONTEXT_WITH_OR_SKIP(ctx, options)                                            \
  std::unique_ptr<VulkanContext> ctx;                                                        \
  {                                                                                          \
    absl::StatusOr<std::unique_ptr<VulkanContext>> created = VulkanContext::Create(options); \
    if (!created.ok() && created.status().code() == absl::StatusCode::kUnavailable) {        \
      COLI_SKIP_UNLESS_VULKAN_REQUIRED() << "no Vulkan device: " << created.status();        \
    }                                                                                        \
    ASSERT_THAT(created, IsOk());                                                            \
    ctx = std::move(created).value();                                                        \
  }

// y of one resident matmul, bit for bit.
std::vector<float> ResidentMatmul(VulkanContext& vk, const DeviceMxfp4Matrix& w,
                                  const std::vector<float>& x, int64_t batch) {
  std::vector<float> y(static_cast<size_t>(batch * w.rows()), NAN);
  EXPECT_THAT(vk.Mxfp4Matmul(w, x.data(), batch, y.data()), IsOk());
  return y;
}

TEST(VulkanStaging, ForcedStagingUploadsInChunksAndMatchesDirectUploadBitForBit) {
  // A 4 KiB staging buffer: a [64, 512] matrix (16 KiB of e2m1 bytes, 4 KiB of f32 scales)
  // needs several fills, each its own submission and fence.
  COLI_VK_CONTEXT_WITH_OR_SKIP(
      staged, (VulkanContextOptions{.force_staging = true, .staging_bytes = 4096}));
  EXPECT_TRUE(staged->staging());
  std::mt19937 rng(4096);
  const Mxfp4Matrix m = RandomMxfp4(64, 512, rng);
  const uint64_t before = staged->upload_batches();
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<DeviceMxfp4Matrix> w, staged->UploadMxfp4(m.view()));
  EXPECT_GE(staged->upload_batches() - before, 5u);  // 20 KiB through 4 KiB
  ASSERT_OK_AND_ASSIGN(const uint64_t expected, staged->Mxfp4DeviceBytes(64, 512));
  EXPECT_EQ(w->device_bytes(), expected);
  EXPECT_EQ(staged->resident_bytes(), expected);
  // Against the CPU float kernel (per-element rounding bound), and bit for bit against the
  // same matrix on a default context (written through mapped memory on lavapipe; staged too
  // under the staging.* registration, which sets COLI_VK_STAGING=1).
  EXPECT_LE(CompareWithCpu(*staged, m, 3, rng).max_rel_l2, kRelL2Tolerance);
  COLI_VK_CONTEXT_OR_SKIP(plain);
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<DeviceMxfp4Matrix> w_plain, plain->UploadMxfp4(m.view()));
  for (int64_t batch : {1, 5}) {
    const std::vector<float> x = RandomActivations(batch * m.cols, rng);
    EXPECT_EQ(ResidentMatmul(*staged, *w, x, batch), ResidentMatmul(*plain, *w_plain, x, batch))
        << "batch " << batch;
  }
  w.reset();
  EXPECT_EQ(staged->resident_bytes(), 0u);
}

TEST(VulkanStaging, BatchUploadUsesOneFencePerStagingFill) {
  COLI_VK_CONTEXT_WITH_OR_SKIP(vk, (VulkanContextOptions{.force_staging = true}));
  std::mt19937 rng(3);
  const Mxfp4Matrix a = RandomMxfp4(48, 96, rng), b = RandomMxfp4(96, 64, rng),
                    c = RandomMxfp4(0, 64, rng);
  const MatrixView views[] = {a.view(), b.view(), c.view()};
  const uint64_t before = vk->upload_batches();
  ASSERT_OK_AND_ASSIGN(std::vector<std::unique_ptr<DeviceMxfp4Matrix>> ws,
                       vk->UploadMxfp4Batch(views));
  EXPECT_EQ(vk->upload_batches() - before, 1u);  // all of it fits the 32 MiB buffer
  ASSERT_EQ(ws.size(), 3u);
  EXPECT_EQ(ws[2]->rows(), 0);
  const Mxfp4Matrix* ms[] = {&a, &b};
  for (int i = 0; i < 2; ++i) {
    const std::vector<float> x = RandomActivations(2 * ms[i]->cols, rng);
    std::vector<float> y_cpu(static_cast<size_t>(2 * ms[i]->rows));
    ASSERT_THAT(kernels::Matmul(ms[i]->view(), x.data(), 2, y_cpu.data(), {.idot = false}),
                IsOk());
    const std::vector<float> y = ResidentMatmul(*vk, *ws[i], x, 2);
    for (int64_t r = 0; r < 2; ++r) {
      EXPECT_LE(RelL2(y.data() + r * ms[i]->rows, y_cpu.data() + r * ms[i]->rows, ms[i]->rows),
                kRelL2Tolerance)
          << "matrix " << i;
    }
  }
}

TEST(VulkanStaging, FailedDeviceAllocationIsResourceExhaustedAndLeavesNothingBehind) {
  for (const bool staging : {false, true}) {
    COLI_VK_CONTEXT_WITH_OR_SKIP(vk, (VulkanContextOptions{.force_staging = staging}));
    std::mt19937 rng(7);
    const Mxfp4Matrix m = RandomMxfp4(16, 64, rng);
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<DeviceMxfp4Matrix> first, vk->UploadMxfp4(m.view()));
    const uint64_t held = vk->resident_bytes();
    // One failing allocation fails the whole batch and nothing of it stays allocated.
    vk->FailAllocationsForTesting(1);
    const MatrixView two[] = {m.view(), m.view()};
    EXPECT_THAT(vk->UploadMxfp4Batch(two),
                StatusIs(absl::StatusCode::kResourceExhausted,
                         HasSubstr("VK_ERROR_OUT_OF_DEVICE_MEMORY")))
        << "staging " << staging;
    EXPECT_EQ(vk->resident_bytes(), held);
    // Only that allocation failed: the context goes on.
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<DeviceMxfp4Matrix> again, vk->UploadMxfp4(m.view()));
    const std::vector<float> x = RandomActivations(m.cols, rng);
    EXPECT_EQ(ResidentMatmul(*vk, *again, x, 1), ResidentMatmul(*vk, *first, x, 1));
  }
}

TEST(VulkanStaging, MalformedSwitchIsRefused) {
  setenv("COLI_VK_STAGING", "yes", 1);
  absl::StatusOr<std::unique_ptr<VulkanContext>> created = VulkanContext::Create();
  unsetenv("COLI_VK_STAGING");
  EXPECT_THAT(created, StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("COLI_VK_STAGING")));
  EXPECT_THAT(VulkanContext::Create(VulkanContextOptions{.staging_bytes = 100}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("staging_bytes")));
}

// The chain and the matmul on one context, steps growing and shrinking, against a fresh context
// per step (fresh buffers and uploads): bit-identical, and a second pass allocates nothing.
TEST(VulkanReusedBuffers, GrowingAndShrinkingStepsMatchFreshBuffersBitForBit) {
  COLI_VK_CONTEXT_OR_SKIP(vk);
  std::mt19937 rng(11);
  constexpr int64_t kHidden = 64, kInter = 96;
  const Mxfp4Matrix gate = RandomMxfp4(kInter, kHidden, rng),
                    up = RandomMxfp4(kInter, kHidden, rng), down = RandomMxfp4(kHidden, kInter, rng);
  const MatrixView views[] = {gate.view(), up.view(), down.view()};
  ASSERT_OK_AND_ASSIGN(std::vector<std::unique_ptr<DeviceMxfp4Matrix>> w,
                       vk->UploadMxfp4Batch(views));
  const std::vector<std::vector<int64_t>> steps = {{1},       {3, 1}, {7, 2, 5}, {1},
                                                   {2, 2},    {9, 9, 9}, {1}, {4}};
  uint64_t after_first_pass = 0;
  for (int pass = 0; pass < 2; ++pass) {
    if (pass == 1) after_first_pass = vk->step_allocations();
    for (size_t step = 0; step < steps.size(); ++step) {
      std::vector<std::vector<float>> xs, ys, ys_fresh;
      std::vector<ExpertChainJob> jobs;
      for (int64_t rows : steps[step]) {
        xs.push_back(RandomActivations(rows * kHidden, rng));
        ys.emplace_back(static_cast<size_t>(rows * kHidden), NAN);
        ys_fresh.emplace_back(static_cast<size_t>(rows * kHidden), NAN);
      }
      for (size_t j = 0; j < xs.size(); ++j) {
        jobs.push_back(
            {w[0].get(), w[1].get(), w[2].get(), xs[j].data(), steps[step][j], ys[j].data()});
      }
      ASSERT_THAT(vk->ExpertChain(jobs, 4.0f, 25.0f), IsOk());
      COLI_VK_CONTEXT_OR_SKIP(fresh);
      ASSERT_OK_AND_ASSIGN(std::vector<std::unique_ptr<DeviceMxfp4Matrix>> fw,
                           fresh->UploadMxfp4Batch(views));
      for (size_t j = 0; j < jobs.size(); ++j) {
        jobs[j] = {fw[0].get(),    fw[1].get(),     fw[2].get(),
                   xs[j].data(),   steps[step][j],  ys_fresh[j].data()};
      }
      ASSERT_THAT(fresh->ExpertChain(jobs, 4.0f, 25.0f), IsOk());
      EXPECT_EQ(ys, ys_fresh) << "pass " << pass << " step " << step;
      // The plain matmul shares the kept activation and output buffers.
      const int64_t batch = steps[step][0];
      EXPECT_EQ(ResidentMatmul(*vk, *w[0], xs[0], batch),
                ResidentMatmul(*fresh, *fw[0], xs[0], batch))
          << "pass " << pass << " step " << step;
    }
  }
  // The first pass grew the buffers (fresh ones per call would have made 56); the second pass,
  // no larger than the first, allocates nothing.
  EXPECT_GE(after_first_pass, 5u);
  EXPECT_LT(after_first_pass, 56u);
  EXPECT_EQ(vk->step_allocations(), after_first_pass);
}

TEST(VulkanCopyProbe, TimesCopiesAndRefusesNothingToCopy) {
  COLI_VK_CONTEXT_OR_SKIP(vk);
  for (CopyKind kind : {CopyKind::kHostToDevice, CopyKind::kDeviceToDevice}) {
    ASSERT_OK_AND_ASSIGN(const double seconds, vk->TimeCopy(kind, 1 << 20, 2));
    EXPECT_GT(seconds, 0.0);
  }
  EXPECT_THAT(vk->TimeCopy(CopyKind::kHostToDevice, 0, 1),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST(VkResultName, NamesKnownAndUnknownCodes) {
  EXPECT_EQ(VkResultName(-4), "VK_ERROR_DEVICE_LOST");
  EXPECT_EQ(VkResultName(0), "VK_SUCCESS");
  EXPECT_EQ(VkResultName(-123456), "VkResult(-123456)");
}

}  // namespace
}  // namespace coli::vulkan
