/* SPDX-License-Identifier: Apache-2.0 */
/* tcp.c - the TCP transport (tcp_int.h describes it): socket options,
 * listeners and accept, connect, the epoll loop, life cycle. Connection
 * I/O is in tcp_conn.c. */

#include "tcp_int.h"
#include "hs_log.h"
#include "hs_time.h"
#include "hs_checksum.h"

#include <assert.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

/* ---- socket setup --------------------------------------------------------- */

static int read_proc_int(const char *path)
{
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    int v = -1;
    if (fscanf(f, "%d", &v) != 1) v = -1;
    fclose(f);
    return v;
}

/* Setting SO_RCVBUF turns off the kernel's receive autotuning, and the kernel
 * caps it at net.core.rmem_max; ask for big buffers only where the cap lets
 * them be big, otherwise autotuning does better. A size in the configuration
 * overrides (hs_tp_create has bounded it). Returns 0 for autotuning. */
static int choose_sockbuf(uint64_t configured)
{
    if (configured == HS_TP_SOCKBUF_AUTOTUNE) return 0;
    if (configured) return (int)configured;
    int rmax = read_proc_int("/proc/sys/net/core/rmem_max");
    int wmax = read_proc_int("/proc/sys/net/core/wmem_max");
    if (rmax >= (int)TCP_SOCKBUF && wmax >= (int)TCP_SOCKBUF) return (int)TCP_SOCKBUF;
    return 0;
}

static void socket_tune(tcp_tp_t *tp, int fd, bool stream)
{
    int one = 1;
    if (tp->sockbuf > 0) {
        int v = tp->sockbuf;
        (void)setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &v, sizeof v);
        (void)setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &v, sizeof v);
    }
    if (!stream) return;
    (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    /* peer failure: keepalive probes after t/2 s of silence, 3 probes t/6 s
     * apart; unacknowledged data for t s also fails the connection. */
    uint32_t t = tp->base.cfg.peer_timeout_s;
    int idle = (int)(t / 2 ? t / 2 : 1), intvl = (int)(t / 6 ? t / 6 : 1), cnt = 3;
    unsigned int user_timeout = t * 1000u;
    (void)setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one);
    (void)setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof idle);
    (void)setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &intvl, sizeof intvl);
    (void)setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &cnt, sizeof cnt);
    (void)setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &user_timeout, sizeof user_timeout);
}

/* hs__sock_tune_cb for connected sockets and for listeners (whose buffer
 * sizes accepted sockets inherit: window scale). */
static void tune_stream(int fd, void *tp) { socket_tune(tp, fd, true); }

static void tune_listener(int fd, void *tp) { socket_tune(tp, fd, false); }

/* ---- listen / accept / connect -------------------------------------------- */

/* Takes the listener out of epoll until l->resume_ns (see the top). */
static void listener_pause(tcp_tp_t *tp, tcp_listener_t *l, int err)
{
    hs__tp_accept_failed(&tp->base, err, &l->resume_ns);
    if (epoll_ctl(tp->epfd, EPOLL_CTL_DEL, l->fd, NULL) != 0) l->resume_ns = 0;
}

/* Puts paused listeners whose time has come back into epoll; returns the
 * timeout to wait at most so that the next one is not missed. */
static int listeners_resume(tcp_tp_t *tp, int timeout_ms)
{
    uint64_t now = hs_now_ns();
    for (tcp_listener_t *l = tp->listeners; l; l = l->next) {
        if (!l->resume_ns) continue;
        if (now >= l->resume_ns) {
            struct epoll_event e = {.events = EPOLLIN, .data.ptr = &l->obj};
            if (epoll_ctl(tp->epfd, EPOLL_CTL_ADD, l->fd, &e) == 0 || errno == EEXIST)
                l->resume_ns = 0;
            continue;
        }
        int ms = (int)((l->resume_ns - now) / 1000000u + 1);
        if (timeout_ms < 0 || ms < timeout_ms) timeout_ms = ms;
    }
    return timeout_ms;
}

static void tcp_accept(tcp_tp_t *tp, tcp_listener_t *l)
{
    if (l->unix_sock) {
        hs__tcp_shm_accept(tp, l);
        return;
    }
    for (;;) {
        struct sockaddr_storage ss;
        socklen_t len;
        int fd = hs__sock_accept(l->fd, &ss, &len);
        if (fd < 0) {
            if (errno != EAGAIN && errno != EWOULDBLOCK) listener_pause(tp, l, errno);
            return;
        }
        if (tp->shm_mode == SHM_ONLY) {
            /* --transport shm: producers on this host only */
            char peer[HS__TP_PEER_CAP];
            hs__tp_addr_format((struct sockaddr *)&ss, peer, sizeof peer);
            hs_warn("connection from %s refused: this consumer takes shared-memory producers on "
                    "its host only (--transport shm); give both sides --transport auto or tcp",
                    peer);
            tp->base.shm_refused++;
            close(fd);
            continue;
        }
        socket_tune(tp, fd, true);
        tcp_conn_t *c = hs__tcp_conn_new(tp, fd, (struct sockaddr *)&ss, len);
        if (!c) {
            close(fd);
            continue;
        }
        hs_debug("accepted %s", c->base.describe);
        hs_status_t st = tp->base.cb.on_accept(tp->base.arg, &c->base);
        if (st != HS_OK) hs__tcp_conn_begin_close(c, st, "connection refused by this side");
    }
}

static hs_status_t tcp_listen(hs_tp_t *t, const char *host, uint16_t port, uint16_t *bound_port)
{
    tcp_tp_t *tp = tp_of(t);
    int fd;
    hs_status_t st =
        hs__sock_listen("tcp transport", host, port, tune_listener, tp, &fd, bound_port);
    if (st != HS_OK) return st;
    if ((st = hs__tcp_listener_add(tp, fd, false)) != HS_OK) return st;
    if (tp->shm_mode != SHM_OFF) {
        uint16_t p = port;
        struct sockaddr_storage ss;
        socklen_t sl = sizeof ss;
        if (getsockname(fd, (struct sockaddr *)&ss, &sl) == 0)
            p = ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
                                               : ((struct sockaddr_in *)&ss)->sin_port);
        return hs__tcp_shm_listen(tp, p);
    }
    return HS_OK;
}

static hs_status_t tcp_connect(hs_tp_t *t, const char *host, uint16_t port, int timeout_ms,
                               unsigned flags, hs_tp_conn_t **out)
{
    tcp_tp_t *tp = tp_of(t);
    uint64_t deadline = timeout_ms < 0 ? UINT64_MAX : hs_now_ns() + (uint64_t)timeout_ms * 1000000u;
    hs_log_level_t level = flags & HS_TP_CONNECT_QUIET ? HS_LOG_INFO : HS_LOG_ERROR;
    bool local = tp->shm_mode != SHM_OFF && hs__shm_host_is_local(host);
    char why[200];
    if (tp->shm_mode == SHM_ONLY) {
        if (!local) {
            hs_error("--transport shm: %s is not an address of this host; shared memory joins a "
                     "producer and a consumer on one host (use --transport auto or tcp)",
                     host);
            return HS_ERR_INVALID;
        }
        tcp_conn_t *c = NULL;
        hs_status_t st = hs__tcp_shm_connect(tp, host, port, deadline, false, &c, why, sizeof why);
        if (st != HS_OK) {
            hs_log(st == HS_ERR_TIMEOUT ? level : HS_LOG_ERROR,
                   "cannot connect to the consumer on port %u of this host over shared memory: "
                   "%s; is it running with --transport shm or auto?",
                   port, why);
            return st;
        }
        hs_debug("connected %s", c->base.describe);
        *out = &c->base;
        return HS_OK;
    }
    if (local) {
        /* auto: shared memory when the consumer on this host offers it,
         * else TCP below (a consumer with --transport tcp offers none) */
        tcp_conn_t *c = NULL;
        for (;;) {
            hs_status_t st =
                hs__tcp_shm_connect(tp, host, port, deadline, true, &c, why, sizeof why);
            if (st == HS_OK) {
                hs_debug("connected %s", c->base.describe);
                *out = &c->base;
                return HS_OK;
            }
            if (st != HS_ERR_CLOSED) {
                hs_warn("shared memory with the consumer on port %u failed (%s); using TCP", port,
                        why);
                break;
            }
            /* nobody on the shared-memory name: is a TCP-only consumer up? */
            bool up = false;
            struct addrinfo *pai = NULL;
            if (hs__sock_resolve(host, port, false, &pai) == HS_OK) {
                int probe = socket(pai->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
                up = probe >= 0 && connect(probe, pai->ai_addr, pai->ai_addrlen) == 0;
                if (probe >= 0) close(probe);
                freeaddrinfo(pai);
            }
            if (up) {
                /* it listens on TCP; its shared-memory listener follows
                 * within a moment when it has one */
                poll(NULL, 0, 50);
                if (hs__tcp_shm_connect(tp, host, port, deadline, true, &c, why, sizeof why) ==
                    HS_OK) {
                    *out = &c->base;
                    return HS_OK;
                }
                break;
            }
            if (hs_now_ns() >= deadline) break;
            poll(NULL, 0, HS__SOCK_RETRY_MS);
        }
    }
    struct addrinfo *ai = NULL;
    hs_status_t st = hs__sock_resolve(host, port, false, &ai);
    if (st != HS_OK) return st;
    int fd = -1;
    const struct addrinfo *used = NULL;
    st = hs__sock_connect(ai, deadline, tune_stream, tp, &fd, &used, why, sizeof why);
    if (st != HS_OK) {
        freeaddrinfo(ai);
        if (st == HS_ERR_TIMEOUT)
            hs_log(level,
                   "cannot connect to %s port %u before the timeout: %s; is the consumer running "
                   "and reachable?",
                   host, port, why);
        else
            hs_log(level, "cannot connect to %s port %u: %s; check the address and the route to it",
                   host, port, why);
        return st;
    }
    tcp_conn_t *c = hs__tcp_conn_new(tp, fd, used->ai_addr, used->ai_addrlen);
    freeaddrinfo(ai);
    if (!c) {
        close(fd);
        return HS_ERR_NOMEM;
    }
    hs_debug("connected %s", c->base.describe);
    *out = &c->base;
    return HS_OK;
}

static void check_lingers(tcp_tp_t *tp)
{
    uint64_t now = hs_now_ns();
    for (tcp_conn_t *c = tp->conns; c; c = c->next) {
        if (c->closing && !c->finalize && now >= c->linger_deadline_ns) {
            hs_warn("connection %s: peer did not take the last queued bytes within %d ms; "
                    "dropping them",
                    c->base.peer, TCP_LINGER_MS);
            hs__tcp_conn_mark_finalize(c);
        }
    }
}

static int next_linger_ms(tcp_tp_t *tp, int timeout_ms)
{
    uint64_t now = hs_now_ns();
    for (tcp_conn_t *c = tp->conns; c; c = c->next) {
        if (!c->closing || c->finalize) continue;
        int ms =
            now >= c->linger_deadline_ns ? 0 : (int)((c->linger_deadline_ns - now) / 1000000u + 1);
        if (timeout_ms < 0 || ms < timeout_ms) timeout_ms = ms;
    }
    return timeout_ms;
}

static hs_status_t tcp_progress(hs_tp_t *t, int timeout_ms)
{
    tcp_tp_t *tp = tp_of(t);
    if (tp->in_progress) {
        hs_error("hs_tp_progress called from inside a transport callback");
        return HS_ERR_BUSY;
    }
    tp->in_progress = true;
    if (tp->n_finalize > 0) {
        hs__tcp_run_finalizers(tp);
        timeout_ms = 0; /* something happened */
    }
    timeout_ms = next_linger_ms(tp, timeout_ms);
    timeout_ms = listeners_resume(tp, timeout_ms);
    struct epoll_event ev[TCP_EVENTS];
    int n = epoll_wait(tp->epfd, ev, TCP_EVENTS, timeout_ms);
    if (n < 0) {
        int e = errno;
        tp->in_progress = false;
        if (e == EINTR) return HS_OK;
        hs_error("epoll_wait failed: %s", strerror(e));
        return HS_ERR_IO;
    }
    for (int i = 0; i < n; i++) {
        tcp_obj_t *o = ev[i].data.ptr;
        if (o->kind == OBJ_WAKE) {
            uint64_t v;
            while (read(tp->wake_fd, &v, sizeof v) > 0) {
            }
            hs__tcp_copies_finish(tp); /* the copiers wake the loop too */
        } else if (o->kind == OBJ_LISTENER) {
            tcp_accept(tp, (tcp_listener_t *)o);
        } else {
            tcp_conn_t *c = (tcp_conn_t *)((char *)o - offsetof(tcp_conn_t, obj));
            if (c->finalize) continue;
            uint32_t e = ev[i].events;
            if (!c->closing && (e & (EPOLLIN | EPOLLHUP | EPOLLERR))) hs__tcp_conn_read(c);
            if (!c->finalize && c->seg_count > 0 && (e & (EPOLLOUT | EPOLLHUP | EPOLLERR)))
                hs__tcp_conn_flush(c);
            if (!c->finalize && c->closing && (e & (EPOLLHUP | EPOLLERR)))
                hs__tcp_conn_mark_finalize(c);
        }
    }
    check_lingers(tp);
    hs__tcp_run_finalizers(tp);
    tp->in_progress = false;
    return HS_OK;
}

static void tcp_wakeup(hs_tp_t *t)
{
    tcp_tp_t *tp = tp_of(t);
    uint64_t one = 1;
    ssize_t r = write(tp->wake_fd, &one, sizeof one);
    (void)r; /* EAGAIN: the counter is already non-zero, which is the point */
}

static hs_status_t tcp_mem_register(hs_tp_t *t, void *addr, size_t len) { return HS_OK; }

/* ---- life cycle ----------------------------------------------------------- */

static hs_status_t tcp_create(const hs_tp_config_t *cfg, hs_tp_t **out)
{
    tcp_tp_t *tp = calloc(1, sizeof *tp);
    if (!tp) return HS_ERR_NOMEM;
    tp->wake_obj.kind = OBJ_WAKE;
    tp->epfd = epoll_create1(EPOLL_CLOEXEC);
    if (tp->epfd < 0) {
        hs_error("epoll_create1 failed: %m");
        goto err_tp;
    }
    tp->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (tp->wake_fd < 0) {
        hs_error("eventfd failed: %m");
        goto err_ep;
    }
    struct epoll_event e = {.events = EPOLLIN, .data.ptr = &tp->wake_obj};
    if (epoll_ctl(tp->epfd, EPOLL_CTL_ADD, tp->wake_fd, &e) != 0) {
        hs_error("epoll_ctl(ADD) for the wakeup eventfd: %m");
        goto err_wake;
    }
    tp->sockbuf = choose_sockbuf(cfg->tcp_sockbuf);
    tp->shm_mode = cfg->kind == HS_TP_SHM ? SHM_ONLY : cfg->kind == HS_TP_AUTO ? SHM_AUTO : SHM_OFF;
    tp->copiers = cfg->shm_copiers ? cfg->shm_copiers : hs__shm_copier_threads_default();
    *out = &tp->base;
    return HS_OK;

err_wake:
    close(tp->wake_fd);
err_ep:
    close(tp->epfd);
err_tp:
    free(tp);
    return HS_ERR_IO;
}

static void tcp_destroy(hs_tp_t *t)
{
    tcp_tp_t *tp = tp_of(t);
    tp->in_progress = true;
    /* one last non-blocking push of what is queued (a BYE, say), then close */
    for (tcp_conn_t *c = tp->conns; c; c = c->next) {
        if (!c->closing) hs__tcp_conn_begin_close(c, HS_ERR_CLOSED, "transport destroyed");
        if (!c->finalize && c->seg_count > 0) hs__tcp_conn_flush(c);
        hs__tcp_conn_mark_finalize(c);
    }
    hs__tcp_run_finalizers(tp);
    while (tp->listeners) {
        tcp_listener_t *l = tp->listeners;
        tp->listeners = l->next;
        close(l->fd);
        free(l);
    }
    close(tp->wake_fd);
    close(tp->epfd);
    hs__shm_ring_destroy(&tp->ring);
    hs__shm_copier_destroy(tp->copier); /* idle: every connection waited for its copy */
    free(tp);
}

const hs_tp_ops_t hs__tp_tcp_ops = {
    .name = "tcp",
    .create = tcp_create,
    .destroy = tcp_destroy,
    .listen = tcp_listen,
    .connect = tcp_connect,
    .send = hs__tcp_send,
    .send_payload = hs__tcp_send_payload,
    .recv_payload = hs__tcp_recv_payload,
    .close = hs__tcp_close,
    .progress = tcp_progress,
    .wakeup = tcp_wakeup,
    .mem_register = tcp_mem_register,
    .mem_alloc = hs__tcp_mem_alloc,
    .mem_free = hs__tcp_mem_free,
    .conn_kind = hs__tcp_conn_kind,
};
