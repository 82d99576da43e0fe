/* SPDX-License-Identifier: Apache-2.0 */
/* consumer.c - the consumer engine: accepts producers, runs the handshake,
 * hands out tickets against reserved cache slots, receives payloads straight
 * into those slots, verifies them on checksum threads, and delivers batches
 * one at a time to the trainer (DESIGN §2).
 *
 * Threads:
 *   - the network thread owns the transport, the scheduler and every peer;
 *   - checksum threads verify received batches (jobs in, results out);
 *   - the trainer calls hs_consumer_next()/release() from its own thread.
 * They meet in three mutex-protected queues (verify jobs, verify results,
 * deliverable batches) and in the cache, which has its own lock. */
#include "consumer_int.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define PEER_MAX_PREFETCH 64u
/* Until a peer is admitted (HELLO, and AUTH with a secret) its frames may be
 * at most PREAUTH_MAX_FRAME bytes, and at most PREAUTH_MAX_PEERS such peers
 * (PREAUTH_MAX_PER_ADDR from one address) are kept: the oldest gives way. So
 * unauthenticated connections cost a bounded amount of memory, whatever
 * they send, and cannot shut real producers out by holding on. */
#define PREAUTH_MAX_FRAME (64u << 10)
#define PREAUTH_MAX_PEERS 128
#define PREAUTH_MAX_PER_ADDR 16

static void peer_drop(hs_consumer_t *c, peer_t *p, hs_status_t code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* ---- small helpers -------------------------------------------------------- */

static void peer_send_msg(hs_consumer_t *c, peer_t *p, uint16_t type, const ProtobufCMessage *m)
{
    size_t len;
    if (!p->conn) return;
    hs_status_t st = hs_msg_pack(type, m, c->frame_buf, sizeof(c->frame_buf), &len);
    if (st == HS_OK) st = hs_tp_send(p->conn, c->frame_buf, len);
    if (st != HS_OK)
        hs_warn("producer %s: sending %s failed: %s", p->name, hs_msg_type_str(type),
                hs_status_str(st));
}

static void peer_drop(hs_consumer_t *c, peer_t *p, hs_status_t code, const char *fmt, ...)
{
    char text[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof(text), fmt, ap);
    va_end(ap);
    /* The connection lingers until its close completes; a peer is dropped
     * (and counted) once. */
    if (!p->conn || p->dropped) return;
    p->dropped = true;
    hs_error("producer %s dropped: %s", p->name, text);
    size_t len;
    if (hs_msg_error_frame(code, text, c->frame_buf, sizeof(c->frame_buf), &len) == HS_OK)
        hs_tp_send(p->conn, c->frame_buf, len);
    hs_tp_close(p->conn, code);
    if (code != HS_ERR_CLOSED) c->n_dropped++;
}

static peer_t *peer_find(hs_consumer_t *c, uint64_t id)
{
    for (peer_t *p = c->peers; p; p = p->next)
        if (p->id == id) return p;
    return NULL;
}

/* Decodes a frame body from a peer into arena `a` (NULL: the heap); a
 * malformed one drops the peer (NULL). Free with hs_msg_free_in(a, m). */
static ProtobufCMessage *peer_unpack_in(hs_consumer_t *c, peer_t *p, hs_msg_arena_t *a,
                                        uint16_t type, const uint8_t *body, uint32_t len)
{
    char why[256];
    ProtobufCMessage *m;
    if (hs_msg_unpack_in(a, type, body, len, &m, why, sizeof(why)) != HS_OK) {
        peer_drop(c, p, HS_ERR_FORMAT, "bad %s: %s", hs_msg_type_str(type), why);
        return NULL;
    }
    return m;
}

static ProtobufCMessage *peer_unpack(hs_consumer_t *c, peer_t *p, uint16_t type,
                                     const uint8_t *body, uint32_t len)
{
    return peer_unpack_in(c, p, NULL, type, body, len);
}

/* Frees a dead peer once no payload of it is being received or verified:
 * only then can its leases go back to the queue without a slot being written
 * twice. */
static void peer_reap(hs_consumer_t *c, peer_t *p)
{
    if (p->conn || p->receiving || p->verifying) return;
    if (c->sched) {
        uint32_t n = hs_sched_return_leases(c->sched, p->id);
        c->leases_returned += n;
        if (n) hs_warn("producer %s gone: %u ticket(s) back to the front of the queue", p->name, n);
    }
    peer_t **pp = &c->peers;
    while (*pp != p)
        pp = &(*pp)->next;
    *pp = p->next;
    free(p->hello_body);
    free(p);
}

/* ---- handshake -------------------------------------------------------------- */

/* The first epoch with a batch still to deliver, as told to producers. */
static uint32_t resume_start_epoch(hs_consumer_t *c)
{
    if (c->resume_given) return hs_state_epochs_done(c->resume);
    return c->journal && c->have_run ? hs_journal_start_epoch(c->journal) : 0;
}

static void send_welcome(hs_consumer_t *c, peer_t *p, bool need_plan)
{
    Hsflow__Welcome w = HSFLOW__WELCOME__INIT;
    uint8_t mac[HS_AUTH_MAC_BYTES];
    w.session_id = c->session_id;
    w.epochs = c->cfg.epochs;
    w.need_plan = need_plan;
    w.order = (uint32_t)c->cfg.order;
    w.rank = c->cfg.rank;
    w.world = c->cfg.world;
    w.start_epoch = resume_start_epoch(c);
    w.consumer_name = c->name;
    double lease_ms = c->cfg.lease_timeout_s * 1000.0;
    w.lease_timeout_ms = lease_ms >= (double)UINT32_MAX ? UINT32_MAX : (uint32_t)lease_ms;
    if (c->have_secret) {
        hs_auth_consumer_mac(&c->key, p->client_nonce, p->server_nonce, mac);
        w.server_mac.data = mac;
        w.server_mac.len = sizeof(mac);
    }
    peer_send_msg(c, p, HS_MSG_WELCOME, &w.base);
    if (need_plan) {
        p->state = PEER_SENDING_PLAN;
        hs_info("producer %s sends the plan (%u batches per epoch)", p->name, p->offer.n_batches);
    } else {
        p->state = PEER_READY;
        hs_info("producer %s ready: %u worker(s) x %u tickets, %s", p->name, p->workers,
                p->prefetch, hs_tp_conn_describe(p->conn));
    }
}

/* The pending plan: asks `p` for its plan, which becomes the run once every
 * page is in and checked. */
static void plan_start(hs_consumer_t *c, peer_t *p)
{
    pending_plan_t *pp = calloc(1, sizeof(*pp));
    if (!pp) {
        peer_drop(c, p, HS_ERR_NOMEM, "out of memory");
        return;
    }
    pp->sender = p->id;
    pp->offer = p->offer;
    pp->t_page = hs_now_s();
    c->pending = pp;
    send_welcome(c, p, true);
}

/* Discards the pending plan whole: its sender left before it was complete. */
static void plan_discard(hs_consumer_t *c)
{
    if (!c->pending) return;
    free(c->pending->n_seqs);
    free(c->pending->n_tokens);
    free(c->pending);
    c->pending = NULL;
}

/* The pending plan's sender is gone: the longest-waiting admitted peer
 * sends its own plan from the start. With none, the next peer admitted does. */
static void plan_restart(hs_consumer_t *c)
{
    plan_discard(c);
    peer_t *next = NULL;
    for (peer_t *q = c->peers; q; q = q->next)
        if (q->state == PEER_WAIT_PLAN && q->conn && !q->dropped && (!next || q->id < next->id))
            next = q;
    if (next) plan_start(c, next);
}

/* A peer's offer against the run: true when it may join; otherwise it is
 * dropped with both sides' values and what to change. */
static bool offer_matches_run(hs_consumer_t *c, peer_t *p)
{
    const run_offer_t *o = &p->offer;
    if (hs_layout_id(&o->layout) != hs_layout_id(&c->layout)) {
        char mine[160], theirs[160];
        hs_layout_describe(&c->layout, mine, sizeof(mine));
        hs_layout_describe(&o->layout, theirs, sizeof(theirs));
        peer_drop(c, p, HS_ERR_MISMATCH,
                  "layout mismatch: this run carries %s, producer offers %s; start every "
                  "producer with the same --hidden-size and --layers",
                  mine, theirs);
        return false;
    }
    if (o->plan_hash != c->plan_hash || o->n_batches != c->n_batches) {
        peer_drop(c, p, HS_ERR_MISMATCH,
                  "plan mismatch: this run's plan hash is %016llx (%u batches), producer's is "
                  "%016llx (%u batches); give every producer the same --data, "
                  "--token-budget, --max-seq-len and --seed",
                  (unsigned long long)c->plan_hash, c->n_batches, (unsigned long long)o->plan_hash,
                  o->n_batches);
        return false;
    }
    return true;
}

/* After HELLO (and AUTH, when a secret is set): join the run, or, before
 * there is one, send a plan or wait for the one being sent. A run exists only
 * once a plan is complete and checked (plan_complete); until then no offer
 * is preferred over another and nothing is written to the journal. Only an
 * authenticated peer gets here, and nothing about the run is told to a peer
 * before it is authenticated. */
static void peer_admit(hs_consumer_t *c, peer_t *p)
{
    hs_tp_conn_set_max_frame(p->conn, 0); /* the protocol's full frame limit */
    if (c->have_run) {
        if (offer_matches_run(c, p)) send_welcome(c, p, false);
        return;
    }
    char why[512];
    /* A resume state decides the plan, else a journal of an earlier run;
     * reading either writes nothing. */
    if (hs_state_check_plan(c->resume, p->offer.plan_hash, p->offer.n_batches, why, sizeof(why)) !=
        HS_OK) {
        peer_drop(c, p, HS_ERR_MISMATCH, "%s", why);
        return;
    }
    if (c->journal) {
        hs_status_t st =
            hs_journal_check(c->journal, p->offer.plan_hash, p->offer.n_batches, why, sizeof(why));
        if (st != HS_OK) {
            peer_drop(c, p, st, "%s", why);
            return;
        }
    }
    if (!c->pending)
        plan_start(c, p);
    else
        p->state = PEER_WAIT_PLAN; /* WELCOME, or a mismatch, once the plan is complete */
}

static void on_hello(hs_consumer_t *c, peer_t *p, const uint8_t *body, uint32_t len)
{
    char why[256];
    ProtobufCMessage *m;
    if (p->state != PEER_NEW) {
        peer_drop(c, p, HS_ERR_PROTO, "HELLO sent twice");
        return;
    }
    if (!(m = peer_unpack(c, p, HS_MSG_HELLO, body, len))) return;
    Hsflow__Hello *h = (Hsflow__Hello *)m;
    run_offer_t *o = &p->offer;
    snprintf(p->name, sizeof(p->name), "%s (%s)", h->producer_name, hs_tp_conn_peer(p->conn));
    if (h->version != HS_PROTO_VERSION) {
        peer_drop(c, p, HS_ERR_MISMATCH, "producer speaks protocol version %u, consumer %u",
                  h->version, HS_PROTO_VERSION);
        goto out;
    }
    if (hs_layout_from_msg(h->layout, &o->layout, why, sizeof(why)) != HS_OK) {
        peer_drop(c, p, HS_ERR_FORMAT, "bad layout in HELLO: %s", why);
        goto out;
    }
    o->plan_hash = h->plan_hash;
    o->n_batches = h->n_batches; /* 1..HS_PLAN_MAX_BATCHES (hs_msg_unpack) */
    o->seed = h->seed;
    o->token_budget = h->token_budget;
    p->workers = h->workers; /* 1..HS_MSG_MAX_WORKERS (hs_msg_unpack) */
    p->prefetch = c->cfg.prefetch;
    if (h->prefetch_per_worker && h->prefetch_per_worker < p->prefetch)
        p->prefetch = h->prefetch_per_worker;
    if (p->prefetch > PEER_MAX_PREFETCH) p->prefetch = PEER_MAX_PREFETCH;
    memcpy(p->client_nonce, h->client_nonce.data, HS_AUTH_NONCE_BYTES);

    if (c->have_secret) {
        /* Keep the HELLO body: the producer's proof covers it. */
        p->hello_body = malloc(len ? len : 1);
        if (!p->hello_body) {
            peer_drop(c, p, HS_ERR_NOMEM, "out of memory");
            goto out;
        }
        memcpy(p->hello_body, body, len);
        p->hello_len = len;
        hs_auth_nonce(p->server_nonce);
        Hsflow__Challenge ch = HSFLOW__CHALLENGE__INIT;
        ch.server_nonce.data = p->server_nonce;
        ch.server_nonce.len = HS_AUTH_NONCE_BYTES;
        peer_send_msg(c, p, HS_MSG_CHALLENGE, &ch.base);
        p->state = PEER_AUTH;
    } else {
        peer_admit(c, p);
    }
out:
    hs_msg_free(m);
}

static void on_auth(hs_consumer_t *c, peer_t *p, const uint8_t *body, uint32_t len)
{
    ProtobufCMessage *m;
    if (p->state != PEER_AUTH) {
        peer_drop(c, p, HS_ERR_PROTO, "AUTH without a CHALLENGE");
        return;
    }
    if (!(m = peer_unpack(c, p, HS_MSG_AUTH, body, len))) return;
    Hsflow__Auth *a = (Hsflow__Auth *)m;
    uint8_t expect[HS_AUTH_MAC_BYTES];
    hs_auth_producer_mac(&c->key, p->server_nonce, p->client_nonce, p->hello_body, p->hello_len,
                         expect);
    if (a->mac.len != HS_AUTH_MAC_BYTES || hs_auth_verify(a->mac.data, expect) != HS_OK)
        peer_drop(c, p, HS_ERR_AUTH,
                  "authentication failed: the producer's --secret-file differs from the "
                  "consumer's");
    else
        peer_admit(c, p);
    hs_msg_free(m);
}

/* Stops the consumer on a problem of its own configuration that no producer
 * can fix; the trainer's next call returns. */
static void consumer_fatal(hs_consumer_t *c, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static void consumer_fatal(hs_consumer_t *c, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->fatal, sizeof(c->fatal), fmt, ap);
    va_end(ap);
    hs_error("%s", c->fatal);
    c->stop = true;
}

/* Adds the batches the journal recorded as released to the position. */
static void position_add_journal(hs_consumer_t *c, hs_state_t *pos)
{
    uint32_t start = hs_journal_start_epoch(c->journal), n = c->n_batches;
    const uint8_t *done = hs_journal_done(c->journal);
    for (uint32_t e = 0; e < c->cfg.epochs; e++)
        for (uint32_t b = 0; b < n; b++) {
            bool released = e < start;
            if (!released) {
                uint64_t i = (uint64_t)(e - start) * n + b;
                released = done[i / 8] >> (i % 8) & 1;
            }
            if (released) hs_state_mark(pos, e, b);
        }
}

/* The pending plan arrived in full and checked: it becomes the run. The
 * journal is bound to it (its header written) only now, then the scheduler
 * is built and waiting peers are let in, or refused if they offered another
 * plan. */
static void plan_complete(hs_consumer_t *c)
{
    pending_plan_t *pp = c->pending;
    const run_offer_t *o = &pp->offer;
    uint32_t n = o->n_batches;
    uint64_t max_bytes = 0, tokens = 0;
    uint64_t *bytes = malloc((size_t)n * sizeof(uint64_t));
    if (!bytes) {
        consumer_fatal(c, "out of memory for a plan of %u batches", n);
        return;
    }
    for (uint32_t b = 0; b < n; b++) {
        bytes[b] = hs_batch_bytes(pp->n_seqs[b], pp->n_tokens[b], &o->layout);
        if (bytes[b] > max_bytes) max_bytes = bytes[b];
        tokens += pp->n_tokens[b];
    }
    if (max_bytes > hs_cache_capacity(c->cache)) {
        consumer_fatal(c,
                       "the largest batch needs %.2f GiB but --cache-gb gives %.2f GiB: raise "
                       "--cache-gb or lower the producers' --token-budget",
                       (double)max_bytes / (1 << 30),
                       (double)hs_cache_capacity(c->cache) / (1 << 30));
        free(bytes);
        return;
    }
    if (c->journal) {
        char why[512];
        if (hs_journal_bind(c->journal, o->plan_hash, n, c->cfg.epochs, why, sizeof(why)) !=
            HS_OK) {
            consumer_fatal(c, "%s", why);
            free(bytes);
            return;
        }
    }
    c->layout = o->layout;
    c->plan_hash = o->plan_hash;
    c->n_batches = n;
    c->seed = o->seed;
    c->token_budget = o->token_budget;
    c->tokens_per_epoch = tokens;
    c->have_run = true;
    char desc[160];
    hs_layout_describe(&c->layout, desc, sizeof(desc));
    peer_t *sender = peer_find(c, pp->sender);
    hs_info("run defined by %s: %s, plan %016llx, %u batches/epoch, budget %u tokens",
            sender ? sender->name : "a producer", desc, (unsigned long long)c->plan_hash,
            c->n_batches, c->token_budget);

    hs_sched_config_t sc = {0};
    sc.n_batches = n;
    sc.bytes = bytes;
    sc.n_seqs = pp->n_seqs;
    sc.n_tokens = pp->n_tokens;
    sc.epochs = c->cfg.epochs;
    sc.seed = c->seed;
    sc.order = c->cfg.order == HS_ORDER_PLAN ? HS_SCHED_PLAN : HS_SCHED_ARRIVAL;
    sc.rank = c->cfg.rank;
    sc.world = c->cfg.world;
    sc.uneven = (hs_shard_uneven_t)c->cfg.uneven;
    /* What to skip: the resume state when one was given (it follows the
     * trainer's checkpoint, so it wins over the journal, which is rewritten
     * to match it), else the journal's released batches, else nothing. */
    hs_state_t *pos = NULL;
    hs_status_t st = hs_state_bind(c->resume, c->plan_hash, n, c->cfg.epochs,
                                   (hs_state_order_t)c->cfg.order, &pos);
    if (st == HS_OK && !c->resume_given && c->journal) position_add_journal(c, pos);
    uint8_t *skip = st == HS_OK ? hs_state_done_bits(pos) : NULL;
    if (!skip) {
        consumer_fatal(c, "resume state: %s", hs_status_str(st ? st : HS_ERR_NOMEM));
        hs_state_destroy(pos);
        free(bytes);
        return;
    }
    if (c->resume_given && c->journal) hs_journal_rewrite(c->journal, pos);
    sc.start_epoch = hs_state_epochs_done(pos);
    sc.resume_done = skip;
    uint64_t resumed = hs_state_delivered(pos);
    const char *from = c->resume_given ? "the resume state" : "the journal";
    pthread_mutex_lock(&c->lock);
    c->position = pos;
    pthread_mutex_unlock(&c->lock);
    if (sc.start_epoch >= sc.epochs) {
        hs_info("%s says every batch of the %u epoch(s) was already delivered: nothing left to do",
                from, sc.epochs);
    } else {
        if (resumed)
            hs_info("resuming from %s: epoch %u, %llu batch(es) already delivered", from,
                    sc.start_epoch, (unsigned long long)resumed);
        st = hs_sched_create(&sc, &c->sched); /* copies the plan arrays */
    }
    free(skip);
    free(bytes);
    plan_discard(c);
    if (st != HS_OK) {
        consumer_fatal(c, "scheduler: %s", hs_status_str(st));
        return;
    }
    if (!c->sched) { /* everything was delivered before */
        pthread_mutex_lock(&c->lock);
        c->batches_resumed = resumed;
        c->t_start = hs_now_s();
        c->finished = true;
        pthread_mutex_unlock(&c->lock);
        pthread_cond_broadcast(&c->cond);
        c->all_queued = true;
        for (peer_t *p = c->peers; p; p = p->next) {
            Hsflow__Bye b = HSFLOW__BYE__INIT;
            b.reason = "the run is over (resumed)";
            peer_send_msg(c, p, HS_MSG_BYE, &b.base);
        }
        return;
    }
    pthread_mutex_lock(&c->lock);
    c->max_batch_bytes = max_bytes;
    hs_sched_stats_t ss;
    hs_sched_stats(c->sched, &ss);
    c->batches_planned = ss.planned;
    c->batches_resumed = resumed;
    c->t_start = hs_now_s();
    pthread_mutex_unlock(&c->lock);
    hs_info("plan complete: %u batches/epoch x %u epochs, %.1f MiB max batch, %llu tokens/epoch",
            c->n_batches, c->cfg.epochs, (double)max_bytes / (1 << 20),
            (unsigned long long)c->tokens_per_epoch);
    if (c->cfg.world > 1)
        hs_info("rank %u of %u: %u batches per epoch (%s: %u skipped, %u repeated per epoch "
                "across the ranks)",
                c->cfg.rank, c->cfg.world, ss.per_epoch,
                hs_shard_uneven_str((hs_shard_uneven_t)c->cfg.uneven), ss.skipped, ss.repeated);
    for (peer_t *p = c->peers; p; p = p->next) {
        if (!p->conn || p->dropped) continue;
        if (p->state == PEER_SENDING_PLAN) {
            p->state = PEER_READY;
            hs_info("producer %s ready: %u worker(s) x %u tickets, %s", p->name, p->workers,
                    p->prefetch, hs_tp_conn_describe(p->conn));
        } else if (p->state == PEER_WAIT_PLAN && offer_matches_run(c, p)) {
            send_welcome(c, p, false);
        }
    }
}

static void on_plan(hs_consumer_t *c, peer_t *p, const uint8_t *body, uint32_t len)
{
    ProtobufCMessage *m;
    pending_plan_t *pp = c->pending;
    if (p->state != PEER_SENDING_PLAN || !pp || pp->sender != p->id) {
        peer_drop(c, p, HS_ERR_PROTO, "PLAN page without being asked for the plan");
        return;
    }
    if (!(m = peer_unpack(c, p, HS_MSG_PLAN, body, len))) return;
    Hsflow__Plan *pl = (Hsflow__Plan *)m;
    uint32_t n = pp->offer.n_batches;
    if (pl->first_batch != pp->received || pl->n_n_seqs > n - pp->received) {
        peer_drop(c, p, HS_ERR_PROTO,
                  "PLAN page for batches %u..%zu, expected to start at %u of %u", pl->first_batch,
                  pl->first_batch + pl->n_n_seqs, pp->received, n);
        goto out;
    }
    /* The arrays grow with the pages that actually arrive (each at most
     * HS_PLAN_PAGE_MAX entries), never to a size a HELLO merely claims. */
    uint32_t need = pp->received + (uint32_t)pl->n_n_seqs;
    if (need > pp->cap) {
        uint32_t ncap = pp->cap > n / 2 ? n : (pp->cap * 2 > need ? pp->cap * 2 : need);
        uint32_t *ns = realloc(pp->n_seqs, (size_t)ncap * sizeof(uint32_t));
        if (ns) pp->n_seqs = ns;
        uint32_t *nt = ns ? realloc(pp->n_tokens, (size_t)ncap * sizeof(uint32_t)) : NULL;
        if (nt) pp->n_tokens = nt;
        if (!ns || !nt) {
            peer_drop(c, p, HS_ERR_NOMEM, "out of memory for a plan of %u batches", n);
            goto out;
        }
        pp->cap = ncap;
    }
    for (size_t i = 0; i < pl->n_n_seqs; i++) {
        uint32_t ns = pl->n_seqs[i], nt = pl->n_tokens[i];
        if (ns == 0 || nt < ns || nt > pp->offer.token_budget) {
            peer_drop(c, p, HS_ERR_FORMAT,
                      "PLAN batch %zu has %u sequences and %u tokens (budget %u)",
                      pl->first_batch + i, ns, nt, pp->offer.token_budget);
            goto out;
        }
    }
    memcpy(pp->n_seqs + pp->received, pl->n_seqs, pl->n_n_seqs * sizeof(uint32_t));
    memcpy(pp->n_tokens + pp->received, pl->n_tokens, pl->n_n_seqs * sizeof(uint32_t));
    pp->received = need;
    pp->t_page = hs_now_s();
    if (pl->last != (pp->received == n)) {
        peer_drop(c, p, HS_ERR_PROTO, "PLAN ended at %u of %u batches", pp->received, n);
        goto out;
    }
    if (pl->last) plan_complete(c);
out:
    hs_msg_free(m);
}

/* ---- tickets and payloads ------------------------------------------------- */

static void on_done(hs_consumer_t *c, peer_t *p, const uint8_t *body, uint32_t len,
                    uint64_t payload_bytes)
{
    ProtobufCMessage *m;
    hs_sched_item_t it;
    if (p->state != PEER_READY) {
        peer_drop(c, p, HS_ERR_PROTO, "DONE before the handshake finished");
        return;
    }
    if (!(m = peer_unpack_in(c, p, &c->done_arena, HS_MSG_DONE, body, len))) return;
    Hsflow__Done *d = (Hsflow__Done *)m;
    if (hs_sched_lookup(c->sched, p->id, d->ticket_id, &it) != HS_OK) {
        peer_drop(c, p, HS_ERR_PROTO, "DONE for ticket %llu, which this producer does not hold",
                  (unsigned long long)d->ticket_id);
    } else if (d->epoch != it.epoch || d->batch != it.batch) {
        peer_drop(c, p, HS_ERR_PROTO,
                  "DONE for ticket %llu names batch %u/%u, the ticket was for %u/%u",
                  (unsigned long long)d->ticket_id, d->epoch, d->batch, it.epoch, it.batch);
    } else if (payload_bytes != it.bytes || d->bytes != it.bytes) {
        peer_drop(c, p, HS_ERR_PROTO,
                  "payload of %llu bytes for ticket %llu, which granted exactly %llu",
                  (unsigned long long)payload_bytes, (unsigned long long)d->ticket_id,
                  (unsigned long long)it.bytes);
    } else {
        uint8_t *dest = (uint8_t *)hs_cache_base(c->cache) + it.slot_offset;
        if (hs_tp_recv_payload(p->conn, dest, it.bytes, d->ticket_id) == HS_OK) {
            p->receiving++;
            p->t_done_frame = p->t_progress = hs_now_s();
        }
    }
    hs_msg_free_in(&c->done_arena, m);
}

static void on_stats(hs_consumer_t *c, peer_t *p, const uint8_t *body, uint32_t len)
{
    ProtobufCMessage *m;
    if (!(m = peer_unpack(c, p, HS_MSG_STATS, body, len))) return;
    Hsflow__Stats *s = (Hsflow__Stats *)m;
    p->stall_pct = s->stall_pct;
    p->tokens_per_s = s->tokens_per_s;
    p->has_stats = true;
    if (s->progressing) p->t_progress = hs_now_s(); /* heartbeat: renews its leases */
    hs_msg_free(m);
}

/* Hands out tickets round-robin while the cache has room and a producer has
 * fewer than workers x prefetch tickets. The workers a producer claims are
 * not verified, so its leases may also pin at most a fair share of the cache
 * (capacity / ready producers; at least one batch): a peer claiming
 * thousands of workers cannot take every slot, and what a stopped one holds
 * comes back through the lease timeout (expire_leases). */
static void issue_tickets(hs_consumer_t *c)
{
    if (!c->sched || c->stop) return;
    uint32_t n_ready = 0;
    for (peer_t *p = c->peers; p; p = p->next)
        if (p->state == PEER_READY && p->conn && !p->dropped) n_ready++;
    if (!n_ready) return;
    uint64_t share = hs_cache_capacity(c->cache) / n_ready;
    double now = hs_now_s();
    bool progress = true;
    while (progress) {
        progress = false;
        for (peer_t *p = c->peers; p; p = p->next) {
            if (p->state != PEER_READY || !p->conn || p->dropped) continue;
            /* Tickets whose DONE arrived are no longer on the producer's plate:
             * it is already computing the next one. */
            uint32_t leases = hs_sched_leases_of(c->sched, p->id);
            uint32_t held = leases - p->receiving - p->verifying;
            if (held >= p->workers * p->prefetch) continue;
            hs_sched_item_t it;
            if (!hs_sched_peek(c->sched, &it)) return;
            if (leases && hs_sched_bytes_of(c->sched, p->id) + it.bytes > share) continue;
            uint64_t offset = it.slot_offset;
            if (!it.has_slot) {
                hs_cache_slot_t slot;
                if (hs_cache_reserve(c->cache, it.bytes, &slot) != HS_OK) return; /* full */
                offset = slot.offset;
            }
            uint64_t tid;
            if (hs_sched_lease(c->sched, p->id, offset, &tid) != HS_OK) return;
            if (!leases) p->t_progress = now; /* its lease clock starts */
            Hsflow__Ticket t = HSFLOW__TICKET__INIT;
            t.ticket_id = tid;
            t.epoch = it.epoch;
            t.batch = it.batch;
            t.bytes = it.bytes;
            t.n_seqs = it.n_seqs;
            t.n_tokens = it.n_tokens;
            t.worker_hint = 0xffffffffu;
            t.slot_offset = offset;
            peer_send_msg(c, p, HS_MSG_TICKET, &t.base);
            progress = true;
        }
    }
}

/* Moves every batch the scheduler says may go next onto the delivery queue. */
static void push_deliverable(hs_consumer_t *c)
{
    hs_sched_item_t it;
    bool pushed = false;
    while (c->sched && hs_sched_next_ready(c->sched, &it)) {
        pthread_mutex_lock(&c->lock);
        if (c->ready_n == c->ready_cap) {
            /* Grows rarely: the ring never holds more batches than the cache. */
            uint32_t ncap = c->ready_cap ? c->ready_cap * 2 : 64;
            hs_sched_item_t *q = malloc(ncap * sizeof(*q));
            if (!q) {
                pthread_mutex_unlock(&c->lock);
                hs_warn("out of memory growing the delivery queue; retrying");
                break;
            }
            for (uint32_t i = 0; i < c->ready_n; i++)
                q[i] = c->ready[(c->ready_head + i) % c->ready_cap];
            free(c->ready);
            c->ready = q;
            c->ready_cap = ncap;
            c->ready_head = 0;
        }
        c->ready[(c->ready_head + c->ready_n++) % c->ready_cap] = it;
        pthread_mutex_unlock(&c->lock);
        hs_sched_delivered(c->sched, it.ticket);
        pushed = true;
    }
    if (pushed) pthread_cond_broadcast(&c->cond);
    if (c->sched && hs_sched_finished(c->sched) && !c->all_queued) {
        c->all_queued = true;
        pthread_mutex_lock(&c->lock);
        c->finished = true;
        pthread_mutex_unlock(&c->lock);
        pthread_cond_broadcast(&c->cond);
        for (peer_t *p = c->peers; p; p = p->next) {
            Hsflow__Bye b = HSFLOW__BYE__INIT;
            b.reason = "every batch of every epoch delivered";
            peer_send_msg(c, p, HS_MSG_BYE, &b.base);
        }
        hs_info("every batch of %u epoch(s) delivered; told producers BYE", c->cfg.epochs);
    }
}

/* ---- checksum threads ------------------------------------------------------- */

static void *verify_main(void *arg)
{
    hs_consumer_t *c = arg;
    pthread_mutex_lock(&c->vlock);
    for (;;) {
        while (!c->vjobs_n && !c->vstop)
            pthread_cond_wait(&c->vcond, &c->vlock);
        if (c->vstop) break;
        verify_job_t *j = c->vjobs;
        c->vjobs = j->next;
        c->vjobs_n--;
        pthread_mutex_unlock(&c->vlock);

        const uint8_t *region = (const uint8_t *)hs_cache_base(c->cache) + j->item.slot_offset;
        j->status =
            hs_batch_verify(region, j->item.bytes, j->item.epoch, j->item.batch, j->item.n_seqs,
                            j->item.n_tokens, &c->layout, j->why, sizeof(j->why));
        if (j->status == HS_OK && c->cfg.verify_synthetic) {
            hs_batch_view_t v =
                hs_batch_view((void *)region, j->item.n_seqs, j->item.n_tokens, &c->layout);
            j->status = hs_batch_synth_check(&v, &c->layout, j->why, sizeof(j->why));
        }

        pthread_mutex_lock(&c->vlock);
        j->next = c->vdone;
        c->vdone = j;
        hs_tp_wakeup(c->tp);
    }
    pthread_mutex_unlock(&c->vlock);
    return NULL;
}

static void collect_verified(hs_consumer_t *c)
{
    pthread_mutex_lock(&c->vlock);
    verify_job_t *done = c->vdone;
    c->vdone = NULL;
    pthread_mutex_unlock(&c->vlock);
    while (done) {
        verify_job_t *j = done;
        done = j->next;
        peer_t *p = peer_find(c, j->peer_id);
        if (j->status == HS_OK) {
            hs_trace("ticket %llu: verified %.1f ms after landing",
                     (unsigned long long)j->ticket_id, 1e3 * (hs_now_s() - j->t_queued));
            hs_sched_fill(c->sched, j->peer_id, j->ticket_id);
            pthread_mutex_lock(&c->lock);
            c->bytes_received += j->item.bytes;
            pthread_mutex_unlock(&c->lock);
        } else {
            pthread_mutex_lock(&c->lock);
            c->checksum_failures++;
            pthread_mutex_unlock(&c->lock);
            if (p && p->conn && !p->dropped)
                peer_drop(c, p, j->status, "batch %u/%u failed verification: %s", j->item.epoch,
                          j->item.batch, j->why);
            else
                hs_error("batch %u/%u from producer %s failed verification: %s (the producer "
                         "had already left or been cut off; the batch goes back to the queue)",
                         j->item.epoch, j->item.batch, p ? p->name : "(gone)", j->why);
        }
        if (p) {
            p->verifying--;
            peer_reap(c, p);
        }
        free(j);
    }
}

/* ---- transport callbacks ---------------------------------------------------- */

static bool peer_unadmitted(const peer_t *p)
{
    return p->conn && !p->dropped && !p->bye_sent &&
           (p->state == PEER_NEW || p->state == PEER_AUTH);
}

/* "1.2.3.4:5678" and "1.2.3.4:9" come from the same address. */
static bool peer_same_addr(const peer_t *a, const peer_t *b)
{
    const char *x = hs_tp_conn_peer(a->conn), *y = hs_tp_conn_peer(b->conn);
    const char *xe = strrchr(x, ':'), *ye = strrchr(y, ':');
    size_t xl = xe ? (size_t)(xe - x) : strlen(x), yl = ye ? (size_t)(ye - y) : strlen(y);
    return xl == yl && memcmp(x, y, xl) == 0;
}

/* Before `p` (new, not admitted) is kept: the pre-auth limits (above). */
static void preauth_make_room(hs_consumer_t *c, peer_t *p)
{
    uint32_t total = 0, same = 0;
    peer_t *oldest = NULL, *oldest_same = NULL;
    for (peer_t *q = c->peers; q; q = q->next) {
        if (q == p || !peer_unadmitted(q)) continue;
        total++;
        if (!oldest || q->t_accept < oldest->t_accept) oldest = q;
        if (!peer_same_addr(q, p)) continue;
        same++;
        if (!oldest_same || q->t_accept < oldest_same->t_accept) oldest_same = q;
    }
    if (same >= PREAUTH_MAX_PER_ADDR)
        peer_drop(c, oldest_same, HS_ERR_BUSY,
                  "%u connections from its address are in their handshake (at most %u per "
                  "address): the oldest gives way to a new one",
                  same, PREAUTH_MAX_PER_ADDR);
    else if (total >= PREAUTH_MAX_PEERS)
        peer_drop(c, oldest, HS_ERR_BUSY,
                  "%u connections are in their handshake (at most %u): the oldest gives way to "
                  "a new one",
                  total, PREAUTH_MAX_PEERS);
}

static hs_status_t cb_accept(void *arg, hs_tp_conn_t *conn)
{
    hs_consumer_t *c = arg;
    peer_t *p = calloc(1, sizeof(*p));
    if (!p) return HS_ERR_NOMEM;
    p->id = ++c->next_peer_id;
    p->conn = conn;
    p->t_accept = hs_now_s();
    p->state = PEER_NEW;
    snprintf(p->name, sizeof(p->name), "%s", hs_tp_conn_peer(conn));
    hs_tp_conn_set_user(conn, p);
    p->next = c->peers;
    c->peers = p;
    c->n_seen++;
    if (!c->have_secret && !c->cfg.insecure && !hs_tp_conn_is_loopback(conn)) {
        peer_drop(c, p, HS_ERR_AUTH,
                  "peer %s is not on a loopback address and no shared secret is set: start both "
                  "sides with --secret-file FILE (or the consumer with --insecure)",
                  hs_tp_conn_peer(conn));
        return HS_OK;
    }
    if (c->stop || c->all_queued) {
        /* The producer closes when it reads BYE; closing here with its HELLO
         * unread would reset the connection and could lose the BYE. */
        Hsflow__Bye b = HSFLOW__BYE__INIT;
        b.reason = "the run is over";
        peer_send_msg(c, p, HS_MSG_BYE, &b.base);
        p->bye_sent = true;
        return HS_OK;
    }
    hs_tp_conn_set_max_frame(conn, PREAUTH_MAX_FRAME); /* raised in peer_admit */
    preauth_make_room(c, p);
    hs_debug("connection from %s", hs_tp_conn_peer(conn));
    return HS_OK;
}

static void cb_frame(void *arg, hs_tp_conn_t *conn, uint16_t type, const uint8_t *body,
                     uint32_t body_len, uint64_t payload_bytes)
{
    hs_consumer_t *c = arg;
    peer_t *p = hs_tp_conn_get_user(conn);
    if (!p || !p->conn) return;
    if (p->bye_sent) {
        if (payload_bytes) hs_tp_close(conn, HS_ERR_CLOSED); /* refused: nothing is written */
        return;
    }
    if (payload_bytes && type != HS_MSG_DONE) {
        peer_drop(c, p, HS_ERR_PROTO, "%s frame carries a payload", hs_msg_type_str(type));
        return;
    }
    switch (type) {
    case HS_MSG_HELLO:
        on_hello(c, p, body, body_len);
        break;
    case HS_MSG_AUTH:
        on_auth(c, p, body, body_len);
        break;
    case HS_MSG_PLAN:
        on_plan(c, p, body, body_len);
        break;
    case HS_MSG_DONE:
        on_done(c, p, body, body_len, payload_bytes);
        break;
    case HS_MSG_STATS:
        on_stats(c, p, body, body_len);
        break;
    case HS_MSG_BYE: {
        char why[256];
        ProtobufCMessage *m;
        const char *reason = "";
        if (hs_msg_unpack(HS_MSG_BYE, body, body_len, &m, why, sizeof(why)) == HS_OK)
            reason = ((Hsflow__Bye *)m)->reason;
        else
            m = NULL;
        hs_info("producer %s says goodbye%s%s", p->name, *reason ? ": " : "", reason);
        hs_msg_free(m);
        hs_tp_close(conn, HS_ERR_CLOSED);
        break;
    }
    case HS_MSG_ERROR: {
        char why[256];
        ProtobufCMessage *m;
        if (hs_msg_unpack(HS_MSG_ERROR, body, body_len, &m, why, sizeof(why)) == HS_OK) {
            hs_error("producer %s reports: %s", p->name, ((Hsflow__Error *)m)->text);
            hs_msg_free(m);
        }
        hs_tp_close(conn, HS_ERR_CLOSED);
        break;
    }
    default:
        peer_drop(c, p, HS_ERR_PROTO, "unexpected %s frame from a producer", hs_msg_type_str(type));
    }
}

static void cb_payload(void *arg, hs_tp_conn_t *conn, uint64_t cookie, hs_status_t status)
{
    hs_consumer_t *c = arg;
    peer_t *p = hs_tp_conn_get_user(conn);
    if (!p) return;
    p->receiving--;
    if (status != HS_OK) {
        peer_reap(c, p);
        return;
    }
    p->t_progress = hs_now_s();
    hs_sched_item_t it;
    if (hs_sched_lookup(c->sched, p->id, cookie, &it) != HS_OK) return; /* cannot happen */
    verify_job_t *j = calloc(1, sizeof(*j));
    if (!j) {
        peer_drop(c, p, HS_ERR_NOMEM, "out of memory");
        return;
    }
    hs_trace("ticket %llu: %.1f MiB landed in %.1f ms", (unsigned long long)cookie,
             (double)it.bytes / (1 << 20), 1e3 * (hs_now_s() - p->t_done_frame));
    j->t_queued = hs_now_s();
    j->peer_id = p->id;
    j->ticket_id = cookie;
    j->item = it;
    p->verifying++;
    pthread_mutex_lock(&c->vlock);
    j->next = c->vjobs;
    c->vjobs = j;
    c->vjobs_n++;
    pthread_cond_signal(&c->vcond);
    pthread_mutex_unlock(&c->vlock);
}

static void cb_close(void *arg, hs_tp_conn_t *conn, hs_status_t reason, const char *why)
{
    hs_consumer_t *c = arg;
    peer_t *p = hs_tp_conn_get_user(conn);
    if (!p) return;
    if (reason != HS_ERR_CLOSED && p->state != PEER_NEW)
        hs_warn("producer %s disconnected: %s", p->name, why && *why ? why : hs_status_str(reason));
    else if (reason != HS_ERR_CLOSED)
        hs_warn("connection %s closed: %s", p->name, why && *why ? why : hs_status_str(reason));
    if (reason == HS_ERR_PROTO || reason == HS_ERR_FORMAT || reason == HS_ERR_CHECKSUM)
        c->n_proto_errors++;
    p->conn = NULL;
    p->state = PEER_GONE;
    if (c->pending && c->pending->sender == p->id) {
        hs_warn("producer %s left before its plan was complete (%u of %u batches); the plan is "
                "discarded",
                p->name, c->pending->received, c->pending->offer.n_batches);
        plan_restart(c);
    }
    peer_reap(c, p);
}

/* ---- network thread ---------------------------------------------------------- */

/* A peer that connects and never finishes the handshake would hold its
 * connection forever: cut it off after handshake_timeout_s (configured,
 * default 15 s). */
static void drop_stalled_handshakes(hs_consumer_t *c, double now)
{
    /* The same bound for the plan exchange, page by page: a producer asked
     * for the plan that stops sending it would keep every other one waiting. */
    peer_t *sender = c->pending ? peer_find(c, c->pending->sender) : NULL;
    if (sender && now - c->pending->t_page > c->handshake_timeout_s)
        peer_drop(c, sender, HS_ERR_TIMEOUT,
                  "no PLAN page within %.0f s (%u of %u batches received); another producer "
                  "sends the plan",
                  c->handshake_timeout_s, c->pending->received, c->pending->offer.n_batches);
    for (peer_t *p = c->peers; p; p = p->next)
        if (p->conn && !p->bye_sent && !p->dropped &&
            (p->state == PEER_NEW || p->state == PEER_AUTH) &&
            now - p->t_accept > c->handshake_timeout_s)
            peer_drop(c, p, HS_ERR_TIMEOUT, "no complete handshake within %.0f s",
                      c->handshake_timeout_s);
}

/* A producer that holds tickets and shows no progress for --lease-timeout
 * (no DONE, no landed payload, no heartbeat from a computing worker) is
 * stopped or hung; the transport cannot tell, the kernel still ACKs. It is
 * dropped: its tickets go back to the front of the queue once its payloads
 * settle (peer_reap), and a late payload finds its connection closed. */
static void expire_leases(hs_consumer_t *c, double now)
{
    double limit = c->cfg.lease_timeout_s;
    if (!c->sched || limit <= 0) return;
    for (peer_t *p = c->peers; p; p = p->next) {
        if (p->state != PEER_READY || !p->conn || p->dropped) continue;
        uint32_t n = hs_sched_leases_of(c->sched, p->id);
        if (n && now - p->t_progress > limit)
            peer_drop(c, p, HS_ERR_TIMEOUT,
                      "no progress for %.1f s (no DONE, no heartbeat from a computing worker) "
                      "while holding %u ticket(s); they go back to the queue. A stopped "
                      "producer rejoins with --reconnect; a slow one needs a larger "
                      "--lease-timeout",
                      now - p->t_progress, n);
    }
}

static hs_status_t cache_register(void *tp, void *addr, uint64_t len)
{
    return hs_tp_mem_register(tp, addr, (size_t)len);
}

/* Registers the cache with the transport (UCX maps it for RDMA) a chunk at
 * a time as chunks become usable, then whole; the cache hands out only
 * slots inside registered memory (HS_CACHE_REGISTERED). */
static void register_ready_chunks(hs_consumer_t *c)
{
    if (!c->cache_registered)
        c->cache_registered = !hs_cache_register_next(c->cache, cache_register, c->tp);
}

/* What start-up waits for, in a few words, or "" once batches flow. */
static void startup_waiting(hs_consumer_t *c, char *buf, size_t cap)
{
    buf[0] = 0;
    if (!c->have_run) {
        const pending_plan_t *pp = c->pending;
        const peer_t *sender = NULL;
        for (const peer_t *p = c->peers; pp && p; p = p->next)
            if (p->id == pp->sender) sender = p;
        if (sender && pp->offer.n_batches)
            snprintf(buf, cap, "producer %.100s sends the plan: %.0f%%", sender->name,
                     100.0 * pp->received / pp->offer.n_batches);
        else
            snprintf(buf, cap, "waiting for the first producer");
        return;
    }
    hs_cache_stats_t cs;
    hs_cache_stats(c->cache, &cs);
    if (cs.ready_bytes < cs.capacity)
        snprintf(buf, cap, "pinning the cache: %.1f of %.1f GiB",
                 (double)cs.ready_bytes / (1 << 30), (double)cs.capacity / (1 << 30));
}

/* Publishes the network thread's figures for hs_consumer_stats(). */
static void snapshot(hs_consumer_t *c)
{
    hs_consumer_stats_t s = {0};
    double stall = 0;
    for (peer_t *p = c->peers; p; p = p->next)
        if (p->conn && p->state == PEER_READY) {
            s.producers_connected++;
            stall += p->stall_pct;
        }
    /* Once every producer has left, the last figure stands (the summary's). */
    s.producer_stall_pct =
        s.producers_connected ? stall / (double)s.producers_connected : c->snap.producer_stall_pct;
    if (c->sched) {
        hs_sched_stats_t ss;
        hs_sched_stats(c->sched, &ss);
        s.duplicates = ss.duplicates;
        s.tickets_out = ss.leased;
    }
    s.protocol_errors = c->n_proto_errors;
    s.producers_seen = c->n_seen;
    s.producers_dropped = c->n_dropped;
    s.leases_returned = c->leases_returned;
    char waiting[sizeof(c->waiting)];
    startup_waiting(c, waiting, sizeof(waiting));
    pthread_mutex_lock(&c->lock);
    memcpy(c->waiting, waiting, sizeof(waiting));
    c->snap = s;
    if (s.producers_connected) c->t_producer_seen = hs_now_s();
    pthread_mutex_unlock(&c->lock);
}

/* Retires the scheduler records of batches the trainer released. */
static void collect_released(hs_consumer_t *c)
{
    uint64_t tickets[256];
    uint32_t n;
    do {
        pthread_mutex_lock(&c->lock);
        n = c->released_n < 256 ? c->released_n : 256;
        c->released_n -= n;
        if (n) memcpy(tickets, c->released + c->released_n, n * sizeof(uint64_t));
        pthread_mutex_unlock(&c->lock);
        for (uint32_t i = 0; i < n; i++)
            hs_sched_release(c->sched, tickets[i]);
    } while (n == 256);
}

static void *net_main(void *arg)
{
    hs_consumer_t *c = arg;
    while (!c->stop) {
        register_ready_chunks(c);
        hs_tp_progress(c->tp, c->cache_registered ? 200 : 20);
        collect_verified(c);
        collect_released(c);
        push_deliverable(c);
        issue_tickets(c);
        snapshot(c);
        double now = hs_now_s();
        drop_stalled_handshakes(c, now);
        expire_leases(c, now);
        if (now - c->t_last_status >= c->status_interval && c->status_interval > 0) {
            c->t_last_status = now;
            char line[1024];
            hs_consumer_status_line(c, line, sizeof(line));
            hs_info("%s", line);
        }
    }
    /* Orderly end: BYE went out in push_deliverable; give it a moment. */
    for (peer_t *p = c->peers; p; p = p->next)
        if (p->conn) hs_tp_close(p->conn, HS_ERR_CLOSED);
    for (int i = 0; i < 5 && c->peers; i++) {
        hs_tp_progress(c->tp, 20);
        collect_verified(c);
    }
    return NULL;
}

/* ---- public API ------------------------------------------------------------- */

void hs_consumer_config_default(hs_consumer_config_t *cfg)
{
    memset(cfg, 0, sizeof(*cfg));
    cfg->listen_host = "0.0.0.0";
    cfg->listen_port = 7000;
    cfg->cache_bytes = 4ull << 30;
    cfg->epochs = 1;
    cfg->gpu = -1;
    cfg->order = HS_ORDER_ARRIVAL;
    cfg->prefetch = 2;
    cfg->transport = "auto";
    cfg->verify_threads = 1;
    cfg->peer_timeout_s = 10;
    cfg->lease_timeout_s = 60;
    cfg->status_interval_s = 5;
    cfg->handshake_timeout_s = 15;
    cfg->no_producer_warn_s = 30;
    cfg->rank = 0;
    cfg->world = 1;
    cfg->uneven = HS_UNEVEN_DROP;
}

/* The resume state of the config (checked against the run's epochs and
 * order now, against the plan when a producer offers one), else an empty
 * state. */
static hs_status_t resume_load(hs_consumer_t *c, const hs_consumer_config_t *cfg)
{
    hs_state_order_t order = (hs_state_order_t)cfg->order;
    if (!cfg->resume_state) {
        hs_status_t st = hs_state_create_empty(cfg->epochs, order, &c->resume);
        if (st == HS_OK) hs_state_set_shard(c->resume, cfg->rank, cfg->world, cfg->uneven);
        return st;
    }
    char why[512];
    size_t len = strnlen(cfg->resume_state, (size_t)HS_STATE_MAX_BYTES + 1);
    hs_status_t st = hs_state_decode(cfg->resume_state, len, &c->resume, why, sizeof(why));
    if (st == HS_OK) {
        st = hs_state_check_run(c->resume, cfg->epochs, order, why, sizeof(why));
        if (st == HS_OK)
            st = hs_state_check_shard(c->resume, cfg->rank, cfg->world, cfg->uneven, why,
                                      sizeof(why));
        if (st == HS_OK) hs_state_set_shard(c->resume, cfg->rank, cfg->world, cfg->uneven);
        if (st != HS_OK) {
            hs_state_destroy(c->resume);
            c->resume = NULL;
        }
    }
    if (st != HS_OK) {
        if (st == HS_ERR_NOMEM)
            hs_error("consumer: out of memory reading the resume state");
        else
            hs_error("consumer: %s", why);
        return st;
    }
    c->resume_given = true;
    if (hs_state_has_plan(c->resume))
        hs_info("resume state: plan %016llx, %llu batch(es) delivered before, from epoch %u",
                (unsigned long long)hs_state_plan_hash(c->resume),
                (unsigned long long)hs_state_delivered(c->resume), hs_state_epochs_done(c->resume));
    else
        hs_info("resume state saved before the plan was known: nothing to skip");
    return HS_OK;
}

static const hs_tp_callbacks_t consumer_callbacks = {
    .on_accept = cb_accept,
    .on_frame = cb_frame,
    .on_payload = cb_payload,
    .on_close = cb_close,
};

/* The tuning that is not in the listening line, defaults resolved, so every
 * log (hs-consumer's or a trainer's) says what the run was tuned with. */
static void log_effective_config(const hs_consumer_t *c, const hs_tp_config_t *tc)
{
    const hs_consumer_config_t *cfg = &c->cfg;
    char status[32], tuning[160];
    if (c->status_interval > 0)
        snprintf(status, sizeof status, "%g s", c->status_interval);
    else
        snprintf(status, sizeof status, "never");
    hs_tp_config_describe(tc, tuning, sizeof tuning);
    hs_info("consumer settings: verify threads %u, peer timeout %u s, handshake timeout %g s, "
            "status every %s, no-producer warning after %g s, %s",
            cfg->verify_threads, cfg->peer_timeout_s ? cfg->peer_timeout_s : 10,
            c->handshake_timeout_s, status, c->no_producer_warn_s, tuning);
}

hs_status_code_t hs_consumer_create(const hs_consumer_config_t *cfg, hs_consumer_t **out)
{
    hs_status_t st;
    if (cfg->epochs == 0 || cfg->prefetch == 0 || cfg->cache_bytes < (1u << 20) ||
        cfg->verify_threads == 0 || cfg->verify_threads > 64) {
        hs_error("consumer: epochs, prefetch and verify threads must be >= 1 and the cache at "
                 "least 1 MiB");
        return HS_ERR_INVALID;
    }
    if (cfg->world == 0 || cfg->world > (1u << 20) || cfg->rank >= cfg->world) {
        hs_error("consumer: rank %u of a world of %u: the world size must be 1..1048576 and the "
                 "rank 0..world-1 (--rank R --world W, or torchrun's RANK and WORLD_SIZE)",
                 cfg->rank, cfg->world);
        return HS_ERR_INVALID;
    }
    if (cfg->uneven != HS_UNEVEN_DROP && cfg->uneven != HS_UNEVEN_REPEAT) {
        hs_error("consumer: --uneven %d: expected drop or repeat", (int)cfg->uneven);
        return HS_ERR_INVALID;
    }
    if (!(cfg->lease_timeout_s >= 0 && cfg->lease_timeout_s <= 1e6)) {
        hs_error("consumer: lease timeout %g s: expected 0 (never) to 1000000 seconds",
                 cfg->lease_timeout_s);
        return HS_ERR_INVALID;
    }
    if (!(cfg->status_interval_s <= 1e6) || !(cfg->handshake_timeout_s >= 0) ||
        !(cfg->handshake_timeout_s <= 1e6) || !(cfg->no_producer_warn_s >= 0) ||
        !(cfg->no_producer_warn_s <= 1e6)) {
        hs_error("consumer: status interval %g s, handshake timeout %g s, no-producer warning "
                 "%g s: expected seconds up to 1000000 (0 = the default)",
                 cfg->status_interval_s, cfg->handshake_timeout_s, cfg->no_producer_warn_s);
        return HS_ERR_INVALID;
    }
    st = hs_cache_check_room(cfg->cache_bytes, cfg->force);
    if (st != HS_OK) return st;
    hs_consumer_t *c = calloc(1, sizeof(*c));
    if (!c) return HS_ERR_NOMEM;
    c->cfg = *cfg;
    hs_msg_arena_init(&c->done_arena);
    c->status_interval = cfg->status_interval_s == 0 ? 5.0 : cfg->status_interval_s;
    c->handshake_timeout_s = cfg->handshake_timeout_s > 0 ? cfg->handshake_timeout_s : 15.0;
    c->no_producer_warn_s = cfg->no_producer_warn_s > 0 ? cfg->no_producer_warn_s : 30.0;
    c->t_producer_seen = hs_now_s();
    pthread_mutex_init(&c->lock, NULL);
    pthread_cond_init(&c->cond, NULL);
    pthread_mutex_init(&c->vlock, NULL);
    pthread_cond_init(&c->vcond, NULL);
    char host[64];
    gethostname(host, sizeof(host));
    host[sizeof(host) - 1] = 0;
    snprintf(c->name, sizeof(c->name), "%s:%d", host, (int)getpid());
    randombytes_buf(&c->session_id, sizeof(c->session_id));

    if (cfg->secret_file) {
        st = hs_auth_load_secret(cfg->secret_file, &c->key);
        if (st != HS_OK) goto err_free;
        c->have_secret = true;
    }
    if (cfg->gpu >= 0) {
        st = hs__loader_create(cfg->gpu, &c->loader);
        if (st != HS_OK) goto err_free;
    }
    c->gpu_cur = c->gpu_inflight = -1;
    /* With a GPU the cache is pinned chunk by chunk in the background and
     * grows as chunks become ready, so producers can start at once. */
    hs_cache_config_t cc = {.capacity = cfg->cache_bytes,
                            .flags = HS_CACHE_REGISTERED | (cfg->gpu >= 0 ? HS_CACHE_PIN_CUDA : 0),
                            .cuda_device = cfg->gpu};
    st = resume_load(c, cfg);
    if (st != HS_OK) goto err_free;
    if (cfg->journal) {
        st = hs_journal_open(cfg->journal, &c->journal);
        if (st != HS_OK) goto err_free;
        if (c->resume_given) hs_journal_discard(c->journal);
        char why[512];
        st = hs_journal_set_shard(c->journal, cfg->rank, cfg->world, cfg->uneven, why, sizeof(why));
        if (st != HS_OK) {
            hs_error("consumer: %s", why);
            goto err_free;
        }
    }
    st = hs_cache_create_ex(&cc, &c->cache);
    if (st != HS_OK) {
        hs_error("consumer: cannot map a cache of %llu bytes: %s",
                 (unsigned long long)cfg->cache_bytes, hs_status_str(st));
        goto err_free;
    }
    hs_tp_config_t tc = {0};
    st = hs_tp_kind_parse(cfg->transport ? cfg->transport : "auto", &tc.kind);
    if (st != HS_OK) {
        hs_error("consumer: unknown transport '%s': use auto, tcp or ucx", cfg->transport);
        goto err_cache;
    }
    tc.peer_timeout_s = cfg->peer_timeout_s;
    tc.net_devices = cfg->net_devices;
    tc.require_rdma = cfg->require_rdma;
    tc.auth_key = c->have_secret ? &c->key : NULL; /* copied: c->key stays ours */
    tc.allow_remote = cfg->insecure;
    tc.tcp_sockbuf = cfg->tcp_sockbuf;
    tc.ucx_no_memh = cfg->ucx_no_memh;
    tc.fault = cfg->fault;
    st = hs_tp_create(&tc, &consumer_callbacks, c, &c->tp);
    if (st != HS_OK) goto err_cache;
    st = hs_tp_listen(c->tp, cfg->listen_host, cfg->listen_port, &c->port);
    if (st != HS_OK) goto err_tp;

    c->n_verify = cfg->verify_threads;
    c->verify_threads = calloc(c->n_verify, sizeof(pthread_t));
    for (uint32_t i = 0; i < c->n_verify; i++)
        pthread_create(&c->verify_threads[i], NULL, verify_main, c);
    if (cfg->metrics) {
        char mhost[64];
        uint16_t mport;
        if (hs_parse_hostport(cfg->metrics, mhost, sizeof(mhost), &mport) != HS_OK) {
            hs_error("consumer: metrics address '%s' is not HOST:PORT", cfg->metrics);
            st = HS_ERR_INVALID;
            goto err_threads;
        }
        st = hs_metrics_start(c, mhost, mport, &c->metrics);
        if (st != HS_OK) goto err_threads;
    }
    if (pthread_create(&c->net_thread, NULL, net_main, c) != 0) {
        st = HS_ERR_NOMEM;
        goto err_threads;
    }
    hs_info("hsflow %s listening on %s:%u (%s), cache %.2f GiB, %u epoch(s), order %s, rank %u "
            "of %u (uneven %s), %s",
            hs_version_line(), cfg->listen_host, c->port, hs_tp_kind_str(tc.kind),
            (double)hs_cache_capacity(c->cache) / (1 << 30), cfg->epochs,
            cfg->order == HS_ORDER_PLAN ? "plan" : "arrival", cfg->rank, cfg->world,
            hs_shard_uneven_str((hs_shard_uneven_t)cfg->uneven),
            c->have_secret ? "HMAC auth"
                           : (cfg->insecure ? "INSECURE: any peer" : "loopback peers only"));
    log_effective_config(c, &tc);
    *out = c;
    return HS_OK;

err_threads:
    hs_metrics_stop(c->metrics);
    pthread_mutex_lock(&c->vlock);
    c->vstop = true;
    pthread_cond_broadcast(&c->vcond);
    pthread_mutex_unlock(&c->vlock);
    for (uint32_t i = 0; i < c->n_verify; i++)
        pthread_join(c->verify_threads[i], NULL);
    free(c->verify_threads);
err_tp:
    hs_tp_destroy(c->tp);
err_cache:
    hs_cache_destroy(c->cache);
err_free:
    hs_journal_close(c->journal);
    hs_state_destroy(c->resume);
    hs__loader_destroy(c->loader);
    free(c);
    return st;
}

uint16_t hs_consumer_port(const hs_consumer_t *c)
{
    return c->port;
}

uint16_t hs_consumer_metrics_port(const hs_consumer_t *c)
{
    return c->metrics ? hs_metrics_port(c->metrics) : 0;
}

/* Takes the next deliverable batch off the ready ring, waiting up to
 * timeout_ms (-1 forever, 0 not at all). Counts the wait as trainer starve. */
static hs_status_t ready_pop(hs_consumer_t *c, hs_sched_item_t *it, int timeout_ms)
{
    double t0 = hs_now_s();
    struct timespec dl;
    clock_gettime(CLOCK_REALTIME, &dl);
    if (timeout_ms > 0) {
        dl.tv_sec += timeout_ms / 1000;
        dl.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
        if (dl.tv_nsec >= 1000000000L) {
            dl.tv_sec++;
            dl.tv_nsec -= 1000000000L;
        }
    }
    hs_status_t st = HS_OK;
    pthread_mutex_lock(&c->lock);
    while (!c->ready_n) {
        if (c->finished || c->stop) {
            st = c->fatal[0] ? HS_ERR_NOSPACE : HS_ERR_CLOSED;
            if (c->t_end == 0) c->t_end = hs_now_s();
            break;
        }
        if (timeout_ms == 0) {
            st = HS_ERR_TIMEOUT;
            break;
        }
        if (timeout_ms < 0)
            pthread_cond_wait(&c->cond, &c->lock);
        else if (pthread_cond_timedwait(&c->cond, &c->lock, &dl) == ETIMEDOUT) {
            st = HS_ERR_TIMEOUT;
            break;
        }
    }
    if (c->t_start > 0) c->starve_s += hs_now_s() - (t0 > c->t_start ? t0 : c->t_start);
    if (st == HS_OK) {
        *it = c->ready[c->ready_head];
        c->ready_head = (c->ready_head + 1) % c->ready_cap;
        c->ready_n--;
    }
    pthread_mutex_unlock(&c->lock);
    return st;
}

static void batch_from_view(hs_consumer_t *c, const hs_sched_item_t *it, uint8_t *region,
                            hs_batch_t *out)
{
    hs_batch_view_t v = hs_batch_view(region, it->n_seqs, it->n_tokens, &c->layout);
    memset(out, 0, sizeof(*out));
    out->epoch = it->epoch;
    out->batch = it->batch;
    out->n_seqs = it->n_seqs;
    out->n_tokens = it->n_tokens;
    out->hidden_size = c->layout.hidden_size;
    out->n_layers = c->layout.n_layers;
    out->layers = c->layout.layers;
    out->cu_seqlens = v.cu_seqlens;
    out->sample_ids = v.sample_ids;
    out->input_ids = v.input_ids;
    out->loss_mask = v.loss_mask;
    out->hidden = v.hidden;
    out->bytes = it->bytes;
    out->handle = it->slot_offset;
    out->ticket = it->ticket;
}

/* The cache slot of a batch is free again: give it back and tell the
 * network thread (from the trainer, or from the copy stream's callback). */
static void slot_done(hs_consumer_t *c, uint64_t offset, uint64_t ticket)
{
    hs_cache_free(c->cache, offset);
    pthread_mutex_lock(&c->lock);
    if (c->released_n == c->released_cap) {
        uint32_t ncap = c->released_cap ? c->released_cap * 2 : 64;
        uint64_t *r = realloc(c->released, ncap * sizeof(uint64_t));
        if (r) {
            c->released = r;
            c->released_cap = ncap;
        }
    }
    if (c->released_n < c->released_cap) c->released[c->released_n++] = ticket;
    pthread_mutex_unlock(&c->lock);
    hs_tp_wakeup(c->tp); /* room for new tickets */
}

static void gpu_copied(void *arg)
{
    gpu_copy_done_t *d = arg;
    slot_done(d->c, d->slot_offset, d->ticket);
}

/* Starts the H2D copy of `it` into device buffer `buf`. */
static hs_status_t gpu_start_copy(hs_consumer_t *c, int buf, const hs_sched_item_t *it)
{
    uint64_t max_bytes;
    pthread_mutex_lock(&c->lock);
    max_bytes = c->max_batch_bytes;
    pthread_mutex_unlock(&c->lock);
    hs_status_t st = hs__loader_reserve(c->loader, max_bytes);
    if (st != HS_OK) return st;
    c->gpu_slot[buf].item = *it;
    /* The copy's callback may run after this buffer has been refilled, so it
     * gets its own record of the slot to free (a small ring: at most two
     * copies are queued at once). */
    gpu_copy_done_t *d = &c->gpu_done[c->gpu_done_next++ % HS_GPU_DONE_RING];
    *d = (gpu_copy_done_t){c, it->slot_offset, it->ticket};
    st = hs__loader_copy(c->loader, buf, c->cache, it->slot_offset, it->bytes, gpu_copied, d);
    if (st == HS_OK) c->gpu_inflight = buf;
    return st;
}

static hs_status_t next_gpu(hs_consumer_t *c, hs_batch_t *out, int timeout_ms)
{
    hs_status_t st;
    if (c->gpu_cur >= 0) { /* taking the next batch ends the previous one */
        hs__loader_consumed(c->loader, c->gpu_cur);
        c->gpu_cur = -1;
    }
    if (c->gpu_inflight < 0) {
        hs_sched_item_t it;
        st = ready_pop(c, &it, timeout_ms);
        if (st != HS_OK) return st;
        st = gpu_start_copy(c, c->gpu_last == 0 ? 1 : 0, &it);
        if (st != HS_OK) return st;
    }
    int buf = c->gpu_inflight;
    void *dptr;
    st = hs__loader_hand_over(c->loader, buf, &dptr);
    if (st != HS_OK) return st;
    c->gpu_inflight = -1;
    c->gpu_cur = c->gpu_last = buf;
    batch_from_view(c, &c->gpu_slot[buf].item, dptr, out);
    out->on_device = true;
    out->handle = (uint64_t)buf;

    /* Prefetch: copy the next ready batch while the trainer works on this one. */
    hs_sched_item_t it;
    if (ready_pop(c, &it, 0) == HS_OK) {
        st = gpu_start_copy(c, 1 - buf, &it);
        if (st != HS_OK) return st;
    }
    uint64_t bytes;
    double secs;
    hs__loader_stats(c->loader, &bytes, &secs);
    pthread_mutex_lock(&c->lock);
    c->batches_delivered++;
    c->tokens_delivered += out->n_tokens;
    if (c->position) hs_state_mark(c->position, out->epoch, out->batch);
    c->h2d_bytes = bytes;
    c->h2d_s = secs;
    pthread_mutex_unlock(&c->lock);
    return HS_OK;
}

hs_status_code_t hs_consumer_next(hs_consumer_t *c, hs_batch_t *out, int timeout_ms)
{
    if (c->loader) return next_gpu(c, out, timeout_ms);
    hs_sched_item_t it;
    hs_status_t st = ready_pop(c, &it, timeout_ms);
    if (st != HS_OK) return st;
    pthread_mutex_lock(&c->lock);
    c->batches_delivered++;
    c->tokens_delivered += it.n_tokens;
    c->in_trainer++;
    if (c->position) hs_state_mark(c->position, it.epoch, it.batch);
    pthread_mutex_unlock(&c->lock);
    batch_from_view(c, &it, (uint8_t *)hs_cache_base(c->cache) + it.slot_offset, out);
    return HS_OK;
}

hs_status_code_t hs_consumer_release(hs_consumer_t *c, const hs_batch_t *batch)
{
    /* The trainer is done with it: record that first. */
    if (c->journal) hs_journal_append(c->journal, batch->epoch, batch->batch);
    if (c->loader) {
        /* The host slot went back when its copy finished; this only ends the
         * trainer's use of the device buffer. */
        if (!batch->on_device || (int)batch->handle != c->gpu_cur) return HS_OK;
        c->gpu_cur = -1;
        return hs__loader_consumed(c->loader, (int)batch->handle);
    }
    if (!hs_cache_contains(c->cache, (uint8_t *)hs_cache_base(c->cache) + batch->handle,
                           batch->bytes)) {
        hs_error("release of a batch this consumer did not hand out, or released twice (slot "
                 "%llu)",
                 (unsigned long long)batch->handle);
        return HS_ERR_INVALID;
    }
    pthread_mutex_lock(&c->lock);
    c->in_trainer--;
    pthread_mutex_unlock(&c->lock);
    slot_done(c, batch->handle, batch->ticket);
    return HS_OK;
}

hs_status_code_t hs_consumer_state_save(hs_consumer_t *c, char *buf, size_t cap, size_t *len)
{
    if (!c || !len) {
        hs_error("hs_consumer_state_save: needs a consumer and somewhere to put the length");
        return HS_ERR_INVALID;
    }
    pthread_mutex_lock(&c->lock);
    hs_status_t st = hs_state_encode(c->position ? c->position : c->resume, buf, cap, len);
    pthread_mutex_unlock(&c->lock);
    return st;
}

/* A side waiting this share of the time or more is waiting on the other. */
#define HS_WAIT_PCT_LIMIT 20.0

/* Epoch, progress, ETAs and the bottleneck from the counted figures. The
 * rates are those since the first ticket; the trainer's own rate counts
 * only the time it had data. */
static void stats_derive(hs_consumer_stats_t *s)
{
    s->eta_epoch_s = s->eta_run_s = -1;
    uint64_t total = s->batches_planned + s->batches_resumed;
    uint64_t done = s->batches_resumed + s->batches_delivered;
    if (!total || !s->epochs) return;
    uint64_t per_epoch = total / s->epochs;
    uint64_t e = per_epoch ? done / per_epoch + 1 : 1;
    s->epoch = (uint32_t)(e > s->epochs ? s->epochs : e);
    s->run_pct = 100.0 * (double)done / (double)total;
    if (s->seconds <= 0) return;
    s->supply_batches_per_s = (double)s->batches_delivered / s->seconds;
    double fed_s = s->seconds * (1.0 - s->starve_pct / 100.0);
    s->trainer_batches_per_s = fed_s > 0.01 * s->seconds ? (double)s->batches_delivered / fed_s : 0;
    if (s->supply_batches_per_s > 0) {
        uint64_t epoch_end = (uint64_t)s->epoch * per_epoch;
        s->eta_run_s =
            (double)(s->batches_planned - s->batches_delivered) / s->supply_batches_per_s;
        s->eta_epoch_s =
            (double)(epoch_end > done ? epoch_end - done : 0) / s->supply_batches_per_s;
    }
    if (s->batches_delivered < 2 || s->seconds < 1.0) return;
    bool starving = s->starve_pct >= HS_WAIT_PCT_LIMIT;
    bool stalled = s->producer_stall_pct >= HS_WAIT_PCT_LIMIT;
    if (starving && stalled)
        s->bottleneck = HS_BOTTLENECK_NETWORK;
    else if (starving)
        s->bottleneck = HS_BOTTLENECK_PRODUCERS;
    else
        s->bottleneck = HS_BOTTLENECK_TRAINER;
}

void hs_consumer_stats(hs_consumer_t *c, hs_consumer_stats_t *s)
{
    memset(s, 0, sizeof(*s));
    hs_cache_stats_t cs;
    hs_cache_stats(c->cache, &cs);
    pthread_mutex_lock(&c->lock);
    s->batches_planned = c->batches_planned;
    s->batches_resumed = c->batches_resumed;
    s->batches_delivered = c->batches_delivered;
    s->checksum_failures = c->checksum_failures;
    s->bytes_received = c->bytes_received;
    s->tokens_delivered = c->tokens_delivered;
    s->finished = c->finished && !c->ready_n;
    double now = c->t_end > 0 ? c->t_end : hs_now_s();
    s->seconds = c->t_start > 0 ? now - c->t_start : 0;
    s->starve_pct = s->seconds > 0 ? 100.0 * c->starve_s / s->seconds : 0;
    s->h2d_bytes = c->h2d_bytes;
    s->h2d_gbytes_per_s = c->h2d_s > 0 ? (double)c->h2d_bytes / c->h2d_s / 1e9 : 0;
    /* The network thread's own figures, as of its last snapshot. */
    s->duplicates = c->snap.duplicates;
    s->tickets_out = c->snap.tickets_out;
    s->protocol_errors = c->snap.protocol_errors;
    s->producers_seen = c->snap.producers_seen;
    s->producers_dropped = c->snap.producers_dropped;
    s->leases_returned = c->snap.leases_returned;
    s->producers_connected = c->snap.producers_connected;
    s->producer_stall_pct = c->snap.producer_stall_pct;
    pthread_mutex_unlock(&c->lock);
    s->epochs = c->cfg.epochs;
    s->cache_capacity = cs.capacity;
    s->cache_used = cs.used;
    s->cache_high_water = cs.high_water;
    s->cache_ready_bytes = cs.ready_bytes;
    s->cache_prepare_s = cs.prepare_s;
    stats_derive(s);
}

const char *hs_bottleneck_str(int32_t bottleneck)
{
    switch (bottleneck) {
    case HS_BOTTLENECK_PRODUCERS:
        return "producers";
    case HS_BOTTLENECK_TRAINER:
        return "trainer";
    case HS_BOTTLENECK_NETWORK:
        return "network";
    default:
        return "unknown";
    }
}

int hs_consumer_bottleneck_text(const hs_consumer_stats_t *s, char *buf, size_t cap)
{
    /* At the end of a run every producer has left: name those seen. */
    unsigned long long np =
        (unsigned long long)(s->producers_connected ? s->producers_connected : s->producers_seen);
    switch (s->bottleneck) {
    case HS_BOTTLENECK_PRODUCERS:
        return snprintf(buf, cap,
                        "producers are the limit: %llu producer%s give %.3g batch/s, the trainer "
                        "takes %.3g batch/s",
                        np, np == 1 ? "" : "s", s->supply_batches_per_s, s->trainer_batches_per_s);
    case HS_BOTTLENECK_TRAINER:
        return snprintf(buf, cap,
                        "the trainer is the limit: it takes %.3g batch/s, producers wait for "
                        "tickets %.0f%% of the time",
                        s->trainer_batches_per_s, s->producer_stall_pct);
    case HS_BOTTLENECK_NETWORK:
        return snprintf(buf, cap,
                        "the network is the limit: %.3g GB/s arrive, producers wait for tickets "
                        "%.0f%% and the trainer for data %.0f%% of the time",
                        s->seconds > 0 ? (double)s->bytes_received / s->seconds / 1e9 : 0,
                        s->producer_stall_pct, s->starve_pct);
    default:
        return snprintf(buf, cap, "too early to name the limit");
    }
}

/* "42s", "3m10s", "2h05m", or "?" for a negative (unknown) time. */
static const char *duration_str(double s, char *buf, size_t cap)
{
    if (s < 0) return "?";
    unsigned long long t = (unsigned long long)(s + 0.5);
    if (t < 60)
        snprintf(buf, cap, "%llus", t);
    else if (t < 3600)
        snprintf(buf, cap, "%llum%02llus", t / 60, t % 60);
    else
        snprintf(buf, cap, "%lluh%02llum", t / 3600, t / 60 % 60);
    return buf;
}

void hs_consumer_status_line(hs_consumer_t *c, char *buf, size_t cap)
{
    hs_consumer_stats_t s;
    hs_consumer_stats(c, &s);
    char waiting[sizeof(c->waiting)];
    pthread_mutex_lock(&c->lock);
    double alone = hs_now_s() - c->t_producer_seen;
    memcpy(waiting, c->waiting, sizeof(waiting));
    pthread_mutex_unlock(&c->lock);
    double secs = s.seconds > 0 ? s.seconds : 1e-9;
    char ee[32], er[32], limit[200];
    hs_consumer_bottleneck_text(&s, limit, sizeof(limit));
    int n = snprintf(
        buf, cap,
        "epoch %u/%u | %llu/%llu batches (%.1f%%) | %.0f tok/s | %.2f GB/s | ETA epoch %s, "
        "run %s | cache %.0f%% | tickets out %llu | producers %llu | producer stall %.0f%% | "
        "starve %.0f%% | %s",
        s.epoch, s.epochs, (unsigned long long)s.batches_delivered,
        (unsigned long long)s.batches_planned, s.run_pct, (double)s.tokens_delivered / secs,
        (double)s.bytes_received / secs / 1e9, duration_str(s.eta_epoch_s, ee, sizeof(ee)),
        duration_str(s.eta_run_s, er, sizeof(er)),
        s.cache_capacity ? 100.0 * (double)s.cache_used / (double)s.cache_capacity : 0,
        (unsigned long long)s.tickets_out, (unsigned long long)s.producers_connected,
        s.producer_stall_pct, s.starve_pct, waiting[0] ? waiting : limit);
    size_t len = n < 0 ? cap : (size_t)n;
    if (!s.finished && !s.producers_connected && alone >= c->no_producer_warn_s && len < cap)
        snprintf(buf + len, cap - len,
                 " | no producer connected for %.0f s: waiting; start producers or stop with "
                 "Ctrl-C",
                 alone);
}

int hs_consumer_stats_json(const hs_consumer_stats_t *s, char *buf, size_t cap)
{
    double secs = s->seconds > 0 ? s->seconds : 1e-9;
    char limit[200];
    hs_consumer_bottleneck_text(s, limit, sizeof(limit)); /* no quote nor backslash in it */
    return snprintf(
        buf, cap,
        "{\n  \"batches_planned\": %llu,\n  \"batches_resumed\": %llu,\n"
        "  \"batches_delivered\": %llu,\n"
        "  \"duplicates\": %llu,\n  \"checksum_failures\": %llu,\n"
        "  \"protocol_errors\": %llu,\n  \"bytes\": %llu,\n  \"tokens\": %llu,\n"
        "  \"seconds\": %.3f,\n  \"tokens_per_s\": %.1f,\n  \"batches_per_s\": %.3f,\n"
        "  \"gbytes_per_s\": %.4f,\n  \"epochs\": %u,\n  \"producers_seen\": %llu,\n"
        "  \"producers_dropped\": %llu,\n  \"leases_returned\": %llu,\n"
        "  \"cache_capacity\": %llu,\n  \"cache_used\": %llu,\n  \"cache_high_water\": %llu,\n"
        "  \"tickets_out\": %llu,\n  \"producers_connected\": %llu,\n"
        "  \"cache_ready_bytes\": %llu,\n  \"cache_prepare_s\": %.3f,\n"
        "  \"starve_pct\": %.2f,\n  \"producer_stall_pct\": %.2f,\n"
        "  \"h2d_bytes\": %llu,\n  \"h2d_gbytes_per_s\": %.3f,\n"
        "  \"epoch\": %u,\n  \"run_pct\": %.2f,\n  \"eta_epoch_s\": %.1f,\n  \"eta_run_s\": %.1f,\n"
        "  \"supply_batches_per_s\": %.4f,\n  \"trainer_batches_per_s\": %.4f,\n"
        "  \"bottleneck\": \"%s\",\n  \"bottleneck_text\": \"%s\",\n  \"complete\": %s\n}\n",
        (unsigned long long)s->batches_planned, (unsigned long long)s->batches_resumed,
        (unsigned long long)s->batches_delivered, (unsigned long long)s->duplicates,
        (unsigned long long)s->checksum_failures, (unsigned long long)s->protocol_errors,
        (unsigned long long)s->bytes_received, (unsigned long long)s->tokens_delivered, s->seconds,
        (double)s->tokens_delivered / secs, (double)s->batches_delivered / secs,
        (double)s->bytes_received / secs / 1e9, s->epochs, (unsigned long long)s->producers_seen,
        (unsigned long long)s->producers_dropped, (unsigned long long)s->leases_returned,
        (unsigned long long)s->cache_capacity, (unsigned long long)s->cache_used,
        (unsigned long long)s->cache_high_water, (unsigned long long)s->tickets_out,
        (unsigned long long)s->producers_connected, (unsigned long long)s->cache_ready_bytes,
        s->cache_prepare_s, s->starve_pct, s->producer_stall_pct, (unsigned long long)s->h2d_bytes,
        s->h2d_gbytes_per_s, s->epoch, s->run_pct, s->eta_epoch_s, s->eta_run_s,
        s->supply_batches_per_s, s->trainer_batches_per_s, hs_bottleneck_str(s->bottleneck), limit,
        (s->batches_planned || s->batches_resumed) && s->batches_delivered == s->batches_planned
            ? "true"
            : "false");
}

void hs_consumer_destroy(hs_consumer_t *c)
{
    if (!c) return;
    pthread_mutex_lock(&c->lock);
    if (c->t_end == 0) c->t_end = hs_now_s();
    pthread_mutex_unlock(&c->lock);
    hs_metrics_stop(c->metrics); /* its thread reads the stats below */
    c->stop = true;
    hs_tp_wakeup(c->tp);
    pthread_join(c->net_thread, NULL);
    pthread_mutex_lock(&c->vlock);
    c->vstop = true;
    pthread_cond_broadcast(&c->vcond);
    pthread_mutex_unlock(&c->vlock);
    for (uint32_t i = 0; i < c->n_verify; i++)
        pthread_join(c->verify_threads[i], NULL);
    free(c->verify_threads);
    /* Copies in flight finish first: their callbacks free slots and wake the
     * transport, which must still exist. */
    hs__loader_destroy(c->loader);
    hs_tp_destroy(c->tp);
    /* Only now: the transport's last progress can still land a payload and
     * queue its job (cb_payload), after the verify threads have gone. */
    for (verify_job_t *j = c->vjobs, *n; j; j = n) {
        n = j->next;
        free(j);
    }
    for (verify_job_t *j = c->vdone, *n; j; j = n) {
        n = j->next;
        free(j);
    }
    while (c->peers) {
        peer_t *p = c->peers;
        c->peers = p->next;
        free(p->hello_body);
        free(p);
    }
    hs_sched_destroy(c->sched);
    hs_cache_destroy(c->cache);
    hs_journal_close(c->journal);
    hs_state_destroy(c->resume);
    hs_state_destroy(c->position);
    hs_auth_key_clear(&c->key);
    plan_discard(c);
    free(c->ready);
    free(c->released);
    pthread_mutex_destroy(&c->lock);
    pthread_cond_destroy(&c->cond);
    pthread_mutex_destroy(&c->vlock);
    pthread_cond_destroy(&c->vcond);
    free(c);
}

const char *hsflow_status_str(hs_status_code_t status)
{
    return hs_status_str(status);
}
