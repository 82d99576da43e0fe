/* SPDX-License-Identifier: Apache-2.0 */
/* matmul.h - a linear layer: y[t, n] = sum_k x[t, k] * W[n, k] + bias[n].
 *
 * Shapes: x [T, K] fp32, W [N, K] bf16 (PyTorch nn.Linear layout), bias [N]
 * bf16 or NULL, y [T, N] fp32 (must not overlap x).
 * Precision: bf16 weights widened exactly to fp32, fp32 accumulation.
 * The C twin splits rows of W over OpenMP threads when built with OpenMP. */
#ifndef HS_KN_MATMUL_H
#define HS_KN_MATMUL_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* C twin. */
void hs_kn_matmul_ref(const float *x, const uint16_t *w, const uint16_t *bias, float *y, int T,
                      int K, int N);

/* ---- CUDA launchers (GEMMs go through the cuBLASLt wrapper) ---- */

#ifdef __cplusplus
}
#endif
#endif /* HS_KN_MATMUL_H */
