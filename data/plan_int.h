/* SPDX-License-Identifier: Apache-2.0 */
/* plan_int.h - the batch plan: which sequences go into which batch (DESIGN §1).
 *
 * A plan is a deterministic function of (dataset fingerprint, token budget,
 * max sequence length, overflow policy, seed). Sequences longer than
 * max_seq_len are truncated (their first max_seq_len tokens are kept) or
 * dropped; the rest are sorted by length, longest first (ties by sample id),
 * and packed first-fit-decreasing into batches of at most token_budget
 * tokens. Batch ids 0..n_batches-1 follow packing order; an epoch visits them
 * in the order hs_permutation(seed, epoch, n_batches), the same function the
 * consumer uses. Every producer computes the same plan and proves it by the
 * plan hash.
 *
 * Ownership: hs_plan_build() returns a plan the caller frees with
 * hs_plan_destroy(). Arrays returned by hs_plan_batch() point into the plan
 * and live until it is destroyed. A plan is immutable once built; any number
 * of threads may read it. */
#ifndef HS_PLAN_INT_H
#define HS_PLAN_INT_H

#include "dataset_int.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { HS_OVERFLOW_TRUNCATE = 0, HS_OVERFLOW_DROP = 1 } hs_overflow_t;

/* "truncate" / "drop" */
const char *hs_overflow_str(hs_overflow_t policy);
HS_MUST_CHECK hs_status_t hs_overflow_parse(const char *s, hs_overflow_t *out);

typedef struct {
    uint32_t token_budget;  /* tokens per batch, 1..INT32_MAX */
    uint32_t max_seq_len;   /* 0 = token_budget; must be <= token_budget */
    hs_overflow_t overflow; /* what to do with sequences longer than max_seq_len */
    uint64_t seed;          /* epoch order */
    /* Seconds between progress lines while a large plan is built; 0 = 5,
     * negative = never. Not part of the plan (nor of its hash). */
    double progress_interval_s;
} hs_plan_config_t;

typedef struct hs_plan hs_plan_t;

/* The batch region views of hs_proto.h (hs_batch_view_t): the plan fills
 * one without the data module depending on the wire format. */
struct hs_batch_view;

typedef struct {
    uint32_t n_seqs;
    uint32_t n_tokens;          /* sum of lengths, <= token_budget */
    const uint64_t *sample_ids; /* n_seqs dataset indices, longest first */
    const uint32_t *lengths;    /* tokens used of each (after truncation) */
} hs_plan_batch_t;

typedef struct {
    uint64_t n_samples;      /* sequences in the dataset */
    uint64_t n_kept;         /* sequences in the plan (n_samples - n_dropped) */
    uint64_t n_truncated;    /* kept, but cut to max_seq_len */
    uint64_t n_dropped;      /* longer than max_seq_len under the drop policy */
    uint64_t tokens_dropped; /* tokens lost to truncation and dropping */
    uint64_t tokens;         /* tokens in the plan */
    uint32_t n_batches;
    uint32_t max_batch_tokens;
    uint32_t min_batch_tokens;
    uint32_t max_seq_len; /* the effective limit */
    double mean_fill_pct; /* 100 * tokens / (n_batches * token_budget) */
} hs_plan_stats_t;

/* Builds the plan of `ds` under `cfg`. Fails with HS_ERR_INVALID (and a
 * message saying which value to change) for a budget of 0 or above
 * INT32_MAX, max_seq_len > token_budget, or a plan with no sequence left. */
HS_MUST_CHECK hs_status_t hs_plan_build(const hs_dataset_t *ds, const hs_plan_config_t *cfg,
                                        hs_plan_t **out);
void hs_plan_destroy(hs_plan_t *plan); /* NULL is fine */

uint32_t hs_plan_n_batches(const hs_plan_t *plan);
/* Batch `id` (< n_batches) into *out; HS_ERR_INVALID for a bad id. */
HS_MUST_CHECK hs_status_t hs_plan_batch(const hs_plan_t *plan, uint32_t id, hs_plan_batch_t *out);
uint64_t hs_plan_hash(const hs_plan_t *plan);
void hs_plan_stats(const hs_plan_t *plan, hs_plan_stats_t *out);
/* Logs a warning when the plan loses tokens to max_seq_len (truncated or
 * dropped sequences): how many of the dataset's tokens, their share, and
 * which flags keep them. Silent when nothing is lost. `data` names the
 * dataset in the message. */
void hs_plan_warn_lost(const hs_plan_t *plan, const char *data);
/* The configuration the plan was built with (max_seq_len resolved). */
const hs_plan_config_t *hs_plan_config(const hs_plan_t *plan);
/* The dataset fingerprint the plan was built from. */
uint64_t hs_plan_fingerprint(const hs_plan_t *plan);
/* Batch ids in the order epoch `epoch` visits them: out[n_batches]. */
void hs_plan_epoch_order(const hs_plan_t *plan, uint32_t epoch, uint32_t *out);

/* Writes cu_seqlens (n+1), sample_ids (n), input_ids (T) and loss_mask (T)
 * of batch `batch_id` into `view`, a view made by hs_batch_view() for this
 * batch's n_seqs and n_tokens. Header and hidden states are left alone.
 * HS_ERR_INVALID for a bad id; HS_ERR_MISMATCH if `ds` is not the dataset
 * the plan was built from (fingerprints differ); HS_ERR_IO when the
 * dataset's file changed while it was read (hs_dataset_check). */
__attribute__((warn_unused_result)) hs_status_t hs_plan_fill_batch(const hs_plan_t *plan,
                                                                   const hs_dataset_t *ds,
                                                                   uint32_t batch_id,
                                                                   struct hs_batch_view *view);

#ifdef __cplusplus
}
#endif
#endif /* HS_PLAN_INT_H */
