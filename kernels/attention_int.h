/* SPDX-License-Identifier: Apache-2.0 */
/* attention_int.h - the cuDNN fused-attention backend of the attention plan
 * (kernels/attention_cudnn.cpp, built with HS_HAVE_CUDNN), behind a C
 * interface so that the frontend's C++ stays in one translation unit.
 *
 * One cuDNN graph and execution plan per bucket (S, B): at most B sequences
 * of at most S tokens, packed without padding (THD layout: ragged offsets per
 * sequence into q, k, v and out, plus per-sequence lengths), causal, grouped
 * kv heads, bf16 in and out with fp32 softmax and accumulation. All graphs,
 * plans and the one workspace are built at create; a run only binds the
 * pointers of this call and launches.
 *
 * Ownership: the object owns its cuDNN handle, graphs and workspace; every
 * data pointer passed to run is device memory owned by the caller. Not
 * thread-safe: one object per forward (per stream). */
#ifndef HS_KN_ATTENTION_INT_H
#define HS_KN_ATTENTION_INT_H

#include <stddef.h>
#include <stdint.h>

#include "hsflow.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct hs__attn_dnn hs__attn_dnn_t;

/* What every bucket's graph shares. Strides are row strides in elements. */
typedef struct {
    int n_heads, n_kv_heads, head_dim;
    int64_t q_stride, kv_stride, out_stride;
    float scale;
    int window; /* > 0: keys with i - j >= window are masked */
} hs__attn_dnn_shape_t;

/* Builds the graphs of the n buckets (S[i], B[i]) on the current device.
 * Buckets cuDNN refuses are dropped (ok[i] = 0, logged at debug level); at
 * least one must build, else HS_ERR_UNSUPPORTED and *out stays NULL. The
 * cuDNN library is loaded here (dlopen of libcudnn.so.9): where it is
 * missing the result is HS_ERR_UNSUPPORTED too. */
HS_MUST_CHECK hs_status_t hs__attn_dnn_create(const hs__attn_dnn_shape_t *shape, const int *S,
                                              const int *B, int n, int *ok, hs__attn_dnn_t **out);
void hs__attn_dnn_destroy(hs__attn_dnn_t *dnn);

/* Runs bucket i (ok[i] set at create) on stream. seq_len [B[i]] and the
 * ragged offsets [B[i] + 1] (elements, from q / k and v / out) are device
 * int32 arrays; sequences past the batch have length 0. */
HS_MUST_CHECK hs_status_t hs__attn_dnn_run(hs__attn_dnn_t *dnn, int i, const void *q, const void *k,
                                           const void *v, void *out, const int32_t *seq_len,
                                           const int32_t *ragged_q, const int32_t *ragged_kv,
                                           const int32_t *ragged_out, void *stream);

/* cuDNN version the library reports at run time (e.g. 91900), 0 if not loaded. */
long hs__attn_dnn_version(const hs__attn_dnn_t *dnn);

#ifdef __cplusplus
}
#endif
#endif /* HS_KN_ATTENTION_INT_H */
