// tests/common/vk/require_vulkan.h: how a Vulkan test behaves when no Vulkan device exists.
//
//   if (!created.ok() && created.status().code() == absl::StatusCode::kUnavailable) {
//     COLI_SKIP_UNLESS_VULKAN_REQUIRED() << "no Vulkan device: " << created.status();
//   }
//
// It skips, unless COLI_REQUIRE_VULKAN=1 (set by .ci/run, whose machine installs lavapipe):
// then a missing device is a failure, so a broken driver install cannot turn the Vulkan tests
// into silent skips.
#ifndef COLI_TESTS_COMMON_VK_REQUIRE_VULKAN_H_
#define COLI_TESTS_COMMON_VK_REQUIRE_VULKAN_H_

#include <cstdlib>
#include <cstring>

#include "gtest/gtest.h"

namespace coli::testing_vk {
inline bool VulkanRequired() {
  const char* v = std::getenv("COLI_REQUIRE_VULKAN");
  return v != nullptr && std::strcmp(v, "1") == 0;
}
}  // namespace coli::testing_vk

// The switch keeps the if/else one statement (no dangling else under an unbraced `if`), as
// gtest's own macros do.
#define COLI_SKIP_UNLESS_VULKAN_REQUIRED()                                             \
  switch (0)                                                                           \
  case 0:                                                                              \
  default:                                                                             \
    if (::coli::testing_vk::VulkanRequired())                                          \
      GTEST_FAIL() << "COLI_REQUIRE_VULKAN=1 but no Vulkan device could be created; "; \
    else                                                                               \
      GTEST_SKIP()

#endif  // COLI_TESTS_COMMON_VK_REQUIRE_VULKAN_H_
