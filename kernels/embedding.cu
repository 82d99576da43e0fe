/* SPDX-License-Identifier: Apache-2.0 */
/* embedding.cu - token embedding gather on CUDA.
 *
 * out[t, :] = table[ids[t], :] for t < T; table is [vocab, H] bf16, out is
 * [T, H] bf16 with row stride out_stride. Pure copy, 16-byte accesses when
 * H and the strides allow. An id outside [0, vocab) yields a zero row (ids
 * are checked on the host before they get here). */
#include <cuda_bf16.h>
#include <stdint.h>

#include "cublaslt.h"
#include "embedding.h"

__global__ void embedding_kernel_vec(uint4 *out, int64_t out_stride_v, const int32_t *ids,
                                     const uint4 *table, int64_t row_v, int vocab)
{
    int t = blockIdx.x;
    int id = ids[t];
    uint4 *dst = out + (int64_t)t * out_stride_v;
    bool ok = id >= 0 && id < vocab;
    const uint4 *src = table + (int64_t)(ok ? id : 0) * row_v;
    for (int64_t i = threadIdx.x; i < row_v; i += blockDim.x)
        dst[i] = ok ? src[i] : make_uint4(0, 0, 0, 0);
}

__global__ void embedding_kernel(__nv_bfloat16 *out, int64_t out_stride, const int32_t *ids,
                                 const __nv_bfloat16 *table, int H, int vocab)
{
    int t = blockIdx.x;
    int id = ids[t];
    bool ok = id >= 0 && id < vocab;
    const __nv_bfloat16 *src = table + (int64_t)(ok ? id : 0) * H;
    for (int i = threadIdx.x; i < H; i += blockDim.x)
        out[(int64_t)t * out_stride + i] = ok ? src[i] : __float2bfloat16(0.f);
}

extern "C" hs_status_t hs_kn_embedding(const void *table, int vocab, int H, const int32_t *ids,
                                       int T, void *out, int64_t out_stride, cudaStream_t stream)
{
    if (T <= 0) return HS_OK;
    bool vec = H % 8 == 0 && out_stride % 8 == 0 && ((uintptr_t)out | (uintptr_t)table) % 16 == 0;
    if (vec)
        embedding_kernel_vec<<<T, 128, 0, stream>>>((uint4 *)out, out_stride / 8, ids,
                                                    (const uint4 *)table, H / 8, vocab);
    else
        embedding_kernel<<<T, 256, 0, stream>>>((__nv_bfloat16 *)out, out_stride, ids,
                                                (const __nv_bfloat16 *)table, H, vocab);
    return HS_CUDA_LAUNCH_CHECK("embedding kernel");
}
