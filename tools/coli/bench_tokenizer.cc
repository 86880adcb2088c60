// `coli bench tokenizer --tokenizer DIR [--corpus FILE] [--min-seconds S] [--json]`
//
// Encode throughput (MB/s of UTF-8 input, special tokens off, one thread) on a corpus, the
// time for the pathological inputs of issue 4 (1 MB of one repeated character, 1 MB of one
// long word), decode throughput, and the machine's memory read rate as the ceiling.
// tests/node/tiktoken/bench.js runs this next to npm tiktoken on the same corpus and prints
// the ratio. Without --corpus a built-in mixed-language corpus (about 1 MB) is used.
#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "common/tokenizer/tokenizer.h"
#include "tools/coli/cli_args.h"
#include "tools/coli/command.h"

namespace coli::cli {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

std::string BuiltInCorpus() {
  static const char* kParagraphs[] = {
      "The quick brown fox jumps over the lazy dog. It's a sentence that uses every letter; "
      "we'll use it again, and again, until the corpus is large enough to time.\n",
      "int main(int argc, char** argv) {\n  for (int i = 0; i < argc; ++i) {\n    "
      "std::printf(\"%s\\n\", argv[i]);\n  }\n  return 0;\n}\n",
      "机器学习是人工智能的一个分支，它使计算机能够从数据中学习。2024年，大模型取得了重要进展。\n",
      "東京は日本の首都です。カタカナとひらがなと漢字が混ざっています。\n",
      "안녕하세요, 이것은 한국어 문장입니다. Korean text with Latin words.\n",
      "{\"model\": \"kimi-k3\", \"messages\": [{\"role\": \"user\", \"content\": \"Hello!\"}], "
      "\"temperature\": 0.7}\n",
      "Привет, мир! Это тест. Ελληνικά κείμενα. مرحبا بالعالم. नमस्ते दुनिया.\n",
      "   indented line with trailing spaces   \r\n\tTabbed\tvalues\t123456789\n",
      "https://example.com/api/v1/users?id=42&name=test#section 😀👍🏽👨‍👩‍👧\n",
  };
  std::string corpus;
  size_t i = 0;
  while (corpus.size() < (1u << 20)) {
    corpus += kParagraphs[i % (sizeof(kParagraphs) / sizeof(kParagraphs[0]))];
    corpus += std::to_string(i * 7919) + " ";
    ++i;
  }
  return corpus;
}

// Runs fn repeatedly for at least min_seconds (and at least 3 times); returns the best time.
template <typename Fn>
double BestTime(double min_seconds, Fn fn) {
  double best = 1e300;
  auto start = Clock::now();
  int runs = 0;
  while (runs < 3 || Seconds(start, Clock::now()) < min_seconds) {
    auto t0 = Clock::now();
    fn();
    best = std::min(best, Seconds(t0, Clock::now()));
    ++runs;
  }
  return best;
}

// Memory read rate (GB/s) over a buffer larger than the caches, one thread, like the encoder.
double MemoryReadGBs() {
  std::vector<uint64_t> buffer((256u << 20) / sizeof(uint64_t), 1);
  volatile uint64_t sink = 0;
  double t = BestTime(0.3, [&] {
    uint64_t sum = 0;
    for (uint64_t v : buffer) sum += v;
    sink = sink + sum;
  });
  return buffer.size() * sizeof(uint64_t) / t / 1e9;
}

int RunTokenizerBench(int argc, char** argv) {
  std::string dir, corpus_path;
  bool json = false;
  double min_seconds = 1.0;
  constexpr const char* kUsage =
      "usage: coli bench tokenizer --tokenizer DIR [--corpus FILE] [--min-seconds S] [--json]\n";
  auto usage_error = [&](const std::string& why) {
    std::fprintf(stderr, "coli bench tokenizer: %s\n%s", why.c_str(), kUsage);
    return 2;
  };
  if (WantsHelp(argc, argv)) {
    std::printf("%s", kUsage);
    return 0;
  }
  cli::ArgReader args(argc, argv);
  while (args.Next()) {
    absl::Status bad;
    if (args.Is("--json")) {
      bad = args.NoValue();
      json = true;
    } else if (args.Is("--tokenizer") || args.Is("--corpus")) {
      const bool is_dir = args.Is("--tokenizer");
      absl::StatusOr<std::string> v = args.Value();
      if (!v.ok()) return usage_error(std::string(v.status().message()));
      (is_dir ? dir : corpus_path) = *v;
    } else if (args.Is("--min-seconds")) {
      // std::stod threw on "abc" and "1e999" (an abort).
      absl::StatusOr<double> v = args.Real(0, 3600);
      if (!v.ok()) return usage_error(std::string(v.status().message()));
      min_seconds = *v;
    } else {
      return usage_error("unknown argument '" + args.arg() + "'");
    }
    if (!bad.ok()) return usage_error(std::string(bad.message()));
  }
  if (dir.empty()) {
    std::fprintf(stderr, "coli bench tokenizer: --tokenizer DIR is required (e.g. a model "
                         "directory, or build/fixtures/tiktoken/kimi made by the node test)\n");
    return 2;
  }
  auto t0 = Clock::now();
  auto loaded = tok::Tokenizer::LoadDir(dir);
  if (!loaded.ok()) {
    std::fprintf(stderr, "coli bench tokenizer: %s\n", loaded.status().ToString().c_str());
    return 1;
  }
  double load_s = Seconds(t0, Clock::now());
  const tok::Tokenizer& tokenizer = **loaded;

  std::string corpus;
  if (corpus_path.empty()) {
    corpus = BuiltInCorpus();
  } else {
    std::ifstream in(corpus_path, std::ios::binary);
    if (!in) {
      std::fprintf(stderr, "coli bench tokenizer: cannot open corpus '%s'\n", corpus_path.c_str());
      return 1;
    }
    std::ostringstream s;
    s << in.rdbuf();
    corpus = s.str();
  }

  std::vector<int32_t> ids;
  double encode_s = BestTime(min_seconds, [&] { ids = tokenizer.Encode(corpus, false); });
  std::string decoded;
  double decode_s = BestTime(min_seconds / 4, [&] { decoded = *tokenizer.Decode(ids); });
  const double mb = corpus.size() / 1e6;

  // Issue 4's pathological inputs: one repeated character, one long word (1 MiB each).
  std::string repeated(1u << 20, 'a');
  std::string word;
  while (word.size() < (1u << 20)) word += "supercalifragilisticexpialidocious";
  word.resize(1u << 20);
  double repeated_s = BestTime(0, [&] { tokenizer.Encode(repeated, false); });
  double word_s = BestTime(0, [&] { tokenizer.Encode(word, false); });
  double mem_gbs = MemoryReadGBs();
  double encode_mbs = mb / encode_s;

  if (json) {
    std::printf(
        "{\"area\": \"tokenizer\", \"tokenizer\": \"%s\", \"family\": \"%s\", "
        "\"corpus_bytes\": %zu, \"tokens\": %zu, \"load_s\": %.4f, \"encode_s\": %.6f, "
        "\"encode_mb_per_s\": %.3f, \"decode_mb_per_s\": %.3f, \"repeated_char_1mib_s\": %.4f, "
        "\"long_word_1mib_s\": %.4f, \"memory_read_gb_per_s\": %.3f, "
        "\"encode_vs_memory_read\": %.6f, \"roundtrip_ok\": %s}\n",
        dir.c_str(), std::string(tok::PatternFamilyName(tokenizer.family())).c_str(),
        corpus.size(), ids.size(), load_s, encode_s, encode_mbs, mb / decode_s, repeated_s,
        word_s, mem_gbs, encode_mbs / (mem_gbs * 1e3), decoded == corpus ? "true" : "false");
  } else {
    std::printf("tokenizer %s (%s), loaded in %.3f s\n", dir.c_str(),
                std::string(tok::PatternFamilyName(tokenizer.family())).c_str(), load_s);
    std::printf("corpus: %zu bytes -> %zu tokens (%.2f bytes/token)\n", corpus.size(), ids.size(),
                corpus.size() / static_cast<double>(ids.size() ? ids.size() : 1));
    std::printf("encode: %.2f MB/s  decode: %.2f MB/s  (memory read %.2f GB/s: encode is %.4f%%)\n",
                encode_mbs, mb / decode_s, mem_gbs, 100 * encode_mbs / (mem_gbs * 1e3));
    std::printf("1 MiB of 'a': %.3f s   1 MiB long word: %.3f s\n", repeated_s, word_s);
    std::printf("round trip: %s\n", decoded == corpus ? "ok" : "MISMATCH");
  }
  return decoded == corpus ? 0 : 1;
}

}  // namespace

COLI_REGISTER_BENCH(tokenizer, "tokenizer", "encode/decode MB/s, pathological inputs",
                    RunTokenizerBench);

}  // namespace coli::cli
