// Python-compatible JSON text (plugins/kimi_k3/chat_json.h). Expected strings were produced by
// CPython 3.11's repr() / json.dumps / json.loads and pasted here.
#include "plugins/kimi_k3/chat_json.h"

#include <cmath>
#include <limits>

#include "common/status/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace coli::k3 {
namespace {

using ::coli::testing::StatusIs;

TEST(PyFloatRepr, MatchesPythonRepr) {
  const std::pair<double, const char*> cases[] = {
      {1e5, "100000.0"},
      {1e-7, "1e-07"},
      {-0.0, "-0.0"},
      {0.0, "0.0"},
      {0.1, "0.1"},
      {1e16, "1e+16"},
      {1e15, "1000000000000000.0"},
      {9999999999999998.0, "9999999999999998.0"},
      {0.0001, "0.0001"},
      {0.00001, "1e-05"},
      {-2.5e-5, "-2.5e-05"},
      {1.5e300, "1.5e+300"},
      {123.456, "123.456"},
      {5e-324, "5e-324"},
      {1.7976931348623157e308, "1.7976931348623157e+308"},
      {2.5, "2.5"},
      {100.0, "100.0"},
      {1234567890123456789.0, "1.2345678901234568e+18"},
      {0.1 + 0.2, "0.30000000000000004"},
      {1e22, "1e+22"},
      {std::numeric_limits<double>::quiet_NaN(), "NaN"},
      {std::numeric_limits<double>::infinity(), "Infinity"},
      {-std::numeric_limits<double>::infinity(), "-Infinity"},
  };
  for (const auto& [value, expected] : cases) {
    EXPECT_EQ(PyFloatRepr(value), expected) << expected;
  }
}

TEST(PyJsonDumps, SpacedKeepsOrderAndTypes) {
  Json v = Json::parse(R"({"z": 1, "a": [1, 2.0, "é\n\u0001\u007f\"\\"], "o": {}, "l": [],
                           "n": null, "t": true})");
  EXPECT_EQ(PyJsonDumps(v, PyJsonStyle::kSpaced),
            "{\"z\": 1, \"a\": [1, 2.0, \"é\\n\\u0001\x7f\\\"\\\\\"], \"o\": {}, \"l\": [], "
            "\"n\": null, \"t\": true}");
}

TEST(PyJsonDumps, CompactSortedSortsRecursivelyByCodePoint) {
  Json v = Json::parse(R"({"b": {"y": 1, "x": [{"d": 1, "c": 2}]}, "a": 1e5, "É": 0, "Z": 0})");
  EXPECT_EQ(PyJsonDumps(v, PyJsonStyle::kCompactSorted),
            R"({"Z":0,"a":100000.0,"b":{"x":[{"c":2,"d":1}],"y":1},"É":0})");
}

TEST(PyJsonDumps, LargeUnsignedAndNegativeIntegers) {
  Json v = Json::parse("[18446744073709551615, -9223372036854775808, 0]");
  EXPECT_EQ(PyJsonDumps(v, PyJsonStyle::kSpaced), "[18446744073709551615, -9223372036854775808, 0]");
}

TEST(ParsePyJson, AcceptsNanInfinityAndKeepsFirstPositionOfDuplicateKey) {
  // Python: json.loads('{"a": 1, "b": NaN, "a": -Infinity}') == {'a': -inf, 'b': nan}
  auto parsed = ParsePyJson(R"({"a": 1, "b": NaN, "a": -Infinity})");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  ASSERT_EQ(parsed->size(), 2u);
  auto it = parsed->begin();
  EXPECT_EQ(it.key(), "a");
  EXPECT_TRUE(std::isinf(it.value().get<double>()) && it.value().get<double>() < 0);
  ++it;
  EXPECT_EQ(it.key(), "b");
  EXPECT_TRUE(std::isnan(it.value().get<double>()));
  EXPECT_EQ(PyJsonDumps(*parsed, PyJsonStyle::kSpaced), R"({"a": -Infinity, "b": NaN})");
}

TEST(ParsePyJson, IntegersStayIntegersFloatsStayFloats) {
  auto parsed = ParsePyJson(R"([1, 1.0, 1e5, 1E-7, -0.0, -0])");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(PyJsonDumps(*parsed, PyJsonStyle::kSpaced),
            "[1, 1.0, 100000.0, 1e-07, -0.0, 0]");
}

TEST(ParsePyJson, IntegersBeyond64BitsBecomeFloats) {
  // Documented difference: Python keeps 12345678901234567890123 exact; we read a float.
  auto parsed = ParsePyJson("12345678901234567890123");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_TRUE(parsed->is_number_float());
}

TEST(ParsePyJson, DecodesEscapesAndSurrogatePairs) {
  auto parsed = ParsePyJson(R"("a\u00e9\ud83d\ude00\n\/")");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->get<std::string>(), "a\xC3\xA9\xF0\x9F\x98\x80\n/");
}

TEST(ParsePyJson, RefusesMalformedText) {
  for (const char* bad : {"", "{", "[1,]", "{\"a\" 1}", "tru", "\"\\x\"", "\"\\ud800\"", "01",
                          "[1] 2", "{'a': 1}", "\"a\nb\"", "nan"}) {
    EXPECT_THAT(ParsePyJson(bad), StatusIs(absl::StatusCode::kInvalidArgument)) << bad;
  }
}

TEST(ParsePyJson, RefusesExcessiveNesting) {
  std::string deep(2000, '[');
  deep += std::string(2000, ']');
  EXPECT_THAT(ParsePyJson(deep), StatusIs(absl::StatusCode::kInvalidArgument));
}

}  // namespace
}  // namespace coli::k3
