// ops::KdaStepSequences: (sequence, head) pairs in parallel, each advanced over its rows by the
// sweep of the run-time ISA (kda_sweep.h).
#include "common/ops/kda_sweep.h"

#include "absl/strings/str_cat.h"

namespace coli::ops {
namespace {

using internal::KdaHeadArgs;
using internal::KdaHeadFn;
using kernels::Isa;

Isa SweepIsa(Isa isa) { return isa == Isa::kAvxVnni ? Isa::kAvx2 : isa; }

KdaHeadFn HeadFnFor(Isa isa) {
  switch (SweepIsa(isa)) {
    case Isa::kAvx512:
      return internal::KdaHeadAvx512;
    case Isa::kAvx2:
      return internal::KdaHeadAvx2;
    default:
      return internal::KdaHeadScalar;
  }
}

void Run(KdaHeadFn fn, int heads, int dk, int dv, const float* q, const float* k, const float* v,
         const float* alpha, const float* beta, const KdaSequence* seqs, int num_seqs, float* o,
         int threads) {
  int64_t rows = 0;
  for (int s = 0; s < num_seqs; ++s) rows += seqs[s].count;
  const int64_t items = int64_t{num_seqs} * heads;
  const int team =
      ParallelTeam(rows * heads * dk * dv, kKdaStepSequencesWorkPerThread, items, threads);
  // Sequence-major items with a static schedule: one thread takes consecutive heads of a state
  // (contiguous memory).
  const auto sweep = [&](int64_t it) {
    const KdaSequence& seq = seqs[it / heads];
    if (seq.count <= 0) return;
    const int64_t h = it % heads;
    KdaHeadArgs a;
    a.dk = dk;
    a.dv = dv;
    a.rows = seq.count;
    a.idx = seq.rows;
    a.q = q + h * dk;
    a.k = k + h * dk;
    a.v = v + h * dv;
    a.alpha = alpha + h * dk;
    a.beta = beta + h;
    a.qk_stride = int64_t{heads} * dk;
    a.v_stride = int64_t{heads} * dv;
    a.beta_stride = heads;
    a.S = seq.S + h * dk * dv;
    a.o = o + h * dv;
    fn(a);
  };
  if (team == 1) {  // no region: even an if(false) one costs ~1-2 µs
    for (int64_t it = 0; it < items; ++it) sweep(it);
    return;
  }
#pragma omp parallel for num_threads(team) schedule(static)
  for (int64_t it = 0; it < items; ++it) sweep(it);
}

}  // namespace

namespace internal {

void KdaHeadScalar(const KdaHeadArgs& a) {
  for (int t = 0; t < a.rows; ++t) {
    const int64_t r = a.idx[t];
    KdaStep(a.dk, a.dv, a.q + r * a.qk_stride, a.k + r * a.qk_stride, a.v + r * a.v_stride,
            a.alpha + r * a.qk_stride, a.beta[r * a.beta_stride], a.S, a.o + r * a.v_stride);
  }
}

}  // namespace internal

Isa KdaActiveIsa() {
  static const Isa isa = SweepIsa(kernels::ActiveIsa());
  return isa;
}

bool KdaIsaSupported(Isa isa) { return internal::KdaIsaSupportedOn(isa, kernels::DetectedIsa()); }

namespace internal {
bool KdaIsaSupportedOn(Isa isa, Isa detected) {
  return static_cast<int>(SweepIsa(isa)) <= static_cast<int>(SweepIsa(detected));
}
}  // namespace internal

void KdaStepSequences(int heads, int dk, int dv, const float* q, const float* k, const float* v,
                      const float* alpha, const float* beta, const KdaSequence* seqs, int num_seqs,
                      float* o, int threads) {
  static const KdaHeadFn fn = HeadFnFor(KdaActiveIsa());
  Run(fn, heads, dk, dv, q, k, v, alpha, beta, seqs, num_seqs, o, threads);
}

absl::Status KdaStepSequencesWithIsa(Isa isa, int heads, int dk, int dv, const float* q,
                                     const float* k, const float* v, const float* alpha,
                                     const float* beta, const KdaSequence* seqs, int num_seqs,
                                     float* o, int threads) {
  if (!KdaIsaSupported(isa)) {
    return absl::FailedPreconditionError(
        absl::StrCat("KDA sweep: this CPU has no ", kernels::IsaName(isa), " (it has ",
                     kernels::IsaName(kernels::DetectedIsa()), ")"));
  }
  Run(HeadFnFor(isa), heads, dk, dv, q, k, v, alpha, beta, seqs, num_seqs, o, threads);
  return absl::OkStatus();
}

}  // namespace coli::ops
