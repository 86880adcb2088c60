// plugins/kimi_k3/config: the typed Kimi K3 configuration read from a snapshot's config.json.
//
//   COLI_ASSIGN_OR_RETURN(coli::k3::Config cfg, coli::k3::Config::LoadDir(model_dir));
//   if (cfg.is_kda[i]) ...;  cfg.mla.kv_lora_rank; cfg.moe.top_k;
//
// Spec §1. The released file nests the language model under `text_config` (hyper-parameters are
// read from there when it is an object, else from the root); `bos_token_id` / `eos_token_id`
// come from the root with `text_config` as fallback, and `eos_token_id` may be a list.
// `kda_layers` / `full_attn_layers` are 1-based; together they must name every layer exactly
// once. Keys that carry no meaning for this model (`head_dim`, `rope_theta`,
// `rope_parameters`, `rope_scaling`, the vision tower, generation/training bookkeeping) are
// ignored. Every value the engine does not implement (another activation, router function,
// grouped routing, a tied embedding, RoPE in MLA, a non-MXFP4 expert format, ...) is refused
// with UNIMPLEMENTED naming the key path, e.g.
//   "config.json: text_config.hidden_act: 'gelu' is not supported (this engine implements 'situ')".
// Malformed values (wrong type, missing required key, inconsistent layer lists) are
// INVALID_ARGUMENT with the path.
#ifndef COLI_PLUGINS_KIMI_K3_CONFIG_H_
#define COLI_PLUGINS_KIMI_K3_CONFIG_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace coli::k3 {

struct KdaConfig {
  int num_heads = 0;         // H (96)
  int head_dim = 0;          // d (128), for q, k and v
  int conv_size = 0;         // short_conv_kernel_size (4)
  float gate_lower_bound = -5.0f;
  int channels() const { return num_heads * head_dim; }
};

struct MlaConfig {
  int num_heads = 0;         // 96
  int q_lora_rank = 0;       // 1536
  int kv_lora_rank = 0;      // 512 (latent)
  int qk_nope_head_dim = 0;  // 128
  int qk_rope_head_dim = 0;  // 64 ("extra" dims; NOT rotated)
  int v_head_dim = 0;        // 128
  int q_head_dim() const { return qk_nope_head_dim + qk_rope_head_dim; }
  int cache_width() const { return kv_lora_rank + qk_rope_head_dim; }  // 576
};

struct MoeConfig {
  int num_experts = 0;        // 896
  int top_k = 0;              // 16
  int num_shared_experts = 0; // 2 (fused, inner width num_shared·intermediate)
  int intermediate = 0;       // moe_intermediate_size (3072)
  int latent = 0;             // routed_expert_hidden_size (3584)
  bool latent_norm = true;    // latent_moe_use_norm
  bool renormalize = true;    // moe_renormalize
  float routed_scaling_factor = 1.0f;
  int shared_intermediate() const { return num_shared_experts * intermediate; }
};

struct Config {
  int64_t hidden_size = 0;      // D (7168)
  int num_layers = 0;           // L (93)
  int64_t vocab_size = 0;       // V (163840)
  int64_t intermediate_size = 0;  // dense MLP inner width (33792)
  int first_k_dense_replace = 1;  // layers < this use the dense MLP
  float rms_norm_eps = 1e-5f;
  float situ_beta = 4.0f;         // activation_situ_beta (gate branch)
  float situ_linear_beta = 25.0f; // activation_situ_linear_beta (up branch)
  int attn_res_block_size = 12;
  KdaConfig kda;
  MlaConfig mla;
  MoeConfig moe;
  std::vector<bool> is_kda;       // per 0-based layer; false = MLA
  int64_t bos_token_id = -1;      // -1 when absent
  std::vector<int64_t> eos_token_ids;
  int64_t pad_token_id = -1;

  bool is_dense(int layer) const { return layer < first_k_dense_replace; }

  // Parses config.json text; `source` names it in messages.
  static absl::StatusOr<Config> Parse(std::string_view json_text,
                                      std::string_view source = "config.json");
  // Reads <dir>/config.json.
  static absl::StatusOr<Config> LoadDir(const std::string& dir);
};

}  // namespace coli::k3

#endif  // COLI_PLUGINS_KIMI_K3_CONFIG_H_
