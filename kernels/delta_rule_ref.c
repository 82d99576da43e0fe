/* SPDX-License-Identifier: Apache-2.0 */
/* delta_rule_ref.c - C twin of the gated delta rule (see delta_rule.h): the
 * token-by-token recurrence on an fp32 state [dk, dv] per (sequence, value
 * head), reset at every sequence start. q and k are L2-normalised per head
 * on the fly (q also scaled by 1/sqrt(dk)), in the operation order of
 * transformers' reference. */
#include "delta_rule.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* x / sqrt(sum(x^2) + 1e-6) * scale into y[d]. */
static void l2norm(const float *x, float *y, int d, float scale)
{
    float ss = 0.0f;
    for (int i = 0; i < d; i++)
        ss += x[i] * x[i];
    float inv = 1.0f / sqrtf(ss + 1e-6f);
    for (int i = 0; i < d; i++)
        y[i] = x[i] * inv * scale;
}

static void one_head(const float *q, const float *k, const float *v, size_t stride, const float *g,
                     const float *beta, float *out, int start, int end, int hk, int h, int nv,
                     int dk, int dv, float *S, float *qn, float *kn, float *u)
{
    const float scale = 1.0f / sqrtf((float)dk);
    memset(S, 0, (size_t)dk * (size_t)dv * sizeof *S);
    for (int t = start; t < end; t++) {
        l2norm(q + (size_t)t * stride + (size_t)hk * dk, qn, dk, scale);
        l2norm(k + (size_t)t * stride + (size_t)hk * dk, kn, dk, 1.0f);
        const float *vt = v + (size_t)t * stride + (size_t)h * dv;
        float decay = expf(g[(size_t)t * nv + h]), b = beta[(size_t)t * nv + h];
        for (int j = 0; j < dv; j++)
            u[j] = 0.0f;
        for (int i = 0; i < dk; i++) {
            float *Si = S + (size_t)i * dv;
            for (int j = 0; j < dv; j++) {
                Si[j] *= decay;
                u[j] += Si[j] * kn[i];
            }
        }
        for (int j = 0; j < dv; j++)
            u[j] = (vt[j] - u[j]) * b;
        float *o = out + (size_t)t * (size_t)nv * dv + (size_t)h * dv;
        for (int j = 0; j < dv; j++)
            o[j] = 0.0f;
        for (int i = 0; i < dk; i++) {
            float *Si = S + (size_t)i * dv;
            for (int j = 0; j < dv; j++) {
                Si[j] += kn[i] * u[j];
                o[j] += Si[j] * qn[i];
            }
        }
    }
}

hs_status_t hs_kn_delta_rule_ref(const float *q, const float *k, const float *v, size_t stride,
                                 const float *g, const float *beta, float *out,
                                 const int32_t *cu_seqlens, int n_seqs, int n_k_heads,
                                 int n_v_heads, int dk, int dv)
{
    int ratio = n_v_heads / n_k_heads, failed = 0;
    size_t work = (size_t)cu_seqlens[n_seqs] * (size_t)n_v_heads * (size_t)dk * (size_t)dv;
#pragma omp parallel if (work > (1u << 18))
    {
        size_t n = (size_t)dk * dv + 2 * (size_t)dk + (size_t)dv;
        float *S = malloc(n * sizeof *S);
        if (!S) {
#pragma omp atomic write
            failed = 1;
        }
#pragma omp for schedule(dynamic, 1) collapse(2)
        for (int s = 0; s < n_seqs; s++) {
            for (int h = 0; h < n_v_heads; h++) {
                if (!S) continue;
                float *qn = S + (size_t)dk * dv, *kn = qn + dk, *u = kn + dk;
                one_head(q, k, v, stride, g, beta, out, cu_seqlens[s], cu_seqlens[s + 1], h / ratio,
                         h, n_v_heads, dk, dv, S, qn, kn, u);
            }
        }
        free(S);
    }
    return failed ? HS_ERR_NOMEM : HS_OK;
}
