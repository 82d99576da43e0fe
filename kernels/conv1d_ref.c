/* conv1d_ref.c - C twin of the varlen depthwise causal conv1d (see
 * conv1d.h): per token, per channel, the K-tap dot product over the tokens
 * of the same sequence only; fp32. Tokens are shared over OpenMP threads. */
#include "conv1d.h"

#include <math.h>

#include "bf16.h"

void hs_kn_causal_conv1d_ref(const float *x, const uint16_t *w, float *y, const int32_t *cu_seqlens,
                             int n_seqs, int C, int K, int silu)
{
    for (int s = 0; s < n_seqs; s++) {
        int start = cu_seqlens[s], end = cu_seqlens[s + 1];
#pragma omp parallel for schedule(static)
        for (int t = start; t < end; t++) {
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
}
