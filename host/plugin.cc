#include "host/plugin.h"

#include <dlfcn.h>

#include <algorithm>
#include <filesystem>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/io/io.h"
#include "common/json/json.h"
#include "common/log/log.h"
#include "common/sampling/sampling.h"
#include "common/status/status.h"
#include "host/model_options_env.h"
#include "plugin_api/cpp/abi_util.h"

namespace coli::host {
namespace {

using abi::ErrorText;
using abi::Init;
using abi::Str;
using abi::View;

void HostLog(void* /*host_data*/, int32_t level, const char* message, size_t length) {
  LogLevel l = LogLevel::kInfo;
  if (level <= COLI_LOG_DEBUG)
    l = LogLevel::kDebug;
  else if (level == COLI_LOG_WARNING)
    l = LogLevel::kWarning;
  else if (level >= COLI_LOG_ERROR)
    l = LogLevel::kError;
  LogMessage(l, std::string_view(message ? message : "", message ? length : 0));
}

std::string VersionText(uint32_t major, uint32_t minor) { return absl::StrCat(major, ".", minor); }

// Table size each minor of major 1 requires.
size_t TableSizeFor(uint32_t minor) {
  return minor == 0    ? COLI_PLUGIN_API_SIZE_V1_0
         : minor == 1  ? COLI_PLUGIN_API_SIZE_V1_1
         : minor == 2  ? COLI_PLUGIN_API_SIZE_V1_2
         : minor == 3  ? COLI_PLUGIN_API_SIZE_V1_3
         : minor == 4  ? COLI_PLUGIN_API_SIZE_V1_4
         : minor == 5  ? COLI_PLUGIN_API_SIZE_V1_5
         : minor <= 7  ? COLI_PLUGIN_API_SIZE_V1_6
         : minor <= 10 ? COLI_PLUGIN_API_SIZE_V1_8
                       : COLI_PLUGIN_API_SIZE_V1_11;
}

// The entries of minor 0 that must not be NULL (shutdown is optional).
absl::Status CheckEntries(const coli_plugin_api_t& api, uint32_t minor) {
  std::vector<std::string> missing;
  auto need = [&](const void* fn, const char* name) {
    if (fn == nullptr) missing.push_back(name);
  };
  need(reinterpret_cast<const void*>(api.probe), "probe");
  need(reinterpret_cast<const void*>(api.model_open), "model_open");
  need(reinterpret_cast<const void*>(api.model_close), "model_close");
  need(reinterpret_cast<const void*>(api.model_info), "model_info");
  need(reinterpret_cast<const void*>(api.tokenize), "tokenize");
  need(reinterpret_cast<const void*>(api.detokenize), "detokenize");
  need(reinterpret_cast<const void*>(api.render_chat), "render_chat");
  need(reinterpret_cast<const void*>(api.session_create), "session_create");
  need(reinterpret_cast<const void*>(api.session_destroy), "session_destroy");
  need(reinterpret_cast<const void*>(api.session_reset), "session_reset");
  need(reinterpret_cast<const void*>(api.prefill), "prefill");
  need(reinterpret_cast<const void*>(api.decode), "decode");
  need(reinterpret_cast<const void*>(api.session_stats), "session_stats");
  if (minor >= 1) need(reinterpret_cast<const void*>(api.session_record), "session_record");
  if (minor >= 2) need(reinterpret_cast<const void*>(api.model_stats), "model_stats");
  if (minor >= 6) need(reinterpret_cast<const void*>(api.session_reusable), "session_reusable");
  if (missing.empty()) return absl::OkStatus();
  return absl::FailedPreconditionError(
      absl::StrCat("function table leaves NULL: ", absl::StrJoin(missing, ", ")));
}

int32_t ProgressThunk(void* user, uint64_t done, uint64_t total, const char* stage,
                      size_t stage_length) {
  const auto* fn = static_cast<const ProgressFn*>(user);
  if (fn == nullptr || !*fn) return 0;
  return (*fn)(done, total, std::string_view(stage ? stage : "", stage ? stage_length : 0)) ? 0 : 1;
}

// What the prefill's progress callback reaches: the caller's progress view and cancel poll.
struct PrefillHooks {
  const std::function<bool()>* cancel;
  const std::function<void(uint64_t, uint64_t)>* progress;
};

int32_t PrefillThunk(void* user, uint64_t done, uint64_t total, const char*, size_t) {
  const auto* hooks = static_cast<const PrefillHooks*>(user);
  if (hooks == nullptr) return 0;
  if (*hooks->progress) (*hooks->progress)(done, total);
  return (*hooks->cancel && (*hooks->cancel)()) ? 1 : 0;
}

}  // namespace

const coli_host_api_t* HostApi() {
  static const coli_host_api_t api = [] {
    auto a = Init<coli_host_api_t>();
    a.abi_major = COLI_ABI_VERSION_MAJOR;
    a.abi_minor = COLI_ABI_VERSION_MINOR;
    a.host_data = nullptr;
    a.log = &HostLog;
    return a;
  }();
  return &api;
}

// ---- Plugin -------------------------------------------------------------------------------

Plugin::~Plugin() {
  if (api_ != nullptr && api_->shutdown != nullptr) api_->shutdown();
  if (dl_ != nullptr) dlclose(dl_);
}

absl::StatusOr<std::unique_ptr<Plugin>> Plugin::Load(const std::string& path,
                                                     PluginReport* report) {
  report->file = path;
  const std::string host_version = VersionText(COLI_ABI_VERSION_MAJOR, COLI_ABI_VERSION_MINOR);
  auto refuse = [&](absl::StatusCode code, std::string why) -> absl::Status {
    report->loaded = false;
    report->error = absl::StrCat("plugin '", path, "' refused: ", why);
    return absl::Status(code, report->error);
  };
  dlerror();
  void* dl = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (dl == nullptr) {
    const char* e = dlerror();
    return refuse(absl::StatusCode::kFailedPrecondition,
                  absl::StrCat("dlopen failed: ", e ? e : "unknown error"));
  }
  std::unique_ptr<Plugin> plugin(new Plugin());
  plugin->dl_ = dl;
  plugin->file_ = path;
  auto entry = reinterpret_cast<coli_plugin_entry_fn>(dlsym(dl, COLI_PLUGIN_ENTRY_SYMBOL));
  if (entry == nullptr) {
    return refuse(absl::StatusCode::kFailedPrecondition,
                  absl::StrCat("no exported symbol '", COLI_PLUGIN_ENTRY_SYMBOL, "' (host ABI ",
                               host_version, ")"));
  }
  auto version = Init<coli_abi_version_t>();
  version.major = COLI_ABI_VERSION_MAJOR;
  version.minor = COLI_ABI_VERSION_MINOR;
  const coli_plugin_api_t* api = nullptr;
  try {
    api = entry(HostApi(), &version);
  } catch (const std::exception& e) {
    return refuse(absl::StatusCode::kInternal, absl::StrCat("coli_plugin_entry threw: ", e.what(),
                                                            " (host ABI ", host_version, ")"));
  } catch (...) {
    return refuse(absl::StatusCode::kInternal,
                  absl::StrCat("coli_plugin_entry threw a non-standard exception (host ABI ",
                               host_version, ")"));
  }
  report->major = version.major;
  report->minor = version.minor;
  const std::string plugin_version = VersionText(version.major, version.minor);
  if (version.major != COLI_ABI_VERSION_MAJOR) {
    return refuse(absl::StatusCode::kFailedPrecondition,
                  absl::StrCat("ABI major version mismatch: plugin ", plugin_version, ", host ",
                               host_version));
  }
  if (api == nullptr) {
    return refuse(absl::StatusCode::kFailedPrecondition,
                  absl::StrCat("coli_plugin_entry returned NULL (plugin ABI ", plugin_version,
                               ", host ", host_version, ")"));
  }
  const uint32_t minor = std::min<uint32_t>(version.minor, COLI_ABI_VERSION_MINOR);
  // The table must hold every entry of the negotiated minor (a 1.6 table that stops at 1.5's
  // size would have the host read session_reusable past its end).
  const size_t need = TableSizeFor(minor);
  if (api->struct_size < need) {
    return refuse(
        absl::StatusCode::kFailedPrecondition,
        absl::StrCat("function table struct_size ", api->struct_size, " is smaller than ABI ",
                     plugin_version, " needs (", need, " bytes; host ", host_version, ")"));
  }
  if (absl::Status s = CheckEntries(*api, minor); !s.ok()) {
    return refuse(s.code(), absl::StrCat(s.message(), " (plugin ABI ", plugin_version, ", host ",
                                         host_version, ")"));
  }
  plugin->api_ = api;
  plugin->minor_ = minor;
  plugin->family_ = api->family ? api->family : "";
  plugin->version_ = api->plugin_version ? api->plugin_version : "";
  if (plugin->family_.empty()) {
    plugin->api_ = nullptr;  // do not call shutdown of a refused table
    return refuse(
        absl::StatusCode::kFailedPrecondition,
        absl::StrCat("function table has no family name (plugin ABI ", plugin_version, ")"));
  }
  // ABI 1.8: the family's environment switches, checked now so that a bad table refuses the
  // plugin by name instead of failing a later load.
  if (minor >= 8 && api->n_switches > 0) {
    if (api->switches == nullptr) {
      plugin->api_ = nullptr;
      return refuse(absl::StatusCode::kFailedPrecondition,
                    absl::StrCat("n_switches ", api->n_switches, " with switches NULL (plugin ABI ",
                                 plugin_version, ")"));
    }
    for (size_t i = 0; i < api->n_switches; ++i) {
      absl::StatusOr<v1::ModelSwitch> s =
          api->switches[i] == nullptr
              ? absl::FailedPreconditionError(absl::StrCat("switch ", i, " is NULL"))
              : SwitchFromAbi(*api->switches[i], plugin->family_);
      if (!s.ok()) {
        plugin->api_ = nullptr;
        return refuse(s.status().code(),
                      absl::StrCat(s.status().message(), " (plugin ABI ", plugin_version, ")"));
      }
      plugin->switches_.push_back(*std::move(s));
    }
  }
  report->loaded = true;
  report->switches = plugin->switches_;
  report->family = plugin->family_;
  report->version = plugin->version_;
  return plugin;
}

absl::StatusOr<bool> Plugin::Probe(const std::string& model_dir, std::string* serves_note) const {
  ErrorText err;
  int32_t serves = 0;
  coli_status_t code = api_->probe(Str(model_dir), &serves, err.get());
  COLI_RETURN_IF_ERROR(Annotate(err.ToStatus(code), absl::StrCat("plugin ", family_, " probe")));
  if (serves_note != nullptr) *serves_note = serves != 0 ? "" : std::string(err.message());
  return serves != 0;
}

absl::StatusOr<std::unique_ptr<Model>> Plugin::Open(const std::string& model_dir,
                                                    const ModelOptions& options,
                                                    const ProgressFn& progress) const {
  coli_model_options_t fields = options.fields;
  fields.struct_size = sizeof(coli_model_options_t);
  std::vector<coli_string_t> dirs;
  for (const auto& d : options.extra_dirs) dirs.push_back(Str(d));
  fields.extra_dirs = dirs.data();
  fields.n_extra_dirs = dirs.size();
  fields.trace_path = Str(options.trace_path);
  fields.x0_path = Str(options.x0_path);
  fields.logits_path = Str(options.logits_path);
  std::vector<coli_kv_t> extra;
  for (const auto& [k, v] : options.extra) extra.push_back(coli_kv_t{Str(k), Str(v)});
  fields.extra = extra.data();
  fields.n_extra = extra.size();

  auto args = Init<coli_model_open_args_t>();
  args.model_dir = Str(model_dir);
  args.options = &fields;
  args.progress = progress ? &ProgressThunk : nullptr;
  args.progress_user = const_cast<ProgressFn*>(&progress);
  ErrorText err;
  coli_model_t* handle = nullptr;
  coli_status_t code = api_->model_open(&args, &handle, err.get());
  COLI_RETURN_IF_ERROR(err.ToStatus(code));
  if (handle == nullptr) {
    return absl::InternalError(absl::StrCat("plugin ", family_, " model_open gave no model"));
  }
  std::unique_ptr<Model> model(new Model(this, handle));
  COLI_RETURN_IF_ERROR(model->ReadInfo());
  return model;
}

// ---- Model --------------------------------------------------------------------------------

Model::~Model() {
  if (handle_ != nullptr) plugin_->api().model_close(handle_);
}

absl::Status Model::ReadInfo() {
  auto raw = Init<coli_model_info_t>();
  ErrorText err;
  COLI_RETURN_IF_ERROR(err.ToStatus(plugin_->api().model_info(handle_, &raw, err.get())));
  info_.family = std::string(View(raw.family));
  info_.name = std::string(View(raw.name));
  info_.vocab_size = raw.vocab_size;
  info_.bos_id = raw.bos_id;
  info_.eos_id = raw.eos_id;
  info_.chat_capabilities = raw.chat_capabilities;
  info_.context_capacity = raw.context_capacity;
  for (size_t i = 0; i < raw.n_special_tokens; ++i) {
    info_.special_tokens.push_back(
        {std::string(View(raw.special_tokens[i].text)), raw.special_tokens[i].id});
  }
  if (raw.stop_ids != nullptr) info_.stop_ids.assign(raw.stop_ids, raw.stop_ids + raw.n_stop_ids);
  return absl::OkStatus();
}

namespace {
// Reads a stats entry of the table (session_stats / model_stats calling convention).
template <typename Call>
absl::StatusOr<std::map<std::string, double>> ReadStats(const Call& call) {
  std::vector<coli_stat_t> stats(32);
  size_t count = 0;
  for (int attempt = 0; attempt < 2; ++attempt) {
    ErrorText err;
    COLI_RETURN_IF_ERROR(err.ToStatus(call(stats.data(), stats.size(), &count, err.get())));
    if (count <= stats.size()) break;
    stats.resize(count);
  }
  std::map<std::string, double> out;
  for (size_t i = 0; i < std::min(count, stats.size()); ++i) {
    if (stats[i].name != nullptr) out[stats[i].name] = stats[i].value;
  }
  return out;
}
}  // namespace

absl::StatusOr<std::map<std::string, double>> Model::Stats() const {
  if (plugin_->minor() < 2) return std::map<std::string, double>();
  return ReadStats([&](coli_stat_t* stats, size_t capacity, size_t* count, coli_error_t* error) {
    return plugin_->api().model_stats(handle_, stats, capacity, count, error);
  });
}

absl::StatusOr<std::vector<int32_t>> Model::Tokenize(std::string_view text,
                                                     bool allow_special) const {
  return abi::ReadTokens(
      [&](coli_token_buffer_t* out) {
        ErrorText err;
        return err.ToStatus(
            plugin_->api().tokenize(handle_, Str(text), allow_special ? 1 : 0, out, err.get()));
      },
      text.size() + 16);
}

absl::StatusOr<std::string> Model::Detokenize(std::span<const int32_t> ids) const {
  return abi::ReadBytes(
      [&](coli_byte_buffer_t* out) {
        ErrorText err;
        return err.ToStatus(
            plugin_->api().detokenize(handle_, ids.data(), ids.size(), out, err.get()));
      },
      ids.size() * 8 + 16);
}

absl::StatusOr<RenderedChat> Model::RenderChat(std::string_view request_json,
                                               bool add_generation_prompt) const {
  RenderedChat out;
  out.tokens.resize(request_json.size() + 64);
  out.text.resize(request_json.size() * 2 + 256);
  for (int attempt = 0; attempt < 2; ++attempt) {
    auto args = Init<coli_chat_render_args_t>();
    args.request_json = Str(request_json);
    args.add_generation_prompt = add_generation_prompt ? 1 : 0;
    auto result = Init<coli_chat_render_result_t>();
    result.tokens = Init<coli_token_buffer_t>();
    result.tokens.ids = out.tokens.data();
    result.tokens.capacity = out.tokens.size();
    result.text = Init<coli_byte_buffer_t>();
    result.text.data = out.text.data();
    result.text.capacity = out.text.size();
    ErrorText err;
    COLI_RETURN_IF_ERROR(
        err.ToStatus(plugin_->api().render_chat(handle_, &args, &result, err.get())));
    const bool fits =
        result.tokens.count <= result.tokens.capacity && result.text.count <= result.text.capacity;
    out.tokens.resize(result.tokens.count);
    out.text.resize(result.text.count);
    out.chat_parse_mode = result.chat_parse_mode;
    if (fits) return out;
  }
  return absl::InternalError("render_chat kept asking for larger buffers");
}

absl::StatusOr<std::unique_ptr<Session>> Model::NewSession(int64_t max_context) const {
  auto options = Init<coli_session_options_t>();
  options.max_context = max_context;
  coli_session_t* handle = nullptr;
  ErrorText err;
  COLI_RETURN_IF_ERROR(
      err.ToStatus(plugin_->api().session_create(handle_, &options, &handle, err.get())));
  if (handle == nullptr) return absl::InternalError("session_create gave no session");
  return std::unique_ptr<Session>(new Session(plugin_, handle));
}

// ---- Session ------------------------------------------------------------------------------

namespace {

absl::Status RefuseResponseFormat(const Plugin& plugin, std::string_view response_format) {
  if (plugin.minor() >= 4 || response_format.empty()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "response_format: needs plugin ABI 1.4, but family '", plugin.family(), "' (", plugin.file(),
      ") speaks 1.", plugin.minor(), " and would not enforce it; leave response_format unset"));
}

}  // namespace

absl::Status Model::CheckResponseFormat(std::string_view response_format) const {
  return RefuseResponseFormat(*plugin_, response_format);
}

Session::~Session() {
  if (handle_ != nullptr) plugin_->api().session_destroy(handle_);
}

absl::StatusOr<PrefillResult> Session::Prefill(
    std::span<const int32_t> tokens, int32_t chat_parse_mode, uint64_t seed,
    const std::function<bool()>& cancel,
    const std::function<void(uint64_t done, uint64_t total)>& progress,
    std::string_view response_format, int32_t prompt_logprobs) {
  COLI_RETURN_IF_ERROR(RefuseResponseFormat(*plugin_, response_format));
  if (prompt_logprobs >= 0 && plugin_->minor() < 7) {
    return absl::FailedPreconditionError(
        absl::StrCat("prompt logprobs need plugin ABI 1.7, but family '", plugin_->family(), "' (",
                     plugin_->file(), ") speaks 1.", plugin_->minor()));
  }
  auto args = Init<coli_prefill_args_t>();
  if (plugin_->minor() < 4) {
    args.struct_size = COLI_PREFILL_ARGS_SIZE_V1_0;  // an older plugin's args end before 1.4's
  } else if (plugin_->minor() < 7) {
    args.struct_size = COLI_PREFILL_ARGS_SIZE_V1_4;
    args.response_format = Str(response_format);
  } else {
    args.response_format = Str(response_format);
    args.want_prompt_logprobs = prompt_logprobs >= 0 ? 1 : 0;
    args.prompt_logprobs_top_k = std::max(0, prompt_logprobs);
  }
  args.tokens = tokens.data();
  args.n_tokens = tokens.size();
  args.chat_parse_mode = chat_parse_mode;
  args.seed = seed;
  PrefillHooks hooks{&cancel, &progress};
  args.progress = (cancel || progress) ? &PrefillThunk : nullptr;
  args.progress_user = &hooks;
  auto result = Init<coli_prefill_result_t>();
  ErrorText err;
  COLI_RETURN_IF_ERROR(err.ToStatus(plugin_->api().prefill(handle_, &args, &result, err.get())));
  PrefillResult out{result.tokens_reused, result.tokens_computed, result.context_used,
                    result.context_capacity};
  if (prompt_logprobs >= 0) {
    const size_t want = (tokens.size() - 1) * (1 + static_cast<size_t>(prompt_logprobs));
    // A plugin that claims 1.7 but leaves them out would otherwise pass for a prompt of one token.
    if (result.n_prompt_logprobs != want || (want > 0 && result.prompt_logprobs == nullptr)) {
      return absl::InternalError(absl::StrCat(
          "family '", plugin_->family(), "' returned ", result.n_prompt_logprobs,
          " prompt logprobs for ", tokens.size(), " prompt tokens (expected ", want, ")"));
    }
    out.prompt_logprobs.assign(result.prompt_logprobs, result.prompt_logprobs + want);
    // 1.9: their ranks, optional (NULL: none), but one per position when sent.
    const size_t positions = tokens.size() - 1;
    if (plugin_->minor() >= 9 && result.prompt_logprob_ranks != nullptr) {
      if (result.n_prompt_logprob_ranks != positions) {
        return absl::InternalError(absl::StrCat("family '", plugin_->family(), "' returned ",
                                                result.n_prompt_logprob_ranks,
                                                " prompt logprob ranks for ", tokens.size(),
                                                " prompt tokens (expected ", positions, ")"));
      }
      out.prompt_logprob_ranks.assign(result.prompt_logprob_ranks,
                                      result.prompt_logprob_ranks + positions);
    }
  }
  return out;
}

namespace {

// The row for one step. A plugin of an older minor gets a row without the 1.3 inputs (its
// struct_size ends before them); Model::CheckSampling refused knobs it would have ignored, and
// Step/StepBatch refuse them again for callers that skip the check.
coli_decode_row_t ToRow(coli_session_t* handle, const Sampling& sampling, uint32_t minor) {
  auto row = Init<coli_decode_row_t>();
  row.session = handle;
  row.temperature = sampling.temperature;
  row.top_p = sampling.top_p;
  row.top_k = sampling.top_k;
  row.logprobs_top_k = sampling.logprobs;
  row.token = -1;
  if (minor < 3) {
    row.struct_size = COLI_DECODE_ROW_SIZE_V1_0;
    return row;
  }
  row.repetition_penalty = sampling.repetition_penalty;
  row.frequency_penalty = sampling.frequency_penalty;
  row.presence_penalty = sampling.presence_penalty;
  row.min_p = sampling.min_p;
  row.logit_bias = sampling.logit_bias.empty() ? nullptr : sampling.logit_bias.data();
  row.n_logit_bias = sampling.logit_bias.size();
  return row;
}

absl::Status RefuseNewKnobs(const Plugin& plugin, const Sampling& sampling) {
  const std::string knob(FirstNewKnob(sampling));
  if (plugin.minor() >= 3 || knob.empty()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      knob, ": needs plugin ABI 1.3, but family '", plugin.family(), "' (", plugin.file(),
      ") speaks 1.", plugin.minor(), " and would ignore it; leave ", knob, " unset"));
}

absl::StatusOr<StepResult> FromRow(const coli_decode_row_t& row) {
  StepResult out;
  out.token = row.token;
  out.finish = row.finish;
  out.text = std::string(View(row.text));
  out.logprob = row.logprob;
  if (row.top_logprobs != nullptr) {
    out.top_logprobs.assign(row.top_logprobs, row.top_logprobs + row.n_top_logprobs);
  }
  for (size_t i = 0; i < row.n_events && row.events != nullptr; ++i) {
    // Elements are read with the plugin's stride (its struct_size) so a newer plugin's larger
    // event struct still reads correctly.
    const auto* base = reinterpret_cast<const char*>(row.events);
    const size_t stride = row.events[0].struct_size;
    if (stride < sizeof(coli_chat_event_t)) {
      return absl::InternalError("decode: chat event struct_size too small");
    }
    const auto* e = reinterpret_cast<const coli_chat_event_t*>(base + i * stride);
    out.events.push_back({e->channel, e->end_of_message != 0, std::string(View(e->text))});
  }
  return out;
}

}  // namespace

std::string_view FirstNewKnob(const Sampling& s) {
  if (!s.logit_bias.empty()) return "logit_bias";
  if (s.repetition_penalty != 0.0f && s.repetition_penalty != 1.0f) return "repetition_penalty";
  if (s.frequency_penalty != 0.0f) return "frequency_penalty";
  if (s.presence_penalty != 0.0f) return "presence_penalty";
  if (s.min_p != 0.0f) return "min_p";
  return {};
}

absl::Status Model::CheckSampling(const Sampling& s) const {
  sampling::SamplerOptions o;
  o.repetition_penalty = s.repetition_penalty;
  o.frequency_penalty = s.frequency_penalty;
  o.presence_penalty = s.presence_penalty;
  o.min_p = s.min_p;
  for (const coli_logit_bias_t& b : s.logit_bias) o.logit_bias.push_back({b.id, b.bias});
  COLI_RETURN_IF_ERROR(sampling::ValidatePenalties(o, info_.vocab_size));
  return RefuseNewKnobs(*plugin_, s);
}

absl::StatusOr<StepResult> Session::Step(const Sampling& sampling) {
  COLI_RETURN_IF_ERROR(RefuseNewKnobs(*plugin_, sampling));
  coli_decode_row_t row = ToRow(handle_, sampling, plugin_->minor());
  auto args = Init<coli_decode_args_t>();
  args.rows = &row;
  args.n_rows = 1;
  ErrorText err;
  COLI_RETURN_IF_ERROR(err.ToStatus(plugin_->api().decode(&args, err.get())));
  return FromRow(row);
}

absl::StatusOr<std::vector<StepResult>> Session::StepBatch(
    std::span<Session* const> sessions, std::span<const Sampling> sampling,
    std::vector<std::optional<StepResult>>* completed) {
  if (sessions.empty()) return absl::InvalidArgumentError("StepBatch: no sessions");
  if (sessions.size() != sampling.size()) {
    return absl::InvalidArgumentError(absl::StrCat("StepBatch: ", sessions.size(), " sessions but ",
                                                   sampling.size(), " sampling settings"));
  }
  const Plugin* plugin = sessions[0]->plugin_;
  std::vector<coli_decode_row_t> rows;
  rows.reserve(sessions.size());
  for (size_t i = 0; i < sessions.size(); ++i) {
    if (sessions[i]->plugin_ != plugin) {
      return absl::InvalidArgumentError(
          absl::StrCat("StepBatch: session ", i, " belongs to plugin ",
                       sessions[i]->plugin_->family(), ", session 0 to ", plugin->family()));
    }
    COLI_RETURN_IF_ERROR(RefuseNewKnobs(*plugin, sampling[i]));
    rows.push_back(ToRow(sessions[i]->handle_, sampling[i], plugin->minor()));
  }
  auto args = Init<coli_decode_args_t>();
  args.rows = rows.data();
  args.n_rows = rows.size();
  ErrorText err;
  if (absl::Status s = err.ToStatus(plugin->api().decode(&args, err.get())); !s.ok()) {
    if (completed != nullptr) {
      completed->assign(rows.size(), std::nullopt);
      for (size_t i = 0; i < rows.size(); ++i) {
        if (rows[i].token < 0) continue;
        auto r = FromRow(rows[i]);
        if (r.ok()) (*completed)[i] = std::move(*r);
      }
    }
    return s;
  }
  std::vector<StepResult> out;
  out.reserve(rows.size());
  for (const auto& row : rows) {
    COLI_ASSIGN_OR_RETURN(StepResult r, FromRow(row));
    out.push_back(std::move(r));
  }
  return out;
}

absl::Status Session::Reset() {
  ErrorText err;
  return err.ToStatus(plugin_->api().session_reset(handle_, err.get()));
}

absl::StatusOr<std::map<std::string, double>> Session::Stats() {
  return ReadStats([&](coli_stat_t* stats, size_t capacity, size_t* count, coli_error_t* error) {
    return plugin_->api().session_stats(handle_, stats, capacity, count, error);
  });
}

absl::StatusOr<std::vector<int32_t>> Session::Record() {
  if (plugin_->minor() < 1) {
    return absl::UnimplementedError(absl::StrCat("plugin ", plugin_->family(), " speaks ABI 1.",
                                                 plugin_->minor(), ": session_record needs 1.1"));
  }
  return abi::ReadTokens([&](coli_token_buffer_t* out) {
    ErrorText err;
    return err.ToStatus(plugin_->api().session_record(handle_, out, err.get()));
  });
}

bool Session::CanCopy() const {
  return plugin_->minor() >= 11 && plugin_->api().session_copy != nullptr;
}

absl::Status Session::CopyFrom(Session& src) {
  if (&src == this || src.plugin_ != plugin_) {
    return absl::InvalidArgumentError(
        "session copy: the source must be another session of the same plugin");
  }
  if (!CanCopy()) {
    return absl::UnimplementedError(absl::StrCat("plugin ", plugin_->family(), " speaks ABI 1.",
                                                 plugin_->minor(), " without session_copy (1.11)"));
  }
  ErrorText err;
  return err.ToStatus(plugin_->api().session_copy(handle_, src.handle_, err.get()));
}

absl::StatusOr<size_t> Model::Reusable(const Session* session,
                                       std::span<const int32_t> prompt) const {
  if (plugin_->minor() < 6) {
    return absl::UnimplementedError(absl::StrCat("plugin ", plugin_->family(), " speaks ABI 1.",
                                                 plugin_->minor(), ": session_reusable needs 1.6"));
  }
  ErrorText err;
  uint64_t tokens = 0;
  COLI_RETURN_IF_ERROR(err.ToStatus(
      plugin_->api().session_reusable(handle_, session != nullptr ? session->handle_ : nullptr,
                                      prompt.data(), prompt.size(), &tokens, err.get())));
  return static_cast<size_t>(std::min<uint64_t>(tokens, prompt.size()));
}

// ---- PluginSet ----------------------------------------------------------------------------

namespace {

// What `dir`/config.json declares, or why it cannot be read: the reason no plugin took the
// folder, so a user pointed at the wrong folder or a foreign model sees which and why.
std::string DescribeModelConfig(const std::string& dir) {
  namespace fs = std::filesystem;
  const fs::path path = fs::path(dir) / "config.json";
  std::error_code ec;
  const fs::file_status link = fs::symlink_status(path, ec);
  if (fs::is_symlink(link) && !fs::exists(path, ec)) {
    return absl::StrCat("'", path.string(), "' is a symlink to '",
                        fs::read_symlink(path, ec).string(),
                        "', which does not exist (an interrupted or pruned download?)");
  }
  if (!fs::exists(link)) {
    std::string hint;
    if (fs::is_directory(fs::path(dir) / "snapshots", ec)) {
      hint =
          "; it looks like a Hugging Face cache folder: give one of its snapshots/<revision> "
          "folders";
    } else if (fs::is_empty(dir, ec) && !ec) {
      hint = "; the folder is empty";
    }
    return absl::StrCat("it has no config.json", hint);
  }
  absl::StatusOr<std::string> text = io::ReadFileToString(path.string(), 16 << 20);
  if (!text.ok()) return std::string(text.status().message());
  absl::StatusOr<nlohmann::json> doc = json::Parse(*text, path.string());
  if (!doc.ok()) return std::string(doc.status().message());
  if (!doc->is_object()) return absl::StrCat("'", path.string(), "' is not a JSON object");
  auto string_of = [](const nlohmann::json& object, const char* key) -> std::string {
    auto it = object.find(key);
    return it != object.end() && it->is_string() ? it->get<std::string>() : std::string();
  };
  std::string model_type = string_of(*doc, "model_type");
  std::vector<std::string> architectures;
  if (auto it = doc->find("architectures"); it != doc->end() && it->is_array()) {
    for (const auto& a : *it) {
      if (a.is_string()) architectures.push_back(a.get<std::string>());
    }
  }
  if (model_type.empty() && architectures.empty()) {
    return absl::StrCat("'", path.string(), "' names neither model_type nor architectures");
  }
  std::string declared = absl::StrCat("'", path.string(), "' declares");
  if (!model_type.empty()) absl::StrAppend(&declared, " model_type '", model_type, "'");
  if (!architectures.empty()) {
    absl::StrAppend(&declared, model_type.empty() ? "" : ",", " architectures ",
                    absl::StrJoin(architectures, ", "));
  }
  return declared;
}

}  // namespace

PluginSet PluginSet::LoadDir(const std::string& dir) {
  PluginSet set;
  std::error_code ec;
  std::vector<std::string> files;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (entry.is_regular_file() && name.size() > 3 && name.ends_with(".so")) {
      files.push_back(entry.path().string());
    }
  }
  if (ec) {
    COLI_LOG(kWarning) << "plugin directory '" << dir << "' unreadable: " << ec.message();
    return set;
  }
  std::sort(files.begin(), files.end());
  for (const auto& file : files) {
    PluginReport report;
    auto plugin = Plugin::Load(file, &report);
    if (plugin.ok()) {
      COLI_LOG(kInfo) << "plugin '" << file << "': family " << report.family << " "
                      << report.version << ", ABI " << report.major << "." << report.minor
                      << " (using 1." << (*plugin)->minor() << ")";
      set.plugins_.push_back(std::move(plugin).value());
    } else {
      COLI_LOG(kError) << plugin.status().message();
    }
    set.reports_.push_back(std::move(report));
  }
  return set;
}

std::vector<v1::ModelSwitch> PluginSet::Switches() const {
  std::vector<v1::ModelSwitch> all;
  for (const auto& plugin : plugins_) {
    all.insert(all.end(), plugin->switches().begin(), plugin->switches().end());
  }
  return all;
}

absl::StatusOr<const Plugin*> PluginSet::ForModel(const std::string& model_dir) const {
  std::vector<std::string> tried;
  std::vector<std::string> errors;
  for (const auto& plugin : plugins_) {
    std::string note;
    auto serves = plugin->Probe(model_dir, &note);
    if (!serves.ok()) {
      errors.push_back(std::string(serves.status().message()));
      continue;
    }
    if (*serves) return plugin.get();
    tried.push_back(note.empty() ? plugin->family() : absl::StrCat(plugin->family(), ": ", note));
  }
  std::string detail = tried.empty() ? "no plugin loaded" : absl::StrJoin(tried, "; ");
  if (!errors.empty()) absl::StrAppend(&detail, "; ", absl::StrJoin(errors, "; "));
  return absl::NotFoundError(absl::StrCat("no plugin serves model directory '", model_dir,
                                          "': ", DescribeModelConfig(model_dir),
                                          " (supported: ", detail, ")"));
}

}  // namespace coli::host
