#include "plugins/kimi_k3/prompt_logprob_memo.h"

#include <algorithm>

#include "common/sampling/sampling.h"

namespace coli::k3 {

void PromptLogprobMemo::AppendFromRow(std::span<const float> row, int32_t token) {
  entries.push_back({token, sampling::Logprob(row, token)});
  for (const auto& t : sampling::TopLogprobs(row, kDepth)) entries.push_back({t.id, t.logprob});
  ranks.push_back(sampling::LogprobRank(row, token));
}

void PromptLogprobMemo::AppendFrom(const PromptLogprobMemo& from, size_t position) {
  const size_t per = 1 + kDepth;
  const auto first = from.entries.begin() + static_cast<std::ptrdiff_t>((position - 1) * per);
  entries.insert(entries.end(), first, first + static_cast<std::ptrdiff_t>(per));
  ranks.push_back(from.ranks[position - 1]);
}

size_t PromptLogprobMemo::bytes() const {
  return tokens.size() * sizeof(int32_t) + entries.size() * sizeof(coli_logprob_t) +
         ranks.size() * sizeof(int64_t);
}

void PromptLogprobMemos::Insert(std::shared_ptr<const PromptLogprobMemo> memo) {
  const size_t size = memo->bytes();
  if (size > max_bytes_ || memo->tokens.empty()) return;
  std::lock_guard<std::mutex> lock(mu_);
  for (auto it = memos_.begin(); it != memos_.end();) {
    const std::vector<int32_t>& held = (*it)->tokens;
    if (held.size() <= memo->tokens.size() &&
        std::equal(held.begin(), held.end(), memo->tokens.begin())) {
      bytes_ -= (*it)->bytes();
      it = memos_.erase(it);
    } else {
      ++it;
    }
  }
  memos_.push_front(std::move(memo));
  bytes_ += size;
  while (bytes_ > max_bytes_) {
    bytes_ -= memos_.back()->bytes();
    memos_.pop_back();
  }
}

std::pair<std::shared_ptr<const PromptLogprobMemo>, size_t> PromptLogprobMemos::LongestShared(
    std::span<const int32_t> prompt) {
  std::lock_guard<std::mutex> lock(mu_);
  auto best = memos_.end();
  size_t best_length = 0;
  for (auto it = memos_.begin(); it != memos_.end(); ++it) {
    const std::vector<int32_t>& t = (*it)->tokens;
    const size_t n = std::min(t.size(), prompt.size());
    const size_t shared = static_cast<size_t>(
        std::mismatch(t.begin(), t.begin() + static_cast<std::ptrdiff_t>(n), prompt.begin()).first -
        t.begin());
    if (shared > best_length) {
      best = it;
      best_length = shared;
    }
  }
  if (best == memos_.end()) return {nullptr, 0};
  memos_.splice(memos_.begin(), memos_, best);
  return {memos_.front(), best_length};
}

size_t PromptLogprobMemos::bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return bytes_;
}

}  // namespace coli::k3
