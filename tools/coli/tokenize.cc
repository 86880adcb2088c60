// `coli tokenize --tokenizer DIR [--allow-special] [--decode] [--jsonl]`
//
//   echo -n 'Hello <|open|>' | coli tokenize --tokenizer /models/Kimi-K3   # <|open|> as text
//   echo -n '<|open|>' | coli tokenize --tokenizer /models/Kimi-K3 --allow-special  # [163587]
//   echo '[163587]' | coli tokenize --tokenizer /models/Kimi-K3 --decode            # <|open|>
//
// Encode mode reads all of stdin and prints one JSON array of ids; stdin that is not UTF-8 is
// tokenized with U+FFFD for each bad sequence (as a text decoder reads it) and a warning naming
// the first bad byte (ids of text the user never wrote are never printed silently). --decode reads one JSON array of ids and
// writes the raw bytes. --jsonl encodes many texts in one process: every stdin line is a
// JSON string, every output line the JSON array of its ids (for scripts and tests).
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <iterator>
#include <string>
#include <vector>

#include "common/tokenizer/tokenizer.h"
#include "nlohmann/json.hpp"
#include "tools/coli/cli_args.h"
#include "tools/coli/command.h"

namespace coli::cli {
namespace {

constexpr const char* kUsage =
    "usage: coli tokenize --tokenizer DIR [--allow-special] [--decode] [--jsonl]\n"
    "  stdin UTF-8 text -> JSON array of token ids on stdout\n"
    "  --tokenizer DIR  the folder with tiktoken.model or tokenizer.json (--model DIR is the\n"
    "                   same; default $COLI_MODEL)\n"
    "  --allow-special  recognise special tokens (<|open|>, [BOS], ...) in the text\n"
    "  --decode         stdin JSON array of ids -> raw bytes on stdout\n"
    "  --jsonl          each stdin line is a JSON string; one JSON array per line\n"
    "  --no-slicing     no vendor long-input slicing (pure tiktoken behaviour)\n";

int UsageError(const std::string& why) {
  std::fprintf(stderr, "coli tokenize: %s\n(coli tokenize --help lists the flags)\n", why.c_str());
  return 2;
}

// 0 when stdout took everything; else 1 after saying why on stderr (a closed pipe, a full disk).
int FlushStdout() {
  if (std::fflush(stdout) == 0 && !std::ferror(stdout)) return 0;
  std::fprintf(stderr, "coli tokenize: cannot write to stdout: %s\n", std::strerror(errno));
  return 1;
}

std::string IdsToJson(const std::vector<int32_t>& ids) {
  std::string out = "[";
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i) out += ", ";
    out += std::to_string(ids[i]);
  }
  out += "]";
  return out;
}

int RunTokenize(int argc, char** argv) {
  std::string dir;
  bool dir_given = false;
  bool allow_special = false, decode = false, jsonl = false, no_slicing = false;
  ArgReader args(argc, argv);
  while (args.Next()) {
    absl::Status bad;
    if (args.Is("--tokenizer") || args.Is("--model")) {
      absl::StatusOr<std::string> v = args.Value();
      if (!v.ok()) return UsageError(std::string(v.status().message()));
      dir = *v;
      dir_given = true;
    } else if (args.Is("--allow-special")) {
      bad = args.NoValue();
      allow_special = true;
    } else if (args.Is("--decode")) {
      bad = args.NoValue();
      decode = true;
    } else if (args.Is("--jsonl")) {
      bad = args.NoValue();
      jsonl = true;
    } else if (args.Is("--no-slicing")) {
      bad = args.NoValue();
      no_slicing = true;
    } else if (args.Is("-h") || args.Is("--help")) {
      std::printf("%s", kUsage);
      return 0;
    } else if (args.IsFlag()) {
      return UsageError(std::string(args.Unknown().message()));
    } else {
      return UsageError("unexpected argument '" + args.arg() + "' (the text comes on stdin)");
    }
    if (!bad.ok()) return UsageError(std::string(bad.message()));
  }
  if (!dir_given) {
    if (const char* m = std::getenv("COLI_MODEL"); m != nullptr && *m != '\0') dir = m;
  }
  if (dir.empty() && !dir_given) {
    return UsageError("--tokenizer DIR is required (or COLI_MODEL)");
  }
  if (absl::Status bad = CheckModelDir(dir_given ? "--tokenizer" : "COLI_MODEL", dir); !bad.ok()) {
    return UsageError(std::string(bad.message()));
  }
  if (decode && jsonl) {
    std::fprintf(stderr, "coli tokenize: --decode and --jsonl cannot be combined\n");
    return 2;
  }
  auto loaded = tok::Tokenizer::LoadDir(dir);
  if (!loaded.ok()) {
    std::fprintf(stderr, "coli tokenize: %s\n", loaded.status().ToString().c_str());
    return 1;
  }
  tok::Tokenizer& tokenizer = **loaded;
  if (no_slicing) tokenizer.set_vendor_slicing(false);

  if (jsonl) {
    std::string line;
    size_t line_no = 0;
    while (std::getline(std::cin, line)) {
      ++line_no;
      nlohmann::json text;
      try {
        text = nlohmann::json::parse(line);
      } catch (const nlohmann::json::exception& e) {
        std::fprintf(stderr, "coli tokenize: stdin line %zu: invalid JSON: %s\n", line_no,
                     e.what());
        return 1;
      }
      if (!text.is_string()) {
        std::fprintf(stderr, "coli tokenize: stdin line %zu: expected a JSON string\n", line_no);
        return 1;
      }
      std::string out = IdsToJson(tokenizer.Encode(text.get<std::string>(), allow_special));
      std::fprintf(stdout, "%s\n", out.c_str());
    }
    return FlushStdout();
  }

  std::string input((std::istreambuf_iterator<char>(std::cin)), std::istreambuf_iterator<char>());
  if (!decode) {
    // Tokenized as the text decoders read it (U+FFFD for each bad sequence, as tiktoken after
    // bytes.decode(errors="replace") and the WHATWG decoder: tests/node/tiktoken), but said.
    if (absl::Status bad = CheckUtf8("stdin", input); !bad.ok()) {
      std::fprintf(stderr, "coli tokenize: warning: %s; each bad sequence is tokenized as U+FFFD\n",
                   std::string(bad.message()).c_str());
    }
    std::string out = IdsToJson(tokenizer.Encode(input, allow_special));
    std::fprintf(stdout, "%s\n", out.c_str());
    return FlushStdout();
  }

  nlohmann::json parsed;
  try {
    parsed = nlohmann::json::parse(input);
  } catch (const nlohmann::json::exception& e) {
    std::fprintf(stderr, "coli tokenize --decode: stdin is not valid JSON: %s\n", e.what());
    return 1;
  }
  if (!parsed.is_array()) {
    std::fprintf(stderr, "coli tokenize --decode: expected a JSON array of token ids\n");
    return 1;
  }
  std::vector<int32_t> ids;
  for (size_t i = 0; i < parsed.size(); ++i) {
    const nlohmann::json& v = parsed[i];
    // An unsigned value above INT64_MAX read as int64_t wraps (18446744073709551615 was "-1").
    const bool fits = v.is_number_unsigned() ? v.get<uint64_t>() <= INT32_MAX
                      : v.is_number_integer()
                          ? v.get<int64_t>() >= INT32_MIN && v.get<int64_t>() <= INT32_MAX
                          : false;
    if (!fits) {
      std::fprintf(stderr, "coli tokenize --decode: element %zu (%s) is not a token id\n", i,
                   v.dump().c_str());
      return 1;
    }
    ids.push_back(static_cast<int32_t>(v.get<int64_t>()));
  }
  auto bytes = tokenizer.Decode(ids);
  if (!bytes.ok()) {
    std::fprintf(stderr, "coli tokenize --decode: %s\n", bytes.status().ToString().c_str());
    return 1;
  }
  std::fwrite(bytes->data(), 1, bytes->size(), stdout);
  return FlushStdout();
}

}  // namespace

COLI_REGISTER_COMMAND(tokenize, "tokenize",
                      "text -> token ids (JSON); --decode ids -> text: --tokenizer DIR",
                      RunTokenize);

}  // namespace coli::cli
