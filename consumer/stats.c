/* SPDX-License-Identifier: Apache-2.0 */
/* stats.c - the consumer's figures: hs_consumer_stats() from the delivery
 * counters, the cache and the network thread's snapshot; the derived
 * progress, ETAs and bottleneck; the status line and the summary's JSON. */
#include "consumer_int.h"
#include "hs_time.h"
#include "hs_window.h"

#include <stdio.h>
#include <string.h>

/* ---- the network thread's snapshot ------------------------------------------ */

/* What start-up waits for, in a few words, or "" once batches flow. */
static void startup_waiting(hs_consumer_t *c, char *buf, size_t cap)
{
    buf[0] = 0;
    if (!c->run.have_run) {
        const pending_plan_t *pp = c->run.pending;
        const peer_t *sender = NULL;
        for (const peer_t *p = c->net.peers; pp && p; p = p->next)
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
void hs__stats_snapshot(hs_consumer_t *c)
{
    hs_consumer_stats_t s = {0};
    double stall = 0;
    for (peer_t *p = c->net.peers; p; p = p->next)
        if (p->conn && p->state == PEER_READY) {
            s.producers_connected++;
            stall += p->stall_pct;
            const char *k = hs_tp_conn_kind(p->conn);
            if (strcmp(k, "shm") == 0)
                s.producers_shm++;
            else if (strcmp(k, "ucx") == 0)
                s.producers_ucx++;
            else
                s.producers_tcp++;
        }
    /* Once every producer has left, the last figure stands (the summary's). */
    s.producer_stall_pct = s.producers_connected ? stall / (double)s.producers_connected
                                                 : c->delivery.snap.producer_stall_pct;
    if (c->net.sched) {
        hs_sched_stats_t ss;
        hs_sched_stats(c->net.sched, &ss);
        s.duplicates = ss.duplicates;
        s.tickets_out = ss.leased;
    }
    s.protocol_errors = c->net.n_proto_errors;
    s.producers_seen = c->net.n_seen;
    s.producers_seen_shm = c->net.n_seen_shm;
    s.producers_seen_tcp = c->net.n_seen_tcp;
    s.producers_seen_ucx = c->net.n_seen_ucx;
    s.producers_dropped = c->net.n_dropped;
    s.leases_returned = c->net.leases_returned;
    s.store_hits = c->net.store_hits;
    s.store_misses = c->net.store_misses;
    s.store_bad = c->net.store_bad;
    char waiting[sizeof(c->delivery.waiting)];
    startup_waiting(c, waiting, sizeof(waiting));
    pthread_mutex_lock(&c->delivery.lock);
    memcpy(c->delivery.waiting, waiting, sizeof(waiting));
    c->delivery.snap = s;
    if (s.producers_connected) c->delivery.t_producer_seen = hs_now_s();
    pthread_mutex_unlock(&c->delivery.lock);
}

/* ---- the figures ------------------------------------------------------------ */

/* A side waiting this share of the time or more is waiting on the other. */
#define HS_WAIT_PCT_LIMIT 20.0
/* Checksum threads busy this share of their time or more are the limit when
 * both sides wait. */
#define HS_VERIFY_BUSY_PCT 60.0
/* The ETAs are shown once the window spans this long and this many batches. */
#define HS_ETA_MIN_WINDOW_S 5.0
#define HS_ETA_MIN_BATCHES 5

/* The window's counters. */
enum { W_BATCHES, W_TOKENS, W_BYTES, W_STARVE, W_VERIFY };

/* Epoch, progress, the run's rates, and from the window's rates the ETAs
 * and the bottleneck. The trainer's own rate counts only the time it had
 * data. */
static void stats_derive(hs_consumer_stats_t *s, double window_batches)
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
    uint64_t epoch_end = (uint64_t)s->epoch * per_epoch;
    uint64_t left_run = s->batches_planned - s->batches_delivered;
    uint64_t left_epoch = epoch_end > done ? epoch_end - done : 0;
    if (!left_run) {
        s->eta_run_s = s->eta_epoch_s = 0;
    } else if (s->window_s >= HS_ETA_MIN_WINDOW_S && window_batches >= HS_ETA_MIN_BATCHES &&
               s->recent_supply_batches_per_s > 0) {
        s->eta_run_s = (double)left_run / s->recent_supply_batches_per_s;
        s->eta_epoch_s = (double)left_epoch / s->recent_supply_batches_per_s;
    }
    if (s->batches_delivered < 2 || s->seconds < 1.0) return;
    bool starving = s->recent_starve_pct >= HS_WAIT_PCT_LIMIT;
    bool stalled = s->producer_stall_pct >= HS_WAIT_PCT_LIMIT;
    bool verifying = s->recent_verify_pct >= HS_VERIFY_BUSY_PCT;
    if (starving && verifying)
        s->bottleneck = HS_BOTTLENECK_VERIFY;
    else if (starving && stalled)
        s->bottleneck = HS_BOTTLENECK_NETWORK;
    else if (starving)
        s->bottleneck = HS_BOTTLENECK_PRODUCERS;
    else if (stalled)
        s->bottleneck = HS_BOTTLENECK_TRAINER;
    else
        s->bottleneck = HS_BOTTLENECK_BALANCED;
}

void hs_consumer_stats(hs_consumer_t *c, hs_consumer_stats_t *s)
{
    memset(s, 0, sizeof(*s));
    hs_cache_stats_t cs;
    hs_cache_stats(c->cache, &cs);
    double verify_s = hs__verify_pool_busy_s(c->verify); /* its own lock, taken first */
    pthread_mutex_lock(&c->delivery.lock);
    s->batches_planned = c->delivery.batches_planned;
    s->batches_resumed = c->delivery.batches_resumed;
    s->batches_delivered = c->delivery.batches_delivered;
    if (c->delivery.t_start > 0) { /* set under this lock after the run's fields */
        s->target_fingerprint = c->run.target_fingerprint;
        snprintf(s->target_name, sizeof(s->target_name), "%s", c->run.target_name);
    }
    s->checksum_failures = c->delivery.checksum_failures;
    s->bytes_received = c->delivery.bytes_received;
    s->tokens_delivered = c->delivery.tokens_delivered;
    s->finished = c->delivery.finished && !c->delivery.ready_n && !c->delivery.held_back;
    double t0 = c->delivery.t_start;
    double now = c->delivery.t_end > 0 ? c->delivery.t_end : hs_now_s();
    s->seconds = t0 > 0 ? now - t0 : 0;
    /* a wait in progress counts as far as it has gone */
    double starve_s = c->delivery.starve_s;
    if (t0 > 0 && c->delivery.t_wait > 0 && c->delivery.t_end == 0)
        starve_s += now - (c->delivery.t_wait > t0 ? c->delivery.t_wait : t0);
    s->starve_pct = s->seconds > 0 ? 100.0 * starve_s / s->seconds : 0;
    s->h2d_bytes = c->delivery.h2d_bytes;
    s->h2d_gbytes_per_s =
        c->delivery.h2d_s > 0 ? (double)c->delivery.h2d_bytes / c->delivery.h2d_s / 1e9 : 0;
    /* The network thread's own figures, as of its last snapshot. */
    s->duplicates = c->delivery.snap.duplicates;
    s->tickets_out = c->delivery.snap.tickets_out;
    s->protocol_errors = c->delivery.snap.protocol_errors;
    s->producers_seen = c->delivery.snap.producers_seen;
    s->producers_dropped = c->delivery.snap.producers_dropped;
    s->leases_returned = c->delivery.snap.leases_returned;
    s->producers_connected = c->delivery.snap.producers_connected;
    s->producers_shm = c->delivery.snap.producers_shm;
    s->producers_tcp = c->delivery.snap.producers_tcp;
    s->producers_ucx = c->delivery.snap.producers_ucx;
    s->producers_seen_shm = c->delivery.snap.producers_seen_shm;
    s->producers_seen_tcp = c->delivery.snap.producers_seen_tcp;
    s->producers_seen_ucx = c->delivery.snap.producers_seen_ucx;
    s->producer_stall_pct = c->delivery.snap.producer_stall_pct;
    s->store_hits = c->delivery.snap.store_hits;
    s->store_misses = c->delivery.snap.store_misses;
    s->store_bad = c->delivery.snap.store_bad;
    /* The window: from the first ticket (all counters 0 then) to now. */
    hs_window_sample_t cur = {.t = now}, base = {0};
    cur.v[W_BATCHES] = (double)s->batches_delivered;
    cur.v[W_TOKENS] = (double)s->tokens_delivered;
    cur.v[W_BYTES] = (double)s->bytes_received;
    cur.v[W_STARVE] = starve_s;
    cur.v[W_VERIFY] = verify_s;
    bool have_base = false;
    if (t0 > 0) {
        if (!c->window.n) {
            hs_window_sample_t start = {.t = t0};
            (void)hs_window_take(&c->window, &start, &base);
        }
        have_base = hs_window_take(&c->window, &cur, &base);
    }
    pthread_mutex_unlock(&c->delivery.lock);
    if (c->store) {
        hs_store_stats_t ss;
        hs_store_stats(c->store, &ss);
        s->store_writes = ss.writes;
        s->store_skipped = ss.skipped;
        s->store_batches = ss.batches;
        s->store_bytes_written = ss.write_bytes;
        s->store_full = ss.full;
    }
    s->epochs = c->cfg.epochs;
    s->cache_capacity = cs.capacity;
    s->cache_used = cs.used;
    s->cache_high_water = cs.high_water;
    s->cache_ready_bytes = cs.ready_bytes;
    s->cache_prepare_s = cs.prepare_s;
    s->verify_threads = c->cfg.verify_threads;
    double threads = s->verify_threads ? (double)s->verify_threads : 1;
    s->verify_pct = s->seconds > 0 ? 100.0 * verify_s / (s->seconds * threads) : 0;
    double window_batches = 0;
    if (have_base && now > base.t) {
        double ws = now - base.t, d[HS_WINDOW_VALUES];
        for (int i = 0; i < HS_WINDOW_VALUES; i++)
            d[i] = cur.v[i] - base.v[i];
        s->window_s = ws;
        window_batches = d[W_BATCHES];
        s->recent_supply_batches_per_s = d[W_BATCHES] / ws;
        s->recent_tokens_per_s = d[W_TOKENS] / ws;
        s->recent_gbytes_per_s = d[W_BYTES] / ws / 1e9;
        s->recent_starve_pct = 100.0 * d[W_STARVE] / ws;
        double fed = ws - d[W_STARVE];
        s->recent_trainer_batches_per_s = fed > 0.01 * ws ? d[W_BATCHES] / fed : 0;
        s->recent_verify_pct = 100.0 * d[W_VERIFY] / (ws * threads);
    }
    stats_derive(s, window_batches);
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
    case HS_BOTTLENECK_VERIFY:
        return "verify";
    case HS_BOTTLENECK_BALANCED:
        return "balanced";
    default:
        return "unknown";
    }
}

int hs_consumer_bottleneck_text(const hs_consumer_stats_t *s, char *buf, size_t cap)
{
    /* At the end of a run every producer has left: name those seen. */
    unsigned long long np =
        (unsigned long long)(s->producers_connected ? s->producers_connected : s->producers_seen);
    /* every figure from the recent window, as the choice of the limit */
    switch (s->bottleneck) {
    case HS_BOTTLENECK_PRODUCERS:
        return snprintf(buf, cap,
                        "producers are the limit: %llu producer%s give %.3g batch/s, the trainer "
                        "waits for data %.0f%% of the time",
                        np, np == 1 ? "" : "s", s->recent_supply_batches_per_s,
                        s->recent_starve_pct);
    case HS_BOTTLENECK_TRAINER:
        return snprintf(buf, cap,
                        "the trainer is the limit: it takes %.3g batch/s, producers wait for "
                        "tickets %.0f%% of the time",
                        s->recent_trainer_batches_per_s, s->producer_stall_pct);
    case HS_BOTTLENECK_NETWORK:
        return snprintf(buf, cap,
                        "the network is the limit: %.3g GB/s arrive, producers wait for tickets "
                        "%.0f%% and the trainer for data %.0f%% of the time",
                        s->recent_gbytes_per_s, s->producer_stall_pct, s->recent_starve_pct);
    case HS_BOTTLENECK_VERIFY:
        return snprintf(buf, cap,
                        "this consumer's verification is the limit: its %u checksum thread%s "
                        "%s busy %.0f%% of the time while the trainer waits for data %.0f%%; "
                        "raise --verify-threads",
                        s->verify_threads, s->verify_threads == 1 ? "" : "s",
                        s->verify_threads == 1 ? "is" : "are", s->recent_verify_pct,
                        s->recent_starve_pct);
    case HS_BOTTLENECK_BALANCED:
        return snprintf(buf, cap,
                        "no side is the limit: the trainer waits for data %.0f%% and producers "
                        "for tickets %.0f%% of the time, %.3g batch/s",
                        s->recent_starve_pct, s->producer_stall_pct,
                        s->recent_supply_batches_per_s);
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
    char waiting[sizeof(c->delivery.waiting)];
    pthread_mutex_lock(&c->delivery.lock);
    double alone = hs_now_s() - c->delivery.t_producer_seen;
    memcpy(waiting, c->delivery.waiting, sizeof(waiting));
    pthread_mutex_unlock(&c->delivery.lock);
    double secs = s.seconds > 0 ? s.seconds : 1e-9;
    char ee[32], er[32], limit[256], by_transport[96] = "";
    hs_consumer_bottleneck_text(&s, limit, sizeof(limit));
    if (s.producers_connected) { /* " (shm 2, tcp 1)": what carries them */
        const char *names[3] = {"shm", "tcp", "ucx"};
        uint64_t counts[3] = {s.producers_shm, s.producers_tcp, s.producers_ucx};
        size_t bl = 0;
        for (int i = 0; i < 3; i++)
            if (counts[i] && bl < sizeof by_transport)
                bl += (size_t)snprintf(by_transport + bl, sizeof by_transport - bl, "%s%s %llu",
                                       bl ? ", " : " (", names[i], (unsigned long long)counts[i]);
        if (bl && bl < sizeof by_transport)
            snprintf(by_transport + bl, sizeof by_transport - bl, ")");
    }
    /* the last 30 s first, the run's averages in brackets */
    int n = snprintf(
        buf, cap,
        "epoch %u/%u | %llu/%llu batches (%.1f%%) | %.0f tok/s (run %.0f) | %.2f GB/s (run %.2f) | "
        "ETA epoch %s, run %s | cache %.0f%% | tickets out %llu | producers %llu%s | producer "
        "stall "
        "%.0f%% | starve %.0f%% (run %.0f%%) | verify %.0f%% | %s",
        s.epoch, s.epochs, (unsigned long long)s.batches_delivered,
        (unsigned long long)s.batches_planned, s.run_pct, s.recent_tokens_per_s,
        (double)s.tokens_delivered / secs, s.recent_gbytes_per_s,
        (double)s.bytes_received / secs / 1e9, duration_str(s.eta_epoch_s, ee, sizeof(ee)),
        duration_str(s.eta_run_s, er, sizeof(er)),
        s.cache_capacity ? 100.0 * (double)s.cache_used / (double)s.cache_capacity : 0,
        (unsigned long long)s.tickets_out, (unsigned long long)s.producers_connected, by_transport,
        s.producer_stall_pct, s.recent_starve_pct, s.starve_pct, s.recent_verify_pct,
        waiting[0] ? waiting : limit);
    size_t len = n < 0 ? cap : (size_t)n;
    if (c->store && len < cap) {
        n = snprintf(buf + len, cap - len,
                     " | store hits %llu misses %llu writes %llu skipped %llu%s",
                     (unsigned long long)s.store_hits, (unsigned long long)s.store_misses,
                     (unsigned long long)s.store_writes, (unsigned long long)s.store_skipped,
                     s.store_full ? " (disk full)" : "");
        len = n < 0 ? cap : len + (size_t)n;
    }
    if (!s.finished && !s.producers_connected && alone >= c->no_producer_warn_s && len < cap)
        snprintf(buf + len, cap - len,
                 " | no producer connected for %.0f s: waiting; start producers or stop with "
                 "Ctrl-C",
                 alone);
}

/* A name for a JSON string: quotes, backslashes and control bytes become '_'. */
static void json_safe(const char *in, char *out, size_t cap)
{
    size_t n = 0;
    for (; *in && n + 1 < cap; in++)
        out[n++] = (*in == '"' || *in == '\\' || (unsigned char)*in < 0x20) ? '_' : *in;
    out[n] = 0;
}

int hs_consumer_stats_json(const hs_consumer_stats_t *s, char *buf, size_t cap)
{
    double secs = s->seconds > 0 ? s->seconds : 1e-9;
    char target[sizeof(s->target_name)], target_fp[20] = "";
    json_safe(s->target_name, target, sizeof(target));
    if (s->target_fingerprint)
        snprintf(target_fp, sizeof(target_fp), "%016llx",
                 (unsigned long long)s->target_fingerprint);
    char limit[256];
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
        "  \"window_s\": %.3f,\n  \"recent_tokens_per_s\": %.1f,\n"
        "  \"recent_gbytes_per_s\": %.4f,\n  \"recent_supply_batches_per_s\": %.4f,\n"
        "  \"recent_trainer_batches_per_s\": %.4f,\n  \"recent_starve_pct\": %.2f,\n"
        "  \"verify_threads\": %u,\n  \"verify_pct\": %.2f,\n  \"recent_verify_pct\": %.2f,\n"
        "  \"bottleneck\": \"%s\",\n  \"bottleneck_text\": \"%s\",\n"
        "  \"store_hits\": %llu,\n  \"store_misses\": %llu,\n  \"store_writes\": %llu,\n"
        "  \"store_skipped\": %llu,\n  \"store_bad\": %llu,\n  \"store_batches\": %llu,\n"
        "  \"store_bytes_written\": %llu,\n  \"store_full\": %s,\n"
        "  \"producer_transports\": {\"shm\": %llu, \"tcp\": %llu, \"ucx\": %llu},\n"
        "  \"target_fingerprint\": \"%s\",\n  \"target\": \"%s\",\n  \"complete\": %s\n}\n",
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
        s->supply_batches_per_s, s->trainer_batches_per_s, s->window_s, s->recent_tokens_per_s,
        s->recent_gbytes_per_s, s->recent_supply_batches_per_s, s->recent_trainer_batches_per_s,
        s->recent_starve_pct, s->verify_threads, s->verify_pct, s->recent_verify_pct,
        hs_bottleneck_str(s->bottleneck), limit, (unsigned long long)s->store_hits,
        (unsigned long long)s->store_misses, (unsigned long long)s->store_writes,
        (unsigned long long)s->store_skipped, (unsigned long long)s->store_bad,
        (unsigned long long)s->store_batches, (unsigned long long)s->store_bytes_written,
        s->store_full ? "true" : "false", (unsigned long long)s->producers_seen_shm,
        (unsigned long long)s->producers_seen_tcp, (unsigned long long)s->producers_seen_ucx,
        target_fp, target,
        (s->batches_planned || s->batches_resumed) && s->batches_delivered == s->batches_planned
            ? "true"
            : "false");
}
