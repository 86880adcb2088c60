# ops_benchmark: the Google Benchmark view of common/ops' threading (region cost, one thread
# against a team around the threshold ops use); not run in CI.
coli_cc_binary(NAME ops_benchmark
  SRCS ${PROJECT_SOURCE_DIR}/bench/ops/ops_benchmark.cc
  DEPS coli_ops benchmark::benchmark OpenMP::OpenMP_CXX)
