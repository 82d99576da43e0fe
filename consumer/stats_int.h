/* SPDX-License-Identifier: Apache-2.0 */
/* stats_int.h - the consumer's figures (stats.c): hs_consumer_stats(), the
 * status line, the summary's JSON and the bottleneck's words. The network
 * thread's own figures reach them through a snapshot it publishes under
 * the delivery lock each turn; everything else is read under that lock or
 * from the cache, so any thread may ask.
 *
 * Rates and shares come twice: since the first ticket (the run's averages)
 * and over the recent window (the last HS_WINDOW_SPAN_S seconds, from
 * samples taken as the figures are read: hs_consumer_t.window, under the
 * delivery lock). The limit and the ETAs use the window, so a slowdown late
 * in a long run shows. */
#ifndef HS_STATS_INT_H
#define HS_STATS_INT_H

typedef struct hs_consumer hs_consumer_t;

/* The network thread: publishes its figures (producers, tickets, what
 * start-up waits for) for hs_consumer_stats() and the status line. */
void hs__stats_snapshot(hs_consumer_t *c);

#endif /* HS_STATS_INT_H */
