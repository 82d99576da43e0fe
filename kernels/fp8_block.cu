/* SPDX-License-Identifier: Apache-2.0 */
/* fp8_block.cu - activations to e4m3 per token and group of 128 columns on
 * the GPU (see fp8_block.h), before each FP8 GEMM.
 *
 * One warp per (token, group): each lane reads 4 of the group's 128 bf16
 * values (coalesced), a shuffle reduction gives the amax and whether any
 * value is not finite, lane 0 writes the factor (hs_fp8_act_scale_index), and
 * every lane writes its bytes. Memory-bound: 2 bytes read and 1 written per
 * value, plus 4 bytes a group. __fdiv_rn keeps the division IEEE (no fast
 * path), so the bytes are those of the C twin. */
#include <cuda_runtime.h>
#include <stdint.h>

#include "fp8_block.h"

#define WARPS 4

__global__ void fp8_quant_groups_kernel(const uint16_t *__restrict__ x, int64_t ldx, int M, int K,
                                        int G, uint8_t *__restrict__ q, int64_t ldq,
                                        float *__restrict__ scales)
{
    int64_t w = (int64_t)blockIdx.x * WARPS + threadIdx.x / 32;
    int lane = threadIdx.x % 32;
    if (w >= (int64_t)M * G) return; /* whole warps leave together */
    int m = (int)(w / G), g = (int)(w % G);
    const uint16_t *xr = x + (int64_t)m * ldx;
    uint8_t *qr = q + (int64_t)m * ldq;
    float v[4], amax = 0.f;
    int nonfinite = 0;
#pragma unroll
    for (int j = 0; j < 4; j++) {
        int k = g * HS_FP8_BLOCK + j * 32 + lane;
        uint16_t b = k < K ? xr[k] : 0;
        nonfinite |= (b & 0x7fffu) >= 0x7f80u;
        v[j] = hs_bf16_bits_to_f32(b);
        amax = fmaxf(amax, fabsf(v[j]));
    }
    for (int off = 16; off > 0; off >>= 1) {
        amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, off));
        nonfinite |= __shfl_xor_sync(0xffffffffu, nonfinite, off);
    }
    float s = nonfinite    ? __int_as_float(0x7fc00000)
              : amax > 0.f ? __fdiv_rn(amax, HS_FP8_MAX)
                           : 1.f;
    if (lane == 0) scales[hs_fp8_act_scale_index(g, m, M, G)] = s;
#pragma unroll
    for (int j = 0; j < 4; j++) {
        int k = g * HS_FP8_BLOCK + j * 32 + lane;
        if (k < K) qr[k] = nonfinite ? 0 : hs_fp8_from_f32(__fdiv_rn(v[j], s));
    }
}

extern "C" hs_status_t hs_kn_fp8_quant_groups(const uint16_t *x, int64_t ldx, int M, int K,
                                              uint8_t *q, int64_t ldq, float *scales,
                                              cudaStream_t stream)
{
    if (M < 0 || K < 1 || ldx < K || ldq < K) {
        hs_error("fp8 quant groups: bad shape M=%d K=%d ldx=%lld ldq=%lld", M, K, (long long)ldx,
                 (long long)ldq);
        return HS_ERR_INVALID;
    }
    if (M == 0) return HS_OK;
    int G = (int)hs_fp8_blocks(K);
    int64_t blocks = ((int64_t)M * G + WARPS - 1) / WARPS;
    if (blocks > 2147483647) {
        hs_error("fp8 quant groups: %d x %d groups exceed one launch", M, G);
        return HS_ERR_INVALID;
    }
    fp8_quant_groups_kernel<<<(unsigned)blocks, WARPS * 32, 0, stream>>>(x, ldx, M, K, G, q, ldq,
                                                                         scales);
    return cudaGetLastError() == cudaSuccess ? HS_OK : HS_ERR_CUDA;
}
