// A test model family, "coli_echo": serves any directory whose config.json has
// "model_type": "coli_echo". Its tokens are bytes (id = byte value) plus four specials; its
// "model" echoes the prompt of the current generation byte by byte, then samples <eos>. It is
// small enough to predict exactly and exercises every ABI path the host uses: options (extra
// "delay_ms" slows each prefill chunk and decode step, "fail_open" makes model_open fail,
// "fail_feed" (a byte) makes a decode step fail, changing nothing, when it would feed that byte),
// progress/cancel, prefix reuse, sampling with a seed, logprobs, chat rendering and events,
// statistics and the session record. Built with ECHO_ABI_MINOR=0 it is a plugin written for ABI
// 1.0: a shorter table without session_record (tests/plugin_api loads it as "older minor").
// At ABI 1.3 (the default build) it honours the decode row's sampling knobs (logit_bias,
// penalties, min_p) through common/sampling over its logits {target: 8, others: 0}; the builds
// for older minors never read them.
// At ABI 1.8 it declares one environment switch of its own, TEST_FAMILY_KNOB (1…9, sent as
// option "knob", reported back as the model statistic "knob"): the host reads it with no line of
// its own naming it. ECHO_ABI_MINOR=7 builds a 1.7 plugin, whose table ends before the switches.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <fstream>
#include <memory>
#include <random>
#include <span>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/sampling/sampling.h"
#include "nlohmann/json.hpp"
#include "plugin_api/coli_plugin.h"
#include "plugin_api/cpp/abi_util.h"
#include "plugin_api/cpp/plugin_table.h"
#include "plugin_api/cpp/switches.h"

namespace {

using coli::abi::FillBytes;
using coli::abi::FillTokens;
using coli::abi::View;

constexpr int32_t kBos = 256, kEos = 257, kUser = 258, kAssistant = 259;
constexpr int32_t kVocab = 260;
const char* const kSpecialText[] = {"<bos>", "<eos>", "<user>", "<assistant>"};

const coli_host_api_t* g_host = nullptr;

void Log(int32_t level, const std::string& text) {
  if (g_host != nullptr && g_host->log != nullptr) {
    g_host->log(g_host->host_data, level, text.data(), text.size());
  }
}

struct EchoModel {
  std::string dir;
  int64_t capacity = 256;
  int chunk = 32;
  int delay_ms = 0;
  int32_t fail_feed = -1;
  std::vector<coli_special_token_t> specials;
  int32_t stop_ids[1] = {kEos};
  std::atomic<int> sessions_created{0};  // reported by model_stats (ABI 1.2)
  int knob = 0;                          // option "knob" (TEST_FAMILY_KNOB), 0 = not given
};

struct EchoSession {
  EchoModel* model;
  int64_t capacity;
  std::vector<int32_t> record;  // tokens the "state" was built from
  std::vector<int32_t> prompt;  // the current generation's prompt, echoed back
  coli::sampling::TokenHistory history;  // the prompt and the tokens generated since (1.3 knobs)
  size_t echoed = 0;
  int32_t pending = -1;  // sampled, not yet fed
  int32_t parse_mode = 0;
  std::mt19937_64 rng;
  // outputs of the last step, valid until the next call
  std::string text;
  std::vector<coli_logprob_t> top;
  std::vector<coli_chat_event_t> events;
  std::string event_text;
  // statistics
  double prompt_tokens = 0, reused = 0, computed = 0, generated = 0;
};

void Sleep(int ms) {
  if (ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(ms));
}

std::vector<int32_t> Encode(std::string_view text, bool allow_special) {
  std::vector<int32_t> ids;
  for (size_t i = 0; i < text.size(); ++i) {
    if (allow_special && text[i] == '<') {
      bool matched = false;
      for (int s = 0; s < 4; ++s) {
        std::string_view t = kSpecialText[s];
        if (text.substr(i, t.size()) == t) {
          ids.push_back(256 + s);
          i += t.size() - 1;
          matched = true;
          break;
        }
      }
      if (matched) continue;
    }
    ids.push_back(static_cast<unsigned char>(text[i]));
  }
  return ids;
}

std::string Decode(const int32_t* ids, size_t n) {
  std::string out;
  for (size_t i = 0; i < n; ++i) {
    if (ids[i] >= 0 && ids[i] < 256)
      out.push_back(static_cast<char>(ids[i]));
    else if (ids[i] >= 256 && ids[i] < kVocab)
      out += kSpecialText[ids[i] - 256];
  }
  return out;
}

absl::Status Probe(std::string_view dir, int32_t* serves) {
  *serves = 0;
  std::ifstream in(std::string(dir) + "/config.json");
  if (!in) return absl::OkStatus();  // not ours (no config.json)
  std::stringstream buffer;
  buffer << in.rdbuf();
  auto config = nlohmann::json::parse(buffer.str(), nullptr, /*allow_exceptions=*/false);
  if (config.is_object() && config.value("model_type", "") == "coli_echo") *serves = 1;
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<EchoModel>> Open(const coli_model_open_args_t& args) {
  auto model = std::make_unique<EchoModel>();
  model->dir = std::string(View(args.model_dir));
  int32_t serves = 0;
  if (absl::Status s = Probe(model->dir, &serves); !s.ok()) return s;
  if (!serves) {
    return absl::InvalidArgumentError(absl::StrCat("'", model->dir, "' is not a coli_echo model"));
  }
  if (const coli_model_options_t* o = args.options) {
    if (o->max_context > 0) model->capacity = o->max_context;
    if (o->chunk > 0) model->chunk = o->chunk;
    for (size_t i = 0; i < o->n_extra; ++i) {
      std::string_view key = View(o->extra[i].key), value = View(o->extra[i].value);
      if (key == "delay_ms") {
        if (!absl::SimpleAtoi(absl::string_view(value.data(), value.size()), &model->delay_ms)) {
          return absl::InvalidArgumentError("option 'delay_ms' is not an integer");
        }
      } else if (key == "fail_feed" && value.size() == 1) {
        model->fail_feed = static_cast<unsigned char>(value[0]);
      } else if (key == "knob") {
        if (!absl::SimpleAtoi(absl::string_view(value.data(), value.size()), &model->knob) ||
            model->knob < 1 || model->knob > 9) {
          return absl::InvalidArgumentError("option 'knob' is not in 1…9");
        }
      } else if (key == "fail_open") {
        return absl::DataLossError(absl::StrCat("fail_open: ", std::string(value)));
      } else {
        return absl::InvalidArgumentError(absl::StrCat("unknown option '", std::string(key), "'"));
      }
    }
  }
  for (int s = 0; s < 4; ++s) {
    model->specials.push_back({coli::abi::Str(kSpecialText[s]), 256 + s, 0});
  }
  const uint64_t steps = 4;
  for (uint64_t i = 1; i <= steps; ++i) {
    if (args.progress != nullptr &&
        args.progress(args.progress_user, i, steps, "weights", 7) != 0) {
      return absl::CancelledError("load cancelled");
    }
  }
  Log(COLI_LOG_INFO, "echo: opened " + model->dir);
  return model;
}

absl::Status Info(EchoModel* m, coli_model_info_t* info) {
  if (info->struct_size < sizeof(coli_model_info_t)) {
    return absl::InvalidArgumentError("coli_model_info_t struct_size too small");
  }
  info->family = coli::abi::Str("coli_echo");
  info->name = coli::abi::Str("EchoForTests");
  info->vocab_size = kVocab;
  info->bos_id = kBos;
  info->eos_id = kEos;
  info->chat_capabilities = COLI_CHAT_CAP_TEMPLATE | COLI_CHAT_CAP_LOGPROBS;
  info->context_capacity = m->capacity;
  info->special_tokens = m->specials.data();
  info->n_special_tokens = m->specials.size();
  info->stop_ids = m->stop_ids;
  info->n_stop_ids = 1;
  return absl::OkStatus();
}

// Chat: "<user>" + each user message + "<assistant>"; the reply echoes the last user message.
absl::Status Render(const coli_chat_render_args_t* args, coli_chat_render_result_t* result) {
  auto request = nlohmann::json::parse(View(args->request_json), nullptr, false);
  if (!request.is_object() || !request.contains("messages") || !request["messages"].is_array()) {
    return absl::InvalidArgumentError("chat request: 'messages' must be an array");
  }
  std::vector<int32_t> ids;
  std::string text;
  for (const auto& message : request["messages"]) {
    if (!message.is_object() || !message.value("content", nlohmann::json()).is_string()) {
      return absl::InvalidArgumentError("chat request: each message needs string 'content'");
    }
    const std::string role = message.value("role", "");
    if (role != "user" && role != "assistant" && role != "system") {
      return absl::InvalidArgumentError(absl::StrCat("Unsupported role '", role, "'"));
    }
    const std::string content = message["content"].get<std::string>();
    ids.push_back(role == "assistant" ? kAssistant : kUser);
    text += role == "assistant" ? "<assistant>" : "<user>";
    auto body = Encode(content, false);
    ids.insert(ids.end(), body.begin(), body.end());
    text += content;
  }
  if (args->add_generation_prompt) {
    ids.push_back(kAssistant);
    text += "<assistant>";
  }
  FillTokens(&result->tokens, ids);
  FillBytes(&result->text, text);
  result->chat_parse_mode = 1;
  return absl::OkStatus();
}

absl::Status Prefill(EchoSession* s, const coli_prefill_args_t* a, coli_prefill_result_t* r) {
  if (a->n_tokens == 0) return absl::InvalidArgumentError("EMPTY_PROMPT");
  // ABI 1.4: the echo family enforces no response_format; it refuses one by name (quoting it, so
  // the ABI test sees what the host sent) instead of ignoring it.
  if (COLI_ABI_HAS_FIELD(a, coli_prefill_args_t, response_format) && a->response_format.size > 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("response_format: the echo family cannot enforce ",
                     std::string(a->response_format.data, a->response_format.size)));
  }
  if (static_cast<int64_t>(a->n_tokens) > s->capacity) {
    return absl::ResourceExhaustedError(
        absl::StrCat("CONTEXT_EXCEEDED prompt_tokens=", a->n_tokens, " capacity=", s->capacity));
  }
  std::vector<int32_t> tokens(a->tokens, a->tokens + a->n_tokens);
  for (int32_t id : tokens) {
    if (id < 0 || id >= kVocab) {
      return absl::InvalidArgumentError(absl::StrCat("token id ", id, " is out of range"));
    }
  }
  size_t keep = 0;
  if (s->record.size() < tokens.size() &&
      std::equal(s->record.begin(), s->record.end(), tokens.begin())) {
    keep = s->record.size();
  }
  s->record.resize(keep);
  // "Compute" the tail chunk by chunk; a cancel drops the partial state (record reset).
  const uint64_t tail = tokens.size() - keep;
  uint64_t done = 0;
  while (done < tail) {
    const uint64_t n = std::min<uint64_t>(s->model->chunk, tail - done);
    Sleep(s->model->delay_ms);
    s->record.insert(s->record.end(), tokens.begin() + keep + done,
                     tokens.begin() + keep + done + n);
    done += n;
    if (a->progress != nullptr && a->progress(a->progress_user, done, tail, "prefill", 7) != 0) {
      s->record.clear();
      s->pending = -1;
      return absl::CancelledError("prefill cancelled");
    }
  }
  s->prompt = tokens;
  s->history.Reset(tokens);
  s->echoed = 0;
  s->pending = -1;
  s->parse_mode = a->chat_parse_mode;
  s->rng.seed(a->seed);
  s->prompt_tokens += static_cast<double>(tokens.size());
  s->reused += static_cast<double>(keep);
  s->computed += static_cast<double>(tail);
  r->tokens_reused = keep;
  r->tokens_computed = tail;
  r->context_used = static_cast<int64_t>(s->record.size());
  r->context_capacity = s->capacity;
  return absl::OkStatus();
}

// The echo's logits: the next byte to echo (or <eos>) at 8, every other token at 0.
int32_t Target(const EchoSession* s) {
  // Echo the prompt's ordinary bytes, skipping specials.
  size_t seen = 0;
  for (int32_t id : s->prompt) {
    if (id >= 256) continue;
    if (seen == s->echoed) return id;
    ++seen;
  }
  return kEos;
}

absl::Status Step(EchoSession* s, coli_decode_row_t* row) {
  if (s->pending >= 0 && s->pending == s->model->fail_feed) {
    return absl::DataLossError(absl::StrCat("fail_feed: refusing to feed byte ", s->pending));
  }
  s->text.clear();
  s->top.clear();
  s->events.clear();
  s->event_text.clear();
  row->text = coli::abi::Str("");
  row->n_top_logprobs = 0;
  row->n_events = 0;
  row->finish = COLI_FINISH_NONE;
  Sleep(s->model->delay_ms);
  if (s->pending >= 0) {
    if (static_cast<int64_t>(s->record.size()) >= s->capacity) {
      row->token = -1;
      row->finish = COLI_FINISH_LENGTH;
      return absl::OkStatus();
    }
    s->record.push_back(s->pending);
    s->pending = -1;
  }
  const int32_t target = Target(s);
  const double hi = 8.0;
  const double log_z = std::log(std::exp(hi) + (kVocab - 1));
  int32_t token = target;
#if !defined(ECHO_ABI_MINOR)
  coli::sampling::SamplerOptions knobs;
  if (COLI_ABI_HAS_FIELD(row, coli_decode_row_t, n_logit_bias)) {
    knobs.repetition_penalty = row->repetition_penalty;
    knobs.frequency_penalty = row->frequency_penalty;
    knobs.presence_penalty = row->presence_penalty;
    knobs.min_p = row->min_p;
    for (size_t i = 0; i < row->n_logit_bias; ++i) {
      knobs.logit_bias.push_back({row->logit_bias[i].id, row->logit_bias[i].bias});
    }
  }
  if (absl::Status bad = coli::sampling::ValidatePenalties(knobs, kVocab); !bad.ok()) return bad;
  const bool use_knobs = coli::sampling::HasPenalties(knobs) || knobs.min_p > 0.0f;
#else
  const bool use_knobs = false;
#endif
  if (use_knobs) {
#if !defined(ECHO_ABI_MINOR)
    std::vector<float> logits(kVocab, 0.0f);
    logits[target] = static_cast<float>(hi);
    knobs.temperature = row->temperature;
    knobs.top_p = row->top_p;
    knobs.top_k = row->top_k;
    knobs.seed = s->rng();
    token = coli::sampling::Sampler(knobs).Next(logits, &s->history).id;
#endif
  } else if (row->temperature > 0) {
    // Softmax at the temperature over {target: hi, others: 0}.
    const double wt = std::exp(hi / row->temperature);
    const double p_target = wt / (wt + (kVocab - 1));
    std::uniform_real_distribution<double> u(0.0, 1.0);
    if (u(s->rng) >= p_target) {
      std::uniform_int_distribution<int32_t> other(0, kVocab - 2);
      token = other(s->rng);
      if (token >= target) ++token;
    }
  }
  row->token = token;
  row->logprob = static_cast<float>((token == target ? hi : 0.0) - log_z);
  if (row->logprobs_top_k > 0) {
    s->top.push_back({target, static_cast<float>(hi - log_z)});
    for (int32_t id = 0; static_cast<int32_t>(s->top.size()) < row->logprobs_top_k && id < kVocab;
         ++id) {
      if (id != target) s->top.push_back({id, static_cast<float>(-log_z)});
    }
    row->top_logprobs = s->top.data();
    row->n_top_logprobs = s->top.size();
  }
  s->generated += 1;
  s->history.AddOutput(token);
  if (token == kEos) {
    row->finish = COLI_FINISH_STOP;
  } else {
    s->pending = token;
    if (token == target) ++s->echoed;
    if (token < 256) s->text.push_back(static_cast<char>(token));
  }
  row->text = coli::abi::Str(s->text);
  if (s->parse_mode != 0) {
    auto e = coli::abi::Init<coli_chat_event_t>();
    e.channel = token == kEos ? COLI_CHANNEL_NONE : COLI_CHANNEL_CONTENT;
    e.end_of_message = token == kEos ? 1 : 0;
    e.text = coli::abi::Str(s->text);
    s->events.push_back(e);
    row->events = s->events.data();
    row->n_events = s->events.size();
  }
  return absl::OkStatus();
}

const char* const kStatNames[] = {"prompt_tokens", "tokens_reused", "tokens_computed",
                                  "tokens_generated"};

struct EchoFamily {
  using Model = EchoModel;
  using Session = EchoSession;
  static constexpr const char* kFamily = "coli_echo";
  static constexpr const char* kVersion = "test";
  static void Shutdown() { g_host = nullptr; }
  static absl::Status Probe(std::string_view dir, int32_t* serves) { return ::Probe(dir, serves); }
  static absl::StatusOr<std::unique_ptr<EchoModel>> Open(const coli_model_open_args_t& args) {
    return ::Open(args);
  }
  static absl::Status Info(EchoModel& m, coli_model_info_t* info) { return ::Info(&m, info); }
  static absl::StatusOr<std::vector<int32_t>> Tokenize(EchoModel&, std::string_view text,
                                                       bool allow_special) {
    return Encode(text, allow_special);
  }
  static absl::StatusOr<std::string> Detokenize(EchoModel&, std::span<const int32_t> ids) {
    return Decode(ids.data(), ids.size());
  }
  static absl::Status Render(EchoModel&, const coli_chat_render_args_t& args,
                             coli_chat_render_result_t* result) {
    return ::Render(&args, result);
  }
  static absl::StatusOr<std::unique_ptr<EchoSession>> NewSession(EchoModel& m,
                                                                 const coli_session_options_t* o) {
    auto session = std::make_unique<EchoSession>();
    session->model = &m;
    ++m.sessions_created;
    session->capacity =
        (o != nullptr && o->max_context > 0) ? std::min(o->max_context, m.capacity) : m.capacity;
    return session;
  }
  static absl::Status Reset(EchoSession& s) {
    EchoModel* model = s.model;
    const int64_t capacity = s.capacity;
    s = EchoSession();
    s.model = model;
    s.capacity = capacity;
    return absl::OkStatus();
  }
  static absl::Status Prefill(EchoSession& s, const coli_prefill_args_t& args,
                              coli_prefill_result_t* result) {
    return ::Prefill(&s, &args, result);
  }
  static absl::Status Step(EchoSession& s, coli_decode_row_t* row) { return ::Step(&s, row); }
  static std::vector<coli_stat_t> Stats(const EchoSession& s) {
    const double values[] = {s.prompt_tokens, s.reused, s.computed, s.generated};
    return coli::abi::NamedStats(kStatNames, values);
  }
  static std::span<const int32_t> Record(const EchoSession& s) { return s.record; }
  static std::vector<coli_stat_t> ModelStats(const EchoModel& m) {
    static const char* const kNames[] = {"sessions_created"};
    const double values[] = {static_cast<double>(m.sessions_created.load())};
    std::vector<coli_stat_t> stats = coli::abi::NamedStats(kNames, values);
    if (m.knob != 0) stats.push_back({"knob", static_cast<double>(m.knob)});
    return stats;
  }
#if !defined(ECHO_ABI_MINOR)
  static std::span<const coli_switch_t> Switches() {
    static constexpr coli_switch_t kSwitches[] = {
        coli::abi::ToExtra(
            coli::abi::IntSwitch("TEST_FAMILY_KNOB", COLI_SWITCH_FIELD_EXTRA, 1, 9,
                                 "coli_echo's test switch, reported as the model statistic knob"),
            "knob"),
        coli::abi::ToRequestDefault(
            coli::abi::TextSwitch("TEST_FAMILY_GREETING", COLI_SWITCH_FIELD_REQUEST,
                                  "coli_echo's request default (ABI 1.10), never rendered"),
            "echo_greeting")};
    return kSwitches;
  }
#endif
};

const coli_plugin_api_t kApi = [] {
  coli_plugin_api_t api = coli::abi::MakePluginTable<EchoFamily>();
#if defined(ECHO_ABI_MINOR) && ECHO_ABI_MINOR == 0
  api.struct_size = COLI_PLUGIN_API_SIZE_V1_0;  // a 1.0 table ends at session_stats
  api.session_record = nullptr;
  api.model_stats = nullptr;
#elif defined(ECHO_ABI_MINOR) && ECHO_ABI_MINOR == 1
  api.struct_size = COLI_PLUGIN_API_SIZE_V1_1;  // a 1.1 table ends at session_record
  api.model_stats = nullptr;
#elif defined(ECHO_ABI_MINOR) && ECHO_ABI_MINOR == 7
  api.struct_size = COLI_PLUGIN_API_SIZE_V1_7;  // a 1.7 table ends at session_reusable
#endif
  return api;
}();

}  // namespace

extern "C" COLI_PLUGIN_EXPORT const coli_plugin_api_t* coli_plugin_entry(
    const coli_host_api_t* host, coli_abi_version_t* version) {
  g_host = host;
  version->major = COLI_ABI_VERSION_MAJOR;
#if defined(ECHO_ABI_MINOR)
  version->minor = ECHO_ABI_MINOR;
#else
  version->minor = COLI_ABI_VERSION_MINOR;
#endif
  return &kApi;
}
