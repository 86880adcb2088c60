// Tests for the integer-dot MXFP4 path of common/vk (MatmulNumerics::kIdot,
// shaders/mxfp4_matmul_idot.comp) on a real Vulkan device (lavapipe in CI): it must give the
// CPU's kernels::Matmul(idot = true) — what Kimi K3 runs by default (K3_IDOT=1) — bit for bit,
// so an expert computed on the device equals the same expert computed on the CPU. The reference
// is the CPU kernel itself (and common/ops SituGlu for the expert chain); no tolerance.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <tuple>
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

struct Mxfp4Matrix {
  int64_t rows = 0;
  int64_t cols = 0;
  std::vector<uint8_t> data;    // rows*cols/2 e2m1 bytes, low nibble = even column
  std::vector<uint8_t> scales;  // rows*cols/32 E8M0 exponents
  MatrixView view() const {
    return MatrixView{WeightFormat::kMxfp4, rows, cols, data.data(), scales.data()};
  }
};

// Every e2m1 code of both signs; exponents uniform in [lo, hi].
Mxfp4Matrix RandomMxfp4(int64_t rows, int64_t cols, int lo, int hi, std::mt19937& rng) {
  Mxfp4Matrix m;
  m.rows = rows;
  m.cols = cols;
  m.data.resize(static_cast<size_t>(rows * cols / 2));
  m.scales.resize(static_cast<size_t>(rows * cols / 32));
  std::uniform_int_distribution<int> byte(0, 255);
  std::uniform_int_distribution<int> exponent(lo, hi);
  for (uint8_t& b : m.data) b = static_cast<uint8_t>(byte(rng));
  for (uint8_t& s : m.scales) s = static_cast<uint8_t>(exponent(rng));
  return m;
}

std::vector<float> CpuIdot(const Mxfp4Matrix& m, const std::vector<float>& x, int64_t batch) {
  std::vector<float> y(static_cast<size_t>(batch * m.rows), NAN);
  EXPECT_THAT(kernels::Matmul(m.view(), x.data(), batch, y.data(),
                              kernels::MatmulOptions{.idot = true, .threads = 1}),
              IsOk());
  return y;
}

TEST(VulkanMxfp4Idot, MatchesCpuIdotKernelBitForBitOnOddShapes) {
  COLI_IDOT_CONTEXT_OR_SKIP(vk, VulkanContextOptions{});
  std::mt19937 rng(2026);
  int64_t elements = 0, mismatches = 0;
  for (int64_t rows : {1, 3, 37}) {
    for (int64_t cols : {32, 96, 3584}) {
      const Mxfp4Matrix m = RandomMxfp4(rows, cols, 118, 134, rng);
      ASSERT_OK_AND_ASSIGN(std::unique_ptr<DeviceMxfp4Matrix> dm, vk->UploadMxfp4(m.view()));
      for (int64_t batch : {1, 3, 8, 11}) {
        const std::vector<float> x = RandomActivations(1, batch * cols, 32, 12, rng);
        std::vector<float> y(static_cast<size_t>(batch * rows), NAN);
        ASSERT_THAT(vk->Mxfp4Matmul(*dm, x.data(), batch, y.data(), MatmulNumerics::kIdot), IsOk());
        mismatches += Mismatches(y, CpuIdot(m, x, batch),
                                 absl::StrCat("[", rows, ", ", cols, "] batch ", batch));
        elements += batch * rows;
      }
    }
  }
  EXPECT_EQ(mismatches, 0);
  std::printf("[idot] odd shapes: %lld of %lld outputs differ from kernels::Matmul(idot)\n",
              static_cast<long long>(mismatches), static_cast<long long>(elements));
}

// Kimi K3's routed-expert shapes: gate/up [3072, 3584] and down [3584, 3072]; batch 1 (decode)
// and 3 (one expert chosen by several rows of a chunk).
TEST(VulkanMxfp4Idot, MatchesCpuIdotKernelOnExpertShapes) {
  COLI_IDOT_CONTEXT_OR_SKIP(vk, VulkanContextOptions{});
  std::mt19937 rng(3584);
  for (const auto& [rows, cols, batch] : {std::tuple<int64_t, int64_t, int64_t>{3072, 3584, 1},
                                          std::tuple<int64_t, int64_t, int64_t>{3584, 3072, 3}}) {
    const Mxfp4Matrix m = RandomMxfp4(rows, cols, 118, 134, rng);
    const std::vector<float> x = RandomActivations(1, batch * cols, 32, 4, rng);
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<DeviceMxfp4Matrix> dm, vk->UploadMxfp4(m.view()));
    std::vector<float> y(static_cast<size_t>(batch * rows), NAN);
    const auto t0 = std::chrono::steady_clock::now();
    ASSERT_THAT(vk->Mxfp4Matmul(*dm, x.data(), batch, y.data(), MatmulNumerics::kIdot), IsOk());
    const auto t1 = std::chrono::steady_clock::now();
    const int64_t mismatches =
        Mismatches(y, CpuIdot(m, x, batch), absl::StrCat("[", rows, ", ", cols, "]"));
    EXPECT_EQ(mismatches, 0);
    // The f32 path on the same data is a different computation (activations not quantized): it
    // differs, which is why the tier needs this one.
    std::vector<float> y_float(y.size(), NAN);
    const auto t2 = std::chrono::steady_clock::now();
    ASSERT_THAT(vk->Mxfp4Matmul(*dm, x.data(), batch, y_float.data()), IsOk());
    const auto t3 = std::chrono::steady_clock::now();
    int64_t differ = 0;
    for (size_t i = 0; i < y.size(); ++i) differ += SameValue(y[i], y_float[i]) ? 0 : 1;
    EXPECT_GT(differ, 0);
    // Wall times of one resident matmul (not asserted; on lavapipe they say nothing about a GPU).
    std::printf(
        "[idot] [%lld, %lld] batch %lld: %lld of %zu outputs differ from the CPU's (the "
        "f32 path: %lld); idot %.0f ms, f32 %.0f ms\n",
        static_cast<long long>(rows), static_cast<long long>(cols), static_cast<long long>(batch),
        static_cast<long long>(mismatches), y.size(), static_cast<long long>(differ),
        std::chrono::duration<double, std::milli>(t1 - t0).count(),
        std::chrono::duration<double, std::milli>(t3 - t2).count());
  }
}

// Every exponent byte (0 → +0, 255 → inf and NaN results), subnormal group scales and lane sums
// (small exponents with tiny activations), overflow to infinity (large ones with huge
// activations), rows whose every scale is zero (signed-zero sums): the integer rounding of the
// shader against the CPU's IEEE arithmetic, bit for bit.
TEST(VulkanMxfp4Idot, ExtremeScalesRoundLikeTheCpu) {
  COLI_IDOT_CONTEXT_OR_SKIP(vk, VulkanContextOptions{});
  std::mt19937 rng(255);
  struct Case {
    const char* what;
    int lo, hi;        // exponent bytes
    float activation;  // magnitude of the activations
  };
  const Case cases[] = {
      {"every exponent", 0, 255, 1.0f},   {"subnormal scales", 1, 40, 1e-18f},
      {"subnormal lanes", 10, 20, 1e-6f}, {"near overflow", 236, 246, 1.0f},
      {"zero scales", 0, 0, 1.0f},
  };
  for (const Case& c : cases) {
    Mxfp4Matrix m = RandomMxfp4(37, 256, c.lo, c.hi, rng);
    std::vector<float> x = RandomActivations(1, 5 * 256, 32, 6, rng);
    for (float& v : x) v *= c.activation;
    std::vector<float> y(5 * 37, NAN);
    ASSERT_THAT(vk->Mxfp4Matmul(m.view(), x.data(), 5, y.data(), MatmulNumerics::kIdot), IsOk());
    const std::vector<float> want = CpuIdot(m, x, 5);
    const int64_t mismatches = Mismatches(y, want, c.what);
    EXPECT_EQ(mismatches, 0);
    int64_t subnormal = 0, infinite = 0, nan = 0, zero = 0;
    for (float v : want) {
      subnormal += std::fpclassify(v) == FP_SUBNORMAL;
      infinite += std::isinf(v);
      nan += std::isnan(v);
      zero += v == 0.0f;
    }
    std::printf(
        "[idot] %s: %lld of %zu outputs differ (CPU: %lld subnormal, %lld inf, %lld NaN, "
        "%lld zero)\n",
        c.what, static_cast<long long>(mismatches), want.size(), static_cast<long long>(subnormal),
        static_cast<long long>(infinite), static_cast<long long>(nan),
        static_cast<long long>(zero));
  }
}

// The expert chain in idot mode: gate and up, SiTU-GLU, down for several jobs against the CPU's
// expert (Matmul(idot) for each matrix, ops::SituGlu between), bit for bit.
TEST(VulkanMxfp4Idot, ExpertChainMatchesCpuIdotExpertBitForBit) {
  COLI_IDOT_CONTEXT_OR_SKIP(vk, VulkanContextOptions{});
  std::mt19937 rng(7);
  // Wide enough that every lane takes several fma steps (a non-fused fma shows up).
  const int64_t inter = 512, hidden = 1024;
  const float beta1 = 4.0f, beta2 = 25.0f;
  const int64_t job_rows[] = {1, 3, 9, 0, 2};
  std::vector<Mxfp4Matrix> host;
  std::vector<std::unique_ptr<DeviceMxfp4Matrix>> device;
  std::vector<std::vector<float>> x, y, want;
  std::vector<ExpertChainJob> jobs;
  for (int64_t rows : job_rows) {
    for (const auto& [r, c] :
         {std::pair{inter, hidden}, std::pair{inter, hidden}, std::pair{hidden, inter}}) {
      host.push_back(RandomMxfp4(r, c, 120, 130, rng));
      ASSERT_OK_AND_ASSIGN(auto dm, vk->UploadMxfp4(host.back().view()));
      device.push_back(std::move(dm));
    }
    x.push_back(RandomActivations(1, rows * hidden, 32, 3, rng));
    y.emplace_back(static_cast<size_t>(rows * hidden), NAN);
    const Mxfp4Matrix* w = &host[host.size() - 3];
    const kernels::MatmulOptions idot{.idot = true, .threads = 1};
    std::vector<float> g(static_cast<size_t>(rows * inter)), u(g.size());
    std::vector<float>& ref = want.emplace_back(static_cast<size_t>(rows * hidden));
    if (rows > 0) {
      ASSERT_THAT(kernels::Matmul(w[0].view(), x.back().data(), rows, g.data(), idot), IsOk());
      ASSERT_THAT(kernels::Matmul(w[1].view(), x.back().data(), rows, u.data(), idot), IsOk());
      ops::SituGlu(g.data(), u.data(), rows * inter, beta1, beta2, g.data());
      ASSERT_THAT(kernels::Matmul(w[2].view(), g.data(), rows, ref.data(), idot), IsOk());
    }
  }
  for (size_t j = 0; j < std::size(job_rows); ++j) {
    jobs.push_back({device[3 * j].get(), device[3 * j + 1].get(), device[3 * j + 2].get(),
                    x[j].data(), job_rows[j], y[j].data()});
  }
  const uint64_t before = vk->matmuls();
  ASSERT_THAT(vk->ExpertChain(jobs, beta1, beta2, MatmulNumerics::kIdot), IsOk());
  EXPECT_EQ(vk->matmuls() - before, 3u * 4);  // the zero-row job is skipped
  int64_t mismatches = 0;
  for (size_t j = 0; j < jobs.size(); ++j) {
    mismatches += Mismatches(y[j], want[j], absl::StrCat("job ", j));
  }
  EXPECT_EQ(mismatches, 0);
  std::printf("[idot] expert chain [%lld, %lld], 5 jobs: %lld outputs differ from the CPU's\n",
              static_cast<long long>(inter), static_cast<long long>(hidden),
              static_cast<long long>(mismatches));
  // The f32 chain on the same jobs is the K3_IDOT=0 computation: not the same bits.
  std::vector<float> y0 = y[2];
  ASSERT_THAT(vk->ExpertChain(jobs, beta1, beta2), IsOk());
  int64_t differ = 0;
  for (size_t i = 0; i < y0.size(); ++i) differ += SameValue(y[2][i], y0[i]) ? 0 : 1;
  EXPECT_GT(differ, 0);
}

// A non-finite activation is refused as the CPU refuses it (INVALID_ARGUMENT naming the batch
// row), in the matmul and in the chain; the context works afterwards.
TEST(VulkanMxfp4Idot, RefusesNonFiniteActivationsLikeTheCpu) {
  COLI_IDOT_CONTEXT_OR_SKIP(vk, VulkanContextOptions{});
  std::mt19937 rng(3);
  const Mxfp4Matrix m = RandomMxfp4(8, 64, 120, 130, rng);
  std::vector<float> x = RandomActivations(1, 3 * 64, 32, 2, rng);
  x[64 + 5] = NAN;
  std::vector<float> y(3 * 8, 0.0f);
  const absl::Status cpu = kernels::Matmul(m.view(), x.data(), 3, y.data());
  ASSERT_THAT(cpu, StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("batch row 1")));
  EXPECT_THAT(vk->Mxfp4Matmul(m.view(), x.data(), 3, y.data(), MatmulNumerics::kIdot),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("batch row 1")));
  ASSERT_OK_AND_ASSIGN(auto resident, vk->UploadMxfp4(m.view()));
  // A GLU block [32, 64] / [64, 32] for the chain (MXFP4 rows of 8 columns do not exist).
  const Mxfp4Matrix gate_host = RandomMxfp4(32, 64, 120, 130, rng);
  const Mxfp4Matrix down_host = RandomMxfp4(64, 32, 120, 130, rng);
  ASSERT_OK_AND_ASSIGN(auto gate, vk->UploadMxfp4(gate_host.view()));
  ASSERT_OK_AND_ASSIGN(auto down, vk->UploadMxfp4(down_host.view()));
  std::vector<float> out(3 * 64, 0.0f);
  const ExpertChainJob job{gate.get(), gate.get(), down.get(), x.data(), 3, out.data()};
  EXPECT_THAT(vk->ExpertChain(std::span(&job, 1), 4.0f, 25.0f, MatmulNumerics::kIdot),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("batch row 1")));
  x[64 + 5] = 0.5f;
  EXPECT_THAT(vk->ExpertChain(std::span(&job, 1), 4.0f, 25.0f, MatmulNumerics::kIdot), IsOk());
  ASSERT_THAT(vk->Mxfp4Matmul(*resident, x.data(), 3, y.data(), MatmulNumerics::kIdot), IsOk());
  EXPECT_EQ(Mismatches(y, CpuIdot(m, x, 3), "after the refusal"), 0);
}

// A device without shaderInt64 (VulkanContextOptions::use_int64 = false stands in for one): the
// idot kernel is refused with UNIMPLEMENTED naming what is missing and the K3_IDOT=0 way out,
// before anything runs; the f32 paths work.
TEST(VulkanMxfp4Idot, DeviceWithoutInt64RefusesIdotAndKeepsFloat) {
  COLI_IDOT_CONTEXT_OR_SKIP(probe, VulkanContextOptions{});
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<VulkanContext> vk,
                       VulkanContext::Create(VulkanContextOptions{.use_int64 = false}));
  EXPECT_FALSE(vk->supports_idot());
  std::mt19937 rng(64);
  const Mxfp4Matrix m = RandomMxfp4(32, 64, 120, 130, rng);
  const Mxfp4Matrix down_host = RandomMxfp4(64, 32, 120, 130, rng);
  const std::vector<float> x = RandomActivations(1, 2 * 64, 32, 2, rng);
  std::vector<float> y(2 * 64, 0.0f);
  EXPECT_THAT(vk->Mxfp4Matmul(m.view(), x.data(), 2, y.data(), MatmulNumerics::kIdot),
              StatusIs(absl::StatusCode::kUnimplemented,
                       ::testing::AllOf(HasSubstr("shaderInt64"), HasSubstr("K3_IDOT=0"))));
  ASSERT_OK_AND_ASSIGN(auto gate, vk->UploadMxfp4(m.view()));
  ASSERT_OK_AND_ASSIGN(auto down, vk->UploadMxfp4(down_host.view()));
  const ExpertChainJob job{gate.get(), gate.get(), down.get(), x.data(), 2, y.data()};
  const uint64_t before = vk->matmuls();
  EXPECT_THAT(vk->ExpertChain(std::span(&job, 1), 4.0f, 25.0f, MatmulNumerics::kIdot),
              StatusIs(absl::StatusCode::kUnimplemented, HasSubstr("shaderInt64")));
  EXPECT_EQ(vk->matmuls(), before);
  EXPECT_THAT(vk->ExpertChain(std::span(&job, 1), 4.0f, 25.0f), IsOk());
  EXPECT_EQ(vk->matmuls(), before + 3);
}

}  // namespace
}  // namespace coli::vulkan
