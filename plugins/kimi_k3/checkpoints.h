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
#ifndef COLI_PLUGINS_KIMI_K3_CHECKPOINTS_H_
#define COLI_PLUGINS_KIMI_K3_CHECKPOINTS_H_

#include <cstdint>
#include <list>
#include <span>

#include "plugins/kimi_k3/session.h"

namespace coli::k3 {

class CheckpointCache {
 public:
  explicit CheckpointCache(int slots) : slots_(slots) {}

  int slots() const { return slots_; }
  size_t size() const { return entries_.size(); }
  size_t bytes() const;

  // Keeps `c` (replacing one with the same tokens), dropping the least recently used beyond
  // the slot count.
  void Put(Checkpoint c);
  // The deepest checkpoint whose tokens begin both `prompt` and `record`, at most at
  // prompt.size() (there only with logits, which then stand for the whole prompt); marks it
  // used. nullptr when none.
  const Checkpoint* Deepest(std::span<const int32_t> prompt, std::span<const int32_t> record);
  void Clear() { entries_.clear(); }

 private:
  int slots_;
  std::list<Checkpoint> entries_;  // most recently used first
};

// Where a prompt's last message starts: just after the last end-of-message token that has
// another one after it (the one closing the message before the last), or -1.
int64_t LastMessageStart(std::span<const int32_t> prompt, int32_t end_of_msg);

}  // namespace coli::k3

#endif  // COLI_PLUGINS_KIMI_K3_CHECKPOINTS_H_
