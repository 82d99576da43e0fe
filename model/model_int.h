/* SPDX-License-Identifier: Apache-2.0 */
/* model_int.h - what is inside an hs_model_t, for the files of model/ (the
 * CPU forward, the loader and the CUDA forward that uploads the weights).
 *
 * Every weight is bf16 (raw uint16_t bits), row-major in PyTorch's layout
 * (nn.Linear weight [out_features, in_features]). Pointers point either into
 * a mapped safetensors file or into a buffer the model owns; either way they
 * live as long as the model. Optional tensors are NULL when absent. */
#ifndef HS_MODEL_INT_H
#define HS_MODEL_INT_H

#include <pthread.h>

#include "hs_model.h"
#include "safetensors_int.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A Linear weight held in FP8 (kernels/fp8_block.h): e4m3 [n, k] and its
 * 128x128 block factors scale_inv [ceil(n/128), ceil(k/128)], in the mapped
 * file (an FP8 checkpoint) or owned by the model (--dtype fp8). w is NULL
 * for a weight held in bf16. */
typedef struct {
    const uint8_t *w;
    const float *scale_inv;
    int64_t n, k;
} hs__fp8_weight_t;

/* The Linear weights a layer may hold in FP8, named as their bf16 fields. */
typedef struct {
    hs__fp8_weight_t q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj;
    hs__fp8_weight_t in_proj_qkv, in_proj_z, in_proj_b, in_proj_a, out_proj;
} hs__layer_fp8_t;

typedef struct {
    const uint16_t *q_proj;    /* [num_heads * head_dim, H]; gated attention (Qwen3.5):
                                  [num_heads * 2 * head_dim, H], per head its query rows
                                  then its gate rows */
    const uint16_t *k_proj;    /* [num_kv_heads * head_dim, H] */
    const uint16_t *v_proj;    /* [num_kv_heads * head_dim, H] */
    const uint16_t *o_proj;    /* [H, num_heads * head_dim] */
    const uint16_t *q_bias;    /* [num_heads * head_dim] or NULL */
    const uint16_t *k_bias;    /* [num_kv_heads * head_dim] or NULL */
    const uint16_t *v_bias;    /* [num_kv_heads * head_dim] or NULL */
    const uint16_t *o_bias;    /* [H] or NULL */
    const uint16_t *q_norm;    /* [head_dim] or NULL (Qwen3) */
    const uint16_t *k_norm;    /* [head_dim] or NULL (Qwen3) */
    const uint16_t *gate_proj; /* [I, H] */
    const uint16_t *up_proj;   /* [I, H] */
    const uint16_t *down_proj; /* [H, I] */
    const uint16_t *gate_bias, *up_bias, *down_bias; /* [I], [I], [H] or NULL */
    const uint16_t *input_norm;                      /* input_layernorm [H] */
    const uint16_t *post_norm;                       /* post_attention_layernorm [H] */
    /* Gated DeltaNet (linear_attention layers; all NULL in the others).
     * nk, nv, dk, dv: linear key / value heads and head dims, K the conv
     * kernel, C = 2 * nk * dk + nv * dv the conv channels (q | k | v). */
    const uint16_t *in_proj_qkv; /* [C, H] */
    const uint16_t *in_proj_z;   /* [nv * dv, H] */
    const uint16_t *in_proj_b;   /* [nv, H] */
    const uint16_t *in_proj_a;   /* [nv, H] */
    const uint16_t *conv1d;      /* [C, K] (stored [C, 1, K]) */
    const float *A_log;          /* [nv], fp32 */
    const float *dt_bias;        /* [nv], fp32 */
    const uint16_t *lin_norm;    /* linear_attn.norm [dv] (gated RMSNorm) */
    const uint16_t *out_proj;    /* [H, nv * dv] */
    /* Linear weights held in FP8: for each set here, its bf16 field above
     * is NULL until the CPU forward dequantises it (hs__model_fp8_to_bf16) */
    hs__layer_fp8_t fp8;
} hs__layer_weights_t;

struct hs_model {
    hs_model_config_t cfg;
    const uint16_t *embed;       /* embed_tokens [vocab, H] */
    const uint16_t *final_norm;  /* norm [H] */
    hs__layer_weights_t *layers; /* [num_layers] */
    float *inv_freq;             /* rope [rotary_dim / 2], rope scaling applied */
    hs__st_set_t *st;            /* the mapped safetensors files */
    hs_model_weights_t weights;  /* as hs_model_load_ex was asked */
    int n_fp8;                   /* Linear weights held in FP8 */
    void **owned;                /* buffers of converted weights */
    size_t n_owned, cap_owned;
    int fp8_dequantized;  /* the CPU forward's bf16 copies exist (under cpu_lock) */
    hs_model_attn_t attn; /* the CUDA forward's attention kernel */
    /* hs_model_forward_cpu's work buffers not in use: one set per thread
     * that calls it at once, kept for the next call (forward_cpu.c) */
    pthread_mutex_t cpu_lock;
    struct hs__cpu_work *cpu_free;
    /* frees cpu_free; set by the CPU forward when it keeps buffers, so the
     * model's destroy needs no call into forward_cpu.c */
    void (*cpu_release)(hs_model_t *m);
};

/* For the CPU forward: a bf16 copy of every Linear weight held in FP8
 * (w = q * scale_inv, rounded to bf16), made once, under cpu_lock, and
 * owned by the model. HS_ERR_NOMEM logged. */
HS_MUST_CHECK hs_status_t hs__model_fp8_to_bf16(hs_model_t *m);

/* Parses config.json text (path only for messages) into *cfg. */
HS_MUST_CHECK hs_status_t hs__model_config_parse(const char *json, size_t len, const char *path,
                                                 hs_model_config_t *cfg);

#ifdef __cplusplus
}
#endif
#endif /* HS_MODEL_INT_H */
