// Checkpoints of a session's recurrent state: restoring one and continuing must give the logits
// of a fresh session run on the same tokens, bit for bit (the reference is a second session
// that never restored anything); the cache picks the deepest checkpoint both sequences begin
// with and drops the least recently used.
#include "plugins/kimi_k3/checkpoints.h"

#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <vector>

#include "common/io/io.h"
#include "common/status/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "plugins/kimi_k3/model.h"
#include "plugins/kimi_k3/session.h"

namespace coli::k3 {
namespace {

using ::coli::testing::StatusIs;

std::vector<int32_t> Ids(int n, int seed) {
  std::vector<int32_t> ids(n);
  for (int i = 0; i < n; ++i) ids[i] = (seed * 7919 + i * 104729) % 250 + 3;
  return ids;
}

std::vector<int32_t> Concat(std::vector<int32_t> a, const std::vector<int32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

Checkpoint At(std::vector<int32_t> tokens, bool logits) {
  Checkpoint c;
  c.tokens = std::move(tokens);
  if (logits) c.logits = {1.0f};
  return c;
}

class CheckpointSessionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ModelOptions o;
    o.chunk = 5;  // chunk borders away from the checkpoint positions
    auto model = Model::Load(K3_TEST_TINY, o);
    ASSERT_OK(model.status());
    model_ = std::move(model).value();
  }
  std::vector<float> Fresh(const std::vector<int32_t>& tokens) {
    auto s = model_->NewSession();
    auto logits = s->Prefill(tokens);
    EXPECT_OK(logits.status());
    return logits.ok() ? *logits : std::vector<float>();
  }
  std::unique_ptr<Model> model_;
};

TEST_F(CheckpointSessionTest, RestoreThenContinueEqualsAFreshSession) {
  const std::vector<int32_t> a = Ids(23, 1), b = Ids(17, 2), c = Ids(12, 3);
  auto s = model_->NewSession();
  auto la = s->Prefill(a);
  ASSERT_OK(la.status());
  const Checkpoint at_a = s->TakeCheckpoint(*la);
  EXPECT_EQ(at_a.tokens, a);
  EXPECT_GT(at_a.bytes(), a.size() * sizeof(int32_t));
  ASSERT_OK(s->Prefill(b).status());
  ASSERT_OK(s->Step(5).status());  // decode past the checkpoint too
  ASSERT_OK(s->Restore(at_a));
  EXPECT_EQ(s->tokens(), a);
  auto lc = s->Prefill(c);
  ASSERT_OK(lc.status());
  EXPECT_TRUE(SameBits(*lc, Fresh(Concat(a, c))));
  // A step after the restored prefill also matches.
  auto step = s->Step(9);
  ASSERT_OK(step.status());
  auto ref = model_->NewSession();
  ASSERT_OK(ref->Prefill(Concat(a, c)).status());
  auto ref_step = ref->Step(9);
  ASSERT_OK(ref_step.status());
  EXPECT_TRUE(SameBits(*step, *ref_step));
}

// A prefill interrupted between two layers of a chunk (the seed: long prefill polls CANCEL
// between layers) answers CANCELLED, keeps exactly the chunks before it (chunks of 5 here) and
// drops the one in flight, so the session continues as if that chunk never started: the
// remaining tokens then give a fresh session's logits bit for bit, and so does a decode step.
TEST_F(CheckpointSessionTest, InterruptBetweenLayersDropsOnlyTheChunkInFlight) {
  const std::vector<int32_t> prompt = Ids(23, 6);
  for (int stop_at : {1, 3, 7}) {  // the interrupt's n-th question: layer boundary n of a chunk
    auto s = model_->NewSession();
    int asked = 0;
    int chunks_started = 0;
    Session::Cancel cancel = [&]() {
      ++chunks_started;
      return false;
    };
    // Let the first two chunks (10 tokens) finish, then stop inside the third.
    Session::Cancel interrupt = [&]() { return chunks_started >= 3 && ++asked >= stop_at; };
    EXPECT_THAT(s->Prefill(prompt, nullptr, cancel, interrupt),
                StatusIs(absl::StatusCode::kCancelled))
        << "stop_at " << stop_at;
    EXPECT_EQ(asked, stop_at);
    EXPECT_EQ(s->tokens(), std::vector<int32_t>(prompt.begin(), prompt.begin() + 10));
    auto rest = s->Prefill(std::vector<int32_t>(prompt.begin() + 10, prompt.end()));
    ASSERT_OK(rest.status()) << "the session stays usable";
    EXPECT_TRUE(SameBits(*rest, Fresh(prompt))) << "stop_at " << stop_at;
    auto step = s->Step(11);
    ASSERT_OK(step.status());
    auto ref = model_->NewSession();
    ASSERT_OK(ref->Prefill(prompt).status());
    auto ref_step = ref->Step(11);
    ASSERT_OK(ref_step.status());
    EXPECT_TRUE(SameBits(*step, *ref_step)) << "stop_at " << stop_at;
  }
  // Never interrupted: the same logits as without an interrupt.
  auto s = model_->NewSession();
  auto all = s->Prefill(prompt, nullptr, nullptr, [] { return false; });
  ASSERT_OK(all.status());
  EXPECT_TRUE(SameBits(*all, Fresh(prompt)));
}

TEST_F(CheckpointSessionTest, RestoreRefusesACheckpointOffTheRecord) {
  auto s = model_->NewSession();
  auto la = s->Prefill(Ids(10, 4));
  ASSERT_OK(la.status());
  const Checkpoint ck = s->TakeCheckpoint(*la);
  s->Reset();
  ASSERT_OK(s->Prefill(Ids(12, 5)).status());
  EXPECT_THAT(s->Restore(ck), StatusIs(absl::StatusCode::kFailedPrecondition,
                                       ::testing::HasSubstr("not on this session's record")));
  EXPECT_EQ(s->tokens(), Ids(12, 5));  // nothing changed
}

// Parked in a folder: the same restore, read back from its file; the file goes when the cache
// drops it; a damaged file is never restored.
TEST_F(CheckpointSessionTest, ParkedCheckpointsRestoreFromTheirFiles) {
  const std::string dir = ::testing::TempDir() + "/k3_ckpt_" + std::to_string(getpid());
  std::filesystem::create_directories(dir);
  auto files = [&] {
    return std::distance(std::filesystem::directory_iterator(dir),
                         std::filesystem::directory_iterator());
  };
  const std::vector<int32_t> a = Ids(19, 6), b = Ids(9, 7), c = Ids(14, 8);
  {
    CheckpointCache cache(2, dir);
    auto s = model_->NewSession();
    auto la = s->Prefill(a);
    ASSERT_OK(la.status());
    ASSERT_OK(cache.Put(s->TakeCheckpoint(*la)));
    EXPECT_EQ(files(), 1);
    EXPECT_GT(cache.bytes(), 0u);
    ASSERT_OK(s->Prefill(b).status());
    const std::vector<int32_t> prompt = Concat(a, c);
    const Checkpoint* ck = cache.Deepest(prompt, s->tokens());
    ASSERT_NE(ck, nullptr);
    ASSERT_OK(s->Restore(*ck));
    auto lc = s->Prefill(c);
    ASSERT_OK(lc.status());
    EXPECT_TRUE(SameBits(*lc, Fresh(prompt)));
    // The prompt `a` alone is covered by the parked logits.
    ck = cache.Deepest(a, s->tokens());
    ASSERT_NE(ck, nullptr);
    EXPECT_TRUE(SameBits(ck->logits, *la));

    // Damage the file: the checkpoint is dropped (with its file), nothing is restored.
    for (const auto& f : std::filesystem::directory_iterator(dir)) {
      std::fstream io(f.path(), std::ios::in | std::ios::out | std::ios::binary);
      io.seekp(40);
      io.put('\x7f');
    }
    EXPECT_EQ(cache.Deepest(prompt, s->tokens()), nullptr);
    EXPECT_EQ(cache.size(), 0u);
    EXPECT_EQ(files(), 0);
    // Two slots: the third Put drops the least recently used file.
    for (int i = 1; i <= 3; ++i) {
      ASSERT_OK(cache.Put(At(Ids(i, 9), true)));
    }
    EXPECT_EQ(files(), 2);
  }
  EXPECT_EQ(files(), 0) << "the cache removes its files when it goes";
}

TEST(CheckpointFile, RoundTripAndRefusals) {
  Checkpoint c;
  c.tokens = {4, 5, 6};
  c.kda.resize(3);
  c.kda[0].S = {1.5f, -2.0f};
  c.kda[0].q_win = {3.0f};
  c.kda[2].v_win = {7.0f, 8.0f, 9.0f};
  c.logits = {0.25f, 0.5f};
  const std::string bytes = SerializeCheckpoint(c);
  auto back = ParseCheckpoint(bytes);
  ASSERT_OK(back.status());
  EXPECT_EQ(back->tokens, c.tokens);
  EXPECT_EQ(back->kda.size(), 3u);
  EXPECT_EQ(back->kda[0].S, c.kda[0].S);
  EXPECT_EQ(back->kda[0].q_win, c.kda[0].q_win);
  EXPECT_EQ(back->kda[2].v_win, c.kda[2].v_win);
  EXPECT_TRUE(back->kda[1].S.empty());
  EXPECT_EQ(back->logits, c.logits);
  EXPECT_THAT(ParseCheckpoint(bytes.substr(0, bytes.size() - 3)),
              StatusIs(absl::StatusCode::kDataLoss));
  EXPECT_THAT(ParseCheckpoint("not a checkpoint at all, really"),
              StatusIs(absl::StatusCode::kDataLoss, ::testing::HasSubstr("not a coli")));
  std::string flipped = bytes;
  flipped[20] ^= 1;
  EXPECT_THAT(ParseCheckpoint(flipped),
              StatusIs(absl::StatusCode::kDataLoss, ::testing::HasSubstr("checksum")));
}

TEST(CheckpointCache, DeepestCommonPrefixOfPromptAndRecord) {
  CheckpointCache cache(4);
  const std::vector<int32_t> record = {1, 2, 3, 4, 5, 6};
  ASSERT_OK(cache.Put(At({1, 2}, true)));
  ASSERT_OK(cache.Put(At({1, 2, 3, 4}, true)));
  ASSERT_OK(cache.Put(At({1, 2, 3, 4, 5, 6}, false)));
  ASSERT_OK(cache.Put(At({9, 9, 9}, true)));  // on another record
  // Prompt diverges at index 4: the checkpoint at 4 is the deepest valid one.
  const std::vector<int32_t> prompt = {1, 2, 3, 4, 7, 8};
  const Checkpoint* c = cache.Deepest(prompt, record);
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(c->tokens.size(), 4u);
  // A prompt equal to a checkpoint's tokens needs that checkpoint's logits.
  const std::vector<int32_t> whole = {1, 2, 3, 4, 5, 6};
  c = cache.Deepest(whole, record);
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(c->tokens.size(), 4u);
  const std::vector<int32_t> four = {1, 2, 3, 4};
  c = cache.Deepest(four, record);
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(c->tokens.size(), 4u);
  // Not on the record: never chosen.
  const std::vector<int32_t> other = {9, 9, 9, 1};
  EXPECT_EQ(cache.Deepest(other, record), nullptr);
}

TEST(CheckpointCache, LeastRecentlyUsedIsDroppedAndSameTokensReplace) {
  CheckpointCache cache(2);
  const std::vector<int32_t> record = {1, 2, 3, 4};
  ASSERT_OK(cache.Put(At({1}, true)));
  ASSERT_OK(cache.Put(At({1, 2}, true)));
  ASSERT_NE(cache.Deepest(std::vector<int32_t>{1, 5}, record), nullptr);  // uses {1}
  ASSERT_OK(cache.Put(At({1, 2, 3}, true)));                              // drops {1, 2}
  EXPECT_EQ(cache.size(), 2u);
  const Checkpoint* c = cache.Deepest(std::vector<int32_t>{1, 2, 9}, record);
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(c->tokens.size(), 1u);
  ASSERT_OK(cache.Put(At({1, 2, 3}, true)));  // same tokens: replaced, not added
  EXPECT_EQ(cache.size(), 2u);
  CheckpointCache off(0);
  ASSERT_OK(off.Put(At({1}, true)));
  EXPECT_EQ(off.size(), 0u);
}

// Files no process will use again go when a model loads: a gone pid's parked files and their
// unfinished writes, a kept entry's write that died, kept entries unused for two weeks; a
// running process's files, recent kept entries, writes in progress and other files stay.
TEST(ParkedFiles, OrphansOfEndedProcessesAreRemoved) {
  namespace fs = std::filesystem;
  const std::string dir = ::testing::TempDir() + "/k3_orphans_" + std::to_string(getpid());
  fs::remove_all(dir);
  fs::create_directories(dir);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) _exit(0);
  ASSERT_EQ(waitpid(child, nullptr, 0), child);  // reaped: its pid is free
  const std::string dead = std::to_string(child), alive = std::to_string(getpid());
  const std::string kept = "coli-k3-prefix-keep-0123456789abcdef-00ff-";
  const std::vector<std::string> gone = {
      "coli-k3-ckpt-" + dead + "-94000-0.bin", "coli-k3-prefix-" + dead + "-94000-3.bin",
      // the temp files of writes that died with it
      ".coli-k3-ckpt-" + dead + "-94000-1.bin.tmp.AbCdEf",
      ".coli-k3-prefix-" + dead + "-94000-4.bin.tmp.XyZabc",
      // a kept entry's write that died 11 minutes ago; kept entries unused for 15 days
      "." + kept + "1.bin.tmp.QwErTy", kept + "2.bin",
      "coli-k3-prefix-keep-fedcba9876543210-00aa-0.bin"};
  const std::vector<std::string> stay = {
      "coli-k3-ckpt-" + alive + "-94000-0.bin", ".coli-k3-ckpt-" + alive + "-94000-1.bin.tmp.Aa",
      kept + "0.bin",                  // used a day ago
      "." + kept + "3.bin.tmp.UiOpAs",  // a write in progress
      "coli-k3-ckpt-" + dead + "-94000-0.bin.part", "coli-k3-ckpt-nopid-1.bin", "notes.bin"};
  const auto now = fs::file_time_type::clock::now();
  for (const std::string& name : gone) std::ofstream(dir + "/" + name) << "x";
  for (const std::string& name : stay) std::ofstream(dir + "/" + name) << "x";
  fs::last_write_time(dir + "/." + kept + "1.bin.tmp.QwErTy", now - std::chrono::minutes(11));
  fs::last_write_time(dir + "/" + kept + "2.bin", now - std::chrono::hours(24 * 15));
  fs::last_write_time(dir + "/coli-k3-prefix-keep-fedcba9876543210-00aa-0.bin",
                      now - std::chrono::hours(24 * 15));
  fs::last_write_time(dir + "/" + kept + "0.bin", now - std::chrono::hours(24));
  // A link named like an orphan is not this user's regular file: left alone.
  fs::create_symlink(dir + "/notes.bin", dir + "/coli-k3-ckpt-" + dead + "-1-1.bin");
  EXPECT_EQ(RemoveOrphanedParkedFiles(dir), static_cast<int>(gone.size()));
  for (const std::string& name : gone) EXPECT_FALSE(fs::exists(dir + "/" + name)) << name;
  for (const std::string& name : stay) EXPECT_TRUE(fs::exists(dir + "/" + name)) << name;
  EXPECT_TRUE(fs::is_symlink(dir + "/coli-k3-ckpt-" + dead + "-1-1.bin"));
  EXPECT_EQ(RemoveOrphanedParkedFiles(dir + "/missing"), 0);
  fs::remove_all(dir);
}

TEST(CheckpointCache, LastMessageStartIsAfterTheSecondToLastEnd) {
  const int32_t e = 99;
  EXPECT_EQ(LastMessageStart(std::vector<int32_t>{5, e, 6, 7, e, 8}, e), 2);
  EXPECT_EQ(LastMessageStart(std::vector<int32_t>{5, e, 6, e, 7, e, 8}, e), 4);
  EXPECT_EQ(LastMessageStart(std::vector<int32_t>{5, 6, e, 8}, e), -1);
  EXPECT_EQ(LastMessageStart(std::vector<int32_t>{}, e), -1);
}

}  // namespace
}  // namespace coli::k3
