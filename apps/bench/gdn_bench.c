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
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include <cuda_runtime_api.h>

#include "hs_float.h"
#include "delta_rule.h"
#include "delta_rule_int.h"
#include "hs_bench.h"
#include "hs_cli.h"
#include "hsflow.h"
#include "hs_shuffle.h"

static void usage(FILE *fp)
{
    fprintf(fp, "usage: hs-bench-gdn --shapes NxL[,NxL...] [--iters N] [--heads NK/NV] [--dim D]\n"
                "example: hs-bench-gdn --shapes 8x8192,64x1024 --iters 10\n");
}

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

/* One form's call on a batch: what hs_bench_cuda_time runs. */
typedef struct {
    form_fn f;
    const void *q, *k, *v;
    int64_t stride, ov;
    const float *g, *beta;
    void *out;
    const int32_t *cu;
    int n, T, nk, nv, dk, dv;
    void *ws;
    size_t ws_bytes;
} form_call_t;

static int form_run(void *ctx)
{
    const form_call_t *c = ctx;
    return c->f(c->q, c->k, c->v, c->stride, c->g, c->beta, c->out, c->ov, c->cu, c->n, c->T, c->nk,
                c->nv, c->dk, c->dv, c->ws, c->ws_bytes, 0) != HS_OK;
}

/* Mean milliseconds of one call of f into out over iters calls, after one warm-up. */
static double time_form(form_call_t *c, form_fn f, void *out, int iters)
{
    c->f = f, c->out = out;
    double ms = 0;
    int rc = hs_bench_cuda_time(form_run, c, 1, iters, HS_BENCH_MEAN, &ms);
    if (rc > 0) fprintf(stderr, "hs-bench-gdn: the kernel refused the shape\n");
    if (rc) exit(1);
    return ms;
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
    hs_bench_random_bf16(hb, block, &rng, 1.7f);
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
    HS_BENCH_CUDA(cudaMalloc(&dx, total * 2));
    if (hs_bench_upload_tiled(dx, total * 2, hb, block * 2)) exit(1);
    HS_BENCH_CUDA(cudaMalloc(&dg, (size_t)T * nv * 4));
    HS_BENCH_CUDA(cudaMalloc(&dbeta, (size_t)T * nv * 4));
    HS_BENCH_CUDA(cudaMalloc(&dcu, (size_t)(n + 1) * 4));
    HS_BENCH_CUDA(cudaMalloc(&dout, (size_t)T * ov * 2));
    HS_BENCH_CUDA(cudaMalloc(&drec, (size_t)T * ov * 2));
    HS_BENCH_CUDA(cudaMalloc(&ws, ws_bytes ? ws_bytes : 1));
    HS_BENCH_CUDA(cudaMemcpy(dg, hg, (size_t)T * nv * 4, cudaMemcpyHostToDevice));
    HS_BENCH_CUDA(cudaMemcpy(dbeta, hbeta, (size_t)T * nv * 4, cudaMemcpyHostToDevice));
    HS_BENCH_CUDA(cudaMemcpy(dcu, cu, (size_t)(n + 1) * 4, cudaMemcpyHostToDevice));
    const uint16_t *q = dx, *k = q + nk * d, *v = k + nk * d;

    /* f and out: each form's own, set by time_form */
    form_call_t c = {NULL, q, k, v,  stride, ov, dg, dbeta, NULL,
                     dcu,  n, T, nk, nv,     d,  d,  ws,    ws_bytes};
    double ms_c = time_form(&c, hs__kn_delta_rule_chunked, dout, iters);
    double ms_m = time_form(&c, hs__kn_delta_rule_chunked_mma, drec, iters);
    double ms_r = time_form(&c, run_recurrent, drec, iters / 4 > 1 ? iters / 4 : 1);

    /* chunked against recurrent over the whole batch */
    size_t m = (size_t)T * ov;
    uint16_t *a = malloc(m * 2), *b = malloc(m * 2);
    if (!a || !b) exit(1);
    HS_BENCH_CUDA(cudaMemcpy(a, dout, m * 2, cudaMemcpyDeviceToHost));
    HS_BENCH_CUDA(cudaMemcpy(b, drec, m * 2, cudaMemcpyDeviceToHost));
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

/* --heads NK/NV: 0, or 1 for anything else. */
static int parse_heads(void *dst, const char *arg)
{
    int *nk_nv = dst;
    return sscanf(arg, "%d/%d", &nk_nv[0], &nk_nv[1]) != 2;
}

int main(int argc, char **argv)
{
    const char *shapes = "8x8192,64x1024";
    int iters = 10, heads[2] = {16, 48}, d = 128;
    const hs_cli_flag_t flags[] = {
        HS_CLI_STR("shapes", &shapes),
        HS_CLI_INT("iters", &iters),
        HS_CLI_FN("heads", parse_heads, heads, "expected NK/NV, like 16/48"),
        HS_CLI_INT("dim", &d),
        {0}};
    int exit_now = hs_cli_parse_table(argc, argv, flags, "hs-bench-gdn", usage);
    if (exit_now >= 0) return exit_now;
    const int nk = heads[0], nv = heads[1];
    if (iters < 1 || nk < 1 || nv < nk || nv % nk || (d != 64 && d != 128)) {
        fprintf(stderr, "hs-bench-gdn: --iters >= 1, --heads NK/NV with NV a multiple of NK, "
                        "--dim 64 or 128\n");
        return 2;
    }
    hs_bench_shape_t s[HS_BENCH_MAX_SHAPES];
    int n_shapes;
    if (hs_bench_shapes_parse("hs-bench-gdn", shapes, s, &n_shapes)) return 2;
    for (int i = 0; i < n_shapes; i++)
        if (s[i].n_seqs > 65535 || (long long)s[i].n_seqs * s[i].seq_len > (1LL << 20)) {
            fprintf(stderr, "hs-bench-gdn: bad shape '%dx%d' (NxL, N <= 65535, N*L <= 1048576)\n",
                    s[i].n_seqs, s[i].seq_len);
            return 2;
        }
    for (int i = 0; i < n_shapes; i++)
        bench_shape(s[i].n_seqs, s[i].seq_len, iters, nk, nv, d);
    return 0;
}
