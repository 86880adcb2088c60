#include "plugins/kimi_k3/expert_source.h"

#include <algorithm>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "common/status/status.h"

namespace coli::k3 {

uint64_t ExpertLocation::bytes() const {
  uint64_t n = 0;
  for (const st::TensorInfo* t : tensors) n += t->nbytes;
  return n;
}

std::array<std::string, 6> ExpertTensorNames(const std::string& prefix, int layer, int expert) {
  const std::string base =
      absl::StrCat(prefix, "model.layers.", layer, ".block_sparse_moe.experts.", expert, ".");
  return {base + "w1.weight_packed", base + "w1.weight_scale", base + "w2.weight_packed",
          base + "w2.weight_scale",  base + "w3.weight_packed", base + "w3.weight_scale"};
}

absl::StatusOr<std::vector<ExpertLocation>> LocateExperts(st::Snapshot& snapshot,
                                                          const Config& cfg,
                                                          const std::string& prefix, int layer) {
  const int64_t inter = cfg.moe.intermediate, lat = cfg.moe.latent;
  if (lat % 32 != 0 || inter % 32 != 0)
    return absl::UnimplementedError(absl::StrCat(
        "MXFP4 experts need moe_intermediate_size and routed_expert_hidden_size divisible by 32, got ",
        inter, " and ", lat));
  // [rows, cols] of w1, w2, w3 (logical), spec §2.3.
  const int64_t dims[3][2] = {{inter, lat}, {lat, inter}, {inter, lat}};
  std::vector<ExpertLocation> out(cfg.moe.num_experts);
  for (int e = 0; e < cfg.moe.num_experts; ++e) {
    const auto names = ExpertTensorNames(prefix, layer, e);
    for (int m = 0; m < 3; ++m) {
      const int64_t packed[] = {dims[m][0], dims[m][1] / 2};
      const int64_t scale[] = {dims[m][0], dims[m][1] / 32};
      COLI_ASSIGN_OR_RETURN(out[e].tensors[2 * m],
                            snapshot.Expect(names[2 * m], st::DType::kU8, packed));
      COLI_ASSIGN_OR_RETURN(out[e].tensors[2 * m + 1],
                            snapshot.Expect(names[2 * m + 1], st::DType::kU8, scale));
    }
    COLI_ASSIGN_OR_RETURN(out[e].contiguous, snapshot.ContiguousRange(out[e].tensors));
  }
  return out;
}

ExpertWeights ExpertViews(const Config& cfg, std::array<const uint8_t*, 6> p) {
  using kernels::WeightFormat;
  const int64_t inter = cfg.moe.intermediate, lat = cfg.moe.latent;
  ExpertWeights w;
  w.w1 = {WeightFormat::kMxfp4, inter, lat, p[0], p[1]};
  w.w2 = {WeightFormat::kMxfp4, lat, inter, p[2], p[3]};
  w.w3 = {WeightFormat::kMxfp4, inter, lat, p[4], p[5]};
  return w;
}

absl::StatusOr<std::unique_ptr<PreadExpertSource>> PreadExpertSource::Create(
    st::Snapshot& snapshot, const Config& cfg, const std::string& prefix, int num_layers) {
  auto src = std::unique_ptr<PreadExpertSource>(new PreadExpertSource(snapshot, cfg));
  src->layers_.resize(num_layers);
  for (int i = 0; i < num_layers; ++i) {
    if (cfg.is_dense(i)) continue;
    COLI_ASSIGN_OR_RETURN(src->layers_[i], LocateExperts(snapshot, cfg, prefix, i));
  }
  return src;
}

absl::Status PreadExpertSource::ForEachExpert(
    int layer, std::span<const int32_t> experts,
    const std::function<absl::Status(int i, const ExpertWeights&)>& fn) {
  if (layer < 0 || layer >= static_cast<int>(layers_.size()) || layers_[layer].empty())
    return absl::InvalidArgumentError(absl::StrCat("layer ", layer, " has no routed experts"));
  const std::vector<ExpertLocation>& locs = layers_[layer];
  for (int32_t e : experts)
    if (e < 0 || e >= static_cast<int32_t>(locs.size()))
      return absl::InvalidArgumentError(absl::StrCat("expert ", e, " of layer ", layer, " out of range"));
  // Disk-offset order (spec §2.4: experts are not stored in id order).
  std::vector<int> order(experts.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int a, int b) {
    const auto& la = locs[experts[a]];
    const auto& lb = locs[experts[b]];
    if (la.tensors[0]->shard != lb.tensors[0]->shard) return la.tensors[0]->shard < lb.tensors[0]->shard;
    return la.first_offset() < lb.first_offset();
  });
  for (int i : order) {
    const ExpertLocation& loc = locs[experts[i]];
    buffer_.resize(loc.bytes());
    std::array<const uint8_t*, 6> parts;
    if (loc.contiguous) {
      COLI_ASSIGN_OR_RETURN(const io::File* f, snapshot_.ShardFile(loc.contiguous->shard));
      COLI_RETURN_IF_ERROR(f->ReadAt(loc.contiguous->file_offset, loc.contiguous->nbytes, buffer_.data()));
      uint64_t off = 0;
      for (int t = 0; t < 6; ++t) {
        parts[t] = buffer_.data() + off;
        off += loc.tensors[t]->nbytes;
      }
    } else {
      uint64_t off = 0;
      for (int t = 0; t < 6; ++t) {
        COLI_RETURN_IF_ERROR(snapshot_.Read(*loc.tensors[t], buffer_.data() + off));
        parts[t] = buffer_.data() + off;
        off += loc.tensors[t]->nbytes;
      }
    }
    bytes_read_ += loc.bytes();
    COLI_RETURN_IF_ERROR(fn(i, ExpertViews(cfg_, parts)));
  }
  return absl::OkStatus();
}

}  // namespace coli::k3
