// JSON schema -> Grammar (grammar.h). Supported keywords and the rules for the
// rest are listed in docs/status/grammar.md; anything that would change what is
// valid and is not supported is refused with INVALID_ARGUMENT naming its path.
#include <algorithm>
#include <array>
#include <bit>
#include <charconv>
#include <cmath>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <string_view>
#include <unordered_map>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/grammar/grammar.h"
#include "common/io/cat.h"
#include "common/json/json.h"
#include "common/status/status.h"

namespace coli::grammar::internal {
using ::coli::internal_cat::Cat;
namespace {

using Json = nlohmann::ordered_json;

// Keywords that never change what is valid.
const std::set<std::string, std::less<>> kAnnotations = {
    "$schema",  "$id",        "$comment", "title",     "description", "default",
    "examples", "deprecated", "readOnly", "writeOnly", "$defs",       "definitions"};
// Keywords compiled below.
const std::set<std::string, std::less<>> kSupported = {"type",
                                                       "enum",
                                                       "const",
                                                       "properties",
                                                       "required",
                                                       "additionalProperties",
                                                       "items",
                                                       "prefixItems",
                                                       "minItems",
                                                       "maxItems",
                                                       "minLength",
                                                       "maxLength",
                                                       "anyOf",
                                                       "oneOf",
                                                       "allOf",
                                                       "$ref",
                                                       "pattern",
                                                       "format",
                                                       "minimum",
                                                       "maximum",
                                                       "exclusiveMinimum",
                                                       "exclusiveMaximum",
                                                       "multipleOf"};
const std::set<std::string, std::less<>> kObjectWords = {"properties", "required",
                                                         "additionalProperties"};
const std::set<std::string, std::less<>> kArrayWords = {"items", "prefixItems", "minItems",
                                                        "maxItems"};
const std::set<std::string, std::less<>> kStringWords = {"minLength", "maxLength", "pattern"};
const std::set<std::string, std::less<>> kNumberWords = {"minimum", "maximum", "exclusiveMinimum",
                                                         "exclusiveMaximum", "multipleOf"};

// path + "." + key; keys that are not identifiers ($ and - allowed) are quoted
// like json::JoinKey does: schema.properties["a b"].
std::string Join(std::string_view path, std::string_view key) {
  bool plain = !key.empty() && !(key[0] >= '0' && key[0] <= '9');
  for (char c : key) {
    plain = plain && ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                      c == '_' || c == '$' || c == '-');
  }
  return plain ? Cat(path, ".", key) : json::JoinKey(path, key);
}

absl::Status Error(std::string_view path, std::string_view what) {
  return absl::InvalidArgumentError(Cat(path, ": ", what));
}

std::string_view JsonType(const Json& v) {
  if (v.is_object()) return "object";
  if (v.is_array()) return "array";
  if (v.is_string()) return "string";
  if (v.is_boolean()) return "boolean";
  if (v.is_null()) return "null";
  if (v.is_number_integer()) return "integer";
  return "number";
}

// Whether a JSON value is an instance of a JSON schema type name.
bool HasType(const Json& v, std::string_view type) {
  if (type == "number") return v.is_number();
  if (type == "integer") return v.is_number_integer();
  return JsonType(v) == type;
}

absl::StatusOr<int64_t> NonNegative(const Json& s, std::string_view key, std::string_view path,
                                    int64_t fallback) {
  auto it = s.find(std::string(key));
  if (it == s.end()) return fallback;
  const std::string at = Join(path, key);
  if (it->is_number_float()) {
    const double d = it->get<double>();
    if (d >= static_cast<double>(kUnbounded)) return kUnbounded;  // (no cast of huge doubles)
    if (d >= 0 && d == static_cast<double>(static_cast<int64_t>(d))) {
      return static_cast<int64_t>(d);
    }
    return Error(at, "expected a non-negative integer");
  }
  if (it->is_number_unsigned()) {
    return std::min<uint64_t>(it->get<uint64_t>(), static_cast<uint64_t>(kUnbounded));
  }
  if (it->is_number_integer() && it->get<int64_t>() >= 0) return it->get<int64_t>();
  return Error(at, "expected a non-negative integer");
}

// ---- numbers: bounds and multipleOf as one minimal DFA --------------------------------------
//
// A bounded (or multipleOf) number or integer is spelled "-"? int ("." frac)? with no exponent,
// an integer part of at most kBoundedIntDigits digits (no leading zeros) and at most
// kMaxFracDigits fraction digits. Its DFA is built from an automaton that reads such a spelling
// digit by digit and compares it EXACTLY with each bound's decimal expansion (integer parts by
// length then digits, fraction parts digit by digit with zeros padding the shorter) and keeps the
// value's digits modulo m for multipleOf m * 10^-d. A depth-first walk of that automaton interns
// each state by (accepting, successors), bottom-up: the automaton is acyclic (spellings are
// bounded), so this yields the minimal trimmed DFA at once — a state exists only when some
// accepted spelling can still follow, so every prefix the matcher takes can complete.

// Digits of an integer part a bounded / multipleOf number may have: |value| < 10^19.
constexpr int kBoundedIntDigits = 19;
// Automaton states walked before minimisation; past this the schema is refused (a huge m).
constexpr size_t kMaxNumberStates = size_t{1} << 17;
// The same for all number nodes of one schema together, and their DFAs' states in all (each
// state is a 516-byte row): a schema of many costly multipleOf nodes is refused in well under a
// second, holding at most ~34 MB of number DFAs, instead of compiling for minutes into
// gigabytes; ~900 distinct bounded numbers (~70 states each) still fit. Nodes with equal
// constraints share one DFA and count once.
constexpr size_t kMaxNumberStatesPerSchema = size_t{1} << 19;
constexpr size_t kMaxNumberDfaStatesPerSchema = 16 * kMaxDfaStates;
// The states of one schema's `pattern` / `format` DFAs together (each state a 516-byte row):
// a schema of many costly patterns (a client's; `^[ab]*a[ab]{10}` alone needs 2,048 states and
// ~30 ms) is refused by name instead of compiling for minutes into gigabytes; equal patterns
// share one DFA and count once.
constexpr size_t kMaxPatternDfaStatesPerSchema = 16 * kMaxDfaStates;
// multipleOf's digits from its first non-zero one, written out without exponent (trailing
// zeros of the integer part count: 1e18 has 19): m < 10^18, so 10 * remainder + 9 fits in 64 bits.
constexpr size_t kMaxMultipleDigits = 18;

// An exact decimal: "-"? ip ("." fp)?, ip without leading zeros ("0" for zero), fp without
// trailing zeros; zero is never negative.
struct Decimal {
  bool neg = false;
  std::string ip = "0", fp;
  bool zero() const { return ip == "0" && fp.empty(); }
};

// Parses "-"? digits ("." digits)? ([eE] [+-]? digits)? — integer text or std::to_chars' output.
std::optional<Decimal> ParseDecimal(std::string_view t) {
  size_t i = 0;
  const bool neg = i < t.size() && t[i] == '-';
  if (neg) ++i;
  std::string digits;
  int64_t point = -1;
  for (; i < t.size() && ((t[i] >= '0' && t[i] <= '9') || t[i] == '.'); ++i) {
    if (t[i] == '.') {
      if (point >= 0) return std::nullopt;
      point = static_cast<int64_t>(digits.size());
    } else {
      digits += t[i];
    }
  }
  if (digits.empty()) return std::nullopt;
  if (point < 0) point = static_cast<int64_t>(digits.size());
  if (i < t.size() && (t[i] == 'e' || t[i] == 'E')) {
    ++i;
    const bool exp_neg = i < t.size() && t[i] == '-';
    if (i < t.size() && (t[i] == '-' || t[i] == '+')) ++i;
    int64_t e = 0;
    const size_t start = i;
    for (; i < t.size() && t[i] >= '0' && t[i] <= '9'; ++i) {
      e = std::min<int64_t>(e * 10 + (t[i] - '0'), 100'000);
    }
    if (i == start || e > 1000) return std::nullopt;  // (doubles stay within 10^+-330)
    point += exp_neg ? -e : e;
  }
  if (i != t.size()) return std::nullopt;
  Decimal d;
  const int64_t n = static_cast<int64_t>(digits.size());
  if (point <= 0) {
    d.ip = "0";
    d.fp = std::string(static_cast<size_t>(-point), '0') + digits;
  } else if (point >= n) {
    d.ip = digits + std::string(static_cast<size_t>(point - n), '0');
  } else {
    d.ip = digits.substr(0, static_cast<size_t>(point));
    d.fp = digits.substr(static_cast<size_t>(point));
  }
  d.ip.erase(0, std::min(d.ip.find_first_not_of('0'), d.ip.size() - 1));
  d.fp.erase(d.fp.find_last_not_of('0') + 1);
  d.neg = neg && !d.zero();
  return d;
}

// The exact decimal of a JSON number: integers as written, a double as its shortest round-trip
// spelling (std::to_chars; "0.1" for 0.1 — nlohmann keeps no source text, and this is the
// spelling the schema's author almost always wrote).
absl::StatusOr<Decimal> ToDecimal(const Json& v, const std::string& at) {
  std::string text;
  if (v.is_number_unsigned()) {
    text = std::to_string(v.get<uint64_t>());
  } else if (v.is_number_integer()) {
    text = std::to_string(v.get<int64_t>());
  } else if (v.is_number_float()) {
    const double d = v.get<double>();
    if (!std::isfinite(d)) return Error(at, "expected a finite number");
    char buf[64];
    const auto r = std::to_chars(buf, buf + sizeof buf, d);
    if (r.ec != std::errc()) return Error(at, "expected a finite number");
    text.assign(buf, r.ptr);
  } else {
    return Error(at, "expected a number");
  }
  std::optional<Decimal> d = ParseDecimal(text);
  if (!d) return Error(at, Cat("cannot read '", text, "' as a decimal"));
  return *std::move(d);
}

// The exact decimal of n * 2^k (string arithmetic: doubling, or halving with one more fraction
// digit when odd). |k| <= 1100 and n < 2^56 here, so at most ~800 digits.
Decimal BinaryToDecimal(uint64_t n, int k) {
  std::string digits = std::to_string(n);  // value = digits / 10^frac
  size_t frac = 0;
  for (; k > 0; --k) {  // * 2
    int carry = 0;
    for (size_t i = digits.size(); i-- > 0;) {
      const int v = (digits[i] - '0') * 2 + carry;
      digits[i] = static_cast<char>('0' + v % 10);
      carry = v / 10;
    }
    if (carry) digits.insert(digits.begin(), static_cast<char>('0' + carry));
  }
  for (; k < 0; ++k) {  // / 2
    if ((digits.back() - '0') % 2) {
      digits += '0';
      ++frac;
    }
    int rest = 0;
    for (char& c : digits) {
      const int v = rest * 10 + (c - '0');
      c = static_cast<char>('0' + v / 2);
      rest = v % 2;
    }
    digits.erase(0, std::min(digits.find_first_not_of('0'), digits.size() - 1));
  }
  if (digits.size() <= frac) digits.insert(0, frac + 1 - digits.size(), '0');
  Decimal d;
  d.ip = digits.substr(0, digits.size() - frac);
  d.fp = digits.substr(digits.size() - frac);
  d.ip.erase(0, std::min(d.ip.find_first_not_of('0'), d.ip.size() - 1));
  d.fp.erase(d.fp.find_last_not_of('0') + 1);
  return d;
}

// The exact midpoint of two adjacent finite doubles (not both zero).
Decimal Midpoint(double a, double b) {
  const bool neg = a < 0 || b < 0;
  // |x| = mantissa * 2^exp with a 53-bit integer mantissa (0 for zero).
  auto split = [](double x, uint64_t* mantissa, int* exp) {
    x = std::fabs(x);
    int e = 0;
    const double f = std::frexp(x, &e);  // x = f * 2^e, f in [0.5, 1)
    *mantissa = static_cast<uint64_t>(std::ldexp(f, 53));
    *exp = e - 53;
  };
  uint64_t ma, mb;
  int ea, eb;
  split(a, &ma, &ea);
  split(b, &mb, &eb);
  if (ma == 0) ea = eb;
  if (mb == 0) eb = ea;
  const int e = std::min(ea, eb);  // adjacent doubles: exponents differ by at most 1
  Decimal d = BinaryToDecimal((ma << (ea - e)) + (mb << (eb - e)), e - 1);
  d.neg = neg && !d.zero();
  return d;
}

// An exclusive bound as clients read it. JSON parsers (JSON.parse, json.loads, nlohmann, K3's
// chat parser) read a number as the nearest double, so a value beyond an exclusive bound may
// still read as the bound's own double (`0.99999999999999999999` is 1.0). The values that read
// as the bound's double B are those within B's rounding interval; on the bound's side that
// interval ends at the midpoint between B and its neighbour, which reads as whichever of the two
// has an even significand. So the bound becomes that midpoint: exclusive when B's significand is
// even (the midpoint reads as B), inclusive when odd (it reads as the neighbour). The midpoint
// lies between the exact bound and its neighbour (the bound reads as B), so it is the tighter
// of the two. Integer bounds are read exactly by nlohmann but not by JavaScript: the same rule
// (B = the nearest double) covers them, for type number and integer alike. `side`: 0 lower.
Decimal ExclusiveEdge(const Decimal& exact, double bound, int side, bool* exclusive) {
  const double next = std::nextafter(bound, side == 0 ? HUGE_VAL : -HUGE_VAL);
  // Beyond the largest double: no spelled value (< 10^19) comes near, the exact bound decides.
  if (!std::isfinite(next)) return exact;
  *exclusive = (std::bit_cast<uint64_t>(bound) & 1) == 0;
  return Midpoint(bound, next);
}

// -1, 0, 1 as |a| <, =, > |b|.
int CompareMagnitude(const Decimal& a, const Decimal& b) {
  if (a.ip.size() != b.ip.size()) return a.ip.size() < b.ip.size() ? -1 : 1;
  if (const int c = a.ip.compare(b.ip); c != 0) return c < 0 ? -1 : 1;
  for (size_t i = 0; i < std::max(a.fp.size(), b.fp.size()); ++i) {
    const char x = i < a.fp.size() ? a.fp[i] : '0', y = i < b.fp.size() ? b.fp[i] : '0';
    if (x != y) return x < y ? -1 : 1;
  }
  return 0;
}

int Compare(const Decimal& a, const Decimal& b) {
  if (a.neg != b.neg) return a.neg ? -1 : 1;
  return a.neg ? -CompareMagnitude(a, b) : CompareMagnitude(a, b);
}

// What a number node may spell: bounds (absent: none on that side) and value = t * m * 10^-d
// for an integer t (multipleOf).
struct NumberSpec {
  bool integer = false;
  std::optional<Decimal> bound[2];  // [0] lower, [1] upper
  bool exclusive[2] = {false, false};
  uint64_t m = 1;
  size_t d = kMaxFracDigits;    // (no multipleOf: m = 1, every fraction digit free)
  std::vector<uint64_t> pow10;  // pow10[t] = 10^t mod m, t in [0, d]
};

class NumberAutomaton {
 public:
  // `limit`: automaton states the walk may visit (at most kMaxNumberStates).
  NumberAutomaton(const NumberSpec& spec, size_t limit) : spec_(spec), limit_(limit) {}
  size_t visited() const { return memo_.size(); }
  bool walk_cut() const { return overflow_; }

  // The minimal trimmed DFA; NOT_FOUND when no spelling is accepted, RESOURCE_EXHAUSTED when it
  // needs more than kMaxDfaStates states (or the walk more than kMaxNumberStates).
  absl::StatusOr<Dfa> Build() {
    const int32_t root = Visit(State{});
    if (overflow_ || rows_.size() > static_cast<size_t>(kMaxDfaStates)) {
      return absl::ResourceExhaustedError(Cat("more than ", kMaxDfaStates, " DFA states"));
    }
    if (root < 0) return absl::NotFoundError("empty");
    // Renumber breadth-first from the root (the machine starts in state 0).
    std::vector<int32_t> order{root}, id(rows_.size(), -1);
    id[root] = 0;
    for (size_t i = 0; i < order.size(); ++i) {
      for (int sym = 0; sym < kSymbols; ++sym) {
        const int32_t to = rows_[order[i]][sym];
        if (to >= 0 && id[to] < 0) {
          id[to] = static_cast<int32_t>(order.size());
          order.push_back(to);
        }
      }
    }
    Dfa dfa;
    const size_t n = order.size();
    dfa.next.assign(n * kRegexSymbols, -1);
    dfa.accept.resize(n);
    dfa.dist.resize(n);
    for (size_t i = 0; i < n; ++i) {
      const Row& row = rows_[order[i]];
      for (int sym = 0; sym < kSymbols; ++sym) {
        if (row[sym] >= 0) dfa.next[i * kRegexSymbols + kSymbolChar[sym]] = id[row[sym]];
      }
      dfa.accept[i] = static_cast<uint8_t>(row[kSymbols]);
      dfa.dist[i] = dist_[order[i]];
    }
    return dfa;
  }

 private:
  static constexpr int kSymbols = 12;  // '0'-'9', '-', '.'
  static constexpr char kSymbolChar[kSymbols] = {'0', '1', '2', '3', '4', '5',
                                                 '6', '7', '8', '9', '-', '.'};
  enum Phase : uint8_t { kStart, kMinus, kInt, kZero, kDot, kFrac };
  // Per bound, while reading the integer part: the digits so far against the bound's first
  // digits (kEq / kLess / kMore), or kLonger once there are more digits than the bound's
  // integer part has. From the '.' on: |value| so far against |bound| (kEq: equal so far).
  enum Cmp : uint8_t { kEq, kLess, kMore, kLonger };
  struct State {
    uint8_t phase = kStart, neg = 0, nonzero = 0, count = 0;  // count: int or fraction digits
    uint8_t cmp[2] = {kEq, kEq};
    uint64_t rem = 0;  // the digits read (fraction digits up to d) modulo m
    uint64_t Bits() const {
      return phase | neg << 3 | nonzero << 4 | uint64_t{count} << 5 | uint64_t{cmp[0]} << 10 |
             uint64_t{cmp[1]} << 12;
    }
  };
  using Row = std::array<int32_t, kSymbols + 1>;  // successors, then accepting
  struct KeyHash {
    size_t operator()(const std::pair<uint64_t, uint64_t>& k) const {
      return std::hash<uint64_t>()(k.first * 0x9E3779B97F4A7C15ULL ^ k.second);
    }
  };
  struct RowHash {
    size_t operator()(const Row& r) const {
      uint64_t h = 0;
      for (int32_t v : r) h = (h ^ static_cast<uint32_t>(v)) * 0x100000001B3ULL;
      return std::hash<uint64_t>()(h);
    }
  };

  const Decimal* bound(int side) const { return spec_.bound[side] ? &*spec_.bound[side] : nullptr; }
  bool bounded() const { return bound(0) != nullptr || bound(1) != nullptr; }

  // The integer part against a bound's once the integer part has ended.
  static uint8_t ResolveInt(uint8_t cmp, size_t count, const Decimal& b) {
    if (cmp == kLonger) return kMore;
    if (count < b.ip.size()) return kLess;
    return cmp;
  }

  // |value| against |bound| for a spelling that ends in state s.
  uint8_t FinalMagnitude(const State& s, const Decimal& b, int side) const {
    if (s.phase == kFrac) {
      return s.cmp[side] == kEq && s.count < b.fp.size() ? uint8_t{kLess} : s.cmp[side];
    }
    const uint8_t c = ResolveInt(s.cmp[side], s.count, b);
    return c == kEq && !b.fp.empty() ? uint8_t{kLess} : c;
  }

  bool Accepting(const State& s) const {
    if (s.phase != kInt && s.phase != kZero && s.phase != kFrac) return false;
    for (int side = 0; side < 2; ++side) {
      const Decimal* b = bound(side);
      if (b == nullptr) continue;
      // value against bound, signs included (-0 is 0).
      int c;
      if (!s.nonzero) {
        c = b->zero() ? 0 : (b->neg ? 1 : -1);
      } else if (!s.neg) {
        c = b->neg || b->zero() ? 1 : 0;
      } else {
        c = !b->neg ? -1 : 0;
      }
      if (c == 0 && s.nonzero) {
        const uint8_t mag = FinalMagnitude(s, *b, side);
        c = mag == kEq ? 0 : (mag == kLess ? -1 : 1);
        if (s.neg) c = -c;
      }
      const bool ok = side == 0 ? (c > 0 || (c == 0 && !spec_.exclusive[0]))
                                : (c < 0 || (c == 0 && !spec_.exclusive[1]));
      if (!ok) return false;
    }
    // value * 10^d = digits * 10^(d - j) must be a multiple of m (j: fraction digits kept).
    const size_t j = s.phase == kFrac ? std::min<size_t>(s.count, spec_.d) : 0;
    return static_cast<unsigned __int128>(s.rem) * spec_.pow10[spec_.d - j] % spec_.m == 0;
  }

  // One symbol; nullopt when the spelling rules refuse it (bounds and multipleOf are judged by
  // liveness, except a non-zero fraction digit past d, which no multiple has).
  std::optional<State> Step(State s, int sym) const {
    const char c = kSymbolChar[sym];
    const bool digit = c >= '0' && c <= '9';
    const int v = c - '0';
    switch (s.phase) {
      case kStart:
        if (c == '-') {
          s.phase = kMinus;
          s.neg = 1;
          return s;
        }
        [[fallthrough]];
      case kMinus:
        if (!digit || (v == 0 && spec_.integer && s.neg)) return std::nullopt;  // no "-0"
        s.phase = v == 0 ? kZero : kInt;
        if (!bounded()) s.neg = 0;  // the sign only matters against bounds
        return IntDigit(s, v);
      case kInt:
        if (digit) {
          if (s.count >= kBoundedIntDigits) return std::nullopt;
          return IntDigit(s, v);
        }
        [[fallthrough]];
      case kZero:
        if (c != '.' || spec_.integer) return std::nullopt;
        for (int side = 0; side < 2; ++side) {
          if (bound(side) != nullptr) s.cmp[side] = ResolveInt(s.cmp[side], s.count, *bound(side));
        }
        s.phase = kDot;
        s.count = 0;
        return s;
      case kDot:
      case kFrac:
        if (!digit || s.count >= kMaxFracDigits) return std::nullopt;
        if (s.count < spec_.d) {
          s.rem = (s.rem * 10 + static_cast<uint64_t>(v)) % spec_.m;
        } else if (v != 0) {
          return std::nullopt;  // a multiple of m * 10^-d has no non-zero digit past the d-th
        }
        for (int side = 0; side < 2; ++side) {
          const Decimal* b = bound(side);
          if (b == nullptr || s.cmp[side] != kEq) continue;
          const char bc = s.count < b->fp.size() ? b->fp[s.count] : '0';
          if (c != bc) s.cmp[side] = c < bc ? kLess : kMore;
        }
        s.phase = kFrac;
        ++s.count;
        if (v != 0 && bounded()) s.nonzero = 1;
        return s;
    }
    return std::nullopt;
  }

  State IntDigit(State s, int v) const {
    for (int side = 0; side < 2; ++side) {
      const Decimal* b = bound(side);
      if (b == nullptr || s.cmp[side] == kLonger) continue;
      if (s.count == b->ip.size()) {
        s.cmp[side] = kLonger;
      } else if (s.cmp[side] == kEq) {
        const char bc = b->ip[s.count];
        const char c = static_cast<char>('0' + v);
        if (c != bc) s.cmp[side] = c < bc ? kLess : kMore;
      }
    }
    s.rem = (s.rem * 10 + static_cast<uint64_t>(v)) % spec_.m;
    ++s.count;
    if (v != 0 && bounded()) s.nonzero = 1;
    return s;
  }

  // The minimal DFA state of s (-1: no accepted spelling continues from it).
  int32_t Visit(const State& s) {
    const std::pair<uint64_t, uint64_t> key(s.Bits(), s.rem);
    if (auto it = memo_.find(key); it != memo_.end()) return it->second;
    if (overflow_ || memo_.size() >= limit_) {
      overflow_ = true;
      return -1;
    }
    Row row;
    row[kSymbols] = Accepting(s) ? 1 : 0;
    bool live = row[kSymbols] != 0;
    int32_t dist = live ? 0 : std::numeric_limits<int32_t>::max();
    for (int sym = 0; sym < kSymbols; ++sym) {
      const std::optional<State> next = Step(s, sym);
      row[sym] = next ? Visit(*next) : -1;
      if (row[sym] >= 0) {
        live = true;
        dist = std::min(dist, dist_[row[sym]] + 1);
      }
    }
    int32_t id = -1;
    if (live && !overflow_) {
      auto [it, fresh] = classes_.emplace(row, static_cast<int32_t>(rows_.size()));
      if (fresh) {
        rows_.push_back(row);
        dist_.push_back(dist);
      }
      id = it->second;
    }
    memo_.emplace(key, id);
    return id;
  }

  const NumberSpec& spec_;
  const size_t limit_;
  std::unordered_map<std::pair<uint64_t, uint64_t>, int32_t, KeyHash> memo_;
  std::unordered_map<Row, int32_t, RowHash> classes_;
  std::vector<Row> rows_;
  std::vector<int32_t> dist_;
  bool overflow_ = false;
};

class Compiler {
 public:
  Compiler(const Json& root, std::string root_path)
      : root_(root), root_path_(std::move(root_path)), g_(BuiltinGrammar()) {}

  absl::StatusOr<Grammar> Run() {
    COLI_ASSIGN_OR_RETURN(g_.root, Compile(root_, root_path_));
    COLI_RETURN_IF_ERROR(CheckCycles());
    return std::move(g_);
  }

 private:
  int32_t AddNode(Node n) {
    g_.nodes.push_back(std::move(n));
    return static_cast<int32_t>(g_.nodes.size() - 1);
  }
  static std::string Dump(const Json& v) {
    return v.dump(-1, ' ', false, Json::error_handler_t::strict);
  }

  absl::StatusOr<int32_t> Compile(const Json& s, const std::string& path) {
    if (s.is_boolean()) {
      if (s.get<bool>()) return kAnyValue;
      return Error(path, "the schema false (no valid value) is not supported here");
    }
    if (!s.is_object()) {
      return Error(path, Cat("expected a schema (object or boolean), got ", JsonType(s)));
    }
    std::vector<std::string> constraints;  // supported keywords present, in document order
    for (auto it = s.begin(); it != s.end(); ++it) {
      const std::string& key = it.key();
      if (kAnnotations.contains(key) || key.rfind("x-", 0) == 0) continue;
      if (!kSupported.contains(key)) return Error(Join(path, key), "not supported");
      constraints.push_back(key);
    }
    auto only = [&](std::string_view word) -> absl::Status {
      for (const std::string& k : constraints) {
        if (k != word) {
          return Error(Join(path, k), Cat("not supported beside '", word, "'"));
        }
      }
      return absl::OkStatus();
    };

    if (s.contains("$ref")) {
      COLI_RETURN_IF_ERROR(only("$ref"));
      const std::string at = Join(path, "$ref");
      if (!s["$ref"].is_string()) return Error(at, "expected a string");
      return Ref(s["$ref"].get<std::string>(), at);
    }
    if (s.contains("allOf")) {
      COLI_RETURN_IF_ERROR(only("allOf"));
      const std::string at = Join(path, "allOf");
      const Json& all = s["allOf"];
      if (!all.is_array() || all.size() != 1) {
        return Error(at, "only allOf with a single member is supported");
      }
      return Compile(all[0], json::JoinIndex(at, 0));
    }
    for (const char* word : {"anyOf", "oneOf"}) {
      if (!s.contains(word)) continue;
      COLI_RETURN_IF_ERROR(only(word));
      const std::string at = Join(path, word);
      const Json& alts = s[word];
      if (!alts.is_array() || alts.empty()) return Error(at, "expected a non-empty array");
      Node n;
      n.kind = Kind::kAnyOf;
      for (size_t i = 0; i < alts.size(); ++i) {
        COLI_ASSIGN_OR_RETURN(int32_t alt, Compile(alts[i], json::JoinIndex(at, i)));
        n.alts.push_back(alt);
      }
      return AddNode(std::move(n));
    }

    // The types this schema allows (empty: any).
    std::vector<std::string> types;
    if (s.contains("type")) {
      const Json& t = s["type"];
      const std::string at = Join(path, "type");
      std::vector<Json> names =
          t.is_array() ? std::vector<Json>(t.begin(), t.end()) : std::vector<Json>{t};
      if (names.empty()) return Error(at, "expected a type name or a non-empty array of them");
      for (size_t i = 0; i < names.size(); ++i) {
        static const std::set<std::string, std::less<>> kTypes = {
            "string", "number", "integer", "boolean", "null", "object", "array"};
        const std::string name_at = t.is_array() ? json::JoinIndex(at, i) : at;
        if (!names[i].is_string() || !kTypes.contains(names[i].get<std::string>())) {
          return Error(name_at, Cat("unknown type ", names[i].dump()));
        }
        if (std::find(types.begin(), types.end(), names[i].get<std::string>()) == types.end()) {
          types.push_back(names[i].get<std::string>());
        }
      }
    }

    if (s.contains("enum") || s.contains("const")) {
      if (s.contains("enum") && s.contains("const")) {
        return Error(Join(path, "const"), "not supported beside 'enum'");
      }
      // The members are the whole set of values: other constraints would have to filter them.
      for (const std::string& k : constraints) {
        if (k != "enum" && k != "const" && k != "type") {
          return Error(Join(path, k),
                       Cat("not supported beside '", s.contains("enum") ? "enum" : "const", "'"));
        }
      }
      const bool is_enum = s.contains("enum");
      const std::string at = Join(path, is_enum ? "enum" : "const");
      std::vector<Json> members;
      if (is_enum) {
        if (!s["enum"].is_array() || s["enum"].empty()) {
          return Error(at, "expected a non-empty array");
        }
        members.assign(s["enum"].begin(), s["enum"].end());
      } else {
        members.push_back(s["const"]);
      }
      Node n;
      n.kind = Kind::kLiterals;
      std::vector<std::string> texts;
      for (const Json& m : members) {
        bool typed = types.empty();
        for (const std::string& t : types) typed = typed || HasType(m, t);
        if (typed) texts.push_back(Dump(m));
      }
      if (texts.empty()) return Error(at, "no member has the schema's type");
      std::sort(texts.begin(), texts.end());
      texts.erase(std::unique(texts.begin(), texts.end()), texts.end());
      n.lit_begin = static_cast<int32_t>(g_.literals.size());
      for (std::string& t : texts) g_.literals.push_back(std::move(t));
      n.lit_end = static_cast<int32_t>(g_.literals.size());
      return AddNode(std::move(n));
    }

    if (types.empty()) {
      for (const std::string& k : constraints) {
        auto add = [&types](const char* t) {
          if (std::find(types.begin(), types.end(), t) == types.end()) types.push_back(t);
        };
        if (kObjectWords.contains(k)) add("object");
        if (kArrayWords.contains(k)) add("array");
        if (kStringWords.contains(k)) add("string");
        if (kNumberWords.contains(k)) add("number");
      }
      if (types.empty()) return kAnyValue;
    }
    const bool has_number = std::find(types.begin(), types.end(), "number") != types.end();
    std::vector<int32_t> alts;
    for (const std::string& t : types) {
      if (t == "object") {
        COLI_ASSIGN_OR_RETURN(int32_t n, CompileObject(s, path));
        alts.push_back(n);
      } else if (t == "array") {
        COLI_ASSIGN_OR_RETURN(int32_t n, CompileArray(s, path));
        alts.push_back(n);
      } else if (t == "string") {
        Node n;
        n.kind = Kind::kString;
        COLI_ASSIGN_OR_RETURN(n.min_len, NonNegative(s, "minLength", path, 0));
        COLI_ASSIGN_OR_RETURN(n.max_len, NonNegative(s, "maxLength", path, kUnbounded));
        if (n.min_len > n.max_len) {
          return Error(Join(path, "minLength"), "greater than maxLength");
        }
        COLI_ASSIGN_OR_RETURN(n.dfa, StringPattern(s, path));
        if (n.dfa >= 0) {
          // maxLength is exact with a pattern (the DFA's shortest completions), minLength is not.
          if (n.min_len > 0) {
            return Error(Join(path, "minLength"), "not supported beside 'pattern' / 'format'");
          }
          if (s.contains("format") && s["format"] == "hostname") {
            n.max_len = std::min<int64_t>(n.max_len, 253);  // RFC 1123: the whole name
          }
          if (n.max_len != kUnbounded && g_.dfas[n.dfa].dist[0] > n.max_len) {
            return Error(Join(path, "maxLength"), "shorter than any string the pattern matches");
          }
        }
        alts.push_back(n.min_len == 0 && n.max_len == kUnbounded && n.dfa < 0
                           ? int32_t{kAnyString}
                           : AddNode(std::move(n)));
      } else if (t == "number") {
        const bool bounded = std::any_of(kNumberWords.begin(), kNumberWords.end(),
                                         [&s](const std::string& w) { return s.contains(w); });
        if (!bounded) {
          alts.push_back(kAnyNumber);
          continue;
        }
        // Exact bounds and multipleOf (see docs/status/grammar.md).
        COLI_ASSIGN_OR_RETURN(int32_t n, BoundedNumber(s, path, /*integer=*/false));
        alts.push_back(n);
      } else if (t == "integer") {
        if (has_number) continue;  // numbers include the integers
        COLI_ASSIGN_OR_RETURN(int32_t n, BoundedNumber(s, path, /*integer=*/true));
        alts.push_back(n);
      } else if (t == "boolean") {
        alts.push_back(kBoolNode);
      } else {
        alts.push_back(kNullNode);
      }
    }
    if (alts.size() == 1) return alts[0];
    Node n;
    n.kind = Kind::kAnyOf;
    n.alts = std::move(alts);
    return AddNode(std::move(n));
  }

  // The DFA of the schema's `pattern` or known `format` (index into g_.dfas), -1 when neither.
  // Unknown formats are annotations (what validators do by default).
  absl::StatusOr<int32_t> StringPattern(const Json& s, const std::string& path) {
    std::string pattern, at;
    if (s.contains("format")) {
      at = Join(path, "format");
      if (!s["format"].is_string()) return Error(at, "expected a string");
      pattern = std::string(FormatPattern(s["format"].get<std::string>()));
    }
    if (s.contains("pattern")) {
      if (!pattern.empty()) return Error(Join(path, "pattern"), "not supported beside 'format'");
      at = Join(path, "pattern");
      if (!s["pattern"].is_string()) return Error(at, "expected a string");
      pattern = s["pattern"].get<std::string>();
      if (pattern.empty()) return -1;  // matches every string
    }
    if (pattern.empty()) return -1;
    if (auto same = pattern_dfas_.find(pattern); same != pattern_dfas_.end()) return same->second;
    COLI_ASSIGN_OR_RETURN(Dfa dfa, CompileRegex(pattern, at));
    const size_t states = static_cast<size_t>(dfa.states());
    if (states > pattern_dfa_states_left_) {
      return Error(at, Cat("the schema's patterns / formats need more than ",
                           kMaxPatternDfaStatesPerSchema, " DFA states in all (not supported)"));
    }
    pattern_dfa_states_left_ -= states;
    g_.dfas.push_back(std::move(dfa));
    const int32_t index = static_cast<int32_t>(g_.dfas.size() - 1);
    pattern_dfas_.emplace(std::move(pattern), index);
    return index;
  }

  // A number or integer node bounded by minimum / maximum / exclusive* and / or multipleOf: a
  // DFA over its spelling (NumberAutomaton: exact decimal comparisons and remainders, no
  // exponent). An integer with none of these keywords is the plain integer node.
  absl::StatusOr<int32_t> BoundedNumber(const Json& s, const std::string& path, bool integer) {
    Node n;
    n.kind = integer ? Kind::kInteger : Kind::kNumber;
    NumberSpec spec;
    spec.integer = integer;
    bool constrained = false;
    for (const char* w : {"minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum"}) {
      if (!s.contains(w)) continue;
      constrained = true;
      COLI_ASSIGN_OR_RETURN(Decimal b, ToDecimal(s[w], Join(path, w)));
      const int side = std::string_view(w).ends_with("aximum") ? 1 : 0;  // 0 lower, 1 upper
      bool exclusive = std::string_view(w).starts_with("exclusive");
      if (exclusive) b = ExclusiveEdge(b, s[w].get<double>(), side, &exclusive);
      std::optional<Decimal>& have = spec.bound[side];
      const int c = have ? Compare(b, *have) : 0;
      // The tighter bound wins; at a tie the exclusive one.
      if (!have || (side == 0 ? c > 0 : c < 0) || (c == 0 && exclusive)) {
        have = std::move(b);
        spec.exclusive[side] = exclusive;
      }
    }
    const bool multiple = s.contains("multipleOf");
    if (multiple) {
      constrained = true;
      const std::string at = Join(path, "multipleOf");
      COLI_ASSIGN_OR_RETURN(Decimal k, ToDecimal(s["multipleOf"], at));
      if (k.neg || k.zero()) return Error(at, "expected a number greater than 0");
      std::string digits = (k.ip == "0" ? "" : k.ip) + k.fp;
      digits.erase(0, digits.find_first_not_of('0'));
      if (digits.size() > kMaxMultipleDigits) {
        return Error(at, Cat("more than ", kMaxMultipleDigits,
                             " digits from its first non-zero digit, written out without exponent"
                             " (not supported)"));
      }
      spec.m = std::stoull(digits);  // 1-18 digits: cannot throw
      spec.d = k.fp.size();
    }
    if (!constrained) return AddNode(std::move(n));
    spec.pow10.assign(spec.d + 1, 1 % spec.m);
    for (size_t t = 1; t <= spec.d; ++t) spec.pow10[t] = spec.pow10[t - 1] * 10 % spec.m;
    auto side = [&spec](int i) {
      const std::optional<Decimal>& b = spec.bound[i];
      return b ? Cat(b->neg ? "-" : "", b->ip, ".", b->fp, spec.exclusive[i] ? "x" : "") : "";
    };
    const std::string key = Cat(integer, ",", side(0), ",", side(1), ",", spec.m, ",", spec.d);
    if (auto same = number_dfas_.find(key); same != number_dfas_.end()) {
      n.dfa = same->second;
      return AddNode(std::move(n));
    }
    const size_t limit = std::min(kMaxNumberStates, number_states_left_);
    NumberAutomaton automaton(spec, limit);
    absl::StatusOr<Dfa> dfa = automaton.Build();
    number_states_left_ -= std::min(number_states_left_, automaton.visited());
    const size_t dfa_states = dfa.ok() ? static_cast<size_t>(dfa->states()) : 0;
    if ((automaton.walk_cut() && limit < kMaxNumberStates) ||
        dfa_states > number_dfa_states_left_) {
      return Error(path, Cat("the schema's number / integer constraints need more than ",
                             kMaxNumberStatesPerSchema, " automaton states or ",
                             kMaxNumberDfaStatesPerSchema, " DFA states in all (not supported)"));
    }
    number_dfa_states_left_ -= dfa_states;
    if (dfa.status().code() == absl::StatusCode::kNotFound) {
      return Error(
          path, Cat("no ", integer ? "integer" : "number", " satisfies its minimum / maximum",
                    multiple ? " / multipleOf" : "", " within ", kBoundedIntDigits, " integer and ",
                    kMaxFracDigits, " fraction digits (not supported)"));
    }
    if (!dfa.ok()) {
      return Error(multiple ? Join(path, "multipleOf") : path,
                   Cat("the ", integer ? "integer" : "number", " needs ", dfa.status().message(),
                       " (not supported)"));
    }
    g_.dfas.push_back(*std::move(dfa));
    n.dfa = static_cast<int32_t>(g_.dfas.size() - 1);
    number_dfas_.emplace(key, n.dfa);
    return AddNode(std::move(n));
  }

  absl::StatusOr<int32_t> CompileObject(const Json& s, const std::string& path) {
    Node n;
    n.kind = Kind::kObject;
    if (s.contains("properties")) {
      const Json& props = s["properties"];
      const std::string at = Join(path, "properties");
      if (!props.is_object()) return Error(at, "expected an object");
      for (auto it = props.begin(); it != props.end(); ++it) {
        Property p;
        p.name = it.key();
        COLI_ASSIGN_OR_RETURN(p.node, Compile(it.value(), Join(at, it.key())));
        n.props.push_back(std::move(p));
      }
    }
    if (s.contains("required")) {
      const Json& req = s["required"];
      const std::string at = Join(path, "required");
      if (!req.is_array()) return Error(at, "expected an array of property names");
      for (size_t i = 0; i < req.size(); ++i) {
        if (!req[i].is_string()) return Error(json::JoinIndex(at, i), "expected a string");
        const std::string& name = req[i].get_ref<const std::string&>();
        auto p = std::find_if(n.props.begin(), n.props.end(),
                              [&name](const Property& q) { return q.name == name; });
        if (p == n.props.end()) {
          return Error(json::JoinIndex(at, i),
                       Cat("'", name, "' is not in properties (not supported)"));
        }
        p->required = true;
      }
    }
    if (s.contains("additionalProperties")) {
      const Json& extra = s["additionalProperties"];
      if (extra.is_boolean()) {
        n.additional = extra.get<bool>() ? int32_t{kAnyValue} : -1;
      } else {
        COLI_ASSIGN_OR_RETURN(n.additional, Compile(extra, Join(path, "additionalProperties")));
      }
    } else {
      // Absent: free-form only when no property is declared (OpenAI strict /
      // llama.cpp).
      n.additional = n.props.empty() ? int32_t{kAnyValue} : -1;
    }
    const int32_t np = static_cast<int32_t>(n.props.size());
    std::vector<std::pair<std::string, int32_t>> keys;
    for (int32_t i = 0; i < np; ++i) keys.emplace_back(Dump(Json(n.props[i].name)), i);
    std::sort(keys.begin(), keys.end());
    n.key_begin = static_cast<int32_t>(g_.literals.size());
    for (auto& [text, prop] : keys) {
      g_.literals.push_back(std::move(text));
      n.key_prop.push_back(prop);
    }
    n.key_end = static_cast<int32_t>(g_.literals.size());
    n.first_required.assign(np + 1, np);
    for (int32_t i = np - 1; i >= 0; --i) {
      n.first_required[i] = n.props[i].required ? i : n.first_required[i + 1];
    }
    return AddNode(std::move(n));
  }

  absl::StatusOr<int32_t> CompileArray(const Json& s, const std::string& path) {
    Node n;
    n.kind = Kind::kArray;
    if (s.contains("prefixItems")) {
      const Json& pre = s["prefixItems"];
      const std::string at = Join(path, "prefixItems");
      if (!pre.is_array()) return Error(at, "expected an array of schemas");
      for (size_t i = 0; i < pre.size(); ++i) {
        COLI_ASSIGN_OR_RETURN(int32_t item, Compile(pre[i], json::JoinIndex(at, i)));
        n.prefix.push_back(item);
      }
    }
    n.items = kAnyValue;
    if (s.contains("items")) {
      const Json& items = s["items"];
      const std::string at = Join(path, "items");
      if (items.is_array()) {
        return Error(at,
                     "an array of schemas (draft-4 tuples) is not "
                     "supported; use prefixItems");
      }
      if (items.is_boolean()) {
        n.items = items.get<bool>() ? int32_t{kAnyValue} : -1;
      } else {
        COLI_ASSIGN_OR_RETURN(n.items, Compile(items, at));
      }
    }
    COLI_ASSIGN_OR_RETURN(n.min_items, NonNegative(s, "minItems", path, 0));
    COLI_ASSIGN_OR_RETURN(n.max_items, NonNegative(s, "maxItems", path, kUnbounded));
    if (n.items < 0) {
      n.max_items = std::min<int64_t>(n.max_items, static_cast<int64_t>(n.prefix.size()));
    }
    if (n.min_items > n.max_items) {
      return Error(Join(path, "minItems"),
                   "greater than the most items allowed (maxItems, or "
                   "prefixItems with items "
                   "false)");
    }
    return AddNode(std::move(n));
  }

  // A local reference "#" or "#/a/b" (JSON pointer, ~0 ~1 escapes).
  absl::StatusOr<int32_t> Ref(const std::string& ref, const std::string& at) {
    if (ref.empty() || ref[0] != '#' || (ref.size() > 1 && ref[1] != '/')) {
      return Error(at, Cat("'", ref, "': only local references ('#/...') are supported"));
    }
    auto cached = refs_.find(ref);
    if (cached != refs_.end()) return cached->second;
    const Json* target = &root_;
    std::string target_path = root_path_;
    size_t pos = 1;
    while (pos < ref.size()) {
      size_t next = ref.find('/', pos + 1);
      if (next == std::string::npos) next = ref.size();
      std::string seg = ref.substr(pos + 1, next - pos - 1);
      std::string decoded;
      for (size_t i = 0; i < seg.size(); ++i) {
        if (seg[i] == '~' && i + 1 < seg.size() && (seg[i + 1] == '0' || seg[i + 1] == '1')) {
          decoded += seg[i + 1] == '0' ? '~' : '/';
          ++i;
        } else {
          decoded += seg[i];
        }
      }
      if (target->is_object() && target->contains(decoded)) {
        target = &(*target)[decoded];
        target_path = Join(target_path, decoded);
      } else if (target->is_array() && !decoded.empty() &&
                 decoded.find_first_not_of("0123456789") == std::string::npos &&
                 decoded.size() <= 9 && std::stoull(decoded) < target->size()) {
        const size_t index = std::stoull(decoded);  // <= 9 digits: cannot throw
        target = &(*target)[index];
        target_path = json::JoinIndex(target_path, index);
      } else {
        return Error(at, Cat("'", ref, "' not found"));
      }
      pos = next;
    }
    // A placeholder first, so recursive references resolve to it.
    Node indirection;
    indirection.kind = Kind::kAnyOf;
    const int32_t id = AddNode(std::move(indirection));
    refs_[ref] = id;
    ref_paths_[id] = at;
    COLI_ASSIGN_OR_RETURN(int32_t body, Compile(*target, target_path));
    g_.nodes[id].alts = {body};
    return id;
  }

  // An anyOf chain that returns to itself would never consume a byte ("A":
  // {"$ref": "#/A"}).
  absl::Status CheckCycles() const {
    const int32_t count = static_cast<int32_t>(g_.nodes.size());
    std::vector<int8_t> color(count, 0);  // 0 new, 1 on the path, 2 done
    std::vector<int32_t> path;
    std::function<bool(int32_t)> visit = [&](int32_t v) {
      if (g_.nodes[v].kind != Kind::kAnyOf) return false;
      if (color[v] == 1) {
        path.push_back(v);
        return true;
      }
      if (color[v] == 2) return false;
      color[v] = 1;
      for (int32_t w : g_.nodes[v].alts) {
        if (visit(w)) {
          path.push_back(v);
          return true;
        }
      }
      color[v] = 2;
      return false;
    };
    for (int32_t v = 0; v < count; ++v) {
      if (!visit(v)) continue;
      for (int32_t p : path) {
        auto named = ref_paths_.find(p);
        if (named != ref_paths_.end()) {
          return Error(named->second, "reference cycle that reads no input (left recursion)");
        }
      }
      return Error(root_path_, "reference cycle that reads no input (left recursion)");
    }
    return absl::OkStatus();
  }

  const Json& root_;
  std::string root_path_;
  Grammar g_;
  std::map<std::string, int32_t> refs_;
  // Number DFAs by constraint, and what the schema may still spend on them.
  std::map<std::string, int32_t> number_dfas_;
  size_t number_states_left_ = kMaxNumberStatesPerSchema;
  size_t number_dfa_states_left_ = kMaxNumberDfaStatesPerSchema;
  // Pattern / format DFAs by pattern text, and the states the schema may still spend on them.
  std::map<std::string, int32_t> pattern_dfas_;
  size_t pattern_dfa_states_left_ = kMaxPatternDfaStatesPerSchema;
  std::map<int32_t, std::string> ref_paths_;
};

}  // namespace

absl::StatusOr<Grammar> CompileSchema(const nlohmann::ordered_json& schema, std::string path) {
  Compiler c(schema, std::move(path));
  return c.Run();
}

}  // namespace coli::grammar::internal
