/* SPDX-License-Identifier: Apache-2.0 */
/* verify_int.h - the consumer's verify pool (verify.c): checksum threads
 * that check received batches in the order they landed, first in, first
 * out, so with --order plan the batch the trainer waits for is not held
 * behind newer ones. One thread (the network thread) pushes jobs and takes
 * the verdicts; the pool's threads run the check callback on a copy of each
 * job, outside the pool's lock.
 *
 * Memory: jobs and verdicts are held by value in two rings allocated at
 * create; they grow only when more jobs are in flight at once than ever
 * before, so a steady stream of batches allocates nothing.
 *
 * Ownership: jobs are copied in by push and out by take; the pool keeps no
 * pointer into the caller's memory. */
#ifndef HS_VERIFY_INT_H
#define HS_VERIFY_INT_H

#include <stdint.h>
#include <stdbool.h>

#include "hsflow.h"
#include "sched_int.h"

/* One received batch to check, and then its verdict. */
typedef struct {
    uint64_t peer_id, ticket_id;
    hs_sched_item_t item;
    double t_queued;
    bool have_sum; /* the body's checksum came with the payload (shared memory) */
    uint64_t sum;
    hs_status_t status; /* set by the check */
    char why[256];      /* set by the check when status != HS_OK */
} hs__verify_job_t;

/* Checks job->item on a pool thread; sets job->status (and job->why). */
typedef void (*hs__verify_check_cb)(void *arg, hs__verify_job_t *job);
/* Called on a pool thread, under the pool's lock, after a verdict is
 * queued (wakes the taker). */
typedef void (*hs__verify_wake_cb)(void *arg);

typedef struct hs__verify_pool hs__verify_pool_t;

/* Starts n_threads checksum threads (>= 1) with room for `cap` jobs in
 * flight (>= 1). HS_ERR_INVALID for a zero count or a missing callback;
 * HS_ERR_NOMEM when memory or a thread cannot be had (logged, naming the
 * thread): the threads already started are joined and nothing is left. *out
 * is set only on success. */
__attribute__((warn_unused_result)) hs_status_t
hs__verify_pool_create(uint32_t n_threads, uint32_t cap, hs__verify_check_cb check,
                       hs__verify_wake_cb wake, void *arg, hs__verify_pool_t **out);
/* Stops and joins the threads; jobs not yet checked stay queued unchecked.
 * NULL ok; a second call does nothing. Push still queues afterwards. */
void hs__verify_pool_stop(hs__verify_pool_t *vp);
void hs__verify_pool_destroy(hs__verify_pool_t *vp); /* NULL ok; stops first */
/* Queues a copy of *job behind every job pushed before it. HS_ERR_NOMEM
 * (logged) only when the rings had to grow and could not. */
__attribute__((warn_unused_result)) hs_status_t hs__verify_pool_push(hs__verify_pool_t *vp,
                                                                     const hs__verify_job_t *job);
/* The thread-seconds the checksum threads have spent checking so far (the
 * checks in progress included), for the consumer's figures: divided by the
 * seconds and the number of threads it is their busy share. NULL vp gives
 * 0. Any thread. */
double hs__verify_pool_busy_s(hs__verify_pool_t *vp);
/* Tests: every check afterwards takes "slow=MS" milliseconds longer (1 to
 * 10000), so that verification is the run's limit whatever the machine;
 * NULL or "" = none, anything else is warned about and ignored.
 * Process-wide (hs-consumer: HS_VERIFY_FAULT). */
void hs__verify_fault_set(const char *spec);
/* Copies up to `cap` verdicts, oldest first, into out[]; returns how many. */
uint32_t hs__verify_pool_take(hs__verify_pool_t *vp, hs__verify_job_t *out, uint32_t cap);

#endif /* HS_VERIFY_INT_H */
