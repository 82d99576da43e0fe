/* SPDX-License-Identifier: Apache-2.0 */
/* hs_bench_cuda.c - the benches' CUDA timing loop and uploads (hs_bench.h).
 * Errors are printed with the program's name (a bench's main reads them). */
#include "hs_bench.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

#include <cuda_runtime_api.h>

/* 0, or -1 after printing "PROG: WHAT: error" for a failed CUDA call. */
static int cuda_ok(cudaError_t e, const char *what)
{
    if (e == cudaSuccess) return 0;
    fprintf(stderr, "%s: %s: %s\n", program_invocation_short_name, what, cudaGetErrorString(e));
    return -1;
}

void hs_bench_cuda_must(int err, const char *what)
{
    if (cuda_ok((cudaError_t)err, what)) exit(1);
}

int hs_bench_cuda_time(hs_bench_call_cb call, void *ctx, int warmup, int iters,
                       hs_bench_stat_t stat, double *ms)
{
    cudaEvent_t e0 = NULL, e1 = NULL;
    int rc = 0;
    if (cuda_ok(cudaEventCreate(&e0), "cudaEventCreate") ||
        cuda_ok(cudaEventCreate(&e1), "cudaEventCreate")) {
        rc = -1;
        goto out;
    }
    for (int i = 0; i < warmup && !rc; i++)
        rc = call(ctx);
    float sum = 0.f, best = 1e30f;
    /* MEAN: one pair of events around all calls; BEST: a pair around each */
    const int pairs = stat == HS_BENCH_MEAN ? 1 : iters,
              per_pair = stat == HS_BENCH_MEAN ? iters : 1;
    for (int p = 0; p < pairs && !rc; p++) {
        if (cuda_ok(cudaEventRecord(e0, 0), "cudaEventRecord")) {
            rc = -1;
            break;
        }
        for (int i = 0; i < per_pair && !rc; i++)
            rc = call(ctx);
        float t = 0.f;
        if (rc) break;
        if (cuda_ok(cudaEventRecord(e1, 0), "cudaEventRecord") ||
            cuda_ok(cudaEventSynchronize(e1), "cudaEventSynchronize") ||
            cuda_ok(cudaEventElapsedTime(&t, e0, e1), "cudaEventElapsedTime")) {
            rc = -1;
            break;
        }
        sum += t;
        if (t < best) best = t;
    }
    if (!rc && cuda_ok(cudaDeviceSynchronize(), "the timed calls")) rc = -1;
    if (!rc) *ms = stat == HS_BENCH_MEAN ? sum / iters : best;
out:
    if (e0) cudaEventDestroy(e0);
    if (e1) cudaEventDestroy(e1);
    return rc;
}

int hs_bench_upload_tiled(void *dst, size_t bytes, const void *block, size_t block_bytes)
{
    for (size_t at = 0; at < bytes; at += block_bytes) {
        size_t len = bytes - at < block_bytes ? bytes - at : block_bytes;
        if (cuda_ok(cudaMemcpy((uint8_t *)dst + at, block, len, cudaMemcpyHostToDevice),
                    "cudaMemcpy to the device"))
            return -1;
    }
    return 0;
}
