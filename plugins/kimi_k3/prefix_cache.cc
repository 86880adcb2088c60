#include "plugins/kimi_k3/prefix_cache.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <random>
#include <string_view>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/io/io.h"
#include "common/log/log.h"
#include "plugins/kimi_k3/checkpoints.h"

namespace coli::k3 {
namespace {

// Parked files are "coli-k3-prefix-<pid>-<cache>-<n>.bin", or, kept across restarts,
// "coli-k3-prefix-keep-<tag>-<nonce>-<n>.bin".
constexpr char kFilePrefix[] = "coli-k3-prefix-";

// Maps this user's own parked file `path` (never through a link) and runs `parse` over its
// bytes: PeekPrefixState for the head alone (adoption), ParsePrefixState for the whole entry.
template <typename Parse>
auto ReadOwnFile(const std::string& path, Parse parse) -> decltype(parse(std::string_view())) {
  absl::StatusOr<std::unique_ptr<io::MappedFile>> file =
      io::MappedFile::Map(path, /*own_file_only=*/true);
  if (!file.ok()) return file.status();
  return parse(std::string_view(reinterpret_cast<const char*>((*file)->data()), (*file)->size()));
}

}  // namespace

PrefixCache::PrefixCache(size_t max_bytes, int64_t min_tokens, std::string dir,
                         std::string keep_tag)
    : max_bytes_(max_bytes),
      min_tokens_(std::max<int64_t>(1, min_tokens)),
      dir_(std::move(dir)),
      keep_tag_(dir_.empty() ? "" : std::move(keep_tag)) {
  if (keep_tag_.empty()) return;
  nonce_ = (uint64_t{std::random_device{}()} << 32) ^ std::random_device{}();
  Adopt();
}

PrefixCache::~PrefixCache() {
  if (keep_tag_.empty()) Clear();  // else the files stay for the next process
}

std::string PrefixCache::NewPathLocked() {
  // One name per cache and entry: several models and processes may share the folder.
  if (keep_tag_.empty()) {
    return absl::StrCat(dir_, "/", kFilePrefix, getpid(), "-", reinterpret_cast<uintptr_t>(this),
                        "-", next_file_++, ".bin");
  }
  return absl::StrCat(dir_, "/", kFilePrefix, "keep-", keep_tag_, "-",
                      absl::Hex(nonce_, absl::kZeroPad16), "-", next_file_++, ".bin");
}

void PrefixCache::Adopt() {
  const std::string head = absl::StrCat(kFilePrefix, "keep-", keep_tag_, "-");
  struct Found {
    std::string path;
    std::filesystem::file_time_type written;
    size_t bytes;
  };
  std::vector<Found> found;
  std::error_code ec;
  // (Temp files of dead writes and long unused kept files of every tag are the janitor's:
  // RemoveOrphanedParkedFiles, run when a model loads.)
  for (const std::filesystem::directory_entry& f : std::filesystem::directory_iterator(dir_, ec)) {
    const std::string name = f.path().filename().string();
    // Only this user's regular files: a state planted in a shared folder is never served.
    if (!name.starts_with(head) || !name.ends_with(".bin") ||
        !IsOwnRegularFile(f.path().string())) {
      continue;
    }
    std::error_code fec;
    const auto written = f.last_write_time(fec);
    const uintmax_t bytes = f.file_size(fec);
    if (!fec) found.push_back({f.path().string(), written, static_cast<size_t>(bytes)});
  }
  if (ec) {
    COLI_LOG(kWarning) << "kimi_k3: prefix cache: cannot list " << dir_ << ": " << ec.message();
    return;
  }
  // Most recently written (or used: Deepest touches a file it reads back) first.
  std::sort(found.begin(), found.end(),
            [](const Found& a, const Found& b) { return a.written > b.written; });
  std::lock_guard<std::mutex> lock(mu_);
  for (const Found& f : found) {
    absl::StatusOr<PrefixFileHead> file = ReadOwnFile(f.path, PeekPrefixState);
    const bool fits = file.ok() && static_cast<int64_t>(file->tokens.size()) >= min_tokens_ &&
                      bytes_ + f.bytes <= max_bytes_ && FindLocked(file->tokens) == entries_.end();
    if (!fits) {
      if (!file.ok()) {
        COLI_LOG(kWarning) << "kimi_k3: prefix cache file " << f.path
                           << " dropped: " << file.status();
      }
      std::remove(f.path.c_str());
      continue;
    }
    Entry e;
    e.tokens = std::move(file->tokens);
    e.has_logits = file->has_logits;
    e.bytes = f.bytes;
    e.path = f.path;
    bytes_ += e.bytes;
    entries_.push_back(std::move(e));  // `found` runs from the most recent
  }
  if (!entries_.empty()) {
    COLI_LOG(kInfo) << "kimi_k3: prefix cache: " << entries_.size() << " entries (" << bytes_
                    << " bytes) kept from an earlier run in " << dir_;
  }
}

std::list<PrefixCache::Entry>::iterator PrefixCache::FindLocked(std::span<const int32_t> tokens) {
  return std::find_if(entries_.begin(), entries_.end(), [&](const Entry& e) {
    return e.tokens.size() == tokens.size() && BeginsWith(tokens, e.tokens);
  });
}

void PrefixCache::DropLocked(std::list<Entry>::iterator it) {
  // A reader that already mapped the file keeps its pages; one that has not yet finds it gone
  // and looks for the next deepest entry.
  if (!it->path.empty()) std::remove(it->path.c_str());
  bytes_ -= it->bytes;
  entries_.erase(it);
}

bool PrefixCache::Wants(std::span<const int32_t> tokens) {
  if (static_cast<int64_t>(tokens.size()) < min_tokens_ || max_bytes_ == 0) return false;
  std::lock_guard<std::mutex> lock(mu_);
  auto it = FindLocked(tokens);
  if (it != entries_.end()) {
    entries_.splice(entries_.begin(), entries_, it);
    return false;
  }
  if (!parks()) return true;
  auto same = [&](const std::vector<int32_t>& c) { return std::ranges::equal(c, tokens); };
  if (std::ranges::any_of(coming_, same)) return false;
  coming_.emplace_back(tokens.begin(), tokens.end());
  return true;
}

void PrefixCache::Abandon(std::span<const int32_t> tokens) {
  std::lock_guard<std::mutex> lock(mu_);
  std::erase_if(coming_,
                [&](const std::vector<int32_t>& c) { return std::ranges::equal(c, tokens); });
}

bool PrefixCache::Insert(PrefixState p) {
  if (parks()) Abandon(p.at.tokens);  // no longer on its way, whatever happens below
  if (static_cast<int64_t>(p.at.tokens.size()) < min_tokens_) return false;
  Entry e;
  e.bytes = p.bytes();
  if (e.bytes > max_bytes_) return false;
  e.tokens = p.at.tokens;
  e.has_logits = !p.at.logits.empty();
  if (dir_.empty()) {
    e.state = std::make_shared<const PrefixState>(std::move(p));  // built outside the lock
  } else {
    {
      std::lock_guard<std::mutex> lock(mu_);
      e.path = NewPathLocked();
    }
    const std::string bytes = SerializePrefixState(p);
    e.bytes = bytes.size();
    if (e.bytes > max_bytes_) return false;
    if (absl::Status written = io::WriteFileAtomic(e.path, bytes); !written.ok()) {
      COLI_LOG(kWarning) << "kimi_k3: prefix cache entry not parked: " << written;
      return false;
    }
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (auto it = FindLocked(e.tokens); it != entries_.end()) {
    if (it->has_logits || !e.has_logits) {
      entries_.splice(entries_.begin(), entries_, it);
      if (!e.path.empty()) std::remove(e.path.c_str());
      return false;
    }
    DropLocked(it);
  }
  bytes_ += e.bytes;
  entries_.push_front(std::move(e));
  // The new entry fits alone, so it is never the one dropped.
  while (bytes_ > max_bytes_) DropLocked(std::prev(entries_.end()));
  return true;
}

std::list<PrefixCache::Entry>::const_iterator PrefixCache::FindDeepestLocked(
    std::span<const int32_t> prompt, size_t deeper_than) const {
  auto best = entries_.end();
  for (auto it = entries_.begin(); it != entries_.end(); ++it) {
    const size_t n = it->tokens.size();
    if (n <= deeper_than || (best != entries_.end() && n <= best->tokens.size())) continue;
    if (n == prompt.size() && !it->has_logits) continue;  // nothing left to run
    if (BeginsWith(prompt, it->tokens)) best = it;
  }
  return best;
}

size_t PrefixCache::DeepestLength(std::span<const int32_t> prompt) const {
  std::lock_guard<std::mutex> lock(mu_);
  const auto best = FindDeepestLocked(prompt, 0);
  return best == entries_.end() ? 0 : best->tokens.size();
}

std::shared_ptr<const PrefixState> PrefixCache::Deepest(std::span<const int32_t> prompt,
                                                        size_t deeper_than) {
  while (true) {
    std::string path;
    std::vector<int32_t> tokens;
    {
      std::lock_guard<std::mutex> lock(mu_);
      const auto best = FindDeepestLocked(prompt, deeper_than);
      if (best == entries_.end()) return nullptr;
      entries_.splice(entries_.begin(), entries_, best);
      if (best->state != nullptr) return best->state;
      path = best->path;
      tokens = best->tokens;
    }
    // Parked: read back without the lock (K3: half a gigabyte).
    absl::StatusOr<PrefixState> loaded = ReadOwnFile(path, ParsePrefixState);
    std::lock_guard<std::mutex> lock(mu_);
    if (loaded.ok() && loaded->at.tokens == tokens) {
      // Its time is its place in the next process's order (Adopt).
      if (!keep_tag_.empty()) utimensat(AT_FDCWD, path.c_str(), nullptr, 0);
      return std::make_shared<const PrefixState>(*std::move(loaded));
    }
    auto it = std::find_if(entries_.begin(), entries_.end(),
                           [&](const Entry& e) { return e.path == path; });
    if (it == entries_.end()) continue;  // dropped meanwhile (evicted): not an error
    COLI_LOG(kWarning) << "kimi_k3: parked prefix cache entry " << path << " dropped: "
                       << (loaded.ok() ? "its tokens changed" : loaded.status().ToString());
    DropLocked(it);  // and look for the next deepest
  }
}

void PrefixCache::Clear() {
  std::lock_guard<std::mutex> lock(mu_);
  while (!entries_.empty()) DropLocked(entries_.begin());
}

size_t PrefixCache::bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return bytes_;
}

size_t PrefixCache::entries() const {
  std::lock_guard<std::mutex> lock(mu_);
  return entries_.size();
}

void PrefixCache::CountHit() {
  std::lock_guard<std::mutex> lock(mu_);
  ++hits_;
}

uint64_t PrefixCache::hits() const {
  std::lock_guard<std::mutex> lock(mu_);
  return hits_;
}

}  // namespace coli::k3
