#include "plugins/kimi_k3/checkpoints.h"

#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <iterator>
#include <optional>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/io/io.h"
#include "common/log/log.h"
#include "common/status/status.h"

namespace coli::k3 {
namespace {

constexpr char kMagic[8] = {'C', 'O', 'L', 'I', 'K', '3', 'C', 'K'};
constexpr char kPrefixMagic[8] = {'C', 'O', 'L', 'I', 'K', '3', 'P', 'X'};
constexpr uint32_t kVersion = 1;

}  // namespace

// A fast 64-bit checksum over whole words (the tail bytes folded in last).
uint64_t StableHash64(std::string_view bytes) {
  uint64_t h = 0x9E3779B97F4A7C15ull ^ bytes.size();
  size_t i = 0;
  for (; i + 8 <= bytes.size(); i += 8) {
    uint64_t w;
    std::memcpy(&w, bytes.data() + i, 8);
    h = (h ^ w) * 0xBF58476D1CE4E5B9ull;
    h ^= h >> 29;
  }
  for (; i < bytes.size(); ++i) h = (h ^ static_cast<unsigned char>(bytes[i])) * 0x100000001B3ull;
  return h;
}

namespace {

template <typename T>
void PutValue(std::string* out, T v) {
  out->append(reinterpret_cast<const char*>(&v), sizeof(T));
}
template <typename T>
void PutArray(std::string* out, const std::vector<T>& v) {
  PutValue<uint64_t>(out, v.size());
  out->append(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
}

class Reader {
 public:
  explicit Reader(std::string_view bytes) : bytes_(bytes) {}
  template <typename T>
  bool Value(T* v) {
    if (bytes_.size() - pos_ < sizeof(T)) return false;
    std::memcpy(v, bytes_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return true;
  }
  template <typename T>
  bool Array(std::vector<T>* v) {
    uint64_t n = 0;
    if (!Value(&n) || n > (bytes_.size() - pos_) / sizeof(T)) return false;
    v->resize(n);
    if (n > 0) std::memcpy(v->data(), bytes_.data() + pos_, n * sizeof(T));  // data() may be null
    pos_ += n * sizeof(T);
    return true;
  }
  // Steps over an array without copying it; its length when it fits.
  template <typename T>
  std::optional<uint64_t> Skip() {
    uint64_t n = 0;
    if (!Value(&n) || n > (bytes_.size() - pos_) / sizeof(T)) return std::nullopt;
    pos_ += n * sizeof(T);
    return n;
  }
  size_t pos() const { return pos_; }

 private:
  std::string_view bytes_;
  size_t pos_ = 0;
};

// The two file kinds share one layout: magic, version, the checkpoint's parts (tokens, each
// layer's four KDA arrays, logits), then for a prefix state each layer's MLA rows, then a
// checksum of everything before it.
std::string Serialize(const char (&magic)[8], const Checkpoint& c,
                      const std::vector<std::vector<float>>* mla) {
  std::string out;
  size_t mla_bytes = 0;
  if (mla != nullptr) {
    for (const std::vector<float>& rows : *mla) mla_bytes += rows.size() * sizeof(float) + 8;
  }
  out.reserve(c.bytes() + mla_bytes + 64 + c.kda.size() * 32);
  out.append(magic, sizeof(magic));
  PutValue<uint32_t>(&out, kVersion);
  PutArray(&out, c.tokens);
  PutValue<uint64_t>(&out, c.kda.size());
  for (const KdaState& k : c.kda) {
    PutArray(&out, k.S);
    PutArray(&out, k.q_win);
    PutArray(&out, k.k_win);
    PutArray(&out, k.v_win);
  }
  PutArray(&out, c.logits);
  if (mla != nullptr) {
    PutValue<uint64_t>(&out, mla->size());
    for (const std::vector<float>& rows : *mla) PutArray(&out, rows);
  }
  PutValue<uint64_t>(&out, StableHash64(out));
  return out;
}

// Reads Serialize's layout into `c` (and `mla` when given); DATA_LOSS "<kind>: what".
absl::Status Parse(std::string_view bytes, const char (&magic)[8], const char* kind, Checkpoint* c,
                   std::vector<std::vector<float>>* mla) {
  auto bad = [kind](const char* what) {
    return absl::DataLossError(absl::StrCat(kind, ": ", what));
  };
  if (bytes.size() < sizeof(magic) + 4 + 8 || std::memcmp(bytes.data(), magic, 8) != 0) {
    return bad(mla != nullptr ? "not a coli K3 prefix cache entry" : "not a coli K3 checkpoint");
  }
  const std::string_view body = bytes.substr(0, bytes.size() - 8);
  uint64_t sum = 0;
  std::memcpy(&sum, bytes.data() + body.size(), 8);
  if (sum != StableHash64(body)) return bad("checksum mismatch (damaged or truncated)");
  Reader r(body.substr(sizeof(magic)));
  uint32_t version = 0;
  if (!r.Value(&version) || version != kVersion) return bad("unknown version");
  uint64_t layers = 0;
  if (!r.Array(&c->tokens) || !r.Value(&layers) || layers > body.size()) return bad("header");
  c->kda.resize(layers);
  for (KdaState& k : c->kda) {
    if (!r.Array(&k.S) || !r.Array(&k.q_win) || !r.Array(&k.k_win) || !r.Array(&k.v_win)) {
      return bad("layer state");
    }
  }
  if (!r.Array(&c->logits)) return bad("logits");
  if (mla != nullptr) {
    uint64_t mla_layers = 0;
    if (!r.Value(&mla_layers) || mla_layers != layers) return bad("MLA layer count");
    mla->resize(mla_layers);
    for (std::vector<float>& rows : *mla) {
      if (!r.Array(&rows)) return bad("MLA rows");
    }
  }
  if (r.pos() != body.size() - sizeof(magic)) return bad("trailing bytes");
  return absl::OkStatus();
}

}  // namespace

std::string SerializeCheckpoint(const Checkpoint& c) { return Serialize(kMagic, c, nullptr); }

absl::StatusOr<Checkpoint> ParseCheckpoint(std::string_view bytes) {
  Checkpoint c;
  COLI_RETURN_IF_ERROR(Parse(bytes, kMagic, "checkpoint file", &c, nullptr));
  return c;
}

std::string SerializePrefixState(const PrefixState& p) {
  return Serialize(kPrefixMagic, p.at, &p.mla);
}

absl::StatusOr<PrefixState> ParsePrefixState(std::string_view bytes) {
  PrefixState p;
  COLI_RETURN_IF_ERROR(Parse(bytes, kPrefixMagic, "prefix cache file", &p.at, &p.mla));
  return p;
}

absl::StatusOr<PrefixFileHead> PeekPrefixState(std::string_view bytes) {
  auto bad = [](const char* what) {
    return absl::DataLossError(absl::StrCat("prefix cache file: ", what));
  };
  if (bytes.size() < sizeof(kPrefixMagic) + 4 + 8 ||
      std::memcmp(bytes.data(), kPrefixMagic, sizeof(kPrefixMagic)) != 0) {
    return bad("not a coli K3 prefix cache entry");
  }
  Reader r(bytes.substr(sizeof(kPrefixMagic), bytes.size() - sizeof(kPrefixMagic) - 8));
  uint32_t version = 0;
  if (!r.Value(&version) || version != kVersion) return bad("unknown version");
  PrefixFileHead head;
  uint64_t layers = 0;
  if (!r.Array(&head.tokens) || !r.Value(&layers) || layers > bytes.size()) return bad("header");
  for (uint64_t i = 0; i < 4 * layers; ++i) {
    if (!r.Skip<float>()) return bad("layer state");
  }
  const std::optional<uint64_t> logits = r.Skip<float>();
  if (!logits) return bad("logits");
  head.has_logits = *logits > 0;
  return head;
}

bool IsOwnRegularFile(const std::string& path) {
  struct stat st;
  return lstat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) && st.st_uid == geteuid();
}

namespace {

// The pid in "<pid>-…" (what follows "coli-k3-ckpt-" / "coli-k3-prefix-"), or 0.
pid_t LeadingPid(std::string_view rest) {
  const size_t dash = rest.find('-');
  int64_t pid = 0;
  if (dash == std::string_view::npos || !absl::SimpleAtoi(std::string(rest.substr(0, dash)), &pid) ||
      pid <= 0 || pid > INT32_MAX) {
    return 0;
  }
  return static_cast<pid_t>(pid);
}

}  // namespace

int RemoveOrphanedParkedFiles(const std::string& dir, std::chrono::seconds stale_temp,
                              std::chrono::seconds unused_kept) {
  int removed = 0;
  std::error_code ec;
  const auto now = std::filesystem::file_time_type::clock::now();
  for (const std::filesystem::directory_entry& f : std::filesystem::directory_iterator(dir, ec)) {
    const std::string file_name = f.path().filename().string();
    std::string_view name = file_name;
    // io::WriteFileAtomic's temp twin of a file: ".<name>.tmp.XXXXXX".
    const bool temp = name.starts_with('.') && name.find(".bin.tmp.") != std::string_view::npos;
    if (temp) name.remove_prefix(1);
    if (!temp && !name.ends_with(".bin")) continue;
    bool gone = false;
    if (name.starts_with("coli-k3-prefix-keep-")) {
      std::error_code tec;
      const auto age = now - f.last_write_time(tec);
      gone = !tec && age > (temp ? stale_temp : unused_kept);
    } else if (name.starts_with("coli-k3-ckpt-") || name.starts_with("coli-k3-prefix-")) {
      name.remove_prefix(name.find('-', 8) + 1);  // past "coli-k3-ckpt-" / "coli-k3-prefix-"
      const pid_t pid = LeadingPid(name);
      gone = pid != 0 && kill(pid, 0) != 0 && errno == ESRCH;  // alive, or not ours: kept
    }
    if (!gone || !IsOwnRegularFile(f.path().string())) continue;
    std::error_code rec;
    if (std::filesystem::remove(f.path(), rec)) ++removed;
  }
  if (removed > 0) {
    COLI_LOG(kInfo) << "kimi_k3: removed " << removed
                    << " parked files no process will use again in " << dir;
  }
  return removed;
}

CheckpointCache::CheckpointCache(int slots, std::string dir)
    : slots_(slots), dir_(std::move(dir)) {}

CheckpointCache::~CheckpointCache() { Clear(); }

size_t CheckpointCache::bytes() const {
  size_t n = 0;
  for (const Entry& e : entries_) n += e.bytes;
  return n;
}

void CheckpointCache::Drop(std::list<Entry>::iterator it) {
  if (!it->path.empty()) std::remove(it->path.c_str());
  entries_.erase(it);
}

void CheckpointCache::Clear() {
  while (!entries_.empty()) Drop(entries_.begin());
  loaded_ = Checkpoint();
}

absl::Status CheckpointCache::Put(Checkpoint c) {
  if (slots_ <= 0) return absl::OkStatus();
  for (auto it = entries_.begin(); it != entries_.end(); ++it) {
    if (it->tokens == c.tokens) {
      Drop(it);
      break;
    }
  }
  Entry e;
  e.tokens = c.tokens;
  e.has_logits = !c.logits.empty();
  e.bytes = c.bytes();
  if (dir_.empty()) {
    e.ram = std::move(c);
  } else {
    // One name per cache and checkpoint: several sessions and processes may share the folder.
    e.path = absl::StrCat(dir_, "/coli-k3-ckpt-", getpid(), "-", reinterpret_cast<uintptr_t>(this),
                          "-", next_file_++, ".bin");
    COLI_RETURN_IF_ERROR(io::WriteFileAtomic(e.path, SerializeCheckpoint(c)));
  }
  entries_.push_front(std::move(e));
  while (entries_.size() > static_cast<size_t>(slots_)) Drop(std::prev(entries_.end()));
  return absl::OkStatus();
}

std::list<CheckpointCache::Entry>::const_iterator CheckpointCache::FindDeepest(
    std::span<const int32_t> prompt, std::span<const int32_t> record) const {
  auto best = entries_.end();
  for (auto it = entries_.begin(); it != entries_.end(); ++it) {
    const size_t p = it->tokens.size();
    if (p == 0 || (p == prompt.size() && !it->has_logits)) continue;
    if (!BeginsWith(prompt, it->tokens) || !BeginsWith(record, it->tokens)) continue;
    if (best == entries_.end() || p > best->tokens.size()) best = it;
  }
  return best;
}

size_t CheckpointCache::DeepestLength(std::span<const int32_t> prompt,
                                      std::span<const int32_t> record) const {
  const auto best = FindDeepest(prompt, record);
  return best == entries_.end() ? 0 : best->tokens.size();
}

const Checkpoint* CheckpointCache::Deepest(std::span<const int32_t> prompt,
                                           std::span<const int32_t> record) {
  while (true) {
    const auto best = FindDeepest(prompt, record);
    if (best == entries_.end()) return nullptr;
    entries_.splice(entries_.begin(), entries_, best);
    Entry& e = entries_.front();
    if (e.ram) return &*e.ram;
    absl::StatusOr<std::unique_ptr<io::MappedFile>> file = io::MappedFile::Map(e.path);
    absl::StatusOr<Checkpoint> c =
        file.ok() ? ParseCheckpoint(std::string_view(reinterpret_cast<const char*>((*file)->data()),
                                                     (*file)->size()))
                  : absl::StatusOr<Checkpoint>(file.status());
    if (c.ok() && c->tokens == e.tokens) {
      loaded_ = std::move(c).value();
      return &loaded_;
    }
    COLI_LOG(kWarning) << "kimi_k3: parked checkpoint " << e.path
                       << " dropped: " << (c.ok() ? "its tokens changed" : c.status().ToString());
    Drop(entries_.begin());  // and look for the next deepest
  }
}

bool BeginsWith(std::span<const int32_t> seq, std::span<const int32_t> prefix) {
  return prefix.size() <= seq.size() && std::equal(prefix.begin(), prefix.end(), seq.begin());
}

int64_t LastMessageStart(std::span<const int32_t> prompt, int32_t end_of_msg) {
  int seen = 0;
  for (int64_t i = static_cast<int64_t>(prompt.size()) - 1; i >= 0; --i) {
    if (prompt[i] == end_of_msg && ++seen == 2) return i + 1;
  }
  return -1;
}

}  // namespace coli::k3
