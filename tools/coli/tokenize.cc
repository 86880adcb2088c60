// `coli tokenize --tokenizer DIR [--allow-special] [--decode] [--jsonl]`
//
//   echo -n 'Hello <|open|>' | coli tokenize --tokenizer /models/Kimi-K3   # <|open|> as text
//   echo -n '<|open|>' | coli tokenize --tokenizer /models/Kimi-K3 --allow-special  # [163587]
//   echo '[163587]' | coli tokenize --tokenizer /models/Kimi-K3 --decode            # <|open|>
//
// Encode mode reads all of stdin as bytes (invalid UTF-8 is replaced as the tokenizer
// documents) and prints one JSON array of ids. --decode reads one JSON array of ids and
// writes the raw bytes. --jsonl encodes many texts in one process: every stdin line is a
// JSON string, every output line the JSON array of its ids (for scripts and tests).
#include <cstdio>
#include <cstring>
#include <iostream>
#include <iterator>
#include <string>
#include <vector>

#include "common/tokenizer/tokenizer.h"
#include "nlohmann/json.hpp"
#include "tools/coli/command.h"

namespace coli::cli {
namespace {

void PrintTokenizeUsage() {
  std::fprintf(stderr,
               "usage: coli tokenize --tokenizer DIR [--allow-special] [--decode] [--jsonl]\n"
               "  stdin UTF-8 text -> JSON array of token ids on stdout\n"
               "  --allow-special  recognise special tokens (<|open|>, [BOS], ...) in the text\n"
               "  --decode         stdin JSON array of ids -> raw bytes on stdout\n"
               "  --jsonl          each stdin line is a JSON string; one JSON array per line\n"
               "  --no-slicing     no vendor long-input slicing (pure tiktoken behaviour)\n");
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
  bool allow_special = false, decode = false, jsonl = false, no_slicing = false;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--tokenizer" && i + 1 < argc) {
      dir = argv[++i];
    } else if (arg.rfind("--tokenizer=", 0) == 0) {
      dir = arg.substr(12);
    } else if (arg == "--allow-special") {
      allow_special = true;
    } else if (arg == "--decode") {
      decode = true;
    } else if (arg == "--jsonl") {
      jsonl = true;
    } else if (arg == "--no-slicing") {
      no_slicing = true;
    } else if (arg == "-h" || arg == "--help") {
      PrintTokenizeUsage();
      return 0;
    } else {
      std::fprintf(stderr, "coli tokenize: unknown argument '%s'\n", arg.c_str());
      PrintTokenizeUsage();
      return 2;
    }
  }
  if (dir.empty()) {
    std::fprintf(stderr, "coli tokenize: --tokenizer DIR is required\n");
    PrintTokenizeUsage();
    return 2;
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
    return std::fflush(stdout) == 0 ? 0 : 1;
  }

  std::string input((std::istreambuf_iterator<char>(std::cin)), std::istreambuf_iterator<char>());
  if (!decode) {
    std::string out = IdsToJson(tokenizer.Encode(input, allow_special));
    std::fprintf(stdout, "%s\n", out.c_str());
    return std::fflush(stdout) == 0 ? 0 : 1;
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
    if (!v.is_number_integer() || v.get<int64_t>() < INT32_MIN || v.get<int64_t>() > INT32_MAX) {
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
  return std::fflush(stdout) == 0 ? 0 : 1;
}

}  // namespace

COLI_REGISTER_COMMAND(tokenize, "tokenize",
                      "text -> token ids (JSON); --decode ids -> text: --tokenizer DIR",
                      RunTokenize);

}  // namespace coli::cli
