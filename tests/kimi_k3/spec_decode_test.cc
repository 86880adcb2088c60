// Speculative verify on the tiny fixture (build/fixtures/k3_tiny) at the Session level
// (plugins/kimi_k3/spec_decode, Session::StepAll), with INJECTED drafts so acceptance is certain:
// the true greedy continuation (every draft accepted, m = K) and one corrupted at position 2
// (m = 1, the rejected row dropped by a replay from the verify's record, no second pass). The reference is a twin session stepped one token
// at a time (Session::Step): every emitted token and the logits it was chosen from must match
// bit for bit, and the session's record must be the reference's plus the buffered tokens.
// Rewind (early stop / another token fed) must leave exactly the delivered record.
// Sampled rows (a seeded sampler): acceptance by a COPY of the sampler keeps the seeded stream
// (tokens, logprobs and the logits they came from) bit for bit; drawing with the real sampler
// in the verify instead shifts it (checked, so the equality can fail).
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

// Generation one Step at a time: tokens[i], its logprob and the logits it came from. Greedy
// (sampling::Greedy) unless `o` samples (a seeded sampling::Sampler drawing each token).
struct Generation {
  std::vector<int32_t> tokens;
  std::vector<float> logprobs;
  std::vector<std::vector<float>> logits;
};

Generation Reference(const Model& model, const std::vector<int32_t>& prompt, int n,
                     const sampling::SamplerOptions& o = {}) {
  Generation g;
  sampling::Sampler sampler(o);
  auto s = model.NewSession();
  auto logits = s->Prefill(prompt);
  EXPECT_OK(logits.status());
  if (!logits.ok()) return g;
  for (int i = 0; i < n; ++i) {
    const sampling::Sample x = sampler.Next(*logits);
    g.tokens.push_back(o.temperature > 0 ? x.id : sampling::Greedy(*logits));
    g.logprobs.push_back(x.logprob);
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
  int verifies = 0, accepted = 0, replays = 0, from_buffer = 0, steps = 0, rewinds = 0;
};

// How a sampled row's verify draws: with a copy of the sampler (the design) or, to show the
// tests can fail, with the real sampler itself (its RNG advances during the verify).
enum class VerifyDraws { kCopy, kRealSampler };

// Generation of n tokens as the plugin does it: a buffered token is taken without a pass,
// otherwise a non-empty draft is verified (greedy rows: argmax acceptance; sampled rows: the
// sampler's draws), otherwise a plain Step. Tokens are drawn as in Reference.
SpecRun Speculate(Session& s, const std::vector<int32_t>& prompt, int n, const DraftFn& drafts,
                  const sampling::SamplerOptions& o = {}, VerifyDraws draws = VerifyDraws::kCopy) {
  SpecRun r;
  SpecDecoder spec;
  sampling::Sampler sampler(o);
  auto logits = s.Prefill(prompt);
  EXPECT_OK(logits.status());
  if (!logits.ok()) return r;
  std::vector<float> cur = std::move(logits).value();
  for (int i = 0; i < n; ++i) {
    const sampling::Sample x = sampler.Next(cur);
    r.g.tokens.push_back(o.temperature > 0 ? x.id : sampling::Greedy(cur));
    r.g.logprobs.push_back(x.logprob);
    r.g.logits.push_back(cur);
    if (i + 1 == n) break;
    const int32_t t = r.g.tokens.back();
    if (spec.undelivered() > 0) {
      if (std::optional<std::vector<float>> next = spec.Take(t)) {
        cur = std::move(*next);
        ++r.from_buffer;
        continue;
      }
      // Another token than the buffered one (only when the verify's draws were not the
      // sampler's): back to the delivered record, then the normal step.
      ++r.rewinds;
      EXPECT_OK(spec.Rewind(s).status());
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
    sampling::Sampler copy = sampler;
    sampling::Sampler& draw = draws == VerifyDraws::kCopy ? copy : sampler;
    auto v =
        o.temperature > 0
            ? spec.Verify(s, t, draft, [&](std::span<const float> l) { return draw.Next(l).id; })
            : spec.Verify(s, t, draft);
    EXPECT_OK(v.status());
    if (!v.ok()) return r;
    ++r.verifies;
    r.accepted += v->accepted;
    // A rejection is replayed: exactly the fed token and the accepted drafts (m + 1 rows).
    if (v->accepted < static_cast<int>(draft.size())) {
      EXPECT_EQ(v->replayed, v->accepted + 1);
      ++r.replays;
    } else {
      EXPECT_EQ(v->replayed, 0);
    }
    cur = std::move(v->logits);
    // The state consumed the fed token and exactly the accepted drafts.
    EXPECT_EQ(spec.undelivered(), static_cast<size_t>(v->accepted));
  }
  return r;
}

void ExpectSameGeneration(const Generation& got, const Generation& want) {
  ASSERT_EQ(got.tokens, want.tokens);
  ASSERT_EQ(got.logprobs.size(), want.logprobs.size());
  for (size_t i = 0; i < got.logprobs.size(); ++i) {
    EXPECT_TRUE(SameBits(std::span<const float>(&got.logprobs[i], 1),
                         std::span<const float>(&want.logprobs[i], 1)))
        << "logprob of token " << i;
  }
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
  EXPECT_EQ(r.replays, 0);
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
  EXPECT_EQ(r.replays, r.verifies);
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

// A seeded sampled row (temperature 1, top_p 0.9, top_k 50): the reference's own sampled
// continuation as the draft is accepted in full (m = K), the same corrupted at position 2
// accepts one; either way tokens, logprobs and logits equal the one-step run's bit for bit.
// Drawing with the real sampler during the verify (no copy) shifts the stream.
TEST(K3SpecDecode, SampledRowVerifiedWithASamplerCopyKeepsTheSeededStream) {
  auto model = Load();
  ASSERT_NE(model, nullptr);
  const int32_t V = static_cast<int32_t>(model->vocab_size());
  for (uint64_t seed : {1u, 7u, 42u}) {
    SCOPED_TRACE(::testing::Message() << "seed " << seed);
    const sampling::SamplerOptions o = {
        .temperature = 1.0f, .top_p = 0.9f, .top_k = 50, .seed = seed, .logprobs = 3};
    const std::vector<int32_t> prompt = Ids(8, static_cast<int>(seed));
    const Generation want = Reference(*model, prompt, kTokens + kDraft, o);
    const Generation ref = Reference(*model, prompt, kTokens, o);
    // The sampled stream is not the greedy one (else this would test nothing new).
    EXPECT_NE(ref.tokens, Reference(*model, prompt, kTokens).tokens);
    DraftFn oracle = [&](const std::vector<int32_t>& emitted) {
      const size_t from = emitted.size();
      return std::vector<int32_t>(want.tokens.begin() + from, want.tokens.begin() + from + kDraft);
    };
    DraftFn corrupted = [&](const std::vector<int32_t>& emitted) {
      std::vector<int32_t> d = oracle(emitted);
      d[1] = (d[1] + 1) % V;
      return d;
    };
    auto s = model->NewSession();
    SpecRun all = Speculate(*s, prompt, kTokens, oracle, o);
    ExpectSameGeneration(all.g, ref);
    EXPECT_EQ(all.verifies, 4);
    EXPECT_EQ(all.accepted, all.verifies * kDraft);
    EXPECT_EQ(all.replays, 0);
    EXPECT_EQ(all.rewinds, 0);
    auto t = model->NewSession();
    SpecRun one = Speculate(*t, prompt, kTokens, corrupted, o);
    ExpectSameGeneration(one.g, ref);
    EXPECT_EQ(one.verifies, 10);
    EXPECT_EQ(one.accepted, one.verifies);
    EXPECT_EQ(one.replays, one.verifies);
    EXPECT_EQ(one.rewinds, 0);
    // Negative control: the real sampler drawing in the verify spends its RNG there.
    auto u = model->NewSession();
    SpecRun shifted = Speculate(*u, prompt, kTokens, corrupted, o, VerifyDraws::kRealSampler);
    EXPECT_NE(shifted.g.tokens, ref.tokens);
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
