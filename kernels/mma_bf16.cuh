/* SPDX-License-Identifier: Apache-2.0 */
/* mma_bf16.cuh - the warp-level tensor-core pieces the attention and the
 * gated delta rule kernels share (sm_80 and later): bf16 pairs, the
 * m16n8k16 bf16 mma with fp32 accumulation, ldmatrix of four 8 x 8
 * matrices (plain and transposed) and the 16-byte cp.async with zero fill.
 * Fragment layouts are PTX's: thread (g = lane / 4, t = lane % 4) holds
 * rows g and g + 8, columns 2t and 2t + 1 of an accumulator tile. */
#ifndef HS_KN_MMA_BF16_CUH
#define HS_KN_MMA_BF16_CUH

#include <cuda_bf16.h>
#include <stdint.h>

/* Two floats as one bf16x2 register (lo in the low half). */
static __device__ __forceinline__ uint32_t pack_bf16(float lo, float hi)
{
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *(uint32_t *)&v;
}

/* d += a b: m16n8k16, bf16 in, fp32 accumulate. */
static __device__ __forceinline__ void mma_bf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                                uint32_t b1)
{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, "
                 "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* ldmatrix .x4: lane l gives the shared address of row l % 8 of matrix
 * l / 8; r0..r3 get this thread's pair of matrices 0..3. */
static __device__ __forceinline__ void ldsm_x4(uint32_t &r0, uint32_t &r1, uint32_t &r2,
                                               uint32_t &r3, const void *p)
{
    unsigned a = (unsigned)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(a));
}
static __device__ __forceinline__ void ldsm_x4_t(uint32_t &r0, uint32_t &r1, uint32_t &r2,
                                                 uint32_t &r3, const void *p)
{
    unsigned a = (unsigned)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(a));
}
static __device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], const void *p)
{
    ldsm_x4(r[0], r[1], r[2], r[3], p);
}
static __device__ __forceinline__ void ldsm_x4_t(uint32_t (&r)[4], const void *p)
{
    ldsm_x4_t(r[0], r[1], r[2], r[3], p);
}

/* 16 bytes global -> shared, asynchronous; 0 source bytes (zero fill)
 * where !pred. */
static __device__ __forceinline__ void cp_async16(void *smem, const void *gmem, bool pred)
{
    unsigned s = (unsigned)__cvta_generic_to_shared(smem);
    int n = pred ? 16 : 0;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(n));
}
static __device__ __forceinline__ void cp_async_commit()
{
    asm volatile("cp.async.commit_group;\n" ::);
}
template <int N> static __device__ __forceinline__ void cp_async_wait()
{
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

#endif /* HS_KN_MMA_BF16_CUH */
