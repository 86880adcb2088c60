// shaders/mxfp4_matmul.comp: y[b, r] = sum_c W[r, c] * x[b, c] for an MXFP4 weight matrix W
// (rows x cols, cols % 32 == 0) and f32 activations x (batch x cols).
//
// Layouts (common/kernels/kernels.h, MatrixView kMxfp4), as the bytes sit in RAM:
//   w      uint words: row r holds cols/8 words; word k carries columns 8k..8k+7, column 8k+i in
//          bits 4i..4i+3 (the byte layout "low nibble = even column", read little-endian). Each
//          nibble is an e2m1 code (sign bit 3, value 0, .5, 1, 1.5, 2, 3, 4, 6).
//   scales f32, one per 32 columns (row-major [rows, cols/32]): the UE8M0 exponent s widened on
//          upload to the float with bits s << 23 (2^(s-127); s = 0 -> +0, s = 255 -> inf), exactly
//          as common/kernels E8m0ToF32 decodes it.
//   x      f32 [batch, cols];  y  f32 [batch, rows].
//
// Numerics: each weight is dequantized exactly (e2m1 * 2^(s-127) is exact in f32), multiplied
// by the f32 activation and accumulated in f32: the CPU's exact-float MXFP4 kernel (idot off),
// differing only in summation order.
//
// Work split: one workgroup of 64 invocations per output row; the invocations stride over the
// row's words, each keeping kBatchTile partial sums (one per batch row of the current tile),
// then a shared-memory tree reduces the 64 partials. The weight row is read from memory once
// per batch tile. Rows map to workgroups as gl_WorkGroupID.y * gl_NumWorkGroups.x +
// gl_WorkGroupID.x, so the host can split more than 65535 rows over two dimensions.
#version 450

layout(local_size_x = 64, local_size_y = 1, local_size_z = 1) in;

layout(std430, set = 0, binding = 0) readonly buffer Weights { uint w[]; };
layout(std430, set = 0, binding = 1) readonly buffer Scales { float scales[]; };
layout(std430, set = 0, binding = 2) readonly buffer Activations { vec4 x[]; };
layout(std430, set = 0, binding = 3) writeonly buffer Outputs { float y[]; };

layout(push_constant) uniform Params {
  uint rows;
  uint cols;
  uint batch;
} p;

const uint kThreads = 64;
const uint kBatchTile = 8;

const float kE2m1[16] = float[16](0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0,
                                  -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0);

shared float partial[kBatchTile][kThreads];

void main() {
  const uint row = gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x;
  if (row >= p.rows) {
    return;  // the whole workgroup leaves together: no barrier is skipped by half of it
  }
  const uint t = gl_LocalInvocationID.x;
  const uint words = p.cols / 8;   // words per weight row
  const uint groups = p.cols / 32; // scales per weight row
  const uint x_vec4s = p.cols / 4; // vec4s per activation row
  const uint w_base = row * words;
  const uint s_base = row * groups;

  for (uint b0 = 0; b0 < p.batch; b0 += kBatchTile) {
    const uint tile = min(kBatchTile, p.batch - b0);
    float acc[kBatchTile];
    for (uint j = 0; j < kBatchTile; ++j) {
      acc[j] = 0.0;
    }
    for (uint k = t; k < words; k += kThreads) {
      const uint packed = w[w_base + k];
      const float s = scales[s_base + k / 4];
      const vec4 lo = vec4(kE2m1[packed & 15u], kE2m1[(packed >> 4) & 15u],
                           kE2m1[(packed >> 8) & 15u], kE2m1[(packed >> 12) & 15u]) * s;
      const vec4 hi = vec4(kE2m1[(packed >> 16) & 15u], kE2m1[(packed >> 20) & 15u],
                           kE2m1[(packed >> 24) & 15u], kE2m1[packed >> 28]) * s;
      for (uint j = 0; j < tile; ++j) {
        const uint xi = (b0 + j) * x_vec4s + 2 * k;
        acc[j] += dot(lo, x[xi]) + dot(hi, x[xi + 1]);
      }
    }
    for (uint j = 0; j < kBatchTile; ++j) {
      partial[j][t] = acc[j];
    }
    barrier();
    for (uint stride = kThreads / 2; stride > 0; stride /= 2) {
      if (t < stride) {
        for (uint j = 0; j < tile; ++j) {
          partial[j][t] += partial[j][t + stride];
        }
      }
      barrier();
    }
    if (t < tile) {
      y[(b0 + t) * p.rows + row] = partial[t][0];
    }
    barrier();  // partial[] is rewritten by the next tile
  }
}
