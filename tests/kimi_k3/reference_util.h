// Helpers for the Kimi K3 model tests: running the numpy reference, temp folders, f32 files,
// relative errors, and rewriting fixture shards into bad checkpoints.
#ifndef COLI_TESTS_KIMI_K3_REFERENCE_UTIL_H_
#define COLI_TESTS_KIMI_K3_REFERENCE_UTIL_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/safetensors/safetensors.h"

namespace coli::k3::testing {

// A fresh folder under $TMPDIR, removed with its content on destruction.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  const std::string& path() const { return path_; }
  std::string File(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

// Runs tools/k3/k3_ref.py with `args` (already shell-quoted where needed); returns stdout.
absl::StatusOr<std::string> RunReference(const std::string& args);

std::vector<float> ReadF32(const std::string& path);
void WriteF32(const std::string& path, const std::vector<float>& v);

// ||a − ref|| / ||ref|| over [offset, offset + n).
double RelL2(const float* a, const float* ref, int64_t n);
// The worst per-row RelL2 of eng against ref, both [rows, width]; *worst_row (when given) gets
// its row. +infinity when the sizes differ or are not whole rows.
double WorstRowError(const std::vector<float>& eng, const std::vector<float>& ref, int64_t width,
                     int64_t* worst_row = nullptr);
// Hidden-state traces [T, L, D] (token-major, K3_TRACE): the worst RelL2 over the T positions
// of layer `layer`. +infinity when the sizes differ from T·L·D.
double WorstLayerError(const std::vector<float>& eng, const std::vector<float>& ref, int T, int L,
                       int64_t D, int layer);

// "1,2,3".
std::string JoinIds(const std::vector<int32_t>& ids);
// Deterministic pseudo-random ids in [0, vocab).
std::vector<int32_t> RandomIds(int n, int vocab, uint32_t seed);
// Parses {"ids": [...]} printed by `k3_ref.py run --greedy`.
std::vector<int32_t> ParseGreedyIds(const std::string& json_text);

// Copies a fixture folder into dst (a fresh folder).
void CopyDir(const std::string& src, const std::string& dst);

// One tensor of a shard being rewritten; the mutator may change any field, or set keep=false.
struct EditableTensor {
  std::string name;
  st::DType dtype;
  std::vector<int64_t> shape;
  std::string bytes;
  bool keep = true;
};
// Rewrites the shard of `dir` that holds `tensor` (per the index), passing every tensor of that
// shard through `edit`; tensors dropped are also removed from the index.
absl::Status RewriteShardOf(const std::string& dir, const std::string& tensor,
                            const std::function<void(EditableTensor&)>& edit);

}  // namespace coli::k3::testing

#endif  // COLI_TESTS_KIMI_K3_REFERENCE_UTIL_H_
