// tools/coli/serve_responses: OpenAI's Responses API (POST /v1/responses) for `coli serve`,
// without networking. A Responses request is mapped onto the chat-completions path (the same
// ParseChatParams validation, the same XTML rendering and output parser at the host); the chat
// path's deltas are turned into the Responses output items and SSE events; finished responses
// are kept in a bounded in-memory store for `previous_response_id` and GET /v1/responses/{id}.
//
//   ApiError error;
//   std::optional<ResponsesRequest> r = ParseResponsesRequest(body, &store, &error);
//   if (!r) reply(error.http_status, ErrorBody(error));
//   // r->chat is an ordinary /v1/chat/completions body, r->fields its ParseChatParams result.
//   ResponseBuilder b(NewResponseObject(*r, "kimi-k3", now), sink);
//   b.Start();                        // response.created, response.in_progress
//   b.Delta("content", "Hello");      // output_item.added, content_part.added, output_text.delta
//   b.Finish(outcome);                // ... .done events, response.completed / .incomplete
//
// Logprobs (`include: ["message.output_text.logprobs"]` or `top_logprobs` > 0) come from the
// chat path's "logprob" deltas: the output_text part's `logprobs` and each
// `response.output_text.delta` event's. Stored responses keep their input items for
// GET /v1/responses/{id}/input_items (ListInputItems). Background responses run through
// BackgroundJobs (serve_responses_background.h).
//
// Mapping (documented in docs/status/responses.md): `instructions` -> a first system message;
// input messages (user/system/developer/assistant, string or input_text/output_text parts) ->
// chat messages; `function_call` items -> the assistant message's tool_calls (consecutive ones
// join one assistant turn); `function_call_output` -> a tool message; a `reasoning` item ->
// the next assistant turn's reasoning_content; flat function tools -> chat tools;
// `text.format` -> response_format; `reasoning.effort` -> reasoning_effort;
// `max_output_tokens` -> max_completion_tokens. Anything else is refused with a 400 naming it.
#ifndef COLI_TOOLS_COLI_SERVE_RESPONSES_H_
#define COLI_TOOLS_COLI_SERVE_RESPONSES_H_

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "tools/coli/serve_openai.h"
#include "tools/coli/serve_responses_stream.h"

namespace coli::cli::serve {

class ResponseBuilder;
class ResponseDir;

// Finished responses kept for `previous_response_id` and GET/DELETE /v1/responses/{id}: at most
// `max_entries` responses and `max_bytes` of JSON; the oldest go first. Thread-safe. In memory
// only, unless Persist gives it a folder (`coli serve --responses-dir`).
class ResponseStore {
 public:
  explicit ResponseStore(size_t max_entries = 512, size_t max_bytes = size_t{64} << 20);
  ~ResponseStore();

  // Mirrors the store into `dir` (serve_responses_disk.h). First loads the responses kept there,
  // oldest first, under this store's limits (the files of those that do not fit are removed);
  // each file that cannot be read is left alone and named on one stderr line. From then on
  // every Put of a finished response (status completed / incomplete / failed / cancelled)
  // writes its file atomically, and Erase and eviction remove files, so the folder holds what
  // the store holds (a response still running is written by the Put that finishes it; event
  // logs stay in memory). The disk I/O runs outside the store's lock (reads never wait for it),
  // in the order the store changed; a failed write or removal is logged to stderr and the store
  // goes on in memory. Call once, before the store is shared. Returns how many were loaded.
  size_t Persist(std::unique_ptr<ResponseDir> dir);

  // Keeps `response` (the object GET returns), `conversation` (the chat messages a follow-up
  // continues from: the stored input plus this response's assistant turn, no instructions; null
  // while a background response runs, or when it ended cancelled or failed) and `input_items`
  // (the items used to make it, with ids, for GET .../input_items). Replaces an entry with
  // the same id (a background response's updates) and makes it the newest; such an update
  // keeps the entry's event log (SetEvents) and ends its live view (SetLive). The log's bytes
  // as they are at the Put count against max_bytes.
  void Put(const std::string& id, Json response, Json conversation,
           Json input_items = Json::array());
  // The kept events of a background response created with stream: true (GET ?stream=true).
  void SetEvents(const std::string& id, std::shared_ptr<const ResponseEventLog> events);
  std::shared_ptr<const ResponseEventLog> Events(const std::string& id) const;
  // A background response while it runs: Response(id) is then `builder`'s Snapshot (the output
  // so far), until the next Put of `id`. No-op when `id` is not stored.
  void SetLive(const std::string& id, std::shared_ptr<const ResponseBuilder> builder);
  std::optional<Json> Response(const std::string& id) const;
  // Nullopt when absent or when its conversation is null (see Put).
  std::optional<Json> Conversation(const std::string& id) const;
  std::optional<Json> InputItems(const std::string& id) const;
  // The stored item with id `item_id` (an `item_reference` input item names one): an output item
  // of a kept response, else an item of one's input, the newest response first; nullopt when no
  // kept response has it.
  std::optional<Json> Item(const std::string& item_id) const;
  bool Erase(const std::string& id);
  size_t size() const;

 private:
  struct Entry {
    Json response, conversation, input_items;
    std::shared_ptr<const ResponseEventLog> events;
    std::shared_ptr<const ResponseBuilder> live;
    size_t bytes = 0;
  };
  // A file to write (bytes) or remove (nullopt), for the folder given to Persist.
  struct DiskOp {
    std::string id;
    std::optional<std::string> bytes;
  };
  // Under mu_: adds `e` as the newest entry of `id` (replacing one) and evicts the oldest past
  // the limits, appending their removals to *ops.
  void InsertLocked(const std::string& id, Entry e, std::vector<DiskOp>* ops);
  // Under mu_: the turn of a batch of disk operations (0: none, nothing to wait for).
  uint64_t TakeDiskTurnLocked(const std::vector<DiskOp>& ops);
  // Without mu_: waits for `turn`, applies `ops`, passes the turn on.
  void ApplyDisk(uint64_t turn, const std::vector<DiskOp>& ops);

  const size_t max_entries_, max_bytes_;
  mutable std::mutex mu_;
  std::map<std::string, Entry> entries_;
  std::deque<std::string> order_;  // oldest first
  size_t bytes_ = 0;
  // Persist's folder. Disk operations are numbered under mu_ (next_turn_) and applied in that
  // order under disk_mu_ (done_turn_), so the folder changes in the store's order while mu_ is
  // never held across I/O.
  std::unique_ptr<ResponseDir> dir_;
  uint64_t next_turn_ = 1;  // under mu_
  std::mutex disk_mu_;
  std::condition_variable disk_cv_;
  uint64_t done_turn_ = 0;  // under disk_mu_: the last turn applied
};

// Where a chat-body path came from in the Responses request, for error messages.
struct ParamSource {
  std::string chat;          // "messages[3]", "messages[1].tool_calls[0]", "tools[2]"
  std::string responses;     // "input[4]", "input[2]", "tools[2]"
  bool tool_output = false;  // a function_call_output: the chat `content` is its `output`
};

// A Responses request mapped onto the chat-completions path.
struct ResponsesRequest {
  Json chat;                          // the equivalent /v1/chat/completions body
  SamplingFields fields;              // ParseChatParams(chat)
  Json conversation = Json::array();  // chat messages a follow-up continues (no instructions)
  Json echo = Json::object();         // the request fields the response object repeats
  // The items used to make the response (GET .../input_items): with previous_response_id that
  // response's items and output first, then this request's `input` as items with ids.
  Json input_items = Json::array();
  bool store = true;
  bool background = false;  // `background: true` (requires store)
  bool logprobs = false;    // include message.output_text.logprobs, or top_logprobs > 0
  std::vector<ParamSource> sources;
};

// Validates `body` (a POST /v1/responses object) and maps it. `store` resolves
// previous_response_id (nullptr: none is known). On failure *error names the field.
std::optional<ResponsesRequest> ParseResponsesRequest(const Json& body, const ResponseStore* store,
                                                      ApiError* error);

// An error about the chat body (ParseChatParams's, or the host's rendering error) restated in
// the Responses request's terms: "messages[2].content" -> "input[1].content",
// "max_completion_tokens" -> "max_output_tokens", "response_format" -> "text.format", ...
ApiError ToResponsesError(ApiError error, const ResponsesRequest& request);

// The response object before generation: id resp_..., object, created_at, status in_progress,
// model, empty output, and the request fields it repeats.
Json NewResponseObject(const ResponsesRequest& request, const std::string& model,
                       int64_t created_at);

// How a generation ended (from the chat path's result).
struct ResponseOutcome {
  std::string finish_reason;  // the chat path's: "stop", "length", "tool_calls"
  int64_t input_tokens = 0, output_tokens = 0, reasoning_tokens = 0, cached_tokens = 0;
};

// Builds the output items of one response from the chat path's deltas and, with a sink, sends
// the Responses SSE events for them (each with `sequence_number` 0, 1, 2, ...).
// One thread writes (Start, Delta, Finish, Fail, Cancel); any thread may take a Snapshot
// meanwhile (a background response's output so far).
class ResponseBuilder {
 public:
  struct Sink {
    // Sends one event (a JSON object with "type" and "sequence_number"); false once the client
    // is gone. Unset: no events (a non-streamed response).
    std::function<bool(const Json& event)> send;
    std::function<bool()> alive;  // the client still reads (checked without writing)
  };

  // `logprobs`: the request asked for them; "logprob" deltas (the chat path's entries
  // {token, logprob, bytes, top_logprobs}) then go into the output_text part and onto the
  // output_text.delta events (each delta event is held until its token's entry arrives).
  explicit ResponseBuilder(Json response, Sink sink = {}, bool logprobs = false);

  // response.created with the object as given; for a "queued" one (a background response)
  // response.queued too; then status in_progress and response.in_progress.
  bool Start();
  // One delta of the chat path (Gateway::RunChoice's kinds): "reasoning" / "content" text, a
  // "tool_call" (a chat tool call {id, type, function: {name, arguments}}), a streamed call's
  // "tool_call_delta" pieces and "tool_call_done" (function_call item added at the first piece,
  // response.function_call_arguments.delta per piece, .done + output_item.done at the end;
  // see Gateway::RunChoice for their shapes), "logprob" (a
  // content token's entry, after that token's "content" delta), "tick" (a token that showed
  // nothing: checks the client). Other kinds carry nothing for this API. Returns false when
  // the client is gone.
  bool Delta(const char* kind, const Json& payload);
  // Closes the open item, sets status (incomplete with reason max_output_tokens when the chat
  // path says "length"), usage, and sends response.completed / response.incomplete.
  bool Finish(const ResponseOutcome& outcome);
  // The generation failed after it started: status failed with `error`, response.failed.
  bool Fail(const ApiError& error);
  // A background response stopped by POST /v1/responses/{id}/cancel: status cancelled, the
  // open item incomplete. No event (the API has none for it): its streams just end.
  void Cancel();

  // The response as built so far; only while no other thread writes (else Snapshot).
  const Json& response() const { return response_; }
  // A copy of the response as built so far (any thread).
  Json Snapshot() const;
  // This response's assistant turn as one chat message (reasoning_content, content,
  // tool_calls), for the store.
  Json ChatMessage() const;

 private:
  enum class Open { kNone, kReasoning, kMessage, kFunctionCall };
  bool Send(Json event);
  bool OpenItem(Open kind);
  bool CloseItem(const char* status);
  // Sends the held output_text.delta event (with logprobs) with the entries that arrived.
  bool FlushDelta();

  mutable std::mutex mu_;  // held by the public calls
  Json response_;
  Sink sink_;
  bool logprobs_ = false;
  std::optional<Json> held_delta_;         // an output_text.delta waiting for its logprobs
  Json pending_logprobs_ = Json::array();  // entries not yet on a delta event
  Json orphan_logprobs_ = Json::array();   // entries that came before their message item
  int64_t sequence_ = 0;
  Open open_ = Open::kNone;
  int open_index_ = -1;
};

// This request's input as the items GET /v1/responses/{id}/input_items lists
// (OpenAI's ResponseItem shapes): a string input is one user message; a message's string
// content becomes one input_text (output_text for assistant) part; items keep the id the
// client gave (else msg_/fc_/fco_/rs_ + hex) and get status "completed" when they have none.
Json InputItemsOf(const Json& input);

// One page of GET /v1/responses/{id}/input_items: {"object": "list", data, first_id, last_id,
// has_more}. `limit` 1..100 (default 20), `order` asc|desc (default desc: newest item first),
// `after` an item id: the items after it in that order. Empty strings: the defaults. A bad
// value (or an `after` that names no item) is a 400 naming the query parameter.
std::optional<Json> ListInputItems(const Json& items, const std::string& limit,
                                   const std::string& order, const std::string& after,
                                   ApiError* error);

// GET /v1/responses/{id}?stream=true&starting_after=N: N, a decimal sequence number >= 0
// (nullopt otherwise).
std::optional<int64_t> ParseStartingAfter(const std::string& text);

// "event: <type>\ndata: <json>\n\n", the frame the Responses API streams.
std::string SseEventFrame(const Json& event);

}  // namespace coli::cli::serve

#endif  // COLI_TOOLS_COLI_SERVE_RESPONSES_H_
