#include "tools/coli/client.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <optional>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/flags/flags.h"
#include "common/status/status.h"
#include "host/model_options_env.h"

namespace coli::client {
namespace {

std::string SelfDir() {
  std::error_code ec;
  auto exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  return ec ? std::string() : exe.parent_path().string();
}

std::string Env(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr ? std::string() : std::string(v);
}

// Reads one line from `fd` within `timeout_ms`; false on EOF/timeout.
bool ReadLine(int fd, int timeout_ms, std::string* line) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  char c;
  while (true) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                          until - std::chrono::steady_clock::now())
                          .count();
    if (left <= 0) return false;
    pollfd p{fd, POLLIN, 0};
    int r = poll(&p, 1, static_cast<int>(left));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    ssize_t n = read(fd, &c, 1);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    if (c == '\n') return true;
    line->push_back(c);
  }
}

template <typename Event>
absl::StatusOr<v1::Finished> Drain(grpc::ClientReader<Event>* reader, const StreamCallbacks& cb) {
  Event e;
  v1::Finished finished;
  bool got_finished = false;
  while (reader->Read(&e)) {
    if (e.has_progress()) {
      if (cb.on_progress) cb.on_progress(e.progress());
    } else if (e.has_started()) {
      if (cb.on_started) cb.on_started(e.started());
    } else if (e.has_token()) {
      if constexpr (std::is_same_v<Event, v1::ChatEvent>) {
        if (cb.on_token) cb.on_token(e.token().token());
        if (cb.on_delta) {
          for (const auto& d : e.token().deltas()) cb.on_delta(d);
        }
      } else {
        if (cb.on_token) cb.on_token(e.token());
      }
    } else if (e.has_finished()) {
      finished = e.finished();
      got_finished = true;
    } else if constexpr (std::is_same_v<Event, v1::GenerateEvent>) {
      if (e.has_prompt_logprobs() && cb.on_prompt_logprobs) {
        cb.on_prompt_logprobs(e.prompt_logprobs());
      }
    }
  }
  COLI_RETURN_IF_ERROR(FromGrpc(reader->Finish()));
  if (!got_finished) return absl::InternalError("stream ended without a finished event");
  return finished;
}

// How the private host ended, for a user who only saw their request fail.
std::string DescribeHostEnd(int status) {
  if (WIFEXITED(status)) {
    return absl::StrCat("the model's host process (coli-host) exited with status ",
                        WEXITSTATUS(status));
  }
  const int sig = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
  const char* abbrev = sigabbrev_np(sig);
  std::string out = absl::StrCat("the model's host process (coli-host) was killed by signal ", sig,
                                 abbrev != nullptr ? absl::StrCat(" (SIG", abbrev, ")") : "");
  if (sig == SIGKILL) {
    absl::StrAppend(&out,
                    ": the kernel's out-of-memory killer ends processes this way — `dmesg | grep "
                    "-i oom` tells; the model family's switches (`coli-host --switches`: a "
                    "smaller expert cache, fewer bits) make it need less memory");
  }
  return out;
}

}  // namespace

absl::Status FromGrpc(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()), status.error_message());
}

// ---- CancelToken ----------------------------------------------------------------------------

void CancelToken::Cancel() {
  std::lock_guard<std::mutex> lock(mu_);
  cancelled_ = true;
  if (context_ != nullptr) context_->TryCancel();
}

bool CancelToken::cancelled() const {
  std::lock_guard<std::mutex> lock(mu_);
  return cancelled_;
}

CancelWhen::CancelWhen(std::function<bool()> when, std::vector<CancelToken*> tokens)
    : watcher_([this, when = std::move(when), tokens = std::move(tokens)] {
        while (!done_.load()) {
          if (when()) {
            for (CancelToken* t : tokens) t->Cancel();
            return;
          }
          std::this_thread::sleep_for(std::chrono::milliseconds(20));
        }
      }) {}

void CancelWhen::Stop() {
  done_.store(true);
  if (watcher_.joinable()) watcher_.join();
}

void CancelToken::Attach(grpc::ClientContext* context) {
  std::lock_guard<std::mutex> lock(mu_);
  context_ = context;
  if (cancelled_) context_->TryCancel();
}

void CancelToken::Detach() {
  std::lock_guard<std::mutex> lock(mu_);
  context_ = nullptr;
}

// ---- Client ---------------------------------------------------------------------------------

absl::StatusOr<std::unique_ptr<Client>> Client::Connect(const ConnectOptions& options) {
  std::unique_ptr<Client> client(new Client());
  if (options.host.empty()) {
    COLI_RETURN_IF_ERROR(client->StartPrivateHost(options));
  } else {
    client->address_ = options.host;
  }
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(64 << 20);
  client->channel_ =
      grpc::CreateCustomChannel(client->address_, grpc::InsecureChannelCredentials(), args);
  const auto deadline =
      std::chrono::system_clock::now() + std::chrono::milliseconds(options.connect_timeout_ms);
  if (!client->channel_->WaitForConnected(deadline)) {
    return absl::UnavailableError(
        absl::StrCat("cannot reach coli-host at '", client->address_, "'"));
  }
  client->stub_ = v1::Coli::NewStub(client->channel_);
  return client;
}

Client::~Client() { StopPrivateHost(); }

absl::Status Client::StartPrivateHost(const ConnectOptions& options) {
  std::string binary = options.host_binary;
  if (binary.empty()) {
    const std::string beside = SelfDir() + "/coli-host";
    binary = access(beside.c_str(), X_OK) == 0 ? beside : std::string(COLI_CLIENT_HOST_BINARY);
  }
  if (access(binary.c_str(), X_OK) != 0) {
    return absl::NotFoundError(absl::StrCat("coli-host binary '", binary, "' not found"));
  }
  std::string plugin_dir = options.plugin_dir;
  if (plugin_dir.empty()) {
    plugin_dir = Env("COLI_PLUGIN_DIR");
    // Checked here, by its name: the host would blame its --plugin-dir flag, never typed.
    if (!plugin_dir.empty()) {
      COLI_RETURN_IF_ERROR(flags::CheckModelDir("COLI_PLUGIN_DIR", plugin_dir));
    }
  }
  if (plugin_dir.empty()) plugin_dir = COLI_CLIENT_PLUGIN_DIR;

  std::string pattern = (std::filesystem::temp_directory_path() / "coli-XXXXXX").string();
  if (mkdtemp(pattern.data()) == nullptr) {
    return absl::InternalError(absl::StrCat("mkdtemp: ", std::strerror(errno)));
  }
  temp_dir_ = pattern;
  address_ = "unix:" + temp_dir_ + "/host.sock";

  int ready[2];
  if (pipe2(ready, O_CLOEXEC) != 0) {
    return absl::InternalError(absl::StrCat("pipe: ", std::strerror(errno)));
  }
  const std::string workers = std::to_string(options.workers);
  const std::string queue = std::to_string(options.queue);
  std::vector<std::string> argv_s = {binary,     "--listen",   address_, "--plugin-dir",
                                     plugin_dir, "--workers",  workers,  "--queue",
                                     queue,      "--ready-fd", "3"};
  std::vector<char*> argv;
  for (auto& a : argv_s) argv.push_back(a.data());
  argv.push_back(nullptr);
  // The child's environment is built before fork (only async-signal-safe calls after it).
  std::vector<std::string> env_s;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) env_s.emplace_back(*e);
  if (std::getenv("COLI_LOG_LEVEL") == nullptr) env_s.emplace_back("COLI_LOG_LEVEL=warning");
  std::vector<char*> envp;
  for (auto& e : env_s) envp.push_back(e.data());
  envp.push_back(nullptr);
  const pid_t parent = getpid();
  pid_t pid = fork();
  if (pid < 0) return absl::InternalError(absl::StrCat("fork: ", std::strerror(errno)));
  if (pid == 0) {
    // The host dies with its client, whatever happens to the client.
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (getppid() != parent) _exit(1);
    // Its own process group: a Ctrl-C at the client's terminal stops the reply (the client
    // cancels the request), not the host.
    setpgid(0, 0);
    dup2(ready[1], 3);  // dup2 clears CLOEXEC on the copy
    execve(argv[0], argv.data(), envp.data());
    _exit(127);
  }
  close(ready[1]);
  child_ = pid;
  started_private_host_ = true;
  std::string line;
  const bool ok = ReadLine(ready[0], 60000, &line);
  close(ready[0]);
  if (!ok || line.rfind("READY ", 0) != 0) {
    int status = 0;
    std::string why = "did not report READY within 60 s";
    // A host that refused its flags or environment closes the pipe as it exits: give it a
    // moment to be reaped, so the error says it exited (and how) instead of a timeout.
    bool reaped = waitpid(pid, &status, WNOHANG) == pid;
    for (int i = 0; i < 100 && !reaped && !ok; ++i) {
      usleep(10000);
      reaped = waitpid(pid, &status, WNOHANG) == pid;
    }
    if (reaped) {
      child_ = -1;
      why = WIFEXITED(status) ? absl::StrCat("exited with status ", WEXITSTATUS(status))
                              : absl::StrCat("died by signal ", WTERMSIG(status));
    }
    StopPrivateHost();
    return absl::UnavailableError(absl::StrCat("private coli-host '", binary, "' ", why));
  }
  return absl::OkStatus();
}

void Client::StopPrivateHost() {
  stub_.reset();
  channel_.reset();
  std::lock_guard<std::mutex> lock(child_mu_);
  if (child_ > 0) {
    kill(child_, SIGTERM);
    int status = 0;
    bool reaped = false;
    for (int i = 0; i < 200 && !reaped; ++i) {  // up to 10 s for a clean shutdown
      if (waitpid(child_, &status, WNOHANG) == child_)
        reaped = true;
      else
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    if (!reaped) {
      kill(child_, SIGKILL);
      waitpid(child_, &status, 0);
    }
    child_ = -1;
  }
  if (!temp_dir_.empty()) {
    std::error_code ec;
    std::filesystem::remove_all(temp_dir_, ec);
    temp_dir_.clear();
  }
}

std::optional<std::string> Client::PrivateHostEnded() {
  std::lock_guard<std::mutex> lock(child_mu_);
  if (!host_ended_.has_value() && child_ > 0) {
    int status = 0;
    if (waitpid(child_, &status, WNOHANG) == child_) {
      child_ = -1;
      host_ended_ = DescribeHostEnd(status);
    }
  }
  return host_ended_;
}

absl::Status Client::Explain(const grpc::Status& rpc) { return Explain(FromGrpc(rpc)); }

absl::Status Client::Explain(absl::Status status) {
  // A host that died shows up as the transport's words ("Socket closed", "Connection refused").
  if (status.ok() || status.code() != absl::StatusCode::kUnavailable) return status;
  if (!started_private_host_) return status;
  // The socket closes while the process is still being torn down: give it a moment to be reaped.
  for (int i = 0; i < 50; ++i) {
    if (std::optional<std::string> ended = PrivateHostEnded(); ended.has_value()) {
      return absl::UnavailableError(absl::StrCat(*ended, " (", status.message(), ")"));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return status;
}

std::string Client::NewRequestId() {
  static std::atomic<uint64_t> counter{0};
  return absl::StrCat("cli-", getpid(), "-", ++counter);
}

absl::StatusOr<v1::ModelInfo> Client::LoadModel(
    const std::string& model_dir, const v1::ModelOptions& options,
    const std::function<void(const v1::LoadProgress&)>& progress, const std::string& id,
    CancelToken* cancel) {
  v1::LoadModelRequest request;
  request.set_model_dir(model_dir);
  request.set_id(id);
  *request.mutable_options() = options;
  grpc::ClientContext context;
  if (cancel != nullptr) cancel->Attach(&context);
  auto reader = stub_->LoadModel(&context, request);
  v1::LoadModelEvent e;
  v1::ModelInfo info;
  bool loaded = false;
  while (reader->Read(&e)) {
    if (e.has_progress() && progress) progress(e.progress());
    if (e.has_loaded()) {
      info = e.loaded();
      loaded = true;
    }
  }
  absl::Status finished = Explain(reader->Finish());
  if (cancel != nullptr) cancel->Detach();
  COLI_RETURN_IF_ERROR(finished);
  if (!loaded) return absl::InternalError("LoadModel ended without the model's info");
  return info;
}

absl::StatusOr<v1::Finished> Client::Generate(v1::GenerateRequest request,
                                              const StreamCallbacks& cb, CancelToken* cancel) {
  if (request.request_id().empty()) request.set_request_id(NewRequestId());
  grpc::ClientContext context;
  if (cancel != nullptr) cancel->Attach(&context);
  auto reader = stub_->Generate(&context, request);
  auto result = Drain(reader.get(), cb);
  if (cancel != nullptr) cancel->Detach();
  if (!result.ok()) return Explain(result.status());
  return result;
}

absl::StatusOr<v1::Finished> Client::Chat(v1::ChatRequest request, const StreamCallbacks& cb,
                                          CancelToken* cancel) {
  if (request.request_id().empty()) request.set_request_id(NewRequestId());
  grpc::ClientContext context;
  if (cancel != nullptr) cancel->Attach(&context);
  auto reader = stub_->Chat(&context, request);
  auto result = Drain(reader.get(), cb);
  if (cancel != nullptr) cancel->Detach();
  if (!result.ok()) return Explain(result.status());
  return result;
}

absl::StatusOr<bool> Client::Cancel(const std::string& request_id, bool stop) {
  grpc::ClientContext context;
  v1::CancelRequest request;
  request.set_request_id(request_id);
  request.set_stop(stop);
  v1::CancelResponse response;
  COLI_RETURN_IF_ERROR(Explain(stub_->Cancel(&context, request, &response)));
  return response.found();
}

absl::StatusOr<std::vector<int32_t>> Client::Tokenize(const std::string& model,
                                                      const std::string& text, bool allow_special) {
  grpc::ClientContext context;
  v1::TokenizeRequest request;
  request.set_model(model);
  request.set_text(text);
  request.set_allow_special(allow_special);
  v1::TokenizeResponse response;
  COLI_RETURN_IF_ERROR(Explain(stub_->Tokenize(&context, request, &response)));
  return std::vector<int32_t>(response.ids().begin(), response.ids().end());
}

absl::StatusOr<std::string> Client::Detokenize(const std::string& model,
                                               const std::vector<int32_t>& ids) {
  grpc::ClientContext context;
  v1::DetokenizeRequest request;
  request.set_model(model);
  request.mutable_ids()->Add(ids.begin(), ids.end());
  v1::DetokenizeResponse response;
  COLI_RETURN_IF_ERROR(Explain(stub_->Detokenize(&context, request, &response)));
  return response.text();
}

absl::StatusOr<v1::ApplyTemplateResponse> Client::ApplyTemplate(const std::string& model,
                                                                const std::string& request_json,
                                                                bool add_generation_prompt) {
  grpc::ClientContext context;
  v1::ApplyTemplateRequest request;
  request.set_model(model);
  request.set_request_json(request_json);
  request.set_add_generation_prompt(add_generation_prompt);
  v1::ApplyTemplateResponse response;
  COLI_RETURN_IF_ERROR(Explain(stub_->ApplyTemplate(&context, request, &response)));
  return response;
}

absl::StatusOr<std::vector<v1::ModelInfo>> Client::ListModels() {
  grpc::ClientContext context;
  v1::ListModelsResponse response;
  COLI_RETURN_IF_ERROR(Explain(stub_->ListModels(&context, v1::ListModelsRequest(), &response)));
  return std::vector<v1::ModelInfo>(response.models().begin(), response.models().end());
}

absl::StatusOr<v1::MetricsResponse> Client::Metrics() {
  grpc::ClientContext context;
  v1::MetricsResponse response;
  COLI_RETURN_IF_ERROR(Explain(stub_->GetMetrics(&context, v1::MetricsRequest(), &response)));
  return response;
}

absl::StatusOr<v1::HealthResponse> Client::Health() {
  grpc::ClientContext context;
  v1::HealthResponse response;
  COLI_RETURN_IF_ERROR(Explain(stub_->Health(&context, v1::HealthRequest(), &response)));
  return response;
}

absl::StatusOr<v1::MetricsResponse> Client::GetMetrics() {
  grpc::ClientContext context;
  v1::MetricsResponse response;
  COLI_RETURN_IF_ERROR(Explain(stub_->GetMetrics(&context, v1::MetricsRequest(), &response)));
  return response;
}

absl::Status Client::UnloadModel(const std::string& model) {
  grpc::ClientContext context;
  v1::UnloadModelRequest request;
  request.set_model(model);
  v1::UnloadModelResponse response;
  return Explain(stub_->UnloadModel(&context, request, &response));
}

// ---- model selection and options ------------------------------------------------------------

std::string ResolveModelDir(const std::string& flag) {
  if (!flag.empty()) return flag;
  std::string env = Env("COLI_MODEL");
  if (!env.empty()) return env;
  return COLI_CLIENT_TINY_MODEL;
}

std::vector<v1::ModelSwitch> SwitchesOf(const v1::HealthResponse& health) {
  std::vector<v1::ModelSwitch> family_switches;
  for (const v1::PluginInfo& plugin : health.plugins()) {
    if (!plugin.loaded()) continue;
    family_switches.insert(family_switches.end(), plugin.switches().begin(),
                           plugin.switches().end());
  }
  return host::WithHostSwitches(family_switches);
}

absl::StatusOr<host::EnvironmentValues> ReadEnvironment(Client& host) {
  COLI_ASSIGN_OR_RETURN(v1::HealthResponse health, host.Health());
  return host::ReadEnvironment(SwitchesOf(health));
}

absl::StatusOr<v1::ModelOptions> ModelOptionsFromEnv(Client& host) {
  COLI_ASSIGN_OR_RETURN(host::EnvironmentValues values, ReadEnvironment(host));
  return std::move(values.options);
}

// ---- progress -------------------------------------------------------------------------------

ProgressDisplay::ProgressDisplay(std::FILE* out) : out_(out), tty_(isatty(fileno(out)) != 0) {}

void ProgressDisplay::Update(const v1::LoadProgress& p) {
  const double fraction =
      p.total() > 0 ? static_cast<double>(p.done()) / static_cast<double>(p.total()) : 0.0;
  if (tty_) {
    constexpr int kWidth = 40;
    const int filled = static_cast<int>(fraction * kWidth + 0.5);
    std::fprintf(out_, "\rloading %-10.10s [%s%s] %3d%%", p.stage().c_str(),
                 std::string(filled, '#').c_str(), std::string(kWidth - filled, '.').c_str(),
                 static_cast<int>(fraction * 100 + 0.5));
    std::fflush(out_);
    drawn_ = true;
    return;
  }
  const int decile = static_cast<int>(fraction * 10);
  if (decile != last_decile_ || p.stage() != last_stage_) {
    last_decile_ = decile;
    last_stage_ = p.stage();
    std::fprintf(out_, "loading %s: %llu/%llu (%d%%)\n", p.stage().c_str(),
                 static_cast<unsigned long long>(p.done()),
                 static_cast<unsigned long long>(p.total()),
                 static_cast<int>(fraction * 100 + 0.5));
  }
}

void ProgressDisplay::Done() {
  if (tty_ && drawn_) std::fprintf(out_, "\n");
  drawn_ = false;
}

bool IsSamplingKnobFlag(std::string_view flag) {
  return flag == "--frequency-penalty" || flag == "--presence-penalty" ||
         flag == "--repetition-penalty" || flag == "--min-p" || flag == "--logit-bias";
}

absl::Status ParseSamplingKnobFlag(std::string_view flag, std::string_view value,
                                   v1::SamplingParams* sampling) {
  const absl::string_view text(value.data(), value.size());
  const std::string name(flag);
  if (flag == "--logit-bias") {
    for (absl::string_view pair : absl::StrSplit(text, ',', absl::SkipEmpty())) {
      const std::vector<absl::string_view> kv = absl::StrSplit(pair, absl::MaxSplits('=', 1));
      int32_t id = 0;
      float bias = 0;
      if (kv.size() != 2 || !absl::SimpleAtoi(kv[0], &id) || !absl::SimpleAtof(kv[1], &bias)) {
        return absl::InvalidArgumentError(
            absl::StrCat(name, ": '", pair, "' is not ID=BIAS (e.g. 1234=-100)"));
      }
      auto* entry = sampling->add_logit_bias();
      entry->set_id(id);
      entry->set_bias(bias);
    }
    return absl::OkStatus();
  }
  float v = 0;
  if (!absl::SimpleAtof(text, &v)) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": '", text, "' is not a number"));
  }
  if (flag == "--frequency-penalty") {
    sampling->set_frequency_penalty(v);
  } else if (flag == "--presence-penalty") {
    sampling->set_presence_penalty(v);
  } else if (flag == "--repetition-penalty") {
    sampling->set_repetition_penalty(v);
  } else if (flag == "--min-p") {
    sampling->set_min_p(v);
  } else {
    return absl::InvalidArgumentError(absl::StrCat(name, " is not a sampling flag"));
  }
  return absl::OkStatus();
}

absl::StatusOr<v1::ModelInfo> LoadShowingProgress(Client& c, const std::string& model_dir,
                                                  const v1::ModelOptions& options,
                                                  CancelToken* cancel) {
  ProgressDisplay bar(stderr);
  auto model = c.LoadModel(
      model_dir, options, [&](const v1::LoadProgress& p) { bar.Update(p); }, "", cancel);
  bar.Done();
  return model;
}

}  // namespace coli::client
