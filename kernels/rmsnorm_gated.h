/* SPDX-License-Identifier: Apache-2.0 */
/* rmsnorm_gated.h - the gated RMSNorm that closes a Gated DeltaNet layer
 * (per value head, not zero-centred):
 *   y[r, i] = (w[i] * (x[r, i] / sqrt(mean_i(x[r, :]^2) + eps))) * silu(z[r, i])
 * silu(z) = z / (1 + exp(-z)).
 *
 * Shapes: x, z, y [rows, dim] (rows = T * n_v_heads, dim = head_v_dim);
 * y may equal x. w [dim] bf16. Precision: fp32. */
#ifndef HS_KN_RMSNORM_GATED_H
#define HS_KN_RMSNORM_GATED_H

#include <stddef.h>
#include <stdint.h>
#include "hsflow.h" /* hs_status_t */

#ifdef __cplusplus
extern "C" {
#endif

/* C twin. */
void hs_kn_rmsnorm_gated_ref(const float *x, const float *z, const uint16_t *w, float *y, int rows,
                             int dim, float eps);

/* ---- CUDA launchers (kernels/rmsnorm_gated.cu) ---- */
/* Built only with CUDA (HS_HAVE_CUDA). bf16 buffers are device memory (raw
 * bf16 bits); stream is a cudaStream_t. They return HS_OK or an error
 * hs_status_t (HS_ERR_CUDA for a failed launch, HS_ERR_INVALID for bad
 * arguments). */
struct CUstream_st;
/* Per row r of dim values (one value head): row r of x starts at
 * x + r * x_stride, of z at z + r * z_stride, of y at y + r * y_stride
 * (elements; for [T, n_v_heads * dv] buffers: rows = T * n_v_heads,
 * strides = dim). y = rmsnorm(x) * w * silu(z), bf16 in and out, fp32 math,
 * one rounding at the end; y may equal x. w bf16 [dim]. */
HS_MUST_CHECK hs_status_t hs_kn_rmsnorm_gated(const void *x, int64_t x_stride, const void *z,
                                              int64_t z_stride, const void *w, void *y,
                                              int64_t y_stride, int rows, int dim, float eps,
                                              struct CUstream_st *stream);

#ifdef __cplusplus
}
#endif
#endif /* HS_KN_RMSNORM_GATED_H */
