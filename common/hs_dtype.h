/* SPDX-License-Identifier: Apache-2.0 */
/* hs_dtype.h - the one vocabulary of element types: every name hsflow
 * accepts or prints for a dtype comes from the table behind this header.
 *
 * Used by a layout's dtype= (hs_layout_parse, store.json, hs-data plan), the
 * hidden-state flags (hs-producer --hs-dtype, hs-consumer --deliver) and a
 * model's Linear weights (--dtype auto|bf16|fp8, hs_model_weights_t, whose
 * values past "auto" are these ids). The ids go on the wire (a layout's
 * dtype field) and equal include/hsflow.h's hs_hidden_dtype_t: they never
 * change. python/hsflow/_dtypes.py holds the same table; a test compiles
 * this one and compares them.
 *
 * Nothing here allocates; the names are static strings. */
#ifndef HS_DTYPE_H
#define HS_DTYPE_H

#include <stdint.h>
#include <stddef.h>

#include "hsflow.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    /* bfloat16: 2 bytes per value */
    HS_DTYPE_BF16 = 1,
    /* float8_e4m3fn values and one fp32 scale per token over all of its k*H
     * values (amax / 448, as speculators stores hidden states): half the bytes */
    HS_DTYPE_FP8 = 2,
} hs_dtype_t;

typedef struct {
    uint32_t id;              /* hs_dtype_t */
    const char *name;         /* "bf16": what flags, layouts and files spell */
    uint32_t elem_bytes;      /* bytes per value */
    uint32_t row_scale_bytes; /* bytes per token row besides its values (fp8's scale) */
} hs_dtype_info_t;

/* The table: *n entries, in id order. */
const hs_dtype_info_t *hs_dtype_table(size_t *n);
/* The entry of `dtype`, or NULL for an id the table lacks. */
const hs_dtype_info_t *hs_dtype_info(uint32_t dtype);
/* "bf16", "fp8" (or "?" for an unknown id), and back: HS_ERR_INVALID for
 * another name (*out untouched). */
const char *hs_dtype_str(uint32_t dtype);
HS_MUST_CHECK hs_status_t hs_dtype_parse(const char *s, uint32_t *out);
/* The names joined for a message or a usage line: "bf16 or fp8" with
 * (", ", " or "), "bf16|fp8" with ("|", "|"); `first` (NULL: none) is put
 * before them, as "auto" of --dtype auto|bf16|fp8. Into buf[cap],
 * truncated to fit; returns buf. */
const char *hs_dtype_names(char *buf, size_t cap, const char *first, const char *sep,
                           const char *last_sep);

#ifdef __cplusplus
}
#endif
#endif /* HS_DTYPE_H */
