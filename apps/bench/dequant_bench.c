/* SPDX-License-Identifier: Apache-2.0 */
/* dequant_bench.c - hs-bench-dequant: an fp8 batch's rows back to bf16 on
 * the host, as a consumer without a GPU hands them to the trainer
 * (hs_fp8_dequantize_row_bf16), against converting each value on its own
 * (the per-value formula, which the function computed until it used a
 * table per row) and a memcpy of the same bf16 bytes, in one run.
 *
 *   hs-bench-dequant [--tokens T] [--row N] [--reps R]
 *
 * Defaults: 16384 tokens of 12288 values (3 layers of 4096), 5 repetitions,
 * the median of each printed as ms and GB/s of bf16 written. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hs_bench.h"
#include "hs_cli.h"
#include "hs_shuffle.h"
#include "hs_float.h"
#include "hs_proto.h"

static void usage(FILE *fp)
{
    fprintf(fp, "usage: hs-bench-dequant [--tokens T] [--row N] [--reps R]\n"
                "example: hs-bench-dequant --tokens 16384 --row 12288 --reps 5\n");
}

/* A whole number for --tokens, --row, --reps: 0, or 1 for anything else. */
static int parse_long(void *dst, const char *arg)
{
    char *end;
    *(long *)dst = strtol(arg, &end, 10);
    return end == arg || *end;
}

/* The rows of one batch: the fp8 codes, their scales, the two outputs. */
typedef struct {
    long T, N;
    const uint8_t *q;
    const float *scales;
    uint16_t *out, *ref;
} batch_t;

static void per_value(const uint8_t *q, uint64_t n, float scale, uint16_t *out)
{
    for (uint64_t i = 0; i < n; i++)
        out[i] = hs_f32_to_bf16(hs_fp8_to_f32(q[i]) * scale);
}

static int run_per_value(void *ctx)
{
    batch_t *b = ctx;
    for (long t = 0; t < b->T; t++)
        per_value(b->q + (size_t)t * b->N, (uint64_t)b->N, b->scales[t], b->ref + (size_t)t * b->N);
    return 0;
}

static int run_table(void *ctx)
{
    batch_t *b = ctx;
    for (long t = 0; t < b->T; t++)
        hs_fp8_dequantize_row_bf16(b->q + (size_t)t * b->N, (uint64_t)b->N, b->scales[t],
                                   b->out + (size_t)t * b->N);
    return 0;
}

static int run_memcpy(void *ctx)
{
    batch_t *b = ctx;
    memcpy(b->ref, b->out, (size_t)b->T * (size_t)b->N * 2);
    return 0;
}

int main(int argc, char **argv)
{
    long T = 16384, N = 12288, reps = 5;
    const char *expect = "expected a whole number";
    const hs_cli_flag_t flags[] = {HS_CLI_FN("tokens", parse_long, &T, expect),
                                   HS_CLI_FN("row", parse_long, &N, expect),
                                   HS_CLI_FN("reps", parse_long, &reps, expect),
                                   {0}};
    int exit_now = hs_cli_parse_table(argc, argv, flags, "hs-bench-dequant", usage);
    if (exit_now >= 0) return exit_now;
    if (T < 1 || N < 1 || reps < 1 || reps > HS_BENCH_MAX_REPS || T * N > (1L << 32)) {
        fprintf(stderr, "hs-bench-dequant: --tokens, --row >= 1, --reps 1..100, at most 2^32 "
                        "values\n");
        return 2;
    }
    size_t n = (size_t)T * (size_t)N;
    uint8_t *q = malloc(n);
    uint16_t *out = malloc(n * 2), *ref = malloc(n * 2);
    float *scales = malloc((size_t)T * sizeof(float));
    if (!q || !out || !ref || !scales) {
        fprintf(stderr, "hs-bench-dequant: out of memory for %zu values\n", n);
        return 1;
    }
    uint64_t rng = 1;
    for (size_t i = 0; i < n; i++)
        q[i] = (uint8_t)hs_splitmix64(&rng);
    for (long t = 0; t < T; t++)
        scales[t] = 1e-3f * (float)(1 + t % 97);
    batch_t b = {T, N, q, scales, out, ref};
    const hs_bench_call_cb calls[3] = {run_per_value, run_table, run_memcpy};
    double ms[3];
    hs_bench_wall_rounds(calls, 3, &b, (int)reps, ms);
    run_per_value(&b); /* the two give the same bits */
    if (memcmp(ref, out, n * 2)) {
        fprintf(stderr, "hs-bench-dequant: the table and the per-value rows differ\n");
        return 1;
    }
    const char *names[3] = {"per value (before)", "hs_fp8_dequantize_row_bf16",
                            "memcpy of the bf16"};
    printf("%ld tokens x %ld values, median of %ld\n", T, N, reps);
    for (int k = 0; k < 3; k++)
        printf("%-28s %8.1f ms %6.2f GB/s  %.2fx the per-value rows\n", names[k], ms[k],
               (double)n * 2 / (ms[k] * 1e6), ms[0] / ms[k]);
    free(q);
    free(out);
    free(ref);
    free(scales);
    return 0;
}
