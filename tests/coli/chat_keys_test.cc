#include "tools/coli/chat_keys.h"

#include <deque>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace coli::cli {
namespace {

constexpr int kPause = TerminalKeys::kTimedOut;

// A terminal that sends `bytes` (kPause: the next wait for a byte times out), then ends.
class FakeTerminal {
 public:
  void Send(const std::string& bytes) {
    for (unsigned char c : bytes) script_.push_back(c);
  }
  void Pause() { script_.push_back(kPause); }
  int Read(int timeout_ms) {
    if (script_.empty()) return TerminalKeys::kEnd;
    const int b = script_.front();
    if (b == kPause && timeout_ms < 0) {  // a read without a limit waits out the pause
      script_.pop_front();
      return Read(timeout_ms);
    }
    script_.pop_front();
    return b;
  }

 private:
  std::deque<int> script_;
};

// Every character until the end of input.
std::vector<int> Drain(TerminalKeys& keys) {
  std::vector<int> out;
  for (int c = keys.Next(); c != TerminalKeys::kEnd; c = keys.Next()) out.push_back(c);
  return out;
}

struct Harness {
  FakeTerminal term;
  TerminalKeys keys{[this](int timeout_ms) { return term.Read(timeout_ms); }};
};

TEST(TerminalKeys, TypedUtf8BecomesCodePoints) {
  Harness h;
  h.term.Send("h\xC3\xA9 \xE4\xBD\xA0\xE5\xA5\xBD \xF0\x9F\x98\x80!");
  EXPECT_EQ(Drain(h.keys), (std::vector<int>{'h', 0xE9, ' ', 0x4F60, 0x597D, ' ', 0x1F600, '!'}));
  EXPECT_EQ(h.keys.TakeInvalidByte(), std::nullopt);
}

TEST(TerminalKeys, InputThatIsNotUtf8IsFlagged) {
  for (const std::string bad :
       {"\xFF", "\xC3(", "\xE0\x80\x80", "\xED\xA0\x80", "\xF4\x90\x80\x80", "\xC0\xAF"}) {
    Harness h;
    h.term.Send("a" + bad + "b");
    const std::vector<int> got = Drain(h.keys);
    ASSERT_GE(got.size(), 3u) << bad;
    EXPECT_EQ(got.front(), 'a');
    EXPECT_EQ(got.back(), 'b');  // the character after the bad bytes is not eaten
    EXPECT_EQ(got[1], 0xFFFD) << bad;
    EXPECT_EQ(h.keys.TakeInvalidByte(), static_cast<unsigned char>(bad[0])) << bad;
    EXPECT_EQ(h.keys.TakeInvalidByte(), std::nullopt);  // taken once
  }
  Harness cut;  // a sequence cut short by a pause
  cut.term.Send("\xE4\xBD");
  cut.term.Pause();
  cut.term.Send("x");
  EXPECT_EQ(Drain(cut.keys), (std::vector<int>{0xFFFD, 'x'}));
  EXPECT_EQ(cut.keys.TakeInvalidByte(), 0xE4);
}

TEST(TerminalKeys, EscapeSequencesThatAreNotPastesPassThrough) {
  Harness h;
  h.term.Send("\x1b[A");   // up arrow
  h.term.Send("\x1b[2~");  // Insert: shares "[2" with the paste marker
  h.term.Send("\x1b[20");  // a marker's start that goes nowhere
  h.term.Pause();
  h.term.Send("\x1b");  // ESC alone
  h.term.Pause();
  h.term.Send("\x1b\x1b");  // ESC twice
  h.term.Pause();
  h.term.Send("\x1b\xC3\xA9");  // Alt+é
  EXPECT_EQ(Drain(h.keys), (std::vector<int>{0x1b, '[', 'A', 0x1b, '[', '2', '~', 0x1b, '[', '2',
                                             '0', 0x1b, 0x1b, 0x1b, 0x1b, 0xE9}));
  EXPECT_EQ(h.keys.TakePaste(), std::nullopt);
}

TEST(TerminalKeys, APlainOneLinePasteIsTyped) {
  Harness h;
  h.term.Send("x\x1b[200~caf\xC3\xA9 au lait\x1b[201~y");
  std::vector<int> want = {'x', 'c', 'a', 'f', 0xE9, ' ', 'a', 'u', ' ', 'l', 'a', 'i', 't', 'y'};
  EXPECT_EQ(Drain(h.keys), want);
  EXPECT_EQ(h.keys.TakePaste(), std::nullopt);
  Harness trailing;  // a copied line with its line break: typed, not sent
  trailing.term.Send("\x1b[200~ls -l\r\x1b[201~");
  EXPECT_EQ(Drain(trailing.keys), (std::vector<int>{'l', 's', ' ', '-', 'l'}));
  EXPECT_EQ(trailing.keys.TakePaste(), std::nullopt);
}

TEST(TerminalKeys, APasteWithLineBreaksIsTakenWhole) {
  Harness h;
  h.term.Send("ab\x1b[200~def f():\r\n\treturn 1\r\r\n# \xE2\x9C\x93\r\x1b[201~z");
  EXPECT_EQ(h.keys.Next(), 'a');
  EXPECT_EQ(h.keys.Next(), 'b');
  EXPECT_EQ(h.keys.Next(), '\r');  // the editor accepts "ab"
  EXPECT_EQ(h.keys.TakePaste(), "def f():\n\treturn 1\n\n# \xE2\x9C\x93");
  EXPECT_EQ(h.keys.TakePaste(), std::nullopt);  // once
  EXPECT_EQ(Drain(h.keys), (std::vector<int>{'z'}));
}

TEST(TerminalKeys, TabsAndControlCharactersMakeAPasteWhole) {
  Harness tab;
  tab.term.Send("\x1b[200~a\tb\x1b[201~");
  EXPECT_EQ(tab.keys.Next(), '\r');
  EXPECT_EQ(tab.keys.TakePaste(), "a\tb");
  Harness c1;  // U+0088 is a C1 control: libedit would take it as Meta+H (delete a word)
  c1.term.Send("\x1b[200~alpha beta\xC2\x88 gamma\x1b[201~");
  EXPECT_EQ(c1.keys.Next(), '\r');
  EXPECT_EQ(c1.keys.TakePaste(), "alpha beta\xC2\x88 gamma");
  Harness latin;  // U+00A0 and above are text
  latin.term.Send("\x1b[200~a\xC2\xA0\xC3\xA9\x1b[201~");
  EXPECT_EQ(Drain(latin.keys), (std::vector<int>{'a', 0xA0, 0xE9}));
  Harness esc;  // an ESC inside a paste is text, not a key
  esc.term.Send("\x1b[200~red: \x1b[31mX\x1b[201~");
  EXPECT_EQ(esc.keys.Next(), '\r');
  EXPECT_EQ(esc.keys.TakePaste(), "red: \x1b[31mX");
}

TEST(TerminalKeys, APasteThatIsNotUtf8IsKeptForTheCallerToRefuse) {
  Harness h;
  h.term.Send("\x1b[200~bad \xFF byte\x1b[201~");
  EXPECT_EQ(h.keys.Next(), '\r');
  EXPECT_EQ(h.keys.TakePaste(), "bad \xFF byte");
}

TEST(TerminalKeys, EmptyAndCutPastes) {
  Harness empty;
  empty.term.Send("\x1b[200~\r\n\x1b[201~k");
  EXPECT_EQ(Drain(empty.keys), (std::vector<int>{'k'}));
  Harness cut;  // Ctrl-C (or the terminal gone) mid-paste: the paste goes with the line
  cut.term.Send("ab\x1b[200~one\rtwo");
  EXPECT_EQ(cut.keys.Next(), 'a');
  EXPECT_EQ(cut.keys.Next(), 'b');
  EXPECT_EQ(cut.keys.Next(), TerminalKeys::kEnd);
  EXPECT_EQ(cut.keys.TakePaste(), std::nullopt);
}

TEST(TerminalKeys, ResetForgetsQueuedKeysAndAnInterruptedEnd) {
  int calls = 0;
  TerminalKeys keys([&calls](int) {
    ++calls;
    return calls == 1 ? TerminalKeys::kEnd : 'q';  // a Ctrl-C ends the first read
  });
  EXPECT_EQ(keys.Next(), TerminalKeys::kEnd);
  EXPECT_EQ(keys.Next(), TerminalKeys::kEnd);  // ended stays ended...
  keys.Reset();                                // ...until the chat starts a new line
  EXPECT_EQ(keys.Next(), 'q');
}

TEST(DecodeUtf8, AcceptsUtf8AndRefusesTheRest) {
  EXPECT_EQ(DecodeUtf8("a\xC3\xA9\xF0\x9F\x98\x80"), (std::u32string{U'a', 0xE9, 0x1F600}));
  EXPECT_EQ(DecodeUtf8(""), std::u32string());
  for (const std::string bad :
       {"\x80", "\xC3", "\xC1\xBF", "\xED\xBF\xBF", "\xF5\x80\x80\x80", "\xE2\x82"}) {
    EXPECT_EQ(DecodeUtf8(bad), std::nullopt) << bad;
  }
}

}  // namespace
}  // namespace coli::cli
