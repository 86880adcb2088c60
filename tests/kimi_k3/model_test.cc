// Kimi K3 model core against the independent float64 numpy reference (tools/k3/k3_ref.py),
// on the build's random-weight fixtures: k3_tiny (13 layers, MLA at 3, 7, 11, 12, AttnRes
// block 5 with a partial last block) and k3_tiny_ties (8 layers, MLA 3 and 7 = last, exact
// router ties, a correction bias that changes selections, rms_norm_eps 1e-4).
// Expected values never come from the engine itself, except where the property under test is
// self-consistency (chunked == token-at-a-time, bit for bit).
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <memory>
#include <random>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "common/json/json.h"
#include "common/sampling/sampling.h"
#include "common/status/status.h"
#include "gtest/gtest.h"
#include "plugins/kimi_k3/attn_res.h"
#include "plugins/kimi_k3/dense_mlp.h"
#include "plugins/kimi_k3/kda.h"
#include "plugins/kimi_k3/latent_moe.h"
#include "plugins/kimi_k3/mla.h"
#include "plugins/kimi_k3/model.h"
#include "plugins/kimi_k3/session.h"
#include "tests/kimi_k3/reference_util.h"

namespace coli::k3 {
namespace {

using testing::JoinIds;
using testing::ParseGreedyIds;
using testing::RandomIds;
using testing::ReadF32;
using testing::RelL2;
using testing::RunReference;
using testing::TempDir;
using testing::WorstLayerError;
using testing::WorstRowError;
using testing::WriteF32;

constexpr double kF32Tolerance = 1e-5;  // issue #5: rel-L2 per position / per layer

ModelOptions F32Options() {
  ModelOptions o;
  o.bits = o.mla_bits = o.head_bits = 32;
  o.idot = false;
  o.threads = 1;
  o.load_threads = 2;
  return o;
}

std::unique_ptr<Model> Load(const std::string& dir, const ModelOptions& o) {
  auto m = Model::Load(dir, o);
  EXPECT_TRUE(m.ok()) << m.status();
  return m.ok() ? std::move(m).value() : nullptr;
}

// ---- Whole stack ---------------------------------------------------------------------------

TEST(K3Reference, F32LogitsAndGreedyMatchOnSeveralSequences) {
  struct Case { const char* dir; int length; uint32_t seed; };
  // K3_TEST_VENDOR: spec §9.8's full-precision vendor-style snapshot (every tensor F32, routed
  // experts plain F32 w{1,2,3}.weight; vendor_f32_test.cc has the rest of its tests).
  const Case cases[] = {{K3_TEST_TINY, 128, 11}, {K3_TEST_TINY, 37, 12}, {K3_TEST_TIES, 130, 13},
                        {K3_TEST_VARIANT, 96, 14}, {K3_TEST_VENDOR, 80, 15},
                        {K3_TEST_VENDOR, 23, 16}};
  for (const Case& c : cases) {
    SCOPED_TRACE(absl::StrCat(c.dir, " length ", c.length));
    TempDir tmp;
    ModelOptions o = F32Options();
    o.logits_path = tmp.File("engine_logits.f32");
    auto model = Load(c.dir, o);
    ASSERT_NE(model, nullptr);
    const int64_t V = model->vocab_size();
    const std::vector<int32_t> ids = RandomIds(c.length, static_cast<int>(V), c.seed);
    auto out = RunReference(absl::StrCat("run --model ", c.dir, " --ids ", JoinIds(ids),
                                         " --out-logits ", tmp.File("ref_logits.f32"),
                                         " --greedy 4"));
    ASSERT_TRUE(out.ok()) << out.status();
    const std::vector<int32_t> ref_greedy = ParseGreedyIds(*out);
    ASSERT_EQ(ref_greedy.size(), 4u) << *out;

    auto session = model->NewSession();
    auto logits = session->Prefill(ids);
    ASSERT_TRUE(logits.ok()) << logits.status();
    const auto eng = ReadF32(o.logits_path), ref = ReadF32(tmp.File("ref_logits.f32"));
    ASSERT_EQ(eng.size(), static_cast<size_t>(c.length) * V);
    int64_t worst_row = -1;
    const double worst = WorstRowError(eng, ref, V, &worst_row);
    EXPECT_LE(worst, kF32Tolerance) << "worst position " << worst_row;
    std::vector<int32_t> greedy;
    for (int g = 0; g < 4; ++g) {
      greedy.push_back(sampling::Greedy(*logits));
      if (g < 3) {
        logits = session->Step(greedy.back());
        ASSERT_TRUE(logits.ok()) << logits.status();
      }
    }
    EXPECT_EQ(greedy, ref_greedy);
  }
}

// The load-time quantizers follow spec §4.2/§4.3 on the STORED rows of every matrix (what a
// repacked container holds). The reference emulates exactly that, so each switch alone must
// agree at f32 tolerance, not only within a drift bound. On k3_vendor_f32 the sources are F32
// matrices (spec §9.8), quantized from their exact f32 values the same way.
TEST(K3Reference, LoadTimeQuantizationMatchesTheSpecRowByRow) {
  struct Case { const char* dir; int bits, mla_bits, head_bits; const char* ref_flags; };
  const Case cases[] = {{K3_TEST_TINY, 8, 32, 32, "--bits 8"},
                        {K3_TEST_TINY, 4, 32, 32, "--bits 4"},
                        {K3_TEST_TINY, 32, 8, 32, "--mla-bits 8"},
                        {K3_TEST_TINY, 32, 4, 32, "--mla-bits 4"},
                        {K3_TEST_TINY, 32, 32, 8, "--head-bits 8"},
                        {K3_TEST_VENDOR, 8, 32, 32, "--bits 8"},
                        {K3_TEST_VENDOR, 4, 8, 8, "--bits 4 --mla-bits 8 --head-bits 8"}};
  const std::vector<int32_t> ids = RandomIds(24, 200, 21);
  for (const Case& c : cases) {
    SCOPED_TRACE(absl::StrCat(c.dir, " ", c.ref_flags));
    TempDir tmp;
    ModelOptions o = F32Options();
    o.bits = c.bits;
    o.mla_bits = c.mla_bits;
    o.head_bits = c.head_bits;
    o.logits_path = tmp.File("engine_logits.f32");
    auto model = Load(c.dir, o);
    ASSERT_NE(model, nullptr);
    auto out = RunReference(absl::StrCat("run --model ", c.dir, " --ids ", JoinIds(ids), " ",
                                         c.ref_flags, " --out-logits ", tmp.File("ref.f32")));
    ASSERT_TRUE(out.ok()) << out.status();
    auto session = model->NewSession();
    ASSERT_TRUE(session->Prefill(ids).ok());
    EXPECT_LE(WorstRowError(ReadF32(o.logits_path), ReadF32(tmp.File("ref.f32")),
                            model->vocab_size()),
              kF32Tolerance);
  }
}

// Engine h after every layer (trace) against the reference's, at f32 tolerance.
void CheckHiddenStates(const std::string& dir) {
  TempDir tmp;
  ModelOptions o = F32Options();
  o.trace_path = tmp.File("engine_trace.f32");
  auto model = Load(dir, o);
  ASSERT_NE(model, nullptr);
  const int T = 48, L = model->num_layers();
  const int64_t D = model->hidden_size();
  const auto ids = RandomIds(T, static_cast<int>(model->vocab_size()), 21);
  auto out = RunReference(absl::StrCat("run --model ", dir, " --ids ", JoinIds(ids),
                                       " --out-trace ", tmp.File("ref_trace.f32")));
  ASSERT_TRUE(out.ok()) << out.status();
  auto session = model->NewSession();
  ASSERT_TRUE(session->Prefill(ids).ok());
  const auto eng = ReadF32(o.trace_path), ref = ReadF32(tmp.File("ref_trace.f32"));
  ASSERT_EQ(eng.size(), static_cast<size_t>(T) * L * D);
  ASSERT_EQ(ref.size(), eng.size());
  for (int l = 0; l < L; ++l) {
    EXPECT_LE(WorstLayerError(eng, ref, T, L, D, l), kF32Tolerance) << "layer " << l;
  }
}

TEST(K3Reference, HiddenStateAfterEveryLayerMatches) {
  // k3_tiny_variant: the readings of spec §9.8's oracle config (MLA listed as 3 and 6, blocks
  // of 2, eps 1e-3, one shared expert, routed_scaling_factor 2), a decay rank that is not
  // head_dim and full-precision F32 tensors; k3_vendor_f32: spec §9.8's vendor-style snapshot,
  // all F32 with unquantized experts.
  for (const char* dir : {K3_TEST_TINY, K3_TEST_VARIANT, K3_TEST_VENDOR}) {
    SCOPED_TRACE(dir);
    CheckHiddenStates(dir);
  }
}

TEST(K3Reference, InjectedRowsThroughATruncatedStack) {
  TempDir tmp;
  ModelOptions o = F32Options();
  o.layers = 5;
  o.trace_path = tmp.File("engine_trace.f32");
  o.logits_path = tmp.File("engine_logits.f32");
  auto model = Load(K3_TEST_TIES, o);
  ASSERT_NE(model, nullptr);
  ASSERT_EQ(model->num_layers(), 5);
  const int T = 20;
  const int64_t D = model->hidden_size(), V = model->vocab_size();
  std::vector<float> x0(T * D);
  std::mt19937 rng(5);
  std::normal_distribution<float> nd(0.0f, 0.5f);
  for (float& v : x0) v = nd(rng);
  WriteF32(tmp.File("x0.f32"), x0);
  auto out = RunReference(absl::StrCat("run --model ", K3_TEST_TIES, " --x0 ", tmp.File("x0.f32"),
                                       " --rows ", T, " --layers 5 --out-trace ",
                                       tmp.File("ref_trace.f32"), " --out-logits ",
                                       tmp.File("ref_logits.f32")));
  ASSERT_TRUE(out.ok()) << out.status();
  auto session = model->NewSession();
  auto logits = session->PrefillRows(x0);
  ASSERT_TRUE(logits.ok()) << logits.status();
  EXPECT_LE(WorstRowError(ReadF32(o.trace_path), ReadF32(tmp.File("ref_trace.f32")), D),
            kF32Tolerance);
  EXPECT_LE(WorstRowError(ReadF32(o.logits_path), ReadF32(tmp.File("ref_logits.f32")), V),
            kF32Tolerance);
}

TEST(K3Reference, MlaLatentNormEpsilonIsTheVendorsAndConfigurable) {
  TempDir tmp;
  const auto ids = RandomIds(24, 768, 31);
  auto out = RunReference(absl::StrCat("run --model ", K3_TEST_TINY, " --ids ", JoinIds(ids),
                                       " --mla-eps 1e-5 --out-logits ", tmp.File("ref_1e5.f32")));
  ASSERT_TRUE(out.ok()) << out.status();
  const auto ref = ReadF32(tmp.File("ref_1e5.f32"));
  for (float eps : {1e-5f, 1e-6f}) {
    ModelOptions o = F32Options();
    o.mla_latent_norm_eps = eps;
    o.logits_path = tmp.File("eng.f32");
    auto model = Load(K3_TEST_TINY, o);
    ASSERT_NE(model, nullptr);
    ASSERT_TRUE(model->NewSession()->Prefill(ids).ok());
    const auto eng = ReadF32(o.logits_path);
    ASSERT_EQ(eng.size(), ref.size());
    const double err = WorstRowError(eng, ref, model->vocab_size());
    if (eps == 1e-5f) {
      EXPECT_LE(err, kF32Tolerance);
    } else {
      EXPECT_GT(err, 1e-3) << "the fixture's small latent must make the epsilon visible";
    }
  }
  EXPECT_EQ(ModelOptions().mla_latent_norm_eps, 1e-6f);  // vendor default (spec §3.9)
}

// ---- Each layer kind alone -----------------------------------------------------------------

// Each layer kind alone on a fixture, at layers of the right kind in it (spec §9 gate (a):
// KDA/MLA/MoE/AttnRes unit tests; on k3_vendor_f32 with F32 weights and unquantized experts,
// its MoE layer 4 stored matrix-major).
struct LayerFixture {
  const char* name;
  const char* dir;
  int mla, moe, mix, reorder;  // an MLA layer, MoE layers for the sublayer / arrival-order tests
};
void PrintTo(const LayerFixture& f, std::ostream* os) { *os << f.name; }
const LayerFixture kLayerFixtures[] = {{"tiny", K3_TEST_TINY, 3, 2, 6, 4},
                                       {"vendor_f32", K3_TEST_VENDOR, 2, 4, 5, 3}};

class K3Layers : public ::testing::TestWithParam<LayerFixture> {
 protected:
  void SetUp() override {
    model_ = Load(GetParam().dir, F32Options());
    ASSERT_NE(model_, nullptr);
    c_.matmul.idot = false;
    c_.matmul.threads = 1;
    c_.threads = 1;
  }
  std::vector<float> RandomRows(int T, uint32_t seed, float scale = 1.0f) {
    std::vector<float> x(static_cast<size_t>(T) * model_->hidden_size());
    std::mt19937 rng(seed);
    std::normal_distribution<float> nd(0.0f, scale);
    for (float& v : x) v = nd(rng);
    return x;
  }
  std::vector<float> Reference(const std::string& kind, int layer, const std::vector<float>& in,
                               int T) {
    WriteF32(tmp_.File("in.f32"), in);
    auto out = RunReference(absl::StrCat("layer --model ", GetParam().dir, " --layer ", layer,
                                         " --kind ", kind, " --in ", tmp_.File("in.f32"),
                                         " --rows ", T, " --out ", tmp_.File("out.f32")));
    EXPECT_TRUE(out.ok()) << out.status();
    return ReadF32(tmp_.File("out.f32"));
  }
  std::unique_ptr<Model> model_;
  Compute c_;
  TempDir tmp_;
};

TEST_P(K3Layers, KdaAloneMatchesReference) {
  const int T = 24, layer = 0;
  ASSERT_TRUE(model_->config().is_kda[layer]);
  const auto x = RandomRows(T, 1);
  KdaState st;
  st.Reset(model_->config().kda);
  std::vector<KdaState*> states(T, &st);
  std::vector<float> y(x.size());
  ASSERT_TRUE(KdaForward(model_->config(), model_->weights().layers[layer].kda_w, c_, x.data(), T,
                         states, y.data()).ok());
  const auto ref = Reference("kda", layer, x, T);
  EXPECT_LE(WorstRowError(y, ref, model_->hidden_size()), kF32Tolerance);
}

TEST_P(K3Layers, MlaAloneMatchesReference) {
  const int T = 24, layer = GetParam().mla;
  ASSERT_FALSE(model_->config().is_kda[layer]);
  const auto x = RandomRows(T, 2);
  MlaCache cache;
  cache.Reset(model_->config().mla);
  std::vector<MlaCache*> caches(T, &cache);
  std::vector<int64_t> pos(T);
  for (int t = 0; t < T; ++t) pos[t] = t;
  std::vector<float> y(x.size());
  ASSERT_TRUE(MlaForward(model_->config(), model_->weights().layers[layer].mla_w, 1e-6f, c_,
                         x.data(), T, caches, pos, y.data()).ok());
  EXPECT_EQ(cache.length, T);
  const auto ref = Reference("mla", layer, x, T);
  EXPECT_LE(WorstRowError(y, ref, model_->hidden_size()), kF32Tolerance);
}

TEST_P(K3Layers, DenseMlpAloneMatchesReference) {
  const int T = 6;
  const auto x = RandomRows(T, 3);
  std::vector<float> y(x.size());
  ASSERT_TRUE(DenseMlpForward(model_->config(), model_->weights().layers[0].dense_w, c_, x.data(),
                              T, y.data()).ok());
  EXPECT_LE(WorstRowError(y, Reference("dense", 0, x, T), model_->hidden_size()), kF32Tolerance);
}

TEST_P(K3Layers, LatentMoeAloneMatchesReference) {
  const int T = 12, layer = GetParam().moe;
  const auto x = RandomRows(T, 4);
  auto snap = st::Snapshot::Open(GetParam().dir);
  ASSERT_TRUE(snap.ok());
  auto src =
      PreadExpertSource::Create(**snap, model_->config(), model_->weights().prefix(), layer + 1);
  ASSERT_TRUE(src.ok()) << src.status();
  std::vector<float> y(x.size());
  MoeStats stats;
  ASSERT_TRUE(LatentMoeForward(model_->config(), model_->weights().layers[layer].moe_w, layer,
                               **src, 0.0, c_, x.data(), T, y.data(), &stats).ok());
  EXPECT_EQ(stats.expert_rows, int64_t{T} * model_->config().moe.top_k);
  EXPECT_LT(stats.expert_calls, stats.expert_rows);  // shared experts computed once per chunk
  EXPECT_LE(WorstRowError(y, Reference("moe", layer, x, T), model_->hidden_size()), kF32Tolerance);
}

TEST_P(K3Layers, AttnResMixAloneMatchesReference) {
  const int T = 5, layer = GetParam().mix;
  const int64_t D = model_->hidden_size();
  const auto cand = RandomRows(3 * T, 5, 2.0f);  // [3, T, D]: two snapshots + the prefix
  std::vector<float> y(T * D);
  const float* blocks[] = {cand.data(), cand.data() + T * D};
  AttnResMix(blocks, cand.data() + 2 * T * D, T, D,
             model_->weights().layers[layer].attn_res_score.data(),
             model_->config().rms_norm_eps, y.data());
  EXPECT_LE(WorstRowError(y, Reference("mix_attn", layer, cand, T), D), kF32Tolerance);
}

// Delivers the requested experts one by one in reverse list order (a stand-in for a store
// whose loads finish in any order).
class ReversedSource : public ExpertSource {
 public:
  explicit ReversedSource(ExpertSource& inner) : inner_(inner) {}
  absl::Status ForEachExpert(
      int layer, std::span<const int32_t> experts,
      const std::function<absl::Status(int i, const ExpertWeights&)>& fn) override {
    for (int i = static_cast<int>(experts.size()) - 1; i >= 0; --i) {
      const int32_t one[] = {experts[i]};
      COLI_RETURN_IF_ERROR(inner_.ForEachExpert(
          layer, one, [&](int, const ExpertWeights& w) { return fn(i, w); }));
    }
    return absl::OkStatus();
  }

 private:
  ExpertSource& inner_;
};

TEST_P(K3Layers, MoeSumDoesNotDependOnExpertArrivalOrder) {
  const int T = 9, layer = GetParam().reorder;
  const auto x = RandomRows(T, 6);
  auto snap = st::Snapshot::Open(GetParam().dir);
  ASSERT_TRUE(snap.ok());
  auto src =
      PreadExpertSource::Create(**snap, model_->config(), model_->weights().prefix(), layer + 1);
  ASSERT_TRUE(src.ok());
  ReversedSource reversed(**src);
  std::vector<float> a(x.size()), b(x.size());
  const MoeWeights& w = model_->weights().layers[layer].moe_w;
  ASSERT_TRUE(LatentMoeForward(model_->config(), w, layer, **src, 0.0, c_, x.data(), T, a.data()).ok());
  ASSERT_TRUE(LatentMoeForward(model_->config(), w, layer, reversed, 0.0, c_, x.data(), T, b.data()).ok());
  EXPECT_TRUE(a == b);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, K3Layers, ::testing::ValuesIn(kLayerFixtures),
                         [](const ::testing::TestParamInfo<LayerFixture>& info) {
                           return std::string(info.param.name);
                         });

// ---- Chunked prefill -----------------------------------------------------------------------

TEST(K3Chunked, BitIdenticalToTokenAtATime) {
  // Default (quantized, idot) settings: the production path.
  TempDir tmp;
  const auto ids = RandomIds(100, 768, 41);
  std::vector<std::vector<float>> streams;
  std::vector<std::vector<float>> next_logits;
  for (int chunk : {1, 32, 7}) {
    ModelOptions o;
    o.chunk = chunk;
    o.threads = chunk == 32 ? 2 : 1;  // also: results independent of the thread count
    o.logits_path = tmp.File(absl::StrCat("chunk", chunk, ".f32"));
    auto model = Load(K3_TEST_TINY, o);
    ASSERT_NE(model, nullptr);
    auto s = model->NewSession();
    auto last = s->Prefill(ids);
    ASSERT_TRUE(last.ok()) << last.status();
    auto step = s->Step(sampling::Greedy(*last));
    ASSERT_TRUE(step.ok());
    streams.push_back(ReadF32(o.logits_path));
    next_logits.push_back(*step);
  }
  ASSERT_EQ(streams[0].size(), 100u * 768);
  for (size_t i = 1; i < streams.size(); ++i) {
    EXPECT_TRUE(std::memcmp(streams[0].data(), streams[i].data(), streams[0].size() * 4) == 0)
        << "chunked logits differ from token-at-a-time";
    EXPECT_TRUE(next_logits[0] == next_logits[i]);
  }
}

// ---- Quantized drift -----------------------------------------------------------------------

struct QuantSetting {
  const char* name;
  int bits, mla, head;
  bool idot;
};
const QuantSetting kQuantSettings[] = {
    {"idot (f32 matrices, int8 activations in expert matmuls)", 32, 32, 32, true},
    {"int8 everywhere", 8, 8, 8, false},
    {"int4 (K3_BITS=4) + int8 MLA/head", 4, 8, 8, false},
    {"default: int4 + int8 + idot", 4, 8, 8, true},
};

ModelOptions QuantOptions(const QuantSetting& s) {
  ModelOptions o;
  o.bits = s.bits;
  o.mla_bits = s.mla;
  o.head_bits = s.head;
  o.idot = s.idot;
  o.threads = 1;
  return o;
}

// Each sublayer on the same inputs as the reference: the quantization error of one layer,
// free of the chaotic amplification of a random-weight stack (router flips, AttnRes).
TEST(K3Quantized, SublayerDriftAgainstReferenceIsBounded) {
  TempDir tmp;
  const int T = 16;
  std::unique_ptr<Model> f32 = Load(K3_TEST_TINY, F32Options());
  ASSERT_NE(f32, nullptr);
  const int64_t D = f32->hidden_size();
  std::vector<float> x(T * D);
  std::mt19937 rng(61);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (float& v : x) v = nd(rng);
  WriteF32(tmp.File("in.f32"), x);
  struct Kind { const char* kind; int layer; };
  const Kind kinds[] = {{"kda", 0}, {"mla", 3}, {"dense", 0}, {"moe", 2}};
  std::vector<std::vector<float>> refs;
  for (const Kind& k : kinds) {
    auto out = RunReference(absl::StrCat("layer --model ", K3_TEST_TINY, " --layer ", k.layer,
                                         " --kind ", k.kind, " --in ", tmp.File("in.f32"),
                                         " --rows ", T, " --out ", tmp.File("out.f32")));
    ASSERT_TRUE(out.ok()) << out.status();
    refs.push_back(ReadF32(tmp.File("out.f32")));
  }
  // Bounds per setting and kind: 1.5–3x what this fixture measured when the test was written
  // (idot: moe 0.011; int8: 0.011–0.017; int4: kda 0.33, dense 0.18, moe 0.19; recorded in
  // /work/notes/issue-5.md). int8 per row has ~0.5 % weight error, int4-g64 ~10 % on these
  // Gaussian weights, compounded over the chained projections of a layer; idot ~0.4 % per
  // activation group (spec §4).
  const double bounds[4][4] = {
      // kda, mla, dense, moe
      {1e-6, 1e-6, 1e-6, 0.03},   // idot: only the MXFP4 expert matmuls change
      {0.04, 0.04, 0.03, 0.03},   // int8
      {0.5, 0.04, 0.3, 0.3},      // int4 (MLA stays int8)
      {0.5, 0.05, 0.3, 0.3},      // default
  };
  for (int si = 0; si < 4; ++si) {
    const QuantSetting& s = kQuantSettings[si];
    auto model = Load(K3_TEST_TINY, QuantOptions(s));
    ASSERT_NE(model, nullptr);
    auto snap = st::Snapshot::Open(K3_TEST_TINY);
    ASSERT_TRUE(snap.ok());
    auto src = PreadExpertSource::Create(**snap, model->config(), model->weights().prefix(), 3);
    ASSERT_TRUE(src.ok());
    Compute c;
    c.matmul.idot = s.idot;
    c.matmul.threads = 1;
    c.threads = 1;
    std::string line;
    for (int ki = 0; ki < 4; ++ki) {
      const Kind& k = kinds[ki];
      const LayerWeights& lw = model->weights().layers[k.layer];
      std::vector<float> y(T * D);
      if (std::string(k.kind) == "kda") {
        KdaState st;
        st.Reset(model->config().kda);
        std::vector<KdaState*> states(T, &st);
        ASSERT_TRUE(KdaForward(model->config(), lw.kda_w, c, x.data(), T, states, y.data()).ok());
      } else if (std::string(k.kind) == "mla") {
        MlaCache cache;
        cache.Reset(model->config().mla);
        std::vector<MlaCache*> caches(T, &cache);
        std::vector<int64_t> pos(T);
        for (int t = 0; t < T; ++t) pos[t] = t;
        ASSERT_TRUE(MlaForward(model->config(), lw.mla_w, 1e-6f, c, x.data(), T, caches, pos,
                               y.data()).ok());
      } else if (std::string(k.kind) == "dense") {
        ASSERT_TRUE(DenseMlpForward(model->config(), lw.dense_w, c, x.data(), T, y.data()).ok());
      } else {
        ASSERT_TRUE(LatentMoeForward(model->config(), lw.moe_w, k.layer, **src, 0.0, c, x.data(),
                                     T, y.data()).ok());
      }
      const double err = RelL2(y.data(), refs[ki].data(), T * D);
      absl::StrAppend(&line, " ", k.kind, " ", absl::SixDigits(err));
      EXPECT_LE(err, bounds[si][ki]) << s.name << " " << k.kind;
      if (bounds[si][ki] > 1e-6) {
        EXPECT_GT(err, 1e-7) << s.name << " " << k.kind << ": no effect?";
      }
    }
    std::cout << "[drift] sublayer rel-L2, " << s.name << ":" << line << "\n";
  }
}

// The whole stack: per-layer drift of the hidden state (mean over positions). A random-weight
// stack amplifies small changes chaotically once a router selection flips, so only the first
// layers (before any MoE routing can flip) get a tight bound; the rest is reported and must
// stay finite and below the distance of unrelated vectors (~1.4).
TEST(K3Quantized, WholeStackDriftPerLayerIsReported) {
  TempDir tmp;
  const int T = 32;
  const auto ids = RandomIds(T, 768, 51);
  auto out = RunReference(absl::StrCat("run --model ", K3_TEST_TINY, " --ids ", JoinIds(ids),
                                       " --out-trace ", tmp.File("ref_trace.f32"),
                                       " --out-logits ", tmp.File("ref_logits.f32")));
  ASSERT_TRUE(out.ok()) << out.status();
  const auto ref_trace = ReadF32(tmp.File("ref_trace.f32"));
  const auto ref_logits = ReadF32(tmp.File("ref_logits.f32"));
  const double layer0_bound[4] = {1e-6, 0.03, 0.4, 0.4};  // measured 2e-7, 0.014, 0.21, 0.22
  for (int si = 0; si < 4; ++si) {
    const QuantSetting& s = kQuantSettings[si];
    ModelOptions o = QuantOptions(s);
    o.trace_path = tmp.File("trace.f32");
    o.logits_path = tmp.File("logits.f32");
    auto model = Load(K3_TEST_TINY, o);
    ASSERT_NE(model, nullptr);
    ASSERT_TRUE(model->NewSession()->Prefill(ids).ok());
    const auto trace = ReadF32(o.trace_path);
    const int L = model->num_layers();
    const int64_t D = model->hidden_size(), V = model->vocab_size();
    std::string per_layer;
    for (int l = 0; l < L; ++l) {
      double mean = 0;
      for (int t = 0; t < T; ++t) {
        const size_t off = (static_cast<size_t>(t) * L + l) * D;
        mean += RelL2(trace.data() + off, ref_trace.data() + off, D) / T;
      }
      absl::StrAppend(&per_layer, l ? " " : "", absl::SixDigits(mean));
      if (l == 0) {
        EXPECT_LE(mean, layer0_bound[si]) << s.name;
      }
      EXPECT_LT(mean, 1.4) << s.name << " layer " << l;
    }
    const auto logits = ReadF32(o.logits_path);
    double mean_logits = 0;
    for (int t = 0; t < T; ++t) mean_logits += RelL2(logits.data() + t * V, ref_logits.data() + t * V, V) / T;
    std::cout << "[drift] hidden rel-L2 per layer (mean over " << T << " positions), " << s.name
              << ": " << per_layer << "; logits " << mean_logits << "\n";
    EXPECT_LT(mean_logits, 1.4) << s.name;
  }
}

// ---- Routing -------------------------------------------------------------------------------

TEST(K3Routing, TiesTakeTheLowestIndexAndBiasOnlySelects) {
  MoeConfig moe;
  moe.num_experts = 6;
  moe.top_k = 2;
  moe.renormalize = true;
  moe.routed_scaling_factor = 1.0f;
  // Experts 1, 3, 4 tie exactly; bias zero: pick 1 then 3.
  std::vector<float> logits = {0.0f, 2.0f, -1.0f, 2.0f, 2.0f, 1.0f};
  std::vector<float> bias(6, 0.0f);
  Routing r = Route(moe, logits, bias, 0.0);
  EXPECT_EQ(r.experts, (std::vector<int32_t>{1, 3}));
  EXPECT_FLOAT_EQ(r.weights[0], 0.5f);
  // A bias lifts expert 5 into the selection; its weight uses σ(logit) alone.
  bias[5] = 0.2f;
  r = Route(moe, logits, bias, 0.0);
  EXPECT_EQ(r.experts, (std::vector<int32_t>{5, 1}));
  const double s5 = 1 / (1 + std::exp(-1.0)), s1 = 1 / (1 + std::exp(-2.0));
  EXPECT_NEAR(r.weights[0], s5 / (s5 + s1), 1e-6);
  EXPECT_NEAR(r.weights[1], s1 / (s5 + s1), 1e-6);
}

// ---- Session behaviour ---------------------------------------------------------------------

TEST(K3Session, CapacityCancelBadTokenAndReset) {
  ModelOptions o;
  o.threads = 1;
  o.max_context = 10;
  o.chunk = 4;
  auto model = Load(K3_TEST_TIES, o);
  ASSERT_NE(model, nullptr);
  auto s = model->NewSession();
  EXPECT_EQ(s->Prefill(RandomIds(11, 768, 1)).status().code(), absl::StatusCode::kResourceExhausted);
  int calls = 0;
  auto c = s->Prefill(RandomIds(9, 768, 1), nullptr, [&] { return ++calls > 1; });
  EXPECT_EQ(c.status().code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(s->position(), 4);  // the first chunk ran and stays valid
  auto bad = s->Step(100000);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("100000"), std::string::npos);
  s->Reset();
  EXPECT_EQ(s->position(), 0);
  EXPECT_TRUE(s->Prefill(RandomIds(3, 768, 2)).ok());
}

// A reset keeps the recurrent state's buffers (a new state allocates and page-faults ~434 MB on
// K3; the host's spare sessions are reset, not made again) and the session continues exactly
// like a new one; a copy into a session that held another conversation overwrites its buffers
// where they are and continues exactly like its source.
TEST(K3Session, ResetAndCopyKeepTheRecurrentBuffers) {
  ModelOptions o;
  o.threads = 1;
  auto model = Load(K3_TEST_TINY, o);
  ASSERT_NE(model, nullptr);
  auto kda_buffers = [&](Session& s) {
    std::vector<const float*> out;
    for (const KdaState& k : s.state().kda) {
      if (!k.S.empty()) out.push_back(k.S.data());
    }
    return out;
  };
  auto same_logits = [](const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
  };
  const std::vector<int32_t> prompt = RandomIds(12, 768, 3);
  auto fresh = model->NewSession();
  auto used = model->NewSession();
  ASSERT_TRUE(used->Prefill(RandomIds(40, 768, 4)).ok());
  ASSERT_TRUE(used->Step(7).ok());
  const std::vector<const float*> before = kda_buffers(*used);
  ASSERT_FALSE(before.empty());
  used->Reset();
  EXPECT_EQ(used->position(), 0);
  EXPECT_EQ(kda_buffers(*used), before) << "the reset allocated the recurrent state anew";
  for (const KdaState& k : used->state().kda) {
    EXPECT_TRUE(std::all_of(k.S.begin(), k.S.end(), [](float v) { return v == 0.0f; }));
  }
  auto a = fresh->Prefill(prompt);
  auto b = used->Prefill(prompt);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_TRUE(same_logits(*a, *b));
  for (int32_t token : {5, 77, 300}) {
    auto ta = fresh->Step(token);
    auto tb = used->Step(token);
    ASSERT_TRUE(ta.ok() && tb.ok());
    EXPECT_TRUE(same_logits(*ta, *tb)) << "token " << token;
  }

  auto copy = model->NewSession();
  ASSERT_TRUE(copy->Prefill(RandomIds(50, 768, 5)).ok());
  const std::vector<const float*> copy_before = kda_buffers(*copy);
  EXPECT_EQ(copy->CopyFrom(*copy).code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(copy->CopyFrom(*fresh).ok());
  EXPECT_EQ(kda_buffers(*copy), copy_before);
  EXPECT_EQ(copy->tokens(), fresh->tokens());
  for (int32_t token : {9, 400}) {
    auto ta = fresh->Step(token);
    auto tb = copy->Step(token);
    ASSERT_TRUE(ta.ok() && tb.ok());
    EXPECT_TRUE(same_logits(*ta, *tb)) << "token " << token;
  }
}

// ---- Snapshot layout ------------------------------------------------------------------------

TEST(K3Snapshot, VisionShardsAreNeverOpened) {
  auto snap = st::Snapshot::Open(K3_TEST_TINY);
  ASSERT_TRUE(snap.ok());
  auto cfg = Config::LoadDir(K3_TEST_TINY);
  ASSERT_TRUE(cfg.ok());
  ModelOptions o = F32Options();
  auto w = Weights::Load(**snap, *cfg, o);
  ASSERT_TRUE(w.ok()) << w.status();
  auto src = PreadExpertSource::Create(**snap, *cfg, (*w)->prefix(), (*w)->num_layers());
  ASSERT_TRUE(src.ok());
  std::vector<float> row(cfg->hidden_size);
  ASSERT_TRUE((*w)->EmbedRow(5, row.data()).ok());
  int opened = 0;
  for (int s = 0; s < (*snap)->num_shards(); ++s) opened += (*snap)->IsShardOpen(s);
  // Every text shard (13 layers + globals) is open, the two vision shards are not.
  EXPECT_EQ(opened, cfg->num_layers + 1);
  for (const std::string& name : (*snap)->Names()) {
    if (name.rfind("vision_tower.", 0) != 0 && name.rfind("mm_projector.", 0) != 0) continue;
    const std::string shard = (*snap)->ShardNameOf(name);
    for (int s = 0; s < (*snap)->num_shards(); ++s)
      if ((*snap)->ShardPath(s).ends_with(shard)) {
        EXPECT_FALSE((*snap)->IsShardOpen(s)) << shard;
      }
  }
}

TEST(K3Snapshot, NamesWithoutTheLanguageModelPrefixGiveTheSameLogits) {
  TempDir tmp;
  const std::string plain = tmp.File("plain");
  const std::string cmd = absl::StrCat(K3_TEST_PYTHON, " ", PROJECT_TOOLS_K3, "/make_fixture.py ",
                                       plain, " --preset tiny-ties --no-prefix --quiet");
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  const auto ids = RandomIds(20, 768, 71);
  std::vector<std::vector<float>> out;
  for (const std::string& dir : {std::string(K3_TEST_TIES), plain}) {
    auto model = Load(dir, F32Options());
    ASSERT_NE(model, nullptr);
    EXPECT_EQ(model->weights().prefix(), dir == plain ? "" : "language_model.");
    auto logits = model->NewSession()->Prefill(ids);
    ASSERT_TRUE(logits.ok()) << logits.status();
    out.push_back(*logits);
  }
  EXPECT_TRUE(out[0] == out[1]);
}

// ---- Bad checkpoints -----------------------------------------------------------------------

class K3BadCheckpoint : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = tmp_.File("snap");
    testing::CopyDir(K3_TEST_TIES, dir_);
  }
  absl::Status LoadStatus() {
    ModelOptions o = F32Options();
    return Model::Load(dir_, o).status();
  }
  std::string P(const std::string& rest) { return "language_model.model." + rest; }
  // The logits after prefilling `ids` on the snapshot in `dir` (f32 options); empty when it
  // fails (with a test failure).
  static std::vector<float> PrefillLogits(const std::string& dir, const std::vector<int32_t>& ids) {
    auto model = Load(dir, F32Options());
    if (model == nullptr) return {};
    auto logits = model->NewSession()->Prefill(ids);
    EXPECT_TRUE(logits.ok()) << logits.status();
    return logits.ok() ? *std::move(logits) : std::vector<float>();
  }
  TempDir tmp_;
  std::string dir_;
};

TEST_F(K3BadCheckpoint, PristineCopyLoads) { EXPECT_TRUE(LoadStatus().ok()) << LoadStatus(); }

TEST_F(K3BadCheckpoint, LayersPastTheStackAreRefused) {
  ModelOptions o = F32Options();
  auto probe = Model::Load(dir_, o);
  ASSERT_TRUE(probe.ok()) << probe.status();
  const int stack = (*probe)->num_layers();
  o.layers = stack;  // the whole stack: fine
  EXPECT_TRUE(Model::Load(dir_, o).ok());
  o.layers = stack + 1;
  absl::Status s = Model::Load(dir_, o).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find(absl::StrCat("K3_LAYERS=", stack + 1)), std::string::npos) << s;
}

// Switch values the engine cannot use are refused by name before a single tensor loads (on the
// full model loading takes minutes). K3_LOAD_THREADS 17…64 passed this check and failed only
// in the expert store after the whole load; nan K3_TOPP / K3_EXPERT_GB, inf K3_MLA_NORM_EPS,
// COLI_THREADS above 1024 and K3_LAYERS below -1 loaded without a word.
TEST(K3Options, UnusableSwitchValuesAreRefusedBeforeLoading) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  struct Case {
    const char* needle;
    std::function<void(ModelOptions&)> set;
  };
  const Case cases[] = {
      {"K3_LOAD_THREADS=17", [](ModelOptions& o) { o.load_threads = 17; }},
      {"K3_LOAD_THREADS=64", [](ModelOptions& o) { o.load_threads = 64; }},
      {"K3_TOPP=nan", [&](ModelOptions& o) { o.topp = nan; }},
      {"K3_EXPERT_GB=nan", [&](ModelOptions& o) { o.expert_gb = nan; }},
      {"K3_EXPERT_GB=-1", [](ModelOptions& o) { o.expert_gb = -1; }},
      {"K3_EXPERT_GB=inf", [&](ModelOptions& o) { o.expert_gb = inf; }},
      {"K3_MLA_NORM_EPS=inf", [&](ModelOptions& o) { o.mla_latent_norm_eps = inf; }},
      {"COLI_THREADS=100000", [](ModelOptions& o) { o.threads = 100000; }},
      {"COLI_THREADS=-1", [](ModelOptions& o) { o.threads = -1; }},
      {"K3_LAYERS=-2", [](ModelOptions& o) { o.layers = -2; }},
  };
  for (const Case& c : cases) {
    ModelOptions o = F32Options();
    c.set(o);
    int progress_calls = 0;
    absl::Status s = Model::Load(K3_TEST_TINY, o, [&](int, int) { ++progress_calls; }).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.needle << ": " << s;
    EXPECT_NE(s.message().find(c.needle), std::string::npos) << s;
    EXPECT_EQ(progress_calls, 0) << c.needle << ": refused only after loading tensors";
  }
  ModelOptions o = F32Options();
  o.load_threads = 16;  // the top of the range loads
  EXPECT_TRUE(Model::Load(K3_TEST_TINY, o).ok());
}

// A K3_TRACE / K3_LOGITS file that cannot be written: refused before any tensor loads (a served
// model loaded, then failed every request with it).
TEST(K3Options, UnwritableTraceOrLogitsPathIsRefusedBeforeLoading) {
  const std::string missing_dir = ::testing::TempDir() + "/no_such_folder_" +
                                  std::to_string(getpid()) + "/out.f32";
  for (const char* name : {"K3_TRACE", "K3_LOGITS"}) {
    ModelOptions o = F32Options();
    (std::string(name) == "K3_TRACE" ? o.trace_path : o.logits_path) = missing_dir;
    int progress_calls = 0;
    absl::Status s = Model::Load(K3_TEST_TINY, o, [&](int, int) { ++progress_calls; }).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied) << name << ": " << s;
    EXPECT_NE(s.message().find(std::string(name) + " '" + missing_dir + "': cannot open"),
              std::string::npos)
        << s;
    EXPECT_EQ(progress_calls, 0) << name;
  }
}

TEST_F(K3BadCheckpoint, MissingTensorIsNamed) {
  const std::string name = P("layers.1.self_attn.q_proj.weight");
  ASSERT_TRUE(testing::RewriteShardOf(dir_, name, [&](testing::EditableTensor& t) {
                if (t.name == name) t.keep = false;
              }).ok());
  absl::Status s = LoadStatus();
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound) << s;
  EXPECT_NE(s.message().find(name), std::string::npos) << s;
}

TEST_F(K3BadCheckpoint, WrongDtypeIsNamed) {
  // A BF16 slot takes F32 / F16 too (a full-precision snapshot, spec §9.8; vendor_f32_test.cc),
  // so the wrong dtype here is an integer one, for a vector and for a matrix.
  for (const std::string& name :
       {P("layers.0.input_layernorm.weight"), P("layers.1.self_attn.q_proj.weight")}) {
    SCOPED_TRACE(name);
    testing::CopyDir(K3_TEST_TIES, tmp_.File("fresh"));
    dir_ = tmp_.File("fresh");
    ASSERT_TRUE(testing::RewriteShardOf(dir_, name, [&](testing::EditableTensor& t) {
                  if (t.name != name) return;
                  t.dtype = st::DType::kI32;
                  t.bytes.assign(t.bytes.size() * 2, '\0');
                }).ok());
    absl::Status s = LoadStatus();
    EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
    EXPECT_NE(s.message().find(name), std::string::npos) << s;
    EXPECT_NE(s.message().find("I32"), std::string::npos) << s;
    std::filesystem::remove_all(dir_);
  }
}

TEST_F(K3BadCheckpoint, F16InABf16SlotIsConvertedExactly) {
  // A matrix stored as F16 gives the logits of the same values stored as F32, bit for bit (the
  // BF16 values are first rounded to F16 here; both files then hold exactly those values).
  const std::string name = P("layers.2.block_sparse_moe.routed_expert_down_proj.weight");
  const std::string f16_dir = tmp_.File("f16"), f32_dir = tmp_.File("f32");
  const auto ids = RandomIds(16, 768, 73);
  std::vector<std::vector<float>> out;
  for (bool half : {true, false}) {
    const std::string dir = half ? f16_dir : f32_dir;
    testing::CopyDir(K3_TEST_TIES, dir);
    ASSERT_TRUE(testing::RewriteShardOf(dir, name, [&](testing::EditableTensor& t) {
                  if (t.name != name) return;
                  const size_t n = t.bytes.size() / 2;
                  std::string bytes(n * (half ? 2 : 4), '\0');
                  for (size_t i = 0; i < n; ++i) {
                    uint16_t bf16;
                    std::memcpy(&bf16, &t.bytes[2 * i], 2);
                    const uint32_t bits = static_cast<uint32_t>(bf16) << 16;
                    float v;
                    std::memcpy(&v, &bits, 4);
                    const _Float16 h = static_cast<_Float16>(v);
                    const float back = static_cast<float>(h);
                    if (half) {
                      std::memcpy(&bytes[2 * i], &h, 2);
                    } else {
                      std::memcpy(&bytes[4 * i], &back, 4);
                    }
                  }
                  t.dtype = half ? st::DType::kF16 : st::DType::kF32;
                  t.bytes = std::move(bytes);
                }).ok());
    out.push_back(PrefillLogits(dir, ids));
  }
  EXPECT_FALSE(out[0].empty());
  EXPECT_TRUE(out[0] == out[1]);
}

TEST_F(K3BadCheckpoint, F32InABf16SlotIsConvertedExactly) {
  // The same values stored as F32 instead of BF16 give bit-identical logits.
  const std::string name = P("layers.1.self_attn.q_proj.weight");
  const auto ids = RandomIds(16, 768, 72);
  std::vector<std::vector<float>> out;
  for (bool widen : {false, true}) {
    if (widen) {
      ASSERT_TRUE(testing::RewriteShardOf(dir_, name, [&](testing::EditableTensor& t) {
                    if (t.name != name) return;
                    std::string wide(t.bytes.size() * 2, '\0');
                    for (size_t i = 0; i < t.bytes.size() / 2; ++i) {
                      std::memcpy(&wide[4 * i + 2], &t.bytes[2 * i], 2);  // bf16 = high half
                    }
                    t.dtype = st::DType::kF32;
                    t.bytes = std::move(wide);
                  }).ok());
    }
    out.push_back(PrefillLogits(dir_, ids));
  }
  EXPECT_FALSE(out[0].empty());
  EXPECT_TRUE(out[0] == out[1]);
}

TEST_F(K3BadCheckpoint, WrongShapeIsNamed) {
  const std::string name = P("layers.2.block_sparse_moe.experts.3.w2.weight_scale");
  ASSERT_TRUE(testing::RewriteShardOf(dir_, name, [&](testing::EditableTensor& t) {
                if (t.name != name) return;
                t.shape = {t.shape[1], t.shape[0]};  // transposed
              }).ok());
  absl::Status s = LoadStatus();
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_NE(s.message().find(name), std::string::npos) << s;
}

TEST_F(K3BadCheckpoint, TruncatedShardIsReported) {
  const std::string shard = dir_ + "/model-00003-of-000011.safetensors";
  ASSERT_TRUE(std::filesystem::exists(shard));
  std::filesystem::resize_file(shard, std::filesystem::file_size(shard) / 2);
  absl::Status s = LoadStatus();
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_NE(s.message().find("model-00003-of-000011.safetensors"), std::string::npos) << s;
}

TEST_F(K3BadCheckpoint, ALogOfUnexpectedLengthIsNamed) {
  const std::string name = P("layers.0.self_attn.A_log");
  ASSERT_TRUE(testing::RewriteShardOf(dir_, name, [&](testing::EditableTensor& t) {
                if (t.name != name) return;
                t.shape = {5};
                t.bytes.assign(20, '\0');
              }).ok());
  absl::Status s = LoadStatus();
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_NE(s.message().find(name), std::string::npos) << s;
}

TEST_F(K3BadCheckpoint, UnknownActivationIsUnimplementedWithItsKey) {
  const std::string path = dir_ + "/config.json";
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  in.close();
  nlohmann::json cfg = nlohmann::json::parse(ss.str());
  cfg["text_config"]["hidden_act"] = "gelu";
  std::ofstream(path) << cfg.dump(1);
  absl::Status s = LoadStatus();
  EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented) << s;
  EXPECT_NE(s.message().find("text_config.hidden_act"), std::string::npos) << s;
  EXPECT_NE(s.message().find("gelu"), std::string::npos) << s;
}

}  // namespace
}  // namespace coli::k3
