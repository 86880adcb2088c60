#include "tools/coli/chat_history.h"

#include <editline/readline.h>
#include <fcntl.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/io/io.h"

namespace coli::cli {
namespace {

// The file a symlinked history points at (dotfiles are often links into a repository), the
// path itself otherwise.
std::string ResolvedPath(const std::string& path) {
  char resolved[PATH_MAX];
  if (::realpath(path.c_str(), resolved) != nullptr) return resolved;
  // A link to a file not made yet: the link's own target (relative to the link's folder).
  const ssize_t n = ::readlink(path.c_str(), resolved, sizeof(resolved) - 1);
  if (n <= 0) return path;
  const std::string target(resolved, static_cast<size_t>(n));
  const size_t slash = path.rfind('/');
  if (target[0] == '/' || slash == std::string::npos) return target;
  return path.substr(0, slash + 1) + target;
}

}  // namespace

ChatHistory::ChatHistory(std::string path, int max_entries)
    : path_(std::move(path)), max_entries_(max_entries) {
  using_history();
  stifle_history(max_entries_);
}

void ChatHistory::Load() {
  clear_history();
  added_.clear();
  if (!path_.empty()) read_history(path_.c_str());
}

void ChatHistory::Add(const std::string& line) {
  if (line.empty()) return;
  add_history(line.c_str());
  added_.push_back(line);
}

std::vector<std::string> ChatHistory::Lines() {
  std::vector<std::string> lines;
  for (int i = 0; i < history_length; ++i) {
    if (HIST_ENTRY* e = history_get(history_base + i); e != nullptr && e->line != nullptr) {
      lines.emplace_back(e->line);
    }
  }
  return lines;
}

absl::Status ChatHistory::Save() {
  if (path_.empty() || added_.empty()) return absl::OkStatus();
  // Start again from the file: a chat that ended since this one started has saved its lines.
  clear_history();
  read_history(path_.c_str());
  for (const std::string& line : added_) add_history(line.c_str());
  stifle_history(max_entries_);
  // libedit writes its format to a file name only: a private scratch file, read back and then
  // written atomically over the real one.
  const char* tmpdir = std::getenv("TMPDIR");
  std::string scratch =
      absl::StrCat(tmpdir != nullptr && *tmpdir != '\0' ? tmpdir : "/tmp", "/coli-history-XXXXXX");
  const int fd = ::mkostemp(scratch.data(), O_CLOEXEC);  // 0600
  if (fd < 0) {
    return absl::InternalError(absl::StrCat(
        "chat history '", path_, "': cannot make a scratch file: ", std::strerror(errno)));
  }
  ::close(fd);
  const int written = write_history(scratch.c_str());
  absl::StatusOr<std::string> bytes = io::ReadFileToString(scratch);
  ::unlink(scratch.c_str());
  if (written != 0 || !bytes.ok()) {
    return absl::InternalError(absl::StrCat("chat history '", path_, "': libedit could not write ",
                                            "it (", written != 0 ? std::strerror(written) : "",
                                            bytes.ok() ? "" : bytes.status().message(), ")"));
  }
  const std::string target = ResolvedPath(path_);
  struct stat st;
  const mode_t mode = ::stat(target.c_str(), &st) == 0 ? (st.st_mode & 07777) : 0600;
  if (absl::Status s = io::WriteFileAtomic(target, *bytes, mode); !s.ok()) return s;
  added_.clear();
  return absl::OkStatus();
}

}  // namespace coli::cli
