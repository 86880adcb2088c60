#include "plugins/kimi_k3/mla.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/ops/ops.h"
#include "common/status/status.h"

namespace coli::k3 {

float* MlaCache::RowForWrite(int64_t position) {
  const size_t need = static_cast<size_t>(position + 1) * width;
  if (rows.size() < need) {
    size_t cap = std::max<size_t>(rows.capacity(), static_cast<size_t>(width) * 16);
    while (cap < need) cap *= 2;
    rows.reserve(cap);
    rows.resize(need, 0.0f);
  }
  length = std::max(length, position + 1);
  return rows.data() + position * width;
}

absl::Status MlaForward(const Config& cfg, const MlaWeights& w, float latent_norm_eps,
                        const Compute& c, const float* x, int n,
                        std::span<MlaCache* const> caches, std::span<const int64_t> positions,
                        float* out) {
  const MlaConfig& m = cfg.mla;
  const int H = m.num_heads, nope = m.qk_nope_head_dim, extra = m.qk_rope_head_dim,
            vd = m.v_head_dim, lat = m.kv_lora_rank, ql = m.q_lora_rank, qh = m.q_head_dim();
  const int width = m.cache_width();
  // 1. Query path.
  std::vector<float> cq(int64_t{n} * ql), Q(int64_t{n} * H * qh);
  COLI_RETURN_IF_ERROR(MatMul(c, w.q_a_proj, x, n, cq.data()));
  ops::RmsNormRows(cq.data(), w.q_a_norm.data(), n, ql, latent_norm_eps, cq.data());
  COLI_RETURN_IF_ERROR(MatMul(c, w.q_b_proj, cq.data(), n, Q.data()));
  // 2. Latent KV of every row, appended to the caches first.
  std::vector<float> kv(int64_t{n} * width);
  COLI_RETURN_IF_ERROR(MatMul(c, w.kv_a_proj, x, n, kv.data()));
  for (int r = 0; r < n; ++r) {
    if (positions[r] > caches[r]->length)
      return absl::InternalError(absl::StrCat("MLA cache: position ", positions[r],
                                              " skips past cache length ", caches[r]->length));
    float* row = caches[r]->RowForWrite(positions[r]);
    const float* src = kv.data() + int64_t{r} * width;
    ops::RmsNorm(src, w.kv_a_norm.data(), lat, latent_norm_eps, row);
    std::copy(src + lat, src + width, row + lat);
  }
  // 3. Absorb K_h into the queries: q_abs[r, h, :] = K_hᵀ q_nope[r, h, :].
  std::vector<float> q_abs(int64_t{n} * H * lat), q_x(int64_t{n} * H * extra);
  std::vector<float> gathered(int64_t{n} * std::max(nope, lat)), tmp(int64_t{n} * std::max(lat, vd));
  for (int h = 0; h < H; ++h) {
    for (int r = 0; r < n; ++r) {
      const float* qr = Q.data() + (int64_t{r} * H + h) * qh;
      std::copy(qr, qr + nope, gathered.data() + int64_t{r} * nope);
      std::copy(qr + nope, qr + qh, q_x.data() + (int64_t{r} * H + h) * extra);
    }
    COLI_RETURN_IF_ERROR(MatMul(c, w.k_absorb[h], gathered.data(), n, tmp.data()));
    for (int r = 0; r < n; ++r)
      std::copy(tmp.data() + int64_t{r} * lat, tmp.data() + int64_t{r + 1} * lat,
                q_abs.data() + (int64_t{r} * H + h) * lat);
  }
  // 4. Attention over the latent cache, causal per row.
  const float scale = 1.0f / std::sqrt(static_cast<float>(qh));
  std::vector<float> ctx_lat(int64_t{n} * H * lat);
  for (int r = 0; r < n; ++r) {
    ops::LatentAttention(H, positions[r] + 1, lat, extra, width,
                         q_abs.data() + int64_t{r} * H * lat, q_x.data() + int64_t{r} * H * extra,
                         caches[r]->rows.data(), scale, ctx_lat.data() + int64_t{r} * H * lat,
                         c.threads);
  }
  // 5. Up-project to values per head, gate, o_proj.
  std::vector<float> ctx(int64_t{n} * H * vd), gate(int64_t{n} * H * vd);
  for (int h = 0; h < H; ++h) {
    for (int r = 0; r < n; ++r) {
      const float* src = ctx_lat.data() + (int64_t{r} * H + h) * lat;
      std::copy(src, src + lat, gathered.data() + int64_t{r} * lat);
    }
    COLI_RETURN_IF_ERROR(MatMul(c, w.v_up[h], gathered.data(), n, tmp.data()));
    for (int r = 0; r < n; ++r)
      std::copy(tmp.data() + int64_t{r} * vd, tmp.data() + int64_t{r + 1} * vd,
                ctx.data() + (int64_t{r} * H + h) * vd);
  }
  COLI_RETURN_IF_ERROR(MatMul(c, w.g_proj, x, n, gate.data()));
  for (size_t i = 0; i < ctx.size(); ++i) ctx[i] *= ops::Sigmoid(gate[i]);
  return MatMul(c, w.o_proj, ctx.data(), n, out);
}

}  // namespace coli::k3
