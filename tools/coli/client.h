// tools/coli/client: the coli client core — what `coli run`, `coli chat`, `coli serve` and
// `coli web` share. Connects to a coli-host (or starts a private one), loads a model with
// progress, streams Generate/Chat with callbacks, cancels.
//
//   COLI_ASSIGN_OR_RETURN(auto client, client::Client::Connect({.host = flag_host}));
//   // no --host: a private coli-host on a Unix socket in a private temp dir, stopped with
//   // `client` (the seed: "starts a private local server ... keeps the model loaded").
//   COLI_ASSIGN_OR_RETURN(v1::ModelOptions options,
//                         client::ModelOptionsFromEnv(*client));  // the plugins' switches
//   client::ProgressDisplay bar(stderr);
//   COLI_ASSIGN_OR_RETURN(v1::ModelInfo model,
//       client->LoadModel(client::ResolveModelDir(flag_model), options,
//                         [&](const v1::LoadProgress& p) { bar.Update(p); }));
//   bar.Done();
//   client::StreamCallbacks cb;
//   cb.on_delta = [](const v1::ChatDelta& d) { ... reasoning / content / tool call ... };
//   client::CancelToken cancel;             // cancel.Cancel() from any thread (e.g. Ctrl-C)
//   COLI_ASSIGN_OR_RETURN(v1::Finished done, client->Chat(request, cb, &cancel));
//
// Errors are absl::Status with the host's gRPC code and message (NOT_FOUND for an unknown
// model, RESOURCE_EXHAUSTED for a full queue or "CONTEXT_EXCEEDED ...", CANCELLED, ...).
#ifndef COLI_TOOLS_COLI_CLIENT_H_
#define COLI_TOOLS_COLI_CLIENT_H_

#include <sys/types.h>

#include <atomic>
#include <cstdio>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "coli/v1/coli.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "host/model_options_env.h"
#include "nlohmann/json.hpp"

namespace coli::client {

namespace v1 = ::coli::v1;

// grpc::Status -> absl::Status (same code and message).
absl::Status FromGrpc(const grpc::Status& status);

// The sampling-knob flags `coli run` and `coli chat` share (docs/status/sampling.md):
//   --frequency-penalty F  --presence-penalty P  --repetition-penalty R  --min-p M
//   --logit-bias ID=BIAS[,ID=BIAS...]
// The host checks the ranges; these parse the text only.
bool IsSamplingKnobFlag(std::string_view flag);
// Sets the knob `flag` names in *sampling from `value` (INVALID_ARGUMENT naming the flag when
// the text is not a number, or not ID=BIAS pairs for --logit-bias; repeats of --logit-bias add).
absl::Status ParseSamplingKnobFlag(std::string_view flag, std::string_view value,
                                   v1::SamplingParams* sampling);

struct ConnectOptions {
  // "unix:/path", "127.0.0.1:PORT", ... Empty: start a private coli-host.
  std::string host;
  // Private host only: its plugin directory (default: $COLI_PLUGIN_DIR, else the build's
  // plugins folder) and binary (default: coli-host next to this executable, else the build's).
  std::string plugin_dir;
  std::string host_binary;
  int workers = 4;  // concurrent requests, batched into shared decode passes by the host
  int queue = 16;
  // How long Connect waits for the host to accept the connection.
  int connect_timeout_ms = 10000;
};

// Lets another thread cancel a streaming call (also safe before the call starts).
class CancelToken {
 public:
  void Cancel();
  bool cancelled() const;

 private:
  friend class Client;
  void Attach(grpc::ClientContext* context);
  void Detach();
  mutable std::mutex mu_;
  bool cancelled_ = false;
  grpc::ClientContext* context_ = nullptr;
};

// A watcher thread that cancels `tokens` once `when()` says so (e.g. a signal handler stored
// the signal; it is asked every 20 ms), then stops; Stop() or destroying it ends it sooner.
class CancelWhen {
 public:
  CancelWhen(std::function<bool()> when, std::vector<CancelToken*> tokens);
  ~CancelWhen() { Stop(); }
  void Stop();  // ends the watching now (once the calls it guards are over)
  CancelWhen(const CancelWhen&) = delete;
  CancelWhen& operator=(const CancelWhen&) = delete;

 private:
  std::atomic<bool> done_{false};
  std::thread watcher_;
};

struct StreamCallbacks {
  // Prefill progress; the host sends it only when the request sets report_progress.
  std::function<void(const v1::PrefillProgress&)> on_progress;
  std::function<void(const v1::Started&)> on_started;
  std::function<void(const v1::Token&)> on_token;
  std::function<void(const v1::ChatDelta&)> on_delta;  // Chat only, after on_token
  // Generate with prompt_logprobs: the prompt tokens' logprobs, piece by piece, after on_started.
  std::function<void(const v1::PromptLogprobs&)> on_prompt_logprobs;
};

class Client {
 public:
  static absl::StatusOr<std::unique_ptr<Client>> Connect(const ConnectOptions& options);
  ~Client();  // stops the private host, if this client started one
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  const std::string& address() const { return address_; }
  bool has_private_host() const { return child_ > 0; }
  v1::Coli::Stub& stub() { return *stub_; }

  // Loads `model_dir` (or finds it already loaded); progress events go to `progress`.
  // `cancel` (optional) abandons the load from another thread (e.g. Ctrl-C): CANCELLED.
  absl::StatusOr<v1::ModelInfo> LoadModel(
      const std::string& model_dir, const v1::ModelOptions& options,
      const std::function<void(const v1::LoadProgress&)>& progress = nullptr,
      const std::string& id = "", CancelToken* cancel = nullptr);

  // Stream a generation to the end. A request without request_id gets a fresh one
  // (NewRequestId) so Cancel() by id works too. Returns the Finished event or the error.
  absl::StatusOr<v1::Finished> Generate(v1::GenerateRequest request, const StreamCallbacks& cb,
                                        CancelToken* cancel = nullptr);
  absl::StatusOr<v1::Finished> Chat(v1::ChatRequest request, const StreamCallbacks& cb,
                                    CancelToken* cancel = nullptr);
  // stop=true: STOP (the stream ends normally, reason STOPPED); false: CANCEL.
  absl::StatusOr<bool> Cancel(const std::string& request_id, bool stop);

  absl::StatusOr<std::vector<int32_t>> Tokenize(const std::string& model, const std::string& text,
                                                bool allow_special = false);
  absl::StatusOr<std::string> Detokenize(const std::string& model, const std::vector<int32_t>& ids);
  absl::StatusOr<v1::ApplyTemplateResponse> ApplyTemplate(const std::string& model,
                                                          const std::string& request_json,
                                                          bool add_generation_prompt = true);
  absl::StatusOr<std::vector<v1::ModelInfo>> ListModels();
  absl::StatusOr<v1::MetricsResponse> Metrics();
  absl::StatusOr<v1::HealthResponse> Health();
  absl::StatusOr<v1::MetricsResponse> GetMetrics();
  absl::Status UnloadModel(const std::string& model);

  static std::string NewRequestId();

  // When this client's private host has ended (killed, crashed), how — "the model's host
  // process (coli-host) was killed by signal 9 (SIGKILL): …" — else nullopt (running, or no
  // private host). Errors of calls made after it died say the same.
  std::optional<std::string> PrivateHostEnded();

 private:
  Client() = default;
  absl::Status StartPrivateHost(const ConnectOptions& options);
  void StopPrivateHost();
  // `status`, or for the transport error of a private host that died, what happened to it.
  absl::Status Explain(absl::Status status);
  absl::Status Explain(const grpc::Status& rpc);  // FromGrpc, then the above

  std::string address_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Coli::Stub> stub_;
  std::mutex child_mu_;  // child_ and host_ended_: PrivateHostEnded may run on any thread
  pid_t child_ = -1;
  std::optional<std::string> host_ended_;
  bool started_private_host_ = false;  // set once, before any other thread uses the client
  std::string temp_dir_;
};

// --model, else $COLI_MODEL, else the embedded tiny model (build/fixtures/k3_tiny).
std::string ResolveModelDir(const std::string& flag);

// The model switches of the environment read once, here at the edge, into typed options: the
// switches the host's loaded plugins declare (ABI 1.8, Health's PluginInfo.switches) and the
// host's own, read by host::ModelOptionsFromEnv (host/model_options_env.h), which coli-host also
// uses for its --model loads. So the client holds no family's variable names, and a host with
// another family reads that family's. INVALID_ARGUMENT naming the variable and the value for a
// value that does not parse or is out of range; the Health call's error otherwise.
absl::StatusOr<v1::ModelOptions> ModelOptionsFromEnv(Client& host);
// The same read, with the chat-request defaults the tables declare too (ABI 1.10, e.g. K3_THINK
// as {"enable_thinking": false}; put them into requests with host::ApplyRequestDefaults), for the
// commands that send chat requests.
absl::StatusOr<host::EnvironmentValues> ReadEnvironment(Client& host);
// The switches of a Health answer: the host's own, then each loaded plugin's.
std::vector<v1::ModelSwitch> SwitchesOf(const v1::HealthResponse& health);

// Load progress: a bar redrawn in place on a terminal, one plain line per stage/10% otherwise.
class ProgressDisplay {
 public:
  explicit ProgressDisplay(std::FILE* out);
  void Update(const v1::LoadProgress& progress);
  void Done();

 private:
  std::FILE* out_;
  bool tty_;
  int last_decile_ = -1;
  std::string last_stage_;
  bool drawn_ = false;
};

// c.LoadModel(model_dir, options) with a ProgressDisplay on stderr, closed when it returns.
absl::StatusOr<v1::ModelInfo> LoadShowingProgress(Client& c, const std::string& model_dir,
                                                  const v1::ModelOptions& options,
                                                  CancelToken* cancel);

}  // namespace coli::client

#endif  // COLI_TOOLS_COLI_CLIENT_H_
