# The loader against a repacked container's per-tensor CRC-32s (K3_VERIFY): the tiny fixture
# repacked into a temp folder, bytes flipped in dense tensors, the embedding, the checksum digits
# and experts; each load or prefill must fail naming the damage (docs/status/repack.md).
coli_cc_test(NAME k3_checksum_load_test
  SRCS ${CMAKE_CURRENT_LIST_DIR}/checksum_load_test.cc
  DEPS kimi_k3_repack kimi_k3_core kimi_k3_expert_store coli_safetensors coli_io coli_status
       absl::strings)
target_compile_definitions(k3_checksum_load_test PRIVATE
  K3_TEST_TINY="${CMAKE_BINARY_DIR}/fixtures/k3_tiny")
if(TARGET k3_tiny_fixture)
  add_dependencies(k3_checksum_load_test k3_tiny_fixture)
endif()

# The same from outside: coli run / k3-run / coli-host --model / coli serve on a damaged
# container, K3_VERIFY=0 through each, /health 503 after a request meets a damaged expert (~10 s).
add_test(NAME k3_checksum_cli
  COMMAND ${CMAKE_CURRENT_LIST_DIR}/checksum_cli.sh ${CMAKE_BINARY_DIR}/bin
          ${CMAKE_BINARY_DIR}/fixtures/k3_tiny)
set_tests_properties(k3_checksum_cli PROPERTIES LABELS "cli" TIMEOUT 300)
