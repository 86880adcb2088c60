// plugins/kimi_k3/vk_dense: Kimi K3's shared experts on the Vulkan device (COLI_VK_DENSE; seed
// "Vulkan": "the shared experts go to the device where COLI_VK_DENSE puts the dense matrices").
//
//   VkDenseExperts dense(&vk, cfg.situ_beta, cfg.situ_linear_beta);   // vk outlives it
//   if (dense.Takes(layer, n))                                          // any n >= 1
//     COLI_RETURN_IF_ERROR(dense.Compute(layer, gate, up, down, x, n, idot, sh));  // else: CPU
//
// Design.
// * What runs there: per MoE layer, sh = Wdown · SiTU(Wgate x, Wup x) (spec §3.6 step 7, the
//   shared SiTU-GLU, S = 2·3072, D = 7168 on K3) by VulkanContext::DenseGlu (Numerics below),
//   for every pass: decode, batched decode, speculative verify chunks and prefill chunks alike.
//   The device's f32 sums (K3_IDOT=0, f32 matrices) differ from the CPU's in their last bits,
//   so a row must be computed on the same side however the passes are cut, or chunking,
//   checkpoints, the prefix cache, speculative decoding and batching would change answers (they
//   did while passes of more than 8 rows stayed on the CPU). KDA, MLA, the latent projections, the router and the head always
//   stay on the CPU.
// * Bytes: the three matrices exactly as the CPU holds them after K3_BITS (int4-g64 biased
//   nibbles + f32 group scales, int8 + f32 row scales, or f32), uploaded once per layer
//   (VulkanContext::UploadDenseBatch: one staged fill on a discrete GPU, host-visible
//   elsewhere) and kept for the model's life: at the layer's first device call (Prefetch, on
//   this object's upload thread, serves passes the device does not take: none while it is on).
//   Device bytes are what the device allocated (Stats().bytes), not counted against
//   COLI_VK_TIER_GB. The views must stay valid while this object lives (the model's weights outlive
//   its expert source, which owns this object).
// * Numerics: the device computes with the call's numerics (Compute's idot, the CPU's K3_IDOT).
//   K3_IDOT=1 (the default): int8 and int4-g64 matrices run the CPU's integer-dot kernels bit
//   for bit (VulkanContext::DenseGlu with MatmulNumerics::kIdot: gate and up, SiTU-GLU on the
//   host, down; two submissions), so the shared experts give the CPU's logits byte for byte.
//   f32 matrices (K3_BITS=32) have no integer path on the CPU either; they, and everything under
//   K3_IDOT=0, use f32 activations: the CPU's exact-float kernels up to summation order (rel-L2
//   ~2e-7 per matrix on lavapipe). A device without shaderInt64 fails its first idot call and
//   the dense path turns off (the CPU's bits from then on).
// * Failures: an upload refused for device memory (RESOURCE_EXHAUSTED) stops uploads (one log
//   line): layers already resident keep running there, the others stay on the CPU. Any other
//   upload error or a failed submission disables the dense path (one log line; the device
//   matrices are freed). Either way Compute returns the error and the caller (LatentMoeForward)
//   computes that call's shared experts on the CPU.
//
// Threading: Takes, Prefetch and Compute are called by the serialised MoE calls (Compute on the
// call's own thread); the uploads of Prefetch run on a thread of this object; Stats and
// WaitForUploads from any thread.
#ifndef COLI_PLUGINS_KIMI_K3_VK_DENSE_H_
#define COLI_PLUGINS_KIMI_K3_VK_DENSE_H_

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/kernels/kernels.h"
#include "common/vk/vulkan_context.h"

namespace coli::k3 {

// COLI_VK_DENSE as ModelOptions::vk_dense holds it.
inline constexpr int kVkDenseAuto = -1;  // the device when it is a discrete GPU, else the CPU
inline constexpr int kVkDenseCpu = 0;
inline constexpr int kVkDenseDevice = 1;

// Where COLI_VK_DENSE (`mode`, one of the constants above) puts the shared experts on a device
// that is (`discrete_gpu`) or is not a discrete GPU. INVALID_ARGUMENT naming COLI_VK_DENSE for
// another value.
absl::StatusOr<bool> VkDenseOnDevice(int mode, bool discrete_gpu);

struct VkDenseStats {
  uint64_t matrices = 0;         // vk_dense_matrices: dense matrices resident on the device
  uint64_t bytes = 0;            // vk_dense_bytes: their device bytes (allocation sizes)
  uint64_t calls = 0;            // vk_dense_calls: shared-expert blocks computed there
  uint64_t failures = 0;         // failed uploads or submissions
  bool uploads_stopped = false;  // the device ran out of memory: no more layers uploaded
  bool disabled = false;         // a failure turned the dense path off
};

class VkDenseExperts {
 public:
  // `vk` is borrowed and must outlive this object; β1, β2 of SiTU (config).
  VkDenseExperts(vulkan::VulkanContext* vk, float beta1, float beta2);
  ~VkDenseExperts();
  VkDenseExperts(const VkDenseExperts&) = delete;
  VkDenseExperts& operator=(const VkDenseExperts&) = delete;

  // True when the shared experts of a pass of n rows of decoder layer `layer` go to the device:
  // n >= 1, not disabled, and the layer resident unless uploads stopped.
  bool Takes(int layer, int n) const;
  // y [n, D] = down · SiTU(gate · x, up · x) on the device, uploading the layer's matrices at
  // its first call (again if the views' data moved; after a pending Prefetch of the layer ends).
  // `idot`: the CPU's numerics of the call (Numerics above). Errors as described above.
  absl::Status Compute(int layer, const kernels::MatrixView& gate, const kernels::MatrixView& up,
                       const kernels::MatrixView& down, const float* x, int n, bool idot, float* y);
  // Queues the upload of a layer not resident yet for the upload thread (started at the first
  // call), so a later device call finds it there. Does nothing when the layer is resident or
  // queued, uploads stopped or the path is off. Failures are handled as in Compute.
  void Prefetch(int layer, const kernels::MatrixView& gate, const kernels::MatrixView& up,
                const kernels::MatrixView& down);
  // Blocks until no Prefetch upload is queued or running.
  void WaitForUploads();

  VkDenseStats Stats() const;

 private:
  struct Layer;
  struct Queued {
    int layer = 0;
    kernels::MatrixView views[3];
  };
  // Uploads `views` (gate, up, down) of `layer` and, with mu_ taken, records the result (errors
  // as described above, logged once). Not with mu_ held.
  absl::StatusOr<Layer*> Upload(int layer, const kernels::MatrixView (&views)[3]);
  // With mu_ held: turns the dense path off after `status` (logged once), freeing the matrices.
  void DisableLocked(const absl::Status& status);
  void UploadLoop();

  vulkan::VulkanContext* vk_;
  float beta1_, beta2_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::map<int, std::unique_ptr<Layer>> layers_;  // decoder layer → resident matrices
  std::set<int> pending_;                         // layers queued or uploading (Prefetch)
  std::deque<Queued> queue_;
  bool stop_ = false;
  VkDenseStats stats_;
  std::thread uploader_;
};

}  // namespace coli::k3

#endif  // COLI_PLUGINS_KIMI_K3_VK_DENSE_H_
