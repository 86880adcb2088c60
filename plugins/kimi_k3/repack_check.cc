// k3-repack --check: a container's shards against the checksums written with them (repack.h).
#include <algorithm>
#include <atomic>
#include <filesystem>
#include <map>
#include <mutex>
#include <thread>

#include "common/io/cat.h"
#include "common/safetensors/safetensors.h"
#include "common/status/status.h"
#include "plugins/kimi_k3/container.h"
#include "plugins/kimi_k3/repack.h"

namespace coli::k3 {

using ::coli::internal_cat::Cat;

absl::StatusOr<CheckSummary> CheckContainer(const std::string& dst, int threads,
                                            const std::function<void(std::string_view)>& progress) {
  std::vector<std::string> shards;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(dst, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.ends_with(".safetensors")) shards.push_back(name);
  }
  if (ec) return absl::NotFoundError(Cat("container '", dst, "': cannot list: ", ec.message()));
  if (shards.empty()) {
    return absl::NotFoundError(Cat("container '", dst, "' holds no *.safetensors file"));
  }
  std::sort(shards.begin(), shards.end());
  // Each shard's CRCs only vouch for that shard: one copied in from another container passes
  // them all, so the shards' repack settings are compared first.
  std::vector<std::pair<std::string, std::map<std::string, std::string>>> records;
  for (const std::string& name : shards) {
    const std::string path = dst + "/" + name;
    COLI_ASSIGN_OR_RETURN(auto metadata, ReadShardMetadata(path));
    records.emplace_back(path, std::move(metadata));
  }
  COLI_RETURN_IF_ERROR(CheckOneRepack(records));
  // And against the container's index, as the loader opens them: shards renamed or swapped pass
  // their own CRCs but do not load.
  absl::StatusOr<std::unique_ptr<st::Snapshot>> snapshot = st::Snapshot::Open(dst);
  if (!snapshot.ok()) {
    return Annotate(snapshot.status(),
                    Cat("container '", dst,
                        "': its index is missing or unreadable (a k3-repack run that has not "
                        "finished writes it last; run k3-repack <source> '",
                        dst, "' again)"));
  }
  for (int s = 0; s < (*snapshot)->num_shards(); ++s) {
    // A shard kept in another folder (K3_DIRS) is not checked here, as before.
    if (!std::filesystem::exists((*snapshot)->ShardPath(s), ec)) continue;
    COLI_RETURN_IF_ERROR((*snapshot)->ShardFile(s).status());
  }
  if (threads <= 0) threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  threads = std::min<int>(threads, static_cast<int>(shards.size()));

  CheckSummary summary;
  absl::Status first_damage;
  std::mutex mu;
  std::atomic<size_t> next{0};
  auto work = [&] {
    for (size_t i = next++; i < shards.size(); i = next++) {
      const std::string path = dst + "/" + shards[i];
      absl::StatusOr<uint64_t> bytes = st::VerifyChecksums(path);
      std::lock_guard<std::mutex> lock(mu);
      if (bytes.ok()) {
        ++summary.shards;
        summary.bytes += *bytes;
        if (progress) progress(Cat(shards[i], ": ", *bytes, " bytes intact"));
      } else if (bytes.status().code() == absl::StatusCode::kNotFound &&
                 bytes.status().message().find("has no checksums") != std::string_view::npos) {
        summary.without_checksums.push_back(shards[i]);
        if (progress) progress(Cat(shards[i], ": no checksums"));
      } else {
        if (progress) progress(Cat(shards[i], ": ", bytes.status().message()));
        if (first_damage.ok()) first_damage = bytes.status();
        next = shards.size();  // stop at the first damage
      }
    }
  };
  std::vector<std::thread> pool;
  for (int t = 1; t < threads; ++t) pool.emplace_back(work);
  work();
  for (std::thread& t : pool) t.join();
  if (!first_damage.ok()) return first_damage;
  if (!summary.without_checksums.empty()) {
    std::sort(summary.without_checksums.begin(), summary.without_checksums.end());
    return absl::FailedPreconditionError(
        Cat(summary.without_checksums.size(), " shard(s) have no checksums (first: '",
            summary.without_checksums.front(),
            "'; made by an older k3-repack or another tool): "
            "only `k3-repack <src> <dst> --verify-full` can check them; ",
            summary.shards, " other shard(s) intact"));
  }
  return summary;
}

}  // namespace coli::k3
