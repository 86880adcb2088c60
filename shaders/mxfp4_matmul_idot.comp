// shaders/mxfp4_matmul_idot.comp: y[b, r] = Σ_c W[r, c]·x[b, c] for an MXFP4 weight matrix W
// (rows × cols, cols % 32 == 0) with int8 activations, reproducing the CPU's integer-dot kernel
// (common/kernels Matmul(idot = true), matmul_scalar.cc Mxfp4IdotScalar) bit for bit.
//
// Layouts:
//   w      uint words as mxfp4_matmul.comp (row r: cols/8 words, column 8k+i in bits 4i..4i+3
//          of word k, e2m1 codes).
//   scales the UE8M0 exponents widened on upload to f32 bits s << 23 (2^(s−127), 0 and inf at
//          s = 0 and 255, as the CPU decodes them); read as bits.
//   x      per batch row, cols/4 + cols/32 words: the int8 codes (byte c = column c, as
//          kernels::QuantizeActivationsInt8Groups makes them on the host), then per 32-group the
//          f32 bits of 0.5·xscale (computed on the host exactly as the CPU does).
//   y      f32 bits [batch, rows].
//
// Numerics (kernels.h "Numerics"): lane 4j + i of each 128-column block takes group g ≡ j
// (mod 4), columns 8i..8i+7: dot = Σ doubled-e2m1 · code (exact int32), then
// lane = fma(dot, 2^(s−127)·(0.5·xscale), lane) in group order; the 16 lanes are reduced by the
// fixed tree (l, l+8), (l, l+4), (l, l+2), (l, l+1). Every floating-point step (the group
// scale product, each fma, each tree addition) is done in integers by idot_float.glsl, so the
// result is the CPU's whatever the driver does with floats (NaN results are NaN, not the CPU's
// payload bits).
//
// Work split: a workgroup of 64 invocations computes 4 rows; invocation 16·k + lane computes lane
// `lane` of row 4·wg + k for a tile of up to 8 batch rows, each weight word read once per tile;
// after a barrier, invocation `lane` < tile of each row reduces batch row b0 + lane's 16 lanes.
// Workgroup w = gl_WorkGroupID.y · gl_NumWorkGroups.x + gl_WorkGroupID.x (the host splits more
// than 65535 workgroups over two dimensions).
#version 450
#extension GL_EXT_shader_explicit_arithmetic_types_int64 : require
#extension GL_GOOGLE_include_directive : require

#include "idot_float.glsl"

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
// Doubled e2m1 values (exact integers), as the CPU's kE2m1Doubled.
const int kE2m1Doubled[16] = int[16](0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12);

shared uint lanes[kRowsPerGroup][kBatchTile][kLanes];

void main() {
  const uint t = gl_LocalInvocationID.x;
  const uint sub = t / kLanes;
  const uint lane = t % kLanes;
  const uint group_id = gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x;
  const uint row = group_id * kRowsPerGroup + sub;
  // Rows past the end still take part in the barriers.
  const bool valid = row < p.rows;
  const uint words = p.cols / 8u;
  const uint groups = p.cols / 32u;
  const uint code_words = p.cols / 4u;
  const uint x_stride = code_words + groups;
  const uint j = lane / 4u;  // groups j, j + 4, j + 8, ...
  const uint i = lane % 4u;  // columns 8i..8i+7 of each

  for (uint b0 = 0; b0 < p.batch; b0 += kBatchTile) {
    const uint tile = min(kBatchTile, p.batch - b0);
    uint acc[kBatchTile];
    for (uint k = 0; k < kBatchTile; ++k) {
      acc[k] = 0u;
    }
    if (valid) {
      for (uint g = j; g < groups; g += 4u) {
        const uint packed = w[row * words + g * 4u + i];
        // The group scale E8m0(s)·(0.5·xscale), rounded once as the CPU's product.
        const uint s_bits = scale_bits[row * groups + g];
        int wd[8];
        for (uint n = 0; n < 8u; ++n) {
          wd[n] = kE2m1Doubled[(packed >> (4u * n)) & 15u];
        }
        for (uint k = 0; k < tile; ++k) {
          const uint xb = (b0 + k) * x_stride;
          const int lo = int(x[xb + g * 8u + 2u * i]);
          const int hi = int(x[xb + g * 8u + 2u * i + 1u]);
          int dot = 0;
          for (int n = 0; n < 4; ++n) {
            dot += wd[n] * bitfieldExtract(lo, 8 * n, 8);
            dot += wd[n + 4] * bitfieldExtract(hi, 8 * n, 8);
          }
          acc[k] = Fma(dot, Mul(s_bits, x[xb + code_words + g]), acc[k]);
        }
      }
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
      y[(b0 + lane) * p.rows + row] = ReduceLanes16(r);
    }
    barrier();  // lanes[] is rewritten by the next tile
  }
}
