// tools/coli/serve_openai: the OpenAI-API half of `coli serve`, without networking — request
// validation, the error shape, host-status mapping, stop sequences and response JSON.
//
//   ApiError error;
//   std::optional<ChatParams> params = ParseChatParams(body, &error);
//   if (!params) reply(error.http_status, ErrorBody(error));
//
// Every refusal names the offending field in `param` and uses OpenAI's error object:
//   {"error": {"message": "...", "type": "invalid_request_error", "param": "n", "code": null}}
#ifndef COLI_TOOLS_COLI_SERVE_OPENAI_H_
#define COLI_TOOLS_COLI_SERVE_OPENAI_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "coli/v1/coli.pb.h"
#include "grpcpp/support/status.h"
#include "nlohmann/json.hpp"

namespace coli::cli::serve {

using Json = nlohmann::ordered_json;

// The most logit_bias entries a request may carry (the same limit as common/sampling's).
inline constexpr int kMaxLogitBias = 1024;

struct ApiError {
  int http_status = 400;
  std::string message;
  std::string type = "invalid_request_error";
  std::string param;  // "" -> null
  std::string code;   // "" -> null
};

ApiError BadField(std::string param, std::string message);
std::string ErrorBody(const ApiError& error);

// A host gRPC status as an API error: INVALID_ARGUMENT -> 400 naming the field the host's
// message starts with; CONTEXT_EXCEEDED -> 400 context_length_exceeded; queue full -> 429;
// NOT_FOUND -> 404 model_not_found; UNAVAILABLE -> 503; others 500.
ApiError FromHostStatus(const grpc::Status& status);
// The same for /v1/completions, whose request has a prompt where chat has messages.
ApiError CompletionsError(ApiError error);

// Generation parameters shared by /v1/chat/completions and /v1/completions.
struct SamplingFields {
  std::string model;  // "" = the loaded model
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  // vLLM's stream_options.continuous_usage_stats (with include_usage): every chunk carries the
  // usage so far (its choice's completion tokens).
  bool continuous_usage = false;
  int32_t max_tokens = 0;      // 0 = up to the context
  float temperature = 1.0f;
  float top_p = 1.0f;
  int32_t top_k = 0;  // vLLM extension: 0 (or vLLM's -1) = off
  uint64_t seed = 0;
  bool has_seed = false;
  std::vector<std::string> stop;  // <= 4, removed from the output
  int n = 1;
  int top_logprobs = -1;  // -1 = no logprobs; 0..20 with logprobs on
  // The OpenAI / vLLM knobs (docs/status/sampling.md), neutral by default. repetition_penalty
  // and min_p are vLLM extensions (the openai SDK sends them through extra_body).
  float frequency_penalty = 0.0f;   // [-2, 2]
  float presence_penalty = 0.0f;    // [-2, 2]
  float repetition_penalty = 1.0f;  // > 0
  float min_p = 0.0f;               // [0, 1]
  // logit_bias: {"token id": bias in [-100, 100]}, at most kMaxLogitBias entries; the ids are
  // checked against the model's vocabulary by the host (400 naming the key).
  std::vector<std::pair<int32_t, float>> logit_bias;
  // vLLM's extensions: min_tokens (the stop tokens are not drawn before that many tokens),
  // stop_token_ids (more tokens that end the reply), ignore_eos (the model's stop tokens are
  // never drawn), include_stop_str_in_output (a matched stop string stays in the text).
  // The response_format to enforce that the body's own `response_format` field does not carry
  // (compact JSON; "" = none): vLLM's guided_json / structured_outputs.json in chat, and any of
  // the three in /v1/completions (whose request has no chat body for the model to read).
  std::string response_format;
  // vLLM's truncate_prompt_tokens: the prompt's last this many tokens only (-1: as many as the
  // context holds; 0: all).
  int32_t truncate_prompt_tokens = 0;
  int32_t min_tokens = 0;
  std::vector<int32_t> stop_token_ids;
  bool ignore_eos = false;
  bool include_stop_str = false;
  // llama.cpp's opt-in `return_progress`: stream chunks carrying `prompt_progress` while the
  // prompt is read (stream only; without it the stream is plain OpenAI).
  bool return_progress = false;
  // /v1/completions: added (special / reserved) tokens are left out of the text, as vLLM's
  // default skip_special_tokens does; false keeps their names. (Chat output never shows them.)
  bool skip_special_tokens = true;
  // /v1/completions `echo`: each choice begins with its prompt (and, with logprobs, the prompt
  // tokens' logprobs, the first null); with max_tokens 0 nothing is generated (prompt_only).
  bool echo = false;
  bool prompt_only = false;
  // vLLM's `prompt_logprobs`: every prompt token's logprob given the tokens before it, with this
  // many most likely alternatives (0..20; -1 = not asked). Not with stream (a 400 above 0, as
  // vLLM's).
  int prompt_logprobs = -1;
};

// One /v1/completions prompt: text, or token ids (`prompt` as [int] or [[int], ...]).
struct CompletionPrompt {
  std::string text;
  std::vector<int32_t> ids;
  bool is_ids = false;
};

// Validates and reads the chat-completions fields the gateway handles itself (the chat fields —
// messages, tools, tool_choice, response_format, reasoning_effort, enable_thinking,
// chat_template_kwargs — are type-checked here and rendered by the model family).
std::optional<SamplingFields> ParseChatParams(const Json& body, ApiError* error);
// The legacy completions fields. `prompt` is a string, an array of strings, an array of token
// ids or an array of such arrays (OpenAI's four forms; several prompts give n choices each);
// token ids are checked against `vocab_size`.
std::optional<SamplingFields> ParseCompletionParams(const Json& body, int32_t vocab_size,
                                                    std::vector<CompletionPrompt>* prompts,
                                                    ApiError* error);

// Holds back text that could be the start of a stop sequence and cuts at the first match.
//
//   StopFilter f({"\n\n"});
//   out += f.Push("Hello\n");   // "Hello" (the "\n" may start "\n\n")
//   out += f.Push("\nmore");    // "" and f.stopped() is true
class StopFilter {
 public:
  // `include_match` (vLLM's include_stop_str_in_output): the matched sequence stays in the text.
  explicit StopFilter(std::vector<std::string> stops, bool include_match = false)
      : stops_(std::move(stops)), include_match_(include_match) {}
  // Returns the text that is safe to show; after a match returns "" forever.
  std::string Push(std::string_view text);
  // End of generation: the held-back tail (no stop can complete any more).
  std::string Flush();
  bool stopped() const { return stopped_; }
  // The stop sequence that matched ("" before one did; the earliest in the text, the first
  // listed of those matching there).
  const std::string& matched() const { return matched_; }

 private:
  std::vector<std::string> stops_;
  bool include_match_ = false;
  std::string held_;
  bool stopped_ = false;
  std::string matched_;
};

// vLLM's prompt_logprobs list from the host's PromptLogprobs entries (a prompt's positions 1..n-1,
// each the prompt token and the host's most likely alternatives, descending): null for the first
// prompt token (nothing precedes it), then per position {"<id>": {"logprob", "rank",
// "decoded_token"}}, the prompt token first, then the `top` most likely with ranks 1..top; a
// prompt token among those keeps its first place and takes its rank there, as vLLM's dict
// overwrite does. The prompt token's own rank is vLLM's count of tokens whose logprob is at least
// its own (itself included, so ties count): the plugin's (TokenLogprob.rank, ABI 1.9), else
// counted from the alternatives when one is less likely than it or they cover the whole
// vocabulary of `vocab_size` tokens, else null.
// decoded_token is the token's bytes with U+FFFD for a partial character.
Json VllmPromptLogprobs(const std::vector<v1::TokenLogprobs>& entries, int top, int64_t vocab_size);

// One generation's accumulated result (one choice).
struct ChoiceResult {
  std::string reasoning, content;
  Json tool_calls = Json::array();
  Json logprobs = Json::array();
  std::string finish_reason;
  int64_t prompt_tokens = 0, completion_tokens = 0;
  // The tokens through the last one that carried reasoning text (the tags closing the think
  // block count as output), and the prompt tokens the host reused (/v1/responses' usage).
  int64_t reasoning_tokens = 0, cached_tokens = 0;
  std::vector<v1::TokenLogprobs> prompt_entries;  // asked prompt_logprobs, positions 1…
  std::string stop_sequence;  // the stop sequence that ended the reply ("" for another end)
  bool context_full = false;  // the reply ended because the context was full (finish "length")
};

// "chatcmpl-<24 hex>" style ids.
std::string NewId(std::string_view prefix);

// Prometheus text format helpers. A label value escaped as the format requires (\\, \", \n).
std::string LabelValue(std::string_view value);
void AppendMetric(std::string* out, std::string_view name, std::string_view type,
                  std::string_view help, double value, std::string_view labels = "");

}  // namespace coli::cli::serve

#endif  // COLI_TOOLS_COLI_SERVE_OPENAI_H_
