/* SPDX-License-Identifier: Apache-2.0 */
/* hs_data.h - token datasets (JSONL or .hst files) and the batch plan over
 * them: what the producer, hs-forward and hs-data use of the data module.
 *
 * Datasets. A dataset is n sequences, each a run of input_ids (int32, >= 0)
 * with a loss_mask (u8, 0/1) of the same length. Two file formats, told apart
 * by their first bytes, not by their name:
 *   - JSONL: one object per line, {"input_ids": [...], "loss_mask": [...]}
 *     (loss_mask optional, all ones by default; blank lines skipped);
 *   - .hst: hsflow's binary token file (docs/hst-format.md), mapped read-only;
 *     its offsets are copied and checked at open, so every read stays inside
 *     the mapping whatever happens to the file later (guarded against the
 *     file changing or shrinking under the mapping: hs_dataset_check).
 *
 * The plan. A plan is a deterministic function of (dataset fingerprint, token
 * budget, max sequence length, overflow policy, seed). Sequences longer than
 * max_seq_len are truncated (their first max_seq_len tokens are kept) or
 * dropped; the rest are sorted by length, longest first (ties by sample id),
 * and packed first-fit-decreasing into batches of at most token_budget
 * tokens. Batch ids 0..n_batches-1 follow packing order; an epoch visits them
 * in the order hs_permutation(seed, epoch, n_batches), the same function the
 * consumer uses. Every producer computes the same plan and proves it by the
 * plan hash (DESIGN §1).
 *
 * Ownership: hs_dataset_open() returns a dataset the caller releases with
 * hs_dataset_close(). Pointers returned by hs_dataset_ids()/hs_dataset_mask()
 * point into the dataset and stay valid until it is closed. A dataset is
 * immutable once open, so several threads may read it at once.
 * hs_plan_build() returns a plan the caller frees with hs_plan_destroy().
 * Arrays returned by hs_plan_batch() point into the plan and live until it is
 * destroyed. A plan is immutable once built; any number of threads may read
 * it. */
#ifndef HS_DATA_H
#define HS_DATA_H

#include <stdint.h>
#include <stddef.h>

#include "hsflow.h"
#include "hs_region.h" /* hs_batch_view_t, which the plan fills */

#ifdef __cplusplus
extern "C" {
#endif

/* ---- datasets ------------------------------------------------------------ */

typedef struct hs_dataset hs_dataset_t;

typedef enum { HS_DATASET_JSONL = 1, HS_DATASET_HST = 2 } hs_dataset_format_t;

/* Opens `path`, choosing the format by content. Any malformed line or
 * structure fails the whole load with HS_ERR_FORMAT, after logging
 * "file:line: what is wrong" (nothing is skipped silently). A dataset with
 * no sequences is rejected. *out is set only on success. */
HS_MUST_CHECK hs_status_t hs_dataset_open(const char *path, hs_dataset_t **out);
/* Same as hs_dataset_open() for a file's bytes in memory, buf[len] (copied
 * where the dataset needs them: buf may go once this returns); `name`
 * stands for the file in messages. */
HS_MUST_CHECK hs_status_t hs_dataset_open_memory(const void *buf, size_t len, const char *name,
                                                 hs_dataset_t **out);
void hs_dataset_close(hs_dataset_t *ds); /* NULL is fine */

hs_dataset_format_t hs_dataset_format(const hs_dataset_t *ds);
uint64_t hs_dataset_count(const hs_dataset_t *ds);
uint64_t hs_dataset_total_tokens(const hs_dataset_t *ds);
/* Sequence i (i < count): its length (>= 1), ids and mask (len entries). */
uint32_t hs_dataset_seq_len(const hs_dataset_t *ds, uint64_t i);
const int32_t *hs_dataset_ids(const hs_dataset_t *ds, uint64_t i);
const uint8_t *hs_dataset_mask(const hs_dataset_t *ds, uint64_t i);

/* HS_OK while the dataset's file still holds what was validated at open.
 * A .hst file's tokens are read in place through its mapping, placed by the
 * offsets checked at open; if it is truncated or rewritten in place
 * meanwhile (its size, modification or change time differ), reads stay in
 * the mapping, reads of lost pages see zeros instead of killing the process
 * with SIGBUS, and from then on this returns HS_ERR_IO (logged once, naming
 * the file). Call it after reading a batch's tokens and
 * before trusting them. JSONL and in-memory datasets always pass. Costs one
 * fstat.
 * The library's SIGBUS handler that catches those reads is installed only
 * while a .hst dataset is open: the first open saves the process's handler
 * and installs it, faults outside .hst mappings go on to the saved handler,
 * and the last close puts it back (unless the process installed another one
 * meanwhile: that one stays). */
HS_MUST_CHECK hs_status_t hs_dataset_check(const hs_dataset_t *ds);

/* XXH3-64 of the dataset's canonical body: the offsets (u64 x n+1), then
 * every input_id (i32), then every loss_mask byte, all little-endian; the
 * same data gives the same fingerprint whatever file it came from. */
uint64_t hs_dataset_fingerprint(const hs_dataset_t *ds);

/* Writes `ds` as an .hst file: to a temporary file in the same directory,
 * flushed, then renamed over `path`, so a reader never sees half a file. */
HS_MUST_CHECK hs_status_t hs_dataset_write_hst(const hs_dataset_t *ds, const char *path);

/* What a pass over a dataset found (hs_dataset_import, hs_dataset_summarize). */
typedef struct {
    hs_dataset_format_t format; /* of the input */
    uint64_t n;                 /* sequences */
    uint64_t total;             /* tokens */
    uint64_t loss;              /* tokens with loss_mask 1 */
    uint32_t min_len, max_len;
    uint64_t hist[33]; /* sequences by floor(log2(length)) */
    uint64_t fingerprint;
} hs_dataset_summary_t;

/* Progress of a long pass: `done` of `total` bytes of the input read (the
 * pass has a "scan", a "parse" and a "hash" stage), `seqs` sequences so far.
 * Called every few MiB, from the calling thread; may be NULL. */
typedef void (*hs_dataset_progress_cb)(void *arg, const char *stage, uint64_t done, uint64_t total,
                                       uint64_t seqs);

/* Converts the dataset at `in` (JSONL or .hst) to an .hst file at `out`,
 * streaming: memory stays bounded by a constant plus the longest line, not
 * by the dataset. The file is written to a temporary file in out's folder
 * (with the mask spooled beside it), flushed and renamed over `out` at the
 * end; on any failure `out` is left as it was. An `out` that is `in` (the
 * same file, also through a link) is refused with HS_ERR_INVALID before
 * anything is written. Errors are logged as hs_dataset_open logs them.
 * *sum (may be NULL) is set on success. */
HS_MUST_CHECK hs_status_t hs_dataset_import(const char *in, const char *out,
                                            hs_dataset_progress_cb cb, void *cb_arg,
                                            hs_dataset_summary_t *sum);

/* The summary of the dataset at `path` without keeping it in memory: a JSONL
 * file is streamed into an unlinked temporary .hst in $TMPDIR (default
 * /var/tmp; 5 bytes per token) to compute its fingerprint; a .hst file is
 * opened and checked as hs_dataset_open does. */
HS_MUST_CHECK hs_status_t hs_dataset_summarize(const char *path, hs_dataset_progress_cb cb,
                                               void *cb_arg, hs_dataset_summary_t *sum);

/* Builds a dataset from memory (copies everything): n sequences, lens[i]
 * tokens each, ids/mask concatenated; mask may be NULL (all ones). For
 * tests and callers that hold their tokens in memory. */
HS_MUST_CHECK hs_status_t hs_dataset_from_arrays(uint64_t n, const uint32_t *lens,
                                                 const int32_t *ids, const uint8_t *mask,
                                                 hs_dataset_t **out);

/* ---- the batch plan ------------------------------------------------------ */

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

/* The plan's option table (data/options.c): each setting's name, flag
 * (hs-data plan's), default and bounds, which hs_plan_build checks; see
 * hs_option_info_t (hsflow.h). */
uint32_t hs_plan_option_count(void);
HS_MUST_CHECK hs_status_t hs_plan_option_info(uint32_t i, hs_option_info_t *out);
/* Every setting at its option's default: token_budget 0 (it has none: give
 * one), max_seq_len 0 (the budget), truncate, seed 0, progress every 5 s. */
void hs_plan_config_default(hs_plan_config_t *cfg);
/* Sets the option `name` ("token_budget") of cfg from its text, checked
 * against its bounds: HS_OK, or HS_ERR_INVALID with why[why_cap] saying
 * what was expected (logged when why is NULL); cfg is then unchanged. */
HS_MUST_CHECK hs_status_t hs_plan_config_set(hs_plan_config_t *cfg, const char *name,
                                             const char *value, char *why, size_t why_cap);

typedef struct hs_plan hs_plan_t;

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
 * message saying which value to change) for a setting out of its option's
 * bounds (a budget of 0 or above INT32_MAX, ...), max_seq_len >
 * token_budget, or a plan with no sequence left. */
HS_MUST_CHECK hs_status_t hs_plan_build(const hs_dataset_t *ds, const hs_plan_config_t *cfg,
                                        hs_plan_t **out);
void hs_plan_destroy(hs_plan_t *plan); /* NULL is fine */

uint32_t hs_plan_n_batches(const hs_plan_t *plan);
/* Batch `id` (< n_batches) into *out; HS_ERR_INVALID for a bad id. */
HS_MUST_CHECK hs_status_t hs_plan_batch(const hs_plan_t *plan, uint32_t id, hs_plan_batch_t *out);
/* hs_plan_hash_of() (hs_plan_hash.h) of the basis and the batch shapes. */
uint64_t hs_plan_hash(const hs_plan_t *plan);
/* What the plan hash is built on besides the shapes (hs_plan_hash_of), sent
 * in HELLO so that the consumer checks the shapes against the hash. */
uint64_t hs_plan_basis(const hs_plan_t *plan);
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
#endif /* HS_DATA_H */
