/* SPDX-License-Identifier: Apache-2.0 */
/* net.c - the producer's network loop (DESIGN §2): the calling thread (or,
 * for the library API, a thread of its own) progresses the transport, which
 * runs session.c's callbacks, sends every batch the workers finished (DONE
 * frame + payload straight from its staging buffer, given back when the send
 * completes), drains on a stop request, and sends the heartbeat. */
#include "net_int.h"
#include "hs_log.h"
#include "hs_time.h"

#include <stdio.h>
#include <stdlib.h>

#include "report_int.h"
#include "session_int.h"
#include "worker_int.h" /* ticket records */

static void cb_sent(void *arg, hs_status_t status)
{
    staging_t *st = arg;
    producer_t *pr = st->owner->pr;
    hs_trace("staging buffer of worker %u sent in %.1f ms", st->owner->index,
             1e3 * (hs_now_s() - st->t_send));
    pthread_mutex_lock(&pr->sh.lock);
    st->queued = false;
    st->busy = false;
    pthread_cond_broadcast(&pr->sh.cond);
    pthread_mutex_unlock(&pr->sh.lock);
    (void)status; /* a failed send means the connection is gone: cb_close reports it */
}

/* Sends every batch the workers finished: DONE frame + payload from staging. */
static void flush_outbox(producer_t *pr)
{
    pthread_mutex_lock(&pr->sh.lock);
    outgoing_t *o = pr->sh.outbox;
    pr->sh.outbox = NULL;
    pthread_mutex_unlock(&pr->sh.lock);
    /* The list is newest first; send oldest first. */
    outgoing_t *rev = NULL;
    while (o) {
        outgoing_t *n = o->next;
        o->next = rev;
        rev = o;
        o = n;
    }
    while (rev) {
        o = rev;
        rev = o->next;
        hs_status_t st = HS_ERR_CLOSED;
        /* A batch ticketed by an earlier connection is of no use to this one. */
        link_t *l = &pr->net.links[o->t.link];
        if (l->conn && l->welcomed && o->t.gen == l->gen) {
            Hsflow__Done d = HSFLOW__DONE__INIT;
            size_t len;
            d.ticket_id = o->t.id;
            d.epoch = o->t.epoch;
            d.batch = o->t.batch;
            d.bytes = o->t.bytes;
            d.checksum = o->checksum;
            d.worker = o->worker;
            d.compute_ns = o->compute_ns;
            st = hs_msg_pack(HS_MSG_DONE, &d.base, pr->net.frame_buf, HS_FRAME_MAX_BODY, &len);
            o->st->t_send = hs_now_s();
            if (st == HS_OK)
                st = hs_tp_send_payload(l->conn, pr->net.frame_buf, len, o->st->buf, o->t.bytes,
                                        cb_sent, o->st);
        }
        if (st != HS_OK) cb_sent(o->st, st); /* o is o->st's: not touched after */
    }
}

/* A stop was requested (SIGTERM/SIGINT in hs-producer): take no new work,
 * drop the tickets not started (the consumer hands them to the others once
 * this connection closes), let the batches being computed finish. */
static void begin_stop(producer_t *pr)
{
    pr->net.stopping = true;
    pr->net.t_stop = hs_now_s();
    uint32_t dropped = 0, busy = 0;
    pthread_mutex_lock(&pr->sh.lock);
    while (pr->sh.tickets) {
        ticket_t *t = pr->sh.tickets;
        pr->sh.tickets = t->next;
        hs__ticket_put(pr, t);
        dropped++;
    }
    pr->sh.tickets_tail = NULL;
    for (uint32_t i = 0; i < pr->cfg->n_workers; i++)
        for (uint32_t k = 0; k < pr->workers[i].n_staging; k++)
            busy += pr->workers[i].staging[k].busy;
    pthread_mutex_unlock(&pr->sh.lock);
    pr->net.tickets_returned += dropped;
    hs_info("stop requested: finishing %u batch(es) in progress, leaving %u queued ticket(s) to "
            "the other producers",
            busy, dropped);
}

/* Stopping: once nothing is computed or on the wire (or after the drain
 * limit), say BYE and end the run successfully. */
static void drain_step(producer_t *pr)
{
    const double limit_s = 60.0;
    bool idle = true;
    pthread_mutex_lock(&pr->sh.lock);
    for (uint32_t i = 0; i < pr->cfg->n_workers && idle; i++)
        for (uint32_t k = 0; k < pr->workers[i].n_staging; k++)
            if (pr->workers[i].staging[k].busy) idle = false;
    if (pr->sh.outbox) idle = false;
    pthread_mutex_unlock(&pr->sh.lock);
    bool late = hs_now_s() - pr->net.t_stop > limit_s;
    bool connected = false;
    for (uint32_t i = 0; i < pr->net.n_links; i++)
        connected |= pr->net.links[i].conn != NULL;
    if (!idle && !late && connected) return;
    if (late && !idle)
        hs_warn("stop: batches still in progress after %.0f s; leaving them to the consumer",
                limit_s);
    if (connected) {
        char reason[160];
        snprintf(reason, sizeof reason, "producer stopped on request; %u ticket(s) returned",
                 pr->net.tickets_returned);
        Hsflow__Bye b = HSFLOW__BYE__INIT;
        b.reason = reason;
        for (uint32_t i = 0; i < pr->net.n_links; i++) {
            link_t *l = &pr->net.links[i];
            if (!l->conn) continue;
            hs__link_send_msg(l, HS_MSG_BYE, &b.base);
            hs_tp_close(l->conn, HS_ERR_CLOSED);
        }
        hs_info("stopped on request: told the consumer%s BYE (%u ticket(s) returned)",
                pr->net.n_links > 1 ? "s" : "", pr->net.tickets_returned);
    }
    pr->net.done = true;
}

/* The network loop: until the consumer says BYE, the connection is lost, or
 * a local failure. Wakes everyone waiting on pr->sh.cond when it ends. */
void *hs__net_main(void *arg)
{
    producer_t *pr = arg;
    double t_status = hs_now_s();
    double status_interval = pr->cfg->status_interval_s == 0 ? 5.0 : pr->cfg->status_interval_s;
    while (!pr->net.done) {
        hs_status_t st = hs_tp_progress(pr->tp, pr->net.stopping ? 20 : 200);
        if (st != HS_OK) { /* the transport's event loop failed (logged there) */
            pthread_mutex_lock(&pr->sh.lock);
            if (pr->sh.result == HS_OK) pr->sh.result = st;
            pr->sh.stop = true;
            pthread_mutex_unlock(&pr->sh.lock);
            pr->net.done = true;
            break;
        }
        if (!pr->net.stopping && pr->cfg->stop_requested && *pr->cfg->stop_requested)
            begin_stop(pr);
        bool welcomed = false;
        for (uint32_t i = 0; i < pr->net.n_links; i++) {
            link_t *l = &pr->net.links[i];
            if (l->lost && pr->net.stopping) { /* nobody to finish for there */
                l->lost = false;
                l->done = true;
            }
            if (l->lost) hs__link_reconnect(l);
            welcomed |= l->welcomed;
        }
        hs__links_update_done(pr);
        if (pr->net.done) break;
        flush_outbox(pr);
        if (pr->net.stopping && !pr->net.done) drain_step(pr);
        if (pr->sh.stop && pr->sh.result != HS_OK && !pr->net.done)
            hs__producer_fail_all(pr, pr->sh.result, "worker failed");
        if (pr->api.close_requested && !pr->net.done) {
            Hsflow__Bye b = HSFLOW__BYE__INIT;
            b.reason = "producer closed before the run ended";
            for (uint32_t i = 0; i < pr->net.n_links; i++) {
                link_t *l = &pr->net.links[i];
                if (!l->conn) continue;
                hs__link_send_msg(l, HS_MSG_BYE, &b.base);
                hs_tp_close(l->conn, HS_ERR_CLOSED);
            }
            pr->net.done = true;
        }
        double now = hs_now_s();
        if (welcomed && now - pr->net.t_beat >= pr->net.heartbeat_s) hs__report_send_stats(pr);
        if (welcomed && status_interval > 0 && now - t_status >= status_interval) {
            t_status = now;
            hs__report_print_status(pr);
        }
    }
    /* Let BYE/ERROR and the last completions go out. */
    for (int i = 0; i < 3; i++)
        if (hs_tp_progress(pr->tp, 10) != HS_OK) break;
    pthread_mutex_lock(&pr->sh.lock);
    pr->sh.net_done = true;
    pthread_cond_broadcast(&pr->sh.cond);
    pthread_mutex_unlock(&pr->sh.lock);
    return NULL;
}
