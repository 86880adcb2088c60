#include "common/tokenizer/pretokenizer.h"

#include "gtest/gtest.h"

namespace coli::tok {
namespace {

TEST(PreTokenizer, CompilesKimi) {
  auto p = PreTokenizer::FromPattern(kKimiPattern);
  ASSERT_TRUE(p.ok()) << p.status();
}

}  // namespace
}  // namespace coli::tok
