/* SPDX-License-Identifier: Apache-2.0 */
/* gpu_loader_int.h - the consumer's delivery to its GPU (DESIGN §5): two
 * device buffers; batch k+1 is copied host-to-device from its pinned cache
 * slot on a copy stream while the trainer works on batch k.
 *
 * Stream contract with the trainer: the trainer's work is assumed to run on
 * the legacy default stream or on streams that synchronise with it (PyTorch's
 * default). hs__loader_hand_over() makes that stream wait for the copy, and
 * hs__loader_consumed() records, on that stream, the point after which the
 * buffer may be overwritten; the copy stream waits for it before the next copy
 * into the buffer.
 *
 * Without CUDA every function returns HS_ERR_UNSUPPORTED. */
#ifndef HS_GPU_LOADER_INT_H
#define HS_GPU_LOADER_INT_H

#include <stdint.h>

#include "hsflow.h"
#include "cache_int.h"

typedef struct hs__loader hs__loader_t;

/* Called on the copy stream's host-callback thread once the copy of a slot
 * is complete: the slot may be freed. No CUDA calls allowed inside. */
typedef void (*hs__loader_copied_cb)(void *arg);

HS_MUST_CHECK hs_status_t hs__loader_create(int device, hs__loader_t **out);
void hs__loader_destroy(hs__loader_t *l); /* NULL ok; waits for copies in flight */
/* Makes sure both device buffers hold at least `bytes` (allocates once; a
 * larger request later reallocates, after waiting for everything). */
HS_MUST_CHECK hs_status_t hs__loader_reserve(hs__loader_t *l, uint64_t bytes);
/* Makes sure each buffer has a second device buffer of at least `bytes` for
 * the bf16 rows of fp8 batches (allocated on the first call). */
HS_MUST_CHECK hs_status_t hs__loader_reserve_rows(hs__loader_t *l, uint64_t bytes);
/* An fp8 batch's rows inside the region, to dequantise after the copy. */
typedef struct {
    uint64_t hidden_off, scales_off; /* from the region's start */
    int64_t rows, row_elems;
} hs__loader_fp8_t;
/* Starts copying [offset, offset+bytes) of the cache into buffer `buf` (0/1)
 * once the trainer has consumed that buffer; `copied(arg)` runs when the
 * host slot is no longer needed. With `fp8` (else NULL), the rows are
 * dequantised into the buffer's bf16 rows (reserved with
 * hs__loader_reserve_rows) on a second stream, piece by piece as they land,
 * so the bytes cross PCIe as fp8, no pass over host memory is added and only
 * the last piece's dequantisation adds to the copy's time. */
HS_MUST_CHECK hs_status_t hs__loader_copy(hs__loader_t *l, int buf, const hs_cache_t *cache,
                                          uint64_t offset, uint64_t bytes,
                                          const hs__loader_fp8_t *fp8, hs__loader_copied_cb copied,
                                          void *arg);
/* Makes the trainer's stream wait for buffer `buf`'s copy (and its
 * dequantisation); returns its device address and that of its bf16 rows
 * (NULL when none were reserved). */
HS_MUST_CHECK hs_status_t hs__loader_hand_over(hs__loader_t *l, int buf, void **dptr, void **drows);
/* The trainer is done with buffer `buf` (as of work queued so far). */
HS_MUST_CHECK hs_status_t hs__loader_consumed(hs__loader_t *l, int buf);
/* Bytes copied and the seconds from each copy's start until its batch was
 * ready (copied and, for fp8, dequantised), from events. */
void hs__loader_stats(hs__loader_t *l, uint64_t *bytes, double *seconds);

#endif /* HS_GPU_LOADER_INT_H */
