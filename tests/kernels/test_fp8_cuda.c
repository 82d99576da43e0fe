/* SPDX-License-Identifier: Apache-2.0 */
/* test_fp8_cuda.c - the fp8 kernels against their C twins (common/fp8.c),
 * bit for bit: rows of odd and vector-friendly lengths, rows of zeros and of
 * both signs over many binades, the dequantisation of what the quantiser
 * wrote, and a NaN or infinity flagged with its row. Skipped (exit 77)
 * without a GPU. */
#include <check.h>
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fp8.h"
#include "cuda_test_main.h"
#include "hs_float.h"
#include "hs_proto.h"
#include "hs_shuffle.h"

static uint64_t g_rng = 0x51;

/* rows x n bf16 values spread over binades, row 3 all zeros */
static uint16_t *draw_rows(int64_t rows, int64_t n)
{
    uint16_t *x = malloc((size_t)(rows * n) * 2);
    ck_assert_ptr_nonnull(x);
    for (int64_t i = 0; i < rows * n; i++) {
        int64_t m = (int64_t)(hs_splitmix64(&g_rng) % 4001) - 2000;
        int e = (int)(hs_splitmix64(&g_rng) % 30) - 20;
        x[i] = hs_f32_to_bf16((float)m * ldexpf(1.0f, e));
    }
    if (rows > 3) memset(x + 3 * n, 0, (size_t)n * 2);
    return x;
}

static void *dev_copy(const void *h, size_t bytes)
{
    void *d = NULL;
    ck_assert_int_eq(cudaMalloc(&d, bytes), cudaSuccess);
    ck_assert_int_eq(cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice), cudaSuccess);
    return d;
}

static void check_shape(int64_t rows, int64_t n)
{
    uint16_t *x = draw_rows(rows, n);
    uint8_t *q = malloc((size_t)(rows * n)), *gq = malloc((size_t)(rows * n));
    float *s = malloc((size_t)rows * 4), *gs = malloc((size_t)rows * 4);
    uint16_t *back = malloc((size_t)(rows * n) * 2), *gback = malloc((size_t)(rows * n) * 2);
    for (int64_t r = 0; r < rows; r++) {
        uint64_t bad;
        ck_assert_int_eq(hs_fp8_quantize_row_bf16(x + r * n, (uint64_t)n, q + r * n, &s[r], &bad),
                         HS_OK);
        hs_fp8_dequantize_row_bf16(q + r * n, (uint64_t)n, s[r], back + r * n);
    }
    uint16_t *dx = dev_copy(x, (size_t)(rows * n) * 2), *dback;
    uint8_t *dq;
    float *ds;
    int *dbad, bad = 0;
    ck_assert_int_eq(cudaMalloc((void **)&dq, (size_t)(rows * n)), cudaSuccess);
    ck_assert_int_eq(cudaMalloc((void **)&ds, (size_t)rows * 4), cudaSuccess);
    ck_assert_int_eq(cudaMalloc((void **)&dback, (size_t)(rows * n) * 2), cudaSuccess);
    dbad = dev_copy(&bad, sizeof bad);
    ck_assert_int_eq(hs_kn_fp8_quantize_rows(dx, rows, n, dq, ds, dbad, NULL), HS_OK);
    ck_assert_int_eq(hs_kn_fp8_dequantize_rows(dq, ds, rows, n, dback, NULL), HS_OK);
    ck_assert_int_eq(cudaMemcpy(gq, dq, (size_t)(rows * n), cudaMemcpyDeviceToHost), cudaSuccess);
    ck_assert_int_eq(cudaMemcpy(gs, ds, (size_t)rows * 4, cudaMemcpyDeviceToHost), cudaSuccess);
    ck_assert_int_eq(cudaMemcpy(gback, dback, (size_t)(rows * n) * 2, cudaMemcpyDeviceToHost),
                     cudaSuccess);
    ck_assert_int_eq(cudaMemcpy(&bad, dbad, sizeof bad, cudaMemcpyDeviceToHost), cudaSuccess);
    ck_assert_int_eq(bad, 0);
    for (int64_t r = 0; r < rows; r++)
        ck_assert_msg(memcmp(&gs[r], &s[r], 4) == 0, "row %lld: scale %.9g, twin %.9g",
                      (long long)r, gs[r], s[r]);
    for (int64_t i = 0; i < rows * n; i++) {
        ck_assert_msg(gq[i] == q[i], "rows %lld x %lld, value %lld: 0x%02x, twin 0x%02x",
                      (long long)rows, (long long)n, (long long)i, gq[i], q[i]);
        ck_assert_msg(gback[i] == back[i], "value %lld back: 0x%04x, twin 0x%04x", (long long)i,
                      gback[i], back[i]);
    }
    /* a NaN in row 5 and an infinity in row 2: the flag names one of them */
    x[5 * n + n / 2] = 0x7fc0;
    x[2 * n] = 0xff80;
    ck_assert_int_eq(cudaMemcpy(dx, x, (size_t)(rows * n) * 2, cudaMemcpyHostToDevice),
                     cudaSuccess);
    ck_assert_int_eq(hs_kn_fp8_quantize_rows(dx, rows, n, dq, ds, dbad, NULL), HS_OK);
    ck_assert_int_eq(cudaMemcpy(&bad, dbad, sizeof bad, cudaMemcpyDeviceToHost), cudaSuccess);
    ck_assert_msg(bad == 3 || bad == 6, "flag %d, expected row 2 or 5 plus one", bad);
    cudaFree(dx), cudaFree(dq), cudaFree(ds), cudaFree(dback), cudaFree(dbad);
    free(x), free(q), free(gq), free(s), free(gs), free(back), free(gback);
}

START_TEST(fp8_kernels_match_their_twins_bit_for_bit)
{
    check_shape(37, 3 * 83);   /* odd rows: the scalar dequantiser */
    check_shape(19, 3 * 4096); /* the vector path, 8 values a thread */
    check_shape(9, 7);
}
END_TEST

int main(void)
{
    struct cudaDeviceProp prop;
    if (!cuda_test_device("test_fp8_cuda", &prop)) return 77;
    Suite *s = suite_create("fp8_cuda");
    TCase *tc = tcase_create("all");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, fp8_kernels_match_their_twins_bit_for_bit);
    suite_add_tcase(s, tc);
    return cuda_test_run(s);
}
