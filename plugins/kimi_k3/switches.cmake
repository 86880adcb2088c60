# kimi_k3_switches: the family's environment switches (plugin ABI 1.8), a table of constants the
# plugin hands the host; tests read it too.
coli_cc_library(NAME kimi_k3_switches
  SRCS ${CMAKE_CURRENT_LIST_DIR}/switches.cc
  HDRS ${CMAKE_CURRENT_LIST_DIR}/switches.h
  PUBLIC_DEPS coli_plugin_api)
