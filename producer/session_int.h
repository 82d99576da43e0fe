/* SPDX-License-Identifier: Apache-2.0 */
/* session_int.h - the producer's links to its consumers (session.c): the
 * handshake (HELLO, CHALLENGE/AUTH, WELCOME, PLAN), TICKETs into sh.tickets,
 * BYE and ERROR, lost connections and --reconnect. Everything here runs on
 * the network thread (or in producer_open before it starts). */
#ifndef HS_SESSION_INT_H
#define HS_SESSION_INT_H

#include "producer_int.h"

/* The transport callbacks; their `arg` is the producer_t. */
extern const hs_tp_callbacks_t hs__producer_callbacks;

/* Connects link l within timeout_ms. The transport may deliver the
 * consumer's first frames while it connects: after a BYE or a refusal l is
 * done and l->conn already closing, so no HELLO must go. */
HS_MUST_CHECK hs_status_t hs__link_connect(link_t *l, int timeout_ms, unsigned flags);
/* Sends HELLO on l, keeping its body for the AUTH proof. */
HS_MUST_CHECK hs_status_t hs__link_send_hello(link_t *l);
/* Packs message m into net.frame_buf and sends it on l (a failure is logged;
 * nothing when l has no connection). */
void hs__link_send_msg(link_t *l, uint16_t type, const ProtobufCMessage *m);
/* One short try to connect a lost link (--reconnect) or one not reached at
 * start (l->pending) and redo the handshake; gives it up after
 * connect_timeout_s (a pending link fails the whole set then). */
void hs__link_reconnect(link_t *l);

/* net.done once every link is done. */
void hs__links_update_done(producer_t *pr);
/* A failure of the whole producer (local, or a set of consumers that does
 * not fit together): logged, and every link ends with an ERROR. */
void hs__producer_fail_all(producer_t *pr, hs_status_t code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#endif /* HS_SESSION_INT_H */
