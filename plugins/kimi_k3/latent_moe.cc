#include "plugins/kimi_k3/latent_moe.h"

#include <algorithm>
#include <map>
#include <numeric>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/log/log.h"
#include "common/ops/ops.h"
#include "common/status/status.h"
#include "plugins/kimi_k3/dense_mlp.h"

namespace coli::k3 {

DeviceExperts::~DeviceExperts() = default;
DeviceSharedExperts::~DeviceSharedExperts() = default;

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
  struct Joiner {
    std::thread& t;
    ~Joiner() {
      if (t.joinable()) t.join();
    }
  };
  // 7. The shared experts on the full-width input need nothing else: on a device that takes them
  // (DeviceSharedExperts) they start now, on a thread, and are joined just before they are
  // added; otherwise the CPU computes them below while the first routed experts load.
  std::vector<float> sh(w.has_shared ? int64_t{n} * D : 0);
  DeviceSharedExperts* shared_device =
      w.has_shared ? dynamic_cast<DeviceSharedExperts*>(&experts) : nullptr;
  const bool shared_on_device = shared_device != nullptr && shared_device->TakesShared(layer, n);
  absl::Status shared_status;
  std::thread shared_thread;
  Joiner shared_joiner{shared_thread};
  if (shared_device != nullptr && !shared_on_device) {
    shared_device->PrefetchShared(layer, w.shared_gate.view(), w.shared_up.view(),
                                  w.shared_down.view());
  }
  if (shared_on_device) {
    shared_thread = std::thread([&] {
      shared_status =
          shared_device->ComputeShared(layer, w.shared_gate.view(), w.shared_up.view(),
                                       w.shared_down.view(), x, n, c.matmul.idot, sh.data());
    });
  }
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
  // A device tier (vk_tier.h) takes the resident experts; the CPU walks the rest (`cpu`, entries
  // of `unique` in its ascending order). Without a tier, or with nothing claimed, the CPU walks
  // exactly `unique` as before.
  DeviceExperts* device = dynamic_cast<DeviceExperts*>(&experts);
  std::vector<int> claimed;
  if (device != nullptr) claimed = device->Claim(layer, unique);
  std::vector<char> on_device(unique.size(), 0);
  for (int i : claimed) {
    if (i < 0 || i >= static_cast<int>(unique.size()) || on_device[i])
      return absl::InternalError(absl::StrCat("device tier claimed entry ", i, " twice"));
    on_device[i] = 1;
  }
  std::vector<int32_t> cpu_experts;
  std::vector<int> cpu_entry;  // cpu list index → entry of `unique`
  for (size_t i = 0; i < unique.size(); ++i) {
    if (on_device[i]) continue;
    cpu_experts.push_back(unique[i]);
    cpu_entry.push_back(static_cast<int>(i));
  }
  std::vector<char> done(unique.size(), 0);
  // The routed loads start now; meanwhile (before any expert is applied) this thread
  // computes what does not need them: 4. the latent down-projection and 7. the shared experts
  // on the full-width input (unless a device took them, above). Same operations and order as
  // without the overlap. With claimed experts, their device chain starts right after z and
  // runs on its own thread.
  std::vector<float> z(int64_t{n} * lat);
  std::vector<std::vector<float>> dev_in(claimed.size()), dev_out(claimed.size());
  absl::Status device_status;
  std::thread device_thread;
  Joiner joiner{device_thread};
  auto meanwhile = [&]() -> absl::Status {
    COLI_RETURN_IF_ERROR(MatMul(c, w.latent_down, x, n, z.data()));
    if (!claimed.empty()) {
      std::vector<DeviceExpertJob> jobs(claimed.size());
      for (size_t j = 0; j < claimed.size(); ++j) {
        const auto& slots = *slots_of[claimed[j]];
        const int m = static_cast<int>(slots.size());
        dev_in[j].resize(int64_t{m} * lat);
        dev_out[j].resize(int64_t{m} * lat);
        for (int r = 0; r < m; ++r)
          std::copy_n(z.data() + int64_t{slots[r].first} * lat, lat,
                      dev_in[j].data() + int64_t{r} * lat);
        jobs[j] = {claimed[j], dev_in[j].data(), m, dev_out[j].data()};
      }
      device_thread =
          std::thread([&device_status, device, jobs = std::move(jobs), idot = c.matmul.idot] {
            device_status = device->Compute(jobs, idot);
          });
    }
    if (w.has_shared && !shared_on_device) {
      COLI_RETURN_IF_ERROR(
          SituGluBlock(cfg, w.shared_gate, w.shared_up, w.shared_down, c, x, n, sh.data()));
    }
    return absl::OkStatus();
  };
  // Expert entry i of `unique` on the CPU into its (row, k) slots.
  auto cpu_expert = [&](int i, const ExpertWeights& ew) -> absl::Status {
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
  };
  COLI_RETURN_IF_ERROR(experts.ForEachExpertOverlapped(
      layer, cpu_experts, meanwhile, [&](int ci, const ExpertWeights& ew) -> absl::Status {
        if (ci < 0 || ci >= static_cast<int>(cpu_entry.size()) || done[cpu_entry[ci]])
          return absl::InternalError(absl::StrCat("expert source delivered entry ", ci, " twice"));
        const int i = cpu_entry[ci];
        done[i] = 1;
        COLI_RETURN_IF_ERROR(cpu_expert(i, ew));
        if (device != nullptr) device->Offer(layer, unique[i], ew);
        return absl::OkStatus();
      }));
  if (device_thread.joinable()) device_thread.join();
  if (!device_status.ok()) {
    // The device failed this step (it stops claiming, vk_tier.h): its experts are computed on
    // the CPU instead, with the kernels every CPU expert uses, so the step still succeeds with
    // the CPU run's bits for them.
    COLI_LOG(kWarning) << "layer " << layer << ": device experts computed on the CPU after: "
                       << device_status;
    std::vector<int32_t> fallback;
    for (int i : claimed) fallback.push_back(unique[i]);
    COLI_RETURN_IF_ERROR(experts.ForEachExpert(
        layer, fallback, [&](int fi, const ExpertWeights& ew) -> absl::Status {
          if (fi < 0 || fi >= static_cast<int>(claimed.size()) || done[claimed[fi]])
            return absl::InternalError(
                absl::StrCat("expert source delivered entry ", fi, " twice"));
          done[claimed[fi]] = 1;
          return cpu_expert(claimed[fi], ew);
        }));
    claimed.clear();
  }
  for (size_t j = 0; j < claimed.size(); ++j) {
    const auto& slots = *slots_of[claimed[j]];
    if (dev_out[j].empty() && !slots.empty())
      return absl::InternalError(absl::StrCat("device tier did not run for layer ", layer));
    for (size_t r = 0; r < slots.size(); ++r)
      std::copy_n(dev_out[j].data() + int64_t(r) * lat, lat,
                  slot_out.data() + (int64_t{slots[r].first} * max_k + slots[r].second) * lat);
    done[claimed[j]] = 1;
  }
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
  if (shared_thread.joinable()) shared_thread.join();
  if (shared_on_device && !shared_status.ok()) {
    // The device failed this call (it logs that once and stops taking the shared experts): the
    // CPU computes them with the kernels it uses without a device, so sh has the CPU's bits.
    COLI_RETURN_IF_ERROR(
        SituGluBlock(cfg, w.shared_gate, w.shared_up, w.shared_down, c, x, n, sh.data()));
  }
  if (w.has_shared) ops::Add(sh.data(), int64_t{n} * D, out);
  if (stats) {
    stats->rows += n;
    stats->expert_calls += static_cast<int64_t>(unique.size());
    for (const auto& r : routes) stats->expert_rows += static_cast<int64_t>(r.experts.size());
  }
  return absl::OkStatus();
}

}  // namespace coli::k3
