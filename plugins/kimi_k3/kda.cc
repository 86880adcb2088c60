#include "plugins/kimi_k3/kda.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/ops/ops.h"
#include "common/status/status.h"

namespace coli::k3 {

void KdaState::Reset(const KdaConfig& c) {
  const size_t C = static_cast<size_t>(c.channels());
  S.assign(static_cast<size_t>(c.num_heads) * c.head_dim * c.head_dim, 0.0f);
  q_win.assign((c.conv_size - 1) * C, 0.0f);
  k_win.assign((c.conv_size - 1) * C, 0.0f);
  v_win.assign((c.conv_size - 1) * C, 0.0f);
  record = nullptr;
}

int64_t KdaRowInputs::rows(const KdaConfig& c) const {
  return static_cast<int64_t>(beta.size()) / c.num_heads;
}

absl::Status KdaRowInputs::Check(const KdaConfig& c, int64_t want, int layer) const {
  const int64_t n = rows(c);
  const size_t C = static_cast<size_t>(c.channels());
  const size_t rn = static_cast<size_t>(n);
  if (beta.size() != rn * c.num_heads || q.size() != rn * C || k.size() != rn * C ||
      v.size() != rn * C || alpha.size() != rn * C) {
    return absl::FailedPreconditionError(
        absl::StrCat("KDA layer ", layer, " replay record: inconsistent buffers (q ", q.size(),
                     ", k ", k.size(), ", v ", v.size(), ", alpha ", alpha.size(), ", beta ",
                     beta.size(), " floats for C = ", C, ", H = ", c.num_heads, ")"));
  }
  if (want < 0 || want > n) {
    return absl::FailedPreconditionError(
        absl::StrCat("KDA layer ", layer, " replay record holds ", n, " rows, ", want, " asked"));
  }
  return absl::OkStatus();
}

void KdaRowInputs::Clear() {
  q.clear();
  k.clear();
  v.clear();
  alpha.clear();
  beta.clear();
}

size_t KdaRowInputs::bytes() const {
  return (q.size() + k.size() + v.size() + alpha.size() + beta.size()) * sizeof(float);
}

void KdaRowStep(const KdaConfig& cfg, const KdaWeights& w, int threads, const float* q_raw,
                const float* k_raw, const float* v_raw, const float* alpha, const float* beta,
                KdaState& st, float* scratch, float* o) {
  const int H = cfg.num_heads, d = cfg.head_dim, taps = cfg.conv_size;
  const int64_t C = cfg.channels();
  float* qc = scratch;
  float* kc = scratch + C;
  float* vc = scratch + 2 * C;
  // 2. Causal conv (window = the previous taps−1 raw projections) + SiLU.
  ops::CausalConvStep(C, taps, w.q_conv.data(), st.q_win.data(), q_raw, qc);
  ops::CausalConvStep(C, taps, w.k_conv.data(), st.k_win.data(), k_raw, kc);
  ops::CausalConvStep(C, taps, w.v_conv.data(), st.v_win.data(), v_raw, vc);
  ops::SiluInPlace(qc, C);
  ops::SiluInPlace(kc, C);
  ops::SiluInPlace(vc, C);
  // 3. Per-head L2 norms; q scaled by d^-1/2.
  const float q_scale = 1.0f / std::sqrt(static_cast<float>(d));
  for (int h = 0; h < H; ++h) {
    ops::L2Normalize(qc + h * d, d, 1e-6f, q_scale);
    ops::L2Normalize(kc + h * d, d, 1e-6f, 1.0f);
  }
  // 6. Delta-rule update and read-out, all heads.
  ops::KdaStepHeads(H, d, d, qc, kc, vc, alpha, beta, st.S.data(), o, threads);
}

absl::Status KdaForward(const Config& cfg, const KdaWeights& w, const Compute& c, const float* x,
                        int n, std::span<KdaState* const> states, float* out) {
  const int H = cfg.kda.num_heads, d = cfg.kda.head_dim;
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

  std::vector<float> scratch(3 * C), alpha(C), beta(H), o(n * C);
  const float lb = cfg.kda.gate_lower_bound;
  for (int r = 0; r < n; ++r) {
    KdaState& st = *states[r];
    // 4–5. Decay gate (A_log per head) and β.
    const float* gr = graw.data() + r * C;
    for (int h = 0; h < H; ++h) {
      for (int j = 0; j < d; ++j) {
        const int64_t ch = int64_t{h} * d + j;
        alpha[ch] = std::exp(lb * ops::Sigmoid(w.a_exp[h] * (gr[ch] + w.dt_bias[ch])));
      }
      beta[h] = ops::Sigmoid(blog[r * H + h]);
    }
    const float* qr = q.data() + r * C;
    const float* kr = k.data() + r * C;
    const float* vr = v.data() + r * C;
    if (KdaRowInputs* rec = st.record) {
      rec->q.insert(rec->q.end(), qr, qr + C);
      rec->k.insert(rec->k.end(), kr, kr + C);
      rec->v.insert(rec->v.end(), vr, vr + C);
      rec->alpha.insert(rec->alpha.end(), alpha.begin(), alpha.end());
      rec->beta.insert(rec->beta.end(), beta.begin(), beta.end());
    }
    // 2, 3, 6. Conv, norms, delta rule and read-out of this row.
    KdaRowStep(cfg.kda, w, c.threads, qr, kr, vr, alpha.data(), beta.data(), st, scratch.data(),
               o.data() + r * C);
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

absl::Status KdaReplay(const KdaConfig& cfg, const KdaWeights& w, int threads,
                       const KdaRowInputs& in, int64_t rows, KdaState& st, int layer) {
  COLI_RETURN_IF_ERROR(in.Check(cfg, rows, layer));
  const int H = cfg.num_heads;
  const int64_t C = cfg.channels();
  std::vector<float> scratch(3 * C), o(C);
  for (int64_t r = 0; r < rows; ++r) {
    KdaRowStep(cfg, w, threads, in.q.data() + r * C, in.k.data() + r * C, in.v.data() + r * C,
               in.alpha.data() + r * C, in.beta.data() + r * H, st, scratch.data(), o.data());
  }
  return absl::OkStatus();
}

}  // namespace coli::k3
