// plugins/kimi_k3/expert_source: where the routed experts' weights come from.
//
//   COLI_ASSIGN_OR_RETURN(auto source, PreadExpertSource::Create(*snapshot, cfg, prefix, layers));
//   COLI_RETURN_IF_ERROR(source->ForEachExpert(layer, experts, [&](int i, const ExpertWeights& w) {
//     ... compute expert experts[i] with w.w1 / w.w3 (gate / up) and w.w2 (down) ...
//   }));
//
// The model computes routed experts in place from the checkpoint's bytes, never re-encoded.
// Two storage formats (ExpertFormat), one per snapshot:
//   * MXFP4 (the released checkpoint, spec §2.3 / §4.1): six U8 tensors per expert,
//     w{1,2,3}.weight_packed [rows, cols/2] + w{1,2,3}.weight_scale [rows, cols/32];
//   * F32 (a full-precision vendor save_pretrained, spec §9.8: experts kept in f32 so routing is
//     not perturbed): three plain linear weights w{1,2,3}.weight F32 of the logical shapes,
//     computed with the f32 kernel format (kernels::WeightFormat::kF32). BF16 plain experts are
//     UNIMPLEMENTED (refused naming the tensor): the sources hand out views of the stored bytes.
// ExpertSource is the seam between the model and the storage policy: PreadExpertSource (here)
// reads each requested expert with plain pread for every call (no cache); the streaming LRU
// store (expert_store.h) implements the same interface.
//
// LocateExperts() is shared by every implementation: it checks the tensors of every expert of
// a layer by name, dtype and shape (spec §2.3) and records their joint contiguous range when
// they are stored back to back in the order of ExpertTensorSuffixes (spec §2.4, true for the
// released shards: one read per expert). An expert that mixes the formats (a plain weight
// beside a weight_packed / weight_scale) is DATA_LOSS naming the tensor.
#ifndef COLI_PLUGINS_KIMI_K3_EXPERT_SOURCE_H_
#define COLI_PLUGINS_KIMI_K3_EXPERT_SOURCE_H_

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/kernels/kernels.h"
#include "common/safetensors/safetensors.h"
#include "plugins/kimi_k3/config.h"

namespace coli::k3 {

// Expert weights of one routed expert, views into memory the source keeps alive for the call.
// w1 = gate [inter, latent], w3 = up [inter, latent], w2 = down [latent, inter]; all kMxfp4, or
// all kF32 (ExpertFormat::kF32).
struct ExpertWeights {
  kernels::MatrixView w1, w2, w3;
};

// How a snapshot stores its routed experts (see the banner).
enum class ExpertFormat { kMxfp4, kF32 };
// "MXFP4" / "F32".
const char* ExpertFormatName(ExpertFormat format);
// Tensors per expert (6 / 3) and their name suffixes, in the contiguous on-disk order.
int ExpertTensorCount(ExpertFormat format);
std::span<const std::string_view> ExpertTensorSuffixes(ExpertFormat format);
// Bytes of one expert [inter, latent] in `format`: 3·(n/2 + n/32) or 3·4·n for n = inter·latent.
uint64_t ExpertFormatBytes(ExpertFormat format, int64_t inter, int64_t latent);
// The format of expert 0 of decoder layer `layer`: kF32 when its w1.weight exists (F32; BF16 is
// UNIMPLEMENTED naming it), else kMxfp4. DATA_LOSS naming the tensor when the expert has both.
absl::StatusOr<ExpertFormat> DetectExpertFormat(st::Snapshot& snapshot, const std::string& prefix,
                                                int layer);

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

// The checked tensors of one expert and, when they are back to back, their joint range.
struct ExpertLocation {
  ExpertFormat format = ExpertFormat::kMxfp4;
  // The first count entries, in ExpertTensorSuffixes(format) order: w1_packed, w1_scale,
  // w2_packed, w2_scale, w3_packed, w3_scale (MXFP4) or w1, w2, w3 (F32).
  std::array<const st::TensorInfo*, 6> tensors{};
  int count = 6;
  std::optional<st::Snapshot::Range> contiguous;
  std::span<const st::TensorInfo* const> parts() const { return {tensors.data(), size_t(count)}; }
  uint64_t bytes() const;
  // File offset used to order reads (the first tensor's).
  uint64_t first_offset() const { return tensors[0]->file_offset; }
};

// The six MXFP4 tensor names of expert `e` of layer `layer`, in the on-disk order.
std::array<std::string, 6> ExpertTensorNames(const std::string& prefix, int layer, int expert);
// The tensor names of expert `e` of layer `layer` in `format`, in ExpertTensorSuffixes order.
std::vector<std::string> ExpertTensorNamesFor(ExpertFormat format, const std::string& prefix,
                                              int layer, int expert);

// Checks and locates the tensors of expert `expert` of decoder layer `layer`, stored in `format`
// with logical shapes w1/w3 [inter, latent], w2 [latent, inter]; errors as LocateExperts.
absl::StatusOr<ExpertLocation> LocateExpert(st::Snapshot& snapshot, ExpertFormat format,
                                            const std::string& prefix, int layer, int expert,
                                            int64_t inter, int64_t latent);

// Checks every expert tensor of `layer` and locates them: in the layer's format
// (DetectExpertFormat), MXFP4 U8 packed [rows, cols/2] + E8M0 scale [rows, cols/32], or F32
// [rows, cols] (spec §2.3 logical shapes). DATA_LOSS / NOT_FOUND / UNIMPLEMENTED naming the
// tensor; DATA_LOSS for an expert that mixes the formats.
absl::StatusOr<std::vector<ExpertLocation>> LocateExperts(st::Snapshot& snapshot,
                                                          const Config& cfg,
                                                          const std::string& prefix, int layer);

// Views of an MXFP4 expert's bytes laid out in ExpertTensorNames order, w1 first: `parts`
// points at each tensor's bytes.
ExpertWeights ExpertViews(const Config& cfg, std::array<const uint8_t*, 6> parts);
// Views in `format` over the first ExpertTensorCount(format) entries of `parts` (each tensor's
// bytes; F32 parts must be 4-byte aligned).
ExpertWeights ExpertViewsFor(ExpertFormat format, int64_t inter, int64_t latent,
                             std::span<const uint8_t* const> parts);

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
