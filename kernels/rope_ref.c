/* SPDX-License-Identifier: Apache-2.0 */
/* rope_ref.c - rotary embedding tables and the C twin of RoPE (see rope.h):
 * rotate-half RoPE in place on [T, n_heads * d], positions restarting at 0 at
 * each cu_seqlens boundary, over the whole head or its first rot_dim dims;
 * fp32 angles and arithmetic. */
#include "rope.h"

#include <math.h>

void hs_kn_rope_inv_freq(int head_dim, float theta, const hs_rope_scaling_t *scaling,
                         float *inv_freq)
{
    int half = head_dim / 2;
    for (int i = 0; i < half; i++) {
        /* as torch: exponent and power in fp32 */
        float e = (float)(2 * i) / (float)head_dim;
        inv_freq[i] = 1.0f / powf(theta, e);
    }
    if (!scaling || scaling->type == HS_ROPE_DEFAULT) return;
    if (scaling->type == HS_ROPE_LINEAR) {
        for (int i = 0; i < half; i++)
            inv_freq[i] /= scaling->factor;
        return;
    }
    /* llama3: wavelengths compared against the original context window */
    float factor = scaling->factor;
    float lo = scaling->low_freq_factor, hi = scaling->high_freq_factor;
    float old_ctx = scaling->original_max_positions;
    float low_freq_wavelen = old_ctx / lo;
    float high_freq_wavelen = old_ctx / hi;
    for (int i = 0; i < half; i++) {
        float f = inv_freq[i];
        float wavelen = 2.0f * (float)M_PI / f;
        float scaled = wavelen > low_freq_wavelen ? f / factor : f;
        if (!(wavelen < high_freq_wavelen) && !(wavelen > low_freq_wavelen)) {
            float smooth = (old_ctx / wavelen - lo) / (hi - lo);
            scaled = (1.0f - smooth) * scaled / factor + smooth * scaled;
        }
        inv_freq[i] = scaled;
    }
}

void hs_kn_rope_ref(float *x, const int32_t *cu_seqlens, int n_seqs, int n_heads, int head_dim,
                    const float *inv_freq)
{
    hs_kn_rope_partial_ref(x, cu_seqlens, n_seqs, n_heads, head_dim, head_dim, inv_freq);
}

void hs_kn_rope_partial_ref(float *x, const int32_t *cu_seqlens, int n_seqs, int n_heads,
                            int head_dim, int rot_dim, const float *inv_freq)
{
    int half = rot_dim / 2;
    size_t row = (size_t)n_heads * (size_t)head_dim;
    for (int s = 0; s < n_seqs; s++) {
        for (int32_t t = cu_seqlens[s]; t < cu_seqlens[s + 1]; t++) {
            float pos = (float)(t - cu_seqlens[s]);
            float *xt = x + (size_t)t * row;
            for (int i = 0; i < half; i++) {
                float a = pos * inv_freq[i];
                float c = cosf(a), sn = sinf(a);
                for (int h = 0; h < n_heads; h++) {
                    float *xh = xt + (size_t)h * (size_t)head_dim;
                    float x1 = xh[i], x2 = xh[i + half];
                    xh[i] = x1 * c - x2 * sn;
                    xh[i + half] = x2 * c + x1 * sn;
                }
            }
        }
    }
}
