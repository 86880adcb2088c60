#include "plugins/kimi_k3/session.h"

#include <algorithm>
#include <chrono>

#include "absl/strings/str_cat.h"
#include "common/log/log.h"
#include "common/status/status.h"

namespace coli::k3 {
namespace {

FILE* OpenOutput(const std::string& path) {
  if (path.empty()) return nullptr;
  return std::fopen(path.c_str(), "wb");  // null: reported by Chunked()/Step()
}

absl::Status WriteAll(FILE* f, const float* data, size_t count, const std::string& path) {
  if (!f) return absl::OkStatus();
  if (std::fwrite(data, sizeof(float), count, f) != count || std::fflush(f) != 0)
    return absl::DataLossError(absl::StrCat(path, ": write failed"));
  return absl::OkStatus();
}

// Adds to `out` the share of `t` of rows [first, first + count) of a pass of n rows: each row
// gets 1/n (integer counts: the remainder goes to the first rows, so the n shares sum to `t`).
void AddShare(const Timings& t, int first, int count, int n, Timings* out) {
  const double part = static_cast<double>(count) / n;
  out->attention += t.attention * part;
  out->moe += t.moe * part;
  out->head += t.head * part;
  out->mix += t.mix * part;
  out->embed += t.embed * part;
  auto share = [&](int64_t v) {
    int64_t sum = 0;
    for (int i = first; i < first + count; ++i) sum += v / n + (i < v % n ? 1 : 0);
    return sum;
  };
  out->moe_stats.rows += share(t.moe_stats.rows);
  out->moe_stats.expert_calls += share(t.moe_stats.expert_calls);
  out->moe_stats.expert_rows += share(t.moe_stats.expert_rows);
}

}  // namespace

Session::Session(const Model& model) : model_(model), state_(model.NewState()) {
  trace_file_ = OpenOutput(model.options().trace_path);
  logits_file_ = OpenOutput(model.options().logits_path);
}

Session::~Session() {
  if (trace_file_) std::fclose(trace_file_);
  if (logits_file_) std::fclose(logits_file_);
}

absl::Status Session::CheckUsable() const {
  if (broken_)
    return absl::FailedPreconditionError("session state is inconsistent after an error; Reset() it");
  const ModelOptions& o = model_.options();
  if (!o.trace_path.empty() && !trace_file_)
    return absl::PermissionDeniedError(o.trace_path + ": cannot open for writing (K3_TRACE)");
  if (!o.logits_path.empty() && !logits_file_)
    return absl::PermissionDeniedError(o.logits_path + ": cannot open for writing (K3_LOGITS)");
  return absl::OkStatus();
}

void Session::Reset() {
  model_.ResetState(state_);
  tokens_.clear();
  broken_ = false;
}

size_t Checkpoint::bytes() const {
  size_t n = tokens.size() * sizeof(int32_t) + logits.size() * sizeof(float);
  for (const KdaState& k : kda) {
    n += (k.S.size() + k.q_win.size() + k.k_win.size() + k.v_win.size()) * sizeof(float);
  }
  return n;
}

size_t ReplayRecord::bytes() const {
  size_t n = tokens.size() * sizeof(int32_t);
  for (const KdaRowInputs& k : kda) n += k.bytes();
  return n;
}

void ReplayRecord::Clear() {
  position = -1;
  tokens.clear();
  for (KdaRowInputs& k : kda) k.Clear();
}

Checkpoint Session::TakeCheckpoint(std::vector<float> logits) const {
  return Checkpoint{tokens_, state_.kda, std::move(logits)};
}

void Session::TakeCheckpointInto(Checkpoint* c) const {
  c->tokens = tokens_;
  c->kda = state_.kda;  // element-wise copy-assignment: same-sized vectors keep their buffers
  c->logits.clear();
}

absl::Status Session::Restore(const Checkpoint& c) {
  const size_t p = c.tokens.size();
  if (p > tokens_.size() || !std::equal(c.tokens.begin(), c.tokens.end(), tokens_.begin())) {
    return absl::FailedPreconditionError(
        absl::StrCat("checkpoint at position ", p, " is not on this session's record"));
  }
  if (c.kda.size() != state_.kda.size()) {
    return absl::FailedPreconditionError("checkpoint was taken on another model");
  }
  state_.kda = c.kda;
  for (MlaCache& m : state_.mla) m.length = std::min<int64_t>(m.length, static_cast<int64_t>(p));
  tokens_.resize(p);
  broken_ = false;  // a failed pass only wrote at positions past the record
  return absl::OkStatus();
}

size_t PrefixState::bytes() const {
  size_t n = at.bytes();
  for (const std::vector<float>& rows : mla) n += rows.size() * sizeof(float);
  return n;
}

PrefixState Session::TakePrefixState(std::vector<float> logits) const {
  PrefixState p;
  p.at = TakeCheckpoint(std::move(logits));
  p.mla.resize(state_.mla.size());
  for (size_t i = 0; i < state_.mla.size(); ++i) {
    const MlaCache& m = state_.mla[i];
    if (m.width == 0) continue;  // a KDA layer
    // The cache holds exactly the record's rows (Restore/Replay cut it with the record).
    const size_t used = static_cast<size_t>(std::min<int64_t>(m.length, position())) * m.width;
    p.mla[i].assign(m.rows.begin(), m.rows.begin() + static_cast<std::ptrdiff_t>(used));
  }
  return p;
}

absl::Status Session::RestorePrefix(const PrefixState& p) {
  const int64_t n = static_cast<int64_t>(p.at.tokens.size());
  const size_t L = state_.kda.size();
  if (p.at.kda.size() != L || p.mla.size() != L) {
    return absl::FailedPreconditionError(absl::StrCat(
        "prefix state has ", p.at.kda.size(), " / ", p.mla.size(),
        " layers (KDA / MLA), the model runs ", L));
  }
  const int64_t max_ctx = model_.options().max_context;
  if (max_ctx > 0 && n > max_ctx) {
    return absl::ResourceExhaustedError(absl::StrCat("prefix state of ", n,
                                                     " tokens exceeds the context capacity of ",
                                                     max_ctx, " (K3_MAXT)"));
  }
  for (size_t i = 0; i < L; ++i) {
    const KdaState& k = state_.kda[i];
    const KdaState& pk = p.at.kda[i];
    if (pk.S.size() != k.S.size() || pk.q_win.size() != k.q_win.size() ||
        pk.k_win.size() != k.k_win.size() || pk.v_win.size() != k.v_win.size()) {
      return absl::FailedPreconditionError(
          absl::StrCat("prefix state: layer ", i, "'s KDA state has another size"));
    }
    const int width = state_.mla[i].width;
    const size_t want = width == 0 ? 0 : static_cast<size_t>(n) * width;
    if (p.mla[i].size() != want) {
      return absl::FailedPreconditionError(absl::StrCat("prefix state: layer ", i, " holds ",
                                                        p.mla[i].size(), " MLA floats, ", want,
                                                        " expected for ", n, " tokens"));
    }
  }
  // Every allocation first (reserve leaves the contents alone): a bad_alloc here changes
  // nothing, and the copies below cannot fail — never half of one state and half of another.
  for (size_t i = 0; i < L; ++i) state_.mla[i].rows.reserve(p.mla[i].size());
  tokens_.reserve(p.at.tokens.size());
  for (size_t i = 0; i < L; ++i) {
    state_.kda[i] = p.at.kda[i];  // copy-assignment: same-sized buffers are reused
    MlaCache& m = state_.mla[i];
    if (m.width == 0) continue;
    m.rows.assign(p.mla[i].begin(), p.mla[i].end());
    m.length = n;
  }
  tokens_ = p.at.tokens;
  broken_ = false;
  return absl::OkStatus();
}

absl::Status Session::CopyFrom(const Session& src) {
  if (&src == this || &src.model_ != &model_) {
    return absl::InvalidArgumentError(
        "session copy: the source must be another session of the same model");
  }
  if (src.broken_) {
    return absl::FailedPreconditionError(
        "session copy: the source's state is inconsistent after an error");
  }
  const int64_t n = src.position();
  const size_t L = state_.kda.size();
  if (src.state_.kda.size() != L || src.state_.mla.size() != L || state_.mla.size() != L) {
    return absl::FailedPreconditionError("session copy: the sessions' states have other layers");
  }
  for (size_t i = 0; i < L; ++i) {
    const KdaState& k = state_.kda[i];
    const KdaState& sk = src.state_.kda[i];
    const MlaCache& m = state_.mla[i];
    const MlaCache& sm = src.state_.mla[i];
    if (sk.S.size() != k.S.size() || sk.q_win.size() != k.q_win.size() ||
        sk.k_win.size() != k.k_win.size() || sk.v_win.size() != k.v_win.size() ||
        sm.width != m.width || (sm.width != 0 && sm.length < n)) {
      return absl::FailedPreconditionError(
          absl::StrCat("session copy: layer ", i, "'s state does not fit"));
    }
  }
  // Every allocation first (as RestorePrefix): the copies below cannot fail.
  for (size_t i = 0; i < L; ++i) {
    state_.mla[i].rows.reserve(static_cast<size_t>(n) * src.state_.mla[i].width);
  }
  tokens_.reserve(src.tokens_.size());
  for (size_t i = 0; i < L; ++i) {
    KdaState& k = state_.kda[i];
    const KdaState& sk = src.state_.kda[i];
    k.S = sk.S;  // same sizes: copy-assignment reuses the buffers
    k.q_win = sk.q_win;
    k.k_win = sk.k_win;
    k.v_win = sk.v_win;
    MlaCache& m = state_.mla[i];
    const MlaCache& sm = src.state_.mla[i];
    if (m.width == 0) continue;
    m.rows.assign(sm.rows.begin(), sm.rows.begin() + static_cast<std::ptrdiff_t>(n) * m.width);
    m.length = n;
  }
  tokens_ = src.tokens_;
  broken_ = false;
  return absl::OkStatus();
}

absl::StatusOr<std::vector<float>> Session::Run(const float* x, std::span<const int32_t> ids,
                                                bool prefill, bool every_row,
                                                const Cancel* interrupt) {
  const int n = static_cast<int>(ids.size());
  const int64_t D = model_.hidden_size(), V = model_.vocab_size();
  const int L = model_.num_layers();
  const int64_t max_ctx = model_.options().max_context;
  if (max_ctx > 0 && position() + n > max_ctx)
    return absl::ResourceExhaustedError(absl::StrCat("context capacity ", max_ctx,
                                                     " tokens exceeded (K3_MAXT)"));
  // The head runs on the last row, or on every prefill row when K3_LOGITS is on (on every row
  // for StepAll).
  const bool dump_logits = prefill && logits_file_ != nullptr;
  const bool all_logits = every_row || dump_logits;
  std::vector<Model::Row> rows(n);
  for (int r = 0; r < n; ++r)
    rows[r] = {&state_, position() + r, all_logits || r == n - 1};
  std::vector<float> logits((all_logits ? n : 1) * V);
  std::vector<float> trace;
  if (trace_file_) trace.resize(static_cast<size_t>(n) * L * D);
  absl::Status s = model_.Forward(rows, x, logits.data(), trace_file_ ? trace.data() : nullptr,
                                  &timings_, interrupt);
  if (!s.ok()) {
    // An interrupted pass leaves the state half-advanced too: the caller (Chunked) restores it.
    broken_ = true;
    return s;
  }
  tokens_.insert(tokens_.end(), ids.begin(), ids.end());
  COLI_RETURN_IF_ERROR(WriteAll(trace_file_, trace.data(), trace.size(), model_.options().trace_path));
  if (dump_logits) {
    COLI_RETURN_IF_ERROR(WriteAll(logits_file_, logits.data(), logits.size(),
                                  model_.options().logits_path));
  }
  if (all_logits && !every_row) logits.erase(logits.begin(), logits.end() - V);
  return logits;
}

absl::StatusOr<std::vector<float>> Session::Chunked(
    int64_t n,
    const std::function<absl::Status(int64_t, int64_t, float*, std::vector<int32_t>*)>& rows,
    const Progress& progress, const Cancel& cancel, const Cancel& interrupt, Riders* riders,
    const RowLogits* row_logits) {
  COLI_RETURN_IF_ERROR(CheckUsable());
  const bool every_row = row_logits != nullptr;
  if (every_row) riders = nullptr;  // a mixed pass computes the head on its last row only
  if (n <= 0) return absl::InvalidArgumentError("prefill needs at least one token");
  const int64_t max_ctx = model_.options().max_context;
  if (max_ctx > 0 && position() + n > max_ctx)
    return absl::ResourceExhaustedError(absl::StrCat(position() + n, " tokens exceed the context capacity of ",
                                                     max_ctx, " (K3_MAXT)"));
  // A trace is written token by token (colibri forces K3_CHUNK=1 under K3_TRACE).
  const int64_t chunk = trace_file_ ? 1 : model_.options().chunk;
  const int64_t D = model_.hidden_size();
  std::vector<float> x;
  std::vector<int32_t> ids;
  std::vector<float> logits;
  Checkpoint before;  // with an interrupt: the state at the current chunk's start
  std::vector<Session*> aboard;  // riders of the current chunk's pass
  std::vector<int32_t> aboard_tokens;
  std::vector<float> rider_x;
  for (int64_t start = 0; start < n; start += chunk) {
    if (cancel && cancel()) return absl::CancelledError("prefill cancelled");
    const int64_t len = std::min(chunk, n - start);
    x.resize(len * D);
    ids.clear();
    COLI_RETURN_IF_ERROR(rows(start, len, x.data(), &ids));
    aboard.clear();
    aboard_tokens.clear();
    // Under K3_TRACE nobody rides (StepBatch's fallback: each session's trace stays its own).
    if (riders != nullptr && trace_file_ == nullptr) riders->Board(len, &aboard, &aboard_tokens);
    double rider_embed = 0;
    if (!aboard.empty()) {
      // Refused riders change nothing: the chunk then runs alone (they may run on their own).
      absl::Status ok = CheckDecodeRows(aboard, aboard_tokens, "riding decode", this);
      rider_x.resize(aboard.size() * D);
      const auto t0 = std::chrono::steady_clock::now();
      if (ok.ok()) ok = model_.Embed(aboard_tokens, rider_x.data());
      rider_embed = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (!ok.ok()) {
        riders->Alight(ok, /*ran=*/false);
        aboard.clear();
      }
    }
    if (!aboard.empty()) {
      bool stop = false;
      COLI_ASSIGN_OR_RETURN(
          logits, RunMixed(x.data(), ids, aboard, aboard_tokens, rider_x.data(), rider_embed,
                           *riders, interrupt ? &interrupt : nullptr, &stop));
      if (stop) return absl::CancelledError("prefill cancelled (after a pass with riders)");
    } else if (!interrupt) {
      COLI_ASSIGN_OR_RETURN(logits, Run(x.data(), ids, /*prefill=*/true, every_row));
    } else {
      // The chunk's start, to return to when the pass is interrupted between layers; assigned
      // into one object per call so the state copies reuse their buffers chunk after chunk.
      before.tokens = tokens_;
      before.kda = state_.kda;
      absl::StatusOr<std::vector<float>> out =
          Run(x.data(), ids, /*prefill=*/true, every_row, &interrupt);
      if (absl::IsCancelled(out.status())) {
        COLI_RETURN_IF_ERROR(Restore(before));
        return absl::CancelledError("prefill cancelled");
      }
      COLI_ASSIGN_OR_RETURN(logits, std::move(out));
    }
    if (every_row) {
      COLI_RETURN_IF_ERROR((*row_logits)(logits, len));
      const int64_t V = model_.vocab_size();
      logits.erase(logits.begin(), logits.end() - V);  // the last row's, as without
    }
    if (progress) progress(start + len, n);
  }
  return logits;
}

absl::StatusOr<std::vector<float>> Session::Prefill(std::span<const int32_t> tokens,
                                                    const Progress& progress, const Cancel& cancel,
                                                    const Cancel& interrupt, Riders* riders,
                                                    const RowLogits* row_logits) {
  return Chunked(
      static_cast<int64_t>(tokens.size()),
      [&](int64_t start, int64_t len, float* x, std::vector<int32_t>* ids) {
        auto part = tokens.subspan(start, len);
        ids->assign(part.begin(), part.end());
        const auto t0 = std::chrono::steady_clock::now();
        absl::Status s = model_.Embed(part, x);
        timings_.embed += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        return s;
      },
      progress, cancel, interrupt, riders, row_logits);
}

absl::StatusOr<std::vector<float>> Session::PrefillRows(std::span<const float> x0,
                                                        const Progress& progress,
                                                        const Cancel& cancel) {
  const int64_t D = model_.hidden_size();
  if (x0.size() % D != 0)
    return absl::InvalidArgumentError(absl::StrCat("input rows: ", x0.size(),
                                                   " floats is not a multiple of hidden size ", D));
  return Chunked(
      static_cast<int64_t>(x0.size() / D),
      [&](int64_t start, int64_t len, float* x, std::vector<int32_t>* ids) {
        std::copy_n(x0.data() + start * D, len * D, x);
        ids->assign(len, -1);
        return absl::OkStatus();
      },
      progress, cancel);
}

absl::StatusOr<std::vector<float>> Session::Step(int32_t token) {
  COLI_RETURN_IF_ERROR(CheckUsable());
  std::vector<float> x(model_.hidden_size());
  const int32_t ids[] = {token};
  const auto t0 = std::chrono::steady_clock::now();
  COLI_RETURN_IF_ERROR(model_.Embed(ids, x.data()));
  timings_.embed += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return Run(x.data(), ids, /*prefill=*/false);
}

absl::StatusOr<std::vector<float>> Session::StepAll(std::span<const int32_t> tokens, bool every_row,
                                                    ReplayRecord* record) {
  if (record) record->Clear();
  COLI_RETURN_IF_ERROR(CheckUsable());
  if (tokens.empty()) return absl::InvalidArgumentError("StepAll needs at least one token");
  const int64_t D = model_.hidden_size();
  std::vector<float> x(tokens.size() * D);
  const auto t0 = std::chrono::steady_clock::now();
  COLI_RETURN_IF_ERROR(model_.Embed(tokens, x.data()));
  timings_.embed += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (!record) return Run(x.data(), tokens, /*prefill=*/false, every_row);
  // KdaForward appends each row's update inputs to the layer's record while the hook is set.
  const int64_t start = position();
  record->kda.resize(state_.kda.size());
  for (size_t i = 0; i < state_.kda.size(); ++i) {
    if (!state_.kda[i].S.empty()) state_.kda[i].record = &record->kda[i];
  }
  absl::StatusOr<std::vector<float>> out = Run(x.data(), tokens, /*prefill=*/false, every_row);
  for (KdaState& k : state_.kda) k.record = nullptr;
  if (!out.ok()) {
    record->Clear();
    return out;
  }
  record->position = start;
  record->tokens.assign(tokens.begin(), tokens.end());
  return out;
}

absl::Status Session::Replay(const Checkpoint& before, const ReplayRecord& record, int64_t rows) {
  const int64_t p = static_cast<int64_t>(before.tokens.size());
  const int64_t n = static_cast<int64_t>(record.tokens.size());
  if (record.position != p) {
    return absl::FailedPreconditionError(absl::StrCat(
        "replay record starts at position ", record.position, ", the checkpoint is at ", p));
  }
  if (rows < 0 || rows > n) {
    return absl::FailedPreconditionError(
        absl::StrCat("replay of ", rows, " rows from a record of ", n));
  }
  if (p + rows > position() ||
      !std::equal(before.tokens.begin(), before.tokens.end(), tokens_.begin()) ||
      !std::equal(record.tokens.begin(), record.tokens.begin() + rows, tokens_.begin() + p)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "replay of ", rows, " rows at position ", p,
        ": the session's record does not hold the checkpoint's tokens followed by those rows"));
  }
  const size_t L = state_.kda.size();
  if (before.kda.size() != L || record.kda.size() != L) {
    return absl::FailedPreconditionError("replay: checkpoint or record taken on another model");
  }
  const Config& cfg = model_.config();
  for (size_t i = 0; i < L; ++i) {
    if (!state_.kda[i].S.empty()) {
      if (before.kda[i].S.size() != state_.kda[i].S.size()) {
        return absl::FailedPreconditionError(
            absl::StrCat("replay: the checkpoint's KDA layer ", i, " has another size"));
      }
      COLI_RETURN_IF_ERROR(record.kda[i].Check(cfg.kda, rows, static_cast<int>(i)));
    } else if (state_.mla[i].length < p + rows) {
      return absl::FailedPreconditionError(absl::StrCat("replay: MLA layer ", i, " caches ",
                                                        state_.mla[i].length, " rows, ", p + rows,
                                                        " needed"));
    }
  }
  const auto t0 = std::chrono::steady_clock::now();
  const Weights& w = model_.weights();
  const int threads = model_.options().threads;
  for (size_t i = 0; i < L; ++i) {
    if (state_.kda[i].S.empty()) {
      state_.mla[i].length = p + rows;
      continue;
    }
    // Assigned, not rebuilt: the state's buffers are reused (and stay warm in cache for the
    // replay that follows, layer by layer).
    state_.kda[i] = before.kda[i];
    if (absl::Status s = KdaReplay(cfg.kda, w.layers[i].kda_w, threads, record.kda[i], rows,
                                   state_.kda[i], static_cast<int>(i));
        !s.ok()) {
      broken_ = true;  // checked above, so not expected: the layers before it were replayed
      return s;
    }
  }
  tokens_.resize(static_cast<size_t>(p + rows));
  broken_ = false;
  timings_.attention +=
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return absl::OkStatus();
}

absl::Status Session::CheckDecodeRows(std::span<Session* const> sessions,
                                      std::span<const int32_t> tokens, const char* what,
                                      const Session* busy) {
  if (sessions.empty()) return absl::InvalidArgumentError(absl::StrCat(what, ": no sessions"));
  if (sessions.size() != tokens.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": ", sessions.size(), " sessions but ", tokens.size(), " tokens"));
  }
  const Model& model = busy != nullptr ? busy->model_ : sessions[0]->model_;
  const int n = static_cast<int>(sessions.size());
  const int64_t max_ctx = model.options().max_context;
  for (int i = 0; i < n; ++i) {
    Session* s = sessions[i];
    if (&s->model_ != &model) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": row ", i, " is a session of another model than ",
                       busy != nullptr ? "the prefilling session" : "row 0"));
    }
    if (s == busy) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": row ", i, " names the prefilling session"));
    }
    for (int j = 0; j < i; ++j) {
      if (sessions[j] == s) {
        return absl::InvalidArgumentError(
            absl::StrCat(what, ": rows ", j, " and ", i, " name the same session"));
      }
    }
    if (absl::Status usable = s->CheckUsable(); !usable.ok()) {
      return absl::Status(usable.code(), absl::StrCat(what, " row ", i, ": ", usable.message()));
    }
    if (max_ctx > 0 && s->position() + 1 > max_ctx) {
      return absl::ResourceExhaustedError(absl::StrCat(what, " row ", i, ": context capacity ",
                                                       max_ctx, " tokens exceeded (K3_MAXT)"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<float>> Session::RunMixed(const float* x, std::span<const int32_t> ids,
                                                     std::span<Session* const> riders,
                                                     std::span<const int32_t> rider_tokens,
                                                     const float* rider_x, double rider_embed,
                                                     Riders& board, const Cancel* interrupt,
                                                     bool* stop) {
  const int n = static_cast<int>(ids.size()), k = static_cast<int>(riders.size());
  const int total = n + k;
  const int64_t D = model_.hidden_size(), V = model_.vocab_size();
  Timings t;
  t.embed = rider_embed;
  std::vector<float> xs(static_cast<size_t>(total) * D);
  std::copy_n(x, static_cast<size_t>(n) * D, xs.data());
  std::copy_n(rider_x, static_cast<size_t>(k) * D, xs.data() + static_cast<size_t>(n) * D);
  // The chunk's rows first (the head on its last row, or on every row for K3_LOGITS), then one
  // row per rider, each at its own sequence's position and always with logits. Kernels are
  // row-independent; MLA attends per row to its own cache up to its own position, KDA advances
  // each state over its own rows in order, the MoE sums each row's experts in a fixed order.
  const bool dump_logits = logits_file_ != nullptr;
  const int chunk_logits = dump_logits ? n : 1;
  std::vector<Model::Row> rows(total);
  for (int r = 0; r < n; ++r) rows[r] = {&state_, position() + r, dump_logits || r == n - 1};
  for (int i = 0; i < k; ++i) rows[n + i] = {&riders[i]->state_, riders[i]->position(), true};
  std::vector<float> logits(static_cast<size_t>(chunk_logits + k) * V);
  // No interrupt is taken while riders are aboard (their states cannot go back): a true answer
  // is kept and acted on after the pass.
  Cancel noted = [&]() {
    if (!*stop && (*interrupt)()) *stop = true;
    return false;
  };
  absl::Status s = model_.Forward(rows, xs.data(), logits.data(), nullptr, &t,
                                  interrupt != nullptr ? &noted : nullptr);
  AddShare(t, 0, n, total, &timings_);
  for (int i = 0; i < k; ++i) AddShare(t, n + i, 1, total, &riders[i]->timings_);
  if (!s.ok()) {
    broken_ = true;
    for (Session* r : riders) r->broken_ = true;
    board.Alight(s, /*ran=*/true);
    return s;
  }
  tokens_.insert(tokens_.end(), ids.begin(), ids.end());
  std::vector<std::vector<float>> out(k);
  for (int i = 0; i < k; ++i) {
    riders[i]->tokens_.push_back(rider_tokens[i]);
    const float* row = logits.data() + static_cast<size_t>(chunk_logits + i) * V;
    out[i].assign(row, row + V);
  }
  board.Alight(std::move(out), /*ran=*/true);
  if (dump_logits) {
    COLI_RETURN_IF_ERROR(WriteAll(logits_file_, logits.data(), static_cast<size_t>(n) * V,
                                  model_.options().logits_path));
  }
  return std::vector<float>(logits.begin() + static_cast<size_t>(chunk_logits - 1) * V,
                            logits.begin() + static_cast<size_t>(chunk_logits) * V);
}

absl::StatusOr<std::vector<std::vector<float>>> Session::StepBatch(
    std::span<Session* const> sessions, std::span<const int32_t> tokens) {
  COLI_RETURN_IF_ERROR(CheckDecodeRows(sessions, tokens, "StepBatch", nullptr));
  const Model& model = sessions[0]->model_;
  const int n = static_cast<int>(sessions.size());
  std::vector<std::vector<float>> out;
  out.reserve(n);
  if (sessions[0]->trace_file_ != nullptr || n == 1) {
    // K3_TRACE writes each session's rows to its own file: one pass per session.
    for (Session* s : sessions) {
      COLI_ASSIGN_OR_RETURN(std::vector<float> logits, s->Step(tokens[out.size()]));
      out.push_back(std::move(logits));
    }
    return out;
  }
  const int64_t D = model.hidden_size(), V = model.vocab_size();
  std::vector<float> x(static_cast<size_t>(n) * D);
  Timings t;
  const auto t0 = std::chrono::steady_clock::now();
  COLI_RETURN_IF_ERROR(model.Embed(tokens, x.data()));
  t.embed = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::vector<Model::Row> rows(n);
  for (int i = 0; i < n; ++i) rows[i] = {&sessions[i]->state_, sessions[i]->position(), true};
  std::vector<float> logits(static_cast<size_t>(n) * V);
  absl::Status s = model.Forward(rows, x.data(), logits.data(), nullptr, &t);
  for (int i = 0; i < n; ++i) AddShare(t, i, 1, n, &sessions[i]->timings_);
  if (!s.ok()) {
    for (Session* session : sessions) session->broken_ = true;
    return s;
  }
  for (int i = 0; i < n; ++i) {
    sessions[i]->tokens_.push_back(tokens[i]);
    out.emplace_back(logits.begin() + i * V, logits.begin() + (i + 1) * V);
  }
  return out;
}

}  // namespace coli::k3
