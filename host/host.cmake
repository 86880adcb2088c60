# coli_host_core: plugin loader, engine (models, sessions, queue, generation threads) and the
# gRPC service/server. coli-host: the host process.
coli_cc_library(NAME coli_host_core
  SRCS ${CMAKE_CURRENT_LIST_DIR}/plugin.cc ${CMAKE_CURRENT_LIST_DIR}/engine.cc
       ${CMAKE_CURRENT_LIST_DIR}/service.cc
       ${CMAKE_CURRENT_LIST_DIR}/write_starter.cc ${CMAKE_CURRENT_LIST_DIR}/openmp_policy.cc
  HDRS ${CMAKE_CURRENT_LIST_DIR}/plugin.h ${CMAKE_CURRENT_LIST_DIR}/engine.h
       ${CMAKE_CURRENT_LIST_DIR}/service.h ${CMAKE_CURRENT_LIST_DIR}/openmp_policy.h
  PUBLIC_DEPS coli_proto coli_plugin_api coli_status coli_log gRPC::grpc++
  DEPS coli_sampling coli_io coli_json coli_model_options_env gRPC::grpc++_reflection
       nlohmann_json::nlohmann_json ${CMAKE_DL_LIBS})
target_compile_definitions(coli_host_core PRIVATE COLI_HOST_VERSION="${PROJECT_VERSION}")

# coli_model_options_env: the model switches of the environment (the tables the families declare,
# ABI 1.8) into v1::ModelOptions, for coli-host's --model loads and the client alike.
coli_cc_library(NAME coli_model_options_env
  SRCS ${CMAKE_CURRENT_LIST_DIR}/model_options_env.cc
  HDRS ${CMAKE_CURRENT_LIST_DIR}/model_options_env.h
  PUBLIC_DEPS coli_proto coli_plugin_api absl::statusor nlohmann_json::nlohmann_json
  DEPS coli_flags coli_status absl::strings)

coli_cc_binary(NAME coli-host SRCS ${CMAKE_CURRENT_LIST_DIR}/main.cc
  DEPS coli_host_core coli_flags coli_model_options_env)
target_compile_definitions(coli-host PRIVATE COLI_HOST_VERSION="${PROJECT_VERSION}"
  COLI_PLUGIN_DIR="${COLI_PLUGIN_DIR}")
