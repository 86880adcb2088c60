# kimi_k3_expert_store: the streaming routed-expert store (issue 6; spec §2.4–§2.5, §7.2):
# per-MoE-layer LRU of RAM slots over the safetensors shards, O_DIRECT single reads in disk
# order, parallel and pipelined loads, usage-history pinning. Tests: tests/kimi_k3/expert_store.cmake.
coli_cc_library(NAME kimi_k3_expert_store
  SRCS ${CMAKE_CURRENT_LIST_DIR}/expert_store.cc
       ${CMAKE_CURRENT_LIST_DIR}/expert_store_usage.cc
  HDRS ${CMAKE_CURRENT_LIST_DIR}/expert_store.h
       ${CMAKE_CURRENT_LIST_DIR}/expert_store_usage.h
  PUBLIC_DEPS coli_safetensors coli_io coli_status absl::status absl::statusor
  # kimi_k3_core: expert_source.cc (ExpertSource, LocateExpert and the expert formats, MXFP4 /
  # F32, that the store shares with PreadExpertSource).
  DEPS kimi_k3_core coli_log absl::strings absl::str_format Threads::Threads)
