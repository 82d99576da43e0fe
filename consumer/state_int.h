/* SPDX-License-Identifier: Apache-2.0 */
/* state_int.h - the consumer's resume state (DESIGN §12): which batches of
 * which epochs have been handed to the trainer. The trainer saves it in its
 * checkpoint; a consumer created from it delivers exactly the other batches.
 *
 * As compact JSON (hs_state_encode / hs_state_decode):
 *
 *   {"hsflow_state":1,"plan":"<16 hex digits>","batches_per_epoch":N,
 *    "epochs":E,"order":"arrival","delivered":D,"epochs_done":K,
 *    "partial":[{"epoch":e,"count":c,"bitmap":"<base64>"},...]}
 *
 * Every epoch below epochs_done was delivered in full; each "partial" entry
 * is a later epoch with some batches delivered, its bitmap holding bit b
 * (bit b % 8 of byte b / 8) for batch id b, ceil(N / 8) bytes. "delivered"
 * is the total, K * N plus the counts. A state saved before the plan was
 * known has "plan": null and nothing delivered.
 *
 * A state is either decoded (from text: only the partial epochs are held)
 * or bound to a run (hs_state_bind: one bitmap row per epoch still to
 * finish, allocated once, so hs_state_mark never allocates).
 * Ownership: a state owns its memory; hs_state_decode copies what it needs
 * from the text. Not thread-safe: the caller locks. */
#ifndef HS_STATE_INT_H
#define HS_STATE_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "hsflow.h"

#ifdef __cplusplus
extern "C" {
#endif

#define HS_STATE_VERSION 1
/* The longest state text accepted: three epochs in progress of a plan of
 * 10^8 batches per epoch take ~50 MB. */
#define HS_STATE_MAX_BYTES HS_CONSUMER_STATE_MAX_BYTES
#define HS_STATE_MAX_EPOCHS 1000000u

typedef enum { HS_STATE_ARRIVAL = 0, HS_STATE_PLAN = 1 } hs_state_order_t;

typedef struct hs_state hs_state_t;
typedef hs_uneven_t hs_consumer_uneven_t;

/* Parses and checks a state: its version, every field's type and range,
 * bitmap sizes (checked before decoding), the counts against the bitmaps.
 * HS_ERR_FORMAT with what is wrong in why; `len` bytes of `text` are read
 * (no NUL needed). */
HS_MUST_CHECK hs_status_t hs_state_decode(const char *text, size_t len, hs_state_t **out, char *why,
                                          size_t whycap);
/* An empty state (nothing delivered, plan unknown) of a run of `epochs`. */
HS_MUST_CHECK hs_status_t hs_state_create_empty(uint32_t epochs, hs_state_order_t order,
                                                hs_state_t **out);
void hs_state_destroy(hs_state_t *s); /* NULL ok */

/* HS_ERR_MISMATCH with what differs (and what to do) in why when `s` was not
 * saved by a run of this many epochs in this order. */
HS_MUST_CHECK hs_status_t hs_state_check_run(const hs_state_t *s, uint32_t epochs,
                                             hs_state_order_t order, char *why, size_t whycap);
/* HS_ERR_MISMATCH with both values in why when `s` was saved for another
 * plan (hash or batches per epoch); a state without a plan fits any. */
HS_MUST_CHECK hs_status_t hs_state_check_plan(const hs_state_t *s, uint64_t plan_hash,
                                              uint32_t n_batches, char *why, size_t whycap);

/* The rank this state belongs to (DESIGN §11): set on a state created empty
 * or decoded before binding; bound states keep the one of `from`. With
 * world > 1 an epoch is done once the rank's hs_shard_per_rank() batches of
 * it are delivered, and the JSON names "rank", "world" and "uneven". */
void hs_state_set_shard(hs_state_t *s, uint32_t rank, uint32_t world, hs_consumer_uneven_t uneven);
/* HS_ERR_MISMATCH with both in why when `s` was saved by another rank, world
 * size or --uneven mode (a state without them is rank 0 of 1). */
HS_MUST_CHECK hs_status_t hs_state_check_shard(const hs_state_t *s, uint32_t rank, uint32_t world,
                                               hs_consumer_uneven_t uneven, char *why,
                                               size_t whycap);

/* A state bound to the run (plan_hash, n_batches, epochs, order), starting
 * from `from` (NULL: nothing delivered), which must have passed both checks. */
HS_MUST_CHECK hs_status_t hs_state_bind(const hs_state_t *from, uint64_t plan_hash,
                                        uint32_t n_batches, uint32_t epochs, hs_state_order_t order,
                                        hs_state_t **out);
/* Records that (epoch, batch) went to the trainer (bound states only;
 * anything else is ignored). No allocation. */
void hs_state_mark(hs_state_t *s, uint32_t epoch, uint32_t batch);
/* Takes (epoch, batch) back out (a batch handed out that never reached the
 * trainer); as hs_state_mark, nothing when it is not there. */
void hs_state_unmark(hs_state_t *s, uint32_t epoch, uint32_t batch);

/* The state as compact JSON into buf[cap] with a NUL; *len = its length
 * without the NUL. HS_ERR_NOSPACE when cap <= that length (buf may be NULL
 * then), with *len still set: call again with *len + 1 bytes. */
HS_MUST_CHECK hs_status_t hs_state_encode(const hs_state_t *s, char *buf, size_t cap, size_t *len);

bool hs_state_has_plan(const hs_state_t *s);
uint64_t hs_state_plan_hash(const hs_state_t *s);
uint32_t hs_state_n_batches(const hs_state_t *s);
uint32_t hs_state_epochs(const hs_state_t *s);
/* Batches delivered, all epochs. */
uint64_t hs_state_delivered(const hs_state_t *s);
/* The first epoch not delivered in full (== epochs when the run is done). */
uint32_t hs_state_epochs_done(const hs_state_t *s);
/* Whether (epoch, batch) is in the state. */
bool hs_state_has(const hs_state_t *s, uint32_t epoch, uint32_t batch);
/* The delivered set from hs_state_epochs_done() on, as the scheduler's
 * resume_done bitmap: bit (epoch - epochs_done) * N + batch. The caller
 * frees it. NULL when out of memory. */
uint8_t *hs_state_done_bits(const hs_state_t *s);

#ifdef __cplusplus
}
#endif
#endif /* HS_STATE_INT_H */
