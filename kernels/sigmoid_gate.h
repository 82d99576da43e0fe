/* SPDX-License-Identifier: Apache-2.0 */
/* sigmoid_gate.h - an output gate: x[i] = x[i] * sigmoid(gate[i]),
 * sigmoid(g) = 1 / (1 + exp(-g)). Qwen3.5's gated attention multiplies the
 * attention output by the sigmoid of the gate half of q_proj before o_proj.
 *
 * Shapes: x, gate [n]. Precision: fp32. */
#ifndef HS_KN_SIGMOID_GATE_H
#define HS_KN_SIGMOID_GATE_H

#include <stddef.h>
#include <stdint.h>
#include "hsflow.h" /* hs_status_t */

#ifdef __cplusplus
extern "C" {
#endif

/* C twin; x is gated in place. */
void hs_kn_sigmoid_gate_ref(float *x, const float *gate, size_t n);

/* ---- CUDA launchers (kernels/sigmoid_gate.cu) ---- */
/* Built only with CUDA (HS_HAVE_CUDA). bf16 buffers are device memory;
 * stream is a cudaStream_t. They return HS_OK or an error hs_status_t
 * (HS_ERR_CUDA for a failed launch). */
struct CUstream_st;
/* x[t, i] = bf16(x[t, i] * bf16(sigmoid(gate[t, i]))) in place, for T rows
 * of n values: x rows of stride x_stride, gate rows of stride gate_stride
 * (the gate columns of the fused q_proj output). */
HS_MUST_CHECK hs_status_t hs_kn_sigmoid_gate(void *x, int64_t x_stride, const void *gate,
                                             int64_t gate_stride, int T, int n,
                                             struct CUstream_st *stream);

#ifdef __cplusplus
}
#endif
#endif /* HS_KN_SIGMOID_GATE_H */
