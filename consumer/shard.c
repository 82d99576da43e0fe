/* SPDX-License-Identifier: Apache-2.0 */
/* shard.c - each epoch's batches dealt to ranks; see shard_int.h. */
#include "shard_int.h"
#include "hs_log.h"
#include "hs_shuffle.h"

#include <stdlib.h>
#include <string.h>

hs_status_t hs_shard_uneven_parse(const char *str, hs_shard_uneven_t *out)
{
    if (str && strcmp(str, "drop") == 0) {
        *out = HS_SHARD_DROP;
        return HS_OK;
    }
    if (str && strcmp(str, "repeat") == 0) {
        *out = HS_SHARD_REPEAT;
        return HS_OK;
    }
    hs_error("sched: unknown --uneven mode '%s'; use drop (skip each epoch's tail) or repeat (the "
             "short ranks take batches from the epoch's start)",
             str ? str : "(null)");
    return HS_ERR_INVALID;
}

const char *hs_shard_uneven_str(hs_shard_uneven_t u)
{
    return u == HS_SHARD_REPEAT ? "repeat" : u == HS_SHARD_DROP ? "drop" : "unknown";
}

uint32_t hs_shard_per_rank(uint32_t n, uint32_t world, hs_shard_uneven_t u)
{
    if (world == 0) return 0;
    return u == HS_SHARD_REPEAT ? (uint32_t)(((uint64_t)n + world - 1) / world) : n / world;
}

static const uint32_t *shard_tokens;

static int shard_cmp(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    uint32_t tx = shard_tokens ? shard_tokens[x] : 0, ty = shard_tokens ? shard_tokens[y] : 0;
    if (tx != ty) return tx > ty ? -1 : 1;
    return x < y ? -1 : x > y;
}

void hs_shard_destroy(hs_shard_t *d)
{
    if (!d) return;
    free(d->n_tokens);
    free(d->sorted);
    free(d->perm);
    free(d->kept);
    free(d->origin);
    free(d->gperm);
    free(d);
}

hs_status_t hs_shard_create(uint32_t n, const uint32_t *n_tokens, uint64_t seed, uint32_t world,
                            hs_shard_uneven_t uneven, hs_shard_t **out)
{
    uint32_t per_rank = hs_shard_per_rank(n, world, uneven);
    if (per_rank == 0) {
        hs_error("sched: the plan has %u batches per epoch, fewer than the %u ranks: with --uneven "
                 "drop a rank would get none; use --uneven repeat, fewer ranks or a smaller "
                 "--token-budget",
                 n, world);
        return HS_ERR_INVALID;
    }
    hs_shard_t *d = calloc(1, sizeof(*d));
    if (!d) return HS_ERR_NOMEM;
    d->n = n;
    d->world = world;
    d->per_rank = per_rank;
    d->seed = seed;
    d->uneven = uneven;
    d->n_tokens = n_tokens ? malloc(n * sizeof(uint32_t)) : NULL;
    d->sorted = malloc(n * sizeof(uint32_t));
    d->perm = malloc(n * sizeof(uint32_t));
    d->kept = malloc(n * sizeof(uint32_t));
    d->origin = malloc(n * sizeof(uint32_t));
    d->gperm = malloc(per_rank * sizeof(uint32_t));
    if ((n_tokens && !d->n_tokens) || !d->sorted || !d->perm || !d->kept || !d->origin ||
        !d->gperm) {
        hs_error("sched: out of memory for the shards of %u batches", n);
        hs_shard_destroy(d);
        return HS_ERR_NOMEM;
    }
    if (n_tokens) memcpy(d->n_tokens, n_tokens, n * sizeof(uint32_t));
    for (uint32_t b = 0; b < n; b++)
        d->sorted[b] = b;
    shard_tokens = d->n_tokens; /* qsort has no context argument; called at create only */
    qsort(d->sorted, n, sizeof(uint32_t), shard_cmp);
    shard_tokens = NULL;
    *out = d;
    return HS_OK;
}

/* The turn of group g's members in epoch e: member k goes to rank (k + rot) % world. */
static uint32_t shard_rotation(const hs_shard_t *d, uint32_t epoch, uint32_t g)
{
    uint64_t st = d->seed ^ (0x9E3779B97F4A7C15ull * ((uint64_t)epoch + 1)) ^
                  (0xC2B2AE3D27D4EB4Full * ((uint64_t)g + 1));
    return (uint32_t)(hs_splitmix64(&st) % d->world);
}

/* Deals the whole epoch: kept[] and origin[] (once per epoch). */
static void shard_deal_epoch(hs_shard_t *d, uint32_t epoch)
{
    if (d->dealt && d->dealt_epoch == epoch) return;
    uint32_t n = d->n, w = d->world, m = d->per_rank;
    hs_permutation(d->seed, epoch, n, d->perm);
    uint32_t n_kept = d->uneven == HS_SHARD_DROP ? w * m : n;
    for (uint32_t b = 0; b < n; b++)
        d->origin[b] = 0; /* 0 = kept, 1 = dropped, while building kept[] */
    for (uint32_t i = n_kept; i < n; i++)
        d->origin[d->perm[i]] = 1;
    uint32_t k = 0;
    for (uint32_t i = 0; i < n; i++)
        if (!d->origin[d->sorted[i]]) d->kept[k++] = d->sorted[i];
    for (uint32_t b = 0; b < n; b++)
        d->origin[b] = UINT32_MAX;
    for (uint32_t i = 0; i < n_kept; i++)
        d->origin[d->kept[i]] = (i % w + shard_rotation(d, epoch, i / w)) % w;
    /* the groups are visited in an order of their own, salted apart from the batches' */
    hs_permutation(d->seed ^ 0x5A17D5A17D5A17D5ull, epoch, m, d->gperm);
    d->dealt = true;
    d->dealt_epoch = epoch;
}

void hs_shard_deal(hs_shard_t *d, uint32_t epoch, uint32_t rank, uint32_t *out)
{
    shard_deal_epoch(d, epoch);
    uint32_t n = d->n, w = d->world, m = d->per_rank;
    uint32_t n_kept = d->uneven == HS_SHARD_DROP ? w * m : n;
    for (uint32_t p = 0; p < m; p++) {
        uint32_t g = d->gperm[p];
        uint32_t k = (rank + w - shard_rotation(d, epoch, g)) % w;
        uint64_t at = (uint64_t)g * w + k;
        if (at < n_kept) {
            out[p] = d->kept[at];
            continue;
        }
        /* the last group is short of this rank: the i-th rank it leaves out
         * takes the first batch from position i of the epoch's order on that
         * it does not hold already */
        uint32_t q = n_kept - g * w, i = k - q;
        uint32_t pick = d->perm[i % n];
        for (uint32_t t = 0; t < n; t++) {
            uint32_t b = d->perm[(i + t) % n];
            if (d->origin[b] != rank) {
                pick = b;
                break;
            }
        }
        out[p] = pick;
    }
}
