/* SPDX-License-Identifier: Apache-2.0 */
/* forward_cuda.c - the CUDA forward of the Llama-family and Qwen3.5
 * decoders: bf16 activations, fp32 accumulation (and fp32 Gated DeltaNet
 * state), every GEMM through the cuBLASLt wrapper.
 *
 * Per decoder layer (h is the residual stream [T, H]):
 *   xa  = rmsnorm(h, input_layernorm)        (+ copy of h into a captured slice)
 *   mixer: attention or Gated DeltaNet (below), h += its output
 *   xa  = rmsnorm(h, post_attention_layernorm)
 *   gu  = xa [Wg;Wu]^T (+ [bg;bu])           one GEMM on the fused weight
 *   gu[:, :I] = silu(gate) * up              in place
 *   h  += gu[:, :I] Wd^T (+ bd)              GEMM with beta = 1
 * Attention:
 *   qkv = xa [Wq;Wk;Wv]^T (+ [bq;bk;bv])     one GEMM on the fused weight
 *     (Qwen3.5: [Wq;Wk;Wv;Wgate], q_proj's per-head query and gate rows
 *     regrouped at upload, so q, k and v sit as for the other families and
 *     the gate follows them in the same rows)
 *   q/k rmsnorm per head (Qwen3, Qwen3.5), rope on q and k in place
 *     (Qwen3.5: on the first rotary_dim dims of each head), positions per sequence
 *   xa  = attention(q, k, v)                 varlen causal
 *   xa *= sigmoid(gate)                      (Qwen3.5)
 *   h  += xa Wo^T (+ bo)                     GEMM with beta = 1: no add kernel
 * Gated DeltaNet (Qwen3.5's linear_attention layers):
 *   mix  = xa [Wqkv;Wb;Wa]^T                 one GEMM: conv channels, then b, a
 *   z    = xa Wz^T                           its own rows (the gated norm reads z per value head)
 *   conv = silu(causal_conv1d(mix[:, :C]))   window restarting at every sequence
 *   g, beta = gates(a, b, A_log, dt_bias)    fp32
 *   xa   = delta_rule(q, k, v, g, beta)      fp32 state restarting at every sequence
 *   xa   = rmsnorm_gated(xa, z) per value head
 *   h   += xa Wout^T                         GEMM with beta = 1
 * Qwen3.5's layer, final and q/k norms are zero-centred (scale by 1 + w,
 * kernels/rmsnorm.cu with zero_centered; the stored weights are uploaded as
 * they are). Captured index i < N is the input of layer i: the input
 * rmsnorm of layer i writes it into its column slice as it reads it; the
 * highest index, when no layer reads it, is copied there; index N is the
 * final rmsnorm, written straight into its slice.
 *
 * Memory (planned once at create, nothing allocated per batch):
 *   weights: one allocation, q/k/v(/gate), gate/up and qkv/b/a concatenated
 *   at upload; A_log and dt_bias in fp32;
 *   activations for token_budget tokens: h [T, H], xa [T, max(H, Hq d,
 *   nv dv)], big [T, max((2 Hq + 2 Hkv) d, 2 I, mix + conv + z)] (qkv, then
 *   gate|up; for a Gated DeltaNet layer mix, conv and z one after the
 *   other), positions [T]; g and beta fp32 [T, nv] and the delta rule's
 *   workspace (Qwen3.5); plus the cuBLASLt workspace and the attention plan
 *   (its cuDNN graphs and workspace, or the mma.sync kernel's tile prefix).
 * Only the decoder layers below the highest capturable index (max_layer at
 * create) are uploaded. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cuda_runtime_api.h>

#include "attention.h"
#include "conv1d.h"
#include "cublaslt.h"
#include "delta_rule.h"
#include "embedding.h"
#include "fp8_block.h"
#include "gdn_gates.h"
#include "gpu_energy.h"
#include "hs_model.h"
#include "model_int.h"
#include "rmsnorm.h"
#include "rmsnorm_gated.h"
#include "rope.h"
#include "sigmoid_gate.h"
#include "swiglu.h"
#include "hs_log.h"
#include "hs_shuffle.h"
#include "hs_memory.h"

#define ALIGN 256

/* One GEMM of a Linear: output columns [col, col + n) from a weight [n, K]
 * in bf16, or in e4m3 with its block factors ws [ceil(n/128),
 * hs_lt_fp8_scale_ld(K)] (kernels/fp8_block.h). */
typedef struct {
    void *w;
    float *ws;  /* NULL: bf16 */
    void *bias; /* [n] bf16, or NULL */
    int col, n;
} dev_gemm_t;

#define MAX_PARTS 4 /* q | k | v | gate */

/* A Linear, maybe several fused (q|k|v(|gate), gate|up, qkv|b|a): its GEMMs
 * in output column order. bf16 parts fuse into one GEMM; FP8 parts fuse
 * while each ends on a 128-row block. */
typedef struct {
    dev_gemm_t g[MAX_PARTS];
    int n_g, K;
} dev_linear_t;

typedef struct {
    dev_linear_t qkv, o, gu, down;
    void *in_norm, *post_norm, *q_norm, *k_norm;
    /* Gated DeltaNet layers: [Wqkv;Wb;Wa], Wz, conv [C, K], norm [dv], Wout */
    dev_linear_t mix, z, out;
    void *conv, *lin_norm;
    float *A_log, *dt_bias; /* [nv] */
} dev_layer_t;

struct hs_model_cuda {
    const hs_model_t *m;
    int device;
    uint32_t budget, max_seqs;
    int H, I, N, nh, nkv, d, q_dim, qkv_dim, xa_dim, big_dim;
    int gate_off; /* column of the attention gate in the qkv rows; 0 = ungated */
    int rot;      /* rotary dims per head */
    /* Gated DeltaNet shapes (0 without such layers): key / value heads and
     * dims, conv kernel, conv channels C, value width nv dv, the row
     * strides of the mix [T, C + 2 nv] and conv [T, C] regions of big */
    int nk, nv, dk, dv, K, C, vd, mix_ld, conv_ld;
    bool zc;       /* zero-centred norms */
    int max_layer; /* highest output_hidden_states index a forward may capture */
    int n_up;      /* decoder layers uploaded: min(max_layer, N) */
    void *wbase;   /* all weights */
    size_t wbytes;
    void *abase; /* all activations */
    size_t abytes;
    dev_layer_t *layers; /* [N], pointers into wbase */
    void *embed, *final_norm;
    float *inv_freq;
    void *h, *xa, *big; /* bf16 activations */
    int32_t *pos;
    hs_kn_attn_plan_t *attn;
    float *g, *beta; /* Gated DeltaNet gates [T, nv] */
    void *dr_ws;     /* delta rule workspace */
    size_t dr_bytes;
    hs_lt_t *lt;
    size_t lt_bytes;
    hs_gpu_energy_t *energy; /* opened by the first preflight; NULL without NVML */
    bool energy_tried;
    /* FP8 GEMMs: the activations quantised per token and 128-group,
     * xq [T, round_up(max K, 16)] e4m3 and xs [ceil(max K / 128), T] */
    int n_fp8_gemms, n_fp8_fallback; /* GEMMs on FP8; FP8 weights run as bf16 */
    int max_k;
    uint8_t *xq;
    float *xs;
};

/* ---- planning ------------------------------------------------------------ */

/* Hands out 256-byte aligned offsets; with base == NULL it only counts. */
typedef struct {
    char *base;
    size_t off;
} planner_t;

static void *plan_take(planner_t *p, size_t bytes)
{
    size_t at = hs_align_up(p->off, ALIGN);
    p->off = at + bytes;
    return p->base ? p->base + at : NULL;
}

/* Upload n bf16 values (or zeros when src is NULL) to dst. */
static hs_status_t put(void *dst, const uint16_t *src, size_t n)
{
    if (!dst || !n) return HS_OK;
    if (!src) return HS_CUDA_CHECK(cudaMemset(dst, 0, n * 2));
    return HS_CUDA_CHECK(cudaMemcpy(dst, src, n * 2, cudaMemcpyHostToDevice));
}

/* Upload n fp32 values to dst. */
static hs_status_t put_f32(void *dst, const float *src, size_t n)
{
    if (!dst || !n) return HS_OK;
    return HS_CUDA_CHECK(cudaMemcpy(dst, src, n * sizeof(float), cudaMemcpyHostToDevice));
}

/* Upload the rows of a gated q_proj [n_heads * 2 * d, H] of esize-byte
 * values (per head d query rows, then d gate rows): part 0 = the query
 * rows, part 1 = the gate rows, each head after the other, into dst
 * [n_heads * d, H]. */
static hs_status_t put_q_part(void *dst, const void *q_proj, size_t esize, int n_heads, int d,
                              int H, int part)
{
    if (!dst) return HS_OK;
    size_t head = (size_t)d * H * esize; /* bytes of d rows */
    return HS_CUDA_CHECK(cudaMemcpy2D(dst, head, (const char *)q_proj + (size_t)part * head,
                                      2 * head, head, (size_t)n_heads, cudaMemcpyHostToDevice));
}

/* A part of a Linear as the model holds it: bf16, or FP8 (f8->w set).
 * head_part 1 / 2: the query / gate rows of a gated q_proj (per head d
 * query rows then d gate rows), else 0. */
typedef struct {
    const uint16_t *bf16;
    const hs__fp8_weight_t *f8;
    const uint16_t *bias; /* [n] or NULL */
    int n, head_part;
} part_t;

/* Whether an FP8 part can run as FP8 here: K whole 128-blocks (cuBLASLt's
 * FP8 layouts want K a multiple of 16; a short last K block is not relied
 * on until test_fp8_block_cuda shows it right on the GPU); a gated
 * q_proj's per-head regrouping keeps whole blocks only when head_dim is a
 * multiple of 128. */
static int part_fp8(const hs_model_cuda_t *mc, const part_t *pt, int K)
{
    return pt->f8 && pt->f8->w && K % 128 == 0 && (!pt->head_part || mc->d % 128 == 0);
}

/* Source row of row r of part pt (the gated q_proj regrouping). */
static int64_t src_row(const hs_model_cuda_t *mc, const part_t *pt, int64_t r)
{
    if (!pt->head_part) return r;
    return r / mc->d * 2 * mc->d + (pt->head_part - 1) * mc->d + r % mc->d;
}

/* Groups parts into GEMMs (see dev_linear_t). A GEMM must start on a
 * column a multiple of 8 (16-byte aligned output): where one would not, the
 * FP8 parts on either side of that column run as bf16 and the grouping is
 * tried again (a Gated DeltaNet's FP8 in_proj_b / in_proj_a of a few rows
 * join the bf16 side; at worst the whole Linear is one bf16 GEMM). */
static void group_parts(const hs_model_cuda_t *mc, const part_t *parts, int n_parts, int K,
                        dev_linear_t *L, int *fp8_of)
{
    for (int i = 0; i < n_parts; i++)
        fp8_of[i] = part_fp8(mc, &parts[i], K);
    for (;;) {
        memset(L, 0, sizeof *L);
        L->K = K;
        int col = 0, bad = -1;
        for (int i = 0; i < n_parts && bad < 0; i++) {
            dev_gemm_t *last = L->n_g ? &L->g[L->n_g - 1] : NULL;
            if (last && fp8_of[i] == fp8_of[i - 1] && (!fp8_of[i] || last->n % 128 == 0))
                last->n += parts[i].n;
            else if (col % 8 == 0)
                L->g[L->n_g++] = (dev_gemm_t){.col = col, .n = parts[i].n};
            else
                bad = i;
            col += parts[i].n;
        }
        if (bad < 0) return;
        fp8_of[bad] = fp8_of[bad - 1] = 0; /* bad >= 1: column 0 is aligned */
    }
}

/* The rows of part pt as bf16 on the host (an FP8 part run as bf16 is
 * dequantised), into dst [n, K]. */
static hs_status_t part_bf16_host(const hs_model_cuda_t *mc, const part_t *pt, int K, uint16_t *dst)
{
    const uint16_t *src = pt->bf16;
    uint16_t *full = NULL;
    if (!src) {
        full = malloc((size_t)(pt->f8->n * pt->f8->k) * 2);
        if (!full) return HS_ERR_NOMEM;
        hs_fp8_block_dequantize(pt->f8->w, pt->f8->scale_inv, pt->f8->n, pt->f8->k, full);
        src = full;
    }
    for (int64_t r = 0; r < pt->n; r++)
        memcpy(dst + r * K, src + src_row(mc, pt, r) * K, (size_t)K * 2);
    free(full);
    return HS_OK;
}

/* Uploads the GEMM g of parts [first, first + count) (all bf16 or all FP8). */
static hs_status_t put_gemm(const hs_model_cuda_t *mc, const dev_gemm_t *g, const part_t *parts,
                            int first, int count, int K, int fp8)
{
    hs_status_t st = HS_OK;
    const int64_t ld = hs_lt_fp8_scale_ld(K), kb = hs_fp8_blocks(K);
    size_t row = 0;
    float *scales = NULL;
    if (fp8) {
        scales = calloc((size_t)(hs_fp8_blocks(g->n) * ld), sizeof *scales);
        if (!scales) return HS_ERR_NOMEM;
    }
    for (int i = first; i < first + count && !st; i++) {
        const part_t *pt = &parts[i];
        char *dst = (char *)g->w + row * K * (fp8 ? 1 : 2);
        if (fp8) {
            /* whole blocks: every part but the last ends on a 128-row block */
            if (pt->head_part)
                st = put_q_part(dst, pt->f8->w, 1, mc->nh, mc->d, K, pt->head_part - 1);
            else
                st = HS_CUDA_CHECK(
                    cudaMemcpy(dst, pt->f8->w, (size_t)pt->n * K, cudaMemcpyHostToDevice));
            for (int64_t b = 0; b < hs_fp8_blocks(pt->n); b++)
                memcpy(scales + (row / 128 + b) * ld,
                       pt->f8->scale_inv + src_row(mc, pt, b * 128) / 128 * kb,
                       (size_t)kb * sizeof(float));
        } else if (pt->bf16 && pt->head_part) {
            st = put_q_part(dst, pt->bf16, 2, mc->nh, mc->d, K, pt->head_part - 1);
        } else if (pt->bf16) {
            st = put(dst, pt->bf16, (size_t)pt->n * K);
        } else {
            uint16_t *tmp = malloc((size_t)pt->n * K * 2);
            st = tmp ? part_bf16_host(mc, pt, K, tmp) : HS_ERR_NOMEM;
            if (!st) st = put(dst, tmp, (size_t)pt->n * K);
            free(tmp);
        }
        if (!st && g->bias) st = put((char *)g->bias + row * 2, pt->bias, (size_t)pt->n);
        row += (size_t)pt->n;
    }
    if (!st && fp8)
        st = HS_CUDA_CHECK(cudaMemcpy(g->ws, scales, (size_t)(hs_fp8_blocks(g->n) * ld) * 4,
                                      cudaMemcpyHostToDevice));
    free(scales);
    return st;
}

/* Lays out (and with p->base set, uploads) the Linear made of parts. */
static hs_status_t plan_linear(hs_model_cuda_t *mc, planner_t *p, dev_linear_t *L,
                               const part_t *parts, int n_parts, int K)
{
    int fp8_of[MAX_PARTS], has_bias = 0;
    group_parts(mc, parts, n_parts, K, L, fp8_of);
    for (int i = 0; i < n_parts; i++) {
        has_bias |= parts[i].bias != NULL;
        if (parts[i].f8 && parts[i].f8->w && !fp8_of[i]) mc->n_fp8_fallback++;
    }
    int first = 0;
    for (int j = 0; j < L->n_g; j++) {
        dev_gemm_t *g = &L->g[j];
        int count = 0, rows = 0;
        while (rows < g->n)
            rows += parts[first + count++].n;
        const int fp8 = fp8_of[first];
        g->w = plan_take(p, (size_t)g->n * K * (fp8 ? 1 : 2));
        if (fp8) {
            g->ws = plan_take(p, (size_t)(hs_fp8_blocks(g->n) * hs_lt_fp8_scale_ld(K)) * 4);
            mc->n_fp8_gemms++;
            if (K > mc->max_k) mc->max_k = K;
        }
        if (has_bias) g->bias = plan_take(p, (size_t)g->n * 2);
        if (p->base) {
            hs_status_t st = put_gemm(mc, g, parts, first, count, K, fp8);
            if (st) return st;
        }
        first += count;
    }
    return HS_OK;
}

#define PART(layer, field, rows, b)                                                                \
    {                                                                                              \
        (layer)->field, &(layer)->fp8.field, (b), (rows), 0                                        \
    }

/* The Gated DeltaNet weights of layer l. */
static hs_status_t plan_linear_weights(hs_model_cuda_t *mc, planner_t *p, int l)
{
    const hs__layer_weights_t *w = &mc->m->layers[l];
    dev_layer_t *dl = &mc->layers[l];
    const int H = mc->H, C = mc->C, nv = mc->nv, vd = mc->vd;
    hs_status_t st;
    const part_t mix[] = {PART(w, in_proj_qkv, C, NULL), PART(w, in_proj_b, nv, NULL),
                          PART(w, in_proj_a, nv, NULL)};
    const part_t z[] = {PART(w, in_proj_z, vd, NULL)}, out[] = {PART(w, out_proj, H, NULL)};
    if ((st = plan_linear(mc, p, &dl->mix, mix, 3, H))) return st;
    if ((st = plan_linear(mc, p, &dl->z, z, 1, H))) return st;
    dl->conv = plan_take(p, (size_t)C * (size_t)mc->K * 2);
    if ((st = put(dl->conv, w->conv1d, (size_t)C * (size_t)mc->K))) return st;
    dl->lin_norm = plan_take(p, (size_t)mc->dv * 2);
    if ((st = put(dl->lin_norm, w->lin_norm, (size_t)mc->dv))) return st;
    if ((st = plan_linear(mc, p, &dl->out, out, 1, vd))) return st;
    dl->A_log = plan_take(p, (size_t)nv * sizeof(float));
    if ((st = put_f32(dl->A_log, w->A_log, (size_t)nv))) return st;
    dl->dt_bias = plan_take(p, (size_t)nv * sizeof(float));
    return put_f32(dl->dt_bias, w->dt_bias, (size_t)nv);
}

/* Lays the weights out in p; with p->base set, uploads them too. */
static hs_status_t plan_weights(hs_model_cuda_t *mc, planner_t *p)
{
    const hs_model_t *m = mc->m;
    const hs_model_config_t *c = &m->cfg;
    const size_t H = (size_t)mc->H;
    const int qd = mc->q_dim, kvd = mc->nkv * mc->d, I = mc->I;
    hs_status_t st;
    mc->n_fp8_gemms = mc->n_fp8_fallback = mc->max_k = 0;
    mc->embed = plan_take(p, (size_t)c->vocab_size * H * 2);
    if ((st = put(mc->embed, m->embed, (size_t)c->vocab_size * H))) return st;
    mc->final_norm = plan_take(p, H * 2);
    if ((st = put(mc->final_norm, m->final_norm, H))) return st;
    mc->inv_freq = plan_take(p, (size_t)mc->rot / 2 * sizeof(float));
    if ((st = put_f32(mc->inv_freq, m->inv_freq, (size_t)mc->rot / 2))) return st;
    for (int l = 0; l < mc->n_up; l++) {
        const hs__layer_weights_t *w = &m->layers[l];
        dev_layer_t *dl = &mc->layers[l];
        if (hs_model_layer_is_linear(c, l)) {
            if ((st = plan_linear_weights(mc, p, l))) return st;
            goto mlp;
        }
        part_t qkv[] = {PART(w, q_proj, qd, w->q_bias), PART(w, k_proj, kvd, w->k_bias),
                        PART(w, v_proj, kvd, w->v_bias), PART(w, q_proj, qd, NULL)};
        if (mc->gate_off) qkv[0].head_part = 1, qkv[3].head_part = 2;
        const part_t o[] = {PART(w, o_proj, mc->H, w->o_bias)};
        if ((st = plan_linear(mc, p, &dl->qkv, qkv, mc->gate_off ? 4 : 3, mc->H))) return st;
        if ((st = plan_linear(mc, p, &dl->o, o, 1, qd))) return st;
        if (w->q_norm) {
            dl->q_norm = plan_take(p, (size_t)mc->d * 2);
            if ((st = put(dl->q_norm, w->q_norm, (size_t)mc->d))) return st;
        }
        if (w->k_norm) {
            dl->k_norm = plan_take(p, (size_t)mc->d * 2);
            if ((st = put(dl->k_norm, w->k_norm, (size_t)mc->d))) return st;
        }
    mlp:;
        const part_t gu[] = {PART(w, gate_proj, I, w->gate_bias), PART(w, up_proj, I, w->up_bias)};
        const part_t down[] = {PART(w, down_proj, mc->H, w->down_bias)};
        if ((st = plan_linear(mc, p, &dl->gu, gu, 2, mc->H))) return st;
        if ((st = plan_linear(mc, p, &dl->down, down, 1, I))) return st;
        dl->in_norm = plan_take(p, H * 2);
        if ((st = put(dl->in_norm, w->input_norm, H))) return st;
        dl->post_norm = plan_take(p, H * 2);
        if ((st = put(dl->post_norm, w->post_norm, H))) return st;
    }
    return HS_OK;
}

static void plan_activations(hs_model_cuda_t *mc, planner_t *p)
{
    const size_t T = mc->budget;
    mc->h = plan_take(p, T * (size_t)mc->H * 2);
    mc->xa = plan_take(p, T * (size_t)mc->xa_dim * 2);
    mc->big = plan_take(p, T * (size_t)mc->big_dim * 2 + 2 * ALIGN); /* + region alignment */
    mc->pos = plan_take(p, T * sizeof(int32_t));
    if (mc->nv) {
        mc->g = plan_take(p, T * (size_t)mc->nv * sizeof(float));
        mc->beta = plan_take(p, T * (size_t)mc->nv * sizeof(float));
        mc->dr_ws = plan_take(p, mc->dr_bytes);
    }
    if (mc->n_fp8_gemms) {
        mc->xq = plan_take(p, T * hs_align_up((size_t)mc->max_k, 16));
        mc->xs = plan_take(p, (size_t)hs_fp8_act_scale_count((int64_t)T, mc->max_k) * 4);
    }
}

/* Checks the arguments of create / plan_bytes against what the CUDA
 * forward supports. */
static hs_status_t check_create(const hs_model_t *m, uint32_t token_budget, uint32_t max_seqs)
{
    if (!m || token_budget == 0 || max_seqs == 0 || max_seqs > token_budget) {
        hs_error("cuda forward: need a model, token_budget >= 1 and 1 <= max_seqs <= token_budget "
                 "(got budget %u, max_seqs %u)",
                 token_budget, max_seqs);
        return HS_ERR_INVALID;
    }
    const hs_model_config_t *c = &m->cfg;
    if (c->head_dim > 256 || c->head_dim % 2) {
        hs_error("cuda forward: head_dim %d is not supported by the CUDA attention (even, at most "
                 "256); use --device cpu",
                 c->head_dim);
        return HS_ERR_UNSUPPORTED;
    }
    if (c->arch == HS_MODEL_QWEN3_5 &&
        (c->lin_conv_kernel > 8 || c->lin_k_head_dim > 256 || c->lin_v_head_dim > 256)) {
        hs_error("cuda forward: linear_conv_kernel_dim %d, linear_key_head_dim %d and "
                 "linear_value_head_dim %d: the CUDA Gated DeltaNet takes a conv kernel of at most "
                 "8 and head dims of at most 256; use --device cpu",
                 c->lin_conv_kernel, c->lin_k_head_dim, c->lin_v_head_dim);
        return HS_ERR_UNSUPPORTED;
    }
    if (c->hidden_size % 8 || c->intermediate_size % 8) {
        hs_error("cuda forward: hidden_size %d and intermediate_size %d must be multiples of 8 for "
                 "cuBLASLt; use --device cpu",
                 c->hidden_size, c->intermediate_size);
        return HS_ERR_UNSUPPORTED;
    }
    return HS_OK;
}

/* Fills the shape fields of mc and counts weight and activation bytes (no
 * device call). mc->layers must hold N entries. */
static hs_status_t plan_sizes(hs_model_cuda_t *mc, const hs_model_t *m, int device,
                              uint32_t token_budget, uint32_t max_seqs, int max_layer)
{
    const hs_model_config_t *c = &m->cfg;
    mc->m = m;
    mc->device = device;
    mc->budget = token_budget;
    mc->max_seqs = max_seqs;
    mc->H = c->hidden_size;
    mc->I = c->intermediate_size;
    mc->N = c->num_layers;
    mc->max_layer = max_layer < 0 || max_layer > mc->N ? mc->N : max_layer;
    mc->n_up = mc->max_layer;
    mc->nh = c->num_heads;
    mc->nkv = c->num_kv_heads;
    mc->d = c->head_dim;
    mc->q_dim = mc->nh * mc->d;
    mc->qkv_dim = (mc->nh + 2 * mc->nkv) * mc->d;
    mc->rot = c->rotary_dim;
    mc->zc = c->zero_centered_norm;
    if (c->attn_output_gate) {
        mc->gate_off = mc->qkv_dim;
        mc->qkv_dim += mc->q_dim;
    }
    mc->xa_dim = mc->H > mc->q_dim ? mc->H : mc->q_dim;
    mc->big_dim = mc->qkv_dim > 2 * mc->I ? mc->qkv_dim : 2 * mc->I;
    int n_lin = 0;
    for (int l = 0; l < mc->n_up; l++)
        n_lin += hs_model_layer_is_linear(c, l);
    if (n_lin) {
        mc->nk = c->lin_num_k_heads;
        mc->nv = c->lin_num_v_heads;
        mc->dk = c->lin_k_head_dim;
        mc->dv = c->lin_v_head_dim;
        mc->K = c->lin_conv_kernel;
        mc->vd = mc->nv * mc->dv;
        mc->C = 2 * mc->nk * mc->dk + mc->vd;
        mc->mix_ld = (int)hs_align_up((size_t)(mc->C + 2 * mc->nv), 8);
        mc->conv_ld = (int)hs_align_up((size_t)mc->C, 8);
        if (mc->vd > mc->xa_dim) mc->xa_dim = mc->vd;
        /* mix, conv and z one after the other in big: in units of T rows */
        int lin = mc->mix_ld + mc->conv_ld + (int)hs_align_up((size_t)mc->vd, 8);
        if (lin > mc->big_dim) mc->big_dim = lin;
        mc->dr_bytes = hs_kn_delta_rule_workspace_bytes((int)token_budget, (int)max_seqs, mc->nk,
                                                        mc->nv, mc->dk, mc->dv);
    }
    planner_t pw = {NULL, 0}, pa = {NULL, 0};
    hs_status_t st = plan_weights(mc, &pw);
    if (st) return st;
    plan_activations(mc, &pa);
    mc->wbytes = pw.off;
    mc->abytes = pa.off;
    mc->lt_bytes = HS_LT_WORKSPACE_DEFAULT;
    return HS_OK;
}

/* Asks cuBLASLt, before any batch, for an algorithm for every FP8 GEMM at
 * the smallest and the largest batch: a GPU or cuBLAS without FP8 block
 * scaling (it takes sm_90 and cuBLAS 12.9+) is refused here, clearly. */
static hs_status_t check_fp8_gemms(hs_model_cuda_t *mc)
{
    if (!mc->n_fp8_gemms) return HS_OK;
    const int H = mc->H;
    for (int l = 0; l < mc->n_up; l++) {
        const dev_layer_t *dl = &mc->layers[l];
        const struct {
            const dev_linear_t *L;
            int64_t ldy;
            bool acc;
        } lin[] = {{&dl->qkv, mc->qkv_dim, false},
                   {&dl->o, H, true},
                   {&dl->gu, 2 * mc->I, false},
                   {&dl->down, H, true},
                   {&dl->mix, mc->mix_ld, false},
                   {&dl->z, mc->vd, false},
                   {&dl->out, H, true}};
        for (size_t i = 0; i < sizeof lin / sizeof lin[0]; i++) {
            const dev_linear_t *L = lin[i].L;
            for (int j = 0; j < L->n_g; j++) {
                const dev_gemm_t *g = &L->g[j];
                if (!g->ws) continue;
                int64_t ldq = (int64_t)hs_align_up((size_t)L->K, 16);
                int Ms[2] = {1, (int)mc->budget};
                for (int k = 0; k < 2; k++) {
                    if (hs_lt_fp8_check(mc->lt, lin[i].ldy, ldq, g->bias != NULL, Ms[k], g->n, L->K,
                                        lin[i].acc) == HS_OK)
                        continue;
                    hs_error("cuda:%d: cuBLASLt has no fp8 block-scaled GEMM for a [%d, %d] weight "
                             "of layer %d at %d tokens (it needs an sm_90 GPU and cuBLAS 12.9 or "
                             "later); run with --dtype bf16 to dequantise the fp8 weights at load",
                             mc->device, g->n, L->K, l, Ms[k]);
                    return HS_ERR_UNSUPPORTED;
                }
            }
        }
    }
    return HS_OK;
}

hs_status_t hs_model_cuda_plan(const hs_model_t *m, uint32_t token_budget, uint32_t max_seqs,
                               int max_layer, hs_model_cuda_plan_t *out)
{
    if (!out) return HS_ERR_INVALID;
    hs_status_t st = check_create(m, token_budget, max_seqs);
    if (st) return st;
    hs_model_cuda_t mc = {0};
    mc.layers = calloc((size_t)m->cfg.num_layers + 1, sizeof(dev_layer_t));
    if (!mc.layers) return HS_ERR_NOMEM;
    st = plan_sizes(&mc, m, 0, token_budget, max_seqs, max_layer);
    free(mc.layers);
    if (st) return st;
    *out = (hs_model_cuda_plan_t){mc.wbytes, mc.abytes, mc.lt_bytes};
    return HS_OK;
}

hs_status_t hs_model_cuda_create_ex(hs_model_t *m, int device, uint32_t token_budget,
                                    uint32_t max_seqs, int max_layer, hs_model_cuda_t **out)
{
    if (!out) return HS_ERR_INVALID;
    hs_status_t st = check_create(m, token_budget, max_seqs);
    if (st) return st;
    const hs_model_config_t *c = &m->cfg;
    st = HS_CUDA_CHECK(cudaSetDevice(device));
    if (st) return st;
    hs_model_cuda_t *mc = calloc(1, sizeof(*mc));
    if (!mc) return HS_ERR_NOMEM;
    mc->layers = calloc((size_t)c->num_layers + 1, sizeof(dev_layer_t));
    if (!mc->layers) {
        st = HS_ERR_NOMEM;
        goto err;
    }
    if ((st = plan_sizes(mc, m, device, token_budget, max_seqs, max_layer))) goto err;
    planner_t pw = {NULL, 0}, pa = {NULL, 0};
    size_t free_b = 0, total_b = 0;
    cudaMemGetInfo(&free_b, &total_b);
    hs_info("cuda:%d forward plan: weights of %d of %d layers %.2f GiB, activations for %u tokens "
            "%.2f GiB, "
            "cublaslt workspace %.0f MiB (device free %.2f of %.2f GiB)",
            device, mc->n_up, mc->N, mc->wbytes / 1073741824.0, token_budget,
            mc->abytes / 1073741824.0, mc->lt_bytes / 1048576.0, free_b / 1073741824.0,
            total_b / 1073741824.0);
    if (mc->wbytes + mc->abytes + mc->lt_bytes > free_b) {
        hs_error("cuda:%d: the forward needs %.2f GiB but %.2f GiB are free; lower --token-budget "
                 "(activations take %.1f KiB per token)",
                 device, (mc->wbytes + mc->abytes + mc->lt_bytes) / 1073741824.0,
                 free_b / 1073741824.0, (double)mc->abytes / token_budget / 1024.0);
        st = HS_ERR_NOSPACE;
        goto err;
    }
    if ((st = HS_CUDA_CHECK(cudaMalloc(&mc->wbase, mc->wbytes)))) goto err;
    if ((st = HS_CUDA_CHECK(cudaMalloc(&mc->abase, mc->abytes)))) goto err;
    pw.base = mc->wbase;
    pw.off = 0;
    if ((st = plan_weights(mc, &pw))) goto err;
    pa.base = mc->abase;
    pa.off = 0;
    plan_activations(mc, &pa);
    if ((st = hs_lt_create(mc->lt_bytes, &mc->lt))) goto err;
    if ((st = check_fp8_gemms(mc))) goto err;
    if (mc->n_fp8_gemms || mc->n_fp8_fallback)
        hs_info("cuda:%d forward: %d GEMMs on fp8 weights (cuBLASLt block-scaled, activations "
                "quantised per token and 128 columns)%s",
                device, mc->n_fp8_gemms,
                mc->n_fp8_fallback ? "; some fp8 weights run as bf16 (see the warning)" : "");
    if (mc->n_fp8_fallback)
        hs_warn("cuda:%d forward: %d fp8 weight parts were dequantised to bf16 at upload: the "
                "CUDA fp8 GEMM needs K a multiple of 128, 16-byte aligned output columns and, for "
                "a gated q_proj, head_dim a multiple of 128; they run as bf16 GEMMs (results as "
                "--dtype bf16 for them)",
                device, mc->n_fp8_fallback);
    hs_kn_attn_desc_t ad = {.max_tokens = (int)token_budget,
                            .max_seqs = (int)max_seqs,
                            .n_heads = mc->nh,
                            .n_kv_heads = mc->nkv,
                            .head_dim = mc->d,
                            .q_stride = mc->qkv_dim,
                            .kv_stride = mc->qkv_dim,
                            .out_stride = mc->q_dim,
                            .scale = 1.0f / sqrtf((float)mc->d),
                            .window = c->sliding_window,
                            .mma_only = m->attn == HS_MODEL_ATTN_MMA};
    if ((st = hs_kn_attn_plan_create(&ad, &mc->attn))) goto err;
    if (strcmp(hs_kn_attn_plan_backend(mc->attn), "mma") == 0 && c->head_dim != 64 &&
        c->head_dim != 80 && c->head_dim != 96 && c->head_dim != 128)
        hs_warn("cuda forward: head_dim %d runs on the slow generic attention kernel (tensor cores "
                "take 64, 80, 96 and 128 without cudnn)",
                c->head_dim);
    if ((st = HS_CUDA_CHECK(cudaDeviceSynchronize()))) goto err;
    *out = mc;
    return HS_OK;
err:
    hs_model_cuda_destroy(mc);
    return st;
}

void hs_model_cuda_destroy(hs_model_cuda_t *mc)
{
    if (!mc) return;
    hs_lt_destroy(mc->lt);
    hs_kn_attn_plan_destroy(mc->attn);
    hs_gpu_energy_close(mc->energy);
    cudaFree(mc->wbase);
    cudaFree(mc->abase);
    free(mc->layers);
    free(mc);
}

hs_status_t hs_model_cuda_peak_bytes(const hs_model_cuda_t *mc, uint64_t *out)
{
    if (!mc || !out) return HS_ERR_INVALID;
    *out = (uint64_t)(mc->wbytes + mc->abytes + mc->lt_bytes);
    return HS_OK;
}

hs_status_t hs_model_cuda_device_count(int *out)
{
    if (!out) return HS_ERR_INVALID;
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        /* no driver or no device: not an error for a caller asking */
        hs_debug("cuda: no device (%s)", cudaGetErrorString(e));
        (void)cudaGetLastError();
        n = 0;
    }
    *out = n;
    return HS_OK;
}

hs_status_t hs_model_cuda_device_info(int device, char *name, size_t name_cap,
                                      uint64_t *total_bytes, uint64_t *free_bytes)
{
    struct cudaDeviceProp prop;
    hs_status_t st = HS_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
    if (st) return st;
    if ((st = HS_CUDA_CHECK(cudaSetDevice(device)))) return st;
    size_t free_b = 0, total_b = 0;
    if ((st = HS_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b)))) return st;
    if (name && name_cap) snprintf(name, name_cap, "%s", prop.name);
    if (total_bytes) *total_bytes = total_b;
    if (free_bytes) *free_bytes = free_b;
    return HS_OK;
}

/* ---- forward ---------------------------------------------------------------- */

/* Copies h into the slices of captured entries equal to idx, except entry
 * `skip` (already written by a fused kernel; -1 = none). */
static hs_status_t capture_copy(hs_model_cuda_t *mc, const void *src, size_t src_stride, int idx,
                                int skip, int T, const int32_t *layers, int n_layers, char *out,
                                size_t row_stride, cudaStream_t s)
{
    for (int j = 0; j < n_layers; j++) {
        if (layers[j] != idx || j == skip) continue;
        hs_status_t st = HS_CUDA_CHECK(
            cudaMemcpy2DAsync(out + (size_t)j * mc->H * 2, row_stride * 2, src, src_stride * 2,
                              (size_t)mc->H * 2, (size_t)T, cudaMemcpyDeviceToDevice, s));
        if (st) return st;
    }
    return HS_OK;
}

static int first_capture(const int32_t *layers, int n_layers, int idx)
{
    for (int j = 0; j < n_layers; j++)
        if (layers[j] == idx) return j;
    return -1;
}

#define TRY(call)                                                                                  \
    do {                                                                                           \
        if ((st = (call)) != HS_OK) return st;                                                     \
    } while (0)

/* Whether every GEMM of L runs on FP8 weights. */
static bool linear_is_fp8(const dev_linear_t *L)
{
    for (int i = 0; i < L->n_g; i++)
        if (!L->g[i].ws) return false;
    return L->n_g > 0;
}

/* Whether some GEMM of L runs on FP8 weights. */
static bool linear_has_fp8(const dev_linear_t *L)
{
    for (int i = 0; i < L->n_g; i++)
        if (L->g[i].ws) return true;
    return false;
}

/* mc->xq's row stride for a Linear of K inputs. */
static int64_t xq_ld(int K) { return (int64_t)hs_align_up((size_t)K, 16); }

/* y[:, 0..N) = x L^T (+ bias) (+ y when acc): each GEMM of L on its
 * columns; an FP8 GEMM reads x quantised per token and 128-group in
 * mc->xq/xs, once for all of L's FP8 GEMMs. xq_holds_x (or NULL): in,
 * whether mc->xq already holds x so quantised (an earlier Linear on the
 * same x, or a fused kernel); out, whether it does now. */
static hs_status_t run_linear(hs_model_cuda_t *mc, const dev_linear_t *L, char *y, int64_t ldy,
                              const void *x, int64_t ldx, int T, bool acc, cudaStream_t s,
                              bool *xq_holds_x)
{
    hs_status_t st;
    const int64_t ldq = xq_ld(L->K);
    bool quantized = xq_holds_x && *xq_holds_x;
    for (int i = 0; i < L->n_g; i++) {
        const dev_gemm_t *g = &L->g[i];
        char *yg = y + (size_t)g->col * 2;
        if (!g->ws) {
            TRY(hs_lt_linear(mc->lt, yg, ldy, x, ldx, g->w, g->bias, T, g->n, L->K, acc, s));
            continue;
        }
        if (!quantized) {
            TRY(hs_kn_fp8_quant_groups(x, ldx, T, L->K, mc->xq, ldq, mc->xs, s));
            quantized = true;
        }
        TRY(hs_lt_linear_fp8(mc->lt, yg, ldy, mc->xq, ldq, mc->xs, g->w, g->ws, g->bias, T, g->n,
                             L->K, acc, s));
    }
    if (xq_holds_x) *xq_holds_x = quantized;
    return HS_OK;
}

/* The model's RMSNorm over token rows: plain, or zero-centred (Qwen3.5). */
static hs_status_t norm_rows(const hs_model_cuda_t *mc, const void *x, int64_t x_stride,
                             const void *w, void *y, int64_t y_stride, int T, void *copy,
                             int64_t copy_stride, cudaStream_t s)
{
    return hs_kn_rmsnorm(x, x_stride, w, y, y_stride, T, mc->H, mc->m->cfg.rms_norm_eps, mc->zc,
                         copy, copy_stride, s);
}

/* xa = the model's RMSNorm of h (weight w, capture copy as norm_rows) for
 * Linear L. Where L has FP8 GEMMs the norm also quantises its rows into
 * mc->xq/xs in the same pass (*xq_holds_xa: whether it did, for run_linear),
 * and skips writing xa when nothing reads it in bf16 (every GEMM of L on
 * FP8, and need_bf16 false). */
static hs_status_t norm_for_linear(hs_model_cuda_t *mc, const void *w, const dev_linear_t *L,
                                   bool need_bf16, int T, void *copy, int64_t copy_stride,
                                   cudaStream_t s, bool *xq_holds_xa)
{
    const int H = mc->H;
    *xq_holds_xa = false;
    if (!linear_has_fp8(L)) return norm_rows(mc, mc->h, H, w, mc->xa, H, T, copy, copy_stride, s);
    hs_status_t st = hs_kn_rmsnorm_fp8(mc->h, H, w, mc->xa, H, need_bf16 || !linear_is_fp8(L), T, H,
                                       mc->m->cfg.rms_norm_eps, mc->zc, copy, copy_stride, mc->xq,
                                       xq_ld(H), mc->xs, s);
    *xq_holds_xa = st == HS_OK;
    return st;
}

/* The q/k norm over n_heads heads at the start of each row, in place. */
static hs_status_t norm_heads(const hs_model_cuda_t *mc, void *x, int64_t stride, int T,
                              int n_heads, const void *w, cudaStream_t s)
{
    return hs_kn_rmsnorm_heads(x, stride, T, n_heads, mc->d, w, mc->m->cfg.rms_norm_eps, mc->zc, s);
}

/* h += attention(xa) of layer w; xq_holds_xa: the input norm quantised xa
 * into mc->xq already. */
static hs_status_t attention_mixer(hs_model_cuda_t *mc, const dev_layer_t *w,
                                   const int32_t *d_cu_seqlens, int n_seqs, int T, bool xq_holds_xa,
                                   cudaStream_t s)
{
    hs_status_t st;
    const int H = mc->H, d = mc->d, ld = mc->qkv_dim, kvd = mc->nkv * d;
    char *qkv = mc->big;
    TRY(run_linear(mc, &w->qkv, qkv, ld, mc->xa, H, T, false, s, &xq_holds_xa));
    if (w->q_norm) {
        TRY(norm_heads(mc, qkv, ld, T, mc->nh, w->q_norm, s));
        TRY(norm_heads(mc, qkv + (size_t)mc->q_dim * 2, ld, T, mc->nkv, w->k_norm, s));
    }
    TRY(hs_kn_rope_partial(qkv, ld, T, mc->nh + mc->nkv, d, mc->rot, mc->pos, mc->inv_freq, s));
    TRY(hs_kn_attn_plan_run(mc->attn, qkv, qkv + (size_t)mc->q_dim * 2,
                            qkv + (size_t)(mc->q_dim + kvd) * 2, mc->xa, s));
    if (mc->gate_off)
        TRY(hs_kn_sigmoid_gate(mc->xa, mc->q_dim, qkv + (size_t)mc->gate_off * 2, ld, T, mc->q_dim,
                               s));
    return run_linear(mc, &w->o, mc->h, H, mc->xa, mc->q_dim, T, true, s, NULL);
}

/* h += gated_deltanet(xa) of layer w. big holds, one after the other, mix
 * [T, mix_ld] (conv channels, b, a), conv [T, conv_ld] and z [T, vd]
 * (z apart, as the gated norm reads it per value head of dv). xq_holds_xa
 * as attention_mixer's. */
static hs_status_t linear_mixer(hs_model_cuda_t *mc, const dev_layer_t *w,
                                const int32_t *d_cu_seqlens, int n_seqs, int T, bool xq_holds_xa,
                                cudaStream_t s)
{
    hs_status_t st;
    const hs_model_config_t *c = &mc->m->cfg;
    const int H = mc->H, C = mc->C, nv = mc->nv, vd = mc->vd, kd = mc->nk * mc->dk;
    /* each region starts ALIGN-aligned, as cuBLASLt's algorithms want */
    char *mix = mc->big;
    char *conv = mix + hs_align_up((size_t)T * mc->mix_ld * 2, ALIGN);
    char *z = conv + hs_align_up((size_t)T * mc->conv_ld * 2, ALIGN);
    bool xa_quantized = xq_holds_xa; /* mix and z read the same rows: quantised once */
    TRY(run_linear(mc, &w->mix, mix, mc->mix_ld, mc->xa, H, T, false, s, &xa_quantized));
    TRY(run_linear(mc, &w->z, z, vd, mc->xa, H, T, false, s, &xa_quantized));
    TRY(hs_kn_causal_conv1d(mix, mc->mix_ld, w->conv, conv, mc->conv_ld, d_cu_seqlens, n_seqs, T, C,
                            mc->K, 1, s));
    TRY(hs_kn_gdn_gates(mix + (size_t)(C + nv) * 2, mc->mix_ld, mix + (size_t)C * 2, mc->mix_ld,
                        w->A_log, w->dt_bias, mc->g, mc->beta, T, nv, s));
    TRY(hs_kn_delta_rule(conv, conv + (size_t)kd * 2, conv + (size_t)2 * kd * 2, mc->conv_ld, mc->g,
                         mc->beta, mc->xa, vd, d_cu_seqlens, n_seqs, T, mc->nk, nv, mc->dk, mc->dv,
                         mc->dr_ws, mc->dr_bytes, s));
    /* an FP8 out projection reads the norm quantised: one pass */
    bool out_quantized = linear_is_fp8(&w->out);
    if (out_quantized)
        TRY(hs_kn_rmsnorm_gated_fp8(mc->xa, z, w->lin_norm, T, nv, mc->dv, c->rms_norm_eps, mc->xq,
                                    xq_ld(vd), mc->xs, s));
    else
        TRY(hs_kn_rmsnorm_gated(mc->xa, mc->dv, z, mc->dv, w->lin_norm, mc->xa, mc->dv, T * nv,
                                mc->dv, c->rms_norm_eps, s));
    return run_linear(mc, &w->out, mc->h, H, mc->xa, vd, T, true, s, &out_quantized);
}

hs_status_t hs_model_cuda_forward(hs_model_cuda_t *mc, const int32_t *d_input_ids,
                                  const int32_t *d_cu_seqlens, int n_seqs, int T, int longest,
                                  const int32_t *layers, int n_layers, void *d_out_bf16,
                                  size_t row_stride_elems, void *stream)
{
    hs_status_t st;
    if (!mc || !d_input_ids || !d_cu_seqlens || !d_out_bf16) {
        hs_error("cuda forward: NULL model, input ids, cu_seqlens or output");
        return HS_ERR_INVALID;
    }
    if (T < 1 || (uint32_t)T > mc->budget || n_seqs < 1 || (uint32_t)n_seqs > mc->max_seqs) {
        hs_error("cuda forward: batch of %d tokens in %d sequences exceeds the plan (%u tokens, "
                 "%u sequences); create the forward with a larger budget",
                 T, n_seqs, mc->budget, mc->max_seqs);
        return HS_ERR_INVALID;
    }
    TRY(hs_model_check_layers(mc->N, layers, n_layers));
    for (int j = 0; j < n_layers; j++)
        if (layers[j] > mc->max_layer) {
            hs_error("cuda forward: layer %d asked for, but this forward was created for layers up "
                     "to %d; create it with a higher max_layer",
                     layers[j], mc->max_layer);
            return HS_ERR_INVALID;
        }
    if (row_stride_elems < (size_t)n_layers * mc->H) {
        hs_error("cuda forward: row stride %zu is smaller than %d layers x H=%d", row_stride_elems,
                 n_layers, mc->H);
        return HS_ERR_INVALID;
    }
    const hs_model_config_t *c = &mc->m->cfg;
    cudaStream_t s = (cudaStream_t)stream;
    char *out = d_out_bf16;
    const int H = mc->H, I = mc->I;
    int top = 0;
    for (int j = 0; j < n_layers; j++)
        if (layers[j] > top) top = layers[j];
    const int run = top < mc->N ? top : mc->N;

    TRY(HS_CUDA_CHECK(cudaSetDevice(mc->device)));
    TRY(hs_kn_embedding(mc->embed, c->vocab_size, H, d_input_ids, T, mc->h, H, s));
    TRY(hs_kn_rope_positions(d_cu_seqlens, n_seqs, mc->pos, s));
    TRY(hs_kn_attn_plan_prepare(mc->attn, d_cu_seqlens, n_seqs, T, longest, s));

    for (int l = 0; l < run; l++) {
        const dev_layer_t *w = &mc->layers[l];
        int cj = first_capture(layers, n_layers, l);
        void *cp = cj >= 0 ? out + (size_t)cj * H * 2 : NULL;
        const bool linear = hs_model_layer_is_linear(c, l);
        bool xq_holds_xa;
        /* a Gated DeltaNet layer's z projection reads xa too (and its mix
         * has bf16 GEMMs, a and b): xa is written for it */
        TRY(norm_for_linear(mc, w->in_norm, linear ? &w->mix : &w->qkv, linear, T, cp,
                            (int64_t)row_stride_elems, s, &xq_holds_xa));
        if (cj >= 0)
            TRY(capture_copy(mc, mc->h, H, l, cj, T, layers, n_layers, out, row_stride_elems, s));
        if (linear)
            TRY(linear_mixer(mc, w, d_cu_seqlens, n_seqs, T, xq_holds_xa, s));
        else
            TRY(attention_mixer(mc, w, d_cu_seqlens, n_seqs, T, xq_holds_xa, s));
        TRY(norm_for_linear(mc, w->post_norm, &w->gu, false, T, NULL, 0, s, &xq_holds_xa));
        TRY(run_linear(mc, &w->gu, mc->big, 2 * I, mc->xa, H, T, false, s, &xq_holds_xa));
        /* an FP8 down projection reads the activation quantised: one pass */
        bool act_quantized = linear_is_fp8(&w->down);
        if (act_quantized)
            TRY(hs_kn_swiglu_fp8_groups(mc->big, 2 * I, T, I, mc->xq, xq_ld(I), mc->xs, s));
        else
            TRY(hs_kn_swiglu(mc->big, 2 * I, mc->big, 2 * I, T, I, s));
        TRY(run_linear(mc, &w->down, mc->h, H, mc->big, 2 * I, T, true, s, &act_quantized));
    }
    if (top < mc->N) {
        /* nothing reads index top (no layer runs after it): copy it */
        TRY(capture_copy(mc, mc->h, H, top, -1, T, layers, n_layers, out, row_stride_elems, s));
    } else {
        int cj = first_capture(layers, n_layers, mc->N);
        char *dst = out + (size_t)cj * H * 2;
        TRY(norm_rows(mc, mc->h, H, mc->final_norm, dst, (int64_t)row_stride_elems, T, NULL, 0, s));
        TRY(capture_copy(mc, dst, row_stride_elems, mc->N, cj, T, layers, n_layers, out,
                         row_stride_elems, s));
    }
    return HS_OK;
}

/* ---- preflight ---------------------------------------------------------------- */

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

hs_status_t hs_model_cuda_preflight(hs_model_cuda_t *mc, int n_seqs, int seq_len,
                                    const int32_t *layers, int n_layers, int iters,
                                    double peak_tflops, hs_model_cuda_preflight_t *out)
{
    hs_status_t st;
    if (!mc || !out || n_seqs < 1 || seq_len < 1) return HS_ERR_INVALID;
    int64_t T64 = (int64_t)n_seqs * seq_len;
    if (T64 > mc->budget || (uint32_t)n_seqs > mc->max_seqs) {
        hs_error("preflight: %d x %d = %lld tokens does not fit the plan (%u tokens, %u sequences)",
                 n_seqs, seq_len, (long long)T64, mc->budget, mc->max_seqs);
        return HS_ERR_INVALID;
    }
    if ((st = hs_model_check_layers(mc->N, layers, n_layers))) return st;
    if (iters < 1) iters = 1;
    if (peak_tflops <= 0) peak_tflops = HS_MODEL_CUDA_PEAK_TFLOPS;
    const int T = (int)T64;
    const size_t row = (size_t)n_layers * mc->H;
    int32_t *ids = malloc((size_t)T * sizeof(int32_t)),
            *cu = malloc(((size_t)n_seqs + 1) * sizeof(int32_t));
    double *times = malloc((size_t)iters * sizeof(double));
    void *d_ids = NULL, *d_cu = NULL, *d_out = NULL;
    cudaEvent_t e0 = NULL, e1 = NULL;
    cudaStream_t s = NULL;
    if (!ids || !cu || !times) {
        st = HS_ERR_NOMEM;
        goto out;
    }
    uint64_t rng = 0x5eed;
    for (int t = 0; t < T; t++)
        ids[t] = (int32_t)(hs_splitmix64(&rng) % (uint64_t)mc->m->cfg.vocab_size);
    for (int i = 0; i <= n_seqs; i++)
        cu[i] = i * seq_len;
    if ((st = HS_CUDA_CHECK(cudaSetDevice(mc->device)))) goto out;
    if ((st = HS_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking)))) goto out;
    if ((st = HS_CUDA_CHECK(cudaEventCreate(&e0)))) goto out;
    if ((st = HS_CUDA_CHECK(cudaEventCreate(&e1)))) goto out;
    if ((st = HS_CUDA_CHECK(cudaMalloc(&d_ids, (size_t)T * sizeof(int32_t))))) goto out;
    if ((st = HS_CUDA_CHECK(cudaMalloc(&d_cu, ((size_t)n_seqs + 1) * sizeof(int32_t))))) goto out;
    if ((st = HS_CUDA_CHECK(cudaMalloc(&d_out, (size_t)T * row * 2)))) goto out;
    if ((st = HS_CUDA_CHECK(cudaMemcpy(d_ids, ids, (size_t)T * 4, cudaMemcpyHostToDevice))))
        goto out;
    if ((st =
             HS_CUDA_CHECK(cudaMemcpy(d_cu, cu, ((size_t)n_seqs + 1) * 4, cudaMemcpyHostToDevice))))
        goto out;
    /* warm-up: picks and caches the GEMM algorithms of this shape */
    if ((st = hs_model_cuda_forward(mc, d_ids, d_cu, n_seqs, T, seq_len, layers, n_layers, d_out,
                                    row, s)))
        goto out;
    if ((st = HS_CUDA_CHECK(cudaStreamSynchronize(s)))) goto out;
    if (!mc->energy_tried) {
        char bus[32];
        mc->energy_tried = true;
        if (cudaDeviceGetPCIBusId(bus, (int)sizeof(bus), mc->device) == cudaSuccess)
            mc->energy = hs_gpu_energy_open(bus);
    }
    hs_gpu_energy_mark_t mark0, mark1;
    bool metered = hs_gpu_energy_mark(mc->energy, &mark0);
    for (int i = 0; i < iters; i++) {
        float ms = 0;
        if ((st = HS_CUDA_CHECK(cudaEventRecord(e0, s)))) goto out;
        if ((st = hs_model_cuda_forward(mc, d_ids, d_cu, n_seqs, T, seq_len, layers, n_layers,
                                        d_out, row, s)))
            goto out;
        if ((st = HS_CUDA_CHECK(cudaEventRecord(e1, s)))) goto out;
        if ((st = HS_CUDA_CHECK(cudaEventSynchronize(e1)))) goto out;
        if ((st = HS_CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1)))) goto out;
        times[i] = ms;
    }
    metered = metered && hs_gpu_energy_mark(mc->energy, &mark1);
    qsort(times, (size_t)iters, sizeof(double), cmp_double);
    size_t free_b = 0, total_b = 0;
    cudaMemGetInfo(&free_b, &total_b);
    int top = 0;
    for (int j = 0; j < n_layers; j++)
        if (layers[j] > top) top = layers[j];
    int run = top < mc->N ? top : mc->N;
    hs_model_cuda_preflight_t r = {0};
    r.n_seqs = n_seqs;
    r.seq_len = seq_len;
    r.peak_bytes = (uint64_t)(mc->wbytes + mc->abytes + mc->lt_bytes) +
                   hs_model_cuda_batch_bytes((uint64_t)T, (uint64_t)n_seqs, (uint64_t)n_layers,
                                             (uint64_t)mc->H);
    r.device_used_bytes = (uint64_t)(total_b - free_b);
    r.ms = times[iters / 2];
    r.us_per_token = r.ms * 1000.0 / T;
    r.tokens_per_s = T / (r.ms / 1000.0);
    r.tflop = hs_model_forward_flops(&mc->m->cfg, run, cu, n_seqs) / 1e12;
    r.mfu = r.tflop / (r.ms / 1000.0) / peak_tflops;
    double busy_ms = 0;
    for (int i = 0; i < iters; i++)
        busy_ms += times[i];
    if (metered && busy_ms >= HS_GPU_ENERGY_MIN_BUSY_S * 1e3) {
        hs_gpu_energy_span_t e = hs_gpu_energy_span(mc->energy, mark0, mark1);
        r.metered = e.joules > 0;
        r.joules_per_token = e.joules / ((double)iters * T);
        r.watts = e.watts;
        r.limit_watts = e.limit_watts;
        r.power_capped_share = e.capped_share;
    }
    *out = r;
    st = HS_OK;
out:
    if (e0) cudaEventDestroy(e0);
    if (e1) cudaEventDestroy(e1);
    if (s) cudaStreamDestroy(s);
    cudaFree(d_ids);
    cudaFree(d_cu);
    cudaFree(d_out);
    free(ids);
    free(cu);
    free(times);
    return st;
}
