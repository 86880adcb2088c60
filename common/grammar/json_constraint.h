// common/grammar: constrained decoding for JSON outputs (OpenAI `response_format` json_object /
// json_schema, as vLLM's guided decoding and llama.cpp's json_schema grammars do it).
//
//   COLI_ASSIGN_OR_RETURN(auto c, grammar::JsonConstraint::FromResponseFormat(format_json));
//   grammar::JsonMatcher m(c);                       // one per generation
//   grammar::TokenFilter filter(token_bytes);        // one per vocabulary (a trie)
//   filter.Allowed(m, &allowed);                     // before sampling: mask the logits
//   m.Accept(tokenizer.TokenBytes(sampled));         // after sampling
//
// The matcher works on BYTES (tokens may end inside a UTF-8 character). Termination: every
// whitespace run it allows is bounded, so a schema whose strings, arrays and nesting are bounded
// always ends. Unsupported schema keywords are refused at compile time with INVALID_ARGUMENT
// naming their path, never ignored silently where they would change what is valid.
#ifndef COLI_COMMON_GRAMMAR_JSON_CONSTRAINT_H_
#define COLI_COMMON_GRAMMAR_JSON_CONSTRAINT_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace coli::grammar {

// A compiled constraint: which byte strings a constrained output may be. Immutable; shared by
// the matchers of every generation that uses it.
class JsonConstraint {
 public:
  // From an OpenAI `response_format` object (JSON text): {"type":"json_object"} (any JSON
  // object), {"type":"json_schema","json_schema":{"name":…,"schema":{…},"strict":…}};
  // {"type":"text"} gives a null pointer (no constraint). INVALID_ARGUMENT naming the path
  // ("response_format.json_schema.schema.properties.a.pattern: not supported") otherwise.
  static absl::StatusOr<std::shared_ptr<const JsonConstraint>> FromResponseFormat(
      std::string_view response_format_json);
  // From a bare JSON schema (JSON text); paths are named from "schema".
  static absl::StatusOr<std::shared_ptr<const JsonConstraint>> FromSchema(
      std::string_view schema_json);

  virtual ~JsonConstraint() = default;

 protected:
  JsonConstraint() = default;
};

// An object schema split per key: the constraint of each declared property's value and of any
// other key's value, each rooted at its node inside the whole schema's compiled grammar — so
// `$ref`s resolve and the schema's budgets hold exactly as in the whole (nothing is compiled
// again). Kimi K3's typed tool-call arguments constrain each key's value on its own with them.
struct ObjectProperties {
  struct Property {
    std::string name;  // decoded
    bool required = false;
    std::shared_ptr<const JsonConstraint> value;
  };
  std::vector<Property> properties;                  // in schema order
  std::shared_ptr<const JsonConstraint> additional;  // other keys' values; null: none allowed
};
// Nullopt unless `whole`'s root (after `$ref`s) is an object schema — a root `anyOf`, a type
// list, a non-object root or a null constraint do not split.
std::optional<ObjectProperties> SplitObject(const std::shared_ptr<const JsonConstraint>& whole);

// One generation's progress against a constraint: the bytes accepted so far. Copyable (a
// speculative verify or a what-if walk works on a copy).
class JsonMatcher {
 public:
  explicit JsonMatcher(std::shared_ptr<const JsonConstraint> constraint);
  JsonMatcher(const JsonMatcher&);
  JsonMatcher& operator=(const JsonMatcher&);
  JsonMatcher(JsonMatcher&&) noexcept;
  JsonMatcher& operator=(JsonMatcher&&) noexcept;
  ~JsonMatcher();

  // Feeds `bytes`: true and advanced when the constraint allows all of them in order; false and
  // unchanged otherwise.
  bool Accept(std::string_view bytes);
  // A complete value has been read: the output may end here.
  bool CanEnd() const;
  // Complete, and no byte may follow.
  bool MustEnd() const;
  // Bytes accepted so far.
  int64_t consumed() const;

 private:
  friend class TokenFilter;
  struct State;
  std::unique_ptr<State> state_;
};

// The tokens a matcher's state allows, for one vocabulary: a trie over the tokens' bytes, so a
// prefix shared by many tokens is matched once. Answers are memoised per state (least recently
// used first out) within a byte budget shared by every generation using the filter: each
// entry costs the vocabulary size + its state key + ~100 bytes, so the default 32 MiB holds
// ~200 states at Kimi K3's 163,840 tokens (a state repeats token after token inside a string;
// concurrent generations each have their own states, since every request compiles its own
// constraint). A miss costs the walk (docs/status/grammar.md: ~5-13 ms cold at that size).
class TokenFilter {
 public:
  static constexpr size_t kDefaultMemoBytes = size_t{32} << 20;

  // token_bytes[i]: the bytes token i stands for; an EMPTY entry (special / control tokens) is
  // never allowed by Allowed (the caller adds its end-of-output tokens when CanEnd()).
  // `memo_bytes`: the memo's budget (0 = no memo; below one entry's cost nothing is kept).
  explicit TokenFilter(const std::vector<std::string>& token_bytes,
                       size_t memo_bytes = kDefaultMemoBytes);
  ~TokenFilter();
  TokenFilter(const TokenFilter&) = delete;
  TokenFilter& operator=(const TokenFilter&) = delete;

  // allowed is resized to the vocabulary; allowed[i] = 1 when matcher.Accept(token i's bytes)
  // would succeed, else 0. Equal, token for token, to trying every token (tested).
  void Allowed(const JsonMatcher& matcher, std::vector<uint8_t>* allowed) const;
  int32_t vocab_size() const;

  // The memo's counters since construction (thread-safe snapshot).
  struct MemoStats {
    size_t entries = 0, bytes = 0;  // held now; bytes <= the budget
    size_t budget = 0;
    uint64_t hits = 0, misses = 0;
  };
  MemoStats memo_stats() const;
  // The cost the memo counts for one entry with a key of `key_bytes` bytes.
  size_t MemoEntryBytes(size_t key_bytes) const;

 private:
  struct Trie;
  std::unique_ptr<Trie> trie_;
};

}  // namespace coli::grammar

#endif  // COLI_COMMON_GRAMMAR_JSON_CONSTRAINT_H_
