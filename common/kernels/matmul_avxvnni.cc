// AVX-VNNI kernels (AVX2 + FMA + the VEX-encoded vpdpbusd of Intel Alder Lake and later and AMD
// Zen 5): the AVX2 kernels of matmul_avx2_kernels.inc with each integer partial dot done by
// vpdpbusd instead of vpmaddubsw + vpmaddwd. Same exact int32 dots, so the same bits.
#define COLI_SIMD_TARGET "avx2,fma,avxvnni"
#define COLI_SIMD_VNNI 1
#define COLI_SIMD_KERNELS AvxVnniKernels
#include "common/kernels/matmul_avx2_kernels.inc"
