// common/flags: one argv walker taking both `--flag VALUE` and `--flag=VALUE`, number parsing
// with ranges, and the check of a model folder named on a command line. No terminal, no network,
// no gRPC: coli-host (host/main.cc) and the `coli` subcommands (tools/coli/cli_args.h) share it.
//
//   coli::flags::ArgReader args(argc, argv);
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
#ifndef COLI_COMMON_FLAGS_FLAGS_H_
#define COLI_COMMON_FLAGS_FLAGS_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace coli::flags {

class ArgReader {
 public:
  // argv[0] is the command's own name; walking starts at argv[1]. argv must outlive the reader.
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
  // Value(), refused when empty ("--host is empty: give ADDR"): for flags where "" can only be
  // an unset shell variable. `what` names the expected thing in the message.
  absl::StatusOr<std::string> NonEmptyValue(std::string_view what);
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

// Whether the arguments ask for help: "--help" or "-h" anywhere before a bare "--". For
// parsers that predate ArgReader: help on stdout, exit 0.
bool WantsHelp(int argc, char** argv);

// Number parsing with the messages ArgReader uses; `what` names the thing ("--ngen",
// "K3_MAXT").
absl::StatusOr<int64_t> ParseWholeNumber(std::string_view what, std::string_view text, int64_t lo,
                                         int64_t hi);
absl::StatusOr<double> ParseRealNumber(std::string_view what, std::string_view text, double lo,
                                       double hi);

// A local model (or tokenizer) folder named by `flag`: INVALID_ARGUMENT for an empty name,
// NOT_FOUND when nothing is there, FAILED_PRECONDITION for a file or an unreadable folder —
// each message naming the flag and the path.
absl::Status CheckModelDir(std::string_view flag, const std::string& path);

// A gRPC address named by `flag`: "unix:PATH" / "unix-abstract:NAME" with something after the
// colon, or HOST:PORT (also "ipv4:…", "dns:///…") whose PORT is a whole number in [1, 65535],
// or [0, 65535] when `listening` (0 = any free port). gRPC itself would take 127.0.0.1:99999 as
// port 34463. INVALID_ARGUMENT naming the flag and the address.
absl::Status CheckGrpcAddress(std::string_view flag, const std::string& address, bool listening);

}  // namespace coli::flags

#endif  // COLI_COMMON_FLAGS_FLAGS_H_
