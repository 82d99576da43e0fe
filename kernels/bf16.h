/* SPDX-License-Identifier: Apache-2.0 */
/* bf16.h - bfloat16 <-> float conversion used by the kernels' C twins and the
 * model loader. A bf16 value is stored as its 16 raw bits (uint16_t): the top
 * half of an IEEE-754 binary32. float -> bf16 rounds to nearest, ties to
 * even (as torch does); NaN stays NaN. */
#ifndef HS_KN_BF16_H
#define HS_KN_BF16_H

#include <stdint.h>
#include <string.h>

#ifdef __cplusplus
extern "C" {
#endif

static inline float hs_bf16_to_f32(uint16_t b)
{
    uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static inline uint16_t hs_f32_to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x0040u); /* quiet NaN */
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

#ifdef __cplusplus
}
#endif
#endif /* HS_KN_BF16_H */
