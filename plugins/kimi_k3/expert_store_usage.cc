#include "plugins/kimi_k3/expert_store_usage.h"

#include <algorithm>
#include <cstring>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "common/io/io.h"
#include "common/status/status.h"

namespace coli::k3 {
namespace {

constexpr char kMagic[8] = {'C', 'O', 'L', 'I', 'U', 'S', 'G', '1'};
constexpr uint32_t kVersion = 1;
constexpr size_t kHeaderBytes = 32;

uint64_t Fnv1a64(std::string_view bytes) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : bytes) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

template <typename T>
void PutLe(std::string* out, T v) {
  for (size_t i = 0; i < sizeof(T); ++i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

template <typename T>
T GetLe(const std::string& in, size_t pos) {
  T v = 0;
  for (size_t i = 0; i < sizeof(T); ++i) {
    v |= static_cast<T>(static_cast<unsigned char>(in[pos + i])) << (8 * i);
  }
  return v;
}

}  // namespace

int PinsPerLayer(int cap, uint64_t history) {
  if (cap <= 1 || history < kUsageMinHistory) return 0;
  const double fraction =
      std::min(1.0, static_cast<double>(history) / static_cast<double>(kUsageFullHistory));
  return static_cast<int>(static_cast<double>(cap / 2) * fraction);
}

UsageHistory::UsageHistory(std::vector<int> layers, int experts)
    : layers_(std::move(layers)),
      experts_(experts),
      counts_(layers_.size() * static_cast<size_t>(std::max(experts, 0)), 0) {}

absl::StatusOr<UsageHistory> UsageHistory::Load(const std::string& path, std::vector<int> layers,
                                                int experts) {
  UsageHistory history(std::move(layers), experts);
  absl::StatusOr<std::string> read = io::ReadFileToString(path, uint64_t{1} << 28);
  if (absl::IsNotFound(read.status())) return history;
  if (!read.ok()) return read.status();
  const std::string& bytes = *read;
  const size_t num_layers = history.layers_.size();
  const size_t expected =
      kHeaderBytes + 4 * num_layers + 8 * num_layers * static_cast<size_t>(experts) + 8;
  if (bytes.size() < kHeaderBytes + 8 || std::memcmp(bytes.data(), kMagic, 8) != 0) {
    return absl::DataLossError(
        absl::StrCat("usage history '", path, "': not a .coli_usage file (bad magic or too short)"));
  }
  if (Fnv1a64(std::string_view(bytes).substr(0, bytes.size() - 8)) !=
      GetLe<uint64_t>(bytes, bytes.size() - 8)) {
    return absl::DataLossError(absl::StrCat("usage history '", path, "': checksum mismatch"));
  }
  const uint32_t version = GetLe<uint32_t>(bytes, 8);
  if (version != kVersion) {
    return absl::FailedPreconditionError(
        absl::StrCat("usage history '", path, "': version ", version, ", expected ", kVersion));
  }
  const uint32_t file_layers = GetLe<uint32_t>(bytes, 12);
  const uint32_t file_experts = GetLe<uint32_t>(bytes, 16);
  if (file_layers != num_layers || file_experts != static_cast<uint32_t>(experts)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "usage history '", path, "': written for ", file_layers, " MoE layers x ", file_experts,
        " experts, this model has ", num_layers, " x ", experts));
  }
  if (bytes.size() != expected) {
    return absl::DataLossError(absl::StrCat("usage history '", path, "': ", bytes.size(),
                                            " bytes, expected ", expected));
  }
  for (size_t l = 0; l < num_layers; ++l) {
    const int id = static_cast<int32_t>(GetLe<uint32_t>(bytes, kHeaderBytes + 4 * l));
    if (id != history.layers_[l]) {
      return absl::FailedPreconditionError(
          absl::StrCat("usage history '", path, "': MoE layer #", l, " is decoder layer ", id,
                       ", this model's is ", history.layers_[l]));
    }
  }
  const size_t counts_at = kHeaderBytes + 4 * num_layers;
  uint64_t sum = 0;
  for (size_t i = 0; i < history.counts_.size(); ++i) {
    history.counts_[i] = GetLe<uint64_t>(bytes, counts_at + 8 * i);
    sum += history.counts_[i];
  }
  const uint64_t total = GetLe<uint64_t>(bytes, 24);
  if (sum != total) {
    return absl::DataLossError(absl::StrCat("usage history '", path, "': counts sum to ", sum,
                                            ", header says ", total));
  }
  history.total_ = total;
  return history;
}

std::string UsageHistory::Serialize() const {
  std::string out(kMagic, 8);
  PutLe<uint32_t>(&out, kVersion);
  PutLe<uint32_t>(&out, static_cast<uint32_t>(layers_.size()));
  PutLe<uint32_t>(&out, static_cast<uint32_t>(experts_));
  PutLe<uint32_t>(&out, 0);
  PutLe<uint64_t>(&out, total_);
  for (int id : layers_) PutLe<uint32_t>(&out, static_cast<uint32_t>(id));
  for (uint64_t c : counts_) PutLe<uint64_t>(&out, c);
  PutLe<uint64_t>(&out, Fnv1a64(out));
  return out;
}

absl::Status UsageHistory::Save(const std::string& path) const {
  return Annotate(io::WriteFileAtomic(path, Serialize()), "saving expert usage history");
}

void UsageHistory::Record(int layer_index, int expert, uint64_t n) {
  counts_[static_cast<size_t>(layer_index) * experts_ + expert] += n;
  total_ += n;
}

uint64_t UsageHistory::count(int layer_index, int expert) const {
  return counts_[static_cast<size_t>(layer_index) * experts_ + expert];
}

std::vector<int32_t> UsageHistory::Hottest(int layer_index, int n) const {
  std::vector<int32_t> ids(experts_);
  std::iota(ids.begin(), ids.end(), 0);
  const uint64_t* c = &counts_[static_cast<size_t>(layer_index) * experts_];
  std::stable_sort(ids.begin(), ids.end(), [c](int32_t a, int32_t b) { return c[a] > c[b]; });
  std::vector<int32_t> out;
  for (int32_t id : ids) {
    if (static_cast<int>(out.size()) >= n || c[id] == 0) break;
    out.push_back(id);
  }
  return out;
}

}  // namespace coli::k3
