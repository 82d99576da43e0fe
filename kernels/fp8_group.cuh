/* SPDX-License-Identifier: Apache-2.0 */
/* fp8_group.cuh - one activation group to e4m3 on the GPU, as the C twin
 * does it (fp8_block.h): factor s = amax / 448, q = e4m3(v / s), each an
 * IEEE single-precision operation rounded to nearest even. Shared by the
 * quantiser (fp8_block.cu) and the RMSNorm that writes FP8 (rmsnorm.cu),
 * so both give the C twin's bytes.
 *
 * v / s for the values of a group: an IEEE division each is about ten
 * instructions, as much as the rest of the quantiser. The group's divisor
 * is fixed, so its reciprocal y = RN(1/s) is taken once, and then
 *   q = RN(v y),  r = v - s q (exact, one fma),  q' = RN(q + r y)
 * is RN(v / s) (Markstein's theorem: y within half an ulp of 1/s, q within
 * one ulp of v/s, r exact). r is exact unless its low bits fall below
 * 2^-149, which needs |v| below about 2^-103, so |v / s| < 2^-34 when
 * s >= 2^-69: such a quotient is 0 in e4m3 (below 2^-10) either way, with
 * v's sign. A smaller s divides in IEEE. */
#ifndef HS_KN_FP8_GROUP_CUH
#define HS_KN_FP8_GROUP_CUH

#include <cuda_fp8.h>
#include <stdint.h>

#include "hs_float.h"

/* The group's factor: NaN for a group holding a NaN or an infinity (its
 * bytes are then 0), 1 for an all-zero group. */
__device__ __forceinline__ float hs_fp8_group_factor(float amax, int nonfinite)
{
    return nonfinite ? __int_as_float(0x7fc00000) : amax > 0.f ? __fdiv_rn(amax, HS_FP8_MAX) : 1.f;
}

/* The largest |value| of 8 bf16 in a 16-byte word, as bf16 bits: two
 * lanes a SIMD max on the sign-cleared halves (for non-negative floats the
 * bits order as the values; 0x7f80 and up is an infinity or a NaN). */
__device__ __forceinline__ uint32_t hs_bf16x8_absmax_bits(uint4 u)
{
    const uint32_t m = __vmaxu2(__vmaxu2(u.x & 0x7fff7fffu, u.y & 0x7fff7fffu),
                                __vmaxu2(u.z & 0x7fff7fffu, u.w & 0x7fff7fffu));
    return max(m & 0xffffu, m >> 16);
}

/* The max of m over the 16 lanes of this thread's half-warp; every lane of
 * the warp calls it. */
__device__ __forceinline__ uint32_t hs_half_warp_max(uint32_t m)
{
#pragma unroll
    for (int off = 8; off > 0; off >>= 1)
        m = max(m, __shfl_xor_sync(0xffffffffu, m, off));
    return m;
}

/* A group's amax and whether it holds a NaN or an infinity, from the
 * bits hs_bf16x8_absmax_bits and hs_half_warp_max found. */
__device__ __forceinline__ float hs_fp8_group_amax(uint32_t bits, int *nonfinite)
{
    *nonfinite = bits >= 0x7f80u;
    return __uint_as_float(bits << 16);
}

/* RN(1/s) where the reciprocal path is exact for the group, else 0. */
__device__ __forceinline__ float hs_fp8_group_recip(float s)
{
    return s >= 0x1p-69f && s <= 0x1p100f ? __frcp_rn(s) : 0.f;
}

/* RN(v / s), y = hs_fp8_group_recip(s). */
__device__ __forceinline__ float hs_fp8_group_div(float v, float s, float y)
{
    if (y == 0.f) return __fdiv_rn(v, s);
    const float q = __fmul_rn(v, y);
    return __fmaf_rn(__fmaf_rn(-s, q, v), y, q);
}

/* Two values to e4m3 as hs_fp8_from_f32 does (round to nearest even,
 * saturating at +-448), low byte first, in one instruction. */
__device__ __forceinline__ uint32_t hs_fp8x2(float a, float b)
{
    return __nv_cvt_float2_to_fp8x2(make_float2(a, b), __NV_SATFINITE, __NV_E4M3);
}

/* Eight values of a group to eight e4m3 bytes (0 where s is NaN). */
__device__ __forceinline__ uint2 hs_fp8_group_pack8(const float v[8], float s, int nonfinite)
{
    uint2 out = {0u, 0u};
    if (nonfinite) return out;
    const float y = hs_fp8_group_recip(s);
    float d[8];
#pragma unroll
    for (int j = 0; j < 8; j++)
        d[j] = hs_fp8_group_div(v[j], s, y);
    out.x = hs_fp8x2(d[0], d[1]) | hs_fp8x2(d[2], d[3]) << 16;
    out.y = hs_fp8x2(d[4], d[5]) | hs_fp8x2(d[6], d[7]) << 16;
    return out;
}

#endif /* HS_KN_FP8_GROUP_CUH */
