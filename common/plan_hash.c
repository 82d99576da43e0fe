/* SPDX-License-Identifier: Apache-2.0 */
/* plan_hash.c - the plan hash: what a run is pinned by, bound to every
 * batch's shape (see hs_plan_hash.h). */
#include "hs_plan_hash.h"
#include "hs_bytes.h"

#include <pthread.h>
#include <sodium.h>
#include <string.h>

static pthread_once_t plan_sodium_once = PTHREAD_ONCE_INIT;
static void plan_sodium_init(void) { (void)!sodium_init(); }

/* The arrays in little-endian u32, a block at a time. */
static void hash_u32s(crypto_generichash_state *st, const uint32_t *v, uint32_t n)
{
    uint8_t buf[4096];
    uint32_t i = 0;
    while (i < n) {
        uint32_t k = n - i < sizeof(buf) / 4 ? n - i : (uint32_t)(sizeof(buf) / 4);
        for (uint32_t j = 0; j < k; j++)
            hs_le32_store(buf + 4 * j, v[i + j]);
        crypto_generichash_update(st, buf, 4ull * k);
        i += k;
    }
}

uint64_t hs_plan_hash_of(uint64_t basis, uint32_t n, const uint32_t *n_seqs,
                         const uint32_t *n_tokens)
{
    pthread_once(&plan_sodium_once, plan_sodium_init);
    crypto_generichash_state st;
    uint8_t head[20], out[crypto_generichash_BYTES_MIN]; /* 16; the first 8 are kept */
    memcpy(head, "HSPLAN02", 8);
    hs_le64_store(head + 8, basis);
    hs_le32_store(head + 16, n);
    crypto_generichash_init(&st, NULL, 0, sizeof(out));
    crypto_generichash_update(&st, head, sizeof(head));
    hash_u32s(&st, n_seqs, n);
    hash_u32s(&st, n_tokens, n);
    crypto_generichash_final(&st, out, sizeof(out));
    return hs_le64_load(out);
}
