# Mixed passes: a prefill's chunk passes carrying decode rows of other sessions (Riders in
# plugins/kimi_k3/session.h; the plugin's ride-along in plugin_entry.cc). The core test checks
# bit identity against sessions run alone and the edges (refusals, a failed pass, interrupt,
# K3_TRACE, K3_LOGITS); the plugin test drives concurrent sessions through the ABI.
coli_cc_test(NAME k3_mixed_prefill_session_test
  SRCS ${CMAKE_CURRENT_LIST_DIR}/mixed_prefill_session_test.cc
  DEPS kimi_k3_core coli_sampling)
target_compile_definitions(k3_mixed_prefill_session_test PRIVATE
  K3_TEST_TINY="${CMAKE_BINARY_DIR}/fixtures/k3_tiny")
if(TARGET k3_tiny_fixture)
  add_dependencies(k3_mixed_prefill_session_test k3_tiny_fixture)
endif()

if(TARGET kimi_k3)
  coli_cc_test(NAME k3_mixed_prefill_test
    SRCS ${CMAKE_CURRENT_LIST_DIR}/mixed_prefill_test.cc
    DEPS coli_host_core coli_plugin_api)
  target_compile_definitions(k3_mixed_prefill_test PRIVATE
    COLI_K3_TINY_DIR="${PROJECT_BINARY_DIR}/fixtures/k3_tiny"
    COLI_PLUGIN_DIR_FOR_TEST="${COLI_PLUGIN_DIR}")
  add_dependencies(k3_mixed_prefill_test kimi_k3)
  if(TARGET k3_tiny_fixture)
    add_dependencies(k3_mixed_prefill_test k3_tiny_fixture)
  endif()
endif()
