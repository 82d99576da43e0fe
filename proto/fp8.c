/* SPDX-License-Identifier: Apache-2.0 */
/* fp8.c - one token's row of hidden states to e4m3 and back (HS_DTYPE_FP8).
 *
 * scale = amax / 448 over the row's k*H values (1 for a row of zeros), so
 * the largest value maps to 448 and nothing saturates but rounding at the
 * top; q = e4m3(x / scale). Back: bf16(e4m3(q) * scale). Both round to
 * nearest even in IEEE single precision (the scalars of hs_common.h), one
 * division or one multiplication per value, so kernels/fp8.cu gives the
 * same bits. */
#include "hs_float.h"
#include "hs_proto.h"
#include "hsflow.h"

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
