/* SPDX-License-Identifier: Apache-2.0 */
/* test_fp8_block_cuda.c - the FP8 forward's GPU pieces: the per-token
 * 128-group activation quantiser against its C twin, bit for bit (odd token
 * counts, a short last group, a row of zeros, a NaN group, strided rows),
 * the quantiser fused with the MLP's SwiGLU against SwiGLU then the
 * quantiser, bit for bit (the fused vector kernel, and shapes that fall
 * back to the two kernels), the same for the Gated DeltaNet's gated norm, the RMSNorm that writes
 * FP8 against the norm then the quantiser, bit for bit, and the cuBLASLt block-scaled GEMM against
 * a host product of the dequantised operands (double accumulation) on odd shapes, with bias and
 * accumulate, and K blocks not a multiple of 4 (the padded factor rows).
 * Skipped (exit 77) without a GPU. */
#include <check.h>
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cublaslt.h"
#include "cuda_test_util.h"
#include "fp8_block.h"
#include "hs_float.h"
#include "rmsnorm.h"
#include "rmsnorm_gated.h"
#include "swiglu.h"
#include "hs_shuffle.h"
#include "hs_memory.h"

static void quant_case(int M, int K, int64_t ldx, int64_t ldq)
{
    g_rng = 0x5eed + (uint64_t)M * 131 + (uint64_t)K;
    uint16_t *x;
    float *xf = rand_bf16((size_t)M * ldx, 0.f, 2.f, &x);
    free(xf);
    if (M > 3) memset(x + 3 * ldx, 0, (size_t)ldx * 2); /* token 3: zeros */
    if (M > 5 && K > 130) x[5 * ldx + 129] = 0x7fc0;    /* token 5, group 1: NaN */
    if (M > 6) x[6 * ldx] = hs_f32_to_bf16(1e30f);      /* token 6: a huge amax */
    if (M > 7) /* token 7: any finite bf16, subnormals to 3e38, every group factor's range */
        for (int k = 0; k < K; k++) {
            uint16_t b;
            do
                b = (uint16_t)(hs_splitmix64(&g_rng) >> 48);
            while ((b & 0x7f80u) == 0x7f80u);
            x[7 * ldx + k] = b;
        }
    const int G = (int)hs_fp8_blocks(K);
    uint8_t *q = calloc((size_t)M * ldq, 1), *gq = malloc((size_t)M * ldq);
    const size_t ns = (size_t)hs_fp8_act_scale_count(M, K);
    float *s = malloc(ns * 4), *gs = malloc(ns * 4);
    hs_kn_fp8_quant_groups_ref(x, ldx, M, K, q, ldq, s);
    uint16_t *dx = dev_upload(x, (size_t)M * ldx * 2);
    uint8_t *dq = dev_poisoned((size_t)M * ldq);
    ck_assert_int_eq(cudaMemset(dq, 0, (size_t)M * ldq), cudaSuccess);
    float *ds = dev_poisoned(ns * 4);
    ck_assert_int_eq(hs_kn_fp8_quant_groups(dx, ldx, M, K, dq, ldq, ds, NULL), HS_OK);
    ck_assert_int_eq(cudaDeviceSynchronize(), cudaSuccess);
    ck_assert_int_eq(cudaMemcpy(gq, dq, (size_t)M * ldq, cudaMemcpyDeviceToHost), cudaSuccess);
    ck_assert_int_eq(cudaMemcpy(gs, ds, ns * 4, cudaMemcpyDeviceToHost), cudaSuccess);
    for (int g = 0; g < G; g++)
        for (int m = 0; m < M; m++) {
            int64_t i = hs_fp8_act_scale_index(g, m, M, G);
            ck_assert_msg(memcmp(&s[i], &gs[i], 4) == 0 || (isnan(s[i]) && isnan(gs[i])),
                          "M=%d K=%d: scale of group %d token %d gpu %g twin %g", M, K, g, m,
                          (double)gs[i], (double)s[i]);
        }
    for (int m = 0; m < M; m++)
        for (int k = 0; k < K; k++)
            ck_assert_msg(q[(size_t)m * ldq + k] == gq[(size_t)m * ldq + k],
                          "M=%d K=%d: token %d col %d gpu 0x%02x twin 0x%02x", M, K, m, k,
                          gq[(size_t)m * ldq + k], q[(size_t)m * ldq + k]);
    printf("quant groups M=%d K=%d ldx=%lld: bytes and factors equal the twin\n", M, K,
           (long long)ldx);
    cudaFree(dx);
    cudaFree(dq);
    cudaFree(ds);
    free(x);
    free(q);
    free(gq);
    free(s);
    free(gs);
}

START_TEST(activation_quantiser_matches_its_twin_bit_for_bit)
{
    quant_case(37, 1000, 1008, 1008);
    quant_case(1, 64, 64, 64);
    quant_case(129, 4096, 4104, 4096);
    quant_case(7, 300, 2 * 304, 320); /* rows of a wider buffer, as the down projection reads */
}
END_TEST

/* The fused kernel's FP8 bytes and factors (dq_one, ds_one) against the two
 * kernels' (dq_two, ds_two), bit for bit (NaN factors count as equal);
 * what names the case in a failure. */
static void expect_same_fp8(const char *what, const uint8_t *dq_two, const uint8_t *dq_one,
                            const float *ds_two, const float *ds_one, int M, int K, int64_t ldq)
{
    const size_t nq = (size_t)M * ldq, ns = (size_t)hs_fp8_act_scale_count(M, K);
    uint8_t *q_two = malloc(nq), *q_one = malloc(nq);
    float *s_two = malloc(ns * 4), *s_one = malloc(ns * 4);
    ck_assert_int_eq(cudaMemcpy(q_two, dq_two, nq, cudaMemcpyDeviceToHost), cudaSuccess);
    ck_assert_int_eq(cudaMemcpy(q_one, dq_one, nq, cudaMemcpyDeviceToHost), cudaSuccess);
    ck_assert_int_eq(cudaMemcpy(s_two, ds_two, ns * 4, cudaMemcpyDeviceToHost), cudaSuccess);
    ck_assert_int_eq(cudaMemcpy(s_one, ds_one, ns * 4, cudaMemcpyDeviceToHost), cudaSuccess);
    for (size_t i = 0; i < ns; i++)
        ck_assert_msg(memcmp(&s_two[i], &s_one[i], 4) == 0 || (isnan(s_two[i]) && isnan(s_one[i])),
                      "%s: factor %zu fused %g two kernels %g", what, i, (double)s_one[i],
                      (double)s_two[i]);
    for (int m = 0; m < M; m++)
        for (int k = 0; k < K; k++)
            ck_assert_msg(q_two[(size_t)m * ldq + k] == q_one[(size_t)m * ldq + k],
                          "%s: token %d col %d fused 0x%02x two kernels 0x%02x", what, m, k,
                          q_one[(size_t)m * ldq + k], q_two[(size_t)m * ldq + k]);
    free(q_two);
    free(q_one);
    free(s_two);
    free(s_one);
}

/* hs_kn_swiglu_fp8_groups on gate|up rows [M, 2K] (stride ldgu) against
 * hs_kn_swiglu into a bf16 buffer then hs_kn_fp8_quant_groups (itself
 * checked against the C twin above): the same bytes and factors. */
static void swiglu_quant_case(int M, int K, int64_t ldgu)
{
    g_rng = 0x5a9 + (uint64_t)M * 17 + (uint64_t)K;
    uint16_t *gu;
    free(rand_bf16((size_t)M * ldgu, 0.f, 3.f, &gu));
    if (M > 2) gu[2 * ldgu + K + 1] = 0x7f80; /* token 2: an infinite up value */
    const int64_t ldq = (K + 15) / 16 * 16;
    const size_t nq = (size_t)M * ldq, ns = (size_t)hs_fp8_act_scale_count(M, K);
    void *d_gu = dev_upload(gu, (size_t)M * ldgu * 2), *d_h = dev_poisoned((size_t)M * K * 2);
    uint8_t *dq_two = dev_poisoned(nq), *dq_one = dev_poisoned(nq);
    float *ds_two = dev_poisoned(ns * 4), *ds_one = dev_poisoned(ns * 4);
    ck_assert_int_eq(cudaMemset(dq_two, 0, nq), cudaSuccess);
    ck_assert_int_eq(cudaMemset(dq_one, 0, nq), cudaSuccess);
    ck_assert_int_eq(hs_kn_swiglu(d_gu, ldgu, d_h, K, M, K, NULL), HS_OK);
    ck_assert_int_eq(hs_kn_fp8_quant_groups(d_h, K, M, K, dq_two, ldq, ds_two, NULL), HS_OK);
    ck_assert_int_eq(hs_kn_swiglu_fp8_groups(d_gu, ldgu, M, K, dq_one, ldq, ds_one, NULL), HS_OK);
    ck_assert_int_eq(cudaDeviceSynchronize(), cudaSuccess);
    char what[64];
    snprintf(what, sizeof what, "swiglu M=%d K=%d", M, K);
    expect_same_fp8(what, dq_two, dq_one, ds_two, ds_one, M, K, ldq);
    printf("swiglu + quant M=%d K=%d ldgu=%lld: fused equals the two kernels\n", M, K,
           (long long)ldgu);
    cudaFree(d_gu);
    cudaFree(d_h);
    cudaFree(dq_two);
    cudaFree(dq_one);
    cudaFree(ds_two);
    cudaFree(ds_one);
    free(gu);
}

/* hs_kn_rmsnorm_gated_fp8 on x, z [M, heads * dim] against
 * hs_kn_rmsnorm_gated into a bf16 buffer then hs_kn_fp8_quant_groups: the
 * same bytes and factors (a NaN in one head, a head of zeros, a huge z). */
static void gated_norm_quant_case(int M, int heads, int dim)
{
    g_rng = 0x9a7ed + (uint64_t)M * 29 + (uint64_t)heads * 7 + (uint64_t)dim;
    const int K = heads * dim;
    const float eps = 1e-6f;
    uint16_t *x, *z, *w;
    free(rand_bf16((size_t)M * K, 0.f, 0.5f, &x));
    free(rand_bf16((size_t)M * K, 0.f, 3.f, &z));
    free(rand_bf16((size_t)dim, 1.f, 0.2f, &w));
    if (M > 2) x[2 * K + dim + 3] = 0x7fc0;           /* token 2, head 1: NaN */
    if (M > 3) memset(x + 3 * K, 0, (size_t)dim * 2); /* token 3, head 0: zeros */
    if (M > 4) z[4 * K + 5] = hs_f32_to_bf16(-1e30f); /* token 4: silu of a huge negative */
    const int64_t ldq = (K + 15) / 16 * 16;
    const size_t nq = (size_t)M * ldq, ns = (size_t)hs_fp8_act_scale_count(M, K);
    void *dx_two = dev_upload(x, (size_t)M * K * 2), *dx_one = dev_upload(x, (size_t)M * K * 2);
    void *dz = dev_upload(z, (size_t)M * K * 2), *dw = dev_upload(w, (size_t)dim * 2);
    void *dy = dev_poisoned((size_t)M * K * 2);
    uint8_t *dq_two = dev_poisoned(nq), *dq_one = dev_poisoned(nq);
    float *ds_two = dev_poisoned(ns * 4), *ds_one = dev_poisoned(ns * 4);
    ck_assert_int_eq(cudaMemset(dq_two, 0, nq), cudaSuccess);
    ck_assert_int_eq(cudaMemset(dq_one, 0, nq), cudaSuccess);
    ck_assert_int_eq(
        hs_kn_rmsnorm_gated(dx_two, dim, dz, dim, dw, dy, dim, M * heads, dim, eps, NULL), HS_OK);
    ck_assert_int_eq(hs_kn_fp8_quant_groups(dy, K, M, K, dq_two, ldq, ds_two, NULL), HS_OK);
    ck_assert_int_eq(
        hs_kn_rmsnorm_gated_fp8(dx_one, dz, dw, M, heads, dim, eps, dq_one, ldq, ds_one, NULL),
        HS_OK);
    ck_assert_int_eq(cudaDeviceSynchronize(), cudaSuccess);
    char what[64];
    snprintf(what, sizeof what, "gated norm M=%d heads=%d dim=%d", M, heads, dim);
    expect_same_fp8(what, dq_two, dq_one, ds_two, ds_one, M, K, ldq);
    printf("gated norm + quant M=%d heads=%d dim=%d: fused equals the two kernels\n", M, heads,
           dim);
    cudaFree(dx_two), cudaFree(dx_one), cudaFree(dz), cudaFree(dw), cudaFree(dy);
    cudaFree(dq_two), cudaFree(dq_one), cudaFree(ds_two), cudaFree(ds_one);
    free(x), free(z), free(w);
}

/* hs_kn_rmsnorm_fp8 (with and without its bf16 output, with the capture
 * copy) against hs_kn_rmsnorm then hs_kn_fp8_quant_groups: the same norm
 * bits, copy, bytes and factors. */
static void rmsnorm_quant_case(int M, int K, bool zc, bool write_y)
{
    g_rng = 0x7a5 + (uint64_t)M * 7 + (uint64_t)K + zc;
    uint16_t *x, *w;
    free(rand_bf16((size_t)M * K, 0.f, 2.f, &x));
    free(rand_bf16((size_t)K, zc ? 0.f : 1.f, 0.2f, &w));
    if (M > 2) x[2 * K + 5] = 0x7f80; /* token 2: an infinity, its norm NaN */
    const int64_t ldq = (K + 15) / 16 * 16, ldc = K + 8;
    const size_t nq = (size_t)M * ldq, ns = (size_t)hs_fp8_act_scale_count(M, K);
    const size_t ny = (size_t)M * K * 2, nc = (size_t)M * ldc * 2;
    void *dx = dev_upload(x, (size_t)M * K * 2), *dw = dev_upload(w, (size_t)K * 2);
    void *dy_two = dev_poisoned(ny), *dy_one = dev_poisoned(ny);
    void *dc_two = dev_poisoned(nc), *dc_one = dev_poisoned(nc);
    uint8_t *dq_two = dev_poisoned(nq), *dq_one = dev_poisoned(nq);
    float *ds_two = dev_poisoned(ns * 4), *ds_one = dev_poisoned(ns * 4);
    ck_assert_int_eq(cudaMemset(dq_two, 0, nq), cudaSuccess);
    ck_assert_int_eq(cudaMemset(dq_one, 0, nq), cudaSuccess);
    if (!write_y) ck_assert_int_eq(cudaMemset(dy_one, 0, ny), cudaSuccess);
    ck_assert_int_eq(hs_kn_rmsnorm(dx, K, dw, dy_two, K, M, K, 1e-6f, zc, dc_two, ldc, NULL),
                     HS_OK);
    ck_assert_int_eq(hs_kn_fp8_quant_groups(dy_two, K, M, K, dq_two, ldq, ds_two, NULL), HS_OK);
    ck_assert_int_eq(hs_kn_rmsnorm_fp8(dx, K, dw, dy_one, K, write_y, M, K, 1e-6f, zc, dc_one, ldc,
                                       dq_one, ldq, ds_one, NULL),
                     HS_OK);
    ck_assert_int_eq(cudaDeviceSynchronize(), cudaSuccess);
    uint8_t *h_two = malloc(nq + ns * 4 + ny + nc), *h_one = malloc(nq + ns * 4 + ny + nc);
    ck_assert_int_eq(cudaMemcpy(h_two, dq_two, nq, cudaMemcpyDeviceToHost), cudaSuccess);
    ck_assert_int_eq(cudaMemcpy(h_one, dq_one, nq, cudaMemcpyDeviceToHost), cudaSuccess);
    ck_assert_int_eq(cudaMemcpy(h_two + nq, ds_two, ns * 4, cudaMemcpyDeviceToHost), cudaSuccess);
    ck_assert_int_eq(cudaMemcpy(h_one + nq, ds_one, ns * 4, cudaMemcpyDeviceToHost), cudaSuccess);
    ck_assert_int_eq(cudaMemcpy(h_two + nq + ns * 4, dy_two, ny, cudaMemcpyDeviceToHost),
                     cudaSuccess);
    ck_assert_int_eq(cudaMemcpy(h_one + nq + ns * 4, dy_one, ny, cudaMemcpyDeviceToHost),
                     cudaSuccess);
    ck_assert_int_eq(cudaMemcpy(h_two + nq + ns * 4 + ny, dc_two, nc, cudaMemcpyDeviceToHost),
                     cudaSuccess);
    ck_assert_int_eq(cudaMemcpy(h_one + nq + ns * 4 + ny, dc_one, nc, cudaMemcpyDeviceToHost),
                     cudaSuccess);
    for (int m = 0; m < M; m++)
        for (int k = 0; k < K; k++)
            ck_assert_msg(h_two[(size_t)m * ldq + k] == h_one[(size_t)m * ldq + k],
                          "rmsnorm fp8 M=%d K=%d: token %d col %d fused 0x%02x two kernels 0x%02x",
                          M, K, m, k, h_one[(size_t)m * ldq + k], h_two[(size_t)m * ldq + k]);
    const float *s_two = (const float *)(h_two + nq), *s_one = (const float *)(h_one + nq);
    for (size_t i = 0; i < ns; i++)
        ck_assert_msg(memcmp(&s_two[i], &s_one[i], 4) == 0 || (isnan(s_two[i]) && isnan(s_one[i])),
                      "rmsnorm fp8 M=%d K=%d: factor %zu fused %g two kernels %g", M, K, i,
                      (double)s_one[i], (double)s_two[i]);
    const uint16_t *c_two = (const uint16_t *)(h_two + nq + ns * 4 + ny);
    const uint16_t *c_one = (const uint16_t *)(h_one + nq + ns * 4 + ny);
    for (int m = 0; m < M; m++)
        ck_assert_msg(memcmp(c_two + (size_t)m * ldc, c_one + (size_t)m * ldc, (size_t)K * 2) == 0,
                      "rmsnorm fp8 M=%d K=%d: copy of token %d differs", M, K, m);
    const uint16_t *y_two = (const uint16_t *)(h_two + nq + ns * 4);
    const uint16_t *y_one = (const uint16_t *)(h_one + nq + ns * 4);
    for (size_t i = 0; i < (size_t)M * K; i++)
        ck_assert_msg(write_y ? y_one[i] == y_two[i] : y_one[i] == 0,
                      "rmsnorm fp8 M=%d K=%d: y[%zu] 0x%04x, %s 0x%04x", M, K, i, y_one[i],
                      write_y ? "two kernels" : "unwritten", write_y ? y_two[i] : 0);
    printf("rmsnorm fp8 M=%d K=%d zc=%d write_y=%d: fused equals the norm then the quantiser\n", M,
           K, zc, write_y);
    cudaFree(dx), cudaFree(dw), cudaFree(dy_two), cudaFree(dy_one), cudaFree(dc_two);
    cudaFree(dc_one), cudaFree(dq_two), cudaFree(dq_one), cudaFree(ds_two), cudaFree(ds_one);
    free(x), free(w), free(h_two), free(h_one);
}

START_TEST(rmsnorm_writing_fp8_equals_the_norm_then_the_quantiser)
{
    rmsnorm_quant_case(37, 4096, false, false); /* Llama's norms before q|k|v and gate|up */
    rmsnorm_quant_case(37, 4096, false, true);
    rmsnorm_quant_case(9, 5120, true, true);   /* Qwen3.5's: 20 groups, a half-warp's tail */
    rmsnorm_quant_case(6, 1000, true, false);  /* a short last group */
    rmsnorm_quant_case(5, 100, false, true);   /* not 16-byte rows: norm, then quantiser */
    rmsnorm_quant_case(3, 8192, false, false); /* wide rows: 64 and 66 groups */
    rmsnorm_quant_case(3, 8448, true, true);
}
END_TEST

START_TEST(gated_norm_fused_with_the_quantiser_equals_the_two_kernels)
{
    gated_norm_quant_case(77, 5, 128);  /* the fused kernel, odd tokens and heads */
    gated_norm_quant_case(37, 48, 128); /* Qwen3.6's 48 value heads */
    gated_norm_quant_case(9, 6, 64);    /* heads of 64: the two kernels */
}
END_TEST

START_TEST(swiglu_fused_with_the_quantiser_equals_the_two_kernels)
{
    swiglu_quant_case(37, 1024, 2048);  /* the fused kernel */
    swiglu_quant_case(130, 1000, 2008); /* fused, a short last group */
    swiglu_quant_case(5, 300, 2 * 304); /* K % 8 != 0: the two kernels */
}
END_TEST

/* One GEMM: y [M, N] (ldy) = x [M, K] W [N, K]^T (+ bias) (+ y0), both
 * operands quantised (x on the GPU, W on the host as at load), against the
 * dequantised operands multiplied on the host. */
static int gemm_case(hs_lt_t *lt, int M, int N, int K, int bias, int acc)
{
    g_rng = 0xf8 + (uint64_t)M * 7 + (uint64_t)N * 13 + (uint64_t)K;
    const int64_t ldq = (int64_t)hs_align_up((size_t)K, 16),
                  ldy = (int64_t)hs_align_up((size_t)N, 8);
    const int64_t NB = hs_fp8_blocks(N), KB = hs_fp8_blocks(K), sld = hs_lt_fp8_scale_ld(K);
    uint16_t *x, *w, *b, *y0;
    free(rand_bf16((size_t)M * K, 0.f, 1.f, &x));
    free(rand_bf16((size_t)N * K, 0.f, 0.05f, &w));
    free(rand_bf16((size_t)N, 0.f, 0.5f, &b));
    free(rand_bf16((size_t)M * ldy, 0.f, 1.f, &y0));
    /* host: the twin's quantisation of x, the loader's of W */
    uint8_t *xq = malloc((size_t)M * ldq), *wq = malloc((size_t)N * K);
    float *xs = malloc((size_t)hs_fp8_act_scale_count(M, K) * 4),
          *ws = malloc((size_t)(NB * KB) * 4);
    float *wsp = calloc((size_t)(NB * sld), 4);
    hs_kn_fp8_quant_groups_ref(x, K, M, K, xq, ldq, xs);
    hs_fp8_block_quantize(w, N, K, wq, ws);
    for (int64_t r = 0; r < NB; r++)
        memcpy(wsp + r * sld, ws + r * KB, (size_t)KB * 4);
    float *ref = malloc((size_t)M * N * 4);
    for (int m = 0; m < M; m++)
        for (int n = 0; n < N; n++) {
            double acc_d = 0;
            for (int k = 0; k < K; k++)
                acc_d += (double)hs_fp8_to_f32(xq[(size_t)m * ldq + k]) *
                         xs[hs_fp8_act_scale_index(k / 128, m, M, KB)] *
                         (double)hs_fp8_to_f32(wq[(size_t)n * K + k]) *
                         ws[(n / 128) * KB + k / 128];
            if (bias) acc_d += hs_bf16_to_f32(b[n]);
            if (acc) acc_d += hs_bf16_to_f32(y0[(size_t)m * ldy + n]);
            ref[(size_t)m * N + n] = (float)acc_d;
        }
    /* device: x quantised by the kernel */
    uint16_t *dx = dev_upload(x, (size_t)M * K * 2), *db = dev_upload(b, (size_t)N * 2);
    uint16_t *dy = dev_upload(y0, (size_t)M * ldy * 2);
    uint8_t *dxq = dev_poisoned((size_t)M * ldq), *dwq = dev_upload(wq, (size_t)N * K);
    float *dxs = dev_poisoned((size_t)hs_fp8_act_scale_count(M, K) * 4),
          *dws = dev_upload(wsp, (size_t)(NB * sld) * 4);
    ck_assert_int_eq(cudaMemset(dxq, 0, (size_t)M * ldq), cudaSuccess);
    ck_assert_int_eq(hs_kn_fp8_quant_groups(dx, K, M, K, dxq, ldq, dxs, NULL), HS_OK);
    int ok = 0;
    hs_status_t st = hs_lt_fp8_check(lt, ldy, ldq, bias, M, N, K, acc);
    if (st != HS_OK) {
        printf("fp8 gemm M=%d N=%d K=%d bias=%d acc=%d: cuBLASLt has no algorithm (refused)\n", M,
               N, K, bias, acc);
    } else {
        ck_assert_int_eq(hs_lt_linear_fp8(lt, dy, ldy, dxq, ldq, dxs, dwq, dws, bias ? db : NULL, M,
                                          N, K, acc, NULL),
                         HS_OK);
        float *got = dev_download_bf16(dy, (size_t)M * ldy);
        float amax = 0;
        for (int i = 0; i < M * N; i++)
            amax = fmaxf(amax, fabsf(ref[i]));
        char what[128];
        snprintf(what, sizeof what, "fp8 gemm M=%d N=%d K=%d bias=%d acc=%d", M, N, K, bias, acc);
        ok = compare(what, got, (size_t)ldy, ref, (size_t)N, (size_t)M, (size_t)N, 2e-3f * amax,
                     1.0f / 128);
        free(got);
    }
    cudaFree(dx);
    cudaFree(db);
    cudaFree(dy);
    cudaFree(dxq);
    cudaFree(dwq);
    cudaFree(dxs);
    cudaFree(dws);
    free(x);
    free(w);
    free(b);
    free(y0);
    free(xq);
    free(wq);
    free(xs);
    free(ws);
    free(wsp);
    free(ref);
    return st != HS_OK ? -1 : ok;
}

START_TEST(fp8_gemm_matches_the_dequantised_product)
{
    hs_lt_t *lt = NULL;
    ck_assert_int_eq(hs_lt_create(0, &lt), HS_OK);
    /* shapes of multiples of 128 must run and be right */
    static const int must[][5] = {
        {37, 256, 512, 0, 0},  /* odd M: 36 tokens, then 1 as a GEMM of 4 */
        {1, 384, 384, 0, 0},   /* 3 K blocks: padded factor rows; the tail alone */
        {64, 384, 384, 0, 0},  /* no tail */
        {37, 1000, 640, 0, 0}, /* a partial last N block */
        {37, 48, 1024, 0, 1},  /* N < 128, accumulate (the tail's rows copied in) */
        {130, 512, 2560, 0, 1},
    };
    for (size_t i = 0; i < sizeof must / sizeof must[0]; i++)
        ck_assert_int_eq(gemm_case(lt, must[i][0], must[i][1], must[i][2], must[i][3], must[i][4]),
                         1);
    /* K not a multiple of 128 (a short last K block), and a bias: refused
     * or right, never wrong (the forward runs such weights as bf16, or
     * refuses, unless these pass) */
    static const int maybe[][5] = {{37, 256, 192, 0, 0},
                                   {5, 128, 1008, 0, 1},
                                   /* the bias epilogue with block factors */
                                   {37, 1000, 640, 1, 0},
                                   {129, 512, 2560, 1, 1}};
    for (size_t i = 0; i < sizeof maybe / sizeof maybe[0]; i++)
        ck_assert_int_ne(
            gemm_case(lt, maybe[i][0], maybe[i][1], maybe[i][2], maybe[i][3], maybe[i][4]), 0);
    hs_lt_destroy(lt);
}
END_TEST

int main(void)
{
    struct cudaDeviceProp prop;
    if (!cuda_test_device("test_fp8_block_cuda", &prop)) return 77;
    Suite *s = suite_create("fp8_block_cuda");
    TCase *tc = tcase_create("fp8_block");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, activation_quantiser_matches_its_twin_bit_for_bit);
    tcase_add_test(tc, swiglu_fused_with_the_quantiser_equals_the_two_kernels);
    tcase_add_test(tc, gated_norm_fused_with_the_quantiser_equals_the_two_kernels);
    tcase_add_test(tc, rmsnorm_writing_fp8_equals_the_norm_then_the_quantiser);
    if (prop.major == 9)
        tcase_add_test(tc, fp8_gemm_matches_the_dequantised_product);
    else
        printf("fp8 gemm: block-scaled FP8 GEMMs need sm_90; not run on sm_%d%d\n", prop.major,
               prop.minor);
    suite_add_tcase(s, tc);
    return cuda_test_run(s);
}
