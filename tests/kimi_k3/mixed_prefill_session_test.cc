// Mixed passes in kimi_k3_core: Session::Prefill carrying decode rows of other sessions
// (Riders) in its chunk passes, on the tiny fixture (build/fixtures/k3_tiny). The reference is
// twin sessions run alone — Prefill for the prompt, Step for each decode row — and every logit
// must match bit for bit (each kernel is row-independent; MLA attends per row to its own cache,
// KDA advances each state over its own rows, the MoE sums each row's experts in a fixed order).
// Also: refusals change nothing and run the chunk alone, a failed mixed pass breaks every
// session of it, an interrupt with riders aboard lands at the chunk's end, K3_TRACE never
// boards, K3_LOGITS dumps the prompt's rows only, and the pass's MoE counts are shared by rows.
#include <atomic>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/sampling/sampling.h"
#include "common/status/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "plugins/kimi_k3/model.h"
#include "plugins/kimi_k3/session.h"
#include "tests/kimi_k3/batched_decode_util.h"
#include "tests/kimi_k3/core_test_util.h"

namespace coli::k3 {
namespace {

using ::coli::testing::StatusIs;
using ::testing::HasSubstr;

using ::coli::k3::batched_test::Ids;

using core_test::SameBits;

ModelOptions Chunked(int chunk) {
  ModelOptions o;
  o.chunk = chunk;
  return o;
}

std::unique_ptr<Model> Load(const ModelOptions& o, std::atomic<bool>* fail = nullptr) {
  return core_test::LoadTiny(K3_TEST_TINY, o, fail);
}

// Boards, before chunk pass c (0-based), the sessions plan(c) names with their next token
// (`next`, advanced greedily from the logits each gets); records every outcome.
class TestRiders : public Riders {
 public:
  struct Outcome {
    int chunk;
    std::vector<Session*> sessions;
    std::vector<int32_t> tokens;
    absl::StatusOr<std::vector<std::vector<float>>> logits;
    bool ran;
  };
  TestRiders(std::function<std::vector<Session*>(int)> plan, std::map<Session*, int32_t>* next)
      : plan_(std::move(plan)), next_(next) {}

  void Board(int64_t chunk_rows, std::vector<Session*>* sessions,
             std::vector<int32_t>* tokens) override {
    chunk_rows_.push_back(chunk_rows);
    pending_ = plan_(boards_++);
    for (Session* s : pending_) {
      sessions->push_back(s);
      tokens->push_back((*next_)[s]);
    }
  }
  void Alight(absl::StatusOr<std::vector<std::vector<float>>> logits, bool ran) override {
    Outcome o{boards_ - 1, pending_, {}, logits, ran};
    for (Session* s : pending_) o.tokens.push_back((*next_)[s]);
    if (ran && logits.ok()) {
      for (size_t i = 0; i < pending_.size(); ++i)
        (*next_)[pending_[i]] = sampling::Greedy((*logits)[i]);
    }
    outcomes.push_back(std::move(o));
    pending_.clear();
  }

  std::vector<Outcome> outcomes;
  std::vector<int64_t> chunk_rows_;
  int boards_ = 0;

 private:
  std::function<std::vector<Session*>(int)> plan_;
  std::map<Session*, int32_t>* next_;
  std::vector<Session*> pending_;
};

// A prefilled session and its twin, with the greedy next token after the prompt.
struct Pair {
  std::unique_ptr<Session> mixed, alone;
};

Pair Prefilled(const Model& model, const std::vector<int32_t>& prompt,
               std::map<Session*, int32_t>* next) {
  Pair p{model.NewSession(), model.NewSession()};
  auto a = p.mixed->Prefill(prompt);
  auto b = p.alone->Prefill(prompt);
  EXPECT_OK(a.status());
  EXPECT_OK(b.status());
  if (a.ok()) (*next)[p.mixed.get()] = sampling::Greedy(*a);
  return p;
}

// Each carried row's logits equal its twin's Step on the same token, in boarding order (the
// twins replay the rides one by one), and the records end equal.
void ExpectRidesMatchTwins(const TestRiders& riders, const std::map<Session*, Session*>& twin) {
  for (const auto& o : riders.outcomes) {
    SCOPED_TRACE(::testing::Message() << "chunk " << o.chunk);
    ASSERT_TRUE(o.ran);
    ASSERT_OK(o.logits.status());
    ASSERT_EQ(o.logits->size(), o.sessions.size());
    for (size_t i = 0; i < o.sessions.size(); ++i) {
      auto want = twin.at(o.sessions[i])->Step(o.tokens[i]);
      ASSERT_OK(want.status());
      EXPECT_TRUE(SameBits((*o.logits)[i], *want)) << "rider " << i;
    }
  }
  // Every carried token is on its session's record, in order.
  for (const auto& [mixed, alone] : twin) EXPECT_EQ(mixed->tokens(), alone->tokens());
}

TEST(K3MixedPrefill, RidersAndChunksBitIdenticalToAlone) {
  auto model = Load(Chunked(4));
  ASSERT_NE(model, nullptr);
  std::map<Session*, int32_t> next;
  Pair b = Prefilled(*model, Ids(5, 2), &next), c = Prefilled(*model, Ids(9, 3), &next),
       d = Prefilled(*model, Ids(2, 4), &next);
  const std::map<Session*, Session*> twin = {{b.mixed.get(), b.alone.get()},
                                             {c.mixed.get(), c.alone.get()},
                                             {d.mixed.get(), d.alone.get()}};
  // 18 prompt rows: chunks of 4, 4, 4, 4, 2. Riders change from pass to pass (none on pass 2).
  TestRiders riders(
      [&](int chunk) -> std::vector<Session*> {
        switch (chunk) {
          case 0:
            return {b.mixed.get(), c.mixed.get()};
          case 1:
            return {c.mixed.get(), d.mixed.get(), b.mixed.get()};
          case 2:
            return {};
          default:
            return {d.mixed.get()};
        }
      },
      &next);
  const std::vector<int32_t> prompt = Ids(18, 1);
  auto a = model->NewSession(), a_alone = model->NewSession();
  auto got = a->Prefill(prompt, nullptr, nullptr, nullptr, &riders);
  auto want = a_alone->Prefill(prompt);
  ASSERT_OK(got.status());
  ASSERT_OK(want.status());
  EXPECT_TRUE(SameBits(*got, *want));
  EXPECT_EQ(riders.chunk_rows_, (std::vector<int64_t>{4, 4, 4, 4, 2}));
  ASSERT_EQ(riders.outcomes.size(), 4u);  // no Alight after a pass nobody boarded
  ExpectRidesMatchTwins(riders, twin);
  // A goes on exactly like its twin.
  int32_t t = sampling::Greedy(*got);
  for (int step = 0; step < 4; ++step) {
    auto x = a->Step(t);
    auto y = a_alone->Step(t);
    ASSERT_OK(x.status());
    ASSERT_OK(y.status());
    EXPECT_TRUE(SameBits(*x, *y)) << "step " << step;
    t = sampling::Greedy(*x);
  }
  // The pass's MoE rows are shared by rows: the chunk's to A, one row's to each rider — so every
  // session counts exactly what its twin counts alone.
  EXPECT_EQ(a->timings().moe_stats.rows, a_alone->timings().moe_stats.rows);
  for (const auto& [m, alone] : twin) {
    EXPECT_EQ(m->timings().moe_stats.rows, alone->timings().moe_stats.rows);
  }
}

TEST(K3MixedPrefill, RefusedRidersChangeNothingAndTheChunkRunsAlone) {
  ModelOptions o = Chunked(4);
  o.max_context = 12;
  auto model = Load(o);
  auto other = Load(Chunked(4));
  ASSERT_NE(model, nullptr);
  ASSERT_NE(other, nullptr);
  std::map<Session*, int32_t> next;
  auto b = model->NewSession(), full = model->NewSession();
  auto foreign = other->NewSession();
  ASSERT_OK(b->Prefill(Ids(3, 2)).status());
  ASSERT_OK(full->Prefill(Ids(12, 3)).status());
  ASSERT_OK(foreign->Prefill(Ids(3, 4)).status());
  next[b.get()] = 5;
  next[full.get()] = 6;
  next[foreign.get()] = 7;
  auto a = model->NewSession(), a_alone = model->NewSession();
  next[a.get()] = 8;
  TestRiders riders(
      [&](int chunk) -> std::vector<Session*> {
        switch (chunk) {
          case 0:
            return {b.get(), a.get()};  // the prefilling session itself
          case 1:
            return {foreign.get()};  // another model's session
          default:
            return {b.get(), full.get()};  // a session at K3_MAXT
        }
      },
      &next);
  const std::vector<int32_t> prompt = Ids(10, 1);
  auto got = a->Prefill(prompt, nullptr, nullptr, nullptr, &riders);
  auto want = a_alone->Prefill(prompt);
  ASSERT_OK(got.status());
  ASSERT_OK(want.status());
  EXPECT_TRUE(SameBits(*got, *want));
  ASSERT_EQ(riders.outcomes.size(), 3u);
  for (const auto& o : riders.outcomes) EXPECT_FALSE(o.ran) << "chunk " << o.chunk;
  EXPECT_THAT(riders.outcomes[0].logits.status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("prefilling session")));
  EXPECT_THAT(riders.outcomes[1].logits.status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("another model")));
  EXPECT_THAT(riders.outcomes[2].logits.status(),
              StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("row 1")));
  EXPECT_EQ(b->position(), 3);
  EXPECT_EQ(full->position(), 12);
  EXPECT_EQ(foreign->position(), 3);
  EXPECT_EQ(a->position(), 10);
}

TEST(K3MixedPrefill, FailedMixedPassBreaksEverySessionOfIt) {
  std::atomic<bool> fail{false};
  auto model = Load(Chunked(4), &fail);
  ASSERT_NE(model, nullptr);
  std::map<Session*, int32_t> next;
  auto b = model->NewSession(), c = model->NewSession(), e = model->NewSession();
  ASSERT_OK(b->Prefill(Ids(3, 2)).status());
  ASSERT_OK(c->Prefill(Ids(4, 3)).status());
  ASSERT_OK(e->Prefill(Ids(5, 4)).status());
  next[b.get()] = 5;
  next[c.get()] = 6;
  TestRiders riders(
      [&](int chunk) -> std::vector<Session*> {
        if (chunk == 1) {
          fail = true;  // the second pass (with riders) fails
          return {b.get(), c.get()};
        }
        return {};
      },
      &next);
  auto a = model->NewSession();
  EXPECT_THAT(a->Prefill(Ids(12, 1), nullptr, nullptr, nullptr, &riders),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("expert read failed")));
  fail = false;
  ASSERT_EQ(riders.outcomes.size(), 1u);
  EXPECT_TRUE(riders.outcomes[0].ran);
  EXPECT_THAT(riders.outcomes[0].logits.status(), StatusIs(absl::StatusCode::kDataLoss));
  EXPECT_TRUE(a->broken());
  EXPECT_TRUE(b->broken());
  EXPECT_TRUE(c->broken());
  EXPECT_THAT(b->Step(5), StatusIs(absl::StatusCode::kFailedPrecondition));
  EXPECT_FALSE(e->broken());
  EXPECT_OK(e->Step(7).status());  // not in the failed pass
}

// Without riders a true interrupt drops the chunk in flight; with riders aboard the pass
// finishes (their states cannot go back), they get their logits, and Prefill answers CANCELLED
// with that chunk kept.
TEST(K3MixedPrefill, InterruptWithRidersAboardLandsAtTheChunkEnd) {
  auto model = Load(Chunked(4));
  ASSERT_NE(model, nullptr);
  std::map<Session*, int32_t> next;
  Pair b = Prefilled(*model, Ids(5, 2), &next);
  const std::map<Session*, Session*> twin = {{b.mixed.get(), b.alone.get()}};
  const std::vector<int32_t> prompt = Ids(12, 1);
  int asked = 0;
  Session::Cancel interrupt = [&]() {
    ++asked;
    return true;
  };
  auto plain = model->NewSession();
  EXPECT_THAT(plain->Prefill(prompt, nullptr, nullptr, interrupt),
              StatusIs(absl::StatusCode::kCancelled));
  EXPECT_EQ(plain->position(), 0);

  asked = 0;
  TestRiders riders([&](int) { return std::vector<Session*>{b.mixed.get()}; }, &next);
  auto a = model->NewSession();
  EXPECT_THAT(a->Prefill(prompt, nullptr, nullptr, interrupt, &riders),
              StatusIs(absl::StatusCode::kCancelled));
  EXPECT_EQ(asked, 1);  // asked between layers; the true answer was kept, not asked again
  EXPECT_EQ(a->position(), 4);
  EXPECT_FALSE(a->broken());
  ASSERT_EQ(riders.outcomes.size(), 1u);
  ExpectRidesMatchTwins(riders, twin);
  // The kept chunk is right: the rest of the prompt gives the lone prefill's logits.
  auto rest = a->Prefill(std::span<const int32_t>(prompt).subspan(4));
  auto want = model->NewSession()->Prefill(prompt);
  ASSERT_OK(rest.status());
  ASSERT_OK(want.status());
  EXPECT_TRUE(SameBits(*rest, *want));
}

TEST(K3MixedPrefill, TraceNeverBoardsAndLogitsDumpHoldsThePromptOnly) {
  const std::string dir = ::testing::TempDir() + "/k3_mixed_prefill";
  std::filesystem::create_directories(dir);
  ModelOptions traced = Chunked(4);
  traced.trace_path = dir + "/trace.bin";
  auto tmodel = Load(traced);
  ASSERT_NE(tmodel, nullptr);
  std::map<Session*, int32_t> next;
  auto tb = tmodel->NewSession();
  ASSERT_OK(tb->Prefill(Ids(3, 2)).status());
  next[tb.get()] = 5;
  TestRiders never([&](int) { return std::vector<Session*>{tb.get()}; }, &next);
  auto ta = tmodel->NewSession();
  ASSERT_OK(ta->Prefill(Ids(6, 1), nullptr, nullptr, nullptr, &never).status());
  EXPECT_EQ(never.boards_, 0);
  EXPECT_EQ(tb->position(), 3);

  // K3_LOGITS: every prompt row's logits go to the file, the riders' never.
  auto dumped = [&](const std::string& path, bool with_riders) -> std::vector<float> {
    ModelOptions o = Chunked(4);
    o.logits_path = path;
    auto model = Load(o);
    EXPECT_NE(model, nullptr);
    if (model == nullptr) return {};
    std::map<Session*, int32_t> tokens;
    auto b = model->NewSession();
    EXPECT_OK(b->Prefill(Ids(3, 2)).status());
    tokens[b.get()] = 5;
    TestRiders riders([&](int) { return std::vector<Session*>{b.get()}; }, &tokens);
    // Created after b's prefill, so the file (truncated here) holds a's rows only.
    auto a = model->NewSession();
    EXPECT_OK(a->Prefill(Ids(10, 1), nullptr, nullptr, nullptr, with_riders ? &riders : nullptr)
                  .status());
    EXPECT_EQ(riders.outcomes.size(), with_riders ? 3u : 0u);
    EXPECT_EQ(b->position(), with_riders ? 6 : 3);
    a.reset();
    b.reset();
    std::ifstream in(path, std::ios::binary);
    const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::vector<float> floats(bytes.size() / sizeof(float));
    std::memcpy(floats.data(), bytes.data(), floats.size() * sizeof(float));
    return floats;
  };
  const std::vector<float> with = dumped(dir + "/with.bin", true);
  const std::vector<float> without = dumped(dir + "/without.bin", false);
  EXPECT_EQ(with.size(), static_cast<size_t>(10 * tmodel->vocab_size()));
  EXPECT_TRUE(SameBits(with, without));
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace coli::k3
