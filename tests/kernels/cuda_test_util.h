/* SPDX-License-Identifier: Apache-2.0 */
/* cuda_test_util.h - what the CUDA kernel tests share: seeded normal draws
 * rounded to bf16, device upload, NaN-poisoned outputs (an element a kernel
 * does not write fails), downloads, and the bounded comparison with its
 * report. Check assertions: for tests only. Each test sets g_rng. */
#ifndef HS_CUDA_TEST_UTIL_H
#define HS_CUDA_TEST_UTIL_H

#include <check.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cuda_runtime_api.h>
#include <stddef.h>

#include "hs_float.h"
#include "hs_shuffle.h"
#include "cuda_test_main.h"

static uint64_t g_rng = 0x1234;

static inline float randn(void)
{
    double u1 = ((hs_splitmix64(&g_rng) >> 11) + 1.0) / 9007199254740993.0;
    double u2 = (hs_splitmix64(&g_rng) >> 11) / 9007199254740992.0;
    return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

/* n values ~ N(mean, scale^2), already rounded to bf16 (fp32 copy + bits). */
static inline float *rand_bf16(size_t n, float mean, float scale, uint16_t **bits)
{
    float *f = malloc(n * sizeof(float));
    uint16_t *b = malloc(n * sizeof(uint16_t));
    ck_assert(f && b);
    for (size_t i = 0; i < n; i++) {
        b[i] = hs_f32_to_bf16(mean + scale * randn());
        f[i] = hs_bf16_to_f32(b[i]);
    }
    *bits = b;
    return f;
}

static inline void *dev_upload(const void *host, size_t bytes)
{
    void *d = NULL;
    ck_assert_int_eq(cudaMalloc(&d, bytes ? bytes : 1), cudaSuccess);
    if (bytes) ck_assert_int_eq(cudaMemcpy(d, host, bytes, cudaMemcpyHostToDevice), cudaSuccess);
    return d;
}

/* Device buffer of bytes filled with 0xff (NaN as bf16 and as fp32). */
static inline void *dev_poisoned(size_t bytes)
{
    void *d = NULL;
    ck_assert_int_eq(cudaMalloc(&d, bytes ? bytes : 1), cudaSuccess);
    ck_assert_int_eq(cudaMemset(d, 0xff, bytes), cudaSuccess);
    return d;
}

/* Device bf16 buffer of n elements filled with NaN. */
static inline void *dev_poisoned_bf16(size_t n) { return dev_poisoned(n * 2); }

static inline float *dev_download_bf16(const void *d, size_t n)
{
    ck_assert_int_eq(cudaDeviceSynchronize(), cudaSuccess);
    uint16_t *b = malloc(n * 2);
    float *f = malloc(n * sizeof(float));
    ck_assert_int_eq(cudaMemcpy(b, d, n * 2, cudaMemcpyDeviceToHost), cudaSuccess);
    for (size_t i = 0; i < n; i++)
        f[i] = hs_bf16_to_f32(b[i]);
    free(b);
    return f;
}

static inline float *dev_download_f32(const void *d, size_t n)
{
    ck_assert_int_eq(cudaDeviceSynchronize(), cudaSuccess);
    float *f = malloc(n * sizeof(float));
    ck_assert_int_eq(cudaMemcpy(f, d, n * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
    return f;
}

/* Compare rows x cols of gpu (row stride gs) with ref (row stride rs). */
static inline int compare(const char *what, const float *gpu, size_t gs, const float *ref,
                          size_t rs, size_t rows, size_t cols, float abs_tol, float rel_tol)
{
    size_t bad = 0, worst = 0;
    float max_diff = 0.f;
    for (size_t r = 0; r < rows; r++)
        for (size_t c = 0; c < cols; c++) {
            float g = gpu[r * gs + c], e = ref[r * rs + c];
            float d = fabsf(g - e);
            if (!(d <= abs_tol + rel_tol * fabsf(e))) {
                if (!bad) worst = r * cols + c;
                bad++;
            }
            if (!(d <= max_diff)) {
                max_diff = d;
                if (bad) worst = r * cols + c;
            }
        }
    if (bad) {
        fprintf(
            stderr,
            "%s: %zu of %zu values out of bounds (abs %g + rel %g), max diff %g at [%zu, %zu]\n",
            what, bad, rows * cols, abs_tol, rel_tol, max_diff, worst / cols, worst % cols);
        size_t r0 = worst / cols;
        for (size_t i = 0; i < 8 && i < cols; i++)
            fprintf(stderr, "  [%zu, %zu] gpu %+.6f ref %+.6f\n", r0, i, gpu[r0 * gs + i],
                    ref[r0 * rs + i]);
    } else {
        printf("%s: max diff %g over %zu values\n", what, max_diff, rows * cols);
    }
    return bad == 0;
}

#endif /* HS_CUDA_TEST_UTIL_H */
