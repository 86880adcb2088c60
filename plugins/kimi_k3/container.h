// plugins/kimi_k3/container: the repacked container's matrix format (spec §4.4), shared by the
// engine's loader (weights.cc) and the converter k3-repack (repack.h).
//
//   A pre-quantized matrix W [O, I] is stored as a U8 tensor under W's own name plus an F32
//   sidecar `<name>.qs`:
//     int8 per row:  U8 [O, I]    + F32 [O]        (spec §4.2)
//     int4-g64:      U8 [O, I/2]  + F32 [O, I/64]  (spec §4.3)
//   Detection is by byte and element counts only (the U8 shape is not trusted): anything else
//   is refused naming the tensor. Everything else in a container is a source tensor as it was.
//
//   COLI_ASSIGN_OR_RETURN(kernels::WeightFormat f, ContainerFormat(*data, *qs, rows, cols));
#ifndef COLI_PLUGINS_KIMI_K3_CONTAINER_H_
#define COLI_PLUGINS_KIMI_K3_CONTAINER_H_

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "common/kernels/kernels.h"
#include "common/safetensors/safetensors.h"

namespace coli::k3 {

// The sidecar suffix: "<name>.qs" holds the F32 scales of the U8 matrix "<name>".
inline constexpr std::string_view kScaleSidecarSuffix = ".qs";
inline std::string ScaleSidecarName(std::string_view name) {
  return std::string(name) + std::string(kScaleSidecarSuffix);
}

// The stored format of container matrix `data` (logical [rows, cols]) with sidecar `qs`:
// kInt8Row or kInt4G64. DATA_LOSS naming the tensor when data is not U8, the sidecar not F32,
// or the byte / element counts fit neither format.
absl::StatusOr<kernels::WeightFormat> ContainerFormat(const st::TensorInfo& data,
                                                      const st::TensorInfo& qs, int64_t rows,
                                                      int64_t cols);

// The "__metadata__" key k3-repack writes into every shard it makes (value: the version of its
// provenance record, repack.cc).
inline constexpr char kRepackMetadataKey[] = "k3_repack";

// Whether the first *.safetensors in `dir` (by name) carries kRepackMetadataKey, i.e. `dir` is
// (part of) a k3-repack output. Reads one header; false on any error.
bool IsRepackContainer(const std::string& dir);

// The "__metadata__" of the safetensors file at `path` (its header only; errors name the file).
absl::StatusOr<std::map<std::string, std::string>> ReadShardMetadata(const std::string& path);

// The shards of one container were made by one k3-repack run: DATA_LOSS naming two shards and
// the setting (k3_repack.bits / mla_bits / head_bits) when shards that carry kRepackMetadataKey
// disagree — a shard copied in from another container, which loads as a silently mixed model.
// `shards`: (path, metadata) pairs; shards without the key are not compared.
absl::Status CheckOneRepack(
    const std::vector<std::pair<std::string, std::map<std::string, std::string>>>& shards);

// The tensors a quantized matrix becomes in a container: the U8 data (shape [O, I] for int8,
// [O, I/2] for int4-g64) and the F32 sidecar. INVALID_ARGUMENT for any other format.
absl::StatusOr<std::vector<st::PlannedTensor>> ContainerTensors(const std::string& name,
                                                                kernels::WeightFormat format,
                                                                int64_t rows, int64_t cols);

}  // namespace coli::k3

#endif  // COLI_PLUGINS_KIMI_K3_CONTAINER_H_
