#include "tools/coli/serve_responses_disk.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <system_error>
#include <utility>

#include "common/io/io.h"
#include "common/log/log.h"

namespace coli::cli::serve {
namespace {

constexpr std::string_view kFormat = "coli.response";
constexpr std::string_view kPrefix = "resp_";
constexpr size_t kHexDigits = 24;  // NewId: %016llx%08x
constexpr std::string_view kSuffix = ".json";
constexpr std::string_view kProbe = ".coli-probe";
// Deeper than anything a request can make (request bodies stop at 256 levels), bounded so a
// hostile file cannot exhaust the stack of the recursive parser.
constexpr int kMaxDepth = 1024;

bool IsTerminal(const Json& status) {
  return status.is_string() && (status == "completed" || status == "incomplete" ||
                                status == "failed" || status == "cancelled");
}

// The names io::WriteFileAtomic gives its temp files: "." + final name + ".tmp." + 6 characters.
bool IsTempName(std::string_view name, std::string_view* final_name) {
  constexpr std::string_view kTmp = ".tmp.";
  if (name.size() < 1 + kTmp.size() + 6 || name[0] != '.') return false;
  const std::string_view tail = name.substr(name.size() - 6);
  auto alnum = [](char c) { return std::isalnum(static_cast<unsigned char>(c)) != 0; };
  if (!std::all_of(tail.begin(), tail.end(), alnum)) return false;
  const std::string_view mid = name.substr(name.size() - 6 - kTmp.size(), kTmp.size());
  if (mid != kTmp) return false;
  *final_name = name.substr(1, name.size() - 1 - kTmp.size() - 6);
  return true;
}

// "resp_<hex>.json" -> the id; nullopt for any other name.
std::optional<std::string_view> IdOfFileName(std::string_view name) {
  if (name.size() <= kSuffix.size() || name.substr(name.size() - kSuffix.size()) != kSuffix) {
    return std::nullopt;
  }
  const std::string_view id = name.substr(0, name.size() - kSuffix.size());
  if (!ResponseDir::IsResponseId(id)) return std::nullopt;
  return id;
}

std::string Dump(const Json& j) { return j.dump(-1, ' ', false, Json::error_handler_t::replace); }

absl::Status SyncDir(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) {
    return absl::InternalError("responses dir '" + dir +
                               "': cannot open it to sync: " + std::strerror(errno));
  }
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  if (rc != 0) {
    return absl::InternalError("responses dir '" + dir + "': fsync failed: " + std::strerror(err));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<ResponseDir>> ResponseDir::Open(const std::string& dir) {
  if (dir.empty()) return absl::InvalidArgumentError("responses dir: the path is empty");
  auto failed = [&dir](std::string_view why) {
    return absl::FailedPreconditionError("responses dir '" + dir + "': " + std::string(why));
  };
  struct stat before;
  const bool existed = ::stat(dir.c_str(), &before) == 0;
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return failed("cannot create it: " + ec.message());
  if (!std::filesystem::is_directory(dir, ec)) return failed("not a directory");
  if (!existed) {
    // Made here (with 0777 less the umask): private before anything is written into it.
    if (::chmod(dir.c_str(), kDirMode) != 0) {
      return failed(std::string("cannot make it private (chmod 0700): ") + std::strerror(errno));
    }
  } else if ((before.st_mode & (S_IRGRP | S_IROTH)) != 0) {
    // The user's folder keeps its mode; the files are 0600, but their names are the response
    // ids, which GET /v1/responses/{id} answers to anyone who can reach the server.
    char mode[8];
    std::snprintf(mode, sizeof(mode), "%04o", static_cast<unsigned>(before.st_mode & 07777));
    COLI_LOG(kWarning) << "responses dir '" << dir << "' (mode " << mode << ") is readable by "
                       << ((before.st_mode & S_IROTH) != 0 ? "other users" : "its group")
                       << ": the stored responses are 0600, but their ids can be listed "
                          "(chmod 700 it to keep them private)";
  }
  // One server per folder, before anything in it is touched. The lock file stays (removing it
  // would race with the next server taking it); O_CLOEXEC: a child process never holds it.
  const std::string lock_path = dir + "/" + std::string(kLockName);
  const int lock_fd =
      ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, kFileMode);
  if (lock_fd < 0) {
    return failed("cannot open its lock file '" + lock_path + "': " + std::strerror(errno));
  }
  if (::flock(lock_fd, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    ::close(lock_fd);
    if (err == EWOULDBLOCK) {
      return failed("another coli serve uses it (it holds the lock on '" + lock_path +
                    "'); one server per folder");
    }
    return failed("cannot lock '" + lock_path + "': " + std::strerror(err));
  }
  // From here the lock is released with `opened` on any error.
  std::unique_ptr<ResponseDir> opened(new ResponseDir(dir, lock_fd));
  // The same steps a response's file takes: temp file, fsync, rename, then remove it again.
  std::string probe = dir + "/" + std::string(kProbe);
  if (absl::Status s = io::WriteFileAtomic(probe, "probe\n", kFileMode); !s.ok()) {
    return failed("cannot write there: " + std::string(s.message()));
  }
  if (::unlink(probe.c_str()) != 0) {
    return failed("cannot remove '" + probe + "': " + std::strerror(errno));
  }
  return opened;
}

ResponseDir::~ResponseDir() {
  if (lock_fd_ >= 0) ::close(lock_fd_);  // releases the flock
}

bool ResponseDir::IsResponseId(std::string_view id) {
  if (id.size() != kPrefix.size() + kHexDigits || id.substr(0, kPrefix.size()) != kPrefix) {
    return false;
  }
  return std::all_of(id.begin() + kPrefix.size(), id.end(),
                     [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
}

std::optional<std::string> ResponseDir::PathOf(std::string_view id) const {
  if (!IsResponseId(id)) return std::nullopt;
  return dir_ + "/" + std::string(id) + std::string(kSuffix);
}

std::string ResponseDir::Encode(std::string_view id, const Json& response, const Json& conversation,
                                const Json& input_items) {
  // Put together from the parts' dumps, so the (possibly large) objects are not copied.
  Json head = Json::object();
  head["format"] = kFormat;
  head["version"] = kVersion;
  head["id"] = id;
  std::string out = Dump(head);
  out.pop_back();  // the closing brace
  out += ",\"response\":" + Dump(response) + ",\"conversation\":" + Dump(conversation) +
         ",\"input_items\":" + Dump(input_items) + "}\n";
  return out;
}

absl::StatusOr<StoredResponse> ResponseDir::Decode(std::string_view bytes, std::string_view id,
                                                   const std::string& file) {
  auto bad = [&file](std::string_view why) {
    return absl::DataLossError("responses file '" + file + "': " + std::string(why));
  };
  bool too_deep = false;
  Json j = Json::parse(
      bytes.begin(), bytes.end(),
      [&too_deep](int depth, Json::parse_event_t, Json&) {
        if (depth > kMaxDepth) too_deep = true;
        return !too_deep;
      },
      /*allow_exceptions=*/false);
  if (too_deep) return bad("nests deeper than " + std::to_string(kMaxDepth) + " levels");
  if (j.is_discarded()) return bad("not valid JSON (truncated or corrupt)");
  if (!j.is_object()) return bad("not a JSON object");
  if (!j.contains("format") || j["format"] != kFormat) {
    return bad("not a coli response file (\"format\" is not \"coli.response\")");
  }
  if (!j.contains("version") || !j["version"].is_number_integer()) {
    return bad("no integer \"version\"");
  }
  if (j["version"] != kVersion) {
    return bad("version " + Dump(j["version"]) + ", this coli reads version " +
               std::to_string(kVersion));
  }
  if (!j.contains("id") || j["id"] != id) return bad("its \"id\" is not '" + std::string(id) + "'");
  StoredResponse r;
  r.id = std::string(id);
  if (!j.contains("response") || !j["response"].is_object()) return bad("no \"response\" object");
  r.response = std::move(j["response"]);
  if (!r.response.contains("id") || r.response["id"] != id) {
    return bad("\"response.id\" is not '" + std::string(id) + "'");
  }
  if (!r.response.contains("created_at") || !r.response["created_at"].is_number_integer()) {
    return bad("\"response.created_at\" is not an integer");
  }
  if (!r.response.contains("status") || !IsTerminal(r.response["status"])) {
    return bad("\"response.status\" is not completed, incomplete, failed or cancelled");
  }
  if (!j.contains("conversation") ||
      !(j["conversation"].is_array() || j["conversation"].is_null())) {
    return bad("\"conversation\" is not an array or null");
  }
  r.conversation = std::move(j["conversation"]);
  if (!j.contains("input_items") || !j["input_items"].is_array()) {
    return bad("\"input_items\" is not an array");
  }
  r.input_items = std::move(j["input_items"]);
  return r;
}

absl::Status ResponseDir::Write(std::string_view id, std::string_view bytes) const {
  std::optional<std::string> path = PathOf(id);
  if (!path) {
    return absl::InvalidArgumentError("responses dir '" + dir_ + "': '" + std::string(id) +
                                      "' is not a response id");
  }
  return io::WriteFileAtomic(*path, bytes, kFileMode);  // temp + fsync + rename + fsync of dir
}

absl::Status ResponseDir::Remove(std::string_view id) const {
  std::optional<std::string> path = PathOf(id);
  if (!path) {
    return absl::InvalidArgumentError("responses dir '" + dir_ + "': '" + std::string(id) +
                                      "' is not a response id");
  }
  if (::unlink(path->c_str()) != 0) {
    if (errno == ENOENT) return absl::OkStatus();
    return absl::InternalError("responses file '" + *path +
                               "': cannot remove it: " + std::strerror(errno));
  }
  return SyncDir(dir_);
}

std::vector<StoredResponse> ResponseDir::Load(std::vector<std::string>* skipped) const {
  std::vector<StoredResponse> out;
  std::error_code ec;
  std::filesystem::directory_iterator it(dir_, ec);
  if (ec) {
    skipped->push_back("responses dir '" + dir_ + "': cannot list it: " + ec.message());
    return out;
  }
  for (; it != std::filesystem::directory_iterator(); it.increment(ec)) {
    if (ec) {
      skipped->push_back("responses dir '" + dir_ + "': listing stopped: " + ec.message());
      break;
    }
    const std::string name = it->path().filename().string();
    const std::string file = dir_ + "/" + name;
    std::string_view final_name;
    if (IsTempName(name, &final_name)) {
      // Left by a crash before its rename: the file it was to replace (if any) is intact.
      if (final_name == kProbe || IdOfFileName(final_name)) ::unlink(file.c_str());
      continue;
    }
    const std::optional<std::string_view> id = IdOfFileName(name);
    if (!id) continue;  // not ours
    std::error_code type_ec;
    if (!it->is_regular_file(type_ec)) {
      skipped->push_back("responses file '" + file + "': not a regular file");
      continue;
    }
    auto f = io::File::Open(file);
    if (!f.ok()) {
      skipped->push_back("responses file '" + file + "': " + std::string(f.status().message()));
      continue;
    }
    if ((*f)->size() > kMaxFileBytes) {
      skipped->push_back("responses file '" + file + "': larger than 1 GiB");
      continue;
    }
    std::string bytes((*f)->size(), '\0');
    if (absl::Status s = (*f)->ReadAt(0, bytes.size(), bytes.data()); !s.ok()) {
      skipped->push_back("responses file '" + file + "': " + std::string(s.message()));
      continue;
    }
    absl::StatusOr<StoredResponse> r = Decode(bytes, *id, file);
    if (!r.ok()) {
      skipped->push_back(std::string(r.status().message()));
      continue;
    }
    out.push_back(*std::move(r));
  }
  std::sort(out.begin(), out.end(), [](const StoredResponse& a, const StoredResponse& b) {
    const int64_t ta = a.response["created_at"].get<int64_t>();
    const int64_t tb = b.response["created_at"].get<int64_t>();
    return ta != tb ? ta < tb : a.id < b.id;
  });
  return out;
}

}  // namespace coli::cli::serve
