/* SPDX-License-Identifier: Apache-2.0 */
/* session.c - the producer's links to its consumers (DESIGN §3, §11): per
 * link the handshake (HELLO; CHALLENGE and AUTH with a shared secret;
 * WELCOME; the PLAN pages when the consumer asks), then TICKETs into the
 * workers' one queue, until BYE, a refusal or a lost connection.
 *
 * The producer may feed several consumers, the ranks of a data-parallel
 * trainer: one link per consumer address, each with its own handshake and
 * tickets, all tickets in the one queue the workers take from. A rank that
 * frees its cache slower issues fewer tickets, so it simply holds fewer of
 * this producer's batches in flight. A finished batch goes back on the link
 * its ticket came from (net.c). */
#include "session_int.h"
#include "worker_int.h" /* ticket records */
#include "hs_status.h"
#include "hs_log.h"
#include "hs_time.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

void hs__link_send_msg(link_t *l, uint16_t type, const ProtobufCMessage *m)
{
    producer_t *pr = l->pr;
    size_t len;
    if (!l->conn) return;
    hs_status_t st =
        hs_msg_pack(type, m, pr->net.frame_buf, HS_FRAME_MAX_BODY + HS_FRAME_HEADER_BYTES, &len);
    if (st == HS_OK) st = hs_tp_send(l->conn, pr->net.frame_buf, len);
    if (st != HS_OK) hs_error("sending %s failed: %s", hs_msg_type_str(type), hs_status_str(st));
}

/* The producer is done once every link is. */
void hs__links_update_done(producer_t *pr)
{
    bool all = true;
    for (uint32_t i = 0; i < pr->net.n_links; i++)
        all &= pr->net.links[i].done;
    if (all) pr->net.done = true;
}

/* Ends link l: ERROR with the text to its consumer, then close. */
static void link_end(link_t *l, hs_status_t code, const char *text)
{
    producer_t *pr = l->pr;
    if (l->conn) {
        size_t len;
        if (hs_msg_error_frame(code, text, pr->net.frame_buf, HS_FRAME_MAX_BODY, &len) == HS_OK &&
            hs_tp_send(l->conn, pr->net.frame_buf, len) != HS_OK)
            hs_debug("consumer %s:%u: the ERROR frame could not be sent", l->host, l->port);
        hs_tp_close(l->conn, code);
    }
    l->done = true;
    l->lost = false;
    if (pr->sh.result == HS_OK) pr->sh.result = code;
}

/* A fault of one consumer's link (a malformed or unexpected frame): that
 * link ends, the others go on. */
static void fail(link_t *l, hs_status_t code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void fail(link_t *l, hs_status_t code, const char *fmt, ...)
{
    char text[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof(text), fmt, ap);
    va_end(ap);
    if (l->pr->net.n_links > 1)
        hs_error("consumer %s:%u: %s", l->host, l->port, text);
    else
        hs_error("%s", text);
    link_end(l, code, text);
    hs__links_update_done(l->pr);
}

void hs__producer_fail_all(producer_t *pr, hs_status_t code, const char *fmt, ...)
{
    char text[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof(text), fmt, ap);
    va_end(ap);
    hs_error("%s", text);
    for (uint32_t i = 0; i < pr->net.n_links; i++)
        if (!pr->net.links[i].done) link_end(&pr->net.links[i], code, text);
    if (pr->sh.result == HS_OK) pr->sh.result = code;
    pr->net.done = true;
}

/* Decodes a frame body from link l's consumer into arena `a` (NULL: the
 * heap); a malformed one fails that link. Free with hs_msg_free_in(a, m). */
static ProtobufCMessage *consumer_unpack_in(link_t *l, hs_msg_arena_t *a, uint16_t type,
                                            const uint8_t *body, uint32_t len)
{
    char why[256];
    ProtobufCMessage *m;
    if (hs_msg_unpack_in(a, type, body, len, &m, why, sizeof(why)) != HS_OK) {
        fail(l, HS_ERR_FORMAT, "bad %s from the consumer: %s", hs_msg_type_str(type), why);
        return NULL;
    }
    return m;
}

static ProtobufCMessage *consumer_unpack(link_t *l, uint16_t type, const uint8_t *body,
                                         uint32_t len)
{
    return consumer_unpack_in(l, NULL, type, body, len);
}

static bool g_plan_lie; /* hs_producer_plan_fault_set("lie") */

void hs_producer_plan_fault_set(const char *spec)
{
    g_plan_lie = spec && !strcmp(spec, "lie");
    if (spec && spec[0] && !g_plan_lie) hs_warn("plan fault '%s' is not 'lie'; ignored", spec);
}

static void send_plan(link_t *l)
{
    producer_t *pr = l->pr;
    uint32_t n = hs_plan_n_batches(pr->plan);
    const uint32_t page = 100000; /* ~1 MB per page, well under the frame limit */
    uint32_t *ns = malloc(page * sizeof(uint32_t)), *nt = malloc(page * sizeof(uint32_t));
    if (!ns || !nt) {
        free(ns);
        free(nt);
        fail(l, HS_ERR_NOMEM, "out of memory sending the plan");
        return;
    }
    for (uint32_t first = 0; first < n; first += page) {
        uint32_t cnt = n - first < page ? n - first : page;
        for (uint32_t i = 0; i < cnt; i++) {
            hs_plan_batch_t b = {0};
            if (hs_plan_batch(pr->plan, first + i, &b) != HS_OK) break; /* ids < n: cannot */
            ns[i] = b.n_seqs;
            nt[i] = b.n_tokens - (g_plan_lie && b.n_tokens > b.n_seqs); /* tests: a false shape */
        }
        Hsflow__Plan m = HSFLOW__PLAN__INIT;
        m.first_batch = first;
        m.n_n_seqs = cnt;
        m.n_seqs = ns;
        m.n_n_tokens = cnt;
        m.n_tokens = nt;
        m.last = first + cnt == n;
        hs__link_send_msg(l, HS_MSG_PLAN, &m.base);
    }
    free(ns);
    free(nt);
}

static void on_challenge(link_t *l, const uint8_t *body, uint32_t len)
{
    producer_t *pr = l->pr;
    ProtobufCMessage *m;
    if (!pr->have_secret) {
        fail(l, HS_ERR_AUTH,
             "the consumer requires authentication: start this producer with --secret-file "
             "(the same file as the consumer's)");
        return;
    }
    if (!(m = consumer_unpack(l, HS_MSG_CHALLENGE, body, len))) return;
    Hsflow__Challenge *c = (Hsflow__Challenge *)m;
    memcpy(l->server_nonce, c->server_nonce.data, HS_AUTH_NONCE_BYTES);
    hs_msg_free(m);
    uint8_t mac[HS_AUTH_MAC_BYTES];
    if (hs_auth_producer_mac(&pr->key, l->server_nonce, l->client_nonce, l->hello_body,
                             l->hello_len, mac) != HS_OK) {
        fail(l, HS_ERR_AUTH, "libsodium could not compute the proof of the shared secret");
        return;
    }
    Hsflow__Auth a = HSFLOW__AUTH__INIT;
    a.mac.data = mac;
    a.mac.len = sizeof(mac);
    hs__link_send_msg(l, HS_MSG_AUTH, &a.base);
}

/* The ranks the welcomed consumers say they are must fit together: one world
 * size, each rank once. Otherwise the whole set is refused, naming both in
 * --to order (not in the order their welcomes happened to arrive). */
static bool links_check_ranks(link_t *l)
{
    producer_t *pr = l->pr;
    for (uint32_t i = 0; i < pr->net.n_links; i++) {
        link_t *o = &pr->net.links[i];
        if (o == l || !o->welcomed || o->done) continue;
        const link_t *a = o->index < l->index ? o : l, *b = a == o ? l : o; /* a first in --to */
        uint32_t wa = a->world ? a->world : 1, wb = b->world ? b->world : 1;
        if (wa != wb) {
            hs__producer_fail_all(
                pr, HS_ERR_MISMATCH,
                "the consumers given to --to differ in world size: %s:%u (%s) is rank %u of "
                "%u, %s:%u (%s) is rank %u of %u; start every rank with the same --world",
                a->host, a->port, a->consumer_name, a->rank, wa, b->host, b->port, b->consumer_name,
                b->rank, wb);
            return false;
        }
        if (a->rank == b->rank) {
            hs__producer_fail_all(
                pr, HS_ERR_MISMATCH,
                "two consumers given to --to are both rank %u of %u: %s:%u (%s) and %s:%u "
                "(%s); give each rank its own --rank",
                a->rank, wa, a->host, a->port, a->consumer_name, b->host, b->port,
                b->consumer_name);
            return false;
        }
    }
    return true;
}

/* RANKS (hops 0) to every consumer that takes part: the consumers this
 * producer is connected to now. Sent whenever that set changes. */
static void links_announce(producer_t *pr)
{
    Hsflow__RankClaim cm[HS_MSG_MAX_CLAIMS], *cp[HS_MSG_MAX_CLAIMS];
    size_t n = 0;
    for (uint32_t i = 0; i < pr->net.n_links && n < HS_MSG_MAX_CLAIMS; i++) {
        const link_t *o = &pr->net.links[i];
        if (!o->welcomed || o->done || !o->conn || !o->instance_id) continue;
        Hsflow__RankClaim init = HSFLOW__RANK_CLAIM__INIT;
        cm[n] = init;
        cm[n].rank = o->rank;
        cm[n].world = o->world ? o->world : 1;
        cm[n].instance_id = o->instance_id;
        cm[n].started_unix_ms = o->started_unix_ms;
        cm[n].consumer_name = (char *)o->consumer_name;
        cp[n] = &cm[n];
        n++;
    }
    Hsflow__Ranks r = HSFLOW__RANKS__INIT;
    r.hops = 0;
    r.n_claims = n;
    r.claims = cp;
    for (uint32_t i = 0; i < pr->net.n_links; i++) {
        link_t *o = &pr->net.links[i];
        if (o->welcomed && !o->done && o->conn && o->instance_id)
            hs__link_send_msg(o, HS_MSG_RANKS, &r.base);
    }
}

/* RANKS from consumer l (hops 1): claims of one rank by several consumers.
 * Passed on (hops 2) to this producer's other consumers of that rank, so
 * each learns of the others and the later ones stop. */
static void on_ranks(link_t *l, const uint8_t *body, uint32_t len)
{
    producer_t *pr = l->pr;
    ProtobufCMessage *m;
    if (!l->welcomed) {
        fail(l, HS_ERR_PROTO, "RANKS before WELCOME");
        return;
    }
    if (!(m = consumer_unpack(l, HS_MSG_RANKS, body, len))) return;
    Hsflow__Ranks *r = (Hsflow__Ranks *)m;
    if (r->hops != 1) {
        uint32_t hops = r->hops;
        hs_msg_free(m);
        fail(l, HS_ERR_PROTO, "RANKS with hops %u from a consumer (expected 1)", hops);
        return;
    }
    r->hops = 2;
    for (uint32_t i = 0; i < pr->net.n_links; i++) {
        link_t *o = &pr->net.links[i];
        if (o == l || !o->welcomed || o->done || !o->conn || !o->instance_id) continue;
        bool concerns = false;
        for (size_t k = 0; k < r->n_claims && !concerns; k++)
            concerns = r->claims[k]->rank == o->rank &&
                       r->claims[k]->world == (o->world ? o->world : 1) &&
                       r->claims[k]->instance_id != o->instance_id;
        if (concerns) hs__link_send_msg(o, HS_MSG_RANKS, &r->base);
    }
    hs_msg_free(m);
}

static void on_welcome(link_t *l, const uint8_t *body, uint32_t len)
{
    producer_t *pr = l->pr;
    ProtobufCMessage *m;
    if (!(m = consumer_unpack(l, HS_MSG_WELCOME, body, len))) return;
    Hsflow__Welcome *w = (Hsflow__Welcome *)m;
    if (pr->have_secret) {
        uint8_t expect[HS_AUTH_MAC_BYTES];
        if (hs_auth_consumer_mac(&pr->key, l->client_nonce, l->server_nonce, expect) != HS_OK ||
            w->server_mac.len != HS_AUTH_MAC_BYTES ||
            hs_auth_verify(w->server_mac.data, expect) != HS_OK) {
            hs_msg_free(m);
            fail(l, HS_ERR_AUTH,
                 "the consumer could not prove it holds the shared secret: wrong peer or a "
                 "different --secret-file");
            return;
        }
    }
    snprintf(l->consumer_name, sizeof(l->consumer_name), "%s", w->consumer_name);
    l->rank = w->rank;
    l->world = w->world;
    l->instance_id = w->instance_id;
    l->started_unix_ms = w->started_unix_ms;
    if (w->world > 1)
        hs_info("welcomed by consumer %s (rank %u of %u): %u epoch(s), %s order%s",
                w->consumer_name, w->rank, w->world, w->epochs, w->order ? "plan" : "arrival",
                w->need_plan ? "; sending the plan" : "");
    else
        hs_info("welcomed by consumer %s: %u epoch(s), %s order%s", w->consumer_name, w->epochs,
                w->order ? "plan" : "arrival", w->need_plan ? "; sending the plan" : "");
    if (w->prefetch_per_worker && w->prefetch_per_worker < pr->cfg->prefetch)
        hs_warn("consumer %s queues %u ticket(s) per worker, not the %u asked (--prefetch): its "
                "own --prefetch is lower; raise it there for more batches in flight",
                w->consumer_name, w->prefetch_per_worker, pr->cfg->prefetch);
    bool need_plan = w->need_plan;
    pthread_mutex_lock(&pr->sh.lock);
    if (w->epochs > pr->sh.epochs) pr->sh.epochs = w->epochs;
    pthread_mutex_unlock(&pr->sh.lock);
    /* Heartbeats (STATS) four times per lease, so one late beat costs nothing;
     * with several consumers, often enough for the strictest. */
    double lease_s = w->lease_timeout_ms / 1000.0;
    double beat = lease_s > 0 ? lease_s / 4 : 2.0;
    if (beat > 2.0) beat = 2.0;
    if (beat < 0.05) beat = 0.05;
    if (pr->net.heartbeat_s == 0 || beat < pr->net.heartbeat_s) pr->net.heartbeat_s = beat;
    hs_msg_free(m); /* w is gone from here on: l->rank and l->world hold its rank */
    if (l->world && l->rank >= l->world) {
        fail(l, HS_ERR_PROTO, "consumer %s says it is rank %u of %u", l->consumer_name, l->rank,
             l->world);
        return;
    }
    if (!links_check_ranks(l)) return;
    l->welcomed = true;
    if (need_plan) send_plan(l);
    links_announce(pr);
    pthread_mutex_lock(&pr->sh.lock);
    if (pr->sh.t_start == 0) pr->sh.t_start = hs_now_s();
    pthread_mutex_unlock(&pr->sh.lock);
}

static void on_ticket(link_t *l, const uint8_t *body, uint32_t len)
{
    producer_t *pr = l->pr;
    ProtobufCMessage *m;
    if (!l->welcomed) {
        fail(l, HS_ERR_PROTO, "TICKET before WELCOME");
        return;
    }
    if (!(m = consumer_unpack_in(l, &pr->net.ticket_arena, HS_MSG_TICKET, body, len))) return;
    Hsflow__Ticket *t = (Hsflow__Ticket *)m;
    hs_plan_batch_t b;
    if (hs_plan_batch(pr->plan, t->batch, &b) != HS_OK) {
        fail(l, HS_ERR_PROTO, "TICKET for batch %u, the plan has %u", t->batch,
             hs_plan_n_batches(pr->plan));
    } else if (b.n_seqs != t->n_seqs || b.n_tokens != t->n_tokens ||
               hs_batch_bytes(b.n_seqs, b.n_tokens, &pr->cfg->layout) != t->bytes) {
        fail(l, HS_ERR_MISMATCH,
             "TICKET for batch %u asks %u seqs / %u tokens / %llu bytes; the plan says %u / %u / "
             "%llu",
             t->batch, t->n_seqs, t->n_tokens, (unsigned long long)t->bytes, b.n_seqs, b.n_tokens,
             (unsigned long long)hs_batch_bytes(b.n_seqs, b.n_tokens, &pr->cfg->layout));
    } else if (pr->net.stopping) {
        pr->net.tickets_returned++; /* left to the consumer, which reissues it when we leave */
    } else {
        pthread_mutex_lock(&pr->sh.lock);
        ticket_t *q = hs__ticket_get(pr);
        if (!q) {
            pthread_mutex_unlock(&pr->sh.lock);
            hs__producer_fail_all(pr, HS_ERR_NOMEM, "out of memory");
        } else {
            *q = (ticket_t){NULL,        t->ticket_id, t->epoch, t->batch, t->n_seqs,
                            t->n_tokens, t->bytes,     l->gen,   l->index};
            if (t->epoch > pr->sh.epoch_seen) pr->sh.epoch_seen = t->epoch;
            if (pr->sh.tickets_tail)
                pr->sh.tickets_tail->next = q;
            else
                pr->sh.tickets = q;
            pr->sh.tickets_tail = q;
            pthread_cond_broadcast(&pr->sh.cond);
            pthread_mutex_unlock(&pr->sh.lock);
        }
    }
    hs_msg_free_in(&pr->net.ticket_arena, m);
}

/* The link of a connection, or NULL (one this producer gave up on). */
static link_t *link_of(producer_t *pr, const hs_tp_conn_t *conn)
{
    for (uint32_t i = 0; i < pr->net.n_links; i++)
        if (pr->net.links[i].conn == conn) return &pr->net.links[i];
    return NULL;
}

static void cb_frame(void *arg, hs_tp_conn_t *conn, uint16_t type, const uint8_t *body,
                     uint32_t body_len, uint64_t payload_bytes)
{
    producer_t *pr = arg;
    char why[256];
    ProtobufCMessage *m;
    link_t *l = link_of(pr, conn);
    if (!l && pr->net.connecting && !pr->net.connecting->conn) {
        /* A frame of the connection being made, delivered before
         * hs_tp_connect returned it (UCX can: a consumer whose run is over
         * says BYE on accept). It is that link's. */
        l = pr->net.connecting;
        l->conn = conn;
    }
    if (!l) return; /* a connection of an earlier generation, closing */
    if (payload_bytes) {
        fail(l, HS_ERR_PROTO, "the consumer sent a payload with a %s frame", hs_msg_type_str(type));
        return;
    }
    switch (type) {
    case HS_MSG_CHALLENGE:
        on_challenge(l, body, body_len);
        break;
    case HS_MSG_WELCOME:
        on_welcome(l, body, body_len);
        break;
    case HS_MSG_TICKET:
        on_ticket(l, body, body_len);
        break;
    case HS_MSG_RANKS:
        on_ranks(l, body, body_len);
        break;
    case HS_MSG_BYE:
        if (hs_msg_unpack(HS_MSG_BYE, body, body_len, &m, why, sizeof(why)) == HS_OK) {
            if (pr->net.n_links > 1)
                hs_info("consumer says BYE (%s, rank %u of %u): %s", l->consumer_name, l->rank,
                        l->world, ((Hsflow__Bye *)m)->reason);
            else
                hs_info("consumer says BYE: %s", ((Hsflow__Bye *)m)->reason);
            hs_msg_free(m);
        }
        l->done = true;
        hs_tp_close(conn, HS_ERR_CLOSED);
        hs__links_update_done(pr);
        break;
    case HS_MSG_ERROR:
        if (hs_msg_unpack(HS_MSG_ERROR, body, body_len, &m, why, sizeof(why)) == HS_OK) {
            Hsflow__Error *e = (Hsflow__Error *)m;
            if (e->code == HS_ERR_TIMEOUT && pr->cfg->reconnect && !pr->net.stopping) {
                /* Too slow for the consumer (its lease or handshake timeout,
                 * e.g. after this process was stopped): the tickets went back
                 * to its queue; join again (cb_close). */
                hs_warn("the consumer dropped us: %s", e->text);
                hs_msg_free(m);
                hs_tp_close(conn, HS_ERR_CLOSED);
                break;
            }
            /* A refusal (another plan, layout, version, secret) is a run
             * set up wrong: with several consumers the whole set is
             * refused, so no rank is fed by a producer that another one
             * turned away. */
            hs_status_t code = e->code < 0 ? (hs_status_t)e->code : HS_ERR_PROTO;
            if (pr->net.n_links > 1)
                hs__producer_fail_all(pr, code, "consumer %s:%u refused us: %s", l->host, l->port,
                                      e->text);
            else
                hs_error("consumer refused us: %s", e->text);
            if (pr->sh.result == HS_OK) pr->sh.result = code;
            hs_msg_free(m);
        } else if (pr->sh.result == HS_OK) {
            pr->sh.result = HS_ERR_PROTO;
        }
        l->done = true;
        hs_tp_close(conn, HS_ERR_CLOSED);
        hs__links_update_done(pr);
        break;
    default:
        fail(l, HS_ERR_PROTO, "unexpected %s frame from the consumer", hs_msg_type_str(type));
    }
}

/* The link's connection is gone: its queued tickets are of no use (the
 * consumer took them back), and what is being computed for it is not sent. */
static void link_drop_tickets(link_t *l)
{
    producer_t *pr = l->pr;
    pthread_mutex_lock(&pr->sh.lock);
    ticket_t **pp = &pr->sh.tickets;
    pr->sh.tickets_tail = NULL;
    while (*pp) {
        ticket_t *t = *pp;
        if (t->link == l->index) {
            *pp = t->next;
            hs__ticket_put(pr, t);
        } else {
            pr->sh.tickets_tail = t;
            pp = &t->next;
        }
    }
    l->gen++;
    pthread_mutex_unlock(&pr->sh.lock);
}

static void cb_close(void *arg, hs_tp_conn_t *conn, hs_status_t reason, const char *why)
{
    producer_t *pr = arg;
    link_t *l = link_of(pr, conn);
    if (!l) return;
    l->conn = NULL;
    bool was_welcomed = l->welcomed;
    l->welcomed = false;
    link_drop_tickets(l);
    if (was_welcomed) links_announce(pr); /* the others learn it is gone */
    if (!l->done && pr->net.stopping) {
        hs_info("consumer %s:%u closed the connection while this producer was stopping", l->host,
                l->port);
        l->done = true;
    } else if (!l->done && pr->cfg->reconnect) {
        hs_warn("lost the consumer %s:%u (%s); reconnecting for up to %u s", l->host, l->port,
                why && *why ? why : hs_status_str(reason), pr->cfg->connect_timeout_s);
        l->lost = true;
        l->t_lost = hs_now_s();
    } else if (!l->done) {
        hs_error("lost the consumer %s:%u: %s", l->host, l->port,
                 why && *why ? why : hs_status_str(reason));
        pr->sh.result = HS_ERR_CLOSED;
        l->done = true;
    }
    hs__links_update_done(pr);
}

const hs_tp_callbacks_t hs__producer_callbacks = {
    .on_frame = cb_frame,
    .on_close = cb_close,
};

/* cb_frame binds a connection delivered while it connects to l. */
hs_status_t hs__link_connect(link_t *l, int timeout_ms, unsigned flags)
{
    producer_t *pr = l->pr;
    hs_tp_conn_t *conn = NULL;
    l->conn = NULL;
    pr->net.connecting = l;
    hs_status_t st = hs_tp_connect_flags(pr->tp, l->host, l->port, timeout_ms, flags, &conn);
    pr->net.connecting = NULL;
    l->conn = st == HS_OK ? conn : NULL;
    return st;
}

hs_status_t hs__link_send_hello(link_t *l)
{
    producer_t *pr = l->pr;
    const hs_producer_config_t *cfg = pr->cfg;
    char name[256], host[64];
    gethostname(host, sizeof(host));
    host[sizeof(host) - 1] = 0;
    snprintf(name, sizeof(name), "%s", cfg->name ? cfg->name : "");
    if (!cfg->name) snprintf(name, sizeof(name), "%s:%d", host, (int)getpid());

    Hsflow__Hello h = HSFLOW__HELLO__INIT;
    Hsflow__Layout lm;
    int32_t layers[HS_MAX_LAYERS];
    hs_layout_to_msg(&cfg->layout, &lm, layers);
    hs_plan_stats_t ps;
    hs_plan_stats(pr->plan, &ps);
    h.version = HS_PROTO_VERSION;
    h.producer_name = name;
    h.workers = cfg->n_workers;
    h.prefetch_per_worker = cfg->prefetch;
    h.layout = &lm;
    h.plan_hash = hs_plan_hash(pr->plan);
    h.plan_basis = hs_plan_basis(pr->plan);
    h.n_batches = hs_plan_n_batches(pr->plan);
    h.seed = cfg->seed;
    h.token_budget = cfg->token_budget;
    h.max_seq_len = ps.max_seq_len;
    h.dataset_fingerprint = hs_dataset_fingerprint(pr->ds);
    h.total_tokens = ps.tokens;
    h.total_seqs = ps.n_kept;
    h.target_name = (char *)cfg->target_name;
    h.target_fingerprint = cfg->target_fingerprint;
    hs_status_t st = hs_auth_nonce(l->client_nonce);
    if (st != HS_OK) {
        hs_error("libsodium could not draw the handshake's nonce: %s", hs_status_str(st));
        return st;
    }
    h.client_nonce.data = l->client_nonce;
    h.client_nonce.len = HS_AUTH_NONCE_BYTES;
    size_t len;
    st = hs_msg_pack(HS_MSG_HELLO, &h.base, pr->net.frame_buf,
                     HS_FRAME_MAX_BODY + HS_FRAME_HEADER_BYTES, &len);
    if (st != HS_OK) return st;
    /* The AUTH proof covers the HELLO body exactly as sent. */
    uint8_t *body = realloc(l->hello_body, len - HS_FRAME_HEADER_BYTES);
    if (!body) return HS_ERR_NOMEM;
    l->hello_body = body;
    l->hello_len = len - HS_FRAME_HEADER_BYTES;
    memcpy(l->hello_body, pr->net.frame_buf + HS_FRAME_HEADER_BYTES, l->hello_len);
    return hs_tp_send(l->conn, pr->net.frame_buf, len);
}

/* --reconnect: drops the tickets of the lost connection (a batch being
 * computed for one is discarded when done), tries to connect again and
 * repeats the handshake; a restarted consumer (with its journal) then
 * tickets anew. Each try is short, so the other links go on meanwhile;
 * after connect_timeout_s the link is given up. */
void hs__link_reconnect(link_t *l)
{
    producer_t *pr = l->pr;
    double now = hs_now_s();
    if (now - l->t_try < 0.2) return;
    l->t_try = now;
    /* each failed try is expected while the consumer restarts: INFO, and
     * one ERROR below when the time is up */
    /* a consumer not reached yet gets shorter tries at first (a try that
     * waits stalls this loop, and with it the links being fed; TCP's
     * refusals come at once, UCX's take the whole try), longer ones later
     * (a consumer that is up but slow to answer still gets through) */
    int try_ms = 1000;
    if (l->pending && l->tries < 3) try_ms = 250 * (int)(1 + l->tries);
    l->tries++;
    hs_status_t st = hs__link_connect(l, try_ms, HS_TP_CONNECT_QUIET);
    if (l->done) { /* told BYE or refused while connecting */
        l->lost = false;
        hs__links_update_done(pr);
        return;
    }
    if (st != HS_OK) {
        if (now - l->t_lost < pr->cfg->connect_timeout_s) return;
        l->lost = false;
        if (l->pending) { /* a rank of the set never came: the set is refused */
            hs__producer_fail_all(pr, HS_ERR_TIMEOUT,
                                  "cannot reach the consumer at %s:%u within %u s (--connect-"
                                  "timeout): is hs-consumer running there?",
                                  l->host, l->port, pr->cfg->connect_timeout_s);
            return;
        }
        hs_error("could not reach the consumer at %s:%u again within %u s", l->host, l->port,
                 pr->cfg->connect_timeout_s);
        pr->sh.result = HS_ERR_CLOSED;
        l->done = true;
        hs__links_update_done(pr);
        return;
    }
    link_drop_tickets(l);
    l->welcomed = false;
    l->lost = false;
    l->tries = 0;
    bool first = l->pending;
    l->pending = false;
    if (hs__link_send_hello(l) != HS_OK) {
        hs_warn("consumer %s:%u: sending HELLO after %s failed; trying again", l->host, l->port,
                first ? "connecting" : "reconnecting");
        hs_tp_close(l->conn, HS_ERR_CLOSED); /* cb_close marks it lost again */
        return;
    }
    if (first)
        hs_info("connected to %s:%u over %s", l->host, l->port, hs_tp_conn_describe(l->conn));
    else
        hs_info("reconnected to %s:%u", l->host, l->port);
}
