// common/safetensors: strict reading and writing of safetensors files and sharded snapshots.
//
//   COLI_ASSIGN_OR_RETURN(std::unique_ptr<coli::st::Snapshot> snap,
//                         coli::st::Snapshot::Open("/models/Kimi-K3", {.extra_dirs = {"/d2"}}));
//   int64_t dims[] = {7168};
//   COLI_ASSIGN_OR_RETURN(const coli::st::TensorInfo* t,
//                         snap->Expect("language_model.model.norm.weight", DType::kBF16, dims));
//   std::vector<uint16_t> w(t->numel());
//   COLI_RETURN_IF_ERROR(snap->Read(*t, w.data()));
//
// File format (spec §2.2): 8-byte little-endian header length n, n bytes of JSON
// `{name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {str: str}}`, then
// the data region; offsets are relative to the data region (file offset = 8 + n + begin).
//
// Every header is validated in full before any of its tensors is handed out: 8-byte length
// within the file and <= 100 MiB, valid JSON without duplicate keys, known dtype,
// numel * dtype size == byte range, ranges inside the data region, no two non-empty ranges
// overlapping. A sharded snapshot is read through model.safetensors.index.json; each shard is
// opened (and its header validated against the index) on first use only, so shards nobody asks
// for (the vision shards of the real snapshot) are never opened. Corrupt input is DATA_LOSS,
// missing files NOT_FOUND, and every message names the file and, where there is one, the
// tensor.
#ifndef COLI_COMMON_SAFETENSORS_SAFETENSORS_H_
#define COLI_COMMON_SAFETENSORS_SAFETENSORS_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/io/io.h"

namespace coli::st {

enum class DType { kBF16, kF16, kF32, kF64, kU8, kI8, kI16, kI32, kI64, kF8E4M3, kF8E5M2, kBool };
// Bytes per element.
size_t DTypeSize(DType dtype);
// The safetensors spelling: "BF16", "F8_E4M3", "BOOL", ...
std::string_view DTypeName(DType dtype);
// The inverse of DTypeName; std::nullopt for anything else.
std::optional<DType> ParseDType(std::string_view name);
// "BF16 [128, 7168]" (for messages).
std::string DescribeTensor(DType dtype, std::span<const int64_t> shape);

struct TensorInfo {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  int shard;             // index into Snapshot's shard list (-1 from ParseHeader)
  uint64_t file_offset;  // absolute offset in the shard file
  uint64_t nbytes;
  // The CRC-32 the file records for these bytes (kChecksumKey); set only by a Snapshot opened
  // with verify_checksums (ApplyChecksums), and only when the file has checksums.
  std::optional<uint32_t> crc32;
  int64_t numel() const;
};

// Largest header accepted (the real Kimi K3 shards have headers of a few hundred KiB).
inline constexpr uint64_t kMaxHeaderBytes = uint64_t{100} << 20;
inline constexpr std::string_view kIndexFileName = "model.safetensors.index.json";
inline constexpr std::string_view kSingleFileName = "model.safetensors";

// ---- Parsers (pure functions on bytes; the fuzz targets call these) --------------------------

// A validated header.
struct Header {
  uint64_t header_bytes = 0;                    // n
  uint64_t data_offset = 0;                     // 8 + n: where the data region starts
  std::vector<TensorInfo> tensors;              // sorted by file_offset, then name; shard = -1
  std::map<std::string, std::string> metadata;  // "__metadata__"
};

// Reads the 8-byte little-endian header length from `prefix` (at least 8 bytes) and checks it
// against `file_size` and kMaxHeaderBytes. `file_name` only labels errors.
absl::StatusOr<uint64_t> ParseHeaderLength(std::string_view prefix, uint64_t file_size,
                                           std::string_view file_name);
// Validates the JSON header (the n bytes after the length) of a file of `file_size` bytes.
absl::StatusOr<Header> ParseHeader(std::string_view header_json, uint64_t file_size,
                                   std::string_view file_name);
// Both of the above on a whole file held in memory (tests and the fuzzer).
absl::StatusOr<Header> ParseFileBytes(std::string_view file_bytes, std::string_view file_name);

// A validated model.safetensors.index.json.
struct Index {
  std::map<std::string, std::string> weight_map;  // tensor name -> shard file name
  std::vector<std::string> shards;                // distinct shard file names, sorted
  std::optional<uint64_t> total_size;             // metadata.total_size when present
};
// Shard names must be plain file names (no '/', not "." or ".."); a tensor may be named only
// once (a duplicate key is refused, so a name cannot map to two shards).
absl::StatusOr<Index> ParseIndex(std::string_view json, std::string_view file_name);

// ---- Reading ----------------------------------------------------------------------------------

// K3_DIRS: extra folders where shards named by the index may live (several drives, no
// duplication). A shard found in two places is refused at Open; one found nowhere is an error
// when it is first needed.
// verify_checksums: a shard with per-tensor checksums (kChecksumKey) has every Read checked
// against them (DATA_LOSS naming the file, the tensor and both CRCs on a mismatch); a shard
// without them reads as before.
struct SnapshotOptions {
  std::vector<std::string> extra_dirs;
  bool verify_checksums = false;
};

// Thread-safe: all members may be called concurrently; returned TensorInfo pointers stay
// valid for the Snapshot's lifetime.
class Snapshot {
 public:
  // `path` is a .safetensors file, a model.safetensors.index.json, or a folder with
  // model.safetensors.index.json (or one model.safetensors). A single file is validated at
  // once; shards of an index are opened (and their headers validated) on first use only.
  static absl::StatusOr<std::unique_ptr<Snapshot>> Open(const std::string& path,
                                                        SnapshotOptions options = {});
  ~Snapshot();

  // nullptr when the name is absent (answered from the index; no shard is opened for it).
  // Opens the tensor's shard if needed; its errors name the tensor and the file.
  absl::StatusOr<const TensorInfo*> Find(std::string_view name);
  // Like Find, but NOT_FOUND naming the tensor when absent.
  absl::StatusOr<const TensorInfo*> Get(std::string_view name);
  // Get, then DATA_LOSS unless dtype and shape match:
  // "tensor 'x': expected F32 [128], got BF16 [96] (file '...')".
  absl::StatusOr<const TensorInfo*> Expect(std::string_view name, DType dtype,
                                           std::span<const int64_t> shape);
  // From the index alone (no shard is opened).
  bool Contains(std::string_view name) const;
  // Every tensor name, sorted (from the index alone).
  std::vector<std::string> Names() const;
  // The shard file name that holds `name` per the index ("" when absent).
  std::string ShardNameOf(std::string_view name) const;

  // Reads all bytes of the tensor with pread into dst (info.nbytes bytes), checked against
  // info.crc32 when it has one (SnapshotOptions::verify_checksums).
  absl::Status Read(const TensorInfo& info, void* dst);
  // Reads the tensor in pieces only to check it against info.crc32 (OK when it has none): for
  // tensors used by parts, never read whole (an embedding read row by row).
  absl::Status VerifyTensor(const TensorInfo& info);
  bool verifies_checksums() const { return verify_checksums_; }
  // BF16 / F16 / F32 converted to f32; INVALID_ARGUMENT for other dtypes.
  absl::StatusOr<std::vector<float>> ReadAsF32(const TensorInfo& info);

  // If the tensors are back-to-back in one shard in the given order, their joint range;
  // std::nullopt otherwise. INVALID_ARGUMENT for an empty list or a null entry.
  struct Range {
    int shard;
    uint64_t file_offset;
    uint64_t nbytes;
  };
  absl::StatusOr<std::optional<Range>> ContiguousRange(std::span<const TensorInfo* const> tensors);

  int num_shards() const { return static_cast<int>(shards_.size()); }
  // Where the shard lives (the folder it was found in; the main folder when missing).
  const std::string& ShardPath(int shard) const;
  // The opened shard file (opens and validates it on first use).
  absl::StatusOr<const io::File*> ShardFile(int shard);
  // Whether the shard has been opened (tests check that unused shards stay closed).
  bool IsShardOpen(int shard) const;
  // The shard's "__metadata__" (opens and validates it on first use).
  absl::StatusOr<std::map<std::string, std::string>> ShardMetadata(int shard);

 private:
  struct Shard;
  Snapshot();
  absl::Status OpenShardLocked(int shard);
  absl::StatusOr<const TensorInfo*> FindLocked(std::string_view name);

  std::string index_path_;  // "" for a single file
  bool verify_checksums_ = false;
  std::vector<std::unique_ptr<Shard>> shards_;
  std::unordered_map<std::string, int> shard_of_;               // tensor name -> shard
  std::unordered_map<std::string, const TensorInfo*> tensors_;  // of the opened shards
  mutable std::mutex mu_;
};

// ---- Writing ----------------------------------------------------------------------------------

// Writes spec-valid files: tensors laid out back-to-back in Add order, header JSON padded
// with spaces to a multiple of 8 bytes, written atomically (temp file + fsync + rename).
class Writer {
 public:
  void SetMetadata(std::map<std::string, std::string> metadata);
  // INVALID_ARGUMENT for an empty, reserved ("__metadata__") or repeated name, a negative
  // dimension, or bytes.size() != numel * dtype size.
  absl::Status Add(std::string name, DType dtype, std::vector<int64_t> shape, std::string bytes);
  // The whole file as bytes (what Write stores).
  absl::StatusOr<std::string> Serialize() const;
  absl::Status Write(const std::string& path) const;

 private:
  struct Entry {
    std::string name;
    DType dtype;
    std::vector<int64_t> shape;
    std::string bytes;
  };
  std::map<std::string, std::string> metadata_;
  std::vector<Entry> entries_;
};

// A header entry of a file being written.
struct PlannedTensor {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
};

// The header JSON of a file whose tensors lie back to back in `tensors` order, padded with
// spaces so 8 + its length is a multiple of 8, and each tensor's byte range inside the data
// region. INVALID_ARGUMENT for an empty, reserved or repeated name or an invalid shape.
struct PlannedHeader {
  std::string json;                                   // padded
  std::vector<std::pair<uint64_t, uint64_t>> ranges;  // [begin, end) in the data region
  uint64_t data_bytes = 0;
};
absl::StatusOr<PlannedHeader> PlanHeader(std::span<const PlannedTensor> tensors,
                                         const std::map<std::string, std::string>& metadata);

// Writes a spec-valid file whose header is fixed up front and whose tensor bytes arrive in any
// order (a converter that reads its source in one sequential pass and writes each tensor where
// the header puts it). The file at `path` is created or truncated; nothing is renamed: the
// caller writes to a temporary name and renames after Finish. Not thread-safe.
//
//   COLI_ASSIGN_OR_RETURN(auto w, PlannedWriter::Create(tmp, tensors, {}));
//   COLI_RETURN_IF_ERROR(w->WriteAt(0, 0, bytes));  // tensor 0, from its first byte
//   COLI_RETURN_IF_ERROR(w->Finish());              // every byte written? fsync, close
class PlannedWriter {
 public:
  // With `checksums`, Finish stores each tensor's CRC-32 in __metadata__[kChecksumKey] (the
  // header reserves its place up front, so the layout does not depend on the bytes).
  static absl::StatusOr<std::unique_ptr<PlannedWriter>> Create(
      const std::string& path, std::vector<PlannedTensor> tensors,
      const std::map<std::string, std::string>& metadata = {}, bool checksums = false);
  ~PlannedWriter();
  PlannedWriter(const PlannedWriter&) = delete;
  PlannedWriter& operator=(const PlannedWriter&) = delete;

  // Writes `bytes` at byte `offset` of tensor `index`'s range (INVALID_ARGUMENT outside it).
  absl::Status WriteAt(size_t index, uint64_t offset, std::string_view bytes);
  // FAILED_PRECONDITION naming the first tensor whose byte count written differs from its
  // size (a hole); otherwise fsyncs and closes the file.
  absl::Status Finish();

  size_t num_tensors() const { return tensors_.size(); }
  const PlannedTensor& tensor(size_t index) const { return tensors_[index]; }
  uint64_t tensor_bytes(size_t index) const;
  uint64_t data_bytes() const { return header_.data_bytes; }

 private:
  PlannedWriter() = default;
  std::string path_;
  int fd_ = -1;
  std::vector<PlannedTensor> tensors_;
  PlannedHeader header_;
  std::vector<uint64_t> written_;
  // Checksums: where the reserved hex digits sit in the file (0 = none), and per tensor the CRC
  // of the bytes written in order so far (a tensor written out of order is read back).
  uint64_t checksum_at_ = 0;
  std::vector<uint32_t> crc_;
  std::vector<uint64_t> crc_bytes_;
};

// Per-tensor checksums of a safetensors file (coli's extension, in its __metadata__, which the
// format leaves to the writer): zlib's CRC-32 of each tensor's bytes, 8 lowercase hex digits per
// tensor, in data-offset order. k3-repack's shards carry it, so a damaged container can be found
// without the source it was made from.
inline constexpr std::string_view kChecksumKey = "coli.crc32";
// Re-reads every tensor of the file at `path` and compares it with its stored checksum:
// DATA_LOSS naming the first tensor that differs (or a file cut short), NOT_FOUND when the file
// has no checksums (written by another tool or an older k3-repack). Returns the bytes checked.
absl::StatusOr<uint64_t> VerifyChecksums(const std::string& path);
// Sets every tensor's crc32 from header->metadata[kChecksumKey] (nothing when the key is
// absent); DATA_LOSS naming the file when the digits do not fit its tensors (count, hex).
absl::Status ApplyChecksums(Header* header, std::string_view file_name);
// OK when info.nbytes `bytes` have the CRC-32 info.crc32 (or info has none). Otherwise
// DATA_LOSS: "file 'F': tensor 'T' (N bytes at offset O) has CRC-32 x, the file recorded y: its
// bytes changed after they were written".
absl::Status CheckTensorBytes(const TensorInfo& info, std::string_view file_name,
                              const void* bytes);
// The message of that DATA_LOSS for a CRC `found` (shared by the readers that checksum in
// pieces).
absl::Status ChecksumMismatch(const TensorInfo& info, std::string_view file_name, uint32_t found);

// A read-only shared mapping of a whole file (MAP_SHARED, PROT_READ): its pages stay clean,
// file-backed and reclaimable (K3_MMAP). An empty file maps to data() == nullptr.
class SharedMapping {
 public:
  static absl::StatusOr<std::unique_ptr<SharedMapping>> Map(const std::string& path);
  ~SharedMapping();
  SharedMapping(const SharedMapping&) = delete;
  SharedMapping& operator=(const SharedMapping&) = delete;
  const std::string& path() const { return path_; }
  const uint8_t* data() const { return data_; }
  uint64_t size() const { return size_; }

  // DATA_LOSS when the file at path() is no longer the one mapped, as it was: removed, replaced,
  // another size or modified. A truncated mapped file raises SIGBUS on the next touch of a page
  // past its new end, and one written in place changes the mapped bytes, so users of the
  // mapping check this before each use (a stat; a change during a use is not caught).
  absl::Status CheckUnchanged() const;

 private:
  struct Identity {
    uint64_t device = 0, inode = 0, size = 0;
    int64_t mtime_sec = 0, mtime_nsec = 0;
  };
  SharedMapping(std::string path, const uint8_t* data, uint64_t size, Identity identity)
      : path_(std::move(path)), data_(data), size_(size), identity_(identity) {}
  std::string path_;
  const uint8_t* data_;
  uint64_t size_;
  Identity identity_;
};

// Writes a model.safetensors.index.json (atomically) for the given weight map.
absl::Status WriteIndex(const std::string& path,
                        const std::map<std::string, std::string>& weight_map, uint64_t total_size);

}  // namespace coli::st

#endif  // COLI_COMMON_SAFETENSORS_SAFETENSORS_H_
