# kimi_k3_constrained: response_format enforcement (ABI 1.4) over common/grammar's JSON matcher
# and token filter: the answer channel of a K3 chat (or the whole plain-text output) is masked
# before sampling. Linked into the plugin (owner: constrained decoding).
coli_cc_library(NAME kimi_k3_constrained
  SRCS ${CMAKE_CURRENT_LIST_DIR}/constrained.cc
  HDRS ${CMAKE_CURRENT_LIST_DIR}/constrained.h
  PUBLIC_DEPS coli_grammar coli_tokenizer kimi_k3_chat coli_status absl::status absl::statusor
              absl::strings)
if(TARGET kimi_k3)
  target_link_libraries(kimi_k3 PRIVATE kimi_k3_constrained)
endif()
