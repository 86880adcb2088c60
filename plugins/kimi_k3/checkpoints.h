// plugins/kimi_k3/checkpoints: a session's recurrent-state checkpoints (COLI_K3_CKPT=N).
//
// KDA layers keep a recurrent state that cannot be rewound, so a prompt that is not a strict
// extension of the session's record (an edited last message, a regenerated reply, a history
// re-rendered without its reasoning) would otherwise re-run from the first token. The plugin
// keeps up to N checkpoints per session — at the end of every prompt and at the start of its
// last message — and restores the deepest one that both the record and the new prompt begin
// with, so only the tail is prefilled again. Checkpoints hold copies of the KDA states (MLA
// caches only grow; restoring truncates them), so their size is the model's recurrent state
// (Checkpoint::bytes). Least recently used ones are dropped first.
//
// With a folder (COLI_K3_CKPT_DIR) the checkpoints are parked there instead of in RAM: each is
// one file (written atomically, checked by size and checksum when read back), only its tokens
// stay in memory, and a restore reads it back. The cache deletes its files when it drops them
// and when it is destroyed. A file that went missing or is damaged is dropped with a warning;
// the prompt is then prefilled from further back, never from wrong state.
#ifndef COLI_PLUGINS_KIMI_K3_CHECKPOINTS_H_
#define COLI_PLUGINS_KIMI_K3_CHECKPOINTS_H_

#include <chrono>
#include <cstdint>
#include <list>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "plugins/kimi_k3/session.h"

namespace coli::k3 {

class CheckpointCache {
 public:
  // `slots` checkpoints at most; `dir` empty keeps them in RAM, else parks them there.
  explicit CheckpointCache(int slots, std::string dir = "");
  ~CheckpointCache();
  CheckpointCache(const CheckpointCache&) = delete;
  CheckpointCache& operator=(const CheckpointCache&) = delete;

  int slots() const { return slots_; }
  size_t size() const { return entries_.size(); }
  // Bytes held: in RAM, or in the folder when parked.
  size_t bytes() const;

  // Keeps `c` (replacing one with the same tokens), dropping the least recently used beyond
  // the slot count. A parked checkpoint that cannot be written is an error (nothing kept).
  absl::Status Put(Checkpoint c);
  // The deepest checkpoint whose tokens begin both `prompt` and `record`, at most at
  // prompt.size() (there only with logits, which then stand for the whole prompt); marks it
  // used. nullptr when none. Valid until the next call on the cache.
  const Checkpoint* Deepest(std::span<const int32_t> prompt, std::span<const int32_t> record);
  // The length of the checkpoint Deepest would return, 0 when none, without marking it used or
  // reading a parked file back (so a damaged file may still count here).
  size_t DeepestLength(std::span<const int32_t> prompt, std::span<const int32_t> record) const;
  void Clear();

 private:
  struct Entry {
    std::vector<int32_t> tokens;
    bool has_logits = false;
    size_t bytes = 0;
    std::optional<Checkpoint> ram;  // when not parked
    std::string path;               // when parked
  };
  void Drop(std::list<Entry>::iterator it);
  // The deepest entry Deepest would take (ties: the most recently used), or end().
  std::list<Entry>::const_iterator FindDeepest(std::span<const int32_t> prompt,
                                               std::span<const int32_t> record) const;

  int slots_;
  std::string dir_;
  uint64_t next_file_ = 0;
  std::list<Entry> entries_;  // most recently used first
  Checkpoint loaded_;         // the last parked checkpoint read back
};

// Whether `seq` begins with `prefix` (the checkpoint and prefix caches' lookups).
bool BeginsWith(std::span<const int32_t> seq, std::span<const int32_t> prefix);

// The parked form: a little-endian header, the tokens, each layer's four KDA arrays, the
// logits and a checksum of everything before it.
std::string SerializeCheckpoint(const Checkpoint& c);
absl::StatusOr<Checkpoint> ParseCheckpoint(std::string_view bytes);

// The same for a prefix cache entry (prefix_cache.h): the checkpoint's parts, then each layer's
// MLA rows, under its own magic. DATA_LOSS naming what is wrong ("prefix cache file: ...").
std::string SerializePrefixState(const PrefixState& p);
absl::StatusOr<PrefixState> ParsePrefixState(std::string_view bytes);
// What an index needs of a prefix cache file without reading (or checking) all of it: its
// tokens and whether it holds logits. Only the pages holding the layout's length fields are
// touched when `bytes` is a mapping. DATA_LOSS when the layout does not hold together; the
// checksum is checked only by ParsePrefixState.
struct PrefixFileHead {
  std::vector<int32_t> tokens;
  bool has_logits = false;
};
absl::StatusOr<PrefixFileHead> PeekPrefixState(std::string_view bytes);

// A 64-bit hash that is the same in every process and build (the files' checksum; also what
// names a persistent prefix cache's configuration).
uint64_t StableHash64(std::string_view bytes);

// The janitor of a parking folder (COLI_K3_CKPT_DIR), run when a model loads: deletes what no
// process will use again — each K3 file is half a gigabyte, and a server that was killed cannot
// delete its own:
//   - parked checkpoints and unkept prefix cache entries ("coli-k3-{ckpt,prefix}-<pid>-….bin")
//     of a pid that is gone, and the temp files of their unfinished writes
//     (io::WriteFileAtomic's ".<name>.tmp.XXXXXX");
//   - temp files of kept entries ("coli-k3-prefix-keep-…") older than `stale_temp` (a write
//     takes seconds);
//   - kept entries of any configuration not written or used for `unused_kept` (another build or
//     switch setting strands its files otherwise; a later process of the same configuration only
//     prefills those prompts again).
// A running pid (or one this process cannot see: another pid namespace counts as gone) is left
// alone, as is anything that is not a regular file of this user. Returns how many files went.
int RemoveOrphanedParkedFiles(const std::string& dir,
                              std::chrono::seconds stale_temp = std::chrono::minutes(10),
                              std::chrono::seconds unused_kept = std::chrono::hours(24 * 14));

// Whether `path` is a regular file (not a link) owned by this process's user: parked files are
// only read back or deleted when they are.
bool IsOwnRegularFile(const std::string& path);

// Where a prompt's last message starts: just after the last end-of-message token that has
// another one after it (the one closing the message before the last), or -1.
int64_t LastMessageStart(std::span<const int32_t> prompt, int32_t end_of_msg);

}  // namespace coli::k3

#endif  // COLI_PLUGINS_KIMI_K3_CHECKPOINTS_H_
