/* SPDX-License-Identifier: Apache-2.0 */
/* metrics.c - Prometheus text exposition of the consumer's figures. */
#include "metrics_int.h"
#include "hs_log.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#ifdef HS_HAVE_MICROHTTPD
#include <microhttpd.h>
#endif

int hs_metrics_format(const hs_consumer_stats_t *s, char *buf, size_t cap)
{
    /* name, type, help, value */
    struct {
        const char *name, *type, *help;
        double value;
    } m[] = {
        {"hsflow_batches_planned", "gauge", "Batches of every epoch in the plan.",
         (double)s->batches_planned},
        {"hsflow_batches_delivered_total", "counter", "Batches handed to the trainer.",
         (double)s->batches_delivered},
        {"hsflow_tokens_delivered_total", "counter", "Tokens in the delivered batches.",
         (double)s->tokens_delivered},
        {"hsflow_bytes_received_total", "counter", "Payload bytes verified in the cache.",
         (double)s->bytes_received},
        {"hsflow_duplicates_total", "counter", "Batches delivered twice (always 0).",
         (double)s->duplicates},
        {"hsflow_checksum_failures_total", "counter", "Payloads that failed verification.",
         (double)s->checksum_failures},
        {"hsflow_protocol_errors_total", "counter", "Connections cut for a protocol error.",
         (double)s->protocol_errors},
        {"hsflow_producers_connected", "gauge", "Producers receiving tickets now.",
         (double)s->producers_connected},
        {"hsflow_producers_dropped_total", "counter", "Producers cut off.",
         (double)s->producers_dropped},
        {"hsflow_tickets_out", "gauge", "Tickets held by producers now.", (double)s->tickets_out},
        {"hsflow_leases_returned_total", "counter", "Tickets re-queued from dead producers.",
         (double)s->leases_returned},
        {"hsflow_cache_capacity_bytes", "gauge", "Host-RAM cache size.", (double)s->cache_capacity},
        {"hsflow_cache_used_bytes", "gauge", "Cache bytes reserved or holding batches.",
         (double)s->cache_used},
        {"hsflow_cache_ready_bytes", "gauge", "Cache bytes pinned and usable.",
         (double)s->cache_ready_bytes},
        {"hsflow_trainer_starve_ratio", "gauge", "Share of the run the trainer waited for data.",
         s->starve_pct / 100.0},
        {"hsflow_producer_stall_ratio", "gauge", "Mean share of time producers lacked a ticket.",
         s->producer_stall_pct / 100.0},
        {"hsflow_h2d_bytes_total", "counter", "Bytes copied to the trainer's GPU.",
         (double)s->h2d_bytes},
        {"hsflow_run_seconds", "gauge", "Seconds since the plan was known.", s->seconds},
        {"hsflow_epoch", "gauge", "Epoch being delivered, 1-based; 0 before the plan.",
         (double)s->epoch},
        {"hsflow_epochs", "gauge", "Epochs in the run.", (double)s->epochs},
        {"hsflow_run_ratio", "gauge", "Share of the run's batches delivered.", s->run_pct / 100.0},
        {"hsflow_eta_epoch_seconds", "gauge",
         "Time left in this epoch at the recent rate; -1 until that is stable.", s->eta_epoch_s},
        {"hsflow_eta_run_seconds", "gauge",
         "Time left in the run at the recent rate; -1 until that is stable.", s->eta_run_s},
        {"hsflow_supply_batches_per_second", "gauge", "Batches the producers gave per second.",
         s->supply_batches_per_s},
        {"hsflow_trainer_batches_per_second", "gauge",
         "Batches the trainer took per second while it had data.", s->trainer_batches_per_s},
        {"hsflow_window_seconds", "gauge", "Span of the recent window (the last 30 s).",
         s->window_s},
        {"hsflow_recent_tokens_per_second", "gauge", "Tokens delivered per second, recent window.",
         s->recent_tokens_per_s},
        {"hsflow_recent_supply_batches_per_second", "gauge",
         "Batches the producers gave per second, recent window.", s->recent_supply_batches_per_s},
        {"hsflow_recent_trainer_batches_per_second", "gauge",
         "Batches the trainer took per second while it had data, recent window.",
         s->recent_trainer_batches_per_s},
        {"hsflow_recent_trainer_starve_ratio", "gauge",
         "Share of the recent window the trainer waited for data.", s->recent_starve_pct / 100.0},
        {"hsflow_verify_busy_ratio", "gauge",
         "Share of their time the checksum threads spent checking.", s->verify_pct / 100.0},
        {"hsflow_recent_verify_busy_ratio", "gauge",
         "Share of the recent window the checksum threads spent checking.",
         s->recent_verify_pct / 100.0},
    };
    size_t len = 0;
    for (size_t i = 0; i < sizeof(m) / sizeof(m[0]); i++) {
        int n = snprintf(buf + (len < cap ? len : cap), len < cap ? cap - len : 0,
                         "# HELP %s %s\n# TYPE %s %s\n%s %.17g\n", m[i].name, m[i].help, m[i].name,
                         m[i].type, m[i].name, m[i].value);
        if (n < 0) return n;
        len += (size_t)n;
    }
    /* The limit as an enum: one series per value, 1 for the current one. */
    int n = snprintf(buf + (len < cap ? len : cap), len < cap ? cap - len : 0,
                     "# HELP hsflow_bottleneck Which side limits the run (1 = this one).\n"
                     "# TYPE hsflow_bottleneck gauge\n");
    if (n < 0) return n;
    len += (size_t)n;
    for (int32_t b = HS_BOTTLENECK_UNKNOWN; b <= HS_BOTTLENECK_BALANCED; b++) {
        n = snprintf(buf + (len < cap ? len : cap), len < cap ? cap - len : 0,
                     "hsflow_bottleneck{limit=\"%s\"} %d\n", hs_bottleneck_str(b),
                     s->bottleneck == b);
        if (n < 0) return n;
        len += (size_t)n;
    }
    return (int)len;
}

unsigned hs_metrics_conn_limit(uint64_t nofile)
{
    uint64_t share = nofile / HS_METRICS_FD_SHARE;
    if (share < 1) share = 1;
    return share < HS_METRICS_MAX_CONNS ? (unsigned)share : HS_METRICS_MAX_CONNS;
}

#ifdef HS_HAVE_MICROHTTPD

struct hs_metrics {
    struct MHD_Daemon *daemon;
    hs_metrics_stats_cb stats;
    void *arg;
    uint16_t port;
};

static enum MHD_Result answer(void *cls, struct MHD_Connection *conn, const char *url,
                              const char *method, const char *version, const char *upload,
                              size_t *upload_size, void **state)
{
    hs_metrics_t *m = cls;
    (void)version, (void)upload, (void)upload_size, (void)state;
    const char *body = "only GET /metrics and /healthz are served here\n";
    unsigned code = MHD_HTTP_NOT_FOUND;
    char *text = NULL;
    if (!strcmp(method, "GET") && !strcmp(url, "/healthz")) {
        /* 200 while the consumer runs: its version, progress and limit. */
        hs_consumer_stats_t s;
        m->stats(m->arg, &s);
        char limit[256];
        hs_consumer_bottleneck_text(&s, limit, sizeof(limit));
        const char *fmt = "{\"status\": \"ok\", \"version\": \"%s\", \"epoch\": %u, "
                          "\"epochs\": %u, \"run_pct\": %.2f, \"producers_connected\": %llu, "
                          "\"bottleneck\": \"%s\", \"bottleneck_text\": \"%s\"}\n";
        unsigned long long np = (unsigned long long)s.producers_connected;
        const char *b = hs_bottleneck_str(s.bottleneck);
        int n =
            snprintf(NULL, 0, fmt, hsflow_version(), s.epoch, s.epochs, s.run_pct, np, b, limit);
        text = n > 0 ? malloc((size_t)n + 1) : NULL;
        if (text) {
            snprintf(text, (size_t)n + 1, fmt, hsflow_version(), s.epoch, s.epochs, s.run_pct, np,
                     b, limit);
            body = text;
            code = MHD_HTTP_OK;
        }
    } else if (!strcmp(method, "GET") && !strcmp(url, "/metrics")) {
        hs_consumer_stats_t s;
        m->stats(m->arg, &s);
        int n = hs_metrics_format(&s, NULL, 0);
        text = n > 0 ? malloc((size_t)n + 1) : NULL;
        if (text) {
            hs_metrics_format(&s, text, (size_t)n + 1);
            body = text;
            code = MHD_HTTP_OK;
        }
    }
    struct MHD_Response *r = MHD_create_response_from_buffer(
        strlen(body), (void *)body, text ? MHD_RESPMEM_MUST_FREE : MHD_RESPMEM_PERSISTENT);
    if (!r) {
        free(text);
        return MHD_NO;
    }
    MHD_add_response_header(r, "Content-Type",
                            strcmp(url, "/healthz") ? "text/plain; version=0.0.4"
                                                    : "application/json");
    enum MHD_Result ret = MHD_queue_response(conn, code, r);
    MHD_destroy_response(r);
    return ret;
}

/* libmicrohttpd's own messages (a reader that hung up mid-request, one
 * refused at the limit) are the readers' doing, one per connection: at
 * debug level, so a flood of readers cannot flood the log. */
static void mhd_log(void *cls, const char *fmt, va_list ap)
{
    (void)cls;
    if (hs_log_get_level() < HS_LOG_DEBUG) return;
    char text[512];
    vsnprintf(text, sizeof text, fmt, ap);
    size_t n = strlen(text);
    while (n && text[n - 1] == '\n')
        text[--n] = 0;
    hs_debug("metrics: %s", text);
}

hs_status_t hs_metrics_start(hs_metrics_stats_cb stats, void *arg, const char *host, uint16_t port,
                             hs_metrics_t **out)
{
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(port)};
    if (inet_pton(AF_INET, host, &sa.sin_addr) != 1) {
        hs_error("--metrics: '%s' is not an IPv4 address (e.g. 0.0.0.0 or 127.0.0.1)", host);
        return HS_ERR_INVALID;
    }
    hs_metrics_t *m = calloc(1, sizeof(*m));
    if (!m) return HS_ERR_NOMEM;
    m->stats = stats;
    m->arg = arg;
    /* Nobody has to prove anything to read the figures, so what readers can
     * hold is bounded: a few connections (a share of the descriptor limit,
     * the rest kept for producers), fewer from one address, each closed
     * after a few idle seconds. Past the limit the server stops accepting;
     * waiting connections cost the consumer no descriptor. */
    struct rlimit rl;
    uint64_t nofile = getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY
                          ? (uint64_t)rl.rlim_cur
                          : 1024;
    unsigned limit = hs_metrics_conn_limit(nofile);
    unsigned per_addr = limit < HS_METRICS_MAX_PER_ADDR ? limit : HS_METRICS_MAX_PER_ADDR;
    /* poll(), not epoll: libmicrohttpd 0.9.75 in epoll mode stops accepting
     * for good once it has reached the connection limit; not select(),
     * which cannot watch a descriptor past FD_SETSIZE */
    unsigned flags = MHD_is_feature_supported(MHD_FEATURE_POLL) == MHD_YES
                         ? MHD_USE_POLL_INTERNAL_THREAD
                         : MHD_USE_INTERNAL_POLLING_THREAD;
    m->daemon = MHD_start_daemon(
        flags | MHD_USE_ERROR_LOG, port, NULL, NULL, answer, m, MHD_OPTION_SOCK_ADDR, &sa,
        MHD_OPTION_CONNECTION_LIMIT, limit, MHD_OPTION_PER_IP_CONNECTION_LIMIT, per_addr,
        MHD_OPTION_CONNECTION_TIMEOUT, HS_METRICS_IDLE_S, MHD_OPTION_CONNECTION_MEMORY_LIMIT,
        (size_t)HS_METRICS_CONN_BYTES, MHD_OPTION_EXTERNAL_LOGGER, mhd_log, NULL, MHD_OPTION_END);
    if (!m->daemon) {
        hs_error("--metrics %s:%u: cannot listen there (port in use?)", host, port);
        free(m);
        return HS_ERR_IO;
    }
    const union MHD_DaemonInfo *info = MHD_get_daemon_info(m->daemon, MHD_DAEMON_INFO_BIND_PORT);
    m->port = info ? info->port : port;
    hs_info("metrics on http://%s:%u/metrics (at most %u connections, %u from one address, %u s "
            "idle)",
            host, m->port, limit, per_addr, HS_METRICS_IDLE_S);
    *out = m;
    return HS_OK;
}

uint16_t hs_metrics_port(const hs_metrics_t *m) { return m->port; }

void hs_metrics_stop(hs_metrics_t *m)
{
    if (!m) return;
    MHD_stop_daemon(m->daemon);
    free(m);
}

#else /* !HS_HAVE_MICROHTTPD */

hs_status_t hs_metrics_start(hs_metrics_stats_cb stats, void *arg, const char *host, uint16_t port,
                             hs_metrics_t **out)
{
    (void)stats, (void)arg, (void)host, (void)port, (void)out;
    hs_error("--metrics needs libmicrohttpd (scripts/install-deps installs it)");
    return HS_ERR_UNSUPPORTED;
}
uint16_t hs_metrics_port(const hs_metrics_t *m)
{
    (void)m;
    return 0;
}
void hs_metrics_stop(hs_metrics_t *m) { (void)m; }
#endif
