#include "common/tokenizer/utf8.h"

#include "gtest/gtest.h"

namespace coli::tok {
namespace {

TEST(Utf8, ValidSequencesPassThrough) {
  std::string s = "a\xC3\xA9\xE4\xB8\xAD\xF0\x9F\x98\x80";
  EXPECT_TRUE(IsValidUtf8(s));
  EXPECT_EQ(ReplaceInvalidUtf8(s), s);
}

// Expected strings follow Unicode's maximal-subpart practice, which Python's
// bytes.decode("utf-8", "replace") and the WHATWG TextDecoder implement (checked by hand
// against both for these inputs).
TEST(Utf8, ReplacesMaximalSubparts) {
  const std::string kR = "\xEF\xBF\xBD";
  EXPECT_EQ(ReplaceInvalidUtf8("\x80"), kR);
  EXPECT_EQ(ReplaceInvalidUtf8("a\xFF" "b"), "a" + kR + "b");
  // Truncated 3-byte sequence then ASCII: one U+FFFD for the two bytes.
  EXPECT_EQ(ReplaceInvalidUtf8("\xE4\xB8x"), kR + "x");
  // Surrogate (ED A0 80): ED cannot take A0, so three replacements.
  EXPECT_EQ(ReplaceInvalidUtf8("\xED\xA0\x80"), kR + kR + kR);
  // Overlong C0 80: C0 is never a lead byte.
  EXPECT_EQ(ReplaceInvalidUtf8("\xC0\x80"), kR + kR);
  // F4 90: past U+10FFFF.
  EXPECT_EQ(ReplaceInvalidUtf8("\xF4\x90\x80\x80"), kR + kR + kR + kR);
  // Truncated 4-byte at the end: one replacement.
  EXPECT_EQ(ReplaceInvalidUtf8("\xF0\x9F\x98"), kR);
  EXPECT_FALSE(IsValidUtf8("\xF0\x9F\x98"));
}

TEST(Utf8, CompletePrefixHoldsBackOnlyAnIncompleteTail) {
  EXPECT_EQ(CompleteUtf8Prefix("abc"), 3u);
  EXPECT_EQ(CompleteUtf8Prefix("ab\xF0\x9F\x98"), 2u);
  EXPECT_EQ(CompleteUtf8Prefix("ab\xF0\x9F\x98\x80"), 6u);
  EXPECT_EQ(CompleteUtf8Prefix("ab\xE4"), 2u);
  // An invalid byte is not "incomplete": it can be emitted (as U+FFFD) at once.
  EXPECT_EQ(CompleteUtf8Prefix("ab\xFF"), 3u);
  EXPECT_EQ(CompleteUtf8Prefix("\xE4\x41"), 2u);
}

TEST(Utf8, PythonIsSpace) {
  for (char32_t c : {0x09, 0x0A, 0x0B, 0x0C, 0x0D, 0x1C, 0x1F, 0x20, 0x85, 0xA0, 0x1680,
                     0x2000, 0x200A, 0x2028, 0x2029, 0x202F, 0x205F, 0x3000}) {
    EXPECT_TRUE(IsPythonSpace(c)) << std::hex << static_cast<uint32_t>(c);
  }
  for (char32_t c : {0x08, 0x21, 0x180E, 0x200B, 0xFEFF, 0x4E2D}) {
    EXPECT_FALSE(IsPythonSpace(c)) << std::hex << static_cast<uint32_t>(c);
  }
}

}  // namespace
}  // namespace coli::tok
