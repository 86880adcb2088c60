# KDA layer (plugins/kimi_k3/kda, owner: kda): the head-at-a-time recurrence against the
# row-by-row path kept in the test, bit for bit, on the tiny fixture (build/fixtures/k3_tiny).
coli_cc_test(NAME k3_kda_test
  SRCS ${CMAKE_CURRENT_LIST_DIR}/kda_test.cc
  DEPS kimi_k3_core coli_ops)
target_compile_definitions(k3_kda_test PRIVATE
  K3_TEST_TINY="${CMAKE_BINARY_DIR}/fixtures/k3_tiny")
if(TARGET k3_tiny_fixture)
  add_dependencies(k3_kda_test k3_tiny_fixture)
endif()
