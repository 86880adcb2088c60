// common/sampling: choosing the next token from a row of logits.
//
//   coli::sampling::Sampler sampler({.temperature = 0.7f, .top_p = 0.9f, .seed = 42,
//                                    .logprobs = 5});
//   coli::sampling::Sample s = sampler.Next(logits);   // s.id, s.logprob, s.top
//
// Greedy (temperature 0, the default) is the first index of the maximum logit. Otherwise the
// logits are divided by the temperature, softmaxed (in double), sorted descending (equal
// probabilities keep index order), cut to the top-k (k > 0) and then to the smallest prefix whose
// cumulative probability reaches top_p (top_p < 1), renormalised, and one token is drawn with
// a 64-bit Mersenne Twister seeded from `seed`: the same seed and logits give the same tokens
// on every platform (the uniform variate is built from the top 53 bits, not from
// std::uniform_real_distribution, whose algorithm is implementation-defined). The draw walks
// the kept tokens in that order until their cumulative probability passes u times the kept mass
// (the sum over the kept prefix in sorted order; with no cut at all, the total summed in index
// order), sorting only as far as it walks.
//
// Log-probabilities are always those of the model's own distribution, log_softmax(logits) at
// temperature 1 (what an API reports as `logprobs`), independent of the sampling knobs.
//
// The OpenAI / vLLM knobs (docs/status/sampling.md): logit_bias and the penalties come before
// the temperature, in vLLM's order, on a float copy of the logits: logit_bias (added),
// repetition_penalty (every token of the prompt or the output so far: logit > 0 ? logit / r :
// logit * r), frequency_penalty (minus f * count over the OUTPUT tokens), presence_penalty
// (minus p once per distinct output token). Greedy then takes the first maximum of these
// penalised logits; sampling applies temperature, top_k, top_p and finally min_p (keeps the
// tokens whose probability is at least min_p times the largest). The history the penalties
// read is a TokenHistory the caller keeps per generation:
//
//   coli::sampling::TokenHistory history;
//   history.Reset(prompt_ids);                        // a new generation
//   coli::sampling::Sample s = sampler.Next(logits, &history);
//   history.AddOutput(s.id);                          // the token joins the output
#ifndef COLI_COMMON_SAMPLING_SAMPLING_H_
#define COLI_COMMON_SAMPLING_SAMPLING_H_

#include <cstdint>
#include <map>
#include <random>
#include <span>
#include <utility>
#include <vector>

#include "absl/status/status.h"

namespace coli::sampling {

// One OpenAI logit_bias entry: `bias` is added to logits[id] before anything else.
struct LogitBias {
  int32_t id;
  float bias;
  bool operator==(const LogitBias&) const = default;
};

// The most logit_bias entries one request may carry (OpenAI documents no limit; 1024 keeps a
// request's per-step cost bounded while covering any realistic use).
inline constexpr int kMaxLogitBias = 1024;

struct SamplerOptions {
  float temperature = 0.0f;  // <= 0: greedy
  float top_p = 1.0f;        // (0, 1]; >= 1 disables the nucleus cut
  int top_k = 0;             // 0 = all tokens
  uint64_t seed = 0;
  int logprobs = 0;  // how many top alternatives to report per token (0 = none)
  // OpenAI / vLLM knobs; each default is neutral.
  float repetition_penalty = 1.0f;    // > 0; 1 = off (0 also means off: the ABI's zero)
  float frequency_penalty = 0.0f;     // [-2, 2]
  float presence_penalty = 0.0f;      // [-2, 2]
  float min_p = 0.0f;                 // [0, 1]; 0 = off
  std::vector<LogitBias> logit_bias;  // ids in [0, vocab), bias in [-100, 100]
};

// True when `o` sets any of the knobs that read or change logits before the temperature
// (logit_bias, repetition / frequency / presence penalty); min_p is not one of them.
bool HasPenalties(const SamplerOptions& o);

// Checks the OpenAI / vLLM knobs of `o` against their ranges (and logit_bias ids against
// `vocab_size` when it is > 0): INVALID_ARGUMENT naming the field, e.g.
// "frequency_penalty 2.5 is outside [-2, 2]" or "logit_bias: token id 99999 is outside [0, 1024)".
absl::Status ValidatePenalties(const SamplerOptions& o, int32_t vocab_size);

// The tokens the penalties read during one generation: the prompt (repetition_penalty only) and
// the tokens generated so far with their counts (all three penalties). Not thread-safe.
class TokenHistory {
 public:
  // Starts a new generation on `prompt` (its output is empty).
  void Reset(std::span<const int32_t> prompt);
  // `id` was generated (it joins the output).
  void AddOutput(int32_t id);
  // Distinct prompt ids, ascending.
  const std::vector<int32_t>& prompt() const { return prompt_; }
  // Output id -> how many times it was generated.
  const std::map<int32_t, int32_t>& output() const { return output_; }

 private:
  std::vector<int32_t> prompt_;
  std::map<int32_t, int32_t> output_;
};

// Applies logit_bias and the repetition / frequency / presence penalties of `o` to `logits` in
// place, in float, in vLLM's order. `history` may be null (no prompt, no output). Ids outside
// the span are ignored (ValidatePenalties refuses them first).
void ApplyPenalties(std::span<float> logits, const SamplerOptions& o, const TokenHistory* history);

struct TokenLogprob {
  int32_t id;
  float logprob;
};

struct Sample {
  int32_t id = -1;
  float logprob = 0.0f;           // log_softmax(logits)[id]
  std::vector<TokenLogprob> top;  // the `logprobs` most likely tokens, best first
};

// First index of the maximum (NaN logits are never chosen unless all are NaN → 0).
int32_t Greedy(std::span<const float> logits);

// log_softmax(logits) at temperature 1 for the `k` most likely ids, best first (ties: lower id
// first).
std::vector<TokenLogprob> TopLogprobs(std::span<const float> logits, int k);

// log_softmax(logits)[id], computed in double.
float Logprob(std::span<const float> logits, int32_t id);

// vLLM's rank of `id`: how many tokens have a log-probability (as Logprob reports it) at least
// id's, itself included, so ties count; 1 = the most likely. (vLLM: (logprobs >= lp).sum().)
int64_t LogprobRank(std::span<const float> logits, int32_t id);

// The distribution a Sampler with `o` draws from for these logits and history: probability per
// id after every knob (0 for a cut token); greedy gives 1 at the first maximum of the penalised
// logits. For tests and tools (the sampler itself draws without building it).
std::vector<double> ProcessedProbabilities(std::span<const float> logits, const SamplerOptions& o,
                                           const TokenHistory* history);

// Stateful sampler: holds the RNG, so successive calls continue one reproducible stream.
// Not thread-safe; one per session.
class Sampler {
 public:
  explicit Sampler(const SamplerOptions& options = {});
  // `history` (may be null: no prompt, no output) feeds the penalties; the caller adds the
  // returned token to it. Sample::logprob / top stay those of the raw logits.
  Sample Next(std::span<const float> logits, const TokenHistory* history = nullptr);
  // Draw-only Next: the same token Next would return for the same state, logits and history,
  // bit for bit, and the same advance of the RNG (one 64-bit draw for a sampled row, none for a
  // greedy one), without the log-probability and top logprobs Next computes besides (two passes
  // over the vocabulary and a partial sort: ~1 ms per call at K3's 163,840 ids). For callers
  // that only need the token, e.g. speculative decoding's verify, whose draws are made by a
  // copy of the sampler and thrown away. -1 for empty logits (as Next's id).
  int32_t Draw(std::span<const float> logits, const TokenHistory* history = nullptr);
  const SamplerOptions& options() const { return options_; }

 private:
  // Uniform double in [0, 1) from the top 53 bits of one 64-bit draw.
  double Uniform();
  SamplerOptions options_;
  std::mt19937_64 rng_;
  // Per-step buffers kept so a step does not allocate. A copy of the sampler (speculative
  // decoding verifies with one) starts with empty ones: only the RNG and knobs travel.
  template <class T>
  struct Scratch {
    std::vector<T> v;
    Scratch() = default;
    Scratch(const Scratch&) {}
    Scratch& operator=(const Scratch&) { return *this; }
  };
  Scratch<float> penalised_;                        // the logits after ApplyPenalties
  Scratch<std::pair<double, int32_t>> candidates_;  // (probability, id) of every candidate
};

}  // namespace coli::sampling

#endif  // COLI_COMMON_SAMPLING_SAMPLING_H_
