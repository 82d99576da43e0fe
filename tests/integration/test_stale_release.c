/* SPDX-License-Identifier: Apache-2.0 */
/* test_stale_release.c - a release names the delivery, not the slot: an
 * in-process consumer fed by a real hs-producer over loopback TCP hands the
 * trainer batch A, which it releases; once A's slot (host) or device buffer
 * (GPU) holds another batch B, A is released again. That stale release must
 * return HS_ERR_INVALID and change nothing: B's slot stays in use and its
 * bytes verify, the journal records A once, and the run delivers every
 * batch exactly once. (It once returned OK, journaled A again and freed B's
 * slot under the trainer.) And hs_consumer_unget(): a batch given back goes
 * out again, counted and journaled once. The GPU cases skip without a GPU. */
#include <check.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/jsonl_fixture.h"
#include "hsflow.h"
#include "hs_status.h"
#include "hs_proto.h"

#define EPOCHS 2u
#define BUDGET 256u
#define N_SEQS 60u

static const char *g_producer_bin; /* argv[1] */

static pid_t producer_spawn(uint16_t port, const char *data, const char *log)
{
    ck_assert_msg(g_producer_bin != NULL, "give the hs-producer binary as the first argument");
    char cmd[2048];
    snprintf(cmd, sizeof cmd,
             "exec '%s' --to 127.0.0.1:%u --data '%s' --token-budget %u --seed 3 "
             "--hidden-size 32 --layers 1,3 --source synthetic --gpus cpu:1 --transport tcp "
             "--connect-timeout 30 --name stale >'%s' 2>&1",
             g_producer_bin, port, data, BUDGET, log);
    return hs_test_spawn_sh(cmd);
}

/* Lines "E B" of the journal equal to (epoch, batch). */
static unsigned journal_lines_of(const char *path, uint32_t epoch, uint32_t batch)
{
    FILE *f = fopen(path, "r");
    ck_assert_ptr_nonnull(f);
    char line[256];
    unsigned n = 0, e, b;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "%u %u", &e, &b) == 2 && e == epoch && b == batch) n++;
    fclose(f);
    return n;
}

static void run_stale_release(int gpu)
{
    signal(SIGPIPE, SIG_IGN);
    char dir[256], data[300], log[300], journal[300];
    hs_test_tmpdir(dir, sizeof dir, "hs-stale");
    snprintf(data, sizeof data, "%s/data.jsonl", dir);
    snprintf(log, sizeof log, "%s/producer.log", dir);
    snprintf(journal, sizeof journal, "%s/journal", dir);
    hs_test_write_jsonl(data, N_SEQS, 180, 5);

    hs_consumer_config_t cfg;
    hs_consumer_config_default(&cfg);
    cfg.listen_host = "127.0.0.1";
    cfg.listen_port = 0;
    cfg.cache_bytes = 1u << 20; /* a few batches: slots come round again soon */
    cfg.epochs = EPOCHS;
    cfg.verify_synthetic = true;
    cfg.transport = "tcp";
    cfg.journal = journal;
    cfg.gpu = gpu;
    hs_consumer_t *c = NULL;
    hs_status_t created = hs_consumer_create(&cfg, &c);
    if (gpu >= 0 && created != HS_OK) {
        printf("no usable GPU (%s): the GPU case is skipped\n", hs_status_str(created));
        unlink(data);
        rmdir(dir);
        return;
    }
    ck_assert_int_eq(created, HS_OK);
    pid_t prod = producer_spawn(hs_consumer_port(c), data, log);

    hs_batch_t a, b;
    ck_assert_int_eq(hs_consumer_next(c, &a, 30000), HS_OK);
    ck_assert_int_eq(hs_consumer_release(c, &a), HS_OK);
    /* Take batches until one sits where A sat. */
    uint64_t delivered = 1;
    bool reused = false;
    for (int i = 0; i < 64 && !reused; i++) {
        ck_assert_int_eq(hs_consumer_next(c, &b, 30000), HS_OK);
        delivered++;
        reused = b.handle == a.handle;
        if (!reused) ck_assert_int_eq(hs_consumer_release(c, &b), HS_OK);
    }
    ck_assert_msg(reused, "no batch came into batch A's %s within 64 batches",
                  gpu >= 0 ? "device buffer" : "cache slot");
    /* The stale release: refused, nothing freed, nothing journaled. */
    ck_assert_int_eq(hs_consumer_release(c, &a), HS_ERR_INVALID);
    if (gpu < 0) {
        /* Had it freed B's slot, the batches that come next could land
         * there: take a few while holding B, then check B's bytes. */
        for (int i = 0; i < 8; i++) {
            hs_batch_t m;
            if (hs_consumer_next(c, &m, 30000) != HS_OK) break;
            delivered++;
            ck_assert_int_eq(hs_consumer_release(c, &m), HS_OK);
        }
        hs_consumer_stats_t after;
        hs_consumer_stats(c, &after);
        ck_assert_uint_ge(after.cache_used, b.bytes);
        /* B's bytes are still B's: its header, checksum and every value */
        hs_layout_t layout = {
            .hidden_size = 32, .dtype = HS_DTYPE_BF16, .n_layers = 2, .layers = {1, 3}};
        hs_batch_offsets_t off = hs_batch_offsets(b.n_seqs, b.n_tokens, &layout);
        uint8_t *region = (uint8_t *)(uintptr_t)b.cu_seqlens - off.cu_seqlens;
        char why[256] = "";
        hs_status_t v = hs_batch_verify(region, b.bytes, b.epoch, b.batch, b.n_seqs, b.n_tokens,
                                        &layout, why, sizeof why);
        if (v == HS_OK) {
            hs_batch_view_t view = hs_batch_view(region, b.n_seqs, b.n_tokens, &layout);
            v = hs_batch_synth_check(&view, &layout, why, sizeof why);
        }
        ck_assert_msg(v == HS_OK, "batch B changed under the trainer: %s", why);
    }
    /* A release with B's ticket but A's identity is refused too. */
    hs_batch_t forged = b;
    forged.batch = a.batch == b.batch ? a.batch + 1 : a.batch;
    forged.epoch = a.epoch;
    if (forged.batch != b.batch || forged.epoch != b.epoch)
        ck_assert_int_eq(hs_consumer_release(c, &forged), HS_ERR_INVALID);
    ck_assert_int_eq(hs_consumer_release(c, &b), HS_OK);
    ck_assert_int_eq(hs_consumer_release(c, &b), HS_ERR_INVALID); /* and B twice */

    hs_status_t st;
    hs_batch_t n;
    while ((st = hs_consumer_next(c, &n, 30000)) == HS_OK) {
        delivered++;
        ck_assert_int_eq(hs_consumer_release(c, &n), HS_OK);
    }
    ck_assert_int_eq(st, HS_ERR_CLOSED);
    hs_consumer_stats_t s;
    hs_consumer_stats(c, &s);
    hs_consumer_destroy(c);
    ck_assert_int_eq(hs_test_reap(prod, 60), 0);
    ck_assert_uint_eq(delivered, s.batches_planned);
    ck_assert_uint_eq(s.checksum_failures, 0);
    ck_assert_uint_eq(s.duplicates, 0);
    ck_assert_uint_eq(journal_lines_of(journal, a.epoch, a.batch), 1);
    ck_assert_uint_eq(journal_lines_of(journal, b.epoch, b.batch), 1);
    unlink(journal);
    unlink(log);
    unlink(data);
    rmdir(dir);
}

/* "delivered" of the consumer's position (hs_consumer_state_save). */
static unsigned position_delivered(hs_consumer_t *c)
{
    char buf[4096];
    size_t len = 0;
    ck_assert_int_eq(hs_consumer_state_save(c, buf, sizeof buf, &len), HS_OK);
    const char *d = strstr(buf, "\"delivered\":");
    ck_assert_ptr_nonnull(d);
    return (unsigned)strtoul(d + strlen("\"delivered\":"), NULL, 10);
}

/* A batch given back with hs_consumer_unget() (a binding interrupted before
 * its caller got the batch) is neither counted, nor in the position, nor
 * journaled; the next hs_consumer_next() hands out the very same batch, and
 * the run still delivers every batch exactly once. */
static void run_unget(int gpu)
{
    signal(SIGPIPE, SIG_IGN);
    char dir[256], data[300], log[300], journal[300];
    hs_test_tmpdir(dir, sizeof dir, "hs-unget");
    snprintf(data, sizeof data, "%s/data.jsonl", dir);
    snprintf(log, sizeof log, "%s/producer.log", dir);
    snprintf(journal, sizeof journal, "%s/journal", dir);
    hs_test_write_jsonl(data, N_SEQS, 180, 5);

    hs_consumer_config_t cfg;
    hs_consumer_config_default(&cfg);
    cfg.listen_host = "127.0.0.1";
    cfg.listen_port = 0;
    cfg.cache_bytes = 1u << 20;
    cfg.epochs = EPOCHS;
    cfg.verify_synthetic = true;
    cfg.transport = "tcp";
    cfg.journal = journal;
    cfg.gpu = gpu;
    hs_consumer_t *c = NULL;
    hs_status_t created = hs_consumer_create(&cfg, &c);
    if (gpu >= 0 && created != HS_OK) {
        printf("no usable GPU (%s): the GPU case is skipped\n", hs_status_str(created));
        unlink(data);
        rmdir(dir);
        return;
    }
    ck_assert_int_eq(created, HS_OK);
    pid_t prod = producer_spawn(hs_consumer_port(c), data, log);

    hs_batch_t a, again, other;
    ck_assert_int_eq(hs_consumer_next(c, &a, 30000), HS_OK);
    ck_assert(hs_consumer_holds(c, &a));
    ck_assert_uint_eq(position_delivered(c), 1);
    ck_assert_int_eq(hs_consumer_unget(c, &a), HS_OK);
    ck_assert(!hs_consumer_holds(c, &a));
    ck_assert_uint_eq(position_delivered(c), 0);
    hs_consumer_stats_t s;
    hs_consumer_stats(c, &s);
    ck_assert_uint_eq(s.batches_delivered, 0);
    ck_assert_int_eq(hs_consumer_unget(c, &a), HS_ERR_INVALID);   /* once */
    ck_assert_int_eq(hs_consumer_release(c, &a), HS_ERR_INVALID); /* it never reached the trainer */
    ck_assert_uint_eq(journal_lines_of(journal, a.epoch, a.batch), 0);

    ck_assert_int_eq(hs_consumer_next(c, &again, 30000), HS_OK);
    ck_assert_uint_eq(again.ticket, a.ticket);
    ck_assert_uint_eq(again.epoch, a.epoch);
    ck_assert_uint_eq(again.batch, a.batch);
    ck_assert_ptr_eq(again.input_ids, a.input_ids);
    ck_assert(hs_consumer_holds(c, &again));
    ck_assert_uint_eq(position_delivered(c), 1);
    ck_assert_int_eq(hs_consumer_release(c, &again), HS_OK);
    ck_assert(!hs_consumer_holds(c, &again));
    ck_assert_int_eq(hs_consumer_unget(c, &again),
                     HS_ERR_INVALID); /* released: not the trainer's */
    ck_assert_uint_eq(journal_lines_of(journal, a.epoch, a.batch), 1);

    uint64_t delivered = 1;
    hs_status_t st;
    while ((st = hs_consumer_next(c, &other, 30000)) == HS_OK) {
        delivered++;
        if (delivered == 5) { /* one in the middle of the run, too */
            ck_assert_int_eq(hs_consumer_unget(c, &other), HS_OK);
            ck_assert_int_eq(hs_consumer_next(c, &again, 30000), HS_OK);
            ck_assert_uint_eq(again.ticket, other.ticket);
        }
        ck_assert_int_eq(hs_consumer_release(c, &other), HS_OK);
    }
    ck_assert_int_eq(st, HS_ERR_CLOSED);
    hs_consumer_stats(c, &s);
    hs_consumer_destroy(c);
    ck_assert_int_eq(hs_test_reap(prod, 60), 0);
    ck_assert_uint_eq(delivered, s.batches_planned);
    ck_assert_uint_eq(s.batches_delivered, s.batches_planned);
    ck_assert(s.finished);
    ck_assert_uint_eq(journal_lines_of(journal, a.epoch, a.batch), 1);
    unlink(journal);
    unlink(log);
    unlink(data);
    rmdir(dir);
}

START_TEST(a_host_batch_given_back_goes_out_again_counted_once) { run_unget(-1); }
END_TEST

START_TEST(a_gpu_batch_given_back_goes_out_again_counted_once) { run_unget(0); }
END_TEST

START_TEST(stale_release_of_a_host_batch_frees_nothing_and_records_nothing)
{
    run_stale_release(-1);
}
END_TEST

START_TEST(stale_release_of_a_gpu_batch_frees_nothing_and_records_nothing) { run_stale_release(0); }
END_TEST

int main(int argc, char **argv)
{
    g_producer_bin = argc > 1 ? argv[1] : NULL;
    Suite *s = suite_create("stale_release");
    TCase *tc = tcase_create("stale_release");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, stale_release_of_a_host_batch_frees_nothing_and_records_nothing);
    tcase_add_test(tc, stale_release_of_a_gpu_batch_frees_nothing_and_records_nothing);
    tcase_add_test(tc, a_host_batch_given_back_goes_out_again_counted_once);
    tcase_add_test(tc, a_gpu_batch_given_back_goes_out_again_counted_once);
    suite_add_tcase(s, tc);
    SRunner *r = srunner_create(s);
    srunner_run_all(r, CK_NORMAL);
    int failed = srunner_ntests_failed(r);
    srunner_free(r);
    return failed ? 1 : 0;
}
