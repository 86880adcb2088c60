// The streaming expert store: routed experts read from the safetensors shards on demand into a
// per-MoE-layer LRU of RAM slots, at the drive's rate (spec §2.4–§2.5, §7.2; seed "Streaming
// design").
//
//   COLI_ASSIGN_OR_RETURN(ExpertStoreLayout layout, DiscoverExpertLayout(snapshot.get()));
//   ExpertStoreOptions options;            // K3_EXPERT_GB, K3_DIRECT, K3_PIPE, K3_LOAD_THREADS
//   options.usage_path = model_dir + "/.coli_usage";
//   COLI_ASSIGN_OR_RETURN(auto store, StreamingExpertStore::Open(snapshot.get(), layout, options));
//   COLI_RETURN_IF_ERROR(store->ForEachExpert(layer, top16, [&](int i, const ExpertWeights& w) {
//     return ApplyExpert(w, ...);          // called as soon as expert i is in RAM
//   }));
//   ExpertStoreStats token = store->TakeStats();   // bytes read, hits, read/compute seconds
//
// Design.
// * Slots. One slot holds one expert: the 4 KiB-aligned cover of its byte range (so O_DIRECT can
//   read straight into it; the unaligned head and tail are skipped by pointer, never copied).
//   Each MoE layer keeps up to `cap` slots, cap = floor(expert_gb·1e9 / (expert_bytes · layers))
//   clamped to [1, experts]: the floor of 1 honours any budget, because experts are consumed one
//   at a time. A shared working set of `working_slots` slots receives fresh reads; after an
//   expert has been computed its working slot is swapped (pointer swap, no copy) with the layer's
//   least-recently-used unpinned slot, which joins the working set.
// * Reads. When the tensors of an expert (MXFP4: w1 packed/scale, w2 …, w3 …; F32: w1, w2, w3,
//   spec §9.8) are back to back in one shard (checked for every expert at Open via
//   Snapshot::ContiguousRange) the expert's
//   4 KiB-aligned cover is one pread (or, with read_pieces > 1, that many aligned pieces);
//   otherwise one read per tensor into the same slot layout. A call's misses are sorted
//   by (shard, file offset) and their requests queued in that order; the `load_threads` loader
//   threads take requests from the front (with pieces they cooperate on expert j before j+1,
//   so experts arrive one by one in disk order).
//   O_DIRECT by default (buffered + POSIX_FADV_WILLNEED for the whole miss list when
//   direct = false).
// * Pipelining. The loaders start before the callbacks: `meanwhile` (the caller's work that does
//   not need the experts, ForEachExpertOverlapped) runs first, then the cached experts are
//   computed while the misses load, then each miss is handed to fn as soon as it has arrived
//   (pipe = true). With pipe = false the misses are read (in parallel) batch by batch and
//   computed after each batch.
// * Trace. StartTrace() records when every piece read and every callback starts and ends
//   (TakeTrace()), for the benchmark's per-layer timelines.
// * Pinning. With at least kUsageMinHistory recorded selections in the usage history, the
//   PinsPerLayer() most-used experts of each layer are read at Open and never evicted.
// * Failures. A read error, a shard that was truncated or replaced since Open (its size, inode
//   or mtime changed), or an error from fn ends the call with that status after every
//   outstanding read has finished; the store stays consistent and serves other experts.
//
// Threading: ForEachExpert calls are serialised (one at a time); fn runs on the calling thread.
// The stats accessors may be called from any thread.
#ifndef COLI_PLUGINS_KIMI_K3_EXPERT_STORE_H_
#define COLI_PLUGINS_KIMI_K3_EXPERT_STORE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/safetensors/safetensors.h"
#include "plugins/kimi_k3/expert_source.h"
#include "plugins/kimi_k3/expert_store_usage.h"
#include "plugins/kimi_k3/options.h"

namespace coli::k3 {

// Where the routed experts are and how big they are.
struct ExpertStoreLayout {
  std::vector<int> moe_layers;  // decoder-layer ids that have routed experts, ascending
  int experts = 0;              // routed experts per layer (896)
  int64_t latent = 0;           // expert input/output width (3584)
  int64_t inter = 0;            // expert inner width (3072)
  std::string prefix;           // text before "model.layers.", e.g. "language_model." or ""
  // MXFP4 (six U8 tensors per expert) or F32 (three plain w{1,2,3}.weight, spec §9.8); the
  // slots hold the stored bytes either way and the views carry the format.
  ExpertFormat format = ExpertFormat::kMxfp4;

  // Name of one expert tensor, e.g. TensorName(3, 17, "w2.weight_scale").
  std::string TensorName(int layer, int expert, std::string_view tensor) const;
  // Bytes of one expert: 3 · (inter·latent/2 + inter·latent/32) (MXFP4), 3 · 4 · inter·latent
  // (F32).
  uint64_t ExpertBytes() const;
};

// Finds the MoE layers, expert count, widths, name prefix and format from the snapshot's tensor
// names and the shape of layer L's experts.0.w1.weight_packed (MXFP4) or experts.0.w1.weight
// (F32; BF16 is UNIMPLEMENTED naming it). With num_layers >= 0 only decoder layers below it
// count (K3_LAYERS truncation). NOT_FOUND when there are no experts.
absl::StatusOr<ExpertStoreLayout> DiscoverExpertLayout(st::Snapshot* snapshot, int num_layers = -1);

struct ExpertStoreOptions {
  double expert_gb = 8;   // K3_EXPERT_GB: LRU budget in GB (1e9 B), split over the MoE layers
  bool direct = true;     // K3_DIRECT
  bool pipe = true;       // K3_PIPE
  int load_threads = 4;   // K3_LOAD_THREADS, 1…16
  // K3_VERIFY: with a snapshot opened with verify_checksums, an expert read from disk for the
  // first time is checked against its tensors' stored CRC-32 by the loader that finished it
  // (DATA_LOSS naming the file, the tensor and both CRCs; the expert is not cached). Later reads
  // of an expert that passed are not checked again: the damage this finds is on the disk and
  // does not come and go, and zlib's CRC runs at about the disk's rate per core
  // (docs/status/repack.md "Checksums checked at load").
  bool verify_checksums = true;
  int working_slots = 0;  // fresh-read slots shared by all layers; 0 = max(16, 2·load_threads)
  // Requests per contiguous expert read: 1 = the whole aligned cover in one pread (default);
  // N > 1 = N aligned pieces (each ≥ 4 KiB) that the loaders take in order, so experts arrive
  // one by one in disk order; 0 = one piece per loader thread. Measured on the shared virtio
  // disk: no end-to-end gain and ~7% less bandwidth (docs/status/issue-6.md), hence off.
  int read_pieces = 1;
  // Allocate and touch every planned slot (cap·layers + working) at Open instead of on first
  // use: without it the first tokens' reads also fault fresh buffers in (measured 13–32 %
  // slower reads in token 1, lower read rates over 8 cold tokens; docs/status/issue-6.md).
  // Costs a memset of the whole plan at Open.
  bool prefault = true;
  // Usage history file ("" = none). Read at Open for pinning; Record* add to it in RAM.
  std::string usage_path;
  bool record_usage = true;  // count every selection
  bool save_usage = true;    // write usage_path (atomically) when the store is destroyed
  bool pin = true;           // pin hot experts from the history
  // Memory planner: bytes the rest of the process still needs on top of the expert slots, and
  // where MemAvailable comes from (tests point it at a fake file).
  uint64_t reserve_bytes = 0;
  std::string meminfo_path = "/proc/meminfo";
};

// The store's options from the model's typed switches (K3_EXPERT_GB, K3_DIRECT, K3_PIPE,
// K3_LOAD_THREADS), with the usage history at DefaultUsagePath(model_dir).
ExpertStoreOptions ExpertStoreOptionsFrom(const ModelOptions& model, const std::string& model_dir);

// Where the usage history of the snapshot in `model_dir` lives: `<model_dir>/.coli_usage` when
// that folder is writable, else `<cache>/coli/usage/<model_dir with '/' as '_'>.coli_usage`
// with <cache> = $XDG_CACHE_HOME or $HOME/.cache (created on demand); "" when neither works.
std::string DefaultUsagePath(const std::string& model_dir);

// How the expert budget maps onto RAM (see PlanExpertMemory).
struct ExpertMemoryPlan {
  int slots_per_layer = 0;  // cap
  int layers = 0;
  int working_slots = 0;
  uint64_t expert_bytes = 0;
  uint64_t slot_bytes = 0;     // allocation per slot (aligned cover + one block)
  uint64_t total_bytes = 0;    // (cap·layers + working) · slot_bytes
  uint64_t mem_available = 0;  // from /proc/meminfo
  uint64_t reserve_bytes = 0;
  std::string Describe() const;  // one line with the numbers
};

// MemAvailable of `meminfo_path` in bytes. NOT_FOUND/DATA_LOSS naming the file.
absl::StatusOr<uint64_t> ReadMemAvailable(const std::string& meminfo_path);

// cap = clamp(floor(expert_gb·1e9 / (expert_bytes·layers)), 1, experts); RESOURCE_EXHAUSTED with
// the numbers when (cap·layers + working_slots)·slot_bytes + reserve exceeds mem_available.
absl::StatusOr<ExpertMemoryPlan> PlanExpertMemory(double expert_gb, int layers, int experts,
                                                  uint64_t expert_bytes, int working_slots,
                                                  uint64_t mem_available, uint64_t reserve_bytes);

// Statistics since the last TakeStats() (or since Open).
struct ExpertStoreStats {
  uint64_t calls = 0;          // ForEachExpert calls
  uint64_t selections = 0;     // list entries passed in
  uint64_t hits = 0;           // distinct experts served from RAM
  uint64_t misses = 0;         // distinct experts read from disk
  uint64_t bytes_read = 0;     // expert bytes read (misses · expert_bytes)
  uint64_t preads = 0;         // read requests issued (pieces per contiguous expert, 6 otherwise)
  double read_seconds = 0;     // wall time with at least one expert read in flight
  double compute_seconds = 0;  // time spent inside the callbacks and `meanwhile`
  double wait_seconds = 0;     // time the caller waited for a read (not hidden by compute)
  double wall_seconds = 0;     // time inside ForEachExpert
  uint64_t bytes_verified = 0;  // expert bytes checked against their stored CRC-32
  double verify_seconds = 0;    // loader time spent on those checks (summed over loaders)

  double hit_rate() const;
  // Time read and compute ran at the same time: read + compute − wall (≥ 0).
  double overlap_seconds() const;
  double read_gbs() const;  // bytes_read / read_seconds / 1e9
  void Add(const ExpertStoreStats& other);
  std::string Describe() const;  // one human-readable line
};

// One event of the optional timeline (StartTrace / TakeTrace); times in seconds since
// StartTrace().
struct ExpertTraceEvent {
  enum class Kind { kCall, kRead, kCompute, kMeanwhile };
  Kind kind = Kind::kCall;
  int layer = 0;        // decoder-layer id
  int32_t expert = -1;  // kRead / kCompute
  int piece = 0;        // kRead: piece index; kCompute: list entry i; kCall: misses
  int thread = -1;      // kRead: loader index
  bool hit = false;     // kCompute: the expert came from RAM
  double start = 0, end = 0;
};

class StreamingExpertStore final : public ExpertSource {
 public:
  // Verifies every expert tensor (format, dtype and shapes from `layout`, LocateExpert) and its
  // contiguity (an F32 expert counts as contiguous only at a 4-byte aligned offset, so its
  // views are float-aligned in the slot; otherwise it is read tensor by tensor), plans the
  // memory (refusing a budget the machine cannot hold), starts the loader threads and preloads
  // the pinned experts. `snapshot` must outlive the store.
  static absl::StatusOr<std::unique_ptr<StreamingExpertStore>> Open(
      st::Snapshot* snapshot, const ExpertStoreLayout& layout, const ExpertStoreOptions& options);
  ~StreamingExpertStore() override;
  StreamingExpertStore(const StreamingExpertStore&) = delete;
  StreamingExpertStore& operator=(const StreamingExpertStore&) = delete;

  // `layer` is the decoder-layer id (one of layout.moe_layers); INVALID_ARGUMENT for any other
  // layer or an expert id outside [0, experts). Duplicate ids are loaded once and fn is called
  // for every list entry.
  absl::Status ForEachExpert(
      int layer, std::span<const int32_t> experts,
      const std::function<absl::Status(int i, const ExpertWeights&)>& fn) override;

  // Starts the loads, runs `meanwhile` on this thread while they run, then as ForEachExpert.
  absl::Status ForEachExpertOverlapped(
      int layer, std::span<const int32_t> experts, const std::function<absl::Status()>& meanwhile,
      const std::function<absl::Status(int i, const ExpertWeights&)>& fn) override;

  // Timeline recording: StartTrace() clears and starts it, TakeTrace() returns the events so
  // far (and keeps recording until StopTrace()).
  void StartTrace();
  std::vector<ExpertTraceEvent> TakeTrace();
  void StopTrace();

  ExpertStoreStats TakeStats();         // returns and resets the per-token counters
  ExpertStoreStats TotalStats() const;  // since Open

  const ExpertMemoryPlan& plan() const;
  const ExpertStoreLayout& layout() const;
  // Experts of `layer` currently in its LRU, most recently used first (pinned ones excluded).
  std::vector<int32_t> CachedExperts(int layer) const;
  std::vector<int32_t> PinnedExperts(int layer) const;
  // Where expert `expert` of decoder layer `layer` lies (for benchmarks): its shard file, first
  // byte and length — the joint range when contiguous, else the first tensor's offset and the
  // expert's total bytes. INVALID_ARGUMENT for an unknown layer or expert.
  struct Extent {
    std::string path;
    uint64_t offset = 0;
    uint64_t nbytes = 0;
    bool contiguous = false;
  };
  absl::StatusOr<Extent> ExpertExtent(int layer, int expert) const;
  // Experts whose tensors are one contiguous range (one pread each).
  int64_t contiguous_experts() const;
  // True when every shard reader got O_DIRECT (false with direct = false or a refusing FS).
  bool all_direct() const;
  // Writes the usage history now (atomically); no-op without usage_path.
  absl::Status SaveUsage();
  // Counts selections of experts of decoder layer `layer` that were computed elsewhere (the
  // Vulkan tier, vk_tier.h, takes resident experts without passing them here), as ForEachExpert
  // counts its own, so the history stays complete. Unknown layers / experts are ignored.
  void RecordUsage(int layer, std::span<const int32_t> experts);
  const UsageHistory& usage() const;

  class Impl;

 private:
  explicit StreamingExpertStore(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

struct Config;  // config.h

// A Model::ExpertSourceFactory (model.h) that opens a StreamingExpertStore over the model's
// snapshot, for the layers the model runs:
//   Model::Load(dir, opt, progress, StreamingExpertSourceFactory(ExpertStoreOptionsFrom(opt, dir),
//                                                                &store));
// `store_out`, when given, receives the store (owned by the model) for its statistics.
using ExpertSourceFactoryFn = std::function<absl::StatusOr<std::unique_ptr<ExpertSource>>(
    st::Snapshot& snapshot, const Config& cfg, const std::string& prefix, int num_layers)>;
ExpertSourceFactoryFn StreamingExpertSourceFactory(ExpertStoreOptions options,
                                                   StreamingExpertStore** store_out = nullptr);

}  // namespace coli::k3

#endif  // COLI_PLUGINS_KIMI_K3_EXPERT_STORE_H_
