// `coli chat`'s line history file (tools/coli/chat_history.h): what one chat saves another reads
// back, lines other chats saved meanwhile are kept, the newest entries are kept, and the file is
// replaced atomically with its mode (a symlinked file's target, the link kept).
#include "tools/coli/chat_history.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace coli::cli {
namespace {

namespace fs = std::filesystem;
using ::testing::Test;

class ChatHistoryTest : public Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/chat_history_test.XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    path_ = dir_ + "/.coli_chat_history";
  }
  void TearDown() override { fs::remove_all(dir_); }

  // What a new chat started now would recall.
  std::vector<std::string> ReadBack(int max_entries = kChatHistoryEntries) {
    ChatHistory h(path_, max_entries);
    h.Load();
    return ChatHistory::Lines();
  }

  std::string dir_, path_;
};

TEST_F(ChatHistoryTest, WhatOneChatSavesTheNextRecallsExactly) {
  const std::vector<std::string> lines = {"hello",  "two  spaces",    "tab\there",  "back\\slash",
                                          "你好 😀", "#not a comment", "\"quoted\"", "multi\nline"};
  {
    ChatHistory h(path_);
    h.Load();
    for (const std::string& l : lines) h.Add(l);
    h.Add("");  // not a line: nothing kept
    ASSERT_TRUE(h.Save().ok());
  }
  EXPECT_EQ(ReadBack(), lines);
}

TEST_F(ChatHistoryTest, LinesAnotherChatSavedMeanwhileAreKept) {
  {
    ChatHistory first(path_);
    first.Load();
    first.Add("from the first chat");
    ASSERT_TRUE(first.Save().ok());
  }
  ChatHistory second(path_);
  second.Load();
  second.Add("from the second chat");
  {
    // A third chat, started after the second, ends first (its Save rewrites the file).
    ChatHistory third(path_);
    third.Load();
    third.Add("from the third chat");
    ASSERT_TRUE(third.Save().ok());
  }
  ASSERT_TRUE(second.Save().ok());
  EXPECT_EQ(ReadBack(), (std::vector<std::string>{"from the first chat", "from the third chat",
                                                  "from the second chat"}));
}

TEST_F(ChatHistoryTest, TheNewestEntriesAreKept) {
  ChatHistory h(path_, 5);
  h.Load();
  for (int i = 0; i < 8; ++i) h.Add("line " + std::to_string(i));
  ASSERT_TRUE(h.Save().ok());
  EXPECT_EQ(ReadBack(5),
            (std::vector<std::string>{"line 3", "line 4", "line 5", "line 6", "line 7"}));
}

TEST_F(ChatHistoryTest, ANewFileIsPrivateAndAnOldOneKeepsItsMode) {
  {
    ChatHistory h(path_);
    h.Load();
    h.Add("secret");
    ASSERT_TRUE(h.Save().ok());
  }
  struct stat st;
  ASSERT_EQ(::stat(path_.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0600);
  ASSERT_EQ(::chmod(path_.c_str(), 0640), 0);
  {
    ChatHistory h(path_);
    h.Load();
    h.Add("more");
    ASSERT_TRUE(h.Save().ok());
  }
  ASSERT_EQ(::stat(path_.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0640);
  EXPECT_EQ(ReadBack(), (std::vector<std::string>{"secret", "more"}));
}

TEST_F(ChatHistoryTest, ASymlinkedFileHasItsTargetReplacedAndStaysALink) {
  const std::string target = dir_ + "/dotfiles_history";
  fs::create_symlink(target, path_);  // dangling until the first save
  {
    ChatHistory h(path_);
    h.Load();
    h.Add("through the link");
    ASSERT_TRUE(h.Save().ok());
  }
  EXPECT_TRUE(fs::is_symlink(path_));
  {
    ChatHistory h(path_);
    h.Load();
    h.Add("again");
    ASSERT_TRUE(h.Save().ok());
  }
  EXPECT_TRUE(fs::is_symlink(path_));
  EXPECT_EQ(ReadBack(), (std::vector<std::string>{"through the link", "again"}));
}

TEST_F(ChatHistoryTest, AFailedSaveSaysWhyAndLeavesTheFileAsItWas) {
  {
    ChatHistory h(path_);
    h.Load();
    h.Add("kept");
    ASSERT_TRUE(h.Save().ok());
  }
  std::ifstream before_in(path_);
  const std::string before((std::istreambuf_iterator<char>(before_in)),
                           std::istreambuf_iterator<char>());
  // The folder cannot take the temporary file: a path whose folder is a file.
  const std::string blocked = path_ + "/history";
  ChatHistory h(blocked);
  h.Load();
  h.Add("lost");
  const absl::Status s = h.Save();
  EXPECT_FALSE(s.ok());
  EXPECT_NE(std::string(s.message()).find(blocked), std::string::npos) << s;
  std::ifstream after_in(path_);
  const std::string after((std::istreambuf_iterator<char>(after_in)),
                          std::istreambuf_iterator<char>());
  EXPECT_EQ(after, before);
}

TEST_F(ChatHistoryTest, NoPathKeepsLinesForTheSessionOnly) {
  ChatHistory h("");
  h.Load();
  h.Add("only here");
  EXPECT_EQ(ChatHistory::Lines(), std::vector<std::string>{"only here"});
  EXPECT_TRUE(h.Save().ok());
  EXPECT_FALSE(fs::exists(path_));
}

}  // namespace
}  // namespace coli::cli
