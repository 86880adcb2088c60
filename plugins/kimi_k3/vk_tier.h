// plugins/kimi_k3/vk_tier: the Vulkan expert tier of Kimi K3 (seed "Vulkan (make VK=1
// kimi_k3)"): hot routed experts resident on a Vulkan device, computed there while the CPU
// computes the rest of the MoE step.
//
//   ModelOptions opt;                       // opt.vulkan, vk_tier_gb, vk_tier_rate (the edge)
//   VkExpertTier* tier = nullptr;
//   Model::Load(dir, opt, progress, VkTierFactory(VkTierOptionsFrom(opt, dir), inner, &tier));
//   ... forward passes ...
//   VkTierStats s = tier->Stats();          // vk_matmuls, resident, hits, promotions, …
//
// Design.
// * The tier is an ExpertSource wrapping the CPU's source (the streaming store or plain pread)
//   and implements DeviceExperts (latent_moe.h): each LatentMoE call Claims the resident experts
//   among its unique experts; LatentMoeForward computes those on the device — gate, up,
//   SiTU-GLU, down for all their (row, k) pairs as ONE submission (common/vk ExpertChain) — on a
//   thread of its own while the CPU walks the other experts through the wrapped source. Claimed
//   experts are never passed to the wrapped source, so they are not read from disk. The outputs
//   land in the same per-(row, k) slots as CPU outputs and are summed in the fixed k order, so
//   which experts are resident never changes the order and CPU experts keep their bits.
// * Numerics. The device computes with the CPU's numerics of the call (DeviceExperts::Compute's
//   idot, from the model's K3_IDOT). K3_IDOT=1 (the default): the integer-dot chain
//   (MatmulNumerics::kIdot: gate and up, SiTU-GLU on the host, down; two submissions), equal to
//   the CPU's expert bit for bit, so which experts are resident never changes a logit or a token.
//   K3_IDOT=0: the f32 chain in one submission (the CPU's math up to summation order). A device
//   without shaderInt64 cannot run the first: its first idot step fails and disables the tier
//   (the CPU computes everything, bit for bit).
// * Bytes. Each resident expert is its three MXFP4 matrices as they sit in RAM (e2m1 nibbles;
//   UE8M0 exponents widened to f32 on upload by common/vk; never re-encoded): device bytes per
//   expert = 3·(I·H/2 + I·H/32·4). Slots = floor(budget_gb·1e9 / that).
// * Heat. One count per (MoE layer, expert): the usage history (.coli_usage, expert_store_usage.h)
//   at start-up, then +1 each time a LatentMoE call selects the expert (the history's own unit).
//   Experts the device takes are counted in the wrapped streaming store's history too
//   (StreamingExpertStore::RecordUsage), so the next start-up sees them as hot.
// * Warm start. At Create the slots are filled with the history's hottest experts over all
//   layers (count > 0; ties → lower layer, then lower expert), read from the shards (32 experts
//   per parallel io::ReadBatch) and uploaded before the first step.
// * Promotion. Every expert the CPU computes is Offered; it is promoted when fewer than `rate`
//   promotions were started in this forward pass (one decode token or one prefill chunk; a pass
//   starts when a call's layer is not above the previous call's) and either a slot is free or it
//   is strictly hotter than the coldest resident, which is evicted at once (a step already
//   using it keeps it alive until its submission ends). The accepted expert's bytes are copied
//   and uploaded on the tier's own thread; it serves steps from the moment its upload ends, so a
//   step never waits for an upload.
//
// * Device memory. Resident experts take what the device allocates for them
//   (VulkanContext::Mxfp4DeviceBytes: alignment included), in device-local memory filled through
//   the context's staging buffer on a discrete GPU (or with COLI_VK_STAGING=1). An upload the
//   device refuses for lack of memory (RESOURCE_EXHAUSTED) stops promotions — and the warm
//   start — with one log line; the experts already resident keep serving, the rest stay on the
//   CPU, and Stats counts the failed upload.
// * Failure. A failed submission (device lost, out of memory) disables the tier: nothing is
//   claimed or promoted afterwards, that step's experts are computed on the CPU
//   (LatentMoeForward), and the run goes on with the CPU's results.
//
// * Shared experts (COLI_VK_DENSE, vk_dense.h). The tier also implements DeviceSharedExperts:
//   with COLI_VK_DENSE=1, or auto on a discrete GPU, the shared experts of every pass run on
//   the same device (VkDenseExperts, sharing the context) while the
//   CPU does the routed experts. COLI_VK_TIER=0 leaves the tier with 0 slots (no warm start, no
//   promotions), so the device serves the shared experts alone.
//
// Threading: Claim / Offer / the device chain are called by the serialised MoE calls (Offer
// from the CPU walk while the chain runs on its thread); Stats and WaitForUploads from any thread.
#ifndef COLI_PLUGINS_KIMI_K3_VK_TIER_H_
#define COLI_PLUGINS_KIMI_K3_VK_TIER_H_

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/safetensors/safetensors.h"
#include "common/vk/vulkan_context.h"
#include "plugins/kimi_k3/config.h"
#include "plugins/kimi_k3/expert_source.h"
#include "plugins/kimi_k3/latent_moe.h"
#include "plugins/kimi_k3/model.h"
#include "plugins/kimi_k3/options.h"
#include "plugins/kimi_k3/vk_dense.h"

namespace coli::k3 {

class StreamingExpertStore;  // expert_store.h

struct VkTierOptions {
  double budget_gb = 2;    // COLI_VK_TIER_GB (old K3_VK_GB); 0 = nothing resident
  int rate = 4;            // COLI_VK_TIER_RATE (old numeric K3_VK_UP): promotions per pass
  std::string usage_path;  // the expert history for the warm start ("" = none)
  bool tier = true;        // COLI_VK_TIER: false = no routed experts on the device (0 slots)
  int dense = kVkDenseAuto;  // COLI_VK_DENSE: the shared experts (vk_dense.h)
  // COLI_VK_DEVICE (the device index) and COLI_VK_STAGING (1: residents staged into device-only
  // memory); -1 = unset: VulkanContext reads the host process's environment.
  int device = -1;
  int staging = -1;
};

// The tier's options from the model's typed switches, history at DefaultUsagePath(model_dir).
VkTierOptions VkTierOptionsFrom(const ModelOptions& options, const std::string& model_dir);

// The Vulkan switches as the environment (or the client's extra options) spell them, each
// null/empty when unset. Resolve() applies the seed's rules into `options`: COLI_VULKAN wins over
// K3_VK (1 = open the device, 0 = never), COLI_VK_TIER_GB over K3_VK_GB, COLI_VK_TIER_RATE over a
// numeric K3_VK_UP (K3_VK_UP=auto does nothing; K3_VK_FILL_FRAC is not read at all);
// COLI_VK_DENSE = auto | 1 | 0 (vk_dense.h), COLI_VK_TIER = 1 | 0, COLI_VK_DEVICE = an index
// (0 or more; one past the devices is refused when the device opens), COLI_VK_STAGING = 0 | 1.
// INVALID_ARGUMENT naming the variable for a malformed value.
struct VkSwitches {
  std::string coli_vulkan, k3_vk, tier_gb, k3_vk_gb, tier_rate, k3_vk_up, vk_dense, vk_tier,
      vk_device, vk_staging;
  // From a getenv-like lookup.
  static VkSwitches FromEnv(const std::function<const char*(const char*)>& getenv);
  absl::Status Resolve(ModelOptions* options) const;
};

struct VkTierStats {
  uint64_t matmuls = 0;     // matmul dispatches on the device (3 per expert computed there)
  uint64_t resident = 0;    // experts resident now
  uint64_t bytes = 0;       // their device bytes
  uint64_t hits = 0;        // expert computations served by the device (one per expert per call)
  uint64_t promotions = 0;  // uploads completed after start-up
  uint64_t evictions = 0;   // residents displaced by hotter experts
  uint64_t warm = 0;        // experts uploaded at start-up from the history
  uint64_t slots = 0;       // capacity in experts
  uint64_t failures = 0;    // failed submissions (the first one disables the tier)
  uint64_t upload_failures = 0;     // uploads the device refused (out of memory, …)
  bool promotions_stopped = false;  // device memory ran out: no more uploads
  bool staging = false;             // residents are device-local, uploaded through staging
  bool tier = true;                 // COLI_VK_TIER: the routed-expert tier is on
  // The shared experts (COLI_VK_DENSE, vk_dense.h): dense_on says they go to the device.
  bool dense_on = false;
  VkDenseStats dense;
  std::string Describe() const;       // one line for "[VK] tier kimi_k3 …"
  std::string DescribeDense() const;  // one line for "[VK] dense kimi_k3 …"
};

class VkExpertTier final : public ExpertSource, public DeviceExperts, public DeviceSharedExperts {
 public:
  // Opens the tier over `inner` for the MoE layers below `num_layers`: locates every expert,
  // sizes the slots, uploads the warm set. `snapshot` must outlive the tier. Errors from the
  // device (UNAVAILABLE / INVALID_ARGUMENT from VulkanContext::Create by the caller), reads
  // (naming the tensor) or uploads are returned.
  static absl::StatusOr<std::unique_ptr<VkExpertTier>> Create(
      std::unique_ptr<vulkan::VulkanContext> vk, std::unique_ptr<ExpertSource> inner,
      st::Snapshot& snapshot, const Config& cfg, const std::string& prefix, int num_layers,
      const VkTierOptions& options);
  ~VkExpertTier() override;

  // ExpertSource: everything the device does not take goes to the wrapped source.
  absl::Status ForEachExpert(
      int layer, std::span<const int32_t> experts,
      const std::function<absl::Status(int i, const ExpertWeights&)>& fn) override;
  absl::Status ForEachExpertOverlapped(
      int layer, std::span<const int32_t> experts, const std::function<absl::Status()>& meanwhile,
      const std::function<absl::Status(int i, const ExpertWeights&)>& fn) override;

  // DeviceExperts (latent_moe.h).
  std::vector<int> Claim(int layer, std::span<const int32_t> experts) override;
  // idot (K3_IDOT=1): the device's integer-dot chain, the CPU's bits (VulkanContext::ExpertChain
  // with MatmulNumerics::kIdot); else the f32 chain (the CPU's K3_IDOT=0 math up to summation
  // order).
  absl::Status Compute(std::span<const DeviceExpertJob> jobs, bool idot) override;
  void Offer(int layer, int32_t expert, const ExpertWeights& weights) override;

  // DeviceSharedExperts (latent_moe.h): the shared experts of short passes, when COLI_VK_DENSE
  // put them on this device (VkDenseExperts); never otherwise.
  bool TakesShared(int layer, int n) override;
  absl::Status ComputeShared(int layer, const kernels::MatrixView& gate,
                             const kernels::MatrixView& up, const kernels::MatrixView& down,
                             const float* x, int n, bool idot, float* y) override;
  void PrefetchShared(int layer, const kernels::MatrixView& gate, const kernels::MatrixView& up,
                      const kernels::MatrixView& down) override;
  // The shared experts' device part (null when they stay on the CPU).
  VkDenseExperts* dense() { return dense_.get(); }

  VkTierStats Stats() const;
  // Blocks until every accepted upload has finished (tests; shutdown).
  void WaitForUploads();
  // Resident experts of decoder layer `layer`, ascending.
  std::vector<int32_t> ResidentExperts(int layer) const;
  ExpertSource& inner() { return *inner_; }
  vulkan::VulkanContext& context() { return *vk_; }
  uint64_t expert_device_bytes() const { return expert_bytes_; }

 private:
  struct Resident;
  struct Upload;
  VkExpertTier() = default;
  int Index(int layer, int32_t expert) const;  // -1 when not a MoE layer / expert
  absl::StatusOr<std::shared_ptr<Resident>> UploadViews(int index, const ExpertWeights& w);
  void UploadLoop();
  std::vector<int> ClaimLocked(int layer, std::span<const int32_t> experts,
                               std::vector<int32_t>* taken);

  std::unique_ptr<vulkan::VulkanContext> vk_;
  std::unique_ptr<ExpertSource> inner_;
  StreamingExpertStore* store_ = nullptr;  // inner_ when it is the streaming store
  std::unique_ptr<VkDenseExperts> dense_;  // the shared experts (null: on the CPU); before vk_ dies
  bool tier_ = true;
  Config cfg_;
  std::vector<int> moe_layers_;             // decoder-layer ids, ascending
  std::map<int, int> layer_index_;          // decoder-layer id → position in moe_layers_
  int experts_ = 0;
  uint64_t expert_bytes_ = 0;
  uint64_t slots_ = 0;
  int rate_ = 0;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<uint64_t> heat_;                          // [index]
  std::map<int, std::shared_ptr<Resident>> resident_;  // index → resident expert
  std::map<int, char> pending_;                         // indices being uploaded
  std::deque<std::unique_ptr<Upload>> queue_;
  std::vector<std::shared_ptr<Resident>> claimed_;      // the last Claim's, in its order
  std::vector<int> claimed_entries_;                   // their entries in the Claim
  int last_layer_ = -1;
  int started_this_pass_ = 0;
  bool stop_ = false;
  bool failed_ = false;  // a submission failed: no more claims or promotions
  bool promotions_stopped_ = false;  // an upload ran out of device memory: no more uploads
  // Called with mu_ held after a failed upload of `index`.
  void UploadFailedLocked(int index, const absl::Status& status);
  VkTierStats stats_;
  std::thread uploader_;
};

// A Model::ExpertSourceFactory that makes the CPU's source with `inner` (PreadExpertSource when
// null), opens the Vulkan device (VulkanContext::Create: options.device picks it; UNAVAILABLE
// without one) and wraps the source in a VkExpertTier. `tier_out`, when given, receives the
// tier (owned by the model).
Model::ExpertSourceFactory VkTierFactory(VkTierOptions options, Model::ExpertSourceFactory inner,
                                         VkExpertTier** tier_out = nullptr);

// The factory the edges (k3-run, the plugin) use: `inner` as it is (null = PreadExpertSource)
// unless options.vulkan, then VkTierFactory(VkTierOptionsFrom(options, model_dir), inner). With
// vulkan off the device is never opened (COLI_VK_DEVICE is not even looked at).
Model::ExpertSourceFactory ExpertSourceFactoryFor(const ModelOptions& options,
                                                  const std::string& model_dir,
                                                  Model::ExpertSourceFactory inner,
                                                  VkExpertTier** tier_out);

// The end-of-turn lines (seed): "[VK] kimi_k3: N matmuls on the GPU" (routed and shared experts),
// "[VK] tier kimi_k3 <Describe()>" and "[VK] dense kimi_k3 <DescribeDense()>", each ending in a
// newline.
std::string VkTierReport(const VkTierStats& stats);

}  // namespace coli::k3

#endif  // COLI_PLUGINS_KIMI_K3_VK_TIER_H_
