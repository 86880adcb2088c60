# Tests of the Kimi K3 model core (plugins/kimi_k3, owner: model). Expected values come from
# the independent float64 numpy reference tools/k3/k3_ref.py, run by the tests on the fixtures
# that tools/k3 makes at build time (build/fixtures/k3_tiny, k3_tiny_ties, k3_tiny_variant,
# k3_vendor_f32; random weights).
coli_cc_test(NAME k3_config_test
  SRCS ${CMAKE_CURRENT_LIST_DIR}/config_test.cc
  DEPS kimi_k3_core)
coli_cc_test(NAME k3_model_test
  SRCS ${CMAKE_CURRENT_LIST_DIR}/model_test.cc
       ${CMAKE_CURRENT_LIST_DIR}/reference_util.cc
  DEPS kimi_k3_core coli_sampling coli_safetensors coli_json absl::strings)
target_compile_definitions(k3_model_test PRIVATE
  K3_TEST_PYTHON="${COLI_PYTHON}"
  K3_TEST_REF="${PROJECT_SOURCE_DIR}/tools/k3/k3_ref.py"
  PROJECT_TOOLS_K3="${PROJECT_SOURCE_DIR}/tools/k3"
  K3_TEST_TINY="${CMAKE_BINARY_DIR}/fixtures/k3_tiny"
  K3_TEST_TIES="${CMAKE_BINARY_DIR}/fixtures/k3_tiny_ties"
  K3_TEST_VARIANT="${CMAKE_BINARY_DIR}/fixtures/k3_tiny_variant"
  K3_TEST_VENDOR="${CMAKE_BINARY_DIR}/fixtures/k3_vendor_f32")
if(TARGET k3_tiny_fixture)
  add_dependencies(k3_model_test k3_tiny_fixture)
endif()

# What an n > 1 request's choice sessions cost made anew per request vs reset host spares (not a
# test: run by hand, docs/status/host-batching.md).
coli_cc_binary(NAME k3_session_reuse_bench
  SRCS ${CMAKE_CURRENT_LIST_DIR}/session_reuse_bench.cc
  DEPS kimi_k3_core)
target_compile_definitions(k3_session_reuse_bench PRIVATE
  COLI_K3_TINY_DIR="${CMAKE_BINARY_DIR}/fixtures/k3_tiny")
