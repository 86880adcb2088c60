# ABI 1.7 prompt logprobs in the kimi_k3 plugin through its C table on the tiny fixture, against
# the float64 numpy reference (tools/k3/k3_ref.py) run by the test.
if(TARGET kimi_k3)
  coli_cc_test(NAME k3_prompt_logprobs_plugin_test
    SRCS ${CMAKE_CURRENT_LIST_DIR}/prompt_logprobs_plugin_test.cc
         ${CMAKE_CURRENT_LIST_DIR}/reference_util.cc
    DEPS coli_host_core coli_plugin_api coli_safetensors coli_json absl::strings)
  target_compile_definitions(k3_prompt_logprobs_plugin_test PRIVATE
    COLI_K3_TINY_DIR="${PROJECT_BINARY_DIR}/fixtures/k3_tiny"
    COLI_PLUGIN_DIR_FOR_TEST="${COLI_PLUGIN_DIR}"
    K3_TEST_PYTHON="${COLI_PYTHON}"
    K3_TEST_REF="${PROJECT_SOURCE_DIR}/tools/k3/k3_ref.py"
    PROJECT_TOOLS_K3="${PROJECT_SOURCE_DIR}/tools/k3")
  add_dependencies(k3_prompt_logprobs_plugin_test kimi_k3)
  if(TARGET k3_tiny_fixture)
    add_dependencies(k3_prompt_logprobs_plugin_test k3_tiny_fixture)
  endif()
endif()

# kimi_k3's prompt-logprob memos on their own (budgets small enough to drop memos, threads that
# evict memos others read).
coli_cc_test(NAME k3_prompt_logprob_memo_test
  SRCS ${CMAKE_CURRENT_LIST_DIR}/prompt_logprob_memo_test.cc
       ${PROJECT_SOURCE_DIR}/plugins/kimi_k3/prompt_logprob_memo.cc
  DEPS coli_sampling coli_plugin_api)
