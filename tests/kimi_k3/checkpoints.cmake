# Recurrent-state checkpoints (plugins/kimi_k3/checkpoints, Session::TakeCheckpoint/Restore) on
# the tiny fixture: a restored session must continue bit for bit like a fresh one.
coli_cc_test(NAME k3_checkpoints_test
  SRCS ${CMAKE_CURRENT_LIST_DIR}/checkpoints_test.cc
  DEPS kimi_k3_core)
target_compile_definitions(k3_checkpoints_test PRIVATE
  K3_TEST_TINY="${CMAKE_BINARY_DIR}/fixtures/k3_tiny")
if(TARGET k3_tiny_fixture)
  add_dependencies(k3_checkpoints_test k3_tiny_fixture)
endif()
