/* SPDX-License-Identifier: Apache-2.0 */
/* hs_float.h - fp8 (e4m3) and bf16 scalars, the one set for the C code, the
 * CUDA kernels and the kernels' C twins. A bf16 value is its 16 raw bits
 * (uint16_t): the top half of an IEEE-754 binary32.
 *
 * One definition for the CPU and CUDA code (hs_fp8_quantize_row_bf16 in
 * proto/, the kernels of kernels/fp8.cu), so both give the same bits: IEEE
 * single precision with round-to-nearest-even only, no FMA, no fast math.
 * e4m3 is OCP float8_e4m3fn: bias 7, no infinities, 0x7f/0xff NaN, largest
 * finite 448, smallest subnormal 2^-9. */
#ifndef HS_FLOAT_H
#define HS_FLOAT_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#ifdef __CUDACC__
#define HS_HOSTDEV __host__ __device__
#else
#define HS_HOSTDEV
#endif
#define HS_FP8_MAX 448.0f

/* A float and its bits. */
typedef union {
    float f;
    uint32_t u;
} hs__f32_bits_t;

static inline HS_HOSTDEV uint32_t hs_f32_bits(float x)
{
    hs__f32_bits_t c;
    c.f = x;
    return c.u;
}

static inline HS_HOSTDEV float hs_f32_from_bits(uint32_t u)
{
    hs__f32_bits_t c;
    c.u = u;
    return c.f;
}

/* bf16 bits of a float, rounded to nearest even (as torch does); a NaN stays
 * a (quiet) NaN instead of rounding into an infinity. */
static inline HS_HOSTDEV uint16_t hs_f32_to_bf16(float x)
{
    uint32_t u = hs_f32_bits(x);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x0040u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static inline HS_HOSTDEV float hs_bf16_to_f32(uint16_t b)
{
    return hs_f32_from_bits((uint32_t)b << 16);
}

/* e4m3 of a finite float, rounded to nearest even, saturated to +-448. */
static inline HS_HOSTDEV uint8_t hs_fp8_from_f32(float x)
{
    uint32_t u = hs_f32_bits(x);
    uint8_t sign = (uint8_t)((u >> 24) & 0x80u);
    u &= 0x7fffffffu;
    if (u >= 0x43e00000u) return sign | 0x7eu;  /* >= 448 */
    if (u < 0x3c800000u) {                      /* < 2^-6: subnormal, m * 2^-9 */
        float f = hs_f32_from_bits(u) * 512.0f; /* exact: a power of two */
        uint32_t m = (uint32_t)f;
        float frac = f - (float)m; /* exact below 2^23 */
        if (frac > 0.5f || (frac == 0.5f && (m & 1u))) m++;
        return sign | (uint8_t)m; /* m == 8 is the smallest normal, 0x08 */
    }
    int32_t e = (int32_t)(u >> 23) - 127; /* -6 .. 8 */
    uint32_t mant = u & 0x7fffffu, r = mant >> 20, rem = mant & 0xfffffu;
    if (rem > 0x80000u || (rem == 0x80000u && (r & 1u))) r++;
    uint32_t field = ((uint32_t)(e + 7) << 3) + r; /* a carry bumps the exponent */
    return sign | (uint8_t)(field > 0x7eu ? 0x7eu : field);
}

static inline HS_HOSTDEV float hs_fp8_to_f32(uint8_t q)
{
    uint32_t e = (q >> 3) & 0xfu, m = q & 7u;
    float v;
    if (e == 0)
        v = (float)m * (1.0f / 512.0f);
    else if (e == 15 && m == 7)
        v = hs_f32_from_bits(0x7fc00000u);
    else
        v = hs_f32_from_bits(((e + 120u) << 23) | (m << 20));
    return (q & 0x80u) ? -v : v;
}

#ifdef __cplusplus
}
#endif
#endif /* HS_FLOAT_H */
