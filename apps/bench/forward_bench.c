/* SPDX-License-Identifier: Apache-2.0 */
/* forward_bench.c - hs-bench-forward: times the CUDA forward of a model
 * folder at several batch shapes (n_seqs x seq_len) and prints one JSON
 * line per shape: tokens/s, us/token, MFU, peak memory. Used by
 * scripts/bench/forward; the same measurement as the producer's preflight.
 *
 *   hs-bench-forward --model DIR --layers 2,16,29 \
 *       --shapes 64x1024,16x4096,8x8192 [--iters 5] [--device 0] [--peak-tflops 989.4]
 *
 * --attn-only times the attention plan alone at each shape (default
 * 64x1024,32x2048,16x4096,8x8192) on random inputs of two head layouts,
 * Llama-3.1-8B's (32 query heads, 8 kv heads, head_dim 128) and 24/4 heads
 * of head_dim 256, needs no model, then runs torch's SDPA (flash and cuDNN
 * backends) at the same shapes through scripts/bench/attn_torch.py
 * (--torch-script PATH; $HS_PYTHON or python3) and prints a table of both. */
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "attention.h"
#include "hs_float.h"
#include "hs_cli.h"
#include "hsflow.h"
#include "hs_log.h"
#include "hs_time.h"
#include "hs_shuffle.h"
#include "hs_parse.h"
#include "hs_model.h"

#define MAX_SHAPES 16
#define MAX_LAYERS 64

static void usage(FILE *fp)
{
    fprintf(fp, "usage: hs-bench-forward --model DIR --layers LIST --shapes NxL[,NxL...]\n"
                "                        [--iters N] [--device N] [--peak-tflops F]\n"
                "                        [--dtype auto|bf16|fp8]\n"
                "       hs-bench-forward --attn-only [--shapes NxL[,NxL...]] [--iters N]\n"
                "                        [--torch-script PATH | --no-torch]\n"
                "example: hs-bench-forward --model /tmp/llama8b --layers 2,16,29 \\\n"
                "             --shapes 64x1024,16x4096,8x8192 --iters 5\n");
}

/* Head layouts of --attn-only: Llama-3.1-8B's and a head_dim-256 one. */
static const struct {
    int hq, hkv, d;
} attn_heads[] = {{32, 8, 128}, {24, 4, 256}};
#define N_ATTN_HEADS 2

typedef struct {
    double hs, mma, flash, cudnn; /* TFLOP/s, 0 = not measured */
    const char *backend;
} attn_row_t;

/* Best of iters calls of a prepared plan at n x L; ms, or < 0 on failure. */
static double attn_time(hs_kn_attn_plan_t *plan, const uint16_t *x, void *o, int hq, int hkv, int d,
                        int iters)
{
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    float best = 1e30f;
    int rc = 0;
    for (int i = 0; i <= iters && !rc; i++) {
        cudaEventRecord(e0, 0);
        rc = hs_kn_attn_plan_run(plan, x, x + hq * d, x + (hq + hkv) * d, o, 0);
        cudaEventRecord(e1, 0);
        cudaEventSynchronize(e1);
        float ms;
        cudaEventElapsedTime(&ms, e0, e1);
        if (i && ms < best) best = ms;
    }
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    return rc || cudaDeviceSynchronize() != cudaSuccess ? -1 : best;
}

/* Times the attention plan at every shape and head layout on random inputs
 * (per layout one plan for the largest shape, as a forward builds it; plus
 * the mma.sync kernel alone where it has a tensor-core path), one JSON line
 * each, into rows[layout][shape]. */
static int attn_bench_hsflow(const int *sn, const int *sl, int n_shapes, int iters, double peak,
                             attn_row_t rows[][MAX_SHAPES])
{
    int max_T = 0, max_n = 0;
    for (int i = 0; i < n_shapes; i++) {
        if (sn[i] * sl[i] > max_T) max_T = sn[i] * sl[i];
        if (sn[i] > max_n) max_n = sn[i];
    }
    for (int h = 0; h < N_ATTN_HEADS; h++) {
        const int hq = attn_heads[h].hq, hkv = attn_heads[h].hkv, d = attn_heads[h].d;
        const int stride = (hq + 2 * hkv) * d;
        const size_t elems = (size_t)max_T * stride, blk = 1u << 22; /* random block, repeated */
        uint16_t *hb = malloc(blk * 2);
        int32_t *cu = malloc(((size_t)max_n + 1) * 4);
        uint64_t rng = 99;
        for (size_t i = 0; i < blk; i++)
            hb[i] = hs_f32_to_bf16(
                (float)((double)(hs_splitmix64(&rng) >> 11) / 9007199254740992.0 * 4 - 2));
        void *x = NULL, *o = NULL, *dcu = NULL;
        if (cudaMalloc(&x, elems * 2) || cudaMalloc(&o, (size_t)max_T * hq * d * 2) ||
            cudaMalloc(&dcu, ((size_t)max_n + 1) * 4)) {
            fprintf(stderr, "attn bench: cudaMalloc failed\n");
            return 1;
        }
        for (size_t off = 0; off < elems; off += blk)
            cudaMemcpy((uint16_t *)x + off, hb, (elems - off < blk ? elems - off : blk) * 2,
                       cudaMemcpyHostToDevice);
        hs_kn_attn_desc_t desc = {
            max_T, max_n, hq, hkv, d, stride, stride, hq * d, 1.f / sqrtf((float)d), 0, false};
        hs_kn_attn_plan_t *plan = NULL, *mma = NULL;
        if (hs_kn_attn_plan_create(&desc, &plan) != HS_OK) return 1;
        const int tc = d == 64 || d == 80 || d == 96 || d == 128;
        if (tc) {
            hs_kn_attn_desc_t mma_desc = desc;
            mma_desc.mma_only = true;
            if (hs_kn_attn_plan_create(&mma_desc, &mma) != HS_OK) return 1;
        }
        for (int i = 0; i < n_shapes; i++) {
            const int n = sn[i], L = sl[i];
            for (int j = 0; j <= n; j++)
                cu[j] = j * L;
            cudaMemcpy(dcu, cu, ((size_t)n + 1) * 4, cudaMemcpyHostToDevice);
            const double fl = 4.0 * hq * d * (double)L * (L + 1) / 2 * n;
            for (int which = 0; which < 1 + tc; which++) {
                hs_kn_attn_plan_t *p = which ? mma : plan;
                if (hs_kn_attn_plan_prepare(p, dcu, n, n * L, L, 0) != HS_OK) return 1;
                double ms = attn_time(p, x, o, hq, hkv, d, iters);
                if (ms < 0) return 1;
                const double tf = fl / (ms / 1e3) / 1e12;
                const char *be = hs_kn_attn_plan_backend(p);
                if (which)
                    rows[h][i].mma = tf;
                else
                    rows[h][i].hs = tf, rows[h][i].backend = be;
                printf("{\"attn_shape\": \"%dx%d\", \"heads\": \"%d/%d/%d\", \"backend\": \"%s\", "
                       "\"ms\": %.3f, \"tflops\": %.1f, \"of_peak\": %.3f}\n",
                       n, L, hq, hkv, d, be, ms, tf,
                       tf / (peak > 0 ? peak : HS_MODEL_CUDA_PEAK_TFLOPS));
                fflush(stdout);
            }
        }
        hs_kn_attn_plan_destroy(plan);
        hs_kn_attn_plan_destroy(mma);
        cudaFree(x), cudaFree(o), cudaFree(dcu);
        free(hb), free(cu);
    }
    return 0;
}

/* Runs the torch script (attn_torch.py) at the same shapes and fills the
 * torch columns of rows from its JSON lines; a missing script or python
 * leaves them empty. */
static void attn_bench_torch(const char *script, const char *shapes_s, int iters, const int *sn,
                             const int *sl, int n_shapes, attn_row_t rows[][MAX_SHAPES])
{
    FILE *f = fopen(script, "r");
    if (!f) {
        fprintf(stderr,
                "attn bench: %s not found: torch columns left empty (give --torch-script "
                "PATH, or run from the project root)\n",
                script);
        return;
    }
    fclose(f);
    const char *py = getenv("HS_PYTHON");
    char cmd[1024], heads[128] = "";
    for (int h = 0; h < N_ATTN_HEADS; h++)
        snprintf(heads + strlen(heads), sizeof(heads) - strlen(heads), "%s%d/%d/%d", h ? "," : "",
                 attn_heads[h].hq, attn_heads[h].hkv, attn_heads[h].d);
    snprintf(cmd, sizeof(cmd), "%s '%s' --shapes '%s' --heads %s --iters %d", py ? py : "python3",
             script, shapes_s, heads, iters);
    FILE *p = popen(cmd, "r");
    if (!p) {
        fprintf(stderr, "attn bench: cannot run '%s': %m\n", cmd);
        return;
    }
    char line[1024];
    while (fgets(line, sizeof(line), p)) {
        fputs(line, stdout);
        int n, L, hq, hkv, d;
        char be[16];
        const char *a = strstr(line, "\"attn_shape\": \""), *hh = strstr(line, "\"heads\": \""),
                   *b = strstr(line, "\"torch_backend\": \""), *t = strstr(line, "\"tflops\": ");
        if (!a || !hh || !b || !t || sscanf(a + 15, "%dx%d", &n, &L) != 2 ||
            sscanf(hh + 10, "%d/%d/%d", &hq, &hkv, &d) != 3 || sscanf(b + 18, "%15[a-z]", be) != 1)
            continue;
        double tf = atof(t + 10);
        for (int h = 0; h < N_ATTN_HEADS; h++)
            for (int i = 0; i < n_shapes; i++)
                if (attn_heads[h].hq == hq && attn_heads[h].hkv == hkv && attn_heads[h].d == d &&
                    sn[i] == n && sl[i] == L) {
                    if (strcmp(be, "flash") == 0) rows[h][i].flash = tf;
                    if (strcmp(be, "cudnn") == 0) rows[h][i].cudnn = tf;
                }
    }
    int rc = pclose(p);
    if (rc) fprintf(stderr, "attn bench: '%s' exited with %d\n", cmd, rc);
}

static void attn_cell(double v)
{
    if (v > 0)
        printf(" %.0f |", v);
    else
        printf(" - |");
}

/* The flags (command line over HS_* environment), checked in main. */
typedef struct {
    const char *model, *layers, *shapes, *torch_script;
    int iters, device;
    bool attn_only;
    double peak;
    hs_model_weights_t weights;
} options_t;

static const struct option opts[] = {{"model", required_argument, 0, 'm'},
                                     {"dtype", required_argument, 0, 'w'},
                                     {"layers", required_argument, 0, 'l'},
                                     {"shapes", required_argument, 0, 's'},
                                     {"iters", required_argument, 0, 'i'},
                                     {"device", required_argument, 0, 'd'},
                                     {"peak-tflops", required_argument, 0, 'p'},
                                     {"attn-only", no_argument, 0, 'a'},
                                     {"torch-script", required_argument, 0, 't'},
                                     {"no-torch", no_argument, 0, 'n'},
                                     {"help", no_argument, 0, 'h'},
                                     {0, 0, 0, 0}};

/* hs_cli_parse_flags' callback: 2 for a bad --dtype, else 0. */
static int apply(void *ctx, int opt, const char *arg, const char *from)
{
    options_t *o = ctx;
    switch (opt) {
    case 'm':
        o->model = arg;
        break;
    case 'l':
        o->layers = arg;
        break;
    case 'w':
        if (hs_model_weights_parse(arg, &o->weights) != HS_OK)
            return hs_cli_bad("hs-bench-forward", "dtype", arg, from, "use auto, bf16 or fp8");
        break;
    case 's':
        o->shapes = arg;
        break;
    case 'i':
        o->iters = atoi(arg);
        break;
    case 'd':
        o->device = atoi(arg);
        break;
    case 'p':
        o->peak = atof(arg);
        break;
    case 'a':
        o->attn_only = true;
        break;
    case 't':
        o->torch_script = arg;
        break;
    case 'n':
        o->torch_script = NULL;
        break;
    }
    return 0;
}

/* --shapes "NxL,NxL,...": 0, or 2 (said why) for a bad entry or too many. */
static int parse_shapes(const char *shapes, int *sn, int *sl, int *n_shapes)
{
    char *dup = strdup(shapes), *save = NULL;
    if (!dup) return 2;
    int rc = 0;
    *n_shapes = 0;
    for (char *tok = strtok_r(dup, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        int k = *n_shapes;
        if (k == MAX_SHAPES || sscanf(tok, "%dx%d", &sn[k], &sl[k]) != 2 || sn[k] < 1 ||
            sl[k] < 1) {
            fprintf(stderr, "hs-bench-forward: --shapes '%s': give NxL entries such as 16x4096\n",
                    tok);
            rc = 2;
            break;
        }
        (*n_shapes)++;
    }
    free(dup);
    return rc;
}

int main(int argc, char **argv)
{
    options_t o = {.torch_script = "scripts/bench/attn_torch.py", .iters = 5};
    int exit_now = hs_cli_parse_flags(argc, argv, opts, apply, &o, "hs-bench-forward", usage);
    if (exit_now >= 0) return exit_now;
    if (o.attn_only) {
        if (!o.shapes) o.shapes = "64x1024,32x2048,16x4096,8x8192";
        int sn[MAX_SHAPES], sl[MAX_SHAPES], n_shapes;
        if (parse_shapes(o.shapes, sn, sl, &n_shapes)) return 2;
        static attn_row_t rows[N_ATTN_HEADS][MAX_SHAPES];
        if (cudaSetDevice(o.device) != cudaSuccess) {
            fprintf(stderr, "hs-bench-forward: no CUDA device %d\n", o.device);
            return 1;
        }
        if (attn_bench_hsflow(sn, sl, n_shapes, o.iters, o.peak, rows)) return 1;
        if (o.torch_script)
            attn_bench_torch(o.torch_script, o.shapes, o.iters, sn, sl, n_shapes, rows);
        printf("\n| shape | heads/kv/d | hsflow (kernel) | hsflow mma.sync | torch flash | torch "
               "cudnn "
               "| hsflow / torch cudnn |\n|---|---|---|---|---|---|---|\n");
        for (int h = 0; h < N_ATTN_HEADS; h++)
            for (int i = 0; i < n_shapes; i++) {
                const attn_row_t *r = &rows[h][i];
                printf("| %dx%d | %d/%d/%d | %.0f (%s) |", sn[i], sl[i], attn_heads[h].hq,
                       attn_heads[h].hkv, attn_heads[h].d, r->hs, r->backend ? r->backend : "-");
                attn_cell(r->mma);
                attn_cell(r->flash);
                attn_cell(r->cudnn);
                if (r->cudnn > 0)
                    printf(" %.2f |\n", r->hs / r->cudnn);
                else
                    printf(" - |\n");
            }
        return 0;
    }
    if (!o.model || !o.layers || !o.shapes) {
        usage(stderr);
        return 2;
    }
    int layers_i[MAX_LAYERS], n_layers = 0;
    if (hs_parse_int_list(o.layers, layers_i, MAX_LAYERS, &n_layers) != HS_OK) {
        fprintf(stderr, "hs-bench-forward: --layers '%s': give a comma-separated list\n", o.layers);
        return 2;
    }
    int32_t layers[MAX_LAYERS];
    for (int j = 0; j < n_layers; j++)
        layers[j] = layers_i[j];
    int sn[MAX_SHAPES], sl[MAX_SHAPES], n_shapes;
    if (parse_shapes(o.shapes, sn, sl, &n_shapes)) return 2;
    uint32_t budget = 0, max_seqs = 0;
    for (int i = 0; i < n_shapes; i++) {
        uint32_t T = (uint32_t)sn[i] * (uint32_t)sl[i];
        if (T > budget) budget = T;
        if ((uint32_t)sn[i] > max_seqs) max_seqs = (uint32_t)sn[i];
    }
    double t0 = hs_now_s();
    hs_model_t *m = NULL;
    if (hs_model_load_ex(o.model, o.weights, &m) != HS_OK) return 1;
    hs_model_set_attn(m, hs_model_attn_parse(getenv("HS_ATTN_BACKEND")));
    hs_model_cuda_t *mc = NULL;
    if (hs_model_cuda_create(m, o.device, budget, max_seqs, &mc) != HS_OK) return 1;
    hs_info("bench: model loaded and uploaded in %.1f s", hs_now_s() - t0);
    int rc = 0;
    for (int i = 0; i < n_shapes; i++) {
        hs_model_cuda_preflight_t r;
        if (hs_model_cuda_preflight(mc, sn[i], sl[i], layers, n_layers, o.iters, o.peak, &r) !=
            HS_OK) {
            rc = 1;
            break;
        }
        printf("{\"shape\": \"%dx%d\", \"dtype\": \"%s\", \"tokens\": %d, \"ms\": %.3f, "
               "\"tokens_per_s\": %.1f, "
               "\"us_per_token\": %.3f, \"tflop\": %.3f, \"tflops\": %.1f, \"mfu\": %.4f, "
               "\"peak_gib\": %.3f, \"device_used_gib\": %.3f",
               sn[i], sl[i], hs_model_weights_name(o.weights), sn[i] * sl[i], r.ms, r.tokens_per_s,
               r.us_per_token, r.tflop, r.tflop / (r.ms / 1000.0), r.mfu,
               r.peak_bytes / 1073741824.0, r.device_used_bytes / 1073741824.0);
        if (r.metered) /* the GPU's energy counter over the timed runs */
            printf(", \"j_per_token\": %.6f, \"watts\": %.1f, \"limit_watts\": %.1f, "
                   "\"power_capped\": %.3f",
                   r.joules_per_token, r.watts, r.limit_watts, r.power_capped_share);
        printf("}\n");
        fflush(stdout);
    }
    hs_model_cuda_destroy(mc);
    hs_model_destroy(m);
    return rc;
}
