// tools/coli/chat_history: `coli chat`'s line history file (~/.coli_chat_history), kept through
// libedit's readline emulation, which owns the in-memory list and the file format.
#ifndef COLI_TOOLS_COLI_CHAT_HISTORY_H_
#define COLI_TOOLS_COLI_CHAT_HISTORY_H_

#include <string>
#include <vector>

#include "absl/status/status.h"

namespace coli::cli {

// The lines a chat keeps at most: the oldest go first (bash keeps 500 by default).
inline constexpr int kChatHistoryEntries = 1000;

// libedit holds one history per process: one ChatHistory at a time.
class ChatHistory {
 public:
  // `path` "" keeps no file (no $HOME): lines are still recalled within the session.
  explicit ChatHistory(std::string path, int max_entries = kChatHistoryEntries);

  // Fills libedit's list from the file, replacing what it held (a missing file is an empty
  // history).
  void Load();
  // A line the user sent: recalled with the arrow keys, and saved by Save.
  void Add(const std::string& line);
  // Writes the file: what it holds now (another chat may have saved since Load) followed by
  // this session's lines, the newest max_entries kept, written atomically (temp + rename; a
  // symlinked file's target is replaced, the link kept) with the file's mode (0600 for a new
  // one: the history holds what the user typed). On failure the file is untouched.
  absl::Status Save();

  // The lines libedit recalls now, oldest first.
  static std::vector<std::string> Lines();

  const std::string& path() const { return path_; }

 private:
  std::string path_;
  int max_entries_;
  std::vector<std::string> added_;
};

}  // namespace coli::cli

#endif  // COLI_TOOLS_COLI_CHAT_HISTORY_H_
