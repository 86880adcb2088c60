// The prompt-lookup draft matcher (plugins/kimi_k3/spec_lookup): hand-worked cases (longest
// suffix first, most recent occurrence, no match, a match whose continuation runs to the end,
// the K cap, bad options) and random contexts against a naive reference written differently
// (forward scan keeping the last occurrence of each suffix length).
#include "plugins/kimi_k3/spec_lookup.h"

#include <algorithm>
#include <cstdint>
#include <random>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "plugins/kimi_k3/spec_decode.h"

namespace coli::k3 {
namespace {

using ::testing::ElementsAre;
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
  int matched = 0;
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
  }
  EXPECT_GT(matched, 500);  // the comparison covered many real matches
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

}  // namespace
}  // namespace coli::k3
