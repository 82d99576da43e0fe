/* SPDX-License-Identifier: Apache-2.0 */
/* gdn_gates.cu - Gated DeltaNet's gates on CUDA (see gdn_gates.h):
 *   beta[t, h] = sigmoid(b[t, h])
 *   g[t, h]    = -exp(A_log[h]) * softplus(a[t, h] + dt_bias[h])
 * softplus(x) = log(1 + exp(x)), and x above 20 (PyTorch's threshold).
 * a, b bf16 columns of the projection's rows (strides a_stride, b_stride);
 * A_log, dt_bias, g, beta fp32. One thread per (token, head); fp32. */
#include <cuda_bf16.h>
#include <stdint.h>

#include "cublaslt.h"
#include "gdn_gates.h"
#include "hs_log.h"

typedef __nv_bfloat16 bf16;

__global__ void gdn_gates_kernel(const bf16 *__restrict__ a, int64_t a_stride,
                                 const bf16 *__restrict__ b, int64_t b_stride,
                                 const float *__restrict__ A_log, const float *__restrict__ dt_bias,
                                 float *__restrict__ g, float *__restrict__ beta, int64_t n,
                                 int n_heads)
{
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    int64_t t = i / n_heads;
    int h = (int)(i % n_heads);
    float x = __bfloat162float(a[t * a_stride + h]) + dt_bias[h];
    float sp = x > 20.f ? x : log1pf(expf(x));
    g[i] = -expf(A_log[h]) * sp;
    beta[i] = 1.f / (1.f + expf(-__bfloat162float(b[t * b_stride + h])));
}

extern "C" hs_status_t hs_kn_gdn_gates(const void *a, int64_t a_stride, const void *b,
                                       int64_t b_stride, const float *A_log, const float *dt_bias,
                                       float *g, float *beta, int T, int n_heads,
                                       cudaStream_t stream)
{
    if (T <= 0) return HS_OK;
    if (n_heads <= 0 || a_stride < n_heads || b_stride < n_heads) {
        hs_error("gdn_gates: bad shape (n_heads %d, strides %lld/%lld)", n_heads,
                 (long long)a_stride, (long long)b_stride);
        return HS_ERR_INVALID;
    }
    int64_t n = (int64_t)T * n_heads;
    const int threads = 256;
    gdn_gates_kernel<<<(unsigned)((n + threads - 1) / threads), threads, 0, stream>>>(
        (const bf16 *)a, a_stride, (const bf16 *)b, b_stride, A_log, dt_bias, g, beta, n, n_heads);
    return HS_CUDA_LAUNCH_CHECK("gdn_gates kernel");
}
