# k3-repack and the repacked container (plugins/kimi_k3/repack*, container*; spec §4.4): the tiny
# fixture repacked into temp folders, logits bit-identical to the source loaded with the same
# bits, container file checks, resume / --shards / index, --verify-full, K3_MMAP, bad input.
coli_cc_test(NAME k3_repack_test
  SRCS ${CMAKE_CURRENT_LIST_DIR}/repack_test.cc
  DEPS kimi_k3_repack kimi_k3_core kimi_k3_expert_store coli_safetensors coli_kernels coli_io coli_status
       absl::strings)
target_compile_definitions(k3_repack_test PRIVATE
  K3_TEST_TINY="${CMAKE_BINARY_DIR}/fixtures/k3_tiny"
  K3_REPACK_BIN="$<TARGET_FILE:k3-repack>")
add_dependencies(k3_repack_test k3-repack)
if(TARGET k3_tiny_fixture)
  add_dependencies(k3_repack_test k3_tiny_fixture)
endif()

# The K3_MMAP family option through the plugin ABI (tests/kimi_k3/plugin_abi_test_util.h).
if(TARGET kimi_k3)
  coli_cc_test(NAME k3_repack_plugin_test
    SRCS ${CMAKE_CURRENT_LIST_DIR}/repack_plugin_test.cc
    DEPS coli_host_core coli_plugin_api)
  target_compile_definitions(k3_repack_plugin_test PRIVATE
    COLI_K3_TINY_DIR="${PROJECT_BINARY_DIR}/fixtures/k3_tiny"
    COLI_PLUGIN_DIR_FOR_TEST="${COLI_PLUGIN_DIR}")
  add_dependencies(k3_repack_plugin_test kimi_k3)
  if(TARGET k3_tiny_fixture)
    add_dependencies(k3_repack_plugin_test k3_tiny_fixture)
  endif()
endif()
