// tools/coli/chat_keys: the terminal's keys as `coli chat`'s line editor (libedit) reads them.
//
// Two jobs libedit's readline layer does not do:
//  - It wants whole characters from a read hook, not bytes: typed UTF-8 is decoded here into code
//    points (libedit's own reader drops every non-ASCII character when the process runs in the
//    C locale, which is how the chat started before).
//  - Bracketed paste (xterm's mode 2004: the terminal wraps pasted text in ESC[200~ … ESC[201~):
//    a paste that holds a line break, a tab or another control character is taken out of the key
//    stream whole, so its lines do not each end the input line (one turn per pasted line) and its
//    tabs (and C1 controls, Meta keys to libedit) do not run editor commands. It reaches the editor as one '\r' (the line typed so far is
//    accepted) and the chat takes the text with TakePaste(). A paste of plain text on one line
//    is typed into the line as if it were keys. Pasted CR LF and CR become LF; line breaks at the
//    end of a paste are dropped (a copied line usually ends in one). A paste cut short by the
//    end of input (Ctrl-C) is dropped.
// The byte source is a function so the logic is tested without a terminal.
#ifndef COLI_TOOLS_COLI_CHAT_KEYS_H_
#define COLI_TOOLS_COLI_CHAT_KEYS_H_

#include <deque>
#include <functional>
#include <optional>
#include <string>

namespace coli::cli {

class TerminalKeys {
 public:
  // What a byte source returns besides a byte (0–255).
  static constexpr int kEnd = -1;       // end of input, or a read the chat wants to stop
  static constexpr int kTimedOut = -2;  // no byte within the timeout
  // How long to wait, after an ESC, for the rest of a paste marker: a terminal sends the marker
  // in one write, while an ESC key alone is followed by nothing.
  static constexpr int kEscapeWaitMs = 50;

  // read_byte(timeout_ms): the next byte, kTimedOut, or kEnd; timeout_ms < 0 waits.
  explicit TerminalKeys(std::function<int(int timeout_ms)> read_byte)
      : read_byte_(std::move(read_byte)) {}

  // The next character for the editor: a Unicode code point, or kEnd.
  int Next();
  // The paste that the last '\r' from Next() stood for, once.
  std::optional<std::string> TakePaste();
  // Whether input that is not UTF-8 came since the last call (its first bad byte, for the
  // message).
  std::optional<int> TakeInvalidByte();
  // Forgets a paste and characters not handed out yet (the line was interrupted).
  void Reset();

 private:
  int Decode(int lead);  // the code point that starts with `lead`
  int AfterEscape();
  int ReadPaste();
  int ReadByte(int timeout_ms);

  std::function<int(int)> read_byte_;
  std::deque<int> queued_;       // characters decided, not handed out yet
  std::optional<int> pushback_;  // a byte read ahead, not decoded yet
  bool ended_ = false;           // kEnd was read ahead
  std::optional<std::string> paste_;
  std::optional<int> invalid_byte_;
};

// Decodes well-formed UTF-8 into code points; nullopt when `text` is not UTF-8.
std::optional<std::u32string> DecodeUtf8(const std::string& text);

}  // namespace coli::cli

#endif  // COLI_TOOLS_COLI_CHAT_KEYS_H_
