# `coli tokenize` (tokenize.cc): text <-> token ids.
target_sources(coli PRIVATE ${CMAKE_CURRENT_LIST_DIR}/tokenize.cc)
target_link_libraries(coli PRIVATE coli_tokenizer nlohmann_json::nlohmann_json)
