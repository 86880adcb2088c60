// The pure parts of common/safetensors: dtypes, header and index validation on bytes.
#include <algorithm>
#include <array>
#include <set>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/io/cat.h"
#include "common/json/json.h"
#include "common/safetensors/safetensors.h"
#include "common/status/status.h"

namespace coli::st {

using ::coli::internal_cat::Cat;
namespace {

struct DTypeEntry {
  DType dtype;
  std::string_view name;
  size_t size;
};
constexpr std::array<DTypeEntry, 12> kDTypes = {{
    {DType::kBF16, "BF16", 2},
    {DType::kF16, "F16", 2},
    {DType::kF32, "F32", 4},
    {DType::kF64, "F64", 8},
    {DType::kU8, "U8", 1},
    {DType::kI8, "I8", 1},
    {DType::kI16, "I16", 2},
    {DType::kI32, "I32", 4},
    {DType::kI64, "I64", 8},
    {DType::kF8E4M3, "F8_E4M3", 1},
    {DType::kF8E5M2, "F8_E5M2", 1},
    {DType::kBool, "BOOL", 1},
}};

const DTypeEntry& Entry(DType dtype) {
  for (const DTypeEntry& e : kDTypes) {
    if (e.dtype == dtype) return e;
  }
  return kDTypes[0];  // unreachable for valid enum values
}

std::string FileLabel(std::string_view file_name) { return Cat("file '", file_name, "'"); }

// JSON errors are INVALID_ARGUMENT; inside a weight file they mean corrupt data.
absl::Status AsDataLoss(const absl::Status& status) {
  if (status.ok()) return status;
  return absl::DataLossError(status.message());
}

// numel * size without overflow; false when it does not fit in 64 bits.
bool CheckedBytes(std::span<const int64_t> shape, size_t elem_size, uint64_t* bytes) {
  uint64_t n = elem_size;
  for (int64_t d : shape) {
    if (__builtin_mul_overflow(n, static_cast<uint64_t>(d), &n)) return false;
  }
  *bytes = n;
  return true;
}

absl::StatusOr<TensorInfo> ParseTensorEntry(const json::Cursor& entry, std::string_view name,
                                            uint64_t data_offset, uint64_t data_size) {
  if (!entry.is_object()) {
    return entry.Error(Cat("expected an object with dtype, shape and data_offsets, got ",
                           json::TypeName(entry.value())));
  }
  COLI_RETURN_IF_ERROR(entry.CheckKeys({"dtype", "shape", "data_offsets"}));
  TensorInfo info;
  info.name = std::string(name);
  info.shard = -1;
  COLI_ASSIGN_OR_RETURN(std::string dtype_name, entry.String("dtype"));
  std::optional<DType> dtype = ParseDType(dtype_name);
  if (!dtype.has_value()) {
    std::vector<std::string> known;
    for (const DTypeEntry& e : kDTypes) known.emplace_back(e.name);
    return entry.Error(
        Cat("unknown dtype '", dtype_name, "' (known: ", absl::StrJoin(known, ", "), ")"));
  }
  info.dtype = *dtype;
  COLI_ASSIGN_OR_RETURN(info.shape, entry.IntArray("shape"));
  for (size_t i = 0; i < info.shape.size(); ++i) {
    if (info.shape[i] < 0) {
      return entry.Error(Cat("shape[", i, "] is negative (", info.shape[i], ")"));
    }
  }
  COLI_ASSIGN_OR_RETURN(std::vector<int64_t> offsets, entry.IntArray("data_offsets"));
  if (offsets.size() != 2) {
    return entry.Error(Cat("data_offsets must be [begin, end], got ", offsets.size(), " numbers"));
  }
  const int64_t begin = offsets[0];
  const int64_t end = offsets[1];
  if (begin < 0 || end < begin) {
    return entry.Error(Cat("data_offsets [", begin, ", ", end, "] is not a range"));
  }
  const uint64_t range = static_cast<uint64_t>(end - begin);
  uint64_t expected = 0;
  const bool fits = CheckedBytes(info.shape, DTypeSize(info.dtype), &expected);
  if (!fits || expected != range) {
    return entry.Error(Cat(DescribeTensor(info.dtype, info.shape), " needs ",
                           fits ? Cat(expected) : std::string("more than 2^64"),
                           " bytes but data_offsets [", begin, ", ", end, "] hold ", range));
  }
  if (static_cast<uint64_t>(end) > data_size) {
    return entry.Error(Cat("data_offsets [", begin, ", ", end,
                           "] run past the end of the file (data region holds ", data_size,
                           " bytes)"));
  }
  info.file_offset = data_offset + static_cast<uint64_t>(begin);
  info.nbytes = range;
  return info;
}

}  // namespace

size_t DTypeSize(DType dtype) { return Entry(dtype).size; }
std::string_view DTypeName(DType dtype) { return Entry(dtype).name; }

std::optional<DType> ParseDType(std::string_view name) {
  for (const DTypeEntry& e : kDTypes) {
    if (e.name == name) return e.dtype;
  }
  return std::nullopt;
}

std::string DescribeTensor(DType dtype, std::span<const int64_t> shape) {
  return Cat(DTypeName(dtype), " [", absl::StrJoin(shape, ", "), "]");
}

int64_t TensorInfo::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

absl::StatusOr<uint64_t> ParseHeaderLength(std::string_view prefix, uint64_t file_size,
                                           std::string_view file_name) {
  if (file_size == 0) {
    return absl::DataLossError(Cat(FileLabel(file_name), ": file is empty"));
  }
  if (file_size < 8 || prefix.size() < 8) {
    return absl::DataLossError(Cat(FileLabel(file_name), ": truncated: ", file_size,
                                   " bytes, too short for the 8-byte header length"));
  }
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<uint8_t>(prefix[static_cast<size_t>(i)]);
  if (n > kMaxHeaderBytes) {
    return absl::DataLossError(Cat(FileLabel(file_name), ": header length ", n,
                                   " exceeds the limit of ", kMaxHeaderBytes, " bytes (100 MiB)"));
  }
  if (n > file_size - 8) {
    return absl::DataLossError(Cat(FileLabel(file_name), ": header length ", n,
                                   " runs past the end of the file (", file_size,
                                   " bytes): truncated or not a safetensors file"));
  }
  return n;
}

absl::StatusOr<Header> ParseHeader(std::string_view header_json, uint64_t file_size,
                                   std::string_view file_name) {
  const std::string label = FileLabel(file_name);
  Header header;
  header.header_bytes = header_json.size();
  header.data_offset = 8 + header_json.size();
  if (header.data_offset > file_size) {
    return absl::DataLossError(Cat(label, ": header of ", header_json.size(),
                                   " bytes runs past the end of the file (", file_size, " bytes)"));
  }
  const uint64_t data_size = file_size - header.data_offset;
  absl::StatusOr<nlohmann::json> doc = json::Parse(header_json, Cat(label, ": header"));
  if (!doc.ok()) return AsDataLoss(doc.status());
  json::Cursor root = json::Cursor::Root(*doc, Cat(label, ": header"));
  if (!root.is_object()) {
    return AsDataLoss(root.Error(Cat("expected an object, got ", json::TypeName(root.value()))));
  }
  for (auto it = doc->begin(); it != doc->end(); ++it) {
    const std::string& name = it.key();
    if (name == "__metadata__") {
      json::Cursor meta = json::Cursor::Root(it.value(), Cat(label, ": __metadata__"));
      if (!meta.is_object()) {
        return AsDataLoss(
            meta.Error(Cat("expected an object of strings, got ", json::TypeName(meta.value()))));
      }
      for (auto m = it.value().begin(); m != it.value().end(); ++m) {
        if (!m.value().is_string()) {
          return AsDataLoss(absl::InvalidArgumentError(Cat(label, ": __metadata__: value of '",
                                                           m.key(), "' must be a string, got ",
                                                           json::TypeName(m.value()))));
        }
        header.metadata.emplace(m.key(), m.value().get<std::string>());
      }
      continue;
    }
    if (name.empty()) return absl::DataLossError(Cat(label, ": a tensor has an empty name"));
    json::Cursor entry = json::Cursor::Root(it.value(), Cat(label, ": tensor '", name, "'"));
    absl::StatusOr<TensorInfo> info = ParseTensorEntry(entry, name, header.data_offset, data_size);
    if (!info.ok()) return AsDataLoss(info.status());
    header.tensors.push_back(std::move(*info));
  }
  std::sort(header.tensors.begin(), header.tensors.end(),
            [](const TensorInfo& a, const TensorInfo& b) {
              return std::tie(a.file_offset, a.nbytes, a.name) <
                     std::tie(b.file_offset, b.nbytes, b.name);
            });
  // No overlap between non-empty ranges (empty tensors occupy no bytes).
  const TensorInfo* previous = nullptr;
  for (const TensorInfo& t : header.tensors) {
    if (t.nbytes == 0) continue;
    if (previous != nullptr && t.file_offset < previous->file_offset + previous->nbytes) {
      const uint64_t base = header.data_offset;
      return absl::DataLossError(Cat(label, ": tensor '", t.name, "' (data_offsets [",
                                     t.file_offset - base, ", ", t.file_offset - base + t.nbytes,
                                     "]) overlaps tensor '", previous->name, "' (data_offsets [",
                                     previous->file_offset - base, ", ",
                                     previous->file_offset - base + previous->nbytes, "])"));
    }
    previous = &t;
  }
  return header;
}

absl::StatusOr<Header> ParseFileBytes(std::string_view file_bytes, std::string_view file_name) {
  COLI_ASSIGN_OR_RETURN(uint64_t n, ParseHeaderLength(file_bytes, file_bytes.size(), file_name));
  return ParseHeader(file_bytes.substr(8, n), file_bytes.size(), file_name);
}

absl::StatusOr<Index> ParseIndex(std::string_view text, std::string_view file_name) {
  const std::string label = FileLabel(file_name);
  absl::StatusOr<nlohmann::json> doc = json::Parse(text, label);
  if (!doc.ok()) return AsDataLoss(doc.status());
  json::Cursor root = json::Cursor::Root(*doc, label);
  if (!root.is_object()) {
    return AsDataLoss(root.Error(Cat("expected an object, got ", json::TypeName(root.value()))));
  }
  Index index;
  absl::StatusOr<std::optional<json::Cursor>> metadata = root.OptionalObject("metadata");
  if (!metadata.ok()) return AsDataLoss(metadata.status());
  if (metadata->has_value()) {
    absl::StatusOr<std::optional<int64_t>> total = (*metadata)->OptionalInt("total_size");
    if (!total.ok()) return AsDataLoss(total.status());
    if (total->has_value()) {
      if (**total < 0) return AsDataLoss((*metadata)->Error("total_size is negative"));
      index.total_size = static_cast<uint64_t>(**total);
    }
  }
  absl::StatusOr<json::Cursor> weight_map = root.Object("weight_map");
  if (!weight_map.ok()) return AsDataLoss(weight_map.status());
  if (weight_map->value().empty()) {
    return AsDataLoss(weight_map->Error("is empty: the index names no tensor"));
  }
  std::set<std::string> shards;
  for (auto it = weight_map->value().begin(); it != weight_map->value().end(); ++it) {
    const std::string& name = it.key();
    if (!it.value().is_string()) {
      return absl::DataLossError(Cat(label, ": tensor '", name,
                                     "': shard name must be a string, got ",
                                     json::TypeName(it.value())));
    }
    const std::string& shard = it.value().get_ref<const std::string&>();
    if (shard.empty() || shard == "." || shard == ".." || shard.find('/') != std::string::npos ||
        shard.find('\0') != std::string::npos) {
      return absl::DataLossError(
          Cat(label, ": tensor '", name, "': shard '", shard, "' is not a plain file name"));
    }
    if (shard == kIndexFileName) {
      return absl::DataLossError(
          Cat(label, ": tensor '", name, "': the index names itself as a shard"));
    }
    index.weight_map.emplace(name, shard);
    shards.insert(shard);
  }
  index.shards.assign(shards.begin(), shards.end());
  return index;
}

}  // namespace coli::st
