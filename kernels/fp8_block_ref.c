/* SPDX-License-Identifier: Apache-2.0 */
/* fp8_block_ref.c - block-scaled e4m3 on the host (see fp8_block.h): the C
 * twin of the activation kernel, and the weight block quantiser and
 * dequantiser the loader uses (--dtype fp8, the CPU forward, and the CUDA
 * forward's bf16 fallback). */
#include "fp8_block.h"

#include "hs_float.h"

/* Factor of a group or block whose largest |value| is amax. */
static float scale_of(float amax) { return amax > 0.0f ? amax / HS_FP8_MAX : 1.0f; }

void hs_kn_fp8_quant_groups_ref(const uint16_t *x, int64_t ldx, int M, int K, uint8_t *q,
                                int64_t ldq, float *scales)
{
    const int64_t G = hs_fp8_blocks(K);
    for (int m = 0; m < M; m++) {
        const uint16_t *xr = x + (int64_t)m * ldx;
        uint8_t *qr = q + (int64_t)m * ldq;
        for (int64_t g = 0; g < G; g++) {
            int64_t k0 = g * HS_FP8_BLOCK, k1 = k0 + HS_FP8_BLOCK < K ? k0 + HS_FP8_BLOCK : K;
            float amax = 0.0f;
            int nonfinite = 0;
            for (int64_t k = k0; k < k1; k++) {
                uint16_t b = xr[k] & 0x7fffu;
                nonfinite |= b >= 0x7f80u;
                float a = hs_bf16_to_f32(b);
                if (a > amax) amax = a;
            }
            float s = nonfinite ? hs_f32_from_bits(0x7fc00000u) : scale_of(amax);
            for (int64_t k = k0; k < k1; k++)
                qr[k] = nonfinite ? 0 : hs_fp8_from_f32(hs_bf16_to_f32(xr[k]) / s);
            scales[hs_fp8_act_scale_index(g, m, M, G)] = s;
        }
    }
}

void hs_fp8_block_quantize(const uint16_t *w, int64_t N, int64_t K, uint8_t *q, float *scale_inv)
{
    const int64_t NB = hs_fp8_blocks(N), KB = hs_fp8_blocks(K);
#pragma omp parallel for schedule(dynamic)
    for (int64_t nb = 0; nb < NB; nb++) {
        int64_t n0 = nb * HS_FP8_BLOCK, n1 = n0 + HS_FP8_BLOCK < N ? n0 + HS_FP8_BLOCK : N;
        for (int64_t kb = 0; kb < KB; kb++) {
            int64_t k0 = kb * HS_FP8_BLOCK, k1 = k0 + HS_FP8_BLOCK < K ? k0 + HS_FP8_BLOCK : K;
            float amax = 0.0f;
            for (int64_t n = n0; n < n1; n++)
                for (int64_t k = k0; k < k1; k++) {
                    float a = hs_bf16_to_f32(w[n * K + k] & 0x7fffu);
                    if (a > amax) amax = a;
                }
            float s = scale_of(amax);
            for (int64_t n = n0; n < n1; n++)
                for (int64_t k = k0; k < k1; k++)
                    q[n * K + k] = hs_fp8_from_f32(hs_bf16_to_f32(w[n * K + k]) / s);
            scale_inv[nb * KB + kb] = s;
        }
    }
}

void hs_fp8_block_dequantize(const uint8_t *q, const float *scale_inv, int64_t N, int64_t K,
                             uint16_t *w)
{
    const int64_t KB = hs_fp8_blocks(K);
    float table[256];
    for (int c = 0; c < 256; c++)
        table[c] = hs_fp8_to_f32((uint8_t)c);
#pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < N; n++) {
        const float *sr = scale_inv + (n / HS_FP8_BLOCK) * KB;
        for (int64_t k = 0; k < K; k++)
            w[n * K + k] = hs_f32_to_bf16(table[q[n * K + k]] * sr[k / HS_FP8_BLOCK]);
    }
}
