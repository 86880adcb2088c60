// host/plugin: loading model-family plugins (dlopen + ABI negotiation) and C++ wrappers over
// their C function tables.
//
//   PluginSet plugins = PluginSet::LoadDir("build/plugins");   // refusals are logged, not fatal
//   COLI_ASSIGN_OR_RETURN(Plugin* plugin, plugins.ForModel("/models/k3"));
//   COLI_ASSIGN_OR_RETURN(std::unique_ptr<Model> model, plugin->Open("/models/k3", opts,
//   progress)); COLI_ASSIGN_OR_RETURN(std::unique_ptr<Session> session, model->NewSession());
//
// Thread rules follow the ABI's tags: Plugin/Model calls may come from any thread; one Session
// must be used by one thread at a time (the engine guarantees it).
#ifndef COLI_HOST_PLUGIN_H_
#define COLI_HOST_PLUGIN_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "coli/v1/coli.pb.h"
#include "plugin_api/coli_plugin.h"

namespace coli::host {

// What happened to one file of the plugin directory.
struct PluginReport {
  std::string file;
  bool loaded = false;
  std::string error;              // why it was refused
  uint32_t major = 0, minor = 0;  // as the plugin declared them (0.0 when it never answered)
  std::string family, version;
  std::vector<v1::ModelSwitch> switches;  // ABI 1.8: the family's environment switches
};

// Load progress: done of total, a stage label. Return false to cancel.
using ProgressFn = std::function<bool(uint64_t done, uint64_t total, std::string_view stage)>;

// The typed model options (the ABI's coli_model_options_t with owned strings).
struct ModelOptions {
  coli_model_options_t fields;  // numeric fields; string/array members are filled at the call
  std::vector<std::string> extra_dirs;
  std::string trace_path, x0_path, logits_path;
  std::map<std::string, std::string> extra;
  ModelOptions() { coli_model_options_defaults(&fields); }
};

struct SpecialToken {
  std::string text;
  int32_t id = -1;
};

struct ModelInfo {
  std::string family, name;
  int32_t vocab_size = 0, bos_id = -1, eos_id = -1;
  uint32_t chat_capabilities = 0;
  int64_t context_capacity = 0;
  std::vector<SpecialToken> special_tokens;
  std::vector<int32_t> stop_ids;
};

struct RenderedChat {
  std::vector<int32_t> tokens;
  std::string text;
  int32_t chat_parse_mode = 0;
};

struct PrefillResult {
  uint64_t tokens_reused = 0, tokens_computed = 0;
  int64_t context_used = 0, context_capacity = 0;
  // When asked for (ABI 1.7): per prompt position from the second, the prompt token's entry then
  // the top-k most likely, (n - 1) * (1 + k) entries in all.
  std::vector<coli_logprob_t> prompt_logprobs;
  // With them (ABI 1.9, when the plugin reports them): per position from the second, how many
  // vocabulary tokens are at least as likely as the prompt token, itself included; else empty.
  std::vector<int64_t> prompt_logprob_ranks;
};

struct ChatEvent {
  int32_t channel = COLI_CHANNEL_NONE;
  bool end_of_message = false;
  std::string text;
};

// One decode step's outputs, copied out of the plugin's memory.
struct StepResult {
  int32_t token = -1;
  int32_t finish = COLI_FINISH_NONE;
  std::string text;
  float logprob = 0;
  std::vector<coli_logprob_t> top_logprobs;
  std::vector<ChatEvent> events;
};

struct Sampling {
  float temperature = 0, top_p = 0;
  int32_t top_k = 0, logprobs = 0;
  // ABI 1.3, the OpenAI / vLLM knobs (docs/status/sampling.md); zero is neutral for each.
  float repetition_penalty = 0, frequency_penalty = 0, presence_penalty = 0, min_p = 0;
  std::vector<coli_logit_bias_t> logit_bias;  // sent to the plugin as a borrowed array
};

// The first ABI 1.3 knob `s` sets to a non-neutral value ("frequency_penalty", "logit_bias",
// ...), or empty when it sets none.
std::string_view FirstNewKnob(const Sampling& s);

class Plugin;

class Session {
 public:
  ~Session();
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  // `cancel` is polled between prefill chunks; returning true cancels (CANCELLED). `progress`
  // (may be empty) sees the plugin's reports as they come: `done` of `total` tokens computed
  // for this prompt (the reused prefix is not part of either; a plugin may repeat a report).
  // `response_format` (ABI 1.4): the OpenAI response_format object as JSON text, empty = none;
  // the plugin then keeps this generation's answer inside it (docs/status/constrained.md). A
  // plugin whose negotiated minor predates 1.4 would ignore it: INVALID_ARGUMENT
  // ("response_format: needs plugin ABI 1.4 ...") before the plugin is called.
  // `prompt_logprobs` >= 0 (ABI 1.7): also every prompt token's log-probability after the first,
  // with that many top alternatives (the whole prompt is then computed); a plugin older than 1.7
  // gets FAILED_PRECONDITION before it is called.
  absl::StatusOr<PrefillResult> Prefill(
      std::span<const int32_t> tokens, int32_t chat_parse_mode, uint64_t seed,
      const std::function<bool()>& cancel,
      const std::function<void(uint64_t done, uint64_t total)>& progress = nullptr,
      std::string_view response_format = {}, int32_t prompt_logprobs = -1);
  absl::StatusOr<StepResult> Step(const Sampling& sampling);
  // One decode step for each of `sessions` (distinct, all of one plugin, none used by another
  // thread during the call) in ONE decode call, so a plugin that batches rows runs them in one
  // forward pass; results in the order of `sessions`. The plugin's rule holds: a failing row
  // fails the whole call. Then `completed` (when given) gets one entry per row: the outputs of
  // a row the plugin finished before it failed (it wrote a token: a row-by-row plugin steps
  // rows in order), nullopt for a row it left unstepped (retry those alone with Step).
  static absl::StatusOr<std::vector<StepResult>> StepBatch(
      std::span<Session* const> sessions, std::span<const Sampling> sampling,
      std::vector<std::optional<StepResult>>* completed = nullptr);
  absl::Status Reset();
  absl::StatusOr<std::map<std::string, double>> Stats();
  // UNIMPLEMENTED when the negotiated minor predates session_record (1.0).
  absl::StatusOr<std::vector<int32_t>> Record();
  // Whether CopyFrom works (ABI 1.11 session_copy, which a plugin may leave NULL).
  bool CanCopy() const;
  // Makes this session hold what `src` (another session of the same model, no other call on
  // either meanwhile) holds now; right after a prefill of `src`, prefilling the same prompt
  // here then computes nothing (ABI 1.11 session_copy). INVALID_ARGUMENT for `src` itself or a
  // session of another plugin; UNIMPLEMENTED when !CanCopy().
  absl::Status CopyFrom(Session& src);

 private:
  friend class Model;
  Session(const Plugin* plugin, coli_session_t* handle) : plugin_(plugin), handle_(handle) {}
  const Plugin* plugin_;
  coli_session_t* handle_;
};

class Model {
 public:
  ~Model();
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

  const ModelInfo& info() const { return info_; }
  const Plugin& plugin() const { return *plugin_; }
  absl::StatusOr<std::vector<int32_t>> Tokenize(std::string_view text, bool allow_special) const;
  absl::StatusOr<std::string> Detokenize(std::span<const int32_t> ids) const;
  absl::StatusOr<RenderedChat> RenderChat(std::string_view request_json,
                                          bool add_generation_prompt) const;
  absl::StatusOr<std::unique_ptr<Session>> NewSession(int64_t max_context = 0) const;
  // Checks a request's sampling knobs before any work: the ABI 1.3 knobs against their ranges
  // (logit_bias ids against the vocabulary), and INVALID_ARGUMENT naming the knob when the
  // plugin's negotiated minor predates them (it would ignore them). Messages start with the
  // field's name.
  absl::Status CheckSampling(const Sampling& sampling) const;
  // INVALID_ARGUMENT naming response_format when it is set (non-empty) and the plugin's
  // negotiated minor predates ABI 1.4 (it would ignore it); OK otherwise.
  absl::Status CheckResponseFormat(std::string_view response_format) const;
  // The model's current values (ABI 1.2 model_stats); empty for a plugin of an older minor.
  absl::StatusOr<std::map<std::string, double>> Stats() const;
  // How many leading tokens of `prompt` would not run again on `session` (nullptr: a new one)
  // if it were prefilled there now (ABI 1.6 session_reusable; no state changes). The caller
  // keeps other calls off `session` meanwhile. UNIMPLEMENTED for a plugin of an older minor.
  absl::StatusOr<size_t> Reusable(const Session* session, std::span<const int32_t> prompt) const;

 private:
  friend class Plugin;
  Model(const Plugin* plugin, coli_model_t* handle) : plugin_(plugin), handle_(handle) {}
  absl::Status ReadInfo();
  const Plugin* plugin_;
  coli_model_t* handle_;
  ModelInfo info_;
};

class Plugin {
 public:
  ~Plugin();
  Plugin(const Plugin&) = delete;
  Plugin& operator=(const Plugin&) = delete;

  // dlopens `path` and negotiates the ABI; the error names the file and both versions.
  static absl::StatusOr<std::unique_ptr<Plugin>> Load(const std::string& path,
                                                      PluginReport* report);

  const std::string& file() const { return file_; }
  const std::string& family() const { return family_; }
  const std::string& version() const { return version_; }
  uint32_t minor() const { return minor_; }  // the negotiated minor
  const coli_plugin_api_t& api() const { return *api_; }
  // The environment switches the family declares (ABI 1.8), checked at load; none from an
  // older plugin.
  const std::vector<v1::ModelSwitch>& switches() const { return switches_; }

  // `serves_note`, when given, receives what the plugin says it serves when it does not serve
  // `model_dir` (empty when it says nothing).
  absl::StatusOr<bool> Probe(const std::string& model_dir,
                             std::string* serves_note = nullptr) const;
  absl::StatusOr<std::unique_ptr<Model>> Open(const std::string& model_dir,
                                              const ModelOptions& options,
                                              const ProgressFn& progress) const;

 private:
  Plugin() = default;
  std::string file_, family_, version_;
  std::vector<v1::ModelSwitch> switches_;
  void* dl_ = nullptr;
  const coli_plugin_api_t* api_ = nullptr;
  uint32_t minor_ = 0;
};

// Every plugin of a directory. Bad files are refused (logged with their name and versions) and
// the rest still serve.
class PluginSet {
 public:
  static PluginSet LoadDir(const std::string& dir);
  // The first plugin whose probe says it serves `model_dir` (NOT_FOUND naming the directory and
  // the families tried otherwise).
  absl::StatusOr<const Plugin*> ForModel(const std::string& model_dir) const;
  const std::vector<PluginReport>& reports() const { return reports_; }
  const std::vector<std::unique_ptr<Plugin>>& plugins() const { return plugins_; }
  // Every loaded family's switches, in plugin order (host/model_options_env.h adds the host's).
  std::vector<v1::ModelSwitch> Switches() const;

 private:
  std::vector<std::unique_ptr<Plugin>> plugins_;
  std::vector<PluginReport> reports_;
};

// The host API given to every plugin: forwards plugin log lines into common/log.
const coli_host_api_t* HostApi();

}  // namespace coli::host

#endif  // COLI_HOST_PLUGIN_H_
