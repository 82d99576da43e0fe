/* SPDX-License-Identifier: Apache-2.0 */
/* fp8_block.cu - activations to e4m3 per token and group of 128 columns on
 * the GPU (see fp8_block.h), before each FP8 GEMM. Memory-bound: 2 bytes
 * read and 1 written per value, plus 4 bytes a group. The divisions are
 * IEEE (fp8_group.cuh), so the bytes are those of the C twin.
 *
 * Rows of 8-value vectors (K, the strides and the pointers aligned, as the
 * forward's are): sixteen threads a group, each reading one 16-byte vector
 * and writing 8 bytes; a half-warp shuffle gives the group's amax and
 * whether any value is not finite. A warp quantises group g of two tokens,
 * so the factors it writes ([G][M4]: hs_fp8_act_scale_index) are adjacent,
 * and each thread takes two tokens, both loads in flight before either is
 * reduced; the division by the factor goes through its reciprocal, exactly
 * (fp8_group.cuh). Other shapes: one warp per (token, group), 4 values a lane.
 *
 * The same vector kernel also takes the MLP's gate|up rows and quantises
 * their SwiGLU (hs_swiglu1, the activation's own element, so the bits are
 * those of swiglu.cu then the quantiser), which saves writing and reading
 * the activation's output in bf16. A kernel of the same layout quantises
 * the Gated DeltaNet's gated RMSNorm for its out projection: a value head of
 * 128 is one group, so the norm's reduction runs over the same sixteen
 * threads as the amax (rmsnorm_gated.cuh, the norm's own arithmetic). */
#include <cuda_fp8.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "fp8_block.h"
#include "hs_float.h"
#include "fp8_group.cuh"
#include "rmsnorm_gated.cuh"
#include "rmsnorm_gated.h"
#include "swiglu.cuh"
#include "swiglu.h"
#include "hs_log.h"

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
        v[j] = hs_bf16_to_f32(b);
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

#define VEC_THREADS 256
#define VEC_TOKENS_PER_THREAD 2
/* tokens a block covers: 16 threads a group, so 16 token rows per pass */
#define VEC_TOKENS (VEC_THREADS / 16 * VEC_TOKENS_PER_THREAD)

/* Eight bf16 values from x's row (SWIGLU: from the gate and up halves of a
 * gate|up row, K columns apart, through hs_swiglu1), as 4 words of 2. */
template <bool SWIGLU>
__device__ static inline uint4 load8(const uint16_t *__restrict__ row, int k, int K)
{
    uint4 a = __ldg((const uint4 *)(row + k));
    if (!SWIGLU) return a;
    uint4 u = __ldg((const uint4 *)(row + K + k));
    const __nv_bfloat16 *ge = (const __nv_bfloat16 *)&a, *ue = (const __nv_bfloat16 *)&u;
    uint4 h;
    __nv_bfloat16 *he = (__nv_bfloat16 *)&h;
#pragma unroll
    for (int j = 0; j < 8; j++)
        he[j] = hs_swiglu1(ge[j], ue[j]);
    return h;
}

template <bool SWIGLU>
__global__ void __launch_bounds__(VEC_THREADS)
    fp8_quant_groups_vec_kernel(const uint16_t *__restrict__ x, int64_t ldx, int M, int K, int G,
                                uint8_t *__restrict__ q, int64_t ldq, float *__restrict__ scales)
{
    const int g = (int)(blockIdx.x % (unsigned)G);
    const int m0 = (int)(blockIdx.x / (unsigned)G) * VEC_TOKENS + (int)threadIdx.x / 16;
    const int k = g * HS_FP8_BLOCK + (int)(threadIdx.x % 16) * 8;
    uint4 raw[VEC_TOKENS_PER_THREAD];
#pragma unroll
    for (int r = 0; r < VEC_TOKENS_PER_THREAD; r++) {
        int m = m0 + r * (VEC_THREADS / 16);
        raw[r] =
            m < M && k < K ? load8<SWIGLU>(x + (int64_t)m * ldx, k, K) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int r = 0; r < VEC_TOKENS_PER_THREAD; r++) {
        int m = m0 + r * (VEC_THREADS / 16);
        const uint32_t w[4] = {raw[r].x, raw[r].y, raw[r].z, raw[r].w};
        float v[8];
#pragma unroll
        for (int j = 0; j < 4; j++) {
            v[2 * j] = hs_bf16_to_f32((uint16_t)(w[j] & 0xffffu));
            v[2 * j + 1] = hs_bf16_to_f32((uint16_t)(w[j] >> 16));
        }
        /* within the 16 threads of the group */
        const uint32_t bits = hs_half_warp_max(hs_bf16x8_absmax_bits(raw[r]));
        if (m >= M || k >= K) continue;
        int nonfinite;
        const float amax = hs_fp8_group_amax(bits, &nonfinite);
        const float s = hs_fp8_group_factor(amax, nonfinite);
        if (threadIdx.x % 16 == 0) scales[hs_fp8_act_scale_index(g, m, M, G)] = s;
        const uint2 out = hs_fp8_group_pack8(v, s, nonfinite);
        *(uint2 *)(q + (int64_t)m * ldq + k) = out;
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
    bool vec = K % 8 == 0 && ldx % 8 == 0 && ldq % 8 == 0 && (uintptr_t)x % 16 == 0 &&
               (uintptr_t)q % 8 == 0;
    int64_t blocks =
        vec ? ((int64_t)M + VEC_TOKENS - 1) / VEC_TOKENS * G : ((int64_t)M * G + WARPS - 1) / WARPS;
    if (blocks > 2147483647) {
        hs_error("fp8 quant groups: %d x %d groups exceed one launch", M, G);
        return HS_ERR_INVALID;
    }
    if (vec)
        fp8_quant_groups_vec_kernel<false>
            <<<(unsigned)blocks, VEC_THREADS, 0, stream>>>(x, ldx, M, K, G, q, ldq, scales);
    else
        fp8_quant_groups_kernel<<<(unsigned)blocks, WARPS * 32, 0, stream>>>(x, ldx, M, K, G, q,
                                                                             ldq, scales);
    return cudaGetLastError() == cudaSuccess ? HS_OK : HS_ERR_CUDA;
}

extern "C" hs_status_t hs_kn_swiglu_fp8_groups(void *gu, int64_t ldgu, int M, int K, uint8_t *q,
                                               int64_t ldq, float *scales, cudaStream_t stream)
{
    if (M < 0 || K < 1 || ldgu < 2 * (int64_t)K || ldq < K) {
        hs_error("swiglu fp8 groups: bad shape M=%d K=%d ldgu=%lld ldq=%lld", M, K, (long long)ldgu,
                 (long long)ldq);
        return HS_ERR_INVALID;
    }
    if (M == 0) return HS_OK;
    bool vec = K % 8 == 0 && ldgu % 8 == 0 && ldq % 8 == 0 && (uintptr_t)gu % 16 == 0 &&
               (uintptr_t)q % 8 == 0;
    if (!vec) {
        hs_status_t st = hs_kn_swiglu(gu, ldgu, gu, ldgu, M, K, stream);
        return st != HS_OK ? st
                           : hs_kn_fp8_quant_groups((const uint16_t *)gu, ldgu, M, K, q, ldq,
                                                    scales, stream);
    }
    int G = (int)hs_fp8_blocks(K);
    int64_t blocks = ((int64_t)M + VEC_TOKENS - 1) / VEC_TOKENS * G;
    if (blocks > 2147483647) {
        hs_error("swiglu fp8 groups: %d x %d groups exceed one launch", M, G);
        return HS_ERR_INVALID;
    }
    fp8_quant_groups_vec_kernel<true><<<(unsigned)blocks, VEC_THREADS, 0, stream>>>(
        (const uint16_t *)gu, ldgu, M, K, G, q, ldq, scales);
    return cudaGetLastError() == cudaSuccess ? HS_OK : HS_ERR_CUDA;
}

/* hs_kn_rmsnorm_gated_fp8's kernel: x, z [M, G * 128] rows, one head of 128
 * a group; the layout of fp8_quant_groups_vec_kernel (16 threads a group,
 * two tokens a thread, both tokens' loads before either is reduced). */
__global__ void __launch_bounds__(VEC_THREADS)
    rmsnorm_gated_fp8_kernel(const uint16_t *__restrict__ x, const uint16_t *__restrict__ z,
                             const uint16_t *__restrict__ w, int M, int G, float eps,
                             uint8_t *__restrict__ q, int64_t ldq, float *__restrict__ scales)
{
    const int g = (int)(blockIdx.x % (unsigned)G);
    const int m0 = (int)(blockIdx.x / (unsigned)G) * VEC_TOKENS + (int)threadIdx.x / 16;
    const int i = (int)(threadIdx.x % 16) * 8, k = g * HS_FP8_BLOCK + i;
    const int64_t K = (int64_t)G * HS_FP8_BLOCK;
    const uint4 wu = __ldg((const uint4 *)(w + i));
    uint4 xu[VEC_TOKENS_PER_THREAD], zu[VEC_TOKENS_PER_THREAD];
#pragma unroll
    for (int r = 0; r < VEC_TOKENS_PER_THREAD; r++) {
        const int m = m0 + r * (VEC_THREADS / 16);
        xu[r] = zu[r] = make_uint4(0, 0, 0, 0);
        if (m < M) {
            xu[r] = __ldg((const uint4 *)(x + m * K + k));
            zu[r] = __ldg((const uint4 *)(z + m * K + k));
        }
    }
#pragma unroll
    for (int r = 0; r < VEC_TOKENS_PER_THREAD; r++) {
        const int m = m0 + r * (VEC_THREADS / 16);
        const float rr = hs_gated_row_rrms<16>(xu[r], HS_FP8_BLOCK, eps);
        const uint4 y = hs_gated_out8(xu[r], zu[r], wu, rr);
        const uint32_t yw[4] = {y.x, y.y, y.z, y.w};
        float v[8];
#pragma unroll
        for (int j = 0; j < 4; j++) {
            v[2 * j] = hs_bf16_to_f32((uint16_t)(yw[j] & 0xffffu));
            v[2 * j + 1] = hs_bf16_to_f32((uint16_t)(yw[j] >> 16));
        }
        const uint32_t bits = hs_half_warp_max(hs_bf16x8_absmax_bits(y));
        if (m >= M) continue;
        int nonfinite;
        const float amax = hs_fp8_group_amax(bits, &nonfinite);
        const float s = hs_fp8_group_factor(amax, nonfinite);
        if (threadIdx.x % 16 == 0) scales[hs_fp8_act_scale_index(g, m, M, G)] = s;
        *(uint2 *)(q + (int64_t)m * ldq + k) = hs_fp8_group_pack8(v, s, nonfinite);
    }
}

extern "C" hs_status_t hs_kn_rmsnorm_gated_fp8(void *x, const void *z, const void *w, int M,
                                               int n_heads, int dim, float eps, uint8_t *q,
                                               int64_t ldq, float *scales, cudaStream_t stream)
{
    const int64_t K = (int64_t)n_heads * dim;
    if (M < 0 || n_heads < 1 || dim < 1 || K > 2147483647 || ldq < K ||
        (int64_t)M * n_heads > 2147483647) {
        hs_error("rmsnorm gated fp8: bad shape M=%d heads=%d dim=%d ldq=%lld", M, n_heads, dim,
                 (long long)ldq);
        return HS_ERR_INVALID;
    }
    if (M == 0) return HS_OK;
    const bool fused = dim == HS_FP8_BLOCK && ldq % 8 == 0 &&
                       ((uintptr_t)x | (uintptr_t)z | (uintptr_t)w) % 16 == 0 &&
                       (uintptr_t)q % 8 == 0;
    if (!fused) {
        hs_status_t st =
            hs_kn_rmsnorm_gated(x, dim, z, dim, w, x, dim, M * n_heads, dim, eps, stream);
        return st != HS_OK ? st
                           : hs_kn_fp8_quant_groups((const uint16_t *)x, K, M, (int)K, q, ldq,
                                                    scales, stream);
    }
    const int64_t blocks = ((int64_t)M + VEC_TOKENS - 1) / VEC_TOKENS * n_heads;
    if (blocks > 2147483647) {
        hs_error("rmsnorm gated fp8: %d tokens x %d heads exceed one launch", M, n_heads);
        return HS_ERR_INVALID;
    }
    rmsnorm_gated_fp8_kernel<<<(unsigned)blocks, VEC_THREADS, 0, stream>>>(
        (const uint16_t *)x, (const uint16_t *)z, (const uint16_t *)w, M, n_heads, eps, q, ldq,
        scales);
    return cudaGetLastError() == cudaSuccess ? HS_OK : HS_ERR_CUDA;
}
