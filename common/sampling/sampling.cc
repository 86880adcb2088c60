#include "common/sampling/sampling.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

namespace coli::sampling {
namespace {

// log Σ exp(logits), in double, max-subtracted.
double LogSumExp(std::span<const float> logits) {
  double mx = -std::numeric_limits<double>::infinity();
  for (float v : logits) mx = std::max(mx, static_cast<double>(v));
  double sum = 0.0;
  for (float v : logits) sum += std::exp(static_cast<double>(v) - mx);
  return mx + std::log(sum);
}

}  // namespace

int32_t Greedy(std::span<const float> logits) {
  int32_t best = 0;
  for (size_t i = 1; i < logits.size(); ++i) {
    if (logits[i] > logits[best] || (std::isnan(logits[best]) && !std::isnan(logits[i])))
      best = static_cast<int32_t>(i);
  }
  return best;
}

float Logprob(std::span<const float> logits, int32_t id) {
  return static_cast<float>(static_cast<double>(logits[id]) - LogSumExp(logits));
}

std::vector<TokenLogprob> TopLogprobs(std::span<const float> logits, int k) {
  k = std::min<int>(k, static_cast<int>(logits.size()));
  if (k <= 0) return {};
  std::vector<int32_t> ids(logits.size());
  std::iota(ids.begin(), ids.end(), 0);
  auto better = [&](int32_t a, int32_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  };
  std::partial_sort(ids.begin(), ids.begin() + k, ids.end(), better);
  const double lse = LogSumExp(logits);
  std::vector<TokenLogprob> out;
  out.reserve(k);
  for (int i = 0; i < k; ++i)
    out.push_back({ids[i], static_cast<float>(static_cast<double>(logits[ids[i]]) - lse)});
  return out;
}

Sampler::Sampler(const SamplerOptions& options) : options_(options), rng_(options.seed) {}

double Sampler::Uniform() { return static_cast<double>(rng_() >> 11) * 0x1.0p-53; }

Sample Sampler::Next(std::span<const float> logits) {
  Sample s;
  if (logits.empty()) return s;
  if (options_.temperature <= 0.0f) {
    s.id = Greedy(logits);
  } else {
    const double inv_t = 1.0 / options_.temperature;
    double mx = -std::numeric_limits<double>::infinity();
    for (float v : logits) mx = std::max(mx, v * inv_t);
    std::vector<std::pair<double, int32_t>> cand(logits.size());
    double total = 0.0;
    for (size_t i = 0; i < logits.size(); ++i) {
      const double p = std::exp(logits[i] * inv_t - mx);
      cand[i] = {p, static_cast<int32_t>(i)};
      total += p;
    }
    auto order = [](const auto& a, const auto& b) {
      return a.first > b.first || (a.first == b.first && a.second < b.second);
    };
    size_t keep = cand.size();
    if (options_.top_k > 0 && static_cast<size_t>(options_.top_k) < keep) {
      keep = options_.top_k;
      std::partial_sort(cand.begin(), cand.begin() + keep, cand.end(), order);
    } else {
      std::sort(cand.begin(), cand.end(), order);
    }
    double kept_mass = 0.0;
    for (size_t i = 0; i < keep; ++i) kept_mass += cand[i].first;
    if (options_.top_p > 0.0f && options_.top_p < 1.0f) {
      // Smallest prefix whose probability (relative to the full distribution) reaches top_p.
      const double target = options_.top_p * total;
      double cum = 0.0;
      size_t n = 0;
      while (n < keep) {
        cum += cand[n].first;
        ++n;
        if (cum >= target) break;
      }
      keep = n;
      kept_mass = cum;
    }
    const double u = Uniform() * kept_mass;
    double cum = 0.0;
    s.id = cand[keep - 1].second;
    for (size_t i = 0; i < keep; ++i) {
      cum += cand[i].first;
      if (u < cum) {
        s.id = cand[i].second;
        break;
      }
    }
  }
  s.logprob = Logprob(logits, s.id);
  if (options_.logprobs > 0) s.top = TopLogprobs(logits, options_.logprobs);
  return s;
}

}  // namespace coli::sampling
