/* SPDX-License-Identifier: Apache-2.0 */
/* rmsnorm.h - RMSNorm as in Hugging Face Llama/Qwen/Mistral:
 *   y[r, i] = x[r, i] / sqrt(mean_i(x[r, :]^2) + eps) * w[i]
 * and its zero-centred form (Qwen3.5), whose weight multiplies as (1 + w).
 *
 * Shapes: x, y [rows, dim] (y may equal x), w [dim] bf16. Also used per head
 * for Qwen3's q/k norm: rows = T * n_heads, dim = head_dim.
 * Precision: fp32 input, fp32 sum of squares, fp32 output. */
#ifndef HS_KN_RMSNORM_H
#define HS_KN_RMSNORM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "hsflow.h" /* hs_status_t */

#ifdef __cplusplus
extern "C" {
#endif

/* C twin. In place (y == x) is allowed. */
void hs_kn_rmsnorm_ref(const float *x, const uint16_t *w, float *y, int rows, int dim, float eps);

/* C twin of the zero-centred form (Qwen3.5's layer, final and q/k norms,
 * whose stored weight is an offset from 1):
 *   y[r, i] = x[r, i] / sqrt(mean_i(x[r, :]^2) + eps) * (1 + w[i])
 * with 1 + w[i] rounded to fp32 first, as transformers does. In place
 * (y == x) is allowed. */
void hs_kn_rmsnorm_zc_ref(const float *x, const uint16_t *w, float *y, int rows, int dim,
                          float eps);

/* ---- CUDA launchers (kernels/rmsnorm.cu) ---- */
/* Built only with CUDA (HS_HAVE_CUDA). bf16 buffers are device memory;
 * stream is a cudaStream_t. They return HS_OK or an error hs_status_t
 * (HS_ERR_CUDA for a failed launch, HS_ERR_INVALID for bad arguments). */
struct CUstream_st;
/* y = bf16(w * bf16(x * rsqrt(mean(x^2) + eps))) over rows of bf16 x
 * (stride x_stride) into y (stride y_stride; y may equal x); with
 * zero_centered (Qwen3.5) y = bf16(x * rsqrt(mean(x^2) + eps) * (1 + w)),
 * 1 + w in fp32, one rounding. When copy is not NULL, each input row is also
 * copied to copy + r * copy_stride (how a captured layer's residual lands in
 * its slice of the pack buffer). */
HS_MUST_CHECK hs_status_t hs_kn_rmsnorm(const void *x, int64_t x_stride, const void *w, void *y,
                                        int64_t y_stride, int rows, int dim, float eps,
                                        bool zero_centered, void *copy, int64_t copy_stride,
                                        struct CUstream_st *stream);
/* hs_kn_rmsnorm over rows tokens of dim values, and its output quantised to
 * e4m3 per token and group of 128 columns into q [rows, ldq] and scales
 * (fp8_block.h's layout: hs_fp8_act_scale_index with M = rows): the bytes
 * of hs_kn_fp8_quant_groups run on y, in one pass, for an FP8 projection
 * that reads the norm's output. With write_y false, y is written only
 * where the shape does not allow the fused kernel (dim, strides or
 * pointers not 16-byte aligned, ldq not a multiple of 8), which then runs
 * the norm and the quantiser one after the other through y. */
HS_MUST_CHECK hs_status_t hs_kn_rmsnorm_fp8(const void *x, int64_t x_stride, const void *w, void *y,
                                            int64_t y_stride, bool write_y, int rows, int dim,
                                            float eps, bool zero_centered, void *copy,
                                            int64_t copy_stride, uint8_t *q, int64_t ldq,
                                            float *scales, struct CUstream_st *stream);
/* In place over n_heads heads of head_dim at the start of each of T rows of
 * stride row_stride (Qwen3's q/k norm on the fused qkv rows). */
HS_MUST_CHECK hs_status_t hs_kn_rmsnorm_heads(void *x, int64_t row_stride, int T, int n_heads,
                                              int head_dim, const void *w, float eps,
                                              bool zero_centered, struct CUstream_st *stream);

#ifdef __cplusplus
}
#endif
#endif /* HS_KN_RMSNORM_H */
