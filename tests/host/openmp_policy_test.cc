// coli-host's OpenMP spin default (host/openmp_policy.h): a short spin unless the user chose.
#include "host/openmp_policy.h"

#include <dlfcn.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include <cstdlib>
#include <optional>
#include <string>

namespace coli::host {
namespace {

TEST(OpenMpPolicy, ShortSpinUnlessTheUserChose) {
  const std::optional<std::string> spin(kDefaultGompSpinCount);
  EXPECT_EQ(spin, std::optional<std::string>("1000"));
  EXPECT_EQ(GompSpinCountToSet(nullptr, nullptr), spin);
  EXPECT_EQ(GompSpinCountToSet("", ""), spin);
  EXPECT_EQ(GompSpinCountToSet("active", nullptr), std::nullopt);
  EXPECT_EQ(GompSpinCountToSet("passive", nullptr), std::nullopt);
  EXPECT_EQ(GompSpinCountToSet(nullptr, "300000"), std::nullopt);
  EXPECT_EQ(GompSpinCountToSet("", "0"), std::nullopt);
}

// The host core must not bring libgomp in itself, or the variable would be set too late (this
// test binary links coli_host_core as coli-host does).
TEST(OpenMpPolicy, SetsTheEnvironmentBeforeLibgompLoads) {
  ASSERT_EQ(dlopen("libgomp.so.1", RTLD_LAZY | RTLD_NOLOAD), nullptr);
  unsetenv("OMP_WAIT_POLICY");
  unsetenv("GOMP_SPINCOUNT");
  EXPECT_TRUE(SetOpenMpSpinDefault());
  ASSERT_NE(std::getenv("GOMP_SPINCOUNT"), nullptr);
  EXPECT_STREQ(std::getenv("GOMP_SPINCOUNT"), "1000");

  setenv("GOMP_SPINCOUNT", "300000", 1);
  EXPECT_TRUE(SetOpenMpSpinDefault());
  EXPECT_STREQ(std::getenv("GOMP_SPINCOUNT"), "300000");

  unsetenv("GOMP_SPINCOUNT");
  setenv("OMP_WAIT_POLICY", "active", 1);
  EXPECT_TRUE(SetOpenMpSpinDefault());
  EXPECT_EQ(std::getenv("GOMP_SPINCOUNT"), nullptr);
  unsetenv("OMP_WAIT_POLICY");
}

// Once libgomp is in the process the setting cannot apply, and the caller is told.
TEST(OpenMpPolicy, ReportsALibgompAlreadyLoaded) {
  void* gomp = dlopen("libgomp.so.1", RTLD_NOW);
  if (gomp == nullptr) GTEST_SKIP() << "no libgomp.so.1 on this system: " << dlerror();
  unsetenv("GOMP_SPINCOUNT");
  EXPECT_FALSE(SetOpenMpSpinDefault());
  EXPECT_EQ(std::getenv("GOMP_SPINCOUNT"), nullptr);
}

}  // namespace
}  // namespace coli::host
