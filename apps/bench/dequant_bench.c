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

#include "hs_time.h"
#include "hs_shuffle.h"
#include "hs_float.h"
#include "hs_proto.h"

static double median(double *v, int n)
{
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && v[j] < v[j - 1]; j--) {
            double t = v[j];
            v[j] = v[j - 1];
            v[j - 1] = t;
        }
    return v[n / 2];
}

static void per_value(const uint8_t *q, uint64_t n, float scale, uint16_t *out)
{
    for (uint64_t i = 0; i < n; i++)
        out[i] = hs_f32_to_bf16(hs_fp8_to_f32(q[i]) * scale);
}

int main(int argc, char **argv)
{
    long T = 16384, N = 12288, reps = 5;
    for (int i = 1; i + 1 < argc; i += 2) {
        long v = strtol(argv[i + 1], NULL, 10);
        if (!strcmp(argv[i], "--tokens"))
            T = v;
        else if (!strcmp(argv[i], "--row"))
            N = v;
        else if (!strcmp(argv[i], "--reps"))
            reps = v;
        else {
            fprintf(stderr, "usage: hs-bench-dequant [--tokens T] [--row N] [--reps R]\n");
            return 2;
        }
    }
    if (T < 1 || N < 1 || reps < 1 || reps > 100 || T * N > (1L << 32)) {
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
    double ms[3][100];
    for (long r = 0; r < reps; r++) {
        double t0 = hs_now_s();
        for (long t = 0; t < T; t++)
            per_value(q + (size_t)t * N, (uint64_t)N, scales[t], ref + (size_t)t * N);
        double t1 = hs_now_s();
        for (long t = 0; t < T; t++)
            hs_fp8_dequantize_row_bf16(q + (size_t)t * N, (uint64_t)N, scales[t],
                                       out + (size_t)t * N);
        double t2 = hs_now_s();
        memcpy(ref, out, n * 2);
        double t3 = hs_now_s();
        ms[0][r] = 1e3 * (t1 - t0);
        ms[1][r] = 1e3 * (t2 - t1);
        ms[2][r] = 1e3 * (t3 - t2);
    }
    for (long t = 0; t < T; t++) /* the two give the same bits */
        per_value(q + (size_t)t * N, (uint64_t)N, scales[t], ref + (size_t)t * N);
    if (memcmp(ref, out, n * 2)) {
        fprintf(stderr, "hs-bench-dequant: the table and the per-value rows differ\n");
        return 1;
    }
    const char *names[3] = {"per value (before)", "hs_fp8_dequantize_row_bf16",
                            "memcpy of the bf16"};
    double base = median(ms[0], (int)reps);
    printf("%ld tokens x %ld values, median of %ld\n", T, N, reps);
    for (int k = 0; k < 3; k++) {
        double m = k ? median(ms[k], (int)reps) : base;
        printf("%-28s %8.1f ms %6.2f GB/s  %.2fx the per-value rows\n", names[k], m,
               (double)n * 2 / (m * 1e6), base / m);
    }
    free(q);
    free(out);
    free(ref);
    free(scales);
    return 0;
}
