/* sigmoid_gate.h - an output gate: x[i] = x[i] * sigmoid(gate[i]),
 * sigmoid(g) = 1 / (1 + exp(-g)). Qwen3.5's gated attention multiplies the
 * attention output by the sigmoid of the gate half of q_proj before o_proj.
 *
 * Shapes: x, gate [n]. Precision: fp32. */
#ifndef HS_KN_SIGMOID_GATE_H
#define HS_KN_SIGMOID_GATE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* C twin; x is gated in place. */
void hs_kn_sigmoid_gate_ref(float *x, const float *gate, size_t n);

#ifdef __cplusplus
}
#endif
#endif /* HS_KN_SIGMOID_GATE_H */
