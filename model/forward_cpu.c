/* forward_cpu.c - the CPU reference forward of the Llama-family decoder,
 * built from the kernels' C twins. fp32 activations, bf16 weights, fp32
 * accumulation. Per decoder layer, exactly as Hugging Face:
 *   x  = rmsnorm(h, input_layernorm)
 *   q,k,v = x Wq^T (+bq), x Wk^T (+bk), x Wv^T (+bv)
 *   q,k = rmsnorm per head (Qwen3 only), then rope (positions per sequence)
 *   h += attention(q, k, v) Wo^T (+bo)
 *   x  = rmsnorm(h, post_attention_layernorm)
 *   h += (silu(x Wg^T) * (x Wu^T)) Wd^T
 * Captured index 0 is the embedding output, i the output of layer i-1, and
 * N the final rmsnorm of the last layer's output. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "attention.h"
#include "bf16.h"
#include "embedding.h"
#include "matmul.h"
#include "model_int.h"
#include "residual.h"
#include "rmsnorm.h"
#include "rope.h"
#include "swiglu.h"

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

hs_status_t hs_model_forward_cpu(hs_model_t *m, const int32_t *input_ids, const int32_t *cu_seqlens,
                                 int n_seqs, const int32_t *layers, int n_layers, void *out,
                                 int out_dtype, size_t row_stride_elems)
{
    if (!m) return HS_ERR_INVALID;
    hs_status_t rc = check_inputs(m, input_ids, cu_seqlens, n_seqs, layers, n_layers, out,
                                  out_dtype, row_stride_elems);
    if (rc != HS_OK) return rc;
    const hs_model_config_t *c = &m->cfg;
    const int T = cu_seqlens[n_seqs];
    if (T == 0) return HS_OK;
    const int H = c->hidden_size, I = c->intermediate_size, d = c->head_dim;
    const int nq = c->num_heads * d, nkv = c->num_kv_heads * d;
    int top = 0;
    for (int j = 0; j < n_layers; j++)
        if (layers[j] > top) top = layers[j];

    size_t t = (size_t)T;
    float *h = malloc(t * H * sizeof(float));
    float *x = malloc(t * H * sizeof(float));
    float *tmp = malloc(t * H * sizeof(float));
    float *q = malloc(t * nq * sizeof(float));
    float *att = malloc(t * nq * sizeof(float));
    float *k = malloc(t * nkv * sizeof(float));
    float *v = malloc(t * nkv * sizeof(float));
    float *gate = malloc(t * I * sizeof(float));
    float *up = malloc(t * I * sizeof(float));
    if (!h || !x || !tmp || !q || !att || !k || !v || !gate || !up) {
        hs_error("forward: out of memory for %d tokens of work buffers", T);
        rc = HS_ERR_NOMEM;
        goto out;
    }

    hs_kn_embedding_ref(m->embed, c->vocab_size, H, input_ids, T, h);
    capture(h, 0, T, H, layers, n_layers, out, out_dtype, row_stride_elems);
    const float scale = 1.0f / sqrtf((float)d);
    /* layer l's output is index l + 1; index N is normed, handled below */
    int run = top < c->num_layers ? top : c->num_layers;
    for (int l = 0; l < run; l++) {
        const hs__layer_weights_t *w = &m->layers[l];
        hs_kn_rmsnorm_ref(h, w->input_norm, x, T, H, c->rms_norm_eps);
        hs_kn_matmul_ref(x, w->q_proj, w->q_bias, q, T, H, nq);
        hs_kn_matmul_ref(x, w->k_proj, w->k_bias, k, T, H, nkv);
        hs_kn_matmul_ref(x, w->v_proj, w->v_bias, v, T, H, nkv);
        if (w->q_norm) {
            hs_kn_rmsnorm_ref(q, w->q_norm, q, T * c->num_heads, d, c->rms_norm_eps);
            hs_kn_rmsnorm_ref(k, w->k_norm, k, T * c->num_kv_heads, d, c->rms_norm_eps);
        }
        hs_kn_rope_ref(q, cu_seqlens, n_seqs, c->num_heads, d, m->inv_freq);
        hs_kn_rope_ref(k, cu_seqlens, n_seqs, c->num_kv_heads, d, m->inv_freq);
        hs_kn_attention_ref(q, k, v, att, cu_seqlens, n_seqs, c->num_heads, c->num_kv_heads, d,
                            scale, c->sliding_window);
        hs_kn_matmul_ref(att, w->o_proj, w->o_bias, tmp, T, nq, H);
        hs_kn_residual_add_ref(h, tmp, h, t * H);

        hs_kn_rmsnorm_ref(h, w->post_norm, x, T, H, c->rms_norm_eps);
        hs_kn_matmul_ref(x, w->gate_proj, w->gate_bias, gate, T, H, I);
        hs_kn_matmul_ref(x, w->up_proj, w->up_bias, up, T, H, I);
        hs_kn_swiglu_ref(gate, up, gate, t * I);
        hs_kn_matmul_ref(gate, w->down_proj, w->down_bias, tmp, T, I, H);
        hs_kn_residual_add_ref(h, tmp, h, t * H);
        if (l + 1 < c->num_layers)
            capture(h, l + 1, T, H, layers, n_layers, out, out_dtype, row_stride_elems);
    }
    if (top == c->num_layers) {
        hs_kn_rmsnorm_ref(h, m->final_norm, x, T, H, c->rms_norm_eps);
        capture(x, c->num_layers, T, H, layers, n_layers, out, out_dtype, row_stride_elems);
    }
    rc = HS_OK;
out:
    free(h);
    free(x);
    free(tmp);
    free(q);
    free(att);
    free(k);
    free(v);
    free(gate);
    free(up);
    return rc;
}
