// Tests of the streaming expert store on small snapshots written here with the safetensors
// Writer: two MoE layers (decoder layers 1 and 3), one shard each, experts stored in a shuffled
// order after an odd-sized tensor (so no expert starts 4 KiB-aligned). Every byte handed to a
// callback is compared with the bytes the test wrote — the independent reference.
#include "plugins/kimi_k3/expert_store.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/io/io.h"
#include "common/safetensors/safetensors.h"
#include "common/status/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace coli::k3 {
namespace {

namespace fs = std::filesystem;
using ::coli::testing::IsOk;
using ::coli::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr int kLatent = 128;
constexpr int kInter = 64;
constexpr int kExperts = 6;
const std::vector<int> kMoeLayers = {1, 3};
constexpr uint64_t kExpertBytes = 3 * (kLatent * kInter / 2 + kLatent * kInter / 32);  // 13056
constexpr const char* kTensors[6] = {"w1.weight_packed", "w1.weight_scale",  "w2.weight_packed",
                                     "w2.weight_scale",  "w3.weight_packed", "w3.weight_scale"};

std::vector<int64_t> TensorShape(int k) {
  switch (k) {
    case 0:
    case 4:
      return {kInter, kLatent / 2};
    case 1:
    case 5:
      return {kInter, kLatent / 32};
    case 2:
      return {kLatent, kInter / 2};
    default:
      return {kLatent, kInter / 32};
  }
}

// The bytes of tensor k of (layer, expert): a deterministic function of the three.
std::string ExpectedBytes(int layer, int expert, int k) {
  const std::vector<int64_t> shape = TensorShape(k);
  std::string bytes(static_cast<size_t>(shape[0] * shape[1]), '\0');
  std::mt19937 rng(static_cast<uint32_t>(layer * 1000 + expert * 10 + k));
  for (char& c : bytes) c = static_cast<char>(rng() & 0xff);
  return bytes;
}

std::string Name(int layer, int expert, int k) {
  return absl::StrCat("language_model.model.layers.", layer, ".block_sparse_moe.experts.", expert,
                      ".", kTensors[k]);
}

enum class Arrangement { kContiguous, kSplit };

// Writes the snapshot into `dir` (shard of layer 3 into `dir2` when given) and returns the
// path to open.
void WriteSnapshot(const std::string& dir, Arrangement arrangement, const std::string& dir2 = "",
                   int odd_bytes = 4099) {
  fs::create_directories(dir);
  std::map<std::string, std::string> weight_map;
  uint64_t total = 0;
  for (size_t s = 0; s < kMoeLayers.size(); ++s) {
    const int layer = kMoeLayers[s];
    const std::string shard = absl::StrCat("model-0000", s + 1, "-of-000002.safetensors");
    st::Writer writer;
    // An odd-sized tensor first, so the experts are not 4 KiB-aligned in the file.
    const std::string norm = absl::StrCat("language_model.model.layers.", layer, ".odd");
    ASSERT_OK(writer.Add(norm, st::DType::kU8, {odd_bytes}, std::string(odd_bytes, '\x5a')));
    weight_map[norm] = shard;
    std::vector<int> order(kExperts);
    for (int e = 0; e < kExperts; ++e) order[e] = (e * 5 + 3) % kExperts;  // shuffled
    for (int e : order) {
      const std::vector<int> tensors = arrangement == Arrangement::kContiguous
                                           ? std::vector<int>{0, 1, 2, 3, 4, 5}
                                           : std::vector<int>{0, 2, 4, 1, 3, 5};
      for (int k : tensors) {
        ASSERT_OK(writer.Add(Name(layer, e, k), st::DType::kU8, TensorShape(k),
                             ExpectedBytes(layer, e, k)));
        weight_map[Name(layer, e, k)] = shard;
      }
    }
    const std::string where = (s == 1 && !dir2.empty()) ? dir2 : dir;
    fs::create_directories(where);
    ASSERT_OK(writer.Write(where + "/" + shard));
    total += fs::file_size(where + "/" + shard);
  }
  ASSERT_OK(st::WriteIndex(dir + "/model.safetensors.index.json", weight_map, total));
}

class ExpertStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           absl::StrCat("coli_expert_store_", ::getpid(), "_",
                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  ExpertStoreLayout Layout() {
    ExpertStoreLayout layout;
    layout.moe_layers = kMoeLayers;
    layout.experts = kExperts;
    layout.latent = kLatent;
    layout.inter = kInter;
    layout.prefix = "language_model.";
    return layout;
  }

  // Options with exactly `cap` slots per layer.
  static ExpertStoreOptions WithCap(int cap) {
    ExpertStoreOptions options;
    options.expert_gb = (cap + 0.5) * static_cast<double>(kExpertBytes) * 2 / 1e9;
    options.usage_path = "";
    return options;
  }

  std::string dir_;
};

// Checks that `w` holds exactly the bytes of (layer, expert) with the right views.
void ExpectExpertBytes(const ExpertWeights& w, int layer, int expert) {
  const kernels::MatrixView* views[3] = {&w.w1, &w.w2, &w.w3};
  for (int m = 0; m < 3; ++m) {
    const kernels::MatrixView& v = *views[m];
    EXPECT_EQ(v.format, kernels::WeightFormat::kMxfp4);
    EXPECT_EQ(v.rows, m == 1 ? kLatent : kInter);
    EXPECT_EQ(v.cols, m == 1 ? kInter : kLatent);
    const std::string packed = ExpectedBytes(layer, expert, 2 * m);
    const std::string scales = ExpectedBytes(layer, expert, 2 * m + 1);
    ASSERT_EQ(static_cast<size_t>(v.rows * v.cols / 2), packed.size());
    EXPECT_EQ(std::memcmp(v.data, packed.data(), packed.size()), 0)
        << "layer " << layer << " expert " << expert << " w" << m + 1 << " packed";
    EXPECT_EQ(std::memcmp(v.scales, scales.data(), scales.size()), 0)
        << "layer " << layer << " expert " << expert << " w" << m + 1 << " scales";
  }
}

// Runs one call and checks every callback's bytes; returns the call's status.
absl::Status CheckedCall(StreamingExpertStore* store, int layer, std::vector<int32_t> experts) {
  std::vector<int> calls(experts.size(), 0);
  absl::Status status =
      store->ForEachExpert(layer, experts, [&](int i, const ExpertWeights& w) -> absl::Status {
        EXPECT_GE(i, 0);
        EXPECT_LT(i, static_cast<int>(experts.size()));
        ++calls[i];
        ExpectExpertBytes(w, layer, experts[i]);
        return absl::OkStatus();
      });
  if (status.ok()) {
    for (size_t i = 0; i < calls.size(); ++i) EXPECT_EQ(calls[i], 1) << "entry " << i;
  }
  return status;
}

// Read requests for one contiguous expert split into `pieces` (the store's documented split):
// its 4 KiB-aligned cover in min(pieces, blocks) pieces of ceil(blocks / that) blocks.
uint64_t ExpectedPieces(const StreamingExpertStore::Extent& e, int pieces) {
  const uint64_t first = e.offset / 4096, end = (e.offset + e.nbytes + 4095) / 4096;
  const uint64_t blocks = end - first;
  const uint64_t want = std::min<uint64_t>(static_cast<uint64_t>(pieces), blocks);
  const uint64_t per = (blocks + want - 1) / want;
  return (blocks + per - 1) / per;
}

TEST_F(ExpertStoreTest, DiscoversTheLayout) {
  WriteSnapshot(dir_, Arrangement::kContiguous);
  ASSERT_OK_AND_ASSIGN(auto snapshot, st::Snapshot::Open(dir_));
  ASSERT_OK_AND_ASSIGN(ExpertStoreLayout layout, DiscoverExpertLayout(snapshot.get()));
  EXPECT_THAT(layout.moe_layers, ElementsAre(1, 3));
  EXPECT_EQ(layout.experts, kExperts);
  EXPECT_EQ(layout.latent, kLatent);
  EXPECT_EQ(layout.inter, kInter);
  EXPECT_EQ(layout.prefix, "language_model.");
  EXPECT_EQ(layout.ExpertBytes(), kExpertBytes);
  // The extent the store reports is exactly where the file keeps the expert.
  ASSERT_OK_AND_ASSIGN(auto store, StreamingExpertStore::Open(snapshot.get(), layout, {}));
  ASSERT_OK_AND_ASSIGN(StreamingExpertStore::Extent extent, store->ExpertExtent(3, 4));
  ASSERT_OK_AND_ASSIGN(const st::TensorInfo* w1, snapshot->Get(Name(3, 4, 0)));
  EXPECT_EQ(extent.offset, w1->file_offset);
  EXPECT_EQ(extent.nbytes, kExpertBytes);
  EXPECT_TRUE(extent.contiguous);
  EXPECT_EQ(extent.path, dir_ + "/model-00002-of-000002.safetensors");
  EXPECT_THAT(store->ExpertExtent(2, 0), StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST_F(ExpertStoreTest, BytesMatchTheFileForEverySetting) {
  for (Arrangement arrangement : {Arrangement::kContiguous, Arrangement::kSplit}) {
    const std::string dir = dir_ + (arrangement == Arrangement::kSplit ? "/split" : "/contig");
    WriteSnapshot(dir, arrangement);
    ASSERT_OK_AND_ASSIGN(auto snapshot, st::Snapshot::Open(dir));
    for (bool direct : {true, false}) {
      for (bool pipe : {true, false}) {
        for (int cap : {1, 2, kExperts}) {
          for (int threads : {1, 3}) {
            SCOPED_TRACE(absl::StrCat("split=", arrangement == Arrangement::kSplit, " direct=",
                                      direct, " pipe=", pipe, " cap=", cap, " threads=", threads));
            ExpertStoreOptions options = WithCap(cap);
            options.direct = direct;
            options.pipe = pipe;
            options.load_threads = threads;
            options.working_slots = 3;        // fewer than some calls' misses: batches and waits
            options.read_pieces = 0;          // one piece per loader: 1 or 3
            options.prefault = threads == 3;  // slots at Open, or on first use
            ASSERT_OK_AND_ASSIGN(auto store,
                                 StreamingExpertStore::Open(snapshot.get(), Layout(), options));
            EXPECT_EQ(store->plan().slots_per_layer, cap);
            EXPECT_EQ(store->contiguous_experts(),
                      arrangement == Arrangement::kContiguous ? 2 * kExperts : 0);
            std::mt19937 rng(cap * 7 + threads);
            std::set<std::pair<int, int>> seen;
            for (int round = 0; round < 12; ++round) {
              for (int layer : kMoeLayers) {
                std::vector<int32_t> experts;
                const int n = 1 + static_cast<int>(rng() % 5);
                for (int j = 0; j < n; ++j)
                  experts.push_back(static_cast<int32_t>(rng() % kExperts));
                if (round == 0) experts = {0, 1, 2, 3, 4, 5, 2};  // every expert, one duplicate
                for (int32_t e : experts) seen.insert({layer, e});
                const std::set<int32_t> distinct(experts.begin(), experts.end());
                // Requests the misses need: pieces (default: one per loader) or six tensors.
                const std::vector<int32_t> cached = store->CachedExperts(layer);
                uint64_t requests = 0;
                for (int32_t e : distinct) {
                  if (std::find(cached.begin(), cached.end(), e) != cached.end()) continue;
                  ASSERT_OK_AND_ASSIGN(auto extent, store->ExpertExtent(layer, e));
                  requests +=
                      arrangement == Arrangement::kContiguous ? ExpectedPieces(extent, threads) : 6;
                }
                ASSERT_OK(CheckedCall(store.get(), layer, experts));
                const ExpertStoreStats stats = store->TakeStats();
                EXPECT_EQ(stats.hits + stats.misses, distinct.size());
                EXPECT_EQ(stats.bytes_read, stats.misses * kExpertBytes);
                EXPECT_EQ(stats.preads, requests);
                EXPECT_LE(store->CachedExperts(layer).size(), static_cast<size_t>(cap));
              }
            }
            EXPECT_EQ(seen.size(), 2u * kExperts);
            if (cap == kExperts) {
              // Everything is cached now: no more reads.
              ASSERT_OK(CheckedCall(store.get(), 1, {5, 4, 3, 2, 1, 0}));
              EXPECT_EQ(store->TakeStats().misses, 0u);
            }
          }
        }
      }
    }
  }
}

// Split reads: every piece count (1 = whole expert, up to more pieces than the expert has
// blocks), with heads at several offsets inside a 4 KiB block and the shard's last expert
// ending at an unaligned end of file (its aligned cover runs past EOF): the bytes are exact,
// and each expert is read in exactly the documented pieces, each piece once.
TEST_F(ExpertStoreTest, SplitReadsDeliverExactBytesForAnyPieceCount) {
  bool unaligned_eof = false;
  for (int odd : {4099, 1, 8190}) {
    const std::string dir = absl::StrCat(dir_, "/odd", odd);
    WriteSnapshot(dir, Arrangement::kContiguous, "", odd);
    ASSERT_OK_AND_ASSIGN(auto snapshot, st::Snapshot::Open(dir));
    for (int pieces : {1, 2, 3, 5, 64}) {
      for (bool direct : {true, false}) {
        for (int threads : {1, 4}) {
          SCOPED_TRACE(absl::StrCat("odd=", odd, " pieces=", pieces, " direct=", direct,
                                    " threads=", threads));
          ExpertStoreOptions options = WithCap(kExperts);
          options.direct = direct;
          options.load_threads = threads;
          options.read_pieces = pieces;
          options.working_slots = 2;
          ASSERT_OK_AND_ASSIGN(auto store,
                               StreamingExpertStore::Open(snapshot.get(), Layout(), options));
          store->StartTrace();
          for (int layer : kMoeLayers) {
            uint64_t requests = 0;
            std::map<int32_t, uint64_t> expected;
            for (int e = 0; e < kExperts; ++e) {
              ASSERT_OK_AND_ASSIGN(auto extent, store->ExpertExtent(layer, e));
              expected[e] = ExpectedPieces(extent, pieces);
              requests += expected[e];
              const uint64_t size = fs::file_size(extent.path);
              if (extent.offset + extent.nbytes == size && size % 4096 != 0) unaligned_eof = true;
            }
            ASSERT_OK(CheckedCall(store.get(), layer, {3, 0, 5, 1, 4, 2}));
            EXPECT_EQ(store->TakeStats().preads, requests);
            std::map<int32_t, std::set<int>> seen;
            for (const ExpertTraceEvent& ev : store->TakeTrace()) {
              if (ev.kind != ExpertTraceEvent::Kind::kRead) continue;
              EXPECT_EQ(ev.layer, layer);
              EXPECT_TRUE(seen[ev.expert].insert(ev.piece).second)
                  << "expert " << ev.expert << " piece " << ev.piece << " read twice";
              EXPECT_GE(ev.thread, 0);
              EXPECT_LT(ev.thread, threads);
            }
            for (int e = 0; e < kExperts; ++e) {
              EXPECT_EQ(seen[e].size(), expected[e]) << "expert " << e;
              if (!seen[e].empty()) {
                EXPECT_EQ(*seen[e].rbegin(), static_cast<int>(expected[e]) - 1);
              }
            }
          }
        }
      }
    }
  }
  EXPECT_TRUE(unaligned_eof) << "no snapshot put an expert at an unaligned end of file";
}

// Cached experts are computed first (while the misses load); the misses' pieces are read in
// disk order, piece after piece (one loader makes the order exact), and each miss is computed
// only after its last piece has arrived, in the order they arrived.
TEST_F(ExpertStoreTest, HitsFirstThenMissesInDiskOrder) {
  WriteSnapshot(dir_, Arrangement::kContiguous);
  ASSERT_OK_AND_ASSIGN(auto snapshot, st::Snapshot::Open(dir_));
  ExpertStoreOptions options = WithCap(kExperts);
  options.load_threads = 1;
  options.read_pieces = 3;
  ASSERT_OK_AND_ASSIGN(auto store, StreamingExpertStore::Open(snapshot.get(), Layout(), options));
  ASSERT_OK(CheckedCall(store.get(), 1, {0, 1, 2}));
  store->StartTrace();
  ASSERT_OK(CheckedCall(store.get(), 1, {5, 4, 3, 2, 1, 0}));
  const std::vector<ExpertTraceEvent> trace = store->TakeTrace();
  // The misses 3, 4, 5 in file order.
  std::vector<std::pair<uint64_t, int32_t>> by_offset;
  std::map<int32_t, int> pieces;
  for (int32_t e : {3, 4, 5}) {
    ASSERT_OK_AND_ASSIGN(auto extent, store->ExpertExtent(1, e));
    by_offset.push_back({extent.offset, e});
    pieces[e] = static_cast<int>(ExpectedPieces(extent, 3));
  }
  std::sort(by_offset.begin(), by_offset.end());
  std::vector<int32_t> disk_order;
  for (const auto& [offset, e] : by_offset) disk_order.push_back(e);

  std::vector<std::pair<int32_t, int>> reads;
  std::vector<int32_t> computed;
  std::map<int32_t, double> arrived;
  double last_read_end = 0;
  int calls = 0;
  for (const ExpertTraceEvent& ev : trace) {
    switch (ev.kind) {
      case ExpertTraceEvent::Kind::kRead:
        EXPECT_GE(ev.start, last_read_end);  // one loader: strictly one after the other
        last_read_end = ev.end;
        reads.push_back({ev.expert, ev.piece});
        arrived[ev.expert] = ev.end;
        break;
      case ExpertTraceEvent::Kind::kCompute:
        EXPECT_LE(ev.start, ev.end);
        EXPECT_EQ(ev.hit, ev.expert <= 2) << "expert " << ev.expert;
        if (!ev.hit) {
          ASSERT_TRUE(arrived.count(ev.expert)) << "expert " << ev.expert << " computed unread";
          EXPECT_GE(ev.start, arrived[ev.expert]);
        }
        computed.push_back(ev.expert);
        break;
      case ExpertTraceEvent::Kind::kCall:
        ++calls;
        EXPECT_EQ(ev.piece, 3);  // misses
        break;
      case ExpertTraceEvent::Kind::kMeanwhile:
        ADD_FAILURE() << "no meanwhile was given";
        break;
    }
  }
  EXPECT_EQ(calls, 1);
  std::vector<std::pair<int32_t, int>> expected_reads;
  for (int32_t e : disk_order) {
    for (int p = 0; p < pieces[e]; ++p) expected_reads.push_back({e, p});
  }
  EXPECT_EQ(reads, expected_reads);
  ASSERT_EQ(computed.size(), 6u);
  std::vector<int32_t> hits(computed.begin(), computed.begin() + 3);
  std::sort(hits.begin(), hits.end());
  EXPECT_THAT(hits, ElementsAre(0, 1, 2));
  EXPECT_EQ(std::vector<int32_t>(computed.begin() + 3, computed.end()), disk_order);
  store->StopTrace();
  ASSERT_OK(CheckedCall(store.get(), 3, {0}));
  EXPECT_TRUE(store->TakeTrace().empty());
}

// ForEachExpertOverlapped: `meanwhile` runs once, before every callback, while the misses are
// already loading (it waits for a piece to arrive; without the overlap it would wait in vain);
// its error ends the call before any callback and the store stays usable.
TEST_F(ExpertStoreTest, MeanwhileRunsWhileTheMissesLoad) {
  WriteSnapshot(dir_, Arrangement::kContiguous);
  ASSERT_OK_AND_ASSIGN(auto snapshot, st::Snapshot::Open(dir_));
  for (bool pipe : {true, false}) {
    SCOPED_TRACE(absl::StrCat("pipe=", pipe));
    ExpertStoreOptions options = WithCap(2);
    options.pipe = pipe;
    ASSERT_OK_AND_ASSIGN(auto store, StreamingExpertStore::Open(snapshot.get(), Layout(), options));
    int meanwhile_calls = 0, callbacks = 0;
    bool saw_a_read = false;
    const std::vector<int32_t> experts = {4, 0, 2};
    ASSERT_OK(store->ForEachExpertOverlapped(
        3, experts,
        [&]() -> absl::Status {
          ++meanwhile_calls;
          EXPECT_EQ(callbacks, 0);
          if (pipe) {
            // Generous bound so a loaded machine cannot fail it; normally microseconds.
            for (int i = 0; i < 20000 && !saw_a_read; ++i) {
              saw_a_read = store->TotalStats().preads > 0;
              if (!saw_a_read) ::usleep(1000);
            }
          }
          return absl::OkStatus();
        },
        [&](int i, const ExpertWeights& w) -> absl::Status {
          EXPECT_EQ(meanwhile_calls, 1);
          ++callbacks;
          ExpectExpertBytes(w, 3, experts[i]);
          return absl::OkStatus();
        }));
    EXPECT_EQ(meanwhile_calls, 1);
    EXPECT_EQ(callbacks, 3);
    if (pipe) {
      EXPECT_TRUE(saw_a_read);
    }
    callbacks = 0;
    EXPECT_THAT(store->ForEachExpertOverlapped(
                    1, std::vector<int32_t>{1, 2, 3},
                    [] { return absl::InternalError("shared expert failed"); },
                    [&](int, const ExpertWeights&) {
                      ++callbacks;
                      return absl::OkStatus();
                    }),
                StatusIs(absl::StatusCode::kInternal, HasSubstr("shared expert failed")));
    EXPECT_EQ(callbacks, 0);
    ASSERT_OK(CheckedCall(store.get(), 1, {3, 2, 1, 0}));
  }
}

// prefault (default): every planned slot is allocated and touched at Open; either way the
// store serves the same bytes, keeps the budget and hits what it cached.
TEST_F(ExpertStoreTest, PrefaultedOrLazySlotsServeTheSameBytes) {
  WriteSnapshot(dir_, Arrangement::kContiguous);
  ASSERT_OK_AND_ASSIGN(auto snapshot, st::Snapshot::Open(dir_));
  for (bool prefault : {true, false}) {
    for (bool pipe : {true, false}) {
      SCOPED_TRACE(absl::StrCat("prefault=", prefault, " pipe=", pipe));
      ExpertStoreOptions options = WithCap(2);
      options.prefault = prefault;
      options.pipe = pipe;
      options.working_slots = 3;
      ASSERT_OK_AND_ASSIGN(auto store,
                           StreamingExpertStore::Open(snapshot.get(), Layout(), options));
      for (int round = 0; round < 3; ++round) {
        for (int layer : kMoeLayers) {
          ASSERT_OK(CheckedCall(store.get(), layer, {5, 0, 3, 1, 4, 2}));
          const std::vector<int32_t> cached = store->CachedExperts(layer);
          ASSERT_EQ(cached.size(), 2u);
          store->TakeStats();
          ASSERT_OK(CheckedCall(store.get(), layer, cached));
          const ExpertStoreStats again = store->TakeStats();
          EXPECT_EQ(again.hits, 2u);
          EXPECT_EQ(again.misses, 0u);
        }
      }
    }
  }
}

TEST_F(ExpertStoreTest, BytesMatchWhenTheFilesystemRefusesODirect) {
  WriteSnapshot(dir_, Arrangement::kContiguous);
  ASSERT_OK_AND_ASSIGN(auto snapshot, st::Snapshot::Open(dir_));
  io::internal::SetDirectOpenErrnoForTesting(EINVAL);
  absl::StatusOr<std::unique_ptr<StreamingExpertStore>> store =
      StreamingExpertStore::Open(snapshot.get(), Layout(), WithCap(1));
  io::internal::SetDirectOpenErrnoForTesting(0);
  ASSERT_OK(store.status());
  EXPECT_FALSE((*store)->all_direct());
  for (int layer : kMoeLayers) ASSERT_OK(CheckedCall(store->get(), layer, {0, 1, 2, 3, 4, 5}));
}

TEST_F(ExpertStoreTest, LruOrderAndBudgetAreHonoured) {
  WriteSnapshot(dir_, Arrangement::kContiguous);
  ASSERT_OK_AND_ASSIGN(auto snapshot, st::Snapshot::Open(dir_));
  ASSERT_OK_AND_ASSIGN(auto store,
                       StreamingExpertStore::Open(snapshot.get(), Layout(), WithCap(3)));
  ASSERT_EQ(store->plan().slots_per_layer, 3);
  auto call = [&](int32_t e) {
    EXPECT_OK(CheckedCall(store.get(), 1, {e}));
    return store->TakeStats();
  };
  call(0);
  call(1);
  call(2);
  EXPECT_THAT(store->CachedExperts(1), ElementsAre(2, 1, 0));
  ExpertStoreStats s = call(0);
  EXPECT_EQ(s.hits, 1u);
  EXPECT_EQ(s.bytes_read, 0u);
  EXPECT_THAT(store->CachedExperts(1), ElementsAre(0, 2, 1));
  s = call(3);  // evicts 1, the least recently used
  EXPECT_EQ(s.misses, 1u);
  EXPECT_THAT(store->CachedExperts(1), ElementsAre(3, 0, 2));
  s = call(1);  // evicts 2
  EXPECT_EQ(s.misses, 1u);
  EXPECT_THAT(store->CachedExperts(1), ElementsAre(1, 3, 0));
  EXPECT_TRUE(store->CachedExperts(3).empty());  // layers are independent
  // A call with more experts than slots still works and keeps the budget.
  ASSERT_OK(CheckedCall(store.get(), 1, {0, 1, 2, 3, 4, 5}));
  EXPECT_EQ(store->CachedExperts(1).size(), 3u);
}

TEST_F(ExpertStoreTest, BudgetHasAFloorOfOneSlotAndACeilingOfAllExperts) {
  WriteSnapshot(dir_, Arrangement::kContiguous);
  ASSERT_OK_AND_ASSIGN(auto snapshot, st::Snapshot::Open(dir_));
  ExpertStoreOptions tiny = WithCap(0);
  tiny.expert_gb = 0;
  ASSERT_OK_AND_ASSIGN(auto store, StreamingExpertStore::Open(snapshot.get(), Layout(), tiny));
  EXPECT_EQ(store->plan().slots_per_layer, 1);
  ASSERT_OK(CheckedCall(store.get(), 3, {5, 0, 4}));
  EXPECT_EQ(store->CachedExperts(3).size(), 1u);
  ExpertStoreOptions huge = WithCap(0);
  huge.expert_gb = 1000;
  ASSERT_OK_AND_ASSIGN(auto big, StreamingExpertStore::Open(snapshot.get(), Layout(), huge));
  EXPECT_EQ(big->plan().slots_per_layer, kExperts);
}

TEST(ExpertMemoryPlan, MatchesTheSpecFormulaForK3) {
  // 8 GB over 92 layers of 17,547,264-byte experts: floor(8e9 / (17547264 · 92)) = 4 slots.
  ASSERT_OK_AND_ASSIGN(ExpertMemoryPlan plan,
                       PlanExpertMemory(8, 92, 896, 17547264, 16, uint64_t{64} << 30, 0));
  EXPECT_EQ(plan.slots_per_layer, 4);
  EXPECT_EQ(plan.slot_bytes % 4096, 0u);
  EXPECT_GE(plan.slot_bytes, 17547264u + 4096u);
  EXPECT_EQ(plan.total_bytes, (4u * 92 + 16) * plan.slot_bytes);
}

TEST(ExpertMemoryPlan, RefusesABudgetTheMachineCannotHold) {
  absl::StatusOr<ExpertMemoryPlan> plan =
      PlanExpertMemory(8, 92, 896, 17547264, 16, uint64_t{4} << 30, 0);
  EXPECT_THAT(plan,
              StatusIs(absl::StatusCode::kResourceExhausted,
                       ::testing::AllOf(HasSubstr("K3_EXPERT_GB=8"), HasSubstr("4 slots/layer"),
                                        HasSubstr("MemAvailable is 4.29 GB"),
                                        HasSubstr("lower K3_EXPERT_GB"))));
  plan = PlanExpertMemory(0, 92, 896, 17547264, 16, uint64_t{1} << 30, 0);
  EXPECT_THAT(plan, StatusIs(absl::StatusCode::kResourceExhausted,
                             HasSubstr("even 1 slot per layer needs")));
  // The reserve counts too.
  EXPECT_THAT(PlanExpertMemory(1, 1, 8, 1 << 20, 1, uint64_t{8} << 30, uint64_t{8} << 30),
              StatusIs(absl::StatusCode::kResourceExhausted));
  EXPECT_THAT(PlanExpertMemory(-1, 1, 8, 1 << 20, 1, uint64_t{8} << 30, 0),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST_F(ExpertStoreTest, OpenRefusesWhenMemAvailableIsTooSmall) {
  WriteSnapshot(dir_, Arrangement::kContiguous);
  ASSERT_OK_AND_ASSIGN(auto snapshot, st::Snapshot::Open(dir_));
  const std::string meminfo = dir_ + "/meminfo";
  std::ofstream(meminfo) << "MemTotal:       1000 kB\nMemAvailable:      64 kB\n";
  ExpertStoreOptions options = WithCap(2);
  options.meminfo_path = meminfo;
  EXPECT_THAT(StreamingExpertStore::Open(snapshot.get(), Layout(), options),
              StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("MemAvailable is 0.00 GB")));
  std::ofstream(meminfo) << "MemTotal: 1000 kB\n";
  EXPECT_THAT(StreamingExpertStore::Open(snapshot.get(), Layout(), options),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr(meminfo)));
  ASSERT_OK_AND_ASSIGN(uint64_t real, ReadMemAvailable("/proc/meminfo"));
  EXPECT_GT(real, 0u);
}

TEST_F(ExpertStoreTest, OptionsComeFromTheModelSwitches) {
  ModelOptions model;
  model.expert_gb = 2.5;
  model.direct = false;
  model.pipe = false;
  model.load_threads = 7;
  const ExpertStoreOptions options = ExpertStoreOptionsFrom(model, dir_);
  EXPECT_EQ(options.expert_gb, 2.5);
  EXPECT_FALSE(options.direct);
  EXPECT_FALSE(options.pipe);
  EXPECT_EQ(options.load_threads, 7);
  // A writable snapshot folder keeps its history beside the shards.
  EXPECT_EQ(options.usage_path, dir_ + "/.coli_usage");
  EXPECT_EQ(DefaultUsagePath(dir_), dir_ + "/.coli_usage");
}

TEST(UsageHistory, PinsPerLayerFollowsTheSpec) {
  EXPECT_EQ(PinsPerLayer(8, 4999), 0);
  EXPECT_EQ(PinsPerLayer(8, 5000), 0);    // 4 · 0.025 = 0.1
  EXPECT_EQ(PinsPerLayer(8, 50000), 1);   // 4 · 0.25
  EXPECT_EQ(PinsPerLayer(8, 100000), 2);  // 4 · 0.5
  EXPECT_EQ(PinsPerLayer(8, 200000), 4);
  EXPECT_EQ(PinsPerLayer(9, 10000000), 4);  // cap/2 rounds down
  EXPECT_EQ(PinsPerLayer(1, 10000000), 0);
}

TEST_F(ExpertStoreTest, UsageHistoryRoundTripsAndRefusesBadFiles) {
  const std::string path = dir_ + "/.coli_usage";
  UsageHistory h(kMoeLayers, kExperts);
  h.Record(0, 4, 7);
  h.Record(1, 2, 3);
  h.Record(1, 5, 3);
  ASSERT_OK(h.Save(path));
  ASSERT_OK_AND_ASSIGN(UsageHistory back, UsageHistory::Load(path, kMoeLayers, kExperts));
  EXPECT_EQ(back.total(), 13u);
  EXPECT_EQ(back.count(0, 4), 7u);
  EXPECT_EQ(back.count(1, 5), 3u);
  EXPECT_THAT(back.Hottest(1, 5), ElementsAre(2, 5));  // ties: lower id first; zeros left out
  EXPECT_THAT(back.Hottest(0, 1), ElementsAre(4));
  // Missing file: empty history.
  ASSERT_OK_AND_ASSIGN(UsageHistory none, UsageHistory::Load(dir_ + "/nope", kMoeLayers, kExperts));
  EXPECT_EQ(none.total(), 0u);
  // Another model's history.
  EXPECT_THAT(UsageHistory::Load(path, kMoeLayers, kExperts + 1),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr(path)));
  EXPECT_THAT(UsageHistory::Load(path, {1, 4}, kExperts),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("decoder layer 3")));
  // A flipped byte.
  std::string bytes = h.Serialize();
  bytes[40] ^= 1;
  ASSERT_OK(io::WriteFileAtomic(path, bytes));
  EXPECT_THAT(UsageHistory::Load(path, kMoeLayers, kExperts),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("checksum")));
  ASSERT_OK(io::WriteFileAtomic(path, "hello"));
  EXPECT_THAT(UsageHistory::Load(path, kMoeLayers, kExperts),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("not a .coli_usage file")));
}

TEST_F(ExpertStoreTest, RecordsUsageAndSavesItAtomically) {
  WriteSnapshot(dir_, Arrangement::kContiguous);
  ASSERT_OK_AND_ASSIGN(auto snapshot, st::Snapshot::Open(dir_));
  ExpertStoreOptions options = WithCap(2);
  options.usage_path = dir_ + "/.coli_usage";
  {
    ASSERT_OK_AND_ASSIGN(auto store, StreamingExpertStore::Open(snapshot.get(), Layout(), options));
    ASSERT_OK(CheckedCall(store.get(), 3, {1, 1, 4}));
    ASSERT_OK(CheckedCall(store.get(), 1, {0}));
    EXPECT_EQ(store->usage().total(), 4u);
  }  // saved on destruction
  ASSERT_OK_AND_ASSIGN(UsageHistory h,
                       UsageHistory::Load(options.usage_path, kMoeLayers, kExperts));
  EXPECT_EQ(h.total(), 4u);
  EXPECT_EQ(h.count(1, 1), 2u);
  EXPECT_EQ(h.count(1, 4), 1u);
  EXPECT_EQ(h.count(0, 0), 1u);
  // The next run continues the history; a corrupt file is ignored, not fatal.
  {
    ASSERT_OK_AND_ASSIGN(auto store, StreamingExpertStore::Open(snapshot.get(), Layout(), options));
    EXPECT_EQ(store->usage().total(), 4u);
    ASSERT_OK(CheckedCall(store.get(), 1, {0}));
    ASSERT_OK(store->SaveUsage());
  }
  ASSERT_OK_AND_ASSIGN(h, UsageHistory::Load(options.usage_path, kMoeLayers, kExperts));
  EXPECT_EQ(h.total(), 5u);
  ASSERT_OK(io::WriteFileAtomic(options.usage_path, "garbage"));
  ASSERT_OK_AND_ASSIGN(auto store, StreamingExpertStore::Open(snapshot.get(), Layout(), options));
  EXPECT_EQ(store->usage().total(), 0u);
}

TEST_F(ExpertStoreTest, PinnedExpertsAreNeverEvicted) {
  WriteSnapshot(dir_, Arrangement::kContiguous);
  ASSERT_OK_AND_ASSIGN(auto snapshot, st::Snapshot::Open(dir_));
  UsageHistory h(kMoeLayers, kExperts);
  h.Record(0, 4, 150000);
  h.Record(0, 2, 50000);
  h.Record(0, 1, 10);
  h.Record(1, 5, 200000);
  const std::string path = dir_ + "/.coli_usage";
  ASSERT_OK(h.Save(path));
  ExpertStoreOptions options = WithCap(4);  // history ≥ 200,000: cap/2 = 2 pins per layer
  options.usage_path = path;
  options.save_usage = false;
  ASSERT_OK_AND_ASSIGN(auto store, StreamingExpertStore::Open(snapshot.get(), Layout(), options));
  EXPECT_THAT(store->PinnedExperts(1), ElementsAre(2, 4));
  EXPECT_THAT(store->PinnedExperts(3), ElementsAre(5));  // only one expert with any history
  EXPECT_EQ(store->TakeStats().bytes_read, 0u);          // the preload is not a token
  std::mt19937 rng(3);
  for (int round = 0; round < 30; ++round) {
    std::vector<int32_t> experts = {static_cast<int32_t>(rng() % kExperts),
                                    static_cast<int32_t>(rng() % kExperts)};
    ASSERT_OK(CheckedCall(store.get(), 1, experts));
    ASSERT_OK(CheckedCall(store.get(), 3, experts));
    EXPECT_THAT(store->PinnedExperts(1), ElementsAre(2, 4));
    EXPECT_THAT(store->PinnedExperts(3), ElementsAre(5));
    EXPECT_LE(store->CachedExperts(1).size(), 2u);  // cap 4 − 2 pinned
    EXPECT_LE(store->CachedExperts(3).size(), 3u);
  }
  store->TakeStats();
  ASSERT_OK(CheckedCall(store.get(), 1, {4, 2}));
  const ExpertStoreStats s = store->TakeStats();
  EXPECT_EQ(s.hits, 2u);
  EXPECT_EQ(s.bytes_read, 0u);
  // Below 5,000 recorded selections nothing is pinned.
  UsageHistory small(kMoeLayers, kExperts);
  small.Record(0, 4, 4999);
  ASSERT_OK(small.Save(path));
  ASSERT_OK_AND_ASSIGN(auto unpinned,
                       StreamingExpertStore::Open(snapshot.get(), Layout(), options));
  EXPECT_TRUE(unpinned->PinnedExperts(1).empty());
}

TEST_F(ExpertStoreTest, TruncatedOrReplacedShardFailsTheRequestAndTheStoreLives) {
  WriteSnapshot(dir_, Arrangement::kContiguous);
  ASSERT_OK_AND_ASSIGN(auto snapshot, st::Snapshot::Open(dir_));
  for (bool pipe : {true, false}) {
    ExpertStoreOptions options = WithCap(1);
    options.pipe = pipe;
    ASSERT_OK_AND_ASSIGN(auto store, StreamingExpertStore::Open(snapshot.get(), Layout(), options));
    ASSERT_OK(CheckedCall(store.get(), 3, {2}));  // cached before the damage
    const std::string shard3 = dir_ + "/model-00002-of-000002.safetensors";
    const std::string backup = dir_ + "/backup";
    fs::copy_file(shard3, backup, fs::copy_options::overwrite_existing);
    fs::resize_file(shard3, fs::file_size(shard3) / 2);
    EXPECT_THAT(CheckedCall(store.get(), 3, {0, 4}),
                StatusIs(absl::StatusCode::kDataLoss,
                         ::testing::AllOf(HasSubstr(shard3), HasSubstr("changed size"))));
    // Other layers and cached experts still work.
    ASSERT_OK(CheckedCall(store.get(), 1, {0, 1, 2, 3, 4, 5}));
    ASSERT_OK(CheckedCall(store.get(), 3, {2}));
    // Replaced by a complete copy: still refused (the store read the old file's layout).
    fs::rename(backup, shard3);
    EXPECT_THAT(CheckedCall(store.get(), 3, {0}),
                StatusIs(absl::StatusCode::kDataLoss, HasSubstr("was replaced")));
    ASSERT_OK(CheckedCall(store.get(), 1, {5}));
  }
}

TEST_F(ExpertStoreTest, ShardsSplitAcrossTwoDirectories) {
  const std::string second = dir_ + "/drive2";
  WriteSnapshot(dir_ + "/drive1", Arrangement::kContiguous, second);
  ASSERT_FALSE(fs::exists(dir_ + "/drive1/model-00002-of-000002.safetensors"));
  ASSERT_OK_AND_ASSIGN(auto snapshot,
                       st::Snapshot::Open(dir_ + "/drive1", st::SnapshotOptions{{second}}));
  ASSERT_OK_AND_ASSIGN(auto store,
                       StreamingExpertStore::Open(snapshot.get(), Layout(), WithCap(2)));
  for (int layer : kMoeLayers) ASSERT_OK(CheckedCall(store.get(), layer, {5, 4, 3, 2, 1, 0}));
  const ExpertStoreStats stats = store->TakeStats();
  EXPECT_EQ(stats.misses, 2u * kExperts);
  EXPECT_EQ(stats.preads, stats.misses);  // default: one read per contiguous expert
}

TEST_F(ExpertStoreTest, CallbackErrorEndsTheCallAndTheStoreStaysUsable) {
  WriteSnapshot(dir_, Arrangement::kContiguous);
  ASSERT_OK_AND_ASSIGN(auto snapshot, st::Snapshot::Open(dir_));
  for (bool pipe : {true, false}) {
    ExpertStoreOptions options = WithCap(2);
    options.pipe = pipe;
    ASSERT_OK_AND_ASSIGN(auto store, StreamingExpertStore::Open(snapshot.get(), Layout(), options));
    int calls = 0;
    absl::Status s = store->ForEachExpert(1, std::vector<int32_t>{0, 1, 2, 3, 4},
                                          [&](int, const ExpertWeights&) -> absl::Status {
                                            if (++calls == 2) return absl::CancelledError("stop");
                                            return absl::OkStatus();
                                          });
    EXPECT_THAT(s, StatusIs(absl::StatusCode::kCancelled, HasSubstr("stop")));
    EXPECT_EQ(calls, 2);
    EXPECT_LE(store->CachedExperts(1).size(), 2u);
    for (int round = 0; round < 3; ++round) {
      ASSERT_OK(CheckedCall(store.get(), 1, {4, 3, 2, 1, 0}));
    }
  }
}

TEST_F(ExpertStoreTest, RefusesBadArguments) {
  WriteSnapshot(dir_, Arrangement::kContiguous);
  ASSERT_OK_AND_ASSIGN(auto snapshot, st::Snapshot::Open(dir_));
  ASSERT_OK_AND_ASSIGN(auto store,
                       StreamingExpertStore::Open(snapshot.get(), Layout(), WithCap(2)));
  auto noop = [](int, const ExpertWeights&) { return absl::OkStatus(); };
  EXPECT_THAT(store->ForEachExpert(2, std::vector<int32_t>{0}, noop),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("layer 2")));
  EXPECT_THAT(store->ForEachExpert(1, std::vector<int32_t>{kExperts}, noop),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("expert 6 out of range")));
  EXPECT_THAT(store->ForEachExpert(1, std::vector<int32_t>{-1}, noop),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_OK(store->ForEachExpert(1, std::vector<int32_t>{}, noop));
  ExpertStoreOptions options = WithCap(2);
  options.load_threads = 0;
  EXPECT_THAT(StreamingExpertStore::Open(snapshot.get(), Layout(), options),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("K3_LOAD_THREADS")));
  options = WithCap(2);
  options.read_pieces = -1;
  EXPECT_THAT(StreamingExpertStore::Open(snapshot.get(), Layout(), options),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("read_pieces")));
  ExpertStoreLayout wrong = Layout();
  wrong.inter = 96;  // the file says 64
  EXPECT_THAT(StreamingExpertStore::Open(snapshot.get(), wrong, WithCap(2)),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("w1.weight_packed")));
}

}  // namespace
}  // namespace coli::k3
