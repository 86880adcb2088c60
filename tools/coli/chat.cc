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
// Ctrl-D exits. When stdout is not a terminal the output is plain text without escape codes.
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <mutex>
#include <string>
#include <thread>

#include <editline/readline.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "tools/coli/chat_tui.h"
#include "tools/coli/client.h"
#include "tools/coli/command.h"

namespace coli::cli {
namespace {

std::atomic<bool> g_interrupt{false};
void OnSigint(int) { g_interrupt.store(true); }

constexpr const char* kHelp =
    "  /think on|off       thinking channel on or off for the next replies\n"
    "  /system TEXT        set the system prompt (empty clears it)\n"
    "  /clear              start a new conversation\n"
    "  /save FILE          save the conversation as JSON (OpenAI message shape)\n"
    "  /stats              timing and expert-cache figures\n"
    "  /reasoning show|hide|last   stream reasoning, collapse it, or print the last one\n"
    "  /quit               exit (Ctrl-D too); Ctrl-C stops a reply\n";

// Terminal styling that disappears when the output is not a terminal.
struct Style {
  bool tty;
  const char* dim() const { return tty ? "\x1b[2m" : ""; }
  const char* bold() const { return tty ? "\x1b[1m" : ""; }
  const char* reset() const { return tty ? "\x1b[0m" : ""; }
  const char* clear_line() const { return tty ? "\r\x1b[2K" : ""; }
};

class LineReader {
 public:
  explicit LineReader(bool interactive) : interactive_(interactive) {
    if (!interactive_) return;
    if (const char* home = std::getenv("HOME")) history_ = std::string(home) + "/.coli_chat_history";
    using_history();
    if (!history_.empty()) read_history(history_.c_str());
  }
  ~LineReader() {
    if (interactive_ && !history_.empty()) write_history(history_.c_str());
  }
  // false at end of input (Ctrl-D). An interrupted read returns true with an empty line.
  bool Read(const char* prompt, std::string* line) {
    if (!interactive_) return static_cast<bool>(std::getline(std::cin, *line));
    char* raw = readline(prompt);
    if (raw == nullptr) {
      if (g_interrupt.exchange(false)) {
        line->clear();
        std::printf("\n");
        return true;
      }
      return false;
    }
    *line = raw;
    if (*raw) add_history(raw);
    std::free(raw);
    return true;
  }

 private:
  bool interactive_;
  std::string history_;
};

struct ChatFlags {
  std::string model, host, system;
  bool think = true;
  int max_tokens = 0;
  v1::SamplingParams sampling;
};

class ChatApp {
 public:
  ChatApp(client::Client* client, std::string model_id, const ChatFlags& flags)
      : client_(client), model_id_(std::move(model_id)), flags_(flags),
        style_{isatty(STDOUT_FILENO) == 1} {
    conversation_.set_system(flags.system);
    conversation_.set_thinking(flags.think);
  }

  int Loop() {
    LineReader reader(isatty(STDIN_FILENO) == 1);
    std::string line;
    // Plain prompt: libedit would count escape codes as visible columns.
    const std::string prompt = "you> ";
    while (true) {
      std::fflush(stdout);
      if (!reader.Read(prompt.c_str(), &line)) break;
      ChatInput in = ParseChatInput(line);
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
          absl::Status s = conversation_.Save(in.argument, model_id_);
          if (s.ok()) std::printf("(saved %zu messages to %s)\n", conversation_.Messages().size(),
                                  in.argument.c_str());
          else std::printf("save failed: %s\n", std::string(s.message()).c_str());
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
    }
    std::printf("\n");
    return 0;
  }

 private:
  void Reply() {
    ChatTurn turn{"assistant", "", "", {}};
    v1::ChatRequest request;
    request.set_model(model_id_);
    request.set_session("chat");
    request.set_request_id(client::Client::NewRequestId());
    request.set_request_json(conversation_.Request().dump());
    request.set_max_tokens(flags_.max_tokens);
    *request.mutable_sampling() = flags_.sampling;
    request.set_report_progress(style_.tty);  // the bar below is drawn on a terminal only

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
        if (g_interrupt.exchange(false)) {
          (void)client_->Cancel(request.request_id(), /*stop=*/true);
        }
        // A terminal shows that the prompt is being read until the first token arrives.
        if (style_.tty && !first_token.load()) {
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
    cb.on_delta = [&](const v1::ChatDelta& d) {
      std::lock_guard<std::mutex> lock(print_mu);
      if (!first_token.exchange(true) && style_.tty) std::printf("%s", style_.clear_line());
      if (d.channel() == v1::CHANNEL_REASONING) {
        turn.reasoning += d.text();
        ++reasoning_pieces;
        if (show_reasoning_) {
          if (printing != Printing::kReasoning) {
            std::printf("%s%s", style_.dim(), style_.tty ? "" : "[reasoning] ");
            printing = Printing::kReasoning;
          }
          std::printf("%s", d.text().c_str());
        } else if (style_.tty) {
          std::printf("%s%sthinking… %d%s", style_.clear_line(), style_.dim(), reasoning_pieces,
                      style_.reset());
        }
      } else if (d.channel() == v1::CHANNEL_CONTENT) {
        turn.content += d.text();
        if (printing != Printing::kContent) {
          if (printing == Printing::kReasoning) std::printf("%s\n", style_.reset());
          else if (!show_reasoning_ && reasoning_pieces > 0) std::printf("%s", style_.clear_line());
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
      std::printf("%serror: %s%s\n", style_.bold(), std::string(finished.status().message()).c_str(),
                  style_.reset());
      // Keep what arrived before the failure; the user's turn stays so they can retry.
      if (!turn.content.empty() || !turn.reasoning.empty()) conversation_.turns().push_back(std::move(turn));
    }
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
  std::string model_id_;
  ChatFlags flags_;
  Style style_;
  Conversation conversation_;
  bool show_reasoning_ = true;
  std::string last_reasoning_;
  v1::Finished last_finished_;
};

int Usage() {
  std::fprintf(stderr,
               "usage: coli chat [--model DIR] [--host ADDR] [--system TEXT] [--no-think]\n"
               "                 [--max-tokens N] [--temperature T] [--top-p P] [--seed S]\n"
               "                %s\n",
               client::kSamplingKnobUsage);
  return 2;
}

int RunChat(int argc, char** argv) {
  ChatFlags flags;
  if (const char* t = std::getenv("K3_THINK")) flags.think = std::string(t) != "0";
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    auto value = [&]() -> const char* { return i + 1 < argc ? argv[++i] : nullptr; };
    const char* v = nullptr;
    if (arg == "--no-think") flags.think = false;
    else if (arg == "--think") flags.think = true;
    else if (arg == "--model" && (v = value())) flags.model = v;
    else if (arg == "--host" && (v = value())) flags.host = v;
    else if (arg == "--system" && (v = value())) flags.system = v;
    else if (arg == "--max-tokens" && (v = value())) {
      if (!absl::SimpleAtoi(v, &flags.max_tokens)) return Usage();
    } else if (arg == "--temperature" && (v = value())) {
      float t;
      if (!absl::SimpleAtof(v, &t)) return Usage();
      flags.sampling.set_temperature(t);
    } else if (arg == "--top-p" && (v = value())) {
      float p;
      if (!absl::SimpleAtof(v, &p)) return Usage();
      flags.sampling.set_top_p(p);
    } else if (arg == "--seed" && (v = value())) {
      uint64_t s;
      if (!absl::SimpleAtoi(v, &s)) return Usage();
      flags.sampling.set_seed(s);
    } else if (client::IsSamplingKnobFlag(arg) && (v = value())) {
      if (absl::Status bad = client::ParseSamplingKnobFlag(arg, v, &flags.sampling); !bad.ok()) {
        std::fprintf(stderr, "coli chat: %s\n", std::string(bad.message()).c_str());
        return 2;
      }
    } else {
      return Usage();
    }
  }

  struct sigaction sa = {};
  sa.sa_handler = OnSigint;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = 0;  // no SA_RESTART: an interrupted line read returns
  sigaction(SIGINT, &sa, nullptr);

  client::ConnectOptions connect;
  connect.host = flags.host;
  absl::StatusOr<std::unique_ptr<client::Client>> client = client::Client::Connect(connect);
  if (!client.ok()) {
    std::fprintf(stderr, "coli chat: %s\n", std::string(client.status().message()).c_str());
    return 1;
  }
  absl::StatusOr<v1::ModelOptions> options = client::ModelOptionsFromEnv();
  if (!options.ok()) {
    std::fprintf(stderr, "coli chat: %s\n", std::string(options.status().message()).c_str());
    return 2;
  }
  std::string model_dir = client::ResolveModelDir(flags.model);
  client::ProgressDisplay bar(stderr);
  absl::StatusOr<v1::ModelInfo> model = (*client)->LoadModel(
      model_dir, *options, [&](const v1::LoadProgress& p) { bar.Update(p); });
  bar.Done();
  if (!model.ok()) {
    std::fprintf(stderr, "coli chat: %s\n", std::string(model.status().message()).c_str());
    return 1;
  }
  Style style{isatty(STDOUT_FILENO) == 1};
  std::printf("%scoli chat%s — %s (%s). /help for commands, Ctrl-C stops a reply, Ctrl-D exits.\n",
              style.bold(), style.reset(), model->id().c_str(), model->family().c_str());
  ChatApp app(client->get(), model->id(), flags);
  return app.Loop();
}

}  // namespace

COLI_REGISTER_COMMAND(chat, "chat", "terminal chat with a model (private host)", RunChat);

}  // namespace coli::cli
