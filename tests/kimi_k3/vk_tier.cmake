# Tests of the Vulkan expert tier (plugins/kimi_k3/vk_tier.*, common/vk ExpertChain,
# shaders/situ_glu.comp; owner: vktier). Run on lavapipe; skip only without any Vulkan device.
coli_cc_test(NAME k3_vk_tier_test
  SRCS ${CMAKE_CURRENT_LIST_DIR}/vk_tier_test.cc
       ${CMAKE_CURRENT_LIST_DIR}/reference_util.cc
  DEPS kimi_k3_vk_tier kimi_k3_expert_store kimi_k3_core coli_vk coli_kernels coli_ops
       coli_safetensors coli_json coli_status absl::strings)
# reference_util.cc (RelL2) is built with the definitions k3_model_test gives it.
target_compile_definitions(k3_vk_tier_test PRIVATE
  K3_TEST_PYTHON="${COLI_PYTHON}"
  K3_TEST_REF="${PROJECT_SOURCE_DIR}/tools/k3/k3_ref.py"
  PROJECT_TOOLS_K3="${PROJECT_SOURCE_DIR}/tools/k3"
  K3_TEST_TINY="${CMAKE_BINARY_DIR}/fixtures/k3_tiny"
  K3_TEST_TIES="${CMAKE_BINARY_DIR}/fixtures/k3_tiny_ties")
if(TARGET k3_tiny_fixture)
  add_dependencies(k3_vk_tier_test k3_tiny_fixture)
endif()
# The same tests with resident experts staged into device-local memory (COLI_VK_STAGING=1: the
# discrete-GPU upload path, exercised on lavapipe).
gtest_discover_tests(k3_vk_tier_test
  TEST_PREFIX "staging."
  WORKING_DIRECTORY ${PROJECT_BINARY_DIR}
  PROPERTIES LABELS unit ENVIRONMENT COLI_VK_STAGING=1
  DISCOVERY_TIMEOUT 60)

# The tier through the plugin ABI (extra options → plugin_entry.cc → VkExpertTier; vk_* stats).
if(TARGET kimi_k3)
  coli_cc_test(NAME k3_vk_tier_plugin_test
    SRCS ${CMAKE_CURRENT_LIST_DIR}/vk_tier_plugin_test.cc
    DEPS coli_host_core coli_plugin_api coli_vk)
  target_compile_definitions(k3_vk_tier_plugin_test PRIVATE
    COLI_K3_TINY_DIR="${PROJECT_BINARY_DIR}/fixtures/k3_tiny"
    COLI_PLUGIN_DIR_FOR_TEST="${COLI_PLUGIN_DIR}")
  add_dependencies(k3_vk_tier_plugin_test kimi_k3)
  gtest_discover_tests(k3_vk_tier_plugin_test
    TEST_PREFIX "staging."
    WORKING_DIRECTORY ${PROJECT_BINARY_DIR}
    PROPERTIES LABELS unit ENVIRONMENT COLI_VK_STAGING=1
    DISCOVERY_TIMEOUT 60)
  if(TARGET k3_tiny_fixture)
    add_dependencies(k3_vk_tier_plugin_test k3_tiny_fixture)
  endif()
endif()
