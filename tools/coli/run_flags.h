// tools/coli/run_flags: the command line of `coli run`, parsed and checked without a host, so
// every refusal is tested in-process (tests/coli/cli_args_test.cc). run.cc does the rest.
//
//   absl::StatusOr<RunFlags> flags = ParseRunFlags(argc, argv);   // argv[0] = "run"
//   if (!flags.ok()) { "coli run: <message>" on stderr, exit 2 }
//   COLI_ASSIGN_OR_RETURN(std::string prompt, ReadPrompt(*flags));  // "-" / -f FILE read here
#ifndef COLI_TOOLS_COLI_RUN_FLAGS_H_
#define COLI_TOOLS_COLI_RUN_FLAGS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "tools/coli/client.h"

namespace coli::cli {

struct RunFlags {
  bool help = false;  // --help / -h: print the usage on stdout, exit 0
  std::string model;  // --model DIR ("" = not given)
  bool model_given = false;
  std::string host;   // --host ADDR
  // The prompt: `text` as given, or read from `prompt_file` ("-" = stdin) by ReadPrompt.
  std::string prompt;
  std::string prompt_file;
  bool have_prompt = false;
  std::vector<int32_t> ids;  // --ids (non-empty when given)
  bool print_ids = false;
  bool chat = false;
  std::string system;
  bool think = true;
  int32_t ngen = 64;  // max tokens for the host; 0 = until the context is full (--ngen -1)
  v1::SamplingParams sampling;
  // False: no --seed, or --seed -1; run.cc then draws a random seed for a sampled run.
  bool seed_given = false;
  std::string json_schema_path;
  bool json_object = false;
};

// Parses argv (argv[0] is the command name) and $COLI_TEMP / $K3_THINK. INVALID_ARGUMENT with
// a message naming the flag and the value for anything wrong or contradictory.
absl::StatusOr<RunFlags> ParseRunFlags(int argc, char** argv);

// The prompt text: `prompt` itself, or all of `prompt_file` ("-": stdin). Refuses an empty
// prompt and one that is not UTF-8 (INVALID_ARGUMENT naming where it came from); NOT_FOUND /
// FAILED_PRECONDITION naming a file that cannot be read. Not called for --ids.
absl::StatusOr<std::string> ReadPrompt(const RunFlags& flags);

// The usage text (`coli run --help`).
std::string RunUsage();

}  // namespace coli::cli

#endif  // COLI_TOOLS_COLI_RUN_FLAGS_H_
