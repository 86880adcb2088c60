// The Vulkan expert tier through the kimi_k3 plugin ABI (the path of coli serve / coli run): the
// client's extra options "vulkan"/"vk"/"vk_tier_gb"/"vk_tier_rate"/… (tools/coli/client.cc reads
// COLI_VULKAN, K3_VK, COLI_VK_TIER_GB, … into them) reach plugin_entry.cc, which opens the
// device and wraps the streaming store in the tier. With K3_IDOT=0 the greedy tokens equal the
// plugin without the tier; the vk_* family stats move. Tiny fixture (build/fixtures/k3_tiny).
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/status/status.h"
#include "common/status/status_matchers.h"
#include "common/vk/vulkan_context.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/common/io/test_files.h"
#include "tests/common/vk/require_vulkan.h"
#include "tests/kimi_k3/plugin_abi_test_util.h"

namespace coli::k3 {
namespace {

using ::coli::testing::StatusIs;
using ::testing::HasSubstr;

const std::vector<int32_t> kPrompt = {5, 17, 300, 45, 45, 211, 9, 400, 123, 77, 301, 88};
constexpr int kSteps = 8;

class K3VkTierPluginTest : public abi_test::PluginAbiTest {
 protected:
  // The fixture with K3_IDOT=0 (the device's f32-activation math), prefill chunk 4 and `extra`.
  absl::StatusOr<coli_model_t*> OpenExact(const Extra& extra) {
    return TryOpen(extra, -1, [](coli_model_options_t* o) {
      o->idot = 0;
      o->chunk = 4;
    });
  }
  // Greedy tokens of kPrompt on a fresh session and that session's stats afterwards.
  std::pair<std::vector<int32_t>, std::map<std::string, double>> Greedy(coli_model_t* m) {
    coli_session_t* s = NewSession(m);
    Prefill(s, kPrompt);
    std::vector<int32_t> tokens;
    for (const abi_test::Out& o : Generate(s, kSteps)) tokens.push_back(o.token);
    return {tokens, Stats(s)};
  }
  static bool HaveVulkan() {
    auto vk = vulkan::VulkanContext::Create();
    return vk.ok() || vk.status().code() != absl::StatusCode::kUnavailable;
  }
  // The idot tests' common part. Why the device cannot run the integer-dot shaders ("" when it
  // can; a device that does not open is an error).
  static absl::StatusOr<std::string> IdotUnsupported() {
    COLI_ASSIGN_OR_RETURN(auto vk, vulkan::VulkanContext::Create());
    return vk->supports_idot() ? "" : vk->device_name() + " has no shaderInt64";
  }
  // A K3_LOGITS path of this process: ctest runs each test's staging.* twin at the same time (-j).
  static std::string LogitsPath(const std::string& name) {
    return absl::StrCat(::testing::TempDir(), "/", getpid(), "_", name, "_logits.f32");
  }
  // The fixture with K3_IDOT=1 (the default), prefill chunk 4, `extra`, its logits dumped there.
  absl::StatusOr<coli_model_t*> OpenIdot(const Extra& extra, const std::string& logits) {
    return TryOpen(extra, -1, [&logits](coli_model_options_t* o) {
      ASSERT_EQ(o->idot, 1);  // the default
      o->chunk = 4;
      o->logits_path = abi::Str(logits);
    });
  }
};

TEST_F(K3VkTierPluginTest, TierThroughExtraOptionsKeepsTokensAndCountsItsWork) {
  if (!HaveVulkan()) {
    COLI_SKIP_UNLESS_VULKAN_REQUIRED() << "no Vulkan device";
  }
  ASSERT_OK_AND_ASSIGN(coli_model_t * cpu, OpenExact({}));
  auto want = Greedy(cpu);
  EXPECT_EQ(want.second["vk_matmuls"], 0);
  EXPECT_EQ(ModelStats(cpu)["vk_tier_resident"], 0);

  // 60 of the fixture's 192 experts (11520 device bytes each), 8 promotions per pass; the old
  // alias K3_VK=0 is overridden by COLI_VULKAN=1.
  ASSERT_OK_AND_ASSIGN(
      coli_model_t * vk,
      OpenExact({{"vulkan", "1"}, {"vk", "0"}, {"vk_tier_gb", "0.000697"}, {"vk_up", "8"}}));
  // Two conversations: the second finds the first one's promotions resident.
  auto first = Greedy(vk);
  auto got = Greedy(vk);
  EXPECT_EQ(first.first, want.first);
  EXPECT_EQ(got.first, want.first);
  std::map<std::string, double>& s = got.second;
  EXPECT_GT(first.second["vk_tier_promotions"] + s["vk_tier_promotions"], 0);
  EXPECT_GT(s["vk_tier_hits"], 0);
  EXPECT_EQ(s["vk_matmuls"], 3 * s["vk_tier_hits"]);
  EXPECT_GE(s["vk_tier_evictions"], 0);
  // What the tier holds now is the model's current value, not a session counter (the host sums
  // session stats over requests).
  std::map<std::string, double> model = ModelStats(vk);
  EXPECT_GT(model["vk_tier_resident"], 0);
  EXPECT_LE(model["vk_tier_resident"], 60);
  EXPECT_EQ(model["vk_tier_bytes"], 11520 * model["vk_tier_resident"]);
  EXPECT_EQ(s.count("vk_tier_resident"), 0u);
  EXPECT_EQ(s.count("vk_tier_bytes"), 0u);
}

// COLI_VK_DENSE=1 with COLI_VK_TIER=0 (extra "vk_dense" / "vk_tier"): the shared experts of
// decode passes run on the device, no routed expert does; greedy tokens as the CPU's with
// K3_IDOT=0; the session and the model report the dense path's work and residents.
TEST_F(K3VkTierPluginTest, SharedExpertsThroughExtraOptions) {
  if (!HaveVulkan()) {
    COLI_SKIP_UNLESS_VULKAN_REQUIRED() << "no Vulkan device";
  }
  ASSERT_OK_AND_ASSIGN(coli_model_t * cpu, OpenExact({}));
  auto want = Greedy(cpu);
  EXPECT_EQ(want.second["vk_dense_calls"], 0);
  EXPECT_EQ(ModelStats(cpu)["vk_dense_matrices"], 0);

  ASSERT_OK_AND_ASSIGN(coli_model_t * vk,
                       OpenExact({{"vulkan", "1"}, {"vk_dense", "1"}, {"vk_tier", "0"}}));
  auto got = Greedy(vk);
  EXPECT_EQ(got.first, want.first);
  std::map<std::string, double>& s = got.second;
  EXPECT_GT(s["vk_dense_calls"], 0);
  // gate, up and down per shared block; the routed-expert tier is off.
  EXPECT_EQ(s["vk_matmuls"], 3 * s["vk_dense_calls"]);
  EXPECT_EQ(s["vk_tier_hits"], 0);
  std::map<std::string, double> model = ModelStats(vk);
  EXPECT_GT(model["vk_dense_matrices"], 0);
  EXPECT_GT(model["vk_dense_bytes"], 0);
  EXPECT_EQ(model["vk_tier_resident"], 0);
  EXPECT_EQ(s.count("vk_dense_matrices"), 0u);

  EXPECT_THAT(OpenExact({{"vulkan", "1"}, {"vk_dense", "maybe"}}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("COLI_VK_DENSE")));
}

// K3_IDOT=1 (the plugin's default): the tier's experts give the CPU's bits. The K3_LOGITS dump of
// each conversation equals the plugin's without the tier byte for byte — the first one while
// experts are being promoted, the second one with them resident — and the sampled tokens and
// their logprobs (temperature 0.8, seeded) are the same.
TEST_F(K3VkTierPluginTest, IdotTierKeepsTheCpuBitsThroughThePlugin) {
  if (!HaveVulkan()) {
    COLI_SKIP_UNLESS_VULKAN_REQUIRED() << "no Vulkan device";
  }
  ASSERT_OK_AND_ASSIGN(const std::string why, IdotUnsupported());
  if (!why.empty()) GTEST_SKIP() << why;
  const std::string cpu_path = LogitsPath("vk_idot_cpu");
  const std::string vk_path = LogitsPath("vk_idot_tier");
  abi_test::Knobs knobs;
  knobs.temperature = 0.8f;
  knobs.logprobs = 5;
  knobs.seed = 7;
  ASSERT_OK_AND_ASSIGN(coli_model_t * cpu, OpenIdot({}, cpu_path));
  const std::vector<abi_test::Out> want = Fresh(cpu, kPrompt, kSteps, knobs);
  const std::string want_logits = test_files::ReadRaw(cpu_path);
  ASSERT_GT(want_logits.size(), 0u);

  ASSERT_OK_AND_ASSIGN(
      coli_model_t * vk,
      OpenIdot({{"vulkan", "1"}, {"vk_tier_gb", "0.000697"}, {"vk_up", "8"}}, vk_path));
  double hits = 0;
  for (int conversation = 0; conversation < 2; ++conversation) {
    SCOPED_TRACE(::testing::Message() << "conversation " << conversation);
    coli_session_t* s = NewSession(vk);
    Prefill(s, kPrompt, knobs.seed);
    abi_test::ExpectSameOuts(Generate(s, kSteps, knobs), want);
    EXPECT_TRUE(test_files::ReadRaw(vk_path) == want_logits) << "the K3_LOGITS dumps differ";
    hits = Stats(s)["vk_tier_hits"];
  }
  EXPECT_GT(hits, 0);  // the second conversation found promoted experts resident
  std::remove(cpu_path.c_str());
  std::remove(vk_path.c_str());
}

// K3_IDOT=1 with the shared experts on the device (COLI_VK_DENSE=1, COLI_VK_TIER=0), at the
// plugin's K3_BITS (int4-g64 shared experts): the integer-dot dense path gives the CPU's bits, so
// the K3_LOGITS dump equals the CPU plugin's byte for byte and the sampled tokens and logprobs
// (temperature 0.8, seeded) are the same. Before, the device's f32 activations changed them.
TEST_F(K3VkTierPluginTest, IdotDenseKeepsTheCpuBitsThroughThePlugin) {
  if (!HaveVulkan()) {
    COLI_SKIP_UNLESS_VULKAN_REQUIRED() << "no Vulkan device";
  }
  ASSERT_OK_AND_ASSIGN(const std::string why, IdotUnsupported());
  if (!why.empty()) GTEST_SKIP() << why;
  const std::string cpu_path = LogitsPath("vk_dense_idot_cpu");
  const std::string vk_path = LogitsPath("vk_dense_idot");
  abi_test::Knobs knobs;
  knobs.temperature = 0.8f;
  knobs.logprobs = 5;
  knobs.seed = 11;
  ASSERT_OK_AND_ASSIGN(coli_model_t * cpu, OpenIdot({}, cpu_path));
  const std::vector<abi_test::Out> want = Fresh(cpu, kPrompt, kSteps, knobs);
  const std::string want_logits = test_files::ReadRaw(cpu_path);
  ASSERT_GT(want_logits.size(), 0u);

  ASSERT_OK_AND_ASSIGN(coli_model_t * vk,
                       OpenIdot({{"vulkan", "1"}, {"vk_tier", "0"}, {"vk_dense", "1"}}, vk_path));
  coli_session_t* s = NewSession(vk);
  Prefill(s, kPrompt, knobs.seed);
  abi_test::ExpectSameOuts(Generate(s, kSteps, knobs), want);
  EXPECT_TRUE(test_files::ReadRaw(vk_path) == want_logits) << "the K3_LOGITS dumps differ";
  EXPECT_GT(Stats(s)["vk_dense_calls"], 0);
  EXPECT_EQ(Stats(s)["vk_tier_hits"], 0);
  std::remove(cpu_path.c_str());
  std::remove(vk_path.c_str());
}

TEST_F(K3VkTierPluginTest, K3VkZeroNeverOpensTheDevice) {
  setenv("COLI_VK_DEVICE", "garbage", 1);
  auto m = OpenExact({{"vk", "0"}, {"vk_tier_gb", "1"}});
  unsetenv("COLI_VK_DEVICE");
  ASSERT_OK(m.status());
  auto run = Greedy(*m);
  EXPECT_EQ(run.first.size(), static_cast<size_t>(kSteps));
  EXPECT_EQ(run.second["vk_matmuls"], 0);
}

TEST_F(K3VkTierPluginTest, BadSwitchesAreRefusedAtOpen) {
  EXPECT_THAT(OpenExact({{"vulkan", "yes"}}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("COLI_VULKAN='yes'")));
  EXPECT_THAT(OpenExact({{"vk_tier_rate", "-2"}}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("COLI_VK_TIER_RATE")));
  if (!HaveVulkan()) {
    COLI_SKIP_UNLESS_VULKAN_REQUIRED() << "no Vulkan device";
  }
  auto m = OpenExact({{"vulkan", "1"}, {"vk_device", "999"}});
  EXPECT_THAT(m, StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("COLI_VK_DEVICE='999'")));
}

}  // namespace
}  // namespace coli::k3
