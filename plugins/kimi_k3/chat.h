// plugins/kimi_k3/chat: Kimi K3's XTML chat format — rendering an OpenAI chat-completions request
// into the exact token ids the model reads (spec §6.1, §6.2, §6.5).
//
//   COLI_ASSIGN_OR_RETURN(Json request, ParseRequestBody(body));
//   COLI_ASSIGN_OR_RETURN(RenderedChat chat, RenderChat(request, tokenizer, {}));
//   // chat.ids: the prompt; chat.text: the same with specials spelled "<|open|>" …;
//   // chat.thinking: whether the generation prompt opened the think channel.
//
// The renderer is a segment builder: every structural marker (`<|open|>`, `<|close|>`, `<|sep|>`,
// `<|end_of_msg|>`) is its own special segment and every other piece — tag names, each attribute
// as the four pieces ` key`, `="`, escaped value, `"`, bodies — its own text segment. Each segment
// is encoded separately (BPE never merges across a boundary) and text segments are encoded with
// special-token matching off (§5.4), so user text spelling `<|open|>` stays ordinary bytes.
//
// Request fields read (everything else is ignored here; the gateway validates the rest):
//   messages            system / user / assistant / tool; `developer` is rendered as `system`
//                       (the vendor renderer silently drops it; we keep the instruction).
//                       Any other role is INVALID_ARGUMENT.
//   tools               declared in a `tool-declare` system message, key-sorted compact JSON.
//   tool_choice         "required" / "none" add the vendor's tool-choice message; "auto" and an
//                       object naming one function add nothing (vendor behaviour).
//   response_format     json_object / json_schema / text (a bare "json_object" string too).
//   enable_thinking, reasoning_effort ("none" turns thinking off; otherwise the effort),
//   chat_template_kwargs {thinking, enable_thinking, thinking_effort, add_generation_prompt};
//                       any other key is INVALID_ARGUMENT.
//   continue_final_message  (vLLM's name; seed §8.3's `C` record) the last message, an
//                       assistant's, is left open for the model to continue — no close, no
//                       end_of_msg, no generation prompt: with text, its think pair closed and the
//                       response open with the text; with none yet, the think block open with
//                       its reasoning (thinking on). Refused with tool calls in that message,
//                       with add_generation_prompt set true, and with what renders a message
//                       after it (tool_choice none / required / a named function,
//                       response_format json_*).
// Defaults follow the vendor's apply_chat_template: thinking on, thinking_effort = max (so the
// thinking-effort system message is present), generation prompt on, no BOS.
// Errors are INVALID_ARGUMENT whose message starts with the JSON path of the offending field
// (e.g. "messages[2].role: unknown role 'robot'"); `ErrorParam` extracts that path.
#ifndef COLI_PLUGINS_KIMI_K3_CHAT_H_
#define COLI_PLUGINS_KIMI_K3_CHAT_H_

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "common/tokenizer/tokenizer.h"
#include "plugins/kimi_k3/chat_json.h"

namespace coli::k3 {

// The four structural special tokens of XTML.
inline constexpr std::string_view kOpenToken = "<|open|>";
inline constexpr std::string_view kCloseToken = "<|close|>";
inline constexpr std::string_view kSepToken = "<|sep|>";
inline constexpr std::string_view kEndOfMsgToken = "<|end_of_msg|>";
inline constexpr std::string_view kBosToken = "[BOS]";

// One piece of the rendered prompt. `special` pieces are exactly one special token's name.
struct Segment {
  std::string text;
  bool special = false;
  bool operator==(const Segment&) const = default;
};

struct RenderOptions {
  bool add_bos = false;  // prepend [BOS] (colibri does; the vendor template does not, §6.4)
  // The caller's wish (e.g. the ABI's add_generation_prompt); ANDed with the request's
  // chat_template_kwargs.add_generation_prompt (default true).
  bool add_generation_prompt = true;
};

struct RenderedChat {
  std::vector<Segment> segments;  // in order; no empty segment
  std::vector<int32_t> ids;       // empty from BuildChatSegments; filled by RenderChat
  std::string text;               // segments concatenated (specials as their names)
  bool thinking = true;           // the generation prompt opened `think` (else `response`)
  bool add_generation_prompt = true;
  // continue_final_message: the last assistant message was left open (`thinking`: in its think
  // block, else in its response); generation continues it.
  bool continues_final_message = false;
};

// Parses an HTTP body into the order-preserving Json the renderer wants. INVALID_ARGUMENT on
// malformed JSON or a body that is not an object.
absl::StatusOr<Json> ParseRequestBody(std::string_view body);

// An attribute value as written inside `key="…"` (§6.1: `&` as `&amp;`, `"` as `&quot;`).
std::string XtmlAttrEscape(std::string_view value);

// Renders `request` into segments and text (no token ids). Never touches a tokenizer.
absl::StatusOr<RenderedChat> BuildChatSegments(const Json& request,
                                               bool add_generation_prompt = true);

// Ends the "no special token" errors: where the special tokens come from (a model folder whose
// tokenizer_config.json is missing loads, and only chat requests fail).
inline constexpr char kSpecialsHint[] =
    ": the model folder's tokenizer_config.json names the special tokens "
    "(added_tokens_decoder); is it missing, or from another model?";

// Encodes segments at the tokenizer boundary: special segments must name a special token
// (INVALID_ARGUMENT naming it otherwise), text segments are encoded with specials disabled.
absl::StatusOr<std::vector<int32_t>> EncodeSegments(std::span<const Segment> segments,
                                                    const tok::Tokenizer& tokenizer);

// BuildChatSegments + EncodeSegments (+ [BOS] in front when asked).
absl::StatusOr<RenderedChat> RenderChat(const Json& request, const tok::Tokenizer& tokenizer,
                                        const RenderOptions& options = {});

// The JSON path a renderer error names ("messages[2].role"), or "" when the message has none.
std::string ErrorParam(const absl::Status& status);

}  // namespace coli::k3

#endif  // COLI_PLUGINS_KIMI_K3_CHAT_H_
