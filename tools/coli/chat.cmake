# `coli chat`: the terminal chat (libedit line editing) over the client core.
pkg_check_modules(LIBEDIT REQUIRED IMPORTED_TARGET libedit)
coli_cc_library(NAME coli_chat_tui
  SRCS ${CMAKE_CURRENT_LIST_DIR}/chat_tui.cc ${CMAKE_CURRENT_LIST_DIR}/chat_keys.cc
  HDRS ${CMAKE_CURRENT_LIST_DIR}/chat_tui.h ${CMAKE_CURRENT_LIST_DIR}/chat_keys.h
  PUBLIC_DEPS coli_io coli_status nlohmann_json::nlohmann_json absl::strings
  DEPS coli_cli_args)
# The line history file (libedit's format, saved atomically, merged with other chats' lines).
coli_cc_library(NAME coli_chat_history
  SRCS ${CMAKE_CURRENT_LIST_DIR}/chat_history.cc
  HDRS ${CMAKE_CURRENT_LIST_DIR}/chat_history.h
  PUBLIC_DEPS absl::status
  DEPS coli_io absl::strings PkgConfig::LIBEDIT)
target_sources(coli PRIVATE ${CMAKE_CURRENT_LIST_DIR}/chat.cc)
target_link_libraries(coli PRIVATE coli_chat_tui coli_chat_history coli_client PkgConfig::LIBEDIT)
