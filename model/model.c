/* SPDX-License-Identifier: Apache-2.0 */
/* model.c - loads a Hugging Face Llama-family or Qwen3.5 folder into an
 * hs_model_t (config.json + safetensors, every tensor's shape checked
 * against the config; only the decoder's tensors are touched), and the
 * layer-index helpers (captured layer checks, DFlash's default set). */
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fp8_block.h"
#include "model_int.h"
#include "rope.h"
#include "hs_log.h"

static char *read_file(const char *path, size_t *len)
{
    FILE *fp = fopen(path, "rb");
    if (!fp) return NULL;
    char *buf = NULL;
    long n = -1;
    if (fseek(fp, 0, SEEK_END) == 0) n = ftell(fp);
    if (n >= 0 && n < (64l << 20) && fseek(fp, 0, SEEK_SET) == 0) {
        buf = malloc((size_t)n + 1);
        if (buf && fread(buf, 1, (size_t)n, fp) == (size_t)n) {
            buf[n] = 0;
            *len = (size_t)n;
        } else {
            free(buf);
            buf = NULL;
        }
    }
    fclose(fp);
    return buf;
}

/* Where the decoder's tensors live: model.* or, in a Qwen3.5 VL wrapper,
 * model.language_model.* (the vision tower's model.visual.* and mtp.* are
 * never looked up). */
static const char *prefix(const hs_model_t *m)
{
    return m->cfg.vl_wrapper ? "model.language_model." : "model.";
}

/* Fetches "<prefix><name>" as bf16 of the given 1-D or 2-D shape. */
static hs_status_t get_w(hs_model_t *m, const char *name, int64_t d0, int64_t d1,
                         const uint16_t **out)
{
    char full[256];
    snprintf(full, sizeof full, "%s%s", prefix(m), name);
    int64_t shape[2] = {d0, d1};
    return hs__st_get_bf16(m->st, full, d1 ? 2 : 1, shape, out);
}

/* A buffer of `bytes` the model owns until it is destroyed. */
static void *own(hs_model_t *m, size_t bytes)
{
    if (m->n_owned == m->cap_owned) {
        size_t cap = m->cap_owned ? 2 * m->cap_owned : 64;
        void **o = realloc(m->owned, cap * sizeof *o);
        if (!o) return NULL;
        m->owned = o;
        m->cap_owned = cap;
    }
    void *p = malloc(bytes ? bytes : 1);
    if (p) m->owned[m->n_owned++] = p;
    return p;
}

/* An F8_E4M3 weight "<prefix><name>" [N, K] and its <name>_scale_inv. */
static hs_status_t get_fp8(hs_model_t *m, const char *full, int64_t N, int64_t K,
                           hs__fp8_weight_t *f8)
{
    if (!m->cfg.fp8_checkpoint) {
        hs_error("tensor '%s' is F8_E4M3 but config.json has no quantization_config with "
                 "quant_method \"fp8\" and weight_block_size [128, 128]: the checkpoint is "
                 "incomplete; restore its config.json",
                 full);
        return HS_ERR_FORMAT;
    }
    int64_t shape[2] = {N, K}, sshape[2] = {hs_fp8_blocks(N), hs_fp8_blocks(K)};
    hs_status_t rc = hs__st_get_fp8(m->st, full, 2, shape, &f8->w);
    if (rc != HS_OK) return rc;
    char sname[288];
    snprintf(sname, sizeof sname, "%s_scale_inv", full);
    if (!hs__st_find(m->st, sname)) {
        hs_error("tensor '%s' is F8_E4M3 but its block factors '%s' [%lld, %lld] are missing: "
                 "the checkpoint is incomplete; download it again",
                 full, sname, (long long)sshape[0], (long long)sshape[1]);
        return HS_ERR_FORMAT;
    }
    if ((rc = hs__st_get_f32(m->st, sname, 2, sshape, &f8->scale_inv)) != HS_OK) return rc;
    for (int64_t i = 0; i < sshape[0] * sshape[1]; i++) {
        if (!(f8->scale_inv[i] >= 0.0f)) {
            hs_error("tensor '%s' holds %g at block %lld: block factors must be >= 0; the "
                     "checkpoint is damaged",
                     sname, (double)f8->scale_inv[i], (long long)i);
            return HS_ERR_FORMAT;
        }
    }
    f8->n = N;
    f8->k = K;
    return HS_OK;
}

/* A Linear weight "<prefix><name>" [N, K]: bf16 into *bf16, or FP8 into
 * *f8 (then *bf16 = NULL), as stored and as m->weights asks. `quantize`:
 * whether --dtype fp8 turns this weight into FP8. */
static hs_status_t get_linear(hs_model_t *m, const char *name, int64_t N, int64_t K, int quantize,
                              const uint16_t **bf16, hs__fp8_weight_t *f8)
{
    char full[256];
    snprintf(full, sizeof full, "%s%s", prefix(m), name);
    const hs__st_tensor_t *t = hs__st_find(m->st, full);
    hs_status_t rc;
    if (t && t->dtype == HS_ST_F8_E4M3) {
        if ((rc = get_fp8(m, full, N, K, f8)) != HS_OK) return rc;
        if (m->weights != HS_MODEL_WEIGHTS_BF16) {
            *bf16 = NULL;
            m->n_fp8++;
            return HS_OK;
        }
        uint16_t *w = own(m, (size_t)(N * K) * 2);
        if (!w) return HS_ERR_NOMEM;
        hs_fp8_block_dequantize(f8->w, f8->scale_inv, N, K, w);
        memset(f8, 0, sizeof *f8);
        *bf16 = w;
        return HS_OK;
    }
    if ((rc = get_w(m, name, N, K, bf16)) != HS_OK) return rc;
    if (m->weights != HS_MODEL_WEIGHTS_FP8 || !quantize) return HS_OK;
    uint8_t *q = own(m, (size_t)(N * K));
    float *s = own(m, (size_t)(hs_fp8_blocks(N) * hs_fp8_blocks(K)) * sizeof(float));
    if (!q || !s) return HS_ERR_NOMEM;
    hs_fp8_block_quantize(*bf16, N, K, q, s);
    *f8 = (hs__fp8_weight_t){q, s, N, K};
    *bf16 = NULL;
    m->n_fp8++;
    return HS_OK;
}

/* The Linear fields of a layer, bf16 and FP8 side by side. */
#define LINEAR_FIELDS(X)                                                                           \
    X(q_proj);                                                                                     \
    X(k_proj);                                                                                     \
    X(v_proj);                                                                                     \
    X(o_proj);                                                                                     \
    X(gate_proj);                                                                                  \
    X(up_proj);                                                                                    \
    X(down_proj);                                                                                  \
    X(in_proj_qkv);                                                                                \
    X(in_proj_z);                                                                                  \
    X(in_proj_b);                                                                                  \
    X(in_proj_a);                                                                                  \
    X(out_proj)

static hs_status_t dequantize_layer(hs_model_t *m, hs__layer_weights_t *w)
{
#define DQ(f)                                                                                      \
    do {                                                                                           \
        if (w->fp8.f.w && !w->f) {                                                                 \
            uint16_t *b = own(m, (size_t)(w->fp8.f.n * w->fp8.f.k) * 2);                           \
            if (!b) return HS_ERR_NOMEM;                                                           \
            hs_fp8_block_dequantize(w->fp8.f.w, w->fp8.f.scale_inv, w->fp8.f.n, w->fp8.f.k, b);    \
            w->f = b;                                                                              \
        }                                                                                          \
    } while (0)
    LINEAR_FIELDS(DQ);
#undef DQ
    return HS_OK;
}

hs_status_t hs__model_fp8_to_bf16(hs_model_t *m)
{
    if (!m->n_fp8) return HS_OK;
    hs_status_t rc = HS_OK;
    pthread_mutex_lock(&m->cpu_lock);
    for (int l = 0; !m->fp8_dequantized && l < m->cfg.num_layers && rc == HS_OK; l++)
        rc = dequantize_layer(m, &m->layers[l]);
    if (rc == HS_OK && !m->fp8_dequantized) {
        hs_info("cpu forward: %d fp8 weights dequantised to bf16 for the reference forward",
                m->n_fp8);
        m->fp8_dequantized = 1;
    }
    pthread_mutex_unlock(&m->cpu_lock);
    if (rc != HS_OK) hs_error("cpu forward: no memory for the bf16 copies of the fp8 weights");
    return rc;
}

/* The Gated DeltaNet tensors of linear-attention layer i. */
static hs_status_t load_linear_attn(hs_model_t *m, int i)
{
    const hs_model_config_t *c = &m->cfg;
    hs__layer_weights_t *w = &m->layers[i];
    int64_t H = c->hidden_size, nv = c->lin_num_v_heads, dv = c->lin_v_head_dim;
    int64_t C = 2 * (int64_t)c->lin_num_k_heads * c->lin_k_head_dim + nv * dv;
    char n[160];
    hs_status_t rc;
#define LL(field, quantize, d0, d1)                                                                \
    do {                                                                                           \
        snprintf(n, sizeof n, "layers.%d.linear_attn." #field ".weight", i);                       \
        if ((rc = get_linear(m, n, (d0), (d1), quantize, &w->field, &w->fp8.field)) != HS_OK)      \
            return rc;                                                                             \
    } while (0)
    LL(in_proj_qkv, 1, C, H);
    LL(in_proj_z, 1, nv * dv, H);
    LL(in_proj_b, 0, nv, H); /* tiny: FP8 checkpoints keep them in bf16 */
    LL(in_proj_a, 0, nv, H);
    LL(out_proj, 1, H, nv * dv);
#undef LL
    snprintf(n, sizeof n, "layers.%d.linear_attn.norm.weight", i);
    if ((rc = get_w(m, n, dv, 0, &w->lin_norm)) != HS_OK) return rc;
    int64_t conv_shape[3] = {C, 1, c->lin_conv_kernel};
    snprintf(n, sizeof n, "%slayers.%d.linear_attn.conv1d.weight", prefix(m), i);
    if ((rc = hs__st_get_bf16(m->st, n, 3, conv_shape, &w->conv1d)) != HS_OK) return rc;
    snprintf(n, sizeof n, "%slayers.%d.linear_attn.A_log", prefix(m), i);
    if ((rc = hs__st_get_f32(m->st, n, 1, &nv, &w->A_log)) != HS_OK) return rc;
    snprintf(n, sizeof n, "%slayers.%d.linear_attn.dt_bias", prefix(m), i);
    return hs__st_get_f32(m->st, n, 1, &nv, &w->dt_bias);
}

static hs_status_t load_layer(hs_model_t *m, int i)
{
    const hs_model_config_t *c = &m->cfg;
    hs__layer_weights_t *w = &m->layers[i];
    int64_t H = c->hidden_size, I = c->intermediate_size, d = c->head_dim;
    int64_t nq = c->num_heads * d, nkv = c->num_kv_heads * d;
    char n[128];
    hs_status_t rc;
#define W(field, fmt, d0, d1)                                                                      \
    do {                                                                                           \
        snprintf(n, sizeof n, "layers.%d." fmt, i);                                                \
        if ((rc = get_w(m, n, (d0), (d1), &w->field)) != HS_OK) return rc;                         \
    } while (0)
#define L(field, fmt, d0, d1)                                                                      \
    do {                                                                                           \
        snprintf(n, sizeof n, "layers.%d." fmt, i);                                                \
        if ((rc = get_linear(m, n, (d0), (d1), 1, &w->field, &w->fp8.field)) != HS_OK) return rc;  \
    } while (0)
    if (hs_model_layer_is_linear(c, i)) {
        if ((rc = load_linear_attn(m, i)) != HS_OK) return rc;
        goto mlp;
    }
    L(q_proj, "self_attn.q_proj.weight", c->attn_output_gate ? 2 * nq : nq, H);
    L(k_proj, "self_attn.k_proj.weight", nkv, H);
    L(v_proj, "self_attn.v_proj.weight", nkv, H);
    L(o_proj, "self_attn.o_proj.weight", H, nq);
    if (c->qkv_bias) {
        W(q_bias, "self_attn.q_proj.bias", nq, 0);
        W(k_bias, "self_attn.k_proj.bias", nkv, 0);
        W(v_bias, "self_attn.v_proj.bias", nkv, 0);
    }
    if (c->o_bias) W(o_bias, "self_attn.o_proj.bias", H, 0);
    if (c->qk_norm) {
        W(q_norm, "self_attn.q_norm.weight", d, 0);
        W(k_norm, "self_attn.k_norm.weight", d, 0);
    }
mlp:
    L(gate_proj, "mlp.gate_proj.weight", I, H);
    L(up_proj, "mlp.up_proj.weight", I, H);
    L(down_proj, "mlp.down_proj.weight", H, I);
    if (c->mlp_bias) {
        W(gate_bias, "mlp.gate_proj.bias", I, 0);
        W(up_bias, "mlp.up_proj.bias", I, 0);
        W(down_bias, "mlp.down_proj.bias", H, 0);
    }
    W(input_norm, "input_layernorm.weight", H, 0);
    W(post_norm, "post_attention_layernorm.weight", H, 0);
#undef W
#undef L
    return HS_OK;
}

hs_status_t hs_model_read_config(const char *dir, hs_model_config_t *out)
{
    char path[PATH_MAX];
    size_t len = 0;
    snprintf(path, sizeof path, "%s/config.json", dir);
    char *json = read_file(path, &len);
    if (!json) {
        hs_error("cannot read %s: %m (is %s a Hugging Face model folder?)", path, dir);
        return HS_ERR_IO;
    }
    hs_model_config_t c;
    hs_status_t rc = hs__model_config_parse(json, len, path, &c);
    free(json);
    if (rc == HS_OK) *out = c;
    return rc;
}

hs_status_t hs_model_weights_parse(const char *s, hs_model_weights_t *out)
{
    uint32_t d;
    if (s && strcmp(s, "auto") == 0) {
        *out = HS_MODEL_WEIGHTS_AUTO;
        return HS_OK;
    }
    if (hs_dtype_parse(s, &d) != HS_OK) return HS_ERR_INVALID;
    *out = (hs_model_weights_t)d; /* the weights' values past auto are dtype ids */
    return HS_OK;
}

const char *hs_model_weights_name(hs_model_weights_t w)
{
    const hs_dtype_info_t *d = w == HS_MODEL_WEIGHTS_AUTO ? NULL : hs_dtype_info((uint32_t)w);
    return d ? d->name : "auto";
}

int hs_model_fp8_weights(const hs_model_t *m) { return m ? m->n_fp8 : 0; }

hs_status_t hs_model_load(const char *dir, hs_model_t **out)
{
    return hs_model_load_ex(dir, HS_MODEL_WEIGHTS_AUTO, out);
}

hs_status_t hs_model_load_ex(const char *dir, hs_model_weights_t weights, hs_model_t **out)
{
    hs_model_t *m = calloc(1, sizeof *m);
    if (!m) return HS_ERR_NOMEM;
    pthread_mutex_init(&m->cpu_lock, NULL);
    m->weights = weights;
    hs_status_t rc = hs_model_read_config(dir, &m->cfg);
    if (rc != HS_OK) goto err_model;
    const hs_model_config_t *c = &m->cfg;

    rc = hs__st_open_dir(dir, &m->st);
    if (rc != HS_OK) goto err_model;
    rc = HS_ERR_NOMEM;
    m->layers = calloc((size_t)c->num_layers, sizeof *m->layers);
    m->inv_freq = malloc((size_t)(c->rotary_dim / 2) * sizeof(float));
    if (!m->layers || !m->inv_freq) goto err_model;

    rc = get_w(m, "embed_tokens.weight", c->vocab_size, c->hidden_size, &m->embed);
    if (rc != HS_OK) goto err_model;
    rc = get_w(m, "norm.weight", c->hidden_size, 0, &m->final_norm);
    if (rc != HS_OK) goto err_model;
    for (int i = 0; i < c->num_layers; i++) {
        rc = load_layer(m, i);
        if (rc != HS_OK) goto err_model;
    }
    hs_rope_scaling_t sc = {
        .type = (hs_rope_type_t)c->rope_type,
        .factor = c->rope_factor,
        .low_freq_factor = c->rope_low_freq_factor,
        .high_freq_factor = c->rope_high_freq_factor,
        .original_max_positions = c->rope_original_max_positions,
    };
    hs_kn_rope_inv_freq(c->rotary_dim, c->rope_theta, &sc, m->inv_freq);

    if (c->arch == HS_MODEL_QWEN3_5) {
        int n_lin = 0;
        for (int l = 0; l < c->num_layers; l++)
            n_lin += hs_model_layer_is_linear(c, l);
        hs_info("model %s: %s%s, %d Gated DeltaNet layers (%d key / %d value heads of %d / %d, "
                "conv %d) and %d gated attention layers (rope on %d of %d dims)",
                dir, c->architecture, c->vl_wrapper ? " (text decoder; vision tower skipped)" : "",
                n_lin, c->lin_num_k_heads, c->lin_num_v_heads, c->lin_k_head_dim, c->lin_v_head_dim,
                c->lin_conv_kernel, c->num_layers - n_lin, c->rotary_dim, c->head_dim);
    }

    if (m->n_fp8 || c->fp8_checkpoint || weights != HS_MODEL_WEIGHTS_AUTO)
        hs_info("model %s: %s checkpoint, --dtype %s: %d Linear weights held in fp8 (128x128 "
                "block factors), the rest in bf16",
                dir, hs_dtype_str(c->fp8_checkpoint ? HS_DTYPE_FP8 : HS_DTYPE_BF16),
                hs_model_weights_name(weights), m->n_fp8);
    hs_info("model %s: %s, H=%d I=%d layers=%d heads=%d/%d head_dim=%d vocab=%d%s%s%s rope "
            "theta=%g%s",
            dir, c->architecture, c->hidden_size, c->intermediate_size, c->num_layers, c->num_heads,
            c->num_kv_heads, c->head_dim, c->vocab_size, c->qkv_bias ? " qkv-bias" : "",
            c->qk_norm ? " qk-norm" : "", c->tie_word_embeddings ? " tied" : "",
            (double)c->rope_theta,
            c->rope_type == HS_ROPE_LLAMA3   ? " llama3-scaling"
            : c->rope_type == HS_ROPE_LINEAR ? " linear-scaling"
                                             : "");
    *out = m;
    return HS_OK;

err_model:
    hs_model_destroy(m);
    return rc;
}

void hs_model_destroy(hs_model_t *m)
{
    if (!m) return;
    if (m->cpu_release) m->cpu_release(m);
    pthread_mutex_destroy(&m->cpu_lock);
    hs__st_close(m->st);
    for (size_t i = 0; i < m->n_owned; i++)
        free(m->owned[i]);
    free(m->owned);
    free(m->layers);
    free(m->inv_freq);
    free(m);
}

void hs_model_set_attn(hs_model_t *m, hs_model_attn_t attn) { m->attn = attn; }

hs_model_attn_t hs_model_attn_parse(const char *name)
{
    return name && !strcmp(name, "mma") ? HS_MODEL_ATTN_MMA : HS_MODEL_ATTN_AUTO;
}

const hs_model_config_t *hs_model_config(const hs_model_t *m) { return &m->cfg; }
int hs_model_hidden_size(const hs_model_t *m) { return m->cfg.hidden_size; }
int hs_model_num_layers(const hs_model_t *m) { return m->cfg.num_layers; }
int hs_model_vocab_size(const hs_model_t *m) { return m->cfg.vocab_size; }

hs_status_t hs_model_dflash_layers(int n_target_layers, int n_draft_layers, int32_t *out, int cap)
{
    if (n_draft_layers < 1 || n_draft_layers > cap) {
        hs_error("dflash layers: %d draft layers asked, 1..%d possible", n_draft_layers, cap);
        return HS_ERR_INVALID;
    }
    if (n_draft_layers > 1 && n_target_layers < n_draft_layers + 3) {
        hs_error("dflash layers: the model has %d decoder layers, too few for DFlash's default set "
                 "of %d draft layers (spread over decoder layers 1..N-3, it needs at least %d); "
                 "give fewer draft layers or --layers explicitly",
                 n_target_layers, n_draft_layers, n_draft_layers + 3);
        return HS_ERR_INVALID;
    }
    if (n_draft_layers == 1) {
        out[0] = n_target_layers / 2 + 1;
        return HS_OK;
    }
    /* DFlash: round(start + i * span / (n - 1)) with start 1, end N - 3;
     * nearbyint() in the default rounding mode is Python's round-half-even. */
    double start = 1.0, span = (double)(n_target_layers - 3) - start;
    for (int i = 0; i < n_draft_layers; i++)
        out[i] = (int32_t)nearbyint(start + (i * span) / (double)(n_draft_layers - 1)) + 1;
    return HS_OK;
}

hs_status_t hs_model_eagle3_layers(int n_target_layers, int32_t *out, int cap)
{
    const int N = n_target_layers;
    if (cap < HS_MODEL_EAGLE3_N_LAYERS) {
        hs_error("eagle3 layers: room for %d layers, %d needed", cap, HS_MODEL_EAGLE3_N_LAYERS);
        return HS_ERR_INVALID;
    }
    if (N < 7) {
        hs_error("eagle3 layers: the model has %d decoder layers, too few for EAGLE-3's default "
                 "set 2, N/2, N-3, N (it needs at least 7 for four distinct layers in order); "
                 "give --layers explicitly",
                 N);
        return HS_ERR_INVALID;
    }
    out[0] = 2;
    out[1] = N / 2;
    out[2] = N - 3;
    out[3] = N;
    return HS_OK;
}

double hs_model_forward_flops(const hs_model_config_t *c, int n_run, const int32_t *cu_seqlens,
                              int n_seqs)
{
    double H = c->hidden_size, I = c->intermediate_size, d = c->head_dim;
    double q = c->num_heads * d, kv = c->num_kv_heads * d;
    double qp = c->attn_output_gate ? 2 * q : q; /* q_proj rows */
    double params = H * (qp + 2 * kv) + q * H + 3 * H * I;
    double T = cu_seqlens[n_seqs];
    double attn = 0;
    for (int s = 0; s < n_seqs; s++) {
        double L = cu_seqlens[s + 1] - cu_seqlens[s];
        double w = c->sliding_window > 0 && c->sliding_window < L ? c->sliding_window : 0;
        /* causal pairs: L (L + 1) / 2, fewer under a sliding window */
        double pairs = w > 0 ? w * (w + 1) / 2 + (L - w) * w : L * (L + 1) / 2;
        attn += 4.0 * c->num_heads * d * pairs;
    }
    double full = 2.0 * params * T + attn;
    if (c->arch != HS_MODEL_QWEN3_5) return n_run * full;
    double nv = c->lin_num_v_heads, dk = c->lin_k_head_dim, dv = c->lin_v_head_dim;
    double ch = 2 * c->lin_num_k_heads * dk + nv * dv; /* conv channels */
    double lin_params = H * (ch + nv * dv + 2 * nv) + nv * dv * H + 3 * H * I;
    double linear = 2.0 * lin_params * T + (2.0 * c->lin_conv_kernel * ch + 6.0 * nv * dk * dv) * T;
    double total = 0;
    for (int l = 0; l < n_run && l < c->num_layers; l++)
        total += hs_model_layer_is_linear(c, l) ? linear : full;
    return total;
}

/* The CUDA forward's two shorthands, the same in every build: with CUDA they
 * reach forward_cuda.c, without it forward_cuda_stub.c's refusals. */
hs_status_t hs_model_cuda_create(hs_model_t *m, int device, uint32_t token_budget,
                                 uint32_t max_seqs, hs_model_cuda_t **out)
{
    return hs_model_cuda_create_ex(m, device, token_budget, max_seqs, -1, out);
}

hs_status_t hs_model_cuda_plan_bytes(const hs_model_t *m, uint32_t token_budget, uint32_t max_seqs,
                                     int max_layer, uint64_t *out)
{
    if (!out) return HS_ERR_INVALID;
    hs_model_cuda_plan_t p;
    hs_status_t st = hs_model_cuda_plan(m, token_budget, max_seqs, max_layer, &p);
    if (st) return st;
    *out = p.weights + p.activations + p.workspace;
    return HS_OK;
}
