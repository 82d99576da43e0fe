/* SPDX-License-Identifier: Apache-2.0 */
/* fuzz_config.c - config.json parsing (model/config.c): architectures,
 * sizes, head and key/value head counts, rope_scaling / rope_parameters,
 * partial rotary dims, sliding windows, biases, the hybrid layer types.
 *
 * Input: the text of a config.json. An accepted config must keep the
 * invariants the forward relies on, and its rope frequencies (computed as
 * hs_model_load does) must be finite numbers. */
#include <math.h>
#include <stdlib.h>

#include "attention.h"
#include "model_int.h"
#include "rope.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    hs_model_config_t c;
    if (hs__model_config_parse((const char *)data, size, "config.json", &c) != HS_OK) return 0;
    if (c.hidden_size < 1 || c.num_heads < 1 || c.num_kv_heads < 1 || c.head_dim < 2 ||
        c.head_dim % 2 || c.head_dim > HS_KN_ATTN_MAX_HEAD_DIM || c.num_heads % c.num_kv_heads ||
        c.num_layers < 1 || c.vocab_size < 1 || c.intermediate_size < 1 ||
        !isfinite(c.rms_norm_eps) || !(c.rms_norm_eps > 0) || !isfinite(c.rope_theta) ||
        !(c.rope_theta > 0) || c.rotary_dim < 2 || c.rotary_dim % 2 || c.rotary_dim > c.head_dim)
        abort();
    hs_rope_scaling_t sc = {
        .type = (hs_rope_type_t)c.rope_type,
        .factor = c.rope_factor,
        .low_freq_factor = c.rope_low_freq_factor,
        .high_freq_factor = c.rope_high_freq_factor,
        .original_max_positions = c.rope_original_max_positions,
    };
    float inv_freq[HS_KN_ATTN_MAX_HEAD_DIM / 2];
    hs_kn_rope_inv_freq(c.rotary_dim, c.rope_theta, &sc, inv_freq);
    for (int i = 0; i < c.rotary_dim / 2; i++)
        if (!isfinite(inv_freq[i])) abort();
    return 0;
}
