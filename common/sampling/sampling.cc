#include "common/sampling/sampling.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <utility>

#include "absl/strings/str_cat.h"

namespace coli::sampling {
namespace {

bool InRange(float v, float lo, float hi) { return v >= lo && v <= hi; }  // false for NaN

// The candidates a sampling draw chooses from: (unnormalised probability, id) for every id, of
// which the first `keep` in the order of descending probability (ties: lower id first) are kept,
// carrying `mass` in total. Temperature, then top_k, top_p, min_p.
//
// Only as much of the list is sorted as the cuts and the draw read: (probability, id) is a total
// order, so a partial sort's prefix is exactly a full sort's, and sorting more of the rest later
// extends it in the same order. A nucleus or min_p cut over K3's 163,840 ids then costs a
// selection instead of a full sort (~15 ms per sampled token), and so does a draw with no cut at
// all on a peaked distribution: it sorts only as far as it walks (`SortPast`). When the cuts
// keep every candidate, `mass` is the total summed in index order (no sort needed); otherwise
// the kept prefix summed in sorted order.
// `cand` is the caller's buffer (a Sampler reuses its own from step to step).
struct Kept {
  std::vector<std::pair<double, int32_t>>& cand;
  size_t keep = 0;
  double mass = 0.0;
  size_t sorted = 0;  // cand[0, sorted) is the fully sorted list's prefix

  // Descending probability, ties by ascending id (a functor, so the sorts inline it).
  struct Before {
    bool operator()(const std::pair<double, int32_t>& a, const std::pair<double, int32_t>& b) const {
      return a.first > b.first || (a.first == b.first && a.second < b.second);
    }
  };
  // Makes cand[0, min(m, size)) the fully sorted list's prefix. A short extension selects with a
  // heap (one comparison for most of the rest); a long one partitions (linear) and sorts the
  // part, which beats a heap's log factor there.
  void SortTo(size_t m) {
    const size_t n = cand.size();
    m = std::min(m, n);
    if (m <= sorted) return;
    const auto first = cand.begin() + static_cast<ptrdiff_t>(sorted);
    const auto mid = cand.begin() + static_cast<ptrdiff_t>(m);
    if (m == n) {
      std::sort(first, cand.end(), Before());
    } else if ((m - sorted) * 64 <= n - sorted) {
      std::partial_sort(first, mid, cand.end(), Before());
    } else {
      std::nth_element(first, mid, cand.end(), Before());
      std::sort(first, mid, Before());
    }
    sorted = m;
  }
  // Extends the sorted prefix past index i, in growing steps (256, then doubling), for a walk
  // that reads the list in order and may stop early.
  void SortPast(size_t i) {
    if (i >= sorted) SortTo(std::max<size_t>({256, 2 * sorted, i + 1}));
  }
};

Kept Cut(std::span<const float> logits, const SamplerOptions& o,
         std::vector<std::pair<double, int32_t>>& buffer) {
  Kept k{buffer};
  const double inv_t = 1.0 / o.temperature;
  double mx = -std::numeric_limits<double>::infinity();
  for (float v : logits) mx = std::max(mx, v * inv_t);
  k.cand.resize(logits.size());
  double total = 0.0;
  for (size_t i = 0; i < logits.size(); ++i) {
    const double p = std::exp(logits[i] * inv_t - mx);
    k.cand[i] = {p, static_cast<int32_t>(i)};
    total += p;
  }
  const size_t n = k.cand.size();
  k.keep = n;
  if (o.top_k > 0 && static_cast<size_t>(o.top_k) < n) {
    k.keep = o.top_k;
    k.SortTo(k.keep);
  }
  if (o.top_p > 0.0f && o.top_p < 1.0f) {
    // Smallest prefix whose probability (relative to the full distribution) reaches top_p.
    const double target = o.top_p * total;
    double cum = 0.0;
    size_t i = 0;
    while (i < k.keep) {
      k.SortPast(i);  // never past keep: a top_k cut sorted all of it already
      cum += k.cand[i].first;
      ++i;
      if (cum >= target) break;
    }
    k.keep = i;
  }
  if (o.min_p > 0.0f) {
    // Tokens at least min_p times as likely as the most likely one; the ratio is the same before
    // and after any renormalisation, so the cut is a prefix of the sorted list (at least 1).
    k.SortTo(1);
    const double threshold = static_cast<double>(o.min_p) * k.cand[0].first;
    if (k.keep > k.sorted) {  // no top_k / top_p cut: count the candidates, then sort just those
      k.keep = std::max<size_t>(
          1, static_cast<size_t>(std::count_if(k.cand.begin(), k.cand.end(), [&](const auto& c) {
            return c.first >= threshold;
          })));
    }
    k.SortTo(k.keep);
    while (k.keep > 1 && k.cand[k.keep - 1].first < threshold) --k.keep;
  }
  if (k.keep == n) {
    k.mass = total;  // nothing cut: the list stays unsorted until a draw walks it
  } else {
    k.SortTo(k.keep);
    for (size_t i = 0; i < k.keep; ++i) k.mass += k.cand[i].first;
  }
  return k;
}

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

int64_t LogprobRank(std::span<const float> logits, int32_t id) {
  // Compared as the reported floats: two logits that round to one logprob tie, as in vLLM.
  const double lse = LogSumExp(logits);
  const float own = static_cast<float>(static_cast<double>(logits[id]) - lse);
  int64_t at_least = 0;
  for (float v : logits) at_least += static_cast<float>(static_cast<double>(v) - lse) >= own;
  return at_least;
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

bool HasPenalties(const SamplerOptions& o) {
  return !o.logit_bias.empty() || (o.repetition_penalty > 0.0f && o.repetition_penalty != 1.0f) ||
         o.frequency_penalty != 0.0f || o.presence_penalty != 0.0f;
}

absl::Status ValidatePenalties(const SamplerOptions& o, int32_t vocab_size) {
  if (!InRange(o.frequency_penalty, -2.0f, 2.0f)) {
    return absl::InvalidArgumentError(
        absl::StrCat("frequency_penalty ", o.frequency_penalty, " is outside [-2, 2]"));
  }
  if (!InRange(o.presence_penalty, -2.0f, 2.0f)) {
    return absl::InvalidArgumentError(
        absl::StrCat("presence_penalty ", o.presence_penalty, " is outside [-2, 2]"));
  }
  if (!(o.repetition_penalty >= 0.0f && std::isfinite(o.repetition_penalty))) {
    return absl::InvalidArgumentError(absl::StrCat("repetition_penalty ", o.repetition_penalty,
                                                   " must be > 0 (1 = off) and finite"));
  }
  if (!InRange(o.min_p, 0.0f, 1.0f)) {
    return absl::InvalidArgumentError(absl::StrCat("min_p ", o.min_p, " is outside [0, 1]"));
  }
  if (o.logit_bias.size() > static_cast<size_t>(kMaxLogitBias)) {
    return absl::InvalidArgumentError(
        absl::StrCat("logit_bias has ", o.logit_bias.size(), " entries; at most ", kMaxLogitBias));
  }
  std::vector<int32_t> ids;
  ids.reserve(o.logit_bias.size());
  for (const LogitBias& b : o.logit_bias) {
    if (b.id < 0 || (vocab_size > 0 && b.id >= vocab_size)) {
      // Without a vocabulary (checked before the model is known) only the lower bound is.
      return absl::InvalidArgumentError(
          vocab_size > 0
              ? absl::StrCat("logit_bias: token id ", b.id, " is outside [0, ", vocab_size, ")")
              : absl::StrCat("logit_bias: token id ", b.id, " is negative"));
    }
    if (!InRange(b.bias, -100.0f, 100.0f)) {
      return absl::InvalidArgumentError(absl::StrCat("logit_bias: the bias of token id ", b.id,
                                                     ", ", b.bias, ", is outside [-100, 100]"));
    }
    ids.push_back(b.id);
  }
  std::sort(ids.begin(), ids.end());
  if (auto d = std::adjacent_find(ids.begin(), ids.end()); d != ids.end()) {
    return absl::InvalidArgumentError(
        absl::StrCat("logit_bias: token id ", *d, " appears more than once"));
  }
  return absl::OkStatus();
}

void TokenHistory::Reset(std::span<const int32_t> prompt) {
  prompt_.assign(prompt.begin(), prompt.end());
  std::sort(prompt_.begin(), prompt_.end());
  prompt_.erase(std::unique(prompt_.begin(), prompt_.end()), prompt_.end());
  output_.clear();
}

void TokenHistory::AddOutput(int32_t id) { ++output_[id]; }

void ApplyPenalties(std::span<float> logits, const SamplerOptions& o, const TokenHistory* history) {
  const auto valid = [&](int32_t id) { return id >= 0 && static_cast<size_t>(id) < logits.size(); };
  for (const LogitBias& b : o.logit_bias) {
    if (valid(b.id)) logits[b.id] += b.bias;
  }
  if (history == nullptr) return;
  const float r = o.repetition_penalty;
  if (r > 0.0f && r != 1.0f) {
    auto penalise = [&](int32_t id) {
      if (!valid(id)) return;
      float& l = logits[id];
      l = l > 0.0f ? l / r : l * r;
    };
    for (int32_t id : history->prompt()) penalise(id);
    for (const auto& [id, count] : history->output()) {
      // A token of both the prompt and the output is penalised once.
      if (!std::binary_search(history->prompt().begin(), history->prompt().end(), id)) {
        penalise(id);
      }
    }
  }
  if (o.frequency_penalty != 0.0f || o.presence_penalty != 0.0f) {
    for (const auto& [id, count] : history->output()) {
      if (!valid(id) || count <= 0) continue;
      logits[id] -= o.frequency_penalty * static_cast<float>(count);
      logits[id] -= o.presence_penalty;
    }
  }
}

std::vector<double> ProcessedProbabilities(std::span<const float> logits, const SamplerOptions& o,
                                           const TokenHistory* history) {
  std::vector<double> probs(logits.size(), 0.0);
  if (logits.empty()) return probs;
  std::vector<float> work(logits.begin(), logits.end());
  ApplyPenalties(work, o, history);
  if (o.temperature <= 0.0f) {
    probs[Greedy(work)] = 1.0;
    return probs;
  }
  std::vector<std::pair<double, int32_t>> buffer;
  const Kept k = Cut(work, o, buffer);
  // The first `keep` entries are the kept ones (all of them, unsorted, when nothing was cut).
  for (size_t i = 0; i < k.keep; ++i) probs[k.cand[i].second] = k.cand[i].first / k.mass;
  return probs;
}

Sampler::Sampler(const SamplerOptions& options) : options_(options), rng_(options.seed) {}

double Sampler::Uniform() { return static_cast<double>(rng_() >> 11) * 0x1.0p-53; }

int32_t Sampler::Draw(std::span<const float> logits, const TokenHistory* history) {
  if (logits.empty()) return -1;
  std::span<const float> work = logits;
  if (HasPenalties(options_)) {
    penalised_.v.assign(logits.begin(), logits.end());
    ApplyPenalties(penalised_.v, options_, history);
    work = penalised_.v;
  }
  if (options_.temperature <= 0.0f) return Greedy(work);
  // Walk the kept candidates in sorted order until the cumulative probability passes u·mass,
  // sorting only as far as the walk goes (a peaked distribution stops within the first few).
  Kept k = Cut(work, options_, candidates_.v);
  const double u = Uniform() * k.mass;
  double cum = 0.0;
  size_t i = 0;
  for (; i < k.keep; ++i) {
    k.SortPast(i);
    cum += k.cand[i].first;
    if (u < cum) break;
  }
  // Rounding (the sorted-order sum ending just below mass): the last kept candidate.
  return k.cand[std::min(i, k.keep - 1)].second;
}

// Next is Draw plus the reports, so the two cannot drift apart.
Sample Sampler::Next(std::span<const float> logits, const TokenHistory* history) {
  Sample s;
  if (logits.empty()) return s;
  s.id = Draw(logits, history);
  s.logprob = Logprob(logits, s.id);
  if (options_.logprobs > 0) s.top = TopLogprobs(logits, options_.logprobs);
  return s;
}

}  // namespace coli::sampling
