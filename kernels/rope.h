/* SPDX-License-Identifier: Apache-2.0 */
/* rope.h - rotary position embedding, "rotate half" (GPT-NeoX) style as in
 * Hugging Face Llama: for each head and i < d/2, with a = pos * inv_freq[i],
 *   y[i]       = x[i] * cos(a) - x[i + d/2] * sin(a)
 *   y[i + d/2] = x[i + d/2] * cos(a) + x[i] * sin(a)
 * Positions restart at 0 at the start of every packed sequence
 * (pos of token t = t - cu_seqlens[s] for the sequence s holding t).
 *
 * inv_freq [d/2] is computed once per model by hs_kn_rope_inv_freq():
 *   inv_freq[i] = 1 / theta^(2i/d), then optionally rescaled:
 *   - linear:  inv_freq / factor
 *   - llama3:  low frequencies (wavelength > orig_ctx / low_freq_factor) are
 *     divided by factor, high ones (wavelength < orig_ctx / high_freq_factor)
 *     kept, the band between interpolated smoothly (Llama 3.1).
 * Shapes: x [T, n_heads * d] (row stride n_heads * d), rotated in place.
 * Precision: fp32 angle (pos * inv_freq rounded to fp32, as torch does),
 * fp32 cos/sin, fp32 arithmetic. */
#ifndef HS_KN_ROPE_H
#define HS_KN_ROPE_H

#include <stddef.h>
#include <stdint.h>
#include "hsflow.h" /* hs_status_t */

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { HS_ROPE_DEFAULT = 0, HS_ROPE_LINEAR = 1, HS_ROPE_LLAMA3 = 2 } hs_rope_type_t;

typedef struct {
    hs_rope_type_t type;
    float factor;                 /* linear, llama3 */
    float low_freq_factor;        /* llama3 */
    float high_freq_factor;       /* llama3 */
    float original_max_positions; /* llama3: original_max_position_embeddings */
} hs_rope_scaling_t;

/* Fills inv_freq[head_dim / 2]. scaling may be NULL (default rope).
 * head_dim must be even. Plain C, used by both the CPU and CUDA paths. */
void hs_kn_rope_inv_freq(int head_dim, float theta, const hs_rope_scaling_t *scaling,
                         float *inv_freq);

/* C twin. x: fp32 [T, n_heads * head_dim] with T = cu_seqlens[n_seqs],
 * rotated in place; cu_seqlens: n_seqs + 1 non-decreasing entries from 0. */
void hs_kn_rope_ref(float *x, const int32_t *cu_seqlens, int n_seqs, int n_heads, int head_dim,
                    const float *inv_freq);
/* Partial rotary (Qwen3.5's partial_rotary_factor): rotate-half over only
 * the first rot_dim dims of each head (half = rot_dim / 2, inv_freq
 * [rot_dim / 2] from hs_kn_rope_inv_freq(rot_dim, ...)); dims rot_dim ..
 * head_dim - 1 pass through. rot_dim even, 2 <= rot_dim <= head_dim;
 * rot_dim == head_dim is hs_kn_rope_ref. */
void hs_kn_rope_partial_ref(float *x, const int32_t *cu_seqlens, int n_seqs, int n_heads,
                            int head_dim, int rot_dim, const float *inv_freq);

/* ---- CUDA launchers (kernels/rope.cu) ---- */
/* Built only with CUDA (HS_HAVE_CUDA). bf16 buffers are device memory;
 * stream is a cudaStream_t. They return HS_OK or an error hs_status_t
 * (HS_ERR_CUDA for a failed launch, HS_ERR_INVALID for bad arguments). */
struct CUstream_st;
/* pos[t] = t - cu_seqlens[s] for every token t of sequence s (device memory). */
HS_MUST_CHECK hs_status_t hs_kn_rope_positions(const int32_t *cu_seqlens, int n_seqs, int32_t *pos,
                                               struct CUstream_st *stream);
/* In place on the first n_heads heads of each of T bf16 rows (stride
 * row_stride): q and k of the fused qkv rows in one launch. pos [T] and
 * inv_freq [head_dim / 2] are device memory. */
HS_MUST_CHECK hs_status_t hs_kn_rope(void *x, int64_t row_stride, int T, int n_heads, int head_dim,
                                     const int32_t *pos, const float *inv_freq,
                                     struct CUstream_st *stream);
/* As hs_kn_rope, rotating only the first rot_dim dims of each head
 * (Qwen3.5's partial rotary; inv_freq [rot_dim / 2]); the other dims are
 * left as they are. rot_dim even, 2 <= rot_dim <= head_dim. */
HS_MUST_CHECK hs_status_t hs_kn_rope_partial(void *x, int64_t row_stride, int T, int n_heads,
                                             int head_dim, int rot_dim, const int32_t *pos,
                                             const float *inv_freq, struct CUstream_st *stream);

#ifdef __cplusplus
}
#endif
#endif /* HS_KN_ROPE_H */
