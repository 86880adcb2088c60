#include "plugins/kimi_k3/prefix_cache.h"

#include <algorithm>
#include <utility>

namespace coli::k3 {
namespace {

bool Begins(std::span<const int32_t> whole, const std::vector<int32_t>& part) {
  return part.size() <= whole.size() && std::equal(part.begin(), part.end(), whole.begin());
}

}  // namespace

PrefixCache::PrefixCache(size_t max_bytes, int64_t min_tokens)
    : max_bytes_(max_bytes), min_tokens_(std::max<int64_t>(1, min_tokens)) {}

std::list<PrefixCache::Entry>::iterator PrefixCache::FindLocked(std::span<const int32_t> tokens) {
  return std::find_if(entries_.begin(), entries_.end(), [&](const Entry& e) {
    return e.state->at.tokens.size() == tokens.size() && Begins(tokens, e.state->at.tokens);
  });
}

bool PrefixCache::Wants(std::span<const int32_t> tokens) {
  if (static_cast<int64_t>(tokens.size()) < min_tokens_ || max_bytes_ == 0) return false;
  std::lock_guard<std::mutex> lock(mu_);
  auto it = FindLocked(tokens);
  if (it == entries_.end()) return true;
  entries_.splice(entries_.begin(), entries_, it);
  return false;
}

bool PrefixCache::Insert(PrefixState p) {
  if (static_cast<int64_t>(p.at.tokens.size()) < min_tokens_) return false;
  const size_t bytes = p.bytes();
  if (bytes > max_bytes_) return false;
  // Built outside the lock: nothing below copies the state again.
  auto state = std::make_shared<const PrefixState>(std::move(p));
  std::lock_guard<std::mutex> lock(mu_);
  if (auto it = FindLocked(state->at.tokens); it != entries_.end()) {
    if (!it->state->at.logits.empty() || state->at.logits.empty()) {
      entries_.splice(entries_.begin(), entries_, it);
      return false;
    }
    bytes_ -= it->bytes;
    entries_.erase(it);
  }
  entries_.push_front(Entry{std::move(state), bytes});
  bytes_ += bytes;
  while (bytes_ > max_bytes_) {  // the new entry fits alone, so it is never the one dropped
    bytes_ -= entries_.back().bytes;
    entries_.pop_back();
  }
  return true;
}

std::shared_ptr<const PrefixState> PrefixCache::Deepest(std::span<const int32_t> prompt,
                                                        size_t deeper_than) {
  std::lock_guard<std::mutex> lock(mu_);
  auto best = entries_.end();
  for (auto it = entries_.begin(); it != entries_.end(); ++it) {
    const PrefixState& s = *it->state;
    const size_t n = s.at.tokens.size();
    if (n <= deeper_than || (best != entries_.end() && n <= best->state->at.tokens.size())) {
      continue;
    }
    if (n == prompt.size() && s.at.logits.empty()) continue;  // nothing left to run
    if (Begins(prompt, s.at.tokens)) best = it;
  }
  if (best == entries_.end()) return nullptr;
  entries_.splice(entries_.begin(), entries_, best);
  ++hits_;
  return best->state;
}

void PrefixCache::Clear() {
  std::lock_guard<std::mutex> lock(mu_);
  entries_.clear();
  bytes_ = 0;
}

size_t PrefixCache::bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return bytes_;
}

size_t PrefixCache::entries() const {
  std::lock_guard<std::mutex> lock(mu_);
  return entries_.size();
}

uint64_t PrefixCache::hits() const {
  std::lock_guard<std::mutex> lock(mu_);
  return hits_;
}

}  // namespace coli::k3
