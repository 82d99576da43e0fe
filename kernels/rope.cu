/* SPDX-License-Identifier: Apache-2.0 */
/* rope.cu - rotary position embedding on CUDA, in place, positions
 * restarting at every packed sequence.
 *
 * For head h of token t at position p and i < d/2, with a = fp32(p * inv_freq[i]):
 *   y[i]       = x[i] * cos(a) - x[i + d/2] * sin(a)
 *   y[i + d/2] = x[i + d/2] * cos(a) + x[i] * sin(a)
 * with Hugging Face's bf16 roundings: cos and sin rounded to bf16, each
 * product rounded, then the sum. The heads rotated are the first n_heads of
 * each row (row stride row_stride), so one launch rotates q and k together
 * in the fused qkv rows. Positions come from hs_kn_rope_positions().
 * Partial rotary (Qwen3.5): only the first rot_dim dims of each head of
 * head_dim rotate (d/2 above is rot_dim/2); the rest are not touched.
 *
 * Where the rows allow 4-byte access, a thread rotates a pair of
 * frequencies (i, i + 1) in a group of heads, so each cos and sin is
 * computed once per token and thread rather than once per head; else one
 * (head, frequency) a thread. Both give the same bits. */
#include <cuda_bf16.h>
#include <stdint.h>

#include "cublaslt.h"
#include "rope.h"
#include "hs_log.h"

typedef __nv_bfloat16 bf16;

__global__ void rope_positions_kernel(const int32_t *cu_seqlens, int32_t *pos)
{
    int s = blockIdx.x;
    int32_t a = cu_seqlens[s], b = cu_seqlens[s + 1];
    for (int32_t t = a + threadIdx.x; t < b; t += blockDim.x)
        pos[t] = t - a;
}

__device__ __forceinline__ float bround(float f) { return __bfloat162float(__float2bfloat16(f)); }

__global__ void rope_kernel(bf16 *x, int64_t row_stride, int n_heads, int head_dim, int rot_dim,
                            const int32_t *pos, const float *inv_freq)
{
    int t = blockIdx.x;
    int half = rot_dim / 2;
    float p = (float)pos[t];
    bf16 *row = x + (int64_t)t * row_stride;
    for (int k = threadIdx.x; k < n_heads * half; k += blockDim.x) {
        int h = k / half, i = k % half;
        float a = p * inv_freq[i];
        float s, c;
        sincosf(a, &s, &c);
        c = bround(c);
        s = bround(s);
        bf16 *xh = row + (int64_t)h * head_dim;
        float x1 = __bfloat162float(xh[i]), x2 = __bfloat162float(xh[i + half]);
        xh[i] = __float2bfloat16(bround(x1 * c) + bround(-x2 * s));
        xh[i + half] = __float2bfloat16(bround(x2 * c) + bround(x1 * s));
    }
}

/* blockDim.x frequency pairs by blockDim.y head groups of token blockIdx.x. */
__global__ void rope_pair_kernel(bf16 *x, int64_t row_stride, int n_heads, int head_dim, int half,
                                 const int32_t *pos, const float *inv_freq)
{
    const int t = blockIdx.x;
    const float p = (float)pos[t];
    bf16 *row = x + (int64_t)t * row_stride;
    for (int i = 2 * threadIdx.x; i < half; i += 2 * blockDim.x) {
        float s0, c0, s1, c1;
        sincosf(p * inv_freq[i], &s0, &c0);
        sincosf(p * inv_freq[i + 1], &s1, &c1);
        c0 = bround(c0), s0 = bround(s0), c1 = bround(c1), s1 = bround(s1);
        /* four heads at a time: their loads in flight together */
        for (int h0 = threadIdx.y; h0 < n_heads; h0 += 4 * blockDim.y) {
            float2 x1[4], x2[4];
#pragma unroll
            for (int u = 0; u < 4; u++) {
                const int h = h0 + u * blockDim.y;
                if (h >= n_heads) break;
                const bf16 *xh = row + (int64_t)h * head_dim + i;
                x1[u] = __bfloat1622float2(*(const __nv_bfloat162 *)xh);
                x2[u] = __bfloat1622float2(*(const __nv_bfloat162 *)(xh + half));
            }
#pragma unroll
            for (int u = 0; u < 4; u++) {
                const int h = h0 + u * blockDim.y;
                if (h >= n_heads) break;
                bf16 *xh = row + (int64_t)h * head_dim + i;
                *(__nv_bfloat162 *)xh =
                    __floats2bfloat162_rn(bround(x1[u].x * c0) + bround(-x2[u].x * s0),
                                          bround(x1[u].y * c1) + bround(-x2[u].y * s1));
                *(__nv_bfloat162 *)(xh + half) =
                    __floats2bfloat162_rn(bround(x2[u].x * c0) + bround(x1[u].x * s0),
                                          bround(x2[u].y * c1) + bround(x1[u].y * s1));
            }
        }
    }
}

extern "C" hs_status_t hs_kn_rope_positions(const int32_t *cu_seqlens, int n_seqs, int32_t *pos,
                                            cudaStream_t stream)
{
    if (n_seqs <= 0) return HS_OK;
    rope_positions_kernel<<<n_seqs, 256, 0, stream>>>(cu_seqlens, pos);
    return HS_CUDA_LAUNCH_CHECK("rope positions kernel");
}

extern "C" hs_status_t hs_kn_rope_partial(void *x, int64_t row_stride, int T, int n_heads,
                                          int head_dim, int rot_dim, const int32_t *pos,
                                          const float *inv_freq, cudaStream_t stream)
{
    if (T <= 0) return HS_OK;
    if (rot_dim % 2 || rot_dim < 2 || rot_dim > head_dim) {
        hs_error("rope: rotary dims %d of head_dim %d: rotary embedding needs an even number of "
                 "dims between 2 and head_dim",
                 rot_dim, head_dim);
        return HS_ERR_INVALID;
    }
    const int half = rot_dim / 2;
    if (half % 2 == 0 && head_dim % 2 == 0 && row_stride % 2 == 0 && (uintptr_t)x % 4 == 0) {
        const int pairs = half / 2 < 128 ? half / 2 : 128;
        int groups = 256 / pairs;
        if (groups > n_heads) groups = n_heads;
        rope_pair_kernel<<<T, dim3((unsigned)pairs, (unsigned)groups), 0, stream>>>(
            (bf16 *)x, row_stride, n_heads, head_dim, half, pos, inv_freq);
        return HS_CUDA_LAUNCH_CHECK("rope kernel");
    }
    int work = n_heads * rot_dim / 2;
    int threads = work >= 512 ? 512 : ((work + 31) / 32) * 32;
    rope_kernel<<<T, threads, 0, stream>>>((bf16 *)x, row_stride, n_heads, head_dim, rot_dim, pos,
                                           inv_freq);
    return HS_CUDA_LAUNCH_CHECK("rope kernel");
}

extern "C" hs_status_t hs_kn_rope(void *x, int64_t row_stride, int T, int n_heads, int head_dim,
                                  const int32_t *pos, const float *inv_freq, cudaStream_t stream)
{
    return hs_kn_rope_partial(x, row_stride, T, n_heads, head_dim, head_dim, pos, inv_freq, stream);
}
