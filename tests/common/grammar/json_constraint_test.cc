// common/grammar: the matcher on hand-written cases (accept / reject / end),
// the schema compiler's refusals, and TokenFilter against trying every token.
#include "common/grammar/json_constraint.h"

#include <random>
#include <set>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "common/status/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/common/grammar/grammar_test_util.h"

namespace coli::grammar {
namespace {

using ::coli::testing::StatusIs;
using ::testing::HasSubstr;

using test_util::Complete;
using test_util::Schema;

TEST(JsonMatcher, ObjectPropertiesInOrderRequiredAndOptional) {
  auto c = Schema(R"({"type":"object","properties":{"a":{"type":"integer"},
      "b":{"type":"string"},"c":{"type":"boolean"}},"required":["a","c"],
      "additionalProperties":false})");
  EXPECT_TRUE(Complete(c, R"({"a":1,"b":"x","c":true})"));
  EXPECT_TRUE(Complete(c, R"({"a":1,"c":false})"));
  EXPECT_TRUE(Complete(c, "{\"a\": -12, \"c\": true}"));
  EXPECT_TRUE(Complete(c, "{\n  \"a\": 0,\n  \"c\": true\n}"));
  EXPECT_FALSE(Complete(c, R"({"a":1})"));                 // c missing
  EXPECT_FALSE(Complete(c, R"({"c":true,"a":1})"));        // order
  EXPECT_FALSE(Complete(c, R"({"a":1,"a":2,"c":true})"));  // a key twice
  EXPECT_FALSE(Complete(c, R"({"a":1,"b":"x","b":"y","c":true})"));
  EXPECT_FALSE(Complete(c, R"({"a":1,"c":true,"b":"x"})"));  // b after c: out of order
  EXPECT_FALSE(Complete(c, R"({"ab":1,"c":true})"));         // a prefix of no key
  EXPECT_FALSE(Complete(c, R"({"a":1,"c":true,"d":1})"));
  EXPECT_FALSE(Complete(c, R"({"a":01,"c":true})"));  // leading zero
  EXPECT_FALSE(Complete(c, R"({"a":1.5,"c":true})"));
}

TEST(JsonMatcher, AcceptIsAllOrNothing) {
  auto c = Schema(R"({"type":"array","items":{"type":"integer"}})");
  JsonMatcher m(c);
  EXPECT_TRUE(m.Accept("[1,"));
  EXPECT_EQ(m.consumed(), 3);
  EXPECT_FALSE(m.Accept("2,x"));
  EXPECT_EQ(m.consumed(), 3);
  EXPECT_TRUE(m.Accept("2]"));
  EXPECT_TRUE(m.CanEnd());
  EXPECT_TRUE(m.MustEnd());
}

TEST(JsonMatcher, NumbersEndOnlyWhenComplete) {
  auto c = Schema(R"({"type":"number"})");
  JsonMatcher m(c);
  EXPECT_TRUE(m.Accept("-"));
  EXPECT_FALSE(m.CanEnd());
  EXPECT_TRUE(m.Accept("0"));
  EXPECT_TRUE(m.CanEnd());
  EXPECT_FALSE(m.MustEnd());  // ".5" or "e1" may follow
  EXPECT_FALSE(m.Accept("0"));
  EXPECT_TRUE(m.Accept(".5e+3"));
  EXPECT_TRUE(m.CanEnd());
  EXPECT_FALSE(Complete(c, "1."));
  EXPECT_FALSE(Complete(c, "1e"));
  EXPECT_FALSE(Complete(c, "+1"));
  EXPECT_FALSE(Complete(c, " 1"));
}

TEST(JsonMatcher, StringsEscapesUtf8AndLength) {
  auto c = Schema(R"({"type":"string","minLength":2,"maxLength":3})");
  EXPECT_TRUE(Complete(c, "\"ab\""));
  EXPECT_FALSE(Complete(c, "\"a\""));
  EXPECT_FALSE(Complete(c, "\"abcd\""));
  EXPECT_TRUE(Complete(c, "\"\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80\""));  // 3 characters, 9 bytes
  EXPECT_TRUE(Complete(c, R"("\ud83d\ude00\n")"));  // a surrogate pair is one character
  EXPECT_FALSE(Complete(c, R"("\ud83dx")"));        // lone high surrogate
  EXPECT_FALSE(Complete(c, R"("\ude00a")"));        // lone low surrogate
  EXPECT_FALSE(Complete(c, R"("\ud83d\u0041")"));   // high surrogate, then no low one
  EXPECT_FALSE(Complete(c, R"("\ud83d\ud83d")"));   // two high surrogates
  EXPECT_TRUE(Complete(c, R"("\uD83D\uDE00x")"));   // upper-case hex (2 characters)
  EXPECT_TRUE(Complete(c, R"("\u00e9\u20AC")"));    // two characters
  EXPECT_FALSE(Complete(c, "\"a\tb\""));            // raw control character
  EXPECT_FALSE(Complete(c, "\"\xc0\xafx\""));       // overlong
  EXPECT_FALSE(Complete(c, "\"\xed\xa0\x80x\""));   // UTF-8 surrogate
  EXPECT_FALSE(Complete(c, R"("\x41")"));
}

TEST(JsonMatcher, EnumAnyOfRefRecursion) {
  auto c = Schema(R"({"$defs":{"node":{"type":"object","properties":{
      "v":{"enum":["x",1,null]},"kids":{"type":"array","items":{"$ref":"#/$defs/node"}}},
      "required":["v"]}},"anyOf":[{"$ref":"#/$defs/node"},{"type":"null"}]})");
  EXPECT_TRUE(Complete(c, "null"));
  EXPECT_TRUE(Complete(c, R"({"v":"x","kids":[{"v":1},{"v":null,"kids":[]}]})"));
  EXPECT_FALSE(Complete(c, R"({"v":"y"})"));
  EXPECT_FALSE(Complete(c, R"({"v":12})"));
  EXPECT_FALSE(Complete(c, R"({"kids":[]})"));
}

TEST(JsonMatcher, EnumMembersSharingPrefixes) {
  auto c = Schema(R"({"enum":[12,1,1.5,-1,10,"1","ab","a",[1,2],{"b":1,"a":[]},true,null]})");
  for (const char* member : {"12", "1", "1.5", "-1", "10", R"("1")", R"("ab")", R"("a")", "[1,2]",
                             R"({"b":1,"a":[]})", "true", "null"}) {
    EXPECT_TRUE(Complete(c, member)) << member;
  }
  for (const char* other : {"13", "1.", "15", "-", "100", R"("abc")", R"("b")", "[1]", "[1,2,3]",
                            R"({"a":[],"b":1})", "false", "2"}) {
    EXPECT_FALSE(Complete(c, other)) << other;
  }
  JsonMatcher m(c);
  ASSERT_TRUE(m.Accept("1"));
  EXPECT_TRUE(m.CanEnd());
  EXPECT_FALSE(m.MustEnd());  // "12", "1.5" and "10" go on
  ASSERT_TRUE(m.Accept("0"));
  EXPECT_TRUE(m.MustEnd());
  // Inside an array the container takes the byte after a complete number member.
  auto arr = Schema(R"({"type":"array","items":{"enum":[1,12]}})");
  EXPECT_TRUE(Complete(arr, "[1,12,1]"));
  EXPECT_FALSE(Complete(arr, "[1,123]"));
}

TEST(JsonMatcher, LargeEnumIsOneThread) {
  std::string schema = R"({"enum":[)";
  for (int i = 0; i < 5000; ++i) schema += (i ? ",\"v" : "\"v") + std::to_string(i) + "\"";
  schema += "]}";
  auto c = Schema(schema);
  EXPECT_TRUE(Complete(c, R"("v4999")"));
  EXPECT_TRUE(Complete(c, R"("v0")"));
  EXPECT_FALSE(Complete(c, R"("v5000")"));
  EXPECT_FALSE(Complete(c, R"("v01")"));
}

// Two overlapping alternatives per level would double the live threads at every '['; the cap
// keeps the state small and the document still completes.
TEST(JsonMatcher, NestedOverlappingAnyOfStaysBounded) {
  auto c = Schema(R"({"$defs":{"x":{"anyOf":[{"type":"array","items":{"$ref":"#/$defs/x"}},
      {"type":"array","items":{"$ref":"#/$defs/x"},"maxItems":9},{"type":"null"}]}},
      "$ref":"#/$defs/x"})");
  const std::string doc = std::string(24, '[') + "null" + std::string(24, ']');
  JsonMatcher m(c);
  ASSERT_TRUE(m.Accept(doc.substr(0, 24)));
  ASSERT_TRUE(m.Accept(doc.substr(24)));
  EXPECT_TRUE(m.MustEnd());
  EXPECT_FALSE(Complete(c, std::string(24, '[') + "null" + std::string(23, ']')));
}

TEST(JsonConstraint, ResponseFormats) {
  auto text = JsonConstraint::FromResponseFormat(R"({"type":"text"})");
  ASSERT_TRUE(text.ok());
  EXPECT_EQ(*text, nullptr);
  auto obj = JsonConstraint::FromResponseFormat(R"({"type":"json_object"})");
  ASSERT_TRUE(obj.ok());
  EXPECT_TRUE(Complete(*obj, R"({"a":[1,{"b":null}],"c":"d"})"));
  EXPECT_FALSE(Complete(*obj, "[1]"));
  auto js = JsonConstraint::FromResponseFormat(
      R"({"type":"json_schema","json_schema":{"name":"x","strict":true,
          "schema":{"type":"object","properties":{"a":{"type":"integer","not":{"const":3}}}}}})");
  EXPECT_THAT(js.status(), StatusIs(absl::StatusCode::kInvalidArgument,
                                    HasSubstr("response_format.json_schema.schema.properties.a."
                                              "not: not supported")));
  EXPECT_THAT(JsonConstraint::FromResponseFormat(R"({"type":"yaml"})").status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("response_format.type")));
  EXPECT_THAT(JsonConstraint::FromResponseFormat("{").status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("response_format")));
}

// Every unsupported keyword is refused, naming its path.
TEST(JsonConstraint, RefusesUnsupportedKeywordsNamingThePath) {
  const std::pair<const char*, const char*> cases[] = {
      {R"({"properties":{"n":{"type":"number","multipleOf":-0.5}}})",
       "schema.properties.n.multipleOf: expected a number greater than 0"},
      {R"({"type":"integer","multipleOf":1234567})",
       "schema.multipleOf: the integer needs more than 4096 DFA states (not supported)"},
      {R"({"type":"array","uniqueItems":true})", "schema.uniqueItems: not supported"},
      {R"({"not":{}})", "schema.not: not supported"},
      {R"({"if":{},"then":{}})", "schema.if: not supported"},
      {R"({"type":"object","patternProperties":{}})", "schema.patternProperties: not supported"},
      {R"({"allOf":[{},{}]})", "schema.allOf: only allOf with a single member"},
      {R"({"$ref":"#/$defs/missing"})", "schema.$ref: '#/$defs/missing' not found"},
      {R"({"$ref":"http://x/y"})", "schema.$ref: 'http://x/y': only local"},
      {R"({"$defs":{"a":{"$ref":"#/$defs/a"}},"$ref":"#/$defs/a"})", "reference cycle"},
      {R"({"type":"object","properties":{"a":{}},"required":["b"]})",
       "schema.required[0]: 'b' is not in properties"},
      {R"({"type":"string","minLength":3,"maxLength":2})", "schema.minLength: greater than"},
      {R"({"type":"strin"})", "schema.type: unknown type \"strin\""},
      {R"({"anyOf":[{"type":"string"}],"type":"string"})", "schema.type: not supported beside"},
      {R"({"type":"array","items":[{}]})", "schema.items: an array of schemas"},
      {R"({"enum":[1,2],"type":"string"})", "schema.enum: no member has the schema's type"},
      {R"(false)", "schema: the schema false"},
      // OpenAPI's nullable is no JSON Schema keyword (validators ignore it):
      // say type [..,"null"].
      {R"({"type":"string","nullable":true})", "schema.nullable: not supported"},
  };
  for (const auto& [schema, message] : cases) {
    EXPECT_THAT(JsonConstraint::FromSchema(schema).status(),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(message)))
        << schema;
  }
}

TEST(JsonConstraint, ResponseFormatErrorsNameTheField) {
  const std::pair<const char*, const char*> cases[] = {
      {R"([])", "response_format: expected an object"},
      {R"({"json_schema":{}})", "response_format.type: expected a string"},
      {R"({"type":"json_schema"})", "response_format.json_schema: expected an object"},
      {R"({"type":"json_schema","json_schema":{"name":"x"}})",
       "response_format.json_schema.schema: missing"},
      {R"({"type":"json_schema","json_schema":{"schema":3}})",
       "response_format.json_schema.schema: expected a schema (object or boolean), got integer"},
      {R"({"type":"json_object","schema":{"type":"object","minProperties":1}})",
       "response_format.schema.minProperties: not supported"},
      {R"({"type":"json_schema","json_schema":{"schema":{"type":"object","a":1,"a":2}}})",
       "duplicate key"},
  };
  for (const auto& [format, message] : cases) {
    EXPECT_THAT(JsonConstraint::FromResponseFormat(format).status(),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(message)))
        << format;
  }
}

TEST(JsonMatcher, AdditionalPropertiesSchemaAndDeclaredNames) {
  auto c = Schema(R"({"type":"object","properties":{"a":{"type":"integer"}},
      "additionalProperties":{"type":"string"}})");
  EXPECT_TRUE(Complete(c, R"({"x":"1","a":2,"y":""})"));
  EXPECT_TRUE(Complete(c, R"({})"));
  EXPECT_FALSE(Complete(c, R"({"x":1})"));
  // A declared name may not come in as an extra key (it would skip its own schema), however
  // it is spelled.
  EXPECT_FALSE(Complete(c, R"({"a":"1"})"));
  EXPECT_FALSE(Complete(c, R"({"\u0061":"1"})"));
  auto closed = Schema(R"({"type":"object","properties":{"a":{}}})");  // absent: closed
  EXPECT_TRUE(Complete(closed, R"({"a":[1,{"b":null}]})"));
  EXPECT_FALSE(Complete(closed, R"({"b":1})"));
  auto open = Schema(R"({"type":"object"})");  // no properties: any object
  EXPECT_TRUE(Complete(open, R"({"b":{"c":[true,false,null,-0.5e-3,"\u00e9"]}})"));
}

TEST(JsonMatcher, WhitespaceIsBounded) {
  auto c = Schema(R"({"type":"array","items":{"type":"integer"}})");
  EXPECT_TRUE(Complete(c, "[ 1 , 2 ]"));
  EXPECT_TRUE(Complete(c, "[\n" + std::string(64, ' ') + "1\n]"));
  EXPECT_FALSE(Complete(c, "[\n" + std::string(65, ' ') + "1\n]"));
  EXPECT_FALSE(Complete(c, "[  1]"));  // two spaces: one run is "", " " or "\n" + spaces
  EXPECT_FALSE(Complete(c, "[\t1]"));
  EXPECT_FALSE(Complete(c, "[1] "));  // nothing after the top-level value
  EXPECT_FALSE(Complete(c, " [1]"));
}

TEST(JsonMatcher, ArrayBoundsAndPrefixItems) {
  auto c = Schema(R"({"type":"array","prefixItems":[{"type":"string"},{"type":"boolean"}],
      "items":false,"minItems":1})");
  EXPECT_TRUE(Complete(c, R"(["a"])"));
  EXPECT_TRUE(Complete(c, R"(["a",true])"));
  EXPECT_FALSE(Complete(c, R"([])"));
  EXPECT_FALSE(Complete(c, R"(["a",true,1])"));
  EXPECT_FALSE(Complete(c, R"([true])"));
  JsonMatcher m(c);
  ASSERT_TRUE(m.Accept(R"(["a",false)"));
  EXPECT_FALSE(m.Accept(","));  // no third item may follow, so no comma either
  EXPECT_TRUE(m.Accept("]"));
  EXPECT_TRUE(m.MustEnd());
}

TEST(JsonMatcher, TextFormatIsUnconstrained) {
  JsonMatcher m(nullptr);
  EXPECT_TRUE(m.CanEnd());
  EXPECT_TRUE(m.Accept("not json at all \xff"));
  EXPECT_EQ(m.consumed(), 17);
  EXPECT_FALSE(m.MustEnd());
  TokenFilter filter({"a", "", "\xff"});
  std::vector<uint8_t> allowed;
  filter.Allowed(m, &allowed);
  EXPECT_EQ(allowed, (std::vector<uint8_t>{1, 0, 1}));
}

TEST(JsonMatcher, CopiesAreIndependent) {
  auto c = Schema(R"({"type":"object","properties":{"a":{"type":"string"}}})");
  JsonMatcher m(c);
  ASSERT_TRUE(m.Accept(R"({"a":"x)"));
  JsonMatcher copy = m;
  EXPECT_TRUE(copy.Accept(R"("})"));
  EXPECT_TRUE(copy.MustEnd());
  EXPECT_FALSE(m.CanEnd());
  EXPECT_TRUE(m.Accept("yz"));
  EXPECT_EQ(m.consumed(), 9);
  EXPECT_EQ(copy.consumed(), 9);
  m = copy;
  EXPECT_TRUE(m.MustEnd());
}

// The memo of the filter is keyed by the constraint too: two grammars whose states are laid out
// alike must not share answers.
TEST(TokenFilter, MemoDoesNotMixConstraints) {
  TokenFilter filter({"a", "\"", "ab"});
  auto one = Schema(R"({"type":"string","maxLength":1})");
  auto three = Schema(R"({"type":"string","maxLength":3})");
  JsonMatcher m1(one), m3(three);
  ASSERT_TRUE(m1.Accept("\"a"));
  ASSERT_TRUE(m3.Accept("\"a"));
  std::vector<uint8_t> a1, a3;
  for (int round = 0; round < 2; ++round) {
    filter.Allowed(m1, &a1);
    filter.Allowed(m3, &a3);
    EXPECT_EQ(a1, (std::vector<uint8_t>{0, 1, 0}));
    EXPECT_EQ(a3, (std::vector<uint8_t>{1, 1, 1}));
  }
}

// The memo keeps what its byte budget allows, the least recently used state out first, and
// never changes an answer (each is checked against trying every token).
TEST(TokenFilter, MemoKeepsItsByteBudgetLeastRecentlyUsedOut) {
  const std::vector<std::string> vocab = {"a", "\"", "ab", "aaaa"};
  auto c = Schema(R"({"type":"string","maxLength":5})");
  // Four states of one shape (inside the string, 0-3 characters): keys of one length.
  const std::vector<std::string> prefixes = {"\"", "\"a", "\"aa", "\"aaa"};
  std::vector<JsonMatcher> states;
  for (const std::string& p : prefixes) {
    states.emplace_back(c);
    ASSERT_TRUE(states.back().Accept(p));
  }
  auto expect_right = [&](const TokenFilter& f, size_t i) {
    std::vector<uint8_t> allowed;
    f.Allowed(states[i], &allowed);
    for (size_t t = 0; t < vocab.size(); ++t) {
      EXPECT_EQ(allowed[t], JsonMatcher(states[i]).Accept(vocab[t]) ? 1 : 0)
          << "state " << i << " token " << t;
    }
  };
  // One entry's cost, from a filter with room for all.
  TokenFilter roomy(vocab);
  expect_right(roomy, 0);
  const size_t cost = roomy.memo_stats().bytes;
  expect_right(roomy, 1);
  ASSERT_EQ(roomy.memo_stats().bytes, 2 * cost);  // the keys are one length
  EXPECT_GE(cost, vocab.size());

  TokenFilter two(vocab, 2 * cost);
  for (size_t i : {0, 1, 0, 2, 0, 1}) {  // A B A(hit) C(B out) A(hit) B(C out)
    expect_right(two, i);
    const TokenFilter::MemoStats st = two.memo_stats();
    EXPECT_LE(st.bytes, st.budget);
    EXPECT_LE(st.entries, 2u);
  }
  TokenFilter::MemoStats st = two.memo_stats();
  EXPECT_EQ(st.hits, 2u);  // first-in-first-out would have evicted A at C: 1 hit
  EXPECT_EQ(st.misses, 4u);
  EXPECT_EQ(st.entries, 2u);
  EXPECT_EQ(st.bytes, 2 * cost);

  // No memo (budget 0, or below one entry): every call walks, answers unchanged.
  for (size_t budget : {size_t{0}, cost - 1}) {
    TokenFilter none(vocab, budget);
    for (size_t i : {0, 0, 1, 3, 3}) expect_right(none, i);
    st = none.memo_stats();
    EXPECT_EQ(st.hits, 0u);
    EXPECT_EQ(st.misses, 5u);
    EXPECT_EQ(st.entries, 0u);
    EXPECT_EQ(st.bytes, 0u);
  }
}

// Allowed is const and shared by concurrent generations.
TEST(TokenFilter, ConcurrentCallsAgree) {
  const std::vector<std::string> vocab = {"{", "}", "\"", "\"a\"",  ":", "1", "12",
                                          ",", " ", "x",  "\"b\":", "[", "]", "true"};
  TokenFilter filter(vocab);
  auto c = Schema(R"({"type":"object","properties":{"a":{"type":"integer"},
      "b":{"type":"array","items":{"type":"boolean"}}}})");
  const std::vector<std::string> prefixes = {"{", "{\"a\":1", "{\"a\":12,\"b\":[", "{\"b\":[true"};
  std::vector<std::vector<uint8_t>> expected;
  for (const std::string& p : prefixes) {
    JsonMatcher m(c);
    EXPECT_TRUE(m.Accept(p));
    std::vector<uint8_t> v(vocab.size());
    for (size_t i = 0; i < vocab.size(); ++i) v[i] = JsonMatcher(m).Accept(vocab[i]) ? 1 : 0;
    expected.push_back(v);
  }
  std::vector<std::thread> threads;
  std::vector<int> mismatches(4, 0);
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      std::vector<uint8_t> allowed;
      for (int i = 0; i < 200; ++i) {
        const size_t k = static_cast<size_t>(i + t) % prefixes.size();
        JsonMatcher m(c);
        m.Accept(prefixes[k]);
        filter.Allowed(m, &allowed);
        mismatches[t] += allowed != expected[k];
      }
    });
  }
  for (std::thread& th : threads) th.join();
  EXPECT_EQ(mismatches, (std::vector<int>{0, 0, 0, 0}));
}

// Malformed keyword values are refused with the path, never a crash or an exception.
TEST(JsonConstraint, MalformedKeywordValuesAreRefused) {
  const std::pair<const char*, const char*> cases[] = {
      {R"({"properties":{"a":5}})", "schema.properties.a: expected a schema"},
      {R"({"properties":[]})", "schema.properties: expected an object"},
      {R"({"type":"object","required":"a"})", "schema.required: expected an array"},
      {R"({"type":"object","properties":{"a":{}},"required":[1]})", "schema.required[0]"},
      {R"({"type":"array","minItems":-1})", "schema.minItems: expected a non-negative integer"},
      {R"({"type":"string","maxLength":1.5})", "schema.maxLength: expected a non-negative"},
      {R"({"type":"string","maxLength":"3"})", "schema.maxLength: expected a non-negative"},
      {R"({"type":[]})", "schema.type: expected a type name"},
      {R"({"type":["string",3]})", "schema.type[1]: unknown type 3"},
      {R"({"enum":[]})", "schema.enum: expected a non-empty array"},
      {R"({"enum":1})", "schema.enum: expected a non-empty array"},
      {R"({"$ref":5})", "schema.$ref: expected a string"},
      {R"({"$ref":"#/anyOf/99999999999999999999999"})", "not found"},
      {R"({"anyOf":[]})", "schema.anyOf: expected a non-empty array"},
      {R"({"oneOf":{}})", "schema.oneOf: expected a non-empty array"},
      {R"({"type":"array","items":7})", "schema.items: expected a schema"},
      {R"({"type":"array","prefixItems":{}})", "schema.prefixItems: expected an array"},
      {R"({"type":"object","additionalProperties":"no"})", "schema.additionalProperties"},
      {R"({"type":"array","prefixItems":[{}],"items":false,"minItems":2})",
       "schema.minItems: greater than"},
      {R"({"const":1,"enum":[1]})", "schema.const: not supported beside 'enum'"},
      {R"("string")", "schema: expected a schema (object or boolean), got string"},
  };
  for (const auto& [schema, message] : cases) {
    EXPECT_THAT(JsonConstraint::FromSchema(schema).status(),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(message)))
        << schema;
  }
  // Huge bounds are "no bound", not an overflow.
  auto huge = Schema(R"({"type":"string","maxLength":1e300,"minLength":1})");
  EXPECT_TRUE(Complete(huge, R"("abc")"));
  EXPECT_FALSE(Complete(huge, R"("")"));
  // A reference into an array by index.
  auto indexed = Schema(R"({"anyOf":[{"type":"integer"},{"$ref":"#/anyOf/0"}]})");
  EXPECT_TRUE(Complete(indexed, "7"));
}

// A vocabulary of byte strings that exercises the grammar: JSON punctuation,
// partial UTF-8, escapes, digits, keys.
std::vector<std::string> TestVocabulary() {
  std::vector<std::string> v = {"",
                                "{",
                                "}",
                                "[",
                                "]",
                                ",",
                                ":",
                                "\"",
                                " ",
                                "\n",
                                "  ",
                                "\n  ",
                                "\"a\"",
                                "\"a",
                                "a",
                                "b",
                                "\"b\":",
                                "\":",
                                "\",",
                                "1",
                                "0",
                                "-",
                                ".",
                                "e",
                                "E+",
                                "12",
                                "01",
                                "-0",
                                "1.5",
                                "true",
                                "tr",
                                "ue",
                                "null",
                                "false",
                                "\\",
                                "\\u",
                                "d83d",
                                "\\ud83d",
                                "\\ude00",
                                "00",
                                "\\n",
                                "\\\"",
                                "\xc3",
                                "\xa9",
                                "\xc3\xa9",
                                "\xe2\x82",
                                "\xac",
                                "\xf0\x9f\x98\x80",
                                "\xed\xa0",
                                "\x80",
                                "\x01",
                                "},",
                                "],",
                                "\"}",
                                "\"]",
                                "\":\"",
                                "{\"",
                                "[{",
                                "x\"",
                                ", ",
                                ": ",
                                "\"v\"",
                                "\"kids\"",
                                "\"c\"",
                                "1,",
                                "2]",
                                "\t",
                                "hello",
                                " world",
                                "ab\"}",
                                "s\":\"",
                                "x\\n",
                                "caf\xc3\xa9",
                                "\xc3\xa9t\xc3\xa9\"",
                                "\"t\":\""};
  for (int b = 0; b < 256; ++b) v.push_back(std::string(1, static_cast<char>(b)));
  return v;
}

// Random walks over each schema (`walks` per schema, up to `steps` tokens each, a random allowed
// token at a time): at every state Allowed must equal trying every token (Accept on a copy).
// Returns the number of states compared; stops at the first mismatch (a failure).
int CompareWithBruteForce(const std::vector<std::string>& vocab, const TokenFilter& filter,
                          std::span<const char* const> schemas, int walks, int steps,
                          std::mt19937& rng) {
  std::vector<uint8_t> allowed;
  int states = 0;
  for (const char* s : schemas) {
    auto c = Schema(s);
    for (int walk = 0; walk < walks; ++walk) {
      JsonMatcher m(c);
      for (int step = 0; step < steps && !m.MustEnd(); ++step) {
        filter.Allowed(m, &allowed);
        if (allowed.size() != vocab.size()) {
          ADD_FAILURE() << "Allowed gave " << allowed.size() << " entries";
          return states;
        }
        std::vector<int32_t> ok;
        for (size_t i = 0; i < vocab.size(); ++i) {
          JsonMatcher copy = m;
          const bool expect = !vocab[i].empty() && copy.Accept(vocab[i]);
          if ((allowed[i] != 0) != expect) {
            ADD_FAILURE() << "token " << i << " '" << vocab[i] << "' after " << m.consumed()
                          << " bytes: filter " << int{allowed[i]} << ", trying it " << expect;
            return states;
          }
          if (expect) ok.push_back(static_cast<int32_t>(i));
        }
        ++states;
        if (ok.empty()) break;
        EXPECT_TRUE(m.Accept(vocab[ok[rng() % ok.size()]]));
      }
    }
  }
  return states;
}

TEST(TokenFilter, EqualsTryingEveryTokenOnRandomWalks) {
  const std::vector<std::string> vocab = TestVocabulary();
  TokenFilter filter(vocab);
  EXPECT_EQ(filter.vocab_size(), static_cast<int32_t>(vocab.size()));
  const char* schemas[] = {
      R"({"type":"object","properties":{"a":{"type":"string","maxLength":4},
          "b":{"type":"array","items":{"type":"number"},"maxItems":3},
          "c":{"enum":[1,12,"x"]}},"required":["c"]})",
      R"({"$defs":{"n":{"type":"object","properties":{"v":{"type":"integer"},
          "kids":{"type":"array","items":{"$ref":"#/$defs/n"},"maxItems":2}},"required":["v"]}},
          "$ref":"#/$defs/n"})",
      R"({"type":"object","properties":{"s":{"type":"string"}},"additionalProperties":true})",
      // Long enough that the memo treats some lengths alike (far from maxLength), not others.
      R"({"type":"object","properties":{"t":{"type":"string","minLength":3,"maxLength":24}},
          "required":["t"]})",
      // Pattern / format strings and bounded integers (DFA states in the frames).
      R"({"type":"object","properties":{"p":{"type":"string","pattern":"^[a-z]+(-\\d{1,3})?$"},
          "q":{"type":"string","pattern":"x.y","maxLength":12},
          "d":{"type":"string","format":"date"},
          "n":{"type":"integer","minimum":-40,"maximum":1234}},"required":["p","q","d","n"]})",
  };
  std::mt19937 rng(7);
  EXPECT_GT(CompareWithBruteForce(vocab, filter, schemas, 6, 48, rng), 50);
}

// The same at scale: 40,000 random tokens of up to 24 bytes (mostly plain ASCII runs, so the
// whole-subtree and memo-length shortcuts fire, with JSON punctuation, escapes and UTF-8 pieces
// mixed in), on walks through long bounded and unbounded strings.
TEST(TokenFilter, EqualsTryingEveryTokenOnALargeRandomVocabulary) {
  std::mt19937 rng(11);
  const std::vector<std::string> pieces = {
      "a", "b", "e", " ", "x",  "1", "0", ".",  "-",        "\"",       ",",    ":",
      "{", "}", "[", "]", "\\", "n", "u", "\n", "\xc3\xa9", "\xe2\x82", "\xac", "\xf0\x9f\x98\x80"};
  std::set<std::string> unique;
  while (unique.size() < 40000) {
    std::string t;
    const int n = 1 + static_cast<int>(rng() % 24);
    while (static_cast<int>(t.size()) < n) {
      t += rng() % 3 != 0 ? std::string(1, static_cast<char>('a' + rng() % 26))
                          : pieces[rng() % pieces.size()];
    }
    unique.insert(t);
  }
  std::vector<std::string> vocab(unique.begin(), unique.end());
  vocab.push_back("");
  TokenFilter filter(vocab);
  const char* schemas[] = {
      R"({"type":"object","properties":{"s":{"type":"string","maxLength":60},
          "t":{"type":"string"},"n":{"type":"number"}},"required":["s","t"]})",
      R"({"type":"array","items":{"type":"string","minLength":30}})",
  };
  EXPECT_GT(CompareWithBruteForce(vocab, filter, schemas, 2, 12, rng), 20);
}

}  // namespace
}  // namespace coli::grammar
