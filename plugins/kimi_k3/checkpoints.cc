#include "plugins/kimi_k3/checkpoints.h"

#include <algorithm>
#include <iterator>

namespace coli::k3 {
namespace {

bool Begins(std::span<const int32_t> seq, const std::vector<int32_t>& prefix) {
  return prefix.size() <= seq.size() && std::equal(prefix.begin(), prefix.end(), seq.begin());
}

}  // namespace

size_t CheckpointCache::bytes() const {
  size_t n = 0;
  for (const Checkpoint& c : entries_) n += c.bytes();
  return n;
}

void CheckpointCache::Put(Checkpoint c) {
  if (slots_ <= 0) return;
  entries_.remove_if([&](const Checkpoint& e) { return e.tokens == c.tokens; });
  entries_.push_front(std::move(c));
  while (entries_.size() > static_cast<size_t>(slots_)) entries_.pop_back();
}

const Checkpoint* CheckpointCache::Deepest(std::span<const int32_t> prompt,
                                           std::span<const int32_t> record) {
  auto best = entries_.end();
  for (auto it = entries_.begin(); it != entries_.end(); ++it) {
    const size_t p = it->tokens.size();
    if (p == 0 || (p == prompt.size() && it->logits.empty())) continue;
    if (!Begins(prompt, it->tokens) || !Begins(record, it->tokens)) continue;
    if (best == entries_.end() || p > best->tokens.size()) best = it;
  }
  if (best == entries_.end()) return nullptr;
  entries_.splice(entries_.begin(), entries_, best);
  return &entries_.front();
}

int64_t LastMessageStart(std::span<const int32_t> prompt, int32_t end_of_msg) {
  int seen = 0;
  for (int64_t i = static_cast<int64_t>(prompt.size()) - 1; i >= 0; --i) {
    if (prompt[i] == end_of_msg && ++seen == 2) return i + 1;
  }
  return -1;
}

}  // namespace coli::k3
