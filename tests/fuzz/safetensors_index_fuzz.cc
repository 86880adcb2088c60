// libFuzzer target: the model.safetensors.index.json parser on arbitrary bytes.
//
// Every accepted index must name only plain shard file names, list each shard once (sorted),
// and map every tensor to one of them. Built and run by scripts/fuzz.sh.
#include <algorithm>
#include <cstdint>
#include <string_view>

#include "common/safetensors/safetensors.h"
#include "tests/fuzz/fuzz_check.h"

using ::coli::fuzz::Check;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace coli::st;
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<Index> index = ParseIndex(text, "fuzz.index.json");
  if (!index.ok()) {
    Check(!index.status().message().empty(), "error without a message");
    return 0;
  }
  Check(!index->weight_map.empty(), "an index names at least one tensor");
  Check(std::is_sorted(index->shards.begin(), index->shards.end()), "shards sorted");
  Check(std::adjacent_find(index->shards.begin(), index->shards.end()) == index->shards.end(),
        "shards distinct");
  for (const std::string& shard : index->shards) {
    Check(!shard.empty() && shard != "." && shard != "..", "plain shard name");
    Check(shard.find('/') == std::string::npos, "no folder in a shard name");
  }
  for (const auto& [name, shard] : index->weight_map) {
    Check(std::binary_search(index->shards.begin(), index->shards.end(), shard),
          "every tensor maps to a listed shard");
  }
  return 0;
}
