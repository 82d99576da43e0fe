/* SPDX-License-Identifier: Apache-2.0 */
/* test_gdn_cuda.c - the Gated DeltaNet CUDA kernels (causal conv1d, gates,
 * gated RMSNorm, delta rule) against their plain-C twins, on packed batches
 * of sequences of lengths 1, 63, 64, 65 and 200 (below, at and past one
 * 64-token chunk), odd channel counts and strided rows, fixed seeds.
 *
 * Inputs are drawn in fp32 and rounded to bf16; the same bf16 values feed
 * both sides and the twins compute in fp32. A value passes when
 * |gpu - ref| <= abs + rel * |ref|; on failure the first values and the
 * largest difference are printed. Outputs are poisoned with NaN first, so an
 * unwritten element fails. Exits 77 (skipped) where there is no GPU. */
#include <check.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cuda_runtime_api.h>

#include "hs_float.h"
#include "cuda_test_util.h"
#include "conv1d.h"
#include "cublaslt.h"
#include "delta_rule.h"
#include "delta_rule_int.h"
#include "gdn_gates.h"
#include "rmsnorm_gated.h"

/* ---- helpers ------------------------------------------------------------ */

/* Columns [c0, c0 + n) of rows x (row stride) as a dense [rows, n] copy. */
static float *columns(const float *x, size_t stride, int rows, int c0, int n)
{
    float *d = malloc((size_t)rows * n * sizeof(float));
    for (int r = 0; r < rows; r++)
        memcpy(d + (size_t)r * n, x + (size_t)r * stride + c0, n * sizeof(float));
    return d;
}

/* The packed batch every test uses: lengths 1, 63, 64, 65, 200. */
static const int32_t k_cu[6] = {0, 1, 64, 128, 193, 393};
enum { K_SEQS = 5, K_T = 393 };

/* ---- tests --------------------------------------------------------------- */

static void conv_case(const char *name, int C, int x_stride, int K, int silu)
{
    uint16_t *xb, *wb;
    float *xf = rand_bf16((size_t)K_T * x_stride, 0.f, 1.f, &xb);
    float *wf = rand_bf16((size_t)C * K, 0.f, 0.5f, &wb);
    float *xd = columns(xf, x_stride, K_T, 0, C);
    float *ref = malloc((size_t)K_T * C * sizeof(float));
    hs_kn_causal_conv1d_ref(xd, wb, ref, k_cu, K_SEQS, C, K, silu);
    void *dx = dev_upload(xb, (size_t)K_T * x_stride * 2), *dw = dev_upload(wb, (size_t)C * K * 2);
    void *dcu = dev_upload(k_cu, sizeof k_cu), *dy = dev_poisoned((size_t)K_T * C * 2);
    ck_assert_int_eq(
        hs_kn_causal_conv1d(dx, x_stride, dw, dy, C, dcu, K_SEQS, K_T, C, K, silu, NULL), HS_OK);
    float *got = dev_download_bf16(dy, (size_t)K_T * C);
    ck_assert(compare(name, got, C, ref, C, K_T, C, 1e-3f, 8e-3f));

    /* the fourth sequence (65 tokens) alone gives the same bits */
    int32_t one[2] = {0, k_cu[4] - k_cu[3]};
    void *dcu1 = dev_upload(one, sizeof one), *dy1 = dev_poisoned((size_t)one[1] * C * 2);
    ck_assert_int_eq(hs_kn_causal_conv1d((const uint16_t *)dx + (size_t)k_cu[3] * x_stride,
                                         x_stride, dw, dy1, C, dcu1, 1, one[1], C, K, silu, NULL),
                     HS_OK);
    float *alone = dev_download_bf16(dy1, (size_t)one[1] * C);
    ck_assert(compare("conv1d alone", alone, C, got + (size_t)k_cu[3] * C, C, one[1], C, 0.f, 0.f));
    cudaFree(dx), cudaFree(dw), cudaFree(dcu), cudaFree(dy), cudaFree(dcu1), cudaFree(dy1);
    free(xb), free(wb), free(xf), free(wf), free(xd), free(ref), free(got), free(alone);
}

START_TEST(causal_conv1d_restarts_its_window_at_every_sequence)
{
    g_rng = 11;
    conv_case("conv1d vec silu", 96, 96 + 40, 4, 1);
    conv_case("conv1d scalar silu", 77, 77 + 3, 4, 1);
    conv_case("conv1d vec K2 linear", 64, 64, 2, 0);
    /* past one block's 2048 channels; K 6 runs a tile of 8 tokens, not 16 */
    conv_case("conv1d vec wide silu", 2056, 2056 + 8, 4, 1);
    conv_case("conv1d vec K6 silu", 64, 72, 6, 1);
}
END_TEST

START_TEST(gdn_gates_match_their_twin)
{
    g_rng = 12;
    const int H = 7, as = 19, bs = 23; /* a, b columns inside wider rows */
    uint16_t *ab, *bb;
    float *af = rand_bf16((size_t)K_T * as, 0.f, 8.f, &ab); /* reaches the softplus threshold */
    float *bf = rand_bf16((size_t)K_T * bs, 0.f, 3.f, &bb);
    float A_log[7], dt[7];
    for (int h = 0; h < H; h++)
        A_log[h] = logf(1.f + 15.f * (float)h / H), dt[h] = 0.5f * randn();
    float *ad = columns(af, as, K_T, 3, H), *bd = columns(bf, bs, K_T, 5, H);
    float *g_ref = malloc((size_t)K_T * H * sizeof(float));
    float *b_ref = malloc((size_t)K_T * H * sizeof(float));
    hs_kn_gdn_gates_ref(ad, bd, A_log, dt, g_ref, b_ref, K_T, H);
    void *da = dev_upload(ab, (size_t)K_T * as * 2), *db = dev_upload(bb, (size_t)K_T * bs * 2);
    void *dA = dev_upload(A_log, sizeof A_log), *ddt = dev_upload(dt, sizeof dt);
    void *dg = dev_poisoned((size_t)K_T * H * 4), *dbeta = dev_poisoned((size_t)K_T * H * 4);
    ck_assert_int_eq(hs_kn_gdn_gates((const uint16_t *)da + 3, as, (const uint16_t *)db + 5, bs, dA,
                                     ddt, dg, dbeta, K_T, H, NULL),
                     HS_OK);
    float *g = dev_download_f32(dg, (size_t)K_T * H),
          *beta = dev_download_f32(dbeta, (size_t)K_T * H);
    ck_assert(compare("gdn gates g", g, H, g_ref, H, K_T, H, 1e-6f, 1e-5f));
    ck_assert(compare("gdn gates beta", beta, H, b_ref, H, K_T, H, 1e-6f, 1e-5f));
    cudaFree(da), cudaFree(db), cudaFree(dA), cudaFree(ddt), cudaFree(dg), cudaFree(dbeta);
    free(ab), free(bb), free(af), free(bf), free(ad), free(bd), free(g_ref), free(b_ref);
    free(g), free(beta);
}
END_TEST

static void rmsnorm_gated_case(const char *name, int rows, int dim, int xs, int zs, int in_place)
{
    uint16_t *xb, *zb, *wb;
    float *xf = rand_bf16((size_t)rows * xs, 0.f, 2.f, &xb);
    float *zf = rand_bf16((size_t)rows * zs, 0.f, 2.f, &zb);
    float *wf = rand_bf16(dim, 1.f, 0.3f, &wb);
    float *xd = columns(xf, xs, rows, 0, dim), *zd = columns(zf, zs, rows, 0, dim);
    float *ref = malloc((size_t)rows * dim * sizeof(float));
    hs_kn_rmsnorm_gated_ref(xd, zd, wb, ref, rows, dim, 1e-6f);
    void *dx = dev_upload(xb, (size_t)rows * xs * 2), *dz = dev_upload(zb, (size_t)rows * zs * 2);
    void *dw = dev_upload(wb, (size_t)dim * 2);
    void *dy = in_place ? dx : dev_poisoned((size_t)rows * xs * 2);
    ck_assert_int_eq(hs_kn_rmsnorm_gated(dx, xs, dz, zs, dw, dy, xs, rows, dim, 1e-6f, NULL),
                     HS_OK);
    float *got = dev_download_bf16(dy, (size_t)rows * xs);
    ck_assert(compare(name, got, xs, ref, dim, rows, dim, 1e-3f, 8e-3f));
    cudaFree(dx), cudaFree(dz), cudaFree(dw);
    if (!in_place) cudaFree(dy);
    free(xb), free(zb), free(wb), free(xf), free(zf), free(wf), free(xd), free(zd), free(ref);
    free(got);
}

START_TEST(rmsnorm_gated_matches_its_twin)
{
    g_rng = 13;
    rmsnorm_gated_case("rmsnorm_gated vec", K_T * 3, 128, 128, 128, 0);
    rmsnorm_gated_case("rmsnorm_gated vec in place", K_T * 3, 256, 256, 264, 1);
    rmsnorm_gated_case("rmsnorm_gated scalar", K_T, 100, 101, 100, 0);
    /* 8 lanes a row; 32 lanes with the last 15 holding nothing; a warp a row */
    rmsnorm_gated_case("rmsnorm_gated vec 64", K_T, 64, 64, 72, 0);
    rmsnorm_gated_case("rmsnorm_gated vec 136", K_T, 136, 144, 136, 0);
    rmsnorm_gated_case("rmsnorm_gated vec 512", 37, 512, 512, 512, 0);
}
END_TEST

/* One delta-rule case on the packed batch cu (n_seqs sequences, T tokens):
 * q, k, v inside the conv's [T, 2 nk dk + nv dv] rows (plus 8 spare
 * columns), gates drawn as a trained model's are (decay per step between
 * about 0.99 and 0.3, beta in (0, 1)). hs_kn_delta_rule (the chunked form
 * where the shape allows) and the recurrent form are each compared with the
 * C twin, and with each other.
 *
 * Bounds: the recurrent form differs from the twin only by fp32 summation
 * order and the output's bf16 rounding (2^-9 relative). The chunked form
 * also rounds w, u, v', P and the state as a product operand to bf16, each
 * a 2^-9 relative error on terms that are summed over a chunk, so it gets
 * twice the absolute bound on outputs of about 0.1 to 1. */
static void delta_case(const char *name, const int32_t *cu, int n_seqs, int nk, int nv, int dk,
                       int dv)
{
    const int T = cu[n_seqs], stride = 2 * nk * dk + nv * dv + 8, ov = nv * dv;
    uint16_t *xb;
    float *xf = rand_bf16((size_t)T * stride, 0.f, 1.f, &xb);
    float *g = malloc((size_t)T * nv * sizeof(float)), *beta = malloc((size_t)T * nv * 4);
    for (int i = 0; i < T * nv; i++) {
        g[i] = -0.1f * expf(1.2f * randn());
        if (g[i] < -1.2f) g[i] = -1.2f;
        beta[i] = 1.f / (1.f + expf(-randn()));
    }
    float *ref = malloc((size_t)T * ov * sizeof(float));
    ck_assert_int_eq(hs_kn_delta_rule_ref(xf, xf + nk * dk, xf + 2 * nk * dk, stride, g, beta, ref,
                                          cu, n_seqs, nk, nv, dk, dv),
                     0);
    size_t ws_bytes = hs_kn_delta_rule_workspace_bytes(T, n_seqs, nk, nv, dk, dv);
    void *dx = dev_upload(xb, (size_t)T * stride * 2), *dcu = dev_upload(cu, (n_seqs + 1) * 4);
    void *dg = dev_upload(g, (size_t)T * nv * 4), *db = dev_upload(beta, (size_t)T * nv * 4);
    void *dout = dev_poisoned((size_t)T * ov * 2), *ws = dev_poisoned(ws_bytes);
    void *drec = dev_poisoned((size_t)T * ov * 2);
    const uint16_t *q = dx, *k = q + nk * dk, *v = k + nk * dk;
    ck_assert_int_eq(hs_kn_delta_rule(q, k, v, stride, dg, db, dout, ov, dcu, n_seqs, T, nk, nv, dk,
                                      dv, ws, ws_bytes, NULL),
                     HS_OK);
    ck_assert_int_eq(hs__kn_delta_rule_recurrent(q, k, v, stride, dg, db, drec, ov, dcu, n_seqs, T,
                                                 nk, nv, dk, dv, NULL),
                     HS_OK);
    float *got = dev_download_bf16(dout, (size_t)T * ov);
    float *rec = dev_download_bf16(drec, (size_t)T * ov);
    char what[160];
    snprintf(what, sizeof what, "%s recurrent vs twin", name);
    ck_assert(compare(what, rec, ov, ref, ov, T, ov, 2e-3f, 1.2e-2f));
    snprintf(what, sizeof what, "%s vs twin", name);
    ck_assert(compare(what, got, ov, ref, ov, T, ov, 4e-3f, 1.2e-2f));
    snprintf(what, sizeof what, "%s vs recurrent", name);
    ck_assert(compare(what, got, ov, rec, ov, T, ov, 4e-3f, 1.2e-2f));
    if ((dk == 64 || dk == 128) && (dv == 64 || dv == 128)) {
        /* the state pass on wgmma (sm_90) against the mma.sync one: the same
         * sums in the same order (the same bits on the H200); the bound
         * leaves room for another GPU's tensor cores to order a k-step's
         * sum differently */
        void *dmma = dev_poisoned((size_t)T * ov * 2);
        ck_assert_int_eq(hs__kn_delta_rule_chunked_mma(q, k, v, stride, dg, db, dmma, ov, dcu,
                                                       n_seqs, T, nk, nv, dk, dv, ws, ws_bytes,
                                                       NULL),
                         HS_OK);
        float *mma = dev_download_bf16(dmma, (size_t)T * ov);
        snprintf(what, sizeof what, "%s, state pass on %s vs mma.sync", name,
                 hs__kn_delta_rule_wgmma() ? "wgmma" : "mma.sync");
        ck_assert(compare(what, got, ov, mma, ov, T, ov, 4e-3f, 1.2e-2f));
        cudaFree(dmma), free(mma);
    }

    /* the last sequence alone gives the same bits */
    int32_t one[2] = {0, cu[n_seqs] - cu[n_seqs - 1]};
    size_t off = (size_t)cu[n_seqs - 1];
    void *dcu1 = dev_upload(one, sizeof one), *dout1 = dev_poisoned((size_t)one[1] * ov * 2);
    ck_assert_int_eq(hs_kn_delta_rule(q + off * stride, k + off * stride, v + off * stride, stride,
                                      (const float *)dg + off * nv, (const float *)db + off * nv,
                                      dout1, ov, dcu1, 1, one[1], nk, nv, dk, dv, ws, ws_bytes,
                                      NULL),
                     HS_OK);
    float *alone = dev_download_bf16(dout1, (size_t)one[1] * ov);
    ck_assert(compare("delta rule alone", alone, ov, got + off * ov, ov, one[1], ov, 0.f, 0.f));
    cudaFree(dx), cudaFree(dcu), cudaFree(dg), cudaFree(db), cudaFree(dout), cudaFree(ws);
    cudaFree(drec), cudaFree(dcu1), cudaFree(dout1);
    free(xb), free(xf), free(g), free(beta), free(ref), free(got), free(rec), free(alone);
}

START_TEST(delta_rule_matches_its_twin_on_packed_sequences)
{
    g_rng = 14;
    delta_case("delta rule 16/48 heads of 128", k_cu, K_SEQS, 16, 48, 128, 128);
    delta_case("delta rule 2/2 heads of 64", k_cu, K_SEQS, 2, 2, 64, 64);
    delta_case("delta rule 1/2 heads dk 64 dv 128", k_cu, K_SEQS, 1, 2, 64, 128);
    delta_case("delta rule 2/4 heads dk 128 dv 64", k_cu, K_SEQS, 2, 4, 128, 64);
    delta_case("delta rule 1/3 heads dk 48 dv 40", k_cu, K_SEQS, 1, 3, 48, 40);
    delta_case("delta rule 1/2 heads dk 256 dv 200", k_cu, K_SEQS, 1, 2, 256, 200);
    /* the state carried over 48 chunks; 3 sequences, one empty */
    static const int32_t cu_long[4] = {0, 3001, 3001, 3070};
    delta_case("delta rule long 1/3 heads of 128", cu_long, 3, 1, 3, 128, 128);
}
END_TEST

START_TEST(delta_rule_refuses_a_short_workspace_bad_heads_and_an_oversized_launch)
{
    size_t need = hs_kn_delta_rule_workspace_bytes(K_T, K_SEQS, 2, 6, 128, 128);
    void *dcu = dev_upload(k_cu, sizeof k_cu);
    /* value heads not a multiple of key heads */
    ck_assert_int_eq(hs_kn_delta_rule(NULL, NULL, NULL, 2048, NULL, NULL, NULL, 768, dcu, K_SEQS,
                                      K_T, 4, 6, 128, 128, NULL, need, NULL),
                     HS_ERR_INVALID);
    if (need > 0)
        ck_assert_int_eq(hs_kn_delta_rule(NULL, NULL, NULL, 2048, NULL, NULL, NULL, 768, dcu,
                                          K_SEQS, K_T, 2, 6, 128, 128, NULL, need - 1, NULL),
                         HS_ERR_INVALID);
    /* more chunks x value heads than one launch holds: refused before any
     * launch (the pointers are never touched; only sizes are checked) */
    void *fake = (void *)(uintptr_t)4096;
    ck_assert_int_eq(hs_kn_delta_rule(fake, fake, fake, 4096, NULL, NULL, fake, 16384, dcu, 1,
                                      1 << 30, 16, 128, 128, 128, fake, SIZE_MAX, NULL),
                     HS_ERR_INVALID);
    ck_assert_int_eq(cudaGetLastError(), cudaSuccess);
    cudaFree(dcu);
}
END_TEST

int main(void)
{
    struct cudaDeviceProp prop;
    if (!cuda_test_device("test_gdn_cuda", &prop)) return 77;
    Suite *s = suite_create("gdn_cuda");
    TCase *tc = tcase_create("all");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, causal_conv1d_restarts_its_window_at_every_sequence);
    tcase_add_test(tc, gdn_gates_match_their_twin);
    tcase_add_test(tc, rmsnorm_gated_matches_its_twin);
    tcase_add_test(tc, delta_rule_matches_its_twin_on_packed_sequences);
    tcase_add_test(tc, delta_rule_refuses_a_short_workspace_bad_heads_and_an_oversized_launch);
    suite_add_tcase(s, tc);
    return cuda_test_run(s);
}
