// tests/common/vk/idot_test_util.h: what the integer-dot (idot) Vulkan tests share — a context
// that can run the idot shaders, random activations shaped for the int8 quantizer, and the
// bit-for-bit comparison against the CPU kernels.
#ifndef COLI_TESTS_COMMON_VK_IDOT_TEST_UTIL_H_
#define COLI_TESTS_COMMON_VK_IDOT_TEST_UTIL_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "common/status/status_matchers.h"
#include "common/vk/vulkan_context.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/common/vk/require_vulkan.h"

// Declares `ctx`, a context made with `options` that can run the idot kernels, or skips when the
// machine has no Vulkan device at all (a failure under COLI_REQUIRE_VULKAN=1); a device without
// shaderInt64 skips too, saying so (lavapipe and the GPUs this targets have it), unless `options`
// turned int64 off on purpose.
#define COLI_IDOT_CONTEXT_OR_SKIP(ctx, options)                                       \
  std::unique_ptr<::coli::vulkan::VulkanContext> ctx;                                 \
  {                                                                                   \
    absl::StatusOr<std::unique_ptr<::coli::vulkan::VulkanContext>> created =          \
        ::coli::vulkan::VulkanContext::Create(options);                               \
    if (!created.ok() && created.status().code() == absl::StatusCode::kUnavailable) { \
      COLI_SKIP_UNLESS_VULKAN_REQUIRED() << "no Vulkan device: " << created.status(); \
    }                                                                                 \
    ASSERT_THAT(created, ::coli::testing::IsOk());                                    \
    ctx = std::move(created).value();                                                 \
    if (!ctx->supports_idot() && (options).use_int64) {                               \
      GTEST_SKIP() << ctx->device_name() << " has no shaderInt64";                    \
    }                                                                                 \
  }

namespace coli::vulkan::idot_test {

// rows × cols normal values with a magnitude of 2^k per `group` columns of a row (k uniform in
// [−spread, spread]), an all-zero group now and then (the quantizer's 1e-20 scale floor) and
// single exact zeros.
inline std::vector<float> RandomActivations(int64_t rows, int64_t cols, int64_t group, int spread,
                                            std::mt19937& rng) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> power(-spread, spread);
  std::uniform_int_distribution<int> pick(0, 15);
  std::vector<float> x(static_cast<size_t>(rows * cols));
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t g = 0; g < cols; g += group) {
      const float scale = std::ldexp(1.0f, power(rng));
      const bool zero_group = pick(rng) == 0;
      for (int64_t c = g; c < std::min<int64_t>(cols, g + group); ++c) {
        x[r * cols + c] = zero_group || pick(rng) == 0 ? 0.0f : normal(rng) * scale;
      }
    }
  }
  return x;
}

// Same bits, or both NaN (the device makes NaNs, not the CPU's NaN payloads).
inline bool SameValue(float a, float b) {
  if (std::isnan(a) && std::isnan(b)) return true;
  return std::memcmp(&a, &b, sizeof(float)) == 0;
}

// Elements that differ from the CPU's; prints the first few.
inline int64_t Mismatches(const std::vector<float>& got, const std::vector<float>& want,
                          const std::string& what) {
  EXPECT_EQ(got.size(), want.size()) << what;
  int64_t bad = 0;
  for (size_t i = 0; i < want.size() && i < got.size(); ++i) {
    if (SameValue(got[i], want[i])) continue;
    if (++bad <= 3) {
      uint32_t a, b;
      std::memcpy(&a, &got[i], 4);
      std::memcpy(&b, &want[i], 4);
      ADD_FAILURE() << what << " element " << i << ": device " << got[i] << " (0x" << std::hex << a
                    << ") cpu " << want[i] << " (0x" << b << std::dec << ")";
    }
  }
  return bad;
}

}  // namespace coli::vulkan::idot_test

#endif  // COLI_TESTS_COMMON_VK_IDOT_TEST_UTIL_H_
