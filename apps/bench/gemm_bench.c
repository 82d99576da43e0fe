/* SPDX-License-Identifier: Apache-2.0 */
/* gemm_bench.c - hs-bench-gemm: how fast each algorithm cuBLASLt's heuristic
 * offers runs a forward's Linear shapes, against the one it ranks first
 * (the one hs_lt_linear takes). Row-major y[M,N] = x[M,K] W[N,K]^T in the
 * layouts of kernels/cublaslt.c, bf16 or FP8 block-scaled (128x128 weight
 * blocks, per-token groups of 128), random operands (not zeros: GEMMs on
 * zeros draw less power and run faster). One JSON line per shape and
 * algorithm, then a table: heuristic rank 0 against the fastest.
 *
 *   hs-bench-gemm --shapes 65536:34816:5120,65536:5120:17408:acc [--dtype bf16|fp8]
 *                 [--algos 16] [--iters 10]
 */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include "hs_bench.h"
#include "hs_dtype.h"
#include "hs_cli.h"
#include "hs_shuffle.h"

#define MAX_ALGOS 32
#define WORKSPACE_BYTES (32u << 20)

static void usage(FILE *fp)
{
    fprintf(fp,
            "usage: hs-bench-gemm --shapes M:N:K[:acc][,...] [--dtype bf16|fp8] [--algos N] "
            "[--iters N]\n"
            "  times every algorithm cuBLASLt's heuristic offers (up to --algos, max %d) for\n"
            "  y[M,N] = x[M,K] W[N,K]^T (+ y with :acc) and compares rank 0 with the fastest\n"
            "example: hs-bench-gemm --shapes 65536:34816:5120,65536:5120:17408:acc --dtype bf16\n",
            MAX_ALGOS);
}

#define LK(call)                                                                                   \
    do {                                                                                           \
        cublasStatus_t s_ = (call);                                                                \
        if (s_ != CUBLAS_STATUS_SUCCESS) {                                                         \
            fprintf(stderr, "hs-bench-gemm: %s: %s\n", #call, cublasLtGetStatusString(s_));        \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

typedef struct {
    int M, N, K;
    bool acc;
} shape_t;

/* bytes random bytes of the kind an operand holds, a 4 MiB block tiled */
static void fill_random(void *dst, size_t bytes, bool fp8, uint64_t seed)
{
    const size_t block = (size_t)4 << 20;
    uint8_t *h = malloc(block);
    if (!h) exit(1);
    uint64_t rng = seed;
    if (fp8) { /* e4m3 codes with exponent bit 3 cleared (never 15: no NaN, |x| < 2^8),
                * the sign alternating */
        for (size_t i = 0; i < block; i++)
            h[i] = (uint8_t)(hs_splitmix64(&rng) & 0x77u) | (uint8_t)((i & 1) << 7);
    } else {
        hs_bench_random_bf16((uint16_t *)h, block / 2, &rng, 1.f);
    }
    if (hs_bench_upload_tiled(dst, bytes, h, block)) exit(1);
    free(h);
}

static void fill_floats(float *dst, size_t n, float value)
{
    float *h = malloc(n * sizeof(float));
    if (!h) exit(1);
    for (size_t i = 0; i < n; i++)
        h[i] = value;
    HS_BENCH_CUDA(cudaMemcpy(dst, h, n * sizeof(float), cudaMemcpyHostToDevice));
    free(h);
}

/* One algorithm's call on a shape: what hs_bench_cuda_time runs. */
typedef struct {
    cublasLtHandle_t lt;
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t a, b, c;
    const void *w, *x;
    void *y, *ws;
    size_t ws_bytes;
    float alpha, beta;
    const cublasLtMatmulAlgo_t *algo;
} matmul_t;

static int matmul_run(void *ctx)
{
    const matmul_t *m = ctx;
    return cublasLtMatmul(m->lt, m->op, &m->alpha, m->w, m->a, m->x, m->b, &m->beta, m->y, m->c,
                          m->y, m->c, m->algo, m->ws, m->ws_bytes, 0) != CUBLAS_STATUS_SUCCESS;
}

static void bench_shape(cublasLtHandle_t lt, void *ws, shape_t s, bool fp8, int n_algos, int iters,
                        double *rank0_tflops, double *best_tflops, int *best_rank)
{
    const size_t in_size = fp8 ? 1 : 2;
    void *x, *w, *y;
    float *xs = NULL, *wsc = NULL;
    HS_BENCH_CUDA(cudaMalloc(&x, (size_t)s.M * s.K * in_size));
    HS_BENCH_CUDA(cudaMalloc(&w, (size_t)s.N * s.K * in_size));
    HS_BENCH_CUDA(cudaMalloc(&y, (size_t)s.M * s.N * 2));
    fill_random(x, (size_t)s.M * s.K * in_size, fp8, 0x5eed + (uint64_t)s.K);
    fill_random(w, (size_t)s.N * s.K * in_size, fp8, 0xbeef + (uint64_t)s.N);
    fill_random(y, (size_t)s.M * s.N * 2, false, 0xcafe);

    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t a, b, c;
    cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    LK(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    LK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
    LK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
    if (fp8) {
        const int64_t kb = (s.K + 127) / 128, nb = (s.N + 127) / 128;
        const int64_t w_count = nb * ((kb + 3) / 4 * 4), x_count = kb * (((int64_t)s.M + 3) & ~3);
        HS_BENCH_CUDA(cudaMalloc((void **)&wsc, (size_t)w_count * 4));
        HS_BENCH_CUDA(cudaMalloc((void **)&xs, (size_t)x_count * 4));
        fill_floats(wsc, (size_t)w_count, 1.f / 448.f);
        fill_floats(xs, (size_t)x_count, 1.f / 64.f);
        int32_t am = CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F;
        int32_t bm = CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
        LK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &am, sizeof(am)));
        LK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &bm, sizeof(bm)));
        LK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &wsc,
                                          sizeof(wsc)));
        LK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &xs,
                                          sizeof(xs)));
    }
    cudaDataType_t in_type = fp8 ? CUDA_R_8F_E4M3 : CUDA_R_16BF;
    LK(cublasLtMatrixLayoutCreate(&a, in_type, (uint64_t)s.K, (uint64_t)s.N, s.K));
    LK(cublasLtMatrixLayoutCreate(&b, in_type, (uint64_t)s.K, (uint64_t)s.M, s.K));
    LK(cublasLtMatrixLayoutCreate(&c, CUDA_R_16BF, (uint64_t)s.N, (uint64_t)s.M, s.N));
    cublasLtMatmulPreference_t pref;
    size_t ws_bytes = WORKSPACE_BYTES;
    LK(cublasLtMatmulPreferenceCreate(&pref));
    LK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                            &ws_bytes, sizeof(ws_bytes)));
    cublasLtMatmulHeuristicResult_t heur[MAX_ALGOS];
    int n_heur = 0;
    LK(cublasLtMatmulAlgoGetHeuristic(lt, op, a, b, c, c, pref, n_algos, heur, &n_heur));
    if (n_heur == 0)
        printf("{\"M\": %d, \"N\": %d, \"K\": %d, \"error\": \"cuBLASLt has no algorithm\"}\n", s.M,
               s.N, s.K);

    const double flop = 2.0 * s.M * s.N * s.K;
    matmul_t mm = {lt, op, a, b, c, w, x, y, ws, ws_bytes, 1.f, s.acc ? 1.f : 0.f, NULL};
    *rank0_tflops = 0, *best_tflops = 0, *best_rank = -1;
    for (int r = 0; r < n_heur; r++) {
        mm.algo = &heur[r].algo;
        double ms = 0; /* a call's mean, after two warm-up calls */
        int rc = hs_bench_cuda_time(matmul_run, &mm, 2, iters, HS_BENCH_MEAN, &ms);
        if (rc < 0) exit(1);
        if (rc) {
            printf("{\"M\": %d, \"N\": %d, \"K\": %d, \"rank\": %d, \"error\": \"does not run\"}\n",
                   s.M, s.N, s.K, r);
            continue;
        }
        const double t = flop / (ms * 1e-3) / 1e12;
        int tile = 0, stages = 0, splitk = 0, cluster = 0;
        size_t got;
        cublasLtMatmulAlgoConfigGetAttribute(&heur[r].algo, CUBLASLT_ALGO_CONFIG_TILE_ID, &tile,
                                             sizeof(tile), &got);
        cublasLtMatmulAlgoConfigGetAttribute(&heur[r].algo, CUBLASLT_ALGO_CONFIG_STAGES_ID, &stages,
                                             sizeof(stages), &got);
        cublasLtMatmulAlgoConfigGetAttribute(&heur[r].algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM,
                                             &splitk, sizeof(splitk), &got);
        cublasLtMatmulAlgoConfigGetAttribute(&heur[r].algo, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID,
                                             &cluster, sizeof(cluster), &got);
        printf("{\"M\": %d, \"N\": %d, \"K\": %d, \"acc\": %s, \"dtype\": \"%s\", \"rank\": %d, "
               "\"ms\": %.4f, \"tflops\": %.1f, \"tile\": %d, \"stages\": %d, \"splitk\": %d, "
               "\"cluster\": %d, \"workspace\": %zu}\n",
               s.M, s.N, s.K, s.acc ? "true" : "false",
               hs_dtype_str(fp8 ? HS_DTYPE_FP8 : HS_DTYPE_BF16), r, ms, t, tile, stages, splitk,
               cluster, heur[r].workspaceSize);
        fflush(stdout);
        if (r == 0) *rank0_tflops = t;
        if (t > *best_tflops) *best_tflops = t, *best_rank = r;
    }
    cublasLtMatmulPreferenceDestroy(pref);
    cublasLtMatrixLayoutDestroy(a), cublasLtMatrixLayoutDestroy(b), cublasLtMatrixLayoutDestroy(c);
    cublasLtMatmulDescDestroy(op);
    cudaFree(x), cudaFree(w), cudaFree(y), cudaFree(xs), cudaFree(wsc);
}

/* --dtype bf16|fp8 (hs_dtype.h's names) into a bool (fp8): 0, or 1 for anything else. */
static int parse_dtype(void *dst, const char *arg)
{
    uint32_t d;
    if (hs_dtype_parse(arg, &d) != HS_OK) return 1;
    *(bool *)dst = d == HS_DTYPE_FP8;
    return 0;
}

int main(int argc, char **argv)
{
    struct {
        const char *shapes;
        bool fp8;
        int algos, iters;
    } o = {.shapes = "65536:34816:5120,65536:5120:17408:acc", .algos = 16, .iters = 10};
    char names[64], dtype_why[80];
    snprintf(dtype_why, sizeof dtype_why, "expected %s",
             hs_dtype_names(names, sizeof names, NULL, ", ", " or "));
    const hs_cli_flag_t flags[] = {HS_CLI_STR("shapes", &o.shapes),
                                   HS_CLI_FN("dtype", parse_dtype, &o.fp8, dtype_why),
                                   HS_CLI_INT("algos", &o.algos),
                                   HS_CLI_INT("iters", &o.iters),
                                   {0}};
    int exit_now = hs_cli_parse_table(argc, argv, flags, "hs-bench-gemm", usage);
    if (exit_now >= 0) return exit_now;
    if (o.iters < 1 || o.algos < 1 || o.algos > MAX_ALGOS) {
        fprintf(stderr, "hs-bench-gemm: --iters >= 1, --algos 1..%d\n", MAX_ALGOS);
        return 2;
    }
    shape_t shapes[HS_BENCH_MAX_SHAPES];
    int n = 0;
    char buf[512];
    if (strlen(o.shapes) >= sizeof buf) {
        fprintf(stderr, "hs-bench-gemm: --shapes is longer than %zu characters\n", sizeof buf - 1);
        return 2;
    }
    snprintf(buf, sizeof buf, "%s", o.shapes);
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok;
         tok = strtok_r(NULL, ",", &save)) {
        char acc[8] = "";
        shape_t s = {0};
        int got = sscanf(tok, "%d:%d:%d:%7s", &s.M, &s.N, &s.K, acc);
        if (n == HS_BENCH_MAX_SHAPES || got < 3 || s.M < 1 || s.N < 1 || s.K < 1 ||
            (got == 4 && strcmp(acc, "acc")) || s.K % 16 || s.N % 8) {
            fprintf(stderr,
                    "hs-bench-gemm: bad shape '%s': expected M:N:K or M:N:K:acc, K a multiple "
                    "of 16 and N of 8, at most %d shapes\n",
                    tok, HS_BENCH_MAX_SHAPES);
            return 2;
        }
        s.acc = got == 4;
        shapes[n++] = s;
    }
    if (n == 0) {
        fprintf(stderr, "hs-bench-gemm: --shapes names no shape: expected M:N:K[,M:N:K...]\n");
        return 2;
    }
    cublasLtHandle_t lt;
    void *ws;
    LK(cublasLtCreate(&lt));
    HS_BENCH_CUDA(cudaMalloc(&ws, WORKSPACE_BYTES));
    double r0[HS_BENCH_MAX_SHAPES], best[HS_BENCH_MAX_SHAPES];
    int rank[HS_BENCH_MAX_SHAPES];
    for (int i = 0; i < n; i++)
        bench_shape(lt, ws, shapes[i], o.fp8, o.algos, o.iters, &r0[i], &best[i], &rank[i]);
    printf("\n| M | N | K | acc | %s rank 0 TFLOP/s | fastest TFLOP/s (rank) | fastest / rank 0 |\n"
           "|---|---|---|---|---|---|---|\n",
           hs_dtype_str(o.fp8 ? HS_DTYPE_FP8 : HS_DTYPE_BF16));
    for (int i = 0; i < n; i++) {
        if (rank[i] < 0) { /* no algorithm, or none that ran */
            printf("| %d | %d | %d | %s | - | - | - |\n", shapes[i].M, shapes[i].N, shapes[i].K,
                   shapes[i].acc ? "yes" : "no");
            continue;
        }
        printf("| %d | %d | %d | %s | %.1f | %.1f (%d) | %.3f |\n", shapes[i].M, shapes[i].N,
               shapes[i].K, shapes[i].acc ? "yes" : "no", r0[i], best[i], rank[i],
               r0[i] > 0 ? best[i] / r0[i] : 0.0);
    }
    cudaFree(ws);
    cublasLtDestroy(lt);
    return 0;
}
