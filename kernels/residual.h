/* SPDX-License-Identifier: Apache-2.0 */
/* residual.h - residual add: out[i] = a[i] + b[i].
 *
 * Shapes: a, b, out [n]; out may equal a or b. Precision: fp32. */
#ifndef HS_KN_RESIDUAL_H
#define HS_KN_RESIDUAL_H

#include <stddef.h>
#include <stdint.h>
#include "hsflow.h" /* hs_status_t */

#ifdef __cplusplus
extern "C" {
#endif

/* C twin. */
void hs_kn_residual_add_ref(const float *a, const float *b, float *out, size_t n);

/* ---- CUDA launchers (kernels/residual.cu) ---- */
/* Built only with CUDA (HS_HAVE_CUDA). bf16 buffers are device memory;
 * stream is a cudaStream_t. They return HS_OK or an error hs_status_t
 * (HS_ERR_CUDA for a failed launch, HS_ERR_INVALID for bad arguments). */
struct CUstream_st;
/* out[i] = bf16(a[i] + b[i]) over n bf16 values; out may equal a or b. */
HS_MUST_CHECK hs_status_t hs_kn_residual_add(const void *a, const void *b, void *out, size_t n,
                                             struct CUstream_st *stream);

#ifdef __cplusplus
}
#endif
#endif /* HS_KN_RESIDUAL_H */
