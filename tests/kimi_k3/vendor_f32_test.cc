// The engine on a full-precision vendor-style snapshot (spec §9.8: a torch save_pretrained of
// Moonshot's modeling code with every parameter re-drawn and the routed experts kept in f32):
// build/fixtures/k3_vendor_f32 (tools/k3/make_fixture.py --preset vendor-f32, random weights),
// whose tensors are all F32 (dense matrices, norms and the embedding included), whose experts
// are plain `experts.{e}.w{1,2,3}.weight` F32 matrices and whose config has no
// quantization_config. Expected values come from the independent float64 reference
// tools/k3/k3_ref.py; self-consistency (chunked == token-at-a-time, store == pread) is bit-exact.
// Logits of every position, greedy ids, per-layer hidden states and load-time quantization on
// this fixture are in model_test.cc (K3Reference, with the other fixtures); the plugin's C ABI
// path in vendor_plugin_test.cc.
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/sampling/sampling.h"
#include "common/status/status.h"
#include "common/status/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "plugins/kimi_k3/expert_source.h"
#include "plugins/kimi_k3/expert_store.h"
#include "plugins/kimi_k3/model.h"
#include "plugins/kimi_k3/repack.h"
#include "plugins/kimi_k3/session.h"
#include "plugins/kimi_k3/vk_tier.h"
#include "tests/kimi_k3/reference_util.h"
#include "tests/kimi_k3/vk_test_util.h"

namespace coli::k3 {
namespace {

using ::coli::testing::IsOk;
using ::coli::testing::StatusIs;
using ::testing::HasSubstr;
using testing::JoinIds;
using testing::RandomIds;
using testing::ReadF32;
using testing::RunReference;
using testing::TempDir;
using testing::WorstRowError;

constexpr double kF32Tolerance = 1e-5;  // spec §9 gate (a): rel-L2 per position / per layer
const std::string kDir = K3_TEST_VENDOR;
// Decoder layer 4 stores its experts matrix-major (make_fixture.py), so none of its 8 experts
// is one contiguous range; the other 4 MoE layers' 32 experts are.
constexpr int kMoeLayers = 5, kExperts = 8, kContiguous = 32;

ModelOptions F32Options(int chunk = 32) {
  ModelOptions o;
  o.bits = o.mla_bits = o.head_bits = 32;
  o.idot = false;
  o.chunk = chunk;
  o.threads = 1;
  o.load_threads = 2;
  return o;
}

// The store with no usage history written next to the fixture.
ExpertStoreOptions StoreOptions(double expert_gb, bool direct) {
  ExpertStoreOptions o;
  o.expert_gb = expert_gb;
  o.direct = direct;
  o.load_threads = 2;
  o.usage_path = "";
  return o;
}

// The streaming store (the plugin's expert source) on F32 experts: the same logits as the
// reference, bit-identical to the pread source, with 1 slot per layer (every step reads, LRU
// evictions) or every expert cached, O_DIRECT or buffered; contiguous and matrix-major layers;
// chunked prefill (K3_CHUNK 7) bit-identical to token-at-a-time (K3_CHUNK 1) through both.
TEST(K3VendorF32, StreamingStoreMatchesPreadBitForBitAndTheReference) {
  const std::vector<int32_t> ids = RandomIds(30, 400, 105);
  auto run = [&](const Model::ExpertSourceFactory& factory,
                 int chunk) -> absl::StatusOr<std::vector<float>> {
    TempDir tmp;
    ModelOptions o = F32Options(chunk);
    o.logits_path = tmp.File("logits.f32");
    COLI_ASSIGN_OR_RETURN(auto model, Model::Load(kDir, o, nullptr, factory));
    auto session = model->NewSession();
    COLI_ASSIGN_OR_RETURN(std::vector<float> last, session->Prefill(ids));
    COLI_ASSIGN_OR_RETURN(std::vector<float> next, session->Step(sampling::Greedy(last)));
    std::vector<float> out = ReadF32(o.logits_path);
    out.insert(out.end(), next.begin(), next.end());
    return out;
  };
  ASSERT_OK_AND_ASSIGN(const std::vector<float> pread, run(nullptr, 1));
  ASSERT_OK_AND_ASSIGN(const std::vector<float> pread_chunked, run(nullptr, 7));
  ASSERT_EQ(pread_chunked.size(), pread.size());
  EXPECT_EQ(std::memcmp(pread_chunked.data(), pread.data(), pread.size() * sizeof(float)), 0);
  for (bool direct : {true, false}) {
    for (double gb : {0.0, 1.0}) {
      for (int chunk : {7, 1}) {
        SCOPED_TRACE(absl::StrCat("direct=", direct, " gb=", gb, " chunk=", chunk));
        StreamingExpertStore* store = nullptr;
        ASSERT_OK_AND_ASSIGN(
            const std::vector<float> streamed,
            run(StreamingExpertSourceFactory(StoreOptions(gb, direct), &store), chunk));
        ASSERT_EQ(streamed.size(), pread.size());
        EXPECT_EQ(std::memcmp(streamed.data(), pread.data(), pread.size() * sizeof(float)), 0);
      }
    }
  }
  // The store's view of the snapshot.
  ASSERT_OK_AND_ASSIGN(auto snapshot, st::Snapshot::Open(kDir));
  ASSERT_OK_AND_ASSIGN(ExpertStoreLayout layout, DiscoverExpertLayout(snapshot.get()));
  EXPECT_EQ(layout.format, ExpertFormat::kF32);
  EXPECT_EQ(layout.moe_layers.size(), static_cast<size_t>(kMoeLayers));
  EXPECT_EQ(layout.experts, kExperts);
  EXPECT_EQ(layout.latent, 32);
  EXPECT_EQ(layout.inter, 32);
  EXPECT_EQ(layout.ExpertBytes(), 3u * 32 * 32 * 4);
  ASSERT_OK_AND_ASSIGN(auto store, StreamingExpertStore::Open(snapshot.get(), layout,
                                                              StoreOptions(1.0, true)));
  EXPECT_EQ(store->contiguous_experts(), kContiguous);
  // The values themselves against the reference (every prompt position).
  TempDir tmp;
  ASSERT_OK(RunReference(absl::StrCat("run --model ", kDir, " --ids ", JoinIds(ids),
                                      " --out-logits ", tmp.File("ref.f32")))
                .status());
  const std::vector<float> ref = ReadF32(tmp.File("ref.f32"));
  const std::vector<float> prompt_part(pread.begin(), pread.begin() + ref.size());
  EXPECT_LE(WorstRowError(prompt_part, ref, static_cast<int64_t>(ref.size() / ids.size())),
            kF32Tolerance);
}

// What save_pretrained writes for a model this small: ONE model.safetensors (no index), the text
// model's names without the `language_model.` prefix, data in name order (so every expert's
// w1, w2, w3 are back to back, experts in 0, 1, 10, ... order). Same logits, bit for bit, as the
// sharded fixture, through both sources.
TEST(K3VendorF32, ASingleFileSavePretrainedLayoutGivesTheSameLogits) {
  TempDir tmp;
  const std::string single = tmp.File("single");
  std::filesystem::create_directories(single);
  {
    ASSERT_OK_AND_ASSIGN(auto snapshot, st::Snapshot::Open(kDir));
    st::Writer writer;
    writer.SetMetadata({{"format", "pt"}});
    const std::string prefix = "language_model.";
    for (const std::string& name : snapshot->Names()) {  // sorted
      if (!name.starts_with(prefix)) continue;           // vision_tower.*, mm_projector.*
      ASSERT_OK_AND_ASSIGN(const st::TensorInfo* t, snapshot->Get(name));
      std::string bytes(t->nbytes, '\0');
      ASSERT_OK(snapshot->Read(*t, bytes.data()));
      ASSERT_OK(writer.Add(name.substr(prefix.size()), t->dtype, t->shape, std::move(bytes)));
    }
    ASSERT_OK(writer.Write(single + "/model.safetensors"));
    std::filesystem::copy_file(kDir + "/config.json", single + "/config.json");
  }
  const std::vector<int32_t> ids = RandomIds(20, 400, 107);
  std::vector<std::vector<float>> out;
  for (const std::string& dir : {kDir, single}) {
    for (bool store : {false, true}) {
      SCOPED_TRACE(absl::StrCat(dir, store ? " store" : " pread"));
      StreamingExpertStore* s = nullptr;
      ASSERT_OK_AND_ASSIGN(
          auto model,
          Model::Load(dir, F32Options(), nullptr,
                      store ? StreamingExpertSourceFactory(StoreOptions(0.0, true), &s) : nullptr));
      EXPECT_EQ(model->weights().prefix(), dir == single ? "" : "language_model.");
      if (store && dir == single) {
        EXPECT_EQ(s->contiguous_experts(), kMoeLayers * kExperts);
      }
      ASSERT_OK_AND_ASSIGN(std::vector<float> logits, model->NewSession()->Prefill(ids));
      out.push_back(std::move(logits));
    }
  }
  for (size_t i = 1; i < out.size(); ++i) EXPECT_TRUE(out[i] == out[0]) << "run " << i;
}

// The views the sources hand out are the stored F32 matrices themselves (never re-encoded),
// for a contiguous layer and for the matrix-major one, through both sources.
TEST(K3VendorF32, ExpertViewsAreTheStoredF32Matrices) {
  ASSERT_OK_AND_ASSIGN(auto snapshot, st::Snapshot::Open(kDir));
  ASSERT_OK_AND_ASSIGN(Config cfg, Config::LoadDir(kDir));
  ASSERT_OK_AND_ASSIGN(ExpertStoreLayout layout, DiscoverExpertLayout(snapshot.get()));
  ASSERT_OK_AND_ASSIGN(auto store, StreamingExpertStore::Open(snapshot.get(), layout,
                                                              StoreOptions(0.0, true)));
  ASSERT_OK_AND_ASSIGN(auto pread,
                       PreadExpertSource::Create(*snapshot, cfg, layout.prefix, cfg.num_layers));
  for (int layer : {2, 4}) {
    const std::vector<int32_t> experts = {6, 1, 6};
    for (ExpertSource* source : {static_cast<ExpertSource*>(store.get()),
                                 static_cast<ExpertSource*>(pread.get())}) {
      int calls = 0;
      ASSERT_OK(source->ForEachExpert(layer, experts, [&](int i, const ExpertWeights& w) {
        ++calls;
        const std::string base =
            absl::StrCat(layout.prefix, "model.layers.", layer, ".block_sparse_moe.experts.",
                         experts[i], ".");
        for (auto [m, view] : {std::pair{"w1", &w.w1}, {"w2", &w.w2}, {"w3", &w.w3}}) {
          COLI_ASSIGN_OR_RETURN(const st::TensorInfo* t, snapshot->Get(base + m + ".weight"));
          COLI_ASSIGN_OR_RETURN(std::vector<float> stored, snapshot->ReadAsF32(*t));
          EXPECT_EQ(view->format, kernels::WeightFormat::kF32) << m;
          EXPECT_EQ(view->rows, t->shape[0]) << m;
          EXPECT_EQ(view->cols, t->shape[1]) << m;
          EXPECT_EQ(reinterpret_cast<uintptr_t>(view->data) % alignof(float), 0u) << m;
          EXPECT_EQ(std::memcmp(view->data, stored.data(), stored.size() * sizeof(float)), 0)
              << base << m;
        }
        return absl::OkStatus();
      }));
      EXPECT_EQ(calls, 3);
    }
  }
}

// COLI_VULKAN=1 with F32 experts: the tier (MXFP4 only) stays off with a warning and the CPU
// computes everything, with the CPU's bits; the tier itself refuses such a snapshot.
TEST(K3VendorF32, TheVulkanTierStaysOffForF32Experts) {
  ModelOptions o = F32Options();
  ASSERT_OK_AND_ASSIGN(auto cpu, Model::Load(kDir, o));
  o.vulkan = true;
  VkExpertTier* tier = reinterpret_cast<VkExpertTier*>(1);
  ASSERT_OK_AND_ASSIGN(auto vk, Model::Load(kDir, o, nullptr,
                                            ExpertSourceFactoryFor(o, kDir, nullptr, &tier)));
  EXPECT_EQ(tier, nullptr);
  const std::vector<int32_t> ids = RandomIds(12, 400, 106);
  ASSERT_OK_AND_ASSIGN(std::vector<float> a, cpu->NewSession()->Prefill(ids));
  ASSERT_OK_AND_ASSIGN(std::vector<float> b, vk->NewSession()->Prefill(ids));
  EXPECT_TRUE(a == b);
}

// §9.8 sets rms_norm_eps 1e-3 "so the MLA norms' 1e-6 is visible": an engine that used the
// model's epsilon for the MLA latent norms would miss the reference by far more than 1e-5.
TEST(K3VendorF32, TheMlaLatentNormEpsilonIsVisibleNextToRmsNormEps) {
  TempDir tmp;
  const std::vector<int32_t> ids = RandomIds(24, 400, 108);
  ASSERT_OK(RunReference(absl::StrCat("run --model ", kDir, " --ids ", JoinIds(ids),
                                      " --out-logits ", tmp.File("ref.f32")))
                .status());
  const std::vector<float> ref = ReadF32(tmp.File("ref.f32"));
  for (float eps : {1e-6f, 1e-3f}) {
    SCOPED_TRACE(eps);
    ModelOptions o = F32Options();
    o.mla_latent_norm_eps = eps;
    o.logits_path = tmp.File("eng.f32");
    ASSERT_OK_AND_ASSIGN(auto model, Model::Load(kDir, o));
    ASSERT_EQ(model->config().rms_norm_eps, 1e-3f);
    ASSERT_OK(model->NewSession()->Prefill(ids).status());
    const std::vector<float> eng = ReadF32(o.logits_path);
    ASSERT_EQ(eng.size(), ref.size());
    const double err = WorstRowError(eng, ref, model->vocab_size());
    if (eps == 1e-6f) {
      EXPECT_LE(err, kF32Tolerance);
    } else {
      EXPECT_GT(err, 1e-2);
    }
  }
}

// Asked directly (not through the factory), the tier refuses a snapshot with F32 experts.
TEST(K3VendorF32, TheVulkanTierRefusesF32ExpertsWhenCreatedDirectly) {
  COLI_VK_CONTEXT_OR_SKIP(vk);
  ASSERT_OK_AND_ASSIGN(auto snapshot, st::Snapshot::Open(kDir));
  ASSERT_OK_AND_ASSIGN(Config cfg, Config::LoadDir(kDir));
  ASSERT_OK_AND_ASSIGN(auto pread,
                       PreadExpertSource::Create(*snapshot, cfg, "language_model.", cfg.num_layers));
  auto tier = VkExpertTier::Create(std::move(vk), std::move(pread), *snapshot, cfg,
                                   "language_model.", cfg.num_layers, VkTierOptions{});
  EXPECT_THAT(tier.status(),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("MXFP4 experts only")));
}

// k3-repack (repack.h) does not convert a full-precision snapshot (its quantizer reads BF16
// rows; plain experts would pass through unordered): it refuses at the first F32 matrix,
// naming it and the shard, and leaves no output shard behind.
TEST(K3VendorF32, RepackRefusesAFullPrecisionSnapshotNamingTheTensor) {
  TempDir tmp;
  const std::string dst = tmp.File("container");
  auto summary = Repack(kDir, dst, RepackOptions{});
  EXPECT_THAT(summary.status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       ::testing::AllOf(HasSubstr("self_attn.q_proj.weight"),
                                        HasSubstr("model-00001-of-000009.safetensors"),
                                        HasSubstr("F32"))));
  int shards = 0;
  if (std::filesystem::exists(dst))
    for (const auto& e : std::filesystem::directory_iterator(dst))
      shards += e.path().extension() == ".safetensors" || e.path().extension() == ".tmp";
  EXPECT_EQ(shards, 0);
}

// ---- Damaged variants, each refused naming the tensor ----------------------------------------

class K3VendorDamaged : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = tmp_.File("snap");
    testing::CopyDir(kDir, dir_);
  }
  // Refused by both expert sources (Model::Load's pread and the store) with `code`, naming
  // `name`.
  void ExpectRefused(absl::StatusCode code, const std::string& name) {
    absl::Status pread = Model::Load(dir_, F32Options()).status();
    EXPECT_THAT(pread, StatusIs(code, HasSubstr(name)));
    absl::Status streamed =
        Model::Load(dir_, F32Options(), nullptr,
                    StreamingExpertSourceFactory(StoreOptions(0.0, true)))
            .status();
    EXPECT_THAT(streamed, StatusIs(code, HasSubstr(name)));
  }
  // RewriteShardOf keeps the index's names: a renamed tensor is renamed there too.
  absl::Status RenameInIndex(const std::string& from, const std::string& to) {
    const std::string path = dir_ + "/model.safetensors.index.json";
    std::ifstream in(path);
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    COLI_ASSIGN_OR_RETURN(st::Index index, st::ParseIndex(text, path));
    auto node = index.weight_map.extract(from);
    if (node.empty()) return absl::NotFoundError(from);
    node.key() = to;
    index.weight_map.insert(std::move(node));
    return st::WriteIndex(path, index.weight_map, index.total_size.value_or(0));
  }
  std::string E(int layer, int expert, const std::string& rest) {
    return absl::StrCat("language_model.model.layers.", layer, ".block_sparse_moe.experts.",
                        expert, ".", rest);
  }
  TempDir tmp_;
  std::string dir_;
};

TEST_F(K3VendorDamaged, PristineCopyLoadsThroughBothSources) {
  EXPECT_OK(Model::Load(dir_, F32Options()).status());
  EXPECT_OK(Model::Load(dir_, F32Options(), nullptr,
                        StreamingExpertSourceFactory(StoreOptions(0.0, true)))
                .status());
}

TEST_F(K3VendorDamaged, ExpertTensorWithAWrongShapeIsNamed) {
  const std::string name = E(3, 5, "w2.weight");
  ASSERT_OK(testing::RewriteShardOf(dir_, name, [&](testing::EditableTensor& t) {
    if (t.name == name) t.shape = {16, 64};  // same bytes, not [latent, inter] = [32, 32]
  }));
  ExpectRefused(absl::StatusCode::kDataLoss, name);
}

TEST_F(K3VendorDamaged, ExpertMixingPackedAndPlainWeightsIsNamed) {
  // Expert 6 of layer 2 keeps w1.weight and w2.weight but its w3 becomes MXFP4 parts.
  const std::string plain = E(2, 6, "w3.weight");
  ASSERT_OK(testing::RewriteShardOf(dir_, plain, [&](testing::EditableTensor& t) {
    if (t.name != plain) return;
    t.name = E(2, 6, "w3.weight_packed");
    t.dtype = st::DType::kU8;
    t.shape = {32, 16};
    t.bytes.resize(32 * 16);
  }));
  ASSERT_OK(RenameInIndex(plain, E(2, 6, "w3.weight_packed")));
  ExpectRefused(absl::StatusCode::kDataLoss, E(2, 6, "w3.weight_packed"));
}

TEST_F(K3VendorDamaged, Bf16PlainExpertIsUnimplementedNamingIt) {
  const std::string name = E(5, 0, "w1.weight");
  ASSERT_OK(testing::RewriteShardOf(dir_, name, [&](testing::EditableTensor& t) {
    if (t.name != name) return;
    t.dtype = st::DType::kBF16;
    t.bytes.resize(t.bytes.size() / 2);
  }));
  ExpectRefused(absl::StatusCode::kUnimplemented, name);
}

TEST_F(K3VendorDamaged, DenseMatrixOfAnIntegerDtypeIsNamed) {
  const std::string name = "language_model.model.layers.1.self_attn.q_proj.weight";
  ASSERT_OK(testing::RewriteShardOf(dir_, name, [&](testing::EditableTensor& t) {
    if (t.name == name) t.dtype = st::DType::kI32;  // same bytes as F32
  }));
  absl::Status s = Model::Load(dir_, F32Options()).status();
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kDataLoss, HasSubstr(name)));
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kDataLoss, HasSubstr("I32")));
}

}  // namespace
}  // namespace coli::k3
