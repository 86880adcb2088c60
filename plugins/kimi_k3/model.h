// plugins/kimi_k3/model: the Kimi K3 text model — load a snapshot, run the forward pass.
//
//   ModelOptions opt;                         // K3_* switches, read by the caller (CLI/host)
//   COLI_ASSIGN_OR_RETURN(std::unique_ptr<Model> model, Model::Load(dir, opt, progress));
//   std::unique_ptr<Session> s = model->NewSession();          // session.h
//   COLI_ASSIGN_OR_RETURN(std::vector<float> logits, s->Prefill(ids));
//   COLI_ASSIGN_OR_RETURN(logits, s->Step(next_id));
//
// Layer schedule (spec §1.3, K3): 93 layers; MLA where (i+1) ∈ full_attn_layers (3, 7, …, 87,
// 91, 92 0-based: every 4th plus the last), KDA elsewhere; layer 0 has the dense SiTU MLP,
// layers 1…92 a LatentMoE. AttnRes snapshots open at i % attn_res_block_size == 0.
//
// The forward pass (spec §3.1, readable top to bottom in Model::Forward, model.cc): per row
//   prefix = embedding (or K3_X0 row); blocks = []
//   for each layer i:
//     h = MIX(blocks, prefix)                                  (attention site)
//     if i % B == 0: blocks += [prefix]; prefix = none          (close the previous block)
//     a = ATTN_i(RMSNorm(h)); prefix = a or prefix + a
//     f = FFN_i(RMSNorm(MIX(blocks, prefix)))                 (FFN site)
//     prefix += f                                               ("hidden after layer i")
//   logits = lm_head · RMSNorm(MIX(blocks, prefix))             (output site)
// There is no ordinary residual: earlier blocks reach later layers only through MIX.
//
// Per-sequence state lives in SequenceState (KDA matrices + conv windows, MLA latent caches);
// Forward takes a batch of rows that may come from several sequences, each row naming its
// state and position, so a scheduler can batch decode steps of many sessions. Rows of one
// sequence must be consecutive positions in order. The model itself is immutable after Load
// and may be shared by sessions on different threads as long as each SequenceState is used
// by one call at a time — except the ExpertSource, which serialises its own calls
// (PreadExpertSource is not thread-safe: one Forward at a time per model).
#ifndef COLI_PLUGINS_KIMI_K3_MODEL_H_
#define COLI_PLUGINS_KIMI_K3_MODEL_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/safetensors/safetensors.h"
#include "plugins/kimi_k3/config.h"
#include "plugins/kimi_k3/expert_source.h"
#include "plugins/kimi_k3/kda.h"
#include "plugins/kimi_k3/latent_moe.h"
#include "plugins/kimi_k3/mla.h"
#include "plugins/kimi_k3/options.h"
#include "plugins/kimi_k3/weights.h"

namespace coli::k3 {

class Session;

// The recurrent and cached state of one sequence: per layer a KdaState (KDA layers) or an
// MlaCache (MLA layers); the other entry of each layer is empty.
struct SequenceState {
  std::vector<KdaState> kda;
  std::vector<MlaCache> mla;
};

// Wall time spent per part of the forward pass, in seconds (accumulated by callers).
struct Timings {
  double attention = 0;  // KDA + MLA sublayers
  double moe = 0;        // FFN sublayers (dense MLP + LatentMoE incl. expert reads)
  double head = 0;       // final mix, norm, lm_head
  double mix = 0;        // AttnRes mixes and layer norms
  double embed = 0;      // embedding rows from disk
  MoeStats moe_stats;
};

class Model {
 public:
  // Called from loading threads (serialised): tensors loaded so far / total.
  using Progress = Weights::Progress;
  // Makes the expert source once the snapshot is open (default: PreadExpertSource).
  using ExpertSourceFactory = std::function<absl::StatusOr<std::unique_ptr<ExpertSource>>(
      st::Snapshot& snapshot, const Config& cfg, const std::string& prefix, int num_layers)>;

  // Opens `dir` (an HF snapshot folder), parses config.json, checks and loads every weight.
  // Errors: NOT_FOUND (files, tensors), DATA_LOSS (dtype/shape/corruption, naming the tensor),
  // UNIMPLEMENTED (config values; naming the key), INVALID_ARGUMENT (bad options).
  static absl::StatusOr<std::unique_ptr<Model>> Load(const std::string& dir,
                                                     const ModelOptions& options,
                                                     const Progress& progress = nullptr,
                                                     ExpertSourceFactory experts = nullptr);
  ~Model();

  const Config& config() const { return cfg_; }
  const ModelOptions& options() const { return options_; }
  const Weights& weights() const { return *weights_; }
  // Layers actually run (options.layers truncates the stack; the head still runs).
  int num_layers() const { return weights_->num_layers(); }
  int64_t hidden_size() const { return cfg_.hidden_size; }
  int64_t vocab_size() const { return cfg_.vocab_size; }

  // A fresh session (session.h) with its own state.
  std::unique_ptr<Session> NewSession() const;
  // A zeroed state for one sequence.
  SequenceState NewState() const;
  // Makes `s` (a state of this model) what NewState gives, keeping the KDA buffers where they
  // are: a reset session then does not allocate and page-fault its recurrent state anew (~434 MB
  // on K3). The MLA caches are freed (they grow with the conversation a session held).
  void ResetState(SequenceState& s) const;

  // Embedding rows (read from disk) of `tokens` into out [n, D].
  absl::Status Embed(std::span<const int32_t> tokens, float* out) const;

  // One row of a forward batch.
  struct Row {
    SequenceState* state;
    int64_t position;     // 0-based position in its sequence
    bool want_logits;     // run the head on this row
  };
  // Runs rows through the stack. x0: [n, D] input rows (embeddings or injected K3_X0 rows).
  // logits: [rows with want_logits, V] in row order (may be null when none is wanted).
  // trace: when non-null, [n, num_layers, D] — the hidden state after every layer, token-major.
  // `interrupt`, when given, is asked between layers: true stops the pass with CANCELLED and
  // the rows' states are left half-advanced (the caller restores them; Session does). It must be
  // cheap and must not run model work.
  absl::Status Forward(std::span<const Row> rows, const float* x0, float* logits, float* trace,
                       Timings* timings,
                       const std::function<bool()>* interrupt = nullptr) const;

 private:
  Model() = default;
  Config cfg_;
  ModelOptions options_;
  std::unique_ptr<st::Snapshot> snapshot_;
  std::unique_ptr<Weights> weights_;
  std::unique_ptr<ExpertSource> experts_;
  Compute compute_;
};

}  // namespace coli::k3

#endif  // COLI_PLUGINS_KIMI_K3_MODEL_H_
