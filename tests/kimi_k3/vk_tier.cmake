# Tests of the Vulkan expert tier (plugins/kimi_k3/vk_tier.*, common/vk ExpertChain,
# shaders/situ_glu.comp; owner: vktier). Run on lavapipe; skip only without any Vulkan device.
coli_cc_test(NAME k3_vk_tier_test
  SRCS ${CMAKE_CURRENT_LIST_DIR}/vk_tier_test.cc
  DEPS kimi_k3_vk_tier kimi_k3_expert_store kimi_k3_core coli_vk coli_kernels coli_ops
       coli_safetensors coli_status absl::strings)
if(TARGET k3_tiny_fixture)
  add_dependencies(k3_vk_tier_test k3_tiny_fixture)
endif()
