// tools/coli/chat_tui: the pieces of `coli chat` that hold no terminal: the conversation in the
// OpenAI message shape, its JSON for /save, the slash-command parser, the multi-line input
// (`"""` blocks, `\` continuations) and the terminal style (TERM=dumb, NO_COLOR). Kept apart
// from the terminal loop so they can be tested directly.
#ifndef COLI_TOOLS_COLI_CHAT_TUI_H_
#define COLI_TOOLS_COLI_CHAT_TUI_H_

#include <cstdint>
#include <optional>
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
  // Writes {"model", "messages", "thinking"} atomically (temp + rename) to `path` ("~/" is
  // $HOME): the file is either the old one or the whole new one, never half written. An
  // existing file keeps its permission bits (a 0600 transcript stays private); a new one is
  // 0644. Text that is not UTF-8 (it cannot come from the input, which refuses it) is written
  // as U+FFFD rather than failing.
  absl::Status Save(const std::string& path, const std::string& model) const;
  // Replaces the conversation with a saved one (/load): what Save writes, or any OpenAI
  // messages array, bare or under "messages" (a system message first only; user and assistant
  // messages with string content, text content parts, reasoning_content, tool_calls; "thinking"
  // when present). INVALID_ARGUMENT naming the message and field that is not that (tool
  // messages, images), and the conversation is then left as it was. Files over 64 MiB refused.
  absl::Status Load(const std::string& path);
  absl::Status FromJson(const nlohmann::json& doc);
  // Takes back the last exchange (/undo): the last user message and the reply after it.
  // How many messages went (0: none).
  int Undo();

 private:
  std::string system_;
  bool thinking_ = true;
  std::vector<ChatTurn> turns_;
};

// A parsed input line: a slash command or a message.
struct ChatInput {
  enum class Kind { kMessage, kClear, kThink, kSystem, kSave, kLoad, kRetry, kUndo, kStats,
                    kReasoning, kHelp, kQuit, kEmpty, kInvalid };
  Kind kind = Kind::kEmpty;
  std::string argument;  // message text, system text, file name, on/off
  std::string error;     // kInvalid: why
};

// A line that is not valid UTF-8 is kInvalid (saying where), never sent or kept.
ChatInput ParseChatInput(const std::string& line);
// The same for text that is a message whatever it starts with (a `"""` block, a paste: pasted
// code may start with "//" or a path with "/"): kMessage, kEmpty or kInvalid.
ChatInput ParseChatMessage(const std::string& text);

// Joins input lines into one message:
//   a line ending in `\` continues on the next line (llama.cpp's multi-line input);
//   a line that starts with `"""` opens a block that the next line ending in `"""` closes
//   (ollama's), so pasted text with newlines is one message.
//   a bracketed paste that holds line breaks (chat_keys.h), after what was typed before it on
//   its line (then its own first line), is gathered as it is: the next line typed (Enter alone:
//   nothing) ends the message, so a pasted block can be sent as it is or followed by a
//   question. Inside a block it is more of the block.
// The joined text keeps the newlines. A message that is a block or starts with a paste is
// verbatim: a message whatever it starts with (ParseChatMessage); typed text before a paste
// can still be a command ("/system " then a pasted prompt).
class MultilineInput {
 public:
  // Takes one line; the whole message once it is complete, else nullopt (more lines wanted).
  std::optional<std::string> Add(const std::string& line);
  // Takes a paste with line breaks and the text typed before it on its line; always wants
  // more: the next Add ends it.
  void AddPaste(const std::string& typed, const std::string& pasted);
  // Whether the last message Add or Finish returned is verbatim (see above).
  bool verbatim() const { return verbatim_; }
  bool pending() const { return pending_; }
  // Drops what was gathered (Ctrl-C at a continuation prompt).
  void Reset();
  // At end of input: what was gathered, as if it had been closed (nullopt when nothing).
  std::optional<std::string> Finish();

 private:
  std::string Done();  // the gathered message; resets

  bool pending_ = false;
  bool block_ = false;  // inside """ ... """
  bool first_ = true;   // no line of the block taken yet
  bool pasted_ = false;       // gathering a paste: the next line ends the message
  bool paste_first_ = false;  // the message being gathered starts with pasted text
  bool verbatim_ = false;
  std::string text_;
};

// How `coli chat` decorates its output: `decorate` redraws lines in place (\r, erase-line) and
// shows progress; `color` adds dim and bold. A terminal decorates unless TERM is "dumb"; color
// also needs NO_COLOR unset or empty (no-color.org).
struct TerminalStyle {
  bool decorate = false;
  bool color = false;
  const char* dim() const { return color ? "\x1b[2m" : ""; }
  const char* bold() const { return color ? "\x1b[1m" : ""; }
  const char* reset() const { return color ? "\x1b[0m" : ""; }
  const char* clear_line() const { return decorate ? "\r\x1b[2K" : ""; }
};
TerminalStyle StyleFor(bool is_tty, const char* term, const char* no_color);

// The prefill progress line of a terminal (no escape codes; the caller dims it):
//   "reading the prompt [########------------]  40% 120/300 tokens 2.1 s"
// done is clamped to [0, total]; total <= 0 gives an empty bar at 0%.
std::string PrefillBar(int64_t done, int64_t total, double seconds, int width = 20);

}  // namespace coli::cli

#endif  // COLI_TOOLS_COLI_CHAT_TUI_H_
