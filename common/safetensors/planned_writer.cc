// PlannedWriter (a file whose header is fixed first and whose bytes arrive in any order) and
// SharedMapping (a read-only MAP_SHARED view of a whole file).
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>
#include <vector>

#include "common/io/cat.h"
#include "common/safetensors/crc32.h"
#include "common/safetensors/safetensors.h"
#include "common/status/status.h"

namespace coli::st {

using ::coli::internal_cat::Cat;

namespace {

absl::Status Errno(int err, std::string_view what, std::string_view path) {
  std::string message = Cat("file '", path, "': ", what, ": ", std::strerror(err));
  // A full disk or quota is the caller's to fix (free space, another folder), not a bug.
  if (err == ENOSPC || err == EDQUOT) return absl::ResourceExhaustedError(message);
  return absl::InternalError(message);
}

absl::Status PwriteAll(int fd, const char* data, uint64_t size, uint64_t offset,
                       std::string_view path) {
  while (size > 0) {
    const size_t piece = static_cast<size_t>(std::min<uint64_t>(size, uint64_t{1} << 30));
    const ssize_t n = ::pwrite(fd, data, piece, static_cast<off_t>(offset));
    if (n < 0) {
      if (errno == EINTR) continue;
      return Errno(errno, Cat("cannot write at offset ", offset), path);
    }
    data += n;
    size -= static_cast<uint64_t>(n);
    offset += static_cast<uint64_t>(n);
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<PlannedWriter>> PlannedWriter::Create(
    const std::string& path, std::vector<PlannedTensor> tensors,
    const std::map<std::string, std::string>& metadata, bool checksums) {
  auto w = std::unique_ptr<PlannedWriter>(new PlannedWriter());
  std::map<std::string, std::string> meta = metadata;
  // A placeholder as long as the digits: Finish overwrites it in place.
  if (checksums) meta[std::string(kChecksumKey)] = std::string(8 * tensors.size(), '0');
  absl::StatusOr<PlannedHeader> header = PlanHeader(tensors, meta);
  if (!header.ok()) {
    return absl::InvalidArgumentError(Cat("file '", path, "': ", header.status().message()));
  }
  w->path_ = path;
  w->header_ = std::move(header).value();
  if (checksums) {
    const std::string key = Cat("\"", kChecksumKey, "\":\"");
    const size_t at = w->header_.json.find(key);
    if (at == std::string::npos) return absl::InternalError("checksum placeholder not in header");
    w->checksum_at_ = 8 + at + key.size();
    w->crc_.assign(tensors.size(), 0);
    w->crc_bytes_.assign(tensors.size(), 0);
  }
  w->tensors_ = std::move(tensors);
  w->written_.assign(w->tensors_.size(), 0);
  w->fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (w->fd_ < 0) return Errno(errno, "cannot create", path);
  std::string prefix(8, '\0');
  const uint64_t n = w->header_.json.size();
  for (int i = 0; i < 8; ++i) prefix[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  prefix += w->header_.json;
  COLI_RETURN_IF_ERROR(PwriteAll(w->fd_, prefix.data(), prefix.size(), 0, path));
  return w;
}

PlannedWriter::~PlannedWriter() {
  if (fd_ >= 0) ::close(fd_);
}

uint64_t PlannedWriter::tensor_bytes(size_t index) const {
  return header_.ranges[index].second - header_.ranges[index].first;
}

absl::Status PlannedWriter::WriteAt(size_t index, uint64_t offset, std::string_view bytes) {
  if (fd_ < 0) return absl::FailedPreconditionError(Cat("file '", path_, "': already finished"));
  if (index >= tensors_.size() || offset > tensor_bytes(index) ||
      bytes.size() > tensor_bytes(index) - offset) {
    return absl::InvalidArgumentError(Cat("file '", path_, "': write of ", bytes.size(),
                                          " bytes at offset ", offset, " is outside tensor ",
                                          index < tensors_.size() ? tensors_[index].name : "?"));
  }
  const uint64_t at = 8 + header_.json.size() + header_.ranges[index].first + offset;
  COLI_RETURN_IF_ERROR(PwriteAll(fd_, bytes.data(), bytes.size(), at, path_));
  written_[index] += bytes.size();
  if (checksum_at_ != 0 && offset == crc_bytes_[index]) {
    crc_[index] = Crc32(crc_[index], bytes);
    crc_bytes_[index] += bytes.size();
  }
  return absl::OkStatus();
}

absl::Status PlannedWriter::Finish() {
  if (fd_ < 0) return absl::FailedPreconditionError(Cat("file '", path_, "': already finished"));
  for (size_t i = 0; i < tensors_.size(); ++i) {
    if (written_[i] != tensor_bytes(i)) {
      return absl::FailedPreconditionError(Cat("file '", path_, "': tensor '", tensors_[i].name,
                                               "' got ", written_[i], " of ", tensor_bytes(i),
                                               " bytes"));
    }
  }
  if (checksum_at_ != 0) {
    std::string digits;
    std::vector<char> block;
    for (size_t i = 0; i < tensors_.size(); ++i) {
      if (crc_bytes_[i] != tensor_bytes(i)) {  // written out of order: read it back
        crc_[i] = 0;
        const uint64_t begin = 8 + header_.json.size() + header_.ranges[i].first;
        block.resize(static_cast<size_t>(std::min<uint64_t>(tensor_bytes(i), 8 << 20)));
        for (uint64_t done = 0; done < tensor_bytes(i);) {
          const size_t n =
              static_cast<size_t>(std::min<uint64_t>(block.size(), tensor_bytes(i) - done));
          const ssize_t got = ::pread(fd_, block.data(), n, static_cast<off_t>(begin + done));
          if (got <= 0) {
            if (got < 0 && errno == EINTR) continue;
            return Errno(got < 0 ? errno : EIO, Cat("cannot read back at offset ", begin + done),
                         path_);
          }
          crc_[i] = Crc32(crc_[i], std::string_view(block.data(), static_cast<size_t>(got)));
          done += static_cast<uint64_t>(got);
        }
      }
    }
    // Planned order is the order ParseHeader lists them in (offset, then size, then name): the
    // tensors lie back to back, so only empty ones share an offset, and their CRCs are all 0.
    for (size_t i = 0; i < tensors_.size(); ++i) digits += Crc32Hex(crc_[i]);
    COLI_RETURN_IF_ERROR(PwriteAll(fd_, digits.data(), digits.size(), checksum_at_, path_));
  }
  const int fd = std::exchange(fd_, -1);
  if (::fsync(fd) != 0) {
    const int err = errno;
    ::close(fd);
    return Errno(err, "cannot fsync", path_);
  }
  if (::close(fd) != 0) return Errno(errno, "cannot close", path_);
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<SharedMapping>> SharedMapping::Map(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return absl::NotFoundError(Cat("file '", path, "': cannot open: ", std::strerror(errno)));
  struct stat st;
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return absl::InvalidArgumentError(Cat("file '", path, "': not a regular file"));
  }
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  const uint8_t* data = nullptr;
  if (size > 0) {
    void* p = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
      const int err = errno;
      ::close(fd);
      return Errno(err, "cannot mmap", path);
    }
    data = static_cast<const uint8_t*>(p);
  }
  ::close(fd);  // the mapping stays valid without the descriptor
  const Identity identity{static_cast<uint64_t>(st.st_dev), static_cast<uint64_t>(st.st_ino), size,
                          st.st_mtim.tv_sec, st.st_mtim.tv_nsec};
  return std::unique_ptr<SharedMapping>(new SharedMapping(path, data, size, identity));
}

absl::Status SharedMapping::CheckUnchanged() const {
  struct stat now;
  if (::stat(path_.c_str(), &now) != 0) {
    return absl::DataLossError(
        Cat("mapped file '", path_, "' disappeared while running; reload the model"));
  }
  if (static_cast<uint64_t>(now.st_dev) != identity_.device ||
      static_cast<uint64_t>(now.st_ino) != identity_.inode) {
    return absl::DataLossError(
        Cat("mapped file '", path_, "' was replaced while running; reload the model"));
  }
  if (static_cast<uint64_t>(now.st_size) != identity_.size) {
    return absl::DataLossError(Cat("mapped file '", path_, "' changed size while running (",
                                   identity_.size, " -> ", now.st_size,
                                   " bytes); reload the model"));
  }
  if (now.st_mtim.tv_sec != identity_.mtime_sec || now.st_mtim.tv_nsec != identity_.mtime_nsec) {
    return absl::DataLossError(
        Cat("mapped file '", path_, "' was modified while running; reload the model"));
  }
  return absl::OkStatus();
}

SharedMapping::~SharedMapping() {
  if (data_ != nullptr) ::munmap(const_cast<uint8_t*>(data_), size_);
}

}  // namespace coli::st
