/* SPDX-License-Identifier: Apache-2.0 */
/* wgmma.cuh - Hopper's warpgroup matrix products (sm_90a) as the gated
 * delta rule's state pass uses them: A from registers (bf16, the m16n8k16
 * A fragment of each warp's 16 rows), B from shared memory in the 128-byte
 * swizzled layout, fp32 accumulators. The accumulators of m64nN have, per
 * warp, mma.sync's layout n8 tile by n8 tile (d[j] is tile j), so an
 * accumulator pair feeds the next product's A as with mma.sync.
 *
 * B's layout, in panels of 64 bf16 columns: row r of a panel is 128 bytes
 * at r * 128, its 16-byte piece c at (c ^ (r % 8)) * 16; a panel holds
 * 64 rows (8 KiB, 1024-byte aligned). The same rows serve as
 *   K-major B (rows = N, columns = K): smem_desc_kmajor, one k-step of 16
 *     columns 32 bytes into the row;
 *   MN-major B (rows = K, columns = N, N over the panels): smem_desc_mnmajor.
 * Used only in code built for sm_90a (__CUDA_ARCH_FEAT_SM90_ALL). */
#ifndef HS_KN_WGMMA_CUH
#define HS_KN_WGMMA_CUH

#include <stdint.h>

enum { WG_PANEL_BYTES = 64 * 128 }; /* 64 rows of 128 bytes */

/* Byte offset of the 16-byte piece c (columns 8c .. 8c + 7) of row r in the
 * swizzled panels. */
static __device__ __forceinline__ unsigned wg_swizzle_offset(int r, int c)
{
    return (unsigned)((c >> 3) * WG_PANEL_BYTES + r * 128 + (((c & 7) ^ (r & 7)) << 4));
}

/* A shared-memory matrix descriptor: start address, leading and stride
 * byte offsets (16-byte units), 128-byte swizzle (layout type 1). */
static __device__ __forceinline__ uint64_t wg_desc(const void *smem, unsigned lbo, unsigned sbo)
{
    uint64_t a = (uint64_t)__cvta_generic_to_shared(smem);
    return ((a & 0x3FFFF) >> 4) | ((uint64_t)(lbo >> 4) << 16) | ((uint64_t)(sbo >> 4) << 32) |
           (1ull << 62);
}

/* K-major B, k-step kt (columns 16 kt .. 16 kt + 15) of panels at base:
 * 8-row groups 1024 bytes apart. */
static __device__ __forceinline__ uint64_t smem_desc_kmajor(const void *base, int kt)
{
    return wg_desc((const char *)base + (kt >> 2) * WG_PANEL_BYTES + (kt & 3) * 32, 16, 1024);
}

/* MN-major B, k-step kt (rows 16 kt .. 16 kt + 15) of panels at base:
 * panels (64 columns of N) WG_PANEL_BYTES apart, 8-row groups 1024. */
static __device__ __forceinline__ uint64_t smem_desc_mnmajor(const void *base, int kt)
{
    return wg_desc((const char *)base + kt * 16 * 128, WG_PANEL_BYTES, 1024);
}

/* Orders this warpgroup's register and shared-memory writes before its
 * next wgmma. */
static __device__ __forceinline__ void wg_fence(void)
{
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
static __device__ __forceinline__ void wg_commit(void)
{
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
template <int N> static __device__ __forceinline__ void wg_wait(void)
{
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
/* Generic-proxy writes to shared memory (stores, cp.async) visible to
 * wgmma's reads: each writer fences, then the block's barrier. */
static __device__ __forceinline__ void fence_proxy_async_shared(void)
{
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

/* Pins registers an asynchronous product reads or writes: the compiler
 * may neither move their uses across this point nor reuse them before it. */
template <int N> static __device__ __forceinline__ void wg_pin(float (&d)[N][4])
{
#pragma unroll
    for (int j = 0; j < N; j++)
        asm volatile("" : "+f"(d[j][0]), "+f"(d[j][1]), "+f"(d[j][2]), "+f"(d[j][3])::"memory");
}
template <int N> static __device__ __forceinline__ void wg_pin(uint32_t (&a)[N][4])
{
#pragma unroll
    for (int j = 0; j < N; j++)
        asm volatile("" : "+r"(a[j][0]), "+r"(a[j][1]), "+r"(a[j][2]), "+r"(a[j][3])::"memory");
}

/* d (+)= a b over one k-step: m64 x N x k16, A = a (this warp's 16 rows),
 * B by descriptor (TRANS_B 0: K-major, 1: MN-major); d = a b when
 * scale_d is 0. Asynchronous: d and a stay untouched until wg_wait. */
template <int TRANS_B>
static __device__ __forceinline__ void wgmma_m64n64k16(float (&d)[8][4], const uint32_t (&a)[4],
                                                       uint64_t desc_b, int scale_d)
{
    asm volatile(
        "{\n"
        ".reg .pred p;\n"
        "setp.ne.b32 p, %37, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {"
        "%0,%1,%2,%3,%4,%5,%6,%7,"
        "%8,%9,%10,%11,%12,%13,%14,%15,"
        "%16,%17,%18,%19,%20,%21,%22,%23,"
        "%24,%25,%26,%27,%28,%29,%30,%31"
        "}, {%32,%33,%34,%35}, %36, p, 1, 1, %38;\n"
        "}\n"
        : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]),
          "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]),
          "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]),
          "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]),
          "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]),
          "+f"(d[7][2]), "+f"(d[7][3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(scale_d), "n"(TRANS_B));
}

template <int TRANS_B>
static __device__ __forceinline__ void wgmma_m64n128k16(float (&d)[16][4], const uint32_t (&a)[4],
                                                        uint64_t desc_b, int scale_d)
{
    asm volatile(
        "{\n"
        ".reg .pred p;\n"
        "setp.ne.b32 p, %69, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {"
        "%0,%1,%2,%3,%4,%5,%6,%7,"
        "%8,%9,%10,%11,%12,%13,%14,%15,"
        "%16,%17,%18,%19,%20,%21,%22,%23,"
        "%24,%25,%26,%27,%28,%29,%30,%31,"
        "%32,%33,%34,%35,%36,%37,%38,%39,"
        "%40,%41,%42,%43,%44,%45,%46,%47,"
        "%48,%49,%50,%51,%52,%53,%54,%55,"
        "%56,%57,%58,%59,%60,%61,%62,%63"
        "}, {%64,%65,%66,%67}, %68, p, 1, 1, %70;\n"
        "}\n"
        : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]),
          "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]),
          "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]),
          "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]),
          "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]),
          "+f"(d[7][2]), "+f"(d[7][3]), "+f"(d[8][0]), "+f"(d[8][1]), "+f"(d[8][2]), "+f"(d[8][3]),
          "+f"(d[9][0]), "+f"(d[9][1]), "+f"(d[9][2]), "+f"(d[9][3]), "+f"(d[10][0]),
          "+f"(d[10][1]), "+f"(d[10][2]), "+f"(d[10][3]), "+f"(d[11][0]), "+f"(d[11][1]),
          "+f"(d[11][2]), "+f"(d[11][3]), "+f"(d[12][0]), "+f"(d[12][1]), "+f"(d[12][2]),
          "+f"(d[12][3]), "+f"(d[13][0]), "+f"(d[13][1]), "+f"(d[13][2]), "+f"(d[13][3]),
          "+f"(d[14][0]), "+f"(d[14][1]), "+f"(d[14][2]), "+f"(d[14][3]), "+f"(d[15][0]),
          "+f"(d[15][1]), "+f"(d[15][2]), "+f"(d[15][3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(scale_d), "n"(TRANS_B));
}

#endif /* HS_KN_WGMMA_CUH */
