// grammar_filter_bench: milliseconds per TokenFilter::Allowed call at Kimi K3's vocabulary size
// for typical matcher states (not a test: performance lives outside ctest).
//
//   build/bin/grammar_filter_bench [TOKENIZER_DIR]
//
// TOKENIZER_DIR holds tiktoken.model (or tokenizer.json) + tokenizer_config.json, e.g. the
// 163,840-token fixture build/fixtures/tiktoken/kimi made by tests/node/tiktoken. Without one, a
// synthetic 163,840-token vocabulary is made from the tiny fixture's tokens (random
// concatenations of 1-4 of them). Special tokens count as empty (never allowed).
//
// "cold" calls see a state for the first time (a freshly compiled constraint each, so the memo
// cannot answer); "memo" calls repeat a state.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "common/grammar/json_constraint.h"
#include "common/tokenizer/tokenizer.h"

namespace {

using coli::grammar::JsonConstraint;
using coli::grammar::JsonMatcher;
using coli::grammar::TokenFilter;
using Clock = std::chrono::steady_clock;

std::vector<std::string> Vocabulary(int argc, char** argv, std::string* source) {
  std::vector<std::string> bytes;
  const std::string dir =
      argc > 1 ? argv[1]
               : std::string(COLI_BENCH_SOURCE_DIR) + "/tests/common/tokenizer/data/kimi_tiny";
  auto tok = coli::tok::Tokenizer::LoadDir(dir);
  if (!tok.ok()) {
    std::fprintf(stderr, "%s: %s\n", dir.c_str(), std::string(tok.status().message()).c_str());
    std::exit(1);
  }
  for (int32_t i = 0; i < (*tok)->vocab_size(); ++i) {
    bytes.push_back((*tok)->IsSpecial(i) ? std::string() : std::string((*tok)->TokenBytes(i)));
  }
  *source = dir;
  if (argc > 1) return bytes;
  // Synthetic: random concatenations of the tiny vocabulary's tokens, unique, 163,840 in all.
  std::vector<std::string> base;
  for (const std::string& b : bytes) {
    if (!b.empty()) base.push_back(b);
  }
  std::mt19937 rng(1);
  std::set<std::string> seen(base.begin(), base.end());
  std::vector<std::string> out(base.begin(), base.end());
  while (out.size() < 163840 - 256) {
    std::string t;
    const int parts = 1 + static_cast<int>(rng() % 4);
    for (int p = 0; p < parts; ++p) t += base[rng() % base.size()];
    if (seen.insert(t).second) out.push_back(t);
  }
  out.resize(163840, std::string());
  *source += " (synthetic 163,840 tokens from its vocabulary)";
  return out;
}

struct Scenario {
  const char* name;
  const char* schema;
  const char* prefix;
};

}  // namespace

int main(int argc, char** argv) {
  std::string source;
  const std::vector<std::string> vocab = Vocabulary(argc, argv, &source);
  const auto t0 = Clock::now();
  TokenFilter filter(vocab);
  const double build_ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  std::printf("vocabulary: %s, %d tokens; trie built in %.1f ms\n", source.c_str(),
              filter.vocab_size(), build_ms);

  const char* kObject =
      R"({"type":"object","properties":{"name":{"type":"string","maxLength":1000000},
      "age":{"type":"integer"},"score":{"type":"number"},"tags":{"type":"array",
      "items":{"type":"string"}},"address":{"type":"object","properties":{
      "city":{"type":"string"}},"required":["city"]}},"required":["name","age"],
      "additionalProperties":false})";
  // Wide schemas: an enum of 1,000 strings, an object of 100 optional properties.
  std::string wide_enum = R"({"type":"object","properties":{"e":{"enum":[)";
  std::string wide_object = R"({"type":"object","properties":{)";
  for (int i = 0; i < 1000; ++i) {
    wide_enum +=
        (i ? ",\"" : "\"") + std::string("value_") + std::to_string(i * 7919 % 1000) + "\"";
  }
  for (int i = 0; i < 100; ++i) {
    wide_object += (i ? ",\"" : "\"") + std::string("field_") + std::to_string(i) +
                   "\":{\"type\":\"integer\"}";
  }
  wide_enum += "]}}}";
  wide_object += "}}";
  const Scenario scenarios[] = {
      {"inside a string", kObject, R"({"name": "Ada Lovelace, born )"},
      {"after '{'", kObject, "{"},
      {"inside an integer", kObject, R"({"name": "x", "age": 3)"},
      {"inside a number", kObject, R"({"name": "x", "age": 3, "score": -1.2)"},
      {"after ',' in an array", kObject, R"({"name": "x", "age": 3, "tags": ["a",)"},
      {"json_object after '{'", R"({"type":"object"})", "{"},
      {"json_object value start", R"({"type":"object"})", R"({"k": )"},
      {"anyOf: 2 threads in a string",
       R"({"anyOf":[{"type":"object","properties":{"name":{"type":"string"},
       "a":{"type":"integer"}}},{"type":"object","properties":{"name":{"type":"string"},
       "b":{"type":"boolean"}}}]})",
       R"({"name": "abc)"},
      {"enum of 1,000 strings, value start", wide_enum.c_str(), R"({"e": )"},
      {"enum of 1,000 strings, after \"value_1", wide_enum.c_str(), R"({"e": "value_1)"},
      {"100 optional properties, after '{'", wide_object.c_str(), "{"},
      {"100 optional properties, after ','", wide_object.c_str(), R"({"field_3": 1,)"},
      {"inside a pattern string (unanchored)",
       R"({"type":"object","properties":{"p":{"type":"string","pattern":"[0-9]{3}-x"}}})",
       R"({"p": "call me at 55)"},
      {"inside a date-time (format)",
       R"({"type":"object","properties":{"t":{"type":"string","format":"date-time"}}})",
       R"({"t": "2024-02-2)"},
      {"inside an email (format)",
       R"({"type":"object","properties":{"e":{"type":"string","format":"email"}}})",
       R"({"e": "ada.love)"},
      {"inside a bounded integer [-40, 1234]",
       R"({"type":"object","properties":{"n":{"type":"integer","minimum":-40,"maximum":1234}}})",
       R"({"n": 12)"},
  };
  std::vector<uint8_t> allowed;
  auto ms_since = [](Clock::time_point start) {
    return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
  };
  for (const Scenario& s : scenarios) {
    // Cold: a freshly compiled constraint each time, so the memo cannot answer.
    std::vector<double> cold;
    int64_t count = 0;
    std::optional<JsonMatcher> last;
    for (int i = 0; i < 7; ++i) {
      auto c = JsonConstraint::FromSchema(s.schema);
      if (!c.ok()) {
        std::fprintf(stderr, "%s\n", std::string(c.status().message()).c_str());
        return 1;
      }
      JsonMatcher m(*c);
      if (!m.Accept(s.prefix)) {
        std::fprintf(stderr, "prefix refused: %s\n", s.prefix);
        return 1;
      }
      const auto start = Clock::now();
      filter.Allowed(m, &allowed);
      cold.push_back(ms_since(start));
      count = std::count(allowed.begin(), allowed.end(), 1);
      last = m;
    }
    std::sort(cold.begin(), cold.end());
    constexpr int kRepeat = 20;
    const auto start = Clock::now();
    for (int i = 0; i < kRepeat; ++i) filter.Allowed(*last, &allowed);
    std::printf("%-40s allowed %7lld  cold median %6.2f max %6.2f ms  memo %6.3f ms\n", s.name,
                static_cast<long long>(count), cold[cold.size() / 2], cold.back(),
                ms_since(start) / kRepeat);
  }
  // A decode-like run: 400 calls while a 400-character string is written (maxLength 10^6).
  auto c = JsonConstraint::FromSchema(kObject);
  JsonMatcher m(*c);
  m.Accept(R"({"name": ")");
  constexpr int kCalls = 400;
  std::vector<double> ms;
  for (int i = 0; i < kCalls; ++i) {
    const auto start = Clock::now();
    filter.Allowed(m, &allowed);
    ms.push_back(ms_since(start));
    m.Accept(i % 7 == 0 ? " " : "a");
  }
  double total = 0;
  for (double x : ms) total += x;
  std::sort(ms.begin(), ms.end());
  std::printf("string of %d characters, one call per character: mean %.3f ms, max %.2f ms\n",
              kCalls, total / kCalls, ms.back());

  // Concurrent generations: G requests (each compiles its own constraint, as the plugin does)
  // write a long string in turn, one call per token each, sharing one filter. The memo budget
  // decides whether their states survive a round: 16 entries' worth (the old fixed memo) vs
  // the default budget.
  const size_t entry = filter.MemoEntryBytes(64);
  for (const size_t budget : {16 * entry, TokenFilter::kDefaultMemoBytes}) {
    for (const int generations : {8, 32, 128}) {
      TokenFilter shared(vocab, budget);
      std::vector<JsonMatcher> rows;
      for (int g = 0; g < generations; ++g) {
        rows.emplace_back(*JsonConstraint::FromSchema(kObject));
        rows.back().Accept(R"({"name": "x)");
      }
      constexpr int kRounds = 6;
      const auto start = Clock::now();
      for (int r = 0; r < kRounds; ++r) {
        for (JsonMatcher& row : rows) {
          shared.Allowed(row, &allowed);
          row.Accept("a");
        }
      }
      const TokenFilter::MemoStats st = shared.memo_stats();
      std::printf(
          "%3d generations, memo budget %6.2f MB: mean %.3f ms per call; memo %zu entries, "
          "%.2f MB, %llu hits / %llu misses\n",
          generations, static_cast<double>(budget) / (1 << 20),
          ms_since(start) / (kRounds * generations), st.entries,
          static_cast<double>(st.bytes) / (1 << 20), static_cast<unsigned long long>(st.hits),
          static_cast<unsigned long long>(st.misses));
    }
  }
  return 0;
}
