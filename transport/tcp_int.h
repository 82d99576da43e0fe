/* SPDX-License-Identifier: Apache-2.0 */
/* tcp_int.h - what the parts of the TCP transport share (tcp.c,
 * tcp_conn.c).
 *
 * The TCP transport: non-blocking sockets, one level-triggered epoll
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
#ifndef HS_TCP_INT_H
#define HS_TCP_INT_H

#include <stdbool.h>
#include <stdint.h>

#include "hs_transport_int.h"
#include "shm_int.h"
#include "shm_copy_int.h"
#include "sock_int.h"
#include "hs_checksum.h"

#ifdef __cplusplus
extern "C" {
#endif

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
    bool unix_sock;     /* the shared-memory listener (shm_int.h) */
    uint64_t resume_ns; /* not polled until then after a failed accept (0 = polled) */
    struct tcp_listener *next;
} tcp_listener_t;

/* SEG_FD: bytes of the send buffer, like SEG_COPY, sent with their own
 * sendmsg() whose first byte carries `fd` (SCM_RIGHTS; shared memory). */
typedef enum { SEG_COPY, SEG_REF, SEG_FD } seg_kind_t;

typedef struct {
    seg_kind_t kind;
    uint64_t len;       /* bytes still to send */
    const uint8_t *ptr; /* SEG_REF: next byte to send */
    int fd;             /* SEG_FD: the descriptor (the ring's; not closed here) */
    bool fd_sent;
    hs_tp_send_cb cb;
    void *cb_arg;
} tcp_seg_t;

/* RX_COPY: a shared-memory payload is with a copier (shm_copy_int.h); the
 * connection reads nothing more until it is back. */
typedef enum { RX_HEAD, RX_BODY, RX_PAYLOAD, RX_COPY } rx_state_t;

typedef struct tcp_tp tcp_tp_t;

typedef struct tcp_conn {
    hs_tp_conn_t base; /* first: hs_tp_conn_t * <-> tcp_conn_t * */
    tcp_obj_t obj;
    tcp_tp_t *tp;
    int fd;
    shm_conn_t *shm; /* a shared-memory connection (Unix socket), else NULL */
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
    shm_copy_job_t copy; /* RX_COPY: the payload's copy */

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
    int sockbuf;          /* SO_SNDBUF/SO_RCVBUF to ask for, 0 = leave autotuning */
    shm_mode_t shm_mode;  /* shared memory with peers on this host (shm_int.h) */
    shm_ring_t ring;      /* producer side: the segments hs_tp_mem_alloc() made */
    shm_copier_t *copier; /* receiving side: made with the first shared-memory payload */
    unsigned copiers;     /* its threads */
};

static inline tcp_conn_t *conn_of(hs_tp_conn_t *c) { return (tcp_conn_t *)c; }

static inline tcp_tp_t *tp_of(hs_tp_t *t) { return (tcp_tp_t *)t; }

/* tcp_conn.c */
void hs__tcp_conn_mark_finalize(tcp_conn_t *c);
void hs__tcp_conn_begin_close(tcp_conn_t *c, hs_status_t reason, const char *why);
tcp_conn_t *hs__tcp_conn_new(tcp_tp_t *tp, int fd, const struct sockaddr *sa, socklen_t salen);
void hs__tcp_run_finalizers(tcp_tp_t *tp);
void hs__tcp_conn_flush(tcp_conn_t *c);
HS_MUST_CHECK hs_status_t hs__tcp_send(hs_tp_conn_t *conn, const void *frame, size_t frame_len);
HS_MUST_CHECK hs_status_t hs__tcp_send_payload(hs_tp_conn_t *conn, const void *frame,
                                               size_t frame_len, const void *payload,
                                               uint64_t payload_len, hs_tp_send_cb cb,
                                               void *cb_arg);
HS_MUST_CHECK hs_status_t hs__tcp_recv_payload(hs_tp_conn_t *conn, void *dest, uint64_t bytes,
                                               uint64_t cookie);
void hs__tcp_conn_read(tcp_conn_t *c);
/* Finishes the shared-memory payloads whose copies are done (from the loop,
 * after the wake-up eventfd fired). */
void hs__tcp_copies_finish(tcp_tp_t *tp);
void hs__tcp_close(hs_tp_conn_t *conn, hs_status_t reason);
/* Puts the listening socket fd (ours from now on, closed on failure) on the
 * transport's epoll set and its list of listeners; unix_sock marks the
 * shared-memory listener. */
HS_MUST_CHECK hs_status_t hs__tcp_listener_add(tcp_tp_t *tp, int fd, bool unix_sock);
/* tcp_shm.c: shared-memory connections (shm_int.h). */
HS_MUST_CHECK hs_status_t hs__tcp_shm_listen(tcp_tp_t *tp, uint16_t port);
void hs__tcp_shm_accept(tcp_tp_t *tp, tcp_listener_t *l);
/* Connects to the shared-memory listener of the consumer on `port` of this
 * host, retrying while nobody listens until deadline (once: one attempt).
 * HS_ERR_CLOSED: nobody listens (once); why[cap] says what failed. */
HS_MUST_CHECK hs_status_t hs__tcp_shm_connect(tcp_tp_t *tp, const char *host, uint16_t port,
                                              uint64_t deadline, bool once, tcp_conn_t **out,
                                              char *why, size_t cap);
HS_MUST_CHECK hs_status_t hs__tcp_mem_alloc(hs_tp_t *t, size_t len, void **out);
bool hs__tcp_mem_free(hs_tp_t *t, void *p);
const char *hs__tcp_conn_kind(const hs_tp_conn_t *conn);
/* Queues 16 bytes of a shared-memory control message (ATTACH, RELEASE),
 * with `fd` passed along when >= 0. */
HS_MUST_CHECK hs_status_t hs__tcp_send_ctl(tcp_conn_t *c, unsigned tag, uint64_t a, uint64_t b,
                                           int fd);

#ifdef __cplusplus
}
#endif
#endif /* HS_TCP_INT_H */
