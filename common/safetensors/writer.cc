// Writer and WriteIndex: spec-valid safetensors files and index files, written atomically.
#include <exception>
#include <set>
#include <string_view>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/io/cat.h"
#include "common/io/io.h"
#include "common/safetensors/safetensors.h"
#include "common/status/status.h"
#include "nlohmann/json.hpp"

namespace coli::st {

using ::coli::internal_cat::Cat;

void Writer::SetMetadata(std::map<std::string, std::string> metadata) {
  metadata_ = std::move(metadata);
}

absl::Status Writer::Add(std::string name, DType dtype, std::vector<int64_t> shape,
                         std::string bytes) {
  if (name.empty() || name == "__metadata__") {
    return absl::InvalidArgumentError(Cat("Writer: tensor name '", name, "' is empty or reserved"));
  }
  for (const Entry& e : entries_) {
    if (e.name == name) {
      return absl::InvalidArgumentError(Cat("Writer: tensor '", name, "' was already added"));
    }
  }
  uint64_t expected = DTypeSize(dtype);
  for (int64_t d : shape) {
    if (d < 0 || __builtin_mul_overflow(expected, static_cast<uint64_t>(d), &expected)) {
      return absl::InvalidArgumentError(
          Cat("Writer: tensor '", name, "': shape ", DescribeTensor(dtype, shape), " is invalid"));
    }
  }
  if (expected != bytes.size()) {
    return absl::InvalidArgumentError(Cat("Writer: tensor '", name,
                                          "': ", DescribeTensor(dtype, shape), " needs ", expected,
                                          " bytes, got ", bytes.size()));
  }
  entries_.push_back(Entry{std::move(name), dtype, std::move(shape), std::move(bytes)});
  return absl::OkStatus();
}

absl::StatusOr<PlannedHeader> PlanHeader(std::span<const PlannedTensor> tensors,
                                         const std::map<std::string, std::string>& metadata) {
  PlannedHeader out;
  std::set<std::string_view> names;
  try {
    nlohmann::ordered_json header = nlohmann::ordered_json::object();
    if (!metadata.empty()) header["__metadata__"] = metadata;
    for (const PlannedTensor& t : tensors) {
      if (t.name.empty() || t.name == "__metadata__" || !names.insert(t.name).second) {
        return absl::InvalidArgumentError(
            Cat("tensor name '", t.name, "' is empty, reserved or repeated"));
      }
      uint64_t bytes = DTypeSize(t.dtype);
      for (int64_t d : t.shape) {
        if (d < 0 || __builtin_mul_overflow(bytes, static_cast<uint64_t>(d), &bytes)) {
          return absl::InvalidArgumentError(
              Cat("tensor '", t.name, "': shape ", DescribeTensor(t.dtype, t.shape), " is invalid"));
        }
      }
      header[t.name] = {{"dtype", std::string(DTypeName(t.dtype))},
                        {"shape", t.shape},
                        {"data_offsets", {out.data_bytes, out.data_bytes + bytes}}};
      out.ranges.emplace_back(out.data_bytes, out.data_bytes + bytes);
      out.data_bytes += bytes;
    }
    out.json = header.dump();
  } catch (const std::exception& e) {  // e.g. a name that is not valid UTF-8
    return absl::InvalidArgumentError(Cat("cannot encode the header: ", e.what()));
  }
  // The data region starts 8-byte aligned: pad the header with spaces (spec-valid JSON).
  out.json.append((8 - out.json.size() % 8) % 8, ' ');
  return out;
}

absl::StatusOr<std::string> Writer::Serialize() const {
  std::vector<PlannedTensor> planned;
  planned.reserve(entries_.size());
  for (const Entry& e : entries_) planned.push_back({e.name, e.dtype, e.shape});
  absl::StatusOr<PlannedHeader> header = PlanHeader(planned, metadata_);
  if (!header.ok()) return absl::InvalidArgumentError(Cat("Writer: ", header.status().message()));
  std::string out;
  out.reserve(8 + header->json.size() + header->data_bytes);
  uint64_t n = header->json.size();
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((n >> (8 * i)) & 0xff));
  out += header->json;
  for (const Entry& e : entries_) out += e.bytes;
  return out;
}

absl::Status Writer::Write(const std::string& path) const {
  COLI_ASSIGN_OR_RETURN(std::string bytes, Serialize());
  return io::WriteFileAtomic(path, bytes);
}

absl::Status WriteIndex(const std::string& path,
                        const std::map<std::string, std::string>& weight_map, uint64_t total_size) {
  std::string text;
  try {
    nlohmann::ordered_json index = {{"metadata", {{"total_size", total_size}}},
                                    {"weight_map", weight_map}};
    text = index.dump(2);
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(Cat("index '", path, "': cannot encode: ", e.what()));
  }
  text.push_back('\n');
  return io::WriteFileAtomic(path, text);
}

}  // namespace coli::st
