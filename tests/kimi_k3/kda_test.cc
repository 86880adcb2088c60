// KDA layer (plugins/kimi_k3/kda) on the tiny fixture (build/fixtures/k3_tiny: 4 heads of 32,
// conv 4 taps): the head-at-a-time recurrence (KdaRows over ops::KdaStepSequences) against the
// row-by-row path the layer ran before — per row the conv windows, SiLU, L2 norms and
// ops::KdaStepHeads over all heads, kept here as the reference — bit for bit: states (S and the
// conv windows) and read-outs, one prefill chunk, token at a time, interleaved sequences
// (batched decode), the replay of a record, and several thread counts. The float64 agreement of
// the layer itself is K3Layers.KdaAloneMatchesReference (model_test.cc).
#include "plugins/kimi_k3/kda.h"

#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <span>
#include <vector>

#include "common/ops/ops.h"
#include "gtest/gtest.h"
#include "plugins/kimi_k3/model.h"

namespace coli::k3 {
namespace {

bool SameBits(std::span<const float> a, std::span<const float> b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

void ExpectSameState(const KdaState& got, const KdaState& want) {
  EXPECT_TRUE(SameBits(got.S, want.S)) << "S";
  EXPECT_TRUE(SameBits(got.q_win, want.q_win)) << "q conv window";
  EXPECT_TRUE(SameBits(got.k_win, want.k_win)) << "k conv window";
  EXPECT_TRUE(SameBits(got.v_win, want.v_win)) << "v conv window";
}

// The layer's state update as it ran before the head-at-a-time sweep: row after row, the conv +
// SiLU + L2 norms, then the delta rule of all heads (ops::KdaStepHeads). o: [rows, C] read-out.
void RowByRowReference(const KdaConfig& cfg, const KdaWeights& w, const KdaRowInputs& in,
                       int64_t rows, KdaState& st, std::vector<float>& o) {
  const int H = cfg.num_heads, d = cfg.head_dim;
  const int64_t C = cfg.channels();
  std::vector<float> q(C), k(C), v(C);
  o.assign(rows * C, 0.0f);
  for (int64_t r = 0; r < rows; ++r) {
    ops::CausalConvStep(C, cfg.conv_size, w.q_conv.data(), st.q_win.data(), in.q.data() + r * C,
                        q.data());
    ops::CausalConvStep(C, cfg.conv_size, w.k_conv.data(), st.k_win.data(), in.k.data() + r * C,
                        k.data());
    ops::CausalConvStep(C, cfg.conv_size, w.v_conv.data(), st.v_win.data(), in.v.data() + r * C,
                        v.data());
    ops::SiluInPlace(q.data(), C);
    ops::SiluInPlace(k.data(), C);
    ops::SiluInPlace(v.data(), C);
    for (int h = 0; h < H; ++h) {
      ops::L2Normalize(q.data() + h * d, d, 1e-6f, 1.0f / std::sqrt(static_cast<float>(d)));
      ops::L2Normalize(k.data() + h * d, d, 1e-6f, 1.0f);
    }
    ops::KdaStepHeads(H, d, d, q.data(), k.data(), v.data(), in.alpha.data() + r * C,
                      in.beta.data() + r * H, st.S.data(), o.data() + r * C, 1);
  }
}

class K3Kda : public ::testing::Test {
 protected:
  void SetUp() override {
    ModelOptions o;
    o.threads = 1;
    auto m = Model::Load(K3_TEST_TINY, o);
    ASSERT_TRUE(m.ok()) << m.status();
    model_ = std::move(m).value();
    ASSERT_TRUE(cfg().is_kda[kLayer]);
  }
  const Config& cfg() const { return model_->config(); }
  const KdaWeights& w() const { return model_->weights().layers[kLayer].kda_w; }
  std::vector<float> RandomRows(int n, uint32_t seed) const {
    std::vector<float> x(static_cast<size_t>(n) * model_->hidden_size());
    std::mt19937 rng(seed);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    for (float& v : x) v = nd(rng);
    return x;
  }
  KdaState Fresh() const {
    KdaState st;
    st.Reset(cfg().kda);
    return st;
  }
  // KdaForward of rows [0, n) of x on `states` (one pointer per row) with `threads`.
  std::vector<float> Forward(const float* x, int n, std::span<KdaState* const> states,
                             int threads) const {
    Compute c;
    c.matmul.threads = threads;
    c.threads = threads;
    std::vector<float> y(static_cast<size_t>(n) * model_->hidden_size());
    const absl::Status s = KdaForward(cfg(), w(), c, x, n, states, y.data());
    EXPECT_TRUE(s.ok()) << s;
    return y;
  }

  static constexpr int kLayer = 0;
  std::unique_ptr<Model> model_;
};

// A 32-row prefill chunk, token at a time and chunks of 7 give the same output and state bit for
// bit, and that state is the row-by-row reference's, fed with the chunk's recorded inputs.
TEST_F(K3Kda, ChunkEqualsTokenAtATimeAndTheRowByRowPath) {
  const int T = 32, D = static_cast<int>(model_->hidden_size());
  const auto x = RandomRows(T, 3);
  KdaRowInputs record;
  KdaState chunk = Fresh();
  chunk.record = &record;
  const std::vector<float> y_chunk = Forward(x.data(), T, std::vector<KdaState*>(T, &chunk), 2);
  chunk.record = nullptr;
  ASSERT_EQ(record.rows(cfg().kda), T);

  KdaState single = Fresh();
  std::vector<float> y_single;
  for (int r = 0; r < T; ++r) {
    KdaState* one[] = {&single};
    const auto y = Forward(x.data() + r * D, 1, one, 1);
    y_single.insert(y_single.end(), y.begin(), y.end());
  }
  EXPECT_TRUE(SameBits(y_chunk, y_single)) << "chunk 32 vs token at a time: output";
  ExpectSameState(chunk, single);

  KdaState sevens = Fresh();
  std::vector<float> y_sevens;
  for (int r0 = 0; r0 < T; r0 += 7) {
    const int n = std::min(7, T - r0);
    const auto y = Forward(x.data() + r0 * D, n, std::vector<KdaState*>(n, &sevens), 3);
    y_sevens.insert(y_sevens.end(), y.begin(), y.end());
  }
  EXPECT_TRUE(SameBits(y_chunk, y_sevens)) << "chunk 32 vs chunks of 7: output";
  ExpectSameState(sevens, chunk);

  KdaState ref = Fresh();
  std::vector<float> o_ref;
  RowByRowReference(cfg().kda, w(), record, T, ref, o_ref);
  ExpectSameState(chunk, ref);
  // The read-out itself (before the output norm and projection), through KdaRows.
  KdaState rows = Fresh();
  const int64_t C = cfg().kda.channels();
  std::vector<float> scratch(3 * T * C), o(T * C);
  KdaRows(cfg().kda, w(), 2, T, record.q.data(), record.k.data(), record.v.data(),
          record.alpha.data(), record.beta.data(), std::vector<KdaState*>(T, &rows), scratch.data(),
          o.data());
  EXPECT_TRUE(SameBits(o, o_ref)) << "read-out vs the row-by-row path";
  ExpectSameState(rows, ref);
  // Not vacuous: the state moved.
  EXPECT_FALSE(SameBits(ref.S, Fresh().S));
}

// Rows of three sequences interleaved in one call (batched decode and a mixed batch) equal each
// sequence run on its own; each state's record holds exactly its own rows, in order.
TEST_F(K3Kda, InterleavedSequencesEqualSeparateRuns) {
  const int D = static_cast<int>(model_->hidden_size());
  // Row owners: 0 1 2 0 0 1 2 2 2 1 0 1 (every sequence's rows in order).
  const std::vector<int> owner = {0, 1, 2, 0, 0, 1, 2, 2, 2, 1, 0, 1};
  const int n = static_cast<int>(owner.size());
  const auto x = RandomRows(n, 5);
  // A non-zero starting state for each sequence (a prefix run first).
  const auto prefix = RandomRows(6, 6);  // sequence s runs rows [s, 2s + 1)
  KdaState start[3];
  for (int s = 0; s < 3; ++s) {
    start[s] = Fresh();
    Forward(prefix.data() + s * D, 1 + s, std::vector<KdaState*>(1 + s, &start[s]), 1);
  }
  KdaState batched[3] = {start[0], start[1], start[2]};
  KdaRowInputs records[3];
  std::vector<KdaState*> states(n);
  for (int r = 0; r < n; ++r) states[r] = &batched[owner[r]];
  for (int s = 0; s < 3; ++s) batched[s].record = &records[s];
  const auto y = Forward(x.data(), n, states, 2);
  for (int s = 0; s < 3; ++s) {
    SCOPED_TRACE(::testing::Message() << "sequence " << s);
    batched[s].record = nullptr;
    KdaState alone = start[s];
    std::vector<float> xs;
    std::vector<int> rows;
    for (int r = 0; r < n; ++r) {
      if (owner[r] != s) continue;
      xs.insert(xs.end(), x.begin() + r * D, x.begin() + (r + 1) * D);
      rows.push_back(r);
    }
    const int m = static_cast<int>(rows.size());
    const auto ys = Forward(xs.data(), m, std::vector<KdaState*>(m, &alone), 1);
    for (int i = 0; i < m; ++i) {
      EXPECT_TRUE(SameBits(std::span(y).subspan(rows[i] * D, D), std::span(ys).subspan(i * D, D)))
          << "row " << rows[i];
    }
    ExpectSameState(batched[s], alone);
    ASSERT_EQ(records[s].rows(cfg().kda), m);
    KdaState ref = start[s];
    std::vector<float> o_ref;
    RowByRowReference(cfg().kda, w(), records[s], m, ref, o_ref);
    ExpectSameState(batched[s], ref);
  }
}

// KdaReplay of a record (more rows than its 64-row block, so the blocks' seam is crossed; and a
// prefix of it) leaves the state the forward pass left, and the row-by-row reference agrees.
TEST_F(K3Kda, ReplayEqualsForwardAndTheRowByRowPath) {
  const int T = 70;
  const auto x = RandomRows(T, 8);
  KdaState before = Fresh();
  Forward(x.data(), 3, std::vector<KdaState*>(3, &before), 1);  // a non-zero start
  KdaRowInputs record;
  KdaState fwd = before;
  fwd.record = &record;
  Forward(x.data(), T, std::vector<KdaState*>(T, &fwd), 2);
  fwd.record = nullptr;
  for (int64_t rows : {int64_t{T}, int64_t{65}, int64_t{5}}) {
    SCOPED_TRACE(::testing::Message() << rows << " rows replayed");
    KdaState replayed = before;
    ASSERT_TRUE(KdaReplay(cfg().kda, w(), 2, record, rows, replayed, kLayer).ok());
    KdaState ref = before;
    std::vector<float> o_ref;
    RowByRowReference(cfg().kda, w(), record, rows, ref, o_ref);
    ExpectSameState(replayed, ref);
    if (rows == T) ExpectSameState(replayed, fwd);
  }
  // Refusal: more rows than recorded leaves the state as it was.
  KdaState st = before;
  const absl::Status s = KdaReplay(cfg().kda, w(), 1, record, T + 1, st, kLayer);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  ExpectSameState(st, before);
}

}  // namespace
}  // namespace coli::k3
