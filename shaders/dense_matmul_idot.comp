// shaders/dense_matmul_idot.comp: y[b, r] = Σ_c W[r, c]·x[b, c] for the int8-per-row and
// int4-g64 dense formats (Kimi K3's shared experts at K3_BITS 8 and 4) with int8 activations,
// reproducing the CPU's integer-dot kernels (common/kernels Matmul(idot = true), matmul_scalar.cc
// Int8IdotScalar / Int4IdotScalar) bit for bit. Compiled twice (shaders/CMakeLists.txt):
//   FORMAT 1, int8 row: w = int8[rows*cols] as little-endian uint words (column c of row r is
//                       byte r*cols + c, any cols), scales = f32 bits [rows].
//   FORMAT 2, int4-g64: w = biased nibbles (value n − 8) as uint words (column 8k+i in bits
//                       4i..4i+3 of word k of the row; cols % 64 == 0), scales = f32 bits
//                       [rows*cols/64].
//   x  per batch row, ceil(cols/4) words of int8 codes (byte c = column c, zero past cols), then
//      ceil(cols/64) words: the f32 bits of each 64-column group's activation scale, both as
//      kernels::QuantizeActivationsInt8Groups makes them on the host.
//   y  f32 bits [batch, rows].
//
// Numerics (kernels.h "Numerics"), 16 lanes per row:
//   int8: lane l of 64-column block k holds columns 64k+4l..64k+4l+3 (those below cols; a lane
//         with none still adds 0·xscale): lane = fma(dot, xscale_k, lane) in block order; the
//         row scale multiplies the reduced sum.
//   int4: lane 8j+i of 128-column block holds group g ≡ j (mod 2), columns 8i..8i+7 of it:
//         lane = fma(dot, wscale_g·xscale_g, lane) in group order, the product rounded once.
// The lanes are reduced by the CPU's fixed tree. Every floating-point step is done in integers
// by idot_float.glsl, so the result is the CPU's whatever the driver does with floats.
//
// Work split as mxfp4_matmul_idot.comp: a workgroup of 64 invocations computes 4 rows, 16 lanes
// each, for a tile of up to 8 batch rows (each weight word read once per tile); after a barrier,
// invocation `lane` < tile of each row reduces batch row b0 + lane.
#version 450
#extension GL_EXT_shader_explicit_arithmetic_types_int64 : require
#extension GL_GOOGLE_include_directive : require

#include "idot_float.glsl"

#if !defined(FORMAT) || (FORMAT != 1 && FORMAT != 2)
#error "FORMAT must be defined: 1 int8 per row, 2 int4-g64"
#endif

layout(local_size_x = 64, local_size_y = 1, local_size_z = 1) in;

layout(std430, set = 0, binding = 0) readonly buffer Weights { uint w[]; };
layout(std430, set = 0, binding = 1) readonly buffer Scales { uint scale_bits[]; };
layout(std430, set = 0, binding = 2) readonly buffer Activations { uint x[]; };
layout(std430, set = 0, binding = 3) writeonly buffer Outputs { uint y[]; };

layout(push_constant) uniform Params {
  uint rows;
  uint cols;
  uint batch;
} p;

const uint kLanes = 16;
const uint kRowsPerGroup = 4;
const uint kBatchTile = 8;

shared uint lanes[kRowsPerGroup][kBatchTile][kLanes];

#if FORMAT == 1
// Weight byte `i` of the int8 matrix (rows*cols bytes, row-major), sign-extended.
int WeightByte(uint i) { return bitfieldExtract(int(w[i >> 2]), int((i & 3u) * 8u), 8); }
#endif

void main() {
  const uint t = gl_LocalInvocationID.x;
  const uint sub = t / kLanes;
  const uint lane = t % kLanes;
  const uint group_id = gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x;
  const uint row = group_id * kRowsPerGroup + sub;
  // Rows past the end still take part in the barriers.
  const bool valid = row < p.rows;
  const uint groups = (p.cols + 63u) / 64u;
  const uint code_words = (p.cols + 3u) / 4u;
  const uint x_stride = code_words + groups;

  for (uint b0 = 0; b0 < p.batch; b0 += kBatchTile) {
    const uint tile = min(kBatchTile, p.batch - b0);
    uint acc[kBatchTile];
    for (uint k = 0; k < kBatchTile; ++k) {
      acc[k] = 0u;
    }
    if (valid) {
#if FORMAT == 1
      const uint row_base = row * p.cols;
      for (uint g = 0; g < groups; ++g) {
        const uint c0 = g * 64u + 4u * lane;
        const uint n = c0 < p.cols ? min(4u, p.cols - c0) : 0u;
        int wq[4];
        for (uint m = 0; m < 4u; ++m) {
          wq[m] = m < n ? WeightByte(row_base + c0 + m) : 0;
        }
        for (uint k = 0; k < tile; ++k) {
          const uint xb = (b0 + k) * x_stride;
          // A lane past the last column reads no codes (the word would be a scale).
          const int codes = n > 0u ? int(x[xb + c0 / 4u]) : 0;
          int dot = 0;
          for (int m = 0; m < 4; ++m) {
            dot += wq[m] * bitfieldExtract(codes, 8 * m, 8);
          }
          acc[k] = Fma(dot, x[xb + code_words + g], acc[k]);
        }
      }
#else
      const uint words = p.cols / 8u;
      const uint j = lane / 8u;  // groups j, j + 2, j + 4, ...
      const uint i = lane % 8u;  // columns 8i..8i+7 of each
      for (uint g = j; g < groups; g += 2u) {
        const uint packed = w[row * words + g * 8u + i];
        const uint w_scale = scale_bits[row * groups + g];
        int wq[8];
        for (uint m = 0; m < 8u; ++m) {
          wq[m] = int((packed >> (4u * m)) & 15u) - 8;
        }
        for (uint k = 0; k < tile; ++k) {
          const uint xb = (b0 + k) * x_stride;
          const int lo = int(x[xb + g * 16u + 2u * i]);
          const int hi = int(x[xb + g * 16u + 2u * i + 1u]);
          int dot = 0;
          for (int m = 0; m < 4; ++m) {
            dot += wq[m] * bitfieldExtract(lo, 8 * m, 8);
            dot += wq[m + 4] * bitfieldExtract(hi, 8 * m, 8);
          }
          acc[k] = Fma(dot, Mul(w_scale, x[xb + code_words + g]), acc[k]);
        }
      }
#endif
    }
    for (uint k = 0; k < kBatchTile; ++k) {
      lanes[sub][k][lane] = acc[k];
    }
    barrier();
    if (valid && lane < tile) {
      uint r[16];
      for (uint l = 0; l < 16u; ++l) {
        r[l] = lanes[sub][lane][l];
      }
#if FORMAT == 1
      y[(b0 + lane) * p.rows + row] = Mul(scale_bits[row], ReduceLanes16(r));
#else
      y[(b0 + lane) * p.rows + row] = ReduceLanes16(r);
#endif
    }
    barrier();  // lanes[] is rewritten by the next tile
  }
}
