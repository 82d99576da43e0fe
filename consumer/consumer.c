/* SPDX-License-Identifier: Apache-2.0 */
/* consumer.c - the consumer engine: accepts producers, runs the handshake,
 * hands out tickets against reserved cache slots, receives payloads straight
 * into those slots, verifies them on checksum threads, and delivers batches
 * one at a time to the trainer (DESIGN §2). This file creates and destroys
 * it and runs the network thread's loop; consumer_int.h names the parts.
 *
 * Threads:
 *   - the network thread owns the transport, the scheduler and every peer;
 *   - checksum threads verify received batches (jobs in, results out);
 *   - the trainer calls hs_consumer_next()/release() from its own thread.
 * They meet in the verify pool's queues, in the delivery queue (under the
 * delivery lock) and in the cache, which has its own lock. */
#include "consumer_int.h"
#include "metrics_int.h"
#include "options_int.h"
#include "hs_status.h"
#include "hs_log.h"
#include "hs_time.h"
#include "hs_memory.h"
#include "hs_memclaim.h"
#include "hs_parse.h"
#include "hs_version.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* Verify jobs the pool has room for at start (more grow it). */
#define VERIFY_JOBS 256u

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
        hs__peer_drop(c, p, HS_ERR_PROTO, "%s frame carries a payload", hs_msg_type_str(type));
        return;
    }
    switch (type) {
    case HS_MSG_HELLO:
        hs__on_hello(c, p, body, body_len);
        break;
    case HS_MSG_AUTH:
        hs__on_auth(c, p, body, body_len);
        break;
    case HS_MSG_PLAN:
        hs__on_plan(c, p, body, body_len);
        break;
    case HS_MSG_DONE:
        hs__on_done(c, p, body, body_len, payload_bytes);
        break;
    case HS_MSG_RANKS:
        if (p->state != PEER_READY && p->state != PEER_SENDING_PLAN) {
            hs__peer_drop(c, p, HS_ERR_PROTO,
                          "RANKS before the handshake was complete (no WELCOME sent yet)");
            break;
        }
        hs__on_ranks(c, p, body, body_len);
        break;
    case HS_MSG_STATS:
        /* A producer sends STATS only once WELCOMEd (its heartbeat); from
         * a peer not yet admitted, each one would be decoded for nothing,
         * without limit. */
        if (p->state != PEER_READY && p->state != PEER_SENDING_PLAN) {
            hs__peer_drop(c, p, HS_ERR_PROTO,
                          "STATS before the handshake was complete (no WELCOME sent yet)");
            break;
        }
        hs__on_stats(c, p, body, body_len);
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
        hs__peer_drop(c, p, HS_ERR_PROTO, "unexpected %s frame from a producer",
                      hs_msg_type_str(type));
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
    if (!c->net.cache_registered)
        c->net.cache_registered = !hs_cache_register_next(c->cache, cache_register, c->tp);
}

static void *net_main(void *arg)
{
    hs_consumer_t *c = arg;
    /* A store bound to a run defines it before any producer comes: a
     * complete store needs none, and every producer is checked against it. */
    if (c->store && hs_store_run(c->store)) hs__run_from_store(c);
    while (!c->stop) {
        register_ready_chunks(c);
        hs_status_t st = hs_tp_progress(c->tp, c->net.cache_registered ? 200 : 20);
        if (st != HS_OK) { /* the transport's event loop failed (logged there) */
            hs__consumer_fatal(c, "consumer: the transport's event loop failed (%s); stopping",
                               hs_status_str(st));
            break;
        }
        hs__verified_collect(c);
        hs__released_collect(c);
        hs__deliverable_push(c);
        hs__tickets_issue(c);
        hs__stats_snapshot(c);
        double now = hs_now_s();
        hs__handshake_expire(c, now);
        hs__leases_expire(c, now);
        if (now - c->net.t_last_status >= c->status_interval && c->status_interval > 0) {
            c->net.t_last_status = now;
            char line[1024];
            hs_consumer_status_line(c, line, sizeof(line));
            hs_info("%s", line);
        }
    }
    /* Orderly end: BYE went out with the last batch; give it a moment. */
    for (peer_t *p = c->net.peers; p; p = p->next)
        if (p->conn) hs_tp_close(p->conn, HS_ERR_CLOSED);
    for (int i = 0; i < 5 && c->net.peers; i++) {
        if (hs_tp_progress(c->tp, 20) != HS_OK) break;
        hs__verified_collect(c);
    }
    return NULL;
}

/* The run a store holds against the run the configuration pins
 * (--expect-*): HS_ERR_MISMATCH, logged naming each value, when they differ. */
static hs_status_t store_expected(hs_consumer_t *c)
{
    const hs_store_run_t *r = hs_store_run(c->store);
    const hs__run_expect_t *e = &c->expect;
    if (!r) return HS_OK;
    char a[160], b[160];
    bool bad = false;
    if (e->dataset && e->dataset_fingerprint != r->dataset_fingerprint) {
        hs_error("store %s holds dataset %016llx, --expect-dataset is %016llx: give another "
                 "--store, or the expectation of that run",
                 hs_store_dir(c->store), (unsigned long long)r->dataset_fingerprint,
                 (unsigned long long)e->dataset_fingerprint);
        bad = true;
    }
    if (e->plan && e->plan_hash != r->plan_hash) {
        hs_error("store %s holds plan %016llx, --expect-plan is %016llx: give another --store, "
                 "or the expectation of that run",
                 hs_store_dir(c->store), (unsigned long long)r->plan_hash,
                 (unsigned long long)e->plan_hash);
        bad = true;
    }
    if (e->layout && hs_layout_id(&e->layout_v) != hs_layout_id(&r->layout)) {
        hs_layout_spec(&r->layout, a, sizeof(a));
        hs_layout_spec(&e->layout_v, b, sizeof(b));
        hs_error("store %s holds layout %s, --expect-layout is %s: give another --store, or the "
                 "expectation of that run",
                 hs_store_dir(c->store), a, b);
        bad = true;
    }
    if (e->target && e->target_fingerprint != r->target_fingerprint) {
        hs_error("store %s holds the states of target %016llx (%.200s), --expect-target is "
                 "%016llx: give another --store, or the expectation of that run",
                 hs_store_dir(c->store), (unsigned long long)r->target_fingerprint, r->model,
                 (unsigned long long)e->target_fingerprint);
        bad = true;
    }
    return bad ? HS_ERR_MISMATCH : HS_OK;
}

/* The store's writer is done with a slot the trainer released. */
void hs__store_slot_free(void *arg, uint64_t offset)
{
    hs_consumer_t *c = arg;
    if (hs_cache_free(c->cache, offset) == HS_OK) hs_tp_wakeup(c->tp);
}

/* The transport's close callback: the peer is gone; a plan it was sending
 * is restarted with another (handshake.c). */
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
        c->net.n_proto_errors++;
    p->conn = NULL;
    p->state = PEER_GONE;
    if (c->run.pending && c->run.pending->sender == p->id) {
        hs_warn("producer %s left before its plan was complete (%u of %u batches); the plan is "
                "discarded",
                p->name, c->run.pending->received, c->run.pending->offer.n_batches);
        hs__plan_restart(c);
    }
    hs__peer_reap(c, p);
}

/* The metrics endpoint's thread asks for the figures through this. */
static void metrics_stats(void *arg, hs_consumer_stats_t *s) { hs_consumer_stats(arg, s); }

static const hs_tp_callbacks_t consumer_callbacks = {
    .on_accept = hs__peer_accepted,
    .on_frame = cb_frame,
    .on_payload = hs__payload_landed,
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
    char invalid[320];
    hs_consumer_config_t checked = *cfg;
    if (checked.deliver == 0) checked.deliver = HS_HIDDEN_BF16; /* 0 means the same */
    if (hs__consumer_options_check(&checked, invalid, sizeof(invalid)) != HS_OK) {
        hs_error("consumer: %s", invalid);
        return HS_ERR_INVALID;
    }
    if (cfg->rank >= cfg->world) {
        hs_error("consumer: rank %u of a world of %u: the rank must be 0..world-1 (--rank R "
                 "--world W, or torchrun's RANK and WORLD_SIZE)",
                 cfg->rank, cfg->world);
        return HS_ERR_INVALID;
    }
    if (!(cfg->status_interval_s <= 1e6)) {
        hs_error("consumer: status interval %g s: expected seconds up to 1000000 (0 = the "
                 "default, negative = never)",
                 cfg->status_interval_s);
        return HS_ERR_INVALID;
    }
    hs__run_expect_t expect;
    st = hs__expect_parse(cfg, &expect);
    if (st != HS_OK) return st;
    /* Claimed in the node's registry as it is checked, so a second consumer
     * on this node counts this cache before it has filled. */
    char who[400];
    snprintf(who, sizeof(who), "hs consumer rank %u of %u listening on %s:%u", cfg->rank,
             cfg->world, cfg->listen_host ? cfg->listen_host : "0.0.0.0", cfg->listen_port);
    hs_mem_claim_t *claim;
    st = hs_cache_claim_room(cfg->cache_bytes, cfg->force, who, &claim);
    if (st != HS_OK) return st;
    hs_consumer_t *c = calloc(1, sizeof(*c));
    if (!c) {
        hs_mem_claim_release(claim);
        return HS_ERR_NOMEM;
    }
    c->mem_claim = claim;
    c->cfg = *cfg;
    c->expect = expect;
    /* the config's strings are the caller's: none is kept past create */
    c->cfg.expect_plan = c->cfg.expect_layout = c->cfg.expect_dataset = NULL;
    c->cfg.expect_target = NULL;
    c->net.frame_buf = malloc(HS__FRAME_BUF_BYTES);
    if (!c->net.frame_buf) {
        hs_mem_claim_release(c->mem_claim);
        free(c);
        return HS_ERR_NOMEM;
    }
    hs_msg_arena_init(&c->net.msg_arena);
    c->status_interval = cfg->status_interval_s == 0 ? 5.0 : cfg->status_interval_s;
    c->handshake_timeout_s = cfg->handshake_timeout_s > 0 ? cfg->handshake_timeout_s : 15.0;
    c->no_producer_warn_s = cfg->no_producer_warn_s > 0 ? cfg->no_producer_warn_s : 30.0;
    c->delivery.t_producer_seen = hs_now_s();
    pthread_mutex_init(&c->delivery.lock, NULL);
    pthread_cond_init(&c->delivery.cond, NULL);
    char host[64];
    gethostname(host, sizeof(host));
    host[sizeof(host) - 1] = 0;
    snprintf(c->name, sizeof(c->name), "%s:%d", host, (int)getpid());
    randombytes_buf(&c->session_id, sizeof(c->session_id));
    while (!c->instance_id)
        randombytes_buf(&c->instance_id, sizeof(c->instance_id));
    struct timespec now_rt;
    clock_gettime(CLOCK_REALTIME, &now_rt);
    c->started_unix_ms = (uint64_t)now_rt.tv_sec * 1000u + (uint64_t)now_rt.tv_nsec / 1000000u;

    if (cfg->secret_file) {
        st = hs_auth_load_secret(cfg->secret_file, &c->key);
        if (st != HS_OK) goto err_free;
        c->have_secret = true;
    }
    if (cfg->gpu >= 0) {
        st = hs__loader_create(cfg->gpu, &c->gpu.loader);
        if (st != HS_OK) goto err_free;
    }
    c->gpu.cur = c->gpu.inflight = -1;
    /* With a GPU the cache is pinned chunk by chunk in the background and
     * grows as chunks become ready, so producers can start at once. */
    hs_cache_config_t cc = {.capacity = cfg->cache_bytes,
                            .flags = HS_CACHE_REGISTERED | (cfg->gpu >= 0 ? HS_CACHE_PIN_CUDA : 0),
                            .cuda_device = cfg->gpu};
    st = hs__resume_load(c, cfg);
    if (st != HS_OK) goto err_free;
    if (cfg->journal) {
        st = hs_journal_open(cfg->journal, &c->journal);
        if (st != HS_OK) goto err_free;
        if (c->run.resume_given) hs_journal_discard(c->journal);
        char why[512];
        st = hs_journal_set_shard(c->journal, cfg->rank, cfg->world, cfg->uneven, why, sizeof(why));
        if (st != HS_OK) {
            hs_error("consumer: %s", why);
            goto err_free;
        }
    }
    if (cfg->store) {
        st = hs_store_open(cfg->store, &c->store);
        if (st == HS_OK) st = store_expected(c);
        if (st != HS_OK) goto err_free;
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
        hs_error("consumer: unknown transport '%s': use auto, shm, tcp or ucx", cfg->transport);
        goto err_cache;
    }
    tc.peer_timeout_s = cfg->peer_timeout_s;
    tc.net_devices = cfg->net_devices;
    tc.require_rdma = cfg->require_rdma;
    tc.auth_key = c->have_secret ? &c->key : NULL; /* copied: c->key stays ours */
    tc.allow_remote = cfg->insecure;
    tc.tcp_sockbuf = cfg->tcp_sockbuf;
    tc.ucx_no_memh = cfg->ucx_no_memh;
    tc.shm_copiers = hs__consumer_option_u32(cfg, "shm_copiers");
    tc.fault = hs__consumer_fault();
    st = hs_tp_create(&tc, &consumer_callbacks, c, &c->tp);
    if (st != HS_OK) goto err_cache;
    st = hs_tp_listen(c->tp, cfg->listen_host, cfg->listen_port, &c->port);
    if (st != HS_OK) goto err_tp;

    st = hs__verify_pool_create(cfg->verify_threads, VERIFY_JOBS, hs__verify_check, hs__verify_wake,
                                c, &c->verify);
    if (st != HS_OK) goto err_tp;
    if (cfg->metrics) {
        char mhost[64];
        uint16_t mport;
        if (hs_parse_hostport(cfg->metrics, mhost, sizeof(mhost), &mport) != HS_OK) {
            hs_error("consumer: metrics address '%s' is not HOST:PORT", cfg->metrics);
            st = HS_ERR_INVALID;
            goto err_threads;
        }
        st = hs_metrics_start(metrics_stats, c, mhost, mport, &c->metrics);
        if (st != HS_OK) goto err_threads;
    }
    if (pthread_create(&c->net.thread, NULL, net_main, c) != 0) {
        st = HS_ERR_NOMEM;
        goto err_threads;
    }
    hs_info("hsflow %s listening on %s:%u (%s), cache %.2f GiB, %u epoch(s), order %s, rank %u "
            "of %u (uneven %s), %s",
            hs_version_line(), cfg->listen_host, c->port, hs_tp_kind_describe(c->tp),
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
    hs__verify_pool_destroy(c->verify);
err_tp:
    hs_tp_destroy(c->tp);
err_cache:
    hs_cache_destroy(c->cache);
err_free:
    hs_store_close(c->store);
    hs_journal_close(c->journal);
    hs_state_destroy(c->run.resume);
    hs__loader_destroy(c->gpu.loader);
    free(c->net.frame_buf);
    hs_mem_claim_release(c->mem_claim);
    free(c);
    return st;
}

uint16_t hs_consumer_port(const hs_consumer_t *c) { return c->port; }

uint16_t hs_consumer_metrics_port(const hs_consumer_t *c)
{
    return c->metrics ? hs_metrics_port(c->metrics) : 0;
}

void hs_consumer_destroy(hs_consumer_t *c)
{
    if (!c) return;
    pthread_mutex_lock(&c->delivery.lock);
    if (c->delivery.t_end == 0) c->delivery.t_end = hs_now_s();
    pthread_mutex_unlock(&c->delivery.lock);
    hs_metrics_stop(c->metrics); /* its thread reads the stats below */
    c->stop = true;
    hs_tp_wakeup(c->tp);
    pthread_join(c->net.thread, NULL);
    hs__verify_pool_stop(c->verify);
    /* Copies in flight finish first: their callbacks free slots and wake the
     * transport, which must still exist. */
    hs__loader_destroy(c->gpu.loader);
    /* The store's writer finishes what is queued: it reads cache slots and
     * frees those the trainer released, waking the transport. */
    hs_store_close(c->store);
    hs_tp_destroy(c->tp);
    /* Only now: the transport's last progress can still land a payload and
     * queue its job (hs__payload_landed), after the verify threads have gone. */
    hs__verify_pool_destroy(c->verify);
    hs__peers_free(c);
    hs_sched_destroy(c->net.sched);
    hs_cache_destroy(c->cache);
    hs_mem_claim_release(c->mem_claim); /* after the unmap: the memory is back */
    hs_journal_close(c->journal);
    hs_state_destroy(c->run.resume);
    hs_state_destroy(c->delivery.position);
    hs_auth_key_clear(&c->key);
    hs__plan_discard(c);
    free(c->delivery.ready);
    free(c->delivery.released);
    for (uint32_t i = 0; i < c->handed.n; i++)
        hs_aligned_free(c->handed.v[i].rows);
    for (uint32_t i = 0; i < c->handed.n_free; i++)
        hs_aligned_free(c->handed.free_rows[i]);
    free(c->handed.free_rows);
    free(c->handed.v);
    pthread_mutex_destroy(&c->delivery.lock);
    pthread_cond_destroy(&c->delivery.cond);
    free(c->net.frame_buf);
    free(c);
}

const char *hsflow_status_str(hs_status_code_t status) { return hs_status_str(status); }
