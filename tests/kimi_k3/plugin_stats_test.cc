// The ABI's statistics contract on the kimi_k3 plugin (tiny fixture): session_stats are
// cumulative (the host sums their changes over requests into coli_plugin_stat), so a current
// value must not be one of them; the checkpoint caches' bytes are the model's current value
// (model_stats "checkpoint_bytes"), the sum over its live sessions.
#include <map>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/kimi_k3/plugin_abi_test_util.h"

namespace coli::k3 {
namespace {

class K3PluginStatsTest : public abi_test::PluginAbiTest {
 protected:
  // A prompt of n ids with message ends at `ends` (checkpoints are placed after them).
  std::vector<int32_t> Prompt(coli_model_t* m, int n, std::vector<int> ends) {
    std::vector<int32_t> eom(4);
    auto out = abi::Init<coli_token_buffer_t>();
    out.ids = eom.data();
    out.capacity = eom.size();
    Error err;
    EXPECT_OK(err.Status(api().tokenize(m, abi::Str("<|end_of_msg|>"), 1, &out, &err.e)));
    EXPECT_EQ(out.count, 1u);
    std::vector<int32_t> p;
    for (int i = 0; i < n; ++i) p.push_back(20 + (i * 37) % 400);
    for (int e : ends) p[e] = eom[0];
    return p;
  }
  void Destroy(coli_session_t* s) {
    api().session_destroy(s);
    std::erase(sessions_, s);
  }
};

TEST_F(K3PluginStatsTest, CheckpointBytesAreTheModelsCurrentValue) {
  coli_model_t* m = Open({{"ckpt", "2"}});
  ASSERT_NE(m, nullptr);
  EXPECT_EQ(ModelStats(m)["checkpoint_bytes"], 0);

  coli_session_t* a = NewSession(m);
  Prefill(a, Prompt(m, 24, {9, 17}));
  const double one = ModelStats(m)["checkpoint_bytes"];
  EXPECT_GT(one, 0);
  coli_session_t* b = NewSession(m);
  Prefill(b, Prompt(m, 24, {9, 17}));
  const double two = ModelStats(m)["checkpoint_bytes"];
  EXPECT_EQ(two, 2 * one);  // same prompt shape: the same checkpoints in each session

  // The session statistics never carry a current value.
  for (const char* gauge : {"checkpoint_bytes", "vk_tier_resident", "vk_tier_bytes",
                            "vk_dense_matrices", "vk_dense_bytes"}) {
    EXPECT_EQ(Stats(a).count(gauge), 0u) << gauge;
  }

  Error err;
  ASSERT_OK(err.Status(api().session_reset(a, &err.e)));
  EXPECT_EQ(ModelStats(m)["checkpoint_bytes"], one);  // a's checkpoints are gone, b's stay
  Destroy(b);
  EXPECT_EQ(ModelStats(m)["checkpoint_bytes"], 0);
  Prefill(a, Prompt(m, 24, {9, 17}));
  EXPECT_EQ(ModelStats(m)["checkpoint_bytes"], one);
  Destroy(a);
  EXPECT_EQ(ModelStats(m)["checkpoint_bytes"], 0);
}

// Every session statistic is a counter: none falls between two points of a session's life
// (prefill, decode steps, a second turn that restores a checkpoint, speculative verifies).
TEST_F(K3PluginStatsTest, SessionStatsNeverFall) {
  coli_model_t* m = Open({{"ckpt", "2"}, {"spec", "4"}});
  ASSERT_NE(m, nullptr);
  coli_session_t* s = NewSession(m);
  const std::vector<int32_t> prompt = Prompt(m, 30, {11, 21});
  std::map<std::string, double> last;
  auto check = [&](const char* when) {
    const std::map<std::string, double> now = Stats(s);
    for (const auto& [name, value] : last) {
      ASSERT_TRUE(now.contains(name)) << name << " vanished " << when;
      EXPECT_GE(now.at(name), value) << name << " fell " << when;
    }
    last = now;
  };
  Prefill(s, prompt);
  check("after the prefill");
  for (int i = 0; i < 3; ++i) {
    Generate(s, 4);
    check("after decode steps");
  }
  // A second turn from the first message end: restores a checkpoint.
  Prefill(s, std::vector<int32_t>(prompt.begin(), prompt.begin() + 22));
  check("after a restoring prefill");
  EXPECT_GT(last["checkpoint_restores"], 0);
  Generate(s, 4);
  check("after the second turn");
}

}  // namespace
}  // namespace coli::k3
