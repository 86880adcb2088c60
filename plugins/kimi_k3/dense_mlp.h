// plugins/kimi_k3/dense_mlp: the dense SiTU-GLU MLP of the first layer(s) (K3: layer 0).
//
// Spec §3.5 / §3.0. x = RMSNorm(m; post_attention_layernorm) ∈ R^D (K3: D 7168, inner I 33792):
//   f = Wdown · SiTU(Wgate x, Wup x),  SiTU(g, u) = β1·tanh(g/β1)·σ(g) · β2·tanh(u/β2)
// (β1 = activation_situ_beta = 4, β2 = activation_situ_linear_beta = 25). Stateless; all rows
// batched.
#ifndef COLI_PLUGINS_KIMI_K3_DENSE_MLP_H_
#define COLI_PLUGINS_KIMI_K3_DENSE_MLP_H_

#include "absl/status/status.h"
#include "plugins/kimi_k3/compute.h"
#include "plugins/kimi_k3/config.h"
#include "plugins/kimi_k3/weights.h"

namespace coli::k3 {

// A SiTU-GLU block y = Dn·SiTU(G x, U x) on n rows: x [n, G.cols], y [n, Dn.rows].
absl::Status SituGluBlock(const Config& cfg, const Linear& gate, const Linear& up,
                          const Linear& down, const Compute& c, const float* x, int n, float* y);

// The dense MLP on n rows: x [n, D] → out [n, D].
absl::Status DenseMlpForward(const Config& cfg, const DenseMlpWeights& w, const Compute& c,
                             const float* x, int n, float* out);

}  // namespace coli::k3

#endif  // COLI_PLUGINS_KIMI_K3_DENSE_MLP_H_
