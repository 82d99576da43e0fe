/* SPDX-License-Identifier: Apache-2.0 */
/* sigmoid_gate.cu - the output gate of Qwen3.5's gated attention on CUDA.
 *
 * x[t, i] = bf16( x[t, i] * bf16(sigmoid(gate[t, i])) ), sigmoid(g) =
 * 1 / (1 + e^-g) in fp32, with transformers' bf16 roundings (torch.sigmoid
 * of a bf16 tensor, then the bf16 product). x is the attention output
 * [T, n] (row stride x_stride), gated in place; gate [T, n] (row stride
 * gate_stride) is the gate part of the fused q_proj rows. */
#include <cuda_bf16.h>
#include <stdint.h>

#include "cublaslt.h"
#include "sigmoid_gate.h"

typedef __nv_bfloat16 bf16;

__device__ __forceinline__ bf16 gate1(bf16 x, bf16 g)
{
    float gf = __bfloat162float(g);
    float s = __bfloat162float(__float2bfloat16(1.f / (1.f + __expf(-gf))));
    return __float2bfloat16(__bfloat162float(x) * s);
}

__global__ void sigmoid_gate_kernel_vec(bf16 *x, int64_t x_stride, const bf16 *gate,
                                        int64_t gate_stride, int n)
{
    int t = blockIdx.y;
    int i = (blockIdx.x * blockDim.x + threadIdx.x) * 8;
    if (i >= n) return;
    bf16 *xr = x + (int64_t)t * x_stride + i;
    uint4 xv = *(const uint4 *)xr, gv = *(const uint4 *)(gate + (int64_t)t * gate_stride + i);
    bf16 *xe = (bf16 *)&xv;
    const bf16 *ge = (const bf16 *)&gv;
#pragma unroll
    for (int j = 0; j < 8; j++)
        xe[j] = gate1(xe[j], ge[j]);
    *(uint4 *)xr = xv;
}

__global__ void sigmoid_gate_kernel(bf16 *x, int64_t x_stride, const bf16 *gate,
                                    int64_t gate_stride, int n)
{
    int t = blockIdx.y;
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    bf16 *xr = x + (int64_t)t * x_stride + i;
    *xr = gate1(*xr, gate[(int64_t)t * gate_stride + i]);
}

extern "C" hs_status_t hs_kn_sigmoid_gate(void *x, int64_t x_stride, const void *gate,
                                          int64_t gate_stride, int T, int n, cudaStream_t stream)
{
    if (T <= 0 || n <= 0) return HS_OK;
    bool vec = n % 8 == 0 && x_stride % 8 == 0 && gate_stride % 8 == 0 &&
               ((uintptr_t)x | (uintptr_t)gate) % 16 == 0;
    const int threads = 128;
    /* rows go in grid.y (at most 65535 per launch) */
    for (int t0 = 0; t0 < T; t0 += 65535) {
        int rows = T - t0 < 65535 ? T - t0 : 65535;
        bf16 *xr = (bf16 *)x + (int64_t)t0 * x_stride;
        const bf16 *gr = (const bf16 *)gate + (int64_t)t0 * gate_stride;
        if (vec) {
            dim3 grid((n / 8 + threads - 1) / threads, rows);
            sigmoid_gate_kernel_vec<<<grid, threads, 0, stream>>>(xr, x_stride, gr, gate_stride, n);
        } else {
            dim3 grid((n + threads - 1) / threads, rows);
            sigmoid_gate_kernel<<<grid, threads, 0, stream>>>(xr, x_stride, gr, gate_stride, n);
        }
    }
    return HS_CUDA_LAUNCH_CHECK("sigmoid gate kernel");
}
