// common/io: reading weight files — pread ranges, read-only mmap views, O_DIRECT reads of any
// byte range, a parallel batch read, and atomic whole-file writes.
//
//   COLI_ASSIGN_OR_RETURN(std::unique_ptr<coli::io::File> f, coli::io::File::Open(path));
//   std::vector<uint8_t> bytes(n);
//   COLI_RETURN_IF_ERROR(f->ReadAt(offset, n, bytes.data()));
//
//   COLI_ASSIGN_OR_RETURN(auto direct, coli::io::DirectReader::Open(path));  // O_DIRECT if allowed
//   coli::io::AlignedBuffer buf;
//   COLI_ASSIGN_OR_RETURN(const uint8_t* p, direct->ReadInto(offset, n, &buf));  // p[0..n)
//
// Every error names the file. Missing files are NOT_FOUND, folders where a file is expected
// are INVALID_ARGUMENT, reads past the end of a file are DATA_LOSS, other system errors carry
// the errno text. Nothing here throws.
#ifndef COLI_COMMON_IO_IO_H_
#define COLI_COMMON_IO_IO_H_

#include <sys/types.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace coli::io {

// Alignment of O_DIRECT offsets, lengths and buffers.
inline constexpr uint64_t kDirectAlignment = 4096;

// A read-only file; pread-based, thread-safe for concurrent reads.
class File {
 public:
  // NOT_FOUND when missing, INVALID_ARGUMENT when `path` is not a regular file.
  static absl::StatusOr<std::unique_ptr<File>> Open(const std::string& path);
  ~File();
  File(const File&) = delete;
  File& operator=(const File&) = delete;

  const std::string& path() const { return path_; }
  uint64_t size() const { return size_; }
  int fd() const { return fd_; }
  // Reads exactly [offset, offset+length) into dst (DATA_LOSS naming the file on a short read
  // or a range past the end of the file). Thread-safe.
  absl::Status ReadAt(uint64_t offset, uint64_t length, void* dst) const;

 private:
  File(std::string path, int fd, uint64_t size) : path_(std::move(path)), fd_(fd), size_(size) {}
  std::string path_;
  int fd_;
  uint64_t size_;
};

// Reads a whole (small) file into a string; RESOURCE_EXHAUSTED above `max_bytes`.
absl::StatusOr<std::string> ReadFileToString(const std::string& path,
                                             uint64_t max_bytes = uint64_t{1} << 30);

// A read-only mmap of a whole file (MAP_PRIVATE, PROT_READ). An empty file maps to
// data() == nullptr, size() == 0.
class MappedFile {
 public:
  // With `own_file_only`, a link (O_NOFOLLOW) or a file of another user is refused
  // (PERMISSION_DENIED): what this process reads back from a folder others may write to.
  static absl::StatusOr<std::unique_ptr<MappedFile>> Map(const std::string& path,
                                                         bool own_file_only = false);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const std::string& path() const { return path_; }
  const uint8_t* data() const { return data_; }
  uint64_t size() const { return size_; }

 private:
  MappedFile(std::string path, const uint8_t* data, uint64_t size)
      : path_(std::move(path)), data_(data), size_(size) {}
  std::string path_;
  const uint8_t* data_;
  uint64_t size_;
};

// A 4 KiB-aligned heap buffer (for O_DIRECT). Move-only.
class AlignedBuffer {
 public:
  explicit AlignedBuffer(size_t bytes = 0);
  ~AlignedBuffer();
  AlignedBuffer(AlignedBuffer&& other) noexcept;
  AlignedBuffer& operator=(AlignedBuffer&& other) noexcept;
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;

  // Ensures capacity() >= bytes (rounded up to 4 KiB). Growing does not keep the contents.
  void Reserve(size_t bytes);
  uint8_t* data() { return data_; }
  const uint8_t* data() const { return data_; }
  size_t capacity() const { return capacity_; }

 private:
  uint8_t* data_ = nullptr;
  size_t capacity_ = 0;
};

// Reads any byte range with O_DIRECT (bypassing the page cache): the 4 KiB-aligned cover of
// the range is read into an aligned buffer, so unaligned heads and tails cost at most one
// extra block each. Where the filesystem refuses O_DIRECT (EINVAL at open, or at the first
// read), the reader falls back to buffered pread and logs why (once per reader).
// Thread-safe for concurrent reads (each call uses its own buffer).
class DirectReader {
 public:
  // `direct = false` asks for buffered reads from the start (K3_DIRECT=0).
  static absl::StatusOr<std::unique_ptr<DirectReader>> Open(const std::string& path,
                                                            bool direct = true);
  ~DirectReader();
  DirectReader(const DirectReader&) = delete;
  DirectReader& operator=(const DirectReader&) = delete;

  const std::string& path() const { return file_->path(); }
  uint64_t size() const { return file_->size(); }
  // True while reads go through O_DIRECT.
  bool is_direct() const { return direct_fd_.load() >= 0; }
  // Why the reader is buffered ("" when direct, or when buffered was asked for).
  std::string fallback_reason() const;

  // Reads the 4 KiB-aligned cover of [offset, offset+length) into *buffer (grown if needed)
  // and returns the pointer to the first requested byte inside it (no copy). In buffered mode
  // only the requested bytes are read, to the start of the buffer. DATA_LOSS when the range
  // runs past the end of the file.
  absl::StatusOr<const uint8_t*> ReadInto(uint64_t offset, uint64_t length,
                                          AlignedBuffer* buffer) const;
  // Same, copied to an arbitrary destination (aligned requests go straight into dst; others
  // through a per-thread bounce buffer in pieces of at most 8 MiB).
  absl::Status Read(uint64_t offset, uint64_t length, void* dst) const;

 private:
  DirectReader(std::unique_ptr<File> file, int direct_fd, std::string reason);
  // O_DIRECT read of the aligned span [start, start+span) into aligned dst; `needed` is how
  // many bytes from `start` must arrive (the rest may be cut short by the end of the file).
  absl::Status ReadAligned(uint64_t start, uint64_t span, uint64_t needed, uint8_t* dst) const;
  void FallBack(std::string reason) const;

  std::unique_ptr<File> file_;          // buffered descriptor (always open)
  mutable std::atomic<int> direct_fd_;  // -1 once buffered
  int direct_fd_to_close_;              // closed in the destructor
  mutable std::mutex reason_mu_;
  mutable std::string reason_;  // guarded by reason_mu_
};

// Many ranges read in parallel (`threads` worker threads, 1 = inline), issued in ascending
// (file path, offset) order. Returns the first error in that order; all requests are
// attempted. INVALID_ARGUMENT for a null file or a null dst with a non-zero length.
struct ReadRequest {
  const File* file;
  uint64_t offset;
  uint64_t length;
  void* dst;
};
absl::Status ReadBatch(std::span<const ReadRequest> requests, int threads);

// Atomic write: a temp file in the same folder, written, fsync'ed, renamed over `path`, then
// the folder fsync'ed. On failure the temp file is removed and `path` is untouched.
// The file gets exactly `mode` (fchmod, not reduced by the umask); the temp file is 0600 until
// then, so a private file (0600) is never readable by others, not even while being written.
// INVALID_ARGUMENT naming the file for a mode with bits other than 07777.
absl::Status WriteFileAtomic(const std::string& path, std::string_view bytes, mode_t mode = 0644);

namespace internal {
// Test seam: while non-zero, opening with O_DIRECT fails as if the filesystem returned this
// errno (e.g. EINVAL, as tmpfs did before Linux 6.6), so the fallback path can be tested on
// any filesystem.
void SetDirectOpenErrnoForTesting(int errno_value);
}  // namespace internal

}  // namespace coli::io

#endif  // COLI_COMMON_IO_IO_H_
