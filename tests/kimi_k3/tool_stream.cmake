# Tool-call deltas of the XTML output parser (plugins/kimi_k3/chat_parser.h, ABI 1.5).
coli_cc_test(NAME kimi_k3_chat_stream_test
  SRCS ${CMAKE_CURRENT_LIST_DIR}/chat_parser_stream_test.cc
  DEPS kimi_k3_chat coli_tokenizer coli_status)

# The deltas through the plugin ABI (an older host gets none) and the host engine, on the
# k3_scripted test family (tools/k3_scripted), whose scripted reply is a real tool call.
if(TARGET k3_scripted)
  coli_cc_test(NAME k3_tool_stream_host_test SRCS ${CMAKE_CURRENT_LIST_DIR}/tool_stream_host_test.cc
    DEPS coli_host_core nlohmann_json::nlohmann_json ${CMAKE_DL_LIBS})
  target_compile_definitions(k3_tool_stream_host_test PRIVATE
    COLI_K3_SCRIPTED_PLUGIN_DIR="${K3_SCRIPTED_PLUGIN_DIR}"
    COLI_K3_SCRIPTED_PLUGIN="${K3_SCRIPTED_PLUGIN_DIR}/libcoli_k3_scripted.so"
    COLI_K3_SCRIPTED_DIR="${COLI_K3_SCRIPTED_FIXTURE}")
  add_dependencies(k3_tool_stream_host_test k3_scripted_fixture)
endif()
