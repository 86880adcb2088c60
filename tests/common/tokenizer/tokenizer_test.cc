#include "common/tokenizer/tokenizer.h"

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "common/tokenizer/utf8.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/common/io/test_files.h"

namespace coli::tok {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::string Env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : ".";
}
std::string TinyDir() { return Env("COLI_SOURCE_DIR") + "/tests/common/tokenizer/data/kimi_tiny"; }
// Made at build time from TinyDir() by tools/tokenizer/tiktoken_to_tokenizer_json.py.
std::string TinyJsonDir() { return Env("COLI_BINARY_DIR") + "/fixtures/tokenizer/kimi_tiny_json"; }

const Tokenizer& Tiny() {
  static const Tokenizer* tok = [] {
    auto t = Tokenizer::LoadDir(TinyDir());
    if (!t.ok()) {
      ADD_FAILURE() << t.status();
      std::abort();
    }
    return t->release();
  }();
  return *tok;
}

// The tiny fixture: ids 0..255 are the bytes, then (rank order) "he" 256, "ll" 257, "in" 258,
// "th" 259, " t" 260, "the" 261, " the" 262, "er" 263, "hell" 264, "hello" 265, " w" 266,
// "or" 267, " wor" 268, " world" 269, "中" 270, "中文" 271, "aa" 272, "aaaa" 273; specials
// from 274 ([BOS] 274 ... <|open|> 277 ... [PAD] 529).
TEST(Tokenizer, TinyFixtureLayout) {
  const Tokenizer& t = Tiny();
  EXPECT_EQ(t.num_base_tokens(), 274);
  EXPECT_EQ(t.vocab_size(), 530);
  EXPECT_EQ(t.family(), PatternFamily::kKimi);
  EXPECT_EQ(t.TokenId("<|open|>"), 277);
  EXPECT_EQ(t.TokenId("<|end_of_msg|>"), 276);
  EXPECT_EQ(t.TokenId("[PAD]"), 529);
  EXPECT_EQ(t.TokenId("<|reserved_token_300|>"), 300);
  EXPECT_EQ(t.TokenId("hello"), 265);
  EXPECT_EQ(t.TokenId("nope"), std::nullopt);
  EXPECT_EQ(t.TokenBytes(277), "<|open|>");
  EXPECT_EQ(t.TokenBytes(97), "a");
  EXPECT_EQ(t.TokenBytes(530), "");
  EXPECT_EQ(t.TokenBytes(-1), "");
  EXPECT_TRUE(t.IsSpecial(277));
  EXPECT_TRUE(t.IsSpecial(300));
  EXPECT_FALSE(t.IsSpecial(265));
  EXPECT_FALSE(t.IsSpecial(530));
}

TEST(Tokenizer, EncodesByRankBpe) {
  const Tokenizer& t = Tiny();
  // "hello" is a token; " world" too; " the" too; " " alone before Han; Han run "中文".
  EXPECT_THAT(t.Encode("hello world the 中文", false), ElementsAre(265, 269, 262, 32, 271));
  // "hellothe": h-e (256) first, then l-l (257), then "hell" (264), "hello" (265); "th" (259)
  // then "the" (261).
  EXPECT_THAT(t.Encode("hellothe", false), ElementsAre(265, 261));
  // Ties: leftmost "aa" first: aa|aa|aa|a -> aaaa|aa|a.
  EXPECT_THAT(t.Encode("aaaaaaa", false), ElementsAre(273, 272, 97));
  // "中" is a token but unreachable by merges (no 2-byte prefix): only a whole piece uses it.
  EXPECT_THAT(t.Encode("中", false), ElementsAre(270));
  EXPECT_THAT(t.Encode("中中", false), ElementsAre(0xE4, 0xB8, 0xAD, 0xE4, 0xB8, 0xAD));
  EXPECT_TRUE(t.Encode("", false).empty());
}

TEST(Tokenizer, SpecialTokensOnlyWhenAllowed) {
  const Tokenizer& t = Tiny();
  std::vector<int32_t> off = t.Encode("<|open|>", false);
  EXPECT_THAT(off, ElementsAre('<', '|', 'o', 'p', 'e', 'n', '|', '>'));
  EXPECT_THAT(t.Encode("<|open|>", true), ElementsAre(277));
  EXPECT_THAT(t.Encode("hello<|sep|>hello", true), ElementsAre(265, 279, 265));
  EXPECT_THAT(t.Encode("[BOS]<|reserved_token_300|>", true), ElementsAre(274, 300));
  EXPECT_THAT(t.Encode("<|open|", true), ElementsAre('<', '|', 'o', 'p', 'e', 'n', '|'));
  for (int32_t id : t.Encode("user text <|open|>[BOS]<|end_of_msg|>", false)) {
    EXPECT_LT(id, t.num_base_tokens());
  }
}

TEST(Tokenizer, DecodeRoundTrip) {
  const Tokenizer& t = Tiny();
  for (const std::string s :
       {"hello world", "中文 mixed 123 text\r\n\ttabs  ", "👨‍👩‍👧‍👦 e\u0301", "<|open|>x<|sep|>",
        "I'M don't", "", "\x7f\x01", "aaaaaaaaaaaaaaaaaaaa"}) {
    for (bool special : {false, true}) {
      auto decoded = t.Decode(t.Encode(s, special));
      ASSERT_TRUE(decoded.ok()) << decoded.status();
      EXPECT_EQ(*decoded, s);
    }
  }
}

TEST(Tokenizer, DecodeRejectsIdsOutsideTheVocabulary) {
  const Tokenizer& t = Tiny();
  std::vector<int32_t> ids = {265, 530};
  auto d = t.Decode(ids);
  EXPECT_EQ(d.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(d.status().message()), HasSubstr("token id 530 (position 1)"));
  std::vector<int32_t> negative = {-1};
  EXPECT_EQ(t.Decode(negative).status().code(), absl::StatusCode::kInvalidArgument);
}

// tiktoken takes text, so invalid bytes reach it as U+FFFD (decode with replacement).
TEST(Tokenizer, InvalidUtf8IsReplacedFirst) {
  const Tokenizer& t = Tiny();
  EXPECT_EQ(t.Encode("a\xFF" "b\xE4\xB8", false), t.Encode("a\uFFFD" "b\uFFFD", false));
  EXPECT_EQ(t.Encode("\xED\xA0\x80", false), t.Encode("\uFFFD\uFFFD\uFFFD", false));
}

// tiktoken's _byte_pair_merge written plainly (strings, full rescans): the reference for both
// BPE paths (the rescan loop below 128 bytes and the heap above).
std::vector<int32_t> NaiveRankBpe(const std::map<std::string, int32_t>& ranks,
                                  const std::string& piece) {
  if (auto it = ranks.find(piece); it != ranks.end()) return {it->second};
  std::vector<std::string> parts;
  for (char c : piece) parts.emplace_back(1, c);
  while (true) {
    int32_t best = INT32_MAX;
    size_t at = 0;
    for (size_t i = 0; i + 1 < parts.size(); ++i) {
      auto it = ranks.find(parts[i] + parts[i + 1]);
      if (it != ranks.end() && it->second < best) {
        best = it->second;
        at = i;
      }
    }
    if (best == INT32_MAX) break;
    parts[at] += parts[at + 1];
    parts.erase(parts.begin() + at + 1);
  }
  std::vector<int32_t> out;
  for (const auto& p : parts) out.push_back(ranks.at(p));
  return out;
}

std::string Base64(const std::string& in) {
  static const char* k = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  size_t i = 0;
  for (; i + 2 < in.size(); i += 3) {
    uint32_t v = (uint8_t(in[i]) << 16) | (uint8_t(in[i + 1]) << 8) | uint8_t(in[i + 2]);
    for (int s = 18; s >= 0; s -= 6) out += k[(v >> s) & 63];
  }
  if (in.size() - i == 1) {
    uint32_t v = uint8_t(in[i]) << 16;
    out += k[(v >> 18) & 63];
    out += k[(v >> 12) & 63];
    out += "==";
  } else if (in.size() - i == 2) {
    uint32_t v = (uint8_t(in[i]) << 16) | (uint8_t(in[i + 1]) << 8);
    out += k[(v >> 18) & 63];
    out += k[(v >> 12) & 63];
    out += k[(v >> 6) & 63];
    out += '=';
  }
  return out;
}

std::string TiktokenText(const std::vector<std::string>& tokens) {
  std::string text;
  for (size_t r = 0; r < tokens.size(); ++r) text += Base64(tokens[r]) + " " + std::to_string(r) + "\n";
  return text;
}

std::vector<std::string> ByteTokens() {
  std::vector<std::string> tokens;
  for (int b = 0; b < 256; ++b) tokens.emplace_back(1, static_cast<char>(b));
  return tokens;
}

TEST(Tokenizer, RankBpeMatchesNaiveReferenceOnShortAndLongPieces) {
  // A vocabulary with many overlapping merges over {a, b, c}: every 2- and 3-letter string
  // and a few longer ones, in a shuffled rank order.
  std::mt19937 rng(12345);
  std::vector<std::string> extra;
  const std::string abc = "abc";
  for (char x : abc)
    for (char y : abc) extra.push_back({x, y});
  for (char x : abc)
    for (char y : abc)
      for (char z : abc) extra.push_back({x, y, z});
  for (const char* s : {"abab", "aaaa", "abcabc", "cccc", "bbbbbbbb", "abcab"}) extra.push_back(s);
  std::shuffle(extra.begin(), extra.end(), rng);
  std::vector<std::string> tokens = ByteTokens();
  tokens.insert(tokens.end(), extra.begin(), extra.end());
  auto tok = Tokenizer::FromTiktoken(TiktokenText(tokens), "", "test:");
  ASSERT_TRUE(tok.ok()) << tok.status();
  std::map<std::string, int32_t> ranks;
  for (size_t r = 0; r < tokens.size(); ++r) ranks[tokens[r]] = static_cast<int32_t>(r);
  std::uniform_int_distribution<int> letter(0, 2);
  for (int trial = 0; trial < 260; ++trial) {
    size_t len = 1 + rng() % (trial < 200 ? 60 : 400);
    std::string piece;
    for (size_t i = 0; i < len; ++i) piece += abc[letter(rng)];
    std::vector<int32_t> got;
    (*tok)->EncodePiece(piece, &got);
    ASSERT_EQ(got, NaiveRankBpe(ranks, piece)) << piece;
  }
}

TEST(Tokenizer, MegabyteInputsEncode) {
  const Tokenizer& t = Tiny();
  // One repeated character and one long word: decoding gives the input back (the time limit
  // lives in `coli bench tokenizer`).
  for (const std::string& s : {std::string(1 << 20, 'a'), std::string(1 << 20, ' '),
                               [] {
                                 std::string w;
                                 while (w.size() < (1u << 20)) w += "helloworldthe";
                                 return w;
                               }()}) {
    auto d = t.Decode(t.Encode(s, false));
    ASSERT_TRUE(d.ok());
    EXPECT_EQ(d->size(), s.size());
    EXPECT_TRUE(*d == s);
  }
}

TEST(Tokenizer, VendorSlicingCutsLongRuns) {
  auto loaded = Tokenizer::LoadDir(TinyDir());
  ASSERT_TRUE(loaded.ok());
  Tokenizer& t = **loaded;
  ASSERT_TRUE(t.vendor_slicing());
  // tokenization_kimi.py cuts a run of 60,000 non-space characters at 25,000 and 50,000.
  std::string run(60000, 'a');
  std::vector<int32_t> sliced = t.Encode(run, false);
  t.set_vendor_slicing(false);
  std::vector<int32_t> expected;
  for (size_t n : {25000, 25000, 10000}) {
    std::vector<int32_t> part = t.Encode(std::string(n, 'a'), false);
    expected.insert(expected.end(), part.begin(), part.end());
  }
  EXPECT_EQ(sliced, expected);
  // Runs alternate: whitespace and non-whitespace runs are counted separately.
  std::string mixed = std::string(20000, 'a') + std::string(20000, ' ') + std::string(20000, 'b');
  std::vector<int32_t> plain = t.Encode(mixed, false);
  t.set_vendor_slicing(true);
  EXPECT_EQ(t.Encode(mixed, false), plain);
}

TEST(Tokenizer, JsonFormMatchesTiktokenForm) {
  auto json = Tokenizer::LoadDir(TinyJsonDir());
  ASSERT_TRUE(json.ok()) << json.status();
  const Tokenizer& a = Tiny();
  const Tokenizer& b = **json;
  EXPECT_FALSE(b.merges_bpe());
  EXPECT_EQ(b.family(), PatternFamily::kKimi);
  ASSERT_EQ(a.vocab_size(), b.vocab_size());
  for (int32_t id = 0; id < a.vocab_size(); ++id) {
    ASSERT_EQ(a.TokenBytes(id), b.TokenBytes(id)) << id;
    ASSERT_EQ(a.IsSpecial(id), b.IsSpecial(id)) << id;
  }
  for (const std::string s : {"hello world the 中文", "hellothe aaaaaaa", "<|open|>x[BOS]",
                              "I'M don'T\r\n\t  end  ", "我爱AI2024年", "e\u0301 👍🏽"}) {
    EXPECT_EQ(a.Encode(s, false), b.Encode(s, false)) << s;
    EXPECT_EQ(a.Encode(s, true), b.Encode(s, true)) << s;
  }
}

// A Hugging Face merges-BPE tokenizer.json (byte-level, GPT-2 alphabet) built in the test.
std::string MergesTokenizerJson(const std::vector<std::pair<std::string, std::string>>& merges,
                                bool ignore_merges) {
  // GPT-2 byte-to-unicode for the bytes we need: printable ASCII maps to itself, space to Ġ.
  nlohmann::json vocab = nlohmann::json::object();
  int n = 0;
  for (int b = 0; b < 256; ++b) {
    bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
    char32_t c = printable ? b : 256 + n++;
    std::string u;
    if (c < 0x80) {
      u += static_cast<char>(c);
    } else {
      u += static_cast<char>(0xC0 | (c >> 6));
      u += static_cast<char>(0x80 | (c & 0x3F));
    }
    vocab[u] = b;
  }
  int next_id = 256;
  nlohmann::json merge_list = nlohmann::json::array();
  for (const auto& [l, r] : merges) {
    if (!vocab.contains(l + r)) vocab[l + r] = next_id++;
    merge_list.push_back(l + " " + r);
  }
  nlohmann::json doc = {
      {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", merge_list},
                 {"ignore_merges", ignore_merges}}},
      {"normalizer", nullptr},
      {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}},
      {"added_tokens", nlohmann::json::array({{{"id", next_id}, {"content", "<s>"}, {"special", true}}})},
  };
  return doc.dump();
}

TEST(Tokenizer, MergesBpeFollowsMergeOrderNotIds) {
  // Ids follow first appearance in the merge list. With "a b" first, ab = 256 and abc -> ab|c;
  // with "b c" first (bc = 256, ab = 257) -> a|bc, although rank-BPE by id would then take
  // bc too: the second case adds a chain where id order and merge order disagree.
  auto tok = Tokenizer::FromTokenizerJson(MergesTokenizerJson({{"a", "b"}, {"b", "c"}}, false), "", "");
  ASSERT_TRUE(tok.ok()) << tok.status();
  EXPECT_TRUE((*tok)->merges_bpe());
  EXPECT_THAT((*tok)->Encode("abc", false), ElementsAre(256, 'c'));
  auto swapped = MergesTokenizerJson({{"b", "c"}, {"a", "b"}}, false);
  tok = Tokenizer::FromTokenizerJson(swapped, "", "");
  ASSERT_TRUE(tok.ok()) << tok.status();
  EXPECT_THAT((*tok)->Encode("abc", false), ElementsAre('a', 256));
  EXPECT_THAT((*tok)->Encode("abc <s>", true), ElementsAre('a', 256, ' ', 258));
  // GPT-2 pattern from ByteLevel(use_regex=true): " bc" is one piece, "Ġb" "c" then merged.
  EXPECT_THAT((*tok)->Encode(" bc", false), ElementsAre(' ', 256));
  // A merge chain whose intermediate is not reachable by merge order: "abc" as a word is in
  // the vocabulary, but only ignore_merges uses that.
  auto chain = MergesTokenizerJson({{"b", "c"}, {"a", "b"}, {"ab", "c"}}, false);
  tok = Tokenizer::FromTokenizerJson(chain, "", "");
  ASSERT_TRUE(tok.ok()) << tok.status();
  EXPECT_THAT((*tok)->Encode("abc", false), ElementsAre('a', 256));
  tok = Tokenizer::FromTokenizerJson(MergesTokenizerJson({{"b", "c"}, {"a", "b"}, {"ab", "c"}}, true),
                                     "", "");
  ASSERT_TRUE(tok.ok()) << tok.status();
  EXPECT_THAT((*tok)->Encode("abc", false), ElementsAre(258));
}

TEST(Tokenizer, AddedTokenMayRepeatABaseToken) {
  // GPT-2's tokenizer.json lists <|endoftext|> both in model.vocab and in added_tokens.
  nlohmann::json doc = nlohmann::json::parse(MergesTokenizerJson({{"a", "b"}}, false));
  doc["added_tokens"].push_back({{"id", 256}, {"content", "ab"}, {"special", true}});
  auto tok = Tokenizer::FromTokenizerJson(doc.dump(), "", "");
  ASSERT_TRUE(tok.ok()) << tok.status();
  EXPECT_TRUE((*tok)->IsSpecial(256));
  EXPECT_THAT((*tok)->Encode("xab", true), ElementsAre('x', 256));
  doc["added_tokens"].push_back({{"id", 98}, {"content", "zz"}, {"special", true}});
  EXPECT_THAT(std::string(Tokenizer::FromTokenizerJson(doc.dump(), "", "").status().message()),
              HasSubstr("inside the base vocabulary"));
}

TEST(StreamDecoder, NeverEmitsPartialCharacters) {
  const Tokenizer& t = Tiny();
  const std::string text = "héllo 中文😀 e\u0301 <|open|>";
  std::vector<int32_t> ids = t.Encode(text, true);
  StreamDecoder stream(t);
  StreamDecoder raw(t, /*replace_invalid=*/false);
  std::string out, raw_out;
  for (int32_t id : ids) {
    std::string piece = stream.Push(id);
    EXPECT_TRUE(IsValidUtf8(piece)) << id;
    out += piece;
    raw_out += raw.Push(id);
  }
  out += stream.Flush();
  raw_out += raw.Flush();
  EXPECT_EQ(out, text);
  EXPECT_EQ(raw_out, *t.Decode(ids));
}

TEST(StreamDecoder, InvalidAndTruncatedBytes) {
  const Tokenizer& t = Tiny();
  StreamDecoder stream(t);
  EXPECT_EQ(stream.Push(0xE4), "");
  EXPECT_EQ(stream.Push(0xB8), "");
  EXPECT_EQ(stream.Push('a'), "\uFFFD" "a");  // E4 B8 cannot complete: one replacement
  EXPECT_EQ(stream.Push(0xFF), "\uFFFD");
  EXPECT_EQ(stream.Push(0xF0), "");
  EXPECT_EQ(stream.Push(0x9F), "");
  EXPECT_EQ(stream.Flush(), "\uFFFD");  // nothing lost at the end of the stream
  EXPECT_EQ(stream.Flush(), "");
  StreamDecoder raw(t, false);
  EXPECT_EQ(raw.Push(0xF0), "");
  EXPECT_EQ(raw.Push(0x9F), "");
  EXPECT_EQ(raw.Flush(), "\xF0\x9F");
  EXPECT_EQ(raw.Push(99999), "");  // outside the vocabulary: no bytes
}

// ---- bad input ----

absl::Status TiktokenError(const std::string& model, const std::string& config = "") {
  return Tokenizer::FromTiktoken(model, config, "dir/").status();
}

std::string TinyModelText() { return test_files::ReadRaw(TinyDir() + "/tiktoken.model"); }

TEST(TokenizerLoad, MalformedBase64Line) {
  std::string model = TinyModelText() + "@@@@ 274\n";
  absl::Status s = TiktokenError(model);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(s.message()), HasSubstr("dir/tiktoken.model line 275: malformed base64"));
  EXPECT_EQ(TiktokenError(TinyModelText() + "YQ 274\n").code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(TiktokenError(TinyModelText() + "YR== 274\n").code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(TiktokenError(TinyModelText() + "YWJj\n").message()),
              HasSubstr("line 275: expected '<base64> <rank>'"));
  EXPECT_THAT(std::string(TiktokenError(TinyModelText() + "YWJj x\n").message()),
              HasSubstr("line 275: bad rank 'x'"));
}

TEST(TokenizerLoad, DuplicateRank) {
  absl::Status s = TiktokenError(TinyModelText() + "YWJj 5\n");
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(s.message()), HasSubstr("line 275: duplicate rank 5 (first on line 6)"));
}

TEST(TokenizerLoad, DuplicateTokenBytesAndRankGaps) {
  EXPECT_THAT(std::string(TiktokenError(TinyModelText() + "YQ== 274\n").message()),
              HasSubstr("appear twice (ids 97 and 274)"));
  EXPECT_THAT(std::string(TiktokenError(TinyModelText() + "YWJj 300\n").message()),
              HasSubstr("rank 274 is missing"));
}

TEST(TokenizerLoad, MissingByteToken) {
  std::vector<std::string> tokens = ByteTokens();
  tokens[0x41] = "AB";  // no single-byte "A"
  absl::Status s = TiktokenError(TiktokenText(tokens));
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(s.message()), HasSubstr("no token for the single byte 0x41"));
}

TEST(TokenizerLoad, BadTokenizerConfig) {
  const std::string model = TinyModelText();
  EXPECT_EQ(TiktokenError(model, "{not json").code(), absl::StatusCode::kInvalidArgument);
  absl::Status inside = TiktokenError(model, R"({"added_tokens_decoder": {"10": {"content": "<x>"}}})");
  EXPECT_THAT(std::string(inside.message()), HasSubstr("inside the base vocabulary"));
  absl::Status key = TiktokenError(model, R"({"added_tokens_decoder": {"x1": {"content": "<x>"}}})");
  EXPECT_THAT(std::string(key.message()),
              HasSubstr("tokenizer_config.json: added_tokens_decoder[\"x1\"]: key is not a token id"));
  absl::Status twice = TiktokenError(
      model, R"({"added_tokens_decoder": {"280": {"content": "<x>"}, "281": {"content": "<x>"}}})");
  EXPECT_THAT(std::string(twice.message()), HasSubstr("appears twice"));
  absl::Status pattern = TiktokenError(model, R"({"pat_str": "[a&&b]"})");
  EXPECT_EQ(pattern.code(), absl::StatusCode::kUnimplemented);
  // A custom pat_str and reserve count are honoured.
  auto cl = Tokenizer::FromTiktoken(
      model, R"({"pat_str": "\\p{L}+|\\s+|\\p{N}{1,3}|[^\\s\\p{L}\\p{N}]+", "num_reserved_special_tokens": 2})",
      "");
  ASSERT_TRUE(cl.ok()) << cl.status();
  EXPECT_EQ((*cl)->vocab_size(), 276);
  EXPECT_EQ((*cl)->family(), PatternFamily::kCustom);
}

TEST(TokenizerLoad, BadTokenizerJson) {
  auto code = [](const std::string& json) {
    return Tokenizer::FromTokenizerJson(json, "", "d/").status();
  };
  EXPECT_EQ(code("[").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code(R"({"model": {"type": "WordPiece"}})").code(), absl::StatusCode::kUnimplemented);
  nlohmann::json doc = nlohmann::json::parse(MergesTokenizerJson({{"a", "b"}}, false));
  doc["normalizer"] = {{"type", "NFC"}};
  EXPECT_THAT(std::string(code(doc.dump()).message()), HasSubstr("normalizer NFC is not supported"));
  doc = nlohmann::json::parse(MergesTokenizerJson({{"a", "b"}}, false));
  doc["model"]["vocab"]["\xE4\xB8\xAD"] = 999;
  EXPECT_THAT(std::string(code(doc.dump()).message()), HasSubstr("outside the byte-level alphabet"));
  doc = nlohmann::json::parse(MergesTokenizerJson({{"a", "b"}}, false));
  doc["model"]["merges"].push_back("x yz");
  EXPECT_THAT(std::string(code(doc.dump()).message()), HasSubstr("model.merges[1]"));
  doc = nlohmann::json::parse(MergesTokenizerJson({{"a", "b"}}, false));
  doc["model"]["vocab"].erase("a");
  EXPECT_THAT(std::string(code(doc.dump()).message()), HasSubstr("97 is missing"));
}

// Each file the loader cannot read is named with the reason, not a bare "cannot open" (and a
// dangling tiktoken.model symlink is not reported as "neither tiktoken.model nor tokenizer.json").
TEST(TokenizerLoad, UnreadableFilesNameTheReason) {
  namespace fs = std::filesystem;
  const fs::path dir =
      fs::temp_directory_path() / ("coli_tok_unreadable_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  fs::create_symlink("../../blobs/77aa", dir / "tiktoken.model");
  auto dangling = Tokenizer::LoadDir(dir.string());
  EXPECT_EQ(dangling.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(dangling.status().message()),
              HasSubstr("tiktoken.model': cannot open: it is a symlink to '../../blobs/77aa'"));
  fs::remove(dir / "tiktoken.model");
  fs::create_directories(dir / "tiktoken.model");
  EXPECT_THAT(std::string(Tokenizer::LoadDir(dir.string()).status().message()),
              HasSubstr("tiktoken.model': is a directory"));
  fs::remove(dir / "tiktoken.model");
  std::ofstream(dir / "tiktoken.model") << "IQ== 0\n";
  fs::permissions(dir / "tiktoken.model", fs::perms::none);
  if (::access((dir / "tiktoken.model").c_str(), R_OK) != 0) {  // not root
    auto denied = Tokenizer::LoadDir(dir.string());
    EXPECT_EQ(denied.status().code(), absl::StatusCode::kPermissionDenied);
    EXPECT_THAT(std::string(denied.status().message()),
                HasSubstr("tiktoken.model': cannot open: Permission denied"));
  }
  fs::remove_all(dir);
}

TEST(TokenizerLoad, MissingDirectoryOrFiles) {
  EXPECT_EQ(Tokenizer::LoadDir("/nonexistent/dir").status().code(), absl::StatusCode::kNotFound);
  auto empty = Tokenizer::LoadDir(Env("COLI_SOURCE_DIR") + "/tests/common/tokenizer");
  EXPECT_EQ(empty.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(empty.status().message()), HasSubstr("neither tiktoken.model nor tokenizer.json"));
}

}  // namespace
}  // namespace coli::tok
