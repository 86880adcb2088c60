// tools/coli/cli_args: what the `coli` subcommands share at their command line — one argv walker
// taking both `--flag VALUE` and `--flag=VALUE`, number parsing with ranges, the UTF-8 check of a
// prompt, the model-folder check and the text of a host error a person reads. No terminal, no
// network: unit-tested in tests/coli/cli_args_test.cc.
//
//   ArgReader args("coli run", argc, argv);
//   while (args.Next()) {
//     if (args.Is("--ngen")) {
//       COLI_ASSIGN_OR_RETURN(int64_t n, args.Int(-1, kMaxInt));   // "--ngen: '1e9' is not ..."
//     } else if (args.Is("--print-ids")) {
//       COLI_RETURN_IF_ERROR(args.NoValue());                      // "--print-ids=1": refused
//     } else if (args.IsFlag()) {
//       return args.Unknown();                                     // "unknown flag '--nope'"
//     } else {
//       positional.push_back(args.arg());
//     }
//   }
//
// Every error is INVALID_ARGUMENT whose message names the flag and the value as given.
#ifndef COLI_TOOLS_COLI_CLI_ARGS_H_
#define COLI_TOOLS_COLI_CLI_ARGS_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace coli::cli {

class ArgReader {
 public:
  // argv[0] is the command's own name (as the registry passes it); walking starts at argv[1].
  ArgReader(int argc, char** argv) : argc_(argc), argv_(argv) {}

  // Moves to the next argument; false after the last. `--flag=value` is split here: arg() is
  // "--flag" and the value is kept for Value(). After a bare `--`, every argument is
  // positional (IsFlag() false).
  bool Next();
  const std::string& arg() const { return arg_; }
  bool Is(std::string_view flag) const { return arg_ == flag && !positional_; }
  // A flag-shaped argument: "-x" or "--xy" (not "-" alone, which names stdin, nor a negative
  // number, nor anything after `--`).
  bool IsFlag() const;

  // The current flag's value: the text after '=', else the next argument. A next argument
  // that is itself a `--flag` is refused (the value was most likely forgotten); `--flag=--x`
  // passes such a value on purpose.
  absl::StatusOr<std::string> Value();
  // A whole decimal number in [lo, hi] ("1e9", "3.5", "12abc" and out-of-range values refused).
  absl::StatusOr<int64_t> Int(int64_t lo, int64_t hi);
  // A finite real number in [lo, hi] (nan and inf refused).
  absl::StatusOr<double> Real(double lo, double hi);
  // For a switch that takes no value: refuses `--switch=value`.
  absl::Status NoValue() const;
  // "unknown flag '--nope'".
  absl::Status Unknown() const;

 private:
  int argc_;
  char** argv_;
  int i_ = 0;
  std::string arg_;
  std::optional<std::string> inline_value_;
  bool after_dashes_ = false;
  bool positional_ = false;
};

// Installs `handler` for `sig` (no SA_RESTART: a blocked read returns EINTR) unless the signal
// is ignored on entry: `nohup coli run …` (SIGHUP) and a background job of a script (SIGINT)
// keep ignoring it.
void CatchUnlessIgnored(int sig, void (*handler)(int));

// Whether the arguments ask for help: "--help" or "-h" anywhere before a bare "--". For
// commands whose own parsers predate ArgReader (the bench areas): help on stdout, exit 0.
bool WantsHelp(int argc, char** argv);

// Number parsing with the messages ArgReader uses; `what` names the thing ("--ngen",
// "K3_MAXT").
absl::StatusOr<int64_t> ParseWholeNumber(std::string_view what, std::string_view text, int64_t lo,
                                         int64_t hi);
absl::StatusOr<double> ParseRealNumber(std::string_view what, std::string_view text, double lo,
                                       double hi);
// A sampling seed: a whole number in [0, 2^64), or -1 = a random one (llama.cpp's convention).
// nullopt for -1.
absl::StatusOr<std::optional<uint64_t>> ParseSeed(std::string_view what, std::string_view text);
// A fresh random seed (std::random_device).
uint64_t RandomSeed();

// The byte offset of the first byte that is not part of well-formed UTF-8 (RFC 3629: no
// overlong forms, no surrogates, nothing above U+10FFFF), or nullopt when all of it is.
std::optional<size_t> FirstInvalidUtf8(std::string_view text);
// INVALID_ARGUMENT "<what> is not valid UTF-8: byte 0xFF at offset 4 (...)", or OK.
absl::Status CheckUtf8(std::string_view what, std::string_view text);

// A local model (or tokenizer) folder named by `flag`: INVALID_ARGUMENT for an empty name,
// NOT_FOUND when nothing is there, FAILED_PRECONDITION for a file or an unreadable folder —
// each message naming the flag and the path.
absl::Status CheckModelDir(std::string_view flag, const std::string& path);

// "~" and "~/x" with $HOME; anything else unchanged.
std::string ExpandHome(const std::string& path);

// The text of a host error for a person: the message without the status code's name, host
// tokens spelled out ("CONTEXT_EXCEEDED prompt_tokens=402 capacity=64" -> "the prompt is 402
// tokens but the context holds 64 ..."), and the code's name when there is no message.
std::string DescribeError(const absl::Status& status);

}  // namespace coli::cli

#endif  // COLI_TOOLS_COLI_CLI_ARGS_H_
