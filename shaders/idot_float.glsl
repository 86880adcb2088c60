// shaders/idot_float.glsl: IEEE 754 binary32 multiply and fma done in integers, included by the
// integer-dot shaders (mxfp4_matmul_idot.comp, dense_matmul_idot.comp) so that they reproduce
// the CPU's kernels::Matmul(idot = true) bit for bit on any driver. Floats travel as their bits
// (uint). Needs GL_EXT_shader_explicit_arithmetic_types_int64 (the device's shaderInt64),
// enabled by the includer.
//
// Why integers: Vulkan does not promise that GLSL's fma is fused (GLSL.std.450 Fma is
// "inherited from OpFMul followed by OpFAdd"; VK_KHR_shader_fma exists for that reason), and
// devices may flush subnormals. Here every result is formed exactly in 64 bits and rounded once
// to f32, ties to even, with subnormals and overflow as IEEE 754 (RoundToF32). NaN results are
// produced as NaN (their payload bits are not the CPU's).

const uint kInf = 0x7f800000u;
const uint kNaN = 0x7fc00000u;
const uint kAbs = 0x7fffffffu;

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

// IEEE a · b, rounded once (f32 bits in and out).
uint Mul(uint a, uint b) {
  const uint sign = (a ^ b) >> 31;
  const uint a_abs = a & kAbs, b_abs = b & kAbs;
  if (a_abs > kInf || b_abs > kInf) return kNaN;
  if (a_abs == kInf || b_abs == kInf) {
    return (a_abs == 0u || b_abs == 0u) ? kNaN : ((sign << 31) | kInf);  // 0 · inf is NaN
  }
  if (a_abs == 0u || b_abs == 0u) return sign << 31;
  uint64_t am, bm;
  int ae, be;
  Decode(a, am, ae);
  Decode(b, bm, be);
  return RoundToF32(sign, am * bm, ae + be);  // the exact product: < 2^48
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

// The CPU's fixed 16-lane reduction tree (common/kernels internal.h ReduceLanes16):
// (l, l+8), then (l, l+4), (l, l+2), (l, l+1).
uint ReduceLanes16(uint r[16]) {
  for (uint l = 0; l < 8u; ++l) {
    r[l] = Add(r[l], r[l + 8u]);
  }
  for (uint l = 0; l < 4u; ++l) {
    r[l] = Add(r[l], r[l + 4u]);
  }
  for (uint l = 0; l < 2u; ++l) {
    r[l] = Add(r[l], r[l + 2u]);
  }
  return Add(r[0], r[1]);
}
