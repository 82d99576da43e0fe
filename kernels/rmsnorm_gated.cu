/* SPDX-License-Identifier: Apache-2.0 */
/* rmsnorm_gated.cu - the gated RMSNorm closing a Gated DeltaNet layer, on
 * CUDA (see rmsnorm_gated.h):
 *   y[r, i] = w[i] * (x[r, i] / sqrt(mean_i(x[r, :]^2) + eps)) * silu(z[r, i])
 * per row of dim values (one value head). x, z, y bf16 rows of their own
 * strides, w bf16 [dim]; fp32 math, one rounding at the end.
 *
 * Rows of up to 256 values with 16-byte access (a value head is 128): L
 * lanes a row, L the power of two covering dim / 8, one 16-byte word of x,
 * z and w per lane, loaded at once and kept in registers; several rows a
 * warp. The sum of squares is hs_warp_row_rrms's, term for term (the lanes
 * a full warp would add are zeros), so every norm of a row sees the same
 * rms. Other rows: one warp per row, the row read twice (the second time
 * from L1). */
#include <cuda_bf16.h>
#include <stdint.h>

#include "cublaslt.h"
#include "rmsnorm_gated.cuh"
#include "rmsnorm_gated.h"
#include "row_rms.cuh"
#include "hs_log.h"

typedef __nv_bfloat16 bf16;

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
        for (int i = lane * 8; i < dim; i += 256)
            *(uint4 *)(yr + i) = hs_gated_out8(*(const uint4 *)(xr + i), *(const uint4 *)(zr + i),
                                               *(const uint4 *)(w + i), r);
    } else {
        for (int i = lane; i < dim; i += 32)
            yr[i] = __float2bfloat16(hs_gated_out(__bfloat162float(xr[i]), r,
                                                  __bfloat162float(w[i]), __bfloat162float(zr[i])));
    }
}

/* L lanes a row of dim <= 8 L values (dim % 8 == 0, 16-byte aligned). */
template <int L>
__global__ void rmsnorm_gated_short_kernel(const bf16 *x, int64_t x_stride,
                                           const bf16 *__restrict__ z, int64_t z_stride,
                                           const bf16 *__restrict__ w, bf16 *y, int64_t y_stride,
                                           int rows, int dim, float eps)
{
    const int row = (blockIdx.x * blockDim.x + threadIdx.x) / L;
    const int i = (threadIdx.x % L) * 8;
    if (row >= rows) return; /* whole L-lane groups leave together */
    const bool mine = i < dim;
    uint4 xu = make_uint4(0, 0, 0, 0), zu = xu, wu = xu;
    if (mine) {
        xu = *(const uint4 *)(x + (int64_t)row * x_stride + i);
        zu = *(const uint4 *)(z + (int64_t)row * z_stride + i);
        wu = *(const uint4 *)(w + i);
    }
    const float r = hs_gated_row_rrms<L>(xu, dim, eps);
    if (!mine) return;
    *(uint4 *)(y + (int64_t)row * y_stride + i) = hs_gated_out8(xu, zu, wu, r);
}

template <int L>
static void launch_short(const void *x, int64_t x_stride, const void *z, int64_t z_stride,
                         const void *w, void *y, int64_t y_stride, int rows, int dim, float eps,
                         cudaStream_t stream)
{
    const int threads = 256, rows_per_block = threads / L;
    unsigned blocks = (unsigned)((rows + rows_per_block - 1) / rows_per_block);
    rmsnorm_gated_short_kernel<L>
        <<<blocks, threads, 0, stream>>>((const bf16 *)x, x_stride, (const bf16 *)z, z_stride,
                                         (const bf16 *)w, (bf16 *)y, y_stride, rows, dim, eps);
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
    if (vec && dim <= 256) {
        if (dim <= 64)
            launch_short<8>(x, x_stride, z, z_stride, w, y, y_stride, rows, dim, eps, stream);
        else if (dim <= 128)
            launch_short<16>(x, x_stride, z, z_stride, w, y, y_stride, rows, dim, eps, stream);
        else
            launch_short<32>(x, x_stride, z, z_stride, w, y, y_stride, rows, dim, eps, stream);
        return HS_CUDA_LAUNCH_CHECK("rmsnorm_gated kernel");
    }
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
