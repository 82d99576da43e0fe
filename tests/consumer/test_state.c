/* SPDX-License-Identifier: Apache-2.0 */
/* test_state.c - the resume state: a bound state marked across epochs
 * survives encode/decode bit for bit and gives the scheduler the same resume
 * bitmap; the size query; a state of another plan, epoch count or order is
 * refused naming what differs; malformed and hostile texts are refused with
 * what is wrong; a journal that gives way to a state is rewritten to it. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "journal_int.h"
#include "state_int.h"

#define PLAN 0x0123456789abcdefull
#define N 37 /* batches per epoch: not a multiple of 8 */

/* The state's text, asserting the size query agrees with it. */
static char *encode(const hs_state_t *s)
{
    size_t len = 0, len2 = 0;
    ck_assert_int_eq(hs_state_encode(s, NULL, 0, &len), HS_ERR_NOSPACE);
    ck_assert_uint_gt(len, 0);
    char *buf = malloc(len + 1);
    ck_assert_int_eq(hs_state_encode(s, buf, len, &len2), HS_ERR_NOSPACE); /* no room for NUL */
    ck_assert_uint_eq(len2, len);
    ck_assert_int_eq(hs_state_encode(s, buf, len + 1, &len2), HS_OK);
    ck_assert_uint_eq(len2, len);
    ck_assert_uint_eq(strlen(buf), len);
    return buf;
}

static bool in_set(uint32_t e, uint32_t b)
{
    return e == 0 || (e == 1 && b % 3 == 0) || (e == 2 && b == N - 1);
}

START_TEST(bound_state_round_trips_through_json_bit_for_bit)
{
    hs_state_t *s;
    ck_assert_int_eq(hs_state_bind(NULL, PLAN, N, 4, HS_STATE_PLAN, &s), HS_OK);
    uint64_t want = 0;
    for (uint32_t e = 0; e < 4; e++)
        for (uint32_t b = 0; b < N; b++)
            if (in_set(e, b)) {
                hs_state_mark(s, e, b);
                hs_state_mark(s, e, b); /* a repeat counts once */
                want++;
            }
    hs_state_mark(s, 4, 0); /* past the epochs: ignored */
    hs_state_mark(s, 0, N); /* past the plan: ignored */
    ck_assert_uint_eq(hs_state_delivered(s), want);
    ck_assert_uint_eq(hs_state_epochs_done(s), 1);
    char *text = encode(s);
    ck_assert_ptr_nonnull(strstr(text, "\"plan\":\"0123456789abcdef\""));
    ck_assert_ptr_nonnull(strstr(text, "\"epochs_done\":1"));
    ck_assert_ptr_null(strchr(text, ' ')); /* compact */

    char why[512] = "";
    hs_state_t *d;
    ck_assert_msg(hs_state_decode(text, strlen(text), &d, why, sizeof(why)) == HS_OK, "%s", why);
    ck_assert_int_eq(hs_state_check_run(d, 4, HS_STATE_PLAN, why, sizeof(why)), HS_OK);
    ck_assert_int_eq(hs_state_check_plan(d, PLAN, N, why, sizeof(why)), HS_OK);
    ck_assert_uint_eq(hs_state_delivered(d), want);
    ck_assert_uint_eq(hs_state_epochs_done(d), 1);
    for (uint32_t e = 0; e < 4; e++)
        for (uint32_t b = 0; b < N; b++)
            ck_assert_msg(hs_state_has(d, e, b) == in_set(e, b), "epoch %u batch %u", e, b);

    /* bound again (the restarted consumer), it encodes to the same text and
     * gives the scheduler bit (e - 1) * N + b for each delivered batch */
    hs_state_t *r;
    ck_assert_int_eq(hs_state_bind(d, PLAN, N, 4, HS_STATE_PLAN, &r), HS_OK);
    char *again = encode(r);
    ck_assert_str_eq(again, text);
    uint8_t *bits = hs_state_done_bits(r);
    ck_assert_ptr_nonnull(bits);
    for (uint32_t e = 1; e < 4; e++)
        for (uint32_t b = 0; b < N; b++) {
            uint64_t i = (uint64_t)(e - 1) * N + b;
            ck_assert_int_eq(bits[i / 8] >> (i % 8) & 1, in_set(e, b));
        }
    /* marking goes on from the restored position */
    hs_state_mark(r, 3, 5);
    ck_assert_uint_eq(hs_state_delivered(r), want + 1);
    free(bits);
    free(again);
    free(text);
    hs_state_destroy(r);
    hs_state_destroy(d);
    hs_state_destroy(s);
}
END_TEST

START_TEST(finished_run_and_empty_state_encode_and_decode)
{
    hs_state_t *s, *d;
    char why[512];
    ck_assert_int_eq(hs_state_bind(NULL, PLAN, 3, 2, HS_STATE_ARRIVAL, &s), HS_OK);
    for (uint32_t e = 0; e < 2; e++)
        for (uint32_t b = 0; b < 3; b++)
            hs_state_mark(s, e, b);
    char *text = encode(s);
    ck_assert_ptr_nonnull(strstr(text, "\"epochs_done\":2,\"partial\":[]"));
    ck_assert_int_eq(hs_state_decode(text, strlen(text), &d, why, sizeof(why)), HS_OK);
    ck_assert_uint_eq(hs_state_epochs_done(d), 2);
    hs_state_t *r;
    ck_assert_int_eq(hs_state_bind(d, PLAN, 3, 2, HS_STATE_ARRIVAL, &r), HS_OK);
    ck_assert_uint_eq(hs_state_epochs_done(r), 2);
    ck_assert_uint_eq(hs_state_delivered(r), 6);
    hs_state_destroy(r);
    hs_state_destroy(d);
    hs_state_destroy(s);
    free(text);

    ck_assert_int_eq(hs_state_create_empty(3, HS_STATE_PLAN, &s), HS_OK);
    text = encode(s);
    ck_assert_ptr_nonnull(strstr(text, "\"plan\":null"));
    ck_assert_int_eq(hs_state_decode(text, strlen(text), &d, why, sizeof(why)), HS_OK);
    ck_assert(!hs_state_has_plan(d));
    ck_assert_int_eq(hs_state_check_plan(d, 42, 9, why, sizeof(why)), HS_OK); /* fits any */
    ck_assert_int_eq(hs_state_bind(d, 42, 9, 3, HS_STATE_PLAN, &r), HS_OK);
    ck_assert_uint_eq(hs_state_delivered(r), 0);
    hs_state_destroy(r);
    hs_state_destroy(d);
    hs_state_destroy(s);
    free(text);
}
END_TEST

START_TEST(state_of_another_plan_epochs_or_order_is_refused_naming_what_differs)
{
    hs_state_t *s, *d;
    char why[512];
    ck_assert_int_eq(hs_state_bind(NULL, PLAN, N, 2, HS_STATE_ARRIVAL, &s), HS_OK);
    hs_state_mark(s, 0, 1);
    char *text = encode(s);
    ck_assert_int_eq(hs_state_decode(text, strlen(text), &d, why, sizeof(why)), HS_OK);

    ck_assert_int_eq(hs_state_check_plan(d, 0xfeedull, N, why, sizeof(why)), HS_ERR_MISMATCH);
    ck_assert_ptr_nonnull(strstr(why, "plan 0123456789abcdef (37 batches/epoch)"));
    ck_assert_ptr_nonnull(strstr(why, "plan 000000000000feed (37)"));
    ck_assert_int_eq(hs_state_check_plan(d, PLAN, N + 1, why, sizeof(why)), HS_ERR_MISMATCH);
    ck_assert_ptr_nonnull(strstr(why, "(38)"));
    ck_assert_int_eq(hs_state_check_run(d, 3, HS_STATE_ARRIVAL, why, sizeof(why)), HS_ERR_MISMATCH);
    ck_assert_ptr_nonnull(strstr(why, "run of 2 epoch(s), this consumer runs 3: give --epochs 2"));
    ck_assert_int_eq(hs_state_check_run(d, 2, HS_STATE_PLAN, why, sizeof(why)), HS_ERR_MISMATCH);
    ck_assert_ptr_nonnull(strstr(why, "--order arrival"));
    free(text);
    hs_state_destroy(d);
    hs_state_destroy(s);
}
END_TEST

#define HEAD "{\"hsflow_state\":1,\"plan\":\"0123456789abcdef\",\"order\":\"arrival\","

static const struct {
    const char *text, *says;
} malformed[] = {
    {"", "not valid JSON"},
    {"{\"hsflow_state\":1,", "not valid JSON"},
    {"[1,2]", "not a JSON object"},
    {"\"hsflow_state\"", "not a JSON object"},
    {"{\"plan\":null}", "not an hsflow resume state"},
    {"{\"hsflow_state\":2}", "version 2, this hsflow reads version 1"},
    {"{\"hsflow_state\":\"1\"}", "not an hsflow resume state"},
    {"{\"hsflow_state\":1,\"plan\":null,\"order\":\"arrival\"}", "no \"epochs\""},
    {"{\"hsflow_state\":1,\"plan\":null,\"epochs\":0,\"order\":\"arrival\"}", "\"epochs\" must"},
    {"{\"hsflow_state\":1,\"plan\":null,\"epochs\":1e12,\"order\":\"arrival\"}", "\"epochs\" must"},
    {"{\"hsflow_state\":1,\"plan\":null,\"epochs\":1.5,\"order\":\"arrival\"}", "\"epochs\" must"},
    {"{\"hsflow_state\":1,\"plan\":null,\"epochs\":1,\"order\":\"random\"}", "\"order\" must"},
    {"{\"hsflow_state\":1,\"plan\":null,\"epochs\":1,\"order\":\"arrival\",\"delivered\":3}",
     "without a plan lists delivered"},
    {"{\"hsflow_state\":1,\"plan\":\"12345\",\"epochs\":1,\"order\":\"arrival\"}", "16 hex"},
    {"{\"hsflow_state\":1,\"plan\":\"0123456789abcdeg\",\"epochs\":1,\"order\":\"arrival\"}",
     "16 hex"},
    {"{\"hsflow_state\":1,\"plan\":7,\"epochs\":1,\"order\":\"arrival\"}", "16 hex"},
    {HEAD "\"epochs\":2,\"batches_per_epoch\":0}", "\"batches_per_epoch\" must"},
    {HEAD "\"epochs\":2,\"batches_per_epoch\":4294967296}", "\"batches_per_epoch\" must"},
    {HEAD "\"epochs\":2,\"batches_per_epoch\":16777217}", "in 1..16777216"},
    {HEAD "\"epochs\":2,\"batches_per_epoch\":-1}", "\"batches_per_epoch\" must"},
    {HEAD "\"epochs\":2,\"batches_per_epoch\":37,\"epochs_done\":3}", "\"epochs_done\" must"},
    {HEAD "\"epochs\":2,\"batches_per_epoch\":37,\"epochs_done\":0,\"delivered\":75}",
     "\"delivered\" must"},
    {HEAD "\"epochs\":2,\"batches_per_epoch\":37,\"epochs_done\":0,\"delivered\":0}",
     "no \"partial\" array"},
    {HEAD "\"epochs\":2,\"batches_per_epoch\":37,\"epochs_done\":1,\"delivered\":37,"
          "\"partial\":[{},{}]}",
     "lists 2 epochs in progress, but only 1"},
    {HEAD "\"epochs\":2,\"batches_per_epoch\":37,\"epochs_done\":0,\"delivered\":0,"
          "\"partial\":[7]}",
     "partial[0] is not an object"},
    {HEAD "\"epochs\":2,\"batches_per_epoch\":37,\"epochs_done\":1,\"delivered\":38,"
          "\"partial\":[{\"epoch\":0,\"count\":1,\"bitmap\":\"AQAAAAA=\"}]}",
     "partial[0]: \"epoch\" must"},
    {HEAD "\"epochs\":3,\"batches_per_epoch\":37,\"epochs_done\":0,\"delivered\":2,"
          "\"partial\":[{\"epoch\":1,\"count\":1,\"bitmap\":\"AQAAAAA=\"},"
          "{\"epoch\":1,\"count\":1,\"bitmap\":\"AQAAAAA=\"}]}",
     "epoch 1 does not follow epoch 1"},
    {HEAD "\"epochs\":2,\"batches_per_epoch\":37,\"epochs_done\":0,\"delivered\":38,"
          "\"partial\":[{\"epoch\":0,\"count\":38,\"bitmap\":\"AQAAAAA=\"}]}",
     "\"count\" must"},
    {HEAD "\"epochs\":2,\"batches_per_epoch\":37,\"epochs_done\":0,\"delivered\":1,"
          "\"partial\":[{\"epoch\":0,\"count\":1}]}",
     "no \"bitmap\" string"},
    {HEAD "\"epochs\":2,\"batches_per_epoch\":37,\"epochs_done\":0,\"delivered\":1,"
          "\"partial\":[{\"epoch\":0,\"count\":1,\"bitmap\":\"AQAAAAAAAAAAAAAAAAAA\"}]}",
     "20 base64 characters, 8 are needed for 37"},
    {HEAD "\"epochs\":2,\"batches_per_epoch\":37,\"epochs_done\":0,\"delivered\":1,"
          "\"partial\":[{\"epoch\":0,\"count\":1,\"bitmap\":\"AQ!!AAA=\"}]}",
     "not valid base64"},
    {HEAD "\"epochs\":2,\"batches_per_epoch\":37,\"epochs_done\":0,\"delivered\":3,"
          "\"partial\":[{\"epoch\":0,\"count\":3,\"bitmap\":\"AAAAAOA=\"}]}",
     "marks batches past the 37"},
    {HEAD "\"epochs\":2,\"batches_per_epoch\":37,\"epochs_done\":0,\"delivered\":1,"
          "\"partial\":[{\"epoch\":0,\"count\":1,\"bitmap\":\"AwAAAAA=\"}]}",
     "\"count\" is 1 but the bitmap holds 2"},
    {HEAD "\"epochs\":2,\"batches_per_epoch\":37,\"epochs_done\":1,\"delivered\":37,"
          "\"partial\":[{\"epoch\":1,\"count\":1,\"bitmap\":\"AQAAAAA=\"}]}",
     "\"delivered\" is 37 but its epochs hold 38"},
};

START_TEST(malformed_state_is_refused_saying_what_is_wrong)
{
    const char *t = malformed[_i].text;
    char why[512] = "";
    hs_state_t *s = NULL;
    ck_assert_int_eq(hs_state_decode(t, strlen(t), &s, why, sizeof(why)), HS_ERR_FORMAT);
    ck_assert_ptr_null(s);
    ck_assert_msg(strstr(why, malformed[_i].says), "case %d: '%s' says '%s', expected '%s'", _i, t,
                  why, malformed[_i].says);
}
END_TEST

/* A saved state with anything but white space after its JSON object is
 * not the state that was saved: refused, saying where the extra bytes are. */
START_TEST(state_with_bytes_after_its_json_is_refused)
{
    hs_state_t *s, *d = NULL;
    ck_assert_int_eq(hs_state_bind(NULL, PLAN, N, 2, HS_STATE_PLAN, &s), HS_OK);
    hs_state_mark(s, 0, 5);
    char *text = encode(s);
    size_t len = strlen(text);
    char *more = malloc(len + 64), why[512] = "";
    static const char *const tails[] = {"x", "{}", " {\"hsflow_state\":1}", "\n\n0", "]"};
    for (size_t i = 0; i < sizeof(tails) / sizeof(tails[0]); i++) {
        snprintf(more, len + 64, "%s%s", text, tails[i]);
        ck_assert_msg(hs_state_decode(more, strlen(more), &d, why, sizeof(why)) == HS_ERR_FORMAT,
                      "tail '%s' accepted", tails[i]);
        ck_assert_ptr_null(d);
        ck_assert_msg(strstr(why, "bytes after its JSON object"), "tail '%s': %s", tails[i], why);
    }
    /* white space after it, as a file written with a final newline has, is fine */
    snprintf(more, len + 64, "%s \r\n\t\n", text);
    ck_assert_int_eq(hs_state_decode(more, strlen(more), &d, why, sizeof(why)), HS_OK);
    ck_assert_uint_eq(hs_state_delivered(d), 1);
    hs_state_destroy(d);
    hs_state_destroy(s);
    free(more);
    free(text);
}
END_TEST

START_TEST(oversized_or_deeply_nested_state_is_refused_before_use)
{
    char why[512] = "";
    hs_state_t *s = NULL;
    size_t big = (size_t)HS_STATE_MAX_BYTES + 1;
    char *text = malloc(big);
    ck_assert_ptr_nonnull(text);
    memset(text, ' ', big);
    ck_assert_int_eq(hs_state_decode(text, big, &s, why, sizeof(why)), HS_ERR_FORMAT);
    ck_assert_ptr_nonnull(strstr(why, "more than the 64 MiB"));
    /* nesting deeper than the parser takes */
    size_t depth = 100000;
    memset(text, '[', depth);
    ck_assert_int_eq(hs_state_decode(text, depth, &s, why, sizeof(why)), HS_ERR_FORMAT);
    ck_assert_ptr_nonnull(strstr(why, "not valid JSON"));
    ck_assert_ptr_null(s);
    free(text);
}
END_TEST

START_TEST(journal_that_gives_way_to_a_state_is_rewritten_to_its_batches)
{
    char path[] = "/tmp/hs-test-journal-XXXXXX";
    int fd = mkstemp(path);
    ck_assert_int_ge(fd, 0);
    /* a journal of another plan with batches the state does not hold */
    const char *old = "hsflow-journal 1 plan=00000000000000aa batches=4\n0 0\n0 1\n0 2\n0 3\n1 2\n";
    ck_assert_int_eq(write(fd, old, strlen(old)), (ssize_t)strlen(old));
    close(fd);

    hs_state_t *st;
    ck_assert_int_eq(hs_state_bind(NULL, PLAN, 3, 2, HS_STATE_ARRIVAL, &st), HS_OK);
    hs_state_mark(st, 0, 0);
    hs_state_mark(st, 0, 1);
    hs_state_mark(st, 0, 2);
    hs_state_mark(st, 1, 1);

    hs_journal_t *j;
    char why[512];
    ck_assert_int_eq(hs_journal_open(path, &j), HS_OK);
    hs_journal_discard(j);
    ck_assert_msg(hs_journal_bind(j, PLAN, 3, 2, why, sizeof(why)) == HS_OK, "%s", why);
    ck_assert_int_eq(hs_journal_rewrite(j, st), HS_OK);
    ck_assert_uint_eq(hs_journal_start_epoch(j), 1);
    ck_assert_uint_eq(hs_journal_count(j), 4);
    ck_assert_int_eq(hs_journal_append(j, 1, 0), HS_OK);
    hs_journal_close(j);

    char buf[512] = "";
    FILE *f = fopen(path, "r");
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n] = 0;
    ck_assert_str_eq(buf,
                     "hsflow-journal 1 plan=0123456789abcdef batches=3\n0 0\n0 1\n0 2\n1 1\n1 0\n");
    /* and it is a journal of the state's plan now */
    ck_assert_int_eq(hs_journal_open(path, &j), HS_OK);
    ck_assert_int_eq(hs_journal_bind(j, PLAN, 3, 2, why, sizeof(why)), HS_OK);
    ck_assert_uint_eq(hs_journal_count(j), 5);
    hs_journal_close(j);
    unlink(path);
    hs_state_destroy(st);
}
END_TEST

START_TEST(state_of_a_rank_names_it_completes_its_epoch_with_its_shard_and_refuses_another_rank)
{
    /* rank 1 of 4: an epoch of N = 37 batches gives it 9 with drop */
    hs_state_t *empty, *s, *d;
    ck_assert_int_eq(hs_state_create_empty(2, HS_STATE_ARRIVAL, &empty), HS_OK);
    hs_state_set_shard(empty, 1, 4, HS_UNEVEN_DROP);
    ck_assert_int_eq(hs_state_bind(empty, PLAN, N, 2, HS_STATE_ARRIVAL, &s), HS_OK);
    for (uint32_t b = 0; b < 9; b++)
        hs_state_mark(s, 0, b * 4 + 1);
    ck_assert_uint_eq(hs_state_epochs_done(s), 1);
    hs_state_mark(s, 1, 5);
    char *text = encode(s);
    ck_assert_ptr_nonnull(strstr(text, "\"rank\":1,\"world\":4,\"uneven\":\"drop\""));
    char why[512];
    ck_assert_int_eq(hs_state_decode(text, strlen(text), &d, why, sizeof(why)), HS_OK);
    ck_assert_uint_eq(hs_state_epochs_done(d), 1);
    ck_assert_uint_eq(hs_state_delivered(d), 10);
    ck_assert_int_eq(hs_state_check_shard(d, 1, 4, HS_UNEVEN_DROP, why, sizeof(why)), HS_OK);
    ck_assert_int_eq(hs_state_check_shard(d, 2, 4, HS_UNEVEN_DROP, why, sizeof(why)),
                     HS_ERR_MISMATCH);
    ck_assert_ptr_nonnull(strstr(why, "rank 1 of 4"));
    ck_assert_ptr_nonnull(strstr(why, "rank 2 of 4"));
    ck_assert_int_eq(hs_state_check_shard(d, 1, 2, HS_UNEVEN_DROP, why, sizeof(why)),
                     HS_ERR_MISMATCH);
    ck_assert_int_eq(hs_state_check_shard(d, 1, 4, HS_UNEVEN_REPEAT, why, sizeof(why)),
                     HS_ERR_MISMATCH);
    ck_assert_int_eq(hs_state_check_shard(d, 0, 1, HS_UNEVEN_DROP, why, sizeof(why)),
                     HS_ERR_MISMATCH);
    free(text);
    hs_state_destroy(d);
    hs_state_destroy(s);
    hs_state_destroy(empty);
}
END_TEST

START_TEST(journal_of_another_rank_is_refused_naming_both)
{
    char path[] = "/tmp/hs-test-journal-rank-XXXXXX";
    int fd = mkstemp(path);
    ck_assert_int_ge(fd, 0);
    close(fd);
    unlink(path);
    hs_journal_t *j;
    char why[512];
    ck_assert_int_eq(hs_journal_open(path, &j), HS_OK);
    ck_assert_int_eq(hs_journal_set_shard(j, 3, 4, HS_UNEVEN_REPEAT, why, sizeof(why)), HS_OK);
    ck_assert_int_eq(hs_journal_bind(j, PLAN, N, 2, why, sizeof(why)), HS_OK);
    for (uint32_t b = 0; b < 10; b++) /* repeat: ceil(37 / 4) = 10 complete epoch 0 */
        ck_assert_int_eq(hs_journal_append(j, 0, b), HS_OK);
    hs_journal_close(j);
    ck_assert_int_eq(hs_journal_open(path, &j), HS_OK);
    ck_assert_int_eq(hs_journal_set_shard(j, 0, 4, HS_UNEVEN_REPEAT, why, sizeof(why)),
                     HS_ERR_MISMATCH);
    ck_assert_ptr_nonnull(strstr(why, "rank 3 of 4"));
    ck_assert_ptr_nonnull(strstr(why, "rank 0 of 4"));
    ck_assert_int_eq(hs_journal_set_shard(j, 3, 1, HS_UNEVEN_DROP, why, sizeof(why)),
                     HS_ERR_MISMATCH);
    ck_assert_int_eq(hs_journal_set_shard(j, 3, 4, HS_UNEVEN_REPEAT, why, sizeof(why)), HS_OK);
    ck_assert_int_eq(hs_journal_bind(j, PLAN, N, 2, why, sizeof(why)), HS_OK);
    ck_assert_uint_eq(hs_journal_start_epoch(j), 1);
    hs_journal_close(j);
    unlink(path);
}
END_TEST

START_TEST(journal_refuses_a_batch_outside_the_run_and_stays_readable)
{
    /* A release of a batch outside the run (a trainer's bad hs_batch_t) once
     * wrote a line the next open refused, so the restart lost the journal. */
    char path[] = "/tmp/hs-test-journal-range-XXXXXX";
    int fd = mkstemp(path);
    ck_assert_int_ge(fd, 0);
    close(fd);
    unlink(path);
    hs_journal_t *j;
    char why[512];
    ck_assert_int_eq(hs_journal_open(path, &j), HS_OK);
    ck_assert_msg(hs_journal_bind(j, PLAN, 3, 2, why, sizeof(why)) == HS_OK, "%s", why);
    ck_assert_int_eq(hs_journal_append(j, 0, 1), HS_OK);
    ck_assert_int_eq(hs_journal_append(j, 0, 3), HS_ERR_INVALID); /* batch 3 of 3 */
    ck_assert_int_eq(hs_journal_append(j, 2, 0), HS_ERR_INVALID); /* epoch 2 of 2 */
    ck_assert_int_eq(hs_journal_append(j, UINT32_MAX, UINT32_MAX), HS_ERR_INVALID);
    ck_assert_int_eq(hs_journal_append(j, 1, 2), HS_OK);
    hs_journal_close(j);
    ck_assert_int_eq(hs_journal_open(path, &j), HS_OK);
    ck_assert_msg(hs_journal_bind(j, PLAN, 3, 2, why, sizeof(why)) == HS_OK, "%s", why);
    ck_assert_uint_eq(hs_journal_count(j), 2);
    hs_journal_close(j);
    unlink(path);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("state");
    TCase *tc = tcase_create("state");
    tcase_add_test(tc, bound_state_round_trips_through_json_bit_for_bit);
    tcase_add_test(tc, finished_run_and_empty_state_encode_and_decode);
    tcase_add_test(tc, state_of_another_plan_epochs_or_order_is_refused_naming_what_differs);
    tcase_add_loop_test(tc, malformed_state_is_refused_saying_what_is_wrong, 0,
                        (int)(sizeof(malformed) / sizeof(malformed[0])));
    tcase_add_test(tc, state_with_bytes_after_its_json_is_refused);
    tcase_add_test(tc, oversized_or_deeply_nested_state_is_refused_before_use);
    tcase_add_test(tc, journal_that_gives_way_to_a_state_is_rewritten_to_its_batches);
    tcase_add_test(
        tc, state_of_a_rank_names_it_completes_its_epoch_with_its_shard_and_refuses_another_rank);
    tcase_add_test(tc, journal_of_another_rank_is_refused_naming_both);
    tcase_add_test(tc, journal_refuses_a_batch_outside_the_run_and_stays_readable);
    suite_add_tcase(s, tc);
    SRunner *r = srunner_create(s);
    srunner_run_all(r, CK_NORMAL);
    int failed = srunner_ntests_failed(r);
    srunner_free(r);
    return failed ? 1 : 0;
}
