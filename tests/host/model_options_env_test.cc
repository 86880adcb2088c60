// host/model_options_env: the model switches of the environment into v1::ModelOptions, each
// value checked at the edge (docs/status/env-switches.md). A map stands for the environment.
#include "host/model_options_env.h"

#include <map>
#include <string>

#include "common/status/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace coli::host {
namespace {

using ::coli::testing::StatusIs;
using ::testing::HasSubstr;

absl::StatusOr<v1::ModelOptions> FromMap(const std::map<std::string, std::string>& env) {
  return ModelOptionsFromEnv([&env](const char* name) -> const char* {
    auto it = env.find(name);
    return it == env.end() ? nullptr : it->second.c_str();
  });
}

TEST(ModelOptionsEnv, ValuesInRangeAreTaken) {
  auto o = FromMap({{"K3_BITS", "32"},
                    {"K3_CHUNK", "1"},
                    {"K3_LOAD_THREADS", "16"},
                    {"K3_LAYERS", "0"},
                    {"COLI_THREADS", "0"},
                    {"K3_EXPERT_GB", "0"},
                    {"K3_TOPP", "1"},
                    {"K3_MLA_NORM_EPS", "1e-5"},
                    {"K3_MAXT", "1"},
                    {"K3_PIPE", "0"}});
  ASSERT_OK(o.status());
  EXPECT_EQ(o->bits(), 32);
  EXPECT_EQ(o->chunk(), 1);
  EXPECT_EQ(o->load_threads(), 16);
  EXPECT_TRUE(o->has_layers());
  EXPECT_EQ(o->layers(), 0);
  EXPECT_TRUE(o->has_threads());
  EXPECT_TRUE(o->has_expert_gb());
  EXPECT_DOUBLE_EQ(o->topp(), 1);
  EXPECT_DOUBLE_EQ(o->mla_norm_eps(), 1e-5);
  EXPECT_EQ(o->max_context(), 1);
  EXPECT_FALSE(o->pipe());
  // Empty is unset: the plugin's default applies.
  auto empty = FromMap({{"K3_CHUNK", ""}, {"K3_BITS", ""}});
  ASSERT_OK(empty.status());
  EXPECT_FALSE(empty->has_chunk());
  EXPECT_FALSE(empty->has_bits());
}

// Each of these was taken: 0 and negative counts as "unset" by the plugin (the default ran),
// nan past every range check, out-of-range threads and epsilons as given.
TEST(ModelOptionsEnv, UnusableValuesAreRefusedNamingVariableAndValue) {
  const std::pair<const char*, const char*> cases[] = {
      {"K3_BITS", "0"},           {"K3_BITS", "5"},          {"K3_MLA_BITS", "-8"},
      {"K3_HEAD_BITS", "8GB"},    {"K3_CHUNK", "0"},         {"K3_CHUNK", "-1"},
      {"K3_CHUNK", "513"},        {"K3_LOAD_THREADS", "0"},  {"K3_LOAD_THREADS", "17"},
      {"K3_LAYERS", "-2"},        {"COLI_THREADS", "-1"},    {"COLI_THREADS", "100000"},
      {"K3_EXPERT_GB", "-1"},     {"K3_EXPERT_GB", "nan"},   {"K3_EXPERT_GB", "inf"},
      {"K3_TOPP", "nan"},         {"K3_TOPP", "-0.1"},       {"K3_TOPP", "1.5"},
      {"K3_MLA_NORM_EPS", "0"},   {"K3_MLA_NORM_EPS", "-1"}, {"K3_MLA_NORM_EPS", "nan"},
      {"K3_MLA_NORM_EPS", "inf"}, {"K3_MAXT", "0"},          {"K3_MAXT", "-1"},
      {"K3_MAXT", "1e9"},         {"K3_IDOT", "2"},          {"K3_DIRECT", "true"},
  };
  for (const auto& [name, value] : cases) {
    auto o = FromMap({{name, value}});
    EXPECT_THAT(o, StatusIs(absl::StatusCode::kInvalidArgument,
                            HasSubstr(std::string("environment variable ") + name)))
        << name << "=" << value;
    if (!o.ok()) {
      EXPECT_THAT(std::string(o.status().message()), HasSubstr(std::string("'") + value + "'"));
    }
  }
}

}  // namespace
}  // namespace coli::host
