#include "plugins/kimi_k3/vk_tier.h"

#include <algorithm>
#include <cstring>
#include <numeric>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/io/io.h"
#include "common/log/log.h"
#include "common/status/status.h"
#include "plugins/kimi_k3/expert_store.h"
#include "plugins/kimi_k3/expert_store_usage.h"

namespace coli::k3 {

// ---- switches ------------------------------------------------------------------------------

VkTierOptions VkTierOptionsFrom(const ModelOptions& options, const std::string& model_dir) {
  VkTierOptions o;
  o.budget_gb = options.vk_tier_gb;
  o.rate = options.vk_tier_rate;
  o.usage_path = DefaultUsagePath(model_dir);
  o.tier = options.vk_tier;
  o.dense = options.vk_dense;
  o.device = options.vk_device;
  o.staging = options.vk_staging;
  return o;
}

VkSwitches VkSwitches::FromEnv(const std::function<const char*(const char*)>& getenv) {
  auto get = [&](const char* name) {
    const char* v = getenv(name);
    return std::string(v != nullptr ? v : "");
  };
  VkSwitches s;
  s.coli_vulkan = get("COLI_VULKAN");
  s.k3_vk = get("K3_VK");
  s.tier_gb = get("COLI_VK_TIER_GB");
  s.k3_vk_gb = get("K3_VK_GB");
  s.tier_rate = get("COLI_VK_TIER_RATE");
  s.k3_vk_up = get("K3_VK_UP");
  s.vk_dense = get("COLI_VK_DENSE");
  s.vk_tier = get("COLI_VK_TIER");
  s.vk_device = get("COLI_VK_DEVICE");
  s.vk_staging = get("COLI_VK_STAGING");
  return s;
}

absl::Status VkSwitches::Resolve(ModelOptions* options) const {
  auto flag = [](const char* name, const std::string& v, bool* out) -> absl::Status {
    if (v == "1") *out = true;
    else if (v == "0") *out = false;
    else return absl::InvalidArgumentError(absl::StrCat(name, "='", v, "': expected 0 or 1"));
    return absl::OkStatus();
  };
  if (!coli_vulkan.empty()) {
    COLI_RETURN_IF_ERROR(flag("COLI_VULKAN", coli_vulkan, &options->vulkan));
  } else if (!k3_vk.empty()) {
    COLI_RETURN_IF_ERROR(flag("K3_VK", k3_vk, &options->vulkan));
  }
  const char* gb_name = !tier_gb.empty() ? "COLI_VK_TIER_GB" : "K3_VK_GB";
  const std::string& gb = !tier_gb.empty() ? tier_gb : k3_vk_gb;
  if (!gb.empty()) {
    double v = 0;
    if (!absl::SimpleAtod(gb, &v) || !(v >= 0) || v > 1e6) {
      return absl::InvalidArgumentError(
          absl::StrCat(gb_name, "='", gb, "': expected a budget in GB, 0 or more"));
    }
    options->vk_tier_gb = v;
  }
  std::string rate_name = "COLI_VK_TIER_RATE";
  std::string rate = tier_rate;
  if (rate.empty() && !k3_vk_up.empty() && k3_vk_up != "auto") {
    rate_name = "K3_VK_UP";
    rate = k3_vk_up;
  }
  if (!rate.empty()) {
    int v = 0;
    if (!absl::SimpleAtoi(rate, &v) || v < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          rate_name, "='", rate, "': expected promotions per token, 0 or more"));
    }
    options->vk_tier_rate = v;
  }
  if (!vk_dense.empty()) {
    if (vk_dense == "auto") options->vk_dense = kVkDenseAuto;
    else if (vk_dense == "1") options->vk_dense = kVkDenseDevice;
    else if (vk_dense == "0") options->vk_dense = kVkDenseCpu;
    else
      return absl::InvalidArgumentError(
          absl::StrCat("COLI_VK_DENSE='", vk_dense, "': expected auto, 1 or 0"));
  }
  if (!vk_tier.empty()) COLI_RETURN_IF_ERROR(flag("COLI_VK_TIER", vk_tier, &options->vk_tier));
  if (!vk_device.empty()) {
    int v = -1;
    if (!absl::SimpleAtoi(vk_device, &v) || v < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "COLI_VK_DEVICE='", vk_device, "': expected a Vulkan device index, 0 or more"));
    }
    options->vk_device = v;
  }
  if (!vk_staging.empty()) {
    bool staging = false;
    COLI_RETURN_IF_ERROR(flag("COLI_VK_STAGING", vk_staging, &staging));
    options->vk_staging = staging ? 1 : 0;
  }
  return absl::OkStatus();
}

std::string VkTierStats::Describe() const {
  return absl::StrFormat(
      "%d/%d experts resident (%.1f MB%s), %d hits, %d promotions, %d evictions, %d warm%s%s%s",
      resident, slots, bytes / 1e6, staging ? " device-local, staged" : "", hits, promotions,
      evictions, warm,
      promotions_stopped
          ? absl::StrFormat(", promotions stopped after %d failed upload(s)", upload_failures)
          : "",
      failures > 0 ? ", DISABLED after a device failure" : "",
      tier ? "" : " (COLI_VK_TIER=0: routed experts on the CPU)");
}

std::string VkTierStats::DescribeDense() const {
  if (!dense_on) return "shared experts on the CPU";
  return absl::StrFormat(
      "shared experts on the device: %d matrices (%.1f MB), %d calls%s%s", dense.matrices,
      dense.bytes / 1e6, dense.calls,
      dense.uploads_stopped ? ", uploads stopped (device memory full)" : "",
      dense.disabled ? ", stopped after a device failure" : "");
}

// ---- the tier ------------------------------------------------------------------------------

struct VkExpertTier::Resident {
  int index = 0;
  std::unique_ptr<vulkan::DeviceMxfp4Matrix> w1, w2, w3;
};

// An accepted promotion: the expert's bytes copied out of the CPU's view (valid only during
// the Offer call), laid out as ExpertViews expects.
struct VkExpertTier::Upload {
  int index = 0;
  std::vector<uint8_t> bytes;
  std::array<size_t, 6> offsets{};
};

VkExpertTier::~VkExpertTier() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (uploader_.joinable()) uploader_.join();
  // Device matrices go before the context that owns their memory.
  claimed_.clear();
  resident_.clear();
}

int VkExpertTier::Index(int layer, int32_t expert) const {
  auto it = layer_index_.find(layer);
  if (it == layer_index_.end() || expert < 0 || expert >= experts_) return -1;
  return it->second * experts_ + expert;
}

absl::StatusOr<std::shared_ptr<VkExpertTier::Resident>> VkExpertTier::UploadViews(
    int index, const ExpertWeights& w) {
  auto r = std::make_shared<Resident>();
  r->index = index;
  // The three matrices as one batch: one staged submission and fence per expert.
  const kernels::MatrixView views[] = {w.w1, w.w2, w.w3};
  COLI_ASSIGN_OR_RETURN(std::vector<std::unique_ptr<vulkan::DeviceMxfp4Matrix>> m,
                        vk_->UploadMxfp4Batch(views));
  r->w1 = std::move(m[0]);
  r->w2 = std::move(m[1]);
  r->w3 = std::move(m[2]);
  return r;
}

void VkExpertTier::UploadFailedLocked(int index, const absl::Status& status) {
  stats_.upload_failures += 1;
  const int layer = moe_layers_[index / experts_];
  const int expert = index % experts_;
  if (status.code() == absl::StatusCode::kResourceExhausted) {
    if (!promotions_stopped_) {
      COLI_LOG(kWarning) << "Vulkan tier: device memory full on " << vk_->device_name()
                         << " with " << resident_.size() << " experts resident ("
                         << vk_->resident_bytes() << " B); no more promotions, the other "
                         << "experts stay on the CPU (upload of expert " << expert << " of layer "
                         << layer << ": " << status << ")";
    }
    promotions_stopped_ = true;
    return;
  }
  COLI_LOG(kWarning) << "Vulkan tier: upload of expert " << expert << " of layer " << layer
                     << " failed: " << status;
}

// The format of the first MoE layer's experts (kMxfp4 when the stack has none).
static absl::StatusOr<ExpertFormat> FirstExpertFormat(st::Snapshot& snapshot, const Config& cfg,
                                                      const std::string& prefix, int num_layers) {
  for (int i = 0; i < num_layers; ++i)
    if (!cfg.is_dense(i)) return DetectExpertFormat(snapshot, prefix, i);
  return ExpertFormat::kMxfp4;
}

absl::StatusOr<std::unique_ptr<VkExpertTier>> VkExpertTier::Create(
    std::unique_ptr<vulkan::VulkanContext> vk, std::unique_ptr<ExpertSource> inner,
    st::Snapshot& snapshot, const Config& cfg, const std::string& prefix, int num_layers,
    const VkTierOptions& options) {
  if (vk == nullptr || inner == nullptr)
    return absl::InvalidArgumentError("Vulkan tier: no device context or no expert source");
  if (!(options.budget_gb >= 0))
    return absl::InvalidArgumentError(
        absl::StrCat("COLI_VK_TIER_GB=", options.budget_gb, ": expected 0 or more"));
  if (options.rate < 0)
    return absl::InvalidArgumentError(
        absl::StrCat("COLI_VK_TIER_RATE=", options.rate, ": expected 0 or more"));
  COLI_ASSIGN_OR_RETURN(const ExpertFormat format,
                        FirstExpertFormat(snapshot, cfg, prefix, num_layers));
  if (format != ExpertFormat::kMxfp4) {
    return absl::FailedPreconditionError(absl::StrCat(
        "Vulkan tier: the routed experts are ", ExpertFormatName(format),
        " (an unquantized checkpoint, spec §9.8); the tier computes MXFP4 experts only"));
  }
  COLI_ASSIGN_OR_RETURN(const bool dense_on, VkDenseOnDevice(options.dense, vk->discrete_gpu()));
  auto tier = std::unique_ptr<VkExpertTier>(new VkExpertTier());
  tier->vk_ = std::move(vk);
  tier->inner_ = std::move(inner);
  tier->store_ = dynamic_cast<StreamingExpertStore*>(tier->inner_.get());
  tier->cfg_ = cfg;
  tier->experts_ = cfg.moe.num_experts;
  tier->rate_ = options.rate;
  tier->tier_ = options.tier;
  if (dense_on) {
    tier->dense_ = std::make_unique<VkDenseExperts>(tier->vk_.get(), cfg.situ_beta,
                                                    cfg.situ_linear_beta);
  }
  for (int i = 0; i < num_layers; ++i) {
    if (cfg.is_dense(i)) continue;
    tier->layer_index_[i] = static_cast<int>(tier->moe_layers_.size());
    tier->moe_layers_.push_back(i);
  }
  const uint64_t I = static_cast<uint64_t>(cfg.moe.intermediate);
  const uint64_t H = static_cast<uint64_t>(cfg.moe.latent);
  // What the device allocates per expert (alignment included): gate and up [I, H], down [H, I].
  if (I > 0 && H > 0) {
    COLI_ASSIGN_OR_RETURN(const uint64_t gate_up, tier->vk_->Mxfp4DeviceBytes(cfg.moe.intermediate,
                                                                              cfg.moe.latent));
    COLI_ASSIGN_OR_RETURN(const uint64_t down, tier->vk_->Mxfp4DeviceBytes(cfg.moe.latent,
                                                                           cfg.moe.intermediate));
    tier->expert_bytes_ = 2 * gate_up + down;
  }
  const uint64_t total = static_cast<uint64_t>(tier->moe_layers_.size()) * tier->experts_;
  tier->slots_ = tier->expert_bytes_ == 0 || !options.tier
                     ? 0
                     : std::min<uint64_t>(total, static_cast<uint64_t>(options.budget_gb * 1e9) /
                                                     tier->expert_bytes_);
  tier->stats_.slots = tier->slots_;
  tier->heat_.assign(total, 0);

  // Warm start from the history: the hottest experts over all layers, read and uploaded now.
  if (!options.usage_path.empty() && !tier->moe_layers_.empty()) {
    absl::StatusOr<UsageHistory> history =
        UsageHistory::Load(options.usage_path, tier->moe_layers_, tier->experts_);
    if (!history.ok()) {
      COLI_LOG(kWarning) << "Vulkan tier: expert history not used: " << history.status();
    } else {
      for (size_t l = 0; l < tier->moe_layers_.size(); ++l)
        for (int e = 0; e < tier->experts_; ++e)
          tier->heat_[l * tier->experts_ + e] = history->count(static_cast<int>(l), e);
    }
  }
  std::vector<int> order(total);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int a, int b) { return tier->heat_[a] > tier->heat_[b]; });
  std::vector<int> warm;
  for (uint64_t k = 0; k < tier->slots_ && k < order.size() && tier->heat_[order[k]] > 0; ++k)
    warm.push_back(order[k]);
  // Read in batches (kWarmBatch experts' six tensors as one parallel io::ReadBatch), then upload
  // each: RAM holds at most one batch of expert bytes on top of the device copies.
  constexpr size_t kWarmBatch = 32;
  constexpr int kWarmReadThreads = 4;
  for (size_t first = 0; first < warm.size(); first += kWarmBatch) {
    const size_t n = std::min(kWarmBatch, warm.size() - first);
    std::vector<std::vector<uint8_t>> bytes(n);
    std::vector<std::array<const uint8_t*, 6>> parts(n);
    std::vector<std::array<std::string, 6>> names(n);
    std::vector<std::array<const st::TensorInfo*, 6>> tensor_infos(n);
    std::vector<io::ReadRequest> requests;
    for (size_t j = 0; j < n; ++j) {
      const int index = warm[first + j];
      const int layer = tier->moe_layers_[index / tier->experts_];
      names[j] = ExpertTensorNames(prefix, layer, index % tier->experts_);
      std::array<const st::TensorInfo*, 6> infos{};
      uint64_t total_bytes = 0;
      for (int t = 0; t < 6; ++t) {
        COLI_ASSIGN_OR_RETURN(infos[t], snapshot.Get(names[j][t]));
        total_bytes += infos[t]->nbytes;
      }
      bytes[j].resize(total_bytes);
      uint64_t offset = 0;
      for (int t = 0; t < 6; ++t) {
        COLI_ASSIGN_OR_RETURN(const io::File* file, snapshot.ShardFile(infos[t]->shard));
        parts[j][t] = bytes[j].data() + offset;
        requests.push_back({file, infos[t]->file_offset, infos[t]->nbytes, bytes[j].data() + offset});
        offset += infos[t]->nbytes;
      }
      tensor_infos[j] = infos;
    }
    COLI_RETURN_IF_ERROR(
        Annotate(io::ReadBatch(requests, kWarmReadThreads), "Vulkan tier warm start"));
    for (size_t j = 0; j < n; ++j) {
      // Against the stored CRC-32s (K3_VERIFY; a no-op without them): never upload damage.
      for (int t = 0; t < 6; ++t) {
        const st::TensorInfo& info = *tensor_infos[j][t];
        COLI_RETURN_IF_ERROR(
            Annotate(st::CheckTensorBytes(info, snapshot.ShardPath(info.shard), parts[j][t]),
                     "Vulkan tier warm start"));
      }
      // The expert's six tensors as the checkpoint stores them (no conversion).
      const ExpertWeights w = ExpertViews(cfg, parts[j]);
      for (const kernels::MatrixView* m : {&w.w1, &w.w2, &w.w3})
        COLI_RETURN_IF_ERROR(Annotate(kernels::ValidateView(*m), names[j][0]));
      absl::StatusOr<std::shared_ptr<Resident>> r = tier->UploadViews(warm[first + j], w);
      if (!r.ok() && r.status().code() == absl::StatusCode::kResourceExhausted) {
        // The device is full before the budget: keep what fits, start without the rest.
        std::lock_guard<std::mutex> lock(tier->mu_);
        tier->UploadFailedLocked(warm[first + j], r.status());
        break;
      }
      COLI_RETURN_IF_ERROR(r.status());
      tier->resident_[warm[first + j]] = std::move(r).value();
      tier->stats_.warm += 1;
    }
    if (tier->promotions_stopped_) break;
  }
  tier->uploader_ = std::thread([t = tier.get()] { t->UploadLoop(); });
  COLI_LOG(kInfo) << "Vulkan tier on " << tier->vk_->device_name() << ": " << tier->slots_
                  << " expert slots of " << tier->expert_bytes_ << " B "
                  << (tier->vk_->staging() ? "device-local, staged" : "host-visible") << " ("
                  << options.budget_gb
                  << " GB), " << tier->stats_.warm << " warm from the history, rate "
                  << tier->rate_ << " per pass" << (options.tier ? "" : " (COLI_VK_TIER=0)")
                  << "; shared experts on the "
                  << (dense_on ? "device" : "CPU") << " (COLI_VK_DENSE="
                  << (options.dense == kVkDenseAuto ? "auto" : options.dense == 1 ? "1" : "0")
                  << (tier->vk_->discrete_gpu() ? ", discrete GPU)" : ")");
  return tier;
}

absl::Status VkExpertTier::ForEachExpert(
    int layer, std::span<const int32_t> experts,
    const std::function<absl::Status(int i, const ExpertWeights&)>& fn) {
  return inner_->ForEachExpert(layer, experts, fn);
}

absl::Status VkExpertTier::ForEachExpertOverlapped(
    int layer, std::span<const int32_t> experts, const std::function<absl::Status()>& meanwhile,
    const std::function<absl::Status(int i, const ExpertWeights&)>& fn) {
  return inner_->ForEachExpertOverlapped(layer, experts, meanwhile, fn);
}

std::vector<int> VkExpertTier::Claim(int layer, std::span<const int32_t> experts) {
  std::vector<int32_t> taken;
  std::vector<int> entries = ClaimLocked(layer, experts, &taken);
  // The wrapped store never sees these experts: count them in its usage history itself.
  if (store_ != nullptr && !taken.empty()) store_->RecordUsage(layer, taken);
  return entries;
}

std::vector<int> VkExpertTier::ClaimLocked(int layer, std::span<const int32_t> experts,
                                           std::vector<int32_t>* taken) {
  std::lock_guard<std::mutex> lock(mu_);
  if (layer <= last_layer_) started_this_pass_ = 0;  // a new forward pass
  last_layer_ = layer;
  claimed_.clear();
  claimed_entries_.clear();
  std::vector<int> entries;
  if (failed_) return entries;
  for (size_t i = 0; i < experts.size(); ++i) {
    const int index = Index(layer, experts[i]);
    if (index < 0) continue;
    heat_[index] += 1;
    auto it = resident_.find(index);
    if (it == resident_.end()) continue;
    entries.push_back(static_cast<int>(i));
    claimed_.push_back(it->second);
    claimed_entries_.push_back(static_cast<int>(i));
    taken->push_back(experts[i]);
  }
  return entries;
}

absl::Status VkExpertTier::Compute(std::span<const DeviceExpertJob> jobs, bool idot) {
  std::vector<std::shared_ptr<Resident>> refs;
  std::vector<int> entries;
  {
    std::lock_guard<std::mutex> lock(mu_);
    refs = claimed_;
    entries = claimed_entries_;
  }
  std::vector<vulkan::ExpertChainJob> chain;
  chain.reserve(jobs.size());
  for (const DeviceExpertJob& job : jobs) {
    const auto it = std::find(entries.begin(), entries.end(), job.entry);
    if (it == entries.end()) {
      return absl::InternalError(
          absl::StrCat("Vulkan tier: entry ", job.entry, " was not claimed by the last Claim"));
    }
    const Resident& r = *refs[it - entries.begin()];
    chain.push_back({r.w1.get(), r.w3.get(), r.w2.get(), job.x, job.rows, job.y});
  }
  absl::Status status = Annotate(
      vk_->ExpertChain(chain, cfg_.situ_beta, cfg_.situ_linear_beta,
                       idot ? vulkan::MatmulNumerics::kIdot : vulkan::MatmulNumerics::kFloat),
      "Vulkan expert tier");
  std::lock_guard<std::mutex> lock(mu_);
  if (!status.ok()) {
    // A failed submission (device lost, out of memory, …): the tier stops claiming and
    // promoting, so every later step runs on the CPU; this step's experts fall back there too
    // (LatentMoeForward).
    if (!failed_) {
      COLI_LOG(kError) << "Vulkan tier disabled, routed experts stay on the CPU: " << status;
    }
    failed_ = true;
    stats_.failures += 1;
    resident_.clear();
    return status;
  }
  stats_.hits += jobs.size();
  return absl::OkStatus();
}

void VkExpertTier::Offer(int layer, int32_t expert, const ExpertWeights& w) {
  const int index = Index(layer, expert);
  if (index < 0) return;
  std::unique_ptr<Upload> up;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (failed_ || promotions_stopped_ || slots_ == 0 || started_this_pass_ >= rate_) return;
    if (resident_.count(index) || pending_.count(index)) return;
    if (resident_.size() + pending_.size() >= slots_) {
      // The coldest resident (lowest heat; ties → the highest index, the least preferred at
      // warm start) goes if the candidate is strictly hotter.
      auto coldest = resident_.end();
      for (auto it = resident_.begin(); it != resident_.end(); ++it) {
        if (coldest == resident_.end() || heat_[it->first] <= heat_[coldest->first]) coldest = it;
      }
      if (coldest == resident_.end() || heat_[coldest->first] >= heat_[index]) return;
      resident_.erase(coldest);
      stats_.evictions += 1;
    }
    pending_[index] = 1;
    started_this_pass_ += 1;
  }
  // Copy the bytes now: the view is valid only for this call.
  up = std::make_unique<Upload>();
  up->index = index;
  const kernels::MatrixView* views[3] = {&w.w1, &w.w2, &w.w3};
  size_t total = 0;
  std::array<size_t, 6> sizes{};
  for (int m = 0; m < 3; ++m) {
    const kernels::MatrixBytes b = kernels::FormatBytes(views[m]->format, views[m]->rows,
                                                        views[m]->cols);
    sizes[2 * m] = b.data;
    sizes[2 * m + 1] = b.scales;
    total += b.data + b.scales;
  }
  up->bytes.resize(total);
  size_t offset = 0;
  for (int m = 0; m < 3; ++m) {
    up->offsets[2 * m] = offset;
    std::memcpy(up->bytes.data() + offset, views[m]->data, sizes[2 * m]);
    offset += sizes[2 * m];
    up->offsets[2 * m + 1] = offset;
    std::memcpy(up->bytes.data() + offset, views[m]->scales, sizes[2 * m + 1]);
    offset += sizes[2 * m + 1];
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(std::move(up));
  }
  cv_.notify_all();
}

void VkExpertTier::UploadLoop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stop_ with nothing left
    std::unique_ptr<Upload> up = std::move(queue_.front());
    queue_.pop_front();
    if (promotions_stopped_ || failed_) {
      // Accepted before the device ran out (or failed): dropped, the expert stays on the CPU.
      pending_.erase(up->index);
      cv_.notify_all();
      continue;
    }
    lock.unlock();
    std::array<const uint8_t*, 6> parts{};
    for (int t = 0; t < 6; ++t) parts[t] = up->bytes.data() + up->offsets[t];
    absl::StatusOr<std::shared_ptr<Resident>> r = UploadViews(up->index, ExpertViews(cfg_, parts));
    lock.lock();
    pending_.erase(up->index);
    if (r.ok() && !failed_) {
      resident_[up->index] = std::move(r).value();
      stats_.promotions += 1;
    } else if (!r.ok()) {
      UploadFailedLocked(up->index, r.status());
    }
    cv_.notify_all();
  }
}

void VkExpertTier::WaitForUploads() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return queue_.empty() && pending_.empty(); });
}

bool VkExpertTier::TakesShared(int layer, int n) {
  return dense_ != nullptr && dense_->Takes(layer, n);
}

absl::Status VkExpertTier::ComputeShared(int layer, const kernels::MatrixView& gate,
                                         const kernels::MatrixView& up,
                                         const kernels::MatrixView& down, const float* x, int n,
                                         bool idot, float* y) {
  if (dense_ == nullptr) {
    return absl::FailedPreconditionError("Vulkan tier: the shared experts are on the CPU");
  }
  return dense_->Compute(layer, gate, up, down, x, n, idot, y);
}

void VkExpertTier::PrefetchShared(int layer, const kernels::MatrixView& gate,
                                  const kernels::MatrixView& up, const kernels::MatrixView& down) {
  if (dense_ != nullptr) dense_->Prefetch(layer, gate, up, down);
}

VkTierStats VkExpertTier::Stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  VkTierStats s = stats_;
  s.tier = tier_;
  s.dense_on = dense_ != nullptr;
  if (dense_ != nullptr) s.dense = dense_->Stats();
  s.matmuls = vk_->matmuls();
  s.resident = resident_.size();
  // What the residents hold on the device (allocation sizes), not a formula.
  s.bytes = 0;
  for (const auto& [index, r] : resident_)
    s.bytes += r->w1->device_bytes() + r->w2->device_bytes() + r->w3->device_bytes();
  s.promotions_stopped = promotions_stopped_;
  s.staging = vk_->staging();
  return s;
}

std::vector<int32_t> VkExpertTier::ResidentExperts(int layer) const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<int32_t> out;
  auto it = layer_index_.find(layer);
  if (it == layer_index_.end()) return out;
  for (const auto& [index, r] : resident_)
    if (index / experts_ == it->second) out.push_back(index % experts_);
  return out;
}

Model::ExpertSourceFactory VkTierFactory(VkTierOptions options, Model::ExpertSourceFactory inner,
                                         VkExpertTier** tier_out) {
  return [options, inner, tier_out](st::Snapshot& snapshot, const Config& cfg,
                                    const std::string& prefix,
                                    int num_layers) -> absl::StatusOr<std::unique_ptr<ExpertSource>> {
    std::unique_ptr<ExpertSource> source;
    if (inner) {
      COLI_ASSIGN_OR_RETURN(source, inner(snapshot, cfg, prefix, num_layers));
    } else {
      COLI_ASSIGN_OR_RETURN(source, PreadExpertSource::Create(snapshot, cfg, prefix, num_layers));
    }
    // The device computes MXFP4 experts only. A full-precision snapshot (F32 experts, spec
    // §9.8) keeps the tier off, with a warning, and runs on the CPU: never re-encoded, never
    // garbage.
    COLI_ASSIGN_OR_RETURN(const ExpertFormat format,
                          FirstExpertFormat(snapshot, cfg, prefix, num_layers));
    if (format != ExpertFormat::kMxfp4) {
      COLI_LOG(kWarning) << "Vulkan expert tier off (COLI_VULKAN / K3_VK ignored): the routed "
                            "experts of this checkpoint are "
                         << ExpertFormatName(format)
                         << " and the tier computes MXFP4 experts only; everything runs on the CPU";
      return source;
    }
    // The device the switches name (the client's: they reach a host started elsewhere too); unset,
    // the host process's own environment.
    vulkan::VulkanContextOptions vk_options;
    if (options.device >= 0) vk_options.device_index = options.device;
    if (options.staging >= 0) vk_options.force_staging = options.staging == 1;
    COLI_ASSIGN_OR_RETURN(std::unique_ptr<vulkan::VulkanContext> vk,
                          vulkan::VulkanContext::Create(vk_options));
    COLI_ASSIGN_OR_RETURN(std::unique_ptr<VkExpertTier> tier,
                          VkExpertTier::Create(std::move(vk), std::move(source), snapshot, cfg,
                                               prefix, num_layers, options));
    if (tier_out != nullptr) *tier_out = tier.get();
    return std::unique_ptr<ExpertSource>(std::move(tier));
  };
}

Model::ExpertSourceFactory ExpertSourceFactoryFor(const ModelOptions& options,
                                                  const std::string& model_dir,
                                                  Model::ExpertSourceFactory inner,
                                                  VkExpertTier** tier_out) {
  if (tier_out != nullptr) *tier_out = nullptr;
  if (!options.vulkan) return inner;
  return VkTierFactory(VkTierOptionsFrom(options, model_dir), std::move(inner), tier_out);
}

std::string VkTierReport(const VkTierStats& stats) {
  return absl::StrCat("[VK] kimi_k3: ", stats.matmuls, " matmuls on the GPU\n",
                      "[VK] tier kimi_k3 ", stats.Describe(), "\n", "[VK] dense kimi_k3 ",
                      stats.DescribeDense(), "\n");
}

}  // namespace coli::k3
