# `coli bench tokenizer` (bench_tokenizer.cc): encode/decode throughput.
target_sources(coli PRIVATE ${CMAKE_CURRENT_LIST_DIR}/bench_tokenizer.cc)
target_link_libraries(coli PRIVATE coli_tokenizer)
