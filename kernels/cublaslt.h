/* SPDX-License-Identifier: Apache-2.0 */
/* cublaslt.h - the one GEMM entry point of hsflow's CUDA forward, on cuBLASLt,
 * plus the CUDA error-check helpers the CUDA-side files share.
 *
 * Math: y[M,N] = x[M,K] · W[N,K]^T (+ bias[N]) (+ y, when accumulate is set),
 * all row-major: activations are token-major, W is a Hugging Face Linear
 * weight [out_features, in_features]. bf16 in and out, fp32 accumulation.
 * The residual add of a decoder layer is the accumulate form (beta = 1,
 * in place), so it costs no separate pass.
 *
 * Each (M, N, K, row strides, epilogue, accumulate) shape gets its matmul
 * descriptor, layouts and heuristic-chosen algorithm once; later calls of the
 * same shape reuse them. The workspace is allocated once at create.
 *
 * Ownership: the handle owns its workspace and cached descriptors; all data
 * pointers are device memory owned by the caller. Threads: one handle per
 * thread (or per stream); calls are not thread-safe. */
#ifndef HS_CUBLASLT_H
#define HS_CUBLASLT_H

#include <stdbool.h>
#include <stdint.h>
#include <cuda_runtime_api.h>
#include <stddef.h>

#include "hsflow.h"
#include "hs_log.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Log a failing CUDA call with file:line and yield HS_ERR_CUDA, else HS_OK. */
static inline hs_status_t hs__cuda_status(cudaError_t e, const char *what, const char *file,
                                          int line)
{
    if (e == cudaSuccess) return HS_OK;
    hs_log_write(HS_LOG_ERROR, file, line, "cuda: %s failed: %s", what, cudaGetErrorString(e));
    return HS_ERR_CUDA;
}
#define HS_CUDA_CHECK(call) hs__cuda_status((call), #call, __FILE__, __LINE__)
/* After a kernel launch: the launch error, if any, as a status. */
#define HS_CUDA_LAUNCH_CHECK(name) hs__cuda_status(cudaGetLastError(), name, __FILE__, __LINE__)

typedef struct hs_lt hs_lt_t;

/* Default workspace: 32 MiB is what cuBLASLt's heuristics want on Hopper. */
#define HS_LT_WORKSPACE_DEFAULT (32u << 20)

/* Create a handle with a workspace of workspace_bytes (0 = default) on the
 * current device. */
HS_MUST_CHECK hs_status_t hs_lt_create(size_t workspace_bytes, hs_lt_t **out);
void hs_lt_destroy(hs_lt_t *lt);

/* y[m, 0..n) = x[m, 0..k) · W^T (+ bias) (+ y if accumulate), for m < M.
 * ldy/ldx: row strides in elements (>= n / >= k); W is dense [N, K]. bias
 * may be NULL (bf16, N entries). All pointers 16-byte aligned, strides
 * multiples of 8. */
HS_MUST_CHECK hs_status_t hs_lt_linear(hs_lt_t *lt, void *y, int64_t ldy, const void *x,
                                       int64_t ldx, const void *w, const void *bias, int M, int N,
                                       int K, bool accumulate, cudaStream_t stream);

/* FP8 block-scaled form (sm_90, cuBLAS 12.9+): the same product with
 * e4m3 operands and fp32 dequantisation factors (kernels/fp8_block.h),
 *   y[m, n] = sum_k xq[m, k] xs(m, k/128) * wq[n, k] ws[n/128][k/128]
 * (+ bias) (+ y), fp32 accumulation, bf16 out. xq [M, K] e4m3 with row
 * stride ldxq; xs hs_kn_fp8_quant_groups's factors, laid out as
 * hs_fp8_act_scale_index says (sm_90's per-128-column factors need a
 * multiple of 4 tokens: the last M % 4 run as a GEMM of 4 in rows of the
 * handle's own, copied in and out); wq
 * [N, K] e4m3 dense; ws [ceil(N/128)][hs_lt_fp8_scale_ld(K)], the
 * checkpoint's scale_inv with its rows padded to a multiple of 4 blocks, as
 * cuBLASLt's BLK128x128_32F mode reads them. K and ldxq multiples of 16,
 * ldy of 8, pointers 16-byte aligned. HS_ERR_UNSUPPORTED (logged) when
 * cuBLASLt has no algorithm for the shape. */
static inline int64_t hs_lt_fp8_scale_ld(int64_t K) { return ((K + 127) / 128 + 3) / 4 * 4; }
HS_MUST_CHECK hs_status_t hs_lt_linear_fp8(hs_lt_t *lt, void *y, int64_t ldy, const void *xq,
                                           int64_t ldxq, const float *xs, const void *wq,
                                           const float *ws, const void *bias, int M, int N, int K,
                                           bool accumulate, cudaStream_t stream);
/* Whether cuBLASLt has an FP8 algorithm for this shape (the descriptor is
 * built and cached as a call would): HS_OK, or HS_ERR_UNSUPPORTED logged at
 * debug level only, for a caller that falls back. */
HS_MUST_CHECK hs_status_t hs_lt_fp8_check(hs_lt_t *lt, int64_t ldy, int64_t ldxq, bool bias, int M,
                                          int N, int K, bool accumulate);

/* Number of cached shapes (tests check that a repeated shape adds none). */
int hs_lt_cached_shapes(const hs_lt_t *lt);

#ifdef __cplusplus
}
#endif
#endif /* HS_CUBLASLT_H */
