#include "plugins/kimi_k3/kda.h"

#include <algorithm>
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

void KdaRows(const KdaConfig& cfg, const KdaWeights& w, int threads, int64_t n, const float* q_raw,
             const float* k_raw, const float* v_raw, const float* alpha, const float* beta,
             std::span<KdaState* const> states, float* scratch, float* o) {
  const int H = cfg.num_heads, d = cfg.head_dim, taps = cfg.conv_size;
  const int64_t C = cfg.channels();
  float* qc = scratch;
  float* kc = scratch + n * C;
  float* vc = scratch + 2 * n * C;
  const float q_scale = 1.0f / std::sqrt(static_cast<float>(d));
  // The rows of each distinct state, in row order (rows of one sequence are in position order).
  std::vector<KdaState*> owners;
  std::vector<std::vector<int32_t>> rows_of;
  for (int64_t r = 0; r < n; ++r) {
    KdaState& st = *states[r];
    // 2. Causal conv (window = the previous taps−1 raw projections) + SiLU, in row order.
    float* qr = qc + r * C;
    float* kr = kc + r * C;
    float* vr = vc + r * C;
    ops::CausalConvStep(C, taps, w.q_conv.data(), st.q_win.data(), q_raw + r * C, qr);
    ops::CausalConvStep(C, taps, w.k_conv.data(), st.k_win.data(), k_raw + r * C, kr);
    ops::CausalConvStep(C, taps, w.v_conv.data(), st.v_win.data(), v_raw + r * C, vr);
    ops::SiluInPlace(qr, C);
    ops::SiluInPlace(kr, C);
    ops::SiluInPlace(vr, C);
    // 3. Per-head L2 norms; q scaled by d^-1/2.
    for (int h = 0; h < H; ++h) {
      ops::L2Normalize(qr + h * d, d, 1e-6f, q_scale);
      ops::L2Normalize(kr + h * d, d, 1e-6f, 1.0f);
    }
    const size_t i =
        static_cast<size_t>(std::find(owners.begin(), owners.end(), &st) - owners.begin());
    if (i == owners.size()) {
      owners.push_back(&st);
      rows_of.emplace_back();
    }
    rows_of[i].push_back(static_cast<int32_t>(r));
  }
  // 6. Delta-rule update and read-out: each state's heads over all of its rows.
  std::vector<ops::KdaSequence> seqs(owners.size());
  for (size_t i = 0; i < owners.size(); ++i) {
    seqs[i] = {owners[i]->S.data(), rows_of[i].data(), static_cast<int>(rows_of[i].size())};
  }
  ops::KdaStepSequences(H, d, d, qc, kc, vc, alpha, beta, seqs.data(),
                        static_cast<int>(seqs.size()), o, threads);
}

absl::Status KdaForward(const Config& cfg, const KdaWeights& w, const Compute& c, const float* x,
                        int n, std::span<KdaState* const> states, float* out) {
  const int H = cfg.kda.num_heads, d = cfg.kda.head_dim;
  const int64_t C = cfg.kda.channels();
  // 1. Projections, batched over the rows.
  std::vector<float> q(n * C), k(n * C), v(n * C), g(n * C), graw(n * C),
      fa(n * w.f_a_proj.rows()), blog(n * H);
  COLI_RETURN_IF_ERROR(MatMul(c, w.q_proj, x, n, q.data()));
  COLI_RETURN_IF_ERROR(MatMul(c, w.k_proj, x, n, k.data()));
  COLI_RETURN_IF_ERROR(MatMul(c, w.v_proj, x, n, v.data()));
  COLI_RETURN_IF_ERROR(MatMul(c, w.g_proj, x, n, g.data()));
  COLI_RETURN_IF_ERROR(MatMul(c, w.f_a_proj, x, n, fa.data()));
  COLI_RETURN_IF_ERROR(MatMul(c, w.f_b_proj, fa.data(), n, graw.data()));
  COLI_RETURN_IF_ERROR(MatMul(c, w.b_proj, x, n, blog.data()));

  std::vector<float> alpha(n * C), beta(n * H), o(n * C);
  const float lb = cfg.kda.gate_lower_bound;
  for (int r = 0; r < n; ++r) {
    // 4–5. Decay gate (A_log per head) and β.
    const float* gr = graw.data() + r * C;
    float* ar = alpha.data() + r * C;
    float* br = beta.data() + r * H;
    for (int h = 0; h < H; ++h) {
      for (int j = 0; j < d; ++j) {
        const int64_t ch = int64_t{h} * d + j;
        ar[ch] = std::exp(lb * ops::Sigmoid(w.a_exp[h] * (gr[ch] + w.dt_bias[ch])));
      }
      br[h] = ops::Sigmoid(blog[r * H + h]);
    }
    if (KdaRowInputs* rec = states[r]->record) {
      const float* qr = q.data() + r * C;
      const float* kr = k.data() + r * C;
      const float* vr = v.data() + r * C;
      rec->q.insert(rec->q.end(), qr, qr + C);
      rec->k.insert(rec->k.end(), kr, kr + C);
      rec->v.insert(rec->v.end(), vr, vr + C);
      rec->alpha.insert(rec->alpha.end(), ar, ar + C);
      rec->beta.insert(rec->beta.end(), br, br + H);
    }
  }
  // 2, 3, 6. Conv, norms, delta rule and read-out of all rows.
  {
    std::vector<float> scratch(3 * static_cast<size_t>(n) * C);
    KdaRows(cfg.kda, w, c.threads, n, q.data(), k.data(), v.data(), alpha.data(), beta.data(),
            states, scratch.data(), o.data());
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
  // Blocks of rows bound the scratch; splitting does not change the result (as chunking does not).
  constexpr int64_t kBlock = 64;
  const int64_t block = std::min(rows, kBlock);
  std::vector<float> scratch(3 * block * C), o(block * C);
  const std::vector<KdaState*> states(block, &st);
  for (int64_t r0 = 0; r0 < rows; r0 += block) {
    const int64_t m = std::min(block, rows - r0);
    KdaRows(cfg, w, threads, m, in.q.data() + r0 * C, in.k.data() + r0 * C, in.v.data() + r0 * C,
            in.alpha.data() + r0 * C, in.beta.data() + r0 * H,
            std::span<KdaState* const>(states.data(), m), scratch.data(), o.data());
  }
  return absl::OkStatus();
}

}  // namespace coli::k3
