/*
 * coli_plugin.h — the model-family plugin ABI, version 1.11 (pure C99).
 *
 * A model family is a shared object in the host's plugin directory that exports exactly one
 * symbol:
 *
 *   COLI_PLUGIN_EXPORT const coli_plugin_api_t* coli_plugin_entry(const coli_host_api_t* host,
 *                                                                 coli_abi_version_t* version);
 *
 * Example (host side, error handling left out):
 *
 *   coli_abi_version_t v = {sizeof v, COLI_ABI_VERSION_MAJOR, COLI_ABI_VERSION_MINOR};
 *   const coli_plugin_api_t* api = entry(&host_api, &v);      // v now holds the plugin's version
 *   // refuse when api == NULL, v.major != COLI_ABI_VERSION_MAJOR or the table is too short;
 *   // otherwise both sides use minor = min(host minor, plugin minor).
 *   int32_t serves = 0;
 *   api->probe(dir, strlen(dir), &serves, &err);
 *
 * Rules (abi.md has the full text and the version history):
 *  - Every struct that crosses the boundary starts with `size_t struct_size`, set by whoever
 *    fills the struct (the caller for inputs, the callee for tables it returns). Fields are only
 *    ever appended; each says the minor version that added it. A reader never touches a field
 *    that lies beyond the struct_size it was given.
 *  - Fixed-width types only. Strings are pointer + byte length, UTF-8, not NUL-terminated unless
 *    stated. Enums travel as int32_t.
 *  - Status codes are numerically absl::StatusCode (coli_status_t). Error text goes into a
 *    caller-owned coli_error_t buffer (may be NULL). No exception crosses the boundary.
 *  - Whoever allocates frees. Pointers handed to a call are borrowed for that call only unless
 *    the function says otherwise. Pointers returned by the plugin stay valid as documented.
 *  - Thread tags on each function:
 *      [init]        once, from the thread that loaded the plugin, before/after everything else;
 *      [any-thread]  any thread, concurrently with anything (the plugin synchronises);
 *      [per-model]   any thread, but never concurrently with model_close of the same model;
 *      [per-session] the host serialises all calls on one session (never two at once).
 *  - Cancellation: every long call takes a callback; a non-zero return asks the plugin to stop.
 *    The plugin honours it within one token and between prefill chunks, answering
 *    COLI_STATUS_CANCELLED.
 */
#ifndef COLI_PLUGIN_API_COLI_PLUGIN_H_
#define COLI_PLUGIN_API_COLI_PLUGIN_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define COLI_ABI_VERSION_MAJOR 1
#define COLI_ABI_VERSION_MINOR 11

#define COLI_PLUGIN_ENTRY_SYMBOL "coli_plugin_entry"

#if defined(_WIN32)
#define COLI_PLUGIN_EXPORT __declspec(dllexport)
#else
#define COLI_PLUGIN_EXPORT __attribute__((visibility("default")))
#endif

/* ---------------------------------------------------------------------------------------------
 * Status codes: numerically equal to absl::StatusCode.
 * ------------------------------------------------------------------------------------------- */
typedef int32_t coli_status_t;
#define COLI_STATUS_OK 0
#define COLI_STATUS_CANCELLED 1
#define COLI_STATUS_UNKNOWN 2
#define COLI_STATUS_INVALID_ARGUMENT 3
#define COLI_STATUS_DEADLINE_EXCEEDED 4
#define COLI_STATUS_NOT_FOUND 5
#define COLI_STATUS_ALREADY_EXISTS 6
#define COLI_STATUS_PERMISSION_DENIED 7
#define COLI_STATUS_RESOURCE_EXHAUSTED 8
#define COLI_STATUS_FAILED_PRECONDITION 9
#define COLI_STATUS_ABORTED 10
#define COLI_STATUS_OUT_OF_RANGE 11
#define COLI_STATUS_UNIMPLEMENTED 12
#define COLI_STATUS_INTERNAL 13
#define COLI_STATUS_UNAVAILABLE 14
#define COLI_STATUS_DATA_LOSS 15
#define COLI_STATUS_UNAUTHENTICATED 16

/* Named request errors keep the reference engine's names as the message prefix:
 *   RESOURCE_EXHAUSTED "CONTEXT_EXCEEDED prompt_tokens=P capacity=C"
 *   INVALID_ARGUMENT   "EMPTY_PROMPT"                                                          */

/* Error text, caller-owned (v1.0). The callee writes at most capacity-1 bytes followed by a NUL
 * and sets `length` to the full length of the message (length >= capacity means truncated). */
typedef struct coli_error_t {
  size_t struct_size;
  char* message;   /* caller-owned buffer, may be NULL when capacity == 0 */
  size_t capacity; /* bytes available at `message` */
  size_t length;   /* out: full message length in bytes (without NUL) */
} coli_error_t;

/* A borrowed UTF-8 string (v1.0). */
typedef struct coli_string_t {
  const char* data;
  size_t size;
} coli_string_t;

/* A key/value pair for family-specific options and extensions (v1.0). */
typedef struct coli_kv_t {
  coli_string_t key;
  coli_string_t value;
} coli_kv_t;

/* Caller-owned output buffers (v1.0). The callee writes min(count, capacity) elements and sets
 * `count` to the number it needed; when count > capacity the call returns COLI_STATUS_OK but
 * the output is truncated, and the caller retries with a buffer of `count` elements. */
typedef struct coli_token_buffer_t {
  size_t struct_size;
  int32_t* ids;
  size_t capacity;
  size_t count;
} coli_token_buffer_t;

typedef struct coli_byte_buffer_t {
  size_t struct_size;
  char* data;
  size_t capacity;
  size_t count;
} coli_byte_buffer_t;

/* ---------------------------------------------------------------------------------------------
 * Version negotiation.
 * ------------------------------------------------------------------------------------------- */
typedef struct coli_abi_version_t {
  size_t struct_size;
  uint32_t major; /* in: the host's; out: the plugin's */
  uint32_t minor; /* in: the host's; out: the plugin's. Both then use min(host, plugin). */
} coli_abi_version_t;

/* ---------------------------------------------------------------------------------------------
 * What the host gives the plugin. Valid from coli_plugin_entry until the plugin is unloaded.
 * ------------------------------------------------------------------------------------------- */
#define COLI_LOG_DEBUG 0
#define COLI_LOG_INFO 1
#define COLI_LOG_WARNING 2
#define COLI_LOG_ERROR 3

typedef struct coli_host_api_t {
  size_t struct_size;
  uint32_t abi_major; /* v1.0: the host's version, same as the one passed to the entry */
  uint32_t abi_minor; /* v1.0 */
  void* host_data;    /* v1.0: opaque, passed back to every callback below */
  /* v1.0 [any-thread] Writes one log line (no trailing newline needed) into the host's log.
   * `message` is borrowed for the call. */
  void (*log)(void* host_data, int32_t level, const char* message, size_t length);
} coli_host_api_t;

/* ---------------------------------------------------------------------------------------------
 * Opaque plugin objects. Created and destroyed by the plugin only.
 * ------------------------------------------------------------------------------------------- */
typedef struct coli_model_t coli_model_t;
typedef struct coli_session_t coli_session_t;

/* Progress + cancel callback: `done` of `total` units of work (tokens for prefill, bytes or
 * tensors for loading) with a short stage label (borrowed). Return non-zero to cancel. May be
 * NULL. Called on the thread that made the call. */
typedef int32_t (*coli_progress_fn)(void* user, uint64_t done, uint64_t total, const char* stage,
                                    size_t stage_length);

/* ---------------------------------------------------------------------------------------------
 * Model options: the family's switches as typed fields (the host/CLI reads the environment
 * variables the family declares, coli_switch_t, into these at its edge; the plugin never reads
 * the environment for them).
 * coli_model_options_defaults() fills the documented defaults.
 * ------------------------------------------------------------------------------------------- */
typedef struct coli_model_options_t {
  size_t struct_size;
  int32_t bits;          /* v1.0 K3_BITS: dense weights 4, 8, 32 (f32); 0 = the plugin's/container's */
  int32_t mla_bits;      /* v1.0 K3_MLA_BITS: default 8; 0 = plugin default */
  int32_t head_bits;     /* v1.0 K3_HEAD_BITS: default 8; 0 = plugin default */
  int32_t idot;          /* v1.0 K3_IDOT: int8-activation expert matmuls, default 1 */
  int32_t chunk;         /* v1.0 K3_CHUNK: prefill chunk in tokens, default 32 */
  int32_t direct;        /* v1.0 K3_DIRECT: O_DIRECT expert reads, default 1 */
  int32_t pipe;          /* v1.0 K3_PIPE: overlap expert reads with compute, default 1 */
  int32_t load_threads;  /* v1.0 K3_LOAD_THREADS: default 4 */
  double expert_gb;      /* v1.0 K3_EXPERT_GB: routed-expert cache budget in GB, default 8 */
  double topp;           /* v1.0 K3_TOPP: routed-expert cumulative-weight cut, 0 = off */
  int64_t max_context;   /* v1.0 K3_MAXT: context capacity in tokens, 0 = plugin default */
  int32_t layers;        /* v1.0 K3_LAYERS: truncate the stack, -1 = all */
  int32_t threads;       /* v1.0 compute threads, 0 = runtime default */
  double mla_norm_eps;   /* v1.0 MLA latent RMSNorm epsilon, default 1e-6 */
  const coli_string_t* extra_dirs; /* v1.0 K3_DIRS: extra shard directories (borrowed) */
  size_t n_extra_dirs;             /* v1.0 */
  coli_string_t trace_path;        /* v1.0 K3_TRACE: per-layer hidden-state dump, empty = off */
  coli_string_t x0_path;           /* v1.0 K3_X0: injected input rows, empty = off */
  coli_string_t logits_path;       /* v1.0 K3_LOGITS: per-position logits dump, empty = off */
  const coli_kv_t* extra;          /* v1.0 family-specific options by name (borrowed); a plugin
                                      refuses keys it does not know (INVALID_ARGUMENT naming it) */
  size_t n_extra;                  /* v1.0 */
} coli_model_options_t;

/* Fills `options` with the v1.0 defaults listed above (struct_size included). */
static inline void coli_model_options_defaults(coli_model_options_t* options) {
  coli_model_options_t d = {0};
  d.struct_size = sizeof(coli_model_options_t);
  d.bits = 0;
  d.mla_bits = 0;
  d.head_bits = 0;
  d.idot = 1;
  d.chunk = 32;
  d.direct = 1;
  d.pipe = 1;
  d.load_threads = 4;
  d.expert_gb = 8.0;
  d.topp = 0.0;
  d.max_context = 0;
  d.layers = -1;
  d.threads = 0;
  d.mla_norm_eps = 1e-6;
  *options = d;
}

typedef struct coli_model_open_args_t {
  size_t struct_size;
  coli_string_t model_dir;              /* v1.0 borrowed for the call */
  const coli_model_options_t* options;  /* v1.0 borrowed for the call; NULL = defaults */
  coli_progress_fn progress;            /* v1.0 load progress; non-zero return cancels the load */
  void* progress_user;                  /* v1.0 */
} coli_model_open_args_t;

/* ---------------------------------------------------------------------------------------------
 * Model information. Every pointer is owned by the plugin and stays valid until model_close.
 * ------------------------------------------------------------------------------------------- */
#define COLI_CHAT_CAP_TEMPLATE 1u  /* render_chat works */
#define COLI_CHAT_CAP_THINKING 2u  /* a structural reasoning channel */
#define COLI_CHAT_CAP_TOOLS 4u     /* tool declarations and parsed tool calls */
#define COLI_CHAT_CAP_LOGPROBS 8u  /* decode can return top-k logprobs */

typedef struct coli_special_token_t {
  coli_string_t text; /* e.g. "<|end_of_msg|>" */
  int32_t id;
  int32_t reserved;
} coli_special_token_t;

typedef struct coli_model_info_t {
  size_t struct_size;
  coli_string_t family;        /* v1.0 e.g. "kimi_k3" */
  coli_string_t name;          /* v1.0 a display name, e.g. the architecture string */
  int32_t vocab_size;          /* v1.0 */
  int32_t bos_id;              /* v1.0 -1 when none */
  int32_t eos_id;              /* v1.0 -1 when none */
  uint32_t chat_capabilities;  /* v1.0 COLI_CHAT_CAP_* bits */
  int64_t context_capacity;    /* v1.0 tokens one session holds */
  const coli_special_token_t* special_tokens; /* v1.0 */
  size_t n_special_tokens;                    /* v1.0 */
  const int32_t* stop_ids;     /* v1.0 tokens that end generation (model-owned stops) */
  size_t n_stop_ids;           /* v1.0 */
} coli_model_info_t;

/* ---------------------------------------------------------------------------------------------
 * Chat rendering.
 * ------------------------------------------------------------------------------------------- */
typedef struct coli_chat_render_args_t {
  size_t struct_size;
  /* v1.0 The OpenAI chat-completions request body as UTF-8 JSON (messages, tools, tool_choice,
   * enable_thinking, reasoning_effort, ...). Fields the family does not use are ignored; fields
   * it cannot honour are refused with INVALID_ARGUMENT naming the field. Borrowed. */
  coli_string_t request_json;
  int32_t add_generation_prompt; /* v1.0 non-zero: end with the assistant cue */
  int32_t reserved;
} coli_chat_render_args_t;

typedef struct coli_chat_render_result_t {
  size_t struct_size;
  coli_token_buffer_t tokens; /* v1.0 caller-owned (see buffer rules) */
  coli_byte_buffer_t text;    /* v1.0 caller-owned: the rendered text, specials spelled out */
  /* v1.0 out: an opaque plugin-defined parser start state (never 0) to pass as
   * coli_prefill_args_t.chat_parse_mode so decode reports chat events. */
  int32_t chat_parse_mode;
  int32_t reserved;
} coli_chat_render_result_t;

/* ---------------------------------------------------------------------------------------------
 * Sessions, prefill and decode.
 * ------------------------------------------------------------------------------------------- */
typedef struct coli_session_options_t {
  size_t struct_size;
  int64_t max_context; /* v1.0 0 = the model's context_capacity */
} coli_session_options_t;

/* One token's log-probability (v1.0; prompt logprobs since v1.7). */
typedef struct coli_logprob_t {
  int32_t id;
  float logprob;
} coli_logprob_t;

typedef struct coli_prefill_args_t {
  size_t struct_size;
  /* v1.0 The WHOLE prompt (borrowed). The session keeps the record of token ids its state was
   * built from; when that record is a strict prefix of `tokens` only the tail is computed
   * (at least one token is always computed: recurrent state cannot be rewound); otherwise the
   * session is reset first. */
  const int32_t* tokens;
  size_t n_tokens;
  /* v1.0 0 = plain text; otherwise a coli_chat_render_result_t.chat_parse_mode: decode then
   * reports chat events parsed from the generated tokens. */
  int32_t chat_parse_mode;
  int32_t reserved;
  uint64_t seed;              /* v1.0 seeds the session's sampler for this generation */
  coli_progress_fn progress;  /* v1.0 tokens done/total between chunks; non-zero cancels */
  void* progress_user;        /* v1.0 */
  /* v1.4 The OpenAI `response_format` object as UTF-8 JSON text (borrowed for the call), e.g.
   * {"type":"json_schema","json_schema":{"name":"x","schema":{...}}} or {"type":"json_object"};
   * empty (size 0) or {"type":"text"} = no constraint. With one, every token decode samples for
   * this generation keeps the answer a prefix of a value the format allows, and the row's stop
   * tokens are sampled only once the value is complete (docs/status/constrained.md). For a chat
   * session (chat_parse_mode != 0) the constraint covers the answer (content channel), not the
   * reasoning; for plain text the whole output. A format the plugin cannot enforce is refused
   * with INVALID_ARGUMENT naming its path ("response_format.json_schema.schema.x: ..."). Read
   * only when struct_size reaches it (COLI_PREFILL_ARGS_SIZE_V1_4); the host never sends a
   * non-empty one to a plugin whose negotiated minor is older (it refuses the request). */
  coli_string_t response_format;
  /* v1.7 Non-zero: report the log-probability of every prompt token after the first given the
   * tokens before it (vLLM's prompt_logprobs, OpenAI completions' echo + logprobs) in the
   * result's prompt_logprobs. The plugin then keeps a prefix (record, checkpoint, shared
   * prefix) only where it still holds the exact entries of the kept positions (else it computes
   * the whole prompt); the values and the prompt's state are the same as without. Read only
   * when struct_size reaches it (COLI_PREFILL_ARGS_SIZE_V1_7). */
  int32_t want_prompt_logprobs;
  /* v1.7 With want_prompt_logprobs: how many most likely alternatives each position also reports
   * (0 = only the prompt token's own; at most 20). */
  int32_t prompt_logprobs_top_k;
} coli_prefill_args_t;

/* The prefill args' size per minor: a plugin reads response_format only when the host's args
 * reach it; otherwise the generation is unconstrained. */
#define COLI_PREFILL_ARGS_SIZE_V1_0 (offsetof(coli_prefill_args_t, progress_user) + sizeof(void*))
#define COLI_PREFILL_ARGS_SIZE_V1_4 \
  (offsetof(coli_prefill_args_t, response_format) + sizeof(coli_string_t))
#define COLI_PREFILL_ARGS_SIZE_V1_7 \
  (offsetof(coli_prefill_args_t, prompt_logprobs_top_k) + sizeof(int32_t))

typedef struct coli_prefill_result_t {
  size_t struct_size;
  uint64_t tokens_reused;    /* v1.0 prompt tokens whose state was kept */
  uint64_t tokens_computed;  /* v1.0 prompt tokens computed by this call */
  int64_t context_used;      /* v1.0 tokens in the session's record after the call */
  int64_t context_capacity;  /* v1.0 the session's capacity */
  /* v1.7 out, when the args asked for them (else NULL / 0): for each prompt position i in
   * [1, n_tokens), in order, the entry of tokens[i] (its log-probability given tokens[0, i))
   * followed by the prompt_logprobs_top_k most likely tokens there (descending; ties: lower id
   * first): (n_tokens - 1) * (1 + top_k) entries, log_softmax of the raw logits. Plugin-owned,
   * valid until the next call on the session. Written only when struct_size reaches it. */
  const coli_logprob_t* prompt_logprobs;
  size_t n_prompt_logprobs;
  /* v1.9 out, with prompt_logprobs: for each prompt position i in [1, n_tokens), in order, the
   * rank of tokens[i] there — how many vocabulary tokens have a log-probability (as reported)
   * at least its own, itself included, so ties count (vLLM's prompt_logprobs rank, 1 = most
   * likely): n_tokens - 1 entries. Plugin-owned, valid until the next call on the session.
   * Written only when struct_size reaches it; a plugin that leaves it NULL reports no ranks. */
  const int64_t* prompt_logprob_ranks;
  size_t n_prompt_logprob_ranks;
} coli_prefill_result_t;

/* Chat event channels. */
#define COLI_CHANNEL_NONE 0      /* structure only (no visible text) */
#define COLI_CHANNEL_REASONING 1 /* thinking text */
#define COLI_CHANNEL_CONTENT 2   /* answer text */
#define COLI_CHANNEL_TOOL_CALL 3 /* one complete tool call as JSON {"name":..,"arguments":..} */
/* v1.5 A piece of the tool call being generated, as JSON {"index": k, "name": "f" (the call's
 * first delta only), "arguments": "<next piece>"}: k counts the message's calls from 0, and the
 * pieces of call k, joined, are exactly its arguments text — the complete call's "arguments"
 * when that is a string, else that value as compact JSON (keys in order, no whitespace, non-ASCII
 * as UTF-8). The COLI_CHANNEL_TOOL_CALL event still follows when the call closes (a generation
 * that stops inside a call sends no complete event). A plugin sends deltas only to a host whose
 * minor (given to coli_plugin_entry) is at least 5. */
#define COLI_CHANNEL_TOOL_CALL_DELTA 4

typedef struct coli_chat_event_t {
  size_t struct_size;
  int32_t channel;        /* v1.0 COLI_CHANNEL_* */
  int32_t end_of_message; /* v1.0 non-zero: the model closed its message */
  coli_string_t text;     /* v1.0; empty in REASONING / CONTENT: that channel holds the first
                             bytes of a character (a reply cut there ends inside it) */
} coli_chat_event_t;


/* One OpenAI logit_bias entry (v1.3): `bias` in [-100, 100] is added to logits[id] before
 * anything else. */
typedef struct coli_logit_bias_t {
  int32_t id;
  float bias;
} coli_logit_bias_t;

/* Why a row finished (set by decode). */
#define COLI_FINISH_NONE 0    /* keep going */
#define COLI_FINISH_STOP 1    /* a model-owned stop token was sampled */
#define COLI_FINISH_LENGTH 2  /* the session's context is full (token -1: none was sampled) */

/* One session's step. Inputs are set by the host; outputs by the plugin. Output pointers are
 * owned by the plugin and stay valid until the next call on the same session. */
typedef struct coli_decode_row_t {
  size_t struct_size;
  /* inputs (v1.0) */
  coli_session_t* session;
  float temperature;      /* 0 = greedy (first index of the maximum) */
  float top_p;            /* 1 (or 0) = off */
  int32_t top_k;          /* 0 = off */
  int32_t logprobs_top_k; /* 0 = no logprobs; else return the sampled token's and top-k */
  /* outputs (v1.0) */
  int32_t token;                /* the sampled token */
  int32_t finish;               /* COLI_FINISH_* */
  coli_string_t text;           /* bytes from the streaming UTF-8 decoder (never a partial
                                   character; may be empty; stop tokens give none) */
  float logprob;                /* the sampled token's log-probability (when asked) */
  int32_t reserved;
  const coli_logprob_t* top_logprobs; /* descending, logprobs_top_k entries */
  size_t n_top_logprobs;
  const coli_chat_event_t* events;    /* chat events this token produced (chat sessions) */
  size_t n_events;
  /* inputs (v1.3): the OpenAI / vLLM knobs (docs/status/sampling.md). A zero is neutral, so a
   * row zeroed by an older host asks for none. The plugin applies them to the logits in this
   * order: logit_bias, repetition, frequency, presence penalty (greedy takes the first maximum of
   * the result), then temperature, top_k, top_p, min_p. The penalties read the session's
   * history since its last prefill: the prompt and the tokens decode sampled. A generation
   * prefilled with a response_format (v1.4) first has the tokens it disallows set to -inf.
   * Reported logprobs stay those of the raw logits. The host never sends a non-neutral value to a plugin whose
   * negotiated minor is older (it refuses the request instead). */
  float repetition_penalty; /* v1.3 > 0; 1 (or 0) = off; prompt and generated tokens:
                               logit > 0 ? logit / r : logit * r */
  float frequency_penalty;  /* v1.3 [-2, 2], 0 = off: minus f * count (generated tokens) */
  float presence_penalty;   /* v1.3 [-2, 2], 0 = off: minus p for each generated token */
  float min_p;              /* v1.3 [0, 1], 0 = off: keep p >= min_p * p_max */
  const coli_logit_bias_t* logit_bias; /* v1.3 borrowed for the call; ids distinct and in
                                          [0, vocab_size) (else INVALID_ARGUMENT) */
  size_t n_logit_bias;                 /* v1.3 at most 1024 */
} coli_decode_row_t;

/* The decode row's size per minor: a plugin reads the v1.3 inputs only when the host's row
 * reaches them (struct_size >= COLI_DECODE_ROW_SIZE_V1_3); otherwise they are neutral. */
#define COLI_DECODE_ROW_SIZE_V1_0 (offsetof(coli_decode_row_t, n_events) + sizeof(size_t))
#define COLI_DECODE_ROW_SIZE_V1_3 (offsetof(coli_decode_row_t, n_logit_bias) + sizeof(size_t))

typedef struct coli_decode_args_t {
  size_t struct_size;
  coli_decode_row_t* rows; /* v1.0 one per session, sessions distinct; caller-owned */
  size_t n_rows;           /* v1.0 */
} coli_decode_args_t;

/* A plugin-defined statistic. Conventional names: prompt_tokens, tokens_reused,
 * tokens_computed, tokens_generated, expert_hits, expert_misses, bytes_read, read_seconds,
 * compute_seconds. `name` is plugin-owned, valid until the plugin is unloaded. */
typedef struct coli_stat_t {
  const char* name; /* NUL-terminated */
  double value;
} coli_stat_t;

/* ---------------------------------------------------------------------------------------------
 * Environment switches (v1.8): the shell variables that set a family's model options, declared
 * by the family and read by the host and its clients at their edge (the plugin still never
 * reads the environment for them). Each sets one coli_model_options_t field or one `extra` key.
 * ------------------------------------------------------------------------------------------- */
/* What a switch sets: a typed field, numbered as that field of coli.v1.ModelOptions
 * (proto/coli/v1/coli.proto), or a key of `extra`. */
#define COLI_SWITCH_FIELD_BITS 1
#define COLI_SWITCH_FIELD_MLA_BITS 2
#define COLI_SWITCH_FIELD_HEAD_BITS 3
#define COLI_SWITCH_FIELD_IDOT 4
#define COLI_SWITCH_FIELD_CHUNK 5
#define COLI_SWITCH_FIELD_DIRECT 6
#define COLI_SWITCH_FIELD_PIPE 7
#define COLI_SWITCH_FIELD_LOAD_THREADS 8
#define COLI_SWITCH_FIELD_EXPERT_GB 9
#define COLI_SWITCH_FIELD_TOPP 10
#define COLI_SWITCH_FIELD_MAX_CONTEXT 11
#define COLI_SWITCH_FIELD_LAYERS 12
#define COLI_SWITCH_FIELD_THREADS 13
#define COLI_SWITCH_FIELD_MLA_NORM_EPS 14
#define COLI_SWITCH_FIELD_EXTRA_DIRS 15
#define COLI_SWITCH_FIELD_TRACE_PATH 16
#define COLI_SWITCH_FIELD_X0_PATH 17
#define COLI_SWITCH_FIELD_LOGITS_PATH 18
#define COLI_SWITCH_FIELD_EXTRA 19
/* v1.10 Not a model option: a default for one top-level field of the chat requests a client
 * renders (extra_key: the request body's field, e.g. "enable_thinking"). `coli run --chat`,
 * `coli chat` and the `coli serve` gateway put the value (BOOL as a JSON bool, INT and REAL as a
 * number, STRING as a string; not LIST) into each chat request that does not set that field
 * itself. A host older than 1.10 refuses the field: declare such switches only to a host whose
 * minor (coli_plugin_entry's `version` in) is 10 or more. */
#define COLI_SWITCH_FIELD_REQUEST 20

/* The values a switch takes. An unset or empty variable is never read. A refused value is
 * INVALID_ARGUMENT "environment variable NAME..." naming the value and what it takes. */
#define COLI_SWITCH_INT 1    /* a whole number in [int_min, int_max]; with int_values, one of them
                                (integer fields; into `extra` as given) */
#define COLI_SWITCH_BOOL 2   /* 0 or 1 (bool fields; into `extra` as given) */
#define COLI_SWITCH_REAL 3   /* a finite number in [real_min, real_max], real_min itself refused
                                when real_min_exclusive (real fields; into `extra` as given) */
#define COLI_SWITCH_STRING 4 /* any text, as given: the family checks it (string fields, `extra`) */
#define COLI_SWITCH_LIST 5   /* items separated by ':' or ',', empty ones skipped (extra_dirs) */

typedef struct coli_switch_t {
  size_t struct_size;
  const char* name;      /* v1.8 the variable, NUL-terminated: [A-Z0-9_]+ ("K3_CHUNK") */
  int32_t field;         /* v1.8 COLI_SWITCH_FIELD_* */
  int32_t kind;          /* v1.8 COLI_SWITCH_* (must suit the field) */
  const char* extra_key; /* v1.8 field EXTRA: the key, NUL-terminated; otherwise NULL */
  int64_t int_min;       /* v1.8 INT: the range (within int32 for an int32 field) */
  int64_t int_max;
  const int64_t* int_values; /* v1.8 INT: the values allowed, or NULL for the whole range */
  size_t n_int_values;       /* v1.8 */
  double real_min;           /* v1.8 REAL: the range */
  double real_max;
  int32_t real_min_exclusive; /* v1.8 REAL: non-zero refuses real_min itself */
  int32_t reserved;
  /* v1.8 NULL, or what the value takes as the refusal says it ("NAME='v': expected <this>"):
   * for INT every refusal (else the range's wording, or the int_values listed), for REAL the
   * refusal of an exclusive real_min (else "a value above <real_min>"), for BOOL every refusal
   * (else "0 or 1"). NUL-terminated. */
  const char* expected;
  const char* help; /* v1.8 one line for listings (coli-host --switches), NUL-terminated */
} coli_switch_t;

#define COLI_SWITCH_SIZE_V1_8 (offsetof(coli_switch_t, help) + sizeof(const char*))

/* ---------------------------------------------------------------------------------------------
 * The plugin's function table. Returned by coli_plugin_entry; owned by the plugin; valid until
 * the plugin is unloaded. struct_size tells the host how many entries exist.
 * ------------------------------------------------------------------------------------------- */
typedef struct coli_plugin_api_t {
  size_t struct_size;
  /* v1.0 family name ("kimi_k3") and plugin version, NUL-terminated, plugin-owned. */
  const char* family;
  const char* plugin_version;

  /* v1.0 [init] Called once before unloading, after every model is closed. May be NULL. */
  void (*shutdown)(void);

  /* v1.0 [any-thread] Reads `model_dir`/config.json (borrowed) and sets *serves to 1 when this
   * plugin serves the model, 0 otherwise. A non-OK status means the directory itself is bad.
   * With *serves = 0 and an OK status a plugin may also write into *error one short line of what
   * it does serve ("model_type 'x' or architectures X*"); the host quotes it when no plugin
   * serves the folder (any minor: an older host ignores it, an older plugin writes nothing). */
  coli_status_t (*probe)(coli_string_t model_dir, int32_t* serves, coli_error_t* error);

  /* v1.0 [any-thread] Opens a model. *model is plugin-owned; free it with model_close. */
  coli_status_t (*model_open)(const coli_model_open_args_t* args, coli_model_t** model,
                              coli_error_t* error);
  /* v1.0 [per-model] Closes a model; every session of it must be destroyed first. */
  void (*model_close)(coli_model_t* model);
  /* v1.0 [per-model] Fills *info (caller sets info->struct_size). */
  coli_status_t (*model_info)(coli_model_t* model, coli_model_info_t* info, coli_error_t* error);

  /* v1.0 [per-model] Text (borrowed) to token ids. allow_special: special-token text becomes
   * the special token (otherwise it is ordinary text). */
  coli_status_t (*tokenize)(coli_model_t* model, coli_string_t text, int32_t allow_special,
                            coli_token_buffer_t* out, coli_error_t* error);
  /* v1.0 [per-model] Token ids (borrowed) to their raw bytes. */
  coli_status_t (*detokenize)(coli_model_t* model, const int32_t* ids, size_t n_ids,
                              coli_byte_buffer_t* out, coli_error_t* error);
  /* v1.0 [per-model] Renders a chat request with the family's template. */
  coli_status_t (*render_chat)(coli_model_t* model, const coli_chat_render_args_t* args,
                               coli_chat_render_result_t* result, coli_error_t* error);

  /* v1.0 [per-model] Creates an empty session (plugin-owned). */
  coli_status_t (*session_create)(coli_model_t* model, const coli_session_options_t* options,
                                  coli_session_t** session, coli_error_t* error);
  /* v1.0 [per-session] Destroys a session. */
  void (*session_destroy)(coli_session_t* session);
  /* v1.0 [per-session] Forgets the record and state. */
  coli_status_t (*session_reset)(coli_session_t* session, coli_error_t* error);

  /* v1.0 [per-session] Prefills a prompt (see coli_prefill_args_t for reuse). Computes the
   * logits of the last prompt position. On CANCELLED (or any error) no half-computed state is
   * kept: the session's record is consistent (reset, its previous record, or extended by the
   * whole chunks that completed), and the next prefill reuses whatever prefix still matches. */
  coli_status_t (*prefill)(coli_session_t* session, const coli_prefill_args_t* args,
                           coli_prefill_result_t* result, coli_error_t* error);

  /* v1.0 [per-session for each row] One decode step for each row: first feeds the token that
   * the previous step of that session sampled (none right after prefill), then samples the next
   * token from the logits. A sampled token enters the session's record only when the next step
   * feeds it. Rows must name distinct sessions. A failing row fails the call. */
  coli_status_t (*decode)(const coli_decode_args_t* args, coli_error_t* error);

  /* v1.0 [per-session] Session statistics, cumulative since creation or reset. Writes
   * min(capacity, count) entries into `stats` and the number available into *count. */
  coli_status_t (*session_stats)(coli_session_t* session, coli_stat_t* stats, size_t capacity,
                                 size_t* count, coli_error_t* error);

  /* v1.1 [per-session] The token ids the session's state was built from (its record). */
  coli_status_t (*session_record)(coli_session_t* session, coli_token_buffer_t* out,
                                  coli_error_t* error);

  /* v1.2 [per-model] The model's current values (gauges: resident bytes, cache occupancy, …),
   * not cumulative and not per session, so the host reports them as they are instead of
   * summing sessions. Same calling convention as session_stats. */
  coli_status_t (*model_stats)(coli_model_t* model, coli_stat_t* stats, size_t capacity,
                               size_t* count, coli_error_t* error);

  /* v1.6 [per-model; per-session for `session`] How many leading tokens of `prompt` would not
   * run again if it were prefilled now on `session` (its record when the prompt extends it, a
   * checkpoint it holds, state the model shares between sessions), or on a new session when
   * `session` is NULL. Changes nothing: no cache counts it as a use. The host asks it for each
   * free pooled session to place a request where the least is computed and lost. */
  coli_status_t (*session_reusable)(coli_model_t* model, coli_session_t* session,
                                    const int32_t* prompt, size_t n_prompt, uint64_t* tokens,
                                    coli_error_t* error);

  /* v1.8 The family's environment switches (coli_switch_t), plugin-owned, valid until the
   * plugin is unloaded; NULL with n_switches 0 for none. The host lists them (Health, coli-host
   * --switches) and reads the environment with them for this family's options; it refuses a
   * plugin whose table is malformed (naming the switch). Each entry is read only up to its own
   * struct_size. */
  const coli_switch_t* const* switches;
  size_t n_switches;

  /* v1.11 [per-session for both; may be NULL] Makes `dst` (another session of the same model)
   * hold what `src` holds now: its record and the state built from it, and, right after a
   * prefill of `src` (no decode step since), the last prompt position's logits, so that the
   * next prefill of that same prompt on `dst` computes nothing (tokens_reused = the whole
   * prompt). The host forks one prompt's state into the sessions of an n-choice request
   * (OpenAI `n`) this way: one prefill, then n decode rows. Whatever `dst` held is dropped; on
   * error `dst` is left reset or unchanged and `src` is never changed. NULL: the host prefills
   * each copy itself. */
  coli_status_t (*session_copy)(coli_session_t* dst, coli_session_t* src, coli_error_t* error);
} coli_plugin_api_t;

/* The one exported symbol.
 * [init] Called once right after dlopen. `host` stays valid until the plugin is unloaded.
 * `version` holds the host's version on entry; the plugin overwrites it with its own. Returns
 * the plugin's table (plugin-owned, static), or NULL when the plugin cannot run (it may log
 * why through host->log first). Must not throw. */
typedef const coli_plugin_api_t* (*coli_plugin_entry_fn)(const coli_host_api_t* host,
                                                         coli_abi_version_t* version);

/* The table size of each minor version: a table shorter than its claimed minor's size is
 * refused; a host uses only the entries of min(host minor, plugin minor). */
#define COLI_PLUGIN_API_SIZE_V1_0 (offsetof(coli_plugin_api_t, session_stats) + sizeof(void*))
#define COLI_PLUGIN_API_SIZE_V1_1 (offsetof(coli_plugin_api_t, session_record) + sizeof(void*))
#define COLI_PLUGIN_API_SIZE_V1_2 (offsetof(coli_plugin_api_t, model_stats) + sizeof(void*))
/* 1.3 added decode-row inputs, no table entry: its table is 1.2's. */
#define COLI_PLUGIN_API_SIZE_V1_3 COLI_PLUGIN_API_SIZE_V1_2
/* 1.4 added a prefill input (response_format), no table entry: its table is 1.2's. */
#define COLI_PLUGIN_API_SIZE_V1_4 COLI_PLUGIN_API_SIZE_V1_2
/* 1.5 added a chat event channel (COLI_CHANNEL_TOOL_CALL_DELTA), no table entry. */
#define COLI_PLUGIN_API_SIZE_V1_5 COLI_PLUGIN_API_SIZE_V1_2
#define COLI_PLUGIN_API_SIZE_V1_6 (offsetof(coli_plugin_api_t, session_reusable) + sizeof(void*))
/* 1.7 added prefill inputs and outputs (prompt logprobs), no table entry: its table is 1.6's. */
#define COLI_PLUGIN_API_SIZE_V1_7 COLI_PLUGIN_API_SIZE_V1_6
#define COLI_PLUGIN_API_SIZE_V1_8 (offsetof(coli_plugin_api_t, n_switches) + sizeof(size_t))
/* 1.9 added prefill outputs (prompt-logprob ranks), no table entry: its table is 1.8's. */
#define COLI_PLUGIN_API_SIZE_V1_9 COLI_PLUGIN_API_SIZE_V1_8
/* 1.10 added a switch target (COLI_SWITCH_FIELD_REQUEST), no table entry: its table is 1.8's. */
#define COLI_PLUGIN_API_SIZE_V1_10 COLI_PLUGIN_API_SIZE_V1_8
#define COLI_PLUGIN_API_SIZE_V1_11 (offsetof(coli_plugin_api_t, session_copy) + sizeof(void*))

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* COLI_PLUGIN_API_COLI_PLUGIN_H_ */
