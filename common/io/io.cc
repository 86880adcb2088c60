#include "common/io/io.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/io/cat.h"
#include "common/log/log.h"
#include "common/memory/huge_pages.h"

namespace coli::io {

using ::coli::internal_cat::Cat;
namespace {

std::atomic<int> g_direct_open_errno_for_testing{0};

// Largest piece handed to one pread (Linux caps a single read at 0x7ffff000 bytes anyway).
constexpr uint64_t kMaxPiece = uint64_t{1} << 30;
// Bounce-buffer piece size of DirectReader::Read for unaligned requests.
constexpr uint64_t kBouncePiece = uint64_t{8} << 20;

uint64_t AlignDown(uint64_t x) { return x & ~(kDirectAlignment - 1); }
uint64_t AlignUp(uint64_t x) { return AlignDown(x + kDirectAlignment - 1); }

absl::Status ErrnoError(int err, std::string_view what, std::string_view path) {
  std::string message = Cat("file '", path, "': ", what, ": ", std::strerror(err));
  switch (err) {
    case ENOENT:
    case ENOTDIR:
      return absl::NotFoundError(message);
    case EACCES:
    case EPERM:
      return absl::PermissionDeniedError(message);
    case EISDIR:
    case EINVAL:
      return absl::InvalidArgumentError(message);
    case ENOMEM:
    case ENOSPC:
    case EMFILE:
    case ENFILE:
      return absl::ResourceExhaustedError(message);
    default:
      return absl::UnknownError(message);
  }
}

absl::Status CheckRange(const std::string& path, uint64_t size, uint64_t offset, uint64_t length) {
  if (offset > size || length > size - offset) {
    return absl::DataLossError(Cat("file '", path, "': range [", offset, ", ", offset + length,
                                   ") runs past the end of the file (", size, " bytes)"));
  }
  return absl::OkStatus();
}

// ENOENT on a path that is itself a symlink: its target is missing (in a Hugging Face cache
// every file is a link into blobs/, and a pruned or half-copied cache leaves such links).
absl::Status OpenError(int err, const std::string& path) {
  char target[4096];
  ssize_t n = -1;
  if (err == ENOENT) n = ::readlink(path.c_str(), target, sizeof(target) - 1);
  if (n < 0) return ErrnoError(err, "cannot open", path);
  target[n] = '\0';
  return absl::NotFoundError(Cat("file '", path, "': cannot open: it is a symlink to '", target,
                                 "', which does not exist (an interrupted or pruned download?)"));
}

// Opens `path` read-only with extra `flags` and checks that it is a regular file.
absl::StatusOr<int> OpenRegular(const std::string& path, int flags, uint64_t* size,
                                bool own_file_only = false) {
  // O_NONBLOCK: opening a FIFO put where a file belongs must not wait for a writer forever
  // (it is refused below as not a regular file); cleared again for the regular file.
  int fd = ::open(path.c_str(),
                  O_RDONLY | O_CLOEXEC | O_NONBLOCK | flags | (own_file_only ? O_NOFOLLOW : 0));
  if (fd < 0) return OpenError(errno, path);
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    int err = errno;
    ::close(fd);
    return ErrnoError(err, "cannot stat", path);
  }
  if (own_file_only && st.st_uid != ::geteuid()) {
    ::close(fd);
    return absl::PermissionDeniedError(Cat("file '", path, "' belongs to another user"));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return absl::InvalidArgumentError(
        Cat("file '", path, "': ", S_ISDIR(st.st_mode) ? "is a directory" : "is not a regular file",
            ", expected a file"));
  }
  if (const int fl = ::fcntl(fd, F_GETFL); fl >= 0) ::fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
  if (size != nullptr) *size = static_cast<uint64_t>(st.st_size);
  return fd;
}

// pread until `length` bytes arrived; DATA_LOSS on end of file.
absl::Status PreadFully(int fd, const std::string& path, uint64_t offset, uint64_t length,
                        uint8_t* dst) {
  uint64_t done = 0;
  while (done < length) {
    size_t piece = static_cast<size_t>(std::min(length - done, kMaxPiece));
    ssize_t n = ::pread(fd, dst + done, piece, static_cast<off_t>(offset + done));
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoError(errno, Cat("read at offset ", offset + done), path);
    }
    if (n == 0) {
      return absl::DataLossError(Cat("file '", path, "': short read at offset ", offset + done,
                                     " (", length - done,
                                     " bytes missing; was the file truncated?)"));
    }
    done += static_cast<uint64_t>(n);
  }
  return absl::OkStatus();
}

}  // namespace

namespace internal {
void SetDirectOpenErrnoForTesting(int errno_value) {
  g_direct_open_errno_for_testing.store(errno_value);
}
}  // namespace internal

// ---------------------------------------------------------------------------------------------
// File

absl::StatusOr<std::unique_ptr<File>> File::Open(const std::string& path) {
  uint64_t size = 0;
  absl::StatusOr<int> fd = OpenRegular(path, 0, &size);
  if (!fd.ok()) return fd.status();
  return std::unique_ptr<File>(new File(path, *fd, size));
}

File::~File() { ::close(fd_); }

absl::Status File::ReadAt(uint64_t offset, uint64_t length, void* dst) const {
  absl::Status range = CheckRange(path_, size_, offset, length);
  if (!range.ok()) return range;
  return PreadFully(fd_, path_, offset, length, static_cast<uint8_t*>(dst));
}

absl::StatusOr<std::string> ReadFileToString(const std::string& path, uint64_t max_bytes) {
  absl::StatusOr<std::unique_ptr<File>> file = File::Open(path);
  if (!file.ok()) return file.status();
  if ((*file)->size() > max_bytes) {
    return absl::ResourceExhaustedError(
        Cat("file '", path, "': ", (*file)->size(), " bytes, more than the limit of ", max_bytes));
  }
  std::string bytes((*file)->size(), '\0');
  absl::Status read = (*file)->ReadAt(0, bytes.size(), bytes.data());
  if (!read.ok()) return read;
  return bytes;
}

// ---------------------------------------------------------------------------------------------
// MappedFile

absl::StatusOr<std::unique_ptr<MappedFile>> MappedFile::Map(const std::string& path,
                                                           bool own_file_only) {
  uint64_t size = 0;
  absl::StatusOr<int> fd = OpenRegular(path, 0, &size, own_file_only);
  if (!fd.ok()) return fd.status();
  const uint8_t* data = nullptr;
  if (size > 0) {
    void* p = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, *fd, 0);
    if (p == MAP_FAILED) {
      int err = errno;
      ::close(*fd);
      return ErrnoError(err, "cannot mmap", path);
    }
    data = static_cast<const uint8_t*>(p);
  }
  ::close(*fd);  // the mapping stays valid without the descriptor
  return std::unique_ptr<MappedFile>(new MappedFile(path, data, size));
}

MappedFile::~MappedFile() {
  if (data_ != nullptr) ::munmap(const_cast<uint8_t*>(data_), size_);
}

// ---------------------------------------------------------------------------------------------
// AlignedBuffer

AlignedBuffer::AlignedBuffer(size_t bytes) { Reserve(bytes); }

AlignedBuffer::~AlignedBuffer() { memory::FreeLarge(data_); }

AlignedBuffer::AlignedBuffer(AlignedBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)), capacity_(std::exchange(other.capacity_, 0)) {}

AlignedBuffer& AlignedBuffer::operator=(AlignedBuffer&& other) noexcept {
  if (this != &other) {
    memory::FreeLarge(data_);
    data_ = std::exchange(other.data_, nullptr);
    capacity_ = std::exchange(other.capacity_, 0);
  }
  return *this;
}

void AlignedBuffer::Reserve(size_t bytes) {
  if (bytes <= capacity_) return;
  size_t rounded = static_cast<size_t>(AlignUp(bytes));
  // Expert slots are streamed like weights: huge pages where the system allows (2 MiB aligned,
  // which is also kDirectAlignment-aligned).
  void* p = memory::AllocateLarge(rounded, kDirectAlignment);
  if (p == nullptr) {
    // Allocation failure of a read buffer is not recoverable here; std::bad_alloc semantics.
    COLI_LOG(kError) << "AlignedBuffer: cannot allocate " << rounded << " bytes";
    std::abort();
  }
  memory::FreeLarge(data_);
  data_ = static_cast<uint8_t*>(p);
  capacity_ = rounded;
}

// ---------------------------------------------------------------------------------------------
// DirectReader

DirectReader::DirectReader(std::unique_ptr<File> file, int direct_fd, std::string reason)
    : file_(std::move(file)),
      direct_fd_(direct_fd),
      direct_fd_to_close_(direct_fd),
      reason_(std::move(reason)) {}

DirectReader::~DirectReader() {
  if (direct_fd_to_close_ >= 0) ::close(direct_fd_to_close_);
}

absl::StatusOr<std::unique_ptr<DirectReader>> DirectReader::Open(const std::string& path,
                                                                 bool direct) {
  absl::StatusOr<std::unique_ptr<File>> file = File::Open(path);
  if (!file.ok()) return file.status();
  if (!direct) {
    return std::unique_ptr<DirectReader>(new DirectReader(std::move(*file), -1, ""));
  }
  int err = g_direct_open_errno_for_testing.load();
  int fd = -1;
  if (err == 0) {
    fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_DIRECT);
    if (fd < 0) err = errno;
  }
  if (fd < 0) {
    if (err != EINVAL && err != EOPNOTSUPP) return ErrnoError(err, "cannot open (O_DIRECT)", path);
    std::string reason = Cat("the filesystem refused O_DIRECT at open (", std::strerror(err), ")");
    COLI_LOG(kWarning) << "file '" << path << "': " << reason << "; reading buffered";
    return std::unique_ptr<DirectReader>(new DirectReader(std::move(*file), -1, reason));
  }
  return std::unique_ptr<DirectReader>(new DirectReader(std::move(*file), fd, ""));
}

std::string DirectReader::fallback_reason() const {
  std::lock_guard<std::mutex> lock(reason_mu_);
  return reason_;
}

void DirectReader::FallBack(std::string reason) const {
  {
    std::lock_guard<std::mutex> lock(reason_mu_);
    if (direct_fd_.load() < 0) return;  // another thread already fell back
    reason_ = reason;
    direct_fd_.store(-1);
  }
  COLI_LOG(kWarning) << "file '" << path() << "': " << reason << "; reading buffered";
}

absl::Status DirectReader::ReadAligned(uint64_t start, uint64_t span, uint64_t needed,
                                       uint8_t* dst) const {
  uint64_t done = 0;
  while (done < needed) {
    int fd = direct_fd_.load();
    if (fd < 0 || done % kDirectAlignment != 0) {
      // Buffered from here on: after a fallback, or after a short O_DIRECT read left us at an
      // unaligned position.
      return PreadFully(file_->fd(), path(), start + done, needed - done, dst + done);
    }
    size_t piece = static_cast<size_t>(std::min(span - done, AlignDown(kMaxPiece)));
    ssize_t n = ::pread(fd, dst + done, piece, static_cast<off_t>(start + done));
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EINVAL && done == 0) {
        FallBack(Cat("the filesystem refused an O_DIRECT read (", std::strerror(errno), ")"));
        continue;
      }
      return ErrnoError(errno, Cat("O_DIRECT read at offset ", start + done), path());
    }
    if (n == 0) {
      return absl::DataLossError(Cat("file '", path(), "': short read at offset ", start + done,
                                     " (", needed - done,
                                     " bytes missing; was the file truncated?)"));
    }
    done += static_cast<uint64_t>(n);
  }
  return absl::OkStatus();
}

absl::StatusOr<const uint8_t*> DirectReader::ReadInto(uint64_t offset, uint64_t length,
                                                      AlignedBuffer* buffer) const {
  absl::Status range = CheckRange(path(), size(), offset, length);
  if (!range.ok()) return range;
  if (length == 0) return static_cast<const uint8_t*>(buffer->data());
  if (is_direct()) {
    uint64_t start = AlignDown(offset);
    uint64_t span = AlignUp(offset + length) - start;
    buffer->Reserve(static_cast<size_t>(span));
    absl::Status read = ReadAligned(start, span, offset + length - start, buffer->data());
    if (!read.ok()) return read;
    return static_cast<const uint8_t*>(buffer->data() + (offset - start));
  }
  buffer->Reserve(static_cast<size_t>(length));
  absl::Status read = PreadFully(file_->fd(), path(), offset, length, buffer->data());
  if (!read.ok()) return read;
  return static_cast<const uint8_t*>(buffer->data());
}

absl::Status DirectReader::Read(uint64_t offset, uint64_t length, void* dst) const {
  absl::Status range = CheckRange(path(), size(), offset, length);
  if (!range.ok()) return range;
  if (!is_direct())
    return PreadFully(file_->fd(), path(), offset, length, static_cast<uint8_t*>(dst));
  auto* out = static_cast<uint8_t*>(dst);
  if (reinterpret_cast<uintptr_t>(dst) % kDirectAlignment == 0 && offset % kDirectAlignment == 0 &&
      length % kDirectAlignment == 0) {
    return ReadAligned(offset, length, length, out);
  }
  thread_local AlignedBuffer bounce;
  uint64_t pos = offset;
  const uint64_t end = offset + length;
  while (pos < end) {
    // Pieces after the first start on a 4 KiB boundary, so each costs at most one extra block.
    uint64_t piece_end = std::min(end, AlignDown(pos) + kBouncePiece);
    absl::StatusOr<const uint8_t*> p = ReadInto(pos, piece_end - pos, &bounce);
    if (!p.ok()) return p.status();
    std::memcpy(out + (pos - offset), *p, piece_end - pos);
    pos = piece_end;
  }
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------------------------
// ReadBatch

absl::Status ReadBatch(std::span<const ReadRequest> requests, int threads) {
  for (size_t i = 0; i < requests.size(); ++i) {
    const ReadRequest& r = requests[i];
    if (r.file == nullptr || (r.dst == nullptr && r.length > 0)) {
      return absl::InvalidArgumentError(
          Cat("ReadBatch: request ", i, " has a null ", r.file == nullptr ? "file" : "dst"));
    }
  }
  std::vector<size_t> order(requests.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    const ReadRequest& x = requests[a];
    const ReadRequest& y = requests[b];
    return std::tie(x.file->path(), x.offset) < std::tie(y.file->path(), y.offset);
  });
  std::vector<absl::Status> results(requests.size());
  std::atomic<size_t> next{0};
  auto worker = [&] {
    for (size_t k = next.fetch_add(1); k < order.size(); k = next.fetch_add(1)) {
      const ReadRequest& r = requests[order[k]];
      results[k] = r.file->ReadAt(r.offset, r.length, r.dst);
    }
  };
  size_t n_threads = std::min(static_cast<size_t>(std::max(threads, 1)), order.size());
  if (n_threads <= 1) {
    worker();
  } else {
    std::vector<std::thread> pool;
    pool.reserve(n_threads);
    for (size_t t = 0; t < n_threads; ++t) pool.emplace_back(worker);
    for (std::thread& t : pool) t.join();
  }
  for (const absl::Status& s : results) {
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------------------------
// WriteFileAtomic

absl::Status WriteFileAtomic(const std::string& path, std::string_view bytes, mode_t mode) {
  if ((mode & ~mode_t{07777}) != 0) {
    char octal[24];
    std::snprintf(octal, sizeof(octal), "0%o", static_cast<unsigned>(mode));
    return absl::InvalidArgumentError(Cat("file '", path, "': mode ", octal,
                                          " has bits other than permissions (07777)"));
  }
  size_t slash = path.rfind('/');
  std::string dir = slash == std::string::npos ? "." : (slash == 0 ? "/" : path.substr(0, slash));
  std::string base = slash == std::string::npos ? path : path.substr(slash + 1);
  if (base.empty()) {
    return absl::InvalidArgumentError(Cat("file '", path, "': not a file name"));
  }
  std::string tmp = Cat(dir, "/.", base, ".tmp.XXXXXX");
  int fd = ::mkostemp(tmp.data(), O_CLOEXEC);
  if (fd < 0) return ErrnoError(errno, "cannot create a temporary file beside it", path);
  auto fail = [&](int err, std::string_view what) {
    ::close(fd);
    ::unlink(tmp.c_str());
    return ErrnoError(err, what, path);
  };
  uint64_t done = 0;
  while (done < bytes.size()) {
    size_t piece = static_cast<size_t>(std::min<uint64_t>(bytes.size() - done, kMaxPiece));
    ssize_t n = ::write(fd, bytes.data() + done, piece);
    if (n < 0) {
      if (errno == EINTR) continue;
      return fail(errno, "cannot write the temporary file");
    }
    done += static_cast<uint64_t>(n);
  }
  if (::fchmod(fd, mode) != 0) return fail(errno, "cannot chmod the temporary file");
  if (::fsync(fd) != 0) return fail(errno, "cannot fsync the temporary file");
  if (::close(fd) != 0) {
    int err = errno;
    ::unlink(tmp.c_str());
    return ErrnoError(err, "cannot close the temporary file", path);
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    int err = errno;
    ::unlink(tmp.c_str());
    return ErrnoError(err, "cannot rename the temporary file over it", path);
  }
  int dir_fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir_fd >= 0) {
    ::fsync(dir_fd);  // best effort: makes the rename durable
    ::close(dir_fd);
  }
  return absl::OkStatus();
}

}  // namespace coli::io
