/* SPDX-License-Identifier: Apache-2.0 */
/* residual_ref.c - C twin of the residual add (see residual.h): out = a + b, fp32. */
#include "residual.h"

void hs_kn_residual_add_ref(const float *a, const float *b, float *out, size_t n)
{
    for (size_t i = 0; i < n; i++)
        out[i] = a[i] + b[i];
}
