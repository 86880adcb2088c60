// The streaming expert store inside the Kimi K3 forward pass, on the tiny fixture
// (build/fixtures/k3_tiny, random weights): logits must be bit-identical to the model run with
// the plain PreadExpertSource for every store setting — O_DIRECT or buffered, pipelined or not,
// 1 slot per layer up to every expert cached, experts from disk or from the cache, chunked or
// token-at-a-time prefill — and with the shards split over two K3_DIRS folders. A shard
// truncated under a running model fails the request with a message naming it.
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "plugins/kimi_k3/expert_store.h"
#include "plugins/kimi_k3/model.h"
#include "plugins/kimi_k3/session.h"

namespace coli::k3 {
namespace {

namespace fs = std::filesystem;
using ::coli::testing::StatusIs;
using ::testing::HasSubstr;

std::string FixtureDir() {
  const char* bin = std::getenv("COLI_BINARY_DIR");
  return absl::StrCat(bin != nullptr ? bin : ".", "/fixtures/k3_tiny");
}

const std::vector<int32_t> kPrompt = {5, 17, 300, 45, 45, 211, 9, 400, 123, 77, 301, 88};
const std::vector<int32_t> kSteps = {42, 250, 7};

// Logits after the prompt and after each decode step, run twice in one session (the second
// pass finds the experts in the cache when the budget allows).
absl::StatusOr<std::vector<std::vector<float>>> RunLogits(const Model& model) {
  std::vector<std::vector<float>> out;
  std::unique_ptr<Session> session = model.NewSession();
  for (int pass = 0; pass < 2; ++pass) {
    session->Reset();
    COLI_ASSIGN_OR_RETURN(std::vector<float> logits, session->Prefill(kPrompt));
    out.push_back(std::move(logits));
    for (int32_t t : kSteps) {
      COLI_ASSIGN_OR_RETURN(logits, session->Step(t));
      out.push_back(std::move(logits));
    }
  }
  return out;
}

void ExpectBitIdentical(const std::vector<std::vector<float>>& a,
                        const std::vector<std::vector<float>>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_EQ(a[i].size(), b[i].size());
    EXPECT_EQ(std::memcmp(a[i].data(), b[i].data(), a[i].size() * sizeof(float)), 0)
        << "logits #" << i << " differ";
  }
}

class ExpertStoreModelTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!fs::exists(FixtureDir() + "/config.json")) {
      FAIL() << "tiny fixture missing (build target k3_tiny_fixture): " << FixtureDir();
    }
    tmp_ = fs::temp_directory_path() /
           absl::StrCat("coli_expert_store_model_", ::getpid(), "_",
                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(tmp_);
    fs::create_directories(tmp_);
  }
  void TearDown() override {
    if (!tmp_.empty()) fs::remove_all(tmp_);
  }
  static ExpertStoreOptions StoreOptions(double expert_gb, bool direct, bool pipe) {
    ExpertStoreOptions o;
    o.expert_gb = expert_gb;
    o.direct = direct;
    o.pipe = pipe;
    o.load_threads = 3;
    o.usage_path = "";
    return o;
  }
  std::string tmp_;
};

TEST_F(ExpertStoreModelTest, LogitsBitIdenticalToPreadForEverySetting) {
  for (int chunk : {32, 1}) {
    ModelOptions options;
    options.chunk = chunk;
    ASSERT_OK_AND_ASSIGN(auto reference_model, Model::Load(FixtureDir(), options));
    ASSERT_OK_AND_ASSIGN(auto reference, RunLogits(*reference_model));
    reference_model.reset();
    for (bool direct : {true, false}) {
      for (bool pipe : {true, false}) {
        // 0 GB = 1 slot per layer; 3 slots; every expert.
        for (double gb : {0.0, 3.5 * 9792 * 12 / 1e9, 1.0}) {
          SCOPED_TRACE(
              absl::StrCat("chunk=", chunk, " direct=", direct, " pipe=", pipe, " gb=", gb));
          StreamingExpertStore* store = nullptr;
          ASSERT_OK_AND_ASSIGN(
              auto model,
              Model::Load(FixtureDir(), options, nullptr,
                          StreamingExpertSourceFactory(StoreOptions(gb, direct, pipe), &store)));
          ASSERT_NE(store, nullptr);
          ASSERT_OK_AND_ASSIGN(auto logits, RunLogits(*model));
          ExpectBitIdentical(logits, reference);
          const ExpertStoreStats total = store->TotalStats();
          EXPECT_GT(total.misses, 0u);
          if (gb >= 1.0) {
            EXPECT_EQ(store->plan().slots_per_layer, store->layout().experts);
            EXPECT_GT(total.hits, 0u);  // the second pass is served from RAM
          } else if (gb == 0.0) {
            EXPECT_EQ(store->plan().slots_per_layer, 1);
          } else {
            EXPECT_EQ(store->plan().slots_per_layer, 3);
          }
        }
      }
    }
  }
}

// Split reads (whole experts, 2 pieces, more pieces than an expert has 4 KiB blocks) with one
// or four loaders, O_DIRECT or buffered, slots prefaulted at Open or allocated on first use,
// 1 slot per layer so every step reads: the logits do
// not depend on how an expert's bytes arrive. The model computes its latent down-projection and
// shared experts while the first misses load (ForEachExpertOverlapped); the plain pread source
// runs the same work before its walk, so equality also covers that overlap.
TEST_F(ExpertStoreModelTest, SplitReadsGiveIdenticalLogits) {
  ModelOptions options;
  options.chunk = 4;
  ASSERT_OK_AND_ASSIGN(auto reference_model, Model::Load(FixtureDir(), options));
  ASSERT_OK_AND_ASSIGN(auto reference, RunLogits(*reference_model));
  reference_model.reset();
  struct Setting {
    int pieces, threads;
    bool direct, prefault;
  };
  for (const Setting& t : {Setting{1, 4, true, false}, Setting{2, 1, true, true},
                           Setting{64, 4, true, true}, Setting{64, 4, false, false}}) {
    SCOPED_TRACE(absl::StrCat("pieces=", t.pieces, " threads=", t.threads, " direct=", t.direct,
                              " prefault=", t.prefault));
    ExpertStoreOptions store_options = StoreOptions(0, t.direct, true);
    store_options.read_pieces = t.pieces;
    store_options.prefault = t.prefault;
    store_options.load_threads = t.threads;
    StreamingExpertStore* store = nullptr;
    ASSERT_OK_AND_ASSIGN(auto model,
                         Model::Load(FixtureDir(), options, nullptr,
                                     StreamingExpertSourceFactory(store_options, &store)));
    ASSERT_OK_AND_ASSIGN(auto logits, RunLogits(*model));
    ExpectBitIdentical(logits, reference);
    const ExpertStoreStats total = store->TotalStats();
    EXPECT_GT(total.misses, 0u);
    if (t.pieces > 1) {
      EXPECT_GT(total.preads, total.misses);
    }
  }
}

TEST_F(ExpertStoreModelTest, ShardsInTwoDirectoriesGiveIdenticalLogits) {
  const std::string main_dir = tmp_ + "/drive1", second = tmp_ + "/drive2";
  fs::create_directories(main_dir);
  fs::create_directories(second);
  int moved = 0;
  for (const auto& entry : fs::directory_iterator(FixtureDir())) {
    const std::string name = entry.path().filename().string();
    const bool shard = name.ends_with(".safetensors");
    // Every other shard goes to the second drive.
    const bool to_second = shard && (name[10] - '0') % 2 == 1;
    fs::copy_file(entry.path(), (to_second ? second : main_dir) + "/" + name);
    moved += to_second;
  }
  ASSERT_GT(moved, 2);
  ModelOptions options;
  ASSERT_OK_AND_ASSIGN(auto reference_model, Model::Load(FixtureDir(), options));
  ASSERT_OK_AND_ASSIGN(auto reference, RunLogits(*reference_model));
  options.extra_dirs = {second};
  ASSERT_OK_AND_ASSIGN(auto model,
                       Model::Load(main_dir, options, nullptr,
                                   StreamingExpertSourceFactory(StoreOptions(0, true, true))));
  ASSERT_OK_AND_ASSIGN(auto logits, RunLogits(*model));
  ExpectBitIdentical(logits, reference);
}

TEST_F(ExpertStoreModelTest, TruncatedShardFailsTheRequestNotTheProcess) {
  const std::string dir = tmp_ + "/model";
  fs::create_directories(dir);
  for (const auto& entry : fs::directory_iterator(FixtureDir())) {
    fs::copy_file(entry.path(), dir + "/" + entry.path().filename().string());
  }
  StreamingExpertStore* store = nullptr;
  ASSERT_OK_AND_ASSIGN(
      auto model, Model::Load(dir, ModelOptions(), nullptr,
                              StreamingExpertSourceFactory(StoreOptions(0, true, true), &store)));
  ASSERT_OK(RunLogits(*model).status());
  // Decoder layer 5 lives in shard 6.
  std::string shard;
  for (const auto& entry : fs::directory_iterator(dir)) {
    if (entry.path().filename().string().starts_with("model-00006-of-")) shard = entry.path();
  }
  ASSERT_FALSE(shard.empty());
  fs::resize_file(shard, fs::file_size(shard) - 100000);
  std::unique_ptr<Session> session = model->NewSession();
  EXPECT_THAT(session->Prefill(kPrompt), StatusIs(absl::StatusCode::kDataLoss, HasSubstr(shard)));
  // The process and the store live on: the store still serves another layer's experts.
  ASSERT_OK(store->ForEachExpert(1, std::vector<int32_t>{0, 1, 2},
                                 [](int, const ExpertWeights&) { return absl::OkStatus(); }));
}

}  // namespace
}  // namespace coli::k3
