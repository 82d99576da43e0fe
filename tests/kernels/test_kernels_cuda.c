/* SPDX-License-Identifier: Apache-2.0 */
/* test_kernels_cuda.c - every CUDA kernel and the cuBLASLt wrapper against
 * its plain-C twin, on odd shapes (not multiples of 32), fixed seeds.
 *
 * Inputs are drawn in fp32, rounded to bf16, and the same bf16 values feed
 * both sides; the twin computes in fp32. A value passes when
 * |gpu - ref| <= abs + rel * |ref|; on failure the first values and the
 * largest difference are printed. Outputs are poisoned with NaN first, so an
 * unwritten element fails. Exits 77 (skipped) where there is no GPU. */
#include <check.h>
#include <dlfcn.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cuda_runtime_api.h>

#include "attention.h"
#include "hs_float.h"
#include "cuda_test_util.h"
#include "cublaslt.h"
#include "embedding.h"
#include "matmul.h"
#include "residual.h"
#include "rmsnorm.h"
#include "rope.h"
#include "sigmoid_gate.h"
#include "swiglu.h"
#include "hs_shuffle.h"

/* ---- tests --------------------------------------------------------------- */

START_TEST(embedding_gathers_the_rows_of_the_ids)
{
    g_rng = 1;
    const int vocab = 1001, T = 77;
    const int Hs[2] = {1000, 999}; /* 16-byte and scalar paths */
    for (int hi = 0; hi < 2; hi++) {
        int H = Hs[hi];
        uint16_t *tb;
        float *tf = rand_bf16((size_t)vocab * H, 0.f, 1.f, &tb);
        int32_t ids[77];
        for (int t = 0; t < T; t++)
            ids[t] = (int32_t)(hs_splitmix64(&g_rng) % (uint64_t)vocab);
        float *ref = malloc((size_t)T * H * sizeof(float));
        hs_kn_embedding_ref(tb, vocab, H, ids, T, ref);
        void *dt = dev_upload(tb, (size_t)vocab * H * 2), *di = dev_upload(ids, sizeof ids);
        void *dout = dev_poisoned_bf16((size_t)T * H);
        ck_assert_int_eq(hs_kn_embedding(dt, vocab, H, di, T, dout, H, NULL), HS_OK);
        float *got = dev_download_bf16(dout, (size_t)T * H);
        ck_assert(compare("embedding", got, H, ref, H, T, H, 0.f, 0.f));
        cudaFree(dt), cudaFree(di), cudaFree(dout);
        free(tb), free(tf), free(ref), free(got);
    }
}
END_TEST

START_TEST(rmsnorm_matches_its_twin_and_copies_the_input_row)
{
    g_rng = 2;
    const int rows = 77;
    /* vector rows up to and past the widest hidden sizes (5120, 8192);
     * an odd dim on the scalar path */
    const int dims[5] = {1000, 999, 5120, 8192, 8448};
    for (int di = 0; di < 5; di++) {
        int dim = dims[di];
        int xs = dim + 24 + (dim & 1), cs = 3 * dim + (dim & 1); /* strided rows */
        uint16_t *xb, *wb;
        float *xf = rand_bf16((size_t)rows * xs, 0.5f, 2.f, &xb);
        float *wf = rand_bf16((size_t)dim, 1.f, 0.2f, &wb);
        float *xd = malloc((size_t)rows * dim * sizeof(float));
        for (int r = 0; r < rows; r++)
            memcpy(xd + (size_t)r * dim, xf + (size_t)r * xs, dim * sizeof(float));
        float *ref = malloc((size_t)rows * dim * sizeof(float));
        hs_kn_rmsnorm_ref(xd, wb, ref, rows, dim, 1e-6f);
        void *dx = dev_upload(xb, (size_t)rows * xs * 2), *dw = dev_upload(wb, (size_t)dim * 2);
        void *dy = dev_poisoned_bf16((size_t)rows * dim),
             *dc = dev_poisoned_bf16((size_t)rows * cs);
        ck_assert_int_eq(hs_kn_rmsnorm(dx, xs, dw, dy, dim, rows, dim, 1e-6f, false, dc, cs, NULL),
                         HS_OK);
        float *got = dev_download_bf16(dy, (size_t)rows * dim);
        float *cp = dev_download_bf16(dc, (size_t)rows * cs);
        ck_assert(compare("rmsnorm", got, dim, ref, dim, rows, dim, 1e-3f, 1.6e-2f));
        ck_assert(compare("rmsnorm copy", cp, cs, xd, dim, rows, dim, 0.f, 0.f));
        cudaFree(dx), cudaFree(dw), cudaFree(dy), cudaFree(dc);
        free(xb), free(wb), free(xf), free(wf), free(xd), free(ref), free(got), free(cp);
    }
}
END_TEST

START_TEST(rmsnorm_heads_normalises_each_head_in_place)
{
    g_rng = 3;
    const int T = 77, nh = 5, D = 64, stride = (nh + 3) * D; /* q heads inside wider qkv rows */
    uint16_t *xb, *wb;
    float *xf = rand_bf16((size_t)T * stride, 0.f, 3.f, &xb);
    float *wf = rand_bf16(D, 1.f, 0.3f, &wb);
    float *ref = malloc((size_t)T * nh * D * sizeof(float));
    for (int t = 0; t < T; t++)
        memcpy(ref + (size_t)t * nh * D, xf + (size_t)t * stride, nh * D * sizeof(float));
    hs_kn_rmsnorm_ref(ref, wb, ref, T * nh, D, 1e-6f);
    void *dx = dev_upload(xb, (size_t)T * stride * 2), *dw = dev_upload(wb, D * 2);
    ck_assert_int_eq(hs_kn_rmsnorm_heads(dx, stride, T, nh, D, dw, 1e-6f, false, NULL), HS_OK);
    float *got = dev_download_bf16(dx, (size_t)T * stride);
    ck_assert(compare("rmsnorm heads", got, stride, ref, nh * D, T, nh * D, 1e-3f, 1.6e-2f));
    /* the columns after the heads are untouched */
    ck_assert(compare("rmsnorm heads rest", got + nh * D, stride, xf + nh * D, stride, T,
                      stride - nh * D, 0.f, 0.f));
    cudaFree(dx), cudaFree(dw);
    free(xb), free(wb), free(xf), free(wf), free(ref), free(got);
}
END_TEST

START_TEST(rope_restarts_positions_at_every_sequence_with_llama3_scaling)
{
    g_rng = 4;
    const int32_t cu[4] = {0, 37, 100, 1163}; /* odd lengths, one past 1024 */
    const int n_seqs = 3, T = 1163, nh = 7, D = 128, stride = nh * D + 2 * D;
    hs_rope_scaling_t sc = {HS_ROPE_LLAMA3, 8.f, 1.f, 4.f, 8192.f};
    float inv[64];
    hs_kn_rope_inv_freq(D, 500000.f, &sc, inv);
    uint16_t *xb;
    float *xf = rand_bf16((size_t)T * stride, 0.f, 1.f, &xb);
    float *ref = malloc((size_t)T * nh * D * sizeof(float));
    for (int t = 0; t < T; t++)
        memcpy(ref + (size_t)t * nh * D, xf + (size_t)t * stride, nh * D * sizeof(float));
    hs_kn_rope_ref(ref, cu, n_seqs, nh, D, inv);
    void *dx = dev_upload(xb, (size_t)T * stride * 2), *dcu = dev_upload(cu, sizeof cu);
    void *dinv = dev_upload(inv, sizeof inv), *dpos = NULL;
    ck_assert_int_eq(cudaMalloc(&dpos, T * sizeof(int32_t)), cudaSuccess);
    ck_assert_int_eq(hs_kn_rope_positions(dcu, n_seqs, dpos, NULL), HS_OK);
    ck_assert_int_eq(hs_kn_rope(dx, stride, T, nh, D, dpos, dinv, NULL), HS_OK);
    int32_t pos[1163];
    ck_assert_int_eq(cudaMemcpy(pos, dpos, sizeof pos, cudaMemcpyDeviceToHost), cudaSuccess);
    ck_assert_int_eq(pos[0], 0);
    ck_assert_int_eq(pos[36], 36);
    ck_assert_int_eq(pos[37], 0);
    ck_assert_int_eq(pos[1162], 1062);
    float *got = dev_download_bf16(dx, (size_t)T * stride);
    ck_assert(compare("rope", got, stride, ref, nh * D, T, nh * D, 2e-2f, 2e-2f));
    ck_assert(compare("rope rest", got + nh * D, stride, xf + nh * D, stride, T, 2 * D, 0.f, 0.f));
    /* rows one element off 4-byte alignment take the per-element kernel:
     * the same bits as the paired one */
    uint16_t *dodd = NULL;
    ck_assert_int_eq(cudaMalloc((void **)&dodd, ((size_t)T * stride + 1) * 2), cudaSuccess);
    ck_assert_int_eq(cudaMemcpy(dodd + 1, xb, (size_t)T * stride * 2, cudaMemcpyHostToDevice),
                     cudaSuccess);
    ck_assert_int_eq(hs_kn_rope(dodd + 1, stride, T, nh, D, dpos, dinv, NULL), HS_OK);
    float *odd = dev_download_bf16(dodd + 1, (size_t)T * stride);
    ck_assert(compare("rope per element", odd, stride, got, stride, T, stride, 0.f, 0.f));
    cudaFree(dx), cudaFree(dcu), cudaFree(dinv), cudaFree(dpos), cudaFree(dodd);
    free(xb), free(xf), free(ref), free(got), free(odd);
}
END_TEST

/* Qwen3.5's norms: weights near 0 scale as (1 + w), rounded once. The
 * plain kernel on the same weights is far off, so the test tells them apart. */
START_TEST(rmsnorm_zero_centred_scales_by_one_plus_w_over_rows_and_heads)
{
    g_rng = 11;
    const int rows = 77;
    /* vector rows up to and past the widest hidden sizes (5120, 8192);
     * an odd dim on the scalar path */
    const int dims[5] = {1000, 999, 5120, 8192, 8448};
    for (int di = 0; di < 5; di++) {
        int dim = dims[di], xs = dim + 24 + (dim & 1), cs = 2 * dim + (dim & 1);
        uint16_t *xb, *wb;
        float *xf = rand_bf16((size_t)rows * xs, 0.5f, 2.f, &xb);
        float *wf = rand_bf16((size_t)dim, 0.f, 0.1f, &wb);
        float *xd = malloc((size_t)rows * dim * sizeof(float));
        for (int r = 0; r < rows; r++)
            memcpy(xd + (size_t)r * dim, xf + (size_t)r * xs, dim * sizeof(float));
        float *ref = malloc((size_t)rows * dim * sizeof(float));
        hs_kn_rmsnorm_zc_ref(xd, wb, ref, rows, dim, 1e-6f);
        void *dx = dev_upload(xb, (size_t)rows * xs * 2), *dw = dev_upload(wb, (size_t)dim * 2);
        void *dy = dev_poisoned_bf16((size_t)rows * dim),
             *dc = dev_poisoned_bf16((size_t)rows * cs);
        ck_assert_int_eq(hs_kn_rmsnorm(dx, xs, dw, dy, dim, rows, dim, 1e-6f, true, dc, cs, NULL),
                         HS_OK);
        float *got = dev_download_bf16(dy, (size_t)rows * dim);
        float *cp = dev_download_bf16(dc, (size_t)rows * cs);
        /* one rounding to bf16: within half an ulp (2^-9 relative) */
        ck_assert(compare("rmsnorm zc", got, dim, ref, dim, rows, dim, 1e-6f, 4e-3f));
        ck_assert(compare("rmsnorm zc copy", cp, cs, xd, dim, rows, dim, 0.f, 0.f));
        cudaFree(dx), cudaFree(dw), cudaFree(dy), cudaFree(dc);
        free(xb), free(wb), free(xf), free(wf), free(xd), free(ref), free(got), free(cp);
    }
    /* per head in place (q/k norm of head_dim 256 inside wider rows) */
    const int T = 37, nh = 3, D = 256, stride = (nh + 2) * D + 8;
    uint16_t *xb, *wb;
    float *xf = rand_bf16((size_t)T * stride, 0.f, 3.f, &xb);
    float *wf = rand_bf16(D, 0.f, 0.3f, &wb);
    float *ref = malloc((size_t)T * nh * D * sizeof(float));
    for (int t = 0; t < T; t++)
        memcpy(ref + (size_t)t * nh * D, xf + (size_t)t * stride, nh * D * sizeof(float));
    hs_kn_rmsnorm_zc_ref(ref, wb, ref, T * nh, D, 1e-6f);
    void *dx = dev_upload(xb, (size_t)T * stride * 2), *dw = dev_upload(wb, D * 2);
    ck_assert_int_eq(hs_kn_rmsnorm_heads(dx, stride, T, nh, D, dw, 1e-6f, true, NULL), HS_OK);
    float *got = dev_download_bf16(dx, (size_t)T * stride);
    ck_assert(compare("rmsnorm heads zc", got, stride, ref, nh * D, T, nh * D, 1e-6f, 4e-3f));
    ck_assert(compare("rmsnorm heads zc rest", got + nh * D, stride, xf + nh * D, stride, T,
                      stride - nh * D, 0.f, 0.f));
    cudaFree(dx), cudaFree(dw);
    free(xb), free(wb), free(xf), free(wf), free(ref), free(got);
}
END_TEST

/* Qwen3.5's partial rotary: the first 64 of 256 dims rotate (theta 1e7),
 * the other 192 of each head stay exactly as they were. */
START_TEST(rope_partial_rotates_only_the_first_rotary_dims_of_each_head)
{
    g_rng = 12;
    const int32_t cu[4] = {0, 1, 65, 366};
    const int n_seqs = 3, T = 366, nh = 5, D = 256, R = 64, stride = nh * D + 2 * D;
    float inv[32];
    hs_kn_rope_inv_freq(R, 1e7f, NULL, inv);
    uint16_t *xb;
    float *xf = rand_bf16((size_t)T * stride, 0.f, 1.f, &xb);
    float *ref = malloc((size_t)T * nh * D * sizeof(float));
    for (int t = 0; t < T; t++)
        memcpy(ref + (size_t)t * nh * D, xf + (size_t)t * stride, nh * D * sizeof(float));
    hs_kn_rope_partial_ref(ref, cu, n_seqs, nh, D, R, inv);
    void *dx = dev_upload(xb, (size_t)T * stride * 2), *dcu = dev_upload(cu, sizeof cu);
    void *dinv = dev_upload(inv, sizeof inv), *dpos = NULL;
    ck_assert_int_eq(cudaMalloc(&dpos, T * sizeof(int32_t)), cudaSuccess);
    ck_assert_int_eq(hs_kn_rope_positions(dcu, n_seqs, dpos, NULL), HS_OK);
    ck_assert_int_eq(hs_kn_rope_partial(dx, stride, T, nh, D, R, dpos, dinv, NULL), HS_OK);
    float *got = dev_download_bf16(dx, (size_t)T * stride);
    ck_assert(compare("rope partial", got, stride, ref, nh * D, T, nh * D, 2e-2f, 2e-2f));
    for (int h = 0; h < nh; h++) /* the pass-through dims: bit for bit */
        ck_assert(compare("rope partial pass", got + h * D + R, stride, xf + h * D + R, stride, T,
                          D - R, 0.f, 0.f));
    ck_assert(compare("rope partial rest", got + nh * D, stride, xf + nh * D, stride, T, 2 * D, 0.f,
                      0.f));
    ck_assert_int_eq(hs_kn_rope_partial(dx, stride, T, nh, D, 7, dpos, dinv, NULL), HS_ERR_INVALID);
    cudaFree(dx), cudaFree(dcu), cudaFree(dinv), cudaFree(dpos);
    free(xb), free(xf), free(ref), free(got);
}
END_TEST

/* The attention output gate, x *= sigmoid(gate), with the gate read from
 * wider rows (the fused q_proj output); vector and scalar paths. */
START_TEST(sigmoid_gate_matches_its_twin_on_strided_gate_rows)
{
    g_rng = 13;
    const int T = 77;
    const int ns[2] = {1536, 333};
    for (int ni = 0; ni < 2; ni++) {
        int n = ns[ni], gs = 3 * n + (n & 1) * 3;
        uint16_t *xb, *gb;
        float *xf = rand_bf16((size_t)T * n, 0.f, 2.f, &xb);
        float *gf = rand_bf16((size_t)T * gs, 0.f, 3.f, &gb);
        float *gd = malloc((size_t)T * n * sizeof(float));
        float *ref = malloc((size_t)T * n * sizeof(float));
        memcpy(ref, xf, (size_t)T * n * sizeof(float));
        for (int t = 0; t < T; t++)
            memcpy(gd + (size_t)t * n, gf + (size_t)t * gs + 2 * n, n * sizeof(float));
        hs_kn_sigmoid_gate_ref(ref, gd, (size_t)T * n);
        void *dx = dev_upload(xb, (size_t)T * n * 2), *dg = dev_upload(gb, (size_t)T * gs * 2);
        ck_assert_int_eq(hs_kn_sigmoid_gate(dx, n, (const uint16_t *)dg + 2 * n, gs, T, n, NULL),
                         HS_OK);
        float *got = dev_download_bf16(dx, (size_t)T * n);
        ck_assert(compare("sigmoid gate", got, n, ref, n, T, n, 1e-3f, 8e-3f));
        cudaFree(dx), cudaFree(dg);
        free(xb), free(gb), free(xf), free(gf), free(gd), free(ref), free(got);
    }
}
END_TEST

START_TEST(swiglu_matches_its_twin_on_fused_gate_up_rows)
{
    g_rng = 5;
    const int T = 77;
    const int Is[2] = {1000, 333};
    for (int ii = 0; ii < 2; ii++) {
        int I = Is[ii];
        uint16_t *gub;
        float *guf = rand_bf16((size_t)T * 2 * I, 0.f, 2.f, &gub);
        float *g = malloc((size_t)T * I * sizeof(float)),
              *u = malloc((size_t)T * I * sizeof(float));
        for (int t = 0; t < T; t++) {
            memcpy(g + (size_t)t * I, guf + (size_t)t * 2 * I, I * sizeof(float));
            memcpy(u + (size_t)t * I, guf + (size_t)t * 2 * I + I, I * sizeof(float));
        }
        float *ref = malloc((size_t)T * I * sizeof(float));
        hs_kn_swiglu_ref(g, u, ref, (size_t)T * I);
        void *dgu = dev_upload(gub, (size_t)T * 2 * I * 2),
             *dout = dev_poisoned_bf16((size_t)T * I);
        ck_assert_int_eq(hs_kn_swiglu(dgu, 2 * I, dout, I, T, I, NULL), HS_OK);
        float *got = dev_download_bf16(dout, (size_t)T * I);
        ck_assert(compare("swiglu", got, I, ref, I, T, I, 1e-3f, 1.6e-2f));
        /* in place into the gate half, as the forward does */
        ck_assert_int_eq(hs_kn_swiglu(dgu, 2 * I, dgu, 2 * I, T, I, NULL), HS_OK);
        float *got2 = dev_download_bf16(dgu, (size_t)T * 2 * I);
        ck_assert(compare("swiglu in place", got2, 2 * I, ref, I, T, I, 1e-3f, 1.6e-2f));
        cudaFree(dgu), cudaFree(dout);
        free(gub), free(guf), free(g), free(u), free(ref), free(got), free(got2);
    }
}
END_TEST

START_TEST(residual_add_matches_its_twin)
{
    g_rng = 6;
    const size_t ns[2] = {77 * 1000, 77 * 999 + 3};
    for (int k = 0; k < 2; k++) {
        size_t n = ns[k];
        uint16_t *ab, *bb;
        float *af = rand_bf16(n, 0.f, 1.f, &ab), *bf = rand_bf16(n, 0.f, 1.f, &bb);
        float *ref = malloc(n * sizeof(float));
        hs_kn_residual_add_ref(af, bf, ref, n);
        void *da = dev_upload(ab, n * 2), *db = dev_upload(bb, n * 2), *dout = dev_poisoned_bf16(n);
        ck_assert_int_eq(hs_kn_residual_add(da, db, dout, n, NULL), HS_OK);
        float *got = dev_download_bf16(dout, n);
        ck_assert(compare("residual add", got, n, ref, n, 1, n, 1e-3f, 8e-3f));
        cudaFree(da), cudaFree(db), cudaFree(dout);
        free(ab), free(bb), free(af), free(bf), free(ref), free(got);
    }
}
END_TEST

START_TEST(linear_matches_matmul_twin_with_bias_and_accumulate)
{
    g_rng = 7;
    const int M = 77, N = 1000, K = 264, ldy = N + 8;
    uint16_t *xb, *wb, *bb, *yb;
    float *xf = rand_bf16((size_t)M * K, 0.f, 1.f, &xb);
    float *wf = rand_bf16((size_t)N * K, 0.f, 0.1f, &wb);
    float *bf = rand_bf16(N, 0.f, 1.f, &bb);
    float *yf = rand_bf16((size_t)M * ldy, 0.f, 1.f, &yb);
    float *ref = malloc((size_t)M * N * sizeof(float));
    hs_lt_t *lt = NULL;
    ck_assert_int_eq(hs_lt_create(0, &lt), HS_OK);
    void *dx = dev_upload(xb, (size_t)M * K * 2), *dw = dev_upload(wb, (size_t)N * K * 2);
    void *db = dev_upload(bb, N * 2), *dy = dev_poisoned_bf16((size_t)M * ldy);

    /* y = x W^T + b */
    hs_kn_matmul_ref(xf, wb, bb, ref, M, K, N);
    ck_assert_int_eq(hs_lt_linear(lt, dy, ldy, dx, K, dw, db, M, N, K, false, NULL), HS_OK);
    float *got = dev_download_bf16(dy, (size_t)M * ldy);
    ck_assert(compare("linear+bias", got, ldy, ref, N, M, N, 2e-2f, 1e-2f));
    free(got);

    /* y += x W^T (residual form), twice the same shape: one cached entry */
    ck_assert_int_eq(cudaMemcpy(dy, yb, (size_t)M * ldy * 2, cudaMemcpyHostToDevice), cudaSuccess);
    hs_kn_matmul_ref(xf, wb, NULL, ref, M, K, N);
    for (int m = 0; m < M; m++)
        for (int n = 0; n < N; n++)
            ref[(size_t)m * N + n] += yf[(size_t)m * ldy + n];
    int cached = hs_lt_cached_shapes(lt);
    ck_assert_int_eq(hs_lt_linear(lt, dy, ldy, dx, K, dw, NULL, M, N, K, true, NULL), HS_OK);
    got = dev_download_bf16(dy, (size_t)M * ldy);
    ck_assert(compare("linear accumulate", got, ldy, ref, N, M, N, 2e-2f, 1e-2f));
    ck_assert_int_eq(hs_lt_cached_shapes(lt), cached + 1);
    ck_assert_int_eq(hs_lt_linear(lt, dy, ldy, dx, K, dw, NULL, M, N, K, true, NULL), HS_OK);
    ck_assert_int_eq(hs_lt_cached_shapes(lt), cached + 1);
    free(got);

    ck_assert_int_eq(hs_lt_linear(lt, dy, N - 1, dx, K, dw, NULL, M, N, K, false, NULL),
                     HS_ERR_INVALID);
    hs_lt_destroy(lt);
    cudaFree(dx), cudaFree(dw), cudaFree(db), cudaFree(dy);
    free(xb), free(wb), free(bb), free(yb), free(xf), free(wf), free(bf), free(yf), free(ref);
}
END_TEST

/* One attention case: q/k/v live inside fused [T, (Hq + 2 Hkv) * D] rows. */
static void attention_case(const char *name, const int32_t *cu, int n_seqs, int Hq, int Hkv, int D,
                           int window)
{
    int T = cu[n_seqs];
    int stride = (Hq + 2 * Hkv) * D;
    uint16_t *xb;
    float *xf = rand_bf16((size_t)T * stride, 0.f, 1.f, &xb);
    /* sharpen the scores a little so the softmax is not flat */
    for (size_t t = 0; t < (size_t)T; t++)
        for (int i = 0; i < Hq * D; i++) {
            size_t j = t * stride + i;
            xb[j] = hs_f32_to_bf16(xf[j] * 2.5f);
            xf[j] = hs_bf16_to_f32(xb[j]);
        }
    float *q = malloc((size_t)T * Hq * D * sizeof(float));
    float *k = malloc((size_t)T * Hkv * D * sizeof(float)),
          *v = malloc((size_t)T * Hkv * D * sizeof(float));
    for (int t = 0; t < T; t++) {
        memcpy(q + (size_t)t * Hq * D, xf + (size_t)t * stride, Hq * D * sizeof(float));
        memcpy(k + (size_t)t * Hkv * D, xf + (size_t)t * stride + Hq * D, Hkv * D * sizeof(float));
        memcpy(v + (size_t)t * Hkv * D, xf + (size_t)t * stride + (Hq + Hkv) * D,
               Hkv * D * sizeof(float));
    }
    float scale = 1.f / sqrtf((float)D);
    float *ref = malloc((size_t)T * Hq * D * sizeof(float));
    hs_kn_attention_ref(q, k, v, ref, cu, n_seqs, Hq, Hkv, D, scale, window);
    void *dx = dev_upload(xb, (size_t)T * stride * 2),
         *dcu = dev_upload(cu, (n_seqs + 1) * sizeof(int32_t));
    void *dtiles = NULL;
    ck_assert_int_eq(cudaMalloc(&dtiles, (n_seqs + 1) * sizeof(int32_t)), cudaSuccess);
    int ostride = Hq * D + 8;
    void *dout = dev_poisoned_bf16((size_t)T * ostride);
    const uint16_t *dq = dx;
    ck_assert_int_eq(hs_kn_attention_schedule(dcu, n_seqs, dtiles, NULL), HS_OK);
    ck_assert_int_eq(hs_kn_attention(dq, stride, dq + Hq * D, dq + (Hq + Hkv) * D, stride, dout,
                                     ostride, dcu, dtiles, n_seqs, T, Hq, Hkv, D, scale, window,
                                     NULL),
                     HS_OK);
    float *got = dev_download_bf16(dout, (size_t)T * ostride);
    ck_assert(compare(name, got, ostride, ref, Hq * D, T, Hq * D, 1.5e-2f, 2e-2f));
    cudaFree(dx), cudaFree(dcu), cudaFree(dtiles), cudaFree(dout);
    free(xb), free(xf), free(q), free(k), free(v), free(ref), free(got);
}

START_TEST(attention_matches_its_twin_on_packed_odd_sequences)
{
    g_rng = 8;
    const int32_t cu1[6] = {0, 1, 64, 129, 259, 459}; /* 1, 63, 65, 130, 200 */
    attention_case("attention d64 gqa3", cu1, 5, 6, 2, 64, 0);
    const int32_t cu2[4] = {0, 300, 307, 436};
    attention_case("attention d128 gqa8", cu2, 3, 8, 1, 128, 0);
    const int32_t cu3[3] = {0, 77, 1100};
    attention_case("attention d128 mha", cu3, 2, 3, 3, 128, 0);
    const int32_t cu4[3] = {0, 250, 333};
    attention_case("attention d96 gqa2", cu4, 2, 4, 2, 96, 0);
    /* head sizes and unaligned rows that take the generic kernel */
    attention_case("attention d24 generic", cu4, 2, 4, 2, 24, 0);
    attention_case("attention d12 generic unaligned", cu1, 5, 8, 1, 12, 0);
}
END_TEST

START_TEST(attention_honours_the_sliding_window)
{
    g_rng = 9;
    const int32_t cu[3] = {0, 333, 400};
    attention_case("attention window 50", cu, 2, 4, 2, 64, 50);
    attention_case("attention window 100", cu, 2, 4, 1, 128, 100);
}
END_TEST

/* One case of the attention plan, on both of its kernels: the mma.sync one
 * (mma_only at create) and the one the plan picks (cuDNN's SDPA
 * on sm_90 where the build has cuDNN and libcudnn loads). q/k/v inside fused
 * rows, out rows wider than Hq * D. Returns the backend the plan picked. */
static int longest_of(const int32_t *cu, int n_seqs)
{
    int longest = 0;
    for (int i = 0; i < n_seqs; i++)
        if (cu[i + 1] - cu[i] > longest) longest = cu[i + 1] - cu[i];
    return longest;
}

static const char *attention_plan_case(const char *name, const int *lens, int n_seqs, int Hq,
                                       int Hkv, int D, int window, int max_tokens, int max_seqs)
{
    int32_t *cu = malloc(((size_t)n_seqs + 1) * sizeof(int32_t));
    cu[0] = 0;
    for (int i = 0; i < n_seqs; i++)
        cu[i + 1] = cu[i] + lens[i];
    const int T = cu[n_seqs], stride = (Hq + 2 * Hkv) * D, ostride = Hq * D + 8;
    uint16_t *xb;
    float *xf = rand_bf16((size_t)T * stride, 0.f, 1.f, &xb);
    for (size_t t = 0; t < (size_t)T; t++)
        for (int i = 0; i < Hq * D; i++) { /* sharper scores: the softmax is not flat */
            size_t j = t * stride + i;
            xb[j] = hs_f32_to_bf16(xf[j] * 2.5f);
            xf[j] = hs_bf16_to_f32(xb[j]);
        }
    float *q = malloc((size_t)T * Hq * D * sizeof(float));
    float *k = malloc((size_t)T * Hkv * D * sizeof(float)),
          *v = malloc((size_t)T * Hkv * D * sizeof(float));
    for (int t = 0; t < T; t++) {
        memcpy(q + (size_t)t * Hq * D, xf + (size_t)t * stride, Hq * D * sizeof(float));
        memcpy(k + (size_t)t * Hkv * D, xf + (size_t)t * stride + Hq * D, Hkv * D * sizeof(float));
        memcpy(v + (size_t)t * Hkv * D, xf + (size_t)t * stride + (Hq + Hkv) * D,
               Hkv * D * sizeof(float));
    }
    const float scale = 1.f / sqrtf((float)D);
    float *ref = malloc((size_t)T * Hq * D * sizeof(float));
    hs_kn_attention_ref(q, k, v, ref, cu, n_seqs, Hq, Hkv, D, scale, window);
    void *dx = dev_upload(xb, (size_t)T * stride * 2),
         *dcu = dev_upload(cu, ((size_t)n_seqs + 1) * sizeof(int32_t));
    const uint16_t *dq = dx;
    hs_kn_attn_desc_t desc = {max_tokens, max_seqs, Hq,    Hkv,    D,    stride,
                              stride,     ostride,  scale, window, false};
    const char *picked = NULL;
    for (int pass = 0; pass < 2; pass++) {
        desc.mma_only = pass == 0;
        hs_kn_attn_plan_t *plan = NULL;
        ck_assert_int_eq(hs_kn_attn_plan_create(&desc, &plan), HS_OK);
        void *dout = dev_poisoned_bf16((size_t)T * ostride);
        /* twice: a second run of the same batch must give the same result;
         * the first prepare reads the longest sequence back from the device,
         * the second is told it (the forward's path) and picks the same */
        const char *first = NULL;
        for (int rep = 0; rep < 2; rep++) {
            int told = rep == 0 ? 0 : longest_of(cu, n_seqs);
            ck_assert_int_eq(hs_kn_attn_plan_prepare(plan, dcu, n_seqs, T, told, NULL), HS_OK);
            if (rep == 1) ck_assert_str_eq(hs_kn_attn_plan_backend(plan), first);
            first = hs_kn_attn_plan_backend(plan);
            ck_assert_int_eq(
                hs_kn_attn_plan_run(plan, dq, dq + Hq * D, dq + (Hq + Hkv) * D, dout, NULL), HS_OK);
        }
        const char *backend = hs_kn_attn_plan_backend(plan);
        if (pass == 0) ck_assert_str_eq(backend, "mma");
        char what[160];
        snprintf(what, sizeof(what), "%s (%s)", name, backend);
        float *got = dev_download_bf16(dout, (size_t)T * ostride);
        ck_assert(compare(what, got, ostride, ref, Hq * D, T, Hq * D, 1.5e-2f, 2e-2f));
        if (pass == 1) picked = backend;
        hs_kn_attn_plan_destroy(plan);
        cudaFree(dout);
        free(got);
    }
    cudaFree(dx), cudaFree(dcu);
    free(cu), free(xb), free(xf), free(q), free(k), free(v), free(ref);
    return picked;
}

/* Whether the plan is expected to pick cuDNN here: a build with it, an
 * sm_90 device and a loadable libcudnn.so.9. */
static int expect_cudnn(void)
{
#ifdef HS_HAVE_CUDNN
    int major = 0;
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0) != cudaSuccess ||
        major != 9)
        return 0;
    void *h = dlopen("libcudnn.so.9", RTLD_NOW | RTLD_LOCAL);
    if (!h) return 0;
    dlclose(h);
    return 1;
#else
    return 0;
#endif
}

START_TEST(attention_plan_matches_its_twin_on_every_head_dim_and_gqa)
{
    g_rng = 10;
    const int odd[5] = {1, 63, 65, 1000, 8192}; /* 9321 tokens */
    const int mixed[7] = {65, 1, 1000, 63, 333, 7, 129};
    const int want = expect_cudnn();
    struct {
        const char *name;
        const int *lens;
        int n, Hq, Hkv, D;
    } cases[] = {
        {"plan d64 gqa1 1..8192", odd, 5, 3, 3, 64}, {"plan d80 gqa4", mixed, 7, 4, 1, 80},
        {"plan d96 gqa6", mixed, 7, 6, 1, 96},       {"plan d128 gqa4 1..8192", odd, 5, 4, 1, 128},
        {"plan d128 gqa6", mixed, 7, 12, 2, 128},    {"plan d256 gqa6 1..8192", odd, 5, 6, 1, 256},
        {"plan d256 gqa1", mixed, 7, 2, 2, 256},     {"plan d64 gqa4", mixed, 7, 8, 2, 64},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        int T = 0;
        for (int j = 0; j < cases[i].n; j++)
            T += cases[i].lens[j];
        const char *b = attention_plan_case(cases[i].name, cases[i].lens, cases[i].n, cases[i].Hq,
                                            cases[i].Hkv, cases[i].D, 0, T + 3, cases[i].n + 2);
        if (want)
            ck_assert_msg(strcmp(b, "cudnn") == 0, "%s ran on %s, not cudnn", cases[i].name, b);
    }
}
END_TEST

START_TEST(attention_plan_honours_the_sliding_window)
{
    g_rng = 11;
    const int lens[3] = {333, 67, 1};
    attention_plan_case("plan window 50 d64", lens, 3, 4, 2, 64, 50, 1000, 3);
    attention_plan_case("plan window 100 d128", lens, 3, 4, 1, 128, 100, 1000, 3);
}
END_TEST

/* A batch no bucket holds (more sequences of this length than the plan's
 * buckets take) runs on the mma.sync kernel, with the same results. */
START_TEST(attention_plan_falls_back_on_a_batch_no_bucket_holds)
{
    g_rng = 12;
    int lens[19] = {1000, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31, 33, 35, 37};
    /* max_tokens 2000: the buckets of 1024 take at most 8 x 2 = 16 sequences */
    const char *b = attention_plan_case("plan fallback", lens, 19, 4, 1, 128, 0, 2000, 20);
    ck_assert_str_eq(b, "mma");
}
END_TEST

int main(void)
{
    struct cudaDeviceProp prop;
    if (!cuda_test_device("test_kernels_cuda", &prop)) return 77;
    Suite *s = suite_create("kernels_cuda");
    TCase *tc = tcase_create("all");
    tcase_set_timeout(tc, 240);
    tcase_add_test(tc, embedding_gathers_the_rows_of_the_ids);
    tcase_add_test(tc, rmsnorm_matches_its_twin_and_copies_the_input_row);
    tcase_add_test(tc, rmsnorm_heads_normalises_each_head_in_place);
    tcase_add_test(tc, rope_restarts_positions_at_every_sequence_with_llama3_scaling);
    tcase_add_test(tc, rmsnorm_zero_centred_scales_by_one_plus_w_over_rows_and_heads);
    tcase_add_test(tc, rope_partial_rotates_only_the_first_rotary_dims_of_each_head);
    tcase_add_test(tc, sigmoid_gate_matches_its_twin_on_strided_gate_rows);
    tcase_add_test(tc, swiglu_matches_its_twin_on_fused_gate_up_rows);
    tcase_add_test(tc, residual_add_matches_its_twin);
    tcase_add_test(tc, linear_matches_matmul_twin_with_bias_and_accumulate);
    tcase_add_test(tc, attention_matches_its_twin_on_packed_odd_sequences);
    tcase_add_test(tc, attention_honours_the_sliding_window);
    tcase_add_test(tc, attention_plan_matches_its_twin_on_every_head_dim_and_gqa);
    tcase_add_test(tc, attention_plan_honours_the_sliding_window);
    tcase_add_test(tc, attention_plan_falls_back_on_a_batch_no_bucket_holds);
    suite_add_tcase(s, tc);
    return cuda_test_run(s);
}
