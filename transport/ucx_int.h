/* SPDX-License-Identifier: Apache-2.0 */
/* ucx_int.h - what the parts of the UCX transport share (ucx.c lists them):
 * its transport and connection objects, operations, and the functions one
 * part calls in another. */
#ifndef HS_UCX_INT_H
#define HS_UCX_INT_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/uio.h>
#include <ucp/api/ucp.h>

#include "hs_transport_int.h"
#include "sock_int.h"
#include "ucx_addr_int.h"
#include "ucx_hello_int.h"

#ifdef __cplusplus
extern "C" {
#endif

#define AM_FRAME 1
#define AM_PAYLOAD 2
#define AM_CLOSE 3
#define UCX_LINGER_MS 2000 /* flush bound at close */
#define UCX_DRAIN_MS 5000  /* after a forced close, wait this long for UCX to fail requests */
#define UCX_CLOSING_POLL_MS 10
#define OP_INLINE 256

typedef enum { OP_SEND, OP_SEND_PAYLOAD, OP_RECV, OP_FLUSH, OP_CLOSE } op_kind_t;

typedef struct ucx_conn ucx_conn_t;

typedef struct ucx_tp ucx_tp_t;

typedef struct ucx_pending ucx_pending_t;

/* One outstanding UCX operation. Reused through a free list. */
typedef struct ucx_op {
    op_kind_t kind;
    ucx_conn_t *conn;             /* NULL once orphaned (connection gone first) */
    struct ucx_op *cprev, *cnext; /* the connection's outstanding ops */
    struct ucx_op *dnext;         /* done queue / free list */
    hs_tp_send_cb cb;
    void *cb_arg;
    uint64_t cookie;
    ucs_status_t status;
    uint8_t *frame; /* inline_frame or heap_frame */
    uint8_t *heap_frame;
    size_t heap_cap;
    uint8_t inline_frame[OP_INLINE];
} ucx_op_t;

typedef struct {
    void *addr;
    size_t len;
    ucp_mem_h memh;
} ucx_region_t;

struct ucx_conn {
    hs_tp_conn_t base; /* first */
    ucx_tp_t *tp;
    ucp_ep_h ep;
    ucx_conn_t *prev, *next;
    ucx_op_t *ops; /* outstanding */
    int n_ops;
    /* payload offered to the callee in on_frame */
    void *pl_dest;
    uint64_t pl_cookie;
    /* state */
    bool connected; /* client: wireup flush done; server: always */
    bool failed;    /* UCX reported an error on the endpoint */
    bool closing, flush_started, flushed, ep_closed, close_done;
    bool lanes_checked;
    /* lanes_known: the endpoint's lanes were read (describe); memh_lanes:
     * one of them is an RDMA transport, or they could not be told apart, so
     * payloads go with their memory handle. Over TCP alone a handle buys no
     * zero copy and costs UCX work on every message. */
    bool lanes_known, memh_lanes;
    bool announced; /* the user knows it: on_close is owed */
    hs_status_t close_reason;
    char close_why[256];
    uint64_t linger_deadline_ns, drain_deadline_ns;
};

struct ucx_tp {
    hs_tp_t base; /* first */
    ucp_context_h ctx;
    ucp_worker_h worker;
    int efd;
    size_t max_am_header;
    int *lfds;               /* bootstrap listening sockets */
    uint64_t *lfd_resume_ns; /* per listener: paused until then after a failed accept */
    size_t n_lfds;
    ucx_pending_t *pending; /* accepted sockets in their bootstrap, newest first */
    size_t n_pending;
    ucp_address_t *my_addr;
    size_t my_addr_len;
    hs__ucx_addr_t *my_parsed; /* my_addr walked: what a peer's address may hold */
    ucx_conn_t *conns;
    size_t n_closing;
    ucx_op_t *done_head, *done_tail;
    ucx_op_t *free_ops;
    ucx_region_t *regions;
    size_t n_regions, cap_regions;
    uint64_t activity; /* bumped by everything the user would call "something happened" */
    volatile int wake_pending;
    bool in_progress;
    bool destroying;
    bool use_memh;
    /* the user chose UCX's net devices (the configuration's list or
     * UCX_NET_DEVICES): listening leaves them as they are */
    bool devices_chosen;
};

static inline ucx_conn_t *conn_of(hs_tp_conn_t *c) { return (ucx_conn_t *)c; }

static inline ucx_tp_t *tp_of(hs_tp_t *t) { return (ucx_tp_t *)t; }

/* ucx.c */
void hs__ucx_worker_wait(ucx_tp_t *tp, int ms);
void hs__ucx_worker_drain(ucx_tp_t *tp);

/* ucx_describe.c */
/* Reads the endpoint's lanes (ucp_ep_print_info) into c->base.describe,
 * e.g. "ucx: tcp/lo[am,bw] cm=rdmacm rndv>=8192", and whether they carry
 * registered memory (lanes_known, memh_lanes). */
void hs__ucx_conn_refresh_describe(ucx_conn_t *c);

/* ucx_ctx.c */
/* Opens tp's UCX context and worker with `net_devices` as UCX_NET_DEVICES
 * (NULL: UCX's own setting). On failure tp's UCX fields are left NULL. */
HS_MUST_CHECK hs_status_t hs__ucx_ctx_open(ucx_tp_t *tp, const char *net_devices);
/* Undoes hs__ucx_ctx_open, the memory regions' handles included. */
void hs__ucx_ctx_close(ucx_tp_t *tp);
/* A peer's worker address as UCX may see it (ucx_addr_int.h): checked, cut
 * to the entries this side has too, and followed by HS__UCX_ADDR_PAD zero
 * bytes; *out is malloc'd, the caller frees it. On failure `why` says what
 * was wrong (HS_ERR_FORMAT, HS_ERR_UNSUPPORTED, HS_ERR_NOMEM). */
/* Before the first listen on `host`: unless the user chose UCX's net
 * devices, reopens UCX with only the network interfaces that hold host's
 * address (and the RDMA ports, which open no socket), so that UCX's own TCP
 * listeners bind only there. A wildcard host changes nothing. */
HS_MUST_CHECK hs_status_t hs__ucx_listen_devices(ucx_tp_t *tp, const char *host);
HS_MUST_CHECK hs_status_t hs__ucx_peer_addr(ucx_tp_t *tp, const uint8_t *addr, size_t len,
                                            uint8_t **out, char *why, size_t whycap);

/* ucx_data.c */
ucx_op_t *hs__ucx_op_get(ucx_tp_t *tp, op_kind_t kind, ucx_conn_t *c);
void hs__ucx_op_put(ucx_tp_t *tp, ucx_op_t *op);
void hs__ucx_process_done(ucx_tp_t *tp);
void hs__ucx_send_cb(void *request, ucs_status_t status, void *user_data);
ucx_conn_t *hs__ucx_conn_alloc(ucx_tp_t *tp);
void hs__ucx_conn_link(ucx_tp_t *tp, ucx_conn_t *c);
void hs__ucx_conn_unlink(ucx_tp_t *tp, ucx_conn_t *c);
HS_MUST_CHECK hs_status_t hs__ucx_send_am(ucx_conn_t *c, unsigned id, const void *frame,
                                          size_t len);
void hs__ucx_conn_begin_close(ucx_conn_t *c, hs_status_t reason, const char *why, bool send_bye);
void hs__ucx_conn_force_close(ucx_conn_t *c);
void hs__ucx_advance_closes(ucx_tp_t *tp);
ucs_status_t hs__ucx_am_frame_cb(void *arg, const void *header, size_t header_length, void *data,
                                 size_t length, const ucp_am_recv_param_t *param);
ucs_status_t hs__ucx_am_payload_cb(void *arg, const void *header, size_t header_length, void *data,
                                   size_t length, const ucp_am_recv_param_t *param);
ucs_status_t hs__ucx_am_close_cb(void *arg, const void *header, size_t header_length, void *data,
                                 size_t length, const ucp_am_recv_param_t *param);
HS_MUST_CHECK hs_status_t hs__ucx_recv_payload(hs_tp_conn_t *conn, void *dest, uint64_t bytes,
                                               uint64_t cookie);
HS_MUST_CHECK hs_status_t hs__ucx_send(hs_tp_conn_t *conn, const void *frame, size_t frame_len);
HS_MUST_CHECK hs_status_t hs__ucx_send_payload(hs_tp_conn_t *conn, const void *frame,
                                               size_t frame_len, const void *payload,
                                               uint64_t payload_len, hs_tp_send_cb cb,
                                               void *cb_arg);
void hs__ucx_close(hs_tp_conn_t *conn, hs_status_t reason);
ucs_status_t hs__ucx_ep_create_to(ucx_tp_t *tp, ucx_conn_t *c, const void *addr);

/* ucx_boot_server.c */
void hs__ucx_pending_free(ucx_tp_t *tp, ucx_pending_t *p);
HS_MUST_CHECK hs_status_t hs__ucx_sockets_poll(ucx_tp_t *tp, int ms, bool with_efd);
HS_MUST_CHECK hs_status_t hs__ucx_listen(hs_tp_t *t, const char *host, uint16_t port,
                                         uint16_t *bound_port);

/* ucx_boot_client.c */
HS_MUST_CHECK hs_status_t hs__ucx_connect(hs_tp_t *t, const char *host, uint16_t port,
                                          int timeout_ms, unsigned flags, hs_tp_conn_t **out);

/* ucx_mem.c */
ucp_mem_h hs__ucx_region_memh(ucx_tp_t *tp, ucx_conn_t *c, const void *p, uint64_t len);
HS_MUST_CHECK hs_status_t hs__ucx_mem_register(hs_tp_t *t, void *addr, size_t len);

#ifdef __cplusplus
}
#endif
#endif /* HS_UCX_INT_H */
