// JSON schema -> Grammar (grammar.h). Supported keywords and the rules for the
// rest are listed in docs/status/grammar.md; anything that would change what is
// valid and is not supported is refused with INVALID_ARGUMENT naming its path.
#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <set>
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
const std::set<std::string, std::less<>> kSupported = {
    "type",  "enum",        "const",    "properties", "required",  "additionalProperties",
    "items", "prefixItems", "minItems", "maxItems",   "minLength", "maxLength",
    "anyOf", "oneOf",       "allOf",    "$ref",       "pattern",   "format",
    "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"};
const std::set<std::string, std::less<>> kObjectWords = {"properties", "required",
                                                         "additionalProperties"};
const std::set<std::string, std::less<>> kArrayWords = {"items", "prefixItems", "minItems",
                                                        "maxItems"};
const std::set<std::string, std::less<>> kStringWords = {"minLength", "maxLength", "pattern"};
const std::set<std::string, std::less<>> kNumberWords = {"minimum", "maximum", "exclusiveMinimum",
                                                         "exclusiveMaximum"};

// Integers a bounded integer node can spell: |value| < 10^19 (19 digits).
constexpr uint64_t kMaxMagnitude = 9'999'999'999'999'999'999ULL;

// A regex (regex.h syntax) for the decimal spellings, without leading zeros, of the integers
// in [a, b] (a <= b) that have the same number of digits.
std::string SameLengthRange(const std::string& a, const std::string& b) {
  if (a.empty()) return "";
  const std::string_view a0(a.data(), 1), b0(b.data(), 1);
  if (a[0] == b[0]) return Cat(a0, SameLengthRange(a.substr(1), b.substr(1)));
  const size_t rest = a.size() - 1;
  const std::string digits = rest == 0 ? std::string() : Cat("\\d{", rest, "}");
  // Leading digits whose every tail is in range form one class; the first (last) leading digit
  // is a branch of its own unless a's tail is all zeros (b's all nines).
  const bool a_full = a.find_first_not_of('0', 1) == std::string::npos;
  const bool b_full = b.find_first_not_of('9', 1) == std::string::npos;
  const char lo = a_full ? a[0] : static_cast<char>(a[0] + 1);
  const char hi = b_full ? b[0] : static_cast<char>(b[0] - 1);
  std::vector<std::string> branches;
  if (!a_full) branches.push_back(Cat(a0, SameLengthRange(a.substr(1), std::string(rest, '9'))));
  if (lo <= hi) {
    branches.push_back(Cat("[", std::string(1, lo), "-", std::string(1, hi), "]", digits));
  }
  if (!b_full) branches.push_back(Cat(b0, SameLengthRange(std::string(rest, '0'), b.substr(1))));
  std::string out = "(";
  for (size_t i = 0; i < branches.size(); ++i) out += Cat(i ? "|" : "", branches[i]);
  return out + ")";
}

// A regex for the integers in [a, b] (0 <= a <= b), canonical decimal.
std::string MagnitudeRange(uint64_t a, uint64_t b) {
  std::string out;
  uint64_t lo = a;
  for (;;) {
    const std::string ls = std::to_string(lo);
    // The largest number with as many digits as lo.
    uint64_t top = 9;
    for (size_t i = 1; i < ls.size(); ++i) top = top * 10 + 9;
    const uint64_t hi = std::min(top, b);
    if (!out.empty()) out += "|";
    out += SameLengthRange(ls, std::to_string(hi));
    if (hi >= b) break;
    lo = hi + 1;
  }
  return "(" + out + ")";
}

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
        alts.push_back(n.min_len == 0 && n.max_len == kUnbounded && n.dfa < 0 ? int32_t{kAnyString}
                                                                 : AddNode(std::move(n)));
      } else if (t == "number") {
        const bool bounded = std::any_of(kNumberWords.begin(), kNumberWords.end(),
                                         [&s](const std::string& w) { return s.contains(w); });
        if (!bounded) {
          alts.push_back(kAnyNumber);
          continue;
        }
        // Integer-valued bounds are exact for numbers (see docs/status/grammar.md).
        COLI_ASSIGN_OR_RETURN(int32_t n, BoundedNumber(s, path));
        alts.push_back(n);
      } else if (t == "integer") {
        if (has_number) continue;  // numbers include the integers
        COLI_ASSIGN_OR_RETURN(int32_t n, BoundedInteger(s, path));
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
    COLI_ASSIGN_OR_RETURN(Dfa dfa, CompileRegex(pattern, at));
    g_.dfas.push_back(std::move(dfa));
    return static_cast<int32_t>(g_.dfas.size() - 1);
  }

  // One bound (minimum / maximum / exclusive*) as the integer bound it implies, clamped to
  // +-kMaxMagnitude; `lower` says which side.
  static absl::StatusOr<__int128> IntegerBound(const Json& v, const std::string& at, bool lower,
                                               bool exclusive) {
    constexpr __int128 kMax = static_cast<__int128>(kMaxMagnitude);
    __int128 b;
    if (v.is_number_unsigned()) {
      b = static_cast<__int128>(v.get<uint64_t>());
    } else if (v.is_number_integer()) {
      b = static_cast<__int128>(v.get<int64_t>());
    } else if (v.is_number_float()) {
      const double d = v.get<double>();
      if (!std::isfinite(d)) return Error(at, "expected a finite number");
      if (d > 1e19) return lower ? kMax + 1 : kMax;
      if (d < -1e19) return lower ? -kMax : -kMax - 1;
      const double r = lower ? std::ceil(d) : std::floor(d);
      b = static_cast<__int128>(r);
      if (exclusive && r == d) b += lower ? 1 : -1;
      return std::clamp<__int128>(b, -kMax - 1, kMax + 1);
    } else {
      return Error(at, "expected a number");
    }
    if (exclusive) b += lower ? 1 : -1;
    return std::clamp<__int128>(b, -kMax - 1, kMax + 1);
  }

  // An integer node, bounded by minimum / maximum / exclusiveMinimum / exclusiveMaximum when
  // given: a DFA over its decimal spelling (no leading zeros, no "-0"), so every prefix it takes
  // can still be completed within the range.
  absl::StatusOr<int32_t> BoundedInteger(const Json& s, const std::string& path) {
    Node n;
    n.kind = Kind::kInteger;
    constexpr __int128 kMax = static_cast<__int128>(kMaxMagnitude);
    __int128 lo = -kMax, hi = kMax;
    bool bounded = false;
    for (const std::string& w : kNumberWords) {
      if (!s.contains(w)) continue;
      bounded = true;
      const bool lower = w == "minimum" || w == "exclusiveMinimum";
      const bool exclusive = w.rfind("exclusive", 0) == 0;
      COLI_ASSIGN_OR_RETURN(__int128 b, IntegerBound(s[w], Join(path, w), lower, exclusive));
      if (lower) {
        lo = std::max(lo, b);
      } else {
        hi = std::min(hi, b);
      }
    }
    if (!bounded) return AddNode(std::move(n));
    if (lo > hi) {
      return Error(path, "no integer satisfies its minimum / maximum (not supported)");
    }
    std::string re;
    if (lo < 0) {  // negative values -|hi'| .. -|lo|
      const uint64_t a = static_cast<uint64_t>(hi < 0 ? -hi : 1);
      re += Cat("-", MagnitudeRange(a, static_cast<uint64_t>(-lo)));
    }
    if (hi >= 0) {
      if (!re.empty()) re += "|";
      re += MagnitudeRange(static_cast<uint64_t>(lo > 0 ? lo : 0), static_cast<uint64_t>(hi));
    }
    COLI_ASSIGN_OR_RETURN(Dfa dfa, CompileRegex(Cat("^(", re, ")$"), path));
    g_.dfas.push_back(std::move(dfa));
    n.dfa = static_cast<int32_t>(g_.dfas.size() - 1);
    return AddNode(std::move(n));
  }

  // A number node bounded by integer-valued minimum / maximum / exclusive*: a DFA over
  // "-"? int ("." digits)? (no exponent, at most 24 fraction digits), exact: an integer part
  // strictly inside the range takes any fraction, a bound itself only zeros (inclusive) or a
  // non-zero fraction on the inner side (exclusive lower end).
  absl::StatusOr<int32_t> BoundedNumber(const Json& s, const std::string& path) {
    constexpr __int128 kMax = static_cast<__int128>(kMaxMagnitude) - 1;
    __int128 lo = -kMax, hi = kMax;
    bool lo_excl = false, hi_excl = false;
    for (const std::string& w : kNumberWords) {
      if (!s.contains(w)) continue;
      const Json& v = s[w];
      const std::string at = Join(path, w);
      __int128 b;
      if (v.is_number_unsigned()) {
        b = static_cast<__int128>(v.get<uint64_t>());
      } else if (v.is_number_integer()) {
        b = static_cast<__int128>(v.get<int64_t>());
      } else if (v.is_number_float() && std::isfinite(v.get<double>()) &&
                 std::floor(v.get<double>()) == v.get<double>() &&
                 std::fabs(v.get<double>()) < 1e18) {
        b = static_cast<__int128>(v.get<double>());
      } else if (v.is_number()) {
        return Error(at, "only integer-valued bounds are supported for type number");
      } else {
        return Error(at, "expected a number");
      }
      if (b > kMax || b < -kMax) return Error(at, "bound too large (not supported)");
      const bool exclusive = w.rfind("exclusive", 0) == 0;
      if (w == "minimum" || w == "exclusiveMinimum") {
        if (b > lo || (b == lo && exclusive)) lo = b, lo_excl = exclusive;
      } else {
        if (b < hi || (b == hi && exclusive)) hi = b, hi_excl = exclusive;
      }
    }
    if (lo > hi || (lo == hi && (lo_excl || hi_excl))) {
      return Error(path, "no number satisfies its minimum / maximum (not supported)");
    }
    // Unsigned values m in [a, b] (flags: the end itself excluded).
    auto part = [](__int128 a, bool a_excl, __int128 b, bool b_excl) {
      const std::string any_frac = "(\\.\\d{1,24})?", zeros = "(\\.0{1,24})?";
      const std::string nonzero = "\\.0{0,23}[1-9]\\d{0,23}";
      auto num = [](__int128 v) { return std::to_string(static_cast<uint64_t>(v)); };
      if (a == b) return Cat(num(a), zeros);
      std::vector<std::string> branches;
      branches.push_back(Cat(num(a), a_excl ? nonzero : any_frac));
      if (a + 1 <= b - 1) {
        branches.push_back(Cat(MagnitudeRange(static_cast<uint64_t>(a + 1),
                                              static_cast<uint64_t>(b - 1)), any_frac));
      }
      if (!b_excl) branches.push_back(Cat(num(b), zeros));
      std::string out = "(";
      for (size_t i = 0; i < branches.size(); ++i) out += Cat(i ? "|" : "", branches[i]);
      return out + ")";
    };
    std::vector<std::string> sides;
    if (hi > 0 || (hi == 0 && !hi_excl)) {
      sides.push_back(lo >= 0 ? part(lo, lo_excl, hi, hi_excl) : part(0, false, hi, hi_excl));
    }
    if (lo < 0) {
      // Magnitudes of the negative values; -0 is 0, allowed when 0 is.
      const bool zero_ok = hi > 0 || (hi == 0 && !hi_excl);
      const __int128 m_lo = hi < 0 ? -hi : 0;
      const bool m_lo_excl = hi < 0 ? hi_excl : !zero_ok;
      sides.push_back(Cat("-", part(m_lo, m_lo_excl, -lo, lo_excl)));
    }
    std::string re;
    for (size_t i = 0; i < sides.size(); ++i) re += Cat(i ? "|" : "", sides[i]);
    COLI_ASSIGN_OR_RETURN(Dfa dfa, CompileRegex(Cat("^(", re, ")$"), path));
    Node n;
    n.kind = Kind::kNumber;
    g_.dfas.push_back(std::move(dfa));
    n.dfa = static_cast<int32_t>(g_.dfas.size() - 1);
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
  std::map<int32_t, std::string> ref_paths_;
};

}  // namespace

absl::StatusOr<Grammar> CompileSchema(const nlohmann::ordered_json& schema, std::string path) {
  Compiler c(schema, std::move(path));
  return c.Run();
}

}  // namespace coli::grammar::internal
