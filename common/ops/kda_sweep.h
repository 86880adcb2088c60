// common/ops KDA sweeps per ISA: the per-head kernels behind ops::KdaStepSequences, and the entry
// that forces one ISA (tests compare the ISAs bit for bit; `coli bench kda` times them).
//
//   if (ops::KdaIsaSupported(kernels::Isa::kAvx2)) {
//     COLI_RETURN_IF_ERROR(ops::KdaStepSequencesWithIsa(kernels::Isa::kAvx2, heads, dk, dv, q, k,
//                                                       v, alpha, beta, seqs, n, o, threads));
//   }
//
// The SIMD kernels (kda_sweep_avx512.cc, kda_sweep_avx2.cc) carry per-function target attributes,
// so coli_ops builds for baseline x86-64 and the path is chosen at run time from cpuid
// (kernels::ActiveIsa, COLI_ISA=scalar|avx2|avx512 forces a lower one; avxvnni runs the AVX2
// sweep).
//
// How a head advances over its rows (both SIMD kernels): every output column j of a head evolves
// independently of the other columns (decay and update are per element, the sums run over i for
// a fixed j), so the kernels take a block of columns (64 on AVX-512, 32 on AVX2; the last block
// masked) and carry it through all the rows while it sits in L1, with the accumulators for e and
// o in registers. The update + read-out pass of row t and the decay + k·S pass of row t+1 are one
// pass over the block (per element: update, read-out term, decay, k·S term), so n rows cost n+1
// passes over S, from L1, and one trip of S through memory (read and write) per call.
#ifndef COLI_COMMON_OPS_KDA_SWEEP_H_
#define COLI_COMMON_OPS_KDA_SWEEP_H_

#include <cstdint>

#include "absl/status/status.h"
#include "common/kernels/kernels.h"
#include "common/ops/ops.h"

namespace coli::ops {

// The ISA KdaStepSequences runs: kernels::ActiveIsa(), with kAvxVnni mapped to kAvx2.
kernels::Isa KdaActiveIsa();
// Whether this CPU runs the sweep of `isa` (kAvxVnni: as kAvx2).
bool KdaIsaSupported(kernels::Isa isa);
// KdaStepSequences with the sweep of `isa`; FAILED_PRECONDITION naming the ISA when this CPU
// lacks it (nothing is touched then).
absl::Status KdaStepSequencesWithIsa(kernels::Isa isa, int heads, int dk, int dv, const float* q,
                                     const float* k, const float* v, const float* alpha,
                                     const float* beta, const KdaSequence* seqs, int num_seqs,
                                     float* o, int threads);

namespace internal {

// One head advanced over `rows` rows in order. Row t is idx[t]; its q, k, alpha are at
// q/k/alpha + idx[t]·qk_stride (the pointers already point at this head), v and o at
// + idx[t]·v_stride, beta at beta[idx[t]·beta_stride]. S: this head's [dk, dv].
struct KdaHeadArgs {
  int dk = 0, dv = 0, rows = 0;
  const int32_t* idx = nullptr;
  const float *q = nullptr, *k = nullptr, *v = nullptr, *alpha = nullptr, *beta = nullptr;
  int64_t qk_stride = 0, v_stride = 0, beta_stride = 0;
  float* S = nullptr;
  float* o = nullptr;
};
using KdaHeadFn = void (*)(const KdaHeadArgs&);
// KdaIsaSupported on a CPU whose best ISA is `detected` (tests reach every CPU through it).
bool KdaIsaSupportedOn(kernels::Isa isa, kernels::Isa detected);
void KdaHeadScalar(const KdaHeadArgs& a);  // KdaStep row after row (kda_sweep.cc)
void KdaHeadAvx2(const KdaHeadArgs& a);    // kda_sweep_avx2.cc
void KdaHeadAvx512(const KdaHeadArgs& a);  // kda_sweep_avx512.cc

}  // namespace internal
}  // namespace coli::ops

#endif  // COLI_COMMON_OPS_KDA_SWEEP_H_
