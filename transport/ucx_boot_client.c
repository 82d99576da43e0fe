/* SPDX-License-Identifier: Apache-2.0 */
/* ucx_boot_client.c - the connecting side of the UCX bootstrap (the
 * exchange is described in ucx_boot_server.c): hs_tp_connect() over UCX. */

#include "ucx_int.h"
#include "hs_log.h"
#include "hs_time.h"

#include <assert.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

/* An I/O failure in the middle of the exchange, errno set: a reset or an
 * end of stream is what a consumer restarting looks like. */
static hs_status_t boot_io_failed(char *last, size_t lastcap)
{
    int e = errno;
    snprintf(last, lastcap, "UCX bootstrap with the consumer failed: %s", strerror(e));
    if (e == ETIMEDOUT) return HS_ERR_TIMEOUT;
    return hs__sock_errno_retryable(e) ? HS_ERR_AGAIN : HS_ERR_IO;
}

/* Reads one record (head, checked, then its body) into a malloc'd *out of
 * *out_len bytes. HS_ERR_AGAIN for a transient failure (errno in last),
 * HS_ERR_TIMEOUT, or the parse error. */
static hs_status_t boot_read(int fd, uint64_t deadline, uint8_t **out, size_t *out_len, char *last,
                             size_t lastcap)
{
    uint8_t head[HS__UCX_BOOT_HEAD];
    if (!hs__sock_io(fd, head, sizeof head, false, deadline)) goto err_io;
    hs__ucx_boot_head_t h;
    hs_status_t st = hs__ucx_boot_head_parse(head, &h, last, lastcap);
    if (st != HS_OK) return st;
    size_t len = HS__UCX_BOOT_HEAD + (size_t)h.body_len; /* bounded by the head check */
    uint8_t *rec = malloc(len);
    if (!rec) return HS_ERR_NOMEM;
    memcpy(rec, head, sizeof head);
    if (!hs__sock_io(fd, rec + sizeof head, h.body_len, false, deadline)) {
        free(rec);
        goto err_io;
    }
    *out = rec;
    *out_len = len;
    return HS_OK;
err_io:
    return boot_io_failed(last, lastcap);
}

/* Tells the consumer why this side gives up (best effort). */
static void boot_refuse(int fd, hs_status_t st, const char *why)
{
    uint8_t buf[HS__UCX_BOOT_HEAD + 4 + HS__UCX_BOOT_TEXT_MAX];
    size_t n = hs__ucx_boot_pack_refuse(buf, sizeof buf, st, why);
    if (n) (void)send(fd, buf, n, MSG_NOSIGNAL | MSG_DONTWAIT);
}

/* Reads and parses the consumer's next bootstrap record and checks that it
 * is `want` (a REFUSE gives the consumer's reason). *rec (malloc'd) holds
 * the record m points into, also on failure; the caller frees it. */
static hs_status_t boot_expect(int fd, uint64_t deadline, unsigned want, const char *want_name,
                               uint8_t **rec, size_t *len, hs__ucx_boot_msg_t *m, char *last,
                               size_t lastcap)
{
    hs_status_t st = boot_read(fd, deadline, rec, len, last, lastcap);
    if (st == HS_OK) st = hs__ucx_hello_parse(*rec, *len, m, last, lastcap);
    if (st != HS_OK) return st;
    if (m->type == HS__UCX_BOOT_REFUSE) {
        snprintf(last, lastcap, "the consumer refused the connection: %s", m->text);
        return m->status;
    }
    if (m->type != want) {
        snprintf(last, lastcap, "the consumer sent UCX bootstrap record type %u, not %s", m->type,
                 want_name);
        return HS_ERR_PROTO;
    }
    return HS_OK;
}

/* The client side of the bootstrap exchange (see above) on a connected fd.
 * On success *peer_addr (malloc'd) holds the server's worker address. */
static hs_status_t boot_exchange(ucx_tp_t *tp, int fd, uint64_t deadline, uint8_t **peer_addr,
                                 char *last, size_t lastcap)
{
    const hs_auth_key_t *key = tp->base.cfg.auth_key;
    uint8_t client_nonce[HS__UCX_BOOT_NONCE], server_nonce[HS__UCX_BOOT_NONCE];
    uint8_t hello[HS__UCX_BOOT_HELLO_BYTES];
    if (hs_auth_nonce(client_nonce) != HS_OK) return HS_ERR_UNSUPPORTED;
    hs__ucx_boot_pack_nonce(hello, HS__UCX_BOOT_HELLO, key ? HS__UCX_BOOT_FLAG_KEY : 0,
                            client_nonce);
    if (!hs__sock_io(fd, hello, sizeof hello, true, deadline)) return boot_io_failed(last, lastcap);
    uint8_t *rec = NULL;
    size_t len = 0;
    hs__ucx_boot_msg_t m;
    hs_status_t st = boot_expect(fd, deadline, HS__UCX_BOOT_CHALLENGE, "a CHALLENGE", &rec, &len,
                                 &m, last, lastcap);
    if (st != HS_OK) goto out;
    if (!(m.flags & HS__UCX_BOOT_FLAG_KEY) != !key) {
        snprintf(last, lastcap,
                 key ? "the consumer has no shared secret but this producer has one: give both "
                       "sides the same --secret-file"
                     : "the consumer requires a shared secret: start this producer with "
                       "--secret-file FILE, the consumer's secret");
        boot_refuse(fd, HS_ERR_AUTH, last);
        st = HS_ERR_AUTH;
        goto out;
    }
    memcpy(server_nonce, m.nonce, sizeof server_nonce);
    free(rec);
    rec = NULL;

    uint8_t mac[HS__UCX_BOOT_MAC] = {0};
    if (key &&
        hs_auth_producer_mac(key, server_nonce, client_nonce, hello, sizeof hello, mac) != HS_OK) {
        snprintf(last, lastcap, "libsodium could not compute the proof of the shared secret");
        st = HS_ERR_AUTH;
        goto out;
    }
    uint8_t head[HS__UCX_BOOT_HEAD];
    hs__ucx_boot_head_pack(head, HS__UCX_BOOT_AUTH, (uint32_t)(sizeof mac + tp->my_addr_len));
    if (!hs__sock_io(fd, head, sizeof head, true, deadline) ||
        !hs__sock_io(fd, mac, sizeof mac, true, deadline) ||
        !hs__sock_io(fd, tp->my_addr, tp->my_addr_len, true, deadline)) {
        st = boot_io_failed(last, lastcap);
        goto out;
    }
    st = boot_expect(fd, deadline, HS__UCX_BOOT_ACCEPT, "an ACCEPT", &rec, &len, &m, last, lastcap);
    if (st != HS_OK) goto out;
    if (key) {
        uint8_t expect[HS_AUTH_MAC_BYTES];
        if (hs_auth_consumer_mac(key, client_nonce, server_nonce, expect) != HS_OK ||
            hs_auth_verify(m.mac, expect) != HS_OK) {
            snprintf(last, lastcap,
                     "the consumer could not prove it holds the shared secret: wrong peer or a "
                     "different --secret-file");
            st = HS_ERR_AUTH;
            goto out;
        }
    }
    uint8_t *addr = NULL;
    char why[256];
    st = hs__ucx_peer_addr(tp, m.addr, m.addr_len, &addr, why, sizeof why);
    if (st != HS_OK) {
        snprintf(last, lastcap, "bad UCX worker address in the consumer's ACCEPT: %s", why);
        boot_refuse(fd, HS_ERR_PROTO, last);
        if (st != HS_ERR_NOMEM) st = HS_ERR_PROTO;
        goto out;
    }
    *peer_addr = addr;
    st = HS_OK;
out:
    free(rec);
    return st;
}

/* TCP connect to one of ai (retried until the deadline while nobody
 * listens, hs__sock_connect), then the bootstrap exchange. HS_ERR_AGAIN when
 * trying the whole again may work (a reset in the middle: a restart). */
static hs_status_t bootstrap(ucx_tp_t *tp, const struct addrinfo *ai, uint64_t deadline,
                             const struct addrinfo **used, uint8_t **peer_addr, char *last,
                             size_t lastcap)
{
    int fd = -1;
    hs_status_t st = hs__sock_connect(ai, deadline, NULL, NULL, &fd, used, last, lastcap);
    if (st != HS_OK) return st;
    st = boot_exchange(tp, fd, deadline, peer_addr, last, lastcap);
    close(fd);
    if (st == HS_ERR_AGAIN && hs_now_ns() >= deadline) st = HS_ERR_TIMEOUT;
    return st;
}

/* Takes the op at *pp (a link of the done queue) out of the queue and back
 * to the free list: one of the transport's own ops, finished while a
 * connect waits for it, that the user never hears of. */
static void done_take(ucx_tp_t *tp, ucx_op_t **pp)
{
    ucx_op_t *o = *pp;
    *pp = o->dnext;
    if (tp->done_tail == o) {
        tp->done_tail = NULL;
        for (ucx_op_t *x = tp->done_head; x; x = x->dnext)
            tp->done_tail = x;
    }
    hs__ucx_op_put(tp, o);
}

/* Tears down an endpoint the user never saw (no on_close). */
static void conn_discard(ucx_tp_t *tp, ucx_conn_t *c)
{
    if (!c->closing) {
        c->closing = true;
        tp->n_closing++;
    }
    if (!c->ep_closed) hs__ucx_conn_force_close(c);
    uint64_t until = hs_now_ns() + 2000000000ull;
    while ((!c->close_done || c->n_ops > 0) && hs_now_ns() < until) {
        hs__ucx_worker_wait(tp, 10);
        hs__ucx_worker_drain(tp);
        for (ucx_op_t **pp = &tp->done_head; *pp;) {
            ucx_op_t *o = *pp;
            if (o->conn == c) {
                if (o->kind == OP_CLOSE) c->close_done = true;
                done_take(tp, pp);
            } else {
                pp = &o->dnext;
            }
        }
    }
    while (c->ops) { /* still not finished: orphan */
        ucx_op_t *o = c->ops;
        c->ops = o->cnext;
        o->conn = NULL;
    }
    tp->n_closing--;
    hs__ucx_conn_unlink(tp, c);
    free(c);
}

hs_status_t hs__ucx_connect(hs_tp_t *t, const char *host, uint16_t port, int timeout_ms,
                            unsigned flags, hs_tp_conn_t **out)
{
    ucx_tp_t *tp = tp_of(t);
    if (tp->in_progress) {
        hs_error("hs_tp_connect called from inside a transport callback");
        return HS_ERR_BUSY;
    }
    struct addrinfo *ai = NULL;
    hs_status_t st = hs__sock_resolve(host, port, false, &ai);
    if (st != HS_OK) return st;
    uint64_t deadline = timeout_ms < 0 ? UINT64_MAX : hs_now_ns() + (uint64_t)timeout_ms * 1000000u;
    ucx_conn_t *c = NULL;
    char last[400] = "no attempt";
    /* internal progress below may deliver other connections' events: the
     * reentrancy guard of progress covers it */
    tp->in_progress = true;
    for (;;) {
        const struct addrinfo *used = NULL;
        uint8_t *peer_addr = NULL;
        st = bootstrap(tp, ai, deadline, &used, &peer_addr, last, sizeof last);
        if (st == HS_ERR_AGAIN) {
            /* not listening yet, or reset in the middle (a restart): the
             * whole bootstrap again, until the deadline */
            hs_debug("ucx bootstrap with %s port %u: %s; trying again", host, port, last);
            uint64_t now = hs_now_ns();
            if (now >= deadline) {
                st = HS_ERR_TIMEOUT;
                break;
            }
            uint64_t nap = 50u * 1000000u;
            if (deadline - now < nap) nap = deadline - now;
            struct timespec ts = {.tv_sec = 0, .tv_nsec = (long)nap};
            nanosleep(&ts, NULL);
            continue;
        }
        if (st != HS_OK) break;
        c = hs__ucx_conn_alloc(tp);
        if (!c) {
            free(peer_addr);
            st = HS_ERR_NOMEM;
            break;
        }
        hs__tp_conn_set_peer(&c->base, used->ai_addr, used->ai_addrlen);
        ucs_status_t us = hs__ucx_ep_create_to(tp, c, peer_addr);
        free(peer_addr);
        if (us != UCS_OK) {
            snprintf(last, sizeof last, "cannot reach the consumer's UCX worker: %s",
                     ucs_status_string(us));
            free(c);
            c = NULL;
            st = HS_ERR_IO;
            break;
        }
        hs__ucx_conn_link(tp, c);
        /* the flush completes once wireup is done, or fails */
        ucx_op_t *op = hs__ucx_op_get(tp, OP_FLUSH, c);
        ucp_request_param_t prm = {
            .op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA,
            .cb.send = hs__ucx_send_cb,
            .user_data = op,
        };
        ucs_status_ptr_t r = op ? ucp_ep_flush_nbx(c->ep, &prm) : NULL;
        if (op && (r == NULL || UCS_PTR_IS_ERR(r))) {
            if (UCS_PTR_IS_ERR(r)) c->failed = true;
            c->flushed = !UCS_PTR_IS_ERR(r);
            hs__ucx_op_put(tp, op);
        }
        while (!c->flushed && !c->failed && hs_now_ns() < deadline) {
            hs__ucx_worker_wait(tp, 10);
            hs__ucx_worker_drain(tp);
            /* only the transport's own ops may complete here */
            for (ucx_op_t **pp = &tp->done_head; *pp;) {
                ucx_op_t *o = *pp;
                if (o->conn == c && o->kind == OP_FLUSH) {
                    if (o->status == UCS_OK)
                        c->flushed = true;
                    else
                        c->failed = true;
                    done_take(tp, pp);
                } else {
                    pp = &o->dnext;
                }
            }
        }
        if (c->flushed && !c->failed) {
            st = HS_OK;
            break;
        }
        snprintf(last, sizeof last, "%s",
                 c->failed ? "UCX could not wire up the endpoint" : "timed out");
        conn_discard(tp, c);
        c = NULL;
        if (hs_now_ns() >= deadline) {
            st = HS_ERR_TIMEOUT;
            break;
        }
    }
    tp->in_progress = false;
    freeaddrinfo(ai);
    if (st != HS_OK) {
        if (st == HS_ERR_AUTH || st == HS_ERR_MISMATCH || st == HS_ERR_PROTO || st == HS_ERR_FORMAT)
            hs_error("UCX connection to %s port %u refused: %s", host, port, last);
        else
            hs_log(flags & HS_TP_CONNECT_QUIET ? HS_LOG_INFO : HS_LOG_ERROR,
                   "cannot connect with UCX to %s port %u: %s; is the consumer running and "
                   "reachable?",
                   host, port, last);
        return st;
    }
    c->connected = true;
    c->announced = true;
    hs__ucx_conn_refresh_describe(c);
    hs_info("connected to %s: %s", c->base.peer, c->base.describe);
    c->lanes_checked = true;
    if (tp->base.cfg.require_rdma && !hs__ucx_describe_has_rdma(c->base.describe)) {
        hs_error("RDMA is required but UCX connects to %s over '%s' (no rc/dc/ud verbs lane): "
                 "check the RDMA NIC, its link and UCX_NET_DEVICES/UCX_TLS, or run without "
                 "--require-rdma",
                 c->base.peer, c->base.describe);
        if (hs__ucx_send_am(c, AM_CLOSE, NULL, 0) != HS_OK)
            hs_debug("connection %s: the close notice could not be sent", c->base.peer);
        tp->in_progress = true;
        conn_discard(tp, c);
        tp->in_progress = false;
        return HS_ERR_UNSUPPORTED;
    }
    *out = &c->base;
    return HS_OK;
}
