/* SPDX-License-Identifier: Apache-2.0 */
/* forward_cpu.c - the CPU reference forward of the Llama-family and
 * Qwen3.5 decoders, built from the kernels' C twins. fp32 activations, bf16
 * weights, fp32 accumulation. Per decoder layer, exactly as Hugging Face:
 *   x  = rmsnorm(h, input_layernorm)
 *   h += mixer(x)
 *   x  = rmsnorm(h, post_attention_layernorm)
 *   h += (silu(x Wg^T) * (x Wu^T)) Wd^T
 * with mixer, for attention layers:
 *   q,k,v = x Wq^T (+bq), x Wk^T (+bk), x Wv^T (+bv)
 *     (Qwen3.5: Wq yields per head a query and a gate)
 *   q,k = rmsnorm per head (Qwen3, Qwen3.5), then rope (positions per
 *     sequence; Qwen3.5 on the first rotary_dim dims of each head)
 *   o = attention(q, k, v) (Qwen3.5: o * sigmoid(gate)), then o Wo^T (+bo)
 * and for Qwen3.5's Gated DeltaNet layers:
 *   qkv = silu(causal_conv1d(x Wqkv^T)), conv window restarting per sequence
 *   z, b, a = x Wz^T, x Wb^T, x Wa^T;  beta, g = gates(b, a, A_log, dt_bias)
 *   o = delta_rule(q, k, v, g, beta), state restarting per sequence
 *   o = rmsnorm_gated(o, z) per value head, then o Wout^T
 * Qwen3.5's layer, final and q/k norms are zero-centred: they scale by
 * (1 + w). Captured index 0 is the embedding output, i the output of layer
 * i-1, and N the final rmsnorm of the last layer's output. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "attention.h"
#include "hs_float.h"
#include "conv1d.h"
#include "delta_rule.h"
#include "embedding.h"
#include "gdn_gates.h"
#include "matmul.h"
#include "model_int.h"
#include "residual.h"
#include "rmsnorm.h"
#include "rmsnorm_gated.h"
#include "rope.h"
#include "sigmoid_gate.h"
#include "swiglu.h"
#include "hs_log.h"

/* Here, beside its first caller (the CUDA forward, hs-forward and the
 * preflight call it too). */
hs_status_t hs_model_check_layers(int n_target_layers, const int32_t *layers, int n_layers)
{
    if (n_layers < 1 || !layers) {
        hs_error("no captured layers given: pass at least one output_hidden_states index");
        return HS_ERR_INVALID;
    }
    for (int i = 0; i < n_layers; i++) {
        if (layers[i] < 0 || layers[i] > n_target_layers) {
            hs_error("captured layer %d is out of range: this model has %d decoder layers, so "
                     "indices run 0 (embeddings) .. %d (final normed output)",
                     layers[i], n_target_layers, n_target_layers);
            return HS_ERR_INVALID;
        }
    }
    return HS_OK;
}

int hs_model_longest_seq(const int32_t *cu_seqlens, int n_seqs)
{
    int longest = 0;
    for (int i = 0; i < n_seqs; i++)
        if (cu_seqlens[i + 1] - cu_seqlens[i] > longest)
            longest = cu_seqlens[i + 1] - cu_seqlens[i];
    return longest;
}

/* Copies src [T, H] into the column slice of every captured entry equal to
 * idx. */
static void capture(const float *src, int idx, int T, int H, const int32_t *layers, int n_layers,
                    void *out, int out_dtype, size_t stride)
{
    for (int j = 0; j < n_layers; j++) {
        if (layers[j] != idx) continue;
        for (int t = 0; t < T; t++) {
            const float *s = src + (size_t)t * (size_t)H;
            size_t o = (size_t)t * stride + (size_t)j * (size_t)H;
            if (out_dtype == HS_MODEL_OUT_F32) {
                memcpy((float *)out + o, s, (size_t)H * sizeof(float));
            } else {
                uint16_t *d = (uint16_t *)out + o;
                for (int i = 0; i < H; i++)
                    d[i] = hs_f32_to_bf16(s[i]);
            }
        }
    }
}

static hs_status_t check_inputs(const hs_model_t *m, const int32_t *input_ids,
                                const int32_t *cu_seqlens, int n_seqs, const int32_t *layers,
                                int n_layers, const void *out, int out_dtype,
                                size_t row_stride_elems)
{
    const hs_model_config_t *c = &m->cfg;
    if (!cu_seqlens || n_seqs < 1 || cu_seqlens[0] != 0) {
        hs_error("forward: need n_seqs >= 1 and cu_seqlens starting at 0 (got n_seqs=%d)", n_seqs);
        return HS_ERR_INVALID;
    }
    for (int s = 0; s < n_seqs; s++) {
        if (cu_seqlens[s + 1] < cu_seqlens[s]) {
            hs_error("forward: cu_seqlens decreases at entry %d (%d -> %d)", s + 1, cu_seqlens[s],
                     cu_seqlens[s + 1]);
            return HS_ERR_INVALID;
        }
    }
    int T = cu_seqlens[n_seqs];
    if (T > 0 && (!input_ids || !out)) {
        hs_error("forward: input_ids and out must not be NULL");
        return HS_ERR_INVALID;
    }
    hs_status_t rc = hs_model_check_layers(c->num_layers, layers, n_layers);
    if (rc != HS_OK) return rc;
    if (out_dtype != HS_MODEL_OUT_F32 && out_dtype != HS_MODEL_OUT_BF16) {
        hs_error("forward: unknown output dtype %d (HS_MODEL_OUT_F32 or HS_MODEL_OUT_BF16)",
                 out_dtype);
        return HS_ERR_INVALID;
    }
    if (row_stride_elems < (size_t)n_layers * (size_t)c->hidden_size) {
        hs_error("forward: row stride %zu is smaller than %d layers x H=%d", row_stride_elems,
                 n_layers, c->hidden_size);
        return HS_ERR_INVALID;
    }
    for (int t = 0; t < T; t++) {
        if (input_ids[t] < 0 || input_ids[t] >= c->vocab_size) {
            hs_error("forward: token %d has id %d, outside the model's vocabulary [0, %d)", t,
                     input_ids[t], c->vocab_size);
            return HS_ERR_INVALID;
        }
    }
    return HS_OK;
}

/* The model's RMSNorm: plain, or zero-centred (Qwen3.5). */
static void norm(const hs_model_config_t *c, const float *x, const uint16_t *w, float *y, int rows,
                 int dim)
{
    if (c->zero_centered_norm)
        hs_kn_rmsnorm_zc_ref(x, w, y, rows, dim, c->rms_norm_eps);
    else
        hs_kn_rmsnorm_ref(x, w, y, rows, dim, c->rms_norm_eps);
}

/* fp32 work buffers of the forward over up to `tokens` tokens (sized for
 * every layer type the model has). Kept by the model between calls and
 * grown only when a call brings more tokens than any before it, so a run of
 * batches no larger than the first allocates once per calling thread. */
struct hs__cpu_work {
    struct hs__cpu_work *next; /* in the model's list of free sets */
    size_t tokens;
    float *h, *x, *tmp; /* [T, H] */
    float *q, *att;     /* [T, nq] */
    float *qg, *ogate;  /* [T, 2 nq], [T, nq] (gated attention) or NULL */
    float *k, *v;       /* [T, nkv] */
    float *gate, *up;   /* [T, I] */
    float *mix, *conv;  /* [T, C] (Gated DeltaNet q | k | v) or NULL */
    float *z, *core;    /* [T, nv dv] or NULL */
    float *a, *b;       /* [T, nv] or NULL */
};
typedef struct hs__cpu_work work_t;

static void work_free(work_t *w)
{
    float *all[] = {w->h,    w->x,  w->tmp, w->q,    w->att, w->qg,   w->ogate, w->k, w->v,
                    w->gate, w->up, w->mix, w->conv, w->z,   w->core, w->a,     w->b};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        free(all[i]);
    struct hs__cpu_work *next = w->next;
    memset(w, 0, sizeof *w);
    w->next = next;
}

static hs_status_t work_alloc(const hs_model_config_t *c, int T, work_t *w)
{
    size_t t = (size_t)T, H = (size_t)c->hidden_size, I = (size_t)c->intermediate_size;
    size_t nq = (size_t)c->num_heads * c->head_dim, nkv = (size_t)c->num_kv_heads * c->head_dim;
    int ok = (w->h = malloc(t * H * sizeof(float))) && (w->x = malloc(t * H * sizeof(float))) &&
             (w->tmp = malloc(t * H * sizeof(float))) && (w->q = malloc(t * nq * sizeof(float))) &&
             (w->att = malloc(t * nq * sizeof(float))) &&
             (w->k = malloc(t * nkv * sizeof(float))) && (w->v = malloc(t * nkv * sizeof(float))) &&
             (w->gate = malloc(t * I * sizeof(float))) && (w->up = malloc(t * I * sizeof(float)));
    if (ok && c->attn_output_gate)
        ok = (w->qg = malloc(t * 2 * nq * sizeof(float))) &&
             (w->ogate = malloc(t * nq * sizeof(float)));
    if (ok && c->arch == HS_MODEL_QWEN3_5) {
        size_t nv = (size_t)c->lin_num_v_heads, vd = nv * c->lin_v_head_dim;
        size_t C = 2 * (size_t)c->lin_num_k_heads * c->lin_k_head_dim + vd;
        ok = (w->mix = malloc(t * C * sizeof(float))) &&
             (w->conv = malloc(t * C * sizeof(float))) && (w->z = malloc(t * vd * sizeof(float))) &&
             (w->core = malloc(t * vd * sizeof(float))) &&
             (w->a = malloc(t * nv * sizeof(float))) && (w->b = malloc(t * nv * sizeof(float)));
    }
    if (!ok) {
        work_free(w);
        hs_error("forward: out of memory for %d tokens of work buffers", T);
        return HS_ERR_NOMEM;
    }
    w->tokens = t;
    return HS_OK;
}

/* A set of work buffers for T tokens, taken from the model's free sets
 * (grown if smaller), or a new one when every set is in use by another
 * thread. The caller owns it until work_put(). */
static hs_status_t work_get(hs_model_t *m, int T, work_t **out)
{
    pthread_mutex_lock(&m->cpu_lock);
    work_t *w = m->cpu_free;
    if (w) m->cpu_free = w->next;
    pthread_mutex_unlock(&m->cpu_lock);
    if (!w && !(w = calloc(1, sizeof *w))) {
        hs_error("forward: out of memory for a set of work buffers");
        return HS_ERR_NOMEM;
    }
    w->next = NULL;
    if (w->tokens < (size_t)T) {
        work_free(w);
        hs_status_t rc = work_alloc(&m->cfg, T, w);
        if (rc != HS_OK) {
            free(w);
            return rc;
        }
    }
    *out = w;
    return HS_OK;
}

/* Gives a set back to the model for the next call. */
static void forward_cpu_release(hs_model_t *m);

static void work_put(hs_model_t *m, work_t *w)
{
    pthread_mutex_lock(&m->cpu_lock);
    w->next = m->cpu_free;
    m->cpu_free = w;
    m->cpu_release = forward_cpu_release;
    pthread_mutex_unlock(&m->cpu_lock);
}

static void forward_cpu_release(hs_model_t *m)
{
    while (m->cpu_free) {
        work_t *w = m->cpu_free;
        m->cpu_free = w->next;
        work_free(w);
        free(w);
    }
}

/* Softmax attention of layer w on w->x into w->tmp [T, H]. */
static void attention_mixer(const hs_model_t *m, const hs__layer_weights_t *lw, work_t *w,
                            const int32_t *cu_seqlens, int n_seqs, int T)
{
    const hs_model_config_t *c = &m->cfg;
    const int H = c->hidden_size, d = c->head_dim, nh = c->num_heads;
    const int nq = nh * d, nkv = c->num_kv_heads * d;
    if (c->attn_output_gate) {
        /* q_proj rows: per head d query rows, then d gate rows */
        hs_kn_matmul_ref(w->x, lw->q_proj, lw->q_bias, w->qg, T, H, 2 * nq);
        for (size_t r = 0; r < (size_t)T * nh; r++) {
            memcpy(w->q + r * d, w->qg + r * 2 * d, (size_t)d * sizeof(float));
            memcpy(w->ogate + r * d, w->qg + r * 2 * d + d, (size_t)d * sizeof(float));
        }
    } else {
        hs_kn_matmul_ref(w->x, lw->q_proj, lw->q_bias, w->q, T, H, nq);
    }
    hs_kn_matmul_ref(w->x, lw->k_proj, lw->k_bias, w->k, T, H, nkv);
    hs_kn_matmul_ref(w->x, lw->v_proj, lw->v_bias, w->v, T, H, nkv);
    if (lw->q_norm) {
        norm(c, w->q, lw->q_norm, w->q, T * nh, d);
        norm(c, w->k, lw->k_norm, w->k, T * c->num_kv_heads, d);
    }
    hs_kn_rope_partial_ref(w->q, cu_seqlens, n_seqs, nh, d, c->rotary_dim, m->inv_freq);
    hs_kn_rope_partial_ref(w->k, cu_seqlens, n_seqs, c->num_kv_heads, d, c->rotary_dim,
                           m->inv_freq);
    hs_kn_attention_ref(w->q, w->k, w->v, w->att, cu_seqlens, n_seqs, nh, c->num_kv_heads, d,
                        1.0f / sqrtf((float)d), c->sliding_window);
    if (c->attn_output_gate) hs_kn_sigmoid_gate_ref(w->att, w->ogate, (size_t)T * nq);
    hs_kn_matmul_ref(w->att, lw->o_proj, lw->o_bias, w->tmp, T, nq, H);
}

/* Gated DeltaNet of layer w on w->x into w->tmp [T, H]. */
static hs_status_t linear_mixer(const hs_model_t *m, const hs__layer_weights_t *lw, work_t *w,
                                const int32_t *cu_seqlens, int n_seqs, int T)
{
    const hs_model_config_t *c = &m->cfg;
    const int H = c->hidden_size, nk = c->lin_num_k_heads, nv = c->lin_num_v_heads;
    const int dk = c->lin_k_head_dim, dv = c->lin_v_head_dim;
    const int kd = nk * dk, vd = nv * dv, C = 2 * kd + vd;
    hs_kn_matmul_ref(w->x, lw->in_proj_qkv, NULL, w->mix, T, H, C);
    hs_kn_causal_conv1d_ref(w->mix, lw->conv1d, w->conv, cu_seqlens, n_seqs, C, c->lin_conv_kernel,
                            1);
    hs_kn_matmul_ref(w->x, lw->in_proj_z, NULL, w->z, T, H, vd);
    hs_kn_matmul_ref(w->x, lw->in_proj_b, NULL, w->b, T, H, nv);
    hs_kn_matmul_ref(w->x, lw->in_proj_a, NULL, w->a, T, H, nv);
    hs_kn_gdn_gates_ref(w->a, w->b, lw->A_log, lw->dt_bias, w->a, w->b, T, nv);
    if (hs_kn_delta_rule_ref(w->conv, w->conv + kd, w->conv + 2 * kd, (size_t)C, w->a, w->b,
                             w->core, cu_seqlens, n_seqs, nk, nv, dk, dv) != 0) {
        hs_error("forward: no memory for a %d x %d delta-rule state", dk, dv);
        return HS_ERR_NOMEM;
    }
    hs_kn_rmsnorm_gated_ref(w->core, w->z, lw->lin_norm, w->core, T * nv, dv, c->rms_norm_eps);
    hs_kn_matmul_ref(w->core, lw->out_proj, NULL, w->tmp, T, vd, H);
    return HS_OK;
}

hs_status_t hs_model_forward_cpu(hs_model_t *m, const int32_t *input_ids, const int32_t *cu_seqlens,
                                 int n_seqs, const int32_t *layers, int n_layers, void *out,
                                 int out_dtype, size_t row_stride_elems)
{
    if (!m) return HS_ERR_INVALID;
    hs_status_t rc = check_inputs(m, input_ids, cu_seqlens, n_seqs, layers, n_layers, out,
                                  out_dtype, row_stride_elems);
    if (rc != HS_OK) return rc;
    if ((rc = hs__model_fp8_to_bf16(m)) != HS_OK) return rc;
    const hs_model_config_t *c = &m->cfg;
    const int T = cu_seqlens[n_seqs];
    if (T == 0) return HS_OK;
    const int H = c->hidden_size, I = c->intermediate_size;
    int top = 0;
    for (int j = 0; j < n_layers; j++)
        if (layers[j] > top) top = layers[j];

    size_t t = (size_t)T;
    work_t *wp;
    if ((rc = work_get(m, T, &wp)) != HS_OK) return rc;
    work_t w = *wp; /* a copy of the pointers, for brevity */

    hs_kn_embedding_ref(m->embed, c->vocab_size, H, input_ids, T, w.h);
    capture(w.h, 0, T, H, layers, n_layers, out, out_dtype, row_stride_elems);
    /* layer l's output is index l + 1; index N is normed, handled below */
    int run = top < c->num_layers ? top : c->num_layers;
    for (int l = 0; l < run; l++) {
        const hs__layer_weights_t *lw = &m->layers[l];
        norm(c, w.h, lw->input_norm, w.x, T, H);
        if (hs_model_layer_is_linear(c, l)) {
            if ((rc = linear_mixer(m, lw, &w, cu_seqlens, n_seqs, T)) != HS_OK) goto out;
        } else {
            attention_mixer(m, lw, &w, cu_seqlens, n_seqs, T);
        }
        hs_kn_residual_add_ref(w.h, w.tmp, w.h, t * H);

        norm(c, w.h, lw->post_norm, w.x, T, H);
        hs_kn_matmul_ref(w.x, lw->gate_proj, lw->gate_bias, w.gate, T, H, I);
        hs_kn_matmul_ref(w.x, lw->up_proj, lw->up_bias, w.up, T, H, I);
        hs_kn_swiglu_ref(w.gate, w.up, w.gate, t * I);
        hs_kn_matmul_ref(w.gate, lw->down_proj, lw->down_bias, w.tmp, T, I, H);
        hs_kn_residual_add_ref(w.h, w.tmp, w.h, t * H);
        if (l + 1 < c->num_layers)
            capture(w.h, l + 1, T, H, layers, n_layers, out, out_dtype, row_stride_elems);
    }
    if (top == c->num_layers) {
        norm(c, w.h, m->final_norm, w.x, T, H);
        capture(w.x, c->num_layers, T, H, layers, n_layers, out, out_dtype, row_stride_elems);
    }
    rc = HS_OK;
out:
    work_put(m, wp);
    return rc;
}
