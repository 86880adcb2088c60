// plugins/kimi_k3/session: one conversation's state on a loaded Model.
//
//   std::unique_ptr<Session> s = model->NewSession();
//   COLI_ASSIGN_OR_RETURN(std::vector<float> logits, s->Prefill(prompt_ids, progress, cancel));
//   int32_t next = coli::sampling::Greedy(logits);
//   COLI_ASSIGN_OR_RETURN(logits, s->Step(next));
//   s->Reset();                                  // back to an empty sequence
//
// Holds the per-sequence state (KDA recurrent matrices and conv windows, MLA latent caches),
// the record of every token it has consumed, and its timings. Prompts are fed in chunks of
// ModelOptions::chunk rows (K3_CHUNK; forced to 1 when a trace is written): every dense matmul
// is batched over the chunk, each unique expert is read once per chunk, recurrent state still
// advances token by token, and the head runs only on the chunk's last row (on every row when
// logits_path is set) — spec §3.8; the logits are bit-identical to chunk 1.
// No BOS is added anywhere: callers pass exactly the ids to run (the vendor chat renderer adds
// none, spec §10).
// Validation outputs (ModelOptions): trace_path receives [T, layers, D] f32 token-major for
// every row this session runs; logits_path receives [T, V] f32 for every prefill position.
// Both files are truncated when the session is created and appended to afterwards.
//
// Threading: a Session is used by one thread at a time (the host serialises calls per
// session). Failure: an error inside a forward pass leaves the state half-advanced; the
// session then refuses further work (FAILED_PRECONDITION) until Reset(). Cancellation is
// honoured between chunks (CANCELLED); the chunks already run stay valid and recorded.
// Mixed passes (Riders): a prefill may carry decode rows of OTHER sessions of the same model in
// its chunk passes — one Model::Forward for the chunk's rows and theirs, each row at its own
// sequence's position, so the dense weights and the union of routed experts stream once for
// both (vLLM's chunked prefill); every kernel is row-independent, so each row's logits are
// bit-identical to the same row run alone (docs/status/batching.md).
#ifndef COLI_PLUGINS_KIMI_K3_SESSION_H_
#define COLI_PLUGINS_KIMI_K3_SESSION_H_

#include <cstdint>
#include <cstdio>
#include <functional>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "plugins/kimi_k3/model.h"

namespace coli::k3 {

// The recurrent part of a sequence's state at one position, with the logits after it: enough to
// return to that position later, since the MLA latent caches only grow (returning truncates
// them) and AttnRes carries nothing across positions.
struct Checkpoint {
  std::vector<int32_t> tokens;  // the record up to the position (position = tokens.size())
  std::vector<KdaState> kda;    // per layer, as SequenceState::kda
  std::vector<float> logits;    // after tokens.back() ([V])
  size_t bytes() const;
};

// The whole per-sequence state at one position: the Checkpoint (tokens, KDA states, logits)
// plus the MLA latent cache rows of those tokens. Unlike a Checkpoint it does not need the
// session's own MLA caches, so ANY fresh session of the same model can continue from it
// (Session::RestorePrefix; the model-wide prefix cache, prefix_cache.h, holds these).
struct PrefixState {
  Checkpoint at;                        // at.logits may be empty (then the position must be fed)
  std::vector<std::vector<float>> mla;  // per layer: [position, width] rows (empty for KDA layers)
  size_t bytes() const;
};

// What a StepAll pass leaves behind on request so that a prefix of its rows can be re-applied
// from a checkpoint without a forward pass (Session::Replay; speculative decoding drops rejected
// draft rows with it, spec_decode.h): per KDA layer the inputs of every row's state update
// (kda.h, KdaRowInputs: 4C + H floats per row — K3: 13.6 MB per row over its 69 KDA layers),
// plus where the chunk started and its tokens. MLA layers need nothing (their caches only grow:
// the rows of the prefix are already right), nor does AttnRes or the MoE (no state).
struct ReplayRecord {
  int64_t position = -1;          // the session's position before the chunk; -1 = empty
  std::vector<int32_t> tokens;    // the chunk
  std::vector<KdaRowInputs> kda;  // per layer (empty for MLA layers)
  size_t bytes() const;
  // Empty again; keeps the buffers' capacity (refilled by the next StepAll).
  void Clear();
};

class Session;

// Decode rows of other sessions that ride along a prefill's chunk passes (Session::Prefill's
// `riders`). Called on the prefilling thread, between the chunk's embedding and its pass, i.e.
// wherever the caller holds the model for the pass (the kimi_k3 plugin: its forward lock).
class Riders {
 public:
  virtual ~Riders() = default;
  // Before a chunk pass of `chunk_rows` prompt rows: appends the decode rows to carry in it
  // (sessions[i] runs tokens[i] at its own position, as Session::StepBatch); appending none
  // runs the chunk alone. Not asked under K3_TRACE (each session's trace stays its own).
  virtual void Board(int64_t chunk_rows, std::vector<Session*>* sessions,
                     std::vector<int32_t>* tokens) = 0;
  // After Board appended rows, exactly once: `ran` false = the rows were refused before the
  // pass (`logits` holds why, as StepBatch would refuse them; nothing changed, they may run on
  // their own); `ran` true = the pass ran: each row's logits [V] in boarding order (its token is
  // on its session's record), or the pass's error (then every session of the pass, the
  // prefilling one included, is broken, as StepBatch documents).
  virtual void Alight(absl::StatusOr<std::vector<std::vector<float>>> logits, bool ran) = 0;
};

class Session {
 public:
  // Tokens done so far / total of this call.
  using Progress = std::function<void(int64_t done, int64_t total)>;
  // Returns true to stop (checked between chunks).
  using Cancel = std::function<bool()>;
  // Every row's logits of a chunk, in order: `n` rows of [V] (prompt logprobs).
  using RowLogits = std::function<absl::Status(std::span<const float> logits, int64_t n)>;

  explicit Session(const Model& model);
  ~Session();
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  // Runs `tokens` (at least one) and returns the logits [V] after the last one.
  // `cancel` is asked before every chunk (it may do other work there, e.g. let other sessions'
  // passes run). `interrupt`, when given, is also asked between the layers of a chunk: true
  // drops the chunk in flight (the state returns to the chunk's start: a copy of the recurrent
  // state is taken per chunk for that, the MLA caches are truncated) and answers CANCELLED, with
  // the chunks before it kept. It must be cheap and must not run model work.
  // `riders`, when given, is asked before every chunk pass for decode rows of other sessions to
  // carry in it (Riders). A pass with riders aboard takes no interrupt: `interrupt` is still
  // asked between its layers, but a true answer lets the pass finish (the riders' states cannot
  // return to the chunk's start) and Prefill answers CANCELLED right after it, that chunk kept.
  // Riders are checked as StepBatch checks its rows (plus: not this session); a refusal runs
  // the chunk alone. The pass's Timings are split by rows: the chunk's rows to this session,
  // one row's share to each rider.
  absl::StatusOr<std::vector<float>> Prefill(std::span<const int32_t> tokens,
                                             const Progress& progress = nullptr,
                                             const Cancel& cancel = nullptr,
                                             const Cancel& interrupt = nullptr,
                                             Riders* riders = nullptr,
                                             const RowLogits* row_logits = nullptr);
  // (`row_logits`: the head runs on every row and each chunk's logits go there before the next
  // chunk; no riders board then.)
  // Like Prefill on injected input rows x0 [n, D] instead of embeddings (K3_X0). The token
  // record gets -1 for these positions.
  absl::StatusOr<std::vector<float>> PrefillRows(std::span<const float> x0,
                                                 const Progress& progress = nullptr,
                                                 const Cancel& cancel = nullptr);
  // One decode step: runs `token`, returns the logits [V] after it.
  absl::StatusOr<std::vector<float>> Step(int32_t token);
  // One decode step of several sessions of ONE model in one forward pass (continuous
  // batching): sessions[i] runs tokens[i] at its own position; returns each one's logits [V]
  // in order, bit-identical to sessions[i]->Step(tokens[i]) (every kernel is row-independent).
  // Dense matmuls run once for all rows and each routed expert is read once for the union of
  // the rows' selections. Checked before anything runs, nothing changed on refusal:
  // INVALID_ARGUMENT (sizes differ, none given, a session twice, sessions of different models),
  // FAILED_PRECONDITION / PERMISSION_DENIED (a session unusable, as Step), RESOURCE_EXHAUSTED
  // (a session at K3_MAXT); the message names the row. A failed pass marks every session of the
  // batch broken. The Forward timings are split evenly over the sessions. When a trace is
  // written (K3_TRACE) the sessions run one at a time (Step), so the trace stays per session.
  static absl::StatusOr<std::vector<std::vector<float>>> StepBatch(
      std::span<Session* const> sessions, std::span<const int32_t> tokens);
  // Several decode steps in ONE chunk, one forward pass whatever K3_CHUNK says (speculative
  // verify, spec_decode.h): runs `tokens` (at least one) at positions position()… and returns
  // the logits after EVERY one of them, [tokens.size(), V] row-major, row i bit-identical to
  // what Step(tokens[i]) would return after tokens[0..i) (every kernel is row-independent); with
  // every_row = false the head runs on the last row only and [V] comes back. Refusals as Step,
  // plus INVALID_ARGUMENT for no tokens and RESOURCE_EXHAUSTED when the chunk would pass K3_MAXT
  // (nothing runs). Nothing goes to the K3_LOGITS file (decode rows never do); under K3_TRACE
  // the rows are traced like prefill rows. With `record`, it is refilled with the pass's replay
  // inputs (see Replay; its previous content is dropped; emptied again when the pass fails).
  absl::StatusOr<std::vector<float>> StepAll(std::span<const int32_t> tokens, bool every_row = true,
                                             ReplayRecord* record = nullptr);
  // Puts the session exactly where it would be after consuming `before`'s record and then the
  // first `rows` tokens of `record`'s chunk (0 ≤ rows ≤ chunk length), without a forward pass:
  // every KDA layer's state is `before`'s, advanced over the recorded rows by KdaReplay (the
  // forward pass's own per-row code: bit-identical states and conv windows), the MLA caches are
  // cut to the new position (their rows of the prefix are causal, already right), the token
  // record is `before`'s plus those tokens. `record` must come from a StepAll run at `before`'s
  // position on this session, whose tokens still lead the record past it (e.g. a verify chunk,
  // then Replay of its accepted prefix; or later a shorter prefix again); else
  // FAILED_PRECONDITION naming what differs, and nothing changes. Clears `broken()`. The time
  // goes to timings().attention. The caller keeps the logits (the session holds none).
  absl::Status Replay(const Checkpoint& before, const ReplayRecord& record, int64_t rows);
  // Forgets everything (state zeroed, record cleared); keeps the timings, and the KDA state's
  // buffers (Model::ResetState).
  void Reset();
  // The state at the current position; `logits` are the ones after the last token.
  Checkpoint TakeCheckpoint(std::vector<float> logits) const;
  // The same into `c`, reusing its buffers when their sizes match (a speculative-decoding verify
  // takes one per verify: on K3 434 MB that would otherwise be allocated and faulted in anew).
  // c->logits is left empty.
  void TakeCheckpointInto(Checkpoint* c) const;
  // Returns to `c`'s position: its tokens must be a prefix of the record (the MLA rows before
  // it are then the ones it was taken with), else FAILED_PRECONDITION and nothing changes.
  absl::Status Restore(const Checkpoint& c);
  // The whole state at the current position (copies; `logits` are the ones after the last token,
  // or empty).
  PrefixState TakePrefixState(std::vector<float> logits) const;
  // Replaces the whole state with `p`'s (taken on a session of the same model; any record of
  // this session is dropped): the session is then exactly where the session `p` was taken from
  // was, and continues bit for bit like it. FAILED_PRECONDITION naming the layer when `p` does
  // not fit this model (layer kinds, state or row sizes), RESOURCE_EXHAUSTED past K3_MAXT;
  // nothing changes then. Clears broken().
  absl::Status RestorePrefix(const PrefixState& p);
  // RestorePrefix(src.TakePrefixState({})) without the intermediate copy: this session takes
  // `src`'s record and state (another session of the same model), its same-sized KDA buffers
  // overwritten where they are. INVALID_ARGUMENT for itself or another model's session,
  // FAILED_PRECONDITION when `src` is broken or does not fit; nothing changes then. Clears
  // broken().
  absl::Status CopyFrom(const Session& src);

  int64_t position() const { return static_cast<int64_t>(tokens_.size()); }
  // True after a failed pass, until Reset() or Restore().
  bool broken() const { return broken_; }
  const std::vector<int32_t>& tokens() const { return tokens_; }
  const Timings& timings() const { return timings_; }
  const Model& model() const { return model_; }
  SequenceState& state() { return state_; }

 private:
  absl::Status CheckUsable() const;
  // StepBatch's checks of decode rows (`what` names the caller in messages); `busy`, when
  // given, is a session that may not be among them (the prefilling one).
  static absl::Status CheckDecodeRows(std::span<Session* const> sessions,
                                      std::span<const int32_t> tokens, const char* what,
                                      const Session* busy);
  // A chunk pass with riders aboard (Chunked; riders checked): the chunk's rows x [n, D] /
  // `ids` of this session, then one row per rider (embedded: rider_x [riders, D], in
  // rider_embed seconds); tells `board` the outcome and returns the chunk's logits as Run does.
  // `stop` is set when `interrupt` answered true during the pass (not taken: see Prefill).
  absl::StatusOr<std::vector<float>> RunMixed(const float* x, std::span<const int32_t> ids,
                                              std::span<Session* const> riders,
                                              std::span<const int32_t> rider_tokens,
                                              const float* rider_x, double rider_embed,
                                              Riders& board, const Cancel* interrupt, bool* stop);
  // Runs rows [n, D] at positions position()…; records `ids`; returns the last row's logits
  // (every row's, [n, V], when `every_row`).
  absl::StatusOr<std::vector<float>> Run(const float* x, std::span<const int32_t> ids, bool prefill,
                                         bool every_row = false,
                                         const Cancel* interrupt = nullptr);
  absl::StatusOr<std::vector<float>> Chunked(
      int64_t n,
      const std::function<absl::Status(int64_t, int64_t, float*, std::vector<int32_t>*)>& rows,
      const Progress& progress, const Cancel& cancel, const Cancel& interrupt = nullptr,
      Riders* riders = nullptr, const RowLogits* row_logits = nullptr);

  const Model& model_;
  SequenceState state_;
  std::vector<int32_t> tokens_;
  Timings timings_;
  bool broken_ = false;
  FILE* trace_file_ = nullptr;
  FILE* logits_file_ = nullptr;
};

}  // namespace coli::k3

#endif  // COLI_PLUGINS_KIMI_K3_SESSION_H_
