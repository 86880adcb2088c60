#include "tools/coli/chat_tui.h"

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
  EXPECT_EQ(c.Request()["chat_template_kwargs"]["thinking"], false);
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
