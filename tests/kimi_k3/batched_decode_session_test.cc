// Session::StepBatch on the tiny fixture (build/fixtures/k3_tiny): several sessions' decode
// steps in one Model::Forward. The reference is Session::Step on twin sessions fed the same
// tokens: logits must match bit for bit. Refusals change nothing; a failed pass (an expert
// source that fails on demand) breaks exactly the sessions of that pass.
#include <atomic>
#include <cstring>
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

std::unique_ptr<Model> Load(const ModelOptions& o, std::atomic<bool>* fail = nullptr) {
  return core_test::LoadTiny(K3_TEST_TINY, o, fail);
}

TEST(K3BatchedStep, LogitsBitIdenticalToStep) {
  auto model = Load(ModelOptions());
  ASSERT_NE(model, nullptr);
  const std::vector<std::vector<int32_t>> prompts = {Ids(6, 1), Ids(13, 2), Ids(3, 3), Ids(9, 4)};
  std::vector<std::unique_ptr<Session>> batch, alone;
  std::vector<int32_t> next;
  for (const auto& p : prompts) {
    batch.push_back(model->NewSession());
    alone.push_back(model->NewSession());
    auto a = batch.back()->Prefill(p);
    auto b = alone.back()->Prefill(p);
    ASSERT_OK(a.status());
    ASSERT_OK(b.status());
    ASSERT_TRUE(SameBits(*a, *b));
    next.push_back(sampling::Greedy(*a));
  }
  std::vector<Session*> rows;
  for (auto& s : batch) rows.push_back(s.get());
  for (int step = 0; step < 8; ++step) {
    auto got = Session::StepBatch(rows, next);
    ASSERT_OK(got.status());
    ASSERT_EQ(got->size(), rows.size());
    for (size_t i = 0; i < rows.size(); ++i) {
      auto want = alone[i]->Step(next[i]);
      ASSERT_OK(want.status());
      EXPECT_TRUE(SameBits((*got)[i], *want)) << "step " << step << " row " << i;
      EXPECT_EQ(rows[i]->tokens(), alone[i]->tokens());
      next[i] = sampling::Greedy((*got)[i]);
    }
  }
  // The pass's MoE rows are shared out: the batch's sessions together count what the lone
  // sessions count one by one.
  int64_t batch_rows = 0, alone_rows = 0;
  for (size_t i = 0; i < rows.size(); ++i) {
    batch_rows += batch[i]->timings().moe_stats.rows;
    alone_rows += alone[i]->timings().moe_stats.rows;
  }
  EXPECT_EQ(batch_rows, alone_rows);
}

TEST(K3BatchedStep, RefusalsChangeNothing) {
  ModelOptions o;
  o.max_context = 8;
  auto model = Load(o);
  auto other = Load(ModelOptions());
  ASSERT_NE(model, nullptr);
  ASSERT_NE(other, nullptr);
  auto a = model->NewSession(), b = model->NewSession(), full = model->NewSession();
  auto foreign = other->NewSession();
  ASSERT_OK(a->Prefill(Ids(3, 1)).status());
  ASSERT_OK(b->Prefill(Ids(4, 2)).status());
  ASSERT_OK(full->Prefill(Ids(8, 3)).status());
  ASSERT_OK(foreign->Prefill(Ids(3, 4)).status());
  const std::vector<int32_t> two = {5, 6}, three = {5, 6, 7};

  std::vector<Session*> dup = {a.get(), b.get(), a.get()};
  EXPECT_THAT(Session::StepBatch(dup, three),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("rows 0 and 2")));
  std::vector<Session*> mixed = {a.get(), foreign.get()};
  EXPECT_THAT(Session::StepBatch(mixed, two),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("row 1")));
  std::vector<Session*> at_max = {a.get(), full.get()};
  EXPECT_THAT(Session::StepBatch(at_max, two),
              StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("row 1")));
  std::vector<Session*> pair = {a.get(), b.get()};
  EXPECT_THAT(Session::StepBatch(pair, three), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(Session::StepBatch({}, {}), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_EQ(a->position(), 3);
  EXPECT_EQ(b->position(), 4);
  EXPECT_EQ(full->position(), 8);
  // Still usable after the refusals.
  EXPECT_OK(Session::StepBatch(pair, two).status());
  EXPECT_EQ(a->position(), 4);
}

TEST(K3BatchedStep, FailedPassBreaksOnlyItsSessions) {
  std::atomic<bool> fail{false};
  auto model = Load(ModelOptions(), &fail);
  ASSERT_NE(model, nullptr);
  auto a = model->NewSession(), b = model->NewSession(), c = model->NewSession();
  ASSERT_OK(a->Prefill(Ids(5, 1)).status());
  ASSERT_OK(b->Prefill(Ids(6, 2)).status());
  ASSERT_OK(c->Prefill(Ids(7, 3)).status());
  std::vector<Session*> pair = {a.get(), b.get()};
  const std::vector<int32_t> tokens = {10, 11};
  fail = true;
  EXPECT_THAT(Session::StepBatch(pair, tokens),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("expert read failed")));
  fail = false;
  EXPECT_THAT(a->Step(10), StatusIs(absl::StatusCode::kFailedPrecondition));
  EXPECT_THAT(Session::StepBatch(pair, tokens),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("row 0")));
  EXPECT_OK(c->Step(12).status());  // not in the failed pass
  b->Reset();
  EXPECT_OK(b->Prefill(Ids(6, 2)).status());
  EXPECT_OK(b->Step(11).status());
}

}  // namespace
}  // namespace coli::k3
