# coli_client: the client core shared by `coli run`, `coli chat`, `coli serve`, `coli web`
# (owner: host). `coli run` and `coli bench grpc` are compiled into the coli executable.
coli_cc_library(NAME coli_client
  SRCS ${CMAKE_CURRENT_LIST_DIR}/client.cc
  HDRS ${CMAKE_CURRENT_LIST_DIR}/client.h
  PUBLIC_DEPS coli_proto coli_status absl::status absl::statusor absl::strings gRPC::grpc++
              nlohmann_json::nlohmann_json coli_model_options_env
  DEPS coli_flags)
# Where a private host, the plugins and the embedded tiny model are found in this build.
target_compile_definitions(coli_client PUBLIC
  COLI_CLIENT_HOST_BINARY="$<TARGET_FILE:coli-host>"
  COLI_CLIENT_PLUGIN_DIR="${COLI_PLUGIN_DIR}"
  COLI_CLIENT_TINY_MODEL="${PROJECT_BINARY_DIR}/fixtures/k3_tiny")

# Whether a reply ended inside a UTF-8 character (coli run, coli chat, coli serve).
coli_cc_library(NAME coli_reply_tail
  SRCS ${CMAKE_CURRENT_LIST_DIR}/reply_tail.cc
  HDRS ${CMAKE_CURRENT_LIST_DIR}/reply_tail.h
  PUBLIC_DEPS coli_proto
  DEPS coli_tokenizer)

target_sources(coli PRIVATE ${CMAKE_CURRENT_LIST_DIR}/run.cc ${CMAKE_CURRENT_LIST_DIR}/bench_grpc.cc)
target_link_libraries(coli PRIVATE coli_client coli_reply_tail coli_host_core
                      nlohmann_json::nlohmann_json)
# `coli run` starts coli-host and, by default, serves the tiny model through the kimi_k3 plugin.
add_dependencies(coli coli-host)
if(TARGET kimi_k3)
  add_dependencies(coli kimi_k3)
endif()
