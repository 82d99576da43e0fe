/* SPDX-License-Identifier: Apache-2.0 */
/* tcp_conn.c - one TCP transport connection (tcp_int.h): its send queue
 * (copied frames and payloads by reference, written with sendmsg), its
 * receive state machine (prefix, frame, payload straight into dest), and
 * its close. */

#include "tcp_int.h"
#include "hs_status.h"
#include "hs_log.h"
#include "hs_time.h"
#include "hs_checksum.h"
#include "hs_bytes.h"

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

/* ---- connection objects ---------------------------------------------------- */

static void conn_set_events(tcp_conn_t *c)
{
    if (c->fd < 0) return;
    uint32_t ev = 0;
    if (!c->closing && c->rx_state != RX_COPY) ev |= EPOLLIN;
    if (c->seg_count > 0) ev |= EPOLLOUT;
    if (ev == c->events) return;
    struct epoll_event e = {.events = ev, .data.ptr = &c->obj};
    if (epoll_ctl(c->tp->epfd, EPOLL_CTL_MOD, c->fd, &e) == 0) c->events = ev;
}

void hs__tcp_conn_mark_finalize(tcp_conn_t *c)
{
    if (c->finalize) return;
    c->finalize = true;
    c->tp->n_finalize++;
}

/* Starts closing: no more reads or new sends; what is queued is flushed for
 * up to TCP_LINGER_MS, then on_close(reason, why) runs from progress. */
void hs__tcp_conn_begin_close(tcp_conn_t *c, hs_status_t reason, const char *why)
{
    if (c->closing) return;
    c->closing = true;
    c->close_reason = reason;
    snprintf(c->close_why, sizeof c->close_why, "%s", why);
    c->linger_deadline_ns = hs_now_ns() + (uint64_t)TCP_LINGER_MS * 1000000u;
    if (c->seg_count == 0)
        hs__tcp_conn_mark_finalize(c);
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

/* Copies prefix + a + b into the send buffer as one SEG_COPY (merged with a
 * preceding copy segment), or as a SEG_FD carrying fd when fd >= 0. Undone
 * on failure. */
static hs_status_t tx_append(tcp_conn_t *c, uint64_t prefix, const void *a, size_t alen,
                             const void *b, size_t blen, int fd)
{
    size_t need = TCP_PREFIX + alen + blen;
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
    hs_le64_store(p, prefix);
    memcpy(p + TCP_PREFIX, a, alen);
    if (blen) memcpy(p + TCP_PREFIX + alen, b, blen);
    tcp_seg_t s = {.kind = fd >= 0 ? SEG_FD : SEG_COPY, .len = need, .fd = fd};
    hs_status_t st = seg_push(c, s);
    if (st != HS_OK) return st;
    c->tx_tail += need;
    return HS_OK;
}

static hs_status_t tx_append_frame(tcp_conn_t *c, uint64_t payload_len, const void *frame,
                                   size_t frame_len)
{
    return tx_append(c, payload_len, frame, frame_len, NULL, 0, -1);
}

hs_status_t hs__tcp_send_ctl(tcp_conn_t *c, unsigned tag, uint64_t a, uint64_t b, int fd)
{
    uint8_t body[16];
    hs_le64_store(body, a);
    hs_le64_store(body + 8, b);
    hs_status_t st = tx_append(c, (uint64_t)tag << SHM_TAG_SHIFT, body, sizeof body, NULL, 0, fd);
    if (st == HS_OK) conn_set_events(c);
    return st;
}

tcp_conn_t *hs__tcp_conn_new(tcp_tp_t *tp, int fd, const struct sockaddr *sa, socklen_t salen)
{
    tcp_conn_t *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    c->base.tp = &tp->base;
    c->obj.kind = OBJ_CONN;
    c->tp = tp;
    c->fd = fd;
    c->base.max_frame_body = tp->base.cfg.max_frame_body;
    c->base.payload_bytes_counted = true; /* counted in hs__tcp_conn_read */
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
    if (c->rx_state == RX_COPY) {
        /* the copier may still write into dest and read the segment: both
         * stay until it is done; on_payload(HS_ERR_CLOSED) follows */
        hs__shm_copier_wait(tp->copier, &c->copy);
        c->rx_state = RX_HEAD;
    }
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
    /* payloads read from a segment that the peer never released: the
     * memory is the sender's again (the peer's mapping may still read it,
     * which changes nothing the sender relies on) */
    while (c->shm && c->shm->n_pending > 0) {
        shm_pending_t pd = c->shm->pending[0];
        (void)hs__shm_pending_take(c->shm, pd.token, &pd);
        if (pd.cb) pd.cb(pd.cb_arg, HS_ERR_CLOSED);
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
    hs__shm_conn_free(c->shm);
    free(c);
}

void hs__tcp_run_finalizers(tcp_tp_t *tp)
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
void hs__tcp_conn_flush(tcp_conn_t *c)
{
    while (c->seg_count > 0 && c->fd >= 0) {
        struct iovec iov[TCP_IOV_MAX];
        int n = 0;
        size_t copy_off = c->tx_head;
        tcp_seg_t *first = &c->segs[c->seg_head];
        bool with_fd = first->kind == SEG_FD && !first->fd_sent;
        for (size_t i = 0; i < c->seg_count && n < TCP_IOV_MAX; i++) {
            tcp_seg_t *s = &c->segs[(c->seg_head + i) % c->seg_cap];
            if (i > 0 && (s->kind == SEG_FD || with_fd)) break; /* a descriptor goes alone */
            size_t len = s->len > TCP_IO_CHUNK ? TCP_IO_CHUNK : (size_t)s->len;
            if (s->kind == SEG_COPY || s->kind == SEG_FD) {
                iov[n].iov_base = c->tx + copy_off;
                copy_off += s->len;
            } else {
                iov[n].iov_base = (void *)s->ptr;
            }
            iov[n++].iov_len = len;
            if (len < s->len) break;
        }
        struct msghdr msg = {.msg_iov = iov, .msg_iovlen = (size_t)n};
        union {
            struct cmsghdr h;
            char buf[CMSG_SPACE(sizeof(int))];
        } ctl;
        if (with_fd) {
            memset(&ctl, 0, sizeof ctl);
            msg.msg_control = ctl.buf;
            msg.msg_controllen = sizeof ctl.buf;
            struct cmsghdr *cm = CMSG_FIRSTHDR(&msg);
            cm->cmsg_level = SOL_SOCKET;
            cm->cmsg_type = SCM_RIGHTS;
            cm->cmsg_len = CMSG_LEN(sizeof(int));
            memcpy(CMSG_DATA(cm), &first->fd, sizeof(int));
        }
        ssize_t w = sendmsg(c->fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (w > 0 && with_fd) first->fd_sent = true;
        if (w < 0) {
            if (errno == EINTR) continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK) break;
            char why[160];
            snprintf(why, sizeof why, "send to %s failed: %s", c->base.peer, strerror(errno));
            if (!c->closing) hs_warn("%s", why);
            hs__tcp_conn_begin_close(c, HS_ERR_IO, why);
            hs__tcp_conn_mark_finalize(c); /* nothing more can be sent */
            return;
        }
        uint64_t left = (uint64_t)w;
        while (left > 0 && c->seg_count > 0) {
            tcp_seg_t *s = &c->segs[c->seg_head];
            uint64_t take = left < s->len ? left : s->len;
            s->len -= take;
            left -= take;
            if (s->kind == SEG_COPY || s->kind == SEG_FD)
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
        if (c->closing) hs__tcp_conn_mark_finalize(c);
    }
    conn_set_events(c);
}

hs_status_t hs__tcp_send(hs_tp_conn_t *conn, const void *frame, size_t frame_len)
{
    tcp_conn_t *c = conn_of(conn);
    if (c->closing) return HS_ERR_CLOSED;
    hs_status_t st = tx_append_frame(c, 0, frame, frame_len);
    if (st != HS_OK) return st;
    conn_set_events(c);
    return HS_OK;
}

hs_status_t hs__tcp_send_payload(hs_tp_conn_t *conn, const void *frame, size_t frame_len,
                                 const void *payload, uint64_t payload_len, hs_tp_send_cb cb,
                                 void *cb_arg)
{
    tcp_conn_t *c = conn_of(conn);
    if (c->closing) return HS_ERR_CLOSED;
    uint64_t off;
    int seg = c->shm ? hs__shm_ring_find(&c->tp->ring, payload, payload_len, &off) : -1;
    if (seg >= 0) {
        /* the payload stays where it is: its segment (sent once per
         * connection) and a descriptor go instead; cb runs on RELEASE */
        shm_conn_t *sh = c->shm;
        hs_status_t st = seg_reserve(c, 2);
        if (st != HS_OK) return st;
        if (!sh->attached[seg]) {
            st = hs__tcp_send_ctl(c, SHM_TAG_ATTACH, (uint64_t)seg, c->tp->ring.segs[seg].len,
                                  c->tp->ring.segs[seg].fd);
            if (st != HS_OK) return st;
            sh->attached[seg] = true;
        }
        uint64_t token;
        st = hs__shm_pending_add(sh, cb, cb_arg, &token);
        if (st != HS_OK) return st;
        uint8_t desc[SHM_DESC_BYTES];
        hs_le32_store(desc, (uint32_t)seg);
        hs_le32_store(desc + 4, 0);
        hs_le64_store(desc + 8, off);
        hs_le64_store(desc + 16, token);
        st = tx_append(c, (uint64_t)SHM_TAG_RING << SHM_TAG_SHIFT | payload_len, frame, frame_len,
                       desc, sizeof desc, -1);
        if (st != HS_OK) {
            shm_pending_t pd;
            (void)hs__shm_pending_take(sh, token, &pd); /* failed: cb is not called */
            return st;
        }
        sh->ring_payloads++;
        conn_set_events(c);
        return HS_OK;
    }
    if (c->shm) c->shm->plain_payloads++;
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
    hs__tcp_conn_begin_close(c, st, why);
}

hs_status_t hs__tcp_recv_payload(hs_tp_conn_t *conn, void *dest, uint64_t bytes, uint64_t cookie)
{
    tcp_conn_t *c = conn_of(conn); /* transport.c checked the call and the size */
    c->pl_dest = dest;
    c->pl_len = bytes;
    c->pl_done = 0;
    c->pl_cookie = cookie;
    return HS_OK;
}

/* recv() for TCP; recvmsg() taking passed descriptors on shared-memory
 * connections (too many pending ones fail the connection: errno EPROTO). */
static ssize_t conn_recv(tcp_conn_t *c, void *buf, size_t len)
{
    if (!c->shm) return recv(c->fd, buf, len, MSG_DONTWAIT);
    struct iovec iov = {.iov_base = buf, .iov_len = len};
    union {
        struct cmsghdr h;
        char buf[CMSG_SPACE(SHM_FDS_MAX * sizeof(int))];
    } ctl;
    struct msghdr msg = {
        .msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl.buf, .msg_controllen = sizeof ctl.buf};
    ssize_t r = recvmsg(c->fd, &msg, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
    if (r >= 0 && msg.msg_controllen > 0 && !hs__shm_take_fds(c->shm, &msg)) {
        errno = EPROTO;
        return -1;
    }
    return r;
}

/* A shared-memory control message (ATTACH, RELEASE) in rx[0, TCP_HEAD). */
static bool rx_shm_ctl(tcp_conn_t *c, unsigned tag)
{
    char why[256];
    uint64_t a = hs_le64_load(c->rx + TCP_PREFIX), b = hs_le64_load(c->rx + TCP_PREFIX + 8);
    if (tag == SHM_TAG_ATTACH) {
        hs_status_t st =
            hs__shm_attach(c->shm, c->base.trusted, (uint32_t)(a > UINT32_MAX ? UINT32_MAX : a), b,
                           why, sizeof why);
        if (st != HS_OK) {
            c->tp->base.shm_refused++;
            conn_fail_peer(c, st == HS_ERR_IO ? HS_ERR_IO : HS_ERR_PROTO, why);
            return false;
        }
        c->tp->base.shm_mapped++;
        hs_debug("connection %s: shared-memory segment %llu of %.1f MiB mapped", c->base.peer,
                 (unsigned long long)a, (double)b / (1 << 20));
    } else if (tag == SHM_TAG_RELEASE) {
        shm_pending_t pd;
        if (!hs__shm_pending_take(c->shm, a, &pd)) {
            snprintf(why, sizeof why, "a release for payload %llu, which was not sent",
                     (unsigned long long)a);
            conn_fail_peer(c, HS_ERR_PROTO, why);
            return false;
        }
        if (pd.cb) pd.cb(pd.cb_arg, b == 0 ? HS_OK : HS_ERR_IO);
    } else {
        snprintf(why, sizeof why, "unknown shared-memory message %u", tag);
        c->tp->base.shm_refused++;
        conn_fail_peer(c, HS_ERR_FORMAT, why);
        return false;
    }
    memmove(c->rx, c->rx + TCP_HEAD, c->rx_len - TCP_HEAD);
    c->rx_len -= TCP_HEAD;
    return true;
}

/* Hands an accepted shared-memory payload to a copier: it goes from the
 * peer's segment into dest in one pass that also computes the checksum the
 * receiver asked for (hs_tp_recv_payload_sum); hs__tcp_copies_finish takes
 * it from there. */
static void shm_copy_submit(tcp_conn_t *c, const uint8_t *src, uint64_t len)
{
    tcp_tp_t *tp = c->tp;
    if (!tp->copier) {
        tp->copier = hs__shm_copier_create(tp->copiers, tp->wake_fd);
        if (!tp->copier) {
            hs__tcp_conn_begin_close(c, HS_ERR_NOMEM, "cannot start a shared-memory copier");
            c->pl_active = true; /* on_payload(HS_ERR_CLOSED) at finalize */
            return;
        }
    }
    c->copy = (shm_copy_job_t){.dest = c->pl_dest,
                               .src = src,
                               .len = len,
                               .sum_wanted = c->base.sum_wanted,
                               .sum_from = c->base.sum_from,
                               .owner = c};
    c->pl_active = true;
    c->pl_len = len;
    c->rx_state = RX_COPY;
    conn_set_events(c);
    hs__shm_copier_submit(tp->copier, &c->copy);
}

/* A copy is back: RELEASE to the peer, then on_payload with its checksum. */
static void shm_copy_finish(tcp_conn_t *c)
{
    shm_conn_t *sh = c->shm;
    c->rx_state = RX_HEAD;
    c->pl_active = false;
    c->base.payload_bytes_in += c->copy.len;
    c->tp->base.shm_ring_payloads++;
    sh->ring_payloads++;
    if (hs__tcp_send_ctl(c, SHM_TAG_RELEASE, sh->rx_token, 0, -1) != HS_OK)
        hs__tcp_conn_begin_close(c, HS_ERR_NOMEM, "cannot queue a release");
    c->base.sum_valid = c->copy.sum_valid;
    c->base.sum = c->copy.sum;
    if (c->tp->base.cb.on_payload)
        c->tp->base.cb.on_payload(c->tp->base.arg, &c->base, c->pl_cookie, HS_OK);
    c->base.sum_valid = false;
    c->base.sum_wanted = false;
    conn_set_events(c);
}

void hs__tcp_copies_finish(tcp_tp_t *tp)
{
    if (!tp->copier) return;
    shm_copy_job_t *j = hs__shm_copier_take_done(tp->copier);
    while (j) {
        shm_copy_job_t *next = j->next;
        tcp_conn_t *c = j->owner;
        if (c->closing) {
            /* closed while copying: the payload is not delivered, and
             * finalize runs on_payload(HS_ERR_CLOSED) (pl_active) */
            c->rx_state = RX_HEAD;
            j = next;
            continue;
        }
        shm_copy_finish(c);
        /* what arrived meanwhile: EPOLLIN was off, the socket may hold it */
        if (!c->closing && !c->finalize) hs__tcp_conn_read(c);
        j = next;
    }
}

/* Header complete in rx[0, TCP_HEAD): decode, make room for the body. */
static bool rx_parse_head(tcp_conn_t *c)
{
    char why[200];
    if (c->shm) {
        uint64_t prefix = hs_le64_load(c->rx);
        unsigned tag = (unsigned)(prefix >> SHM_TAG_SHIFT);
        c->shm->rx_ring = tag == SHM_TAG_RING;
        if (tag != SHM_TAG_PLAIN && tag != SHM_TAG_RING) return rx_shm_ctl(c, tag);
    }
    hs_status_t st = hs_frame_header_decode(c->rx + TCP_PREFIX, c->base.max_frame_body, &c->rx_hdr,
                                            why, sizeof why);
    if (st != HS_OK) {
        conn_fail_peer(c, st, why);
        return false;
    }
    c->rx_payload_len = hs_le64_load(c->rx);
    if (c->shm) c->rx_payload_len &= SHM_LEN_MASK;
    if (c->shm && c->shm->rx_ring && c->rx_payload_len == 0) {
        c->tp->base.shm_refused++;
        conn_fail_peer(c, HS_ERR_PROTO, "a shared-memory payload descriptor without a payload");
        return false;
    }
    size_t need = (size_t)TCP_HEAD * 2 + c->rx_hdr.body_len;
    if (need > c->rx_cap) {
        size_t ncap = c->rx_cap;
        while (ncap < need)
            ncap *= 2;
        size_t bound = (size_t)TCP_HEAD * 2 + c->base.max_frame_body;
        if (ncap > bound) ncap = bound;
        uint8_t *n = realloc(c->rx, ncap);
        if (!n) {
            hs__tcp_conn_begin_close(c, HS_ERR_NOMEM, "out of memory for a frame body");
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
    bool ring = c->shm && c->shm->rx_ring;
    shm_conn_t *sh = c->shm;
    if (ring) {
        /* the descriptor is checked before its frame reaches anyone */
        const uint8_t *d = body + c->rx_hdr.body_len;
        sh->rx_seg = hs_le32_load(d);
        sh->rx_off = hs_le64_load(d + 8);
        sh->rx_token = hs_le64_load(d + 16);
        st = hs__shm_desc_check(sh, sh->rx_seg, sh->rx_off, plen, why, sizeof why);
        if (st != HS_OK) {
            c->tp->base.shm_refused++;
            conn_fail_peer(c, st, why);
            return;
        }
    }
    bool accepted = hs__tp_deliver_frame(&c->base, c->rx_hdr.type, body, c->rx_hdr.body_len, plen);
    size_t used = TCP_HEAD + c->rx_hdr.body_len + (ring ? SHM_DESC_BYTES : 0);
    memmove(c->rx, c->rx + used, c->rx_len - used);
    c->rx_len -= used;
    c->rx_state = RX_HEAD;
    if (plen == 0) return;
    if (ring && accepted) {
        if (c->closing) { /* on_payload(HS_ERR_CLOSED) from finalize */
            c->pl_active = true;
            return;
        }
        /* one pass out of the peer's segment into dest; the receiver
         * verifies dest, so the peer's later writes change nothing */
        shm_copy_submit(c, sh->map[sh->rx_seg] + sh->rx_off, plen);
        return;
    }
    c->base.sum_wanted = false; /* a payload over the socket: the receiver checks it */
    if (c->shm && !ring) {
        c->tp->base.shm_plain_payloads++;
        sh->plain_payloads++;
    }
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
    hs__tcp_conn_begin_close(c, st, why);
    hs__tcp_conn_mark_finalize(c); /* the stream is gone: do not linger */
}

void hs__tcp_conn_read(tcp_conn_t *c)
{
    size_t budget = TCP_READ_BUDGET;
    while (!c->closing && c->rx_state != RX_COPY) {
        if (c->rx_state == RX_PAYLOAD) {
            uint64_t left = c->pl_len - c->pl_done;
            size_t want = left > TCP_IO_CHUNK ? TCP_IO_CHUNK : (size_t)left;
            ssize_t r = conn_recv(c, c->pl_dest + c->pl_done, want);
            if (r < 0 && errno == EINTR) continue;
            if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
            if (r <= 0) {
                conn_read_closed(c, r);
                return;
            }
            c->pl_done += (uint64_t)r;
            c->base.payload_bytes_in += (uint64_t)r;
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
        if (c->shm && !c->shm->pre_done) {
            shm_conn_t *sh = c->shm;
            ssize_t r = conn_recv(c, sh->pre + sh->pre_len, SHM_PREAMBLE_BYTES - sh->pre_len);
            if (r < 0 && errno == EINTR) continue;
            if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
            if (r <= 0) {
                conn_read_closed(c, r);
                return;
            }
            sh->pre_len += (uint32_t)r;
            if (sh->pre_len < SHM_PREAMBLE_BYTES) continue;
            char why[200];
            pid_t pid;
            hs_status_t st = hs__shm_preamble_check(sh->pre, &pid, why, sizeof why);
            if (st != HS_OK) {
                c->tp->base.shm_refused++;
                conn_fail_peer(c, st, why);
                return;
            }
            sh->pre_done = true;
            continue;
        }
        if (c->rx_state == RX_HEAD && c->rx_len >= TCP_HEAD) {
            if (!rx_parse_head(c)) return;
            if (c->rx_state == RX_HEAD) continue; /* a shared-memory control message */
        }
        if (c->rx_state == RX_BODY &&
            c->rx_len >= TCP_HEAD + (size_t)c->rx_hdr.body_len +
                             (c->shm && c->shm->rx_ring ? SHM_DESC_BYTES : 0)) {
            rx_deliver(c);
            continue;
        }
        /* read the rest of this frame; when no payload follows it, also up
         * to the next header (never into a payload) */
        size_t limit;
        if (c->rx_state == RX_HEAD)
            limit = TCP_HEAD;
        else if (c->shm && c->shm->rx_ring)
            limit = TCP_HEAD + (size_t)c->rx_hdr.body_len + SHM_DESC_BYTES;
        else
            limit = TCP_HEAD + (size_t)c->rx_hdr.body_len + (c->rx_payload_len ? 0 : TCP_HEAD);
        ssize_t r = conn_recv(c, c->rx + c->rx_len, limit - c->rx_len);
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

/* ---- loop ----------------------------------------------------------------- */

void hs__tcp_close(hs_tp_conn_t *conn, hs_status_t reason)
{
    tcp_conn_t *c = conn_of(conn);
    char why[96];
    snprintf(why, sizeof why, "closed by this side (%s)", hs_status_str(reason));
    hs__tcp_conn_begin_close(c, reason, why);
}

hs_status_t hs__tcp_listener_add(tcp_tp_t *tp, int fd, bool unix_sock)
{
    tcp_listener_t *l = calloc(1, sizeof *l);
    if (!l) {
        close(fd);
        return HS_ERR_NOMEM;
    }
    l->obj.kind = OBJ_LISTENER;
    l->fd = fd;
    l->unix_sock = unix_sock;
    struct epoll_event e = {.events = EPOLLIN, .data.ptr = &l->obj};
    if (epoll_ctl(tp->epfd, EPOLL_CTL_ADD, fd, &e) != 0) {
        hs_error("epoll_ctl(ADD) for a %slistener: %m", unix_sock ? "shared-memory " : "");
        close(fd);
        free(l);
        return HS_ERR_IO;
    }
    l->next = tp->listeners;
    tp->listeners = l;
    return HS_OK;
}
