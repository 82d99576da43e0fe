/* SPDX-License-Identifier: Apache-2.0 */
/* gdn_gates.h - Gated DeltaNet's per-token, per-value-head gates:
 *   beta[t, h] = sigmoid(b[t, h])
 *   g[t, h]    = -exp(A_log[h]) * softplus(a[t, h] + dt_bias[h])
 * softplus(x) = log(1 + exp(x)), and x itself above 20 (PyTorch's
 * threshold). g is the log of the state's decay per step (g <= 0).
 *
 * Shapes: a, b, g, beta [T, n_heads] (b and beta may alias, a and g may
 * alias); A_log, dt_bias [n_heads] fp32 (kept in fp32 from the checkpoint).
 * Precision: fp32. */
#ifndef HS_KN_GDN_GATES_H
#define HS_KN_GDN_GATES_H

#include <stddef.h>
#include <stdint.h>
#include "hsflow.h" /* hs_status_t */

#ifdef __cplusplus
extern "C" {
#endif

/* C twin. */
void hs_kn_gdn_gates_ref(const float *a, const float *b, const float *A_log, const float *dt_bias,
                         float *g, float *beta, int T, int n_heads);

/* ---- CUDA launchers (kernels/gdn_gates.cu) ---- */
/* Built only with CUDA (HS_HAVE_CUDA). bf16 buffers are device memory (raw
 * bf16 bits); stream is a cudaStream_t. They return HS_OK or an error
 * hs_status_t (HS_ERR_CUDA for a failed launch, HS_ERR_INVALID for bad
 * arguments). */
struct CUstream_st;
/* a, b bf16 [T, n_heads] rows of strides a_stride, b_stride (columns of
 * the projection's rows, read in place); A_log, dt_bias fp32 [n_heads]
 * (the forward widens a bf16 dt_bias at load); g, beta fp32 [T, n_heads]
 * (row stride n_heads). */
HS_MUST_CHECK hs_status_t hs_kn_gdn_gates(const void *a, int64_t a_stride, const void *b,
                                          int64_t b_stride, const float *A_log,
                                          const float *dt_bias, float *g, float *beta, int T,
                                          int n_heads, struct CUstream_st *stream);

#ifdef __cplusplus
}
#endif
#endif /* HS_KN_GDN_GATES_H */
