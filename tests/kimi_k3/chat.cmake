# Tests of the XTML renderer and output parser (plugins/kimi_k3/chat*). They read the tiny
# fixture's tokenizer from build/fixtures/k3_tiny (target k3_tiny_fixture).
coli_cc_test(NAME kimi_k3_chat_test
  SRCS ${CMAKE_CURRENT_LIST_DIR}/chat_json_test.cc
       ${CMAKE_CURRENT_LIST_DIR}/chat_render_test.cc
       ${CMAKE_CURRENT_LIST_DIR}/chat_parser_test.cc
  DEPS kimi_k3_chat coli_tokenizer coli_status)
add_dependencies(kimi_k3_chat_test k3_tiny_fixture)
target_compile_definitions(kimi_k3_chat_test PRIVATE COLI_K3_TINY_DIR="${COLI_K3_TINY_FIXTURE}")
