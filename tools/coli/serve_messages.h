// tools/coli/serve_messages: Anthropic's Messages API (POST /v1/messages and
// /v1/messages/count_tokens) over the chat path, as llama.cpp's and vLLM's servers offer it, so
// programs written for Claude's API (the anthropic SDKs, coding agents that speak only it) use
// the local model. The request maps onto a chat-completions body; the chat path's deltas
// (Gateway::RunChoice) become content blocks — thinking, text, tool_use — and, streamed,
// Anthropic's events (message_start, content_block_start / _delta / _stop, message_delta,
// message_stop).
//
//   std::optional<MessagesRequest> r = ParseMessagesRequest(body, &error);   // 400 on error
//   MessageStream s(id, model, send);   s.Start(input_tokens, cached);
//   RunChoice(r->fields, call, &out, first, [&](kind, payload) { return s.Delta(kind, payload); });
//   s.Finish(out);                      // or, not streamed: MessageFromResult(id, model, out)
#ifndef COLI_TOOLS_COLI_SERVE_MESSAGES_H_
#define COLI_TOOLS_COLI_SERVE_MESSAGES_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>

#include "tools/coli/serve_openai.h"

namespace coli::cli::serve {

struct MessagesRequest {
  Json chat;              // the equivalent /v1/chat/completions body
  SamplingFields fields;  // ParseChatParams(chat), stop set from stop_sequences (no limit of 4)
};

// Validates `body` (a POST /v1/messages object) and maps it: `system` to a system message,
// text blocks to text, `thinking` blocks to the assistant's reasoning_content, `tool_use` blocks
// to tool_calls (input as JSON arguments), `tool_result` blocks to tool messages; `tools`
// ({name, description, input_schema}) to functions; `tool_choice` auto / any / tool / none to
// "auto" / "required" / the named function / "none" (disable_parallel_tool_use: one call);
// `thinking` {type: enabled} / {type: disabled} to enable_thinking — absent is off, as in
// Anthropic's API; max_tokens (required), stop_sequences, temperature [0, 1], top_p, top_k.
// Images, documents and Anthropic's server tools are refused (a text-only engine, no tools run). On
// failure *error names the field. `count_only` (/v1/messages/count_tokens): max_tokens is neither
// required nor read. A last assistant message is a prefill the reply continues
// (continue_final_message; not with thinking, trailing white space or tool_use, as in Anthropic's
// API).
std::optional<MessagesRequest> ParseMessagesRequest(const Json& body, bool count_only,
                                                    ApiError* error);

// Anthropic's error body: {"type": "error", "error": {"type": …, "message": …}} with the type
// Anthropic gives the HTTP status (400 invalid_request_error, 401 authentication_error, 404
// not_found_error, 413 request_too_large, 429 rate_limit_error, 503 overloaded_error, else
// api_error).
Json AnthropicError(const ApiError& error);
// The same for an OpenAI-shaped error body the gateway's shared checks wrote (the body as it
// is when it is not one).
std::string AnthropicErrorBody(int http_status, const std::string& openai_body);

// stop_reason (end_turn, max_tokens, model_context_window_exceeded, stop_sequence, tool_use) and
// stop_sequence (the matched
// string or null) of a finished choice.
Json StopReason(const ChoiceResult& r);
Json StopSequence(const ChoiceResult& r);
// A tool call's id as Anthropic writes it ("toolu_…" for the gateway's "call_…").
std::string ToolUseId(const Json& call);
// usage: input_tokens (the prompt's tokens not read from the host's cache),
// cache_read_input_tokens, cache_creation_input_tokens (0), output_tokens.
Json MessageUsage(int64_t prompt_tokens, int64_t cached_tokens, int64_t output_tokens);

// The whole message of a finished, not streamed, choice.
Json MessageFromResult(const std::string& id, const std::string& model, ChoiceResult r);

// The events of a streamed message, sent through `send` (each an object with "type"); every
// method returns false once the client is gone.
class MessageStream {
 public:
  using Sender = std::function<bool(const Json& event)>;
  MessageStream(std::string id, std::string model, Sender send)
      : id_(std::move(id)), model_(std::move(model)), send_(std::move(send)) {}
  // message_start (its usage from the host's Started event) and a ping.
  bool Start(int64_t prompt_tokens, int64_t cached_tokens);
  // One delta of the chat path (Gateway::RunChoice's kinds): "reasoning" / "content" text,
  // "tool_call" (a whole call), "tool_call_delta" pieces and "tool_call_done"; the others
  // ("tick", "progress", "logprob") only check that the client is there.
  bool Delta(const char* kind, const Json& payload);
  // Closes the open block, then message_delta (stop_reason, usage) and message_stop.
  bool Finish(const ChoiceResult& r);
  // An error after the stream began: Anthropic's `error` event.
  bool Fail(const ApiError& e);

 private:
  enum class Block { kNone, kThinking, kText, kToolUse };
  bool Open(Block block, Json content_block);
  bool Close();
  bool Send(Json event) { return send_(event); }
  bool BlockDelta(Json delta);  // a content_block_delta of the open block

  std::string id_, model_;
  Sender send_;
  Block open_ = Block::kNone;
  int index_ = -1;           // the open (or last) block's index
  int streaming_call_ = -1;  // the chat path's index of the tool call being streamed
};

}  // namespace coli::cli::serve

#endif  // COLI_TOOLS_COLI_SERVE_MESSAGES_H_
