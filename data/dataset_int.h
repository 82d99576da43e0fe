/* SPDX-License-Identifier: Apache-2.0 */
/* dataset_int.h - token datasets for the producer: JSONL or .hst files.
 *
 * A dataset is n sequences, each a run of input_ids (int32, >= 0) with a
 * loss_mask (u8, 0/1) of the same length. Two file formats, told apart by
 * their first bytes, not by their name:
 *   - JSONL: one object per line, {"input_ids": [...], "loss_mask": [...]}
 *     (loss_mask optional, all ones by default; blank lines skipped);
 *   - .hst: hsflow's binary token file (docs/hst-format.md), mapped read-only;
 *     its offsets are copied and checked at open, so every read stays inside
 *     the mapping whatever happens to the file later (guarded against the
 *     file changing or shrinking under the mapping: hs_dataset_check).
 *
 * Ownership: hs_dataset_open() returns a dataset the caller releases with
 * hs_dataset_close(). Pointers returned by hs_dataset_ids()/hs_dataset_mask()
 * point into the dataset and stay valid until it is closed. A dataset is
 * immutable once open, so several threads may read it at once. */
#ifndef HS_DATASET_INT_H
#define HS_DATASET_INT_H

#include "hs_common.h"

#ifdef __cplusplus
extern "C" {
#endif

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
 * fstat. */
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
 * tests and the synthetic source. */
HS_MUST_CHECK hs_status_t hs_dataset_from_arrays(uint64_t n, const uint32_t *lens,
                                                 const int32_t *ids, const uint8_t *mask,
                                                 hs_dataset_t **out);

#ifdef __cplusplus
}
#endif
#endif /* HS_DATASET_INT_H */
