/* SPDX-License-Identifier: Apache-2.0 */
/* shm_copy_int.h - the consumer's shared-memory copiers: a few threads that
 * move payloads out of producers' segments into their destinations, each
 * in one pass that also computes the checksum the receiver asked for
 * (shm_int.h, "Receive").
 *
 * Why threads: one copy of a 64 MiB batch with its checksum keeps one core
 * busy for 10-30 ms. On the loop thread, the copies of every producer on
 * the host would run one after another and the loop would read nothing
 * meanwhile; with copiers, the payloads of several producers are copied at
 * once while the loop goes on with the other connections.
 *
 * A job belongs to its connection (at most one each). The loop thread
 * submits it; a copier takes it, copies, then puts it on the done list and
 * writes to the transport's wake-up eventfd; the loop thread takes it from
 * there (hs__shm_copier_take_done) and finishes the payload. A connection
 * that closes with its job in flight waits for it first
 * (hs__shm_copier_wait): a copier never writes into memory that was given
 * back, nor reads a segment that was unmapped.
 *
 * One payload, several copiers: the copier that takes a job splits it into
 * pieces of at least 1 MiB. It copies them from the front, checksumming
 * each right after writing it; copiers with no whole job of their own copy
 * pieces from the back meanwhile, and the taker checksums those last, in
 * order (the checksum is one stream over the payload: it cannot be split). A
 * single producer's batches then move at more than one core's memcpy rate.
 * The taker completes the job only when every helper has left it.
 */
#ifndef HS_SHM_COPY_INT_H
#define HS_SHM_COPY_INT_H

#include <stdbool.h>
#include <stdint.h>

#include "hsflow.h"

#ifdef __cplusplus
extern "C" {
#endif

#define SHM_COPY_THREADS_MAX 8u
#define SHM_COPY_PIECES_MAX 256u

typedef struct shm_copy_job {
    /* in: set by the submitter */
    uint8_t *dest;
    const uint8_t *src;
    uint64_t len;
    bool sum_wanted; /* the checksum of dest[sum_from, len) */
    uint64_t sum_from;
    void *owner; /* the connection */
    /* out: valid once the job is done */
    uint64_t sum;
    bool sum_valid;
    /* the copiers' (shm_copy.c) */
    int state;      /* idle, queued, copying, done (under the copier lock) */
    uint64_t piece; /* bytes of each piece but the last */
    uint32_t n_pieces;
    uint32_t helpers;        /* copiers inside the job besides its taker (lock) */
    bool shared;             /* on the list of jobs others may help with (lock) */
    _Atomic uint64_t claims; /* pieces taken from the front and from the back */
    _Atomic uint8_t piece_done[SHM_COPY_PIECES_MAX]; /* written whole */
    struct shm_copy_job *next, *next_shared;
} shm_copy_job_t;

typedef struct shm_copier shm_copier_t;

/* threads copiers (1..SHM_COPY_THREADS_MAX); each finished job writes 1 to
 * wake_fd (an eventfd). NULL on failure. */
shm_copier_t *hs__shm_copier_create(unsigned threads, int wake_fd);
/* Joins the copiers; no job may be in flight. NULL ok. */
void hs__shm_copier_destroy(shm_copier_t *p);
/* Queues an idle job. */
void hs__shm_copier_submit(shm_copier_t *p, shm_copy_job_t *job);
/* The jobs finished since the last call (linked by next), now idle again;
 * NULL when none. */
shm_copy_job_t *hs__shm_copier_take_done(shm_copier_t *p);
/* Waits until job (queued, copying or done) is finished and makes it idle,
 * so that take_done will not return it. */
void hs__shm_copier_wait(shm_copier_t *p, shm_copy_job_t *job);
/* The copier count when none is configured: half the online CPUs, 1 to 4. */
unsigned hs__shm_copier_threads_default(void);

#ifdef __cplusplus
}
#endif
#endif /* HS_SHM_COPY_INT_H */
