#include "plugins/kimi_k3/spec_decode.h"

#include <algorithm>
#include <string>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/sampling/sampling.h"
#include "common/status/status.h"

namespace coli::k3 {

void SpecDecoder::Forget() {
  fed_ = -1;
  ahead_.clear();
  logits_.clear();
  next_ = 0;
  record_.Clear();
}

void SpecDecoder::Clear() {
  Forget();
  before_ = Checkpoint();
  record_ = ReplayRecord();
}

absl::StatusOr<SpecDecoder::Verified> SpecDecoder::Verify(Session& session, int32_t token,
                                                          std::span<const int32_t> draft) {
  return Verify(session, token, draft, sampling::Greedy);
}

absl::StatusOr<SpecDecoder::Verified> SpecDecoder::VerifyWithSampler(
    Session& session, int32_t token, std::span<const int32_t> draft,
    const sampling::Sampler& sampler, const sampling::TokenHistory* history) {
  const bool penalised = sampling::HasPenalties(sampler.options());
  if (!penalised && sampler.options().temperature <= 0.0f) return Verify(session, token, draft);
  sampling::Sampler draw = sampler;  // the copy: the real sampler's RNG is not spent here
  std::optional<sampling::TokenHistory> seen;
  if (penalised && history != nullptr) seen.emplace(*history);
  return Verify(session, token, draft, [&](std::span<const float> logits) {
    const int32_t id = draw.Draw(logits, seen ? &*seen : nullptr);
    if (seen) seen->AddOutput(id);
    return id;
  });
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
  Forget();
  const size_t V = static_cast<size_t>(session.model().vocab_size());
  const size_t K = draft.size();
  std::vector<int32_t> chunk;
  chunk.reserve(K + 1);
  chunk.push_back(token);
  chunk.insert(chunk.end(), draft.begin(), draft.end());
  session.TakeCheckpointInto(&before_);
  const Checkpoint& before = before_;
  // Any failure after the first pass: back to `before` (Restore also clears a broken pass).
  auto fail = [&](absl::Status s) -> absl::Status {
    record_.Clear();
    if (absl::Status r = session.Restore(before); !r.ok()) {
      return absl::Status(s.code(), absl::StrCat(s.message(),
                                                 "; restoring the pre-verify "
                                                 "checkpoint also failed: ",
                                                 r.message()));
    }
    return s;
  };
  absl::StatusOr<std::vector<float>> all = session.StepAll(chunk, /*every_row=*/true, &record_);
  if (!all.ok()) return fail(all.status());
  auto row = [&](size_t i) { return std::span<const float>(all->data() + i * V, V); };
  size_t m = 0;
  while (m < K && emit(row(m)) == draft[m]) ++m;
  Verified out;
  out.accepted = static_cast<int>(m);
  if (m < K) {
    // The state holds rejected drafts: back to `before` with only t, d1…dm consumed, replayed
    // from the verify pass's record (no second pass).
    if (absl::Status r = session.Replay(before, record_, static_cast<int64_t>(m + 1)); !r.ok()) {
      return fail(r);
    }
    out.replayed = static_cast<int64_t>(m + 1);
    replayed_rows_ += out.replayed;
  }
  out.logits.assign(row(0).begin(), row(0).end());
  if (m > 0) {
    fed_ = token;
    ahead_.assign(draft.begin(), draft.begin() + m);
    for (size_t i = 0; i <= m; ++i) logits_.emplace_back(row(i).begin(), row(i).end());
  } else {
    record_.Clear();  // nothing buffered, nothing to rewind
  }
  return out;
}

std::optional<std::vector<float>> SpecDecoder::Take(int32_t token) {
  if (undelivered() == 0 || ahead_[next_] != token) return std::nullopt;
  ++next_;
  if (undelivered() == 0) {
    std::vector<float> logits = std::move(logits_[next_]);
    Forget();
    return logits;
  }
  return logits_[next_];  // a copy: a Rewind from here returns it again
}

absl::StatusOr<std::optional<std::vector<float>>> SpecDecoder::Rewind(Session& session) {
  if (undelivered() == 0) {
    Forget();
    return std::optional<std::vector<float>>();
  }
  // t and the delivered drafts are rows 0…next_ of the verify chunk.
  const int64_t rows = static_cast<int64_t>(next_) + 1;
  absl::Status s = session.Replay(before_, record_, rows);
  std::vector<float> logits = std::move(logits_[next_]);
  Forget();
  COLI_RETURN_IF_ERROR(s);
  replayed_rows_ += rows;
  return std::optional<std::vector<float>>(std::move(logits));
}

absl::StatusOr<bool> ParseDraftPolicySwitch(std::string_view option, std::string_view value,
                                            DraftPolicy* policy) {
  const DraftPolicySwitch* sw = nullptr;
  for (const DraftPolicySwitch& s : kDraftPolicySwitches) {
    if (option == s.option) sw = &s;
  }
  if (sw == nullptr) return false;
  const std::string text(value);  // absl::string_view is not std::string_view in this Abseil
  int v = 0;
  const bool number = absl::SimpleAtoi(text, &v);
  auto bad = [&](const char* what) {
    return absl::InvalidArgumentError(absl::StrCat("kimi_k3: option ", sw->option, " (", sw->env,
                                                   ") = '", text, "' is not ", what));
  };
  if (option == "spec_min") {
    if (!number || v < 1 || v > 16) return bad("a draft length in 1…16");
    policy->min_tokens = v;
  } else if (option == "spec_sampled_ngram") {
    if (!number || v < 1 || v > 8) return bad("an n-gram length in 1…8");
    policy->sampled_ngram = v;
  } else {  // spec_adapt
    if (text != "0" && text != "1") return bad("0 or 1");
    policy->adaptive = text == "1";
  }
  return true;
}

std::vector<int32_t> DraftBudget::Propose(std::span<const int32_t> context, int max_k,
                                          const LookupOptions& lookup, bool sampled,
                                          std::span<const int32_t> stop_ids) {
  const bool paused = pause_ > 0;
  int k = Next(max_k);  // counts a pause down
  if (max_k <= 0) return {};
  LookupOptions o = lookup;
  o.max_tokens = max_k;
  LookupMatch match = LookupDraftMatch(context, o);
  if (match.draft.empty()) return {};
  if (k == 0 && paused) {
    // The text is being quoted again: a match as long as the lookup tries ends the pause.
    if (!policy_.adaptive || lookup.ngram_max < 2 || match.ngram < lookup.ngram_max) {
      ++skips_.paused;
      return {};
    }
    pause_ = 0;
    ++skips_.pause_ended;
    k = std::clamp(length_, 1, max_k);
  }
  if (sampled && match.ngram < std::min(policy_.sampled_ngram, lookup.ngram_max)) {
    ++skips_.short_match;
    return {};
  }
  k = std::max(k, policy_.min_tokens);
  std::vector<int32_t>& draft = match.draft;
  if (draft.size() > static_cast<size_t>(k)) draft.resize(static_cast<size_t>(k));
  const auto stop = std::find_if(draft.begin(), draft.end(), [&](int32_t id) {
    return std::find(stop_ids.begin(), stop_ids.end(), id) != stop_ids.end();
  });
  draft.erase(stop, draft.end());
  if (draft.empty()) return {};
  if (draft.size() < static_cast<size_t>(policy_.min_tokens)) {
    ++skips_.short_draft;
    return {};
  }
  return std::move(draft);
}

int DraftBudget::Next(int max_k) {
  if (max_k <= 0) return 0;
  if (!policy_.adaptive) return max_k;
  if (pause_ > 0) {
    --pause_;
    return 0;
  }
  if (length_ <= 0 || length_ > max_k) length_ = length_ <= 0 ? max_k : std::min(length_, max_k);
  return length_;
}

void DraftBudget::Observe(size_t drafted, int accepted) {
  if (drafted == 0 || !policy_.adaptive) return;
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
