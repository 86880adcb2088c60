#include "host/service.h"

#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <deque>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/log/log.h"
#include "common/status/status.h"
#include "grpc/health/v1/health.pb.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/health_check_service_interface.h"

namespace coli::host {
namespace {

// A server-streaming reactor fed from any thread: Push() queues events, written one at a time;
// Done() finishes after the queue drains. OnCancel runs `on_cancel` (set before the first Push).
// With a `starter`, writes that Push / Done begin are started on its thread rather than the
// caller's (a generation thread between two decode steps); writes that follow a finished one
// start inline on gRPC's thread.
template <typename Event>
class StreamReactor : public grpc::ServerWriteReactor<Event> {
 public:
  explicit StreamReactor(WriteStarter* starter = nullptr) : starter_(starter) {}

  void SetOnCancel(std::function<void()> fn) {
    std::lock_guard<std::mutex> lock(mu_);
    on_cancel_ = std::move(fn);
    if (cancelled_ && on_cancel_) on_cancel_();
  }

  void Push(Event event) {
    std::unique_lock<std::mutex> lock(mu_);
    if (broken_) return;
    pending_.push_back(std::move(event));
    Pump(lock, /*from_grpc=*/false);
  }

  void Done(grpc::Status status) {
    std::unique_lock<std::mutex> lock(mu_);
    done_ = true;
    status_ = std::move(status);
    Pump(lock, /*from_grpc=*/false);
  }

  void OnWriteDone(bool ok) override {
    std::unique_lock<std::mutex> lock(mu_);
    writing_ = false;
    if (!ok) {  // the client is gone: drop what is left, the cancel path ends the request
      broken_ = true;
      pending_.clear();
    }
    Pump(lock, /*from_grpc=*/true);
  }

  void OnCancel() override {
    std::function<void()> fn;
    {
      std::lock_guard<std::mutex> lock(mu_);
      cancelled_ = true;
      fn = on_cancel_;
    }
    if (fn) fn();
  }

  void OnDone() override { delete this; }

 private:
  // Starts the next write, or Finish once everything is written. Never calls into gRPC with the
  // lock held (a reaction may run inline). While a posted start waits, writing_ / finished_ are
  // already set, so nothing else starts and the reactor (deleted only after Finish completes)
  // outlives the posted call.
  void Pump(std::unique_lock<std::mutex>& lock, bool from_grpc) {
    if (writing_ || finished_) return;
    const bool post = starter_ != nullptr && !from_grpc;
    if (!pending_.empty()) {
      current_ = std::move(pending_.front());
      pending_.pop_front();
      writing_ = true;
      lock.unlock();
      if (post) {
        starter_->Post([this] { this->StartWrite(&current_); });
      } else {
        this->StartWrite(&current_);
      }
      return;
    }
    if (done_) {
      finished_ = true;
      grpc::Status status = status_;
      lock.unlock();
      if (post) {
        starter_->Post([this, status] { this->Finish(status); });
      } else {
        this->Finish(status);
      }
    }
  }

  WriteStarter* const starter_;
  std::mutex mu_;
  std::deque<Event> pending_;
  Event current_;
  bool writing_ = false, done_ = false, finished_ = false, broken_ = false, cancelled_ = false;
  grpc::Status status_;
  std::function<void()> on_cancel_;
};

std::optional<std::chrono::steady_clock::time_point> DeadlineOf(
    const grpc::CallbackServerContext* context) {
  const auto deadline = context->deadline();
  if (deadline == std::chrono::system_clock::time_point::max()) return std::nullopt;
  const auto left = deadline - std::chrono::system_clock::now();
  if (left > std::chrono::hours(24 * 365)) return std::nullopt;
  return std::chrono::steady_clock::now() +
         std::chrono::duration_cast<std::chrono::steady_clock::duration>(left);
}

// Generate and Chat share everything but the token event's shape.
template <typename Event>
grpc::ServerWriteReactor<Event>* StartGeneration(Engine* engine, WriteStarter* starter,
                                                 grpc::CallbackServerContext* context,
                                                 GenerationInput input) {
  auto* reactor = new StreamReactor<Event>(starter);
  input.deadline = DeadlineOf(context);
  EventSink sink;
  sink.on_progress = [reactor](const v1::PrefillProgress& progress) {
    Event e;
    *e.mutable_progress() = progress;
    reactor->Push(std::move(e));
  };
  sink.on_started = [reactor](const v1::Started& started) {
    Event e;
    *e.mutable_started() = started;
    reactor->Push(std::move(e));
  };
  sink.on_prompt_logprobs = [reactor](const v1::PromptLogprobs& piece) {
    Event e;
    *e.mutable_prompt_logprobs() = piece;
    reactor->Push(std::move(e));
  };
  sink.on_token = [reactor](const v1::Token& token, std::span<const v1::ChatDelta> deltas) {
    Event e;
    if constexpr (std::is_same_v<Event, v1::ChatEvent>) {
      auto* t = e.mutable_token();
      *t->mutable_token() = token;
      for (const auto& d : deltas) *t->add_deltas() = d;
    } else {
      *e.mutable_token() = token;
    }
    reactor->Push(std::move(e));
  };
  sink.on_choice_finished = [reactor](const v1::ChoiceFinished& choice) {
    Event e;
    *e.mutable_choice_finished() = choice;
    reactor->Push(std::move(e));
  };
  sink.on_done = [reactor](const absl::Status& status, const v1::Finished& finished) {
    if (status.ok()) {
      Event e;
      *e.mutable_finished() = finished;
      reactor->Push(std::move(e));
    }
    reactor->Done(ToGrpc(status));
  };
  // The cancel hook is installed before Submit: once submitted, the request may finish and the
  // reactor go away at any time, so nothing below touches the reactor again.
  struct CancelLink {
    std::mutex mu;
    std::weak_ptr<Request> request;
    bool cancelled = false;
  };
  auto link = std::make_shared<CancelLink>();
  reactor->SetOnCancel([link, engine] {
    std::shared_ptr<Request> request;
    {
      std::lock_guard<std::mutex> lock(link->mu);
      link->cancelled = true;
      request = link->request.lock();
    }
    // Through the engine: a request still queued ends at once (Engine::Cancel).
    if (request != nullptr) engine->Cancel(request, /*stop=*/false);
  });
  auto request = engine->Submit(std::move(input), std::move(sink));
  if (!request.ok()) {
    reactor->Done(ToGrpc(request.status()));
    return reactor;
  }
  bool cancelled;
  {
    std::lock_guard<std::mutex> lock(link->mu);
    link->request = *request;
    cancelled = link->cancelled;
  }
  if (cancelled) engine->Cancel(*request, /*stop=*/false);
  return reactor;
}

}  // namespace

grpc::Status ToGrpc(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), std::string(status.message()));
}

ColiService::~ColiService() {
  std::unique_lock<std::mutex> lock(mu_);
  loaders_done_.wait(lock, [this] { return loaders_running_ == 0; });
}

int ColiService::loaders_running() const {
  std::lock_guard<std::mutex> lock(mu_);
  return loaders_running_;
}

grpc::ServerUnaryReactor* ColiService::Health(grpc::CallbackServerContext* context,
                                              const v1::HealthRequest*,
                                              v1::HealthResponse* response) {
  *response = engine_->Health();
  auto* reactor = context->DefaultReactor();
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

grpc::ServerUnaryReactor* ColiService::ListModels(grpc::CallbackServerContext* context,
                                                  const v1::ListModelsRequest*,
                                                  v1::ListModelsResponse* response) {
  for (auto& m : engine_->ListModels()) *response->add_models() = std::move(m);
  auto* reactor = context->DefaultReactor();
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

grpc::ServerWriteReactor<v1::LoadModelEvent>* ColiService::LoadModel(
    grpc::CallbackServerContext* context, const v1::LoadModelRequest* request) {
  auto* reactor = new StreamReactor<v1::LoadModelEvent>();
  auto cancelled = std::make_shared<std::atomic<bool>>(false);
  reactor->SetOnCancel([cancelled] { cancelled->store(true); });
  // Loading can take minutes: it runs on its own thread, streaming progress. The thread is
  // detached and counted: a joinable one kept until shutdown held its 8 MiB stack mapping and
  // its touched pages after it ended, for every LoadModel call (a client that makes sure of its
  // model at each start grew a long-running host without bound).
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++loaders_running_;
  }
  std::thread([this, reactor, cancelled, req = *request] {
    int last_percent = -1;
    std::string last_stage;
    ProgressFn progress = [&](uint64_t done, uint64_t total, std::string_view stage) {
      const int percent =
          total > 0
              ? static_cast<int>(100.0 * static_cast<double>(done) / static_cast<double>(total))
              : 0;
      if (percent != last_percent || stage != last_stage) {
        last_percent = percent;
        last_stage = std::string(stage);
        v1::LoadModelEvent e;
        e.mutable_progress()->set_done(done);
        e.mutable_progress()->set_total(total);
        e.mutable_progress()->set_stage(std::string(stage));
        reactor->Push(std::move(e));
      }
      return !cancelled->load();
    };
    auto info = engine_->LoadModel(req, progress);
    if (info.ok()) {
      v1::LoadModelEvent e;
      *e.mutable_loaded() = *info;
      reactor->Push(std::move(e));
    } else if (cancelled->load()) {
      info = absl::CancelledError(
          absl::StrCat("loading '", req.model_dir(), "' cancelled: ", info.status().message()));
    }
    reactor->Done(ToGrpc(info.status()));
    // Last, under the lock: once the count drops the destructor may run, and nothing of `this`
    // is touched after the unlock.
    std::lock_guard<std::mutex> lock(mu_);
    --loaders_running_;
    loaders_done_.notify_all();
  }).detach();
  return reactor;
}

grpc::ServerUnaryReactor* ColiService::UnloadModel(grpc::CallbackServerContext* context,
                                                   const v1::UnloadModelRequest* request,
                                                   v1::UnloadModelResponse*) {
  auto* reactor = context->DefaultReactor();
  reactor->Finish(ToGrpc(engine_->UnloadModel(request->model())));
  return reactor;
}

grpc::ServerWriteReactor<v1::GenerateEvent>* ColiService::Generate(
    grpc::CallbackServerContext* context, const v1::GenerateRequest* request) {
  return StartGeneration<v1::GenerateEvent>(engine_, &write_starter_, context,
                                            GenerationInput::From(*request));
}

grpc::ServerWriteReactor<v1::ChatEvent>* ColiService::Chat(grpc::CallbackServerContext* context,
                                                           const v1::ChatRequest* request) {
  return StartGeneration<v1::ChatEvent>(engine_, &write_starter_, context,
                                        GenerationInput::From(*request));
}

grpc::ServerUnaryReactor* ColiService::Cancel(grpc::CallbackServerContext* context,
                                              const v1::CancelRequest* request,
                                              v1::CancelResponse* response) {
  response->set_found(request->has_choice()
                          ? engine_->CancelChoice(request->request_id(), request->choice())
                          : engine_->Cancel(request->request_id(), request->stop()));
  auto* reactor = context->DefaultReactor();
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

grpc::ServerUnaryReactor* ColiService::Tokenize(grpc::CallbackServerContext* context,
                                                const v1::TokenizeRequest* request,
                                                v1::TokenizeResponse* response) {
  auto* reactor = context->DefaultReactor();
  auto ids = engine_->Tokenize(request->model(), request->text(), request->allow_special());
  if (ids.ok()) response->mutable_ids()->Add(ids->begin(), ids->end());
  reactor->Finish(ToGrpc(ids.status()));
  return reactor;
}

grpc::ServerUnaryReactor* ColiService::Detokenize(grpc::CallbackServerContext* context,
                                                  const v1::DetokenizeRequest* request,
                                                  v1::DetokenizeResponse* response) {
  auto* reactor = context->DefaultReactor();
  std::vector<int32_t> ids(request->ids().begin(), request->ids().end());
  auto text = engine_->Detokenize(request->model(), ids);
  if (text.ok()) response->set_text(*text);
  reactor->Finish(ToGrpc(text.status()));
  return reactor;
}

grpc::ServerUnaryReactor* ColiService::ApplyTemplate(grpc::CallbackServerContext* context,
                                                     const v1::ApplyTemplateRequest* request,
                                                     v1::ApplyTemplateResponse* response) {
  auto* reactor = context->DefaultReactor();
  auto rendered = engine_->ApplyTemplate(request->model(), request->request_json(),
                                         request->add_generation_prompt());
  if (rendered.ok()) {
    response->mutable_ids()->Add(rendered->tokens.begin(), rendered->tokens.end());
    response->set_text(rendered->text);
  }
  reactor->Finish(ToGrpc(rendered.status()));
  return reactor;
}

grpc::ServerUnaryReactor* ColiService::GetMetrics(grpc::CallbackServerContext* context,
                                                  const v1::MetricsRequest*,
                                                  v1::MetricsResponse* response) {
  *response = engine_->Metrics();
  auto* reactor = context->DefaultReactor();
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

// ---- server -------------------------------------------------------------------------------

bool IsLocalAddress(const std::string& address) {
  if (absl::StartsWith(address, "unix:") || absl::StartsWith(address, "unix-abstract:")) {
    return true;
  }
  for (const char* prefix :
       {"127.0.0.1:", "localhost:", "[::1]:", "ipv4:127.0.0.1:", "ipv6:[::1]:"}) {
    if (absl::StartsWith(address, prefix)) return true;
  }
  return false;
}

absl::Status PrepareUnixSocketPath(const std::string& path) {
  struct stat st;
  if (lstat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return absl::OkStatus();
    return absl::FailedPreconditionError(
        absl::StrCat("cannot listen on unix:", path, ": ", std::strerror(errno)));
  }
  if (!S_ISSOCK(st.st_mode)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "cannot listen on unix:", path, ": the path exists and is not a socket (not removed)"));
  }
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  if (path.size() >= sizeof(address.sun_path)) {
    return absl::InvalidArgumentError(absl::StrCat("unix socket path '", path, "' is too long (",
                                                   path.size(), " bytes, at most ",
                                                   sizeof(address.sun_path) - 1, ")"));
  }
  std::memcpy(address.sun_path, path.data(), path.size());
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    return absl::InternalError(absl::StrCat("socket(AF_UNIX): ", std::strerror(errno)));
  }
  const int connected = connect(fd, reinterpret_cast<const sockaddr*>(&address), sizeof(address));
  const int connect_errno = errno;
  close(fd);
  if (connected == 0) {
    return absl::AlreadyExistsError(
        absl::StrCat("cannot listen on unix:", path, ": another process is listening there"));
  }
  if (connect_errno != ECONNREFUSED) {
    return absl::FailedPreconditionError(absl::StrCat(
        "cannot listen on unix:", path, ": probing it failed: ", std::strerror(connect_errno)));
  }
  if (unlink(path.c_str()) != 0 && errno != ENOENT) {  // stale: its listener is gone
    return absl::FailedPreconditionError(
        absl::StrCat("cannot remove the stale socket unix:", path, ": ", std::strerror(errno)));
  }
  COLI_LOG(kInfo) << "removed the stale socket " << path;
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<HostServer>> HostServer::Start(Engine* engine,
                                                              const ServerOptions& options) {
  if (options.listen.empty()) return absl::InvalidArgumentError("no listen address given");
  if (!options.allow_remote && !IsLocalAddress(options.listen)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "listen address '", options.listen,
        "' is not a Unix socket or loopback address (pass --allow-remote to listen wider)"));
  }
  if (absl::StartsWith(options.listen, "unix:")) {
    COLI_RETURN_IF_ERROR(PrepareUnixSocketPath(options.listen.substr(5)));
  }
  std::unique_ptr<HostServer> server(new HostServer());
  server->engine_ = engine;
  server->service_ = std::make_unique<ColiService>(engine);
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  // Reflection serves the descriptors of the generated pool; gRPC's built-in health service has
  // none, so this keeps proto/grpc/health/v1's generated messages (and their file) linked in.
  (void)grpc::health::v1::HealthCheckRequest::descriptor();
  grpc::ServerBuilder builder;
  // gRPC sets SO_REUSEPORT by default: a second host on a busy port would start and share it,
  // the kernel splitting connections between two hosts. The port must be ours alone.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  int port = 0;
  builder.AddListeningPort(options.listen, grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(server->service_.get());
  builder.SetMaxReceiveMessageSize(64 << 20);
  server->server_ = builder.BuildAndStart();
  if (server->server_ == nullptr || (port == 0 && !absl::StartsWith(options.listen, "unix"))) {
    return absl::UnavailableError(
        absl::StrCat("cannot listen on '", options.listen, "' (address in use or invalid?)"));
  }
  server->address_ = options.listen;
  if (!absl::StartsWith(options.listen, "unix")) {
    const size_t colon = options.listen.rfind(':');
    server->address_ = absl::StrCat(options.listen.substr(0, colon), ":", port);
  }
  if (auto* health = server->server_->GetHealthCheckService()) {
    // The server as a whole ("") and the coli.v1.Coli service by name, which probes ask for
    // (grpc_health_probe -service, Kubernetes' grpc.service); NOT_SERVING at Shutdown.
    health->SetServingStatus(v1::Coli::service_full_name(), true);
    health->SetServingStatus(true);
  }
  COLI_LOG(kInfo) << "coli-host listening on " << server->address_;
  return server;
}

HostServer::~HostServer() { Shutdown(); }

void HostServer::Shutdown() {
  if (shut_down_) return;
  shut_down_ = true;
  if (server_ != nullptr) {
    if (auto* health = server_->GetHealthCheckService()) health->SetServingStatus(false);
  }
  engine_->Shutdown();  // every request in flight ends (UNAVAILABLE) and its stream finishes
  if (server_ != nullptr) {
    server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(5));
    server_->Wait();
  }
  service_.reset();
}

}  // namespace coli::host
