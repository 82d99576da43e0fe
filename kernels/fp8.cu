/* SPDX-License-Identifier: Apache-2.0 */
/* fp8.cu - e4m3 rows of hidden states on the GPU (see fp8.h).
 *
 * Quantise: one block per row; a strided pass finds amax (and any NaN or
 * infinity), a block reduction gives the scale, a second pass writes the
 * e4m3 bytes. Dequantise: each thread turns 16 bytes into 16 bf16 through a
 * table of the 256 codes where the row length allows, else one value.
 * Memory-bound both.
 * The scalar conversions are hs_float.h's, shared with the C twins, with
 * __fdiv_rn / __fmul_rn so no contraction or fast path changes a bit. */
#include <cuda_runtime.h>
#include <stdint.h>

#include "fp8.h"
#include "hsflow.h"
#include "hs_float.h"

#define QUANT_THREADS 256

__global__ void fp8_quantize_kernel(const uint16_t *__restrict__ x, int64_t n,
                                    uint8_t *__restrict__ q, float *__restrict__ scales, int *bad)
{
    __shared__ float warp_max[QUANT_THREADS / 32];
    __shared__ int warp_bad[QUANT_THREADS / 32];
    int64_t row = blockIdx.x;
    const uint16_t *xr = x + row * n;
    float amax = 0.f;
    int nonfinite = 0;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
        uint16_t b = xr[i] & 0x7fffu;
        nonfinite |= b >= 0x7f80u;
        amax = fmaxf(amax, hs_bf16_to_f32(b));
    }
    for (int off = 16; off > 0; off >>= 1) {
        amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, off));
        nonfinite |= __shfl_xor_sync(0xffffffffu, nonfinite, off);
    }
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    if (lane == 0) {
        warp_max[warp] = amax;
        warp_bad[warp] = nonfinite;
    }
    __syncthreads();
    amax = 0.f;
    nonfinite = 0;
    for (int w = 0; w < QUANT_THREADS / 32; w++) {
        amax = fmaxf(amax, warp_max[w]);
        nonfinite |= warp_bad[w];
    }
    if (nonfinite) {
        if (threadIdx.x == 0) atomicCAS(bad, 0, (int)(row + 1));
        return;
    }
    float scale = amax > 0.f ? __fdiv_rn(amax, HS_FP8_MAX) : 1.f;
    if (threadIdx.x == 0) scales[row] = scale;
    uint8_t *qr = q + row * n;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x)
        qr[i] = hs_fp8_from_f32(__fdiv_rn(hs_bf16_to_f32(xr[i]), scale));
}

__device__ __forceinline__ uint16_t dequant1(uint8_t q, float scale)
{
    return hs_f32_to_bf16(__fmul_rn(hs_fp8_to_f32(q), scale));
}

/* 16 values a thread (one 16-byte load, two 16-byte stores): rows go in
 * grid.y, n % 16 == 0, aligned buffers. The 256 e4m3 values come from a
 * table in shared memory (hs_fp8_to_f32 of each code, so the same bits),
 * which keeps the decode off the critical path of a memory-bound kernel. */
__global__ void fp8_dequantize_kernel_vec(const uint8_t *__restrict__ q,
                                          const float *__restrict__ scales, int64_t n,
                                          uint16_t *__restrict__ out)
{
    __shared__ float table[256];
    for (int c = threadIdx.x; c < 256; c += blockDim.x)
        table[c] = hs_fp8_to_f32((uint8_t)c);
    __syncthreads();
    int64_t row = blockIdx.y, i = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) * 16;
    if (i >= n) return;
    float scale = scales[row];
    uint4 in = *(const uint4 *)(q + row * n + i);
    const uint8_t *b = (const uint8_t *)&in;
    uint4 o[2];
    uint16_t *v = (uint16_t *)o;
#pragma unroll
    for (int j = 0; j < 16; j++)
        v[j] = hs_f32_to_bf16(__fmul_rn(table[b[j]], scale));
    uint4 *dst = (uint4 *)(out + row * n + i);
    dst[0] = o[0];
    dst[1] = o[1];
}

__global__ void fp8_dequantize_kernel(const uint8_t *__restrict__ q,
                                      const float *__restrict__ scales, int64_t n,
                                      uint16_t *__restrict__ out)
{
    int64_t row = blockIdx.y, i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    out[row * n + i] = dequant1(q[row * n + i], scales[row]);
}

extern "C" hs_status_t hs_kn_fp8_quantize_rows(const uint16_t *x, int64_t rows, int64_t n,
                                               uint8_t *q, float *scales, int *bad,
                                               cudaStream_t stream)
{
    if (rows <= 0 || n <= 0) return HS_OK;
    for (int64_t r0 = 0; r0 < rows; r0 += 2147483647) {
        int64_t r = rows - r0 < 2147483647 ? rows - r0 : 2147483647;
        fp8_quantize_kernel<<<(unsigned)r, QUANT_THREADS, 0, stream>>>(x + r0 * n, n, q + r0 * n,
                                                                       scales + r0, bad);
    }
    return cudaGetLastError() == cudaSuccess ? HS_OK : HS_ERR_CUDA;
}

extern "C" hs_status_t hs_kn_fp8_dequantize_rows(const uint8_t *q, const float *scales,
                                                 int64_t rows, int64_t n, uint16_t *out,
                                                 cudaStream_t stream)
{
    if (rows <= 0 || n <= 0) return HS_OK;
    bool vec = n % 16 == 0 && ((uintptr_t)q | (uintptr_t)out) % 16 == 0;
    const int threads = 256;
    int64_t per_block = vec ? threads * 16 : threads;
    unsigned bx = (unsigned)((n + per_block - 1) / per_block);
    /* rows go in grid.y, at most 65535 a launch */
    for (int64_t r0 = 0; r0 < rows; r0 += 65535) {
        unsigned r = (unsigned)(rows - r0 < 65535 ? rows - r0 : 65535);
        dim3 grid(bx, r);
        if (vec)
            fp8_dequantize_kernel_vec<<<grid, threads, 0, stream>>>(q + r0 * n, scales + r0, n,
                                                                    out + r0 * n);
        else
            fp8_dequantize_kernel<<<grid, threads, 0, stream>>>(q + r0 * n, scales + r0, n,
                                                                out + r0 * n);
    }
    return cudaGetLastError() == cudaSuccess ? HS_OK : HS_ERR_CUDA;
}
