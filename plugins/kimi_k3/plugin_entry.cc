// plugins/kimi_k3/plugin_entry: the Kimi K3 family behind the coli plugin ABI
// (plugin_api/coli_plugin.h) — build/plugins/libcoli_kimi_k3.so.
//
// Glue only: the model is kimi_k3_core (model.h, session.h), the chat format kimi_k3_chat
// (chat.h, chat_parser.h), routed experts the streaming store (expert_store.h), tokens
// common/tokenizer, sampling common/sampling. Per session it keeps the pending token (sampled,
// fed by the next decode step), the logits of the last position, a seeded sampler, the streaming
// UTF-8 decoder and, for chat sessions, the XTML output parser.
//
// Threads: the model's expert source serves one forward pass at a time, so every prefill and
// decode pass of a model's sessions takes that model's forward lock (the host may run sessions
// of one model on several threads). Expert statistics are taken right after each pass under the
// same lock, so they are attributed to the session(s) that caused them.
// Decode batches: one decode call's rows (distinct sessions) are fed in one forward pass per
// model (Session::StepBatch), then each row samples from its own logits (Decode, Feed).
// Mixed passes (option "mix_rows", docs/status/batching.md): while a prefill of the model runs
// its chunks, a decode call's plain rows of that model do not wait for the lock to run a pass
// of their own: they queue (Ride) and the prefill's next chunk pass carries them
// (Session::Prefill's Riders, PrefillRiders) — one Model::Forward for the chunk and those rows —
// then each row samples as usual. Rows that need their own pass (speculative verify rows, a
// group over the per-pass bound) and rows under K3_TRACE never ride; rows still queued when the
// model's last running prefill ends (done, failed or cancelled) run on their own.
// Speculative decoding (option "spec" = K, COLI_K3_SPEC; docs/status/spec-decoding.md): a row
// whose record offers a prompt-lookup draft (spec_lookup.h) is verified alone as one chunk
// (spec_decode.h); the tokens it accepts are handed out by the next decode calls without a pass.
// A greedy row accepts a draft token while it is the argmax, a sampled row while a copy of its
// sampler draws it (so the real sampler later draws the same tokens: seeded streams unchanged).
// Sampling knobs (ABI 1.3, docs/status/sampling.md): each session keeps the history the
// penalties read (the prompt of its last prefill and the tokens sampled since); a row with any
// penalty or logit_bias is verified with a copy of that history too, advanced row by row.
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <filesystem>
#include <fstream>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <sstream>
#include <string>
#include <string_view>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/io/io.h"
#include "common/log/log.h"
#include "common/sampling/sampling.h"
#include "common/status/status.h"
#include "common/tokenizer/tokenizer.h"
#include "nlohmann/json.hpp"
#include "plugin_api/coli_plugin.h"
#include "plugin_api/cpp/abi_util.h"
#include "plugin_api/cpp/plugin_table.h"
#include "plugins/kimi_k3/chat.h"
#include "plugins/kimi_k3/chat_parser.h"
#include "plugins/kimi_k3/checkpoints.h"
#include "plugins/kimi_k3/constrained.h"
#include "plugins/kimi_k3/expert_store.h"
#include "plugins/kimi_k3/model.h"
#include "plugins/kimi_k3/prefix_cache.h"
#include "plugins/kimi_k3/prefix_cache_tag.h"
#include "plugins/kimi_k3/prompt_logprob_memo.h"
#include "plugins/kimi_k3/session.h"
#include "plugins/kimi_k3/spec_decode.h"
#include "plugins/kimi_k3/spec_lookup.h"
#include "plugins/kimi_k3/switches.h"
#include "plugins/kimi_k3/vk_tier.h"

namespace coli::k3 {
namespace {

using abi::FillBytes;
using abi::FillTokens;
using abi::Str;
using abi::View;
using Clock = std::chrono::steady_clock;

// Context capacity when K3_MAXT is not given (the reference server's default, spec §7.1).
constexpr int64_t kDefaultContext = 8192;
// Prompt logprobs kept for reuse (K3: 176 bytes per position, ~380k positions).
constexpr size_t kPromptLogprobMemoBytes = size_t{64} << 20;

const coli_host_api_t* g_host = nullptr;
// The host's ABI minor (coli_plugin_entry): 1.5+ hosts get tool-call deltas.
uint32_t g_host_minor = 0;

class Ride;

struct K3Model {
  std::string dir;
  std::unique_ptr<Model> model;
  std::unique_ptr<tok::Tokenizer> tokenizer;
  StreamingExpertStore* store = nullptr;  // owned by `model`
  int64_t capacity = kDefaultContext;
  std::string name;
  std::vector<std::string> special_texts;
  std::vector<coli_special_token_t> specials;
  std::vector<int32_t> stop_ids;
  int32_t bos = -1, eos = -1;
  int32_t end_of_msg = -1;     // XTML message end (checkpoint placement); -1 if absent
  int checkpoint_slots = 0;    // COLI_K3_CKPT: per session
  std::string checkpoint_dir;  // COLI_K3_CKPT_DIR: parked there instead of in RAM
  // Bytes the checkpoint caches of all this model's sessions hold now (a model stat: a current
  // value, which session_stats must not report since the host sums those as counters).
  std::atomic<int64_t> checkpoint_bytes{0};
  // The prefix cache shared by all the model's sessions (prefix_cache.h; option prefix_cache in
  // MiB = COLI_K3_PREFIX_CACHE_MB, 0 = off; prefix_cache_min tokens = COLI_K3_PREFIX_CACHE_MIN;
  // parked in checkpoint_dir when that is set).
  int64_t prefix_cache_mb = 0;
  int64_t prefix_cache_min = PrefixCache::kDefaultMinTokens;
  bool prefix_cache_keep = false;  // COLI_K3_PREFIX_CACHE_KEEP: its files outlive the process
  std::unique_ptr<PrefixCache> prefix_cache;
  // Recent prompts' logprobs at full depth (prompt_logprob_memo.h): a prompt-logprobs prefill
  // keeps a state (record, checkpoint, prefix cache entry) only where these hold the entries of
  // the kept positions.
  std::unique_ptr<PromptLogprobMemos> logprob_memos =
      std::make_unique<PromptLogprobMemos>(kPromptLogprobMemoBytes);
  // The Vulkan expert tier (vk_tier.h): its switches as the client sent them, the tier (owned
  // by `model`; null unless COLI_VULKAN=1 / K3_VK=1) and its counters at the last take.
  VkSwitches vk_switches;
  VkExpertTier* vk_tier = nullptr;
  VkTierStats vk_taken;
  bool mmap = false;  // K3_MMAP: map a repacked container's matrices (weights.h)
  int verify = -1;  // K3_VERIFY: 1 all, 0 none, -1 (unset) all but the K3_MMAP-mapped ones
  // COLI_K3_SPEC: max draft tokens per verify (0 = off); the lookup's n-gram range.
  int spec_max = 0;
  int spec_ngram_max = 3, spec_ngram_min = 1;
  DraftPolicy spec_policy;  // COLI_K3_SPEC_MIN / _SAMPLED_NGRAM / _ADAPT (spec_decode.h)
  uint32_t capabilities = 0;
  // One forward pass at a time per model; `forward_waiting` counts the threads waiting for it,
  // so a long prefill can let them in between its chunks (ForwardLock::LetWaitingIn).
  std::mutex forward_mu;
  std::atomic<int> forward_waiting{0};
  std::atomic<uint64_t> forward_entries{0};  // times the lock was taken
  // Mixed passes: at most `mix_rows` decode rows ride one prefill chunk pass (option mix_rows,
  // COLI_K3_MIX_ROWS; 0 = off; default max(8, K3_CHUNK)). Under mix_mu: the prefills running
  // their chunks now and the rides waiting for one of their passes (FIFO); mix_cv wakes the
  // decode threads whose ride was carried or released.
  int mix_rows = -1;
  mutable std::mutex mix_mu;
  std::condition_variable mix_cv;
  int mix_prefills = 0;
  std::deque<Ride*> mix_queue;
  // response_format (ABI 1.4): the vocabulary's token filter, built by the first constrained
  // prefill (a trie over every token's bytes) and kept for the model's life.
  std::mutex constraint_mu;
  std::unique_ptr<ConstraintVocab> constraint_vocab;
};

// The model's forward lock, counted while waited for.
class ForwardLock {
 public:
  explicit ForwardLock(K3Model& m) : m_(m), lock_(m.forward_mu, std::defer_lock) { Lock(); }
  void Lock() {
    m_.forward_waiting.fetch_add(1);
    lock_.lock();
    m_.forward_waiting.fetch_sub(1);
    m_.forward_entries.fetch_add(1);
  }
  void Unlock() { lock_.unlock(); }
  // Unlocked: lets the passes waiting for the model right now take it first (they announced
  // themselves before blocking; std::mutex alone would let this thread win again at once).
  // Bounded, so a stuck waiter cannot stall the caller.
  void LetWaitingIn() {
    if (m_.forward_waiting.load() == 0) return;
    const uint64_t entries = m_.forward_entries.load();
    const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(200);
    // Until one of them has taken the lock (then this thread queues behind it).
    while (m_.forward_entries.load() == entries && m_.forward_waiting.load() > 0 &&
           std::chrono::steady_clock::now() < until) {
      std::this_thread::yield();
    }
  }

 private:
  K3Model& m_;
  std::unique_lock<std::mutex> lock_;
};

// One session's share of a model-wide byte gauge: Set() moves the total by the change, and the
// share leaves the total when the session is reset or destroyed.
class GaugeShare {
 public:
  GaugeShare() = default;
  GaugeShare(GaugeShare&& o) noexcept : total_(o.total_), counted_(o.counted_) {
    o.total_ = nullptr;
    o.counted_ = 0;
  }
  GaugeShare& operator=(GaugeShare&& o) noexcept {
    if (this != &o) {
      Release();
      total_ = o.total_;
      counted_ = o.counted_;
      o.total_ = nullptr;
      o.counted_ = 0;
    }
    return *this;
  }
  ~GaugeShare() { Release(); }

  void Set(std::atomic<int64_t>* total, int64_t now) {
    if (total_ != total) Release();
    total_ = total;
    *total_ += now - counted_;
    counted_ = now;
  }

 private:
  void Release() {
    if (total_ != nullptr) *total_ -= counted_;
    total_ = nullptr;
    counted_ = 0;
  }
  std::atomic<int64_t>* total_ = nullptr;
  int64_t counted_ = 0;
};

struct K3Session {
  K3Model* m = nullptr;
  std::unique_ptr<Session> session;
  std::unique_ptr<CheckpointCache> checkpoints;
  GaugeShare checkpoint_share;        // this session's part of K3Model::checkpoint_bytes
  SpecDecoder spec;                   // verified tokens not yet handed out (option "spec")
  DraftBudget spec_budget;            // how long the next draft is (adapts to acceptance)
  std::vector<int32_t> spec_context;  // scratch: the record + the pending token
  int64_t capacity = 0;
  std::vector<float> logits;  // after the last fed position; empty before the first prefill
  // Set by a copy of a session right after its prefill (ABI 1.11 session_copy): the copied
  // prompt's last logits, so that the next prefill of exactly that prompt computes nothing.
  // Dropped by that prefill (used or not).
  std::vector<float> copied_logits;
  int32_t pending = -1;
  uint64_t seed = 0;
  uint64_t steps = 0;  // decode steps since the prefill (reseeds a sampler whose knobs change)
  std::optional<sampling::Sampler> sampler;
  sampling::TokenHistory history;  // the penalties' view: the prompt + the tokens sampled since
  std::unique_ptr<tok::StreamDecoder> decoder;
  std::optional<OutputParser> parser;
  // response_format (ABI 1.4): this generation's constraint (none without one) and the masked
  // copy of the logits the constrained row samples from.
  std::optional<AnswerConstraint> constraint;
  std::vector<float> masked;
  // Outputs of the last step (valid until the next call on the session).
  std::string text;
  std::vector<coli_logprob_t> top;
  std::vector<coli_logprob_t> prompt_logprobs;  // of the last prefill that asked (ABI 1.7)
  std::vector<int64_t> prompt_logprob_ranks;    // its prompt tokens' ranks (ABI 1.9)
  // The record length `logits` follow when the last prefill left them (a later decode or
  // speculative step changes the record, so a mismatch tells); -1 otherwise.
  size_t logits_at = static_cast<size_t>(-1);
  std::vector<std::string> event_texts;
  std::vector<coli_chat_event_t> events;
  // Statistics since creation or reset.
  double prompt_tokens = 0, reused = 0, computed = 0, generated = 0;
  double compute_seconds = 0;
  double checkpoint_restores = 0, checkpoint_tokens = 0;
  // Prefills that began from the model's prefix cache, and the tokens restored by them (also
  // counted in `reused`).
  double prefix_restores = 0, prefix_tokens = 0;
  // Copies made into this session (ABI 1.11) and the record tokens they brought.
  double copies = 0, copied_tokens = 0;
  // Decode steps whose forward pass held more than one row, and those passes' rows summed
  // (mean batch = batched_rows / batched_steps); Feed() tells how a pass's costs are shared.
  double batched_steps = 0, batched_rows = 0;
  // Forward passes decode ran for this session (fed steps and verify passes; a rejected draft or
  // a rewind is replayed without one), and the speculative-decoding counters
  // (docs/status/spec-decoding.md): spec_rejections = verify passes with a rejected draft token,
  // spec_replays = rows replayed (Session::Replay) by those verifies and by rewinds.
  double decode_passes = 0;
  double spec_drafts = 0, spec_draft_tokens = 0, spec_accepted = 0, spec_from_buffer = 0;
  double spec_rejections = 0, spec_replays = 0, spec_rewinds = 0;
  // Mixed passes: prefill chunk passes of this session that carried decode rows of others
  // (mixed_passes) and those rows summed (mixed_rows); decode steps of this session carried by
  // another session's prefill pass (decode_rides; not in decode_passes: no pass of their own).
  double mixed_passes = 0, mixed_rows = 0, decode_rides = 0;
  ExpertStoreStats experts;
  // Vulkan tier counters attributed to this session (passes split like the expert stats).
  double vk_matmuls = 0, vk_hits = 0, vk_promotions = 0, vk_evictions = 0;
  double vk_dense_calls = 0;  // shared-expert blocks computed on the device (COLI_VK_DENSE)
};

// The session's record as delivered to the host: without the verified tokens still buffered.
int64_t DeliveredLength(const K3Session& s) {
  return s.session->position() - static_cast<int64_t>(s.spec.undelivered());
}

// ---- probe and open -----------------------------------------------------------------------

absl::Status Probe(const std::string& dir, int32_t* serves) {
  *serves = 0;
  // Unreadable (missing, a folder, a FIFO that would block an ifstream): not a model this
  // family serves; the host then says why.
  absl::StatusOr<std::string> text = io::ReadFileToString(dir + "/config.json", 64 << 20);
  if (!text.ok()) return absl::OkStatus();
  auto config = nlohmann::json::parse(*text, nullptr, /*allow_exceptions=*/false);
  if (!config.is_object()) return absl::OkStatus();
  if (config.value("model_type", nlohmann::json()) == "kimi_k3") *serves = 1;
  auto arch = config.find("architectures");
  if (arch != config.end() && arch->is_array()) {
    for (const auto& a : *arch) {
      if (a.is_string() && a.get<std::string>().rfind("KimiK3", 0) == 0) *serves = 1;
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<ModelOptions> ToOptions(const coli_model_options_t* o) {
  ModelOptions out;
  if (o == nullptr) return out;
  // 0 = unset: a repacked container then keeps its own format (weights.h).
  if (o->bits != 0) out.bits = o->bits, out.bits_set = true;
  if (o->mla_bits != 0) out.mla_bits = o->mla_bits, out.mla_bits_set = true;
  if (o->head_bits != 0) out.head_bits = o->head_bits, out.head_bits_set = true;
  out.idot = o->idot != 0;
  // 0 = unset (the default); a negative value goes on to be refused by name (model.cc).
  if (o->chunk != 0) out.chunk = o->chunk;
  out.direct = o->direct != 0;
  out.pipe = o->pipe != 0;
  if (o->load_threads != 0) out.load_threads = o->load_threads;
  out.expert_gb = o->expert_gb;
  out.topp = o->topp;
  out.max_context = o->max_context;
  out.layers = o->layers;
  out.threads = o->threads;
  if (o->mla_norm_eps != 0) out.mla_latent_norm_eps = static_cast<float>(o->mla_norm_eps);
  for (size_t i = 0; i < o->n_extra_dirs; ++i) {
    out.extra_dirs.emplace_back(View(o->extra_dirs[i]));
  }
  out.trace_path = std::string(View(o->trace_path));
  out.x0_path = std::string(View(o->x0_path));
  out.logits_path = std::string(View(o->logits_path));
  if (!out.x0_path.empty()) {
    return absl::UnimplementedError(
        "kimi_k3: K3_X0 (injected input rows) is a k3-run validation mode, not served");
  }
  return out;
}

// Max draft tokens of option "spec" (COLI_K3_SPEC).
constexpr int kMaxSpec = 16;

// The family's own options (coli_model_options_t::extra): "ckpt" = checkpoint slots per
// session (COLI_K3_CKPT), "ckpt_dir" (COLI_K3_CKPT_DIR), "spec" = max draft tokens of
// speculative decoding (COLI_K3_SPEC, 0 = off), "spec_ngram_max" / "spec_ngram_min" = the
// prompt-lookup n-gram lengths (default 3 / 1), "mix_rows" = most decode rows one prefill
// chunk pass carries (COLI_K3_MIX_ROWS; 0 = off; default max(8, K3_CHUNK)), "prefix_cache" =
// MiB of the model's shared prefix cache (COLI_K3_PREFIX_CACHE_MB, 0 = off), "prefix_cache_min"
// = the shortest prefix it keeps, in tokens (COLI_K3_PREFIX_CACHE_MIN, default 32),
// "prefix_cache_keep" = 1 keeps its files in ckpt_dir across restarts (COLI_K3_PREFIX_CACHE_KEEP;
// prefix_cache_tag.h).
absl::Status ReadExtraOptions(const coli_model_options_t* o, K3Model* k) {
  for (size_t i = 0; o != nullptr && i < o->n_extra; ++i) {
    const std::string key(View(o->extra[i].key)), value(View(o->extra[i].value));
    COLI_ASSIGN_OR_RETURN(const bool policy_switch,
                          ParseDraftPolicySwitch(key, value, &k->spec_policy));
    if (policy_switch) continue;
    if (key == "spec") {
      if (!absl::SimpleAtoi(value, &k->spec_max) || k->spec_max < 0 || k->spec_max > kMaxSpec) {
        return absl::InvalidArgumentError(absl::StrCat("kimi_k3: option spec (COLI_K3_SPEC) = '",
                                                       value, "' is not a draft length in 0…",
                                                       kMaxSpec));
      }
    } else if (key == "spec_ngram_max" || key == "spec_ngram_min") {
      int* n = key == "spec_ngram_max" ? &k->spec_ngram_max : &k->spec_ngram_min;
      if (!absl::SimpleAtoi(value, n) || *n < 1 || *n > 8) {
        return absl::InvalidArgumentError(absl::StrCat("kimi_k3: option ", key, " = '", value,
                                                       "' is not an n-gram length in 1…8"));
      }
    } else if (key == "mix_rows") {
      if (!absl::SimpleAtoi(value, &k->mix_rows) || k->mix_rows < 0 || k->mix_rows > 4096) {
        return absl::InvalidArgumentError(absl::StrCat(
            "kimi_k3: option mix_rows (COLI_K3_MIX_ROWS) = '", value,
            "' is not a row count in 0…4096 (0 = decode rows never ride a prefill pass)"));
      }
    } else if (key == "ckpt") {
      if (!absl::SimpleAtoi(value, &k->checkpoint_slots) || k->checkpoint_slots < 0 ||
          k->checkpoint_slots > 1024) {
        return absl::InvalidArgumentError(absl::StrCat("kimi_k3: option ckpt (COLI_K3_CKPT) = '",
                                                       value, "' is not a slot count in 0…1024"));
      }
    } else if (key == "prefix_cache" || key == "prefix_cache_min") {
      const bool mb = key == "prefix_cache";
      int64_t* n = mb ? &k->prefix_cache_mb : &k->prefix_cache_min;
      if (!absl::SimpleAtoi(value, n) || *n < (mb ? 0 : 1) || *n > (int64_t{1} << 24)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "kimi_k3: option ", key,
            mb ? " (COLI_K3_PREFIX_CACHE_MB) = '" : " (COLI_K3_PREFIX_CACHE_MIN) = '", value,
            mb ? "' is not a size in MiB in 0…16777216 (0 = off)"
               : "' is not a token count in 1…16777216"));
      }
    } else if (key == "prefix_cache_keep") {
      if (value != "0" && value != "1") {
        return absl::InvalidArgumentError(absl::StrCat(
            "kimi_k3: option prefix_cache_keep (COLI_K3_PREFIX_CACHE_KEEP) = '", value,
            "' is not 0 or 1"));
      }
      k->prefix_cache_keep = value == "1";
    } else if (key == "mmap") {
      if (value != "0" && value != "1") {
        return absl::InvalidArgumentError(
            absl::StrCat("kimi_k3: option mmap (K3_MMAP) = '", value, "' is not 0 or 1"));
      }
      k->mmap = value == "1";
    } else if (key == "verify") {
      if (value != "0" && value != "1") {
        return absl::InvalidArgumentError(
            absl::StrCat("kimi_k3: option verify (K3_VERIFY) = '", value, "' is not 0 or 1"));
      }
      k->verify = value == "1" ? 1 : 0;
    } else if (key == "ckpt_dir") {
      std::error_code ec;
      if (!std::filesystem::is_directory(value, ec) || access(value.c_str(), W_OK) != 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("kimi_k3: option ckpt_dir (COLI_K3_CKPT_DIR) = '", value,
                         "' is not a writable folder"));
      }
      k->checkpoint_dir = value;
    } else if (key == "vulkan") {  // the Vulkan tier's switches, resolved in Open (vk_tier.h)
      k->vk_switches.coli_vulkan = value;
    } else if (key == "vk") {
      k->vk_switches.k3_vk = value;
    } else if (key == "vk_tier_gb") {
      k->vk_switches.tier_gb = value;
    } else if (key == "vk_gb") {
      k->vk_switches.k3_vk_gb = value;
    } else if (key == "vk_tier_rate") {
      k->vk_switches.tier_rate = value;
    } else if (key == "vk_up") {
      k->vk_switches.k3_vk_up = value;
    } else if (key == "vk_dense") {
      k->vk_switches.vk_dense = value;
    } else if (key == "vk_tier") {
      k->vk_switches.vk_tier = value;
    } else if (key == "vk_device") {
      k->vk_switches.vk_device = value;
    } else if (key == "vk_staging") {
      k->vk_switches.vk_staging = value;
    } else {
      return absl::InvalidArgumentError(absl::StrCat("kimi_k3: unknown option '", key, "'"));
    }
  }
  if (k->spec_ngram_min > k->spec_ngram_max) {
    return absl::InvalidArgumentError(
        absl::StrCat("kimi_k3: option spec_ngram_min = ", k->spec_ngram_min,
                     " exceeds spec_ngram_max = ", k->spec_ngram_max));
  }
  // No draft is longer than spec: a shortest draft above it would switch speculation off
  // without a word.
  if (k->spec_max > 0 && k->spec_policy.min_tokens > k->spec_max) {
    return absl::InvalidArgumentError(
        absl::StrCat("kimi_k3: option spec_min (COLI_K3_SPEC_MIN) = ", k->spec_policy.min_tokens,
                     " exceeds spec (COLI_K3_SPEC) = ", k->spec_max,
                     ": no draft would be long enough to verify"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<K3Model>> Open(const coli_model_open_args_t& args) {
  auto k = std::make_unique<K3Model>();
  k->dir = std::string(View(args.model_dir));
  COLI_ASSIGN_OR_RETURN(ModelOptions options, ToOptions(args.options));
  COLI_RETURN_IF_ERROR(ReadExtraOptions(args.options, k.get()));
  if (k->prefix_cache_keep && k->checkpoint_dir.empty()) {
    return absl::InvalidArgumentError(
        "kimi_k3: option prefix_cache_keep (COLI_K3_PREFIX_CACHE_KEEP=1) needs ckpt_dir "
        "(COLI_K3_CKPT_DIR): the entries are kept as files there");
  }
  COLI_RETURN_IF_ERROR(k->vk_switches.Resolve(&options));
  options.mmap = k->mmap;
  // Unset: everything read is checked, but not the whole mapped container at load under
  // K3_MMAP (its start stays fast; experts are still checked on their first read).
  options.verify_checksums = k->verify != 0;
  options.verify_mapped = k->verify == 1 || !options.mmap;
  if (!k->checkpoint_dir.empty()) RemoveOrphanedParkedFiles(k->checkpoint_dir);
  if (k->prefix_cache_mb > 0 && (!options.trace_path.empty() || !options.logits_path.empty())) {
    // A restored prefix would leave its rows out of those dumps (they hold every row run).
    COLI_LOG(kWarning)
        << "kimi_k3: the prefix cache (prefix_cache) is off under K3_TRACE/K3_LOGITS";
  } else if (k->prefix_cache_mb > 0) {
    // With COLI_K3_CKPT_DIR its entries are parked in that folder too (the budget then counts
    // the files); with prefix_cache_keep they are named by what the states depend on and
    // outlive this process.
    std::string keep_tag;
    if (k->prefix_cache_keep) {
      absl::StatusOr<std::string> tag = PrefixCacheTag(k->dir, options);
      if (tag.ok()) {
        keep_tag = *std::move(tag);
      } else {
        COLI_LOG(kWarning) << "kimi_k3: prefix cache entries will not outlive this process: "
                           << tag.status();
      }
    }
    k->prefix_cache = std::make_unique<PrefixCache>(static_cast<size_t>(k->prefix_cache_mb) << 20,
                                                    k->prefix_cache_min, k->checkpoint_dir,
                                                    keep_tag);
  } else if (k->prefix_cache_keep) {
    COLI_LOG(kWarning) << "kimi_k3: COLI_K3_PREFIX_CACHE_KEEP is set but the prefix cache is off "
                          "(COLI_K3_PREFIX_CACHE_MB)";
  }
  COLI_ASSIGN_OR_RETURN(k->tokenizer, tok::Tokenizer::LoadDir(k->dir));
  // Routed experts come from the streaming LRU store, sized by K3_EXPERT_GB & co.
  ExpertStoreOptions store_options;
  store_options.expert_gb = options.expert_gb;
  store_options.direct = options.direct;
  store_options.pipe = options.pipe;
  store_options.load_threads = options.load_threads;
  store_options.verify_checksums = options.verify_checksums;
  K3Model* raw = k.get();
  Model::ExpertSourceFactory experts =
      [raw, store_options](st::Snapshot& snapshot, const Config&, const std::string&,
                           int) -> absl::StatusOr<std::unique_ptr<ExpertSource>> {
    COLI_ASSIGN_OR_RETURN(ExpertStoreLayout layout, DiscoverExpertLayout(&snapshot));
    COLI_ASSIGN_OR_RETURN(std::unique_ptr<StreamingExpertStore> store,
                          StreamingExpertStore::Open(&snapshot, layout, store_options));
    raw->store = store.get();
    return std::unique_ptr<ExpertSource>(std::move(store));
  };
  // COLI_VULKAN=1 / K3_VK=1: the store behind the Vulkan expert tier (the device is opened here;
  // UNAVAILABLE without one). Off: the store alone, the device never opened.
  experts = ExpertSourceFactoryFor(options, k->dir, std::move(experts), &raw->vk_tier);
  bool cancelled = false;
  Model::Progress progress = [&](int done, int total) {
    if (args.progress != nullptr && !cancelled &&
        args.progress(args.progress_user, static_cast<uint64_t>(done), static_cast<uint64_t>(total),
                      "tensors", 7) != 0) {
      cancelled = true;
    }
  };
  auto model = Model::Load(k->dir, options, progress, experts);
  if (cancelled) return absl::CancelledError(absl::StrCat("loading '", k->dir, "' cancelled"));
  if (!model.ok()) return model.status();
  k->model = std::move(model).value();
  k->capacity = options.max_context > 0 ? options.max_context : kDefaultContext;
  if (k->mix_rows < 0) k->mix_rows = std::max(8, options.chunk);
  if (k->spec_max > 0 && (!options.trace_path.empty() || !options.logits_path.empty())) {
    // Verify and rewind passes would add rows that were never delivered to those dumps.
    COLI_LOG(kWarning) << "kimi_k3: speculative decoding (spec) is off under K3_TRACE/K3_LOGITS";
    k->spec_max = 0;
  }

  const Config& cfg = k->model->config();
  k->name = "KimiK3ForConditionalGeneration";
  k->bos = static_cast<int32_t>(cfg.bos_token_id);
  for (int64_t id : cfg.eos_token_ids) k->stop_ids.push_back(static_cast<int32_t>(id));
  if (!cfg.eos_token_ids.empty()) k->eos = static_cast<int32_t>(cfg.eos_token_ids.front());
  if (auto eom = k->tokenizer->TokenId(kEndOfMsgToken)) {
    k->end_of_msg = *eom;
    if (std::find(k->stop_ids.begin(), k->stop_ids.end(), *eom) == k->stop_ids.end()) {
      k->stop_ids.push_back(*eom);
    }
  }
  for (int32_t id = k->tokenizer->num_base_tokens(); id < k->tokenizer->vocab_size(); ++id) {
    std::string_view text = k->tokenizer->TokenBytes(id);
    if (!k->tokenizer->IsSpecial(id) || text.rfind("<|reserved_token_", 0) == 0) continue;
    k->special_texts.emplace_back(text);
  }
  for (int32_t id = k->tokenizer->num_base_tokens(), i = 0; id < k->tokenizer->vocab_size(); ++id) {
    std::string_view text = k->tokenizer->TokenBytes(id);
    if (!k->tokenizer->IsSpecial(id) || text.rfind("<|reserved_token_", 0) == 0) continue;
    k->specials.push_back({Str(k->special_texts[i++]), id, 0});
  }
  k->capabilities = COLI_CHAT_CAP_LOGPROBS;
  if (FindStructuralIds(*k->tokenizer).ok()) {
    k->capabilities |= COLI_CHAT_CAP_TEMPLATE | COLI_CHAT_CAP_THINKING | COLI_CHAT_CAP_TOOLS;
  }
  COLI_LOG(kInfo) << "kimi_k3: " << k->dir << ": " << k->model->num_layers() << " layers, vocab "
                  << k->model->vocab_size() << ", context " << k->capacity;
  return k;
}

absl::Status Info(K3Model* k, coli_model_info_t* info) {
  if (!COLI_ABI_HAS_FIELD(info, coli_model_info_t, n_stop_ids)) {
    return absl::InvalidArgumentError("coli_model_info_t struct_size too small");
  }
  info->family = Str("kimi_k3");
  info->name = Str(k->name);
  info->vocab_size = static_cast<int32_t>(k->model->vocab_size());
  info->bos_id = k->bos;
  info->eos_id = k->eos;
  info->chat_capabilities = k->capabilities;
  info->context_capacity = k->capacity;
  info->special_tokens = k->specials.data();
  info->n_special_tokens = k->specials.size();
  info->stop_ids = k->stop_ids.data();
  info->n_stop_ids = k->stop_ids.size();
  return absl::OkStatus();
}

absl::Status Render(K3Model* k, const coli_chat_render_args_t* args,
                    coli_chat_render_result_t* result) {
  COLI_ASSIGN_OR_RETURN(Json request, ParseRequestBody(View(args->request_json)));
  if (!args->add_generation_prompt) {
    request["chat_template_kwargs"]["add_generation_prompt"] = false;
  }
  COLI_ASSIGN_OR_RETURN(RenderedChat chat, RenderChat(request, *k->tokenizer));
  FillTokens(&result->tokens, chat.ids);
  FillBytes(&result->text, chat.text);
  result->chat_parse_mode = ParseModeFor(chat);
  return absl::OkStatus();
}

// ---- sessions -----------------------------------------------------------------------------

// The tier's counters since the last take (caller holds the model's forward lock).
VkTierStats TakeVkStats(K3Model* m) {
  VkTierStats delta;
  if (m->vk_tier == nullptr) return delta;
  const VkTierStats now = m->vk_tier->Stats();
  delta.matmuls = now.matmuls - m->vk_taken.matmuls;
  delta.hits = now.hits - m->vk_taken.hits;
  delta.promotions = now.promotions - m->vk_taken.promotions;
  delta.evictions = now.evictions - m->vk_taken.evictions;
  delta.dense.calls = now.dense.calls - m->vk_taken.dense.calls;
  m->vk_taken = now;
  return delta;
}

// The seed's end-of-turn lines, when the tier is on. Logged from Stats: the host asks for a
// session's statistics once when a request finishes (host/engine.cc), whatever ended the turn
// (stop token, max_tokens, context), so this is where a serve turn ends for the family.
void LogVkTurn(const K3Session& s) {
  if (s.m->vk_tier == nullptr) return;
  std::string lines = VkTierReport(s.m->vk_tier->Stats());
  if (!lines.empty() && lines.back() == '\n') lines.pop_back();
  COLI_LOG(kInfo) << lines;
}

// What forward passes cost since the last take: wall seconds (measured by the caller), the
// expert store's and the Vulkan tier's counters.
struct PassCosts {
  double seconds = 0;
  ExpertStoreStats experts;
  VkTierStats vk;  // counters only (matmuls, hits, promotions, evictions, dense.calls)

  // The share of rows [first, first + count) of a pass of n rows: each row 1/n; integer counts
  // give their remainder to the first rows, so the shares of the n rows sum to the whole.
  PassCosts Share(size_t first, size_t count, size_t n) const {
    auto part = [&](uint64_t v) {
      uint64_t sum = 0;
      for (size_t i = first; i < first + count; ++i) sum += v / n + (i < v % n ? 1 : 0);
      return sum;
    };
    const double f = static_cast<double>(count) / static_cast<double>(n);
    PassCosts c;
    c.seconds = seconds * f;
    c.experts.calls = part(experts.calls);
    c.experts.selections = part(experts.selections);
    c.experts.hits = part(experts.hits);
    c.experts.misses = part(experts.misses);
    c.experts.bytes_read = part(experts.bytes_read);
    c.experts.preads = part(experts.preads);
    c.experts.read_seconds = experts.read_seconds * f;
    c.experts.compute_seconds = experts.compute_seconds * f;
    c.experts.wait_seconds = experts.wait_seconds * f;
    c.experts.wall_seconds = experts.wall_seconds * f;
    c.vk.matmuls = part(vk.matmuls);
    c.vk.hits = part(vk.hits);
    c.vk.promotions = part(vk.promotions);
    c.vk.evictions = part(vk.evictions);
    c.vk.dense.calls = part(vk.dense.calls);
    return c;
  }
};

// The model's counters since the last take, with `seconds` of wall time (caller holds the
// model's forward lock).
PassCosts TakeCosts(K3Model* m, double seconds) {
  PassCosts c;
  c.seconds = seconds;
  if (m->store != nullptr) c.experts = m->store->TakeStats();
  c.vk = TakeVkStats(m);
  return c;
}

void AddCosts(K3Session* s, const PassCosts& c) {
  s->compute_seconds += c.seconds;
  s->experts.Add(c.experts);
  s->vk_matmuls += static_cast<double>(c.vk.matmuls);
  s->vk_hits += static_cast<double>(c.vk.hits);
  s->vk_promotions += static_cast<double>(c.vk.promotions);
  s->vk_evictions += static_cast<double>(c.vk.evictions);
  s->vk_dense_calls += static_cast<double>(c.vk.dense.calls);
}

void TakeExpertStats(K3Session* s) { AddCosts(s, TakeCosts(s->m, 0)); }

// ---- mixed passes: decode rows riding a prefill's chunk passes ------------------------------

// One decode call's plain rows of one model (a Feed group) waiting for, or riding, a prefill's
// chunk pass. It lives on the decode thread's stack; from its queueing until `state` becomes
// kDone or kReleased (under the model's mix_mu) only the carrying prefill touches it.
class Ride {
 public:
  enum class State { kQueued, kBoarded, kDone, kReleased };
  std::vector<Session*> sessions;
  std::vector<int32_t> tokens;
  State state = State::kQueued;
  // kDone: each row's logits, or the carrying pass's error; each row's share of that pass.
  absl::StatusOr<std::vector<std::vector<float>>> logits = absl::UnknownError("not carried");
  std::vector<PassCosts> costs;
};

// Hands `sessions`/`tokens` (a Feed group: distinct sessions of `m`) to a running prefill of
// `m` and waits until its next chunk pass carried them (true: `ride` holds the outcome) or
// until no prefill is left to carry them (false: run them as usual). False at once when no
// prefill runs, mixing is off, under K3_TRACE, or the group exceeds the per-pass bound.
bool RideAlong(K3Model* m, std::span<Session* const> sessions, std::span<const int32_t> tokens,
               Ride* ride) {
  if (m->mix_rows <= 0 || sessions.size() > static_cast<size_t>(m->mix_rows) ||
      !m->model->options().trace_path.empty()) {
    return false;
  }
  std::unique_lock<std::mutex> lock(m->mix_mu);
  if (m->mix_prefills == 0) return false;
  ride->sessions.assign(sessions.begin(), sessions.end());
  ride->tokens.assign(tokens.begin(), tokens.end());
  m->mix_queue.push_back(ride);
  // Never forever: every prefill that registered releases the queue when it is the last to end.
  m->mix_cv.wait(lock, [&] {
    return ride->state == Ride::State::kDone || ride->state == Ride::State::kReleased;
  });
  return ride->state == Ride::State::kDone;
}

// A prefill's riders (Session::Prefill's `riders`), registered with the model while the
// prefill runs its chunks. Before each chunk pass it boards whole rides from the model's queue
// in arrival order while their rows fit the per-pass bound (a ride that does not fit waits for
// the next pass); after the pass it hands each row its logits and its share of the pass's costs.
// Statistics rule: the costs before a mixed pass are the prefill's own; a mixed pass's wall
// time and store/tier counters are split by rows (PassCosts::Share): the chunk's rows go to the
// prefilling session, one row's share to each rider.
// Its destruction unregisters; the last running prefill of the model to end releases every
// ride still queued, which then runs on its own (none waits forever, none is dropped).
class PrefillRiders : public Riders {
 public:
  // `locked_at`: where the prefill's own compute time restarts counting (advanced past a
  // mixed pass, whose time is split here).
  PrefillRiders(K3Session* s, Clock::time_point* locked_at)
      : s_(s), m_(s->m), locked_at_(locked_at) {
    std::lock_guard<std::mutex> lock(m_->mix_mu);
    ++m_->mix_prefills;
  }
  ~PrefillRiders() override {
    {
      std::lock_guard<std::mutex> lock(m_->mix_mu);
      // Boarded rides always alight (Session::Prefill's contract); this only guards against a
      // broken promise: they get an error instead of a wait without end.
      for (Ride* r : boarded_) {
        r->logits = absl::InternalError("kimi_k3: the prefill pass carrying this row ended early");
        r->costs.assign(r->sessions.size(), PassCosts());
        r->state = Ride::State::kDone;
      }
      if (--m_->mix_prefills == 0) {
        for (Ride* r : m_->mix_queue) r->state = Ride::State::kReleased;
        m_->mix_queue.clear();
      }
    }
    m_->mix_cv.notify_all();
  }

  void Board(int64_t chunk_rows, std::vector<Session*>* sessions,
             std::vector<int32_t>* tokens) override {
    {
      std::lock_guard<std::mutex> lock(m_->mix_mu);
      size_t rows = 0;
      while (!m_->mix_queue.empty() &&
             rows + m_->mix_queue.front()->sessions.size() <= static_cast<size_t>(m_->mix_rows)) {
        Ride* r = m_->mix_queue.front();
        m_->mix_queue.pop_front();
        r->state = Ride::State::kBoarded;
        boarded_.push_back(r);
        rows += r->sessions.size();
        sessions->insert(sessions->end(), r->sessions.begin(), r->sessions.end());
        tokens->insert(tokens->end(), r->tokens.begin(), r->tokens.end());
      }
    }
    if (boarded_.empty()) return;
    // What ran before this pass is the prefill's own.
    chunk_rows_ = static_cast<size_t>(chunk_rows);
    pass_start_ = Clock::now();
    AddCosts(s_, TakeCosts(m_, std::chrono::duration<double>(pass_start_ - *locked_at_).count()));
    *locked_at_ = pass_start_;
  }

  void Alight(absl::StatusOr<std::vector<std::vector<float>>> logits, bool ran) override {
    size_t riders = 0;
    for (const Ride* r : boarded_) riders += r->sessions.size();
    if (ran) {
      const auto now = Clock::now();
      const size_t n = chunk_rows_ + riders;
      const PassCosts pass =
          TakeCosts(m_, std::chrono::duration<double>(now - pass_start_).count());
      AddCosts(s_, pass.Share(0, chunk_rows_, n));
      *locked_at_ = now;
      s_->mixed_passes += 1;
      s_->mixed_rows += static_cast<double>(riders);
      size_t row = 0;
      for (Ride* r : boarded_) {
        r->costs.clear();
        std::vector<std::vector<float>> mine;
        for (size_t i = 0; i < r->sessions.size(); ++i, ++row) {
          r->costs.push_back(pass.Share(chunk_rows_ + row, 1, n));
          if (logits.ok()) mine.push_back(std::move((*logits)[row]));
        }
        if (logits.ok()) {
          r->logits = std::move(mine);
        } else {
          r->logits = logits.status();
        }
      }
    }
    {
      std::lock_guard<std::mutex> lock(m_->mix_mu);
      for (Ride* r : boarded_) r->state = ran ? Ride::State::kDone : Ride::State::kReleased;
      boarded_.clear();
    }
    m_->mix_cv.notify_all();
  }

 private:
  K3Session* s_;
  K3Model* m_;
  Clock::time_point* locked_at_;
  std::vector<Ride*> boarded_;
  size_t chunk_rows_ = 0;
  Clock::time_point pass_start_;
};

// Returns the session to its delivered record when verified tokens are still buffered (the host
// ended the turn early or fed another token): checkpoint + replay of the delivered rows under
// the model's lock (no forward pass). On error
// the session is unusable until its next prefill (its logits are dropped).
absl::Status RewindSpec(K3Session* s) {
  if (s->spec.undelivered() == 0) {
    s->spec.Clear();
    return absl::OkStatus();
  }
  absl::StatusOr<std::optional<std::vector<float>>> logits;
  {
    ForwardLock lock(*s->m);
    const auto t0 = Clock::now();
    const int64_t replayed = s->spec.replayed_rows();
    logits = s->spec.Rewind(*s->session);
    s->spec_replays += static_cast<double>(s->spec.replayed_rows() - replayed);
    s->compute_seconds += std::chrono::duration<double>(Clock::now() - t0).count();
    TakeExpertStats(s);
  }
  s->spec_rewinds += 1;
  if (!logits.ok()) {
    s->logits.clear();
    s->session->Reset();
    return logits.status();
  }
  return absl::OkStatus();
}

// The generation's constraint from the prefill args' response_format (ABI 1.4): nullopt when
// there is none (older args, empty, {"type":"text"}); INVALID_ARGUMENT naming the path of a
// format the grammar cannot enforce. The model's vocabulary filter is built on first use.
absl::StatusOr<std::optional<AnswerConstraint>> ConstraintFor(K3Model* m,
                                                              const coli_prefill_args_t& a) {
  if (!COLI_ABI_HAS_FIELD(&a, coli_prefill_args_t, response_format)) return std::nullopt;
  const std::string_view format = View(a.response_format);
  if (format.empty()) return std::nullopt;
  // The family's extension: tool_choice required / named (docs/status/constrained.md).
  std::shared_ptr<const ToolCallSpec> tools;
  std::shared_ptr<const grammar::JsonConstraint> compiled;
  if (IsToolCallFormat(format)) {
    COLI_ASSIGN_OR_RETURN(tools, ParseToolCallSpec(format));
  } else {
    COLI_ASSIGN_OR_RETURN(compiled, grammar::JsonConstraint::FromResponseFormat(format));
    if (compiled == nullptr) return std::nullopt;
  }
  const ConstraintVocab* vocab = nullptr;
  {
    std::lock_guard<std::mutex> lock(m->constraint_mu);
    if (m->constraint_vocab == nullptr) {
      COLI_ASSIGN_OR_RETURN(
          m->constraint_vocab,
          ConstraintVocab::Build(*m->tokenizer, static_cast<int32_t>(m->model->vocab_size()),
                                 m->stop_ids));
    }
    vocab = m->constraint_vocab.get();
  }
  if (tools != nullptr) {
    COLI_ASSIGN_OR_RETURN(AnswerConstraint c, AnswerConstraint::CreateToolCalls(
                                                  std::move(tools), *vocab, a.chat_parse_mode));
    return c;
  }
  COLI_ASSIGN_OR_RETURN(AnswerConstraint c,
                        AnswerConstraint::Create(std::move(compiled), *vocab, a.chat_parse_mode));
  return c;
}

absl::Status Prefill(K3Session* s, const coli_prefill_args_t* a, coli_prefill_result_t* r) {
  if (a->n_tokens == 0) return absl::InvalidArgumentError("EMPTY_PROMPT");
  // A format that cannot be enforced is refused before any work (the session is untouched).
  COLI_ASSIGN_OR_RETURN(std::optional<AnswerConstraint> constraint, ConstraintFor(s->m, *a));
  if (static_cast<int64_t>(a->n_tokens) > s->capacity) {
    return absl::ResourceExhaustedError(
        absl::StrCat("CONTEXT_EXCEEDED prompt_tokens=", a->n_tokens, " capacity=", s->capacity));
  }
  const int32_t vocab = static_cast<int32_t>(s->m->model->vocab_size());
  for (size_t i = 0; i < a->n_tokens; ++i) {
    if (a->tokens[i] < 0 || a->tokens[i] >= vocab) {
      return absl::InvalidArgumentError(
          absl::StrCat("prompt token ", i, " id ", a->tokens[i], " is outside [0, ", vocab, ")"));
    }
  }
  // Prompt logprobs (ABI 1.7) need the logits at every position: a state is kept only where
  // the memos hold the entries of its positions (and of the first token after it, unless the
  // kept state's logits give that one).
  const bool want_logprobs = COLI_ABI_HAS_FIELD(a, coli_prefill_args_t, prompt_logprobs_top_k) &&
                             a->want_prompt_logprobs != 0;
  const int top_k = want_logprobs ? a->prompt_logprobs_top_k : 0;
  if (top_k < 0 || top_k > 20) {
    return absl::InvalidArgumentError(
        absl::StrCat("prompt_logprobs: ", top_k, " top alternatives is outside 0…20"));
  }
  s->prompt_logprobs.clear();
  s->prompt_logprob_ranks.clear();
  // Verified tokens the host never received are not part of the conversation: back to the
  // delivered record first, so prefix reuse and checkpoints see exactly what was delivered.
  if (absl::Status rewound = RewindSpec(s); !rewound.ok()) {
    COLI_LOG(kWarning) << "kimi_k3: rewinding undelivered speculative tokens failed (" << rewound
                       << "); the prompt is prefilled from the start";
  }
  std::span<const int32_t> prompt(a->tokens, a->n_tokens);
  const std::vector<int32_t>& record = s->session->tokens();
  size_t keep = 0;
  absl::StatusOr<std::vector<float>> logits;  // set here only when a checkpoint covers it all
  std::shared_ptr<const PromptLogprobMemo> memo;
  size_t memo_shared = 0;  // the memo holds the entries of prompt positions [1, memo_shared)
  if (want_logprobs) std::tie(memo, memo_shared) = s->m->logprob_memos->LongestShared(prompt);
  // Whether a state kept at `kept` tokens leaves every prompt logprob known: those of the kept
  // positions from the memo, the next one from the memo or the state's logits.
  auto entries_known = [&](size_t kept, bool has_logits) {
    if (!want_logprobs || kept == 0) return true;
    return kept <= memo_shared && (kept == prompt.size() || kept < memo_shared || has_logits);
  };
  // The session's logits are the record's last row only as a prefill left them (decode and
  // speculation move both).
  const bool record_logits = !s->logits.empty() && s->logits_at == record.size();
  const bool extends = record.size() < prompt.size() &&
                       std::equal(record.begin(), record.end(), prompt.begin()) &&
                       entries_known(record.size(), record_logits);
  // A copy of a session right after its prefill (ABI 1.11) holds exactly this prompt and its
  // last logits: nothing is left to compute.
  std::vector<float> copied_logits = std::move(s->copied_logits);
  s->copied_logits.clear();
  const bool copied = !want_logprobs && !copied_logits.empty() && record.size() == prompt.size() &&
                      std::equal(record.begin(), record.end(), prompt.begin());
  const Checkpoint* c = !extends && !copied && s->checkpoints
                            ? s->checkpoints->Deepest(prompt, record)
                            : nullptr;
  if (c != nullptr && !entries_known(c->tokens.size(), !c->logits.empty())) c = nullptr;
  // The model's prefix cache serves what the session's own record and checkpoints do not: the
  // deepest entry the prompt begins with, if it is deeper than what the session could keep.
  const size_t own = extends ? record.size() : c != nullptr ? c->tokens.size() : 0;
  std::shared_ptr<const PrefixState> shared =
      !copied && s->m->prefix_cache != nullptr &&
              (!want_logprobs || s->m->prefix_cache->DeepestLength(prompt) <= memo_shared)
          ? s->m->prefix_cache->Deepest(prompt, own)
          : nullptr;
  if (shared != nullptr && !entries_known(shared->at.tokens.size(), !shared->at.logits.empty())) {
    shared = nullptr;
  }
  // A refused restore changes nothing (K3_MAXT could refuse an entry; one of another shape
  // cannot be in this model's cache): the session then keeps what it can of its own.
  absl::Status restored = shared != nullptr ? s->session->RestorePrefix(*shared)
                                            : absl::NotFoundError("no prefix cache entry");
  if (shared != nullptr && !restored.ok()) {
    COLI_LOG(kWarning) << "kimi_k3: prefix cache entry not restored: " << restored;
  }
  if (copied) {
    keep = prompt.size();
    logits = std::move(copied_logits);
  } else if (restored.ok()) {
    s->m->prefix_cache->CountHit();
    keep = shared->at.tokens.size();
    if (keep == prompt.size()) logits = shared->at.logits;
    s->prefix_restores += 1;
    s->prefix_tokens += static_cast<double>(keep);
  } else if (extends) {
    keep = record.size();
  } else if (c != nullptr) {
    COLI_RETURN_IF_ERROR(s->session->Restore(*c));
    keep = c->tokens.size();
    if (keep == prompt.size()) logits = c->logits;
    s->checkpoint_restores += 1;
    s->checkpoint_tokens += static_cast<double>(keep);
  } else {
    s->session->Reset();
  }
  // The prompt's logprobs at full depth: the kept positions' from the memo, the rest as the
  // rows are computed; the request's top k are cut from them at the end.
  auto computed = std::make_shared<PromptLogprobMemo>();
  if (want_logprobs) {
    computed->tokens.assign(prompt.begin(), prompt.end());
    for (size_t i = 1; i <= keep && i < prompt.size(); ++i) {
      if (i < memo_shared) {
        computed->AppendFrom(*memo, i);
      } else {  // the first token after the kept state: its logits (entries_known said so)
        const std::vector<float>& kept_logits = restored.ok() ? shared->at.logits
                                                : extends     ? s->logits
                                                              : c->logits;
        computed->AppendFromRow(kept_logits, prompt[i]);
      }
    }
  }
  s->pending = -1;
  s->logits.clear();
  s->logits_at = static_cast<size_t>(-1);
  // A new prompt may quote what the last one did not.
  s->spec_budget = DraftBudget(s->m->spec_policy);
  s->sampler.reset();
  s->history.Reset(prompt);
  s->parser.reset();
  s->constraint.reset();
  s->decoder = std::make_unique<tok::StreamDecoder>(*s->m->tokenizer);
  bool cancelled = false;
  int64_t last_done = 0;
  const int64_t total = static_cast<int64_t>(prompt.size() - keep);
  auto ask = [&](int64_t done) {
    if (a->progress != nullptr && !cancelled &&
        a->progress(a->progress_user, static_cast<uint64_t>(done), static_cast<uint64_t>(total),
                    "prefill", 7) != 0) {
      cancelled = true;
    }
  };
  // Between two chunks the model is let go: the host's progress callback (which may stream the
  // report or pace the prefill) runs unlocked and passes waiting for the model (other sessions'
  // decode steps) run first, so a long prompt does not stall everyone else's tokens. The
  // session's own state is complete at every chunk boundary; nothing else crosses it.
  std::optional<ForwardLock> held;
  auto locked_at = Clock::now();
  auto between_chunks = [&](int64_t done) {
    if (!held.has_value()) {
      ask(done);
      return;
    }
    s->compute_seconds += std::chrono::duration<double>(Clock::now() - locked_at).count();
    TakeExpertStats(s);
    held->Unlock();
    ask(done);
    held->LetWaitingIn();
    held->Lock();
    locked_at = Clock::now();
  };
  Session::Cancel cancel = [&]() {
    between_chunks(last_done);
    return cancelled;
  };
  // Between the layers of a chunk (a 32-token chunk of the real model takes about a minute):
  // only the host's cancel, with a report it has already seen (it answers at once, no pacing),
  // under the lock; a cancel drops the chunk in flight and keeps the ones before it.
  Session::Cancel interrupt = [&]() {
    ask(last_done);
    return cancelled;
  };
  // With checkpoints or the prefix cache on, the tail runs in two parts split where the last
  // message starts, so that an edit of that message can return there and other conversations
  // sharing everything before it (a first turn's system prompt and tools) can start there (the
  // split does not change results: chunked prefill is bit-identical to token at a time).
  std::vector<size_t> ends;
  // An entry for the prefix cache that is parked in a file is written after the forward lock is
  // let go (K3: half a gigabyte; every other session's decode would wait for the disk). Until
  // then the cache counts it as coming (Wants); a prefill that ends without it (an exception
  // before the copy was made) says so, or the prefix would never be kept.
  std::optional<PrefixState> to_park;
  std::vector<int32_t> park_tokens;
  absl::Cleanup abandon_park = [&] {
    if (!park_tokens.empty()) s->m->prefix_cache->Abandon(park_tokens);
  };
  if ((s->checkpoints != nullptr || s->m->prefix_cache != nullptr) && s->m->end_of_msg >= 0) {
    const int64_t split = LastMessageStart(prompt, s->m->end_of_msg);
    if (split > static_cast<int64_t>(keep) && split < static_cast<int64_t>(prompt.size())) {
      ends.push_back(static_cast<size_t>(split));
    }
  }
  // Scoring several continuations of one context (lm-evaluation-harness: a request per choice,
  // no message structure): where this prompt leaves the last one scored, the cache gets the
  // state, so the next continuations compute only their own tokens.
  if (want_logprobs && ends.empty() && s->m->prefix_cache != nullptr && memo_shared > keep &&
      memo_shared < prompt.size()) {
    ends.push_back(memo_shared);
  }
  ends.push_back(prompt.size());
  // Row p's logits predict prompt token p + 1 (kept rows' entries are already there).
  int64_t next_row = static_cast<int64_t>(keep);
  const size_t V = static_cast<size_t>(s->m->model->vocab_size());
  Session::RowLogits row_logits = [&](std::span<const float> rows, int64_t n) {
    for (int64_t j = 0; j < n; ++j, ++next_row) {
      if (next_row + 1 >= static_cast<int64_t>(prompt.size())) break;
      computed->AppendFromRow(rows.subspan(static_cast<size_t>(j) * V, V),
                              prompt[static_cast<size_t>(next_row + 1)]);
    }
    return absl::OkStatus();
  };
  {
    held.emplace(*s->m);
    locked_at = Clock::now();
    // Decode rows of other sessions of the model ride the chunk passes from here on; those
    // still queued when this (and every other running) prefill ends run on their own. A prefill
    // for prompt logprobs takes no riders (its passes compute the head on every row), so it
    // does not ask for them: rows queued for it would wait until it ends.
    std::optional<PrefillRiders> riders;
    if (!want_logprobs) riders.emplace(s, &locked_at);
    for (size_t from = keep, i = 0; from < prompt.size() && i < ends.size(); from = ends[i++]) {
      const int64_t offset = static_cast<int64_t>(from - keep);
      Session::Progress progress = [&](int64_t done, int64_t) {
        last_done = offset + done;
        between_chunks(last_done);
      };
      logits = s->session->Prefill(prompt.subspan(from, ends[i] - from), progress, cancel,
                                   interrupt, riders ? &*riders : nullptr,
                                   want_logprobs ? &row_logits : nullptr);
      if (!logits.ok()) break;
      if (s->checkpoints != nullptr) {
        // A checkpoint that cannot be parked costs only a longer prefill later.
        if (absl::Status put = s->checkpoints->Put(s->session->TakeCheckpoint(*logits));
            !put.ok()) {
          COLI_LOG(kWarning) << "kimi_k3: checkpoint not kept: " << put;
        }
      }
      // The state where the last message starts goes to the model's prefix cache (the whole
      // state: any session can continue from it). Prompt ends are left to the session's own
      // checkpoints: they rarely begin another conversation, and each entry costs the whole
      // recurrent state (K3: 465 MB).
      PrefixCache* cache = s->m->prefix_cache.get();
      if (cache != nullptr && ends[i] < prompt.size()) {
        // Copied before Wants marks a parked entry coming: from then on the cleanup must know
        // the tokens, whatever throws.
        std::vector<int32_t> head(prompt.begin(), prompt.begin() + ends[i]);
        if (cache->Wants(head)) {
          if (cache->parks()) {
            park_tokens = std::move(head);
            to_park = s->session->TakePrefixState(*logits);
          } else {
            cache->Insert(s->session->TakePrefixState(*logits));
          }
        }
      }
    }
    if (s->checkpoints != nullptr) {
      s->checkpoint_share.Set(&s->m->checkpoint_bytes,
                              static_cast<int64_t>(s->checkpoints->bytes()));
    }
    s->compute_seconds += std::chrono::duration<double>(Clock::now() - locked_at).count();
    TakeExpertStats(s);
    held.reset();
  }
  if (to_park.has_value()) {
    park_tokens.clear();  // Insert ends the wait (kept or not)
    s->m->prefix_cache->Insert(*std::move(to_park));
  }
  if (!logits.ok()) {
    // The chunks that ran stay recorded (a consistent record); a failed pass resets.
    if (!cancelled) s->session->Reset();
    return cancelled ? absl::CancelledError("prefill cancelled") : logits.status();
  }
  s->logits = std::move(logits).value();
  s->logits_at = s->session->tokens().size();
  s->seed = a->seed;
  s->steps = 0;
  if (a->chat_parse_mode != 0) {
    COLI_ASSIGN_OR_RETURN(OutputParser parser,
                          OutputParser::Create(*s->m->tokenizer, a->chat_parse_mode));
    s->parser.emplace(std::move(parser));
    s->parser->set_tool_call_deltas(g_host_minor >= 5);  // COLI_CHANNEL_TOOL_CALL_DELTA
  }
  s->constraint = std::move(constraint);
  s->prompt_tokens += static_cast<double>(prompt.size());
  s->reused += static_cast<double>(keep);
  s->computed += static_cast<double>(prompt.size() - keep);
  r->tokens_reused = keep;
  r->tokens_computed = prompt.size() - keep;
  r->context_used = s->session->position();
  r->context_capacity = s->capacity;
  if (want_logprobs) {
    const size_t per = 1 + PromptLogprobMemo::kDepth;
    for (size_t i = 0; i < computed->ranks.size(); ++i) {
      const auto first = computed->entries.begin() + static_cast<std::ptrdiff_t>(i * per);
      s->prompt_logprobs.insert(s->prompt_logprobs.end(), first, first + 1 + top_k);
    }
    s->prompt_logprob_ranks = computed->ranks;
    if (prompt.size() > 1) s->m->logprob_memos->Insert(std::move(computed));
  }
  if (want_logprobs && COLI_ABI_HAS_FIELD(r, coli_prefill_result_t, n_prompt_logprobs)) {
    r->prompt_logprobs = s->prompt_logprobs.data();
    r->n_prompt_logprobs = s->prompt_logprobs.size();
  }
  if (want_logprobs && COLI_ABI_HAS_FIELD(r, coli_prefill_result_t, n_prompt_logprob_ranks)) {
    r->prompt_logprob_ranks = s->prompt_logprob_ranks.data();
    r->n_prompt_logprob_ranks = s->prompt_logprob_ranks.size();
  }
  return absl::OkStatus();
}

void AddEvents(K3Session* s, std::vector<ChatEvent> events) {
  for (auto& e : events) {
    s->event_texts.push_back(std::move(e.text));
    auto out = abi::Init<coli_chat_event_t>();
    out.channel = static_cast<int32_t>(e.channel);
    out.end_of_message = e.end_of_message ? 1 : 0;
    s->events.push_back(out);
  }
}

// Clears the row's outputs and the session's outputs of its previous step.
void ClearOutputs(K3Session* s, coli_decode_row_t* row) {
  s->text.clear();
  s->top.clear();
  s->event_texts.clear();
  s->events.clear();
  row->token = -1;
  row->finish = COLI_FINISH_NONE;
  row->text = Str("");
  row->n_top_logprobs = 0;
  row->n_events = 0;
}

// Feeds the pending tokens of `group` (distinct sessions of one model) in one forward pass under
// that model's lock. Statistics: the pass's wall time and expert-store counts are split evenly
// over the sessions (integer counts: the remainder to the first rows), so each is summed exactly
// once over all sessions; a pass of more than one row also counts in batched_steps (+1) and
// batched_rows (+rows) of each of its sessions. While a prefill of the model runs, the group
// rides that prefill's next chunk pass instead (RideAlong; decode_rides +1 per session, no
// decode pass). On failure every session of the group is unusable until its next prefill (its
// logits are dropped, as on the single-row path).
absl::Status Feed(std::span<K3Session* const> group) {
  K3Model* m = group[0]->m;
  const size_t n = group.size();
  std::vector<Session*> sessions;
  std::vector<int32_t> tokens;
  for (K3Session* s : group) {
    sessions.push_back(s->session.get());
    tokens.push_back(s->pending);
  }
  absl::StatusOr<std::vector<std::vector<float>>> logits;
  // While a prefill of the model runs its chunks, the rows ride its next chunk pass (costs:
  // their shares of that pass, PrefillRiders); otherwise, or when no prefill is left to carry
  // them, one pass of their own.
  if (Ride ride; RideAlong(m, sessions, tokens, &ride)) {
    for (size_t i = 0; i < n; ++i) {
      AddCosts(group[i], ride.costs[i]);
      group[i]->decode_rides += 1;
    }
    logits = std::move(ride.logits);
  } else {
    ForwardLock lock(*m);
    const auto t0 = Clock::now();
    logits = Session::StepBatch(sessions, tokens);
    const PassCosts pass = TakeCosts(m, std::chrono::duration<double>(Clock::now() - t0).count());
    for (size_t i = 0; i < n; ++i) {
      K3Session* s = group[i];
      AddCosts(s, pass.Share(i, 1, n));
      s->decode_passes += 1;
      if (n > 1) {
        s->batched_steps += 1;
        s->batched_rows += static_cast<double>(n);
      }
    }
  }
  if (!logits.ok()) {
    for (K3Session* s : group) s->logits.clear();
    return logits.status();
  }
  for (size_t i = 0; i < n; ++i) {
    group[i]->logits = std::move((*logits)[i]);
    group[i]->pending = -1;
  }
  return absl::OkStatus();
}

// The row's ABI 1.3 knobs (neutral when the host's row predates them).
sampling::SamplerOptions RowKnobs(const coli_decode_row_t& row) {
  sampling::SamplerOptions o;
  if (!COLI_ABI_HAS_FIELD(&row, coli_decode_row_t, n_logit_bias)) return o;
  o.repetition_penalty = row.repetition_penalty;
  o.frequency_penalty = row.frequency_penalty;
  o.presence_penalty = row.presence_penalty;
  o.min_p = row.min_p;
  if (row.logit_bias != nullptr) {
    o.logit_bias.reserve(row.n_logit_bias);
    for (size_t i = 0; i < row.n_logit_bias; ++i) {
      o.logit_bias.push_back({row.logit_bias[i].id, row.logit_bias[i].bias});
    }
  }
  return o;
}

// The draft for a row of a spec model (greedy or sampled): up to K prompt-lookup tokens after the
// record and the pending token, K shrunk so the verify chunk fits the context, cut before the
// first stop token (a stop ends the turn: no row after it is needed). Empty: take the normal
// step. Rows with a penalty or logit_bias (ABI 1.3) draft too (VerifyDraft advances a copy of
// their history).
std::vector<int32_t> SpecDraft(K3Session* s, const coli_decode_row_t& row) {
  const K3Model& m = *s->m;
  // A constrained row drafts too: VerifyDraft verifies it under the mask.
  if (m.spec_max <= 0 || s->spec.undelivered() > 0) return {};
  const int64_t room = s->capacity - s->session->position() - 1;
  s->spec_context.assign(s->session->tokens().begin(), s->session->tokens().end());
  s->spec_context.push_back(s->pending);
  return s->spec_budget.Propose(s->spec_context,
                                static_cast<int>(std::min<int64_t>(m.spec_max, room)),
                                {.ngram_max = m.spec_ngram_max, .ngram_min = m.spec_ngram_min},
                                row.temperature > 0.0f, m.stop_ids);
}

// The sampler `Sample` draws the row's token with at this step: the session's, re-created
// (seeded seed + steps) when the row's knobs differ from the ones it was made with — one seeded
// stream per generation while the knobs hold. The verify of a sampled row draws with a copy.
sampling::Sampler& RowSampler(K3Session* s, const coli_decode_row_t& row) {
  sampling::SamplerOptions want = RowKnobs(row);
  want.temperature = row.temperature;
  want.top_p = (row.top_p <= 0.0f || row.top_p > 1.0f) ? 1.0f : row.top_p;
  want.top_k = std::max(0, row.top_k);
  want.logprobs = std::max(0, row.logprobs_top_k);
  want.seed = s->seed + s->steps;
  const sampling::SamplerOptions* have = s->sampler ? &s->sampler->options() : nullptr;
  if (have == nullptr || have->temperature != want.temperature || have->top_p != want.top_p ||
      have->top_k != want.top_k || have->logprobs != want.logprobs ||
      have->repetition_penalty != want.repetition_penalty ||
      have->frequency_penalty != want.frequency_penalty ||
      have->presence_penalty != want.presence_penalty || have->min_p != want.min_p ||
      have->logit_bias != want.logit_bias) {
    s->sampler.emplace(std::move(want));
  }
  return *s->sampler;
}

absl::StatusOr<int32_t> DrawConstrained(const AnswerConstraint& c, sampling::Sampler& sampler,
                                        std::span<const float> logits,
                                        const sampling::TokenHistory* history,
                                        std::vector<float>* scratch);

// Feeds the pending token of `s` together with `draft` in one verify chunk under the model's
// lock (SpecDecoder::Verify); the logits after the pending token become the row's, the accepted
// tokens wait in s->spec. A greedy row accepts a draft token while it is the row's argmax; a
// sampled row while a COPY of the sampler `Sample` will use draws it (no draw of the real
// sampler is spent: it draws the same tokens from the same logits when they are handed out).
// A row with a penalty or logit_bias (greedy or sampled) draws with a copy of the sampler AND of
// the session's history, each row's token added to the copy before the next row draws — as
// `Sample` adds each delivered token to the real history — so the copy draws exactly what the
// real sampler will draw step by step.
// On failure the session is back before the pending token and unusable until its next prefill
// (its logits are dropped, as on the normal path).
absl::Status VerifyDraft(K3Session* s, const coli_decode_row_t& row,
                         std::span<const int32_t> draft) {
  absl::StatusOr<SpecDecoder::Verified> v;
  {
    // Draws of a copy of the row's sampler and history (draw-only); plain greedy: the argmax.
    const sampling::Sampler& real = RowSampler(s, row);
    ForwardLock lock(*s->m);
    const auto t0 = Clock::now();
    if (s->constraint.has_value() && !s->constraint->ended()) {
      // A constrained row: each draft row is drawn as `Sample` will draw it — DrawConstrained
      // with copies of the sampler, the history (penalties only, as VerifyWithSampler) and the
      // constraint, the copy advanced by each row's token. A draft token the mask forbids is
      // never drawn, so it is rejected like any mismatch.
      sampling::Sampler draw = real;
      std::optional<sampling::TokenHistory> seen;
      if (sampling::HasPenalties(draw.options())) seen.emplace(s->history);
      AnswerConstraint c = *s->constraint;
      std::vector<float> scratch;
      v = s->spec.Verify(*s->session, s->pending, draft, [&](std::span<const float> logits) {
        const sampling::TokenHistory* h = seen ? &*seen : nullptr;
        int32_t id = -1;
        if (c.ended()) {
          id = draw.Draw(logits, h);
        } else if (absl::StatusOr<int32_t> drawn = DrawConstrained(c, draw, logits, h, &scratch);
                   drawn.ok()) {
          id = *drawn;  // (an error: no match; the real step reports it)
        }
        c.Accept(id);
        if (seen) seen->AddOutput(id);
        return id;
      });
    } else {
      v = s->spec.VerifyWithSampler(*s->session, s->pending, draft, real, &s->history);
    }
    s->compute_seconds += std::chrono::duration<double>(Clock::now() - t0).count();
    TakeExpertStats(s);
  }
  if (!v.ok()) {
    s->logits.clear();
    return v.status();
  }
  s->spec_budget.Observe(draft.size(), v->accepted);
  s->spec_drafts += 1;
  s->spec_draft_tokens += static_cast<double>(draft.size());
  s->spec_accepted += v->accepted;
  s->spec_rejections += static_cast<size_t>(v->accepted) < draft.size() ? 1 : 0;
  s->spec_replays += static_cast<double>(v->replayed);
  s->decode_passes += 1;
  s->logits = std::move(v->logits);
  s->pending = -1;
  return absl::OkStatus();
}

// The token a constrained row draws from `logits` with `sampler` (its state advanced as by the
// draws made): a row watching for a lazy tool call (tool_choice auto, nothing open) draws from
// the raw logits exactly as an unconstrained row and keeps the token unless it opens a call
// that cannot be completed, in which case it draws again (the sampler's next draw) from the
// masked copy `scratch`; any other constrained row draws once from the masked copy.
// Deterministic in (sampler state, logits, constraint), so a speculative verify drawing with
// copies reproduces it.
absl::StatusOr<int32_t> DrawConstrained(const AnswerConstraint& c, sampling::Sampler& sampler,
                                        std::span<const float> logits,
                                        const sampling::TokenHistory* history,
                                        std::vector<float>* scratch) {
  if (c.watching()) {
    const int32_t id = sampler.Draw(logits, history);
    if (c.Permits(id)) return id;
  }
  scratch->assign(logits.begin(), logits.end());
  COLI_RETURN_IF_ERROR(c.Mask(*scratch));
  return sampler.Draw(*scratch, history);
}

// Samples the row's token from its session's logits (after the pending token was fed). A
// constrained row (response_format, tool calls) draws with DrawConstrained — from a copy of the
// logits with every token the constraint disallows at -inf, before every other knob, or for a
// lazy tool-call row watching for a call, from the raw logits first; its reported logprob and
// top logprobs stay those of the raw logits, as for every row (Sampler::Next is Draw + Logprob
// + TopLogprobs).
absl::Status Sample(K3Session* s, coli_decode_row_t* row) {
  sampling::Sampler& sampler = RowSampler(s, *row);
  sampling::Sample sample;
  if (s->constraint.has_value() && !s->constraint->ended()) {
    COLI_ASSIGN_OR_RETURN(
        sample.id, DrawConstrained(*s->constraint, sampler, s->logits, &s->history, &s->masked));
    sample.logprob = sampling::Logprob(s->logits, sample.id);
    if (sampler.options().logprobs > 0) {
      sample.top = sampling::TopLogprobs(s->logits, sampler.options().logprobs);
    }
    s->constraint->Accept(sample.id);
  } else {
    sample = sampler.Next(s->logits, &s->history);
  }
  s->history.AddOutput(sample.id);
  ++s->steps;
  s->generated += 1;
  row->token = sample.id;
  row->logprob = sample.logprob;
  for (const auto& t : sample.top) s->top.push_back({t.id, t.logprob});
  const bool stop =
      std::find(s->m->stop_ids.begin(), s->m->stop_ids.end(), sample.id) != s->m->stop_ids.end();
  if (stop) {
    row->finish = COLI_FINISH_STOP;
    s->text = s->decoder->Flush();
  } else {
    s->text = s->decoder->Push(sample.id);
    s->pending = sample.id;
  }
  if (s->parser) {
    AddEvents(s, s->parser->Feed(sample.id));
    if (stop || s->parser->ended()) AddEvents(s, s->parser->Finish());
  }
  for (size_t i = 0; i < s->events.size(); ++i) s->events[i].text = Str(s->event_texts[i]);
  row->text = Str(s->text);
  row->top_logprobs = s->top.data();
  row->n_top_logprobs = s->top.size();
  row->events = s->events.data();
  row->n_events = s->events.size();
  return absl::OkStatus();
}

// One decode step for every row (continuous batching). Every row is checked first and a
// refusal changes no session: INVALID_ARGUMENT (a row without a session, a session named twice),
// FAILED_PRECONDITION (a session without a successful prefill), each naming the row. Then the
// pending tokens of all rows that have one are fed — one forward pass per model, all its rows
// together (Feed) — except rows whose session's context is full, which finish with
// COLI_FINISH_LENGTH (token -1) while the others go on. A failed pass fails the call before
// any row samples: the sessions of that pass need a new prefill, those of passes already run
// keep their fed token (the next step samples from its logits), the rest are untouched. Then
// each row samples from its own logits with its own knobs, exactly as a one-row call.
// Speculative decoding (spec > 0): a row whose pending token is the next verified one takes the
// buffered logits (no pass; another token rewinds the session to the delivered record first);
// a row with a lookup draft is verified alone as one chunk after the batched passes.
// Every row that got its logits has pending = -1 at once, so a retry after a failed call
// samples it without feeding again, as on the batched path.
absl::Status Decode(std::span<coli_decode_row_t> rows) {
  std::vector<K3Session*> sessions(rows.size());
  for (size_t i = 0; i < rows.size(); ++i) {
    if (rows[i].session == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("kimi_k3: decode row ", i, " has no session"));
    }
    sessions[i] = reinterpret_cast<K3Session*>(rows[i].session);
    for (size_t j = 0; j < i; ++j) {
      if (sessions[j] == sessions[i]) {
        return absl::InvalidArgumentError(
            absl::StrCat("kimi_k3: decode rows ", j, " and ", i, " name the same session"));
      }
    }
  }
  for (size_t i = 0; i < rows.size(); ++i) {
    if (sessions[i]->logits.empty()) {
      return absl::FailedPreconditionError(
          absl::StrCat("kimi_k3: decode row ", i, ": decode before a successful prefill"));
    }
    const int32_t vocab = static_cast<int32_t>(sessions[i]->m->model->vocab_size());
    if (COLI_ABI_HAS_FIELD(&rows[i], coli_decode_row_t, n_logit_bias) &&
        (rows[i].n_logit_bias > static_cast<size_t>(sampling::kMaxLogitBias) ||
         (rows[i].n_logit_bias > 0 && rows[i].logit_bias == nullptr))) {
      return absl::InvalidArgumentError(
          absl::StrCat("kimi_k3: decode row ", i, ": logit_bias has ", rows[i].n_logit_bias,
                       " entries at ", rows[i].logit_bias == nullptr ? "NULL" : "an array",
                       "; at most ", sampling::kMaxLogitBias, ", never NULL"));
    }
    if (absl::Status bad = sampling::ValidatePenalties(RowKnobs(rows[i]), vocab); !bad.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("kimi_k3: decode row ", i, ": ", bad.message()));
    }
  }
  std::vector<bool> full(rows.size(), false);
  std::vector<std::vector<K3Session*>> groups;  // per model, in the order of first appearance
  std::vector<std::pair<size_t, std::vector<int32_t>>> drafted;  // rows verified one at a time
  for (size_t i = 0; i < rows.size(); ++i) {
    K3Session* s = sessions[i];
    ClearOutputs(s, &rows[i]);
    if (s->pending < 0) continue;
    if (DeliveredLength(*s) >= s->capacity) {
      full[i] = true;
      rows[i].finish = COLI_FINISH_LENGTH;
      continue;
    }
    if (s->spec.undelivered() > 0) {
      if (std::optional<std::vector<float>> logits = s->spec.Take(s->pending)) {
        s->logits = std::move(*logits);
        s->pending = -1;
        s->spec_from_buffer += 1;
        continue;
      }
      // The row sampled another token than the verified one (its knobs changed while tokens were
      // buffered, so its sampler was re-created): back to the delivered record, then the
      // normal step.
      COLI_RETURN_IF_ERROR(RewindSpec(s));
    }
    if (std::vector<int32_t> draft = SpecDraft(s, rows[i]); !draft.empty()) {
      drafted.emplace_back(i, std::move(draft));
      continue;
    }
    auto g = std::find_if(groups.begin(), groups.end(),
                          [&](const std::vector<K3Session*>& g) { return g[0]->m == s->m; });
    if (g == groups.end()) {
      groups.push_back({s});
    } else {
      g->push_back(s);
    }
  }
  for (const std::vector<K3Session*>& group : groups) COLI_RETURN_IF_ERROR(Feed(group));
  for (const auto& [i, draft] : drafted) {
    COLI_RETURN_IF_ERROR(VerifyDraft(sessions[i], rows[i], draft));
  }
  for (size_t i = 0; i < rows.size(); ++i) {
    if (!full[i]) COLI_RETURN_IF_ERROR(Sample(sessions[i], &rows[i]));
  }
  return absl::OkStatus();
}

const char* const kStatNames[] = {
    "prompt_tokens",
    "tokens_reused",
    "tokens_computed",
    "tokens_generated",
    "compute_seconds",
    "expert_hits",
    "expert_misses",
    "bytes_read",
    "read_seconds",
    "expert_wait_seconds",
    "checkpoint_restores",
    "checkpoint_tokens_restored",
    "batched_steps",
    "batched_rows",
    "decode_passes",
    "spec_drafts",
    "spec_draft_tokens",
    "spec_accepted_tokens",
    "spec_tokens_from_buffer",
    "spec_rejections",
    "spec_replays",
    "spec_rewinds",
    "mixed_passes",
    "mixed_rows",
    "decode_rides",
    "prefix_cache_restores",
    "prefix_cache_tokens_restored",
    "session_copies",
    "session_copied_tokens",
};

std::vector<coli_stat_t> Stats(const K3Session& s) {
  LogVkTurn(s);
  const double values[] = {s.prompt_tokens,
                           s.reused,
                           s.computed,
                           s.generated,
                           s.compute_seconds,
                           static_cast<double>(s.experts.hits),
                           static_cast<double>(s.experts.misses),
                           static_cast<double>(s.experts.bytes_read),
                           s.experts.read_seconds,
                           s.experts.wait_seconds,
                           s.checkpoint_restores,
                           s.checkpoint_tokens,
                           s.batched_steps,
                           s.batched_rows,
                           s.decode_passes,
                           s.spec_drafts,
                           s.spec_draft_tokens,
                           s.spec_accepted,
                           s.spec_from_buffer,
                           s.spec_rejections,
                           s.spec_replays,
                           s.spec_rewinds,
                           s.mixed_passes,
                           s.mixed_rows,
                           s.decode_rides,
                           s.prefix_restores,
                           s.prefix_tokens,
                           s.copies,
                           s.copied_tokens};
  std::vector<coli_stat_t> out = abi::NamedStats(kStatNames, values);
  // The Vulkan tier and shared experts: counters attributed to this session (what is resident
  // now, a current value, is the model's: ModelStats).
  static const char* const kVkNames[] = {"vk_matmuls", "vk_tier_hits", "vk_tier_promotions",
                                         "vk_tier_evictions", "vk_dense_calls"};
  const double vk_values[] = {s.vk_matmuls, s.vk_hits, s.vk_promotions, s.vk_evictions,
                              s.vk_dense_calls};
  for (const coli_stat_t& stat : abi::NamedStats(kVkNames, vk_values)) out.push_back(stat);
  return out;
}

// The model's current values (ABI 1.2 model_stats): what is resident now, not per session.
const char* const kModelStatNames[] = {
    "weights_resident_bytes", "weights_mapped_bytes", "expert_cache_bytes", "vk_tier_resident",
    "vk_tier_bytes",          "vk_tier_slots",        "vk_dense_matrices",  "vk_dense_bytes",
    "mix_queued_rows",       // decode rows waiting now for a running prefill's next chunk pass
    "checkpoint_bytes",      // held by the checkpoint caches of all the model's sessions
    "prefix_cache_bytes",    // held by the model's prefix cache
    "prefix_cache_entries",  // its entries
    "prefix_cache_hits",     // prefills it served since the model was loaded
};

std::vector<coli_stat_t> ModelStats(const K3Model& m) {
  const Weights& w = m.model->weights();
  VkTierStats vk;
  if (m.vk_tier != nullptr) vk = m.vk_tier->Stats();
  size_t queued = 0;
  {
    std::lock_guard<std::mutex> lock(m.mix_mu);
    for (const Ride* r : m.mix_queue) queued += r->sessions.size();
  }
  const double values[] = {
      static_cast<double>(w.resident_bytes),
      static_cast<double>(w.mapped_bytes),
      m.store != nullptr ? static_cast<double>(m.store->plan().total_bytes) : 0.0,
      static_cast<double>(vk.resident),
      static_cast<double>(vk.bytes),
      static_cast<double>(vk.slots),
      static_cast<double>(vk.dense.matrices),
      static_cast<double>(vk.dense.bytes),
      static_cast<double>(queued),
      static_cast<double>(m.checkpoint_bytes.load()),
      m.prefix_cache != nullptr ? static_cast<double>(m.prefix_cache->bytes()) : 0.0,
      m.prefix_cache != nullptr ? static_cast<double>(m.prefix_cache->entries()) : 0.0,
      m.prefix_cache != nullptr ? static_cast<double>(m.prefix_cache->hits()) : 0.0};
  return abi::NamedStats(kModelStatNames, values);
}

void ResetSession(K3Session* s) {
  s->session->Reset();
  K3Model* m = s->m;
  std::unique_ptr<Session> session = std::move(s->session);
  std::unique_ptr<CheckpointCache> checkpoints = std::move(s->checkpoints);
  if (checkpoints != nullptr) checkpoints->Clear();
  const int64_t capacity = s->capacity;
  *s = K3Session();
  s->m = m;
  s->session = std::move(session);
  s->checkpoints = std::move(checkpoints);
  s->capacity = capacity;
}

// ABI 1.11: `dst` takes `src`'s record and per-sequence state (an exact copy: it continues bit
// for bit like `src` would), and right after a prefill of `src` its last logits for dst's next
// prefill of the same prompt. Verified draft tokens `src` still buffers are not copied (they are
// not delivered: the copy holds the delivered record).
absl::Status CopySession(K3Session* dst, K3Session* src) {
  if (dst == src || dst->m != src->m) {
    return absl::InvalidArgumentError(
        "session copy: the source must be another session of the same model");
  }
  if (src->spec.undelivered() > 0) {
    return absl::FailedPreconditionError(
        "session copy: the source holds undelivered speculative tokens");
  }
  const bool after_prefill = src->pending < 0 && src->steps == 0 && !src->logits.empty();
  // Straight into dst's buffers (a refused copy changes nothing): no intermediate copy of the
  // state, and a reused dst (the host keeps spare sessions) allocates none of it anew. dst
  // keeps its statistics (they only grow); its own checkpoints go, since they continue from its
  // old MLA rows.
  COLI_RETURN_IF_ERROR(dst->session->CopyFrom(*src->session));
  if (dst->checkpoints != nullptr) {
    dst->checkpoints->Clear();
    dst->checkpoint_share.Set(&dst->m->checkpoint_bytes, 0);
  }
  dst->spec.Clear();
  dst->pending = -1;
  dst->logits.clear();
  dst->steps = 0;
  dst->sampler.reset();
  dst->parser.reset();
  dst->constraint.reset();
  if (after_prefill) {
    dst->copied_logits = src->logits;
  } else {
    dst->copied_logits.clear();
  }
  dst->copies += 1;
  dst->copied_tokens += static_cast<double>(dst->session->tokens().size());
  return absl::OkStatus();
}

// The family's entries for the plugin table (plugin_api/cpp/plugin_table.h).
struct K3Family {
  using Model = K3Model;
  using Session = K3Session;
  static constexpr const char* kFamily = "kimi_k3";
  static constexpr const char* kVersion = "0.1.0";
  static constexpr const char* kServes =
      "architectures KimiK3ForConditionalGeneration (KimiK3*) or model_type 'kimi_k3'";
  // The K3_* / COLI_K3_* / COLI_VK_* variables the host reads for this family (ABI 1.8).
  static std::span<const coli_switch_t> Switches() { return k3::EnvironmentSwitches(); }
  static void Shutdown() {
    SetLogSink(nullptr);
    g_host = nullptr;
  }
  static absl::Status Probe(std::string_view dir, int32_t* serves) {
    return k3::Probe(std::string(dir), serves);
  }
  static absl::StatusOr<std::unique_ptr<K3Model>> Open(const coli_model_open_args_t& args) {
    return k3::Open(args);
  }
  static absl::Status Info(K3Model& m, coli_model_info_t* info) { return k3::Info(&m, info); }
  static absl::StatusOr<std::vector<int32_t>> Tokenize(K3Model& m, std::string_view text,
                                                       bool allow_special) {
    return m.tokenizer->Encode(text, allow_special);
  }
  static absl::StatusOr<std::string> Detokenize(K3Model& m, std::span<const int32_t> ids) {
    return m.tokenizer->Decode(ids);
  }
  static absl::Status Render(K3Model& m, const coli_chat_render_args_t& args,
                             coli_chat_render_result_t* result) {
    return k3::Render(&m, &args, result);
  }
  static absl::StatusOr<std::unique_ptr<K3Session>> NewSession(K3Model& m,
                                                               const coli_session_options_t* o) {
    auto s = std::make_unique<K3Session>();
    s->m = &m;
    s->session = m.model->NewSession();
    if (m.checkpoint_slots > 0) {
      s->checkpoints = std::make_unique<CheckpointCache>(m.checkpoint_slots, m.checkpoint_dir);
    }
    s->capacity =
        (o != nullptr && o->max_context > 0) ? std::min(o->max_context, m.capacity) : m.capacity;
    return s;
  }
  static absl::Status Reset(K3Session& s) {
    ResetSession(&s);
    return absl::OkStatus();
  }
  static absl::Status Copy(K3Session& dst, K3Session& src) { return CopySession(&dst, &src); }
  static absl::Status Prefill(K3Session& s, const coli_prefill_args_t& args,
                              coli_prefill_result_t* result) {
    return k3::Prefill(&s, &args, result);
  }
  // Rows of several sessions run in one forward pass per model (plugin_table.h prefers Decode
  // over a Step loop).
  static absl::Status Decode(std::span<coli_decode_row_t> rows) { return k3::Decode(rows); }
  static std::vector<coli_stat_t> Stats(const K3Session& s) { return k3::Stats(s); }
  static std::vector<coli_stat_t> ModelStats(const K3Model& m) { return k3::ModelStats(m); }
  // The delivered record: verified tokens still buffered are not part of it yet.
  static std::span<const int32_t> Record(const K3Session& s) {
    return std::span<const int32_t>(s.session->tokens())
        .first(static_cast<size_t>(DeliveredLength(s)));
  }
  // What Prefill would keep of `prompt` (ABI 1.6): the record it extends, else the session's
  // deepest checkpoint, or the model's prefix cache where that goes deeper. The record is the
  // delivered one: Prefill first drops verified draft tokens the client never saw.
  static size_t Reusable(K3Model& m, const K3Session* s, std::span<const int32_t> prompt) {
    size_t keep = 0;
    if (s != nullptr) {
      const std::span<const int32_t> record = Record(*s);
      keep = abi::RecordReusable(record, prompt);
      if (keep == 0 && s->checkpoints != nullptr) {
        keep = s->checkpoints->DeepestLength(prompt, record);
      }
    }
    if (m.prefix_cache != nullptr) keep = std::max(keep, m.prefix_cache->DeepestLength(prompt));
    return keep;
  }
};

const coli_plugin_api_t kApi = abi::MakePluginTable<K3Family>();

}  // namespace
}  // namespace coli::k3

extern "C" COLI_PLUGIN_EXPORT const coli_plugin_api_t* coli_plugin_entry(
    const coli_host_api_t* host, coli_abi_version_t* version) {
  const uint32_t host_major = version->major;
  coli::k3::g_host_minor = version->minor;  // 1.5+: chat events include tool-call deltas
  version->major = COLI_ABI_VERSION_MAJOR;
  version->minor = COLI_ABI_VERSION_MINOR;
  if (host_major != COLI_ABI_VERSION_MAJOR) return nullptr;  // the host names both versions
  coli::k3::g_host = host;
  // This plugin's copy of common/log writes into the host's log.
  if (host != nullptr && COLI_ABI_HAS_FIELD(host, coli_host_api_t, log) && host->log != nullptr) {
    coli::SetLogSink([host](coli::LogLevel level, std::string_view message) {
      host->log(host->host_data, static_cast<int32_t>(level), message.data(), message.size());
    });
  }
  if (coli::k3::g_host_minor < 10) {
    // An older host refuses a request-default switch (ABI 1.10): its table leaves them out.
    static coli_plugin_api_t older;
    older = coli::k3::kApi;
    older.n_switches = coli::k3::EnvironmentSwitches(coli::k3::g_host_minor).size();
    return &older;
  }
  return &coli::k3::kApi;
}
