// plugins/kimi_k3/spec_decode: speculative decoding by prompt lookup, verified as one chunk.
//
//   SpecDecoder spec;                          // one per conversation, beside its Session
//   DraftBudget policy;                        // the draft policy, reset at every prefill
//   // the token t sampled last is fed now; draft d1…dK by prompt lookup (spec_lookup.h):
//   std::vector<int32_t> draft = policy.Propose(record_and_t, K, {}, /*sampled=*/false);
//   COLI_ASSIGN_OR_RETURN(SpecDecoder::Verified v, spec.Verify(session, t, draft));  // greedy
//   // a sampled (or penalised) row: draws of a copy of its step's sampler (never the real one)
//   v = spec.VerifyWithSampler(session, t, draft, row_sampler, &history);
//   // v.logits: after t (x1 = what the row draws from them); x2…x(m+1) wait in the buffer:
//   std::optional<std::vector<float>> next = spec.Take(x1);   // no forward pass
//
// Verify runs [t, d1…dK] as ONE chunk (Session::StepAll: the logits of every row, each
// bit-identical to a one-token Step) after checkpointing the session. The caller's `emit(row i)`
// is the token the row would emit from row i's logits (greedy: its argmax; sampled: a draw of a
// copy of its sampler); d(i+1) is accepted while emit(row i) == d(i+1). With m accepted, the
// emitted tokens are x1…x(m+1) = emit(row 0…m) (the accepted drafts, then the correction — or
// the bonus when m = K). When m < K the session is put back to "consumed t, x1…xm" without a
// second pass (Session::Replay): the verify pass recorded each KDA layer's per-row update inputs
// (Session::StepAll's ReplayRecord), so the checkpoint's recurrent state is advanced over rows
// 0…m again by the forward pass's own per-row code (conv windows + delta rule: one pass over S
// per row and layer, no matmul, no expert read), the MLA caches are cut to the new position
// (their rows 0…m are causal, already right). x(m+1) is fed by the next step as usual. The
// logits after x1…xm stay buffered: each later Take(token) hands out the next one when `token`
// is the buffered token, without a pass.
//
// Why a sampled row stays exact (seeded streams bit for bit): a lookup draft is deterministic
// (a point mass), so speculative sampling's acceptance probability for d is p(d), the chance
// that the row's own sampler draws d — accept exactly when a copy of that sampler draws d. The
// copy starts from the real sampler's state and sees the same logits in the same order as the
// real one will (row 0 now, rows 1…m from the buffer), so the real sampler later draws exactly
// x1…x(m+1), with the same logprobs: the output is what one step at a time gives.
//
// Until the buffer is drained the session's state is ahead of what was delivered (the record
// holds undelivered tokens). The pre-verify checkpoint and the replay record are kept for that
// time: Rewind() replays t and the delivered tokens onto the checkpoint (Session::Replay, no
// forward pass either), so the record is exactly the delivered one (used when the host feeds a
// different token or ends the turn early: stop string, max tokens, cancel, a sampled row whose
// knobs changed).
//
// A buffered token is sampled by the caller from its buffered logits with its normal sampler, so
// logprobs are the normal path's. Rows with penalties or logit_bias are verified by an `emit` that
// draws with a copy of the sampler and of its token history, advanced row by row. Cost: one
// checkpoint copy of the recurrent state per verify (K3: 434 MB), a chunk of K+1 rows, and when a
// draft token is rejected a replay of m+1 rows (K3: one pass over the 6.3 MB state per row and KDA
// layer, plus a copy back of the checkpoint). Memory: the checkpoint (K3: 434 MB) and the replay
// record (K3: 13.6 MB per chunk row), whose buffers are both kept between verifies (Clear()
// releases them).
//
// Threading: as Session (one thread at a time, the caller holds the model's forward lock).
#ifndef COLI_PLUGINS_KIMI_K3_SPEC_DECODE_H_
#define COLI_PLUGINS_KIMI_K3_SPEC_DECODE_H_

#include <cstdint>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "common/sampling/sampling.h"
#include "plugins/kimi_k3/session.h"
#include "plugins/kimi_k3/spec_lookup.h"

namespace coli::k3 {

class SpecDecoder {
 public:
  struct Verified {
    std::vector<float> logits;  // after the fed token ([V]); x1 = emit(logits)
    int accepted = 0;           // m: drafts accepted (0…K)
    int64_t replayed = 0;       // rows replayed to drop the rejected drafts: m + 1 when m < K
  };

  // The token a row emits from its logits (`emit` of Verify). Called for rows 0, 1, … in order,
  // at most once each, and not after the first draft token it does not match.
  using RowToken = absl::FunctionRef<int32_t(std::span<const float> logits)>;

  // Feeds `token` and verifies `draft` (at least one token) in one chunk, as described above,
  // accepting d(i+1) while emit(row i) == d(i+1). Nothing may be buffered (FAILED_PRECONDITION).
  // The session must have room for 1 + draft.size() tokens (RESOURCE_EXHAUSTED from Session
  // otherwise; the caller shrinks K). On any error the session is returned to where it was (the
  // checkpoint is restored) and the error returned; nothing is buffered.
  absl::StatusOr<Verified> Verify(Session& session, int32_t token, std::span<const int32_t> draft,
                                  RowToken emit);
  // A greedy row: emit = sampling::Greedy (the first maximum).
  absl::StatusOr<Verified> Verify(Session& session, int32_t token, std::span<const int32_t> draft);
  // A row drawn by `sampler` (the sampler its next step will draw with; any knobs): emit = a
  // draw of a COPY of it (sampling::Sampler::Draw: the token Next draws, without Next's logprob
  // and top logprobs, which a verify throws away — ~1 ms per row at K3's vocabulary), with a copy
  // of `history` (may be null: no prompt, no output) to which each row's draw is added before the
  // next row draws, as the caller adds each delivered token to the real one. `sampler` and
  // `history` are not changed: when the tokens are handed out, the real sampler draws exactly
  // x1…x(m+1). A plain greedy sampler (temperature <= 0, no penalty) takes the argmax, as above.
  absl::StatusOr<Verified> VerifyWithSampler(Session& session, int32_t token,
                                             std::span<const int32_t> draft,
                                             const sampling::Sampler& sampler,
                                             const sampling::TokenHistory* history);

  // Tokens the session consumed beyond what was handed out (they lead its record).
  size_t undelivered() const { return ahead_.size() - next_; }
  // The next buffered token, or -1 when none.
  int32_t peek() const { return undelivered() > 0 ? ahead_[next_] : -1; }
  // When `token` is the next buffered token: its logits (bit-identical to Step(token) at that
  // position) and the buffer advances (the checkpoint is dropped once drained). nullopt when
  // nothing is buffered or `token` is another one (nothing changes then; see Rewind).
  std::optional<std::vector<float>> Take(int32_t token);
  // Returns the session to the delivered record (the pre-verify checkpoint with the fed token
  // and the delivered drafts replayed onto it, Session::Replay: no forward pass) and forgets the
  // buffer. Returns the logits after the record's last token, or nullopt when nothing was
  // undelivered (nothing runs). On error the buffer is forgotten and the session may be broken
  // (the caller resets it).
  absl::StatusOr<std::optional<std::vector<float>>> Rewind(Session& session);
  // Forgets the buffer and the checkpoint without touching a session (after a Reset), and
  // releases the checkpoint's and the replay record's buffers.
  void Clear();
  // Rows replayed by Verify and Rewind since construction (each a pass over every KDA layer's
  // state instead of a forward pass).
  int64_t replayed_rows() const { return replayed_rows_; }

 private:
  // Clear() that keeps the checkpoint's and the replay record's buffers for the next verify.
  void Forget();

  int32_t fed_ = -1;                        // t of the last verify
  std::vector<int32_t> ahead_;              // x1…xm, consumed by the session
  std::vector<std::vector<float>> logits_;  // logits_[0]: after fed_; logits_[i]: after ahead_[i-1]
  size_t next_ = 0;                         // ahead_[0, next_) were handed out
  Checkpoint before_;                       // the state before `fed_`, valid while buffered
  ReplayRecord record_;                     // the verify chunk's rows, kept while buffered
  int64_t replayed_rows_ = 0;
};

// The draft policy's switches (docs/status/spec-decoding.md "Switches"). The defaults are the
// adaptive policy; {.min_tokens = 1, .sampled_ngram = 1, .adaptive = false} is the fixed one
// (vLLM's n-gram proposer: every match drafted, always K tokens).
struct DraftPolicy {
  // Drafts shorter than this are not verified (llama.cpp's --draft-min): a verify costs a
  // checkpoint, a chunk of draft + 1 rows and, on a miss, a replay, for at most draft + 1 tokens.
  // 1…16; a draft cut short (context end, stop token, room) below it is dropped too.
  int min_tokens = 1;
  // A SAMPLED row (temperature > 0) drafts only on a suffix match of at least this many tokens
  // (capped at the lookup's ngram_max): a sampled row accepts a draft token with probability
  // p(draft), high only where the text is really being repeated, while a 1-gram match in free
  // text is mostly chance. 1…8; 1 = any match.
  int sampled_ngram = 3;
  // true: the draft length adapts to acceptance and misses pause drafting (DraftBudget below),
  // and a match of the lookup's full ngram_max (>= 2) ends a pause at once. false: always the
  // maximum, never a pause.
  bool adaptive = true;
  bool operator==(const DraftPolicy&) const = default;
};

// The policy's switches by name: the plugin's extra option (left) and k3-run's / the client's
// environment variable (right).
struct DraftPolicySwitch {
  const char* option;
  const char* env;
};
inline constexpr DraftPolicySwitch kDraftPolicySwitches[] = {
    {"spec_min", "COLI_K3_SPEC_MIN"},
    {"spec_sampled_ngram", "COLI_K3_SPEC_SAMPLED_NGRAM"},
    {"spec_adapt", "COLI_K3_SPEC_ADAPT"},
};
// Parses `value` of the switch whose option name is `option` into *policy. Returns false (and
// changes nothing) when `option` is not one of them; INVALID_ARGUMENT naming the option, its
// variable, the value and the range when the value is bad ("kimi_k3: option spec_min
// (COLI_K3_SPEC_MIN) = '0' is not a draft length in 1…16"). Values: spec_min 1…16,
// spec_sampled_ngram 1…8, spec_adapt 0 or 1.
absl::StatusOr<bool> ParseDraftPolicySwitch(std::string_view option, std::string_view value,
                                            DraftPolicy* policy);

// The draft policy of one conversation: whether to draft at this step, how long, and the draft
// itself. Wrong drafts cost a chunk of K+1 rows and a replay, so a conversation that does not
// repeat itself should stop paying for them. Adaptive (the default): the length starts at the
// maximum, doubles back towards it after a fully accepted draft, and becomes accepted + 1 after
// a partial one (never below min_tokens); a draft with nothing accepted also pauses drafting
// for 1, 2, 4 … 32 steps (consecutive misses double the pause, any accepted token ends the
// streak), but a match of the lookup's full ngram_max (>= 2 tokens: the text is being quoted
// again) ends a pause at once. Sampled rows draft only on matches of >= sampled_ngram tokens,
// and drafts shorter than min_tokens are dropped. Only the number of passes changes: every
// emitted token is verified either way. Reset it at every prefill.
//
//   DraftBudget budget(policy);
//   std::vector<int32_t> draft = budget.Propose(context, max_k, lookup, sampled, stop_ids);
//   if (!draft.empty()) { v = spec.Verify…(…, draft, …); budget.Observe(draft.size(), m); }
//
// Next/Observe are the length rule alone (used by Propose; callers that do their own lookup may
// still use them).
class DraftBudget {
 public:
  static constexpr int kMaxPause = 32;
  DraftBudget() = default;
  explicit DraftBudget(const DraftPolicy& policy) : policy_(policy) {}

  // The draft for this step (empty: take a normal step): the lookup's (spec_lookup.h) draft
  // for `context` (the record + the token being fed), cut before the first of `stop_ids`, at
  // most the length the policy allows now and at most `max_k` (the switch's K shrunk to the
  // context room). `sampled`: the row samples (temperature > 0), so short matches do not draft.
  // Each call is one decode step (a pause counts down).
  std::vector<int32_t> Propose(std::span<const int32_t> context, int max_k,
                               const LookupOptions& lookup, bool sampled,
                               std::span<const int32_t> stop_ids = {});
  // The draft length to use at this step (0 = skip drafting now); `max_k` = the switch's K
  // shrunk to the context room. Each call is one decode step (a pause counts down).
  int Next(int max_k);
  // The outcome of a verify: `drafted` tokens proposed, `accepted` of them accepted.
  void Observe(size_t drafted, int accepted);

  const DraftPolicy& policy() const { return policy_; }
  // Why Propose returned no draft although the lookup matched, since construction.
  struct Skips {
    int64_t paused = 0;       // a pause after misses
    int64_t short_match = 0;  // a sampled row's match shorter than sampled_ngram
    int64_t short_draft = 0;  // a draft shorter than min_tokens (or max_k below it)
    int64_t pause_ended = 0;  // (not a skip) pauses ended by a full-length match
  };
  const Skips& skips() const { return skips_; }

 private:
  DraftPolicy policy_;
  int length_ = 0;  // 0 = not started: the maximum
  int pause_ = 0;   // steps left without drafting
  int misses_ = 0;  // consecutive drafts with nothing accepted
  Skips skips_;
};

}  // namespace coli::k3

#endif  // COLI_PLUGINS_KIMI_K3_SPEC_DECODE_H_
