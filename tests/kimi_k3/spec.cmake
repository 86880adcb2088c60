# Speculative decoding by prompt lookup (plugins/kimi_k3/spec_*): the draft matcher, the verify
# chunk with injected drafts at the Session level, and the plugin through its ABI (spec on vs
# off bit for bit, early stop, context full, sampled and batched rows) on the tiny fixture.
coli_cc_test(NAME k3_spec_lookup_test
  SRCS ${CMAKE_CURRENT_LIST_DIR}/spec_lookup_test.cc
  DEPS kimi_k3_spec)

# spec_replay_test.cc: replay instead of a re-run after a rejected draft (Session::Replay).
# spec_policy_test.cc: the draft policy and the draw-only verify against spec off.
coli_cc_test(NAME k3_spec_decode_test
  SRCS ${CMAKE_CURRENT_LIST_DIR}/spec_decode_test.cc ${CMAKE_CURRENT_LIST_DIR}/spec_replay_test.cc
       ${CMAKE_CURRENT_LIST_DIR}/spec_policy_test.cc
  DEPS kimi_k3_spec kimi_k3_core coli_sampling)
target_compile_definitions(k3_spec_decode_test PRIVATE
  K3_TEST_TINY="${CMAKE_BINARY_DIR}/fixtures/k3_tiny")
if(TARGET k3_tiny_fixture)
  add_dependencies(k3_spec_decode_test k3_tiny_fixture)
endif()

if(TARGET kimi_k3)
  coli_cc_test(NAME k3_spec_plugin_test
    SRCS ${CMAKE_CURRENT_LIST_DIR}/spec_plugin_test.cc
    DEPS coli_host_core coli_plugin_api)
  target_compile_definitions(k3_spec_plugin_test PRIVATE
    COLI_K3_TINY_DIR="${PROJECT_BINARY_DIR}/fixtures/k3_tiny"
    COLI_PLUGIN_DIR_FOR_TEST="${COLI_PLUGIN_DIR}")
  add_dependencies(k3_spec_plugin_test kimi_k3)
  if(TARGET k3_tiny_fixture)
    add_dependencies(k3_spec_plugin_test k3_tiny_fixture)
  endif()
endif()
