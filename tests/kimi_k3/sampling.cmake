# The ABI 1.3 sampling knobs (logit_bias, penalties, min_p) in the kimi_k3 plugin through its C
# table on the tiny fixture; the reference is computed in the test from the raw logprobs.
if(TARGET kimi_k3)
  coli_cc_test(NAME k3_sampling_plugin_test
    SRCS ${CMAKE_CURRENT_LIST_DIR}/sampling_plugin_test.cc
    DEPS coli_host_core coli_plugin_api)
  target_compile_definitions(k3_sampling_plugin_test PRIVATE
    COLI_K3_TINY_DIR="${PROJECT_BINARY_DIR}/fixtures/k3_tiny"
    COLI_PLUGIN_DIR_FOR_TEST="${COLI_PLUGIN_DIR}")
  add_dependencies(k3_sampling_plugin_test kimi_k3)
  if(TARGET k3_tiny_fixture)
    add_dependencies(k3_sampling_plugin_test k3_tiny_fixture)
  endif()
endif()
