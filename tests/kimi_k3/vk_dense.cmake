# Tests of the shared experts on the Vulkan device (plugins/kimi_k3/vk_dense.*, COLI_VK_DENSE,
# COLI_VK_TIER=0; owner: vkdense). Run on lavapipe; skip only without any Vulkan device.
coli_cc_test(NAME k3_vk_dense_test
  SRCS ${CMAKE_CURRENT_LIST_DIR}/vk_dense_test.cc
       ${CMAKE_CURRENT_LIST_DIR}/reference_util.cc
  DEPS kimi_k3_vk_tier kimi_k3_core coli_vk coli_kernels coli_safetensors coli_json coli_status
       absl::strings)
# reference_util.cc (RelL2) is built with the definitions k3_model_test gives it.
target_compile_definitions(k3_vk_dense_test PRIVATE
  K3_TEST_PYTHON="${COLI_PYTHON}"
  K3_TEST_REF="${PROJECT_SOURCE_DIR}/tools/k3/k3_ref.py"
  PROJECT_TOOLS_K3="${PROJECT_SOURCE_DIR}/tools/k3"
  K3_TEST_TINY="${CMAKE_BINARY_DIR}/fixtures/k3_tiny"
  K3_TEST_TIES="${CMAKE_BINARY_DIR}/fixtures/k3_tiny_ties")
if(TARGET k3_tiny_fixture)
  add_dependencies(k3_vk_dense_test k3_tiny_fixture)
endif()
# Again with the dense matrices staged into device-local memory (COLI_VK_STAGING=1: the
# discrete-GPU upload path, exercised on lavapipe).
gtest_discover_tests(k3_vk_dense_test
  TEST_PREFIX "staging."
  WORKING_DIRECTORY ${PROJECT_BINARY_DIR}
  PROPERTIES LABELS unit ENVIRONMENT COLI_VK_STAGING=1
  DISCOVERY_TIMEOUT 60)
