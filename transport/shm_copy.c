/* SPDX-License-Identifier: Apache-2.0 */
/* shm_copy.c - see shm_copy_int.h. */
#include "shm_copy_int.h"

#include "hs_checksum.h"
#include "hs_log.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* The checksum follows the copy piece by piece, while each piece is in the
 * CPU's cache. */
#define COPY_PIECE (256u << 10)

enum { JOB_IDLE, JOB_QUEUED, JOB_COPYING, JOB_DONE };

struct shm_copier {
    pthread_mutex_t lock;
    pthread_cond_t work, finished;
    shm_copy_job_t *queue_head, *queue_tail, *done;
    bool stop;
    int wake_fd;
    unsigned n_threads;
    pthread_t threads[SHM_COPY_THREADS_MAX];
};

static void copy_job(shm_copy_job_t *j, hs_checksum_stream_t *sum)
{
    j->sum_valid = false;
    if (!j->sum_wanted || j->sum_from > j->len || !sum) {
        memcpy(j->dest, j->src, j->len); /* the receiver checksums dest itself */
        return;
    }
    memcpy(j->dest, j->src, j->sum_from);
    hs_checksum_stream_reset(sum);
    for (uint64_t off = j->sum_from; off < j->len;) {
        size_t n = j->len - off < COPY_PIECE ? (size_t)(j->len - off) : COPY_PIECE;
        memcpy(j->dest + off, j->src + off, n);
        hs_checksum_stream_update(sum, j->dest + off, n);
        off += n;
    }
    j->sum = hs_checksum_stream_final(sum);
    j->sum_valid = true;
}

static void *copier_main(void *arg)
{
    shm_copier_t *p = arg;
    hs_checksum_stream_t *sum = hs_checksum_stream_create(); /* NULL: copies without */
    pthread_mutex_lock(&p->lock);
    for (;;) {
        while (!p->stop && !p->queue_head)
            pthread_cond_wait(&p->work, &p->lock);
        if (!p->queue_head) break; /* stopping, nothing left */
        shm_copy_job_t *j = p->queue_head;
        p->queue_head = j->next;
        if (!p->queue_head) p->queue_tail = NULL;
        j->state = JOB_COPYING;
        pthread_mutex_unlock(&p->lock);
        copy_job(j, sum);
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
    for (unsigned i = 0; i < threads; i++) {
        if (pthread_create(&p->threads[i], NULL, copier_main, p) != 0) break;
        p->n_threads++;
    }
    if (p->n_threads == 0) {
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
