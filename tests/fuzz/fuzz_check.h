// Invariant checks for the fuzz targets: a violated invariant aborts, which libFuzzer reports
// as a crash and saves the input.
#ifndef COLI_TESTS_FUZZ_FUZZ_CHECK_H_
#define COLI_TESTS_FUZZ_FUZZ_CHECK_H_

#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <string_view>

namespace coli::fuzz {

inline void Check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "invariant violated: %s\n", what);
    std::abort();
  }
}

// The length of the well-formed UTF-8 character at s[i] (Unicode Table 3-7: no overlongs,
// surrogates or values past U+10FFFF), or 0 when there is none.
inline size_t Utf8CharLength(std::string_view s, size_t i) {
  const auto c = static_cast<unsigned char>(s[i]);
  if (c < 0x80) return 1;
  size_t n;
  unsigned lo = 0x80, hi = 0xBF;
  if (c >= 0xC2 && c <= 0xDF) {
    n = 1;
  } else if (c >= 0xE0 && c <= 0xEF) {
    n = 2;
    if (c == 0xE0) lo = 0xA0;
    if (c == 0xED) hi = 0x9F;
  } else if (c >= 0xF0 && c <= 0xF4) {
    n = 3;
    if (c == 0xF0) lo = 0x90;
    if (c == 0xF4) hi = 0x8F;
  } else {
    return 0;
  }
  for (size_t k = 1; k <= n; ++k, lo = 0x80, hi = 0xBF) {
    if (i + k >= s.size()) return 0;
    const auto b = static_cast<unsigned char>(s[i + k]);
    if (b < lo || b > hi) return 0;
  }
  return n + 1;
}

inline bool WellFormedUtf8(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    const size_t n = Utf8CharLength(s, i);
    if (n == 0) return false;
    i += n;
  }
  return true;
}

}  // namespace coli::fuzz

#endif  // COLI_TESTS_FUZZ_FUZZ_CHECK_H_
