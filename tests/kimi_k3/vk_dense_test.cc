// Kimi K3's shared experts on the Vulkan device (COLI_VK_DENSE, plugins/kimi_k3/vk_dense.h,
// the DeviceSharedExperts hook of latent_moe.h), on lavapipe here and in CI; the tests skip only
// when the machine has no Vulkan device at all.
//
// Reference: the CPU-only model run with K3_IDOT=0 (exact-float kernels) on the tiny fixture at
// the same K3_BITS (int4-g64, int8, f32 shared experts). The device's shared experts differ from
// the CPU's only in f32 summation order (rel-L2 ~2e-7 per block, tests/common/vk), so the logits
// must stay within kLogitsRelL2 and give the same greedy tokens; paths that leave the shared
// experts on the CPU must be bit-identical.
#include "plugins/kimi_k3/vk_dense.h"

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/safetensors/safetensors.h"
#include "common/status/status_matchers.h"
#include "common/vk/vulkan_context.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "plugins/kimi_k3/config.h"
#include "plugins/kimi_k3/expert_source.h"
#include "plugins/kimi_k3/model.h"
#include "plugins/kimi_k3/session.h"
#include "plugins/kimi_k3/vk_tier.h"
#include "tests/kimi_k3/reference_util.h"
#include "tests/kimi_k3/vk_test_util.h"

namespace coli::k3 {
namespace {

using ::coli::k3::testing::RelL2;
using ::coli::testing::IsOk;
using ::coli::testing::StatusIs;
using ::testing::HasSubstr;
using vk_testing::ExactOptions;
using vk_testing::FixtureDir;
using vk_testing::Greedy;
using vk_testing::GreedyRun;
using vk_testing::kGenerate;

// Whole-model logits with the shared experts on the device vs the CPU run: 12 MoE layers of
// random weights, each block off by ~2e-7; measured 5.2e-07 (int4), 6.1e-07 (int8), 8.6e-07
// (f32) on lavapipe (docs/status/vulkan.md). The bound leaves ~2x room.
constexpr double kLogitsRelL2 = 2e-6;

class K3VkDenseTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!std::filesystem::exists(FixtureDir() + "/config.json")) {
      FAIL() << "tiny fixture missing (build target k3_tiny_fixture): " << FixtureDir();
    }
    if (!vk_testing::HaveVulkan()) {
      COLI_SKIP_UNLESS_VULKAN_REQUIRED() << "no Vulkan device";
    }
    ASSERT_OK_AND_ASSIGN(cfg_, Config::LoadDir(FixtureDir()));
    for (int i = 0; i < cfg_.num_layers; ++i)
      if (!cfg_.is_dense(i)) ++moe_layers_;
  }

  static ModelOptions Options(int bits, int chunk) {
    ModelOptions o = ExactOptions();
    o.bits = bits;
    o.chunk = chunk;
    return o;
  }

  // The CPU-only run (no device opened).
  absl::StatusOr<GreedyRun> CpuRun(const ModelOptions& o) {
    COLI_ASSIGN_OR_RETURN(auto model, Model::Load(FixtureDir(), o));
    return Greedy(*model);
  }

  // A model with the Vulkan device open as the edges open it (ExpertSourceFactoryFor): `o` with
  // vulkan on, vk_dense = `dense`, vk_tier = `tier`; *tier_out receives the tier.
  absl::StatusOr<std::unique_ptr<Model>> VkModel(ModelOptions o, int dense, bool tier,
                                                 VkExpertTier** tier_out) {
    o.vulkan = true;
    o.vk_dense = dense;
    o.vk_tier = tier;
    return Model::Load(FixtureDir(), o, nullptr,
                       ExpertSourceFactoryFor(o, FixtureDir(), nullptr, tier_out));
  }

  // Same tokens; logits bit-identical (`exact`) or within kLogitsRelL2. Returns the worst rel-L2.
  static double ExpectMatches(const GreedyRun& run, const GreedyRun& cpu, bool exact) {
    EXPECT_EQ(run.tokens, cpu.tokens);
    EXPECT_EQ(run.logits.size(), cpu.logits.size());
    double worst = 0;
    for (size_t i = 0; i < run.logits.size() && i < cpu.logits.size(); ++i) {
      const auto& a = run.logits[i];
      const auto& b = cpu.logits[i];
      EXPECT_EQ(a.size(), b.size());
      if (a.size() != b.size()) continue;
      if (exact) {
        EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0)
            << "logits #" << i << " differ";
      }
      worst = std::max(worst, RelL2(a.data(), b.data(), static_cast<int64_t>(a.size())));
    }
    EXPECT_LE(worst, kLogitsRelL2);
    return worst;
  }

  Config cfg_;
  int moe_layers_ = 0;
};

// COLI_VK_DENSE=1 with COLI_VK_TIER=0, each K3_BITS format of the shared experts: the device
// computes every pass (prefill chunks of 4 or one of 12 rows, and the decode steps).
TEST_F(K3VkDenseTest, SharedExpertsOnTheDeviceMatchTheCpu) {
  const int passes_of_4 = 3 + kGenerate;  // 12-token prompt in chunks of 4, then the steps
  struct Case {
    int bits, chunk, device_passes;
  };
  const Case cases[] = {
      {4, 4, passes_of_4}, {8, 4, passes_of_4}, {32, 4, passes_of_4}, {4, 16, 1 + kGenerate}};
  for (const Case& c : cases) {
    SCOPED_TRACE(absl::StrCat("K3_BITS=", c.bits, " K3_CHUNK=", c.chunk));
    const ModelOptions o = Options(c.bits, c.chunk);
    ASSERT_OK_AND_ASSIGN(GreedyRun cpu, CpuRun(o));
    VkExpertTier* tier = nullptr;
    ASSERT_OK_AND_ASSIGN(auto model, VkModel(o, kVkDenseDevice, /*tier=*/false, &tier));
    ASSERT_NE(tier, nullptr);
    ASSERT_OK_AND_ASSIGN(GreedyRun run, Greedy(*model));
    const double worst = ExpectMatches(run, cpu, /*exact=*/false);
    const VkTierStats s = tier->Stats();
    EXPECT_TRUE(s.dense_on);
    EXPECT_FALSE(s.tier);
    EXPECT_EQ(s.slots, 0u);
    EXPECT_EQ(s.resident, 0u);
    EXPECT_EQ(s.hits, 0u);
    EXPECT_EQ(s.dense.calls, static_cast<uint64_t>(moe_layers_ * c.device_passes));
    EXPECT_EQ(s.dense.matrices, static_cast<uint64_t>(3 * moe_layers_));
    EXPECT_EQ(s.dense.bytes, tier->context().resident_bytes());  // nothing else is resident
    EXPECT_GT(s.dense.bytes, 0u);
    EXPECT_EQ(s.matmuls, 3 * s.dense.calls);
    EXPECT_EQ(s.dense.failures, 0u);
    std::printf("[dense bits %d chunk %d] worst logits rel-L2 vs CPU %.3g; %s", c.bits, c.chunk,
                worst, VkTierReport(s).c_str());
  }
}

// K3_IDOT=1 (the default numerics) with COLI_VK_DENSE=1: int8 and int4-g64 shared experts on
// the device run the CPU's integer-dot kernels bit for bit (DenseGlu with MatmulNumerics::kIdot,
// SiTU-GLU on the host), so every step's logits equal the CPU-only run's byte for byte (before:
// f32 activations on the device, other logits from the first pass). f32 shared experts have no
// integer path on the CPU either: the device keeps its f32 shader, equal up to summation order.
TEST_F(K3VkDenseTest, IdotSharedExpertsOnTheDeviceGiveTheCpuBits) {
  for (const int bits : {4, 8, 32}) {
    SCOPED_TRACE(absl::StrCat("K3_BITS=", bits, " K3_IDOT=1"));
    ModelOptions o = Options(bits, 4);
    o.idot = true;
    ASSERT_OK_AND_ASSIGN(GreedyRun cpu, CpuRun(o));
    VkExpertTier* tier = nullptr;
    ASSERT_OK_AND_ASSIGN(auto model, VkModel(o, kVkDenseDevice, /*tier=*/false, &tier));
    ASSERT_OK_AND_ASSIGN(GreedyRun run, Greedy(*model));
    const double worst = ExpectMatches(run, cpu, /*exact=*/bits != 32);
    const VkTierStats s = tier->Stats();
    EXPECT_EQ(s.dense.failures, 0u);
    EXPECT_EQ(s.dense.calls, static_cast<uint64_t>(moe_layers_ * (3 + kGenerate)));
    EXPECT_EQ(s.matmuls, 3 * s.dense.calls);
    std::printf("[dense idot bits %d] worst logits rel-L2 vs CPU %.3g\n", bits, worst);
  }
}

// A device without shaderInt64 cannot run the integer-dot shaders: under K3_IDOT=1 the dense
// path's first call fails (UNIMPLEMENTED), it turns itself off, and that call and every later
// one are the CPU's: the run is the CPU's bit for bit.
TEST_F(K3VkDenseTest, IdotWithoutInt64FallsBackToTheCpuBits) {
  ModelOptions o = Options(4, 4);
  o.idot = true;
  ASSERT_OK_AND_ASSIGN(GreedyRun cpu, CpuRun(o));
  VkTierOptions to;
  to.tier = false;
  to.budget_gb = 0;
  to.dense = kVkDenseDevice;
  VkExpertTier* tier = nullptr;
  auto factory = [&](st::Snapshot& snapshot, const Config& cfg, const std::string& prefix,
                     int num_layers) -> absl::StatusOr<std::unique_ptr<ExpertSource>> {
    COLI_ASSIGN_OR_RETURN(
        auto vk, vulkan::VulkanContext::Create(vulkan::VulkanContextOptions{.use_int64 = false}));
    COLI_ASSIGN_OR_RETURN(auto pread, PreadExpertSource::Create(snapshot, cfg, prefix, num_layers));
    COLI_ASSIGN_OR_RETURN(auto t, VkExpertTier::Create(std::move(vk), std::move(pread), snapshot,
                                                       cfg, prefix, num_layers, to));
    tier = t.get();
    return std::unique_ptr<ExpertSource>(std::move(t));
  };
  ASSERT_OK_AND_ASSIGN(auto model, Model::Load(FixtureDir(), o, nullptr, factory));
  ASSERT_FALSE(tier->context().supports_idot());
  ASSERT_OK_AND_ASSIGN(GreedyRun run, Greedy(*model));
  ExpectMatches(run, cpu, /*exact=*/true);
  const VkTierStats s = tier->Stats();
  EXPECT_TRUE(s.dense.disabled);
  EXPECT_EQ(s.dense.failures, 1u);
  EXPECT_EQ(s.dense.calls, 0u);
  EXPECT_EQ(s.matmuls, 0u);
}

// Where a row's shared experts are computed must not depend on how many rows share its pass:
// the device's sums differ from the CPU's in their last bits, and passes are cut differently by
// K3_CHUNK, by checkpoint and prefix cache restore points, by speculative verify chunks and by
// batching, none of which may change an answer. Passes of more than 8 rows used to stay on the
// CPU: a prompt prefilled in chunks of 16 gave other logits than in chunks of 4 or 1.
TEST_F(K3VkDenseTest, EveryPassShapeGivesTheSameBits) {
  GreedyRun first;
  for (const int chunk : {16, 4, 1}) {
    SCOPED_TRACE(absl::StrCat("K3_CHUNK=", chunk));
    VkExpertTier* tier = nullptr;
    ASSERT_OK_AND_ASSIGN(auto model, VkModel(Options(4, chunk), kVkDenseDevice, false, &tier));
    ASSERT_OK_AND_ASSIGN(GreedyRun run, Greedy(*model));
    ASSERT_NE(tier->dense(), nullptr);
    tier->dense()->WaitForUploads();
    const VkTierStats s = tier->Stats();
    EXPECT_EQ(s.dense.failures, 0u);
    EXPECT_GT(s.dense.calls, 0u);
    // Each layer's three shared-expert matrices uploaded once, never again.
    EXPECT_EQ(s.dense.matrices, static_cast<uint64_t>(3 * moe_layers_));
    EXPECT_EQ(s.dense.bytes, tier->context().resident_bytes());
    if (chunk == 16) {
      first = run;
    } else {
      ExpectMatches(run, first, /*exact=*/true);
    }
  }
}

// COLI_VK_DENSE=1 beside the routed-expert tier (promotions on, no history): both on the device
// in the same steps, same tokens.
TEST_F(K3VkDenseTest, SharedExpertsBesideTheTier) {
  const ModelOptions o = Options(4, 4);
  ASSERT_OK_AND_ASSIGN(GreedyRun cpu, CpuRun(o));
  ModelOptions vo = o;
  const double I = cfg_.moe.intermediate, H = cfg_.moe.latent;
  vo.vk_tier_gb = 40.5 * 3 * (I * H / 2 + I * H / 32 * 4) / 1e9;  // 40 expert slots
  vo.vk_tier_rate = 8;
  VkExpertTier* tier = nullptr;
  ASSERT_OK_AND_ASSIGN(auto model, VkModel(vo, kVkDenseDevice, /*tier=*/true, &tier));
  ASSERT_OK_AND_ASSIGN(GreedyRun run, Greedy(*model, [&] { tier->WaitForUploads(); }));
  const double worst = ExpectMatches(run, cpu, /*exact=*/false);
  const VkTierStats s = tier->Stats();
  EXPECT_GT(s.hits, 0u);
  EXPECT_EQ(s.dense.calls, static_cast<uint64_t>(moe_layers_ * (3 + kGenerate)));
  EXPECT_EQ(s.matmuls, 3 * s.hits + 3 * s.dense.calls);
  std::printf("[dense + tier] worst logits rel-L2 vs CPU %.3g; %s", worst, VkTierReport(s).c_str());
}

// COLI_VK_DENSE=0 (and COLI_VK_TIER=0): the device is open but computes nothing, bit-identical
// to the CPU. COLI_VK_DENSE=auto follows the device type (lavapipe is a CPU device: off).
TEST_F(K3VkDenseTest, DenseOffIsBitIdenticalAndAutoFollowsTheDeviceType) {
  const ModelOptions o = Options(4, 4);
  ASSERT_OK_AND_ASSIGN(GreedyRun cpu, CpuRun(o));
  for (const int mode : {kVkDenseCpu, kVkDenseAuto}) {
    SCOPED_TRACE(absl::StrCat("vk_dense ", mode));
    VkExpertTier* tier = nullptr;
    ASSERT_OK_AND_ASSIGN(auto model, VkModel(o, mode, /*tier=*/false, &tier));
    const bool discrete = tier->context().discrete_gpu();
    ASSERT_OK_AND_ASSIGN(GreedyRun run, Greedy(*model));
    const VkTierStats s = tier->Stats();
    if (mode == kVkDenseCpu || !discrete) {
      ExpectMatches(run, cpu, /*exact=*/true);
      EXPECT_FALSE(s.dense_on);
      EXPECT_EQ(s.matmuls, 0u);
      EXPECT_EQ(s.dense.calls, 0u);
      EXPECT_THAT(VkTierReport(s), HasSubstr("[VK] dense kimi_k3 shared experts on the CPU"));
    } else {
      ExpectMatches(run, cpu, /*exact=*/false);  // auto on a discrete GPU: the device
      EXPECT_TRUE(s.dense_on);
    }
  }
}

// A failed submission of the dense path: that call's shared experts are computed on the CPU and
// the path turns off (one log line). Failing the very first one leaves everything on the CPU, so
// the run is the CPU's bit for bit; failing one after the first pass keeps the tokens.
TEST_F(K3VkDenseTest, FailedSubmissionFallsBackToTheCpu) {
  const ModelOptions o = Options(4, 4);
  ASSERT_OK_AND_ASSIGN(GreedyRun cpu, CpuRun(o));
  for (const bool at_start : {true, false}) {
    SCOPED_TRACE(at_start ? "first submission fails" : "a submission after the first pass fails");
    VkExpertTier* tier = nullptr;
    ASSERT_OK_AND_ASSIGN(auto model, VkModel(o, kVkDenseDevice, /*tier=*/false, &tier));
    if (at_start) tier->context().FailSubmissionsForTesting(1);
    bool injected = at_start;
    ASSERT_OK_AND_ASSIGN(GreedyRun run, Greedy(*model, [&] {
                           if (!injected) tier->context().FailSubmissionsForTesting(1);
                           injected = true;
                         }));
    ExpectMatches(run, cpu, /*exact=*/at_start);
    const VkTierStats s = tier->Stats();
    EXPECT_TRUE(s.dense.disabled);
    EXPECT_EQ(s.dense.failures, 1u);
    EXPECT_EQ(s.dense.matrices, 0u);  // freed
    EXPECT_EQ(tier->context().resident_bytes(), 0u);
    // Before the failure: every MoE layer of the 3 prefill chunks (none when it is the first).
    EXPECT_EQ(s.dense.calls, at_start ? 0u : static_cast<uint64_t>(3 * moe_layers_));
    EXPECT_THAT(VkTierReport(s), HasSubstr("stopped after a device failure"));
    EXPECT_THAT(VkTierReport(s), ::testing::Not(HasSubstr("DISABLED")));  // the tier is fine
  }
}

// The device refusing the first dense upload for memory: uploads stop, no layer is resident,
// every shared expert stays on the CPU (bit-identical), the path is not disabled.
TEST_F(K3VkDenseTest, UploadOutOfDeviceMemoryKeepsTheCpu) {
  const ModelOptions o = Options(4, 4);
  ASSERT_OK_AND_ASSIGN(GreedyRun cpu, CpuRun(o));
  VkExpertTier* tier = nullptr;
  ASSERT_OK_AND_ASSIGN(auto model, VkModel(o, kVkDenseDevice, /*tier=*/false, &tier));
  tier->context().FailAllocationsForTesting(1, /*uploads_only=*/true);
  ASSERT_OK_AND_ASSIGN(GreedyRun run, Greedy(*model));
  ExpectMatches(run, cpu, /*exact=*/true);
  const VkTierStats s = tier->Stats();
  EXPECT_TRUE(s.dense.uploads_stopped);
  EXPECT_FALSE(s.dense.disabled);
  EXPECT_EQ(s.dense.matrices, 0u);
  EXPECT_EQ(s.dense.calls, 0u);
  EXPECT_EQ(s.dense.failures, 1u);
  EXPECT_THAT(VkTierReport(s), HasSubstr("uploads stopped (device memory full)"));
}

TEST(K3VkDenseSwitches, ValuesAndRefusals) {
  auto resolve = [](std::map<std::string, std::string> env) -> absl::StatusOr<ModelOptions> {
    ModelOptions o;
    COLI_RETURN_IF_ERROR(VkSwitches::FromEnv([&](const char* name) -> const char* {
                           auto it = env.find(name);
                           return it == env.end() ? nullptr : it->second.c_str();
                         }).Resolve(&o));
    return o;
  };
  ASSERT_OK_AND_ASSIGN(ModelOptions o, resolve({}));
  EXPECT_EQ(o.vk_dense, kVkDenseAuto);
  EXPECT_TRUE(o.vk_tier);
  ASSERT_OK_AND_ASSIGN(o, resolve({{"COLI_VK_DENSE", "1"}, {"COLI_VK_TIER", "0"}}));
  EXPECT_EQ(o.vk_dense, kVkDenseDevice);
  EXPECT_FALSE(o.vk_tier);
  ASSERT_OK_AND_ASSIGN(o, resolve({{"COLI_VK_DENSE", "0"}, {"COLI_VK_TIER", "1"}}));
  EXPECT_EQ(o.vk_dense, kVkDenseCpu);
  EXPECT_TRUE(o.vk_tier);
  ASSERT_OK_AND_ASSIGN(o, resolve({{"COLI_VK_DENSE", "auto"}}));
  EXPECT_EQ(o.vk_dense, kVkDenseAuto);
  for (const char* bad : {"yes", "2", "AUTO", " 1"}) {
    EXPECT_THAT(resolve({{"COLI_VK_DENSE", bad}}),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("COLI_VK_DENSE")))
        << bad;
    EXPECT_THAT(resolve({{"COLI_VK_TIER", bad}}),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("COLI_VK_TIER")))
        << bad;
  }
  // A typed value out of range (a caller filling ModelOptions itself) is refused at open.
  EXPECT_THAT(VkDenseOnDevice(7, true),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("COLI_VK_DENSE")));
  EXPECT_EQ(VkDenseOnDevice(kVkDenseAuto, true).value_or(false), true);
  EXPECT_EQ(VkDenseOnDevice(kVkDenseAuto, false).value_or(true), false);
  EXPECT_EQ(VkDenseOnDevice(kVkDenseDevice, false).value_or(false), true);
  EXPECT_EQ(VkDenseOnDevice(kVkDenseCpu, true).value_or(true), false);
}

TEST_F(K3VkDenseTest, BadDenseModeIsRefusedAtOpen) {
  VkExpertTier* tier = nullptr;
  EXPECT_THAT(VkModel(Options(4, 4), 7, /*tier=*/false, &tier),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("COLI_VK_DENSE")));
}

}  // namespace
}  // namespace coli::k3
