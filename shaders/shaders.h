// shaders: SPIR-V modules of the compute shaders in this folder, compiled by glslangValidator at
// build time and embedded in the binary (never read from disk at run time).
//
//   std::span<const uint32_t> code = coli::shaders::Mxfp4MatmulSpirv();
//   VkShaderModuleCreateInfo info{..., .codeSize = code.size_bytes(), .pCode = code.data()};
#ifndef COLI_SHADERS_SHADERS_H_
#define COLI_SHADERS_SHADERS_H_

#include <cstdint>
#include <span>

namespace coli::shaders {

// mxfp4_matmul.comp: y[b, r] = sum_c W[r, c] * x[b, c], MXFP4 W with f32 group scales, f32 x.
// Bindings 0 weights (uint), 1 scales (f32), 2 x (f32), 3 y (f32); push constants
// {uint rows, cols, batch}; workgroup size 64, one workgroup per output row.
std::span<const uint32_t> Mxfp4MatmulSpirv();

// mxfp4_matmul_idot.comp: the same product with int8 activations per 32 columns, the CPU's
// kernels::Matmul(idot = true) bit for bit. Bindings 0 weights (uint), 1 scales (f32 bits
// s << 23), 2 activations (per batch row: cols/4 words of int8 codes, then cols/32 f32 bits of
// 0.5·xscale), 3 y (f32 bits); push constants {uint rows, cols, batch}; workgroup size 64, four
// output rows per workgroup. Declares the Int64 capability (the device's shaderInt64).
std::span<const uint32_t> Mxfp4MatmulIdotSpirv();

// situ_glu.comp: out[i] = β1·tanh(g[i]/β1)·σ(g[i]) · β2·tanh(u[i]/β2) (Kimi K3 SiTU-GLU, f32).
// Bindings 0 g, 1 u (f32), 2 out (f32); push constants {uint n; float beta1, beta2};
// workgroup size 64, grid-stride over n.
std::span<const uint32_t> SituGluSpirv();

// dense_matmul.comp, one module per weight format (FORMAT 0, 1, 2): y[b, r] = sum_c W[r, c]·x[b, c]
// for f32, int8 per-row and int4-g64 W (kernels.h layouts), f32 x. Bindings and push constants
// as mxfp4_matmul (0 weights as uint words, 1 scales f32 — unused for f32 —, 2 x, 3 y;
// {rows, cols, batch}); workgroup size 64, one workgroup per output row.
std::span<const uint32_t> DenseMatmulF32Spirv();
std::span<const uint32_t> DenseMatmulInt8Spirv();
std::span<const uint32_t> DenseMatmulInt4Spirv();

// dense_matmul_idot.comp, FORMAT 1 (int8 per row) and 2 (int4-g64): the same products with int8
// activations per 64 columns, the CPU's kernels::Matmul(idot = true) bit for bit. Bindings 0
// weights (uint), 1 scales (f32 bits), 2 activations (per batch row: ceil(cols/4) words of int8
// codes, then ceil(cols/64) f32 bits of the group scales), 3 y (f32 bits); push constants
// {rows, cols, batch}; workgroup size 64, four output rows per workgroup. Declares the Int64
// capability (the device's shaderInt64).
std::span<const uint32_t> DenseMatmulIdotInt8Spirv();
std::span<const uint32_t> DenseMatmulIdotInt4Spirv();

}  // namespace coli::shaders

#endif  // COLI_SHADERS_SHADERS_H_
