#include "plugins/kimi_k3/container.h"

#include <algorithm>
#include <filesystem>
#include <memory>

#include "absl/strings/str_cat.h"
#include "common/io/io.h"
#include "common/status/status.h"

namespace coli::k3 {

using kernels::WeightFormat;

absl::StatusOr<std::map<std::string, std::string>> ReadShardMetadata(const std::string& path) {
  COLI_ASSIGN_OR_RETURN(std::unique_ptr<io::File> file, io::File::Open(path));
  std::string prefix(8, '\0');
  if (file->size() >= 8) COLI_RETURN_IF_ERROR(file->ReadAt(0, 8, prefix.data()));
  COLI_ASSIGN_OR_RETURN(
      uint64_t n, st::ParseHeaderLength(std::string_view(prefix.data(), file->size() >= 8 ? 8 : 0),
                                        file->size(), path));
  std::string json(n, '\0');
  COLI_RETURN_IF_ERROR(file->ReadAt(8, n, json.data()));
  COLI_ASSIGN_OR_RETURN(st::Header header, st::ParseHeader(json, file->size(), path));
  return std::move(header.metadata);
}

bool IsRepackContainer(const std::string& dir) {
  std::error_code ec;
  std::string first;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name.ends_with(".safetensors") && (first.empty() || name < first)) first = name;
  }
  if (ec || first.empty()) return false;
  absl::StatusOr<std::map<std::string, std::string>> metadata =
      ReadShardMetadata((std::filesystem::path(dir) / first).string());
  return metadata.ok() && metadata->count(kRepackMetadataKey) != 0;
}

absl::Status CheckOneRepack(
    const std::vector<std::pair<std::string, std::map<std::string, std::string>>>& shards) {
  const std::pair<std::string, std::map<std::string, std::string>>* first = nullptr;
  for (const auto& shard : shards) {
    if (shard.second.count(kRepackMetadataKey) == 0) continue;
    if (first == nullptr) {
      first = &shard;
      continue;
    }
    for (const char* key : {"k3_repack.bits", "k3_repack.mla_bits", "k3_repack.head_bits"}) {
      auto a = first->second.find(key), b = shard.second.find(key);
      const std::string va = a == first->second.end() ? "(none)" : a->second;
      const std::string vb = b == shard.second.end() ? "(none)" : b->second;
      if (va != vb) {
        return absl::DataLossError(absl::StrCat(
            "shard '", shard.first, "' was made by k3-repack with ", key, "=", vb, ", shard '",
            first->first, "' with ", key, "=", va,
            ": the container mixes shards of two repacks (a shard copied in from another "
            "container) and would load as a mixed model; copy the right shard, or make the "
            "container again with k3-repack"));
      }
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<WeightFormat> ContainerFormat(const st::TensorInfo& data, const st::TensorInfo& qs,
                                             int64_t rows, int64_t cols) {
  if (data.dtype != st::DType::kU8) {
    return absl::DataLossError(
        absl::StrCat("tensor '", data.name, "': has a scale sidecar '", qs.name, "' but is ",
                     st::DescribeTensor(data.dtype, data.shape), ", not U8 (repacked container)"));
  }
  if (qs.dtype != st::DType::kF32) {
    return absl::DataLossError(absl::StrCat("tensor '", qs.name,
                                            "': scale sidecar must be F32, got ",
                                            st::DescribeTensor(qs.dtype, qs.shape)));
  }
  const uint64_t n = static_cast<uint64_t>(rows) * static_cast<uint64_t>(cols);
  const int64_t scales = qs.numel();
  if (data.nbytes == n && scales == rows) return WeightFormat::kInt8Row;
  if (cols % 64 == 0 && data.nbytes == n / 2 && scales == rows * (cols / 64))
    return WeightFormat::kInt4G64;
  return absl::DataLossError(
      absl::StrCat("tensor '", data.name, "': ", data.nbytes, " U8 bytes with ", scales,
                   " scales in '", qs.name, "' fit neither int8 [", rows, ", ", cols, "] (", n,
                   " bytes, ", rows, " scales) nor int4-g64 (", n / 2, " bytes, ",
                   cols % 64 == 0 ? rows * (cols / 64) : 0, " scales)"));
}

absl::StatusOr<std::vector<st::PlannedTensor>> ContainerTensors(const std::string& name,
                                                                WeightFormat format, int64_t rows,
                                                                int64_t cols) {
  switch (format) {
    case WeightFormat::kInt8Row:
      return std::vector<st::PlannedTensor>{{name, st::DType::kU8, {rows, cols}},
                                            {ScaleSidecarName(name), st::DType::kF32, {rows}}};
    case WeightFormat::kInt4G64:
      if (cols % 64 != 0) break;
      return std::vector<st::PlannedTensor>{
          {name, st::DType::kU8, {rows, cols / 2}},
          {ScaleSidecarName(name), st::DType::kF32, {rows, cols / 64}}};
    default:
      break;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("tensor '", name, "': ", kernels::WeightFormatName(format), " [", rows, ", ",
                   cols, "] cannot be stored in a container"));
}

}  // namespace coli::k3
