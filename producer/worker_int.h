/* SPDX-License-Identifier: Apache-2.0 */
/* worker_int.h - the producer's worker threads (worker.c).
 *
 * A worker takes tickets from sh.tickets while one of its staging buffers
 * is free, fills that buffer with the batch and puts its record on
 * sh.outbox for the network thread. A CPU worker computes the hidden states
 * itself (synthetic or the CPU forward); a GPU worker launches batch n+1 on
 * its GPU before it finishes batch n. Either ends when sh.stop is set, or
 * on a failure it stores in sh.result (setting sh.stop). */
#ifndef HS_WORKER_INT_H
#define HS_WORKER_INT_H

#include "producer_int.h"

/* Thread bodies; `arg` is the worker_t. */
void *hs__worker_cpu_main(void *arg);
void *hs__worker_gpu_main(void *arg);

/* Ticket records (sh.lock held for all but pool_free). pool_grow adds n
 * records (HS_ERR_NOMEM); get takes one, adding records only when every
 * one is in use (NULL when out of memory); put gives one back; pool_free
 * frees them all, queued ones included, once no thread runs. */
HS_MUST_CHECK hs_status_t hs__ticket_pool_grow(producer_t *pr, uint32_t n);
ticket_t *hs__ticket_get(producer_t *pr);
void hs__ticket_put(producer_t *pr, ticket_t *t);
void hs__ticket_pool_free(producer_t *pr);

/* Takes the oldest ticket off sh.tickets (not empty) into *out and gives
 * its record back; sh.lock held. */
void hs__ticket_pop(producer_t *pr, ticket_t *out);

/* Lays out the batch of ticket t in `region` (*v: its views), writes its
 * header and the metadata from the plan (ids, mask, cu_seqlens); hidden
 * states and checksum are left to the caller. The status of
 * hs_plan_fill_batch, logged there. */
HS_MUST_CHECK hs_status_t hs__worker_fill_meta(producer_t *pr, const ticket_t *t, uint8_t *region,
                                               hs_batch_view_t *v);

#endif /* HS_WORKER_INT_H */
