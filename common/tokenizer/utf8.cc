#include "common/tokenizer/utf8.h"

namespace coli::tok {
namespace {

// Unicode Table 3-7: the allowed range of the second byte depends on the lead byte; later
// continuation bytes are always 80..BF.
struct LeadInfo {
  int length;  // 0: never valid as a lead byte
  uint8_t second_lo, second_hi;
};

LeadInfo Lead(uint8_t b) {
  if (b < 0x80) return {1, 0, 0};
  if (b >= 0xC2 && b <= 0xDF) return {2, 0x80, 0xBF};
  if (b == 0xE0) return {3, 0xA0, 0xBF};
  if ((b >= 0xE1 && b <= 0xEC) || b == 0xEE || b == 0xEF) return {3, 0x80, 0xBF};
  if (b == 0xED) return {3, 0x80, 0x9F};  // no surrogates
  if (b == 0xF0) return {4, 0x90, 0xBF};
  if (b >= 0xF1 && b <= 0xF3) return {4, 0x80, 0xBF};
  if (b == 0xF4) return {4, 0x80, 0x8F};  // nothing past U+10FFFF
  return {0, 0, 0};
}

// Number of leading bytes of `text` that are a valid prefix of one sequence (>= 1 if the lead
// byte is valid), and the full length the lead byte announces.
size_t ValidPrefix(std::string_view text, int* full) {
  const auto* p = reinterpret_cast<const uint8_t*>(text.data());
  LeadInfo info = Lead(p[0]);
  *full = info.length;
  if (info.length == 0) return 0;
  if (info.length == 1) return 1;
  size_t n = 1;
  if (text.size() < 2 || p[1] < info.second_lo || p[1] > info.second_hi) return n;
  n = 2;
  for (int i = 2; i < info.length; ++i) {
    if (text.size() <= static_cast<size_t>(i) || (p[i] & 0xC0) != 0x80) return n;
    ++n;
  }
  return n;
}

}  // namespace

size_t Utf8SequenceLength(std::string_view text, bool* truncated) {
  if (truncated) *truncated = false;
  if (text.empty()) return 0;
  int full = 0;
  size_t prefix = ValidPrefix(text, &full);
  if (full > 0 && prefix == static_cast<size_t>(full)) return prefix;
  if (truncated && full > 0 && prefix == text.size()) *truncated = true;
  return 0;
}

size_t Utf8MaximalSubpart(std::string_view text) {
  if (text.empty()) return 0;
  int full = 0;
  size_t prefix = ValidPrefix(text, &full);
  return prefix == 0 ? 1 : prefix;
}

bool IsValidUtf8(std::string_view text) {
  size_t i = 0;
  while (i < text.size()) {
    if (static_cast<uint8_t>(text[i]) < 0x80) {
      ++i;
      continue;
    }
    size_t n = Utf8SequenceLength(text.substr(i));
    if (n == 0) return false;
    i += n;
  }
  return true;
}

std::string ReplaceInvalidUtf8(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  size_t i = 0;
  while (i < text.size()) {
    // Copy the longest run of ASCII in one go (the common case).
    size_t j = i;
    while (j < text.size() && static_cast<uint8_t>(text[j]) < 0x80) ++j;
    out.append(text.data() + i, j - i);
    i = j;
    if (i >= text.size()) break;
    size_t n = Utf8SequenceLength(text.substr(i));
    if (n > 0) {
      out.append(text.data() + i, n);
      i += n;
    } else {
      out.append("\xEF\xBF\xBD");
      i += Utf8MaximalSubpart(text.substr(i));
    }
  }
  return out;
}

size_t CompleteUtf8Prefix(std::string_view pending) {
  // Only the last (up to) 3 bytes can be an incomplete sequence.
  size_t start = pending.size() > 3 ? pending.size() - 3 : 0;
  for (size_t i = start; i < pending.size(); ++i) {
    auto b = static_cast<uint8_t>(pending[i]);
    if ((b & 0xC0) == 0x80) continue;  // continuation byte: not a sequence start
    bool truncated = false;
    Utf8SequenceLength(pending.substr(i), &truncated);
    if (truncated) return i;
  }
  return pending.size();
}

char32_t DecodeUtf8(std::string_view text, size_t length) {
  const auto* p = reinterpret_cast<const uint8_t*>(text.data());
  switch (length) {
    case 1:
      return p[0];
    case 2:
      return (char32_t{p[0] & 0x1Fu} << 6) | (p[1] & 0x3Fu);
    case 3:
      return (char32_t{p[0] & 0x0Fu} << 12) | (char32_t{p[1] & 0x3Fu} << 6) | (p[2] & 0x3Fu);
    case 4:
      return (char32_t{p[0] & 0x07u} << 18) | (char32_t{p[1] & 0x3Fu} << 12) |
             (char32_t{p[2] & 0x3Fu} << 6) | (p[3] & 0x3Fu);
    default:
      return 0xFFFD;
  }
}

bool IsPythonSpace(char32_t c) {
  // CPython's _PyUnicode_IsWhitespace: bidirectional class WS, B or S, or category Zs.
  if (c <= 0x20) return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20);
  switch (c) {
    case 0x85:
    case 0xA0:
    case 0x1680:
    case 0x2028:
    case 0x2029:
    case 0x202F:
    case 0x205F:
    case 0x3000:
      return true;
    default:
      return c >= 0x2000 && c <= 0x200A;
  }
}

}  // namespace coli::tok
