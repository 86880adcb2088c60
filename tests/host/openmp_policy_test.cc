// coli-host's OpenMP wait policy (host/openmp_policy.h): passive unless the user chose.
#include "host/openmp_policy.h"

#include <dlfcn.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include <cstdlib>
#include <optional>
#include <string>

namespace coli::host {
namespace {

TEST(OpenMpPolicy, PassiveUnlessTheUserChose) {
  EXPECT_EQ(OpenMpWaitPolicyToSet(nullptr, nullptr), std::optional<std::string>("passive"));
  EXPECT_EQ(OpenMpWaitPolicyToSet("", ""), std::optional<std::string>("passive"));
  EXPECT_EQ(OpenMpWaitPolicyToSet("active", nullptr), std::nullopt);
  EXPECT_EQ(OpenMpWaitPolicyToSet("passive", nullptr), std::nullopt);
  EXPECT_EQ(OpenMpWaitPolicyToSet(nullptr, "10000"), std::nullopt);
  EXPECT_EQ(OpenMpWaitPolicyToSet("", "0"), std::nullopt);
}

// The host core must not bring libgomp in itself, or the variable would be set too late (this
// test binary links coli_host_core as coli-host does).
TEST(OpenMpPolicy, SetsTheEnvironmentBeforeLibgompLoads) {
  ASSERT_EQ(dlopen("libgomp.so.1", RTLD_LAZY | RTLD_NOLOAD), nullptr);
  unsetenv("OMP_WAIT_POLICY");
  unsetenv("GOMP_SPINCOUNT");
  EXPECT_TRUE(SetOpenMpWaitPolicyDefault());
  ASSERT_NE(std::getenv("OMP_WAIT_POLICY"), nullptr);
  EXPECT_STREQ(std::getenv("OMP_WAIT_POLICY"), "passive");

  setenv("OMP_WAIT_POLICY", "active", 1);
  EXPECT_TRUE(SetOpenMpWaitPolicyDefault());
  EXPECT_STREQ(std::getenv("OMP_WAIT_POLICY"), "active");

  unsetenv("OMP_WAIT_POLICY");
  setenv("GOMP_SPINCOUNT", "1000", 1);
  EXPECT_TRUE(SetOpenMpWaitPolicyDefault());
  EXPECT_EQ(std::getenv("OMP_WAIT_POLICY"), nullptr);
  unsetenv("GOMP_SPINCOUNT");
}

// Once libgomp is in the process the setting cannot apply, and the caller is told.
TEST(OpenMpPolicy, ReportsALibgompAlreadyLoaded) {
  void* gomp = dlopen("libgomp.so.1", RTLD_NOW);
  if (gomp == nullptr) GTEST_SKIP() << "no libgomp.so.1 on this system: " << dlerror();
  unsetenv("OMP_WAIT_POLICY");
  EXPECT_FALSE(SetOpenMpWaitPolicyDefault());
  EXPECT_EQ(std::getenv("OMP_WAIT_POLICY"), nullptr);
}

}  // namespace
}  // namespace coli::host
