/* SPDX-License-Identifier: Apache-2.0 */
/* embedding_ref.c - C twin of the embedding lookup (see embedding.h):
 * out[t, :] = table[ids[t], :], bf16 -> fp32, shapes [vocab, H] -> [T, H]. */
#include "embedding.h"

#include "hs_float.h"

void hs_kn_embedding_ref(const uint16_t *table, int vocab, int H, const int32_t *ids, int T,
                         float *out)
{
    (void)vocab; /* the caller has checked every id against it */
    for (int t = 0; t < T; t++) {
        const uint16_t *row = table + (size_t)ids[t] * (size_t)H;
        float *o = out + (size_t)t * (size_t)H;
        for (int i = 0; i < H; i++)
            o[i] = hs_bf16_to_f32(row[i]);
    }
}
