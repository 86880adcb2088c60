// AVX2 kernels (placeholder: scalar until the SIMD paths land).
#include "common/kernels/internal.h"
namespace coli::kernels::internal {
const KernelSet& Avx2Kernels() { return ScalarKernels(); }
}
