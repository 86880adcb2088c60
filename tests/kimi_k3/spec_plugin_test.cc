// Speculative decoding in the kimi_k3 plugin through its ABI (host/plugin.h Plugin::Load, then
// the raw C table) on the tiny fixture: greedy generation with option spec=K must give exactly
// what spec off gives — token ids, finish, text, logprob and top logprobs bit for bit — while
// the stats show verify passes, accepted drafts, tokens handed out without a pass and fewer
// forward passes. Also: an early stop while verified tokens are buffered (the follow-up prompt
// reuses exactly the delivered record), context full inside a verify, seeded sampling rows
// speculated too (a copy of the row's sampler verifies; the seeded stream is unchanged over 120
// tokens on the walk and the full stack, early stop, knob changes, batched with greedy and
// penalised rows), a spec row batched with other rows, a knob change mid-buffer, bad options.
// The reference is the same plugin with spec off, one row per decode call.
// The tiny fixture's random weights never copy text, so lookup drafts are rarely right on the
// full stack (it checks equality without acceptance). Where acceptance must happen the model is
// opened with K3_LAYERS=0 (layers = 0: embedding, final norm and head only), which makes the
// next greedy token a function of the last one; a prompt that walks that function and returns
// to its start ("walk prompt") is then continued exactly along the walk, so lookup drafts the
// true continuation and every draft token is accepted.
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/status/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "plugin_api/coli_plugin.h"
#include "tests/kimi_k3/batched_decode_util.h"
#include "tests/kimi_k3/plugin_abi_test_util.h"

namespace coli::k3 {
namespace {

using ::coli::testing::StatusIs;
using ::testing::HasSubstr;

using ::coli::k3::abi_test::Knobs;
using ::coli::k3::abi_test::Out;
using ::coli::k3::batched_test::Ids;

void ExpectSame(const std::vector<Out>& got, const std::vector<Out>& want) {
  abi_test::ExpectSameOuts(got, want);
}

// A prompt that repeats itself (so prompt lookup finds drafts): `unit` three times.
std::vector<int32_t> Repeating(int n, int seed) {
  std::vector<int32_t> unit = Ids(n, seed), out;
  for (int r = 0; r < 3; ++r) out.insert(out.end(), unit.begin(), unit.end());
  return out;
}

// The pass identity of docs/status/spec-decoding.md, from the stats of a spec session (`with`)
// and of a spec-off twin (`without`): a pass per fed token, none for buffered ones, and none
// for a rejected draft or a rewind (replayed: at least one row each).
void ExpectPassIdentity(std::map<std::string, double>& with,
                        std::map<std::string, double>& without) {
  EXPECT_EQ(with["decode_passes"], without["decode_passes"] - with["spec_tokens_from_buffer"]);
  EXPECT_LE(with["spec_rejections"], with["spec_drafts"]);
  EXPECT_GE(with["spec_replays"], with["spec_rejections"] + with["spec_rewinds"]);
  EXPECT_EQ(without["spec_replays"], 0);
}

class K3SpecPluginTest : public abi_test::PluginAbiTest {
 protected:
  // spec = max draft tokens (0 = off); layers = 0 for the bigram model of the walk prompts;
  // `policy`: draft policy options (spec_decode.h DraftPolicy), e.g. kEveryMatch.
  coli_model_t* Open(int spec, int32_t layers = -1, const Extra& policy = {}) {
    Extra extra = policy;
    if (spec > 0) extra.push_back({"spec", std::to_string(spec)});
    return PluginAbiTest::Open(extra, layers);
  }
  // Sampled rows draft on every match (1-grams too), so the tests whose point is exactness when
  // sampled drafts are rejected still get such drafts on free text (the default policy drafts
  // sampled rows only on 3-token matches).
  const Extra kEveryMatch = {{"spec_sampled_ngram", "1"}};
  // The fixed policy: every match, always K, no pauses.
  const Extra kFixed = {{"spec_sampled_ngram", "1"}, {"spec_adapt", "0"}};
  // A walk prompt on `bigram` (a layers = 0 model without spec): start, its n successors as
  // the row with knobs `k` generates them (greedy by default), start again. A bigram model's
  // logits depend on the last token only and a sampler's draws on its seed and their count, so
  // the same knobs and seed after this prompt generate the walk again (a stop token ends it).
  std::vector<int32_t> Walk(coli_model_t* bigram, int32_t start, int n, const Knobs& k = {}) {
    std::vector<int32_t> prompt = {start};
    for (const Out& o : Fresh(bigram, {start}, n, k)) {
      if (o.finish == COLI_FINISH_NONE) prompt.push_back(o.token);
    }
    prompt.push_back(start);
    return prompt;
  }
};

constexpr int kSteps = 40;
constexpr int kWalk = 24;

// layers = 0: lookup drafts the true continuation along the walk, so most tokens come from the
// buffer and the passes drop; outputs identical to spec off.
TEST_F(K3SpecPluginTest, WalkPromptDraftsAcceptedSameTokensFewerPasses) {
  coli_model_t* off = Open(0, 0);
  coli_model_t* on = Open(6, 0);
  ASSERT_NE(off, nullptr);
  ASSERT_NE(on, nullptr);
  const std::vector<int32_t> prompt = Walk(off, 5, kWalk);
  coli_session_t* a = NewSession(off);
  coli_session_t* b = NewSession(on);
  Prefill(a, prompt);
  Prefill(b, prompt);
  const auto want = Generate(a, kSteps);
  ExpectSame(Generate(b, kSteps), want);
  // The walk is continued exactly: its first kWalk tokens come back.
  for (int i = 0; i < kWalk; ++i) EXPECT_EQ(want[i].token, prompt[i + 1]);
  auto without = Stats(a), with = Stats(b);
  EXPECT_EQ(without["spec_drafts"], 0);
  EXPECT_EQ(without["decode_passes"], static_cast<double>(want.size() - 1));
  EXPECT_GT(with["spec_drafts"], 0);
  // Along the walk every draft token is right: at least the walk minus one draft's worth.
  EXPECT_GE(with["spec_accepted_tokens"], kWalk - 6);
  EXPECT_LE(with["spec_accepted_tokens"], with["spec_draft_tokens"]);
  // Buffered tokens are handed out one per call (some may still wait when the run ends).
  EXPECT_LE(with["spec_tokens_from_buffer"], with["spec_accepted_tokens"]);
  EXPECT_GE(with["spec_tokens_from_buffer"], with["spec_accepted_tokens"] - 6);
  // Each accepted token saves a pass; each rejected draft costs one re-run pass. Along the walk
  // a verify pass serves up to 7 tokens, so at least kWalk / 2 passes are saved in all.
  EXPECT_LE(with["decode_passes"] + kWalk / 2, without["decode_passes"]);
  ExpectPassIdentity(with, without);
  EXPECT_EQ(with["tokens_generated"], without["tokens_generated"]);
  EXPECT_EQ(Record(a), Record(b));
}

// The walk with every 5th token replaced: drafts are right up to a replaced token and wrong
// there (m < K: the accepted rows are replayed onto the checkpoint), then right again. Same
// outputs as spec off.
TEST_F(K3SpecPluginTest, CorruptedWalkRejectsAndRecovers) {
  coli_model_t* off = Open(0, 0);
  coli_model_t* on = Open(6, 0);
  std::vector<int32_t> prompt = Walk(off, 5, kWalk);
  for (size_t i = 3; i + 1 < prompt.size(); i += 5) prompt[i] = (prompt[i] + 1) % 512;
  coli_session_t* a = NewSession(off);
  coli_session_t* b = NewSession(on);
  Prefill(a, prompt);
  Prefill(b, prompt);
  ExpectSame(Generate(b, kSteps), Generate(a, kSteps));
  auto without = Stats(a), with = Stats(b);
  EXPECT_GT(with["spec_rejections"], 0);
  EXPECT_GT(with["spec_accepted_tokens"], 0);
  EXPECT_LT(with["spec_accepted_tokens"], with["spec_draft_tokens"]);
  ExpectPassIdentity(with, without);
  EXPECT_EQ(Record(a), Record(b));
}

// The full stack on a prompt that repeats itself: lookup drafts (rarely right on random
// weights); every output identical to spec off.
TEST_F(K3SpecPluginTest, RepeatingPromptSameTokens) {
  coli_model_t* off = Open(0);
  coli_model_t* on = Open(6);
  const std::vector<int32_t> prompt = Repeating(12, 1);
  coli_session_t* a = NewSession(off);
  coli_session_t* b = NewSession(on);
  Prefill(a, prompt);
  Prefill(b, prompt);
  ExpectSame(Generate(b, kSteps), Generate(a, kSteps));
  // Rejected drafts dropped by a replay on the full stack (KDA and MLA layers), no second pass.
  auto with = Stats(b), without = Stats(a);
  EXPECT_GT(with["spec_drafts"], 0);
  EXPECT_GT(with["spec_rejections"], 0);
  ExpectPassIdentity(with, without);
}

TEST_F(K3SpecPluginTest, RandomPromptSameTokens) {
  coli_model_t* off = Open(0);
  coli_model_t* on = Open(4);
  for (int seed = 2; seed < 5; ++seed) {
    SCOPED_TRACE(::testing::Message() << "prompt " << seed);
    const std::vector<int32_t> prompt = Ids(9 + seed, seed);
    ExpectSame(Fresh(on, prompt, kSteps), Fresh(off, prompt, kSteps));
  }
}

// The host stops right after x1 while x2…x(m+1) are buffered; the follow-up prompt extends what
// was delivered. Tokens reused = the delivered record, and everything after is what a session
// that never used spec produces.
TEST_F(K3SpecPluginTest, EarlyStopWhileBufferedReusesTheDeliveredRecord) {
  coli_model_t* off = Open(0, 0);
  coli_model_t* on = Open(6, 0);
  const std::vector<int32_t> prompt = Walk(off, 9, kWalk);
  coli_session_t* s = NewSession(on);
  Prefill(s, prompt);
  // Decode until a call verified a draft and accepted at least one token: they are buffered.
  std::vector<int32_t> delivered_tokens;
  double accepted = 0;
  for (int i = 0; i < kSteps && accepted == 0; ++i) {
    const Out o = Call({s}, {Knobs{}})[0];
    ASSERT_EQ(o.finish, COLI_FINISH_NONE);
    delivered_tokens.push_back(o.token);
    accepted = Stats(s)["spec_accepted_tokens"];
  }
  ASSERT_GT(accepted, 0) << "lookup never drafted an accepted token";
  EXPECT_EQ(Stats(s)["spec_tokens_from_buffer"], 0);
  // The record the host sees: the prompt and every token fed so far (all but the last one).
  std::vector<int32_t> record = prompt;
  record.insert(record.end(), delivered_tokens.begin(), delivered_tokens.end() - 1);
  EXPECT_EQ(Record(s), record);
  // Follow-up turn: what was delivered plus new text.
  std::vector<int32_t> follow = prompt;
  follow.insert(follow.end(), delivered_tokens.begin(), delivered_tokens.end());
  const std::vector<int32_t> more = Ids(5, 9);
  follow.insert(follow.end(), more.begin(), more.end());
  const coli_prefill_result_t r = Prefill(s, follow);
  EXPECT_EQ(r.tokens_reused, record.size());
  EXPECT_EQ(r.tokens_computed, follow.size() - record.size());
  EXPECT_EQ(r.context_used, static_cast<int64_t>(follow.size()));
  EXPECT_EQ(Stats(s)["spec_rewinds"], 1);
  EXPECT_EQ(Stats(s)["tokens_reused"], static_cast<double>(record.size()));
  // The reference: spec off, the same first turn, stopped at the same point.
  coli_session_t* ref = NewSession(off);
  Prefill(ref, prompt);
  const auto first = Generate(ref, static_cast<int>(delivered_tokens.size()));
  ASSERT_EQ(first.size(), delivered_tokens.size());
  for (size_t i = 0; i < first.size(); ++i) EXPECT_EQ(first[i].token, delivered_tokens[i]);
  const coli_prefill_result_t rr = Prefill(ref, follow);
  EXPECT_EQ(rr.tokens_reused, r.tokens_reused);
  EXPECT_EQ(rr.context_used, r.context_used);
  ExpectSame(Generate(s, kSteps), Generate(ref, kSteps));
  EXPECT_EQ(Record(s), Record(ref));
}

// The session's context fills during generation: drafts shrink to fit, LENGTH comes at the
// same step with spec on and off (bigram walk: drafts accepted right up to the limit; and the
// full stack).
TEST_F(K3SpecPluginTest, ContextFullInsideVerify) {
  for (int32_t layers : {0, -1}) {
    coli_model_t* off = Open(0, layers);
    coli_model_t* on = Open(8, layers);
    const std::vector<int32_t> prompt = layers == 0 ? Walk(off, 5, kWalk) : Repeating(10, 1);
    for (int64_t room : {1, 3, 7, 12}) {
      SCOPED_TRACE(::testing::Message() << "layers " << layers << " room " << room);
      const int64_t max_context = static_cast<int64_t>(prompt.size()) + room;
      const auto want = Fresh(off, prompt, kSteps, {}, max_context);
      ASSERT_EQ(want.back().finish, COLI_FINISH_LENGTH);
      coli_session_t* s = NewSession(on, max_context);
      Prefill(s, prompt);
      ExpectSame(Generate(s, kSteps), want);
      if (layers == 0 && room > 1) {
        EXPECT_GT(Stats(s)["spec_accepted_tokens"], 0);
      }
    }
  }
}

// Seeded sampled rows (temperature > 0) are speculated too: a copy of the row's sampler draws
// each verify row and accepts while it draws the draft token, so the real sampler later draws
// exactly those tokens. Outputs are bit-identical to spec off over kLong tokens.
constexpr int kLong = 120;

// Knob sets of the sampled tests: hot and cool, top_p, top_k, logprobs, different seeds.
std::vector<Knobs> SampledKnobs() {
  return {{.temperature = 0.7f, .top_p = 0.9f, .logprobs = 3, .seed = 11},
          {.temperature = 1.0f, .top_k = 4, .logprobs = 2, .seed = 5},
          {.temperature = 0.7f, .top_p = 0.5f, .top_k = 20, .logprobs = 5, .seed = 1234},
          {.temperature = 1.0f, .logprobs = 1, .seed = 99}};
}

// The walk model with a SAMPLED walk prompt (the row's own seeded stream, see Walk): after it
// the same knobs and seed draw the walk again, lookup drafts it and the copy of the sampler
// accepts it — accepted tokens, fewer passes, the pass identity; outputs bit-identical to spec
// off over kLong tokens (past the walk the row samples on, drafts mostly rejected). The same
// prompt with another seed: drafts mostly rejected, outputs identical too.
TEST_F(K3SpecPluginTest, SampledWalkSameOutputsDraftsAccepted) {
  coli_model_t* off = Open(0, 0);
  coli_model_t* on = Open(6, 0, kEveryMatch);
  for (const Knobs& walk_knobs : SampledKnobs()) {
    const std::vector<int32_t> prompt = Walk(off, 5, kLong / 2, walk_knobs);
    ASSERT_GT(prompt.size(), 40u) << "the sampled walk hit a stop token early; pick another seed";
    for (uint64_t seed : {walk_knobs.seed, walk_knobs.seed + 1}) {
      Knobs k = walk_knobs;
      k.seed = seed;
      SCOPED_TRACE(::testing::Message() << "temperature " << k.temperature << " top_p " << k.top_p
                                        << " top_k " << k.top_k << " seed " << k.seed);
      coli_session_t* a = NewSession(off);
      coli_session_t* b = NewSession(on);
      Prefill(a, prompt, k.seed);
      Prefill(b, prompt, k.seed);
      const auto want = Generate(a, kLong, k);
      ExpectSame(Generate(b, kLong, k), want);
      EXPECT_EQ(Record(a), Record(b));
      auto without = Stats(a), with = Stats(b);
      EXPECT_EQ(without["spec_drafts"], 0);
      EXPECT_GT(with["spec_drafts"], 0);
      EXPECT_LE(with["spec_accepted_tokens"], with["spec_draft_tokens"]);
      ExpectPassIdentity(with, without);
      EXPECT_EQ(with["tokens_generated"], without["tokens_generated"]);
      if (seed != walk_knobs.seed) continue;
      // The walk's own seed: the walk comes back, and drafts along it are right.
      const size_t walk = prompt.size() - 2;
      ASSERT_GE(want.size(), walk);
      for (size_t i = 0; i < walk; ++i) EXPECT_EQ(want[i].token, prompt[i + 1]) << i;
      EXPECT_GE(with["spec_accepted_tokens"], static_cast<double>(walk) / 2);
      EXPECT_LE(with["decode_passes"] + static_cast<double>(walk) / 4, without["decode_passes"]);
    }
  }
}

// The full stack with random and repeating prompts: drafts mostly rejected (random weights
// never copy), every rejection is replayed; outputs identical to spec off.
TEST_F(K3SpecPluginTest, SampledFullStackSameOutputs) {
  coli_model_t* off = Open(0);
  coli_model_t* on = Open(4, -1, kEveryMatch);
  double drafts = 0, rejections = 0;
  const std::vector<Knobs> sets = SampledKnobs();
  for (size_t j = 0; j < 2; ++j) {  // two sets keep the binary fast; the walk test runs all
    const Knobs& k = sets[j];
    SCOPED_TRACE(::testing::Message() << "temperature " << k.temperature << " seed " << k.seed);
    const std::vector<int32_t> prompt = j == 0 ? Ids(11, 2) : Repeating(10, 3);
    coli_session_t* a = NewSession(off);
    coli_session_t* b = NewSession(on);
    Prefill(a, prompt, k.seed);
    Prefill(b, prompt, k.seed);
    const auto want = Generate(a, kLong, k);
    ExpectSame(Generate(b, kLong, k), want);
    auto with = Stats(b), without = Stats(a);
    drafts += with["spec_drafts"];
    rejections += with["spec_rejections"];
    ExpectPassIdentity(with, without);
  }
  EXPECT_GT(drafts, 0);
  EXPECT_GT(rejections, 0);  // rejected drafts replayed on the full stack
}

// The draft policy through the ABI (docs/status/spec-decoding.md "Draft policy"): on the sampled
// walk (the repeat, then free text) the default policy drafts the repeat — its tokens come from
// the buffer — but not the free text's short matches: fewer verifies and rejected draft tokens
// than the fixed policy, outputs bit-identical to spec off with both. On the full stack's free
// text a sampled row does not draft at all by default.
TEST_F(K3SpecPluginTest, DraftPolicyFewerVerifiesSameOutputs) {
  coli_model_t* off = Open(0, 0);
  coli_model_t* adaptive = Open(6, 0);
  coli_model_t* fixed = Open(6, 0, kFixed);
  int compared = 0;
  for (const Knobs& k : SampledKnobs()) {
    SCOPED_TRACE(::testing::Message() << "temperature " << k.temperature << " seed " << k.seed);
    const std::vector<int32_t> prompt = Walk(off, 5, kLong / 2, k);
    const auto want = Fresh(off, prompt, kLong, k);
    // Only walks followed by free text (a walk that ends in a stop token ends the turn there).
    if (want.size() < static_cast<size_t>(kLong)) continue;
    ++compared;
    std::map<std::string, double> with[2];
    coli_model_t* models[2] = {adaptive, fixed};
    for (int i = 0; i < 2; ++i) {
      coli_session_t* s = NewSession(models[i]);
      Prefill(s, prompt, k.seed);
      ExpectSame(Generate(s, kLong, k), want);
      with[i] = Stats(s);
    }
    const size_t walk = prompt.size() - 2;
    EXPECT_GE(with[0]["spec_tokens_from_buffer"], static_cast<double>(walk) / 2);
    EXPECT_LT(with[0]["spec_drafts"], with[1]["spec_drafts"]);
    EXPECT_LT(with[0]["spec_draft_tokens"] - with[0]["spec_accepted_tokens"],
              with[1]["spec_draft_tokens"] - with[1]["spec_accepted_tokens"]);
  }
  EXPECT_GE(compared, 2);
  coli_model_t* full_off = Open(0);
  coli_model_t* full_on = Open(4);
  const Knobs k = SampledKnobs()[0];
  coli_session_t* s = NewSession(full_on);
  Prefill(s, Repeating(10, 3), k.seed);
  ExpectSame(Generate(s, kLong, k), Fresh(full_off, Repeating(10, 3), kLong, k));
  EXPECT_EQ(Stats(s)["spec_drafts"], 0);
}

// A sampled row stops early (the host's max_tokens) while verified tokens are buffered; the
// follow-up prompt reuses exactly the delivered record, and the next sampled turn (another
// seed) is what a never-spec session gives.
TEST_F(K3SpecPluginTest, SampledEarlyStopWhileBufferedThenFollowUp) {
  coli_model_t* off = Open(0, 0);
  coli_model_t* on = Open(6, 0);
  const Knobs k = {.temperature = 0.7f, .top_p = 0.5f, .top_k = 20, .logprobs = 2, .seed = 8};
  const std::vector<int32_t> prompt = Walk(off, 9, kWalk, k);
  coli_session_t* s = NewSession(on);
  Prefill(s, prompt, k.seed);
  std::vector<Out> got;
  // Decode until a verify left at least two tokens buffered, then stop.
  for (int i = 0; i < kLong; ++i) {
    got.push_back(Call({s}, {k})[0]);
    ASSERT_EQ(got.back().finish, COLI_FINISH_NONE);
    auto st = Stats(s);
    if (st["spec_accepted_tokens"] > st["spec_tokens_from_buffer"] + 1) break;
  }
  auto st = Stats(s);
  ASSERT_GT(st["spec_accepted_tokens"], st["spec_tokens_from_buffer"] + 1)
      << "no verify left tokens buffered";
  coli_session_t* ref = NewSession(off);
  Prefill(ref, prompt, k.seed);
  ExpectSame(got, Generate(ref, static_cast<int>(got.size()), k));
  std::vector<int32_t> follow = prompt;
  for (const Out& o : got) follow.push_back(o.token);
  const std::vector<int32_t> more = Ids(5, 9);
  follow.insert(follow.end(), more.begin(), more.end());
  const coli_prefill_result_t r = Prefill(s, follow, 77);
  const coli_prefill_result_t rr = Prefill(ref, follow, 77);
  EXPECT_EQ(r.tokens_reused, prompt.size() + got.size() - 1);  // all but the last, never fed
  EXPECT_EQ(r.tokens_reused, rr.tokens_reused);
  EXPECT_EQ(r.context_used, rr.context_used);
  EXPECT_EQ(Stats(s)["spec_rewinds"], 1);
  Knobs next = k;
  next.seed = 77;
  ExpectSame(Generate(s, kLong, next), Generate(ref, kLong, next));
  EXPECT_EQ(Record(s), Record(ref));
}

// A sampled row's knobs change mid-generation, also while tokens are buffered: the sampler is
// re-created (seeded seed + steps) and draws its own token; a token other than the buffered one
// rewinds. Same outputs as spec off with the same changes.
TEST_F(K3SpecPluginTest, SampledKnobChangesMidGeneration) {
  coli_model_t* off = Open(0, 0);
  coli_model_t* on = Open(6, 0);
  const std::vector<Knobs> cycle = {
      {.temperature = 0.7f, .top_p = 0.5f, .top_k = 20, .logprobs = 2, .seed = 4},
      {.temperature = 1.0f, .top_k = 4, .logprobs = 2, .seed = 4},
      {.temperature = 5.0f, .logprobs = 2, .seed = 4},
      {.logprobs = 2, .seed = 4}};  // greedy
  const std::vector<int32_t> prompt = Walk(off, 5, kLong / 2, cycle[0]);
  ASSERT_GT(prompt.size(), 40u) << "the sampled walk hit a stop token early; pick another seed";
  coli_session_t* s = NewSession(on);
  coli_session_t* ref = NewSession(off);
  Prefill(s, prompt, 4);
  Prefill(ref, prompt, 4);
  std::vector<Out> got, want;
  size_t knob = 0;
  int changes_while_buffered = 0;
  for (int i = 0; i < kLong; ++i) {
    // The first knob set, except that right after a verify buffered tokens the row moves to
    // the next set in the cycle for a few steps.
    auto st = Stats(s);
    const bool buffered = st["spec_accepted_tokens"] > st["spec_tokens_from_buffer"] + 1;
    if (buffered) {
      knob = (knob + 1) % cycle.size();
      changes_while_buffered += knob != 0;
    } else if (i % 7 == 0) {
      knob = 0;
    }
    const Knobs& k = cycle[knob];
    got.push_back(Call({s}, {k})[0]);
    want.push_back(Call({ref}, {k})[0]);
    if (want.back().finish != COLI_FINISH_NONE) break;
  }
  ExpectSame(got, want);
  EXPECT_EQ(Record(s), Record(ref));
  EXPECT_GT(changes_while_buffered, 0);
  EXPECT_GT(Stats(s)["spec_rewinds"], 0);  // a re-created sampler left the buffered tokens
  auto with = Stats(s), without = Stats(ref);
  ExpectPassIdentity(with, without);  // rewinds replay, no pass
}

// One decode call per step with a sampled walk row (drafts), a greedy walk row (drafts), a
// penalised sampled walk row (drafts too: its verify advances a copy of its history) and a
// sampled random row: every row as alone with spec off.
TEST_F(K3SpecPluginTest, SampledRowBatchedWithGreedyAndPenalisedRows) {
  coli_model_t* off = Open(0, 0);
  coli_model_t* on = Open(6, 0);
  const std::vector<Knobs> knobs = {
      {.temperature = 1.0f, .top_k = 4, .logprobs = 2, .seed = 5},
      {.logprobs = 1},
      {.temperature = 0.8f, .top_k = 4, .logprobs = 3, .seed = 6, .frequency_penalty = 0.5f},
      {.temperature = 1.0f, .top_p = 0.9f, .logprobs = 2, .seed = 7}};
  const std::vector<std::vector<int32_t>> prompts = {Walk(off, 5, kWalk, knobs[0]),
                                                     Walk(off, 9, kWalk),
                                                     Walk(off, 5, kWalk, knobs[2]), Ids(13, 5)};
  const size_t n = prompts.size();
  std::vector<coli_session_t*> batch;
  std::vector<std::vector<Out>> got(n), want(n);
  for (size_t i = 0; i < n; ++i) {
    want[i] = Fresh(off, prompts[i], kLong, knobs[i]);
    batch.push_back(NewSession(on));
    Prefill(batch.back(), prompts[i], knobs[i].seed);
  }
  for (int t = 0; t < kLong; ++t) {
    const auto outs = Call(batch, knobs);
    for (size_t i = 0; i < n; ++i) {
      if (got[i].empty() || got[i].back().finish == COLI_FINISH_NONE) got[i].push_back(outs[i]);
    }
  }
  for (size_t i = 0; i < n; ++i) {
    SCOPED_TRACE(::testing::Message() << "row " << i);
    ExpectSame(got[i], want[i]);
  }
  EXPECT_GT(Stats(batch[0])["spec_tokens_from_buffer"], 0);
  EXPECT_GT(Stats(batch[1])["spec_tokens_from_buffer"], 0);
  EXPECT_GT(Stats(batch[2])["spec_drafts"], 0);
  EXPECT_EQ(Stats(batch[2])["spec_rewinds"], 0);   // its accepted drafts were its real draws
  EXPECT_GT(Stats(batch[2])["batched_steps"], 0);  // rows without a draft still shared passes
}

// One decode call per step with a spec greedy row (verified alone), a sampled row (drafts when
// its record offers one) and a greedy row (batched together when they have no draft): every row
// as alone with spec off.
TEST_F(K3SpecPluginTest, SpecRowBatchedWithOtherRows) {
  coli_model_t* off = Open(0, 0);
  coli_model_t* on = Open(6, 0);
  const std::vector<std::vector<int32_t>> prompts = {Walk(off, 5, kWalk), Ids(9, 4), Ids(13, 5)};
  const std::vector<Knobs> knobs = {
      {}, {.temperature = 1.1f, .top_k = 40, .logprobs = 2, .seed = 5}, {.logprobs = 1}};
  std::vector<coli_session_t*> batch;
  std::vector<std::vector<Out>> got(3), want(3);
  for (size_t i = 0; i < 3; ++i) {
    want[i] = Fresh(off, prompts[i], kSteps, knobs[i]);
    batch.push_back(NewSession(on));
    Prefill(batch.back(), prompts[i], knobs[i].seed);
  }
  for (int t = 0; t < kSteps; ++t) {
    const auto outs = Call(batch, knobs);
    for (size_t i = 0; i < 3; ++i) got[i].push_back(outs[i]);
  }
  for (size_t i = 0; i < 3; ++i) {
    SCOPED_TRACE(::testing::Message() << "row " << i);
    ExpectSame(got[i], want[i]);
  }
  EXPECT_GT(Stats(batch[0])["spec_tokens_from_buffer"], 0);
  EXPECT_GT(Stats(batch[2])["batched_steps"], 0);  // the other rows still shared passes
}

// The row switches from greedy to sampling while verified tokens are buffered: the buffered
// logits are sampled with the new knobs; a token other than the buffered one drops the buffer
// (rewind) and the step is taken normally. Same outputs as spec off with the same switches.
TEST_F(K3SpecPluginTest, KnobChangeWhileBufferedFallsBackSafely) {
  coli_model_t* off = Open(0, 0);
  coli_model_t* on = Open(6, 0);
  const std::vector<int32_t> prompt = Walk(off, 5, kWalk);
  coli_session_t* s = NewSession(on);
  coli_session_t* ref = NewSession(off);
  Prefill(s, prompt, 3);
  Prefill(ref, prompt, 3);
  const Knobs hot = {.temperature = 5.0f, .logprobs = 2, .seed = 3};
  std::vector<Out> got, want;
  for (int i = 0; i < kSteps; ++i) {
    // Greedy, except one hot step right after each verify that buffered tokens.
    const bool buffered =
        Stats(s)["spec_accepted_tokens"] > Stats(s)["spec_tokens_from_buffer"] + 1;
    const Knobs k = buffered ? hot : Knobs{};
    got.push_back(Call({s}, {k})[0]);
    want.push_back(Call({ref}, {k})[0]);
  }
  ExpectSame(got, want);
  EXPECT_EQ(Record(s), Record(ref));
  EXPECT_GT(Stats(s)["spec_rewinds"], 0);  // a hot token left the walk at least once
  auto with = Stats(s), without = Stats(ref);
  ExpectPassIdentity(with, without);  // rewinds replay, no pass
}

TEST_F(K3SpecPluginTest, BadOptionsRefused) {
  for (const char* v : {"-1", "17", "x", ""}) {
    EXPECT_THAT(TryOpen({{"spec", v}}).status(),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("option spec")))
        << v;
  }
  EXPECT_THAT(TryOpen({{"spec_ngram_max", "0"}}).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("spec_ngram_max")));
  EXPECT_THAT(TryOpen({{"spec", "4"}, {"spec_ngram_min", "3"}, {"spec_ngram_max", "2"}}).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("spec_ngram_min")));
  EXPECT_OK(TryOpen({{"spec", "16"}, {"spec_ngram_min", "2"}, {"spec_ngram_max", "4"}}).status());
  // A shortest draft longer than the longest would leave speculation silently off.
  EXPECT_THAT(
      TryOpen({{"spec", "2"}, {"spec_min", "5"}}).status(),
      StatusIs(absl::StatusCode::kInvalidArgument,
               HasSubstr("spec_min (COLI_K3_SPEC_MIN) = 5 exceeds spec (COLI_K3_SPEC) = 2")));
  EXPECT_OK(TryOpen({{"spec", "4"}, {"spec_min", "4"}}).status());
  EXPECT_OK(TryOpen({{"spec", "0"}, {"spec_min", "5"}}).status());  // off: nothing to verify
}

// ABI 1.6 session_reusable agrees with what Prefill then keeps while verified draft tokens are
// still buffered (not delivered): the record is the delivered one, which the next turn extends.
TEST_F(K3SpecPluginTest, ReusableAgreesWithPrefillWhileDraftTokensAreBuffered) {
  coli_model_t* on = Open(6, 0);
  coli_model_t* off = Open(0, 0);
  const std::vector<int32_t> prompt = Walk(off, 9, kWalk);
  coli_session_t* s = NewSession(on);
  Prefill(s, prompt);
  std::vector<int32_t> delivered;
  double accepted = 0;
  for (int i = 0; i < kSteps && accepted == 0; ++i) {
    delivered.push_back(Call({s}, {Knobs{}})[0].token);
    accepted = Stats(s)["spec_accepted_tokens"];
  }
  ASSERT_GT(accepted, 0) << "no draft was accepted: nothing is buffered";
  std::vector<int32_t> record = prompt;
  record.insert(record.end(), delivered.begin(), delivered.end() - 1);
  ASSERT_EQ(Record(s), record);
  std::vector<int32_t> follow = prompt;
  follow.insert(follow.end(), delivered.begin(), delivered.end());
  const std::vector<int32_t> more = Ids(5, 9);
  follow.insert(follow.end(), more.begin(), more.end());
  Error err;
  uint64_t reusable = 12345;
  ASSERT_OK(
      err.Status(api().session_reusable(on, s, follow.data(), follow.size(), &reusable, &err.e)));
  const coli_prefill_result_t r = Prefill(s, follow);
  EXPECT_EQ(reusable, r.tokens_reused);
  EXPECT_EQ(reusable, record.size());
}

}  // namespace
}  // namespace coli::k3
