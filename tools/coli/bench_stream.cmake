# `coli bench stream`: expert streaming vs the disk ceiling (issue 6, tools/coli/bench_stream.cc).
target_sources(coli PRIVATE ${CMAKE_CURRENT_LIST_DIR}/bench_stream.cc)
target_link_libraries(coli PRIVATE kimi_k3_expert_store coli_kernels coli_ops coli_safetensors
                      coli_io coli_log coli_status absl::strings absl::str_format)
