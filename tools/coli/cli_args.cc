#include "tools/coli/cli_args.h"

#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/match.h"

namespace coli::cli {
namespace {

absl::string_view Absl(std::string_view s) { return absl::string_view(s.data(), s.size()); }

// A number in the usual spellings of a real (so "1e9" is called "not a whole number" rather
// than "not a number").
bool LooksReal(std::string_view text) {
  double ignored = 0;
  return absl::SimpleAtod(Absl(text), &ignored);
}

bool AllDigits(std::string_view text) {
  if (!text.empty() && (text[0] == '-' || text[0] == '+')) text.remove_prefix(1);
  if (text.empty()) return false;
  for (char c : text) {
    if (c < '0' || c > '9') return false;
  }
  return true;
}

}  // namespace

// ---- ArgReader ------------------------------------------------------------------------------

bool ArgReader::Next() {
  inline_value_.reset();
  if (++i_ >= argc_) return false;
  arg_ = argv_[i_];
  positional_ = after_dashes_;
  if (!after_dashes_ && arg_ == "--") {
    after_dashes_ = true;
    return Next();
  }
  if (!positional_ && absl::StartsWith(arg_, "--")) {
    if (const size_t eq = arg_.find('='); eq != std::string::npos) {
      inline_value_ = arg_.substr(eq + 1);
      arg_.resize(eq);
    }
  }
  return true;
}

bool ArgReader::IsFlag() const {
  if (positional_ || arg_.size() < 2 || arg_[0] != '-') return false;
  // "-5" and "-0.5" are numbers (a prompt may be one), not flags.
  return !LooksReal(arg_);
}

absl::StatusOr<std::string> ArgReader::Value() {
  if (inline_value_.has_value()) {
    std::string v = *std::move(inline_value_);
    inline_value_.reset();
    return v;
  }
  if (i_ + 1 >= argc_) return absl::InvalidArgumentError(absl::StrCat(arg_, " needs a value"));
  const std::string next = argv_[i_ + 1];
  if (absl::StartsWith(next, "--") && next.size() > 2) {
    return absl::InvalidArgumentError(absl::StrCat(arg_, " needs a value, got the flag '", next,
                                                   "' (write ", arg_, "=", next,
                                                   " if that is the value)"));
  }
  ++i_;
  return next;
}

absl::StatusOr<int64_t> ArgReader::Int(int64_t lo, int64_t hi) {
  const std::string flag = arg_;
  absl::StatusOr<std::string> v = Value();
  if (!v.ok()) return v.status();
  return ParseWholeNumber(flag, *v, lo, hi);
}

absl::StatusOr<double> ArgReader::Real(double lo, double hi) {
  const std::string flag = arg_;
  absl::StatusOr<std::string> v = Value();
  if (!v.ok()) return v.status();
  return ParseRealNumber(flag, *v, lo, hi);
}

absl::Status ArgReader::NoValue() const {
  if (!inline_value_.has_value()) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(arg_, " takes no value (got '", arg_, "=", *inline_value_, "')"));
}

absl::Status ArgReader::Unknown() const {
  return absl::InvalidArgumentError(absl::StrCat("unknown flag '", arg_, "'"));
}

void CatchUnlessIgnored(int sig, void (*handler)(int)) {
  struct sigaction old = {};
  if (::sigaction(sig, nullptr, &old) == 0 && old.sa_handler == SIG_IGN) return;
  struct sigaction sa = {};
  sa.sa_handler = handler;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = 0;
  ::sigaction(sig, &sa, nullptr);
}

bool WantsHelp(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const std::string_view a = argv[i];
    if (a == "--") return false;
    if (a == "--help" || a == "-h") return true;
  }
  return false;
}

// ---- numbers --------------------------------------------------------------------------------

absl::StatusOr<int64_t> ParseWholeNumber(std::string_view what, std::string_view text, int64_t lo,
                                         int64_t hi) {
  int64_t v = 0;
  if (!absl::SimpleAtoi(Absl(text), &v)) {
    if (AllDigits(text)) {  // only digits, so too many of them
      return absl::InvalidArgumentError(
          absl::StrCat(Absl(what), ": '", Absl(text), "' is outside [", lo, ", ", hi, "]"));
    }
    return absl::InvalidArgumentError(absl::StrCat(Absl(what), ": '", Absl(text), "' is not ", LooksReal(text) ? "a whole number" : "a number"));
  }
  if (v < lo || v > hi) {
    return absl::InvalidArgumentError(
        absl::StrCat(Absl(what), ": '", Absl(text), "' is outside [", lo, ", ", hi, "]"));
  }
  return v;
}

absl::StatusOr<double> ParseRealNumber(std::string_view what, std::string_view text, double lo,
                                       double hi) {
  double v = 0;
  if (!absl::SimpleAtod(Absl(text), &v)) {
    return absl::InvalidArgumentError(absl::StrCat(Absl(what), ": '", Absl(text), "' is not a number"));
  }
  if (!std::isfinite(v)) {
    return absl::InvalidArgumentError(absl::StrCat(Absl(what), ": '", Absl(text), "' is not a finite number"));
  }
  if (v < lo || v > hi) {
    return absl::InvalidArgumentError(
        absl::StrCat(Absl(what), ": '", Absl(text), "' is outside [", lo, ", ", hi, "]"));
  }
  return v;
}

absl::StatusOr<std::optional<uint64_t>> ParseSeed(std::string_view what, std::string_view text) {
  if (text == "-1") return std::optional<uint64_t>();
  uint64_t v = 0;
  if (!absl::SimpleAtoi(Absl(text), &v)) {
    return absl::InvalidArgumentError(absl::StrCat(Absl(what), ": '", Absl(text), "' is not a seed (a whole number in [0, 18446744073709551615], or -1 "
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

absl::Status CheckModelDir(std::string_view flag, const std::string& path) {
  if (path.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(Absl(flag), " is empty: give a folder"));
  }
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) {
    const int err = errno;
    if (err == ENOENT || err == ENOTDIR) {
      return absl::NotFoundError(absl::StrCat(Absl(flag), " '", path, "': no such folder"));
    }
    return absl::FailedPreconditionError(
        absl::StrCat(Absl(flag), " '", path, "': ", std::strerror(err)));
  }
  if (!S_ISDIR(st.st_mode)) {
    return absl::FailedPreconditionError(
        absl::StrCat(Absl(flag), " '", path, "' is a file, not a folder (give the folder that holds it)"));
  }
  if (::access(path.c_str(), R_OK | X_OK) != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat(Absl(flag), " '", path, "': cannot read the folder: ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

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
