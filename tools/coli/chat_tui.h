// tools/coli/chat_tui: the pieces of `coli chat` that hold no terminal: the conversation in the
// OpenAI message shape, its JSON for /save, and the slash-command parser. Kept apart from the
// terminal loop so they can be tested directly.
#ifndef COLI_TOOLS_COLI_CHAT_TUI_H_
#define COLI_TOOLS_COLI_CHAT_TUI_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "nlohmann/json.hpp"

namespace coli::cli {

struct ChatTurn {
  std::string role;  // "user" or "assistant"
  std::string content;
  std::string reasoning;               // assistant only
  std::vector<nlohmann::json> tool_calls;  // assistant only, OpenAI shape
};

class Conversation {
 public:
  void set_system(std::string system) { system_ = std::move(system); }
  const std::string& system() const { return system_; }
  void set_thinking(bool on) { thinking_ = on; }
  bool thinking() const { return thinking_; }
  void Clear() { turns_.clear(); }
  std::vector<ChatTurn>& turns() { return turns_; }
  const std::vector<ChatTurn>& turns() const { return turns_; }

  // The OpenAI messages array (system first when set; reasoning kept as reasoning_content).
  nlohmann::json Messages() const;
  // The chat-completions body sent to the host for the next reply.
  nlohmann::json Request() const;
  // Writes {"model", "messages", "thinking"} atomically (temp + rename) to `path`.
  absl::Status Save(const std::string& path, const std::string& model) const;

 private:
  std::string system_;
  bool thinking_ = true;
  std::vector<ChatTurn> turns_;
};

// A parsed input line: a slash command or a message.
struct ChatInput {
  enum class Kind { kMessage, kClear, kThink, kSystem, kSave, kStats, kReasoning, kHelp, kQuit,
                    kEmpty, kInvalid };
  Kind kind = Kind::kEmpty;
  std::string argument;  // message text, system text, file name, on/off
  std::string error;     // kInvalid: why
};

ChatInput ParseChatInput(const std::string& line);

// The prefill progress line of a terminal (no escape codes; the caller dims it):
//   "reading the prompt [########------------]  40% 120/300 tokens 2.1 s"
// done is clamped to [0, total]; total <= 0 gives an empty bar at 0%.
std::string PrefillBar(int64_t done, int64_t total, double seconds, int width = 20);

}  // namespace coli::cli

#endif  // COLI_TOOLS_COLI_CHAT_TUI_H_
