/* SPDX-License-Identifier: Apache-2.0 */
/* store_int.h - the consumer's hidden-state store (docs/store.md): every
 * verified batch region of a run written once to disk, so later epochs and
 * later runs of the same plan read it back instead of asking a producer.
 *
 * A store is a folder bound to one run:
 *
 *   store.json        dataset fingerprint, layout (with its dtype), plan hash
 *                     and basis, seed, batches per epoch, token budget, the
 *                     target (fingerprint and name); written once, atomically, when the run is
 *                     first defined (format version 2)
 *   plan.bin          the plan's shape: "HSP1", n, n_seqs[n], n_tokens[n]
 *                     (u32 little-endian), then XXH3-64 of all of it; at
 *                     open the shapes must give store.json's plan hash
 *                     (hs_plan_hash_of), or the store is refused
 *   lock              flock()ed by the one consumer using the store
 *   shard-NNNNN.hsd   batch regions exactly as verified (header, body and
 *                     checksum untouched), each at a 4096-byte boundary;
 *                     every consumer session appends to a shard of its own
 *   index.hsi         one 64-byte record per stored region (hs_store_rec_t),
 *                     appended only after the region is on disk (fdatasync),
 *                     each sealed with XXH3-64 of its first 56 bytes
 *
 * Crash safety: a region is synced before its record is written, so a record
 * names only whole regions. At open a record is kept only when its seal,
 * magic, plan hash, batch, shape and length all check and its shard holds
 * every byte it names; a torn tail of the index is cut off. Reading a region
 * back checks its header against the record, and the consumer verifies the
 * whole checksum before delivery: a region that fails is forgotten and its
 * batch computed again, never delivered.
 *
 * Threads: open, bind and close on the caller's thread; the writer has a
 * thread of its own fed by a bounded queue (submit never blocks and never
 * allocates); has/read/forget/slot_release/stats from any thread (one lock,
 * never held across a system call).
 *
 * Ownership: the store owns its files, its plan arrays and its thread. A
 * queued region's cache slot is read by the writer until it is written; a
 * slot the trainer released meanwhile is freed through the free callback. */
#ifndef HS_STORE_INT_H
#define HS_STORE_INT_H

#include <stdbool.h>
#include <stdint.h>
#include <stddef.h>

#include "hsflow.h"
#include "hs_proto.h"

#define HS_STORE_REC_BYTES 64u
#define HS_STORE_REC_MAGIC 0x31495348u /* "HSI1" */
#define HS_STORE_ALIGN 4096u
#define HS_STORE_SHARD_BYTES (4ull << 30) /* a new shard past this */
#define HS_STORE_QUEUE_MAX 64u            /* regions waiting for the writer */

/* One index record, little-endian on disk. */
typedef struct {
    uint32_t magic;
    uint32_t batch;
    uint32_t shard;
    uint32_t n_seqs;
    uint32_t n_tokens;
    uint32_t reserved;
    uint64_t offset; /* in the shard; multiple of HS_STORE_ALIGN */
    uint64_t bytes;  /* the region's total_bytes */
    uint64_t checksum;
    uint64_t plan_hash;
    uint64_t seal; /* XXH3-64 of the 56 bytes above */
} hs_store_rec_t;

/* The run a store is bound to. */
typedef struct {
    uint64_t dataset_fingerprint, plan_hash, seed;
    uint64_t plan_basis;         /* plan_hash == hs_plan_hash_of(plan_basis, the shapes) */
    uint64_t target_fingerprint; /* the target whose states it holds (hs_target_fingerprint) */
    hs_layout_t layout;
    uint32_t n_batches, token_budget;
    char model[256];
    uint32_t *n_seqs, *n_tokens; /* [n_batches] */
} hs_store_run_t;

typedef struct {
    uint64_t batches;     /* batches stored (of the bound run) */
    uint64_t bytes;       /* their bytes */
    uint64_t writes;      /* regions written by this session */
    uint64_t write_bytes; /* ... their bytes */
    uint64_t skipped;     /* not stored: the writer's queue was full */
    uint64_t dropped;     /* records dropped at open (torn, sealed wrong, short shard) */
    uint64_t forgotten;   /* regions that failed their check when read back */
    uint64_t reads, read_bytes;
    bool full; /* the disk filled (ENOSPC): no more writes this session */
} hs_store_stats_t;

typedef struct hs_store hs_store_t;

/* Opens (creating when missing) the store folder `dir` and reads what it
 * holds: the run it is bound to, if any, and every index record that checks
 * (see the top). HS_ERR_IO (logged, naming the path and what to do) when
 * the folder cannot be made or read; HS_ERR_FORMAT for a store.json,
 * plan.bin or index.hsi that is not one (a folder of something else; a
 * link, FIFO or device in its place; an index larger than the plan can
 * need, refused before it is read). Files are opened inside the folder,
 * never through a link, regular files only (store.c, store_file_open). */
HS_MUST_CHECK hs_status_t hs_store_open(const char *dir, hs_store_t **out);

/* Tests: faults of the stores bound afterwards, "enospc=N" (the Nth write
 * fails as with a full disk) or "kill=N" (the Nth write stops half way and
 * kills the process); NULL or "" = none. Copied; process-wide
 * (hs-consumer: HS_STORE_FAULT). */
void hs_store_fault_set(const char *spec);
/* Waits for the writer to write what is queued (unless the disk filled),
 * stops it and closes everything. NULL ok. */
void hs_store_close(hs_store_t *s);
const char *hs_store_dir(const hs_store_t *s);

/* The run the store is bound to, or NULL for a store without one yet. */
const hs_store_run_t *hs_store_run(const hs_store_t *s);
/* A run (or a producer's offer of one) against the store's: HS_OK when the
 * store has none or they are the same; else HS_ERR_MISMATCH with every
 * field that differs named in why, both values each. The target is its
 * fingerprint (`model` only names it); dataset_fingerprint 0: not compared. */
HS_MUST_CHECK hs_status_t hs_store_check(const hs_store_t *s, uint64_t dataset_fingerprint,
                                         const hs_layout_t *layout, uint64_t plan_hash,
                                         uint32_t n_batches, uint64_t target_fingerprint,
                                         const char *model, char *why, size_t whycap);

/* Slots whose region the writer has written or given up on go back through
 * this (any thread but the caller's of submit, which never calls it). */
typedef void (*hs_store_free_cb)(void *arg, uint64_t slot_offset);

/* Binds the store to `run` (a new store writes store.json and plan.bin; one
 * already bound must hold this run: check first) and starts the writer,
 * which reads regions from `cache_base` + slot offset and may hold at most
 * `queue_bytes` of them at once. A store that cannot be written is logged
 * once and only read from (HS_OK all the same); HS_ERR_NOMEM otherwise. */
HS_MUST_CHECK hs_status_t hs_store_bind(hs_store_t *s, const hs_store_run_t *run,
                                        const void *cache_base, uint64_t queue_bytes,
                                        hs_store_free_cb free_cb, void *free_arg);

/* After bind: whether the store holds batch `batch` (and has not forgotten it). */
bool hs_store_has(const hs_store_t *s, uint32_t batch);
/* Reads the region of `batch` into dst[bytes] and checks its header against
 * the index (size, batch, checksum field); the caller checks the body.
 * HS_ERR_NOT_FOUND when the store lacks it, HS_ERR_IO or HS_ERR_FORMAT with
 * the reason in why. */
HS_MUST_CHECK hs_status_t hs_store_read(hs_store_t *s, uint32_t batch, void *dst, uint64_t bytes,
                                        char *why, size_t whycap);
/* The region of `batch` failed its check: it is missing from now on, and the
 * next time the batch is delivered it is written again. */
void hs_store_forget(hs_store_t *s, uint32_t batch);

/* After bind: queues the verified region of `batch` in the cache slot at
 * `slot_offset` for the writer. False when it is not queued: the store has
 * it or queues it already, the disk filled, or the queue is full (counted
 * in `skipped`: a later epoch stores it). Never blocks, never allocates. */
bool hs_store_submit(hs_store_t *s, uint32_t batch, uint64_t slot_offset, uint64_t bytes);
/* The trainer is done with the slot at `slot_offset`: true when the writer
 * still reads it (the writer frees it through free_cb when done), false
 * when the caller frees it now. */
bool hs_store_slot_release(hs_store_t *s, uint64_t slot_offset);

void hs_store_stats(const hs_store_t *s, hs_store_stats_t *out);

/* A record's seal, and a record from its 64 bytes on disk (no check). */
uint64_t hs_store_rec_seal(const hs_store_rec_t *r);

#endif /* HS_STORE_INT_H */
