#include "tools/coli/chat_tui.h"

#include <sys/stat.h>

#include <algorithm>
#include <string_view>

#include "absl/strings/ascii.h"
#include "absl/strings/str_format.h"
#include "absl/strings/match.h"
#include "absl/strings/strip.h"
#include "common/io/io.h"
#include "common/status/status.h"
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
  return {{"messages", Messages()}, {"enable_thinking", thinking_}};
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

namespace {

// A message's content: a string, null (an assistant message with tool calls), or OpenAI's text
// content parts joined.
absl::StatusOr<std::string> ContentText(const nlohmann::json& m, const std::string& where) {
  const auto it = m.find("content");
  if (it == m.end() || it->is_null()) return std::string();
  if (it->is_string()) return it->get<std::string>();
  if (!it->is_array()) return absl::InvalidArgumentError(where + ".content is not a string");
  std::string text;
  for (size_t k = 0; k < it->size(); ++k) {
    const nlohmann::json& part = (*it)[k];
    const std::string at = absl::StrFormat("%s.content[%d]", where, k);
    if (!part.is_object() || part.value("type", "") != "text" || !part.contains("text") ||
        !part["text"].is_string()) {
      return absl::InvalidArgumentError(
          at + " is not a text part (coli chat keeps text only; images and files are not read)");
    }
    text += part["text"].get<std::string>();
  }
  return text;
}

}  // namespace

absl::Status Conversation::FromJson(const nlohmann::json& doc) {
  const nlohmann::json* messages = &doc;
  if (doc.is_object()) {
    if (!doc.contains("messages")) return absl::InvalidArgumentError("no \"messages\" array");
    messages = &doc["messages"];
  }
  if (!messages->is_array()) return absl::InvalidArgumentError("\"messages\" is not an array");
  std::string system;
  std::vector<ChatTurn> turns;
  for (size_t i = 0; i < messages->size(); ++i) {
    const nlohmann::json& m = (*messages)[i];
    const std::string where = absl::StrFormat("messages[%d]", i);
    if (!m.is_object() || !m.contains("role") || !m["role"].is_string()) {
      return absl::InvalidArgumentError(where + " has no role");
    }
    const std::string role = m["role"].get<std::string>();
    COLI_ASSIGN_OR_RETURN(std::string content, ContentText(m, where));
    if (role == "system" || role == "developer") {
      if (i != 0) {
        return absl::InvalidArgumentError(where +
                                          ": a system message is only taken as the first one");
      }
      system = std::move(content);
    } else if (role == "user") {
      turns.push_back({"user", std::move(content), "", {}});
    } else if (role == "assistant") {
      ChatTurn t{"assistant", std::move(content), "", {}};
      if (const auto r = m.find("reasoning_content"); r != m.end() && !r->is_null()) {
        if (!r->is_string()) {
          return absl::InvalidArgumentError(where + ".reasoning_content is not a string");
        }
        t.reasoning = r->get<std::string>();
      }
      if (const auto calls = m.find("tool_calls"); calls != m.end() && !calls->is_null()) {
        if (!calls->is_array()) {
          return absl::InvalidArgumentError(where + ".tool_calls is not an array");
        }
        for (const nlohmann::json& call : *calls) {
          if (!call.is_object() || !call.contains("function") || !call["function"].is_object()) {
            return absl::InvalidArgumentError(where + ".tool_calls has a call without a function");
          }
          t.tool_calls.push_back(call);
        }
      }
      turns.push_back(std::move(t));
    } else {
      return absl::InvalidArgumentError(where + ": role \"" + role +
                                        "\" is not one coli chat keeps (system, user, assistant)");
    }
  }
  if (doc.is_object() && doc.contains("thinking")) {
    if (!doc["thinking"].is_boolean()) {
      return absl::InvalidArgumentError("\"thinking\" is not true or false");
    }
    thinking_ = doc["thinking"].get<bool>();
  }
  system_ = std::move(system);
  turns_ = std::move(turns);
  return absl::OkStatus();
}

absl::Status Conversation::Load(const std::string& path) {
  constexpr uint64_t kMaxBytes = uint64_t{64} << 20;
  COLI_ASSIGN_OR_RETURN(std::string text, io::ReadFileToString(ExpandHome(path), kMaxBytes));
  nlohmann::json doc = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded()) {
    return absl::InvalidArgumentError(path + " is not JSON (or not UTF-8)");
  }
  absl::Status s = FromJson(doc);
  if (!s.ok()) return absl::InvalidArgumentError(path + ": " + std::string(s.message()));
  return absl::OkStatus();
}

int Conversation::Undo() {
  int removed = 0;
  if (!turns_.empty() && turns_.back().role == "assistant") {
    turns_.pop_back();
    ++removed;
  }
  if (!turns_.empty() && turns_.back().role == "user") {
    turns_.pop_back();
    ++removed;
  }
  return removed;
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
  // The command ends at the first space, tab or line break ("/system" then a pasted prompt).
  std::string command = line.substr(0, line.find_first_of(" \t\n"));
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
  } else if (command == "/save" || command == "/load") {
    in.kind = command == "/save" ? K::kSave : K::kLoad;
    in.argument = rest;
    if (rest.empty()) {
      in.kind = K::kInvalid;
      in.error = "usage: " + command + " FILE";
    } else if (rest.find('\n') != std::string::npos) {  // a paste after the command
      in.kind = K::kInvalid;
      in.error = command + ": a file name cannot hold a line break (was text pasted after it?)";
    }
  } else if (command == "/retry" || command == "/undo") {
    in.kind = command == "/retry" ? K::kRetry : K::kUndo;
    if (!rest.empty()) {
      in.kind = K::kInvalid;
      in.error = command + " takes no argument";
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
    verbatim_ = false;
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
    if (pasted_ && rest.empty()) return Done();  // Enter after a paste: the paste as it is
    text_ += '\n';
    if (absl::EndsWith(rest, "\\")) {
      rest.remove_suffix(1);
      text_ += std::string(rest);
      return std::nullopt;
    }
    text_ += std::string(rest);
    return Done();
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
  return Done();
}

void MultilineInput::AddPaste(const std::string& typed, const std::string& pasted) {
  // `"""` typed, then a paste on the same line: the block opens and the paste is its content.
  if (!pending_ && absl::StartsWith(absl::StripLeadingAsciiWhitespace(typed), "\"\"\"")) {
    std::optional<std::string> closed = Add(typed);
    // `"""one-liner"""` then a paste: the one-liner is text before it.
    AddPaste(closed.value_or(""), pasted);
    return;
  }
  const std::string text = typed.empty() ? pasted : typed + "\n" + pasted;
  if (!pending_) {
    text_ = text;
    pending_ = true;
    paste_first_ = typed.empty();
  } else {
    if (!block_ || !first_) text_ += '\n';
    text_ += text;
    first_ = false;
  }
  if (!block_) pasted_ = true;
}

std::string MultilineInput::Done() {
  verbatim_ = block_ || paste_first_;
  std::string done = std::move(text_);
  Reset();
  return done;
}

void MultilineInput::Reset() {
  pending_ = false;
  block_ = false;
  pasted_ = false;
  paste_first_ = false;
  text_.clear();
}

std::optional<std::string> MultilineInput::Finish() {
  if (!pending_) return std::nullopt;
  return Done();
}

ChatInput ParseChatMessage(const std::string& text) {
  ChatInput in;
  if (absl::Status utf8 = CheckUtf8("this message", text); !utf8.ok()) {
    in.kind = ChatInput::Kind::kInvalid;
    in.error = std::string(utf8.message()) + "; it was not sent";
    return in;
  }
  const absl::string_view trimmed = absl::StripTrailingAsciiWhitespace(text);
  if (absl::StripAsciiWhitespace(trimmed).empty()) return in;
  in.kind = ChatInput::Kind::kMessage;
  in.argument = std::string(trimmed);
  return in;
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
