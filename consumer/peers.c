/* SPDX-License-Identifier: Apache-2.0 */
/* peers.c - the consumer's registry of producer connections: a record per
 * connection from accept until its payloads settle, the pre-authentication
 * limits, sending to a peer and dropping one. The network thread only. */
#include "consumer_int.h"
#include "hs_status.h"
#include "hs_log.h"
#include "hs_time.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Until a peer is admitted (HELLO, and AUTH with a secret) its frames may be
 * at most PREAUTH_MAX_FRAME bytes, and at most PREAUTH_MAX_PEERS such peers
 * (PREAUTH_MAX_PER_ADDR from one address) are kept: the oldest gives way. So
 * unauthenticated connections cost a bounded amount of memory, whatever
 * they send, and cannot shut real producers out by holding on. */
#define PREAUTH_MAX_FRAME (64u << 10)
#define PREAUTH_MAX_PEERS 128
#define PREAUTH_MAX_PER_ADDR 16

void hs__peer_send_msg(hs_consumer_t *c, peer_t *p, uint16_t type, const ProtobufCMessage *m)
{
    size_t len;
    if (!p->conn) return;
    hs_status_t st = hs_msg_pack(type, m, c->net.frame_buf, HS__FRAME_BUF_BYTES, &len);
    if (st == HS_OK) st = hs_tp_send(p->conn, c->net.frame_buf, len);
    if (st != HS_OK)
        hs_warn("producer %s: sending %s failed: %s", p->name, hs_msg_type_str(type),
                hs_status_str(st));
}

void hs__peer_drop(hs_consumer_t *c, peer_t *p, hs_status_t code, const char *fmt, ...)
{
    char text[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof(text), fmt, ap);
    va_end(ap);
    /* The connection lingers until its close completes; a peer is dropped
     * (and counted) once. */
    if (!p->conn || p->dropped) return;
    p->dropped = true;
    hs_error("producer %s dropped: %s", p->name, text);
    size_t len;
    if (hs_msg_error_frame(code, text, c->net.frame_buf, HS__FRAME_BUF_BYTES, &len) == HS_OK &&
        hs_tp_send(p->conn, c->net.frame_buf, len) != HS_OK)
        hs_debug("producer %s: the ERROR frame could not be sent", p->name);
    hs_tp_close(p->conn, code);
    if (code != HS_ERR_CLOSED) c->net.n_dropped++;
}

peer_t *hs__peer_find(hs_consumer_t *c, uint64_t id)
{
    for (peer_t *p = c->net.peers; p; p = p->next)
        if (p->id == id) return p;
    return NULL;
}

/* Decodes a frame body from a peer into arena `a` (NULL: the heap); a
 * malformed one drops the peer (NULL). Free with hs_msg_free_in(a, m). */
ProtobufCMessage *hs__peer_unpack_in(hs_consumer_t *c, peer_t *p, hs_msg_arena_t *a, uint16_t type,
                                     const uint8_t *body, uint32_t len)
{
    char why[256];
    ProtobufCMessage *m;
    if (hs_msg_unpack_in(a, type, body, len, &m, why, sizeof(why)) != HS_OK) {
        hs__peer_drop(c, p, HS_ERR_FORMAT, "bad %s: %s", hs_msg_type_str(type), why);
        return NULL;
    }
    return m;
}

ProtobufCMessage *hs__peer_unpack(hs_consumer_t *c, peer_t *p, uint16_t type, const uint8_t *body,
                                  uint32_t len)
{
    return hs__peer_unpack_in(c, p, NULL, type, body, len);
}

/* Frees a dead peer once no payload of it is being received or verified:
 * only then can its leases go back to the queue without a slot being written
 * twice. */
void hs__peer_reap(hs_consumer_t *c, peer_t *p)
{
    if (p->conn || p->receiving || p->verifying) return;
    if (c->net.sched) {
        uint32_t n = hs_sched_return_leases(c->net.sched, p->id);
        c->net.leases_returned += n;
        if (n) hs_warn("producer %s gone: %u ticket(s) back to the front of the queue", p->name, n);
    }
    peer_t **pp = &c->net.peers;
    while (*pp != p)
        pp = &(*pp)->next;
    *pp = p->next;
    free(p->hello_body);
    free(p->claims);
    free(p);
}

static bool peer_unadmitted(const peer_t *p)
{
    return p->conn && !p->dropped && !p->bye_sent &&
           (p->state == PEER_NEW || p->state == PEER_AUTH);
}

/* "1.2.3.4:5678" and "1.2.3.4:9" come from the same address. */
static bool peer_same_addr(const peer_t *a, const peer_t *b)
{
    const char *x = hs_tp_conn_peer(a->conn), *y = hs_tp_conn_peer(b->conn);
    const char *xe = strrchr(x, ':'), *ye = strrchr(y, ':');
    size_t xl = xe ? (size_t)(xe - x) : strlen(x), yl = ye ? (size_t)(ye - y) : strlen(y);
    return xl == yl && memcmp(x, y, xl) == 0;
}

/* Before `p` (new, not admitted) is kept: the pre-auth limits (above). */
static void preauth_make_room(hs_consumer_t *c, peer_t *p)
{
    uint32_t total = 0, same = 0;
    peer_t *oldest = NULL, *oldest_same = NULL;
    for (peer_t *q = c->net.peers; q; q = q->next) {
        if (q == p || !peer_unadmitted(q)) continue;
        total++;
        if (!oldest || q->t_accept < oldest->t_accept) oldest = q;
        if (!peer_same_addr(q, p)) continue;
        same++;
        if (!oldest_same || q->t_accept < oldest_same->t_accept) oldest_same = q;
    }
    if (same >= PREAUTH_MAX_PER_ADDR)
        hs__peer_drop(c, oldest_same, HS_ERR_BUSY,
                      "%u connections from its address are in their handshake (at most %u per "
                      "address): the oldest gives way to a new one",
                      same, PREAUTH_MAX_PER_ADDR);
    else if (total >= PREAUTH_MAX_PEERS)
        hs__peer_drop(c, oldest, HS_ERR_BUSY,
                      "%u connections are in their handshake (at most %u): the oldest gives way to "
                      "a new one",
                      total, PREAUTH_MAX_PEERS);
}

void hs__peer_count_transport(hs_consumer_t *c, const peer_t *p)
{
    const char *k = hs_tp_conn_kind(p->conn);
    if (strcmp(k, "shm") == 0)
        c->net.n_seen_shm++;
    else if (strcmp(k, "ucx") == 0)
        c->net.n_seen_ucx++;
    else
        c->net.n_seen_tcp++;
}

hs_status_t hs__peer_accepted(void *arg, hs_tp_conn_t *conn)
{
    hs_consumer_t *c = arg;
    peer_t *p = calloc(1, sizeof(*p));
    if (!p) return HS_ERR_NOMEM;
    p->id = ++c->net.next_peer_id;
    p->conn = conn;
    p->t_accept = hs_now_s();
    p->state = PEER_NEW;
    snprintf(p->name, sizeof(p->name), "%s", hs_tp_conn_peer(conn));
    hs_tp_conn_set_user(conn, p);
    p->next = c->net.peers;
    c->net.peers = p;
    c->net.n_seen++;
    if (!c->have_secret && !c->cfg.insecure && !hs_tp_conn_is_loopback(conn)) {
        hs__peer_drop(
            c, p, HS_ERR_AUTH,
            "peer %s is not on a loopback address and no shared secret is set: start both "
            "sides with --secret-file FILE (or the consumer with --insecure)",
            hs_tp_conn_peer(conn));
        return HS_OK;
    }
    if (c->stop || c->net.all_queued) {
        /* The producer closes when it reads BYE; closing here with its HELLO
         * unread would reset the connection and could lose the BYE. */
        Hsflow__Bye b = HSFLOW__BYE__INIT;
        b.reason = "the run is over";
        hs__peer_send_msg(c, p, HS_MSG_BYE, &b.base);
        p->bye_sent = true;
        return HS_OK;
    }
    /* raised when admitted (handshake.c); a peer the limit cannot be set on
     * (logged) is not let in with the full one */
    if (hs_tp_conn_set_max_frame(conn, PREAUTH_MAX_FRAME) != HS_OK) {
        hs__peer_drop(c, p, HS_ERR_INVALID, "the pre-authentication frame limit could not be set");
        return HS_OK;
    }
    preauth_make_room(c, p);
    hs_debug("connection from %s", hs_tp_conn_peer(conn));
    return HS_OK;
}

void hs__peers_free(hs_consumer_t *c)
{
    while (c->net.peers) {
        peer_t *p = c->net.peers;
        c->net.peers = p->next;
        free(p->hello_body);
        free(p->claims);
        free(p);
    }
}
