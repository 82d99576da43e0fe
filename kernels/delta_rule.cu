/* SPDX-License-Identifier: Apache-2.0 */
/* delta_rule.cu - the gated delta rule (Gated DeltaNet's token mixer) on
 * CUDA over packed variable-length sequences; the math is in delta_rule.h.
 * Per sequence and value head h (key head h / (n_v_heads / n_k_heads)),
 * with an fp32 state S [dk, dv] that starts at zero at every sequence:
 *   S = exp(g_t) S;  u = beta_t (v_t - S^T k~);  S += k~ u^T;  o_t = S^T q~
 * q~, k~ the L2-normalised q and k (q~ also scaled by 1/sqrt(dk)).
 *
 * Recurrent kernel: one block of 64 threads per (sequence, value head, 64
 * columns of dv); thread j holds column j of S in registers (dk fp32) and
 * walks the tokens in order. The next token's q, k, v and gates are loaded
 * while the current one is computed; q and k go through shared memory
 * (double-buffered, one barrier per token), where all threads read them as
 * broadcasts. bf16 inputs and output, fp32 state and arithmetic. */
#include <cuda_bf16.h>
#include <stdint.h>

#include "cublaslt.h"
#include "delta_rule.h"
#include "delta_rule_int.h"

typedef __nv_bfloat16 bf16;

enum { REC_THREADS = 64 };

template <int DK>
__global__ void __launch_bounds__(REC_THREADS)
    delta_rule_recurrent_kernel(const bf16 *__restrict__ q, const bf16 *__restrict__ k,
                                const bf16 *__restrict__ v, int64_t stride,
                                const float *__restrict__ g, const float *__restrict__ beta,
                                bf16 *__restrict__ out, int64_t out_stride,
                                const int32_t *__restrict__ cu, int ratio, int nv, int dk, int dv)
{
    constexpr int PER = DK / REC_THREADS; /* q and k elements each thread loads */
    __shared__ float qs[2][DK], ks[2][DK], red[2][REC_THREADS / 32][2];
    const int h = blockIdx.x, s = blockIdx.y, tid = threadIdx.x, warp = tid >> 5;
    const int j = blockIdx.z * REC_THREADS + tid;
    const bool col = j < dv;
    const int start = cu[s], end = cu[s + 1];
    const int64_t qk_off = (int64_t)(h / ratio) * dk, v_off = (int64_t)h * dv;
    const float scale = rsqrtf((float)dk);

    float S[DK];
#pragma unroll
    for (int i = 0; i < DK; i++)
        S[i] = 0.f;

    /* registers holding the next token's inputs */
    float qn[PER], kn[PER], vn = 0.f, gn = 0.f, bn = 0.f;
    auto load = [&](int t) {
        const bf16 *qt = q + (int64_t)t * stride + qk_off, *kt = k + (int64_t)t * stride + qk_off;
#pragma unroll
        for (int e = 0; e < PER; e++) {
            int i = tid + e * REC_THREADS;
            qn[e] = i < dk ? __bfloat162float(qt[i]) : 0.f;
            kn[e] = i < dk ? __bfloat162float(kt[i]) : 0.f;
        }
        vn = col ? __bfloat162float(v[(int64_t)t * stride + v_off + j]) : 0.f;
        gn = g[(int64_t)t * nv + h];
        bn = beta[(int64_t)t * nv + h];
    };
    if (start < end) load(start);

    for (int t = start; t < end; t++) {
        const int buf = (t - start) & 1;
        float sq = 0.f, sk = 0.f;
#pragma unroll
        for (int e = 0; e < PER; e++) {
            qs[buf][tid + e * REC_THREADS] = qn[e];
            ks[buf][tid + e * REC_THREADS] = kn[e];
            sq += qn[e] * qn[e];
            sk += kn[e] * kn[e];
        }
        const float vj = vn, decay = __expf(gn), b = bn;
        if (t + 1 < end) load(t + 1);
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            sq += __shfl_xor_sync(0xffffffffu, sq, o);
            sk += __shfl_xor_sync(0xffffffffu, sk, o);
        }
        if ((tid & 31) == 0) red[buf][warp][0] = sq, red[buf][warp][1] = sk;
        __syncthreads();
        sq = red[buf][0][0] + red[buf][1][0];
        sk = red[buf][0][1] + red[buf][1][1];
        const float qinv = rsqrtf(sq + 1e-6f) * scale, kinv = rsqrtf(sk + 1e-6f);
        const float *qb = qs[buf], *kb = ks[buf];

        float u0 = 0.f, u1 = 0.f, u2 = 0.f, u3 = 0.f; /* four chains for the dot product */
#pragma unroll
        for (int i = 0; i < DK; i += 4) {
            S[i] *= decay, S[i + 1] *= decay, S[i + 2] *= decay, S[i + 3] *= decay;
            u0 += S[i] * kb[i], u1 += S[i + 1] * kb[i + 1];
            u2 += S[i + 2] * kb[i + 2], u3 += S[i + 3] * kb[i + 3];
        }
        const float u = (vj - ((u0 + u1) + (u2 + u3)) * kinv) * b, uk = u * kinv;
        float o0 = 0.f, o1 = 0.f, o2 = 0.f, o3 = 0.f;
#pragma unroll
        for (int i = 0; i < DK; i += 4) {
            S[i] += kb[i] * uk, S[i + 1] += kb[i + 1] * uk;
            S[i + 2] += kb[i + 2] * uk, S[i + 3] += kb[i + 3] * uk;
            o0 += S[i] * qb[i], o1 += S[i + 1] * qb[i + 1];
            o2 += S[i + 2] * qb[i + 2], o3 += S[i + 3] * qb[i + 3];
        }
        if (col)
            out[(int64_t)t * out_stride + v_off + j] =
                __float2bfloat16(((o0 + o1) + (o2 + o3)) * qinv);
    }
}

/* Rows of S past dk are zero (their k~ entries are zero), so a kernel built
 * for a larger DK is exact for a smaller dk. */
static hs_status_t recurrent_launch(const void *q, const void *k, const void *v, int64_t stride,
                                    const float *g, const float *beta, void *out,
                                    int64_t out_stride, const int32_t *cu, int n_seqs, int nk,
                                    int nv, int dk, int dv, cudaStream_t stream)
{
    dim3 grid((unsigned)nv, (unsigned)n_seqs, (unsigned)((dv + REC_THREADS - 1) / REC_THREADS));
#define REC_LAUNCH(DKT)                                                                            \
    delta_rule_recurrent_kernel<DKT><<<grid, REC_THREADS, 0, stream>>>(                            \
        (const bf16 *)q, (const bf16 *)k, (const bf16 *)v, stride, g, beta, (bf16 *)out,           \
        out_stride, cu, nv / nk, nv, dk, dv)
    if (dk <= 64)
        REC_LAUNCH(64);
    else if (dk <= 128)
        REC_LAUNCH(128);
    else
        REC_LAUNCH(256);
#undef REC_LAUNCH
    return HS_CUDA_LAUNCH_CHECK("delta_rule recurrent kernel");
}

/* ---- chunked form ---------------------------------------------------------
 * Tokens of a sequence are cut into chunks of 64 from its first token (a
 * sequence's last chunk may be short). In a chunk of n rows with the state
 * S0 at its start, gc_i = sum_{s<=i} g_s (inclusive, inside the chunk) and
 * G_i = exp(gc_i), the recurrence unrolls to (WY / UT form):
 *   A[i, j]  = beta_i exp(gc_i - gc_j) k~_i . k~_j          (j < i, else 0)
 *   X        = (I + A)^-1                                   (unit lower)
 *   w        = X diag(beta G) k~,   u = X diag(beta) v       (rows of the chunk)
 *   v'       = u - w S0                                      (the corrections)
 *   o_i      = G_i S0^T q~_i + sum_{j<=i} exp(gc_i - gc_j) (q~_i . k~_j) v'_j
 *   S_next   = G_{n-1} S0 + sum_j exp(gc_{n-1} - gc_j) k~_j v'_j^T
 * Two kernels after a one-block schedule:
 *   chunk_prep (parallel over chunks and value heads): gc, the norms of q and
 *     k, A and P = [exp(gc_i - gc_j) q~_i . k~_j]_{j<=i} on tensor cores, X
 *     by blocked forward substitution in fp32, then w = Xw k and u = Xu v on
 *     tensor cores with the row scales in X's columns, Xw = X diag(beta G
 *     kinv), Xu = X diag(beta), each split into two bf16 halves, hi + lo,
 *     so the product keeps fp32's precision of X and k, v are used as
 *     loaded; w, u, P, gc and the norms go to the workspace.
 *   chunk_scan (per sequence, value head and 64 columns of dv, over the
 *     chunks in order): the state lives in fp32 accumulator fragments; per
 *     chunk v' = u - w S0, o = G (q S0) + P v', S = G_{n-1} S + (d k~)^T v'
 *     with d_j = exp(gc_{n-1} - gc_j); P is loaded as operand fragments
 *     ahead of its product, w from global memory at its product, k, q and
 *     u by cp.async.
 * q and k are read raw (bf16) and their inverse norms folded into row
 * scales, so they are never written back normalised. Matrix products are
 * wmma bf16 x bf16 -> fp32; w, u, v', P, the row-scaled k of the state's
 * update and the state as a product operand are rounded to bf16, the state
 * itself stays fp32. */
#include <mma.h>

using namespace nvcuda;

/* Both kernels run blocks of 8 warps, two an SM (shared memory allows no
 * more): at 4 warps ncu on the H200 found them latency-bound, no warp
 * eligible to issue in 57% of the cycles. */
enum { CH = 64, PREP_THREADS = 256, SCAN_THREADS = 256, BV = 64 };

typedef wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major> frag_a_row;
typedef wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::col_major> frag_a_col;
typedef wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::row_major> frag_b_row;
typedef wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::col_major> frag_b_col;
typedef wmma::fragment<wmma::accumulator, 16, 16, 16, float> frag_c;

/* Two products that share their right operand, for one 16-row tile and two
 * 16-column tiles over DK: c1 = a1 b and c2 = a2 b, stored fp32 (stride
 * ldc). a1, a2: row-major rows (strides lda1, lda2); b's tile (k, x) is at
 * b + k * b_kstep + x * b_xstep (stride ldb, FragB's layout). */
template <int DK, typename FragB>
__device__ __forceinline__ void two_products(const bf16 *a1, int lda1, const bf16 *a2, int lda2,
                                             const bf16 *b, int ldb, int b_kstep, int b_xstep,
                                             float *c1, float *c2, int ldc)
{
    frag_c acc1[2], acc2[2];
#pragma unroll
    for (int x = 0; x < 2; x++)
        wmma::fill_fragment(acc1[x], 0.f), wmma::fill_fragment(acc2[x], 0.f);
#pragma unroll
    for (int kt = 0; kt < DK / 16; kt++) {
        frag_a_row f1, f2;
        wmma::load_matrix_sync(f1, a1 + kt * 16, lda1);
        wmma::load_matrix_sync(f2, a2 + kt * 16, lda2);
#pragma unroll
        for (int x = 0; x < 2; x++) {
            FragB fb;
            wmma::load_matrix_sync(fb, b + kt * b_kstep + x * b_xstep, ldb);
            wmma::mma_sync(acc1[x], f1, fb, acc1[x]);
            wmma::mma_sync(acc2[x], f2, fb, acc2[x]);
        }
    }
#pragma unroll
    for (int x = 0; x < 2; x++) {
        wmma::store_matrix_sync(c1 + x * 16, acc1[x], ldc, wmma::mem_row_major);
        wmma::store_matrix_sync(c2 + x * 16, acc2[x], ldc, wmma::mem_row_major);
    }
}

/* Workspace, each part 256-byte aligned; rows padded by one chunk so that a
 * short last chunk's fragment loads stay inside. */
struct dr_layout {
    size_t chunks, n_chunks, qinv, kinv, gc, w, u, p, total;
};

static size_t dr_align(size_t x) { return (x + 255) & ~(size_t)255; }

static dr_layout dr_plan(int max_tokens, int max_seqs, int nk, int nv, int dk, int dv)
{
    size_t rows = (size_t)max_tokens + CH;
    size_t chunks = (size_t)max_tokens / CH + (size_t)max_seqs + 1;
    if (chunks > (size_t)max_tokens + 1) chunks = (size_t)max_tokens + 1;
    dr_layout L;
    size_t at = 0;
    L.chunks = at, at = dr_align(at + chunks * sizeof(int2));
    L.n_chunks = at, at = dr_align(at + sizeof(int));
    L.qinv = at, at = dr_align(at + rows * nk * sizeof(float));
    L.kinv = at, at = dr_align(at + rows * nk * sizeof(float));
    L.gc = at, at = dr_align(at + rows * nv * sizeof(float));
    L.w = at, at = dr_align(at + rows * nv * dk * sizeof(bf16));
    L.u = at, at = dr_align(at + rows * nv * dv * sizeof(bf16));
    L.p = at, at = dr_align(at + rows * nv * CH * sizeof(bf16));
    L.total = at + 256; /* slack to align the caller's pointer */
    return L;
}

/* One block: chunks[c] = (first token, rows) of every chunk of every
 * sequence, in order; *n_chunks their number. */
__global__ void __launch_bounds__(1024)
    chunk_schedule_kernel(const int32_t *__restrict__ cu, int n_seqs, int2 *chunks, int *n_chunks)
{
    __shared__ int scan[1024];
    const int tid = threadIdx.x, per = (n_seqs + 1023) / 1024;
    const int s0 = min(tid * per, n_seqs), s1 = min(s0 + per, n_seqs);
    int mine = 0;
    for (int s = s0; s < s1; s++)
        mine += (cu[s + 1] - cu[s] + CH - 1) / CH;
    scan[tid] = mine;
    __syncthreads();
    for (int off = 1; off < 1024; off <<= 1) { /* inclusive Hillis-Steele scan */
        int add = tid >= off ? scan[tid - off] : 0;
        __syncthreads();
        scan[tid] += add;
        __syncthreads();
    }
    int c = scan[tid] - mine;
    for (int s = s0; s < s1; s++)
        for (int t = cu[s]; t < cu[s + 1]; t += CH)
            chunks[c++] = make_int2(t, min(CH, cu[s + 1] - t));
    if (tid == 1023) *n_chunks = scan[1023];
}

/* Starts the copy of CH rows x cols bf16 from global rows (row stride
 * ld_src) into shared rows (ld_dst), zeros past row n, as 16-byte cp.async
 * (all in flight at once); cols a multiple of 8, 16-byte aligned rows.
 * Complete with load_rows_wait() and a barrier. */
__device__ __forceinline__ void load_rows(bf16 *dst, int ld_dst, const bf16 *src, int64_t ld_src,
                                          int n, int cols)
{
    const int per_row = cols / 8;
    for (int e = threadIdx.x; e < CH * per_row; e += blockDim.x) {
        int r = e / per_row, c = (e % per_row) * 8;
        unsigned d = (unsigned)__cvta_generic_to_shared(dst + r * ld_dst + c);
        const bf16 *from = r < n ? src + r * ld_src + c : src; /* 0 bytes read past n */
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d), "l"(from),
                     "r"(r < n ? 16 : 0));
    }
    asm volatile("cp.async.commit_group;\n" ::);
}

__device__ __forceinline__ void load_rows_wait(void)
{
    asm volatile("cp.async.wait_all;\n" ::: "memory");
}

/* A warp's 16 x 16 fp32 tile (in stage, ld 20) to bf16 global rows < n. */
__device__ __forceinline__ void store_tile_bf16(const float *stage, bf16 *dst, int64_t ld_dst,
                                                int n_rows)
{
    const int lane = threadIdx.x & 31;
    for (int e = lane; e < 16 * 8; e += 32) { /* pairs of columns */
        int r = e / 8, c = (e % 8) * 2;
        if (r < n_rows)
            *(__nv_bfloat162 *)(dst + r * ld_dst + c) =
                __floats2bfloat162_rn(stage[r * 20 + c], stage[r * 20 + c + 1]);
    }
}

template <int DK, int DV>
__global__ void __launch_bounds__(PREP_THREADS, 2)
    chunk_prep_kernel(const bf16 *__restrict__ q, const bf16 *__restrict__ k,
                      const bf16 *__restrict__ v, int64_t stride, const float *__restrict__ g,
                      const float *__restrict__ beta, const int2 *__restrict__ chunks,
                      const int *__restrict__ n_chunks, int ratio, int nk, int nv,
                      float *__restrict__ qinv_ws, float *__restrict__ kinv_ws,
                      float *__restrict__ gc_ws, bf16 *__restrict__ w_ws, bf16 *__restrict__ u_ws,
                      bf16 *__restrict__ p_ws)
{
    constexpr int LDK = DK + 8, LDV = DV + 8, LDF = CH + 8, LDX = CH + 8;
    extern __shared__ __align__(128) unsigned char smem[];
    bf16 *Ks = (bf16 *)smem;              /* k as loaded */
    bf16 *Qs = Ks + CH * LDK;             /* raw q, then the substitution's scratch */
    bf16 *Vs = Qs + CH * LDK;             /* v as loaded */
    float *KK = (float *)(Vs + CH * LDV); /* k k^T, then A, then Xw hi | lo (bf16) */
    float *QK = KK + CH * LDF;            /* q k^T, then X, then Xu hi | lo (bf16) */
    float *stage = QK + CH * LDF;         /* 8 warps' 16 x 20 tiles */
    float *gcs = stage + 8 * 16 * 20, *betas = gcs + CH, *qinvs = betas + CH, *kinvs = qinvs + CH;
    float *kscale = kinvs + CH; /* beta G kinv per row */

    const int c = blockIdx.x, h = blockIdx.y, tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    if (c >= *n_chunks) return;
    const int2 ch = chunks[c];
    const int t0 = ch.x, n = ch.y, hk = h / ratio;
    const float scale = rsqrtf((float)DK);

    load_rows(Ks, LDK, k + (int64_t)t0 * stride + (int64_t)hk * DK, stride, n, DK);
    load_rows(Qs, LDK, q + (int64_t)t0 * stride + (int64_t)hk * DK, stride, n, DK);
    load_rows(Vs, LDV, v + (int64_t)t0 * stride + (int64_t)h * DV, stride, n, DV);
    if (tid < CH) {
        gcs[tid] = tid < n ? g[(int64_t)(t0 + tid) * nv + h] : 0.f;
        betas[tid] = tid < n ? beta[(int64_t)(t0 + tid) * nv + h] : 0.f;
    }
    load_rows_wait();
    __syncthreads();

    /* inverse norms: four threads per row; the cumulative gate: warp 0 */
    {
        int r = tid >> 2, part = tid & 3;
        float sq = 0.f, sk = 0.f;
        for (int i = part * (DK / 4); i < (part + 1) * (DK / 4); i += 2) {
            float2 a = __bfloat1622float2(*(const __nv_bfloat162 *)(Qs + r * LDK + i));
            float2 b = __bfloat1622float2(*(const __nv_bfloat162 *)(Ks + r * LDK + i));
            sq += a.x * a.x + a.y * a.y, sk += b.x * b.x + b.y * b.y;
        }
        sq += __shfl_xor_sync(0xffffffffu, sq, 1);
        sk += __shfl_xor_sync(0xffffffffu, sk, 1);
        sq += __shfl_xor_sync(0xffffffffu, sq, 2);
        sk += __shfl_xor_sync(0xffffffffu, sk, 2);
        if (!part) {
            qinvs[r] = rsqrtf(sq + 1e-6f) * scale;
            kinvs[r] = rsqrtf(sk + 1e-6f);
            if (h % ratio == 0 && r < n) {
                qinv_ws[(int64_t)(t0 + r) * nk + hk] = qinvs[r];
                kinv_ws[(int64_t)(t0 + r) * nk + hk] = kinvs[r];
            }
        }
    }
    if (warp == 0) {
        float a = gcs[lane], b = gcs[lane + 32];
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            float x = __shfl_up_sync(0xffffffffu, a, o), y = __shfl_up_sync(0xffffffffu, b, o);
            if (lane >= o) a += x, b += y;
        }
        b += __shfl_sync(0xffffffffu, a, 31);
        gcs[lane] = a, gcs[lane + 32] = b;
        if (lane < n) gc_ws[(int64_t)(t0 + lane) * nv + h] = a;
        if (lane + 32 < n) gc_ws[(int64_t)(t0 + lane + 32) * nv + h] = b;
    }

    /* k k^T and q k^T: warp w takes row tile w % 4, column tiles
     * 2 (w / 4) and 2 (w / 4) + 1 */
    const int rt = warp & 3, half = warp >> 2;
    two_products<DK, frag_b_col>(
        Ks + rt * 16 * LDK, LDK, Qs + rt * 16 * LDK, LDK, Ks + 2 * half * 16 * LDK, LDK, 16,
        16 * LDK, KK + rt * 16 * LDF + 2 * half * 16, QK + rt * 16 * LDF + 2 * half * 16, LDF);
    __syncthreads();

    /* A (strictly lower) in place of k k^T; P (lower with the diagonal) out */
    bf16 *p_out = p_ws + (int64_t)t0 * nv * CH + (int64_t)h * CH;
    for (int e = tid; e < CH * CH / 2; e += PREP_THREADS) {
        int i = e / (CH / 2), j = (e % (CH / 2)) * 2;
        float a[2], p[2];
#pragma unroll
        for (int x = 0; x < 2; x++) {
            int jj = j + x;
            float d = jj <= i ? __expf(gcs[i] - gcs[jj]) : 0.f;
            a[x] = jj < i ? betas[i] * kinvs[i] * kinvs[jj] * d * KK[i * LDF + jj] : 0.f;
            p[x] = qinvs[i] * kinvs[jj] * d * QK[i * LDF + jj];
            KK[i * LDF + jj] = a[x];
        }
        if (i < n)
            *(__nv_bfloat162 *)(p_out + (int64_t)i * nv * CH + j) =
                __floats2bfloat162_rn(p[0], p[1]);
    }
    __syncthreads();

    /* X = (I + A)^-1: the four diagonal 16 x 16 blocks by substitution, one
     * thread per column; then block rows 1..3:
     * X_ib = -X_ii sum_{b <= m < i} A_im X_mb. */
    float *X = QK, *A = KK, *tmp = (float *)Qs;
    for (int e = tid; e < CH * CH; e += PREP_THREADS)
        X[(e / CH) * LDF + e % CH] = 0.f;
    __syncthreads();
    if (tid < CH) {
        int b = tid >> 4, col = tid & 15, base = b * 16;
        float x[16];
#pragma unroll
        for (int r = 0; r < 16; r++) {
            float acc = r == col ? 1.f : 0.f;
#pragma unroll
            for (int j = 0; j < r; j++)
                acc -= A[(base + r) * LDF + base + j] * x[j];
            x[r] = acc;
        }
#pragma unroll
        for (int r = 0; r < 16; r++)
            X[(base + r) * LDF + base + col] = x[r];
    }
    __syncthreads();
    for (int ib = 1; ib < 4; ib++) {
        /* tmp[r, 16 b + col] = sum_{16 b <= m < 16 ib} A[16 ib + r, m] X[m, 16 b + col] */
        for (int e = tid; e < 16 * 16 * ib; e += PREP_THREADS) {
            int r = e / (16 * ib), cc = e % (16 * ib), b = cc >> 4;
            float acc = 0.f;
            for (int m = 16 * b; m < 16 * ib; m++)
                acc += A[(16 * ib + r) * LDF + m] * X[m * LDF + cc];
            tmp[r * CH + cc] = acc;
        }
        __syncthreads();
        for (int e = tid; e < 16 * 16 * ib; e += PREP_THREADS) {
            int r = e / (16 * ib), cc = e % (16 * ib);
            float acc = 0.f;
#pragma unroll
            for (int m = 0; m < 16; m++)
                acc -= X[(16 * ib + r) * LDF + 16 * ib + m] * tmp[m * CH + cc];
            X[(16 * ib + r) * LDF + cc] = acc;
        }
        __syncthreads();
    }

    /* The row scales go into X's columns, so that k and v are used as
     * loaded: Xw = X diag(beta G kinv), Xu = X diag(beta), each as hi + lo
     * bf16 (Xw in A's place, Xu in X's: X is read into registers first) */
    constexpr int PER_T = CH * CH / PREP_THREADS;
    float xr[PER_T];
#pragma unroll
    for (int x = 0; x < PER_T; x++) {
        int e = tid + x * PREP_THREADS;
        xr[x] = X[(e / CH) * LDF + e % CH];
    }
    if (tid < CH) kscale[tid] = betas[tid] * __expf(gcs[tid]) * kinvs[tid];
    __syncthreads();
    bf16 *Xwh = (bf16 *)KK, *Xwl = Xwh + CH * LDX, *Xuh = (bf16 *)QK, *Xul = Xuh + CH * LDX;
#pragma unroll
    for (int x = 0; x < PER_T; x++) {
        int e = tid + x * PREP_THREADS, i = e / CH, j = e % CH;
        float xw = xr[x] * kscale[j], xu = xr[x] * betas[j];
        bf16 wh = __float2bfloat16(xw), uh = __float2bfloat16(xu);
        Xwh[i * LDX + j] = wh;
        Xwl[i * LDX + j] = __float2bfloat16(xw - __bfloat162float(wh));
        Xuh[i * LDX + j] = uh;
        Xul[i * LDX + j] = __float2bfloat16(xu - __bfloat162float(uh));
    }
    __syncthreads();

    /* w = Xw k, u = Xu v: warp w takes row tile w % 4 and half the
     * columns; X is lower, so k-tiles past the row tile are zero and
     * skipped */
    float *st = stage + warp * 16 * 20;
    const int rows_left = n - rt * 16;
    auto product = [&](const bf16 *Xh, const bf16 *Xl, const bf16 *B, int ldb, int ncols, bf16 *dst,
                       int64_t ld_dst) {
        for (int nt = half * ncols / 32; nt < (half + 1) * ncols / 32; nt++) {
            frag_c acc;
            wmma::fill_fragment(acc, 0.f);
            for (int kt = 0; kt <= rt; kt++) {
                frag_a_row ah, al;
                frag_b_row b;
                wmma::load_matrix_sync(ah, Xh + rt * 16 * LDX + kt * 16, LDX);
                wmma::load_matrix_sync(al, Xl + rt * 16 * LDX + kt * 16, LDX);
                wmma::load_matrix_sync(b, B + kt * 16 * ldb + nt * 16, ldb);
                wmma::mma_sync(acc, ah, b, acc);
                wmma::mma_sync(acc, al, b, acc);
            }
            wmma::store_matrix_sync(st, acc, 20, wmma::mem_row_major);
            __syncwarp();
            if (rows_left > 0) store_tile_bf16(st, dst + nt * 16, ld_dst, rows_left);
            __syncwarp();
        }
    };
    product(Xwh, Xwl, Ks, LDK, DK, w_ws + ((int64_t)(t0 + rt * 16) * nv + h) * DK,
            (int64_t)nv * DK);
    product(Xuh, Xul, Vs, LDV, DV, u_ws + ((int64_t)(t0 + rt * 16) * nv + h) * DV,
            (int64_t)nv * DV);
}

template <int DK, int DV> static size_t chunk_prep_smem(void)
{
    return (size_t)CH * (DK + 8) * 2 * 2 + (size_t)CH * (DV + 8) * 2 +
           (size_t)CH * (CH + 8) * 4 * 2 + 8 * 16 * 20 * 4 + 5 * CH * 4;
}

/* Eight warps: warp w computes the products for the chunk's rows
 * 16 (w % 4) .. + 15 and columns 32 (w / 4) .. + 31 of the 64 (two tiles),
 * and holds the state's tiles of its own: m-tile w % (DK / 16), DK / 32
 * column tiles from (w / (DK / 16)) DK / 32. */
template <int DK>
__global__ void __launch_bounds__(SCAN_THREADS, 2)
    chunk_scan_kernel(const bf16 *__restrict__ q, const bf16 *__restrict__ k, int64_t stride,
                      const int32_t *__restrict__ cu, int ratio, int nk, int nv, int dv,
                      const float *__restrict__ qinv_ws, const float *__restrict__ kinv_ws,
                      const float *__restrict__ gc_ws, const bf16 *__restrict__ w_ws,
                      const bf16 *__restrict__ u_ws, const bf16 *__restrict__ p_ws,
                      bf16 *__restrict__ out, int64_t out_stride)
{
    constexpr int LDK = DK + 8, LDH = BV + 8, LDF = BV + 4;
    constexpr int MTILES = DK / 16,
                  OWN = DK / 32; /* the state's m-tiles; column tiles a warp holds */
    extern __shared__ __align__(128) unsigned char smem[];
    constexpr int F_ROWS = DK > 2 * CH ? DK : 2 * CH;
    float *Hf = (float *)smem;                     /* the state in fp32, [DK][LDF] ... */
    float *Vf = Hf, *Of = Hf + CH * LDF;           /* ... whose place w S0 and q S0 then take */
    bf16 *Hs = (bf16 *)(Hf + F_ROWS * LDF);        /* the state as bf16 operand [DK][LDH] */
    bf16 *Vn = Hs + DK * LDH;                      /* v' [CH][LDH] */
    bf16 *Us = Vn + CH * LDH;                      /* u's rows of the chunk [CH][LDH] */
    bf16 *Ks = Us + CH * LDH, *Qs = Ks + CH * LDK; /* k, then diag(exp(gc_last - gc) kinv) k */
    float *gcs = (float *)(Qs + CH * LDK), *qinvs = gcs + CH, *kinvs = qinvs + CH;

    const int vt = blockIdx.x, h = blockIdx.y, s = blockIdx.z;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, hk = h / ratio;
    const int start = cu[s], end = cu[s + 1], j0 = vt * BV;
    const int rt = warp & 3, ch = warp >> 2;                  /* product tiles */
    const int sm = warp % MTILES, sn = (warp / MTILES) * OWN; /* state tiles */

    frag_c hf[OWN];
#pragma unroll
    for (int x = 0; x < OWN; x++)
        wmma::fill_fragment(hf[x], 0.f);

    for (int t0 = start; t0 < end; t0 += CH) {
        const int n = min(CH, end - t0);
        load_rows(Ks, LDK, k + (int64_t)t0 * stride + (int64_t)hk * DK, stride, n, DK);
        load_rows(Qs, LDK, q + (int64_t)t0 * stride + (int64_t)hk * DK, stride, n, DK);
        load_rows(Us, LDH, u_ws + ((int64_t)t0 * nv + h) * dv + j0, (int64_t)nv * dv, n, BV);
        if (tid < CH) {
            bool in = tid < n;
            gcs[tid] = in ? gc_ws[(int64_t)(t0 + tid) * nv + h] : 0.f;
            qinvs[tid] = in ? qinv_ws[(int64_t)(t0 + tid) * nk + hk] : 0.f;
            kinvs[tid] = in ? kinv_ws[(int64_t)(t0 + tid) * nk + hk] : 0.f;
        }
#pragma unroll
        for (int x = 0; x < OWN; x++)
            wmma::store_matrix_sync(Hf + sm * 16 * LDF + (sn + x) * 16, hf[x], LDF,
                                    wmma::mem_row_major);
        load_rows_wait();
        __syncthreads();
        for (int e = tid; e < DK * BV / 2; e += SCAN_THREADS) {
            int i = e / (BV / 2), j = (e % (BV / 2)) * 2;
            *(__nv_bfloat162 *)(Hs + i * LDH + j) =
                __floats2bfloat162_rn(Hf[i * LDF + j], Hf[i * LDF + j + 1]);
        }
        __syncthreads();

        /* w S0 and q S0 for the warp's 16 rows and 32 columns; w's rows
         * straight from global memory (L2: the other column half's warp
         * reads them too) */
        two_products<DK, frag_b_row>(w_ws + ((int64_t)(t0 + rt * 16) * nv + h) * DK, nv * DK,
                                     Qs + rt * 16 * LDK, LDK, Hs + 2 * ch * 16, LDH, 16 * LDH, 16,
                                     Vf + rt * 16 * LDF + 2 * ch * 16,
                                     Of + rt * 16 * LDF + 2 * ch * 16, LDF);
        /* the row tile's P (k-tiles up to its own: P is lower), loaded
         * while the epilogue runs */
        frag_a_row pa[CH / 16];
        const bf16 *prow = p_ws + ((int64_t)(t0 + rt * 16) * nv + h) * CH;
#pragma unroll
        for (int kt = 0; kt < CH / 16; kt++)
            if (kt <= rt) wmma::load_matrix_sync(pa[kt], prow + kt * 16, nv * CH);
        __syncwarp();
        const float gl = gcs[n - 1];
        for (int e = lane; e < 16 * 32; e += 32) { /* the warp's own 16 x 32 of v' and q S0 */
            int i = rt * 16 + e / 32, j = ch * 32 + e % 32;
            float vn = i < n ? __bfloat162float(Us[i * LDH + j]) - Vf[i * LDF + j] : 0.f;
            Vn[i * LDH + j] = __float2bfloat16(vn);
            Of[i * LDF + j] *= __expf(gcs[i]) * qinvs[i];
        }
        for (int e = lane; e < 16 * DK / 4; e += 32) { /* its rows' half of k, for the update */
            int i = rt * 16 + e / (DK / 4), j = ch * (DK / 2) + (e % (DK / 4)) * 2;
            float d = __expf(gl - gcs[i]) * kinvs[i];
            float2 x = __bfloat1622float2(*(const __nv_bfloat162 *)(Ks + i * LDK + j));
            *(__nv_bfloat162 *)(Ks + i * LDK + j) = __floats2bfloat162_rn(x.x * d, x.y * d);
        }
        __syncthreads();

        /* o = G (q S0) + P v' (P is lower: k-tiles up to the row tile) */
        {
            frag_c ao[2];
#pragma unroll
            for (int x = 0; x < 2; x++)
                wmma::load_matrix_sync(ao[x], Of + rt * 16 * LDF + (2 * ch + x) * 16, LDF,
                                       wmma::mem_row_major);
#pragma unroll
            for (int kt = 0; kt < CH / 16; kt++) {
                if (kt > rt) continue;
#pragma unroll
                for (int x = 0; x < 2; x++) {
                    frag_b_row b;
                    wmma::load_matrix_sync(b, Vn + kt * 16 * LDH + (2 * ch + x) * 16, LDH);
                    wmma::mma_sync(ao[x], pa[kt], b, ao[x]);
                }
            }
#pragma unroll
            for (int x = 0; x < 2; x++)
                wmma::store_matrix_sync(Of + rt * 16 * LDF + (2 * ch + x) * 16, ao[x], LDF,
                                        wmma::mem_row_major);
            __syncwarp();
            for (int e = lane; e < 16 * 16; e += 32) { /* pairs of the warp's 16 x 32 */
                int i = rt * 16 + e / 16, j = ch * 32 + (e % 16) * 2;
                if (i < n)
                    *(__nv_bfloat162 *)(out + (int64_t)(t0 + i) * out_stride + (int64_t)h * dv +
                                        j0 + j) =
                        __floats2bfloat162_rn(Of[i * LDF + j], Of[i * LDF + j + 1]);
            }
        }

        /* S = exp(gc_last) S + (d k)^T v', the warp's own tiles */
        const float decay = __expf(gl);
#pragma unroll
        for (int x = 0; x < OWN; x++)
#pragma unroll
            for (int y = 0; y < hf[x].num_elements; y++)
                hf[x].x[y] *= decay;
#pragma unroll
        for (int kt = 0; kt < CH / 16; kt++) {
            frag_a_col a;
            wmma::load_matrix_sync(a, Ks + kt * 16 * LDK + sm * 16, LDK);
#pragma unroll
            for (int x = 0; x < OWN; x++) {
                frag_b_row b;
                wmma::load_matrix_sync(b, Vn + kt * 16 * LDH + (sn + x) * 16, LDH);
                wmma::mma_sync(hf[x], a, b, hf[x]);
            }
        }
        __syncthreads();
    }
}

template <int DK> static size_t chunk_scan_smem(void)
{
    return (size_t)(DK > 2 * CH ? DK : 2 * CH) * (BV + 4) * 4 + (size_t)DK * (BV + 8) * 2 +
           (size_t)2 * CH * (BV + 8) * 2 + (size_t)2 * CH * (DK + 8) * 2 + 3 * CH * 4;
}

/* The chunked kernels' shapes: dk and dv of 64 or 128, dv in tiles of 64. */
static bool chunked_shape(int dk, int dv)
{
    return (dk == 64 || dk == 128) && (dv == 64 || dv == 128);
}

template <int DK, int DV>
static hs_status_t
chunked_launch_t(const void *q, const void *k, const void *v, int64_t stride, const float *g,
                 const float *beta, void *out, int64_t out_stride, const int32_t *cu, int n_seqs,
                 int T, int nk, int nv, unsigned char *ws, const dr_layout &L, cudaStream_t stream)
{
    /* the shared-memory opt-in is per device: a host-side call, set every time */
    size_t prep_smem = chunk_prep_smem<DK, DV>(), scan_smem = chunk_scan_smem<DK>();
    hs_status_t st = HS_CUDA_CHECK(cudaFuncSetAttribute(
        chunk_prep_kernel<DK, DV>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)prep_smem));
    if (st == HS_OK)
        st = HS_CUDA_CHECK(cudaFuncSetAttribute(
            chunk_scan_kernel<DK>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)scan_smem));
    if (st != HS_OK) return st;
    int2 *chunks = (int2 *)(ws + L.chunks);
    int *n_chunks = (int *)(ws + L.n_chunks);
    float *qinv = (float *)(ws + L.qinv), *kinv = (float *)(ws + L.kinv),
          *gc = (float *)(ws + L.gc);
    bf16 *w = (bf16 *)(ws + L.w), *u = (bf16 *)(ws + L.u), *p = (bf16 *)(ws + L.p);
    chunk_schedule_kernel<<<1, 1024, 0, stream>>>(cu, n_seqs, chunks, n_chunks);
    unsigned max_chunks = (unsigned)((T + CH - 1) / CH + n_seqs);
    if (max_chunks > (unsigned)T) max_chunks = (unsigned)T;
    chunk_prep_kernel<DK, DV><<<dim3(max_chunks, (unsigned)nv), PREP_THREADS, prep_smem, stream>>>(
        (const bf16 *)q, (const bf16 *)k, (const bf16 *)v, stride, g, beta, chunks, n_chunks,
        nv / nk, nk, nv, qinv, kinv, gc, w, u, p);
    chunk_scan_kernel<DK>
        <<<dim3(DV / BV, (unsigned)nv, (unsigned)n_seqs), SCAN_THREADS, scan_smem, stream>>>(
            (const bf16 *)q, (const bf16 *)k, stride, cu, nv / nk, nk, nv, DV, qinv, kinv, gc, w, u,
            p, (bf16 *)out, out_stride);
    return HS_CUDA_LAUNCH_CHECK("delta_rule chunked kernels");
}

static hs_status_t chunked_launch(const void *q, const void *k, const void *v, int64_t stride,
                                  const float *g, const float *beta, void *out, int64_t out_stride,
                                  const int32_t *cu, int n_seqs, int T, int nk, int nv, int dk,
                                  int dv, void *ws, const dr_layout &L, cudaStream_t stream)
{
    unsigned char *b = (unsigned char *)(((uintptr_t)ws + 255) & ~(uintptr_t)255);
#define CHUNKED(DKT, DVT)                                                                          \
    if (dk == DKT && dv == DVT)                                                                    \
    return chunked_launch_t<DKT, DVT>(q, k, v, stride, g, beta, out, out_stride, cu, n_seqs, T,    \
                                      nk, nv, b, L, stream)
    CHUNKED(64, 64);
    CHUNKED(64, 128);
    CHUNKED(128, 64);
    CHUNKED(128, 128);
#undef CHUNKED
    return HS_ERR_INVALID;
}

/* ---- entry points -------------------------------------------------------- */

/* What the chunked kernels' 16-byte row loads and paired stores need. */
static bool chunked_aligned(const void *q, const void *k, const void *v, int64_t stride,
                            const void *out, int64_t out_stride)
{
    return stride % 8 == 0 && out_stride % 2 == 0 &&
           ((uintptr_t)q | (uintptr_t)k | (uintptr_t)v) % 16 == 0 && (uintptr_t)out % 4 == 0;
}

/* Whether workspace holds the chunked form's scratch for T tokens in n_seqs
 * sequences; logs once where it does not. */
static bool workspace_fits(const void *workspace, size_t bytes, int T, int n_seqs, int nk, int nv,
                           int dk, int dv)
{
    size_t need = dr_plan(T, n_seqs, nk, nv, dk, dv).total;
    if (workspace && bytes >= need) return true;
    hs_error("delta_rule: workspace of %zu bytes, %zu needed for %d tokens in %d sequences "
             "(plan it with hs_kn_delta_rule_workspace_bytes)",
             workspace ? bytes : 0, need, T, n_seqs);
    return false;
}

static hs_status_t check_shape(int n_seqs, int T, int nk, int nv, int dk, int dv,
                               int64_t out_stride)
{
    if (n_seqs <= 0 || n_seqs > 65535 || nk <= 0 || nv % nk != 0 || dk <= 0 || dk > 256 ||
        dv <= 0 || dv > 256 || out_stride < (int64_t)nv * dv) {
        hs_error("delta_rule: bad shape (n_seqs %d, T %d, heads %d/%d, dk %d, dv %d, out_stride "
                 "%lld)",
                 n_seqs, T, nk, nv, dk, dv, (long long)out_stride);
        return HS_ERR_INVALID;
    }
    return HS_OK;
}

extern "C" size_t hs_kn_delta_rule_workspace_bytes(int max_tokens, int max_seqs, int n_k_heads,
                                                   int n_v_heads, int dk, int dv)
{
    if (max_tokens <= 0 || max_seqs <= 0 || n_k_heads <= 0 || n_v_heads <= 0 ||
        !chunked_shape(dk, dv))
        return 0;
    return dr_plan(max_tokens, max_seqs, n_k_heads, n_v_heads, dk, dv).total;
}

extern "C" hs_status_t hs__kn_delta_rule_recurrent(const void *q, const void *k, const void *v,
                                                   int64_t stride, const float *g,
                                                   const float *beta, void *out, int64_t out_stride,
                                                   const int32_t *cu_seqlens, int n_seqs, int T,
                                                   int n_k_heads, int n_v_heads, int dk, int dv,
                                                   cudaStream_t stream)
{
    if (T <= 0) return HS_OK;
    hs_status_t st = check_shape(n_seqs, T, n_k_heads, n_v_heads, dk, dv, out_stride);
    if (st != HS_OK) return st;
    return recurrent_launch(q, k, v, stride, g, beta, out, out_stride, cu_seqlens, n_seqs,
                            n_k_heads, n_v_heads, dk, dv, stream);
}

extern "C" hs_status_t hs__kn_delta_rule_chunked(
    const void *q, const void *k, const void *v, int64_t stride, const float *g, const float *beta,
    void *out, int64_t out_stride, const int32_t *cu_seqlens, int n_seqs, int T, int n_k_heads,
    int n_v_heads, int dk, int dv, void *workspace, size_t workspace_bytes, cudaStream_t stream)
{
    if (T <= 0) return HS_OK;
    hs_status_t st = check_shape(n_seqs, T, n_k_heads, n_v_heads, dk, dv, out_stride);
    if (st != HS_OK) return st;
    if (!chunked_shape(dk, dv) || !chunked_aligned(q, k, v, stride, out, out_stride)) {
        hs_error(
            "delta_rule: the chunked kernel needs dk, dv of 64 or 128 and 16-byte aligned rows "
            "(dk %d, dv %d, stride %lld)",
            dk, dv, (long long)stride);
        return HS_ERR_INVALID;
    }
    if (!workspace_fits(workspace, workspace_bytes, T, n_seqs, n_k_heads, n_v_heads, dk, dv))
        return HS_ERR_INVALID;
    dr_layout L = dr_plan(T, n_seqs, n_k_heads, n_v_heads, dk, dv);
    return chunked_launch(q, k, v, stride, g, beta, out, out_stride, cu_seqlens, n_seqs, T,
                          n_k_heads, n_v_heads, dk, dv, workspace, L, stream);
}

extern "C" hs_status_t hs_kn_delta_rule(const void *q, const void *k, const void *v, int64_t stride,
                                        const float *g, const float *beta, void *out,
                                        int64_t out_stride, const int32_t *cu_seqlens, int n_seqs,
                                        int T, int n_k_heads, int n_v_heads, int dk, int dv,
                                        void *workspace, size_t workspace_bytes,
                                        cudaStream_t stream)
{
    if (T <= 0) return HS_OK;
    hs_status_t st = check_shape(n_seqs, T, n_k_heads, n_v_heads, dk, dv, out_stride);
    if (st != HS_OK) return st;
    if (!chunked_shape(dk, dv)) /* no workspace needed */
        return recurrent_launch(q, k, v, stride, g, beta, out, out_stride, cu_seqlens, n_seqs,
                                n_k_heads, n_v_heads, dk, dv, stream);
    if (!workspace_fits(workspace, workspace_bytes, T, n_seqs, n_k_heads, n_v_heads, dk, dv))
        return HS_ERR_INVALID;
    if (chunked_aligned(q, k, v, stride, out, out_stride) && T >= HS__DELTA_RULE_CHUNKED_MIN_TOKENS)
        return hs__kn_delta_rule_chunked(q, k, v, stride, g, beta, out, out_stride, cu_seqlens,
                                         n_seqs, T, n_k_heads, n_v_heads, dk, dv, workspace,
                                         workspace_bytes, stream);
    return recurrent_launch(q, k, v, stride, g, beta, out, out_stride, cu_seqlens, n_seqs,
                            n_k_heads, n_v_heads, dk, dv, stream);
}
