// Linked into every coli_cc_test binary: gives tests COLI_SOURCE_DIR and COLI_BINARY_DIR even
// when run by hand, outside ctest (an already-set variable wins).
#include <cstdlib>

namespace {

struct TestEnvironmentDefaults {
  TestEnvironmentDefaults() {
    setenv("COLI_SOURCE_DIR", COLI_TEST_SOURCE_DIR, /*overwrite=*/0);
    setenv("COLI_BINARY_DIR", COLI_TEST_BINARY_DIR, /*overwrite=*/0);
  }
};

const TestEnvironmentDefaults kDefaults;

}  // namespace
