// plugins/kimi_k3/prefix_cache: one model's shared prefix cache (COLI_K3_PREFIX_CACHE_MB) —
// vLLM's "automatic prefix caching" for a hybrid recurrent model.
//
//   PrefixCache cache(512 << 20);                       // bytes; entries of >= 32 tokens
//   cache.Insert(session->TakePrefixState({}));         // after prefilling a shared prefix
//   if (auto e = cache.Deepest(prompt, /*deeper_than=*/0)) {
//     COLI_RETURN_IF_ERROR(other_session->RestorePrefix(*e));  // any session of the model
//     other_session->Prefill(prompt.subspan(e->at.tokens.size()));
//   }
//
// Many conversations start with the same long system prompt and tool definitions. A session's
// own checkpoints (checkpoints.h) cannot serve another session: they hold the KDA states only
// and rely on the session's own MLA caches for the rows before them. An entry here holds the
// WHOLE per-sequence state at its position (session.h, PrefixState: the KDA recurrent states
// and conv windows, the MLA latent rows of every MLA layer, the logits when stored at a prompt
// end; AttnRes keeps nothing across positions, the position is the token count), so a fresh
// session of the same model continues from it exactly as the session it was taken from: the
// logits and sampled tokens are bit-identical to a cold prefill (the forward pass is row-wise
// independent of chunking; session.h).
//
// Size: KDA states (K3: 434 MB, independent of length) + per token 576 floats per MLA layer
// (K3: 24 layers, 55,296 bytes per token). Bounded by a byte budget; the least recently used
// entries are dropped first; prefixes shorter than `min_tokens` are not worth an entry.
//
// With a folder (COLI_K3_CKPT_DIR) the entries are parked there instead of in RAM, as the
// checkpoints are (checkpoints.h): one file each (SerializePrefixState, written atomically,
// checked by checksum and tokens when read back), only the tokens stay in memory, the budget
// counts the files' bytes, and the files are removed when an entry is dropped and when the cache
// is destroyed. A file that went missing or is damaged is dropped with a warning and the next
// deepest entry is tried: a prompt is then prefilled from further back, never from wrong state.
//
// Kept across restarts (COLI_K3_PREFIX_CACHE_KEEP=1, with a folder): the files are named by a
// `keep_tag` that stands for everything the states depend on (the plugin's build, the weights'
// files, the numeric switches: prefix_cache_tag.h) and are left in the folder when the cache is
// destroyed; a cache created later with the same tag adopts them — the most recently written
// first, as many as the budget holds (the rest of that tag are deleted) — so a restarted server
// does not prefill its system prompts again (K3: tens of minutes each). Files of other tags
// (another model, other switches, another build) are left alone.
//
// Threading: every call is thread-safe (one mutex; files are written and read outside it). Entries
// are immutable once published and handed out as shared_ptr<const>: a reader copies from its entry
// without the lock while other threads insert and evict (an evicted entry lives until its last
// reader lets go; bytes() counts only the entries still held).
#ifndef COLI_PLUGINS_KIMI_K3_PREFIX_CACHE_H_
#define COLI_PLUGINS_KIMI_K3_PREFIX_CACHE_H_

#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "plugins/kimi_k3/session.h"

namespace coli::k3 {

class PrefixCache {
 public:
  static constexpr int64_t kDefaultMinTokens = 32;

  // `max_bytes` held at most (entries larger than that are never kept); prefixes shorter than
  // `min_tokens` (at least 1) are not kept; `dir` empty keeps entries in RAM, else parks them
  // there (a writable folder, checked by the caller). With a folder and a non-empty `keep_tag`
  // the cache adopts that tag's files from an earlier process and leaves its own for a later
  // one (above); adoption reads only each file's head (a damaged one is found, and deleted,
  // when a lookup reads it back).
  explicit PrefixCache(size_t max_bytes, int64_t min_tokens = kDefaultMinTokens,
                       std::string dir = "", std::string keep_tag = "");
  ~PrefixCache();
  PrefixCache(const PrefixCache&) = delete;
  PrefixCache& operator=(const PrefixCache&) = delete;

  size_t max_bytes() const { return max_bytes_; }
  // Whether Insert writes a file (a folder was given): callers keep that out of locks.
  bool parks() const { return !dir_.empty(); }
  int64_t min_tokens() const { return min_tokens_; }

  // Whether an entry for exactly `tokens` is worth taking: long enough and not held already
  // (taking a PrefixState copies the whole state: ask before paying for it). Marks a held one
  // used. A parking cache (parks()) then counts the entry as on its way until Insert or Abandon
  // for the same tokens, and answers false for it meanwhile: concurrent first turns of one new
  // system prompt make one copy and one file, not one each.
  bool Wants(std::span<const int32_t> tokens);
  // The caller of a true Wants will not Insert after all (its prefill failed before the copy).
  void Abandon(std::span<const int32_t> tokens);
  // Publishes `p` (replacing one with the same tokens only if `p` has logits and it has none;
  // ends its Wants' wait),
  // then drops least recently used entries until the budget holds. Returns false when `p` was
  // not kept (too short, larger than the whole budget, already held, or its file could not be
  // written: logged as a warning).
  bool Insert(PrefixState p);
  // The deepest entry whose tokens begin `prompt` and are more than `deeper_than` tokens long,
  // at most prompt.size() tokens (there only with logits, which then stand for the whole
  // prompt); marks it used. nullptr when none. A parked entry is read back
  // here (outside the lock); a damaged or missing file is dropped with a warning.
  std::shared_ptr<const PrefixState> Deepest(std::span<const int32_t> prompt, size_t deeper_than);
  // The length of the entry Deepest(prompt, 0) would return, 0 when none, without marking it
  // used or reading a parked file back.
  size_t DeepestLength(std::span<const int32_t> prompt) const;
  // Drops every entry (and deletes its file, kept across restarts or not).
  void Clear();

  // Current values (model stats).
  size_t bytes() const;
  size_t entries() const;
  // A session continues from an entry Deepest handed out (a refused restore — K3_MAXT — is
  // not a hit).
  void CountHit();
  // Prefills served since creation (CountHit calls).
  uint64_t hits() const;

 private:
  struct Entry {
    std::vector<int32_t> tokens;
    bool has_logits = false;
    size_t bytes = 0;
    std::shared_ptr<const PrefixState> state;  // in RAM
    std::string path;                          // parked
  };
  std::list<Entry>::iterator FindLocked(std::span<const int32_t> tokens);
  // The deepest entry the prompt begins with, longer than `deeper_than` (at prompt.size() only
  // with logits), or end(); Deepest takes it, DeepestLength only measures it.
  std::list<Entry>::const_iterator FindDeepestLocked(std::span<const int32_t> prompt,
                                                     size_t deeper_than) const;
  void DropLocked(std::list<Entry>::iterator it);
  // A new entry's file name in dir_.
  std::string NewPathLocked();
  // Takes in the files an earlier process left under keep_tag_ (the constructor).
  void Adopt();

  const size_t max_bytes_;
  const int64_t min_tokens_;
  const std::string dir_;
  const std::string keep_tag_;
  mutable std::mutex mu_;
  uint64_t next_file_ = 0;
  uint64_t nonce_ = 0;        // random: kept files' names must not meet a later process's
  std::list<Entry> entries_;  // most recently used first
  std::vector<std::vector<int32_t>> coming_;  // parking: Wants said yes, Insert not yet called
  size_t bytes_ = 0;
  uint64_t hits_ = 0;
};

}  // namespace coli::k3

#endif  // COLI_PLUGINS_KIMI_K3_PREFIX_CACHE_H_
