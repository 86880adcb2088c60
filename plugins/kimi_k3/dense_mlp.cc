#include "plugins/kimi_k3/dense_mlp.h"

#include <vector>

#include "common/ops/ops.h"
#include "common/status/status.h"

namespace coli::k3 {

absl::Status SituGluBlock(const Config& cfg, const Linear& gate, const Linear& up,
                          const Linear& down, const Compute& c, const float* x, int n, float* y) {
  const int64_t inner = gate.rows();
  std::vector<float> g(n * inner), u(n * inner);
  COLI_RETURN_IF_ERROR(MatMul(c, gate, x, n, g.data()));
  COLI_RETURN_IF_ERROR(MatMul(c, up, x, n, u.data()));
  ops::SituGlu(g.data(), u.data(), n * inner, cfg.situ_beta, cfg.situ_linear_beta, g.data());
  return MatMul(c, down, g.data(), n, y);
}

absl::Status DenseMlpForward(const Config& cfg, const DenseMlpWeights& w, const Compute& c,
                             const float* x, int n, float* out) {
  return SituGluBlock(cfg, w.gate_proj, w.up_proj, w.down_proj, c, x, n, out);
}

}  // namespace coli::k3
