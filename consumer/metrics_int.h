/* SPDX-License-Identifier: Apache-2.0 */
/* metrics_int.h - the consumer's Prometheus endpoint: GET /metrics on a
 * port of its own (libmicrohttpd, one internal thread), serving the same
 * figures as the status line and the summary.
 *
 * The endpoint asks nothing of its readers, so what they can hold is
 * bounded: at most hs_metrics_conn_limit() connections at once (a share of
 * the process's descriptor limit, the rest kept for producers), at most
 * HS_METRICS_MAX_PER_ADDR from one address, each closed after
 * HS_METRICS_IDLE_S seconds without a byte and holding at most
 * HS_METRICS_CONN_BYTES of request. Past the limit no connection is
 * accepted until one ends: the waiting ones cost no descriptor. */
#ifndef HS_METRICS_INT_H
#define HS_METRICS_INT_H

#include "hsflow.h"
#include <stdint.h>
#include <stddef.h>

#define HS_METRICS_MAX_CONNS 16u    /* connections at once, at most */
#define HS_METRICS_FD_SHARE 16u     /* ... and at most 1/16 of RLIMIT_NOFILE */
#define HS_METRICS_MAX_PER_ADDR 4u  /* from one address */
#define HS_METRICS_IDLE_S 5u        /* a connection silent this long is closed */
#define HS_METRICS_CONN_BYTES 16384 /* request bytes a connection may hold */

typedef struct hs_metrics hs_metrics_t;

/* Connections the endpoint serves at once under a descriptor limit of
 * `nofile`: 1 .. HS_METRICS_MAX_CONNS. */
unsigned hs_metrics_conn_limit(uint64_t nofile);

/* Fills *s with the figures as of now; called on the endpoint's thread for
 * each request, so it must be safe from any thread. */
typedef void (*hs_metrics_stats_cb)(void *arg, hs_consumer_stats_t *s);

/* Serves /metrics and /healthz on host:port from stats(arg). Port 0 picks
 * one (see hs_metrics_port). The endpoint knows the consumer only through
 * the callback. */
HS_MUST_CHECK hs_status_t hs_metrics_start(hs_metrics_stats_cb stats, void *arg, const char *host,
                                           uint16_t port, hs_metrics_t **out);
uint16_t hs_metrics_port(const hs_metrics_t *m);
void hs_metrics_stop(hs_metrics_t *m); /* NULL ok */

/* The Prometheus text exposition of `s` into buf[cap]; returns its length
 * (as snprintf). */
int hs_metrics_format(const hs_consumer_stats_t *s, char *buf, size_t cap);

#endif /* HS_METRICS_INT_H */
