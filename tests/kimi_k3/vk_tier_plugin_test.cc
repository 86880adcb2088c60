// The Vulkan expert tier through the kimi_k3 plugin ABI (the path of coli serve / coli run): the
// client's extra options "vulkan"/"vk"/"vk_tier_gb"/"vk_tier_rate"/… (tools/coli/client.cc reads
// COLI_VULKAN, K3_VK, COLI_VK_TIER_GB, … into them) reach plugin_entry.cc, which opens the
// device and wraps the streaming store in the tier. With K3_IDOT=0 the greedy tokens equal the
// plugin without the tier; the vk_* family stats move. Tiny fixture (build/fixtures/k3_tiny).
#include <algorithm>
#include <cstdlib>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "common/status/status_matchers.h"
#include "common/vk/vulkan_context.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "host/plugin.h"
#include "plugin_api/coli_plugin.h"
#include "plugin_api/cpp/abi_util.h"

namespace coli {
namespace {

using ::coli::testing::StatusIs;
using ::testing::HasSubstr;

const std::vector<int32_t> kPrompt = {5, 17, 300, 45, 45, 211, 9, 400, 123, 77, 301, 88};
constexpr int kSteps = 8;

absl::Status ToStatus(coli_status_t code, const coli_error_t& e) {
  if (code == 0) return absl::OkStatus();
  return absl::Status(abi::FromCode(code),
                      std::string(e.message, std::min(e.length, e.capacity - 1)));
}

struct Error {
  char text[1024] = {};
  coli_error_t e = abi::Init<coli_error_t>();
  Error() {
    e.message = text;
    e.capacity = sizeof(text);
  }
};

class K3VkTierPluginTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    host::PluginReport report;
    auto plugin =
        host::Plugin::Load(std::string(COLI_PLUGIN_DIR_FOR_TEST) + "/libcoli_kimi_k3.so", &report);
    ASSERT_OK(plugin.status());
    plugin_ = std::move(plugin).value().release();
  }
  static void TearDownTestSuite() {
    delete plugin_;
    plugin_ = nullptr;
  }
  static const coli_plugin_api_t& api() { return plugin_->api(); }

  // Opens the fixture with K3_IDOT=0 and the given extra options.
  absl::StatusOr<coli_model_t*> Open(const std::vector<std::pair<std::string, std::string>>& kv) {
    keep_.assign(kv.begin(), kv.end());
    std::vector<coli_kv_t> extra;
    for (const auto& [k, v] : keep_) extra.push_back({abi::Str(k), abi::Str(v)});
    coli_model_options_t options;
    coli_model_options_defaults(&options);
    options.idot = 0;
    options.chunk = 4;
    options.extra = extra.data();
    options.n_extra = extra.size();
    auto args = abi::Init<coli_model_open_args_t>();
    args.model_dir = abi::Str(COLI_K3_TINY_DIR);
    args.options = &options;
    Error err;
    coli_model_t* m = nullptr;
    COLI_RETURN_IF_ERROR(ToStatus(api().model_open(&args, &m, &err.e), err.e));
    return m;
  }

  // Greedy tokens of kPrompt and the session's stats afterwards.
  static absl::StatusOr<std::pair<std::vector<int32_t>, std::map<std::string, double>>> Greedy(
      coli_model_t* m) {
    auto options = abi::Init<coli_session_options_t>();
    Error err;
    coli_session_t* s = nullptr;
    COLI_RETURN_IF_ERROR(ToStatus(api().session_create(m, &options, &s, &err.e), err.e));
    auto args = abi::Init<coli_prefill_args_t>();
    args.tokens = kPrompt.data();
    args.n_tokens = kPrompt.size();
    auto result = abi::Init<coli_prefill_result_t>();
    absl::Status st = ToStatus(api().prefill(s, &args, &result, &err.e), err.e);
    std::vector<int32_t> tokens;
    for (int t = 0; st.ok() && t < kSteps; ++t) {
      auto row = abi::Init<coli_decode_row_t>();
      row.session = s;
      auto dargs = abi::Init<coli_decode_args_t>();
      dargs.rows = &row;
      dargs.n_rows = 1;
      st = ToStatus(api().decode(&dargs, &err.e), err.e);
      if (st.ok()) tokens.push_back(row.token);
      if (row.finish != COLI_FINISH_NONE) break;
    }
    std::map<std::string, double> stats;
    coli_stat_t raw[96];
    size_t count = 0;
    if (st.ok()) st = ToStatus(api().session_stats(s, raw, 96, &count, &err.e), err.e);
    for (size_t i = 0; i < std::min<size_t>(count, 96); ++i) stats[raw[i].name] = raw[i].value;
    api().session_destroy(s);
    COLI_RETURN_IF_ERROR(st);
    return std::make_pair(tokens, stats);
  }

  static bool HaveVulkan() {
    auto vk = vulkan::VulkanContext::Create();
    return vk.ok() || vk.status().code() != absl::StatusCode::kUnavailable;
  }

  static host::Plugin* plugin_;
  std::vector<std::pair<std::string, std::string>> keep_;
};
host::Plugin* K3VkTierPluginTest::plugin_ = nullptr;

TEST_F(K3VkTierPluginTest, TierThroughExtraOptionsKeepsTokensAndCountsItsWork) {
  if (!HaveVulkan()) GTEST_SKIP() << "no Vulkan device";
  ASSERT_OK_AND_ASSIGN(coli_model_t* cpu, Open({}));
  ASSERT_OK_AND_ASSIGN(auto want, Greedy(cpu));
  api().model_close(cpu);
  EXPECT_EQ(want.second["vk_matmuls"], 0);
  EXPECT_EQ(want.second["vk_tier_resident"], 0);

  // 60 of the fixture's 192 experts (11520 device bytes each), 8 promotions per pass; the old
  // alias K3_VK=0 is overridden by COLI_VULKAN=1.
  ASSERT_OK_AND_ASSIGN(coli_model_t* vk, Open({{"vulkan", "1"},
                                               {"vk", "0"},
                                               {"vk_tier_gb", "0.000697"},
                                               {"vk_up", "8"}}));
  // Two conversations: the second finds the first one's promotions resident.
  ASSERT_OK_AND_ASSIGN(auto first, Greedy(vk));
  ASSERT_OK_AND_ASSIGN(auto got, Greedy(vk));
  api().model_close(vk);
  EXPECT_EQ(first.first, want.first);
  EXPECT_EQ(got.first, want.first);
  std::map<std::string, double>& s = got.second;
  EXPECT_GT(first.second["vk_tier_promotions"] + s["vk_tier_promotions"], 0);
  EXPECT_GT(s["vk_tier_hits"], 0);
  EXPECT_EQ(s["vk_matmuls"], 3 * s["vk_tier_hits"]);
  EXPECT_GT(s["vk_tier_resident"], 0);
  EXPECT_LE(s["vk_tier_resident"], 60);
  EXPECT_EQ(s["vk_tier_bytes"], 11520 * s["vk_tier_resident"]);
  EXPECT_GE(s["vk_tier_evictions"], 0);
}

TEST_F(K3VkTierPluginTest, K3VkZeroNeverOpensTheDevice) {
  setenv("COLI_VK_DEVICE", "garbage", 1);
  auto m = Open({{"vk", "0"}, {"vk_tier_gb", "1"}});
  unsetenv("COLI_VK_DEVICE");
  ASSERT_OK(m.status());
  ASSERT_OK_AND_ASSIGN(auto run, Greedy(*m));
  EXPECT_EQ(run.second["vk_matmuls"], 0);
  api().model_close(*m);
}

TEST_F(K3VkTierPluginTest, BadSwitchesAreRefusedAtOpen) {
  EXPECT_THAT(Open({{"vulkan", "yes"}}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("COLI_VULKAN='yes'")));
  EXPECT_THAT(Open({{"vk_tier_rate", "-2"}}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("COLI_VK_TIER_RATE")));
  if (!HaveVulkan()) GTEST_SKIP() << "no Vulkan device";
  setenv("COLI_VK_DEVICE", "999", 1);
  auto m = Open({{"vulkan", "1"}});
  unsetenv("COLI_VK_DEVICE");
  EXPECT_THAT(m, StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("COLI_VK_DEVICE='999'")));
}

}  // namespace
}  // namespace coli
