/* SPDX-License-Identifier: Apache-2.0 */
/* gdn_bench.c - hs-bench-gdn: times the CUDA gated delta rule (Gated
 * DeltaNet's token mixer), chunked and recurrent forms, at batch shapes
 * n_seqs x seq_len on random inputs of Qwen3.6-27B's GDN shape (16 key
 * heads, 48 value heads, dk = dv = 128; q, k, v read in place from the
 * conv's fused rows), and checks the chunked output against the recurrent
 * one at every shape. One JSON line per shape and form. Used by
 * scripts/bench/gdn.
 *
 *   hs-bench-gdn --shapes 8x8192,64x1024 [--iters 10] [--heads 16/48] [--dim 128]
 */
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "hs_float.h"
#include "delta_rule.h"
#include "delta_rule_int.h"
#include "hs_cli.h"
#include "hsflow.h"
#include "hs_shuffle.h"

#define MAX_SHAPES 16

static void usage(FILE *fp)
{
    fprintf(fp, "usage: hs-bench-gdn --shapes NxL[,NxL...] [--iters N] [--heads NK/NV] [--dim D]\n"
                "example: hs-bench-gdn --shapes 8x8192,64x1024 --iters 10\n");
}

#define CK(call)                                                                                   \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess) {                                                                   \
            fprintf(stderr, "hs-bench-gdn: %s: %s\n", #call, cudaGetErrorString(e_));              \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

typedef hs_status_t (*form_fn)(const void *, const void *, const void *, int64_t, const float *,
                               const float *, void *, int64_t, const int32_t *, int, int, int, int,
                               int, int, void *, size_t, cudaStream_t);

static hs_status_t run_recurrent(const void *q, const void *k, const void *v, int64_t stride,
                                 const float *g, const float *beta, void *out, int64_t out_stride,
                                 const int32_t *cu, int n_seqs, int T, int nk, int nv, int dk,
                                 int dv, void *ws, size_t ws_bytes, cudaStream_t stream)
{
    (void)ws, (void)ws_bytes;
    return hs__kn_delta_rule_recurrent(q, k, v, stride, g, beta, out, out_stride, cu, n_seqs, T, nk,
                                       nv, dk, dv, stream);
}

/* Mean milliseconds of one call over iters calls, after one warm-up. */
static double time_form(form_fn f, const void *q, const void *k, const void *v, int64_t stride,
                        const float *g, const float *beta, void *out, int64_t ov, const int32_t *cu,
                        int n, int T, int nk, int nv, int dk, int dv, void *ws, size_t ws_bytes,
                        int iters)
{
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    if (f(q, k, v, stride, g, beta, out, ov, cu, n, T, nk, nv, dk, dv, ws, ws_bytes, 0) != HS_OK) {
        fprintf(stderr, "hs-bench-gdn: the kernel refused the shape\n");
        exit(1);
    }
    CK(cudaEventRecord(a, 0));
    for (int i = 0; i < iters; i++)
        f(q, k, v, stride, g, beta, out, ov, cu, n, T, nk, nv, dk, dv, ws, ws_bytes, 0);
    CK(cudaEventRecord(b, 0));
    CK(cudaEventSynchronize(b));
    float ms = 0.f;
    CK(cudaEventElapsedTime(&ms, a, b));
    cudaEventDestroy(a), cudaEventDestroy(b);
    return ms / iters;
}

static void bench_shape(int n, int L, int iters, int nk, int nv, int d)
{
    const int T = n * L, stride = 2 * nk * d + nv * d, ov = nv * d;
    uint64_t rng = 0x5eed + (uint64_t)T;
    /* q, k, v: a random block tiled over the rows; gates per token and head */
    const size_t block = (size_t)1 << 22, total = (size_t)T * stride;
    uint16_t *hb = malloc(block * 2);
    float *hg = malloc((size_t)T * nv * 4), *hbeta = malloc((size_t)T * nv * 4);
    int32_t *cu = malloc((size_t)(n + 1) * 4);
    if (!hb || !hg || !hbeta || !cu) exit(1);
    for (size_t i = 0; i < block; i++) {
        double u = (double)(hs_splitmix64(&rng) >> 11) / 9007199254740992.0;
        hb[i] = hs_f32_to_bf16((float)(2.0 * u - 1.0) * 1.7f);
    }
    for (size_t i = 0; i < (size_t)T * nv; i++) {
        double u1 = (double)(hs_splitmix64(&rng) >> 11) / 9007199254740992.0;
        double u2 = (double)(hs_splitmix64(&rng) >> 11) / 9007199254740992.0;
        hg[i] = (float)(-0.01 - 0.5 * u1); /* decay per step 0.99 .. 0.6 */
        hbeta[i] = (float)(0.05 + 0.9 * u2);
    }
    for (int s = 0; s <= n; s++)
        cu[s] = s * L;
    void *dx, *dg, *dbeta, *dcu, *dout, *drec, *ws;
    size_t ws_bytes = hs_kn_delta_rule_workspace_bytes(T, n, nk, nv, d, d);
    CK(cudaMalloc(&dx, total * 2));
    for (size_t at = 0; at < total; at += block) {
        size_t len = total - at < block ? total - at : block;
        CK(cudaMemcpy((uint16_t *)dx + at, hb, len * 2, cudaMemcpyHostToDevice));
    }
    CK(cudaMalloc(&dg, (size_t)T * nv * 4));
    CK(cudaMalloc(&dbeta, (size_t)T * nv * 4));
    CK(cudaMalloc(&dcu, (size_t)(n + 1) * 4));
    CK(cudaMalloc(&dout, (size_t)T * ov * 2));
    CK(cudaMalloc(&drec, (size_t)T * ov * 2));
    CK(cudaMalloc(&ws, ws_bytes ? ws_bytes : 1));
    CK(cudaMemcpy(dg, hg, (size_t)T * nv * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dbeta, hbeta, (size_t)T * nv * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dcu, cu, (size_t)(n + 1) * 4, cudaMemcpyHostToDevice));
    const uint16_t *q = dx, *k = q + nk * d, *v = k + nk * d;

    double ms_c = time_form(hs__kn_delta_rule_chunked, q, k, v, stride, dg, dbeta, dout, ov, dcu, n,
                            T, nk, nv, d, d, ws, ws_bytes, iters);
    double ms_m = time_form(hs__kn_delta_rule_chunked_mma, q, k, v, stride, dg, dbeta, drec, ov,
                            dcu, n, T, nk, nv, d, d, ws, ws_bytes, iters);
    int rec_iters = iters / 4 > 1 ? iters / 4 : 1;
    double ms_r = time_form(run_recurrent, q, k, v, stride, dg, dbeta, drec, ov, dcu, n, T, nk, nv,
                            d, d, ws, ws_bytes, rec_iters);

    /* chunked against recurrent over the whole batch */
    size_t m = (size_t)T * ov;
    uint16_t *a = malloc(m * 2), *b = malloc(m * 2);
    if (!a || !b) exit(1);
    CK(cudaMemcpy(a, dout, m * 2, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(b, drec, m * 2, cudaMemcpyDeviceToHost));
    double max_diff = 0, sum_diff = 0, max_ref = 0;
    for (size_t i = 0; i < m; i++) {
        double x = hs_bf16_to_f32(a[i]), y = hs_bf16_to_f32(b[i]);
        double dd = fabs(x - y);
        if (!(dd <= max_diff)) max_diff = dd;
        sum_diff += dd;
        if (fabs(y) > max_ref) max_ref = fabs(y);
    }
    printf("{\"shape\": \"%dx%d\", \"tokens\": %d, \"form\": \"chunked\", \"state_pass\": \"%s\", "
           "\"ms\": %.4f, \"tokens_per_s\": %.0f, \"workspace_mib\": %.1f}\n",
           n, L, T, hs__kn_delta_rule_wgmma() ? "wgmma" : "mma.sync", ms_c, T / (ms_c * 1e-3),
           ws_bytes / 1048576.0);
    printf("{\"shape\": \"%dx%d\", \"tokens\": %d, \"form\": \"chunked_mma\", "
           "\"state_pass\": \"mma.sync\", \"ms\": %.4f, \"tokens_per_s\": %.0f}\n",
           n, L, T, ms_m, T / (ms_m * 1e-3));
    printf("{\"shape\": \"%dx%d\", \"tokens\": %d, \"form\": \"recurrent\", \"ms\": %.4f, "
           "\"tokens_per_s\": %.0f}\n",
           n, L, T, ms_r, T / (ms_r * 1e-3));
    printf("{\"shape\": \"%dx%d\", \"check\": \"chunked vs recurrent\", \"max_abs_diff\": %.3g, "
           "\"mean_abs_diff\": %.3g, \"max_abs_out\": %.3g}\n",
           n, L, max_diff, sum_diff / (double)m, max_ref);
    fflush(stdout);
    free(hb), free(hg), free(hbeta), free(cu), free(a), free(b);
    cudaFree(dx), cudaFree(dg), cudaFree(dbeta), cudaFree(dcu), cudaFree(dout), cudaFree(drec);
    cudaFree(ws);
}

/* The flags (command line over HS_* environment), checked in main. */
typedef struct {
    const char *shapes;
    int iters, nk, nv, d;
} options_t;

static const struct option opts[] = {
    {"shapes", required_argument, 0, 's'}, {"iters", required_argument, 0, 'i'},
    {"heads", required_argument, 0, 'H'},  {"dim", required_argument, 0, 'd'},
    {"help", no_argument, 0, 'h'},         {0, 0, 0, 0}};

/* hs_cli_parse_flags' callback: 2 for a bad --heads, else 0. */
static int apply(void *ctx, int opt, const char *arg, const char *from)
{
    options_t *o = ctx;
    switch (opt) {
    case 's':
        o->shapes = arg;
        break;
    case 'i':
        o->iters = atoi(arg);
        break;
    case 'H':
        if (sscanf(arg, "%d/%d", &o->nk, &o->nv) != 2)
            return hs_cli_bad("hs-bench-gdn", "heads", arg, from, "expected NK/NV, like 16/48");
        break;
    case 'd':
        o->d = atoi(arg);
        break;
    }
    return 0;
}

int main(int argc, char **argv)
{
    options_t o = {.shapes = "8x8192,64x1024", .iters = 10, .nk = 16, .nv = 48, .d = 128};
    int exit_now = hs_cli_parse_flags(argc, argv, opts, apply, &o, "hs-bench-gdn", usage);
    if (exit_now >= 0) return exit_now;
    if (o.iters < 1 || o.nk < 1 || o.nv < o.nk || o.nv % o.nk || (o.d != 64 && o.d != 128)) {
        fprintf(stderr, "hs-bench-gdn: --iters >= 1, --heads NK/NV with NV a multiple of NK, "
                        "--dim 64 or 128\n");
        return 2;
    }
    char buf[256];
    snprintf(buf, sizeof buf, "%s", o.shapes);
    int count = 0;
    char *save = NULL;
    for (char *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        int n, L;
        if (sscanf(tok, "%dx%d", &n, &L) != 2 || n < 1 || L < 1 || n > 65535 ||
            (long long)n * L > (1LL << 20) || ++count > MAX_SHAPES) {
            fprintf(stderr, "hs-bench-gdn: bad shape '%s' (NxL, N <= 65535, N*L <= 1048576)\n",
                    tok);
            return 2;
        }
        bench_shape(n, L, o.iters, o.nk, o.nv, o.d);
    }
    return 0;
}
