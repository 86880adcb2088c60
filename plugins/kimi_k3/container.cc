#include "plugins/kimi_k3/container.h"

#include <algorithm>
#include <filesystem>
#include <memory>

#include "absl/strings/str_cat.h"
#include "common/io/io.h"

namespace coli::k3 {

using kernels::WeightFormat;

bool IsRepackContainer(const std::string& dir) {
  std::error_code ec;
  std::string first;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name.ends_with(".safetensors") && (first.empty() || name < first)) first = name;
  }
  if (ec || first.empty()) return false;
  const std::string path = (std::filesystem::path(dir) / first).string();
  absl::StatusOr<std::unique_ptr<io::File>> file = io::File::Open(path);
  if (!file.ok() || (*file)->size() < 8) return false;
  std::string prefix(8, '\0');
  if (!(*file)->ReadAt(0, 8, prefix.data()).ok()) return false;
  absl::StatusOr<uint64_t> n = st::ParseHeaderLength(prefix, (*file)->size(), path);
  if (!n.ok()) return false;
  std::string json(*n, '\0');
  if (!(*file)->ReadAt(8, *n, json.data()).ok()) return false;
  absl::StatusOr<st::Header> header = st::ParseHeader(json, (*file)->size(), path);
  return header.ok() && header->metadata.count(kRepackMetadataKey) != 0;
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
