/* SPDX-License-Identifier: Apache-2.0 */
/* swiglu.cu - the gated MLP activation on CUDA.
 *
 * out[t, i] = bf16( bf16(silu(gate[t, i])) * up[t, i] ), silu(g) = g / (1 + e^-g)
 * in fp32, with Hugging Face's bf16 roundings (the activation's output, then
 * the product). gate and up are the two halves of the fused gate_up GEMM's
 * rows: gu [T, 2I] = [gate | up]; out [T, I] (row stride out_stride). */
#include <cuda_bf16.h>
#include <stdint.h>

#include "cublaslt.h"
#include "swiglu.cuh"
#include "swiglu.h"

typedef __nv_bfloat16 bf16;

__global__ void swiglu_kernel_vec(const bf16 *gu, int64_t gu_stride, bf16 *out, int64_t out_stride,
                                  int I)
{
    int t = blockIdx.y;
    int i = (blockIdx.x * blockDim.x + threadIdx.x) * 8;
    if (i >= I) return;
    const bf16 *g = gu + (int64_t)t * gu_stride;
    uint4 gv = *(const uint4 *)(g + i), uv = *(const uint4 *)(g + I + i);
    uint4 ov;
    const bf16 *ge = (const bf16 *)&gv, *ue = (const bf16 *)&uv;
    bf16 *oe = (bf16 *)&ov;
#pragma unroll
    for (int j = 0; j < 8; j++)
        oe[j] = hs_swiglu1(ge[j], ue[j]);
    *(uint4 *)(out + (int64_t)t * out_stride + i) = ov;
}

__global__ void swiglu_kernel(const bf16 *gu, int64_t gu_stride, bf16 *out, int64_t out_stride,
                              int I)
{
    int t = blockIdx.y;
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= I) return;
    const bf16 *g = gu + (int64_t)t * gu_stride;
    out[(int64_t)t * out_stride + i] = hs_swiglu1(g[i], g[I + i]);
}

extern "C" hs_status_t hs_kn_swiglu(const void *gu, int64_t gu_stride, void *out,
                                    int64_t out_stride, int T, int I, cudaStream_t stream)
{
    if (T <= 0) return HS_OK;
    bool vec = I % 8 == 0 && gu_stride % 8 == 0 && out_stride % 8 == 0 &&
               ((uintptr_t)gu | (uintptr_t)out) % 16 == 0;
    const int threads = 128;
    /* rows go in grid.y (at most 65535 per launch) */
    for (int t0 = 0; t0 < T; t0 += 65535) {
        int rows = T - t0 < 65535 ? T - t0 : 65535;
        const bf16 *g = (const bf16 *)gu + (int64_t)t0 * gu_stride;
        bf16 *o = (bf16 *)out + (int64_t)t0 * out_stride;
        if (vec) {
            dim3 grid((I / 8 + threads - 1) / threads, rows);
            swiglu_kernel_vec<<<grid, threads, 0, stream>>>(g, gu_stride, o, out_stride, I);
        } else {
            dim3 grid((I + threads - 1) / threads, rows);
            swiglu_kernel<<<grid, threads, 0, stream>>>(g, gu_stride, o, out_stride, I);
        }
    }
    return HS_CUDA_LAUNCH_CHECK("swiglu kernel");
}
