// Config parsing: the released nesting, 1-based layer lists, ignored keys, and every refusal
// naming its key path. Inputs are written here (values of spec §1.2).
#include "plugins/kimi_k3/config.h"

#include <string>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace coli::k3 {
namespace {

nlohmann::json RealConfig() {
  nlohmann::json kda = nlohmann::json::array(), mla = nlohmann::json::array();
  for (int i = 1; i <= 93; ++i) {
    if (i % 4 == 0 || i == 93) mla.push_back(i);
    else kda.push_back(i);
  }
  nlohmann::json text = {
      {"model_type", "kimi_linear"}, {"hidden_size", 7168}, {"num_hidden_layers", 93},
      {"vocab_size", 163840}, {"intermediate_size", 33792}, {"first_k_dense_replace", 1},
      {"moe_layer_freq", 1}, {"num_attention_heads", 96}, {"num_key_value_heads", 96},
      {"q_lora_rank", 1536}, {"kv_lora_rank", 512}, {"qk_nope_head_dim", 128},
      {"qk_rope_head_dim", 64}, {"v_head_dim", 128}, {"mla_use_nope", true},
      {"mla_use_output_gate", true}, {"num_experts", 896}, {"num_experts_per_token", 16},
      {"num_shared_experts", 2}, {"moe_intermediate_size", 3072},
      {"routed_expert_hidden_size", 3584}, {"latent_moe_use_norm", true},
      {"moe_router_activation_func", "sigmoid"}, {"moe_renormalize", true},
      {"routed_scaling_factor", 1.0}, {"num_expert_group", 1}, {"topk_group", 1},
      {"topk_method", "noaux_tc"}, {"use_grouped_topk", true}, {"hidden_act", "situ"},
      {"activation_situ_beta", 4.0}, {"activation_situ_linear_beta", 25.0},
      {"attn_res_block_size", 12}, {"rms_norm_eps", 1e-5}, {"num_nextn_predict_layers", 0},
      {"tie_word_embeddings", false}, {"head_dim", 74}, {"rope_theta", 10000},
      {"rope_parameters", {{"rope_type", "default"}}},
      {"linear_attn_config",
       {{"num_heads", 96}, {"head_dim", 128}, {"short_conv_kernel_size", 4},
        {"gate_lower_bound", -5.0}, {"use_full_rank_gate", true}, {"kda_layers", kda},
        {"full_attn_layers", mla}}},
      {"quantization_config",
       {{"quant_method", "compressed-tensors"}, {"format", "mxfp4-pack-quantized"},
        {"config_groups",
         {{"group_0",
           {{"format", "mxfp4-pack-quantized"},
            {"weights",
             {{"num_bits", 4}, {"type", "float"}, {"strategy", "group"}, {"group_size", 32},
              {"symmetric", true}, {"dynamic", false}}}}}}}}}};
  return {{"architectures", {"KimiK3ForConditionalGeneration"}}, {"model_type", "kimi_k3"},
          {"bos_token_id", 163584}, {"eos_token_id", 163586}, {"pad_token_id", 163839},
          {"tie_word_embeddings", false}, {"text_config", text},
          {"vision_config", {{"hidden_size", 1024}}}};
}

TEST(K3Config, ParsesTheReleasedLayout) {
  auto cfg = Config::Parse(RealConfig().dump());
  ASSERT_TRUE(cfg.ok()) << cfg.status();
  EXPECT_EQ(cfg->hidden_size, 7168);
  EXPECT_EQ(cfg->num_layers, 93);
  EXPECT_EQ(cfg->mla.cache_width(), 576);
  EXPECT_EQ(cfg->kda.channels(), 12288);
  EXPECT_EQ(cfg->moe.shared_intermediate(), 6144);
  int mla = 0;
  for (int i = 0; i < 93; ++i) mla += !cfg->is_kda[i];
  EXPECT_EQ(mla, 24);
  for (int i : {3, 7, 87, 91, 92}) EXPECT_FALSE(cfg->is_kda[i]) << i;  // 0-based
  for (int i : {0, 1, 2, 4, 90}) EXPECT_TRUE(cfg->is_kda[i]) << i;
  EXPECT_TRUE(cfg->is_dense(0));
  EXPECT_FALSE(cfg->is_dense(1));
  EXPECT_EQ(cfg->bos_token_id, 163584);
  EXPECT_EQ(cfg->eos_token_ids, std::vector<int64_t>{163586});
}

TEST(K3Config, FlatConfigAndEosListAndFallbacks) {
  nlohmann::json flat = RealConfig()["text_config"];
  flat["eos_token_id"] = {163586, 163585};
  flat["bos_token_id"] = 1;
  auto cfg = Config::Parse(flat.dump());
  ASSERT_TRUE(cfg.ok()) << cfg.status();
  EXPECT_EQ(cfg->eos_token_ids, (std::vector<int64_t>{163586, 163585}));
  EXPECT_EQ(cfg->bos_token_id, 1);
}

struct Refusal {
  const char* what;
  std::function<void(nlohmann::json&)> edit;
  absl::StatusCode code;
  const char* path;
};

TEST(K3Config, RefusesUnsupportedValuesNamingTheKey) {
  const Refusal cases[] = {
      {"activation", [](auto& j) { j["text_config"]["hidden_act"] = "gelu"; },
       absl::StatusCode::kUnimplemented, "text_config.hidden_act"},
      {"router", [](auto& j) { j["text_config"]["moe_router_activation_func"] = "softmax"; },
       absl::StatusCode::kUnimplemented, "text_config.moe_router_activation_func"},
      {"groups", [](auto& j) { j["text_config"]["topk_group"] = 4; },
       absl::StatusCode::kUnimplemented, "text_config.topk_group"},
      {"rope", [](auto& j) { j["text_config"]["mla_use_nope"] = false; },
       absl::StatusCode::kUnimplemented, "text_config.mla_use_nope"},
      {"tied", [](auto& j) { j["tie_word_embeddings"] = true; },
       absl::StatusCode::kUnimplemented, "tie_word_embeddings"},
      {"gqa", [](auto& j) { j["text_config"]["num_key_value_heads"] = 8; },
       absl::StatusCode::kUnimplemented, "text_config.num_key_value_heads"},
      {"gate", [](auto& j) { j["text_config"]["linear_attn_config"]["use_full_rank_gate"] = false; },
       absl::StatusCode::kUnimplemented, "text_config.linear_attn_config.use_full_rank_gate"},
      {"expert format",
       [](auto& j) { j["text_config"]["quantization_config"]["format"] = "int4-pack-quantized"; },
       absl::StatusCode::kUnimplemented, "text_config.quantization_config.format"},
      {"group size",
       [](auto& j) {
         j["text_config"]["quantization_config"]["config_groups"]["group_0"]["weights"]
          ["group_size"] = 16;
       },
       absl::StatusCode::kUnimplemented, "group_size"},
      {"layer twice",
       [](auto& j) { j["text_config"]["linear_attn_config"]["kda_layers"].push_back(4); },
       absl::StatusCode::kInvalidArgument, "text_config.linear_attn_config.full_attn_layers[0]: layer 4 listed twice"},
      {"zero-based list",
       [](auto& j) { j["text_config"]["linear_attn_config"]["kda_layers"][0] = 0; },
       absl::StatusCode::kInvalidArgument, "kda_layers[0]"},
      {"layer missing",
       [](auto& j) { j["text_config"]["linear_attn_config"]["full_attn_layers"].erase(23); },
       absl::StatusCode::kInvalidArgument, "93"},
      {"missing key", [](auto& j) { j["text_config"].erase("hidden_size"); },
       absl::StatusCode::kInvalidArgument, "hidden_size"},
      {"wrong type", [](auto& j) { j["text_config"]["num_experts"] = "896"; },
       absl::StatusCode::kInvalidArgument, "text_config.num_experts"},
  };
  for (const Refusal& r : cases) {
    nlohmann::json j = RealConfig();
    r.edit(j);
    auto cfg = Config::Parse(j.dump(), "config.json");
    ASSERT_FALSE(cfg.ok()) << r.what;
    EXPECT_EQ(cfg.status().code(), r.code) << r.what << ": " << cfg.status();
    EXPECT_NE(cfg.status().message().find(r.path), std::string::npos) << r.what << ": " << cfg.status();
    EXPECT_NE(cfg.status().message().find("config.json"), std::string::npos) << cfg.status();
  }
}

TEST(K3Config, HugeLayerCountIsRefusedBeforeAnythingIsSizedByIt) {
  nlohmann::json j = RealConfig();
  j["text_config"]["num_hidden_layers"] = 1000000000;  // used to zero 4 GB and take minutes
  auto cfg = Config::Parse(j.dump(), "config.json");
  ASSERT_FALSE(cfg.ok());
  EXPECT_EQ(cfg.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(cfg.status().message().find(
                "text_config.num_hidden_layers: 1000000000 layers, but linear_attn_config."
                "kda_layers and full_attn_layers name 93 (layer 94, 1-based, is in neither)"),
            std::string::npos)
      << cfg.status();
}

// An eos id past the vocabulary can never be sampled: every reply ran to its token limit.
TEST(K3Config, TokenIdsOutsideTheVocabularyAreRefused) {
  const struct {
    const char* key;
    nlohmann::json value;
    const char* message;
  } cases[] = {
      {"eos_token_id", 163840, "eos_token_id: 163840 is not a token id (vocab_size 163840)"},
      {"eos_token_id", {163586, 999999}, "eos_token_id: 999999 is not a token id"},
      {"eos_token_id", -1, "eos_token_id: -1 is not a token id"},
      {"bos_token_id", 200000, "bos_token_id: 200000 is not a token id"},
      {"pad_token_id", 163840, "pad_token_id: 163840 is not a token id"},
  };
  for (const auto& c : cases) {
    nlohmann::json j = RealConfig();
    j["text_config"].erase(c.key);
    j[c.key] = c.value;
    auto cfg = Config::Parse(j.dump(), "config.json");
    ASSERT_FALSE(cfg.ok()) << c.key << " " << c.value;
    EXPECT_EQ(cfg.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(cfg.status().message().find(c.message), std::string::npos) << cfg.status();
  }
  nlohmann::json j = RealConfig();
  j["eos_token_id"] = 163839;  // the last row is a token
  EXPECT_TRUE(Config::Parse(j.dump()).ok());
}

TEST(K3Config, DerivedWidthsThatOverflowAnIntAreRefused) {
  struct Case {
    const char* what;
    void (*edit)(nlohmann::json&);
    const char* message;
  };
  const Case cases[] = {
      // 1e9 × 128 wrapped to a negative q_proj row count; 33554433 × 128 wraps to exactly 128.
      {"kda heads",
       [](auto& j) { j["text_config"]["linear_attn_config"]["num_heads"] = 1000000000; },
       "text_config.linear_attn_config: num_heads × head_dim = 128000000000 is too large"},
      {"kda head_dim",
       [](auto& j) { j["text_config"]["linear_attn_config"]["head_dim"] = 33554433; },
       "num_heads × head_dim = 3221225568 is too large"},
      {"shared", [](auto& j) { j["text_config"]["moe_intermediate_size"] = 1 << 30; },
       "text_config: num_shared_experts × moe_intermediate_size = 2147483648 is too large"},
      {"q head",
       [](auto& j) {
         j["text_config"]["qk_nope_head_dim"] = 1 << 30;
         j["text_config"]["qk_rope_head_dim"] = 1 << 30;
       },
       "qk_nope_head_dim + qk_rope_head_dim = 2147483648 is too large"},
  };
  for (const Case& c : cases) {
    nlohmann::json j = RealConfig();
    c.edit(j);
    auto cfg = Config::Parse(j.dump(), "config.json");
    ASSERT_FALSE(cfg.ok()) << c.what;
    EXPECT_EQ(cfg.status().code(), absl::StatusCode::kInvalidArgument) << c.what;
    EXPECT_NE(cfg.status().message().find(c.message), std::string::npos)
        << c.what << ": " << cfg.status();
  }
}

TEST(K3Config, MalformedJsonAndMissingFile) {
  EXPECT_EQ(Config::Parse("{\"text_config\": ").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Config::LoadDir("/nonexistent-k3").status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace coli::k3
