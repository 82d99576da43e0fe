/* SPDX-License-Identifier: Apache-2.0 */
/* test_common.c - parsers, CRC-32C, the chunked payload checksum and output
 * files. */
#include <check.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "hsflow.h"
#include "hs_window.h"
#include "hs_checksum.h"
#include "hs_bytes.h"
#include "hs_outfile.h"
#include "hs_memclaim.h"
#include "hs_parse.h"

START_TEST(crc32c_matches_the_castagnoli_check_value)
{
    ck_assert_uint_eq(hs_crc32c(0, "123456789", 9), 0xe3069283u);
    /* incremental == one shot */
    uint32_t c = hs_crc32c(0, "1234", 4);
    ck_assert_uint_eq(hs_crc32c(c, "56789", 5), 0xe3069283u);
}
END_TEST

START_TEST(checksum64_is_the_combination_of_chunk_hashes)
{
    size_t len = 3 * HS_CHECKSUM_CHUNK + 12345;
    uint8_t *buf = malloc(len);
    for (size_t i = 0; i < len; i++)
        buf[i] = (uint8_t)(i * 2654435761u >> 13);
    uint64_t h[4];
    for (int i = 0; i < 4; i++) {
        size_t off = (size_t)i * HS_CHECKSUM_CHUNK;
        size_t l = len - off < HS_CHECKSUM_CHUNK ? len - off : HS_CHECKSUM_CHUNK;
        h[i] = hs_checksum64_chunk(buf + off, l);
    }
    uint64_t whole = hs_checksum64(buf, len);
    ck_assert_uint_eq(whole, hs_checksum64_combine(h, 4));
    buf[len / 2] ^= 1;
    ck_assert_uint_ne(whole, hs_checksum64(buf, len));
    free(buf);
}
END_TEST

START_TEST(checksum64_parallel_equals_the_one_thread_value_at_every_size_and_thread_count)
{
    const size_t C = HS_CHECKSUM_CHUNK;
    const size_t lens[] = {0, 1, C - 1, C, C + 1, 5 * C + 7, 70 * C - 1};
    uint8_t *buf = malloc(70 * C);
    for (size_t i = 0; i < 70 * C; i++)
        buf[i] = (uint8_t)(i * 2654435761u >> 11);
    const int threads[] = {-1, 0, 1, 2, 3, 8, 64};
    for (size_t a = 0; a < sizeof(lens) / sizeof(lens[0]); a++) {
        uint64_t want = hs_checksum64(buf, lens[a]);
        for (size_t b = 0; b < sizeof(threads) / sizeof(threads[0]); b++)
            ck_assert_msg(hs_checksum64_parallel(buf, lens[a], threads[b]) == want,
                          "len %zu, %d threads", lens[a], threads[b]);
    }
    uint64_t before = hs_checksum64_parallel(buf, 70 * C - 1, 4);
    buf[69 * C] ^= 1; /* a flipped bit in the last thread's share */
    ck_assert_uint_ne(hs_checksum64_parallel(buf, 70 * C - 1, 4), before);
    free(buf);
}
END_TEST

START_TEST(checksum64_handles_more_chunks_than_its_stack_buffer)
{
    size_t n = 70;
    size_t len = n * HS_CHECKSUM_CHUNK - 1;
    uint8_t *buf = calloc(1, len);
    uint64_t *h = malloc(n * sizeof(uint64_t));
    for (size_t i = 0; i < n; i++) {
        size_t off = i * HS_CHECKSUM_CHUNK;
        size_t l = len - off < HS_CHECKSUM_CHUNK ? len - off : HS_CHECKSUM_CHUNK;
        h[i] = hs_checksum64_chunk(buf + off, l);
    }
    ck_assert_uint_eq(hs_checksum64(buf, len), hs_checksum64_combine(h, n));
    free(h);
    free(buf);
}
END_TEST

START_TEST(checksum_stream_equals_one_shot_for_any_split)
{
    size_t len = 2 * HS_CHECKSUM_CHUNK + 777;
    uint8_t *buf = malloc(len);
    for (size_t i = 0; i < len; i++)
        buf[i] = (uint8_t)(i * 40503u >> 7);
    hs_checksum_stream_t *s = hs_checksum_stream_create();
    size_t splits[] = {1, 4096, 24576, HS_CHECKSUM_CHUNK, 3 * HS_CHECKSUM_CHUNK};
    for (size_t k = 0; k < sizeof(splits) / sizeof(splits[0]); k++) {
        hs_checksum_stream_reset(s);
        for (size_t off = 0; off < len; off += splits[k])
            hs_checksum_stream_update(s, buf + off, len - off < splits[k] ? len - off : splits[k]);
        ck_assert_uint_eq(hs_checksum_stream_final(s), hs_checksum64(buf, len));
    }
    hs_checksum_stream_reset(s);
    ck_assert_uint_eq(hs_checksum_stream_final(s), hs_checksum64(buf, 0));
    hs_checksum_stream_reset(s);
    hs_checksum_stream_update(s, buf, HS_CHECKSUM_CHUNK);
    ck_assert_uint_eq(hs_checksum_stream_final(s), hs_checksum64(buf, HS_CHECKSUM_CHUNK));
    hs_checksum_stream_destroy(s);
    free(buf);
}
END_TEST

START_TEST(parsers_accept_good_input_and_reject_bad)
{
    uint64_t v;
    ck_assert_int_eq(hs_parse_size("64G", &v), HS_OK);
    ck_assert_uint_eq(v, 64ull << 30);
    ck_assert_int_eq(hs_parse_size("3MiB", &v), HS_OK);
    ck_assert_uint_eq(v, 3ull << 20);
    ck_assert_int_eq(hs_parse_size("12", &v), HS_OK);
    ck_assert_uint_eq(v, 12);
    ck_assert_int_eq(hs_parse_size("-1", &v), HS_ERR_INVALID);
    ck_assert_int_eq(hs_parse_size("1X", &v), HS_ERR_INVALID);
    ck_assert_int_eq(hs_parse_size("", &v), HS_ERR_INVALID);
    ck_assert_int_eq(hs_parse_u64("12a", &v), HS_ERR_INVALID);

    int l[4], n;
    ck_assert_int_eq(hs_parse_int_list("1,9,17", l, 4, &n), HS_OK);
    ck_assert_int_eq(n, 3);
    ck_assert_int_eq(l[2], 17);
    ck_assert_int_eq(hs_parse_int_list("1,,2", l, 4, &n), HS_ERR_INVALID);
    ck_assert_int_eq(hs_parse_int_list("1,2,", l, 4, &n), HS_ERR_INVALID);
    ck_assert_int_eq(hs_parse_int_list("1,2,3,4,5", l, 4, &n), HS_ERR_INVALID);

    char host[64];
    uint16_t port;
    ck_assert_int_eq(hs_parse_hostport("127.0.0.1:7000", host, sizeof host, &port), HS_OK);
    ck_assert_str_eq(host, "127.0.0.1");
    ck_assert_uint_eq(port, 7000);
    ck_assert_int_eq(hs_parse_hostport("[::1]:80", host, sizeof host, &port), HS_OK);
    ck_assert_str_eq(host, "::1");
    ck_assert_int_eq(hs_parse_hostport("host:99999", host, sizeof host, &port), HS_ERR_INVALID);
    ck_assert_int_eq(hs_parse_hostport("host", host, sizeof host, &port), HS_ERR_INVALID);
}
END_TEST

/* A scratch folder with one input file "in" holding "input\n". */
static char *scratch_with_input(char *dir, size_t cap)
{
    snprintf(dir, cap, "/tmp/hs-outfile-XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(dir));
    char p[256];
    snprintf(p, sizeof p, "%s/in", dir);
    FILE *f = fopen(p, "w");
    ck_assert_ptr_nonnull(f);
    fputs("input\n", f);
    fclose(f);
    return dir;
}

static void read_back(const char *path, char *buf, size_t cap)
{
    FILE *f = fopen(path, "r");
    ck_assert_ptr_nonnull(f);
    size_t n = fread(buf, 1, cap - 1, f);
    buf[n] = 0;
    fclose(f);
}

static int files_in(const char *dir)
{
    int n = 0;
    DIR *d = opendir(dir);
    for (struct dirent *e; (e = readdir(d));)
        n += e->d_name[0] != '.';
    closedir(d);
    return n;
}

static void remove_scratch(const char *dir)
{
    DIR *d = opendir(dir);
    char p[512];
    for (struct dirent *e; (e = readdir(d));) {
        if (e->d_name[0] == '.') continue;
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        unlink(p);
    }
    closedir(d);
    rmdir(dir);
}

START_TEST(outfile_refuses_an_input_by_name_symlink_or_hard_link)
{
    char dir[64], in[128], sym[128], hard[128], other[128], buf[64];
    scratch_with_input(dir, sizeof dir);
    snprintf(in, sizeof in, "%s/in", dir);
    snprintf(sym, sizeof sym, "%s/sym", dir);
    snprintf(hard, sizeof hard, "%s/hard", dir);
    snprintf(other, sizeof other, "%s/./in", dir);
    ck_assert_int_eq(symlink("in", sym), 0);
    ck_assert_int_eq(link(in, hard), 0);
    const char *inputs[] = {NULL, in};
    hs_outfile_t *f = NULL;
    ck_assert_int_eq(hs_outfile_open(in, inputs, 2, &f), HS_ERR_INVALID);
    ck_assert_int_eq(hs_outfile_open(other, inputs, 2, &f), HS_ERR_INVALID);
    ck_assert_int_eq(hs_outfile_open(sym, inputs, 2, &f), HS_ERR_INVALID);
    ck_assert_int_eq(hs_outfile_open(hard, inputs, 2, &f), HS_ERR_INVALID);
    ck_assert_int_eq(hs_outfile_check(dir, NULL, 0), HS_ERR_INVALID); /* a folder */
    ck_assert_ptr_null(f);
    /* an input folder protects the files in it */
    const char *folder[] = {dir};
    ck_assert_int_eq(hs_outfile_check(in, folder, 1), HS_ERR_INVALID);
    read_back(in, buf, sizeof buf);
    ck_assert_str_eq(buf, "input\n");
    ck_assert_int_eq(files_in(dir), 3); /* in, sym, hard: nothing created */
    remove_scratch(dir);
}
END_TEST

START_TEST(outfile_appears_only_when_committed)
{
    char dir[64], in[128], out[128], buf[64];
    scratch_with_input(dir, sizeof dir);
    snprintf(in, sizeof in, "%s/in", dir);
    snprintf(out, sizeof out, "%s/out", dir);
    const char *inputs[] = {in};
    hs_outfile_t *f;
    ck_assert_int_eq(hs_outfile_open(out, inputs, 1, &f), HS_OK);
    fputs("half", hs_outfile_stream(f));
    fflush(hs_outfile_stream(f));
    ck_assert_int_eq(access(out, F_OK), -1); /* nothing at the name until commit */
    ck_assert_int_eq(files_in(dir), 2);
    ck_assert_int_eq(hs_outfile_commit(f), HS_OK);
    read_back(out, buf, sizeof buf);
    ck_assert_str_eq(buf, "half");
    ck_assert_int_eq(files_in(dir), 2);

    /* replacing: an aborted write leaves the old file and no temporary */
    ck_assert_int_eq(chmod(out, 0640), 0);
    ck_assert_int_eq(hs_outfile_open(out, inputs, 1, &f), HS_OK);
    fputs("discarded", hs_outfile_stream(f));
    hs_outfile_abort(f);
    hs_outfile_abort(NULL);
    read_back(out, buf, sizeof buf);
    ck_assert_str_eq(buf, "half");
    ck_assert_int_eq(files_in(dir), 2);
    ck_assert_int_eq(hs_outfile_open(out, inputs, 1, &f), HS_OK);
    fputs("whole", hs_outfile_stream(f));
    ck_assert_int_eq(hs_outfile_commit(f), HS_OK);
    read_back(out, buf, sizeof buf);
    ck_assert_str_eq(buf, "whole");
    struct stat sb;
    ck_assert_int_eq(stat(out, &sb), 0);
    ck_assert_uint_eq(sb.st_mode & 0777, 0640); /* the replaced file's mode is kept */
    remove_scratch(dir);

    /* a folder that does not exist: a clear error, nothing created */
    ck_assert_int_eq(hs_outfile_open("/nonexistent-hs-dir/out", NULL, 0, &f), HS_ERR_IO);
}
END_TEST

/* Writes `text` to root/rel, creating the folders on the way. */
static void put(const char *root, const char *rel, const char *text)
{
    char path[512], cmd[600];
    snprintf(path, sizeof path, "%s/%s", root, rel);
    snprintf(cmd, sizeof cmd, "mkdir -p \"$(dirname '%s')\"", path);
    ck_assert_int_eq(system(cmd), 0);
    FILE *f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    fputs(text, f);
    fclose(f);
}

static void remove_tree(const char *root)
{
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
    ck_assert_int_eq(system(cmd), 0);
}

START_TEST(mem_limits_take_the_tightest_cgroup_level_less_page_cache)
{
    char root[] = "/tmp/hs-sysmem-XXXXXX";
    ck_assert_ptr_nonnull(mkdtemp(root));
    hs_mem_limits_t m;
    const uint64_t GiB = 1ull << 30;

    /* no cgroup limit: MemAvailable alone */
    put(root, "proc/meminfo", "MemTotal:       33554432 kB\nMemAvailable:    8388608 kB\n");
    put(root, "proc/self/cgroup", "0::/\n");
    hs_mem_limits_at(root, &m);
    ck_assert_uint_eq(m.mem_available, 8 * GiB);
    ck_assert_uint_eq(m.cgroup_limit, 0);
    ck_assert_uint_eq(hs_mem_room(&m), 8 * GiB);

    /* v2: the job's own limit is loose, its parent's is the one that binds;
     * inactive page cache does not count as used */
    put(root, "proc/self/cgroup", "0::/jobs/job1\n");
    put(root, "sys/fs/cgroup/jobs/job1/memory.max", "17179869184\n"); /* 16 GiB */
    put(root, "sys/fs/cgroup/jobs/job1/memory.current", "1073741824\n");
    put(root, "sys/fs/cgroup/jobs/memory.max", "4294967296\n");     /* 4 GiB */
    put(root, "sys/fs/cgroup/jobs/memory.current", "3221225472\n"); /* 3 GiB */
    put(root, "sys/fs/cgroup/jobs/memory.stat", "anon 1073741824\ninactive_file 2147483648\n");
    put(root, "sys/fs/cgroup/memory.max", "max\n");
    hs_mem_limits_at(root, &m);
    ck_assert_uint_eq(m.cgroup_limit, 4 * GiB);
    ck_assert_uint_eq(m.cgroup_used, 1 * GiB);
    ck_assert_ptr_nonnull(strstr(m.cgroup_file, "sys/fs/cgroup/jobs/memory.max"));
    ck_assert_uint_eq(hs_mem_room(&m), 3 * GiB);

    /* v1: the memory hierarchy's line, and its "no limit" value skipped */
    remove_tree(root);
    ck_assert_ptr_nonnull(mkdtemp(strcpy(root, "/tmp/hs-sysmem-XXXXXX")));
    put(root, "proc/meminfo", "MemAvailable:    1048576 kB\n");
    put(root, "proc/self/cgroup", "5:cpu,cpuacct:/x\n4:memory:/slurm/job7\n0::/\n");
    put(root, "sys/fs/cgroup/memory/slurm/job7/memory.limit_in_bytes", "2147483648\n");
    put(root, "sys/fs/cgroup/memory/slurm/job7/memory.usage_in_bytes", "536870912\n");
    put(root, "sys/fs/cgroup/memory/memory.limit_in_bytes", "9223372036854771712\n");
    hs_mem_limits_at(root, &m);
    ck_assert_uint_eq(m.cgroup_limit, 2 * GiB);
    ck_assert_uint_eq(m.cgroup_used, GiB / 2);
    ck_assert_uint_eq(hs_mem_room(&m), 1 * GiB); /* MemAvailable is smaller here */

    /* nothing readable: unknown, no limit */
    remove_tree(root);
    hs_mem_limits_at(root, &m);
    ck_assert_uint_eq(m.mem_available, 0);
    ck_assert_uint_eq(hs_mem_room(&m), UINT64_MAX);
}
END_TEST

START_TEST(le_helpers_store_least_significant_byte_first_at_any_alignment)
{
    uint8_t buf[1 + 8 + 4 + 2];
    uint8_t *p = buf + 1; /* unaligned */
    hs_le64_store(p, 0x0102030405060708ull);
    hs_le32_store(p + 8, 0xa1b2c3d4u);
    hs_le16_store(p + 12, 0xbeefu);
    const uint8_t want[] = {8, 7, 6, 5, 4, 3, 2, 1, 0xd4, 0xc3, 0xb2, 0xa1, 0xef, 0xbe};
    ck_assert_mem_eq(p, want, sizeof want);
    ck_assert_uint_eq(hs_le64_load(p), 0x0102030405060708ull);
    ck_assert_uint_eq(hs_le32_load(p + 8), 0xa1b2c3d4u);
    ck_assert_uint_eq(hs_le16_load(p + 12), 0xbeefu);
    hs_le64_store(p, UINT64_MAX);
    ck_assert_uint_eq(hs_le64_load(p), UINT64_MAX);
    ck_assert_uint_eq(hs_le32_load(p + 4), UINT32_MAX);
}
END_TEST

/* A counter rising 10/s for 60 s, then 1/s: the window's rate is the
 * recent one (the last 30 s), not the run's average, and the window spans
 * from the first sample until 30 s have passed. */
START_TEST(window_gives_the_recent_rate_not_the_average)
{
    hs_window_t w = {0};
    hs_window_sample_t cur = {0}, base;
    ck_assert(!hs_window_take(&w, &cur, &base)); /* the first sample: nothing older */
    double v = 0;
    for (int t = 1; t <= 100; t++) {
        v += t <= 60 ? 10 : 1;
        cur.t = t;
        cur.v[0] = v;
        ck_assert(hs_window_take(&w, &cur, &base));
        double span = cur.t - base.t, rate = (cur.v[0] - base.v[0]) / span;
        if (t < 30) {
            ck_assert_double_eq(span, t); /* from the start */
            ck_assert_double_eq_tol(rate, 10, 1e-9);
        } else {
            ck_assert_double_eq(span, 30);
        }
        if (t >= 90) ck_assert_double_eq_tol(rate, 1, 1e-9); /* the average is ~6.6 */
    }
    ck_assert_uint_le(w.n, HS_WINDOW_SAMPLES);
    /* samples closer than HS_WINDOW_EVERY_S apart are not kept, and a read
     * at the same time as the newest sample still finds the baseline */
    uint32_t n = w.n;
    cur.t = 100.5;
    ck_assert(hs_window_take(&w, &cur, &base));
    ck_assert_uint_eq(w.n, n);
    ck_assert_double_eq(base.t, 70);
    /* reads far apart: the baseline is the oldest sample when none is a
     * whole window old */
    hs_window_t sparse = {0};
    hs_window_sample_t a = {.t = 0}, b = {.t = 45, .v = {90}}, c = {.t = 50, .v = {100}};
    (void)hs_window_take(&sparse, &a, &base);
    ck_assert(hs_window_take(&sparse, &b, &base) && base.t == 0);
    ck_assert(hs_window_take(&sparse, &c, &base) && base.t == 0);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("common");
    TCase *tc = tcase_create("all");
    tcase_add_test(tc, crc32c_matches_the_castagnoli_check_value);
    tcase_add_test(tc, window_gives_the_recent_rate_not_the_average);
    tcase_add_test(tc, le_helpers_store_least_significant_byte_first_at_any_alignment);
    tcase_add_test(tc, checksum64_is_the_combination_of_chunk_hashes);
    tcase_add_test(tc, checksum64_handles_more_chunks_than_its_stack_buffer);
    tcase_add_test(tc,
                   checksum64_parallel_equals_the_one_thread_value_at_every_size_and_thread_count);
    tcase_add_test(tc, checksum_stream_equals_one_shot_for_any_split);
    tcase_add_test(tc, parsers_accept_good_input_and_reject_bad);
    tcase_add_test(tc, outfile_refuses_an_input_by_name_symlink_or_hard_link);
    tcase_add_test(tc, outfile_appears_only_when_committed);
    tcase_add_test(tc, mem_limits_take_the_tightest_cgroup_level_less_page_cache);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
