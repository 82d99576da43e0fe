/* SPDX-License-Identifier: Apache-2.0 */
/* preflight_int.h - the pure parts of the producer's preflight
 * (producer/preflight.c): which batch shapes a budget can produce, the
 * search for the largest budget that fits, and the headroom setting. */
#ifndef HS_PREFLIGHT_INT_H
#define HS_PREFLIGHT_INT_H

#include <stdbool.h>
#include <stdint.h>

#include "hsflow.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One batch shape: n_seqs sequences of seq_len tokens. */
typedef struct {
    uint32_t n_seqs, seq_len;
} hs__preflight_shape_t;

#define HS__PREFLIGHT_MAX_SHAPES 5
#define HS__PREFLIGHT_MIN_SEQ 128          /* shortest L tried below M */
#define HS__PREFLIGHT_DEFAULT_MAX_SEQ 8192 /* M when max_seq_len is 0 */
#define HS__PREFLIGHT_STEP 1024u           /* auto budgets are multiples of this */
#define HS__PREFLIGHT_MAX_BUDGET (1u << 20)
#define HS__PREFLIGHT_HEADROOM 0.10

/* The max sequence length M the preflight uses: max_seq_len, or
 * min(budget, 8192) when it is 0; never above the budget. */
uint32_t hs__preflight_max_seq(uint32_t budget, uint32_t max_seq_len);

/* The shapes a budget B can produce with max sequence length M
 * (hs__preflight_max_seq): 1 x M, then (B / L) x L for L = M, M/2, M/4, M/8
 * while L >= 128 (L = M always), each at most once. Every shape has
 * n_seqs * seq_len <= B. Writes up to cap shapes (HS__PREFLIGHT_MAX_SHAPES
 * is enough) and returns how many; 0 for a zero budget. */
int hs__preflight_shapes(uint32_t budget, uint32_t max_seq_len, hs__preflight_shape_t *out,
                         int cap);

/* The device bytes one GPU worker adds to the forward's plan at `budget`:
 * two batch slots (gpu_worker.c), each with the input ids, cu_seqlens and
 * the [budget, n_layers * H] bf16 output; with fp8 states (--hs-dtype fp8)
 * each slot also holds the e4m3 rows, one fp32 scale per token and a flag. */
uint64_t hs__preflight_worker_bytes(uint32_t budget, uint32_t n_layers, uint32_t H, bool fp8);

/* Planned peak bytes for a budget; non-decreasing in the budget. */
typedef hs_status_t (*hs__preflight_peak_cb)(void *ctx, uint32_t budget, uint64_t *peak);

/* Largest multiple of HS__PREFLIGHT_STEP in [min_budget rounded up to a
 * step, HS__PREFLIGHT_MAX_BUDGET] whose peak is <= limit_bytes, by binary
 * search (peak is called about 10 times). HS_ERR_NOSPACE when even the
 * smallest does not fit; a peak error is returned as is. *out set on
 * success. */
HS_MUST_CHECK hs_status_t hs__preflight_search(hs__preflight_peak_cb peak, void *ctx,
                                               uint64_t limit_bytes, uint32_t min_budget,
                                               uint32_t *out);

/* The value of --preflight-headroom, the share of each GPU's memory kept
 * free: a fraction in [0, 1) such as 0.1, or a percentage such as 10%.
 * HS_ERR_INVALID for anything else. */
HS_MUST_CHECK hs_status_t hs__preflight_headroom_parse(const char *s, double *out);

#ifdef __cplusplus
}
#endif
#endif /* HS_PREFLIGHT_INT_H */
