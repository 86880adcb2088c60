# kimi_k3_core: config, weights, the five layer kinds, the forward pass and sessions
# (owner: model). k3-run: the dev/validation CLI over it (build/bin/k3-run).
coli_cc_library(NAME kimi_k3_core
  SRCS
    ${CMAKE_CURRENT_LIST_DIR}/config.cc
    ${CMAKE_CURRENT_LIST_DIR}/weights.cc
    ${CMAKE_CURRENT_LIST_DIR}/expert_source.cc
    ${CMAKE_CURRENT_LIST_DIR}/kda.cc
    ${CMAKE_CURRENT_LIST_DIR}/mla.cc
    ${CMAKE_CURRENT_LIST_DIR}/attn_res.cc
    ${CMAKE_CURRENT_LIST_DIR}/dense_mlp.cc
    ${CMAKE_CURRENT_LIST_DIR}/latent_moe.cc
    ${CMAKE_CURRENT_LIST_DIR}/model.cc
    ${CMAKE_CURRENT_LIST_DIR}/session.cc
    ${CMAKE_CURRENT_LIST_DIR}/checkpoints.cc
  HDRS
    ${CMAKE_CURRENT_LIST_DIR}/config.h
    ${CMAKE_CURRENT_LIST_DIR}/options.h
    ${CMAKE_CURRENT_LIST_DIR}/weights.h
    ${CMAKE_CURRENT_LIST_DIR}/compute.h
    ${CMAKE_CURRENT_LIST_DIR}/expert_source.h
    ${CMAKE_CURRENT_LIST_DIR}/kda.h
    ${CMAKE_CURRENT_LIST_DIR}/mla.h
    ${CMAKE_CURRENT_LIST_DIR}/attn_res.h
    ${CMAKE_CURRENT_LIST_DIR}/dense_mlp.h
    ${CMAKE_CURRENT_LIST_DIR}/latent_moe.h
    ${CMAKE_CURRENT_LIST_DIR}/model.h
    ${CMAKE_CURRENT_LIST_DIR}/session.h
    ${CMAKE_CURRENT_LIST_DIR}/checkpoints.h
  PUBLIC_DEPS coli_status coli_log coli_json coli_safetensors coli_kernels coli_ops
              absl::status absl::statusor absl::strings)

set(_k3_run_deps kimi_k3_core coli_sampling coli_status coli_log)
if(TARGET coli_tokenizer)
  list(APPEND _k3_run_deps coli_tokenizer)
endif()
coli_cc_binary(NAME k3-run
  SRCS ${CMAKE_CURRENT_LIST_DIR}/k3_run_main.cc
  DEPS ${_k3_run_deps})
if(TARGET coli_tokenizer)
  target_compile_definitions(k3-run PRIVATE COLI_K3_HAVE_TOKENIZER=1)
endif()
target_compile_definitions(k3-run PRIVATE
  COLI_K3_DEFAULT_MODEL="${CMAKE_BINARY_DIR}/fixtures/k3_tiny")
