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
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "attention.h"
#include "hs_bench.h"
#include "hs_cli.h"
#include "hsflow.h"
#include "hs_log.h"
#include "hs_time.h"
#include "hs_parse.h"
#include "hs_model.h"

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

/* One call of a prepared attention plan on the rows x (q, k, v of each token). */
typedef struct {
    hs_kn_attn_plan_t *plan;
    const uint16_t *x;
    void *o;
    int hq, hkv, d;
} attn_call_t;

static int attn_run(void *ctx)
{
    const attn_call_t *c = ctx;
    return hs_kn_attn_plan_run(c->plan, c->x, c->x + c->hq * c->d, c->x + (c->hq + c->hkv) * c->d,
                               c->o, 0) != HS_OK;
}

/* Times the attention plan at every shape and head layout on random inputs
 * (per layout one plan for the largest shape, as a forward builds it; plus
 * the mma.sync kernel alone where it has a tensor-core path), one JSON line
 * each, into rows[layout][shape]. */
static int attn_bench_hsflow(const hs_bench_shape_t *shapes, int n_shapes, int iters, double peak,
                             attn_row_t rows[][HS_BENCH_MAX_SHAPES])
{
    int max_T = 0, max_n = 0;
    for (int i = 0; i < n_shapes; i++) {
        const int T = shapes[i].n_seqs * shapes[i].seq_len;
        if (T > max_T) max_T = T;
        if (shapes[i].n_seqs > max_n) max_n = shapes[i].n_seqs;
    }
    for (int h = 0; h < N_ATTN_HEADS; h++) {
        const int hq = attn_heads[h].hq, hkv = attn_heads[h].hkv, d = attn_heads[h].d;
        const int stride = (hq + 2 * hkv) * d;
        const size_t elems = (size_t)max_T * stride, blk = 1u << 22; /* random block, repeated */
        uint16_t *hb = malloc(blk * 2);
        int32_t *cu = malloc(((size_t)max_n + 1) * 4);
        uint64_t rng = 99;
        hs_bench_random_bf16(hb, blk, &rng, 2.f); /* uniform [-2, 2) */
        void *x = NULL, *o = NULL, *dcu = NULL;
        if (cudaMalloc(&x, elems * 2) || cudaMalloc(&o, (size_t)max_T * hq * d * 2) ||
            cudaMalloc(&dcu, ((size_t)max_n + 1) * 4)) {
            fprintf(stderr, "attn bench: cudaMalloc failed\n");
            return 1;
        }
        if (hs_bench_upload_tiled(x, elems * 2, hb, blk * 2)) return 1;
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
            const int n = shapes[i].n_seqs, L = shapes[i].seq_len;
            for (int j = 0; j <= n; j++)
                cu[j] = j * L;
            cudaMemcpy(dcu, cu, ((size_t)n + 1) * 4, cudaMemcpyHostToDevice);
            const double fl = 4.0 * hq * d * (double)L * (L + 1) / 2 * n;
            for (int which = 0; which < 1 + tc; which++) {
                hs_kn_attn_plan_t *p = which ? mma : plan;
                if (hs_kn_attn_plan_prepare(p, dcu, n, n * L, L, 0) != HS_OK) return 1;
                attn_call_t call = {p, x, o, hq, hkv, d};
                double ms; /* the best of iters calls, after one warm-up */
                if (hs_bench_cuda_time(attn_run, &call, 1, iters, HS_BENCH_BEST, &ms)) return 1;
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
static void attn_bench_torch(const char *script, const char *shapes_s, int iters,
                             const hs_bench_shape_t *shapes, int n_shapes,
                             attn_row_t rows[][HS_BENCH_MAX_SHAPES])
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
                    shapes[i].n_seqs == n && shapes[i].seq_len == L) {
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

/* --dtype auto|bf16|fp8: 0, or 1 for anything else. */
static int parse_weights(void *dst, const char *arg)
{
    return hs_model_weights_parse(arg, dst) != HS_OK;
}

int main(int argc, char **argv)
{
    /* the flags (command line over HS_* environment), checked below */
    struct {
        const char *model, *layers, *shapes, *torch_script;
        int iters, device;
        bool attn_only;
        double peak;
        hs_model_weights_t weights;
    } o = {.torch_script = "scripts/bench/attn_torch.py", .iters = 5};
    char names[64], dtype_why[80];
    snprintf(dtype_why, sizeof dtype_why, "use %s",
             hs_dtype_names(names, sizeof names, "auto", ", ", " or "));
    const hs_cli_flag_t flags[] = {
        HS_CLI_STR("model", &o.model),
        HS_CLI_FN("dtype", parse_weights, &o.weights, dtype_why),
        HS_CLI_STR("layers", &o.layers),
        HS_CLI_STR("shapes", &o.shapes),
        HS_CLI_INT("iters", &o.iters),
        HS_CLI_INT("device", &o.device),
        HS_CLI_DOUBLE("peak-tflops", &o.peak),
        HS_CLI_TRUE("attn-only", &o.attn_only),
        HS_CLI_STR("torch-script", &o.torch_script),
        HS_CLI_CLEAR("no-torch", &o.torch_script),
        {0},
    };
    int exit_now = hs_cli_parse_table(argc, argv, flags, "hs-bench-forward", usage);
    if (exit_now >= 0) return exit_now;
    hs_bench_shape_t shapes[HS_BENCH_MAX_SHAPES];
    int n_shapes;
    if (o.attn_only) {
        if (!o.shapes) o.shapes = "64x1024,32x2048,16x4096,8x8192";
        if (hs_bench_shapes_parse("hs-bench-forward", o.shapes, shapes, &n_shapes)) return 2;
        static attn_row_t rows[N_ATTN_HEADS][HS_BENCH_MAX_SHAPES];
        if (cudaSetDevice(o.device) != cudaSuccess) {
            fprintf(stderr, "hs-bench-forward: no CUDA device %d\n", o.device);
            return 1;
        }
        if (attn_bench_hsflow(shapes, n_shapes, o.iters, o.peak, rows)) return 1;
        if (o.torch_script)
            attn_bench_torch(o.torch_script, o.shapes, o.iters, shapes, n_shapes, rows);
        printf("\n| shape | heads/kv/d | hsflow (kernel) | hsflow mma.sync | torch flash | torch "
               "cudnn "
               "| hsflow / torch cudnn |\n|---|---|---|---|---|---|---|\n");
        for (int h = 0; h < N_ATTN_HEADS; h++)
            for (int i = 0; i < n_shapes; i++) {
                const attn_row_t *r = &rows[h][i];
                printf("| %dx%d | %d/%d/%d | %.0f (%s) |", shapes[i].n_seqs, shapes[i].seq_len,
                       attn_heads[h].hq, attn_heads[h].hkv, attn_heads[h].d, r->hs,
                       r->backend ? r->backend : "-");
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
    if (hs_bench_shapes_parse("hs-bench-forward", o.shapes, shapes, &n_shapes)) return 2;
    uint32_t budget = 0, max_seqs = 0;
    for (int i = 0; i < n_shapes; i++) {
        uint32_t T = (uint32_t)shapes[i].n_seqs * (uint32_t)shapes[i].seq_len;
        if (T > budget) budget = T;
        if ((uint32_t)shapes[i].n_seqs > max_seqs) max_seqs = (uint32_t)shapes[i].n_seqs;
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
        const int n = shapes[i].n_seqs, L = shapes[i].seq_len;
        hs_model_cuda_preflight_t r;
        if (hs_model_cuda_preflight(mc, n, L, layers, n_layers, o.iters, o.peak, &r) != HS_OK) {
            rc = 1;
            break;
        }
        printf("{\"shape\": \"%dx%d\", \"dtype\": \"%s\", \"tokens\": %d, \"ms\": %.3f, "
               "\"tokens_per_s\": %.1f, "
               "\"us_per_token\": %.3f, \"tflop\": %.3f, \"tflops\": %.1f, \"mfu\": %.4f, "
               "\"peak_gib\": %.3f, \"device_used_gib\": %.3f",
               n, L, hs_model_weights_name(o.weights), n * L, r.ms, r.tokens_per_s, r.us_per_token,
               r.tflop, r.tflop / (r.ms / 1000.0), r.mfu, r.peak_bytes / 1073741824.0,
               r.device_used_bytes / 1073741824.0);
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
