#include "plugins/kimi_k3/expert_store.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <charconv>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <filesystem>
#include <list>
#include <map>
#include <mutex>
#include <set>
#include <thread>
#include <tuple>
#include <unordered_map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/io/io.h"
#include "common/log/log.h"
#include "common/status/status.h"

namespace coli::k3 {
namespace {

using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

uint64_t RoundUp(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }
uint64_t AlignDown(uint64_t x) { return x / io::kDirectAlignment * io::kDirectAlignment; }

// Parses a run of decimal digits at text[*pos]; advances *pos.
bool ParseInt(std::string_view text, size_t* pos, int* value) {
  const char* begin = text.data() + *pos;
  const char* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(begin, end, *value);
  if (ec != std::errc() || ptr == begin) return false;
  *pos += static_cast<size_t>(ptr - begin);
  return true;
}

std::string Gb(uint64_t bytes) {
  return absl::StrFormat("%.2f GB", static_cast<double>(bytes) / 1e9);
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Layout

std::string ExpertStoreLayout::TensorName(int layer, int expert, std::string_view tensor) const {
  return absl::StrCat(prefix, "model.layers.", layer, ".block_sparse_moe.experts.", expert, ".",
                      std::string(tensor));
}

uint64_t ExpertStoreLayout::ExpertBytes() const {
  return ExpertFormatBytes(format, inter, latent);
}

absl::StatusOr<ExpertStoreLayout> DiscoverExpertLayout(st::Snapshot* snapshot, int num_layers) {
  constexpr std::string_view kLayers = "model.layers.";
  constexpr std::string_view kExperts = ".block_sparse_moe.experts.";
  // An expert's first tensor in either format (MXFP4 / F32).
  constexpr std::string_view kW1s[] = {".w1.weight_packed", ".w1.weight"};
  std::set<int> layers;
  int max_expert = -1;
  std::string prefix;
  bool have_prefix = false;
  for (const std::string& name : snapshot->Names()) {
    const size_t at = name.find(kLayers);
    if (at == std::string::npos) continue;
    std::string_view view(name);
    const std::string_view* w1 = nullptr;
    for (const std::string_view& s : kW1s)
      if (view.ends_with(s)) w1 = &s;
    if (w1 == nullptr) continue;
    size_t pos = at + kLayers.size();
    int layer = 0, expert = 0;
    if (!ParseInt(view, &pos, &layer)) continue;
    if (view.substr(pos, kExperts.size()) != kExperts) continue;
    pos += kExperts.size();
    if (!ParseInt(view, &pos, &expert) || pos + w1->size() != view.size()) continue;
    const std::string this_prefix = name.substr(0, at);
    if (!have_prefix) {
      prefix = this_prefix;
      have_prefix = true;
    } else if (prefix != this_prefix) {
      return absl::InvalidArgumentError(absl::StrCat("expert tensors use two name prefixes: '",
                                                     prefix, "' and '", this_prefix, "'"));
    }
    if (num_layers >= 0 && layer >= num_layers) continue;
    layers.insert(layer);
    max_expert = std::max(max_expert, expert);
  }
  if (layers.empty()) {
    return absl::NotFoundError(
        "no routed-expert tensors (model.layers.N.block_sparse_moe.experts.E.w1.weight_packed, "
        "or w1.weight when unquantized) in the snapshot");
  }
  ExpertStoreLayout layout;
  layout.moe_layers.assign(layers.begin(), layers.end());
  layout.experts = max_expert + 1;
  layout.prefix = prefix;
  COLI_ASSIGN_OR_RETURN(layout.format,
                        DetectExpertFormat(*snapshot, prefix, layout.moe_layers[0]));
  const bool f32 = layout.format == ExpertFormat::kF32;
  const std::string w1 =
      layout.TensorName(layout.moe_layers[0], 0, ExpertTensorSuffixes(layout.format)[0]);
  COLI_ASSIGN_OR_RETURN(const st::TensorInfo* info, snapshot->Get(w1));
  if (info->shape.size() != 2 || info->shape[0] <= 0 || info->shape[1] <= 0) {
    return absl::DataLossError(absl::StrCat("tensor '", w1, "': expected a 2-D ",
                                            f32 ? "F32" : "U8", " matrix, got ",
                                            st::DescribeTensor(info->dtype, info->shape)));
  }
  layout.inter = info->shape[0];
  layout.latent = f32 ? info->shape[1] : info->shape[1] * 2;
  return layout;
}

ExpertStoreOptions ExpertStoreOptionsFrom(const ModelOptions& model, const std::string& model_dir) {
  ExpertStoreOptions options;
  options.expert_gb = model.expert_gb;
  options.direct = model.direct;
  options.pipe = model.pipe;
  options.load_threads = model.load_threads;
  options.verify_checksums = model.verify_checksums;
  options.usage_path = DefaultUsagePath(model_dir);
  return options;
}

std::string DefaultUsagePath(const std::string& model_dir) {
  std::error_code ec;
  const std::filesystem::path dir = std::filesystem::absolute(model_dir, ec);
  if (ec) return "";
  if (::access(dir.c_str(), W_OK) == 0) return (dir / ".coli_usage").string();
  std::string cache;
  if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg != nullptr && xdg[0] != '\0') {
    cache = xdg;
  } else if (const char* home = std::getenv("HOME"); home != nullptr && home[0] != '\0') {
    cache = absl::StrCat(home, "/.cache");
  } else {
    return "";
  }
  const std::filesystem::path usage_dir = std::filesystem::path(cache) / "coli" / "usage";
  std::filesystem::create_directories(usage_dir, ec);
  if (ec) return "";
  std::string name = dir.string();
  std::replace(name.begin(), name.end(), '/', '_');
  return (usage_dir / (name + ".coli_usage")).string();
}

ExpertSourceFactoryFn StreamingExpertSourceFactory(ExpertStoreOptions options,
                                                   StreamingExpertStore** store_out) {
  return [options, store_out](st::Snapshot& snapshot, const Config&, const std::string&,
                              int num_layers) -> absl::StatusOr<std::unique_ptr<ExpertSource>> {
    COLI_ASSIGN_OR_RETURN(ExpertStoreLayout layout, DiscoverExpertLayout(&snapshot, num_layers));
    COLI_ASSIGN_OR_RETURN(std::unique_ptr<StreamingExpertStore> store,
                          StreamingExpertStore::Open(&snapshot, layout, options));
    if (store_out != nullptr) *store_out = store.get();
    return std::unique_ptr<ExpertSource>(std::move(store));
  };
}

// ---------------------------------------------------------------------------------------------
// Memory planner

absl::StatusOr<uint64_t> ReadMemAvailable(const std::string& meminfo_path) {
  // procfs files report size 0, so read until EOF rather than by size.
  std::FILE* f = std::fopen(meminfo_path.c_str(), "r");
  if (f == nullptr) {
    return absl::NotFoundError(absl::StrCat("'", meminfo_path, "': cannot open"));
  }
  std::string text;
  char chunk[4096];
  for (size_t n; (n = std::fread(chunk, 1, sizeof(chunk), f)) > 0 && text.size() < (1 << 20);) {
    text.append(chunk, n);
  }
  std::fclose(f);
  constexpr std::string_view kKey = "MemAvailable:";
  const size_t at = text.find(kKey);
  if (at == std::string::npos) {
    return absl::DataLossError(absl::StrCat("'", meminfo_path, "': no MemAvailable line"));
  }
  size_t pos = at + kKey.size();
  while (pos < text.size() && text[pos] == ' ') ++pos;
  uint64_t kib = 0;
  auto [ptr, ec] = std::from_chars(text.data() + pos, text.data() + text.size(), kib);
  if (ec != std::errc() || ptr == text.data() + pos) {
    return absl::DataLossError(absl::StrCat("'", meminfo_path, "': unreadable MemAvailable value"));
  }
  return kib * 1024;
}

std::string ExpertMemoryPlan::Describe() const {
  return absl::StrCat(slots_per_layer, " slots/layer x ", layers, " MoE layers + ", working_slots,
                      " working slots, ", slot_bytes, " B each = ", Gb(total_bytes),
                      " (MemAvailable ", Gb(mem_available), ", reserve ", Gb(reserve_bytes), ")");
}

absl::StatusOr<ExpertMemoryPlan> PlanExpertMemory(double expert_gb, int layers, int experts,
                                                  uint64_t expert_bytes, int working_slots,
                                                  uint64_t mem_available, uint64_t reserve_bytes) {
  if (!(expert_gb >= 0) || layers <= 0 || experts <= 0 || expert_bytes == 0 || working_slots < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("expert memory plan: bad arguments (K3_EXPERT_GB=", expert_gb,
                     ", layers=", layers, ", experts=", experts, ", expert bytes=", expert_bytes,
                     ", working slots=", working_slots, ")"));
  }
  ExpertMemoryPlan plan;
  const double per_layer = expert_gb * 1e9 / (static_cast<double>(expert_bytes) * layers);
  plan.slots_per_layer =
      static_cast<int>(std::clamp(std::floor(per_layer), 1.0, static_cast<double>(experts)));
  plan.layers = layers;
  plan.working_slots = working_slots;
  plan.expert_bytes = expert_bytes;
  plan.slot_bytes = RoundUp(expert_bytes, io::kDirectAlignment) + io::kDirectAlignment;
  plan.total_bytes =
      (static_cast<uint64_t>(plan.slots_per_layer) * layers + working_slots) * plan.slot_bytes;
  plan.mem_available = mem_available;
  plan.reserve_bytes = reserve_bytes;
  if (plan.total_bytes + reserve_bytes > mem_available) {
    const uint64_t floor_bytes = (static_cast<uint64_t>(layers) + working_slots) * plan.slot_bytes;
    std::string hint =
        floor_bytes + reserve_bytes > mem_available
            ? absl::StrCat("even 1 slot per layer needs ", Gb(floor_bytes),
                           "; this machine cannot stream this model")
            : absl::StrCat("lower K3_EXPERT_GB (1 slot per layer needs ", Gb(floor_bytes), ")");
    return absl::ResourceExhaustedError(absl::StrCat(
        "K3_EXPERT_GB=", expert_gb, " needs ", Gb(plan.total_bytes), " for expert slots (",
        plan.slots_per_layer, " slots/layer x ", layers, " MoE layers + ", working_slots,
        " working slots, ", plan.slot_bytes, " B each) plus ", Gb(reserve_bytes),
        " reserved, but MemAvailable is ", Gb(mem_available), ": ", hint));
  }
  return plan;
}

// ---------------------------------------------------------------------------------------------
// Statistics

double ExpertStoreStats::hit_rate() const {
  const uint64_t n = hits + misses;
  return n == 0 ? 0.0 : static_cast<double>(hits) / static_cast<double>(n);
}

double ExpertStoreStats::overlap_seconds() const {
  return std::max(0.0, read_seconds + compute_seconds - wall_seconds);
}

double ExpertStoreStats::read_gbs() const {
  return read_seconds > 0 ? static_cast<double>(bytes_read) / read_seconds / 1e9 : 0.0;
}

void ExpertStoreStats::Add(const ExpertStoreStats& o) {
  calls += o.calls;
  selections += o.selections;
  hits += o.hits;
  misses += o.misses;
  bytes_read += o.bytes_read;
  preads += o.preads;
  read_seconds += o.read_seconds;
  compute_seconds += o.compute_seconds;
  wait_seconds += o.wait_seconds;
  wall_seconds += o.wall_seconds;
  bytes_verified += o.bytes_verified;
  verify_seconds += o.verify_seconds;
}

std::string ExpertStoreStats::Describe() const {
  return absl::StrFormat(
      "experts: %.2f GB read (%.2f GB/s), hit rate %.1f%% (%d hits, %d misses), read %.3f s, "
      "compute %.3f s, wall %.3f s, overlap %.3f s",
      static_cast<double>(bytes_read) / 1e9, read_gbs(), 100.0 * hit_rate(), hits, misses,
      read_seconds, compute_seconds, wall_seconds, overlap_seconds());
}

// ---------------------------------------------------------------------------------------------
// The store

namespace {

// One slot: an aligned buffer and the first byte of the expert inside it.
struct Slot {
  std::unique_ptr<io::AlignedBuffer> buffer;
  const uint8_t* data = nullptr;
};

// One tensor's bytes when an expert is not contiguous: read to `dst` bytes into the slot.
struct Piece {
  int shard;
  uint64_t offset;
  uint64_t nbytes;
  uint64_t dst;
};

// Where one expert lives: a single range, or (pieces >= 0) one Piece per tensor (six MXFP4,
// three F32) starting at that index.
struct ExpertLoc {
  int shard = -1;
  uint64_t offset = 0;
  uint64_t nbytes = 0;
  int64_t pieces = -1;
};

struct Shard {
  std::string path;
  std::unique_ptr<io::DirectReader> reader;
  const io::File* file = nullptr;  // the snapshot's buffered descriptor (for fadvise)
  struct stat identity {};
};

// One expert to read. Its read is `pieces` requests (see PlanReads), queued in order; the
// loader that takes piece 0 gives the job its slot, the one that finishes the last piece hands
// the job over.
struct Job {
  int layer_index = 0;
  int32_t expert = 0;
  const ExpertLoc* loc = nullptr;
  Slot slot;
  absl::Status status;
  int pieces = 1;
  int pieces_left = 0;       // guarded by the store's mu_
  uint64_t cover_start = 0;  // contiguous: first byte of the 4 KiB-aligned cover
  uint64_t piece_bytes = 0;  // contiguous: bytes per piece (multiple of 4 KiB; last may be less)
  uint64_t data_offset = 0;  // the expert's first byte inside the slot buffer
};

}  // namespace

class StreamingExpertStore::Impl {
 public:
  Impl(st::Snapshot* snapshot, ExpertStoreLayout layout, ExpertStoreOptions options)
      : snapshot_(snapshot),
        layout_(std::move(layout)),
        options_(std::move(options)),
        usage_(layout_.moe_layers, layout_.experts) {}

  ~Impl() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    work_cv_.notify_all();
    for (std::thread& t : loaders_) t.join();
    if (options_.save_usage && options_.record_usage && usage_dirty_ &&
        !options_.usage_path.empty()) {
      absl::Status s = usage_.Save(options_.usage_path);
      if (!s.ok()) {
        COLI_LOG(kWarning) << s.message();
      }
    }
  }

  absl::Status Init();
  absl::Status ForEachExpert(int layer, std::span<const int32_t> experts,
                             const std::function<absl::Status()>* meanwhile,
                             const std::function<absl::Status(int, const ExpertWeights&)>& fn);

  void StartTrace() {
    std::lock_guard<std::mutex> lock(mu_);
    trace_.clear();
    trace_epoch_ = Clock::now();
    tracing_ = true;
  }
  std::vector<ExpertTraceEvent> TakeTrace() {
    std::lock_guard<std::mutex> lock(mu_);
    return std::exchange(trace_, {});
  }
  void StopTrace() {
    std::lock_guard<std::mutex> lock(mu_);
    tracing_ = false;
  }

  // Views of an expert whose tensors lie back to back from `data` (the slot layout).
  ExpertWeights Views(const uint8_t* data) const {
    std::array<const uint8_t*, 6> parts{};
    for (int k = 0; k < tensors_; ++k) parts[k] = data + part_offset_[k];
    return ExpertViewsFor(layout_.format, layout_.inter, layout_.latent, parts);
  }

  ExpertStoreStats TakeStats() {
    std::lock_guard<std::mutex> lock(mu_);
    ExpertStoreStats out = token_stats_;
    token_stats_ = ExpertStoreStats();
    return out;
  }
  ExpertStoreStats TotalStats() {
    std::lock_guard<std::mutex> lock(mu_);
    return total_stats_;
  }

  std::vector<int32_t> CachedExperts(int layer) {
    std::lock_guard<std::mutex> lock(call_mu_);
    std::vector<int32_t> out;
    auto it = layer_index_.find(layer);
    if (it == layer_index_.end()) return out;
    for (const Entry& e : caches_[it->second].lru) out.push_back(e.expert);
    return out;
  }
  std::vector<int32_t> PinnedExperts(int layer) {
    std::lock_guard<std::mutex> lock(call_mu_);
    std::vector<int32_t> out;
    auto it = layer_index_.find(layer);
    if (it == layer_index_.end()) return out;
    for (const auto& [id, slot] : caches_[it->second].pinned) out.push_back(id);
    std::sort(out.begin(), out.end());
    return out;
  }
  void RecordUsage(int layer, std::span<const int32_t> experts) {
    std::lock_guard<std::mutex> lock(call_mu_);
    auto it = layer_index_.find(layer);
    if (!options_.record_usage || it == layer_index_.end()) return;
    for (int32_t e : experts) {
      if (e >= 0 && e < layout_.experts) {
        usage_.Record(it->second, e);
        usage_dirty_ = true;
      }
    }
  }
  absl::Status SaveUsage() {
    std::lock_guard<std::mutex> lock(call_mu_);
    if (options_.usage_path.empty()) return absl::OkStatus();
    COLI_RETURN_IF_ERROR(usage_.Save(options_.usage_path));
    usage_dirty_ = false;
    return absl::OkStatus();
  }

  absl::StatusOr<StreamingExpertStore::Extent> ExpertExtent(int layer, int expert) const {
    auto it = layer_index_.find(layer);
    if (it == layer_index_.end() || expert < 0 || expert >= layout_.experts) {
      return absl::InvalidArgumentError(
          absl::StrCat("expert store: no expert ", expert, " in layer ", layer));
    }
    const ExpertLoc& loc = locs_[static_cast<size_t>(it->second) * layout_.experts + expert];
    return StreamingExpertStore::Extent{shards_.at(loc.shard).path, loc.offset, loc.nbytes,
                                        loc.pieces < 0};
  }

  ExpertMemoryPlan plan_;
  const ExpertStoreLayout& layout() const { return layout_; }
  const UsageHistory& usage() const { return usage_; }
  int64_t contiguous_ = 0;
  bool all_direct_ = true;

 private:
  struct Entry {
    int32_t expert;
    Slot slot;
  };
  struct LayerCache {
    std::list<Entry> lru;  // front = most recently used
    std::unordered_map<int32_t, std::list<Entry>::iterator> index;
    std::map<int32_t, Slot> pinned;
  };

  absl::Status LocateExperts();
  absl::Status OpenShards();
  absl::Status CheckShard(int shard) const;
  // Splits job's read into pieces (read_pieces_ aligned pieces of the cover when contiguous,
  // else one per tensor) and sets where the expert starts in its slot.
  void PlanReads(Job* job) const;
  absl::Status ReadPiece(const Job& job, int piece) const;
  // Whether the expert at locs_[loc] is still to be checked against its stored CRC-32.
  bool NeedsCheck(size_t loc) const {
    return !expert_tensors_.empty() && expert_tensors_[loc * tensors_] != nullptr && !checked_[loc];
  }
  // The expert's tensors in `job`'s slot against their stored CRC-32 (DATA_LOSS naming one).
  absl::Status CheckExpert(const Job& job, size_t loc) const;
  void LoaderLoop(int thread);
  // Appends a trace event when tracing (takes mu_).
  void Trace(ExpertTraceEvent::Kind kind, int layer_index, int32_t expert, int piece, bool hit,
             Clock::time_point start, Clock::time_point end);
  double TraceTime(Clock::time_point t) const {
    return std::chrono::duration<double>(t - trace_epoch_).count();
  }
  // Reads `jobs` (sorted by disk offset) and hands each to `consume` on this thread, in
  // completion order when pipelined, else batch by batch after each batch has arrived. Before
  // waiting for the first read, runs `meanwhile` (the cached experts' compute). Returns the
  // first error; every read has finished when it returns.
  absl::Status RunLoads(std::vector<Job>& jobs, bool pipelined,
                        const std::function<absl::Status()>& meanwhile,
                        const std::function<absl::Status(Job&)>& consume);
  void Cancel();
  // Moves a freshly read slot into the layer's LRU (evicting the least recently used unpinned
  // expert into `slot`, which then goes back to the working set).
  void InsertIntoCache(int layer_index, int32_t expert, Slot* slot);
  void ReturnSlot(Slot* slot);
  void GiveSlotToCache();

  st::Snapshot* snapshot_;
  ExpertStoreLayout layout_;
  ExpertStoreOptions options_;
  std::unordered_map<int, int> layer_index_;  // decoder layer id -> MoE layer index
  std::vector<ExpertLoc> locs_;               // [layer_index * experts + expert]
  // K3_VERIFY: each expert's tensors [loc * tensors_ + k] when they have stored CRC-32s (the
  // first null when not), and whether the expert has passed (guarded by mu_).
  std::vector<const st::TensorInfo*> expert_tensors_;
  std::vector<uint8_t> checked_;
  int tensors_ = 6;                           // tensors per expert (6 MXFP4, 3 F32)
  std::array<uint64_t, 6> part_offset_{};     // where each tensor starts in the slot
  std::vector<Piece> pieces_;
  std::map<int, Shard> shards_;

  std::mutex call_mu_;  // one ForEachExpert at a time; guards caches_ and usage_
  std::vector<LayerCache> caches_;
  UsageHistory usage_;
  bool usage_dirty_ = false;

  // Loader state, guarded by mu_.
  std::mutex mu_;
  std::condition_variable work_cv_;         // loaders: queue or slots changed, or stop
  std::condition_variable done_cv_;         // caller: a job completed
  std::deque<std::pair<Job*, int>> queue_;  // (job, piece) in read order
  std::deque<Job*> completed_;
  std::vector<Slot> free_slots_;
  int working_allocated_ = 0;  // working-set buffers in existence (free or in use)
  bool cancel_ = false;
  bool stop_ = false;
  int active_reads_ = 0;
  Clock::time_point busy_since_;
  ExpertStoreStats token_stats_;
  ExpertStoreStats total_stats_;
  std::vector<std::thread> loaders_;
  int read_pieces_ = 1;
  std::vector<std::unique_ptr<io::AlignedBuffer>> spare_;  // guarded by mu_
  std::atomic<bool> tracing_{false};  // written under mu_; read without it to skip the lock
  Clock::time_point trace_epoch_;
  std::vector<ExpertTraceEvent> trace_;
};

absl::Status StreamingExpertStore::Impl::Init() {
  const ExpertStoreLayout& L = layout_;
  const bool mxfp4 = L.format == ExpertFormat::kMxfp4;
  if (L.moe_layers.empty() || L.experts <= 0 || L.latent <= 0 || L.inter <= 0 ||
      (mxfp4 && (L.latent % 32 != 0 || L.inter % 32 != 0))) {
    return absl::InvalidArgumentError(absl::StrCat(
        "expert store: bad layout (", L.moe_layers.size(), " MoE layers, ", L.experts,
        " experts, latent ", L.latent, ", inter ", L.inter,
        mxfp4 ? "; MXFP4 widths must be multiples of 32)" : ")"));
  }
  if (options_.load_threads < 1 || options_.load_threads > 16) {
    return absl::InvalidArgumentError(
        absl::StrCat("K3_LOAD_THREADS=", options_.load_threads, ": expected 1…16"));
  }
  if (options_.read_pieces < 0 || options_.read_pieces > 64) {
    return absl::InvalidArgumentError(
        absl::StrCat("expert store: read_pieces=", options_.read_pieces,
                     ": expected 1…64 (0 = one per loader thread)"));
  }
  for (size_t i = 0; i < L.moe_layers.size(); ++i) {
    if (!layer_index_.emplace(L.moe_layers[i], static_cast<int>(i)).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("expert store: MoE layer ", L.moe_layers[i], " listed twice"));
    }
  }
  COLI_RETURN_IF_ERROR(LocateExperts());

  int working = options_.working_slots;
  if (working <= 0) working = std::max(16, 2 * options_.load_threads);
  working = std::max(working, options_.load_threads);
  COLI_ASSIGN_OR_RETURN(uint64_t available, ReadMemAvailable(options_.meminfo_path));
  COLI_ASSIGN_OR_RETURN(
      plan_, PlanExpertMemory(options_.expert_gb, static_cast<int>(L.moe_layers.size()), L.experts,
                              L.ExpertBytes(), working, available, options_.reserve_bytes));
  COLI_RETURN_IF_ERROR(OpenShards());
  caches_.resize(L.moe_layers.size());
  if (options_.prefault) {
    // Every planned slot now, each page written once, so the first token's reads do not pay
    // for faulting fresh buffers in.
    const uint64_t slots =
        static_cast<uint64_t>(plan_.slots_per_layer) * L.moe_layers.size() + plan_.working_slots;
    spare_.reserve(slots);
    for (uint64_t i = 0; i < slots; ++i) {
      auto buffer = std::make_unique<io::AlignedBuffer>(plan_.slot_bytes);
      std::memset(buffer->data(), 0, buffer->capacity());
      spare_.push_back(std::move(buffer));
    }
  }

  if (!options_.usage_path.empty()) {
    absl::StatusOr<UsageHistory> loaded =
        UsageHistory::Load(options_.usage_path, L.moe_layers, L.experts);
    if (loaded.ok()) {
      usage_ = std::move(*loaded);
    } else {
      COLI_LOG(kWarning) << loaded.status().message() << "; starting a new usage history";
    }
  }

  read_pieces_ = options_.read_pieces > 0 ? options_.read_pieces : options_.load_threads;
  for (int i = 0; i < options_.load_threads; ++i) {
    loaders_.emplace_back([this, i] { LoaderLoop(i); });
  }

  // Pin the hottest experts of every layer (read in one batch, in disk order).
  const int pins = options_.pin ? PinsPerLayer(plan_.slots_per_layer, usage_.total()) : 0;
  if (pins > 0) {
    std::vector<Job> jobs;
    for (size_t li = 0; li < L.moe_layers.size(); ++li) {
      for (int32_t e : usage_.Hottest(static_cast<int>(li), pins)) {
        Job job;
        job.layer_index = static_cast<int>(li);
        job.expert = e;
        job.loc = &locs_[li * L.experts + e];
        PlanReads(&job);
        jobs.push_back(std::move(job));
      }
    }
    std::sort(jobs.begin(), jobs.end(), [](const Job& a, const Job& b) {
      return std::tie(a.loc->shard, a.loc->offset) < std::tie(b.loc->shard, b.loc->offset);
    });
    COLI_RETURN_IF_ERROR(Annotate(RunLoads(
                                      jobs, /*pipelined=*/true, [] { return absl::OkStatus(); },
                                      [this](Job& job) {
                                        caches_[job.layer_index].pinned[job.expert] =
                                            std::move(job.slot);
                                        job.slot = Slot();
                                        GiveSlotToCache();
                                        return absl::OkStatus();
                                      }),
                                  "pinning hot experts"));
    TakeStats();  // the preload is not a token
  }
  COLI_LOG(kInfo) << "expert store: " << L.moe_layers.size() << " MoE layers x " << L.experts
                  << " experts of " << L.ExpertBytes() << " B; " << plan_.Describe() << "; "
                  << (all_direct_ ? "O_DIRECT" : "buffered") << ", pipe "
                  << (options_.pipe ? "on" : "off") << ", " << options_.load_threads << " loaders, "
                  << read_pieces_ << " pieces/read; " << contiguous_ << "/" << locs_.size()
                  << " experts contiguous; " << pins << " pinned/layer (history " << usage_.total()
                  << " selections)";
  return absl::OkStatus();
}

absl::Status StreamingExpertStore::Impl::LocateExperts() {
  const ExpertStoreLayout& L = layout_;
  tensors_ = ExpertTensorCount(L.format);
  locs_.resize(L.moe_layers.size() * L.experts);
  for (size_t li = 0; li < L.moe_layers.size(); ++li) {
    for (int e = 0; e < L.experts; ++e) {
      COLI_ASSIGN_OR_RETURN(ExpertLocation found,
                            LocateExpert(*snapshot_, L.format, L.prefix, L.moe_layers[li], e,
                                         L.inter, L.latent));
      if (li == 0 && e == 0) {  // the slot layout: the tensors back to back, in order
        uint64_t at = 0;
        for (int k = 0; k < tensors_; ++k) {
          part_offset_[k] = at;
          at += found.tensors[k]->nbytes;
        }
      }
      if (options_.verify_checksums && snapshot_->verifies_checksums()) {
        if (expert_tensors_.empty()) {
          expert_tensors_.assign(locs_.size() * tensors_, nullptr);
          checked_.assign(locs_.size(), 0);
        }
        bool all = true;
        for (int k = 0; k < tensors_; ++k) all = all && found.tensors[k]->crc32.has_value();
        if (all) {
          for (int k = 0; k < tensors_; ++k)
            expert_tensors_[(li * L.experts + e) * tensors_ + k] = found.tensors[k];
        }
      }
      const std::optional<st::Snapshot::Range>& range = found.contiguous;
      // An F32 expert is used in place only at a float-aligned file offset (its slot keeps the
      // offset's position within a 4 KiB block); otherwise each tensor goes to its own place.
      const bool aligned =
          L.format != ExpertFormat::kF32 || (range.has_value() && range->file_offset % 4 == 0);
      ExpertLoc& loc = locs_[li * L.experts + e];
      if (range.has_value() && range->nbytes == L.ExpertBytes() && aligned) {
        loc.shard = range->shard;
        loc.offset = range->file_offset;
        loc.nbytes = range->nbytes;
        ++contiguous_;
      } else {
        loc.shard = found.tensors[0]->shard;
        loc.offset = found.tensors[0]->file_offset;
        loc.nbytes = L.ExpertBytes();
        loc.pieces = static_cast<int64_t>(pieces_.size());
        for (int k = 0; k < tensors_; ++k) {
          const st::TensorInfo* t = found.tensors[k];
          pieces_.push_back({t->shard, t->file_offset, t->nbytes, part_offset_[k]});
        }
      }
    }
  }
  return absl::OkStatus();
}

absl::Status StreamingExpertStore::Impl::OpenShards() {
  std::set<int> used;
  for (const ExpertLoc& loc : locs_) used.insert(loc.shard);
  for (const Piece& p : pieces_) used.insert(p.shard);
  for (int s : used) {
    Shard shard;
    shard.path = snapshot_->ShardPath(s);
    COLI_ASSIGN_OR_RETURN(shard.file, snapshot_->ShardFile(s));
    COLI_ASSIGN_OR_RETURN(shard.reader, io::DirectReader::Open(shard.path, options_.direct));
    if (!shard.reader->is_direct()) all_direct_ = false;
    if (::stat(shard.path.c_str(), &shard.identity) != 0) {
      return absl::NotFoundError(absl::StrCat("shard '", shard.path, "': cannot stat"));
    }
    shards_.emplace(s, std::move(shard));
  }
  return absl::OkStatus();
}

absl::Status StreamingExpertStore::Impl::CheckShard(int s) const {
  const Shard& shard = shards_.at(s);
  struct stat now {};
  if (::stat(shard.path.c_str(), &now) != 0) {
    return absl::DataLossError(
        absl::StrCat("shard '", shard.path, "' disappeared while running; reload the model"));
  }
  const struct stat& then = shard.identity;
  if (now.st_dev != then.st_dev || now.st_ino != then.st_ino) {
    return absl::DataLossError(
        absl::StrCat("shard '", shard.path, "' was replaced while running; reload the model"));
  }
  if (now.st_size != then.st_size) {
    return absl::DataLossError(absl::StrCat("shard '", shard.path, "' changed size while running (",
                                            then.st_size, " -> ", now.st_size,
                                            " bytes); reload the model"));
  }
  if (now.st_mtim.tv_sec != then.st_mtim.tv_sec || now.st_mtim.tv_nsec != then.st_mtim.tv_nsec) {
    return absl::DataLossError(
        absl::StrCat("shard '", shard.path, "' was modified while running; reload the model"));
  }
  return absl::OkStatus();
}

void StreamingExpertStore::Impl::PlanReads(Job* job) const {
  const ExpertLoc& loc = *job->loc;
  if (loc.pieces >= 0) {  // one read per tensor, each to its place in the slot
    job->pieces = tensors_;
    job->data_offset = 0;
    return;
  }
  constexpr uint64_t kA = io::kDirectAlignment;
  job->cover_start = AlignDown(loc.offset);
  const uint64_t cover = RoundUp(loc.offset + loc.nbytes, kA) - job->cover_start;
  const uint64_t blocks = cover / kA;
  const uint64_t want = std::clamp<uint64_t>(static_cast<uint64_t>(read_pieces_), 1, blocks);
  job->piece_bytes = (blocks + want - 1) / want * kA;
  job->pieces = static_cast<int>((cover + job->piece_bytes - 1) / job->piece_bytes);
  job->data_offset = loc.offset - job->cover_start;
}

absl::Status StreamingExpertStore::Impl::ReadPiece(const Job& job, int piece) const {
  const ExpertLoc& loc = *job.loc;
  uint8_t* base = job.slot.buffer->data();
  if (loc.pieces >= 0) {
    const Piece& p = pieces_[loc.pieces + piece];
    return shards_.at(p.shard).reader->Read(p.offset, p.nbytes, base + p.dst);
  }
  const io::DirectReader& reader = *shards_.at(loc.shard).reader;
  const uint64_t end = loc.offset + loc.nbytes;
  const uint64_t cover_end = RoundUp(end, io::kDirectAlignment);
  uint64_t a = job.cover_start + static_cast<uint64_t>(piece) * job.piece_bytes;
  uint64_t b = std::min(cover_end, a + job.piece_bytes);
  if (!reader.is_direct()) {
    // Buffered: only the expert's own bytes, to the same place in the slot.
    a = std::max(a, loc.offset);
    b = std::min(b, end);
  } else if (b > reader.size()) {
    // The aligned cover runs past the end of the file: the last piece ends at the expert's
    // last byte (the reader bounces that unaligned request).
    b = end;
  }
  // Aligned a, b and destination: straight O_DIRECT into the slot, no copy.
  return reader.Read(a, b - a, base + (a - job.cover_start));
}

absl::Status StreamingExpertStore::Impl::CheckExpert(const Job& job, size_t loc) const {
  for (int k = 0; k < tensors_; ++k) {
    const st::TensorInfo& t = *expert_tensors_[loc * tensors_ + k];
    COLI_RETURN_IF_ERROR(
        st::CheckTensorBytes(t, snapshot_->ShardPath(t.shard), job.slot.data + part_offset_[k]));
  }
  return absl::OkStatus();
}

void StreamingExpertStore::Impl::Trace(ExpertTraceEvent::Kind kind, int layer_index, int32_t expert,
                                       int piece, bool hit, Clock::time_point start,
                                       Clock::time_point end) {
  if (!tracing_.load(std::memory_order_relaxed)) return;
  std::lock_guard<std::mutex> lock(mu_);
  if (!tracing_) return;
  trace_.push_back(ExpertTraceEvent{kind, layout_.moe_layers[layer_index], expert, piece, -1, hit,
                                    TraceTime(start), TraceTime(end)});
}

void StreamingExpertStore::Impl::LoaderLoop(int thread) {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    // A job's first piece needs a slot; its other pieces go into the slot it already has.
    work_cv_.wait(lock, [this] {
      return stop_ ||
             (!queue_.empty() && (cancel_ || queue_.front().second > 0 || !free_slots_.empty() ||
                                  working_allocated_ < plan_.working_slots));
    });
    if (stop_) return;
    const auto [job, piece] = queue_.front();
    queue_.pop_front();
    absl::Status status;
    if (cancel_) {
      status = absl::CancelledError("expert load cancelled after an earlier error");
    } else {
      if (piece == 0) {
        if (free_slots_.empty()) {
          ++working_allocated_;
          if (!spare_.empty()) {  // pre-faulted at Open (options.prefault)
            job->slot.buffer = std::move(spare_.back());
            spare_.pop_back();
          } else {
            job->slot.buffer = std::make_unique<io::AlignedBuffer>(plan_.slot_bytes);
          }
        } else {
          job->slot = std::move(free_slots_.back());
          free_slots_.pop_back();
        }
        job->slot.data = job->slot.buffer->data() + job->data_offset;
      }
      if (active_reads_++ == 0) busy_since_ = Clock::now();
      const Clock::time_point t0 = Clock::now();
      lock.unlock();
      status = ReadPiece(*job, piece);
      lock.lock();
      const Clock::time_point t1 = Clock::now();
      if (--active_reads_ == 0) {
        const double busy = std::chrono::duration<double>(t1 - busy_since_).count();
        token_stats_.read_seconds += busy;
        total_stats_.read_seconds += busy;
      }
      if (tracing_) {
        trace_.push_back(ExpertTraceEvent{ExpertTraceEvent::Kind::kRead,
                                          layout_.moe_layers[job->layer_index], job->expert, piece,
                                          thread, false, TraceTime(t0), TraceTime(t1)});
      }
      if (status.ok()) {
        token_stats_.preads += 1;
        total_stats_.preads += 1;
      } else {
        status = Annotate(status, absl::StrCat("layer ", layout_.moe_layers[job->layer_index],
                                               " expert ", job->expert));
      }
    }
    if (!status.ok() && job->status.ok()) job->status = std::move(status);
    if (--job->pieces_left == 0) {
      const size_t loc = static_cast<size_t>(job->loc - locs_.data());
      if (job->status.ok() && NeedsCheck(loc)) {
        // The last loader of the expert checks it outside the lock; nobody else touches the
        // job until it is in completed_.
        lock.unlock();
        const Clock::time_point t0 = Clock::now();
        absl::Status checked = CheckExpert(*job, loc);
        const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
        lock.lock();
        token_stats_.verify_seconds += seconds;
        total_stats_.verify_seconds += seconds;
        if (checked.ok()) {
          checked_[loc] = 1;
          token_stats_.bytes_verified += job->loc->nbytes;
          total_stats_.bytes_verified += job->loc->nbytes;
        } else {
          job->status =
              Annotate(checked, absl::StrCat("layer ", layout_.moe_layers[job->layer_index],
                                             " expert ", job->expert));
        }
      }
      if (job->status.ok()) {
        token_stats_.bytes_read += job->loc->nbytes;
        total_stats_.bytes_read += job->loc->nbytes;
      }
      completed_.push_back(job);
      done_cv_.notify_all();
    }
  }
}

void StreamingExpertStore::Impl::Cancel() {
  std::lock_guard<std::mutex> lock(mu_);
  cancel_ = true;
  work_cv_.notify_all();
}

void StreamingExpertStore::Impl::ReturnSlot(Slot* slot) {
  if (slot->buffer == nullptr) return;
  slot->data = nullptr;
  std::lock_guard<std::mutex> lock(mu_);
  free_slots_.push_back(std::move(*slot));
  *slot = Slot();
  work_cv_.notify_all();
}

void StreamingExpertStore::Impl::GiveSlotToCache() {
  std::lock_guard<std::mutex> lock(mu_);
  --working_allocated_;
  work_cv_.notify_all();
}

void StreamingExpertStore::Impl::InsertIntoCache(int layer_index, int32_t expert, Slot* slot) {
  LayerCache& cache = caches_[layer_index];
  const size_t used = cache.lru.size() + cache.pinned.size();
  if (used < static_cast<size_t>(plan_.slots_per_layer)) {
    cache.lru.push_front(Entry{expert, std::move(*slot)});
    *slot = Slot();
    cache.index[expert] = cache.lru.begin();
    GiveSlotToCache();
    return;
  }
  // Full: the least recently used unpinned expert gives its buffer back to the working set.
  // (Pinned experts are never in the list; at most cap/2 are pinned, so the list is not empty.)
  auto victim = std::prev(cache.lru.end());
  cache.index.erase(victim->expert);
  std::swap(victim->slot, *slot);
  victim->expert = expert;
  cache.lru.splice(cache.lru.begin(), cache.lru, victim);
  cache.index[expert] = cache.lru.begin();
}

absl::Status StreamingExpertStore::Impl::RunLoads(
    std::vector<Job>& jobs, bool pipelined, const std::function<absl::Status()>& meanwhile,
    const std::function<absl::Status(Job&)>& consume) {
  absl::Status status;
  auto fail = [&](absl::Status s) {
    if (status.ok() && !s.ok()) {
      status = std::move(s);
      Cancel();
    }
  };
  // Waits for `count` completions, in completion order.
  auto collect = [&](size_t count, std::vector<Job*>* out) {
    const Clock::time_point start = Clock::now();
    std::unique_lock<std::mutex> lock(mu_);
    while (out->size() < count) {
      done_cv_.wait(lock, [this] { return !completed_.empty(); });
      out->push_back(completed_.front());
      completed_.pop_front();
      if (pipelined) break;  // hand each one over as soon as it is there
    }
    const double waited = SecondsSince(start);
    token_stats_.wait_seconds += waited;
    total_stats_.wait_seconds += waited;
  };
  auto handle = [&](Job* job) {
    if (!job->status.ok()) fail(job->status);
    if (status.ok()) fail(consume(*job));
    ReturnSlot(&job->slot);
  };
  auto enqueue = [&](size_t begin, size_t end) {
    if (begin == end) return;  // every expert a hit: waking the loaders would only cost switches
    std::lock_guard<std::mutex> lock(mu_);
    for (size_t i = begin; i < end; ++i) {
      jobs[i].pieces_left = jobs[i].pieces;
      for (int p = 0; p < jobs[i].pieces; ++p) queue_.emplace_back(&jobs[i], p);
    }
    work_cv_.notify_all();
  };

  if (pipelined) {
    enqueue(0, jobs.size());
    fail(meanwhile());
    for (size_t done = 0; done < jobs.size();) {
      std::vector<Job*> ready;
      collect(jobs.size() - done, &ready);
      for (Job* job : ready) handle(job);
      done += ready.size();
    }
  } else {
    fail(meanwhile());
    const size_t batch = static_cast<size_t>(plan_.working_slots);
    for (size_t begin = 0; begin < jobs.size(); begin += batch) {
      const size_t end = std::min(jobs.size(), begin + batch);
      enqueue(begin, end);
      std::vector<Job*> ready;
      collect(end - begin, &ready);
      // Compute in disk order, after the whole batch has arrived.
      std::sort(ready.begin(), ready.end());
      for (Job* job : ready) handle(job);
    }
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    cancel_ = false;
  }
  return status;
}

absl::Status StreamingExpertStore::Impl::ForEachExpert(
    int layer, std::span<const int32_t> experts, const std::function<absl::Status()>* meanwhile,
    const std::function<absl::Status(int, const ExpertWeights&)>& fn) {
  const Clock::time_point start = Clock::now();
  std::lock_guard<std::mutex> call_lock(call_mu_);
  auto it = layer_index_.find(layer);
  if (it == layer_index_.end()) {
    return absl::InvalidArgumentError(
        absl::StrCat("expert store: layer ", layer, " has no routed experts"));
  }
  const int li = it->second;
  for (int32_t e : experts) {
    if (e < 0 || e >= layout_.experts) {
      return absl::InvalidArgumentError(absl::StrCat("expert store: layer ", layer, " expert ", e,
                                                     " out of range [0, ", layout_.experts, ")"));
    }
  }
  // Distinct experts, each with the list entries that selected it.
  std::map<int32_t, std::vector<int>> wanted;
  for (size_t i = 0; i < experts.size(); ++i) wanted[experts[i]].push_back(static_cast<int>(i));
  if (options_.record_usage && !experts.empty()) {
    for (int32_t e : experts) usage_.Record(li, e);
    usage_dirty_ = true;
  }

  LayerCache& cache = caches_[li];
  std::vector<std::pair<const Slot*, int32_t>> hits;
  std::vector<Job> jobs;
  std::set<int> shards;
  for (const auto& [e, entries] : wanted) {
    if (auto p = cache.pinned.find(e); p != cache.pinned.end()) {
      hits.emplace_back(&p->second, e);
    } else if (auto c = cache.index.find(e); c != cache.index.end()) {
      cache.lru.splice(cache.lru.begin(), cache.lru, c->second);  // touch
      hits.emplace_back(&c->second->slot, e);
    } else {
      Job job;
      job.layer_index = li;
      job.expert = e;
      job.loc = &locs_[static_cast<size_t>(li) * layout_.experts + e];
      PlanReads(&job);
      shards.insert(job.loc->shard);
      if (job.loc->pieces >= 0) {
        for (int k = 0; k < tensors_; ++k) shards.insert(pieces_[job.loc->pieces + k].shard);
      }
      jobs.push_back(std::move(job));
    }
  }
  // A shard changed under us fails the request before anything is read or computed.
  for (int s : shards) COLI_RETURN_IF_ERROR(CheckShard(s));
  std::sort(jobs.begin(), jobs.end(), [](const Job& a, const Job& b) {
    return std::tie(a.loc->shard, a.loc->offset) < std::tie(b.loc->shard, b.loc->offset);
  });
  if (!options_.direct) {
    for (const Job& job : jobs) {
      if (job.loc->pieces < 0) {
        ::posix_fadvise(shards_.at(job.loc->shard).file->fd(), static_cast<off_t>(job.loc->offset),
                        static_cast<off_t>(job.loc->nbytes), POSIX_FADV_WILLNEED);
      } else {
        for (int k = 0; k < tensors_; ++k) {
          const Piece& p = pieces_[job.loc->pieces + k];
          ::posix_fadvise(shards_.at(p.shard).file->fd(), static_cast<off_t>(p.offset),
                          static_cast<off_t>(p.nbytes), POSIX_FADV_WILLNEED);
        }
      }
    }
  }

  double compute = 0;
  auto apply = [&](int32_t e, const uint8_t* data, bool hit) -> absl::Status {
    const ExpertWeights weights = Views(data);
    for (int i : wanted[e]) {
      const Clock::time_point t = Clock::now();
      absl::Status s = fn(i, weights);
      const Clock::time_point t1 = Clock::now();
      compute += std::chrono::duration<double>(t1 - t).count();
      Trace(ExpertTraceEvent::Kind::kCompute, li, e, i, hit, t, t1);
      COLI_RETURN_IF_ERROR(s);
    }
    return absl::OkStatus();
  };
  absl::Status status = RunLoads(
      jobs, options_.pipe,
      [&]() -> absl::Status {
        // The caller's independent work first (it hides the first reads), then the hits.
        if (meanwhile != nullptr && *meanwhile) {
          const Clock::time_point t = Clock::now();
          absl::Status s = (*meanwhile)();
          const Clock::time_point t1 = Clock::now();
          compute += std::chrono::duration<double>(t1 - t).count();
          Trace(ExpertTraceEvent::Kind::kMeanwhile, li, -1, 0, false, t, t1);
          COLI_RETURN_IF_ERROR(s);
        }
        for (const auto& [slot, e] : hits) COLI_RETURN_IF_ERROR(apply(e, slot->data, true));
        return absl::OkStatus();
      },
      [&](Job& job) -> absl::Status {
        COLI_RETURN_IF_ERROR(apply(job.expert, job.slot.data, false));
        InsertIntoCache(li, job.expert, &job.slot);
        return absl::OkStatus();
      });

  Trace(ExpertTraceEvent::Kind::kCall, li, -1, static_cast<int>(jobs.size()), false, start,
        Clock::now());
  std::lock_guard<std::mutex> lock(mu_);
  for (ExpertStoreStats* s : {&token_stats_, &total_stats_}) {
    s->calls += 1;
    s->selections += experts.size();
    s->hits += hits.size();
    s->misses += jobs.size();
    s->compute_seconds += compute;
    s->wall_seconds += SecondsSince(start);
  }
  return status;
}

// ---------------------------------------------------------------------------------------------
// Public wrappers

StreamingExpertStore::StreamingExpertStore(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
StreamingExpertStore::~StreamingExpertStore() = default;

absl::StatusOr<std::unique_ptr<StreamingExpertStore>> StreamingExpertStore::Open(
    st::Snapshot* snapshot, const ExpertStoreLayout& layout, const ExpertStoreOptions& options) {
  auto impl = std::make_unique<Impl>(snapshot, layout, options);
  COLI_RETURN_IF_ERROR(impl->Init());
  return std::unique_ptr<StreamingExpertStore>(new StreamingExpertStore(std::move(impl)));
}

absl::Status StreamingExpertStore::ForEachExpert(
    int layer, std::span<const int32_t> experts,
    const std::function<absl::Status(int i, const ExpertWeights&)>& fn) {
  return impl_->ForEachExpert(layer, experts, nullptr, fn);
}

absl::Status StreamingExpertStore::ForEachExpertOverlapped(
    int layer, std::span<const int32_t> experts, const std::function<absl::Status()>& meanwhile,
    const std::function<absl::Status(int i, const ExpertWeights&)>& fn) {
  return impl_->ForEachExpert(layer, experts, &meanwhile, fn);
}

void StreamingExpertStore::StartTrace() { impl_->StartTrace(); }
std::vector<ExpertTraceEvent> StreamingExpertStore::TakeTrace() { return impl_->TakeTrace(); }
void StreamingExpertStore::StopTrace() { impl_->StopTrace(); }

ExpertStoreStats StreamingExpertStore::TakeStats() { return impl_->TakeStats(); }
ExpertStoreStats StreamingExpertStore::TotalStats() const { return impl_->TotalStats(); }
const ExpertMemoryPlan& StreamingExpertStore::plan() const { return impl_->plan_; }
const ExpertStoreLayout& StreamingExpertStore::layout() const { return impl_->layout(); }
std::vector<int32_t> StreamingExpertStore::CachedExperts(int layer) const {
  return impl_->CachedExperts(layer);
}
std::vector<int32_t> StreamingExpertStore::PinnedExperts(int layer) const {
  return impl_->PinnedExperts(layer);
}
absl::StatusOr<StreamingExpertStore::Extent> StreamingExpertStore::ExpertExtent(int layer,
                                                                                int expert) const {
  return impl_->ExpertExtent(layer, expert);
}
int64_t StreamingExpertStore::contiguous_experts() const { return impl_->contiguous_; }
bool StreamingExpertStore::all_direct() const { return impl_->all_direct_; }
absl::Status StreamingExpertStore::SaveUsage() { return impl_->SaveUsage(); }
void StreamingExpertStore::RecordUsage(int layer, std::span<const int32_t> experts) {
  impl_->RecordUsage(layer, experts);
}
const UsageHistory& StreamingExpertStore::usage() const { return impl_->usage(); }

}  // namespace coli::k3
