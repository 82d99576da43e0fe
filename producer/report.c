/* SPDX-License-Identifier: Apache-2.0 */
/* report.c - what the producer tells about its run: STATS (the heartbeat
 * the consumer's lease watches), the live status line naming the limit, and
 * the summary at the end (log and --summary-json). */
#include "report_int.h"
#include "hs_status.h"
#include "hs_log.h"
#include "hs_time.h"
#include "hs_window.h"
#include "hs_outfile.h"

#include <math.h>

#include <stdio.h>

#include "session_int.h"

/* The window's counters. */
enum { R_TOKENS, R_BATCHES, R_BYTES, R_BUSY, R_STALL, R_N };

/* A share of the recent window in percent: part_s seconds of n workers'
 * time over span_s seconds. A stall that began before the window is
 * counted whole when it ends, so part_s can pass n * span_s: the share is
 * capped at 100 (STATS carries a percentage, which the sender checks). */
double hs__report_share_pct(double part_s, double span_s, uint32_t n)
{
    if (n == 0 || span_s <= 0 || part_s <= 0) return 0;
    return fmin(100.0, 100.0 * part_s / span_s / n);
}

/* The workers' totals now, a wait for a ticket in progress included, and
 * the run's start. Under sh.lock. */
static double totals_locked(producer_t *pr, double now, double v[R_N])
{
    double t0 = pr->sh.t_start;
    for (int k = 0; k < R_N; k++)
        v[k] = 0;
    for (uint32_t i = 0; i < pr->cfg->n_workers; i++) {
        const worker_t *w = &pr->workers[i];
        v[R_TOKENS] += (double)w->tokens;
        v[R_BATCHES] += (double)w->batches;
        v[R_BYTES] += (double)w->bytes;
        v[R_BUSY] += w->busy_s;
        v[R_STALL] += w->stall_s;
        if (t0 > 0 && w->t_stall > 0) v[R_STALL] += now - (w->t_stall > t0 ? w->t_stall : t0);
    }
    return t0;
}

/* The counters over the recent window into d[] (the run's, since the first
 * WELCOME, while the window is empty); returns its span, 0 before the run.
 * The network thread. */
static double window_of(producer_t *pr, double now, double t0, const double v[R_N], double d[R_N])
{
    for (int k = 0; k < R_N; k++)
        d[k] = v[k];
    if (t0 <= 0 || now <= t0) return 0;
    hs_window_sample_t cur = {.t = now}, base = {0};
    for (int k = 0; k < R_N; k++)
        cur.v[k] = v[k];
    if (!pr->net.window.n) {
        hs_window_sample_t start = {.t = t0}; /* every counter 0 */
        (void)hs_window_take(&pr->net.window, &start, &base);
    }
    if (!hs_window_take(&pr->net.window, &cur, &base) || base.t >= now) return now - t0;
    for (int k = 0; k < R_N; k++)
        d[k] = v[k] - base.v[k];
    return now - base.t;
}

void hs__report_send_stats(producer_t *pr)
{
    Hsflow__Stats s = HSFLOW__STATS__INIT;
    uint32_t n = pr->cfg->n_workers;
    double v[R_N], d[R_N];
    bool progressing = false;
    pthread_mutex_lock(&pr->sh.lock);
    /* read under the lock: a worker that ended a stall while this thread
     * waited for it has counted time up to its own clock */
    double now = hs_now_s();
    double t0 = totals_locked(pr, now, v);
    for (uint32_t i = 0; i < n; i++) {
        worker_t *w = &pr->workers[i];
        /* A worker that took or finished a batch since the last beat made
         * progress; so did one inside a batch whose thread kept computing
         * (1 ms of CPU at least: a thread blocked in a wait gets none, one
         * computing on a loaded machine still gets that much). A hung
         * worker does neither. */
        if (w->t_progress > pr->net.t_beat) progressing = true;
        struct timespec ts;
        if (w->has_cpu_clock && clock_gettime(w->cpu_clock, &ts) == 0) {
            uint64_t cpu = (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
            if (w->computing && cpu - w->cpu_ns_seen >= 1000000u) progressing = true;
            w->cpu_ns_seen = cpu;
        }
    }
    pr->net.t_beat = now;
    pthread_mutex_unlock(&pr->sh.lock);
    double elapsed = t0 > 0 ? now - t0 : 0;
    double ws = window_of(pr, now, t0, v, d);
    s.progressing = progressing;
    s.worker_count = n;
    s.tokens = (uint64_t)v[R_TOKENS];
    s.batches = (uint64_t)v[R_BATCHES];
    /* over the recent window, as the consumer's own figures: the limit it
     * names compares the two */
    s.stall_pct = hs__report_share_pct(d[R_STALL], ws, n);
    s.tokens_per_s = ws > 0 ? d[R_TOKENS] / ws : 0;
    s.uptime_ns = (uint64_t)(elapsed * 1e9);
    for (uint32_t i = 0; i < pr->net.n_links; i++)
        if (pr->net.links[i].welcomed) hs__link_send_msg(&pr->net.links[i], HS_MSG_STATS, &s.base);
}

/* One live status line: rates, worker busy and stall over the recent
 * window (the run's averages in brackets), and the limit from the window. */
void hs__report_print_status(producer_t *pr)
{
    uint32_t n = pr->cfg->n_workers;
    double v[R_N], d[R_N];
    pthread_mutex_lock(&pr->sh.lock);
    double now = hs_now_s(); /* under the lock, as in send_stats */
    double t0 = totals_locked(pr, now, v);
    uint32_t queued = 0;
    for (ticket_t *t = pr->sh.tickets; t; t = t->next)
        queued++;
    uint32_t epoch = pr->sh.epoch_seen + 1, epochs = pr->sh.epochs;
    pthread_mutex_unlock(&pr->sh.lock);
    double elapsed = t0 > 0 ? now - t0 : 0;
    double ws = window_of(pr, now, t0, v, d);
    if (elapsed <= 0 || ws <= 0) return;
    double busy_pct = hs__report_share_pct(d[R_BUSY], ws, n),
           stall_pct = hs__report_share_pct(d[R_STALL], ws, n);
    /* The limit as this side sees it: workers that wait for tickets wait on
     * the consumer (its trainer, its verification or its cache); workers
     * that compute nearly all the time are the limit; the rest of their
     * time goes to sending. */
    char limit[160];
    if (v[R_BATCHES] < 2)
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
    hs_info("epoch %u/%u | %llu batches | %.0f tok/s (run %.0f) | %.2f batch/s | %.2f GB/s | "
            "tickets queued %u | worker busy %.0f%% (run %.0f%%) | stall %.0f%% (run %.0f%%) | %s",
            epoch, epochs, (unsigned long long)v[R_BATCHES], d[R_TOKENS] / ws,
            v[R_TOKENS] / elapsed, d[R_BATCHES] / ws, d[R_BYTES] / ws / 1e9, queued, busy_pct,
            100.0 * v[R_BUSY] / elapsed / n, stall_pct, 100.0 * v[R_STALL] / elapsed / n, limit);
}

void hs__report_print_summary(producer_t *pr)
{
    const hs_producer_config_t *cfg = pr->cfg;
    double elapsed = pr->sh.t_start > 0 ? hs_now_s() - pr->sh.t_start : 0;
    uint64_t tokens = 0, batches = 0;
    hs_outfile_t *of = NULL;
    hs_status_t st = cfg->summary_json ? hs_outfile_open(cfg->summary_json, NULL, 0, &of) : HS_OK;
    FILE *f = of ? hs_outfile_stream(of) : NULL;
    if (f) fprintf(f, "{\n  \"workers\": [\n");
    for (uint32_t i = 0; i < cfg->n_workers; i++) {
        worker_t *w = &pr->workers[i];
        tokens += w->tokens;
        batches += w->batches;
        double busy = elapsed > 0 ? 100.0 * w->busy_s / elapsed : 0;
        double stall = elapsed > 0 ? 100.0 * w->stall_s / elapsed : 0;
        /* GPU workers: the device-to-host copy's own rate (CUDA events), into
         * the staging buffer the transport gave (a shared ring over shm) */
        double d2h_gbs = w->d2h_s > 0 ? (double)w->d2h_bytes / w->d2h_s / 1e9 : 0;
        char d2h[96] = "";
        if (w->d2h_bytes)
            snprintf(d2h, sizeof(d2h), ", device-to-host %.2f GB/s (%.2f GB in %.3f s)", d2h_gbs,
                     (double)w->d2h_bytes / 1e9, w->d2h_s);
        hs_info("worker %u (%s%d): %llu batches, %llu tokens, busy %.0f%%, stall %.0f%%%s", i,
                w->gpu < 0 ? "cpu" : "gpu", w->gpu < 0 ? (int)i : w->gpu,
                (unsigned long long)w->batches, (unsigned long long)w->tokens, busy, stall, d2h);
        if (f)
            fprintf(f,
                    "    {\"worker\": %u, \"gpu\": %d, \"batches\": %llu, \"tokens\": %llu, "
                    "\"busy_pct\": %.2f, \"stall_pct\": %.2f, \"d2h_bytes\": %llu, "
                    "\"d2h_gbytes_per_s\": %.3f}%s\n",
                    i, w->gpu, (unsigned long long)w->batches, (unsigned long long)w->tokens, busy,
                    stall, (unsigned long long)w->d2h_bytes, d2h_gbs,
                    i + 1 < cfg->n_workers ? "," : "");
    }
    hs_info("done: %llu batches, %llu tokens in %.2f s (%.0f tokens/s)",
            (unsigned long long)batches, (unsigned long long)tokens, elapsed,
            elapsed > 0 ? (double)tokens / elapsed : 0);
    if (f) {
        fprintf(f,
                "  ],\n  \"batches\": %llu,\n  \"tokens\": %llu,\n  \"seconds\": %.3f,\n"
                "  \"tokens_per_s\": %.1f,\n  \"status\": \"%s\"\n}\n",
                (unsigned long long)batches, (unsigned long long)tokens, elapsed,
                elapsed > 0 ? (double)tokens / elapsed : 0, hs_status_str(pr->sh.result));
        st = hs_outfile_commit(of);
    }
    if (st != HS_OK && pr->sh.result == HS_OK) pr->sh.result = st; /* logged by hs_outfile */
}
