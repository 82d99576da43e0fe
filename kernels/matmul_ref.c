/* SPDX-License-Identifier: Apache-2.0 */
/* matmul_ref.c - C twin of the linear layer (see matmul.h):
 * y[T, N] = x[T, K] * W[N, K]^T (+ bias[N]); bf16 W widened to fp32, fp32
 * accumulation. Blocks of W rows are widened once into a small fp32 tile and
 * reused for every row of x; blocks are shared out over OpenMP threads. */
#include "matmul.h"

#include <stdlib.h>

#include "hs_float.h"

#define HS_MM_NB 8 /* W rows per tile */

static void matmul_block(const float *x, const uint16_t *w, const uint16_t *bias, float *y, int T,
                         int K, int N, int n0, float *tile)
{
    int nb = N - n0 < HS_MM_NB ? N - n0 : HS_MM_NB;
    for (int j = 0; j < nb; j++) {
        const uint16_t *wr = w + (size_t)(n0 + j) * (size_t)K;
        for (int k = 0; k < K; k++)
            tile[(size_t)j * K + k] = hs_bf16_to_f32(wr[k]);
    }
    for (int t = 0; t < T; t++) {
        const float *xr = x + (size_t)t * (size_t)K;
        float *yr = y + (size_t)t * (size_t)N + n0;
        for (int j = 0; j < nb; j++) {
            const float *wt = tile + (size_t)j * K;
            float acc = 0.0f;
            for (int k = 0; k < K; k++)
                acc += xr[k] * wt[k];
            yr[j] = bias ? acc + hs_bf16_to_f32(bias[n0 + j]) : acc;
        }
    }
}

void hs_kn_matmul_ref(const float *x, const uint16_t *w, const uint16_t *bias, float *y, int T,
                      int K, int N)
{
    int nblocks = (N + HS_MM_NB - 1) / HS_MM_NB;
    /* threads only for work worth a fork and join */
#pragma omp parallel if ((size_t)T * (size_t)K * (size_t)N > (1u << 18))
    {
        /* one tile per thread; if it cannot be had, fall back to widening
         * on the fly through a one-row tile on the stack */
        float *tile = malloc((size_t)HS_MM_NB * (size_t)K * sizeof(float));
#pragma omp for schedule(static)
        for (int b = 0; b < nblocks; b++) {
            if (tile) {
                matmul_block(x, w, bias, y, T, K, N, b * HS_MM_NB, tile);
            } else {
                for (int n = b * HS_MM_NB; n < N && n < (b + 1) * HS_MM_NB; n++) {
                    const uint16_t *wr = w + (size_t)n * (size_t)K;
                    for (int t = 0; t < T; t++) {
                        const float *xr = x + (size_t)t * (size_t)K;
                        float acc = 0.0f;
                        for (int k = 0; k < K; k++)
                            acc += xr[k] * hs_bf16_to_f32(wr[k]);
                        y[(size_t)t * N + n] = bias ? acc + hs_bf16_to_f32(bias[n]) : acc;
                    }
                }
            }
        }
        free(tile);
    }
}
