// Regex subset -> NFA (Thompson) -> trimmed DFA. Design note in regex.h.
#include "common/grammar/regex.h"

#include <algorithm>
#include <bitset>
#include <limits>
#include <map>
#include <memory>
#include <utility>

#include "absl/status/status.h"
#include "common/io/cat.h"

namespace coli::grammar::internal {
using ::coli::internal_cat::Cat;
namespace {

using SymSet = std::bitset<kRegexSymbols>;
constexpr int kMaxNfaStates = 5000;
constexpr int kMaxRepeat = 1000;

struct Ast {
  enum Type { kSet, kConcat, kAlt, kRepeat, kBol, kEol } type = kConcat;
  SymSet set;
  std::vector<Ast> kids;
  int min = 0, max = 0;  // kRepeat; max -1 = unbounded
};

class Parser {
 public:
  explicit Parser(std::string_view p) : p_(p) {}

  absl::StatusOr<Ast> Parse() {
    Ast a = Alternation();
    if (!error_.empty()) return absl::InvalidArgumentError(error_);
    if (pos_ < p_.size()) return absl::InvalidArgumentError(Cat("unbalanced ')' at offset ", pos_));
    return a;
  }

 private:
  void Fail(std::string what) {
    if (error_.empty()) error_ = Cat(what, " at offset ", pos_, " (not supported)");
  }
  bool AtEnd() const { return pos_ >= p_.size(); }
  char Peek() const { return p_[pos_]; }

  Ast Alternation() {
    Ast alt;
    alt.type = Ast::kAlt;
    alt.kids.push_back(Concatenation());
    while (error_.empty() && !AtEnd() && Peek() == '|') {
      ++pos_;
      alt.kids.push_back(Concatenation());
    }
    return alt.kids.size() == 1 ? std::move(alt.kids[0]) : alt;
  }

  Ast Concatenation() {
    Ast cat;
    cat.type = Ast::kConcat;
    while (error_.empty() && !AtEnd() && Peek() != '|' && Peek() != ')') {
      Ast atom = Atom();
      if (!error_.empty()) break;
      Quantifiers(atom);
      cat.kids.push_back(std::move(atom));
    }
    return cat;
  }

  bool ReadInt(int* out) {
    const size_t start = pos_;
    long v = 0;
    while (!AtEnd() && Peek() >= '0' && Peek() <= '9') {
      v = v * 10 + (Peek() - '0');
      if (v > kMaxRepeat) v = kMaxRepeat + 1;
      ++pos_;
    }
    *out = static_cast<int>(v);
    return pos_ > start;
  }

  void Quantifiers(Ast& atom) {
    while (error_.empty() && !AtEnd()) {
      int lo, hi;
      const char c = Peek();
      if (c == '*') {
        lo = 0, hi = -1, ++pos_;
      } else if (c == '+') {
        lo = 1, hi = -1, ++pos_;
      } else if (c == '?') {
        lo = 0, hi = 1, ++pos_;
      } else if (c == '{') {
        ++pos_;
        if (!ReadInt(&lo)) return Fail("'{' that is not a {m}, {m,} or {m,n} quantifier");
        hi = lo;
        if (!AtEnd() && Peek() == ',') {
          ++pos_;
          if (!ReadInt(&hi)) hi = -1;
        }
        if (AtEnd() || Peek() != '}') return Fail("unterminated quantifier");
        ++pos_;
        if (lo > kMaxRepeat || hi > kMaxRepeat) return Fail(Cat("a count above ", kMaxRepeat));
        if (hi >= 0 && hi < lo) return Fail("a quantifier {m,n} with n < m");
      } else {
        return;
      }
      if (atom.type == Ast::kBol || atom.type == Ast::kEol) return Fail("a quantified anchor");
      if (!AtEnd() && Peek() == '?') ++pos_;  // lazy: same language
      if (!AtEnd() && Peek() == '+') return Fail("a possessive quantifier");
      Ast r;
      r.type = Ast::kRepeat;
      r.min = lo;
      r.max = hi;
      r.kids.push_back(std::move(atom));
      atom = std::move(r);
    }
  }

  static SymSet Range(int a, int b) {
    SymSet s;
    for (int i = a; i <= b; ++i) s.set(i);
    return s;
  }
  static SymSet Digits() { return Range('0', '9'); }
  static SymSet Word() { return Range('0', '9') | Range('A', 'Z') | Range('a', 'z') | Range('_', '_'); }
  static SymSet Space() { return Range('\t', '\r') | Range(' ', ' '); }
  static SymSet Ascii() { return Range(0, 127); }

  // After a backslash: a shorthand class or one character. *shorthand: the escape was a
  // class shorthand (\d \w \s and negations).
  bool Escape(SymSet* out, bool* shorthand) {
    *shorthand = false;
    if (AtEnd()) {
      Fail("a trailing backslash");
      return false;
    }
    const char c = p_[pos_++];
    auto one = [out](int ch) {
      out->reset();
      out->set(ch);
      return true;
    };
    auto hex = [&](int digits) -> bool {
      int v = 0;
      for (int i = 0; i < digits; ++i) {
        if (AtEnd()) break;
        const char h = p_[pos_];
        const int d = h >= '0' && h <= '9'   ? h - '0'
                      : h >= 'a' && h <= 'f' ? h - 'a' + 10
                      : h >= 'A' && h <= 'F' ? h - 'A' + 10
                                             : -1;
        if (d < 0) {
          Fail("a malformed hex escape");
          return false;
        }
        v = v * 16 + d;
        ++pos_;
      }
      if (v >= 0x80) {
        Fail("a non-ASCII character");
        return false;
      }
      return one(v);
    };
    switch (c) {
      case 'd': *shorthand = true; *out = Digits(); return true;
      case 'D': *shorthand = true; *out = Ascii() & ~Digits(); return true;
      case 'w': *shorthand = true; *out = Word(); return true;
      case 'W': *shorthand = true; *out = Ascii() & ~Word(); return true;
      case 's': *shorthand = true; *out = Space(); return true;
      case 'S': *shorthand = true; *out = Ascii() & ~Space(); return true;
      case 'n': return one('\n');
      case 't': return one('\t');
      case 'r': return one('\r');
      case 'f': return one('\f');
      case 'v': return one('\v');
      case 'x': return hex(2);
      case 'u': return hex(4);
      default: break;
    }
    if ((c >= '0' && c <= '9')) {
      Fail("a backreference or octal escape");
      return false;
    }
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) {
      Fail(Cat("the escape \\", std::string(1, c)));
      return false;
    }
    if (static_cast<unsigned char>(c) >= 0x80) {
      Fail("a non-ASCII character");
      return false;
    }
    return one(static_cast<unsigned char>(c));  // \. \\ \( ...
  }

  Ast Set(SymSet s) {
    Ast a;
    a.type = Ast::kSet;
    a.set = s;
    return a;
  }

  Ast Class() {
    // After '['.
    bool negate = false;
    if (!AtEnd() && Peek() == '^') {
      negate = true;
      ++pos_;
    }
    SymSet s;
    bool shorthands = false;
    bool first = true;
    for (;;) {
      if (AtEnd()) {
        Fail("an unterminated character class");
        return {};
      }
      char c = Peek();
      if (c == ']') {
        if (first) {
          Fail("an empty class '[]' (ECMA) / literal ']' (Python)");
          return {};
        }
        ++pos_;
        break;
      }
      first = false;
      if (c == '[') {
        Fail("'[' inside a class");
        return {};
      }
      SymSet lo_set;
      int lo = -1;
      ++pos_;
      if (c == '\\') {
        bool sh = false;
        if (!Escape(&lo_set, &sh)) return {};
        if (sh) {
          shorthands = true;
          s |= lo_set;
          continue;
        }
        lo = static_cast<int>(lo_set._Find_first());
      } else {
        if (static_cast<unsigned char>(c) >= 0x80) {
          Fail("a non-ASCII character");
          return {};
        }
        lo = static_cast<unsigned char>(c);
      }
      if (pos_ + 1 < p_.size() && Peek() == '-' && p_[pos_ + 1] != ']') {
        ++pos_;
        int hi;
        char d = p_[pos_++];
        if (d == '\\') {
          SymSet hs;
          bool sh = false;
          if (!Escape(&hs, &sh)) return {};
          if (sh) {
            Fail("a range ending in a class shorthand");
            return {};
          }
          hi = static_cast<int>(hs._Find_first());
        } else {
          if (static_cast<unsigned char>(d) >= 0x80) {
            Fail("a non-ASCII character");
            return {};
          }
          hi = static_cast<unsigned char>(d);
        }
        if (hi < lo) {
          Fail("a reversed range");
          return {};
        }
        s |= Range(lo, hi);
      } else {
        s.set(lo);
      }
    }
    if (negate) {
      s = ~s;
      // Python's \w \d \s are Unicode-aware, ECMA's are not: a non-ASCII character may or may
      // not be outside a shorthand, so a negated class holding one takes no non-ASCII character.
      if (shorthands) s.reset(kNonAscii);
    }
    return Set(s);
  }

  Ast Atom() {
    const char c = p_[pos_++];
    switch (c) {
      case '(': {
        if (!AtEnd() && Peek() == '?') {
          if (pos_ + 1 < p_.size() && p_[pos_ + 1] == ':') {
            pos_ += 2;
          } else {
            Fail("a group '(?' (lookaround, named group or flags)");
            return {};
          }
        }
        Ast inner = Alternation();
        if (!error_.empty()) return {};
        if (AtEnd() || Peek() != ')') {
          Fail("an unterminated group");
          return {};
        }
        ++pos_;
        return inner;
      }
      case '[':
        return Class();
      case '.': {
        SymSet s = Ascii();
        s.reset('\n');
        s.reset('\r');
        s.set(kNonAscii);
        return Set(s);
      }
      case '^': {
        Ast a;
        a.type = Ast::kBol;
        return a;
      }
      case '$': {
        Ast a;
        a.type = Ast::kEol;
        return a;
      }
      case '\\': {
        SymSet s;
        bool sh = false;
        if (!Escape(&s, &sh)) return {};
        return Set(s);
      }
      case '*':
      case '+':
      case '?':
      case '{':
      case '}':
      case ']':
        --pos_;
        Fail(Cat("a stray '", std::string(1, c), "'"));
        return {};
      default:
        if (static_cast<unsigned char>(c) >= 0x80) {
          --pos_;
          Fail("a non-ASCII character");
          return {};
        }
        SymSet s;
        s.set(static_cast<unsigned char>(c));
        return Set(s);
    }
  }

  std::string_view p_;
  size_t pos_ = 0;
  std::string error_;
};

// Thompson NFA. Edge kinds: symbol set, epsilon, ^ (only at the start), $ (only at the end).
struct Edge {
  enum Kind : uint8_t { kSym, kEps, kBol, kEol } kind;
  int32_t to;
  int32_t set;  // kSym: index into Nfa::sets
};

struct Nfa {
  std::vector<std::vector<Edge>> out;
  std::vector<SymSet> sets;
  bool too_big = false;
  int32_t New() {
    if (out.size() >= static_cast<size_t>(kMaxNfaStates)) too_big = true;
    out.emplace_back();
    return static_cast<int32_t>(out.size() - 1);
  }
  void Add(int32_t from, Edge::Kind k, int32_t to, int32_t set = -1) {
    out[from].push_back(Edge{k, to, set});
  }

  // Emits `a` starting at `from`; returns the state reached after it. Never adds an edge into
  // `from`, so constructs can share their start state.
  int32_t Emit(const Ast& a, int32_t from) {
    if (too_big) return from;
    switch (a.type) {
      case Ast::kSet: {
        const int32_t t = New();
        sets.push_back(a.set);
        Add(from, Edge::kSym, t, static_cast<int32_t>(sets.size() - 1));
        return t;
      }
      case Ast::kBol:
      case Ast::kEol: {
        const int32_t t = New();
        Add(from, a.type == Ast::kBol ? Edge::kBol : Edge::kEol, t);
        return t;
      }
      case Ast::kConcat: {
        int32_t cur = from;
        for (const Ast& k : a.kids) cur = Emit(k, cur);
        return cur;
      }
      case Ast::kAlt: {
        const int32_t t = New();
        for (const Ast& k : a.kids) Add(Emit(k, from), Edge::kEps, t);
        return t;
      }
      case Ast::kRepeat: {
        int32_t cur = from;
        for (int i = 0; i < a.min && !too_big; ++i) cur = Emit(a.kids[0], cur);
        if (a.max < 0) {
          const int32_t loop = New();
          Add(cur, Edge::kEps, loop);
          Add(Emit(a.kids[0], loop), Edge::kEps, loop);
          return loop;
        }
        for (int i = a.min; i < a.max && !too_big; ++i) {
          const int32_t t = New();
          Add(cur, Edge::kEps, t);
          Add(Emit(a.kids[0], cur), Edge::kEps, t);
          cur = t;
        }
        return cur;
      }
    }
    return from;
  }

  // Closure of `set` over epsilon edges (and ^ edges when at_start, $ edges when at_end).
  std::vector<int32_t> Closure(std::vector<int32_t> set, bool at_start, bool at_end) const {
    std::vector<uint8_t> seen(out.size(), 0);
    std::vector<int32_t> stack = set;
    for (int32_t s : set) seen[s] = 1;
    while (!stack.empty()) {
      const int32_t s = stack.back();
      stack.pop_back();
      for (const Edge& e : out[s]) {
        const bool take = e.kind == Edge::kEps || (e.kind == Edge::kBol && at_start) ||
                          (e.kind == Edge::kEol && at_end);
        if (take && !seen[e.to]) {
          seen[e.to] = 1;
          stack.push_back(e.to);
        }
      }
    }
    std::vector<int32_t> r;
    for (size_t i = 0; i < seen.size(); ++i) {
      if (seen[i]) r.push_back(static_cast<int32_t>(i));
    }
    return r;
  }
};

}  // namespace

absl::StatusOr<Dfa> CompileRegex(std::string_view pattern, std::string_view path) {
  Parser parser(pattern);
  absl::StatusOr<Ast> ast = parser.Parse();
  if (!ast.ok()) return absl::InvalidArgumentError(Cat(path, ": ", ast.status().message()));

  // Search: state 0 loops on every symbol (the text before the match), then the pattern.
  Nfa nfa;
  const int32_t search = nfa.New();
  nfa.sets.push_back(SymSet().set());
  nfa.Add(search, Edge::kSym, search, 0);
  const int32_t begin = nfa.New();
  nfa.Add(search, Edge::kEps, begin);
  const int32_t final_state = nfa.Emit(*ast, begin);
  if (nfa.too_big) {
    return absl::InvalidArgumentError(
        Cat(path, ": the pattern needs more than ", kMaxNfaStates, " NFA states (not supported)"));
  }
  auto has_final = [final_state](const std::vector<int32_t>& set) {
    return std::binary_search(set.begin(), set.end(), final_state);
  };

  // Subset construction. A DFA state is the closure (without $) of the NFA states; once the
  // final state is in it a match has been found and the state becomes the absorbing "matched"
  // state (index 1), where every allowed symbol is taken.
  Dfa dfa;
  std::map<std::vector<int32_t>, int32_t> index;
  std::vector<std::vector<int32_t>> sets;
  std::vector<int32_t> raw_next;
  std::vector<uint8_t> accept;
  auto intern = [&](std::vector<int32_t> closure) -> int32_t {
    if (has_final(closure)) return 1;
    auto [it, fresh] = index.emplace(closure, static_cast<int32_t>(sets.size()));
    if (fresh) {
      accept.push_back(has_final(nfa.Closure(closure, false, true)) ? 1 : 0);
      sets.push_back(std::move(closure));
    }
    return it->second;
  };
  // State 0: the start (^ holds). State 1: matched.
  {
    std::vector<int32_t> start = nfa.Closure({search}, true, false);
    const bool matched = has_final(start);
    sets.push_back(start);
    accept.push_back(matched || has_final(nfa.Closure(start, true, true)) ? 1 : 0);
    sets.push_back({});
    accept.push_back(1);
    if (matched) {
      // Matches the empty prefix: every string is valid.
      sets[0].clear();
    }
  }
  const bool start_matched = has_final(nfa.Closure({search}, true, false));
  for (size_t i = 0; i < sets.size(); ++i) {
    if (sets.size() > static_cast<size_t>(kMaxDfaStates)) {
      return absl::InvalidArgumentError(Cat(path, ": the pattern needs more than ", kMaxDfaStates,
                                            " DFA states (not supported)"));
    }
    raw_next.resize((i + 1) * kRegexSymbols, -1);
    for (int sym = 0; sym < kRegexSymbols; ++sym) {
      if (!RegexSymbolAllowed(sym)) continue;
      int32_t to;
      if (i == 1 || (i == 0 && start_matched)) {
        to = 1;
      } else {
        std::vector<int32_t> moved;
        for (int32_t s : sets[i]) {
          for (const Edge& e : nfa.out[s]) {
            if (e.kind == Edge::kSym && nfa.sets[e.set].test(sym)) moved.push_back(e.to);
          }
        }
        if (moved.empty()) continue;
        std::sort(moved.begin(), moved.end());
        moved.erase(std::unique(moved.begin(), moved.end()), moved.end());
        to = intern(nfa.Closure(std::move(moved), false, false));
      }
      raw_next[i * kRegexSymbols + sym] = to;
    }
  }
  const int32_t n = static_cast<int32_t>(sets.size());
  raw_next.resize(static_cast<size_t>(n) * kRegexSymbols, -1);

  // Trim: live = can reach an accepting state.
  std::vector<uint8_t> live(accept.begin(), accept.end());
  for (bool changed = true; changed;) {
    changed = false;
    for (int32_t s = 0; s < n; ++s) {
      if (live[s]) continue;
      for (int sym = 0; sym < kRegexSymbols; ++sym) {
        const int32_t t = raw_next[s * kRegexSymbols + sym];
        if (t >= 0 && live[t]) {
          live[s] = 1;
          changed = true;
          break;
        }
      }
    }
  }
  if (!live[0]) {
    return absl::InvalidArgumentError(Cat(
        path, ": no string matches this pattern using unescaped printable characters (not supported)"));
  }
  dfa.next = std::move(raw_next);
  for (int32_t& t : dfa.next) {
    if (t >= 0 && !live[t]) t = -1;
  }
  dfa.accept = std::move(accept);
  // Fewest characters to an accepting state (Bellman-Ford style; states are few).
  dfa.dist.assign(n, std::numeric_limits<int32_t>::max());
  for (int32_t s = 0; s < n; ++s) {
    if (dfa.accept[s]) dfa.dist[s] = 0;
  }
  for (bool changed = true; changed;) {
    changed = false;
    for (int32_t s = 0; s < n; ++s) {
      for (int sym = 0; sym < kRegexSymbols; ++sym) {
        const int32_t t = dfa.next[s * kRegexSymbols + sym];
        if (t >= 0 && dfa.dist[t] != std::numeric_limits<int32_t>::max() &&
            dfa.dist[t] + 1 < dfa.dist[s]) {
          dfa.dist[s] = dfa.dist[t] + 1;
          changed = true;
        }
      }
    }
  }
  return dfa;
}

std::string_view FormatPattern(std::string_view format) {
  // Dates: proleptic Gregorian, year 0001-9999, days per month and leap years exact.
#define COLI_YEAR "(\\d{3}[1-9]|\\d{2}[1-9]0|\\d[1-9]00|[1-9]000)"
#define COLI_MONTH_DAY \
  "(" COLI_YEAR "-((0[1-9]|1[0-2])-(0[1-9]|1\\d|2[0-8])|(0[13-9]|1[0-2])-(29|30)|(0[13578]|1[02])-31)" \
  "|(\\d\\d(0[48]|[2468][048]|[13579][26])|(0[48]|[2468][048]|[13579][26])00)-02-29)"
#define COLI_TIME "([01]\\d|2[0-3]):[0-5]\\d:[0-5]\\d(\\.\\d{1,9})?(Z|[+-]([01]\\d|2[0-3]):[0-5]\\d)"
#define COLI_H16 "[0-9a-fA-F]{1,4}"
  static const std::map<std::string_view, std::string_view> kFormats = {
      {"date", "^" COLI_MONTH_DAY "$"},
      {"time", "^" COLI_TIME "$"},
      {"date-time", "^" COLI_MONTH_DAY "T" COLI_TIME "$"},
      {"uuid", "^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$"},
      {"email", "^[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+(\\.[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+)*@"
                "[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?(\\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)+$"},
      {"ipv4", "^((25[0-5]|2[0-4]\\d|1\\d\\d|[1-9]?\\d)\\.){3}(25[0-5]|2[0-4]\\d|1\\d\\d|[1-9]?\\d)$"},
      {"ipv6", "^((" COLI_H16 ":){7}" COLI_H16 "|(" COLI_H16 ":){1,7}:|(" COLI_H16 ":){1,6}:" COLI_H16
               "|(" COLI_H16 ":){1,5}(:" COLI_H16 "){1,2}|(" COLI_H16 ":){1,4}(:" COLI_H16 "){1,3}"
               "|(" COLI_H16 ":){1,3}(:" COLI_H16 "){1,4}|(" COLI_H16 ":){1,2}(:" COLI_H16 "){1,5}"
               "|" COLI_H16 ":(:" COLI_H16 "){1,6}|:((:" COLI_H16 "){1,7}|:))$"},
      {"hostname", "^[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?(\\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*$"},
  };
#undef COLI_YEAR
#undef COLI_MONTH_DAY
#undef COLI_TIME
#undef COLI_H16
  auto it = kFormats.find(format);
  return it == kFormats.end() ? std::string_view() : it->second;
}

}  // namespace coli::grammar::internal
