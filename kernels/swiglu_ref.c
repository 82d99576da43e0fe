/* SPDX-License-Identifier: Apache-2.0 */
/* swiglu_ref.c - C twin of SwiGLU (see swiglu.h): out = silu(gate) * up, fp32. */
#include "swiglu.h"

#include <math.h>

void hs_kn_swiglu_ref(const float *gate, const float *up, float *out, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        float g = gate[i];
        out[i] = g / (1.0f + expf(-g)) * up[i];
    }
}
