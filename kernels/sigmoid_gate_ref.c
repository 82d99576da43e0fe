/* SPDX-License-Identifier: Apache-2.0 */
/* sigmoid_gate_ref.c - C twin of the sigmoid output gate (see
 * sigmoid_gate.h): x *= sigmoid(gate), fp32. */
#include "sigmoid_gate.h"

#include <math.h>

void hs_kn_sigmoid_gate_ref(float *x, const float *gate, size_t n)
{
    for (size_t i = 0; i < n; i++)
        x[i] = x[i] * (1.0f / (1.0f + expf(-gate[i])));
}
