// Expert-usage history for the streaming expert store: how often each routed expert of each MoE
// layer was selected, kept across runs in a small file (`.coli_usage`) so the hottest experts can
// be pinned in RAM at start-up (spec §7.2, "Pinning").
//
//   COLI_ASSIGN_OR_RETURN(UsageHistory h, UsageHistory::Load(path, {1, 2, 3}, 896));
//   h.Record(/*layer_index=*/0, /*expert=*/17);
//   COLI_RETURN_IF_ERROR(h.Save(path));                 // atomic: temp + fsync + rename
//   std::vector<int32_t> pins = h.Hottest(0, PinsPerLayer(cap, h.total()));
//
// File format (version 1, all integers little-endian):
//
//   offset  size              field
//   0       8                 magic "COLIUSG1"
//   8       4   u32           version = 1
//   12      4   u32           L = number of MoE layers
//   16      4   u32           E = experts per layer
//   20      4   u32           reserved, 0
//   24      8   u64           total selections recorded (sum of all counts)
//   32      4·L i32           decoder-layer id of each MoE layer, ascending
//   32+4L   8·L·E u64         counts, layer-major: count[l][e]
//   end-8   8   u64           FNV-1a 64 of every preceding byte
//
// A file whose layer ids or expert count differ from the model's belongs to another model and is
// refused (FAILED_PRECONDITION); a short or corrupt one is DATA_LOSS. Callers treat both as "no
// history" after logging, so a bad file never stops the engine.
#ifndef COLI_PLUGINS_KIMI_K3_EXPERT_STORE_USAGE_H_
#define COLI_PLUGINS_KIMI_K3_EXPERT_STORE_USAGE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace coli::k3 {

// Pinning starts at this many recorded selections and reaches its full size (cap/2 per layer) at
// kUsageFullHistory (spec §7.2).
inline constexpr uint64_t kUsageMinHistory = 5000;
inline constexpr uint64_t kUsageFullHistory = 200000;

// Pinned experts per layer for `cap` slots per layer and `history` recorded selections:
// 0 below kUsageMinHistory, else floor(cap/2 · min(1, history / kUsageFullHistory)).
int PinsPerLayer(int cap, uint64_t history);

class UsageHistory {
 public:
  // An empty history for `layers` (decoder-layer ids, ascending) × `experts`.
  UsageHistory(std::vector<int> layers, int experts);

  // Reads `path`. A missing file gives an empty history; a foreign or corrupt file an error
  // naming the file (see the header comment).
  static absl::StatusOr<UsageHistory> Load(const std::string& path, std::vector<int> layers,
                                           int experts);

  // Writes the file atomically (common/io WriteFileAtomic).
  absl::Status Save(const std::string& path) const;
  std::string Serialize() const;

  // Counts one selection of `expert` in MoE layer number `layer_index` (0-based position in
  // layers()). Not thread-safe; the store calls it under its own lock.
  void Record(int layer_index, int expert, uint64_t n = 1);

  uint64_t count(int layer_index, int expert) const;
  uint64_t total() const { return total_; }
  const std::vector<int>& layers() const { return layers_; }
  int experts() const { return experts_; }

  // The `n` most-selected experts of a layer (count > 0 only), most used first, lower id first
  // on ties.
  std::vector<int32_t> Hottest(int layer_index, int n) const;

 private:
  std::vector<int> layers_;
  int experts_;
  uint64_t total_ = 0;
  std::vector<uint64_t> counts_;  // [layer_index * experts_ + expert]
};

}  // namespace coli::k3

#endif  // COLI_PLUGINS_KIMI_K3_EXPERT_STORE_USAGE_H_
