/* SPDX-License-Identifier: Apache-2.0 */
/* conv1d_ref.c - C twin of the varlen depthwise causal conv1d (see
 * conv1d.h): per token, per channel, the K-tap dot product over the tokens
 * of the same sequence only; fp32. Tokens are shared over OpenMP threads
 * when the work is large enough to pay for them. */
#include "conv1d.h"

#include <math.h>

#include "hs_float.h"

/* The sequence holding token t: the last s with cu_seqlens[s] <= t. */
static int seq_of(const int32_t *cu_seqlens, int n_seqs, int t)
{
    int lo = 0, hi = n_seqs - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (cu_seqlens[mid] <= t)
            lo = mid;
        else
            hi = mid - 1;
    }
    return lo;
}

void hs_kn_causal_conv1d_ref(const float *x, const uint16_t *w, float *y, const int32_t *cu_seqlens,
                             int n_seqs, int C, int K, int silu)
{
    int T = cu_seqlens[n_seqs];
    /* threads only for work worth a fork and join */
#pragma omp parallel for schedule(static) if ((size_t)T * (size_t)C * (size_t)K > (1u << 18))
    for (int t = 0; t < T; t++) {
        int start = cu_seqlens[seq_of(cu_seqlens, n_seqs, t)];
        float *yt = y + (size_t)t * (size_t)C;
        for (int c = 0; c < C; c++) {
            float acc = 0.0f;
            for (int j = 0; j < K; j++) {
                int src = t - (K - 1) + j;
                if (src < start) continue;
                acc += hs_bf16_to_f32(w[(size_t)c * (size_t)K + (size_t)j]) *
                       x[(size_t)src * (size_t)C + (size_t)c];
            }
            yt[c] = silu ? acc / (1.0f + expf(-acc)) : acc;
        }
    }
}
