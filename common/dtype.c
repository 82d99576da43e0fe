/* SPDX-License-Identifier: Apache-2.0 */
/* dtype.c - the dtype table of hs_dtype.h: ids, names and sizes. */
#include "hs_dtype.h"

#include <stdio.h>
#include <string.h>

_Static_assert(HS_DTYPE_BF16 == (int)HS_HIDDEN_BF16 && HS_DTYPE_FP8 == (int)HS_HIDDEN_FP8,
               "hs_dtype_t and hsflow.h's hs_hidden_dtype_t are one numbering");

static const hs_dtype_info_t dtypes[] = {
    {HS_DTYPE_BF16, "bf16", 2, 0},
    {HS_DTYPE_FP8, "fp8", 1, 4},
};
#define N_DTYPES (sizeof dtypes / sizeof dtypes[0])

const hs_dtype_info_t *hs_dtype_table(size_t *n)
{
    *n = N_DTYPES;
    return dtypes;
}

const hs_dtype_info_t *hs_dtype_info(uint32_t dtype)
{
    for (size_t i = 0; i < N_DTYPES; i++)
        if (dtypes[i].id == dtype) return &dtypes[i];
    return NULL;
}

const char *hs_dtype_str(uint32_t dtype)
{
    const hs_dtype_info_t *d = hs_dtype_info(dtype);
    return d ? d->name : "?";
}

hs_status_t hs_dtype_parse(const char *s, uint32_t *out)
{
    for (size_t i = 0; s && i < N_DTYPES; i++) {
        if (!strcmp(s, dtypes[i].name)) {
            *out = dtypes[i].id;
            return HS_OK;
        }
    }
    return HS_ERR_INVALID;
}

const char *hs_dtype_names(char *buf, size_t cap, const char *first, const char *sep,
                           const char *last_sep)
{
    size_t n = 0, count = N_DTYPES + (first ? 1 : 0);
    if (!cap) return buf;
    buf[0] = '\0';
    for (size_t i = 0; i < count && n < cap; i++) {
        const char *name = first ? (i == 0 ? first : dtypes[i - 1].name) : dtypes[i].name;
        const char *before = i == 0 ? "" : i + 1 == count ? last_sep : sep;
        int w = snprintf(buf + n, cap - n, "%s%s", before, name);
        if (w < 0) break;
        n += (size_t)w;
    }
    return buf;
}
