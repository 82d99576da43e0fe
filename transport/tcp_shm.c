/* SPDX-License-Identifier: Apache-2.0 */
/* tcp_shm.c - the TCP transport's shared-memory connections (shm_int.h):
 * the abstract Unix listener next to the TCP port, accepting (SO_PEERCRED,
 * preambles), connecting from a producer on the same host, and the
 * transport's shared payload memory (hs_tp_mem_alloc). */
#include "tcp_int.h"
#include "hs_log.h"
#include "hs_time.h"

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

/* Names a shared-memory connection: peer "shm pid N", its description. */
static void conn_name(tcp_conn_t *c, pid_t pid, uid_t uid, bool accepted)
{
    c->shm->peer_pid = pid;
    c->shm->peer_uid = uid;
    snprintf(c->base.peer, sizeof c->base.peer, "shm:pid %d", (int)pid);
    snprintf(c->base.describe, sizeof c->base.describe,
             "shm (shared memory on this host, %s pid %d uid %u)",
             accepted ? "producer" : "consumer", (int)pid, (unsigned)uid);
}

static tcp_conn_t *conn_make(tcp_tp_t *tp, int fd)
{
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    tcp_conn_t *c = hs__tcp_conn_new(tp, fd, (struct sockaddr *)&sa, sizeof sa);
    if (!c) return NULL;
    c->shm = hs__shm_conn_new();
    if (!c->shm) {
        hs__tcp_conn_begin_close(c, HS_ERR_NOMEM, "out of memory");
        hs__tcp_conn_mark_finalize(c);
        return NULL;
    }
    return c;
}

hs_status_t hs__tcp_shm_listen(tcp_tp_t *tp, uint16_t port)
{
    struct sockaddr_un sa;
    socklen_t len = hs__shm_addr(port, &sa);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        hs_error("cannot make the shared-memory listener: %m");
        return HS_ERR_IO;
    }
    if (bind(fd, (struct sockaddr *)&sa, len) != 0 || listen(fd, HS__SOCK_BACKLOG) != 0) {
        int e = errno;
        close(fd);
        if (tp->shm_mode == SHM_ONLY) {
            hs_error("cannot listen for shared-memory producers on port %u: %s (another consumer "
                     "on this host uses port %u?)",
                     port, strerror(e), port);
            return HS_ERR_IO;
        }
        hs_warn("producers on this host will use TCP: the shared-memory listener for port %u "
                "cannot be had (%s; another consumer in this network namespace uses the port?)",
                port, strerror(e));
        tp->shm_mode = SHM_OFF;
        return HS_OK;
    }
    hs_status_t st = hs__tcp_listener_add(tp, fd, true);
    if (st != HS_OK) return st;
    hs_info("shared-memory listener for producers on this host: @hsflow-shm-%u", port);
    return HS_OK;
}

void hs__tcp_shm_accept(tcp_tp_t *tp, tcp_listener_t *l)
{
    for (;;) {
        int fd = accept4(l->fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EINTR || errno == ECONNABORTED) continue;
            if (errno != EAGAIN && errno != EWOULDBLOCK) {
                hs__tp_accept_failed(&tp->base, errno, &l->resume_ns);
                if (epoll_ctl(tp->epfd, EPOLL_CTL_DEL, l->fd, NULL) != 0) l->resume_ns = 0;
            }
            return;
        }
        struct ucred cred = {0};
        socklen_t cl = sizeof cred;
        if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &cl) != 0) {
            hs_warn("shared-memory peer refused: SO_PEERCRED failed: %m");
            tp->base.shm_refused++;
            close(fd);
            continue;
        }
        if (cred.uid != getuid() && cred.uid != 0) {
            hs_warn("shared-memory peer pid %d refused: it runs as uid %u, this consumer as %u "
                    "(run both as one user, or connect over TCP)",
                    (int)cred.pid, (unsigned)cred.uid, (unsigned)getuid());
            tp->base.shm_refused++;
            close(fd);
            continue;
        }
        uint8_t pre[SHM_PREAMBLE_BYTES];
        hs__shm_preamble_make(pre);
        if (send(fd, pre, sizeof pre, MSG_NOSIGNAL | MSG_DONTWAIT) != (ssize_t)sizeof pre) {
            close(fd); /* a fresh socket takes 64 bytes: the peer is gone */
            continue;
        }
        tcp_conn_t *c = conn_make(tp, fd);
        if (!c) {
            close(fd);
            continue;
        }
        conn_name(c, cred.pid, cred.uid, true);
        hs_debug("accepted %s", c->base.describe);
        hs_status_t st = tp->base.cb.on_accept(tp->base.arg, &c->base);
        if (st != HS_OK) hs__tcp_conn_begin_close(c, st, "connection refused by this side");
    }
}

/* One attempt: connect, swap preambles. HS_ERR_CLOSED when nobody listens
 * (try again or fall back), other errors are final. */
static hs_status_t shm_try(tcp_tp_t *tp, uint16_t port, uint64_t deadline, tcp_conn_t **out,
                           char *why, size_t cap)
{
    struct sockaddr_un sa;
    socklen_t len = hs__shm_addr(port, &sa);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        snprintf(why, cap, "socket: %s", strerror(errno));
        return HS_ERR_IO;
    }
    if (connect(fd, (struct sockaddr *)&sa, len) != 0 && errno != EINPROGRESS) {
        int e = errno;
        close(fd);
        snprintf(why, cap, "%s", strerror(e));
        return e == ECONNREFUSED || e == ENOENT || e == EAGAIN ? HS_ERR_CLOSED : HS_ERR_IO;
    }
    if (errno == EINPROGRESS) {
        struct pollfd p = {.fd = fd, .events = POLLOUT};
        int err = 0;
        socklen_t el = sizeof err;
        if (poll(&p, 1, hs__sock_ms_left(deadline)) != 1 ||
            getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &el) != 0 || err) {
            close(fd);
            snprintf(why, cap, "%s", err ? strerror(err) : "no answer");
            return HS_ERR_CLOSED;
        }
    }
    uint8_t pre[SHM_PREAMBLE_BYTES];
    hs__shm_preamble_make(pre);
    if (!hs__sock_io(fd, pre, sizeof pre, true, deadline) ||
        !hs__sock_io(fd, pre, sizeof pre, false, deadline)) {
        snprintf(why, cap, "the consumer closed the shared-memory connection (%s)",
                 strerror(errno));
        close(fd);
        return HS_ERR_IO;
    }
    pid_t pid;
    hs_status_t st = hs__shm_preamble_check(pre, &pid, why, cap);
    if (st != HS_OK) {
        close(fd);
        return st;
    }
    struct ucred cred = {0};
    socklen_t cl = sizeof cred;
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &cl) != 0 ||
        (cred.uid != getuid() && cred.uid != 0)) {
        /* an abstract name can be taken by anyone: our ring goes only to a
         * consumer of our own user (or root) */
        snprintf(why, cap,
                 "the process answering on @hsflow-shm-%u (pid %d) runs as uid %u, "
                 "not as this producer's %u",
                 port, (int)cred.pid, (unsigned)cred.uid, (unsigned)getuid());
        close(fd);
        return HS_ERR_AUTH;
    }
    tcp_conn_t *c = conn_make(tp, fd);
    if (!c) {
        close(fd);
        snprintf(why, cap, "out of memory");
        return HS_ERR_NOMEM;
    }
    c->shm->pre_done = true; /* read above */
    conn_name(c, cred.pid ? cred.pid : pid, cred.uid, false);
    *out = c;
    return HS_OK;
}

hs_status_t hs__tcp_shm_connect(tcp_tp_t *tp, const char *host, uint16_t port, uint64_t deadline,
                                bool once, tcp_conn_t **out, char *why, size_t cap)
{
    (void)host; /* the consumer is on this host: its port names it */
    for (;;) {
        hs_status_t st = shm_try(tp, port, deadline, out, why, cap);
        if (st != HS_ERR_CLOSED || once) return st;
        if (hs_now_ns() >= deadline) return HS_ERR_TIMEOUT;
        int ms = hs__sock_ms_left(deadline);
        poll(NULL, 0, ms < 0 || ms > HS__SOCK_RETRY_MS ? HS__SOCK_RETRY_MS : ms);
    }
}

/* ---- payload memory ------------------------------------------------------- */

hs_status_t hs__tcp_mem_alloc(hs_tp_t *t, size_t len, void **out)
{
    if (tp_of(t)->shm_mode == SHM_OFF) return HS_ERR_UNSUPPORTED; /* plain memory will do */
    return hs__shm_ring_alloc(&tp_of(t)->ring, len, out);
}

bool hs__tcp_mem_free(hs_tp_t *t, void *p) { return hs__shm_ring_free(&tp_of(t)->ring, p); }

const char *hs__tcp_conn_kind(const hs_tp_conn_t *conn)
{
    return ((const tcp_conn_t *)conn)->shm ? "shm" : "tcp";
}
