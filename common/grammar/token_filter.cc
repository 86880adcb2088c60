// TokenFilter: a trie over the vocabulary's token bytes, walked depth-first
// with the matcher's machine state (one state copy + one byte step per trie
// edge, so a prefix shared by many tokens is matched once; a rejected byte
// prunes its whole subtree). Results are memoised per machine state, least
// recently used out, within a byte budget: inside a long string the state
// repeats token after token.
#include <algorithm>
#include <list>
#include <mutex>
#include <numeric>
#include <string_view>
#include <unordered_map>
#include <utility>

#include "common/grammar/grammar.h"
#include "common/grammar/json_constraint.h"

namespace coli::grammar {

using internal::Machine;
using internal::MachineState;

struct TokenFilter::Trie {
  struct Node {
    uint32_t edges_begin = 0, edges_end = 0;    // into edge_byte / edge_child
    uint32_t tokens_begin = 0, tokens_end = 0;  // into tokens: ids whose bytes end here
    uint32_t subtree_end = 0;  // tokens[tokens_begin, subtree_end): every token at or below
    bool plain_below = true;   // every byte below this node is Machine::IsPlainStringByte
  };
  std::vector<Node> nodes;
  std::vector<uint8_t> edge_byte;
  std::vector<uint32_t> edge_child;
  std::vector<int32_t> tokens;
  std::vector<int32_t> nonempty;  // every token with bytes (the unconstrained answer)
  int32_t vocab = 0;
  int max_depth = 0;

  // The memo: entries in use order (least recent first), indexed by key.
  struct Entry {
    std::string key;
    std::vector<uint8_t> allowed;
  };
  static constexpr size_t kEntryOverhead = 96;  // list node, index slot, vector / string heads
  size_t EntryBytes(size_t key_bytes) const {
    return static_cast<size_t>(vocab) + key_bytes + kEntryOverhead;
  }
  size_t budget = 0;
  mutable std::mutex mu;
  mutable std::list<Entry> lru;
  mutable std::unordered_map<std::string_view, std::list<Entry>::iterator> index;
  mutable size_t used = 0;
  mutable uint64_t hits = 0, misses = 0;

  // Builds the subtree of the tokens order[lo, hi), all sharing their first
  // `depth` bytes.
  uint32_t Build(const std::vector<std::string>& bytes, const std::vector<int32_t>& order,
                 size_t lo, size_t hi, size_t depth) {
    const uint32_t id = static_cast<uint32_t>(nodes.size());
    nodes.emplace_back();
    max_depth = std::max(max_depth, static_cast<int>(depth));
    // Sorted order puts the tokens that end here first.
    size_t i = lo;
    nodes[id].tokens_begin = static_cast<uint32_t>(tokens.size());
    while (i < hi && bytes[order[i]].size() == depth) tokens.push_back(order[i++]);
    nodes[id].tokens_end = static_cast<uint32_t>(tokens.size());
    // Group the rest by their next byte; reserve the edges before building the
    // children.
    std::vector<std::pair<size_t, size_t>> groups;
    while (i < hi) {
      const uint8_t b = static_cast<uint8_t>(bytes[order[i]][depth]);
      size_t j = i;
      while (j < hi && static_cast<uint8_t>(bytes[order[j]][depth]) == b) ++j;
      groups.emplace_back(i, j);
      i = j;
    }
    const uint32_t first_edge = static_cast<uint32_t>(edge_byte.size());
    nodes[id].edges_begin = first_edge;
    nodes[id].edges_end = first_edge + static_cast<uint32_t>(groups.size());
    for (const auto& [a, b] : groups) {
      edge_byte.push_back(static_cast<uint8_t>(bytes[order[a]][depth]));
      edge_child.push_back(0);
    }
    bool plain = true;
    for (size_t g = 0; g < groups.size(); ++g) {
      const uint32_t child = Build(bytes, order, groups[g].first, groups[g].second, depth + 1);
      edge_child[first_edge + g] = child;
      plain = plain && nodes[child].plain_below &&
              Machine::IsPlainStringByte(edge_byte[first_edge + g]);
    }
    nodes[id].plain_below = plain;
    nodes[id].subtree_end = static_cast<uint32_t>(tokens.size());
    return id;
  }

  // Marks the tokens below `node` that `cur` (the state after the node's bytes) allows. slots
  // [depth + 1 ..] are scratch states for the deeper levels.
  void Walk(const Machine& m, uint32_t node, int depth, const MachineState& cur,
            std::vector<MachineState>& slots, uint8_t* out) const {
    const Node& n = nodes[node];
    for (uint32_t e = n.edges_begin; e < n.edges_end; ++e) {
      const MachineState* next = &cur;
      if (!m.IsNoOp(cur, edge_byte[e])) {
        MachineState& s = slots[depth + 1];
        s = cur;
        if (!m.Step(s, edge_byte[e])) continue;
        next = &s;
      }
      const Node& child = nodes[edge_child[e]];
      // Inside a string with room for the rest of every token below, a subtree of only plain
      // bytes is allowed whole, unwalked.
      const bool whole = child.plain_below && m.TakesPlainRun(*next, max_depth - depth - 1);
      const uint32_t end = whole ? child.subtree_end : child.tokens_end;
      for (uint32_t t = child.tokens_begin; t < end; ++t) out[tokens[t]] = 1;
      if (!whole) Walk(m, edge_child[e], depth + 1, *next, slots, out);
    }
  }
};

TokenFilter::TokenFilter(const std::vector<std::string>& token_bytes, size_t memo_bytes)
    : trie_(std::make_unique<Trie>()) {
  trie_->budget = memo_bytes;
  trie_->vocab = static_cast<int32_t>(token_bytes.size());
  std::vector<int32_t> order;
  for (int32_t i = 0; i < trie_->vocab; ++i) {
    if (!token_bytes[i].empty()) order.push_back(i);
  }
  trie_->nonempty = order;
  std::sort(order.begin(), order.end(), [&token_bytes](int32_t a, int32_t b) {
    return token_bytes[a] < token_bytes[b] || (token_bytes[a] == token_bytes[b] && a < b);
  });
  trie_->Build(token_bytes, order, 0, order.size(), 0);
}

TokenFilter::~TokenFilter() = default;

int32_t TokenFilter::vocab_size() const { return trie_->vocab; }

void TokenFilter::Allowed(const JsonMatcher& matcher, std::vector<uint8_t>* allowed) const {
  allowed->assign(static_cast<size_t>(trie_->vocab), 0);
  const JsonMatcher::State& st = *matcher.state_;
  if (st.machine == nullptr) {
    for (int32_t id : trie_->nonempty) (*allowed)[id] = 1;
    return;
  }
  std::string key;
  st.machine->Key(st.m, trie_->max_depth, &key);
  Trie& t = *trie_;
  {
    std::lock_guard<std::mutex> lock(t.mu);
    if (auto it = t.index.find(key); it != t.index.end()) {
      t.lru.splice(t.lru.end(), t.lru, it->second);  // now the most recent
      *allowed = it->second->allowed;
      ++t.hits;
      return;
    }
    ++t.misses;
  }
  std::vector<MachineState> slots(static_cast<size_t>(t.max_depth) + 1);
  t.Walk(*st.machine, 0, 0, st.m, slots, allowed->data());
  const size_t cost = t.EntryBytes(key.size());
  if (cost > t.budget) return;
  std::lock_guard<std::mutex> lock(t.mu);
  if (t.index.count(key) != 0) return;  // another thread walked the same state meanwhile
  Trie::Entry entry;
  while (t.used + cost > t.budget) {
    // Out goes the least recently used; its buffer is reused (no fresh pages per miss).
    Trie::Entry& old = t.lru.front();
    t.index.erase(std::string_view(old.key));
    t.used -= t.EntryBytes(old.key.size());
    entry.allowed = std::move(old.allowed);
    t.lru.pop_front();
  }
  entry.key = std::move(key);
  entry.allowed.assign(allowed->begin(), allowed->end());
  t.lru.push_back(std::move(entry));
  t.index.emplace(std::string_view(t.lru.back().key), std::prev(t.lru.end()));
  t.used += cost;
}

TokenFilter::MemoStats TokenFilter::memo_stats() const {
  std::lock_guard<std::mutex> lock(trie_->mu);
  return {.entries = trie_->lru.size(),
          .bytes = trie_->used,
          .budget = trie_->budget,
          .hits = trie_->hits,
          .misses = trie_->misses};
}

size_t TokenFilter::MemoEntryBytes(size_t key_bytes) const { return trie_->EntryBytes(key_bytes); }

}  // namespace coli::grammar
