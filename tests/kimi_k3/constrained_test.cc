// plugins/kimi_k3/constrained: the answer constraint's phases on the tiny fixture's tokenizer
// (768 ids, XTML specials). The reference for the answer's allowed set is independent of
// common/grammar: for a schema that is one enum of strings, a token is allowed exactly when the
// output so far plus its bytes is a prefix of one of the literals' JSON texts, and the stop
// tokens exactly when the output is one whole literal. The XTML transitions are checked against
// the tokenizer's own encoding of the tags. Tool calls in the typed-argument form: the allowed
// element headers against the finite set of headers the schema allows (written out by hand),
// and the finished call read back by the chat parser.
#include "plugins/kimi_k3/constrained.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/grammar/json_constraint.h"
#include "common/status/status_matchers.h"
#include "common/tokenizer/tokenizer.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "plugins/kimi_k3/chat_parser.h"

namespace coli::k3 {
namespace {

using ::coli::testing::StatusIs;
using ::testing::HasSubstr;

class ConstrainedTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto t = tok::Tokenizer::LoadDir(COLI_K3_TINY_DIR);
    ASSERT_OK(t.status());
    tokenizer_ = std::move(t).value();
    auto ids = FindStructuralIds(*tokenizer_);
    ASSERT_OK(ids.status());
    ids_ = *ids;
    stops_ = {ids_.end_of_msg};
    auto vocab = ConstraintVocab::Build(*tokenizer_, tokenizer_->vocab_size(), stops_);
    ASSERT_OK(vocab.status());
    vocab_ = std::move(vocab).value();
  }

  static std::shared_ptr<const grammar::JsonConstraint> Enum(const std::string& literals) {
    auto c = grammar::JsonConstraint::FromResponseFormat(
        R"({"type":"json_schema","json_schema":{"name":"e","schema":{"enum":[)" + literals +
        "]}}}");
    EXPECT_OK(c.status());
    return c.ok() ? *c : nullptr;
  }
  std::vector<int32_t> Encode(const std::string& text) const {
    return tokenizer_->Encode(text, false);
  }
  bool Special(int32_t id) const { return tokenizer_->IsSpecial(id); }
  bool IsStop(int32_t id) const {
    return std::find(stops_.begin(), stops_.end(), id) != stops_.end();
  }

  // Walks the answer of `c` (already answering) to one of `texts` (JSON texts of the literals)
  // taking the longest allowed token each step, checking the allowed set against the reference
  // at every step. Returns the output.
  std::string WalkLiteral(AnswerConstraint* c, const std::vector<std::string>& texts, bool chat) {
    std::string out;
    for (int step = 0; step < 64; ++step) {
      std::vector<uint8_t> allowed;
      c->Allowed(&allowed);
      EXPECT_EQ(allowed.size(), static_cast<size_t>(tokenizer_->vocab_size()));
      const bool whole = std::find(texts.begin(), texts.end(), out) != texts.end();
      int32_t longest = -1;
      for (int32_t id = 0; id < tokenizer_->vocab_size(); ++id) {
        bool want = false;
        if (Special(id)) {
          want = whole && (IsStop(id) || (chat && id == ids_.close));
        } else {
          const std::string next = out + std::string(tokenizer_->TokenBytes(id));
          for (const std::string& t : texts)
            want |= t.compare(0, next.size(), next) == 0 && next.size() <= t.size();
        }
        EXPECT_EQ(allowed[id] != 0, want) << "step " << step << " id " << id << " output '" << out
                                          << "' token '" << tokenizer_->TokenBytes(id) << "'";
        if (want && !Special(id) &&
            (longest < 0 ||
             tokenizer_->TokenBytes(id).size() > tokenizer_->TokenBytes(longest).size())) {
          longest = id;
        }
      }
      if (whole) return out;
      if (longest < 0) {
        ADD_FAILURE() << "nothing allowed after '" << out << "'";
        return out;
      }
      c->Accept(longest);
      out += std::string(tokenizer_->TokenBytes(longest));
    }
    ADD_FAILURE() << "the literal never completed: '" << out << "'";
    return out;
  }

  // Expects exactly `ids` to be forced, one by one, accepting each.
  void ExpectForced(AnswerConstraint* c, const std::vector<int32_t>& ids) {
    for (size_t i = 0; i < ids.size(); ++i) {
      std::vector<uint8_t> allowed;
      c->Allowed(&allowed);
      EXPECT_EQ(std::count(allowed.begin(), allowed.end(), 1), 1) << "forced step " << i;
      EXPECT_EQ(allowed[ids[i]], 1) << "forced step " << i << " id " << ids[i];
      c->Accept(ids[i]);
    }
  }

  std::unique_ptr<tok::Tokenizer> tokenizer_;
  StructuralIds ids_;
  std::vector<int32_t> stops_;
  std::unique_ptr<ConstraintVocab> vocab_;
};

TEST_F(ConstrainedTest, PlainTextAllowsExactlyThePrefixesOfTheLiterals) {
  auto c = AnswerConstraint::Create(Enum(R"("hello world","help")"), *vocab_, 0);
  ASSERT_OK(c.status());
  EXPECT_TRUE(c->answering());
  const std::string out = WalkLiteral(&*c, {R"("hello world")", R"("help")"}, false);
  EXPECT_TRUE(out == R"("hello world")" || out == R"("help")") << out;
  // Complete and nothing may follow: only the stop tokens.
  std::vector<uint8_t> allowed;
  c->Allowed(&allowed);
  EXPECT_EQ(std::count(allowed.begin(), allowed.end(), 1), static_cast<long>(stops_.size()));
  c->Accept(stops_[0]);
  EXPECT_TRUE(c->ended());
}

TEST_F(ConstrainedTest, ThinkingIsFreeTextThenTheResponseOpenerIsForced) {
  auto c = AnswerConstraint::Create(Enum(R"("yes")"), *vocab_, kParseInThink);
  ASSERT_OK(c.status());
  EXPECT_FALSE(c->answering());
  std::vector<uint8_t> allowed;
  c->Allowed(&allowed);
  for (int32_t id = 0; id < tokenizer_->vocab_size(); ++id) {
    // Every ordinary token (JSON or not), and of the specials only <|close|>: no stop, no opener.
    EXPECT_EQ(allowed[id] != 0, !Special(id) || id == ids_.close) << id;
  }
  for (int32_t id : Encode("not json {[ at all")) c->Accept(id);
  EXPECT_FALSE(c->answering());
  c->Accept(ids_.close);
  std::vector<int32_t> opener = Encode("think");
  opener.push_back(ids_.sep);
  opener.push_back(ids_.open);
  for (int32_t id : Encode("response")) opener.push_back(id);
  opener.push_back(ids_.sep);
  ExpectForced(&*c, opener);
  EXPECT_TRUE(c->answering());
  EXPECT_EQ(WalkLiteral(&*c, {R"("yes")"}, true), R"("yes")");
}

TEST_F(ConstrainedTest, ChatAnswerEndsWithTheWellFormedCloseOrTheStop) {
  for (bool by_close : {true, false}) {
    auto c = AnswerConstraint::Create(Enum(R"("ok")"), *vocab_, kParseInResponse);
    ASSERT_OK(c.status());
    EXPECT_TRUE(c->answering());
    EXPECT_EQ(WalkLiteral(&*c, {R"("ok")"}, true), R"("ok")");
    if (by_close) {
      c->Accept(ids_.close);
      std::vector<int32_t> tail = Encode("response");
      tail.push_back(ids_.sep);
      tail.push_back(ids_.close);
      for (int32_t id : Encode("message")) tail.push_back(id);
      tail.push_back(ids_.sep);
      tail.push_back(ids_.end_of_msg);
      ExpectForced(&*c, tail);
    } else {
      c->Accept(ids_.end_of_msg);
    }
    EXPECT_TRUE(c->ended());
    // After the end nothing is masked any more.
    std::vector<uint8_t> allowed;
    c->Allowed(&allowed);
    EXPECT_EQ(std::count(allowed.begin(), allowed.end(), 1), tokenizer_->vocab_size());
  }
}

TEST_F(ConstrainedTest, MaskSetsMinusInfinityExactlyWhereDisallowed) {
  auto c = AnswerConstraint::Create(Enum(R"("ab")"), *vocab_, 0);
  ASSERT_OK(c.status());
  std::vector<float> logits(tokenizer_->vocab_size(), 1.5f);
  ASSERT_OK(c->Mask(logits));
  std::vector<uint8_t> allowed;
  c->Allowed(&allowed);
  for (size_t i = 0; i < logits.size(); ++i) {
    if (allowed[i]) {
      EXPECT_EQ(logits[i], 1.5f);
    } else {
      EXPECT_TRUE(std::isinf(logits[i]) && logits[i] < 0);
    }
  }
  std::vector<float> short_row(10, 0.0f);
  EXPECT_THAT(c->Mask(short_row),
              StatusIs(absl::StatusCode::kInternal, HasSubstr("10 logits for a vocabulary of")));
}

TEST_F(ConstrainedTest, BadInputsAreRefusedByName) {
  EXPECT_THAT(AnswerConstraint::Create(Enum(R"("a")"), *vocab_, 7).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("chat parse mode 7")));
  EXPECT_THAT(AnswerConstraint::Create(nullptr, *vocab_, 0).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("response_format")));
  const std::vector<int32_t> bad_stop = {9999};
  EXPECT_THAT(ConstraintVocab::Build(*tokenizer_, tokenizer_->vocab_size(), bad_stop).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("stop token id 9999")));
}

// ---- tool calls: typed arguments -------------------------------------------------------------

class ConstrainedToolTest : public ConstrainedTest {
 protected:
  static std::string Format(const std::string& mode, const std::string& params) {
    return R"({"type":"coli_tool_calls","mode":")" + mode +
           R"(","tools":[{"name":"get_weather","strict":false,"parameters":)" + params + "}]}";
  }
  std::shared_ptr<const ToolCallSpec> Spec(const std::string& params) {
    auto spec = ParseToolCallSpec(Format("named", params));
    EXPECT_OK(spec.status());
    return spec.ok() ? *spec : nullptr;
  }
  // Accepts `ids`, each of which must be allowed; appends them to out_.
  void Take(AnswerConstraint* c, const std::vector<int32_t>& ids) {
    for (int32_t id : ids) {
      std::vector<uint8_t> allowed;
      c->Allowed(&allowed);
      ASSERT_EQ(allowed[id], 1) << "id " << id << " '" << tokenizer_->TokenBytes(id) << "' after "
                                << out_.size() << " tokens";
      c->Accept(id);
      out_.push_back(id);
    }
  }
  void TakeText(AnswerConstraint* c, const std::string& text) { Take(c, Encode(text)); }
  // After an element's header: `<|sep|>VALUE<|close|>argument<|sep|>`.
  void TakeValue(AnswerConstraint* c, const std::string& value) {
    Take(c, {ids_.sep});
    TakeText(c, value);
    Take(c, {ids_.close});
    TakeText(c, "argument");
    Take(c, {ids_.sep});
  }
  // The call's opening, forced: the empty response, `tools`, `call tool="get_weather"
  // index="1"`.
  void TakeCallHeader(AnswerConstraint* c) {
    Take(c, {ids_.close});
    TakeText(c, "response");
    Take(c, {ids_.sep, ids_.open});
    TakeText(c, "tools");
    Take(c, {ids_.sep, ids_.open});
    TakeText(c, "call");
    TakeText(c, " tool");
    TakeText(c, "=\"");
    TakeText(c, "get_weather\"");
    TakeText(c, " index");
    TakeText(c, "=\"");
    TakeText(c, "1");
    TakeText(c, "\"");
    Take(c, {ids_.sep});
  }
  // At an element's start (after <|open|>, `run` taken since): every ordinary token is allowed
  // exactly when run + its bytes is a prefix of one of `headers`; <|sep|> when run is one.
  void ExpectElementHeaders(const AnswerConstraint& c, const std::string& run,
                            const std::vector<std::string>& headers) {
    std::vector<uint8_t> allowed;
    c.Allowed(&allowed);
    for (int32_t id = 0; id < tokenizer_->vocab_size(); ++id) {
      bool want = false;
      if (Special(id)) {
        want = id == ids_.sep && std::find(headers.begin(), headers.end(), run) != headers.end();
      } else {
        const std::string next = run + std::string(tokenizer_->TokenBytes(id));
        for (const std::string& h : headers) want |= std::string_view(h).starts_with(next);
      }
      EXPECT_EQ(allowed[id] != 0, want)
          << "run '" << run << "' token '" << tokenizer_->TokenBytes(id) << "'";
    }
  }
  // The ids allowed now that are special, and the ordinary ones' bytes.
  std::vector<int32_t> AllowedSpecials(const AnswerConstraint& c) {
    std::vector<uint8_t> allowed;
    c.Allowed(&allowed);
    std::vector<int32_t> out;
    for (int32_t id = 0; id < tokenizer_->vocab_size(); ++id) {
      if (allowed[id] != 0 && Special(id)) out.push_back(id);
    }
    return out;
  }
  std::vector<std::string> AllowedTexts(const AnswerConstraint& c) {
    std::vector<uint8_t> allowed;
    c.Allowed(&allowed);
    std::vector<std::string> out;
    for (int32_t id = 0; id < tokenizer_->vocab_size(); ++id) {
      if (allowed[id] != 0 && !Special(id)) out.emplace_back(tokenizer_->TokenBytes(id));
    }
    std::sort(out.begin(), out.end());
    return out;
  }
  // The tool-call events the chat parser reads from out_.
  std::vector<std::string> ParsedCalls() {
    auto parser = OutputParser::Create(*tokenizer_, kParseInResponse);
    EXPECT_OK(parser.status());
    std::vector<std::string> calls;
    if (!parser.ok()) return calls;
    for (int32_t id : out_) {
      for (const ChatEvent& e : parser->Feed(id)) {
        if (e.channel == ChatChannel::kToolCall) calls.push_back(e.text);
      }
    }
    for (const ChatEvent& e : parser->Finish()) {
      if (e.channel == ChatChannel::kToolCall) calls.push_back(e.text);
    }
    return calls;
  }

  std::vector<int32_t> out_;
};

constexpr char kWeatherParams[] = R"({"type":"object","properties":{
  "city":{"type":"string","maxLength":10},"unit":{"enum":["c","f"]},"n":{"type":"integer"},
  "tags":{"type":"array","items":{"type":"string"},"maxItems":2}},
  "required":["city","unit"],"additionalProperties":false})";

TEST_F(ConstrainedToolTest, ThePlainObjectSchemaSplitsIntoTypedKeys) {
  auto spec = Spec(kWeatherParams);
  ASSERT_NE(spec, nullptr);
  ASSERT_EQ(spec->typed.size(), 1u);
  const TypedArguments* typed = spec->typed[0].get();
  ASSERT_NE(typed, nullptr);
  EXPECT_FALSE(typed->additional);
  std::map<std::string, std::pair<bool, uint8_t>> keys;
  for (const TypedArguments::Key& k : typed->keys) keys[k.name] = {k.required, k.types};
  using P = std::pair<bool, uint8_t>;
  EXPECT_EQ(keys["city"], P(true, 1u << kArgString));
  EXPECT_EQ(keys["unit"], P(true, 1u << kArgString));
  EXPECT_EQ(keys["n"], P(false, 1u << kArgNumber));
  EXPECT_EQ(keys["tags"], P(false, 1u << kArgArray));
  EXPECT_EQ(keys.size(), 4u);
  // A nullable key takes both types; other keys as additionalProperties says (absent with
  // declared properties: none, as common/grammar closes such an object).
  auto nullable =
      Spec(R"({"properties":{"a":{"type":["string","null"]}},"additionalProperties":true})");
  ASSERT_NE(nullable, nullptr);
  ASSERT_NE(nullable->typed[0], nullptr);
  ASSERT_EQ(nullable->typed[0]->keys.size(), 1u);
  EXPECT_EQ(nullable->typed[0]->keys[0].types, (1u << kArgString) | (1u << kArgNull));
  EXPECT_TRUE(nullable->typed[0]->additional);
  EXPECT_EQ(nullable->typed[0]->additional_types, (1u << kNumXtmlArgTypes) - 1);
  // `{}` declares a tool without parameters: any object, typed with any keys.
  auto empty = Spec("{}");
  ASSERT_NE(empty, nullptr);
  ASSERT_NE(empty->typed[0], nullptr);
  EXPECT_TRUE(empty->typed[0]->additional);
  // Arguments are an object: a schema that allows none is refused by name (named / required).
  EXPECT_THAT(ParseToolCallSpec(Format("named", R"({"type":"string"})")).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("allows no JSON object")));
  auto closed = Spec(R"({"properties":{"a":{"type":"string"}}})");
  ASSERT_NE(closed, nullptr);
  ASSERT_NE(closed->typed[0], nullptr);
  EXPECT_FALSE(closed->typed[0]->additional);
  // A root `$ref` splits too: the split is of the compiled schema.
  auto ref = Spec(R"({"$ref":"#/$defs/args","$defs":{"args":{"type":"object",
                      "properties":{"a":{"type":"integer"}},"required":["a"]}}})");
  ASSERT_NE(ref, nullptr);
  ASSERT_NE(ref->typed[0], nullptr);
  ASSERT_EQ(ref->typed[0]->keys.size(), 1u);
  EXPECT_EQ(ref->typed[0]->keys[0].types, 1u << kArgNumber);
  // What does not split per key keeps only the json block.
  for (const char* params :
       {R"({"anyOf":[{"type":"object","properties":{"a":{"type":"string"}}},
                    {"type":"object","properties":{"b":{"type":"string"}}}]})",
        R"({"type":["object","null"],"properties":{"a":{"type":"string"}}})"}) {
    auto s = Spec(params);
    ASSERT_NE(s, nullptr) << params;
    EXPECT_EQ(s->typed[0], nullptr) << params;
  }
}

TEST_F(ConstrainedToolTest, TypedArgumentsFollowTheSchemaAndParseBackToValidArguments) {
  auto c = AnswerConstraint::CreateToolCalls(Spec(kWeatherParams), *vocab_, kParseInResponse);
  ASSERT_OK(c.status());
  ASSERT_NO_FATAL_FAILURE(TakeCallHeader(&*c));
  // Required keys are missing: only an element may come.
  EXPECT_EQ(AllowedSpecials(*c), std::vector<int32_t>{ids_.open});
  EXPECT_TRUE(AllowedTexts(*c).empty());
  Take(&*c, {ids_.open});
  const std::vector<std::string> all = {
      "json type=\"object\"", "argument key=\"city\" type=\"string\"",
      "argument key=\"unit\" type=\"string\"", "argument key=\"n\" type=\"number\"",
      "argument key=\"tags\" type=\"array\""};
  ExpectElementHeaders(*c, "", all);
  // Byte by byte (one token per character here, whatever the tokenizer would merge).
  std::string run;
  for (char ch : std::string("argument key=\"ci")) {
    ASSERT_NO_FATAL_FAILURE(TakeText(&*c, std::string(1, ch)));
    run.push_back(ch);
  }
  ExpectElementHeaders(*c, run, all);
  TakeText(&*c, "ty\" type=\"string\"");
  Take(&*c, {ids_.sep});
  // A raw string value: a quote is content (escaped for the schema), <|close|> ends it.
  TakeText(&*c, "Pa\"ris");
  EXPECT_EQ(AllowedSpecials(*c), std::vector<int32_t>{ids_.close});
  Take(&*c, {ids_.close});
  TakeText(&*c, "argument");
  Take(&*c, {ids_.sep});
  EXPECT_EQ(AllowedSpecials(*c), std::vector<int32_t>{ids_.open});  // `unit` is required
  Take(&*c, {ids_.open});
  // No json block after an argument, and `city` is written.
  ExpectElementHeaders(
      *c, "",
      {"argument key=\"unit\" type=\"string\"", "argument key=\"n\" type=\"number\"",
       "argument key=\"tags\" type=\"array\""});
  TakeText(&*c, "argument key=\"unit\" type=\"string\"");
  Take(&*c, {ids_.sep});
  // The enum's raw values: `c` or `f`, nothing empty.
  EXPECT_EQ(AllowedTexts(*c), (std::vector<std::string>{"c", "f"}));
  EXPECT_TRUE(AllowedSpecials(*c).empty());
  TakeText(&*c, "c");
  EXPECT_EQ(AllowedSpecials(*c), std::vector<int32_t>{ids_.close});
  EXPECT_TRUE(AllowedTexts(*c).empty());
  Take(&*c, {ids_.close});
  TakeText(&*c, "argument");
  Take(&*c, {ids_.sep});
  // Every required key is in: another element or the end of the call.
  EXPECT_EQ(AllowedSpecials(*c), (std::vector<int32_t>{ids_.open, ids_.close}));
  Take(&*c, {ids_.open});
  TakeText(&*c, "argument key=\"n\" type=\"number\"");
  Take(&*c, {ids_.sep});
  // A number: JSON of that type only (no quote, no letter), an integer (no '.').
  for (const std::string& t : AllowedTexts(*c)) {
    EXPECT_TRUE(t[0] == '-' || (t[0] >= '0' && t[0] <= '9')) << t;
  }
  TakeText(&*c, "42");
  const std::vector<std::string> after_digits = AllowedTexts(*c);
  EXPECT_EQ(std::count(after_digits.begin(), after_digits.end(), "."), 0);
  Take(&*c, {ids_.close});
  TakeText(&*c, "argument");
  Take(&*c, {ids_.sep, ids_.close});
  TakeText(&*c, "call");
  Take(&*c, {ids_.sep, ids_.close});  // named: the end of the message is forced
  TakeText(&*c, "tools");
  Take(&*c, {ids_.sep, ids_.close});
  TakeText(&*c, "message");
  Take(&*c, {ids_.sep, ids_.end_of_msg});
  EXPECT_TRUE(c->ended());
  EXPECT_EQ(c->calls(), 1);
  const std::vector<std::string> calls = ParsedCalls();
  ASSERT_EQ(calls.size(), 1u);
  const nlohmann::json call = nlohmann::json::parse(calls[0]);
  EXPECT_EQ(call["name"], "get_weather");
  EXPECT_EQ(call["arguments"], nlohmann::json::parse(R"({"city":"Pa\"ris","unit":"c","n":42})"));
}

TEST_F(ConstrainedToolTest, AnAdditionalKeyIsWrittenOnceWithAnyTypeItsSchemaAllows) {
  auto c = AnswerConstraint::CreateToolCalls(
      Spec(R"({"properties":{"a":{"type":"string"}},"additionalProperties":{"type":"boolean"}})"),
      *vocab_, kParseInResponse);
  ASSERT_OK(c.status());
  ASSERT_NO_FATAL_FAILURE(TakeCallHeader(&*c));
  // Nothing is required: an empty call may close at once.
  EXPECT_EQ(AllowedSpecials(*c), (std::vector<int32_t>{ids_.open, ids_.close}));
  Take(&*c, {ids_.open});
  TakeText(&*c, "argument key=\"bb");
  {
    // The reference: the key grows by printable ASCII but `&` (up to 64 bytes), or ends and
    // takes the additional schema's one type.
    std::vector<uint8_t> allowed;
    c->Allowed(&allowed);
    for (int32_t id = 0; id < tokenizer_->vocab_size(); ++id) {
      if (Special(id)) continue;
      const std::string rest = "bb" + std::string(tokenizer_->TokenBytes(id));
      const size_t quote = rest.find('"');
      bool want = true;
      for (size_t i = 0; i < std::min(quote, rest.size()); ++i) {
        const unsigned char b = static_cast<unsigned char>(rest[i]);
        want &= b >= 0x20 && b < 0x7f && b != '&';
      }
      if (quote == std::string::npos) {
        want &= rest.size() <= 64;
      } else {
        want &= std::string_view("\" type=\"boolean\"").starts_with(rest.substr(quote));
      }
      EXPECT_EQ(allowed[id] != 0, want) << "token '" << tokenizer_->TokenBytes(id) << "'";
    }
  }
  TakeText(&*c, "\" type=\"boolean\"");
  Take(&*c, {ids_.sep});
  for (const std::string& t : AllowedTexts(*c)) EXPECT_TRUE(t[0] == 't' || t[0] == 'f') << t;
  TakeText(&*c, "true");
  Take(&*c, {ids_.close});
  TakeText(&*c, "argument");
  Take(&*c, {ids_.sep, ids_.open});
  TakeText(&*c, "argument key=\"b");
  // `bb` is written: `b` may still grow into another key, but not close as `bb`.
  TakeText(&*c, "b");
  std::vector<uint8_t> allowed;
  c->Allowed(&allowed);
  for (int32_t id = 0; id < tokenizer_->vocab_size(); ++id) {
    if (!Special(id) && tokenizer_->TokenBytes(id).starts_with("\"")) {
      EXPECT_EQ(allowed[id], 0) << tokenizer_->TokenBytes(id);
    }
  }
  TakeText(&*c, "c\" type=\"boolean\"");
  TakeValue(&*c, "false");
  Take(&*c, {ids_.close});
  TakeText(&*c, "call");
  Take(&*c, {ids_.sep});
  const std::vector<std::string> calls = ParsedCalls();
  ASSERT_EQ(calls.size(), 1u);
  EXPECT_EQ(nlohmann::json::parse(calls[0])["arguments"],
            nlohmann::json::parse(R"({"bb":true,"bbc":false})"));
}

// An enum member holding characters JSON escapes (a quote, a newline, a tab, a control byte)
// is reachable as a raw string argument: the raw bytes reach the grammar escaped as the
// member's dumped text escapes them.
TEST_F(ConstrainedToolTest, RawStringsReachEnumMembersThatHoldEscapedCharacters) {
  for (const std::string& raw :
       {std::string("a\nb"), std::string("q\"\\"), std::string("t\t\x01")}) {
    SCOPED_TRACE(nlohmann::json(raw).dump());
    const nlohmann::json params = {
        {"type", "object"},
        {"properties", {{"s", {{"enum", {"a\nb", "q\"\\", std::string("t\t\x01")}}}}}},
        {"required", {"s"}}};
    auto c = AnswerConstraint::CreateToolCalls(Spec(params.dump()), *vocab_, kParseInResponse);
    ASSERT_OK(c.status());
    out_.clear();
    ASSERT_NO_FATAL_FAILURE(TakeCallHeader(&*c));
    Take(&*c, {ids_.open});
    TakeText(&*c, "argument key=\"s\" type=\"string\"");
    Take(&*c, {ids_.sep});
    for (char ch : raw) ASSERT_NO_FATAL_FAILURE(TakeText(&*c, std::string(1, ch)));
    EXPECT_EQ(AllowedSpecials(*c), std::vector<int32_t>{ids_.close});
    Take(&*c, {ids_.close});
    TakeText(&*c, "argument");
    Take(&*c, {ids_.sep, ids_.close});
    TakeText(&*c, "call");
    Take(&*c, {ids_.sep});
    const std::vector<std::string> calls = ParsedCalls();
    ASSERT_EQ(calls.size(), 1u);
    EXPECT_EQ(nlohmann::json::parse(calls[0])["arguments"]["s"], raw);
  }
}

// A key's value is constrained as that key's node in the WHOLE schema: a `$ref` to the root
// ("#", a recursive filter) means the parameters, not the property (compiling the property on its
// own read "#" as itself: `[[]]` passed and `[{"op":"x"}]` was refused).
TEST_F(ConstrainedToolTest, ARootReferenceInsideAKeyMeansTheWholeParameters) {
  const std::string params = R"({"type":"object","properties":{"op":{"type":"string"},
      "and":{"type":"array","items":{"$ref":"#"}}},"required":["op"],
      "additionalProperties":false})";
  auto walk = [&](const std::string& value, bool whole_ok) {
    SCOPED_TRACE(value);
    auto c = AnswerConstraint::CreateToolCalls(Spec(params), *vocab_, kParseInResponse);
    ASSERT_OK(c.status());
    out_.clear();
    ASSERT_NO_FATAL_FAILURE(TakeCallHeader(&*c));
    Take(&*c, {ids_.open});
    TakeText(&*c, "argument key=\"and\" type=\"array\"");
    Take(&*c, {ids_.sep});
    // Byte by byte: the walk stops at the first byte the constraint refuses.
    size_t taken = 0;
    for (char ch : value) {
      std::vector<uint8_t> allowed;
      c->Allowed(&allowed);
      const std::vector<int32_t> ids = Encode(std::string(1, ch));
      if (ids.size() != 1 || allowed[ids[0]] == 0) break;
      c->Accept(ids[0]);
      ++taken;
    }
    std::vector<uint8_t> allowed;
    c->Allowed(&allowed);
    EXPECT_EQ(taken == value.size() && allowed[ids_.close] != 0, whole_ok);
  };
  walk(R"([{"op":"x"}])", true);
  // (Nested objects keep the declared order, key-sorted as the model saw the tool declared.)
  walk(R"([{"and":[{"op":"y"}],"op":"x"}])", true);
  walk("[[]]", false);
  walk("[{}]", false);  // `op` is required in the nested filter too
}

// A key already written never dead-ends the walk, however long: a 64-byte additional key
// written once cannot be spelled again (its last byte is refused), yet something is always
// allowed; declared keys whose escaped text equals another's name stay reachable.
TEST_F(ConstrainedToolTest, RepeatedLongKeysAndEscapedNamesNeverDeadEnd) {
  {
    auto c = AnswerConstraint::CreateToolCalls(
        Spec(R"({"type":"object","properties":{},"additionalProperties":{"type":"boolean"}})"),
        *vocab_, kParseInResponse);
    ASSERT_OK(c.status());
    out_.clear();
    ASSERT_NO_FATAL_FAILURE(TakeCallHeader(&*c));
    const std::string key(64, 'a');
    Take(&*c, {ids_.open});
    TakeText(&*c, "argument key=\"");
    for (char ch : key) ASSERT_NO_FATAL_FAILURE(TakeText(&*c, std::string(1, ch)));
    TakeText(&*c, "\" type=\"boolean\"");
    TakeValue(&*c, "true");
    Take(&*c, {ids_.open});
    TakeText(&*c, "argument key=\"");
    for (size_t i = 0; i + 1 < key.size(); ++i) ASSERT_NO_FATAL_FAILURE(TakeText(&*c, "a"));
    std::vector<uint8_t> allowed;
    c->Allowed(&allowed);
    const std::vector<int32_t> a = Encode("a");
    ASSERT_EQ(a.size(), 1u);
    EXPECT_EQ(allowed[a[0]], 0) << "the 64th `a` would spell the written key again";
    EXPECT_FALSE(AllowedTexts(*c).empty());
    TakeText(&*c, "b\" type=\"boolean\"");  // another 64-byte key
    Take(&*c, {ids_.sep});
    TakeText(&*c, "false");
    Take(&*c, {ids_.close});
  }
  {
    // "a&amp;b" is written `a&amp;amp;b`; "a&b" is written `a&amp;b` — the first one's name.
    auto c = AnswerConstraint::CreateToolCalls(
        Spec(R"({"type":"object","properties":{"a&amp;b":{"type":"string"},
                 "a&b":{"type":"string"}},"required":["a&amp;b","a&b"],
                 "additionalProperties":false})"),
        *vocab_, kParseInResponse);
    ASSERT_OK(c.status());
    out_.clear();
    ASSERT_NO_FATAL_FAILURE(TakeCallHeader(&*c));
    for (const char* attr : {"a&amp;b", "a&amp;amp;b"}) {
      Take(&*c, {ids_.open});
      TakeText(&*c, std::string("argument key=\"") + attr + "\" type=\"string\"");
      TakeValue(&*c, "v");
    }
    Take(&*c, {ids_.close});
    TakeText(&*c, "call");
    Take(&*c, {ids_.sep});
    const std::vector<std::string> calls = ParsedCalls();
    ASSERT_EQ(calls.size(), 1u);
    EXPECT_EQ(nlohmann::json::parse(calls[0])["arguments"],
              nlohmann::json::parse(R"({"a&b":"v","a&amp;b":"v"})"));
  }
}

TEST_F(ConstrainedToolTest, ASchemaThatDoesNotSplitKeepsTheJsonBlock) {
  auto c = AnswerConstraint::CreateToolCalls(
      Spec(R"({"anyOf":[{"type":"object","properties":{"a":{"type":"string"}}},
                        {"type":"object","properties":{"b":{"type":"string"}}}]})"),
      *vocab_, kParseInResponse);
  ASSERT_OK(c.status());
  ASSERT_NO_FATAL_FAILURE(TakeCallHeader(&*c));
  EXPECT_EQ(AllowedSpecials(*c), std::vector<int32_t>{ids_.open});  // no empty call
  Take(&*c, {ids_.open});
  ExpectElementHeaders(*c, "", {"json type=\"object\""});
  TakeText(&*c, "json type=\"object\"");
  Take(&*c, {ids_.sep});
  TakeText(&*c, R"({"a":"x"})");
  Take(&*c, {ids_.close});
  TakeText(&*c, "json");
  Take(&*c, {ids_.sep, ids_.close});
  TakeText(&*c, "call");
  Take(&*c, {ids_.sep});
  const std::vector<std::string> calls = ParsedCalls();
  ASSERT_EQ(calls.size(), 1u);
  EXPECT_EQ(nlohmann::json::parse(calls[0])["arguments"], nlohmann::json::parse(R"({"a":"x"})"));
}

// An independent check of a value against the JSON-schema subset the walks below use (type,
// enum, maxLength, properties, required, additionalProperties, items, maxItems); "" when valid.
std::string SchemaErrors(const nlohmann::json& schema, const nlohmann::json& v,
                         const std::string& path) {
  if (schema.contains("enum")) {
    bool found = false;
    for (const nlohmann::json& e : schema["enum"]) found |= e == v;
    if (!found) return path + ": not in enum: " + v.dump();
  }
  if (schema.contains("type")) {
    const nlohmann::json types =
        schema["type"].is_array() ? schema["type"] : nlohmann::json::array({schema["type"]});
    bool ok = false;
    for (const nlohmann::json& t : types) {
      ok |= (t == "string" && v.is_string()) || (t == "number" && v.is_number()) ||
            // JSON Schema's integer is any number with no fraction (a 20-digit one parses as
            // a double).
            (t == "integer" && v.is_number() && v.get<double>() == std::floor(v.get<double>())) ||
            (t == "boolean" && v.is_boolean()) || (t == "null" && v.is_null()) ||
            (t == "object" && v.is_object()) || (t == "array" && v.is_array());
    }
    if (!ok) return path + ": wrong type: " + v.dump();
  }
  if (v.is_string() && schema.contains("maxLength")) {
    size_t chars = 0;
    for (unsigned char c : v.get<std::string>()) chars += (c & 0xC0) != 0x80 ? 1 : 0;
    if (chars > schema["maxLength"].get<size_t>()) return path + ": too long: " + v.dump();
  }
  if (v.is_array()) {
    if (schema.contains("maxItems") && v.size() > schema["maxItems"].get<size_t>()) {
      return path + ": too many items";
    }
    if (schema.contains("items")) {
      for (size_t i = 0; i < v.size(); ++i) {
        const std::string e =
            SchemaErrors(schema["items"], v[i], path + "[" + std::to_string(i) + "]");
        if (!e.empty()) return e;
      }
    }
  }
  if (v.is_object()) {
    const nlohmann::json props = schema.value("properties", nlohmann::json::object());
    for (const nlohmann::json& r : schema.value("required", nlohmann::json::array())) {
      if (!v.contains(r.get<std::string>())) return path + ": missing " + r.dump();
    }
    for (auto it = v.begin(); it != v.end(); ++it) {
      if (props.contains(it.key())) {
        const std::string e = SchemaErrors(props[it.key()], it.value(), path + "." + it.key());
        if (!e.empty()) return e;
      } else if (schema.value("additionalProperties", nlohmann::json(true)) == false) {
        return path + ": unexpected key " + it.key();
      }
    }
  }
  return "";
}

// Random walks through the allowed sets (a special token, when one is allowed, taken with
// probability 0.3, so calls end): every walk that ends gives calls the parser reads whose
// arguments the independent check above accepts — whichever form (typed or json) the walk took.
TEST_F(ConstrainedToolTest, RandomWalksEndInValidCallsInEitherForm) {
  const std::vector<std::string> schemas = {
      kWeatherParams,
      R"({"type":"object","properties":{"n":{"enum":[1,2,3]},"ok":{"type":"boolean"}},
          "required":["n","ok"],"additionalProperties":false})",
      R"({"type":"object","properties":{
          "loc":{"type":"object","properties":{"lat":{"type":"integer"},"lon":{"type":"number"}},
                 "required":["lat","lon"],"additionalProperties":false},
          "tags":{"type":"array","items":{"enum":["a","b"]},"maxItems":3},
          "note":{"type":["string","null"],"maxLength":5}},
          "required":["loc"],"additionalProperties":false})",
      // (No required key here: a walk spelling random additional keys would rarely spell it.)
      R"({"type":"object","properties":{"q":{"type":"string","maxLength":4}},
          "additionalProperties":true})"};
  int typed_calls = 0, json_calls = 0;
  for (const std::string& params : schemas) {
    const nlohmann::json schema = nlohmann::json::parse(params);
    int ended = 0;
    for (uint32_t seed = 0; seed < 40; ++seed) {
      SCOPED_TRACE(::testing::Message() << params << " seed " << seed);
      std::mt19937 rng(seed);
      auto c = AnswerConstraint::CreateToolCalls(Spec(params), *vocab_, kParseInResponse);
      ASSERT_OK(c.status());
      out_.clear();
      for (int step = 0; step < 600 && !c->ended(); ++step) {
        std::vector<uint8_t> allowed;
        c->Allowed(&allowed);
        std::vector<int32_t> specials, ordinary;
        for (int32_t id = 0; id < tokenizer_->vocab_size(); ++id) {
          if (allowed[id] != 0) (Special(id) ? specials : ordinary).push_back(id);
        }
        ASSERT_FALSE(specials.empty() && ordinary.empty()) << "nothing allowed";
        const bool special =
            ordinary.empty() ||
            (!specials.empty() && std::uniform_real_distribution<double>(0, 1)(rng) < 0.3);
        const std::vector<int32_t>& pool = special ? specials : ordinary;
        const int32_t id = pool[std::uniform_int_distribution<size_t>(0, pool.size() - 1)(rng)];
        c->Accept(id);
        out_.push_back(id);
      }
      if (!c->ended()) continue;  // a long string: the walk ran out of steps
      ++ended;
      ASSERT_EQ(out_.back(), ids_.end_of_msg);
      const std::vector<std::string> calls = ParsedCalls();
      ASSERT_EQ(calls.size(), 1u);
      const nlohmann::json call = nlohmann::json::parse(calls[0]);
      ASSERT_TRUE(call["arguments"].is_object()) << calls[0];
      EXPECT_EQ(SchemaErrors(schema, call["arguments"], "arguments"), "") << calls[0];
      std::string text;
      for (int32_t id : out_) text += tokenizer_->TokenBytes(id);
      (text.find("argument key=") != std::string::npos ? typed_calls : json_calls) += 1;
    }
    // Unbounded values (an additional key's) end less often; enough walks must end to mean
    // something.
    EXPECT_GE(ended, 8) << params;
  }
  // Both forms were walked.
  EXPECT_GE(typed_calls, 20);
  EXPECT_GE(json_calls, 5);
}

}  // namespace
}  // namespace coli::k3
