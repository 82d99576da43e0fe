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
 * head_dim rotate (d/2 above is rot_dim/2); the rest are not touched. */
#include <cuda_bf16.h>
#include <stdint.h>

#include "cublaslt.h"
#include "rope.h"

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
