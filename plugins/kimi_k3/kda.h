// plugins/kimi_k3/kda: Kimi Delta Attention, the linear-attention layer (69 of K3's 93 layers).
//
// Spec §3.3. Shapes (K3): D = 7168 input, H = 96 heads of d = 128, C = H·d = 12288 channels
// (channel c = h·d + j), conv taps 4, decay rank d.
//   q̃, k̃, ṽ = Wq x, Wk x, Wv x;  graw = Wfb (Wfa x);  blog = Wb x;  gout = Wg x
//   q, k, v  = SiLU(causal depthwise conv4 over the raw projections)        (per channel)
//   q_h = L2N(q_h)·d^-1/2,  k_h = L2N(k_h)        (L2N(x) = x / sqrt(Σx² + 1e-6))
//   α[c] = exp(lb · σ(exp(A_log[h]) · (graw[c] + dt_bias[c])))   lb = gate_lower_bound (−5)
//   β_h = σ(blog[h])
//   S_h ← Diag(α_h) S_h;  e = v_h − S_hᵀ k_h;  S_h ← S_h + β_h k_h eᵀ;  o_h = S_hᵀ q_h
//   o'_h = RMSNorm(o_h; o_norm, rms_norm_eps) ⊙ σ(gout_h);  a = Wo o'
// State per layer and sequence (KdaState): S [H, d, d] (rows = key dim) and the last taps−1
// raw projections of q, k and v (conv windows). Constant in sequence length.
// A batch of rows is processed with every matmul batched; the conv and the recurrence then
// advance row by row in order, so results do not depend on how rows are chunked.
#ifndef COLI_PLUGINS_KIMI_K3_KDA_H_
#define COLI_PLUGINS_KIMI_K3_KDA_H_

#include <span>
#include <vector>

#include "absl/status/status.h"
#include "plugins/kimi_k3/compute.h"
#include "plugins/kimi_k3/config.h"
#include "plugins/kimi_k3/weights.h"

namespace coli::k3 {

struct KdaState {
  std::vector<float> S;                    // [H, d, d]
  std::vector<float> q_win, k_win, v_win;  // [(taps − 1), C], oldest first
  void Reset(const KdaConfig& c);          // zero state (sized for c)
};

// x: [n, D] (the RMS-normalised layer input), out: [n, D]. states[r] is row r's sequence
// state; rows of one sequence must appear in position order.
absl::Status KdaForward(const Config& cfg, const KdaWeights& w, const Compute& c, const float* x,
                        int n, std::span<KdaState* const> states, float* out);

}  // namespace coli::k3

#endif  // COLI_PLUGINS_KIMI_K3_KDA_H_
