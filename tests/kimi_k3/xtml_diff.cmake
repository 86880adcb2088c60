# Differential test of the XTML renderer (plugins/kimi_k3/chat) against an independent Python
# implementation written from spec §6 (tools/xtml_ref/xtml_ref.py): 200 generated requests plus the
# spec's canonical examples must give identical segment lists (or both an error).
coli_cc_binary(NAME xtml_dump
  SRCS ${CMAKE_CURRENT_LIST_DIR}/xtml_dump_main.cc
  DEPS kimi_k3_chat)
add_test(NAME xtml_differential
  COMMAND ${COLI_PYTHON} ${PROJECT_SOURCE_DIR}/tools/xtml_ref/diff_test.py
          --dumper $<TARGET_FILE:xtml_dump> --seed 8 --count 200)
set_tests_properties(xtml_differential PROPERTIES LABELS reference TIMEOUT 60)
