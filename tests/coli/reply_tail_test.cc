#include "tools/coli/reply_tail.h"

#include <gtest/gtest.h>

namespace coli::client {
namespace {

constexpr char kReplacement[] = "\xEF\xBF\xBD";

TEST(ReplyTail, KeepsTheLastFourTokensAndASpecialTokenClearsThem) {
  ReplyTail tail(/*first_special=*/100);
  for (int32_t id : {1, 2, 3, 4, 5, 6}) tail.Push(id);
  EXPECT_EQ(tail.ids(), (std::vector<int32_t>{3, 4, 5, 6}));
  tail.Push(100);  // the first special id
  EXPECT_TRUE(tail.empty());
  tail.Push(7);
  tail.Push(250);
  EXPECT_TRUE(tail.empty());
  tail.Push(99);
  EXPECT_EQ(tail.ids(), (std::vector<int32_t>{99}));
}

TEST(ReplyTail, MarksOnlyBytesThatEndInsideACharacter) {
  EXPECT_EQ(ReplyTail::Marker(""), "");
  EXPECT_EQ(ReplyTail::Marker("abc"), "");
  EXPECT_EQ(ReplyTail::Marker("\xE4\xB8\xAD"), "");            // 中, whole
  EXPECT_EQ(ReplyTail::Marker("a\xE4"), kReplacement);         // its first byte
  EXPECT_EQ(ReplyTail::Marker("a\xE4\xB8"), kReplacement);     // its first two
  EXPECT_EQ(ReplyTail::Marker("\xF0\x9F\x98"), kReplacement);  // 3 of an emoji's 4
  EXPECT_EQ(ReplyTail::Marker("\xB8\xAD"), "");                // a character begun earlier
  EXPECT_EQ(ReplyTail::Marker("\xFF"), "");                    // invalid, not unfinished
  EXPECT_EQ(ReplyTail::Marker("\xE4\xE4"), kReplacement);      // the second one unfinished
}

TEST(ReplyTail, FirstSpecialIdIsTheLowestListedOrTheVocabularySize) {
  v1::ModelInfo info;
  info.set_vocab_size(1000);
  EXPECT_EQ(FirstSpecialId(info), 1000);
  info.add_special_tokens()->set_id(990);
  info.add_special_tokens()->set_id(950);
  EXPECT_EQ(FirstSpecialId(info), 950);
}

}  // namespace
}  // namespace coli::client
