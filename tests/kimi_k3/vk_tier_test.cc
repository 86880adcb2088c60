// The Vulkan expert tier of Kimi K3 (plugins/kimi_k3/vk_tier.h, common/vk ExpertChain,
// shaders/situ_glu.comp), on lavapipe here and in CI; every test skips only when the machine has
// no Vulkan device at all (VulkanContext::Create says UNAVAILABLE).
//
// References are independent of the device code: the SiTU-GLU formula of spec §3.0 in double,
// the CPU's exact-float expert (common/kernels Matmul with idot off = K3_IDOT=0, common/ops
// SituGlu), and the CPU-only model run (PreadExpertSource) on the tiny fixture
// (build/fixtures/k3_tiny, random weights).
#include "plugins/kimi_k3/vk_tier.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/kernels/kernels.h"
#include "common/ops/ops.h"
#include "common/safetensors/safetensors.h"
#include "common/status/status_matchers.h"
#include "common/vk/vulkan_context.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "plugins/kimi_k3/config.h"
#include "plugins/kimi_k3/expert_source.h"
#include "plugins/kimi_k3/expert_store.h"
#include "plugins/kimi_k3/expert_store_usage.h"
#include "plugins/kimi_k3/model.h"
#include "plugins/kimi_k3/session.h"
#include "tests/common/vk/require_vulkan.h"
#include "tests/kimi_k3/reference_util.h"
#include "tests/kimi_k3/vk_test_util.h"

namespace coli::k3 {
namespace {

namespace fs = std::filesystem;
using ::coli::testing::IsOk;
using ::coli::testing::StatusIs;
using ::testing::HasSubstr;

// SiTU-GLU: |gpu − ref| ≤ kSituRel·|ref| + kSituAbs per element (ref in double). The absolute
// term covers results in the f32 subnormal range (σ(g) for g ≲ −87), where relative accuracy
// is not representable in f32 at all.
constexpr double kSituRel = 1e-6;
constexpr double kSituAbs = 1e-37;
// Device expert chain vs the CPU exact-float expert: rel-L2 per (row) output vector.
constexpr double kChainRelL2 = 1e-6;
// Whole-model logits with some experts on the device vs the CPU run (K3_IDOT=0): the device's
// experts differ from the CPU's only in f32 summation order (≈1e-7 relative per expert output);
// over 12 MoE layers of random weights the logits moved by at most 6.4e-7 rel-L2 on lavapipe
// (docs/status/vulkan.md); the bound leaves ~8x room.
constexpr double kLogitsRelL2 = 5e-6;

using vk_testing::ExactOptions;
using vk_testing::FixtureDir;
using vk_testing::Greedy;
using vk_testing::GreedyRun;
using vk_testing::HaveVulkan;

using ::coli::k3::testing::RelL2;  // tests/kimi_k3/reference_util.h

// Spec §3.0: SiTU(g, u) = β1·tanh(g/β1)·σ(g) · β2·tanh(u/β2), in double.
double SituReference(double g, double u, double b1, double b2) {
  return b1 * std::tanh(g / b1) * (1.0 / (1.0 + std::exp(-g))) * b2 * std::tanh(u / b2);
}

TEST(K3VkSituGlu, MatchesSpecFormula) {
  COLI_VK_CONTEXT_OR_SKIP(vk);
  std::mt19937 rng(7);
  std::vector<float> g, u;
  // Typical activations, tiny ones (the tanh series branch), the branch edge, saturating ones
  // (|g/β1|, |u/β2| far past tanh's f32 range), zeros and signed zeros.
  std::normal_distribution<float> normal(0.0f, 3.0f);
  for (int i = 0; i < 4096; ++i) {
    g.push_back(normal(rng));
    u.push_back(normal(rng) * 10.0f);
  }
  const float specials[] = {0.0f,  -0.0f,  1e-6f,  -1e-6f,  1e-3f, -0.2f,  1.19f, 1.21f,
                            -1.2f, 7.49f,  7.51f,  -7.5f,   30.0f, -30.0f, 40.0f, -40.0f,
                            90.0f, -90.0f, 250.0f, -250.0f, 1e4f,  -1e4f,  3e38f, -3e38f};
  for (float a : specials)
    for (float b : specials) {
      g.push_back(a);
      u.push_back(b);
    }
  const int64_t n = static_cast<int64_t>(g.size());
  for (const auto& [b1, b2] : {std::pair{4.0f, 25.0f}, std::pair{1.0f, 2.0f}}) {
    std::vector<float> out(n, -1.0f);
    ASSERT_THAT(vk->SituGlu(g.data(), u.data(), n, b1, b2, out.data()), IsOk());
    double worst = 0, cpu_worst = 0;
    std::vector<float> cpu(n);
    ops::SituGlu(g.data(), u.data(), n, b1, b2, cpu.data());
    for (int64_t i = 0; i < n; ++i) {
      const double ref = SituReference(g[i], u[i], b1, b2);
      const double err = std::fabs(out[i] - ref);
      ASSERT_LE(err, kSituRel * std::fabs(ref) + kSituAbs)
          << "g=" << g[i] << " u=" << u[i] << " beta " << b1 << "/" << b2 << ": gpu " << out[i]
          << " ref " << ref;
      if (std::fabs(ref) > 1e-30) {
        worst = std::max(worst, err / std::fabs(ref));
        cpu_worst = std::max(cpu_worst, std::fabs(cpu[i] - ref) / std::fabs(ref));
      }
    }
    std::printf("[situ beta %g/%g] max rel err: device %.3g, CPU ops::SituGlu %.3g (n=%lld)\n", b1,
                b2, worst, cpu_worst, static_cast<long long>(n));
  }
  // In place (out aliases g) and refusals.
  std::vector<float> gi = g, ref(n);
  ASSERT_THAT(vk->SituGlu(g.data(), u.data(), n, 4.0f, 25.0f, ref.data()), IsOk());
  ASSERT_THAT(vk->SituGlu(gi.data(), u.data(), n, 4.0f, 25.0f, gi.data()), IsOk());
  EXPECT_EQ(std::memcmp(gi.data(), ref.data(), n * sizeof(float)), 0);
  EXPECT_THAT(vk->SituGlu(g.data(), u.data(), -1, 4.0f, 25.0f, gi.data()),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(vk->SituGlu(nullptr, u.data(), 3, 4.0f, 25.0f, gi.data()),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(vk->SituGlu(nullptr, nullptr, 0, 4.0f, 25.0f, nullptr), IsOk());
}

// The fixture's expert bytes as the checkpoint stores them (six tensors back to back).
struct ExpertBytes {
  std::vector<uint8_t> bytes;
  ExpertWeights views;
};

absl::StatusOr<ExpertBytes> ReadExpert(st::Snapshot& snapshot, const Config& cfg, int layer,
                                       int expert) {
  ExpertBytes out;
  COLI_ASSIGN_OR_RETURN(ExpertStoreLayout layout, DiscoverExpertLayout(&snapshot));
  const auto names = ExpertTensorNames(layout.prefix, layer, expert);
  std::array<const st::TensorInfo*, 6> infos{};
  uint64_t total = 0;
  for (int t = 0; t < 6; ++t) {
    COLI_ASSIGN_OR_RETURN(infos[t], snapshot.Get(names[t]));
    total += infos[t]->nbytes;
  }
  out.bytes.resize(total);
  std::array<const uint8_t*, 6> parts{};
  uint64_t offset = 0;
  for (int t = 0; t < 6; ++t) {
    COLI_RETURN_IF_ERROR(snapshot.Read(*infos[t], out.bytes.data() + offset));
    parts[t] = out.bytes.data() + offset;
    offset += infos[t]->nbytes;
  }
  out.views = ExpertViews(cfg, parts);
  return out;
}

class K3VkTierFixtureTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!fs::exists(FixtureDir() + "/config.json")) {
      FAIL() << "tiny fixture missing (build target k3_tiny_fixture): " << FixtureDir();
    }
    tmp_ = fs::temp_directory_path() /
           absl::StrCat("coli_vk_tier_", ::getpid(), "_",
                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(tmp_);
    fs::create_directories(tmp_);
  }
  void TearDown() override {
    if (!tmp_.empty()) fs::remove_all(tmp_);
  }
  std::string tmp_;
};

TEST_F(K3VkTierFixtureTest, ExpertChainMatchesCpuFloatExpert) {
  COLI_VK_CONTEXT_OR_SKIP(vk);
  ASSERT_OK_AND_ASSIGN(Config cfg, Config::LoadDir(FixtureDir()));
  ASSERT_OK_AND_ASSIGN(auto snapshot, st::Snapshot::Open(FixtureDir()));
  const int64_t H = cfg.moe.latent, I = cfg.moe.intermediate;
  // Several experts of two layers, each with its own number of rows (as a MoE step's pairs).
  struct Case {
    int layer, expert, rows;
  };
  const Case cases[] = {{1, 0, 1}, {1, 5, 3}, {1, 15, 7}, {6, 2, 2}, {12, 9, 11}, {6, 3, 1}};
  std::vector<ExpertBytes> experts;
  std::vector<std::unique_ptr<vulkan::DeviceMxfp4Matrix>> resident;
  std::vector<std::vector<float>> x, y, ref;
  std::vector<vulkan::ExpertChainJob> jobs;
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (const Case& c : cases) {
    ASSERT_OK_AND_ASSIGN(ExpertBytes e, ReadExpert(*snapshot, cfg, c.layer, c.expert));
    experts.push_back(std::move(e));
  }
  for (size_t j = 0; j < std::size(cases); ++j) {
    const ExpertWeights& w = experts[j].views;
    for (const kernels::MatrixView* m : {&w.w1, &w.w3, &w.w2}) {
      ASSERT_OK_AND_ASSIGN(auto dm, vk->UploadMxfp4(*m));
      resident.push_back(std::move(dm));
    }
    const int rows = cases[j].rows;
    x.emplace_back(rows * H);
    for (float& v : x.back()) v = normal(rng) * 2.0f;
    y.emplace_back(rows * H, 0.0f);
    // CPU exact-float expert (K3_IDOT=0): gate, up, SiTU-GLU, down.
    std::vector<float> g(rows * I), u(rows * I);
    ref.emplace_back(rows * H);
    const kernels::MatmulOptions exact{.idot = false, .threads = 1};
    ASSERT_THAT(kernels::Matmul(w.w1, x.back().data(), rows, g.data(), exact), IsOk());
    ASSERT_THAT(kernels::Matmul(w.w3, x.back().data(), rows, u.data(), exact), IsOk());
    ops::SituGlu(g.data(), u.data(), rows * I, cfg.situ_beta, cfg.situ_linear_beta, g.data());
    ASSERT_THAT(kernels::Matmul(w.w2, g.data(), rows, ref.back().data(), exact), IsOk());
  }
  for (size_t j = 0; j < std::size(cases); ++j) {
    jobs.push_back({resident[3 * j].get(), resident[3 * j + 1].get(), resident[3 * j + 2].get(),
                    x[j].data(), cases[j].rows, y[j].data()});
  }
  const uint64_t before = vk->matmuls();
  ASSERT_THAT(vk->ExpertChain(jobs, cfg.situ_beta, cfg.situ_linear_beta), IsOk());
  EXPECT_EQ(vk->matmuls() - before, 3 * std::size(cases));
  double worst = 0;
  for (size_t j = 0; j < std::size(cases); ++j) {
    for (int r = 0; r < cases[j].rows; ++r) {
      const double e = RelL2(y[j].data() + r * H, ref[j].data() + r * H, H);
      EXPECT_LE(e, kChainRelL2) << "layer " << cases[j].layer << " expert " << cases[j].expert
                                << " row " << r;
      worst = std::max(worst, e);
    }
  }
  std::printf("[chain] %zu experts, worst per-pair rel-L2 vs CPU float expert %.3g\n",
              std::size(cases), worst);

  // Refusals: mismatched shapes (gate in the down slot), negative rows, null output; an empty
  // chain and zero-row jobs do nothing.
  std::vector<vulkan::ExpertChainJob> bad = {jobs[0]};
  bad[0].down = resident[0].get();
  EXPECT_THAT(vk->ExpertChain(bad, 4, 25),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("GLU block")));
  bad = {jobs[0]};
  bad[0].rows = -1;
  EXPECT_THAT(vk->ExpertChain(bad, 4, 25), StatusIs(absl::StatusCode::kInvalidArgument));
  bad = {jobs[0]};
  bad[0].y = nullptr;
  EXPECT_THAT(vk->ExpertChain(bad, 4, 25), StatusIs(absl::StatusCode::kInvalidArgument));
  bad = {jobs[0]};
  bad[0].rows = 0;
  bad[0].y = nullptr;
  EXPECT_THAT(vk->ExpertChain(bad, 4, 25), IsOk());
  EXPECT_THAT(vk->ExpertChain({}, 4, 25), IsOk());
}

// ---- whole model ------------------------------------------------------------------------------

class K3VkTierModelTest : public K3VkTierFixtureTest {
 protected:
  void SetUp() override {
    K3VkTierFixtureTest::SetUp();
    if (IsSkipped()) return;
    if (!HaveVulkan()) {
      COLI_SKIP_UNLESS_VULKAN_REQUIRED() << "no Vulkan device";
    }
    ASSERT_OK_AND_ASSIGN(cfg_, Config::LoadDir(FixtureDir()));
    PreadExpertSource* pread = nullptr;
    ASSERT_OK_AND_ASSIGN(auto model,
                         Model::Load(FixtureDir(), ExactOptions(), nullptr, CountingPread(&pread)));
    ASSERT_OK_AND_ASSIGN(cpu_, Greedy(*model));
    cpu_bytes_read_ = pread->bytes_read();
  }

  // PreadExpertSource, handing out the pointer for its read counter.
  static Model::ExpertSourceFactory CountingPread(PreadExpertSource** out) {
    return [out](st::Snapshot& snapshot, const Config& cfg, const std::string& prefix,
                 int layers) -> absl::StatusOr<std::unique_ptr<ExpertSource>> {
      COLI_ASSIGN_OR_RETURN(auto source, PreadExpertSource::Create(snapshot, cfg, prefix, layers));
      *out = source.get();
      return std::unique_ptr<ExpertSource>(std::move(source));
    };
  }

  double ExpertGb(double experts) const {
    const double I = cfg_.moe.intermediate, H = cfg_.moe.latent;
    return (experts + 0.5) * 3 * (I * H / 2 + I * H / 32 * 4) / 1e9;
  }
  uint64_t ExpertFileBytes() const {
    const uint64_t I = cfg_.moe.intermediate, H = cfg_.moe.latent;
    return 3 * (I * H / 2 + I * H / 32);
  }

  // Same greedy tokens; logits within kLogitsRelL2 (or bit-identical when `exact`).
  void ExpectMatchesCpu(const GreedyRun& run, bool exact) {
    EXPECT_EQ(run.tokens, cpu_.tokens);
    ASSERT_EQ(run.logits.size(), cpu_.logits.size());
    double worst = 0;
    for (size_t i = 0; i < run.logits.size(); ++i) {
      const auto& a = run.logits[i];
      const auto& b = cpu_.logits[i];
      ASSERT_EQ(a.size(), b.size());
      if (exact) {
        EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0)
            << "logits #" << i << " differ";
      }
      worst = std::max(worst, RelL2(a.data(), b.data(), static_cast<int64_t>(a.size())));
    }
    EXPECT_LE(worst, kLogitsRelL2);
    std::printf("[model] worst logits rel-L2 vs the CPU run: %.3g\n", worst);
  }

  // A usage history in tmp_ whose one used expert is expert 3 of the first MoE layer (the one
  // warm expert of a tier); the MoE decoder layers and the history's path go to the outputs.
  void WriteOneWarmExpertHistory(std::vector<int>* layers, std::string* path) {
    for (int i = 0; i < cfg_.num_layers; ++i)
      if (!cfg_.is_dense(i)) layers->push_back(i);
    UsageHistory history(*layers, cfg_.moe.num_experts);
    history.Record(0, 3, 10);
    *path = tmp_ + "/.coli_usage";
    ASSERT_THAT(history.Save(*path), IsOk());
  }

  Config cfg_;
  GreedyRun cpu_;
  uint64_t cpu_bytes_read_ = 0;
};

TEST_F(K3VkTierModelTest, BudgetZeroIsBitIdenticalToCpu) {
  VkTierOptions o;
  o.budget_gb = 0;
  o.usage_path = "";
  VkExpertTier* tier = nullptr;
  ASSERT_OK_AND_ASSIGN(auto model, Model::Load(FixtureDir(), ExactOptions(), nullptr,
                                               VkTierFactory(o, nullptr, &tier)));
  ASSERT_NE(tier, nullptr);
  ASSERT_OK_AND_ASSIGN(GreedyRun run, Greedy(*model));
  ExpectMatchesCpu(run, /*exact=*/true);
  const VkTierStats s = tier->Stats();
  EXPECT_EQ(s.slots, 0u);
  EXPECT_EQ(s.matmuls, 0u);
  EXPECT_EQ(s.hits, 0u);
  EXPECT_EQ(s.resident, 0u);
}

// Warm start: the resident set is the history's hottest experts; with no promotions (rate 0)
// the device takes exactly those, and the wrapped source reads exactly their bytes less.
TEST_F(K3VkTierModelTest, WarmStartFromHistoryTakesTheHottestAndSkipsTheirReads) {
  std::vector<int> layers;
  for (int i = 0; i < cfg_.num_layers; ++i)
    if (!cfg_.is_dense(i)) layers.push_back(i);
  const int E = cfg_.moe.num_experts;
  UsageHistory history(layers, E);
  std::vector<std::pair<uint64_t, int>> heat;  // (count, index)
  for (size_t l = 0; l < layers.size(); ++l)
    for (int e = 0; e < E; ++e) {
      const uint64_t count = (l * 37 + e * 11) % 23;  // ties included (→ lower index first)
      if (count > 0) history.Record(static_cast<int>(l), e, count);
      heat.push_back({count, static_cast<int>(l * E + e)});
    }
  const std::string path = tmp_ + "/.coli_usage";
  ASSERT_THAT(history.Save(path), IsOk());
  const int slots = 40;
  std::stable_sort(heat.begin(), heat.end(),
                   [](const auto& a, const auto& b) { return a.first > b.first; });
  std::map<int, std::vector<int32_t>> expected;
  for (int k = 0; k < slots; ++k)
    expected[layers[heat[k].second / E]].push_back(heat[k].second % E);

  VkTierOptions o;
  o.budget_gb = ExpertGb(slots);
  o.rate = 0;
  o.usage_path = path;
  VkExpertTier* tier = nullptr;
  ASSERT_OK_AND_ASSIGN(auto model, Model::Load(FixtureDir(), ExactOptions(), nullptr,
                                               VkTierFactory(o, nullptr, &tier)));
  for (int layer : layers) {
    std::vector<int32_t> want = expected[layer];
    std::sort(want.begin(), want.end());
    EXPECT_EQ(tier->ResidentExperts(layer), want) << "layer " << layer;
  }
  ASSERT_OK_AND_ASSIGN(GreedyRun run, Greedy(*model));
  ExpectMatchesCpu(run, /*exact=*/false);
  const VkTierStats s = tier->Stats();
  EXPECT_EQ(s.warm, static_cast<uint64_t>(slots));
  EXPECT_EQ(s.resident, static_cast<uint64_t>(slots));
  EXPECT_EQ(s.bytes, slots * tier->expert_device_bytes());
  EXPECT_GT(s.hits, 0u);
  EXPECT_EQ(s.matmuls, 3 * s.hits);
  EXPECT_EQ(s.promotions, 0u);
  EXPECT_EQ(s.evictions, 0u);
  auto* pread = dynamic_cast<PreadExpertSource*>(&tier->inner());
  ASSERT_NE(pread, nullptr);
  EXPECT_EQ(cpu_bytes_read_ - pread->bytes_read(), s.hits * ExpertFileBytes());
  std::printf("[warm] %llu device hits, expert bytes read %llu → %llu\n",
              static_cast<unsigned long long>(s.hits),
              static_cast<unsigned long long>(cpu_bytes_read_),
              static_cast<unsigned long long>(pread->bytes_read()));
}

// Over the streaming store, experts the device takes still count in the store's usage history:
// the history after a tier run equals the one after a CPU-only store run, expert by expert.
TEST_F(K3VkTierModelTest, DeviceExpertsStillCountInTheStoreHistory) {
  auto store_options = [] {
    ExpertStoreOptions o;
    o.expert_gb = 1;
    o.load_threads = 2;
    o.usage_path = "";  // counted in RAM, compared below, never written
    o.pin = false;
    return o;
  };
  StreamingExpertStore* cpu_store = nullptr;
  ASSERT_OK_AND_ASSIGN(auto cpu_model,
                       Model::Load(FixtureDir(), ExactOptions(), nullptr,
                                   StreamingExpertSourceFactory(store_options(), &cpu_store)));
  ASSERT_OK_AND_ASSIGN(GreedyRun cpu_run, Greedy(*cpu_model));
  // Warm start (deterministic residency, no promotions) from the CPU run's own history.
  const std::string path = tmp_ + "/.coli_usage";
  ASSERT_THAT(cpu_store->usage().Save(path), IsOk());
  VkTierOptions o;
  o.budget_gb = ExpertGb(50);
  o.rate = 0;
  o.usage_path = path;
  StreamingExpertStore* store = nullptr;
  VkExpertTier* tier = nullptr;
  ASSERT_OK_AND_ASSIGN(
      auto model,
      Model::Load(FixtureDir(), ExactOptions(), nullptr,
                  VkTierFactory(o, StreamingExpertSourceFactory(store_options(), &store), &tier)));
  ASSERT_OK_AND_ASSIGN(GreedyRun run, Greedy(*model));
  EXPECT_EQ(run.tokens, cpu_run.tokens);
  EXPECT_GT(tier->Stats().hits, 0u);
  EXPECT_EQ(store->TotalStats().misses + store->TotalStats().hits + tier->Stats().hits,
            cpu_store->TotalStats().misses + cpu_store->TotalStats().hits);
  const UsageHistory& a = store->usage();
  const UsageHistory& b = cpu_store->usage();
  ASSERT_EQ(a.layers(), b.layers());
  EXPECT_EQ(a.total(), b.total());
  for (size_t l = 0; l < a.layers().size(); ++l)
    for (int e = 0; e < a.experts(); ++e)
      EXPECT_EQ(a.count(static_cast<int>(l), e), b.count(static_cast<int>(l), e))
          << "layer " << a.layers()[l] << " expert " << e;
}

// No history, a budget for some experts: the CPU's experts are promoted (rate per pass), then
// hotter ones displace the coldest; tokens stay the CPU run's.
TEST_F(K3VkTierModelTest, PromotionsAndEvictionsKeepTheCpuTokens) {
  for (const auto& [slots, rate] : {std::pair{6, 2}, std::pair{60, 8}}) {
    SCOPED_TRACE(absl::StrCat("slots ", slots, " rate ", rate));
    VkTierOptions o;
    o.budget_gb = ExpertGb(slots);
    o.rate = rate;
    o.usage_path = "";
    VkExpertTier* tier = nullptr;
    ASSERT_OK_AND_ASSIGN(auto model, Model::Load(FixtureDir(), ExactOptions(), nullptr,
                                                 VkTierFactory(o, nullptr, &tier)));
    EXPECT_EQ(tier->Stats().resident, 0u);
    std::vector<uint64_t> resident_after;
    ASSERT_OK_AND_ASSIGN(GreedyRun run, Greedy(*model, [&] {
                           tier->WaitForUploads();
                           resident_after.push_back(tier->Stats().resident);
                         }));
    tier->WaitForUploads();
    ExpectMatchesCpu(run, /*exact=*/false);
    const VkTierStats s = tier->Stats();
    EXPECT_EQ(s.slots, static_cast<uint64_t>(slots));
    EXPECT_EQ(s.resident, static_cast<uint64_t>(slots));
    EXPECT_GE(s.promotions, static_cast<uint64_t>(slots));
    EXPECT_EQ(s.promotions - s.evictions, s.resident);
    EXPECT_GT(s.hits, 0u);
    // Promotions per pass never exceed the rate: after the prefill's 3 passes at most 3·rate.
    ASSERT_FALSE(resident_after.empty());
    EXPECT_LE(resident_after[0], static_cast<uint64_t>(3 * rate));
    if (slots == 6) {
      EXPECT_GT(s.evictions, 0u);
    }
    std::printf("[promote] %s\n", VkTierReport(s).c_str());
  }
}

// K3_IDOT=1, the default: whatever is resident — experts promoted and evicted between passes,
// a second conversation finding them resident — the logits are the CPU run's bit for bit, and
// so are the tokens (the device runs the CPU's integer-dot expert, VulkanContext::ExpertChain
// with MatmulNumerics::kIdot). With the f32 chain the logits moved with residency.
TEST_F(K3VkTierModelTest, IdotTierGivesTheCpuBitsWhateverIsResident) {
  ModelOptions options;
  ASSERT_TRUE(options.idot);  // the default
  options.chunk = 4;
  ASSERT_OK_AND_ASSIGN(auto cpu_model, Model::Load(FixtureDir(), options));
  ASSERT_OK_AND_ASSIGN(GreedyRun cpu, Greedy(*cpu_model));
  for (const auto& [slots, rate] : {std::pair{60, 8}, std::pair{6, 2}}) {
    SCOPED_TRACE(absl::StrCat("slots ", slots, " rate ", rate));
    VkTierOptions o;
    o.budget_gb = ExpertGb(slots);
    o.rate = rate;
    o.usage_path = "";
    VkExpertTier* tier = nullptr;
    ASSERT_OK_AND_ASSIGN(
        auto model, Model::Load(FixtureDir(), options, nullptr, VkTierFactory(o, nullptr, &tier)));
    if (!tier->context().supports_idot()) {
      GTEST_SKIP() << tier->context().device_name() << " has no shaderInt64";
    }
    for (int conversation = 0; conversation < 2; ++conversation) {
      SCOPED_TRACE(absl::StrCat("conversation ", conversation));
      const uint64_t hits_before = tier->Stats().hits;
      ASSERT_OK_AND_ASSIGN(GreedyRun run, Greedy(*model, [&] { tier->WaitForUploads(); }));
      EXPECT_EQ(run.tokens, cpu.tokens);
      ASSERT_EQ(run.logits.size(), cpu.logits.size());
      for (size_t i = 0; i < run.logits.size(); ++i) {
        EXPECT_EQ(std::memcmp(run.logits[i].data(), cpu.logits[i].data(),
                              run.logits[i].size() * sizeof(float)),
                  0)
            << "logits #" << i << " differ (rel-L2 "
            << RelL2(run.logits[i].data(), cpu.logits[i].data(),
                     static_cast<int64_t>(run.logits[i].size()))
            << ")";
      }
      EXPECT_GT(tier->Stats().hits, hits_before);
    }
    tier->WaitForUploads();
    const VkTierStats s = tier->Stats();
    EXPECT_EQ(s.matmuls, 3 * s.hits);
    EXPECT_EQ(s.failures, 0u);
    if (slots == 6) {
      EXPECT_GT(s.evictions, 0u);
    }
    std::printf("[idot] %s", VkTierReport(s).c_str());
  }
}

// A device without shaderInt64 cannot run the idot chain: under K3_IDOT=1 the first device step
// fails (UNIMPLEMENTED), the tier disables itself and the CPU computes every expert — the run is
// the CPU's bit for bit, never the f32 chain's other bits.
TEST_F(K3VkTierModelTest, IdotWithoutInt64FallsBackToTheCpuBits) {
  ModelOptions options;
  options.chunk = 4;
  ASSERT_OK_AND_ASSIGN(auto cpu_model, Model::Load(FixtureDir(), options));
  ASSERT_OK_AND_ASSIGN(GreedyRun cpu, Greedy(*cpu_model));
  std::vector<int> layers;
  std::string path;
  WriteOneWarmExpertHistory(&layers, &path);  // one resident expert from the start
  VkTierOptions o;
  o.budget_gb = ExpertGb(8);
  o.rate = 4;
  o.usage_path = path;
  VkExpertTier* tier = nullptr;
  auto factory = [&](st::Snapshot& snapshot, const Config& cfg, const std::string& prefix,
                     int num_layers) -> absl::StatusOr<std::unique_ptr<ExpertSource>> {
    COLI_ASSIGN_OR_RETURN(auto vk, vulkan::VulkanContext::Create(
                                       vulkan::VulkanContextOptions{.use_int64 = false}));
    COLI_ASSIGN_OR_RETURN(auto pread,
                          PreadExpertSource::Create(snapshot, cfg, prefix, num_layers));
    COLI_ASSIGN_OR_RETURN(auto t, VkExpertTier::Create(std::move(vk), std::move(pread), snapshot,
                                                       cfg, prefix, num_layers, o));
    tier = t.get();
    return std::unique_ptr<ExpertSource>(std::move(t));
  };
  ASSERT_OK_AND_ASSIGN(auto model, Model::Load(FixtureDir(), options, nullptr, factory));
  ASSERT_FALSE(tier->context().supports_idot());
  ASSERT_OK_AND_ASSIGN(GreedyRun run, Greedy(*model, [&] { tier->WaitForUploads(); }));
  EXPECT_EQ(run.tokens, cpu.tokens);
  ASSERT_EQ(run.logits.size(), cpu.logits.size());
  for (size_t i = 0; i < run.logits.size(); ++i) {
    EXPECT_EQ(std::memcmp(run.logits[i].data(), cpu.logits[i].data(),
                          run.logits[i].size() * sizeof(float)),
              0)
        << "logits #" << i << " differ";
  }
  const VkTierStats s = tier->Stats();
  EXPECT_EQ(s.failures, 1u);
  EXPECT_EQ(s.hits, 0u);
  EXPECT_EQ(s.matmuls, 0u);
  EXPECT_THAT(VkTierReport(s), HasSubstr("DISABLED"));
}

// The LatentMoE hook itself, without Vulkan: a "device" that computes its claimed experts with
// the CPU's own exact-float kernels (every other expert of each call; resident set changing
// per call) must give logits bit-identical to the CPU run — so the hook keeps the per-(row, k)
// sum order, every CPU-computed expert keeps its bits, and the claimed experts are never
// passed to the wrapped source (it would fail the test by delivering them twice).
class CpuDevice final : public ExpertSource, public DeviceExperts {
 public:
  CpuDevice(std::unique_ptr<PreadExpertSource> inner, st::Snapshot& snapshot, Config cfg)
      : inner_(std::move(inner)), snapshot_(snapshot), cfg_(std::move(cfg)) {}
  absl::Status ForEachExpert(
      int layer, std::span<const int32_t> experts,
      const std::function<absl::Status(int, const ExpertWeights&)>& fn) override {
    for (int32_t e : experts) {
      if (!fail_ && std::find(claimed_.begin(), claimed_.end(), e) != claimed_.end())
        return absl::InternalError(absl::StrCat("claimed expert ", e, " passed to the CPU"));
    }
    cpu_experts_ += experts.size();
    return inner_->ForEachExpert(layer, experts, fn);
  }
  std::vector<int> Claim(int layer, std::span<const int32_t> experts) override {
    layer_ = layer;
    claimed_.clear();
    entries_.clear();
    for (size_t i = 0; i < experts.size(); ++i) {
      if ((i + calls_) % 2 == 0) {
        entries_.push_back(static_cast<int>(i));
        claimed_.push_back(experts[i]);
      }
    }
    ++calls_;
    return entries_;
  }
  absl::Status Compute(std::span<const DeviceExpertJob> jobs, bool idot) override {
    if (fail_) return absl::UnavailableError("stand-in device lost");
    const int64_t I = cfg_.moe.intermediate;
    // The numerics the hook says the CPU uses in this call.
    const kernels::MatmulOptions exact{.idot = idot, .threads = 1};
    for (const DeviceExpertJob& job : jobs) {
      const auto pos = std::find(entries_.begin(), entries_.end(), job.entry) - entries_.begin();
      if (pos >= static_cast<int64_t>(entries_.size()))
        return absl::InternalError("job for an unclaimed entry");
      COLI_ASSIGN_OR_RETURN(ExpertBytes e, ReadExpert(snapshot_, cfg_, layer_, claimed_[pos]));
      std::vector<float> g(job.rows * I), u(job.rows * I);
      COLI_RETURN_IF_ERROR(kernels::Matmul(e.views.w1, job.x, job.rows, g.data(), exact));
      COLI_RETURN_IF_ERROR(kernels::Matmul(e.views.w3, job.x, job.rows, u.data(), exact));
      ops::SituGlu(g.data(), u.data(), job.rows * I, cfg_.situ_beta, cfg_.situ_linear_beta,
                   g.data());
      COLI_RETURN_IF_ERROR(kernels::Matmul(e.views.w2, g.data(), job.rows, job.y, exact));
      device_experts_ += 1;
    }
    return absl::OkStatus();
  }
  void Offer(int, int32_t, const ExpertWeights&) override { offers_ += 1; }

  uint64_t cpu_experts_ = 0, device_experts_ = 0, offers_ = 0;
  bool fail_ = false;  // every Compute fails (the step must fall back to the CPU)

 private:
  std::unique_ptr<PreadExpertSource> inner_;
  st::Snapshot& snapshot_;
  Config cfg_;
  int layer_ = -1;
  uint64_t calls_ = 0;
  std::vector<int> entries_;
  std::vector<int32_t> claimed_;
};

TEST_F(K3VkTierFixtureTest, HookKeepsTheCpuSumOrderBitForBit) {
  // Both numerics: the hook hands the device the CPU's own (K3_IDOT=0 and the default 1).
  for (bool idot : {false, true}) {
    ModelOptions o;
    o.idot = idot;
    o.chunk = 5;
    ASSERT_OK_AND_ASSIGN(auto cpu_model, Model::Load(FixtureDir(), o));
    ASSERT_OK_AND_ASSIGN(GreedyRun cpu, Greedy(*cpu_model));
    for (bool fail : {false, true}) {
      SCOPED_TRACE(
          absl::StrCat(fail ? "device fails every step" : "device works", ", idot ", idot));
      CpuDevice* device = nullptr;
      auto factory = [&](st::Snapshot& snapshot, const Config& cfg, const std::string& prefix,
                         int layers) -> absl::StatusOr<std::unique_ptr<ExpertSource>> {
        COLI_ASSIGN_OR_RETURN(auto pread, PreadExpertSource::Create(snapshot, cfg, prefix, layers));
        auto d = std::make_unique<CpuDevice>(std::move(pread), snapshot, cfg);
        d->fail_ = fail;
        device = d.get();
        return std::unique_ptr<ExpertSource>(std::move(d));
      };
      ASSERT_OK_AND_ASSIGN(auto model, Model::Load(FixtureDir(), o, nullptr, factory));
      ASSERT_OK_AND_ASSIGN(GreedyRun run, Greedy(*model));
      EXPECT_EQ(run.tokens, cpu.tokens);
      ASSERT_EQ(run.logits.size(), cpu.logits.size());
      for (size_t i = 0; i < run.logits.size(); ++i) {
        EXPECT_EQ(std::memcmp(run.logits[i].data(), cpu.logits[i].data(),
                              run.logits[i].size() * sizeof(float)),
                  0)
            << "logits #" << i << " differ";
      }
      EXPECT_EQ(device->device_experts_ > 0, !fail);
      EXPECT_GT(device->cpu_experts_, 0u);
      // Every expert the CPU walk computed is offered once (not the fallback's).
      EXPECT_EQ(device->offers_ < device->cpu_experts_, fail);
      if (!fail) {
        EXPECT_EQ(device->offers_, device->cpu_experts_);
      }
    }
  }
}

TEST_F(K3VkTierModelTest, BadBudgetRateAndHistoryAreHandled) {
  VkTierOptions o;
  o.usage_path = "";
  o.budget_gb = -1;
  EXPECT_THAT(Model::Load(FixtureDir(), ExactOptions(), nullptr, VkTierFactory(o, nullptr)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("COLI_VK_TIER_GB")));
  o.budget_gb = 1;
  o.rate = -1;
  EXPECT_THAT(Model::Load(FixtureDir(), ExactOptions(), nullptr, VkTierFactory(o, nullptr)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("COLI_VK_TIER_RATE")));
  // A corrupt history is logged and ignored: nothing warm, the run still matches the CPU's.
  const std::string path = tmp_ + "/.coli_usage";
  { std::ofstream(path) << "not a usage history"; }
  o.rate = 0;
  o.budget_gb = ExpertGb(10);
  o.usage_path = path;
  VkExpertTier* tier = nullptr;
  ASSERT_OK_AND_ASSIGN(auto model, Model::Load(FixtureDir(), ExactOptions(), nullptr,
                                               VkTierFactory(o, nullptr, &tier)));
  EXPECT_EQ(tier->Stats().warm, 0u);
  ASSERT_OK_AND_ASSIGN(GreedyRun run, Greedy(*model));
  ExpectMatchesCpu(run, /*exact=*/true);  // nothing resident, no promotions: the CPU's bits
}

// A failed submission disables the tier: nothing resident or claimed afterwards, and the run is
// the CPU's, bit for bit.
TEST_F(K3VkTierModelTest, FailedSubmissionDisablesTheTier) {
  std::vector<int> layers;
  std::string path;
  WriteOneWarmExpertHistory(&layers, &path);  // decoder layer layers[0], expert 3
  VkTierOptions o;
  o.budget_gb = ExpertGb(4);
  o.rate = 4;
  o.usage_path = path;
  VkExpertTier* tier = nullptr;
  ASSERT_OK_AND_ASSIGN(auto model, Model::Load(FixtureDir(), ExactOptions(), nullptr,
                                               VkTierFactory(o, nullptr, &tier)));
  ASSERT_EQ(tier->ResidentExperts(layers[0]), std::vector<int32_t>{3});
  const std::vector<int32_t> experts = {1, 3};
  ASSERT_EQ(tier->Claim(layers[0], experts), std::vector<int>{1});
  std::vector<float> x(cfg_.moe.latent, 1.0f), y(cfg_.moe.latent);
  const DeviceExpertJob bad{1, x.data(), -1, y.data()};  // negative rows: the chain refuses
  EXPECT_THAT(tier->Compute(std::span(&bad, 1), /*idot=*/false),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("negative rows")));
  const VkTierStats s = tier->Stats();
  EXPECT_EQ(s.failures, 1u);
  EXPECT_EQ(s.resident, 0u);
  EXPECT_THAT(VkTierReport(s), HasSubstr("DISABLED"));
  EXPECT_TRUE(tier->Claim(layers[0], experts).empty());
  ASSERT_OK_AND_ASSIGN(GreedyRun run, Greedy(*model, [&] { tier->WaitForUploads(); }));
  ExpectMatchesCpu(run, /*exact=*/true);
  EXPECT_EQ(tier->Stats().resident, 0u);  // no promotions after the failure
  EXPECT_EQ(tier->Stats().hits, 0u);
}

// Device memory running out on a promotion (the context's allocation hook stands in for
// VK_ERROR_OUT_OF_DEVICE_MEMORY): the tier stops promoting, the warm resident keeps serving,
// every other expert is computed on the CPU, and the counters and the [VK] line say so.
TEST_F(K3VkTierModelTest, UploadOutOfDeviceMemoryStopsPromotions) {
  std::vector<int> layers;
  std::string path;
  WriteOneWarmExpertHistory(&layers, &path);  // decoder layer layers[0], expert 3
  VkTierOptions o;
  o.budget_gb = ExpertGb(60);
  o.rate = 8;
  o.usage_path = path;
  VkExpertTier* tier = nullptr;
  ASSERT_OK_AND_ASSIGN(auto model, Model::Load(FixtureDir(), ExactOptions(), nullptr,
                                               VkTierFactory(o, nullptr, &tier)));
  ASSERT_EQ(tier->ResidentExperts(layers[0]), std::vector<int32_t>{3});
  const uint64_t warm_bytes = tier->Stats().bytes;
  EXPECT_EQ(warm_bytes, tier->context().resident_bytes());  // counted as allocated
  EXPECT_EQ(warm_bytes, tier->expert_device_bytes());
  // The first promotion's first allocation fails (the step's own buffers are not affected).
  tier->context().FailAllocationsForTesting(1, /*uploads_only=*/true);
  ASSERT_OK_AND_ASSIGN(GreedyRun run, Greedy(*model, [&] { tier->WaitForUploads(); }));
  tier->WaitForUploads();
  ExpectMatchesCpu(run, /*exact=*/false);
  const VkTierStats s = tier->Stats();
  EXPECT_EQ(s.upload_failures, 1u);
  EXPECT_TRUE(s.promotions_stopped);
  EXPECT_EQ(s.promotions, 0u);  // nothing after the failure either
  EXPECT_EQ(s.resident, 1u);
  EXPECT_EQ(s.bytes, warm_bytes);
  EXPECT_EQ(s.failures, 0u);  // the tier itself is not disabled
  EXPECT_THAT(VkTierReport(s), HasSubstr("promotions stopped after 1 failed upload"));
  EXPECT_THAT(VkTierReport(s), ::testing::Not(HasSubstr("DISABLED")));
  std::printf("[oom] %s\n", VkTierReport(s).c_str());
}

// Device memory running out during the warm start: the model still opens (it used to fail the
// load), with what fit (here nothing), promotions stopped, and the run is the CPU's bit for bit.
TEST_F(K3VkTierModelTest, WarmStartOutOfDeviceMemoryStillOpens) {
  std::vector<int> layers;
  std::string path;
  WriteOneWarmExpertHistory(&layers, &path);
  VkTierOptions o;
  o.budget_gb = ExpertGb(60);
  o.rate = 8;
  o.usage_path = path;
  VkExpertTier* tier = nullptr;
  auto factory = [&](st::Snapshot& snapshot, const Config& cfg, const std::string& prefix,
                     int num_layers) -> absl::StatusOr<std::unique_ptr<ExpertSource>> {
    COLI_ASSIGN_OR_RETURN(auto pread,
                          PreadExpertSource::Create(snapshot, cfg, prefix, num_layers));
    COLI_ASSIGN_OR_RETURN(auto vk, vulkan::VulkanContext::Create());
    vk->FailAllocationsForTesting(1, /*uploads_only=*/true);  // the warm expert's first buffer
    COLI_ASSIGN_OR_RETURN(auto t, VkExpertTier::Create(std::move(vk), std::move(pread), snapshot,
                                                       cfg, prefix, num_layers, o));
    tier = t.get();
    return std::unique_ptr<ExpertSource>(std::move(t));
  };
  ASSERT_OK_AND_ASSIGN(auto model, Model::Load(FixtureDir(), ExactOptions(), nullptr, factory));
  VkTierStats s = tier->Stats();
  EXPECT_EQ(s.warm, 0u);
  EXPECT_EQ(s.resident, 0u);
  EXPECT_EQ(s.upload_failures, 1u);
  EXPECT_TRUE(s.promotions_stopped);
  EXPECT_EQ(tier->context().resident_bytes(), 0u);
  ASSERT_OK_AND_ASSIGN(GreedyRun run, Greedy(*model, [&] { tier->WaitForUploads(); }));
  ExpectMatchesCpu(run, /*exact=*/true);
  s = tier->Stats();
  EXPECT_EQ(s.promotions, 0u);
  EXPECT_EQ(s.hits, 0u);
  EXPECT_EQ(s.failures, 0u);
}

TEST_F(K3VkTierFixtureTest, NoVulkanDriverIsUnavailableOnlyWhenAskedFor) {
  // The loader finds no driver through a manifest that does not exist.
  const char* old = std::getenv("VK_ICD_FILENAMES");
  const std::string saved = old != nullptr ? old : "";
  setenv("VK_ICD_FILENAMES", "/nonexistent/coli_no_driver.json", 1);
  ModelOptions o = ExactOptions();
  o.vulkan = true;
  VkExpertTier* tier = nullptr;
  auto asked = Model::Load(FixtureDir(), o, nullptr,
                           ExpertSourceFactoryFor(o, FixtureDir(), nullptr, &tier));
  o.vulkan = false;
  auto unasked = Model::Load(FixtureDir(), o, nullptr,
                             ExpertSourceFactoryFor(o, FixtureDir(), nullptr, &tier));
  if (old != nullptr) {
    setenv("VK_ICD_FILENAMES", saved.c_str(), 1);
  } else {
    unsetenv("VK_ICD_FILENAMES");
  }
  EXPECT_THAT(asked.status(), StatusIs(absl::StatusCode::kUnavailable, HasSubstr("Vulkan")));
  EXPECT_THAT(unasked.status(), IsOk());
  EXPECT_EQ(tier, nullptr);
}

// ---- switches -----------------------------------------------------------------------------

TEST(K3VkSwitches, AliasesAndPrecedence) {
  auto resolve = [](VkSwitches s) -> absl::StatusOr<ModelOptions> {
    ModelOptions o;
    COLI_RETURN_IF_ERROR(s.Resolve(&o));
    return o;
  };
  ASSERT_OK_AND_ASSIGN(ModelOptions none, resolve({}));
  EXPECT_FALSE(none.vulkan);
  EXPECT_EQ(none.vk_tier_gb, 2);
  EXPECT_EQ(none.vk_tier_rate, 4);
  VkSwitches s;
  s.k3_vk = "1";
  ASSERT_OK_AND_ASSIGN(ModelOptions o, resolve(s));
  EXPECT_TRUE(o.vulkan);
  s.coli_vulkan = "0";  // the explicit shared switch wins over the old alias
  ASSERT_OK_AND_ASSIGN(o, resolve(s));
  EXPECT_FALSE(o.vulkan);
  s = {};
  s.coli_vulkan = "1";
  s.k3_vk = "0";
  ASSERT_OK_AND_ASSIGN(o, resolve(s));
  EXPECT_TRUE(o.vulkan);
  s = {};
  s.k3_vk_gb = "0.5";
  s.k3_vk_up = "3";
  ASSERT_OK_AND_ASSIGN(o, resolve(s));
  EXPECT_EQ(o.vk_tier_gb, 0.5);
  EXPECT_EQ(o.vk_tier_rate, 3);
  s.tier_gb = "1.5";
  s.tier_rate = "7";
  ASSERT_OK_AND_ASSIGN(o, resolve(s));
  EXPECT_EQ(o.vk_tier_gb, 1.5);
  EXPECT_EQ(o.vk_tier_rate, 7);
  s = {};
  s.k3_vk_up = "auto";  // does nothing
  ASSERT_OK_AND_ASSIGN(o, resolve(s));
  EXPECT_EQ(o.vk_tier_rate, 4);
  // Malformed values name the variable.
  s = {};
  s.coli_vulkan = "yes";
  EXPECT_THAT(resolve(s), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("COLI_VULKAN")));
  s = {};
  s.k3_vk_gb = "-1";
  EXPECT_THAT(resolve(s), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("K3_VK_GB")));
  s = {};
  s.tier_rate = "x";
  EXPECT_THAT(resolve(s),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("COLI_VK_TIER_RATE")));
  // FromEnv reads the switches by their names.
  const VkSwitches env = VkSwitches::FromEnv([](const char* name) -> const char* {
    return std::string(name) == "K3_VK_UP" ? "5" : nullptr;
  });
  EXPECT_EQ(env.k3_vk_up, "5");
  EXPECT_TRUE(env.coli_vulkan.empty());
}

TEST_F(K3VkTierFixtureTest, K3VkZeroNeverOpensTheDevice) {
  setenv("COLI_VK_DEVICE", "not-a-device", 1);
  VkSwitches s;
  s.k3_vk = "0";
  ModelOptions o = ExactOptions();
  ASSERT_THAT(s.Resolve(&o), IsOk());
  VkExpertTier* tier = reinterpret_cast<VkExpertTier*>(1);
  auto model = Model::Load(FixtureDir(), o, nullptr,
                           ExpertSourceFactoryFor(o, FixtureDir(), nullptr, &tier));
  unsetenv("COLI_VK_DEVICE");
  ASSERT_THAT(model.status(), IsOk());
  EXPECT_EQ(tier, nullptr);
}

// COLI_VK_DEVICE and COLI_VK_STAGING are the model's switches (they travel from the client) and
// win over the host process's own environment, which applies only where they are unset.
TEST_F(K3VkTierFixtureTest, TheDeviceSwitchesWinOverTheHostsEnvironment) {
  VkSwitches bad;
  bad.vk_device = "abc";
  ModelOptions o = ExactOptions();
  EXPECT_THAT(bad.Resolve(&o),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("COLI_VK_DEVICE='abc'")));
  bad.vk_device = "-1";
  EXPECT_THAT(bad.Resolve(&o), StatusIs(absl::StatusCode::kInvalidArgument));
  bad = VkSwitches();
  bad.vk_staging = "2";
  EXPECT_THAT(bad.Resolve(&o),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("COLI_VK_STAGING='2'")));
  const VkSwitches env = VkSwitches::FromEnv([](const char* name) -> const char* {
    const std::string n = name;
    return n == "COLI_VK_DEVICE" ? "1" : n == "COLI_VK_STAGING" ? "1" : nullptr;
  });
  ASSERT_THAT(env.Resolve(&o), IsOk());
  EXPECT_EQ(o.vk_device, 1);
  EXPECT_EQ(o.vk_staging, 1);

  if (!HaveVulkan()) {
    COLI_SKIP_UNLESS_VULKAN_REQUIRED() << "no Vulkan device";
  }
  // This process's environment names a device that does not exist and a bad staging value; the
  // options win.
  setenv("COLI_VK_DEVICE", "999", 1);
  setenv("COLI_VK_STAGING", "bogus", 1);
  VkSwitches s;
  s.coli_vulkan = "1";
  s.vk_device = "0";
  s.vk_staging = "1";
  o = ExactOptions();
  ASSERT_THAT(s.Resolve(&o), IsOk());
  VkExpertTier* tier = nullptr;
  auto model = Model::Load(FixtureDir(), o, nullptr,
                           ExpertSourceFactoryFor(o, FixtureDir(), nullptr, &tier));
  unsetenv("COLI_VK_DEVICE");
  unsetenv("COLI_VK_STAGING");
  ASSERT_THAT(model.status(), IsOk());
  ASSERT_NE(tier, nullptr);
  EXPECT_TRUE(tier->Stats().staging) << "COLI_VK_STAGING=1 from the options";
}

TEST_F(K3VkTierFixtureTest, BadDeviceIndexIsRefusedAtOpen) {
  if (!HaveVulkan()) {
    COLI_SKIP_UNLESS_VULKAN_REQUIRED() << "no Vulkan device";
  }
  VkSwitches s;
  s.coli_vulkan = "1";
  s.vk_device = "999";
  ModelOptions o = ExactOptions();
  ASSERT_THAT(s.Resolve(&o), IsOk());
  EXPECT_EQ(o.vk_device, 999);
  VkExpertTier* tier = nullptr;
  auto model = Model::Load(FixtureDir(), o, nullptr,
                           ExpertSourceFactoryFor(o, FixtureDir(), nullptr, &tier));
  EXPECT_THAT(model.status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("COLI_VK_DEVICE='999'")));
  EXPECT_EQ(tier, nullptr);
}

}  // namespace
}  // namespace coli::k3
