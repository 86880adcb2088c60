// host/engine: the host's core, without any networking. It owns the plugins, the loaded models
// and their named sessions, a bounded request queue and the generation threads. The gRPC
// service (host/service.h) is a thin adapter over it, and so are in-process users (tests, the
// gRPC benchmark's baseline).
//
//   Engine engine({.plugin_dir = "build/plugins"});
//   COLI_ASSIGN_OR_RETURN(v1::ModelInfo info, engine.LoadModel(load_request, nullptr));
//   EventSink sink;
//   sink.on_token = [](const v1::Token& t, std::span<const ChatEvent>) { ... };
//   sink.on_done = [](const absl::Status& s, const v1::Finished& f) { ... };   // exactly once
//   COLI_ASSIGN_OR_RETURN(auto request, engine.Submit(GenerationInput::From(generate_request),
//                                                     std::move(sink)));
//   request->Cancel(/*stop=*/false);   // honoured within one token / between prefill chunks
//
// Every request has one cancel flag, set by Cancel() (or Engine::Cancel by id), by its deadline,
// or by Shutdown(). Sink callbacks run on a generation thread; on_done is the last call.
#ifndef COLI_HOST_ENGINE_H_
#define COLI_HOST_ENGINE_H_

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "coli/v1/coli.pb.h"
#include "host/plugin.h"

namespace coli::host {

struct EngineOptions {
  std::string plugin_dir;
  // Generation threads (each runs one request at a time). Several, so concurrent requests of a
  // model share decode passes (max_batch); one model's passes still run one at a time.
  int workers = 4;
  int queue_capacity = 16;  // requests waiting for a thread; more -> RESOURCE_EXHAUSTED
  // Paces decoding: waits this long before each generated token (0 = off). For demos and for the
  // UI tests, where the tiny model would otherwise answer before a person (or a test) could press
  // stop. Set by `coli-host --decode-delay-ms` or COLI_DECODE_DELAY_MS.
  int decode_delay_ms = 0;
  // Paces prefill the same way: waits this long after each computed chunk but the last (0 = off),
  // so prefill progress on the tiny model lasts long enough to be seen. Set by
  // `coli-host --prefill-delay-ms` or COLI_PREFILL_DELAY_MS.
  int prefill_delay_ms = 0;
  // Continuous batching: the decode steps of requests of one model that wait at the same moment
  // go to the plugin as ONE decode call of up to this many rows (1 = off: each request calls
  // decode alone). Needs workers > 1 to have concurrent requests. `coli-host --max-batch`.
  int max_batch = 8;
  // Pooled sessions per model for requests without a session name ("default", "default#1", …):
  // each keeps one conversation's state between its turns, so more of them than workers let
  // more idle conversations resume without a prefill (on K3 each holds ~434 MB of recurrent
  // state plus its KV cache). 0 = one per worker. `coli-host --pool N` or COLI_POOL_SESSIONS.
  int pool_sessions = 0;
  // Sessions (named and pooled) each model keeps at most. A request that needs one more closes
  // the least recently used idle one (its next request starts from a fresh state and prefills
  // again) — else a client naming a new session per conversation grows the host until the
  // machine runs out of memory (~434 MB each on K3). Raised to the pool size + 1 when below
  // (coli-host refuses an explicit value below it).
  // `coli-host --max-sessions N` or COLI_MAX_SESSIONS.
  int max_sessions = 16;
  // A spare plugin session (an ended choice's, a closed session's) unused this long is freed:
  // kept, each holds its memory (~434 MB on K3) until the model is unloaded. 0 frees them as
  // soon as the sweep sees them. `coli-host --spare-idle-s N` or COLI_SPARE_IDLE_S (seconds).
  int spare_idle_ms = 60 * 1000;
};

// One request's input, Generate or Chat.
struct GenerationInput {
  std::string model, request_id, session;
  bool chat = false;
  std::string prompt;               // Generate: text (when prompt_ids is empty)
  std::vector<int32_t> prompt_ids;  // Generate: ids
  std::string request_json;         // Chat: the OpenAI request body
  // The response_format to enforce (JSON text, ABI 1.4); empty: for Chat the request body's
  // "response_format" member, for Generate none.
  std::string response_format;
  int32_t max_tokens = 0;
  v1::SamplingParams sampling;
  bool report_progress = false;  // on_progress events during prefill
  // Generate: the prompt tokens' logprobs with this many top alternatives (0…20; none when
  // unset; ABI 1.7), and whether to generate nothing after the prompt.
  std::optional<int32_t> prompt_logprobs;
  bool prompt_only = false;
  // Choices (OpenAI `n`, 1…kMaxChoices): one prefill, its state copied into a session per
  // choice (ABI 1.11; an older plugin prefills each), then one decode call a step carries every
  // choice's row. Choice i samples with seed + i; its tokens carry `choice` = i and its end
  // comes to on_choice_finished (n > 1 only). Ignored with prompt_only.
  int32_t n = 1;
  // vLLM's truncate_prompt_tokens: only the prompt's last this many tokens are read; -1 = the
  // model's context less one; 0 = all.
  int32_t truncate_prompt_tokens = 0;
  std::optional<std::chrono::steady_clock::time_point> deadline;

  static GenerationInput From(const v1::GenerateRequest& r);
  static GenerationInput From(const v1::ChatRequest& r);
};

struct EventSink {
  // Prefill progress (only when the input asked for it): strictly growing `done`, the first
  // report when prefill begins, then at most ~10 per second, always ending with done == total.
  std::function<void(const v1::PrefillProgress&)> on_progress;
  std::function<void(const v1::Started&)> on_started;
  // The prompt's logprobs in pieces (only when the input asked for them), after on_started.
  std::function<void(const v1::PromptLogprobs&)> on_prompt_logprobs;
  // events: the chat deltas of this token (empty for Generate).
  std::function<void(const v1::Token&, std::span<const v1::ChatDelta>)> on_token;
  // n > 1: one choice ended (its reason and tokens), before on_done.
  std::function<void(const v1::ChoiceFinished&)> on_choice_finished;
  // Called exactly once, last: OK with the Finished event, or the error that ended the request.
  std::function<void(const absl::Status&, const v1::Finished&)> on_done;
};

class Request {
 public:
  const std::string& id() const { return id_; }
  // stop=true: STOP (finish normally, reason STOPPED; during prefill it ends the prefill and
  // the request finishes with no tokens); false: CANCEL (CANCELLED).
  void Cancel(bool stop) {
    if (stop)
      stop_.store(true);
    else
      cancel_.store(true);
  }
  // The cancel status to end with, or OK to keep going.
  absl::Status CancelStatus() const;
  // Ends choice `choice` of an n > 1 request (STOPPED) while the others go on; false when the
  // request has no such choice.
  bool StopChoice(int32_t choice) {
    if (choice < 0 || choice >= choices_) return false;
    choice_stop_[static_cast<size_t>(choice)].store(true);
    return true;
  }
  bool ChoiceStopped(int32_t choice) const {
    return choice_stop_[static_cast<size_t>(choice)].load();
  }

 private:
  friend class Engine;
  std::string id_;
  GenerationInput input_;
  EventSink sink_;
  std::atomic<bool> cancel_{false}, stop_{false};
  std::atomic<bool> shutdown_{false};
  // The request's choices (input_.n, 1 with prompt_only) and their own stops.
  int32_t choices_ = 1;
  std::unique_ptr<std::atomic<bool>[]> choice_stop_;
  std::chrono::steady_clock::time_point accepted_;
  // The prompt's token ids (rendered or tokenized at Submit, so the pool can match them against
  // its sessions' records before the request runs) and its chat parse mode.
  std::vector<int32_t> prompt_;
  int32_t parse_mode_ = 0;
};

// `in` with every byte that does not start a valid UTF-8 sequence (overlong forms, surrogates and
// values past U+10FFFF included) replaced by U+FFFD. Chat deltas travel in proto `string`
// fields, which must be valid UTF-8; a model can generate bytes that are not.
std::string ValidUtf8(std::string_view in);

class Engine {
 public:
  explicit Engine(EngineOptions options);
  ~Engine();  // Shutdown() and join
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  const PluginSet& plugins() const { return plugins_; }

  // Loads a model (or returns the loaded one with the same id and directory). progress may be
  // empty; returning false from it cancels the load.
  absl::StatusOr<v1::ModelInfo> LoadModel(const v1::LoadModelRequest& request,
                                          const ProgressFn& progress);
  absl::Status UnloadModel(const std::string& id);
  std::vector<v1::ModelInfo> ListModels() const;

  // Queues a request. NOT_FOUND for an unknown model, RESOURCE_EXHAUSTED when the queue is full,
  // UNAVAILABLE after Shutdown. On OK the sink gets exactly one on_done.
  absl::StatusOr<std::shared_ptr<Request>> Submit(GenerationInput input, EventSink sink);
  // Cancels a queued or running request by id; false when no such request is live. A request
  // still queued ends at once (CANCELLED), without waiting for a worker.
  bool Cancel(const std::string& request_id, bool stop);
  // The same for a request Submit returned (exactly that one, even if its id was reused since).
  void Cancel(const std::shared_ptr<Request>& request, bool stop);
  // Ends one choice of a live n > 1 request (Request::StopChoice); false when no such request
  // or choice is live.
  bool CancelChoice(const std::string& request_id, int32_t choice);

  absl::StatusOr<std::vector<int32_t>> Tokenize(const std::string& model, const std::string& text,
                                                bool allow_special);
  absl::StatusOr<std::string> Detokenize(const std::string& model, std::span<const int32_t> ids);
  absl::StatusOr<RenderedChat> ApplyTemplate(const std::string& model, const std::string& json,
                                             bool add_generation_prompt);

  v1::MetricsResponse Metrics() const;
  v1::HealthResponse Health() const;

  // Refuses new requests, ends every queued and running one (UNAVAILABLE "host shutting down")
  // and joins the generation threads. Idempotent.
  void Shutdown();

 private:
  struct SessionSlot {
    std::unique_ptr<Session> session;
    bool busy = false;
    std::map<std::string, double> last_stats;
    // The session's record as its last request left it (read under mu_ to place unnamed
    // requests) and when that request ended (least recently used goes first).
    std::vector<int32_t> record;
    uint64_t last_used = 0;
  };
  // One request's decode step, waiting in its model's DecodeBatcher.
  struct DecodeRow {
    Session* session = nullptr;
    Sampling sampling;
    absl::StatusOr<StepResult> result = absl::UnknownError("decode row never ran");
    bool done = false;
  };
  // Per model: the rows waiting for a decode call. Whichever request thread finds no call
  // running becomes the leader: it takes the rows waiting at that moment (up to max_batch, in
  // arrival order), makes one decode call, hands each row its result and wakes the others.
  struct DecodeBatcher {
    std::mutex mu;
    std::condition_variable cv;
    std::deque<DecodeRow*> waiting;
    bool running = false;
  };
  // An idle plugin session kept for reuse, and since when.
  struct Spare {
    std::unique_ptr<Session> session;
    std::chrono::steady_clock::time_point since;
  };
  struct LoadedModel {
    v1::ModelInfo info;
    DecodeBatcher batcher;
    std::unique_ptr<Model> model;
    std::map<std::string, SessionSlot> sessions;
    uint64_t sessions_closed = 0;  // by MakeRoomForSessionsLocked
    // Sessions of running n > 1 requests beyond each one's own: they count against
    // max_sessions like the kept ones.
    size_t choice_sessions = 0;
    // Idle plugin sessions kept for reuse (ended choices' sessions, sessions closed to make room
    // for a request that takes them): a new session or a choice takes one, reset, instead of the
    // plugin making one (on K3 each holds ~434 MB of recurrent state that a new session
    // allocates and page-faults). They count against max_sessions, are dropped first when room
    // is needed, and unloading the model frees them.
    std::vector<Spare> spare_sessions;
    uint64_t spares_freed = 0;                  // idle past EngineOptions::spare_idle_ms
    std::atomic<uint64_t> sessions_created{0};  // asked of the plugin (session_create)
    std::atomic<uint64_t> sessions_reused{0};   // spares handed out instead
    int active = 0;                // requests running on it
    // The DATA_LOSS of its last failed request ("" once one succeeds): Health reports it, since
    // a changed shard fails every request while the host itself is fine.
    std::string files_problem;
  };

  // A request taken off the queue, with its model and (when it will run) its session slot held.
  struct Job {
    std::shared_ptr<Request> request;
    std::shared_ptr<LoadedModel> model;
    SessionSlot* slot = nullptr;  // nullptr: the request ends without running
    size_t choice_sessions = 0;   // held in model->choice_sessions while it runs
    bool slot_session_spare = false;  // slot->session is a spare, to reset before use
    // Spares taken for its choices (reset before use), then the choices' sessions: they go back
    // to model->spare_sessions when it ends.
    std::vector<std::unique_ptr<Session>> spares;
    std::vector<std::unique_ptr<Session>> choice_session_objects;
  };

  absl::StatusOr<std::shared_ptr<LoadedModel>> FindModelLocked(const std::string& id) const;
  absl::StatusOr<std::shared_ptr<LoadedModel>> FindModel(const std::string& id) const;
  void WorkerLoop();
  std::optional<Job> PopRunnableLocked();
  // The pooled session ("default", "default#1", …) an unnamed request runs on, or "" when every
  // one is busy: the one whose state its prompt extends, else the one sharing most of it.
  std::string PickPooledSessionLocked(const LoadedModel& model, const Request& request) const;
  // Runs the job; the caller frees its session slot, then reports the end (Finish), so a client
  // that sends its next turn the moment this one ends finds the slot free (prefix reuse).
  absl::Status Run(Job& job, v1::Finished* finished);
  absl::Status Generate(Job& job, v1::Finished* finished);
  // A session for the job: a spare it took (reset; a new one if the reset fails), else a new one.
  absl::StatusOr<std::unique_ptr<Session>> SessionFor(LoadedModel& model,
                                                      std::unique_ptr<Session> spare,
                                                      const std::string& request_id);
  // The request's next decode step, batched with other requests of the model when
  // options_.max_batch > 1.
  absl::StatusOr<StepResult> DecodeStep(LoadedModel& model, Session& session,
                                        const Sampling& sampling);
  // The next decode step of several sessions of one request (its choices): all their rows wait
  // in the model's batcher at once, so one call carries them (max_batch permitting) with any
  // other requests' rows; results in the order of `sessions`.
  std::vector<absl::StatusOr<StepResult>> DecodeSteps(LoadedModel& model,
                                                      std::span<Session* const> sessions,
                                                      const Sampling& sampling);
  static void RunDecodeBatch(std::span<DecodeRow* const> batch);
  // A request's end in two steps: its outcome counted under mu_ in the same critical section
  // that takes it out of the queue or the active count (so metrics never see it in neither),
  // then its sink told outside the lock.
  void CountFinishedLocked(Request& request, const absl::Status& status,
                           const v1::Finished& finished);
  void NotifyFinished(Request& request, const absl::Status& status, const v1::Finished& finished);
  // Frees the spares idle past options_.spare_idle_ms, every quarter of it (10 ms to 1 s),
  // until Shutdown.
  void SpareSweepLoop();
  // Keeps `session` as a spare of `model` (caller holds mu_).
  static void AddSpareLocked(LoadedModel& model, std::unique_ptr<Session> session) {
    model.spare_sessions.push_back({std::move(session), std::chrono::steady_clock::now()});
  }
  // The most recently kept spare of `model`, taken (caller holds mu_; there is one).
  static std::unique_ptr<Session> TakeSpareLocked(LoadedModel& model) {
    std::unique_ptr<Session> session = std::move(model.spare_sessions.back().session);
    model.spare_sessions.pop_back();
    return session;
  }

  EngineOptions options_;
  PluginSet plugins_;
  std::chrono::steady_clock::time_point started_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, std::shared_ptr<LoadedModel>> models_;
  std::deque<std::shared_ptr<Request>> queue_;
  std::map<std::string, std::shared_ptr<Request>> live_;  // queued or running, by id
  bool shutting_down_ = false;
  uint64_t next_id_ = 1;
  std::vector<std::thread> workers_;
  std::condition_variable sweep_cv_;  // wakes the spare sweep at Shutdown
  std::thread spare_sweep_;

  // metrics (under mu_)
  struct Counters {
    uint64_t total = 0, ok = 0, failed = 0, cancelled = 0, rejected = 0;
    uint64_t prompt_tokens = 0, completion_tokens = 0, tokens_reused = 0;
    double ttft_last = 0, ttft_sum = 0, tps_last = 0, tps_sum = 0;
    uint64_t ttft_n = 0, tps_n = 0;
    int active = 0;
    std::map<std::string, double> plugin;  // summed per-request deltas of session stats
  } counters_;
  uint64_t slot_clock_ = 0;  // orders SessionSlot::last_used
  // Room for `more` sessions in `model` (kept ones, running requests' choice sessions and spares
  // stay within MostSessions; spares serve first): true when there is room or after dropping
  // the spares the request will not take, then closing its least recently used idle sessions
  // (never `keep`; their plugin sessions become spares while the request needs more); false
  // when too many are busy (the request waits).
  bool MakeRoomForSessionsLocked(LoadedModel& model, size_t more, const std::string& keep);
  size_t MostSessions() const {
    return static_cast<size_t>(std::max(options_.max_sessions, PoolSize() + 1));
  }
  // Pooled sessions per model ("default", "default#1", …): --pool, at least one per worker.
  int PoolSize() const { return std::max({1, options_.workers, options_.pool_sessions}); }
  // Decode calls made and rows they carried (atomics: counted by the batch leader, which holds
  // its model's batcher lock, not mu_).
  std::atomic<uint64_t> decode_calls_{0}, decode_rows_{0};
};

}  // namespace coli::host

#endif  // COLI_HOST_ENGINE_H_
