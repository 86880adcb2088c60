// The client core (tools/coli/client.h): a private coli-host started and stopped by the client,
// streaming with cancel, typed options from the K3_* environment, model selection.
#include "tools/coli/client.h"

#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "common/status/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace coli::client {
namespace {

using ::coli::testing::StatusIs;
using ::testing::HasSubstr;

std::string EchoModel() {
  const std::string dir = ::testing::TempDir() + "/client_echo_model_" + std::to_string(getpid());
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/config.json") << R"({"model_type": "coli_echo"})";
  return dir;
}

TEST(Client, PrivateHostServesAndGoesAwayWithTheClient) {
  std::string socket_path;
  {
    auto c = Client::Connect({.plugin_dir = COLI_ECHO_PLUGIN_DIR});
    ASSERT_OK(c.status());
    ASSERT_TRUE((*c)->has_private_host());
    ASSERT_EQ((*c)->address().rfind("unix:", 0), 0u);
    socket_path = (*c)->address().substr(5);
    EXPECT_TRUE(std::filesystem::exists(socket_path));
    int progress = 0;
    v1::ModelOptions options;
    (*options.mutable_extra())["delay_ms"] = "5";
    auto info = (*c)->LoadModel(EchoModel(), options, [&](const v1::LoadProgress&) { ++progress; });
    ASSERT_OK(info.status());
    EXPECT_EQ(info->family(), "coli_echo");
    EXPECT_GT(progress, 0);

    v1::GenerateRequest r;
    r.set_prompt("private host");
    std::string text;
    StreamCallbacks cb;
    cb.on_token = [&](const v1::Token& t) { text += t.text(); };
    auto finished = (*c)->Generate(r, cb);
    ASSERT_OK(finished.status());
    EXPECT_EQ(text, "private host");
    EXPECT_EQ(finished->reason(), v1::FINISH_REASON_STOP);

    // A CancelToken triggered from the token callback ends the stream with CANCELLED.
    CancelToken cancel;
    int tokens = 0;
    cb.on_token = [&](const v1::Token&) {
      if (++tokens == 2) cancel.Cancel();
    };
    r.set_prompt(std::string(100, 'c'));
    EXPECT_THAT((*c)->Generate(r, cb, &cancel), StatusIs(absl::StatusCode::kCancelled));
    EXPECT_LE(tokens, 100);

    ASSERT_OK_AND_ASSIGN(auto ids, (*c)->Tokenize("", "ok"));
    EXPECT_EQ(ids, std::vector<int32_t>({'o', 'k'}));
    ASSERT_OK_AND_ASSIGN(std::string back, (*c)->Detokenize("", ids));
    EXPECT_EQ(back, "ok");
    ASSERT_OK_AND_ASSIGN(auto models, (*c)->ListModels());
    EXPECT_EQ(models.size(), 1u);
    EXPECT_THAT((*c)->UnloadModel("nope"), StatusIs(absl::StatusCode::kNotFound));
  }
  // The client removed its private directory (socket included) and stopped the host.
  EXPECT_FALSE(std::filesystem::exists(std::filesystem::path(socket_path).parent_path()));
}

TEST(Client, UnreachableHostIsUnavailable) {
  auto c = Client::Connect({.host = "unix:/nonexistent/coli/host.sock", .connect_timeout_ms = 200});
  EXPECT_THAT(c.status(), StatusIs(absl::StatusCode::kUnavailable, HasSubstr("/nonexistent")));
}

TEST(Client, MissingHostBinaryIsNamed) {
  auto c = Client::Connect({.host_binary = "/nonexistent/coli-host"});
  EXPECT_THAT(c.status(), StatusIs(absl::StatusCode::kNotFound, HasSubstr("/nonexistent")));
}

#if defined(COLI_K3_PLUGIN_DIR)
// A private host with the kimi_k3 plugin: the client reads its environment with the switches
// that plugin declares (ABI 1.8, Health), so the client holds none of their names.
std::unique_ptr<Client> K3Host() {
  auto c = Client::Connect({.plugin_dir = COLI_K3_PLUGIN_DIR});
  EXPECT_OK(c.status());
  return c.ok() ? *std::move(c) : nullptr;
}
#define K3_HOST_OR_SKIP(name)              \
  std::unique_ptr<Client> name = K3Host(); \
  ASSERT_NE(name, nullptr)
#else
#define K3_HOST_OR_SKIP(name)                        \
  GTEST_SKIP() << "no kimi_k3 plugin in this build"; \
  Client* name = nullptr
#endif

TEST(Client, ModelOptionsFromEnvironment) {
  K3_HOST_OR_SKIP(host);
  auto ModelOptionsFromEnv = [&host] { return client::ModelOptionsFromEnv(*host); };
  setenv("K3_BITS", "8", 1);
  setenv("K3_IDOT", "0", 1);
  setenv("K3_EXPERT_GB", "2.5", 1);
  setenv("K3_MAXT", "4096", 1);
  setenv("K3_DIRS", "/a:/b,/c", 1);
  setenv("K3_TRACE", "/tmp/trace.f32", 1);
  auto o = ModelOptionsFromEnv();
  ASSERT_OK(o.status());
  EXPECT_EQ(o->bits(), 8);
  EXPECT_TRUE(o->has_idot());
  EXPECT_FALSE(o->idot());
  EXPECT_DOUBLE_EQ(o->expert_gb(), 2.5);
  EXPECT_EQ(o->max_context(), 4096);
  EXPECT_THAT(std::vector<std::string>(o->extra_dirs().begin(), o->extra_dirs().end()),
              ::testing::ElementsAre("/a", "/b", "/c"));
  EXPECT_EQ(o->trace_path(), "/tmp/trace.f32");
  EXPECT_FALSE(o->has_chunk());  // unset stays unset: the plugin's default applies

  setenv("K3_PIPE", "yes", 1);
  EXPECT_THAT(ModelOptionsFromEnv(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("K3_PIPE='yes'")));
  unsetenv("K3_PIPE");
  setenv("K3_CHUNK", "many", 1);
  EXPECT_THAT(ModelOptionsFromEnv(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("K3_CHUNK")));
  for (const char* v :
       {"K3_BITS", "K3_IDOT", "K3_EXPERT_GB", "K3_MAXT", "K3_DIRS", "K3_TRACE", "K3_CHUNK"}) {
    unsetenv(v);
  }
}

// The kimi_k3-only switches travel by name in `extra`, only when set; the numeric ones are
// checked at the edge.
TEST(Client, FamilySwitchesTravelInExtra) {
  K3_HOST_OR_SKIP(host);
  auto ModelOptionsFromEnv = [&host] { return client::ModelOptionsFromEnv(*host); };
  const char* vars[] = {"COLI_K3_CKPT",
                        "COLI_K3_CKPT_DIR",
                        "COLI_VULKAN",
                        "K3_VK",
                        "COLI_VK_TIER_GB",
                        "K3_VK_GB",
                        "COLI_VK_TIER_RATE",
                        "K3_VK_UP",
                        "K3_MMAP",
                        "COLI_K3_SPEC",
                        "COLI_VK_DENSE",
                        "COLI_VK_TIER",
                        "COLI_K3_SPEC_MIN",
                        "COLI_K3_SPEC_SAMPLED_NGRAM",
                        "COLI_K3_SPEC_ADAPT",
                        "COLI_K3_MIX_ROWS",
                        "COLI_K3_PREFIX_CACHE_MB",
                        "COLI_K3_PREFIX_CACHE_MIN"};
  for (const char* v : vars) unsetenv(v);
  auto none = ModelOptionsFromEnv();
  ASSERT_OK(none.status());
  EXPECT_TRUE(none->extra().empty());

  setenv("COLI_K3_CKPT", "4", 1);
  setenv("COLI_VULKAN", "1", 1);
  setenv("K3_VK_GB", "2", 1);
  setenv("K3_MMAP", "1", 1);
  setenv("COLI_K3_SPEC", "8", 1);
  setenv("COLI_VK_DENSE", "auto", 1);
  setenv("COLI_VK_TIER", "0", 1);
  setenv("COLI_K3_SPEC_MIN", "2", 1);
  setenv("COLI_K3_SPEC_SAMPLED_NGRAM", "4", 1);
  setenv("COLI_K3_SPEC_ADAPT", "0", 1);
  setenv("COLI_K3_MIX_ROWS", "16", 1);
  setenv("COLI_K3_PREFIX_CACHE_MB", "2048", 1);
  setenv("COLI_K3_PREFIX_CACHE_MIN", "64", 1);
  auto o = ModelOptionsFromEnv();
  ASSERT_OK(o.status());
  const std::map<std::string, std::string> extra(o->extra().begin(), o->extra().end());
  EXPECT_EQ(extra, (std::map<std::string, std::string>{{"ckpt", "4"},
                                                       {"vulkan", "1"},
                                                       {"vk_gb", "2"},
                                                       {"mmap", "1"},
                                                       {"spec", "8"},
                                                       {"vk_dense", "auto"},
                                                       {"vk_tier", "0"},
                                                       {"spec_min", "2"},
                                                       {"spec_sampled_ngram", "4"},
                                                       {"spec_adapt", "0"},
                                                       {"mix_rows", "16"},
                                                       {"prefix_cache", "2048"},
                                                       {"prefix_cache_min", "64"}}));

  setenv("COLI_K3_SPEC", "17", 1);  // more than 16 draft tokens
  EXPECT_THAT(ModelOptionsFromEnv(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("COLI_K3_SPEC")));
  setenv("COLI_K3_SPEC", "-1", 1);
  EXPECT_THAT(ModelOptionsFromEnv(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("COLI_K3_SPEC")));
  unsetenv("COLI_K3_SPEC");
  setenv("COLI_K3_PREFIX_CACHE_MB", "a lot", 1);
  EXPECT_THAT(ModelOptionsFromEnv(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("COLI_K3_PREFIX_CACHE_MB")));
  setenv("COLI_K3_PREFIX_CACHE_MB", "2048", 1);
  setenv("COLI_K3_PREFIX_CACHE_MIN", "-3", 1);
  EXPECT_THAT(ModelOptionsFromEnv(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("COLI_K3_PREFIX_CACHE_MIN")));
  unsetenv("COLI_K3_PREFIX_CACHE_MIN");
  setenv("COLI_K3_CKPT", "lots", 1);
  EXPECT_THAT(ModelOptionsFromEnv(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("COLI_K3_CKPT")));
  for (const char* v : vars) unsetenv(v);
}

// A second family's own switch (the echo test plugin's TEST_FAMILY_KNOB, 1…9) reaches its model
// through the client and the host with no line of either naming it, and a value out of range is
// refused before anything loads, naming the variable, the value and the range.
TEST(Client, AFamilysOwnSwitchIsReadWithNoHostChange) {
  auto c = Client::Connect({.plugin_dir = COLI_ECHO_PLUGIN_DIR});
  ASSERT_OK(c.status());
  unsetenv("TEST_FAMILY_KNOB");
  ASSERT_OK_AND_ASSIGN(v1::ModelOptions none, ModelOptionsFromEnv(**c));
  EXPECT_TRUE(none.extra().empty());

  setenv("TEST_FAMILY_KNOB", "7", 1);
  ASSERT_OK_AND_ASSIGN(v1::ModelOptions options, ModelOptionsFromEnv(**c));
  EXPECT_EQ(options.extra().at("knob"), "7");
  ASSERT_OK_AND_ASSIGN(v1::ModelInfo info, (*c)->LoadModel(EchoModel(), options, nullptr));
  ASSERT_OK_AND_ASSIGN(v1::MetricsResponse metrics, (*c)->GetMetrics());
  double knob = 0;
  for (const v1::ModelStat& stat : metrics.model_stats()) {
    if (stat.model() == info.id() && stat.name() == "knob") knob = stat.value();
  }
  EXPECT_EQ(knob, 7);  // the model got the value

  setenv("TEST_FAMILY_KNOB", "10", 1);
  EXPECT_THAT(ModelOptionsFromEnv(**c),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "environment variable TEST_FAMILY_KNOB: '10' is outside [1, 9]"));
  unsetenv("TEST_FAMILY_KNOB");
}

// A family's request default (ABI 1.10; the echo plugin's TEST_FAMILY_GREETING) reaches the
// client through Health with no line of the client or the host naming it, never as an option.
TEST(Client, AFamilysRequestDefaultIsReadWithNoHostChange) {
  auto c = Client::Connect({.plugin_dir = COLI_ECHO_PLUGIN_DIR});
  ASSERT_OK(c.status());
  unsetenv("TEST_FAMILY_GREETING");
  ASSERT_OK_AND_ASSIGN(host::EnvironmentValues none, ReadEnvironment(**c));
  EXPECT_EQ(none.request, nlohmann::json::object());
  setenv("TEST_FAMILY_GREETING", "hello there", 1);
  ASSERT_OK_AND_ASSIGN(host::EnvironmentValues set, ReadEnvironment(**c));
  EXPECT_EQ(set.request, (nlohmann::json{{"echo_greeting", "hello there"}}));
  EXPECT_TRUE(set.options.extra().empty());
  ASSERT_OK_AND_ASSIGN(v1::ModelOptions options, ModelOptionsFromEnv(**c));
  EXPECT_TRUE(options.extra().empty());
  unsetenv("TEST_FAMILY_GREETING");
}

// Output and exit code of a shell command line.
std::pair<std::string, int> Shell(const std::string& command) {
  std::string out;
  FILE* pipe = popen((command + " 2>&1").c_str(), "r");
  if (pipe == nullptr) return {"popen failed", -1};
  char buffer[4096];
  while (size_t n = fread(buffer, 1, sizeof buffer, pipe)) out.append(buffer, n);
  const int status = pclose(pipe);
  return {out, WIFEXITED(status) ? WEXITSTATUS(status) : -1};
}

// coli-host reads the same table for its --model loads (exit 2 before anything loads) and lists
// it with --switches.
TEST(Client, HostReadsAndListsAFamilysSwitches) {
  const std::string host =
      std::string(COLI_HOST_BINARY_FOR_TEST) + " --plugin-dir " + COLI_ECHO_PLUGIN_DIR;
  auto [refused, code] = Shell("TEST_FAMILY_KNOB=0 " + host + " --model " + EchoModel() +
                               " --listen unix:" + ::testing::TempDir() + "/knob.sock");
  EXPECT_EQ(code, 2) << refused;
  EXPECT_THAT(refused, HasSubstr("environment variable TEST_FAMILY_KNOB: '0' is outside [1, 9]"));
  auto [listing, listed] = Shell(host + " --switches");
  EXPECT_EQ(listed, 0) << listing;
  EXPECT_THAT(listing, HasSubstr("TEST_FAMILY_KNOB"));
  EXPECT_THAT(listing, HasSubstr("coli_echo: extra[knob]"));
  EXPECT_THAT(listing, HasSubstr("COLI_THREADS"));
  EXPECT_THAT(listing, ::testing::Not(HasSubstr("K3_")));  // only the loaded families'
}

TEST(Client, ModelChoiceFlagThenEnvironmentThenTinyModel) {
  unsetenv("COLI_MODEL");
  EXPECT_EQ(ResolveModelDir(""), COLI_CLIENT_TINY_MODEL);
  setenv("COLI_MODEL", "/models/k3", 1);
  EXPECT_EQ(ResolveModelDir(""), "/models/k3");
  EXPECT_EQ(ResolveModelDir("/flag/model"), "/flag/model");
  unsetenv("COLI_MODEL");
}

// The knob flags `coli run` and `coli chat` share: text to SamplingParams (ranges are the
// host's to check).
TEST(SamplingKnobFlags, ParseIntoSamplingParams) {
  v1::SamplingParams p;
  EXPECT_TRUE(IsSamplingKnobFlag("--frequency-penalty"));
  EXPECT_TRUE(IsSamplingKnobFlag("--logit-bias"));
  EXPECT_FALSE(IsSamplingKnobFlag("--temperature"));
  ASSERT_OK(ParseSamplingKnobFlag("--frequency-penalty", "0.5", &p));
  ASSERT_OK(ParseSamplingKnobFlag("--presence-penalty", "-1.25", &p));
  ASSERT_OK(ParseSamplingKnobFlag("--repetition-penalty", "1.1", &p));
  ASSERT_OK(ParseSamplingKnobFlag("--min-p", "0.05", &p));
  ASSERT_OK(ParseSamplingKnobFlag("--logit-bias", "12=-100,7=2.5", &p));
  ASSERT_OK(ParseSamplingKnobFlag("--logit-bias", "3=1", &p));  // repeats add
  EXPECT_FLOAT_EQ(p.frequency_penalty(), 0.5f);
  EXPECT_FLOAT_EQ(p.presence_penalty(), -1.25f);
  EXPECT_FLOAT_EQ(p.repetition_penalty(), 1.1f);
  EXPECT_FLOAT_EQ(p.min_p(), 0.05f);
  ASSERT_EQ(p.logit_bias_size(), 3);
  EXPECT_EQ(p.logit_bias(0).id(), 12);
  EXPECT_FLOAT_EQ(p.logit_bias(0).bias(), -100.0f);
  EXPECT_EQ(p.logit_bias(2).id(), 3);
  EXPECT_THAT(ParseSamplingKnobFlag("--min-p", "lots", &p),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--min-p: 'lots'")));
  EXPECT_THAT(ParseSamplingKnobFlag("--logit-bias", "12:-100", &p),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("ID=BIAS")));
  EXPECT_THAT(ParseSamplingKnobFlag("--logit-bias", "x=1", &p),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("'x=1'")));
}

}  // namespace
}  // namespace coli::client
