/* SPDX-License-Identifier: Apache-2.0 */
/* rmsnorm_gated.cuh - the arithmetic of the gated RMSNorm (rmsnorm_gated.h)
 * for a row held 8 bf16 values a lane, shared by the norm's own kernels
 * (rmsnorm_gated.cu) and the one that quantises its output for an FP8
 * projection (fp8_block.cu), so that both give the same bits. */
#ifndef HS_KN_RMSNORM_GATED_CUH
#define HS_KN_RMSNORM_GATED_CUH

#include <cuda_bf16.h>
#include <stdint.h>

/* One output value: w * (x * r) * silu(z), silu as the conv and SwiGLU take
 * it (swiglu.cuh): __fdividef. */
__device__ __forceinline__ float hs_gated_out(float x, float r, float w, float z)
{
    return (w * (x * r)) * __fdividef(z, 1.f + __expf(-z));
}

/* 1 / sqrt(mean(x^2) + eps) of a row of dim values held 8 a lane (the 16
 * bytes xu) by L lanes: each lane's squares in order, then a butterfly over
 * the L lanes (every lane of the warp calls it; lanes past the row hold
 * zeros). The order hs_warp_row_rrms sums in, term for term. */
template <int L> __device__ __forceinline__ float hs_gated_row_rrms(uint4 xu, int dim, float eps)
{
    const __nv_bfloat16 *xe = (const __nv_bfloat16 *)&xu;
    float ss = 0.f;
#pragma unroll
    for (int j = 0; j < 8; j++) {
        float f = __bfloat162float(xe[j]);
        ss += f * f;
    }
#pragma unroll
    for (int o = L / 2; o > 0; o >>= 1)
        ss += __shfl_xor_sync(0xffffffffu, ss, o, L);
    return rsqrtf(ss / (float)dim + eps);
}

/* The 8 outputs of a lane, rounded to bf16. */
__device__ __forceinline__ uint4 hs_gated_out8(uint4 xu, uint4 zu, uint4 wu, float r)
{
    const __nv_bfloat16 *xe = (const __nv_bfloat16 *)&xu, *ze = (const __nv_bfloat16 *)&zu,
                        *we = (const __nv_bfloat16 *)&wu;
    uint4 o;
    __nv_bfloat16 *oe = (__nv_bfloat16 *)&o;
#pragma unroll
    for (int j = 0; j < 8; j++)
        oe[j] = __float2bfloat16(hs_gated_out(__bfloat162float(xe[j]), r, __bfloat162float(we[j]),
                                              __bfloat162float(ze[j])));
    return o;
}

#endif /* HS_KN_RMSNORM_GATED_CUH */
