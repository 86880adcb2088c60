#include "tools/coli/chat_tui.h"

#include <stdlib.h>
#include <sys/stat.h>

#include <cstdio>
#include <fstream>
#include <sstream>

#include "common/status/status_matchers.h"
#include "gtest/gtest.h"

namespace coli::cli {
namespace {

using K = ChatInput::Kind;

TEST(ChatInput, ParsesCommandsAndMessages) {
  EXPECT_EQ(ParseChatInput("").kind, K::kEmpty);
  EXPECT_EQ(ParseChatInput("   ").kind, K::kEmpty);
  ChatInput m = ParseChatInput("hello /there  ");
  EXPECT_EQ(m.kind, K::kMessage);
  EXPECT_EQ(m.argument, "hello /there");
  EXPECT_EQ(ParseChatInput("/clear").kind, K::kClear);
  EXPECT_EQ(ParseChatInput("/stats").kind, K::kStats);
  EXPECT_EQ(ParseChatInput("/quit").kind, K::kQuit);
  ChatInput think = ParseChatInput("/think off");
  EXPECT_EQ(think.kind, K::kThink);
  EXPECT_EQ(think.argument, "off");
  EXPECT_EQ(ParseChatInput("/think maybe").kind, K::kInvalid);
  ChatInput system = ParseChatInput("/system  Be brief.");
  EXPECT_EQ(system.kind, K::kSystem);
  EXPECT_EQ(system.argument, "Be brief.");
  EXPECT_EQ(ParseChatInput("/save").kind, K::kInvalid);
  EXPECT_EQ(ParseChatInput("/save out.json").argument, "out.json");
  ChatInput unknown = ParseChatInput("/frobnicate");
  EXPECT_EQ(unknown.kind, K::kInvalid);
  EXPECT_NE(unknown.error.find("/frobnicate"), std::string::npos);
  ChatInput slash = ParseChatInput("//etc/passwd is a path");
  EXPECT_EQ(slash.kind, K::kMessage);
  EXPECT_EQ(slash.argument, "/etc/passwd is a path");
}

TEST(Conversation, MessagesInOpenAiShape) {
  Conversation c;
  c.set_system("Be brief.");
  c.turns().push_back({"user", "Q1", "", {}});
  c.turns().push_back({"assistant", "A1", "R1", {}});
  nlohmann::json m = c.Messages();
  ASSERT_EQ(m.size(), 3u);
  EXPECT_EQ(m[0], (nlohmann::json{{"role", "system"}, {"content", "Be brief."}}));
  EXPECT_EQ(m[1], (nlohmann::json{{"role", "user"}, {"content", "Q1"}}));
  EXPECT_EQ(m[2]["reasoning_content"], "R1");
  c.set_thinking(false);
  EXPECT_EQ(c.Request()["enable_thinking"], false);
  c.Clear();
  EXPECT_EQ(c.Messages().size(), 1u);  // the system prompt stays
}

TEST(Conversation, SaveWritesValidJsonAtomically) {
  Conversation c;
  c.turns().push_back({"user", "héllo \"quoted\"", "", {}});
  std::string path = ::testing::TempDir() + "/coli_chat_save.json";
  ASSERT_OK(c.Save(path, "k3_tiny"));
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  nlohmann::json doc = nlohmann::json::parse(text.str());
  EXPECT_EQ(doc["model"], "k3_tiny");
  EXPECT_EQ(doc["messages"][0]["content"], "héllo \"quoted\"");
  EXPECT_FALSE(c.Save("/nonexistent-dir/x.json", "m").ok());
  std::remove(path.c_str());
}

TEST(ChatInput, InvalidUtf8IsRefusedNotSent) {
  // Was sent on, and the JSON encoder's exception aborted `coli chat` (the conversation lost).
  ChatInput bad = ParseChatInput("bad \xFF byte");
  EXPECT_EQ(bad.kind, K::kInvalid);
  EXPECT_NE(bad.error.find("byte 0xFF at offset 4"), std::string::npos) << bad.error;
  EXPECT_EQ(ParseChatInput("/system \xC3").kind, K::kInvalid);
  EXPECT_EQ(ParseChatInput("h\xC3\xA9").kind, K::kMessage);
}

TEST(MultilineInput, BackslashContinuesAndQuotesMakeABlock) {
  MultilineInput in;
  EXPECT_EQ(in.Add("one line"), "one line");
  EXPECT_FALSE(in.pending());
  EXPECT_EQ(in.Add("first \\"), std::nullopt);
  EXPECT_TRUE(in.pending());
  EXPECT_EQ(in.Add("second\\"), std::nullopt);
  EXPECT_EQ(in.Add("third"), "first \nsecond\nthird");
  // A pasted block: every line, blank ones included, is one message.
  EXPECT_EQ(in.Add("\"\"\""), std::nullopt);
  EXPECT_EQ(in.Add("def f():"), std::nullopt);
  EXPECT_EQ(in.Add(""), std::nullopt);
  EXPECT_EQ(in.Add("    return 1  \\"), std::nullopt);  // no continuation inside a block
  EXPECT_EQ(in.Add("\"\"\""), "def f():\n\n    return 1  \\");
  EXPECT_EQ(in.Add("\"\"\"opened here"), std::nullopt);
  EXPECT_EQ(in.Add("closed here\"\"\"  "), "opened here\nclosed here");
  EXPECT_EQ(in.Add("  \"\"\"one-liner\"\"\""), "one-liner");
  EXPECT_EQ(in.Add("\"\"\""), std::nullopt);
  EXPECT_EQ(in.Add("dropped"), std::nullopt);
  in.Reset();  // Ctrl-C at the continuation prompt
  EXPECT_FALSE(in.pending());
  EXPECT_EQ(in.Add("after"), "after");
  EXPECT_EQ(in.Finish(), std::nullopt);
  EXPECT_EQ(in.Add("\"\"\"unclosed"), std::nullopt);
  EXPECT_EQ(in.Finish(), "unclosed");  // end of input closes it
  EXPECT_EQ(in.Add("crlf \\\r"), std::nullopt);  // a file with Windows line ends
  EXPECT_EQ(in.Add("end\r"), "crlf \nend");
}

TEST(MultilineInput, APasteIsOneMessageEndedByTheNextLine) {
  MultilineInput in;
  in.AddPaste("", "line one\nline two");
  EXPECT_TRUE(in.pending());
  EXPECT_EQ(in.Add(""), "line one\nline two");  // Enter alone: the paste as it is
  EXPECT_FALSE(in.pending());
  EXPECT_TRUE(in.verbatim());
  in.AddPaste("code:", "  x = 1");  // typed before the paste: the message's first line
  in.AddPaste("", "  y = 2\n");     // a second paste at the continuation prompt
  EXPECT_EQ(in.Add("what does it do?"), "code:\n  x = 1\n  y = 2\n\nwhat does it do?");
  EXPECT_FALSE(in.verbatim());  // typed first: may be a command ("/system " + a prompt)
  in.AddPaste("", "a\nb");
  EXPECT_EQ(in.Add("more \\"), std::nullopt);  // a continuation after a paste goes on
  EXPECT_EQ(in.Add("end"), "a\nb\nmore \nend");
  EXPECT_TRUE(in.verbatim());
  in.AddPaste("", "dropped\npaste");
  in.Reset();  // Ctrl-C
  EXPECT_EQ(in.Add("after"), "after");
  EXPECT_FALSE(in.verbatim());
  in.AddPaste("", "kept\nat the end");
  EXPECT_EQ(in.Finish(), "kept\nat the end");  // Ctrl-D sends it
  // Inside a \"\"\" block a paste is more of the block, which a \"\"\" line still ends.
  EXPECT_EQ(in.Add("\"\"\""), std::nullopt);
  in.AddPaste("", "p1\np2");
  EXPECT_EQ(in.Add("typed"), std::nullopt);
  in.AddPaste("x", "p3\np4");
  EXPECT_EQ(in.Add(""), std::nullopt);
  EXPECT_EQ(in.Add("\"\"\""), "p1\np2\ntyped\nx\np3\np4\n");
  EXPECT_TRUE(in.verbatim());
  // `"""` typed and a paste on the same line: the block opens with the paste inside.
  in.AddPaste("\"\"\"", "q1\nq2");
  EXPECT_TRUE(in.pending());
  EXPECT_EQ(in.Add("\"\"\""), "q1\nq2");
  EXPECT_TRUE(in.verbatim());
  in.AddPaste("\"\"\"one\"\"\"", "two\nthree");  // a closed one-liner: text before the paste
  EXPECT_EQ(in.Add(""), "one\ntwo\nthree");
  // After a `\` continuation line a paste joins the message, and Enter ends it.
  EXPECT_EQ(in.Add("intro \\"), std::nullopt);
  in.AddPaste("", "x\ny");
  EXPECT_EQ(in.Add(""), "intro \nx\ny");
  EXPECT_FALSE(in.verbatim());
}

TEST(ChatInput, VerbatimMessagesAreNeverCommands) {
  // Pasted code or paths start with "/" or "//": as typed lines they are commands or lose a
  // slash; as a paste or a block they are the message exactly.
  ChatInput code = ParseChatMessage("// comment\nint main() {}\n  ");
  EXPECT_EQ(code.kind, K::kMessage);
  EXPECT_EQ(code.argument, "// comment\nint main() {}");
  EXPECT_EQ(ParseChatMessage("/etc/hosts\n127.0.0.1 localhost").argument,
            "/etc/hosts\n127.0.0.1 localhost");
  EXPECT_EQ(ParseChatMessage(" \n\t").kind, K::kEmpty);
  EXPECT_EQ(ParseChatMessage("bad \xFF\nline").kind, K::kInvalid);
  // A typed command before a pasted text takes it as its argument.
  ChatInput system = ParseChatInput("/system\nYou are terse.\nAnswer in French.");
  EXPECT_EQ(system.kind, K::kSystem);
  EXPECT_EQ(system.argument, "You are terse.\nAnswer in French.");
  EXPECT_EQ(ParseChatInput("/retry").kind, K::kRetry);
  EXPECT_EQ(ParseChatInput("/undo").kind, K::kUndo);
  EXPECT_EQ(ParseChatInput("/retry now").kind, K::kInvalid);
  EXPECT_EQ(ParseChatInput("/load").kind, K::kInvalid);
  EXPECT_EQ(ParseChatInput("/load ~/c.json").argument, "~/c.json");
  // "/save FILE" then a pasted text: no file named with line breaks.
  ChatInput save = ParseChatInput("/save out.json\nm1\nm2");
  EXPECT_EQ(save.kind, K::kInvalid);
  EXPECT_NE(save.error.find("line break"), std::string::npos);
  EXPECT_EQ(ParseChatInput("/load in.json\nx").kind, K::kInvalid);
}

TEST(Conversation, LoadTakesWhatSaveWroteAndOpenAiMessages) {
  Conversation saved;
  saved.set_system("Be brief.");
  saved.set_thinking(false);
  saved.turns().push_back({"user", "héllo 你好", "", {}});
  nlohmann::json call = {
      {"id", "call_0"}, {"type", "function"}, {"function", {{"name", "f"}, {"arguments", "{}"}}}};
  saved.turns().push_back({"assistant", "A1", "R1", {call}});
  saved.turns().push_back({"user", "Q2", "", {}});
  const std::string path = ::testing::TempDir() + "/coli_chat_load.json";
  ASSERT_OK(saved.Save(path, "k3_tiny"));
  Conversation loaded;
  ASSERT_OK(loaded.Load(path));
  EXPECT_EQ(loaded.Messages(), saved.Messages());
  EXPECT_FALSE(loaded.thinking());

  // A bare OpenAI array with content parts and a null content beside tool calls.
  Conversation c;
  ASSERT_OK(c.FromJson(nlohmann::json::parse(R"([
      {"role": "developer", "content": "Sys"},
      {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
      {"role": "assistant", "content": null, "tool_calls": [
          {"id": "c", "type": "function", "function": {"name": "g", "arguments": "{}"}}]}])")));
  EXPECT_EQ(c.system(), "Sys");
  ASSERT_EQ(c.turns().size(), 2u);
  EXPECT_EQ(c.turns()[0].content, "ab");
  EXPECT_EQ(c.turns()[1].tool_calls.size(), 1u);
  EXPECT_TRUE(c.thinking());  // no "thinking": unchanged
  std::remove(path.c_str());
}

TEST(Conversation, LoadRefusesWhatItCannotKeepAndChangesNothing) {
  Conversation c;
  c.set_system("kept");
  c.turns().push_back({"user", "kept too", "", {}});
  const nlohmann::json before = c.Messages();
  const struct {
    const char* doc;
    const char* error;
  } cases[] = {
      {R"({"model": "m"})", "no \"messages\" array"},
      {R"({"messages": {}})", "not an array"},
      {R"([{"content": "x"}])", "messages[0] has no role"},
      {R"([{"role": "user", "content": 5}])", "messages[0].content is not a string"},
      {R"([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}])",
       "messages[0].content[0] is not a text part"},
      {R"([{"role": "user", "content": "a"}, {"role": "system", "content": "s"}])",
       "messages[1]: a system message is only taken as the first one"},
      {R"([{"role": "tool", "content": "r", "tool_call_id": "c"}])", "role \"tool\""},
      {R"([{"role": "assistant", "content": "a", "reasoning_content": 1}])",
       "reasoning_content is not a string"},
      {R"([{"role": "assistant", "content": "a", "tool_calls": [{"id": "x"}]}])",
       "a call without a function"},
      {R"({"messages": [], "thinking": "yes"})", "\"thinking\" is not true or false"},
  };
  for (const auto& t : cases) {
    absl::Status s = c.FromJson(nlohmann::json::parse(t.doc));
    EXPECT_FALSE(s.ok()) << t.doc;
    EXPECT_NE(std::string(s.message()).find(t.error), std::string::npos) << s.message();
    EXPECT_EQ(c.Messages(), before) << t.doc;
  }
  const std::string path = ::testing::TempDir() + "/coli_chat_load_bad.json";
  std::ofstream(path) << "{\"messages\": [";  // cut short
  absl::Status truncated = c.Load(path);
  EXPECT_FALSE(truncated.ok());
  EXPECT_NE(std::string(truncated.message()).find("is not JSON"), std::string::npos);
  std::ofstream(path) << "[{\"role\": \"user\", \"content\": \"\xFF\"}]";  // not UTF-8
  EXPECT_FALSE(c.Load(path).ok());
  EXPECT_FALSE(c.Load(path + ".missing").ok());
  EXPECT_EQ(c.Messages(), before);
  std::remove(path.c_str());
}

TEST(Conversation, UndoTakesBackTheLastExchange) {
  Conversation c;
  EXPECT_EQ(c.Undo(), 0);
  c.turns().push_back({"user", "Q1", "", {}});
  c.turns().push_back({"assistant", "A1", "", {}});
  c.turns().push_back({"user", "Q2", "", {}});
  EXPECT_EQ(c.Undo(), 1);  // a message whose reply failed: only it
  EXPECT_EQ(c.Undo(), 2);
  EXPECT_EQ(c.Undo(), 0);
  EXPECT_TRUE(c.turns().empty());
}

TEST(TerminalStyle, DumbTerminalsAndNoColor) {
  TerminalStyle tty = StyleFor(true, "xterm-256color", nullptr);
  EXPECT_TRUE(tty.decorate);
  EXPECT_STREQ(tty.dim(), "\x1b[2m");
  TerminalStyle no_color = StyleFor(true, "xterm", "1");
  EXPECT_TRUE(no_color.decorate);
  EXPECT_STREQ(no_color.dim(), "");
  EXPECT_STREQ(no_color.bold(), "");
  EXPECT_TRUE(StyleFor(true, "xterm", "").color);  // NO_COLOR set but empty: ignored
  TerminalStyle dumb = StyleFor(true, "dumb", nullptr);
  EXPECT_FALSE(dumb.decorate);
  EXPECT_STREQ(dumb.clear_line(), "");
  EXPECT_STREQ(dumb.reset(), "");
  EXPECT_FALSE(StyleFor(false, "xterm", nullptr).decorate);
}

TEST(Conversation, SaveKeepsAnExistingFilesModeAndExpandsHome) {
  const std::string dir = ::testing::TempDir();
  const std::string path = dir + "/coli_chat_private.json";
  {
    std::ofstream(path) << "precious";
  }
  ASSERT_EQ(chmod(path.c_str(), 0600), 0);
  Conversation c;
  c.turns().push_back({"user", "Q", "", {}});
  // Text that is not UTF-8 (from a reply, say) is replaced, not an exception.
  c.turns().push_back({"assistant", "bad \xFF", "", {}});
  ASSERT_OK(c.Save(path, "m"));
  struct stat st;
  ASSERT_EQ(stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0600u);  // was 0644 after every /save
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  nlohmann::json doc = nlohmann::json::parse(text.str());
  EXPECT_EQ(doc["messages"][1]["content"], "bad \xEF\xBF\xBD");
  std::remove(path.c_str());

  const char* old = std::getenv("HOME");
  const std::string saved = old ? old : "";
  setenv("HOME", dir.c_str(), 1);
  ASSERT_OK(c.Save("~/coli_chat_home.json", "m"));
  EXPECT_EQ(stat((dir + "/coli_chat_home.json").c_str(), &st), 0);
  std::remove((dir + "/coli_chat_home.json").c_str());
  if (old) setenv("HOME", saved.c_str(), 1);
}

TEST(PrefillBar, ShowsTokensReadOfThePrompt) {
  EXPECT_EQ(PrefillBar(120, 300, 2.06),
            "reading the prompt [########------------]  40% 120/300 tokens 2.1 s");
  EXPECT_EQ(PrefillBar(0, 300, 0), "reading the prompt [--------------------]   0% 0/300 tokens 0.0 s");
  EXPECT_EQ(PrefillBar(300, 300, 1, 4), "reading the prompt [####] 100% 300/300 tokens 1.0 s");
  EXPECT_EQ(PrefillBar(500, 300, 1, 4), "reading the prompt [####] 100% 300/300 tokens 1.0 s");
  EXPECT_EQ(PrefillBar(5, 0, 1, 4), "reading the prompt [----]   0% 0/0 tokens 1.0 s");
}

}  // namespace
}  // namespace coli::cli
