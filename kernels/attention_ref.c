/* SPDX-License-Identifier: Apache-2.0 */
/* attention_ref.c - C twin of varlen causal GQA attention (see attention.h).
 * One query row at a time, online softmax in fp32: running max m, running
 * sum l and accumulator acc[d] rescaled by exp(m_old - m_new) when the max
 * grows. Memory is O(d) per query, whatever the sequence length. Work is
 * shared over OpenMP threads by (sequence, token). */
#include "attention.h"

#include <math.h>

/* The sequence holding token i: the last s with cu_seqlens[s] <= i (empty
 * sequences are skipped because their successor starts at the same token). */
static int seq_of(const int32_t *cu_seqlens, int n_seqs, int i)
{
    int lo = 0, hi = n_seqs - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (cu_seqlens[mid] <= i)
            lo = mid;
        else
            hi = mid - 1;
    }
    return lo;
}

void hs_kn_attention_ref(const float *q, const float *k, const float *v, float *out,
                         const int32_t *cu_seqlens, int n_seqs, int n_heads, int n_kv_heads,
                         int head_dim, float scale, int window)
{
    int group = n_heads / n_kv_heads;
    size_t qrow = (size_t)n_heads * (size_t)head_dim;
    size_t kvrow = (size_t)n_kv_heads * (size_t)head_dim;
    int T = cu_seqlens[n_seqs];
#pragma omp parallel for schedule(dynamic, 4)
    for (int i = 0; i < T; i++) {
        int s = seq_of(cu_seqlens, n_seqs, i);
        int start = cu_seqlens[s];
        int j0 = start;
        if (window > 0 && i - window + 1 > j0) j0 = i - window + 1;
        for (int h = 0; h < n_heads; h++) {
            const float *qh = q + (size_t)i * qrow + (size_t)h * head_dim;
            int g = h / group;
            float acc[HS_KN_ATTN_MAX_HEAD_DIM];
            for (int d = 0; d < head_dim; d++)
                acc[d] = 0.0f;
            float m = -INFINITY, l = 0.0f;
            for (int j = j0; j <= i; j++) {
                const float *kj = k + (size_t)j * kvrow + (size_t)g * head_dim;
                const float *vj = v + (size_t)j * kvrow + (size_t)g * head_dim;
                float sc = 0.0f;
                for (int d = 0; d < head_dim; d++)
                    sc += qh[d] * kj[d];
                sc *= scale;
                if (sc > m) {
                    float r = expf(m - sc); /* 0 on the first key */
                    l *= r;
                    for (int d = 0; d < head_dim; d++)
                        acc[d] *= r;
                    m = sc;
                }
                float p = expf(sc - m);
                l += p;
                for (int d = 0; d < head_dim; d++)
                    acc[d] += p * vj[d];
            }
            float *oh = out + (size_t)i * qrow + (size_t)h * head_dim;
            for (int d = 0; d < head_dim; d++)
                oh[d] = acc[d] / l;
        }
    }
}
