// Per-tensor CRC-32 checksums of a safetensors file: computing them (zlib) and verifying a file
// against the ones its __metadata__ stores (see kChecksumKey).
#include <zlib.h>

#include <algorithm>
#include <cstdio>
#include <vector>

#include "common/io/cat.h"
#include "common/io/io.h"
#include "common/safetensors/crc32.h"
#include "common/safetensors/safetensors.h"
#include "common/status/status.h"

namespace coli::st {

using ::coli::internal_cat::Cat;

uint32_t Crc32(uint32_t crc, std::string_view bytes) {
  return static_cast<uint32_t>(
      crc32_z(crc, reinterpret_cast<const Bytef*>(bytes.data()), bytes.size()));
}

std::string Crc32Hex(uint32_t crc) {
  char hex[9];
  std::snprintf(hex, sizeof(hex), "%08x", crc);
  return std::string(hex, 8);
}

absl::Status ApplyChecksums(Header* header, std::string_view file_name) {
  const auto stored = header->metadata.find(std::string(kChecksumKey));
  if (stored == header->metadata.end()) return absl::OkStatus();
  const std::string& digits = stored->second;
  if (digits.size() != 8 * header->tensors.size()) {
    return absl::DataLossError(Cat("file '", file_name, "': '", kChecksumKey, "' holds ",
                                   digits.size(), " hex digits for ", header->tensors.size(),
                                   " tensors (8 each)"));
  }
  // header->tensors is in data-offset order, the order the digits are written in.
  for (size_t i = 0; i < header->tensors.size(); ++i) {
    uint32_t crc = 0;
    for (size_t k = 8 * i; k < 8 * i + 8; ++k) {
      const char c = digits[k];
      const int nibble = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
      if (nibble < 0) {
        return absl::DataLossError(Cat("file '", file_name, "': '", kChecksumKey,
                                       "' holds a character that is not a lowercase hex digit at ",
                                       k, " (tensor '", header->tensors[i].name, "')"));
      }
      crc = (crc << 4) | static_cast<uint32_t>(nibble);
    }
    header->tensors[i].crc32 = crc;
  }
  return absl::OkStatus();
}

absl::Status ChecksumMismatch(const TensorInfo& info, std::string_view file_name, uint32_t found) {
  return absl::DataLossError(Cat("file '", file_name, "': tensor '", info.name, "' (", info.nbytes,
                                 " bytes at offset ", info.file_offset, ") has CRC-32 ",
                                 Crc32Hex(found), ", the file recorded ",
                                 Crc32Hex(info.crc32.value_or(0)),
                                 ": its bytes changed after they were written (copy the file "
                                 "again, or make it again with k3-repack)"));
}

absl::Status CheckTensorBytes(const TensorInfo& info, std::string_view file_name,
                              const void* bytes) {
  if (!info.crc32.has_value()) return absl::OkStatus();
  const uint32_t crc =
      Crc32(0, std::string_view(static_cast<const char*>(bytes), static_cast<size_t>(info.nbytes)));
  if (crc != *info.crc32) return ChecksumMismatch(info, file_name, crc);
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> VerifyChecksums(const std::string& path) {
  COLI_ASSIGN_OR_RETURN(std::unique_ptr<io::File> file, io::File::Open(path));
  if (file->size() < 8) {
    return absl::DataLossError(
        Cat("file '", path, "': ", file->size(), " bytes, too short for a safetensors header"));
  }
  std::string prefix(8, '\0');
  COLI_RETURN_IF_ERROR(file->ReadAt(0, 8, prefix.data()));
  COLI_ASSIGN_OR_RETURN(uint64_t n, ParseHeaderLength(prefix, file->size(), path));
  std::string json(n, '\0');
  COLI_RETURN_IF_ERROR(file->ReadAt(8, n, json.data()));
  COLI_ASSIGN_OR_RETURN(Header header, ParseHeader(json, file->size(), path));
  const auto stored = header.metadata.find(std::string(kChecksumKey));
  if (stored == header.metadata.end()) {
    return absl::NotFoundError(Cat("file '", path, "' has no checksums (__metadata__ has no '",
                                   kChecksumKey,
                                   "': written by another tool or an older "
                                   "k3-repack)"));
  }
  COLI_RETURN_IF_ERROR(ApplyChecksums(&header, path));
  // Zero-byte tensors share an offset (their order is the reader's); their CRC is 0 either way.
  std::vector<char> block;
  uint64_t checked = 0;
  for (const TensorInfo& t : header.tensors) {
    uint32_t crc = 0;
    block.resize(static_cast<size_t>(std::min<uint64_t>(std::max<uint64_t>(t.nbytes, 1), 8 << 20)));
    for (uint64_t done = 0; done < t.nbytes;) {
      const uint64_t piece = std::min<uint64_t>(block.size(), t.nbytes - done);
      COLI_RETURN_IF_ERROR(file->ReadAt(t.file_offset + done, piece, block.data()));
      crc = Crc32(crc, std::string_view(block.data(), static_cast<size_t>(piece)));
      done += piece;
    }
    checked += t.nbytes;
    if (crc != *t.crc32) return ChecksumMismatch(t, path, crc);
  }
  return checked;
}

}  // namespace coli::st
