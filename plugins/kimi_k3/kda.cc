#include "plugins/kimi_k3/kda.h"

#include <cmath>

#include "common/ops/ops.h"
#include "common/status/status.h"

namespace coli::k3 {

void KdaState::Reset(const KdaConfig& c) {
  const size_t C = static_cast<size_t>(c.channels());
  S.assign(static_cast<size_t>(c.num_heads) * c.head_dim * c.head_dim, 0.0f);
  q_win.assign((c.conv_size - 1) * C, 0.0f);
  k_win.assign((c.conv_size - 1) * C, 0.0f);
  v_win.assign((c.conv_size - 1) * C, 0.0f);
}

absl::Status KdaForward(const Config& cfg, const KdaWeights& w, const Compute& c, const float* x,
                        int n, std::span<KdaState* const> states, float* out) {
  const int H = cfg.kda.num_heads, d = cfg.kda.head_dim, taps = cfg.kda.conv_size;
  const int64_t C = cfg.kda.channels();
  // 1. Projections, batched over the rows.
  std::vector<float> q(n * C), k(n * C), v(n * C), g(n * C), graw(n * C), fa(n * d), blog(n * H);
  COLI_RETURN_IF_ERROR(MatMul(c, w.q_proj, x, n, q.data()));
  COLI_RETURN_IF_ERROR(MatMul(c, w.k_proj, x, n, k.data()));
  COLI_RETURN_IF_ERROR(MatMul(c, w.v_proj, x, n, v.data()));
  COLI_RETURN_IF_ERROR(MatMul(c, w.g_proj, x, n, g.data()));
  COLI_RETURN_IF_ERROR(MatMul(c, w.f_a_proj, x, n, fa.data()));
  COLI_RETURN_IF_ERROR(MatMul(c, w.f_b_proj, fa.data(), n, graw.data()));
  COLI_RETURN_IF_ERROR(MatMul(c, w.b_proj, x, n, blog.data()));

  std::vector<float> qc(C), kc(C), vc(C), alpha(C), beta(H), o(n * C);
  const float q_scale = 1.0f / std::sqrt(static_cast<float>(d));
  const float lb = cfg.kda.gate_lower_bound;
  for (int r = 0; r < n; ++r) {
    KdaState& st = *states[r];
    // 2. Causal conv (window = the previous taps−1 raw projections) + SiLU.
    ops::CausalConvStep(C, taps, w.q_conv.data(), st.q_win.data(), q.data() + r * C, qc.data());
    ops::CausalConvStep(C, taps, w.k_conv.data(), st.k_win.data(), k.data() + r * C, kc.data());
    ops::CausalConvStep(C, taps, w.v_conv.data(), st.v_win.data(), v.data() + r * C, vc.data());
    ops::SiluInPlace(qc.data(), C);
    ops::SiluInPlace(kc.data(), C);
    ops::SiluInPlace(vc.data(), C);
    // 3. Per-head L2 norms; q scaled by d^-1/2.
    for (int h = 0; h < H; ++h) {
      ops::L2Normalize(qc.data() + h * d, d, 1e-6f, q_scale);
      ops::L2Normalize(kc.data() + h * d, d, 1e-6f, 1.0f);
    }
    // 4–5. Decay gate (A_log per head) and β.
    const float* gr = graw.data() + r * C;
    for (int h = 0; h < H; ++h) {
      for (int j = 0; j < d; ++j) {
        const int64_t ch = int64_t{h} * d + j;
        alpha[ch] = std::exp(lb * ops::Sigmoid(w.a_exp[h] * (gr[ch] + w.dt_bias[ch])));
      }
      beta[h] = ops::Sigmoid(blog[r * H + h]);
    }
    // 6. Delta-rule update and read-out, all heads.
    ops::KdaStepHeads(H, d, d, qc.data(), kc.data(), vc.data(), alpha.data(), beta.data(),
                      st.S.data(), o.data() + r * C, c.threads);
  }
  // 7. Shared per-head RMSNorm, sigmoid output gate, o_proj.
  for (int r = 0; r < n; ++r) {
    for (int h = 0; h < H; ++h) {
      float* oh = o.data() + r * C + int64_t{h} * d;
      const float* gh = g.data() + r * C + int64_t{h} * d;
      ops::RmsNorm(oh, w.o_norm.data(), d, cfg.rms_norm_eps, oh);
      for (int j = 0; j < d; ++j) oh[j] *= ops::Sigmoid(gh[j]);
    }
  }
  return MatMul(c, w.o_proj, o.data(), n, out);
}

}  // namespace coli::k3
