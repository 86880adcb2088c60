// kimi_k3's PromptLogprobMemos (plugins/kimi_k3/prompt_logprob_memo.h) on its own, with budgets
// small enough that memos are dropped: the plugin's 64 MB never fills on the tiny fixture, so its
// tests never reach the eviction path. Also run under AddressSanitizer (scripts/sanitize.sh):
// memos evicted while other threads read the ones they were handed.
#include "plugins/kimi_k3/prompt_logprob_memo.h"

#include <atomic>
#include <cstdint>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include "common/sampling/sampling.h"
#include "gtest/gtest.h"

namespace coli::k3 {
namespace {

constexpr size_t kPer = 1 + PromptLogprobMemo::kDepth;

// The logits after tokens [0, i) of a made-up model: depend on exactly those tokens.
std::vector<float> Row(std::span<const int32_t> before) {
  uint64_t h = 1469598103934665603ull;
  for (int32_t t : before) h = (h ^ static_cast<uint64_t>(t)) * 1099511628211ull;
  std::mt19937_64 rng(h);
  std::vector<float> row(48);
  for (float& x : row) x = static_cast<float>(rng() % 1000) / 100.0f;
  return row;
}

std::shared_ptr<const PromptLogprobMemo> MemoOf(const std::vector<int32_t>& tokens) {
  auto memo = std::make_shared<PromptLogprobMemo>();
  memo->tokens = tokens;
  for (size_t i = 1; i < tokens.size(); ++i) {
    memo->AppendFromRow(Row(std::span<const int32_t>(tokens).first(i)), tokens[i]);
  }
  return memo;
}

TEST(PromptLogprobMemos, AnEntryIsItsRowsLogprobTopAndRank) {
  const std::vector<int32_t> tokens = {3, 9, 27, 4};
  const auto memo = MemoOf(tokens);
  ASSERT_EQ(memo->entries.size(), 3 * kPer);
  ASSERT_EQ(memo->ranks.size(), 3u);
  for (size_t i = 1; i < tokens.size(); ++i) {
    const std::vector<float> row = Row(std::span<const int32_t>(tokens).first(i));
    const coli_logprob_t* e = &memo->entries[(i - 1) * kPer];
    EXPECT_EQ(e[0].id, tokens[i]);
    EXPECT_EQ(e[0].logprob, sampling::Logprob(row, tokens[i]));
    const auto top = sampling::TopLogprobs(row, PromptLogprobMemo::kDepth);
    for (size_t k = 0; k < top.size(); ++k) {
      EXPECT_EQ(e[1 + k].id, top[k].id) << "position " << i << " alternative " << k;
      EXPECT_EQ(e[1 + k].logprob, top[k].logprob);
    }
    EXPECT_EQ(memo->ranks[i - 1], sampling::LogprobRank(row, tokens[i]));
  }
  // AppendFrom copies a position's entry and rank as they are.
  PromptLogprobMemo copy;
  for (size_t i = 1; i < tokens.size(); ++i) copy.AppendFrom(*memo, i);
  EXPECT_EQ(copy.ranks, memo->ranks);
  ASSERT_EQ(copy.entries.size(), memo->entries.size());
  for (size_t j = 0; j < copy.entries.size(); ++j) {
    EXPECT_EQ(copy.entries[j].id, memo->entries[j].id);
    EXPECT_EQ(copy.entries[j].logprob, memo->entries[j].logprob);
  }
}

TEST(PromptLogprobMemos, LongestSharedPrefixCoveredMemosAndTheBudget) {
  const auto a = MemoOf({1, 2, 3, 4});
  const auto b = MemoOf({1, 2, 3, 4, 5, 6});
  const auto c = MemoOf({7, 8, 9, 10});
  const auto d = MemoOf({11, 12, 13, 14});
  // Room for two memos of four tokens, not three.
  PromptLogprobMemos memos(2 * a->bytes() + a->bytes() / 2);
  const std::vector<int32_t> none = {42};
  EXPECT_EQ(memos.LongestShared(none).first, nullptr);
  EXPECT_EQ(memos.LongestShared(none).second, 0u);

  memos.Insert(a);
  auto [found, shared] = memos.LongestShared(std::vector<int32_t>{1, 2, 9});
  EXPECT_EQ(found, a);
  EXPECT_EQ(shared, 2u);
  EXPECT_EQ(memos.LongestShared(none).first, nullptr) << "no shared token";

  // b begins with a: a goes.
  PromptLogprobMemos big(10 * b->bytes());
  big.Insert(a);
  big.Insert(b);
  EXPECT_EQ(big.bytes(), b->bytes());
  EXPECT_EQ(big.LongestShared(std::vector<int32_t>{1, 2, 3, 4}).first, b);

  // LRU: c then a used; d's insert drops the least recently used (c), not a.
  memos.Insert(c);
  EXPECT_EQ(memos.bytes(), a->bytes() + c->bytes());
  EXPECT_EQ(memos.LongestShared(std::vector<int32_t>{1}).first, a);
  memos.Insert(d);
  EXPECT_EQ(memos.bytes(), a->bytes() + d->bytes());
  EXPECT_EQ(memos.LongestShared(std::vector<int32_t>{7, 8}).first, nullptr) << "c was dropped";
  EXPECT_EQ(memos.LongestShared(std::vector<int32_t>{1, 2}).first, a);
  EXPECT_EQ(memos.LongestShared(std::vector<int32_t>{11}).first, d);

  // Not kept: a memo larger than the whole budget, and one without tokens.
  PromptLogprobMemos small(a->bytes() - 1);
  small.Insert(a);
  small.Insert(std::make_shared<PromptLogprobMemo>());
  EXPECT_EQ(small.bytes(), 0u);
  EXPECT_EQ(small.LongestShared(std::vector<int32_t>{1, 2}).first, nullptr);
}

// Threads insert and look up memos of prompts sharing prefixes, under a budget of a few memos,
// and read every entry of the memo they were handed while others evict it: what they read is
// what the memo's tokens give, and the budget holds throughout.
TEST(PromptLogprobMemos, MemosHandedOutStayWholeWhileOthersEvictThem) {
  const size_t one = MemoOf(std::vector<int32_t>(12, 1))->bytes();
  PromptLogprobMemos memos(3 * one);
  std::atomic<int> wrong{0}, over_budget{0}, hits{0};
  auto work = [&](int thread) {
    std::mt19937 rng(static_cast<uint32_t>(thread));
    for (int round = 0; round < 150; ++round) {
      std::vector<int32_t> prompt = {5, 6};
      const size_t length = 3 + rng() % 10;
      while (prompt.size() < length) prompt.push_back(static_cast<int32_t>(rng() % 4));
      auto [memo, shared] = memos.LongestShared(prompt);
      if (memo != nullptr) {
        ++hits;
        for (size_t i = 1; i < shared; ++i) {  // entries of positions [1, shared) are the prompt's
          const std::vector<float> row = Row(std::span<const int32_t>(prompt).first(i));
          const coli_logprob_t& e = memo->entries[(i - 1) * kPer];
          if (e.id != prompt[i] || e.logprob != sampling::Logprob(row, prompt[i])) ++wrong;
        }
      }
      memos.Insert(MemoOf(prompt));
      if (memos.bytes() > 3 * one) ++over_budget;
    }
  };
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) threads.emplace_back(work, t);
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(wrong.load(), 0);
  EXPECT_EQ(over_budget.load(), 0);
  EXPECT_GT(hits.load(), 0);
}

}  // namespace
}  // namespace coli::k3
