# Tool-call deltas of the XTML output parser (plugins/kimi_k3/chat_parser.h, ABI 1.5).
coli_cc_test(NAME kimi_k3_chat_stream_test
  SRCS ${CMAKE_CURRENT_LIST_DIR}/chat_parser_stream_test.cc
  DEPS kimi_k3_chat coli_tokenizer coli_status)
