#include "tools/coli/chat_tui.h"

#include <algorithm>

#include "absl/strings/ascii.h"
#include "absl/strings/str_format.h"
#include "absl/strings/match.h"
#include "absl/strings/strip.h"
#include "common/io/io.h"

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
  return io::WriteFileAtomic(path, doc.dump(2) + "\n");
}

ChatInput ParseChatInput(const std::string& raw) {
  std::string line(absl::StripTrailingAsciiWhitespace(raw));
  ChatInput in;
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

std::string PrefillBar(int64_t done, int64_t total, double seconds, int width) {
  const int64_t d = total > 0 ? std::clamp<int64_t>(done, 0, total) : 0;
  const int filled = total > 0 ? static_cast<int>(d * width / total) : 0;
  const int percent = total > 0 ? static_cast<int>(d * 100 / total) : 0;
  return absl::StrFormat("reading the prompt [%s%s] %3d%% %d/%d tokens %.1f s",
                         std::string(filled, '#'), std::string(width - filled, '-'), percent, d,
                         std::max<int64_t>(total, 0), seconds);
}

}  // namespace coli::cli
