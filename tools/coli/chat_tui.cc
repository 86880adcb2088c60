#include "tools/coli/chat_tui.h"

#include <sys/stat.h>

#include <algorithm>
#include <string_view>

#include "absl/strings/ascii.h"
#include "absl/strings/str_format.h"
#include "absl/strings/match.h"
#include "absl/strings/strip.h"
#include "common/io/io.h"
#include "tools/coli/cli_args.h"

namespace coli::cli {

nlohmann::json Conversation::Messages() const {
  nlohmann::json messages = nlohmann::json::array();
  if (!system_.empty()) messages.push_back({{"role", "system"}, {"content", system_}});
  for (const ChatTurn& t : turns_) {
    nlohmann::json m = {{"role", t.role}, {"content", t.content}};
    if (t.role == "assistant") {
      if (!t.reasoning.empty()) m["reasoning_content"] = t.reasoning;
      if (!t.tool_calls.empty()) m["tool_calls"] = t.tool_calls;
    }
    messages.push_back(std::move(m));
  }
  return messages;
}

nlohmann::json Conversation::Request() const {
  return {{"messages", Messages()}, {"chat_template_kwargs", {{"thinking", thinking_}}}};
}

absl::Status Conversation::Save(const std::string& path, const std::string& model) const {
  nlohmann::json doc = {{"model", model}, {"thinking", thinking_}, {"messages", Messages()}};
  const std::string target = ExpandHome(path);
  mode_t mode = 0644;
  struct stat st;
  if (::stat(target.c_str(), &st) == 0 && S_ISREG(st.st_mode)) mode = st.st_mode & 07777;
  std::string text = doc.dump(2, ' ', false, nlohmann::json::error_handler_t::replace);
  text += '\n';
  return io::WriteFileAtomic(target, text, mode);
}

ChatInput ParseChatInput(const std::string& raw) {
  std::string line(absl::StripTrailingAsciiWhitespace(raw));
  ChatInput in;
  if (absl::Status utf8 = CheckUtf8("this line", line); !utf8.ok()) {
    in.kind = ChatInput::Kind::kInvalid;
    in.error = std::string(utf8.message()) + "; it was not sent";
    return in;
  }
  if (absl::StripAsciiWhitespace(line).empty()) return in;
  if (line[0] != '/') {
    in.kind = ChatInput::Kind::kMessage;
    in.argument = line;
    return in;
  }
  std::string command = line.substr(0, line.find(' '));
  std::string rest = line.size() > command.size()
                         ? std::string(absl::StripAsciiWhitespace(line.substr(command.size())))
                         : "";
  using K = ChatInput::Kind;
  if (command == "/clear") in.kind = K::kClear;
  else if (command == "/stats") in.kind = K::kStats;
  else if (command == "/help" || command == "/?") in.kind = K::kHelp;
  else if (command == "/quit" || command == "/exit") in.kind = K::kQuit;
  else if (command == "/reasoning") {
    in.kind = K::kReasoning;
    in.argument = rest;
    if (!rest.empty() && rest != "show" && rest != "hide" && rest != "last") {
      in.kind = K::kInvalid;
      in.error = "usage: /reasoning show|hide|last";
    }
  } else if (command == "/think") {
    in.kind = K::kThink;
    in.argument = rest;
    if (rest != "on" && rest != "off") {
      in.kind = K::kInvalid;
      in.error = "usage: /think on|off";
    }
  } else if (command == "/system") {
    in.kind = K::kSystem;
    in.argument = rest;
  } else if (command == "/save") {
    in.kind = K::kSave;
    in.argument = rest;
    if (rest.empty()) {
      in.kind = K::kInvalid;
      in.error = "usage: /save FILE";
    }
  } else if (absl::StartsWith(line, "//")) {
    in.kind = K::kMessage;  // "//text" sends "/text"
    in.argument = line.substr(1);
  } else {
    in.kind = K::kInvalid;
    in.error = "unknown command " + command + " (/help lists them)";
  }
  return in;
}

std::optional<std::string> MultilineInput::Add(const std::string& line) {
  constexpr absl::string_view kQuotes = "\"\"\"";
  absl::string_view rest = line;
  if (absl::EndsWith(rest, "\r")) rest.remove_suffix(1);  // a file with CRLF line ends
  if (!pending_) {
    text_.clear();
    const absl::string_view lead = absl::StripLeadingAsciiWhitespace(rest);
    if (!absl::StartsWith(lead, kQuotes)) {
      if (!absl::EndsWith(rest, "\\")) return std::string(rest);
      rest.remove_suffix(1);  // `\` at the end: continued on the next line
      text_ = std::string(rest);
      pending_ = true;
      return std::nullopt;
    }
    rest = lead.substr(kQuotes.size());
    pending_ = true;
    block_ = true;
    first_ = true;
    if (rest.empty()) return std::nullopt;  // a bare `"""` opens the block
  }
  if (!block_) {
    if (pasted_ && rest.empty()) {  // Enter after a paste: the paste as it is
      std::string done = std::move(text_);
      Reset();
      return done;
    }
    text_ += '\n';
    if (absl::EndsWith(rest, "\\")) {
      rest.remove_suffix(1);
      text_ += std::string(rest);
      return std::nullopt;
    }
    text_ += std::string(rest);
    std::string done = std::move(text_);
    Reset();
    return done;
  }
  const absl::string_view trimmed = absl::StripTrailingAsciiWhitespace(rest);
  const bool closes = absl::EndsWith(trimmed, kQuotes);
  const absl::string_view content =
      closes ? trimmed.substr(0, trimmed.size() - kQuotes.size()) : rest;
  if (!closes || !content.empty()) {
    if (!first_) text_ += '\n';
    text_ += std::string(content);
    first_ = false;
  }
  if (!closes) return std::nullopt;
  std::string done = std::move(text_);
  Reset();
  return done;
}

void MultilineInput::AddPaste(const std::string& text) {
  if (!pending_) {
    text_ = text;
    pending_ = true;
  } else {
    if (!block_ || !first_) text_ += '\n';
    text_ += text;
    first_ = false;
  }
  if (!block_) pasted_ = true;
}

void MultilineInput::Reset() {
  pending_ = false;
  block_ = false;
  pasted_ = false;
  text_.clear();
}

std::optional<std::string> MultilineInput::Finish() {
  if (!pending_) return std::nullopt;
  std::string done = std::move(text_);
  Reset();
  return done;
}

TerminalStyle StyleFor(bool is_tty, const char* term, const char* no_color) {
  TerminalStyle style;
  style.decorate = is_tty && !(term != nullptr && std::string_view(term) == "dumb");
  style.color = style.decorate && (no_color == nullptr || *no_color == '\0');
  return style;
}

std::string PrefillBar(int64_t done, int64_t total, double seconds, int width) {
  const int64_t d = total > 0 ? std::clamp<int64_t>(done, 0, total) : 0;
  const int filled = total > 0 ? static_cast<int>(d * width / total) : 0;
  const int percent = total > 0 ? static_cast<int>(d * 100 / total) : 0;
  return absl::StrFormat("reading the prompt [%s%s] %3d%% %d/%d tokens %.1f s",
                         std::string(filled, '#'), std::string(width - filled, '-'), percent, d,
                         std::max<int64_t>(total, 0), seconds);
}

}  // namespace coli::cli
