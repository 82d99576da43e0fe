/* SPDX-License-Identifier: Apache-2.0 */
/* sched_int.h - the consumer's ticket scheduler (DESIGN §2): which batch of
 * which epoch to hand out next, to whom, and which finished batch the trainer
 * gets next. Pure logic: no I/O, no locks, no allocation of cache memory
 * (the caller reserves a slot and passes its offset); single-threaded, called
 * from the network thread.
 *
 * A work item is (epoch, batch id). Its plan position within the epoch comes
 * from hs_permutation(seed, epoch, n_batches); its run-wide sequence number is
 * seq = epoch * n_batches + pos, and the queue of items still to ticket is
 * always kept in seq order:
 *
 *   PENDING --lease--> LEASED --fill--> FILLED --delivered--> DELIVERED --release--> (gone)
 *      ^                  |
 *      +--return/requeue--+   (back to the front, keeping the cache slot)
 *
 * Items taken back from a dead connection (hs_sched_return_leases) or whose
 * payload failed verification (hs_sched_requeue) keep their slot and come
 * before every item not yet leased; with seq order this means no item can
 * wait for cache space behind items that come after it, so PLAN order cannot
 * deadlock on a full cache.
 *
 * Tickets are numbered from 1 and never reused, so a late DONE for a lease
 * that was returned is rejected by hs_sched_lookup(). Each (epoch, batch) has
 * at most one live record and a per-epoch delivered bitmap, so delivery is
 * exactly once by construction.
 *
 * Ownership: hs_sched_create() copies everything it needs from the config. */
#ifndef HS_SCHED_INT_H
#define HS_SCHED_INT_H

#include <stdbool.h>
#include <stdint.h>

#include "hsflow.h"
#include "shard_int.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    HS_SCHED_ARRIVAL = 0, /* deliver in the order payloads were verified */
    HS_SCHED_PLAN = 1,    /* deliver strictly in plan order */
} hs_sched_order_t;

/* "arrival" or "plan" (the --order flag); HS_ERR_INVALID otherwise. */
HS_MUST_CHECK hs_status_t hs_sched_order_parse(const char *s, hs_sched_order_t *out);
const char *hs_sched_order_str(hs_sched_order_t order);

typedef struct {
    uint32_t n_batches;       /* batches per epoch (> 0) */
    const uint64_t *bytes;    /* [n_batches] exact payload bytes of each batch (> 0) */
    const uint32_t *n_seqs;   /* [n_batches] sequences per batch, or NULL */
    const uint32_t *n_tokens; /* [n_batches] tokens per batch, or NULL */
    uint32_t epochs;          /* epochs of the whole run (> start_epoch) */
    uint64_t seed;            /* plan seed for hs_permutation */
    hs_sched_order_t order;
    uint32_t start_epoch; /* resume: epochs before this one are done */
    /* resume: bitmap over the batch ids of start_epoch already delivered
     * (bit b of byte b/8), or NULL for none */
    const uint8_t *start_done;
    /* resume from a journal: bitmap over (epoch - start_epoch) * n_batches +
     * batch for every epoch from start_epoch on (bit i of byte i/8), or NULL.
     * Used instead of start_done when set. */
    const uint8_t *resume_done;
    /* ranks: this scheduler hands out only rank `rank`'s shard of a world of
     * `world` (0 or 1: the whole plan); see shard_int.h. */
    uint32_t rank, world;
    hs_shard_uneven_t uneven;
    /* The most items the caller expects alive at once (leased, returned,
     * filled or being delivered; each holds a cache slot): their records
     * and tickets get room at create, and the tables grow past it only when
     * more are alive than that. At most HS_SCHED_LIVE_PLAN_MAX; 0: small
     * tables that grow as needed. */
    uint32_t live_plan;
} hs_sched_config_t;

#define HS_SCHED_LIVE_PLAN_MAX (1u << 16) /* 64 Ki records: about 6 MiB of tables */

typedef enum {
    HS_SCHED_PENDING = 0,
    HS_SCHED_LEASED,
    HS_SCHED_FILLED,
    HS_SCHED_DELIVERED,
} hs_sched_state_t;

typedef struct {
    uint32_t epoch;
    uint32_t batch; /* batch id within the epoch's plan */
    uint32_t pos;   /* place in the epoch's order (of this rank's shard) */
    uint64_t seq;   /* epoch * per_epoch + pos */
    uint64_t bytes; /* exact payload size */
    uint32_t n_seqs, n_tokens;
    bool has_slot;        /* a cache slot is already attached (returned item) */
    uint64_t slot_offset; /* valid when has_slot */
    uint64_t ticket;      /* 0 when not leased yet */
    uint64_t conn;        /* holder of the lease (LEASED only) */
    hs_sched_state_t state;
    bool payload; /* LEASED: its payload was accepted (landing or landed) */
} hs_sched_item_t;

typedef struct {
    uint64_t planned;          /* items this run delivers (minus resumed ones) */
    uint64_t pending;          /* items waiting for a ticket, returned ones included */
    uint64_t pending_returned; /* of which carry a slot (returned or requeued) */
    uint64_t leased;           /* tickets out now */
    uint64_t filled;           /* verified, waiting for the trainer */
    uint64_t delivering;       /* delivered, not yet released */
    uint64_t issued;           /* tickets ever issued, re-leases included */
    uint64_t delivered;        /* items handed to the trainer */
    uint64_t released;
    uint64_t returned;      /* leases taken back from dead connections */
    uint64_t requeued;      /* payloads that failed verification */
    uint64_t duplicates;    /* deliveries refused as already done (a bug if not 0) */
    uint32_t per_epoch;     /* batches this rank gets per epoch */
    uint32_t skipped;       /* per epoch: dropped by --uneven drop (all ranks) */
    uint32_t repeated;      /* per epoch: dealt twice by --uneven repeat (all ranks) */
    uint32_t issue_epoch;   /* epoch of the next fresh ticket (== epochs when all issued) */
    uint32_t deliver_epoch; /* PLAN: epoch of the next delivery */
} hs_sched_stats_t;

typedef struct hs_sched hs_sched_t;

HS_MUST_CHECK hs_status_t hs_sched_create(const hs_sched_config_t *cfg, hs_sched_t **out);
void hs_sched_destroy(hs_sched_t *s); /* accepts NULL */

/* The item at the front of the queue, to ticket next; false when nothing is
 * left to ticket. If out->has_slot, it keeps that slot (do not reserve one);
 * otherwise reserve out->bytes in the cache, then call hs_sched_lease(). */
bool hs_sched_peek(const hs_sched_t *s, hs_sched_item_t *out);
/* Lease the front item to `conn` in the cache slot at `slot_offset` (which
 * must equal the item's slot when it has one). *ticket: a run-unique id > 0.
 * HS_ERR_NOT_FOUND if the queue is empty; HS_ERR_INVALID on a slot mismatch. */
HS_MUST_CHECK hs_status_t hs_sched_lease(hs_sched_t *s, uint64_t conn, uint64_t slot_offset,
                                         uint64_t *ticket);
/* The item of `ticket` if `conn` holds it as a lease now; HS_ERR_NOT_FOUND
 * otherwise (unknown, stale, already filled, or held by another conn). */
HS_MUST_CHECK hs_status_t hs_sched_lookup(const hs_sched_t *s, uint64_t conn, uint64_t ticket,
                                          hs_sched_item_t *out);
/* `conn` is about to receive the payload of its lease `ticket` into the
 * slot: once per lease, so that nothing more is written into a slot whose
 * payload came (a second DONE would overwrite a batch after its check).
 * HS_ERR_NOT_FOUND if `conn` does not hold the lease, HS_ERR_BUSY if its
 * payload was accepted already. */
HS_MUST_CHECK hs_status_t hs_sched_payload_accept(hs_sched_t *s, uint64_t conn, uint64_t ticket);
/* The item of a live ticket in any state (no holder check). */
HS_MUST_CHECK hs_status_t hs_sched_get(const hs_sched_t *s, uint64_t ticket, hs_sched_item_t *out);
/* The payload of `ticket` arrived and was verified: the item is ready.
 * HS_ERR_NOT_FOUND if `conn` does not hold that lease. */
HS_MUST_CHECK hs_status_t hs_sched_fill(hs_sched_t *s, uint64_t conn, uint64_t ticket);
/* The payload of `ticket` failed verification: the ticket is retired and the
 * item goes back to the front of the queue with its slot. */
HS_MUST_CHECK hs_status_t hs_sched_requeue(hs_sched_t *s, uint64_t conn, uint64_t ticket);
/* `conn` is gone: its leases are retired and their items go back to the
 * front of the queue, in plan order, keeping their slots. Returns how many. */
uint32_t hs_sched_return_leases(hs_sched_t *s, uint64_t conn);
uint32_t hs_sched_leases_of(const hs_sched_t *s, uint64_t conn);
/* Payload bytes of the leases `conn` holds now (the cache they pin). */
uint64_t hs_sched_bytes_of(const hs_sched_t *s, uint64_t conn);

/* The item to hand to the trainer next, without taking it: ARRIVAL = the
 * oldest verified; PLAN = the next item in plan order, only once it is
 * verified. False when there is none now. */
bool hs_sched_next_ready(const hs_sched_t *s, hs_sched_item_t *out);
/* The item of `ticket` was handed to the trainer. HS_ERR_INVALID if it is
 * not FILLED or (PLAN) not the next in plan order. */
HS_MUST_CHECK hs_status_t hs_sched_delivered(hs_sched_t *s, uint64_t ticket);
/* The trainer is done with it: the record goes; the caller frees the slot. */
HS_MUST_CHECK hs_status_t hs_sched_release(hs_sched_t *s, uint64_t ticket);

/* Every item of every epoch has been delivered. */
bool hs_sched_finished(const hs_sched_t *s);
void hs_sched_stats(const hs_sched_t *s, hs_sched_stats_t *out);

#ifdef __cplusplus
}
#endif
#endif /* HS_SCHED_INT_H */
