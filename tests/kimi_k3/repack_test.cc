// k3-repack and the repacked container (spec §4.4) on the tiny fixture (random weights).
//
// The reference for every container load is the engine loading the BF16 source with the same
// bits: quantization at load (kernels::QuantizedMatrix::FromBf16) is the independent path, and
// the container must reproduce its logits bit for bit. The int8 → int4 downcast is checked
// against kernels::QuantizedMatrix::DowncastInt8ToInt4 of the container's own int8 bytes.
#include "plugins/kimi_k3/repack.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "common/io/io.h"
#include "common/kernels/kernels.h"
#include "common/safetensors/safetensors.h"
#include "common/status/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "plugins/kimi_k3/container.h"
#include "plugins/kimi_k3/expert_store.h"
#include "plugins/kimi_k3/model.h"
#include "plugins/kimi_k3/session.h"
#include "tests/common/io/test_files.h"

namespace coli::k3 {
namespace {

namespace fs = std::filesystem;
using ::coli::testing::StatusIs;
using ::testing::HasSubstr;

const std::vector<int32_t> kPrompt = {5, 77, 300, 12, 9, 401, 42, 250, 3, 18, 64};
constexpr int kDecodeSteps = 3;

std::string TempDir(const std::string& tag) {
  const char* base = std::getenv("TMPDIR");
  std::string tmpl = std::string(base && *base ? base : "/tmp") + "/k3_repack_" + tag + "_XXXXXX";
  char* dir = ::mkdtemp(tmpl.data());
  EXPECT_NE(dir, nullptr);
  return tmpl;
}

bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Logits after the prompt, then after each decode step, concatenated. Greedy, or with
// `forced` the decode tokens are fixed (so two different models see the same inputs).
absl::StatusOr<std::vector<float>> RunLogits(const std::string& dir, const ModelOptions& o,
                                             bool forced = false) {
  COLI_ASSIGN_OR_RETURN(std::unique_ptr<Model> model, Model::Load(dir, o));
  auto s = model->NewSession();
  COLI_ASSIGN_OR_RETURN(std::vector<float> logits, s->Prefill(kPrompt));
  std::vector<float> all = logits;
  for (int i = 0; i < kDecodeSteps; ++i) {
    const int32_t next =
        forced
            ? 100 + 37 * i
            : static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
    COLI_ASSIGN_OR_RETURN(logits, s->Step(next));
    all.insert(all.end(), logits.begin(), logits.end());
  }
  return all;
}

ModelOptions Bits(int bits, bool set) {
  ModelOptions o;
  o.bits = bits;
  o.bits_set = set;
  o.load_threads = 2;
  return o;
}

absl::StatusOr<RepackSummary> RunRepack(const std::string& dst, int bits,
                                        std::vector<int> shards = {}, bool verify = false,
                                        int threads = 0) {
  RepackOptions o;
  o.bits = bits;
  o.threads = threads;
  o.shards = std::move(shards);
  o.verify_full = verify;
  return Repack(K3_TEST_TINY, dst, o);
}

std::vector<std::string> Shards(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string n = e.path().filename().string();
    if (n.ends_with(".safetensors")) out.push_back(n);
  }
  std::sort(out.begin(), out.end());
  return out;
}

absl::StatusOr<st::Header> ReadHeader(const std::string& path) {
  return st::ParseFileBytes(test_files::ReadRaw(path), path);
}

// The bytes of one tensor of a single shard file.
std::string TensorBytes(const std::string& path, const std::string& name) {
  const std::string file = test_files::ReadRaw(path);
  auto h = st::ParseFileBytes(file, path);
  EXPECT_TRUE(h.ok()) << h.status();
  for (const st::TensorInfo& t : h->tensors)
    if (t.name == name) return file.substr(t.file_offset, t.nbytes);
  ADD_FAILURE() << "no tensor " << name << " in " << path;
  return "";
}

// Rewrites shard `path` with tensor `name` replaced (dtype, shape, bytes).
void ReplaceTensor(const std::string& path, const std::string& name, st::DType dtype,
                   std::vector<int64_t> shape, std::string bytes) {
  const std::string file = test_files::ReadRaw(path);
  auto h = st::ParseFileBytes(file, path);
  ASSERT_OK(h.status());
  st::Writer w;
  for (const st::TensorInfo& t : h->tensors) {
    if (t.name == name) {
      ASSERT_OK(w.Add(t.name, dtype, shape, bytes));
    } else {
      ASSERT_OK(w.Add(t.name, t.dtype, t.shape, file.substr(t.file_offset, t.nbytes)));
    }
  }
  ASSERT_OK(w.Write(path));
}

void CopyDir(const std::string& from, const std::string& to) {
  fs::copy(from, to, fs::copy_options::recursive | fs::copy_options::overwrite_existing);
}

// The two containers every test shares (made once: ~1 s).
class RepackTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    int8_dir_ = new std::string(TempDir("int8"));
    int4_dir_ = new std::string(TempDir("int4"));
    ASSERT_OK(RunRepack(*int8_dir_, 8).status());
    ASSERT_OK(RunRepack(*int4_dir_, 4).status());
  }
  static void TearDownTestSuite() {
    fs::remove_all(*int8_dir_);
    fs::remove_all(*int4_dir_);
    delete int8_dir_;
    delete int4_dir_;
  }
  static std::string* int8_dir_;
  static std::string* int4_dir_;
};
std::string* RepackTest::int8_dir_ = nullptr;
std::string* RepackTest::int4_dir_ = nullptr;

// ---- Logits ---------------------------------------------------------------------------------

TEST_F(RepackTest, Int8ContainerLogitsBitIdenticalToLoadTimeInt8) {
  ASSERT_OK_AND_ASSIGN(std::vector<float> src, RunLogits(K3_TEST_TINY, Bits(8, true)));
  ASSERT_OK_AND_ASSIGN(std::vector<float> box, RunLogits(*int8_dir_, Bits(4, false)));
  EXPECT_TRUE(SameBits(src, box));
}

TEST_F(RepackTest, Int4ContainerLogitsBitIdenticalToLoadTimeInt4) {
  ASSERT_OK_AND_ASSIGN(std::vector<float> src, RunLogits(K3_TEST_TINY, Bits(4, true)));
  ASSERT_OK_AND_ASSIGN(std::vector<float> box, RunLogits(*int4_dir_, Bits(4, false)));
  EXPECT_TRUE(SameBits(src, box));
  // And the int8 container is a different model (the check above can fail).
  ASSERT_OK_AND_ASSIGN(std::vector<float> int8, RunLogits(*int8_dir_, Bits(4, false)));
  EXPECT_FALSE(SameBits(src, int8));
}

TEST_F(RepackTest, ExplicitMatchingBitsAreAccepted) {
  ASSERT_OK_AND_ASSIGN(std::vector<float> unset, RunLogits(*int8_dir_, Bits(4, false)));
  ASSERT_OK_AND_ASSIGN(std::vector<float> set, RunLogits(*int8_dir_, Bits(8, true)));
  EXPECT_TRUE(SameBits(unset, set));
}

TEST_F(RepackTest, ExplicitBits4OnInt8ContainerIsTheDowncast) {
  ModelOptions o8 = Bits(4, false), o4 = Bits(4, true);
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Model> m8, Model::Load(*int8_dir_, o8));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Model> m4, Model::Load(*int8_dir_, o4));
  const auto& a8 = m8->weights().layers[1].kda_w.q_proj;
  const auto& a4 = m4->weights().layers[1].kda_w.q_proj;
  ASSERT_EQ(a8.view().format, kernels::WeightFormat::kInt8Row);
  ASSERT_EQ(a4.view().format, kernels::WeightFormat::kInt4G64);
  ASSERT_OK_AND_ASSIGN(kernels::QuantizedMatrix want,
                       kernels::QuantizedMatrix::DowncastInt8ToInt4(a8.view()));
  EXPECT_EQ(a4.m.data(), want.data());
  EXPECT_EQ(a4.m.scales(), want.scales());
  // MLA (K3_MLA_BITS unset) stays int8.
  EXPECT_EQ(m4->weights().layers[3].mla_w.q_a_proj.view().format, kernels::WeightFormat::kInt8Row);

  // Close to quantizing the source to int4 directly, element by element: with W8 = W + e8
  // (|e8| <= s8/2) both are int4 roundings of nearly the same row group, so
  // |deq(downcast) - deq(direct)| <= max(s4_down, s4_direct) + s8/2.
  ASSERT_OK_AND_ASSIGN(auto src, st::Snapshot::Open(K3_TEST_TINY));
  ASSERT_OK_AND_ASSIGN(const st::TensorInfo* t,
                       src->Get("language_model.model.layers.1.self_attn.q_proj.weight"));
  std::vector<uint16_t> raw(t->numel());
  ASSERT_OK(src->Read(*t, raw.data()));
  const int64_t rows = a8.rows(), cols = a8.cols();
  ASSERT_OK_AND_ASSIGN(auto direct_m, kernels::QuantizedMatrix::FromBf16(
                                          raw.data(), rows, cols, kernels::WeightFormat::kInt4G64));
  const auto* s8 = static_cast<const float*>(a8.view().scales);
  const auto* s_down = static_cast<const float*>(a4.view().scales);
  const auto* s_direct = static_cast<const float*>(direct_m.view().scales);
  std::vector<float> rd(cols), rr(cols);
  int64_t differing = 0;
  for (int64_t r = 0; r < rows; ++r) {
    kernels::DequantizeRow(a4.view(), r, rd.data());
    kernels::DequantizeRow(direct_m.view(), r, rr.data());
    for (int64_t c = 0; c < cols; ++c) {
      const int64_t g = r * (cols / 64) + c / 64;
      const float bound = std::max(s_down[g], s_direct[g]) + s8[r] / 2;
      ASSERT_LE(std::fabs(rd[c] - rr[c]), bound * (1 + 1e-6f)) << "row " << r << " col " << c;
      differing += rd[c] != rr[c];
    }
  }
  EXPECT_GT(differing, 0);  // double quantization is not the identity here

  // Logits (forced decode tokens, so both models see the same inputs) against direct int4,
  // rel-L2. Measured on this fixture: 0.061 with K3_LAYERS=2 (tolerance 0.1); full depth 0.49
  // while direct int4 is itself 0.62 from f32 — the random fixture's AttnRes mix amplifies any
  // weight noise (spec §3.9 note), so at full depth the bound is int4's own error, x1.5.
  auto rel = [](const std::vector<float>& x, const std::vector<float>& y) {
    double num = 0, den = 0;
    for (size_t i = 0; i < x.size(); ++i) {
      num += (double{x[i]} - y[i]) * (double{x[i]} - y[i]);
      den += double{y[i]} * y[i];
    }
    return std::sqrt(num / den);
  };
  ModelOptions two = o4, direct_two = Bits(4, true);
  two.layers = direct_two.layers = 2;
  ASSERT_OK_AND_ASSIGN(std::vector<float> down2, RunLogits(*int8_dir_, two, true));
  ASSERT_OK_AND_ASSIGN(std::vector<float> direct2, RunLogits(K3_TEST_TINY, direct_two, true));
  EXPECT_LE(rel(down2, direct2), 0.1);
  EXPECT_FALSE(SameBits(down2, direct2));
  ModelOptions f32 = Bits(32, true);
  f32.mla_bits = f32.head_bits = 32;
  ASSERT_OK_AND_ASSIGN(std::vector<float> down, RunLogits(*int8_dir_, o4, true));
  ASSERT_OK_AND_ASSIGN(std::vector<float> direct, RunLogits(K3_TEST_TINY, Bits(4, true), true));
  ASSERT_OK_AND_ASSIGN(std::vector<float> exact, RunLogits(K3_TEST_TINY, f32, true));
  std::printf(
      "downcast vs direct int4 logits rel-L2: %.4g (2 layers), %.4g (all; direct vs f32 "
      "%.4g)\n",
      rel(down2, direct2), rel(down, direct), rel(direct, exact));
  EXPECT_LE(rel(down, direct), 1.5 * rel(direct, exact));
}

TEST_F(RepackTest, ExplicitMismatchIsRefused) {
  EXPECT_THAT(
      Model::Load(*int4_dir_, Bits(32, true)).status(),
      StatusIs(absl::StatusCode::kInvalidArgument,
               AllOf(HasSubstr("K3_BITS=32"), HasSubstr("holds int4g64"), HasSubstr("tensor '"))));
  EXPECT_THAT(Model::Load(*int4_dir_, Bits(8, true)).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("K3_BITS=8")));
  ModelOptions o = Bits(4, false);
  o.head_bits = 32;
  o.head_bits_set = true;
  EXPECT_THAT(Model::Load(*int8_dir_, o).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("lm_head.weight"), HasSubstr("K3_HEAD_BITS=32"))));
}

// ---- Container files -------------------------------------------------------------------------

TEST_F(RepackTest, ShardsAreValidSafetensorsWithoutHoles) {
  const std::vector<std::string> shards = Shards(*int8_dir_);
  // Source: 13 layers + globals + 2 vision shards; the vision ones are dropped.
  ASSERT_EQ(shards.size(), 14u);
  for (const std::string& name : shards) {
    const std::string path = *int8_dir_ + "/" + name;
    EXPECT_TRUE(fs::exists(std::string(K3_TEST_TINY) + "/" + name)) << name;
    ASSERT_OK_AND_ASSIGN(st::Header h, ReadHeader(path));
    EXPECT_EQ(h.data_offset % 8, 0u) << name;
    uint64_t end = h.data_offset;
    for (const st::TensorInfo& t : h.tensors) {  // sorted by offset
      EXPECT_EQ(t.file_offset, end) << name << ": hole or overlap before " << t.name;
      end = t.file_offset + t.nbytes;
      EXPECT_EQ(t.file_offset % st::DTypeSize(t.dtype), 0u) << t.name << " misaligned";
      EXPECT_FALSE(t.name.starts_with("vision_tower.") || t.name.starts_with("mm_projector."));
    }
    EXPECT_EQ(end, fs::file_size(path)) << name;
    // The header's JSON is padded with spaces only.
    const std::string file = test_files::ReadRaw(path);
    const std::string json = file.substr(8, h.header_bytes);
    EXPECT_EQ(json.find_last_not_of(' '), json.rfind('}'));
  }
  for (const char* f :
       {"config.json", "generation_config.json", "tokenizer_config.json", "tiktoken.model"})
    EXPECT_EQ(test_files::ReadRaw(*int8_dir_ + "/" + f),
              test_files::ReadRaw(std::string(K3_TEST_TINY) + "/" + f))
        << f;
}

TEST_F(RepackTest, ExpertsAreContiguousIdOrderedAndByteIdentical) {
  for (const std::string& name : Shards(*int8_dir_)) {
    const std::string path = *int8_dir_ + "/" + name;
    ASSERT_OK_AND_ASSIGN(st::Header h, ReadHeader(path));
    std::vector<const st::TensorInfo*> experts;
    for (const st::TensorInfo& t : h.tensors)
      if (t.name.find(".experts.") != std::string::npos) experts.push_back(&t);
    if (experts.empty()) continue;
    // Offsets order == (id, w1<w2<w3, packed<scale); the experts come after everything else.
    EXPECT_EQ(experts.front(), &h.tensors[h.tensors.size() - experts.size()]) << name;
    ASSERT_EQ(experts.size() % 6, 0u);
    const std::string tails[6] = {"w1.weight_packed", "w1.weight_scale",  "w2.weight_packed",
                                  "w2.weight_scale",  "w3.weight_packed", "w3.weight_scale"};
    for (size_t i = 0; i < experts.size(); ++i) {
      const std::string& n = experts[i]->name;
      const std::string want = ".experts." + std::to_string(i / 6) + "." + tails[i % 6];
      EXPECT_TRUE(n.ends_with(want)) << n << " at position " << i << ", want *" << want;
      EXPECT_EQ(TensorBytes(path, n), TensorBytes(std::string(K3_TEST_TINY) + "/" + name, n)) << n;
    }
  }
  // The engine sees every expert as one contiguous range (one pread).
  ASSERT_OK_AND_ASSIGN(auto snap, st::Snapshot::Open(*int8_dir_));
  int checked = 0;
  for (const std::string& n : snap->Names()) {
    if (!n.ends_with(".w1.weight_packed")) continue;
    const std::string base = n.substr(0, n.size() - std::string("w1.weight_packed").size());
    std::vector<const st::TensorInfo*> six;
    for (const char* t : {"w1.weight_packed", "w1.weight_scale", "w2.weight_packed",
                          "w2.weight_scale", "w3.weight_packed", "w3.weight_scale"}) {
      ASSERT_OK_AND_ASSIGN(const st::TensorInfo* info, snap->Get(base + t));
      six.push_back(info);
    }
    ASSERT_OK_AND_ASSIGN(auto range, snap->ContiguousRange(six));
    EXPECT_TRUE(range.has_value()) << base;
    ++checked;
  }
  EXPECT_EQ(checked, 12 * 16);
}

TEST_F(RepackTest, StreamingStoreReadsEachContainerExpertInOnePread) {
  // The plugin's expert source (the streaming store) on the id-ordered layout: every expert
  // one contiguous read, and the forward pass through it bit-identical to the pread source.
  ModelOptions o = Bits(4, false);
  ExpertStoreOptions so;
  so.expert_gb = 0.001;  // a few slots per layer: misses, so the reads actually happen
  so.direct = false;     // tmpfs may refuse O_DIRECT
  StreamingExpertStore* store = nullptr;
  ASSERT_OK_AND_ASSIGN(
      std::unique_ptr<Model> m,
      Model::Load(*int8_dir_, o, nullptr, StreamingExpertSourceFactory(so, &store)));
  ASSERT_NE(store, nullptr);
  EXPECT_EQ(store->contiguous_experts(), 12 * 16);
  auto s = m->NewSession();
  ASSERT_OK_AND_ASSIGN(std::vector<float> streamed, s->Prefill(kPrompt));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Model> p, Model::Load(*int8_dir_, o));
  ASSERT_OK_AND_ASSIGN(std::vector<float> preads, p->NewSession()->Prefill(kPrompt));
  EXPECT_TRUE(SameBits(streamed, preads));
}

TEST_F(RepackTest, QuantizedMatricesHaveSidecarsAndOthersPassThrough) {
  ASSERT_OK_AND_ASSIGN(auto box, st::Snapshot::Open(*int4_dir_));
  ASSERT_OK_AND_ASSIGN(auto src, st::Snapshot::Open(K3_TEST_TINY));
  const std::string P = "language_model.model.layers.";
  // KDA q_proj [128, 64] int4 (64 % 64 == 0); MLA kv_b (--mla-bits 8) int8; lm_head int8;
  // KDA o_proj [64, 128] int4; the router stays BF16.
  struct Case {
    std::string name;
    st::DType dtype;
    std::vector<int64_t> shape, qs;
  };
  for (const Case& c :
       std::vector<Case>{{P + "1.self_attn.q_proj.weight", st::DType::kU8, {128, 32}, {128, 1}},
                         {P + "1.self_attn.o_proj.weight", st::DType::kU8, {64, 64}, {64, 2}},
                         {P + "3.self_attn.kv_b_proj.weight", st::DType::kU8, {128, 64}, {128}},
                         {"language_model.lm_head.weight", st::DType::kU8, {768, 64}, {768}}}) {
    ASSERT_OK_AND_ASSIGN(const st::TensorInfo* t, box->Get(c.name));
    EXPECT_EQ(t->dtype, c.dtype) << c.name;
    EXPECT_EQ(t->shape, c.shape) << c.name;
    ASSERT_OK_AND_ASSIGN(const st::TensorInfo* qs, box->Get(ScaleSidecarName(c.name)));
    EXPECT_EQ(qs->dtype, st::DType::kF32);
    EXPECT_EQ(qs->shape, c.qs) << c.name;
  }
  for (const std::string& name :
       {P + "1.block_sparse_moe.gate.weight", P + "1.self_attn.f_a_proj.weight",
        P + "1.self_attn.A_log", std::string("language_model.model.embed_tokens.weight")}) {
    EXPECT_FALSE(box->Contains(ScaleSidecarName(name))) << name;
    ASSERT_OK_AND_ASSIGN(const st::TensorInfo* a, box->Get(name));
    ASSERT_OK_AND_ASSIGN(const st::TensorInfo* b, src->Get(name));
    EXPECT_EQ(a->dtype, b->dtype);
    std::string x(a->nbytes, '\0'), y(b->nbytes, '\0');
    ASSERT_OK(box->Read(*a, x.data()));
    ASSERT_OK(src->Read(*b, y.data()));
    EXPECT_EQ(x, y) << name;
  }
  // The stored int4 values are the engine's FromBf16 of the source.
  ASSERT_OK_AND_ASSIGN(const st::TensorInfo* b, src->Get(P + "1.self_attn.q_proj.weight"));
  std::vector<uint16_t> raw(b->numel());
  ASSERT_OK(src->Read(*b, raw.data()));
  ASSERT_OK_AND_ASSIGN(auto q, kernels::QuantizedMatrix::FromBf16(raw.data(), 128, 64,
                                                                  kernels::WeightFormat::kInt4G64));
  ASSERT_OK_AND_ASSIGN(const st::TensorInfo* d, box->Get(P + "1.self_attn.q_proj.weight"));
  kernels::QuantizedMatrix::Bytes stored(d->nbytes);
  ASSERT_OK(box->Read(*d, stored.data()));
  EXPECT_EQ(stored, q.data());
}

TEST_F(RepackTest, IndexListsEveryTensorOnceWithTotalSize) {
  const std::string text = test_files::ReadRaw(*int8_dir_ + "/model.safetensors.index.json");
  ASSERT_OK_AND_ASSIGN(st::Index index, st::ParseIndex(text, "index"));
  std::map<std::string, std::string> seen;
  uint64_t data = 0;
  for (const std::string& name : Shards(*int8_dir_)) {
    const std::string path = *int8_dir_ + "/" + name;
    ASSERT_OK_AND_ASSIGN(st::Header h, ReadHeader(path));
    data += fs::file_size(path) - h.data_offset;
    for (const st::TensorInfo& t : h.tensors) {
      EXPECT_TRUE(seen.emplace(t.name, name).second) << t.name;
    }
  }
  EXPECT_EQ(index.weight_map, seen);
  ASSERT_TRUE(index.total_size.has_value());
  EXPECT_EQ(*index.total_size, data);
}

// ---- Resume, --shards, index ------------------------------------------------------------------

TEST(RepackResumeTest, RerunRewritesOnlyTheMissingShard) {
  const std::string dir = TempDir("resume");
  ASSERT_OK(RunRepack(dir, 8).status());
  const std::vector<std::string> shards = Shards(dir);
  const std::string victim = shards[2];
  const std::string before = test_files::ReadRaw(dir + "/" + victim);
  std::map<std::string, std::pair<ino_t, timespec>> stat_of;
  for (const std::string& s : shards) {
    struct stat st;
    ASSERT_EQ(::stat((dir + "/" + s).c_str(), &st), 0);
    stat_of[s] = {st.st_ino, st.st_mtim};
  }
  const std::string index_before = test_files::ReadRaw(dir + "/model.safetensors.index.json");
  fs::remove(dir + "/" + victim);
  test_files::WriteRaw(dir + "/" + victim + ".tmp", "stale partial shard");
  ASSERT_OK_AND_ASSIGN(RepackSummary s, RunRepack(dir, 8));
  EXPECT_EQ(s.written, 1);
  EXPECT_EQ(s.existing, 13);
  EXPECT_EQ(test_files::ReadRaw(dir + "/" + victim), before);
  EXPECT_FALSE(fs::exists(dir + "/" + victim + ".tmp"));
  for (const std::string& sh : shards) {
    if (sh == victim) continue;
    struct stat st;
    ASSERT_EQ(::stat((dir + "/" + sh).c_str(), &st), 0);
    EXPECT_EQ(st.st_ino, stat_of[sh].first) << sh;
    EXPECT_EQ(st.st_mtim.tv_sec, stat_of[sh].second.tv_sec) << sh;
    EXPECT_EQ(st.st_mtim.tv_nsec, stat_of[sh].second.tv_nsec) << sh;
  }
  EXPECT_EQ(test_files::ReadRaw(dir + "/model.safetensors.index.json"), index_before);
  fs::remove_all(dir);
}

TEST(RepackResumeTest, DisjointShardPassesGiveTheOnePassIndex) {
  const std::string one = TempDir("onepass"), two = TempDir("twopass");
  ASSERT_OK(RunRepack(one, 4).status());
  std::vector<int> odd, even;
  for (int k = 1; k <= 16; ++k) (k % 2 ? odd : even).push_back(k);
  ASSERT_OK_AND_ASSIGN(RepackSummary a, RunRepack(two, 4, odd));
  EXPECT_EQ(a.index_shards, 7);  // 1, 3, …, 13 (15 is vision)
  ASSERT_OK_AND_ASSIGN(
      st::Index partial,
      st::ParseIndex(test_files::ReadRaw(two + "/model.safetensors.index.json"), "partial"));
  ASSERT_OK_AND_ASSIGN(RepackSummary b, RunRepack(two, 4, even));
  EXPECT_EQ(b.index_shards, 14);
  EXPECT_EQ(test_files::ReadRaw(one + "/model.safetensors.index.json"),
            test_files::ReadRaw(two + "/model.safetensors.index.json"));
  ASSERT_OK_AND_ASSIGN(
      st::Index full,
      st::ParseIndex(test_files::ReadRaw(two + "/model.safetensors.index.json"), "full"));
  EXPECT_GT(*full.total_size, *partial.total_size);  // covers the first pass's data too
  for (const std::string& s : Shards(one))
    EXPECT_EQ(test_files::ReadRaw(one + "/" + s), test_files::ReadRaw(two + "/" + s));
  // A shard number the source does not have is an error, not a silent no-op.
  EXPECT_THAT(RunRepack(two, 4, {99}).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--shards 99")));
  fs::remove_all(one);
  fs::remove_all(two);
}

// The pipeline's knobs change only timing: one thread with nothing overlapping (in_flight 1)
// is the reference; small pieces cut every matrix into many row blocks (4 KiB = 32 rows of the
// 64-column matrices), so pieces of one tensor wrap around the ring of slots many times.
TEST(RepackResumeTest, BytesDoNotDependOnThreadsPiecesOrBlocksInFlight) {
  struct Variant {
    int threads, in_flight;
    uint64_t piece_bytes;
    bool direct;
  };
  const Variant reference{1, 1, uint64_t{32} << 20, false};
  const Variant variants[] = {{7, 3, uint64_t{32} << 20, true},
                              {3, 2, 4096, true},
                              {2, 5, 1000, false},  // less than some rows: one row per piece
                              {1, 3, 6000, true}};
  auto run = [](const Variant& v, int bits, const std::string& dir) {
    RepackOptions o;
    o.bits = bits;
    o.threads = v.threads;
    o.in_flight = v.in_flight;
    o.piece_bytes = v.piece_bytes;
    o.direct = v.direct;
    return Repack(K3_TEST_TINY, dir, o).status();
  };
  for (int bits : {4, 8}) {
    const std::string ref = TempDir("ref");
    ASSERT_OK(run(reference, bits, ref));
    const std::vector<std::string> shards = Shards(ref);
    ASSERT_EQ(shards.size(), 14u);
    for (const Variant& v : variants) {
      const std::string dir = TempDir("variant");
      ASSERT_OK(run(v, bits, dir));
      ASSERT_EQ(shards, Shards(dir));
      for (const std::string& s : shards) {
        EXPECT_EQ(test_files::ReadRaw(ref + "/" + s), test_files::ReadRaw(dir + "/" + s))
            << s << " bits " << bits << " threads " << v.threads << " in_flight " << v.in_flight
            << " piece " << v.piece_bytes;
      }
      fs::remove_all(dir);
    }
    fs::remove_all(ref);
  }
  RepackOptions bad;
  bad.in_flight = 0;
  const std::string bad_dir = TempDir("bad");
  EXPECT_THAT(Repack(K3_TEST_TINY, bad_dir, bad).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--in-flight 0")));
  fs::remove_all(bad_dir);
}

TEST(RepackResumeTest, DuplicateTensorNameAbortsTheIndexUpdate) {
  const std::string dir = TempDir("dup");
  ASSERT_OK(RunRepack(dir, 8).status());
  const std::string index = dir + "/model.safetensors.index.json";
  const std::string before = test_files::ReadRaw(index);
  const std::vector<std::string> shards = Shards(dir);
  fs::copy_file(dir + "/" + shards[1], dir + "/model-00099-of-000016.safetensors");
  EXPECT_THAT(RebuildIndex(dir).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       AllOf(HasSubstr("is in both"), HasSubstr(shards[1]),
                             HasSubstr("model-00099-of-000016.safetensors"),
                             HasSubstr("index was not updated"))));
  EXPECT_THAT(RunRepack(dir, 8).status(), StatusIs(absl::StatusCode::kFailedPrecondition));
  EXPECT_EQ(test_files::ReadRaw(index), before);
  fs::remove_all(dir);
}

// Resuming into a folder whose shards were made with other bits, from a source file that has
// changed since, or by something else must not mix them into one container: the run stops
// before writing anything and names the shard and what differs.
TEST(RepackResumeTest, ResumeRefusesShardsOfAnotherSourceOrOtherBits) {
  const std::string src = TempDir("prov_src"), dst = TempDir("prov_dst");
  CopyDir(K3_TEST_TINY, src);
  RepackOptions o;
  o.shards = {1, 2, 3};
  ASSERT_OK(Repack(src, dst, o).status());
  const std::string first = dst + "/model-00001-of-000016.safetensors";
  const std::string first_bytes = test_files::ReadRaw(first);
  const std::string index = test_files::ReadRaw(dst + "/model.safetensors.index.json");
  auto outputs_unchanged = [&] {
    EXPECT_EQ(Shards(dst).size(), 3u);
    EXPECT_EQ(test_files::ReadRaw(first), first_bytes);
    EXPECT_EQ(test_files::ReadRaw(dst + "/model.safetensors.index.json"), index);
  };
  RepackOptions int4;
  int4.bits = 4;
  EXPECT_THAT(Repack(src, dst, int4).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       AllOf(HasSubstr("model-00001-of-000016.safetensors"),
                             HasSubstr("bits 8 then, 4 now"), HasSubstr("remove it"))));
  outputs_unchanged();
  RepackOptions head4;
  head4.head_bits = 4;
  EXPECT_THAT(Repack(src, dst, head4).status(), StatusIs(absl::StatusCode::kFailedPrecondition,
                                                         HasSubstr("head_bits 8 then, 4 now")));
  outputs_unchanged();

  // The snapshot is updated between runs: same tensor names, shapes and offsets, other values.
  const std::string changed = src + "/model-00002-of-000016.safetensors";
  const std::string name = "language_model.model.layers.1.self_attn.q_proj.weight";
  ASSERT_OK_AND_ASSIGN(st::Header header, ReadHeader(changed));
  std::string bytes = test_files::ReadRaw(changed);
  for (const st::TensorInfo& t : header.tensors)
    if (t.name == name) bytes[t.file_offset + 3] ^= 0x01;
  ASSERT_NE(bytes, test_files::ReadRaw(changed));
  test_files::WriteRaw(changed, bytes);
  EXPECT_THAT(Repack(src, dst, RepackOptions{}).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       AllOf(HasSubstr("model-00002-of-000016.safetensors"),
                             HasSubstr("another source file"), HasSubstr("source_mtime_ns"))));
  outputs_unchanged();
  // A source shard deleted after its conversion (to free disk) only has its bits checked.
  fs::remove(changed);
  fs::remove(src + "/model-00001-of-000016.safetensors");
  ASSERT_OK_AND_ASSIGN(RepackSummary s, Repack(src, dst, RepackOptions{}));
  EXPECT_EQ(s.existing, 1);  // shard 3; 1 has no source now but its output is kept
  EXPECT_EQ(s.missing_source, 2);
  EXPECT_EQ(test_files::ReadRaw(first), first_bytes);
  EXPECT_THAT(Repack(src, dst, int4).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("bits 8 then, 4 now")));

  // A shard another tool wrote (here: a BF16 source shard) and a file the source does not list.
  const std::string foreign = TempDir("prov_foreign");
  fs::copy_file(std::string(K3_TEST_TINY) + "/model-00004-of-000016.safetensors",
                foreign + "/model-00004-of-000016.safetensors");
  EXPECT_THAT(Repack(K3_TEST_TINY, foreign, RepackOptions{}).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       AllOf(HasSubstr("model-00004-of-000016.safetensors"),
                             HasSubstr("not written by this k3-repack"))));
  EXPECT_EQ(Shards(foreign).size(), 1u);
  fs::remove(foreign + "/model-00004-of-000016.safetensors");
  fs::copy_file(first, foreign + "/adapter.safetensors");
  EXPECT_THAT(Repack(K3_TEST_TINY, foreign, RepackOptions{}).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       AllOf(HasSubstr("adapter.safetensors"), HasSubstr("not a shard of"))));
  EXPECT_EQ(Shards(foreign).size(), 1u);
  fs::remove_all(foreign);
  fs::remove_all(src);
  fs::remove_all(dst);
}

// Two runs into one folder would share every `<shard>.tmp`. A second run is refused while the
// first holds the folder's lock; a holder killed with SIGKILL leaves nothing that blocks.
TEST(RepackResumeTest, SecondRunIntoTheSameFolderIsRefused) {
  const std::string dst = TempDir("lock");
  const int fd = ::open((dst + "/.k3-repack.lock").c_str(), O_RDWR | O_CREAT, 0644);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::flock(fd, LOCK_EX), 0);  // what a running k3-repack holds
  EXPECT_THAT(RunRepack(dst, 8).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       AllOf(HasSubstr("another k3-repack is writing into"), HasSubstr(dst))));
  EXPECT_TRUE(Shards(dst).empty());
  EXPECT_FALSE(fs::exists(dst + "/config.json"));
  ::close(fd);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    const int cfd = ::open((dst + "/.k3-repack.lock").c_str(), O_RDWR);
    if (cfd < 0 || ::flock(cfd, LOCK_EX) != 0) ::_exit(1);
    for (;;) ::pause();
  }
  for (int i = 0; i < 500; ++i) {  // until the child holds it
    const int probe = ::open((dst + "/.k3-repack.lock").c_str(), O_RDWR);
    const bool held = ::flock(probe, LOCK_EX | LOCK_NB) != 0;
    ::close(probe);
    if (held) break;
    ::usleep(10000);
  }
  EXPECT_THAT(RunRepack(dst, 8).status(), StatusIs(absl::StatusCode::kFailedPrecondition));
  ::kill(child, SIGKILL);
  ::waitpid(child, nullptr, 0);
  ASSERT_OK_AND_ASSIGN(RepackSummary s, RunRepack(dst, 8));
  EXPECT_EQ(s.written, 14);
  fs::remove_all(dst);
}

// A folder repacked in part (the run was stopped, or --shards) has a valid index of what is
// there; loading it says the repack is unfinished rather than only naming a missing tensor.
TEST(RepackResumeTest, LoadingAnUnfinishedRepackSaysSo) {
  const std::string dir = TempDir("unfinished");
  ASSERT_OK(RunRepack(dir, 8, {1, 2}).status());
  EXPECT_THAT(
      Model::Load(dir, Bits(8, false)).status(),
      StatusIs(absl::StatusCode::kNotFound, AllOf(HasSubstr("is not in the snapshot"),
                                                  HasSubstr("the repack has not finished"))));
  ASSERT_OK(RunRepack(dir, 8).status());
  EXPECT_OK(Model::Load(dir, Bits(8, false)).status());
  // A source snapshot missing a tensor gets no such hint.
  const std::string src = TempDir("unfinished_src");
  CopyDir(K3_TEST_TINY, src);
  fs::remove(src + "/model-00003-of-000016.safetensors");
  EXPECT_THAT(Model::Load(src, Bits(8, true)).status(),
              StatusIs(absl::StatusCode::kNotFound, ::testing::Not(HasSubstr("has not finished"))));
  fs::remove_all(src);
  fs::remove_all(dir);
}

// ---- --verify-full (the tool) -----------------------------------------------------------------

int RunTool(const std::string& args, std::string* err) {
  const std::string cmd = std::string(K3_REPACK_BIN) + " " + args + " 2>&1";
  FILE* p = ::popen(cmd.c_str(), "r");
  if (p == nullptr) return -1;
  char buf[4096];
  for (size_t n; (n = std::fread(buf, 1, sizeof(buf), p)) > 0;) err->append(buf, n);
  const int rc = ::pclose(p);
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

TEST(RepackToolTest, VerifyFullNamesTheFlippedExpertByte) {
  const std::string dir = TempDir("verify");
  std::string out;
  ASSERT_EQ(RunTool(std::string(K3_TEST_TINY) + " " + dir + " --bits 8 --verify-full", &out), 0)
      << out;
  EXPECT_THAT(out, HasSubstr("verified"));
  const std::string shard = dir + "/" + Shards(dir)[4];
  ASSERT_OK_AND_ASSIGN(st::Header h, ReadHeader(shard));
  const st::TensorInfo* victim = nullptr;
  for (const st::TensorInfo& t : h.tensors)
    if (t.name.ends_with(".experts.5.w2.weight_packed")) victim = &t;
  ASSERT_NE(victim, nullptr);
  std::string bytes = test_files::ReadRaw(shard);
  bytes[victim->file_offset + 17] ^= 0x10;
  test_files::WriteRaw(shard, bytes);
  out.clear();
  EXPECT_NE(RunTool(std::string(K3_TEST_TINY) + " " + dir + " --verify-full", &out), 0);
  EXPECT_THAT(out, HasSubstr("tensor '" + victim->name + "': byte 17"));
  // Without --verify-full the resumed run does not read it.
  out.clear();
  EXPECT_EQ(RunTool(std::string(K3_TEST_TINY) + " " + dir, &out), 0) << out;
  out.clear();
  EXPECT_EQ(RunTool("only-one-folder", &out), 2);
  out.clear();
  EXPECT_EQ(RunTool(std::string(K3_TEST_TINY) + " " + dir + " --bits 3", &out), 1);
  EXPECT_THAT(out, HasSubstr("--bits 3: use 4 or 8"));
  fs::remove_all(dir);
}

// Each output tensor carries the CRC-32 of its bytes (st::kChecksumKey), so `--check` finds a
// damaged container without the source: before, only --verify-full against the source could,
// and users delete the 1.5 TB source once the container is made.
TEST(RepackToolTest, CheckFindsAFlippedByteWithoutTheSource) {
  const std::string dir = TempDir("check");
  std::string out;
  ASSERT_EQ(RunTool(std::string(K3_TEST_TINY) + " " + dir + " --bits 4", &out), 0) << out;
  const std::vector<std::string> shards = Shards(dir);
  out.clear();
  ASSERT_EQ(RunTool("--check " + dir + " --threads 2", &out), 0) << out;
  EXPECT_THAT(out, HasSubstr(std::to_string(shards.size()) + " shard(s) intact"));
  for (const std::string& shard : shards) {
    ASSERT_OK_AND_ASSIGN(st::Header h, ReadHeader(dir + "/" + shard));
    EXPECT_EQ(h.metadata.count(std::string(st::kChecksumKey)), 1u) << shard;
  }

  const std::string shard = dir + "/" + shards[4];
  ASSERT_OK_AND_ASSIGN(st::Header h, ReadHeader(shard));
  for (const char* suffix : {".experts.5.w2.weight_packed", ".self_attn.q_proj.weight.qs"}) {
    const st::TensorInfo* victim = nullptr;
    for (const st::TensorInfo& t : h.tensors)
      if (t.name.ends_with(suffix)) victim = &t;
    ASSERT_NE(victim, nullptr) << suffix;
    const std::string intact = test_files::ReadRaw(shard);
    std::string bytes = intact;
    bytes[victim->file_offset + victim->nbytes / 2] ^= 0x01;
    test_files::WriteRaw(shard, bytes);
    out.clear();
    EXPECT_EQ(RunTool("--check " + dir, &out), 1) << out;
    EXPECT_THAT(out, AllOf(HasSubstr(shards[4]), HasSubstr("tensor '" + victim->name + "'"),
                           HasSubstr("changed after they were written")));
    test_files::WriteRaw(shard, intact);
  }

  // A shard without checksums (another tool's) is not passed as checked.
  fs::copy_file(std::string(K3_TEST_TINY) + "/" + shards[0], dir + "/model-00099-of-000099.safetensors");
  out.clear();
  EXPECT_EQ(RunTool("--check " + dir, &out), 1) << out;
  EXPECT_THAT(out, AllOf(HasSubstr("1 shard(s) have no checksums"),
                         HasSubstr("model-00099-of-000099.safetensors")));
  out.clear();
  EXPECT_EQ(RunTool("--check " + dir + " " + dir, &out), 2);
  EXPECT_THAT(out, HasSubstr("--check needs one container folder"));
  fs::remove_all(dir);
}

// --verify-full quantizes the source's matrices again and compares the U8 data and the sidecar
// byte for byte (a flipped byte in either gives a silently different model at load).
TEST_F(RepackTest, VerifyFullNamesAFlippedByteInAQuantizedMatrixOrItsSidecar) {
  const std::string shard = "model-00002-of-000016.safetensors";
  const std::string source = std::string(K3_TEST_TINY) + "/" + shard;
  const std::string matrix = "language_model.model.layers.1.self_attn.q_proj.weight";
  for (const std::string* dir : {int8_dir_, int4_dir_}) {
    const std::string copy = TempDir("verifyq") + "/" + shard;
    const std::string original = test_files::ReadRaw(*dir + "/" + shard);
    EXPECT_OK(VerifyShard(source, *dir + "/" + shard));
    ASSERT_OK_AND_ASSIGN(st::Header h, ReadHeader(*dir + "/" + shard));
    for (const std::string& name : {matrix, ScaleSidecarName(matrix)}) {
      const st::TensorInfo* victim = nullptr;
      for (const st::TensorInfo& t : h.tensors)
        if (t.name == name) victim = &t;
      ASSERT_NE(victim, nullptr) << name;
      std::string bytes = original;
      bytes[victim->file_offset + 13] ^= 0x01;
      test_files::WriteRaw(copy, bytes);
      EXPECT_THAT(VerifyShard(source, copy),
                  StatusIs(absl::StatusCode::kDataLoss,
                           AllOf(HasSubstr("tensor '" + name + "': byte 13 of"),
                                 HasSubstr("quantized again"))))
          << *dir;
    }
    fs::remove_all(fs::path(copy).parent_path());
  }
}

// ---- K3_MMAP --------------------------------------------------------------------------------

TEST_F(RepackTest, MmapLogitsBitIdenticalAndFileBacked) {
  ModelOptions plain = Bits(4, false), mapped = Bits(4, false);
  mapped.mmap = true;
  ASSERT_OK_AND_ASSIGN(std::vector<float> a, RunLogits(*int4_dir_, plain));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Model> m, Model::Load(*int4_dir_, mapped));
  EXPECT_GT(m->weights().mapped_bytes, 0u);
  EXPECT_TRUE(m->weights().layers[1].kda_w.q_proj.mapped.has_value());
  EXPECT_TRUE(m->weights().lm_head.mapped.has_value());
  // The shards are file mappings in this process, not anonymous memory.
  const std::string smaps = test_files::ReadRaw("/proc/self/smaps");
  int shards_mapped = 0;
  for (const std::string& s : Shards(*int4_dir_))
    if (smaps.find(fs::canonical(*int4_dir_ + "/" + s).string()) != std::string::npos ||
        smaps.find(*int4_dir_ + "/" + s) != std::string::npos)
      ++shards_mapped;
  EXPECT_GE(shards_mapped, 13);  // every layer shard + the globals (head)
  m.reset();
  ASSERT_OK_AND_ASSIGN(std::vector<float> b, RunLogits(*int4_dir_, mapped));
  EXPECT_TRUE(SameBits(a, b));
}

// A mapped shard truncated after load used to kill the process with SIGBUS at the next pass
// (coli serve then answered 503 for good); one written in place fed other bytes to the matmuls.
// Now the next pass fails with DATA_LOSS naming the shard, and so does every later one.
TEST_F(RepackTest, MmapShardChangedAfterLoadFailsThePassNamingIt) {
  ModelOptions mapped = Bits(4, false);
  mapped.mmap = true;
  for (const bool truncate : {true, false}) {
    const std::string dir = TempDir(truncate ? "mmap_truncated" : "mmap_rewritten");
    CopyDir(*int4_dir_, dir);
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<Model> model, Model::Load(dir, mapped));
    auto session = model->NewSession();
    ASSERT_OK(session->Prefill(kPrompt).status());
    const std::string shard = dir + "/model-00003-of-000016.safetensors";
    if (truncate) {
      fs::resize_file(shard, 1000);
    } else {  // the same bytes written again in place (cp over it, rsync --inplace)
      const std::string bytes = test_files::ReadRaw(shard);
      std::ofstream(shard, std::ios::binary | std::ios::in | std::ios::out) << bytes;
      fs::last_write_time(shard, fs::last_write_time(shard) + std::chrono::seconds(1));
    }
    const char* change = truncate ? "changed size while running" : "was modified while running";
    EXPECT_THAT(session->Step(100).status(),
                StatusIs(absl::StatusCode::kDataLoss, AllOf(HasSubstr(shard), HasSubstr(change))));
    auto fresh = model->NewSession();
    EXPECT_THAT(fresh->Prefill(kPrompt).status(),
                StatusIs(absl::StatusCode::kDataLoss, HasSubstr(change)));
    model.reset();
    fs::remove_all(dir);
  }
}

TEST_F(RepackTest, MmapRefusesWhatNeedsConversion) {
  ModelOptions o = Bits(4, false);
  o.mmap = true;
  EXPECT_THAT(
      Model::Load(K3_TEST_TINY, o).status(),
      StatusIs(absl::StatusCode::kFailedPrecondition,
               AllOf(HasSubstr("K3_MMAP=1"), HasSubstr("BF16 matrix"), HasSubstr("tensor '"))));
  o.vulkan = true;
  EXPECT_THAT(Model::Load(*int4_dir_, o).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       AllOf(HasSubstr("K3_MMAP=1"), HasSubstr("COLI_VULKAN=1"))));
  o.vulkan = false;
  o.bits_set = true;  // K3_BITS=4 on the int8 container: a downcast
  EXPECT_THAT(Model::Load(*int8_dir_, o).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       AllOf(HasSubstr("K3_MMAP=1"), HasSubstr("downcast"))));
}

TEST_F(RepackTest, MmapRefusesAMisalignedSidecar) {
  // A hand-made container whose sidecar starts at an odd offset: the tool never writes one.
  const std::string dir = TempDir("misaligned");
  CopyDir(*int8_dir_, dir);
  const std::string shard = dir + "/" + Shards(dir)[1];
  const std::string file = test_files::ReadRaw(shard);
  ASSERT_OK_AND_ASSIGN(st::Header h, st::ParseFileBytes(file, shard));
  st::Writer w;
  ASSERT_OK(w.Add("odd", st::DType::kU8, {1}, "x"));  // shifts everything after it by one byte
  for (const st::TensorInfo& t : h.tensors)
    ASSERT_OK(w.Add(t.name, t.dtype, t.shape, file.substr(t.file_offset, t.nbytes)));
  ASSERT_OK(w.Write(shard));
  ASSERT_OK(RebuildIndex(dir).status());
  ModelOptions o = Bits(4, false);
  o.mmap = true;
  EXPECT_THAT(Model::Load(dir, o).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("not 4-byte aligned")));
  o.mmap = false;  // copied into the heap it loads fine
  EXPECT_OK(Model::Load(dir, o).status());
  fs::remove_all(dir);
}

// ---- Bad input --------------------------------------------------------------------------------

TEST(RepackBadInputTest, TruncatedSourceShard) {
  const std::string src = TempDir("trunc_src"), dst = TempDir("trunc_dst");
  CopyDir(K3_TEST_TINY, src);
  const std::string shard = src + "/model-00003-of-000016.safetensors";
  fs::resize_file(shard, fs::file_size(shard) - 100);
  RepackOptions o;
  EXPECT_THAT(Repack(src, dst, o).status(),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("model-00003-of-000016")));
  EXPECT_FALSE(fs::exists(dst + "/model-00003-of-000016.safetensors"));
  EXPECT_FALSE(fs::exists(dst + "/model-00003-of-000016.safetensors.tmp"));
  fs::remove_all(src);
  fs::remove_all(dst);
}

// Threads of this process (the pipeline's reader and writer must be gone after an error).
int ThreadCount() {
  int n = 0;
  for ([[maybe_unused]] const auto& e : fs::directory_iterator("/proc/self/task")) ++n;
  return n;
}

// The largest tensor of `shard` that starts past the first quarter of the file.
st::TensorInfo LargestLaterTensor(const std::string& shard) {
  auto h = ReadHeader(shard);
  EXPECT_TRUE(h.ok()) << h.status();
  st::TensorInfo best;
  best.nbytes = 0;
  for (const st::TensorInfo& t : h->tensors) {
    if (t.file_offset > fs::file_size(shard) / 4 && t.nbytes > best.nbytes) best = t;
  }
  return best;
}

// The source shrinks after its header was checked (another process truncating it, a network
// filesystem losing it): the reader hits the end in the middle of a later tensor (a matrix to
// quantize, cut into 4 KiB pieces) while earlier pieces are being quantized and written. The
// error names the file and the tensor, no output or .tmp is left, the pipeline's threads are
// joined, and a rerun on the repaired source completes. With O_DIRECT and buffered reads.
TEST(RepackBadInputTest, SourceTruncatedInALaterTensorStopsThePipeline) {
  const std::string src = TempDir("midtrunc_src"), warm = TempDir("midtrunc_warm");
  CopyDir(K3_TEST_TINY, src);
  const std::string name = "model-00003-of-000016.safetensors";
  const std::string shard = src + "/" + name;
  const std::string intact = test_files::ReadRaw(shard);
  const st::TensorInfo later = LargestLaterTensor(shard);
  ASSERT_GT(later.nbytes, 16384u) << later.name;  // at least 4 pieces
  ASSERT_EQ(later.dtype, st::DType::kBF16) << later.name;
  {  // Warm up (anything a first run starts for good exists before the count).
    RepackOptions o;
    o.shards = {1};
    ASSERT_OK(Repack(src, warm, o).status());
  }
  for (bool direct : {true, false}) {
    const std::string dst = TempDir("midtrunc_dst");
    RepackOptions o;
    o.shards = {3};
    o.direct = direct;
    o.piece_bytes = 4096;  // many pieces in flight before the cut
    bool cut = false;
    o.progress = [&](std::string_view line) {
      if (line.find(name) != line.npos && line.find("reading") != line.npos) {
        fs::resize_file(shard, later.file_offset + later.nbytes / 2);
        cut = true;
      }
    };
    const int threads_before = ThreadCount();
    EXPECT_THAT(Repack(src, dst, o).status(),
                StatusIs(absl::StatusCode::kDataLoss,
                         AllOf(HasSubstr(name), HasSubstr("tensor '" + later.name + "'"))))
        << "direct " << direct;
    EXPECT_TRUE(cut);
    EXPECT_EQ(ThreadCount(), threads_before);
    EXPECT_FALSE(fs::exists(dst + "/" + name));
    EXPECT_FALSE(fs::exists(dst + "/" + name + ".tmp"));
    test_files::WriteRaw(shard, intact);
    o.progress = nullptr;
    ASSERT_OK(Repack(src, dst, o).status());
    EXPECT_TRUE(fs::exists(dst + "/" + name));
    fs::remove_all(dst);
  }
  fs::remove_all(src);
  fs::remove_all(warm);
}

// A write fails in the middle of a shard (the disk fills up; here RLIMIT_FSIZE makes every
// write past half the shard fail with EFBIG): the writer's error stops the reader and the
// quantizer, names the output file and the tensor being written, and no partial output stays.
TEST(RepackBadInputTest, WriteFailureInTheMiddleOfAShardLeavesNoOutput) {
  const std::string ok_dir = TempDir("wfail_ok"), dst = TempDir("wfail_dst");
  const std::string name = "model-00003-of-000016.safetensors";
  RepackOptions o;
  o.shards = {3};
  o.piece_bytes = 4096;
  ASSERT_OK(Repack(K3_TEST_TINY, ok_dir, o).status());
  const uint64_t size = fs::file_size(ok_dir + "/" + name);
  struct rlimit old_limit;
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &old_limit), 0);
  const auto old_handler = std::signal(SIGXFSZ, SIG_IGN);  // EFBIG instead of the signal
  struct rlimit limit = old_limit;
  limit.rlim_cur = size / 2;
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &limit), 0);
  const int threads_before = ThreadCount();
  const absl::Status status = Repack(K3_TEST_TINY, dst, o).status();
  const int threads_after = ThreadCount();
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &old_limit), 0);
  std::signal(SIGXFSZ, old_handler);
  EXPECT_THAT(status, StatusIs(absl::StatusCode::kInternal,
                               AllOf(HasSubstr(name + ".tmp"), HasSubstr("cannot write"),
                                     HasSubstr("tensor '"))));
  EXPECT_EQ(threads_after, threads_before);
  EXPECT_FALSE(fs::exists(dst + "/" + name));
  EXPECT_FALSE(fs::exists(dst + "/" + name + ".tmp"));
  fs::remove_all(ok_dir);
  fs::remove_all(dst);
}

TEST(RepackBadInputTest, WrongDtypeAndMissingConfigAndMissingShard) {
  const std::string src = TempDir("dtype_src"), dst = TempDir("dtype_dst");
  CopyDir(K3_TEST_TINY, src);
  const std::string name = "language_model.model.layers.1.self_attn.k_proj.weight";
  ReplaceTensor(src + "/model-00002-of-000016.safetensors", name, st::DType::kF32, {128, 64},
                std::string(128 * 64 * 4, '\0'));
  RepackOptions o;
  EXPECT_THAT(Repack(src, dst, o).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr(name), HasSubstr("expected a BF16 matrix"),
                             HasSubstr("F32 [128, 64]"))));
  // A missing source shard is skipped and the others convert, but the container would not load
  // without it: the run ends with an error naming it (index rebuilt, converted shards kept).
  fs::remove(src + "/model-00002-of-000016.safetensors");
  EXPECT_THAT(Repack(src, dst, o).status(),
              StatusIs(absl::StatusCode::kNotFound,
                       AllOf(HasSubstr("'model-00002-of-000016.safetensors'"),
                             HasSubstr("are missing"), HasSubstr("13 converted shards are kept"))));
  EXPECT_EQ(Shards(dst).size(), 13u);
  ASSERT_OK_AND_ASSIGN(
      st::Index partial,
      st::ParseIndex(test_files::ReadRaw(dst + "/model.safetensors.index.json"), "partial"));
  EXPECT_EQ(partial.shards.size(), 13u);
  // Missing vision-only shards (a download without them) are fine.
  fs::copy_file(std::string(K3_TEST_TINY) + "/model-00002-of-000016.safetensors",
                src + "/model-00002-of-000016.safetensors");
  fs::remove(src + "/model-00015-of-000016.safetensors");
  fs::remove(src + "/model-00016-of-000016.safetensors");
  ASSERT_OK_AND_ASSIGN(RepackSummary s, Repack(src, dst, o));
  EXPECT_EQ(s.missing_source, 2);
  EXPECT_EQ(s.written, 1);
  EXPECT_EQ(s.existing, 13);
  // A header whose tensor name was corrupted still parses: the source index must list it.
  const std::string renamed = src + "/model-00004-of-000016.safetensors";
  std::string bytes = test_files::ReadRaw(renamed);
  const size_t at = bytes.find("language_model.model.layers.3.");
  ASSERT_NE(at, std::string::npos);
  bytes[at + 19] ^= 0x04;  // "model" -> "modeh"
  test_files::WriteRaw(renamed, bytes);
  fs::remove(dst + "/model-00004-of-000016.safetensors");
  EXPECT_THAT(
      Repack(src, dst, o).status(),
      StatusIs(absl::StatusCode::kDataLoss, AllOf(HasSubstr("language_model.modeh.layers.3."),
                                                  HasSubstr("model-00004-of-000016.safetensors"),
                                                  HasSubstr("is not listed as in it"))));
  EXPECT_FALSE(fs::exists(dst + "/model-00004-of-000016.safetensors"));
  // A missing config is an error.
  fs::remove(src + "/config.json");
  const std::string noconfig = TempDir("noconfig");
  EXPECT_THAT(Repack(src, noconfig, o).status(),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("config.json")));
  fs::remove_all(src);
  fs::remove_all(dst);
  fs::remove_all(noconfig);
}

TEST_F(RepackTest, BadContainerMatricesAreRefusedByName) {
  const std::string P = "language_model.model.layers.1.self_attn.";
  {  // A sidecar with the wrong element count.
    const std::string dir = TempDir("badqs");
    CopyDir(*int8_dir_, dir);
    ReplaceTensor(dir + "/model-00002-of-000016.safetensors", P + "v_proj.weight.qs",
                  st::DType::kF32, {127}, std::string(127 * 4, '\0'));
    EXPECT_THAT(Model::Load(dir, Bits(4, false)).status(),
                StatusIs(absl::StatusCode::kDataLoss,
                         AllOf(HasSubstr(P + "v_proj.weight"), HasSubstr("127 scales"))));
    fs::remove_all(dir);
  }
  {  // A U8 matrix of the wrong size.
    const std::string dir = TempDir("badu8");
    CopyDir(*int8_dir_, dir);
    ReplaceTensor(dir + "/model-00002-of-000016.safetensors", P + "g_proj.weight", st::DType::kU8,
                  {128, 63}, std::string(128 * 63, '\0'));
    EXPECT_THAT(Model::Load(dir, Bits(4, false)).status(),
                StatusIs(absl::StatusCode::kDataLoss,
                         AllOf(HasSubstr(P + "g_proj.weight"), HasSubstr("fit neither"))));
    fs::remove_all(dir);
  }
  {  // A non-F32 sidecar.
    const std::string dir = TempDir("bf16qs");
    CopyDir(*int8_dir_, dir);
    ReplaceTensor(dir + "/model-00002-of-000016.safetensors", P + "q_proj.weight.qs",
                  st::DType::kBF16, {128}, std::string(128 * 2, '\0'));
    EXPECT_THAT(Model::Load(dir, Bits(4, false)).status(),
                StatusIs(absl::StatusCode::kDataLoss, HasSubstr("must be F32")));
    fs::remove_all(dir);
  }
  {  // A container expert of the wrong size (the expert source size-checks every expert).
    const std::string dir = TempDir("badexpert");
    CopyDir(*int8_dir_, dir);
    const std::string e =
        "language_model.model.layers.1.block_sparse_moe.experts.2.w3.weight_scale";
    ASSERT_OK_AND_ASSIGN(st::Header h, ReadHeader(dir + "/model-00002-of-000016.safetensors"));
    std::vector<int64_t> shape;
    for (const st::TensorInfo& t : h.tensors)
      if (t.name == e) shape = t.shape;
    ASSERT_EQ(shape.size(), 2u);
    shape[1] -= 1;
    ReplaceTensor(dir + "/model-00002-of-000016.safetensors", e, st::DType::kU8, shape,
                  std::string(shape[0] * shape[1], '\0'));
    EXPECT_THAT(Model::Load(dir, Bits(4, false)).status(),
                StatusIs(absl::StatusCode::kDataLoss, HasSubstr(e)));
    fs::remove_all(dir);
  }
}

}  // namespace
}  // namespace coli::k3
