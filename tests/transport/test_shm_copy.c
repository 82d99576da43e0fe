/* SPDX-License-Identifier: Apache-2.0 */
/* test_shm_copy.c - the shared-memory copiers (transport/shm_copy_int.h):
 * a payload split among several copiers lands whole, with the checksum of
 * exactly the bytes asked for, whatever the piece boundaries; several
 * payloads at once each land whole; waiting for a job leaves it off the
 * done list; a payload whose checksum was not asked for is only copied. */
#include <check.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "shm_copy_int.h"
#include "hs_checksum.h"

#define WAIT_LIMIT_MS 30000 /* a hang guard, not a timing assertion */

static int g_wake;

static void setup(void)
{
    g_wake = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    ck_assert_int_ge(g_wake, 0);
}

static void teardown(void) { close(g_wake); }

static uint8_t *pattern(uint64_t len, unsigned seed)
{
    uint8_t *b = malloc(len);
    ck_assert_ptr_nonnull(b);
    uint32_t x = seed * 2654435761u + 1;
    for (uint64_t i = 0; i < len; i++) {
        x = x * 1664525u + 1013904223u;
        b[i] = (uint8_t)(x >> 24);
    }
    return b;
}

/* Takes finished jobs until `n` came back (each counted once). */
static void collect(shm_copier_t *p, int n)
{
    int got = 0, waited = 0;
    while (got < n) {
        struct pollfd pf = {.fd = g_wake, .events = POLLIN};
        ck_assert_msg(waited < WAIT_LIMIT_MS, "the copies never finished");
        (void)poll(&pf, 1, 10);
        waited += 10;
        uint64_t v;
        while (read(g_wake, &v, sizeof v) > 0) {
        }
        for (shm_copy_job_t *j = hs__shm_copier_take_done(p); j; j = j->next)
            got++;
    }
    ck_assert_int_eq(got, n);
}

static void check_job(const shm_copy_job_t *j)
{
    ck_assert_int_eq(memcmp(j->dest, j->src, j->len), 0);
    if (j->sum_wanted && j->sum_from <= j->len) {
        ck_assert(j->sum_valid);
        ck_assert_uint_eq(j->sum, hs_checksum64(j->dest + j->sum_from, j->len - j->sum_from));
    } else {
        ck_assert(!j->sum_valid);
    }
}

START_TEST(a_payload_split_among_copiers_lands_whole_with_the_checksum_of_its_bytes)
{
    shm_copier_t *p = hs__shm_copier_create(4, g_wake);
    ck_assert_ptr_nonnull(p);
    /* 40 MiB + 123 bytes: 40 pieces and a short last one; the checksum
     * starts inside the first piece */
    uint64_t len = (40ull << 20) + 123;
    uint8_t *src = pattern(len, 1), *dest = calloc(1, len);
    static shm_copy_job_t j;
    memset(&j, 0, sizeof j);
    j.dest = dest, j.src = src, j.len = len, j.sum_wanted = true, j.sum_from = 4096 + 7;
    hs__shm_copier_submit(p, &j);
    collect(p, 1);
    check_job(&j);
    ck_assert_uint_gt(j.n_pieces, 1);
    /* the same job again, the checksum from the middle of a piece */
    memset(dest, 0, len);
    j.sum_from = (17ull << 20) + 5;
    hs__shm_copier_submit(p, &j);
    collect(p, 1);
    check_job(&j);
    hs__shm_copier_destroy(p);
    free(src);
    free(dest);
}
END_TEST

START_TEST(several_payloads_at_once_each_land_whole)
{
    shm_copier_t *p = hs__shm_copier_create(3, g_wake);
    ck_assert_ptr_nonnull(p);
    static const uint64_t lens[] = {1, 4096, (1u << 20) - 1, (1u << 20) + 1, 9u << 20, 33u << 20};
    enum { N = sizeof lens / sizeof lens[0] };
    static shm_copy_job_t jobs[N];
    uint8_t *srcs[N], *dests[N];
    for (int i = 0; i < N; i++) {
        srcs[i] = pattern(lens[i], (unsigned)i + 10);
        dests[i] = calloc(1, lens[i]);
        memset(&jobs[i], 0, sizeof jobs[i]);
        jobs[i] = (shm_copy_job_t){.dest = dests[i],
                                   .src = srcs[i],
                                   .len = lens[i],
                                   .sum_wanted = i % 3 != 2,
                                   .sum_from = i == 4 ? lens[i] : 0};
    }
    for (int i = 0; i < N; i++)
        hs__shm_copier_submit(p, &jobs[i]);
    collect(p, N);
    for (int i = 0; i < N; i++) {
        check_job(&jobs[i]);
        free(srcs[i]);
        free(dests[i]);
    }
    hs__shm_copier_destroy(p);
}
END_TEST

START_TEST(waiting_for_a_job_leaves_it_off_the_done_list)
{
    shm_copier_t *p = hs__shm_copier_create(2, g_wake);
    ck_assert_ptr_nonnull(p);
    uint64_t len = 8u << 20;
    uint8_t *src = pattern(len, 3), *dest = calloc(1, len);
    static shm_copy_job_t j;
    memset(&j, 0, sizeof j);
    j.dest = dest, j.src = src, j.len = len, j.sum_wanted = true;
    hs__shm_copier_submit(p, &j);
    hs__shm_copier_wait(p, &j); /* as a connection closing with its copy out */
    check_job(&j);
    ck_assert_ptr_null(hs__shm_copier_take_done(p));
    hs__shm_copier_destroy(p);
    free(src);
    free(dest);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("shm_copy");
    TCase *tc = tcase_create("copiers");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, a_payload_split_among_copiers_lands_whole_with_the_checksum_of_its_bytes);
    tcase_add_test(tc, several_payloads_at_once_each_land_whole);
    tcase_add_test(tc, waiting_for_a_job_leaves_it_off_the_done_list);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
