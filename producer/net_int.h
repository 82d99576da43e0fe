/* SPDX-License-Identifier: Apache-2.0 */
/* net_int.h - the producer's network loop (net.c). */
#ifndef HS_NET_INT_H
#define HS_NET_INT_H

#include "producer_int.h"

/* Runs the network loop on the calling thread (`arg` is the producer_t):
 * progresses the transport, sends every batch on sh.outbox, reconnects,
 * drains on a stop, beats and prints the status, until net.done (every
 * consumer said BYE or is gone, a local failure, or api.close_requested).
 * Sets sh.net_done and wakes everyone waiting on sh.cond when it ends. */
void *hs__net_main(void *arg);

#endif /* HS_NET_INT_H */
