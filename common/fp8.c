/* SPDX-License-Identifier: Apache-2.0 */
/* fp8.c - one token's row of hidden states to e4m3 and back (HS_DTYPE_FP8).
 *
 * scale = amax / 448 over the row's k*H values (1 for a row of zeros), so
 * the largest value maps to 448 and nothing saturates but rounding at the
 * top; q = e4m3(x / scale). Back: bf16(e4m3(q) * scale). Both round to
 * nearest even in IEEE single precision (the scalars of hs_float.h), one
 * division or one multiplication per value, so kernels/fp8.cu gives the
 * same bits. */
#include "hs_float.h"
#include "hs_region.h"
#include "hsflow.h"

#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

hs_status_t hs_fp8_quantize_row_bf16(const uint16_t *x, uint64_t n, uint8_t *q, float *scale,
                                     uint64_t *bad)
{
    float amax = 0.0f;
    for (uint64_t i = 0; i < n; i++) {
        uint16_t b = x[i] & 0x7fffu;
        if (b >= 0x7f80u) { /* all-ones exponent: infinite or NaN */
            *bad = i;
            return HS_ERR_INVALID;
        }
        float a = hs_bf16_to_f32(b);
        if (a > amax) amax = a;
    }
    float s = amax > 0.0f ? amax / HS_FP8_MAX : 1.0f;
    for (uint64_t i = 0; i < n; i++)
        q[i] = hs_fp8_from_f32(hs_bf16_to_f32(x[i]) / s);
    *scale = s;
    return HS_OK;
}

void hs_fp8_dequantize_row_bf16(const uint8_t *q, uint64_t n, float scale, uint16_t *out)
{
    if (n < 1024) {
        for (uint64_t i = 0; i < n; i++)
            out[i] = hs_f32_to_bf16(hs_fp8_to_f32(q[i]) * scale);
        return;
    }
    /* A row shares one scale: every code's value at it, once, and then a
     * lookup a value (the same bits; several times faster than converting
     * each value, which is the trainer's time on a consumer without a GPU). */
    uint16_t at_scale[256];
    for (int c = 0; c < 256; c++)
        at_scale[c] = hs_f32_to_bf16(hs_fp8_to_f32((uint8_t)c) * scale);
    for (uint64_t i = 0; i < n; i++)
        out[i] = at_scale[q[i]];
}

hs_status_t hs_fp8_quantize_rows(const uint16_t *x, uint64_t rows, uint64_t n, uint8_t *q,
                                 float *scales, uint64_t *bad_row)
{
    if (rows && (!x || !q || !scales || !n)) return HS_ERR_INVALID;
    for (uint64_t r = 0; r < rows; r++) {
        uint64_t bad;
        if (hs_fp8_quantize_row_bf16(x + r * n, n, q + r * n, &scales[r], &bad) != HS_OK) {
            if (bad_row) *bad_row = r;
            return HS_ERR_INVALID;
        }
    }
    return HS_OK;
}

/* Bytes of w equal to 0x7f or 0xff (e4m3's NaN codes) have their top bit set
 * in the result; others are 0 (the classic zero-byte test on w ^ 0x7f..). */
static inline uint64_t nan_code_bytes(uint64_t w)
{
    const uint64_t lo7 = 0x7f7f7f7f7f7f7f7full, hi = 0x8080808080808080ull;
    uint64_t x = (w & lo7) ^ lo7; /* 0 where the low 7 bits are all ones */
    return (x - 0x0101010101010101ull) & ~x & hi;
}

__attribute__((format(printf, 3, 4))) static void row_say(char *why, size_t whycap, const char *fmt,
                                                          ...)
{
    va_list ap;
    va_start(ap, fmt);
    if (why && whycap) vsnprintf(why, whycap, fmt, ap);
    va_end(ap);
}

hs_status_t hs_fp8_row_check(const uint8_t *q, uint64_t n, float scale, char *why, size_t whycap)
{
    uint32_t bits = hs_f32_bits(scale);
    if (isnan(scale) || isinf(scale) || (bits >> 31)) {
        row_say(why, whycap, "fp8 scale %g (bits 0x%08x) is not a finite positive number",
                (double)scale, bits);
        return HS_ERR_FORMAT;
    }
    if ((hs_f32_to_bf16(HS_FP8_MAX * scale) & 0x7fffu) >= 0x7f80u) {
        row_say(why, whycap, "fp8 scale %g puts the largest code (448) past bf16's range",
                (double)scale);
        return HS_ERR_FORMAT;
    }
    /* words first (no branch inside, so the compiler vectorises it); a row
     * with a NaN code is then walked byte by byte to name it */
    uint64_t nonzero = 0, nan = 0, i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t w;
        memcpy(&w, q + i, 8);
        nonzero |= w & 0x7f7f7f7f7f7f7f7full;
        nan |= nan_code_bytes(w);
    }
    if (nan) i = 0;
    for (; i < n; i++) {
        if ((q[i] & 0x7fu) == 0x7fu) {
            row_say(why, whycap, "fp8 value %" PRIu64 " is code 0x%02x, a NaN", i, q[i]);
            return HS_ERR_FORMAT;
        }
        nonzero |= q[i] & 0x7fu;
    }
    if (scale == 0.0f && nonzero) {
        row_say(why, whycap, "fp8 scale is 0 but the row holds non-zero codes");
        return HS_ERR_FORMAT;
    }
    return HS_OK;
}
