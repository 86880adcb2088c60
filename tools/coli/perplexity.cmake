# `coli perplexity` (perplexity.cc): a text's perplexity through the host's prompt logprobs.
target_sources(coli PRIVATE ${CMAKE_CURRENT_LIST_DIR}/perplexity.cc)
target_link_libraries(coli PRIVATE coli_client coli_cli_args nlohmann_json::nlohmann_json)
