/* SPDX-License-Identifier: Apache-2.0 */
/* attention.h - causal self-attention over packed variable-length sequences
 * (no padding) with grouped-query heads:
 *   for sequence s, token i in it, query head h (kv head g = h / (Hq / Hkv)):
 *     out[i, h] = sum_j softmax_j(scale * q[i, h] . k[j, g]) * v[j, g]
 *   over keys j of the same sequence with j <= i, and i - j < window when
 *   window > 0 (Mistral's sliding window; 0 = unlimited).
 *
 * Shapes: q, out [T, Hq * d]; k, v [T, Hkv * d]; T = cu_seqlens[n_seqs];
 * Hq a multiple of Hkv. Rows are contiguous (row stride = heads * d).
 * Precision: fp32 everywhere; the C twin uses online softmax (running max
 * and sum), so it needs no scratch and works for any sequence length. */
#ifndef HS_KN_ATTENTION_H
#define HS_KN_ATTENTION_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "hsflow.h" /* hs_status_t */

#ifdef __cplusplus
extern "C" {
#endif

/* Largest head_dim the C twin accepts (its accumulator lives on the stack). */
#define HS_KN_ATTN_MAX_HEAD_DIM 512

/* C twin. head_dim <= HS_KN_ATTN_MAX_HEAD_DIM; out must not overlap q/k/v. */
void hs_kn_attention_ref(const float *q, const float *k, const float *v, float *out,
                         const int32_t *cu_seqlens, int n_seqs, int n_heads, int n_kv_heads,
                         int head_dim, float scale, int window);

/* ---- CUDA launchers (kernels/attention.cu) ---- */
/* Built only with CUDA (HS_HAVE_CUDA). bf16 buffers are device memory;
 * stream is a cudaStream_t. They return HS_OK or an error hs_status_t
 * (HS_ERR_CUDA for a failed launch, HS_ERR_INVALID for bad arguments). */
struct CUstream_st;
/* Per batch, before hs_kn_attention: tile_prefix [n_seqs + 1] (device) gets
 * the prefix sums of each sequence's 64-row query tiles. */
HS_MUST_CHECK hs_status_t hs_kn_attention_schedule(const int32_t *cu_seqlens, int n_seqs,
                                                   int32_t *tile_prefix,
                                                   struct CUstream_st *stream);
/* bf16 tensor-core version: q rows of stride q_stride, k and v rows of stride
 * kv_stride (the fused qkv rows work in place), out rows of stride
 * out_stride; cu_seqlens and tile_prefix in device memory; T = total tokens.
 * head_dim 64, 80, 96 or 128 with 16-byte aligned rows runs on tensor
 * cores; any other head_dim up to 256 (or unaligned rows) on a slow generic
 * kernel. */
HS_MUST_CHECK hs_status_t hs_kn_attention(const void *q, int64_t q_stride, const void *k,
                                          const void *v, int64_t kv_stride, void *out,
                                          int64_t out_stride, const int32_t *cu_seqlens,
                                          const int32_t *tile_prefix, int n_seqs, int T,
                                          int n_heads, int n_kv_heads, int head_dim, float scale,
                                          int window, struct CUstream_st *stream);

/* ---- the attention of a forward: a plan built once, run per layer ---- */
/* Which kernel runs a prepared batch: cuDNN's fused SDPA (flash attention on
 * wgmma/TMA) on sm_90 where the build has cuDNN (HS_HAVE_CUDNN), libcudnn.so.9
 * loads and a bucket fits the batch; else the mma.sync kernel above. Both
 * take the same inputs and give the same results within bf16 rounding.
 * mma_only in the description keeps the mma.sync kernel (the commands set it
 * from HS_ATTN_BACKEND=mma). Measured in docs/forward-bench.md. */
typedef struct hs_kn_attn_plan hs_kn_attn_plan_t;

typedef struct {
    int max_tokens, max_seqs; /* the largest batch prepare will see */
    int n_heads, n_kv_heads, head_dim;
    int64_t q_stride, kv_stride, out_stride; /* row strides (elements) of every run */
    float scale;
    int window;    /* as hs_kn_attention: 0 = unlimited */
    bool mma_only; /* the mma.sync kernel even where cuDNN's could run */
} hs_kn_attn_desc_t;

/* Builds everything on the current device: the cuDNN graphs and plans of
 * the buckets (S, B): sequences of up to S = 128, 256, ... tokens (up to
 * max_tokens rounded up to a power of two), at most B of them, B = 1, 2, 4
 * and 8 times ceil(max_tokens / S) (and max_seqs for S = 128), never above
 * max_seqs; their workspace, the per-batch arrays and a pinned word
 * for the batch's longest sequence. A batch runs on the bucket of the
 * smallest B x S that holds it. The caller owns the plan; destroy accepts
 * NULL. Thread: one stream at a time. */
HS_MUST_CHECK hs_status_t hs_kn_attn_plan_create(const hs_kn_attn_desc_t *desc,
                                                 hs_kn_attn_plan_t **out);
void hs_kn_attn_plan_destroy(hs_kn_attn_plan_t *plan);

/* Per batch, before its runs: cu_seqlens [n_seqs + 1] in device memory,
 * T = cu_seqlens[n_seqs] (n_seqs <= max_seqs, T <= max_tokens). `longest`
 * is the batch's longest sequence as the caller knows it from its host copy
 * of cu_seqlens: the cuDNN bucket is picked from it with no synchronisation.
 * longest 0 means unknown: it is read back from the device (one stream
 * synchronisation). A longest below a sequence's length is a caller's bug
 * that would cut that sequence's attention short: the device traps rather
 * than compute it. Nothing is allocated. */
HS_MUST_CHECK hs_status_t hs_kn_attn_plan_prepare(hs_kn_attn_plan_t *plan,
                                                  const int32_t *cu_seqlens, int n_seqs, int T,
                                                  int longest, struct CUstream_st *stream);

/* Per layer: attention of the prepared batch. q, k, v, out: device bf16 rows
 * of the strides given at create. */
HS_MUST_CHECK hs_status_t hs_kn_attn_plan_run(hs_kn_attn_plan_t *plan, const void *q, const void *k,
                                              const void *v, void *out, struct CUstream_st *stream);

/* "cudnn" or "mma": the kernel the prepared batch runs on; before the first
 * prepare, "cudnn" when the plan built cuDNN buckets. */
const char *hs_kn_attn_plan_backend(const hs_kn_attn_plan_t *plan);

#ifdef __cplusplus
}
#endif
#endif /* HS_KN_ATTENTION_H */
