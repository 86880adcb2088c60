#include "plugins/kimi_k3/spec_decode.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/sampling/sampling.h"
#include "common/status/status.h"

namespace coli::k3 {

void SpecDecoder::Clear() {
  fed_ = -1;
  ahead_.clear();
  logits_.clear();
  next_ = 0;
  before_.reset();
}

absl::StatusOr<SpecDecoder::Verified> SpecDecoder::Verify(Session& session, int32_t token,
                                                          std::span<const int32_t> draft) {
  return Verify(session, token, draft, sampling::Greedy);
}

absl::StatusOr<SpecDecoder::Verified> SpecDecoder::Verify(Session& session, int32_t token,
                                                          std::span<const int32_t> draft,
                                                          RowToken emit) {
  if (undelivered() > 0) {
    return absl::FailedPreconditionError(absl::StrCat("spec verify while ", undelivered(),
                                                      " verified tokens are still undelivered"));
  }
  if (draft.empty()) return absl::InvalidArgumentError("spec verify needs a draft token");
  if (session.broken()) {
    return absl::FailedPreconditionError("spec verify on a session broken by an earlier error");
  }
  Clear();
  const size_t V = static_cast<size_t>(session.model().vocab_size());
  const size_t K = draft.size();
  std::vector<int32_t> chunk;
  chunk.reserve(K + 1);
  chunk.push_back(token);
  chunk.insert(chunk.end(), draft.begin(), draft.end());
  Checkpoint before = session.TakeCheckpoint({});
  // Any failure after the first pass: back to `before` (Restore also clears a broken pass).
  auto fail = [&](absl::Status s) -> absl::Status {
    if (absl::Status r = session.Restore(before); !r.ok()) {
      return absl::Status(s.code(), absl::StrCat(s.message(),
                                                 "; restoring the pre-verify "
                                                 "checkpoint also failed: ",
                                                 r.message()));
    }
    return s;
  };
  absl::StatusOr<std::vector<float>> all = session.StepAll(chunk);
  if (!all.ok()) return fail(all.status());
  auto row = [&](size_t i) { return std::span<const float>(all->data() + i * V, V); };
  size_t m = 0;
  while (m < K && emit(row(m)) == draft[m]) ++m;
  Verified out;
  out.accepted = static_cast<int>(m);
  if (m < K) {
    // The state holds rejected drafts: go back and consume only t, d1…dm.
    if (absl::Status r = session.Restore(before); !r.ok()) return r;
    out.rerun = true;
    absl::StatusOr<std::vector<float>> again =
        session.StepAll(std::span<const int32_t>(chunk).first(m + 1), /*every_row=*/false);
    if (!again.ok()) return fail(again.status());
  }
  out.logits.assign(row(0).begin(), row(0).end());
  if (m > 0) {
    fed_ = token;
    ahead_.assign(draft.begin(), draft.begin() + m);
    for (size_t i = 1; i <= m; ++i) logits_.emplace_back(row(i).begin(), row(i).end());
    before_.emplace(std::move(before));
  }
  return out;
}

std::optional<std::vector<float>> SpecDecoder::Take(int32_t token) {
  if (undelivered() == 0 || ahead_[next_] != token) return std::nullopt;
  std::vector<float> logits = std::move(logits_[next_]);
  ++next_;
  if (undelivered() == 0) Clear();
  return logits;
}

absl::StatusOr<std::optional<std::vector<float>>> SpecDecoder::Rewind(Session& session) {
  if (undelivered() == 0) {
    Clear();
    return std::optional<std::vector<float>>();
  }
  std::vector<int32_t> replay = {fed_};
  replay.insert(replay.end(), ahead_.begin(), ahead_.begin() + next_);
  Checkpoint before = std::move(*before_);
  Clear();
  COLI_RETURN_IF_ERROR(session.Restore(before));
  COLI_ASSIGN_OR_RETURN(std::vector<float> logits, session.StepAll(replay, /*every_row=*/false));
  return std::optional<std::vector<float>>(std::move(logits));
}

int DraftBudget::Next(int max_k) {
  if (max_k <= 0) return 0;
  if (pause_ > 0) {
    --pause_;
    return 0;
  }
  if (length_ <= 0 || length_ > max_k) length_ = length_ <= 0 ? max_k : std::min(length_, max_k);
  return length_;
}

void DraftBudget::Observe(size_t drafted, int accepted) {
  if (drafted == 0) return;
  if (accepted <= 0) {
    ++misses_;
    pause_ = std::min(kMaxPause, 1 << std::min(misses_ - 1, 5));
    length_ = 1;
    return;
  }
  misses_ = 0;
  if (static_cast<size_t>(accepted) >= drafted) {
    length_ = std::max(1, length_) * 2;  // capped to the maximum by Next
  } else {
    length_ = accepted + 1;
  }
}

}  // namespace coli::k3
