// host/model_options_env: the model switches of the environment into v1::ModelOptions, each
// value checked at the edge (docs/status/env-switches.md), read with the tables the families
// declare (ABI 1.8). A map stands for the environment; the kimi_k3 table is the plugin's own
// (plugins/kimi_k3/switches.cc), converted as the host converts it.
#include "host/model_options_env.h"

#include <map>
#include <string>
#include <vector>

#include "common/status/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "plugin_api/cpp/switches.h"
#include "plugins/kimi_k3/switches.h"

namespace coli::host {
namespace {

using ::coli::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;

std::vector<v1::ModelSwitch> K3Switches() {
  std::vector<v1::ModelSwitch> family;
  for (const coli_switch_t& s : k3::EnvironmentSwitches()) {
    absl::StatusOr<v1::ModelSwitch> converted = SwitchFromAbi(s, "kimi_k3");
    EXPECT_OK(converted.status());
    if (converted.ok()) family.push_back(*converted);
  }
  return WithHostSwitches(family);
}

EnvLookup Lookup(const std::map<std::string, std::string>& env) {
  return [&env](const char* name) -> const char* {
    auto it = env.find(name);
    return it == env.end() ? nullptr : it->second.c_str();
  };
}

absl::StatusOr<v1::ModelOptions> FromMap(const std::map<std::string, std::string>& env) {
  return ModelOptionsFromEnv(K3Switches(), Lookup(env));
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
  EXPECT_TRUE(o->extra().empty());
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
      {"COLI_K3_CKPT", "-1"},     {"COLI_K3_SPEC", "17"},    {"COLI_K3_PREFIX_CACHE_MB", "x"},
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

// The messages of the table that lived in host/ before ABI 1.8, word for word (the shell suite
// env_switches.sh pins more of them through `coli run`).
TEST(ModelOptionsEnv, KimiK3TableKeepsTheMessages) {
  const std::pair<std::pair<const char*, const char*>, const char*> cases[] = {
      {{"K3_BITS", "0"}, "environment variable K3_BITS='0': expected 4, 8 or 32"},
      {{"K3_HEAD_BITS", "8GB"}, "environment variable K3_HEAD_BITS: '8GB' is not a number"},
      {{"K3_CHUNK", "0"}, "environment variable K3_CHUNK: '0' is outside [1, 512]"},
      {{"K3_MLA_NORM_EPS", "0"},
       "environment variable K3_MLA_NORM_EPS='0': expected a positive epsilon (the vendor's is "
       "1e-6)"},
      {{"K3_MLA_NORM_EPS", "-1"}, "environment variable K3_MLA_NORM_EPS: '-1' is outside [0, 1]"},
      {{"K3_PIPE", "yes"}, "environment variable K3_PIPE='yes': expected 0 or 1"},
      {{"COLI_THREADS", "-1"}, "environment variable COLI_THREADS: '-1' is outside [0, 1024]"},
      {{"COLI_K3_CKPT", "lots"},
       "environment variable COLI_K3_CKPT='lots': expected a number of checkpoints, 0 or more"},
      {{"COLI_K3_SPEC", "17"},
       "environment variable COLI_K3_SPEC='17': expected a draft length in 0…16"},
      {{"COLI_K3_PREFIX_CACHE_MIN", "-3"},
       "environment variable COLI_K3_PREFIX_CACHE_MIN='-3': expected 0 or more"},
  };
  for (const auto& [assignment, message] : cases) {
    auto o = FromMap({{assignment.first, assignment.second}});
    EXPECT_THAT(o, StatusIs(absl::StatusCode::kInvalidArgument, message))
        << assignment.first << "=" << assignment.second;
  }
}

// Every variable of the old table still sets what it set, under the same name (aliases too).
TEST(ModelOptionsEnv, KimiK3TableSetsTheSameOptions) {
  auto o = FromMap({{"K3_MLA_BITS", "4"},
                    {"K3_HEAD_BITS", "8"},
                    {"K3_IDOT", "0"},
                    {"K3_DIRECT", "1"},
                    {"K3_DIRS", "/a:/b,,/c"},
                    {"K3_TRACE", "/t"},
                    {"K3_X0", "/x"},
                    {"K3_LOGITS", "/l"},
                    {"K3_EXPERT_GB", "2.5"},
                    {"K3_MAXT", "1099511627776"},
                    {"COLI_K3_CKPT", "4"},
                    {"COLI_K3_CKPT_DIR", "/ck"},
                    {"COLI_VULKAN", "1"},
                    {"K3_VK", "0"},
                    {"COLI_VK_TIER_GB", "3"},
                    {"K3_VK_GB", "2"},
                    {"COLI_VK_TIER_RATE", "5"},
                    {"K3_VK_UP", "auto"},
                    {"COLI_VK_DENSE", "auto"},
                    {"COLI_VK_TIER", "0"},
                    {"COLI_K3_MIX_ROWS", "16"},
                    {"COLI_K3_SPEC", "8"},
                    {"COLI_K3_SPEC_MIN", "2"},
                    {"COLI_K3_SPEC_SAMPLED_NGRAM", "4"},
                    {"COLI_K3_SPEC_ADAPT", "0"},
                    {"COLI_K3_PREFIX_CACHE_MB", "2048"},
                    {"COLI_K3_PREFIX_CACHE_MIN", "64"},
                    {"COLI_K3_PREFIX_CACHE_KEEP", "1"},
                    {"K3_MMAP", "1"},
                    {"K3_VERIFY", "0"}});
  ASSERT_OK(o.status());
  EXPECT_EQ(o->mla_bits(), 4);
  EXPECT_EQ(o->head_bits(), 8);
  EXPECT_TRUE(o->has_idot());
  EXPECT_FALSE(o->idot());
  EXPECT_TRUE(o->direct());
  EXPECT_THAT(std::vector<std::string>(o->extra_dirs().begin(), o->extra_dirs().end()),
              ::testing::ElementsAre("/a", "/b", "/c"));
  EXPECT_EQ(o->trace_path(), "/t");
  EXPECT_EQ(o->x0_path(), "/x");
  EXPECT_EQ(o->logits_path(), "/l");
  EXPECT_DOUBLE_EQ(o->expert_gb(), 2.5);
  EXPECT_EQ(o->max_context(), int64_t{1} << 40);
  const std::map<std::string, std::string> extra(o->extra().begin(), o->extra().end());
  EXPECT_EQ(extra, (std::map<std::string, std::string>{{"ckpt", "4"},
                                                       {"ckpt_dir", "/ck"},
                                                       {"vulkan", "1"},
                                                       {"vk", "0"},
                                                       {"vk_tier_gb", "3"},
                                                       {"vk_gb", "2"},
                                                       {"vk_tier_rate", "5"},
                                                       {"vk_up", "auto"},
                                                       {"vk_dense", "auto"},
                                                       {"vk_tier", "0"},
                                                       {"mix_rows", "16"},
                                                       {"spec", "8"},
                                                       {"spec_min", "2"},
                                                       {"spec_sampled_ngram", "4"},
                                                       {"spec_adapt", "0"},
                                                       {"prefix_cache", "2048"},
                                                       {"prefix_cache_min", "64"},
                                                       {"prefix_cache_keep", "1"},
                                                       {"mmap", "1"},
                                                       {"verify", "0"}}));
}

// The reader knows no family: a table of another family's switch is read the same way.
TEST(ModelOptionsEnv, AnyFamilysTableIsReadGenerically) {
  constexpr coli_switch_t kKnob = abi::ToExtra(
      abi::IntSwitch("TEST_FAMILY_KNOB", COLI_SWITCH_FIELD_EXTRA, 1, 9, "a knob"), "knob");
  ASSERT_OK_AND_ASSIGN(v1::ModelSwitch knob, SwitchFromAbi(kKnob, "test_family"));
  const std::vector<v1::ModelSwitch> table = WithHostSwitches({&knob, 1});
  std::map<std::string, std::string> env = {{"TEST_FAMILY_KNOB", "7"}, {"K3_CHUNK", "0"}};
  ASSERT_OK_AND_ASSIGN(v1::ModelOptions o, ModelOptionsFromEnv(table, Lookup(env)));
  EXPECT_EQ(o.extra().at("knob"), "7");
  EXPECT_FALSE(o.has_chunk());  // not this table's variable: not read
  env["TEST_FAMILY_KNOB"] = "10";
  EXPECT_THAT(ModelOptionsFromEnv(table, Lookup(env)),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "environment variable TEST_FAMILY_KNOB: '10' is outside [1, 9]"));
}

// Two families giving one name two meanings: refused when it is set (which one was meant?), the
// same meaning twice is read once.
TEST(ModelOptionsEnv, ANameTwoFamiliesDeclareDifferentlyIsRefusedWhenSet) {
  ASSERT_OK_AND_ASSIGN(
      v1::ModelSwitch a,
      SwitchFromAbi(abi::IntSwitch("SHARED_CHUNK", COLI_SWITCH_FIELD_CHUNK, 1, 512, "a"),
                    "family_a"));
  ASSERT_OK_AND_ASSIGN(
      v1::ModelSwitch same,
      SwitchFromAbi(abi::IntSwitch("SHARED_CHUNK", COLI_SWITCH_FIELD_CHUNK, 1, 512, "other help"),
                    "family_b"));
  ASSERT_OK_AND_ASSIGN(
      v1::ModelSwitch other,
      SwitchFromAbi(abi::IntSwitch("SHARED_CHUNK", COLI_SWITCH_FIELD_CHUNK, 1, 64, "b"),
                    "family_c"));
  const std::map<std::string, std::string> env = {{"SHARED_CHUNK", "8"}};
  const std::vector<v1::ModelSwitch> agree = {a, same};
  ASSERT_OK_AND_ASSIGN(v1::ModelOptions o, ModelOptionsFromEnv(agree, Lookup(env)));
  EXPECT_EQ(o.chunk(), 8);
  const std::vector<v1::ModelSwitch> clash = {a, other};
  EXPECT_THAT(ModelOptionsFromEnv(clash, Lookup(env)),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("SHARED_CHUNK='8': declared differently"),
                             HasSubstr("family family_a (chunk, 1…512)"),
                             HasSubstr("family family_c (chunk, 1…64)"))));
  EXPECT_OK(ModelOptionsFromEnv(clash, Lookup({})).status());  // unset: no question
}

// A malformed declaration is refused naming the switch (the host then refuses the plugin).
TEST(ModelOptionsEnv, MalformedDeclarationsAreRefusedByName) {
  const std::pair<coli_switch_t, const char*> cases[] = {
      {abi::BoolSwitch("lower_case", COLI_SWITCH_FIELD_IDOT, ""), "a variable name is"},
      {abi::BoolSwitch("", COLI_SWITCH_FIELD_IDOT, ""), "a variable name is"},
      {abi::RealSwitch("X_BITS", COLI_SWITCH_FIELD_BITS, 0, 1, ""), "cannot set field 'bits'"},
      {abi::BoolSwitch("X_CHUNK", COLI_SWITCH_FIELD_CHUNK, ""), "cannot set field 'chunk'"},
      {abi::ListSwitch("X_TRACE", COLI_SWITCH_FIELD_TRACE_PATH, ""), "cannot set field"},
      {abi::IntSwitch("X_CHUNK", COLI_SWITCH_FIELD_CHUNK, 0, int64_t{1} << 40, ""),
       "does not fit int32 field 'chunk'"},
      {abi::IntSwitch("X_MAXT", COLI_SWITCH_FIELD_MAX_CONTEXT, 5, 1, ""), "empty integer range"},
      {abi::RealSwitch("X_TOPP", COLI_SWITCH_FIELD_TOPP, 1, 0, ""), "empty or infinite"},
      {abi::TextSwitch("X_EXTRA", ""), "names no extra key"},
      {abi::IntSwitch("X_FIELD", 99, 0, 1, ""), "unknown field 99"},
      {abi::BaseSwitch("X_KIND", COLI_SWITCH_FIELD_CHUNK, 42, ""), "unknown kind 42"},
  };
  for (const auto& [declared, why] : cases) {
    EXPECT_THAT(SwitchFromAbi(declared, "bad_family"),
                StatusIs(absl::StatusCode::kFailedPrecondition,
                         AllOf(HasSubstr("family bad_family: switch"), HasSubstr(why))))
        << why;
  }
  coli_switch_t short_struct = abi::BoolSwitch("X_IDOT", COLI_SWITCH_FIELD_IDOT, "");
  short_struct.struct_size = 16;
  EXPECT_THAT(SwitchFromAbi(short_struct, "bad_family"),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("struct_size 16")));
}

// The ABI numbers the typed fields as coli.v1.ModelOptions does: each constant names the field
// of that number (the reader sets fields by number).
TEST(ModelOptionsEnv, AbiFieldNumbersAreTheProtoFieldNumbers) {
  const std::pair<int, const char*> fields[] = {
      {COLI_SWITCH_FIELD_BITS, "bits"},
      {COLI_SWITCH_FIELD_MLA_BITS, "mla_bits"},
      {COLI_SWITCH_FIELD_HEAD_BITS, "head_bits"},
      {COLI_SWITCH_FIELD_IDOT, "idot"},
      {COLI_SWITCH_FIELD_CHUNK, "chunk"},
      {COLI_SWITCH_FIELD_DIRECT, "direct"},
      {COLI_SWITCH_FIELD_PIPE, "pipe"},
      {COLI_SWITCH_FIELD_LOAD_THREADS, "load_threads"},
      {COLI_SWITCH_FIELD_EXPERT_GB, "expert_gb"},
      {COLI_SWITCH_FIELD_TOPP, "topp"},
      {COLI_SWITCH_FIELD_MAX_CONTEXT, "max_context"},
      {COLI_SWITCH_FIELD_LAYERS, "layers"},
      {COLI_SWITCH_FIELD_THREADS, "threads"},
      {COLI_SWITCH_FIELD_MLA_NORM_EPS, "mla_norm_eps"},
      {COLI_SWITCH_FIELD_EXTRA_DIRS, "extra_dirs"},
      {COLI_SWITCH_FIELD_TRACE_PATH, "trace_path"},
      {COLI_SWITCH_FIELD_X0_PATH, "x0_path"},
      {COLI_SWITCH_FIELD_LOGITS_PATH, "logits_path"},
      {COLI_SWITCH_FIELD_EXTRA, "extra"},
  };
  for (const auto& [number, name] : fields) {
    const auto* f = v1::ModelOptions::descriptor()->FindFieldByNumber(number);
    ASSERT_NE(f, nullptr) << name;
    EXPECT_EQ(f->name(), name);
  }
}

TEST(ModelOptionsEnv, ListingShowsNameValuesFamilyTargetAndHelp) {
  const std::string listing = SwitchListing(K3Switches());
  EXPECT_THAT(listing, HasSubstr("COLI_THREADS"));
  EXPECT_THAT(listing, HasSubstr("coli-host: threads"));
  EXPECT_THAT(listing, HasSubstr("4, 8 or 32"));
  EXPECT_THAT(listing, HasSubstr("kimi_k3: chunk — prefill chunk in tokens"));
  EXPECT_THAT(listing, HasSubstr("kimi_k3: extra[ckpt]"));
  EXPECT_THAT(listing, HasSubstr("(0, 1]"));
  EXPECT_EQ(SwitchValues(K3Switches()[0]), "0…1024");  // COLI_THREADS, the host's
}

// Request defaults (ABI 1.10): typed as JSON, checked like every switch, never model options.
absl::StatusOr<nlohmann::json> RequestDefaults(std::span<const v1::ModelSwitch> switches,
                                               const EnvLookup& getenv) {
  COLI_ASSIGN_OR_RETURN(EnvironmentValues values, ReadEnvironment(switches, getenv));
  return values.request;
}

std::vector<v1::ModelSwitch> RequestSwitches() {
  static constexpr coli_switch_t kDeclared[] = {
      abi::ToRequestDefault(abi::BoolSwitch("T_THINK", COLI_SWITCH_FIELD_REQUEST, "think"),
                            "enable_thinking"),
      abi::ToRequestDefault(abi::IntSwitch("T_N", COLI_SWITCH_FIELD_REQUEST, 1, 5, "n"), "n"),
      abi::ToRequestDefault(abi::RealSwitch("T_TEMP", COLI_SWITCH_FIELD_REQUEST, 0, 2, "t"),
                            "temperature"),
      abi::ToRequestDefault(abi::TextSwitch("T_EFFORT", COLI_SWITCH_FIELD_REQUEST, "effort"),
                            "reasoning_effort"),
  };
  std::vector<v1::ModelSwitch> out;
  for (const coli_switch_t& s : kDeclared) {
    absl::StatusOr<v1::ModelSwitch> converted = SwitchFromAbi(s, "test");
    EXPECT_OK(converted.status());
    if (converted.ok()) out.push_back(*converted);
  }
  return out;
}

TEST(ModelOptionsEnv, RequestDefaultsAreTypedJsonAndNeverModelOptions) {
  const std::map<std::string, std::string> env = {
      {"T_THINK", "0"}, {"T_N", "3"}, {"T_TEMP", "0.5"}, {"T_EFFORT", "low"}};
  ASSERT_OK_AND_ASSIGN(nlohmann::json defaults, RequestDefaults(RequestSwitches(), Lookup(env)));
  EXPECT_EQ(defaults, (nlohmann::json{{"enable_thinking", false},
                                      {"n", 3},
                                      {"temperature", 0.5},
                                      {"reasoning_effort", "low"}}));
  EXPECT_TRUE(defaults["enable_thinking"].is_boolean());
  EXPECT_TRUE(defaults["n"].is_number_integer());
  ASSERT_OK_AND_ASSIGN(v1::ModelOptions options,
                       ModelOptionsFromEnv(RequestSwitches(), Lookup(env)));
  EXPECT_EQ(options.ByteSizeLong(), 0u) << options.DebugString();
  const std::map<std::string, std::string> unset;
  ASSERT_OK_AND_ASSIGN(nlohmann::json none, RequestDefaults(RequestSwitches(), Lookup(unset)));
  EXPECT_EQ(none, nlohmann::json::object());
}

TEST(ModelOptionsEnv, ABadRequestDefaultIsRefusedByBothReaders) {
  const std::map<std::string, std::string> env = {{"T_THINK", "false"}};
  const auto refused = StatusIs(absl::StatusCode::kInvalidArgument,
                                "environment variable T_THINK='false': expected 0 or 1");
  EXPECT_THAT(RequestDefaults(RequestSwitches(), Lookup(env)), refused);
  EXPECT_THAT(ModelOptionsFromEnv(RequestSwitches(), Lookup(env)), refused);
  EXPECT_THAT(RequestDefaults(RequestSwitches(), Lookup({{"T_N", "9"}})),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("outside [1, 5]")));
}

TEST(ModelOptionsEnv, ARequestDefaultNamesItsFieldAndIsNoList) {
  coli_switch_t no_field = abi::BoolSwitch("T_X", COLI_SWITCH_FIELD_REQUEST, "x");
  EXPECT_THAT(SwitchFromAbi(no_field, "test"),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("T_X: names no request field (extra_key)")));
  const coli_switch_t list =
      abi::ToRequestDefault(abi::ListSwitch("T_L", COLI_SWITCH_FIELD_REQUEST, "l"), "stop");
  EXPECT_THAT(SwitchFromAbi(list, "test"), StatusIs(absl::StatusCode::kFailedPrecondition,
                                                    HasSubstr("a list can only set extra_dirs")));
  EXPECT_EQ(SwitchTarget(RequestSwitches()[0]), "request[enable_thinking]");
}

TEST(ModelOptionsEnv, RequestDefaultsFillOnlyWhatARequestLeavesOut) {
  const nlohmann::json defaults = {{"enable_thinking", false}, {"n", 3}};
  nlohmann::ordered_json request = {
      {"messages", nlohmann::ordered_json::array()}, {"enable_thinking", true}, {"n", nullptr}};
  ApplyRequestDefaults(defaults, &request);
  EXPECT_EQ(request["enable_thinking"], true);  // the request's own value wins
  EXPECT_EQ(request["n"], 3);                   // null counts as unset
  nlohmann::json bare = {{"messages", nlohmann::json::array()}};
  ApplyRequestDefaults(defaults, &bare);
  EXPECT_EQ(bare["enable_thinking"], false);
  nlohmann::json not_object = nlohmann::json::array();
  ApplyRequestDefaults(defaults, &not_object);
  EXPECT_TRUE(not_object.empty());
}

// K3_THINK is kimi_k3's request default, declared last and left out of an older host's table
// (a 1.9 host refuses the field).
TEST(ModelOptionsEnv, KimiK3DeclaresK3ThinkOnlyToHostsThatKnowRequestDefaults) {
  const std::span<const coli_switch_t> now = k3::EnvironmentSwitches(10);
  const std::span<const coli_switch_t> older = k3::EnvironmentSwitches(9);
  ASSERT_EQ(older.size() + 1, now.size());
  EXPECT_STREQ(now.back().name, "K3_THINK");
  EXPECT_EQ(now.back().field, COLI_SWITCH_FIELD_REQUEST);
  EXPECT_STREQ(now.back().extra_key, "enable_thinking");
  for (const coli_switch_t& s : older) EXPECT_NE(s.field, COLI_SWITCH_FIELD_REQUEST) << s.name;
  ASSERT_OK_AND_ASSIGN(nlohmann::json think,
                       RequestDefaults(K3Switches(), Lookup({{"K3_THINK", "0"}})));
  EXPECT_EQ(think, (nlohmann::json{{"enable_thinking", false}}));
  // "false", "no", "2" or "yes" opened the think channel once (anything but "0" did).
  for (const std::string bad : {"false", "no", "2", "yes"}) {
    EXPECT_THAT(RequestDefaults(K3Switches(), Lookup({{"K3_THINK", bad}})),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         "environment variable K3_THINK='" + bad +
                             "': expected 1 (think) or 0 (answer only)"));
  }
}

}  // namespace
}  // namespace coli::host
