# Repacked container (issue repack; spec §4.4): container detection in the loader (container.cc,
# part of kimi_k3_core) and the converter k3-repack (build/bin/k3-repack).
target_sources(kimi_k3_core PRIVATE ${CMAKE_CURRENT_LIST_DIR}/container.cc)
coli_cc_library(NAME kimi_k3_repack
  SRCS ${CMAKE_CURRENT_LIST_DIR}/repack.cc ${CMAKE_CURRENT_LIST_DIR}/repack_check.cc
  HDRS ${CMAKE_CURRENT_LIST_DIR}/repack.h
  PUBLIC_DEPS absl::status absl::statusor
  DEPS kimi_k3_core coli_safetensors coli_kernels coli_io coli_status absl::strings)
coli_cc_binary(NAME k3-repack
  SRCS ${CMAKE_CURRENT_LIST_DIR}/repack_main.cc
  DEPS kimi_k3_repack absl::strings)
