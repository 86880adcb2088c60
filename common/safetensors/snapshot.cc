// Snapshot: one safetensors file or a sharded snapshot with lazily opened shards.
#include <sys/stat.h>

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/io/cat.h"
#include "common/io/io.h"
#include "common/safetensors/crc32.h"
#include "common/safetensors/safetensors.h"
#include "common/status/status.h"

namespace coli::st {

using ::coli::internal_cat::Cat;

struct Snapshot::Shard {
  std::string name;     // file name as the index spells it
  std::string path;     // where it was found (main folder when missing)
  std::string missing;  // non-empty: why it cannot be opened (not found anywhere)
  bool opened = false;  // open attempted; `status` holds the outcome
  absl::Status status;
  std::unique_ptr<io::File> file;
  std::vector<std::unique_ptr<TensorInfo>> tensors;
  std::map<std::string, std::string> metadata;
};

namespace {

enum class PathKind { kMissing, kFile, kDirectory, kOther };

PathKind Stat(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) {
    // A dangling symlink is there (its open names the missing target), not missing.
    return ::lstat(path.c_str(), &st) == 0 ? PathKind::kOther : PathKind::kMissing;
  }
  if (S_ISREG(st.st_mode)) return PathKind::kFile;
  if (S_ISDIR(st.st_mode)) return PathKind::kDirectory;
  return PathKind::kOther;
}

std::string JoinPath(const std::string& dir, std::string_view name) {
  if (dir.empty()) return std::string(name);
  if (dir.back() == '/') return Cat(dir, name);
  return Cat(dir, "/", name);
}

std::string DirName(const std::string& path) {
  size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

// Canonical form of a folder, so the same folder listed twice is not counted twice.
std::string Canonical(const std::string& dir) {
  char buf[PATH_MAX];
  if (::realpath(dir.c_str(), buf) != nullptr) return buf;
  return dir;
}

bool EndsWith(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

uint16_t LoadU16(const uint8_t* p) { return static_cast<uint16_t>(p[0] | (p[1] << 8)); }

float BitsToF32(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

float Bf16ToF32(uint16_t bits) { return BitsToF32(static_cast<uint32_t>(bits) << 16); }

// IEEE half -> float, exact (normals, subnormals, zeros, inf, NaN).
float F16ToF32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exponent = (h >> 10) & 0x1fu;
  uint32_t mantissa = h & 0x3ffu;
  if (exponent == 0x1f) return BitsToF32(sign | 0x7f800000u | (mantissa << 13));
  if (exponent == 0) {
    if (mantissa == 0) return BitsToF32(sign);
    // Subnormal: normalize.
    int shift = 0;
    while ((mantissa & 0x400u) == 0) {
      mantissa <<= 1;
      ++shift;
    }
    mantissa &= 0x3ffu;
    exponent = static_cast<uint32_t>(1 - shift);
    return BitsToF32(sign | ((exponent + 112) << 23) | (mantissa << 13));
  }
  return BitsToF32(sign | ((exponent + 112) << 23) | (mantissa << 13));
}

}  // namespace

Snapshot::Snapshot() = default;
Snapshot::~Snapshot() = default;

absl::StatusOr<std::unique_ptr<Snapshot>> Snapshot::Open(const std::string& path,
                                                         SnapshotOptions options) {
  std::unique_ptr<Snapshot> snap(new Snapshot());
  snap->verify_checksums_ = options.verify_checksums;
  std::string index_path;
  std::string single_path;
  switch (Stat(path)) {
    case PathKind::kMissing:
      return absl::NotFoundError(Cat("snapshot '", path, "': no such file or folder"));
    case PathKind::kDirectory: {
      std::string candidate = JoinPath(path, kIndexFileName);
      if (Stat(candidate) != PathKind::kMissing) {
        index_path = candidate;
      } else if (Stat(JoinPath(path, kSingleFileName)) != PathKind::kMissing) {
        single_path = JoinPath(path, kSingleFileName);
      } else {
        return absl::NotFoundError(Cat("snapshot folder '", path, "' has neither ", kIndexFileName,
                                       " nor ", kSingleFileName));
      }
      break;
    }
    default:
      if (EndsWith(path, ".json")) {
        index_path = path;
      } else {
        single_path = path;
      }
  }

  if (!single_path.empty()) {
    auto shard = std::make_unique<Shard>();
    size_t slash = single_path.rfind('/');
    shard->name = slash == std::string::npos ? single_path : single_path.substr(slash + 1);
    shard->path = single_path;
    snap->shards_.push_back(std::move(shard));
    std::lock_guard<std::mutex> lock(snap->mu_);
    COLI_RETURN_IF_ERROR(snap->OpenShardLocked(0));
    for (const auto& t : snap->shards_[0]->tensors) snap->shard_of_.emplace(t->name, 0);
    return snap;
  }

  // Sharded snapshot.
  snap->index_path_ = index_path;
  COLI_ASSIGN_OR_RETURN(std::string text, io::ReadFileToString(index_path, kMaxHeaderBytes));
  COLI_ASSIGN_OR_RETURN(Index index, ParseIndex(text, index_path));
  std::vector<std::string> dirs = {DirName(index_path)};
  std::set<std::string> seen = {Canonical(dirs[0])};
  for (const std::string& d : options.extra_dirs) {
    if (d.empty()) continue;
    if (Stat(d) != PathKind::kDirectory) {
      return absl::NotFoundError(Cat("extra shard folder '", d, "' is not a folder"));
    }
    if (seen.insert(Canonical(d)).second) dirs.push_back(d);
  }
  std::unordered_map<std::string, int> shard_ids;
  for (const std::string& name : index.shards) {
    auto shard = std::make_unique<Shard>();
    shard->name = name;
    std::vector<std::string> found;
    for (const std::string& d : dirs) {
      std::string candidate = JoinPath(d, name);
      if (Stat(candidate) != PathKind::kMissing) found.push_back(candidate);
    }
    if (found.size() > 1) {
      return absl::FailedPreconditionError(
          Cat("shard '", name, "' named by '", index_path, "' is in more than one folder: ",
              absl::StrJoin(found, ", "), " (each shard must live in exactly one folder)"));
    }
    if (found.empty()) {
      shard->path = JoinPath(dirs[0], name);
      shard->missing = absl::StrJoin(dirs, ", ");
    } else {
      shard->path = found[0];
    }
    shard_ids.emplace(name, static_cast<int>(snap->shards_.size()));
    snap->shards_.push_back(std::move(shard));
  }
  for (const auto& [tensor, shard] : index.weight_map) {
    snap->shard_of_.emplace(tensor, shard_ids.at(shard));
  }
  return snap;
}

absl::Status Snapshot::OpenShardLocked(int id) {
  Shard& shard = *shards_[static_cast<size_t>(id)];
  if (shard.opened) return shard.status;
  shard.opened = true;
  auto open = [&]() -> absl::Status {
    if (!shard.missing.empty()) {
      return absl::NotFoundError(Cat("shard '", shard.name, "' named by '", index_path_,
                                     "' is missing (looked in: ", shard.missing, ")"));
    }
    COLI_ASSIGN_OR_RETURN(std::unique_ptr<io::File> file, io::File::Open(shard.path));
    const uint64_t size = file->size();
    char prefix[8] = {};
    if (size >= 8) COLI_RETURN_IF_ERROR(file->ReadAt(0, 8, prefix));
    COLI_ASSIGN_OR_RETURN(uint64_t n, ParseHeaderLength(std::string_view(prefix, size >= 8 ? 8 : 0),
                                                        size, shard.path));
    std::string header_json(n, '\0');
    COLI_RETURN_IF_ERROR(file->ReadAt(8, n, header_json.data()));
    COLI_ASSIGN_OR_RETURN(Header header, ParseHeader(header_json, size, shard.path));
    if (verify_checksums_) COLI_RETURN_IF_ERROR(ApplyChecksums(&header, shard.path));

    // Cross-check against the index: every tensor of this shard is mapped here, and every
    // name the index maps here is in the header.
    std::set<std::string_view> in_header;
    if (!index_path_.empty()) {
      for (const TensorInfo& t : header.tensors) {
        in_header.insert(t.name);
        auto it = shard_of_.find(t.name);
        if (it == shard_of_.end()) {
          return absl::DataLossError(Cat("file '", shard.path, "': tensor '", t.name,
                                         "' is not listed in '", index_path_, "'"));
        }
        if (it->second != id) {
          return absl::DataLossError(Cat("file '", shard.path, "': tensor '", t.name,
                                         "' is also in shard '",
                                         shards_[static_cast<size_t>(it->second)]->name, "' per '",
                                         index_path_, "' (a name may appear in one shard only)"));
        }
      }
      for (const auto& [name, sid] : shard_of_) {
        if (sid == id && in_header.count(name) == 0) {
          return absl::DataLossError(Cat("tensor '", name, "': '", index_path_, "' names shard '",
                                         shard.path, "' but the shard does not hold it"));
        }
      }
    }
    for (TensorInfo& t : header.tensors) {
      t.shard = id;
      shard.tensors.push_back(std::make_unique<TensorInfo>(std::move(t)));
    }
    for (const auto& t : shard.tensors) tensors_.emplace(t->name, t.get());
    shard.metadata = std::move(header.metadata);
    shard.file = std::move(file);
    return absl::OkStatus();
  };
  shard.status = open();
  if (!shard.status.ok()) {
    shard.file.reset();
    shard.tensors.clear();
  }
  return shard.status;
}

absl::StatusOr<const TensorInfo*> Snapshot::FindLocked(std::string_view name) {
  auto it = shard_of_.find(std::string(name));
  if (it == shard_of_.end()) return nullptr;
  absl::Status opened = OpenShardLocked(it->second);
  if (!opened.ok()) return Annotate(opened, Cat("tensor '", name, "'"));
  auto t = tensors_.find(std::string(name));
  if (t == tensors_.end()) {
    // Cannot happen after a successful cross-check; reported rather than assumed.
    return absl::DataLossError(
        Cat("tensor '", name, "': not in shard '", ShardPath(it->second), "'"));
  }
  return t->second;
}

absl::StatusOr<const TensorInfo*> Snapshot::Find(std::string_view name) {
  std::lock_guard<std::mutex> lock(mu_);
  return FindLocked(name);
}

absl::StatusOr<const TensorInfo*> Snapshot::Get(std::string_view name) {
  COLI_ASSIGN_OR_RETURN(const TensorInfo* info, Find(name));
  if (info == nullptr) {
    return absl::NotFoundError(Cat("tensor '", name, "' is not in the snapshot (",
                                   index_path_.empty() ? ShardPath(0) : index_path_, ")"));
  }
  return info;
}

absl::StatusOr<const TensorInfo*> Snapshot::Expect(std::string_view name, DType dtype,
                                                   std::span<const int64_t> shape) {
  COLI_ASSIGN_OR_RETURN(const TensorInfo* info, Get(name));
  if (info->dtype != dtype ||
      !std::equal(shape.begin(), shape.end(), info->shape.begin(), info->shape.end())) {
    return absl::DataLossError(Cat("tensor '", name, "': expected ", DescribeTensor(dtype, shape),
                                   ", got ", DescribeTensor(info->dtype, info->shape), " (file '",
                                   ShardPath(info->shard), "')"));
  }
  return info;
}

bool Snapshot::Contains(std::string_view name) const {
  std::lock_guard<std::mutex> lock(mu_);
  return shard_of_.count(std::string(name)) != 0;
}

std::vector<std::string> Snapshot::Names() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::string> names;
  names.reserve(shard_of_.size());
  for (const auto& [name, shard] : shard_of_) names.push_back(name);
  std::sort(names.begin(), names.end());
  return names;
}

std::string Snapshot::ShardNameOf(std::string_view name) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = shard_of_.find(std::string(name));
  return it == shard_of_.end() ? std::string() : shards_[static_cast<size_t>(it->second)]->name;
}

const std::string& Snapshot::ShardPath(int shard) const {
  static const std::string kNone;
  if (shard < 0 || shard >= num_shards()) return kNone;
  return shards_[static_cast<size_t>(shard)]->path;
}

absl::StatusOr<const io::File*> Snapshot::ShardFile(int shard) {
  if (shard < 0 || shard >= num_shards()) {
    return absl::InvalidArgumentError(
        Cat("shard ", shard, " out of range (snapshot has ", num_shards(), ")"));
  }
  std::lock_guard<std::mutex> lock(mu_);
  COLI_RETURN_IF_ERROR(OpenShardLocked(shard));
  return static_cast<const io::File*>(shards_[static_cast<size_t>(shard)]->file.get());
}

absl::StatusOr<std::map<std::string, std::string>> Snapshot::ShardMetadata(int shard) {
  COLI_RETURN_IF_ERROR(ShardFile(shard).status());
  std::lock_guard<std::mutex> lock(mu_);
  return shards_[static_cast<size_t>(shard)]->metadata;
}

bool Snapshot::IsShardOpen(int shard) const {
  if (shard < 0 || shard >= num_shards()) return false;
  std::lock_guard<std::mutex> lock(mu_);
  return shards_[static_cast<size_t>(shard)]->file != nullptr;
}

absl::Status Snapshot::Read(const TensorInfo& info, void* dst) {
  COLI_ASSIGN_OR_RETURN(const io::File* file, ShardFile(info.shard));
  COLI_RETURN_IF_ERROR(
      Annotate(file->ReadAt(info.file_offset, info.nbytes, dst), Cat("tensor '", info.name, "'")));
  return CheckTensorBytes(info, file->path(), dst);
}

absl::Status Snapshot::VerifyTensor(const TensorInfo& info) {
  if (!info.crc32.has_value()) return absl::OkStatus();
  COLI_ASSIGN_OR_RETURN(const io::File* file, ShardFile(info.shard));
  std::string block(static_cast<size_t>(std::min<uint64_t>(info.nbytes, 8 << 20)), '\0');
  uint32_t crc = 0;
  for (uint64_t done = 0; done < info.nbytes;) {
    const uint64_t piece = std::min<uint64_t>(block.size(), info.nbytes - done);
    COLI_RETURN_IF_ERROR(Annotate(file->ReadAt(info.file_offset + done, piece, block.data()),
                                  Cat("tensor '", info.name, "'")));
    crc = Crc32(crc, std::string_view(block.data(), static_cast<size_t>(piece)));
    done += piece;
  }
  if (crc != *info.crc32) return ChecksumMismatch(info, file->path(), crc);
  return absl::OkStatus();
}

absl::StatusOr<std::vector<float>> Snapshot::ReadAsF32(const TensorInfo& info) {
  if (info.dtype != DType::kBF16 && info.dtype != DType::kF16 && info.dtype != DType::kF32) {
    return absl::InvalidArgumentError(Cat("tensor '", info.name, "': ", DTypeName(info.dtype),
                                          " cannot be read as F32 (BF16, F16, F32 only)"));
  }
  std::vector<uint8_t> raw(info.nbytes);
  COLI_RETURN_IF_ERROR(Read(info, raw.data()));
  const size_t n = static_cast<size_t>(info.numel());
  std::vector<float> out(n);
  switch (info.dtype) {
    case DType::kBF16:
      for (size_t i = 0; i < n; ++i) out[i] = Bf16ToF32(LoadU16(&raw[2 * i]));
      break;
    case DType::kF16:
      for (size_t i = 0; i < n; ++i) out[i] = F16ToF32(LoadU16(&raw[2 * i]));
      break;
    default:
      std::memcpy(out.data(), raw.data(), n * sizeof(float));  // little-endian host
  }
  return out;
}

absl::StatusOr<std::optional<Snapshot::Range>> Snapshot::ContiguousRange(
    std::span<const TensorInfo* const> tensors) {
  if (tensors.empty()) return absl::InvalidArgumentError("ContiguousRange: no tensors given");
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (tensors[i] == nullptr) {
      return absl::InvalidArgumentError(Cat("ContiguousRange: tensor ", i, " is null"));
    }
  }
  Range range{tensors[0]->shard, tensors[0]->file_offset, tensors[0]->nbytes};
  for (size_t i = 1; i < tensors.size(); ++i) {
    const TensorInfo& t = *tensors[i];
    if (t.shard != range.shard || t.file_offset != range.file_offset + range.nbytes) {
      return std::optional<Range>();
    }
    range.nbytes += t.nbytes;
  }
  return std::optional<Range>(range);
}

}  // namespace coli::st
