/* SPDX-License-Identifier: Apache-2.0 */
/* rmsnorm_ref.c - C twin of RMSNorm (see rmsnorm.h):
 * y = x / sqrt(mean(x^2) + eps) * w (or * (1 + w), zero-centred) over rows
 * of [rows, dim]; fp32 math, bf16 weight. Same operation order as Hugging
 * Face's LlamaRMSNorm and Qwen3_5RMSNorm in fp32. */
#include "rmsnorm.h"

#include <math.h>

#include "hs_float.h"

static void rmsnorm(const float *x, const uint16_t *w, float *y, int rows, int dim, float eps,
                    float offset)
{
    for (int r = 0; r < rows; r++) {
        const float *xr = x + (size_t)r * (size_t)dim;
        float *yr = y + (size_t)r * (size_t)dim;
        float ss = 0.0f;
        for (int i = 0; i < dim; i++)
            ss += xr[i] * xr[i];
        float inv = 1.0f / sqrtf(ss / (float)dim + eps);
        for (int i = 0; i < dim; i++)
            yr[i] = (xr[i] * inv) * (offset + hs_bf16_to_f32(w[i]));
    }
}

void hs_kn_rmsnorm_ref(const float *x, const uint16_t *w, float *y, int rows, int dim, float eps)
{
    rmsnorm(x, w, y, rows, dim, eps, 0.0f);
}

void hs_kn_rmsnorm_zc_ref(const float *x, const uint16_t *w, float *y, int rows, int dim, float eps)
{
    rmsnorm(x, w, y, rows, dim, eps, 1.0f);
}
