/* SPDX-License-Identifier: Apache-2.0 */
/* tickets_int.h - the batches' way through the network thread (tickets.c):
 * tickets handed out against reserved cache slots, DONE frames and their
 * payloads landing in those slots, the checksum threads' verdicts, the
 * scheduler's deliverable batches onto the delivery queue, and leases of
 * producers that stopped making progress.
 *
 * Threads: the network thread, except hs__verify_check(), which runs on
 * the checksum threads (it reads the batch's cache slot and the run's
 * layout, both fixed while the job is out). */
#ifndef HS_TICKETS_INT_H
#define HS_TICKETS_INT_H

#include "peers_int.h"
#include "verify_int.h"

void hs__on_done(hs_consumer_t *c, peer_t *p, const uint8_t *body, uint32_t len,
                 uint64_t payload_bytes);
void hs__on_stats(hs_consumer_t *c, peer_t *p, const uint8_t *body, uint32_t len);
/* The transport's payload callback (arg: the consumer): a payload landed
 * (or failed to); a landed one goes to the checksum threads. */
void hs__payload_landed(void *arg, hs_tp_conn_t *conn, uint64_t cookie, hs_status_t status);

/* The verify pool's callbacks (arg: the consumer). */
void hs__verify_check(void *arg, hs__verify_job_t *job); /* a checksum thread */
void hs__verify_wake(void *arg);                         /* wakes the network thread */

/* One turn of the network loop: verdicts in, deliverable batches out, new
 * tickets issued, stalled leases dropped. */
void hs__verified_collect(hs_consumer_t *c);
void hs__deliverable_push(hs_consumer_t *c);
void hs__tickets_issue(hs_consumer_t *c);
void hs__leases_expire(hs_consumer_t *c, double now);

#endif /* HS_TICKETS_INT_H */
