/* SPDX-License-Identifier: Apache-2.0 */
/* delivery_int.h - the trainer's side of the consumer (delivery.c):
 * hs_consumer_next(), hs_consumer_release() and hs_consumer_state_save(),
 * the queue of deliverable batches that the network thread fills, the
 * tickets the trainer released that it takes back, and the GPU delivery's
 * double buffering.
 *
 * Threads: the network thread and the trainer meet in
 * hs__consumer_delivery_t, every field under its lock; GPU delivery
 * (hs__consumer_gpu_t) is the trainer's thread only, apart from the copy
 * records its copy stream's callback reads. */
#ifndef HS_DELIVERY_INT_H
#define HS_DELIVERY_INT_H

#include <pthread.h>

#include "hsflow.h"
#include "gpu_loader_int.h"
#include "sched_int.h"
#include "state_int.h"

typedef struct hs_consumer hs_consumer_t;

/* Shared by the network thread and the trainer: every field under `lock`. */
typedef struct {
    pthread_mutex_t lock;
    pthread_cond_t cond;    /* a batch became deliverable, or the run ended */
    hs_sched_item_t *ready; /* ring of deliverable batches */
    uint32_t ready_head, ready_n, ready_cap;
    uint64_t *released; /* tickets released by the trainer, for the scheduler */
    uint32_t released_n, released_cap;
    bool finished;
    bool
        halted; /* refused to go on (another consumer holds its rank): nothing more is handed out */
    uint64_t batches_planned, batches_delivered, tokens_delivered, bytes_received;
    uint64_t checksum_failures, in_trainer;
    bool held_back; /* a batch given back with hs_consumer_unget() waits to go out again */
    double t_start, t_end, starve_s;
    double t_wait;            /* the trainer waits for a batch since then; 0 when it does not */
    hs_consumer_stats_t snap; /* network thread's figures */
    char waiting[160];        /* what start-up waits for ("" once running) */
    uint64_t max_batch_bytes;
    uint64_t h2d_bytes;
    double h2d_s;
    /* Once the plan is known, the position: every batch handed to the
     * trainer, the resume state's included. */
    hs_state_t *position;
    uint64_t batches_resumed;
    /* last time a producer was connected, and how long none may be before
     * the status line says so (c->no_producer_warn_s) */
    double t_producer_seen;
} hs__consumer_delivery_t;

/* The batches handed to the trainer and not yet released, by ticket (the
 * trainer's thread only). A release must name one of them: tickets are
 * never reused, so a second release of a batch, or of a batch whose slot
 * now holds another, finds nothing and frees nothing. Room grows only when
 * the trainer holds more batches at once than ever before. */
typedef struct {
    uint64_t ticket, slot_offset;
    uint32_t epoch, batch;
    uint16_t *rows; /* host delivery of an fp8 run: its dequantised rows, else NULL */
} hs__handed_t;

typedef struct {
    hs__handed_t *v;
    uint32_t n, cap;
    /* host delivery of an fp8 run: bf16 row buffers (token budget x k*H),
     * n_rows made in all, n_free of them not in use */
    uint16_t **free_rows;
    uint32_t n_free, cap_rows, n_rows;
    /* The batch hs_consumer_unget() gave back (still in v: its slot or
     * device buffer stays as it was), which hs_consumer_next() hands out
     * before any other. */
    hs_batch_t held;
    bool has_held;
} hs__consumer_handed_t;

/* What the copy-done callback frees: the slot and ticket of one copy. */
typedef struct {
    hs_consumer_t *c;
    uint64_t slot_offset, ticket;
} gpu_copy_done_t;
#define HS_GPU_DONE_RING 8

/* GPU delivery (cfg.gpu >= 0): the trainer's thread only; `done` records
 * are read by the copy stream's callback once their copy completes. */
typedef struct {
    hs__loader_t *loader;    /* NULL without a GPU */
    hs_sched_item_t item[2]; /* the batch in each device buffer */
    gpu_copy_done_t done[HS_GPU_DONE_RING];
    uint32_t done_next;
    int cur;      /* buffer handed to the trainer, -1 none */
    int inflight; /* buffer being copied, not yet handed, -1 none */
    int last;     /* buffer handed most recently */
} hs__consumer_gpu_t;

/* The network thread's side, once the plan is known: room for `batches`
 * deliverable and released batches at once (the most the cache holds), so
 * the queues do not grow on the data path. HS_ERR_NOMEM (logged); they then
 * grow as needed. */
HS_MUST_CHECK hs_status_t hs__delivery_plan(hs_consumer_t *c, uint32_t batches);
/* Queues a deliverable batch and wakes the
 * trainer; false (warned) when the queue could not grow: retry later. */
bool hs__delivery_push(hs_consumer_t *c, const hs_sched_item_t *it);
/* Every batch is delivered (or none was left): the trainer's next call
 * returns HS_ERR_CLOSED once the queue is empty. */
void hs__delivery_finish(hs_consumer_t *c);
/* Retires the scheduler records of batches the trainer released. */
void hs__released_collect(hs_consumer_t *c);

#endif /* HS_DELIVERY_INT_H */
