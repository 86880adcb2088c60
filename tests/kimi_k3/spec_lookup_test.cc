// The prompt-lookup draft matcher (plugins/kimi_k3/spec_lookup): hand-worked cases (longest
// suffix first, most recent occurrence, no match, a match whose continuation runs to the end,
// the K cap, bad options) and random contexts against a naive reference written differently
// (forward scan keeping the last occurrence of each suffix length).
#include "plugins/kimi_k3/spec_lookup.h"

#include <algorithm>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "plugins/kimi_k3/spec_decode.h"

namespace coli::k3 {
namespace {

using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

std::vector<int32_t> Draft(const std::vector<int32_t>& context, int max_n, int min_n, int k) {
  return LookupDraft(context, {.ngram_max = max_n, .ngram_min = min_n, .max_tokens = k});
}

TEST(K3SpecLookup, LongestSuffixWinsOverMoreRecentShorterOne) {
  // Suffix "1 2 3" occurs at 0 (followed by 7 8); "2 3" alone occurs later at 6 (followed by 9).
  const std::vector<int32_t> c = {1, 2, 3, 7, 8, 5, 2, 3, 9, 1, 2, 3};
  EXPECT_THAT(Draft(c, 3, 1, 2), ElementsAre(7, 8));
  // With n capped at 2 the most recent "2 3" wins.
  EXPECT_THAT(Draft(c, 2, 1, 2), ElementsAre(9, 1));
}

TEST(K3SpecLookup, MostRecentOccurrence) {
  const std::vector<int32_t> c = {4, 5, 10, 11, 4, 5, 20, 21, 4, 5};
  EXPECT_THAT(Draft(c, 2, 1, 3), ElementsAre(20, 21, 4));
}

TEST(K3SpecLookup, NoMatch) {
  EXPECT_THAT(Draft({1, 2, 3, 4, 5}, 3, 1, 4), IsEmpty());
  EXPECT_THAT(Draft({7}, 3, 1, 4), IsEmpty());  // nothing before the suffix
  EXPECT_THAT(Draft({}, 3, 1, 4), IsEmpty());
  // A match shorter than ngram_min does not count.
  EXPECT_THAT(Draft({1, 2, 9, 2}, 3, 2, 4), IsEmpty());
}

TEST(K3SpecLookup, ContinuationStopsAtTheEndOfTheContext) {
  // The only earlier "6 7" is followed by just one token before the suffix itself.
  EXPECT_THAT(Draft({6, 7, 8, 6, 7}, 2, 2, 8), ElementsAre(8, 6, 7));
  // A repeating token: the most recent earlier "3" is one position back.
  EXPECT_THAT(Draft({3, 3, 3}, 1, 1, 5), ElementsAre(3));
  EXPECT_THAT(Draft({3, 3, 3}, 2, 1, 5), ElementsAre(3));
}

TEST(K3SpecLookup, DraftCappedAtK) {
  const std::vector<int32_t> c = {1, 2, 3, 4, 5, 6, 7, 8, 1, 2};
  EXPECT_THAT(Draft(c, 3, 1, 3), ElementsAre(3, 4, 5));
  EXPECT_THAT(Draft(c, 3, 1, 1), ElementsAre(3));
  EXPECT_THAT(Draft(c, 3, 1, 0), IsEmpty());
}

TEST(K3SpecLookup, InconsistentOptionsGiveNoDraft) {
  const std::vector<int32_t> c = {1, 2, 1, 2};
  EXPECT_THAT(Draft(c, 3, 0, 4), IsEmpty());
  EXPECT_THAT(Draft(c, 1, 2, 4), IsEmpty());
}

// Naive reference: for n from max down to min, scan all start positions forward and keep the
// last one whose n tokens equal the suffix and that ends before the last token.
std::vector<int32_t> Reference(const std::vector<int32_t>& c, int max_n, int min_n, int k) {
  const int size = static_cast<int>(c.size());
  for (int n = max_n; n >= min_n; --n) {
    if (n >= size) continue;
    int found = -1;
    for (int i = 0; i + n < size; ++i) {
      bool same = true;
      for (int j = 0; j < n; ++j) same = same && c[i + j] == c[size - n + j];
      if (same) found = i;
    }
    if (found < 0) continue;
    std::vector<int32_t> out;
    for (int j = found + n; j < size && static_cast<int>(out.size()) < k; ++j) out.push_back(c[j]);
    return out;
  }
  return {};
}

TEST(K3SpecLookup, MatchesNaiveReferenceOnRandomContexts) {
  std::mt19937 rng(7);
  int matched = 0, longer = 0;
  for (int trial = 0; trial < 2000; ++trial) {
    const int size = 1 + static_cast<int>(rng() % 40);
    const int alphabet = 2 + static_cast<int>(rng() % 6);
    std::vector<int32_t> c(size);
    for (int32_t& t : c) t = static_cast<int32_t>(rng() % alphabet);
    const int max_n = 1 + static_cast<int>(rng() % 4);
    const int min_n = 1 + static_cast<int>(rng() % max_n);
    const int k = static_cast<int>(rng() % 6);
    const auto want = Reference(c, max_n, min_n, k);
    ASSERT_EQ(Draft(c, max_n, min_n, k), want) << "trial " << trial;
    matched += want.empty() ? 0 : 1;
    // LookupDraftMatch: the same draft and the length n of the suffix it matched (the longest
    // n in [min, max] the reference finds a draft for; 0 with no draft).
    int want_n = 0;
    for (int n = max_n; n >= min_n && want_n == 0; --n) {
      if (!Reference(c, n, n, k).empty()) want_n = n;
    }
    const LookupMatch got =
        LookupDraftMatch(c, {.ngram_max = max_n, .ngram_min = min_n, .max_tokens = k});
    ASSERT_EQ(got.draft, want) << "trial " << trial;
    ASSERT_EQ(got.ngram, want_n) << "trial " << trial;
    longer += want_n >= 2 ? 1 : 0;
  }
  EXPECT_GT(matched, 500);  // the comparison covered many real matches
  EXPECT_GT(longer, 200);   // and many matches longer than one token
}

// The draft length: the maximum first, back up after full acceptance, accepted + 1 after a
// partial one, and pauses of 1, 2, 4 … 32 steps after consecutive drafts with nothing accepted.
TEST(K3SpecDraftBudget, AdaptsToAcceptance) {
  DraftBudget b;
  EXPECT_EQ(b.Next(0), 0);  // no room: no draft, and no state change
  EXPECT_EQ(b.Next(4), 4);
  b.Observe(4, 4);
  EXPECT_EQ(b.Next(4), 4);  // doubled, capped at the maximum
  b.Observe(4, 1);
  EXPECT_EQ(b.Next(4), 2);  // accepted + 1
  b.Observe(2, 2);
  EXPECT_EQ(b.Next(4), 4);  // back up
  EXPECT_EQ(b.Next(3), 3);  // the room shrank
  int pause = 1;
  for (int miss = 0; miss < 8; ++miss) {
    b.Observe(1, 0);
    for (int i = 0; i < pause; ++i) EXPECT_EQ(b.Next(4), 0) << "miss " << miss << " step " << i;
    EXPECT_EQ(b.Next(4), 1) << "miss " << miss;
    pause = std::min(pause * 2, DraftBudget::kMaxPause);
  }
  b.Observe(1, 1);  // a hit ends the streak: the next miss pauses one step again
  EXPECT_EQ(b.Next(4), 2);
  b.Observe(2, 0);
  EXPECT_EQ(b.Next(4), 0);
  EXPECT_EQ(b.Next(4), 1);
  b.Observe(0, 0);  // nothing drafted: nothing learned
  EXPECT_EQ(b.Next(4), 1);
}

// DraftBudget::Propose: a sampled row drafts only on matches of >= sampled_ngram tokens (capped
// at the lookup's ngram_max), a greedy one on any; drafts below min_tokens are dropped (after
// the stop-token cut and the K cap); a pause after a miss skips short matches but a full-length
// match ends it; the fixed policy drafts every match at full length and never pauses.
TEST(K3SpecDraftPolicy, ProposeFollowsThePolicy) {
  // ... 7 8 9 [4 5 6] ... 4 5 6 → a 3-gram match, continuation 20 21 22 23 24.
  const std::vector<int32_t> three = {7, 8, 9, 4, 5, 6, 20, 21, 22, 23, 24, 1, 4, 5, 6};
  // … 5 6 … 2 6: a 1-gram match only (6 → 20 …).
  const std::vector<int32_t> one = {7, 8, 9, 4, 5, 6, 20, 21, 22, 23, 24, 1, 2, 6};
  // 6 6 6 6: the 3-gram match at 0 is followed by one token only (the context's end).
  const std::vector<int32_t> tail = {6, 6, 6, 6};
  const LookupOptions lookup;  // n-grams 3…1
  {
    DraftBudget b;  // the default policy
    EXPECT_THAT(b.Propose(one, 4, lookup, /*sampled=*/true), IsEmpty());
    EXPECT_EQ(b.skips().short_match, 1);
    EXPECT_EQ(b.Propose(three, 4, lookup, /*sampled=*/true),
              (std::vector<int32_t>{20, 21, 22, 23}));
    EXPECT_EQ(b.Propose(one, 4, lookup, /*sampled=*/false), (std::vector<int32_t>{20, 21, 22, 23}));
    // sampled_ngram is capped at the lookup's ngram_max (2 here): a 2-gram match drafts.
    EXPECT_EQ(b.Propose(three, 4, {.ngram_max = 2}, /*sampled=*/true),
              (std::vector<int32_t>{20, 21, 22, 23}));
    // The stop token cuts the draft; the room caps it.
    const std::vector<int32_t> stop = {22};
    EXPECT_EQ(b.Propose(three, 4, lookup, false, stop), (std::vector<int32_t>{20, 21}));
    EXPECT_EQ(b.Propose(three, 2, lookup, false), (std::vector<int32_t>{20, 21}));
    EXPECT_THAT(b.Propose(three, 0, lookup, false), IsEmpty());
  }
  {
    DraftBudget b({.min_tokens = 3});
    EXPECT_EQ(b.Propose(three, 4, lookup, false), (std::vector<int32_t>{20, 21, 22, 23}));
    EXPECT_THAT(b.Propose(tail, 4, lookup, false), IsEmpty());  // only one 6 follows
    EXPECT_THAT(b.Propose(three, 4, lookup, false, std::vector<int32_t>{22}), IsEmpty());
    EXPECT_THAT(b.Propose(three, 2, lookup, false), IsEmpty());  // no room for 3
    EXPECT_EQ(b.skips().short_draft, 3);
    // After a partial acceptance the length is accepted + 1 = 2, raised to the minimum 3.
    b.Observe(4, 1);
    EXPECT_EQ(b.Propose(three, 4, lookup, false), (std::vector<int32_t>{20, 21, 22}));
  }
  {
    DraftBudget b;
    ASSERT_EQ(b.Propose(one, 4, lookup, false).size(), 4u);
    b.Observe(4, 0);  // a miss: pause one step, length 1
    EXPECT_THAT(b.Propose(one, 4, lookup, false), IsEmpty());
    EXPECT_EQ(b.skips().paused, 1);
    EXPECT_EQ(b.Propose(one, 4, lookup, false), (std::vector<int32_t>{20}));
    b.Observe(1, 0);  // the second miss: pause two steps
    EXPECT_THAT(b.Propose(one, 4, lookup, false), IsEmpty());
    // A full-length (3-gram) match ends the pause at once, at the current length.
    EXPECT_EQ(b.Propose(three, 4, lookup, false), (std::vector<int32_t>{20}));
    EXPECT_EQ(b.skips().pause_ended, 1);
    b.Observe(1, 1);
    EXPECT_EQ(b.Propose(three, 4, lookup, false), (std::vector<int32_t>{20, 21}));
    // With 1-grams only (ngram_max 1) no match is "full length": the pause holds.
    b.Observe(2, 0);
    EXPECT_THAT(b.Propose(three, 4, {.ngram_max = 1}, false), IsEmpty());
    EXPECT_EQ(b.skips().pause_ended, 1);
  }
  {
    DraftBudget b({.min_tokens = 1, .sampled_ngram = 1, .adaptive = false});  // fixed
    for (int i = 0; i < 4; ++i) {
      EXPECT_EQ(b.Propose(one, 4, lookup, /*sampled=*/true).size(), 4u) << i;
      b.Observe(4, 0);
    }
    EXPECT_EQ(b.Next(3), 3);
    EXPECT_EQ(b.skips().paused + b.skips().short_match + b.skips().short_draft, 0);
  }
}

TEST(K3SpecDraftPolicy, SwitchesParsedAndRefusedByName) {
  DraftPolicy p;
  EXPECT_EQ(ParseDraftPolicySwitch("spec_min", "4", &p).value_or(false), true);
  EXPECT_EQ(ParseDraftPolicySwitch("spec_sampled_ngram", "2", &p).value_or(false), true);
  EXPECT_EQ(ParseDraftPolicySwitch("spec_adapt", "0", &p).value_or(false), true);
  EXPECT_EQ(p, (DraftPolicy{.min_tokens = 4, .sampled_ngram = 2, .adaptive = false}));
  EXPECT_EQ(ParseDraftPolicySwitch("spec", "4", &p).value_or(true), false);  // not the policy's
  EXPECT_EQ(p, (DraftPolicy{.min_tokens = 4, .sampled_ngram = 2, .adaptive = false}));
  struct Bad {
    const char *option, *value, *env;
  };
  for (const Bad& b :
       {Bad{"spec_min", "0", "COLI_K3_SPEC_MIN"}, Bad{"spec_min", "17", "COLI_K3_SPEC_MIN"},
        Bad{"spec_min", "two", "COLI_K3_SPEC_MIN"},
        Bad{"spec_sampled_ngram", "9", "COLI_K3_SPEC_SAMPLED_NGRAM"},
        Bad{"spec_sampled_ngram", "", "COLI_K3_SPEC_SAMPLED_NGRAM"},
        Bad{"spec_adapt", "yes", "COLI_K3_SPEC_ADAPT"}}) {
    const absl::StatusOr<bool> r = ParseDraftPolicySwitch(b.option, b.value, &p);
    ASSERT_FALSE(r.ok()) << b.option << "=" << b.value;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(
        std::string(r.status().message()),
        AllOf(HasSubstr(b.option), HasSubstr(b.env), HasSubstr(std::string("'") + b.value + "'")));
  }
  EXPECT_EQ(p, (DraftPolicy{.min_tokens = 4, .sampled_ngram = 2, .adaptive = false}));
  // Every switch has a distinct option and variable.
  for (const DraftPolicySwitch& a : kDraftPolicySwitches) {
    for (const DraftPolicySwitch& b : kDraftPolicySwitches) {
      if (&a == &b) continue;
      EXPECT_NE(std::string(a.option), b.option);
      EXPECT_NE(std::string(a.env), b.env);
    }
  }
}

}  // namespace
}  // namespace coli::k3
