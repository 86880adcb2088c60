// common/grammar internals: a practical ECMA-262 / Python `re` regex subset compiled to a DFA
// that runs over the DECODED value of a JSON string (used for `pattern` and `format`).
//
// Alphabet: the 128 ASCII bytes plus one symbol, kNonAscii, that stands for any one non-ASCII
// character (its UTF-8 continuation bytes do not move the DFA). Non-ASCII characters can only be
// matched by '.' and by negated classes without shorthands; a pattern that names one is refused.
// Shorthands are ASCII: \d = [0-9], \w = [A-Za-z0-9_], \s = the ASCII spaces (their negations are
// ASCII too), a subset of both ECMA's and Python's readings, so every match is a match in both.
//
// Search semantics (JSON Schema: a pattern is unanchored, the string must CONTAIN a match; Python
// jsonschema uses re.search): the DFA accepts at the end of the string when some substring
// matched, honouring ^ (start of the string) and $ (end of the string) assertions.
//
// The DFA is trimmed: a transition is kept only when some accepting end is still reachable with
// the bytes a pattern string may take (printable ASCII except '"' and '\\', any non-ASCII
// character), so every accepted prefix can complete.
#ifndef COLI_COMMON_GRAMMAR_REGEX_H_
#define COLI_COMMON_GRAMMAR_REGEX_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace coli::grammar::internal {

inline constexpr int kNonAscii = 128;
inline constexpr int kRegexSymbols = 129;
inline constexpr int kMaxDfaStates = 4096;

struct Dfa {
  // next[state * kRegexSymbols + symbol]: the next state, -1 when refused (no match could
  // complete). State 0 is the start.
  std::vector<int32_t> next;
  std::vector<uint8_t> accept;  // accept[state]: the string may end here
  std::vector<int32_t> dist;    // dist[state]: fewest characters from it to an accepting state
  int32_t states() const { return static_cast<int32_t>(accept.size()); }
  int32_t Next(int32_t state, int symbol) const { return next[state * kRegexSymbols + symbol]; }
};

// Whether a decoded character may be written unescaped in a pattern-constrained string.
inline bool RegexSymbolAllowed(int symbol) {
  return symbol == kNonAscii || (symbol >= 0x20 && symbol < 0x80 && symbol != '"' && symbol != '\\');
}

// Compiles `pattern`. Errors (INVALID_ARGUMENT) are prefixed with `path`: unsupported syntax
// (backreferences, lookaround, \b, named groups, flags, non-ASCII literals), a pattern no
// allowed string matches, or one needing more than kMaxDfaStates states.
absl::StatusOr<Dfa> CompileRegex(std::string_view pattern, std::string_view path);

// The pattern used for a `format` value, or empty when the format is not one we enforce.
std::string_view FormatPattern(std::string_view format);

}  // namespace coli::grammar::internal

#endif  // COLI_COMMON_GRAMMAR_REGEX_H_
