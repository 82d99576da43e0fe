/* SPDX-License-Identifier: Apache-2.0 */
/* safetensors_int.h - reading and writing safetensors files.
 *
 * Format: an 8-byte little-endian header length n, n bytes of JSON
 * {"name": {"dtype": "BF16", "shape": [..], "data_offsets": [begin, end]},
 *  "__metadata__": {"key": "value"}}, then the data; offsets are relative to
 * the end of the header.
 *
 * Reading maps each file read-only and bounds-checks every tensor against the
 * file size before anything is touched. A set is one file, or every shard
 * named by a model.safetensors.index.json. Ownership: tensors, their names
 * and data point into the set and live until hs__st_close(). */
#ifndef HS_SAFETENSORS_INT_H
#define HS_SAFETENSORS_INT_H

#include <stddef.h>
#include <stdint.h>

#include "hsflow.h"

#ifdef __cplusplus
extern "C" {
#endif

#define HS_ST_MAX_DIMS 8

typedef enum {
    HS_ST_OTHER = 0, /* a dtype we do not read (kept so the file still opens) */
    HS_ST_BF16,
    HS_ST_F16,
    HS_ST_F32,
    HS_ST_I32,
    HS_ST_I64,
    HS_ST_U8,
    HS_ST_F8_E4M3, /* float8_e4m3fn */
} hs__st_dtype_t;

typedef struct {
    const char *name;
    hs__st_dtype_t dtype;
    char dtype_name[16]; /* as written in the file */
    int ndim;
    int64_t shape[HS_ST_MAX_DIMS];
    const void *data; /* in the mapped file; may be unaligned */
    size_t nbytes;
    const char *file; /* path of the file holding it */
} hs__st_tensor_t;

typedef struct hs__st_set hs__st_set_t;

/* One safetensors file. */
HS_MUST_CHECK hs_status_t hs__st_open_file(const char *path, hs__st_set_t **out);
/* A safetensors file image in memory, image[size], which the caller owns and
 * keeps alive (unchanged) until hs__st_close(); `name` stands for the file in
 * messages. Parsed and bounds-checked exactly as hs__st_open_file() does. */
HS_MUST_CHECK hs_status_t hs__st_open_memory(const void *image, size_t size, const char *name,
                                             hs__st_set_t **out);
/* A model folder: model.safetensors.index.json (sharded) if present, else
 * model.safetensors. */
HS_MUST_CHECK hs_status_t hs__st_open_dir(const char *dir, hs__st_set_t **out);
void hs__st_close(hs__st_set_t *st); /* NULL is fine */

size_t hs__st_count(const hs__st_set_t *st);
const hs__st_tensor_t *hs__st_at(const hs__st_set_t *st, size_t i);
const hs__st_tensor_t *hs__st_find(const hs__st_set_t *st, const char *name); /* NULL if absent */
/* Value of __metadata__[key] of the (first) file, or NULL. */
const char *hs__st_metadata(const hs__st_set_t *st, const char *key);

/* Tensor `name` as bf16 with exactly the given shape. BF16 data is returned
 * in place when 2-byte aligned; F16/F32 (or unaligned BF16) is converted
 * into a buffer the set owns. Missing tensor: HS_ERR_NOT_FOUND; wrong shape
 * or dtype, or a NaN or infinite entry (also an F32 value beyond bf16's
 * range): HS_ERR_FORMAT; all logged with the tensor's name. */
HS_MUST_CHECK hs_status_t hs__st_get_bf16(hs__st_set_t *st, const char *name, int ndim,
                                          const int64_t *shape, const uint16_t **out);

/* Tensor `name` as fp32 with exactly the given shape, always converted
 * (from BF16, F16 or F32) into a buffer the set owns: for the few small
 * tensors kept in full precision. Errors as hs__st_get_bf16. */
HS_MUST_CHECK hs_status_t hs__st_get_f32(hs__st_set_t *st, const char *name, int ndim,
                                         const int64_t *shape, const float **out);

/* Tensor `name` as raw e4m3 bytes (dtype F8_E4M3) with exactly the given
 * shape, in place in the mapped file. Missing: HS_ERR_NOT_FOUND; wrong shape
 * or dtype, or a NaN code (0x7f / 0xff): HS_ERR_FORMAT; logged with the
 * tensor's name. */
HS_MUST_CHECK hs_status_t hs__st_get_fp8(hs__st_set_t *st, const char *name, int ndim,
                                         const int64_t *shape, const uint8_t **out);

/* Tensor description for hs__st_write(). Data is `rows` rows of row_bytes,
 * row r at data + r * src_stride (src_stride = row_bytes, or 0, for
 * contiguous data); nbytes written = rows * row_bytes, which must equal the
 * shape's element count times the dtype size. */
typedef struct {
    const char *name;
    const char *dtype; /* "F32", "BF16", "I32", ... */
    int ndim;
    int64_t shape[HS_ST_MAX_DIMS];
    const void *data;
    size_t rows, row_bytes, src_stride;
} hs__st_write_tensor_t;

/* Writes a safetensors file through hs_outfile (a temporary file in the same
 * folder, renamed over path once complete), tensors in the given order;
 * n_meta string pairs go to __metadata__. The caller checks that path is not
 * one of its inputs (hs_outfile_check). */
HS_MUST_CHECK hs_status_t hs__st_write(const char *path, const hs__st_write_tensor_t *tensors,
                                       int n, const char *const *meta_keys,
                                       const char *const *meta_vals, int n_meta);

#ifdef __cplusplus
}
#endif
#endif /* HS_SAFETENSORS_INT_H */
