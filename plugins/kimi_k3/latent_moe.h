// plugins/kimi_k3/latent_moe: the LatentMoE FFN (K3 layers 1…92).
//
// Spec §3.6. x = RMSNorm(m; post_attention_layernorm) ∈ R^D. K3: E = 896 experts, top-k 16,
// latent 3584, expert inner 3072, shared inner 2·3072 = 6144.
//   s = σ(Wrouter x)                                        (f32)
//   chosen = top-k of s + bias (bias = e_score_correction_bias, used ONLY to choose); exact
//            ties → the lower expert index (colibri; torch.topk leaves the order unspecified)
//   w_k = s[e_k] / (Σ_k' s[e_k'] + 1e-20) · routed_scaling_factor   (moe_renormalize)
//   z = Wdown_lat x ∈ R^latent;   E_e(z) = W2_e · SiTU(W1_e z, W3_e z)    (in place: MXFP4, or
//            F32 for a full-precision snapshot, spec §9.8; the views carry the format)
//   u = Σ_k w_k E_{e_k}(z)                                  (f32, k in selection order)
//   y = Wup_lat · RMSNorm(u; routed_expert_norm, rms_norm_eps);  sh = shared SiTU-GLU(x)
//   f = y + sh
// Chunked rows: each unique expert of the batch is fetched once (ExpertSource) and applied to
// all rows that chose it; its outputs land in per-(row, k) slots and are summed afterwards in
// the fixed k order, so results are bit-identical whatever order experts arrive in and however
// rows are batched. The routed loads start right after routing (ExpertSource::
// ForEachExpertOverlapped); the latent down-projection and the shared experts are computed while
// the first misses load. Optional K3_TOPP pruning (engine-only, off by default; changes results):
// the k weights sorted descending, the smallest prefix reaching p kept and renormalised.
#ifndef COLI_PLUGINS_KIMI_K3_LATENT_MOE_H_
#define COLI_PLUGINS_KIMI_K3_LATENT_MOE_H_

#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "plugins/kimi_k3/compute.h"
#include "plugins/kimi_k3/config.h"
#include "plugins/kimi_k3/expert_source.h"
#include "plugins/kimi_k3/weights.h"

namespace coli::k3 {

struct Routing {
  std::vector<int32_t> experts;  // chosen experts, best biased score first
  std::vector<float> weights;    // their mixing weights (same order)
};

// Router decision for one row from its router logits [E] (spec §3.6 steps 1–3, + K3_TOPP).
Routing Route(const MoeConfig& moe, std::span<const float> router_logits,
              std::span<const float> correction_bias, double topp);

// A device that computes some routed experts itself (the Vulkan tier, vk_tier.h). When the
// ExpertSource passed to LatentMoeForward also implements this interface (found by
// dynamic_cast, so the model and the ExpertSource seam stay as they are), each call:
//   1. Claim(layer, unique): the entries of the call's unique experts the device computes;
//   2. Compute(jobs) for those, on a thread of LatentMoeForward's, while the CPU computes the
//      others through ForEachExpertOverlapped (claimed experts are never passed to it);
//   3. Offer(layer, e, w) for every expert the CPU computed, from inside the CPU walk.
// Outputs land in the same per-(row, k) slots as the CPU's and are summed in the same order.
struct DeviceExpertJob {
  int entry = 0;         // index into the last Claim's `experts` (one of those it returned)
  const float* x = nullptr;  // [rows, latent] inputs z of the rows that chose the expert
  int64_t rows = 0;
  float* y = nullptr;    // [rows, latent] outputs E_e(z)
};
class DeviceExperts {
 public:
  virtual ~DeviceExperts();
  // Entries i of `experts` (unique ids of MoE layer `layer`) the device will compute; the
  // experts stay usable for the following Compute even if evicted meanwhile.
  virtual std::vector<int> Claim(int layer, std::span<const int32_t> experts) = 0;
  // All jobs as one device submission; blocks until the outputs are in place. `idot`: the
  // numerics of the CPU's matmuls in this call (Compute::matmul.idot, K3_IDOT), which the device
  // must reproduce so that residency never changes the result (with idot: the CPU's bits). On an
  // error the step computes the claimed experts on the CPU (ForEachExpert on this source) and
  // goes on.
  virtual absl::Status Compute(std::span<const DeviceExpertJob> jobs, bool idot) = 0;
  // An expert the CPU just computed (weights valid for the call only): a promotion candidate.
  virtual void Offer(int layer, int32_t expert, const ExpertWeights& weights) = 0;
};

// A device that computes the shared experts of short passes itself (COLI_VK_DENSE: the Vulkan
// tier, vk_tier.h / vk_dense.h). Found like DeviceExperts (dynamic_cast on the ExpertSource).
// When TakesShared(layer, n), LatentMoeForward runs ComputeShared on a thread of its own from
// the start of the call, while this thread does the router, the latent projections and the
// routed experts; its output replaces the CPU's sh and is added at the same place, so the sum
// order is unchanged. On an error the CPU computes sh for that call (SituGluBlock, the CPU's
// bits) and the device stops taking them (its own rule). A call it does not take (a prefill
// chunk) offers the matrices to PrefetchShared, so they can be uploaded before decode.
class DeviceSharedExperts {
 public:
  virtual ~DeviceSharedExperts();
  // True when the shared experts of this call (n rows of decoder layer `layer`) go to the device.
  virtual bool TakesShared(int layer, int n) = 0;
  // y [n, D] = down · SiTU(gate · x, up · x) for x [n, D], the matrices as the CPU holds them
  // (valid for the model's life). `idot`: the numerics of the CPU's matmuls in this call
  // (Compute::matmul.idot, K3_IDOT), which the device reproduces (with idot and int8 / int4
  // matrices: the CPU's bits). Blocks until y is written.
  virtual absl::Status ComputeShared(int layer, const kernels::MatrixView& gate,
                                     const kernels::MatrixView& up, const kernels::MatrixView& down,
                                     const float* x, int n, bool idot, float* y) = 0;
  // The layer's matrices, from a call whose shared experts stay on the CPU; must not block.
  virtual void PrefetchShared(int layer, const kernels::MatrixView& gate,
                              const kernels::MatrixView& up, const kernels::MatrixView& down) = 0;
};

struct MoeStats {
  int64_t rows = 0;            // rows through the MoE
  int64_t expert_calls = 0;    // unique experts computed (summed over calls)
  int64_t expert_rows = 0;     // (row, expert) pairs computed
};

// x: [n, D] → out: [n, D]. `layer` names the MoE layer for the expert source.
absl::Status LatentMoeForward(const Config& cfg, const MoeWeights& w, int layer,
                              ExpertSource& experts, double topp, const Compute& c,
                              const float* x, int n, float* out, MoeStats* stats = nullptr);

}  // namespace coli::k3

#endif  // COLI_PLUGINS_KIMI_K3_LATENT_MOE_H_
