/* SPDX-License-Identifier: Apache-2.0 */
/* verify.c - the consumer's verify pool; see verify_int.h.
 *
 * Jobs wait in a FIFO ring held by value, verdicts in a second one. Both
 * are allocated at create and grow (doubling) only when more jobs are in
 * flight at once than ever before; in steady state a batch allocates
 * nothing. Both rings always have room for every job in flight (queued,
 * being checked or waiting to be taken), so a checksum thread never finds
 * the verdicts' ring full. */
#include "verify_int.h"
#include "hs_log.h"
#include "hs_time.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

typedef struct {
    hs__verify_job_t *jobs;
    uint32_t cap, head, n;
} job_ring_t;

struct hs__verify_pool {
    hs__verify_check_cb check;
    hs__verify_wake_cb wake;
    void *arg;
    pthread_mutex_t lock;
    pthread_cond_t cond;   /* a job was queued, or stop */
    job_ring_t todo, done; /* under lock */
    uint32_t checking;     /* jobs a thread holds now; under lock */
    /* thread-seconds spent checking, the integral of `checking` up to
     * t_busy; under lock */
    double busy_s, t_busy;
    bool stop; /* under lock */
    pthread_t *threads;
    uint32_t n_threads; /* started and not yet joined */
};

static void ring_put(job_ring_t *r, const hs__verify_job_t *j)
{
    r->jobs[(r->head + r->n) % r->cap] = *j;
    r->n++;
}

static void ring_get(job_ring_t *r, hs__verify_job_t *out)
{
    *out = r->jobs[r->head];
    r->head = (r->head + 1) % r->cap;
    r->n--;
}

/* Gives ring r room for cap jobs, keeping their order. */
static hs_status_t ring_grow(job_ring_t *r, uint32_t cap)
{
    hs__verify_job_t *jobs = malloc((size_t)cap * sizeof(*jobs));
    if (!jobs) return HS_ERR_NOMEM;
    for (uint32_t i = 0; i < r->n; i++)
        jobs[i] = r->jobs[(r->head + i) % r->cap];
    free(r->jobs);
    r->jobs = jobs;
    r->cap = cap;
    r->head = 0;
    return HS_OK;
}

/* Adds the time since the last change at the current number of checks to
 * busy_s. Under lock. */
static void busy_advance(hs__verify_pool_t *vp)
{
    double now = hs_now_s();
    if (vp->t_busy > 0) vp->busy_s += (double)vp->checking * (now - vp->t_busy);
    vp->t_busy = now;
}

double hs__verify_pool_busy_s(hs__verify_pool_t *vp)
{
    if (!vp) return 0;
    pthread_mutex_lock(&vp->lock);
    busy_advance(vp);
    double busy = vp->busy_s;
    pthread_mutex_unlock(&vp->lock);
    return busy;
}

/* hs__verify_fault_set()'s extra milliseconds per check; 0 = none. */
static unsigned g_slow_ms;

void hs__verify_fault_set(const char *spec)
{
    unsigned ms;
    char end;
    g_slow_ms = 0;
    if (!spec || !spec[0]) return;
    if (sscanf(spec, "slow=%u%c", &ms, &end) == 1 && ms >= 1 && ms <= 10000)
        g_slow_ms = ms;
    else
        hs_warn("verify fault '%s' is not slow=MS with MS in 1..10000; ignored", spec);
}

static void *verify_main(void *arg)
{
    hs__verify_pool_t *vp = arg;
    hs__verify_job_t j;
    pthread_mutex_lock(&vp->lock);
    for (;;) {
        while (!vp->todo.n && !vp->stop)
            pthread_cond_wait(&vp->cond, &vp->lock);
        if (vp->stop) break;
        ring_get(&vp->todo, &j);
        busy_advance(vp);
        vp->checking++;
        pthread_mutex_unlock(&vp->lock);

        vp->check(vp->arg, &j);
        if (g_slow_ms) {
            struct timespec ts = {g_slow_ms / 1000, (long)(g_slow_ms % 1000) * 1000000L};
            while (nanosleep(&ts, &ts) && errno == EINTR) {
            }
        }

        pthread_mutex_lock(&vp->lock);
        busy_advance(vp);
        vp->checking--;
        ring_put(&vp->done, &j); /* push left room for every job in flight */
        vp->wake(vp->arg);
    }
    pthread_mutex_unlock(&vp->lock);
    return NULL;
}

hs_status_t hs__verify_pool_create(uint32_t n_threads, uint32_t cap, hs__verify_check_cb check,
                                   hs__verify_wake_cb wake, void *arg, hs__verify_pool_t **out)
{
    if (!n_threads || !cap || !check || !wake) {
        hs_error("verify pool: needs at least one thread, room for one job and both callbacks");
        return HS_ERR_INVALID;
    }
    hs__verify_pool_t *vp = calloc(1, sizeof(*vp));
    if (!vp) return HS_ERR_NOMEM;
    vp->check = check;
    vp->wake = wake;
    vp->arg = arg;
    pthread_mutex_init(&vp->lock, NULL);
    pthread_cond_init(&vp->cond, NULL);
    vp->threads = calloc(n_threads, sizeof(pthread_t));
    if (!vp->threads || ring_grow(&vp->todo, cap) != HS_OK || ring_grow(&vp->done, cap) != HS_OK) {
        hs_error("verify pool: out of memory for %u threads and %u jobs", n_threads, cap);
        hs__verify_pool_destroy(vp);
        return HS_ERR_NOMEM;
    }
    for (; vp->n_threads < n_threads; vp->n_threads++) {
        int e = pthread_create(&vp->threads[vp->n_threads], NULL, verify_main, vp);
        if (e != 0) {
            errno = e;
            hs_error("verify pool: cannot start checksum thread %u of %u: %m (lower "
                     "--verify-threads, or raise the process's thread limit)",
                     vp->n_threads + 1, n_threads);
            hs__verify_pool_destroy(vp); /* joins those started */
            return HS_ERR_NOMEM;
        }
    }
    *out = vp;
    return HS_OK;
}

void hs__verify_pool_stop(hs__verify_pool_t *vp)
{
    if (!vp) return;
    pthread_mutex_lock(&vp->lock);
    vp->stop = true;
    pthread_cond_broadcast(&vp->cond);
    pthread_mutex_unlock(&vp->lock);
    for (uint32_t i = 0; i < vp->n_threads; i++)
        pthread_join(vp->threads[i], NULL);
    vp->n_threads = 0;
}

void hs__verify_pool_destroy(hs__verify_pool_t *vp)
{
    if (!vp) return;
    hs__verify_pool_stop(vp);
    free(vp->threads);
    free(vp->todo.jobs);
    free(vp->done.jobs);
    pthread_cond_destroy(&vp->cond);
    pthread_mutex_destroy(&vp->lock);
    free(vp);
}

hs_status_t hs__verify_pool_push(hs__verify_pool_t *vp, const hs__verify_job_t *job)
{
    pthread_mutex_lock(&vp->lock);
    uint32_t in_flight = vp->todo.n + vp->checking + vp->done.n;
    if (in_flight >= vp->todo.cap || in_flight >= vp->done.cap) {
        /* More jobs at once than ever before: both rings double. */
        uint32_t cap = in_flight * 2;
        if ((vp->todo.cap < cap && ring_grow(&vp->todo, cap) != HS_OK) ||
            (vp->done.cap < cap && ring_grow(&vp->done, cap) != HS_OK)) {
            pthread_mutex_unlock(&vp->lock);
            hs_error("verify pool: out of memory growing its queue to %u jobs", cap);
            return HS_ERR_NOMEM;
        }
        hs_debug("verify pool: room for %u jobs in flight", cap);
    }
    ring_put(&vp->todo, job);
    pthread_cond_signal(&vp->cond);
    pthread_mutex_unlock(&vp->lock);
    return HS_OK;
}

uint32_t hs__verify_pool_take(hs__verify_pool_t *vp, hs__verify_job_t *out, uint32_t cap)
{
    uint32_t n = 0;
    pthread_mutex_lock(&vp->lock);
    while (n < cap && vp->done.n)
        ring_get(&vp->done, &out[n++]);
    pthread_mutex_unlock(&vp->lock);
    return n;
}
