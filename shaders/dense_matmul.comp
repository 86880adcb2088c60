// shaders/dense_matmul.comp: y[b, r] = sum_c W[r, c] * x[b, c] for the dense weight formats the
// CPU keeps Kimi K3's shared experts in (common/kernels/kernels.h MatrixView), f32 activations
// x (batch x cols). Compiled three times (shaders/CMakeLists.txt), FORMAT selecting the layout:
//   FORMAT 0, f32:      w = float[rows*cols] (read as uint words, uintBitsToFloat).
//   FORMAT 1, int8 row: w = int8[rows*cols] read as little-endian uint words (column c of row r
//                       is byte r*cols + c, any cols), scales = float[rows]; y = s_r · Σ q·x.
//   FORMAT 2, int4-g64: w = uint8[rows*cols/2], biased nibbles (value n - 8), low nibble = even
//                       column, read as uint words (column 8k+i in bits 4i..4i+3 of word k of
//                       the row; cols % 64 == 0, so rows start on words), scales =
//                       float[rows*cols/64]; y = Σ ((n - 8)·s_g)·x.
// These are the CPU's exact-float kernels' formulas (idot off, K3_IDOT=0): each weight is
// dequantized exactly in f32; only the summation order differs.
//
// Work split as mxfp4_matmul.comp: one workgroup of 64 invocations per output row (rows past
// 65535 spill into gl_WorkGroupID.y), each invocation striding over the row and keeping
// kBatchTile partial sums (one per batch row of the tile), then a shared-memory tree reduction.
// The weight row is read once per batch tile (decode passes have at most a few rows: one tile).
// Binding 1 is unused by FORMAT 0 (the host binds the weights there).
#version 450

#ifndef FORMAT
#error "FORMAT must be defined (0 f32, 1 int8 per row, 2 int4-g64)"
#endif

layout(local_size_x = 64, local_size_y = 1, local_size_z = 1) in;

layout(std430, set = 0, binding = 0) readonly buffer Weights { uint w[]; };
layout(std430, set = 0, binding = 1) readonly buffer Scales { float scales[]; };
layout(std430, set = 0, binding = 2) readonly buffer Activations { float x[]; };
layout(std430, set = 0, binding = 3) writeonly buffer Outputs { float y[]; };

layout(push_constant) uniform Params {
  uint rows;
  uint cols;
  uint batch;
} p;

const uint kThreads = 64;
const uint kBatchTile = 8;

shared float partial[kBatchTile][kThreads];

void main() {
  const uint row = gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x;
  if (row >= p.rows) {
    return;  // the whole workgroup leaves together: no barrier is skipped by half of it
  }
  const uint t = gl_LocalInvocationID.x;

  for (uint b0 = 0; b0 < p.batch; b0 += kBatchTile) {
    const uint tile = min(kBatchTile, p.batch - b0);
    float acc[kBatchTile];
    for (uint j = 0; j < kBatchTile; ++j) {
      acc[j] = 0.0;
    }
#if FORMAT == 2
    const uint words = p.cols / 8;  // 8 columns per word
    const uint w_base = row * words;
    const uint s_base = row * (p.cols / 64);
    for (uint k = t; k < words; k += kThreads) {
      const uint packed = w[w_base + k];
      const float s = scales[s_base + k / 8];
      float wv[8];
      for (uint i = 0; i < 8; ++i) {
        wv[i] = float(int((packed >> (4 * i)) & 15u) - 8) * s;
      }
      for (uint j = 0; j < tile; ++j) {
        const uint xi = (b0 + j) * p.cols + 8 * k;
        float sum = 0.0;
        for (uint i = 0; i < 8; ++i) {
          sum += wv[i] * x[xi + i];
        }
        acc[j] += sum;
      }
    }
#else
    const uint base = row * p.cols;
    for (uint c = t; c < p.cols; c += kThreads) {
      const uint i = base + c;
#if FORMAT == 1
      const float wv = float(bitfieldExtract(int(w[i >> 2]), int((i & 3u) * 8u), 8));
#else
      const float wv = uintBitsToFloat(w[i]);
#endif
      for (uint j = 0; j < tile; ++j) {
        acc[j] += wv * x[(b0 + j) * p.cols + c];
      }
    }
#endif
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
#if FORMAT == 1
      y[(b0 + t) * p.rows + row] = scales[row] * partial[t][0];
#else
      y[(b0 + t) * p.rows + row] = partial[t][0];
#endif
    }
    barrier();  // partial[] is rewritten by the next tile
  }
}
