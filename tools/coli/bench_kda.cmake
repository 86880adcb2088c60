# `coli bench kda`: the KDA recurrence at K3's shapes, row-by-row vs head-at-a-time, against the
# memory read bandwidth (tools/coli/bench_kda.cc; the probe is bench/kernels/bench_util, whose
# library bench_kernels.cmake declares). Smoke test of the quick JSON report (label bench_smoke).
target_sources(coli PRIVATE ${CMAKE_CURRENT_LIST_DIR}/bench_kda.cc)
target_link_libraries(coli PRIVATE coli_ops coli_kernels coli_kernels_bench_util
                      OpenMP::OpenMP_CXX)
if(COLI_BUILD_TESTS)
  add_test(NAME kda_bench_smoke
    COMMAND ${COLI_PYTHON} ${CMAKE_CURRENT_LIST_DIR}/bench_kda_check.py $<TARGET_FILE:coli>)
  set_tests_properties(kda_bench_smoke PROPERTIES LABELS bench_smoke TIMEOUT 120)
endif()
