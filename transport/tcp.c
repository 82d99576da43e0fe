/* tcp.c - the TCP transport: non-blocking sockets, one level-triggered epoll
 * loop per hs_tp_t, an eventfd for hs_tp_wakeup(), IPv4 and IPv6.
 *
 * Byte layout of one message on the stream (all integers little-endian):
 *
 *   offset 0   payload_len  u64   bytes of payload after the frame (0: none)
 *   offset 8   frame header 16 B  hs_proto.h: magic|version|type|body_len|crc
 *   offset 24  frame body   body_len bytes (protobuf, never parsed here)
 *   then       payload      payload_len bytes (hs_tp_send_payload only)
 *
 * The 8-byte prefix is the transport's own: the frame header does not say
 * whether a payload follows. The receiver decodes the header (bounded by
 * max_frame_body) before it trusts payload_len, and never reads past the end
 * of a frame that a payload follows, so payload bytes go from the socket
 * straight into the `dest` given to hs_tp_recv_payload() (recv() into dest,
 * no intermediate buffer). On the send side payloads are queued by reference
 * and written with sendmsg() straight from the caller's buffer.
 *
 * Receive buffer: one per connection, grown (never per frame) up to
 * prefix + header + the connection's frame limit + one more prefix + header,
 * the read-ahead allowed when no payload follows the current frame. The
 * limit is max_frame_body unless the owner lowered it for this connection
 * (hs_tp_conn_set_max_frame), e.g. until the peer is authenticated.
 *
 * Listeners: an accept() that fails for want of descriptors leaves the
 * listening socket readable; the listener is then taken out of epoll for
 * HS__TP_ACCEPT_PAUSE_MS instead of being retried in a spin.
 *
 * Send queue: frames are copied into a per-connection byte buffer; the queue
 * itself is a ring of segments, each either "the next n bytes of the buffer"
 * or "n bytes of a caller's payload, then call cb". EPOLLOUT is armed only
 * while something is queued.
 *
 * Statuses given to on_close: HS_ERR_CLOSED peer closed between messages;
 * HS_ERR_IO reset, socket error, or end of stream inside a message;
 * HS_ERR_FORMAT / HS_ERR_MISMATCH / HS_ERR_CHECKSUM bad frame header, version
 * or crc (an ERROR frame is sent first, best effort); HS_ERR_PROTO payload not
 * accepted by the receiver; hs_tp_close()'s reason for a local close.
 */
#include "hs_transport_int.h"
#include "sock_int.h"

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

#define TCP_PREFIX 8u
#define TCP_HEAD (TCP_PREFIX + HS_FRAME_HEADER_BYTES)
#define TCP_RX_INITIAL (64u << 10)
#define TCP_TX_INITIAL (16u << 10)
#define TCP_TX_MAX (256u << 20) /* copied frames queued on one connection */
#define TCP_IOV_MAX 64
#define TCP_IO_CHUNK (1u << 30)      /* largest single recv()/iovec */
#define TCP_READ_BUDGET (256u << 20) /* bytes read per wakeup, then other fds get a turn */
#define TCP_LINGER_MS 2000           /* hs_tp_close() flush bound */
#define TCP_SOCKBUF (16u << 20)      /* asked-for SO_SNDBUF / SO_RCVBUF */
#define TCP_EVENTS 64

typedef enum { OBJ_WAKE, OBJ_LISTENER, OBJ_CONN } obj_kind_t;

typedef struct {
    obj_kind_t kind;
} tcp_obj_t;

typedef struct tcp_listener {
    tcp_obj_t obj;
    int fd;
    uint64_t resume_ns; /* not polled until then after a failed accept (0 = polled) */
    struct tcp_listener *next;
} tcp_listener_t;

typedef enum { SEG_COPY, SEG_REF } seg_kind_t;

typedef struct {
    seg_kind_t kind;
    uint64_t len;       /* bytes still to send */
    const uint8_t *ptr; /* SEG_REF: next byte to send */
    hs_tp_send_cb cb;
    void *cb_arg;
} tcp_seg_t;

typedef enum { RX_HEAD, RX_BODY, RX_PAYLOAD } rx_state_t;

typedef struct tcp_tp tcp_tp_t;

typedef struct tcp_conn {
    hs_tp_conn_t base; /* first: hs_tp_conn_t * <-> tcp_conn_t * */
    tcp_obj_t obj;
    tcp_tp_t *tp;
    int fd;
    struct tcp_conn *prev, *next;
    uint32_t events; /* epoll mask now registered */

    /* receive */
    rx_state_t rx_state;
    uint8_t *rx;
    size_t rx_cap, rx_len;
    hs_frame_header_t rx_hdr;
    uint64_t rx_payload_len;
    bool pl_active; /* a payload is being received into pl_dest */
    uint8_t *pl_dest;
    uint64_t pl_len, pl_done, pl_cookie;

    /* send */
    uint8_t *tx;
    size_t tx_cap, tx_head, tx_tail; /* queued copied bytes are tx[tx_head, tx_tail) */
    tcp_seg_t *segs;
    size_t seg_cap, seg_head, seg_count;

    /* close */
    bool closing;  /* no new sends, no more reads; flushing */
    bool finalize; /* on_close pending in this or the next progress */
    hs_status_t close_reason;
    uint64_t linger_deadline_ns;
    char close_why[256];
} tcp_conn_t;

struct tcp_tp {
    hs_tp_t base; /* first */
    int epfd;
    tcp_obj_t wake_obj;
    int wake_fd;
    tcp_listener_t *listeners;
    tcp_conn_t *conns;
    size_t n_finalize;
    bool in_progress;
    int sockbuf; /* SO_SNDBUF/SO_RCVBUF to ask for, 0 = leave autotuning */
};

static tcp_conn_t *conn_of(hs_tp_conn_t *c)
{
    return (tcp_conn_t *)c;
}
static tcp_tp_t *tp_of(hs_tp_t *t)
{
    return (tcp_tp_t *)t;
}

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
 * them be big, otherwise autotuning does better. HS_TCP_SOCKBUF (bytes, 0 =
 * autotune) overrides. */
static int choose_sockbuf(void)
{
    const char *env = getenv("HS_TCP_SOCKBUF");
    if (env) {
        uint64_t v;
        if (hs_parse_size(env, &v) == HS_OK && v <= (1u << 30)) return (int)v;
        hs_warn("ignoring HS_TCP_SOCKBUF='%s': give a size such as 16M, or 0 for autotuning", env);
    }
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
static void tune_stream(int fd, void *tp)
{
    socket_tune(tp, fd, true);
}
static void tune_listener(int fd, void *tp)
{
    socket_tune(tp, fd, false);
}

/* ---- connection objects ---------------------------------------------------- */

static void conn_set_events(tcp_conn_t *c)
{
    if (c->fd < 0) return;
    uint32_t ev = 0;
    if (!c->closing) ev |= EPOLLIN;
    if (c->seg_count > 0) ev |= EPOLLOUT;
    if (ev == c->events) return;
    struct epoll_event e = {.events = ev, .data.ptr = &c->obj};
    if (epoll_ctl(c->tp->epfd, EPOLL_CTL_MOD, c->fd, &e) == 0) c->events = ev;
}

static void conn_mark_finalize(tcp_conn_t *c)
{
    if (c->finalize) return;
    c->finalize = true;
    c->tp->n_finalize++;
}

/* Starts closing: no more reads or new sends; what is queued is flushed for
 * up to TCP_LINGER_MS, then on_close(reason, why) runs from progress. */
static void conn_begin_close(tcp_conn_t *c, hs_status_t reason, const char *why)
{
    if (c->closing) return;
    c->closing = true;
    c->close_reason = reason;
    snprintf(c->close_why, sizeof c->close_why, "%s", why);
    c->linger_deadline_ns = hs_now_ns() + (uint64_t)TCP_LINGER_MS * 1000000u;
    if (c->seg_count == 0)
        conn_mark_finalize(c);
    else
        conn_set_events(c);
}

/* Makes room for `more` segments in the ring (grown, never shrunk). */
static hs_status_t seg_reserve(tcp_conn_t *c, size_t more)
{
    if (c->seg_count + more <= c->seg_cap) return HS_OK;
    size_t ncap = c->seg_cap ? c->seg_cap * 2 : 16;
    while (ncap < c->seg_count + more)
        ncap *= 2;
    tcp_seg_t *n = malloc(ncap * sizeof *n);
    if (!n) return HS_ERR_NOMEM;
    for (size_t i = 0; i < c->seg_count; i++)
        n[i] = c->segs[(c->seg_head + i) % c->seg_cap];
    free(c->segs);
    c->segs = n;
    c->seg_cap = ncap;
    c->seg_head = 0;
    return HS_OK;
}

static hs_status_t seg_push(tcp_conn_t *c, tcp_seg_t s)
{
    if (s.kind == SEG_COPY && c->seg_count > 0) {
        tcp_seg_t *last = &c->segs[(c->seg_head + c->seg_count - 1) % c->seg_cap];
        if (last->kind == SEG_COPY) {
            last->len += s.len;
            return HS_OK;
        }
    }
    hs_status_t st = seg_reserve(c, 1);
    if (st != HS_OK) return st;
    c->segs[(c->seg_head + c->seg_count) % c->seg_cap] = s;
    c->seg_count++;
    return HS_OK;
}

/* Copies prefix + frame into the send buffer as one SEG_COPY (merged with a
 * preceding copy segment). Undone on failure. */
static hs_status_t tx_append_frame(tcp_conn_t *c, uint64_t payload_len, const void *frame,
                                   size_t frame_len)
{
    size_t need = TCP_PREFIX + frame_len;
    if (c->tx_cap - c->tx_tail < need && c->tx_head > 0) {
        memmove(c->tx, c->tx + c->tx_head, c->tx_tail - c->tx_head);
        c->tx_tail -= c->tx_head;
        c->tx_head = 0;
    }
    if (c->tx_cap - c->tx_tail < need) {
        size_t ncap = c->tx_cap ? c->tx_cap : TCP_TX_INITIAL;
        while (ncap - c->tx_tail < need)
            ncap *= 2;
        if (ncap > TCP_TX_MAX) {
            hs_error("connection %s: %zu bytes of frames already queued, the peer is not "
                     "reading; close it or slow down",
                     c->base.peer, c->tx_tail - c->tx_head);
            return HS_ERR_NOSPACE;
        }
        uint8_t *n = realloc(c->tx, ncap);
        if (!n) return HS_ERR_NOMEM;
        c->tx = n;
        c->tx_cap = ncap;
    }
    uint8_t *p = c->tx + c->tx_tail;
    hs_le64_store(p, payload_len);
    memcpy(p + TCP_PREFIX, frame, frame_len);
    tcp_seg_t s = {.kind = SEG_COPY, .len = need};
    hs_status_t st = seg_push(c, s);
    if (st != HS_OK) return st;
    c->tx_tail += need;
    return HS_OK;
}

static tcp_conn_t *conn_new(tcp_tp_t *tp, int fd, const struct sockaddr *sa, socklen_t salen)
{
    tcp_conn_t *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    c->base.tp = &tp->base;
    c->obj.kind = OBJ_CONN;
    c->tp = tp;
    c->fd = fd;
    c->base.max_frame_body = tp->base.cfg.max_frame_body;
    c->rx_cap = TCP_RX_INITIAL;
    size_t bound = (size_t)TCP_HEAD * 2 + tp->base.cfg.max_frame_body;
    if (c->rx_cap > bound) c->rx_cap = bound;
    c->rx = malloc(c->rx_cap);
    if (!c->rx) goto err_conn;
    hs__tp_conn_set_peer(&c->base, sa, salen);
    struct sockaddr_storage local;
    socklen_t llen = sizeof local;
    char lbuf[HS__TP_PEER_CAP] = "?";
    if (getsockname(fd, (struct sockaddr *)&local, &llen) == 0)
        hs__tp_addr_format((struct sockaddr *)&local, lbuf, sizeof lbuf);
    int sb = 0, rb = 0;
    socklen_t ol = sizeof sb;
    (void)getsockopt(fd, SOL_SOCKET, SO_SNDBUF, &sb, &ol);
    ol = sizeof rb;
    (void)getsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rb, &ol);
    snprintf(c->base.describe, sizeof c->base.describe,
             "tcp %s -> %s (sndbuf %d KiB, rcvbuf %d KiB%s)", lbuf, c->base.peer, sb >> 10,
             rb >> 10, tp->sockbuf ? "" : ", autotuned");
    c->events = EPOLLIN;
    struct epoll_event e = {.events = EPOLLIN, .data.ptr = &c->obj};
    if (epoll_ctl(tp->epfd, EPOLL_CTL_ADD, fd, &e) != 0) {
        hs_error("epoll_ctl(ADD) for connection %s: %m", c->base.peer);
        goto err_rx;
    }
    c->next = tp->conns;
    if (tp->conns) tp->conns->prev = c;
    tp->conns = c;
    return c;

err_rx:
    free(c->rx);
err_conn:
    free(c);
    return NULL;
}

/* Runs the failure callbacks and on_close, closes the socket, frees. */
static void conn_finalize(tcp_conn_t *c)
{
    tcp_tp_t *tp = c->tp;
    if (c->fd >= 0) {
        (void)epoll_ctl(tp->epfd, EPOLL_CTL_DEL, c->fd, NULL);
        if (c->close_reason != HS_ERR_IO) {
            /* FIN after what was sent, and read off (a bounded amount of)
             * what the peer already sent: closing with unread bytes makes
             * the kernel send a reset, which can destroy our last frame
             * (an ERROR, a BYE) before the peer reads it */
            (void)shutdown(c->fd, SHUT_WR);
            uint8_t scratch[16384];
            for (int i = 0; i < 16; i++)
                if (recv(c->fd, scratch, sizeof scratch, MSG_DONTWAIT) <= 0) break;
        }
        close(c->fd);
        c->fd = -1;
    }
    c->closing = true; /* sends from the callbacks below fail */
    if (c->tx_tail > c->tx_head || c->seg_count > 0)
        hs_debug("connection %s: dropping %zu queued segments at close", c->base.peer,
                 c->seg_count);
    if (c->pl_active) {
        c->pl_active = false;
        if (tp->base.cb.on_payload)
            tp->base.cb.on_payload(tp->base.arg, &c->base, c->pl_cookie, HS_ERR_CLOSED);
    }
    while (c->seg_count > 0) {
        tcp_seg_t s = c->segs[c->seg_head];
        c->seg_head = (c->seg_head + 1) % c->seg_cap;
        c->seg_count--;
        if (s.kind == SEG_REF && s.cb) s.cb(s.cb_arg, HS_ERR_CLOSED);
    }
    tp->base.cb.on_close(tp->base.arg, &c->base, c->close_reason, c->close_why);
    if (c->prev)
        c->prev->next = c->next;
    else
        tp->conns = c->next;
    if (c->next) c->next->prev = c->prev;
    if (c->finalize) tp->n_finalize--;
    free(c->rx);
    free(c->tx);
    free(c->segs);
    free(c);
}

static void run_finalizers(tcp_tp_t *tp)
{
    /* callbacks may close more connections: loop until none is pending */
    while (tp->n_finalize > 0) {
        tcp_conn_t *c = tp->conns;
        while (c && !c->finalize)
            c = c->next;
        if (!c) {
            tp->n_finalize = 0; /* cannot happen; keeps the loop finite */
            break;
        }
        conn_finalize(c);
    }
}

/* ---- sending --------------------------------------------------------------- */

/* Writes as much of the queue as the socket takes; runs the completion of
 * every payload that went out. */
static void conn_flush(tcp_conn_t *c)
{
    while (c->seg_count > 0 && c->fd >= 0) {
        struct iovec iov[TCP_IOV_MAX];
        int n = 0;
        size_t copy_off = c->tx_head;
        for (size_t i = 0; i < c->seg_count && n < TCP_IOV_MAX; i++) {
            tcp_seg_t *s = &c->segs[(c->seg_head + i) % c->seg_cap];
            size_t len = s->len > TCP_IO_CHUNK ? TCP_IO_CHUNK : (size_t)s->len;
            if (s->kind == SEG_COPY) {
                iov[n].iov_base = c->tx + copy_off;
                copy_off += s->len;
            } else {
                iov[n].iov_base = (void *)s->ptr;
            }
            iov[n++].iov_len = len;
            if (len < s->len) break;
        }
        struct msghdr msg = {.msg_iov = iov, .msg_iovlen = (size_t)n};
        ssize_t w = sendmsg(c->fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (w < 0) {
            if (errno == EINTR) continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK) break;
            char why[160];
            snprintf(why, sizeof why, "send to %s failed: %s", c->base.peer, strerror(errno));
            if (!c->closing) hs_warn("%s", why);
            conn_begin_close(c, HS_ERR_IO, why);
            conn_mark_finalize(c); /* nothing more can be sent */
            return;
        }
        uint64_t left = (uint64_t)w;
        while (left > 0 && c->seg_count > 0) {
            tcp_seg_t *s = &c->segs[c->seg_head];
            uint64_t take = left < s->len ? left : s->len;
            s->len -= take;
            left -= take;
            if (s->kind == SEG_COPY)
                c->tx_head += take;
            else
                s->ptr += take;
            if (s->len > 0) break;
            tcp_seg_t done = *s;
            c->seg_head = (c->seg_head + 1) % c->seg_cap;
            c->seg_count--;
            if (done.kind == SEG_REF && done.cb) done.cb(done.cb_arg, HS_OK);
        }
    }
    if (c->seg_count == 0) {
        c->tx_head = c->tx_tail = 0;
        if (c->closing) conn_mark_finalize(c);
    }
    conn_set_events(c);
}

static hs_status_t tcp_send(hs_tp_conn_t *conn, const void *frame, size_t frame_len)
{
    tcp_conn_t *c = conn_of(conn);
    if (c->closing) return HS_ERR_CLOSED;
    hs_status_t st = tx_append_frame(c, 0, frame, frame_len);
    if (st != HS_OK) return st;
    conn_set_events(c);
    return HS_OK;
}

static hs_status_t tcp_send_payload(hs_tp_conn_t *conn, const void *frame, size_t frame_len,
                                    const void *payload, uint64_t payload_len, hs_tp_send_cb cb,
                                    void *cb_arg)
{
    tcp_conn_t *c = conn_of(conn);
    if (c->closing) return HS_ERR_CLOSED;
    /* room for both segments first, so that the frame is never queued
     * without its payload */
    hs_status_t st = seg_reserve(c, 2);
    if (st != HS_OK) return st;
    st = tx_append_frame(c, payload_len, frame, frame_len);
    if (st != HS_OK) return st;
    tcp_seg_t s = {.kind = SEG_REF, .len = payload_len, .ptr = payload, .cb = cb, .cb_arg = cb_arg};
    st = seg_push(c, s);
    assert(st == HS_OK);
    conn_set_events(c);
    return HS_OK;
}

/* ---- receiving ------------------------------------------------------------- */

/* A bad frame from the peer: ERROR frame back (best effort), then close. */
static void conn_fail_peer(tcp_conn_t *c, hs_status_t st, const char *why)
{
    hs_warn("connection %s: %s; closing it", c->base.peer, why);
    uint8_t buf[512];
    size_t n = hs__tp_error_frame(st, why, buf, sizeof buf);
    if (n > 0) (void)tx_append_frame(c, 0, buf, n);
    conn_begin_close(c, st, why);
}

static hs_status_t tcp_recv_payload(hs_tp_conn_t *conn, void *dest, uint64_t bytes, uint64_t cookie)
{
    tcp_conn_t *c = conn_of(conn); /* transport.c checked the call and the size */
    c->pl_dest = dest;
    c->pl_len = bytes;
    c->pl_done = 0;
    c->pl_cookie = cookie;
    return HS_OK;
}

/* Header complete in rx[0, TCP_HEAD): decode, make room for the body. */
static bool rx_parse_head(tcp_conn_t *c)
{
    char why[200];
    hs_status_t st = hs_frame_header_decode(c->rx + TCP_PREFIX, c->base.max_frame_body, &c->rx_hdr,
                                            why, sizeof why);
    if (st != HS_OK) {
        conn_fail_peer(c, st, why);
        return false;
    }
    c->rx_payload_len = hs_le64_load(c->rx);
    size_t need = (size_t)TCP_HEAD * 2 + c->rx_hdr.body_len;
    if (need > c->rx_cap) {
        size_t ncap = c->rx_cap;
        while (ncap < need)
            ncap *= 2;
        size_t bound = (size_t)TCP_HEAD * 2 + c->base.max_frame_body;
        if (ncap > bound) ncap = bound;
        uint8_t *n = realloc(c->rx, ncap);
        if (!n) {
            conn_begin_close(c, HS_ERR_NOMEM, "out of memory for a frame body");
            return false;
        }
        c->rx = n;
        c->rx_cap = ncap;
    }
    c->rx_state = RX_BODY;
    return true;
}

/* Whole frame in rx: check crc, hand it over, then payload or next frame. */
static void rx_deliver(tcp_conn_t *c)
{
    char why[200];
    const uint8_t *body = c->rx + TCP_HEAD;
    hs_status_t st = hs_frame_body_check(&c->rx_hdr, body, why, sizeof why);
    if (st != HS_OK) {
        conn_fail_peer(c, st, why);
        return;
    }
    uint64_t plen = c->rx_payload_len;
    bool accepted = hs__tp_deliver_frame(&c->base, c->rx_hdr.type, body, c->rx_hdr.body_len, plen);
    size_t used = TCP_HEAD + c->rx_hdr.body_len;
    memmove(c->rx, c->rx + used, c->rx_len - used);
    c->rx_len -= used;
    c->rx_state = RX_HEAD;
    if (plen == 0) return;
    if (accepted) {
        /* even when the callee closed the connection right after accepting,
         * on_payload runs once for it (with HS_ERR_CLOSED then) */
        c->pl_active = true;
        c->rx_state = RX_PAYLOAD;
        return;
    }
    if (c->closing) return;
    snprintf(why, sizeof why, "a payload of %llu bytes after a %s frame was not accepted",
             (unsigned long long)plen, hs_msg_type_str(c->rx_hdr.type));
    conn_fail_peer(c, HS_ERR_PROTO, why);
}

static void conn_read_closed(tcp_conn_t *c, ssize_t r)
{
    char why[200];
    hs_status_t st;
    if (r == 0) {
        if (c->rx_state == RX_HEAD && c->rx_len == 0) {
            st = HS_ERR_CLOSED;
            snprintf(why, sizeof why, "peer %s closed the connection", c->base.peer);
        } else {
            st = HS_ERR_IO;
            if (c->rx_state == RX_PAYLOAD)
                snprintf(why, sizeof why,
                         "peer %s closed the connection %llu bytes into a %llu-byte payload",
                         c->base.peer, (unsigned long long)c->pl_done,
                         (unsigned long long)c->pl_len);
            else
                snprintf(
                    why, sizeof why,
                    "peer %s closed the connection in the middle of a frame (%zu bytes received)",
                    c->base.peer, c->rx_len);
        }
    } else {
        st = HS_ERR_IO;
        snprintf(why, sizeof why, "receive from %s failed: %s", c->base.peer, strerror(errno));
    }
    if (st != HS_ERR_CLOSED) hs_warn("%s", why);
    conn_begin_close(c, st, why);
    conn_mark_finalize(c); /* the stream is gone: do not linger */
}

static void conn_read(tcp_conn_t *c)
{
    size_t budget = TCP_READ_BUDGET;
    while (!c->closing) {
        if (c->rx_state == RX_PAYLOAD) {
            uint64_t left = c->pl_len - c->pl_done;
            size_t want = left > TCP_IO_CHUNK ? TCP_IO_CHUNK : (size_t)left;
            ssize_t r = recv(c->fd, c->pl_dest + c->pl_done, want, MSG_DONTWAIT);
            if (r < 0 && errno == EINTR) continue;
            if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
            if (r <= 0) {
                conn_read_closed(c, r);
                return;
            }
            c->pl_done += (uint64_t)r;
            if (c->pl_done == c->pl_len) {
                c->pl_active = false;
                c->rx_state = RX_HEAD;
                if (c->tp->base.cb.on_payload)
                    c->tp->base.cb.on_payload(c->tp->base.arg, &c->base, c->pl_cookie, HS_OK);
            }
            if ((size_t)r >= budget) return;
            budget -= (size_t)r;
            continue;
        }
        if (c->rx_state == RX_HEAD && c->rx_len >= TCP_HEAD) {
            if (!rx_parse_head(c)) return;
        }
        if (c->rx_state == RX_BODY && c->rx_len >= TCP_HEAD + (size_t)c->rx_hdr.body_len) {
            rx_deliver(c);
            continue;
        }
        /* read the rest of this frame; when no payload follows it, also up
         * to the next header (never into a payload) */
        size_t limit;
        if (c->rx_state == RX_HEAD)
            limit = TCP_HEAD;
        else
            limit = TCP_HEAD + (size_t)c->rx_hdr.body_len + (c->rx_payload_len ? 0 : TCP_HEAD);
        ssize_t r = recv(c->fd, c->rx + c->rx_len, limit - c->rx_len, MSG_DONTWAIT);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
        if (r <= 0) {
            conn_read_closed(c, r);
            return;
        }
        c->rx_len += (size_t)r;
        if ((size_t)r >= budget) return;
        budget -= (size_t)r;
    }
}

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
    for (;;) {
        struct sockaddr_storage ss;
        socklen_t len;
        int fd = hs__sock_accept(l->fd, &ss, &len);
        if (fd < 0) {
            if (errno != EAGAIN && errno != EWOULDBLOCK) listener_pause(tp, l, errno);
            return;
        }
        socket_tune(tp, fd, true);
        tcp_conn_t *c = conn_new(tp, fd, (struct sockaddr *)&ss, len);
        if (!c) {
            close(fd);
            continue;
        }
        hs_debug("accepted %s", c->base.describe);
        hs_status_t st = tp->base.cb.on_accept(tp->base.arg, &c->base);
        if (st != HS_OK) conn_begin_close(c, st, "connection refused by this side");
    }
}

static hs_status_t tcp_listen(hs_tp_t *t, const char *host, uint16_t port, uint16_t *bound_port)
{
    tcp_tp_t *tp = tp_of(t);
    int fd;
    hs_status_t st =
        hs__sock_listen("tcp transport", host, port, tune_listener, tp, &fd, bound_port);
    if (st != HS_OK) return st;
    tcp_listener_t *l = calloc(1, sizeof *l);
    if (!l) {
        close(fd);
        return HS_ERR_NOMEM;
    }
    l->obj.kind = OBJ_LISTENER;
    l->fd = fd;
    struct epoll_event e = {.events = EPOLLIN, .data.ptr = &l->obj};
    if (epoll_ctl(tp->epfd, EPOLL_CTL_ADD, fd, &e) != 0) {
        hs_error("epoll_ctl(ADD) for a listener: %m");
        close(fd);
        free(l);
        return HS_ERR_IO;
    }
    l->next = tp->listeners;
    tp->listeners = l;
    return HS_OK;
}

static hs_status_t tcp_connect(hs_tp_t *t, const char *host, uint16_t port, int timeout_ms,
                               hs_tp_conn_t **out)
{
    tcp_tp_t *tp = tp_of(t);
    struct addrinfo *ai = NULL;
    hs_status_t st = hs__sock_resolve(host, port, false, &ai);
    if (st != HS_OK) return st;
    uint64_t deadline = timeout_ms < 0 ? UINT64_MAX : hs_now_ns() + (uint64_t)timeout_ms * 1000000u;
    int fd = -1;
    const struct addrinfo *used = NULL;
    char why[160];
    st = hs__sock_connect(ai, deadline, tune_stream, tp, &fd, &used, why, sizeof why);
    if (st != HS_OK) {
        freeaddrinfo(ai);
        if (st == HS_ERR_TIMEOUT)
            hs_error("cannot connect to %s port %u before the timeout: %s; is the consumer running "
                     "and reachable?",
                     host, port, why);
        else
            hs_error("cannot connect to %s port %u: %s; check the address and the route to it",
                     host, port, why);
        return st;
    }
    tcp_conn_t *c = conn_new(tp, fd, used->ai_addr, used->ai_addrlen);
    freeaddrinfo(ai);
    if (!c) {
        close(fd);
        return HS_ERR_NOMEM;
    }
    hs_debug("connected %s", c->base.describe);
    *out = &c->base;
    return HS_OK;
}

/* ---- loop ----------------------------------------------------------------- */

static void tcp_close(hs_tp_conn_t *conn, hs_status_t reason)
{
    tcp_conn_t *c = conn_of(conn);
    char why[96];
    snprintf(why, sizeof why, "closed by this side (%s)", hs_status_str(reason));
    conn_begin_close(c, reason, why);
}

static void check_lingers(tcp_tp_t *tp)
{
    uint64_t now = hs_now_ns();
    for (tcp_conn_t *c = tp->conns; c; c = c->next) {
        if (c->closing && !c->finalize && now >= c->linger_deadline_ns) {
            hs_warn("connection %s: peer did not take the last queued bytes within %d ms; "
                    "dropping them",
                    c->base.peer, TCP_LINGER_MS);
            conn_mark_finalize(c);
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
        run_finalizers(tp);
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
        } else if (o->kind == OBJ_LISTENER) {
            tcp_accept(tp, (tcp_listener_t *)o);
        } else {
            tcp_conn_t *c = (tcp_conn_t *)((char *)o - offsetof(tcp_conn_t, obj));
            if (c->finalize) continue;
            uint32_t e = ev[i].events;
            if (!c->closing && (e & (EPOLLIN | EPOLLHUP | EPOLLERR))) conn_read(c);
            if (!c->finalize && c->seg_count > 0 && (e & (EPOLLOUT | EPOLLHUP | EPOLLERR)))
                conn_flush(c);
            if (!c->finalize && c->closing && (e & (EPOLLHUP | EPOLLERR))) conn_mark_finalize(c);
        }
    }
    check_lingers(tp);
    run_finalizers(tp);
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

static hs_status_t tcp_mem_register(hs_tp_t *t, void *addr, size_t len)
{
    return HS_OK;
}

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
    tp->sockbuf = choose_sockbuf();
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
        if (!c->closing) conn_begin_close(c, HS_ERR_CLOSED, "transport destroyed");
        if (!c->finalize && c->seg_count > 0) conn_flush(c);
        conn_mark_finalize(c);
    }
    run_finalizers(tp);
    while (tp->listeners) {
        tcp_listener_t *l = tp->listeners;
        tp->listeners = l->next;
        close(l->fd);
        free(l);
    }
    close(tp->wake_fd);
    close(tp->epfd);
    free(tp);
}

const hs_tp_ops_t hs__tp_tcp_ops = {
    .name = "tcp",
    .create = tcp_create,
    .destroy = tcp_destroy,
    .listen = tcp_listen,
    .connect = tcp_connect,
    .send = tcp_send,
    .send_payload = tcp_send_payload,
    .recv_payload = tcp_recv_payload,
    .close = tcp_close,
    .progress = tcp_progress,
    .wakeup = tcp_wakeup,
    .mem_register = tcp_mem_register,
};
