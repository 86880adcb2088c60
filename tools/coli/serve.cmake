# `coli serve`: the OpenAI-compatible HTTP gateway (cpp-httplib) over the host's gRPC API.
# It starts a private coli-host through coli_client (tools/coli/client.cmake).
# coli_serve_api: its OpenAI logic without networking (serve_openai: validation, errors, stop
# sequences; serve_responses: the Responses API mapped onto the chat path; serve_messages:
# Anthropic's Messages API mapped onto it;
# serve_responses_background: bounded, cancellable background responses; serve_responses_stream:
# the kept, resumable event stream of a background response; serve_responses_disk: the
# --responses-dir folder where stored responses survive a restart; serve_connection: whether a
# handler's client is still connected), unit-tested in tests/coli/serve_responses_test.cc,
# serve_responses_disk_test.cc, serve_connection_test.cc and serve_messages_test.cc.
coli_cc_library(NAME coli_serve_api
  SRCS ${CMAKE_CURRENT_LIST_DIR}/serve_openai.cc ${CMAKE_CURRENT_LIST_DIR}/serve_responses.cc
       ${CMAKE_CURRENT_LIST_DIR}/serve_responses_background.cc
       ${CMAKE_CURRENT_LIST_DIR}/serve_responses_stream.cc
       ${CMAKE_CURRENT_LIST_DIR}/serve_responses_disk.cc
       ${CMAKE_CURRENT_LIST_DIR}/serve_connection.cc
       ${CMAKE_CURRENT_LIST_DIR}/serve_messages.cc
  HDRS ${CMAKE_CURRENT_LIST_DIR}/serve_openai.h ${CMAKE_CURRENT_LIST_DIR}/serve_responses.h
       ${CMAKE_CURRENT_LIST_DIR}/serve_responses_background.h
       ${CMAKE_CURRENT_LIST_DIR}/serve_responses_stream.h
       ${CMAKE_CURRENT_LIST_DIR}/serve_responses_disk.h
       ${CMAKE_CURRENT_LIST_DIR}/serve_connection.h
       ${CMAKE_CURRENT_LIST_DIR}/serve_messages.h
  PUBLIC_DEPS coli_proto gRPC::grpc++ nlohmann_json::nlohmann_json absl::status absl::statusor
  DEPS coli_io coli_log coli_tokenizer)
# The gateway itself: serve_gateway.h declares it; its handlers are split by endpoint family.
target_sources(coli PRIVATE ${CMAKE_CURRENT_LIST_DIR}/serve.cc ${CMAKE_CURRENT_LIST_DIR}/serve_gateway.cc
                            ${CMAKE_CURRENT_LIST_DIR}/serve_chat.cc
                            ${CMAKE_CURRENT_LIST_DIR}/serve_completions.cc
                            ${CMAKE_CURRENT_LIST_DIR}/serve_responses_routes.cc
                            ${CMAKE_CURRENT_LIST_DIR}/serve_messages_routes.cc)
target_link_libraries(coli PRIVATE coli_serve_api coli_client coli_proto gRPC::grpc++
                                   PkgConfig::HTTPLIB nlohmann_json::nlohmann_json)
target_link_libraries(coli PRIVATE coli_web_assets)
coli_add_subdirectories()
