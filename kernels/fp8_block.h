/* SPDX-License-Identifier: Apache-2.0 */
/* fp8_block.h - block-scaled e4m3 for the FP8 forward, as Hugging Face
 * "fp8" checkpoints define it (quant_method "fp8", weight_block_size
 * [128, 128], dynamic activation scales).
 *
 * Weights W [N, K] (row-major, nn.Linear's [out, in]): one fp32 factor per
 * 128 x 128 block, scale_inv [ceil(N/128), ceil(K/128)] row-major,
 *   scale_inv[nb][kb] = amax(block) / 448 (1 for an all-zero block),
 *   q = e4m3(w / scale_inv),  and back  w = q * scale_inv.
 * Activations X [M, K] at run time: one fp32 factor per token and group of
 * 128 columns (the last group may be shorter),
 *   scale = amax(group) / 448 (1 for an all-zero group; NaN for a group
 *   holding a NaN or an infinity, whose bytes are then 0, so the GEMM's
 *   output goes NaN as the bf16 path's would),  q = e4m3(x / scale).
 * Activation factors are stored group-major, scales[g * M + m]: the layout
 * cuBLASLt's VEC128_32F scale mode reads. Every factor multiplies (it is
 * the dequantisation factor). Roundings are to nearest even in IEEE single
 * precision through hs_float.h's scalars (hs_fp8_from_f32 saturates at
 * +-448), so the kernel and its C twin give the same bits. */
#ifndef HS_KN_FP8_BLOCK_H
#define HS_KN_FP8_BLOCK_H

#include <stddef.h>
#include <stdint.h>

#include "hsflow.h"
#include "hs_float.h"

#ifdef __cplusplus
extern "C" {
#endif

#define HS_FP8_BLOCK 128

/* Number of 128-blocks over n values. */
static inline int64_t hs_fp8_blocks(int64_t n) { return (n + HS_FP8_BLOCK - 1) / HS_FP8_BLOCK; }

/* ---- activations: per token, per group of 128 ---- */

/* Where the factor of token m, group g of an M-token batch lies: on sm_90
 * cuBLASLt's per-128-column factors (VEC128_32F) need a multiple of 4
 * tokens, so hs_lt_linear_fp8 runs the first M4 = M & ~3 tokens as one GEMM
 * and the last M % 4 as a GEMM of 4; the factors are laid out for both:
 * [G][M4] for the first M4 tokens, then [G][4] for the rest (its last
 * 4 - M % 4 entries unused), G = ceil(K/128). */
HS_HOSTDEV static inline int64_t hs_fp8_act_scale_index(int64_t g, int64_t m, int64_t M, int64_t G)
{
    const int64_t m4 = M & ~(int64_t)3;
    return m < m4 ? g * m4 + m : G * m4 + g * 4 + (m - m4);
}
/* Entries the factors of an M-token batch take: G * ceil4(M). */
static inline int64_t hs_fp8_act_scale_count(int64_t M, int64_t K)
{
    return hs_fp8_blocks(K) * ((M + 3) & ~(int64_t)3);
}

/* C twin: x [M rows, row stride ldx] bf16 into q [M rows, stride ldq >= K]
 * e4m3 (columns K..ldq untouched) and scales [hs_fp8_act_scale_count]
 * (hs_fp8_act_scale_index's layout). */
void hs_kn_fp8_quant_groups_ref(const uint16_t *x, int64_t ldx, int M, int K, uint8_t *q,
                                int64_t ldq, float *scales);

/* The same on the GPU (kernels/fp8_block.cu): device pointers, stream a
 * cudaStream_t. HS_ERR_INVALID for bad shapes, HS_ERR_CUDA for a failed
 * launch. */
struct CUstream_st;
HS_MUST_CHECK hs_status_t hs_kn_fp8_quant_groups(const uint16_t *x, int64_t ldx, int M, int K,
                                                 uint8_t *q, int64_t ldq, float *scales,
                                                 struct CUstream_st *stream);

/* The MLP's activation and the down projection's quantisation in one pass:
 * h = hs_kn_swiglu of the fused gate|up rows gu [M, 2K] (stride ldgu), then
 * h quantised as hs_kn_fp8_quant_groups does, into q and scales, the same
 * bits as the two kernels in a row. gu is scratch: where its shape does not
 * allow the fused kernel (K, ldgu, ldq not multiples of 8, or misaligned),
 * the two kernels run, h written over gu's gate half. */
HS_MUST_CHECK hs_status_t hs_kn_swiglu_fp8_groups(void *gu, int64_t ldgu, int M, int K, uint8_t *q,
                                                  int64_t ldq, float *scales,
                                                  struct CUstream_st *stream);

/* The Gated DeltaNet's gated RMSNorm and its out projection's quantisation
 * in one pass: y = hs_kn_rmsnorm_gated of x and z, both [M, n_heads * dim]
 * (a token's heads side by side, rows of n_heads * dim), with w [dim], then
 * y quantised as hs_kn_fp8_quant_groups does over K = n_heads * dim, into q
 * and scales: the same bits as the two kernels in a row. A head of 128 is a
 * group and the two run as one kernel; otherwise (another dim, misaligned
 * pointers, ldq not a multiple of 8) the two kernels run, y written over x,
 * which is scratch either way. */
HS_MUST_CHECK hs_status_t hs_kn_rmsnorm_gated_fp8(void *x, const void *z, const void *w, int M,
                                                  int n_heads, int dim, float eps, uint8_t *q,
                                                  int64_t ldq, float *scales,
                                                  struct CUstream_st *stream);

/* ---- weights: 128 x 128 blocks (host, fp8_block_ref.c) ---- */

/* w [N, K] bf16 (finite) into q [N, K] e4m3 and scale_inv [ceil(N/128),
 * ceil(K/128)]: what an FP8 checkpoint stores. Blocks run in parallel
 * (OpenMP) where available. */
void hs_fp8_block_quantize(const uint16_t *w, int64_t N, int64_t K, uint8_t *q, float *scale_inv);

/* q [N, K] with scale_inv [ceil(N/128), ceil(K/128)] into bf16 w [N, K]:
 * w = bf16(fp32(q) * scale_inv), rounded to nearest even (an F32 copy of
 * the product, loaded as bf16, gives the same bits). */
void hs_fp8_block_dequantize(const uint8_t *q, const float *scale_inv, int64_t N, int64_t K,
                             uint16_t *w);

#ifdef __cplusplus
}
#endif
#endif /* HS_KN_FP8_BLOCK_H */
