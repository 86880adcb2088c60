#include "plugins/kimi_k3/attn_res.h"

#include <cmath>
#include <vector>

#include "common/ops/ops.h"

namespace coli::k3 {

void AttnResMix(std::span<const float* const> blocks, const float* prefix, int n, int64_t D,
                const float* score, float eps, float* out) {
  const size_t count = blocks.size() + 1;
  std::vector<const float*> cand(count);
  std::vector<double> logit(count);
  for (int r = 0; r < n; ++r) {
    for (size_t j = 0; j < blocks.size(); ++j) cand[j] = blocks[j] + int64_t{r} * D;
    cand[count - 1] = prefix + int64_t{r} * D;
    double mx = -INFINITY;
    for (size_t j = 0; j < count; ++j) {
      const double dot = ops::Dot(cand[j], score, D);
      const double ms = ops::Dot(cand[j], cand[j], D) / static_cast<double>(D);
      logit[j] = dot / std::sqrt(ms + eps);
      mx = std::max(mx, logit[j]);
    }
    double sum = 0.0;
    for (size_t j = 0; j < count; ++j) {
      logit[j] = std::exp(logit[j] - mx);
      sum += logit[j];
    }
    float* o = out + int64_t{r} * D;
    for (int64_t d = 0; d < D; ++d) o[d] = 0.0f;
    for (size_t j = 0; j < count; ++j)
      ops::Axpy(static_cast<float>(logit[j] / sum), cand[j], D, o);
  }
}

}  // namespace coli::k3
