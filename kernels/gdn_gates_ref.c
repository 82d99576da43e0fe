/* SPDX-License-Identifier: Apache-2.0 */
/* gdn_gates_ref.c - C twin of Gated DeltaNet's gates (see gdn_gates.h):
 * beta = sigmoid(b), g = -exp(A_log) * softplus(a + dt_bias); fp32. */
#include "gdn_gates.h"

#include <math.h>

void hs_kn_gdn_gates_ref(const float *a, const float *b, const float *A_log, const float *dt_bias,
                         float *g, float *beta, int T, int n_heads)
{
    for (int t = 0; t < T; t++) {
        for (int h = 0; h < n_heads; h++) {
            size_t i = (size_t)t * (size_t)n_heads + (size_t)h;
            float x = a[i] + dt_bias[h];
            float sp = x > 20.0f ? x : log1pf(expf(x));
            g[i] = -expf(A_log[h]) * sp;
            beta[i] = 1.0f / (1.0f + expf(-b[i]));
        }
    }
}
