/* SPDX-License-Identifier: Apache-2.0 */
/* conv1d.h - depthwise causal 1-D convolution over packed variable-length
 * sequences, with an optional SiLU (Gated DeltaNet's short convolution):
 *   y[t, c] = act( sum_{j=0}^{K-1} w[c, j] * x[t - (K - 1) + j, c] )
 * where a term whose token t - (K - 1) + j lies before the start of t's
 * sequence (cu_seqlens) is zero: the window restarts at every boundary, as
 * if each sequence ran alone with K - 1 zeros of left padding (PyTorch's
 * Conv1d(groups=C, padding=K-1) cut to the first L outputs).
 *
 * Shapes: x, y [T, C] (row stride C, T = cu_seqlens[n_seqs]), w [C, K]
 * bf16 (the checkpoint's conv1d.weight [C, 1, K]). y must not overlap x.
 * Precision: fp32 arithmetic, bf16 weights widened exactly. */
#ifndef HS_KN_CONV1D_H
#define HS_KN_CONV1D_H

#include <stddef.h>
#include <stdint.h>
#include "hsflow.h" /* hs_status_t */

#ifdef __cplusplus
extern "C" {
#endif

/* C twin. silu != 0 applies y = y / (1 + exp(-y)) after the sum. */
void hs_kn_causal_conv1d_ref(const float *x, const uint16_t *w, float *y, const int32_t *cu_seqlens,
                             int n_seqs, int C, int K, int silu);

/* ---- CUDA launchers (kernels/conv1d.cu) ---- */
/* Built only with CUDA (HS_HAVE_CUDA). bf16 buffers are device memory (raw
 * bf16 bits); stream is a cudaStream_t. They return HS_OK or an error
 * hs_status_t (HS_ERR_CUDA for a failed launch, HS_ERR_INVALID for bad
 * arguments). */
struct CUstream_st;
/* x, y bf16 [T, C] rows of strides x_stride, y_stride (elements; the conv
 * reads the qkv columns of the projection's rows in place); w bf16 [C, K];
 * cu_seqlens [n_seqs + 1] device int32 with cu_seqlens[n_seqs] == T.
 * K <= 8. y must not overlap x. fp32 sums, one rounding to bf16. */
HS_MUST_CHECK hs_status_t hs_kn_causal_conv1d(const void *x, int64_t x_stride, const void *w,
                                              void *y, int64_t y_stride, const int32_t *cu_seqlens,
                                              int n_seqs, int T, int C, int K, int silu,
                                              struct CUstream_st *stream);

#ifdef __cplusplus
}
#endif
#endif /* HS_KN_CONV1D_H */
