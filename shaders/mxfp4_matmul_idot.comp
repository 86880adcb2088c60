// shaders/mxfp4_matmul_idot.comp: y[b, r] = Σ_c W[r, c]·x[b, c] for an MXFP4 weight matrix W
// (rows × cols, cols % 32 == 0) with int8 activations, reproducing the CPU's integer-dot kernel
// (common/kernels Matmul(idot = true), matmul_scalar.cc Mxfp4IdotScalar) bit for bit.
//
// Layouts:
//   w      uint words as mxfp4_matmul.comp (row r: cols/8 words, column 8k+i in bits 4i..4i+3
//          of word k, e2m1 codes).
//   scales the UE8M0 exponents widened on upload to f32 bits s << 23; read as bits (s = bits>>23).
//   x      per batch row, cols/4 + cols/32 words: the int8 codes (byte c = column c, as
//          kernels::QuantizeActivationsInt8Groups makes them on the host), then per 32-group the
//          f32 bits of 0.5·xscale (computed on the host exactly as the CPU does).
//   y      f32 bits [batch, rows].
//
// Numerics (kernels.h "Numerics"): lane 4j + i of each 128-column block takes group g ≡ j
// (mod 4), columns 8i..8i+7: dot = Σ doubled-e2m1 · code (exact int32), then
// lane = fma(dot, 2^(s−127)·(0.5·xscale), lane) in group order; the 16 lanes are reduced by the
// fixed tree (l, l+8), (l, l+4), (l, l+2), (l, l+1). Vulkan does not promise that GLSL's fma is
// fused (GLSL.std.450 Fma is "inherited from OpFMul followed by OpFAdd"; VK_KHR_shader_fma exists
// for that reason), and devices may flush subnormals, so every floating-point step here is done
// in integers: the exact value is formed in 64 bits and rounded once to f32, ties to even, with
// subnormals and overflow as IEEE 754 (RoundToF32). The result is then the CPU's whatever the
// driver does with floats. NaN results are produced as NaN (their payload bits are not the CPU's).
//
// Work split: a workgroup of 64 invocations computes 4 rows; invocation 16·k + lane computes lane
// `lane` of row 4·wg + k for a tile of up to 8 batch rows, each weight word read once per tile;
// after a barrier, invocation `lane` < tile of each row reduces batch row b0 + lane's 16 lanes.
// Workgroup w = gl_WorkGroupID.y · gl_NumWorkGroups.x + gl_WorkGroupID.x (the host splits more
// than 65535 workgroups over two dimensions).
#version 450
#extension GL_EXT_shader_explicit_arithmetic_types_int64 : require

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
const uint kInf = 0x7f800000u;
const uint kNaN = 0x7fc00000u;
const uint kAbs = 0x7fffffffu;

// Doubled e2m1 values (exact integers), as the CPU's kE2m1Doubled.
const int kE2m1Doubled[16] = int[16](0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12);

shared uint lanes[kRowsPerGroup][kBatchTile][kLanes];

int Msb64(uint64_t m) {
  const uint hi = uint(m >> 32);
  return hi != 0u ? 32 + findMSB(hi) : findMSB(uint(m));
}

// The f32 (bits) nearest to (−1)^sign · m · 2^e for 0 < m < 2^63: ties to even, subnormal
// results kept, overflow to infinity.
uint RoundToF32(uint sign, uint64_t m, int e) {
  const int top = Msb64(m) + e;       // exponent of m's leading bit
  const int q = max(top - 23, -149);  // exponent of the result's last significand bit
  const int drop = q - e;             // bits of m below it
  uint64_t kept;
  if (drop <= 0) {
    kept = m << uint(-drop);  // exact (at most 23 bits of shift)
  } else if (drop >= 64) {
    kept = 0;  // m < 2^63 ≤ half of 2^drop: rounds to zero
  } else {
    kept = m >> uint(drop);
    const uint64_t rest = m - (kept << uint(drop));
    const uint64_t tie = uint64_t(1) << uint(drop - 1);
    if (rest > tie || (rest == tie && (kept & 1) != 0)) kept += 1;
  }
  // kept·2^q with kept ≤ 2^24: the bits are ((q + 149) << 23) + kept, a carry into 2^24 or a
  // subnormal reaching 2^23 landing on the next exponent by itself; past the largest finite: inf.
  const uint64_t bits = (uint64_t(q + 149) << 23) + kept;
  return (sign << 31) | uint(min(bits, uint64_t(kInf)));
}

// A finite f32's magnitude as m · 2^e (m < 2^24).
void Decode(uint bits, out uint64_t m, out int e) {
  const uint field = (bits >> 23) & 255u;
  const uint frac = bits & 0x7fffffu;
  if (field == 0u) {
    m = uint64_t(frac);
    e = -149;
  } else {
    m = uint64_t(frac | 0x800000u);
    e = int(field) - 150;
  }
}

// IEEE fma(d, s, c) when s or c is infinite or NaN.
uint FmaSpecial(int d, uint s, uint c) {
  if ((s & kAbs) > kInf || (c & kAbs) > kInf) return kNaN;
  if ((s & kAbs) == kInf) {
    if (d == 0) return kNaN;  // 0 · inf
    const uint product = ((((d < 0) ? 1u : 0u) ^ (s >> 31)) << 31) | kInf;
    if ((c & kAbs) == kInf && c != product) return kNaN;  // inf − inf
    return product;
  }
  return c;  // finite product + infinite c
}

// fma(float(d), s, c) rounded once, as std::fma on the CPU (f32 bits in and out; |d| < 2^24).
uint Fma(int d, uint s, uint c) {
  if ((s & kInf) == kInf || (c & kInf) == kInf) return FmaSpecial(d, s, c);
  uint64_t sm, cm;
  int se, ce;
  Decode(s, sm, se);
  Decode(c, cm, ce);
  const uint p_sign = ((d < 0) ? 1u : 0u) ^ (s >> 31);
  const uint c_sign = c >> 31;
  const uint64_t pm = uint64_t(abs(d)) * sm;  // exact: < 2^48
  if (pm == 0) {
    // A signed zero product: c, unless c is zero too (−0 only when both are −0).
    return cm == 0 ? ((p_sign & c_sign) << 31) : c;
  }
  if (cm == 0) return RoundToF32(p_sign, pm, se);
  // The larger magnitude A gets its leading bit at bit 61; the smaller B is shifted to A's scale.
  // B loses bits only when its leading bit lies over 14 binades below A's (|d| < 2^24); then
  // A ± B keeps its leading bit at 60 or 61 and rounds at bit 37 or above, so the lost bits can
  // only decide a tie: jammed into bit 0 as a sticky bit, they do exactly that.
  const int p_top = Msb64(pm) + se, c_top = Msb64(cm) + ce;
  uint64_t am = pm, bm = cm;
  int ae = se, be = ce;
  uint a_sign = p_sign, b_sign = c_sign;
  if (c_top > p_top) {
    am = cm;
    ae = ce;
    a_sign = c_sign;
    bm = pm;
    be = se;
    b_sign = p_sign;
  }
  const int a_shift = 61 - Msb64(am);
  am <<= uint(a_shift);
  ae -= a_shift;
  const int k = ae - be;
  if (k <= 0) {
    bm <<= uint(-k);  // its leading bit stays at or below bit 61
  } else if (k >= 64) {
    bm = 1;
  } else {
    const uint64_t shifted = bm >> uint(k);
    bm = shifted | (((shifted << uint(k)) != bm) ? 1 : 0);
  }
  uint sign;
  uint64_t r;
  if (a_sign == b_sign) {
    r = am + bm;  // < 2^63
    sign = a_sign;
  } else if (am >= bm) {
    r = am - bm;
    sign = a_sign;
  } else {
    r = bm - am;
    sign = b_sign;
  }
  if (r == 0) return 0u;  // exact cancellation: +0 when rounding to nearest
  return RoundToF32(sign, r, ae);
}

uint Add(uint a, uint b) { return Fma(1, a, b); }

// The CPU's group scale E8m0(s) · (0.5·xscale), h = the bits of 0.5·xscale: s = 0 is +0,
// s = 255 is inf, otherwise 2^(s−127), and the product rounded once.
uint GroupScale(uint s, uint h) {
  const uint h_sign = h >> 31;
  const uint h_abs = h & kAbs;
  if (h_abs > kInf) return kNaN;
  if (s == 0u) return h_abs == kInf ? kNaN : (h_sign << 31);
  if (s == 255u) return h_abs == 0u ? kNaN : ((h_sign << 31) | kInf);
  if (h_abs == kInf || h_abs == 0u) return h;
  uint64_t m;
  int e;
  Decode(h, m, e);
  return RoundToF32(h_sign, m, e + int(s) - 127);
}

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
        const uint s = scale_bits[row * groups + g] >> 23;
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
          acc[k] = Fma(dot, GroupScale(s, x[xb + code_words + g]), acc[k]);
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
      for (uint l = 0; l < 8u; ++l) {
        r[l] = Add(r[l], r[l + 8u]);
      }
      for (uint l = 0; l < 4u; ++l) {
        r[l] = Add(r[l], r[l + 4u]);
      }
      for (uint l = 0; l < 2u; ++l) {
        r[l] = Add(r[l], r[l + 2u]);
      }
      y[(b0 + lane) * p.rows + row] = Add(r[0], r[1]);
    }
    barrier();  // lanes[] is rewritten by the next tile
  }
}
