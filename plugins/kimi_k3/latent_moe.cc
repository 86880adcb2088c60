#include "plugins/kimi_k3/latent_moe.h"

#include <algorithm>
#include <map>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "common/ops/ops.h"
#include "common/status/status.h"
#include "plugins/kimi_k3/dense_mlp.h"

namespace coli::k3 {

Routing Route(const MoeConfig& moe, std::span<const float> logits,
              std::span<const float> bias, double topp) {
  const int E = moe.num_experts, K = moe.top_k;
  std::vector<float> s(E), biased(E);
  for (int e = 0; e < E; ++e) {
    s[e] = ops::Sigmoid(logits[e]);
    biased[e] = s[e] + bias[e];
  }
  std::vector<int32_t> ids(E);
  std::iota(ids.begin(), ids.end(), 0);
  std::partial_sort(ids.begin(), ids.begin() + K, ids.end(), [&](int32_t a, int32_t b) {
    return biased[a] > biased[b] || (biased[a] == biased[b] && a < b);
  });
  Routing r;
  r.experts.assign(ids.begin(), ids.begin() + K);
  r.weights.resize(K);
  float sum = 0.0f;
  for (int k = 0; k < K; ++k) sum += s[r.experts[k]];
  for (int k = 0; k < K; ++k) {
    const float wk = moe.renormalize ? s[r.experts[k]] / (sum + 1e-20f) : s[r.experts[k]];
    r.weights[k] = wk * moe.routed_scaling_factor;
  }
  if (topp > 0.0 && topp < 1.0) {
    // Engine-only pruning (spec §3.6 notes): keep the heaviest experts up to cumulative p.
    std::vector<int> order(K);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(),
                     [&](int a, int b) { return r.weights[a] > r.weights[b]; });
    float total = 0.0f, cum = 0.0f;
    for (float wk : r.weights) total += wk;
    Routing pruned;
    for (int i : order) {
      pruned.experts.push_back(r.experts[i]);
      pruned.weights.push_back(r.weights[i]);
      cum += r.weights[i];
      if (cum >= topp * total) break;
    }
    for (float& wk : pruned.weights) wk = wk / cum * total;
    return pruned;
  }
  return r;
}

absl::Status LatentMoeForward(const Config& cfg, const MoeWeights& w, int layer,
                              ExpertSource& experts, double topp, const Compute& c,
                              const float* x, int n, float* out, MoeStats* stats) {
  const MoeConfig& moe = cfg.moe;
  const int E = moe.num_experts, lat = moe.latent, inter = moe.intermediate;
  const int64_t D = cfg.hidden_size;
  // 1–3. Router and selection per row.
  std::vector<float> logits(int64_t{n} * E);
  COLI_RETURN_IF_ERROR(MatMul(c, w.router, x, n, logits.data()));
  std::vector<Routing> routes(n);
  for (int r = 0; r < n; ++r)
    routes[r] = Route(moe, std::span<const float>(logits.data() + int64_t{r} * E, E),
                      w.correction_bias, topp);
  // 5. Unique experts of the batch (ascending id) and the (row, k) slots that chose each.
  std::map<int32_t, std::vector<std::pair<int, int>>> users;
  int max_k = 0;
  for (int r = 0; r < n; ++r) {
    max_k = std::max<int>(max_k, routes[r].experts.size());
    for (size_t k = 0; k < routes[r].experts.size(); ++k)
      users[routes[r].experts[k]].push_back({r, static_cast<int>(k)});
  }
  std::vector<int32_t> unique;
  std::vector<const std::vector<std::pair<int, int>>*> slots_of;
  for (const auto& [e, slots] : users) {
    unique.push_back(e);
    slots_of.push_back(&slots);
  }
  std::vector<float> slot_out(int64_t{n} * max_k * lat, 0.0f);
  std::vector<char> done(unique.size(), 0);
  // The routed experts' loads start now; meanwhile (before any expert is applied) this thread
  // computes what does not need them: 4. the latent down-projection and 7. the shared experts
  // on the full-width input. Same operations and order as without the overlap.
  std::vector<float> z(int64_t{n} * lat);
  std::vector<float> sh;
  auto meanwhile = [&]() -> absl::Status {
    COLI_RETURN_IF_ERROR(MatMul(c, w.latent_down, x, n, z.data()));
    if (w.has_shared) {
      sh.resize(int64_t{n} * D);
      COLI_RETURN_IF_ERROR(
          SituGluBlock(cfg, w.shared_gate, w.shared_up, w.shared_down, c, x, n, sh.data()));
    }
    return absl::OkStatus();
  };
  COLI_RETURN_IF_ERROR(experts.ForEachExpertOverlapped(
      layer, unique, meanwhile, [&](int i, const ExpertWeights& ew) -> absl::Status {
        if (i < 0 || i >= static_cast<int>(unique.size()) || done[i])
          return absl::InternalError(absl::StrCat("expert source delivered entry ", i, " twice"));
        done[i] = 1;
        const auto& slots = *slots_of[i];
        const int m = static_cast<int>(slots.size());
        std::vector<float> zin(int64_t{m} * lat), g(int64_t{m} * inter), u(int64_t{m} * inter),
            y(int64_t{m} * lat);
        for (int j = 0; j < m; ++j)
          std::copy_n(z.data() + int64_t{slots[j].first} * lat, lat, zin.data() + int64_t{j} * lat);
        COLI_RETURN_IF_ERROR(MatMul(c, ew.w1, zin.data(), m, g.data()));
        COLI_RETURN_IF_ERROR(MatMul(c, ew.w3, zin.data(), m, u.data()));
        ops::SituGlu(g.data(), u.data(), int64_t{m} * inter, cfg.situ_beta, cfg.situ_linear_beta,
                     g.data());
        COLI_RETURN_IF_ERROR(MatMul(c, ew.w2, g.data(), m, y.data()));
        for (int j = 0; j < m; ++j)
          std::copy_n(y.data() + int64_t{j} * lat, lat,
                      slot_out.data() + (int64_t{slots[j].first} * max_k + slots[j].second) * lat);
        return absl::OkStatus();
      }));
  for (size_t i = 0; i < done.size(); ++i)
    if (!done[i])
      return absl::InternalError(absl::StrCat("expert source skipped expert ", unique[i],
                                              " of layer ", layer));
  // Fixed-order sum over k, then the latent norm.
  std::vector<float> u(int64_t{n} * lat, 0.0f);
  for (int r = 0; r < n; ++r) {
    float* ur = u.data() + int64_t{r} * lat;
    for (size_t k = 0; k < routes[r].experts.size(); ++k)
      ops::Axpy(routes[r].weights[k], slot_out.data() + (int64_t{r} * max_k + k) * lat, lat, ur);
    if (moe.latent_norm) ops::RmsNorm(ur, w.latent_norm.data(), lat, cfg.rms_norm_eps, ur);
  }
  // 6. Latent up-projection; 8. sum with the shared experts' output (computed above).
  COLI_RETURN_IF_ERROR(MatMul(c, w.latent_up, u.data(), n, out));
  if (w.has_shared) ops::Add(sh.data(), int64_t{n} * D, out);
  if (stats) {
    stats->rows += n;
    stats->expert_calls += static_cast<int64_t>(unique.size());
    for (const auto& r : routes) stats->expert_rows += static_cast<int64_t>(r.experts.size());
  }
  return absl::OkStatus();
}

}  // namespace coli::k3
