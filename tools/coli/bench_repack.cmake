# `coli bench repack`: k3-repack's read -> quantize -> write pipeline vs the disk read rate
# (tools/coli/bench_repack.cc, plugins/kimi_k3/repack.h), and a smoke test on the tiny fixture
# (label bench_smoke: both depths, 1 MiB pieces, outputs identical; a second or two).
target_sources(coli PRIVATE ${CMAKE_CURRENT_LIST_DIR}/bench_repack.cc)
target_link_libraries(coli PRIVATE kimi_k3_repack coli_safetensors coli_io coli_status
                      absl::strings absl::str_format)
# The fixture comes from tools/k3 (target k3_tiny_fixture, built with ALL).
add_test(NAME repack_bench_smoke
  COMMAND coli bench repack --model ${PROJECT_BINARY_DIR}/fixtures/k3_tiny --json
          --in-flight 1,3 --piece-mib 1 --threads 2)
set_tests_properties(repack_bench_smoke PROPERTIES LABELS bench_smoke TIMEOUT 120
  PASS_REGULAR_EXPRESSION "\"identical\": true, \"max_rss_kb\"")
