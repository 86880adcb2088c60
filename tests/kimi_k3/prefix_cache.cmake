# The model-wide prefix cache (plugins/kimi_k3/prefix_cache, Session::TakePrefixState /
# RestorePrefix) on the tiny fixture: a DIFFERENT session restored from an entry must continue
# bit for bit like a cold session that prefilled the whole prompt. The host test runs requests
# through an Engine and the plugin ABI (extra["prefix_cache"]).
coli_cc_test(NAME k3_prefix_cache_test
  SRCS ${CMAKE_CURRENT_LIST_DIR}/prefix_cache_test.cc
  DEPS kimi_k3_core kimi_k3_chat coli_tokenizer coli_sampling)
target_compile_definitions(k3_prefix_cache_test PRIVATE
  K3_TEST_TINY="${CMAKE_BINARY_DIR}/fixtures/k3_tiny")
if(TARGET k3_tiny_fixture)
  add_dependencies(k3_prefix_cache_test k3_tiny_fixture)
endif()

if(TARGET kimi_k3 AND TARGET coli_host_core)
  coli_cc_test(NAME k3_prefix_cache_host_test
    SRCS ${CMAKE_CURRENT_LIST_DIR}/prefix_cache_host_test.cc
    DEPS coli_host_core kimi_k3_core coli_sampling nlohmann_json::nlohmann_json)
  target_compile_definitions(k3_prefix_cache_host_test PRIVATE
    COLI_K3_TINY_DIR="${PROJECT_BINARY_DIR}/fixtures/k3_tiny"
    COLI_PLUGIN_DIR_FOR_TEST="${COLI_PLUGIN_DIR}")
  add_dependencies(k3_prefix_cache_host_test kimi_k3)
  if(TARGET k3_tiny_fixture)
    add_dependencies(k3_prefix_cache_host_test k3_tiny_fixture)
  endif()
endif()

# What the cache saves per new conversation (not a test: a 1,500-token system prompt; run by hand,
# docs/status/prefix-cache.md).
if(TARGET kimi_k3 AND TARGET coli_host_core)
  coli_cc_binary(NAME k3_prefix_cache_bench
    SRCS ${CMAKE_CURRENT_LIST_DIR}/prefix_cache_bench.cc
    DEPS coli_host_core nlohmann_json::nlohmann_json absl::strings)
  target_compile_definitions(k3_prefix_cache_bench PRIVATE
    COLI_K3_TINY_DIR="${PROJECT_BINARY_DIR}/fixtures/k3_tiny"
    COLI_PLUGIN_DIR_FOR_TEST="${COLI_PLUGIN_DIR}")
  add_dependencies(k3_prefix_cache_bench kimi_k3)
  if(TARGET k3_tiny_fixture)
    add_dependencies(k3_prefix_cache_bench k3_tiny_fixture)
  endif()
endif()
