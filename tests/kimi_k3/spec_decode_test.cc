// Speculative verify on the tiny fixture (build/fixtures/k3_tiny) at the Session level
// (plugins/kimi_k3/spec_decode, Session::StepAll), with INJECTED drafts so acceptance is certain:
// the true greedy continuation (every draft accepted, m = K) and one corrupted at position 2
// (m = 1, the state is restored and re-run). The reference is a twin session stepped one token
// at a time (Session::Step): every emitted token and the logits it was chosen from must match
// bit for bit, and the session's record must be the reference's plus the buffered tokens.
// Rewind (early stop / another token fed) must leave exactly the delivered record.
#include <cstring>
#include <functional>
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

using ::coli::testing::StatusIs;
using ::testing::HasSubstr;

using ::coli::k3::batched_test::Ids;

bool SameBits(std::span<const float> a, std::span<const float> b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

std::unique_ptr<Model> Load(ModelOptions o = {}) {
  auto model = Model::Load(K3_TEST_TINY, o);
  EXPECT_OK(model.status());
  return model.ok() ? std::move(model).value() : nullptr;
}

// Greedy generation one Step at a time: tokens[i] and the logits it came from.
struct Generation {
  std::vector<int32_t> tokens;
  std::vector<std::vector<float>> logits;
};

Generation Reference(const Model& model, const std::vector<int32_t>& prompt, int n) {
  Generation g;
  auto s = model.NewSession();
  auto logits = s->Prefill(prompt);
  EXPECT_OK(logits.status());
  if (!logits.ok()) return g;
  for (int i = 0; i < n; ++i) {
    g.tokens.push_back(sampling::Greedy(*logits));
    g.logits.push_back(*logits);
    if (i + 1 == n) break;
    logits = s->Step(g.tokens.back());
    EXPECT_OK(logits.status());
    if (!logits.ok()) return g;
  }
  return g;
}

// Drafts for the step that feeds the i-th emitted token (0-based): `emitted` so far.
using DraftFn = std::function<std::vector<int32_t>(const std::vector<int32_t>& emitted)>;

struct SpecRun {
  Generation g;
  int verifies = 0, accepted = 0, reruns = 0, from_buffer = 0, steps = 0;
};

// Greedy generation of n tokens as the plugin does it: a buffered token is taken without a
// pass, otherwise a non-empty draft is verified, otherwise a plain Step.
SpecRun Speculate(Session& s, const std::vector<int32_t>& prompt, int n, const DraftFn& drafts) {
  SpecRun r;
  SpecDecoder spec;
  auto logits = s.Prefill(prompt);
  EXPECT_OK(logits.status());
  if (!logits.ok()) return r;
  std::vector<float> cur = std::move(logits).value();
  for (int i = 0; i < n; ++i) {
    r.g.tokens.push_back(sampling::Greedy(cur));
    r.g.logits.push_back(cur);
    if (i + 1 == n) break;
    const int32_t t = r.g.tokens.back();
    if (spec.undelivered() > 0) {
      std::optional<std::vector<float>> next = spec.Take(t);
      EXPECT_TRUE(next.has_value()) << "buffered token differs at " << i;
      if (!next) return r;
      cur = std::move(*next);
      ++r.from_buffer;
      continue;
    }
    const std::vector<int32_t> draft = drafts(r.g.tokens);
    if (draft.empty()) {
      auto l = s.Step(t);
      EXPECT_OK(l.status());
      if (!l.ok()) return r;
      cur = std::move(l).value();
      ++r.steps;
      continue;
    }
    auto v = spec.Verify(s, t, draft);
    EXPECT_OK(v.status());
    if (!v.ok()) return r;
    ++r.verifies;
    r.accepted += v->accepted;
    r.reruns += v->rerun ? 1 : 0;
    cur = std::move(v->logits);
    // The state consumed the fed token and exactly the accepted drafts.
    EXPECT_EQ(spec.undelivered(), static_cast<size_t>(v->accepted));
  }
  return r;
}

void ExpectSameGeneration(const Generation& got, const Generation& want) {
  ASSERT_EQ(got.tokens, want.tokens);
  ASSERT_EQ(got.logits.size(), want.logits.size());
  for (size_t i = 0; i < got.logits.size(); ++i) {
    EXPECT_TRUE(SameBits(got.logits[i], want.logits[i])) << "logits of token " << i;
  }
}

constexpr int kTokens = 20;
constexpr int kDraft = 4;

TEST(K3SpecDecode, StepAllRowsBitIdenticalToSteps) {
  auto model = Load();
  ASSERT_NE(model, nullptr);
  const std::vector<int32_t> prompt = Ids(9, 1), more = Ids(6, 2);
  auto a = model->NewSession();
  auto b = model->NewSession();
  auto c = model->NewSession();
  ASSERT_OK(a->Prefill(prompt).status());
  ASSERT_OK(b->Prefill(prompt).status());
  ASSERT_OK(c->Prefill(prompt).status());
  auto all = a->StepAll(more);
  auto last = c->StepAll(more, /*every_row=*/false);  // head on the last row only
  ASSERT_OK(last.status());
  ASSERT_OK(all.status());
  const size_t V = static_cast<size_t>(model->vocab_size());
  ASSERT_EQ(all->size(), more.size() * V);
  for (size_t i = 0; i < more.size(); ++i) {
    auto step = b->Step(more[i]);
    ASSERT_OK(step.status());
    EXPECT_TRUE(SameBits(std::span<const float>(all->data() + i * V, V), *step)) << "row " << i;
  }
  EXPECT_TRUE(SameBits(*last, std::span<const float>(all->data() + (more.size() - 1) * V, V)));
  EXPECT_EQ(a->tokens(), b->tokens());
  EXPECT_EQ(c->tokens(), b->tokens());
  EXPECT_THAT(a->StepAll({}), StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST(K3SpecDecode, TrueContinuationAllAccepted) {
  auto model = Load();
  ASSERT_NE(model, nullptr);
  const std::vector<int32_t> prompt = Ids(11, 3);
  const Generation want = Reference(*model, prompt, kTokens + kDraft);
  // Draft: the reference's next K tokens after the one being fed.
  DraftFn oracle = [&](const std::vector<int32_t>& emitted) {
    const size_t from = emitted.size();
    return std::vector<int32_t>(want.tokens.begin() + from, want.tokens.begin() + from + kDraft);
  };
  auto s = model->NewSession();
  SpecRun r = Speculate(*s, prompt, kTokens, oracle);
  ExpectSameGeneration(r.g, Reference(*model, prompt, kTokens));
  EXPECT_GT(r.verifies, 0);
  EXPECT_EQ(r.accepted, r.verifies * kDraft);  // m = K every time
  EXPECT_EQ(r.reruns, 0);
  // 19 fed tokens in cycles of K+1: a verify pass, then K tokens from the buffer (the last
  // cycle is cut short by the end of the generation).
  EXPECT_EQ(r.verifies, 4);
  EXPECT_EQ(r.from_buffer, 4 + 4 + 4 + 3);
  EXPECT_EQ(r.steps, 0);
}

TEST(K3SpecDecode, DraftCorruptedAtPositionTwoAcceptsOne) {
  auto model = Load();
  ASSERT_NE(model, nullptr);
  const std::vector<int32_t> prompt = Ids(7, 4);
  const Generation want = Reference(*model, prompt, kTokens + kDraft);
  const int32_t V = static_cast<int32_t>(model->vocab_size());
  DraftFn corrupted = [&](const std::vector<int32_t>& emitted) {
    const size_t from = emitted.size();
    std::vector<int32_t> d(want.tokens.begin() + from, want.tokens.begin() + from + kDraft);
    d[1] = (d[1] + 1) % V;
    return d;
  };
  auto s = model->NewSession();
  SpecRun r = Speculate(*s, prompt, kTokens, corrupted);
  ExpectSameGeneration(r.g, Reference(*model, prompt, kTokens));
  EXPECT_GT(r.verifies, 0);
  EXPECT_EQ(r.accepted, r.verifies);  // m = 1 every time
  EXPECT_EQ(r.reruns, r.verifies);
  // Each verify emits 2 tokens (x1 now, x2 from the buffer).
  EXPECT_EQ(r.verifies, 10);
  EXPECT_EQ(r.from_buffer, 9);
}

// After a verify with m accepted, k of them handed out, Rewind leaves exactly the delivered
// record: prompt + emitted tokens up to the last one fed; then stepping on matches the
// reference bit for bit.
TEST(K3SpecDecode, RewindLeavesTheDeliveredRecord) {
  auto model = Load();
  ASSERT_NE(model, nullptr);
  const std::vector<int32_t> prompt = Ids(10, 5);
  const Generation want = Reference(*model, prompt, 12);
  for (int delivered = 0; delivered <= kDraft; ++delivered) {
    SCOPED_TRACE(::testing::Message() << "delivered " << delivered);
    auto s = model->NewSession();
    ASSERT_OK(s->Prefill(prompt).status());
    SpecDecoder spec;
    // Feed x1 with the true draft x2…x5: all accepted.
    auto v = spec.Verify(*s, want.tokens[0],
                         std::vector<int32_t>(want.tokens.begin() + 1, want.tokens.begin() + 5));
    ASSERT_OK(v.status());
    ASSERT_EQ(v->accepted, kDraft);
    EXPECT_TRUE(SameBits(v->logits, want.logits[1]));
    EXPECT_EQ(spec.peek(), want.tokens[1]);
    // A token other than the buffered one is refused and changes nothing.
    EXPECT_FALSE(spec.Take(want.tokens[1] + 1).has_value());
    EXPECT_EQ(spec.undelivered(), static_cast<size_t>(kDraft));
    for (int k = 0; k < delivered; ++k) {
      auto l = spec.Take(want.tokens[1 + k]);
      ASSERT_TRUE(l.has_value());
      EXPECT_TRUE(SameBits(*l, want.logits[2 + k]));
    }
    auto rewound = spec.Rewind(*s);
    ASSERT_OK(rewound.status());
    EXPECT_EQ(spec.undelivered(), 0u);
    std::vector<int32_t> record = prompt;
    record.insert(record.end(), want.tokens.begin(), want.tokens.begin() + 1 + delivered);
    EXPECT_EQ(s->tokens(), record);
    if (delivered < kDraft) {
      ASSERT_TRUE(rewound->has_value());
      EXPECT_TRUE(SameBits(**rewound, want.logits[1 + delivered]));
    } else {
      EXPECT_FALSE(rewound->has_value());  // drained: nothing was ahead
    }
    auto next = s->Step(want.tokens[1 + delivered]);
    ASSERT_OK(next.status());
    EXPECT_TRUE(SameBits(*next, want.logits[2 + delivered]));
  }
}

TEST(K3SpecDecode, RefusalsChangeNothing) {
  ModelOptions o;
  o.max_context = 14;
  auto model = Load(o);
  ASSERT_NE(model, nullptr);
  const std::vector<int32_t> prompt = Ids(10, 6);
  auto s = model->NewSession();
  auto logits = s->Prefill(prompt);
  ASSERT_OK(logits.status());
  SpecDecoder spec;
  const int32_t t = sampling::Greedy(*logits);
  EXPECT_THAT(spec.Verify(*s, t, {}), StatusIs(absl::StatusCode::kInvalidArgument));
  // 1 + 4 tokens past 14: refused by the session before anything runs, the state restored.
  EXPECT_THAT(spec.Verify(*s, t, std::vector<int32_t>{1, 2, 3, 4}),
              StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("K3_MAXT")));
  EXPECT_EQ(s->tokens(), prompt);
  EXPECT_EQ(spec.undelivered(), 0u);
  // Exactly at the limit is fine.
  const Generation want = Reference(*model, prompt, 4);
  auto v = spec.Verify(*s, t, std::vector<int32_t>(want.tokens.begin() + 1, want.tokens.end()));
  ASSERT_OK(v.status());
  EXPECT_EQ(v->accepted, 3);
  EXPECT_EQ(s->position(), 14);
  // Verifying again while tokens are buffered is refused.
  EXPECT_THAT(spec.Verify(*s, want.tokens[1], std::vector<int32_t>{1}),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("undelivered")));
  EXPECT_EQ(spec.undelivered(), 3u);
}

}  // namespace
}  // namespace coli::k3
