/* SPDX-License-Identifier: Apache-2.0 */
/* conv1d.cu - Gated DeltaNet's depthwise causal conv1d on CUDA, over packed
 * variable-length sequences (see conv1d.h for the math):
 *   y[t, c] = act( sum_{j<K} w[c, j] * x[t - (K - 1) + j, c] )
 * with the window cut at the start of t's sequence, so each sequence runs
 * as if alone. x, y bf16 rows of their own strides (the conv reads the qkv
 * columns of the projection's output in place); w bf16 [C, K], K <= 8.
 *
 * Where C, the strides and the pointers allow 16-byte access, a thread
 * owns 8 channels over a tile of conv_tile(K) tokens: it holds its 8 x K
 * weights and the K - 1 + tile rows of x it reads in registers, so each
 * row of x is read once (plus K - 1 rows of halo per tile) and the weights
 * once per tile; it finds the sequence of the tile's first token by a binary
 * search of cu_seqlens and steps over later boundaries as it goes. Else
 * one thread per token and channel. Both sum the same terms in the same
 * order in fp32 (a term of an earlier sequence is skipped, not added as
 * zero), with one rounding to bf16: their outputs are bit for bit equal. */
#include <cuda_bf16.h>
#include <stdint.h>

#include "conv1d.h"
#include "cublaslt.h"
#include "hs_log.h"

typedef __nv_bfloat16 bf16;

enum { CONV_MAX_K = 8 };

/* Index of the sequence holding token t. */
__device__ __forceinline__ int conv_seq_index(const int32_t *cu, int n_seqs, int t)
{
    int lo = 0, hi = n_seqs - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) >> 1;
        if (__ldg(cu + mid) <= t)
            lo = mid;
        else
            hi = mid - 1;
    }
    return lo;
}

/* SiLU as swiglu.cuh computes it (__fdividef: 2 instructions where an
 * IEEE division takes about 8, within 2 ulp). */
__device__ __forceinline__ float conv_act(float acc, int silu)
{
    return silu ? __fdividef(acc, 1.f + __expf(-acc)) : acc;
}

enum { CONV_THREADS = 256 };

/* Tokens a thread runs of a K-tap conv: its K - 1 + tile rows stay in
 * registers (2 blocks an SM without spilling). */
__host__ __device__ constexpr int conv_tile(int K) { return K <= 4 ? 16 : 8; }

/* 8 bf16 of a 16-byte word as floats. */
__device__ __forceinline__ void conv_unpack8(uint4 u, float f[8])
{
    const __nv_bfloat162 *p = (const __nv_bfloat162 *)&u;
#pragma unroll
    for (int e = 0; e < 4; e++) {
        float2 v = __bfloat1622float2(p[e]);
        f[2 * e] = v.x, f[2 * e + 1] = v.y;
    }
}

/* 8 channels [c0, c0 + 8) over tokens [t0, t0 + conv_tile(K)) of a thread. */
template <int K>
__global__ void __launch_bounds__(CONV_THREADS, 2)
    conv1d_tile_kernel(const bf16 *__restrict__ x, int64_t x_stride, const bf16 *__restrict__ w,
                       bf16 *__restrict__ y, int64_t y_stride, const int32_t *__restrict__ cu,
                       int n_seqs, int T, int C, int silu)
{
    const int c0 = (blockIdx.y * CONV_THREADS + threadIdx.x) * 8;
    if (c0 >= C) return;
    constexpr int TILE = conv_tile(K);
    const int t0 = blockIdx.x * TILE;
    /* w[c0 .. c0 + 8) x K is 8K contiguous bf16: K 16-byte words */
    float wf[K][8];
    {
        float flat[8 * K];
        const uint4 *wv = (const uint4 *)(w + (int64_t)c0 * K);
#pragma unroll
        for (int i = 0; i < K; i++)
            conv_unpack8(__ldg(wv + i), flat + 8 * i);
#pragma unroll
        for (int e = 0; e < 8; e++)
#pragma unroll
            for (int j = 0; j < K; j++)
                wf[j][e] = flat[e * K + j];
    }
    /* rows t0 - (K - 1) .. t0 + TILE - 1, loaded before any use so
     * the loads are all in flight at once */
    uint4 rows[K - 1 + TILE];
#pragma unroll
    for (int i = 0; i < K - 1 + TILE; i++) {
        const int t = t0 - (K - 1) + i;
        rows[i] = t >= 0 && t < T ? __ldg((const uint4 *)(x + (int64_t)t * x_stride + c0))
                                  : make_uint4(0, 0, 0, 0);
    }
    int seq = conv_seq_index(cu, n_seqs, t0);
    int start = __ldg(cu + seq), next = __ldg(cu + seq + 1);
#pragma unroll
    for (int i = 0; i < TILE; i++) {
        const int t = t0 + i;
        if (t >= T) break;
        while (t >= next)
            start = next, next = __ldg(cu + ++seq + 1);
        float acc[8];
#pragma unroll
        for (int e = 0; e < 8; e++)
            acc[e] = 0.f;
#pragma unroll
        for (int j = 0; j < K; j++) {
            if (t - (K - 1) + j < start) continue;
            float xf[8];
            conv_unpack8(rows[i + j], xf);
#pragma unroll
            for (int e = 0; e < 8; e++)
                acc[e] += wf[j][e] * xf[e];
        }
        uint4 o;
        __nv_bfloat162 *op = (__nv_bfloat162 *)&o;
#pragma unroll
        for (int e = 0; e < 4; e++)
            op[e] =
                __floats2bfloat162_rn(conv_act(acc[2 * e], silu), conv_act(acc[2 * e + 1], silu));
        *(uint4 *)(y + (int64_t)t * y_stride + c0) = o;
    }
}

/* One token and channel a thread: any C, stride or alignment. */
__global__ void conv1d_kernel(const bf16 *__restrict__ x, int64_t x_stride,
                              const bf16 *__restrict__ w, bf16 *__restrict__ y, int64_t y_stride,
                              const int32_t *__restrict__ cu, int n_seqs, int C, int K, int silu)
{
    const int t = blockIdx.x;
    const int c = blockIdx.y * blockDim.x + threadIdx.x;
    if (c >= C) return;
    const int start = __ldg(cu + conv_seq_index(cu, n_seqs, t));
    float acc = 0.f;
    for (int j = 0; j < K; j++) {
        int src = t - (K - 1) + j;
        if (src < start) continue;
        acc += __bfloat162float(w[(int64_t)c * K + j]) *
               __bfloat162float(x[(int64_t)src * x_stride + c]);
    }
    y[(int64_t)t * y_stride + c] = __float2bfloat16(conv_act(acc, silu));
}

template <int K>
static void launch_tile(const void *x, int64_t x_stride, const void *w, void *y, int64_t y_stride,
                        const int32_t *cu, int n_seqs, int T, int C, int silu, cudaStream_t stream)
{
    dim3 grid((unsigned)((T + conv_tile(K) - 1) / conv_tile(K)),
              (unsigned)((C + CONV_THREADS * 8 - 1) / (CONV_THREADS * 8)));
    conv1d_tile_kernel<K><<<grid, CONV_THREADS, 0, stream>>>(
        (const bf16 *)x, x_stride, (const bf16 *)w, (bf16 *)y, y_stride, cu, n_seqs, T, C, silu);
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
    const bool vec = C % 8 == 0 && x_stride % 8 == 0 && y_stride % 8 == 0 &&
                     ((uintptr_t)x | (uintptr_t)y | (uintptr_t)w) % 16 == 0;
    if (vec) {
        typedef void (*launch_fn)(const void *, int64_t, const void *, void *, int64_t,
                                  const int32_t *, int, int, int, int, cudaStream_t);
        static const launch_fn launch[CONV_MAX_K] = {launch_tile<1>, launch_tile<2>, launch_tile<3>,
                                                     launch_tile<4>, launch_tile<5>, launch_tile<6>,
                                                     launch_tile<7>, launch_tile<8>};
        launch[K - 1](x, x_stride, w, y, y_stride, cu_seqlens, n_seqs, T, C, silu, stream);
    } else {
        const int threads = 256;
        dim3 grid((unsigned)T, (unsigned)((C + threads - 1) / threads));
        conv1d_kernel<<<grid, threads, 0, stream>>>((const bf16 *)x, x_stride, (const bf16 *)w,
                                                    (bf16 *)y, y_stride, cu_seqlens, n_seqs, C, K,
                                                    silu);
    }
    return HS_CUDA_LAUNCH_CHECK("causal_conv1d kernel");
}
