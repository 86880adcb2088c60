#include "plugins/kimi_k3/spec_lookup.h"

#include <algorithm>

namespace coli::k3 {

LookupMatch LookupDraftMatch(std::span<const int32_t> context, const LookupOptions& options) {
  const int64_t size = static_cast<int64_t>(context.size());
  if (options.max_tokens <= 0 || options.ngram_min < 1 || options.ngram_min > options.ngram_max) {
    return {};
  }
  for (int64_t n = std::min<int64_t>(options.ngram_max, size - 1); n >= options.ngram_min; --n) {
    const auto suffix = context.subspan(static_cast<size_t>(size - n));
    // Occurrences start at i < size - n (so at least one token follows them); newest first.
    for (int64_t i = size - n - 1; i >= 0; --i) {
      if (!std::equal(suffix.begin(), suffix.end(), context.begin() + i)) continue;
      const int64_t from = i + n;
      const int64_t to = std::min(size, from + options.max_tokens);
      return {.draft = std::vector<int32_t>(context.begin() + from, context.begin() + to),
              .ngram = static_cast<int>(n)};
    }
  }
  return {};
}

std::vector<int32_t> LookupDraft(std::span<const int32_t> context, const LookupOptions& options) {
  return LookupDraftMatch(context, options).draft;
}

}  // namespace coli::k3
