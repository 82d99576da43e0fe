/* SPDX-License-Identifier: Apache-2.0 */
/* conv1d.cu - Gated DeltaNet's depthwise causal conv1d on CUDA, over packed
 * variable-length sequences (see conv1d.h for the math):
 *   y[t, c] = act( sum_{j<K} w[c, j] * x[t - (K - 1) + j, c] )
 * with the window cut at the start of t's sequence, so each sequence runs
 * as if alone. x, y bf16 rows of their own strides (the conv reads the qkv
 * columns of the projection's output in place); w bf16 [C, K], K <= 8.
 *
 * One thread per token and 8 channels (16-byte loads) when C, the strides
 * and the pointers allow, else per token and channel; blocks span channels
 * (grid y) of one token (grid x), so a block finds its sequence start once
 * per thread with a binary search of cu_seqlens that hits L1. fp32 sums,
 * one rounding to bf16. */
#include <cuda_bf16.h>
#include <stdint.h>

#include "conv1d.h"
#include "cublaslt.h"

typedef __nv_bfloat16 bf16;

enum { CONV_MAX_K = 8 };

/* First token of the sequence holding token t. */
__device__ __forceinline__ int conv_seq_start(const int32_t *cu, int n_seqs, int t)
{
    int lo = 0, hi = n_seqs - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) >> 1;
        if (__ldg(cu + mid) <= t)
            lo = mid;
        else
            hi = mid - 1;
    }
    return __ldg(cu + lo);
}

__device__ __forceinline__ float conv_act(float acc, int silu)
{
    return silu ? acc / (1.f + __expf(-acc)) : acc;
}

template <bool VEC>
__global__ void conv1d_kernel(const bf16 *__restrict__ x, int64_t x_stride,
                              const bf16 *__restrict__ w, bf16 *__restrict__ y, int64_t y_stride,
                              const int32_t *__restrict__ cu, int n_seqs, int C, int K, int silu)
{
    const int t = blockIdx.x;
    const int lanes = VEC ? 8 : 1;
    const int c0 = (blockIdx.y * blockDim.x + threadIdx.x) * lanes;
    if (c0 >= C) return;
    const int start = conv_seq_start(cu, n_seqs, t);
    float acc[lanes];
#pragma unroll
    for (int e = 0; e < lanes; e++)
        acc[e] = 0.f;
    for (int j = 0; j < K; j++) {
        int src = t - (K - 1) + j;
        if (src < start) continue;
        const bf16 *xr = x + (int64_t)src * x_stride + c0;
        if (VEC) {
            uint4 u = __ldg((const uint4 *)xr);
            const bf16 *xe = (const bf16 *)&u;
#pragma unroll
            for (int e = 0; e < 8; e++)
                acc[e] += __bfloat162float(w[(int64_t)(c0 + e) * K + j]) * __bfloat162float(xe[e]);
        } else {
            acc[0] += __bfloat162float(w[(int64_t)c0 * K + j]) * __bfloat162float(xr[0]);
        }
    }
    bf16 *yr = y + (int64_t)t * y_stride + c0;
    if (VEC) {
        uint4 o;
        bf16 *oe = (bf16 *)&o;
#pragma unroll
        for (int e = 0; e < 8; e++)
            oe[e] = __float2bfloat16(conv_act(acc[e], silu));
        *(uint4 *)yr = o;
    } else {
        yr[0] = __float2bfloat16(conv_act(acc[0], silu));
    }
}

extern "C" hs_status_t hs_kn_causal_conv1d(const void *x, int64_t x_stride, const void *w, void *y,
                                           int64_t y_stride, const int32_t *cu_seqlens, int n_seqs,
                                           int T, int C, int K, int silu, cudaStream_t stream)
{
    if (T <= 0 || C <= 0) return HS_OK;
    if (n_seqs <= 0 || K < 1 || K > CONV_MAX_K || x_stride < C || y_stride < C) {
        hs_error("causal_conv1d: bad shape (n_seqs %d, C %d, K %d, strides %lld/%lld)", n_seqs, C,
                 K, (long long)x_stride, (long long)y_stride);
        return HS_ERR_INVALID;
    }
    bool vec = C % 8 == 0 && x_stride % 8 == 0 && y_stride % 8 == 0 &&
               ((uintptr_t)x | (uintptr_t)y) % 16 == 0;
    const int threads = 256;
    int per_block = vec ? threads * 8 : threads;
    dim3 grid((unsigned)T, (unsigned)((C + per_block - 1) / per_block));
    if (vec)
        conv1d_kernel<true><<<grid, threads, 0, stream>>>((const bf16 *)x, x_stride,
                                                          (const bf16 *)w, (bf16 *)y, y_stride,
                                                          cu_seqlens, n_seqs, C, K, silu);
    else
        conv1d_kernel<false><<<grid, threads, 0, stream>>>((const bf16 *)x, x_stride,
                                                           (const bf16 *)w, (bf16 *)y, y_stride,
                                                           cu_seqlens, n_seqs, C, K, silu);
    return HS_CUDA_LAUNCH_CHECK("causal_conv1d kernel");
}
