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
// std::uniform_real_distribution, whose algorithm is implementation-defined).
//
// Log-probabilities are always those of the model's own distribution, log_softmax(logits) at
// temperature 1 (what an API reports as `logprobs`), independent of the sampling knobs.
#ifndef COLI_COMMON_SAMPLING_SAMPLING_H_
#define COLI_COMMON_SAMPLING_SAMPLING_H_

#include <cstdint>
#include <random>
#include <span>
#include <vector>

namespace coli::sampling {

struct SamplerOptions {
  float temperature = 0.0f;  // <= 0: greedy
  float top_p = 1.0f;        // (0, 1]; >= 1 disables the nucleus cut
  int top_k = 0;             // 0 = all tokens
  uint64_t seed = 0;
  int logprobs = 0;          // how many top alternatives to report per token (0 = none)
};

struct TokenLogprob {
  int32_t id;
  float logprob;
};

struct Sample {
  int32_t id = -1;
  float logprob = 0.0f;            // log_softmax(logits)[id]
  std::vector<TokenLogprob> top;   // the `logprobs` most likely tokens, best first
};

// First index of the maximum (NaN logits are never chosen unless all are NaN → 0).
int32_t Greedy(std::span<const float> logits);

// log_softmax(logits) at temperature 1 for the `k` most likely ids, best first (ties: lower id
// first).
std::vector<TokenLogprob> TopLogprobs(std::span<const float> logits, int k);

// log_softmax(logits)[id], computed in double.
float Logprob(std::span<const float> logits, int32_t id);

// Stateful sampler: holds the RNG, so successive calls continue one reproducible stream.
// Not thread-safe; one per session.
class Sampler {
 public:
  explicit Sampler(const SamplerOptions& options = {});
  Sample Next(std::span<const float> logits);
  const SamplerOptions& options() const { return options_; }

 private:
  // Uniform double in [0, 1) from the top 53 bits of one 64-bit draw.
  double Uniform();
  SamplerOptions options_;
  std::mt19937_64 rng_;
};

}  // namespace coli::sampling

#endif  // COLI_COMMON_SAMPLING_SAMPLING_H_
