// plugins/kimi_k3/spec_lookup: draft tokens by prompt lookup, for speculative decoding.
//
//   std::vector<int32_t> draft = LookupDraft(context, {.max_tokens = 8});
//   // context = ... a b c X Y Z ... a b c  →  draft = X Y Z ... (up to 8 tokens)
//
// Kimi K3 has no multi-token-prediction head, so the drafts of spec decoding (spec_decode.h)
// come from the text itself, as in prompt-lookup decoding (llama.cpp's lookup decoding, vLLM's
// n-gram speculator): take the last n tokens of the context (prompt + generated, ending with the
// token being fed now), find their most recent earlier occurrence, and propose the tokens that
// followed it. n runs from ngram_max down to ngram_min; the first n that matches wins, so a
// longer match is preferred over a more recent shorter one. Pure function, no allocation beyond
// the result; cost O(context · ngram_max) per call (a few µs at K3's 8192-token context).
#ifndef COLI_PLUGINS_KIMI_K3_SPEC_LOOKUP_H_
#define COLI_PLUGINS_KIMI_K3_SPEC_LOOKUP_H_

#include <cstdint>
#include <span>
#include <vector>

namespace coli::k3 {

struct LookupOptions {
  int ngram_max = 3;   // longest suffix tried first
  int ngram_min = 1;   // shortest suffix tried last (>= 1)
  int max_tokens = 8;  // draft length cap (K)
};

// The up-to-max_tokens tokens that followed the most recent earlier occurrence of the longest
// matching suffix of `context` (n in [ngram_min, ngram_max]); empty when nothing matches, when
// max_tokens <= 0 or the options are inconsistent (ngram_min < 1 or > ngram_max). The
// continuation may run into the suffix itself (a repeating pattern); it never goes past the
// end of the context.
std::vector<int32_t> LookupDraft(std::span<const int32_t> context, const LookupOptions& options);

// LookupDraft's draft together with the length n of the suffix it matched (0 when the draft is
// empty): a longer match is stronger evidence that the text is being repeated, which the draft
// policy (spec_decode.h, DraftBudget::Propose) reads.
struct LookupMatch {
  std::vector<int32_t> draft;
  int ngram = 0;
};
LookupMatch LookupDraftMatch(std::span<const int32_t> context, const LookupOptions& options);

}  // namespace coli::k3

#endif  // COLI_PLUGINS_KIMI_K3_SPEC_LOOKUP_H_
