// common/tokenizer/pretokenizer: splits text into the pieces BPE runs on, with PCRE2 + JIT.
//
//   COLI_ASSIGN_OR_RETURN(auto split, PreTokenizer::FromPattern(kKimiPattern));
//   split->ForEachPiece(text, [&](std::string_view piece) { ... });
//
// Patterns arrive in tiktoken / fancy-regex syntax (the `pat_str` of tiktoken, the Split regex
// of a tokenizer.json). PCRE2 differs from that syntax in three places, all handled here:
//  * `&&` class intersection does not exist. The only pattern that uses it is Kimi's
//    (`[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]`); it is recognised verbatim and replaced by
//    the complement form `[^\p{sc:Han}\p{Ll}\p{N}\p{P}\p{S}\p{Z}\p{C}]`. The general
//    categories partition all code points, so "not Han and not in Ll/N/P/S/Z/C" is exactly
//    "in Lu/Lt/Lm/Lo/M and not Han" (tests check this on every code point).
//  * A bare script name like `\p{Han}` means Script=Han in Rust's regex but Script_Extensions
//    in PCRE2 >= 10.40 (which would pull in e.g. U+3006 〆 or U+302A); scripts become
//    `\p{sc:Name}`.
//  * `\s` is Unicode White_Space in Rust; PCRE2 documents its UCP `\s` as "Z or tab, LF, VT,
//    FF, CR", which need not agree (U+0085 is Cc). `\s`/`\S` become explicit White_Space
//    classes so the set does not depend on the PCRE2 version.
// Any other `&&` is refused (UNIMPLEMENTED) rather than guessed.
#ifndef COLI_COMMON_TOKENIZER_PRETOKENIZER_H_
#define COLI_COMMON_TOKENIZER_PRETOKENIZER_H_

#include <memory>
#include <string>
#include <string_view>

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"

namespace coli::tok {

// The split patterns of the families coli knows, in tiktoken syntax (the vendors' strings).
extern const char kKimiPattern[];
extern const char kO200kPattern[];
extern const char kCl100kPattern[];
extern const char kGpt2Pattern[];  // also the ByteLevel(use_regex=true) pre-tokenizer

enum class PatternFamily { kKimi, kO200k, kCl100k, kGpt2, kCustom };
std::string_view PatternFamilyName(PatternFamily family);

// Which family a tiktoken-syntax pattern is. Exact string comparison with the vendors'
// patterns; anything else is kCustom.
PatternFamily DetectFamily(std::string_view pattern);

// Translates a tiktoken / fancy-regex pattern to PCRE2 syntax (see the file comment).
absl::StatusOr<std::string> TranslateToPcre2(std::string_view pattern);

class PreTokenizer {
 public:
  // Compiles `pattern` (tiktoken syntax) with PCRE2_UTF | PCRE2_UCP and JIT.
  // INVALID_ARGUMENT when PCRE2 rejects the translated pattern (the message quotes it).
  static absl::StatusOr<std::unique_ptr<PreTokenizer>> FromPattern(std::string_view pattern);
  ~PreTokenizer();
  PreTokenizer(const PreTokenizer&) = delete;
  PreTokenizer& operator=(const PreTokenizer&) = delete;

  // Calls fn once per regex match of `text` (valid UTF-8), left to right, matches found as
  // tiktoken's find_iter does. When `keep_gaps` is true, text between matches is passed as
  // pieces too (Hugging Face Split "Isolated"); tiktoken drops it. Thread-safe.
  void ForEachPiece(std::string_view text, bool keep_gaps,
                    absl::FunctionRef<void(std::string_view)> fn) const;

  PatternFamily family() const { return family_; }
  const std::string& pattern() const { return pattern_; }
  const std::string& pcre2_pattern() const { return pcre2_pattern_; }

 private:
  PreTokenizer() = default;
  PatternFamily family_ = PatternFamily::kCustom;
  std::string pattern_, pcre2_pattern_;
  void* code_ = nullptr;  // pcre2_code_8*
  bool jit_ = false;
};

}  // namespace coli::tok

#endif  // COLI_COMMON_TOKENIZER_PRETOKENIZER_H_
