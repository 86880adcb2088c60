// plugins/kimi_k3/kda: Kimi Delta Attention, the linear-attention layer (69 of K3's 93 layers).
//
// Spec §3.3. Shapes (K3): D = 7168 input, H = 96 heads of d = 128, C = H·d = 12288 channels
// (channel c = h·d + j), conv taps 4, decay rank r (= f_a_proj rows; K3: 128 = d).
//   q̃, k̃, ṽ = Wq x, Wk x, Wv x;  graw = Wfb (Wfa x);  blog = Wb x;  gout = Wg x
//   q, k, v  = SiLU(causal depthwise conv4 over the raw projections)        (per channel)
//   q_h = L2N(q_h)·d^-1/2,  k_h = L2N(k_h)        (L2N(x) = x / sqrt(Σx² + 1e-6))
//   α[c] = exp(lb · σ(exp(A_log[h]) · (graw[c] + dt_bias[c])))   lb = gate_lower_bound (−5)
//   β_h = σ(blog[h])
//   S_h ← Diag(α_h) S_h;  e = v_h − S_hᵀ k_h;  S_h ← S_h + β_h k_h eᵀ;  o_h = S_hᵀ q_h
//   o'_h = RMSNorm(o_h; o_norm, rms_norm_eps) ⊙ σ(gout_h);  a = Wo o'
// State per layer and sequence (KdaState): S [H, d, d] (rows = key dim) and the last taps−1
// raw projections of q, k and v (conv windows). Constant in sequence length.
// A batch of rows is processed with every matmul batched. Then KdaRows: the per-row work that
// does not read S (conv windows in row order, SiLU, L2 norms) for all rows, and the recurrence
// one head at a time over all of a sequence's rows in order (ops::KdaStepSequences), so a head's
// S (d² floats, 64 KB on K3) stays in cache across a prefill chunk instead of the whole state
// (6.3 MB per layer) crossing memory once per row. Each head's arithmetic per row is unchanged
// and heads are independent, so results do not depend on how rows are chunked or batched.
// Replay (speculative decoding, spec_decode.h): on request (KdaState::record) KdaForward keeps
// the inputs of each row's state update — the raw projections q̃, k̃, ṽ that enter the conv
// windows, α and β — and KdaReplay advances a state over those rows again with the same
// KdaRows: no matmul, no weight read but the conv taps; bit-identical to the forward pass.
// Per row 4C + H floats (K3: 196,992 bytes per layer, 13.6 MB over the 69 KDA layers).
#ifndef COLI_PLUGINS_KIMI_K3_KDA_H_
#define COLI_PLUGINS_KIMI_K3_KDA_H_

#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "plugins/kimi_k3/compute.h"
#include "plugins/kimi_k3/config.h"
#include "plugins/kimi_k3/weights.h"

namespace coli::k3 {

// The inputs of the per-row state update (KdaRows) of one layer, row after row, as KdaForward
// computed them: what KdaReplay needs to advance a state over the same rows again.
struct KdaRowInputs {
  std::vector<float> q, k, v;  // [rows, C] raw projections q̃, k̃, ṽ (the conv inputs)
  std::vector<float> alpha;    // [rows, C] decay gate α
  std::vector<float> beta;     // [rows, H] β
  // Rows held (beta.size() / H).
  int64_t rows(const KdaConfig& c) const;
  // OK when the buffers hold at least `rows` rows of c's widths, all of the same count;
  // FAILED_PRECONDITION naming the layer (index `layer` of the stack) otherwise.
  absl::Status Check(const KdaConfig& c, int64_t rows, int layer) const;
  void Clear();  // no rows; keeps the capacity (a verify's record is refilled every verify)
  size_t bytes() const;
};

struct KdaState {
  std::vector<float> S;                    // [H, d, d]
  std::vector<float> q_win, k_win, v_win;  // [(taps − 1), C], oldest first
  // When set, KdaForward appends the update inputs of every row it runs on this state (not
  // owned: whoever sets it around a pass clears it after — Session::StepAll; copies of the state
  // must not be run while it is set).
  KdaRowInputs* record = nullptr;
  void Reset(const KdaConfig& c);  // zero state (sized for c); no record
};

// x: [n, D] (the RMS-normalised layer input), out: [n, D]. states[r] is row r's sequence
// state; rows of one sequence must appear in position order.
absl::Status KdaForward(const Config& cfg, const KdaWeights& w, const Compute& c, const float* x,
                        int n, std::span<KdaState* const> states, float* out);

// The state updates and read-outs of n rows (spec §3.3 steps 2, 3, 6), shared by KdaForward and
// KdaReplay so the two cannot drift. states[r] is row r's state; rows of one state appear in
// position order (rows of several states may interleave: batched decode). First, row by row, the
// conv windows of the row's state take the raw projections q_raw, k_raw, v_raw ([n, C]) and give
// q, k, v (conv + SiLU, per-head L2 norms, q scaled by d^-1/2) into scratch (3·n·C floats); then
// the delta rule with alpha [n, C] and beta [n, H] advances every state over its rows, a head at
// a time (ops::KdaStepSequences), and writes o [n, C] = Sᵀq. Bit-identical to advancing the
// states row by row; `threads` for the heads (results do not depend on it).
void KdaRows(const KdaConfig& cfg, const KdaWeights& w, int threads, int64_t n, const float* q_raw,
             const float* k_raw, const float* v_raw, const float* alpha, const float* beta,
             std::span<KdaState* const> states, float* scratch, float* o);

// Advances `st` over rows [0, rows) of `in` exactly as KdaForward advanced the state they were
// recorded on (KdaRows; the read-out is discarded). FAILED_PRECONDITION (from
// KdaRowInputs::Check, naming `layer`) when `in` holds fewer rows; `st` is then unchanged.
absl::Status KdaReplay(const KdaConfig& cfg, const KdaWeights& w, int threads,
                       const KdaRowInputs& in, int64_t rows, KdaState& st, int layer);

}  // namespace coli::k3

#endif  // COLI_PLUGINS_KIMI_K3_KDA_H_
