/* SPDX-License-Identifier: Apache-2.0 */
/* producer.c - the producer engine (DESIGN §2, §5).
 *
 * The calling thread runs the network loop: handshake, PLAN pages, TICKETs
 * in, DONE + payload out. One worker thread per device takes tickets from a
 * shared queue, fills one of its two staging buffers (ids, mask, cu_seqlens,
 * hidden states, header, checksum) and hands it to the network thread, which
 * sends it straight from that buffer and gives it back when the send
 * completes. So worker k computes batch n+1 while batch n is on the wire.
 *
 * The producer may feed several consumers, the ranks of a data-parallel
 * trainer (DESIGN §11): one link per consumer address, each with its own
 * handshake and tickets, all tickets in the one queue the workers take
 * from. A rank that frees its cache slower issues fewer tickets, so it
 * simply holds fewer of this producer's batches in flight. A finished
 * batch goes back on the link its ticket came from. */
#include "hs_producer.h"
#include "hsflow.h"

#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "dataset_int.h"
#include "plan_int.h"
#include "hs_transport.h"
#include "hs_model.h"
#include "gpu_worker_int.h"

#define STAGING_PER_WORKER 2

typedef struct ticket {
    struct ticket *next;
    uint64_t id;
    uint32_t epoch, batch, n_seqs, n_tokens;
    uint64_t bytes;
    uint32_t gen;  /* connection generation the ticket came from */
    uint32_t link; /* the consumer (link index) that issued it */
} ticket_t;

typedef struct hs_producer producer_t;

/* One consumer this producer feeds: its connection and handshake. Touched by
 * the network thread only (gen also under pr->lock, see reconnect). */
typedef struct link {
    producer_t *pr;
    uint32_t index;
    char host[256];
    uint16_t port;
    hs_tp_conn_t *conn;
    bool done;     /* this consumer said BYE, refused us or is gone for good */
    bool welcomed; /* handshake complete: tickets may come */
    bool lost;     /* connection gone, --reconnect pending */
    double t_lost; /* when it was lost (reconnect gives up connect_timeout_s later) */
    double t_try;  /* the last reconnect try */
    uint32_t gen;  /* connection generation, see ticket_t */
    uint8_t client_nonce[HS_AUTH_NONCE_BYTES];
    uint8_t server_nonce[HS_AUTH_NONCE_BYTES];
    uint8_t *hello_body; /* the HELLO body as sent, for the AUTH proof */
    size_t hello_len;
    char consumer_name[256];
    uint32_t rank, world; /* from WELCOME (world 0 before it) */
} link_t;

typedef struct staging {
    uint8_t *buf;
    bool busy;     /* filled and waiting for / on the wire */
    double t_send; /* when it was handed to the transport (trace timing) */
    uint32_t gen;  /* external source: generation of the ticket it holds */
    uint32_t link; /* external source: link of the ticket it holds */
    struct worker *owner;
} staging_t;

typedef struct worker {
    producer_t *pr;
    uint32_t index;
    int gpu; /* -1 = CPU */
    pthread_t thread;
    staging_t staging[STAGING_PER_WORKER];
    /* figures, under pr->lock */
    uint64_t batches, tokens, bytes;
    double busy_s, stall_s;
    double t_taken; /* external source: when the caller took its batch */
    /* progress, for the heartbeat (under pr->lock): when it last took,
     * launched or finished a batch, and whether it holds one now */
    double t_progress;
    bool computing;
    /* CPU workers: the thread's CPU clock, read by the network thread; a
     * worker inside a long forward still computes when it advances */
    clockid_t cpu_clock;
    bool has_cpu_clock;
    uint64_t cpu_ns_seen;
    hs_checksum_stream_t *checksum; /* scratch for sealing */
    hs__gpu_worker_t *gpu_w;        /* GPU model worker, or NULL */
} worker_t;

typedef struct outgoing {
    struct outgoing *next;
    ticket_t t;
    staging_t *st;
    uint32_t worker;
    uint64_t checksum, compute_ns;
} outgoing_t;

struct hs_producer {
    const hs_producer_config_t *cfg; /* = &config, completed from the model */
    hs_producer_config_t config;
    hs_dataset_t *ds;
    hs_plan_t *plan;
    hs_model_t *model;
    uint64_t max_batch_bytes;
    uint32_t max_batch_seqs;
    hs_auth_key_t key;
    bool have_secret;

    hs_tp_t *tp;
    hs_msg_arena_t ticket_arena; /* the network thread decodes every TICKET here */
    link_t links[HS_PRODUCER_MAX_LINKS];
    uint32_t n_links;
    hs_producer_addrs_t addrs; /* the library API's parsed 'to' */
    uint8_t *frame_buf;
    hs_status_t result;
    bool done; /* every link is done, or a local failure */

    pthread_mutex_t lock;
    pthread_cond_t cond; /* tickets arrived / staging freed / stop */
    ticket_t *tickets, *tickets_tail;
    outgoing_t *outbox; /* filled batches for the network thread */
    bool stop;
    bool net_done;                /* the network loop has ended */
    _Atomic bool close_requested; /* hs_producer_close() before the end */
    bool stopping;                /* cfg->stop_requested seen: draining, see begin_stop */
    link_t *connecting;           /* the link inside hs_tp_connect, see link_connect */
    double t_stop;
    uint32_t tickets_returned; /* dropped while stopping: the consumer reissues them */
    bool net_started;
    pthread_t net_thread;
    double t_start;
    double heartbeat_s;  /* STATS interval: a quarter of the consumer's lease timeout */
    double t_beat;       /* when the last STATS went */
    uint32_t epochs;     /* of the run, from WELCOME; lock */
    uint32_t epoch_seen; /* 0-based epoch of the latest ticket; lock */

    worker_t workers[HS_PRODUCER_MAX_WORKERS];
};

/* ---- workers ---------------------------------------------------------------- */

/* Writes the batch of ticket t into region: metadata from the plan, hidden
 * states from the source, then the header and checksum. */
static hs_status_t fill_batch(producer_t *pr, worker_t *w, const ticket_t *t, uint8_t *region)
{
    const hs_layout_t *layout = &pr->cfg->layout;
    hs_batch_view_t v = hs_batch_view(region, t->n_seqs, t->n_tokens, layout);
    hs_batch_header_init(v.header, t->epoch, t->batch, t->n_seqs, t->n_tokens, layout,
                         hs_plan_hash(pr->plan));
    hs_status_t st = hs_plan_fill_batch(pr->plan, pr->ds, t->batch, &v);
    if (st != HS_OK) return st;
    if (pr->cfg->source == HS_SOURCE_SYNTHETIC) {
        hs_batch_synth_fill_seal(&v, layout, t->bytes, w->checksum);
        return HS_OK;
    } else {
        st = hs_model_forward_cpu(pr->model, v.input_ids, v.cu_seqlens, (int)t->n_seqs,
                                  layout->layers, (int)layout->n_layers, v.hidden,
                                  HS_MODEL_OUT_BF16, hs_layout_token_bytes(layout) / 2);
        if (st != HS_OK) return st;
    }
    hs_batch_seal(region, t->bytes);
    (void)w;
    return HS_OK;
}

static void *worker_main(void *arg)
{
    worker_t *w = arg;
    producer_t *pr = w->pr;
    pthread_mutex_lock(&pr->lock);
    for (;;) {
        double t_wait = hs_now_s();
        staging_t *st = NULL;
        while (!pr->stop) {
            st = NULL;
            for (int i = 0; i < STAGING_PER_WORKER; i++)
                if (!w->staging[i].busy) st = &w->staging[i];
            if (pr->tickets && st) break;
            pthread_cond_wait(&pr->cond, &pr->lock);
        }
        if (pr->stop) break;
        ticket_t *t = pr->tickets;
        pr->tickets = t->next;
        if (!pr->tickets) pr->tickets_tail = NULL;
        st->busy = true;
        double t0 = hs_now_s();
        if (pr->t_start > 0) w->stall_s += t0 - (t_wait > pr->t_start ? t_wait : pr->t_start);
        w->computing = true;
        w->t_progress = t0;
        pthread_mutex_unlock(&pr->lock);

        hs_status_t rc = fill_batch(pr, w, t, st->buf);
        double t1 = hs_now_s();
        outgoing_t *o = calloc(1, sizeof(*o));

        pthread_mutex_lock(&pr->lock);
        w->busy_s += t1 - t0;
        w->computing = false;
        w->t_progress = t1;
        if (rc != HS_OK || !o) {
            hs_error("worker %u: batch %u/%u failed: %s", w->index, t->epoch, t->batch,
                     hs_status_str(rc != HS_OK ? rc : HS_ERR_NOMEM));
            pr->result = rc != HS_OK ? rc : HS_ERR_NOMEM;
            pr->stop = true;
            st->busy = false;
            free(o);
            free(t);
            pthread_cond_broadcast(&pr->cond);
            hs_tp_wakeup(pr->tp);
            break;
        }
        w->batches++;
        w->tokens += t->n_tokens;
        w->bytes += t->bytes;
        o->t = *t;
        o->st = st;
        o->worker = w->index;
        o->checksum = ((hs_batch_header_t *)st->buf)->checksum;
        o->compute_ns = (uint64_t)((t1 - t0) * 1e9);
        hs_trace("worker %u: batch %u/%u (%.1f MiB) filled in %.1f ms", w->index, t->epoch,
                 t->batch, (double)t->bytes / (1 << 20), 1e3 * (t1 - t0));
        o->next = pr->outbox;
        pr->outbox = o;
        free(t);
        hs_tp_wakeup(pr->tp);
    }
    pthread_mutex_unlock(&pr->lock);
    return NULL;
}

/* A batch whose forward and D2H are queued on the GPU. */
typedef struct {
    ticket_t *t;
    staging_t *st;
    int slot;
} inflight_t;

/* Waits for an in-flight batch's hidden states, seals it, hands it over. */
static hs_status_t gpu_finish(producer_t *pr, worker_t *w, inflight_t *f)
{
    double ms = 0;
    hs_status_t rc = hs__gpu_batch_wait(w->gpu_w, f->slot, &ms);
    if (rc == HS_OK) hs_batch_seal(f->st->buf, f->t->bytes);
    outgoing_t *o = rc == HS_OK ? calloc(1, sizeof(*o)) : NULL;
    pthread_mutex_lock(&pr->lock);
    if (!o) {
        hs_error("worker %u (gpu %d): batch %u/%u failed: %s", w->index, w->gpu, f->t->epoch,
                 f->t->batch, hs_status_str(rc != HS_OK ? rc : HS_ERR_NOMEM));
        pr->result = rc != HS_OK ? rc : HS_ERR_NOMEM;
        pr->stop = true;
        f->st->busy = false;
        pthread_cond_broadcast(&pr->cond);
        pthread_mutex_unlock(&pr->lock);
        hs_tp_wakeup(pr->tp);
        free(f->t);
        return HS_ERR_CUDA;
    }
    w->busy_s += ms * 1e-3; /* GPU busy: forward time from CUDA events */
    w->t_progress = hs_now_s();
    w->batches++;
    w->tokens += f->t->n_tokens;
    w->bytes += f->t->bytes;
    o->t = *f->t;
    o->st = f->st;
    o->worker = w->index;
    o->checksum = ((hs_batch_header_t *)f->st->buf)->checksum;
    o->compute_ns = (uint64_t)(ms * 1e6);
    o->next = pr->outbox;
    pr->outbox = o;
    pthread_mutex_unlock(&pr->lock);
    hs_trace("worker %u (gpu %d): batch %u/%u forward %.1f ms", w->index, w->gpu, f->t->epoch,
             f->t->batch, ms);
    free(f->t);
    hs_tp_wakeup(pr->tp);
    return HS_OK;
}

/* One GPU: launch batch k+1 before finishing batch k, so the forward of one
 * overlaps the D2H, checksum and send of the other. */
static void *gpu_worker_main(void *arg)
{
    worker_t *w = arg;
    producer_t *pr = w->pr;
    const hs_layout_t *layout = &pr->cfg->layout;
    inflight_t pending = {0};
    pthread_mutex_lock(&pr->lock);
    for (;;) {
        double t_wait = hs_now_s();
        int slot = -1;
        while (!pr->stop) {
            slot = -1;
            for (int i = 0; i < STAGING_PER_WORKER; i++)
                if (!w->staging[i].busy) slot = i;
            if (pr->tickets && slot >= 0) break;
            /* Nothing to launch yet. Finish the batch on the GPU once its
             * hidden states are out; until then wait in short steps for a
             * staging buffer (the one being sent) or a ticket, so the next
             * forward is queued before this one ends and the GPU never waits
             * for a checksum or a send. */
            if (pending.t && hs__gpu_batch_done(w->gpu_w, pending.slot)) {
                pthread_mutex_unlock(&pr->lock);
                hs_status_t rc = gpu_finish(pr, w, &pending);
                pending.t = NULL;
                pthread_mutex_lock(&pr->lock);
                w->computing = false;
                if (rc != HS_OK) break;
                t_wait = hs_now_s();
                continue;
            }
            if (pending.t) {
                struct timespec dl;
                clock_gettime(CLOCK_REALTIME, &dl);
                dl.tv_nsec += 2000000;
                if (dl.tv_nsec >= 1000000000L) {
                    dl.tv_sec++;
                    dl.tv_nsec -= 1000000000L;
                }
                pthread_cond_timedwait(&pr->cond, &pr->lock, &dl);
                continue;
            }
            pthread_cond_wait(&pr->cond, &pr->lock);
        }
        if (pr->stop) break;
        staging_t *st = &w->staging[slot];
        ticket_t *t = pr->tickets;
        pr->tickets = t->next;
        if (!pr->tickets) pr->tickets_tail = NULL;
        st->busy = true;
        if (pr->t_start > 0 && !pending.t)
            w->stall_s += hs_now_s() - (t_wait > pr->t_start ? t_wait : pr->t_start);
        w->computing = true;
        w->t_progress = hs_now_s();
        pthread_mutex_unlock(&pr->lock);

        hs_batch_view_t v = hs_batch_view(st->buf, t->n_seqs, t->n_tokens, layout);
        hs_batch_header_init(v.header, t->epoch, t->batch, t->n_seqs, t->n_tokens, layout,
                             hs_plan_hash(pr->plan));
        hs_status_t rc = hs_plan_fill_batch(pr->plan, pr->ds, t->batch, &v);
        if (rc == HS_OK) rc = hs__gpu_batch_launch(w->gpu_w, slot, &v, t->n_seqs, t->n_tokens);
        if (rc != HS_OK) {
            hs_error("worker %u (gpu %d): cannot launch batch %u/%u: %s", w->index, w->gpu,
                     t->epoch, t->batch, hs_status_str(rc));
            free(t);
            pthread_mutex_lock(&pr->lock);
            st->busy = false;
            pr->result = rc;
            pr->stop = true;
            pthread_cond_broadcast(&pr->cond);
            hs_tp_wakeup(pr->tp);
            break;
        }
        if (pending.t) {
            rc = gpu_finish(pr, w, &pending);
            pending.t = NULL;
        }
        pending = (inflight_t){t, st, slot};
        pthread_mutex_lock(&pr->lock);
        if (rc != HS_OK) break;
    }
    pthread_mutex_unlock(&pr->lock);
    if (pending.t) {
        double ms;
        hs__gpu_batch_wait(w->gpu_w, pending.slot, &ms); /* the GPU is done with the buffers */
        free(pending.t);
    }
    return NULL;
}

/* ---- network thread ---------------------------------------------------------- */

static void send_msg(link_t *l, uint16_t type, const ProtobufCMessage *m)
{
    producer_t *pr = l->pr;
    size_t len;
    if (!l->conn) return;
    hs_status_t st =
        hs_msg_pack(type, m, pr->frame_buf, HS_FRAME_MAX_BODY + HS_FRAME_HEADER_BYTES, &len);
    if (st == HS_OK) st = hs_tp_send(l->conn, pr->frame_buf, len);
    if (st != HS_OK) hs_error("sending %s failed: %s", hs_msg_type_str(type), hs_status_str(st));
}

/* The producer is done once every link is. */
static void links_update_done(producer_t *pr)
{
    bool all = true;
    for (uint32_t i = 0; i < pr->n_links; i++)
        all &= pr->links[i].done;
    if (all) pr->done = true;
}

/* Ends link l: ERROR with the text to its consumer, then close. */
static void link_end(link_t *l, hs_status_t code, const char *text)
{
    producer_t *pr = l->pr;
    if (l->conn) {
        size_t len;
        if (hs_msg_error_frame(code, text, pr->frame_buf, HS_FRAME_MAX_BODY, &len) == HS_OK)
            hs_tp_send(l->conn, pr->frame_buf, len);
        hs_tp_close(l->conn, code);
    }
    l->done = true;
    l->lost = false;
    if (pr->result == HS_OK) pr->result = code;
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
    if (l->pr->n_links > 1)
        hs_error("consumer %s:%u: %s", l->host, l->port, text);
    else
        hs_error("%s", text);
    link_end(l, code, text);
    links_update_done(l->pr);
}

/* A failure of the whole producer (local, or a set of consumers that does
 * not fit together): every link ends. */
static void fail_all(producer_t *pr, hs_status_t code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void fail_all(producer_t *pr, hs_status_t code, const char *fmt, ...)
{
    char text[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof(text), fmt, ap);
    va_end(ap);
    hs_error("%s", text);
    for (uint32_t i = 0; i < pr->n_links; i++)
        if (!pr->links[i].done) link_end(&pr->links[i], code, text);
    if (pr->result == HS_OK) pr->result = code;
    pr->done = true;
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
            hs_plan_batch_t b;
            hs_plan_batch(pr->plan, first + i, &b);
            ns[i] = b.n_seqs;
            nt[i] = b.n_tokens;
        }
        Hsflow__Plan m = HSFLOW__PLAN__INIT;
        m.first_batch = first;
        m.n_n_seqs = cnt;
        m.n_seqs = ns;
        m.n_n_tokens = cnt;
        m.n_tokens = nt;
        m.last = first + cnt == n;
        send_msg(l, HS_MSG_PLAN, &m.base);
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
    hs_auth_producer_mac(&pr->key, l->server_nonce, l->client_nonce, l->hello_body, l->hello_len,
                         mac);
    Hsflow__Auth a = HSFLOW__AUTH__INIT;
    a.mac.data = mac;
    a.mac.len = sizeof(mac);
    send_msg(l, HS_MSG_AUTH, &a.base);
}

/* The ranks the welcomed consumers say they are must fit together: one world
 * size, each rank once. Otherwise the whole set is refused, naming both. */
static bool links_check_ranks(link_t *l)
{
    producer_t *pr = l->pr;
    uint32_t w = l->world ? l->world : 1;
    for (uint32_t i = 0; i < pr->n_links; i++) {
        link_t *o = &pr->links[i];
        if (o == l || !o->welcomed || o->done) continue;
        uint32_t ow = o->world ? o->world : 1;
        if (ow != w) {
            fail_all(pr, HS_ERR_MISMATCH,
                     "the consumers given to --to differ in world size: %s:%u (%s) is rank %u of "
                     "%u, %s:%u (%s) is rank %u of %u; start every rank with the same --world",
                     o->host, o->port, o->consumer_name, o->rank, ow, l->host, l->port,
                     l->consumer_name, l->rank, w);
            return false;
        }
        if (o->rank == l->rank) {
            fail_all(pr, HS_ERR_MISMATCH,
                     "two consumers given to --to are both rank %u of %u: %s:%u (%s) and %s:%u "
                     "(%s); give each rank its own --rank",
                     l->rank, w, o->host, o->port, o->consumer_name, l->host, l->port,
                     l->consumer_name);
            return false;
        }
    }
    return true;
}

static void on_welcome(link_t *l, const uint8_t *body, uint32_t len)
{
    producer_t *pr = l->pr;
    ProtobufCMessage *m;
    if (!(m = consumer_unpack(l, HS_MSG_WELCOME, body, len))) return;
    Hsflow__Welcome *w = (Hsflow__Welcome *)m;
    if (pr->have_secret) {
        uint8_t expect[HS_AUTH_MAC_BYTES];
        hs_auth_consumer_mac(&pr->key, l->client_nonce, l->server_nonce, expect);
        if (w->server_mac.len != HS_AUTH_MAC_BYTES ||
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
    if (w->world > 1)
        hs_info("welcomed by consumer %s (rank %u of %u): %u epoch(s), %s order%s",
                w->consumer_name, w->rank, w->world, w->epochs, w->order ? "plan" : "arrival",
                w->need_plan ? "; sending the plan" : "");
    else
        hs_info("welcomed by consumer %s: %u epoch(s), %s order%s", w->consumer_name, w->epochs,
                w->order ? "plan" : "arrival", w->need_plan ? "; sending the plan" : "");
    bool need_plan = w->need_plan;
    pthread_mutex_lock(&pr->lock);
    if (w->epochs > pr->epochs) pr->epochs = w->epochs;
    pthread_mutex_unlock(&pr->lock);
    /* Heartbeats (STATS) four times per lease, so one late beat costs nothing;
     * with several consumers, often enough for the strictest. */
    double lease_s = w->lease_timeout_ms / 1000.0;
    double beat = lease_s > 0 ? lease_s / 4 : 2.0;
    if (beat > 2.0) beat = 2.0;
    if (beat < 0.05) beat = 0.05;
    if (pr->heartbeat_s == 0 || beat < pr->heartbeat_s) pr->heartbeat_s = beat;
    hs_msg_free(m); /* w is gone from here on: l->rank and l->world hold its rank */
    if (l->world && l->rank >= l->world) {
        fail(l, HS_ERR_PROTO, "consumer %s says it is rank %u of %u", l->consumer_name, l->rank,
             l->world);
        return;
    }
    if (!links_check_ranks(l)) return;
    l->welcomed = true;
    if (need_plan) send_plan(l);
    pthread_mutex_lock(&pr->lock);
    if (pr->t_start == 0) pr->t_start = hs_now_s();
    pthread_mutex_unlock(&pr->lock);
}

static void on_ticket(link_t *l, const uint8_t *body, uint32_t len)
{
    producer_t *pr = l->pr;
    ProtobufCMessage *m;
    if (!l->welcomed) {
        fail(l, HS_ERR_PROTO, "TICKET before WELCOME");
        return;
    }
    if (!(m = consumer_unpack_in(l, &pr->ticket_arena, HS_MSG_TICKET, body, len))) return;
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
    } else if (pr->stopping) {
        pr->tickets_returned++; /* left to the consumer, which reissues it when we leave */
    } else {
        ticket_t *q = calloc(1, sizeof(*q));
        if (!q) {
            fail_all(pr, HS_ERR_NOMEM, "out of memory");
        } else {
            *q = (ticket_t){NULL,        t->ticket_id, t->epoch, t->batch, t->n_seqs,
                            t->n_tokens, t->bytes,     l->gen,   l->index};
            pthread_mutex_lock(&pr->lock);
            if (t->epoch > pr->epoch_seen) pr->epoch_seen = t->epoch;
            if (pr->tickets_tail)
                pr->tickets_tail->next = q;
            else
                pr->tickets = q;
            pr->tickets_tail = q;
            pthread_cond_broadcast(&pr->cond);
            pthread_mutex_unlock(&pr->lock);
        }
    }
    hs_msg_free_in(&pr->ticket_arena, m);
}

/* The link of a connection, or NULL (one this producer gave up on). */
static link_t *link_of(producer_t *pr, const hs_tp_conn_t *conn)
{
    for (uint32_t i = 0; i < pr->n_links; i++)
        if (pr->links[i].conn == conn) return &pr->links[i];
    return NULL;
}

static void cb_frame(void *arg, hs_tp_conn_t *conn, uint16_t type, const uint8_t *body,
                     uint32_t body_len, uint64_t payload_bytes)
{
    producer_t *pr = arg;
    char why[256];
    ProtobufCMessage *m;
    link_t *l = link_of(pr, conn);
    if (!l && pr->connecting && !pr->connecting->conn) {
        /* A frame of the connection being made, delivered before
         * hs_tp_connect returned it (UCX can: a consumer whose run is over
         * says BYE on accept). It is that link's. */
        l = pr->connecting;
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
    case HS_MSG_BYE:
        if (hs_msg_unpack(HS_MSG_BYE, body, body_len, &m, why, sizeof(why)) == HS_OK) {
            if (pr->n_links > 1)
                hs_info("consumer says BYE (%s, rank %u of %u): %s", l->consumer_name, l->rank,
                        l->world, ((Hsflow__Bye *)m)->reason);
            else
                hs_info("consumer says BYE: %s", ((Hsflow__Bye *)m)->reason);
            hs_msg_free(m);
        }
        l->done = true;
        hs_tp_close(conn, HS_ERR_CLOSED);
        links_update_done(pr);
        break;
    case HS_MSG_ERROR:
        if (hs_msg_unpack(HS_MSG_ERROR, body, body_len, &m, why, sizeof(why)) == HS_OK) {
            Hsflow__Error *e = (Hsflow__Error *)m;
            if (e->code == HS_ERR_TIMEOUT && pr->cfg->reconnect && !pr->stopping) {
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
            if (pr->n_links > 1)
                fail_all(pr, code, "consumer %s:%u refused us: %s", l->host, l->port, e->text);
            else
                hs_error("consumer refused us: %s", e->text);
            if (pr->result == HS_OK) pr->result = code;
            hs_msg_free(m);
        } else if (pr->result == HS_OK) {
            pr->result = HS_ERR_PROTO;
        }
        l->done = true;
        hs_tp_close(conn, HS_ERR_CLOSED);
        links_update_done(pr);
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
    pthread_mutex_lock(&pr->lock);
    ticket_t **pp = &pr->tickets;
    pr->tickets_tail = NULL;
    while (*pp) {
        ticket_t *t = *pp;
        if (t->link == l->index) {
            *pp = t->next;
            free(t);
        } else {
            pr->tickets_tail = t;
            pp = &t->next;
        }
    }
    l->gen++;
    pthread_mutex_unlock(&pr->lock);
}

static void cb_close(void *arg, hs_tp_conn_t *conn, hs_status_t reason, const char *why)
{
    producer_t *pr = arg;
    link_t *l = link_of(pr, conn);
    if (!l) return;
    l->conn = NULL;
    l->welcomed = false;
    link_drop_tickets(l);
    if (!l->done && pr->stopping) {
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
        pr->result = HS_ERR_CLOSED;
        l->done = true;
    }
    links_update_done(pr);
}

static void cb_sent(void *arg, hs_status_t status)
{
    staging_t *st = arg;
    producer_t *pr = st->owner->pr;
    hs_trace("staging buffer of worker %u sent in %.1f ms", st->owner->index,
             1e3 * (hs_now_s() - st->t_send));
    pthread_mutex_lock(&pr->lock);
    st->busy = false;
    pthread_cond_broadcast(&pr->cond);
    pthread_mutex_unlock(&pr->lock);
    (void)status; /* a failed send means the connection is gone: cb_close reports it */
}

static const hs_tp_callbacks_t producer_callbacks = {
    .on_frame = cb_frame,
    .on_close = cb_close,
};

/* Sends every batch the workers finished: DONE frame + payload from staging. */
static void flush_outbox(producer_t *pr)
{
    pthread_mutex_lock(&pr->lock);
    outgoing_t *o = pr->outbox;
    pr->outbox = NULL;
    pthread_mutex_unlock(&pr->lock);
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
        link_t *l = &pr->links[o->t.link];
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
            st = hs_msg_pack(HS_MSG_DONE, &d.base, pr->frame_buf, HS_FRAME_MAX_BODY, &len);
            o->st->t_send = hs_now_s();
            if (st == HS_OK)
                st = hs_tp_send_payload(l->conn, pr->frame_buf, len, o->st->buf, o->t.bytes,
                                        cb_sent, o->st);
        }
        if (st != HS_OK) cb_sent(o->st, st);
        free(o);
    }
}

static void send_stats(producer_t *pr)
{
    Hsflow__Stats s = HSFLOW__STATS__INIT;
    uint32_t n = pr->cfg->n_workers;
    double now = hs_now_s(), stall = 0;
    uint64_t tokens = 0, batches = 0;
    bool progressing = false;
    pthread_mutex_lock(&pr->lock);
    double elapsed = pr->t_start > 0 ? now - pr->t_start : 0;
    for (uint32_t i = 0; i < n; i++) {
        worker_t *w = &pr->workers[i];
        stall += elapsed > 0 ? 100.0 * w->stall_s / elapsed : 0;
        tokens += w->tokens;
        batches += w->batches;
        /* A worker that took or finished a batch since the last beat made
         * progress; so did one inside a batch whose thread kept computing
         * (1 ms of CPU at least: a thread blocked in a wait gets none, one
         * computing on a loaded machine still gets that much). A hung
         * worker does neither. */
        if (w->t_progress > pr->t_beat) progressing = true;
        struct timespec ts;
        if (w->has_cpu_clock && clock_gettime(w->cpu_clock, &ts) == 0) {
            uint64_t cpu = (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
            if (w->computing && cpu - w->cpu_ns_seen >= 1000000u) progressing = true;
            w->cpu_ns_seen = cpu;
        }
    }
    pr->t_beat = now;
    pthread_mutex_unlock(&pr->lock);
    s.progressing = progressing;
    s.worker_count = n;
    s.tokens = tokens;
    s.batches = batches;
    s.stall_pct = n ? stall / n : 0;
    s.tokens_per_s = elapsed > 0 ? (double)tokens / elapsed : 0;
    s.uptime_ns = (uint64_t)(elapsed * 1e9);
    for (uint32_t i = 0; i < pr->n_links; i++)
        if (pr->links[i].welcomed) send_msg(&pr->links[i], HS_MSG_STATS, &s.base);
}

/* One live status line: rates since the start, worker busy and stall. */
static void print_status(producer_t *pr)
{
    uint64_t tokens = 0, batches = 0, bytes = 0;
    double busy = 0, stall = 0;
    uint32_t n = pr->cfg->n_workers;
    pthread_mutex_lock(&pr->lock);
    double elapsed = pr->t_start > 0 ? hs_now_s() - pr->t_start : 0;
    for (uint32_t i = 0; i < n; i++) {
        worker_t *w = &pr->workers[i];
        tokens += w->tokens;
        batches += w->batches;
        bytes += w->bytes;
        busy += w->busy_s;
        stall += w->stall_s;
    }
    uint32_t queued = 0;
    for (ticket_t *t = pr->tickets; t; t = t->next)
        queued++;
    uint32_t epoch = pr->epoch_seen + 1, epochs = pr->epochs;
    pthread_mutex_unlock(&pr->lock);
    if (elapsed <= 0) return;
    double busy_pct = 100.0 * busy / elapsed / n, stall_pct = 100.0 * stall / elapsed / n;
    /* The limit as this side sees it: workers that wait for tickets wait on
     * the consumer (its trainer or cache); workers that compute nearly all
     * the time are the limit; the rest of their time goes to sending. */
    char limit[160];
    if (batches < 2)
        snprintf(limit, sizeof(limit), "too early to name the limit");
    else if (stall_pct >= 20.0)
        snprintf(limit, sizeof(limit),
                 "the consumer is the limit: workers wait for tickets %.0f%% of the time",
                 stall_pct);
    else if (busy_pct >= 70.0)
        snprintf(limit, sizeof(limit),
                 "this producer is the limit: workers compute %.0f%% of the time", busy_pct);
    else
        snprintf(limit, sizeof(limit),
                 "the network is the limit: workers spend %.0f%% of the time sending",
                 100.0 - busy_pct - stall_pct);
    hs_info("epoch %u/%u | %llu batches | %.0f tok/s | %.2f batch/s | %.2f GB/s | tickets queued "
            "%u | worker busy %.0f%% | stall %.0f%% | %s",
            epoch, epochs, (unsigned long long)batches, (double)tokens / elapsed,
            (double)batches / elapsed, (double)bytes / elapsed / 1e9, queued, busy_pct, stall_pct,
            limit);
}

static void print_summary(producer_t *pr)
{
    const hs_producer_config_t *cfg = pr->cfg;
    double elapsed = pr->t_start > 0 ? hs_now_s() - pr->t_start : 0;
    uint64_t tokens = 0, batches = 0;
    hs_outfile_t *of = NULL;
    if (cfg->summary_json) hs_outfile_open(cfg->summary_json, NULL, 0, &of);
    FILE *f = of ? hs_outfile_stream(of) : NULL;
    if (f) fprintf(f, "{\n  \"workers\": [\n");
    for (uint32_t i = 0; i < cfg->n_workers; i++) {
        worker_t *w = &pr->workers[i];
        tokens += w->tokens;
        batches += w->batches;
        double busy = elapsed > 0 ? 100.0 * w->busy_s / elapsed : 0;
        double stall = elapsed > 0 ? 100.0 * w->stall_s / elapsed : 0;
        hs_info("worker %u (%s%d): %llu batches, %llu tokens, busy %.0f%%, stall %.0f%%", i,
                w->gpu < 0 ? "cpu" : "gpu", w->gpu < 0 ? (int)i : w->gpu,
                (unsigned long long)w->batches, (unsigned long long)w->tokens, busy, stall);
        if (f)
            fprintf(f,
                    "    {\"worker\": %u, \"gpu\": %d, \"batches\": %llu, \"tokens\": %llu, "
                    "\"busy_pct\": %.2f, \"stall_pct\": %.2f}%s\n",
                    i, w->gpu, (unsigned long long)w->batches, (unsigned long long)w->tokens, busy,
                    stall, i + 1 < cfg->n_workers ? "," : "");
    }
    hs_info("done: %llu batches, %llu tokens in %.2f s (%.0f tokens/s)",
            (unsigned long long)batches, (unsigned long long)tokens, elapsed,
            elapsed > 0 ? (double)tokens / elapsed : 0);
    if (f) {
        fprintf(f,
                "  ],\n  \"batches\": %llu,\n  \"tokens\": %llu,\n  \"seconds\": %.3f,\n"
                "  \"tokens_per_s\": %.1f,\n  \"status\": \"%s\"\n}\n",
                (unsigned long long)batches, (unsigned long long)tokens, elapsed,
                elapsed > 0 ? (double)tokens / elapsed : 0, hs_status_str(pr->result));
        hs_outfile_commit(of);
    }
}

/* ---- setup --------------------------------------------------------------------- */

/* Connects link l. The transport may deliver the consumer's first frames
 * while it connects (cb_frame then binds the connection to l): after a BYE
 * or a refusal l is done and l->conn already closing, so no HELLO goes. */
static hs_status_t link_connect(link_t *l, int timeout_ms)
{
    producer_t *pr = l->pr;
    hs_tp_conn_t *conn = NULL;
    l->conn = NULL;
    pr->connecting = l;
    hs_status_t st = hs_tp_connect(pr->tp, l->host, l->port, timeout_ms, &conn);
    pr->connecting = NULL;
    l->conn = st == HS_OK ? conn : NULL;
    return st;
}

static hs_status_t send_hello(link_t *l)
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
    h.n_batches = hs_plan_n_batches(pr->plan);
    h.seed = cfg->seed;
    h.token_budget = cfg->token_budget;
    h.max_seq_len = ps.max_seq_len;
    h.dataset_fingerprint = hs_dataset_fingerprint(pr->ds);
    h.total_tokens = ps.tokens;
    h.total_seqs = ps.n_kept;
    h.target_name = cfg->source == HS_SOURCE_MODEL ? (char *)cfg->model_dir : "synthetic";
    hs_auth_nonce(l->client_nonce);
    h.client_nonce.data = l->client_nonce;
    h.client_nonce.len = HS_AUTH_NONCE_BYTES;
    size_t len;
    hs_status_t st = hs_msg_pack(HS_MSG_HELLO, &h.base, pr->frame_buf,
                                 HS_FRAME_MAX_BODY + HS_FRAME_HEADER_BYTES, &len);
    if (st != HS_OK) return st;
    /* The AUTH proof covers the HELLO body exactly as sent. */
    uint8_t *body = realloc(l->hello_body, len - HS_FRAME_HEADER_BYTES);
    if (!body) return HS_ERR_NOMEM;
    l->hello_body = body;
    l->hello_len = len - HS_FRAME_HEADER_BYTES;
    memcpy(l->hello_body, pr->frame_buf + HS_FRAME_HEADER_BYTES, l->hello_len);
    return hs_tp_send(l->conn, pr->frame_buf, len);
}

hs_status_t hs_producer_parse_to(const char *s, hs_producer_addrs_t *out)
{
    memset(out, 0, sizeof(*out));
    if (!s || !*s) {
        hs_error("--to: expected HOST:PORT[,HOST:PORT...] or HOST:LO-HI, got nothing");
        return HS_ERR_INVALID;
    }
    const char *p = s;
    while (*p) {
        const char *end = strchr(p, ',');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        char item[300];
        if (len == 0 || len >= sizeof(item)) {
            hs_error("--to '%s': an empty or overlong address in the list", s);
            return HS_ERR_INVALID;
        }
        memcpy(item, p, len);
        item[len] = 0;
        char *colon = strrchr(item, ':');
        char *dash = colon ? strchr(colon, '-') : NULL;
        uint64_t lo, hi;
        char host[256];
        uint16_t port;
        if (dash) {
            *dash = 0;
            if (hs_parse_hostport(item, host, sizeof(host), &port) != HS_OK ||
                hs_parse_u64(dash + 1, &hi) != HS_OK || hi > 65535 || hi < port) {
                hs_error(
                    "--to '%s': '%.*s' is not HOST:LO-HI with LO <= HI, e.g. drafter:7000-7007", s,
                    (int)len, p);
                return HS_ERR_INVALID;
            }
            lo = port;
        } else {
            if (hs_parse_hostport(item, host, sizeof(host), &port) != HS_OK) {
                hs_error("--to '%s': '%s' is not HOST:PORT, e.g. drafter:7000", s, item);
                return HS_ERR_INVALID;
            }
            lo = hi = port;
        }
        for (uint64_t q = lo; q <= hi; q++) {
            if (out->n == HS_PRODUCER_MAX_LINKS) {
                hs_error("--to '%s': more than %d consumers; one producer feeds at most that many",
                         s, HS_PRODUCER_MAX_LINKS);
                return HS_ERR_INVALID;
            }
            for (uint32_t i = 0; i < out->n; i++)
                if (out->port[i] == q && !strcmp(out->host[i], host)) {
                    hs_error("--to '%s': %s:%llu is given twice", s, host, (unsigned long long)q);
                    return HS_ERR_INVALID;
                }
            snprintf(out->host[out->n], sizeof(out->host[0]), "%s", host);
            out->port[out->n] = (uint16_t)q;
            out->n++;
        }
        p += len;
        if (*p == ',') p++;
    }
    return HS_OK;
}

void hs_producer_config_default(hs_producer_config_t *cfg)
{
    memset(cfg, 0, sizeof(*cfg));
    cfg->to_port = 7000;
    cfg->token_budget = 65536;
    cfg->overflow = HS_OVERFLOW_TRUNCATE;
    cfg->source = HS_SOURCE_SYNTHETIC;
    cfg->n_workers = 1;
    cfg->gpu_ids[0] = -1;
    cfg->prefetch = 2;
    cfg->transport = "auto";
    cfg->connect_timeout_s = 30;
}

hs_status_t hs_producer_parse_devices(const char *s, hs_producer_config_t *cfg)
{
    uint64_t n;
    if (!strncmp(s, "cpu:", 4)) {
        if (hs_parse_u64(s + 4, &n) != HS_OK || n == 0 || n > HS_PRODUCER_MAX_WORKERS)
            return HS_ERR_INVALID;
        cfg->n_workers = (uint32_t)n;
        for (uint32_t i = 0; i < n; i++)
            cfg->gpu_ids[i] = -1;
        return HS_OK;
    }
    int ids[HS_PRODUCER_MAX_WORKERS], cnt;
    if (hs_parse_int_list(s, ids, HS_PRODUCER_MAX_WORKERS, &cnt) != HS_OK) return HS_ERR_INVALID;
    for (int i = 0; i < cnt; i++) {
        if (ids[i] < 0) return HS_ERR_INVALID;
        for (int j = 0; j < i; j++)
            if (ids[j] == ids[i]) return HS_ERR_INVALID;
    }
    cfg->n_workers = (uint32_t)cnt;
    memcpy(cfg->gpu_ids, ids, sizeof(int) * (size_t)cnt);
    return HS_OK;
}

static hs_status_t load_inputs(producer_t *pr)
{
    const hs_producer_config_t *cfg = pr->cfg;
    hs_status_t st = hs_dataset_open(cfg->data_path, &pr->ds);
    if (st != HS_OK) return st;
    hs_plan_config_t pc = {.token_budget = cfg->token_budget,
                           .max_seq_len = cfg->max_seq_len,
                           .overflow = (hs_overflow_t)cfg->overflow,
                           .seed = cfg->seed};
    st = hs_plan_build(pr->ds, &pc, &pr->plan);
    if (st != HS_OK) return st;
    hs_plan_stats_t ps;
    hs_plan_stats(pr->plan, &ps);
    uint32_t n = hs_plan_n_batches(pr->plan);
    if (n > HS_PLAN_MAX_BATCHES) {
        hs_error("the plan of %s has %u batches per epoch, more than the %u a run may have: "
                 "raise --token-budget or split the data",
                 cfg->data_path, n, HS_PLAN_MAX_BATCHES);
        return HS_ERR_INVALID;
    }
    for (uint32_t b = 0; b < n; b++) {
        hs_plan_batch_t pb;
        hs_plan_batch(pr->plan, b, &pb);
        uint64_t bytes = hs_batch_bytes(pb.n_seqs, pb.n_tokens, &cfg->layout);
        if (bytes > pr->max_batch_bytes) pr->max_batch_bytes = bytes;
        if (pb.n_seqs > pr->max_batch_seqs) pr->max_batch_seqs = pb.n_seqs;
    }
    hs_info("plan %016llx: %llu sequences (%llu truncated, %llu dropped), %llu tokens in %u "
            "batches (%.1f%% full), largest batch %.1f MiB",
            (unsigned long long)hs_plan_hash(pr->plan), (unsigned long long)ps.n_kept,
            (unsigned long long)ps.n_truncated, (unsigned long long)ps.n_dropped,
            (unsigned long long)ps.tokens, n, ps.mean_fill_pct,
            (double)pr->max_batch_bytes / (1 << 20));
    if (cfg->source == HS_SOURCE_MODEL) {
        uint32_t h = (uint32_t)hs_model_hidden_size(pr->model);
        if (h != cfg->layout.hidden_size) {
            hs_error("--hidden-size %u but the model at %s has hidden size %u: drop "
                     "--hidden-size or give %u",
                     cfg->layout.hidden_size, cfg->model_dir, h, h);
            return HS_ERR_INVALID;
        }
        int max_layer = cfg->layout.layers[cfg->layout.n_layers - 1];
        int n_model = hs_model_num_layers(pr->model);
        if (max_layer > n_model) {
            hs_error("--layers asks for hidden state %d but the model has %d layers (valid: 0..%d)",
                     max_layer, n_model, n_model);
            return HS_ERR_INVALID;
        }
    }
    return HS_OK;
}

/* With --source model: load it, and take the hidden size and (with
 * --dflash-layers) the captured layers from it. */
static hs_status_t load_model(producer_t *pr)
{
    hs_producer_config_t *cfg = &pr->config;
    hs_status_t st = hs_model_load(cfg->model_dir, &pr->model);
    if (st != HS_OK) return st;
    if (!cfg->layout.hidden_size)
        cfg->layout.hidden_size = (uint32_t)hs_model_hidden_size(pr->model);
    if (cfg->dflash_layers > 0) {
        st = hs_model_dflash_layers(hs_model_num_layers(pr->model), cfg->dflash_layers,
                                    cfg->layout.layers, HS_MAX_LAYERS);
        if (st != HS_OK) return st;
        cfg->layout.n_layers = (uint32_t)cfg->dflash_layers;
    }
    char desc[200];
    hs_layout_describe(&cfg->layout, desc, sizeof(desc));
    hs_info("model %s: %d layers, hidden %d; capturing %s", cfg->model_dir,
            hs_model_num_layers(pr->model), hs_model_hidden_size(pr->model), desc);
    return HS_OK;
}

/* Frees everything producer_open() made; worker threads must be joined. */
static void producer_free(producer_t *pr)
{
    if (!pr) return;
    /* Completion callbacks of anything still queued run during destroy. */
    hs_tp_destroy(pr->tp);
    while (pr->outbox) {
        outgoing_t *o = pr->outbox;
        pr->outbox = o->next;
        free(o);
    }
    while (pr->tickets) {
        ticket_t *t = pr->tickets;
        pr->tickets = t->next;
        free(t);
    }
    for (uint32_t i = 0; i < HS_PRODUCER_MAX_WORKERS; i++) {
        hs__gpu_worker_destroy(pr->workers[i].gpu_w); /* unpins staging first */
        for (int k = 0; k < STAGING_PER_WORKER; k++)
            hs_aligned_free(pr->workers[i].staging[k].buf);
        hs_checksum_stream_destroy(pr->workers[i].checksum);
    }
    hs_model_destroy(pr->model);
    hs_plan_destroy(pr->plan);
    hs_dataset_close(pr->ds);
    hs_auth_key_clear(&pr->key);
    for (uint32_t i = 0; i < HS_PRODUCER_MAX_LINKS; i++)
        free(pr->links[i].hello_body);
    free(pr->frame_buf);
    pthread_mutex_destroy(&pr->lock);
    pthread_cond_destroy(&pr->cond);
    free(pr);
}

/* Loads data, plan and model, allocates staging, connects and says HELLO.
 * No thread is started. */
static hs_status_t producer_open(const hs_producer_config_t *config, producer_t **out)
{
    hs_status_t st;
    producer_t *pr = calloc(1, sizeof(*pr));
    if (!pr) return HS_ERR_NOMEM;
    pr->config = *config;
    const hs_producer_config_t *cfg = pr->cfg = &pr->config;
    pthread_mutex_init(&pr->lock, NULL);
    pthread_cond_init(&pr->cond, NULL);
    hs_msg_arena_init(&pr->ticket_arena);

    if (cfg->source == HS_SOURCE_MODEL) {
        st = load_model(pr);
        if (st != HS_OK) goto err;
    }
    if (hs_layout_check(&cfg->layout) != HS_OK || cfg->n_workers == 0 ||
        cfg->n_workers > HS_PRODUCER_MAX_WORKERS || cfg->prefetch == 0) {
        hs_error("invalid producer configuration (layout, workers or prefetch)");
        st = HS_ERR_INVALID;
        goto err;
    }
    if (cfg->source == HS_SOURCE_SYNTHETIC && cfg->gpu_ids[0] >= 0)
        hs_info("--source synthetic: the %u listed GPUs act as %u CPU workers", cfg->n_workers,
                cfg->n_workers);
    if (cfg->secret_file) {
        st = hs_auth_load_secret(cfg->secret_file, &pr->key);
        if (st != HS_OK) goto err;
        pr->have_secret = true;
    }
    st = load_inputs(pr);
    if (st != HS_OK) goto err;
    pr->frame_buf = malloc(HS_FRAME_MAX_BODY + HS_FRAME_HEADER_BYTES);
    if (!pr->frame_buf) {
        st = HS_ERR_NOMEM;
        goto err;
    }

    hs_tp_config_t tc = {0};
    st = hs_tp_kind_parse(cfg->transport ? cfg->transport : "auto", &tc.kind);
    if (st != HS_OK) {
        hs_error("unknown transport '%s': use auto, tcp or ucx", cfg->transport);
        goto err;
    }
    tc.net_devices = cfg->net_devices;
    tc.require_rdma = cfg->require_rdma;
    tc.auth_key = pr->have_secret ? &pr->key : NULL; /* copied: pr->key stays ours */
    st = hs_tp_create(&tc, &producer_callbacks, pr, &pr->tp);
    if (st != HS_OK) goto err;

    /* Staging: two batch-sized buffers per worker, registered once. */
    for (uint32_t i = 0; i < cfg->n_workers; i++) {
        worker_t *w = &pr->workers[i];
        w->pr = pr;
        w->index = i;
        w->gpu = cfg->gpu_ids[i];
        w->checksum = hs_checksum_stream_create();
        if (!w->checksum) {
            st = HS_ERR_NOMEM;
            goto err;
        }
        for (int k = 0; k < STAGING_PER_WORKER; k++) {
            staging_t *sg = &w->staging[k];
            sg->owner = w;
            sg->buf = hs_aligned_alloc(4096, pr->max_batch_bytes);
            if (!sg->buf) {
                hs_error("cannot allocate %.1f MiB of staging for worker %u",
                         (double)pr->max_batch_bytes / (1 << 20), i);
                st = HS_ERR_NOMEM;
                goto err;
            }
            memset(sg->buf, 0, pr->max_batch_bytes); /* fault the pages in now, not per batch */
            hs_tp_mem_register(pr->tp, sg->buf, pr->max_batch_bytes);
        }
        if (cfg->source == HS_SOURCE_MODEL && w->gpu >= 0) {
            void *bufs[2] = {w->staging[0].buf, w->staging[1].buf};
            st = hs__gpu_worker_create(pr->model, w->gpu, cfg->token_budget, pr->max_batch_seqs,
                                       &cfg->layout, bufs, pr->max_batch_bytes, &w->gpu_w);
            if (st != HS_OK) goto err;
            hs_info("worker %u on gpu %d: model replica and buffers for %u tokens ready", i, w->gpu,
                    cfg->token_budget);
        }
    }

    if (cfg->to && cfg->to->n) {
        pr->n_links = cfg->to->n;
        for (uint32_t i = 0; i < pr->n_links; i++) {
            snprintf(pr->links[i].host, sizeof(pr->links[i].host), "%s", cfg->to->host[i]);
            pr->links[i].port = cfg->to->port[i];
        }
    } else {
        pr->n_links = 1;
        snprintf(pr->links[0].host, sizeof(pr->links[0].host), "%s", cfg->to_host);
        pr->links[0].port = cfg->to_port;
    }
    static const char *source_names[] = {"?", "synthetic", "model", "external"};
    for (uint32_t i = 0; i < pr->n_links; i++) {
        link_t *l = &pr->links[i];
        l->pr = pr;
        l->index = i;
        snprintf(l->consumer_name, sizeof(l->consumer_name), "%s:%u", l->host, l->port);
        st = link_connect(l, (int)cfg->connect_timeout_s * 1000);
        if (st != HS_OK && l->done) {
            st = HS_OK; /* told BYE (or refused, as logged) while connecting */
            links_update_done(pr);
            continue;
        }
        if (st != HS_OK) {
            /* a refusal (secret, version) was explained by the transport */
            if (st == HS_ERR_TIMEOUT || st == HS_ERR_IO)
                hs_error("cannot reach the consumer at %s:%u within %u s: is hs-consumer "
                         "running there?",
                         l->host, l->port, cfg->connect_timeout_s);
            goto err;
        }
        hs_info("hsflow %s connected to %s:%u over %s; %u %s worker(s)", hs_version_line(), l->host,
                l->port, hs_tp_conn_describe(l->conn), cfg->n_workers, source_names[cfg->source]);
        if (l->done) continue; /* its consumer said BYE or refused us while we connected */
        st = send_hello(l);
        if (st != HS_OK) goto err;
    }
    *out = pr;
    return HS_OK;
err:
    producer_free(pr);
    return st;
}

/* --reconnect: drops the tickets of the lost connection (a batch being
 * computed for one is discarded when done), tries to connect again and
 * repeats the handshake; a restarted consumer (with its journal) then
 * tickets anew. Each try is short, so the other links go on meanwhile;
 * after connect_timeout_s the link is given up. */
static void reconnect(link_t *l)
{
    producer_t *pr = l->pr;
    double now = hs_now_s();
    if (now - l->t_try < 0.2) return;
    l->t_try = now;
    hs_status_t st = link_connect(l, 1000);
    if (l->done) { /* told BYE or refused while connecting */
        l->lost = false;
        links_update_done(pr);
        return;
    }
    if (st != HS_OK) {
        if (now - l->t_lost < pr->cfg->connect_timeout_s) return;
        hs_error("could not reach the consumer at %s:%u again within %u s", l->host, l->port,
                 pr->cfg->connect_timeout_s);
        pr->result = HS_ERR_CLOSED;
        l->lost = false;
        l->done = true;
        links_update_done(pr);
        return;
    }
    link_drop_tickets(l);
    l->welcomed = false;
    l->lost = false;
    if (send_hello(l) != HS_OK) {
        hs_warn("consumer %s:%u: sending HELLO after reconnecting failed; trying again", l->host,
                l->port);
        hs_tp_close(l->conn, HS_ERR_CLOSED); /* cb_close marks it lost again */
        return;
    }
    hs_info("reconnected to %s:%u", l->host, l->port);
}

/* A stop was requested (SIGTERM/SIGINT in hs-producer): take no new work,
 * drop the tickets not started (the consumer hands them to the others once
 * this connection closes), let the batches being computed finish. */
static void begin_stop(producer_t *pr)
{
    pr->stopping = true;
    pr->t_stop = hs_now_s();
    uint32_t dropped = 0, busy = 0;
    pthread_mutex_lock(&pr->lock);
    while (pr->tickets) {
        ticket_t *t = pr->tickets;
        pr->tickets = t->next;
        free(t);
        dropped++;
    }
    pr->tickets_tail = NULL;
    for (uint32_t i = 0; i < pr->cfg->n_workers; i++)
        for (int k = 0; k < STAGING_PER_WORKER; k++)
            busy += pr->workers[i].staging[k].busy;
    pthread_mutex_unlock(&pr->lock);
    pr->tickets_returned += dropped;
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
    pthread_mutex_lock(&pr->lock);
    for (uint32_t i = 0; i < pr->cfg->n_workers && idle; i++)
        for (int k = 0; k < STAGING_PER_WORKER; k++)
            if (pr->workers[i].staging[k].busy) idle = false;
    if (pr->outbox) idle = false;
    pthread_mutex_unlock(&pr->lock);
    bool late = hs_now_s() - pr->t_stop > limit_s;
    bool connected = false;
    for (uint32_t i = 0; i < pr->n_links; i++)
        connected |= pr->links[i].conn != NULL;
    if (!idle && !late && connected) return;
    if (late && !idle)
        hs_warn("stop: batches still in progress after %.0f s; leaving them to the consumer",
                limit_s);
    if (connected) {
        char reason[160];
        snprintf(reason, sizeof reason, "producer stopped on request; %u ticket(s) returned",
                 pr->tickets_returned);
        Hsflow__Bye b = HSFLOW__BYE__INIT;
        b.reason = reason;
        for (uint32_t i = 0; i < pr->n_links; i++) {
            link_t *l = &pr->links[i];
            if (!l->conn) continue;
            send_msg(l, HS_MSG_BYE, &b.base);
            hs_tp_close(l->conn, HS_ERR_CLOSED);
        }
        hs_info("stopped on request: told the consumer%s BYE (%u ticket(s) returned)",
                pr->n_links > 1 ? "s" : "", pr->tickets_returned);
    }
    pr->done = true;
}

/* The network loop: until the consumer says BYE, the connection is lost, or
 * a local failure. Wakes everyone waiting on pr->cond when it ends. */
static void *net_main(void *arg)
{
    producer_t *pr = arg;
    double t_status = hs_now_s();
    const char *si = getenv("HS_STATUS_INTERVAL");
    double status_interval = si ? atof(si) : 5.0;
    while (!pr->done) {
        hs_tp_progress(pr->tp, pr->stopping ? 20 : 200);
        if (!pr->stopping && pr->cfg->stop_requested && *pr->cfg->stop_requested) begin_stop(pr);
        bool welcomed = false;
        for (uint32_t i = 0; i < pr->n_links; i++) {
            link_t *l = &pr->links[i];
            if (l->lost && pr->stopping) { /* nobody to finish for there */
                l->lost = false;
                l->done = true;
            }
            if (l->lost) reconnect(l);
            welcomed |= l->welcomed;
        }
        links_update_done(pr);
        if (pr->done) break;
        flush_outbox(pr);
        if (pr->stopping && !pr->done) drain_step(pr);
        if (pr->stop && pr->result != HS_OK && !pr->done) fail_all(pr, pr->result, "worker failed");
        if (pr->close_requested && !pr->done) {
            Hsflow__Bye b = HSFLOW__BYE__INIT;
            b.reason = "producer closed before the run ended";
            for (uint32_t i = 0; i < pr->n_links; i++) {
                link_t *l = &pr->links[i];
                if (!l->conn) continue;
                send_msg(l, HS_MSG_BYE, &b.base);
                hs_tp_close(l->conn, HS_ERR_CLOSED);
            }
            pr->done = true;
        }
        double now = hs_now_s();
        if (welcomed && now - pr->t_beat >= pr->heartbeat_s) send_stats(pr);
        if (welcomed && status_interval > 0 && now - t_status >= status_interval) {
            t_status = now;
            print_status(pr);
        }
    }
    /* Let BYE/ERROR and the last completions go out. */
    for (int i = 0; i < 3; i++)
        hs_tp_progress(pr->tp, 10);
    pthread_mutex_lock(&pr->lock);
    pr->net_done = true;
    pthread_cond_broadcast(&pr->cond);
    pthread_mutex_unlock(&pr->lock);
    return NULL;
}

hs_status_t hs_producer_run(const hs_producer_config_t *config)
{
    producer_t *pr;
    hs_status_t st = producer_open(config, &pr);
    if (st != HS_OK) return st;
    uint32_t started = 0;
    for (; started < pr->cfg->n_workers; started++) {
        worker_t *w = &pr->workers[started];
        if (pthread_create(&w->thread, NULL, w->gpu_w ? gpu_worker_main : worker_main, w) != 0) {
            pr->result = HS_ERR_NOMEM;
            pr->done = true;
            break;
        }
        /* A GPU worker's thread polls while its GPU computes (or hangs): its
         * CPU time says nothing; its launches and finishes do. */
        if (!w->gpu_w) {
            pthread_mutex_lock(&pr->lock);
            w->has_cpu_clock = pthread_getcpuclockid(w->thread, &w->cpu_clock) == 0;
            pthread_mutex_unlock(&pr->lock);
        }
    }
    net_main(pr);
    st = pr->result;
    pthread_mutex_lock(&pr->lock);
    pr->stop = true;
    pthread_cond_broadcast(&pr->cond);
    pthread_mutex_unlock(&pr->lock);
    for (uint32_t i = 0; i < started; i++)
        pthread_join(pr->workers[i].thread, NULL);
    if (started) print_summary(pr);
    producer_free(pr);
    return st;
}

/* ---- the library's producer API: the caller is the one worker ------------- */

hs_status_code_t hs_producer_open(const hs_producer_client_config_t *cc, hs_producer_t **out)
{
    hs_producer_config_t cfg;
    hs_producer_config_default(&cfg);
    hs_producer_addrs_t *addrs = malloc(sizeof(*addrs));
    if (!addrs) return HS_ERR_NOMEM;
    if (hs_producer_parse_to(cc->to, addrs) != HS_OK) {
        hs_error("producer: 'to' must be HOST:PORT[,HOST:PORT...] or HOST:LO-HI, got '%s'",
                 cc->to ? cc->to : "(null)");
        free(addrs);
        return HS_ERR_INVALID;
    }
    if (!cc->data_path || !cc->layers || cc->n_layers == 0 || cc->n_layers > HS_MAX_LAYERS ||
        cc->hidden_size == 0 || cc->token_budget == 0) {
        hs_error("producer: data_path, token_budget, hidden_size and 1..%d layers are required",
                 HS_MAX_LAYERS);
        free(addrs);
        return HS_ERR_INVALID;
    }
    cfg.to = addrs;
    cfg.data_path = cc->data_path;
    cfg.token_budget = cc->token_budget;
    cfg.max_seq_len = cc->max_seq_len;
    cfg.overflow = cc->overflow_drop ? HS_OVERFLOW_DROP : HS_OVERFLOW_TRUNCATE;
    cfg.seed = cc->seed;
    cfg.layout.hidden_size = cc->hidden_size;
    cfg.layout.dtype = HS_DTYPE_BF16;
    cfg.layout.n_layers = cc->n_layers;
    memcpy(cfg.layout.layers, cc->layers, cc->n_layers * sizeof(int32_t));
    cfg.source = HS_SOURCE_EXTERNAL;
    cfg.n_workers = 1;
    cfg.gpu_ids[0] = -1;
    if (cc->prefetch) cfg.prefetch = cc->prefetch;
    cfg.secret_file = cc->secret_file;
    if (cc->transport) cfg.transport = cc->transport;
    if (cc->connect_timeout_s) cfg.connect_timeout_s = cc->connect_timeout_s;
    cfg.name = cc->name;
    cfg.reconnect = cc->reconnect;

    producer_t *pr;
    hs_status_t st = producer_open(&cfg, &pr);
    free(addrs);
    if (st != HS_OK) return st;
    pr->config.to = NULL; /* `addrs` is gone; only used to connect (links keep the addresses) */
    if (pthread_create(&pr->net_thread, NULL, net_main, pr) != 0) {
        producer_free(pr);
        return HS_ERR_NOMEM;
    }
    pr->net_started = true;
    *out = pr;
    return HS_OK;
}

hs_status_code_t hs_producer_next(hs_producer_t *pr, hs_work_t *out, int timeout_ms)
{
    worker_t *w = &pr->workers[0];
    struct timespec dl;
    clock_gettime(CLOCK_REALTIME, &dl);
    if (timeout_ms >= 0) {
        dl.tv_sec += timeout_ms / 1000;
        dl.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
        if (dl.tv_nsec >= 1000000000L) {
            dl.tv_sec++;
            dl.tv_nsec -= 1000000000L;
        }
    }
    pthread_mutex_lock(&pr->lock);
    staging_t *st = NULL;
    for (;;) {
        st = NULL;
        for (int i = 0; i < STAGING_PER_WORKER; i++)
            if (!w->staging[i].busy) st = &w->staging[i];
        if (pr->tickets && st) break;
        if (pr->net_done || pr->stop) {
            hs_status_t r = pr->result != HS_OK ? pr->result : HS_ERR_CLOSED;
            pthread_mutex_unlock(&pr->lock);
            return r;
        }
        if (timeout_ms < 0)
            pthread_cond_wait(&pr->cond, &pr->lock);
        else if (pthread_cond_timedwait(&pr->cond, &pr->lock, &dl) == ETIMEDOUT) {
            pthread_mutex_unlock(&pr->lock);
            return HS_ERR_TIMEOUT;
        }
    }
    ticket_t *t = pr->tickets;
    pr->tickets = t->next;
    if (!pr->tickets) pr->tickets_tail = NULL;
    st->busy = true;
    st->gen = t->gen;
    st->link = t->link;
    w->computing = true;
    w->t_progress = hs_now_s();
    pthread_mutex_unlock(&pr->lock);

    const hs_layout_t *layout = &pr->cfg->layout;
    hs_batch_view_t v = hs_batch_view(st->buf, t->n_seqs, t->n_tokens, layout);
    hs_batch_header_init(v.header, t->epoch, t->batch, t->n_seqs, t->n_tokens, layout,
                         hs_plan_hash(pr->plan));
    hs_status_t fst = hs_plan_fill_batch(pr->plan, pr->ds, t->batch, &v);
    if (fst != HS_OK) { /* the dataset changed under us: logged, the run cannot go on */
        free(t);
        pthread_mutex_lock(&pr->lock);
        st->busy = false;
        pr->result = fst;
        pr->stop = true;
        pthread_cond_broadcast(&pr->cond);
        pthread_mutex_unlock(&pr->lock);
        hs_tp_wakeup(pr->tp);
        return fst;
    }
    memset(out, 0, sizeof(*out));
    out->ticket = t->id;
    out->epoch = t->epoch;
    out->batch = t->batch;
    out->n_seqs = t->n_seqs;
    out->n_tokens = t->n_tokens;
    out->hidden_size = layout->hidden_size;
    out->n_layers = layout->n_layers;
    out->cu_seqlens = v.cu_seqlens;
    out->sample_ids = v.sample_ids;
    out->input_ids = v.input_ids;
    out->loss_mask = v.loss_mask;
    out->hidden = v.hidden;
    out->bytes = t->bytes;
    out->handle = (uint64_t)(uintptr_t)st;
    w->t_taken = hs_now_s();
    free(t);
    return HS_OK;
}

hs_status_code_t hs_producer_submit(hs_producer_t *pr, const hs_work_t *work)
{
    worker_t *w = &pr->workers[0];
    staging_t *st = NULL;
    for (int i = 0; i < STAGING_PER_WORKER; i++)
        if ((uintptr_t)&w->staging[i] == work->handle && w->staging[i].busy) st = &w->staging[i];
    if (!st) {
        hs_error("hs_producer_submit: not a batch taken with hs_producer_next (or sent twice)");
        return HS_ERR_INVALID;
    }
    outgoing_t *o = calloc(1, sizeof(*o));
    if (!o) return HS_ERR_NOMEM;
    hs_batch_seal(st->buf, work->bytes);
    o->t = (ticket_t){NULL,           work->ticket, work->epoch, work->batch, work->n_seqs,
                      work->n_tokens, work->bytes,  st->gen,     st->link};
    o->st = st;
    o->worker = 0;
    o->checksum = ((hs_batch_header_t *)st->buf)->checksum;
    pthread_mutex_lock(&pr->lock);
    double now = hs_now_s();
    o->compute_ns = (uint64_t)((now - w->t_taken) * 1e9);
    w->busy_s += now - w->t_taken;
    w->computing = false;
    w->t_progress = now;
    w->batches++;
    w->tokens += work->n_tokens;
    w->bytes += work->bytes;
    o->next = pr->outbox;
    pr->outbox = o;
    pthread_mutex_unlock(&pr->lock);
    hs_tp_wakeup(pr->tp);
    return HS_OK;
}

hs_status_code_t hs_producer_info(const hs_producer_t *pr, hs_producer_info_t *out)
{
    if (!pr || !out) return HS_ERR_INVALID;
    hs_producer_info_t info = {0};
    info.plan_hash = hs_plan_hash(pr->plan);
    info.n_batches = hs_plan_n_batches(pr->plan);
    for (uint32_t b = 0; b < info.n_batches; b++) {
        hs_plan_batch_t pb;
        hs_plan_batch(pr->plan, b, &pb);
        if (pb.n_tokens > info.max_batch_tokens) info.max_batch_tokens = pb.n_tokens;
    }
    for (int i = 0; i < STAGING_PER_WORKER && i < 2; i++)
        info.staging[i] = pr->workers[0].staging[i].buf;
    info.staging_bytes = pr->max_batch_bytes;
    *out = info;
    return HS_OK;
}

void hs_producer_close(hs_producer_t *pr)
{
    if (!pr) return;
    if (pr->net_started) {
        pr->close_requested = true;
        hs_tp_wakeup(pr->tp);
        pthread_join(pr->net_thread, NULL);
    }
    producer_free(pr);
}
