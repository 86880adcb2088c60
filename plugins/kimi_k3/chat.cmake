# kimi_k3_chat: XTML rendering of OpenAI chat requests and parsing of generated output
# (spec §6). Linked by the kimi_k3 plugin; tests in tests/kimi_k3/chat.cmake.
coli_cc_library(NAME kimi_k3_chat
  SRCS ${CMAKE_CURRENT_LIST_DIR}/chat.cc
       ${CMAKE_CURRENT_LIST_DIR}/chat_json.cc
       ${CMAKE_CURRENT_LIST_DIR}/chat_parser.cc
  HDRS ${CMAKE_CURRENT_LIST_DIR}/chat.h
       ${CMAKE_CURRENT_LIST_DIR}/chat_json.h
       ${CMAKE_CURRENT_LIST_DIR}/chat_parser.h
  PUBLIC_DEPS coli_tokenizer coli_status nlohmann_json::nlohmann_json absl::status absl::statusor
              absl::strings)
