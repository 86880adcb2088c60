# The ABI's statistics contract through the kimi_k3 plugin: session_stats are counters (never
# fall while a session lives), current values (checkpoint bytes, the Vulkan tier's residents)
# are model_stats.
if(TARGET kimi_k3)
  coli_cc_test(NAME k3_plugin_stats_test
    SRCS ${CMAKE_CURRENT_LIST_DIR}/plugin_stats_test.cc
    DEPS coli_host_core coli_plugin_api)
  target_compile_definitions(k3_plugin_stats_test PRIVATE
    COLI_K3_TINY_DIR="${PROJECT_BINARY_DIR}/fixtures/k3_tiny"
    COLI_PLUGIN_DIR_FOR_TEST="${COLI_PLUGIN_DIR}")
  add_dependencies(k3_plugin_stats_test kimi_k3)
  if(TARGET k3_tiny_fixture)
    add_dependencies(k3_plugin_stats_test k3_tiny_fixture)
  endif()
endif()
