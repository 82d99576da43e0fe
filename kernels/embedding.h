/* SPDX-License-Identifier: Apache-2.0 */
/* embedding.h - token embedding lookup: out[t, :] = table[ids[t], :].
 *
 * Shapes: table [vocab, H] bf16 (row-major), ids [T] int32, out [T, H].
 * Precision: the C twin widens bf16 to fp32 exactly. */
#ifndef HS_KN_EMBEDDING_H
#define HS_KN_EMBEDDING_H

#include <stddef.h>
#include <stdint.h>
#include "hsflow.h" /* hs_status_t */

#ifdef __cplusplus
extern "C" {
#endif

/* C twin. Every ids[t] must be in [0, vocab): the caller checks ids that
 * come from a file (hs_model_forward_cpu does). out: fp32 [T, H]. */
void hs_kn_embedding_ref(const uint16_t *table, int vocab, int H, const int32_t *ids, int T,
                         float *out);

/* ---- CUDA launchers (kernels/embedding.cu) ---- */
/* Built only with CUDA (HS_HAVE_CUDA). bf16 buffers are device memory;
 * stream is a cudaStream_t. They return HS_OK or an error hs_status_t
 * (HS_ERR_CUDA for a failed launch, HS_ERR_INVALID for bad arguments). */
struct CUstream_st;
/* out[t, :] = table[ids[t], :] on the GPU: table bf16 [vocab, H], ids int32
 * [T], out bf16 rows of stride out_stride (elements). Device pointers; an id
 * outside [0, vocab) gives a zero row. */
HS_MUST_CHECK hs_status_t hs_kn_embedding(const void *table, int vocab, int H, const int32_t *ids,
                                          int T, void *out, int64_t out_stride,
                                          struct CUstream_st *stream);

#ifdef __cplusplus
}
#endif
#endif /* HS_KN_EMBEDDING_H */
