/* SPDX-License-Identifier: Apache-2.0 */
/* test_forward_fp8_cuda.c - the CUDA forward on FP8 weights: tiny models
 * of the test families block-quantised by tests/model/make_fp8_checkpoint.py
 * (numpy), run on the GPU (FP8 GEMMs through cuBLASLt, activations
 * quantised per token and 128 columns) against the CPU forward of the
 * dequantised weights (fp32, unquantised activations), layer by layer; and
 * --dtype fp8 on the bf16 checkpoint against the CPU forward of the same
 * model. Per layer it prints ||gpu - ref|| / ||ref||: activation
 * quantisation (e4m3, 3 mantissa bits) costs a few percent, so the bound is
 * 0.08 (a wrong block factor, layout or transposition gives O(1)). The
 * tiny families' K (< 128) are not whole 128-blocks: their FP8 weights run
 * as bf16 GEMMs (the fallback, dequantised at upload), which this checks
 * end to end; the FP8 GEMMs themselves are checked by test_fp8_block_cuda
 * and, in a whole forward, by scripts/bench/fp8_parity.py (hidden 512). Before any GPU call, the
 * planned device bytes (what --preflight and --token-budget auto use) must shrink with FP8 weights.
 * Exits 77 without a GPU or without numpy. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cuda_runtime_api.h>

#include "hs_float.h"
#include "cuda_test_main.h"
#include "hs_model.h"
#include "safetensors_int.h"
#include "hs_shuffle.h"

#ifndef HS_TEST_DATA_DIR
#error "HS_TEST_DATA_DIR must point at tests/data"
#endif
#ifndef HS_FP8_SCRIPT
#error "HS_FP8_SCRIPT must name tests/model/make_fp8_checkpoint.py"
#endif

#ifndef HS_FP8_WORK
#error "HS_FP8_WORK must name a folder for the checkpoints (in the build tree)"
#endif

/* "wide": a random bf16 Llama whose Linear widths are whole 128-blocks
 * (H 256, I 512, 2 heads of 128, 1 kv head, 2 layers, vocab 96), so its FP8
 * weights do run as FP8 GEMMs; written into HS_FP8_WORK/wide. */
static void write_wide(char *dir, size_t cap)
{
    enum { H = 256, I = 512, L = 2, V = 96, KV = 128 };
    snprintf(dir, cap, "%s/wide", HS_FP8_WORK);
    char cmd[600], path[600];
    snprintf(cmd, sizeof cmd, "mkdir -p %s", dir);
    ck_assert_int_eq(system(cmd), 0);
    snprintf(path, sizeof path, "%s/config.json", dir);
    FILE *f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    fprintf(f,
            "{\"architectures\": [\"LlamaForCausalLM\"], \"hidden_size\": %d, "
            "\"intermediate_size\": %d, \"num_hidden_layers\": %d, \"num_attention_heads\": 2, "
            "\"num_key_value_heads\": 1, \"head_dim\": 128, \"vocab_size\": %d, "
            "\"rms_norm_eps\": 1e-5, \"rope_theta\": 10000.0, \"hidden_act\": \"silu\"}\n",
            H, I, L, V);
    fclose(f);
    static const struct {
        const char *name;
        int rows, cols;
    } shapes[] = {{"self_attn.q_proj.weight", H, H},        {"self_attn.k_proj.weight", KV, H},
                  {"self_attn.v_proj.weight", KV, H},       {"self_attn.o_proj.weight", H, H},
                  {"mlp.gate_proj.weight", I, H},           {"mlp.up_proj.weight", I, H},
                  {"mlp.down_proj.weight", H, I},           {"input_layernorm.weight", 1, H},
                  {"post_attention_layernorm.weight", 1, H}};
    enum { PER = sizeof shapes / sizeof shapes[0], NT = 2 + L * PER };
    hs__st_write_tensor_t t[NT];
    char names[NT][96];
    uint16_t *bufs[NT];
    uint64_t rng = 0xd1ce;
    for (int i = 0; i < NT; i++) {
        int rows = i == 0 ? V : 1, cols = H, norm = i == 1;
        if (i >= 2) {
            int k = (i - 2) % PER;
            snprintf(names[i], sizeof names[i], "model.layers.%d.%s", (i - 2) / PER,
                     shapes[k].name);
            rows = shapes[k].rows;
            cols = shapes[k].cols;
            norm = k >= 7;
        } else {
            snprintf(names[i], sizeof names[i],
                     i == 0 ? "model.embed_tokens.weight" : "model.norm.weight");
        }
        bufs[i] = malloc((size_t)rows * cols * 2);
        for (int j = 0; j < rows * cols; j++) {
            double u = (double)(hs_splitmix64(&rng) >> 11) / 9007199254740992.0 - 0.5;
            bufs[i][j] =
                hs_f32_to_bf16(norm ? 1.0f + 0.2f * (float)u : (i == 0 ? 2.0f : 0.15f) * (float)u);
        }
        t[i] = (hs__st_write_tensor_t){.name = names[i],
                                       .dtype = "BF16",
                                       .ndim = rows == 1 ? 1 : 2,
                                       .shape = {rows == 1 ? cols : rows, cols},
                                       .data = bufs[i],
                                       .rows = 1,
                                       .row_bytes = (size_t)rows * cols * 2};
    }
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    ck_assert_int_eq(hs__st_write(path, t, NT, NULL, NULL, 0), HS_OK);
    for (int i = 0; i < NT; i++)
        free(bufs[i]);
}

/* The FP8 checkpoint and dequantised twin of family fam (tests/data, or
 * "wide"), written afresh by every run into HS_FP8_WORK (kept for a look). */
static void make_checkpoint(const char *fam, char *fp8, char *deq, size_t cap)
{
    char src[600];
    if (strcmp(fam, "wide") == 0)
        write_wide(src, sizeof src);
    else
        snprintf(src, sizeof src, "%s/%s", HS_TEST_DATA_DIR, fam);
    snprintf(fp8, cap, "%s/%s-fp8", HS_FP8_WORK, fam);
    snprintf(deq, cap, "%s/%s-deq", HS_FP8_WORK, fam);
    char cmd[1600];
    snprintf(cmd, sizeof cmd, "python3 %s %s %s %s", HS_FP8_SCRIPT, src, fp8, deq);
    ck_assert_msg(system(cmd) == 0, "%s failed", cmd);
}

enum { T = 61, NSEQ = 3 };
static const int32_t k_cu[NSEQ + 1] = {0, 17, 18, 61}; /* 17, 1 and 43 tokens */

/* The batch: token ids, every layer 0..N, and the output row length. */
static size_t batch_for(const hs_model_t *m, int32_t *ids, int32_t *layers)
{
    for (int t = 0; t < T; t++)
        ids[t] = (t * 131 + 7) % hs_model_vocab_size(m);
    for (int l = 0; l <= hs_model_num_layers(m); l++)
        layers[l] = l;
    return (size_t)(hs_model_num_layers(m) + 1) * hs_model_hidden_size(m);
}

/* Every layer 0..N on the GPU, bf16 out, as floats [T, (N+1) H]. */
static float *run_gpu(hs_model_t *m)
{
    const int N = hs_model_num_layers(m);
    int32_t ids[T], layers[64];
    const size_t row = batch_for(m, ids, layers);
    hs_model_cuda_t *mc = NULL;
    ck_assert_int_eq(hs_model_cuda_create(m, 0, T, NSEQ, &mc), HS_OK);
    void *d_ids, *d_cu, *d_out;
    ck_assert_int_eq(cudaMalloc(&d_ids, sizeof ids), cudaSuccess);
    ck_assert_int_eq(cudaMalloc(&d_cu, sizeof k_cu), cudaSuccess);
    ck_assert_int_eq(cudaMalloc(&d_out, T * row * 2), cudaSuccess);
    cudaMemcpy(d_ids, ids, sizeof ids, cudaMemcpyHostToDevice);
    cudaMemcpy(d_cu, k_cu, sizeof k_cu, cudaMemcpyHostToDevice);
    ck_assert_int_eq(
        hs_model_cuda_forward(mc, d_ids, d_cu, NSEQ, T, 0, layers, N + 1, d_out, row, NULL), HS_OK);
    uint16_t *b = malloc(T * row * 2);
    float *f = malloc(T * row * sizeof(float));
    ck_assert_int_eq(cudaMemcpy(b, d_out, T * row * 2, cudaMemcpyDeviceToHost), cudaSuccess);
    for (size_t i = 0; i < T * row; i++)
        f[i] = hs_bf16_to_f32(b[i]);
    free(b);
    cudaFree(d_ids);
    cudaFree(d_cu);
    cudaFree(d_out);
    hs_model_cuda_destroy(mc);
    return f;
}

static float *run_cpu(hs_model_t *m)
{
    const int N = hs_model_num_layers(m);
    int32_t ids[T], layers[64];
    const size_t row = batch_for(m, ids, layers);
    float *f = malloc(T * row * sizeof(float));
    ck_assert_int_eq(
        hs_model_forward_cpu(m, ids, k_cu, NSEQ, layers, N + 1, f, HS_MODEL_OUT_F32, row), HS_OK);
    return f;
}

static void compare(const char *what, hs_model_t *gm, hs_model_t *cm, double bound)
{
    const int N = hs_model_num_layers(gm), H = hs_model_hidden_size(gm);
    float *g = run_gpu(gm), *c = run_cpu(cm);
    for (int l = 0; l <= N; l++) {
        double num = 0, den = 0;
        for (int t = 0; t < T; t++)
            for (int i = 0; i < H; i++) {
                size_t k = (size_t)t * (N + 1) * H + (size_t)l * H + i;
                num += ((double)g[k] - c[k]) * ((double)g[k] - c[k]);
                den += (double)c[k] * c[k];
            }
        double rel = sqrt(num / (den > 0 ? den : 1));
        printf("%s: layer %d: ||gpu - cpu|| / ||cpu|| = %.4f (bound %.3f)\n", what, l, rel, bound);
        ck_assert_msg(rel <= bound, "%s: layer %d off by %g relative", what, l, rel);
    }
    free(g);
    free(c);
}

/* wide: FP8 GEMMs; the tiny families' K (< 128): the bf16 fallback */
static const char *const k_families[] = {"wide",       "qwen2",      "qwen3",
                                         "qwen3_5_i4", "qwen3_5_vl", "llama3"};

START_TEST(fp8_checkpoint_on_the_gpu_matches_the_dequantised_cpu_forward)
{
    const char *fam = k_families[_i];
    char fp8[512], deq[512];
    make_checkpoint(fam, fp8, deq, sizeof fp8);
    hs_model_t *mf = NULL, *md = NULL;
    ck_assert_int_eq(hs_model_load(fp8, &mf), HS_OK);
    ck_assert_int_eq(hs_model_load(deq, &md), HS_OK);
    compare(fam, mf, md, 0.08);
    hs_model_destroy(mf);
    hs_model_destroy(md);
}
END_TEST

START_TEST(dtype_fp8_on_the_gpu_matches_its_cpu_forward)
{
    char src[512], what[64];
    if (strcmp(k_families[_i], "wide") == 0)
        write_wide(src, sizeof src);
    else
        snprintf(src, sizeof src, "%s/%s", HS_TEST_DATA_DIR, k_families[_i]);
    snprintf(what, sizeof what, "%s --dtype fp8", k_families[_i]);
    hs_model_t *m = NULL;
    ck_assert_int_eq(hs_model_load_ex(src, HS_MODEL_WEIGHTS_FP8, &m), HS_OK);
    compare(what, m, m, 0.08);
    hs_model_destroy(m);
}
END_TEST

/* No GPU needed: hs_model_cuda_plan_bytes is host arithmetic. The wide
 * model's Linear weights are 2 x 589,824 bf16 values: FP8 must save at
 * least 40% of their 2.4 MB, net of the factors and the quantised
 * activations. */
START_TEST(planned_bytes_shrink_with_fp8_weights)
{
    char fp8[512], deq[512];
    make_checkpoint("wide", fp8, deq, sizeof fp8);
    hs_model_t *b = NULL, *f = NULL;
    uint64_t pb = 0, pf = 0;
    ck_assert_int_eq(hs_model_load(deq, &b), HS_OK);
    ck_assert_int_eq(hs_model_load(fp8, &f), HS_OK);
    ck_assert_int_eq(hs_model_cuda_plan_bytes(b, 64, 4, -1, &pb), HS_OK);
    ck_assert_int_eq(hs_model_cuda_plan_bytes(f, 64, 4, -1, &pf), HS_OK);
    printf("planned device bytes, wide model at 64 tokens: bf16 %llu, fp8 %llu (saves %llu)\n",
           (unsigned long long)pb, (unsigned long long)pf, (unsigned long long)(pb - pf));
    ck_assert_uint_gt(pb, pf + (uint64_t)(0.4 * 2 * 589824 * 2));
    /* its parts: the weights shrink, and they add up to the total */
    hs_model_cuda_plan_t parts_b, parts_f;
    ck_assert_int_eq(hs_model_cuda_plan(b, 64, 4, -1, &parts_b), HS_OK);
    ck_assert_int_eq(hs_model_cuda_plan(f, 64, 4, -1, &parts_f), HS_OK);
    ck_assert_uint_eq(parts_f.weights + parts_f.activations + parts_f.workspace, pf);
    ck_assert_uint_eq(parts_b.weights + parts_b.activations + parts_b.workspace, pb);
    ck_assert_uint_lt(parts_f.weights + (uint64_t)(0.4 * 2 * 589824), parts_b.weights);
    hs_model_destroy(b);
    hs_model_destroy(f);
}
END_TEST

static int run_suite(int gpu)
{
    Suite *s = suite_create("forward_fp8_cuda");
    TCase *tc = tcase_create("fp8");
    tcase_set_timeout(tc, 300);
    const int nf = (int)(sizeof k_families / sizeof k_families[0]);
    tcase_add_test(tc, planned_bytes_shrink_with_fp8_weights);
    if (gpu) {
        tcase_add_loop_test(tc, fp8_checkpoint_on_the_gpu_matches_the_dequantised_cpu_forward, 0,
                            nf);
        tcase_add_loop_test(tc, dtype_fp8_on_the_gpu_matches_its_cpu_forward, 0, nf);
    }
    suite_add_tcase(s, tc);
    return cuda_test_run(s);
}

int main(void)
{
    if (system("python3 -c 'import numpy' >/dev/null 2>&1") != 0) {
        printf("test_forward_fp8_cuda: python3 with numpy not found: skipped\n");
        return 77;
    }
    int n_dev = 0;
    struct cudaDeviceProp prop;
    int gpu = cudaGetDeviceCount(&n_dev) == cudaSuccess && n_dev > 0 &&
              cudaGetDeviceProperties(&prop, 0) == cudaSuccess && prop.major == 9;
    if (!gpu)
        printf("test_forward_fp8_cuda: no sm_90 CUDA device (FP8 block-scaled GEMMs need one): "
               "only the planned bytes are checked\n");
    if (run_suite(gpu)) return 1;
    return gpu ? 0 : 77;
}
