/* SPDX-License-Identifier: Apache-2.0 */
/* test_journal.c - the resume journal counts distinct batches: a journal
 * that holds a batch twice is refused naming the entry (it once counted the
 * repeat toward finishing the epoch, so a restart skipped a batch never
 * released and still called the run complete), and a second release of one
 * batch is not written. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "journal_int.h"

#define PLAN 0x0123456789abcdefull

/* A journal file with `text` at a fresh path (the caller unlinks it). */
static void write_journal(char *path, const char *text)
{
    int fd = mkstemp(path);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(write(fd, text, strlen(text)), (ssize_t)strlen(text));
    close(fd);
}

START_TEST(journal_with_a_repeated_batch_is_refused_not_counted_as_a_finished_epoch)
{
    /* epoch 0 of 3 batches: batch 1 twice, batch 2 never released */
    char path[] = "/tmp/hs-test-journal-dup-XXXXXX";
    write_journal(path, "hsflow-journal 1 plan=0123456789abcdef batches=3\n0 0\n0 1\n0 1\n");
    hs_journal_t *j;
    char why[512] = "";
    ck_assert_int_eq(hs_journal_open(path, &j), HS_OK);
    ck_assert_int_eq(hs_journal_bind(j, PLAN, 3, 2, why, sizeof(why)), HS_ERR_FORMAT);
    ck_assert_msg(strstr(why, "batch 1 of epoch 0 twice") && strstr(why, "entry 3"), "%s", why);
    hs_journal_close(j);
    unlink(path);
}
END_TEST

START_TEST(journal_of_distinct_batches_finishes_an_epoch_only_when_each_was_released)
{
    char path[] = "/tmp/hs-test-journal-distinct-XXXXXX";
    write_journal(path, "hsflow-journal 1 plan=0123456789abcdef batches=3\n0 2\n0 0\n1 1\n0 1\n");
    hs_journal_t *j;
    char why[512] = "";
    ck_assert_int_eq(hs_journal_open(path, &j), HS_OK);
    ck_assert_msg(hs_journal_bind(j, PLAN, 3, 2, why, sizeof(why)) == HS_OK, "%s", why);
    ck_assert_uint_eq(hs_journal_start_epoch(j), 1);
    ck_assert_uint_eq(hs_journal_count(j), 4);
    ck_assert_uint_eq(hs_journal_done(j)[0], 1u << 1); /* epoch 1: batch 1 */
    hs_journal_close(j);
    unlink(path);
}
END_TEST

START_TEST(second_release_of_a_batch_is_not_written)
{
    char path[] = "/tmp/hs-test-journal-append-XXXXXX";
    write_journal(path, "");
    unlink(path);
    hs_journal_t *j;
    char why[512] = "";
    ck_assert_int_eq(hs_journal_open(path, &j), HS_OK);
    ck_assert_msg(hs_journal_bind(j, PLAN, 3, 2, why, sizeof(why)) == HS_OK, "%s", why);
    ck_assert_int_eq(hs_journal_append(j, 0, 1), HS_OK);
    ck_assert_int_eq(hs_journal_append(j, 0, 1), HS_ERR_INVALID);
    ck_assert_int_eq(hs_journal_append(j, 1, 1), HS_OK); /* the same batch, next epoch */
    ck_assert_uint_eq(hs_journal_count(j), 2);
    hs_journal_close(j);
    /* the file reopens and binds: nothing was written twice */
    ck_assert_int_eq(hs_journal_open(path, &j), HS_OK);
    ck_assert_msg(hs_journal_bind(j, PLAN, 3, 2, why, sizeof(why)) == HS_OK, "%s", why);
    ck_assert_uint_eq(hs_journal_count(j), 2);
    hs_journal_close(j);
    unlink(path);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("journal");
    TCase *tc = tcase_create("journal");
    tcase_add_test(tc, journal_with_a_repeated_batch_is_refused_not_counted_as_a_finished_epoch);
    tcase_add_test(tc, journal_of_distinct_batches_finishes_an_epoch_only_when_each_was_released);
    tcase_add_test(tc, second_release_of_a_batch_is_not_written);
    suite_add_tcase(s, tc);
    SRunner *r = srunner_create(s);
    srunner_run_all(r, CK_NORMAL);
    int failed = srunner_ntests_failed(r);
    srunner_free(r);
    return failed ? 1 : 0;
}
