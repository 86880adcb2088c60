// plugins/kimi_k3/weights: every non-expert tensor of a Kimi K3 snapshot, checked and resident.
//
//   COLI_ASSIGN_OR_RETURN(auto snap, coli::st::Snapshot::Open(dir, {.extra_dirs = ...}));
//   COLI_ASSIGN_OR_RETURN(std::unique_ptr<Weights> w,
//                         Weights::Load(*snap, cfg, options, [](int done, int total) {...}));
//
// Spec §2.3. Names are the Hugging Face names verbatim; the `language_model.` prefix of the
// released multimodal snapshot may be present or absent (probed once on layer 0's
// input_layernorm). Every tensor is checked for dtype and shape before it is read (DATA_LOSS
// "tensor 'language_model.model.layers.3.self_attn.A_log': expected ..."), a missing one is
// NOT_FOUND naming it. Where §2.3 says BF16, F32 and F16 are accepted too (a full-precision
// save_pretrained snapshot, spec §9.8; the embedding BF16 or F32), converted exactly to f32
// before the load-time quantization below; the F32 slots stay F32-only. Vision tensors (`vision_tower.*`, `mm_projector.*`) are never looked at,
// so their shards are never opened.
//
// Residency (spec §7.2): the big matrices are quantized at load per ModelOptions —
// `bits` (KDA q/k/v/o/g, latent down/up, shared experts, dense MLP), `mla_bits` (MLA q_a, q_b,
// kv_a, kv_b, o, g), `head_bits` (lm_head); 32 = f32, 8 = int8 per row, 4 = int4-g64 (int8
// when cols % 64 != 0, as colibri does). Small or sensitive tensors stay f32: norms, the router
// and its bias, conv taps, dt_bias, A_log, o_norm, f_a/f_b, b_proj, AttnRes vectors. The
// embedding is not held: EmbedRow() preads one row per token. Routed experts are not loaded
// here (expert_source.h). Loading runs `options.load_threads` jobs in parallel.
//
// Repacked containers (container.h, spec §4.4): a matrix with a `<name>.qs` sidecar is used as
// stored (int8 or int4-g64), bit-identical to quantizing the source at load. An unset bits
// switch keeps the container's format; an explicit one must match it, except 4 on int8, which
// downcasts to int4-g64 here (kernels::QuantizedMatrix::DowncastInt8ToInt4); anything else is
// INVALID_ARGUMENT naming the tensor. options.mmap (K3_MMAP) maps those U8 matrices and their
// F32 sidecars read-only instead of copying them (Linear::mapped) and refuses, naming the
// tensor, whatever would need conversion (a BF16 matrix, a downcast, a misaligned sidecar);
// small f32 matrices (f_a/f_b, b_proj, router) and MLA's transposed K_hᵀ are still copies.
#ifndef COLI_PLUGINS_KIMI_K3_WEIGHTS_H_
#define COLI_PLUGINS_KIMI_K3_WEIGHTS_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/kernels/kernels.h"
#include "common/safetensors/safetensors.h"
#include "plugins/kimi_k3/config.h"
#include "plugins/kimi_k3/options.h"

namespace coli::k3 {

// A resident weight matrix [rows, cols] (y = W·x) in its load-time format: owned (m), or with
// K3_MMAP a view into a read-only mapping of a container shard that Weights keeps alive.
struct Linear {
  kernels::QuantizedMatrix m;
  std::optional<kernels::MatrixView> mapped;
  kernels::MatrixView view() const { return mapped ? *mapped : m.view(); }
  int64_t rows() const { return mapped ? mapped->rows : m.rows(); }
  int64_t cols() const { return mapped ? mapped->cols : m.cols(); }
  size_t mapped_bytes() const { return mapped ? kernels::ViewBytes(*mapped) : 0; }
};

struct KdaWeights {
  Linear q_proj, k_proj, v_proj;   // [C, D]
  Linear f_a_proj, f_b_proj;       // [rank, D], [C, rank] (f32)
  Linear b_proj;                   // [H, D] (f32)
  Linear g_proj;                   // [C, D] output gate
  Linear o_proj;                   // [D, C]
  std::vector<float> q_conv, k_conv, v_conv;  // [C, taps], taps oldest → newest
  // exp(A_log[h]) per head. DISAGREEMENT (spec §3.9): the checkpoint stores A_log as
  // [head_dim] (K3: [128]) = the vendor's per-head [H] parameter zero-padded; the vendor uses
  // it per head, so we take the first H entries (a stored length of H is accepted too).
  std::vector<float> a_exp;        // [H]
  std::vector<float> dt_bias;      // [C]
  std::vector<float> o_norm;       // [head_dim], shared by all heads
};

struct MlaWeights {
  Linear q_a_proj;                 // [q_lora, D]
  std::vector<float> q_a_norm;     // [q_lora]
  Linear q_b_proj;                 // [H·(nope+extra), q_lora]
  Linear kv_a_proj;                // [latent+extra, D]
  std::vector<float> kv_a_norm;    // [latent]
  // kv_b_proj split per head for the absorbed form (spec §3.4): k_absorb[h] = K_hᵀ
  // [latent, nope] (so q_abs = K_hᵀ q_nope is a plain matmul) and v_up[h] = V_h [v, latent].
  std::vector<Linear> k_absorb, v_up;
  Linear g_proj;                   // [H·v, D]
  Linear o_proj;                   // [D, H·v]
};

struct DenseMlpWeights {
  Linear gate_proj, up_proj;       // [I, D]
  Linear down_proj;                // [D, I]
};

struct MoeWeights {
  Linear router;                   // [E, D] (f32)
  std::vector<float> correction_bias;  // [E], selection only
  Linear latent_down;              // [latent, D]
  std::vector<float> latent_norm;  // [latent]
  Linear latent_up;                // [D, latent]
  bool has_shared = false;
  Linear shared_gate, shared_up;   // [S, D]
  Linear shared_down;              // [D, S]
};

struct LayerWeights {
  std::vector<float> input_norm, post_attention_norm;  // [D]
  // AttnRes score vectors s = res_norm.weight ⊙ res_proj.weight[0, :] (spec §3.2), [D].
  std::vector<float> attn_res_score, mlp_res_score;
  bool kda = true;
  KdaWeights kda_w;                // when kda
  MlaWeights mla_w;                // when !kda
  bool dense = false;
  DenseMlpWeights dense_w;         // when dense
  MoeWeights moe_w;                // when !dense
};

class Weights {
 public:
  // Called from the loading threads (serialised), done = 1…total.
  using Progress = std::function<void(int done, int total)>;

  // Loads layers [0, num_layers) (all when options.layers < 0) plus the globals.
  static absl::StatusOr<std::unique_ptr<Weights>> Load(st::Snapshot& snapshot, const Config& cfg,
                                                       const ModelOptions& options,
                                                       const Progress& progress = nullptr);

  // "language_model." or "".
  const std::string& prefix() const { return prefix_; }
  // prefix + "model.layers.<i>."
  std::string LayerPrefix(int layer) const;
  int num_layers() const { return static_cast<int>(layers.size()); }

  // Reads row `token` of embed_tokens from disk into out[0, D) as f32.
  // INVALID_ARGUMENT for a token outside [0, vocab).
  absl::Status EmbedRow(int64_t token, float* out) const;

  // K3_MMAP: DATA_LOSS naming the shard when a mapped shard was removed, replaced, resized or
  // modified since load (st::SharedMapping::CheckUnchanged); OK without mappings.
  absl::Status CheckMappings() const;

  std::vector<LayerWeights> layers;
  std::vector<float> final_norm;       // model.norm [D]
  std::vector<float> output_res_score; // output_attn_res_norm ⊙ output_attn_res_proj [D]
  Linear lm_head;                      // [V, D]
  size_t resident_bytes = 0;           // heap bytes of the matrices
  size_t mapped_bytes = 0;             // K3_MMAP: matrix bytes used in place from the shards

 private:
  std::string prefix_;
  std::vector<std::shared_ptr<const st::SharedMapping>> mappings_;  // K3_MMAP
  st::Snapshot* snapshot_ = nullptr;
  const st::TensorInfo* embed_ = nullptr;
  const io::File* embed_file_ = nullptr;
  int64_t hidden_ = 0;
  int64_t vocab_ = 0;
};

// Maps the bits switches to a format: 32 → f32, 8 → int8 per row, 4 → int4-g64 (int8 when
// cols % 64 != 0). INVALID_ARGUMENT naming `what` for any other value.
absl::StatusOr<kernels::WeightFormat> FormatForBits(int bits, int64_t cols, const char* what);

// Probes the tensor-name prefix of a snapshot: "language_model." or "" (NOT_FOUND naming both
// candidate names when neither exists).
absl::StatusOr<std::string> DetectPrefix(const st::Snapshot& snapshot);

}  // namespace coli::k3

#endif  // COLI_PLUGINS_KIMI_K3_WEIGHTS_H_
