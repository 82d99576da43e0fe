/* SPDX-License-Identifier: Apache-2.0 */
/* delta_rule_int.h - the two CUDA forms of the gated delta rule behind
 * hs_kn_delta_rule, for the tests (each against the C twin and the other)
 * and the benchmark. Same arguments as hs_kn_delta_rule. The recurrent form
 * takes any dk, dv <= 256 and needs no workspace; the chunked form needs dk
 * and dv of 64 or 128, 16-byte aligned q/k/v rows (stride a multiple of 8),
 * an even out_stride and the workspace. Its state pass runs on wgmma where
 * hs__kn_delta_rule_wgmma() says so (an sm_90 GPU and a build with sm_90a
 * code), else on mma.sync; _chunked_mma always takes the mma.sync pass, the
 * wgmma pass's oracle. */
#ifndef HS_KN_DELTA_RULE_INT_H
#define HS_KN_DELTA_RULE_INT_H

#include <stddef.h>
#include <stdint.h>
#include "hsflow.h" /* hs_status_t */

#ifdef __cplusplus
extern "C" {
#endif

/* Below this many tokens in a batch hs_kn_delta_rule runs the recurrent form. */
#define HS__DELTA_RULE_CHUNKED_MIN_TOKENS 1

struct CUstream_st;
HS_MUST_CHECK hs_status_t hs__kn_delta_rule_recurrent(
    const void *q, const void *k, const void *v, int64_t stride, const float *g, const float *beta,
    void *out, int64_t out_stride, const int32_t *cu_seqlens, int n_seqs, int T, int n_k_heads,
    int n_v_heads, int dk, int dv, struct CUstream_st *stream);
HS_MUST_CHECK hs_status_t hs__kn_delta_rule_chunked(
    const void *q, const void *k, const void *v, int64_t stride, const float *g, const float *beta,
    void *out, int64_t out_stride, const int32_t *cu_seqlens, int n_seqs, int T, int n_k_heads,
    int n_v_heads, int dk, int dv, void *workspace, size_t workspace_bytes,
    struct CUstream_st *stream);
HS_MUST_CHECK hs_status_t hs__kn_delta_rule_chunked_mma(
    const void *q, const void *k, const void *v, int64_t stride, const float *g, const float *beta,
    void *out, int64_t out_stride, const int32_t *cu_seqlens, int n_seqs, int T, int n_k_heads,
    int n_v_heads, int dk, int dv, void *workspace, size_t workspace_bytes,
    struct CUstream_st *stream);
/* 1 where the chunked form's state pass runs on wgmma on the current GPU. */
int hs__kn_delta_rule_wgmma(void);

#ifdef __cplusplus
}
#endif
#endif /* HS_KN_DELTA_RULE_INT_H */
