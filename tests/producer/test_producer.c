/* SPDX-License-Identifier: Apache-2.0 */
/* test_producer.c - datasets (JSONL, .hst), the batch planner, and filling
 * batch regions from a plan. */
#define XXH_STATIC_LINKING_ONLY
#include <check.h>
#include <dirent.h>
#include <fcntl.h>
#include <setjmp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include "hsflow.h"
#include "hs_checksum.h"
#include "hs_plan_hash.h"
#include "hs_shuffle.h"
#include "hs_memory.h"
#include "hs_data.h"
#include "hs_proto.h"
#include "hs_producer.h"
#include "report_int.h"

/* ---- helpers ---------------------------------------------------------------- */

static char g_dir[256];

static void dir_setup(void)
{
    const char *base = getenv("TMPDIR");
    snprintf(g_dir, sizeof(g_dir), "%s/hs_producer_test.XXXXXX", base ? base : "/tmp");
    ck_assert_ptr_nonnull(mkdtemp(g_dir));
}

static void dir_teardown(void)
{
    DIR *d = opendir(g_dir);
    if (!d) return;
    struct dirent *e;
    char p[512];
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        snprintf(p, sizeof(p), "%s/%s", g_dir, e->d_name);
        unlink(p);
    }
    closedir(d);
    rmdir(g_dir);
}

static const char *path_in_dir(const char *name)
{
    static char p[4][512];
    static int k;
    k = (k + 1) % 4;
    snprintf(p[k], sizeof(p[k]), "%s/%s", g_dir, name);
    return p[k];
}

static void write_file(const char *path, const void *data, size_t len)
{
    FILE *f = fopen(path, "wb");
    ck_assert_ptr_nonnull(f);
    ck_assert_uint_eq(fwrite(data, 1, len, f), len);
    fclose(f);
}

static size_t read_file(const char *path, uint8_t **out)
{
    FILE *f = fopen(path, "rb");
    ck_assert_ptr_nonnull(f);
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    *out = malloc((size_t)len + 1);
    ck_assert_uint_eq(fread(*out, 1, (size_t)len, f), (size_t)len);
    (*out)[len] = 0;
    fclose(f);
    return (size_t)len;
}

/* Runs hs_dataset_open with stderr captured into log[cap]. */
static hs_status_t open_capturing(const char *path, hs_dataset_t **ds, char *log, size_t cap)
{
    char cap_path[512];
    snprintf(cap_path, sizeof(cap_path), "%s/stderr.txt", g_dir);
    fflush(stderr);
    int saved = dup(2);
    FILE *f = fopen(cap_path, "w");
    ck_assert_ptr_nonnull(f);
    dup2(fileno(f), 2);
    hs_status_t st = hs_dataset_open(path, ds);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    fclose(f);
    uint8_t *text;
    size_t len = read_file(cap_path, &text);
    snprintf(log, cap, "%.*s", (int)len, (const char *)text);
    free(text);
    unlink(cap_path);
    return st;
}

static const char *GOOD_JSONL =
    "{\"input_ids\": [5, 6, 7], \"loss_mask\": [0, 1, 1]}\n"
    "\n"
    "   \n"
    "{\"input_ids\": [8], \"meta\": {\"source\": \"x\"}}\n"
    "{\"loss_mask\": [true, false], \"input_ids\": [2147483647, 0]}\r\n";

/* ---- dataset ---------------------------------------------------------------- */

START_TEST(jsonl_loads_ids_and_masks_and_skips_blank_lines)
{
    const char *p = path_in_dir("good.jsonl");
    write_file(p, GOOD_JSONL, strlen(GOOD_JSONL));
    hs_dataset_t *ds = NULL;
    ck_assert_int_eq(hs_dataset_open(p, &ds), HS_OK);
    ck_assert_int_eq(hs_dataset_format(ds), HS_DATASET_JSONL);
    ck_assert_uint_eq(hs_dataset_count(ds), 3);
    ck_assert_uint_eq(hs_dataset_total_tokens(ds), 6);
    ck_assert_uint_eq(hs_dataset_seq_len(ds, 0), 3);
    ck_assert_uint_eq(hs_dataset_seq_len(ds, 1), 1);
    ck_assert_uint_eq(hs_dataset_seq_len(ds, 2), 2);
    const int32_t *ids = hs_dataset_ids(ds, 0);
    const uint8_t *m = hs_dataset_mask(ds, 0);
    ck_assert_int_eq(ids[0], 5);
    ck_assert_int_eq(ids[2], 7);
    ck_assert_uint_eq(m[0], 0);
    ck_assert_uint_eq(m[1], 1);
    ck_assert_int_eq(hs_dataset_ids(ds, 1)[0], 8);
    ck_assert_uint_eq(hs_dataset_mask(ds, 1)[0], 1); /* default mask is all ones */
    ck_assert_int_eq(hs_dataset_ids(ds, 2)[0], 2147483647);
    ck_assert_uint_eq(hs_dataset_mask(ds, 2)[0], 1);
    ck_assert_uint_eq(hs_dataset_mask(ds, 2)[1], 0);

    /* same data from memory gives the same fingerprint */
    uint32_t lens[] = {3, 1, 2};
    int32_t all_ids[] = {5, 6, 7, 8, 2147483647, 0};
    uint8_t all_mask[] = {0, 1, 1, 1, 1, 0};
    hs_dataset_t *mem = NULL;
    ck_assert_int_eq(hs_dataset_from_arrays(3, lens, all_ids, all_mask, &mem), HS_OK);
    ck_assert_uint_eq(hs_dataset_fingerprint(mem), hs_dataset_fingerprint(ds));
    hs_dataset_close(mem);
    all_ids[3] = 9;
    ck_assert_int_eq(hs_dataset_from_arrays(3, lens, all_ids, all_mask, &mem), HS_OK);
    ck_assert_uint_ne(hs_dataset_fingerprint(mem), hs_dataset_fingerprint(ds));
    hs_dataset_close(mem);
    all_ids[3] = 8;
    all_mask[3] = 0;
    ck_assert_int_eq(hs_dataset_from_arrays(3, lens, all_ids, all_mask, &mem), HS_OK);
    ck_assert_uint_ne(hs_dataset_fingerprint(mem), hs_dataset_fingerprint(ds));
    hs_dataset_close(mem);
    hs_dataset_close(ds);
}
END_TEST

static const struct {
    const char *line;
    const char *expect; /* substring of the error message */
} BAD_LINES[] = {
    {"{\"loss_mask\": [1]}", "\"input_ids\" is missing"},
    {"{\"input_ids\": [1, 2, 3.5]}", "input_ids[2] is not an integer"},
    {"{\"input_ids\": [1, 2, 3, \"x\"]}", "input_ids[3] is not an integer"},
    {"{\"input_ids\": [-1]}", "input_ids[0] is not an integer"},
    {"{\"input_ids\": [2147483648]}", "input_ids[0] is not an integer"},
    {"{\"input_ids\": [1, null]}", "input_ids[1] is not an integer"},
    {"{\"input_ids\": [1,2,3,4,5,6,7], \"loss_mask\": [1,1,1,1,1]}",
     "loss_mask has 5 entries, input_ids has 7"},
    {"{\"input_ids\": [1, 2], \"loss_mask\": [1, 2]}", "loss_mask[1] is not 0 or 1"},
    {"{\"input_ids\": [1, 2], \"loss_mask\": 1}", "\"loss_mask\" is not an array"},
    {"{\"input_ids\": []}", "\"input_ids\" is empty"},
    {"{\"input_ids\": \"1 2 3\"}", "\"input_ids\" is not an array"},
    {"[1, 2, 3]", "not a JSON object"},
    {"{\"input_ids\": [1, 2]", "not valid JSON"},
    {"{\"input_ids\": [1]} {\"input_ids\": [2]}", "not valid JSON"},
    {"input_ids = [1, 2]", "not valid JSON"},
    /* near misses of the plain form the fast parser takes */
    {"{\"input_ids\": [1, 2,]}", "not valid JSON"},
    {"{\"input_ids\": [1 2]}", "not valid JSON"},
    {"{\"input_ids\": [1]}}", "not valid JSON"},
    {"{\"input_ids\": [1], }", "not valid JSON"},
    {"{\"input_ids\": [1], \"loss_mask\": [1,]}", "not valid JSON"},
    {"{\"input_ids\": [1], \"loss_mask\": [tru]}", "not valid JSON"},
};

START_TEST(jsonl_malformed_line_fails_the_load_naming_file_line_and_problem)
{
    const char *p = path_in_dir("bad.jsonl");
    char text[512], log[4096], want[600];
    snprintf(text, sizeof(text),
             "{\"input_ids\": [1]}\n\n{\"input_ids\": [2, 3]}\n%s\n"
             "{\"input_ids\": [4]}\n",
             BAD_LINES[_i].line);
    write_file(p, text, strlen(text));
    hs_dataset_t *ds = (hs_dataset_t *)0x1;
    hs_status_t st = open_capturing(p, &ds, log, sizeof(log));
    ck_assert_int_eq(st, HS_ERR_FORMAT);
    ck_assert_ptr_eq(ds, (hs_dataset_t *)0x1); /* untouched on failure */
    snprintf(want, sizeof(want), "%s:4: ", p);
    ck_assert_msg(strstr(log, want), "case %d: no '%s' in log: %s", _i, want, log);
    ck_assert_msg(strstr(log, BAD_LINES[_i].expect), "case %d: no '%s' in log: %s", _i,
                  BAD_LINES[_i].expect, log);
    ck_assert_msg(strstr(log, "fix or remove this line"), "case %d: no advice in: %s", _i, log);
}
END_TEST

START_TEST(missing_file_and_empty_file_are_errors)
{
    hs_dataset_t *ds = NULL;
    char log[2048];
    ck_assert_int_eq(open_capturing(path_in_dir("nope.jsonl"), &ds, log, sizeof(log)),
                     HS_ERR_NOT_FOUND);
    ck_assert_ptr_nonnull(strstr(log, "nope.jsonl"));
    const char *p = path_in_dir("empty.jsonl");
    write_file(p, "\n \n", 3);
    ck_assert_int_eq(open_capturing(p, &ds, log, sizeof(log)), HS_ERR_FORMAT);
    ck_assert_ptr_nonnull(strstr(log, "no sequences"));
    ck_assert_ptr_null(ds);
}
END_TEST

/* A random dataset as JSONL text; lens/ids/mask returned for checking. */
static hs_dataset_t *random_dataset(uint64_t seed, uint32_t n, uint32_t min_len, uint32_t max_len)
{
    uint32_t *lens = malloc(n * sizeof(uint32_t));
    uint64_t total = 0, rng = seed;
    for (uint32_t i = 0; i < n; i++) {
        lens[i] = min_len + (uint32_t)(hs_splitmix64(&rng) % (max_len - min_len + 1));
        total += lens[i];
    }
    int32_t *ids = malloc(total * sizeof(int32_t));
    uint8_t *mask = malloc(total);
    for (uint64_t t = 0; t < total; t++) {
        ids[t] = (int32_t)(hs_splitmix64(&rng) % 100000);
        mask[t] = (uint8_t)(hs_splitmix64(&rng) & 1);
    }
    hs_dataset_t *ds = NULL;
    ck_assert_int_eq(hs_dataset_from_arrays(n, lens, ids, mask, &ds), HS_OK);
    free(lens);
    free(ids);
    free(mask);
    return ds;
}

static void write_jsonl(const hs_dataset_t *ds, const char *path)
{
    FILE *f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    for (uint64_t i = 0; i < hs_dataset_count(ds); i++) {
        uint32_t len = hs_dataset_seq_len(ds, i);
        fputs("{\"input_ids\": [", f);
        for (uint32_t t = 0; t < len; t++)
            fprintf(f, t ? ", %d" : "%d", hs_dataset_ids(ds, i)[t]);
        fputs("], \"loss_mask\": [", f);
        for (uint32_t t = 0; t < len; t++)
            fprintf(f, t ? ", %u" : "%u", hs_dataset_mask(ds, i)[t]);
        fputs("]}\n", f);
    }
    fclose(f);
}

static void assert_same_dataset(const hs_dataset_t *a, const hs_dataset_t *b)
{
    ck_assert_uint_eq(hs_dataset_count(a), hs_dataset_count(b));
    ck_assert_uint_eq(hs_dataset_total_tokens(a), hs_dataset_total_tokens(b));
    for (uint64_t i = 0; i < hs_dataset_count(a); i++) {
        uint32_t len = hs_dataset_seq_len(a, i);
        ck_assert_uint_eq(len, hs_dataset_seq_len(b, i));
        ck_assert_mem_eq(hs_dataset_ids(a, i), hs_dataset_ids(b, i), len * sizeof(int32_t));
        ck_assert_mem_eq(hs_dataset_mask(a, i), hs_dataset_mask(b, i), len);
    }
    ck_assert_uint_eq(hs_dataset_fingerprint(a), hs_dataset_fingerprint(b));
}

static int count_dir_entries(void)
{
    DIR *d = opendir(g_dir);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        if (e->d_name[0] != '.') n++;
    closedir(d);
    return n;
}

START_TEST(hst_round_trip_equals_the_jsonl_it_came_from)
{
    hs_dataset_t *src = random_dataset(42, 300, 1, 700);
    const char *jp = path_in_dir("rt.jsonl"), *hp = path_in_dir("rt.data"); /* no .hst suffix */
    write_jsonl(src, jp);
    hs_dataset_t *js = NULL, *hst = NULL;
    ck_assert_int_eq(hs_dataset_open(jp, &js), HS_OK);
    assert_same_dataset(src, js);
    ck_assert_int_eq(hs_dataset_write_hst(js, hp), HS_OK);
    ck_assert_int_eq(count_dir_entries(), 2); /* the temporary file is gone */
    ck_assert_int_eq(hs_dataset_open(hp, &hst), HS_OK);
    ck_assert_int_eq(hs_dataset_format(hst), HS_DATASET_HST);
    assert_same_dataset(js, hst);
    struct stat sb;
    ck_assert_int_eq(stat(hp, &sb), 0);
    ck_assert_uint_eq((uint64_t)sb.st_size,
                      64 + 8 * (hs_dataset_count(js) + 1) + 5 * hs_dataset_total_tokens(js));
    /* .hst -> .hst is stable too */
    const char *hp2 = path_in_dir("rt2.hst");
    ck_assert_int_eq(hs_dataset_write_hst(hst, hp2), HS_OK);
    uint8_t *a, *b;
    size_t la = read_file(hp, &a), lb = read_file(hp2, &b);
    ck_assert_uint_eq(la, lb);
    ck_assert_mem_eq(a, b, la);
    free(a);
    free(b);
    hs_dataset_close(hst);
    hs_dataset_close(js);
    hs_dataset_close(src);
}
END_TEST

START_TEST(write_hst_into_a_missing_folder_fails_cleanly)
{
    hs_dataset_t *ds = random_dataset(1, 3, 1, 5);
    ck_assert_int_eq(hs_dataset_write_hst(ds, path_in_dir("no/such/dir.hst")), HS_ERR_IO);
    hs_dataset_close(ds);
}
END_TEST

/* Rewrites header CRC and body fingerprint so that only the intended damage remains. */
static void hst_reseal(uint8_t *buf, size_t len)
{
    uint64_t fp = XXH3_64bits(buf + 64, len - 64);
    memcpy(buf + 24, &fp, 8);
    uint32_t crc = hs_crc32c(0, buf, 60);
    memcpy(buf + 60, &crc, 4);
}

START_TEST(corrupt_or_truncated_hst_is_rejected_with_a_reason)
{
    hs_dataset_t *src = random_dataset(7, 20, 1, 50);
    const char *good = path_in_dir("good.hst"), *bad = path_in_dir("bad.hst");
    ck_assert_int_eq(hs_dataset_write_hst(src, good), HS_OK);
    uint8_t *orig;
    size_t len = read_file(good, &orig);
    uint8_t *buf = malloc(len);
    hs_dataset_t *ds = NULL;
    char log[4096];
    uint64_t n = hs_dataset_count(src);

    /* truncated by one byte, and to less than a header */
    write_file(bad, orig, len - 1);
    ck_assert_int_eq(open_capturing(bad, &ds, log, sizeof(log)), HS_ERR_FORMAT);
    ck_assert_msg(strstr(log, "truncated or corrupt"), "%s", log);
    write_file(bad, orig, 40);
    ck_assert_int_eq(open_capturing(bad, &ds, log, sizeof(log)), HS_ERR_FORMAT);
    ck_assert_msg(strstr(log, "truncated .hst file"), "%s", log);
    /* trailing garbage */
    memcpy(buf, orig, len);
    write_file(bad, orig, len);
    FILE *f = fopen(bad, "ab");
    fputc('x', f);
    fclose(f);
    ck_assert_int_eq(open_capturing(bad, &ds, log, sizeof(log)), HS_ERR_FORMAT);
    ck_assert_msg(strstr(log, "trailing bytes"), "%s", log);

    /* one flipped token: content checksum */
    memcpy(buf, orig, len);
    buf[64 + 8 * (n + 1) + 3] ^= 0x10;
    write_file(bad, buf, len);
    hs_status_t st = open_capturing(bad, &ds, log, sizeof(log));
    ck_assert_msg(st == HS_ERR_CHECKSUM && strstr(log, "checksum mismatch"), "%d %s", st, log);

    /* header field changed without fixing the CRC */
    memcpy(buf, orig, len);
    buf[8] ^= 1;
    write_file(bad, buf, len);
    ck_assert_int_eq(open_capturing(bad, &ds, log, sizeof(log)), HS_ERR_CHECKSUM);
    ck_assert_msg(strstr(log, "corrupt .hst header"), "%s", log);

    /* huge n with a valid CRC: sizes must not overflow */
    memcpy(buf, orig, len);
    uint64_t huge = UINT64_MAX / 4;
    memcpy(buf + 8, &huge, 8);
    hst_reseal(buf, len);
    write_file(bad, buf, len);
    ck_assert_int_eq(open_capturing(bad, &ds, log, sizeof(log)), HS_ERR_FORMAT);
    memcpy(buf + 16, &huge, 8);
    hst_reseal(buf, len);
    write_file(bad, buf, len);
    ck_assert_int_eq(open_capturing(bad, &ds, log, sizeof(log)), HS_ERR_FORMAT);

    /* offsets not monotone, with checksums made consistent */
    memcpy(buf, orig, len);
    uint64_t off;
    memcpy(&off, buf + 64 + 8 * 2, 8);
    off = 0;
    memcpy(buf + 64 + 8 * 2, &off, 8);
    hst_reseal(buf, len);
    write_file(bad, buf, len);
    ck_assert_int_eq(open_capturing(bad, &ds, log, sizeof(log)), HS_ERR_FORMAT);
    ck_assert_msg(strstr(log, "offsets"), "%s", log);
    /* offset beyond the token count */
    memcpy(buf, orig, len);
    off = hs_dataset_total_tokens(src) + 100;
    memcpy(buf + 64 + 8 * 5, &off, 8);
    hst_reseal(buf, len);
    write_file(bad, buf, len);
    ck_assert_int_eq(open_capturing(bad, &ds, log, sizeof(log)), HS_ERR_FORMAT);
    ck_assert_msg(strstr(log, "offsets"), "%s", log);

    /* a mask value of 7 with valid checksums */
    memcpy(buf, orig, len);
    buf[len - 1] = 7;
    hst_reseal(buf, len);
    write_file(bad, buf, len);
    ck_assert_int_eq(open_capturing(bad, &ds, log, sizeof(log)), HS_ERR_FORMAT);

    /* unknown version */
    memcpy(buf, orig, len);
    buf[4] = 9;
    hst_reseal(buf, len);
    write_file(bad, buf, len);
    ck_assert_int_eq(open_capturing(bad, &ds, log, sizeof(log)), HS_ERR_FORMAT);
    ck_assert_msg(strstr(log, "version 9"), "%s", log);

    /* bad magic: not an .hst, so read as JSONL, which fails on line 1 */
    memcpy(buf, orig, len);
    buf[0] = 'X';
    write_file(bad, buf, len);
    ck_assert_int_eq(open_capturing(bad, &ds, log, sizeof(log)), HS_ERR_FORMAT);
    char want[600];
    snprintf(want, sizeof(want), "%s:1:", bad);
    ck_assert_msg(strstr(log, want), "%s", log);

    ck_assert_ptr_null(ds);
    /* the original still loads */
    ck_assert_int_eq(hs_dataset_open(good, &ds), HS_OK);
    assert_same_dataset(src, ds);
    hs_dataset_close(ds);
    free(buf);
    free(orig);
    hs_dataset_close(src);
}
END_TEST

/* ---- planner ---------------------------------------------------------------- */

static hs_dataset_t *dataset_of_lengths(const uint32_t *lens, uint32_t n)
{
    uint64_t total = 0;
    for (uint32_t i = 0; i < n; i++)
        total += lens[i];
    int32_t *ids = malloc(total * sizeof(int32_t));
    for (uint64_t t = 0; t < total; t++)
        ids[t] = (int32_t)t;
    hs_dataset_t *ds = NULL;
    ck_assert_int_eq(hs_dataset_from_arrays(n, lens, ids, NULL, &ds), HS_OK);
    free(ids);
    return ds;
}

static void assert_same_packing(const hs_plan_t *a, const hs_plan_t *b)
{
    ck_assert_uint_eq(hs_plan_n_batches(a), hs_plan_n_batches(b));
    for (uint32_t i = 0; i < hs_plan_n_batches(a); i++) {
        hs_plan_batch_t x, y;
        ck_assert_int_eq(hs_plan_batch(a, i, &x), HS_OK);
        ck_assert_int_eq(hs_plan_batch(b, i, &y), HS_OK);
        ck_assert_uint_eq(x.n_seqs, y.n_seqs);
        ck_assert_uint_eq(x.n_tokens, y.n_tokens);
        ck_assert_mem_eq(x.sample_ids, y.sample_ids, x.n_seqs * sizeof(uint64_t));
        ck_assert_mem_eq(x.lengths, y.lengths, x.n_seqs * sizeof(uint32_t));
    }
}

START_TEST(packing_is_first_fit_decreasing)
{
    /* sorted: 6(id1) 5(id4) 4(id0) 3(id2) 2(id3) under budget 10:
     * 6 -> b0, 5 -> b1, 4 -> b0 (full), 3 -> b1, 2 -> b1 (full) */
    uint32_t lens[] = {4, 6, 3, 2, 5};
    hs_dataset_t *ds = dataset_of_lengths(lens, 5);
    hs_plan_config_t cfg = {.token_budget = 10};
    hs_plan_t *p = NULL;
    ck_assert_int_eq(hs_plan_build(ds, &cfg, &p), HS_OK);
    ck_assert_uint_eq(hs_plan_n_batches(p), 2);
    hs_plan_batch_t b;
    ck_assert_int_eq(hs_plan_batch(p, 0, &b), HS_OK);
    ck_assert_uint_eq(b.n_seqs, 2);
    ck_assert_uint_eq(b.n_tokens, 10);
    ck_assert_uint_eq(b.sample_ids[0], 1);
    ck_assert_uint_eq(b.sample_ids[1], 0);
    ck_assert_int_eq(hs_plan_batch(p, 1, &b), HS_OK);
    ck_assert_uint_eq(b.n_seqs, 3);
    ck_assert_uint_eq(b.sample_ids[0], 4);
    ck_assert_uint_eq(b.sample_ids[1], 2);
    ck_assert_uint_eq(b.sample_ids[2], 3);
    ck_assert_uint_eq(b.lengths[2], 2);
    ck_assert_int_eq(hs_plan_batch(p, 2, &b), HS_ERR_INVALID);
    hs_plan_stats_t s;
    hs_plan_stats(p, &s);
    ck_assert_uint_eq(s.n_batches, 2);
    ck_assert_uint_eq(s.tokens, 20);
    ck_assert_uint_eq(s.max_seq_len, 10);
    ck_assert(s.mean_fill_pct > 99.99 && s.mean_fill_pct < 100.01);
    hs_plan_destroy(p);
    hs_dataset_close(ds);
}
END_TEST

START_TEST(same_inputs_give_the_same_plan_and_hash)
{
    hs_dataset_t *a = random_dataset(5, 2000, 1, 3000), *b = random_dataset(5, 2000, 1, 3000);
    hs_plan_config_t cfg = {.token_budget = 8192, .max_seq_len = 2048, .seed = 11};
    hs_plan_t *p1 = NULL, *p2 = NULL;
    ck_assert_int_eq(hs_plan_build(a, &cfg, &p1), HS_OK);
    ck_assert_int_eq(hs_plan_build(b, &cfg, &p2), HS_OK);
    ck_assert_uint_eq(hs_plan_hash(p1), hs_plan_hash(p2));
    assert_same_packing(p1, p2);
    hs_plan_destroy(p2);

    /* the hash is its basis and the batch shapes: a consumer with the shapes
     * alone checks it, and one token moved between batches changes it */
    uint32_t n = hs_plan_n_batches(p1);
    uint32_t *ns = malloc(n * sizeof(uint32_t)), *nt = malloc(n * sizeof(uint32_t));
    for (uint32_t i = 0; i < n; i++) {
        hs_plan_batch_t pb;
        ck_assert_int_eq(hs_plan_batch(p1, i, &pb), HS_OK);
        ns[i] = pb.n_seqs;
        nt[i] = pb.n_tokens;
    }
    ck_assert_uint_eq(hs_plan_hash_of(hs_plan_basis(p1), n, ns, nt), hs_plan_hash(p1));
    ck_assert_uint_gt(n, 1);
    nt[0]--;
    nt[1]++;
    ck_assert_uint_ne(hs_plan_hash_of(hs_plan_basis(p1), n, ns, nt), hs_plan_hash(p1));
    free(ns);
    free(nt);

    /* every input that defines the plan changes its hash */
    hs_plan_config_t v[] = {
        {.token_budget = 8193, .max_seq_len = 2048, .seed = 11},
        {.token_budget = 8192, .max_seq_len = 2047, .seed = 11},
        {.token_budget = 8192, .max_seq_len = 2048, .seed = 11, .overflow = HS_OVERFLOW_DROP},
        {.token_budget = 8192, .max_seq_len = 2048, .seed = 12},
    };
    for (size_t i = 0; i < sizeof(v) / sizeof(v[0]); i++) {
        ck_assert_int_eq(hs_plan_build(a, &v[i], &p2), HS_OK);
        ck_assert_uint_ne(hs_plan_hash(p1), hs_plan_hash(p2));
        hs_plan_destroy(p2);
    }
    hs_dataset_t *c = random_dataset(6, 2000, 1, 3000);
    ck_assert_int_eq(hs_plan_build(c, &cfg, &p2), HS_OK);
    ck_assert_uint_ne(hs_plan_hash(p1), hs_plan_hash(p2));
    ck_assert_uint_eq(hs_plan_fingerprint(p2), hs_dataset_fingerprint(c));
    hs_plan_destroy(p2);
    hs_plan_destroy(p1);
    hs_dataset_close(a);
    hs_dataset_close(b);
    hs_dataset_close(c);
}
END_TEST

START_TEST(a_different_seed_changes_the_epoch_order_but_not_the_packing)
{
    hs_dataset_t *ds = random_dataset(9, 1000, 1, 1000);
    hs_plan_config_t c1 = {.token_budget = 4096, .seed = 1}, c2 = {.token_budget = 4096, .seed = 2};
    hs_plan_t *p1 = NULL, *p2 = NULL;
    ck_assert_int_eq(hs_plan_build(ds, &c1, &p1), HS_OK);
    ck_assert_int_eq(hs_plan_build(ds, &c2, &p2), HS_OK);
    assert_same_packing(p1, p2);
    uint32_t n = hs_plan_n_batches(p1);
    ck_assert_uint_gt(n, 20);
    uint32_t *o1 = malloc(n * 4), *o2 = malloc(n * 4), *ref = malloc(n * 4);
    uint8_t *seen = calloc(n, 1);
    hs_plan_epoch_order(p1, 0, o1);
    hs_plan_epoch_order(p2, 0, o2);
    ck_assert(memcmp(o1, o2, n * 4) != 0);
    hs_permutation(1, 0, n, ref); /* what the consumer computes */
    ck_assert_mem_eq(o1, ref, n * 4);
    hs_plan_epoch_order(p1, 1, o2); /* next epoch, another order */
    ck_assert(memcmp(o1, o2, n * 4) != 0);
    for (uint32_t i = 0; i < n; i++) {
        ck_assert_uint_lt(o2[i], n);
        ck_assert_uint_eq(seen[o2[i]]++, 0);
    }
    free(seen);
    free(ref);
    free(o1);
    free(o2);
    hs_plan_destroy(p1);
    hs_plan_destroy(p2);
    hs_dataset_close(ds);
}
END_TEST

START_TEST(random_plans_respect_the_budget_and_keep_every_sample_once)
{
    uint64_t rng = 1234;
    for (int round = 0; round < 60; round++) {
        uint32_t n = 1 + (uint32_t)(hs_splitmix64(&rng) % 700);
        uint32_t max_len = 1 + (uint32_t)(hs_splitmix64(&rng) % 5000);
        hs_dataset_t *ds = random_dataset(hs_splitmix64(&rng), n, 1, max_len);
        hs_plan_config_t cfg = {
            .token_budget = 1 + (uint32_t)(hs_splitmix64(&rng) % 6000),
            .overflow = (hs_splitmix64(&rng) & 1) ? HS_OVERFLOW_DROP : HS_OVERFLOW_TRUNCATE,
            .seed = round,
        };
        cfg.max_seq_len =
            (hs_splitmix64(&rng) & 1) ? 0 : 1 + (uint32_t)(hs_splitmix64(&rng) % cfg.token_budget);
        uint32_t limit = cfg.max_seq_len ? cfg.max_seq_len : cfg.token_budget;
        hs_plan_t *p = NULL;
        hs_status_t st = hs_plan_build(ds, &cfg, &p);
        uint64_t expect_kept = 0, expect_trunc = 0, expect_tokens = 0;
        for (uint64_t i = 0; i < n; i++) {
            uint32_t len = hs_dataset_seq_len(ds, i);
            if (len > limit && cfg.overflow == HS_OVERFLOW_DROP) continue;
            expect_kept++;
            expect_trunc += len > limit;
            expect_tokens += len > limit ? limit : len;
        }
        if (expect_kept == 0) {
            ck_assert_int_eq(st, HS_ERR_INVALID);
            hs_dataset_close(ds);
            continue;
        }
        ck_assert_int_eq(st, HS_OK);
        uint8_t *seen = calloc(n, 1);
        uint64_t kept = 0, tokens = 0;
        for (uint32_t b = 0; b < hs_plan_n_batches(p); b++) {
            hs_plan_batch_t pb;
            ck_assert_int_eq(hs_plan_batch(p, b, &pb), HS_OK);
            ck_assert_uint_ge(pb.n_seqs, 1);
            ck_assert_uint_le(pb.n_tokens, cfg.token_budget);
            uint64_t sum = 0;
            for (uint32_t j = 0; j < pb.n_seqs; j++) {
                uint64_t id = pb.sample_ids[j];
                ck_assert_uint_lt(id, n);
                ck_assert_uint_eq(seen[id]++, 0);
                uint32_t len = hs_dataset_seq_len(ds, id);
                ck_assert_uint_eq(pb.lengths[j], len > limit ? limit : len);
                if (j) ck_assert_uint_le(pb.lengths[j], pb.lengths[j - 1]); /* longest first */
                sum += pb.lengths[j];
            }
            ck_assert_uint_eq(sum, pb.n_tokens);
            kept += pb.n_seqs;
            tokens += sum;
        }
        ck_assert_uint_eq(kept, expect_kept);
        ck_assert_uint_eq(tokens, expect_tokens);
        hs_plan_stats_t s;
        hs_plan_stats(p, &s);
        ck_assert_uint_eq(s.n_kept, expect_kept);
        ck_assert_uint_eq(s.tokens, expect_tokens);
        ck_assert_uint_eq(s.n_truncated, cfg.overflow == HS_OVERFLOW_TRUNCATE ? expect_trunc : 0);
        ck_assert_uint_eq(s.n_dropped, n - expect_kept);
        ck_assert_uint_eq(s.tokens + s.tokens_dropped, hs_dataset_total_tokens(ds));
        /* first fit: a sequence went to a later batch only because it did not
         * fit any earlier one, so any two batches hold more than the budget */
        uint32_t min_before = UINT32_MAX;
        for (uint32_t b = 0; b < hs_plan_n_batches(p); b++) {
            hs_plan_batch_t pb;
            ck_assert_int_eq(hs_plan_batch(p, b, &pb), HS_OK);
            if (b) ck_assert_uint_gt((uint64_t)min_before + pb.n_tokens, cfg.token_budget);
            if (pb.n_tokens < min_before) min_before = pb.n_tokens;
        }
        free(seen);
        hs_plan_destroy(p);
        hs_dataset_close(ds);
    }
}
END_TEST

START_TEST(truncate_and_drop_are_counted)
{
    uint32_t lens[] = {10, 20, 30, 40, 50};
    hs_dataset_t *ds = dataset_of_lengths(lens, 5);
    hs_plan_config_t cfg = {.token_budget = 100, .max_seq_len = 25};
    hs_plan_t *p = NULL;
    hs_plan_stats_t s;
    ck_assert_int_eq(hs_plan_build(ds, &cfg, &p), HS_OK);
    hs_plan_stats(p, &s);
    ck_assert_uint_eq(s.n_samples, 5);
    ck_assert_uint_eq(s.n_kept, 5);
    ck_assert_uint_eq(s.n_truncated, 3);
    ck_assert_uint_eq(s.n_dropped, 0);
    ck_assert_uint_eq(s.tokens_dropped, 5 + 15 + 25);
    ck_assert_uint_eq(s.tokens, 10 + 20 + 25 * 3);
    hs_plan_destroy(p);

    cfg.overflow = HS_OVERFLOW_DROP;
    ck_assert_int_eq(hs_plan_build(ds, &cfg, &p), HS_OK);
    hs_plan_stats(p, &s);
    ck_assert_uint_eq(s.n_kept, 2);
    ck_assert_uint_eq(s.n_truncated, 0);
    ck_assert_uint_eq(s.n_dropped, 3);
    ck_assert_uint_eq(s.tokens_dropped, 30 + 40 + 50);
    ck_assert_uint_eq(s.tokens, 30);
    ck_assert_uint_eq(hs_plan_n_batches(p), 1);
    hs_plan_destroy(p);

    cfg.max_seq_len = 5; /* nothing left */
    p = (hs_plan_t *)0x1;
    ck_assert_int_eq(hs_plan_build(ds, &cfg, &p), HS_ERR_INVALID);
    ck_assert_ptr_eq(p, (hs_plan_t *)0x1);
    hs_dataset_close(ds);
}
END_TEST

START_TEST(bad_budgets_are_rejected)
{
    uint32_t lens[] = {3, 4};
    hs_dataset_t *ds = dataset_of_lengths(lens, 2);
    hs_plan_t *p = NULL;
    hs_plan_config_t cfg = {.token_budget = 100, .max_seq_len = 101};
    ck_assert_int_eq(hs_plan_build(ds, &cfg, &p), HS_ERR_INVALID);
    cfg = (hs_plan_config_t){.token_budget = 0};
    ck_assert_int_eq(hs_plan_build(ds, &cfg, &p), HS_ERR_INVALID);
    cfg = (hs_plan_config_t){.token_budget = (uint32_t)INT32_MAX + 1};
    ck_assert_int_eq(hs_plan_build(ds, &cfg, &p), HS_ERR_INVALID);
    cfg = (hs_plan_config_t){.token_budget = 4, .overflow = (hs_overflow_t)7};
    ck_assert_int_eq(hs_plan_build(ds, &cfg, &p), HS_ERR_INVALID);
    ck_assert_ptr_null(p);
    hs_overflow_t o;
    ck_assert_int_eq(hs_overflow_parse("DROP", &o), HS_OK);
    ck_assert_int_eq(o, HS_OVERFLOW_DROP);
    ck_assert_int_eq(hs_overflow_parse("cut", &o), HS_ERR_INVALID);
    hs_dataset_close(ds);
}
END_TEST

/* ---- filling batch regions ---------------------------------------------------- */

START_TEST(fill_batch_writes_cu_seqlens_ids_and_masks_of_the_plan)
{
    hs_dataset_t *ds = random_dataset(77, 400, 1, 900);
    hs_plan_config_t cfg = {.token_budget = 3001, .max_seq_len = 700, .seed = 3};
    hs_plan_t *p = NULL;
    ck_assert_int_eq(hs_plan_build(ds, &cfg, &p), HS_OK);
    hs_layout_t layout = {
        .hidden_size = 33, .dtype = HS_DTYPE_BF16, .n_layers = 2, .layers = {1, 5}};
    for (uint32_t id = 0; id < hs_plan_n_batches(p); id++) {
        hs_plan_batch_t b;
        ck_assert_int_eq(hs_plan_batch(p, id, &b), HS_OK);
        uint64_t bytes = hs_batch_bytes(b.n_seqs, b.n_tokens, &layout);
        void *region = hs_aligned_alloc(HS_BATCH_ALIGN, bytes);
        ck_assert_ptr_nonnull(region);
        memset(region, 0xAB, bytes);
        hs_batch_view_t v = hs_batch_view(region, b.n_seqs, b.n_tokens, &layout);
        ck_assert_int_eq(hs_plan_fill_batch(p, ds, id, &v), HS_OK);
        ck_assert_int_eq(v.cu_seqlens[0], 0);
        for (uint32_t j = 0; j < b.n_seqs; j++) {
            ck_assert_int_eq(v.cu_seqlens[j + 1] - v.cu_seqlens[j], (int32_t)b.lengths[j]);
            ck_assert_uint_eq(v.sample_ids[j], b.sample_ids[j]);
            ck_assert_mem_eq(v.input_ids + v.cu_seqlens[j], hs_dataset_ids(ds, b.sample_ids[j]),
                             b.lengths[j] * sizeof(int32_t));
            ck_assert_mem_eq(v.loss_mask + v.cu_seqlens[j], hs_dataset_mask(ds, b.sample_ids[j]),
                             b.lengths[j]);
        }
        ck_assert_int_eq(v.cu_seqlens[b.n_seqs], (int32_t)b.n_tokens);
        /* the filled region passes the consumer's checks */
        hs_batch_header_init(v.header, 0, id, b.n_seqs, b.n_tokens, &layout, hs_plan_hash(p));
        hs_batch_synth_fill(&v, &layout);
        hs_batch_seal(region, bytes);
        char why[256] = "";
        ck_assert_msg(hs_batch_verify(region, bytes, 0, id, b.n_seqs, b.n_tokens, &layout, why,
                                      sizeof(why)) == HS_OK,
                      "batch %u: %s", id, why);
        hs_aligned_free(region);
    }
    /* another dataset or a batch that does not exist */
    hs_dataset_t *other = random_dataset(78, 400, 1, 900);
    hs_plan_batch_t b;
    ck_assert_int_eq(hs_plan_batch(p, 0, &b), HS_OK);
    void *region = hs_aligned_alloc(HS_BATCH_ALIGN, hs_batch_bytes(b.n_seqs, b.n_tokens, &layout));
    hs_batch_view_t v = hs_batch_view(region, b.n_seqs, b.n_tokens, &layout);
    ck_assert_int_eq(hs_plan_fill_batch(p, other, 0, &v), HS_ERR_MISMATCH);
    ck_assert_int_eq(hs_plan_fill_batch(p, ds, hs_plan_n_batches(p), &v), HS_ERR_INVALID);
    hs_aligned_free(region);
    hs_dataset_close(other);
    hs_plan_destroy(p);
    hs_dataset_close(ds);
}
END_TEST

/* ---- streaming import and summary ---------------------------------------- */

static int g_saved_stderr = -1;

static void capture_begin(void)
{
    char cap_path[512];
    snprintf(cap_path, sizeof(cap_path), "%s/stderr.txt", g_dir);
    fflush(stderr);
    g_saved_stderr = dup(2);
    int fd = open(cap_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ck_assert_int_ge(fd, 0);
    dup2(fd, 2);
    close(fd);
}

static void capture_end(char *log, size_t cap)
{
    char cap_path[512];
    snprintf(cap_path, sizeof(cap_path), "%s/stderr.txt", g_dir);
    fflush(stderr);
    dup2(g_saved_stderr, 2);
    close(g_saved_stderr);
    uint8_t *text;
    size_t len = read_file(cap_path, &text);
    snprintf(log, cap, "%.*s", (int)len, (const char *)text);
    free(text);
    unlink(cap_path);
}

/* Lines in every form the JSONL reader accepts: the plain form of writers
 * (fast path) and others only the full parser takes (other keys, exponents,
 * spaces, escapes, booleans, a null mask, CRLF, blank lines, a BOM). */
static void write_varied_jsonl(const hs_dataset_t *ds, const char *path)
{
    FILE *f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    fputs("\xEF\xBB\xBF", f);
    for (uint64_t i = 0; i < hs_dataset_count(ds); i++) {
        uint32_t len = hs_dataset_seq_len(ds, i);
        const int32_t *ids = hs_dataset_ids(ds, i);
        const uint8_t *m = hs_dataset_mask(ds, i);
        bool ones = true;
        for (uint32_t t = 0; t < len; t++)
            ones &= m[t] == 1;
        int form = (int)(i % 6);
        if (form == 1) fputs("  \t\r\n\n", f); /* blank lines */
        fputs(form == 2 ? "{\"meta\": {\"src\": \"a\\\"b\"}, \"input_ids\": [" : "{\"input_ids\":[",
              f);
        for (uint32_t t = 0; t < len; t++) {
            if (form == 3 && ids[t] % 10 == 0 && ids[t] > 0)
                fprintf(f, t ? ", %de1" : "%de1", ids[t] / 10);
            else
                fprintf(f, t ? (form == 4 ? " , %d" : ",%d") : "%d", ids[t]);
        }
        if (form == 5 && ones) {
            fputs("], \"loss_mask\": null}\r\n", f);
            continue;
        }
        fputs("],\"loss_mask\":[", f);
        for (uint32_t t = 0; t < len; t++)
            fprintf(f, "%s%s", t ? "," : "",
                    form == 4 ? (m[t] ? "true" : "false") : (m[t] ? "1" : "0"));
        fputs(form == 5 ? "]}\r\n" : "]}\n", f);
    }
    fclose(f);
}

static void assert_same_summary(const hs_dataset_summary_t *a, const hs_dataset_summary_t *b)
{
    ck_assert_uint_eq(a->n, b->n);
    ck_assert_uint_eq(a->total, b->total);
    ck_assert_uint_eq(a->loss, b->loss);
    ck_assert_uint_eq(a->min_len, b->min_len);
    ck_assert_uint_eq(a->max_len, b->max_len);
    ck_assert_mem_eq(a->hist, b->hist, sizeof(a->hist));
    ck_assert_uint_eq(a->fingerprint, b->fingerprint);
}

START_TEST(streaming_import_writes_the_same_hst_as_loading_whole)
{
    hs_dataset_t *src = random_dataset(11, 500, 1, 900);
    const char *jp = path_in_dir("v.jsonl"), *whole = path_in_dir("whole.hst"),
               *streamed = path_in_dir("streamed.hst");
    write_varied_jsonl(src, jp);
    hs_dataset_t *js = NULL;
    ck_assert_int_eq(hs_dataset_open(jp, &js), HS_OK);
    assert_same_dataset(src, js);
    ck_assert_int_eq(hs_dataset_write_hst(js, whole), HS_OK);
    hs_dataset_summary_t s, info;
    ck_assert_int_eq(hs_dataset_import(jp, streamed, NULL, NULL, &s), HS_OK);
    ck_assert_int_eq(count_dir_entries(), 3); /* no temporary file left */
    uint8_t *a, *b;
    size_t la = read_file(whole, &a), lb = read_file(streamed, &b);
    ck_assert_uint_eq(la, lb);
    ck_assert_mem_eq(a, b, la);
    free(a);
    free(b);
    uint64_t loss = 0;
    uint32_t mn = UINT32_MAX, mx = 0;
    for (uint64_t i = 0; i < hs_dataset_count(js); i++) {
        uint32_t len = hs_dataset_seq_len(js, i);
        for (uint32_t t = 0; t < len; t++)
            loss += hs_dataset_mask(js, i)[t];
        mn = len < mn ? len : mn;
        mx = len > mx ? len : mx;
    }
    ck_assert_int_eq(s.format, HS_DATASET_JSONL);
    ck_assert_uint_eq(s.n, hs_dataset_count(js));
    ck_assert_uint_eq(s.total, hs_dataset_total_tokens(js));
    ck_assert_uint_eq(s.loss, loss);
    ck_assert_uint_eq(s.min_len, mn);
    ck_assert_uint_eq(s.max_len, mx);
    ck_assert_uint_eq(s.fingerprint, hs_dataset_fingerprint(js));
    /* the summary of the JSONL (streamed) and of the .hst agree */
    setenv("TMPDIR", g_dir, 1);
    ck_assert_int_eq(hs_dataset_summarize(jp, NULL, NULL, &info), HS_OK);
    ck_assert_int_eq(info.format, HS_DATASET_JSONL);
    assert_same_summary(&info, &s);
    ck_assert_int_eq(count_dir_entries(), 3);
    ck_assert_int_eq(hs_dataset_summarize(streamed, NULL, NULL, &info), HS_OK);
    ck_assert_int_eq(info.format, HS_DATASET_HST);
    assert_same_summary(&info, &s);
    /* and .hst -> .hst through import is the same file */
    const char *again = path_in_dir("again.hst");
    ck_assert_int_eq(hs_dataset_import(streamed, again, NULL, NULL, &info), HS_OK);
    la = read_file(streamed, &a);
    lb = read_file(again, &b);
    ck_assert_uint_eq(la, lb);
    ck_assert_mem_eq(a, b, la);
    free(a);
    free(b);
    hs_dataset_close(js);
    hs_dataset_close(src);
}
END_TEST

START_TEST(streaming_import_of_a_malformed_line_names_it_and_leaves_no_file)
{
    const char *p = path_in_dir("bad.jsonl"), *out = path_in_dir("out.hst");
    char text[512], log[4096], want[600];
    snprintf(text, sizeof(text),
             "{\"input_ids\": [1]}\n\n{\"input_ids\": [2, 3]}\n%s\n"
             "{\"input_ids\": [4]}\n",
             BAD_LINES[_i].line);
    write_file(p, text, strlen(text));
    hs_dataset_summary_t s = {.n = 77};
    capture_begin();
    hs_status_t st = hs_dataset_import(p, out, NULL, NULL, &s);
    capture_end(log, sizeof(log));
    ck_assert_int_eq(st, HS_ERR_FORMAT);
    ck_assert_uint_eq(s.n, 77); /* untouched on failure */
    snprintf(want, sizeof(want), "%s:4: ", p);
    ck_assert_msg(strstr(log, want), "case %d: no '%s' in log: %s", _i, want, log);
    ck_assert_msg(strstr(log, BAD_LINES[_i].expect), "case %d: no '%s' in log: %s", _i,
                  BAD_LINES[_i].expect, log);
    ck_assert_int_eq(count_dir_entries(), 1); /* only bad.jsonl: no output, no temporary */
}
END_TEST

/* input_ids or loss_mask given twice in one object: cJSON would take the
 * first, Python's json the last; the line is refused, naming it, by the
 * reader and by the streaming import alike (also when an escape spells the
 * key). */
static const char *const DUP_KEY_LINES[] = {
    "{\"input_ids\": [1, 2], \"input_ids\": [3, 4]}",
    "{\"input_ids\": [1, 2], \"loss_mask\": [0, 1], \"loss_mask\": [1, 1]}",
    "{\"input_ids\": [1, 2], \"loss_mask\": null, \"loss_mask\": [0, 0]}",
    "{\"input_ids\": [1], \"meta\": 1, \"input\\u005fids\": [7]}",
};

START_TEST(jsonl_key_given_twice_is_refused_naming_the_line)
{
    const char *p = path_in_dir("dup.jsonl"), *out = path_in_dir("dup.hst");
    char text[512], log[4096], want[600];
    snprintf(text, sizeof(text), "{\"input_ids\": [1]}\n%s\n{\"input_ids\": [4]}\n",
             DUP_KEY_LINES[_i]);
    write_file(p, text, strlen(text));
    snprintf(want, sizeof(want), "%s:2: ", p);
    const char *key =
        strstr(DUP_KEY_LINES[_i], "loss_mask\": [1") || strstr(DUP_KEY_LINES[_i], "loss_mask\": [0")
            ? "\"loss_mask\" appears 2 times"
            : "\"input_ids\" appears 2 times";
    hs_dataset_t *ds = NULL;
    ck_assert_int_eq(open_capturing(p, &ds, log, sizeof(log)), HS_ERR_FORMAT);
    ck_assert_ptr_null(ds);
    ck_assert_msg(strstr(log, want) && strstr(log, key), "case %d: %s", _i, log);
    capture_begin();
    hs_status_t st = hs_dataset_import(p, out, NULL, NULL, NULL);
    capture_end(log, sizeof(log));
    ck_assert_int_eq(st, HS_ERR_FORMAT);
    ck_assert_msg(strstr(log, want) && strstr(log, key), "case %d: %s", _i, log);
    ck_assert_int_eq(access(out, F_OK), -1);
}
END_TEST

START_TEST(import_refuses_to_write_onto_its_input)
{
    const char *p = path_in_dir("in.jsonl"), *link_path = path_in_dir("link.jsonl"),
               *sym = path_in_dir("sym.jsonl");
    write_file(p, GOOD_JSONL, strlen(GOOD_JSONL));
    ck_assert_int_eq(link(p, link_path), 0);
    ck_assert_int_eq(symlink(p, sym), 0);
    const char *outs[] = {p, link_path, sym};
    for (int k = 0; k < 3; k++) {
        char log[2048];
        capture_begin();
        hs_status_t st = hs_dataset_import(p, outs[k], NULL, NULL, NULL);
        capture_end(log, sizeof(log));
        ck_assert_int_eq(st, HS_ERR_INVALID);
        ck_assert_msg(strstr(log, "the output is the input"), "no reason in: %s", log);
    }
    /* an .hst input too */
    const char *h = path_in_dir("in.hst");
    ck_assert_int_eq(hs_dataset_import(p, h, NULL, NULL, NULL), HS_OK);
    capture_begin();
    hs_status_t st = hs_dataset_import(h, h, NULL, NULL, NULL);
    char log[2048];
    capture_end(log, sizeof(log));
    ck_assert_int_eq(st, HS_ERR_INVALID);
    uint8_t *text;
    size_t len = read_file(p, &text);
    ck_assert_uint_eq(len, strlen(GOOD_JSONL));
    ck_assert_mem_eq(text, GOOD_JSONL, len);
    free(text);
    ck_assert_int_eq(count_dir_entries(), 4);
}
END_TEST

static void count_progress(void *arg, const char *stage, uint64_t done, uint64_t total,
                           uint64_t seqs)
{
    (void)stage;
    (void)seqs;
    ck_assert_uint_le(done, total);
    (*(int *)arg)++;
}

START_TEST(import_reports_progress_until_the_whole_file_is_read)
{
    hs_dataset_t *src = random_dataset(5, 200, 1, 400);
    const char *jp = path_in_dir("p.jsonl");
    write_jsonl(src, jp);
    int calls = 0;
    hs_dataset_summary_t s;
    ck_assert_int_eq(hs_dataset_import(jp, path_in_dir("p.hst"), count_progress, &calls, &s),
                     HS_OK);
    ck_assert_int_ge(calls, 3); /* scan, parse, hash */
    hs_dataset_close(src);
}
END_TEST

/* A .hst file rewritten in place under an open dataset: its offsets
 * overwritten with values far past the file (_i = 0), or a larger .hst
 * copied over it (_i = 1). Filling batches must neither crash nor read
 * outside the file: every fill after the change fails with HS_ERR_IO and the
 * log names the file. */
START_TEST(hst_rewritten_in_place_fails_the_fill_naming_the_file_without_a_crash)
{
    hs_dataset_t *src = random_dataset(21, 400, 1, 900);
    const char *hp = path_in_dir("live.hst");
    ck_assert_int_eq(hs_dataset_write_hst(src, hp), HS_OK);
    hs_dataset_t *ds = NULL;
    ck_assert_int_eq(hs_dataset_open(hp, &ds), HS_OK);
    hs_plan_config_t cfg = {.token_budget = 3001, .max_seq_len = 700, .seed = 3};
    hs_plan_t *p = NULL;
    ck_assert_int_eq(hs_plan_build(ds, &cfg, &p), HS_OK);
    usleep(50 * 1000); /* past the file system's timestamp granularity */

    int fd = open(hp, _i == 0 ? O_WRONLY : O_WRONLY | O_TRUNC);
    ck_assert_int_ge(fd, 0);
    if (_i == 0) {
        uint64_t far[400];
        for (uint64_t k = 0; k < 400; k++)
            far[k] = ((uint64_t)1 << 44) + k * 4096;
        ck_assert_int_eq(pwrite(fd, far, sizeof(far), 64 + 8), (ssize_t)sizeof(far));
    } else {
        hs_dataset_t *big = random_dataset(22, 400, 4000, 8000);
        const char *bp = path_in_dir("big.hst");
        ck_assert_int_eq(hs_dataset_write_hst(big, bp), HS_OK);
        uint8_t *img;
        size_t len = read_file(bp, &img);
        ck_assert_int_eq(write(fd, img, len), (ssize_t)len);
        free(img);
        hs_dataset_close(big);
    }
    close(fd);

    capture_begin();
    hs_layout_t layout = {.hidden_size = 8, .dtype = HS_DTYPE_BF16, .n_layers = 1, .layers = {1}};
    uint32_t failed = 0;
    for (uint32_t id = 0; id < hs_plan_n_batches(p); id++) {
        hs_plan_batch_t b;
        ck_assert_int_eq(hs_plan_batch(p, id, &b), HS_OK);
        uint64_t bytes = hs_batch_bytes(b.n_seqs, b.n_tokens, &layout);
        void *region = hs_aligned_alloc(HS_BATCH_ALIGN, bytes);
        ck_assert_ptr_nonnull(region);
        hs_batch_view_t v = hs_batch_view(region, b.n_seqs, b.n_tokens, &layout);
        failed += hs_plan_fill_batch(p, ds, id, &v) == HS_ERR_IO;
        hs_aligned_free(region);
    }
    char log[4096];
    capture_end(log, sizeof(log));
    ck_assert_uint_eq(failed, hs_plan_n_batches(p));
    ck_assert_msg(strstr(log, hp) && strstr(log, "modified while in use"), "%s", log);
    hs_plan_destroy(p);
    hs_dataset_close(ds);
    hs_dataset_close(src);
}
END_TEST

/* The SIGBUS handler of a process embedding the library: counts the faults
 * it gets inside read_faults() and jumps back out of the faulting read. A
 * fault anywhere else (a .hst read the library should have caught) ends the
 * test process, which Check reports as a failure. */
static sigjmp_buf g_bus_jump;
static volatile sig_atomic_t g_bus_armed, g_bus_faults;

static void embedder_on_sigbus(int sig, siginfo_t *si, void *uc)
{
    (void)sig;
    (void)si;
    (void)uc;
    if (!g_bus_armed) _exit(3);
    g_bus_faults++;
    siglongjmp(g_bus_jump, 1);
}

/* Reads *p; true when that raised SIGBUS and embedder_on_sigbus took it. */
static bool read_faults(const volatile uint8_t *p)
{
    volatile bool faulted = false;
    g_bus_armed = 1;
    if (sigsetjmp(g_bus_jump, 1))
        faulted = true;
    else
        (void)*p;
    g_bus_armed = 0;
    return faulted;
}

static bool bus_handler_is(void (*fn)(int, siginfo_t *, void *))
{
    struct sigaction now;
    ck_assert_int_eq(sigaction(SIGBUS, NULL, &now), 0);
    return (now.sa_flags & SA_SIGINFO) && now.sa_sigaction == fn;
}

/* A process with a SIGBUS handler of its own opens a .hst, which is then
 * truncated under its mapping. While the dataset is open (also after a
 * second open of the file is closed), a fault in the process's own mapping
 * still reaches its handler, reads of the lost .hst pages do not, and
 * hs_dataset_check() reports the file; once the dataset is closed, the
 * process's handler is the one in place again. */
START_TEST(own_sigbus_handler_stays_and_a_truncated_hst_is_an_error_not_a_crash)
{
    struct sigaction mine, before;
    memset(&mine, 0, sizeof mine);
    mine.sa_sigaction = embedder_on_sigbus;
    mine.sa_flags = SA_SIGINFO;
    sigemptyset(&mine.sa_mask);
    ck_assert_int_eq(sigaction(SIGBUS, &mine, &before), 0);
    g_bus_faults = 0;

    /* the process's own mapping, its file cut to nothing: reads fault */
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    const char *own_path = path_in_dir("own.bin");
    uint8_t *zeros = calloc(1, 2 * page);
    write_file(own_path, zeros, 2 * page);
    free(zeros);
    int own_fd = open(own_path, O_RDWR);
    ck_assert_int_ge(own_fd, 0);
    uint8_t *own = mmap(NULL, 2 * page, PROT_READ, MAP_SHARED, own_fd, 0);
    ck_assert_ptr_ne(own, MAP_FAILED);
    ck_assert_int_eq(ftruncate(own_fd, 0), 0);

    hs_dataset_t *src = random_dataset(31, 200, 1, 900); /* some 400 KB: many pages */
    const char *hp = path_in_dir("guarded.hst");
    ck_assert_int_eq(hs_dataset_write_hst(src, hp), HS_OK);
    hs_dataset_t *ds = NULL;
    ck_assert_int_eq(hs_dataset_open(hp, &ds), HS_OK);
    ck_assert_int_eq(hs_dataset_check(ds), HS_OK);
    ck_assert(read_faults(own + page));
    ck_assert_int_eq(g_bus_faults, 1);
    hs_dataset_t *again = NULL; /* opened and closed: ds stays guarded */
    ck_assert_int_eq(hs_dataset_open(hp, &again), HS_OK);
    hs_dataset_close(again);

    ck_assert_int_eq(truncate(hp, 64), 0); /* the header alone */
    capture_begin();
    for (uint64_t i = 0; i < hs_dataset_count(ds); i++) {
        const volatile int32_t *ids = hs_dataset_ids(ds, i);
        for (uint32_t t = 0; t < hs_dataset_seq_len(ds, i); t++)
            (void)ids[t];
    }
    hs_status_t st = hs_dataset_check(ds);
    char log[4096];
    capture_end(log, sizeof(log));
    ck_assert_int_eq(st, HS_ERR_IO);
    ck_assert_msg(strstr(log, hp) && strstr(log, "truncated while in use"), "%s", log);
    ck_assert_int_eq(g_bus_faults, 1); /* the lost .hst pages were not the process's */
    ck_assert(read_faults(own + page));
    ck_assert_int_eq(g_bus_faults, 2);
    hs_dataset_close(ds);

    ck_assert(bus_handler_is(embedder_on_sigbus));
    ck_assert(read_faults(own + page));
    ck_assert_int_eq(g_bus_faults, 3);
    munmap(own, 2 * page);
    close(own_fd);
    hs_dataset_close(src);
    sigaction(SIGBUS, &before, NULL);
}
END_TEST

/* A stall that began before the recent window is added whole when it ends:
 * 1.5 windows of stall for one worker once read as 150% and the STATS
 * carrying it was refused by its own sender. */
START_TEST(a_stall_longer_than_the_window_is_a_share_of_at_most_100_percent)
{
    ck_assert_double_eq_tol(hs__report_share_pct(7.5, 5.0, 1), 100.0, 1e-9);
    ck_assert_double_eq_tol(hs__report_share_pct(7.5, 5.0, 3), 50.0, 1e-9);
    ck_assert_double_eq_tol(hs__report_share_pct(1.0, 4.0, 2), 12.5, 1e-9);
    ck_assert_double_eq(hs__report_share_pct(1.0, 0.0, 2), 0.0); /* empty window */
    ck_assert_double_eq(hs__report_share_pct(1.0, 4.0, 0), 0.0); /* no worker */
    ck_assert_double_eq(hs__report_share_pct(-0.5, 4.0, 1), 0.0);
}
END_TEST

START_TEST(to_takes_a_list_of_ranks_and_port_ranges_and_refuses_bad_ones)
{
    hs_producer_addrs_t a;
    ck_assert_int_eq(hs_producer_parse_to("drafter:7000", &a), HS_OK);
    ck_assert_uint_eq(a.n, 1);
    ck_assert_str_eq(a.host[0], "drafter");
    ck_assert_uint_eq(a.port[0], 7000);
    ck_assert_int_eq(hs_producer_parse_to("n1:7000-7003,n2:7000-7003,10.0.0.5:9000", &a), HS_OK);
    ck_assert_uint_eq(a.n, 9);
    ck_assert_str_eq(a.host[3], "n1");
    ck_assert_uint_eq(a.port[3], 7003);
    ck_assert_str_eq(a.host[4], "n2");
    ck_assert_uint_eq(a.port[4], 7000);
    ck_assert_str_eq(a.host[8], "10.0.0.5");
    ck_assert_int_eq(hs_producer_parse_to("n1:7000,n1:7000", &a), HS_ERR_INVALID);
    ck_assert_int_eq(hs_producer_parse_to("n1:7003-7000", &a), HS_ERR_INVALID);
    ck_assert_int_eq(hs_producer_parse_to("n1:7000,", &a), HS_OK); /* a trailing comma */
    ck_assert_int_eq(hs_producer_parse_to("n1:7000,,n2:7000", &a), HS_ERR_INVALID);
    ck_assert_int_eq(hs_producer_parse_to("n1", &a), HS_ERR_INVALID);
    ck_assert_int_eq(hs_producer_parse_to("n1:1-65535", &a), HS_ERR_INVALID); /* too many */
    ck_assert_int_eq(hs_producer_parse_to("", &a), HS_ERR_INVALID);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("producer");
    TCase *tc = tcase_create("dataset");
    tcase_add_checked_fixture(tc, dir_setup, dir_teardown);
    tcase_add_test(tc, jsonl_loads_ids_and_masks_and_skips_blank_lines);
    tcase_add_loop_test(tc, jsonl_malformed_line_fails_the_load_naming_file_line_and_problem, 0,
                        (int)(sizeof(BAD_LINES) / sizeof(BAD_LINES[0])));
    tcase_add_test(tc, missing_file_and_empty_file_are_errors);
    tcase_add_test(tc, hst_round_trip_equals_the_jsonl_it_came_from);
    tcase_add_test(tc, write_hst_into_a_missing_folder_fails_cleanly);
    tcase_add_test(tc, corrupt_or_truncated_hst_is_rejected_with_a_reason);
    tcase_add_test(tc, streaming_import_writes_the_same_hst_as_loading_whole);
    tcase_add_loop_test(tc, streaming_import_of_a_malformed_line_names_it_and_leaves_no_file, 0,
                        (int)(sizeof(BAD_LINES) / sizeof(BAD_LINES[0])));
    tcase_add_loop_test(tc, jsonl_key_given_twice_is_refused_naming_the_line, 0,
                        (int)(sizeof(DUP_KEY_LINES) / sizeof(DUP_KEY_LINES[0])));
    tcase_add_test(tc, import_refuses_to_write_onto_its_input);
    tcase_add_test(tc, import_reports_progress_until_the_whole_file_is_read);
    tcase_add_loop_test(tc, hst_rewritten_in_place_fails_the_fill_naming_the_file_without_a_crash,
                        0, 2);
    tcase_add_test(tc, own_sigbus_handler_stays_and_a_truncated_hst_is_an_error_not_a_crash);
    suite_add_tcase(s, tc);

    tc = tcase_create("plan");
    tcase_add_test(tc, packing_is_first_fit_decreasing);
    tcase_add_test(tc, same_inputs_give_the_same_plan_and_hash);
    tcase_add_test(tc, a_different_seed_changes_the_epoch_order_but_not_the_packing);
    tcase_add_test(tc, random_plans_respect_the_budget_and_keep_every_sample_once);
    tcase_add_test(tc, truncate_and_drop_are_counted);
    tcase_add_test(tc, bad_budgets_are_rejected);
    tcase_add_test(tc, fill_batch_writes_cu_seqlens_ids_and_masks_of_the_plan);
    tcase_add_test(tc, to_takes_a_list_of_ranks_and_port_ranges_and_refuses_bad_ones);
    tcase_add_test(tc, a_stall_longer_than_the_window_is_a_share_of_at_most_100_percent);
    suite_add_tcase(s, tc);

    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
