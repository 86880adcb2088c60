# Tests of the streaming expert store (plugins/kimi_k3/expert_store.*). Small snapshots written
# by the test itself (common/safetensors Writer); a few MB, seconds on 2 cores.
coli_cc_test(NAME expert_store_test
  SRCS ${CMAKE_CURRENT_LIST_DIR}/expert_store_test.cc
  DEPS kimi_k3_expert_store coli_safetensors coli_io coli_status absl::strings)

# The store inside the forward pass (logits bit-identical to PreadExpertSource) on the tiny
# fixture built by k3_tiny_fixture.
coli_cc_test(NAME expert_store_model_test
  SRCS ${CMAKE_CURRENT_LIST_DIR}/expert_store_model_test.cc
  DEPS kimi_k3_expert_store kimi_k3_core coli_status absl::strings)
if(TARGET k3_tiny_fixture)
  add_dependencies(expert_store_model_test k3_tiny_fixture)
endif()
