/* SPDX-License-Identifier: Apache-2.0 */
/* swiglu.h - the gated MLP activation: out[i] = silu(gate[i]) * up[i],
 * silu(g) = g / (1 + exp(-g)).
 *
 * Shapes: gate, up, out [n] (e.g. n = T * intermediate); out may equal gate
 * or up. Precision: fp32. */
#ifndef HS_KN_SWIGLU_H
#define HS_KN_SWIGLU_H

#include <stddef.h>
#include <stdint.h>
#include "hsflow.h" /* hs_status_t */

#ifdef __cplusplus
extern "C" {
#endif

/* C twin. */
void hs_kn_swiglu_ref(const float *gate, const float *up, float *out, size_t n);

/* ---- CUDA launchers (kernels/swiglu.cu) ---- */
/* Built only with CUDA (HS_HAVE_CUDA). bf16 buffers are device memory;
 * stream is a cudaStream_t. They return HS_OK or an error hs_status_t
 * (HS_ERR_CUDA for a failed launch, HS_ERR_INVALID for bad arguments). */
struct CUstream_st;
/* out[t, i] = bf16(bf16(silu(gu[t, i])) * gu[t, I + i]) for the fused
 * gate|up rows gu [T, 2I] (stride gu_stride) into out [T, I] (stride out_stride). */
HS_MUST_CHECK hs_status_t hs_kn_swiglu(const void *gu, int64_t gu_stride, void *out,
                                       int64_t out_stride, int T, int I,
                                       struct CUstream_st *stream);

#ifdef __cplusplus
}
#endif
#endif /* HS_KN_SWIGLU_H */
