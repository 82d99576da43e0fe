/* SPDX-License-Identifier: Apache-2.0 */
/* verify.c - the consumer's verify pool; see verify_int.h. Jobs wait in a
 * list pushed and popped at its head; verdicts likewise. */
#include "verify_int.h"

#include <pthread.h>
#include <stdlib.h>

typedef struct verify_node {
    struct verify_node *next;
    hs__verify_job_t job;
} verify_node_t;

struct hs__verify_pool {
    hs__verify_check_cb check;
    hs__verify_wake_cb wake;
    void *arg;
    pthread_mutex_t lock;
    pthread_cond_t cond;
    verify_node_t *todo, *done; /* under lock */
    uint32_t todo_n;            /* under lock */
    bool stop;                  /* under lock */
    pthread_t *threads;
    uint32_t n_threads;
};

static void *verify_main(void *arg)
{
    hs__verify_pool_t *vp = arg;
    pthread_mutex_lock(&vp->lock);
    for (;;) {
        while (!vp->todo_n && !vp->stop)
            pthread_cond_wait(&vp->cond, &vp->lock);
        if (vp->stop) break;
        verify_node_t *j = vp->todo;
        vp->todo = j->next;
        vp->todo_n--;
        pthread_mutex_unlock(&vp->lock);

        vp->check(vp->arg, &j->job);

        pthread_mutex_lock(&vp->lock);
        j->next = vp->done;
        vp->done = j;
        vp->wake(vp->arg);
    }
    pthread_mutex_unlock(&vp->lock);
    return NULL;
}

hs_status_t hs__verify_pool_create(uint32_t n_threads, uint32_t cap, hs__verify_check_cb check,
                                   hs__verify_wake_cb wake, void *arg, hs__verify_pool_t **out)
{
    (void)cap;
    hs__verify_pool_t *vp = calloc(1, sizeof(*vp));
    if (!vp) return HS_ERR_NOMEM;
    vp->check = check;
    vp->wake = wake;
    vp->arg = arg;
    pthread_mutex_init(&vp->lock, NULL);
    pthread_cond_init(&vp->cond, NULL);
    vp->n_threads = n_threads;
    vp->threads = calloc(n_threads, sizeof(pthread_t));
    for (uint32_t i = 0; i < n_threads; i++)
        pthread_create(&vp->threads[i], NULL, verify_main, vp);
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
    for (verify_node_t *j = vp->todo, *n; j; j = n) {
        n = j->next;
        free(j);
    }
    for (verify_node_t *j = vp->done, *n; j; j = n) {
        n = j->next;
        free(j);
    }
    free(vp->threads);
    pthread_mutex_destroy(&vp->lock);
    pthread_cond_destroy(&vp->cond);
    free(vp);
}

hs_status_t hs__verify_pool_push(hs__verify_pool_t *vp, const hs__verify_job_t *job)
{
    verify_node_t *j = calloc(1, sizeof(*j));
    if (!j) return HS_ERR_NOMEM;
    j->job = *job;
    pthread_mutex_lock(&vp->lock);
    j->next = vp->todo;
    vp->todo = j;
    vp->todo_n++;
    pthread_cond_signal(&vp->cond);
    pthread_mutex_unlock(&vp->lock);
    return HS_OK;
}

uint32_t hs__verify_pool_take(hs__verify_pool_t *vp, hs__verify_job_t *out, uint32_t cap)
{
    uint32_t n = 0;
    pthread_mutex_lock(&vp->lock);
    while (n < cap && vp->done) {
        verify_node_t *j = vp->done;
        vp->done = j->next;
        out[n++] = j->job;
        free(j);
    }
    pthread_mutex_unlock(&vp->lock);
    return n;
}
