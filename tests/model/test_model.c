/* SPDX-License-Identifier: Apache-2.0 */
/* test_model.c - the built-in forward's CPU side: golden hidden states from
 * transformers for every family (layer by layer; the Qwen3.5 hybrid and its
 * VL wrapper too), config.json and safetensors error handling, closed-form
 * checks of each kernel's C twin, DFlash's default layers, and hs-forward
 * end to end. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "attention.h"
#include "hs_float.h"
#include "common/alloc_count.h"
#include "conv1d.h"
#include "delta_rule.h"
#include "embedding.h"
#include "gdn_gates.h"
#include "hs_model.h"
#include "matmul.h"
#include "model_int.h"
#include "residual.h"
#include "rmsnorm.h"
#include "rmsnorm_gated.h"
#include "rope.h"
#include "safetensors_int.h"
#include "sigmoid_gate.h"
#include "swiglu.h"
#include "hs_shuffle.h"
#include "hs_bytes.h"

#ifndef HS_TEST_DATA_DIR
#error "HS_TEST_DATA_DIR must point at tests/data"
#endif

/* Bound for CPU forward vs transformers (both fp32 on the same bf16
 * weights): |got - want| <= GOLD_ATOL + GOLD_RTOL * |want|. The errors seen
 * are ~1e-6 (summation order); a real bug (wrong rope band, missing bias,
 * off-by-one window, wrong GQA head) moves values by 1e-2 or more. */
#define GOLD_ATOL 2e-5
#define GOLD_RTOL 2e-5

/* qwen3_5_i4: hybrid, full attention every 4th layer, head_dim 64, as many
 * value as key heads, sequences of 1, 23, 64, 65 and 290 tokens, A_log and
 * dt_bias in F32; qwen3_5_i2: every 2nd layer, head_dim 256, 3 value heads
 * per key head, 64 / 1 / 70 / 9 tokens; qwen3_5_vl: the vision-language
 * wrapper with a vision tower and mtp.* tensors the loader skips. */
static const char *families[] = {"llama3",     "qwen2",      "qwen3",     "mistral",
                                 "qwen3_5_i4", "qwen3_5_i2", "qwen3_5_vl"};
#define N_FAMILIES ((int)(sizeof families / sizeof families[0]))

static char tmpdir[256];
static double worst_margin; /* largest error / bound seen by compare_layer */

static void make_tmpdir(void)
{
    snprintf(tmpdir, sizeof tmpdir, "/tmp/hs_test_model_XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(tmpdir));
}

static void remove_tmpdir(void)
{
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    ck_assert_int_eq(system(cmd), 0);
}

static void family_dir(const char *fam, char *buf, size_t cap)
{
    snprintf(buf, cap, "%s/%s", HS_TEST_DATA_DIR, fam);
}

typedef struct {
    hs__st_set_t *st;
    const int32_t *ids, *cu;
    int n_seqs, T;
} golden_t;

static void golden_open(const char *fam, golden_t *g)
{
    char p[512];
    snprintf(p, sizeof p, "%s/%s/golden.safetensors", HS_TEST_DATA_DIR, fam);
    ck_assert_int_eq(hs__st_open_file(p, &g->st), HS_OK);
    ck_assert_str_eq(hs__st_metadata(g->st, "format"), "hsflow-golden");
    ck_assert_str_eq(hs__st_metadata(g->st, "version"), "1");
    const hs__st_tensor_t *ids = hs__st_find(g->st, "input_ids");
    const hs__st_tensor_t *cu = hs__st_find(g->st, "cu_seqlens");
    ck_assert_ptr_nonnull(ids);
    ck_assert_ptr_nonnull(cu);
    g->ids = ids->data;
    g->cu = cu->data;
    g->n_seqs = (int)cu->shape[0] - 1;
    g->T = (int)ids->shape[0];
    ck_assert_int_eq(g->cu[g->n_seqs], g->T);
}

/* Compares got [T, stride] column slice col against golden layer idx;
 * returns the max abs error, fails naming family and layer. */
static double compare_layer(const char *fam, const golden_t *g, int idx, const float *got,
                            size_t stride, int H)
{
    char name[64];
    snprintf(name, sizeof name, "hidden_states.%d", idx);
    const hs__st_tensor_t *t = hs__st_find(g->st, name);
    ck_assert_msg(t != NULL, "%s: golden has no %s", fam, name);
    ck_assert_int_eq(t->shape[0], g->T);
    ck_assert_int_eq(t->shape[1], H);
    const float *want = t->data;
    double maxerr = 0, margin = 0;
    int bad = -1;
    for (int r = 0; r < g->T; r++) {
        for (int i = 0; i < H; i++) {
            double w = want[(size_t)r * H + i], o = got[(size_t)r * stride + i];
            double e = fabs(o - w);
            if (e > maxerr) maxerr = e;
            if (e / (GOLD_ATOL + GOLD_RTOL * fabs(w)) > margin)
                margin = e / (GOLD_ATOL + GOLD_RTOL * fabs(w));
            if (!(e <= GOLD_ATOL + GOLD_RTOL * fabs(w)) && bad < 0) bad = r * H + i;
        }
    }
    if (bad >= 0) {
        int r = bad / H, i = bad % H;
        fprintf(stderr, "%s layer %d: first values got  %.6f %.6f %.6f %.6f\n", fam, idx, got[0],
                got[1], got[2], got[3]);
        fprintf(stderr, "%s layer %d: first values want %.6f %.6f %.6f %.6f\n", fam, idx, want[0],
                want[1], want[2], want[3]);
        ck_abort_msg("%s layer %d: token %d col %d got %.7g want %.7g (max abs diff %.3g, bound "
                     "%g + %g*|want|)",
                     fam, idx, r, i, got[(size_t)r * stride + i], want[bad], maxerr, GOLD_ATOL,
                     GOLD_RTOL);
    }
    if (margin > worst_margin) worst_margin = margin;
    return maxerr;
}

/* ---- golden tests ------------------------------------------------------- */

START_TEST(cpu_forward_matches_transformers_layer_by_layer)
{
    const char *fam = families[_i];
    char dir[512];
    family_dir(fam, dir, sizeof dir);
    hs_model_t *m = NULL;
    ck_assert_int_eq(hs_model_load(dir, &m), HS_OK);
    golden_t g;
    golden_open(fam, &g);
    int N = hs_model_num_layers(m), H = hs_model_hidden_size(m), k = N + 1;
    int32_t layers[64];
    for (int i = 0; i < k; i++)
        layers[i] = i;
    float *out = calloc((size_t)g.T * k * H, sizeof(float));
    ck_assert_int_eq(hs_model_forward_cpu(m, g.ids, g.cu, g.n_seqs, layers, k, out,
                                          HS_MODEL_OUT_F32, (size_t)k * H),
                     HS_OK);
    double worst = 0;
    worst_margin = 0;
    for (int i = 0; i < k; i++) {
        double e = compare_layer(fam, &g, i, out + (size_t)i * H, (size_t)k * H, H);
        if (e > worst) worst = e;
    }
    printf("golden %-8s: %d layers, T=%d, max abs error %.3g (%.0f%% of the bound)\n", fam, k, g.T,
           worst, 100 * worst_margin);
    free(out);
    hs__st_close(g.st);
    hs_model_destroy(m);
}
END_TEST

/* The work buffers of the CPU forward are planned once: a second forward
 * over the same tokens allocates none of them (counted: allocations of
 * T * H floats, the size of the residual stream's three buffers and of no
 * kernel's per-thread tile). */
START_TEST(cpu_forward_allocates_its_work_buffers_once)
{
    if (!ALLOC_COUNT_WORKS) {
        printf("sanitizer build: its allocator is not interposed; count skipped\n");
        return;
    }
    const char *fam = families[_i];
    char dir[512];
    family_dir(fam, dir, sizeof dir);
    hs_model_t *m = NULL;
    ck_assert_int_eq(hs_model_load(dir, &m), HS_OK);
    golden_t g;
    golden_open(fam, &g);
    int N = hs_model_num_layers(m), H = hs_model_hidden_size(m), k = N + 1;
    int32_t layers[64];
    for (int i = 0; i < k; i++)
        layers[i] = i;
    size_t stream = (size_t)g.T * H * sizeof(float);
    float *out = calloc((size_t)g.T * k * H, sizeof(float));
    uint64_t first, second;
    for (int run = 0; run < 2; run++) {
        alloc_count_start(stream, stream);
        ck_assert_int_eq(hs_model_forward_cpu(m, g.ids, g.cu, g.n_seqs, layers, k, out,
                                              HS_MODEL_OUT_F32, (size_t)k * H),
                         HS_OK);
        *(run ? &second : &first) = alloc_count_stop();
    }
    ck_assert_msg(first >= 3, "%s: the first forward allocated %llu buffers of [T, H]", fam,
                  (unsigned long long)first);
    ck_assert_msg(second == 0, "%s: the second forward allocated %llu buffers of [T, H]", fam,
                  (unsigned long long)second);
    free(out);
    hs__st_close(g.st);
    hs_model_destroy(m);
}
END_TEST

/* One captured layer, in a wider buffer, bf16: equals the rounded fp32
 * result; columns outside the slice stay untouched. */
START_TEST(forward_writes_only_its_column_slice_and_bf16_is_rounded_fp32)
{
    const char *fam = families[_i];
    char dir[512];
    family_dir(fam, dir, sizeof dir);
    hs_model_t *m = NULL;
    ck_assert_int_eq(hs_model_load(dir, &m), HS_OK);
    golden_t g;
    golden_open(fam, &g);
    int N = hs_model_num_layers(m), H = hs_model_hidden_size(m);
    int32_t all[2] = {N, 1};
    float *ref = malloc((size_t)g.T * 2 * H * sizeof(float));
    ck_assert_int_eq(hs_model_forward_cpu(m, g.ids, g.cu, g.n_seqs, all, 2, ref, HS_MODEL_OUT_F32,
                                          (size_t)2 * H),
                     HS_OK);
    size_t stride = (size_t)3 * H + 5;
    uint16_t *out = malloc((size_t)g.T * stride * 2);
    memset(out, 0xAB, (size_t)g.T * stride * 2);
    int32_t one[2] = {0, 1}; /* layer 1 into the second slice */
    ck_assert_int_eq(
        hs_model_forward_cpu(m, g.ids, g.cu, g.n_seqs, one, 2, out, HS_MODEL_OUT_BF16, stride),
        HS_OK);
    for (int t = 0; t < g.T; t++) {
        for (int i = 0; i < H; i++) {
            uint16_t want = hs_f32_to_bf16(ref[(size_t)t * 2 * H + H + i]);
            ck_assert_uint_eq(out[(size_t)t * stride + H + i], want);
        }
        for (size_t i = 2 * (size_t)H; i < stride; i++)
            ck_assert_uint_eq(out[(size_t)t * stride + i], 0xABAB);
    }
    free(ref);
    free(out);
    hs__st_close(g.st);
    hs_model_destroy(m);
}
END_TEST

/* Packed sequences do not see each other: each run alone gives the same
 * bits as the packed batch. */
START_TEST(packed_sequences_equal_each_sequence_run_alone)
{
    const char *fam = families[_i];
    char dir[512];
    family_dir(fam, dir, sizeof dir);
    hs_model_t *m = NULL;
    ck_assert_int_eq(hs_model_load(dir, &m), HS_OK);
    golden_t g;
    golden_open(fam, &g);
    int N = hs_model_num_layers(m), H = hs_model_hidden_size(m);
    int32_t layer = N;
    float *packed = malloc((size_t)g.T * H * sizeof(float));
    float *alone = malloc((size_t)g.T * H * sizeof(float));
    ck_assert_int_eq(hs_model_forward_cpu(m, g.ids, g.cu, g.n_seqs, &layer, 1, packed,
                                          HS_MODEL_OUT_F32, (size_t)H),
                     HS_OK);
    for (int s = 0; s < g.n_seqs; s++) {
        int32_t cu[2] = {0, g.cu[s + 1] - g.cu[s]};
        ck_assert_int_eq(hs_model_forward_cpu(m, g.ids + g.cu[s], cu, 1, &layer, 1,
                                              alone + (size_t)g.cu[s] * H, HS_MODEL_OUT_F32,
                                              (size_t)H),
                         HS_OK);
    }
    ck_assert_int_eq(memcmp(packed, alone, (size_t)g.T * H * sizeof(float)), 0);
    free(packed);
    free(alone);
    hs__st_close(g.st);
    hs_model_destroy(m);
}
END_TEST

START_TEST(forward_rejects_bad_ids_layers_and_cu_seqlens)
{
    char dir[512];
    family_dir("mistral", dir, sizeof dir);
    hs_model_t *m = NULL;
    ck_assert_int_eq(hs_model_load(dir, &m), HS_OK);
    int H = hs_model_hidden_size(m), N = hs_model_num_layers(m);
    float out[4 * 80 * 2];
    ck_assert_int_le(H, 80);
    int32_t ids[4] = {1, 2, 3, 4}, cu[3] = {0, 2, 4}, layer = 1;
    ck_assert_int_eq(hs_model_forward_cpu(m, ids, cu, 2, &layer, 1, out, HS_MODEL_OUT_F32, H),
                     HS_OK);
    int32_t bad_ids[4] = {1, 2, hs_model_vocab_size(m), 4};
    ck_assert_int_eq(hs_model_forward_cpu(m, bad_ids, cu, 2, &layer, 1, out, HS_MODEL_OUT_F32, H),
                     HS_ERR_INVALID);
    int32_t neg[4] = {1, -1, 3, 4};
    ck_assert_int_eq(hs_model_forward_cpu(m, neg, cu, 2, &layer, 1, out, HS_MODEL_OUT_F32, H),
                     HS_ERR_INVALID);
    int32_t big = N + 1, negl = -1;
    ck_assert_int_eq(hs_model_forward_cpu(m, ids, cu, 2, &big, 1, out, HS_MODEL_OUT_F32, H),
                     HS_ERR_INVALID);
    ck_assert_int_eq(hs_model_forward_cpu(m, ids, cu, 2, &negl, 1, out, HS_MODEL_OUT_F32, H),
                     HS_ERR_INVALID);
    ck_assert_int_eq(hs_model_forward_cpu(m, ids, cu, 2, &layer, 0, out, HS_MODEL_OUT_F32, H),
                     HS_ERR_INVALID);
    int32_t down[3] = {0, 3, 2}, start1[3] = {1, 2, 4};
    ck_assert_int_eq(hs_model_forward_cpu(m, ids, down, 2, &layer, 1, out, HS_MODEL_OUT_F32, H),
                     HS_ERR_INVALID);
    ck_assert_int_eq(hs_model_forward_cpu(m, ids, start1, 2, &layer, 1, out, HS_MODEL_OUT_F32, H),
                     HS_ERR_INVALID);
    ck_assert_int_eq(hs_model_forward_cpu(m, ids, cu, 2, &layer, 1, out, 7, H), HS_ERR_INVALID);
    ck_assert_int_eq(hs_model_forward_cpu(m, ids, cu, 2, &layer, 1, out, HS_MODEL_OUT_F32, H - 1),
                     HS_ERR_INVALID);
    hs_model_destroy(m);
}
END_TEST

/* ---- config.json -------------------------------------------------------- */

static const char *base_cfg =
    "{\"architectures\": [\"%s\"], \"hidden_size\": 64, \"intermediate_size\": 96,"
    " \"num_hidden_layers\": 2, \"num_attention_heads\": 4, %s \"vocab_size\": 32,"
    " \"rms_norm_eps\": 1e-6 %s}";

static hs_status_t parse_cfg(const char *arch, const char *mid, const char *tail,
                             hs_model_config_t *c)
{
    char json[2048];
    snprintf(json, sizeof json, base_cfg, arch, mid, tail);
    return hs__model_config_parse(json, strlen(json), "test/config.json", c);
}

START_TEST(config_defaults_follow_transformers)
{
    hs_model_config_t c;
    ck_assert_int_eq(parse_cfg("LlamaForCausalLM", "", "", &c), HS_OK);
    ck_assert_int_eq(c.arch, HS_MODEL_LLAMA);
    ck_assert_int_eq(c.num_kv_heads, 4);
    ck_assert_int_eq(c.head_dim, 16);
    ck_assert_float_eq(c.rope_theta, 10000.0f);
    ck_assert_int_eq(c.rope_type, HS_ROPE_DEFAULT);
    ck_assert_int_eq(c.tie_word_embeddings, 0);
    ck_assert_int_eq(c.qkv_bias, 0);
    ck_assert_int_eq(c.sliding_window, 0);
    ck_assert_int_eq(parse_cfg("Qwen2ForCausalLM", "", ", \"tie_word_embeddings\": true", &c),
                     HS_OK);
    ck_assert_int_eq(c.qkv_bias, 1);
    ck_assert_int_eq(c.o_bias, 0);
    ck_assert_int_eq(c.tie_word_embeddings, 1);
    ck_assert_int_eq(parse_cfg("Qwen3ForCausalLM", "\"head_dim\": 24,", "", &c), HS_OK);
    ck_assert_int_eq(c.qk_norm, 1);
    ck_assert_int_eq(c.head_dim, 24);
    ck_assert_int_eq(parse_cfg("MistralForCausalLM", "\"num_key_value_heads\": 1,", "", &c), HS_OK);
    ck_assert_int_eq(c.sliding_window, 4096);
    ck_assert_int_eq(c.num_kv_heads, 1);
    ck_assert_int_eq(parse_cfg("MistralForCausalLM", "", ", \"sliding_window\": null", &c), HS_OK);
    ck_assert_int_eq(c.sliding_window, 0);
}
END_TEST

START_TEST(config_reads_legacy_and_new_rope_fields)
{
    hs_model_config_t c;
    ck_assert_int_eq(parse_cfg("LlamaForCausalLM", "",
                               ", \"rope_theta\": 500000.0, \"rope_scaling\": {\"rope_type\": "
                               "\"llama3\", \"factor\": 8.0, \"low_freq_factor\": 1.0, "
                               "\"high_freq_factor\": 4.0, \"original_max_position_embeddings\": "
                               "8192}",
                               &c),
                     HS_OK);
    ck_assert_int_eq(c.rope_type, HS_ROPE_LLAMA3);
    ck_assert_float_eq(c.rope_theta, 500000.0f);
    ck_assert_float_eq(c.rope_factor, 8.0f);
    ck_assert_float_eq(c.rope_original_max_positions, 8192.0f);
    ck_assert_int_eq(parse_cfg("LlamaForCausalLM", "",
                               ", \"rope_parameters\": {\"rope_type\": \"default\", "
                               "\"rope_theta\": 1234.0}",
                               &c),
                     HS_OK);
    ck_assert_int_eq(c.rope_type, HS_ROPE_DEFAULT);
    ck_assert_float_eq(c.rope_theta, 1234.0f);
    ck_assert_int_eq(parse_cfg("LlamaForCausalLM", "",
                               ", \"rope_scaling\": {\"type\": \"linear\", \"factor\": 2.0}", &c),
                     HS_OK);
    ck_assert_int_eq(c.rope_type, HS_ROPE_LINEAR);
    ck_assert_int_eq(parse_cfg("LlamaForCausalLM", "",
                               ", \"rope_scaling\": {\"rope_type\": \"yarn\", \"factor\": 2.0}",
                               &c),
                     HS_ERR_UNSUPPORTED);
    ck_assert_int_eq(parse_cfg("LlamaForCausalLM", "",
                               ", \"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": 8.0}",
                               &c),
                     HS_ERR_FORMAT);
}
END_TEST

/* Found by fuzz_config: 1e-61 is positive as a double and 0 as a float. */
START_TEST(config_float_fields_must_fit_a_float)
{
    hs_model_config_t c;
    const char *tiny_eps = "{\"architectures\": [\"LlamaForCausalLM\"], \"hidden_size\": 64,"
                           " \"intermediate_size\": 96, \"num_hidden_layers\": 2,"
                           " \"num_attention_heads\": 4, \"vocab_size\": 32,"
                           " \"rms_norm_eps\": 1e-61}";
    ck_assert_int_eq(hs__model_config_parse(tiny_eps, strlen(tiny_eps), "x", &c), HS_ERR_FORMAT);
    ck_assert_int_eq(parse_cfg("LlamaForCausalLM", "", ", \"rope_theta\": 1e39", &c),
                     HS_ERR_FORMAT);
    ck_assert_int_eq(parse_cfg("LlamaForCausalLM", "",
                               ", \"rope_scaling\": {\"type\": \"linear\", \"factor\": 1e-45}", &c),
                     HS_ERR_FORMAT);
    ck_assert_int_eq(parse_cfg("LlamaForCausalLM", "", ", \"rope_theta\": 3e38", &c), HS_OK);
    ck_assert_float_eq(c.rope_theta, 3e38f);
}
END_TEST

START_TEST(config_rejects_unknown_architecture_and_missing_fields)
{
    hs_model_config_t c;
    memset(&c, 0x5a, sizeof c);
    hs_model_config_t before = c;
    ck_assert_int_eq(parse_cfg("GPT2LMHeadModel", "", "", &c), HS_ERR_UNSUPPORTED);
    ck_assert_int_eq(memcmp(&c, &before, sizeof c), 0); /* untouched on failure */
    const char *no_hidden = "{\"architectures\": [\"LlamaForCausalLM\"], \"intermediate_size\": 96,"
                            " \"num_hidden_layers\": 2, \"num_attention_heads\": 4,"
                            " \"vocab_size\": 32, \"rms_norm_eps\": 1e-6}";
    ck_assert_int_eq(hs__model_config_parse(no_hidden, strlen(no_hidden), "x", &c), HS_ERR_FORMAT);
    const char *no_arch = "{\"hidden_size\": 64}";
    ck_assert_int_eq(hs__model_config_parse(no_arch, strlen(no_arch), "x", &c), HS_ERR_FORMAT);
    ck_assert_int_eq(hs__model_config_parse("not json", 8, "x", &c), HS_ERR_FORMAT);
    /* 4 heads over 3 kv heads, odd head_dim, wrong activation, string width */
    ck_assert_int_eq(parse_cfg("LlamaForCausalLM", "\"num_key_value_heads\": 3,", "", &c),
                     HS_ERR_FORMAT);
    ck_assert_int_eq(parse_cfg("LlamaForCausalLM", "\"head_dim\": 15,", "", &c),
                     HS_ERR_UNSUPPORTED);
    ck_assert_int_eq(parse_cfg("LlamaForCausalLM", "\"hidden_act\": \"gelu\",", "", &c),
                     HS_ERR_UNSUPPORTED);
    const char *str_h = "{\"architectures\": [\"LlamaForCausalLM\"], \"hidden_size\": \"64\"}";
    ck_assert_int_eq(hs__model_config_parse(str_h, strlen(str_h), "x", &c), HS_ERR_FORMAT);
    ck_assert_int_eq(parse_cfg("Qwen2ForCausalLM", "", ", \"use_sliding_window\": true", &c),
                     HS_ERR_UNSUPPORTED);
}
END_TEST

/* ---- safetensors -------------------------------------------------------- */

static void copy_file(const char *from, const char *to)
{
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "cp '%s' '%s'", from, to);
    ck_assert_int_eq(system(cmd), 0);
}

/* tmpdir/bad: a family's config and its tensors rewritten, with tensor
 * `drop` left out, `shrink` written with its first dimension minus one, or
 * entry 5 of `poison` made `poison_value` (NaN, an infinity or a float too
 * large for bf16, in the tensor's own dtype). */
static void write_family_edited(const char *fam, const char *drop, const char *shrink,
                                const char *poison, float poison_value, char *dir, size_t cap)
{
    char src[512], p[512];
    snprintf(dir, cap, "%s/bad", tmpdir);
    mkdir(dir, 0755);
    snprintf(src, sizeof src, "%s/%s/config.json", HS_TEST_DATA_DIR, fam);
    snprintf(p, sizeof p, "%s/config.json", dir);
    copy_file(src, p);
    snprintf(src, sizeof src, "%s/%s/model.safetensors", HS_TEST_DATA_DIR, fam);
    hs__st_set_t *st;
    ck_assert_int_eq(hs__st_open_file(src, &st), HS_OK);
    size_t n = hs__st_count(st);
    hs__st_write_tensor_t *w = calloc(n, sizeof *w);
    uint8_t *poisoned = NULL;
    int k = 0;
    for (size_t i = 0; i < n; i++) {
        const hs__st_tensor_t *t = hs__st_at(st, i);
        if (drop && strcmp(t->name, drop) == 0) continue;
        hs__st_write_tensor_t *o = &w[k++];
        o->name = t->name;
        o->dtype = t->dtype_name;
        o->ndim = t->ndim;
        memcpy(o->shape, t->shape, sizeof o->shape);
        o->data = t->data;
        o->rows = 1;
        o->row_bytes = t->nbytes;
        if (shrink && strcmp(t->name, shrink) == 0) {
            o->row_bytes = t->nbytes / (size_t)t->shape[0] * (size_t)(t->shape[0] - 1);
            o->shape[0]--;
        }
        if (poison && strcmp(t->name, poison) == 0) {
            ck_assert_uint_gt(t->nbytes, 24);
            poisoned = malloc(t->nbytes);
            memcpy(poisoned, t->data, t->nbytes);
            if (!strcmp(t->dtype_name, "F32")) {
                memcpy(poisoned + 20, &poison_value, 4);
            } else {
                uint16_t h = hs_f32_to_bf16(poison_value); /* NaN and Inf as bf16 */
                if (!strcmp(t->dtype_name, "F16")) h = isnan(poison_value) ? 0x7e00 : 0x7c00;
                memcpy(poisoned + 10, &h, 2);
            }
            o->data = poisoned;
        }
    }
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    ck_assert_int_eq(hs__st_write(p, w, k, NULL, NULL, 0), HS_OK);
    free(poisoned);
    free(w);
    hs__st_close(st);
}

static void write_family_modified(const char *fam, const char *drop, const char *shrink, char *dir,
                                  size_t cap)
{
    write_family_edited(fam, drop, shrink, NULL, 0.0f, dir, cap);
}

static void write_modified_model(const char *drop, const char *shrink, char *dir, size_t cap)
{
    write_family_modified("mistral", drop, shrink, dir, cap);
}

START_TEST(load_rejects_missing_tensor_and_wrong_shape)
{
    make_tmpdir();
    char dir[512];
    hs_model_t *m = (hs_model_t *)0x1;
    /* a faithful rewrite loads (the writer round-trips) */
    write_modified_model(NULL, NULL, dir, sizeof dir);
    m = NULL;
    ck_assert_int_eq(hs_model_load(dir, &m), HS_OK);
    hs_model_destroy(m);
    m = (hs_model_t *)0x1;
    write_modified_model("model.layers.1.mlp.up_proj.weight", NULL, dir, sizeof dir);
    ck_assert_int_eq(hs_model_load(dir, &m), HS_ERR_NOT_FOUND);
    ck_assert_ptr_eq(m, (hs_model_t *)0x1);
    write_modified_model(NULL, "model.layers.0.self_attn.k_proj.weight", dir, sizeof dir);
    ck_assert_int_eq(hs_model_load(dir, &m), HS_ERR_FORMAT);
    write_modified_model(NULL, "model.norm.weight", dir, sizeof dir);
    ck_assert_int_eq(hs_model_load(dir, &m), HS_ERR_FORMAT);
    ck_assert_ptr_eq(m, (hs_model_t *)0x1);
    remove_tmpdir();
}
END_TEST

START_TEST(load_rejects_truncated_file_and_unknown_architecture)
{
    make_tmpdir();
    char src[512], p[512], cmd[1024];
    snprintf(src, sizeof src, "%s/mistral/config.json", HS_TEST_DATA_DIR);
    snprintf(p, sizeof p, "%s/config.json", tmpdir);
    copy_file(src, p);
    snprintf(src, sizeof src, "%s/mistral/model.safetensors", HS_TEST_DATA_DIR);
    snprintf(p, sizeof p, "%s/model.safetensors", tmpdir);
    copy_file(src, p);
    struct stat sb;
    ck_assert_int_eq(stat(p, &sb), 0);
    ck_assert_int_eq(truncate(p, sb.st_size - 100), 0);
    hs_model_t *m = NULL;
    ck_assert_int_eq(hs_model_load(tmpdir, &m), HS_ERR_FORMAT);
    ck_assert_int_eq(truncate(p, 5), 0); /* shorter than the length field */
    ck_assert_int_eq(hs_model_load(tmpdir, &m), HS_ERR_FORMAT);
    ck_assert_int_eq(truncate(p, 100), 0); /* header cut */
    ck_assert_int_eq(hs_model_load(tmpdir, &m), HS_ERR_FORMAT);
    /* no weights at all */
    unlink(p);
    ck_assert_int_eq(hs_model_load(tmpdir, &m), HS_ERR_NOT_FOUND);
    /* a Gemma config */
    snprintf(cmd, sizeof cmd, "sed -i 's/MistralForCausalLM/GemmaForCausalLM/' '%s/config.json'",
             tmpdir);
    ck_assert_int_eq(system(cmd), 0);
    ck_assert_int_eq(hs_model_load(tmpdir, &m), HS_ERR_UNSUPPORTED);
    ck_assert_ptr_null(m);
    remove_tmpdir();
}
END_TEST

static void write_raw(const char *path, const char *header, size_t data_bytes)
{
    FILE *fp = fopen(path, "wb");
    ck_assert_ptr_nonnull(fp);
    uint64_t n = strlen(header);
    uint8_t len8[8];
    hs_le64_store(len8, n);
    fwrite(len8, 1, 8, fp);
    fwrite(header, 1, n, fp);
    for (size_t i = 0; i < data_bytes; i++)
        fputc(0, fp);
    fclose(fp);
}

START_TEST(safetensors_bounds_checks_every_header_field)
{
    make_tmpdir();
    char p[512];
    snprintf(p, sizeof p, "%s/x.safetensors", tmpdir);
    hs__st_set_t *st = NULL;
    write_raw(p, "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8);
    ck_assert_int_eq(hs__st_open_file(p, &st), HS_OK);
    const uint16_t *w;
    int64_t two = 2, three = 3;
    ck_assert_int_eq(hs__st_get_bf16(st, "a", 1, &two, &w), HS_OK);
    ck_assert_int_eq(hs__st_get_bf16(st, "a", 1, &three, &w), HS_ERR_FORMAT);
    ck_assert_int_eq(hs__st_get_bf16(st, "b", 1, &two, &w), HS_ERR_NOT_FOUND);
    hs__st_close(st);
    st = NULL;
    /* data_offsets past the end of the file */
    write_raw(p, "{\"a\":{\"dtype\":\"F32\",\"shape\":[250],\"data_offsets\":[0,1000]}}", 8);
    ck_assert_int_eq(hs__st_open_file(p, &st), HS_ERR_FORMAT);
    /* offsets that disagree with the shape */
    write_raw(p, "{\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", 8);
    ck_assert_int_eq(hs__st_open_file(p, &st), HS_ERR_FORMAT);
    /* begin > end, negative, fractional, huge shape, unknown dtype */
    write_raw(p, "{\"a\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[8,0]}}", 8);
    ck_assert_int_eq(hs__st_open_file(p, &st), HS_ERR_FORMAT);
    write_raw(p, "{\"a\":{\"dtype\":\"F32\",\"shape\":[-2],\"data_offsets\":[0,8]}}", 8);
    ck_assert_int_eq(hs__st_open_file(p, &st), HS_ERR_FORMAT);
    write_raw(p, "{\"a\":{\"dtype\":\"F32\",\"shape\":[2.5],\"data_offsets\":[0,8]}}", 8);
    ck_assert_int_eq(hs__st_open_file(p, &st), HS_ERR_FORMAT);
    write_raw(p,
              "{\"a\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296,4294967296],"
              "\"data_offsets\":[0,8]}}",
              8);
    ck_assert_int_eq(hs__st_open_file(p, &st), HS_ERR_FORMAT);
    write_raw(p, "{\"a\":{\"dtype\":\"Q4\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8);
    ck_assert_int_eq(hs__st_open_file(p, &st), HS_ERR_FORMAT);
    /* an I64 tensor opens but is not a weight */
    write_raw(p, "{\"a\":{\"dtype\":\"I64\",\"shape\":[1],\"data_offsets\":[0,8]}}", 8);
    ck_assert_int_eq(hs__st_open_file(p, &st), HS_OK);
    int64_t one = 1;
    ck_assert_int_eq(hs__st_get_bf16(st, "a", 1, &one, &w), HS_ERR_UNSUPPORTED);
    hs__st_close(st);
    /* header length larger than the file, header not JSON */
    write_raw(p, "{}", 0);
    FILE *fp = fopen(p, "r+b");
    fputc(0xff, fp);
    fputc(0xff, fp);
    fclose(fp);
    ck_assert_int_eq(hs__st_open_file(p, &st), HS_ERR_FORMAT);
    write_raw(p, "{not json", 0);
    ck_assert_int_eq(hs__st_open_file(p, &st), HS_ERR_FORMAT);
    remove_tmpdir();
}
END_TEST

START_TEST(safetensors_converts_f16_and_f32_to_bf16)
{
    make_tmpdir();
    char p[512];
    snprintf(p, sizeof p, "%s/x.safetensors", tmpdir);
    /* F16: 1.0 (0x3c00), -2.0 (0xc000), 2^-24 subnormal (0x0001), 65504 */
    uint16_t h[4] = {0x3c00, 0xc000, 0x0001, 0x7bff};
    float f[3] = {1.0f, 3.14159265f, -1e-30f};
    hs__st_write_tensor_t t[2] = {
        {.name = "h",
         .dtype = "F16",
         .ndim = 1,
         .shape = {4},
         .data = h,
         .rows = 1,
         .row_bytes = sizeof h},
        {.name = "f",
         .dtype = "F32",
         .ndim = 1,
         .shape = {3},
         .data = f,
         .rows = 1,
         .row_bytes = sizeof f},
    };
    ck_assert_int_eq(hs__st_write(p, t, 2, NULL, NULL, 0), HS_OK);
    hs__st_set_t *st;
    ck_assert_int_eq(hs__st_open_file(p, &st), HS_OK);
    const uint16_t *w;
    int64_t four = 4, three = 3;
    ck_assert_int_eq(hs__st_get_bf16(st, "h", 1, &four, &w), HS_OK);
    ck_assert_float_eq(hs_bf16_to_f32(w[0]), 1.0f);
    ck_assert_float_eq(hs_bf16_to_f32(w[1]), -2.0f);
    ck_assert_float_eq(hs_bf16_to_f32(w[2]), ldexpf(1.0f, -24));
    ck_assert_float_eq(hs_bf16_to_f32(w[3]), 65536.0f); /* 65504 rounds up in bf16 */
    ck_assert_int_eq(hs__st_get_bf16(st, "f", 1, &three, &w), HS_OK);
    ck_assert_uint_eq(w[0], 0x3f80);
    ck_assert_uint_eq(w[1], 0x4049); /* 3.140625 */
    ck_assert_uint_eq(w[2], hs_f32_to_bf16(-1e-30f));
    hs__st_close(st);
    remove_tmpdir();
}
END_TEST

/* Runs hs__st_get_bf16 (as_f32 = 0) or hs__st_get_f32 of tensor `name`
 * (1-D, n entries) with stderr captured into log[cap]. */
static hs_status_t get_capturing(hs__st_set_t *st, const char *name, int64_t n, int as_f32,
                                 char *log, size_t cap)
{
    char path[600];
    snprintf(path, sizeof path, "%s/stderr.txt", tmpdir);
    fflush(stderr);
    int saved = dup(2);
    FILE *f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    dup2(fileno(f), 2);
    const uint16_t *w = NULL;
    const float *x = NULL;
    hs_status_t rc =
        as_f32 ? hs__st_get_f32(st, name, 1, &n, &x) : hs__st_get_bf16(st, name, 1, &n, &w);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    fclose(f);
    f = fopen(path, "r");
    size_t got = fread(log, 1, cap - 1, f);
    log[got] = 0;
    fclose(f);
    return rc;
}

/* A NaN or infinite weight, in any stored dtype and through either getter,
 * or an F32 weight too large for bf16, is refused naming the tensor and the
 * element; finite tensors next to them still load. */
START_TEST(non_finite_weights_are_refused_naming_the_tensor)
{
    make_tmpdir();
    char p[512], log[2048];
    snprintf(p, sizeof p, "%s/x.safetensors", tmpdir);
    uint16_t ok[6] = {0x3f80, 0x4000, 0x0000, 0x8000, 0x7f7f, 0xff7f}; /* incl. +-max bf16 */
    uint16_t b_nan[6] = {0x3f80, 0x3f80, 0x3f80, 0x7fc1, 0x3f80, 0x3f80};
    uint16_t b_ninf[6] = {0x3f80, 0xff80, 0x3f80, 0x3f80, 0x3f80, 0x3f80};
    uint16_t h_inf[6] = {0x3c00, 0x3c00, 0x3c00, 0x3c00, 0x7c00, 0x3c00};
    float f_nan[6] = {1, 2, 3, 4, 5, NAN};
    float f_big[6] = {1, 2, 3.4e38f, 4, 5, 6}; /* finite in F32, +Inf in bf16 */
    const struct {
        const char *name, *dtype;
        const void *data;
        size_t bytes;
    } in[] = {
        {"ok", "BF16", ok, sizeof ok},
        {"b_nan", "BF16", b_nan, sizeof b_nan},
        {"b_ninf", "BF16", b_ninf, sizeof b_ninf},
        {"h_inf", "F16", h_inf, sizeof h_inf},
        {"f_nan", "F32", f_nan, sizeof f_nan},
        {"f_big", "F32", f_big, sizeof f_big},
    };
    hs__st_write_tensor_t t[6];
    for (int i = 0; i < 6; i++)
        t[i] = (hs__st_write_tensor_t){.name = in[i].name,
                                       .dtype = in[i].dtype,
                                       .ndim = 1,
                                       .shape = {6},
                                       .data = in[i].data,
                                       .rows = 1,
                                       .row_bytes = in[i].bytes};
    ck_assert_int_eq(hs__st_write(p, t, 6, NULL, NULL, 0), HS_OK);
    hs__st_set_t *st;
    ck_assert_int_eq(hs__st_open_file(p, &st), HS_OK);
    ck_assert_int_eq(get_capturing(st, "ok", 6, 0, log, sizeof log), HS_OK);
    ck_assert_int_eq(get_capturing(st, "ok", 6, 1, log, sizeof log), HS_OK);
    const struct {
        const char *name;
        int as_f32;
        const char *says;
    } bad[] = {
        {"b_nan", 0, "holds NaN at element 3 of 6"},
        {"b_nan", 1, "holds NaN at element 3 of 6"},
        {"b_ninf", 0, "holds -Inf at element 1 of 6"},
        {"h_inf", 0, "holds +Inf at element 4 of 6"},
        {"h_inf", 1, "holds +Inf at element 4 of 6"},
        {"f_nan", 0, "holds NaN at element 5 of 6"},
        {"f_nan", 1, "holds NaN at element 5 of 6"},
        {"f_big", 0, "beyond bf16's range, at element 2 of 6"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        ck_assert_int_eq(get_capturing(st, bad[i].name, 6, bad[i].as_f32, log, sizeof log),
                         HS_ERR_FORMAT);
        char want[64];
        snprintf(want, sizeof want, "tensor '%s'", bad[i].name);
        ck_assert_msg(strstr(log, want) && strstr(log, bad[i].says), "%s: %s", bad[i].name, log);
    }
    /* f_big is fine in full precision */
    ck_assert_int_eq(get_capturing(st, "f_big", 6, 1, log, sizeof log), HS_OK);
    hs__st_close(st);
    remove_tmpdir();
}
END_TEST

/* A checkpoint with one NaN weight: hs_model_load refuses it naming the
 * tensor, and hs-forward fails instead of writing hidden states from it. */
START_TEST(model_with_a_nan_weight_is_refused_by_load_and_hs_forward)
{
    make_tmpdir();
    char dir[512], data[600], out[600], cmd[4096], logp[600], log[4096];
    const char *bad_w = "model.layers.1.mlp.down_proj.weight";
    write_family_edited("mistral", NULL, NULL, bad_w, NAN, dir, sizeof dir);
    hs_model_t *m = (hs_model_t *)0x1;
    ck_assert_int_eq(hs_model_load(dir, &m), HS_ERR_FORMAT);
    ck_assert_ptr_eq(m, (hs_model_t *)0x1);
    write_family_edited("mistral", NULL, NULL, "model.norm.weight", INFINITY, dir, sizeof dir);
    ck_assert_int_eq(hs_model_load(dir, &m), HS_ERR_FORMAT);

    write_family_edited("mistral", NULL, NULL, bad_w, NAN, dir, sizeof dir);
    snprintf(data, sizeof data, "%s/data.jsonl", tmpdir);
    snprintf(out, sizeof out, "%s/hs.safetensors", tmpdir);
    snprintf(logp, sizeof logp, "%s/forward.log", tmpdir);
    FILE *fp = fopen(data, "w");
    fprintf(fp, "{\"input_ids\": [1, 2, 3, 4]}\n");
    fclose(fp);
    snprintf(cmd, sizeof cmd,
             "'%s' --model '%s' --data '%s' --layers 1 --device cpu --out '%s' >'%s' 2>&1",
             HS_FORWARD_BIN, dir, data, out, logp);
    int rc = system(cmd);
    fp = fopen(logp, "r");
    size_t got = fread(log, 1, sizeof log - 1, fp);
    log[got] = 0;
    fclose(fp);
    ck_assert_msg(WIFEXITED(rc) && WEXITSTATUS(rc) != 0, "hs-forward succeeded: %s", log);
    ck_assert_msg(strstr(log, bad_w) && strstr(log, "NaN"), "%s", log);
    ck_assert_int_eq(access(out, F_OK), -1);
    remove_tmpdir();
}
END_TEST

START_TEST(sharded_index_naming_a_shard_without_the_tensor_is_rejected)
{
    make_tmpdir();
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "cp '%s'/llama3/* '%s'/", HS_TEST_DATA_DIR, tmpdir);
    ck_assert_int_eq(system(cmd), 0);
    hs_model_t *m = NULL;
    ck_assert_int_eq(hs_model_load(tmpdir, &m), HS_OK);
    hs_model_destroy(m);
    m = NULL;
    /* point the final norm at another shard */
    snprintf(cmd, sizeof cmd,
             "python3 -c \"import json,sys; p=sys.argv[1]+'/model.safetensors.index.json'; "
             "j=json.load(open(p)); w=j['weight_map']; f=w['model.norm.weight']; "
             "w['model.norm.weight']=[v for v in sorted(set(w.values())) if v!=f][0]; "
             "json.dump(j,open(p,'w'))\" '%s'",
             tmpdir);
    ck_assert_int_eq(system(cmd), 0);
    ck_assert_int_eq(hs_model_load(tmpdir, &m), HS_ERR_FORMAT);
    ck_assert_ptr_null(m);
    remove_tmpdir();
}
END_TEST

/* ---- kernel C twins: closed forms -------------------------------------- */

START_TEST(rmsnorm_of_a_constant_row_is_the_weight_times_its_sign)
{
    int dim = 37;
    float x[37], y[37];
    uint16_t w[37];
    for (int i = 0; i < dim; i++) {
        x[i] = -3.0f;
        w[i] = hs_f32_to_bf16(0.5f + 0.25f * (float)(i % 5));
    }
    hs_kn_rmsnorm_ref(x, w, y, 1, dim, 0.0f);
    for (int i = 0; i < dim; i++)
        ck_assert_float_eq_tol(y[i], -hs_bf16_to_f32(w[i]), 1e-6);
    /* with eps: scale = 3 / sqrt(9 + eps) */
    hs_kn_rmsnorm_ref(x, w, x, 1, dim, 7.0f); /* in place */
    for (int i = 0; i < dim; i++)
        ck_assert_float_eq_tol(x[i], -3.0f / 4.0f * hs_bf16_to_f32(w[i]), 1e-6);
}
END_TEST

START_TEST(rope_is_identity_at_position_zero_and_a_rotation_after)
{
    int d = 6, heads = 3;
    float inv[3];
    hs_kn_rope_inv_freq(d, 10000.0f, NULL, inv);
    ck_assert_float_eq(inv[0], 1.0f);
    ck_assert_float_eq_tol(inv[1], powf(10000.0f, -2.0f / 6.0f), 1e-9);
    /* two sequences of 1 and 2 tokens: tokens 0 and 1 are at position 0 */
    int32_t cu[3] = {0, 1, 3};
    float x[3 * 18], x0[3 * 18];
    for (int i = 0; i < 3 * 18; i++)
        x[i] = x0[i] = (float)(i % 7) - 2.5f;
    hs_kn_rope_ref(x, cu, 2, heads, d, inv);
    for (int i = 0; i < 2 * 18; i++)
        ck_assert_float_eq(x[i], x0[i]);
    /* token 2 is at position 1: pair (i, i+3) rotated by inv[i] radians */
    for (int h = 0; h < heads; h++) {
        for (int i = 0; i < 3; i++) {
            float a = x0[36 + h * d + i], b = x0[36 + h * d + i + 3];
            ck_assert_float_eq_tol(x[36 + h * d + i], a * cosf(inv[i]) - b * sinf(inv[i]), 1e-6);
            ck_assert_float_eq_tol(x[36 + h * d + i + 3], b * cosf(inv[i]) + a * sinf(inv[i]),
                                   1e-6);
        }
    }
}
END_TEST

START_TEST(llama3_rope_scaling_keeps_high_divides_low_and_blends_between)
{
    int d = 16;
    float plain[8], scaled[8];
    hs_kn_rope_inv_freq(d, 500000.0f, NULL, plain);
    hs_rope_scaling_t sc = {HS_ROPE_LLAMA3, 8.0f, 1.0f, 4.0f, 64.0f};
    hs_kn_rope_inv_freq(d, 500000.0f, &sc, scaled);
    int hi = 0, lo = 0, mid = 0;
    for (int i = 0; i < 8; i++) {
        float wl = 2.0f * (float)M_PI / plain[i];
        if (wl < 64.0f / 4.0f) {
            ck_assert_float_eq(scaled[i], plain[i]);
            hi++;
        } else if (wl > 64.0f) {
            ck_assert_float_eq_tol(scaled[i], plain[i] / 8.0f, 1e-12);
            lo++;
        } else {
            float s = (64.0f / wl - 1.0f) / 3.0f;
            ck_assert_float_eq_tol(scaled[i], (1 - s) * plain[i] / 8.0f + s * plain[i], 1e-7);
            ck_assert(scaled[i] < plain[i] && scaled[i] > plain[i] / 8.0f);
            mid++;
        }
    }
    ck_assert(hi > 0 && lo > 0 && mid > 0);
    hs_rope_scaling_t lin = {HS_ROPE_LINEAR, 4.0f, 0, 0, 0};
    hs_kn_rope_inv_freq(d, 500000.0f, &lin, scaled);
    for (int i = 0; i < 8; i++)
        ck_assert_float_eq(scaled[i], plain[i] / 4.0f);
}
END_TEST

START_TEST(attention_of_a_single_token_is_its_value_per_kv_group)
{
    /* 3 one-token sequences, 6 query heads over 2 kv heads, head_dim 5 */
    int T = 3, hq = 6, hkv = 2, d = 5;
    float q[3 * 30], k[3 * 10], v[3 * 10], out[3 * 30];
    for (int i = 0; i < 90; i++)
        q[i] = sinf((float)i);
    for (int i = 0; i < 30; i++) {
        k[i] = cosf((float)i);
        v[i] = (float)i;
    }
    int32_t cu[4] = {0, 1, 2, 3};
    hs_kn_attention_ref(q, k, v, out, cu, 3, hq, hkv, d, 0.3f, 0);
    for (int t = 0; t < T; t++)
        for (int h = 0; h < hq; h++)
            for (int i = 0; i < d; i++)
                ck_assert_float_eq(out[t * hq * d + h * d + i], v[t * hkv * d + (h / 3) * d + i]);
}
END_TEST

START_TEST(attention_with_equal_keys_averages_the_visible_values)
{
    /* one sequence of 7 tokens, equal keys: token i averages v[j0..i]; with
     * window 3 only the last three; a second sequence sees none of the first */
    int d = 3;
    float q[9 * 3], k[9 * 3], v[9 * 3], out[9 * 3];
    for (int i = 0; i < 27; i++) {
        q[i] = 0.7f;
        k[i] = 1.1f;
        v[i] = (float)(i / 3) * 10.0f + (float)(i % 3);
    }
    int32_t cu[3] = {0, 7, 9};
    for (int window = 0; window <= 3; window += 3) {
        hs_kn_attention_ref(q, k, v, out, cu, 2, 1, 1, d, 1.0f, window);
        for (int s = 0; s < 2; s++) {
            for (int i = cu[s]; i < cu[s + 1]; i++) {
                int j0 = cu[s];
                if (window && i - window + 1 > j0) j0 = i - window + 1;
                for (int c = 0; c < d; c++) {
                    float sum = 0;
                    for (int j = j0; j <= i; j++)
                        sum += v[j * d + c];
                    ck_assert_float_eq_tol(out[i * d + c], sum / (float)(i - j0 + 1), 1e-4);
                }
            }
        }
    }
}
END_TEST

START_TEST(attention_matches_a_two_pass_softmax)
{
    /* odd shapes: 2 sequences (13 and 1 tokens... and an empty one), GQA 3:1 */
    int hq = 3, hkv = 1, d = 7, T = 14;
    int32_t cu[4] = {0, 13, 13, 14};
    float *q = malloc(sizeof(float) * T * hq * d), *k = malloc(sizeof(float) * T * hkv * d);
    float *v = malloc(sizeof(float) * T * hkv * d), *out = malloc(sizeof(float) * T * hq * d);
    uint64_t seed = 42;
    for (int i = 0; i < T * hq * d; i++)
        q[i] = (float)(hs_splitmix64(&seed) % 2001) / 500.0f - 2;
    for (int i = 0; i < T * hkv * d; i++) {
        k[i] = (float)(hs_splitmix64(&seed) % 2001) / 500.0f - 2;
        v[i] = (float)(hs_splitmix64(&seed) % 2001) / 500.0f - 2;
    }
    float scale = 1.0f / sqrtf((float)d);
    hs_kn_attention_ref(q, k, v, out, cu, 3, hq, hkv, d, scale, 0);
    for (int s = 0; s < 3; s++) {
        for (int i = cu[s]; i < cu[s + 1]; i++) {
            for (int h = 0; h < hq; h++) {
                double sc[16], mx = -1e30, sum = 0;
                for (int j = cu[s]; j <= i; j++) {
                    double dot = 0;
                    for (int c = 0; c < d; c++)
                        dot += (double)q[(i * hq + h) * d + c] * k[j * d + c];
                    sc[j - cu[s]] = dot * scale;
                    if (sc[j - cu[s]] > mx) mx = sc[j - cu[s]];
                }
                for (int j = cu[s]; j <= i; j++)
                    sum += exp(sc[j - cu[s]] - mx);
                for (int c = 0; c < d; c++) {
                    double o = 0;
                    for (int j = cu[s]; j <= i; j++)
                        o += exp(sc[j - cu[s]] - mx) / sum * v[j * d + c];
                    ck_assert_double_eq_tol(out[(i * hq + h) * d + c], o, 1e-5);
                }
            }
        }
    }
    free(q);
    free(k);
    free(v);
    free(out);
}
END_TEST

START_TEST(matmul_matches_a_double_precision_dot_with_bias)
{
    int T = 5, K = 67, N = 19; /* N not a multiple of the tile */
    float *x = malloc(sizeof(float) * T * K), *y = malloc(sizeof(float) * T * N);
    uint16_t *w = malloc(2 * (size_t)N * K), b[19];
    uint64_t seed = 7;
    for (int i = 0; i < T * K; i++)
        x[i] = (float)(hs_splitmix64(&seed) % 1001) / 250.0f - 2;
    for (int i = 0; i < N * K; i++)
        w[i] = hs_f32_to_bf16((float)(hs_splitmix64(&seed) % 1001) / 250.0f - 2);
    for (int i = 0; i < N; i++)
        b[i] = hs_f32_to_bf16((float)i - 9.5f);
    for (int pass = 0; pass < 2; pass++) {
        hs_kn_matmul_ref(x, w, pass ? b : NULL, y, T, K, N);
        for (int t = 0; t < T; t++) {
            for (int n = 0; n < N; n++) {
                double acc = pass ? hs_bf16_to_f32(b[n]) : 0;
                for (int kk = 0; kk < K; kk++)
                    acc += (double)x[t * K + kk] * hs_bf16_to_f32(w[n * K + kk]);
                ck_assert_double_eq_tol(y[t * N + n], acc, 1e-4);
            }
        }
    }
    free(x);
    free(y);
    free(w);
}
END_TEST

START_TEST(swiglu_residual_and_embedding_closed_forms)
{
    float g[4] = {0.0f, 20.0f, -20.0f, 1.0f}, u[4] = {5.0f, 2.0f, 3.0f, 1.0f}, o[4];
    hs_kn_swiglu_ref(g, u, o, 4);
    ck_assert_float_eq(o[0], 0.0f);
    ck_assert_float_eq_tol(o[1], 40.0f, 1e-5);
    ck_assert_float_eq_tol(o[2], 0.0f, 1e-6);
    ck_assert_float_eq_tol(o[3], 1.0f / (1.0f + expf(-1.0f)), 1e-7);
    hs_kn_residual_add_ref(g, u, g, 4);
    ck_assert_float_eq(g[1], 22.0f);
    uint16_t table[3 * 5];
    for (int i = 0; i < 15; i++)
        table[i] = hs_f32_to_bf16((float)i);
    int32_t ids[3] = {2, 0, 2};
    float e[15];
    hs_kn_embedding_ref(table, 3, 5, ids, 3, e);
    for (int i = 0; i < 5; i++) {
        ck_assert_float_eq(e[i], (float)(10 + i));
        ck_assert_float_eq(e[5 + i], (float)i);
        ck_assert_float_eq(e[10 + i], (float)(10 + i));
    }
}
END_TEST

START_TEST(bf16_rounds_to_nearest_even)
{
    ck_assert_uint_eq(hs_f32_to_bf16(1.0f), 0x3f80);
    /* 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties to even (1.0) */
    ck_assert_uint_eq(hs_f32_to_bf16(1.0f + ldexpf(1, -8)), 0x3f80);
    ck_assert_uint_eq(hs_f32_to_bf16(1.0f + 3 * ldexpf(1, -8)), 0x3f82);
    ck_assert(isnan(hs_bf16_to_f32(hs_f32_to_bf16(NAN))));
    ck_assert_float_eq(hs_bf16_to_f32(hs_f32_to_bf16(-INFINITY)), -INFINITY);
}
END_TEST

/* ---- layer indices ----------------------------------------------------- */

START_TEST(eagle3_layers_are_vllm_aux_layer_ids_plus_the_final_normed_state)
{
    /* vLLM's aux layer id i is the state entering decoder layer i, which is
     * output_hidden_states[i]: the same number here; speculators appends N */
    int32_t l[8];
    ck_assert_int_eq(hs_model_eagle3_layers(32, l, 8), HS_OK); /* Llama-3.1-8B */
    int32_t want32[4] = {2, 16, 29, 32};
    for (int i = 0; i < 4; i++)
        ck_assert_int_eq(l[i], want32[i]);
    ck_assert_int_eq(hs_model_eagle3_layers(7, l, 8), HS_OK); /* the shallowest */
    int32_t want7[4] = {2, 3, 4, 7};
    for (int i = 0; i < 4; i++)
        ck_assert_int_eq(l[i], want7[i]);
    ck_assert_int_eq(hs_model_check_layers(7, l, 4), HS_OK);
    ck_assert_int_eq(hs_model_eagle3_layers(6, l, 8), HS_ERR_INVALID); /* 2, 3, 3, 6 */
    ck_assert_int_eq(hs_model_eagle3_layers(4, l, 8), HS_ERR_INVALID);
    ck_assert_int_eq(hs_model_eagle3_layers(32, l, 3), HS_ERR_INVALID);
}
END_TEST

START_TEST(dflash_layers_are_dflash_target_layer_ids_plus_one)
{
    int32_t l[8];
    ck_assert_int_eq(hs_model_dflash_layers(32, 5, l, 8), HS_OK);
    int32_t want32[5] = {2, 9, 16, 23, 30}; /* DFlash: 1, 8, 15, 22, 29 */
    for (int i = 0; i < 5; i++)
        ck_assert_int_eq(l[i], want32[i]);
    ck_assert_int_eq(hs_model_dflash_layers(36, 5, l, 8), HS_OK);
    int32_t want36[5] = {2, 10, 18, 26, 34}; /* Qwen3-8B: 1, 9, 17, 25, 33 */
    for (int i = 0; i < 5; i++)
        ck_assert_int_eq(l[i], want36[i]);
    ck_assert_int_eq(hs_model_dflash_layers(32, 1, l, 8), HS_OK);
    ck_assert_int_eq(l[0], 17);
    /* round half to even as Python: N = 7, 3 layers -> 1, round(2.5) = 2, 4 */
    ck_assert_int_eq(hs_model_dflash_layers(7, 3, l, 8), HS_OK);
    ck_assert_int_eq(l[0], 2);
    ck_assert_int_eq(l[1], 3);
    ck_assert_int_eq(l[2], 5);
    ck_assert_int_eq(hs_model_dflash_layers(32, 0, l, 8), HS_ERR_INVALID);
    ck_assert_int_eq(hs_model_dflash_layers(32, 9, l, 8), HS_ERR_INVALID);
    ck_assert_int_eq(hs_model_dflash_layers(3, 2, l, 8), HS_ERR_INVALID);
    /* more draft layers than decoder layers 1..N-3 hold: they would repeat
     * (N = 4, 5 layers gave 2, 2, 2, 2, 2); N = n + 3 is the shallowest */
    ck_assert_int_eq(hs_model_dflash_layers(4, 5, l, 8), HS_ERR_INVALID);
    ck_assert_int_eq(hs_model_dflash_layers(7, 5, l, 8), HS_ERR_INVALID);
    ck_assert_int_eq(hs_model_dflash_layers(8, 5, l, 8), HS_OK);
    for (int i = 0; i < 5; i++)
        ck_assert_int_eq(l[i], i + 2);
    int32_t ok[3] = {0, 16, 32}, bad[2] = {1, 33};
    ck_assert_int_eq(hs_model_check_layers(32, ok, 3), HS_OK);
    ck_assert_int_eq(hs_model_check_layers(32, bad, 2), HS_ERR_INVALID);
}
END_TEST

START_TEST(cuda_entry_points_say_unsupported_without_cuda)
{
#ifdef HS_HAVE_CUDA
    return;
#endif
    hs_model_cuda_t *mc = (hs_model_cuda_t *)0x1;
    ck_assert_int_eq(hs_model_cuda_create(NULL, 0, 1024, 4, &mc), HS_ERR_UNSUPPORTED);
    ck_assert_ptr_eq(mc, (hs_model_cuda_t *)0x1);
    uint64_t b = 7;
    ck_assert_int_eq(hs_model_cuda_peak_bytes(NULL, &b), HS_ERR_UNSUPPORTED);
    ck_assert_uint_eq(b, 7);
    ck_assert_int_eq(hs_model_cuda_forward(NULL, NULL, NULL, 1, 1, 0, NULL, 1, NULL, 1, NULL),
                     HS_ERR_UNSUPPORTED);
    hs_model_cuda_destroy(NULL);
}
END_TEST

/* ---- hs-forward end to end --------------------------------------------- */

static int run(const char *args)
{
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "'%s' %s >/dev/null 2>&1", HS_FORWARD_BIN, args);
    int st = system(cmd);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

START_TEST(hs_forward_writes_the_golden_hidden_states)
{
    make_tmpdir();
    golden_t g;
    golden_open("qwen2", &g);
    char data[512], out[512], args[2048];
    snprintf(data, sizeof data, "%s/data.jsonl", tmpdir);
    snprintf(out, sizeof out, "%s/hs.safetensors", tmpdir);
    FILE *fp = fopen(data, "w");
    for (int s = 0; s < g.n_seqs; s++) {
        fprintf(fp, "{\"input_ids\": [");
        for (int t = g.cu[s]; t < g.cu[s + 1]; t++)
            fprintf(fp, "%s%d", t > g.cu[s] ? ", " : "", g.ids[t]);
        fprintf(fp, "]}\n%s", s == 0 ? "\n" : ""); /* a blank line too */
    }
    fclose(fp);
    /* token budget 20 forces two forward calls (9+... then 17+3) */
    snprintf(args, sizeof args,
             "--model '%s/qwen2' --data '%s' --layers 3,0,2 --device cpu --token-budget 20 "
             "--out '%s'",
             HS_TEST_DATA_DIR, data, out);
    ck_assert_int_eq(run(args), 0);
    hs__st_set_t *st;
    ck_assert_int_eq(hs__st_open_file(out, &st), HS_OK);
    ck_assert_str_eq(hs__st_metadata(st, "layers"), "3,0,2");
    const hs__st_tensor_t *cu = hs__st_find(st, "cu_seqlens");
    ck_assert_ptr_nonnull(cu);
    ck_assert_int_eq(memcmp(cu->data, g.cu, (size_t)(g.n_seqs + 1) * 4), 0);
    const hs__st_tensor_t *ids = hs__st_find(st, "input_ids");
    ck_assert_int_eq(memcmp(ids->data, g.ids, (size_t)g.T * 4), 0);
    int lay[3] = {3, 0, 2};
    for (int j = 0; j < 3; j++) {
        char name[64];
        snprintf(name, sizeof name, "hidden_states.%d", lay[j]);
        const hs__st_tensor_t *t = hs__st_find(st, name);
        ck_assert_ptr_nonnull(t);
        ck_assert_str_eq(t->dtype_name, "F32");
        ck_assert_int_eq(t->shape[0], g.T);
        compare_layer("qwen2 via hs-forward", &g, lay[j], t->data, (size_t)t->shape[1],
                      (int)t->shape[1]);
    }
    hs__st_close(st);

    /* the Qwen3.5 VL wrapper's text decoder through the same binary */
    golden_t gv;
    golden_open("qwen3_5_vl", &gv);
    fp = fopen(data, "w");
    for (int s = 0; s < gv.n_seqs; s++) {
        fprintf(fp, "{\"input_ids\": [");
        for (int t = gv.cu[s]; t < gv.cu[s + 1]; t++)
            fprintf(fp, "%s%d", t > gv.cu[s] ? ", " : "", gv.ids[t]);
        fprintf(fp, "]}\n");
    }
    fclose(fp);
    snprintf(args, sizeof args,
             "--model '%s/qwen3_5_vl' --data '%s' --layers 3,1 --device cpu --token-budget 18 "
             "--out '%s'",
             HS_TEST_DATA_DIR, data, out);
    ck_assert_int_eq(run(args), 0);
    ck_assert_int_eq(hs__st_open_file(out, &st), HS_OK);
    for (int j = 0; j < 2; j++) {
        char name[64];
        snprintf(name, sizeof name, "hidden_states.%d", j ? 1 : 3);
        const hs__st_tensor_t *t = hs__st_find(st, name);
        ck_assert_ptr_nonnull(t);
        compare_layer("qwen3_5_vl via hs-forward", &gv, j ? 1 : 3, t->data, (size_t)t->shape[1],
                      (int)t->shape[1]);
    }
    hs__st_close(st);
    /* on cuda:0 it runs where there is a GPU (tests/kernels/test_forward_cuda
     * checks the numbers); without one, or without CUDA, it says so */
    snprintf(args, sizeof args,
             "--model '%s/qwen3_5_vl' --data '%s' --layers 1 --device cuda:0 --out '%s'",
             HS_TEST_DATA_DIR, data, out);
    int n_gpu = 0;
    if (hs_model_cuda_device_count(&n_gpu) != HS_OK) n_gpu = 0;
    ck_assert_int_eq(run(args), n_gpu > 0 ? 0 : 1);
    hs__st_close(gv.st);
    fp = fopen(data, "w");
    for (int s = 0; s < g.n_seqs; s++) {
        fprintf(fp, "{\"input_ids\": [");
        for (int t = g.cu[s]; t < g.cu[s + 1]; t++)
            fprintf(fp, "%s%d", t > g.cu[s] ? ", " : "", g.ids[t]);
        fprintf(fp, "]}\n");
    }
    fclose(fp);

    /* --dflash-layers on a 3-layer model: too shallow for more than one */
    snprintf(args, sizeof args, "--model '%s/qwen2' --data '%s' --dflash-layers 1 --out '%s'",
             HS_TEST_DATA_DIR, data, out);
    ck_assert_int_eq(run(args), 0);
    ck_assert_int_eq(hs__st_open_file(out, &st), HS_OK);
    ck_assert_ptr_nonnull(hs__st_find(st, "hidden_states.2")); /* 3/2 + 1 */
    hs__st_close(st);

    /* bad flags: exit 2; bad input: exit 1 */
    ck_assert_int_eq(run("--bogus"), 2);
    ck_assert_int_eq(run("--model x --data y"), 2);
    snprintf(args, sizeof args, "--model m --data d --out o --layers 1 --dflash-layers 2");
    ck_assert_int_eq(run(args), 2);
    snprintf(args, sizeof args, "--model m --data d --out o --layers 1,x");
    ck_assert_int_eq(run(args), 2);
    snprintf(args, sizeof args, "--model m --data d --out o --layers 1 --device tpu");
    ck_assert_int_eq(run(args), 2);
    ck_assert_int_eq(run("--help"), 0);
    snprintf(args, sizeof args, "--model '%s/qwen2' --data '%s' --layers 4 --out '%s'",
             HS_TEST_DATA_DIR, data, out);
    ck_assert_int_eq(run(args), 1); /* layer beyond N = 3 */
    fp = fopen(data, "w");
    fprintf(fp, "{\"input_ids\": [1, 2, -3]}\n");
    fclose(fp);
    snprintf(args, sizeof args, "--model '%s/qwen2' --data '%s' --layers 1 --out '%s'",
             HS_TEST_DATA_DIR, data, out);
    ck_assert_int_eq(run(args), 1);
    fp = fopen(data, "w");
    fprintf(fp, "{\"input_ids\": [1, 2, 500]}\n"); /* id beyond the vocabulary */
    fclose(fp);
    ck_assert_int_eq(run(args), 1);
    hs__st_close(g.st);
    remove_tmpdir();
}
END_TEST

/* ---- Qwen3.5 hybrid ------------------------------------------------------ */

/* A sequence's hidden states, every layer, are the same bits whichever
 * sequences are packed before it: the conv window (K - 1 tokens back) and
 * the delta-rule state restart at its first token. Neighbours of 1, 2, 3
 * and 70 tokens end in different tokens, so a window or state carried over
 * a boundary changes the result. */
START_TEST(qwen3_5_sequence_does_not_depend_on_its_packed_neighbours)
{
    const char *fam = _i ? "qwen3_5_i2" : "qwen3_5_i4";
    char dir[512];
    family_dir(fam, dir, sizeof dir);
    hs_model_t *m = NULL;
    ck_assert_int_eq(hs_model_load(dir, &m), HS_OK);
    const int N = hs_model_num_layers(m), H = hs_model_hidden_size(m), k = N + 1, L = 37;
    const int V = hs_model_vocab_size(m);
    int32_t layers[8];
    for (int i = 0; i < k; i++)
        layers[i] = i;
    int32_t ids[80 + 37];
    float *alone = malloc((size_t)L * k * H * sizeof(float));
    float *packed = malloc((size_t)(80 + L) * k * H * sizeof(float));
    for (int t = 0; t < L; t++)
        ids[t] = (t * 7 + 3) % V;
    int32_t cu1[2] = {0, L};
    ck_assert_int_eq(
        hs_model_forward_cpu(m, ids, cu1, 1, layers, k, alone, HS_MODEL_OUT_F32, (size_t)k * H),
        HS_OK);
    const int before[] = {1, 2, 3, 70};
    for (size_t b = 0; b < sizeof before / sizeof before[0]; b++) {
        int P = before[b];
        for (int t = 0; t < P; t++)
            ids[t] = (t * 13 + 5 + (int)b) % V;
        for (int t = 0; t < L; t++)
            ids[P + t] = (t * 7 + 3) % V;
        int32_t cu[3] = {0, P, P + L};
        ck_assert_int_eq(
            hs_model_forward_cpu(m, ids, cu, 2, layers, k, packed, HS_MODEL_OUT_F32, (size_t)k * H),
            HS_OK);
        ck_assert_msg(memcmp(packed + (size_t)P * k * H, alone, (size_t)L * k * H * 4) == 0,
                      "%s: the sequence after a %d-token neighbour differs from it alone", fam, P);
    }
    free(alone);
    free(packed);
    hs_model_destroy(m);
}
END_TEST

/* The VL wrapper's file holds a vision tower and mtp.* tensors in a dtype
 * the loader cannot read as bf16 (F8_E4M3 without block factors); the load
 * takes only model.language_model.*. */
START_TEST(qwen3_5_wrapper_loads_the_text_decoder_and_skips_vision_and_mtp)
{
    char p[512];
    snprintf(p, sizeof p, "%s/qwen3_5_vl/model.safetensors", HS_TEST_DATA_DIR);
    hs__st_set_t *st;
    ck_assert_int_eq(hs__st_open_file(p, &st), HS_OK);
    int visual = 0, mtp = 0, unreadable = 0;
    for (size_t i = 0; i < hs__st_count(st); i++) {
        const hs__st_tensor_t *t = hs__st_at(st, i);
        visual += strncmp(t->name, "model.visual.", 13) == 0;
        if (strncmp(t->name, "mtp.", 4) == 0) {
            mtp++;
            unreadable += t->dtype == HS_ST_OTHER || t->dtype == HS_ST_F8_E4M3;
        }
    }
    ck_assert_int_gt(visual, 0);
    ck_assert_int_eq(mtp, 2);
    ck_assert_int_eq(unreadable, 2);
    hs__st_close(st);
    snprintf(p, sizeof p, "%s/qwen3_5_vl", HS_TEST_DATA_DIR);
    hs_model_t *m = NULL;
    ck_assert_int_eq(hs_model_load(p, &m), HS_OK);
    const hs_model_config_t *c = hs_model_config(m);
    ck_assert_int_eq(c->arch, HS_MODEL_QWEN3_5);
    ck_assert_int_eq(c->vl_wrapper, 1);
    ck_assert_int_eq(c->hidden_size, 24); /* text_config's, not the vision tower's 16 */
    ck_assert_int_eq(c->num_layers, 3);
    hs_model_destroy(m);
}
END_TEST

START_TEST(qwen3_5_load_rejects_a_missing_or_misshapen_deltanet_tensor)
{
    make_tmpdir();
    char dir[512];
    hs_model_t *m = (hs_model_t *)0x1;
    write_family_modified("qwen3_5_i2", "model.layers.2.linear_attn.A_log", NULL, dir, sizeof dir);
    ck_assert_int_eq(hs_model_load(dir, &m), HS_ERR_NOT_FOUND);
    write_family_modified("qwen3_5_i2", NULL, "model.layers.0.linear_attn.conv1d.weight", dir,
                          sizeof dir);
    ck_assert_int_eq(hs_model_load(dir, &m), HS_ERR_FORMAT);
    /* q_proj without its gate half */
    write_family_modified("qwen3_5_i2", NULL, "model.layers.1.self_attn.q_proj.weight", dir,
                          sizeof dir);
    ck_assert_int_eq(hs_model_load(dir, &m), HS_ERR_FORMAT);
    ck_assert_ptr_eq(m, (hs_model_t *)0x1);
    write_family_modified("qwen3_5_i2", NULL, NULL, dir, sizeof dir);
    m = NULL;
    ck_assert_int_eq(hs_model_load(dir, &m), HS_OK);
    hs_model_destroy(m);
    remove_tmpdir();
}
END_TEST

static const char *q35_cfg =
    "{\"architectures\": [\"Qwen3_5ForCausalLM\"], \"model_type\": \"qwen3_5_text\","
    " \"hidden_size\": 64, \"intermediate_size\": 96, \"num_hidden_layers\": 8,"
    " \"num_attention_heads\": 4, \"vocab_size\": 32, \"rms_norm_eps\": 1e-6 %s}";

static hs_status_t parse_q35(const char *tail, hs_model_config_t *c)
{
    char json[4096];
    snprintf(json, sizeof json, q35_cfg, tail);
    return hs__model_config_parse(json, strlen(json), "test/config.json", c);
}

START_TEST(qwen3_5_config_defaults_follow_transformers)
{
    hs_model_config_t c;
    ck_assert_int_eq(parse_q35("", &c), HS_OK);
    ck_assert_int_eq(c.arch, HS_MODEL_QWEN3_5);
    ck_assert_int_eq(c.head_dim, 256); /* Qwen3_5TextConfig's default, not 64 / 4 */
    ck_assert_int_eq(c.num_kv_heads, 4);
    ck_assert_int_eq(c.rotary_dim, 64); /* partial_rotary_factor 0.25 */
    ck_assert_int_eq(c.lin_num_k_heads, 16);
    ck_assert_int_eq(c.lin_num_v_heads, 32);
    ck_assert_int_eq(c.lin_k_head_dim, 128);
    ck_assert_int_eq(c.lin_v_head_dim, 128);
    ck_assert_int_eq(c.lin_conv_kernel, 4);
    ck_assert(c.zero_centered_norm && c.attn_output_gate && c.qk_norm);
    for (int l = 0; l < 8; l++) /* full_attention_interval 4: layers 3 and 7 */
        ck_assert_int_eq(hs_model_layer_is_linear(&c, l), l % 4 != 3);
    ck_assert_int_eq(parse_q35(", \"full_attention_interval\": 2, \"head_dim\": 64, "
                               "\"rope_parameters\": {\"rope_type\": \"default\", \"rope_theta\": "
                               "1e7, \"partial_rotary_factor\": 0.5, \"mrope_section\": [5, 5, 6], "
                               "\"mrope_interleaved\": true}",
                               &c),
                     HS_OK);
    for (int l = 0; l < 8; l++)
        ck_assert_int_eq(hs_model_layer_is_linear(&c, l), l % 2 == 0);
    ck_assert_int_eq(c.rotary_dim, 32);
    ck_assert_float_eq(c.rope_theta, 1e7f);
    /* layer_types wins over the interval, as in transformers */
    ck_assert_int_eq(parse_q35(", \"full_attention_interval\": 2, \"layer_types\": "
                               "[\"full_attention\", \"linear_attention\", \"linear_attention\", "
                               "\"linear_attention\", \"linear_attention\", \"linear_attention\", "
                               "\"linear_attention\", \"full_attention\"], "
                               "\"partial_rotary_factor\": 0.125",
                               &c),
                     HS_OK);
    ck_assert_int_eq(hs_model_layer_is_linear(&c, 0), 0);
    ck_assert_int_eq(hs_model_layer_is_linear(&c, 1), 1);
    ck_assert_int_eq(hs_model_layer_is_linear(&c, 7), 0);
    ck_assert_int_eq(c.rotary_dim, 32); /* top-level partial_rotary_factor 1/8 of 256 */
    /* the wrapper: the decoder's config under text_config */
    const char *vl = "{\"architectures\": [\"Qwen3_5ForConditionalGeneration\"], \"model_type\":"
                     " \"qwen3_5\", \"vision_config\": {\"hidden_size\": 1152, \"depth\": 27},"
                     " \"text_config\": {\"model_type\": \"qwen3_5_text\", \"hidden_size\": 48,"
                     " \"intermediate_size\": 96, \"num_hidden_layers\": 4,"
                     " \"num_attention_heads\": 2, \"num_key_value_heads\": 1, \"head_dim\": 32,"
                     " \"vocab_size\": 40, \"rms_norm_eps\": 1e-6, \"linear_num_key_heads\": 2,"
                     " \"linear_num_value_heads\": 6, \"linear_key_head_dim\": 8,"
                     " \"linear_value_head_dim\": 16, \"dtype\": \"bfloat16\"}}";
    ck_assert_int_eq(hs__model_config_parse(vl, strlen(vl), "vl/config.json", &c), HS_OK);
    ck_assert_int_eq(c.vl_wrapper, 1);
    ck_assert_int_eq(c.hidden_size, 48);
    ck_assert_int_eq(c.rotary_dim, 8);
    ck_assert_int_eq(c.lin_num_v_heads, 6);
    ck_assert_str_eq(c.torch_dtype, "bfloat16");
}
END_TEST

START_TEST(qwen3_5_config_refuses_unsupported_values_naming_the_field)
{
    hs_model_config_t c;
    /* a layer type that is neither, the wrong number of them */
    ck_assert_int_eq(parse_q35(", \"layer_types\": [\"sliding_attention\", \"full_attention\", "
                               "\"full_attention\", \"full_attention\", \"full_attention\", "
                               "\"full_attention\", \"full_attention\", \"full_attention\"]",
                               &c),
                     HS_ERR_UNSUPPORTED);
    ck_assert_int_eq(parse_q35(", \"layer_types\": [\"full_attention\"]", &c), HS_ERR_FORMAT);
    ck_assert_int_eq(parse_q35(", \"full_attention_interval\": 0", &c), HS_ERR_FORMAT);
    ck_assert_int_eq(parse_q35(", \"attn_output_gate\": false", &c), HS_ERR_UNSUPPORTED);
    ck_assert_int_eq(parse_q35(", \"attention_bias\": true", &c), HS_ERR_UNSUPPORTED);
    ck_assert_int_eq(parse_q35(", \"linear_num_key_heads\": 3, \"linear_num_value_heads\": 8", &c),
                     HS_ERR_FORMAT);
    ck_assert_int_eq(parse_q35(", \"linear_conv_kernel_dim\": 0", &c), HS_ERR_FORMAT);
    ck_assert_int_eq(parse_q35(", \"linear_key_head_dim\": 4096", &c), HS_ERR_UNSUPPORTED);
    /* 256 * 0.3 = 76.8 -> 76 is even: fine; 0.07 -> 17 is odd */
    ck_assert_int_eq(parse_q35(", \"partial_rotary_factor\": 0.3", &c), HS_OK);
    ck_assert_int_eq(c.rotary_dim, 76);
    ck_assert_int_eq(parse_q35(", \"partial_rotary_factor\": 0.07", &c), HS_ERR_UNSUPPORTED);
    ck_assert_int_eq(parse_q35(", \"partial_rotary_factor\": 1.5", &c), HS_ERR_FORMAT);
    ck_assert_int_eq(parse_q35(", \"rope_parameters\": {\"rope_type\": \"linear\", \"factor\": 2,"
                               " \"rope_theta\": 1e7}",
                               &c),
                     HS_ERR_UNSUPPORTED);
    ck_assert_int_eq(parse_q35(", \"rope_parameters\": {\"rope_type\": \"default\", \"rope_theta\":"
                               " 1e7, \"mrope_section\": [11, 11, 11]}",
                               &c),
                     HS_ERR_UNSUPPORTED);
    ck_assert_int_eq(parse_q35(", \"rope_parameters\": {\"rope_type\": \"default\", \"rope_theta\":"
                               " 1e7, \"mrope_section\": [16, 16]}",
                               &c),
                     HS_ERR_UNSUPPORTED);
    ck_assert_int_eq(parse_q35(", \"rope_parameters\": {\"rope_type\": \"default\", \"rope_theta\":"
                               " 1e7, \"mrope_interleaved\": 1}",
                               &c),
                     HS_ERR_FORMAT);
    const char *moe_text = "{\"architectures\": [\"Qwen3_5ForCausalLM\"], \"model_type\":"
                           " \"qwen3_5_moe_text\", \"hidden_size\": 64, \"intermediate_size\": 96,"
                           " \"num_hidden_layers\": 8, \"num_attention_heads\": 4,"
                           " \"vocab_size\": 32, \"rms_norm_eps\": 1e-6}";
    ck_assert_int_eq(hs__model_config_parse(moe_text, strlen(moe_text), "x", &c),
                     HS_ERR_UNSUPPORTED);
    ck_assert_int_eq(parse_q35(", \"hidden_act\": \"gelu\"", &c), HS_ERR_UNSUPPORTED);
    const char *deep = "{\"architectures\": [\"Qwen3_5ForCausalLM\"], \"hidden_size\": 64,"
                       " \"intermediate_size\": 96, \"num_hidden_layers\": 300,"
                       " \"num_attention_heads\": 4, \"vocab_size\": 32, \"rms_norm_eps\": 1e-6}";
    ck_assert_int_eq(hs__model_config_parse(deep, strlen(deep), "x", &c), HS_ERR_UNSUPPORTED);
    const char *no_text = "{\"architectures\": [\"Qwen3_5ForConditionalGeneration\"],"
                          " \"hidden_size\": 64}";
    ck_assert_int_eq(hs__model_config_parse(no_text, strlen(no_text), "x", &c), HS_ERR_FORMAT);
    const char *moe = "{\"architectures\": [\"Qwen3_5MoeForConditionalGeneration\"]}";
    ck_assert_int_eq(hs__model_config_parse(moe, strlen(moe), "x", &c), HS_ERR_UNSUPPORTED);
}
END_TEST

/* The Qwen3.6-27B text decoder as its config.json gives it (in the VL
 * wrapper): 64 layers, every 4th full attention, DFlash's five layers. */
static const char *q36_27b =
    "{\"architectures\": [\"Qwen3_5ForConditionalGeneration\"], \"model_type\": \"qwen3_5\","
    " \"text_config\": {\"model_type\": \"qwen3_5_text\", \"attn_output_gate\": true,"
    " \"full_attention_interval\": 4, \"head_dim\": 256, \"hidden_act\": \"silu\","
    " \"hidden_size\": 5120, \"intermediate_size\": 17408, \"linear_conv_kernel_dim\": 4,"
    " \"linear_key_head_dim\": 128, \"linear_num_key_heads\": 16, \"linear_num_value_heads\": 48,"
    " \"linear_value_head_dim\": 128, \"num_attention_heads\": 24, \"num_hidden_layers\": 64,"
    " \"num_key_value_heads\": 4, \"rms_norm_eps\": 1e-06, \"vocab_size\": 248320,"
    " \"tie_word_embeddings\": false, \"rope_parameters\": {\"mrope_interleaved\": true,"
    " \"mrope_section\": [11, 11, 10], \"rope_type\": \"default\", \"rope_theta\": 10000000,"
    " \"partial_rotary_factor\": 0.25}}, \"vision_config\": {\"depth\": 27}}";

START_TEST(qwen3_6_27b_config_layers_and_dflash_set)
{
    hs_model_config_t c;
    ck_assert_int_eq(hs__model_config_parse(q36_27b, strlen(q36_27b), "27b/config.json", &c),
                     HS_OK);
    ck_assert_int_eq(c.num_layers, 64);
    ck_assert_int_eq(c.rotary_dim, 64);
    int full = 0;
    for (int l = 0; l < 64; l++) {
        ck_assert_int_eq(hs_model_layer_is_linear(&c, l), l % 4 != 3); /* 3, 7, ..., 63 full */
        full += !hs_model_layer_is_linear(&c, l);
    }
    ck_assert_int_eq(full, 16);
    int32_t l[8];
    ck_assert_int_eq(hs_model_dflash_layers(c.num_layers, 5, l, 8), HS_OK);
    int32_t want[5] = {2, 17, 32, 47, 62}; /* DFlash's target_layer_ids 1, 16, 31, 46, 61 */
    for (int i = 0; i < 5; i++)
        ck_assert_int_eq(l[i], want[i]);
    /* FLOPs: a Gated DeltaNet layer counts its own projections, not q/k/v/o */
    const int32_t cu[2] = {0, 1024};
    double H = 5120, I = 17408, ch = 2 * 16 * 128 + 48 * 128, vd = 48 * 128;
    double lin = 2 * (H * (ch + vd + 2 * 48) + vd * H + 3 * H * I) * 1024 +
                 (2 * 4 * ch + 6 * 48 * 128 * 128) * 1024.0;
    double q = 24 * 256, kv = 4 * 256;
    double att = 2 * (H * (2 * q + 2 * kv) + q * H + 3 * H * I) * 1024 +
                 4.0 * 24 * 256 * (1024.0 * 1025 / 2);
    ck_assert_double_eq_tol(hs_model_forward_flops(&c, 4, cu, 1), 3 * lin + att, 1.0);
    ck_assert_double_eq_tol(hs_model_forward_flops(&c, 64, cu, 1), 48 * lin + 16 * att, 16.0);
}
END_TEST

/* ---- Qwen3.5 kernels' C twins -------------------------------------------- */

START_TEST(zero_centred_rmsnorm_scales_by_one_plus_the_weight)
{
    float x[2 * 4] = {3, 3, 3, 3, -2, -2, -2, -2}, y[8];
    uint16_t w[4];
    for (int i = 0; i < 4; i++)
        w[i] = hs_f32_to_bf16(0.25f * (float)i - 0.5f);
    hs_kn_rmsnorm_zc_ref(x, w, y, 2, 4, 0.0f);
    for (int i = 0; i < 4; i++) {
        ck_assert_float_eq_tol(y[i], 1.0f + (0.25f * (float)i - 0.5f), 1e-6);
        ck_assert_float_eq_tol(y[4 + i], -(1.0f + (0.25f * (float)i - 0.5f)), 1e-6);
    }
}
END_TEST

START_TEST(partial_rope_rotates_the_first_dims_and_passes_the_rest)
{
    /* 2 heads of 10 dims, rotary 4; the rotated part equals full rope on a
     * 4-dim head, dims 4..9 unchanged */
    int d = 10, rd = 4, nh = 2, T = 5;
    float x[5 * 20], sub[5 * 8], inv[2];
    for (int i = 0; i < T * nh * d; i++)
        x[i] = sinf(0.37f * (float)i) + 0.1f;
    for (int t = 0; t < T; t++)
        for (int h = 0; h < nh; h++)
            for (int i = 0; i < rd; i++)
                sub[(t * nh + h) * rd + i] = x[(t * nh + h) * d + i];
    float orig[5 * 20];
    memcpy(orig, x, sizeof x);
    hs_kn_rope_inv_freq(rd, 1e7f, NULL, inv);
    int32_t cu[3] = {0, 2, 5};
    hs_kn_rope_partial_ref(x, cu, 2, nh, d, rd, inv);
    hs_kn_rope_ref(sub, cu, 2, nh, rd, inv);
    for (int t = 0; t < T; t++)
        for (int h = 0; h < nh; h++)
            for (int i = 0; i < d; i++) {
                float want = i < rd ? sub[(t * nh + h) * rd + i] : orig[(t * nh + h) * d + i];
                ck_assert_float_eq(x[(t * nh + h) * d + i], want);
            }
    /* position 0 of each sequence is untouched */
    for (int i = 0; i < nh * d; i++) {
        ck_assert_float_eq(x[i], orig[i]);
        ck_assert_float_eq(x[2 * nh * d + i], orig[2 * nh * d + i]);
    }
}
END_TEST

START_TEST(causal_conv1d_restarts_its_window_at_each_sequence)
{
    /* 3 channels, kernel 3, sequences of 4, 1 and 3 tokens */
    int C = 3, K = 3, T = 8;
    int32_t cu[4] = {0, 4, 5, 8};
    float x[8 * 3], y[8 * 3], ys[8 * 3];
    uint16_t w[3 * 3];
    for (int i = 0; i < T * C; i++)
        x[i] = cosf(0.9f * (float)i);
    for (int i = 0; i < C * K; i++)
        w[i] = hs_f32_to_bf16(0.5f - 0.125f * (float)i);
    hs_kn_causal_conv1d_ref(x, w, y, cu, 3, C, K, 0);
    hs_kn_causal_conv1d_ref(x, w, ys, cu, 3, C, K, 1);
    for (int s = 0; s < 3; s++)
        for (int t = cu[s]; t < cu[s + 1]; t++)
            for (int c = 0; c < C; c++) {
                double acc = 0;
                for (int j = 0; j < K; j++) {
                    int src = t - (K - 1) + j;
                    if (src >= cu[s]) acc += (double)hs_bf16_to_f32(w[c * K + j]) * x[src * C + c];
                }
                ck_assert_double_eq_tol(y[t * C + c], acc, 1e-6);
                ck_assert_double_eq_tol(ys[t * C + c], acc / (1 + exp(-acc)), 1e-6);
            }
    /* the one-token sequence sees only itself: the last tap */
    for (int c = 0; c < C; c++)
        ck_assert_float_eq_tol(y[4 * C + c], hs_bf16_to_f32(w[c * K + 2]) * x[4 * C + c], 1e-7);
}
END_TEST

START_TEST(gdn_gates_are_sigmoid_and_scaled_softplus)
{
    float A_log[3] = {0.0f, logf(2.0f), -1.0f}, dt[3] = {0.5f, -0.5f, 0.0f};
    float a[2 * 3] = {-0.5f, 0.5f, 25.0f, 1.0f, -3.0f, 0.0f};
    float b[2 * 3] = {0.0f, 40.0f, -40.0f, 1.0f, -1.0f, 2.0f}, g[6], beta[6];
    hs_kn_gdn_gates_ref(a, b, A_log, dt, g, beta, 2, 3);
    ck_assert_float_eq_tol(g[0], -logf(2.0f), 1e-6);          /* softplus(0) = ln 2 */
    ck_assert_float_eq_tol(g[1], -2.0f * logf(2.0f), 1e-6);   /* A = 2 */
    ck_assert_float_eq_tol(g[2], -expf(-1.0f) * 25.0f, 1e-5); /* above 20: x itself */
    ck_assert_float_eq_tol(g[3], -log1pf(expf(1.5f)), 1e-6);
    ck_assert_float_eq_tol(g[4], -2.0f * log1pf(expf(-3.5f)), 1e-6);
    ck_assert_float_eq_tol(beta[0], 0.5f, 1e-7);
    ck_assert_float_eq_tol(beta[1], 1.0f, 1e-7);
    ck_assert_float_eq_tol(beta[2], 0.0f, 1e-7);
    ck_assert_float_eq_tol(beta[5], 1.0f / (1.0f + expf(-2.0f)), 1e-7);
}
END_TEST

/* The delta rule in double precision, straight from its definition. */
static void delta_rule_double(const float *q, const float *k, const float *v, int stride,
                              const float *g, const float *beta, double *out, const int32_t *cu,
                              int n_seqs, int nk, int nv, int dk, int dv)
{
    double S[8][8], qn[8], kn[8];
    for (int s = 0; s < n_seqs; s++)
        for (int h = 0; h < nv; h++) {
            int hk = h / (nv / nk);
            memset(S, 0, sizeof S);
            for (int t = cu[s]; t < cu[s + 1]; t++) {
                double sq = 0, sk = 0;
                for (int i = 0; i < dk; i++) {
                    sq += (double)q[t * stride + hk * dk + i] * q[t * stride + hk * dk + i];
                    sk += (double)k[t * stride + hk * dk + i] * k[t * stride + hk * dk + i];
                }
                for (int i = 0; i < dk; i++) {
                    qn[i] = q[t * stride + hk * dk + i] / sqrt(sq + 1e-6) / sqrt((double)dk);
                    kn[i] = k[t * stride + hk * dk + i] / sqrt(sk + 1e-6);
                }
                double dec = exp(g[t * nv + h]);
                for (int i = 0; i < dk; i++)
                    for (int j = 0; j < dv; j++)
                        S[i][j] *= dec;
                for (int j = 0; j < dv; j++) {
                    double pred = 0;
                    for (int i = 0; i < dk; i++)
                        pred += S[i][j] * kn[i];
                    double u = beta[t * nv + h] * (v[t * stride + h * dv + j] - pred);
                    for (int i = 0; i < dk; i++)
                        S[i][j] += kn[i] * u;
                }
                for (int j = 0; j < dv; j++) {
                    double o = 0;
                    for (int i = 0; i < dk; i++)
                        o += S[i][j] * qn[i];
                    out[t * nv * dv + h * dv + j] = o;
                }
            }
        }
}

START_TEST(delta_rule_matches_its_definition_per_sequence_and_value_head)
{
    /* 1 key head of 5 dims shared by 3 value heads of 7; sequences of 9, 1
     * and 4 tokens; q, k, v interleaved in rows of stride 5 + 5 + 21 */
    enum { NK = 1, NV = 3, DK = 5, DV = 7, T = 14, STRIDE = 2 * NK * DK + NV * DV };
    int32_t cu[4] = {0, 9, 10, 14};
    float rows[T * STRIDE], g[T * NV], beta[T * NV], out[T * NV * DV];
    double want[T * NV * DV];
    uint64_t seed = 11;
    for (int i = 0; i < T * STRIDE; i++)
        rows[i] = (float)(hs_splitmix64(&seed) % 2001) / 1000.0f - 1;
    for (int i = 0; i < T * NV; i++) {
        g[i] = -(float)(hs_splitmix64(&seed) % 1001) / 1000.0f;
        beta[i] = (float)(hs_splitmix64(&seed) % 1001) / 1000.0f;
    }
    ck_assert_int_eq(hs_kn_delta_rule_ref(rows, rows + NK * DK, rows + 2 * NK * DK, STRIDE, g, beta,
                                          out, cu, 3, NK, NV, DK, DV),
                     0);
    delta_rule_double(rows, rows + NK * DK, rows + 2 * NK * DK, STRIDE, g, beta, want, cu, 3, NK,
                      NV, DK, DV);
    for (int i = 0; i < T * NV * DV; i++)
        ck_assert_double_eq_tol(out[i], want[i], 1e-5);
    /* a one-token sequence: o = beta (k~ . q~) v */
    int t = 9;
    for (int h = 0; h < NV; h++) {
        double sq = 0, sk = 0, dot = 0;
        for (int i = 0; i < DK; i++) {
            sq += (double)rows[t * STRIDE + i] * rows[t * STRIDE + i];
            sk += (double)rows[t * STRIDE + DK + i] * rows[t * STRIDE + DK + i];
            dot += (double)rows[t * STRIDE + i] * rows[t * STRIDE + DK + i];
        }
        dot /= sqrt(sq + 1e-6) * sqrt(sk + 1e-6) * sqrt((double)DK);
        for (int j = 0; j < DV; j++)
            ck_assert_double_eq_tol(out[t * NV * DV + h * DV + j],
                                    beta[t * NV + h] * dot * rows[t * STRIDE + 2 * DK + h * DV + j],
                                    1e-6);
    }
}
END_TEST

START_TEST(gated_rmsnorm_and_sigmoid_gate_closed_forms)
{
    float x[2 * 3] = {2, 2, 2, -4, -4, -4}, z[6] = {0, 1, -1, 30, 2, -30}, y[6];
    uint16_t w[3] = {hs_f32_to_bf16(1.0f), hs_f32_to_bf16(0.5f), hs_f32_to_bf16(2.0f)};
    hs_kn_rmsnorm_gated_ref(x, z, w, y, 2, 3, 0.0f);
    const float wf[3] = {1.0f, 0.5f, 2.0f};
    for (int r = 0; r < 2; r++)
        for (int i = 0; i < 3; i++) {
            float zi = z[r * 3 + i], sign = r ? -1.0f : 1.0f;
            ck_assert_float_eq_tol(y[r * 3 + i], sign * wf[i] * zi / (1.0f + expf(-zi)), 1e-5);
        }
    float a[4] = {3.0f, -2.0f, 5.0f, 1.0f}, gate[4] = {0.0f, 40.0f, -40.0f, 1.0f};
    hs_kn_sigmoid_gate_ref(a, gate, 4);
    ck_assert_float_eq_tol(a[0], 1.5f, 1e-7);
    ck_assert_float_eq_tol(a[1], -2.0f, 1e-7);
    ck_assert_float_eq_tol(a[2], 0.0f, 1e-7);
    ck_assert_float_eq_tol(a[3], 1.0f / (1.0f + expf(-1.0f)), 1e-7);
}
END_TEST

static Suite *model_suite(void)
{
    Suite *s = suite_create("model");
    TCase *tc = tcase_create("golden");
    tcase_set_timeout(tc, 60);
    tcase_add_loop_test(tc, cpu_forward_matches_transformers_layer_by_layer, 0, N_FAMILIES);
    tcase_add_loop_test(tc, forward_writes_only_its_column_slice_and_bf16_is_rounded_fp32, 0,
                        N_FAMILIES);
    tcase_add_loop_test(tc, packed_sequences_equal_each_sequence_run_alone, 0, N_FAMILIES);
    tcase_add_loop_test(tc, cpu_forward_allocates_its_work_buffers_once, 0, N_FAMILIES);
    tcase_add_test(tc, forward_rejects_bad_ids_layers_and_cu_seqlens);
    tcase_add_loop_test(tc, qwen3_5_sequence_does_not_depend_on_its_packed_neighbours, 0, 2);
    suite_add_tcase(s, tc);

    tc = tcase_create("qwen3_5");
    tcase_add_test(tc, qwen3_5_wrapper_loads_the_text_decoder_and_skips_vision_and_mtp);
    tcase_add_test(tc, qwen3_5_load_rejects_a_missing_or_misshapen_deltanet_tensor);
    tcase_add_test(tc, qwen3_5_config_defaults_follow_transformers);
    tcase_add_test(tc, qwen3_5_config_refuses_unsupported_values_naming_the_field);
    tcase_add_test(tc, qwen3_6_27b_config_layers_and_dflash_set);
    tcase_add_test(tc, zero_centred_rmsnorm_scales_by_one_plus_the_weight);
    tcase_add_test(tc, partial_rope_rotates_the_first_dims_and_passes_the_rest);
    tcase_add_test(tc, causal_conv1d_restarts_its_window_at_each_sequence);
    tcase_add_test(tc, gdn_gates_are_sigmoid_and_scaled_softplus);
    tcase_add_test(tc, delta_rule_matches_its_definition_per_sequence_and_value_head);
    tcase_add_test(tc, gated_rmsnorm_and_sigmoid_gate_closed_forms);
    suite_add_tcase(s, tc);

    tc = tcase_create("loading");
    tcase_add_test(tc, config_defaults_follow_transformers);
    tcase_add_test(tc, config_reads_legacy_and_new_rope_fields);
    tcase_add_test(tc, config_rejects_unknown_architecture_and_missing_fields);
    tcase_add_test(tc, config_float_fields_must_fit_a_float);
    tcase_add_test(tc, load_rejects_missing_tensor_and_wrong_shape);
    tcase_add_test(tc, load_rejects_truncated_file_and_unknown_architecture);
    tcase_add_test(tc, safetensors_bounds_checks_every_header_field);
    tcase_add_test(tc, safetensors_converts_f16_and_f32_to_bf16);
    tcase_add_test(tc, non_finite_weights_are_refused_naming_the_tensor);
    tcase_add_test(tc, model_with_a_nan_weight_is_refused_by_load_and_hs_forward);
    tcase_add_test(tc, sharded_index_naming_a_shard_without_the_tensor_is_rejected);
    suite_add_tcase(s, tc);

    tc = tcase_create("kernels");
    tcase_add_test(tc, rmsnorm_of_a_constant_row_is_the_weight_times_its_sign);
    tcase_add_test(tc, rope_is_identity_at_position_zero_and_a_rotation_after);
    tcase_add_test(tc, llama3_rope_scaling_keeps_high_divides_low_and_blends_between);
    tcase_add_test(tc, attention_of_a_single_token_is_its_value_per_kv_group);
    tcase_add_test(tc, attention_with_equal_keys_averages_the_visible_values);
    tcase_add_test(tc, attention_matches_a_two_pass_softmax);
    tcase_add_test(tc, matmul_matches_a_double_precision_dot_with_bias);
    tcase_add_test(tc, swiglu_residual_and_embedding_closed_forms);
    tcase_add_test(tc, bf16_rounds_to_nearest_even);
    suite_add_tcase(s, tc);

    tc = tcase_create("layers");
    tcase_add_test(tc, dflash_layers_are_dflash_target_layer_ids_plus_one);
    tcase_add_test(tc, eagle3_layers_are_vllm_aux_layer_ids_plus_the_final_normed_state);
    tcase_add_test(tc, cuda_entry_points_say_unsupported_without_cuda);
    suite_add_tcase(s, tc);

    tc = tcase_create("hs_forward");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, hs_forward_writes_the_golden_hidden_states);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(model_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
