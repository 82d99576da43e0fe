/* SPDX-License-Identifier: Apache-2.0 */
/* test_store.c - the consumer's store: a region written is read back
 * byte for byte by a reopened store; torn and wrongly sealed index records
 * are dropped at open; a run that differs is refused naming each field; a
 * full disk stops the store growing with nothing torn left behind; a link,
 * FIFO or oversized file planted in the folder is refused, never followed,
 * waited on or read into memory. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "store_int.h"
#include "hs_time.h"
#include "hs_checksum.h"
#include "hs_plan_hash.h"

#define N_BATCHES 3
static uint32_t n_seqs[N_BATCHES] = {2, 1, 3};
static uint32_t n_tokens[N_BATCHES] = {10, 7, 12};
static hs_layout_t layout = {
    .hidden_size = 8, .dtype = HS_DTYPE_BF16, .n_layers = 2, .layers = {1, 2}};

/* The plan hash of the test's shapes (the store checks it at open). */
#define PLAN_BASIS 0x4444u
#define PLAN_HASH hs_plan_hash_of(PLAN_BASIS, N_BATCHES, n_seqs, n_tokens)

static hs_store_run_t test_run(void)
{
    hs_store_run_t r = {.dataset_fingerprint = 0x1111,
                        .plan_hash = PLAN_HASH,
                        .plan_basis = PLAN_BASIS,
                        .target_fingerprint = 0x7777,
                        .seed = 3,
                        .layout = layout,
                        .n_batches = N_BATCHES,
                        .token_budget = 16,
                        .n_seqs = n_seqs,
                        .n_tokens = n_tokens};
    snprintf(r.model, sizeof(r.model), "tiny");
    return r;
}

/* A sealed synthetic region of batch b in buf (4096-aligned, zeroed). */
static uint64_t make_region(uint8_t *buf, uint32_t b)
{
    uint64_t bytes = hs_batch_bytes(n_seqs[b], n_tokens[b], &layout);
    memset(buf, 0, bytes);
    hs_batch_header_init((hs_batch_header_t *)buf, 0, b, n_seqs[b], n_tokens[b], &layout,
                         PLAN_HASH);
    hs_batch_view_t v = hs_batch_view(buf, n_seqs[b], n_tokens[b], &layout);
    for (uint32_t s = 0; s <= n_seqs[b]; s++)
        v.cu_seqlens[s] = (int32_t)(s == n_seqs[b] ? n_tokens[b] : s * 3);
    for (uint32_t s = 0; s < n_seqs[b]; s++)
        v.sample_ids[s] = 10 * b + s;
    hs_batch_synth_fill(&v, &layout);
    hs_batch_seal(buf, bytes);
    return bytes;
}

static int n_freed;
static void on_free(void *arg, uint64_t off)
{
    (void)arg;
    (void)off;
    n_freed++;
}

static void mkstore(char *dir) { ck_assert_ptr_nonnull(mkdtemp(dir)); }

static void rmstore(const char *dir)
{
    char cmd[600];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
    ck_assert_int_eq(system(cmd), 0);
}

/* Writes batches [0, n) into a new store at dir and closes it. */
static void fill(const char *dir, uint32_t n, uint8_t *cache)
{
    hs_store_t *s;
    hs_store_run_t r = test_run();
    ck_assert_int_eq(hs_store_open(dir, &s), HS_OK);
    ck_assert_ptr_null(hs_store_run(s));
    ck_assert_int_eq(hs_store_bind(s, &r, cache, 1 << 20, on_free, NULL), HS_OK);
    for (uint32_t b = 0; b < n; b++) {
        uint64_t bytes = make_region(cache + b * 65536, b);
        ck_assert(hs_store_submit(s, b, b * 65536, bytes));
    }
    hs_store_close(s); /* waits for the writer */
}

START_TEST(region_written_is_read_back_byte_for_byte_by_a_reopened_store)
{
    char dir[] = "/tmp/hs-test-store-XXXXXX";
    mkstore(dir);
    uint8_t *cache = aligned_alloc(4096, 4 * 65536), *back = aligned_alloc(4096, 65536);
    fill(dir, 2, cache);
    hs_store_t *s;
    hs_store_run_t r = test_run();
    ck_assert_int_eq(hs_store_open(dir, &s), HS_OK);
    const hs_store_run_t *got = hs_store_run(s);
    ck_assert_ptr_nonnull(got);
    ck_assert_uint_eq(got->plan_hash, PLAN_HASH);
    ck_assert_str_eq(got->model, "tiny");
    ck_assert_int_eq(hs_store_bind(s, &r, cache, 1 << 20, on_free, NULL), HS_OK);
    ck_assert(hs_store_has(s, 0) && hs_store_has(s, 1) && !hs_store_has(s, 2));
    char why[256] = "";
    for (uint32_t b = 0; b < 2; b++) {
        uint64_t bytes = hs_batch_bytes(n_seqs[b], n_tokens[b], &layout);
        ck_assert_int_eq(hs_store_read(s, b, back, bytes, why, sizeof(why)), HS_OK);
        ck_assert_int_eq(memcmp(back, cache + b * 65536, bytes), 0);
    }
    ck_assert_int_eq(hs_store_read(s, 2, back, 4096, why, sizeof(why)), HS_ERR_NOT_FOUND);
    hs_store_forget(s, 1);
    ck_assert(!hs_store_has(s, 1));
    hs_store_close(s);
    free(cache);
    free(back);
    rmstore(dir);
}
END_TEST

START_TEST(torn_and_wrongly_sealed_index_records_are_dropped_at_open)
{
    char dir[] = "/tmp/hs-test-store-XXXXXX", path[600];
    mkstore(dir);
    uint8_t *cache = aligned_alloc(4096, 4 * 65536);
    fill(dir, 3, cache);
    snprintf(path, sizeof(path), "%s/index.hsi", dir);
    FILE *f = fopen(path, "r+b");
    ck_assert_ptr_nonnull(f);
    /* record 1: one byte of its batch id changed, its seal now wrong */
    fseek(f, 64 + 4, SEEK_SET);
    fputc(2, f);
    /* half a 4th record: a crash while appending */
    fseek(f, 0, SEEK_END);
    fwrite(cache, 1, 30, f);
    fclose(f);
    hs_store_t *s;
    hs_store_run_t r = test_run();
    ck_assert_int_eq(hs_store_open(dir, &s), HS_OK);
    ck_assert_int_eq(hs_store_bind(s, &r, cache, 1 << 20, on_free, NULL), HS_OK);
    ck_assert(hs_store_has(s, 0) && !hs_store_has(s, 1) && hs_store_has(s, 2));
    hs_store_stats_t st;
    hs_store_stats(s, &st);
    ck_assert_uint_eq(st.dropped, 2);
    ck_assert_uint_eq(st.batches, 2);
    hs_store_close(s);
    free(cache);
    rmstore(dir);
}
END_TEST

START_TEST(a_run_that_differs_is_refused_naming_each_field)
{
    char dir[] = "/tmp/hs-test-store-XXXXXX";
    mkstore(dir);
    uint8_t *cache = aligned_alloc(4096, 4 * 65536);
    fill(dir, 1, cache);
    hs_store_t *s;
    ck_assert_int_eq(hs_store_open(dir, &s), HS_OK);
    char why[900] = "";
    ck_assert_int_eq(
        hs_store_check(s, 0x1111, &layout, PLAN_HASH, N_BATCHES, 0x7777, "tiny", why, sizeof why),
        HS_OK);
    /* the same target under another name is the same target; another one
     * (new weights in the same folder) is refused, whatever its name */
    ck_assert_int_eq(hs_store_check(s, 0x1111, &layout, PLAN_HASH, N_BATCHES, 0x7777, "/elsewhere",
                                    why, sizeof why),
                     HS_OK);
    ck_assert_int_eq(
        hs_store_check(s, 0x1111, &layout, PLAN_HASH, N_BATCHES, 0x7778, "tiny", why, sizeof why),
        HS_ERR_MISMATCH);
    ck_assert_msg(strstr(why, "target 0000000000007778 ('tiny'), the store holds the states of "
                              "0000000000007777 ('tiny')"),
                  "%s", why);
    hs_layout_t fp8 = layout;
    fp8.dtype = HS_DTYPE_FP8;
    ck_assert_int_eq(
        hs_store_check(s, 0x9999, &fp8, PLAN_HASH, N_BATCHES, 0x8888, "other", why, sizeof why),
        HS_ERR_MISMATCH);
    ck_assert_msg(strstr(why, "dataset fingerprint 0000000000009999, the store holds "
                              "0000000000001111") &&
                      strstr(why, "dtype=fp8, the store holds H=8,layers=1,2,dtype=bf16") &&
                      strstr(why,
                             "target 0000000000008888 ('other'), the store holds the states of "
                             "0000000000007777 ('tiny')") &&
                      !strstr(why, "plan"),
                  "%s", why);
    hs_store_close(s);
    free(cache);
    rmstore(dir);
}
END_TEST

START_TEST(full_disk_stops_the_store_growing_with_nothing_torn_left)
{
    char dir[] = "/tmp/hs-test-store-XXXXXX", path[600];
    mkstore(dir);
    uint8_t *cache = aligned_alloc(4096, 4 * 65536);
    hs_store_fault_set("enospc=2");
    hs_store_t *s;
    hs_store_run_t r = test_run();
    ck_assert_int_eq(hs_store_open(dir, &s), HS_OK);
    ck_assert_int_eq(hs_store_bind(s, &r, cache, 1 << 20, on_free, NULL), HS_OK);
    hs_store_fault_set(NULL);
    n_freed = 0;
    for (uint32_t b = 0; b < 3; b++) {
        uint64_t bytes = make_region(cache + b * 65536, b);
        ck_assert(hs_store_submit(s, b, b * 65536, bytes));
    }
    hs_store_close(s);
    ck_assert_int_eq(n_freed, 0); /* no slot was released by a trainer */
    ck_assert_int_eq(hs_store_open(dir, &s), HS_OK);
    ck_assert_int_eq(hs_store_bind(s, &r, cache, 1 << 20, on_free, NULL), HS_OK);
    ck_assert(hs_store_has(s, 0) && !hs_store_has(s, 1) && !hs_store_has(s, 2));
    hs_store_close(s);
    /* the half region was cut off: the shard ends with batch 0 */
    snprintf(path, sizeof(path), "%s/shard-00000.hsd", dir);
    struct stat sb;
    ck_assert_int_eq(stat(path, &sb), 0);
    ck_assert_uint_eq((uint64_t)sb.st_size, hs_batch_bytes(n_seqs[0], n_tokens[0], &layout));
    free(cache);
    rmstore(dir);
}
END_TEST

/* A file outside the store that a planted link points at. */
static void victim_make(const char *path)
{
    FILE *f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    fputs("precious: not a store file, and it stays as it is\n", f);
    fclose(f);
}

static void victim_check(const char *path)
{
    char buf[256] = "";
    FILE *f = fopen(path, "r");
    ck_assert_ptr_nonnull(f);
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    ck_assert_str_eq(buf, "precious: not a store file, and it stays as it is\n");
}

START_TEST(a_planted_index_link_is_neither_followed_nor_written_through)
{
    char dir[] = "/tmp/hs-test-store-XXXXXX", victim[600], index[600];
    mkstore(dir);
    snprintf(victim, sizeof victim, "%s.victim", dir);
    snprintf(index, sizeof index, "%s/index.hsi", dir);
    victim_make(victim);
    uint8_t *cache = aligned_alloc(4096, 4 * 65536);
    /* a new store with the link planted before its first write: nothing is
     * written through it, the run goes on without storing */
    ck_assert_int_eq(symlink(victim, index), 0);
    hs_store_t *s;
    hs_store_run_t r = test_run();
    ck_assert_int_eq(hs_store_open(dir, &s), HS_OK);
    ck_assert_int_eq(hs_store_bind(s, &r, cache, 1 << 20, on_free, NULL), HS_OK);
    uint64_t bytes = make_region(cache, 0);
    ck_assert(hs_store_submit(s, 0, 0, bytes));
    hs_store_close(s);
    victim_check(victim);
    /* a store with a run and the link in place of its index: refused at open */
    ck_assert_int_eq(unlink(index), 0);
    rmstore(dir);
    memcpy(dir + strlen(dir) - 6, "XXXXXX", 6);
    mkstore(dir);
    snprintf(index, sizeof index, "%s/index.hsi", dir);
    fill(dir, 1, cache);
    ck_assert_int_eq(unlink(index), 0);
    ck_assert_int_eq(symlink(victim, index), 0);
    ck_assert_int_eq(hs_store_open(dir, &s), HS_ERR_FORMAT);
    victim_check(victim);
    /* a link planted, once the store is open, as the shard its writer
     * opens next: not truncated, not written through */
    ck_assert_int_eq(unlink(index), 0);
    ck_assert_int_eq(hs_store_open(dir, &s), HS_OK);
    ck_assert_int_eq(hs_store_bind(s, &r, cache, 1 << 20, on_free, NULL), HS_OK);
    char shard[600];
    snprintf(shard, sizeof shard, "%s/shard-00001.hsd", dir);
    ck_assert_int_eq(symlink(victim, shard), 0);
    ck_assert(!hs_store_has(s, 0));
    ck_assert(hs_store_submit(s, 0, 0, bytes));
    hs_store_close(s);
    victim_check(victim);
    unlink(victim);
    free(cache);
    rmstore(dir);
}
END_TEST

/* hs_store_open on dir with `name` a FIFO: refused, without waiting for a
 * writer (the test case's timeout fails a wait). */
static void fifo_refused(const char *dir, const char *name)
{
    char path[600];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    ck_assert_int_eq(unlink(path), 0);
    ck_assert_int_eq(mkfifo(path, 0666), 0);
    hs_store_t *s;
    double t0 = hs_now_s();
    ck_assert_int_eq(hs_store_open(dir, &s), HS_ERR_FORMAT);
    ck_assert_msg(hs_now_s() - t0 < 5, "%s: a FIFO took %.1f s to refuse", name, hs_now_s() - t0);
}

START_TEST(a_fifo_in_the_store_is_refused_without_waiting)
{
    char dir[] = "/tmp/hs-test-store-XXXXXX";
    uint8_t *cache = aligned_alloc(4096, 4 * 65536);
    const char *names[] = {"store.json", "plan.bin", "index.hsi"};
    for (int i = 0; i < 3; i++) {
        memcpy(dir + strlen(dir) - 6, "XXXXXX", 6);
        mkstore(dir);
        fill(dir, 1, cache);
        fifo_refused(dir, names[i]);
        rmstore(dir);
    }
    free(cache);
}
END_TEST

static long maxrss_kib(void)
{
    struct rusage ru;
    ck_assert_int_eq(getrusage(RUSAGE_SELF, &ru), 0);
    return ru.ru_maxrss;
}

START_TEST(an_index_larger_than_the_plan_can_need_is_refused_unread)
{
    char dir[] = "/tmp/hs-test-store-XXXXXX", path[600];
    mkstore(dir);
    uint8_t *cache = aligned_alloc(4096, 4 * 65536);
    fill(dir, 2, cache);
    /* sparse: costs no disk, and would cost its size in memory if read */
    snprintf(path, sizeof path, "%s/index.hsi", dir);
    ck_assert_int_eq(truncate(path, 256ll << 20), 0);
    long rss0 = maxrss_kib();
    hs_store_t *s;
    ck_assert_int_eq(hs_store_open(dir, &s), HS_ERR_FORMAT);
    long grew = maxrss_kib() - rss0;
    ck_assert_msg(grew < 32 * 1024, "opening the store took %ld KiB more memory", grew);
    /* an index of the size a plan can need still opens, its tail dropped */
    ck_assert_int_eq(truncate(path, 2 * 64 + 64 * 64), 0);
    ck_assert_int_eq(hs_store_open(dir, &s), HS_OK);
    hs_store_run_t r = test_run();
    ck_assert_int_eq(hs_store_bind(s, &r, cache, 1 << 20, on_free, NULL), HS_OK);
    ck_assert(hs_store_has(s, 0) && hs_store_has(s, 1));
    hs_store_close(s);
    free(cache);
    rmstore(dir);
}
END_TEST

/* A plan.bin whose shapes are not those of store.json's plan hash (a peer
 * lied about them, or the file was altered and sealed again) is refused at
 * open, and so is a store of the version before the hash covered them. */
START_TEST(a_plan_file_that_is_not_the_plan_hashs_is_refused_at_open)
{
    char dir[] = "/tmp/hs-test-store-XXXXXX", path[600];
    mkstore(dir);
    uint8_t *cache = aligned_alloc(4096, 4 * 65536);
    fill(dir, 1, cache);
    hs_store_t *s;
    ck_assert_int_eq(hs_store_open(dir, &s), HS_OK);
    hs_store_close(s);
    /* batch 1 claims 8 tokens instead of 7; the file's own seal made anew */
    snprintf(path, sizeof(path), "%s/plan.bin", dir);
    uint8_t bin[8 + 8 * N_BATCHES + 8];
    FILE *f = fopen(path, "r+b");
    ck_assert_ptr_nonnull(f);
    ck_assert_uint_eq(fread(bin, 1, sizeof(bin), f), sizeof(bin));
    uint32_t t = 8;
    memcpy(bin + 8 + 4 * N_BATCHES + 4, &t, 4);
    uint64_t seal = hs_checksum64(bin, sizeof(bin) - 8);
    memcpy(bin + sizeof(bin) - 8, &seal, 8);
    rewind(f);
    ck_assert_uint_eq(fwrite(bin, 1, sizeof(bin), f), sizeof(bin));
    fclose(f);
    ck_assert_int_eq(hs_store_open(dir, &s), HS_ERR_FORMAT);
    free(cache);
    rmstore(dir);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("store");
    TCase *tc = tcase_create("store");
    tcase_set_timeout(tc, 30);
    tcase_add_test(tc, region_written_is_read_back_byte_for_byte_by_a_reopened_store);
    tcase_add_test(tc, torn_and_wrongly_sealed_index_records_are_dropped_at_open);
    tcase_add_test(tc, a_run_that_differs_is_refused_naming_each_field);
    tcase_add_test(tc, full_disk_stops_the_store_growing_with_nothing_torn_left);
    tcase_add_test(tc, a_plan_file_that_is_not_the_plan_hashs_is_refused_at_open);
    suite_add_tcase(s, tc);
    /* planted files: a FIFO waited on would hang, so these fail in seconds */
    TCase *planted = tcase_create("planted");
    tcase_set_timeout(planted, 20);
    tcase_add_test(planted, a_planted_index_link_is_neither_followed_nor_written_through);
    tcase_add_test(planted, a_fifo_in_the_store_is_refused_without_waiting);
    tcase_add_test(planted, an_index_larger_than_the_plan_can_need_is_refused_unread);
    suite_add_tcase(s, planted);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
