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

extern "C" size_t hs_kn_delta_rule_workspace_bytes(int max_tokens, int max_seqs, int n_k_heads,
                                                   int n_v_heads, int dk, int dv)
{
    (void)max_tokens, (void)max_seqs, (void)n_k_heads, (void)n_v_heads, (void)dk, (void)dv;
    return 0;
}

extern "C" int hs_kn_delta_rule(const void *q, const void *k, const void *v, int64_t stride,
                                const float *g, const float *beta, void *out, int64_t out_stride,
                                const int32_t *cu_seqlens, int n_seqs, int T, int n_k_heads,
                                int n_v_heads, int dk, int dv, void *workspace,
                                size_t workspace_bytes, cudaStream_t stream)
{
    if (T <= 0) return HS_OK;
    if (n_seqs <= 0 || n_seqs > 65535 || n_k_heads <= 0 || n_v_heads % n_k_heads != 0 || dk <= 0 ||
        dk > 256 || dv <= 0 || dv > 256 || out_stride < (int64_t)n_v_heads * dv) {
        hs_error("delta_rule: bad shape (n_seqs %d, heads %d/%d, dk %d, dv %d, out_stride %lld)",
                 n_seqs, n_k_heads, n_v_heads, dk, dv, (long long)out_stride);
        return HS_ERR_INVALID;
    }
    (void)workspace, (void)workspace_bytes;
    return recurrent_launch(q, k, v, stride, g, beta, out, out_stride, cu_seqlens, n_seqs,
                            n_k_heads, n_v_heads, dk, dv, stream);
}
