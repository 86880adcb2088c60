#include "tools/coli/chat_keys.h"

#include <string_view>

namespace coli::cli {
namespace {

constexpr std::string_view kPasteStart = "[200~";  // after ESC
constexpr std::string_view kPasteEnd = "\x1b[201~";
constexpr int kReplacement = 0xFFFD;

// The length of a UTF-8 sequence from its lead byte, 0 for a byte that cannot lead one.
int SequenceLength(int lead) {
  if (lead < 0x80) return 1;
  if (lead >= 0xC2 && lead <= 0xDF) return 2;
  if (lead >= 0xE0 && lead <= 0xEF) return 3;
  if (lead >= 0xF0 && lead <= 0xF4) return 4;
  return 0;
}

// RFC 3629's limits on the second byte (no overlongs, no surrogates, nothing past U+10FFFF).
bool SecondByteFits(int lead, int second) {
  if ((second & 0xC0) != 0x80) return false;
  if (lead == 0xE0) return second >= 0xA0;
  if (lead == 0xED) return second <= 0x9F;
  if (lead == 0xF0) return second >= 0x90;
  if (lead == 0xF4) return second <= 0x8F;
  return true;
}

int LeadBits(int lead, int length) { return length == 1 ? lead : lead & (0xFF >> (length + 1)); }

bool IsControl(unsigned char c) { return c < 0x20 || c == 0x7F; }

}  // namespace

std::optional<std::u32string> DecodeUtf8(const std::string& text) {
  std::u32string out;
  for (size_t i = 0; i < text.size();) {
    const int lead = static_cast<unsigned char>(text[i]);
    const int length = SequenceLength(lead);
    if (length == 0 || i + length > text.size()) return std::nullopt;
    char32_t cp = LeadBits(lead, length);
    for (int k = 1; k < length; ++k) {
      const int b = static_cast<unsigned char>(text[i + k]);
      if (k == 1 ? !SecondByteFits(lead, b) : (b & 0xC0) != 0x80) return std::nullopt;
      cp = (cp << 6) | (b & 0x3F);
    }
    out.push_back(cp);
    i += length;
  }
  return out;
}

int TerminalKeys::ReadByte(int timeout_ms) {
  if (pushback_.has_value()) {
    const int b = *pushback_;
    pushback_.reset();
    return b;
  }
  if (ended_) return kEnd;
  const int b = read_byte_(timeout_ms);
  if (b == kEnd) ended_ = true;
  return b;
}

int TerminalKeys::Next() {
  if (!queued_.empty()) {
    const int c = queued_.front();
    queued_.pop_front();
    return c;
  }
  const int b = ReadByte(-1);
  if (b < 0) return kEnd;
  if (b == 0x1B) return AfterEscape();
  return Decode(b);
}

int TerminalKeys::Decode(int lead) {
  const int length = SequenceLength(lead);
  if (length == 1) return lead;
  if (length == 0) {
    if (!invalid_byte_.has_value()) invalid_byte_ = lead;
    return kReplacement;
  }
  int cp = LeadBits(lead, length);
  for (int k = 1; k < length; ++k) {
    const int b = ReadByte(kEscapeWaitMs);
    if (b < 0 || (k == 1 ? !SecondByteFits(lead, b) : (b & 0xC0) != 0x80)) {
      if (!invalid_byte_.has_value()) invalid_byte_ = lead;
      if (b >= 0) pushback_ = b;  // it may start the next character
      return kReplacement;
    }
    cp = (cp << 6) | (b & 0x3F);
  }
  return cp;
}

int TerminalKeys::AfterEscape() {
  for (size_t matched = 0; matched < kPasteStart.size(); ++matched) {
    const int b = ReadByte(kEscapeWaitMs);
    if (b == static_cast<unsigned char>(kPasteStart[matched])) continue;
    // Not a paste (an arrow key, Alt+key, ESC alone): the bytes go on to the editor as they came.
    for (size_t k = 0; k < matched; ++k) queued_.push_back(kPasteStart[k]);
    if (b >= 0) {
      if (matched == 0 && b == 0x1B) {
        pushback_ = b;
      } else if (b < 0x80) {
        queued_.push_back(b);
      } else {
        queued_.push_back(Decode(b));
      }
    }
    return 0x1B;
  }
  return ReadPaste();
}

int TerminalKeys::ReadPaste() {
  std::string text;
  while (true) {
    const int b = ReadByte(-1);
    // Ctrl-C (or the terminal gone) mid-paste: the paste goes, as a line interrupted goes.
    if (b < 0) return kEnd;
    text.push_back(static_cast<char>(b));
    if (text.size() >= kPasteEnd.size() &&
        std::string_view(text).substr(text.size() - kPasteEnd.size()) == kPasteEnd) {
      text.resize(text.size() - kPasteEnd.size());
      break;
    }
  }
  std::string normalized;  // CR LF and CR become LF
  normalized.reserve(text.size());
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '\r') {
      normalized.push_back('\n');
      if (i + 1 < text.size() && text[i + 1] == '\n') ++i;
    } else {
      normalized.push_back(text[i]);
    }
  }
  while (!normalized.empty() && normalized.back() == '\n') normalized.pop_back();
  if (normalized.empty()) return Next();  // nothing was pasted

  bool plain = true;
  for (unsigned char c : normalized) plain = plain && !IsControl(c);
  std::optional<std::u32string> decoded = DecodeUtf8(normalized);
  if (decoded.has_value()) {  // C1 controls (U+0080–U+009F) are Meta keys to the editor
    for (char32_t cp : *decoded) plain = plain && !(cp >= 0x80 && cp <= 0x9F);
  }
  if (plain && decoded.has_value()) {
    for (char32_t cp : *decoded) queued_.push_back(static_cast<int>(cp));
    return Next();
  }
  paste_ = std::move(normalized);
  return '\r';
}

std::optional<std::string> TerminalKeys::TakePaste() {
  std::optional<std::string> paste = std::move(paste_);
  paste_.reset();
  return paste;
}

std::optional<int> TerminalKeys::TakeInvalidByte() {
  std::optional<int> b = invalid_byte_;
  invalid_byte_.reset();
  return b;
}

void TerminalKeys::Reset() {
  ended_ = false;  // a read interrupted by Ctrl-C ends one line, not the input
  queued_.clear();
  paste_.reset();
  invalid_byte_.reset();
}

}  // namespace coli::cli
