#include "common/flags/flags.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace coli::flags {
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
    // Only long flags split at '=': a short one's value cannot start with "--".
    return absl::InvalidArgumentError(absl::StrCat(
        arg_, " needs a value, got the flag '", next, "' (",
        absl::StartsWith(arg_, "--")
            ? absl::StrCat("write ", arg_, "=", next, " if that is the value")
            : std::string("a value starting with '--' needs the flag's long form with '='"),
        ")"));
  }
  ++i_;
  return next;
}

absl::StatusOr<std::string> ArgReader::NonEmptyValue(std::string_view what) {
  absl::StatusOr<std::string> v = Value();
  if (v.ok() && v->empty()) {
    return absl::InvalidArgumentError(absl::StrCat(arg_, " is empty: give ", Absl(what)));
  }
  return v;
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
    return absl::InvalidArgumentError(
        absl::StrCat(Absl(what), ": '", Absl(text), "' is not ",
                     LooksReal(text) ? "a whole number" : "a number"));
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
    return absl::InvalidArgumentError(
        absl::StrCat(Absl(what), ": '", Absl(text), "' is not a number"));
  }
  if (!std::isfinite(v)) {
    return absl::InvalidArgumentError(
        absl::StrCat(Absl(what), ": '", Absl(text), "' is not a finite number"));
  }
  if (v < lo || v > hi) {
    return absl::InvalidArgumentError(
        absl::StrCat(Absl(what), ": '", Absl(text), "' is outside [", lo, ", ", hi, "]"));
  }
  return v;
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
    return absl::FailedPreconditionError(absl::StrCat(
        Absl(flag), " '", path, "' is a file, not a folder (give the folder that holds it)"));
  }
  if (::access(path.c_str(), R_OK | X_OK) != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat(Absl(flag), " '", path, "': cannot read the folder: ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

absl::Status CheckGrpcAddress(std::string_view flag, const std::string& address, bool listening) {
  if (address.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(Absl(flag), " is empty: give unix:/path or HOST:PORT"));
  }
  for (const char* scheme : {"unix:", "unix-abstract:"}) {
    if (!absl::StartsWith(address, scheme)) continue;
    if (address.size() == std::strlen(scheme)) {
      return absl::InvalidArgumentError(
          absl::StrCat(Absl(flag), " '", address, "' names no socket (unix:/path/to/socket)"));
    }
    return absl::OkStatus();
  }
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos || colon == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        Absl(flag), " '", address, "' is not unix:/path or HOST:PORT (e.g. 127.0.0.1:50051)"));
  }
  const std::string what = absl::StrCat(Absl(flag), " '", address, "': the port");
  absl::StatusOr<int64_t> port =
      ParseWholeNumber(what, std::string_view(address).substr(colon + 1), listening ? 0 : 1, 65535);
  return port.status();
}

}  // namespace coli::flags
