// libFuzzer target: the safetensors header parser on arbitrary file bytes.
//
// Beyond "no crash, no sanitizer report", every accepted header must satisfy the invariants
// the readers rely on, and must survive a Writer round trip unchanged. Built and run by
// scripts/fuzz.sh (clang-14, -fsanitize=fuzzer,address,undefined).
#include <cstdint>
#include <string>
#include <string_view>

#include "common/safetensors/safetensors.h"
#include "tests/fuzz/fuzz_check.h"

using ::coli::fuzz::Check;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace coli::st;
  const std::string_view file(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<Header> header = ParseFileBytes(file, "fuzz.safetensors");
  if (!header.ok()) {
    Check(!header.status().message().empty(), "error without a message");
    return 0;
  }
  Check(header->data_offset == 8 + header->header_bytes, "data_offset");
  Check(header->data_offset <= size, "data region starts inside the file");
  uint64_t previous_end = header->data_offset;
  Writer writer;
  writer.SetMetadata(header->metadata);
  for (const TensorInfo& t : header->tensors) {
    uint64_t bytes = DTypeSize(t.dtype);
    for (int64_t d : t.shape) {
      Check(d >= 0, "negative dimension");
      bytes *= static_cast<uint64_t>(d);
    }
    Check(bytes == t.nbytes, "numel * size == nbytes");
    Check(t.file_offset >= header->data_offset, "range starts in the data region");
    Check(t.file_offset <= size && t.nbytes <= size - t.file_offset, "range inside the file");
    if (t.nbytes > 0) {
      Check(t.file_offset >= previous_end, "no overlap, sorted by offset");
      previous_end = t.file_offset + t.nbytes;
    }
    Check(writer.Add(t.name, t.dtype, t.shape, std::string(file.substr(t.file_offset, t.nbytes)))
              .ok(),
          "Writer accepts every parsed tensor");
  }
  // Round trip: what the Writer makes parses back to the same table (offsets repacked).
  absl::StatusOr<std::string> rewritten = writer.Serialize();
  Check(rewritten.ok(), "Writer serializes a parsed header");
  absl::StatusOr<Header> again = ParseFileBytes(*rewritten, "rewritten.safetensors");
  Check(again.ok(), "rewritten file parses");
  Check(again->header_bytes % 8 == 0, "header padded to 8 bytes");
  Check(again->tensors.size() == header->tensors.size(), "same tensor count");
  Check(again->metadata == header->metadata, "same metadata");
  return 0;
}
