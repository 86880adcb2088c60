#include "common/kernels/internal.h"
namespace coli::kernels::internal {
const KernelSet& Avx512Kernels() { return ScalarKernels(); }
}
