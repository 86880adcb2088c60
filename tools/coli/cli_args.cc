#include "tools/coli/cli_args.h"

#include <signal.h>

#include <cstdio>
#include <cstdlib>
#include <random>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace coli::cli {
namespace {

absl::string_view Absl(std::string_view s) { return absl::string_view(s.data(), s.size()); }

}  // namespace

void CatchUnlessIgnored(int sig, void (*handler)(int)) {
  struct sigaction old = {};
  if (::sigaction(sig, nullptr, &old) == 0 && old.sa_handler == SIG_IGN) return;
  struct sigaction sa = {};
  sa.sa_handler = handler;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = 0;
  ::sigaction(sig, &sa, nullptr);
}

int ExitLikeSignal(int rc) {
  const int sig = rc - 128;
  if (sig != SIGINT && sig != SIGTERM && sig != SIGHUP) return rc;
  std::fflush(stdout);
  std::fflush(stderr);
  ::signal(sig, SIG_DFL);
  sigset_t only;
  sigemptyset(&only);
  sigaddset(&only, sig);
  ::sigprocmask(SIG_UNBLOCK, &only, nullptr);
  ::raise(sig);
  return rc;
}

// ---- numbers --------------------------------------------------------------------------------

absl::StatusOr<std::optional<uint64_t>> ParseSeed(std::string_view what, std::string_view text) {
  if (text == "-1") return std::optional<uint64_t>();
  uint64_t v = 0;
  if (!absl::SimpleAtoi(Absl(text), &v)) {
    return absl::InvalidArgumentError(
        absl::StrCat(Absl(what), ": '", Absl(text),
                     "' is not a seed (a whole number in [0, 18446744073709551615], or -1 "
                     "for a random one)"));
  }
  return std::optional<uint64_t>(v);
}

uint64_t RandomSeed() {
  std::random_device rd;
  return (static_cast<uint64_t>(rd()) << 32) ^ rd();
}

// ---- UTF-8 ----------------------------------------------------------------------------------

std::optional<size_t> FirstInvalidUtf8(std::string_view text) {
  const auto* s = reinterpret_cast<const unsigned char*>(text.data());
  const size_t n = text.size();
  size_t i = 0;
  while (i < n) {
    const unsigned char c = s[i];
    if (c < 0x80) {
      ++i;
      continue;
    }
    size_t len = 0;
    unsigned char lo = 0x80, hi = 0xBF;  // the allowed range of the second byte
    if (c >= 0xC2 && c <= 0xDF) {
      len = 2;
    } else if (c >= 0xE0 && c <= 0xEF) {
      len = 3;
      if (c == 0xE0) lo = 0xA0;  // no overlong forms
      if (c == 0xED) hi = 0x9F;  // no surrogates
    } else if (c >= 0xF0 && c <= 0xF4) {
      len = 4;
      if (c == 0xF0) lo = 0x90;  // no overlong forms
      if (c == 0xF4) hi = 0x8F;  // nothing above U+10FFFF
    } else {
      return i;
    }
    if (i + len > n) return i;
    if (s[i + 1] < lo || s[i + 1] > hi) return i;
    for (size_t k = 2; k < len; ++k) {
      if (s[i + k] < 0x80 || s[i + k] > 0xBF) return i;
    }
    i += len;
  }
  return std::nullopt;
}

absl::Status CheckUtf8(std::string_view what, std::string_view text) {
  const std::optional<size_t> bad = FirstInvalidUtf8(text);
  if (!bad.has_value()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrFormat(
      "%s is not valid UTF-8: byte 0x%02X at offset %d (is the terminal or file in another "
      "encoding?)",
      Absl(what), static_cast<unsigned char>(text[*bad]), *bad));
}

// ---- paths ----------------------------------------------------------------------------------

std::string ExpandHome(const std::string& path) {
  if (path != "~" && !absl::StartsWith(path, "~/")) return path;
  const char* home = std::getenv("HOME");
  if (home == nullptr || *home == '\0') return path;
  return std::string(home) + path.substr(1);
}

// ---- errors ---------------------------------------------------------------------------------

std::string DescribeError(const absl::Status& status) {
  const std::string message(status.message());
  if (message.empty()) return absl::StatusCodeToString(status.code());
  if (message == "EMPTY_PROMPT") return "the prompt is empty";
  if (absl::StartsWith(message, "CONTEXT_EXCEEDED")) {
    long long tokens = -1, capacity = -1;
    if (std::sscanf(message.c_str(), "CONTEXT_EXCEEDED prompt_tokens=%lld capacity=%lld", &tokens,
                    &capacity) == 2) {
      if (tokens == capacity) {  // it fits, with no room for a reply
        return absl::StrCat("the prompt fills the whole context (", capacity,
                            " tokens), leaving no room for a reply (shorten the prompt, or raise "
                            "K3_MAXT)");
      }
      return absl::StrCat("the prompt is ", tokens, " tokens but the context holds ", capacity,
                          " (shorten the prompt, or raise K3_MAXT)");
    }
  }
  return message;
}

}  // namespace coli::cli
