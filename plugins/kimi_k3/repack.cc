#include "plugins/kimi_k3/repack.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <climits>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <thread>
#include <tuple>

#include "common/io/cat.h"
#include "common/io/io.h"
#include "common/kernels/kernels.h"
#include "common/safetensors/safetensors.h"
#include "common/status/status.h"
#include "plugins/kimi_k3/config.h"
#include "plugins/kimi_k3/container.h"
#include "plugins/kimi_k3/weights.h"

namespace coli::k3 {
namespace {

namespace fs = std::filesystem;
using ::coli::internal_cat::Cat;
using kernels::QuantizedMatrix;
using kernels::WeightFormat;
using st::DType;

// Default bytes per piece read while copying or quantizing, and per read while verifying
// (bounded memory on 17 GB shards).
constexpr uint64_t kPieceBytes = uint64_t{32} << 20;

constexpr std::string_view kCopiedFiles[] = {"config.json", "generation_config.json",
                                             "tokenizer.json", "tokenizer_config.json",
                                             "tiktoken.model"};

std::string Join(const std::string& dir, std::string_view name) {
  return (fs::path(dir) / std::string(name)).string();
}

// An opened shard with its validated header.
struct ShardFile {
  std::unique_ptr<io::File> file;
  st::Header header;
  std::string header_bytes;  // the 8-byte length and the JSON, as in the file
};

absl::StatusOr<ShardFile> OpenShard(const std::string& path) {
  ShardFile s;
  COLI_ASSIGN_OR_RETURN(s.file, io::File::Open(path));
  if (s.file->size() < 8) {
    return absl::DataLossError(
        Cat("file '", path, "': ", s.file->size(), " bytes, too short for a safetensors header"));
  }
  std::string prefix(8, '\0');
  COLI_RETURN_IF_ERROR(s.file->ReadAt(0, 8, prefix.data()));
  COLI_ASSIGN_OR_RETURN(uint64_t n, st::ParseHeaderLength(prefix, s.file->size(), path));
  std::string json(n, '\0');
  COLI_RETURN_IF_ERROR(s.file->ReadAt(8, n, json.data()));
  COLI_ASSIGN_OR_RETURN(s.header, st::ParseHeader(json, s.file->size(), path));
  s.header_bytes = prefix + json;
  return s;
}

bool IsVision(std::string_view name) {
  return name.starts_with("vision_tower.") || name.starts_with("mm_projector.");
}

// What becomes of one source tensor.
struct Role {
  enum Kind { kPass, kQuantize, kExpert, kDrop } kind = kPass;
  int bits = 0;                               // kQuantize
  const char* flag = "";                      // kQuantize: the option that chose bits
  std::tuple<int, int, int, int> expert_key;  // kExpert: (layer, id, w, packed 0 / scale 1)
};

// Parses a non-negative decimal at name[*pos], advancing *pos.
bool ParseNumber(std::string_view name, size_t* pos, int* out) {
  size_t end = *pos;
  while (end < name.size() && name[end] >= '0' && name[end] <= '9') ++end;
  if (end == *pos || end - *pos > 9) return false;
  *out = 0;
  for (size_t i = *pos; i < end; ++i) *out = *out * 10 + (name[i] - '0');
  *pos = end;
  return true;
}

struct Bits {
  int bits, mla_bits, head_bits;
};

// Every output shard records in its "__metadata__" what it was made from: the bits and the
// source shard's size, modification time and header digest. A resumed run keeps an existing
// shard only when all of these match this run's, so one container never mixes two sources (a
// snapshot updated between runs) or two --bits; the mtime catches a re-downloaded shard whose
// tensors kept their names, shapes and offsets.
constexpr const char* kProvenanceKey = kRepackMetadataKey;  // value: the record's version
constexpr char kProvenanceVersion[] = "1";

// 64-bit FNV-1a: tells two source headers apart (not a security digest).
uint64_t Fnv1a64(std::string_view bytes) {
  uint64_t h = 14695981039346656037ull;
  for (unsigned char c : bytes) h = (h ^ c) * 1099511628211ull;
  return h;
}

absl::StatusOr<std::map<std::string, std::string>> Provenance(const std::string& src_path,
                                                              const ShardFile& src, const Bits& b) {
  struct stat st;
  if (::stat(src_path.c_str(), &st) != 0) {
    return absl::NotFoundError(Cat("cannot stat '", src_path, "': ", std::strerror(errno)));
  }
  char digest[17];
  std::snprintf(digest, sizeof(digest), "%016llx",
                static_cast<unsigned long long>(Fnv1a64(src.header_bytes)));
  const int64_t mtime_ns = int64_t{st.st_mtim.tv_sec} * 1000000000 + st.st_mtim.tv_nsec;
  return std::map<std::string, std::string>{{"format", "pt"},
                                            {kProvenanceKey, kProvenanceVersion},
                                            {"k3_repack.bits", std::to_string(b.bits)},
                                            {"k3_repack.mla_bits", std::to_string(b.mla_bits)},
                                            {"k3_repack.head_bits", std::to_string(b.head_bits)},
                                            {"k3_repack.source_size", std::to_string(st.st_size)},
                                            {"k3_repack.source_mtime_ns", std::to_string(mtime_ns)},
                                            {"k3_repack.source_header_fnv1a64", digest}};
}

// OK when the existing output shard `out_path` was made by this k3-repack from `src_path`
// (empty: the source shard is gone, so only the bits are compared) with these bits;
// FAILED_PRECONDITION saying what differs otherwise (DATA_LOSS when it is not a valid shard).
absl::Status CheckExistingOutput(const std::string& out_path, const std::string& src_path,
                                 const Bits& b) {
  const std::string remedy =
      "; remove it to convert it again (or use another output folder); nothing was written";
  absl::StatusOr<ShardFile> out = OpenShard(out_path);
  if (!out.ok()) {
    return Annotate(out.status(),
                    "existing output shard, not a valid safetensors file (remove it "
                    "to convert it again)");
  }
  const std::map<std::string, std::string>& have = out->header.metadata;
  auto it = have.find(kProvenanceKey);
  if (it == have.end() || it->second != kProvenanceVersion) {
    return absl::FailedPreconditionError(
        Cat("'", out_path, "' was not written by this k3-repack (no '", kProvenanceKey, "' ",
            kProvenanceVersion,
            " in its __metadata__: another tool, an older k3-repack or "
            "another model)",
            remedy));
  }
  std::map<std::string, std::string> want = {{"k3_repack.bits", std::to_string(b.bits)},
                                             {"k3_repack.mla_bits", std::to_string(b.mla_bits)},
                                             {"k3_repack.head_bits", std::to_string(b.head_bits)}};
  if (!src_path.empty()) {
    COLI_ASSIGN_OR_RETURN(ShardFile src, OpenShard(src_path));
    COLI_ASSIGN_OR_RETURN(want, Provenance(src_path, src, b));
  }
  std::string differences;
  for (const auto& [key, now] : want) {
    auto then = have.find(key);
    const std::string was = then == have.end() ? "(none)" : then->second;
    if (was != now) {
      differences += Cat(differences.empty() ? "" : ", ", key.substr(key.find('.') + 1), " ", was,
                         " then, ", now, " now");
    }
  }
  if (differences.empty()) return absl::OkStatus();
  return absl::FailedPreconditionError(
      Cat("'", out_path, "' was made from another source file or with other options than '",
          src_path.empty() ? std::string("this run") : src_path, "' (", differences, ")", remedy));
}

absl::StatusOr<Role> Classify(std::string_view name, const Config& cfg, const Bits& b) {
  Role r;
  if (IsVision(name)) {
    r.kind = Role::kDrop;
    return r;
  }
  std::string_view rest = name;
  if (rest.starts_with("language_model.")) rest.remove_prefix(15);
  if (rest == "lm_head.weight") {
    r.kind = Role::kQuantize;
    r.bits = b.head_bits;
    r.flag = "--head-bits";
    return r;
  }
  constexpr std::string_view kLayers = "model.layers.";
  if (!rest.starts_with(kLayers)) return r;
  size_t pos = kLayers.size();
  int layer = 0;
  if (!ParseNumber(rest, &pos, &layer) || pos >= rest.size() || rest[pos] != '.') return r;
  if (layer >= cfg.num_layers) {
    return absl::InvalidArgumentError(Cat("tensor '", name, "': layer ", layer,
                                          " but config.json has ", cfg.num_layers, " layers"));
  }
  const std::string_view t = rest.substr(pos + 1);
  auto quantize = [&](int bits, const char* flag) {
    r.kind = Role::kQuantize;
    r.bits = bits;
    r.flag = flag;
    return r;
  };
  const bool kda = cfg.is_kda[layer];
  for (std::string_view m : {"q_proj", "k_proj", "v_proj", "o_proj", "g_proj"}) {
    if (kda && t == Cat("self_attn.", m, ".weight")) return quantize(b.bits, "--bits");
  }
  for (std::string_view m :
       {"q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj", "o_proj", "g_proj"}) {
    if (!kda && t == Cat("self_attn.", m, ".weight")) return quantize(b.mla_bits, "--mla-bits");
  }
  for (std::string_view m :
       {"mlp.gate_proj", "mlp.up_proj", "mlp.down_proj", "block_sparse_moe.routed_expert_down_proj",
        "block_sparse_moe.routed_expert_up_proj", "block_sparse_moe.shared_experts.gate_proj",
        "block_sparse_moe.shared_experts.up_proj", "block_sparse_moe.shared_experts.down_proj"}) {
    if (t == Cat(m, ".weight")) return quantize(b.bits, "--bits");
  }
  constexpr std::string_view kExperts = "block_sparse_moe.experts.";
  if (t.starts_with(kExperts)) {
    size_t p = kExperts.size();
    int id = 0;
    if (!ParseNumber(t, &p, &id)) return r;
    static constexpr std::string_view kTails[] = {".w1.weight_packed", ".w1.weight_scale",
                                                  ".w2.weight_packed", ".w2.weight_scale",
                                                  ".w3.weight_packed", ".w3.weight_scale"};
    for (int k = 0; k < 6; ++k) {
      if (t.substr(p) == kTails[k]) {
        r.kind = Role::kExpert;
        r.expert_key = {layer, id, k / 2, k % 2};
        return r;
      }
    }
  }
  return r;
}

// One output tensor and where its bytes come from.
struct OutTensor {
  st::PlannedTensor planned;
  size_t source = 0;  // index into the source header's tensors
  enum Part { kCopy, kData, kScales } part = kCopy;
  bool expert = false;
  std::tuple<int, int, int, int> expert_key;
};

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// One piece of the pipeline: a byte range of one source tensor, at most piece_bytes (a whole
// number of rows when the tensor is quantized: both formats are per row).
struct Piece {
  size_t source = 0;    // index into the source header's tensors
  uint64_t offset = 0;  // byte offset inside the source tensor
  uint64_t length = 0;
};

// `n` persistent helper threads for the quantizer: Run(parts, fn) calls fn(k) once for every k
// in [0, parts), the caller and the helpers each taking the next k until none is left, and
// returns when all have returned. Taking parts as they come (rather than one fixed share per
// thread) keeps a thread that the reader, the writer or another process preempts from holding
// up the piece. Persistent rather than one thread per piece: each helper's quantized blocks go
// back to the malloc arena it allocates the next ones from. The destructor joins the helpers.
class Helpers {
 public:
  explicit Helpers(int n) {
    for (int k = 0; k < n; ++k) threads_.emplace_back([this] { Loop(); });
  }
  ~Helpers() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    start_.notify_all();
    for (std::thread& t : threads_) t.join();
  }
  Helpers(const Helpers&) = delete;
  Helpers& operator=(const Helpers&) = delete;

  void Run(int parts, const std::function<void(int)>& fn) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      fn_ = &fn;
      parts_ = parts;
      next_.store(0);
      running_ = static_cast<int>(threads_.size());
      ++generation_;
    }
    start_.notify_all();
    Drain(parts, fn);
    std::unique_lock<std::mutex> lock(mu_);
    done_.wait(lock, [&] { return running_ == 0; });
    fn_ = nullptr;
  }

 private:
  void Drain(int parts, const std::function<void(int)>& fn) {
    for (int k; (k = next_.fetch_add(1)) < parts;) fn(k);
  }

  void Loop() {
    uint64_t seen = 0;
    for (;;) {
      const std::function<void(int)>* fn = nullptr;
      int parts = 0;
      {
        std::unique_lock<std::mutex> lock(mu_);
        start_.wait(lock, [&] { return stop_ || generation_ != seen; });
        if (stop_) return;
        seen = generation_;
        fn = fn_;
        parts = parts_;
      }
      Drain(parts, *fn);
      std::lock_guard<std::mutex> lock(mu_);
      if (--running_ == 0) done_.notify_one();
    }
  }

  std::vector<std::thread> threads_;
  std::mutex mu_;
  std::condition_variable start_, done_;
  bool stop_ = false;                             // guarded by mu_
  uint64_t generation_ = 0;                       // guarded by mu_: one per Run
  int parts_ = 0, running_ = 0;                   // guarded by mu_
  std::atomic<int> next_{0};                      // the next part to take
  const std::function<void(int)>* fn_ = nullptr;  // guarded by mu_
};

// The bounded read → quantize → write pipeline of one shard. Piece i lives in slot i % n from
// the moment the reader starts reading it until the writer has written it, so at most n pieces
// are in flight (n = RepackOptions::in_flight) and memory stays at n × (piece_bytes + its
// quantized bytes) + the helpers' transient blocks (≈ (1.5 n + 0.5) × piece_bytes for int8)
// whatever the shard size. Three roles, each walking the pieces in order:
//   reader (own thread): waits for a free slot, reads the piece into it (O_DIRECT or pread);
//   quantizer (the calling thread + threads-1 Helpers): BF16 rows → QuantizedMatrix in row
//     parts (rows are independent: the split does not change the bytes); copies pass through;
//   writer (own thread): pwrites the piece where the planned header puts it, frees the slot.
// The bytes written are the same for any n and any thread count. The first error of any role
// stops all three (the others see it at their next wait); Run joins both threads before it
// returns that error.
class ShardPipeline {
 public:
  struct Output {  // where one source tensor's bytes go: [copy or data, scales]
    std::array<size_t, 2> index{SIZE_MAX, SIZE_MAX};
    std::optional<WeightFormat> format;  // set: quantized
  };

  ShardPipeline(const io::DirectReader& src, const std::vector<st::TensorInfo>& in,
                const std::vector<Output>& out, std::vector<Piece> pieces, int in_flight,
                int threads, st::PlannedWriter& w)
      : src_(src),
        in_(in),
        out_(out),
        pieces_(std::move(pieces)),
        threads_(std::max(threads, 1)),
        w_(w),
        slots_(static_cast<size_t>(std::max(in_flight, 1))) {}

  // Seconds each role was busy (not waiting for another): read, quantize, write.
  struct Seconds {
    double read = 0, quantize = 0, write = 0;
  };

  // Runs the pipeline to the end or the first error; *seconds gets the busy times.
  absl::Status Run(Seconds* seconds) {
    std::thread reader([this] {
      Walk(State::kFree, State::kRead, &seconds_.read,
           [this](const Piece& p, Slot& slot) { return Read(p, slot); });
    });
    std::thread writer([this] {
      Walk(State::kReady, State::kFree, &seconds_.write,
           [this](const Piece& p, Slot& slot) { return Write(p, slot); });
    });
    {
      Helpers helpers(threads_ - 1);  // the quantizer runs on this thread
      Walk(State::kRead, State::kReady, &seconds_.quantize,
           [&](const Piece& p, Slot& slot) { return Quantize(p, slot, helpers); });
    }
    reader.join();
    writer.join();
    *seconds = seconds_;
    std::lock_guard<std::mutex> lock(mu_);
    return error_;
  }

 private:
  enum class State { kFree, kRead, kReady };
  struct Slot {
    State state = State::kFree;
    io::AlignedBuffer buffer;
    const uint8_t* bytes = nullptr;  // the piece's bytes inside buffer
    io::AlignedBuffer data, scales;  // quantized: the piece's rows, data and scales
  };

  Slot& SlotOf(size_t piece) { return slots_[piece % slots_.size()]; }

  // Waits until piece's slot is in state `want`; false once any role has failed.
  bool Wait(size_t piece, State want) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return !error_.ok() || SlotOf(piece).state == want; });
    return error_.ok();
  }
  void Set(size_t piece, State state) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      SlotOf(piece).state = state;
    }
    cv_.notify_all();
  }
  void Fail(const absl::Status& status) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (error_.ok()) error_ = status;
    }
    cv_.notify_all();
  }

  std::string Where(const Piece& p) const {
    return Cat("tensor '", in_[p.source].name, "' (bytes ", p.offset, "..", p.offset + p.length,
               ")");
  }

  // One role: for each piece in order, waits until its slot is `from`, runs `step` on it and
  // hands it on as `to`, adding the time spent in `step` to *busy. The first error stops every
  // role.
  void Walk(State from, State to, double* busy,
            const std::function<absl::Status(const Piece&, Slot&)>& step) {
    for (size_t i = 0; i < pieces_.size(); ++i) {
      if (!Wait(i, from)) return;
      const double t0 = Now();
      if (absl::Status s = step(pieces_[i], SlotOf(i)); !s.ok()) return Fail(s);
      *busy += Now() - t0;
      Set(i, to);
    }
  }

  absl::Status Read(const Piece& p, Slot& slot) {
    absl::StatusOr<const uint8_t*> bytes =
        src_.ReadInto(in_[p.source].file_offset + p.offset, p.length, &slot.buffer);
    if (!bytes.ok()) return Annotate(bytes.status(), Where(p));
    slot.bytes = *bytes;
    if (out_[p.source].format && reinterpret_cast<uintptr_t>(slot.bytes) % 2 != 0) {
      // BF16 rows at an odd file offset: move them to the (4 KiB-aligned) buffer start.
      std::memmove(slot.buffer.data(), slot.bytes, p.length);
      slot.bytes = slot.buffer.data();
    }
    return absl::OkStatus();
  }

  // Quantizes the piece's rows into slot.data / slot.scales (copies pass through untouched).
  absl::Status Quantize(const Piece& p, Slot& slot, Helpers& helpers) {
    const std::optional<WeightFormat> f = out_[p.source].format;
    if (!f) return absl::OkStatus();
    const int64_t cols = in_[p.source].shape[1];
    const int64_t n = static_cast<int64_t>(p.length / 2) / cols;
    const kernels::MatrixBytes per_row = kernels::FormatBytes(*f, 1, cols);
    const auto* raw = reinterpret_cast<const uint16_t*>(slot.bytes);
    // A few parts per thread (taken as they come): rows are independent, so the split does not
    // change the bytes.
    const int parts = static_cast<int>(std::min<int64_t>(4 * threads_, n));
    slot.data.Reserve(static_cast<size_t>(n) * per_row.data);
    slot.scales.Reserve(static_cast<size_t>(n) * per_row.scales);
    std::vector<absl::Status> status(parts);
    helpers.Run(parts, [&](int k) {
      const int64_t a = n * k / parts, b = n * (k + 1) / parts;
      absl::StatusOr<QuantizedMatrix> q =
          QuantizedMatrix::FromBf16(raw + a * cols, b - a, cols, *f);
      if (!q.ok()) {
        status[k] = q.status();
        return;
      }
      // Copied into the slot and freed here, on the thread that allocated it: the next piece's
      // block reuses the same memory (handing blocks to the writer thread instead let the heap
      // grow by ~5 MB/s).
      std::memcpy(slot.data.data() + a * per_row.data, q->data().data(), q->data().size());
      std::memcpy(slot.scales.data() + a * per_row.scales, q->scales().data(), q->scales().size());
    });
    for (int k = 0; k < parts; ++k) {
      if (!status[k].ok()) {
        const int64_t row = static_cast<int64_t>(p.offset / 2) / cols + n * k / parts;
        return Annotate(status[k], Cat("tensor '", in_[p.source].name, "' (rows from ", row,
                                       ") in '", src_.path(), "'"));
      }
    }
    return absl::OkStatus();
  }

  absl::Status Write(const Piece& p, Slot& slot) {
    const Output& o = out_[p.source];
    absl::Status s;
    if (o.format) {
      const int64_t cols = in_[p.source].shape[1];
      const kernels::MatrixBytes per_row = kernels::FormatBytes(*o.format, 1, cols);
      const uint64_t row = p.offset / 2 / cols, rows = p.length / 2 / cols;
      s.Update(w_.WriteAt(
          o.index[0], row * per_row.data,
          std::string_view(reinterpret_cast<const char*>(slot.data.data()), rows * per_row.data)));
      if (s.ok()) {
        s.Update(w_.WriteAt(o.index[1], row * per_row.scales,
                            std::string_view(reinterpret_cast<const char*>(slot.scales.data()),
                                             rows * per_row.scales)));
      }
    } else {
      s = w_.WriteAt(o.index[0], p.offset,
                     std::string_view(reinterpret_cast<const char*>(slot.bytes), p.length));
    }
    return Annotate(s, Where(p));
  }

  const io::DirectReader& src_;
  const std::vector<st::TensorInfo>& in_;
  const std::vector<Output>& out_;
  const std::vector<Piece> pieces_;
  const int threads_;
  st::PlannedWriter& w_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Slot> slots_;  // states guarded by mu_; contents owned by the role holding them
  absl::Status error_;       // guarded by mu_: the first failure
  Seconds seconds_;          // each field written by its own role only
};

// Cuts every kept source tensor into pieces of at most piece_bytes, in file order (quantized
// tensors at whole rows; at least one row).
std::vector<Piece> CutPieces(const std::vector<st::TensorInfo>& in,
                             const std::vector<ShardPipeline::Output>& out, uint64_t piece_bytes) {
  std::vector<Piece> pieces;
  for (size_t i = 0; i < in.size(); ++i) {
    if (out[i].index[0] == SIZE_MAX) continue;  // dropped
    const st::TensorInfo& t = in[i];
    uint64_t step = piece_bytes;
    if (out[i].format) {
      const uint64_t row = 2 * static_cast<uint64_t>(t.shape[1]);
      step = std::max<uint64_t>(1, piece_bytes / row) * row;
    }
    for (uint64_t off = 0; off < t.nbytes; off += step) {
      pieces.push_back({i, off, std::min(step, t.nbytes - off)});
    }
  }
  return pieces;
}

void FsyncDir(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd >= 0) {
    ::fsync(fd);  // best effort: makes the rename durable
    ::close(fd);
  }
}

// The source index and a shard's header must agree, as the loader checks them for the source
// (a flipped byte in a header can rename a tensor and still parse): every tensor of the shard
// listed as in it, every tensor listed as in it present. DATA_LOSS naming both files otherwise.
absl::Status CheckShardAgainstIndex(const st::Header& header, const std::string& shard_path,
                                    std::string_view shard_name, const st::Index& index,
                                    const std::string& index_path) {
  std::set<std::string_view> names;
  for (const st::TensorInfo& t : header.tensors) {
    names.insert(t.name);
    auto it = index.weight_map.find(t.name);
    if (it == index.weight_map.end() || it->second != shard_name) {
      return absl::DataLossError(
          Cat("tensor '", t.name, "' in '", shard_path, "' is not listed as in it by '", index_path,
              "'", it == index.weight_map.end() ? "" : Cat(" (it names '", it->second, "')"),
              ": a corrupt header or a shard of another snapshot"));
    }
  }
  for (const auto& [name, shard] : index.weight_map) {
    if (shard == shard_name && !names.count(name)) {
      return absl::DataLossError(Cat("'", index_path, "' lists tensor '", name, "' in '",
                                     shard_path, "', which does not have it"));
    }
  }
  return absl::OkStatus();
}

// How ConvertShard runs (from RepackOptions) and reports.
struct RunOptions {
  int threads = 1;
  int in_flight = 3;
  uint64_t piece_bytes = kPieceBytes;
  bool direct = true;
  std::string tag;  // "[k/N] <shard>: "
  std::function<void(std::string_view)> say;
};

// What one source shard becomes: the output tensors in file order and, per source tensor, where
// its bytes go. Empty `planned` when the shard holds only vision tensors (no output).
struct ShardPlan {
  std::vector<st::PlannedTensor> planned;
  std::vector<ShardPipeline::Output> where;
};

absl::StatusOr<ShardPlan> PlanShardOutput(const ShardFile& src, const std::string& src_path,
                                          const Config& cfg, const Bits& bits) {
  ShardPlan plan;
  const std::vector<st::TensorInfo>& in = src.header.tensors;  // file-offset order
  std::vector<OutTensor> plain, experts;
  std::vector<std::optional<WeightFormat>> formats(in.size());
  for (size_t i = 0; i < in.size(); ++i) {
    const st::TensorInfo& t = in[i];
    COLI_ASSIGN_OR_RETURN(Role role, Classify(t.name, cfg, bits));
    switch (role.kind) {
      case Role::kDrop:
        break;
      case Role::kPass:
        plain.push_back({{t.name, t.dtype, t.shape}, i});
        break;
      case Role::kExpert:
        if (t.dtype != DType::kU8 || t.shape.size() != 2) {
          return absl::InvalidArgumentError(Cat("tensor '", t.name, "' in '", src_path,
                                                "': expected a U8 MXFP4 matrix, got ",
                                                st::DescribeTensor(t.dtype, t.shape)));
        }
        experts.push_back({{t.name, t.dtype, t.shape}, i, OutTensor::kCopy, true, role.expert_key});
        break;
      case Role::kQuantize: {
        if (t.dtype != DType::kBF16 || t.shape.size() != 2 || t.shape[0] <= 0 || t.shape[1] <= 0) {
          return absl::InvalidArgumentError(
              Cat("tensor '", t.name, "' in '", src_path, "': expected a BF16 matrix to quantize (",
                  role.flag, " ", role.bits, "), got ", st::DescribeTensor(t.dtype, t.shape)));
        }
        COLI_ASSIGN_OR_RETURN(WeightFormat f, FormatForBits(role.bits, t.shape[1], role.flag));
        COLI_ASSIGN_OR_RETURN(std::vector<st::PlannedTensor> parts,
                              ContainerTensors(t.name, f, t.shape[0], t.shape[1]));
        formats[i] = f;
        plain.push_back({parts[0], i, OutTensor::kData});
        plain.push_back({parts[1], i, OutTensor::kScales});
        break;
      }
    }
  }
  if (plain.empty() && experts.empty()) return plan;  // vision only: no output
  // Widest dtype first keeps every tensor aligned to its element size (the data region starts
  // 8-byte aligned and each size is a multiple of its element size); then by name.
  std::sort(plain.begin(), plain.end(), [](const OutTensor& a, const OutTensor& b) {
    const size_t sa = st::DTypeSize(a.planned.dtype), sb = st::DTypeSize(b.planned.dtype);
    return sa != sb ? sa > sb : a.planned.name < b.planned.name;
  });
  std::sort(experts.begin(), experts.end(),
            [](const OutTensor& a, const OutTensor& b) { return a.expert_key < b.expert_key; });
  for (size_t i = 1; i < experts.size(); ++i) {
    if (experts[i].expert_key == experts[i - 1].expert_key) {
      return absl::DataLossError(Cat("'", src_path, "': tensors '", experts[i - 1].planned.name,
                                     "' and '", experts[i].planned.name,
                                     "' name the same expert part"));
    }
  }
  std::vector<OutTensor> out = std::move(plain);
  out.insert(out.end(), experts.begin(), experts.end());
  plan.where.resize(in.size());
  for (size_t j = 0; j < out.size(); ++j) {
    plan.planned.push_back(out[j].planned);
    plan.where[out[j].source].index[out[j].part == OutTensor::kScales ? 1 : 0] = j;
  }
  for (size_t i = 0; i < in.size(); ++i) plan.where[i].format = formats[i];
  return plan;
}

// Converts one source shard into dst_path (via dst_path.tmp), adding its bytes and stage times
// to *summary. false when it holds only vision tensors (no output).
absl::StatusOr<bool> ConvertShard(const std::string& src_path, const std::string& dst_path,
                                  const st::Index& index, const std::string& index_path,
                                  const Config& cfg, const Bits& bits, const RunOptions& run,
                                  RepackSummary* summary) {
  COLI_ASSIGN_OR_RETURN(ShardFile src, OpenShard(src_path));
  COLI_RETURN_IF_ERROR(CheckShardAgainstIndex(
      src.header, src_path, fs::path(src_path).filename().string(), index, index_path));
  COLI_ASSIGN_OR_RETURN(ShardPlan plan, PlanShardOutput(src, src_path, cfg, bits));
  if (plan.planned.empty()) return false;
  const std::vector<st::TensorInfo>& in = src.header.tensors;  // file-offset order
  std::vector<st::PlannedTensor> planned = std::move(plan.planned);
  std::vector<ShardPipeline::Output> where = std::move(plan.where);
  std::vector<Piece> pieces = CutPieces(in, where, run.piece_bytes);
  uint64_t read_bytes = 0;
  for (const Piece& p : pieces) read_bytes += p.length;
  COLI_ASSIGN_OR_RETURN(std::unique_ptr<io::DirectReader> reader,
                        io::DirectReader::Open(src_path, run.direct));
  const std::string tmp = dst_path + ".tmp";
  // From here on, every failure removes the temp file: no partial output under either name.
  struct RemoveUnlessKept {
    const std::string& path;
    bool keep = false;
    ~RemoveUnlessKept() {
      if (!keep) ::unlink(path.c_str());
    }
  } cleanup{tmp};
  COLI_ASSIGN_OR_RETURN(const auto provenance, Provenance(src_path, src, bits));
  COLI_ASSIGN_OR_RETURN(std::unique_ptr<st::PlannedWriter> w,
                        st::PlannedWriter::Create(tmp, std::move(planned), provenance,
                                                    /*checksums=*/true));
  run.say(Cat(run.tag, "reading ", pieces.size(), " pieces of ", in.size(), " tensors (",
              read_bytes, " bytes, ", reader->is_direct() ? "O_DIRECT" : "buffered", ")"));
  // One pass over the source in file order; each tensor lands where the header puts it.
  ShardPipeline::Seconds busy;
  COLI_RETURN_IF_ERROR(
      ShardPipeline(*reader, in, where, std::move(pieces), run.in_flight, run.threads, *w)
          .Run(&busy));
  const double t0 = Now();
  COLI_RETURN_IF_ERROR(w->Finish());
  if (::rename(tmp.c_str(), dst_path.c_str()) != 0) {
    return absl::InternalError(
        Cat("cannot rename '", tmp, "' to '", dst_path, "': ", std::strerror(errno)));
  }
  cleanup.keep = true;
  FsyncDir(fs::path(dst_path).parent_path().string());
  summary->read_bytes += read_bytes;
  summary->read_seconds += busy.read;
  summary->quantize_seconds += busy.quantize;
  summary->write_seconds += busy.write;
  summary->finish_seconds += Now() - t0;
  return true;
}

// "model-00003-of-000096.safetensors" → 3; -1 when the name has another form.
int ShardNumber(std::string_view name) {
  if (!name.starts_with("model-")) return -1;
  size_t pos = 6;
  int n = 0;
  if (!ParseNumber(name, &pos, &n) || name.substr(pos, 4) != "-of-") return -1;
  return n;
}

absl::Status CopyFiles(const std::string& src, const std::string& dst) {
  for (std::string_view name : kCopiedFiles) {
    const std::string from = Join(src, name);
    std::error_code ec;
    if (!fs::exists(from, ec)) continue;
    COLI_ASSIGN_OR_RETURN(std::string bytes, io::ReadFileToString(from));
    COLI_RETURN_IF_ERROR(io::WriteFileAtomic(Join(dst, name), bytes));
  }
  return absl::OkStatus();
}

// An exclusive flock on `<dst>/.k3-repack.lock` for the whole run: two runs into one folder
// would write the same `<shard>.tmp` (the second truncating what the first wrote) and one could
// rename a file the other is still filling. The kernel drops the lock when the holder dies, so a
// run killed with SIGKILL never blocks the next one.
class FolderLock {
 public:
  static absl::StatusOr<std::unique_ptr<FolderLock>> Acquire(const std::string& dst) {
    const std::string path = Join(dst, ".k3-repack.lock");
    const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) {
      return absl::FailedPreconditionError(Cat(
          "cannot create '", path, "' (is the output folder writable?): ", std::strerror(errno)));
    }
    auto lock = std::unique_ptr<FolderLock>(new FolderLock(fd));
    if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
      if (errno == EWOULDBLOCK) {
        return absl::FailedPreconditionError(
            Cat("another k3-repack is writing into '", dst, "' (it holds '", path,
                "'); wait for it to finish or stop it, then run again"));
      }
      return absl::InternalError(Cat("cannot lock '", path, "': ", std::strerror(errno)));
    }
    return lock;
  }
  ~FolderLock() { ::close(fd_); }
  FolderLock(const FolderLock&) = delete;
  FolderLock& operator=(const FolderLock&) = delete;

 private:
  explicit FolderLock(int fd) : fd_(fd) {}
  const int fd_;
};

// Before anything is written: every *.safetensors already in dst must be a shard this run
// would have made (a source shard of that name, the same bits, made from the same source file),
// since the index is rebuilt from all of them and the existing ones are not converted again.
absl::Status CheckExistingOutputs(const std::string& src, const std::string& dst,
                                  const st::Index& index, const Bits& bits) {
  const std::set<std::string> source_shards(index.shards.begin(), index.shards.end());
  std::vector<std::string> names;
  std::error_code ec;
  for (const fs::directory_entry& e : fs::directory_iterator(dst, ec)) {
    const std::string name = e.path().filename().string();
    if (name.ends_with(".safetensors")) names.push_back(name);
  }
  if (ec) return absl::NotFoundError(Cat("folder '", dst, "': ", ec.message()));
  std::sort(names.begin(), names.end());
  for (const std::string& name : names) {
    if (!source_shards.count(name)) {
      return absl::FailedPreconditionError(
          Cat("'", Join(dst, name), "' is not a shard of the source '", src,
              "' (its index does not list it), but the container's index would take it in; "
              "use an empty or new output folder"));
    }
    const std::string from = Join(src, name);
    COLI_RETURN_IF_ERROR(
        CheckExistingOutput(Join(dst, name), fs::exists(from, ec) ? from : std::string(), bits));
  }
  return absl::OkStatus();
}

// Before anything is written: the shards still to convert must fit in dst's free space. A full
// filesystem was found only when a write failed, after hours on the full model.
absl::Status CheckRoom(const std::string& src, const std::string& dst, const st::Index& index,
                       const std::set<int>& wanted, const Config& cfg, const Bits& bits) {
  uint64_t need = 0;
  int shards = 0;
  std::error_code ec;
  for (const std::string& name : index.shards) {
    if (!wanted.empty() && !wanted.count(ShardNumber(name))) continue;
    const std::string from = Join(src, name);
    if (!fs::exists(from, ec) || fs::exists(Join(dst, name), ec)) continue;
    COLI_ASSIGN_OR_RETURN(ShardFile shard, OpenShard(from));
    COLI_ASSIGN_OR_RETURN(ShardPlan plan, PlanShardOutput(shard, from, cfg, bits));
    if (plan.planned.empty()) continue;
    COLI_ASSIGN_OR_RETURN(st::PlannedHeader header, st::PlanHeader(plan.planned, {}));
    // + the checksum digits and the provenance record (a few hundred bytes) in the header.
    need += 8 + header.json.size() + header.data_bytes + 8 * plan.planned.size() + 4096;
    ++shards;
  }
  struct statvfs fsinfo;
  if (::statvfs(dst.c_str(), &fsinfo) != 0) return absl::OkStatus();  // unknown: let writes tell
  const uint64_t free_bytes = static_cast<uint64_t>(fsinfo.f_bavail) * fsinfo.f_frsize;
  if (need <= free_bytes) return absl::OkStatus();
  char sizes[128];
  std::snprintf(sizes, sizeof(sizes), "%.2f GB, but it has %.2f GB free", need / 1e9,
                free_bytes / 1e9);
  return absl::ResourceExhaustedError(
      Cat("'", dst, "' is too small: the ", shards, " shard(s) still to convert need ", need,
          " bytes (", sizes, "); free space there or choose another folder (nothing was written)"));
}

}  // namespace

absl::StatusOr<IndexSummary> RebuildIndex(const std::string& dst) {
  std::vector<std::string> files;
  std::error_code ec;
  for (const fs::directory_entry& e : fs::directory_iterator(dst, ec)) {
    const std::string name = e.path().filename().string();
    if (e.is_regular_file() && name.ends_with(".safetensors")) files.push_back(name);
  }
  if (ec) return absl::NotFoundError(Cat("folder '", dst, "': ", ec.message()));
  std::sort(files.begin(), files.end());
  std::map<std::string, std::string> weight_map;
  IndexSummary summary;
  for (const std::string& name : files) {
    COLI_ASSIGN_OR_RETURN(ShardFile shard, OpenShard(Join(dst, name)));
    for (const st::TensorInfo& t : shard.header.tensors) {
      auto [it, inserted] = weight_map.emplace(t.name, name);
      if (!inserted) {
        return absl::FailedPreconditionError(Cat("tensor '", t.name, "' is in both '", it->second,
                                                 "' and '", name, "' in '", dst,
                                                 "'; the index was not updated"));
      }
      summary.total_size += t.nbytes;
    }
    ++summary.shards;
  }
  COLI_RETURN_IF_ERROR(
      st::WriteIndex(Join(dst, st::kIndexFileName), weight_map, summary.total_size));
  return summary;
}

// A quantized matrix: the source's BF16 rows quantized again with the engine's FromBf16 (as the
// repack did, piece by piece: rows are independent) must give the stored U8 and sidecar bytes.
absl::Status VerifyQuantized(const ShardFile& src, const st::TensorInfo& t, const ShardFile& dst,
                             const st::TensorInfo& data, const st::TensorInfo& qs,
                             const std::string& src_shard, const std::string& dst_shard) {
  if (t.dtype != DType::kBF16 || t.shape.size() != 2 || t.shape[0] <= 0 || t.shape[1] <= 0) {
    return absl::DataLossError(Cat("tensor '", t.name, "': quantized in '", dst_shard,
                                   "' but the source has ", st::DescribeTensor(t.dtype, t.shape)));
  }
  const int64_t rows = t.shape[0], cols = t.shape[1];
  COLI_ASSIGN_OR_RETURN(WeightFormat f, ContainerFormat(data, qs, rows, cols));
  const kernels::MatrixBytes per_row = kernels::FormatBytes(f, 1, cols);
  const int64_t step = std::max<int64_t>(1, static_cast<int64_t>(kPieceBytes) / (2 * cols));
  std::vector<uint16_t> bf16;
  std::string stored;
  // Compares `want` with `bytes` bytes of tensor `out` from byte `at`.
  auto compare = [&](const st::TensorInfo& out, uint64_t at, const QuantizedMatrix::Bytes& want) {
    stored.resize(want.size());
    COLI_RETURN_IF_ERROR(dst.file->ReadAt(out.file_offset + at, want.size(), stored.data()));
    if (std::memcmp(stored.data(), want.data(), want.size()) == 0) return absl::OkStatus();
    const auto diff = std::mismatch(want.begin(), want.end(), stored.begin(),
                                    [](uint8_t a, char b) { return a == static_cast<uint8_t>(b); });
    return absl::DataLossError(Cat("tensor '", out.name, "': byte ",
                                   at + (diff.first - want.begin()), " of '", dst_shard,
                                   "' differs from the source '", src_shard, "' quantized again"));
  };
  for (int64_t r = 0; r < rows; r += step) {
    const int64_t n = std::min(step, rows - r);
    bf16.resize(static_cast<size_t>(n * cols));
    COLI_RETURN_IF_ERROR(src.file->ReadAt(t.file_offset + 2 * r * cols, 2 * n * cols, bf16.data()));
    absl::StatusOr<QuantizedMatrix> q = QuantizedMatrix::FromBf16(bf16.data(), n, cols, f);
    if (!q.ok()) return Annotate(q.status(), Cat("tensor '", t.name, "' in '", src_shard, "'"));
    COLI_RETURN_IF_ERROR(compare(data, r * per_row.data, q->data()));
    COLI_RETURN_IF_ERROR(compare(qs, r * per_row.scales, q->scales()));
  }
  return absl::OkStatus();
}

absl::Status VerifyShard(const std::string& src_shard, const std::string& dst_shard) {
  COLI_ASSIGN_OR_RETURN(ShardFile src, OpenShard(src_shard));
  COLI_ASSIGN_OR_RETURN(ShardFile dst, OpenShard(dst_shard));
  std::map<std::string_view, const st::TensorInfo*> out;
  for (const st::TensorInfo& t : dst.header.tensors) out[t.name] = &t;
  std::string a, b;
  for (const st::TensorInfo& t : src.header.tensors) {
    if (IsVision(t.name)) continue;  // dropped
    auto it = out.find(t.name);
    if (auto qs = out.find(ScaleSidecarName(t.name)); qs != out.end() && it != out.end()) {
      COLI_RETURN_IF_ERROR(
          VerifyQuantized(src, t, dst, *it->second, *qs->second, src_shard, dst_shard));
      continue;
    }
    if (it == out.end()) {
      return absl::DataLossError(
          Cat("tensor '", t.name, "': in '", src_shard, "' but not in '", dst_shard, "'"));
    }
    const st::TensorInfo& o = *it->second;
    if (o.dtype != t.dtype || o.shape != t.shape) {
      return absl::DataLossError(
          Cat("tensor '", t.name, "': ", st::DescribeTensor(o.dtype, o.shape), " in '", dst_shard,
              "', ", st::DescribeTensor(t.dtype, t.shape), " in the source"));
    }
    for (uint64_t off = 0; off < t.nbytes; off += kPieceBytes) {
      const uint64_t n = std::min(kPieceBytes, t.nbytes - off);
      a.resize(n);
      b.resize(n);
      COLI_RETURN_IF_ERROR(src.file->ReadAt(t.file_offset + off, n, a.data()));
      COLI_RETURN_IF_ERROR(dst.file->ReadAt(o.file_offset + off, n, b.data()));
      if (a != b) {
        const auto diff = std::mismatch(a.begin(), a.end(), b.begin());
        return absl::DataLossError(Cat("tensor '", t.name, "': byte ",
                                       off + (diff.first - a.begin()), " of '", dst_shard,
                                       "' differs from the source '", src_shard, "'"));
      }
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<RepackSummary> Repack(const std::string& src, const std::string& dst,
                                     const RepackOptions& options) {
  auto say = [&](std::string_view line) {
    if (options.progress) options.progress(line);
  };
  for (auto [v, flag] :
       {std::pair{options.bits, "--bits"}, std::pair{options.mla_bits, "--mla-bits"},
        std::pair{options.head_bits, "--head-bits"}}) {
    if (v != 4 && v != 8 && !(v == 0 && flag != std::string_view("--bits"))) {
      return absl::InvalidArgumentError(Cat(flag, " ", v, ": use 4 or 8"));
    }
  }
  if (options.in_flight < 1) {
    return absl::InvalidArgumentError(Cat("--in-flight ", options.in_flight, ": use 1 or more"));
  }
  if (options.piece_bytes < 1) return absl::InvalidArgumentError("piece_bytes 0: use 1 or more");
  const int threads = options.threads > 0
                          ? options.threads
                          : std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  const Bits bits{options.bits, options.mla_bits ? options.mla_bits : std::max(options.bits, 8),
                  options.head_bits ? options.head_bits : std::max(options.bits, 8)};
  COLI_ASSIGN_OR_RETURN(Config cfg, Config::LoadDir(src));
  const std::string index_path = Join(src, st::kIndexFileName);
  COLI_ASSIGN_OR_RETURN(std::string index_text, io::ReadFileToString(index_path));
  COLI_ASSIGN_OR_RETURN(st::Index index, st::ParseIndex(index_text, index_path));
  std::set<int> wanted(options.shards.begin(), options.shards.end());
  for (int n : wanted) {
    bool known = false;
    for (const std::string& s : index.shards) known |= ShardNumber(s) == n;
    if (!known) {
      return absl::InvalidArgumentError(
          Cat("--shards ", n, ": no such shard in '", index_path, "'"));
    }
  }
  std::error_code ec;
  fs::create_directories(dst, ec);
  if (ec) return absl::InternalError(Cat("cannot create '", dst, "': ", ec.message()));
  if (fs::equivalent(src, dst, ec)) {
    return absl::InvalidArgumentError(Cat("'", dst, "' is the source folder"));
  }
  COLI_ASSIGN_OR_RETURN(std::unique_ptr<FolderLock> lock, FolderLock::Acquire(dst));
  COLI_RETURN_IF_ERROR(CheckExistingOutputs(src, dst, index, bits));
  COLI_RETURN_IF_ERROR(CheckRoom(src, dst, index, wanted, cfg, bits));
  COLI_RETURN_IF_ERROR(CopyFiles(src, dst));
  say(Cat("k3-repack: ", index.shards.size(), " source shards, bits ", bits.bits, " / mla ",
          bits.mla_bits, " / head ", bits.head_bits));
  RepackSummary summary;
  std::vector<std::string> incomplete;  // missing source shards with text tensors, no output
  int k = 0;
  for (const std::string& name : index.shards) {
    ++k;
    if (!wanted.empty() && !wanted.count(ShardNumber(name))) continue;
    const std::string from = Join(src, name), to = Join(dst, name);
    const std::string tag = Cat("[", k, "/", index.shards.size(), "] ", name, ": ");
    if (!fs::exists(from, ec)) {
      ++summary.missing_source;
      say(tag + "source missing, skipped");
      const bool text =
          std::any_of(index.weight_map.begin(), index.weight_map.end(),
                      [&](const auto& e) { return e.second == name && !IsVision(e.first); });
      if (text && !fs::exists(to, ec)) incomplete.push_back(name);
      continue;
    }
    if (fs::exists(to, ec)) {
      ++summary.existing;
      say(tag + "already converted, skipped");
    } else {
      const double t0 = Now();
      const RunOptions run{threads, options.in_flight, options.piece_bytes, options.direct, tag,
                           say};
      COLI_ASSIGN_OR_RETURN(bool written,
                            ConvertShard(from, to, index, index_path, cfg, bits, run, &summary));
      if (!written) {
        ++summary.dropped;
        say(tag + "vision only, dropped");
        continue;
      }
      ++summary.written;
      const double dt = Now() - t0;
      const double mb = static_cast<double>(fs::file_size(from, ec)) / 1e6;
      char rate[64];
      std::snprintf(rate, sizeof(rate), "%.1f MB in %.2f s (%.0f MB/s)", mb, dt,
                    dt > 0 ? mb / dt : 0.0);
      say(tag + rate);
    }
    if (options.verify_full) {
      COLI_RETURN_IF_ERROR(VerifyShard(from, to));
      ++summary.verified;
      say(tag + "verified");
    }
  }
  COLI_ASSIGN_OR_RETURN(IndexSummary idx, RebuildIndex(dst));
  summary.index_shards = idx.shards;
  summary.total_size = idx.total_size;
  say(Cat("k3-repack: index of ", idx.shards, " shards, total_size ", idx.total_size));
  if (!incomplete.empty()) {
    // The converted shards and the index are kept: fetching the missing ones and running again
    // converts only those.
    std::string list;
    for (const std::string& n : incomplete) list += Cat(list.empty() ? "" : ", ", "'", n, "'");
    return absl::NotFoundError(
        Cat(incomplete.size(), " source shard(s) listed by '", index_path, "' are missing: ", list,
            "; the container in '", dst,
            "' lacks their tensors and will not load. Fetch them and run again (the ",
            summary.written + summary.existing, " converted shards are kept)"));
  }
  return summary;
}

}  // namespace coli::k3
