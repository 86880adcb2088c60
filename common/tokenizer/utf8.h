// common/tokenizer/utf8: the UTF-8 rules the tokenizer applies to its input and output.
//
//   std::string clean = coli::tok::ReplaceInvalidUtf8(bytes);   // U+FFFD per maximal subpart
//   size_t n = coli::tok::CompleteUtf8Prefix(pending);           // streaming: emit [0, n)
//
// Invalid input bytes are replaced the way Python's `bytes.decode("utf-8", "replace")` and the
// WHATWG TextDecoder do it (Unicode's "maximal subpart" practice, Unicode §3.9 / Table 3-7):
// each maximal prefix of a well-formed sequence that cannot be completed becomes one U+FFFD.
// tiktoken only ever sees text (a Python str or a JS string), so this is the byte-level
// equivalent of what reaches it.
#ifndef COLI_COMMON_TOKENIZER_UTF8_H_
#define COLI_COMMON_TOKENIZER_UTF8_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace coli::tok {

// Length of the well-formed UTF-8 sequence starting at text[0]: 1..4, or 0 when text starts
// with an ill-formed sequence. When the bytes present are a valid but truncated prefix of a
// sequence, returns 0 and sets *truncated (if given) to true.
size_t Utf8SequenceLength(std::string_view text, bool* truncated = nullptr);

// Length of the maximal subpart of an ill-formed sequence at text[0] (>= 1): the bytes that one
// U+FFFD replaces.
size_t Utf8MaximalSubpart(std::string_view text);

// True when every byte of `text` belongs to a well-formed UTF-8 sequence.
bool IsValidUtf8(std::string_view text);

// `text` with each maximal subpart of an ill-formed sequence replaced by U+FFFD (EF BF BD).
std::string ReplaceInvalidUtf8(std::string_view text);

// Streaming: the length of the longest prefix of `pending` that a decoder may emit now, i.e.
// everything except a trailing valid-but-incomplete sequence (at most 3 bytes).
size_t CompleteUtf8Prefix(std::string_view pending);

// Decodes the well-formed sequence at text[0] (length from Utf8SequenceLength).
char32_t DecodeUtf8(std::string_view text, size_t length);

// Python's str.isspace() for one code point (used by the vendor's long-input slicing).
bool IsPythonSpace(char32_t c);

}  // namespace coli::tok

#endif  // COLI_COMMON_TOKENIZER_UTF8_H_
