/* SPDX-License-Identifier: Apache-2.0 */
/* attention.cu - causal attention over packed variable-length sequences on
 * CUDA tensor cores (flash-attention-2 style), grouped-query heads.
 *
 * For sequence s (rows cu_seqlens[s]..cu_seqlens[s+1]), query head h and kv
 * head h / (Hq / Hkv):  out[i] = sum_j softmax_j(scale * q_i . k_j) v_j over
 * keys j <= i of the same sequence (and i - j < window when window > 0).
 * q, k, v are [T, heads * d] row slices (row strides q_stride, kv_stride),
 * so the fused qkv GEMM output is read in place; out is [T, Hq * d].
 *
 * One block of 4 warps takes 64 query rows of one (sequence, head); each
 * warp owns 16 rows, its Q fragments held in registers for the whole pass. Key/value tiles of 64
 * rows stream through shared memory with cp.async, double-buffered; Q passes through the second V
 * buffer, so a block needs 4 tiles of shared memory (70 KB at d = 128). S = Q K^T and O += P V run
 * on mma.sync m16n8k16 (bf16 in, fp32 accumulate); the softmax is online (running max and sum per
 * row, in the exp2 domain), so memory is linear in sequence length and nothing of size L^2 exists
 * (exp2 on the fast ex2.approx unit). P is rounded to bf16 for the second product, as in flash
 * attention. Shared rows are padded by 16 bytes so the ldmatrix reads are free of bank conflicts.
 * Blocks of the longest (most expensive) query tiles of each sequence are launched first.
 * hs_kn_attention_schedule() computes the per-sequence tile prefix sums once
 * per batch on the device, so the host needs no copy of cu_seqlens. */
#include <cuda_bf16.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attention.h"
#include "cublaslt.h"
#include "mma_bf16.cuh"
#include "hs_log.h"
#include "hs_time.h"
#ifdef HS_HAVE_CUDNN
#include "attention_int.h"
#endif

typedef __nv_bfloat16 bf16;

namespace
{

constexpr int kBM = 64, kBN = 64, kThreads = 128;

__device__ __forceinline__ float fast_exp2(float x)
{
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

/* 2 blocks per multiprocessor (about 170 registers a thread at D = 128).
 * Capping registers for 3 blocks spills at D = 128 and measured 4-6% slower
 * on an H200. */
template <int D>
__global__ void __launch_bounds__(kThreads, 2)
    attn_kernel(const bf16 *__restrict__ q, const bf16 *__restrict__ k, const bf16 *__restrict__ v,
                int64_t q_stride, int64_t kv_stride, bf16 *__restrict__ out, int64_t out_stride,
                const int32_t *__restrict__ cu, const int32_t *__restrict__ tile_prefix, int n_seqs,
                int group, float scale_log2, int window)
{
    constexpr int LDS = D + 8;  /* padded shared row, elements */
    constexpr int CPR = D / 8;  /* 16-byte chunks per row */
    constexpr int NT = kBN / 8; /* n-tiles of S */
    constexpr int DT = D / 8;   /* n-tiles of O */
    constexpr int KC = D / 16;  /* k-chunks of Q K^T */
    extern __shared__ __align__(16) unsigned char smem_raw[];
    bf16 *sK = (bf16 *)smem_raw;   /* [2][kBN][LDS] */
    bf16 *sV = sK + 2 * kBN * LDS; /* [2][kBN][LDS] */
    bf16 *sQ = sV + kBN * LDS;     /* Q borrows V's second buffer until it is in registers */

    /* block -> (sequence, query tile): binary search in the tile prefix sums;
     * within a sequence the last (longest) tiles come first */
    const int b = blockIdx.x, head = blockIdx.y;
    if (b >= tile_prefix[n_seqs]) return;
    int lo = 0, hi = n_seqs - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) >> 1;
        if (tile_prefix[mid] <= b)
            lo = mid;
        else
            hi = mid - 1;
    }
    const int seq = lo;
    const int start = cu[seq], len = cu[seq + 1] - start;
    const int q0 = (tile_prefix[seq + 1] - 1 - b) * kBM;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int kvh = head / group;
    const bf16 *qb = q + (int64_t)start * q_stride + (int64_t)head * D;
    const bf16 *kb = k + (int64_t)start * kv_stride + (int64_t)kvh * D;
    const bf16 *vb = v + (int64_t)start * kv_stride + (int64_t)kvh * D;

    const int kv_end = min(len, q0 + kBM);
    const int kv_begin = window > 0 ? max(0, q0 - window + 1) : 0;
    const int jt0 = kv_begin / kBN, jt1 = (kv_end + kBN - 1) / kBN;

    for (int c = tid; c < kBM * CPR; c += kThreads) {
        int r = c / CPR, cc = c % CPR, row = q0 + r;
        bool ok = row < len;
        cp_async16(sQ + r * LDS + cc * 8, qb + (int64_t)(ok ? row : 0) * q_stride + cc * 8, ok);
    }
    auto load_kv = [&](int jt, int buf) {
        for (int c = tid; c < kBN * CPR; c += kThreads) {
            int r = c / CPR, cc = c % CPR, row = jt * kBN + r;
            bool ok = row < kv_end;
            int64_t off = (int64_t)(ok ? row : 0) * kv_stride + cc * 8;
            cp_async16(sK + (buf * kBN + r) * LDS + cc * 8, kb + off, ok);
            cp_async16(sV + (buf * kBN + r) * LDS + cc * 8, vb + off, ok);
        }
    };
    load_kv(jt0, 0);
    cp_async_commit();
    cp_async_wait<0>();
    __syncthreads();

    uint32_t qf[KC][4];
    float o[DT][4];
#pragma unroll
    for (int i = 0; i < DT; i++)
        o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
    const int row_lo = q0 + warp * 16;    /* first query row of this warp */
    const int qr0 = row_lo + (lane >> 2); /* rows held by this thread: qr0, qr0 + 8 */

#pragma unroll
    for (int kc = 0; kc < KC; kc++)
        ldsm_x4(qf[kc][0], qf[kc][1], qf[kc][2], qf[kc][3],
                sQ + (warp * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * LDS + kc * 16 +
                    (lane >> 4) * 8);
    __syncthreads(); /* Q's shared buffer is V's again from here */

    for (int jt = jt0; jt < jt1; jt++) {
        const int buf = (jt - jt0) & 1;
        if (jt + 1 < jt1) {
            load_kv(jt + 1, buf ^ 1);
            cp_async_commit();
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();
        const bf16 *kt = sK + buf * kBN * LDS;
        const bf16 *vt = sV + buf * kBN * LDS;
        const int key0 = jt * kBN;
        if (key0 > row_lo + 15) { /* every key is past this warp's rows */
            __syncthreads();
            continue;
        }

        float s[NT][4];
#pragma unroll
        for (int i = 0; i < NT; i++)
            s[i][0] = s[i][1] = s[i][2] = s[i][3] = 0.f;
#pragma unroll
        for (int kc = 0; kc < KC; kc++) {
#pragma unroll
            for (int np = 0; np < NT / 2; np++) {
                uint32_t b0, b1, b2, b3;
                ldsm_x4(b0, b1, b2, b3,
                        kt + (np * 16 + (lane & 7) + (lane >> 4) * 8) * LDS + kc * 16 +
                            ((lane >> 3) & 1) * 8);
                mma_bf16(s[2 * np], qf[kc], b0, b1);
                mma_bf16(s[2 * np + 1], qf[kc], b2, b3);
            }
        }
        /* mask: keys past the diagonal, past the sequence, or out of the window */
        bool need_mask = key0 + kBN - 1 > row_lo || key0 + kBN > len ||
                         (window > 0 && row_lo + 15 - key0 >= window);
        if (need_mask) {
#pragma unroll
            for (int nt = 0; nt < NT; nt++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    int key = key0 + nt * 8 + 2 * (lane & 3) + (e & 1);
                    int qr = qr0 + (e >> 1) * 8;
                    if (key > qr || key >= len || (window > 0 && qr - key >= window))
                        s[nt][e] = -INFINITY;
                }
        }
        /* online softmax, rows qr0 (r = 0) and qr0 + 8 (r = 1) */
#pragma unroll
        for (int r = 0; r < 2; r++) {
            float mx = -INFINITY;
#pragma unroll
            for (int nt = 0; nt < NT; nt++)
                mx = fmaxf(mx, fmaxf(s[nt][2 * r], s[nt][2 * r + 1]));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
            float m_new = fmaxf(m[r], mx * scale_log2);
            float m_use = m_new == -INFINITY ? 0.f : m_new;
            float alpha = fast_exp2(m[r] - m_use);
            m[r] = m_new;
            float sum = 0.f;
#pragma unroll
            for (int nt = 0; nt < NT; nt++) {
                float p0 = fast_exp2(s[nt][2 * r] * scale_log2 - m_use);
                float p1 = fast_exp2(s[nt][2 * r + 1] * scale_log2 - m_use);
                s[nt][2 * r] = p0;
                s[nt][2 * r + 1] = p1;
                sum += p0 + p1;
            }
            l[r] = l[r] * alpha + sum;
#pragma unroll
            for (int dt = 0; dt < DT; dt++) {
                o[dt][2 * r] *= alpha;
                o[dt][2 * r + 1] *= alpha;
            }
        }
        /* O += P V: the S accumulators are already laid out as A fragments */
#pragma unroll
        for (int kc = 0; kc < kBN / 16; kc++) {
            uint32_t a[4] = {pack_bf16(s[2 * kc][0], s[2 * kc][1]),
                             pack_bf16(s[2 * kc][2], s[2 * kc][3]),
                             pack_bf16(s[2 * kc + 1][0], s[2 * kc + 1][1]),
                             pack_bf16(s[2 * kc + 1][2], s[2 * kc + 1][3])};
#pragma unroll
            for (int dp = 0; dp < DT / 2; dp++) {
                uint32_t b0, b1, b2, b3;
                ldsm_x4_t(b0, b1, b2, b3,
                          vt + (kc * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * LDS + dp * 16 +
                              (lane >> 4) * 8);
                mma_bf16(o[2 * dp], a, b0, b1);
                mma_bf16(o[2 * dp + 1], a, b2, b3);
            }
        }
        __syncthreads(); /* this buffer is refilled two tiles from now */
    }

#pragma unroll
    for (int r = 0; r < 2; r++) {
        float sum = l[r];
        sum += __shfl_xor_sync(0xffffffffu, sum, 1);
        sum += __shfl_xor_sync(0xffffffffu, sum, 2);
        float inv = sum > 0.f ? 1.f / sum : 0.f;
        int row = qr0 + r * 8;
        if (row < len) {
            bf16 *orow = out + (int64_t)(start + row) * out_stride + (int64_t)head * D;
#pragma unroll
            for (int dt = 0; dt < DT; dt++)
                *(__nv_bfloat162 *)(orow + dt * 8 + 2 * (lane & 3)) =
                    __floats2bfloat162_rn(o[dt][2 * r] * inv, o[dt][2 * r + 1] * inv);
        }
    }
}

/* tile_prefix[s] = sum over sequences before s of ceil(len / kBM), for
 * s = 0..n_seqs. One block: each thread sums a run of sequences, then a
 * warp-level scan over the per-thread totals. */
__global__ void attn_schedule_kernel(const int32_t *cu, int n_seqs, int32_t *tile_prefix)
{
    __shared__ int32_t part[1024];
    const int tid = threadIdx.x, nt = blockDim.x;
    const int per = (n_seqs + nt - 1) / nt;
    const int s0 = min(n_seqs, tid * per), s1 = min(n_seqs, s0 + per);
    int32_t sum = 0;
    for (int s = s0; s < s1; s++)
        sum += (cu[s + 1] - cu[s] + kBM - 1) / kBM;
    part[tid] = sum;
    __syncthreads();
    if (tid == 0) {
        int32_t acc = 0;
        for (int i = 0; i < nt; i++) {
            int32_t v = part[i];
            part[i] = acc;
            acc += v;
        }
    }
    __syncthreads();
    int32_t acc = part[tid];
    for (int s = s0; s < s1; s++) {
        tile_prefix[s] = acc;
        acc += (cu[s + 1] - cu[s] + kBM - 1) / kBM;
    }
    if (tid == nt - 1) tile_prefix[n_seqs] = acc;
}

/* Generic fallback for head sizes the tensor-core kernel does not take (or
 * unaligned rows): one warp per (query token, head), each lane holding up
 * to 8 of the head's dims, online softmax over the keys one at a time.
 * Slow, but exact in fp32 apart from the bf16 output; it serves the tiny
 * test models and odd configurations. */
__global__ void attn_generic_kernel(const bf16 *__restrict__ q, const bf16 *__restrict__ k,
                                    const bf16 *__restrict__ v, int64_t q_stride, int64_t kv_stride,
                                    bf16 *__restrict__ out, int64_t out_stride,
                                    const int32_t *__restrict__ cu, int n_seqs, int D, int group,
                                    float scale, int window)
{
    const int t = blockIdx.x, head = blockIdx.y, lane = threadIdx.x;
    int lo = 0, hi = n_seqs - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) >> 1;
        if (cu[mid] <= t)
            lo = mid;
        else
            hi = mid - 1;
    }
    const int start = cu[lo];
    const int j_end = t; /* inclusive, absolute rows */
    const int j_begin = window > 0 ? max(start, t - window + 1) : start;
    const int kvh = head / group;
    float qv[8], acc[8];
#pragma unroll
    for (int e = 0; e < 8; e++) {
        int dd = lane + 32 * e;
        qv[e] = dd < D ? __bfloat162float(q[(int64_t)t * q_stride + (int64_t)head * D + dd]) * scale
                       : 0.f;
        acc[e] = 0.f;
    }
    float m = -INFINITY, l = 0.f;
    for (int j = j_begin; j <= j_end; j++) {
        const bf16 *kr = k + (int64_t)j * kv_stride + (int64_t)kvh * D;
        float dot = 0.f;
#pragma unroll
        for (int e = 0; e < 8; e++) {
            int dd = lane + 32 * e;
            if (dd < D) dot += qv[e] * __bfloat162float(kr[dd]);
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1)
            dot += __shfl_xor_sync(0xffffffffu, dot, o);
        float m_new = fmaxf(m, dot);
        float alpha = __expf(m - m_new), p = __expf(dot - m_new);
        l = l * alpha + p;
        const bf16 *vr = v + (int64_t)j * kv_stride + (int64_t)kvh * D;
#pragma unroll
        for (int e = 0; e < 8; e++) {
            int dd = lane + 32 * e;
            acc[e] = acc[e] * alpha + (dd < D ? p * __bfloat162float(vr[dd]) : 0.f);
        }
        m = m_new;
    }
    float inv = l > 0.f ? 1.f / l : 0.f;
#pragma unroll
    for (int e = 0; e < 8; e++) {
        int dd = lane + 32 * e;
        if (dd < D)
            out[(int64_t)t * out_stride + (int64_t)head * D + dd] = __float2bfloat16(acc[e] * inv);
    }
}

template <int D>
hs_status_t attn_launch(const void *q, const void *k, const void *v, int64_t q_stride,
                        int64_t kv_stride, void *out, int64_t out_stride, const int32_t *cu_seqlens,
                        const int32_t *tile_prefix, int n_seqs, int T, int n_heads, int group,
                        float scale, int window, cudaStream_t stream)
{
    const size_t smem = (size_t)4 * kBN * (D + 8) * sizeof(bf16);
    hs_status_t st = HS_CUDA_CHECK(cudaFuncSetAttribute(
        attn_kernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    if (st) return st;
    /* an upper bound on the tiles: sum ceil(len / kBM) <= T / kBM + n_seqs */
    dim3 grid((unsigned)((T + kBM - 1) / kBM + n_seqs), n_heads);
    attn_kernel<D><<<grid, kThreads, smem, stream>>>(
        (const bf16 *)q, (const bf16 *)k, (const bf16 *)v, q_stride, kv_stride, (bf16 *)out,
        out_stride, cu_seqlens, tile_prefix, n_seqs, group, scale * 1.4426950408889634f, window);
    return HS_CUDA_LAUNCH_CHECK("attention kernel");
}

} // namespace

extern "C" hs_status_t hs_kn_attention_schedule(const int32_t *cu_seqlens, int n_seqs,
                                                int32_t *tile_prefix, cudaStream_t stream)
{
    if (n_seqs <= 0) return HS_OK;
    attn_schedule_kernel<<<1, 1024, 0, stream>>>(cu_seqlens, n_seqs, tile_prefix);
    return HS_CUDA_LAUNCH_CHECK("attention schedule kernel");
}

extern "C" hs_status_t hs_kn_attention(const void *q, int64_t q_stride, const void *k,
                                       const void *v, int64_t kv_stride, void *out,
                                       int64_t out_stride, const int32_t *cu_seqlens,
                                       const int32_t *tile_prefix, int n_seqs, int T, int n_heads,
                                       int n_kv_heads, int head_dim, float scale, int window,
                                       cudaStream_t stream)
{
    if (n_seqs <= 0 || T <= 0) return HS_OK;
    if (n_kv_heads <= 0 || n_heads % n_kv_heads) {
        hs_error("attention: %d query heads is not a multiple of %d kv heads", n_heads, n_kv_heads);
        return HS_ERR_INVALID;
    }
    if (n_heads > 65535) {
        hs_error("attention: %d heads exceeds one launch (65535)", n_heads);
        return HS_ERR_INVALID;
    }
    int group = n_heads / n_kv_heads;
    bool aligned = q_stride % 8 == 0 && kv_stride % 8 == 0 &&
                   ((uintptr_t)q | (uintptr_t)k | (uintptr_t)v) % 16 == 0;
    bool tc = head_dim == 64 || head_dim == 80 || head_dim == 96 || head_dim == 128;
    if (!aligned || !tc) {
        if (head_dim > 256 || head_dim < 1) {
            hs_error("attention: head_dim %d is not supported on CUDA (at most 256)", head_dim);
            return HS_ERR_UNSUPPORTED;
        }
        attn_generic_kernel<<<dim3((unsigned)T, n_heads), 32, 0, stream>>>(
            (const bf16 *)q, (const bf16 *)k, (const bf16 *)v, q_stride, kv_stride, (bf16 *)out,
            out_stride, cu_seqlens, n_seqs, head_dim, group, scale, window);
        return HS_CUDA_LAUNCH_CHECK("attention generic kernel");
    }
#define HS_ATTN_CASE(d)                                                                            \
    case d:                                                                                        \
        return attn_launch<d>(q, k, v, q_stride, kv_stride, out, out_stride, cu_seqlens,           \
                              tile_prefix, n_seqs, T, n_heads, group, scale, window, stream)
    switch (head_dim) {
        HS_ATTN_CASE(64);
        HS_ATTN_CASE(80);
        HS_ATTN_CASE(96);
        HS_ATTN_CASE(128);
    default:
        return HS_ERR_UNSUPPORTED; /* not reached: tc covers these */
    }
#undef HS_ATTN_CASE
}

/* ---- the plan ------------------------------------------------------------ */

#define HS_ATTN_MAX_BUCKETS 96

struct hs_kn_attn_plan {
    hs_kn_attn_desc_t desc;
    int32_t *tiles; /* [max_seqs + 1] tile prefix of the mma.sync kernel */
    /* cuDNN path: seq_len [nb_max], ragged offsets of q, k|v, out [nb_max + 1]
     * each, then the longest sequence; one device allocation */
    int32_t *meta, *seq_len, *rag_q, *rag_kv, *rag_o, *longest;
    int32_t *h_longest; /* pinned */
    int nb_max;         /* largest B of the buckets built */
    int n_buckets, S[HS_ATTN_MAX_BUCKETS], B[HS_ATTN_MAX_BUCKETS], ok[HS_ATTN_MAX_BUCKETS];
#ifdef HS_HAVE_CUDNN
    hs__attn_dnn_t *dnn;
#endif
    /* the prepared batch */
    const int32_t *cu;
    int n_seqs, T, bucket; /* bucket -1: the mma.sync kernel */
};

namespace
{

/* Per-sequence lengths and ragged offsets for nb entries (past n_seqs:
 * length 0 at offset T), and the longest length. `claimed` > 0: the longest
 * the host picked the bucket for; a longer sequence traps (see prepare).
 * One block. */
__global__ void attn_meta_kernel(const int32_t *__restrict__ cu, int n_seqs, int nb,
                                 int64_t q_stride, int64_t kv_stride, int64_t out_stride,
                                 int32_t *seq_len, int32_t *rag_q, int32_t *rag_kv, int32_t *rag_o,
                                 int32_t *longest, int claimed)
{
    __shared__ int32_t warp_max[32];
    const int T = cu[n_seqs];
    int32_t mx = 0;
    for (int b = threadIdx.x; b <= nb; b += blockDim.x) {
        int start = b <= n_seqs ? cu[b] : T;
        if (b < nb) {
            int len = b < n_seqs ? cu[b + 1] - start : 0;
            seq_len[b] = len;
            mx = max(mx, len);
        }
        rag_q[b] = (int32_t)(start * q_stride);
        rag_kv[b] = (int32_t)(start * kv_stride);
        rag_o[b] = (int32_t)(start * out_stride);
    }
    for (int o = 16; o > 0; o >>= 1)
        mx = max(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    if ((threadIdx.x & 31) == 0) warp_max[threadIdx.x >> 5] = mx;
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < (int)(blockDim.x >> 5); w++)
            mx = max(mx, warp_max[w]);
        *longest = mx;
        if (claimed > 0 && mx > claimed) {
            printf("hsflow attention: a sequence of %d tokens in a batch prepared for sequences "
                   "up to %d; refusing to compute it\n",
                   mx, claimed);
            __trap();
        }
    }
}

} // namespace

/* The buckets of attention.h: S doubles from 128 until it holds max_tokens;
 * per S, B = 1, 2, 4 and 8 times ceil(max_tokens / S) (a full batch of
 * sequences S long), at most max_seqs; the smallest S also takes max_seqs.
 * The grid of a bucket is B x S / 128 tiles per head, at most 8 times what
 * max_tokens fill: a batch with one long sequence and many short ones
 * still has a bucket, its tiles past each sequence's end return at once. */
static void plan_buckets(hs_kn_attn_plan_t *p)
{
    const hs_kn_attn_desc_t *d = &p->desc;
    p->n_buckets = 0;
    for (int64_t S = 128; p->n_buckets + 5 <= HS_ATTN_MAX_BUCKETS; S *= 2) {
        int64_t full = (d->max_tokens + S - 1) / S;
        int64_t Bs[5] = {full, 2 * full, 4 * full, 8 * full, S == 128 ? d->max_seqs : 0};
        int64_t last = 0;
        for (int j = 0; j < 5; j++) {
            int64_t B = Bs[j] > d->max_seqs ? d->max_seqs : Bs[j];
            if (B <= last) continue;
            p->S[p->n_buckets] = (int)S;
            p->B[p->n_buckets] = (int)B;
            p->n_buckets++;
            last = B;
        }
        if (S >= d->max_tokens) break;
    }
}

#ifdef HS_HAVE_CUDNN
/* Builds the cuDNN buckets where this device, build and shape allow. */
static void plan_cudnn(hs_kn_attn_plan_t *p)
{
    const hs_kn_attn_desc_t *d = &p->desc;
    if (d->mma_only) {
        hs_info("attention: the mma.sync kernel runs, as asked (mma only)");
        return;
    }
    int dev = 0, major = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess) {
        (void)cudaGetLastError();
        return;
    }
    if (major != 9) {
        hs_debug("attention: sm_%d0 device: the mma.sync kernel runs (cudnn is used on sm_90)",
                 major);
        return;
    }
    int64_t widest = d->q_stride > d->kv_stride ? d->q_stride : d->kv_stride;
    if (d->out_stride > widest) widest = d->out_stride;
    if (d->head_dim % 8 || d->head_dim > 256 || (int64_t)(d->max_tokens + 1) * widest > INT32_MAX ||
        d->q_stride % 8 || d->kv_stride % 8 || d->out_stride % 8) {
        hs_info("attention: head_dim %d, row strides %lld/%lld/%lld for %d tokens: outside what "
                "the cudnn path takes (head_dim a multiple of 8 up to 256, strides multiples of 8, "
                "offsets below 2^31); the mma.sync kernel runs",
                d->head_dim, (long long)d->q_stride, (long long)d->kv_stride,
                (long long)d->out_stride, d->max_tokens);
        return;
    }
    hs__attn_dnn_shape_t sh = {d->n_heads,   d->n_kv_heads, d->head_dim, d->q_stride,
                               d->kv_stride, d->out_stride, d->scale,    d->window};
    double t0 = hs_now_s();
    if (hs__attn_dnn_create(&sh, p->S, p->B, p->n_buckets, p->ok, &p->dnn) != HS_OK) {
        p->dnn = NULL;
        return;
    }
    int built = 0;
    for (int i = 0; i < p->n_buckets; i++)
        if (p->ok[i]) {
            built++;
            if (p->B[i] > p->nb_max) p->nb_max = p->B[i];
        }
    hs_info("attention: cudnn %ld sdpa, %d of %d buckets (sequences up to %d tokens, up to %d "
            "sequences) built in %.2f s",
            hs__attn_dnn_version(p->dnn), built, p->n_buckets, p->S[p->n_buckets - 1], p->nb_max,
            hs_now_s() - t0);
}
#endif

extern "C" hs_status_t hs_kn_attn_plan_create(const hs_kn_attn_desc_t *desc,
                                              hs_kn_attn_plan_t **out)
{
    if (!desc || !out || desc->max_tokens < 1 || desc->max_seqs < 1 || desc->n_heads < 1 ||
        desc->n_kv_heads < 1 || desc->n_heads % desc->n_kv_heads || desc->head_dim < 1 ||
        desc->head_dim > 256) {
        hs_error("attention plan: need max_tokens, max_seqs >= 1, query heads a multiple of kv "
                 "heads and head_dim 1..256");
        return HS_ERR_INVALID;
    }
    hs_kn_attn_plan_t *p = (hs_kn_attn_plan_t *)calloc(1, sizeof(*p));
    if (!p) return HS_ERR_NOMEM;
    p->desc = *desc;
    p->bucket = -1;
    hs_status_t st =
        HS_CUDA_CHECK(cudaMalloc(&p->tiles, ((size_t)desc->max_seqs + 1) * sizeof(int32_t)));
    if (st) goto err;
    plan_buckets(p);
#ifdef HS_HAVE_CUDNN
    plan_cudnn(p);
    if (p->dnn) {
        size_t nb = (size_t)p->nb_max;
        if ((st = HS_CUDA_CHECK(cudaMalloc(&p->meta, (4 * nb + 4) * sizeof(int32_t))))) goto err;
        p->seq_len = p->meta;
        p->rag_q = p->seq_len + nb;
        p->rag_kv = p->rag_q + nb + 1;
        p->rag_o = p->rag_kv + nb + 1;
        p->longest = p->rag_o + nb + 1;
        if ((st = HS_CUDA_CHECK(cudaMallocHost(&p->h_longest, sizeof(int32_t))))) goto err;
    }
#endif
    *out = p;
    return HS_OK;
err:
    hs_kn_attn_plan_destroy(p);
    return st;
}

extern "C" void hs_kn_attn_plan_destroy(hs_kn_attn_plan_t *plan)
{
    if (!plan) return;
#ifdef HS_HAVE_CUDNN
    hs__attn_dnn_destroy(plan->dnn);
#endif
    cudaFree(plan->tiles);
    cudaFree(plan->meta);
    cudaFreeHost(plan->h_longest);
    free(plan);
}

extern "C" hs_status_t hs_kn_attn_plan_prepare(hs_kn_attn_plan_t *plan, const int32_t *cu_seqlens,
                                               int n_seqs, int T, int longest, cudaStream_t stream)
{
    if (!plan || !cu_seqlens || n_seqs < 0 || n_seqs > plan->desc.max_seqs || T < 0 ||
        T > plan->desc.max_tokens) {
        hs_error("attention plan: batch of %d tokens in %d sequences exceeds the plan (%d tokens, "
                 "%d sequences)",
                 T, n_seqs, plan ? plan->desc.max_tokens : 0, plan ? plan->desc.max_seqs : 0);
        return HS_ERR_INVALID;
    }
    if (longest < 0 || longest > T) {
        hs_error("attention plan: the longest sequence given, %d tokens, is not within the "
                 "batch's %d tokens (pass 0 to have it read back)",
                 longest, T);
        return HS_ERR_INVALID;
    }
    plan->cu = cu_seqlens;
    plan->n_seqs = n_seqs;
    plan->T = T;
    plan->bucket = -1;
    if (n_seqs == 0 || T == 0) return HS_OK;
#ifdef HS_HAVE_CUDNN
    if (plan->dnn) {
        const hs_kn_attn_desc_t *d = &plan->desc;
        attn_meta_kernel<<<1, 1024, 0, stream>>>(
            cu_seqlens, n_seqs, plan->nb_max, d->q_stride, d->kv_stride, d->out_stride,
            plan->seq_len, plan->rag_q, plan->rag_kv, plan->rag_o, plan->longest, longest);
        hs_status_t st = HS_CUDA_LAUNCH_CHECK("attention meta kernel");
        if (st) return st;
        if (longest == 0) {
            if ((st = HS_CUDA_CHECK(cudaMemcpyAsync(plan->h_longest, plan->longest, sizeof(int32_t),
                                                    cudaMemcpyDeviceToHost, stream))))
                return st;
            if ((st = HS_CUDA_CHECK(cudaStreamSynchronize(stream)))) return st;
            longest = *plan->h_longest;
        }
        /* the bucket of the smallest grid (B x S) that holds the batch */
        for (int i = 0; i < plan->n_buckets; i++)
            if (plan->ok[i] && plan->S[i] >= longest && plan->B[i] >= n_seqs &&
                (plan->bucket < 0 || (int64_t)plan->S[i] * plan->B[i] <
                                         (int64_t)plan->S[plan->bucket] * plan->B[plan->bucket]))
                plan->bucket = i;
        if (plan->bucket >= 0) return HS_OK;
        hs_debug("attention: no cudnn bucket holds %d sequences up to %d long; the mma.sync "
                 "kernel runs this batch",
                 n_seqs, longest);
    }
#endif
    return hs_kn_attention_schedule(cu_seqlens, n_seqs, plan->tiles, stream);
}

extern "C" hs_status_t hs_kn_attn_plan_run(hs_kn_attn_plan_t *plan, const void *q, const void *k,
                                           const void *v, void *out, cudaStream_t stream)
{
    if (!plan) return HS_ERR_INVALID;
    if (plan->n_seqs == 0 || plan->T == 0) return HS_OK;
    const hs_kn_attn_desc_t *d = &plan->desc;
#ifdef HS_HAVE_CUDNN
    if (plan->bucket >= 0 &&
        ((uintptr_t)q | (uintptr_t)k | (uintptr_t)v | (uintptr_t)out) % 16 == 0)
        return hs__attn_dnn_run(plan->dnn, plan->bucket, q, k, v, out, plan->seq_len, plan->rag_q,
                                plan->rag_kv, plan->rag_o, stream);
    if (plan->bucket >= 0) {
        /* unaligned rows: the schedule of the other kernel was not made */
        hs_status_t st = hs_kn_attention_schedule(plan->cu, plan->n_seqs, plan->tiles, stream);
        if (st) return st;
        plan->bucket = -1;
    }
#endif
    return hs_kn_attention(q, d->q_stride, k, v, d->kv_stride, out, d->out_stride, plan->cu,
                           plan->tiles, plan->n_seqs, plan->T, d->n_heads, d->n_kv_heads,
                           d->head_dim, d->scale, d->window, stream);
}

extern "C" const char *hs_kn_attn_plan_backend(const hs_kn_attn_plan_t *plan)
{
    if (!plan) return "mma";
#ifdef HS_HAVE_CUDNN
    if (!plan->cu && plan->dnn) return "cudnn";
#endif
    return plan->bucket >= 0 ? "cudnn" : "mma";
}
