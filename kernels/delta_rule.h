/* SPDX-License-Identifier: Apache-2.0 */
/* delta_rule.h - the gated delta rule (Gated DeltaNet's token mixer) over
 * packed variable-length sequences, in its recurrent form. Per sequence and
 * value head h (key head hk = h / (n_v_heads / n_k_heads): consecutive value
 * heads share a key head), with a state S [dk, dv] that starts at zero at
 * the first token of every sequence:
 *   q~ = q / sqrt(|q|^2 + 1e-6) / sqrt(dk),  k~ = k / sqrt(|k|^2 + 1e-6)
 *   S    = exp(g_t) * S                               (decay)
 *   u    = beta_t * (v_t - S^T k~)                    (delta: the correction)
 *   S    = S + k~ u^T                                 (rank-1 update)
 *   o_t  = S^T q~
 * This is transformers' torch_recurrent_gated_delta_rule with
 * use_qk_l2norm_in_kernel (the chunked form computes the same in exact
 * arithmetic).
 *
 * Shapes: q, k rows [T, n_k_heads * dk] and v rows [T, n_v_heads * dv],
 * each at its own pointer with a common row stride `stride` (elements), so
 * the conv output [T, 2 * nk * dk + nv * dv] is read in place; g, beta
 * [T, n_v_heads]; out [T, n_v_heads * dv] (row stride n_v_heads * dv), not
 * overlapping the inputs. n_v_heads a multiple of n_k_heads.
 * Precision: fp32 state and arithmetic. */
#ifndef HS_KN_DELTA_RULE_H
#define HS_KN_DELTA_RULE_H

#include <stddef.h>
#include <stdint.h>
#include "hsflow.h" /* hs_status_t */

#ifdef __cplusplus
extern "C" {
#endif

/* C twin. Work is shared over OpenMP threads by (sequence, value head);
 * each thread allocates its own dk * dv state. Returns HS_OK, or
 * HS_ERR_NOMEM (nothing logged) if a state cannot be allocated; out is then
 * incomplete. */
HS_MUST_CHECK hs_status_t hs_kn_delta_rule_ref(const float *q, const float *k, const float *v,
                                               size_t stride, const float *g, const float *beta,
                                               float *out, const int32_t *cu_seqlens, int n_seqs,
                                               int n_k_heads, int n_v_heads, int dk, int dv);

/* ---- CUDA launchers (kernels/delta_rule.cu) ---- */
/* Built only with CUDA (HS_HAVE_CUDA). bf16 buffers are device memory (raw
 * bf16 bits); stream is a cudaStream_t. They return HS_OK or an error
 * hs_status_t (HS_ERR_CUDA for a failed launch, HS_ERR_INVALID for bad
 * arguments). */
struct CUstream_st;
/* Device scratch hs_kn_delta_rule needs for batches of at most max_tokens
 * tokens in at most max_seqs sequences: plan it once (at create) and pass
 * the same bytes to every call. */
size_t hs_kn_delta_rule_workspace_bytes(int max_tokens, int max_seqs, int n_k_heads, int n_v_heads,
                                        int dk, int dv);
/* q, k, v bf16 at their own pointers with a common row stride (the conv
 * output read in place, as in the C twin); g, beta fp32 [T, n_v_heads];
 * out bf16 [T, n_v_heads * dv] rows of stride out_stride, not overlapping
 * the inputs; cu_seqlens device int32 [n_seqs + 1], cu_seqlens[n_seqs] ==
 * T. L2-norm of q and k and the 1/sqrt(dk) scale inside, as the C twin;
 * fp32 state. workspace (device, caller-owned) of workspace_bytes from
 * hs_kn_delta_rule_workspace_bytes for at least T tokens and n_seqs
 * sequences (HS_ERR_INVALID if smaller). dk, dv <= 256. */
HS_MUST_CHECK hs_status_t hs_kn_delta_rule(const void *q, const void *k, const void *v,
                                           int64_t stride, const float *g, const float *beta,
                                           void *out, int64_t out_stride, const int32_t *cu_seqlens,
                                           int n_seqs, int T, int n_k_heads, int n_v_heads, int dk,
                                           int dv, void *workspace, size_t workspace_bytes,
                                           struct CUstream_st *stream);

#ifdef __cplusplus
}
#endif
#endif /* HS_KN_DELTA_RULE_H */
