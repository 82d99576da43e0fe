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
#include "mma_bf16.cuh"
#include "wgmma.cuh"
#include "hs_log.h"

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
 *     k, A and P = [exp(gc_i - gc_j) q~_i . k~_j]_{j<=i} from the
 *     accumulators of k k^T and q k^T, X by blocked forward substitution
 *     (diagonal blocks in fp32, block rows on tensor cores with hi + lo
 *     operands), then w = Xw k and u = Xu v with the row scales in X's
 *     columns, Xw = X diag(beta G kinv), Xu = X diag(beta), each split
 *     into two bf16 halves, hi + lo, so the product keeps fp32's precision
 *     of X and k, v are used as loaded; w, u, P, gc and the state pass's
 *     row scales of q and k (G qinv, d kinv) go to the workspace.
 *   chunk_state (per value head and sequence, over the chunks in order):
 *     the state lives in fp32 mma accumulators, 16 value columns a warp
 *     (the columns never mix); per chunk v' = u - w S0, o = G (q S0) +
 *     P v', S = G_{n-1} S + (d k~)^T v' with d_j = exp(gc_{n-1} - gc_j),
 *     the next chunk loaded by cp.async meanwhile.
 * q and k are read raw (bf16) and their inverse norms folded into row
 * scales, so they are never written back normalised. Matrix products are
 * mma.sync bf16 x bf16 -> fp32; w, u, v', P, the row-scaled v' of the
 * state's update and the state as a product operand are rounded to bf16,
 * the state itself stays fp32. */
/* The prep runs blocks of 8 warps, three an SM (73 KB of shared memory
 * each, 80 registers a thread): it is latency-bound, so warps an SM count
 * (at 4 warps a block and two blocks ncu on the H200 found no warp eligible
 * to issue in 57% of the cycles). */
enum { CH = 64, PREP_THREADS = 256 };

/* Four 8 x 8 bf16 matrices from fragments (a pair a thread) to shared
 * memory, as they are (stmatrix_x4) or transposed (stmatrix_x4_trans); p is
 * this lane's row of matrix lane / 8. sm_90. */
__device__ __forceinline__ void stmatrix_x4(bf16 *p, uint32_t r0, uint32_t r1, uint32_t r2,
                                            uint32_t r3)
{
    unsigned a = (unsigned)__cvta_generic_to_shared(p);
    asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1,%2,%3,%4};\n" ::"r"(a),
                 "r"(r0), "r"(r1), "r"(r2), "r"(r3)
                 : "memory");
}

__device__ __forceinline__ void stmatrix_x4_trans(bf16 *p, uint32_t r0, uint32_t r1, uint32_t r2,
                                                  uint32_t r3)
{
    unsigned a = (unsigned)__cvta_generic_to_shared(p);
    asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1,%2,%3,%4};\n" ::"r"(a),
                 "r"(r0), "r"(r1), "r"(r2), "r"(r3)
                 : "memory");
}

__device__ __forceinline__ float2 bf16x2_float2(uint32_t x)
{
    return __bfloat1622float2(*(__nv_bfloat162 *)&x);
}

/* The 8 x 8 bf16 matrix a warp holds one pair a thread of, transposed. */
__device__ __forceinline__ uint32_t movmatrix_trans(uint32_t x)
{
    uint32_t y;
    asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;\n" : "=r"(y) : "r"(x));
    return y;
}

/* A warp's 16 x 32 bf16 tile to the first n_rows of its rows at dst (row
 * stride ld_dst): p[hr][x] is the thread's pair of rows fr + 8 hr, columns
 * 8 x + 2 fc, + 1 (fr = lane / 4, fc = lane % 4), as m16n8 accumulators
 * hold them. Through the warp's staging tile in shared memory (16 rows of
 * TILE_LD bf16, 16-byte aligned) to 64-byte row segments: a quarter of the
 * store instructions of writing the pairs, and no shuffles. */
enum { TILE_LD = 32 + 8 };

__device__ __forceinline__ void store_warp_tile(const uint32_t (&p)[2][4], bf16 *stage, bf16 *dst,
                                                int64_t ld_dst, int n_rows)
{
    const int lane = threadIdx.x & 31;
#if __CUDA_ARCH__ >= 900
    const int row = (lane & 7) + ((lane >> 3) & 1) * 8, col = (lane >> 4) * 8;
    stmatrix_x4(stage + row * TILE_LD + col, p[0][0], p[1][0], p[0][1], p[1][1]);
    stmatrix_x4(stage + row * TILE_LD + 16 + col, p[0][2], p[1][2], p[0][3], p[1][3]);
#else /* no stmatrix before sm_90 */
#pragma unroll
    for (int hr = 0; hr < 2; hr++)
#pragma unroll
        for (int x = 0; x < 4; x++)
            *(uint32_t *)(stage + ((lane >> 2) + 8 * hr) * TILE_LD + 8 * x + 2 * (lane & 3)) =
                p[hr][x];
#endif
    __syncwarp();
#pragma unroll
    for (int r = lane >> 2; r < 16; r += 8)
        if (r < n_rows)
            *(uint4 *)(dst + (int64_t)r * ld_dst + (lane & 3) * 8) =
                *(const uint4 *)(stage + r * TILE_LD + (lane & 3) * 8);
    __syncwarp();
}

/* An fp32 16 x 16 tile (row-major, ld) as the A operand, and a 16 x 8 one
 * (rows = k) as the B operand, of m16n8k16, each value split into bf16
 * hi + lo; mma3 accumulates hi hi + hi lo + lo hi, about 16 bits of each
 * operand, for the solve's products. */
__device__ __forceinline__ void split_bf16(float x, float y, uint32_t *hi, uint32_t *lo)
{
    __nv_bfloat162 h = __floats2bfloat162_rn(x, y);
    float2 back = __bfloat1622float2(h);
    *hi = *(uint32_t *)&h;
    *lo = pack_bf16(x - back.x, y - back.y);
}

__device__ __forceinline__ void frag_a_split(uint32_t hi[4], uint32_t lo[4], const float *m, int ld)
{
    const int g = (threadIdx.x & 31) >> 2, t = threadIdx.x & 3;
    const float *r0 = m + g * ld + 2 * t, *r1 = r0 + 8 * ld;
    split_bf16(r0[0], r0[1], &hi[0], &lo[0]);
    split_bf16(r1[0], r1[1], &hi[1], &lo[1]);
    split_bf16(r0[8], r0[9], &hi[2], &lo[2]);
    split_bf16(r1[8], r1[9], &hi[3], &lo[3]);
}

__device__ __forceinline__ void frag_b_split(uint32_t hi[2], uint32_t lo[2], const float *m, int ld)
{
    const int g = (threadIdx.x & 31) >> 2, t = threadIdx.x & 3;
    const float *c = m + 2 * t * ld + g;
    split_bf16(c[0], c[ld], &hi[0], &lo[0]);
    split_bf16(c[8 * ld], c[9 * ld], &hi[1], &lo[1]);
}

__device__ __forceinline__ void mma3(float (&d)[4], const uint32_t (&ah)[4],
                                     const uint32_t (&al)[4], const uint32_t bh[2],
                                     const uint32_t bl[2])
{
    mma_bf16(d, ah, bh[0], bh[1]);
    mma_bf16(d, ah, bl[0], bl[1]);
    mma_bf16(d, al, bh[0], bh[1]);
}

/* Workspace, each part 256-byte aligned; rows padded by one chunk so that a
 * short last chunk's fragment loads stay inside. */
struct dr_layout {
    size_t chunks, n_chunks, qs, ks, gc, w, u, p, total;
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
    L.qs = at, at = dr_align(at + rows * nv * sizeof(float));
    L.ks = at, at = dr_align(at + rows * nv * sizeof(float));
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

/* Starts the copy of CH rows x COLS bf16 from global rows (row stride
 * ld_src) into shared rows (ld_dst), zeros past row n, as 16-byte cp.async
 * by a block of THREADS (all in flight at once, in the caller's commit
 * group); 16-byte aligned rows. Each thread copies the same column of
 * every (THREADS / (COLS / 8))-th row. */
template <int COLS, int THREADS>
__device__ __forceinline__ void issue_rows(bf16 *dst, int ld_dst, const bf16 *src, int64_t ld_src,
                                           int n)
{
    constexpr int PER_ROW = COLS / 8, STEP = THREADS / PER_ROW;
    static_assert(THREADS % PER_ROW == 0 && CH % STEP == 0, "rows in whole passes");
    const int r0 = threadIdx.x / PER_ROW, c = (threadIdx.x % PER_ROW) * 8;
    const unsigned d = (unsigned)__cvta_generic_to_shared(dst + r0 * ld_dst + c);
    const bf16 *from = src + r0 * ld_src + c;
#pragma unroll
    for (int p = 0; p < CH / STEP; p++) { /* a constant count: no loop left per chunk */
        const bool in = r0 + p * STEP < n;
        asm volatile(
            "cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d + p * STEP * ld_dst * 2),
            "l"(in ? from + p * STEP * ld_src : src), "r"(in ? 16 : 0)); /* 0 bytes read past n */
    }
}

/* issue_rows as a commit group of its own; complete with load_rows_wait()
 * and a barrier. */
template <int COLS, int THREADS>
__device__ __forceinline__ void load_rows(bf16 *dst, int ld_dst, const bf16 *src, int64_t ld_src,
                                          int n)
{
    issue_rows<COLS, THREADS>(dst, ld_dst, src, ld_src, n);
    cp_async_commit();
}

__device__ __forceinline__ void load_rows_wait(void)
{
    asm volatile("cp.async.wait_all;\n" ::: "memory");
}

template <int DK, int DV>
__global__ void __launch_bounds__(PREP_THREADS, 3)
    chunk_prep_kernel(const bf16 *__restrict__ q, const bf16 *__restrict__ k,
                      const bf16 *__restrict__ v, int64_t stride, const float *__restrict__ g,
                      const float *__restrict__ beta, const int2 *__restrict__ chunks,
                      const int *__restrict__ n_chunks, int ratio, int nk, int nv,
                      float *__restrict__ qs_ws, float *__restrict__ ks_ws,
                      float *__restrict__ gc_ws, bf16 *__restrict__ w_ws, bf16 *__restrict__ u_ws,
                      bf16 *__restrict__ p_ws)
{
    constexpr int LDK = DK + 8, LDV = DV + 8, LDF = CH + 8;
    extern __shared__ __align__(128) unsigned char smem[];
    bf16 *Ks = (bf16 *)smem;                     /* k as loaded */
    bf16 *Qs = Ks + CH * LDK;                    /* raw q, then P's staging, then X */
    bf16 *Vs = (bf16 *)((float *)Qs + CH * LDF); /* v as loaded */
    float *A = (float *)(Vs + CH * LDV);         /* A, then w's and u's staging */
    float *X = (float *)Qs;
    float *gcs = A + CH * LDF, *betas = gcs + CH, *qinvs = betas + CH, *kinvs = qinvs + CH;
    float *kscale = kinvs + CH; /* beta G kinv per row: w's column scales */

    /* value heads fastest: the heads of a key head run side by side and
     * read its q and k rows from L2 */
    const int c = blockIdx.x / nv, h = blockIdx.x % nv;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    if (c >= *n_chunks) return;
    const int2 ch = chunks[c];
    const int t0 = ch.x, n = ch.y, hk = h / ratio;
    const float scale = rsqrtf((float)DK);

    load_rows<DK, PREP_THREADS>(Ks, LDK, k + (int64_t)t0 * stride + (int64_t)hk * DK, stride, n);
    load_rows<DK, PREP_THREADS>(Qs, LDK, q + (int64_t)t0 * stride + (int64_t)hk * DK, stride, n);
    load_rows<DV, PREP_THREADS>(Vs, LDV, v + (int64_t)t0 * stride + (int64_t)h * DV, stride, n);
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
#pragma unroll
        for (int col = part * (DK / 4); col < (part + 1) * (DK / 4); col += 8) { /* 16 bytes */
            const uint4 q8 = *(const uint4 *)(Qs + r * LDK + col),
                        k8 = *(const uint4 *)(Ks + r * LDK + col);
            const uint32_t qw[4] = {q8.x, q8.y, q8.z, q8.w}, kw[4] = {k8.x, k8.y, k8.z, k8.w};
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const float2 a = bf16x2_float2(qw[e]), b = bf16x2_float2(kw[e]);
                sq += a.x * a.x + a.y * a.y, sk += b.x * b.x + b.y * b.y;
            }
        }
        sq += __shfl_xor_sync(0xffffffffu, sq, 1);
        sk += __shfl_xor_sync(0xffffffffu, sk, 1);
        sq += __shfl_xor_sync(0xffffffffu, sq, 2);
        sk += __shfl_xor_sync(0xffffffffu, sk, 2);
        if (!part) {
            qinvs[r] = rsqrtf(sq + 1e-6f) * scale;
            kinvs[r] = rsqrtf(sk + 1e-6f);
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

    /* k k^T and q k^T on mma.sync, warp w taking rows 16 (w % 4) .. + 15
     * and columns 32 (w / 4) .. + 31; from the accumulators A (strictly
     * lower) to shared memory and P (lower with the diagonal) to the
     * workspace */
    const int rt = warp & 3, half = warp >> 2;
    const int fr = lane >> 2, fc = lane & 3; /* a fragment's row, column pair */
    {
        float kk[4][4], qk[4][4];
#pragma unroll
        for (int x = 0; x < 4; x++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                kk[x][e] = qk[x][e] = 0.f;
        const int arow = (rt * 16 + (lane & 15)) * LDK + (lane >> 4) * 8;
        const int brow = (half * 32 + (lane & 7) + (lane >> 4) * 8) * LDK + ((lane >> 3) & 1) * 8;
#pragma unroll
        for (int kt = 0; kt < DK / 16; kt++) {
            uint32_t ak[4], aq[4];
            ldsm_x4(ak, Ks + arow + kt * 16);
            ldsm_x4(aq, Qs + arow + kt * 16);
#pragma unroll
            for (int x = 0; x < 4; x += 2) {
                uint32_t b[4];
                ldsm_x4(b, Ks + brow + x * 8 * LDK + kt * 16);
                mma_bf16(kk[x], ak, b[0], b[1]);
                mma_bf16(kk[x + 1], ak, b[2], b[3]);
                mma_bf16(qk[x], aq, b[0], b[1]);
                mma_bf16(qk[x + 1], aq, b[2], b[3]);
            }
        }
        __syncthreads(); /* the norms and the cumulative gate */
        if (tid < CH) {  /* the state pass's row scales of q and k; w's column scales */
            const float G = __expf(gcs[tid]);
            if (tid < n) {
                qs_ws[(int64_t)(t0 + tid) * nv + h] = G * qinvs[tid];
                ks_ws[(int64_t)(t0 + tid) * nv + h] = __expf(gcs[n - 1] - gcs[tid]) * kinvs[tid];
            }
            kscale[tid] = betas[tid] * G * kinvs[tid];
        }
        /* A and P from this warp's rows; the column factors of its 8
         * columns held in registers; a tile wholly above the diagonal is
         * zero (no exponentials). P goes out through a staging tile in q's
         * place, free once the products above are done. */
        uint32_t pp[2][4];
        float2 gcj[4], kj[4]; /* columns j, j + 1 of tile x */
        const int j0 = half * 32 + 2 * fc;
#pragma unroll
        for (int x = 0; x < 4; x++) {
            gcj[x] = *(const float2 *)(gcs + j0 + 8 * x);
            kj[x] = *(const float2 *)(kinvs + j0 + 8 * x);
        }
        const bool above = half * 32 > rt * 16 + 15; /* uniform over the warp */
#pragma unroll
        for (int hr = 0; hr < 2; hr++) { /* rows fr and fr + 8 */
            const int i = rt * 16 + fr + 8 * hr;
            const float gi = gcs[i], ai = betas[i] * kinvs[i], qi = qinvs[i];
#pragma unroll
            for (int x = 0; x < 4; x++) {
                const int j = j0 + 8 * x;
                float a[2] = {0.f, 0.f}, p[2] = {0.f, 0.f};
                if (!above) {
#pragma unroll
                    for (int y = 0; y < 2; y++) {
                        const int jj = j + y;
                        const float gj = y ? gcj[x].y : gcj[x].x, kinv_j = y ? kj[x].y : kj[x].x;
                        const float d = jj <= i ? __expf(gi - gj) : 0.f;
                        a[y] = jj < i ? ai * kinv_j * d * kk[x][2 * hr + y] : 0.f;
                        p[y] = qi * kinv_j * d * qk[x][2 * hr + y];
                    }
                }
                *(float2 *)(A + i * LDF + j) = make_float2(a[0], a[1]);
                pp[hr][x] = pack_bf16(p[0], p[1]);
            }
        }
        store_warp_tile(pp, Qs + warp * 16 * TILE_LD,
                        p_ws + ((int64_t)(t0 + rt * 16) * nv + h) * CH + half * 32,
                        (int64_t)nv * CH, n - rt * 16);
    }
    __syncthreads();

    /* X = (I + A)^-1: the four diagonal 16 x 16 blocks by substitution, one
     * thread per column, each x_j subtracted from the rows below it as soon
     * as it is final (the same sums in the same order as row by row, with
     * a dependent chain of 15 steps instead of 120); then block rows 1..3:
     * X_ib = -X_ii sum_{b <= m < i} A_im X_mb. X's blocks above the
     * diagonal are never written or read (taken as zero). */
    if (tid < CH) {
        int b = tid >> 4, col = tid & 15, base = b * 16;
        float x[16];
#pragma unroll
        for (int r = 0; r < 16; r++)
            x[r] = r == col ? 1.f : 0.f;
#pragma unroll
        for (int j = 0; j < 15; j++)
#pragma unroll
            for (int r = j + 1; r < 16; r++)
                x[r] -= A[(base + r) * LDF + base + j] * x[j];
#pragma unroll
        for (int r = 0; r < 16; r++)
            X[(base + r) * LDF + base + col] = x[r];
    }
    __syncthreads();
    /* Block rows 1..3 on tensor cores: T = A[ib, :ib] X[:ib, :ib], then
     * X[ib, :ib] = -X_ii T; warp w < 2 ib takes columns 8w .. 8w + 7 of
     * both (X is lower: its k-steps start at block w / 2); T's accumulators
     * become the B operand by movmatrix (a transpose in registers). */
    for (int ib = 1; ib < 4; ib++) {
        if (warp < 2 * ib) {
            uint32_t ah[4], al[4], bh[2], bl[2];
            float acc[4] = {0.f, 0.f, 0.f, 0.f};
            for (int kb = warp / 2; kb < ib; kb++) {
                frag_a_split(ah, al, A + 16 * ib * LDF + 16 * kb, LDF);
                frag_b_split(bh, bl, X + 16 * kb * LDF + 8 * warp, LDF);
                mma3(acc, ah, al, bh, bl);
            }
            float x[4] = {0.f, 0.f, 0.f, 0.f};
            frag_a_split(ah, al, X + 16 * ib * LDF + 16 * ib, LDF);
            split_bf16(acc[0], acc[1], &bh[0], &bl[0]);
            split_bf16(acc[2], acc[3], &bh[1], &bl[1]);
#pragma unroll
            for (int e = 0; e < 2; e++)
                bh[e] = movmatrix_trans(bh[e]), bl[e] = movmatrix_trans(bl[e]);
            mma3(x, ah, al, bh, bl);
            float *xr0 = X + (16 * ib + fr) * LDF + 8 * warp + 2 * fc, *xr1 = xr0 + 8 * LDF;
            xr0[0] = -x[0], xr0[1] = -x[1], xr1[0] = -x[2], xr1[1] = -x[3];
        }
        __syncthreads();
    }

    /* w = Xw k, u = Xu v with the row scales in X's columns, so that k
     * and v are used as loaded: Xw = X diag(beta G kinv), Xu = X
     * diag(beta). Warp w takes row tile w % 4 and half the columns; X is
     * lower, so k-tiles past the row tile are zero and skipped. The A
     * fragments are made from X in fp32, scaled and split into hi + lo
     * bf16 (held across the columns); B = the rows of k or v; out through
     * a staging tile in A's place (A is no longer read). */
    const int rows_left = n - rt * 16;
    bf16 *stage = (bf16 *)A + warp * 16 * TILE_LD;
    auto product = [&](const float *col_scale, const bf16 *B, int ldb, int ncols, bf16 *dst,
                       int64_t ld_dst) {
        uint32_t ah[CH / 16][4], al[CH / 16][4];
        const float *x0 = X + (rt * 16 + fr) * LDF + 2 * fc, *x1 = x0 + 8 * LDF;
#pragma unroll
        for (int kt = 0; kt < CH / 16; kt++)
            if (kt <= rt) {
                const int col = 16 * kt;
                const float2 s0 = *(const float2 *)(col_scale + col + 2 * fc),
                             s1 = *(const float2 *)(col_scale + col + 8 + 2 * fc);
                const float2 a00 = *(const float2 *)(x0 + col), a10 = *(const float2 *)(x1 + col),
                             a01 = *(const float2 *)(x0 + col + 8),
                             a11 = *(const float2 *)(x1 + col + 8);
                split_bf16(a00.x * s0.x, a00.y * s0.y, &ah[kt][0], &al[kt][0]);
                split_bf16(a10.x * s0.x, a10.y * s0.y, &ah[kt][1], &al[kt][1]);
                split_bf16(a01.x * s1.x, a01.y * s1.y, &ah[kt][2], &al[kt][2]);
                split_bf16(a11.x * s1.x, a11.y * s1.y, &ah[kt][3], &al[kt][3]);
            }
        for (int nt = half * ncols / 16; nt < (half + 1) * ncols / 16; nt += 4) {
            float c[4][4];
#pragma unroll
            for (int x = 0; x < 4; x++)
                c[x][0] = c[x][1] = c[x][2] = c[x][3] = 0.f;
#pragma unroll
            for (int kt = 0; kt < CH / 16; kt++)
                if (kt <= rt) {
#pragma unroll
                    for (int x = 0; x < 4; x += 2) {
                        uint32_t bb[4];
                        ldsm_x4_t(bb, B + (kt * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * ldb +
                                          8 * (nt + x) + (lane >> 4) * 8);
                        mma_bf16(c[x], ah[kt], bb[0], bb[1]);
                        mma_bf16(c[x], al[kt], bb[0], bb[1]);
                        mma_bf16(c[x + 1], ah[kt], bb[2], bb[3]);
                        mma_bf16(c[x + 1], al[kt], bb[2], bb[3]);
                    }
                }
            uint32_t pc[2][4];
#pragma unroll
            for (int hr = 0; hr < 2; hr++)
#pragma unroll
                for (int x = 0; x < 4; x++)
                    pc[hr][x] = pack_bf16(c[x][2 * hr], c[x][2 * hr + 1]);
            store_warp_tile(pc, stage, dst + 8 * nt, ld_dst, rows_left);
        }
    };
    product(kscale, Ks, LDK, DK, w_ws + ((int64_t)(t0 + rt * 16) * nv + h) * DK, (int64_t)nv * DK);
    product(betas, Vs, LDV, DV, u_ws + ((int64_t)(t0 + rt * 16) * nv + h) * DV, (int64_t)nv * DV);
}

template <int DK, int DV> static size_t chunk_prep_smem(void)
{
    return (size_t)CH * (DK + 8) * 2 + (size_t)CH * (DV + 8) * 2 + (size_t)CH * (CH + 8) * 4 +
           (size_t)CH * (CH + 8) * 4 + 5 * CH * 4; /* Ks, Vs, Qs | X, A, gates */
}

/* ---- the state pass and the output ---------------------------------------
 * One block per (value head, sequence), DV / 16 warps. The value columns of
 * the delta rule never mix, so warp w owns the state's columns 16w .. 16w +
 * 15 for the whole sequence and waits on no other warp but for the shared
 * chunk loads. It keeps S^T [16 x DK] in fp32 mma.sync accumulators; an
 * m16n8k16 accumulator pair has the layout of an A operand, so S^T (and
 * v'^T) feed the next product from registers, rounded to bf16:
 *   v'^T = u^T - S^T w^T                       (B: w's rows, ldmatrix)
 *   o^T  = (S^T q^T) diag(G qinv) + v'^T P^T   (B: q's, P's rows)
 *   S^T  = G_{n-1} S^T + v'^T diag(d kinv) k   (B: k, ldmatrix.trans)
 * with d_j = exp(gc_{n-1} - gc_j). The row scales G qinv and d kinv, made
 * by the prep, land on the products' columns in fp32, so q and k are used
 * raw as loaded. The next
 * chunk's k, q, w, u, P and gates are loaded by cp.async while this one is
 * computed (two stages); o^T goes through a per-warp tile in shared memory
 * to 32-byte row segments of out. */

/* The A operand of the k-step over columns 16 kt .. 16 kt + 15 from an fp32
 * accumulator row strip (lo: tile 2 kt, hi: tile 2 kt + 1), each value
 * scaled by its column's factor (slo0, slo1: the thread's two columns of
 * lo; shi0, shi1: of hi; 1 for none). */
__device__ __forceinline__ void acc_as_a(uint32_t a[4], const float lo[4], const float hi[4],
                                         float slo0, float slo1, float shi0, float shi1)
{
    a[0] = pack_bf16(lo[0] * slo0, lo[1] * slo1);
    a[1] = pack_bf16(lo[2] * slo0, lo[3] * slo1);
    a[2] = pack_bf16(hi[0] * shi0, hi[1] * shi1);
    a[3] = pack_bf16(hi[2] * shi0, hi[3] * shi1);
}

/* Shared memory of one stage: rows of k, q, w (LDK), u (LDU), P (LDP), and
 * gc, G qinv, d kinv. */
template <int DK, int DV> struct state_stage {
    static constexpr int LDK = DK + 8, LDU = DV + 8, LDP = CH + 8;
    static constexpr size_t K = 0, Q = K + (size_t)CH * LDK * 2, W = Q + (size_t)CH * LDK * 2,
                            U = W + (size_t)CH * LDK * 2, P = U + (size_t)CH * LDU * 2,
                            GC = P + (size_t)CH * LDP * 2, QS = GC + CH * 4, KS = QS + CH * 4,
                            BYTES = KS + CH * 4;
};

/* A warp's o^T (16 value columns over a chunk's CH tokens, accumulators)
 * through its tile in shared memory (stmatrix.trans: rows of tokens) to 32
 * bytes of each of the first n rows at out (row stride out_stride). */
__device__ __forceinline__ void store_o_tile(const float (&O)[CH / 8][4], bf16 *ostage, bf16 *out,
                                             int64_t out_stride, int n)
{
    constexpr int LDO = 16 + 8;
    const int lane = threadIdx.x & 31;
#if __CUDA_ARCH__ >= 900
    const int lrow = (lane & 7) + (lane >> 4) * 8, lcol = ((lane >> 3) & 1) * 8;
#pragma unroll
    for (int i = 0; i < CH / 8; i += 2)
        stmatrix_x4_trans(ostage + (8 * i + lrow) * LDO + lcol, pack_bf16(O[i][0], O[i][1]),
                          pack_bf16(O[i][2], O[i][3]), pack_bf16(O[i + 1][0], O[i + 1][1]),
                          pack_bf16(O[i + 1][2], O[i + 1][3]));
#else /* no stmatrix before sm_90: the same tile by 2-byte stores */
    const int g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int i = 0; i < CH / 8; i++)
#pragma unroll
        for (int e = 0; e < 4; e++)
            ostage[(8 * i + 2 * t + (e & 1)) * LDO + g + 8 * (e >> 1)] = __float2bfloat16(O[i][e]);
#endif
    __syncwarp();
#pragma unroll
    for (int r = lane >> 1; r < CH; r += 16)
        if (r < n)
            *(uint4 *)(out + (int64_t)r * out_stride + (lane & 1) * 8) =
                *(const uint4 *)(ostage + r * LDO + (lane & 1) * 8);
    __syncwarp();
}

/* Starts the copy of a chunk's three fp32 row scales (gc, G qinv, d kinv of
 * rows t0 .. t0 + n - 1 of value head h, zeros past n) into gcs, qss, kss
 * (CH floats apart), by a block of THREADS; the choice of source is
 * uniform over each 64 threads. */
template <int THREADS>
__device__ __forceinline__ void issue_row_scales(float *gcs, const float *gc_ws, const float *qs_ws,
                                                 const float *ks_ws, int64_t t0, int n, int nv,
                                                 int h)
{
#pragma unroll
    for (int p = 0; p < (3 * CH + THREADS - 1) / THREADS; p++) {
        const int i = threadIdx.x + p * THREADS, r = i % CH, which = i / CH;
        if (i >= 3 * CH) break;
        const float *src = which == 0 ? gc_ws : which == 1 ? qs_ws : ks_ws;
        const bool in = r < n;
        asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(
                         (unsigned)__cvta_generic_to_shared(gcs + i)),
                     "l"(src + (in ? t0 + r : t0) * nv + h), "r"(in ? 4 : 0));
    }
}

template <int DK, int DV>
__global__ void __launch_bounds__(DV / 16 * 32, 1)
    chunk_state_kernel(const bf16 *__restrict__ q, const bf16 *__restrict__ k, int64_t stride,
                       const int32_t *__restrict__ cu, int ratio, int nk, int nv,
                       const float *__restrict__ qs_ws, const float *__restrict__ ks_ws,
                       const float *__restrict__ gc_ws, const bf16 *__restrict__ w_ws,
                       const bf16 *__restrict__ u_ws, const bf16 *__restrict__ p_ws,
                       bf16 *__restrict__ out, int64_t out_stride)
{
    typedef state_stage<DK, DV> L;
    constexpr int LDK = L::LDK, LDU = L::LDU, LDP = L::LDP, LDO = 16 + 8;
    constexpr int NT = CH / 8, KT = DK / 8; /* token tiles, the state's dk tiles */
    constexpr int THREADS = DV / 16 * 32;
    extern __shared__ __align__(128) unsigned char smem[];
    bf16 *ostage = (bf16 *)(smem + 2 * L::BYTES) + (threadIdx.x >> 5) * CH * LDO;

    const int h = blockIdx.x, s = blockIdx.y, hk = h / ratio;
    const int lane = threadIdx.x & 31, t = lane & 3, dv0 = (threadIdx.x >> 5) * 16;
    const int start = cu[s], end = cu[s + 1];

    auto prefetch = [&](int stage, int t0) {
        unsigned char *b = smem + stage * L::BYTES;
        const int n = min(CH, end - t0);
        issue_rows<DK, THREADS>((bf16 *)(b + L::K), LDK,
                                k + (int64_t)t0 * stride + (int64_t)hk * DK, stride, n);
        issue_rows<DK, THREADS>((bf16 *)(b + L::Q), LDK,
                                q + (int64_t)t0 * stride + (int64_t)hk * DK, stride, n);
        issue_rows<DK, THREADS>((bf16 *)(b + L::W), LDK, w_ws + ((int64_t)t0 * nv + h) * DK,
                                (int64_t)nv * DK, n);
        issue_rows<DV, THREADS>((bf16 *)(b + L::U), LDU, u_ws + ((int64_t)t0 * nv + h) * DV,
                                (int64_t)nv * DV, n);
        issue_rows<CH, THREADS>((bf16 *)(b + L::P), LDP, p_ws + ((int64_t)t0 * nv + h) * CH,
                                (int64_t)nv * CH, n);
        issue_row_scales<THREADS>((float *)(b + L::GC), gc_ws, qs_ws, ks_ws, t0, n, nv, h);
        cp_async_commit();
    };

    float S[KT][4]; /* S^T: rows dv0 + g (+ 8), columns 8 j + 2 t (+ 1) */
#pragma unroll
    for (int j = 0; j < KT; j++)
        S[j][0] = S[j][1] = S[j][2] = S[j][3] = 0.f;

    if (start < end) prefetch(0, start);
    int stage = 0;
    for (int t0 = start; t0 < end; t0 += CH, stage ^= 1) {
        const int n = min(CH, end - t0);
        if (t0 + CH < end)
            prefetch(stage ^ 1, t0 + CH);
        else
            cp_async_commit();
        asm volatile("cp.async.wait_group 1;\n" ::: "memory");
        __syncthreads();
        const unsigned char *b = smem + stage * L::BYTES;
        const bf16 *Ks = (const bf16 *)(b + L::K), *Qs = (const bf16 *)(b + L::Q),
                   *Ws = (const bf16 *)(b + L::W), *Us = (const bf16 *)(b + L::U),
                   *Ps = (const bf16 *)(b + L::P);
        const float *gcs = (const float *)(b + L::GC), *qss = (const float *)(b + L::QS),
                    *kss = (const float *)(b + L::KS);

        /* w S0 and q S0, transposed: A = S^T from registers; B = rows of w
         * and q, two token tiles an ldmatrix */
        float V[NT][4], O[NT][4];
#pragma unroll
        for (int i = 0; i < NT; i++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                V[i][e] = O[i][e] = 0.f;
        const int lrow = (lane & 7) + (lane >> 4) * 8, lcol = ((lane >> 3) & 1) * 8;
#pragma unroll
        for (int kt = 0; kt < DK / 16; kt++) {
            uint32_t a[4];
            acc_as_a(a, S[2 * kt], S[2 * kt + 1], 1.f, 1.f, 1.f, 1.f);
#pragma unroll
            for (int i = 0; i < NT; i += 2) {
                uint32_t bw[4], bq[4];
                ldsm_x4(bw, Ws + (8 * i + lrow) * LDK + 16 * kt + lcol);
                ldsm_x4(bq, Qs + (8 * i + lrow) * LDK + 16 * kt + lcol);
                mma_bf16(V[i], a, bw[0], bw[1]);
                mma_bf16(V[i + 1], a, bw[2], bw[3]);
                mma_bf16(O[i], a, bq[0], bq[1]);
                mma_bf16(O[i + 1], a, bq[2], bq[3]);
            }
        }
        /* v'^T = u^T - w S0 ^T, u^T in the accumulators' layout by
         * ldmatrix.trans of u's rows; o^T columns scaled by G qinv */
#pragma unroll
        for (int i = 0; i < NT; i += 2) {
            uint32_t uu[4];
            ldsm_x4_t(uu, Us + (8 * i + lrow) * LDU + dv0 + lcol);
#pragma unroll
            for (int x = 0; x < 2; x++) {
                const float2 lo = bf16x2_float2(uu[2 * x]), hi = bf16x2_float2(uu[2 * x + 1]);
                float *vi = V[i + x];
                vi[0] = lo.x - vi[0], vi[1] = lo.y - vi[1], vi[2] = hi.x - vi[2],
                vi[3] = hi.y - vi[3];
                const int c0 = 8 * (i + x) + 2 * t;
                const float s0 = qss[c0], s1 = qss[c0 + 1];
                O[i + x][0] *= s0, O[i + x][1] *= s1, O[i + x][2] *= s0, O[i + x][3] *= s1;
            }
        }
        /* o^T += v'^T P^T; P is lower, so token tile i needs k-steps up to i / 2 */
#pragma unroll
        for (int kt = 0; kt < CH / 16; kt++) {
            uint32_t a[4];
            acc_as_a(a, V[2 * kt], V[2 * kt + 1], 1.f, 1.f, 1.f, 1.f);
#pragma unroll
            for (int i = 2 * kt; i < NT; i += 2) {
                uint32_t bp[4];
                ldsm_x4(bp, Ps + (8 * i + lrow) * LDP + 16 * kt + lcol);
                mma_bf16(O[i], a, bp[0], bp[1]);
                mma_bf16(O[i + 1], a, bp[2], bp[3]);
            }
        }
        store_o_tile(O, ostage, out + (int64_t)t0 * out_stride + (int64_t)h * DV + dv0, out_stride,
                     n);

        /* S^T = G_{n-1} S^T + v'^T diag(d kinv) k: B = k's rows transposed */
        const float decay = __expf(gcs[n - 1]);
#pragma unroll
        for (int j = 0; j < KT; j++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                S[j][e] *= decay;
#pragma unroll
        for (int kt = 0; kt < CH / 16; kt++) {
            const int c = 16 * kt + 2 * t;
            uint32_t a[4];
            acc_as_a(a, V[2 * kt], V[2 * kt + 1], kss[c], kss[c + 1], kss[c + 8], kss[c + 9]);
#pragma unroll
            for (int j = 0; j < KT; j += 2) {
                uint32_t bk[4];
                ldsm_x4_t(bk, Ks + (16 * kt + (lane & 7) + ((lane >> 3) & 1) * 8) * LDK + 8 * j +
                                  (lane >> 4) * 8);
                mma_bf16(S[j], a, bk[0], bk[1]);
                mma_bf16(S[j + 1], a, bk[2], bk[3]);
            }
        }
        __syncthreads(); /* the stage is free for the load after next */
    }
}

template <int DK, int DV> static size_t chunk_state_smem(void)
{
    return 2 * state_stage<DK, DV>::BYTES + (size_t)(DV / 16) * CH * (16 + 8) * 2;
}

/* ---- the state pass on wgmma (sm_90a) --------------------------------------
 * The same pass with each warpgroup's products on Hopper's asynchronous
 * warpgroup mma: a warpgroup holds 64 value columns of S^T (each warp its
 * 16, in the same accumulator layout as above) and issues a chunk's
 * products back to back, B read by the tensor cores straight from shared
 * memory (k, q, w and P in 128-byte swizzled panels, wgmma.cuh), so no
 * B fragment is loaded into registers. A chunk is four groups of
 * products, each wait leaving the next group on the tensor cores:
 *   1. S^T w^T, then S^T q^T (A = S^T in bf16, K-major B);
 *   2. once S^T w^T is done: v'^T = u^T - S^T w^T, the state decayed;
 *   3. S^T += v'^T diag(d kinv) k (k's rows as MN-major B); once S^T q^T
 *      is done, its columns scaled by G qinv;
 *   4. o^T += v'^T P^T (K-major). The same sums in the same order as the
 *      mma.sync pass: the same bits. */
template <int DK, int DV> struct wg_stage {
    static constexpr int LDU = DV + 8;
    static constexpr size_t PANELS = (size_t)DK / 64 * WG_PANEL_BYTES;
    static constexpr size_t K = 0, Q = K + PANELS, W = Q + PANELS, P = W + PANELS,
                            U = P + WG_PANEL_BYTES, GC = U + (size_t)CH * LDU * 2, QS = GC + CH * 4,
                            KS = QS + CH * 4, BYTES = (KS + CH * 4 + 1023) & ~(size_t)1023;
};

/* Starts the copy of CH rows x COLS bf16 into swizzled panels (zeros past
 * row n), as issue_rows does into padded rows. */
template <int COLS, int THREADS>
__device__ __forceinline__ void issue_rows_swizzled(unsigned char *dst, const bf16 *src,
                                                    int64_t ld_src, int n)
{
    constexpr int PER_ROW = COLS / 8, STEP = THREADS / PER_ROW;
    static_assert(THREADS % PER_ROW == 0 && CH % STEP == 0 && STEP % 8 == 0,
                  "rows in whole passes, each pass the same swizzle");
    const int r0 = threadIdx.x / PER_ROW, c = threadIdx.x % PER_ROW;
    const unsigned d = (unsigned)__cvta_generic_to_shared(dst) + wg_swizzle_offset(r0, c);
    const bf16 *from = src + r0 * ld_src + c * 8;
#pragma unroll
    for (int p = 0; p < CH / STEP; p++) {
        const bool in = r0 + p * STEP < n;
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d + p * STEP * 128),
                     "l"(in ? from + p * STEP * ld_src : src), "r"(in ? 16 : 0));
    }
}

template <int DK, int DV>
__global__ void __launch_bounds__(DV / 16 * 32, 1)
    chunk_state_wgmma_kernel(const bf16 *__restrict__ q, const bf16 *__restrict__ k, int64_t stride,
                             const int32_t *__restrict__ cu, int ratio, int nk, int nv,
                             const float *__restrict__ qs_ws, const float *__restrict__ ks_ws,
                             const float *__restrict__ gc_ws, const bf16 *__restrict__ w_ws,
                             const bf16 *__restrict__ u_ws, const bf16 *__restrict__ p_ws,
                             bf16 *__restrict__ out, int64_t out_stride)
{
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    typedef wg_stage<DK, DV> L;
    constexpr int LDU = L::LDU, LDO = 16 + 8;
    constexpr int NT = CH / 8, KT = DK / 8; /* token tiles, the state's dk tiles */
    constexpr int THREADS = DV / 16 * 32;
    extern __shared__ unsigned char smem_raw[];
    /* the swizzled panels need 1024-byte alignment: the launch adds the slack */
    unsigned char *smem = (unsigned char *)(((uintptr_t)smem_raw + 1023) & ~(uintptr_t)1023);
    bf16 *ostage = (bf16 *)(smem + 2 * L::BYTES) + (threadIdx.x >> 5) * CH * LDO;

    const int h = blockIdx.x, s = blockIdx.y, hk = h / ratio;
    const int lane = threadIdx.x & 31, t = lane & 3, dv0 = (threadIdx.x >> 5) * 16;
    const int start = cu[s], end = cu[s + 1];

    auto prefetch = [&](int stage, int t0) {
        unsigned char *b = smem + stage * L::BYTES;
        const int n = min(CH, end - t0);
        issue_rows_swizzled<DK, THREADS>(b + L::K, k + (int64_t)t0 * stride + (int64_t)hk * DK,
                                         stride, n);
        issue_rows_swizzled<DK, THREADS>(b + L::Q, q + (int64_t)t0 * stride + (int64_t)hk * DK,
                                         stride, n);
        issue_rows_swizzled<DK, THREADS>(b + L::W, w_ws + ((int64_t)t0 * nv + h) * DK,
                                         (int64_t)nv * DK, n);
        issue_rows_swizzled<CH, THREADS>(b + L::P, p_ws + ((int64_t)t0 * nv + h) * CH,
                                         (int64_t)nv * CH, n);
        issue_rows<DV, THREADS>((bf16 *)(b + L::U), LDU, u_ws + ((int64_t)t0 * nv + h) * DV,
                                (int64_t)nv * DV, n);
        issue_row_scales<THREADS>((float *)(b + L::GC), gc_ws, qs_ws, ks_ws, t0, n, nv, h);
        cp_async_commit();
    };

    float S[KT][4]; /* S^T: rows dv0 + g (+ 8), columns 8 j + 2 t (+ 1) */
#pragma unroll
    for (int j = 0; j < KT; j++)
        S[j][0] = S[j][1] = S[j][2] = S[j][3] = 0.f;

    if (start < end) prefetch(0, start);
    int stage = 0;
    for (int t0 = start; t0 < end; t0 += CH, stage ^= 1) {
        const int n = min(CH, end - t0);
        if (t0 + CH < end)
            prefetch(stage ^ 1, t0 + CH);
        else
            cp_async_commit();
        asm volatile("cp.async.wait_group 1;\n" ::: "memory");
        fence_proxy_async_shared();
        __syncthreads();
        const unsigned char *b = smem + stage * L::BYTES;
        const bf16 *Us = (const bf16 *)(b + L::U);
        const float *gcs = (const float *)(b + L::GC), *qss = (const float *)(b + L::QS),
                    *kss = (const float *)(b + L::KS);

        /* 1. w S0 then q S0, transposed, from S^T in bf16: two groups, so
         * that v' is formed while q S0 is still on the tensor cores */
        float V[NT][4], O[NT][4]; /* set by the first k-step (scale_d 0) */
        uint32_t a[DK / 16][4];
#pragma unroll
        for (int kt = 0; kt < DK / 16; kt++)
            acc_as_a(a[kt], S[2 * kt], S[2 * kt + 1], 1.f, 1.f, 1.f, 1.f);
        wg_fence();
#pragma unroll
        for (int kt = 0; kt < DK / 16; kt++)
            wgmma_m64n64k16<0>(V, a[kt], smem_desc_kmajor(b + L::W, kt), kt > 0);
        wg_commit();
#pragma unroll
        for (int kt = 0; kt < DK / 16; kt++)
            wgmma_m64n64k16<0>(O, a[kt], smem_desc_kmajor(b + L::Q, kt), kt > 0);
        wg_commit();
        wg_wait<1>();
        wg_pin(V);

        /* 2. v'^T = u^T - w S0 ^T (u^T by ldmatrix.trans of u's rows), its
         * two A forms, the state decayed */
        const int lrow = (lane & 7) + (lane >> 4) * 8, lcol = ((lane >> 3) & 1) * 8;
#pragma unroll
        for (int i = 0; i < NT; i += 2) {
            uint32_t uu[4];
            ldsm_x4_t(uu, Us + (8 * i + lrow) * LDU + dv0 + lcol);
#pragma unroll
            for (int x = 0; x < 2; x++) {
                const float2 lo = bf16x2_float2(uu[2 * x]), hi = bf16x2_float2(uu[2 * x + 1]);
                float *vi = V[i + x];
                vi[0] = lo.x - vi[0], vi[1] = lo.y - vi[1], vi[2] = hi.x - vi[2],
                vi[3] = hi.y - vi[3];
            }
        }
        uint32_t av[CH / 16][4], ak[CH / 16][4]; /* v'^T, and v'^T diag(d kinv) */
#pragma unroll
        for (int kt = 0; kt < CH / 16; kt++) {
            const int c = 16 * kt + 2 * t;
            acc_as_a(av[kt], V[2 * kt], V[2 * kt + 1], 1.f, 1.f, 1.f, 1.f);
            acc_as_a(ak[kt], V[2 * kt], V[2 * kt + 1], kss[c], kss[c + 1], kss[c + 8], kss[c + 9]);
        }
        const float decay = __expf(gcs[n - 1]);
#pragma unroll
        for (int j = 0; j < KT; j++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                S[j][e] *= decay;

        /* 3. S^T += v'^T diag(d kinv) k; meanwhile q S0's columns scaled by
         * G qinv; then o^T += v'^T P^T */
        wg_fence();
#pragma unroll
        for (int kt = 0; kt < CH / 16; kt++) {
            if constexpr (DK == 128)
                wgmma_m64n128k16<1>(S, ak[kt], smem_desc_mnmajor(b + L::K, kt), 1);
            else
                wgmma_m64n64k16<1>(S, ak[kt], smem_desc_mnmajor(b + L::K, kt), 1);
        }
        wg_commit();
        wg_wait<1>();
        wg_pin(O), wg_pin(a);
#pragma unroll
        for (int i = 0; i < NT; i++) {
            const float s0 = qss[8 * i + 2 * t], s1 = qss[8 * i + 2 * t + 1];
            O[i][0] *= s0, O[i][1] *= s1, O[i][2] *= s0, O[i][3] *= s1;
        }
        wg_fence();
#pragma unroll
        for (int kt = 0; kt < CH / 16; kt++)
            wgmma_m64n64k16<0>(O, av[kt], smem_desc_kmajor(b + L::P, kt), 1);
        wg_commit();
        wg_wait<0>();
        wg_pin(O), wg_pin(S), wg_pin(av), wg_pin(ak);

        store_o_tile(O, ostage, out + (int64_t)t0 * out_stride + (int64_t)h * DV + dv0, out_stride,
                     n);
        __syncthreads(); /* the stage is free for the load after next */
    }
#else
    __trap(); /* launched only where the build has sm_90a code and the GPU is sm_90 */
#endif
}

template <int DK, int DV> static size_t chunk_state_wgmma_smem(void)
{
    return 1024 + 2 * wg_stage<DK, DV>::BYTES + (size_t)(DV / 16) * CH * (16 + 8) * 2;
}

/* The chunked kernels' shapes: dk and dv of 64 or 128, dv in tiles of 64. */
static bool chunked_shape(int dk, int dv)
{
    return (dk == 64 || dk == 128) && (dv == 64 || dv == 128);
}

template <int DK, int DV>
static hs_status_t chunked_launch_t(const void *q, const void *k, const void *v, int64_t stride,
                                    const float *g, const float *beta, void *out,
                                    int64_t out_stride, const int32_t *cu, int n_seqs, int T,
                                    int nk, int nv, unsigned char *ws, const dr_layout &L,
                                    bool wgmma, cudaStream_t stream)
{
    /* the prep: a block per chunk and value head, in one dimension */
    uint64_t max_chunks = (uint64_t)((T + CH - 1) / CH + n_seqs);
    if (max_chunks > (uint64_t)T) max_chunks = (uint64_t)T;
    if (max_chunks * (uint64_t)nv > 0x7fffffffu) {
        hs_error("delta_rule: %llu chunks x %d value heads exceed one launch; split the batch",
                 (unsigned long long)max_chunks, nv);
        return HS_ERR_INVALID;
    }
    const unsigned prep_blocks = (unsigned)(max_chunks * (uint64_t)nv);
    /* the shared-memory opt-in is per device: a host-side call, set every time */
    auto state_kernel = wgmma ? chunk_state_wgmma_kernel<DK, DV> : chunk_state_kernel<DK, DV>;
    size_t prep_smem = chunk_prep_smem<DK, DV>();
    size_t state_smem = wgmma ? chunk_state_wgmma_smem<DK, DV>() : chunk_state_smem<DK, DV>();
    hs_status_t st = HS_CUDA_CHECK(cudaFuncSetAttribute(
        chunk_prep_kernel<DK, DV>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)prep_smem));
    if (st == HS_OK)
        st = HS_CUDA_CHECK(cudaFuncSetAttribute(
            state_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)state_smem));
    if (st != HS_OK) return st;
    int2 *chunks = (int2 *)(ws + L.chunks);
    int *n_chunks = (int *)(ws + L.n_chunks);
    float *qs = (float *)(ws + L.qs), *ks = (float *)(ws + L.ks), *gc = (float *)(ws + L.gc);
    bf16 *w = (bf16 *)(ws + L.w), *u = (bf16 *)(ws + L.u), *p = (bf16 *)(ws + L.p);
    chunk_schedule_kernel<<<1, 1024, 0, stream>>>(cu, n_seqs, chunks, n_chunks);
    chunk_prep_kernel<DK, DV><<<prep_blocks, PREP_THREADS, prep_smem, stream>>>(
        (const bf16 *)q, (const bf16 *)k, (const bf16 *)v, stride, g, beta, chunks, n_chunks,
        nv / nk, nk, nv, qs, ks, gc, w, u, p);
    state_kernel<<<dim3((unsigned)nv, (unsigned)n_seqs), DV / 16 * 32, state_smem, stream>>>(
        (const bf16 *)q, (const bf16 *)k, stride, cu, nv / nk, nk, nv, qs, ks, gc, w, u, p,
        (bf16 *)out, out_stride);
    return HS_CUDA_LAUNCH_CHECK("delta_rule chunked kernels");
}

static hs_status_t chunked_launch(const void *q, const void *k, const void *v, int64_t stride,
                                  const float *g, const float *beta, void *out, int64_t out_stride,
                                  const int32_t *cu, int n_seqs, int T, int nk, int nv, int dk,
                                  int dv, void *ws, const dr_layout &L, bool wgmma,
                                  cudaStream_t stream)
{
    unsigned char *b = (unsigned char *)(((uintptr_t)ws + 255) & ~(uintptr_t)255);
#define CHUNKED(DKT, DVT)                                                                          \
    if (dk == DKT && dv == DVT)                                                                    \
    return chunked_launch_t<DKT, DVT>(q, k, v, stride, g, beta, out, out_stride, cu, n_seqs, T,    \
                                      nk, nv, b, L, wgmma, stream)
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
    return stride % 8 == 0 && out_stride % 8 == 0 &&
           ((uintptr_t)q | (uintptr_t)k | (uintptr_t)v | (uintptr_t)out) % 16 == 0;
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

/* Whether this device runs the wgmma state pass: the build has sm_90a code
 * (HS_HAVE_SM90A) and the current GPU is sm_90, the one GPU it loads on;
 * elsewhere the mma.sync pass runs. */
static bool wgmma_usable(void)
{
#ifdef HS_HAVE_SM90A
    int dev = 0, major = 0, minor = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) != cudaSuccess)
        return false;
    return major == 9 && minor == 0;
#else
    return false;
#endif
}

extern "C" int hs__kn_delta_rule_wgmma(void) { return wgmma_usable(); }

static hs_status_t chunked_checked(const void *q, const void *k, const void *v, int64_t stride,
                                   const float *g, const float *beta, void *out, int64_t out_stride,
                                   const int32_t *cu_seqlens, int n_seqs, int T, int n_k_heads,
                                   int n_v_heads, int dk, int dv, void *workspace,
                                   size_t workspace_bytes, bool wgmma, cudaStream_t stream)
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
                          n_k_heads, n_v_heads, dk, dv, workspace, L, wgmma, stream);
}

extern "C" hs_status_t hs__kn_delta_rule_chunked(
    const void *q, const void *k, const void *v, int64_t stride, const float *g, const float *beta,
    void *out, int64_t out_stride, const int32_t *cu_seqlens, int n_seqs, int T, int n_k_heads,
    int n_v_heads, int dk, int dv, void *workspace, size_t workspace_bytes, cudaStream_t stream)
{
    return chunked_checked(q, k, v, stride, g, beta, out, out_stride, cu_seqlens, n_seqs, T,
                           n_k_heads, n_v_heads, dk, dv, workspace, workspace_bytes, wgmma_usable(),
                           stream);
}

extern "C" hs_status_t hs__kn_delta_rule_chunked_mma(
    const void *q, const void *k, const void *v, int64_t stride, const float *g, const float *beta,
    void *out, int64_t out_stride, const int32_t *cu_seqlens, int n_seqs, int T, int n_k_heads,
    int n_v_heads, int dk, int dv, void *workspace, size_t workspace_bytes, cudaStream_t stream)
{
    return chunked_checked(q, k, v, stride, g, beta, out, out_stride, cu_seqlens, n_seqs, T,
                           n_k_heads, n_v_heads, dk, dv, workspace, workspace_bytes, false, stream);
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
