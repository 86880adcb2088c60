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

// y[b, :] = W · x[b, :] for b < batch (common/kernels; each weight byte read once per call,
// each row's result independent of the batch size).
inline absl::Status MatMul(const Compute& c, const Linear& w, const float* x, int64_t batch,
                           float* y) {
  return kernels::Matmul(w.view(), x, batch, y, c.matmul);
}

}  // namespace coli::k3

#endif  // COLI_PLUGINS_KIMI_K3_COMPUTE_H_
