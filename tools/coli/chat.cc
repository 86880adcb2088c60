// `coli chat`: a terminal chat over a private host (started and stopped here, the model loaded
// once for the whole session), or over --host ADDR.
//
//   coli chat [--model DIR] [--host ADDR] [--system TEXT] [--no-think] [--max-tokens N]
//             [--temperature T] [--top-p P] [--seed S] [--frequency-penalty F]
//             [--presence-penalty P] [--repetition-penalty R] [--min-p M] [--logit-bias ID=BIAS,...]
//
// Line editing and history come from libedit (history in ~/.coli_chat_history). Replies stream
// as they are generated; reasoning streams dimmed, or collapsed to a counter (/reasoning hide).
// Ctrl-C stops the current reply (the host stops within one token) and keeps the program;
// Ctrl-D exits; SIGTERM / SIGHUP stop the reply, save the history and end the process as killed
// by that signal ($? = 128 + the signal; cli_args.h ExitLikeSignal).
// A line ending in `\` continues on the next one; `"""` ... `"""` is one multi-line message.
// Terminals that support bracketed paste (xterm's mode 2004, turned on while the chat runs) mark
// pasted text: a paste with line breaks is one message, sent with the next Enter (chat_keys.h).
// Typed text is UTF-8 whatever the locale; lines that are not UTF-8 are refused, never sent.
// When stdout is not a terminal, or TERM=dumb, the output is plain text without escape codes;
// NO_COLOR drops dim and bold. A reply that fails before any text takes its user message back
// out of the conversation.
#include <editline/readline.h>
#include <fcntl.h>
#include <langinfo.h>
#include <locale.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <iostream>
#include <iterator>
#include <limits>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "absl/strings/str_format.h"
#include "common/status/status.h"
#include "host/model_options_env.h"
#include "tools/coli/chat_history.h"
#include "tools/coli/chat_keys.h"
#include "tools/coli/chat_tui.h"
#include "tools/coli/cli_args.h"
#include "tools/coli/client.h"
#include "tools/coli/command.h"
#include "tools/coli/reply_tail.h"
#include "tools/coli/run_flags.h"

namespace coli::cli {
namespace {

// True while the chat waits for piped (non-terminal) input. A signal then closes stdin: a signal
// that lands between the last check of the flags and the blocking read would otherwise only set
// its flag, and the read would wait for one more line (forever on a pipe held open).
std::atomic<bool> g_reading_pipe{false};
void EndPipeRead() {
  if (g_reading_pipe.load()) ::close(STDIN_FILENO);  // async-signal-safe
}
void WakeReader();
std::atomic<bool> g_interrupt{false};
void OnSigint(int) {
  g_interrupt.store(true);
  EndPipeRead();
  WakeReader();
}
// SIGTERM / SIGHUP (the terminal went away): leave the loop, save the history, stop the host.
std::atomic<int> g_terminate{0};
void OnTerminate(int sig) {
  g_terminate.store(sig);
  EndPipeRead();
  WakeReader();
}

constexpr const char* kHelp =
    "  \"\"\"                 start a multi-line message; a line ending in \"\"\" ends it\n"
    "  (a paste)           pasted lines are one message; Enter sends it, or type a line to add\n"
    "  TEXT\\               a line ending in \\ continues on the next line\n"
    "  /think on|off       thinking channel on or off for the next replies\n"
    "  /system TEXT        set the system prompt (empty clears it)\n"
    "  /clear              start a new conversation\n"
    "  /retry              answer the last message again (a new seed unless --seed)\n"
    "  /undo               take back the last message and its reply\n"
    "  /save FILE          save the conversation as JSON (OpenAI message shape; written\n"
    "                      atomically, an existing FILE is replaced and keeps its mode)\n"
    "  /load FILE          continue a saved conversation (/save's file or an OpenAI messages\n"
    "                      array); the model reads it all with the next message\n"
    "  /stats              timing and expert-cache figures\n"
    "  /reasoning show|hide|last   stream reasoning, collapse it, or print the last one\n"
    "  /quit               exit (Ctrl-D too); Ctrl-C stops a reply\n"
    "  Tab completes a command, and a file name after /save or /load.\n";

using Style = TerminalStyle;

Style CurrentStyle() {
  return StyleFor(isatty(STDOUT_FILENO) == 1, std::getenv("TERM"), std::getenv("NO_COLOR"));
}

// A resize (SIGWINCH) and a resume after Ctrl-Z (SIGCONT) while a line is edited. libedit's own
// reader handles them when its read is interrupted; with the read hook below that is ours to do
// (without it the line was not redrawn after `fg`, and a second resize left a stale width).
std::atomic<bool> g_resized{false};
std::atomic<bool> g_continued{false};
bool g_bracketed_paste = false;  // whether the chat asks the terminal for mode 2004
// The read hook waits on the terminal and on this pipe, which every handler writes a byte to: a
// signal taken by another thread (gRPC's) does not interrupt the hook's read, and one taken just
// after the hook looked at the flags would otherwise wait for the next key.
int g_wake_fds[2] = {-1, -1};
void WakeReader() {
  if (g_wake_fds[1] >= 0) {
    const int saved = errno;
    [[maybe_unused]] ssize_t n = ::write(g_wake_fds[1], "!", 1);  // async-signal-safe
    errno = saved;
  }
}
void OnResize(int) {
  g_resized.store(true);
  WakeReader();
}
void OnContinue(int) {
  g_continued.store(true);
  WakeReader();
}

// After a wake-up or EINTR: true when the read should end (Ctrl-C, SIGTERM, SIGHUP); a resize or
// a resume is handled here.
bool HandleSignalsWhileReading() {
  if (g_interrupt.load() || g_terminate.load() != 0) return true;
  if (g_continued.exchange(false)) {
    // The shell that ran meanwhile turned bracketed paste off (bash does on `fg`).
    if (g_bracketed_paste) std::printf("\x1b[?2004h");
    std::fflush(stdout);
    rl_forced_update_display();
  }
  if (g_resized.exchange(false)) rl_resize_terminal();
  return false;
}

// One byte of the terminal for TerminalKeys: waits at most timeout_ms (< 0: no limit). A signal
// the chat acts on (Ctrl-C, SIGTERM, SIGHUP) ends the read; others (a resize) do not.
int ReadTerminalByte(int timeout_ms) {
  while (true) {
    pollfd fds[2] = {{STDIN_FILENO, POLLIN, 0}, {g_wake_fds[0], POLLIN, 0}};
    const int ready = ::poll(fds, g_wake_fds[0] >= 0 ? 2 : 1, timeout_ms);
    if (ready < 0 && errno != EINTR) return TerminalKeys::kEnd;
    if (ready < 0 || (fds[1].revents & POLLIN) != 0) {
      char drain[64];
      while (g_wake_fds[0] >= 0 && ::read(g_wake_fds[0], drain, sizeof(drain)) > 0) {
      }
      if (HandleSignalsWhileReading()) return TerminalKeys::kEnd;
      continue;
    }
    if (ready == 0) return TerminalKeys::kTimedOut;
    unsigned char c;
    const ssize_t n = ::read(STDIN_FILENO, &c, 1);
    if (n == 1) return c;
    if (n < 0 && errno == EINTR) {
      if (HandleSignalsWhileReading()) return TerminalKeys::kEnd;
      continue;
    }
    return TerminalKeys::kEnd;
  }
}

// Tab completes the chat's commands at the start of a line and file names after /save and /load;
// in a message it does nothing (libedit completed file names anywhere, "/lo" to "/lost+found").
constexpr const char* kCommandNames[] = {"/clear",     "/help",  "/load", "/quit",
                                         "/reasoning", "/retry", "/save", "/stats",
                                         "/system",    "/think", "/undo"};
char* NextCommandName(const char* text, int state) {
  static size_t next = 0;
  if (state == 0) next = 0;
  const std::string_view prefix(text);
  while (next < std::size(kCommandNames)) {
    const std::string_view name = kCommandNames[next++];
    if (name.substr(0, prefix.size()) == prefix) return ::strdup(name.data());
  }
  return nullptr;
}
char** CompleteChatLine(const char* text, int start, int /*end*/) {
  std::string_view before(rl_line_buffer, static_cast<size_t>(start));
  while (!before.empty() && (before.front() == ' ' || before.front() == '\t')) {
    before.remove_prefix(1);
  }
  if (before.empty() && text[0] == '/') {
    rl_attempted_completion_over = 1;
    return rl_completion_matches(text, NextCommandName);
  }
  if (before.starts_with("/save ") || before.starts_with("/load ")) return nullptr;  // file names
  rl_attempted_completion_over = 1;
  return nullptr;
}

TerminalKeys* g_keys = nullptr;  // the interactive LineReader's, for libedit's read hook
int ReadKeyForLibedit(FILE*) { return g_keys->Next(); }

// libedit turns the line's characters into bytes with the C library's multibyte functions: in
// the C locale (how the chat ran before) every non-ASCII character was dropped. The chat takes
// only UTF-8, so its LC_CTYPE is UTF-8 whatever the user's locale says.
void UseUtf8Ctype() {
  if (setlocale(LC_CTYPE, "") != nullptr && std::string_view(nl_langinfo(CODESET)) == "UTF-8") {
    return;
  }
  if (setlocale(LC_CTYPE, "C.UTF-8") == nullptr) {
    std::fprintf(stderr, "coli chat: warning: no UTF-8 locale; non-ASCII input may be lost\n");
  }
}

// A terminal-text rendering of pasted text for its echo: control characters other than line
// breaks and tabs are shown as ^X (an ESC in a paste would otherwise drive the terminal).
std::string Printable(const std::string& text) {
  std::string out;
  for (unsigned char c : text) {
    if ((c < 0x20 && c != '\n' && c != '\t') || c == 0x7F) {
      out += '^';
      out += static_cast<char>(c == 0x7F ? '?' : c + '@');
    } else {
      out += static_cast<char>(c);
    }
  }
  return out;
}

class LineReader {
 public:
  explicit LineReader(bool interactive) : interactive_(interactive), keys_(ReadTerminalByte) {
    if (!interactive_) return;
    if (::pipe2(g_wake_fds, O_CLOEXEC | O_NONBLOCK) != 0) g_wake_fds[0] = g_wake_fds[1] = -1;
    // Before anything that initializes libedit (using_history does): it takes the hook then.
    g_keys = &keys_;
    rl_getc_function = ReadKeyForLibedit;
    rl_attempted_completion_function = CompleteChatLine;
    const char* home = std::getenv("HOME");
    history_.emplace(home != nullptr && *home != '\0' ? std::string(home) + "/.coli_chat_history"
                                                      : std::string());
    history_->Load();
    // Bracketed paste: only where escape codes are welcome (TERM=dumb and files get none).
    bracketed_paste_ = g_bracketed_paste = CurrentStyle().decorate;
  }
  ~LineReader() {
    // It stays on while a reply streams: a paste typed ahead then is still one message (the
    // terminal echoes its markers into the reply, as it echoes any typed-ahead keys).
    if (bracketed_paste_) {
      std::printf("\x1b[?2004l");
      std::fflush(stdout);
    }
    if (history_.has_value()) {
      if (absl::Status saved = history_->Save(); !saved.ok()) {
        std::fprintf(stderr, "coli chat: the line history was not saved: %s\n",
                     std::string(saved.message()).c_str());
      }
    }
  }
  // false at end of input (Ctrl-D). An interrupted read returns true with an empty line.
  bool Read(const char* prompt, std::string* line) {
    interrupted_ = false;
    if (!interactive_) {
      g_reading_pipe.store(true);
      const bool stop = g_terminate.load() != 0 || g_interrupt.load();
      const bool got = !stop && static_cast<bool>(std::getline(std::cin, *line));
      g_reading_pipe.store(false);
      if (got && g_terminate.load() == 0 && !g_interrupt.load()) return true;
      // Ctrl-C while waiting for piped input: the read was interrupted, not at its end — leave
      // as a Ctrl-C leaves (128 + SIGINT), not as a finished input (0).
      if (g_interrupt.exchange(false) && g_terminate.load() == 0) g_terminate.store(SIGINT);
      return false;
    }
    pasted_ = refused_ = false;
    g_resized.store(false);
    g_continued.store(false);
    // At every prompt: a shell that ran while the chat was stopped (Ctrl-Z, fg) turns it off.
    if (bracketed_paste_) std::printf("\x1b[?2004h");
    char* raw = readline(prompt);
    if (raw != nullptr) {
      *line = raw;
      std::free(raw);
    }
    // A signal can also end a line normally: a paste cut short by Ctrl-C ends it with '\r'.
    if (raw == nullptr || g_interrupt.load() || g_terminate.load() != 0) {
      if (g_terminate.load() != 0) return false;
      if (g_interrupt.exchange(false)) {
        interrupted_ = true;
        keys_.Reset();
        line->clear();
        std::printf("\n");
        return true;
      }
      return false;
    }
    std::optional<std::string> paste = keys_.TakePaste();
    const std::optional<int> bad = keys_.TakeInvalidByte();
    // A bad byte the user deleted again leaves no U+FFFD behind: only a line that still shows
    // one is refused.
    if (bad.has_value() && line->find("\xEF\xBF\xBD") != std::string::npos) {
      std::printf("this line is not valid UTF-8 (byte 0x%02X); it was not sent\n", *bad);
      refused_ = true;
      return true;
    }
    if (history_.has_value()) history_->Add(*line);
    if (paste.has_value()) {
      if (absl::Status utf8 = CheckUtf8("the pasted text", *paste); !utf8.ok()) {
        std::printf("%s; it was not sent\n", std::string(utf8.message()).c_str());
        refused_ = true;
      } else {
        // The terminal did not show the paste (the editor took it out of the keys): shown here,
        // below the typed start of its line, which is the message's first line.
        std::printf("%s\n", Printable(*paste).c_str());
        paste_ = *std::move(paste);
        pasted_ = true;
      }
    }
    return true;
  }

  // The last Read was ended by Ctrl-C (its line is empty).
  bool interrupted() const { return interrupted_; }
  // Whether the last Read ended in a paste with line breaks (MultilineInput::AddPaste); its
  // line is what was typed before the paste.
  bool pasted() const { return pasted_; }
  const std::string& paste() const { return paste_; }
  // The last Read's line was refused (not UTF-8) and said so; it is dropped.
  bool refused() const { return refused_; }

 private:
  bool interactive_;
  TerminalKeys keys_;
  bool bracketed_paste_ = false;
  bool interrupted_ = false;
  bool pasted_ = false;
  bool refused_ = false;
  std::string paste_;
  // Made after the key hook is set (libedit takes it when its history starts).
  std::optional<ChatHistory> history_;
};

struct ChatFlags : CommonFlags {  // seed_given false: each reply draws a random seed
  std::string system;
  std::optional<bool> think;  // --think / --no-think; else the environment's default, else on
  int max_tokens = 0;  // 0: until the context is full
};

class ChatApp {
 public:
  // `request_defaults`: the chat-request defaults of the environment (K3_THINK as
  // enable_thinking), under what the conversation sets itself.
  ChatApp(client::Client* client, const v1::ModelInfo& model, const ChatFlags& flags,
          nlohmann::json request_defaults)
      : client_(client),
        model_id_(model.id()),
        first_special_(client::FirstSpecialId(model)),
        flags_(flags),
        request_defaults_(std::move(request_defaults)),
        style_(CurrentStyle()) {
    conversation_.set_system(flags.system);
    const auto env_think = request_defaults_.find("enable_thinking");
    conversation_.set_thinking(flags.think ? *flags.think
                               : env_think != request_defaults_.end() && env_think->is_boolean()
                                   ? env_think->get<bool>()
                                   : true);
  }

  int Loop() {
    LineReader reader(isatty(STDIN_FILENO) == 1);
    std::string line;
    MultilineInput multiline;
    // Plain prompt: libedit would count escape codes as visible columns.
    while (true) {
      // A SIGTERM / SIGHUP that stopped a reply ends the chat here, not after one more line.
      if (g_terminate.load() != 0) break;
      if (std::fflush(stdout) != 0 || std::ferror(stdout)) {
        if (g_terminate.load() != 0) break;  // a signal interrupted the write: that signal's exit
        return 128 + SIGPIPE;  // nobody reads the output any more (`coli chat < in | head`)
      }
      const bool more = reader.Read(multiline.pending() ? "...> " : "you> ", &line);
      if (g_terminate.load() != 0) return 128 + g_terminate.load();
      if (!more) {
        std::optional<std::string> last = multiline.Finish();
        if (!last.has_value()) break;
        line = *std::move(last);
      } else if (reader.interrupted()) {
        multiline.Reset();  // Ctrl-C at a continuation prompt drops the unfinished message
        continue;
      } else if (reader.refused()) {
        continue;  // what was gathered before stays
      } else if (reader.pasted()) {
        multiline.AddPaste(line, reader.paste());
        continue;
      } else {
        std::optional<std::string> whole = multiline.Add(line);
        if (!whole.has_value()) continue;
        line = *std::move(whole);
      }
      ChatInput in = multiline.verbatim() ? ParseChatMessage(line) : ParseChatInput(line);
      using K = ChatInput::Kind;
      switch (in.kind) {
        case K::kEmpty: break;
        case K::kQuit: return 0;
        case K::kHelp: std::printf("%s", kHelp); break;
        case K::kInvalid: std::printf("%s\n", in.error.c_str()); break;
        case K::kClear:
          conversation_.Clear();
          std::printf("(new conversation)\n");
          break;
        case K::kThink:
          conversation_.set_thinking(in.argument == "on");
          std::printf("(thinking %s)\n", in.argument.c_str());
          break;
        case K::kSystem:
          conversation_.set_system(in.argument);
          std::printf(in.argument.empty() ? "(system prompt cleared)\n" : "(system prompt set)\n");
          break;
        case K::kSave: {
          struct stat st;
          const bool replaced = ::stat(ExpandHome(in.argument).c_str(), &st) == 0;
          absl::Status s = conversation_.Save(in.argument, model_id_);
          if (s.ok()) {
            std::printf("(saved %zu messages to %s%s)\n", conversation_.Messages().size(),
                        in.argument.c_str(), replaced ? ", replacing the file that was there" : "");
          } else {
            std::printf("save failed: %s\n", std::string(s.message()).c_str());
          }
          break;
        }
        case K::kLoad: {
          absl::Status s = conversation_.Load(in.argument);
          if (s.ok()) {
            std::printf("(loaded %zu messages from %s; thinking %s)\n",
                        conversation_.Messages().size(), in.argument.c_str(),
                        conversation_.thinking() ? "on" : "off");
          } else {
            std::printf("load failed: %s (the conversation is unchanged)\n",
                        std::string(s.message()).c_str());
          }
          break;
        }
        case K::kUndo: {
          const int removed = conversation_.Undo();
          if (removed == 0) {
            std::printf("(nothing to take back)\n");
          } else {
            std::printf("(took back the last exchange: %d message%s)\n", removed,
                        removed == 1 ? "" : "s");
          }
          break;
        }
        case K::kRetry: {
          std::vector<ChatTurn>& turns = conversation_.turns();
          const bool replying = !turns.empty() && turns.back().role == "assistant";
          const size_t user_at = turns.size() - (replying ? 2 : 1);
          if (turns.empty() || user_at >= turns.size() || turns[user_at].role != "user") {
            std::printf("(no message to answer again)\n");
            break;
          }
          std::optional<ChatTurn> previous;
          if (replying) {
            previous = std::move(turns.back());
            turns.pop_back();
          }
          Reply(std::move(previous));
          break;
        }
        case K::kStats: PrintStats(); break;
        case K::kReasoning:
          if (in.argument == "last" || in.argument.empty()) {
            std::printf("%s%s%s\n", style_.dim(),
                        last_reasoning_.empty() ? "(no reasoning yet)" : last_reasoning_.c_str(),
                        style_.reset());
          } else {
            show_reasoning_ = in.argument == "show";
            std::printf("(reasoning %s)\n", show_reasoning_ ? "shown" : "collapsed");
          }
          break;
        case K::kMessage:
          conversation_.turns().push_back({"user", in.argument, "", {}});
          Reply();
          break;
      }
      if (host_ended_) return EndWithoutHost();
      if (!more) break;
    }
    std::printf("\n");
    return g_terminate.load() != 0 ? 128 + g_terminate.load() : 0;
  }

 private:
  // The reply to the last user message. `previous`: the reply it replaces (/retry), put back
  // if the new one fails before any text.
  void Reply(std::optional<ChatTurn> previous = std::nullopt) {
    ChatTurn turn{"assistant", "", "", {}};
    v1::ChatRequest request;
    request.set_model(model_id_);
    request.set_session("chat");
    request.set_request_id(client::Client::NewRequestId());
    // The input refuses text that is not UTF-8; a reply's text is replaced rather than thrown on.
    nlohmann::json body = conversation_.Request();
    host::ApplyRequestDefaults(request_defaults_, &body);
    request.set_request_json(body.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
    request.set_max_tokens(flags_.max_tokens);
    *request.mutable_sampling() = flags_.sampling;
    if (!flags_.seed_given) request.mutable_sampling()->set_seed(RandomSeed());
    request.set_report_progress(style_.decorate);  // the bar below is drawn on a terminal only

    // Ctrl-C during a reply: STOP the request (the partial reply is kept), keep the program.
    std::atomic<bool> done{false};
    std::atomic<bool> first_token{false};
    std::mutex print_mu;
    // Set from the stream (Started arrives once the prompt has been prefilled).
    std::atomic<int64_t> prompt_tokens{0};
    // The host's prefill reports: prompt tokens read of all of them.
    std::atomic<int64_t> prefill_done{0}, prefill_total{0};
    auto start = std::chrono::steady_clock::now();
    std::thread watcher([&] {
      while (!done.load()) {
        if (g_interrupt.exchange(false) || g_terminate.load() != 0) {
          (void)client_->Cancel(request.request_id(), /*stop=*/true);
        }
        // A terminal shows that the prompt is being read until the first token arrives.
        if (style_.decorate && !first_token.load()) {
          std::lock_guard<std::mutex> lock(print_mu);
          if (!first_token.load()) {
            const double secs =
                std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
            const long long n = static_cast<long long>(prompt_tokens.load());
            const int64_t total = prefill_total.load(), done_tokens = prefill_done.load();
            if (n == 0 && total > 0) {
              std::printf("%s%s%s", style_.clear_line(), style_.dim(),
                          PrefillBar(done_tokens, total, secs).c_str());
              std::printf("%s", style_.reset());
            } else if (n > 0) {
              std::printf("%s%sprompt read (%lld tokens), first token… %.1f s%s",
                          style_.clear_line(), style_.dim(), n, secs, style_.reset());
            } else {
              std::printf("%s%sreading the prompt… %.1f s%s", style_.clear_line(), style_.dim(),
                          secs, style_.reset());
            }
            std::fflush(stdout);
          }
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
      }
    });
    enum class Printing { kNothing, kReasoning, kContent } printing = Printing::kNothing;
    int reasoning_pieces = 0;
    client::StreamCallbacks cb;
    cb.on_progress = [&](const v1::PrefillProgress& p) {
      prefill_total.store(p.total());
      prefill_done.store(p.done());
    };
    cb.on_started = [&](const v1::Started& s) { prompt_tokens.store(s.tokens_computed()); };
    // The reply's last tokens and the channel their text continues (NONE after a special token
    // or a tool call), to end a reply cut inside a character with U+FFFD as coli serve does.
    client::ReplyTail last_tokens(first_special_);
    v1::Channel tail_channel = v1::CHANNEL_NONE;
    cb.on_token = [&](const v1::Token& t) { last_tokens.Push(t.id()); };
    cb.on_delta = [&](const v1::ChatDelta& d) {
      const bool text_channel =
          d.channel() == v1::CHANNEL_REASONING || d.channel() == v1::CHANNEL_CONTENT;
      tail_channel = text_channel && !last_tokens.empty() ? d.channel() : v1::CHANNEL_NONE;
      if (d.text().empty() && !d.end_of_message()) return;  // bytes held for a character
      std::lock_guard<std::mutex> lock(print_mu);
      if (!first_token.exchange(true) && style_.decorate) std::printf("%s", style_.clear_line());
      if (d.channel() == v1::CHANNEL_REASONING) {
        turn.reasoning += d.text();
        ++reasoning_pieces;
        if (show_reasoning_) {
          if (printing != Printing::kReasoning) {
            std::printf("%s%s", style_.dim(), style_.decorate ? "" : "[reasoning] ");
            printing = Printing::kReasoning;
          }
          std::printf("%s", d.text().c_str());
        } else if (style_.decorate) {
          std::printf("%s%sthinking… %d%s", style_.clear_line(), style_.dim(), reasoning_pieces,
                      style_.reset());
        }
      } else if (d.channel() == v1::CHANNEL_CONTENT) {
        turn.content += d.text();
        if (printing != Printing::kContent) {
          if (printing == Printing::kReasoning)
            std::printf("%s\n", style_.reset());
          else if (!show_reasoning_ && reasoning_pieces > 0)
            std::printf("%s", style_.clear_line());
          printing = Printing::kContent;
        }
        std::printf("%s", d.text().c_str());
      } else if (d.channel() == v1::CHANNEL_TOOL_CALL) {
        nlohmann::json call = nlohmann::json::parse(d.text(), nullptr, false);
        if (!call.is_discarded()) {
          nlohmann::json args = call.value("arguments", nlohmann::json::object());
          turn.tool_calls.push_back(
              {{"id", absl::StrFormat("call_%d", static_cast<int>(turn.tool_calls.size()))},
               {"type", "function"},
               {"function", {{"name", call.value("name", "")},
                             {"arguments", args.is_string() ? args.get<std::string>() : args.dump()}}}});
        }
        std::printf("%s\n[tool call] %s%s\n", style_.bold(), d.text().c_str(), style_.reset());
      }
      std::fflush(stdout);
    };
    absl::StatusOr<v1::Finished> finished = client_->Chat(request, cb);
    done.store(true);
    watcher.join();
    // Cut inside a character (--max-tokens, the context, Ctrl-C; the model's stop token flushes
    // the decoder): the reply ends with U+FFFD rather than losing the character's first bytes.
    if (finished.ok() && finished->reason() != v1::FINISH_REASON_STOP &&
        finished->reason() != v1::FINISH_REASON_TOOL_CALLS && !last_tokens.empty() &&
        tail_channel != v1::CHANNEL_NONE) {
      absl::StatusOr<std::string> bytes = client_->Detokenize(model_id_, last_tokens.ids());
      const std::string marker = bytes.ok() ? client::ReplyTail::Marker(*bytes) : "";
      if (!marker.empty()) {
        v1::ChatDelta d;
        d.set_channel(tail_channel);
        d.set_text(marker);
        cb.on_delta(d);  // shown and kept as the reply's own text
      }
    }
    // A reply that ended before its first token leaves no progress line behind.
    if (!first_token.load()) std::printf("%s", style_.clear_line());
    std::printf("%s\n", style_.reset());
    last_reasoning_ = turn.reasoning;
    if (finished.ok()) {
      last_finished_ = *finished;
      const v1::Stats& st = finished->stats();
      std::printf("%s[%lld tokens, %.1f tok/s, first token %.2f s%s]%s\n", style_.dim(),
                  static_cast<long long>(finished->usage().completion_tokens()),
                  st.tokens_per_second(), st.ttft_seconds(),
                  finished->reason() == v1::FINISH_REASON_STOPPED ? ", stopped" : "",
                  style_.reset());
      conversation_.turns().push_back(std::move(turn));
    } else {
      // Keep what arrived before the failure. A reply that never started (the prompt did not
      // fit, the host refused it) takes the user's turn back out: left in, every later message
      // would be sent after it and fail the same way. When the private host died (killed for
      // memory, crashed) nothing more can be answered here: the chat ends (EndWithoutHost) and
      // the unanswered message stays, for /retry in the chat that /loads the conversation.
      host_ended_ = client_->PrivateHostEnded().has_value();
      if (host_ended_) {
        std::printf("%serror: %s%s\n", style_.bold(), DescribeError(finished.status()).c_str(),
                    style_.reset());
        if (!turn.content.empty() || !turn.reasoning.empty()) {
          conversation_.turns().push_back(std::move(turn));
        } else if (previous.has_value()) {
          conversation_.turns().push_back(*std::move(previous));
        }
      } else if (!turn.content.empty() || !turn.reasoning.empty()) {
        std::printf("%serror: %s%s\n", style_.bold(), DescribeError(finished.status()).c_str(),
                    style_.reset());
        conversation_.turns().push_back(std::move(turn));
      } else if (previous.has_value()) {
        std::printf("%serror: %s%s\n(the previous reply was kept)\n", style_.bold(),
                    DescribeError(finished.status()).c_str(), style_.reset());
        conversation_.turns().push_back(*std::move(previous));
      } else {
        conversation_.turns().pop_back();
        std::printf("%serror: %s%s\n(that message was not added to the conversation%s)\n",
                    style_.bold(), DescribeError(finished.status()).c_str(), style_.reset(),
                    finished.status().code() == absl::StatusCode::kResourceExhausted
                        ? "; /clear starts a new one"
                        : "");
      }
    }
  }

  // The host that held the model is gone: the conversation goes to a file a new chat can /load
  // (it exists only in this process), and the chat ends.
  int EndWithoutHost() {
    if (conversation_.Messages().empty()) {
      std::printf("coli chat: the model's host is gone; start coli chat again\n");
      return 1;
    }
    const char* home = std::getenv("HOME");
    char stamp[32];
    const std::time_t now = std::time(nullptr);
    std::strftime(stamp, sizeof(stamp), "%Y%m%d-%H%M%S", std::localtime(&now));
    const std::string path = absl::StrFormat("%s/coli-chat-recovered-%s.json",
                                             home != nullptr && *home != '\0' ? home : ".", stamp);
    if (absl::Status saved = conversation_.Save(path, model_id_); !saved.ok()) {
      std::printf("coli chat: the model's host is gone, and the conversation could not be saved: "
                  "%s\n",
                  std::string(saved.message()).c_str());
      return 1;
    }
    std::printf("coli chat: the model's host is gone. The conversation (%zu messages) is in %s: "
                "`/load %s` in a new coli chat goes on from there.\n",
                conversation_.Messages().size(), path.c_str(), path.c_str());
    return 1;
  }

  void PrintStats() {
    if (last_finished_.has_usage()) {
      const v1::Stats& st = last_finished_.stats();
      std::printf("last reply: %lld prompt tokens (%lld reused), %lld generated, ttft %.3f s, "
                  "prefill %.3f s, decode %.3f s, %.2f tok/s\n",
                  static_cast<long long>(last_finished_.usage().prompt_tokens()),
                  static_cast<long long>(last_finished_.usage().tokens_reused()),
                  static_cast<long long>(last_finished_.usage().completion_tokens()),
                  st.ttft_seconds(), st.prefill_seconds(), st.decode_seconds(),
                  st.tokens_per_second());
    } else {
      std::printf("no reply yet\n");
    }
    absl::StatusOr<v1::MetricsResponse> m = client_->Metrics();
    if (m.ok()) {
      std::printf("session: %llu requests, %llu tokens generated, expert hit rate %.1f%%, "
                  "%.1f MB read\n",
                  static_cast<unsigned long long>(m->requests_total()),
                  static_cast<unsigned long long>(m->completion_tokens()),
                  100.0 * m->expert_hit_rate(), m->bytes_read() / 1e6);
    }
  }

  client::Client* client_;
  bool host_ended_ = false;  // the private host died: the chat ends (EndWithoutHost)
  std::string model_id_;
  int32_t first_special_;  // the reply's last tokens (client::ReplyTail)
  ChatFlags flags_;
  nlohmann::json request_defaults_;
  Style style_;
  Conversation conversation_;
  bool show_reasoning_ = true;
  std::string last_reasoning_;
  v1::Finished last_finished_;
};

constexpr const char* kUsage =
    "usage: coli chat [--model DIR] [--host ADDR] [--system TEXT] [--no-think]\n"
    "                 [--max-tokens N] [--temperature T] [--top-p P] [--top-k K] [--seed S]\n"
    "                 [--frequency-penalty F] [--presence-penalty P] [--repetition-penalty R]\n"
    "                 [--min-p M] [--logit-bias ID=BIAS[,ID=BIAS...]]\n"
    "  --max-tokens N  per reply (default 0 = until the context is full; -1 the same)\n"
    "  --seed S        sampled replies draw a random seed each unless S is given (-1 = random)\n"
    "  Flags take --flag VALUE or --flag=VALUE. /help inside the chat lists its commands.\n";

absl::StatusOr<ChatFlags> ParseChatFlags(int argc, char** argv, bool* help) {
  ChatFlags flags;
  ArgReader args(argc, argv);
  while (args.Next()) {
    COLI_ASSIGN_OR_RETURN(bool taken, TakeCommonFlag(args, &flags));
    if (taken) continue;
    if (args.Is("--help") || args.Is("-h")) {
      *help = true;
      return flags;
    } else if (args.Is("--no-think") || args.Is("--think")) {
      COLI_RETURN_IF_ERROR(args.NoValue());
      flags.think = args.Is("--think");
    } else if (args.Is("--system")) {
      COLI_ASSIGN_OR_RETURN(flags.system, args.Value());
      COLI_RETURN_IF_ERROR(CheckUtf8("--system", flags.system));
    } else if (args.Is("--max-tokens") || args.Is("--ngen") || args.Is("-n")) {
      COLI_ASSIGN_OR_RETURN(int64_t n, args.Int(-1, std::numeric_limits<int32_t>::max()));
      flags.max_tokens = static_cast<int>(std::max<int64_t>(n, 0));
    } else if (args.IsFlag()) {
      return args.Unknown();
    } else {
      return absl::InvalidArgumentError("unexpected argument '" + args.arg() +
                                        "' (coli chat takes no prompt; type it at you>)");
    }
  }
  return flags;
}

int RunChat(int argc, char** argv) {
  bool help = false;
  absl::StatusOr<ChatFlags> parsed = ParseChatFlags(argc, argv, &help);
  if (!parsed.ok()) {
    std::fprintf(stderr, "coli chat: %s\n(coli chat --help lists the flags)\n",
                 std::string(parsed.status().message()).c_str());
    return 2;
  }
  if (help) {
    std::printf("%s", kUsage);
    return 0;
  }
  const ChatFlags& flags = *parsed;

  UseUtf8Ctype();
  // No SA_RESTART: an interrupted line read returns.
  CatchUnlessIgnored(SIGWINCH, OnResize);
  CatchUnlessIgnored(SIGCONT, OnContinue);
  CatchUnlessIgnored(SIGINT, OnSigint);
  CatchUnlessIgnored(SIGTERM, OnTerminate);
  CatchUnlessIgnored(SIGHUP, OnTerminate);
  signal(SIGPIPE, SIG_IGN);  // a closed stdout is noticed by its write error

  std::string model_dir = client::ResolveModelDir(flags.model);
  if (absl::Status bad = CheckLocalModelDir(flags, model_dir); !bad.ok()) {
    std::fprintf(stderr, "coli chat: %s\n", std::string(bad.message()).c_str());
    return 2;
  }

  client::ConnectOptions connect;
  connect.host = flags.host;
  absl::StatusOr<std::unique_ptr<client::Client>> client = client::Client::Connect(connect);
  if (!client.ok()) {
    std::fprintf(stderr, "coli chat: %s\n", std::string(client.status().message()).c_str());
    return 1;
  }
  // The model switches of the environment, read with the tables the host's plugins declare: a
  // bad value is a usage error, refused before anything loads. With them come the chat-request
  // defaults the families declare (K3_THINK).
  absl::StatusOr<host::EnvironmentValues> environment = client::ReadEnvironment(**client);
  if (!environment.ok()) {
    std::fprintf(stderr, "coli chat: %s\n", std::string(environment.status().message()).c_str());
    return environment.status().code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
  }
  client::ProgressDisplay bar(stderr);
  // Ctrl-C or SIGTERM while the model loads abandons the load.
  client::CancelToken load_cancel;
  std::atomic<bool> loaded{false};
  std::thread load_watcher([&] {
    while (!loaded.load()) {
      if (g_interrupt.load() || g_terminate.load() != 0) {
        load_cancel.Cancel();
        return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  });
  absl::StatusOr<v1::ModelInfo> model = (*client)->LoadModel(
      model_dir, environment->options, [&](const v1::LoadProgress& p) { bar.Update(p); }, "",
      &load_cancel);
  loaded.store(true);
  load_watcher.join();
  bar.Done();
  if (g_interrupt.exchange(false)) {
    std::fprintf(stderr, "coli chat: interrupted while loading the model\n");
    return 128 + SIGINT;
  }
  if (g_terminate.load() != 0) return 128 + g_terminate.load();
  if (!model.ok()) {
    std::fprintf(stderr, "coli chat: %s\n", DescribeError(model.status()).c_str());
    return 1;
  }
  Style style = CurrentStyle();
  std::printf("%scoli chat%s — %s (%s). /help for commands, Ctrl-C stops a reply, Ctrl-D exits.\n",
              style.bold(), style.reset(), model->id().c_str(), model->family().c_str());
  ChatApp app(client->get(), *model, flags, std::move(environment->request));
  return app.Loop();
}

}  // namespace

COLI_REGISTER_COMMAND(chat, "chat", "terminal chat with a model (private host)", RunChat);

}  // namespace coli::cli
