// plugins/kimi_k3/mla: gated NoPE multi-head latent attention (24 of K3's 93 layers).
//
// Spec §3.4. Shapes (K3): H = 96 heads, q_lora 1536, latent 512, nope 128, extra 64 (the former
// RoPE half, used as plain dims: NOT rotated), v 128.
//   cq = RMSNorm(Wqa x; q_a_layernorm, ε_lat);  Q = Wqb cq → per head [q_nope (nope) | q_x (extra)]
//   kv = Wkva x;  c = RMSNorm(kv[:latent]; kv_a_layernorm, ε_lat);  k_x = kv[latent:]
//   s_{h,t} = (q_nope·K_h c_t + q_x·k_x_t) / sqrt(nope + extra),  p = softmax_t (t ≤ now)
//   ctx_h = Σ_t p_t V_h c_t;  a = Wo (ctx ⊙ σ(Wg x))
// Absorbed evaluation: q_abs = K_hᵀ q_nope, s = (q_abs·c_t + q_x·k_x_t)/sqrt(192),
// ctx_h = V_h (Σ_t p_t c_t) — mathematically identical, and the cache holds only the
// latent: per token and layer c_t (latent) then k_x_t (extra) = 576 floats (MlaCache).
// ε_lat: DISAGREEMENT (spec §3.9) — the vendor constructs q_a_layernorm / kv_a_layernorm
// without an eps, so they use 1e-6; production ports use rms_norm_eps. We default to the
// vendor value and expose it as ModelOptions::mla_latent_norm_eps.
// Chunked rows: every row's latent is appended to its sequence's cache first, then row r
// attends to positions 0…position_r (spec §3.8).
#ifndef COLI_PLUGINS_KIMI_K3_MLA_H_
#define COLI_PLUGINS_KIMI_K3_MLA_H_

#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "plugins/kimi_k3/compute.h"
#include "plugins/kimi_k3/config.h"
#include "plugins/kimi_k3/weights.h"

namespace coli::k3 {

// The latent KV cache of one MLA layer for one sequence: rows [length, width] with
// width = latent + extra (K3: 576).
struct MlaCache {
  std::vector<float> rows;
  int64_t length = 0;
  int width = 0;
  void Reset(const MlaConfig& c) {
    rows.clear();
    length = 0;
    width = c.cache_width();
  }
  // Row `position` (growing the cache as needed), to be written.
  float* RowForWrite(int64_t position);
};

// x: [n, D] (the RMS-normalised layer input), out: [n, D]. Row r is at position positions[r]
// of the sequence whose cache is caches[r]; positions of one sequence must be consecutive.
absl::Status MlaForward(const Config& cfg, const MlaWeights& w, float latent_norm_eps,
                        const Compute& c, const float* x, int n,
                        std::span<MlaCache* const> caches, std::span<const int64_t> positions,
                        float* out);

}  // namespace coli::k3

#endif  // COLI_PLUGINS_KIMI_K3_MLA_H_
