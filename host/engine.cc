#include "host/engine.h"

#include <algorithm>
#include <exception>
#include <filesystem>
#include <limits>
#include <optional>
#include <span>
#include <thread>
#include <tuple>
#include <unordered_set>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "common/log/log.h"
#include "common/sampling/sampling.h"
#include "common/status/status.h"
#include "nlohmann/json.hpp"

namespace coli::host {
namespace {

// The largest temperature a request may ask for (coli run's --temperature; the OpenAI API's is 2)
// and the most top logprobs per token (OpenAI's top_logprobs and vLLM's default max_logprobs).
constexpr float kMaxTemperature = 100.0f;
constexpr int32_t kMaxLogprobs = 20;
// Choices of one request (OpenAI allows 128; each is a session, on K3 ~434 MB of state).
constexpr int32_t kMaxChoices = 16;

using Clock = std::chrono::steady_clock;

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

std::string DefaultModelId(const std::string& dir) {
  std::filesystem::path p(dir);
  while (!p.empty() && p.filename().empty()) p = p.parent_path();
  std::string name = p.filename().string();
  return name.empty() ? dir : name;
}

// The tool-call constraint of an OpenAI chat body, as the plugin-family extension of ABI 1.4's
// response_format (abi.md, docs/status/constrained.md):
//   {"type":"coli_tool_calls","mode":"required"|"named"|"auto"|"none",
//    "tools":[{"name":…,"parameters":{…},"strict":bool}, …], "single":true (optional),
//    "response_format":{…} (auto only, optional)}
// "" when nothing is enforced: no tools (or tool_choice none beside a response_format).
// tool_choice "required" → mode required over every tool; {"type":"function","function":
// {"name":"f"}} → mode named with only f; "auto" (or absent) → mode auto over every tool: the
// plugin constrains a call once the model opens one (lazy); "none" → mode none with no tools:
// the model may not open a call (lazy: otherwise free). `format`: the body's
// response_format (null when none), which a forced call cannot honour (INVALID_ARGUMENT naming
// tool_choice) and which mode auto carries along (the answer is that value or tool calls).
// `lazy`: the plugin takes a format (ABI 1.4+); without it auto and none send nothing.
absl::StatusOr<std::string> ToolCallFormatOf(const nlohmann::json& body,
                                             const nlohmann::json* format, bool lazy) {
  auto tools_it = body.find("tools");
  const bool has_tools = tools_it != body.end() && tools_it->is_array() && !tools_it->empty();
  auto tc_it = body.find("tool_choice");
  std::string mode = "auto";
  std::string named;
  if (tc_it != body.end() && !tc_it->is_null()) {
    if (tc_it->is_string()) {
      mode = tc_it->get<std::string>();
    } else if (tc_it->is_object()) {
      // (Iterators of different nlohmann containers must never be compared: it throws.)
      auto fn = tc_it->find("function");
      const nlohmann::json name = fn != tc_it->end() && fn->is_object()
                                      ? fn->value("name", nlohmann::json())
                                      : nlohmann::json();
      if (!name.is_string()) {
        return absl::InvalidArgumentError(
            "tool_choice.function.name: a named tool_choice needs a function name");
      }
      mode = "named";
      named = name.get<std::string>();
    }
  }
  if (mode == "none") {
    // The renderer tells the model it must not call; the plugin keeps it from opening a call
    // (lazy, like auto with no call allowed). Beside a response_format the format alone (its
    // answer cannot hold a call).
    if (!has_tools || format != nullptr || !lazy) return std::string();
    return nlohmann::json{
        {"type", "coli_tool_calls"}, {"mode", "none"}, {"tools", nlohmann::json::array()}}
        .dump();
  }
  if ((mode == "required" || mode == "named") && !has_tools) {
    return absl::InvalidArgumentError(absl::StrCat("tool_choice: '", mode == "named" ? named : mode,
                                                   "' needs the request's tools, and it has none"));
  }
  if (!has_tools) return std::string();
  nlohmann::json tools = nlohmann::json::array();
  for (size_t i = 0; i < tools_it->size(); ++i) {
    const nlohmann::json& tool = (*tools_it)[i];
    auto fn = tool.is_object() ? tool.find("function") : tool.end();
    if (fn == tool.end() || !fn->is_object()) continue;  // the renderer names a bad tool
    auto name = fn->find("name");
    if (name == fn->end() || !name->is_string()) {
      return absl::InvalidArgumentError(
          absl::StrCat("tools[", i, "].function.name: a function tool needs a name"));
    }
    const bool strict = fn->value("strict", nlohmann::json(false)) == true;
    if (mode == "named" && *name != named) continue;
    nlohmann::json entry{{"name", *name}, {"strict", strict}};
    auto params = fn->find("parameters");
    entry["parameters"] =
        params == fn->end() || params->is_null() ? nlohmann::json{{"type", "object"}} : *params;
    tools.push_back(std::move(entry));
  }
  if (mode == "named" && tools.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("tool_choice.function.name: '", named, "' is not one of the request's tools"));
  }
  // No function tool to call, or a plugin that cannot take lazy enforcement (older than ABI
  // 1.4): auto runs unconstrained, as before (a carried response_format still travels alone).
  if (mode == "auto" && (tools.empty() || !lazy)) return std::string();
  if (mode != "auto" && format != nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("tool_choice: '", mode == "named" ? named : mode,
                     "' forces a tool call, which cannot be combined with response_format"));
  }
  nlohmann::json out{{"type", "coli_tool_calls"}, {"mode", mode}, {"tools", std::move(tools)}};
  // parallel_tool_calls: false → at most one call (exactly one under required).
  if (body.value("parallel_tool_calls", nlohmann::json(true)) == false) out["single"] = true;
  if (format != nullptr) out["response_format"] = *format;
  return out.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

// The constraint of an OpenAI chat body as response_format JSON text ("" when none): its
// "response_format" member ("" when absent, null or "text"; a bare string such as
// "json_object", as the family's renderer also accepts, becomes {"type": ...}), or — when the
// body offers tools and tool_choice is not "none" — the coli_tool_calls extension
// (ToolCallFormatOf) carrying it. The body was rendered first, so it is valid JSON;
// INVALID_ARGUMENT otherwise. `lazy`: as ToolCallFormatOf.
absl::StatusOr<std::string> ResponseFormatOf(const std::string& request_json, bool lazy) {
  const nlohmann::json body =
      nlohmann::json::parse(request_json, nullptr, /*allow_exceptions=*/false);
  if (body.is_discarded() || !body.is_object()) {
    return absl::InvalidArgumentError("request_json: not a JSON object");
  }
  auto it = body.find("response_format");
  if (it == body.end() || it->is_null()) return ToolCallFormatOf(body, nullptr, lazy);
  nlohmann::json format = *it;
  if (format.is_string()) format = nlohmann::json{{"type", format.get<std::string>()}};
  if (format.is_object() && format.value("type", nlohmann::json()) == "text") {
    return ToolCallFormatOf(body, nullptr, lazy);
  }
  COLI_ASSIGN_OR_RETURN(std::string tool_calls, ToolCallFormatOf(body, &format, lazy));
  if (!tool_calls.empty()) return tool_calls;
  return format.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

ModelOptions ToOptions(const v1::ModelOptions& o) {
  ModelOptions out;
  coli_model_options_t& f = out.fields;
  if (o.has_bits()) f.bits = o.bits();
  if (o.has_mla_bits()) f.mla_bits = o.mla_bits();
  if (o.has_head_bits()) f.head_bits = o.head_bits();
  if (o.has_idot()) f.idot = o.idot() ? 1 : 0;
  if (o.has_chunk()) f.chunk = o.chunk();
  if (o.has_direct()) f.direct = o.direct() ? 1 : 0;
  if (o.has_pipe()) f.pipe = o.pipe() ? 1 : 0;
  if (o.has_load_threads()) f.load_threads = o.load_threads();
  if (o.has_expert_gb()) f.expert_gb = o.expert_gb();
  if (o.has_topp()) f.topp = o.topp();
  if (o.has_max_context()) f.max_context = o.max_context();
  if (o.has_layers()) f.layers = o.layers();
  if (o.has_threads()) f.threads = o.threads();
  if (o.has_mla_norm_eps()) f.mla_norm_eps = o.mla_norm_eps();
  out.extra_dirs.assign(o.extra_dirs().begin(), o.extra_dirs().end());
  out.trace_path = o.trace_path();
  out.x0_path = o.x0_path();
  out.logits_path = o.logits_path();
  for (const auto& [k, v] : o.extra()) out.extra[k] = v;
  return out;
}

v1::ModelInfo ToProto(const ModelInfo& m, const std::string& id, const std::string& dir,
                      const std::string& plugin_file) {
  v1::ModelInfo out;
  out.set_id(id);
  out.set_model_dir(dir);
  out.set_family(m.family);
  out.set_plugin_file(plugin_file);
  out.set_name(m.name);
  out.set_vocab_size(m.vocab_size);
  out.set_context_capacity(m.context_capacity);
  out.set_bos_id(m.bos_id);
  out.set_eos_id(m.eos_id);
  for (const auto& s : m.special_tokens) {
    auto* t = out.add_special_tokens();
    t->set_text(s.text);
    t->set_id(s.id);
  }
  for (int32_t id_ : m.stop_ids) out.add_stop_ids(id_);
  out.set_chat_template(m.chat_capabilities & COLI_CHAT_CAP_TEMPLATE);
  out.set_chat_thinking(m.chat_capabilities & COLI_CHAT_CAP_THINKING);
  out.set_chat_tools(m.chat_capabilities & COLI_CHAT_CAP_TOOLS);
  out.set_logprobs(m.chat_capabilities & COLI_CHAT_CAP_LOGPROBS);
  return out;
}

// The request's numbers, checked at Submit before any work (no tokenizing, no queueing), so a
// gRPC client other than coli's own (which checks them too) cannot sample with nan or read
// past an array: INVALID_ARGUMENT naming the field and the value. The bounds take everything
// `coli serve` (temperature [0, 2], top_p [0, 1], top_k >= -1, top_logprobs [0, 20]) and
// `coli run` / `coli chat` (temperature [0, 100]) send; proto3's zeros mean "unset" (top_p 0 =
// off, max_tokens 0 = up to the context). The logit_bias ids are checked against the model's
// vocabulary later (Model::CheckSampling), with the plugin's ABI minor.
absl::Status ValidateRequest(const GenerationInput& in) {
  const v1::SamplingParams& s = in.sampling;
  auto outside = [](const char* field, auto value, const char* range) {
    return absl::InvalidArgumentError(absl::StrCat(field, " ", value, " is outside ", range));
  };
  if (in.max_tokens < 0) {
    return outside("max_tokens", in.max_tokens, "[0, 2147483647] (0 = up to the context)");
  }
  if (in.n < 1 || in.n > kMaxChoices) return outside("n", in.n, "[1, 16] (choices)");
  if (in.truncate_prompt_tokens < -1) {
    return outside("truncate_prompt_tokens", in.truncate_prompt_tokens,
                   "[-1, 2147483647] (-1 = the model's context, 0 = all)");
  }
  if (!(s.temperature() >= 0.0f && s.temperature() <= kMaxTemperature)) {
    return outside("temperature", s.temperature(), "[0, 100] (0 = greedy)");
  }
  if (!(s.top_p() >= 0.0f && s.top_p() <= 1.0f)) {
    return outside("top_p", s.top_p(), "[0, 1] (0 or 1 = off)");
  }
  if (s.top_k() < -1) return outside("top_k", s.top_k(), "[-1, 2147483647] (-1 or 0 = off)");
  if (s.logprobs() < 0 || s.logprobs() > kMaxLogprobs) {
    return outside("logprobs", s.logprobs(), "[0, 20]");
  }
  if (s.min_tokens() < 0) return outside("min_tokens", s.min_tokens(), "[0, max_tokens]");
  if (in.max_tokens > 0 && s.min_tokens() > in.max_tokens) {
    return absl::InvalidArgumentError(
        absl::StrCat("min_tokens: ", s.min_tokens(), " is more than max_tokens ", in.max_tokens));
  }
  if (s.stop_token_ids_size() > sampling::kMaxLogitBias) {
    return absl::InvalidArgumentError(absl::StrCat("stop_token_ids: ", s.stop_token_ids_size(),
                                                   " ids; at most ", sampling::kMaxLogitBias));
  }
  sampling::SamplerOptions o;
  o.repetition_penalty = s.repetition_penalty();
  o.frequency_penalty = s.frequency_penalty();
  o.presence_penalty = s.presence_penalty();
  o.min_p = s.min_p();
  for (const v1::LogitBias& b : s.logit_bias()) o.logit_bias.push_back({b.id(), b.bias()});
  return sampling::ValidatePenalties(o, /*vocab_size=*/0);
}

// `s` with each of `ids` given a bias of -100 (the most the plugins take; a bias the request
// set on one is replaced): what min_tokens and ignore_eos sample with.
absl::StatusOr<Sampling> WithBannedTokens(const Sampling& s, std::span<const int32_t> ids) {
  Sampling out = s;
  for (int32_t id : ids) {
    auto it = std::find_if(out.logit_bias.begin(), out.logit_bias.end(),
                           [id](const coli_logit_bias_t& b) { return b.id == id; });
    if (it != out.logit_bias.end()) {
      it->bias = -100.0f;
    } else {
      out.logit_bias.push_back({id, -100.0f});
    }
  }
  if (out.logit_bias.size() > static_cast<size_t>(sampling::kMaxLogitBias)) {
    return absl::InvalidArgumentError(absl::StrCat("logit_bias: its ", s.logit_bias.size(),
                                                   " entries and the stop tokens that min_tokens / "
                                                   "ignore_eos hold back are more than ",
                                                   sampling::kMaxLogitBias));
  }
  return out;
}

}  // namespace

std::string ValidUtf8(std::string_view in) {
  std::string out;
  out.reserve(in.size());
  size_t i = 0;
  while (i < in.size()) {
    const auto b = static_cast<unsigned char>(in[i]);
    size_t n = b < 0x80 ? 1 : (b >> 5) == 0x6 ? 2 : (b >> 4) == 0xE ? 3 : (b >> 3) == 0x1E ? 4 : 0;
    bool ok = n > 0 && i + n <= in.size();
    for (size_t k = 1; ok && k < n; ++k) {
      ok = (static_cast<unsigned char>(in[i + k]) & 0xC0) == 0x80;
    }
    if (ok && n > 1) {  // no overlong forms, surrogates or values past U+10FFFF
      uint32_t cp = b & (0xFF >> (n + 1));
      for (size_t k = 1; k < n; ++k)
        cp = (cp << 6) | (static_cast<unsigned char>(in[i + k]) & 0x3F);
      const uint32_t min[] = {0, 0, 0x80, 0x800, 0x10000};
      ok = cp >= min[n] && cp <= 0x10FFFF && !(cp >= 0xD800 && cp <= 0xDFFF);
    }
    if (ok) {
      out.append(in.substr(i, n));
      i += n;
    } else {
      out.append("\xEF\xBF\xBD");
      ++i;
    }
  }
  return out;
}

namespace {

v1::Channel ToChannel(int32_t c) {
  switch (c) {
    case COLI_CHANNEL_REASONING:
      return v1::CHANNEL_REASONING;
    case COLI_CHANNEL_CONTENT:
      return v1::CHANNEL_CONTENT;
    case COLI_CHANNEL_TOOL_CALL:
      return v1::CHANNEL_TOOL_CALL;
    case COLI_CHANNEL_TOOL_CALL_DELTA:
      return v1::CHANNEL_TOOL_CALL_DELTA;
    default:
      return v1::CHANNEL_NONE;
  }
}

}  // namespace

GenerationInput GenerationInput::From(const v1::GenerateRequest& r) {
  GenerationInput in;
  in.model = r.model();
  in.request_id = r.request_id();
  in.session = r.session();
  in.prompt = r.prompt();
  in.prompt_ids.assign(r.prompt_ids().begin(), r.prompt_ids().end());
  in.max_tokens = r.max_tokens();
  in.sampling = r.sampling();
  in.report_progress = r.report_progress();
  in.response_format = r.response_format();
  if (r.has_prompt_logprobs()) in.prompt_logprobs = r.prompt_logprobs();
  in.prompt_only = r.prompt_only();
  in.n = r.n() == 0 ? 1 : r.n();
  in.truncate_prompt_tokens = r.truncate_prompt_tokens();
  return in;
}

GenerationInput GenerationInput::From(const v1::ChatRequest& r) {
  GenerationInput in;
  in.chat = true;
  in.model = r.model();
  in.request_id = r.request_id();
  in.session = r.session();
  in.request_json = r.request_json();
  in.max_tokens = r.max_tokens();
  in.sampling = r.sampling();
  in.report_progress = r.report_progress();
  in.response_format = r.response_format();
  in.n = r.n() == 0 ? 1 : r.n();
  if (r.has_prompt_logprobs()) in.prompt_logprobs = r.prompt_logprobs();
  in.truncate_prompt_tokens = r.truncate_prompt_tokens();
  return in;
}

absl::Status Request::CancelStatus() const {
  if (shutdown_.load()) return absl::UnavailableError("host shutting down");
  if (cancel_.load()) return absl::CancelledError(absl::StrCat("request '", id_, "' cancelled"));
  if (input_.deadline && Clock::now() >= *input_.deadline) {
    return absl::DeadlineExceededError(absl::StrCat("request '", id_, "' passed its deadline"));
  }
  return absl::OkStatus();
}

Engine::Engine(EngineOptions options) : options_(std::move(options)), started_(Clock::now()) {
  plugins_ = PluginSet::LoadDir(options_.plugin_dir);
  const int n = std::max(1, options_.workers);
  for (int i = 0; i < n; ++i) workers_.emplace_back([this] { WorkerLoop(); });
  spare_sweep_ = std::thread([this] { SpareSweepLoop(); });
}

Engine::~Engine() {
  Shutdown();
  std::lock_guard<std::mutex> lock(mu_);
  models_.clear();  // sessions, then models, before the plugins unload
}

void Engine::Shutdown() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    shutting_down_ = true;
    for (auto& [id, request] : live_) request->shutdown_.store(true);
  }
  cv_.notify_all();
  sweep_cv_.notify_all();
  for (auto& w : workers_) {
    if (w.joinable()) w.join();
  }
  if (spare_sweep_.joinable()) spare_sweep_.join();
}

void Engine::SpareSweepLoop() {
  const auto idle = std::chrono::milliseconds(std::max(0, options_.spare_idle_ms));
  const auto period = std::clamp<std::chrono::milliseconds>(idle / 4, std::chrono::milliseconds(10),
                                                            std::chrono::milliseconds(1000));
  std::unique_lock<std::mutex> lock(mu_);
  while (!shutting_down_) {
    sweep_cv_.wait_for(lock, period, [this] { return shutting_down_; });
    // Freed outside the lock (a plugin may take a while to release ~434 MB), each before the
    // model it belongs to.
    std::vector<std::pair<std::shared_ptr<LoadedModel>, std::unique_ptr<Session>>> expired;
    const auto now = Clock::now();
    for (auto& [id, model] : models_) {
      std::vector<Spare>& spares = model->spare_sessions;
      for (auto it = spares.begin(); it != spares.end();) {
        if (now - it->since < idle) {
          ++it;
          continue;
        }
        expired.emplace_back(model, std::move(it->session));
        it = spares.erase(it);
        ++model->spares_freed;
      }
    }
    if (expired.empty()) continue;
    lock.unlock();
    expired.clear();
    lock.lock();
  }
}

// ---- models -------------------------------------------------------------------------------

absl::StatusOr<v1::ModelInfo> Engine::LoadModel(const v1::LoadModelRequest& request,
                                                const ProgressFn& progress) {
  const std::string dir = request.model_dir();
  if (dir.empty()) return absl::InvalidArgumentError("LoadModel: model_dir is empty");
  const std::string id = request.id().empty() ? DefaultModelId(dir) : request.id();
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (shutting_down_) return absl::UnavailableError("host shutting down");
    auto it = models_.find(id);
    if (it != models_.end()) {
      if (it->second->info.model_dir() == dir) return it->second->info;
      return absl::AlreadyExistsError(absl::StrCat("model id '", id, "' is already loaded from '",
                                                   it->second->info.model_dir(), "'"));
    }
  }
  if (!std::filesystem::is_directory(dir)) {
    return absl::NotFoundError(absl::StrCat("model directory '", dir, "' does not exist"));
  }
  COLI_ASSIGN_OR_RETURN(const Plugin* plugin, plugins_.ForModel(dir));
  COLI_LOG(kInfo) << "loading model '" << id << "' from " << dir << " with plugin "
                  << plugin->family();
  const auto t0 = Clock::now();
  auto model = plugin->Open(dir, ToOptions(request.options()), progress);
  if (!model.ok()) {
    return Annotate(model.status(),
                    absl::StrCat("loading model '", dir, "' (plugin ", plugin->family(), ")"));
  }
  auto loaded = std::make_shared<LoadedModel>();
  loaded->model = std::move(model).value();
  loaded->info = ToProto(loaded->model->info(), id, dir, plugin->file());
  COLI_LOG(kInfo) << "model '" << id << "' loaded in " << Seconds(Clock::now() - t0) << " s";
  std::lock_guard<std::mutex> lock(mu_);
  auto [it, inserted] = models_.emplace(id, loaded);
  return it->second->info;
}

absl::Status Engine::UnloadModel(const std::string& id) {
  std::shared_ptr<LoadedModel> doomed;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = models_.find(id);
    if (it == models_.end()) {
      return absl::NotFoundError(absl::StrCat("model '", id, "' is not loaded"));
    }
    if (it->second->active > 0) {
      return absl::FailedPreconditionError(absl::StrCat("model '", id, "' has requests running"));
    }
    doomed = std::move(it->second);
    models_.erase(it);
  }
  return absl::OkStatus();  // `doomed` closes its sessions and the model here
}

std::vector<v1::ModelInfo> Engine::ListModels() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<v1::ModelInfo> out;
  for (const auto& [id, m] : models_) out.push_back(m->info);
  return out;
}

absl::StatusOr<std::shared_ptr<Engine::LoadedModel>> Engine::FindModelLocked(
    const std::string& id) const {
  if (id.empty()) {
    if (models_.size() == 1) return models_.begin()->second;
    if (models_.empty()) return absl::NotFoundError("no model is loaded");
    return absl::InvalidArgumentError("several models are loaded: name one");
  }
  auto it = models_.find(id);
  if (it == models_.end()) {
    return absl::NotFoundError(absl::StrCat("model '", id, "' is not loaded"));
  }
  return it->second;
}

absl::StatusOr<std::shared_ptr<Engine::LoadedModel>> Engine::FindModel(
    const std::string& id) const {
  std::lock_guard<std::mutex> lock(mu_);
  return FindModelLocked(id);
}

absl::StatusOr<std::vector<int32_t>> Engine::Tokenize(const std::string& model,
                                                      const std::string& text, bool allow_special) {
  COLI_ASSIGN_OR_RETURN(auto m, FindModel(model));
  return m->model->Tokenize(text, allow_special);
}

absl::StatusOr<std::string> Engine::Detokenize(const std::string& model,
                                               std::span<const int32_t> ids) {
  COLI_ASSIGN_OR_RETURN(auto m, FindModel(model));
  return m->model->Detokenize(ids);
}

absl::StatusOr<RenderedChat> Engine::ApplyTemplate(const std::string& model,
                                                   const std::string& json,
                                                   bool add_generation_prompt) {
  COLI_ASSIGN_OR_RETURN(auto m, FindModel(model));
  return m->model->RenderChat(json, add_generation_prompt);
}

// ---- requests -----------------------------------------------------------------------------

absl::StatusOr<std::shared_ptr<Request>> Engine::Submit(GenerationInput input, EventSink sink) {
  auto request = std::make_shared<Request>();
  std::shared_ptr<LoadedModel> model;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (shutting_down_) return absl::UnavailableError("host shutting down");
    if (absl::Status valid = ValidateRequest(input); !valid.ok()) {
      ++counters_.total;  // counted as a request that failed, as a prompt that cannot be made
      ++counters_.failed;
      return valid;
    }
    COLI_ASSIGN_OR_RETURN(model, FindModelLocked(input.model));
  }
  // The prompt's tokens now, outside the lock: an unnamed request is placed on the pooled
  // session whose state they extend (PickPooledSessionLocked). A request whose prompt cannot be
  // made counts as a failed one, as when this happened while it ran.
  auto prompt = [&]() -> absl::Status {
    if (input.chat) {
      COLI_ASSIGN_OR_RETURN(RenderedChat rendered,
                            model->model->RenderChat(input.request_json, true));
      request->prompt_ = std::move(rendered.tokens);
      request->parse_mode_ = rendered.chat_parse_mode;
    } else if (!input.prompt_ids.empty()) {
      request->prompt_ = std::move(input.prompt_ids);  // the prompt lives in prompt_ from here
    } else {
      COLI_ASSIGN_OR_RETURN(request->prompt_,
                            model->model->Tokenize(input.prompt, /*allow_special=*/false));
    }
    // vLLM's truncate_prompt_tokens: the start goes.
    size_t keep = request->prompt_.size();
    if (input.truncate_prompt_tokens > 0) {
      keep = static_cast<size_t>(input.truncate_prompt_tokens);
    } else if (input.truncate_prompt_tokens == -1 && model->info.context_capacity() > 1) {
      keep = static_cast<size_t>(model->info.context_capacity() - 1);
    }
    if (keep < request->prompt_.size()) {
      request->prompt_.erase(request->prompt_.begin(),
                             request->prompt_.end() - static_cast<ptrdiff_t>(keep));
    }
    return absl::OkStatus();
  }();
  if (!prompt.ok()) {
    std::lock_guard<std::mutex> lock(mu_);
    ++counters_.total;
    ++counters_.failed;
    return prompt;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (shutting_down_) return absl::UnavailableError("host shutting down");
    input.model = model->info.id();
    // No session named: the request takes a pooled session when it runs (PopRunnableLocked),
    // so concurrent unnamed requests run (and batch) side by side.
    // The queue holds requests no worker has taken yet, including those an idle worker is
    // about to take: a burst that arrives before the idle workers wake is not waiting for a
    // thread, so each idle worker makes room for one more.
    const int idle_workers = std::max(0, static_cast<int>(workers_.size()) - counters_.active);
    const int queued = static_cast<int>(queue_.size());
    if (queued >= options_.queue_capacity + idle_workers) {
      ++counters_.rejected;
      return absl::ResourceExhaustedError(absl::StrCat("request queue is full (",
                                                       queued - idle_workers, " waiting, capacity ",
                                                       options_.queue_capacity, ")"));
    }
    std::string id = input.request_id;
    if (id.empty()) id = absl::StrCat("req-", next_id_++);
    if (live_.count(id)) {
      return absl::AlreadyExistsError(absl::StrCat("request id '", id, "' is already live"));
    }
    request->id_ = id;
    request->choices_ = input.prompt_only ? 1 : input.n;
    if (static_cast<size_t>(request->choices_) > MostSessions()) {
      // Its choices decode side by side, a session each: it could never run.
      return absl::InvalidArgumentError(
          absl::StrCat("n: ", request->choices_, " choices need ", request->choices_,
                       " sessions at once; this host keeps at most ", MostSessions(),
                       " per model (--max-sessions)"));
    }
    request->choice_stop_ =
        std::make_unique<std::atomic<bool>[]>(static_cast<size_t>(request->choices_));
    request->input_ = std::move(input);
    request->sink_ = std::move(sink);
    request->accepted_ = Clock::now();
    ++counters_.total;
    queue_.push_back(request);
    live_[id] = request;
  }
  cv_.notify_one();
  return request;
}

bool Engine::Cancel(const std::string& request_id, bool stop) {
  std::shared_ptr<Request> request;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = live_.find(request_id);
    if (it == live_.end()) return false;
    request = it->second;
  }
  Cancel(request, stop);
  return true;
}

bool Engine::CancelChoice(const std::string& request_id, int32_t choice) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = live_.find(request_id);
  return it != live_.end() && it->second->StopChoice(choice);
}

void Engine::Cancel(const std::shared_ptr<Request>& request, bool stop) {
  bool dequeued = false;
  absl::Status ended;  // a dequeued request's end, counted and told the same
  {
    std::lock_guard<std::mutex> lock(mu_);
    request->Cancel(stop);
    // A cancelled request still waiting for a worker ends now: with every worker busy it would
    // wait in the queue (and count in its depth) until one frees.
    if (!stop) {
      auto queued = std::find(queue_.begin(), queue_.end(), request);
      if (queued != queue_.end()) {
        queue_.erase(queued);
        dequeued = true;
        // It leaves the queue and enters the cancelled count in one step (see WorkerLoop).
        ended = request->CancelStatus();
        CountFinishedLocked(*request, ended, v1::Finished());
      }
    }
    cv_.notify_all();
  }
  if (dequeued) NotifyFinished(*request, ended, v1::Finished());
}

std::optional<Engine::Job> Engine::PopRunnableLocked() {
  for (auto it = queue_.begin(); it != queue_.end(); ++it) {
    std::shared_ptr<Request> request = *it;
    Job job;
    job.request = request;
    if (!request->CancelStatus().ok()) {
      queue_.erase(it);
      return job;  // ends at once, without a session
    }
    auto model = FindModelLocked(request->input_.model);
    if (!model.ok()) {
      queue_.erase(it);
      return job;  // unloaded since Submit: Run reports it
    }
    if (request->input_.session.empty()) {
      request->input_.session = PickPooledSessionLocked(**model, *request);
      if (request->input_.session.empty()) continue;  // every pooled session is busy
    }
    const std::string& name = request->input_.session;
    auto existing = (*model)->sessions.find(name);
    if (existing != (*model)->sessions.end() && existing->second.busy) {
      continue;  // that session is serving another request
    }
    // Its own session if new, and one per choice beyond the first (n > 1).
    const size_t choice_sessions = static_cast<size_t>(request->choices_ - 1);
    const size_t more = (existing == (*model)->sessions.end() ? 1 : 0) + choice_sessions;
    if (more > 0 && !MakeRoomForSessionsLocked(**model, more, name)) {
      continue;  // too many sessions busy: more would pass max_sessions
    }
    SessionSlot& slot = (*model)->sessions[name];
    slot.busy = true;
    ++(*model)->active;
    (*model)->choice_sessions += choice_sessions;
    // Spares serve first: its session when it has none, then its choices'.
    LoadedModel& m = **model;
    if (slot.session == nullptr && !m.spare_sessions.empty()) {
      slot.session = TakeSpareLocked(m);
      job.slot_session_spare = true;
    }
    while (job.spares.size() < choice_sessions && !m.spare_sessions.empty()) {
      job.spares.push_back(TakeSpareLocked(m));
    }
    job.model = *model;
    job.slot = &slot;
    job.choice_sessions = choice_sessions;
    queue_.erase(it);
    return job;
  }
  return std::nullopt;
}

bool Engine::MakeRoomForSessionsLocked(LoadedModel& model, size_t more, const std::string& keep) {
  const size_t most = MostSessions();
  // The spares take the first `more`; the rest are new. (Spares beyond `more` never need
  // dropping: kept + choice + spare sessions stay within `most`, and a closed session only
  // becomes a spare while the request needs more.)
  while (model.sessions.size() + model.choice_sessions +
             std::max(model.spare_sessions.size(), more) >
         most) {
    auto oldest = model.sessions.end();
    for (auto it = model.sessions.begin(); it != model.sessions.end(); ++it) {
      if (it->second.busy || it->first == keep) continue;
      if (oldest == model.sessions.end() || it->second.last_used < oldest->second.last_used) {
        oldest = it;
      }
    }
    if (oldest == model.sessions.end()) return false;
    COLI_LOG(kInfo) << "model '" << model.info.id() << "': " << model.sessions.size()
                    << " sessions + " << model.choice_sessions
                    << " of running choices (--max-sessions): closing '" << oldest->first
                    << "', the least recently used";
    if (oldest->second.session != nullptr && model.spare_sessions.size() < more) {
      AddSpareLocked(model, std::move(oldest->second.session));  // reset before use
    }
    model.sessions.erase(oldest);
    ++model.sessions_closed;
  }
  return true;
}

std::string Engine::PickPooledSessionLocked(const LoadedModel& model,
                                            const Request& request) const {
  // Like llama.cpp's slot choice by prompt similarity, for state that cannot be rewound. The
  // plugin (ABI 1.6) says how many of the prompt's tokens each free session would keep — its
  // record when the prompt extends it, a checkpoint, state its model shares between sessions —
  // and a new session. The request runs where the least is computed: the prompt's tokens not
  // kept, plus the tokens of another conversation's state that running there would drop (that
  // conversation's next turn computes them again); among equals, where less is dropped, then on
  // the least recently used (a new session first). So alternating conversations each keep their
  // own session while there are enough, and a new conversation that only shares a system prompt
  // with another one takes a session of its own unless that saves more than it drops.
  // An older plugin: a guess from the records (all of a record the prompt extends; a session
  // sharing at least half of the prompt, which may hold a checkpoint inside it).
  const std::vector<int32_t>& prompt = request.prompt_;
  const bool ask = model.model->plugin().minor() >= 6;
  struct Choice {
    std::string name;
    size_t cost = 0;     // prompt tokens to compute + another conversation's tokens dropped
    size_t dropped = 0;  // the latter
    uint64_t used = 0;   // last_used; 0 = never
  };
  std::optional<Choice> best;
  auto consider = [&](Choice c) {
    if (!best ||
        std::tie(c.cost, c.dropped, c.used) < std::tie(best->cost, best->dropped, best->used)) {
      best = std::move(c);
    }
  };
  bool fresh_seen = false;
  const int pool = PoolSize();
  for (int i = 0; i < pool; ++i) {
    std::string name = i == 0 ? "default" : absl::StrCat("default#", i);
    auto found = model.sessions.find(name);
    const SessionSlot* slot = found == model.sessions.end() ? nullptr : &found->second;
    if (slot != nullptr && slot->busy) continue;
    const bool fresh = slot == nullptr || slot->record.empty();
    if (fresh && fresh_seen) continue;  // one unused session stands for all of them
    fresh_seen = fresh_seen || fresh;
    const std::vector<int32_t> none;
    const std::vector<int32_t>& record = fresh ? none : slot->record;
    const size_t common =
        std::mismatch(record.begin(), record.end(), prompt.begin(), prompt.end()).first -
        record.begin();
    std::optional<size_t> said;  // what the plugin says this session keeps
    if (ask) {
      absl::StatusOr<size_t> keep =
          model.model->Reusable(slot != nullptr ? slot->session.get() : nullptr, prompt);
      if (keep.ok()) {
        said = *keep;
      } else {
        COLI_LOG(kWarning) << "pooled session '" << name << "': " << keep.status();
      }
    }
    size_t kept = 0;
    if (said) {
      kept = *said;
    } else if (common == record.size() && common < prompt.size()) {
      kept = common;  // the prompt extends the record
    } else if (2 * common >= prompt.size()) {
      kept = common;  // a guess: a checkpoint may lie inside the shared part
    }
    const size_t dropped = record.size() - common;
    consider(Choice{name, prompt.size() - std::min(kept, prompt.size()) + dropped, dropped,
                    fresh ? 0 : slot->last_used});
  }
  return best ? best->name : "";
}

void Engine::WorkerLoop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    std::optional<Job> job;
    cv_.wait(lock, [&] {
      job = PopRunnableLocked();
      return job.has_value() || (shutting_down_ && queue_.empty());
    });
    if (!job) return;
    ++counters_.active;
    lock.unlock();
    v1::Finished finished;
    const absl::Status status = Run(*job, &finished);
    std::vector<int32_t> record;
    if (job->slot != nullptr && job->slot->session != nullptr) {
      // A record that cannot be read places the next unnamed request as if the session were new.
      record = job->slot->session->Record().value_or(std::vector<int32_t>{});
    }
    lock.lock();
    // The request leaves `active` and enters its outcome counter in one step, so a metrics
    // read never sees it in neither.
    --counters_.active;
    CountFinishedLocked(*job->request, status, finished);
    if (job->slot != nullptr) {
      job->slot->record = std::move(record);
      job->slot->last_used = ++slot_clock_;
      job->slot->busy = false;
      --job->model->active;
      job->model->choice_sessions -= job->choice_sessions;
      // Its choices' sessions (and spares it did not use) wait for the next request.
      for (auto* held : {&job->spares, &job->choice_session_objects}) {
        for (std::unique_ptr<Session>& session : *held) {
          if (session != nullptr) AddSpareLocked(*job->model, std::move(session));
        }
      }
    }
    if (job->model != nullptr) {
      if (status.ok()) {
        job->model->files_problem.clear();
      } else if (status.code() == absl::StatusCode::kDataLoss) {
        job->model->files_problem = std::string(status.message());
      }
    }
    cv_.notify_all();
    lock.unlock();
    NotifyFinished(*job->request, status, finished);
    lock.lock();
  }
}

absl::Status Engine::Run(Job& job, v1::Finished* finished) {
  Request& request = *job.request;
  absl::Status status = request.CancelStatus();
  if (status.ok() && job.slot == nullptr) {
    status = absl::NotFoundError(absl::StrCat("model '", request.input_.model, "' is not loaded"));
  }
  if (status.ok()) {
    finished->mutable_stats()->set_queue_seconds(Seconds(Clock::now() - request.accepted_));
    // A bug that throws (a JSON accessor, an allocation) fails this request, never the host:
    // an exception leaving a worker thread would terminate the process and every stream.
    try {
      status = Generate(job, finished);
    } catch (const std::exception& e) {
      status = absl::InternalError(absl::StrCat("generation failed: ", e.what()));
      COLI_LOG(kError) << "request '" << request.id_ << "': " << status;
    }
  }
  return status;
}

namespace {

// The prompt's logprobs as events of at most 512 positions each (a long prompt's would pass
// gRPC's 4 MB message limit in one), each entry with its token's own bytes.
void SendPromptLogprobs(Model& model, const PrefillResult& prefill, int32_t top_k,
                        const EventSink& sink) {
  if (!sink.on_prompt_logprobs) return;
  const size_t per = 1 + static_cast<size_t>(top_k);
  const size_t positions = prefill.prompt_logprobs.size() / per;
  constexpr size_t kPiece = 512;
  auto fill = [&model](const coli_logprob_t& e, v1::TokenLogprob* t) {
    t->set_id(e.id);
    t->set_logprob(e.logprob);
    auto text = model.Detokenize(std::span<const int32_t>(&e.id, 1));
    if (text.ok()) t->set_text(*text);
  };
  for (size_t start = 0; start < positions; start += kPiece) {
    v1::PromptLogprobs piece;
    piece.set_first(static_cast<int64_t>(start + 1));
    for (size_t p = start; p < std::min(positions, start + kPiece); ++p) {
      const coli_logprob_t* e = &prefill.prompt_logprobs[p * per];
      auto* lp = piece.add_tokens();
      fill(e[0], lp->mutable_sampled());
      if (p < prefill.prompt_logprob_ranks.size()) {
        lp->mutable_sampled()->set_rank(prefill.prompt_logprob_ranks[p]);
      }
      for (size_t k = 1; k < per; ++k) fill(e[k], lp->add_top());
    }
    sink.on_prompt_logprobs(piece);
  }
}

}  // namespace

absl::StatusOr<std::unique_ptr<Session>> Engine::SessionFor(LoadedModel& model,
                                                            std::unique_ptr<Session> spare,
                                                            const std::string& request_id) {
  if (spare != nullptr) {
    // A reset session is a new one (ABI: the record and state forgotten, statistics restarted)
    // that keeps what the plugin allocated for it.
    absl::Status reset = spare->Reset();
    if (reset.ok()) {
      ++model.sessions_reused;
      return spare;
    }
    COLI_LOG(kWarning) << "request '" << request_id
                       << "': a spare session could not be reset, making a new one: " << reset;
    spare.reset();
  }
  COLI_ASSIGN_OR_RETURN(std::unique_ptr<Session> made, model.model->NewSession());
  ++model.sessions_created;
  return made;
}

absl::Status Engine::Generate(Job& job, v1::Finished* finished) {
  Request& request = *job.request;
  LoadedModel& loaded = *job.model;
  SessionSlot& slot = *job.slot;
  const GenerationInput& in = request.input_;
  Model& model = *loaded.model;
  if (slot.session == nullptr || job.slot_session_spare) {
    job.slot_session_spare = false;
    COLI_ASSIGN_OR_RETURN(slot.session, SessionFor(loaded, std::move(slot.session), request.id_));
  }
  Session& session = *slot.session;

  const std::vector<int32_t>& prompt = request.prompt_;  // rendered at Submit
  // However the request ends, what it used goes into the engine's sums now: a cancelled or
  // failed request's tokens and its session's statistics (its prefill, the decode rows its
  // chunks carried) too. They used to wait for the session's next request, or were lost when
  // the session was closed before one; and no cancelled request's tokens were counted.
  int64_t generated = 0;                    // all choices' tokens
  std::optional<int64_t> prefilled_reused;  // set once the prompt is read
  // n > 1: the sessions of choices 1…n-1, this request's own (new or reset spares; they become
  // spares when it ends).
  std::vector<std::unique_ptr<Session>>& extra = job.choice_session_objects;
  absl::Cleanup account = [&] {
    if (!finished->has_usage()) {  // ended early: what it used until then
      auto* usage = finished->mutable_usage();
      if (prefilled_reused) {
        usage->set_prompt_tokens(static_cast<int64_t>(prompt.size()));
        usage->set_tokens_reused(*prefilled_reused);
      }
      usage->set_completion_tokens(generated);
    }
    auto plugin_stats = session.Stats();
    if (plugin_stats.ok()) {
      auto& in_finished = *finished->mutable_stats()->mutable_plugin();
      for (const auto& [k, v] : *plugin_stats) in_finished[k] = v;
    }
    // The choices' own sessions are new or reset: all their statistics are this request's.
    std::map<std::string, double> extra_stats;
    for (const auto& e : extra) {
      if (e == nullptr) continue;
      auto stats = e->Stats();
      if (!stats.ok()) continue;
      for (const auto& [k, v] : *stats) extra_stats[k] += v;
    }
    for (const auto& [k, v] : extra_stats) (*finished->mutable_stats()->mutable_plugin())[k] += v;
    // Counted here, before the worker marks the request inactive: whoever sees no request
    // active finds every one's tokens counted.
    std::lock_guard<std::mutex> lock(mu_);
    counters_.prompt_tokens += finished->usage().prompt_tokens();
    counters_.completion_tokens += finished->usage().completion_tokens();
    counters_.tokens_reused += finished->usage().tokens_reused();
    for (const auto& [k, v] : extra_stats) counters_.plugin[k] += v;
    if (!plugin_stats.ok()) return;
    for (const auto& [k, v] : *plugin_stats) {
      auto it = slot.last_stats.find(k);
      const double before = it == slot.last_stats.end() ? 0.0 : it->second;
      // A session reset restarts its counters: count the new total then.
      counters_.plugin[k] += v >= before ? v - before : v;
    }
    slot.last_stats = *plugin_stats;
  };
  const int32_t parse_mode = request.parse_mode_;
  if (prompt.empty()) return absl::InvalidArgumentError("EMPTY_PROMPT");
  // The response_format to enforce: the request's own field, else the chat body's member.
  std::string response_format = in.response_format;
  if (in.chat && response_format.empty()) {
    // tool_choice auto / none is enforced where the family can take it (ABI 1.4); a plugin of
    // an older minor runs such a request unconstrained, as before, instead of refusing it.
    COLI_ASSIGN_OR_RETURN(response_format,
                          ResponseFormatOf(in.request_json, model.plugin().minor() >= 4));
  }
  COLI_RETURN_IF_ERROR(model.CheckResponseFormat(response_format));
  // The sampling knobs are checked before any work (ranges, logit_bias ids against the
  // vocabulary, and a plugin too old to apply the ABI 1.3 knobs).
  Sampling sampling;
  sampling.temperature = in.sampling.temperature();
  sampling.top_p = in.sampling.top_p();
  sampling.top_k = in.sampling.top_k();
  sampling.logprobs = in.sampling.logprobs();
  sampling.repetition_penalty = in.sampling.repetition_penalty();
  sampling.frequency_penalty = in.sampling.frequency_penalty();
  sampling.presence_penalty = in.sampling.presence_penalty();
  sampling.min_p = in.sampling.min_p();
  for (const v1::LogitBias& b : in.sampling.logit_bias()) {
    sampling.logit_bias.push_back({b.id(), b.bias()});
  }
  COLI_RETURN_IF_ERROR(model.CheckSampling(sampling));
  // min_tokens / ignore_eos: the same knobs with the stop tokens banned, for the steps that
  // must not end the reply.
  const int32_t vocab = model.info().vocab_size;
  for (int32_t id : in.sampling.stop_token_ids()) {
    if (id < 0 || (vocab > 0 && id >= vocab)) {
      return absl::InvalidArgumentError(
          absl::StrCat("stop_token_ids: token id ", id, " is outside [0, ", vocab, ")"));
    }
  }
  const std::unordered_set<int32_t> stop_token_ids(in.sampling.stop_token_ids().begin(),
                                                   in.sampling.stop_token_ids().end());
  // Before min_tokens: the model's stop tokens and stop_token_ids held back; after it, with
  // ignore_eos, the model's stop tokens only (stop_token_ids end the reply again).
  const int32_t min_tokens = in.sampling.min_tokens();
  std::optional<Sampling> before_min, without_eos;
  if (min_tokens > 0) {
    std::vector<int32_t> ban = model.info().stop_ids;
    ban.insert(ban.end(), stop_token_ids.begin(), stop_token_ids.end());
    COLI_ASSIGN_OR_RETURN(before_min, WithBannedTokens(sampling, ban));
    COLI_RETURN_IF_ERROR(model.CheckSampling(*before_min));
  }
  if (in.sampling.ignore_eos()) {
    COLI_ASSIGN_OR_RETURN(without_eos, WithBannedTokens(sampling, model.info().stop_ids));
    COLI_RETURN_IF_ERROR(model.CheckSampling(*without_eos));
  }
  if (in.prompt_logprobs && (*in.prompt_logprobs < 0 || *in.prompt_logprobs > 20)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "prompt_logprobs: ", *in.prompt_logprobs, " top alternatives is outside 0…20"));
  }
  // A prompt-only request may fill the context: nothing follows it.
  const int64_t capacity = model.info().context_capacity;
  if (capacity > 0 && static_cast<int64_t>(prompt.size()) >= capacity + (in.prompt_only ? 1 : 0)) {
    return absl::ResourceExhaustedError(
        absl::StrCat("CONTEXT_EXCEEDED prompt_tokens=", prompt.size(), " capacity=", capacity));
  }

  const auto t_prefill = Clock::now();
  // A STOP while the prompt is read ends the prefill too: on a big model a person may wait
  // minutes for it, and stopping means now.
  std::function<bool()> cancelled = [&request] {
    return !request.CancelStatus().ok() || request.stop_.load();
  };
  // The plugin reports tokens computed of the tail it computes (the reused prefix is in
  // neither); the stream reports prompt tokens ready of all of them.
  const int64_t n_prompt = static_cast<int64_t>(prompt.size());
  int64_t last_done = -1;
  Clock::time_point last_sent{};
  std::function<void(uint64_t, uint64_t)> on_progress = [&](uint64_t done, uint64_t total) {
    if (total > static_cast<uint64_t>(n_prompt) || done > total) return;  // not a token count
    const int64_t reused = n_prompt - static_cast<int64_t>(total);
    const int64_t ready = reused + static_cast<int64_t>(done);
    if (ready <= last_done) return;  // a repeated report (the plugin's cancel polls)
    const bool first = last_done < 0;
    last_done = ready;
    const auto now = Clock::now();
    if (in.report_progress && request.sink_.on_progress &&
        (first || ready == n_prompt || now - last_sent >= std::chrono::milliseconds(100))) {
      last_sent = now;
      v1::PrefillProgress p;
      p.set_done(ready);
      p.set_total(n_prompt);
      p.set_reused(reused);
      p.set_elapsed_ms(
          std::chrono::duration_cast<std::chrono::milliseconds>(now - t_prefill).count());
      request.sink_.on_progress(p);
    }
    if (options_.prefill_delay_ms > 0 && done > 0 && ready < n_prompt) {
      // Sleep in small slices so a cancel still lands before the next chunk.
      const auto until = Clock::now() + std::chrono::milliseconds(options_.prefill_delay_ms);
      while (Clock::now() < until && request.CancelStatus().ok()) {
        std::this_thread::sleep_for(
            std::chrono::milliseconds(std::min(5, options_.prefill_delay_ms)));
      }
    }
  };
  auto prefill = session.Prefill(prompt, parse_mode, in.sampling.seed(), cancelled, on_progress,
                                 response_format, in.prompt_logprobs.value_or(-1));
  if (!prefill.ok()) {
    // A cancelled prefill reports the request's own reason (deadline, shutdown, cancel).
    absl::Status why = request.CancelStatus();
    if (!why.ok()) return why;
    if (request.stop_.load() && absl::IsCancelled(prefill.status())) {
      // Stopped before the first token: a normal end with nothing generated (the session keeps
      // the chunks that completed).
      v1::Started started;
      started.set_request_id(request.id_);
      started.set_prompt_tokens(n_prompt);
      if (request.sink_.on_started) request.sink_.on_started(started);
      finished->set_reason(v1::FINISH_REASON_STOPPED);
      finished->mutable_usage()->set_prompt_tokens(n_prompt);
      finished->mutable_stats()->set_prefill_seconds(Seconds(Clock::now() - t_prefill));
      return absl::OkStatus();
    }
    return prefill.status();
  }
  prefilled_reused = static_cast<int64_t>(prefill->tokens_reused);

  // The other choices start from the prompt's state: copied from this session (ABI 1.11: their
  // prefill then computes nothing), or, from a plugin that cannot copy, prefilled each.
  const int32_t n = request.choices_;
  for (int32_t i = 1; i < n; ++i) {
    std::unique_ptr<Session> spare;
    if (!job.spares.empty()) {
      spare = std::move(job.spares.back());
      job.spares.pop_back();
    }
    COLI_ASSIGN_OR_RETURN(std::unique_ptr<Session> choice,
                          SessionFor(loaded, std::move(spare), request.id_));
    if (choice->CanCopy()) {
      if (absl::Status copied = choice->CopyFrom(session); !copied.ok()) {
        COLI_LOG(kWarning) << "request '" << request.id_ << "': choice " << i
                           << " could not copy the prompt's state, prefilling it: " << copied;
      }
    }
    auto choice_prefill =
        choice->Prefill(prompt, parse_mode, in.sampling.seed() + static_cast<uint64_t>(i),
                        cancelled, nullptr, response_format, -1);
    extra.push_back(std::move(choice));
    if (!choice_prefill.ok()) {
      absl::Status why = request.CancelStatus();
      if (!why.ok()) return why;
      if (request.stop_.load() && absl::IsCancelled(choice_prefill.status())) break;
      return absl::Status(
          choice_prefill.status().code(),
          absl::StrCat("choice ", i, " of ", n, ": ", choice_prefill.status().message()));
    }
  }
  const auto t_decode = Clock::now();

  int64_t remaining = prefill->context_capacity > 0
                          ? prefill->context_capacity - prefill->context_used
                          : std::numeric_limits<int32_t>::max();
  int32_t max_tokens =
      in.prompt_only ? 0
                     : static_cast<int32_t>(std::min<int64_t>(
                           in.max_tokens > 0 ? in.max_tokens : std::numeric_limits<int32_t>::max(),
                           remaining));
  v1::Started started;
  started.set_request_id(request.id_);
  started.set_prompt_tokens(static_cast<int64_t>(prompt.size()));
  started.set_tokens_reused(static_cast<int64_t>(prefill->tokens_reused));
  started.set_tokens_computed(static_cast<int64_t>(prefill->tokens_computed));
  started.set_max_tokens(max_tokens);
  if (request.sink_.on_started) request.sink_.on_started(started);
  if (in.prompt_logprobs) {
    SendPromptLogprobs(model, *prefill, *in.prompt_logprobs, request.sink_);
  }

  // Each choice's own progress; they step together (one DecodeSteps per token position).
  struct Choice {
    Session* session = nullptr;
    int64_t generated = 0;
    bool saw_tool_call = false;
    bool done = false;
    v1::FinishReason reason = v1::FINISH_REASON_LENGTH;
  };
  std::vector<Choice> choices(static_cast<size_t>(n));
  choices[0].session = &session;
  for (int32_t i = 1; i < n; ++i) {
    // A STOP during the choices' prefills leaves the rest without one: they end at once.
    if (static_cast<size_t>(i - 1) < extra.size()) choices[i].session = extra[i - 1].get();
  }
  auto end_choice = [&](int32_t i, v1::FinishReason reason) {
    Choice& c = choices[static_cast<size_t>(i)];
    c.done = true;
    c.reason = reason;
    if (n > 1 && request.sink_.on_choice_finished) {
      v1::ChoiceFinished f;
      f.set_choice(i);
      f.set_reason(reason);
      f.set_completion_tokens(c.generated);
      request.sink_.on_choice_finished(f);
    }
  };
  Clock::time_point first_token{};
  std::vector<v1::ChatDelta> deltas;
  std::vector<Session*> rows;
  std::vector<int32_t> row_choice;
  while (true) {
    COLI_RETURN_IF_ERROR(request.CancelStatus());
    rows.clear();
    row_choice.clear();
    for (int32_t i = 0; i < n; ++i) {
      Choice& c = choices[static_cast<size_t>(i)];
      if (c.done) continue;
      if (request.stop_.load() || request.ChoiceStopped(i) || c.session == nullptr) {
        end_choice(i, v1::FINISH_REASON_STOPPED);
      } else if (c.generated >= max_tokens) {
        end_choice(i, !in.prompt_only && (max_tokens < in.max_tokens || in.max_tokens <= 0)
                          ? v1::FINISH_REASON_CONTEXT
                          : v1::FINISH_REASON_LENGTH);
      } else {
        rows.push_back(c.session);
        row_choice.push_back(i);
      }
    }
    if (rows.empty()) break;
    if (options_.decode_delay_ms > 0) {
      // Sleep in small slices so a cancel or stop still lands within one token.
      const auto until = Clock::now() + std::chrono::milliseconds(options_.decode_delay_ms);
      while (Clock::now() < until && request.CancelStatus().ok() && !request.stop_.load()) {
        std::this_thread::sleep_for(
            std::chrono::milliseconds(std::min(5, options_.decode_delay_ms)));
      }
      COLI_RETURN_IF_ERROR(request.CancelStatus());
      if (request.stop_.load()) continue;  // the loop's top ends every choice
    }
    // The choices step together: one count of tokens generated holds for all.
    const int64_t step_index = choices[static_cast<size_t>(row_choice[0])].generated;
    const Sampling& knobs = step_index < min_tokens ? *before_min
                            : without_eos           ? *without_eos
                                                    : sampling;
    std::vector<absl::StatusOr<StepResult>> steps = DecodeSteps(loaded, rows, knobs);
    for (size_t r = 0; r < rows.size(); ++r) {
      const int32_t i = row_choice[r];
      Choice& c = choices[static_cast<size_t>(i)];
      if (!steps[r].ok()) {
        const absl::Status& s = steps[r].status();
        if (n == 1) return s;
        return absl::Status(s.code(), absl::StrCat("choice ", i, " of ", n, ": ", s.message()));
      }
      const StepResult& step = *steps[r];
      if (step.finish == COLI_FINISH_LENGTH && step.token < 0) {
        end_choice(i, v1::FINISH_REASON_CONTEXT);
        continue;
      }
      ++c.generated;
      ++generated;
      if (generated == 1) first_token = Clock::now();
      v1::Token token;
      token.set_id(step.token);
      token.set_text(step.text);
      if (n > 1) token.set_choice(i);
      if (sampling.logprobs > 0) {
        // Each entry holds its token's own bytes (OpenAI's `bytes`), not the decoder's text: a
        // token that is half a character has bytes of its own but completes no text.
        auto fill = [&model](int32_t id, float logprob, v1::TokenLogprob* t) {
          t->set_id(id);
          t->set_logprob(logprob);
          auto text = model.Detokenize(std::span<const int32_t>(&id, 1));
          if (text.ok()) t->set_text(*text);
        };
        auto* lp = token.mutable_logprobs();
        fill(step.token, step.logprob, lp->mutable_sampled());
        for (const auto& top : step.top_logprobs) fill(top.id, top.logprob, lp->add_top());
      }
      deltas.clear();
      for (const auto& e : step.events) {
        v1::ChatDelta d;
        d.set_channel(ToChannel(e.channel));
        d.set_text(ValidUtf8(e.text));
        d.set_end_of_message(e.end_of_message);
        if (e.channel == COLI_CHANNEL_TOOL_CALL) c.saw_tool_call = true;
        deltas.push_back(std::move(d));
      }
      if (request.sink_.on_token) request.sink_.on_token(token, deltas);
      if (step.finish == COLI_FINISH_STOP || stop_token_ids.contains(step.token)) {
        end_choice(i, c.saw_tool_call ? v1::FINISH_REASON_TOOL_CALLS : v1::FINISH_REASON_STOP);
      } else if (step.finish == COLI_FINISH_LENGTH) {
        end_choice(i, v1::FINISH_REASON_CONTEXT);
      }
    }
  }
  const auto t_end = Clock::now();

  finished->set_reason(choices[0].reason);
  auto* usage = finished->mutable_usage();
  usage->set_prompt_tokens(static_cast<int64_t>(prompt.size()));
  usage->set_completion_tokens(generated);
  usage->set_tokens_reused(static_cast<int64_t>(prefill->tokens_reused));
  usage->set_tokens_computed(static_cast<int64_t>(prefill->tokens_computed));
  auto* stats = finished->mutable_stats();
  stats->set_prefill_seconds(Seconds(t_decode - t_prefill));
  stats->set_decode_seconds(Seconds(t_end - t_decode));
  if (generated > 0) {
    stats->set_ttft_seconds(Seconds(first_token - request.accepted_));
    const double decode = Seconds(t_end - t_decode);
    if (decode > 0) stats->set_tokens_per_second(static_cast<double>(generated) / decode);
  }
  return absl::OkStatus();  // `account` adds the sessions' statistics
}

// Runs one gathered batch. When a call of several rows fails, the rows the plugin finished
// before failing keep their outputs and every other row is retried alone, so one bad row fails
// only its own request. (A refusal changes no session; a kimi_k3 pass that failed breaks all its
// sessions, whose lone retries then fail too, naming the batched error.)
void Engine::RunDecodeBatch(std::span<DecodeRow* const> batch) {
  if (batch.size() == 1) {
    batch[0]->result = batch[0]->session->Step(batch[0]->sampling);
    return;
  }
  std::vector<Session*> sessions;
  std::vector<Sampling> sampling;
  for (auto* row : batch) {
    sessions.push_back(row->session);
    sampling.push_back(row->sampling);
  }
  std::vector<std::optional<StepResult>> completed;
  auto out = Session::StepBatch(sessions, sampling, &completed);
  if (out.ok()) {
    for (size_t i = 0; i < batch.size(); ++i) batch[i]->result = std::move((*out)[i]);
    return;
  }
  COLI_LOG(kDebug) << "batched decode of " << batch.size()
                   << " rows failed, retrying unfinished rows alone: " << out.status().ToString();
  for (size_t i = 0; i < batch.size(); ++i) {
    DecodeRow* row = batch[i];
    if (i < completed.size() && completed[i].has_value()) {
      row->result = std::move(*completed[i]);
      continue;
    }
    row->result = row->session->Step(row->sampling);
    if (!row->result.ok()) {
      const absl::Status& s = row->result.status();
      row->result =
          absl::Status(s.code(), absl::StrCat(s.message(), " (the batched decode of ", batch.size(),
                                              " rows failed first: ", out.status().message(), ")"));
    }
  }
}

absl::StatusOr<StepResult> Engine::DecodeStep(LoadedModel& model, Session& session,
                                              const Sampling& sampling) {
  Session* one[] = {&session};
  return std::move(DecodeSteps(model, one, sampling)[0]);
}

std::vector<absl::StatusOr<StepResult>> Engine::DecodeSteps(LoadedModel& model,
                                                            std::span<Session* const> sessions,
                                                            const Sampling& sampling) {
  std::vector<absl::StatusOr<StepResult>> results;
  if (options_.max_batch <= 1) {
    for (Session* session : sessions) {
      decode_calls_.fetch_add(1, std::memory_order_relaxed);
      decode_rows_.fetch_add(1, std::memory_order_relaxed);
      results.push_back(session->Step(sampling));
    }
    return results;
  }
  DecodeBatcher& b = model.batcher;
  std::vector<DecodeRow> mine(sessions.size());
  std::unique_lock<std::mutex> lock(b.mu);
  for (size_t i = 0; i < sessions.size(); ++i) {
    mine[i].session = sessions[i];
    mine[i].sampling = sampling;
    b.waiting.push_back(&mine[i]);
  }
  auto all_done = [&mine] {
    return std::all_of(mine.begin(), mine.end(), [](const DecodeRow& r) { return r.done; });
  };
  while (!all_done()) {
    if (b.running) {
      b.cv.wait(lock);
      continue;
    }
    // Leader: take the rows waiting now (no added wait) and make one call.
    b.running = true;
    const size_t n = std::min(b.waiting.size(), static_cast<size_t>(options_.max_batch));
    std::vector<DecodeRow*> batch(b.waiting.begin(), b.waiting.begin() + static_cast<long>(n));
    b.waiting.erase(b.waiting.begin(), b.waiting.begin() + static_cast<long>(n));
    lock.unlock();
    decode_calls_.fetch_add(1, std::memory_order_relaxed);
    decode_rows_.fetch_add(n, std::memory_order_relaxed);
    RunDecodeBatch(batch);
    lock.lock();
    for (auto* row : batch) row->done = true;
    b.running = false;
    b.cv.notify_all();
  }
  for (DecodeRow& row : mine) results.push_back(std::move(row.result));
  return results;
}

void Engine::CountFinishedLocked(Request& request, const absl::Status& status,
                                 const v1::Finished& finished) {
  live_.erase(request.id_);
  if (status.ok()) {  // (its tokens were counted by Generate, as every request's)
    ++counters_.ok;
    if (finished.usage().completion_tokens() > 0) {
      counters_.ttft_last = finished.stats().ttft_seconds();
      counters_.ttft_sum += counters_.ttft_last;
      ++counters_.ttft_n;
      counters_.tps_last = finished.stats().tokens_per_second();
      counters_.tps_sum += counters_.tps_last;
      ++counters_.tps_n;
    }
  } else if (status.code() == absl::StatusCode::kCancelled ||
             status.code() == absl::StatusCode::kDeadlineExceeded ||
             status.code() == absl::StatusCode::kUnavailable) {
    ++counters_.cancelled;
  } else {
    ++counters_.failed;
  }
}

void Engine::NotifyFinished(Request& request, const absl::Status& status,
                            const v1::Finished& finished) {
  if (!status.ok()) {
    COLI_LOG(kDebug) << "request '" << request.id_ << "' ended: " << status.ToString();
  }
  if (request.sink_.on_done) request.sink_.on_done(status, finished);
  request.sink_ = EventSink();  // drop captured state right away
}

// ---- health and metrics -------------------------------------------------------------------

v1::MetricsResponse Engine::Metrics() const {
  // The models' own gauges, read outside the engine's lock (a plugin call).
  std::vector<std::pair<std::string, std::shared_ptr<LoadedModel>>> loaded;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [id, model] : models_) loaded.emplace_back(id, model);
  }
  v1::MetricsResponse m;
  for (const auto& [id, model] : loaded) {
    absl::StatusOr<std::map<std::string, double>> stats = model->model->Stats();
    if (!stats.ok()) {
      COLI_LOG(kWarning) << "model '" << id << "' statistics: " << stats.status();
      continue;
    }
    for (const auto& [name, value] : *stats) {
      v1::ModelStat* stat = m.add_model_stats();
      stat->set_model(id);
      stat->set_name(name);
      stat->set_value(value);
    }
    // The host's own: sessions held, those closed to stay within --max-sessions, the idle
    // spares and those freed idle, and the plugin sessions made and the spares reused instead.
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [name, value] :
         {std::pair<const char*, double>{"host_sessions", model->sessions.size()},
          {"host_choice_sessions", static_cast<double>(model->choice_sessions)},
          {"host_sessions_closed", static_cast<double>(model->sessions_closed)},
          {"host_spare_sessions", static_cast<double>(model->spare_sessions.size())},
          {"host_spares_freed", static_cast<double>(model->spares_freed)},
          {"host_sessions_created", static_cast<double>(model->sessions_created.load())},
          {"host_sessions_reused", static_cast<double>(model->sessions_reused.load())}}) {
      v1::ModelStat* stat = m.add_model_stats();
      stat->set_model(id);
      stat->set_name(name);
      stat->set_value(value);
    }
  }
  std::lock_guard<std::mutex> lock(mu_);
  const Counters& c = counters_;
  m.set_requests_total(c.total);
  m.set_requests_ok(c.ok);
  m.set_requests_failed(c.failed);
  m.set_requests_cancelled(c.cancelled);
  m.set_requests_rejected(c.rejected);
  m.set_requests_active(c.active);
  m.set_queue_depth(static_cast<int32_t>(queue_.size()));
  m.set_queue_capacity(options_.queue_capacity);
  m.set_prompt_tokens(c.prompt_tokens);
  m.set_completion_tokens(c.completion_tokens);
  m.set_tokens_reused(c.tokens_reused);
  m.set_ttft_seconds_last(c.ttft_last);
  m.set_ttft_seconds_mean(c.ttft_n ? c.ttft_sum / static_cast<double>(c.ttft_n) : 0.0);
  m.set_tokens_per_second_last(c.tps_last);
  m.set_tokens_per_second_mean(c.tps_n ? c.tps_sum / static_cast<double>(c.tps_n) : 0.0);
  auto get = [&](const char* k) {
    auto it = c.plugin.find(k);
    return it == c.plugin.end() ? 0.0 : it->second;
  };
  m.set_expert_hits(get("expert_hits"));
  m.set_expert_misses(get("expert_misses"));
  const double lookups = m.expert_hits() + m.expert_misses();
  m.set_expert_hit_rate(lookups > 0 ? m.expert_hits() / lookups : 0.0);
  m.set_bytes_read(get("bytes_read"));
  m.set_uptime_seconds(Seconds(Clock::now() - started_));
  for (const auto& [k, v] : c.plugin) (*m.mutable_plugin())[k] = v;
  m.set_decode_calls(decode_calls_.load(std::memory_order_relaxed));
  m.set_decode_rows(decode_rows_.load(std::memory_order_relaxed));
  return m;
}

v1::HealthResponse Engine::Health() const {
  v1::HealthResponse h;
  std::lock_guard<std::mutex> lock(mu_);
  h.set_serving(!shutting_down_);
  h.set_version(COLI_HOST_VERSION);
  h.set_abi_version(absl::StrCat(COLI_ABI_VERSION_MAJOR, ".", COLI_ABI_VERSION_MINOR));
  h.set_uptime_seconds(Seconds(Clock::now() - started_));
  h.set_models_loaded(static_cast<int32_t>(models_.size()));
  for (const auto& [id, model] : models_) {
    if (model->files_problem.empty()) continue;
    auto* problem = h.add_model_problems();
    problem->set_model(id);
    problem->set_error(model->files_problem);
  }
  for (const auto& r : plugins_.reports()) {
    auto* p = h.add_plugins();
    p->set_file(r.file);
    p->set_family(r.family);
    p->set_version(r.version);
    p->set_abi_version(absl::StrCat(r.major, ".", r.minor));
    p->set_loaded(r.loaded);
    p->set_error(r.error);
    for (const v1::ModelSwitch& s : r.switches) *p->add_switches() = s;
  }
  return h;
}

}  // namespace coli::host
