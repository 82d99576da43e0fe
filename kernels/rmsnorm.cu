/* SPDX-License-Identifier: Apache-2.0 */
/* rmsnorm.cu - RMSNorm on CUDA, over token rows or over heads inside rows.
 *
 * y = bf16( w * bf16( x / sqrt(mean(x^2) + eps) ) ), the two roundings of
 * Hugging Face's bf16 RMSNorm (normalise in fp32, cast, then scale by the
 * bf16 weight). Row r of a launch is head (r % heads) of token (r / heads):
 * heads = 1 for the per-token norms, n_heads for Qwen3's q/k norm, which
 * works in place on the fused qkv rows.
 *
 * The zero-centred form (Qwen3.5's layer, final and q/k norms) rounds once,
 * as Qwen3_5RMSNorm does: y = bf16( x / sqrt(mean(x^2) + eps) * (1 + w) ),
 * with 1 + w formed in fp32 from the bf16 w. Folding 1 + w into the stored
 * weight at load would round it to bf16 (w sits near 0, 1 + w near 1: 8
 * bits of w's mantissa lost) and add the Llama-style second rounding.
 *
 * One warp per row; 16-byte loads when dim and strides are multiples of 8.
 * The row is read twice (sum of squares, then scale); the second read comes
 * from L1/L2. Optionally the input row is also copied to copy[t] (row stride
 * copy_stride): that is how a captured layer's residual stream lands in its
 * column slice of the pack buffer while the next layer's input norm reads it.
 *
 * hs_kn_rmsnorm_fp8 also quantises each row's output for an FP8 projection:
 * per 16-byte word, a half-warp covers a 128-column group, so the group's
 * amax is a half-warp shuffle and the bytes are the quantiser's
 * (fp8_group.cuh) on the bf16 outputs. */
#include <cuda_bf16.h>
#include <stdint.h>

#include "cublaslt.h"
#include "fp8_block.h"
#include "fp8_group.cuh"
#include "row_rms.cuh"
#include "rmsnorm.h"
#include "hs_log.h"

typedef __nv_bfloat16 bf16;

/* One output element: Llama's two roundings, or the zero-centred single one. */
template <bool ZC> __device__ __forceinline__ bf16 norm_scale(float x, float r, bf16 w)
{
    if (ZC) return __float2bfloat16(x * r * (1.0f + __bfloat162float(w)));
    float n = __bfloat162float(__float2bfloat16(x * r));
    return __float2bfloat16(n * __bfloat162float(w));
}

template <bool VEC, bool ZC>
__global__ void rmsnorm_kernel(const bf16 *x, int64_t x_stride, const bf16 *w, bf16 *y,
                               int64_t y_stride, bf16 *copy, int64_t copy_stride, int rows,
                               int heads, int dim, float eps)
{
    int warp = (blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    int lane = threadIdx.x & 31;
    if (warp >= rows) return;
    int64_t t = warp / heads, h = warp % heads;
    const bf16 *xr = x + t * x_stride + h * dim;
    bf16 *yr = y + t * y_stride + h * dim;
    float r = hs_warp_row_rrms<VEC>(xr, dim, eps, lane);
    bf16 *cr = copy ? copy + t * copy_stride : nullptr;
    if (VEC) {
        for (int i = lane * 8; i < dim; i += 256) {
            uint4 u = *(const uint4 *)(xr + i);
            uint4 wu = *(const uint4 *)(w + i);
            if (cr) *(uint4 *)(cr + i) = u;
            const bf16 *e = (const bf16 *)&u, *we = (const bf16 *)&wu;
            uint4 o;
            bf16 *oe = (bf16 *)&o;
#pragma unroll
            for (int j = 0; j < 8; j++)
                oe[j] = norm_scale<ZC>(__bfloat162float(e[j]), r, we[j]);
            *(uint4 *)(yr + i) = o;
        }
    } else {
        for (int i = lane; i < dim; i += 32) {
            bf16 v = xr[i];
            if (cr) cr[i] = v;
            yr[i] = norm_scale<ZC>(__bfloat162float(v), r, w[i]);
        }
    }
}

/* One token row a warp, 16-byte words: y = the norm (bf16, when WRITE_Y),
 * q and scales its e4m3 groups. */
template <bool ZC, bool WRITE_Y>
__global__ void rmsnorm_fp8_kernel(const bf16 *x, int64_t x_stride, const bf16 *w, bf16 *y,
                                   int64_t y_stride, bf16 *copy, int64_t copy_stride, int rows,
                                   int dim, float eps, uint8_t *__restrict__ q, int64_t ldq,
                                   float *__restrict__ scales)
{
    const int t = (blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const int lane = threadIdx.x & 31;
    if (t >= rows) return; /* whole warps leave together */
    const int G = (dim + HS_FP8_BLOCK - 1) / HS_FP8_BLOCK;
    const bf16 *xr = x + (int64_t)t * x_stride;
    const float r = hs_warp_row_rrms<true>(xr, dim, eps, lane);
    bf16 *cr = copy ? copy + (int64_t)t * copy_stride : nullptr;
    for (int i0 = 0; i0 < dim; i0 += 256) { /* the warp together: it shuffles */
        const int i = i0 + lane * 8;
        const bool mine = i < dim;
        float v[8], amax = 0.f;
        int nonfinite = 0;
        if (mine) {
            uint4 u = *(const uint4 *)(xr + i);
            uint4 wu = *(const uint4 *)(w + i);
            if (cr) *(uint4 *)(cr + i) = u;
            const bf16 *e = (const bf16 *)&u, *we = (const bf16 *)&wu;
            uint4 o;
            bf16 *oe = (bf16 *)&o;
#pragma unroll
            for (int j = 0; j < 8; j++) {
                oe[j] = norm_scale<ZC>(__bfloat162float(e[j]), r, we[j]);
                const uint16_t b = __bfloat16_as_ushort(oe[j]);
                nonfinite |= (b & 0x7fffu) >= 0x7f80u;
                v[j] = __bfloat162float(oe[j]);
                amax = fmaxf(amax, fabsf(v[j]));
            }
            if (WRITE_Y) *(uint4 *)(y + (int64_t)t * y_stride + i) = o;
        }
        for (int off = 8; off > 0; off >>= 1) { /* the 16 lanes of a group */
            amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, off));
            nonfinite |= __shfl_xor_sync(0xffffffffu, nonfinite, off);
        }
        if (!mine) continue;
        const int g = i / HS_FP8_BLOCK;
        const float s = hs_fp8_group_factor(amax, nonfinite);
        if (lane % 16 == 0) scales[hs_fp8_act_scale_index(g, t, rows, G)] = s;
        *(uint2 *)(q + (int64_t)t * ldq + i) = hs_fp8_group_pack8(v, s, nonfinite);
    }
}

template <bool ZC>
static hs_status_t rmsnorm_launch(const void *x, int64_t x_stride, const void *w, void *y,
                                  int64_t y_stride, void *copy, int64_t copy_stride, int rows,
                                  int heads, int dim, float eps, cudaStream_t stream)
{
    if (rows <= 0) return HS_OK;
    bool vec = dim % 8 == 0 && x_stride % 8 == 0 && y_stride % 8 == 0 &&
               (!copy || copy_stride % 8 == 0) &&
               ((uintptr_t)x | (uintptr_t)y | (uintptr_t)w | (uintptr_t)copy) % 16 == 0;
    const int threads = 256, rows_per_block = threads / 32;
    int blocks = (rows + rows_per_block - 1) / rows_per_block;
    if (vec)
        rmsnorm_kernel<true, ZC><<<blocks, threads, 0, stream>>>(
            (const bf16 *)x, x_stride, (const bf16 *)w, (bf16 *)y, y_stride, (bf16 *)copy,
            copy_stride, rows, heads, dim, eps);
    else
        rmsnorm_kernel<false, ZC><<<blocks, threads, 0, stream>>>(
            (const bf16 *)x, x_stride, (const bf16 *)w, (bf16 *)y, y_stride, (bf16 *)copy,
            copy_stride, rows, heads, dim, eps);
    return HS_CUDA_LAUNCH_CHECK("rmsnorm kernel");
}

extern "C" hs_status_t hs_kn_rmsnorm(const void *x, int64_t x_stride, const void *w, void *y,
                                     int64_t y_stride, int rows, int dim, float eps,
                                     bool zero_centered, void *copy, int64_t copy_stride,
                                     cudaStream_t stream)
{
    return (zero_centered ? rmsnorm_launch<true>
                          : rmsnorm_launch<false>)(x, x_stride, w, y, y_stride, copy, copy_stride,
                                                   rows, 1, dim, eps, stream);
}

extern "C" hs_status_t hs_kn_rmsnorm_heads(void *x, int64_t row_stride, int T, int n_heads,
                                           int head_dim, const void *w, float eps,
                                           bool zero_centered, cudaStream_t stream)
{
    return (zero_centered ? rmsnorm_launch<true>
                          : rmsnorm_launch<false>)(x, row_stride, w, x, row_stride, NULL, 0,
                                                   T * n_heads, n_heads, head_dim, eps, stream);
}

extern "C" hs_status_t hs_kn_rmsnorm_fp8(const void *x, int64_t x_stride, const void *w, void *y,
                                         int64_t y_stride, bool write_y, int rows, int dim,
                                         float eps, bool zero_centered, void *copy,
                                         int64_t copy_stride, uint8_t *q, int64_t ldq,
                                         float *scales, cudaStream_t stream)
{
    if (rows <= 0) return HS_OK;
    if (dim < 1 || ldq < dim || x_stride < dim || y_stride < dim) {
        hs_error("rmsnorm fp8: bad shape (dim %d, strides %lld/%lld, ldq %lld)", dim,
                 (long long)x_stride, (long long)y_stride, (long long)ldq);
        return HS_ERR_INVALID;
    }
    const bool vec = dim % 8 == 0 && x_stride % 8 == 0 && y_stride % 8 == 0 && ldq % 8 == 0 &&
                     (!copy || copy_stride % 8 == 0) &&
                     ((uintptr_t)x | (uintptr_t)y | (uintptr_t)w | (uintptr_t)copy) % 16 == 0 &&
                     (uintptr_t)q % 8 == 0;
    if (!vec) {
        hs_status_t st = hs_kn_rmsnorm(x, x_stride, w, y, y_stride, rows, dim, eps, zero_centered,
                                       copy, copy_stride, stream);
        return st != HS_OK ? st
                           : hs_kn_fp8_quant_groups((const uint16_t *)y, y_stride, rows, dim, q,
                                                    ldq, scales, stream);
    }
    const int threads = 256, rows_per_block = threads / 32;
    const int blocks = (rows + rows_per_block - 1) / rows_per_block;
#define HS_RMSNORM_FP8(ZC, WY)                                                                     \
    rmsnorm_fp8_kernel<ZC, WY><<<blocks, threads, 0, stream>>>(                                    \
        (const bf16 *)x, x_stride, (const bf16 *)w, (bf16 *)y, y_stride, (bf16 *)copy,             \
        copy_stride, rows, dim, eps, q, ldq, scales)
    if (zero_centered) {
        if (write_y)
            HS_RMSNORM_FP8(true, true);
        else
            HS_RMSNORM_FP8(true, false);
    } else {
        if (write_y)
            HS_RMSNORM_FP8(false, true);
        else
            HS_RMSNORM_FP8(false, false);
    }
#undef HS_RMSNORM_FP8
    return HS_CUDA_LAUNCH_CHECK("rmsnorm fp8 kernel");
}
