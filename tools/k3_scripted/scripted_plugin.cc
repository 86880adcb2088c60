// The "k3_scripted" test family: Kimi K3's real tokenizer, XTML renderer and output parser
// (plugins/kimi_k3/chat*) around a *scripted* model. It exists to prove the tool-call path of
// `coli serve` end to end (declare -> the model emits an XTML call -> the parser turns it into an
// OpenAI tool call -> the tool result is rendered back), which a model with random weights never
// does by chance. Nothing but the logits is fake: the prompt is rendered by RenderChat, the reply
// is a token sequence of the K3 vocabulary fed through OutputParser exactly as sampled tokens are.
//
// A model directory (made by tools/k3_scripted/k3_scripted.cmake) holds the tiny fixture's
// tiktoken.model + tokenizer_config.json, config.json {"model_type": "coli_k3_scripted"} and
// script.json:
//   {"rules": [{"when": "<substring of the rendered prompt>", "reply": "<text, specials by name>"}]}
// The first rule whose `when` occurs in the rendered prompt (the text with specials spelled out)
// gives the reply; its specials become the special ids, the text between them is BPE-encoded.
// After the reply the "model" emits <|end_of_msg|>. Every emitted token has logprob 0.
#include <algorithm>
#include <fstream>
#include <memory>
#include <span>
#include <sstream>
#include <string>
#include <vector>

#include "common/tokenizer/tokenizer.h"
#include "nlohmann/json.hpp"
#include "plugin_api/coli_plugin.h"
#include "plugin_api/cpp/abi_util.h"
#include "plugin_api/cpp/plugin_table.h"
#include "plugins/kimi_k3/chat.h"
#include "plugins/kimi_k3/chat_parser.h"

namespace {

using coli::abi::FillBytes;
using coli::abi::FillTokens;
using coli::abi::View;

// The host's ABI minor (coli_plugin_entry): 1.5+ hosts get tool-call deltas.
uint32_t g_host_minor = 0;

struct Rule {
  std::string when, reply;
};

struct ScriptedModel {
  std::string dir;
  std::unique_ptr<coli::tok::Tokenizer> tokenizer;
  std::vector<Rule> rules;
  std::vector<std::string> special_names;
  std::vector<coli_special_token_t> specials;
  int32_t stop_ids[1] = {0};
  int64_t capacity = 4096;
};

struct ScriptedSession {
  ScriptedModel* model = nullptr;
  std::vector<int32_t> record;
  std::vector<int32_t> reply;
  size_t next = 0;
  int32_t parse_mode = 0;
  std::unique_ptr<coli::k3::OutputParser> parser;
  std::unique_ptr<coli::tok::StreamDecoder> decoder;
  // outputs of the last step, valid until the next call
  std::string text;
  std::vector<coli_logprob_t> top;
  std::vector<coli::k3::ChatEvent> chat_events;
  std::vector<coli_chat_event_t> events;
  double prompt_tokens = 0, generated = 0;
};

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError("cannot read '" + path + "'");
  std::stringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

absl::Status Probe(std::string_view dir, int32_t* serves) {
  *serves = 0;
  absl::StatusOr<std::string> text = ReadFile(std::string(dir) + "/config.json");
  if (!text.ok()) return absl::OkStatus();
  auto config = nlohmann::json::parse(*text, nullptr, /*allow_exceptions=*/false);
  if (config.is_object() && config.value("model_type", "") == "coli_k3_scripted") *serves = 1;
  return absl::OkStatus();
}

// "a<|open|>b" -> ids of "a" (BPE), <|open|>, ids of "b".
std::vector<int32_t> EncodeScript(const coli::tok::Tokenizer& tok, std::string_view text,
                                  const std::vector<std::string>& specials) {
  std::vector<int32_t> ids;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t best = std::string_view::npos;
    const std::string* which = nullptr;
    for (const std::string& s : specials) {
      const size_t at = text.find(s, pos);
      if (at < best) {
        best = at;
        which = &s;
      }
    }
    const size_t end = best == std::string_view::npos ? text.size() : best;
    if (end > pos) {
      auto piece = tok.Encode(text.substr(pos, end - pos), /*allow_special=*/false);
      ids.insert(ids.end(), piece.begin(), piece.end());
    }
    if (which == nullptr) break;
    ids.push_back(*tok.TokenId(*which));
    pos = end + which->size();
  }
  return ids;
}

absl::StatusOr<std::unique_ptr<ScriptedModel>> Open(const coli_model_open_args_t& args) {
  auto model = std::make_unique<ScriptedModel>();
  model->dir = std::string(View(args.model_dir));
  auto tokenizer = coli::tok::Tokenizer::LoadDir(model->dir);
  if (!tokenizer.ok()) return tokenizer.status();
  model->tokenizer = std::move(*tokenizer);
  auto script_text = ReadFile(model->dir + "/script.json");
  if (!script_text.ok()) return script_text.status();
  auto script = nlohmann::json::parse(*script_text, nullptr, /*allow_exceptions=*/false);
  if (!script.is_object() || !script.contains("rules") || !script["rules"].is_array()) {
    return absl::InvalidArgumentError(model->dir + "/script.json: needs {\"rules\": [...]}");
  }
  for (const auto& r : script["rules"]) {
    if (!r.is_object() || !r.value("when", nlohmann::json()).is_string() ||
        !r.value("reply", nlohmann::json()).is_string()) {
      return absl::InvalidArgumentError(model->dir +
                                        "/script.json: each rule needs string when/reply");
    }
    model->rules.push_back({r["when"].get<std::string>(), r["reply"].get<std::string>()});
  }
  for (int32_t id = model->tokenizer->num_base_tokens(); id < model->tokenizer->vocab_size();
       ++id) {
    model->special_names.emplace_back(model->tokenizer->TokenBytes(id));
  }
  for (int32_t id = model->tokenizer->num_base_tokens(); id < model->tokenizer->vocab_size();
       ++id) {
    const std::string& name = model->special_names[id - model->tokenizer->num_base_tokens()];
    model->specials.push_back({coli::abi::Str(name), id, 0});
  }
  auto eom = model->tokenizer->TokenId(coli::k3::kEndOfMsgToken);
  if (!eom) return absl::InvalidArgumentError("tokenizer has no <|end_of_msg|>");
  model->stop_ids[0] = *eom;
  if (args.options != nullptr && args.options->max_context > 0) {
    model->capacity = args.options->max_context;
  }
  return model;
}

absl::Status Info(ScriptedModel* m, coli_model_info_t* info) {
  if (info->struct_size < sizeof(coli_model_info_t)) {
    return absl::InvalidArgumentError("coli_model_info_t struct_size too small");
  }
  info->family = coli::abi::Str("k3_scripted");
  info->name = coli::abi::Str("KimiK3ScriptedForTests");
  info->vocab_size = m->tokenizer->vocab_size();
  info->bos_id = m->tokenizer->TokenId(coli::k3::kBosToken).value_or(-1);
  info->eos_id = m->stop_ids[0];
  info->chat_capabilities = COLI_CHAT_CAP_TEMPLATE | COLI_CHAT_CAP_THINKING | COLI_CHAT_CAP_TOOLS |
                            COLI_CHAT_CAP_LOGPROBS;
  info->context_capacity = m->capacity;
  info->special_tokens = m->specials.data();
  info->n_special_tokens = m->specials.size();
  info->stop_ids = m->stop_ids;
  info->n_stop_ids = 1;
  return absl::OkStatus();
}

absl::Status Render(ScriptedModel* m, const coli_chat_render_args_t* args,
                    coli_chat_render_result_t* result) {
  auto request = coli::k3::ParseRequestBody(View(args->request_json));
  if (!request.ok()) return request.status();
  coli::k3::RenderOptions options;
  options.add_generation_prompt = args->add_generation_prompt != 0;
  auto rendered = coli::k3::RenderChat(*request, *m->tokenizer, options);
  if (!rendered.ok()) return rendered.status();
  FillTokens(&result->tokens, rendered->ids);
  FillBytes(&result->text, rendered->text);
  result->chat_parse_mode = coli::k3::ParseModeFor(*rendered);
  return absl::OkStatus();
}

absl::Status Prefill(ScriptedSession* s, const coli_prefill_args_t* a, coli_prefill_result_t* r) {
  if (a->n_tokens == 0) return absl::InvalidArgumentError("EMPTY_PROMPT");
  // ABI 1.4: scripted replies cannot follow a response_format; refuse one instead of ignoring it.
  // The exception is the host's tool_choice "auto" / "none" extension without a response_format
  // (every request with tools carries one): the script's replies are fixed, not sampled.
  bool auto_tools = false;
  if (COLI_ABI_HAS_FIELD(a, coli_prefill_args_t, response_format) && a->response_format.size > 0) {
    const nlohmann::json f = nlohmann::json::parse(View(a->response_format), nullptr, false);
    auto_tools = f.is_object() && f.value("type", nlohmann::json()) == "coli_tool_calls" &&
                 (f.value("mode", nlohmann::json()) == "auto" ||
                  f.value("mode", nlohmann::json()) == "none") &&
                 !f.contains("response_format");
  }
  if (COLI_ABI_HAS_FIELD(a, coli_prefill_args_t, response_format) && a->response_format.size > 0 &&
      !auto_tools) {
    return absl::InvalidArgumentError(
        "response_format: the scripted K3 test family does not enforce one");
  }
  if (static_cast<int64_t>(a->n_tokens) > s->model->capacity) {
    return absl::ResourceExhaustedError("CONTEXT_EXCEEDED prompt_tokens=" +
                                        std::to_string(a->n_tokens) +
                                        " capacity=" + std::to_string(s->model->capacity));
  }
  const coli::tok::Tokenizer& tok = *s->model->tokenizer;
  std::vector<int32_t> tokens(a->tokens, a->tokens + a->n_tokens);
  auto text = tok.Decode(tokens);
  if (!text.ok()) return text.status();
  std::string reply;
  for (const Rule& rule : s->model->rules) {
    if (text->find(rule.when) != std::string::npos) {
      reply = rule.reply;
      break;
    }
  }
  s->reply = EncodeScript(tok, reply, s->model->special_names);
  s->next = 0;
  s->record = tokens;
  s->parse_mode = a->chat_parse_mode;
  s->parser.reset();
  if (a->chat_parse_mode != 0) {
    auto parser = coli::k3::OutputParser::Create(tok, a->chat_parse_mode);
    if (!parser.ok()) return parser.status();
    s->parser = std::make_unique<coli::k3::OutputParser>(std::move(*parser));
    s->parser->set_tool_call_deltas(g_host_minor >= 5);  // ABI 1.5: COLI_CHANNEL_TOOL_CALL_DELTA
  }
  s->decoder = std::make_unique<coli::tok::StreamDecoder>(tok);
  s->prompt_tokens += static_cast<double>(tokens.size());
  r->tokens_reused = 0;
  r->tokens_computed = tokens.size();
  r->context_used = static_cast<int64_t>(tokens.size());
  r->context_capacity = s->model->capacity;
  return absl::OkStatus();
}

absl::Status Step(ScriptedSession* s, coli_decode_row_t* row) {
  const coli::tok::Tokenizer& tok = *s->model->tokenizer;
  s->text.clear();
  s->top.clear();
  s->chat_events.clear();
  s->events.clear();
  row->n_top_logprobs = 0;
  row->n_events = 0;
  row->finish = COLI_FINISH_NONE;
  if (static_cast<int64_t>(s->record.size()) >= s->model->capacity) {
    row->token = -1;
    row->finish = COLI_FINISH_LENGTH;
    row->text = coli::abi::Str("");
    return absl::OkStatus();
  }
  const int32_t token = s->next < s->reply.size() ? s->reply[s->next++] : s->model->stop_ids[0];
  s->record.push_back(token);
  s->generated += 1;
  row->token = token;
  row->logprob = 0.0f;
  if (row->logprobs_top_k > 0) {
    s->top.push_back({token, 0.0f});
    row->top_logprobs = s->top.data();
    row->n_top_logprobs = s->top.size();
  }
  if (token == s->model->stop_ids[0]) row->finish = COLI_FINISH_STOP;
  if (!tok.IsSpecial(token)) s->text = s->decoder->Push(token);
  row->text = coli::abi::Str(s->text);
  if (s->parser != nullptr) {
    s->chat_events = s->parser->Feed(token);
    if (row->finish != COLI_FINISH_NONE) {
      for (auto& e : s->parser->Finish()) s->chat_events.push_back(std::move(e));
    }
    for (const coli::k3::ChatEvent& e : s->chat_events) {
      auto out = coli::abi::Init<coli_chat_event_t>();
      out.channel = static_cast<int32_t>(e.channel);
      out.end_of_message = e.end_of_message ? 1 : 0;
      out.text = coli::abi::Str(e.text);
      s->events.push_back(out);
    }
    row->events = s->events.data();
    row->n_events = s->events.size();
  }
  return absl::OkStatus();
}

const char* const kStatNames[] = {"prompt_tokens", "tokens_generated"};

struct ScriptedFamily {
  using Model = ScriptedModel;
  using Session = ScriptedSession;
  static constexpr const char* kFamily = "k3_scripted";
  static constexpr const char* kVersion = "test";
  static absl::Status Probe(std::string_view dir, int32_t* serves) { return ::Probe(dir, serves); }
  static absl::StatusOr<std::unique_ptr<ScriptedModel>> Open(const coli_model_open_args_t& args) {
    return ::Open(args);
  }
  static absl::Status Info(ScriptedModel& m, coli_model_info_t* info) { return ::Info(&m, info); }
  static absl::StatusOr<std::vector<int32_t>> Tokenize(ScriptedModel& m, std::string_view text,
                                                       bool allow_special) {
    return m.tokenizer->Encode(text, allow_special);
  }
  static absl::StatusOr<std::string> Detokenize(ScriptedModel& m, std::span<const int32_t> ids) {
    return m.tokenizer->Decode(ids);
  }
  static absl::Status Render(ScriptedModel& m, const coli_chat_render_args_t& args,
                             coli_chat_render_result_t* result) {
    return ::Render(&m, &args, result);
  }
  static absl::StatusOr<std::unique_ptr<ScriptedSession>> NewSession(
      ScriptedModel& m, const coli_session_options_t*) {
    auto session = std::make_unique<ScriptedSession>();
    session->model = &m;
    return session;
  }
  static absl::Status Reset(ScriptedSession& s) {
    s.record.clear();
    s.reply.clear();
    s.next = 0;
    s.parser.reset();
    return absl::OkStatus();
  }
  static absl::Status Prefill(ScriptedSession& s, const coli_prefill_args_t& args,
                              coli_prefill_result_t* result) {
    return ::Prefill(&s, &args, result);
  }
  static absl::Status Step(ScriptedSession& s, coli_decode_row_t* row) { return ::Step(&s, row); }
  static std::vector<coli_stat_t> Stats(const ScriptedSession& s) {
    const double values[] = {s.prompt_tokens, s.generated};
    return coli::abi::NamedStats(kStatNames, values);
  }
  static std::span<const int32_t> Record(const ScriptedSession& s) { return s.record; }
};

const coli_plugin_api_t kApi = coli::abi::MakePluginTable<ScriptedFamily>();

}  // namespace

extern "C" COLI_PLUGIN_EXPORT const coli_plugin_api_t* coli_plugin_entry(
    const coli_host_api_t*, coli_abi_version_t* version) {
  g_host_minor = version->minor;
  version->major = COLI_ABI_VERSION_MAJOR;
  version->minor = COLI_ABI_VERSION_MINOR;
  return &kApi;
}
