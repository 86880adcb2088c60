// tools/coli/run_flags: the command line of `coli run`, parsed and checked without a host, so
// every refusal is tested in-process (tests/coli/cli_args_test.cc). run.cc does the rest.
//
//   absl::StatusOr<RunFlags> flags = ParseRunFlags(argc, argv);   // argv[0] = "run"
//   if (!flags.ok()) { "coli run: <message>" on stderr, exit 2 }
//   COLI_ASSIGN_OR_RETURN(std::string prompt, ReadPrompt(*flags));  // "-" / -f FILE read here
#ifndef COLI_TOOLS_COLI_RUN_FLAGS_H_
#define COLI_TOOLS_COLI_RUN_FLAGS_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "tools/coli/cli_args.h"
#include "tools/coli/client.h"

namespace coli::cli {

// What `coli run` and `coli chat` share; TakeCommonFlag fills it.
struct CommonFlags {
  std::string model;
  bool model_given = false;
  std::string host;
  v1::SamplingParams sampling;
  bool seed_given = false;  // false: no --seed, or --seed -1 (the caller draws one)
};

struct RunFlags : CommonFlags {
  bool help = false;  // --help / -h: print the usage on stdout, exit 0
  // The prompt: `text` as given, or read from `prompt_file` ("-" = stdin) by ReadPrompt.
  std::string prompt;
  std::string prompt_file;
  bool have_prompt = false;
  std::vector<int32_t> ids;  // --ids (non-empty when given)
  bool print_ids = false;
  bool chat = false;
  std::string system;
  // --no-think: false; unset, the environment's request defaults (K3_THINK) or the family's.
  std::optional<bool> think;
  int32_t ngen = 64;  // max tokens for the host; 0 = until the context is full (--ngen -1)
  std::string json_schema_path;
  bool json_object = false;
};

// Parses argv (argv[0] is the command name) and $COLI_TEMP. INVALID_ARGUMENT with
// a message naming the flag and the value for anything wrong or contradictory.
absl::StatusOr<RunFlags> ParseRunFlags(int argc, char** argv);

// The prompt text: `prompt` itself, or all of `prompt_file` ("-": stdin). Refuses an empty
// prompt and one that is not UTF-8 (INVALID_ARGUMENT naming where it came from); NOT_FOUND /
// FAILED_PRECONDITION naming a file that cannot be read. Not called for --ids.
absl::StatusOr<std::string> ReadPrompt(const RunFlags& flags);

// The usage text (`coli run --help`).
std::string RunUsage();

// The flags `coli run` and `coli chat` share, taken when args is at one of them:
//   --model DIR / --host ADDR (refused empty), --temperature / --temp T in [0, 100],
//   --top-p P in [0, 1], --top-k K (-1 or 0 = off), --seed / -s S (-1 = random),
//   and client::IsSamplingKnobFlag's penalties, --min-p and --logit-bias.
// True when it took the flag; INVALID_ARGUMENT naming the flag and the value.
absl::StatusOr<bool> TakeCommonFlag(ArgReader& args, CommonFlags* flags);

// With a private host (host empty): CheckModelDir on the folder the model comes from, named as
// the user gave it ("--model", "COLI_MODEL" or "the embedded tiny model"). A remote host
// resolves the folder on its own machine: OK.
absl::Status CheckLocalModelDir(const CommonFlags& flags, const std::string& model_dir);

}  // namespace coli::cli

#endif  // COLI_TOOLS_COLI_RUN_FLAGS_H_
