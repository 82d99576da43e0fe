/* SPDX-License-Identifier: Apache-2.0 */
/* test_model_fp8.c - FP8 checkpoints on the CPU: tiny models of the test
 * families block-quantised by make_fp8_checkpoint.py (numpy, the Hugging
 * Face layout: F8_E4M3 weights, <name>_scale_inv per 128x128 block,
 * quantization_config) next to their dequantised F32 twin. The CPU forward
 * of the FP8 checkpoint must give the twin's hidden states at every layer;
 * --dtype fp8 must quantise the bf16 model to the same bytes and factors;
 * --dtype bf16 must dequantise at load; malformed checkpoints are refused
 * naming the tensor or field (by hs-forward too). Also the activation quantiser's C twin
 * (per token, per group of 128). Skipped (exit 77) without python3 and
 * numpy. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "hs_float.h"
#include "fp8_block.h"
#include "hs_model.h"
#include "model_int.h"
#include "hs_shuffle.h"

#ifndef HS_TEST_DATA_DIR
#error "HS_TEST_DATA_DIR must point at tests/data"
#endif
#ifndef HS_FORWARD_BIN
#error "HS_FORWARD_BIN must name the hs-forward binary"
#endif
#ifndef HS_FP8_SCRIPT
#error "HS_FP8_SCRIPT must name tests/model/make_fp8_checkpoint.py"
#endif

/* llama3: H = 1000 (8 K-blocks, the last of 104), sharded source; qwen2:
 * q/k/v biases; qwen3: q/k norms; qwen3_5_i4: the hybrid (Gated DeltaNet
 * in_proj_qkv/z/out_proj in FP8, in_proj_a/b kept bf16, gated q_proj);
 * qwen3_5_vl: the VL wrapper's model.language_model.* names. */
static const char *families[] = {"llama3", "qwen2", "qwen3", "qwen3_5_i4", "qwen3_5_vl"};
#define N_FAMILIES ((int)(sizeof families / sizeof families[0]))

static char tmpdir[256];

static void make_checkpoint(const char *fam, const char *brk, char *fp8, char *deq, size_t cap)
{
    snprintf(fp8, cap, "%s/%s-%s-fp8", tmpdir, fam, brk[0] ? brk : "ok");
    snprintf(deq, cap, "%s/%s-%s-deq", tmpdir, fam, brk[0] ? brk : "ok");
    if (access(fp8, F_OK) == 0) return;
    char cmd[1400];
    snprintf(cmd, sizeof cmd, "python3 %s %s/%s %s %s%s%s", HS_FP8_SCRIPT, HS_TEST_DATA_DIR, fam,
             fp8, deq, brk[0] ? " --break " : "", brk);
    ck_assert_msg(system(cmd) == 0, "%s failed", cmd);
}

/* Every layer 0..N of two sequences (5 and 11 tokens) through the CPU
 * forward, fp32 out: [T, (N + 1) * H]. */
static float *forward_all(hs_model_t *m, int *T_out)
{
    const int N = hs_model_num_layers(m), H = hs_model_hidden_size(m), V = hs_model_vocab_size(m);
    int32_t ids[16], cu[3] = {0, 5, 16}, layers[64];
    for (int t = 0; t < 16; t++)
        ids[t] = (t * 37 + 11) % V;
    for (int l = 0; l <= N; l++)
        layers[l] = l;
    float *out = malloc((size_t)16 * (N + 1) * H * sizeof(float));
    ck_assert_ptr_nonnull(out);
    ck_assert_int_eq(hs_model_forward_cpu(m, ids, cu, 2, layers, N + 1, out, HS_MODEL_OUT_F32,
                                          (size_t)(N + 1) * H),
                     HS_OK);
    *T_out = 16;
    return out;
}

/* Layer by layer: |a - b| <= 1e-6 (1 + |b|); names the first layer off. */
static void compare_forwards(const char *what, hs_model_t *a, hs_model_t *b)
{
    int T;
    const int N = hs_model_num_layers(a), H = hs_model_hidden_size(a);
    float *x = forward_all(a, &T), *y = forward_all(b, &T);
    for (int l = 0; l <= N; l++) {
        double worst = 0;
        for (int t = 0; t < T; t++)
            for (int i = 0; i < H; i++) {
                size_t k = (size_t)t * (N + 1) * H + (size_t)l * H + i;
                double d = fabs((double)x[k] - y[k]) / (1.0 + fabs((double)y[k]));
                if (!(d <= worst)) worst = d;
            }
        ck_assert_msg(worst <= 1e-6, "%s: layer %d differs by %g (relative)", what, l, worst);
    }
    printf("%s: %d layers equal\n", what, N + 1);
    free(x);
    free(y);
}

START_TEST(fp8_checkpoint_forward_equals_its_dequantised_twin_at_every_layer)
{
    const char *fam = families[_i];
    char fp8[512], deq[512];
    make_checkpoint(fam, "", fp8, deq, sizeof fp8);
    hs_model_t *mf = NULL, *md = NULL;
    ck_assert_int_eq(hs_model_load(fp8, &mf), HS_OK);
    ck_assert_int_eq(hs_model_load(deq, &md), HS_OK);
    ck_assert(hs_model_config(mf)->fp8_checkpoint);
    ck_assert(!hs_model_config(md)->fp8_checkpoint);
    ck_assert_int_gt(hs_model_fp8_weights(mf), 0);
    ck_assert_int_eq(hs_model_fp8_weights(md), 0);
    compare_forwards(fam, mf, md);
    hs_model_destroy(mf);
    hs_model_destroy(md);
}
END_TEST

#define SAME_FP8(f)                                                                                \
    do {                                                                                           \
        const hs__fp8_weight_t *x = &a->fp8.f, *y = &b->fp8.f;                                     \
        ck_assert_msg(!x->w == !y->w, "layer %d " #f ": fp8 in one model only", l);                \
        if (!x->w) break;                                                                          \
        ck_assert(x->n == y->n && x->k == y->k);                                                   \
        ck_assert_msg(memcmp(x->w, y->w, (size_t)(x->n * x->k)) == 0, "layer %d " #f ": bytes",    \
                      l);                                                                          \
        ck_assert_msg(memcmp(x->scale_inv, y->scale_inv,                                           \
                             (size_t)(hs_fp8_blocks(x->n) * hs_fp8_blocks(x->k)) * 4) == 0,        \
                      "layer %d " #f ": block factors", l);                                        \
        n_same++;                                                                                  \
    } while (0)

START_TEST(dtype_fp8_quantises_a_bf16_model_to_the_checkpoint_bytes)
{
    const char *fam = families[_i];
    char fp8[512], deq[512], src[512];
    make_checkpoint(fam, "", fp8, deq, sizeof fp8);
    snprintf(src, sizeof src, "%s/%s", HS_TEST_DATA_DIR, fam);
    hs_model_t *mq = NULL, *mf = NULL;
    ck_assert_int_eq(hs_model_load_ex(src, HS_MODEL_WEIGHTS_FP8, &mq), HS_OK);
    ck_assert_int_eq(hs_model_load(fp8, &mf), HS_OK);
    ck_assert_int_eq(hs_model_fp8_weights(mq), hs_model_fp8_weights(mf));
    int n_same = 0;
    for (int l = 0; l < hs_model_num_layers(mq); l++) {
        const hs__layer_weights_t *a = &mq->layers[l], *b = &mf->layers[l];
        SAME_FP8(q_proj);
        SAME_FP8(k_proj);
        SAME_FP8(v_proj);
        SAME_FP8(o_proj);
        SAME_FP8(gate_proj);
        SAME_FP8(up_proj);
        SAME_FP8(down_proj);
        SAME_FP8(in_proj_qkv);
        SAME_FP8(in_proj_z);
        SAME_FP8(in_proj_b);
        SAME_FP8(in_proj_a);
        SAME_FP8(out_proj);
    }
    ck_assert_int_eq(n_same, hs_model_fp8_weights(mf));
    compare_forwards(fam, mq, mf);
    hs_model_destroy(mq);
    hs_model_destroy(mf);
}
END_TEST

START_TEST(dtype_bf16_dequantises_an_fp8_checkpoint_at_load)
{
    char fp8[512], deq[512];
    make_checkpoint("qwen3_5_i4", "", fp8, deq, sizeof fp8);
    hs_model_t *mb = NULL, *md = NULL;
    ck_assert_int_eq(hs_model_load_ex(fp8, HS_MODEL_WEIGHTS_BF16, &mb), HS_OK);
    ck_assert_int_eq(hs_model_load(deq, &md), HS_OK);
    ck_assert_int_eq(hs_model_fp8_weights(mb), 0);
    compare_forwards("qwen3_5_i4 --dtype bf16", mb, md);
    hs_model_destroy(mb);
    hs_model_destroy(md);
}
END_TEST

/* hs-forward on the model in dir (CPU, one token): its exit status, its
 * stderr into log[cap]. */
static int hs_forward_on(const char *dir, char *log, size_t cap)
{
    char data[300], out[300], err[300], cmd[1600];
    snprintf(data, sizeof data, "%s/one.jsonl", tmpdir);
    snprintf(out, sizeof out, "%s/hs.safetensors", tmpdir);
    snprintf(err, sizeof err, "%s/hs-forward.err", tmpdir);
    FILE *f = fopen(data, "w");
    ck_assert_ptr_nonnull(f);
    fputs("{\"input_ids\": [1]}\n", f);
    fclose(f);
    snprintf(cmd, sizeof cmd, "%s --model %s --data %s --layers 1 --out %s 2>%s", HS_FORWARD_BIN,
             dir, data, out, err);
    int st = system(cmd);
    f = fopen(err, "r");
    ck_assert_ptr_nonnull(f);
    log[fread(log, 1, cap - 1, f)] = 0;
    fclose(f);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

START_TEST(malformed_fp8_checkpoints_are_refused_naming_the_tensor_or_field)
{
    static const struct {
        const char *brk, *says1, *says2;
        hs_status_t rc;
    } cases[] = {
        {"scale_shape", "model.layers.0.self_attn.k_proj.weight_scale_inv", "shape", HS_ERR_FORMAT},
        {"no_scale", "model.layers.0.self_attn.k_proj.weight_scale_inv", "missing", HS_ERR_FORMAT},
        {"block_size", "weight_block_size", "[128, 128]", HS_ERR_UNSUPPORTED},
        {"quant_method", "quant_method", "'awq'", HS_ERR_UNSUPPORTED},
        {"no_config", "model.layers.0.self_attn.q_proj.weight", "quantization_config",
         HS_ERR_FORMAT},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char fp8[512], deq[512], log[4096];
        make_checkpoint("llama3", cases[i].brk, fp8, deq, sizeof fp8);
        hs_model_t *m = NULL;
        hs_status_t rc = hs_model_load(fp8, &m);
        ck_assert_ptr_null(m);
        ck_assert_msg(rc == cases[i].rc, "%s: status %d, want %d", cases[i].brk, rc, cases[i].rc);
        ck_assert_int_ne(hs_forward_on(fp8, log, sizeof log), 0);
        ck_assert_msg(strstr(log, cases[i].says1) && strstr(log, cases[i].says2),
                      "%s: the message does not name '%s' / '%s': %s", cases[i].brk, cases[i].says1,
                      cases[i].says2, log);
    }
}
END_TEST

/* hs-forward --plan on dir (layers up to 2, 64 tokens): its exit status, its
 * stdout and stderr into out[cap]. */
static int hs_forward_plan(const char *dir, char *out, size_t cap)
{
    char log[300], cmd[1200];
    snprintf(log, sizeof log, "%s/plan.out", tmpdir);
    snprintf(cmd, sizeof cmd, "%s --plan --model %s --layers 1,2 --token-budget 64 >%s 2>&1",
             HS_FORWARD_BIN, dir, log);
    int st = system(cmd);
    FILE *f = fopen(log, "r");
    ck_assert_ptr_nonnull(f);
    out[fread(out, 1, cap - 1, f)] = 0;
    fclose(f);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* The bytes of a plan line ("\n  weights   1.00 GiB (123 bytes)"). */
static uint64_t plan_line_bytes(const char *out, const char *key)
{
    char line[64];
    snprintf(line, sizeof line, "\n  %s ", key);
    const char *p = strstr(out, line);
    ck_assert_msg(p != NULL, "no '%s' line in: %s", key, out);
    p = strchr(p, '(');
    ck_assert_ptr_nonnull(p);
    return strtoull(p + 1, NULL, 10);
}

/* The CUDA forward's memory plan needs neither a GPU nor the weights' bytes:
 * hs-forward --plan prints the library's plan. llama3's Linears have
 * K = 1000, not a multiple of 128, so the forward runs them in bf16 (they
 * are dequantised at upload) and the FP8 checkpoint must plan as many
 * weight bytes as its bf16 twin, not fewer (test_forward_fp8_cuda's wide
 * model checks that FP8 Linears count one byte a value). A build without
 * CUDA says so. */
START_TEST(hs_forward_plan_prints_the_librarys_plan_and_counts_upload_dequantised_weights)
{
    char fp8[512], deq[512], out_f[4096], out_d[4096];
    make_checkpoint("llama3", "", fp8, deq, sizeof fp8);
    hs_model_t *m = NULL;
    ck_assert_int_eq(hs_model_load(fp8, &m), HS_OK);
    hs_model_cuda_plan_t p;
    hs_status_t st = hs_model_cuda_plan(m, 64, 64, 2, &p);
    int rc = hs_forward_plan(fp8, out_f, sizeof out_f);
    if (st == HS_ERR_UNSUPPORTED) {
        ck_assert_int_ne(rc, 0);
        ck_assert_msg(strstr(out_f, "no CUDA support"), "%s", out_f);
        hs_model_destroy(m);
        return;
    }
    ck_assert_int_eq(st, HS_OK);
    ck_assert_msg(rc == 0, "hs-forward --plan failed: %s", out_f);
    ck_assert_uint_eq(plan_line_bytes(out_f, "weights"), p.weights);
    ck_assert_uint_eq(plan_line_bytes(out_f, "activations"), p.activations);
    ck_assert_uint_eq(plan_line_bytes(out_f, "total"), p.weights + p.activations + p.workspace);
    ck_assert_int_eq(hs_forward_plan(deq, out_d, sizeof out_d), 0);
    uint64_t wf = plan_line_bytes(out_f, "weights"), wd = plan_line_bytes(out_d, "weights");
    printf("hs-forward --plan, llama3 to layer 2: weights bf16 %llu, fp8 %llu bytes\n",
           (unsigned long long)wd, (unsigned long long)wf);
    ck_assert_uint_eq(wf, wd);
    hs_model_destroy(m);
}
END_TEST

/* ---- the activation quantiser's C twin ----------------------------------- */

START_TEST(activation_groups_scale_by_amax_over_448_per_token_and_128_columns)
{
    enum { M = 3, K = 300, LDX = 304, LDQ = 320, G = 3 };
    static uint16_t x[M * LDX];
    static uint8_t q[M * LDQ];
    float s[G * 4]; /* hs_fp8_act_scale_count(3, 300) */
    uint64_t rng = 7;
    for (int i = 0; i < M * LDX; i++) {
        int64_t v = (int64_t)(hs_splitmix64(&rng) % 2001) - 1000;
        x[i] = hs_f32_to_bf16((float)v * 0.01f * (float)(1 + i % 7));
    }
    memset(x + LDX, 0, LDX * 2);              /* token 1: zeros */
    x[2 * LDX + 130] = 0x7fc0;                /* token 2, group 1: NaN */
    x[2 * LDX + 5] = hs_f32_to_bf16(-3.0e4f); /* token 2, group 0: a large amax */
    memset(q, 0xa5, sizeof q);
    hs_kn_fp8_quant_groups_ref(x, LDX, M, K, q, LDQ, s);
    for (int m = 0; m < M; m++) {
        for (int g = 0; g < G; g++) {
            float amax = 0;
            int k0 = g * 128, k1 = k0 + 128 < K ? k0 + 128 : K;
            for (int k = k0; k < k1; k++)
                amax = fmaxf(amax, fabsf(hs_bf16_to_f32(x[m * LDX + k])));
            float sc = s[hs_fp8_act_scale_index(g, m, M, G)];
            if (m == 2 && g == 1) {
                ck_assert(isnan(sc));
                for (int k = k0; k < k1; k++)
                    ck_assert_int_eq(q[m * LDQ + k], 0);
                continue;
            }
            ck_assert_float_eq(sc, amax > 0 ? amax / 448.0f : 1.0f);
            int top = 0;
            for (int k = k0; k < k1; k++) {
                uint8_t c = q[m * LDQ + k];
                ck_assert_msg((c & 0x7f) <= 0x7e, "NaN code at token %d col %d", m, k);
                top |= (c & 0x7f) == 0x7e;
                float v = hs_bf16_to_f32(x[m * LDX + k]), back = hs_fp8_to_f32(c) * sc;
                /* e4m3 keeps 3 mantissa bits: half an ulp is 1/16 relative,
                 * or 2^-10 * sc below the normal range */
                ck_assert_msg(fabsf(back - v) <= fabsf(v) / 16 + sc * 0x1p-9f,
                              "token %d col %d: %g back as %g", m, k, v, back);
            }
            ck_assert_int_eq(top, amax > 0); /* the amax lands on 448, saturated */
        }
        for (int k = K; k < LDQ; k++)
            ck_assert_int_eq(q[m * LDQ + k], 0xa5); /* beyond K: untouched */
    }
}
END_TEST

/* Values just under a rounding boundary of amax / 448 must not round past
 * 448 into the NaN code: every group of random magnitudes saturates at
 * 0x7e. */
START_TEST(activation_groups_never_produce_the_nan_code)
{
    enum { M = 257, K = 128 };
    static uint16_t x[M * K];
    static uint8_t q[M * K];
    static float s[M + 3]; /* hs_fp8_act_scale_count(257, 128) */
    uint64_t rng = 99;
    for (int i = 0; i < M * K; i++) {
        uint32_t mant = (uint32_t)(hs_splitmix64(&rng) & 0x7f), e = 100 + (uint32_t)(i / K % 50);
        x[i] = (uint16_t)((i & 1) << 15 | e << 7 | mant);
    }
    hs_kn_fp8_quant_groups_ref(x, K, M, K, q, K, s);
    for (int i = 0; i < M * K; i++)
        ck_assert_int_ne(q[i] & 0x7f, 0x7f);
}
END_TEST

static Suite *fp8_suite(void)
{
    Suite *s = suite_create("model_fp8");
    TCase *tc = tcase_create("fp8");
    tcase_set_timeout(tc, 300);
    tcase_add_loop_test(tc, fp8_checkpoint_forward_equals_its_dequantised_twin_at_every_layer, 0,
                        N_FAMILIES);
    tcase_add_loop_test(tc, dtype_fp8_quantises_a_bf16_model_to_the_checkpoint_bytes, 0,
                        N_FAMILIES);
    tcase_add_test(tc, dtype_bf16_dequantises_an_fp8_checkpoint_at_load);
    tcase_add_test(tc, malformed_fp8_checkpoints_are_refused_naming_the_tensor_or_field);
    tcase_add_test(tc,
                   hs_forward_plan_prints_the_librarys_plan_and_counts_upload_dequantised_weights);
    tcase_add_test(tc, activation_groups_scale_by_amax_over_448_per_token_and_128_columns);
    tcase_add_test(tc, activation_groups_never_produce_the_nan_code);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    if (system("python3 -c 'import numpy' >/dev/null 2>&1") != 0) {
        printf("test_model_fp8: python3 with numpy not found: skipped\n");
        return 77;
    }
    snprintf(tmpdir, sizeof tmpdir, "/tmp/hs_test_model_fp8_XXXXXX");
    if (!mkdtemp(tmpdir)) return 1;
    SRunner *sr = srunner_create(fp8_suite());
    srunner_set_fork_status(sr, CK_NOFORK);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmpdir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmpdir);
    return failed ? 1 : 0;
}
