// The kimi_k3 plugin (its streaming expert store, plugin_entry.cc) on spec §9.8's
// full-precision vendor-style snapshot (build/fixtures/k3_vendor_f32: every tensor F32, routed
// experts as plain w{1,2,3}.weight F32, no quantization_config; random weights), opened through
// the C ABI with K3_BITS = K3_MLA_BITS = K3_HEAD_BITS = 32, K3_IDOT = 0: greedy ids and the
// first step's top log-probabilities against the independent float64 reference k3_ref.py.
#include <cmath>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/kimi_k3/plugin_abi_test_util.h"
#include "tests/kimi_k3/reference_util.h"

namespace coli::k3 {
namespace {

using testing::JoinIds;
using testing::ParseGreedyIds;
using testing::RandomIds;
using testing::ReadF32;
using testing::RunReference;
using testing::TempDir;

class K3VendorPluginTest : public abi_test::PluginAbiTest {};

TEST_F(K3VendorPluginTest, GreedyIdsAndLogprobsMatchTheReferenceThroughTheStore) {
  auto m = TryOpen({}, -1, [](coli_model_options_t* o) {
    o->bits = o->mla_bits = o->head_bits = 32;
    o->idot = 0;
    o->chunk = 7;
    o->threads = 1;
  });
  ASSERT_OK(m.status());
  for (uint32_t seed : {201u, 202u}) {
    SCOPED_TRACE(seed);
    // Ids of the base vocabulary (no special token in the prompt).
    const std::vector<int32_t> ids = RandomIds(seed == 201 ? 37 : 12, 400, seed);
    TempDir tmp;
    auto out = RunReference(absl::StrCat("run --model ", COLI_K3_TINY_DIR, " --ids ",
                                         JoinIds(ids), " --out-logits ", tmp.File("ref.f32"),
                                         " --greedy 5"));
    ASSERT_OK(out.status());
    const std::vector<int32_t> want = ParseGreedyIds(*out);
    ASSERT_EQ(want.size(), 5u);
    const std::vector<float> ref = ReadF32(tmp.File("ref.f32"));
    const size_t V = ref.size() / ids.size();
    // log-softmax of the reference's last prompt row (float64).
    const float* last = ref.data() + (ids.size() - 1) * V;
    double mx = last[0], sum = 0;
    for (size_t v = 0; v < V; ++v) mx = std::max<double>(mx, last[v]);
    for (size_t v = 0; v < V; ++v) sum += std::exp(last[v] - mx);
    const double log_z = mx + std::log(sum);

    coli_session_t* s = NewSession(*m);
    Prefill(s, ids);
    const std::vector<abi_test::Out> got = Generate(s, 5);
    ASSERT_FALSE(got.empty());
    int compared = 0;
    for (size_t t = 0; t < got.size() && got[t].finish == COLI_FINISH_NONE; ++t, ++compared) {
      EXPECT_EQ(got[t].token, want[t]) << "step " << t;
    }
    EXPECT_GE(compared, 1);
    ASSERT_EQ(got[0].top.size(), 3u);
    for (const coli_logprob_t& lp : got[0].top) {
      EXPECT_NEAR(lp.logprob, last[lp.id] - log_z, 1e-4) << "id " << lp.id;
    }
  }
}

}  // namespace
}  // namespace coli::k3
