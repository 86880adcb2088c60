// Fractional number bounds and multipleOf (common/grammar/schema_compiler.cc's NumberAutomaton)
// against an independent reference written here: a number is parsed into sign, digits N and
// fraction length j (value = N / 10^j) and compared with bounds B / 10^f and multipleOf
// K / 10^g by cross-multiplying in __int128 — no decimal-string comparison, no code shared with
// the compiler.
//
// - NumberBounds.EveryShortSpellingAgreesWithExactArithmetic: 120 random schemas (bounds with
//   0-3 fraction digits, both signs, inclusive / exclusive, one- or two-sided, multipleOf values,
//   integer and number): every string of up to 5 bytes over "-0123456789." is accepted by the
//   compiled DFA as a complete value exactly when the reference says so, every prefix it takes
//   is a prefix of a JSON number, and every DFA state can still end (no dead ends); longer
//   spellings near the bounds and multiples are checked one by one.
// - NumberBounds.MatcherAgreesAtTopLevelAndInsideArrays: the same through JsonMatcher (lazy
//   number end at ',' / ']'), every accepted prefix completable one byte further.
// - NumberBounds.HandWrittenEdges / MultipleOfHandWritten / RefusalsNameThePath.
#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/grammar/grammar.h"
#include "common/grammar/json_constraint.h"
#include "common/status/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/common/grammar/grammar_test_util.h"

namespace coli::grammar {
namespace {

using ::coli::testing::StatusIs;
using ::testing::HasSubstr;
using test_util::Complete;
using test_util::Schema;

using i128 = __int128;

i128 Pow10(int e) {
  i128 p = 1;
  for (int i = 0; i < e; ++i) p *= 10;
  return p;
}

// ---- the reference ---------------------------------------------------------------------------

// A JSON number without exponent: -?(0|[1-9][0-9]*)(.[0-9]+)?
struct Parsed {
  bool neg = false;
  i128 n = 0;  // all digits, as an integer
  int j = 0;   // fraction digits
  int int_digits = 0;
  bool dot = false;
};

std::optional<Parsed> ParseNumber(std::string_view s) {
  Parsed p;
  size_t i = 0;
  if (i < s.size() && s[i] == '-') p.neg = true, ++i;
  const size_t int_start = i;
  while (i < s.size() && s[i] >= '0' && s[i] <= '9') p.n = p.n * 10 + (s[i++] - '0');
  p.int_digits = static_cast<int>(i - int_start);
  if (p.int_digits == 0 || (p.int_digits > 1 && s[int_start] == '0')) return std::nullopt;
  if (i < s.size() && s[i] == '.') {
    p.dot = true;
    ++i;
    const size_t frac_start = i;
    while (i < s.size() && s[i] >= '0' && s[i] <= '9') p.n = p.n * 10 + (s[i++] - '0');
    p.j = static_cast<int>(i - frac_start);
    if (p.j == 0) return std::nullopt;
  }
  if (i != s.size()) return std::nullopt;
  if (p.int_digits + p.j > 36) ADD_FAILURE() << "reference overflow: " << s;
  return p;
}

// Whether some JSON number (over this alphabet) starts with p.
bool SyntaxAlive(std::string_view p) {
  return ParseNumber(p).has_value() || ParseNumber(std::string(p) + "0").has_value();
}

struct Bound {
  bool present = false;
  int64_t b = 0;  // value b / 10^f
  int f = 0;
  bool exclusive = false;
};

struct Case {
  bool integer = false;
  Bound lo, hi;
  int64_t k = 0;  // multipleOf k / 10^g; 0: none
  int g = 0;
  int style = 0;  // how bounds are spelled in the schema text (see Text)
};

// A decimal text for b / 10^f: plain ("-1.25"), with trailing zeros ("-1.2500") or with an
// exponent ("-125e-2"), as nlohmann reads all three to the same double.
std::string Text(int64_t b, int f, int style) {
  if (style == 2) return absl::StrCat(b, "e-", f);
  const bool neg = b < 0;
  std::string digits = std::to_string(neg ? -b : b);
  if (static_cast<int>(digits.size()) <= f) digits.insert(0, f + 1 - digits.size(), '0');
  std::string out = neg ? "-" : "";
  if (f == 0) return absl::StrCat(out, digits, style == 1 ? ".0" : "");
  absl::StrAppend(&out, digits.substr(0, digits.size() - f), ".", digits.substr(digits.size() - f));
  return style == 1 ? absl::StrCat(out, "00") : out;
}

double ToDouble(std::string_view s) { return std::strtod(std::string(s).c_str(), nullptr); }

std::string SchemaText(const Case& c) {
  std::string s = absl::StrCat(R"({"type":")", c.integer ? "integer" : "number", "\"");
  auto add = [&](const Bound& b, const char* inclusive, const char* exclusive) {
    if (!b.present) return;
    absl::StrAppend(&s, ",\"", b.exclusive ? exclusive : inclusive, "\":", Text(b.b, b.f, c.style));
  };
  add(c.lo, "minimum", "exclusiveMinimum");
  add(c.hi, "maximum", "exclusiveMaximum");
  if (c.k > 0) absl::StrAppend(&s, ",\"multipleOf\":", Text(c.k, c.g, c.style % 2));
  return s + "}";
}

// Whether `s` is a value of the case's schema, as coli spells it: a JSON number without
// exponent, at most 19 integer and 24 fraction digits; an integer has no fraction and is not -0.
bool Valid(const Case& c, std::string_view s) {
  const std::optional<Parsed> p = ParseNumber(s);
  if (!p || p->int_digits > 19 || p->j > 24) return false;
  if (c.integer && (p->dot || (p->neg && p->n == 0))) return false;
  const i128 x = p->neg ? -p->n : p->n;  // value x / 10^j
  auto cmp = [&](const Bound& b) {        // sign of value - bound
    const i128 l = x * Pow10(b.f), r = static_cast<i128>(b.b) * Pow10(p->j);
    return l < r ? -1 : (l > r ? 1 : 0);
  };
  if (c.lo.present) {
    const int d = cmp(c.lo);
    if (d < 0 || (d == 0 && c.lo.exclusive)) return false;
  }
  if (c.hi.present) {
    const int d = cmp(c.hi);
    if (d > 0 || (d == 0 && c.hi.exclusive)) return false;
  }
  // Clients read both as the nearest double (strtod): past an exclusive bound the value must
  // still be past the bound's double (0.10000000000000000001 reads as 0.1).
  const double v = ToDouble(s);
  if (c.lo.present && c.lo.exclusive && !(v > ToDouble(Text(c.lo.b, c.lo.f, 0)))) return false;
  if (c.hi.present && c.hi.exclusive && !(v < ToDouble(Text(c.hi.b, c.hi.f, 0)))) return false;
  // value / (k / 10^g) = n * 10^g / (k * 10^j) must be an integer.
  if (c.k > 0 && (p->n * Pow10(c.g)) % (static_cast<i128>(c.k) * Pow10(p->j)) != 0) return false;
  return true;
}

// ---- the compiled DFA ------------------------------------------------------------------------

constexpr char kAlphabet[] = "-0123456789.";

const internal::Dfa* RootDfa(const internal::Grammar& g) {
  const internal::Node& n = g.nodes[g.root];
  if ((n.kind != internal::Kind::kNumber && n.kind != internal::Kind::kInteger) || n.dfa < 0) {
    return nullptr;
  }
  return &g.dfas[n.dfa];
}

int32_t RunDfa(const internal::Dfa& dfa, std::string_view s) {
  int32_t st = 0;
  for (char ch : s) {
    st = dfa.Next(st, static_cast<unsigned char>(ch));
    if (st < 0) return -1;
  }
  return st;
}

struct WalkStats {
  int64_t strings = 0, valid = 0, completions = 0;
};

// Every string of up to `depth` more bytes after `s` (DFA state `st`, -1 once refused).
void Walk(const Case& c, const internal::Dfa& dfa, std::string& s, int32_t st, int depth,
          std::mt19937& rng, WalkStats* stats) {
  const bool alive = SyntaxAlive(s);
  if (!alive) {
    // No extension is a number: the DFA must have refused a byte already (prune).
    ASSERT_LT(st, 0) << "the DFA takes '" << s << "', which no JSON number starts with";
    return;
  }
  ++stats->strings;
  const bool valid = Valid(c, s);
  stats->valid += valid;
  ASSERT_EQ(st >= 0 && dfa.accept[st] != 0, valid) << "'" << s << "'";
  if (depth == 0) {
    // Now and then, finish the spelling along random DFA edges: the reference must accept it.
    if (st >= 0 && rng() % 8 == 0) {
      std::string t = s;
      int32_t at = st;
      while (!dfa.accept[at] || rng() % 3 == 0) {
        std::vector<std::pair<char, int32_t>> next;
        for (const char* a = kAlphabet; *a; ++a) {
          if (dfa.Next(at, *a) >= 0) next.emplace_back(*a, dfa.Next(at, *a));
        }
        if (next.empty()) break;
        const auto& [ch, to] = next[rng() % next.size()];
        t += ch;
        at = to;
      }
      ASSERT_TRUE(dfa.accept[at]) << "dead end after '" << t << "'";
      ASSERT_TRUE(Valid(c, t)) << "'" << t << "'";
      ++stats->completions;
    }
    return;
  }
  for (const char* a = kAlphabet; *a; ++a) {
    s.push_back(*a);
    Walk(c, dfa, s, st >= 0 ? dfa.Next(st, *a) : -1, depth - 1, rng, stats);
    s.pop_back();
    if (::testing::Test::HasFatalFailure()) return;
  }
}

// Spellings longer than the walk reaches: near the bounds and at multiples, with extra digits
// and trailing zeros.
std::vector<std::string> LongSpellings(const Case& c, std::mt19937& rng) {
  std::vector<std::string> out;
  auto digits = [&rng](int n) {
    std::string d;
    for (int i = 0; i < n; ++i) d += static_cast<char>('0' + rng() % 10);
    return d;
  };
  for (const Bound* b : {&c.lo, &c.hi}) {
    if (!b->present) continue;
    const std::string t = Text(b->b, b->f, 0);
    for (int i = 0; i < 200; ++i) {
      std::string s = t;
      if (rng() % 2 && s.find('.') == std::string::npos) s += ".";
      if (s.back() == '.') s += digits(1);
      s += rng() % 3 == 0 ? std::string(1 + rng() % 20, '0') : digits(rng() % 8);
      if (rng() % 4 == 0) s += digits(1 + rng() % 3);
      out.push_back(s);
      // Nudge the last digit down / up.
      std::string t2 = s;
      char& last = t2.back();
      if (last > '0') --last, out.push_back(t2);
      out.push_back(absl::StrCat(s, "1"));
    }
    out.push_back(t);
    out.push_back(t[0] == '-' ? t.substr(1) : absl::StrCat("-", t));
  }
  if (c.k > 0) {
    for (int64_t t = -40; t <= 40; ++t) {  // t * k / 10^g
      const int64_t v = t * c.k;
      out.push_back(Text(v, c.g, 0));
      out.push_back(absl::StrCat(Text(v, c.g, 0), c.g == 0 ? ".000" : "0000"));
      out.push_back(absl::StrCat(Text(v, c.g, 0), c.g == 0 ? ".01" : "1"));
      out.push_back(Text(v + 1, c.g, 0));
    }
  }
  for (int i = 0; i < 300; ++i) {  // anything, up to 12 + 14 digits
    std::string s = rng() % 2 ? "-" : "";
    s += rng() % 5 == 0 ? "0" : absl::StrCat(1 + rng() % 9, digits(rng() % 12));
    if (rng() % 2) absl::StrAppend(&s, ".", digits(1 + rng() % 14));
    out.push_back(s);
  }
  out.push_back("-0");
  out.push_back("-0.0");
  out.push_back("0.000");
  return out;
}

Case RandomCase(std::mt19937& rng) {
  Case c;
  c.integer = rng() % 4 == 0;
  c.style = static_cast<int>(rng() % 3);
  auto bound = [&rng]() {
    Bound b;
    b.present = true;
    b.f = static_cast<int>(rng() % 4);
    const int64_t whole = rng() % 3 == 0 ? rng() % 25 : rng() % 3;
    b.b = whole * static_cast<int64_t>(Pow10(b.f)) + static_cast<int64_t>(rng() % Pow10(b.f));
    if (rng() % 2) b.b = -b.b;
    b.exclusive = rng() % 2;
    return b;
  };
  const int sides = static_cast<int>(rng() % 4);  // 0 both, 1 lower, 2 upper, 3 none
  if (sides == 0 || sides == 1) c.lo = bound();
  if (sides == 0 || sides == 2) c.hi = bound();
  if (c.lo.present && c.hi.present && rng() % 5 != 0 &&
      c.lo.b * Pow10(c.hi.f) > c.hi.b * Pow10(c.lo.f)) {
    std::swap(c.lo.b, c.hi.b);  // mostly non-empty, sometimes empty
    std::swap(c.lo.f, c.hi.f);
  }
  if (sides == 3 || rng() % 5 < 2) {
    static constexpr std::pair<int64_t, int> kMultiples[] = {
        {1, 0}, {2, 0}, {5, 0}, {7, 0}, {100, 0}, {25, 2}, {5, 1}, {1, 2}, {15, 1}, {3, 3},
        {125, 3}, {12, 0}, {1, 1}};
    const auto& [k, g] = kMultiples[rng() % std::size(kMultiples)];
    c.k = k;
    c.g = g;
  }
  return c;
}

TEST(NumberBounds, EveryShortSpellingAgreesWithExactArithmetic) {
  std::mt19937 rng(20261130);
  WalkStats stats;
  int compiled = 0, refused = 0;
  for (int i = 0; i < 120; ++i) {
    const Case c = RandomCase(rng);
    const std::string text = SchemaText(c);
    SCOPED_TRACE(text);
    absl::StatusOr<internal::Grammar> g =
        internal::CompileSchema(nlohmann::ordered_json::parse(text), "schema");
    if (!g.ok()) {
      // Only an empty constraint is refused: nothing the reference takes may exist.
      EXPECT_THAT(g.status(), StatusIs(absl::StatusCode::kInvalidArgument,
                                       HasSubstr("satisfies its minimum / maximum")));
      for (const std::string& s : LongSpellings(c, rng)) ASSERT_FALSE(Valid(c, s)) << s;
      ++refused;
      continue;
    }
    ++compiled;
    const internal::Dfa* dfa = RootDfa(*g);
    ASSERT_NE(dfa, nullptr);
    ASSERT_LE(dfa->states(), internal::kMaxDfaStates);
    // Every state can end or go on (trimmed), and only over the number alphabet.
    for (int32_t st = 0; st < dfa->states(); ++st) {
      bool next = false;
      for (int sym = 0; sym < internal::kRegexSymbols; ++sym) {
        const bool in_alphabet = sym != 0 && std::string_view(kAlphabet).find(static_cast<char>(
                                                 sym)) != std::string_view::npos;
        if (!in_alphabet) {
          ASSERT_LT(dfa->Next(st, sym), 0) << st << " " << sym;
        }
        next = next || dfa->Next(st, sym) >= 0;
      }
      ASSERT_TRUE(dfa->accept[st] || next) << "state " << st;
    }
    std::string s;
    Walk(c, *dfa, s, 0, 5, rng, &stats);
    if (HasFatalFailure()) return;
    for (const std::string& t : LongSpellings(c, rng)) {
      const int32_t st = RunDfa(*dfa, t);
      ASSERT_EQ(st >= 0 && dfa->accept[st] != 0, Valid(c, t)) << "'" << t << "'";
    }
  }
  // The random schemas must exercise both outcomes and accept something.
  EXPECT_GT(compiled, 90);
  EXPECT_GT(refused, 2);
  EXPECT_GT(stats.valid, 10'000);
  EXPECT_GT(stats.completions, 1'000);
}

TEST(NumberBounds, MatcherAgreesAtTopLevelAndInsideArrays) {
  std::mt19937 rng(7);
  for (int i = 0; i < 16; ++i) {
    Case c = RandomCase(rng);
    const std::string text = SchemaText(c);
    SCOPED_TRACE(text);
    auto made = JsonConstraint::FromSchema(text);
    if (!made.ok()) continue;
    auto arr = Schema(absl::StrCat(R"({"type":"array","items":)", text, "}"));
    // Every string of up to 4 bytes, through the matcher: complete exactly when valid; an
    // accepted prefix either ends or takes one more byte of the alphabet.
    std::vector<std::pair<std::string, JsonMatcher>> level = {{"", JsonMatcher(*made)}};
    for (int depth = 0; depth <= 4; ++depth) {
      std::vector<std::pair<std::string, JsonMatcher>> next_level;
      for (auto& [s, m] : level) {
        if (!s.empty()) {
          ASSERT_EQ(m.CanEnd(), Valid(c, s)) << "'" << s << "'";
          ASSERT_EQ(Complete(arr, absl::StrCat("[", s, ",", s, "]")), Valid(c, s)) << s;
        }
        bool more = false;
        for (const char* a = kAlphabet; *a; ++a) {
          JsonMatcher copy = m;
          if (!copy.Accept(std::string_view(a, 1))) continue;
          more = true;
          ASSERT_TRUE(SyntaxAlive(s + *a)) << s + *a;
          if (depth < 4) next_level.emplace_back(s + *a, std::move(copy));
        }
        ASSERT_TRUE(more || m.CanEnd()) << "dead end after '" << s << "'";
        // Other bytes: never an exponent or a sign inside a bounded number.
        for (const char* b : {"e", "E", "+"}) {
          JsonMatcher copy = m;
          EXPECT_FALSE(copy.Accept(b)) << s << b;
        }
      }
      level = std::move(next_level);
    }
  }
}

// A schema and spellings with whether each is a complete value of it.
struct Check {
  const char* schema;
  std::vector<std::pair<const char*, bool>> values;
};

void ExpectValues(std::span<const Check> checks, bool no_exponent) {
  for (const Check& check : checks) {
    SCOPED_TRACE(check.schema);
    auto c = Schema(check.schema);
    ASSERT_NE(c, nullptr);
    for (const auto& [value, ok] : check.values) EXPECT_EQ(Complete(c, value), ok) << value;
    if (no_exponent) {
      EXPECT_FALSE(Complete(c, "1e0"));
      EXPECT_FALSE(Complete(c, "1E-1"));
    }
  }
}

TEST(NumberBounds, HandWrittenEdges) {
  const Check checks[] = {
      {R"({"type":"number","minimum":0.5})",
       {{"0.5", true}, {"0.50", true}, {"0.49999", false}, {"0.4", false}, {"1", true},
        {"-0", false}, {"0", false}, {"9999999999999999999.999", true},
        {"10000000000000000000", false}, {"-0.5", false}}},
      {R"({"type":"number","exclusiveMinimum":0,"maximum":1})",
       {{"0", false}, {"-0.0", false}, {"0.000000000000000000000001", true},
        {"0.0000000000000000000000001", false}, {"1", true}, {"1.0", true},
        {"1.000000000000000000000001", false}, {"0.999999999999999999999999", true}}},
      {R"({"type":"number","maximum":-0.001})",
       {{"-0.001", true}, {"-0.0010", true}, {"-0.0009", false}, {"-0.00100000001", true},
        {"0", false}, {"-0", false}, {"-1", true}, {"-9999999999999999999", true}}},
      {R"({"type":"number","exclusiveMaximum":2.75,"minimum":-2.75})",
       {{"2.75", false}, {"2.7499", true}, {"-2.75", true}, {"-2.7500001", false},
        {"-0", true}, {"0.0", true}, {"2", true}, {"-3", false}}},
      {R"({"type":"number","minimum":-0.0,"maximum":0})",  // lo == hi == 0
       {{"0", true}, {"-0", true}, {"-0.000", true}, {"0.0001", false}, {"-0.0001", false}}},
      {R"({"type":"number","minimum":1.25,"maximum":1.25})",
       {{"1.25", true}, {"1.250000", true}, {"1.2", false}, {"1.251", false}, {"1", false}}},
      // A bound with more than 24 fraction digits: compared exactly.
      {R"({"type":"number","minimum":1e-30})",
       {{"0", false}, {"0.000000000000000000000001", true}, {"0.000000000000000000000000", false},
        {"-0.1", false}}},
      {R"({"type":"number","minimum":0,"exclusiveMaximum":1e-30})",
       {{"0", true}, {"0.000", true}, {"0.000000000000000000000001", false}, {"-0", true}}},
      // The double 0.1 + 0.2 (shortest spelling 0.30000000000000004).
      {R"({"type":"number","maximum":0.30000000000000004})",
       {{"0.3", true}, {"0.30000000000000004", true}, {"0.30000000000000005", false}}},
      {R"({"type":"number","maximum":1e300,"minimum":-1e300})",
       {{"9999999999999999999.5", true}, {"-9999999999999999999", true}}},
      // Integers with fractional bounds round inwards.
      {R"({"type":"integer","minimum":0.5,"exclusiveMaximum":2.75})",
       {{"0", false}, {"1", true}, {"2", true}, {"3", false}, {"1.0", false}}},
      {R"({"type":"integer","maximum":-0.001})",
       {{"0", false}, {"-0", false}, {"-1", true}, {"-1234", true}}},
      // Several bounds on one side: the tighter wins (exclusive at a tie).
      {R"({"type":"number","minimum":1,"exclusiveMinimum":1,"maximum":3,"exclusiveMaximum":2.5})",
       {{"1", false}, {"1.01", true}, {"2.5", false}, {"2.49", true}, {"3", false}}},
      // No type: the bounds make it a number.
      {R"({"minimum":0.1})", {{"0.1", true}, {"0.09", false}, {"\"x\"", false}}},
      {R"({"type":["number","null"],"exclusiveMinimum":0.5})",
       {{"null", true}, {"0.5", false}, {"0.51", true}}},
  };
  ExpectValues(checks, /*no_exponent=*/true);
  // Inside an object, ending lazily at ',' and '}'.
  auto obj = Schema(
      R"({"type":"object","properties":{"p":{"type":"number","exclusiveMinimum":0,"maximum":1},
          "q":{"type":"number","multipleOf":0.01}},"required":["p","q"]})");
  EXPECT_TRUE(Complete(obj, R"({"p":0.25,"q":19.99})"));
  EXPECT_TRUE(Complete(obj, R"({"p": 1.0, "q": -0.5})"));
  EXPECT_FALSE(Complete(obj, R"({"p":0,"q":1})"));
  EXPECT_FALSE(Complete(obj, R"({"p":0.5,"q":1.001})"));
}

// A double spelled without exponent, shortest round trip ("0.1", "9007199254740992").
std::string Fixed(double x) {
  char buf[400];
  const auto r = std::to_chars(buf, buf + sizeof buf, x, std::chars_format::fixed);
  return std::string(buf, r.ptr);
}

// A double's decimal expansion to 40 fraction digits (glibc prints the exact digits).
std::string Expansion(long double x) {
  char buf[512];
  std::snprintf(buf, sizeof buf, "%.40Lf", x);
  return buf;
}

TEST(NumberBounds, ExclusiveBoundsHoldAfterTheDoubleRead) {
  // Clients read numbers as the nearest double: a value beyond an exclusive bound must not read
  // as the bound. The rounding edges (computed in Python's decimal): below 1.0 at
  // 0.999999999999999944488848768742172978…, (1.0's significand is even: the edge reads as 1.0);
  // above 0.1 at 0.100000000000000012490009… (even); below 0.3 at
  // 0.299999999999999961142194138… (odd: the edge reads as the double below 0.3, so is allowed).
  const Check checks[] = {
      {R"({"type":"number","exclusiveMaximum":1})",
       {{"0.99999999999999999999", false}, {"0.99999999999999995", false}, {"1", false},
        {"0.99999999999999994", true}, {"0.999999999999999944488848", true},
        {"0.999999999999999944488849", false}, {"0.9999999999999999", true}, {"-5", true}}},
      {R"({"type":"number","exclusiveMinimum":0.1})",
       {{"0.10000000000000000001", false}, {"0.10000000000000001", false},
        {"0.100000000000000012490009", false}, {"0.10000000000000001249001", true},
        {"0.10000000000000002", true}, {"0.2", true}, {"0.1", false}}},
      {R"({"type":"number","minimum":0.2,"exclusiveMaximum":0.3})",
       {{"0.29999999999999999999", false}, {"0.29999999999999998", false},
        {"0.299999999999999961142195", false}, {"0.299999999999999961142194", true},
        {"0.29999999999999996", true}, {"0.2", true}, {"0.20000000000000000001", true},
        {"0.19999999999999999999", false}}},
      // Integers past 2^53 read rounded too (JavaScript): 9007199254740993 reads as
      // 9007199254740992, for type integer and number alike.
      {R"({"type":"integer","exclusiveMaximum":9007199254740993})",
       {{"9007199254740992", false}, {"9007199254740991", true}, {"9007199254740993", false}}},
      {R"({"type":"integer","exclusiveMinimum":9007199254740992})",
       {{"9007199254740993", false}, {"9007199254740994", true}, {"9007199254740992", false}}},
      {R"({"type":"number","exclusiveMinimum":9007199254740992})",
       {{"9007199254740993", false}, {"9007199254740993.0", false},
        {"9007199254740993.000000000000000000000001", true}, {"9007199254740994", true}}},
      // Where the edge itself is spellable (doubles 2 apart past 2^53) it reads as the neighbour
      // with the even significand: allowed next to 9007199254740994 (odd), not next to
      // 9007199254740996 (even).
      {R"({"type":"integer","exclusiveMaximum":9007199254740994})",
       {{"9007199254740993", true}, {"9007199254740994", false}}},
      {R"({"type":"integer","exclusiveMaximum":9007199254740996})",
       {{"9007199254740995", false}, {"9007199254740994", true}}},
      {R"({"type":"number","exclusiveMinimum":9007199254740994})",
       {{"9007199254740995", true}, {"9007199254740995.0", true}, {"9007199254740994.9", false}}},
      {R"({"type":"number","exclusiveMinimum":9007199254740996})",
       {{"9007199254740997", false}, {"9007199254740997.000000000000000000000001", true}}},
      {R"({"type":"integer","exclusiveMaximum":1000000000000000001})",
       {{"1000000000000000000", false}, {"999999999999999999", false},
        {"999999999999999935", true}}},
      // Inclusive bounds are left as they were (rounding keeps order).
      {R"({"type":"number","maximum":1})",
       {{"0.99999999999999999999", true}, {"1.000000000000000000001", false}}},
      {R"({"type":"number","exclusiveMinimum":0})",
       {{"0.000000000000000000000001", true}, {"0", false}, {"-0", false}}},
  };
  ExpectValues(checks, /*no_exponent=*/true);

  // Random bounds (decimals of 1-17 digits times 10^-20..10^18, integers of up to 19 digits,
  // near 2^53), random sides, inclusive or exclusive; spellings walked through the compiled DFA,
  // steered along the expansions of the bound's double and its neighbours and their midpoints:
  // each accepted spelling, read by strtod, is strictly inside an exclusive bound's double and
  // within an inclusive one's; the walk never dead-ends; and the nearest double inside an
  // exclusive bound (spelled shortest) is still accepted, so the edge costs nothing more.
  std::mt19937 rng(53);
  int walks = 0, near = 0, nearest = 0;
  for (int i = 0; i < 150; ++i) {
    std::string bound_text;  // as the schema spells it
    const int kind = static_cast<int>(rng() % 4);
    if (kind == 0 || kind == 1) {
      std::string digits = std::to_string(1 + rng() % 9);
      for (int d = static_cast<int>(rng() % 17); d > 0; --d) {
        digits += static_cast<char>('0' + rng() % 10);
      }
      const int exp = kind == 0 ? -static_cast<int>(rng() % 21) : static_cast<int>(rng() % 19) - 10;
      bound_text = absl::StrCat(rng() % 4 == 0 ? "-" : "", digits, "e", exp);
    } else if (kind == 2) {
      const uint64_t big = (uint64_t{rng()} << 32 | rng()) % 10'000'000'000'000'000'000ULL;
      bound_text = absl::StrCat(rng() % 4 == 0 ? "-" : "", rng() % 2 ? big : big % 100'000'000);
    } else {
      bound_text = std::to_string(int64_t{9007199254740992} + static_cast<int64_t>(rng() % 9) - 4);
    }
    const bool integer = rng() % 4 == 0;
    const int side = static_cast<int>(rng() % 2);  // 0 lower, 1 upper
    const bool exclusive = rng() % 4 != 0;
    const double b = ToDouble(bound_text);
    const std::string schema =
        absl::StrCat(R"({"type":")", integer ? "integer" : "number", R"(",")",
                     exclusive ? (side ? "exclusiveMaximum" : "exclusiveMinimum")
                               : (side ? "maximum" : "minimum"),
                     R"(":)", bound_text, "}");
    SCOPED_TRACE(schema);
    absl::StatusOr<internal::Grammar> g =
        internal::CompileSchema(nlohmann::ordered_json::parse(schema), "schema");
    if (!g.ok()) {  // only a bound no spelling (< 10^19) can meet
      EXPECT_THAT(g.status(), StatusIs(absl::StatusCode::kInvalidArgument,
                                       HasSubstr("satisfies its minimum / maximum")));
      EXPECT_TRUE(side == 0 ? b >= 9.9e18 : b <= -9.9e18) << b;
      continue;
    }
    const internal::Dfa* dfa = RootDfa(*g);
    ASSERT_NE(dfa, nullptr);
    auto inside = [&](double v) {
      return side == 0 ? (exclusive ? v > b : v >= b) : (exclusive ? v < b : v <= b);
    };
    const double below = std::nextafter(b, -HUGE_VAL), above = std::nextafter(b, HUGE_VAL);
    const long double lb = b;
    const std::string targets[] = {
        Expansion(lb), Expansion(below), Expansion(above),
        Expansion((lb + below) / 2), Expansion((lb + above) / 2), Fixed(b), bound_text};
    for (int w = 0; w < 40; ++w) {
      const std::string& target = targets[rng() % std::size(targets)];
      std::string t;
      int32_t st = 0;
      while (t.size() < 64) {
        std::vector<char> next;
        for (const char* a = kAlphabet; *a; ++a) {
          if (dfa->Next(st, *a) >= 0) next.push_back(*a);
        }
        ASSERT_TRUE(dfa->accept[st] || !next.empty()) << "dead end after '" << t << "'";
        if (next.empty() || (dfa->accept[st] && rng() % 12 == 0)) break;
        const bool on_target = target.compare(0, t.size(), t) == 0 && t.size() < target.size();
        char ch = next[rng() % next.size()];
        if (on_target && rng() % 8 != 0 && dfa->Next(st, target[t.size()]) >= 0) {
          ch = target[t.size()];
        }
        t += ch;
        st = dfa->Next(st, ch);
      }
      if (!dfa->accept[st]) continue;  // (64 bytes without an end: cut, not a dead end)
      ++walks;
      const double v = ToDouble(t);
      ASSERT_TRUE(inside(v)) << "'" << t << "' reads as " << Fixed(v) << ", bound " << Fixed(b);
      near += v == below || v == above || v == b;
    }
    // The nearest double inside an exclusive bound, spelled shortest, is accepted (when it is
    // spellable: fewer than 20 integer digits, at most 24 fraction digits, integral for integers).
    if (exclusive) {
      const double in = side == 0 ? above : below;
      const std::string t = Fixed(in);
      const size_t point = t.find('.');
      const size_t int_digits = (point == std::string::npos ? t.size() : point) - (t[0] == '-');
      const size_t frac = point == std::string::npos ? 0 : t.size() - point - 1;
      if (int_digits <= 19 && frac <= 24 && !(integer && frac > 0) && t != "-0") {
        const int32_t st = RunDfa(*dfa, t);
        EXPECT_TRUE(st >= 0 && dfa->accept[st]) << t;
        ++nearest;
      }
    }
  }
  EXPECT_GT(walks, 3'000);
  EXPECT_GT(near, 200);  // the walks do reach the bound's neighbourhood
  EXPECT_GT(nearest, 40);
}

TEST(NumberBounds, MultipleOfHandWritten) {
  const Check checks[] = {
      {R"({"type":"integer","multipleOf":5})",
       {{"0", true}, {"5", true}, {"-5", true}, {"10", true}, {"1000", true}, {"1", false},
        {"-7", false}, {"-0", false}, {"5.0", false}, {"9999999999999999995", true}}},
      {R"({"type":"integer","multipleOf":7,"minimum":-20,"maximum":20})",
       {{"-14", true}, {"-21", false}, {"14", true}, {"21", false}, {"0", true}, {"8", false}}},
      {R"({"type":"number","multipleOf":0.01})",
       {{"1.23", true}, {"1.230", true}, {"1.234", false}, {"0.1", true}, {"-0.05", true},
        {"7", true}, {"19.99", true}, {"0.001", false}, {"0.0010", false}}},
      {R"({"type":"number","multipleOf":0.25})",
       {{"0.75", true}, {"0.5", true}, {"0.3", false}, {"1.250000", true}, {"-2.25", true},
        {"0.125", false}}},
      {R"({"type":"number","multipleOf":1.5})",
       {{"3", true}, {"4.5", true}, {"1.5", true}, {"2", false}, {"0", true}, {"-4.5", true},
        {"0.75", false}}},
      {R"({"type":"integer","multipleOf":1.5})",  // integers that are multiples of 3
       {{"3", true}, {"6", true}, {"4", false}, {"-9", true}, {"1", false}}},
      // Decimal, not binary: 0.3 is a multiple of 0.1 (0.3 / 0.1 is 2.9999999999999996 in
      // doubles).
      {R"({"type":"number","multipleOf":0.1})",
       {{"0.3", true}, {"0.7", true}, {"0.35", false}, {"12.6", true}}},
      {R"({"type":"number","multipleOf":1e-30})",
       {{"0.000000000000000000000001", true}, {"123.456", true}}},
      {R"({"type":"number","multipleOf":100})",
       {{"200", true}, {"200.00", true}, {"250", false}, {"-100", true}, {"0.0", true}}},
      {R"({"type":"number","exclusiveMinimum":0,"maximum":1,"multipleOf":0.25})",
       {{"0", false}, {"0.25", true}, {"0.5", true}, {"0.75", true}, {"1", true},
        {"1.25", false}, {"0.2", false}}},
      {R"({"multipleOf":0.5})", {{"1.5", true}, {"1.25", false}, {"\"a\"", false}}},
      {R"({"type":["integer","null"],"multipleOf":2})",
       {{"null", true}, {"4", true}, {"3", false}}},
      {R"({"type":["integer","number"],"multipleOf":2})",
       {{"4", true}, {"4.0", true}, {"3", false}, {"4.5", false}}},
  };
  ExpectValues(checks, /*no_exponent=*/true);
}

TEST(NumberBounds, RefusalsNameThePath) {
  const std::pair<const char*, const char*> cases[] = {
      {R"({"type":"number","minimum":1e19})", "schema: no number satisfies"},
      {R"({"type":"number","minimum":0.5,"exclusiveMaximum":0.5})", "schema: no number"},
      {R"({"type":"integer","minimum":2.5,"maximum":2.75})", "schema: no integer satisfies"},
      {R"({"type":"number","minimum":0.1,"maximum":0.2,"multipleOf":0.25})",
       "schema: no number satisfies its minimum / maximum / multipleOf"},
      {R"({"properties":{"a":{"type":"number","multipleOf":0}}})",
       "schema.properties.a.multipleOf: expected a number greater than 0"},
      {R"({"type":"number","multipleOf":-2})", "schema.multipleOf: expected a number greater"},
      {R"({"type":"number","multipleOf":"5"})", "schema.multipleOf: expected a number"},
      {R"({"type":"number","multipleOf":true})", "schema.multipleOf: expected a number"},
      {R"({"type":"number","multipleOf":1e300})", "schema.multipleOf: more than 18 digits"},
      {R"({"type":"integer","multipleOf":12345678901234567890})",
       "schema.multipleOf: more than 18 digits from its first non-zero digit"},
      {R"({"type":"integer","multipleOf":1e18})",  // 1000000000000000000: 19 digits
       "schema.multipleOf: more than 18 digits from its first non-zero digit, written out"},
      {R"({"type":"number","multipleOf":0.3333333333333333})",
       "schema.multipleOf: the number needs more than 4096 DFA states"},
      {R"({"type":"integer","multipleOf":997})",
       "schema.multipleOf: the integer needs more than 4096 DFA states"},
      {R"({"enum":[1,2],"multipleOf":2})", "schema.multipleOf: not supported beside 'enum'"},
      {R"({"type":"number","maximum":"1"})", "schema.maximum: expected a number"},
  };
  test_util::ExpectRefusals(cases);
  // Many costly multipleOf nodes: refused as a whole (budgets per schema), not compiled one by
  // one for minutes into gigabytes: large DFAs (m in 101..200), or long walks to small DFAs (m
  // 1000, each node with its own minimum). Equal constraints share one DFA and count once.
  for (const bool walks : {false, true}) {
    std::string many = R"({"type":"object","properties":{)";
    for (int i = 0; i < 1000; ++i) {
      absl::StrAppend(&many, i ? "," : "", "\"p", i, R"(":{"type":"integer","multipleOf":)",
                      walks ? absl::StrCat(1000, ",\"minimum\":", -i) : absl::StrCat(101 + i % 100),
                      "}");
    }
    many += "}}";
    EXPECT_THAT(JsonConstraint::FromSchema(many).status(),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         HasSubstr("constraints need more than 524288 automaton states or 65536 "
                                   "DFA states in all")))
        << walks;
  }
  std::string same = R"({"type":"object","properties":{)";
  for (int i = 0; i < 1000; ++i) {
    absl::StrAppend(&same, i ? "," : "", "\"p", i, R"(":{"type":"integer","multipleOf":199})");
  }
  EXPECT_NE(Schema(same + "}}"), nullptr);
  // Many distinct cheap bounds fit.
  std::string bounds = R"({"type":"object","properties":{)";
  for (int i = 0; i < 500; ++i) {
    absl::StrAppend(&bounds, i ? "," : "", "\"p", i, R"(":{"type":"number","minimum":)", i,
                    ".5}");
  }
  EXPECT_NE(Schema(bounds + "}}"), nullptr);
}

}  // namespace
}  // namespace coli::grammar
