/* SPDX-License-Identifier: Apache-2.0 */
/* rmsnorm_gated.cu - the gated RMSNorm closing a Gated DeltaNet layer, on
 * CUDA (see rmsnorm_gated.h):
 *   y[r, i] = w[i] * (x[r, i] / sqrt(mean_i(x[r, :]^2) + eps)) * silu(z[r, i])
 * per row of dim values (one value head). x, z, y bf16 rows of their own
 * strides, w bf16 [dim]; fp32 math, one rounding at the end.
 *
 * One warp per row; 16-byte loads when dim, the strides and the pointers
 * are multiples of 8 elements. The row is read twice (sum of squares, then
 * the output); the second read comes from L1. */
#include <cuda_bf16.h>
#include <stdint.h>

#include "cublaslt.h"
#include "row_rms.cuh"
#include "rmsnorm_gated.h"

typedef __nv_bfloat16 bf16;

__device__ __forceinline__ float gated_out(float x, float r, float w, float z)
{
    return (w * (x * r)) * (z / (1.f + __expf(-z)));
}

template <bool VEC>
__global__ void rmsnorm_gated_kernel(const bf16 *x, int64_t x_stride, const bf16 *__restrict__ z,
                                     int64_t z_stride, const bf16 *__restrict__ w, bf16 *y,
                                     int64_t y_stride, int rows, int dim, float eps)
{
    int row = (blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    int lane = threadIdx.x & 31;
    if (row >= rows) return;
    const bf16 *xr = x + (int64_t)row * x_stride, *zr = z + (int64_t)row * z_stride;
    bf16 *yr = y + (int64_t)row * y_stride;
    float r = hs_warp_row_rrms<VEC>(xr, dim, eps, lane);
    if (VEC) {
        for (int i = lane * 8; i < dim; i += 256) {
            uint4 xu = *(const uint4 *)(xr + i), zu = *(const uint4 *)(zr + i);
            uint4 wu = *(const uint4 *)(w + i), o;
            const bf16 *xe = (const bf16 *)&xu, *ze = (const bf16 *)&zu, *we = (const bf16 *)&wu;
            bf16 *oe = (bf16 *)&o;
#pragma unroll
            for (int j = 0; j < 8; j++)
                oe[j] = __float2bfloat16(gated_out(
                    __bfloat162float(xe[j]), r, __bfloat162float(we[j]), __bfloat162float(ze[j])));
            *(uint4 *)(yr + i) = o;
        }
    } else {
        for (int i = lane; i < dim; i += 32)
            yr[i] = __float2bfloat16(gated_out(__bfloat162float(xr[i]), r, __bfloat162float(w[i]),
                                               __bfloat162float(zr[i])));
    }
}

extern "C" hs_status_t hs_kn_rmsnorm_gated(const void *x, int64_t x_stride, const void *z,
                                           int64_t z_stride, const void *w, void *y,
                                           int64_t y_stride, int rows, int dim, float eps,
                                           cudaStream_t stream)
{
    if (rows <= 0) return HS_OK;
    if (dim <= 0 || x_stride < dim || z_stride < dim || y_stride < dim) {
        hs_error("rmsnorm_gated: bad shape (dim %d, strides %lld/%lld/%lld)", dim,
                 (long long)x_stride, (long long)z_stride, (long long)y_stride);
        return HS_ERR_INVALID;
    }
    bool vec = dim % 8 == 0 && x_stride % 8 == 0 && z_stride % 8 == 0 && y_stride % 8 == 0 &&
               ((uintptr_t)x | (uintptr_t)z | (uintptr_t)w | (uintptr_t)y) % 16 == 0;
    const int threads = 256, rows_per_block = threads / 32;
    unsigned blocks = (unsigned)((rows + rows_per_block - 1) / rows_per_block);
    if (vec)
        rmsnorm_gated_kernel<true>
            <<<blocks, threads, 0, stream>>>((const bf16 *)x, x_stride, (const bf16 *)z, z_stride,
                                             (const bf16 *)w, (bf16 *)y, y_stride, rows, dim, eps);
    else
        rmsnorm_gated_kernel<false>
            <<<blocks, threads, 0, stream>>>((const bf16 *)x, x_stride, (const bf16 *)z, z_stride,
                                             (const bf16 *)w, (bf16 *)y, y_stride, rows, dim, eps);
    return HS_CUDA_LAUNCH_CHECK("rmsnorm_gated kernel");
}
