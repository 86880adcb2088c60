# `coli bench kernels`, the kernels_benchmark Google Benchmark binary (not run in CI), and a
# smoke test of the quick report (label bench_smoke).
coli_cc_library(NAME coli_kernels_bench_util
  SRCS ${PROJECT_SOURCE_DIR}/bench/kernels/bench_util.cc
  HDRS ${PROJECT_SOURCE_DIR}/bench/kernels/bench_util.h
  PUBLIC_DEPS coli_kernels
  DEPS OpenMP::OpenMP_CXX)
target_sources(coli PRIVATE ${CMAKE_CURRENT_LIST_DIR}/bench_kernels.cc)
target_link_libraries(coli PRIVATE coli_kernels coli_kernels_bench_util OpenMP::OpenMP_CXX)

coli_cc_binary(NAME kernels_benchmark
  SRCS ${PROJECT_SOURCE_DIR}/bench/kernels/kernels_benchmark.cc
  DEPS coli_kernels_bench_util coli_kernels benchmark::benchmark OpenMP::OpenMP_CXX)

if(COLI_BUILD_TESTS)
  add_test(NAME kernels_bench_smoke
    COMMAND ${COLI_PYTHON} ${PROJECT_SOURCE_DIR}/bench/kernels/check_bench_json.py
            $<TARGET_FILE:coli>)
  set_tests_properties(kernels_bench_smoke PROPERTIES LABELS bench_smoke TIMEOUT 120)
endif()
