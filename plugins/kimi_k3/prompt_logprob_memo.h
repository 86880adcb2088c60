// plugins/kimi_k3/prompt_logprob_memo: the prompt logprobs of recent prompts (ABI 1.7), kept so
// that a prompt-logprobs prefill can continue from a kept state (the session's record, a
// checkpoint, a prefix cache entry) instead of computing the whole prompt again.
//
//   PromptLogprobMemos memos(64 << 20);
//   auto [memo, shared] = memos.LongestShared(prompt);  // entries of prompt[1, shared) known
//   ...prefill from a kept state at K <= shared, the rest computed...
//   memos.Insert(std::move(new_memo));                  // the whole prompt's, at full depth
//
// Why this is exact: the entry of prompt token i (its log-probability given tokens [0, i), the
// most likely tokens there and its rank) depends only on tokens [0, i] — the forward pass is
// causal and row-wise independent of chunking (session.h) — so any earlier prompt that begins
// with the same i + 1 tokens computed the same entry, bit for bit. Entries are kept at the
// deepest top-k a request may ask (kDepth): sampling::TopLogprobs orders strictly (ties: lower id
// first), so the first k of them are exactly TopLogprobs(row, k).
//
// Size: (1 + kDepth) * 8 + 8 bytes per position (K3: 176 B; a 100k-token prompt 17.6 MB),
// bounded by a byte budget, least recently used dropped first. Threading: every call is
// thread-safe; memos are immutable once kept and handed out as shared_ptr<const>.
#ifndef COLI_PLUGINS_KIMI_K3_PROMPT_LOGPROB_MEMO_H_
#define COLI_PLUGINS_KIMI_K3_PROMPT_LOGPROB_MEMO_H_

#include <cstddef>
#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <span>
#include <utility>
#include <vector>

#include "plugin_api/coli_plugin.h"

namespace coli::k3 {

struct PromptLogprobMemo {
  static constexpr int kDepth = 20;  // the most alternatives a request may ask (ABI 1.7)
  std::vector<int32_t> tokens;
  // For each position i in [1, tokens.size()): the entry of tokens[i], then the kDepth most
  // likely tokens there (descending).
  std::vector<coli_logprob_t> entries;
  std::vector<int64_t> ranks;  // for each such position: vLLM's rank of tokens[i]
  // Appends position i's entry computed from `row`, the logits after tokens [0, i).
  void AppendFromRow(std::span<const float> row, int32_t token);
  // Appends position i's entry as `from` holds it (same tokens [0, i]).
  void AppendFrom(const PromptLogprobMemo& from, size_t position);
  size_t bytes() const;
};

class PromptLogprobMemos {
 public:
  explicit PromptLogprobMemos(size_t max_bytes) : max_bytes_(max_bytes) {}
  // Keeps `memo` (its entries must cover all its tokens after the first) and drops the memos it
  // covers (whose tokens begin it), then the least recently used beyond the budget. A memo
  // larger than the whole budget is not kept.
  void Insert(std::shared_ptr<const PromptLogprobMemo> memo);
  // The memo sharing the longest prefix with `prompt` and the length of that prefix (its
  // entries of prompt positions [1, length) are the prompt's); {nullptr, 0} when none shares a
  // token. Marks it used.
  std::pair<std::shared_ptr<const PromptLogprobMemo>, size_t> LongestShared(
      std::span<const int32_t> prompt);
  size_t bytes() const;

 private:
  const size_t max_bytes_;
  mutable std::mutex mu_;
  std::list<std::shared_ptr<const PromptLogprobMemo>> memos_;  // most recently used first
  size_t bytes_ = 0;
};

}  // namespace coli::k3

#endif  // COLI_PLUGINS_KIMI_K3_PROMPT_LOGPROB_MEMO_H_
