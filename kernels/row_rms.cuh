/* SPDX-License-Identifier: Apache-2.0 */
/* row_rms.cuh - the reduction every RMSNorm kernel starts with, for one
 * bf16 row read by one warp: 1 / sqrt(mean(x^2) + eps), in fp32, the same
 * value on every lane. VEC: 16-byte loads (dim and the row's address
 * multiples of 8 elements). One summation order for every norm, so a
 * plain, zero-centred and gated norm of the same row see the same rms. */
#ifndef HS_ROW_RMS_CUH
#define HS_ROW_RMS_CUH

#include <cuda_bf16.h>
#include <stdint.h>

template <bool VEC>
__device__ __forceinline__ float hs_warp_row_rrms(const __nv_bfloat16 *xr, int dim, float eps,
                                                  int lane)
{
    float ss = 0.f;
    if (VEC) {
        for (int i = lane * 8; i < dim; i += 256) {
            uint4 u = *(const uint4 *)(xr + i);
            const __nv_bfloat16 *e = (const __nv_bfloat16 *)&u;
#pragma unroll
            for (int j = 0; j < 8; j++) {
                float f = __bfloat162float(e[j]);
                ss += f * f;
            }
        }
    } else {
        for (int i = lane; i < dim; i += 32) {
            float f = __bfloat162float(xr[i]);
            ss += f * f;
        }
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        ss += __shfl_xor_sync(0xffffffffu, ss, o);
    return rsqrtf(ss / (float)dim + eps);
}

#endif /* HS_ROW_RMS_CUH */
