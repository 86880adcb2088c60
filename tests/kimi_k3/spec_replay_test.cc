// Replay instead of a re-run (Session::Replay, KdaReplay; used by SpecDecoder::Verify after a
// rejected draft and by SpecDecoder::Rewind) on the tiny fixture (build/fixtures/k3_tiny: 9 KDA
// and 4 MLA layers, conv 4 taps). The reference is independent of the replay code: twin sessions
// that consumed the same tokens by plain Steps (one forward pass per token) and by one StepAll
// chunk. After the replay the session's whole sequence state must equal theirs byte for byte
// (every KDA layer's S and conv windows, every MLA cache's length and rows, the token record),
// and the next step's logits must be bit-identical. No second forward pass may run: the MoE
// row count of a rejected verify is that of one chunk.
#include <cstring>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "common/sampling/sampling.h"
#include "common/status/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "plugins/kimi_k3/model.h"
#include "plugins/kimi_k3/session.h"
#include "plugins/kimi_k3/spec_decode.h"
#include "tests/kimi_k3/batched_decode_util.h"

namespace coli::k3 {
namespace {

using ::coli::k3::batched_test::Ids;
using ::coli::testing::StatusIs;
using ::testing::HasSubstr;

constexpr int kDraft = 5;

bool SameBits(std::span<const float> a, std::span<const float> b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

std::unique_ptr<Model> Load() {
  auto model = Model::Load(K3_TEST_TINY, ModelOptions{});
  EXPECT_OK(model.status());
  return model.ok() ? std::move(model).value() : nullptr;
}

// Every byte of the two sessions' sequence state and their token records.
void ExpectSameState(Session& got, Session& want) {
  EXPECT_EQ(got.tokens(), want.tokens());
  const SequenceState& a = got.state();
  const SequenceState& b = want.state();
  ASSERT_EQ(a.kda.size(), b.kda.size());
  ASSERT_EQ(a.mla.size(), b.mla.size());
  int kda_layers = 0, mla_layers = 0;
  for (size_t i = 0; i < a.kda.size(); ++i) {
    SCOPED_TRACE(::testing::Message() << "layer " << i);
    if (!b.kda[i].S.empty()) {
      ++kda_layers;
      EXPECT_TRUE(SameBits(a.kda[i].S, b.kda[i].S)) << "S";
      EXPECT_TRUE(SameBits(a.kda[i].q_win, b.kda[i].q_win)) << "q conv window";
      EXPECT_TRUE(SameBits(a.kda[i].k_win, b.kda[i].k_win)) << "k conv window";
      EXPECT_TRUE(SameBits(a.kda[i].v_win, b.kda[i].v_win)) << "v conv window";
      EXPECT_EQ(a.kda[i].record, nullptr);
    } else {
      ++mla_layers;
      ASSERT_EQ(a.mla[i].length, b.mla[i].length) << "MLA cache length";
      ASSERT_EQ(a.mla[i].width, b.mla[i].width);
      const size_t used = static_cast<size_t>(b.mla[i].length) * b.mla[i].width;
      ASSERT_GE(a.mla[i].rows.size(), used);
      EXPECT_TRUE(SameBits(std::span<const float>(a.mla[i].rows.data(), used),
                           std::span<const float>(b.mla[i].rows.data(), used)))
          << "MLA cache rows";
    }
  }
  EXPECT_EQ(kda_layers, 9);  // the fixture's schedule: both kinds are compared
  EXPECT_EQ(mla_layers, 4);
}

// A fresh session that consumed `prompt` and then `more` one Step at a time; the logits after
// the last token.
std::vector<float> Stepped(Session& s, const std::vector<int32_t>& prompt,
                           std::span<const int32_t> more) {
  auto logits = s.Prefill(prompt);
  EXPECT_OK(logits.status());
  for (int32_t t : more) {
    logits = s.Step(t);
    EXPECT_OK(logits.status());
  }
  return logits.ok() ? *logits : std::vector<float>();
}

// Session::Replay of r = 0…n rows of a recorded StepAll chunk equals consuming those r tokens by
// plain Steps and by a StepAll of exactly them; the next step agrees bit for bit.
TEST(K3SpecReplay, ReplayOfEveryPrefixEqualsPlainSteps) {
  auto model = Load();
  ASSERT_NE(model, nullptr);
  const std::vector<int32_t> prompt = Ids(9, 11), chunk = Ids(6, 12);
  const int32_t next = 77;
  for (size_t r = 0; r <= chunk.size(); ++r) {
    SCOPED_TRACE(::testing::Message() << "rows " << r);
    auto s = model->NewSession();
    ASSERT_OK(s->Prefill(prompt).status());
    const Checkpoint before = s->TakeCheckpoint({});
    ReplayRecord record;
    auto all = s->StepAll(chunk, /*every_row=*/true, &record);
    ASSERT_OK(all.status());
    EXPECT_EQ(record.position, static_cast<int64_t>(prompt.size()));
    EXPECT_EQ(record.tokens, chunk);
    ASSERT_OK(s->Replay(before, record, static_cast<int64_t>(r)));
    EXPECT_FALSE(s->broken());

    const std::span<const int32_t> part = std::span<const int32_t>(chunk).first(r);
    auto stepped = model->NewSession();
    Stepped(*stepped, prompt, part);
    ExpectSameState(*s, *stepped);
    if (r > 0) {
      auto one = model->NewSession();
      ASSERT_OK(one->Prefill(prompt).status());
      ASSERT_OK(one->StepAll(part).status());
      ExpectSameState(*s, *one);
    }
    auto got = s->Step(next);
    auto want = stepped->Step(next);
    ASSERT_OK(got.status());
    ASSERT_OK(want.status());
    EXPECT_TRUE(SameBits(*got, *want)) << "logits of the step after the replay";
  }
}

// A verify rejected at every m in 0…K−1 (greedy: the true continuation with position m
// corrupted): accepted m, m + 1 rows replayed, the state byte-identical to a session that
// stepped t, x1…xm, the verified logits and the next step bit-identical, and no second pass
// (the rows through the MoE are one chunk's).
TEST(K3SpecReplay, RejectedVerifyAtEveryPositionEqualsPlainSteps) {
  auto model = Load();
  ASSERT_NE(model, nullptr);
  const int32_t V = static_cast<int32_t>(model->vocab_size());
  const std::vector<int32_t> prompt = Ids(10, 13);
  // The greedy continuation want[0…K+1] and the logits after each (want[0] is fed).
  std::vector<int32_t> want;
  std::vector<std::vector<float>> want_logits;
  {
    auto ref = model->NewSession();
    auto l = ref->Prefill(prompt);
    ASSERT_OK(l.status());
    for (int i = 0; i <= kDraft + 1; ++i) {
      want.push_back(sampling::Greedy(*l));
      l = ref->Step(want.back());
      ASSERT_OK(l.status());
      want_logits.push_back(*l);
    }
  }
  const int moe_layers = model->num_layers() - 1;  // layer 0 has the dense MLP
  for (int m = 0; m < kDraft; ++m) {
    SCOPED_TRACE(::testing::Message() << "m " << m);
    std::vector<int32_t> draft(want.begin() + 1, want.begin() + 1 + kDraft);
    draft[m] = (draft[m] + 1) % V;
    auto s = model->NewSession();
    ASSERT_OK(s->Prefill(prompt).status());
    SpecDecoder spec;
    const int64_t moe_rows = s->timings().moe_stats.rows;
    auto v = spec.Verify(*s, want[0], draft);
    ASSERT_OK(v.status());
    EXPECT_EQ(v->accepted, m);
    EXPECT_EQ(v->replayed, m + 1);
    EXPECT_EQ(spec.replayed_rows(), m + 1);
    EXPECT_EQ(s->timings().moe_stats.rows - moe_rows, int64_t{kDraft + 1} * moe_layers)
        << "one forward pass of the K+1-row chunk, no second one";
    EXPECT_TRUE(SameBits(v->logits, want_logits[0]));

    // The tokens consumed: t, x1…xm.
    const std::span<const int32_t> fed = std::span<const int32_t>(want).first(m + 1);
    auto stepped = model->NewSession();
    Stepped(*stepped, prompt, fed);
    ExpectSameState(*s, *stepped);
    auto one = model->NewSession();
    ASSERT_OK(one->Prefill(prompt).status());
    ASSERT_OK(one->StepAll(fed).status());
    ExpectSameState(*s, *one);

    // The buffered tokens come out with the plain path's logits; then x(m+1) is fed by a Step.
    for (int i = 1; i <= m; ++i) {
      auto l = spec.Take(want[i]);
      ASSERT_TRUE(l.has_value());
      EXPECT_TRUE(SameBits(*l, want_logits[i]));
    }
    EXPECT_EQ(spec.undelivered(), 0u);
    auto got = s->Step(want[m + 1]);
    ASSERT_OK(got.status());
    EXPECT_TRUE(SameBits(*got, want_logits[m + 1])) << "logits of the step after the verify";
  }
}

// Rewind after k of K accepted tokens were handed out replays t, x1…xk: the state is the
// plain-stepped one, byte for byte, with no forward pass.
TEST(K3SpecReplay, RewindReplaysTheDeliveredRows) {
  auto model = Load();
  ASSERT_NE(model, nullptr);
  const std::vector<int32_t> prompt = Ids(8, 14);
  std::vector<int32_t> want;
  {
    auto ref = model->NewSession();
    auto l = ref->Prefill(prompt);
    ASSERT_OK(l.status());
    for (int i = 0; i <= kDraft; ++i) {
      want.push_back(sampling::Greedy(*l));
      l = ref->Step(want.back());
      ASSERT_OK(l.status());
    }
  }
  for (int delivered = 0; delivered < kDraft; ++delivered) {
    SCOPED_TRACE(::testing::Message() << "delivered " << delivered);
    auto s = model->NewSession();
    ASSERT_OK(s->Prefill(prompt).status());
    SpecDecoder spec;
    auto v = spec.Verify(*s, want[0], std::vector<int32_t>(want.begin() + 1, want.end()));
    ASSERT_OK(v.status());
    ASSERT_EQ(v->accepted, kDraft);
    EXPECT_EQ(v->replayed, 0);
    for (int k = 0; k < delivered; ++k) ASSERT_TRUE(spec.Take(want[1 + k]).has_value());
    const int64_t moe_rows = s->timings().moe_stats.rows;
    auto rewound = spec.Rewind(*s);
    ASSERT_OK(rewound.status());
    EXPECT_EQ(s->timings().moe_stats.rows, moe_rows) << "a rewind runs no forward pass";
    EXPECT_EQ(spec.replayed_rows(), delivered + 1);
    auto stepped = model->NewSession();
    const std::vector<float> logits =
        Stepped(*stepped, prompt, std::span<const int32_t>(want).first(delivered + 1));
    ExpectSameState(*s, *stepped);
    ASSERT_TRUE(rewound->has_value());
    EXPECT_TRUE(SameBits(**rewound, logits));
  }
}

// The record holds 4C + H floats per row and KDA layer, is filled only on request, and a
// replay refuses what it cannot reproduce, changing nothing.
TEST(K3SpecReplay, RecordSizeAndRefusals) {
  auto model = Load();
  ASSERT_NE(model, nullptr);
  const KdaConfig& kc = model->config().kda;
  const std::vector<int32_t> prompt = Ids(7, 15), chunk = Ids(4, 16);
  auto s = model->NewSession();
  ASSERT_OK(s->Prefill(prompt).status());
  const Checkpoint before = s->TakeCheckpoint({});
  ReplayRecord record;
  ASSERT_OK(s->StepAll(chunk, /*every_row=*/true, &record).status());
  const size_t per_row = (4 * static_cast<size_t>(kc.channels()) + kc.num_heads) * sizeof(float);
  EXPECT_EQ(record.bytes(), chunk.size() * (9 * per_row + sizeof(int32_t)));
  for (const KdaState& k : s->state().kda) EXPECT_EQ(k.record, nullptr);

  // Refusals: nothing changes (the record stays ahead: prompt + chunk).
  const std::vector<int32_t> ahead = s->tokens();
  EXPECT_THAT(s->Replay(before, record, 5),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("5 rows")));
  EXPECT_THAT(s->Replay(before, record, -1), StatusIs(absl::StatusCode::kFailedPrecondition));
  const Checkpoint elsewhere = s->TakeCheckpoint({});  // at the end of the chunk
  EXPECT_THAT(s->Replay(elsewhere, record, 1),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("position")));
  ReplayRecord other = record;
  other.tokens[0] += 1;  // not what the session consumed
  EXPECT_THAT(s->Replay(before, other, 2),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("record")));
  other = record;
  for (KdaRowInputs& k : other.kda) {
    if (!k.beta.empty()) {
      k.alpha.resize(k.alpha.size() - 1);
      break;
    }
  }
  EXPECT_THAT(s->Replay(before, other, 2),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("KDA layer 0 replay record: inconsistent")));
  EXPECT_THAT(s->Replay(before, ReplayRecord(), 0),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("-1")));
  EXPECT_EQ(s->tokens(), ahead);
  auto plain = model->NewSession();
  Stepped(*plain, prompt, chunk);
  ExpectSameState(*s, *plain);

  // Back to the checkpoint's position and again forward: the record still matches its tokens.
  ASSERT_OK(s->Replay(before, record, 0));
  EXPECT_EQ(s->tokens(), prompt);
  ASSERT_OK(s->StepAll(std::span<const int32_t>(chunk).first(2)).status());
  ASSERT_OK(s->Replay(before, record, 1));  // the record's first rows are still the session's
  // A pass that fails leaves the record empty.
  ModelOptions small;
  small.max_context = 9;
  auto limited = Model::Load(K3_TEST_TINY, small);
  ASSERT_OK(limited.status());
  auto t = (*limited)->NewSession();
  ASSERT_OK(t->Prefill(prompt).status());
  EXPECT_THAT(t->StepAll(chunk, /*every_row=*/true, &record),
              StatusIs(absl::StatusCode::kResourceExhausted));
  EXPECT_EQ(record.position, -1);
  EXPECT_EQ(record.bytes(), 0u);
}

}  // namespace
}  // namespace coli::k3
