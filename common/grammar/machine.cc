// The byte-level pushdown machine over a compiled grammar (design note in
// grammar.h).
#include <algorithm>
#include <atomic>
#include <cstring>
#include <utility>

#include "common/grammar/grammar.h"

namespace coli::grammar::internal {
namespace {

constexpr uint8_t kKeyFlag = 1;      // kStr: an additional-property key (bytes kept in Thread::key)
constexpr uint8_t kIntegerFlag = 1;  // kNum: no fraction, no exponent

// Object phases.
enum : uint8_t {
  kObjOpen,
  kObjInKey,
  kObjAfterKey,
  kObjAfterColon,
  kObjInValue,
  kObjAfterValue,
  kObjAfterComma
};
// Array phases.
enum : uint8_t { kArrOpen, kArrInValue, kArrAfterValue, kArrAfterComma };
// String phases: kStrHex + k = k hex digits of \u read; kStrLow + k likewise
// for the low half of a surrogate pair; kStrUtf8: inside a multi-byte character
// (b = remaining | lo << 8 | hi << 16).
enum : uint8_t {
  kStrNormal,
  kStrEscape,
  kStrHex = 2,
  kStrNeedBackslash = 6,
  kStrNeedU = 7,
  kStrLow = 8,
  kStrUtf8 = 12
};
// Number phases.
enum : uint8_t {
  kNumStart,
  kNumMinus,
  kNumZero,
  kNumInt,
  kNumDot,
  kNumFrac,
  kNumE,
  kNumESign,
  kNumExp
};

bool IsDigit(uint8_t c) { return c >= '0' && c <= '9'; }
int HexValue(uint8_t c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// Whitespace inside containers: "", " ", or "\n" + up to kMaxIndent spaces. ws:
// 0 nothing yet, 1 one space (closed), 2 + k newline and k spaces.
bool TakeWhitespace(Frame& f, uint8_t c) {
  if (c == ' ') {
    if (f.ws == 0) {
      f.ws = 1;
      return true;
    }
    if (f.ws >= 2 && f.ws - 2 < kMaxIndent) {
      ++f.ws;
      return true;
    }
    return false;
  }
  if (c == '\n' && f.ws == 0) {
    f.ws = 2;
    return true;
  }
  return false;
}

bool NumberAccepting(const Frame& f) {
  return f.phase == kNumZero || f.phase == kNumInt || f.phase == kNumFrac || f.phase == kNumExp;
}

// Decodes the raw content of a JSON string the machine has validated (nlohmann's decoder:
// escapes, surrogate pairs).
std::string DecodeJsonString(std::string_view raw) {
  std::string quoted;
  quoted.reserve(raw.size() + 2);
  quoted += '"';
  quoted.append(raw);
  quoted += '"';
  const nlohmann::json v = nlohmann::json::parse(quoted, nullptr, /*allow_exceptions=*/false);
  return v.is_string() ? v.get<std::string>() : std::string(raw);
}

// The sub-range of literals [lo, hi) (sorted, sharing their first pos bytes) whose byte pos is c.
std::pair<int32_t, int32_t> Narrow(const std::vector<std::string>& lits, int32_t lo, int32_t hi,
                                   size_t pos, uint8_t c) {
  // Byte pos of literal i, -1 past its end: non-decreasing over the range.
  auto at = [&lits, pos](int32_t i) {
    return lits[i].size() > pos ? static_cast<int>(static_cast<uint8_t>(lits[i][pos])) : -1;
  };
  auto first_above = [&](int32_t from, int bound) {  // first i in [from, hi) with at(i) > bound
    int32_t a = from, b = hi;
    while (a < b) {
      const int32_t mid = a + (b - a) / 2;
      if (at(mid) > bound) {
        b = mid;
      } else {
        a = mid + 1;
      }
    }
    return a;
  };
  const int32_t first = first_above(lo, static_cast<int>(c) - 1);
  return {first, first_above(first, c)};
}

enum class NumStep { kTaken, kRejected, kEnded };

// One byte of the JSON number grammar (RFC 8259 section 6) with bounded digit runs: integer
// digits in f.a, fraction digits in f.b, exponent digits in f.ws. kEnded: the number is complete
// and the byte belongs to the container.
NumStep NumberStep(Frame& f, uint8_t c) {
  const bool integer = (f.flags & kIntegerFlag) != 0;
  const bool digit = IsDigit(c);
  auto to = [&f](uint8_t phase) {
    f.phase = phase;
    return NumStep::kTaken;
  };
  auto more = [digit](auto& count, int limit) {
    if (!digit || count >= limit) return false;
    ++count;
    return true;
  };
  switch (f.phase) {
    case kNumStart:
      if (c == '-') return to(kNumMinus);
      [[fallthrough]];
    case kNumMinus:
      if (c == '0') return to(kNumZero);
      if (!digit) return NumStep::kRejected;
      f.a = 1;
      return to(kNumInt);
    case kNumInt:
      if (more(f.a, kMaxIntDigits)) return NumStep::kTaken;
      [[fallthrough]];
    case kNumZero:
      if (!integer && c == '.') return to(kNumDot);
      break;
    case kNumDot:
      if (!digit) return NumStep::kRejected;
      f.b = 1;
      return to(kNumFrac);
    case kNumFrac:
      if (more(f.b, kMaxFracDigits)) return NumStep::kTaken;
      break;
    case kNumE:
      if (c == '+' || c == '-') return to(kNumESign);
      [[fallthrough]];
    case kNumESign:
      if (!digit) return NumStep::kRejected;
      f.ws = 1;
      return to(kNumExp);
    case kNumExp:
      return more(f.ws, kMaxExpDigits) ? NumStep::kTaken : NumStep::kEnded;
    default:
      return NumStep::kRejected;
  }
  // After the integer or fraction digits: an exponent may start, else the number has ended.
  if (!integer && (c == 'e' || c == 'E')) return to(kNumE);
  return NumStep::kEnded;
}

}  // namespace

Grammar BuiltinGrammar() {
  Grammar g;
  g.nodes.resize(kNumBuiltins);
  g.nodes[kAnyValue].kind = Kind::kAny;
  Node& obj = g.nodes[kAnyObject];
  obj.kind = Kind::kObject;
  obj.additional = kAnyValue;
  obj.first_required = {0};
  Node& arr = g.nodes[kAnyArray];
  arr.kind = Kind::kArray;
  arr.items = kAnyValue;
  g.nodes[kAnyString].kind = Kind::kString;
  g.nodes[kAnyNumber].kind = Kind::kNumber;
  g.literals = {"false", "true", "null"};
  g.nodes[kBoolNode].kind = Kind::kLiterals;
  g.nodes[kBoolNode].lit_begin = 0;
  g.nodes[kBoolNode].lit_end = 2;
  g.nodes[kNullNode].kind = Kind::kLiterals;
  g.nodes[kNullNode].lit_begin = 2;
  g.nodes[kNullNode].lit_end = 3;
  g.root = kAnyObject;
  return g;
}

Machine::Machine(const Grammar* g, int32_t root) : g_(g), root_(root) {
  static std::atomic<uint64_t> next_id{1};
  id_ = next_id.fetch_add(1);
}

MachineState Machine::Initial() const {
  MachineState s;
  Thread t;
  Frame f;
  f.kind = kValue;
  f.node = root_;
  t.stack.push_back(f);
  s.threads.push_back(std::move(t));
  return s;
}

// Pops the finished top value and tells its container.
void Machine::Pop(Thread& t) const {
  t.stack.pop_back();
  if (t.stack.empty()) return;
  Frame& p = t.stack.back();
  p.ws = 0;
  if (p.kind == kObj) {
    p.phase = p.phase == kObjInKey ? kObjAfterKey : kObjAfterValue;
  } else if (p.kind == kArr) {
    p.phase = kArrAfterValue;
    const Node& n = g_->nodes[p.node];
    // Counts past every bound that matters are equivalent: saturate (keeps
    // states canonical).
    const int64_t saturate = std::max<int64_t>(n.min_items, static_cast<int64_t>(n.prefix.size()));
    if (n.max_items == kUnbounded && p.a >= saturate) return;
    ++p.a;
  }
}

// Replaces the top kValue frame by the opening of a value of `node`'s container
// kind; false when nesting would pass kMaxStack.
bool Machine::OpenValue(Thread& t, int32_t node) const {
  if (t.stack.size() >= static_cast<size_t>(kMaxStack)) return false;
  Frame& f = t.stack.back();
  f = Frame{};
  f.kind = g_->nodes[node].kind == Kind::kObject ? kObj : kArr;
  f.node = node;
  f.b = -1;
  return true;
}

bool Machine::Advance(Thread& t, uint8_t c, std::vector<Thread>& forks) const {
  for (;;) {
    if (t.stack.empty()) return false;
    Frame& f = t.stack.back();
    switch (f.kind) {
      case kValue: {
        const Node& n = g_->nodes[f.node];
        switch (n.kind) {
          case Kind::kAny:
            if (c == '{') {
              f.node = kAnyObject;
            } else if (c == '[') {
              f.node = kAnyArray;
            } else if (c == '"') {
              f.node = kAnyString;
            } else if (c == '-' || IsDigit(c)) {
              f.node = kAnyNumber;
            } else if (c == 't' || c == 'f') {
              f.node = kBoolNode;
            } else if (c == 'n') {
              f.node = kNullNode;
            } else {
              return false;
            }
            continue;
          case Kind::kAnyOf: {
            // Alternatives 1.. run on copies; alternative 0 continues in t.
            for (size_t i = 1; i < n.alts.size(); ++i) {
              Thread copy = t;
              copy.stack.back().node = n.alts[i];
              if (Advance(copy, c, forks)) forks.push_back(std::move(copy));
            }
            f.node = n.alts[0];
            continue;
          }
          case Kind::kLiterals: {
            const int32_t lo = n.lit_begin, hi = n.lit_end;
            f = Frame{};
            f.kind = kLit;
            f.a = lo;
            f.b = hi;
            continue;
          }
          case Kind::kString: {
            if (c != '"') return false;
            const int32_t node = f.node;
            f = Frame{};
            f.kind = kStr;
            f.node = node;
            return true;
          }
          case Kind::kNumber:
          case Kind::kInteger: {
            const bool integer = n.kind == Kind::kInteger;
            const int32_t node = f.node;
            f = Frame{};
            f.kind = kNum;
            f.node = node;
            f.flags = integer ? kIntegerFlag : 0;
            continue;
          }
          case Kind::kObject:
            if (c != '{') return false;
            return OpenValue(t, f.node);
          case Kind::kArray:
            if (c != '[') return false;
            return OpenValue(t, f.node);
        }
        return false;
      }

      case kObj: {
        const Node& n = g_->nodes[f.node];
        const int32_t np = static_cast<int32_t>(n.props.size());
        switch (f.phase) {
          case kObjOpen:
          case kObjAfterComma: {
            if (TakeWhitespace(f, c)) return true;
            if (c == '}' && f.phase == kObjOpen && n.first_required[f.a] == np) {
              Pop(t);
              return true;
            }
            if (c != '"') return false;
            // The key that may come next: one of the declared properties from f.a up to the
            // first required one (one kKey thread over the sorted key table), or, when allowed,
            // an additional key (a second thread).
            f.phase = kObjInKey;
            f.ws = 0;
            const bool declared = f.a < np;
            if (n.additional >= 0) {
              Thread extra = t;
              Frame& of = extra.stack.back();
              of.b = -1;
              Frame k;
              k.kind = kStr;
              if (n.props.empty()) {
                k.node = kAnyString;  // any key: no declared name to keep it apart from
              } else {
                k.flags = kKeyFlag;
                k.node = of.node;
                extra.key.clear();
              }
              extra.stack.push_back(k);
              if (!declared) {
                t = std::move(extra);
                return true;
              }
              forks.push_back(std::move(extra));
            }
            if (!declared) return false;
            Frame k;
            k.kind = kKey;
            k.a = n.key_begin;
            k.b = n.key_end;
            k.node = 1;  // the opening quote
            t.stack.push_back(k);
            return true;
          }
          case kObjAfterKey:
            if (TakeWhitespace(f, c)) return true;
            if (c != ':') return false;
            f.phase = kObjAfterColon;
            f.ws = 0;
            return true;
          case kObjAfterColon: {
            if (TakeWhitespace(f, c)) return true;
            f.phase = kObjInValue;
            f.ws = 0;
            Frame v;
            v.kind = kValue;
            v.node = f.b >= 0 ? n.props[f.b].node : n.additional;
            t.stack.push_back(v);
            continue;
          }
          case kObjAfterValue:
            if (TakeWhitespace(f, c)) return true;
            if (c == ',') {
              if (f.a >= np && n.additional < 0) return false;  // no key could follow
              f.phase = kObjAfterComma;
              f.ws = 0;
              return true;
            }
            if (c == '}' && n.first_required[f.a] == np) {
              Pop(t);
              return true;
            }
            return false;
          default:
            return false;
        }
      }

      case kArr: {
        const Node& n = g_->nodes[f.node];
        auto item_node = [&n](int32_t i) {
          return i < static_cast<int32_t>(n.prefix.size()) ? n.prefix[i] : n.items;
        };
        switch (f.phase) {
          case kArrOpen:
          case kArrAfterComma: {
            if (TakeWhitespace(f, c)) return true;
            if (c == ']' && f.phase == kArrOpen && n.min_items == 0) {
              Pop(t);
              return true;
            }
            if (f.a >= n.max_items) return false;
            const int32_t item = item_node(f.a);
            if (item < 0) return false;
            f.phase = kArrInValue;
            f.ws = 0;
            Frame v;
            v.kind = kValue;
            v.node = item;
            t.stack.push_back(v);
            continue;
          }
          case kArrAfterValue:
            if (TakeWhitespace(f, c)) return true;
            if (c == ',' && f.a < n.max_items && item_node(f.a) >= 0) {
              f.phase = kArrAfterComma;
              f.ws = 0;
              return true;
            }
            if (c == ']' && f.a >= n.min_items) {
              Pop(t);
              return true;
            }
            return false;
          default:
            return false;
        }
      }

      case kStr: {
        const bool is_key = (f.flags & kKeyFlag) != 0;
        const Node* sn = is_key ? nullptr : &g_->nodes[f.node];
        const int64_t min_len = sn ? sn->min_len : 0;
        const int64_t max_len = sn ? sn->max_len : kUnbounded;
        auto count_char = [&f, min_len, max_len]() {
          // With no upper bound, counts past min_len are equivalent: saturate.
          if (max_len == kUnbounded && f.a >= min_len) return;
          ++f.a;
        };
        bool ok = false;
        switch (f.phase) {
          case kStrNormal:
            if (c == '"') {
              if (f.a < min_len) return false;
              if (sn != nullptr && sn->dfa >= 0 && !g_->dfas[sn->dfa].accept[f.r]) return false;
              if (is_key) {
                const std::string name = DecodeJsonString(t.key);
                for (const Property& p : g_->nodes[f.node].props) {
                  if (p.name == name) return false;  // a declared key read as an extra one
                }
                t.key.clear();
              }
              Pop(t);
              return true;
            }
            if (c < 0x20) return false;
            if (f.a >= max_len) return false;
            if (sn != nullptr && sn->dfa >= 0) {
              // A pattern string: unescaped characters only, each moving the DFA (a multi-byte
              // character is one kNonAscii symbol, taken at its lead byte).
              if (c == '\\') return false;
              const Dfa& dfa = g_->dfas[sn->dfa];
              const int32_t next = dfa.Next(f.r, c < 0x80 ? c : kNonAscii);
              if (next < 0) return false;
              // maxLength: the shortest match from here must still fit.
              if (max_len != kUnbounded && f.a + 1 + dfa.dist[next] > max_len) return false;
              f.r = next;
            }
            if (c == '\\') {
              f.phase = kStrEscape;
              ok = true;
            } else if (c < 0x80) {
              count_char();
              ok = true;
            } else {
              int rem = 0;
              uint8_t lo = 0x80, hi = 0xBF;
              if (c >= 0xC2 && c <= 0xDF) {
                rem = 1;
              } else if (c == 0xE0) {
                rem = 2, lo = 0xA0;
              } else if ((c >= 0xE1 && c <= 0xEC) || c == 0xEE || c == 0xEF) {
                rem = 2;
              } else if (c == 0xED) {
                rem = 2, hi = 0x9F;
              } else if (c == 0xF0) {
                rem = 3, lo = 0x90;
              } else if (c >= 0xF1 && c <= 0xF3) {
                rem = 3;
              } else if (c == 0xF4) {
                rem = 3, hi = 0x8F;
              } else {
                return false;
              }
              count_char();
              f.phase = kStrUtf8;
              f.b = rem | (lo << 8) | (hi << 16);
              ok = true;
            }
            break;
          case kStrUtf8: {
            const int rem = f.b & 0xFF;
            const int lo = (f.b >> 8) & 0xFF, hi = (f.b >> 16) & 0xFF;
            if (c < lo || c > hi) return false;
            if (rem == 1) {
              f.phase = kStrNormal;
              f.b = 0;
            } else {
              f.b = (rem - 1) | (0x80 << 8) | (0xBF << 16);
            }
            ok = true;
            break;
          }
          case kStrEscape:
            if (c == 'u') {
              f.phase = kStrHex;
              f.b = 0;
            } else if (std::strchr("\"\\/bfnrt", c) != nullptr && c != 0) {
              count_char();
              f.phase = kStrNormal;
            } else {
              return false;
            }
            ok = true;
            break;
          case kStrHex:
          case kStrHex + 1:
          case kStrHex + 2:
          case kStrHex + 3:
          case kStrLow:
          case kStrLow + 1:
          case kStrLow + 2:
          case kStrLow + 3: {
            // The four hex digits of \uXXXX (kStrHex) or of the low half of a surrogate pair
            // (kStrLow, which must be DC00-DFFF).
            const bool low = f.phase >= kStrLow;
            const int k = f.phase - (low ? kStrLow : kStrHex);  // digits read before this one
            const int h = HexValue(c);
            if (h < 0) return false;
            f.b = f.b * 16 + h;
            if (low && ((k == 0 && h != 0xD) || (k == 1 && h < 0xC))) return false;
            // A lone low surrogate (DC00-DFFF) is refused as soon as it is visible.
            if (!low && k == 1 && f.b >= 0xDC && f.b <= 0xDF) return false;
            ok = true;
            if (k < 3) {
              ++f.phase;
              break;
            }
            if (!low) count_char();
            f.phase = !low && f.b >= 0xD800 && f.b <= 0xDBFF ? kStrNeedBackslash : kStrNormal;
            f.b = 0;
            break;
          }
          case kStrNeedBackslash:
            if (c != '\\') return false;
            f.phase = kStrNeedU;
            ok = true;
            break;
          case kStrNeedU:
            if (c != 'u') return false;
            f.phase = kStrLow;
            f.b = 0;
            ok = true;
            break;
          default:
            return false;
        }
        if (ok && is_key) t.key += static_cast<char>(c);
        return ok;
      }

      case kNum: {
        const int32_t dfa = g_->nodes[f.node].dfa;
        if (dfa >= 0) {
          // A bounded integer: its DFA (every state it reaches can still end in range).
          const int32_t next = c < 0x80 ? g_->dfas[dfa].Next(f.r, c) : -1;
          if (next >= 0) {
            f.r = next;
            return true;
          }
          if (!g_->dfas[dfa].accept[f.r]) return false;
          Pop(t);
          continue;
        }
        const NumStep r = NumberStep(f, c);
        if (r != NumStep::kEnded) return r == NumStep::kTaken;
        Pop(t);
        continue;
      }

      case kKey: {
        // A declared key of the object below (its allowed window: f.a up to the first
        // required property), matched over the object's sorted key table.
        const Frame& obj = t.stack[t.stack.size() - 2];
        const Node& on = g_->nodes[obj.node];
        const int32_t last = on.first_required[obj.a];
        const size_t pos = static_cast<size_t>(f.node);
        const auto [lo, hi] = Narrow(g_->literals, f.a, f.b, pos, c);
        int32_t live = 0;  // keys in range and in the window
        int32_t prop = -1;
        for (int32_t i = lo; i < hi; ++i) {
          const int32_t p = on.key_prop[i - on.key_begin];
          if (p >= obj.a && p <= last) {
            ++live;
            prop = p;
          }
        }
        if (live == 0) return false;
        f.a = lo;
        f.b = hi;
        ++f.node;
        // Keys end with '"' and none is a prefix of another: the range is down to one.
        if (live == 1 && g_->literals[lo].size() == pos + 1 && hi - lo == 1) {
          Frame& parent = t.stack[t.stack.size() - 2];
          parent.b = prop;
          parent.a = prop + 1;
          Pop(t);
        }
        return true;
      }

      case kLit: {
        const std::vector<std::string>& lits = g_->literals;
        const size_t pos = static_cast<size_t>(f.node);
        const auto [lo, hi] = Narrow(lits, f.a, f.b, pos, c);
        if (lo < hi) {
          f.a = lo;
          f.b = hi;
          ++f.node;
          // A literal that cannot grow (not a number) ends at its last byte; no other literal
          // extends it (a JSON text other than a number is no prefix of another).
          const std::string& first = lits[lo];
          if (hi - lo == 1 && first.size() == pos + 1 &&
              !IsDigit(static_cast<uint8_t>(first.back()))) {
            Pop(t);
          }
          return true;
        }
        // No literal continues with c: a complete number literal (sorted first) ends here.
        if (lits[f.a].size() == pos) {
          Pop(t);
          continue;
        }
        return false;
      }
    }
    return false;
  }
}

bool Machine::Step(MachineState& s, uint8_t c) const {
  std::vector<Thread> forks;
  const size_t n = s.threads.size();
  size_t w = 0;
  for (size_t i = 0; i < n; ++i) {
    if (Advance(s.threads[i], c, forks)) {
      if (w != i) s.threads[w] = std::move(s.threads[i]);
      ++w;
    }
  }
  s.threads.resize(w);
  if (!forks.empty() || w > 1) {
    for (Thread& f : forks) s.threads.push_back(std::move(f));
    // Merge identical threads (the alternatives of an anyOf often converge).
    std::vector<Thread> unique;
    unique.reserve(s.threads.size());
    for (Thread& t : s.threads) {
      if (std::find(unique.begin(), unique.end(), t) == unique.end())
        unique.push_back(std::move(t));
    }
    if (unique.size() > kMaxThreads) unique.resize(kMaxThreads);
    s.threads = std::move(unique);
  }
  return !s.threads.empty();
}

bool Machine::IsNoOp(const MachineState& s, uint8_t c) const {
  if (!IsPlainStringByte(c) || s.threads.empty()) return false;
  for (const Thread& t : s.threads) {
    if (t.stack.empty()) return false;
    const Frame& f = t.stack.back();
    if (f.kind != kStr || f.phase != kStrNormal || (f.flags & kKeyFlag) != 0) return false;
    if (g_->nodes[f.node].dfa >= 0) return false;
    // Counts saturate at min_len when there is no maxLength (see count_char in Advance).
    const Node& n = g_->nodes[f.node];
    if (n.max_len != kUnbounded || f.a < n.min_len) return false;
  }
  return true;
}

bool Machine::TakesPlainRun(const MachineState& s, int n) const {
  if (s.threads.empty()) return false;
  for (const Thread& t : s.threads) {
    if (t.stack.empty()) return false;
    const Frame& f = t.stack.back();
    if (f.kind != kStr || f.phase != kStrNormal || (f.flags & kKeyFlag) != 0) return false;
    if (g_->nodes[f.node].dfa >= 0) return false;
    if (g_->nodes[f.node].max_len - f.a < n) return false;
  }
  return true;
}

bool Machine::CanEnd(const MachineState& s) const {
  for (const Thread& t : s.threads) {
    if (t.stack.empty()) return true;
    if (t.stack.size() != 1) continue;
    const Frame& f = t.stack.back();
    if (f.kind == kNum) {
      const int32_t dfa = g_->nodes[f.node].dfa;
      if (dfa >= 0 ? g_->dfas[dfa].accept[f.r] != 0 : NumberAccepting(f)) return true;
    }
    if (f.kind == kLit && static_cast<size_t>(f.node) == g_->literals[f.a].size()) return true;
  }
  return false;
}

bool Machine::MustEnd(const MachineState& s) const {
  if (!CanEnd(s)) return false;
  for (int c = 0; c < 256; ++c) {
    MachineState copy = s;
    if (Step(copy, static_cast<uint8_t>(c))) return false;
  }
  return true;
}

void Machine::Key(const MachineState& s, int horizon, std::string* out) const {
  out->clear();
  out->append(reinterpret_cast<const char*>(&id_), sizeof id_);
  for (const Thread& t : s.threads) {
    const uint32_t frames = static_cast<uint32_t>(t.stack.size());
    const uint32_t key = static_cast<uint32_t>(t.key.size());
    out->append(reinterpret_cast<const char*>(&frames), sizeof frames);
    for (Frame f : t.stack) {
      // A string's length cannot matter within `horizon` more characters when it has reached
      // minLength and maxLength is further away: one key for all such lengths.
      if (f.kind == kStr && (f.flags & kKeyFlag) == 0) {
        const Node& n = g_->nodes[f.node];
        // (With a pattern the shortest match decides, whatever the horizon.)
        if (n.dfa < 0 && f.a >= n.min_len && n.max_len - f.a > horizon) f.a = -1;
      }
      out->append(reinterpret_cast<const char*>(&f), sizeof f);
    }
    out->append(reinterpret_cast<const char*>(&key), sizeof key);
    out->append(t.key);
  }
}

}  // namespace coli::grammar::internal
