// Shared by the batched-decode tests (tests/kimi_k3/batched_decode*_test.cc).
#ifndef COLI_TESTS_KIMI_K3_BATCHED_DECODE_UTIL_H_
#define COLI_TESTS_KIMI_K3_BATCHED_DECODE_UTIL_H_

#include <cstdint>
#include <vector>

namespace coli::k3::batched_test {

// A prompt of n ids inside the tiny fixture's vocabulary (768), away from its specials (512+);
// different seeds give different prompts.
inline std::vector<int32_t> Ids(int n, int seed) {
  std::vector<int32_t> ids(n);
  for (int i = 0; i < n; ++i) ids[i] = (seed * 7919 + i * 104729) % 250 + 3;
  return ids;
}

}  // namespace coli::k3::batched_test

#endif  // COLI_TESTS_KIMI_K3_BATCHED_DECODE_UTIL_H_
