#include "plugins/kimi_k3/expert_source.h"

#include <algorithm>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "common/status/status.h"

namespace coli::k3 {

namespace {

constexpr std::string_view kMxfp4Suffixes[] = {"w1.weight_packed", "w1.weight_scale",
                                               "w2.weight_packed", "w2.weight_scale",
                                               "w3.weight_packed", "w3.weight_scale"};
constexpr std::string_view kF32Suffixes[] = {"w1.weight", "w2.weight", "w3.weight"};
constexpr std::string_view kMatrices[] = {"w1", "w2", "w3"};

std::string ExpertBase(const std::string& prefix, int layer, int expert) {
  return absl::StrCat(prefix, "model.layers.", layer, ".block_sparse_moe.experts.", expert, ".");
}

// DATA_LOSS naming the tensor when expert `base` has parts of the format it is not in: both
// formats in one expert, or only the other format in a checkpoint whose experts are `format`.
absl::Status CheckNotMixed(const st::Snapshot& snapshot, const std::string& base,
                           ExpertFormat format) {
  const bool f32 = format == ExpertFormat::kF32;
  for (std::string_view m : kMatrices) {
    const std::string w = base + std::string(m);
    const std::string plain = w + ".weight", packed = w + ".weight_packed",
                      scale = w + ".weight_scale";
    const std::string& own = f32 ? plain : packed;
    // One index lookup per matrix on the released (MXFP4) checkpoint.
    const std::vector<const std::string*> others =
        f32 ? std::vector<const std::string*>{&packed, &scale}
            : std::vector<const std::string*>{&plain};
    for (const std::string* other : others) {
      if (!snapshot.Contains(*other)) continue;
      if (snapshot.Contains(own)) {
        return absl::DataLossError(absl::StrCat(
            "tensor '", *other, "': the expert holds both '", own, "' and '", *other,
            "'; an expert is either w{1,2,3}.weight (F32) or w{1,2,3}.weight_packed + ",
            "weight_scale (MXFP4)"));
      }
      return absl::DataLossError(absl::StrCat(
          "tensor '", *other, "': a ", f32 ? "MXFP4" : "plain (unquantized)",
          " expert tensor in a checkpoint whose experts are ", ExpertFormatName(format),
          " (as its first MoE layer's expert 0); every routed expert must use one format"));
    }
  }
  return absl::OkStatus();
}

// Get, then the dtype and shape of an expert tensor: UNIMPLEMENTED for a plain BF16/F16 expert
// matrix (only F32 is computed in place), DATA_LOSS for anything else that does not fit.
absl::StatusOr<const st::TensorInfo*> ExpectExpertTensor(st::Snapshot& snapshot,
                                                         const std::string& name, st::DType dtype,
                                                         std::span<const int64_t> shape) {
  COLI_ASSIGN_OR_RETURN(const st::TensorInfo* t, snapshot.Get(name));
  if (dtype == st::DType::kF32 && (t->dtype == st::DType::kBF16 || t->dtype == st::DType::kF16)) {
    return absl::UnimplementedError(absl::StrCat(
        "tensor '", name, "': unquantized routed experts in ", std::string(st::DTypeName(t->dtype)),
        " are not supported; plain expert weights must be F32 (spec §9.8) or MXFP4 ",
        "weight_packed + weight_scale (spec §2.3)"));
  }
  return snapshot.Expect(name, dtype, shape);
}

}  // namespace

const char* ExpertFormatName(ExpertFormat format) {
  return format == ExpertFormat::kF32 ? "F32" : "MXFP4";
}

int ExpertTensorCount(ExpertFormat format) { return format == ExpertFormat::kF32 ? 3 : 6; }

std::span<const std::string_view> ExpertTensorSuffixes(ExpertFormat format) {
  if (format == ExpertFormat::kF32) return kF32Suffixes;
  return kMxfp4Suffixes;
}

uint64_t ExpertFormatBytes(ExpertFormat format, int64_t inter, int64_t latent) {
  const uint64_t n = static_cast<uint64_t>(inter) * static_cast<uint64_t>(latent);
  if (format == ExpertFormat::kF32) return 3 * n * sizeof(float);
  return 3 * (n / 2 + n / 32);
}

absl::StatusOr<ExpertFormat> DetectExpertFormat(st::Snapshot& snapshot, const std::string& prefix,
                                                int layer) {
  const std::string base = ExpertBase(prefix, layer, 0);
  const ExpertFormat format = snapshot.Contains(base + "w1.weight") ? ExpertFormat::kF32
                                                                    : ExpertFormat::kMxfp4;
  COLI_RETURN_IF_ERROR(CheckNotMixed(snapshot, base, format));
  return format;
}

uint64_t ExpertLocation::bytes() const {
  uint64_t n = 0;
  for (const st::TensorInfo* t : parts()) n += t->nbytes;
  return n;
}

std::array<std::string, 6> ExpertTensorNames(const std::string& prefix, int layer, int expert) {
  const std::string base = ExpertBase(prefix, layer, expert);
  std::array<std::string, 6> names;
  for (int k = 0; k < 6; ++k) names[k] = base + std::string(kMxfp4Suffixes[k]);
  return names;
}

std::vector<std::string> ExpertTensorNamesFor(ExpertFormat format, const std::string& prefix,
                                              int layer, int expert) {
  const std::string base = ExpertBase(prefix, layer, expert);
  std::vector<std::string> names;
  for (std::string_view suffix : ExpertTensorSuffixes(format))
    names.push_back(base + std::string(suffix));
  return names;
}

absl::StatusOr<std::vector<ExpertLocation>> LocateExperts(st::Snapshot& snapshot,
                                                          const Config& cfg,
                                                          const std::string& prefix, int layer) {
  const int64_t inter = cfg.moe.intermediate, lat = cfg.moe.latent;
  COLI_ASSIGN_OR_RETURN(const ExpertFormat format, DetectExpertFormat(snapshot, prefix, layer));
  if (format == ExpertFormat::kMxfp4 && (lat % 32 != 0 || inter % 32 != 0))
    return absl::UnimplementedError(absl::StrCat(
        "MXFP4 experts need moe_intermediate_size and routed_expert_hidden_size divisible by 32, got ",
        inter, " and ", lat));
  std::vector<ExpertLocation> out(cfg.moe.num_experts);
  for (int e = 0; e < cfg.moe.num_experts; ++e) {
    COLI_ASSIGN_OR_RETURN(out[e], LocateExpert(snapshot, format, prefix, layer, e, inter, lat));
  }
  return out;
}

absl::StatusOr<ExpertLocation> LocateExpert(st::Snapshot& snapshot, ExpertFormat format,
                                            const std::string& prefix, int layer, int expert,
                                            int64_t inter, int64_t lat) {
  // [rows, cols] of w1, w2, w3 (logical), spec §2.3.
  const int64_t dims[3][2] = {{inter, lat}, {lat, inter}, {inter, lat}};
  const auto names = ExpertTensorNamesFor(format, prefix, layer, expert);
  COLI_RETURN_IF_ERROR(CheckNotMixed(snapshot, ExpertBase(prefix, layer, expert), format));
  ExpertLocation loc;
  loc.format = format;
  loc.count = ExpertTensorCount(format);
  for (int m = 0; m < 3; ++m) {
    if (format == ExpertFormat::kF32) {
      COLI_ASSIGN_OR_RETURN(loc.tensors[m],
                            ExpectExpertTensor(snapshot, names[m], st::DType::kF32, dims[m]));
      continue;
    }
    const int64_t packed[] = {dims[m][0], dims[m][1] / 2};
    const int64_t scale[] = {dims[m][0], dims[m][1] / 32};
    COLI_ASSIGN_OR_RETURN(loc.tensors[2 * m],
                          snapshot.Expect(names[2 * m], st::DType::kU8, packed));
    COLI_ASSIGN_OR_RETURN(loc.tensors[2 * m + 1],
                          snapshot.Expect(names[2 * m + 1], st::DType::kU8, scale));
  }
  COLI_ASSIGN_OR_RETURN(loc.contiguous, snapshot.ContiguousRange(loc.parts()));
  return loc;
}

ExpertWeights ExpertViews(const Config& cfg, std::array<const uint8_t*, 6> p) {
  return ExpertViewsFor(ExpertFormat::kMxfp4, cfg.moe.intermediate, cfg.moe.latent, p);
}

ExpertWeights ExpertViewsFor(ExpertFormat format, int64_t inter, int64_t lat,
                             std::span<const uint8_t* const> p) {
  using kernels::WeightFormat;
  ExpertWeights w;
  if (format == ExpertFormat::kF32) {
    w.w1 = {WeightFormat::kF32, inter, lat, p[0], nullptr};
    w.w2 = {WeightFormat::kF32, lat, inter, p[1], nullptr};
    w.w3 = {WeightFormat::kF32, inter, lat, p[2], nullptr};
    return w;
  }
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
    // The buffer is heap memory (aligned for any type) and every part starts a whole number of
    // its elements in, so F32 parts are float-aligned whatever their file offsets.
    buffer_.resize(loc.bytes());
    std::array<const uint8_t*, 6> parts{};
    if (loc.contiguous) {
      COLI_ASSIGN_OR_RETURN(const io::File* f, snapshot_.ShardFile(loc.contiguous->shard));
      COLI_RETURN_IF_ERROR(f->ReadAt(loc.contiguous->file_offset, loc.contiguous->nbytes, buffer_.data()));
      uint64_t off = 0;
      for (int t = 0; t < loc.count; ++t) {
        parts[t] = buffer_.data() + off;
        // Against the stored CRC-32 (set only with verify_checksums; snapshot_.Read below
        // checks by itself).
        COLI_RETURN_IF_ERROR(st::CheckTensorBytes(*loc.tensors[t], f->path(), parts[t]));
        off += loc.tensors[t]->nbytes;
      }
    } else {
      uint64_t off = 0;
      for (int t = 0; t < loc.count; ++t) {
        COLI_RETURN_IF_ERROR(snapshot_.Read(*loc.tensors[t], buffer_.data() + off));
        parts[t] = buffer_.data() + off;
        off += loc.tensors[t]->nbytes;
      }
    }
    bytes_read_ += loc.bytes();
    COLI_RETURN_IF_ERROR(
        fn(i, ExpertViewsFor(loc.format, cfg_.moe.intermediate, cfg_.moe.latent, parts)));
  }
  return absl::OkStatus();
}

}  // namespace coli::k3
