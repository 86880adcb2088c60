# tool_choice required / named (the coli_tool_calls response_format extension, ABI 1.4) in the
# kimi_k3 plugin on the tiny fixture; the validator is nlohmann plus each schema's rules by hand.
if(TARGET kimi_k3)
  coli_cc_test(NAME k3_tool_choice_plugin_test
    SRCS ${CMAKE_CURRENT_LIST_DIR}/tool_choice_plugin_test.cc
    DEPS coli_host_core coli_plugin_api coli_tokenizer nlohmann_json::nlohmann_json)
  target_compile_definitions(k3_tool_choice_plugin_test PRIVATE
    COLI_K3_TINY_DIR="${PROJECT_BINARY_DIR}/fixtures/k3_tiny"
    COLI_PLUGIN_DIR_FOR_TEST="${COLI_PLUGIN_DIR}")
  add_dependencies(k3_tool_choice_plugin_test kimi_k3)
  if(TARGET k3_tiny_fixture)
    add_dependencies(k3_tool_choice_plugin_test k3_tiny_fixture)
  endif()
endif()

# Not a test: the lazy tool-call constraint's per-step cost at a real vocabulary size
# (docs/status/constrained.md).
if(TARGET kimi_k3_constrained)
  coli_cc_binary(NAME k3_tool_choice_bench SRCS ${CMAKE_CURRENT_LIST_DIR}/tool_choice_bench.cc
    DEPS kimi_k3_constrained kimi_k3_chat coli_tokenizer)
endif()
