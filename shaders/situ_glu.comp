// shaders/situ_glu.comp: the SiTU-GLU activation of Kimi K3 (spec §3.0), elementwise on f32:
//   out[i] = β1·tanh(g[i]/β1)·σ(g[i]) · β2·tanh(u[i]/β2)      (K3: β1 = 4, β2 = 25)
// g from the gate matrix (W1 z), u from the up matrix (W3 z); the CPU reference is
// common/ops SituGlu (std::tanh, 1/(1+e^-x) in f32).
//
// Numerics: GLSL's tanh is only specified through sinh/cosh, which loses all relative accuracy
// near 0 and may overflow to inf/inf for large arguments on some drivers, so tanh is built here:
//   |x| < 0.3:  the odd Taylor series to x^11 (next term < 2e-9 relative);
//   |x| ≥ 0.3:  1 − 2/(Exp(2|x|) + 1), with |x| clamped to 10 (tanh(10) rounds to 1 in f32),
//               sign restored afterwards.
// σ(x) = 1/(1 + e^{−x}) as the CPU writes it (e^{−x} = inf → 0 for very negative x), with e^x
// from Exp() below rather than GLSL's exp, whose error grows with |x|.
// Measured against the CPU on lavapipe: docs/status/vulkan.md.
//
// Bindings 0 g, 1 u (f32, read), 2 out (f32, written); push constants {uint n; float beta1,
// beta2}. Workgroup 64; a grid-stride loop covers any n with any number of workgroups.
#version 450

layout(local_size_x = 64, local_size_y = 1, local_size_z = 1) in;

layout(std430, set = 0, binding = 0) readonly buffer Gate { float g[]; };
layout(std430, set = 0, binding = 1) readonly buffer Up { float u[]; };
layout(std430, set = 0, binding = 2) writeonly buffer Out { float o[]; };

layout(push_constant) uniform Params {
  uint n;
  float beta1;
  float beta2;
} p;

// e^x to about 1 ulp (GLSL's exp may be off by 3 + 2|x| ulp, 60+ ulp at |x| = 30): Cody–Waite
// reduction x = k·ln2 + r, |r| ≤ ln2/2, with ln2 split in a 16-bit head (k·head is exact) and
// tail; e^r by its Taylor polynomial to r^8 (next term < 1e-9 relative); 2^k by ldexp. x is
// clamped to [−104, 89]: below, the result is under the smallest f32 subnormal; above, inf.
float Exp(float x) {
  const float xc = clamp(x, -104.0, 89.0);
  const float k = round(xc * 1.44269504088896341);
  precise float r = xc - k * 0.693145751953125;
  r = r - k * 1.42860682030941723212e-6;
  float p = 1.0 / 40320.0;
  p = p * r + 1.0 / 5040.0;
  p = p * r + 1.0 / 720.0;
  p = p * r + 1.0 / 120.0;
  p = p * r + 1.0 / 24.0;
  p = p * r + 1.0 / 6.0;
  p = p * r + 0.5;
  p = p * r + 1.0;
  p = p * r + 1.0;
  // ldexp in two halves so 2^k never overflows on its own for k in [−150, 129].
  const int ki = int(k);
  const int k1 = ki / 2;
  return ldexp(ldexp(p, k1), ki - k1);
}

float Tanh(float x) {
  const float a = abs(x);
  if (a < 0.3) {
    const float x2 = x * x;
    // x·(1 − x²/3 + 2x⁴/15 − 17x⁶/315 + 62x⁸/2835 − 1382x¹⁰/155925), Horner in x².
    float s = -1382.0 / 155925.0;
    s = s * x2 + 62.0 / 2835.0;
    s = s * x2 - 17.0 / 315.0;
    s = s * x2 + 2.0 / 15.0;
    s = s * x2 - 1.0 / 3.0;
    return x + x * (s * x2);
  }
  const float e = Exp(2.0 * min(a, 10.0));
  return sign(x) * (1.0 - 2.0 / (e + 1.0));
}

void main() {
  const uint stride = gl_NumWorkGroups.x * 64u;
  for (uint i = gl_GlobalInvocationID.x; i < p.n; i += stride) {
    const float gi = g[i];
    const float ui = u[i];
    const float gate = p.beta1 * Tanh(gi / p.beta1) * (1.0 / (1.0 + Exp(-gi)));
    const float up = p.beta2 * Tanh(ui / p.beta2);
    o[i] = gate * up;
  }
}
