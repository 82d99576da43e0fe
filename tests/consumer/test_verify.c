/* SPDX-License-Identifier: Apache-2.0 */
/* test_verify.c - the consumer's verify pool: jobs are checked and their
 * verdicts come back in the order they were pushed (first in, first out),
 * each once, even after the queue grew past its first size; a steady
 * stream of jobs allocates nothing; a checksum thread that cannot start
 * fails create with none left running; stop with jobs queued joins. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* RTLD_NEXT */
#endif
#include <check.h>
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <stdio.h>

#include "common/alloc_count.h"
#include "verify_int.h"
#include "hs_time.h"

/* ---- pthread_create, counted and made to fail on demand ------------------ */

/* Sanitizer builds keep their own pthread_create (their runtime must see
 * every thread): there nothing is counted and the failure test is skipped,
 * as alloc_count.h's count is. */
#define INTERPOSED ALLOC_COUNT_WORKS

static _Atomic int g_threads_live;   /* threads started through here, not yet ended */
static _Atomic int g_create_fail_at; /* the n-th next create fails with EAGAIN; 0 never */

typedef struct {
    void *(*start)(void *);
    void *arg;
} trampoline_t;

static void *trampoline(void *p)
{
    trampoline_t t = *(trampoline_t *)p;
    free(p);
    void *r = t.start(t.arg);
    atomic_fetch_sub(&g_threads_live, 1);
    return r;
}

#if INTERPOSED
int pthread_create(pthread_t *th, const pthread_attr_t *attr, void *(*start)(void *), void *arg)
{
    static int (*real)(pthread_t *, const pthread_attr_t *, void *(*)(void *), void *);
    if (!real) *(void **)&real = dlsym(RTLD_NEXT, "pthread_create");
    int at = atomic_load(&g_create_fail_at);
    if (at > 0 && atomic_fetch_sub(&g_create_fail_at, 1) == 1) return EAGAIN;
    trampoline_t *t = malloc(sizeof(*t));
    if (!t) return EAGAIN;
    *t = (trampoline_t){start, arg};
    atomic_fetch_add(&g_threads_live, 1);
    int e = real(th, attr, trampoline, t);
    if (e) {
        atomic_fetch_sub(&g_threads_live, 1);
        free(t);
    }
    return e;
}
#endif

/* ---- a probe for the check callback ------------------------------------- */

#define MAX_JOBS 256
typedef struct {
    pthread_mutex_t lock;
    uint64_t order[MAX_JOBS]; /* ticket ids in the order they were checked */
    uint32_t n_checked;
    _Atomic uint32_t n_woken;
    pthread_mutex_t gate; /* held by the test to keep the threads from checking */
} probe_t;

static void check_cb(void *arg, hs__verify_job_t *job)
{
    probe_t *p = arg;
    pthread_mutex_lock(&p->gate);
    pthread_mutex_unlock(&p->gate);
    pthread_mutex_lock(&p->lock);
    if (p->n_checked < MAX_JOBS) p->order[p->n_checked] = job->ticket_id;
    p->n_checked++;
    pthread_mutex_unlock(&p->lock);
    job->status = job->ticket_id % 3 == 2 ? HS_ERR_CHECKSUM : HS_OK;
    if (job->status != HS_OK) strcpy(job->why, "bad sum");
}

static void wake_cb(void *arg)
{
    probe_t *p = arg;
    atomic_fetch_add(&p->n_woken, 1);
}

static void probe_init(probe_t *p)
{
    memset(p, 0, sizeof(*p));
    pthread_mutex_init(&p->lock, NULL);
    pthread_mutex_init(&p->gate, NULL);
}

/* Takes verdicts until n have come, within 20 s (no Check assertion inside:
 * they allocate, and one test counts allocations around this). */
static uint32_t take_all(hs__verify_pool_t *vp, hs__verify_job_t *out, uint32_t n)
{
    uint32_t got = 0;
    double t0 = hs_now_s();
    while (got < n && hs_now_s() - t0 < 20) {
        uint32_t k = hs__verify_pool_take(vp, out + got, n - got);
        got += k;
        if (!k) usleep(1000);
    }
    return got;
}

START_TEST(jobs_are_checked_and_returned_in_the_order_pushed_even_after_growing)
{
    probe_t p;
    probe_init(&p);
    hs__verify_pool_t *vp = NULL;
    ck_assert_int_eq(hs__verify_pool_create(1, 4, check_cb, wake_cb, &p, &vp), HS_OK);
    /* The thread waits at the gate while 40 jobs queue, ten times the
     * queue's first size: a stack would hand out the newest first. */
    pthread_mutex_lock(&p.gate);
    for (uint64_t t = 0; t < 40; t++) {
        hs__verify_job_t j = {.peer_id = 7, .ticket_id = t};
        j.item.batch = (uint32_t)t;
        ck_assert_int_eq(hs__verify_pool_push(vp, &j), HS_OK);
    }
    pthread_mutex_unlock(&p.gate);
    hs__verify_job_t out[64];
    ck_assert_uint_eq(take_all(vp, out, 40), 40);
    for (uint64_t t = 0; t < 40; t++) {
        ck_assert_uint_eq(p.order[t], t);
        ck_assert_uint_eq(out[t].ticket_id, t);
        ck_assert_uint_eq(out[t].item.batch, t);
        ck_assert_uint_eq(out[t].peer_id, 7);
        ck_assert_int_eq(out[t].status, t % 3 == 2 ? HS_ERR_CHECKSUM : HS_OK);
        if (t % 3 == 2) ck_assert_str_eq(out[t].why, "bad sum");
    }
    ck_assert_uint_eq(hs__verify_pool_take(vp, out, 64), 0);
    ck_assert_uint_ge(atomic_load(&p.n_woken), 1);
    hs__verify_pool_destroy(vp);
    ck_assert_int_eq(atomic_load(&g_threads_live), 0);
}
END_TEST

START_TEST(a_steady_stream_of_jobs_allocates_nothing)
{
    if (!ALLOC_COUNT_WORKS) {
        printf("sanitizer build: its allocator is not interposed; count skipped\n");
        return;
    }
    probe_t p;
    probe_init(&p);
    hs__verify_pool_t *vp = NULL;
    ck_assert_int_eq(hs__verify_pool_create(3, 8, check_cb, wake_cb, &p, &vp), HS_OK);
    hs__verify_job_t out[8];
    uint64_t short_rounds = 0;
    alloc_count_start(1, SIZE_MAX);
    for (uint64_t round = 0; round < 200; round++) {
        for (uint64_t k = 0; k < 8; k++) {
            hs__verify_job_t j = {.ticket_id = round * 8 + k};
            if (hs__verify_pool_push(vp, &j) != HS_OK) short_rounds++;
        }
        if (take_all(vp, out, 8) != 8) short_rounds++;
    }
    uint64_t n = alloc_count_stop();
    ck_assert_uint_eq(short_rounds, 0);
    if (n) alloc_count_print(stderr);
    ck_assert_msg(n == 0, "1600 jobs through the pool made %llu allocations",
                  (unsigned long long)n);
    hs__verify_pool_destroy(vp);
}
END_TEST

START_TEST(a_thread_that_cannot_start_fails_create_and_leaves_none_running)
{
    if (!INTERPOSED) {
        printf("sanitizer build: pthread_create is not interposed; skipped\n");
        return;
    }
    probe_t p;
    probe_init(&p);
    hs__verify_pool_t *vp = NULL;
    atomic_store(&g_create_fail_at, 3); /* the third of four threads */
    ck_assert_int_eq(hs__verify_pool_create(4, 8, check_cb, wake_cb, &p, &vp), HS_ERR_NOMEM);
    atomic_store(&g_create_fail_at, 0);
    ck_assert_ptr_null(vp);
    ck_assert_int_eq(atomic_load(&g_threads_live), 0); /* the two started were joined */
    /* and a pool of the same size starts once threads can be had */
    ck_assert_int_eq(hs__verify_pool_create(4, 8, check_cb, wake_cb, &p, &vp), HS_OK);
    if (INTERPOSED) ck_assert_int_eq(atomic_load(&g_threads_live), 4);
    hs__verify_pool_destroy(vp);
    ck_assert_int_eq(atomic_load(&g_threads_live), 0);
}
END_TEST

START_TEST(stop_with_jobs_queued_joins_and_destroy_accepts_null)
{
    probe_t p;
    probe_init(&p);
    hs__verify_pool_t *vp = NULL;
    ck_assert_int_eq(hs__verify_pool_create(2, 2, check_cb, wake_cb, &p, &vp), HS_OK);
    pthread_mutex_lock(&p.gate);
    for (uint64_t t = 0; t < 10; t++) {
        hs__verify_job_t j = {.ticket_id = t};
        ck_assert_int_eq(hs__verify_pool_push(vp, &j), HS_OK);
    }
    pthread_mutex_unlock(&p.gate);
    hs__verify_pool_stop(vp);
    hs__verify_pool_stop(vp);
    ck_assert_int_eq(atomic_load(&g_threads_live), 0);
    /* after stop a job still queues (the transport's last payloads) */
    hs__verify_job_t late = {.ticket_id = 99};
    ck_assert_int_eq(hs__verify_pool_push(vp, &late), HS_OK);
    hs__verify_pool_destroy(vp);
    hs__verify_pool_destroy(NULL);
    hs__verify_pool_t *none = NULL;
    ck_assert_int_eq(hs__verify_pool_create(0, 4, check_cb, wake_cb, &p, &none), HS_ERR_INVALID);
    ck_assert_ptr_null(none);
}
END_TEST

/* The test hook behind HS_VERIFY_FAULT: "slow=MS" makes every check take
 * MS longer and counts as busy time (what the consumer reads to name its
 * verification as the limit); a spec it does not know changes nothing. */
START_TEST(a_slow_fault_lengthens_every_check_and_counts_as_busy)
{
    probe_t p;
    probe_init(&p);
    hs__verify_pool_t *vp = NULL;
    ck_assert_int_eq(hs__verify_pool_create(1, 4, check_cb, wake_cb, &p, &vp), HS_OK);
    hs__verify_job_t out[4];
    const struct {
        const char *spec;
        double min_s, max_s; /* for three checks; max 0: no bound */
    } cases[] = {
        {"slow=200", 0.600, 0},   /* three checks, 200 ms longer each */
        {"slow=0", 0, 0.500},     /* out of range: ignored */
        {"slow=200ms", 0, 0.500}, /* trailing text: ignored */
        {"fast=200", 0, 0.500},   /* unknown: ignored */
        {NULL, 0, 0.500},         /* none */
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        hs__verify_fault_set(cases[c].spec);
        double busy0 = hs__verify_pool_busy_s(vp), t0 = hs_now_s();
        for (uint64_t t = 0; t < 3; t++) {
            hs__verify_job_t j = {.ticket_id = 3 * t};
            ck_assert_int_eq(hs__verify_pool_push(vp, &j), HS_OK);
        }
        ck_assert_uint_eq(take_all(vp, out, 3), 3);
        double wall = hs_now_s() - t0, busy = hs__verify_pool_busy_s(vp) - busy0;
        ck_assert_msg(wall >= cases[c].min_s && busy >= cases[c].min_s,
                      "%s: 3 checks took %.3f s, busy %.3f s, expected >= %.3f",
                      cases[c].spec ? cases[c].spec : "(none)", wall, busy, cases[c].min_s);
        if (cases[c].max_s > 0)
            ck_assert_msg(busy < cases[c].max_s, "%s: checks slowed (busy %.3f s)",
                          cases[c].spec ? cases[c].spec : "(none)", busy);
    }
    hs__verify_fault_set(NULL);
    hs__verify_pool_destroy(vp);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("verify");
    TCase *tc = tcase_create("verify");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, jobs_are_checked_and_returned_in_the_order_pushed_even_after_growing);
    tcase_add_test(tc, a_steady_stream_of_jobs_allocates_nothing);
    tcase_add_test(tc, a_thread_that_cannot_start_fails_create_and_leaves_none_running);
    tcase_add_test(tc, stop_with_jobs_queued_joins_and_destroy_accepts_null);
    tcase_add_test(tc, a_slow_fault_lengthens_every_check_and_counts_as_busy);
    suite_add_tcase(s, tc);
    SRunner *r = srunner_create(s);
    srunner_run_all(r, CK_NORMAL);
    int failed = srunner_ntests_failed(r);
    srunner_free(r);
    return failed ? 1 : 0;
}
