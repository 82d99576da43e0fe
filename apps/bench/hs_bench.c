/* SPDX-License-Identifier: Apache-2.0 */
/* hs_bench.c - the benches' shapes, wall-clock rounds, median and random
 * operands (hs_bench.h); plain C, no GPU. */
#include "hs_bench.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hs_float.h"
#include "hs_shuffle.h"
#include "hs_time.h"

int hs_bench_shapes_parse(const char *prog, const char *list, hs_bench_shape_t *out, int *count)
{
    char *dup = strdup(list), *save = NULL;
    if (!dup) return 2;
    int rc = 0;
    *count = 0;
    for (char *tok = strtok_r(dup, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        hs_bench_shape_t *s = &out[*count];
        if (*count == HS_BENCH_MAX_SHAPES || sscanf(tok, "%dx%d", &s->n_seqs, &s->seq_len) != 2 ||
            s->n_seqs < 1 || s->seq_len < 1) {
            fprintf(stderr, "%s: --shapes '%s': give NxL entries such as 16x4096\n", prog, tok);
            rc = 2;
            break;
        }
        (*count)++;
    }
    free(dup);
    return rc;
}

double hs_bench_median(double *v, int n)
{
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && v[j] < v[j - 1]; j--) {
            double t = v[j];
            v[j] = v[j - 1];
            v[j - 1] = t;
        }
    return v[n / 2];
}

int hs_bench_wall_rounds(const hs_bench_call_cb *calls, int n, void *ctx, int reps,
                         double *median_ms)
{
    double(*ms)[HS_BENCH_MAX_REPS] = calloc((size_t)n, sizeof *ms);
    if (!ms) return -1;
    int rc = 0;
    for (int r = 0; r < reps && !rc; r++)
        for (int i = 0; i < n && !rc; i++) {
            double t0 = hs_now_s();
            rc = calls[i](ctx);
            ms[i][r] = 1e3 * (hs_now_s() - t0);
        }
    for (int i = 0; i < n && !rc; i++)
        median_ms[i] = hs_bench_median(ms[i], reps);
    free(ms);
    return rc;
}

void hs_bench_random_bf16(uint16_t *h, size_t n, uint64_t *rng, float scale)
{
    for (size_t i = 0; i < n; i++) {
        double u = (double)(hs_splitmix64(rng) >> 11) / 9007199254740992.0;
        h[i] = hs_f32_to_bf16((float)(2.0 * u - 1.0) * scale);
    }
}
