/* SPDX-License-Identifier: Apache-2.0 */
/* test_preflight.c - the producer's preflight: the batch shapes a budget
 * produces, the search for the largest budget that fits, the headroom
 * setting and the forward's FLOP count (all without a GPU); with the
 * argument "gpu", the preflight itself on GPU 0 (exits 77 without one).
 *
 * GPU part, optional environment: HS_TEST_PREFLIGHT_MODEL (a model folder,
 * default tests/data/llama3), HS_TEST_PREFLIGHT_LAYERS (default 1,2),
 * HS_TEST_PREFLIGHT_BUDGET (default 65536). */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "hsflow.h"
#include "hs_parse.h"
#include "hs_model.h"
#include "hs_producer.h"
#include "preflight_int.h"

#ifndef HS_TEST_DATA_DIR
#define HS_TEST_DATA_DIR "tests/data"
#endif

/* ---- shapes ------------------------------------------------------------------- */

static int shapes_of(uint32_t budget, uint32_t max_seq, hs__preflight_shape_t *s)
{
    return hs__preflight_shapes(budget, max_seq, s, HS__PREFLIGHT_MAX_SHAPES);
}

static void expect_shapes(uint32_t budget, uint32_t max_seq, const uint32_t (*want)[2], int n)
{
    hs__preflight_shape_t s[HS__PREFLIGHT_MAX_SHAPES];
    int got = shapes_of(budget, max_seq, s);
    for (int i = 0; i < got; i++)
        printf("  B=%u M=%u: %ux%u\n", budget, max_seq, s[i].n_seqs, s[i].seq_len);
    ck_assert_int_eq(got, n);
    for (int i = 0; i < n; i++) {
        ck_assert_uint_eq(s[i].n_seqs, want[i][0]);
        ck_assert_uint_eq(s[i].seq_len, want[i][1]);
    }
}

START_TEST(shapes_at_64k_budget_and_8k_max_seq_are_the_five_planned)
{
    static const uint32_t want[][2] = {{1, 8192}, {8, 8192}, {16, 4096}, {32, 2048}, {64, 1024}};
    expect_shapes(65536, 8192, want, 5);
    /* max_seq_len 0 means min(budget, 8192): the same five */
    expect_shapes(65536, 0, want, 5);
}
END_TEST

START_TEST(shapes_drop_duplicates_and_lengths_below_128)
{
    /* B = M: 1 x M only once */
    static const uint32_t a[][2] = {{1, 4096}, {2, 2048}, {4, 1024}, {8, 512}};
    expect_shapes(4096, 0, a, 4);
    /* M/2 = 100 < 128: only L = M */
    static const uint32_t b[][2] = {{1, 200}, {5, 200}};
    expect_shapes(1000, 200, b, 2);
    /* an odd budget: whole sequences only, never over the budget */
    static const uint32_t c[][2] = {{1, 8192}, {2, 4096}, {4, 2048}, {9, 1024}};
    expect_shapes(10000, 0, c, 4);
    /* max_seq_len above the budget is clamped to it */
    static const uint32_t d[][2] = {{1, 3000}, {2, 1500}, {4, 750}, {8, 375}};
    expect_shapes(3000, 100000, d, 4);
}
END_TEST

START_TEST(shapes_of_any_budget_stay_within_it)
{
    static const uint32_t max_seqs[] = {0, 1, 127, 128, 129, 1000, 3001, 8192, 12345, 1u << 20};
    int checked = 0;
    for (uint32_t b = 1; b < 300000; b = b * 3 / 2 + 7) {
        for (size_t k = 0; k < sizeof(max_seqs) / sizeof(max_seqs[0]); k++) {
            hs__preflight_shape_t s[HS__PREFLIGHT_MAX_SHAPES];
            int n = shapes_of(b, max_seqs[k], s);
            uint32_t m = hs__preflight_max_seq(b, max_seqs[k]);
            ck_assert_int_ge(n, 1);
            ck_assert_uint_le(m, b);
            ck_assert_uint_eq(s[0].n_seqs, 1);
            ck_assert_uint_eq(s[0].seq_len, m);
            for (int i = 0; i < n; i++) {
                ck_assert_uint_ge(s[i].n_seqs, 1);
                ck_assert_uint_le((uint64_t)s[i].n_seqs * s[i].seq_len, b);
                ck_assert_uint_le(s[i].seq_len, m);
                ck_assert(s[i].seq_len == m || s[i].seq_len >= HS__PREFLIGHT_MIN_SEQ);
                /* (B / L) x L: fewer than L tokens of the budget left unused */
                if (i > 0) ck_assert_uint_lt(b - s[i].n_seqs * s[i].seq_len, s[i].seq_len);
                for (int j = 0; j < i; j++)
                    ck_assert(s[j].n_seqs != s[i].n_seqs || s[j].seq_len != s[i].seq_len);
            }
            checked++;
        }
    }
    ck_assert_int_gt(checked, 100);
    hs__preflight_shape_t s[1];
    ck_assert_int_eq(hs__preflight_shapes(0, 0, s, 1), 0);
}
END_TEST

/* ---- search --------------------------------------------------------------------- */

typedef struct {
    uint64_t base, per_token;
    int calls;
    hs_status_t fail;
} linear_t;

static hs_status_t linear_peak(void *ctx, uint32_t budget, uint64_t *out)
{
    linear_t *l = ctx;
    l->calls++;
    if (l->fail) return l->fail;
    *out = l->base + l->per_token * budget;
    return HS_OK;
}

START_TEST(search_finds_the_largest_multiple_of_1024_that_fits)
{
    static const uint64_t limits[] = {5000000, 123456789, 987654321, 2000000000};
    for (size_t k = 0; k < sizeof(limits) / sizeof(limits[0]); k++) {
        linear_t l = {.base = 1000000, .per_token = 1337};
        uint32_t got = 0;
        ck_assert_int_eq(hs__preflight_search(linear_peak, &l, limits[k], 0, &got), HS_OK);
        /* brute force */
        uint32_t want = 0;
        for (uint32_t b = 1024; b <= (1u << 20); b += 1024)
            if (l.base + l.per_token * b <= limits[k]) want = b;
        printf("  limit %llu: %u tokens (%d peak calls)\n", (unsigned long long)limits[k], got,
               l.calls);
        ck_assert_uint_eq(got, want);
        ck_assert_uint_eq(got % 1024, 0);
        ck_assert_int_le(l.calls, 12);
    }
}
END_TEST

START_TEST(search_stops_at_2_pow_20_and_refuses_when_nothing_fits)
{
    linear_t l = {.base = 10, .per_token = 1};
    uint32_t got = 7;
    ck_assert_int_eq(hs__preflight_search(linear_peak, &l, UINT64_MAX, 0, &got), HS_OK);
    ck_assert_uint_eq(got, 1u << 20);
    /* even 1024 tokens is too much: refused, output untouched */
    linear_t big = {.base = 1u << 30, .per_token = 1};
    got = 7;
    ck_assert_int_eq(hs__preflight_search(linear_peak, &big, 1u << 29, 0, &got), HS_ERR_NOSPACE);
    ck_assert_uint_eq(got, 7);
    ck_assert_int_eq(big.calls, 1);
    /* the peak's own error comes back as is */
    linear_t bad = {.fail = HS_ERR_UNSUPPORTED};
    ck_assert_int_eq(hs__preflight_search(linear_peak, &bad, UINT64_MAX, 0, &got),
                     HS_ERR_UNSUPPORTED);
    ck_assert_uint_eq(got, 7);
}
END_TEST

START_TEST(search_respects_the_max_sequence_length)
{
    /* a 5000-token sequence needs a budget of at least 5120 (5 x 1024) */
    linear_t l = {.base = 0, .per_token = 1};
    uint32_t got = 0;
    ck_assert_int_eq(hs__preflight_search(linear_peak, &l, 6000, 5000, &got), HS_OK);
    ck_assert_uint_eq(got, 5120);
    ck_assert_int_eq(hs__preflight_search(linear_peak, &l, 5119, 5000, &got), HS_ERR_NOSPACE);
    ck_assert_int_eq(hs__preflight_search(linear_peak, &l, UINT64_MAX, 2u << 20, &got),
                     HS_ERR_NOSPACE);
}
END_TEST

START_TEST(headroom_reads_a_fraction_or_percentage_and_rejects_nonsense)
{
    hs_producer_config_t cfg;
    hs_producer_config_default(&cfg);
    ck_assert_double_eq_tol(cfg.preflight_headroom, 0.10, 1e-12);
    double v = -1;
    ck_assert_int_eq(hs__preflight_headroom_parse("0.25", &v), HS_OK);
    ck_assert_double_eq_tol(v, 0.25, 1e-12);
    ck_assert_int_eq(hs__preflight_headroom_parse("20%", &v), HS_OK);
    ck_assert_double_eq_tol(v, 0.20, 1e-12);
    ck_assert_int_eq(hs__preflight_headroom_parse("0", &v), HS_OK);
    ck_assert_double_eq_tol(v, 0.0, 1e-12);
    static const char *bad[] = {"1", "1.5", "-0.1", "abc", "100%", "nan", "", "%"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        v = 0.5;
        ck_assert_int_eq(hs__preflight_headroom_parse(bad[i], &v), HS_ERR_INVALID);
        ck_assert_double_eq_tol(v, 0.5, 1e-12); /* untouched */
    }
}
END_TEST

/* ---- FLOPs ---------------------------------------------------------------------- */

START_TEST(forward_flops_match_a_hand_count)
{
    hs_model_config_t c = {0};
    c.hidden_size = 8;
    c.intermediate_size = 16;
    c.num_heads = 2;
    c.num_kv_heads = 1;
    c.head_dim = 4;
    const int32_t cu[] = {0, 3, 5};
    /* per layer: linear params 8*(8+4+4) + 8*8 + 3*8*16 = 576, times 2 * T(5) = 5760;
     * attention 4 * Hq(2) * d(4) = 32 per causal pair, pairs 3*4/2 + 2*3/2 = 9: 288 */
    ck_assert_double_eq_tol(hs_model_forward_flops(&c, 2, cu, 2), 2 * (5760.0 + 288.0), 1e-9);
    ck_assert_double_eq_tol(hs_model_forward_flops(&c, 0, cu, 2), 0.0, 1e-9);
    /* sliding window 2: the 3-token sequence sees 1 + 2 + 2 = 5 pairs, the other 3 */
    c.sliding_window = 2;
    ck_assert_double_eq_tol(hs_model_forward_flops(&c, 1, cu, 2), 5760.0 + 32.0 * 8, 1e-9);
}
END_TEST

/* ---- without a GPU ---------------------------------------------------------------- */

static const char *model_dir(void)
{
    static char p[512];
    const char *e = getenv("HS_TEST_PREFLIGHT_MODEL");
    if (e && *e) return e;
    snprintf(p, sizeof(p), "%s/llama3", HS_TEST_DATA_DIR);
    if (access(p, R_OK) == 0) return p;
    return "tests/data/llama3"; /* the tree copied elsewhere: run from its root */
}

static void config_for(hs_producer_config_t *cfg, uint32_t budget, const char *layers)
{
    hs_producer_config_default(cfg);
    cfg->token_budget = budget;
    cfg->max_seq_len = 0;
    cfg->source = HS_SOURCE_MODEL;
    cfg->model_dir = model_dir();
    cfg->n_workers = 1;
    cfg->gpu_ids[0] = 0;
    int l[HS_MAX_LAYERS], n = 0;
    ck_assert_int_eq(hs_parse_int_list(layers, l, HS_MAX_LAYERS, &n), HS_OK);
    cfg->layout.n_layers = (uint32_t)n;
    for (int i = 0; i < n; i++)
        cfg->layout.layers[i] = l[i];
    cfg->layout.hidden_size = 0;
    cfg->layout.dtype = HS_DTYPE_BF16;
}

/* --hs-dtype fp8: each of the worker's two slots also holds the e4m3 rows
 * and a scale per token; a plan without them let --token-budget auto pick
 * a budget 3 GiB short at 65,536 tokens of 5 x 5120-wide rows. */
START_TEST(worker_bytes_count_the_fp8_rows_and_scales_of_both_slots)
{
    const uint32_t B = 65536, k = 5, H = 5120;
    uint64_t bf16 = hs__preflight_worker_bytes(B, k, H, false);
    uint64_t fp8 = hs__preflight_worker_bytes(B, k, H, true);
    ck_assert_uint_eq(bf16, 2 * ((uint64_t)B * k * H * 2 + (uint64_t)B * 4 + (B + 1) * 4));
    ck_assert_uint_eq(fp8 - bf16, 2 * ((uint64_t)B * k * H + (uint64_t)B * 4 + sizeof(int)));
}
END_TEST

START_TEST(preflight_without_a_gpu_is_unsupported)
{
    int n_dev = 0;
    hs_status_t st = hs_model_cuda_device_count(&n_dev);
    if (st == HS_OK && n_dev > 0) return; /* the "gpu" run covers this machine */
    hs_producer_config_t cfg;
    config_for(&cfg, 65536, "1,2");
    uint32_t budget = 123;
    ck_assert_int_eq(hs_producer_preflight(&cfg, &budget), HS_ERR_UNSUPPORTED);
    ck_assert_uint_eq(budget, 123);
    cfg.token_budget = 0;
    ck_assert_int_eq(hs_producer_preflight(&cfg, &budget), HS_ERR_UNSUPPORTED);
    ck_assert_uint_eq(budget, 123);
}
END_TEST

/* The plan is host arithmetic: checked wherever CUDA is built, GPU or not. */
START_TEST(plan_grows_with_the_budget_and_shrinks_with_fewer_layers)
{
    hs_model_t *m = NULL;
    ck_assert_int_eq(hs_model_load(model_dir(), &m), HS_OK);
    uint64_t a = 0, b = 0, c = 0, few = 0;
    hs_status_t st = hs_model_cuda_plan_bytes(m, 4096, 4096, -1, &a);
    if (st == HS_ERR_UNSUPPORTED) { /* a build without CUDA */
        hs_model_destroy(m);
        return;
    }
    ck_assert_int_eq(st, HS_OK);
    ck_assert_int_eq(hs_model_cuda_plan_bytes(m, 8192, 8192, -1, &b), HS_OK);
    ck_assert_int_eq(hs_model_cuda_plan_bytes(m, 16384, 16384, -1, &c), HS_OK);
    ck_assert_uint_gt(b, a);
    /* linear in the budget, up to alignment */
    ck_assert_uint_le((c - b > 2 * (b - a) ? c - b - 2 * (b - a) : 2 * (b - a) - (c - b)), 4096);
    int N = hs_model_num_layers(m);
    ck_assert_int_eq(hs_model_cuda_plan_bytes(m, 4096, 4096, N - 1, &few), HS_OK);
    ck_assert_uint_lt(few, a);
    /* max_layer N and above mean all layers */
    uint64_t all = 0;
    ck_assert_int_eq(hs_model_cuda_plan_bytes(m, 4096, 4096, N + 5, &all), HS_OK);
    ck_assert_uint_eq(all, a);
    ck_assert_int_eq(hs_model_cuda_plan_bytes(m, 4096, 4097, -1, &all), HS_ERR_INVALID);
    hs_model_destroy(m);
}
END_TEST

/* A Qwen3.5 hybrid is planned by the CUDA forward (no device touched): the
 * plan holds its Gated DeltaNet buffers (g, beta, the delta rule's
 * workspace), so it grows with the budget faster than the residual alone,
 * and it shrinks with fewer layers to capture. */
START_TEST(cuda_plan_counts_a_qwen3_5_hybrids_buffers)
{
    char dir[512];
    snprintf(dir, sizeof dir, "%s/qwen3_5_i2", HS_TEST_DATA_DIR);
    if (access(dir, R_OK) != 0) snprintf(dir, sizeof dir, "tests/data/qwen3_5_i2");
    hs_model_t *m = NULL;
    ck_assert_int_eq(hs_model_load(dir, &m), HS_OK);
    uint64_t a = 0, b = 0, few = 0;
    hs_status_t st = hs_model_cuda_plan_bytes(m, 4096, 4096, -1, &a);
    if (st == HS_ERR_UNSUPPORTED) { /* a build without CUDA */
        hs_model_destroy(m);
        return;
    }
    ck_assert_int_eq(st, HS_OK);
    ck_assert_int_eq(hs_model_cuda_plan_bytes(m, 8192, 8192, -1, &b), HS_OK);
    /* per token at least the bf16 residual of H=32 and fp32 g, beta of 3
     * value heads */
    ck_assert_uint_ge(b - a, 4096u * (32 * 2 + 2 * 3 * 4));
    ck_assert_int_eq(hs_model_cuda_plan_bytes(m, 4096, 4096, 1, &few), HS_OK);
    ck_assert_uint_lt(few, a);
    hs_model_destroy(m);
}
END_TEST

/* ---- on a GPU ------------------------------------------------------------------- */

static uint32_t gpu_budget(void)
{
    const char *e = getenv("HS_TEST_PREFLIGHT_BUDGET");
    uint64_t v;
    if (e && hs_parse_size(e, &v) == HS_OK && v > 0 && v < (1u << 30)) return (uint32_t)v;
    return 65536;
}

static const char *gpu_layers(void)
{
    const char *e = getenv("HS_TEST_PREFLIGHT_LAYERS");
    return e && *e ? e : "1,2";
}

START_TEST(preflight_runs_the_table_at_a_fixed_budget)
{
    hs_producer_config_t cfg;
    config_for(&cfg, gpu_budget(), gpu_layers());
    uint32_t budget = 0;
    ck_assert_int_eq(hs_producer_preflight(&cfg, &budget), HS_OK);
    ck_assert_uint_eq(budget, gpu_budget());
}
END_TEST

START_TEST(preflight_auto_picks_the_largest_budget_that_fits)
{
    hs_producer_config_t cfg;
    config_for(&cfg, 0, gpu_layers());
    /* the chosen budget can be large: short sequences and one timed run keep the table quick */
    cfg.max_seq_len = 1024;
    cfg.preflight_iters = 1;
    uint32_t budget = 0;
    hs_status_t st = hs_producer_preflight(&cfg, &budget);
    ck_assert_int_eq(st, HS_OK);
    ck_assert_uint_eq(budget % 1024, 0);
    ck_assert_uint_ge(budget, 1024);
    ck_assert_uint_le(budget, 1u << 20);
    /* check it against the plan: it fits with 10% headroom, 1024 more does not */
    hs_model_t *m = NULL;
    ck_assert_int_eq(hs_model_load(cfg.model_dir, &m), HS_OK);
    uint64_t total = 0, free_b = 0;
    ck_assert_int_eq(hs_model_cuda_device_info(0, NULL, 0, &total, &free_b), HS_OK);
    const double limit = total * (1.0 - HS__PREFLIGHT_HEADROOM);
    const int k = (int)cfg.layout.n_layers, top = cfg.layout.layers[k - 1];
    const int H = hs_model_hidden_size(m);
    uint64_t plan = 0;
    ck_assert_int_eq(hs_model_cuda_plan_bytes(m, budget, budget, top, &plan), HS_OK);
    ck_assert_double_le(plan + 2.0 * hs_model_cuda_batch_bytes(budget, budget, k, H), limit);
    if (budget < (1u << 20)) {
        uint32_t more = budget + 1024;
        ck_assert_int_eq(hs_model_cuda_plan_bytes(m, more, more, top, &plan), HS_OK);
        ck_assert_double_gt(plan + 2.0 * hs_model_cuda_batch_bytes(more, more, k, H), limit);
    }
    hs_model_destroy(m);
}
END_TEST

START_TEST(preflight_refuses_a_budget_that_leaves_too_little_headroom)
{
    hs_producer_config_t cfg;
    config_for(&cfg, gpu_budget(), gpu_layers());
    /* keep 99.9% free: nothing real fits in the remaining 0.1% */
    cfg.preflight_headroom = 0.999;
    uint32_t budget = 77;
    hs_status_t st = hs_producer_preflight(&cfg, &budget);
    ck_assert_int_eq(st, HS_ERR_NOSPACE);
    ck_assert_uint_eq(budget, 77);
    cfg.token_budget = 0; /* auto finds nothing either */
    ck_assert_int_eq(hs_producer_preflight(&cfg, &budget), HS_ERR_NOSPACE);
    ck_assert_uint_eq(budget, 77);
}
END_TEST

START_TEST(preflight_refuses_a_gpu_id_that_does_not_exist)
{
    int n_dev = 0;
    ck_assert_int_eq(hs_model_cuda_device_count(&n_dev), HS_OK);
    hs_producer_config_t cfg;
    config_for(&cfg, 4096, gpu_layers());
    cfg.gpu_ids[0] = n_dev;
    uint32_t budget = 0;
    ck_assert_int_eq(hs_producer_preflight(&cfg, &budget), HS_ERR_INVALID);
}
END_TEST

int main(int argc, char **argv)
{
    const bool gpu = argc > 1 && !strcmp(argv[1], "gpu");
    if (gpu) {
        int n_dev = 0;
        if (hs_model_cuda_device_count(&n_dev) != HS_OK || n_dev == 0) {
            printf("no GPU (or a build without CUDA): skipped\n");
            return 77;
        }
    }
    Suite *s = suite_create("preflight");
    TCase *tc = tcase_create(gpu ? "gpu" : "host");
    tcase_set_timeout(tc, gpu ? 600 : 60);
    if (gpu) {
        tcase_add_test(tc, preflight_runs_the_table_at_a_fixed_budget);
        tcase_add_test(tc, preflight_auto_picks_the_largest_budget_that_fits);
        tcase_add_test(tc, preflight_refuses_a_budget_that_leaves_too_little_headroom);
        tcase_add_test(tc, preflight_refuses_a_gpu_id_that_does_not_exist);
    } else {
        tcase_add_test(tc, shapes_at_64k_budget_and_8k_max_seq_are_the_five_planned);
        tcase_add_test(tc, shapes_drop_duplicates_and_lengths_below_128);
        tcase_add_test(tc, shapes_of_any_budget_stay_within_it);
        tcase_add_test(tc, search_finds_the_largest_multiple_of_1024_that_fits);
        tcase_add_test(tc, search_stops_at_2_pow_20_and_refuses_when_nothing_fits);
        tcase_add_test(tc, search_respects_the_max_sequence_length);
        tcase_add_test(tc, headroom_reads_a_fraction_or_percentage_and_rejects_nonsense);
        tcase_add_test(tc, forward_flops_match_a_hand_count);
        tcase_add_test(tc, preflight_without_a_gpu_is_unsupported);
        tcase_add_test(tc, worker_bytes_count_the_fp8_rows_and_scales_of_both_slots);
        tcase_add_test(tc, plan_grows_with_the_budget_and_shrinks_with_fewer_layers);
        tcase_add_test(tc, cuda_plan_counts_a_qwen3_5_hybrids_buffers);
    }
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    /* the GPU part shares one CUDA context across its tests */
    if (gpu) srunner_set_fork_status(sr, CK_NOFORK);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
