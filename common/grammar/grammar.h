// common/grammar internals: the compiled form of a JSON schema (a graph of
// Nodes) and the byte-level pushdown machine that walks it. Not part of the
// public API (json_constraint.h).
//
// Design. A schema compiles to Nodes (object, array, string, number, integer,
// literal set, anyOf, any). The machine's state is a small set of THREADS (one
// per live alternative of an anyOf / enum / object key choice); each thread is
// a stack of 20-byte Frames, one per open value. A byte is fed to every thread;
// a thread that cannot take it dies; identical threads are merged. So the
// matcher is exact (no lookahead heuristics) and cheap to copy when, as almost
// always, one thread is alive.
//
// Whitespace policy (bounded, so bounded schemas terminate): between the tokens
// of an object or array ('{' '}' '[' ']' ':' ',' and the values) a run is one
// of: nothing, one space, or one newline followed by at most kMaxIndent spaces.
// The top-level value has no whitespace before or after it. This covers compact
// output, json.dumps' default ", " / ": " separators, and pretty-printing with
// indent up to kMaxIndent.
#ifndef COLI_COMMON_GRAMMAR_GRAMMAR_H_
#define COLI_COMMON_GRAMMAR_GRAMMAR_H_

#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "common/grammar/json_constraint.h"
#include "common/grammar/regex.h"
#include "nlohmann/json.hpp"

namespace coli::grammar::internal {

inline constexpr int kMaxIndent = 64;  // spaces after a newline in one whitespace run
// Digits before '.': 20, so every uint64 can be written (20-digit values past 18446744073709551615
// are taken too, and read back rounded: 99999999999999999999 as 1e+20).
inline constexpr int kMaxIntDigits = 20;
inline constexpr int kMaxFracDigits = 24;  // digits after '.' (repr of any double fits)
// Digits of an exponent: two, so every number a matcher lets through is a finite double (at most
// 20 + 24 digits times 10^99); with three, `1e999` read as infinity and reached clients as null.
inline constexpr int kMaxExpDigits = 2;
inline constexpr int kMaxStack = 96;  // open values (nesting) in one thread
// Live alternatives kept per state. Dropping threads past this is sound (each kept thread is a
// valid parse that can complete) and only narrows what is allowed; only pathological schemas
// (nested overlapping anyOf) get near it.
inline constexpr size_t kMaxThreads = 256;
inline constexpr int64_t kUnbounded = std::numeric_limits<int32_t>::max();

enum class Kind : uint8_t { kAny, kObject, kArray, kString, kNumber, kInteger, kLiterals, kAnyOf };

struct Property {
  std::string name;  // decoded
  int32_t node = 0;
  bool required = false;
};

struct Node {
  Kind kind = Kind::kAny;
  // kObject: declared properties in schema order; additional = node for other
  // keys or -1.
  std::vector<Property> props;
  int32_t additional = -1;
  // first_required[i]: smallest required index >= i (props.size() when none);
  // size n + 1.
  std::vector<int32_t> first_required;
  // The JSON-encoded keys ("\"name\"") are literals [key_begin, key_end), sorted bytewise;
  // key_prop[i - key_begin] is the property literal i names.
  int32_t key_begin = 0, key_end = 0;
  std::vector<int32_t> key_prop;
  // kArray: item i is prefix[i] when i < prefix.size(), else items (-1: no more
  // items).
  std::vector<int32_t> prefix;
  int32_t items = -1;
  int64_t min_items = 0,
          max_items = kUnbounded;  // max already capped by prefix when items -1
  // kString: length in characters (code points); dfa: index into Grammar::dfas of the
  // `pattern` / `format` the decoded value must match (-1: none). A string with a dfa takes no
  // escapes (regex.h) and has no length bounds.
  int64_t min_len = 0, max_len = kUnbounded;
  int32_t dfa = -1;
  // kLiterals: the range [lit_begin, lit_end) of Grammar::literals (whole JSON texts, compact,
  // sorted bytewise and unique, so the members sharing a prefix stay a contiguous range).
  int32_t lit_begin = 0, lit_end = 0;
  // kAnyOf
  std::vector<int32_t> alts;
};

// Built-in nodes present in every grammar (the "any JSON value" machinery).
enum BuiltinNode : int32_t {
  kAnyValue = 0,
  kAnyObject = 1,
  kAnyArray = 2,
  kAnyString = 3,
  kAnyNumber = 4,
  kBoolNode = 5,
  kNullNode = 6,
  kNumBuiltins = 7,
};

struct Grammar {
  std::vector<Node> nodes;
  std::vector<std::string> literals;
  std::vector<Dfa> dfas;
  int32_t root = kAnyObject;
};

// A grammar holding only the built-ins (root: any object).
Grammar BuiltinGrammar();

// Compiles a JSON schema (already parsed, keys in document order) into a
// grammar. `path` names the schema in error messages ("schema",
// "response_format.json_schema.schema").
absl::StatusOr<Grammar> CompileSchema(const nlohmann::ordered_json& schema, std::string path);

// ---- the machine ----------------------------------------------------------------------------

enum FrameKind : uint8_t { kValue, kObj, kArr, kStr, kNum, kLit, kKey };

// kLit / kKey frames: [a, b) is the range of literals still matching, node the bytes matched
// so far (a kKey frame sits on its object's frame, which gives the allowed properties).
struct Frame {
  uint8_t kind = kValue;
  uint8_t phase = 0;
  uint8_t ws = 0;     // whitespace run state (containers) / exponent digits (numbers)
  uint8_t flags = 0;  // kStr: kKeyFlag; kNum: kIntegerFlag
  int32_t node = 0;
  int32_t a = 0;
  int32_t b = 0;
  int32_t r = 0;  // kStr with a pattern: the DFA state
  bool operator==(const Frame&) const = default;
};

struct Thread {
  std::vector<Frame> stack;
  std::string key;  // raw bytes of an additional-property key being read (only then)
  bool operator==(const Thread&) const = default;
};

struct MachineState {
  std::vector<Thread> threads;
  bool operator==(const MachineState&) const = default;
};

// Stateless rules over one grammar.
class Machine {
 public:
  explicit Machine(const Grammar* g) : Machine(g, g->root) {}
  // A machine whose values start at `root` (a node of g) instead of g's root: one property's
  // value inside an object schema, sharing the whole schema's nodes.
  Machine(const Grammar* g, int32_t root);
  // Unique per machine for the life of the process (memoisation keys name it).
  uint64_t id() const { return id_; }
  MachineState Initial() const;
  // Feeds one byte; false (state unspecified) when no thread can take it.
  bool Step(MachineState& s, uint8_t c) const;
  // Whether Step(s, c) would succeed and leave s exactly as it is (plain ASCII content of a
  // string whose length no longer matters, in every thread): lets the token filter skip the copy.
  bool IsNoOp(const MachineState& s, uint8_t c) const;
  // Whether every thread is inside a string (plain content, not an object key) that takes n
  // more characters: then any n plain bytes are accepted.
  bool TakesPlainRun(const MachineState& s, int n) const;
  // A byte that is one whole character of string content: ASCII 0x20-0x7F but '"' and '\\'.
  static bool IsPlainStringByte(uint8_t c) {
    return c >= 0x20 && c < 0x80 && c != '"' && c != '\\';
  }
  bool CanEnd(const MachineState& s) const;
  // CanEnd and no byte can follow.
  bool MustEnd(const MachineState& s) const;
  // A byte string identifying this machine and the state (for memoisation) as far as any input
  // of at most `horizon` bytes can tell: states with equal keys accept the same such inputs.
  void Key(const MachineState& s, int horizon, std::string* out) const;

 private:
  bool Advance(Thread& t, uint8_t c, std::vector<Thread>& forks) const;
  void Pop(Thread& t) const;
  bool OpenValue(Thread& t, int32_t node) const;
  const Grammar* g_;
  int32_t root_;
  uint64_t id_;
};

}  // namespace coli::grammar::internal

namespace coli::grammar {
// A matcher made from a null constraint (response_format text) accepts every
// byte.
struct JsonMatcher::State {
  std::shared_ptr<const JsonConstraint> owner;
  const internal::Machine* machine = nullptr;  // null: unconstrained
  internal::MachineState m;
  int64_t consumed = 0;
};
}  // namespace coli::grammar

#endif  // COLI_COMMON_GRAMMAR_GRAMMAR_H_
