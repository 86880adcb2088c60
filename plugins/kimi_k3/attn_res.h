// plugins/kimi_k3/attn_res: AttnRes, the softmax mix that replaces K3's residual stream.
//
// Spec §3.2. Candidates v_0…v_{n−1} = the block snapshots (append order) and v_n = the running
// in-block sum p. With the precomputed score vector s = norm_w ⊙ proj_w[0, :] (width D):
//   score_j = (Σ_d v_j[d]·s[d]) / sqrt(mean_d v_j[d]² + ε)        (ε = rms_norm_eps)
//   π = softmax_j(score_j);   MIX = Σ_j π_j · v_j                 (the raw candidates)
// The dot and the mean square are accumulated in double, the softmax in double, the mixture
// in f32 with j in order. Rows are independent (the mix is per token).
// Where it is used (spec §3.1): before attention, before the FFN and once after the last
// layer; the layer's own "hidden state" is the in-block running sum p.
#ifndef COLI_PLUGINS_KIMI_K3_ATTN_RES_H_
#define COLI_PLUGINS_KIMI_K3_ATTN_RES_H_

#include <cstdint>
#include <span>

namespace coli::k3 {

// blocks[j] and prefix are [n, D] row-major; out [n, D] (may not alias any input).
void AttnResMix(std::span<const float* const> blocks, const float* prefix, int n, int64_t D,
                const float* score, float eps, float* out);

}  // namespace coli::k3

#endif  // COLI_PLUGINS_KIMI_K3_ATTN_RES_H_
