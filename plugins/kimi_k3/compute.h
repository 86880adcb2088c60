// plugins/kimi_k3/compute: what every layer file needs to run its matmuls.
#ifndef COLI_PLUGINS_KIMI_K3_COMPUTE_H_
#define COLI_PLUGINS_KIMI_K3_COMPUTE_H_

#include <cstdint>

#include "absl/status/status.h"
#include "common/kernels/kernels.h"
#include "plugins/kimi_k3/weights.h"

namespace coli::k3 {

// Threading and kernel choice for one forward pass.
struct Compute {
  kernels::MatmulOptions matmul;  // idot + threads
  int threads = 0;                // for common/ops (0 = OpenMP default)
};

// Below this many multiply-adds (~0.5 ms of one core) a matmul runs on one thread: waking a
// thread team costs more than it saves, badly so on a busy machine (the tiny fixtures; on K3
// only the rank-128 decay projections and the per-head MLA absorb matrices at batch 1).
// Results do not depend on it (kernels are thread-count independent).
inline constexpr int64_t kSingleThreadWork = int64_t{1} << 21;

// y[b, :] = W · x[b, :] for b < batch (common/kernels; each weight byte read once per call,
// each row's result independent of the batch size and of the thread count).
inline absl::Status MatMul(const Compute& c, const kernels::MatrixView& w, const float* x,
                           int64_t batch, float* y) {
  kernels::MatmulOptions o = c.matmul;
  if (w.rows * w.cols * batch < kSingleThreadWork) o.threads = 1;
  return kernels::Matmul(w, x, batch, y, o);
}
inline absl::Status MatMul(const Compute& c, const Linear& w, const float* x, int64_t batch,
                           float* y) {
  return MatMul(c, w.view(), x, batch, y);
}

}  // namespace coli::k3

#endif  // COLI_PLUGINS_KIMI_K3_COMPUTE_H_
