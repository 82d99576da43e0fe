/* SPDX-License-Identifier: Apache-2.0 */
/* tickets.c - the batches' way through the network thread: tickets against
 * reserved cache slots, DONE frames and their payloads, the checksum
 * threads' verdicts, deliverable batches onto the delivery queue, and the
 * leases of producers that stopped making progress (see tickets_int.h). */
#include "consumer_int.h"
#include "hs_log.h"
#include "hs_time.h"

#include <string.h>

void hs__on_done(hs_consumer_t *c, peer_t *p, const uint8_t *body, uint32_t len,
                 uint64_t payload_bytes)
{
    ProtobufCMessage *m;
    hs_sched_item_t it;
    if (p->state != PEER_READY) {
        hs__peer_drop(c, p, HS_ERR_PROTO, "DONE before the handshake finished");
        return;
    }
    if (!(m = hs__peer_unpack_in(c, p, &c->net.msg_arena, HS_MSG_DONE, body, len))) return;
    Hsflow__Done *d = (Hsflow__Done *)m;
    if (hs_sched_lookup(c->net.sched, p->id, d->ticket_id, &it) != HS_OK) {
        hs__peer_drop(c, p, HS_ERR_PROTO, "DONE for ticket %llu, which this producer does not hold",
                      (unsigned long long)d->ticket_id);
    } else if (d->epoch != it.epoch || d->batch != it.batch) {
        hs__peer_drop(c, p, HS_ERR_PROTO,
                      "DONE for ticket %llu names batch %u/%u, the ticket was for %u/%u",
                      (unsigned long long)d->ticket_id, d->epoch, d->batch, it.epoch, it.batch);
    } else if (payload_bytes != it.bytes || d->bytes != it.bytes) {
        hs__peer_drop(c, p, HS_ERR_PROTO,
                      "payload of %llu bytes for ticket %llu, which granted exactly %llu",
                      (unsigned long long)payload_bytes, (unsigned long long)d->ticket_id,
                      (unsigned long long)it.bytes);
    } else if (hs_sched_payload_accept(c->net.sched, p->id, d->ticket_id) != HS_OK) {
        /* Its payload is landing or being checked: a second one would be
         * written into the slot after the check, under the trainer. */
        hs__peer_drop(c, p, HS_ERR_PROTO,
                      "a second DONE for ticket %llu (batch %u/%u), whose payload already came",
                      (unsigned long long)d->ticket_id, it.epoch, it.batch);
    } else {
        uint8_t *dest = (uint8_t *)hs_cache_base(c->cache) + it.slot_offset;
        /* a transport that copies the payload itself (shared memory)
         * checksums the body in the same pass */
        if (hs_tp_recv_payload_sum(p->conn, dest, it.bytes, d->ticket_id, HS_BATCH_HEADER_BYTES) ==
            HS_OK) {
            p->receiving++;
            p->receiving_bytes += it.bytes;
            p->t_done_frame = p->t_progress = hs_now_s();
        }
    }
    hs_msg_free_in(&c->net.msg_arena, m);
}

void hs__on_stats(hs_consumer_t *c, peer_t *p, const uint8_t *body, uint32_t len)
{
    ProtobufCMessage *m;
    if (!(m = hs__peer_unpack_in(c, p, &c->net.msg_arena, HS_MSG_STATS, body, len))) return;
    Hsflow__Stats *s = (Hsflow__Stats *)m;
    p->stall_pct = s->stall_pct;
    p->tokens_per_s = s->tokens_per_s;
    p->has_stats = true;
    if (s->progressing) p->t_beat = hs_now_s(); /* heartbeat: see hs__leases_expire */
    hs_msg_free_in(&c->net.msg_arena, m);
}

/* Hands out tickets round-robin while the cache has room and a producer has
 * fewer than workers x prefetch tickets. The workers a producer claims are
 * not verified, so its leases may also pin at most a fair share of the cache
 * (capacity / ready producers; at least one batch): a peer claiming
 * thousands of workers cannot take every slot, and what a stopped one holds
 * comes back through the lease timeout (hs__leases_expire). */
/* Batches at the front of the queue that the store holds are read from it
 * into a reserved slot by the checksum threads (hs__verify_check) and
 * verified like a payload, under the scheduler's own connection id
 * HS__STORE_CONN; a few at a time, so producers keep cache room for what
 * the store lacks. */
static void store_issue(hs_consumer_t *c)
{
    uint32_t max_reads = 2 * c->cfg.verify_threads + 2;
    hs_sched_item_t it;
    while (c->net.store_inflight < max_reads && hs_sched_peek(c->net.sched, &it) &&
           hs_store_has(c->store, it.batch)) {
        uint64_t offset = it.slot_offset, tid;
        if (!it.has_slot) {
            hs_cache_slot_t slot;
            if (hs_cache_reserve(c->cache, it.bytes, &slot) != HS_OK) return; /* full */
            offset = slot.offset;
        }
        hs_sched_item_t li;
        if (hs_sched_lease(c->net.sched, HS__STORE_CONN, offset, &tid) != HS_OK ||
            hs_sched_payload_accept(c->net.sched, HS__STORE_CONN, tid) != HS_OK ||
            hs_sched_get(c->net.sched, tid, &li) != HS_OK) {
            hs__consumer_fatal(c, "consumer: out of memory leasing batch %u to the store",
                               it.batch);
            return;
        }
        hs__verify_job_t j = {
            .peer_id = HS__STORE_CONN, .ticket_id = tid, .item = li, .t_queued = hs_now_s()};
        if (hs__verify_pool_push(c->verify, &j) != HS_OK) {
            hs__consumer_fatal(c, "consumer: out of memory queueing a store read");
            return;
        }
        c->net.store_inflight++;
    }
}

void hs__tickets_issue(hs_consumer_t *c)
{
    if (!c->net.sched || c->stop) return;
    if (c->store) store_issue(c);
    uint32_t n_ready = 0;
    for (peer_t *p = c->net.peers; p; p = p->next)
        if (p->state == PEER_READY && p->conn && !p->dropped) n_ready++;
    if (!n_ready) return;
    uint64_t share = hs_cache_capacity(c->cache) / n_ready;
    double now = hs_now_s();
    bool progress = true;
    while (progress) {
        progress = false;
        for (peer_t *p = c->net.peers; p; p = p->next) {
            if (p->state != PEER_READY || !p->conn || p->dropped) continue;
            /* Tickets whose DONE arrived are no longer on the producer's plate:
             * it is already computing the next one. */
            uint32_t leases = hs_sched_leases_of(c->net.sched, p->id);
            uint32_t held = leases - p->receiving - p->verifying;
            if (held >= p->workers * p->prefetch) continue;
            hs_sched_item_t it;
            if (!hs_sched_peek(c->net.sched, &it)) return;
            if (c->store && hs_store_has(c->store, it.batch)) return; /* read from the store */
            if (leases && hs_sched_bytes_of(c->net.sched, p->id) + it.bytes > share) continue;
            uint64_t offset = it.slot_offset;
            if (!it.has_slot) {
                hs_cache_slot_t slot;
                if (hs_cache_reserve(c->cache, it.bytes, &slot) != HS_OK) return; /* full */
                offset = slot.offset;
            }
            uint64_t tid;
            if (hs_sched_lease(c->net.sched, p->id, offset, &tid) != HS_OK) return;
            if (!leases) p->t_progress = p->t_beat = now; /* its lease clock starts */
            if (c->store) c->net.store_misses++;
            Hsflow__Ticket t = HSFLOW__TICKET__INIT;
            t.ticket_id = tid;
            t.epoch = it.epoch;
            t.batch = it.batch;
            t.bytes = it.bytes;
            t.n_seqs = it.n_seqs;
            t.n_tokens = it.n_tokens;
            t.worker_hint = 0xffffffffu;
            t.slot_offset = offset;
            hs__peer_send_msg(c, p, HS_MSG_TICKET, &t.base);
            progress = true;
        }
    }
}

/* Moves every batch the scheduler says may go next onto the delivery queue. */
void hs__deliverable_push(hs_consumer_t *c)
{
    hs_sched_item_t it;
    bool pushed = false;
    while (c->net.sched && hs_sched_next_ready(c->net.sched, &it)) {
        if (!hs__delivery_push(c, &it)) break;
        if (hs_sched_delivered(c->net.sched, it.ticket) != HS_OK) { /* it was the ready one */
            hs__consumer_fatal(c, "consumer: ticket %llu was queued for the trainer out of turn",
                               (unsigned long long)it.ticket);
            break;
        }
        pushed = true;
    }
    if (pushed) pthread_cond_broadcast(&c->delivery.cond);
    if (c->net.sched && hs_sched_finished(c->net.sched) && !c->net.all_queued) {
        c->net.all_queued = true;
        hs__stats_snapshot(c); /* the trainer may read the figures as soon as it is told */
        hs__delivery_finish(c);
        for (peer_t *p = c->net.peers; p; p = p->next) {
            Hsflow__Bye b = HSFLOW__BYE__INIT;
            b.reason = "every batch of every epoch delivered";
            hs__peer_send_msg(c, p, HS_MSG_BYE, &b.base);
        }
        hs_info("every batch of %u epoch(s) delivered; told producers BYE", c->cfg.epochs);
    }
}

/* ---- checksum threads ------------------------------------------------------- */

/* On a checksum thread: header, checksum and (with verify_synthetic) every
 * element of the batch in its cache slot. */
void hs__verify_check(void *arg, hs__verify_job_t *j)
{
    hs_consumer_t *c = arg;
    uint8_t *region = (uint8_t *)hs_cache_base(c->cache) + j->item.slot_offset;
    if (j->peer_id == HS__STORE_CONN) {
        /* read back into its slot; stored as first verified, so its header
         * names the epoch it was computed for: this delivery's epoch
         * replaces it (the checksum covers the body only) */
        j->status =
            hs_store_read(c->store, j->item.batch, region, j->item.bytes, j->why, sizeof(j->why));
        if (j->status != HS_OK) return;
        ((hs_batch_header_t *)region)->epoch = j->item.epoch;
    }
    j->status = hs_batch_verify_sum(region, j->item.bytes, j->item.epoch, j->item.batch,
                                    j->item.n_seqs, j->item.n_tokens, &c->run.layout,
                                    j->have_sum ? &j->sum : NULL, j->why, sizeof(j->why));
    if (j->status == HS_OK && c->cfg.verify_synthetic) {
        hs_batch_view_t v =
            hs_batch_view((void *)region, j->item.n_seqs, j->item.n_tokens, &c->run.layout);
        j->status = hs_batch_synth_check(&v, &c->run.layout, j->why, sizeof(j->why));
    }
}

void hs__verify_wake(void *arg)
{
    hs_consumer_t *c = arg;
    hs_tp_wakeup(c->tp);
}

/* Settles one verdict: a good batch is filled in the scheduler; a bad one
 * drops its producer (its ticket goes back to the queue when it is reaped). */
static void store_verified(hs_consumer_t *c, const hs__verify_job_t *j)
{
    c->net.store_inflight--;
    if (j->status == HS_OK && hs_sched_fill(c->net.sched, HS__STORE_CONN, j->ticket_id) == HS_OK) {
        c->net.store_hits++;
        return;
    }
    hs_warn("store %s: batch %u read back for epoch %u failed its check (%s); it is computed "
            "again and stored anew",
            hs_store_dir(c->store), j->item.batch, j->item.epoch, j->why);
    c->net.store_bad++;
    hs_store_forget(c->store, j->item.batch);
    if (hs_sched_requeue(c->net.sched, HS__STORE_CONN, j->ticket_id) != HS_OK)
        hs__consumer_fatal(c, "consumer: batch %u could not go back to the queue", j->item.batch);
}

static void verified_one(hs_consumer_t *c, const hs__verify_job_t *j)
{
    if (j->peer_id == HS__STORE_CONN) {
        store_verified(c, j);
        return;
    }
    peer_t *p = hs__peer_find(c, j->peer_id);
    if (j->status == HS_OK) {
        hs_trace("ticket %llu: verified %.1f ms after landing", (unsigned long long)j->ticket_id,
                 1e3 * (hs_now_s() - j->t_queued));
        if (hs_sched_fill(c->net.sched, j->peer_id, j->ticket_id) == HS_OK) {
            pthread_mutex_lock(&c->delivery.lock);
            c->delivery.bytes_received += j->item.bytes;
            pthread_mutex_unlock(&c->delivery.lock);
            /* first verified: the writer stores it (or counts it skipped) */
            if (c->store)
                (void)hs_store_submit(c->store, j->item.batch, j->item.slot_offset, j->item.bytes);
        } else {
            hs_debug("ticket %llu: verified after its producer's lease ended; it was queued again",
                     (unsigned long long)j->ticket_id);
        }
    } else {
        pthread_mutex_lock(&c->delivery.lock);
        c->delivery.checksum_failures++;
        pthread_mutex_unlock(&c->delivery.lock);
        if (p && p->conn && !p->dropped)
            hs__peer_drop(c, p, j->status, "batch %u/%u failed verification: %s", j->item.epoch,
                          j->item.batch, j->why);
        else
            hs_error("batch %u/%u from producer %s failed verification: %s (the producer "
                     "had already left or been cut off; the batch goes back to the queue)",
                     j->item.epoch, j->item.batch, p ? p->name : "(gone)", j->why);
    }
    if (p) {
        p->verifying--;
        hs__peer_reap(c, p);
    }
}

void hs__verified_collect(hs_consumer_t *c)
{
    hs__verify_job_t done[8];
    uint32_t n;
    while ((n = hs__verify_pool_take(c->verify, done, 8)) > 0)
        for (uint32_t i = 0; i < n; i++)
            verified_one(c, &done[i]);
}

void hs__payload_landed(void *arg, hs_tp_conn_t *conn, uint64_t cookie, hs_status_t status)
{
    hs_consumer_t *c = arg;
    peer_t *p = hs_tp_conn_get_user(conn);
    if (!p) return;
    p->receiving--;
    hs_sched_item_t it;
    bool held = hs_sched_lookup(c->net.sched, p->id, cookie, &it) == HS_OK;
    if (held) p->receiving_bytes -= it.bytes;
    if (!p->receiving) p->receiving_bytes = 0;
    if (status != HS_OK) {
        hs__peer_reap(c, p);
        return;
    }
    p->t_progress = hs_now_s();
    if (!held) return; /* cannot happen */
    hs_trace("ticket %llu: %.1f MiB landed in %.1f ms", (unsigned long long)cookie,
             (double)it.bytes / (1 << 20), 1e3 * (hs_now_s() - p->t_done_frame));
    hs__verify_job_t j = {
        .peer_id = p->id, .ticket_id = cookie, .item = it, .t_queued = hs_now_s()};
    j.have_sum = hs_tp_conn_payload_checksum(conn, &j.sum);
    if (hs__verify_pool_push(c->verify, &j) != HS_OK) {
        hs__peer_drop(c, p, HS_ERR_NOMEM, "out of memory");
        return;
    }
    p->verifying++;
}

/* A lease is kept by real progress: a DONE, payload bytes arriving, a
 * payload landing. Two clocks per producer holding tickets:
 *
 *   silent   nothing at all, not even a heartbeat from a computing worker,
 *            for --lease-timeout: stopped or hung (the transport cannot
 *            tell, the kernel still ACKs);
 *   beating  heartbeats but no real progress for --lease-timeout plus the
 *            time the largest batch takes at the slowest rate expected
 *            (--lease-min-rate, 200 tokens/s): a self-report alone cannot
 *            hold tickets forever.
 *
 * A payload arriving counts byte by byte where the transport sees its bytes
 * (TCP); where it does not (UCX), the bound grows by the time the bytes in
 * flight take at HS_LEASE_MIN_BYTES_PER_S, so a slow link is not taken for a
 * stopped producer. A dropped producer's tickets go back to the front of the
 * queue once its payloads settle (hs__peer_reap); a late payload finds its
 * connection closed. */
#define HS_LEASE_MIN_BYTES_PER_S (1 << 20) /* 1 MiB/s */

void hs__leases_expire(hs_consumer_t *c, double now)
{
    double limit = c->cfg.lease_timeout_s;
    if (!c->net.sched || limit <= 0) return;
    double rate = c->cfg.lease_min_tokens_per_s;
    double compute = (double)c->run.token_budget / rate;
    for (peer_t *p = c->net.peers; p; p = p->next) {
        if (p->state != PEER_READY || !p->conn || p->dropped) continue;
        uint32_t n = hs_sched_leases_of(c->net.sched, p->id);
        if (!n) continue;
        double transfer = 0;
        uint64_t rx;
        if (p->receiving) {
            if (hs_tp_conn_payload_bytes_in(p->conn, &rx)) {
                if (rx != p->rx_seen) p->t_progress = now; /* bytes are arriving */
            } else {
                transfer = (double)p->receiving_bytes / HS_LEASE_MIN_BYTES_PER_S;
            }
        }
        if (hs_tp_conn_payload_bytes_in(p->conn, &rx)) p->rx_seen = rx;
        double last = p->t_beat > p->t_progress ? p->t_beat : p->t_progress;
        if (now - last > limit + transfer)
            hs__peer_drop(c, p, HS_ERR_TIMEOUT,
                          "no progress for %.1f s (no DONE, no payload bytes, no heartbeat from a "
                          "computing worker) while holding %u ticket(s); they go back to the "
                          "queue. A stopped producer rejoins with --reconnect; a slow one needs a "
                          "larger --lease-timeout",
                          now - last, n);
        else if (now - p->t_progress > limit + compute + transfer)
            hs__peer_drop(c, p, HS_ERR_TIMEOUT,
                          "no progress for %.1f s: heartbeats but no finished batch while holding "
                          "%u ticket(s), longer than --lease-timeout %g s plus %.1f s for a "
                          "%u-token batch at %.0f tokens/s; they go back to the queue. A producer "
                          "this slow needs a lower --lease-min-rate",
                          now - p->t_progress, n, limit, compute, c->run.token_budget, rate);
    }
}
