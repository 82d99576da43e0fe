/* SPDX-License-Identifier: Apache-2.0 */
/* shm_copy.c - see shm_copy_int.h. */
#include "shm_copy_int.h"

#include "hs_checksum.h"
#include "hs_log.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* The taker checksums the piece it copies itself in steps of this size,
 * each right after copying it, while it is in the core's cache. */
#define HASH_STEP (256u << 10)
#define PIECE_MIN (1u << 20)

enum { JOB_IDLE, JOB_QUEUED, JOB_COPYING, JOB_DONE };

struct shm_copier {
    pthread_mutex_t lock;
    pthread_cond_t work, finished;
    shm_copy_job_t *queue_head, *queue_tail, *done;
    shm_copy_job_t *shared; /* jobs being copied whose pieces others may take */
    bool stop;
    int wake_fd;
    unsigned n_threads;
    pthread_t threads[SHM_COPY_THREADS_MAX];
};

static uint64_t piece_start(const shm_copy_job_t *j, uint32_t i) { return (uint64_t)i * j->piece; }

static uint64_t piece_len(const shm_copy_job_t *j, uint32_t i)
{
    uint64_t start = piece_start(j, i);
    return j->len - start < j->piece ? j->len - start : j->piece;
}

/* Pieces are claimed from both ends: the taker from the front, in the
 * order it checksums them, helpers from the back, so the taker seldom
 * waits for a piece it must checksum next. `claims` holds the count taken
 * from the front (low 32 bits) and from the back (high 32 bits). */
static bool claim(shm_copy_job_t *j, bool front, uint32_t *piece)
{
    uint64_t v = atomic_load_explicit(&j->claims, memory_order_relaxed);
    for (;;) {
        uint32_t f = (uint32_t)v, b = (uint32_t)(v >> 32);
        if (f + b >= j->n_pieces) return false;
        uint64_t nv = v + (front ? 1u : 1ull << 32);
        if (atomic_compare_exchange_weak_explicit(&j->claims, &v, nv, memory_order_relaxed,
                                                  memory_order_relaxed)) {
            *piece = front ? f : j->n_pieces - 1 - b;
            return true;
        }
    }
}

static bool unclaimed(shm_copy_job_t *j)
{
    uint64_t v = atomic_load_explicit(&j->claims, memory_order_relaxed);
    return (uint64_t)(uint32_t)v + (v >> 32) < j->n_pieces;
}

static void copy_piece(shm_copy_job_t *j, uint32_t i)
{
    uint64_t at = piece_start(j, i);
    memcpy(j->dest + at, j->src + at, piece_len(j, i));
    atomic_store_explicit(&j->piece_done[i], 1, memory_order_release);
}

/* The part of piece i that the checksum covers: [from, end). */
static void hash_range(const shm_copy_job_t *j, uint32_t i, uint64_t *from, uint64_t *end)
{
    uint64_t start = piece_start(j, i);
    *end = start + piece_len(j, i);
    *from = start > j->sum_from ? start : j->sum_from;
    if (*from > *end) *from = *end;
}

/* Copies piece i and checksums it step by step, each step while in cache. */
static void copy_and_hash_piece(shm_copy_job_t *j, uint32_t i, hs_checksum_stream_t *sum)
{
    uint64_t start = piece_start(j, i), from, end;
    hash_range(j, i, &from, &end);
    if (from > start) memcpy(j->dest + start, j->src + start, from - start);
    for (uint64_t off = from; off < end;) {
        size_t n = end - off < HASH_STEP ? (size_t)(end - off) : HASH_STEP;
        memcpy(j->dest + off, j->src + off, n);
        hs_checksum_stream_update(sum, j->dest + off, n);
        off += n;
    }
    atomic_store_explicit(&j->piece_done[i], 1, memory_order_release);
}

/* A helper: copies pieces of a job it did not take until none is left.
 * Called and returns with the lock held. */
static void help(shm_copier_t *p, shm_copy_job_t *j)
{
    j->helpers++;
    pthread_mutex_unlock(&p->lock);
    uint32_t i;
    while (claim(j, false, &i))
        copy_piece(j, i);
    pthread_mutex_lock(&p->lock);
    j->helpers--;
    if (j->shared) { /* every piece is claimed: nothing more to help with */
        for (shm_copy_job_t **pp = &p->shared; *pp; pp = &(*pp)->next_shared) {
            if (*pp != j) continue;
            *pp = j->next_shared;
            break;
        }
        j->shared = false;
    }
    pthread_cond_broadcast(&p->finished);
}

/* The taker: splits the job, lets idle copiers help, copies pieces too and
 * checksums every piece in order; completes once every helper has left. */
static void take(shm_copier_t *p, shm_copy_job_t *j, hs_checksum_stream_t *sum)
{
    bool hashing = j->sum_wanted && j->sum_from <= j->len && sum;
    uint64_t piece = (j->len + SHM_COPY_PIECES_MAX - 1) / SHM_COPY_PIECES_MAX;
    if (piece < PIECE_MIN) piece = PIECE_MIN;
    j->piece = piece;
    j->n_pieces = j->len ? (uint32_t)((j->len + piece - 1) / piece) : 0;
    atomic_store_explicit(&j->claims, 0, memory_order_relaxed);
    for (uint32_t i = 0; i < j->n_pieces; i++)
        atomic_store_explicit(&j->piece_done[i], 0, memory_order_relaxed);
    j->sum_valid = false;
    pthread_mutex_lock(&p->lock);
    if (j->n_pieces > 1 && p->n_threads > 1) {
        j->shared = true;
        j->next_shared = p->shared;
        p->shared = j;
        pthread_cond_broadcast(&p->work);
    }
    pthread_mutex_unlock(&p->lock);

    if (hashing) hs_checksum_stream_reset(sum);
    uint32_t i;
    while (claim(j, true, &i)) { /* from the front: piece i is the next to checksum */
        if (hashing)
            copy_and_hash_piece(j, i, sum);
        else
            copy_piece(j, i);
    }
    /* the pieces helpers took from the back, in order, once each is whole */
    for (i = hashing ? (uint32_t)atomic_load_explicit(&j->claims, memory_order_relaxed) : 0;
         hashing && i < j->n_pieces;) {
        if (!atomic_load_explicit(&j->piece_done[i], memory_order_acquire)) {
            sched_yield(); /* a helper is still copying it */
            continue;
        }
        uint64_t from, end;
        hash_range(j, i, &from, &end);
        if (end > from) hs_checksum_stream_update(sum, j->dest + from, end - from);
        i++;
    }

    pthread_mutex_lock(&p->lock);
    if (j->shared) {
        for (shm_copy_job_t **pp = &p->shared; *pp; pp = &(*pp)->next_shared) {
            if (*pp != j) continue;
            *pp = j->next_shared;
            break;
        }
        j->shared = false;
    }
    while (j->helpers > 0) /* a helper may still be copying its last piece */
        pthread_cond_wait(&p->finished, &p->lock);
    pthread_mutex_unlock(&p->lock);
    if (hashing) {
        j->sum = hs_checksum_stream_final(sum);
        j->sum_valid = true;
    }
}

/* A job with pieces left to claim, or NULL. Lock held. */
static shm_copy_job_t *shared_with_work(shm_copier_t *p)
{
    for (shm_copy_job_t *j = p->shared; j; j = j->next_shared)
        if (unclaimed(j)) return j;
    return NULL;
}

static void *copier_main(void *arg)
{
    shm_copier_t *p = arg;
    hs_checksum_stream_t *sum = hs_checksum_stream_create(); /* NULL: copies without */
    pthread_mutex_lock(&p->lock);
    for (;;) {
        shm_copy_job_t *helpable = NULL;
        while (!p->stop && !p->queue_head && !(helpable = shared_with_work(p)))
            pthread_cond_wait(&p->work, &p->lock);
        if (!p->queue_head && helpable) { /* no whole job waits: help with one */
            help(p, helpable);
            continue;
        }
        if (!p->queue_head) break; /* stopping, nothing left */
        shm_copy_job_t *j = p->queue_head;
        p->queue_head = j->next;
        if (!p->queue_head) p->queue_tail = NULL;
        j->state = JOB_COPYING;
        pthread_mutex_unlock(&p->lock);
        take(p, j, sum);
        pthread_mutex_lock(&p->lock);
        j->state = JOB_DONE;
        j->next = p->done;
        p->done = j;
        pthread_cond_broadcast(&p->finished);
        uint64_t one = 1;
        ssize_t r = write(p->wake_fd, &one, sizeof one);
        (void)r; /* EAGAIN: the counter is non-zero already, which is the point */
    }
    pthread_mutex_unlock(&p->lock);
    hs_checksum_stream_destroy(sum);
    return NULL;
}

shm_copier_t *hs__shm_copier_create(unsigned threads, int wake_fd)
{
    if (threads < 1) threads = 1;
    if (threads > SHM_COPY_THREADS_MAX) threads = SHM_COPY_THREADS_MAX;
    shm_copier_t *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    pthread_mutex_init(&p->lock, NULL);
    pthread_cond_init(&p->work, NULL);
    pthread_cond_init(&p->finished, NULL);
    p->wake_fd = wake_fd;
    /* n_threads is what take() reads to decide whether to share: set it
     * before any copier runs */
    p->n_threads = threads;
    unsigned started = 0;
    for (; started < threads; started++)
        if (pthread_create(&p->threads[started], NULL, copier_main, p) != 0) break;
    if (started < threads) {
        pthread_mutex_lock(&p->lock);
        p->n_threads = started;
        pthread_mutex_unlock(&p->lock);
    }
    if (started == 0) {
        hs_error("cannot start a shared-memory copier thread");
        hs__shm_copier_destroy(p);
        return NULL;
    }
    return p;
}

void hs__shm_copier_destroy(shm_copier_t *p)
{
    if (!p) return;
    pthread_mutex_lock(&p->lock);
    p->stop = true;
    pthread_cond_broadcast(&p->work);
    pthread_mutex_unlock(&p->lock);
    for (unsigned i = 0; i < p->n_threads; i++)
        pthread_join(p->threads[i], NULL);
    pthread_cond_destroy(&p->work);
    pthread_cond_destroy(&p->finished);
    pthread_mutex_destroy(&p->lock);
    free(p);
}

void hs__shm_copier_submit(shm_copier_t *p, shm_copy_job_t *job)
{
    pthread_mutex_lock(&p->lock);
    job->state = JOB_QUEUED;
    job->next = NULL;
    if (p->queue_tail)
        p->queue_tail->next = job;
    else
        p->queue_head = job;
    p->queue_tail = job;
    pthread_cond_signal(&p->work);
    pthread_mutex_unlock(&p->lock);
}

shm_copy_job_t *hs__shm_copier_take_done(shm_copier_t *p)
{
    pthread_mutex_lock(&p->lock);
    shm_copy_job_t *list = p->done;
    p->done = NULL;
    for (shm_copy_job_t *j = list; j; j = j->next)
        j->state = JOB_IDLE;
    pthread_mutex_unlock(&p->lock);
    return list;
}

void hs__shm_copier_wait(shm_copier_t *p, shm_copy_job_t *job)
{
    pthread_mutex_lock(&p->lock);
    while (job->state == JOB_QUEUED || job->state == JOB_COPYING)
        pthread_cond_wait(&p->finished, &p->lock);
    if (job->state == JOB_DONE) {
        for (shm_copy_job_t **pp = &p->done; *pp; pp = &(*pp)->next) {
            if (*pp != job) continue;
            *pp = job->next;
            break;
        }
        job->state = JOB_IDLE;
    }
    pthread_mutex_unlock(&p->lock);
}

unsigned hs__shm_copier_threads_default(void)
{
    long n = sysconf(_SC_NPROCESSORS_ONLN) / 2;
    return n < 1 ? 1u : n > 4 ? 4u : (unsigned)n;
}
