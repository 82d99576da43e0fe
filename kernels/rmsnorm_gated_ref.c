/* SPDX-License-Identifier: Apache-2.0 */
/* rmsnorm_gated_ref.c - C twin of the gated RMSNorm (see rmsnorm_gated.h):
 * normalise, weight, then multiply by silu(z), in transformers' order; fp32. */
#include "rmsnorm_gated.h"

#include <math.h>

#include "hs_float.h"

void hs_kn_rmsnorm_gated_ref(const float *x, const float *z, const uint16_t *w, float *y, int rows,
                             int dim, float eps)
{
    for (int r = 0; r < rows; r++) {
        const float *xr = x + (size_t)r * (size_t)dim, *zr = z + (size_t)r * (size_t)dim;
        float *yr = y + (size_t)r * (size_t)dim;
        float ss = 0.0f;
        for (int i = 0; i < dim; i++)
            ss += xr[i] * xr[i];
        float inv = 1.0f / sqrtf(ss / (float)dim + eps);
        for (int i = 0; i < dim; i++) {
            float zi = zr[i];
            yr[i] = (hs_bf16_to_f32(w[i]) * (xr[i] * inv)) * (zi / (1.0f + expf(-zi)));
        }
    }
}
