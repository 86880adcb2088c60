// common/kernels: quantized weight formats and the matmul kernels that compute on them.
//
// Formats follow ../shared/spec/kimi_k3_model.md §4 bit for bit: MXFP4 (routed experts, computed
// in place, never re-encoded), int8 per row and int4 in groups of 64 (dense matrices quantized
// at load from BF16), and f32 (validation).
//
//   COLI_ASSIGN_OR_RETURN(auto q, QuantizedMatrix::FromBf16(w, rows, cols,
//   WeightFormat::kInt8Row)); std::vector<float> y(batch * rows);
//   COLI_RETURN_IF_ERROR(Matmul(q.view(), x, batch, y.data(), {.idot = true, .threads = 2}));
//
// Numerics (the same on every instruction set, so results never depend on the machine):
//   * Every kernel accumulates a row's dot product in 16 f32 lanes in a fixed order and reduces
//     them with a fixed tree (lanes l and l+8, then l+4, l+2, l+1). The scalar reference and the
//     AVX2 / AVX-VNNI / AVX-512 paths follow that order exactly, so all give bit-identical outputs.
//   * A batch row's output does not depend on the batch size or on the thread count.
//   * idot (integer dots, the default): activations are quantized to int8 per group (32 columns
//     for MXFP4, 64 for int8 and int4-g64; scale = max|x|/127 floored at 1e-20, q = rint(x·(1/s))
//     half to even, clamped to ±127). Integer partial dots over 8 (MXFP4, int4) or 4 (int8)
//     columns are exact; each is scaled once in f32 (fma) into its lane.
//     MXFP4: lane 4j+i of a 128-column block holds group j's columns 8i..8i+7, scaled by
//            2^(s−127)·(0.5·xscale); the doubled e2m1 values are exact int8.
//     int4:  lane 8j+i of a 128-column block holds group j's columns 8i..8i+7, scaled by
//            wscale_g·xscale_g.
//     int8:  lane l of a 64-column block holds columns 4l..4l+3, scaled by xscale_block; the row
//            scale multiplies the reduced sum.
//   * Float paths: f32 lane l holds columns ≡ l (mod 16); MXFP4 float dequantizes exactly
//     (e2m1·2^(s−127)) and keeps two 16-lane accumulators per row (even / odd columns of each
//     32-group) that are added lane-wise before the tree.
#ifndef COLI_COMMON_KERNELS_KERNELS_H_
#define COLI_COMMON_KERNELS_KERNELS_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/memory/huge_pages.h"

namespace coli::kernels {

enum class WeightFormat { kF32, kInt8Row, kInt4G64, kMxfp4 };

// "f32", "int8", "int4g64", "mxfp4".
const char* WeightFormatName(WeightFormat format);

// A non-owning view of a weight matrix [rows, cols] in one format:
//   kF32:     data = float[rows*cols]
//   kInt8Row: data = int8[rows*cols],  scales = float[rows]
//   kInt4G64: data = uint8[rows*cols/2] (biased nibbles, low = even col), scales =
//   float[rows*cols/64] kMxfp4:   data = uint8[rows*cols/2] (e2m1, low = even col), scales = uint8
//   E8M0 [rows*cols/32]
struct MatrixView {
  WeightFormat format;
  int64_t rows;
  int64_t cols;
  const void* data;
  const void* scales;
};

// Checks that a view is well formed: known format, rows >= 0, cols > 0, non-null pointers, and
// the column constraint of the format (MXFP4: cols % 32 == 0, int4-g64: cols % 64 == 0).
absl::Status ValidateView(const MatrixView& w);

// The storage of a [rows, cols] matrix in `format`: data bytes and scale bytes (the layouts of
// MatrixView above).
struct MatrixBytes {
  size_t data = 0;
  size_t scales = 0;
  size_t total() const { return data + scales; }
};
MatrixBytes FormatBytes(WeightFormat format, int64_t rows, int64_t cols);

// Bytes of weight data plus scales that a kernel streams for one pass over the matrix.
size_t ViewBytes(const MatrixView& w);

// An owning quantized matrix made at load time from BF16 or f32 (spec §4.2/§4.3 exactly).
// Non-finite inputs are refused (INVALID_ARGUMENT naming row and column). MXFP4 is never made
// here: those bytes come from the checkpoint as they are (UNIMPLEMENTED).
class QuantizedMatrix {
 public:
  // Storage on huge pages where the system allows (weights are streamed once per token).
  using Bytes = std::vector<uint8_t, memory::HugePageAllocator<uint8_t>>;

  static absl::StatusOr<QuantizedMatrix> FromBf16(const uint16_t* w, int64_t rows, int64_t cols,
                                                  WeightFormat format);
  static absl::StatusOr<QuantizedMatrix> FromF32(const float* w, int64_t rows, int64_t cols,
                                                 WeightFormat format);
  // int8 per-row matrix -> int4-g64 (spec §4.3 downcast): per 64-group s = max|q8|·s8/7 (floor
  // 1e-20), q4 = clamp(rint((q8·s8)·(1/s)), −8, 7). Equal, bit for bit, to int4 quantization of
  // the dequantized int8 matrix. Needs cols % 64 == 0.
  static absl::StatusOr<QuantizedMatrix> DowncastInt8ToInt4(const MatrixView& int8_matrix);
  // Wraps already-quantized bytes (a repacked container's U8 data and .qs sidecar).
  static absl::StatusOr<QuantizedMatrix> FromParts(WeightFormat format, int64_t rows, int64_t cols,
                                                   Bytes data, Bytes scales);

  QuantizedMatrix() = default;
  MatrixView view() const;
  size_t bytes() const { return data_.size() + scales_.size(); }
  WeightFormat format() const { return format_; }
  int64_t rows() const { return rows_; }
  int64_t cols() const { return cols_; }
  // Raw storage in the layout of MatrixView (data, then scales as bytes).
  const Bytes& data() const { return data_; }
  const Bytes& scales() const { return scales_; }

 private:
  // Quantizes rows one at a time; row_fn(r, float* out) writes row r as f32.
  template <class RowFn>
  static absl::StatusOr<QuantizedMatrix> QuantizeRows(int64_t rows, int64_t cols,
                                                      WeightFormat format, RowFn row_fn);

  WeightFormat format_ = WeightFormat::kF32;
  int64_t rows_ = 0;
  int64_t cols_ = 0;
  Bytes data_;
  Bytes scales_;
};

struct MatmulOptions {
  bool idot = true;  // K3_IDOT: int8 activations per 32 (MXFP4) / 64 (int8, int4) group
  int threads = 0;   // 0 = OpenMP default
  // Batch 1 on the integer paths (AVX-512, AVX2, AVX-VNNI): how many weight rows, far apart in
  // memory, each thread reads side by side (1, 2 or 4; 0 = DefaultRowStreams()). Results do not
  // depend on it.
  int row_streams = 0;
};

// As measured: 4 on Intel CPUs with the AVX-512 kernels, else 2 (Zen 5 on every level, Zen 3 AVX2);
// COLI_ROW_STREAMS=1|2|4 replaces it (read once).
int DefaultRowStreams();

// y[b*rows + r] = sum_c W[r,c] * x[b*cols + c] for b in [0, batch). Each weight byte is read
// once per call, not once per row of x. Validates shapes (INVALID_ARGUMENT); with idot, a
// non-finite activation is refused (INVALID_ARGUMENT naming the batch row).
// x and y must not overlap.
absl::Status Matmul(const MatrixView& w, const float* x, int64_t batch, float* y,
                    const MatmulOptions& options = {});

float Bf16ToF32(uint16_t bits);

// kAvxVnni: AVX2 with the VEX-encoded vpdpbusd (Intel Alder Lake and later, AMD Zen 5), chosen
// when the CPU lacks the AVX-512 set of kAvx512.
enum class Isa { kScalar, kAvx2, kAvxVnni, kAvx512 };
const char* IsaName(Isa isa);
// Chosen once from cpuid; COLI_ISA=scalar|avx2|avxvnni|avx512 forces a lower one (a higher one
// than the CPU has is ignored with a warning on stderr).
Isa ActiveIsa();
// The best ISA this CPU (and OS) supports, ignoring COLI_ISA.
Isa DetectedIsa();

// ---- Format helpers (spec §4), also used by tests and reference code. ----

// e2m1 code (0..15) -> value: 0, .5, 1, 1.5, 2, 3, 4, 6, -0, -.5, ..., -6.
float E2m1ToF32(uint8_t code);
// UE8M0 exponent -> 2^(s-127) as colibri decodes it: float bits s << 23 (s=0 -> +0, 255 -> inf).
float E8m0ToF32(uint8_t s);

// Quantizes one f32 row to int8 (spec §4.2). Refuses non-finite values.
absl::Status QuantizeRowInt8(std::span<const float> w, int8_t* q, float* scale);
// Quantizes one f32 row to int4-g64 (spec §4.3): cols/2 bytes, cols/64 scales; cols % 64 == 0.
absl::Status QuantizeRowInt4G64(std::span<const float> w, uint8_t* packed, float* scales);

// Activation quantization used by idot: per `group` consecutive values (the last group may be
// shorter), scale = max|x|/127 floored at 1e-20, q = clamp(rint(x·(1/scale)), ±127) half to even.
// q gets x.size() values, scales ceil(x.size()/group). Refuses non-finite values.
absl::Status QuantizeActivationsInt8Groups(std::span<const float> x, int group, int8_t* q,
                                           float* scales);

// Dequantizes row `row` of any format to f32 (cols values), exactly as the kernels read it:
// int8 q·s, int4 (n−8)·s_g, MXFP4 e2m1·2^(s−127).
void DequantizeRow(const MatrixView& w, int64_t row, float* out);

}  // namespace coli::kernels

#endif  // COLI_COMMON_KERNELS_KERNELS_H_
