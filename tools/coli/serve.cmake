# `coli serve`: the OpenAI-compatible HTTP gateway (cpp-httplib) over the host's gRPC API.
# It starts a private coli-host through coli_client (tools/coli/client.cmake).
target_sources(coli PRIVATE ${CMAKE_CURRENT_LIST_DIR}/serve.cc
                            ${CMAKE_CURRENT_LIST_DIR}/serve_openai.cc)
target_link_libraries(coli PRIVATE coli_client coli_proto gRPC::grpc++ PkgConfig::HTTPLIB
                                   nlohmann_json::nlohmann_json)
target_link_libraries(coli PRIVATE coli_web_assets)
