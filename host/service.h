// host/service: the coli.v1.Coli gRPC service (callback API) over an Engine, and the server that
// listens on a Unix socket or loopback (wider only with allow_remote).
//
//   Engine engine(engine_options);
//   COLI_ASSIGN_OR_RETURN(auto server, HostServer::Start(&engine, {.listen = "unix:/tmp/c.sock"}));
//   ...                      // serve until asked to stop
//   server->Shutdown();      // ends requests in flight (UNAVAILABLE), then stops listening
#ifndef COLI_HOST_SERVICE_H_
#define COLI_HOST_SERVICE_H_

#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "coli/v1/coli.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "host/engine.h"
#include "host/write_starter.h"

namespace coli::host {

// absl::Status -> grpc::Status with the same code and message.
grpc::Status ToGrpc(const absl::Status& status);

class ColiService final : public v1::Coli::CallbackService {
 public:
  explicit ColiService(Engine* engine) : engine_(engine) {}
  ~ColiService() override;  // waits for the model-loading threads

  grpc::ServerUnaryReactor* Health(grpc::CallbackServerContext*, const v1::HealthRequest*,
                                   v1::HealthResponse*) override;
  grpc::ServerUnaryReactor* ListModels(grpc::CallbackServerContext*, const v1::ListModelsRequest*,
                                       v1::ListModelsResponse*) override;
  grpc::ServerWriteReactor<v1::LoadModelEvent>* LoadModel(grpc::CallbackServerContext*,
                                                          const v1::LoadModelRequest*) override;
  grpc::ServerUnaryReactor* UnloadModel(grpc::CallbackServerContext*, const v1::UnloadModelRequest*,
                                        v1::UnloadModelResponse*) override;
  grpc::ServerWriteReactor<v1::GenerateEvent>* Generate(grpc::CallbackServerContext*,
                                                        const v1::GenerateRequest*) override;
  grpc::ServerWriteReactor<v1::ChatEvent>* Chat(grpc::CallbackServerContext*,
                                                const v1::ChatRequest*) override;
  grpc::ServerUnaryReactor* Cancel(grpc::CallbackServerContext*, const v1::CancelRequest*,
                                   v1::CancelResponse*) override;
  grpc::ServerUnaryReactor* Tokenize(grpc::CallbackServerContext*, const v1::TokenizeRequest*,
                                     v1::TokenizeResponse*) override;
  grpc::ServerUnaryReactor* Detokenize(grpc::CallbackServerContext*, const v1::DetokenizeRequest*,
                                       v1::DetokenizeResponse*) override;
  grpc::ServerUnaryReactor* ApplyTemplate(grpc::CallbackServerContext*,
                                          const v1::ApplyTemplateRequest*,
                                          v1::ApplyTemplateResponse*) override;
  grpc::ServerUnaryReactor* GetMetrics(grpc::CallbackServerContext*, const v1::MetricsRequest*,
                                       v1::MetricsResponse*) override;

  // Model-loading threads still running (each LoadModel call runs on one of its own).
  int loaders_running() const;

 private:
  Engine* engine_;
  mutable std::mutex mu_;
  std::condition_variable loaders_done_;
  int loaders_running_ = 0;     // detached LoadModel threads that have not finished
  WriteStarter write_starter_;  // declared last: its thread drains before the rest goes
};

struct ServerOptions {
  // "unix:/path/to/socket", "127.0.0.1:PORT", "localhost:PORT", "[::1]:PORT" (PORT 0 = any).
  std::string listen;
  bool allow_remote = false;  // permit any other address (e.g. 0.0.0.0:PORT)
};

// True for Unix sockets and loopback addresses.
bool IsLocalAddress(const std::string& address);

// Makes `path` free for a Unix socket to listen on: OK when nothing is there, or after removing a
// stale socket (one nobody accepts on, left by a host that crashed). ALREADY_EXISTS when a
// process listens there (a second host must not take a live host's address away), and
// FAILED_PRECONDITION for a path that is not a socket (never removed).
absl::Status PrepareUnixSocketPath(const std::string& path);

class HostServer {
 public:
  static absl::StatusOr<std::unique_ptr<HostServer>> Start(Engine* engine,
                                                           const ServerOptions& options);
  ~HostServer();
  // The address clients dial (with the chosen port when PORT was 0).
  const std::string& address() const { return address_; }
  // Ends requests in flight, stops the server, waits for its threads. Idempotent.
  void Shutdown();
  // ColiService::loaders_running (0 after Shutdown).
  int loaders_running() const { return service_ != nullptr ? service_->loaders_running() : 0; }

 private:
  HostServer() = default;
  Engine* engine_ = nullptr;
  std::unique_ptr<ColiService> service_;
  std::unique_ptr<grpc::Server> server_;
  std::string address_;
  bool shut_down_ = false;
};

}  // namespace coli::host

#endif  // COLI_HOST_SERVICE_H_
