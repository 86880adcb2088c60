// pattern / format / integer bounds (common/grammar/regex.*, schema_compiler.cc): hand-written
// accept / reject cases, refusals naming the path, and every integer of a window against plain
// arithmetic. The reference test (reference_test.cc) checks the same keywords against Python's
// re.search and jsonschema's FormatChecker.
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/grammar/json_constraint.h"
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

// Whether the JSON string `value` (already quoted / escaped) is a complete document.
bool StringOk(const std::string& pattern_schema, const std::string& value) {
  return Complete(Schema(pattern_schema), value);
}

TEST(Pattern, AnchorsClassesAndQuantifiers) {
  const std::string code = R"({"type":"string","pattern":"^[A-Z]{2}-\\d{2,4}$"})";
  EXPECT_TRUE(StringOk(code, R"("AB-12")"));
  EXPECT_TRUE(StringOk(code, R"("AB-1234")"));
  EXPECT_FALSE(StringOk(code, R"("AB-1")"));
  EXPECT_FALSE(StringOk(code, R"("AB-12345")"));  // $ anchors the end
  EXPECT_FALSE(StringOk(code, R"("xAB-12")"));    // ^ anchors the start
  EXPECT_FALSE(StringOk(code, R"("ab-12")"));
  // Unanchored: the string must contain a match, anything around it.
  const std::string has = R"({"type":"string","pattern":"[0-9]+x"})";
  EXPECT_TRUE(StringOk(has, R"("ab 12x, é")"));
  EXPECT_FALSE(StringOk(has, R"("ab 12")"));
  EXPECT_FALSE(StringOk(has, R"("x1")"));
  // Negated class: anything but the listed characters, non-ASCII included.
  const std::string neg = R"({"type":"string","pattern":"^[^a-z]*$"})";
  EXPECT_TRUE(StringOk(neg, "\"AB1 \xc3\xa9\""));
  EXPECT_FALSE(StringOk(neg, R"("ABc")"));
  // Shorthands are ASCII: \w takes no non-ASCII letter, [^\w] no non-ASCII at all.
  EXPECT_FALSE(StringOk(R"({"type":"string","pattern":"^\\w+$"})", "\"a\xc3\xa9\""));
  EXPECT_FALSE(StringOk(R"({"type":"string","pattern":"^[^\\w]$"})", "\"\xc3\xa9\""));
  EXPECT_TRUE(StringOk(R"({"type":"string","pattern":"^[^\\w]$"})", R"("!")"));
  // Alternation binds loosest: ^a|b$ is (^a)|(b$).
  const std::string alt = R"({"type":"string","pattern":"^a|b$"})";
  EXPECT_TRUE(StringOk(alt, R"("axx")"));
  EXPECT_TRUE(StringOk(alt, R"("xxb")"));
  EXPECT_FALSE(StringOk(alt, R"("xax")"));
  // Groups, ? and {m,}.
  const std::string grp = R"({"type":"string","pattern":"^(ab)?c{2,}$"})";
  EXPECT_TRUE(StringOk(grp, R"("abcc")"));
  EXPECT_TRUE(StringOk(grp, R"("ccc")"));
  EXPECT_FALSE(StringOk(grp, R"("abc")"));
  EXPECT_FALSE(StringOk(grp, R"("aabcc")"));
  // Escapes are refused in pattern strings even where they would decode to a match.
  EXPECT_FALSE(StringOk(R"({"type":"string","pattern":"^a$"})", R"("\u0061")"));
}

TEST(Pattern, EveryPrefixCanCompleteWithinMaxLength) {
  // "cat" must appear within 6 characters: after "xxx" only 'c' may follow.
  auto c = Schema(R"({"type":"string","pattern":"cat","maxLength":6})");
  JsonMatcher m(c);
  ASSERT_TRUE(m.Accept("\"xx"));
  JsonMatcher x = m;
  EXPECT_TRUE(x.Accept("x"));
  EXPECT_FALSE(x.Accept("x"));  // "xxxx" leaves no room for "cat"
  EXPECT_TRUE(x.Accept("c"));
  EXPECT_FALSE(m.Accept("\""));
  EXPECT_TRUE(Complete(c, R"("xxxcat")"));
  EXPECT_FALSE(Complete(c, R"("xxxxcat")"));
}

TEST(Format, BuiltInPatterns) {
  auto fmt = [](const char* f) {
    return Schema(absl::StrCat(R"({"type":"string","format":")", f, "\"}"));
  };
  auto date = fmt("date");
  EXPECT_TRUE(Complete(date, R"("2024-02-29")"));
  EXPECT_FALSE(Complete(date, R"("2023-02-29")"));  // not a leap year
  EXPECT_FALSE(Complete(date, R"("1900-02-29")"));
  EXPECT_TRUE(Complete(date, R"("2000-02-29")"));
  EXPECT_FALSE(Complete(date, R"("2024-04-31")"));
  EXPECT_FALSE(Complete(date, R"("0000-01-01")"));
  auto time = fmt("time");
  EXPECT_TRUE(Complete(time, R"("23:59:59.5+05:30")"));
  EXPECT_FALSE(Complete(time, R"("24:00:00Z")"));
  EXPECT_FALSE(Complete(time, R"("12:00:00")"));  // RFC 3339 needs the offset
  EXPECT_TRUE(Complete(fmt("date-time"), R"("2000-01-01T00:00:00Z")"));
  auto ipv4 = fmt("ipv4");
  EXPECT_TRUE(Complete(ipv4, R"("255.0.10.1")"));
  EXPECT_FALSE(Complete(ipv4, R"("256.0.0.1")"));
  EXPECT_FALSE(Complete(ipv4, R"("01.0.0.1")"));
  auto ipv6 = fmt("ipv6");
  EXPECT_TRUE(Complete(ipv6, R"("::1")"));
  EXPECT_TRUE(Complete(ipv6, R"("fe80::1:2")"));
  EXPECT_FALSE(Complete(ipv6, R"("1::2::3")"));
  EXPECT_FALSE(Complete(ipv6, R"("1:2:3:4:5:6:7:8:9")"));
  EXPECT_TRUE(Complete(fmt("uuid"), R"("123e4567-e89b-12d3-a456-426614174000")"));
  EXPECT_FALSE(Complete(fmt("uuid"), R"("123e4567e89b12d3a456426614174000")"));
  EXPECT_TRUE(Complete(fmt("email"), R"("a.b+c@ex-ample.org")"));
  EXPECT_FALSE(Complete(fmt("email"), R"("a@b")"));
  auto host = fmt("hostname");
  EXPECT_TRUE(Complete(host, R"("a-b.example")"));
  EXPECT_FALSE(Complete(host, R"("-a.example")"));
  EXPECT_FALSE(Complete(host, absl::StrCat("\"", std::string(64, 'a'), "\"")));  // label > 63
  // Unknown formats are annotations (what validators do by default).
  EXPECT_TRUE(Complete(fmt("x-color"), R"("anything \" goes")"));
}

TEST(IntegerBounds, EveryIntegerOfAWindowAgreesWithArithmetic) {
  struct Range {
    const char* bounds;
    long lo, hi;
  };
  const Range ranges[] = {
      {R"("minimum":-5,"maximum":123)", -5, 123},
      {R"("exclusiveMinimum":7,"exclusiveMaximum":1000.5)", 8, 1000},
      {R"("minimum":-1234,"maximum":-99)", -1234, -99},
      {R"("minimum":0.5,"exclusiveMaximum":10)", 1, 9},
      {R"("minimum":99,"maximum":100)", 99, 100},
      {R"("minimum":-1e3)", -1000, 1'000'000},
      {R"("maximum":-1.5)", -1'000'000, -2},
      {R"("minimum":0,"maximum":0)", 0, 0},
  };
  for (const Range& r : ranges) {
    SCOPED_TRACE(r.bounds);
    auto c = Schema(absl::StrCat(R"({"type":"integer",)", r.bounds, "}"));
    // Inside an array too (the number ends lazily, at the ',' / ']').
    auto arr =
        Schema(absl::StrCat(R"({"type":"array","items":{"type":"integer",)", r.bounds, "}}"));
    for (long v = -1500; v <= 1500; ++v) {
      const bool in = v >= r.lo && v <= r.hi;
      ASSERT_EQ(Complete(c, std::to_string(v)), in) << v;
      ASSERT_EQ(Complete(arr, absl::StrCat("[", v, ",", v, "]")), in) << v;
    }
    EXPECT_FALSE(Complete(c, "-0"));
    EXPECT_FALSE(Complete(c, "1.0"));
    EXPECT_FALSE(Complete(c, "007"));
  }
  // Wide bounds: the 19-digit edge.
  auto wide = Schema(R"({"type":"integer","minimum":-9223372036854775808})");
  EXPECT_TRUE(Complete(wide, "-9223372036854775808"));
  EXPECT_FALSE(Complete(wide, "-9223372036854775809"));
  EXPECT_TRUE(Complete(wide, "9999999999999999999"));
}

// Numbers with integer-valued bounds: every quarter in [-12, 12] spelled as an integer, with
// one fraction digit where exact, with two, and with trailing zeros, against exact arithmetic
// on quarters (4 * value).
TEST(NumberBounds, QuartersAgreeWithArithmetic) {
  struct Range {
    const char* bounds;
    int lo4, hi4;  // 4 * bound
    bool lo_excl, hi_excl;
  };
  const Range ranges[] = {
      {R"("minimum":0,"maximum":1)", 0, 4, false, false},
      {R"("exclusiveMinimum":-2,"exclusiveMaximum":3)", -8, 12, true, true},
      {R"("minimum":-3,"exclusiveMaximum":0)", -12, 0, false, true},
      {R"("exclusiveMinimum":0,"maximum":0.0e0,"minimum":-1)", 0, 0, true, false},  // empty > 0
      {R"("minimum":-1,"maximum":-1)", -4, -4, false, false},
      {R"("maximum":2)", -1'000'000, 8, false, false},
      {R"("exclusiveMinimum":1,"maximum":3)", 4, 12, true, false},
  };
  for (const Range& r : ranges) {
    SCOPED_TRACE(r.bounds);
    auto made = JsonConstraint::FromSchema(absl::StrCat(R"({"type":"number",)", r.bounds, "}"));
    if (r.lo4 == 0 && r.hi4 == 0 && r.lo_excl) {  // (0, 0]: no number
      EXPECT_FALSE(made.ok());
      continue;
    }
    ASSERT_TRUE(made.ok()) << made.status();
    for (int q = -48; q <= 48; ++q) {
      const bool in = (r.lo_excl ? q > r.lo4 : q >= r.lo4) && (r.hi_excl ? q < r.hi4 : q <= r.hi4);
      const int whole = (q < 0 ? -q : q) / 4, frac = (q < 0 ? -q : q) % 4;
      const std::string sign = q < 0 ? "-" : "";
      const char* digits[] = {"0", "25", "5", "75"};
      std::vector<std::string> spellings = {absl::StrCat(sign, whole, ".", digits[frac]),
                                            absl::StrCat(sign, whole, ".", digits[frac], "00")};
      if (frac == 0) spellings.push_back(absl::StrCat(sign, whole));
      for (const std::string& text : spellings) {
        ASSERT_EQ(Complete(*made, text), in) << text;
      }
    }
    EXPECT_FALSE(Complete(*made, "1e0"));  // no exponents when bounded
  }
}

TEST(PatternFormatBounds, RefusalsNameThePath) {
  const std::pair<const char*, const char*> cases[] = {
      {R"j({"properties":{"a":{"type":"string","pattern":"(a)\\1"}}})j",
       "schema.properties.a.pattern: a backreference"},
      {R"j({"type":"string","pattern":"a(?=b)"})j", "schema.pattern: a group '(?'"},
      {R"j({"type":"string","pattern":"(?<n>a)"})j", "schema.pattern: a group '(?'"},
      {R"j({"type":"string","pattern":"\\bword"})j", "schema.pattern: the escape \\b"},
      {R"j({"type":"string","pattern":"caf\u00e9"})j", "schema.pattern: a non-ASCII character"},
      {R"j({"type":"string","pattern":"a{3,2}"})j",
       "schema.pattern: a quantifier {m,n} with n < m"},
      {R"j({"type":"string","pattern":"(ab"})j", "schema.pattern: an unterminated group"},
      {R"j({"type":"string","pattern":"[]"})j", "schema.pattern: an empty class"},
      {R"j({"type":"string","pattern":"^\"$"})j", "schema.pattern: no string matches"},
      {R"j({"type":"string","pattern":"a$b"})j", "schema.pattern: no string matches"},
      {R"j({"type":"string","pattern":"a","minLength":2})j",
       "schema.minLength: not supported beside"},
      {R"j({"type":"string","pattern":"^abc$","maxLength":2})j", "schema.maxLength: shorter than"},
      {R"j({"type":"string","pattern":1})j", "schema.pattern: expected a string"},
      {R"j({"type":"string","format":"date","pattern":"a"})j",
       "schema.pattern: not supported beside"},
      {R"j({"type":"integer","minimum":5,"maximum":4})j", "schema: no integer satisfies"},
      {R"j({"type":"integer","exclusiveMinimum":4,"exclusiveMaximum":5})j", "schema: no integer"},
      {R"j({"type":"integer","minimum":"3"})j", "schema.minimum: expected a number"},
      {R"j({"type":"number","minimum":0.5,"maximum":0.25})j", "schema: no number satisfies"},
      {R"j({"type":"number","minimum":1,"exclusiveMaximum":1})j", "schema: no number satisfies"},
      {R"j({"enum":["a","b"],"pattern":"a"})j", "schema.pattern: not supported beside 'enum'"},
      {R"j({"const":"x","format":"date"})j", "schema.format: not supported beside 'const'"},
  };
  test_util::ExpectRefusals(cases);
}

// A schema's patterns share a budget of DFA states (a client's schema of many costly patterns is
// refused by name instead of compiling for minutes into gigabytes); equal patterns compile once.
TEST(Pattern, ManyCostlyPatternsAreRefusedByNameEqualOnesCompileOnce) {
  // `^[ab]*a[ab]{10}` + a suffix: 2,048+ DFA states each.
  auto schema = [](int n, bool distinct) {
    std::string s = R"({"type":"object","properties":{)";
    for (int i = 0; i < n; ++i) {
      s += absl::StrCat(i ? "," : "", "\"p", i,
                        "\":{\"type\":\"string\",\"pattern\":\"^[ab]*a[ab]{10}", distinct ? i : 0,
                        "\"}");
    }
    return s + "}}";
  };
  auto many = JsonConstraint::FromSchema(schema(40, true));
  EXPECT_THAT(many.status(), StatusIs(absl::StatusCode::kInvalidArgument,
                                      HasSubstr("patterns / formats need more than 65536 DFA "
                                                "states in all")));
  EXPECT_THAT(many.status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("schema.properties.p")));
  EXPECT_OK(JsonConstraint::FromSchema(schema(200, false)).status());
  EXPECT_OK(JsonConstraint::FromSchema(schema(8, true)).status());
}

}  // namespace
}  // namespace coli::grammar
