/* SPDX-License-Identifier: Apache-2.0 */
/* fp8.h - hidden-state rows to fp8 (e4m3) and back on the GPU: the
 * producer quantises its captured rows before they leave the device, the
 * consumer dequantises a delivered batch on the trainer's GPU.
 *
 * Math (per row of n values, one row per token): scale = amax / 448 (1 for
 * a row of zeros), q = e4m3(x / scale); back, bf16(e4m3(q) * scale); every
 * rounding to nearest even in IEEE single precision. The C twins are
 * hs_fp8_quantize_row_bf16 / hs_fp8_dequantize_row_bf16 (common/fp8.c, the
 * same scalar code of hs_float.h): the kernels give the same bits. */
#ifndef HS_KN_FP8_H
#define HS_KN_FP8_H

#include <stddef.h>
#include <stdint.h>
#include "hsflow.h" /* hs_status_t */

#ifdef __cplusplus
extern "C" {
#endif

/* ---- CUDA launchers (kernels/fp8.cu) ---- */
/* Device buffers; stream is a cudaStream_t. They return HS_OK or an error
 * hs_status_t (HS_ERR_CUDA for a failed launch). */
struct CUstream_st;
/* rows x n bf16 values (row stride n) into q [rows][n] and scales [rows].
 * A NaN or infinite value sets *bad (device int, left as it is otherwise)
 * to 1 + its row; that row's output is meaningless. */
HS_MUST_CHECK hs_status_t hs_kn_fp8_quantize_rows(const uint16_t *x, int64_t rows, int64_t n,
                                                  uint8_t *q, float *scales, int *bad,
                                                  struct CUstream_st *stream);
/* q [rows][n] with scales [rows] into bf16 out [rows][n]. */
HS_MUST_CHECK hs_status_t hs_kn_fp8_dequantize_rows(const uint8_t *q, const float *scales,
                                                    int64_t rows, int64_t n, uint16_t *out,
                                                    struct CUstream_st *stream);

#ifdef __cplusplus
}
#endif
#endif /* HS_KN_FP8_H */
