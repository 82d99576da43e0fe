/* gdn_gates.h - Gated DeltaNet's per-token, per-value-head gates:
 *   beta[t, h] = sigmoid(b[t, h])
 *   g[t, h]    = -exp(A_log[h]) * softplus(a[t, h] + dt_bias[h])
 * softplus(x) = log(1 + exp(x)), and x itself above 20 (PyTorch's
 * threshold). g is the log of the state's decay per step (g <= 0).
 *
 * Shapes: a, b, g, beta [T, n_heads] (b and beta may alias, a and g may
 * alias); A_log, dt_bias [n_heads] fp32 (kept in fp32 from the checkpoint).
 * Precision: fp32. */
#ifndef HS_KN_GDN_GATES_H
#define HS_KN_GDN_GATES_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* C twin. */
void hs_kn_gdn_gates_ref(const float *a, const float *b, const float *A_log, const float *dt_bias,
                         float *g, float *beta, int T, int n_heads);

#ifdef __cplusplus
}
#endif
#endif /* HS_KN_GDN_GATES_H */
