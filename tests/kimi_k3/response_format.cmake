# response_format (ABI 1.4) in the kimi_k3 plugin on the tiny fixture, through the host's plugin
# wrappers; the validator is nlohmann's parser plus the schema's rules checked in the test.
if(TARGET kimi_k3)
  coli_cc_test(NAME k3_constrained_plugin_test
    SRCS ${CMAKE_CURRENT_LIST_DIR}/constrained_plugin_test.cc
         ${CMAKE_CURRENT_LIST_DIR}/constrained_ride_test.cc
    DEPS coli_host_core coli_plugin_api nlohmann_json::nlohmann_json)
  target_compile_definitions(k3_constrained_plugin_test PRIVATE
    COLI_K3_TINY_DIR="${PROJECT_BINARY_DIR}/fixtures/k3_tiny"
    COLI_PLUGIN_DIR_FOR_TEST="${COLI_PLUGIN_DIR}")
  add_dependencies(k3_constrained_plugin_test kimi_k3)
  if(TARGET k3_tiny_fixture)
    add_dependencies(k3_constrained_plugin_test k3_tiny_fixture)
  endif()
endif()
# The answer constraint's phases alone (plugins/kimi_k3/constrained.h) on the tiny fixture's
# tokenizer; the reference for the allowed sets is computed in the test from the token bytes.
if(TARGET kimi_k3_constrained)
  coli_cc_test(NAME k3_constrained_test
    SRCS ${CMAKE_CURRENT_LIST_DIR}/constrained_test.cc
    DEPS kimi_k3_constrained coli_grammar coli_tokenizer coli_status)
  target_compile_definitions(k3_constrained_test PRIVATE
    COLI_K3_TINY_DIR="${PROJECT_BINARY_DIR}/fixtures/k3_tiny")
  if(TARGET k3_tiny_fixture)
    add_dependencies(k3_constrained_test k3_tiny_fixture)
  endif()
endif()
