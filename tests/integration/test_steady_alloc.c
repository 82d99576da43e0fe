/* SPDX-License-Identifier: Apache-2.0 */
/* test_steady_alloc.c - the consumer allocates nothing per batch in steady
 * state: an in-process consumer (network thread, checksum threads and the
 * trainer's calls in this process) takes many epochs of a small plan from
 * a real hs-producer (another process, so its own allocations are not
 * counted) over loopback TCP, and every malloc, calloc, realloc and
 * posix_memalign of this process while the middle epochs stream is counted
 * (tests/common/alloc_count.h): there must be none. Verify jobs, tickets,
 * DONE and STATS frames, the scheduler's records, the delivery queue, the
 * released tickets and the status line all use storage planned at start or
 * grown during warm-up. Run in arrival and in plan order. Sanitizer builds, whose allocator is not
 * interposed, stream the same run without the count. */
#include <check.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/jsonl_fixture.h"
#include "common/alloc_count.h"
#include "hsflow.h"
#include "hs_time.h"

#define EPOCHS 24u
#define COUNT_FROM 6u   /* epochs of warm-up before the count */
#define COUNT_UNTIL 20u /* the count stops once this epoch starts */
#define BUDGET 256u
#define N_SEQS 60u

static const char *g_producer_bin; /* argv[1] */
static char g_dir[256], g_data[300], g_log[300];

static void write_dataset(void)
{
    hs_test_tmpdir(g_dir, sizeof g_dir, "hs-steady");
    snprintf(g_data, sizeof g_data, "%s/data.jsonl", g_dir);
    snprintf(g_log, sizeof g_log, "%s/producer.log", g_dir);
    hs_test_write_jsonl(g_data, N_SEQS, 180, 99);
}

static pid_t producer_spawn(uint16_t port)
{
    ck_assert_msg(g_producer_bin != NULL, "give the hs-producer binary as the first argument");
    char cmd[2048];
    snprintf(cmd, sizeof cmd,
             "exec '%s' --to 127.0.0.1:%u --data '%s' --token-budget %u --seed 3 "
             "--hidden-size 32 --layers 1,3 --source synthetic --gpus cpu:2 --transport tcp "
             "--connect-timeout 30 --name steady >'%s' 2>&1",
             g_producer_bin, port, g_data, BUDGET, g_log);
    return hs_test_spawn_sh(cmd);
}

/* Waits up to `secs` for process `pid`; its exit status, or -1 (killed). */
static void run_counted(hs_order_t order)
{
    signal(SIGPIPE, SIG_IGN);
    write_dataset();
    hs_consumer_config_t cfg;
    hs_consumer_config_default(&cfg);
    cfg.listen_host = "127.0.0.1";
    cfg.listen_port = 0;
    cfg.cache_bytes = 32ull << 20;
    cfg.epochs = EPOCHS;
    cfg.order = order;
    cfg.verify_synthetic = true;
    cfg.verify_threads = 2;
    cfg.transport = "tcp";
    /* Heartbeats (STATS) every second and a status line every 0.2 s, while
     * a trainer taking 10 ms a batch keeps the counted window over 3 s: both
     * happen inside it. */
    cfg.lease_timeout_s = 4;
    cfg.status_interval_s = 0.2;
    hs_consumer_t *c = NULL;
    ck_assert_int_eq(hs_consumer_create(&cfg, &c), HS_OK);
    pid_t prod = producer_spawn(hs_consumer_port(c));

    /* No Check assertion inside the loop: they allocate (each marks its
     * place), and the count would see them. */
    uint64_t delivered = 0, counted_batches = 0, allocations = 0, bad_release = 0;
    bool timed_out = false, counting = false, counted = false;
    double t0 = hs_now_s();
    for (;;) {
        hs_batch_t b;
        hs_status_t st = hs_consumer_next(c, &b, 1000);
        if (st == HS_ERR_TIMEOUT) {
            if (hs_now_s() - t0 < 150) continue;
            timed_out = true;
            break;
        }
        if (st != HS_OK) break;
        if (!counted && !counting && b.epoch >= COUNT_FROM) {
            counting = true;
            alloc_count_start(1, SIZE_MAX);
        }
        if (counting && b.epoch >= COUNT_UNTIL) {
            allocations = alloc_count_stop();
            counting = false;
            counted = true;
        }
        if (counting) {
            counted_batches++;
            usleep(10000);
        }
        delivered++;
        if (hs_consumer_release(c, &b) != HS_OK) bad_release++;
    }
    if (counting) allocations = alloc_count_stop(), counted = true;
    int prod_exit = hs_test_reap(prod, 60);
    hs_consumer_stats_t s;
    hs_consumer_stats(c, &s);
    hs_consumer_destroy(c);

    ck_assert_msg(!timed_out, "the run did not end within 150 s (producer log: %s)", g_log);
    ck_assert_int_eq(prod_exit, 0);
    ck_assert_uint_eq(bad_release, 0);
    ck_assert_uint_eq(s.checksum_failures, 0);
    ck_assert_uint_eq(s.duplicates, 0);
    ck_assert_uint_eq(delivered, s.batches_planned);
    ck_assert_msg(counted && counted_batches > 100,
                  "the count covered %llu batches of %llu delivered",
                  (unsigned long long)counted_batches, (unsigned long long)delivered);
    unlink(g_log);
    unlink(g_data);
    rmdir(g_dir);
    if (!ALLOC_COUNT_WORKS) {
        printf("sanitizer build: its allocator is not interposed; count skipped\n");
        return;
    }
    if (allocations) alloc_count_print(stderr);
    ck_assert_msg(allocations == 0, "%llu allocations in the consumer while %llu batches streamed",
                  (unsigned long long)allocations, (unsigned long long)counted_batches);
    printf("order %s: %llu batches streamed in steady state with no allocation\n",
           order == HS_ORDER_PLAN ? "plan" : "arrival", (unsigned long long)counted_batches);
}

START_TEST(arrival_order_middle_epochs_allocate_nothing_in_the_consumer)
{
    run_counted(HS_ORDER_ARRIVAL);
}
END_TEST

START_TEST(plan_order_middle_epochs_allocate_nothing_in_the_consumer)
{
    run_counted(HS_ORDER_PLAN);
}
END_TEST

int main(int argc, char **argv)
{
    g_producer_bin = argc > 1 ? argv[1] : NULL;
    Suite *s = suite_create("consumer_steady_alloc");
    TCase *tc = tcase_create("steady_alloc");
    tcase_set_timeout(tc, 240);
    tcase_add_test(tc, arrival_order_middle_epochs_allocate_nothing_in_the_consumer);
    tcase_add_test(tc, plan_order_middle_epochs_allocate_nothing_in_the_consumer);
    suite_add_tcase(s, tc);
    SRunner *r = srunner_create(s);
    srunner_run_all(r, CK_NORMAL);
    int failed = srunner_ntests_failed(r);
    srunner_free(r);
    return failed ? 1 : 0;
}
