#include "common/tokenizer/tokenizer.h"

#include <cstdlib>
#include <string>

#include "gtest/gtest.h"

namespace coli::tok {
namespace {

std::string DataDir(const std::string& name) {
  const char* src = std::getenv("COLI_SOURCE_DIR");
  return std::string(src ? src : ".") + "/tests/common/tokenizer/data/" + name;
}

TEST(Tokenizer, LoadsTinyKimi) {
  auto tok = Tokenizer::LoadDir(DataDir("kimi_tiny"));
  ASSERT_TRUE(tok.ok()) << tok.status();
  EXPECT_EQ((*tok)->vocab_size(), 530);
}

}  // namespace
}  // namespace coli::tok
