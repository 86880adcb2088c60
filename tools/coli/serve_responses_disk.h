// tools/coli/serve_responses_disk: the folder behind `coli serve --responses-dir DIR`, where
// finished stored /v1/responses survive a restart. One file per response, `DIR/<id>.json`:
//
//   {"format": "coli.response", "version": 1, "id": "resp_…",
//    "response": {...}, "conversation": [...] | null, "input_items": [...]}
//
// (what ResponseStore keeps for it; the event log of a background stream is not kept). Files are
// written atomically (a temp file beside it, fsync, rename, fsync of the folder), so a crash
// leaves the old file or the new one, never half of one. They hold whole conversations, so they
// are private: every file is 0600, and a folder Open creates is 0700 (an existing one keeps its
// mode; one readable by group or others is named in a warning at Open).
//
//   COLI_ASSIGN_OR_RETURN(std::unique_ptr<ResponseDir> dir, ResponseDir::Open("/var/coli/resp"));
//   std::vector<std::string> skipped;
//   for (StoredResponse& r : dir->Load(&skipped)) { ... }   // oldest first
//   dir->Write(id, ResponseDir::Encode(stored));             // after a response finishes
//   dir->Remove(id);                                         // DELETE, eviction
//
// Only ids coli makes (NewId("resp_"): "resp_" + 24 lowercase hex digits) ever become a path;
// any other string (a client's "../../etc/passwd") maps to no file. One server per folder: Open
// takes an exclusive flock on DIR/.lock, held until the ResponseDir is destroyed, and a second
// Open of the folder (another coli serve, or this process) fails naming it, before it touches
// anything (a second server would otherwise remove the first one's temp files at its start and
// the two stores would overwrite each other's files).
#ifndef COLI_TOOLS_COLI_SERVE_RESPONSES_DISK_H_
#define COLI_TOOLS_COLI_SERVE_RESPONSES_DISK_H_

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "tools/coli/serve_openai.h"

namespace coli::cli::serve {

// One stored response as its file holds it.
struct StoredResponse {
  std::string id;
  Json response;                     // the object GET /v1/responses/{id} answers
  Json conversation;                 // chat messages a follow-up continues, or null
  Json input_items = Json::array();  // GET .../input_items
};

class ResponseDir {
 public:
  static constexpr int kVersion = 1;
  // Files larger than this are skipped at load (never made by a store of sane limits).
  static constexpr uint64_t kMaxFileBytes = uint64_t{1} << 30;

  // The lock file in the folder (never removed: unlinking a lock file races with its next
  // taker), and the modes of what coli creates.
  static constexpr std::string_view kLockName = ".lock";
  static constexpr mode_t kFileMode = 0600;
  static constexpr mode_t kDirMode = 0700;

  // Creates `dir` if missing (mode 0700; missing parents with the default mode), locks it
  // (DIR/.lock, LOCK_EX | LOCK_NB) and checks that a file can be written, synced and renamed
  // there. Errors name the folder: "responses dir '/x': cannot create it: ...";
  // FAILED_PRECONDITION "responses dir '/x': another coli serve uses it ..." while another
  // ResponseDir (in any process) holds the lock. An existing folder readable by group or others
  // is kept as it is, with one warning log line naming it.
  static absl::StatusOr<std::unique_ptr<ResponseDir>> Open(const std::string& dir);
  ~ResponseDir();  // releases the lock
  ResponseDir(const ResponseDir&) = delete;
  ResponseDir& operator=(const ResponseDir&) = delete;

  const std::string& dir() const { return dir_; }

  // True for the ids coli makes for responses: "resp_" + 24 lowercase hex digits.
  static bool IsResponseId(std::string_view id);
  // DIR/<id>.json; nullopt for anything that is not such an id (no path is ever built from it).
  std::optional<std::string> PathOf(std::string_view id) const;

  // The file's bytes for one response (format, version, id, response, conversation,
  // input_items: see the top of this file).
  static std::string Encode(std::string_view id, const Json& response, const Json& conversation,
                            const Json& input_items);
  // Reads a file's bytes back. DATA_LOSS naming `file` when they are not valid JSON (a truncated
  // file), another format or version, an id other than `id`, or a response that is not a
  // finished one (status completed / incomplete / failed / cancelled, integer created_at).
  static absl::StatusOr<StoredResponse> Decode(std::string_view bytes, std::string_view id,
                                               const std::string& file);

  // Writes `bytes` as the file of `id` atomically (INVALID_ARGUMENT for a bad id; the I/O
  // error naming the file otherwise).
  absl::Status Write(std::string_view id, std::string_view bytes) const;
  // Removes the file of `id` (and syncs the folder); a file that is not there is OK.
  absl::Status Remove(std::string_view id) const;

  // Every response file in the folder, oldest first (by the response's created_at, then id).
  // Files named otherwise are ignored, except temp files a crash left mid-write, which are
  // removed. A file that cannot be read or decoded is left in place and named in *skipped
  // ("file '...': why"), one line each.
  std::vector<StoredResponse> Load(std::vector<std::string>* skipped) const;

 private:
  ResponseDir(std::string dir, int lock_fd) : dir_(std::move(dir)), lock_fd_(lock_fd) {}
  std::string dir_;
  int lock_fd_;  // DIR/.lock, flock'ed LOCK_EX for this object's life
};

}  // namespace coli::cli::serve

#endif  // COLI_TOOLS_COLI_SERVE_RESPONSES_DISK_H_
