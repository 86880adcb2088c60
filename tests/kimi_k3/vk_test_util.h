// tests/kimi_k3/vk_test_util.h: what the Kimi K3 Vulkan tests (vk_tier_test, vk_dense_test)
// share: the tiny fixture's folder, a greedy run that keeps every step's logits, the exact-float
// model options the device is compared with, and the context-or-skip macro.
#ifndef COLI_TESTS_KIMI_K3_VK_TEST_UTIL_H_
#define COLI_TESTS_KIMI_K3_VK_TEST_UTIL_H_

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "common/status/status.h"
#include "common/vk/vulkan_context.h"
#include "plugins/kimi_k3/model.h"
#include "plugins/kimi_k3/options.h"
#include "plugins/kimi_k3/session.h"
#include "tests/common/vk/require_vulkan.h"

namespace coli::k3::vk_testing {

// build/fixtures/k3_tiny (random weights, the real names and packing).
inline std::string FixtureDir() {
  const char* bin = std::getenv("COLI_BINARY_DIR");
  return absl::StrCat(bin != nullptr ? bin : ".", "/fixtures/k3_tiny");
}

// Creates a VulkanContext named `ctx`, or skips the test when the machine has no Vulkan device
// at all (fails instead under COLI_REQUIRE_VULKAN=1).
#define COLI_VK_CONTEXT_OR_SKIP(ctx)                                                  \
  std::unique_ptr<vulkan::VulkanContext> ctx;                                         \
  {                                                                                   \
    absl::StatusOr<std::unique_ptr<vulkan::VulkanContext>> created =                  \
        vulkan::VulkanContext::Create();                                              \
    if (!created.ok() && created.status().code() == absl::StatusCode::kUnavailable) { \
      COLI_SKIP_UNLESS_VULKAN_REQUIRED() << "no Vulkan device: " << created.status(); \
    }                                                                                 \
    ASSERT_THAT(created, IsOk());                                                     \
    ctx = std::move(created).value();                                                 \
  }

inline bool HaveVulkan() {
  absl::StatusOr<std::unique_ptr<vulkan::VulkanContext>> vk = vulkan::VulkanContext::Create();
  return vk.ok() || vk.status().code() != absl::StatusCode::kUnavailable;
}

inline const std::vector<int32_t> kPrompt = {5, 17, 300, 45, 45, 211, 9, 400, 123, 77, 301, 88};
inline constexpr int kGenerate = 8;

struct GreedyRun {
  std::vector<std::vector<float>> logits;  // after the prompt, then after each fed token
  std::vector<int32_t> tokens;             // greedy tokens
};

inline int32_t Argmax(const std::vector<float>& v) {
  return static_cast<int32_t>(std::max_element(v.begin(), v.end()) - v.begin());
}

// Greedy run of kPrompt + kGenerate tokens; `after_pass` (e.g. waiting for the tier's uploads)
// after every forward pass.
inline absl::StatusOr<GreedyRun> Greedy(const Model& model,
                                        const std::function<void()>& after_pass = nullptr) {
  GreedyRun run;
  std::unique_ptr<Session> session = model.NewSession();
  COLI_ASSIGN_OR_RETURN(std::vector<float> logits, session->Prefill(kPrompt));
  for (int i = 0; i < kGenerate; ++i) {
    if (after_pass) after_pass();
    run.tokens.push_back(Argmax(logits));
    run.logits.push_back(logits);
    COLI_ASSIGN_OR_RETURN(logits, session->Step(run.tokens.back()));
  }
  run.logits.push_back(logits);
  return run;
}

inline ModelOptions ExactOptions() {
  ModelOptions o;
  o.idot = false;  // K3_IDOT=0: the device's f32-activation math
  o.chunk = 4;     // prefill in several chunks (several forward passes)
  return o;
}

}  // namespace coli::k3::vk_testing

#endif  // COLI_TESTS_KIMI_K3_VK_TEST_UTIL_H_
