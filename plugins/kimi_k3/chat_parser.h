// plugins/kimi_k3/chat_parser: splits what Kimi K3 generates after an XTML generation prompt into
// reasoning, answer and tool calls (spec §6.3).
//
//   COLI_ASSIGN_OR_RETURN(OutputParser parser,
//                         OutputParser::Create(tokenizer, ParseModeFor(rendered_chat)));
//   for each sampled id:
//     for (const ChatEvent& e : parser.Feed(id)) ...   // reasoning / content deltas, tool calls
//     if (parser.ended()) break;                       // <|end_of_msg|> arrived
//   for (const ChatEvent& e : parser.Finish()) ...     // held-back bytes; think-skip fallback
//
// Only markers generated as special tokens are structure: an ordinary token whose bytes spell
// `<|open|>` is text. A structural run (`<|open|>` tag attrs `<|sep|>`, `<|close|>` tag `<|sep|>`)
// never reaches the visible text. A tool call is reported once, when its `<|close|>call<|sep|>`
// arrives, as {"name": ..., "arguments": {...}} with the arguments rebuilt from the typed
// `argument` elements (or, for a raw `json` block, {"name": ..., "arguments": "<raw text>"}).
// With tool-call deltas on (set_tool_call_deltas, for a host of ABI 1.5+), a call also streams
// as it is generated: kToolCallDelta events {"index": k, "name": "f" (first delta only),
// "arguments": "<next piece>"}, the first one when the call opens. A raw `json` block streams its
// bytes as generated; typed `argument` elements stream the arguments object's serialisation
// (keys, separators and string values piece by piece; other types whole when their element
// closes). The concatenation of a call's "arguments" pieces equals, byte for byte, the complete
// call's "arguments" serialised as compact JSON (ordered_json dump, ensure_ascii off, invalid
// UTF-8 replaced) — or its "arguments" text when that is a string, as the complete event then
// carries the streamed text itself whenever the object would serialise otherwise (a raw block
// that is not compact JSON, a repeated key). Pieces never split a UTF-8 character.
// A model that skips the think channel still yields its answer as content: text after
// `<|close|>think<|sep|>` without a response opener is content, a response opener closes the think
// channel implicitly, and a message that ends (`<|end_of_msg|>`) while still in the think channel,
// having produced neither a response nor a call, has its reasoning re-reported as content.
// Deltas never split a UTF-8 character.
#ifndef COLI_PLUGINS_KIMI_K3_CHAT_PARSER_H_
#define COLI_PLUGINS_KIMI_K3_CHAT_PARSER_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "common/tokenizer/tokenizer.h"
#include "plugins/kimi_k3/chat.h"

namespace coli::k3 {

// Numerically the plugin ABI's COLI_CHANNEL_* values.
enum class ChatChannel : int32_t {
  kNone = 0,
  kReasoning = 1,
  kContent = 2,
  kToolCall = 3,
  kToolCallDelta = 4,  // a piece of the call being generated (ABI 1.5, see above)
};

struct ChatEvent {
  ChatChannel channel = ChatChannel::kNone;
  // A delta; for kToolCall one whole call as JSON; for kToolCallDelta {"index", "name"?,
  // "arguments"} as JSON.
  std::string text;
  bool end_of_message = false;  // the model's <|end_of_msg|>
  // kContent only: this text was already reported as reasoning (the think-skip fallback).
  bool moved_from_reasoning = false;
};

// Where generation starts: the parser mode a render produced (never 0, as the ABI wants).
enum ParseMode : int32_t {
  kParseInThink = 1,     // the prompt ended with <|open|>think<|sep|>
  kParseInResponse = 2,  // the prompt ended with <|open|>response<|sep|>
  kParseOutside = 3,     // no generation prompt
};
int32_t ParseModeFor(const RenderedChat& chat);

struct StructuralIds {
  int32_t open = -1, close = -1, sep = -1, end_of_msg = -1;
};
// The four XTML ids; INVALID_ARGUMENT naming the missing token.
absl::StatusOr<StructuralIds> FindStructuralIds(const tok::Tokenizer& tokenizer);

class OutputParser {
 public:
  // `mode` is a ParseMode (INVALID_ARGUMENT otherwise). The tokenizer must outlive the parser.
  static absl::StatusOr<OutputParser> Create(const tok::Tokenizer& tokenizer, int32_t mode);
  // Without a tokenizer: the caller passes each token's bytes and whether it is special.
  OutputParser(StructuralIds ids, ParseMode mode);

  // One generated token (bytes looked up in the tokenizer given to Create).
  std::vector<ChatEvent> Feed(int32_t id);
  // One generated token with its raw bytes; `special` = the tokenizer's IsSpecial(id).
  std::vector<ChatEvent> Feed(int32_t id, std::string_view bytes, bool special);
  // Generation stopped (any reason): flushes held-back bytes and applies the think-skip fallback.
  std::vector<ChatEvent> Finish();

  // Off by default (the ABI 1.0-1.4 behaviour: a call arrives whole). Set before the first Feed.
  void set_tool_call_deltas(bool on) { deltas_ = on; }

  bool ended() const { return ended_; }
  int tool_calls() const { return tool_calls_; }

 private:
  enum class State {
    kThink, kAfterThink, kResponse, kAfterResponse, kTools, kCall, kArgument, kJson, kOutside,
    kDone,
  };
  std::vector<ChatEvent> FeedToken(int32_t id, std::string_view bytes, bool special);
  void OnTag(bool close, std::string_view tag, std::vector<ChatEvent>* out);
  void OnText(std::string_view bytes, std::vector<ChatEvent>* out);
  void Emit(ChatChannel channel, std::string* pending, bool flush, std::vector<ChatEvent>* out);
  void FlushAll(std::vector<ChatEvent>* out);
  // Tool-call deltas: `piece` joins the call's next delta (flushed at the end of each Feed and
  // before the complete call); StreamText sends the complete-UTF-8 prefix of *pending (all of
  // it when `flush`), invalid bytes as U+FFFD, JSON-escaped when `escape`, and returns it.
  void AppendDelta(std::string_view piece);
  std::string StreamText(std::string* pending, bool flush, bool escape);
  void FlushDelta(std::vector<ChatEvent>* out);

  const tok::Tokenizer* tokenizer_ = nullptr;
  StructuralIds ids_;
  State state_;
  bool ended_ = false;
  // Structural run in progress: after <|open|> / <|close|>, until <|sep|>.
  bool in_run_ = false;
  bool run_close_ = false;
  std::string run_text_;
  // Held-back bytes of an incomplete UTF-8 character, per visible channel.
  std::string pending_reasoning_, pending_content_;
  std::string reasoning_all_;  // for the think-skip fallback
  bool saw_response_ = false;
  bool think_closed_ = false;
  // The call being assembled.
  std::string call_name_;
  Json call_args_ = Json::object();
  std::string arg_key_, arg_type_, arg_value_, json_block_;
  bool call_has_json_ = false;
  int tool_calls_ = 0;
  // Delta streaming of the open call: what its first child element made it, the bytes held back
  // (an incomplete character), the pieces sent so far and the next delta's.
  enum class CallKind { kEmpty, kTyped, kJson };
  bool deltas_ = false;
  CallKind call_kind_ = CallKind::kEmpty;
  bool arg_streams_ = false;  // the open argument is a string streamed piece by piece
  std::string stream_pending_, streamed_, delta_args_;
  bool delta_first_ = false;
};

}  // namespace coli::k3

#endif  // COLI_PLUGINS_KIMI_K3_CHAT_PARSER_H_
