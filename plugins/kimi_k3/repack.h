// plugins/kimi_k3/repack: k3-repack, the Hugging Face snapshot → repacked container converter
// (spec §4.4; seed "Repacked container").
//
//   RepackOptions o;  o.bits = 8;               // --bits 8 (MLA and head default to max(bits, 8))
//   COLI_ASSIGN_OR_RETURN(RepackSummary s, Repack("/models/Kimi-K3", "/fast/k3-int8", o));
//
// One sequential read of each selected source shard writes one output shard of the same name
// (to `<name>.tmp`, renamed when complete; removed on any error). Reading, quantizing and
// writing overlap: a reader thread reads the next 32 MiB piece while the current one is
// quantized and a writer thread writes the previous one (`in_flight` pieces at most, so memory
// is bounded whatever the shard size); the first error of any stage stops and joins all of
// them. The output bytes do not depend on `threads`, `in_flight` or `piece_bytes`; an existing
// output shard is skipped (resume), a source shard listed by the index but absent is skipped with a
// warning (if it holds text tensors and has no output, the run still converts the others and
// rebuilds the index, then returns NOT_FOUND naming it: the container would not load), a shard
// holding only vision tensors produces no output. Each source shard's header must agree with the
// source index (DATA_LOSS otherwise, as at load). Each shard's __metadata__
// records the bits and its source file's size, mtime and header digest; before writing anything a
// run checks every *.safetensors already in dst against them (FAILED_PRECONDITION naming the shard
// and what differs: other bits, a changed source, a file k3-repack did not write), and holds an
// flock on dst/.k3-repack.lock (a second run into the same folder is FAILED_PRECONDITION). Per tensor (classification needs
// the config's linear_attn_config, since o_proj / g_proj exist in both attention kinds):
//   * KDA q/k/v/o/g, latent down/up, shared experts, dense MLP → `bits`; MLA q_a, q_b, kv_a,
//     kv_b, o, g → `mla_bits`; lm_head → `head_bits`: quantized with the engine's own
//     kernels::QuantizedMatrix (int4-g64 when bits == 4 and cols % 64 == 0, else int8 per row)
//     and stored as U8 + `<name>.qs` F32 (container.h) — bit-identical to load-time quantization;
//   * routed experts: byte-identical, ordered by (layer, expert id, w1<w2<w3, packed<scale), so
//     each expert is one contiguous range (one pread);
//   * `vision_tower.*` / `mm_projector.*`: dropped;  everything else: as in the source.
// Non-expert tensors come first, widest dtype first, so every F32 tensor starts 4-byte aligned
// in the file (K3_MMAP uses the sidecars in place). The index is rebuilt atomically on every
// run from all completed output shards in dst (duplicate names abort it, leaving the old one);
// config.json, generation_config.json, tokenizer.json, tokenizer_config.json and tiktoken.model
// (our tokenizer's vocabulary; the spec's tool does not copy it) are copied when present.
// Errors name the file and tensor: DATA_LOSS for a corrupt source, NOT_FOUND for a missing
// config / index, INVALID_ARGUMENT for a tensor of the wrong dtype or shape.
#ifndef COLI_PLUGINS_KIMI_K3_REPACK_H_
#define COLI_PLUGINS_KIMI_K3_REPACK_H_

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace coli::k3 {

struct RepackOptions {
  int bits = 8;       // 4 or 8
  int mla_bits = 0;   // 0 = max(bits, 8)
  int head_bits = 0;  // 0 = max(bits, 8)
  // Shard numbers (the 5-digit index of model-XXXXX-of-N.safetensors); empty = all.
  std::vector<int> shards;
  // Quantization threads (rows are independent: the bytes do not depend on it); 0 = one per
  // hardware thread.
  int threads = 0;
  // Pieces in flight between reading, quantizing and writing; 1 = the three never overlap
  // (the tool before the pipeline). Peak memory ≈ (in_flight × 1.5 + 0.5) × piece_bytes.
  int in_flight = 3;
  // Bytes per piece (a quantized tensor is cut at whole rows, at least one). Neither this nor
  // in_flight changes the output bytes.
  uint64_t piece_bytes = uint64_t{32} << 20;
  // Read the source with O_DIRECT (no page cache; falls back to pread, logged, where the
  // filesystem refuses it); false = buffered pread.
  bool direct = true;
  // Re-read every expert (and pass-through) byte of source and output and compare; quantize the
  // source's matrices again and compare the stored U8 data and sidecars.
  bool verify_full = false;
  // One line per event (stderr in the tool); may be null. For every shard converted, the line
  // "[k/N] <shard>: reading …" comes after its header was validated and before any of its
  // tensor bytes are read.
  std::function<void(std::string_view)> progress;
};

struct RepackSummary {
  int written = 0;          // shards converted by this run
  int existing = 0;         // output already present (resume)
  int missing_source = 0;   // listed by the source index, file absent
  int dropped = 0;          // vision-only shards
  int verified = 0;         // shards compared by verify_full
  int index_shards = 0;     // shards in the rebuilt index
  uint64_t total_size = 0;  // the rebuilt index's total_size
  // Shards converted by this run: source bytes read, and the seconds each pipeline stage was
  // busy (summed over shards; the stages overlap, so the three can add up to more than the
  // wall time), and in the final fsync + rename.
  uint64_t read_bytes = 0;
  double read_seconds = 0, quantize_seconds = 0, write_seconds = 0, finish_seconds = 0;
};

absl::StatusOr<RepackSummary> Repack(const std::string& src, const std::string& dst,
                                     const RepackOptions& options);

// Rebuilds dst/model.safetensors.index.json from every *.safetensors file in dst (atomically;
// FAILED_PRECONDITION naming the tensor and both files on a duplicate name, with the old index
// left as it was). Returns the number of shards and total_size (sum of tensor bytes).
struct IndexSummary {
  int shards = 0;
  uint64_t total_size = 0;
};
absl::StatusOr<IndexSummary> RebuildIndex(const std::string& dst);

// Checks every *.safetensors in a container folder against the CRC-32 each tensor got when
// k3-repack wrote it (st::VerifyChecksums), `threads` shards at a time (0 = one per hardware
// thread): the source is not needed. DATA_LOSS naming the first damaged shard and tensor;
// FAILED_PRECONDITION when a shard has no checksums (an older k3-repack or another tool), after
// checking the others; NOT_FOUND when the folder holds no shard.
struct CheckSummary {
  int shards = 0;        // checked and intact
  uint64_t bytes = 0;    // tensor bytes read
  std::vector<std::string> without_checksums;  // file names
};
absl::StatusOr<CheckSummary> CheckContainer(const std::string& dst, int threads,
                                            const std::function<void(std::string_view)>& progress);

// Compares every expert and pass-through tensor of a source shard with the output shard byte
// for byte, and every quantized matrix's U8 data and sidecar with the source quantized again
// (DATA_LOSS naming the tensor and byte on the first difference, or a missing tensor).
absl::Status VerifyShard(const std::string& src_shard, const std::string& dst_shard);

}  // namespace coli::k3

#endif  // COLI_PLUGINS_KIMI_K3_REPACK_H_
