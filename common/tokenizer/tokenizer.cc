// Encoding, decoding and streaming. The loaders are in loaders.cc.
#include "common/tokenizer/tokenizer.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <queue>

#include "absl/container/inlined_vector.h"
#include "absl/strings/str_cat.h"
#include "common/tokenizer/utf8.h"

namespace coli::tok {
namespace {

constexpr int32_t kNoRank = std::numeric_limits<int32_t>::max();

// The vendor's long-input limits (tokenization_kimi.py, from Meta's Llama 3 tokenizer).
constexpr size_t kMaxEncodeChars = 400'000;
constexpr size_t kMaxConsecutiveChars = 25'000;

// Pieces up to this many bytes use tiktoken's own rescan loop (fastest for short words);
// longer ones use a heap so a 1 MB piece is O(n log n), not O(n^2).
constexpr size_t kHeapThreshold = 128;

}  // namespace

Tokenizer::~Tokenizer() = default;

int32_t Tokenizer::Rank(std::string_view bytes) const {
  if (bytes.size() == 2) {
    int32_t r = pair_rank_[(static_cast<uint8_t>(bytes[0]) << 8) | static_cast<uint8_t>(bytes[1])];
    return r < 0 ? kNoRank : r;
  }
  if (bytes.size() == 1) return byte_token_[static_cast<uint8_t>(bytes[0])];
  if (bytes.size() > max_token_bytes_) return kNoRank;
  auto it = base_.find(bytes);
  return it == base_.end() ? kNoRank : it->second;
}

void Tokenizer::RankBpe(std::string_view piece, std::vector<int32_t>* out) const {
  const size_t n = piece.size();
  if (n == 1) {
    out->push_back(byte_token_[static_cast<uint8_t>(piece[0])]);
    return;
  }
  if (n <= kHeapThreshold) {
    // tiktoken's _byte_pair_merge: parts[i] = (start, rank of the pair starting there).
    struct Part {
      uint32_t start;
      int32_t rank;
    };
    absl::InlinedVector<Part, kHeapThreshold + 1> parts(n + 1);
    for (size_t i = 0; i + 1 < n; ++i) {
      parts[i] = {static_cast<uint32_t>(i), Rank(piece.substr(i, 2))};
    }
    parts[n - 1] = {static_cast<uint32_t>(n - 1), kNoRank};
    parts[n] = {static_cast<uint32_t>(n), kNoRank};
    auto pair_rank = [&](size_t i) {
      if (i + 3 >= parts.size()) return kNoRank;
      return Rank(piece.substr(parts[i].start, parts[i + 3].start - parts[i].start));
    };
    while (true) {
      int32_t min_rank = kNoRank;
      size_t min_i = 0;
      for (size_t i = 0; i + 1 < parts.size(); ++i) {
        if (parts[i].rank < min_rank) {
          min_rank = parts[i].rank;
          min_i = i;
        }
      }
      if (min_rank == kNoRank) break;
      if (min_i > 0) parts[min_i - 1].rank = pair_rank(min_i - 1);
      parts[min_i].rank = pair_rank(min_i);
      parts.erase(parts.begin() + min_i + 1);
    }
    for (size_t i = 0; i + 1 < parts.size(); ++i) {
      out->push_back(Rank(piece.substr(parts[i].start, parts[i + 1].start - parts[i].start)));
    }
    return;
  }

  // Heap form: a linked list of current tokens; heap entries (rank, start) name the pair of
  // the token starting at `start` and its right neighbour, valid while that pair's right end
  // is still `end` (a token only ever grows, so any merge touching the pair changes it).
  std::vector<uint32_t> next(n), prev(n);
  std::vector<uint8_t> alive(n, 1);
  for (size_t i = 0; i < n; ++i) {
    next[i] = static_cast<uint32_t>(i + 1);
    prev[i] = static_cast<uint32_t>(i == 0 ? n : i - 1);
  }
  auto token_end = [&](uint32_t i) -> uint32_t { return i >= n ? n : next[i]; };
  struct Entry {
    int32_t rank;
    uint32_t start;
    uint32_t end;
    bool operator>(const Entry& o) const {
      return rank != o.rank ? rank > o.rank : start > o.start;
    }
  };
  std::vector<Entry> storage;
  storage.reserve(n);
  std::priority_queue<Entry, std::vector<Entry>, std::greater<Entry>> heap(std::greater<Entry>(),
                                                                           std::move(storage));
  auto push_pair = [&](uint32_t i) {
    if (i >= n) return;
    uint32_t j = next[i];
    if (j >= n) return;
    uint32_t end = token_end(j);
    int32_t r = Rank(piece.substr(i, end - i));
    if (r != kNoRank) heap.push({r, i, end});
  };
  for (uint32_t i = 0; i + 1 < n; ++i) push_pair(i);
  while (!heap.empty()) {
    Entry e = heap.top();
    heap.pop();
    if (!alive[e.start] || next[e.start] >= n || token_end(next[e.start]) != e.end) continue;
    uint32_t j = next[e.start];
    alive[j] = 0;
    next[e.start] = next[j];
    if (next[j] < n) prev[next[j]] = e.start;
    push_pair(e.start);
    if (prev[e.start] < n) push_pair(prev[e.start]);
  }
  for (uint32_t i = 0; i < n; i = next[i]) {
    out->push_back(Rank(piece.substr(i, next[i] - i)));
  }
}

void Tokenizer::MergesBpe(std::string_view piece, std::vector<int32_t>* out) const {
  // Hugging Face BPE: symbols start as byte tokens; repeatedly apply the merge with the lowest
  // merge rank (leftmost on ties). Same linked list + heap as RankBpe, keyed by merge rank.
  const size_t n = piece.size();
  std::vector<int32_t> id(n);
  std::vector<uint32_t> next(n), prev(n);
  std::vector<uint8_t> alive(n, 1);
  for (size_t i = 0; i < n; ++i) {
    id[i] = byte_token_[static_cast<uint8_t>(piece[i])];
    next[i] = static_cast<uint32_t>(i + 1);
    prev[i] = static_cast<uint32_t>(i == 0 ? n : i - 1);
  }
  struct Entry {
    int32_t rank;
    uint32_t start;
    int32_t left, right, merged;
    bool operator>(const Entry& o) const {
      return rank != o.rank ? rank > o.rank : start > o.start;
    }
  };
  std::priority_queue<Entry, std::vector<Entry>, std::greater<Entry>> heap;
  auto push_pair = [&](uint32_t i) {
    if (i >= n || next[i] >= n) return;
    uint64_t key = (static_cast<uint64_t>(static_cast<uint32_t>(id[i])) << 32) |
                   static_cast<uint32_t>(id[next[i]]);
    auto it = merges_.find(key);
    if (it != merges_.end()) heap.push({it->second.first, i, id[i], id[next[i]], it->second.second});
  };
  for (uint32_t i = 0; i + 1 < n; ++i) push_pair(i);
  while (!heap.empty()) {
    Entry e = heap.top();
    heap.pop();
    if (!alive[e.start] || id[e.start] != e.left || next[e.start] >= n ||
        id[next[e.start]] != e.right) {
      continue;
    }
    uint32_t j = next[e.start];
    alive[j] = 0;
    id[e.start] = e.merged;
    next[e.start] = next[j];
    if (next[j] < n) prev[next[j]] = e.start;
    push_pair(e.start);
    if (prev[e.start] < n) push_pair(prev[e.start]);
  }
  for (uint32_t i = 0; i < n; i = next[i]) out->push_back(id[i]);
}

void Tokenizer::EncodePiece(std::string_view piece, std::vector<int32_t>* out) const {
  if (piece.empty()) return;
  if (!merges_bpe_ || ignore_merges_) {
    // tiktoken: a piece that is itself a token is emitted as is.
    int32_t r = Rank(piece);
    if (r != kNoRank) {
      out->push_back(r);
      return;
    }
  }
  if (merges_bpe_) {
    MergesBpe(piece, out);
  } else {
    RankBpe(piece, out);
  }
}

void Tokenizer::EncodeOrdinary(std::string_view text, std::vector<int32_t>* out) const {
  split_->ForEachPiece(text, keep_gaps_, [&](std::string_view piece) { EncodePiece(piece, out); });
}

void Tokenizer::EncodeSlice(std::string_view text, bool allow_special,
                            std::vector<int32_t>* out) const {
  if (!allow_special || added_.empty()) {
    EncodeOrdinary(text, out);
    return;
  }
  size_t segment = 0;
  size_t pos = 0;
  while (pos < text.size()) {
    const auto& candidates = specials_by_first_byte_[static_cast<uint8_t>(text[pos])];
    int32_t found = -1;
    for (int32_t id : candidates) {
      const std::string& s = tokens_[id];
      if (text.size() - pos >= s.size() && std::memcmp(text.data() + pos, s.data(), s.size()) == 0) {
        found = id;
        break;
      }
    }
    if (found < 0) {
      ++pos;
      continue;
    }
    EncodeOrdinary(text.substr(segment, pos - segment), out);
    out->push_back(found);
    pos += tokens_[found].size();
    segment = pos;
  }
  EncodeOrdinary(text.substr(segment), out);
}

std::vector<int32_t> Tokenizer::Encode(std::string_view text, bool allow_special) const {
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 4);
  std::string cleaned;
  if (!IsValidUtf8(text)) {
    cleaned = ReplaceInvalidUtf8(text);
    text = cleaned;
  }
  // At most one character per byte: short texts cannot reach the slicing limits.
  if (!vendor_slicing_ || text.size() <= kMaxConsecutiveChars) {
    EncodeSlice(text, allow_special, &out);
    return out;
  }
  // tokenization_kimi.py: 400,000-character slices, each cut wherever a run of whitespace or
  // non-whitespace characters would exceed 25,000 (counted in code points).
  size_t pos = 0;
  while (pos < text.size()) {
    size_t slice_end = pos;
    for (size_t chars = 0; chars < kMaxEncodeChars && slice_end < text.size(); ++chars) {
      slice_end += Utf8SequenceLength(text.substr(slice_end));
    }
    std::string_view slice = text.substr(pos, slice_end - pos);
    size_t start = 0;
    size_t run = 0;
    bool run_is_space = false;
    for (size_t i = 0; i < slice.size();) {
      size_t len = Utf8SequenceLength(slice.substr(i));
      bool space = IsPythonSpace(DecodeUtf8(slice.substr(i), len));
      if (i == 0) run_is_space = space;
      if (space != run_is_space) {
        run = 1;
        run_is_space = space;
      } else if (++run > kMaxConsecutiveChars) {
        EncodeSlice(slice.substr(start, i - start), allow_special, &out);
        start = i;
        run = 1;
      }
      i += len;
    }
    EncodeSlice(slice.substr(start), allow_special, &out);
    pos = slice_end;
  }
  return out;
}

absl::StatusOr<std::string> Tokenizer::Decode(std::span<const int32_t> ids) const {
  std::string out;
  for (size_t i = 0; i < ids.size(); ++i) {
    int32_t id = ids[i];
    if (id < 0 || id >= vocab_size()) {
      return absl::InvalidArgumentError(absl::StrCat("token id ", id, " (position ", i,
                                                     ") is outside the vocabulary [0, ",
                                                     vocab_size(), ")"));
    }
    out.append(tokens_[id]);
  }
  return out;
}

std::optional<int32_t> Tokenizer::TokenId(std::string_view special_or_token) const {
  if (auto it = added_.find(special_or_token); it != added_.end()) return it->second;
  if (auto it = base_.find(special_or_token); it != base_.end()) return it->second;
  return std::nullopt;
}

bool Tokenizer::IsSpecial(int32_t id) const {
  return id >= 0 && id < vocab_size() && kind_[id] == 2;
}

bool Tokenizer::IsAdded(int32_t id) const {
  return id >= 0 && id < vocab_size() && kind_[id] != 0;
}

std::string_view Tokenizer::TokenBytes(int32_t id) const {
  if (id < 0 || id >= vocab_size()) return {};
  return tokens_[id];
}

StreamDecoder::StreamDecoder(const Tokenizer& tokenizer, bool replace_invalid)
    : tokenizer_(tokenizer), replace_invalid_(replace_invalid) {}

std::string StreamDecoder::Push(int32_t id) {
  pending_.append(tokenizer_.TokenBytes(id));
  return Emit(/*final=*/false);
}

std::string StreamDecoder::Flush() { return Emit(/*final=*/true); }

std::string StreamDecoder::Emit(bool final) {
  size_t n = final ? pending_.size() : CompleteUtf8Prefix(pending_);
  std::string out;
  if (replace_invalid_) {
    out = ReplaceInvalidUtf8(std::string_view(pending_).substr(0, n));
  } else {
    out = pending_.substr(0, n);
  }
  pending_.erase(0, n);
  return out;
}

}  // namespace coli::tok
