# Continuous batching in the kimi_k3 plugin (Decode → Session::StepBatch): one decode call with
# rows of several sessions against one row per call, bit for bit, through the plugin ABI on the
# tiny fixture.
if(TARGET kimi_k3)
  coli_cc_test(NAME k3_batched_decode_test
    SRCS ${CMAKE_CURRENT_LIST_DIR}/batched_decode_test.cc
    DEPS coli_host_core coli_plugin_api)
  target_compile_definitions(k3_batched_decode_test PRIVATE
    COLI_K3_TINY_DIR="${PROJECT_BINARY_DIR}/fixtures/k3_tiny"
    COLI_PLUGIN_DIR_FOR_TEST="${COLI_PLUGIN_DIR}")
  add_dependencies(k3_batched_decode_test kimi_k3)
  if(TARGET k3_tiny_fixture)
    add_dependencies(k3_batched_decode_test k3_tiny_fixture)
  endif()
endif()

# Session::StepBatch itself (kimi_k3_core): logits bit-identical to Session::Step, refusals,
# a failed pass.
coli_cc_test(NAME k3_batched_decode_session_test
  SRCS ${CMAKE_CURRENT_LIST_DIR}/batched_decode_session_test.cc
  DEPS kimi_k3_core coli_sampling)
target_compile_definitions(k3_batched_decode_session_test PRIVATE
  K3_TEST_TINY="${CMAKE_BINARY_DIR}/fixtures/k3_tiny")
if(TARGET k3_tiny_fixture)
  add_dependencies(k3_batched_decode_session_test k3_tiny_fixture)
endif()
