#include "plugins/kimi_k3/config.h"

#include <algorithm>
#include <limits>
#include <optional>
#include <set>

#include "absl/strings/str_cat.h"
#include "common/io/io.h"
#include "common/json/json.h"
#include "common/status/status.h"

namespace coli::k3 {
namespace {

using json::Cursor;

absl::Status Unsupported(const Cursor& at, std::string_view key, const std::string& what) {
  std::string where = json::JoinKey(at.path(), key);
  return absl::UnimplementedError(
      absl::StrCat(at.source().empty() ? "" : at.source() + ": ", where, ": ", what));
}
absl::Status Invalid(const Cursor& at, std::string_view key, const std::string& what) {
  std::string where = json::JoinKey(at.path(), key);
  return absl::InvalidArgumentError(
      absl::StrCat(at.source().empty() ? "" : at.source() + ": ", where, ": ", what));
}

// A required positive int that fits an int.
absl::StatusOr<int> PositiveInt(const Cursor& c, std::string_view key) {
  COLI_ASSIGN_OR_RETURN(int64_t v, c.Int(key));
  if (v <= 0 || v > (int64_t{1} << 30)) return Invalid(c, key, absl::StrCat("must be positive, got ", v));
  return static_cast<int>(v);
}

// A string key that, when present, must equal `want`.
absl::Status RequireString(const Cursor& c, std::string_view key, const std::string& want) {
  COLI_ASSIGN_OR_RETURN(std::optional<std::string> v, c.OptionalString(key));
  if (v && *v != want)
    return Unsupported(c, key, absl::StrCat("'", *v, "' is not supported (this engine implements '",
                                            want, "')"));
  return absl::OkStatus();
}

// A boolean key that, when present, must equal `want`.
absl::Status RequireBool(const Cursor& c, std::string_view key, bool want) {
  COLI_ASSIGN_OR_RETURN(std::optional<bool> v, c.OptionalBool(key));
  if (v && *v != want)
    return Unsupported(c, key, absl::StrCat(*v ? "true" : "false",
                                            " is not supported (this engine implements ",
                                            want ? "true" : "false", ")"));
  return absl::OkStatus();
}

// An integer key that, when present, must equal `want`.
absl::Status RequireInt(const Cursor& c, std::string_view key, int64_t want) {
  COLI_ASSIGN_OR_RETURN(std::optional<int64_t> v, c.OptionalInt(key));
  if (v && *v != want)
    return Unsupported(c, key,
                       absl::StrCat(*v, " is not supported (this engine implements ", want, ")"));
  return absl::OkStatus();
}

// token id keys: root first, then text_config; a number or (eos) a list of numbers, each a row
// of the vocabulary (an eos id past it could never be sampled: every reply would run to its
// token limit without a word).
absl::StatusOr<std::vector<int64_t>> TokenIds(const Cursor& root, const Cursor& text,
                                              std::string_view key, int64_t vocab_size) {
  for (const Cursor* c : {&root, &text}) {
    COLI_ASSIGN_OR_RETURN(std::optional<Cursor> m, c->OptionalMember(key));
    if (!m) continue;
    std::vector<int64_t> ids;
    if (m->is_array()) {
      COLI_ASSIGN_OR_RETURN(ids, m->AsIntArray());
    } else {
      COLI_ASSIGN_OR_RETURN(int64_t id, m->AsInt());
      ids.push_back(id);
    }
    for (int64_t id : ids) {
      if (id < 0 || id >= vocab_size) {
        return Invalid(*c, key,
                       absl::StrCat(id, " is not a token id (vocab_size ", vocab_size, ")"));
      }
    }
    return ids;
  }
  return std::vector<int64_t>{};
}

absl::Status CheckQuantization(const Cursor& text) {
  COLI_ASSIGN_OR_RETURN(std::optional<Cursor> q, text.OptionalObject("quantization_config"));
  if (!q) return absl::OkStatus();
  // Only the routed experts are quantized (MXFP4, group 32) in the released checkpoint (§1.4).
  COLI_RETURN_IF_ERROR(RequireString(*q, "quant_method", "compressed-tensors"));
  COLI_RETURN_IF_ERROR(RequireString(*q, "format", "mxfp4-pack-quantized"));
  COLI_ASSIGN_OR_RETURN(std::optional<Cursor> groups, q->OptionalObject("config_groups"));
  if (!groups) return absl::OkStatus();
  COLI_ASSIGN_OR_RETURN(std::vector<std::string> names, groups->Keys());
  for (const std::string& name : names) {
    COLI_ASSIGN_OR_RETURN(Cursor g, groups->Object(name));
    COLI_RETURN_IF_ERROR(RequireString(g, "format", "mxfp4-pack-quantized"));
    COLI_ASSIGN_OR_RETURN(std::optional<Cursor> w, g.OptionalObject("weights"));
    if (!w) continue;
    COLI_RETURN_IF_ERROR(RequireInt(*w, "num_bits", 4));
    COLI_RETURN_IF_ERROR(RequireString(*w, "type", "float"));
    COLI_RETURN_IF_ERROR(RequireString(*w, "strategy", "group"));
    COLI_RETURN_IF_ERROR(RequireInt(*w, "group_size", 32));
    COLI_RETURN_IF_ERROR(RequireBool(*w, "symmetric", true));
    COLI_RETURN_IF_ERROR(RequireBool(*w, "dynamic", false));
    COLI_ASSIGN_OR_RETURN(std::optional<Cursor> act, g.OptionalMember("input_activations"));
    if (act) return Unsupported(g, "input_activations", "activation quantization is not supported");
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<Config> Config::Parse(std::string_view json_text, std::string_view source) {
  COLI_ASSIGN_OR_RETURN(nlohmann::json doc, json::Parse(json_text, source));
  Cursor root = Cursor::Root(doc, std::string(source));
  if (!root.is_object()) return root.Error("expected an object");
  Cursor text = root;
  COLI_ASSIGN_OR_RETURN(std::optional<Cursor> tc, root.OptionalMember("text_config"));
  if (tc && tc->is_object()) text = *tc;

  Config cfg;
  COLI_ASSIGN_OR_RETURN(std::optional<std::string> model_type, text.OptionalString("model_type"));
  if (model_type && *model_type != "kimi_linear" && *model_type != "kimi_k3")
    return Unsupported(text, "model_type",
                       absl::StrCat("'", *model_type, "' is not a Kimi K3 text model"));
  COLI_ASSIGN_OR_RETURN(cfg.hidden_size, text.Int("hidden_size"));
  COLI_ASSIGN_OR_RETURN(cfg.num_layers, PositiveInt(text, "num_hidden_layers"));
  COLI_ASSIGN_OR_RETURN(cfg.vocab_size, text.Int("vocab_size"));
  COLI_ASSIGN_OR_RETURN(cfg.intermediate_size, text.Int("intermediate_size"));
  if (cfg.hidden_size <= 0) return Invalid(text, "hidden_size", "must be positive");
  if (cfg.vocab_size <= 0) return Invalid(text, "vocab_size", "must be positive");
  COLI_ASSIGN_OR_RETURN(int64_t first_dense, text.IntOr("first_k_dense_replace", 1));
  if (first_dense < 0 || first_dense > cfg.num_layers)
    return Invalid(text, "first_k_dense_replace", "out of range");
  cfg.first_k_dense_replace = static_cast<int>(first_dense);
  COLI_RETURN_IF_ERROR(RequireInt(text, "moe_layer_freq", 1));
  COLI_ASSIGN_OR_RETURN(double eps, text.DoubleOr("rms_norm_eps", 1e-5));
  if (!(eps > 0)) return Invalid(text, "rms_norm_eps", "must be positive");
  cfg.rms_norm_eps = static_cast<float>(eps);

  // Activation: SiTU-GLU everywhere (§3.0).
  COLI_RETURN_IF_ERROR(RequireString(text, "hidden_act", "situ"));
  COLI_ASSIGN_OR_RETURN(double b1, text.DoubleOr("activation_situ_beta", 4.0));
  COLI_ASSIGN_OR_RETURN(double b2, text.DoubleOr("activation_situ_linear_beta", 25.0));
  if (!(b1 > 0)) return Invalid(text, "activation_situ_beta", "must be positive");
  if (!(b2 > 0)) return Invalid(text, "activation_situ_linear_beta", "must be positive");
  cfg.situ_beta = static_cast<float>(b1);
  cfg.situ_linear_beta = static_cast<float>(b2);
  COLI_ASSIGN_OR_RETURN(cfg.attn_res_block_size, PositiveInt(text, "attn_res_block_size"));
  COLI_RETURN_IF_ERROR(RequireBool(text, "tie_word_embeddings", false));
  COLI_RETURN_IF_ERROR(RequireBool(root, "tie_word_embeddings", false));

  // MLA (§3.4): NoPE with an output gate, no GQA.
  COLI_ASSIGN_OR_RETURN(cfg.mla.num_heads, PositiveInt(text, "num_attention_heads"));
  COLI_RETURN_IF_ERROR(RequireInt(text, "num_key_value_heads", cfg.mla.num_heads));
  COLI_ASSIGN_OR_RETURN(cfg.mla.q_lora_rank, PositiveInt(text, "q_lora_rank"));
  COLI_ASSIGN_OR_RETURN(cfg.mla.kv_lora_rank, PositiveInt(text, "kv_lora_rank"));
  COLI_ASSIGN_OR_RETURN(cfg.mla.qk_nope_head_dim, PositiveInt(text, "qk_nope_head_dim"));
  COLI_ASSIGN_OR_RETURN(cfg.mla.qk_rope_head_dim, PositiveInt(text, "qk_rope_head_dim"));
  COLI_ASSIGN_OR_RETURN(cfg.mla.v_head_dim, PositiveInt(text, "v_head_dim"));
  COLI_RETURN_IF_ERROR(RequireBool(text, "mla_use_nope", true));
  COLI_RETURN_IF_ERROR(RequireBool(text, "mla_use_output_gate", true));

  // KDA (§3.3).
  COLI_ASSIGN_OR_RETURN(Cursor lin, text.Object("linear_attn_config"));
  COLI_ASSIGN_OR_RETURN(cfg.kda.num_heads, PositiveInt(lin, "num_heads"));
  COLI_ASSIGN_OR_RETURN(cfg.kda.head_dim, PositiveInt(lin, "head_dim"));
  COLI_ASSIGN_OR_RETURN(cfg.kda.conv_size, PositiveInt(lin, "short_conv_kernel_size"));
  COLI_ASSIGN_OR_RETURN(double lb, lin.DoubleOr("gate_lower_bound", -5.0));
  if (!(lb < 0)) return Unsupported(lin, "gate_lower_bound", "only a negative lower bound is supported");
  cfg.kda.gate_lower_bound = static_cast<float>(lb);
  COLI_RETURN_IF_ERROR(RequireBool(lin, "use_full_rank_gate", true));
  COLI_ASSIGN_OR_RETURN(std::vector<int64_t> kda_layers, lin.IntArray("kda_layers"));
  COLI_ASSIGN_OR_RETURN(std::vector<int64_t> full_layers, lin.IntArray("full_attn_layers"));
  // Every layer is in exactly one list, so a num_hidden_layers beyond the lists' length is
  // refused before anything is sized by it (1e9 layers used to zero 4 GB and take minutes).
  if (static_cast<size_t>(cfg.num_layers) > kda_layers.size() + full_layers.size()) {
    const std::set<int64_t> listed(kda_layers.begin(), kda_layers.end());
    int64_t missing = 1;
    while (listed.count(missing) != 0 ||
           std::find(full_layers.begin(), full_layers.end(), missing) != full_layers.end()) {
      ++missing;
    }
    return Invalid(text, "num_hidden_layers",
                   absl::StrCat(cfg.num_layers, " layers, but linear_attn_config.kda_layers and ",
                                "full_attn_layers name ", kda_layers.size() + full_layers.size(),
                                " (layer ", missing, ", 1-based, is in neither)"));
  }
  std::vector<int> kind(cfg.num_layers, 0);  // 1 = KDA, 2 = MLA
  for (auto [list, key, value] : {std::tuple{&kda_layers, "kda_layers", 1},
                                  std::tuple{&full_layers, "full_attn_layers", 2}}) {
    for (size_t j = 0; j < list->size(); ++j) {
      const int64_t one_based = (*list)[j];
      // A cursor at the list so the message names "…kda_layers[j]".
      COLI_ASSIGN_OR_RETURN(Cursor list_at, lin.Array(key));
      COLI_ASSIGN_OR_RETURN(Cursor at, list_at.At(j));
      auto error = [&](const std::string& what) { return at.Error(what); };
      if (one_based < 1 || one_based > cfg.num_layers)
        return error( absl::StrCat("layer ", one_based, " outside 1…", cfg.num_layers,
                                               " (the lists are 1-based)"));
      if (kind[one_based - 1] != 0)
        return error(absl::StrCat("layer ", one_based, " listed twice"));
      kind[one_based - 1] = value;
    }
  }
  cfg.is_kda.assign(cfg.num_layers, false);
  for (int i = 0; i < cfg.num_layers; ++i) {
    if (kind[i] == 0)
      return Invalid(lin, "kda_layers",
                     absl::StrCat("layer ", i + 1, " (1-based) is in neither kda_layers nor full_attn_layers"));
    cfg.is_kda[i] = kind[i] == 1;
  }

  // LatentMoE (§3.6).
  COLI_ASSIGN_OR_RETURN(cfg.moe.num_experts, PositiveInt(text, "num_experts"));
  COLI_ASSIGN_OR_RETURN(cfg.moe.top_k, PositiveInt(text, "num_experts_per_token"));
  if (cfg.moe.top_k > cfg.moe.num_experts)
    return Invalid(text, "num_experts_per_token", "larger than num_experts");
  COLI_ASSIGN_OR_RETURN(int64_t shared, text.IntOr("num_shared_experts", 0));
  if (shared < 0 || shared > 64) return Invalid(text, "num_shared_experts", "out of range");
  cfg.moe.num_shared_experts = static_cast<int>(shared);
  COLI_ASSIGN_OR_RETURN(cfg.moe.intermediate, PositiveInt(text, "moe_intermediate_size"));
  COLI_ASSIGN_OR_RETURN(cfg.moe.latent, PositiveInt(text, "routed_expert_hidden_size"));
  COLI_ASSIGN_OR_RETURN(cfg.moe.latent_norm, text.BoolOr("latent_moe_use_norm", true));
  COLI_ASSIGN_OR_RETURN(cfg.moe.renormalize, text.BoolOr("moe_renormalize", true));
  COLI_ASSIGN_OR_RETURN(double rsf, text.DoubleOr("routed_scaling_factor", 1.0));
  cfg.moe.routed_scaling_factor = static_cast<float>(rsf);
  COLI_RETURN_IF_ERROR(RequireString(text, "moe_router_activation_func", "sigmoid"));
  COLI_RETURN_IF_ERROR(RequireString(text, "topk_method", "noaux_tc"));
  COLI_RETURN_IF_ERROR(RequireInt(text, "num_expert_group", 1));
  COLI_RETURN_IF_ERROR(RequireInt(text, "topk_group", 1));
  COLI_RETURN_IF_ERROR(CheckQuantization(text));
  // Widths the engine derives from two keys are ints: one that does not fit is refused here
  // rather than wrapped into a wrong (negative, or worse, plausible) tensor shape.
  const struct {
    const Cursor& at;
    const char* what;
    int64_t value;
  } derived[] = {
      {lin, "num_heads × head_dim", int64_t{cfg.kda.num_heads} * cfg.kda.head_dim},
      {text, "qk_nope_head_dim + qk_rope_head_dim",
       int64_t{cfg.mla.qk_nope_head_dim} + cfg.mla.qk_rope_head_dim},
      {text, "kv_lora_rank + qk_rope_head_dim",
       int64_t{cfg.mla.kv_lora_rank} + cfg.mla.qk_rope_head_dim},
      {text, "num_shared_experts × moe_intermediate_size",
       int64_t{cfg.moe.num_shared_experts} * cfg.moe.intermediate},
  };
  for (const auto& d : derived) {
    if (d.value > std::numeric_limits<int32_t>::max()) {
      return d.at.Error(absl::StrCat(d.what, " = ", d.value, " is too large (at most 2^31 - 1)"));
    }
  }
  // Ignored on purpose (§1.2): head_dim (hidden/heads, meaningless), rope_theta,
  // rope_parameters, rope_scaling (no RoPE anywhere), max_position_embeddings (informational),
  // num_nextn_predict_layers (no MTP head is used for decoding), use_grouped_topk (a no-op
  // with one group), vision_config and the wrapper's multimodal keys.

  COLI_ASSIGN_OR_RETURN(std::vector<int64_t> bos,
                        TokenIds(root, text, "bos_token_id", cfg.vocab_size));
  if (bos.size() > 1) return Invalid(root, "bos_token_id", "expected one id");
  if (!bos.empty()) cfg.bos_token_id = bos[0];
  COLI_ASSIGN_OR_RETURN(cfg.eos_token_ids, TokenIds(root, text, "eos_token_id", cfg.vocab_size));
  COLI_ASSIGN_OR_RETURN(std::vector<int64_t> pad,
                        TokenIds(root, text, "pad_token_id", cfg.vocab_size));
  if (!pad.empty()) cfg.pad_token_id = pad[0];
  return cfg;
}

absl::StatusOr<Config> Config::LoadDir(const std::string& dir) {
  const std::string path = dir + "/config.json";
  COLI_ASSIGN_OR_RETURN(std::string text, io::ReadFileToString(path, 64 << 20));
  return Parse(text, path);
}

}  // namespace coli::k3
