/* SPDX-License-Identifier: Apache-2.0 */
/* cublaslt.c - cuBLASLt wrapper: bf16 row-major Linear layers with fp32
 * accumulation, descriptors and algorithms cached per shape.
 *
 * Row-major y[M,N] = x[M,K] W[N,K]^T is, in cuBLAS's column-major terms,
 * D (N x M, ld ldy) = A^T · B with A = W seen as K x N (ld K) and B = x seen
 * as K x M (ld ldx). The bias epilogue adds a vector along D's rows, which
 * are the output features. */
#include "cublaslt.h"
#include "fp8_block.h"
#include "hs_log.h"
#include "hs_memory.h"

#include <stdlib.h>
#include <string.h>
#include <cublasLt.h>

#define HS_LT_CACHE_CAP 128

typedef struct {
    int M, N, K;
    int64_t ldx, ldy;
    bool bias, accumulate;
    bool fp8; /* e4m3 operands with block scales */
} hs_lt_key_t;

typedef struct {
    hs_lt_key_t key;
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t a, b, c;
    cublasLtMatmulAlgo_t algo;
    bool used;
} hs_lt_entry_t;

struct hs_lt {
    cublasLtHandle_t handle;
    void *workspace;
    size_t workspace_bytes;
    void *tail;        /* FP8: the last M % 4 tokens' operand and output rows, as 4 */
    size_t tail_bytes; /* (see hs_lt_linear_fp8) */
    hs_lt_entry_t cache[HS_LT_CACHE_CAP];
    int n_cached;
    int next_evict;
};

static hs_status_t lt_status(cublasStatus_t s, const char *what, int line)
{
    if (s == CUBLAS_STATUS_SUCCESS) return HS_OK;
    hs_log_write(HS_LOG_ERROR, __FILE__, line, "cublaslt: %s failed: %s (%d)", what,
                 cublasLtGetStatusString(s), (int)s);
    return HS_ERR_CUDA;
}
#define LT_CHECK(call) lt_status((call), #call, __LINE__)

static void entry_release(hs_lt_entry_t *e)
{
    if (!e->used) return;
    if (e->op) cublasLtMatmulDescDestroy(e->op);
    if (e->a) cublasLtMatrixLayoutDestroy(e->a);
    if (e->b) cublasLtMatrixLayoutDestroy(e->b);
    if (e->c) cublasLtMatrixLayoutDestroy(e->c);
    memset(e, 0, sizeof(*e));
}

hs_status_t hs_lt_create(size_t workspace_bytes, hs_lt_t **out)
{
    hs_status_t st;
    hs_lt_t *lt = calloc(1, sizeof(*lt));
    if (!lt) return HS_ERR_NOMEM;
    lt->workspace_bytes = workspace_bytes ? workspace_bytes : HS_LT_WORKSPACE_DEFAULT;
    st = LT_CHECK(cublasLtCreate(&lt->handle));
    if (st) goto err_free;
    st = HS_CUDA_CHECK(cudaMalloc(&lt->workspace, lt->workspace_bytes));
    if (st) goto err_handle;
    *out = lt;
    return HS_OK;
err_handle:
    cublasLtDestroy(lt->handle);
err_free:
    free(lt);
    return st;
}

void hs_lt_destroy(hs_lt_t *lt)
{
    if (!lt) return;
    for (int i = 0; i < HS_LT_CACHE_CAP; i++)
        entry_release(&lt->cache[i]);
    cudaFree(lt->workspace);
    cudaFree(lt->tail);
    cublasLtDestroy(lt->handle);
    free(lt);
}

int hs_lt_cached_shapes(const hs_lt_t *lt) { return lt ? lt->n_cached : 0; }

static bool key_eq(const hs_lt_key_t *a, const hs_lt_key_t *b)
{
    return a->M == b->M && a->N == b->N && a->K == b->K && a->ldx == b->ldx && a->ldy == b->ldy &&
           a->bias == b->bias && a->accumulate == b->accumulate && a->fp8 == b->fp8;
}

/* FP8: A (the weight) in 128x128 blocks, B (the activations) in groups of
 * 128 along K. The heuristic wants scale pointers set: the workspace stands
 * in until a call sets the real ones. */
static hs_status_t set_fp8_modes(hs_lt_t *lt, cublasLtMatmulDesc_t op)
{
    int32_t a_mode = CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F;
    int32_t b_mode = CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
    const void *stand_in = lt->workspace;
    hs_status_t st = LT_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_A_SCALE_MODE,
                                                             &a_mode, sizeof(a_mode)));
    if (!st)
        st = LT_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &b_mode,
                                                     sizeof(b_mode)));
    if (!st)
        st = LT_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER,
                                                     &stand_in, sizeof(stand_in)));
    if (!st)
        st = LT_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER,
                                                     &stand_in, sizeof(stand_in)));
    return st;
}

/* Build descriptors and pick an algorithm for one shape. */
static hs_status_t entry_build(hs_lt_t *lt, const hs_lt_key_t *k, hs_lt_entry_t *e, bool quiet)
{
    hs_status_t st;
    cublasLtMatmulPreference_t pref = NULL;
    cublasLtMatmulHeuristicResult_t heur;
    int n_heur = 0;
    cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    cublasLtEpilogue_t epi = k->bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;

    memset(e, 0, sizeof(*e));
    e->used = true;
    e->key = *k;
    st = LT_CHECK(cublasLtMatmulDescCreate(&e->op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    if (st) goto err;
    st = LT_CHECK(
        cublasLtMatmulDescSetAttribute(e->op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
    if (st) goto err;
    st = LT_CHECK(
        cublasLtMatmulDescSetAttribute(e->op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
    if (st) goto err;
    st = LT_CHECK(
        cublasLtMatmulDescSetAttribute(e->op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi)));
    if (st) goto err;
    if (k->fp8 && (st = set_fp8_modes(lt, e->op))) goto err;
    if (k->bias) {
        cudaDataType_t bt = CUDA_R_16BF;
        st = LT_CHECK(cublasLtMatmulDescSetAttribute(e->op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE,
                                                     &bt, sizeof(bt)));
        if (st) goto err;
    }
    cudaDataType_t in_type = k->fp8 ? CUDA_R_8F_E4M3 : CUDA_R_16BF;
    st = LT_CHECK(cublasLtMatrixLayoutCreate(&e->a, in_type, (uint64_t)k->K, (uint64_t)k->N, k->K));
    if (st) goto err;
    st = LT_CHECK(
        cublasLtMatrixLayoutCreate(&e->b, in_type, (uint64_t)k->K, (uint64_t)k->M, k->ldx));
    if (st) goto err;
    st = LT_CHECK(
        cublasLtMatrixLayoutCreate(&e->c, CUDA_R_16BF, (uint64_t)k->N, (uint64_t)k->M, k->ldy));
    if (st) goto err;
    st = LT_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    if (st) goto err;
    st = LT_CHECK(
        cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                             &lt->workspace_bytes, sizeof(lt->workspace_bytes)));
    if (st) goto err_pref;
    st = LT_CHECK(cublasLtMatmulAlgoGetHeuristic(lt->handle, e->op, e->a, e->b, e->c, e->c, pref, 1,
                                                 &heur, &n_heur));
    if (st) goto err_pref;
    if (n_heur < 1) {
        hs_log(quiet ? HS_LOG_DEBUG : HS_LOG_ERROR,
               "cublaslt: no %salgorithm for M=%d N=%d K=%d ldx=%lld ldy=%lld; check that strides "
               "are multiples of 8 (fp8: 16) and pointers 16-byte aligned",
               k->fp8 ? "fp8 block-scaled " : "", k->M, k->N, k->K, (long long)k->ldx,
               (long long)k->ldy);
        st = HS_ERR_UNSUPPORTED;
        goto err_pref;
    }
    e->algo = heur.algo;
    cublasLtMatmulPreferenceDestroy(pref);
    return HS_OK;
err_pref:
    cublasLtMatmulPreferenceDestroy(pref);
err:
    entry_release(e);
    return st;
}

static hs_status_t entry_get(hs_lt_t *lt, const hs_lt_key_t *k, bool quiet, hs_lt_entry_t **out)
{
    for (int i = 0; i < HS_LT_CACHE_CAP; i++) {
        if (lt->cache[i].used && key_eq(&lt->cache[i].key, k)) {
            *out = &lt->cache[i];
            return HS_OK;
        }
    }
    hs_lt_entry_t *slot = NULL;
    for (int i = 0; i < HS_LT_CACHE_CAP && !slot; i++)
        if (!lt->cache[i].used) slot = &lt->cache[i];
    if (!slot) { /* full: evict round-robin (a forward uses a handful of shapes per batch shape) */
        slot = &lt->cache[lt->next_evict];
        lt->next_evict = (lt->next_evict + 1) % HS_LT_CACHE_CAP;
        entry_release(slot);
        lt->n_cached--;
    }
    hs_status_t st = entry_build(lt, k, slot, quiet);
    if (st) return st;
    lt->n_cached++;
    hs_debug("cublaslt: cached shape M=%d N=%d K=%d bias=%d acc=%d (%d cached)", k->M, k->N, k->K,
             k->bias, k->accumulate, lt->n_cached);
    *out = slot;
    return HS_OK;
}

hs_status_t hs_lt_linear(hs_lt_t *lt, void *y, int64_t ldy, const void *x, int64_t ldx,
                         const void *w, const void *bias, int M, int N, int K, bool accumulate,
                         cudaStream_t stream)
{
    if (!lt || !y || !x || !w || M <= 0 || N <= 0 || K <= 0 || ldy < N || ldx < K) {
        hs_error("cublaslt: bad linear arguments M=%d N=%d K=%d ldx=%lld ldy=%lld", M, N, K,
                 (long long)ldx, (long long)ldy);
        return HS_ERR_INVALID;
    }
    hs_lt_key_t key = {M, N, K, ldx, ldy, bias != NULL, accumulate, false};
    hs_lt_entry_t *e;
    hs_status_t st = entry_get(lt, &key, false, &e);
    if (st) return st;
    if (bias) {
        st = LT_CHECK(cublasLtMatmulDescSetAttribute(e->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                     &bias, sizeof(bias)));
        if (st) return st;
    }
    const float alpha = 1.0f, beta = accumulate ? 1.0f : 0.0f;
    return LT_CHECK(cublasLtMatmul(lt->handle, e->op, &alpha, w, e->a, x, e->b, &beta, y, e->c, y,
                                   e->c, &e->algo, lt->workspace, lt->workspace_bytes, stream));
}

static bool fp8_args_ok(int64_t ldy, int64_t ldxq, int M, int N, int K)
{
    return M > 0 && N > 0 && K > 0 && ldy >= N && ldxq >= K && K % 16 == 0 && ldxq % 16 == 0 &&
           ldy % 8 == 0;
}

/* The tail's rows: 4 of the quantised input (ldxq) and 4 of the output
 * (N rounded up to 8), 256-byte aligned. */
static size_t tail_out_offset(int64_t ldxq) { return ((size_t)4 * (size_t)ldxq + 255) / 256 * 256; }

static hs_status_t tail_reserve(hs_lt_t *lt, int64_t ldxq, int N)
{
    size_t need = tail_out_offset(ldxq) + (size_t)4 * hs_align_up((size_t)N, 8) * 2;
    if (need <= lt->tail_bytes) return HS_OK;
    cudaFree(lt->tail);
    lt->tail = NULL;
    lt->tail_bytes = 0;
    hs_status_t st = HS_CUDA_CHECK(cudaMalloc(&lt->tail, need));
    if (st) return st;
    st = HS_CUDA_CHECK(cudaMemset(lt->tail, 0, need));
    if (!st) lt->tail_bytes = need;
    return st;
}

hs_status_t hs_lt_fp8_check(hs_lt_t *lt, int64_t ldy, int64_t ldxq, bool bias, int M, int N, int K,
                            bool accumulate)
{
    if (!lt || !fp8_args_ok(ldy, ldxq, M, N, K)) return HS_ERR_UNSUPPORTED;
    hs_lt_entry_t *e;
    if (M >= 4) {
        hs_lt_key_t key = {M & ~3, N, K, ldxq, ldy, bias, accumulate, true};
        hs_status_t st = entry_get(lt, &key, true, &e);
        if (st) return st;
    }
    if (M % 4 == 0) return HS_OK;
    int64_t ldt = (int64_t)hs_align_up((size_t)N, 8);
    hs_lt_key_t key = {4, N, K, ldxq, ldt, bias, accumulate, true};
    hs_status_t st = entry_get(lt, &key, true, &e);
    return st ? st : tail_reserve(lt, ldxq, N);
}

/* One FP8 GEMM of M (a multiple of 4) tokens. */
static hs_status_t linear_fp8(hs_lt_t *lt, void *y, int64_t ldy, const void *xq, int64_t ldxq,
                              const float *xs, const void *wq, const float *ws, const void *bias,
                              int M, int N, int K, bool accumulate, cudaStream_t stream)
{
    hs_lt_key_t key = {M, N, K, ldxq, ldy, bias != NULL, accumulate, true};
    hs_lt_entry_t *e;
    hs_status_t st = entry_get(lt, &key, false, &e);
    if (st) return st;
    st = LT_CHECK(cublasLtMatmulDescSetAttribute(e->op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &ws,
                                                 sizeof(ws)));
    if (!st)
        st = LT_CHECK(cublasLtMatmulDescSetAttribute(e->op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER,
                                                     &xs, sizeof(xs)));
    if (!st && bias)
        st = LT_CHECK(cublasLtMatmulDescSetAttribute(e->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                     &bias, sizeof(bias)));
    if (st) return st;
    const float alpha = 1.0f, beta = accumulate ? 1.0f : 0.0f;
    return LT_CHECK(cublasLtMatmul(lt->handle, e->op, &alpha, wq, e->a, xq, e->b, &beta, y, e->c, y,
                                   e->c, &e->algo, lt->workspace, lt->workspace_bytes, stream));
}

hs_status_t hs_lt_linear_fp8(hs_lt_t *lt, void *y, int64_t ldy, const void *xq, int64_t ldxq,
                             const float *xs, const void *wq, const float *ws, const void *bias,
                             int M, int N, int K, bool accumulate, cudaStream_t stream)
{
    if (!lt || !y || !xq || !xs || !wq || !ws || !fp8_args_ok(ldy, ldxq, M, N, K)) {
        hs_error("cublaslt: bad fp8 linear arguments M=%d N=%d K=%d ldxq=%lld ldy=%lld (K and "
                 "ldxq must be multiples of 16, ldy of 8)",
                 M, N, K, (long long)ldxq, (long long)ldy);
        return HS_ERR_INVALID;
    }
    const int m4 = M & ~3, r = M - m4;
    hs_status_t st = HS_OK;
    if (m4) st = linear_fp8(lt, y, ldy, xq, ldxq, xs, wq, ws, bias, m4, N, K, accumulate, stream);
    if (st || !r) return st;
    /* The last r tokens as a GEMM of 4 in the handle's rows (the caller's
     * buffers need not hold 4): their input copied in, the output (with
     * what it accumulates onto) out. */
    if ((st = tail_reserve(lt, ldxq, N))) return st;
    const int64_t ldt = (int64_t)hs_align_up((size_t)N, 8);
    uint8_t *tq = lt->tail;
    uint8_t *ty = tq + tail_out_offset(ldxq);
    const uint8_t *xr = (const uint8_t *)xq + (size_t)m4 * ldxq;
    uint8_t *yr = (uint8_t *)y + (size_t)m4 * ldy * 2;
    st = HS_CUDA_CHECK(cudaMemcpyAsync(tq, xr, (size_t)r * ldxq, cudaMemcpyDeviceToDevice, stream));
    if (!st && accumulate)
        st =
            HS_CUDA_CHECK(cudaMemcpy2DAsync(ty, (size_t)ldt * 2, yr, (size_t)ldy * 2, (size_t)N * 2,
                                            (size_t)r, cudaMemcpyDeviceToDevice, stream));
    if (!st)
        st = linear_fp8(lt, ty, ldt, tq, ldxq, xs + hs_fp8_blocks(K) * m4, wq, ws, bias, 4, N, K,
                        accumulate, stream);
    if (!st)
        st =
            HS_CUDA_CHECK(cudaMemcpy2DAsync(yr, (size_t)ldy * 2, ty, (size_t)ldt * 2, (size_t)N * 2,
                                            (size_t)r, cudaMemcpyDeviceToDevice, stream));
    return st;
}
