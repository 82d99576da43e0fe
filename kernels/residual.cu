/* SPDX-License-Identifier: Apache-2.0 */
/* residual.cu - residual add on CUDA: out[i] = bf16(a[i] + b[i]), fp32 sum.
 *
 * The forward folds its residual adds into the o_proj and down_proj GEMMs
 * (cuBLASLt with beta = 1, in place); this kernel serves other callers and
 * is the GPU twin of hs_kn_residual_add_ref. out may equal a or b. */
#include <cuda_bf16.h>
#include <stdint.h>

#include "cublaslt.h"
#include "residual.h"

typedef __nv_bfloat16 bf16;

__global__ void residual_add_kernel_vec(const uint4 *a, const uint4 *b, uint4 *out, size_t n8)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n8;
         i += (size_t)gridDim.x * blockDim.x) {
        uint4 av = a[i], bv = b[i], ov;
        const bf16 *ae = (const bf16 *)&av, *be = (const bf16 *)&bv;
        bf16 *oe = (bf16 *)&ov;
#pragma unroll
        for (int j = 0; j < 8; j++)
            oe[j] = __float2bfloat16(__bfloat162float(ae[j]) + __bfloat162float(be[j]));
        out[i] = ov;
    }
}

__global__ void residual_add_kernel(const bf16 *a, const bf16 *b, bf16 *out, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        out[i] = __float2bfloat16(__bfloat162float(a[i]) + __bfloat162float(b[i]));
}

extern "C" hs_status_t hs_kn_residual_add(const void *a, const void *b, void *out, size_t n,
                                          cudaStream_t stream)
{
    if (n == 0) return HS_OK;
    const int threads = 256;
    bool vec = n % 8 == 0 && ((uintptr_t)a | (uintptr_t)b | (uintptr_t)out) % 16 == 0;
    size_t work = vec ? n / 8 : n;
    size_t blocks = (work + threads - 1) / threads;
    if (blocks > 132 * 32) blocks = 132 * 32;
    if (vec)
        residual_add_kernel_vec<<<(unsigned)blocks, threads, 0, stream>>>(
            (const uint4 *)a, (const uint4 *)b, (uint4 *)out, work);
    else
        residual_add_kernel<<<(unsigned)blocks, threads, 0, stream>>>(
            (const bf16 *)a, (const bf16 *)b, (bf16 *)out, n);
    return HS_CUDA_LAUNCH_CHECK("residual add kernel");
}
