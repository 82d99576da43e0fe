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

#ifdef __cplusplus
extern "C" {
#endif

/* C twin. silu != 0 applies y = y / (1 + exp(-y)) after the sum. */
void hs_kn_causal_conv1d_ref(const float *x, const uint16_t *w, float *y, const int32_t *cu_seqlens,
                             int n_seqs, int C, int K, int silu);

#ifdef __cplusplus
}
#endif
#endif /* HS_KN_CONV1D_H */
