// common/ops: the elementwise, normalisation and recurrence primitives of the model code.
//
// Model files (plugins/*) hold no loops worth vectorising; they call these. Every primitive
// documents its arithmetic exactly (accumulation type and order), because the model's chunked
// prefill must be bit-identical to token-at-a-time and its results are compared against an
// independent float64 reference. Functions with a "fast path" have a `...Reference` twin: the
// literal scalar formula, used by tests (tests/common/ops) to check the fast path.
//
//   std::vector<float> y(n);
//   coli::ops::RmsNorm(x.data(), w.data(), n, 1e-5f, y.data());
//   coli::ops::SituGlu(g, u, n, 4.0f, 25.0f, out);
//
// Nothing here allocates per call except LatentAttention (one score buffer per thread) and
// nothing can fail; sizes are the caller's responsibility (pointers must hold n elements).
#ifndef COLI_COMMON_OPS_OPS_H_
#define COLI_COMMON_OPS_OPS_H_

#include <cmath>
#include <cstdint>

namespace coli::ops {

// How many threads a parallel loop over `items` independent items, `work` units of work in all,
// should run on: one per `min_work_per_thread` units, at most `threads` (0 = OpenMP's default)
// and `items`, at least one. Every thread of a region costs a wake-up and a join; below a few
// tens of µs of work per thread they cost more than they save, and on a machine whose cores are
// all busy each extra thread waits for a scheduler slice (bench/ops/ops_benchmark.cc measures
// both; docs/status/threads.md has the figures behind each op's `min_work_per_thread`).
int ParallelTeam(int64_t work, int64_t min_work_per_thread, int64_t items, int threads);

// Each op's `min_work_per_thread` (AVX-512 box, one thread). LatentAttention: work =
// heads·T·(latent+extra), ~0.7 ns a unit on the tiny fixture's shape, ~1.4 ns on K3's; 2^17
// units (~90-180 µs) because its region comes after a serial stretch (the per-head absorb
// matmuls), so OpenMP's threads have gone to sleep and each pays a wake-up: with sleeping
// threads two beat one only from ~T = 1000 on the fixture's shape (ops_benchmark, 2-core VM).
inline constexpr int64_t kLatentAttentionWorkPerThread = int64_t{1} << 17;
// KdaStepHeads and KdaStepSequences: ~20-40 µs per thread, about one wake-up of a sleeping
// thread on the VM; K3's decode row (~240 µs on one thread, 6 threads of 16) still gains, the
// fixture's (4096 units) and its 64-row prefill chunks (2^18) stay on one thread. Not tuned on
// a many-core machine. KdaStepHeads: work = heads·dk·dv, ~0.3-0.5 ns a unit.
inline constexpr int64_t kKdaStepHeadsWorkPerThread = int64_t{1} << 16;
// KdaStepSequences: work = rows·heads·dk·dv, ~0.07 ns a unit on the tiny fixture's 32×32 heads
// (the SIMD sweeps), ~0.15 ns on K3's 128×128 heads.
inline constexpr int64_t kKdaStepSequencesWorkPerThread = int64_t{1} << 18;

// σ(x) = 1 / (1 + e^-x), in f32.
inline float Sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }

// y[i] = x[i] / sqrt(mean_j x[j]² + eps) · w[i]. The mean is accumulated in double; the
// reciprocal is applied in f32. `w` may be null (weight 1). y may alias x.
void RmsNorm(const float* x, const float* w, int64_t n, float eps, float* y);
// RmsNorm on `rows` consecutive rows of length n (row r at x + r·n).
void RmsNormRows(const float* x, const float* w, int64_t rows, int64_t n, float eps, float* y);

// x[i] = x[i] · σ(x[i]) in place.
void SiluInPlace(float* x, int64_t n);

// SiTU-GLU: out[i] = β1·tanh(g[i]/β1)·σ(g[i]) · β2·tanh(u[i]/β2). out may alias g or u.
void SituGlu(const float* g, const float* u, int64_t n, float beta1, float beta2, float* out);

// In-place softmax: max subtracted, exponentials in f32, their sum in double.
void Softmax(float* x, int64_t n);

// x[i] = x[i] · scale / sqrt(Σ_j x[j]² + eps) (the epsilon is inside the root, on the sum;
// the sum is accumulated in double).
void L2Normalize(float* x, int64_t n, float eps, float scale);

// Σ a[i]·b[i] accumulated in double, in index order.
double Dot(const float* a, const float* b, int64_t n);
// y[i] += a · x[i].
void Axpy(float a, const float* x, int64_t n, float* y);
// y[i] += x[i].
void Add(const float* x, int64_t n, float* y);
// y[i] = x[i] · s[i] for the gate pattern (y may alias x).
void Mul(const float* x, const float* s, int64_t n, float* y);

// One Kimi Delta Attention recurrence step of one head (spec §3.3 step 6), in this order:
//   S[i,:] *= alpha[i]                       (decay, per key dim i)
//   e[j]    = v[j] − Σ_i k[i]·S[i,j]         (Σ over i in index order, f32)
//   S[i,j] += beta · k[i] · e[j]
//   o[j]    = Σ_i q[i]·S[i,j]                (with the updated S, Σ over i in index order, f32)
// S is [dk, dv] row-major (rows = key dim). q, k, alpha: dk; v, o: dv.
// The fast path sweeps S row by row (contiguous, vectorisable); it performs exactly the same
// f32 operations in the same order as the reference, so the two agree bit for bit.
void KdaStep(int dk, int dv, const float* q, const float* k, const float* v, const float* alpha,
             float beta, float* S, float* o);
void KdaStepReference(int dk, int dv, const float* q, const float* k, const float* v,
                      const float* alpha, float beta, float* S, float* o);
// KdaStep for `heads` independent heads laid out head-major: q/k/alpha at h·dk, v/o at h·dv,
// beta[h], S at h·dk·dv. Heads run in parallel (`threads`, 0 = OpenMP default); each head's
// arithmetic is that of KdaStep, so the result does not depend on the thread count.
void KdaStepHeads(int heads, int dk, int dv, const float* q, const float* k, const float* v,
                  const float* alpha, const float* beta, float* S, float* o, int threads);

// The rows of one sequence for KdaStepSequences: its state and the indices of its rows (into the
// row-major q/k/v/alpha/beta/o arrays), in position order.
struct KdaSequence {
  float* S = nullptr;             // [heads, dk, dv]
  const int32_t* rows = nullptr;  // row indices, in order
  int count = 0;
};

// KdaStepHeads over many rows: each sequence's state is advanced through its rows in order, one
// head at a time, so a head's S (dk·dv floats; 64 KB on K3) stays in cache across the rows
// instead of the whole state crossing memory once per row. Row r's q, k, alpha are at
// r·heads·dk (head h at + h·dk), v and o at r·heads·dv (+ h·dv), beta at r·heads (+ h).
// Every (sequence, head) pair performs, row after row, exactly KdaStep's f32 operations in
// KdaStep's order (per S element: decay, then update; per output j the sums over i in index
// order; products and sums rounded separately, no FMA), so the result equals KdaStepHeads called
// row by row, bit for bit, whatever the ISA (kernels::ActiveIsa: AVX-512 or AVX2 sweeps,
// vectorised over j only; scalar otherwise) and thread count. Pairs run in parallel (`threads`,
// 0 = OpenMP default). The sequences' states must not overlap; a row index may appear in one
// sequence only.
void KdaStepSequences(int heads, int dk, int dv, const float* q, const float* k, const float* v,
                      const float* alpha, const float* beta, const KdaSequence* seqs, int num_seqs,
                      float* o, int threads);

// Causal depthwise convolution step for one token (spec §3.3 step 2) over `channels` channels
// with kernel length `taps`:
//   y[c] = Σ_{j<taps-1} w[c·taps + j] · window[j·channels + c]  +  w[c·taps + taps-1] · x[c]
// summed in f32 in tap order (oldest first), then the window shifts: the oldest row drops and
// x becomes the newest. window is [(taps−1), channels], oldest row first. y must not alias x.
void CausalConvStep(int64_t channels, int taps, const float* w, float* window, const float* x,
                    float* y);

// Multi-head attention over a latent cache (the absorbed MLA of spec §3.4), for one query row.
// cache: T rows of `stride` floats; the first `latent` are the normalised latent c_t, the next
// `extra` are the shared extra key k_x_t. For each head h (q_abs at h·latent, q_x at h·extra):
//   s_t = (Σ_d q_abs[d]·c_t[d] + Σ_e q_x[e]·k_x_t[e]) · scale     (dots in double)
//   p   = softmax(s) over t < T,   ctx[h·latent + d] = Σ_t p_t · c_t[d]   (f32, t in order)
// Heads run in parallel (`threads`, 0 = default) with per-head arithmetic independent of it.
void LatentAttention(int heads, int64_t T, int latent, int extra, int64_t stride,
                     const float* q_abs, const float* q_x, const float* cache, float scale,
                     float* ctx, int threads);

}  // namespace coli::ops

#endif  // COLI_COMMON_OPS_OPS_H_
