// plugins/kimi_k3/expert_source: where the routed experts' MXFP4 weights come from.
//
//   COLI_ASSIGN_OR_RETURN(auto source, PreadExpertSource::Create(*snapshot, cfg, prefix, layers));
//   COLI_RETURN_IF_ERROR(source->ForEachExpert(layer, experts, [&](int i, const ExpertWeights& w) {
//     ... compute expert experts[i] with w.w1 / w.w3 (gate / up) and w.w2 (down) ...
//   }));
//
// The model computes routed experts in place from the checkpoint's MXFP4 bytes (spec §4.1;
// never re-encoded). ExpertSource is the seam between the model and the storage policy:
// PreadExpertSource (here) reads each requested expert with plain pread for every call (no
// cache); the streaming LRU store (expert_store.h) implements the same interface.
//
// LocateExperts() is shared by every implementation: it checks the six tensors of every expert
// of a layer by name, dtype and shape (spec §2.3) and records their joint contiguous range
// when they are stored back to back in the order w1_packed, w1_scale, w2_packed, w2_scale,
// w3_packed, w3_scale (spec §2.4, true for the released shards: one read per expert).
#ifndef COLI_PLUGINS_KIMI_K3_EXPERT_SOURCE_H_
#define COLI_PLUGINS_KIMI_K3_EXPERT_SOURCE_H_

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/kernels/kernels.h"
#include "common/safetensors/safetensors.h"
#include "plugins/kimi_k3/config.h"

namespace coli::k3 {

// Expert weights of one routed expert, views into memory the source keeps alive for the call.
// w1 = gate [inter, latent], w3 = up [inter, latent], w2 = down [latent, inter]; all kMxfp4.
struct ExpertWeights {
  kernels::MatrixView w1, w2, w3;
};

// Where routed experts come from (plain pread in part 1; the streaming LRU store in part 2).
class ExpertSource {
 public:
  virtual ~ExpertSource() = default;
  // Makes `experts` of MoE layer `layer` available and calls fn(i, weights) once per list
  // entry i, in any order (loads may overlap compute). The model must not depend on the call
  // order for its sums (it accumulates per (row, k) and adds in a fixed order). The first
  // error (from a read or from fn) stops the walk and is returned.
  virtual absl::Status ForEachExpert(
      int layer, std::span<const int32_t> experts,
      const std::function<absl::Status(int i, const ExpertWeights&)>& fn) = 0;
  // Same, with `meanwhile` (work that does not need the experts, e.g. the shared expert) run on
  // the calling thread before the first fn call. A source that loads in the background starts
  // its loads first, so `meanwhile` hides the first reads; this default runs it, then the walk.
  virtual absl::Status ForEachExpertOverlapped(
      int layer, std::span<const int32_t> experts, const std::function<absl::Status()>& meanwhile,
      const std::function<absl::Status(int i, const ExpertWeights&)>& fn) {
    if (absl::Status s = meanwhile(); !s.ok()) return s;
    return ForEachExpert(layer, experts, fn);
  }
};

// The six checked tensors of one expert and, when they are back to back, their joint range.
struct ExpertLocation {
  // w1_packed, w1_scale, w2_packed, w2_scale, w3_packed, w3_scale.
  std::array<const st::TensorInfo*, 6> tensors{};
  std::optional<st::Snapshot::Range> contiguous;
  uint64_t bytes() const;
  // File offset used to order reads (the first tensor's).
  uint64_t first_offset() const { return tensors[0]->file_offset; }
};

// Tensor names of expert `e` of layer `layer`, in the order of ExpertLocation::tensors.
std::array<std::string, 6> ExpertTensorNames(const std::string& prefix, int layer, int expert);

// Checks every expert tensor of `layer` (U8 packed [rows, cols/2] and E8M0 scale
// [rows, cols/32], spec §2.3) and locates them. DATA_LOSS / NOT_FOUND naming the tensor.
absl::StatusOr<std::vector<ExpertLocation>> LocateExperts(st::Snapshot& snapshot,
                                                          const Config& cfg,
                                                          const std::string& prefix, int layer);

// Views of an expert's bytes laid out as ExpertLocation::tensors order, w1 first: `parts`
// points at each tensor's bytes.
ExpertWeights ExpertViews(const Config& cfg, std::array<const uint8_t*, 6> parts);

// Plain pread, no cache: each ForEachExpert call reads its experts in file-offset order into
// one reused buffer (one read per expert when contiguous, six otherwise) and calls fn
// sequentially on the calling thread. Not thread-safe (one call at a time).
class PreadExpertSource : public ExpertSource {
 public:
  // Locates and checks the experts of every MoE layer in [0, num_layers).
  static absl::StatusOr<std::unique_ptr<PreadExpertSource>> Create(st::Snapshot& snapshot,
                                                                   const Config& cfg,
                                                                   const std::string& prefix,
                                                                   int num_layers);
  absl::Status ForEachExpert(
      int layer, std::span<const int32_t> experts,
      const std::function<absl::Status(int i, const ExpertWeights&)>& fn) override;
  // Bytes read so far (for the performance report).
  uint64_t bytes_read() const { return bytes_read_; }

 private:
  PreadExpertSource(st::Snapshot& snapshot, const Config& cfg) : snapshot_(snapshot), cfg_(cfg) {}
  st::Snapshot& snapshot_;
  Config cfg_;
  std::vector<std::vector<ExpertLocation>> layers_;  // empty for dense layers
  std::vector<uint8_t> buffer_;
  uint64_t bytes_read_ = 0;
};

}  // namespace coli::k3

#endif  // COLI_PLUGINS_KIMI_K3_EXPERT_SOURCE_H_
