# The kimi_k3 plugin: build/plugins/libcoli_kimi_k3.so (owner: host). Glue from the plugin ABI to
# kimi_k3_core (model, sessions), kimi_k3_chat (XTML), the streaming expert store, the tokenizer
# and the sampler.
coli_plugin(NAME kimi_k3
  SRCS ${CMAKE_CURRENT_LIST_DIR}/plugin_entry.cc ${CMAKE_CURRENT_LIST_DIR}/prompt_logprob_memo.cc
  DEPS kimi_k3_core kimi_k3_chat kimi_k3_expert_store coli_tokenizer coli_sampling coli_log
       coli_status coli_plugin_api kimi_k3_switches nlohmann_json::nlohmann_json)
