/* SPDX-License-Identifier: Apache-2.0 */
/* ucx_boot_server.c - the listening side of the UCX bootstrap (see below):
 * the bootstrap socket, peers in their HELLO/AUTH exchange, and the
 * endpoint of each peer that proved itself. */

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

/* ---- bootstrap: listen / accept / connect ----------------------------------
 *
 * This transport listens with a plain TCP socket of its own, not a
 * ucp_listener: UCX 1.13's tcp connection manager aborts the whole process
 * when a stray client sends it garbage (assertion in tcp_sockcm_ep.c), and a
 * consumer must survive any bytes from the network. On that socket the two
 * sides run the exchange of ucx_hello_int.h: HELLO and CHALLENGE swap nonces,
 * AUTH and ACCEPT carry the proofs (with a shared secret) and the UCX worker
 * addresses; each side then creates an endpoint to the other's address (UCX
 * pairs the two into one connection, the server's first, so that no message
 * can arrive before it exists), and the socket is closed.
 *
 * UCX trusts a worker address completely (it has no length and a malformed
 * one makes it assert), so nothing a peer sends reaches UCX before the peer
 * has proved itself: the server applies the loopback rule to the HELLO (no
 * secret and not allow_remote: loopback peers only) and, with a secret,
 * checks the client's proof before it looks at the address in AUTH; the
 * client checks the server's proof before it uses the address in ACCEPT.
 * Even a proven peer's address (and a loopback peer's without a secret) is
 * then walked and cut to the transports this side has (hs__ucx_peer_addr,
 * ucx_addr_int.h) before UCX reads it, so that a broken or hostile peer
 * cannot abort the process. A refused peer gets a REFUSE record saying
 * why. Every length is checked
 * before anything is allocated (hs__ucx_boot_head_parse); a connection that
 * has not finished within UCX_BOOT_TIMEOUT_MS is cut off; at most
 * UCX_PENDING_MAX are in the bootstrap at once (the oldest gives way).
 */
#define UCX_BOOT_TIMEOUT_MS 10000
#define UCX_REFUSE_LINGER_MS 1000 /* after a REFUSE: read what the peer still sends */
#define UCX_PENDING_MAX 256

typedef enum { BOOT_HELLO, BOOT_AUTH, BOOT_REFUSED } boot_stage_t;

struct ucx_pending {
    int fd;
    struct sockaddr_storage peer;
    socklen_t peer_len;
    char name[HS__TP_PEER_CAP];
    boot_stage_t stage;
    uint8_t small[HS__UCX_BOOT_HELLO_BYTES]; /* a record head, or a whole HELLO */
    uint8_t *rec;                            /* the record being read: small or heap */
    size_t want, got;                        /* its length once the head is in; bytes in */
    uint8_t hello[HS__UCX_BOOT_HELLO_BYTES]; /* the client's HELLO: its proof covers it */
    uint8_t server_nonce[HS__UCX_BOOT_NONCE];
    uint64_t deadline_ns;
    ucx_pending_t *next;
};

static void pending_rec_reset(ucx_pending_t *p)
{
    if (p->rec != p->small) free(p->rec);
    p->rec = p->small;
    p->want = p->got = 0;
}

void hs__ucx_pending_free(ucx_tp_t *tp, ucx_pending_t *p)
{
    for (ucx_pending_t **pp = &tp->pending; *pp; pp = &(*pp)->next) {
        if (*pp == p) {
            *pp = p->next;
            break;
        }
    }
    tp->n_pending--;
    close(p->fd);
    pending_rec_reset(p);
    free(p);
}

static void pending_drop(ucx_tp_t *tp, ucx_pending_t *p, const char *why)
{
    hs_warn("connection from %s: %s; closing it", p->name, why);
    hs__ucx_pending_free(tp, p);
}

/* Tells the peer why (REFUSE), then reads off what it still sends for a
 * moment, so that closing does not reset the connection before the peer
 * read the REFUSE. */
static void pending_refuse(ucx_tp_t *tp, ucx_pending_t *p, hs_status_t st, const char *why)
{
    hs_warn("connection from %s refused in the UCX bootstrap: %s", p->name, why);
    tp->base.boot_refused++;
    uint8_t buf[HS__UCX_BOOT_HEAD + 4 + HS__UCX_BOOT_TEXT_MAX];
    size_t n = hs__ucx_boot_pack_refuse(buf, sizeof buf, st, why);
    if (n == 0 || send(p->fd, buf, n, MSG_NOSIGNAL | MSG_DONTWAIT) != (ssize_t)n) {
        hs__ucx_pending_free(tp, p);
        return;
    }
    (void)shutdown(p->fd, SHUT_WR);
    pending_rec_reset(p);
    p->stage = BOOT_REFUSED;
    p->deadline_ns = hs_now_ns() + (uint64_t)UCX_REFUSE_LINGER_MS * 1000000u;
}

static bool pending_send(ucx_pending_t *p, const struct iovec *iov, int n)
{
    size_t total = 0;
    for (int i = 0; i < n; i++)
        total += iov[i].iov_len;
    struct msghdr msg = {.msg_iov = (struct iovec *)iov, .msg_iovlen = (size_t)n};
    return sendmsg(p->fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT) == (ssize_t)total;
}

/* HELLO: the loopback rule and whether both sides agree on a secret, then
 * the CHALLENGE. Nothing of the peer's is kept but its HELLO. */
static void pending_on_hello(ucx_tp_t *tp, ucx_pending_t *p, const hs__ucx_boot_msg_t *m)
{
    const hs_tp_config_t *cfg = &tp->base.cfg;
    bool peer_key = (m->flags & HS__UCX_BOOT_FLAG_KEY) != 0;
    bool loopback =
        hs__tp_addr_is_loopback((struct sockaddr *)&p->peer) && !tp->base.loopback_is_remote;
    char why[HS__UCX_BOOT_TEXT_MAX + 1];
    if (cfg->auth_key && !peer_key) {
        pending_refuse(tp, p, HS_ERR_AUTH,
                       "the consumer requires a shared secret: start the producer with "
                       "--secret-file FILE, the consumer's secret");
        return;
    }
    if (!cfg->auth_key && peer_key) {
        pending_refuse(tp, p, HS_ERR_AUTH,
                       "the producer has a shared secret but the consumer has none: give both "
                       "sides the same --secret-file");
        return;
    }
    if (!cfg->auth_key && !cfg->allow_remote && !loopback) {
        snprintf(why, sizeof why,
                 "peer %s is not on a loopback address and no shared secret is set: start both "
                 "sides with --secret-file FILE (or the consumer with --insecure)",
                 p->name);
        pending_refuse(tp, p, HS_ERR_AUTH, why);
        return;
    }
    memcpy(p->hello, p->rec, HS__UCX_BOOT_HELLO_BYTES);
    if (hs_auth_nonce(p->server_nonce) != HS_OK) {
        pending_drop(tp, p, "no random nonce (libsodium)");
        return;
    }
    uint8_t ch[HS__UCX_BOOT_HELLO_BYTES];
    hs__ucx_boot_pack_nonce(ch, HS__UCX_BOOT_CHALLENGE, cfg->auth_key ? HS__UCX_BOOT_FLAG_KEY : 0,
                            p->server_nonce);
    struct iovec iov = {ch, sizeof ch};
    if (!pending_send(p, &iov, 1)) {
        pending_drop(tp, p, "could not send the UCX challenge");
        return;
    }
    pending_rec_reset(p);
    p->stage = BOOT_AUTH;
}

/* AUTH: with a secret the proof first; only then does the address go to
 * UCX, and the ACCEPT (with this side's proof) goes back. */
static void pending_on_auth(ucx_tp_t *tp, ucx_pending_t *p, const hs__ucx_boot_msg_t *m)
{
    const hs_auth_key_t *key = tp->base.cfg.auth_key;
    const uint8_t *client_nonce = p->hello + HS__UCX_BOOT_HEAD + 4;
    uint8_t mac[HS__UCX_BOOT_MAC] = {0};
    if (key) {
        uint8_t expect[HS_AUTH_MAC_BYTES];
        if (hs_auth_producer_mac(key, p->server_nonce, client_nonce, p->hello, sizeof p->hello,
                                 expect) != HS_OK ||
            hs_auth_verify(m->mac, expect) != HS_OK) {
            pending_refuse(tp, p, HS_ERR_AUTH,
                           "authentication failed: the producer's --secret-file differs from the "
                           "consumer's");
            return;
        }
        if (hs_auth_consumer_mac(key, client_nonce, p->server_nonce, mac) != HS_OK) {
            pending_refuse(tp, p, HS_ERR_AUTH, "the consumer could not compute its proof");
            return;
        }
    }
    /* UCX trusts the address completely: checked here, also a proven
     * peer's */
    uint8_t *addr = NULL;
    char why[200];
    hs_status_t ast = hs__ucx_peer_addr(tp, m->addr, m->addr_len, &addr, why, sizeof why);
    if (ast != HS_OK) {
        char text[HS__UCX_BOOT_TEXT_MAX + 1];
        snprintf(text, sizeof text, "bad UCX worker address in AUTH: %s", why);
        pending_refuse(tp, p, ast == HS_ERR_NOMEM ? HS_ERR_NOMEM : HS_ERR_PROTO, text);
        return;
    }
    tp->base.boot_passed++;
    hs_debug("ucx bootstrap: %s passed (%s); creating its endpoint", p->name,
             key                         ? "shared secret"
             : tp->base.cfg.allow_remote ? "insecure"
                                         : "loopback");
    ucx_conn_t *c = hs__ucx_conn_alloc(tp);
    if (!c) {
        free(addr);
        pending_drop(tp, p, "out of memory");
        return;
    }
    hs__tp_conn_set_peer(&c->base, (struct sockaddr *)&p->peer, p->peer_len);
    ucs_status_t us = hs__ucx_ep_create_to(tp, c, addr);
    free(addr);
    if (us != UCS_OK) {
        snprintf(why, sizeof why, "cannot reach its UCX worker: %s", ucs_status_string(us));
        free(c);
        pending_drop(tp, p, why);
        return;
    }
    c->connected = true;
    hs__ucx_conn_link(tp, c);
    uint8_t head[HS__UCX_BOOT_HEAD];
    hs__ucx_boot_head_pack(head, HS__UCX_BOOT_ACCEPT, (uint32_t)(sizeof mac + tp->my_addr_len));
    struct iovec iov[3] = {{head, sizeof head}, {mac, sizeof mac}, {tp->my_addr, tp->my_addr_len}};
    bool sent = pending_send(p, iov, 3);
    hs__ucx_pending_free(tp, p);
    tp->activity++;
    if (!sent) {
        /* the user never saw it: close without on_close */
        c->announced = false;
        hs__ucx_conn_begin_close(c, HS_ERR_IO, "could not answer the UCX bootstrap", false);
        return;
    }
    c->announced = true;
    hs_debug("accepted ucx connection from %s", c->base.peer);
    hs_status_t s = tp->base.cb.on_accept(tp->base.arg, &c->base);
    if (s != HS_OK) hs__ucx_conn_begin_close(c, s, "connection refused by this side", true);
}

/* A complete record is in p->rec[0, p->want). */
static void pending_on_record(ucx_tp_t *tp, ucx_pending_t *p)
{
    char why[HS__UCX_BOOT_TEXT_MAX + 64];
    hs__ucx_boot_msg_t m;
    hs_status_t st = hs__ucx_hello_parse(p->rec, p->want, &m, why, sizeof why);
    if (st != HS_OK) {
        pending_refuse(tp, p, st, why);
        return;
    }
    if (m.type == HS__UCX_BOOT_REFUSE) {
        snprintf(why, sizeof why, "the peer gave up: %s", m.text);
        pending_drop(tp, p, why);
    } else if (m.type == HS__UCX_BOOT_HELLO && p->stage == BOOT_HELLO) {
        pending_on_hello(tp, p, &m); /* p may be gone afterwards */
    } else if (m.type == HS__UCX_BOOT_AUTH && p->stage == BOOT_AUTH) {
        pending_on_auth(tp, p, &m); /* p is gone or refused afterwards */
    } else {
        snprintf(why, sizeof why, "unexpected UCX bootstrap record type %u %s", m.type,
                 p->stage == BOOT_HELLO ? "instead of a HELLO" : "instead of an AUTH");
        pending_refuse(tp, p, HS_ERR_PROTO, why);
    }
}

/* Reads what the socket has; returns when it would block or p is gone (or
 * refused: the caller must not touch p after a record was handled). */
static void pending_read(ucx_tp_t *tp, ucx_pending_t *p)
{
    if (p->stage == BOOT_REFUSED) {
        uint8_t scratch[4096];
        for (int i = 0; i < 64; i++) {
            ssize_t r = recv(p->fd, scratch, sizeof scratch, MSG_DONTWAIT);
            if (r < 0 && errno == EINTR) continue;
            if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
            if (r <= 0) break;
        }
        hs__ucx_pending_free(tp, p);
        return;
    }
    for (;;) {
        size_t want = p->want ? p->want : HS__UCX_BOOT_HEAD;
        ssize_t r = recv(p->fd, p->rec + p->got, want - p->got, MSG_DONTWAIT);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
        if (r <= 0) {
            pending_drop(tp, p,
                         r == 0 ? "closed before its UCX bootstrap was complete" : strerror(errno));
            return;
        }
        p->got += (size_t)r;
        if (p->want == 0 && p->got == HS__UCX_BOOT_HEAD) {
            char why[256];
            hs__ucx_boot_head_t h;
            hs_status_t st = hs__ucx_boot_head_parse(p->rec, &h, why, sizeof why);
            if (st != HS_OK) {
                pending_refuse(tp, p, st, why);
                return;
            }
            uint16_t expect = p->stage == BOOT_HELLO ? HS__UCX_BOOT_HELLO : HS__UCX_BOOT_AUTH;
            if (h.type != expect && h.type != HS__UCX_BOOT_REFUSE) {
                snprintf(why, sizeof why, "UCX bootstrap record type %u instead of %s", h.type,
                         p->stage == BOOT_HELLO ? "a HELLO" : "an AUTH");
                pending_refuse(tp, p, HS_ERR_PROTO, why);
                return;
            }
            /* bounded by the head check: at most HS__UCX_BOOT_RECORD_MAX */
            p->want = HS__UCX_BOOT_HEAD + (size_t)h.body_len;
            if (p->want > sizeof p->small) {
                uint8_t *b = malloc(p->want);
                if (!b) {
                    pending_drop(tp, p, "out of memory");
                    return;
                }
                memcpy(b, p->small, HS__UCX_BOOT_HEAD);
                p->rec = b;
            }
        }
        if (p->want && p->got == p->want) {
            pending_on_record(tp, p);
            return;
        }
    }
}

static void listener_accept(ucx_tp_t *tp, size_t li)
{
    for (;;) {
        struct sockaddr_storage ss;
        socklen_t len;
        int fd = hs__sock_accept(tp->lfds[li], &ss, &len);
        if (fd < 0) {
            if (errno != EAGAIN && errno != EWOULDBLOCK)
                hs__tp_accept_failed(&tp->base, errno, &tp->lfd_resume_ns[li]);
            return;
        }
        if (tp->n_pending >= UCX_PENDING_MAX) {
            /* the oldest gives way: the list is newest first */
            ucx_pending_t *old = tp->pending;
            while (old && old->next)
                old = old->next;
            char why[128];
            snprintf(why, sizeof why, "%u connections in their UCX bootstrap: dropping the oldest",
                     UCX_PENDING_MAX);
            if (old) pending_drop(tp, old, why);
        }
        ucx_pending_t *p = calloc(1, sizeof *p);
        if (!p) {
            hs_warn("out of memory for a connection in its UCX bootstrap: refusing it");
            close(fd);
            continue;
        }
        p->fd = fd;
        p->peer = ss;
        p->peer_len = len;
        hs__tp_addr_format((struct sockaddr *)&ss, p->name, sizeof p->name);
        p->rec = p->small;
        p->stage = BOOT_HELLO;
        p->deadline_ns = hs_now_ns() + (uint64_t)UCX_BOOT_TIMEOUT_MS * 1000000u;
        p->next = tp->pending;
        tp->pending = p;
        tp->n_pending++;
    }
}

/* Waits up to ms on the worker fd (when with_efd) and the bootstrap sockets,
 * then serves the sockets that are ready. A listener paused after a failed
 * accept is left out until its time (hs__tp_accept_failed). */
hs_status_t hs__ucx_sockets_poll(ucx_tp_t *tp, int ms, bool with_efd)
{
    if (!with_efd && tp->n_lfds == 0 && tp->n_pending == 0) return HS_OK;
    size_t n = (with_efd ? 1 : 0) + tp->n_lfds + tp->n_pending;
    struct pollfd stack[64];
    struct pollfd *pf = n <= 64 ? stack : malloc(n * sizeof *pf);
    ucx_pending_t *pstack[64];
    ucx_pending_t **ps = tp->n_pending <= 64 ? pstack : malloc(tp->n_pending * sizeof *ps);
    if (!pf || !ps) {
        if (pf != stack) free(pf);
        if (ps != pstack) free(ps);
        return HS_ERR_NOMEM;
    }
    uint64_t now = hs_now_ns();
    size_t k = 0;
    if (with_efd) pf[k++] = (struct pollfd){.fd = tp->efd, .events = POLLIN};
    size_t lbase = k;
    for (size_t i = 0; i < tp->n_lfds; i++) {
        uint64_t resume = tp->lfd_resume_ns[i];
        bool paused = resume && now < resume;
        if (!paused) tp->lfd_resume_ns[i] = 0;
        /* a negative fd is skipped by poll */
        pf[k++] = (struct pollfd){.fd = paused ? -1 : tp->lfds[i], .events = POLLIN};
        if (paused) {
            int left = (int)((resume - now) / 1000000u + 1);
            if (ms < 0 || ms > left) ms = left;
        }
    }
    size_t pbase = k, np = 0;
    for (ucx_pending_t *p = tp->pending; p; p = p->next) {
        ps[np++] = p;
        pf[k++] = (struct pollfd){.fd = p->fd, .events = POLLIN};
    }
    if (tp->n_pending > 0 && (ms < 0 || ms > 100)) ms = 100; /* bootstrap deadlines */
    int r = poll(pf, k, ms);
    hs_status_t st = HS_OK;
    if (r < 0 && errno != EINTR) {
        hs_error("poll on the UCX transport's fds failed: %m");
        st = HS_ERR_IO;
    } else if (r > 0) {
        /* each pending is freed only by its own read, so serve them before
         * the listeners, whose accepts may drop the oldest */
        for (size_t i = 0; i < np; i++)
            if (pf[pbase + i].revents) pending_read(tp, ps[i]);
        for (size_t i = 0; i < tp->n_lfds; i++)
            if (pf[lbase + i].revents & POLLIN) listener_accept(tp, i);
    }
    now = hs_now_ns();
    for (ucx_pending_t *p = tp->pending, *next; p; p = next) {
        next = p->next;
        if (now < p->deadline_ns) continue;
        if (p->stage == BOOT_REFUSED)
            hs__ucx_pending_free(tp, p);
        else
            pending_drop(tp, p, "no complete UCX bootstrap within 10 s");
    }
    if (pf != stack) free(pf);
    if (ps != pstack) free(ps);
    return st;
}

hs_status_t hs__ucx_listen(hs_tp_t *t, const char *host, uint16_t port, uint16_t *bound_port)
{
    ucx_tp_t *tp = tp_of(t);
    int fd;
    hs_status_t st = hs__sock_listen("ucx transport", host, port, NULL, NULL, &fd, bound_port);
    if (st != HS_OK) return st;
    st = hs__ucx_listen_devices(tp, host);
    if (st != HS_OK) {
        close(fd);
        return st;
    }
    int *n = realloc(tp->lfds, (tp->n_lfds + 1) * sizeof *n);
    if (n) tp->lfds = n;
    uint64_t *r = n ? realloc(tp->lfd_resume_ns, (tp->n_lfds + 1) * sizeof *r) : NULL;
    if (r) tp->lfd_resume_ns = r;
    if (!n || !r) {
        close(fd);
        return HS_ERR_NOMEM;
    }
    tp->lfd_resume_ns[tp->n_lfds] = 0;
    tp->lfds[tp->n_lfds++] = fd;
    return HS_OK;
}
