#define PCRE2_CODE_UNIT_WIDTH 8
#include "common/tokenizer/pretokenizer.h"

#include <pcre2.h>

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace coli::tok {
namespace {

using ::testing::ElementsAre;

std::string Utf8(char32_t c) {
  std::string s;
  if (c < 0x80) {
    s += static_cast<char>(c);
  } else if (c < 0x800) {
    s += static_cast<char>(0xC0 | (c >> 6));
    s += static_cast<char>(0x80 | (c & 0x3F));
  } else if (c < 0x10000) {
    s += static_cast<char>(0xE0 | (c >> 12));
    s += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    s += static_cast<char>(0x80 | (c & 0x3F));
  } else {
    s += static_cast<char>(0xF0 | (c >> 18));
    s += static_cast<char>(0x80 | ((c >> 12) & 0x3F));
    s += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    s += static_cast<char>(0x80 | (c & 0x3F));
  }
  return s;
}

// Which of `chars` (one code point each) a PCRE2 pattern (native syntax) matches, as 0/1.
std::vector<char> MatchEach(const std::string& pattern, const std::vector<char32_t>& chars) {
  int error = 0;
  PCRE2_SIZE offset = 0;
  std::string anchored = "^(?:" + pattern + ")$";
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(anchored.data()), anchored.size(),
                                   PCRE2_UTF | PCRE2_UCP, &error, &offset, nullptr);
  EXPECT_NE(code, nullptr) << pattern;
  std::vector<char> out(chars.size(), 0);
  if (code == nullptr) return out;
  pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);
  pcre2_match_data* md = pcre2_match_data_create_from_pattern(code, nullptr);
  for (size_t i = 0; i < chars.size(); ++i) {
    std::string s = Utf8(chars[i]);
    out[i] = pcre2_match(code, reinterpret_cast<PCRE2_SPTR>(s.data()), s.size(), 0, 0, md,
                         nullptr) >= 0;
  }
  pcre2_match_data_free(md);
  pcre2_code_free(code);
  return out;
}

std::vector<char32_t> AllScalarValues() {
  std::vector<char32_t> all;
  for (char32_t c = 0; c <= 0x10FFFF; ++c) {
    if (c < 0xD800 || c > 0xDFFF) all.push_back(c);
  }
  return all;
}

// The translation of Kimi's `[X&&[^\p{Han}]]` classes, proved on every Unicode scalar value:
// the complement class PCRE2 gets equals "in X (by general category) and not Script=Han".
TEST(KimiClassTranslation, EqualsIntersectionOnEveryCodePoint) {
  auto translated = TranslateToPcre2(kKimiPattern);
  ASSERT_TRUE(translated.ok()) << translated.status();
  const std::string upper_pcre2 = R"([^\p{sc:Han}\p{Ll}\p{N}\p{P}\p{S}\p{Z}\p{C}])";
  const std::string lower_pcre2 = R"([^\p{sc:Han}\p{Lu}\p{Lt}\p{N}\p{P}\p{S}\p{Z}\p{C}])";
  ASSERT_NE(translated->find(upper_pcre2), std::string::npos) << *translated;
  ASSERT_NE(translated->find(lower_pcre2), std::string::npos) << *translated;
  EXPECT_EQ(translated->find("&&"), std::string::npos);

  std::vector<char32_t> all = AllScalarValues();
  std::vector<char> han = MatchEach(R"(\p{sc:Han})", all);
  std::vector<char> upper_set = MatchEach(R"([\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}])", all);
  std::vector<char> lower_set = MatchEach(R"([\p{Ll}\p{Lm}\p{Lo}\p{M}])", all);
  std::vector<char> upper = MatchEach(upper_pcre2, all);
  std::vector<char> lower = MatchEach(lower_pcre2, all);
  size_t han_letters = 0;
  for (size_t i = 0; i < all.size(); ++i) {
    ASSERT_EQ(upper[i], upper_set[i] && !han[i]) << "U+" << std::hex << uint32_t(all[i]);
    ASSERT_EQ(lower[i], lower_set[i] && !han[i]) << "U+" << std::hex << uint32_t(all[i]);
    han_letters += han[i] && upper_set[i];
  }
  EXPECT_GT(han_letters, 90000u);  // the intersection really removes the CJK ideographs
}

TEST(KimiClassTranslation, CharactersWhereItMatters) {
  const std::string upper = R"([^\p{sc:Han}\p{Ll}\p{N}\p{P}\p{S}\p{Z}\p{C}])";
  const std::string lower = R"([^\p{sc:Han}\p{Lu}\p{Lt}\p{N}\p{P}\p{S}\p{Z}\p{C}])";
  // 中 (Lo, Han), 々 (Lm, Han), U+16FF0 (Mc, Han): letters/marks excluded because Han.
  // 〆 U+3006 (Lo, Script=Common, Script_Extensions=Han) and U+302A (Mn, Inherited): kept.
  // A (Lu), a (Ll), ǅ (Lt), ー (Lm), U+0301 (Mn), あ (Lo Hiragana), 〇 (Nl, Han), '1', ' '.
  std::vector<char32_t> chars = {0x4E2D, 0x3005, 0x16FF0, 0x3006, 0x302A, 'A',  'a',
                                 0x01C5, 0x30FC, 0x0301,  0x3042, 0x3007, '1', ' '};
  EXPECT_THAT(MatchEach(upper, chars), ElementsAre(0, 0, 0, 1, 1, 1, 0, 1, 1, 1, 1, 0, 0, 0));
  EXPECT_THAT(MatchEach(lower, chars), ElementsAre(0, 0, 0, 1, 1, 0, 1, 0, 1, 1, 1, 0, 0, 0));
  // Why `sc:`: PCRE2 >= 10.40 reads a bare \p{Han} as Script_Extensions, which includes 〆
  // and U+302A; Rust's regex (tiktoken) reads it as Script.
  EXPECT_THAT(MatchEach(R"(\p{Han})", {0x3006, 0x302A, 0x4E2D}), ElementsAre(1, 1, 1));
  EXPECT_THAT(MatchEach(R"(\p{sc:Han})", {0x3006, 0x302A, 0x4E2D}), ElementsAre(0, 0, 1));
}

TEST(TranslateToPcre2, WhiteSpaceIsUnicodeWhiteSpace) {
  auto s = TranslateToPcre2(R"(\s)");
  auto ns = TranslateToPcre2(R"(\S)");
  auto in_class = TranslateToPcre2(R"([^\s\p{L}])");
  ASSERT_TRUE(s.ok() && ns.ok() && in_class.ok());
  // Unicode White_Space (Rust's \s), including U+0085; not U+200B, U+180E.
  std::vector<char32_t> chars = {0x85, 0x20, 0x09, 0x0B, 0xA0, 0x3000, 0x2028, 0x200B, 'x', 0x180E};
  EXPECT_THAT(MatchEach(*s, chars), ElementsAre(1, 1, 1, 1, 1, 1, 1, 0, 0, 0));
  EXPECT_THAT(MatchEach(*ns, chars), ElementsAre(0, 0, 0, 0, 0, 0, 0, 1, 1, 1));
  EXPECT_THAT(MatchEach(*in_class, chars), ElementsAre(0, 0, 0, 0, 0, 0, 0, 1, 0, 1));
}

TEST(TranslateToPcre2, ScriptsAndCategories) {
  EXPECT_EQ(*TranslateToPcre2(R"(\p{Han}\p{L}\P{Greek}\p{sc:Latin}\p{Lu})"),
            R"(\p{sc:Han}\p{L}\P{sc:Greek}\p{sc:Latin}\p{Lu})");
}

TEST(TranslateToPcre2, RefusesWhatItCannotTranslate) {
  EXPECT_EQ(TranslateToPcre2(R"([a-z&&[^aeiou]])").status().code(),
            absl::StatusCode::kUnimplemented);
  EXPECT_EQ(TranslateToPcre2(R"([\S\d])").status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_EQ(TranslateToPcre2(R"(\p{L)").status().code(), absl::StatusCode::kInvalidArgument);
  auto bad = PreTokenizer::FromPattern("(unclosed");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(bad.status().message()), ::testing::HasSubstr("does not compile"));
}

TEST(DetectFamily, VendorPatterns) {
  EXPECT_EQ(DetectFamily(kKimiPattern), PatternFamily::kKimi);
  EXPECT_EQ(DetectFamily(kO200kPattern), PatternFamily::kO200k);
  EXPECT_EQ(DetectFamily(kCl100kPattern), PatternFamily::kCl100k);
  EXPECT_EQ(DetectFamily(kGpt2Pattern), PatternFamily::kGpt2);
  EXPECT_EQ(DetectFamily(R"(\p{L}+|\s+)"), PatternFamily::kCustom);
  EXPECT_EQ(PatternFamilyName(PatternFamily::kKimi), "kimi");
}

std::vector<std::string> Split(const PreTokenizer& p, std::string_view text) {
  std::vector<std::string> out;
  p.ForEachPiece(text, false, [&](std::string_view piece) { out.emplace_back(piece); });
  return out;
}

TEST(PreTokenizer, KimiSplits) {
  auto p = PreTokenizer::FromPattern(kKimiPattern);
  ASSERT_TRUE(p.ok()) << p.status();
  const PreTokenizer& k = **p;
  EXPECT_EQ(k.family(), PatternFamily::kKimi);
  // Han runs are their own pieces; Han never joins a letter run.
  EXPECT_THAT(Split(k, "Ab中Cd"), ElementsAre("Ab", "中", "Cd"));
  EXPECT_THAT(Split(k, "我爱AI2024年"), ElementsAre("我爱", "AI", "202", "4", "年"));
  EXPECT_THAT(Split(k, " 中文"), ElementsAre(" ", "中文"));
  // 々 is Han (Lm); 〆 is Common (Lo) so it joins letters, not Han.
  EXPECT_THAT(Split(k, "人々〆切"), ElementsAre("人々", "〆", "切"));
  EXPECT_THAT(Split(k, "x〆y"), ElementsAre("x〆y"));
  // Case rules and contractions (case-insensitive, including the long s).
  EXPECT_THAT(Split(k, "I'M don'T"), ElementsAre("I'M", " don'T"));
  EXPECT_THAT(Split(k, "x'ſ"), ElementsAre("x'ſ"));
  EXPECT_THAT(Split(k, "camelCaseXMLHttp"), ElementsAre("camel", "Case", "XMLHttp"));
  EXPECT_THAT(Split(k, "e\u0301te\u0301"), ElementsAre("e\u0301te\u0301"));
  // Whitespace and punctuation.
  EXPECT_THAT(Split(k, "a\r\nb"), ElementsAre("a", "\r\n", "b"));
  EXPECT_THAT(Split(k, "end   "), ElementsAre("end", "   "));
  EXPECT_THAT(Split(k, "a  \n b"), ElementsAre("a", "  \n", " b"));
  EXPECT_THAT(Split(k, "!!!\n\n???"), ElementsAre("!!!\n\n", "???"));
  // No '/' in the punctuation tail (o200k has one).
  EXPECT_THAT(Split(k, ".\n/x"), ElementsAre(".\n", "/x"));
}

TEST(PreTokenizer, O200kAndCl100kSplits) {
  auto o = PreTokenizer::FromPattern(kO200kPattern);
  auto c = PreTokenizer::FromPattern(kCl100kPattern);
  ASSERT_TRUE(o.ok() && c.ok());
  EXPECT_THAT(Split(**o, ".\n/x"), ElementsAre(".\n/", "x"));
  EXPECT_THAT(Split(**o, "Ab中Cd"), ElementsAre("Ab中", "Cd"));
  EXPECT_THAT(Split(**c, "Ab中Cd"), ElementsAre("Ab中Cd"));
  EXPECT_THAT(Split(**c, "I'M"), ElementsAre("I", "'M"));
  EXPECT_THAT(Split(**c, "12345"), ElementsAre("123", "45"));
}

TEST(PreTokenizer, KeepGapsPassesUnmatchedText) {
  auto p = PreTokenizer::FromPattern(R"(\p{L}+)");
  ASSERT_TRUE(p.ok());
  std::vector<std::string> kept, dropped;
  (*p)->ForEachPiece("ab, cd!", true, [&](std::string_view s) { kept.emplace_back(s); });
  (*p)->ForEachPiece("ab, cd!", false, [&](std::string_view s) { dropped.emplace_back(s); });
  EXPECT_THAT(kept, ElementsAre("ab", ", ", "cd", "!"));
  EXPECT_THAT(dropped, ElementsAre("ab", "cd"));
}

TEST(PreTokenizer, LongRunsDoNotExhaustTheStack) {
  auto p = PreTokenizer::FromPattern(kKimiPattern);
  ASSERT_TRUE(p.ok());
  for (const std::string& s : {std::string(1 << 20, 'A'), std::string(1 << 20, ' ') + "x",
                               std::string(1 << 20, '!')}) {
    size_t total = 0;
    (*p)->ForEachPiece(s, false, [&](std::string_view piece) { total += piece.size(); });
    EXPECT_EQ(total, s.size());
  }
}

}  // namespace
}  // namespace coli::tok
