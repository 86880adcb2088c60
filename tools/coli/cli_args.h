// tools/coli/cli_args: what the `coli` subcommands share at their command line — the argv
// walker taking both `--flag VALUE` and `--flag=VALUE` and number parsing with ranges (from
// common/flags/flags.h, which has the example), seeds, the UTF-8 check of a prompt, signals,
// and the text of a host error a person reads. No terminal, no network: unit-tested in
// tests/coli/cli_args_test.cc.
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
#include "common/flags/flags.h"

namespace coli::cli {

// The argv walker and the number / folder checks live in common/flags (coli-host uses them too,
// without this library's gRPC client); the `coli` subcommands name them from here.
using flags::ArgReader;
using flags::CheckGrpcAddress;
using flags::CheckModelDir;
using flags::ParseRealNumber;
using flags::ParseWholeNumber;
using flags::WantsHelp;

// Installs `handler` for `sig` (no SA_RESTART: a blocked read returns EINTR) unless the signal
// is ignored on entry: `nohup coli run …` (SIGHUP) and a background job of a script (SIGINT)
// keep ignoring it.
void CatchUnlessIgnored(int sig, void (*handler)(int));

// A command that caught SIGINT / SIGTERM / SIGHUP cleaned up and returned 128 + the signal: the
// process then dies of that signal (default action, re-raised) instead of exiting with the
// number, so a calling shell sees a child killed by Ctrl-C and stops its loop or script too
// (bash's wait-and-cooperative-exit; `$?` is 128 + the signal either way). Any other code is
// returned as it is (also when the signal cannot end the process).
int ExitLikeSignal(int rc);

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

// "~" and "~/x" with $HOME; anything else unchanged.
std::string ExpandHome(const std::string& path);

// The text of a host error for a person: the message without the status code's name, host
// tokens spelled out ("CONTEXT_EXCEEDED prompt_tokens=402 capacity=64" -> "the prompt is 402
// tokens but the context holds 64 ..."), and the code's name when there is no message.
std::string DescribeError(const absl::Status& status);

}  // namespace coli::cli

#endif  // COLI_TOOLS_COLI_CLI_ARGS_H_
