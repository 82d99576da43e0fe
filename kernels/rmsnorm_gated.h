/* rmsnorm_gated.h - the gated RMSNorm that closes a Gated DeltaNet layer
 * (per value head, not zero-centred):
 *   y[r, i] = (w[i] * (x[r, i] / sqrt(mean_i(x[r, :]^2) + eps))) * silu(z[r, i])
 * silu(z) = z / (1 + exp(-z)).
 *
 * Shapes: x, z, y [rows, dim] (rows = T * n_v_heads, dim = head_v_dim);
 * y may equal x. w [dim] bf16. Precision: fp32. */
#ifndef HS_KN_RMSNORM_GATED_H
#define HS_KN_RMSNORM_GATED_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* C twin. */
void hs_kn_rmsnorm_gated_ref(const float *x, const float *z, const uint16_t *w, float *y, int rows,
                             int dim, float eps);

#ifdef __cplusplus
}
#endif
#endif /* HS_KN_RMSNORM_GATED_H */
