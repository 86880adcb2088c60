# kimi_k3_spec: speculative decoding by prompt lookup (spec_lookup: the draft matcher;
# spec_decode: verify a draft as one chunk, buffer the accepted tokens, rewind to the delivered
# record). Linked into the plugin (owner: spec decoding).
coli_cc_library(NAME kimi_k3_spec
  SRCS
    ${CMAKE_CURRENT_LIST_DIR}/spec_lookup.cc
    ${CMAKE_CURRENT_LIST_DIR}/spec_decode.cc
  HDRS
    ${CMAKE_CURRENT_LIST_DIR}/spec_lookup.h
    ${CMAKE_CURRENT_LIST_DIR}/spec_decode.h
  PUBLIC_DEPS kimi_k3_core coli_sampling coli_status absl::status absl::statusor absl::strings)
if(TARGET kimi_k3)
  target_link_libraries(kimi_k3 PRIVATE kimi_k3_spec)
endif()
# k3-run decodes with COLI_K3_SPEC too.
if(TARGET k3-run)
  target_link_libraries(k3-run PRIVATE kimi_k3_spec)
endif()
