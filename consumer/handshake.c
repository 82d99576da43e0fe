/* SPDX-License-Identifier: Apache-2.0 */
/* handshake.c - how a producer joins: HELLO, CHALLENGE / AUTH when a secret
 * is set, WELCOME, and the plan exchange that defines the run; the resume
 * state read at create. The network thread (see handshake_int.h). */
#include "consumer_int.h"
#include "options_int.h"
#include "hs_status.h"
#include "hs_log.h"
#include "hs_time.h"
#include "hs_plan_hash.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PEER_MAX_PREFETCH 64u

/* The first epoch with a batch still to deliver, as told to producers. */
static uint32_t resume_start_epoch(hs_consumer_t *c)
{
    if (c->run.resume_given) return hs_state_epochs_done(c->run.resume);
    return c->journal && c->run.have_run ? hs_journal_start_epoch(c->journal) : 0;
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
    w.prefetch_per_worker = p->prefetch;
    w.start_epoch = resume_start_epoch(c);
    w.consumer_name = c->name;
    w.instance_id = c->instance_id;
    w.started_unix_ms = c->started_unix_ms;
    double lease_ms = c->cfg.lease_timeout_s * 1000.0;
    w.lease_timeout_ms = lease_ms >= (double)UINT32_MAX ? UINT32_MAX : (uint32_t)lease_ms;
    if (c->have_secret) {
        if (hs_auth_consumer_mac(&c->key, p->client_nonce, p->server_nonce, mac) != HS_OK) {
            hs__peer_drop(c, p, HS_ERR_AUTH, "libsodium could not compute the consumer's proof");
            return;
        }
        w.server_mac.data = mac;
        w.server_mac.len = sizeof(mac);
    }
    hs__peer_send_msg(c, p, HS_MSG_WELCOME, &w.base);
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
        hs__peer_drop(c, p, HS_ERR_NOMEM, "out of memory");
        return;
    }
    pp->sender = p->id;
    pp->offer = p->offer;
    pp->t_page = hs_now_s();
    c->run.pending = pp;
    send_welcome(c, p, true);
}

/* Here, beside most of its callers: a plan, store or resume state this
 * consumer cannot run with. */
void hs__consumer_fatal(hs_consumer_t *c, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->fatal, sizeof(c->fatal), fmt, ap);
    va_end(ap);
    hs_error("%s", c->fatal);
    c->stop = true;
}

/* Discards the pending plan whole: its sender left before it was complete. */
void hs__plan_discard(hs_consumer_t *c)
{
    if (!c->run.pending) return;
    free(c->run.pending->n_seqs);
    free(c->run.pending->n_tokens);
    free(c->run.pending);
    c->run.pending = NULL;
}

/* The pending plan's sender is gone: the longest-waiting admitted peer
 * sends its own plan from the start. With none, the next peer admitted does. */
void hs__plan_restart(hs_consumer_t *c)
{
    hs__plan_discard(c);
    peer_t *next = NULL;
    for (peer_t *q = c->net.peers; q; q = q->next)
        if (q->state == PEER_WAIT_PLAN && q->conn && !q->dropped && (!next || q->id < next->id))
            next = q;
    if (next) plan_start(c, next);
}

/* A peer's offer against the run: true when it may join; otherwise it is
 * dropped with both sides' values and what to change. */
static bool offer_matches_run(hs_consumer_t *c, peer_t *p)
{
    const run_offer_t *o = &p->offer;
    if (hs_layout_id(&o->layout) != hs_layout_id(&c->run.layout)) {
        char mine[160], theirs[160];
        hs_layout_describe(&c->run.layout, mine, sizeof(mine));
        hs_layout_describe(&o->layout, theirs, sizeof(theirs));
        hs__peer_drop(c, p, HS_ERR_MISMATCH,
                      "layout mismatch: this run carries %s, producer offers %s; start every "
                      "producer with the same --hidden-size and --layers",
                      mine, theirs);
        return false;
    }
    if (o->target_fingerprint != c->run.target_fingerprint) {
        hs__peer_drop(c, p, HS_ERR_MISMATCH,
                      "target mismatch: this run's states are of target %016llx (%.200s), the "
                      "producer's of %016llx (%.200s); give every producer the same model "
                      "(config and weights), or start another run (and --store) for that one",
                      (unsigned long long)c->run.target_fingerprint, c->run.target_name,
                      (unsigned long long)o->target_fingerprint, o->model);
        return false;
    }
    if (o->plan_hash != c->run.plan_hash || o->n_batches != c->run.n_batches) {
        hs__peer_drop(c, p, HS_ERR_MISMATCH,
                      "plan mismatch: this run's plan hash is %016llx (%u batches), producer's is "
                      "%016llx (%u batches); give every producer the same --data, "
                      "--token-budget, --max-seq-len and --seed",
                      (unsigned long long)c->run.plan_hash, c->run.n_batches,
                      (unsigned long long)o->plan_hash, o->n_batches);
        return false;
    }
    return true;
}

/* A hash as hs-data prints it: 1..16 hex digits, "0x" allowed. */
static bool parse_hash(const char *s, uint64_t *out)
{
    if (s[0] == '0' && (s[1] == 'x' || s[1] == 'X')) s += 2;
    size_t n = strlen(s);
    if (n == 0 || n > 16 || strspn(s, "0123456789abcdefABCDEF") != n) return false;
    *out = strtoull(s, NULL, 16);
    return true;
}

hs_status_t hs__expect_parse(const hs_consumer_config_t *cfg, hs__run_expect_t *out)
{
    memset(out, 0, sizeof(*out));
    if (cfg->expect_plan && !(out->plan = parse_hash(cfg->expect_plan, &out->plan_hash))) {
        hs_error("consumer: --expect-plan '%s': expected the plan hash hs-data plan prints, 16 "
                 "hex digits such as 3f2a9c0d5e6b7a81",
                 cfg->expect_plan);
        return HS_ERR_INVALID;
    }
    if (cfg->expect_dataset &&
        !(out->dataset = parse_hash(cfg->expect_dataset, &out->dataset_fingerprint))) {
        hs_error("consumer: --expect-dataset '%s': expected the dataset fingerprint hs-data plan "
                 "(or hs-data info) prints, 16 hex digits such as 9d41c07be2f35a10",
                 cfg->expect_dataset);
        return HS_ERR_INVALID;
    }
    if (cfg->expect_target &&
        !(out->target = parse_hash(cfg->expect_target, &out->target_fingerprint))) {
        hs_error("consumer: --expect-target '%s': expected the target fingerprint a producer "
                 "logs (\"target DIR: fingerprint ...\"), 16 hex digits such as 5d0c3e8a91f2b746",
                 cfg->expect_target);
        return HS_ERR_INVALID;
    }
    if (cfg->expect_layout) {
        char why[160];
        if (hs_layout_parse(cfg->expect_layout, &out->layout_v, why, sizeof(why)) != HS_OK) {
            hs_error("consumer: --expect-layout '%s': %s", cfg->expect_layout, why);
            return HS_ERR_INVALID;
        }
        out->layout = true;
    }
    return HS_OK;
}

/* A peer's offer against the run the configuration pins: true when it may
 * go on; otherwise it is dropped naming each value that differs and the one
 * expected. The run itself is not touched: the consumer waits for others. */
static bool offer_matches_expect(hs_consumer_t *c, peer_t *p)
{
    const hs__run_expect_t *e = &c->expect;
    const run_offer_t *o = &p->offer;
    char why[900];
    size_t n = 0;
    why[0] = 0;
    if (e->dataset && o->dataset_fingerprint != e->dataset_fingerprint)
        n += (size_t)snprintf(why + n, sizeof(why) - n,
                              "%sits dataset fingerprint is %016llx, expected %016llx "
                              "(--expect-dataset): give it the dataset the run was planned on",
                              n ? "; " : "", (unsigned long long)o->dataset_fingerprint,
                              (unsigned long long)e->dataset_fingerprint);
    if (e->plan && o->plan_hash != e->plan_hash && n < sizeof(why))
        n += (size_t)snprintf(why + n, sizeof(why) - n,
                              "%sits plan hash is %016llx, expected %016llx (--expect-plan): give "
                              "it the --data, --token-budget, --max-seq-len, --overflow and "
                              "--seed hs-data plan was given",
                              n ? "; " : "", (unsigned long long)o->plan_hash,
                              (unsigned long long)e->plan_hash);
    if (e->target && o->target_fingerprint != e->target_fingerprint && n < sizeof(why))
        n += (size_t)snprintf(why + n, sizeof(why) - n,
                              "%sits target is %016llx (%.200s), expected %016llx "
                              "(--expect-target): start it with the model the run is pinned to",
                              n ? "; " : "", (unsigned long long)o->target_fingerprint, o->model,
                              (unsigned long long)e->target_fingerprint);
    if (e->layout && hs_layout_id(&o->layout) != hs_layout_id(&e->layout_v) && n < sizeof(why)) {
        char mine[160], theirs[160];
        hs_layout_spec(&e->layout_v, mine, sizeof(mine));
        hs_layout_spec(&o->layout, theirs, sizeof(theirs));
        n += (size_t)snprintf(why + n, sizeof(why) - n,
                              "%sits layout is %s, expected %s (--expect-layout): start it with "
                              "that --hidden-size and --layers",
                              n ? "; " : "", theirs, mine);
    }
    if (!n) return true;
    hs__peer_drop(c, p, HS_ERR_MISMATCH, "producer refused, not the run this consumer expects: %s",
                  why);
    return false;
}

/* After HELLO (and AUTH, when a secret is set): join the run, or, before
 * there is one, send a plan or wait for the one being sent. A run exists only
 * once a plan is complete and checked (plan_complete); until then no offer
 * is preferred over another and nothing is written to the journal. Only an
 * authenticated peer gets here, and nothing about the run is told to a peer
 * before it is authenticated. */
static void peer_admit(hs_consumer_t *c, peer_t *p)
{
    if (hs_tp_conn_set_max_frame(p->conn, 0) != HS_OK) { /* the protocol's full frame limit */
        hs__peer_drop(c, p, HS_ERR_INVALID, "the frame limit could not be raised");
        return;
    }
    hs_tp_conn_set_trusted(p->conn); /* a producer on this host may share its ring now */
    hs__peer_count_transport(c, p);
    if (!offer_matches_expect(c, p)) return;
    if (c->store) {
        const run_offer_t *o = &p->offer;
        char why[900];
        if (hs_store_check(c->store, o->dataset_fingerprint, &o->layout, o->plan_hash, o->n_batches,
                           o->target_fingerprint, o->model, why, sizeof(why)) != HS_OK) {
            hs__peer_drop(c, p, HS_ERR_MISMATCH, "producer refused, not the run of the store: %s",
                          why);
            return;
        }
    }
    if (c->run.have_run) {
        if (offer_matches_run(c, p)) send_welcome(c, p, false);
        return;
    }
    char why[512];
    /* A resume state decides the plan, else a journal of an earlier run;
     * reading either writes nothing. */
    if (hs_state_check_plan(c->run.resume, p->offer.plan_hash, p->offer.n_batches, why,
                            sizeof(why)) != HS_OK) {
        hs__peer_drop(c, p, HS_ERR_MISMATCH, "%s", why);
        return;
    }
    if (c->journal) {
        hs_status_t st =
            hs_journal_check(c->journal, p->offer.plan_hash, p->offer.n_batches, why, sizeof(why));
        if (st != HS_OK) {
            hs__peer_drop(c, p, st, "%s", why);
            return;
        }
    }
    if (!c->run.pending)
        plan_start(c, p);
    else
        p->state = PEER_WAIT_PLAN; /* WELCOME, or a mismatch, once the plan is complete */
}

/* Producers past their HELLO on a live connection, p aside. */
static uint32_t producers_admitted(const hs_consumer_t *c, const peer_t *p)
{
    uint32_t n = 0;
    for (const peer_t *q = c->net.peers; q; q = q->next)
        n += q != p && q->conn && q->state != PEER_NEW && q->state != PEER_GONE;
    return n;
}

void hs__on_hello(hs_consumer_t *c, peer_t *p, const uint8_t *body, uint32_t len)
{
    char why[256];
    ProtobufCMessage *m;
    if (p->state != PEER_NEW) {
        hs__peer_drop(c, p, HS_ERR_PROTO, "HELLO sent twice");
        return;
    }
    if (!(m = hs__peer_unpack(c, p, HS_MSG_HELLO, body, len))) return;
    Hsflow__Hello *h = (Hsflow__Hello *)m;
    run_offer_t *o = &p->offer;
    snprintf(p->name, sizeof(p->name), "%s (%s)", h->producer_name, hs_tp_conn_peer(p->conn));
    if (h->version != HS_PROTO_VERSION) {
        hs__peer_drop(c, p, HS_ERR_MISMATCH, "producer speaks protocol version %u, consumer %u",
                      h->version, HS_PROTO_VERSION);
        goto out;
    }
    uint32_t max_producers = hs__consumer_option_u32(&c->cfg, "max_producers");
    if (max_producers && producers_admitted(c, p) >= max_producers) {
        hs__peer_drop(c, p, HS_ERR_BUSY,
                      "producer refused: this consumer takes at most %u at once "
                      "(--max-producers); stop another producer or raise --max-producers",
                      max_producers);
        goto out;
    }
    if (hs_layout_from_msg(h->layout, &o->layout, why, sizeof(why)) != HS_OK) {
        hs__peer_drop(c, p, HS_ERR_FORMAT, "bad layout in HELLO: %s", why);
        goto out;
    }
    o->plan_hash = h->plan_hash;
    o->plan_basis = h->plan_basis;
    o->target_fingerprint = h->target_fingerprint;
    o->dataset_fingerprint = h->dataset_fingerprint;
    o->n_batches = h->n_batches; /* 1..HS_PLAN_MAX_BATCHES (hs_msg_unpack) */
    o->seed = h->seed;
    o->token_budget = h->token_budget;
    snprintf(o->model, sizeof(o->model), "%s", h->target_name ? h->target_name : "");
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
            hs__peer_drop(c, p, HS_ERR_NOMEM, "out of memory");
            goto out;
        }
        memcpy(p->hello_body, body, len);
        p->hello_len = len;
        if (hs_auth_nonce(p->server_nonce) != HS_OK) {
            hs__peer_drop(c, p, HS_ERR_AUTH, "libsodium could not draw the challenge's nonce");
            goto out;
        }
        Hsflow__Challenge ch = HSFLOW__CHALLENGE__INIT;
        ch.server_nonce.data = p->server_nonce;
        ch.server_nonce.len = HS_AUTH_NONCE_BYTES;
        hs__peer_send_msg(c, p, HS_MSG_CHALLENGE, &ch.base);
        p->state = PEER_AUTH;
    } else {
        peer_admit(c, p);
    }
out:
    hs_msg_free(m);
}

void hs__on_auth(hs_consumer_t *c, peer_t *p, const uint8_t *body, uint32_t len)
{
    ProtobufCMessage *m;
    if (p->state != PEER_AUTH) {
        hs__peer_drop(c, p, HS_ERR_PROTO, "AUTH without a CHALLENGE");
        return;
    }
    if (!(m = hs__peer_unpack(c, p, HS_MSG_AUTH, body, len))) return;
    Hsflow__Auth *a = (Hsflow__Auth *)m;
    uint8_t expect[HS_AUTH_MAC_BYTES];
    if (hs_auth_producer_mac(&c->key, p->server_nonce, p->client_nonce, p->hello_body, p->hello_len,
                             expect) != HS_OK ||
        a->mac.len != HS_AUTH_MAC_BYTES || hs_auth_verify(a->mac.data, expect) != HS_OK)
        hs__peer_drop(c, p, HS_ERR_AUTH,
                      "authentication failed: the producer's --secret-file differs from the "
                      "consumer's");
    else
        peer_admit(c, p);
    hs_msg_free(m);
}

/* Adds the batches the journal recorded as released to the position. */
static void position_add_journal(hs_consumer_t *c, hs_state_t *pos)
{
    uint32_t start = hs_journal_start_epoch(c->journal), n = c->run.n_batches;
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
    pending_plan_t *pp = c->run.pending;
    const run_offer_t *o = &pp->offer;
    uint32_t n = o->n_batches;
    uint64_t max_bytes = 0, min_bytes = UINT64_MAX, tokens = 0;
    uint64_t *bytes = malloc((size_t)n * sizeof(uint64_t));
    if (!bytes) {
        hs__consumer_fatal(c, "out of memory for a plan of %u batches", n);
        return;
    }
    for (uint32_t b = 0; b < n; b++) {
        bytes[b] = hs_batch_bytes(pp->n_seqs[b], pp->n_tokens[b], &o->layout);
        if (bytes[b] > max_bytes) max_bytes = bytes[b];
        if (bytes[b] < min_bytes) min_bytes = bytes[b];
        tokens += pp->n_tokens[b];
    }
    if (max_bytes > hs_cache_capacity(c->cache)) {
        hs__consumer_fatal(c,
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
            hs__consumer_fatal(c, "%s", why);
            free(bytes);
            return;
        }
    }
    c->run.layout = o->layout;
    c->run.plan_hash = o->plan_hash;
    c->run.n_batches = n;
    c->run.seed = o->seed;
    c->run.token_budget = o->token_budget;
    c->run.tokens_per_epoch = tokens;
    c->run.target_fingerprint = o->target_fingerprint;
    snprintf(c->run.target_name, sizeof(c->run.target_name), "%s", o->model);
    c->run.have_run = true;
    char desc[160], by[1100];
    hs_layout_describe(&c->run.layout, desc, sizeof(desc));
    peer_t *sender = hs__peer_find(c, pp->sender);
    if (sender)
        snprintf(by, sizeof(by), "%s", sender->name);
    else if (pp->sender == 0 && c->store)
        snprintf(by, sizeof(by), "the store %s", hs_store_dir(c->store));
    else
        snprintf(by, sizeof(by), "a producer");
    hs_info("run defined by %s: %s, plan %016llx, %u batches/epoch, budget %u tokens", by, desc,
            (unsigned long long)c->run.plan_hash, c->run.n_batches, c->run.token_budget);
    hs_info("run target: %016llx (%s)%s", (unsigned long long)c->run.target_fingerprint,
            c->run.target_name,
            pp->sender == 0 ? ": the states the store holds were computed by it" : "");
    if (c->store) {
        hs_store_run_t sr = {.dataset_fingerprint = o->dataset_fingerprint,
                             .plan_hash = o->plan_hash,
                             .plan_basis = o->plan_basis,
                             .target_fingerprint = o->target_fingerprint,
                             .seed = o->seed,
                             .layout = o->layout,
                             .n_batches = n,
                             .token_budget = o->token_budget,
                             .n_seqs = pp->n_seqs,
                             .n_tokens = pp->n_tokens};
        snprintf(sr.model, sizeof(sr.model), "%s", o->model);
        /* the writer holds at most a quarter of the cache */
        if (hs_store_bind(c->store, &sr, hs_cache_base(c->cache), hs_cache_capacity(c->cache) / 4,
                          hs__store_slot_free, c) != HS_OK) {
            hs__consumer_fatal(c, "out of memory binding the store to a plan of %u batches", n);
            free(bytes);
            return;
        }
    }

    hs_sched_config_t sc = {0};
    sc.n_batches = n;
    sc.bytes = bytes;
    sc.n_seqs = pp->n_seqs;
    sc.n_tokens = pp->n_tokens;
    sc.epochs = c->cfg.epochs;
    sc.seed = c->run.seed;
    sc.order = c->cfg.order == HS_ORDER_PLAN ? HS_SCHED_PLAN : HS_SCHED_ARRIVAL;
    sc.rank = c->cfg.rank;
    sc.world = c->cfg.world;
    sc.uneven = (hs_shard_uneven_t)c->cfg.uneven;
    /* Every item alive in the scheduler holds a cache slot: no more than the
     * cache holds of the smallest batch are alive at once, so its tables are
     * planned for that many now (up to HS_SCHED_LIVE_PLAN_MAX) and the data
     * path does not grow them. */
    uint64_t min_slot = (min_bytes + HS_CACHE_SLOT_ALIGN - 1) / HS_CACHE_SLOT_ALIGN;
    uint64_t live = hs_cache_capacity(c->cache) / (min_slot * HS_CACHE_SLOT_ALIGN);
    sc.live_plan = live < HS_SCHED_LIVE_PLAN_MAX ? (uint32_t)live : HS_SCHED_LIVE_PLAN_MAX;
    /* What to skip: the resume state when one was given (it follows the
     * trainer's checkpoint, so it wins over the journal, which is rewritten
     * to match it), else the journal's released batches, else nothing. */
    hs_state_t *pos = NULL;
    hs_status_t st = hs_state_bind(c->run.resume, c->run.plan_hash, n, c->cfg.epochs,
                                   (hs_state_order_t)c->cfg.order, &pos);
    if (st == HS_OK && !c->run.resume_given && c->journal) position_add_journal(c, pos);
    uint8_t *skip = st == HS_OK ? hs_state_done_bits(pos) : NULL;
    if (!skip) {
        hs__consumer_fatal(c, "resume state: %s", hs_status_str(st ? st : HS_ERR_NOMEM));
        hs_state_destroy(pos);
        free(bytes);
        return;
    }
    if (c->run.resume_given && c->journal && (st = hs_journal_rewrite(c->journal, pos)) != HS_OK) {
        /* a journal left as it was would name batches the state says are to come */
        hs__consumer_fatal(c,
                           "journal: could not rewrite it to the resume state's batches (%s); "
                           "give a writable --journal, or none",
                           hs_status_str(st));
        hs_state_destroy(pos);
        free(bytes);
        return;
    }
    sc.start_epoch = hs_state_epochs_done(pos);
    sc.resume_done = skip;
    uint64_t resumed = hs_state_delivered(pos);
    const char *from = c->run.resume_given ? "the resume state" : "the journal";
    pthread_mutex_lock(&c->delivery.lock);
    c->delivery.position = pos;
    pthread_mutex_unlock(&c->delivery.lock);
    if (sc.start_epoch >= sc.epochs) {
        hs_info("%s says every batch of the %u epoch(s) was already delivered: nothing left to do",
                from, sc.epochs);
    } else {
        if (resumed)
            hs_info("resuming from %s: epoch %u, %llu batch(es) already delivered", from,
                    sc.start_epoch, (unsigned long long)resumed);
        st = hs_sched_create(&sc, &c->net.sched); /* copies the plan arrays */
    }
    free(skip);
    free(bytes);
    hs__plan_discard(c);
    if (st != HS_OK) {
        hs__consumer_fatal(c, "scheduler: %s", hs_status_str(st));
        return;
    }
    if (!c->net.sched) { /* everything was delivered before */
        pthread_mutex_lock(&c->delivery.lock);
        c->delivery.batches_resumed = resumed;
        c->delivery.t_start = hs_now_s();
        c->delivery.finished = true;
        pthread_mutex_unlock(&c->delivery.lock);
        pthread_cond_broadcast(&c->delivery.cond);
        c->net.all_queued = true;
        for (peer_t *p = c->net.peers; p; p = p->next) {
            Hsflow__Bye b = HSFLOW__BYE__INIT;
            b.reason = "the run is over (resumed)";
            hs__peer_send_msg(c, p, HS_MSG_BYE, &b.base);
        }
        return;
    }
    /* The delivery queues and the cache's slot table likewise; should
     * either fail (logged) it grows when needed instead. */
    if (hs__delivery_plan(c, sc.live_plan) != HS_OK ||
        hs_cache_plan_slots(c->cache, sc.live_plan) != HS_OK)
        hs_warn("consumer: tables for %u live batches could not be planned; they grow as needed",
                sc.live_plan);
    pthread_mutex_lock(&c->delivery.lock);
    c->delivery.max_batch_bytes = max_bytes;
    hs_sched_stats_t ss;
    hs_sched_stats(c->net.sched, &ss);
    c->delivery.batches_planned = ss.planned;
    c->delivery.batches_resumed = resumed;
    c->delivery.t_start = hs_now_s();
    pthread_mutex_unlock(&c->delivery.lock);
    hs_info("plan complete: %u batches/epoch x %u epochs, %.1f MiB max batch, %llu tokens/epoch",
            c->run.n_batches, c->cfg.epochs, (double)max_bytes / (1 << 20),
            (unsigned long long)c->run.tokens_per_epoch);
    if (c->cfg.world > 1)
        hs_info("rank %u of %u: %u batches per epoch (%s: %u skipped, %u repeated per epoch "
                "across the ranks)",
                c->cfg.rank, c->cfg.world, ss.per_epoch,
                hs_shard_uneven_str((hs_shard_uneven_t)c->cfg.uneven), ss.skipped, ss.repeated);
    for (peer_t *p = c->net.peers; p; p = p->next) {
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

void hs__run_from_store(hs_consumer_t *c)
{
    const hs_store_run_t *r = hs_store_run(c->store);
    char why[512];
    if (hs_state_check_plan(c->run.resume, r->plan_hash, r->n_batches, why, sizeof(why)) != HS_OK ||
        (c->journal &&
         hs_journal_check(c->journal, r->plan_hash, r->n_batches, why, sizeof(why)) != HS_OK)) {
        hs__consumer_fatal(c, "store %s: %s", hs_store_dir(c->store), why);
        return;
    }
    pending_plan_t *pp = calloc(1, sizeof(*pp));
    if (pp) {
        pp->n_seqs = malloc(4ull * r->n_batches);
        pp->n_tokens = malloc(4ull * r->n_batches);
    }
    if (!pp || !pp->n_seqs || !pp->n_tokens) {
        if (pp) {
            free(pp->n_seqs);
            free(pp->n_tokens);
        }
        free(pp);
        hs__consumer_fatal(c, "out of memory for the store's plan of %u batches", r->n_batches);
        return;
    }
    memcpy(pp->n_seqs, r->n_seqs, 4ull * r->n_batches);
    memcpy(pp->n_tokens, r->n_tokens, 4ull * r->n_batches);
    pp->sender = 0; /* no peer */
    pp->received = pp->cap = r->n_batches;
    pp->offer = (run_offer_t){.layout = r->layout,
                              .plan_hash = r->plan_hash,
                              .plan_basis = r->plan_basis,
                              .target_fingerprint = r->target_fingerprint,
                              .seed = r->seed,
                              .dataset_fingerprint = r->dataset_fingerprint,
                              .n_batches = r->n_batches,
                              .token_budget = r->token_budget};
    snprintf(pp->offer.model, sizeof(pp->offer.model), "%s", r->model);
    pp->t_page = hs_now_s();
    c->run.pending = pp;
    plan_complete(c);
}

/* The pending plan's shapes, all in, against the plan hash its sender
 * offered (and a pin holds): a sender whose pages do not hash to it is
 * dropped, and the next producer waiting sends its own plan. */
static bool plan_shapes_proven(hs_consumer_t *c, peer_t *p)
{
    const pending_plan_t *pp = c->run.pending;
    uint64_t got = hs_plan_hash_of(pp->offer.plan_basis, pp->received, pp->n_seqs, pp->n_tokens);
    if (got == pp->offer.plan_hash) return true;
    hs__peer_drop(c, p, HS_ERR_PROTO,
                  "its PLAN pages are not the plan of its plan hash %016llx (the shapes hash to "
                  "%016llx): its batch shapes are false; run it with this hsflow release and "
                  "its data unchanged",
                  (unsigned long long)pp->offer.plan_hash, (unsigned long long)got);
    return false;
}

void hs__on_plan(hs_consumer_t *c, peer_t *p, const uint8_t *body, uint32_t len)
{
    ProtobufCMessage *m;
    pending_plan_t *pp = c->run.pending;
    if (p->state != PEER_SENDING_PLAN || !pp || pp->sender != p->id) {
        hs__peer_drop(c, p, HS_ERR_PROTO, "PLAN page without being asked for the plan");
        return;
    }
    if (!(m = hs__peer_unpack(c, p, HS_MSG_PLAN, body, len))) return;
    Hsflow__Plan *pl = (Hsflow__Plan *)m;
    uint32_t n = pp->offer.n_batches;
    if (pl->first_batch != pp->received || pl->n_n_seqs > n - pp->received) {
        hs__peer_drop(c, p, HS_ERR_PROTO,
                      "PLAN page for batches %u..%zu, expected to start at %u of %u",
                      pl->first_batch, pl->first_batch + pl->n_n_seqs, pp->received, n);
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
            hs__peer_drop(c, p, HS_ERR_NOMEM, "out of memory for a plan of %u batches", n);
            goto out;
        }
        pp->cap = ncap;
    }
    for (size_t i = 0; i < pl->n_n_seqs; i++) {
        uint32_t ns = pl->n_seqs[i], nt = pl->n_tokens[i];
        if (ns == 0 || nt < ns || nt > pp->offer.token_budget) {
            hs__peer_drop(c, p, HS_ERR_FORMAT,
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
        hs__peer_drop(c, p, HS_ERR_PROTO, "PLAN ended at %u of %u batches", pp->received, n);
        goto out;
    }
    if (pl->last && plan_shapes_proven(c, p)) plan_complete(c);
out:
    hs_msg_free(m);
}

/* A peer that connects and never finishes the handshake would hold its
 * connection forever: cut it off after handshake_timeout_s (configured,
 * default 15 s). */
void hs__handshake_expire(hs_consumer_t *c, double now)
{
    /* The same bound for the plan exchange, page by page: a producer asked
     * for the plan that stops sending it would keep every other one waiting. */
    peer_t *sender = c->run.pending ? hs__peer_find(c, c->run.pending->sender) : NULL;
    if (sender && now - c->run.pending->t_page > c->handshake_timeout_s)
        hs__peer_drop(c, sender, HS_ERR_TIMEOUT,
                      "no PLAN page within %.0f s (%u of %u batches received); another producer "
                      "sends the plan",
                      c->handshake_timeout_s, c->run.pending->received,
                      c->run.pending->offer.n_batches);
    for (peer_t *p = c->net.peers; p; p = p->next)
        if (p->conn && !p->bye_sent && !p->dropped &&
            (p->state == PEER_NEW || p->state == PEER_AUTH) &&
            now - p->t_accept > c->handshake_timeout_s)
            hs__peer_drop(c, p, HS_ERR_TIMEOUT, "no complete handshake within %.0f s",
                          c->handshake_timeout_s);
}

/* The resume state of the config (checked against the run's epochs and
 * order now, against the plan when a producer offers one), else an empty
 * state. */
hs_status_t hs__resume_load(hs_consumer_t *c, const hs_consumer_config_t *cfg)
{
    hs_state_order_t order = (hs_state_order_t)cfg->order;
    if (!cfg->resume_state) {
        hs_status_t st = hs_state_create_empty(cfg->epochs, order, &c->run.resume);
        if (st == HS_OK) hs_state_set_shard(c->run.resume, cfg->rank, cfg->world, cfg->uneven);
        return st;
    }
    char why[512];
    size_t len = strnlen(cfg->resume_state, (size_t)HS_STATE_MAX_BYTES + 1);
    hs_status_t st = hs_state_decode(cfg->resume_state, len, &c->run.resume, why, sizeof(why));
    if (st == HS_OK) {
        st = hs_state_check_run(c->run.resume, cfg->epochs, order, why, sizeof(why));
        if (st == HS_OK)
            st = hs_state_check_shard(c->run.resume, cfg->rank, cfg->world, cfg->uneven, why,
                                      sizeof(why));
        if (st == HS_OK) hs_state_set_shard(c->run.resume, cfg->rank, cfg->world, cfg->uneven);
        if (st != HS_OK) {
            hs_state_destroy(c->run.resume);
            c->run.resume = NULL;
        }
    }
    if (st != HS_OK) {
        if (st == HS_ERR_NOMEM)
            hs_error("consumer: out of memory reading the resume state");
        else
            hs_error("consumer: %s", why);
        return st;
    }
    c->run.resume_given = true;
    if (hs_state_has_plan(c->run.resume))
        hs_info("resume state: plan %016llx, %llu batch(es) delivered before, from epoch %u",
                (unsigned long long)hs_state_plan_hash(c->run.resume),
                (unsigned long long)hs_state_delivered(c->run.resume),
                hs_state_epochs_done(c->run.resume));
    else
        hs_info("resume state saved before the plan was known: nothing to skip");
    return HS_OK;
}
