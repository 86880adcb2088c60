// Invariant checks for the fuzz targets: a violated invariant aborts, which libFuzzer reports
// as a crash and saves the input.
#ifndef COLI_TESTS_FUZZ_FUZZ_CHECK_H_
#define COLI_TESTS_FUZZ_FUZZ_CHECK_H_

#include <cstdio>
#include <cstdlib>

namespace coli::fuzz {

inline void Check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "invariant violated: %s\n", what);
    std::abort();
  }
}

}  // namespace coli::fuzz

#endif  // COLI_TESTS_FUZZ_FUZZ_CHECK_H_
