/* SPDX-License-Identifier: Apache-2.0 */
/* shard_int.h - the consumer's dealing of each epoch's batches to ranks
 * (shard.c; DESIGN §11), used by the ticket scheduler (sched_int.h). Pure
 * logic on the plan alone; one dealer per scheduler, single-threaded.
 *
 * With W ranks, each rank's scheduler hands out only its shard of every
 * epoch, computed from the plan alone (no rank talks to another):
 *
 *  1. The epoch's order is hs_permutation(seed, epoch, n). With --uneven
 *     drop the last n % W batches of that order are skipped this epoch;
 *     with repeat every batch is kept.
 *  2. The kept batches, sorted by token count (largest first, then id), are
 *     cut into groups of W consecutive batches of like size; each rank gets
 *     one batch of every group, the group's members turned by a rotation
 *     that depends on (seed, epoch, group). A rank's token count per epoch
 *     is thus within the sum of the groups' spreads of any other's.
 *  3. With repeat, the last (smallest) group may have fewer than W members:
 *     the ranks it leaves short take a batch from the start of the epoch's
 *     order instead, one they do not already hold.
 *  4. A rank visits its groups in an order shuffled per epoch.
 *
 * Every rank then gets hs_shard_per_rank() batches each epoch; the union over
 * the ranks is every kept batch once (with repeat, plus n % W taken again). */
#ifndef HS_SHARD_INT_H
#define HS_SHARD_INT_H

#include <stdbool.h>
#include <stdint.h>

#include "hsflow.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    HS_SHARD_DROP = 0,   /* skip the tail of each epoch's order */
    HS_SHARD_REPEAT = 1, /* the short ranks take batches from the epoch's start */
} hs_shard_uneven_t;

/* "drop" or "repeat" (the --uneven flag); HS_ERR_INVALID otherwise. */
HS_MUST_CHECK hs_status_t hs_shard_uneven_parse(const char *s, hs_shard_uneven_t *out);
const char *hs_shard_uneven_str(hs_shard_uneven_t u);
/* Batches each rank gets per epoch: n / world (drop) or ceil(n / world)
 * (repeat). 0 when world is 0 or a rank would get nothing. */
uint32_t hs_shard_per_rank(uint32_t n, uint32_t world, hs_shard_uneven_t u);

typedef struct hs_shard hs_shard_t;

/* A dealer of the plan's n batches (n_tokens: [n] or NULL, copied) to
 * `world` ranks. HS_ERR_INVALID, logged, when a rank would get no batch. */
HS_MUST_CHECK hs_status_t hs_shard_create(uint32_t n, const uint32_t *n_tokens, uint64_t seed,
                                          uint32_t world, hs_shard_uneven_t uneven,
                                          hs_shard_t **out);
void hs_shard_destroy(hs_shard_t *d); /* accepts NULL */
/* Rank `rank`'s batch ids of `epoch`, in its order, into out[per_rank]. */
void hs_shard_deal(hs_shard_t *d, uint32_t epoch, uint32_t rank, uint32_t *out);

/* A dealer's state: the scheduler (sched.c) reads world and uneven;
 * shard.c alone writes it. */
struct hs_shard {
    uint32_t n, world, per_rank;
    uint64_t seed;
    hs_shard_uneven_t uneven;
    uint32_t *n_tokens; /* [n] or NULL */
    uint32_t *sorted;   /* [n] batch ids by token count, largest first, then id */
    uint32_t *perm;     /* [n] scratch: the epoch's order */
    uint32_t *kept;     /* [n] scratch: the kept batches in sorted order */
    uint32_t *origin;   /* [n] scratch: the rank each batch went to (UINT32_MAX: none) */
    uint32_t *gperm;    /* [per_rank] scratch: the order of the groups */
    uint32_t dealt_epoch;
    bool dealt;
};

#ifdef __cplusplus
}
#endif
#endif /* HS_SHARD_INT_H */
