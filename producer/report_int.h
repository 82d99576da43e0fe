/* SPDX-License-Identifier: Apache-2.0 */
/* report_int.h - what the producer tells about its run (report.c). */
#ifndef HS_REPORT_INT_H
#define HS_REPORT_INT_H

#include "producer_int.h"

/* STATS to every welcomed consumer: the heartbeat, with tokens, batches,
 * stall and whether the workers progressed since the last one. Network
 * thread. */
void hs__report_send_stats(producer_t *pr);
/* One live status line: rates since the start, worker busy and stall, and
 * which side is the limit. Network thread. */
void hs__report_print_status(producer_t *pr);
/* Per-worker and total figures at the end, in the log and in
 * cfg->summary_json when set. After the workers are joined. */
void hs__report_print_summary(producer_t *pr);
/* part_s seconds of n workers' time over a span_s window, in percent,
 * capped at 100; 0 for an empty window. */
double hs__report_share_pct(double part_s, double span_s, uint32_t n);

#endif /* HS_REPORT_INT_H */
