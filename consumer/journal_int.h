/* SPDX-License-Identifier: Apache-2.0 */
/* journal_int.h - the consumer's resume journal (DESIGN §2 "Resume"): one
 * line per batch the trainer has released, so a restarted consumer skips
 * them and resumes each epoch where the trainer left it.
 *
 *   hsflow-journal 1 plan=<16 hex digits> batches=<per epoch>[ rank=R world=W uneven=drop]
 *   <epoch> <batch id>
 *   ...
 *
 * Lines are appended and flushed one by one (a consumer or trainer crash
 * loses nothing released before it); the file is synced to disk at most
 * once a second, by a thread of the journal's (started at bind), so the
 * caller of hs_journal_append never waits for the disk. Ownership: the journal owns its file and
 * its bitmap. */
#ifndef HS_JOURNAL_INT_H
#define HS_JOURNAL_INT_H

#include <stdint.h>
#include <stddef.h>

#include "hsflow.h"
#include "state_int.h"

typedef struct hs_journal hs_journal_t;

/* Opens the journal at `path`, creating it if missing; reads and checks
 * every entry (a malformed line is an error naming file:line; a last line
 * cut short by a crash is dropped with a warning). */
HS_MUST_CHECK hs_status_t hs_journal_open(const char *path, hs_journal_t **out);
void hs_journal_close(hs_journal_t *j); /* NULL ok */

/* The rank this consumer is (DESIGN §11), before bind: a journal written by
 * another rank, world size or --uneven mode is refused (HS_ERR_MISMATCH,
 * both named in why); a new one gets them in its header. With world > 1 an
 * epoch is complete once the rank's hs_shard_per_rank() batches are in. */
HS_MUST_CHECK hs_status_t hs_journal_set_shard(hs_journal_t *j, uint32_t rank, uint32_t world,
                                               hs_consumer_uneven_t uneven, char *why,
                                               size_t whycap);

/* Whether the journal fits a plan offered before the plan exchange: HS_OK
 * for a new journal or one written for that plan, else HS_ERR_MISMATCH with
 * both plan hashes in why. Reads only; writes nothing. */
HS_MUST_CHECK hs_status_t hs_journal_check(const hs_journal_t *j, uint64_t plan_hash,
                                           uint32_t n_batches, char *why, size_t whycap);
/* Ties the journal to the run (once its plan is complete and checked): a new journal gets its
 * header; an existing one must have been written for the same plan (HS_ERR_MISMATCH, with both plan
 * hashes in why), its entries must fit `epochs`, and it must hold each batch at most once
 * (HS_ERR_FORMAT naming the repeated entry: an epoch counts as finished only when every batch
 * of it was released). */
HS_MUST_CHECK hs_status_t hs_journal_bind(hs_journal_t *j, uint64_t plan_hash, uint32_t n_batches,
                                          uint32_t epochs, char *why, size_t whycap);
/* After bind: the first epoch with a batch not yet released (== epochs when
 * the run is complete), the number of released batches, and a bitmap of the
 * released ones over (epoch - start_epoch) * n_batches + batch. */
uint32_t hs_journal_start_epoch(const hs_journal_t *j);
uint64_t hs_journal_count(const hs_journal_t *j);
const uint8_t *hs_journal_done(const hs_journal_t *j);

/* A resume state wins over the journal: what was read from the file is
 * ignored, the next bind accepts any plan and writes nothing, and
 * hs_journal_rewrite() then replaces the file's contents. */
void hs_journal_discard(hs_journal_t *j);
/* After bind: replaces the file with a header and exactly the batches of the
 * resume state `s` (written to PATH.tmp, synced, renamed over it) and goes
 * on appending to it; start epoch, count and bitmap follow `s`. */
HS_MUST_CHECK hs_status_t hs_journal_rewrite(hs_journal_t *j, const hs_state_t *s);

/* Records a released batch (after bind); count and bitmap follow.
 * HS_ERR_INVALID (logged, nothing written) for an epoch or batch outside the
 * bound run or one already recorded, HS_ERR_IO (logged) when the write
 * fails. */
HS_MUST_CHECK hs_status_t hs_journal_append(hs_journal_t *j, uint32_t epoch, uint32_t batch);

#endif /* HS_JOURNAL_INT_H */
