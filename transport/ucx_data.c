/* SPDX-License-Identifier: Apache-2.0 */
/* ucx_data.c - the UCX transport's data path (see ucx.c): operations and
 * their completions, connections and their close, active messages in and
 * out, payloads straight into the receiver's memory. */

#include "ucx_int.h"
#include "hs_status.h"
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

/* ---- ops ------------------------------------------------------------------ */

ucx_op_t *hs__ucx_op_get(ucx_tp_t *tp, op_kind_t kind, ucx_conn_t *c)
{
    ucx_op_t *op = tp->free_ops;
    if (op) {
        tp->free_ops = op->dnext;
    } else {
        op = calloc(1, sizeof *op);
        if (!op) return NULL;
    }
    op->kind = kind;
    op->conn = c;
    op->cb = NULL;
    op->cb_arg = NULL;
    op->cookie = 0;
    op->status = UCS_OK;
    op->dnext = NULL;
    op->frame = op->inline_frame;
    op->cprev = NULL;
    op->cnext = c->ops;
    if (c->ops) c->ops->cprev = op;
    c->ops = op;
    c->n_ops++;
    return op;
}

static hs_status_t op_set_frame(ucx_op_t *op, const void *frame, size_t len)
{
    if (len > OP_INLINE) {
        if (op->heap_cap < len) {
            uint8_t *n = realloc(op->heap_frame, len);
            if (!n) return HS_ERR_NOMEM;
            op->heap_frame = n;
            op->heap_cap = len;
        }
        op->frame = op->heap_frame;
    }
    memcpy(op->frame, frame, len);
    return HS_OK;
}

/* Detaches op from its connection and returns it to the free list. */
void hs__ucx_op_put(ucx_tp_t *tp, ucx_op_t *op)
{
    ucx_conn_t *c = op->conn;
    if (c) {
        if (op->cprev)
            op->cprev->cnext = op->cnext;
        else
            c->ops = op->cnext;
        if (op->cnext) op->cnext->cprev = op->cprev;
        c->n_ops--;
    }
    op->conn = NULL;
    op->dnext = tp->free_ops;
    tp->free_ops = op;
}

/* Queues a finished op; what the user sees runs from process_done(). */
static void op_done(ucx_tp_t *tp, ucx_op_t *op, ucs_status_t status)
{
    op->status = status;
    op->dnext = NULL;
    if (tp->done_tail)
        tp->done_tail->dnext = op;
    else
        tp->done_head = op;
    tp->done_tail = op;
}

static hs_status_t user_status(const ucx_conn_t *c, ucs_status_t st)
{
    if (st == UCS_OK) return HS_OK;
    if (!c || c->closing || st == UCS_ERR_CANCELED) return HS_ERR_CLOSED;
    return HS_ERR_IO;
}

void hs__ucx_process_done(ucx_tp_t *tp)
{
    while (tp->done_head) {
        ucx_op_t *op = tp->done_head;
        tp->done_head = op->dnext;
        if (!tp->done_head) tp->done_tail = NULL;
        ucx_conn_t *c = op->conn;
        tp->activity++;
        switch (op->kind) {
        case OP_SEND_PAYLOAD:
            if (op->cb) op->cb(op->cb_arg, user_status(c, op->status));
            break;
        case OP_RECV:
            if (c && tp->base.cb.on_payload)
                tp->base.cb.on_payload(tp->base.arg, &c->base, op->cookie,
                                       user_status(c, op->status));
            break;
        case OP_FLUSH:
            if (c) c->flushed = true;
            break;
        case OP_CLOSE:
            if (c) c->close_done = true;
            break;
        case OP_SEND:
            break;
        }
        hs__ucx_op_put(tp, op);
    }
}

void hs__ucx_send_cb(void *request, ucs_status_t status, void *user_data)
{
    ucx_op_t *op = user_data;
    ucp_request_free(request);
    ucx_tp_t *tp = op->conn ? op->conn->tp : NULL;
    if (!tp) {
        /* orphaned: its owner already heard about it; only recycle */
        free(op->heap_frame);
        free(op);
        return;
    }
    op_done(tp, op, status);
}

static void recv_cb(void *request, ucs_status_t status, size_t length, void *user_data)
{
    hs__ucx_send_cb(request, status, user_data);
}

static void err_cb(void *arg, ucp_ep_h ep, ucs_status_t status)
{
    ucx_conn_t *c = arg;
    c->failed = true;
    c->tp->activity++;
    if (c->closing || !c->connected) return; /* a connect attempt handles its own failure */
    char why[200];
    snprintf(why, sizeof why, "connection to %s failed: %s", c->base.peer,
             ucs_status_string(status));
    if (c->connected) hs_warn("%s", why);
    hs__ucx_conn_begin_close(c, HS_ERR_IO, why, false);
}

ucx_conn_t *hs__ucx_conn_alloc(ucx_tp_t *tp)
{
    ucx_conn_t *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    c->base.tp = &tp->base;
    c->base.max_frame_body = tp->base.cfg.max_frame_body;
    c->tp = tp;
    snprintf(c->base.describe, sizeof c->base.describe, "ucx");
    return c;
}

void hs__ucx_conn_link(ucx_tp_t *tp, ucx_conn_t *c)
{
    c->next = tp->conns;
    if (tp->conns) tp->conns->prev = c;
    tp->conns = c;
}

void hs__ucx_conn_unlink(ucx_tp_t *tp, ucx_conn_t *c)
{
    if (c->prev)
        c->prev->next = c->next;
    else
        tp->conns = c->next;
    if (c->next) c->next->prev = c->prev;
    c->prev = c->next = NULL;
}

static ucx_conn_t *conn_by_ep(ucx_tp_t *tp, const ucp_am_recv_param_t *param)
{
    if (!(param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP)) return NULL;
    for (ucx_conn_t *c = tp->conns; c; c = c->next)
        if (c->ep == param->reply_ep) return c;
    return NULL;
}

/* Eager, fire-and-forget AM of the transport's own (frames, close). */
hs_status_t hs__ucx_send_am(ucx_conn_t *c, unsigned id, const void *frame, size_t len)
{
    ucx_tp_t *tp = c->tp;
    if (!c->ep || c->ep_closed) return HS_ERR_CLOSED;
    ucx_op_t *op = hs__ucx_op_get(tp, OP_SEND, c);
    if (!op) return HS_ERR_NOMEM;
    if (len > 0 && op_set_frame(op, frame, len) != HS_OK) {
        hs__ucx_op_put(tp, op);
        return HS_ERR_NOMEM;
    }
    ucp_request_param_t prm = {
        .op_attr_mask =
            UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_FLAGS,
        .flags = UCP_AM_SEND_FLAG_EAGER | UCP_AM_SEND_FLAG_REPLY,
        .cb.send = hs__ucx_send_cb,
        .user_data = op,
    };
    ucs_status_ptr_t r = ucp_am_send_nbx(c->ep, id, NULL, 0, len ? op->frame : NULL, len, &prm);
    if (r == NULL) {
        hs__ucx_op_put(tp, op);
        return HS_OK;
    }
    if (UCS_PTR_IS_ERR(r)) {
        hs__ucx_op_put(tp, op);
        hs_debug("ucx send to %s failed: %s", c->base.peer, ucs_status_string(UCS_PTR_STATUS(r)));
        return HS_ERR_IO;
    }
    return HS_OK;
}

void hs__ucx_conn_begin_close(ucx_conn_t *c, hs_status_t reason, const char *why, bool send_bye)
{
    if (c->closing) return;
    if (send_bye && !c->failed && hs__ucx_send_am(c, AM_CLOSE, NULL, 0) != HS_OK)
        hs_debug("connection %s: the close notice could not be sent", c->base.peer);
    c->closing = true;
    c->close_reason = reason;
    snprintf(c->close_why, sizeof c->close_why, "%s", why);
    c->linger_deadline_ns = hs_now_ns() + (uint64_t)UCX_LINGER_MS * 1000000u;
    c->tp->n_closing++;
    c->tp->activity++;
}

static void conn_fail_peer(ucx_conn_t *c, hs_status_t st, const char *why)
{
    hs_warn("connection %s: %s; closing it", c->base.peer, why);
    uint8_t buf[512];
    size_t n = hs__tp_error_frame(st, why, buf, sizeof buf);
    if (n > 0 && hs__ucx_send_am(c, AM_FRAME, buf, n) != HS_OK)
        hs_debug("connection %s: the ERROR frame could not be sent", c->base.peer);
    hs__ucx_conn_begin_close(c, st, why, true); /* the peer learns of it from AM_CLOSE */
}

void hs__ucx_conn_force_close(ucx_conn_t *c)
{
    ucx_tp_t *tp = c->tp;
    c->ep_closed = true;
    c->drain_deadline_ns = hs_now_ns() + (uint64_t)UCX_DRAIN_MS * 1000000u;
    ucx_op_t *op = hs__ucx_op_get(tp, OP_CLOSE, c);
    if (!op) {
        /* no memory for tracking: close anyway, do not wait for it */
        ucs_status_ptr_t r = ucp_ep_close_nb(c->ep, UCP_EP_CLOSE_MODE_FORCE);
        if (r && !UCS_PTR_IS_ERR(r)) ucp_request_free(r);
        c->close_done = true;
        return;
    }
    ucp_request_param_t prm = {
        .op_attr_mask =
            UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_FLAGS,
        /* a healthy, flushed endpoint closes in flush mode (UCX 1.13's tcp
         * transport can crash in worker destroy after forced closes of
         * healthy endpoints); a failed or stuck one is forced */
        .flags = c->flushed && !c->failed && !tp->destroying ? 0 : UCP_EP_CLOSE_FLAG_FORCE,
        .cb.send = hs__ucx_send_cb,
        .user_data = op,
    };
    ucs_status_ptr_t r = ucp_ep_close_nbx(c->ep, &prm);
    if (r == NULL || UCS_PTR_IS_ERR(r)) {
        c->close_done = true;
        hs__ucx_op_put(tp, op);
    }
}

static void conn_finalize(ucx_conn_t *c)
{
    ucx_tp_t *tp = c->tp;
    /* requests UCX did not finish in time: tell the user now, and let the
     * late UCX callback only recycle the op */
    while (c->ops) {
        ucx_op_t *op = c->ops;
        c->ops = op->cnext;
        c->n_ops--;
        op->conn = NULL;
        if (op->kind == OP_SEND_PAYLOAD && op->cb) op->cb(op->cb_arg, HS_ERR_CLOSED);
        if (op->kind == OP_RECV && tp->base.cb.on_payload)
            tp->base.cb.on_payload(tp->base.arg, &c->base, op->cookie, HS_ERR_CLOSED);
        op->cb = NULL;
    }
    /* ops already on the done queue for this connection must not touch it */
    for (ucx_op_t *op = tp->done_head; op; op = op->dnext)
        assert(op->conn != c);
    tp->n_closing--;
    tp->activity++;
    if (c->announced) tp->base.cb.on_close(tp->base.arg, &c->base, c->close_reason, c->close_why);
    hs__ucx_conn_unlink(tp, c);
    free(c);
}

/* Moves closing connections along: flush, forced close, wait, on_close. */
void hs__ucx_advance_closes(ucx_tp_t *tp)
{
    if (tp->n_closing == 0) return;
    uint64_t now = hs_now_ns();
    ucx_conn_t *next;
    for (ucx_conn_t *c = tp->conns; c; c = next) {
        next = c->next;
        if (!c->closing) continue;
        if (!c->ep_closed) {
            if (!c->failed && !c->flush_started) {
                c->flush_started = true;
                ucx_op_t *op = hs__ucx_op_get(tp, OP_FLUSH, c);
                if (op) {
                    ucp_request_param_t prm = {
                        .op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA,
                        .cb.send = hs__ucx_send_cb,
                        .user_data = op,
                    };
                    ucs_status_ptr_t r = ucp_ep_flush_nbx(c->ep, &prm);
                    if (r == NULL || UCS_PTR_IS_ERR(r)) {
                        c->flushed = true;
                        hs__ucx_op_put(tp, op);
                    }
                } else {
                    c->flushed = true;
                }
            }
            if (c->failed || c->flushed || now >= c->linger_deadline_ns)
                hs__ucx_conn_force_close(c);
        }
        if (c->ep_closed && c->close_done && c->n_ops == 0) {
            conn_finalize(c);
        } else if (c->ep_closed && now >= c->drain_deadline_ns) {
            hs_warn("connection %s: UCX did not finish %d requests after close; failing them",
                    c->base.peer, c->n_ops);
            conn_finalize(c);
        }
    }
}

/* ---- receiving ------------------------------------------------------------ */

/* Checks a received frame; on failure closes the connection. */
static bool frame_check(ucx_conn_t *c, const void *frame, size_t len, hs_frame_header_t *h)
{
    char why[200];
    if (len < HS_FRAME_HEADER_BYTES) {
        snprintf(why, sizeof why, "a frame of %zu bytes is shorter than its header", len);
        conn_fail_peer(c, HS_ERR_FORMAT, why);
        return false;
    }
    hs_status_t st = hs_frame_header_decode(frame, c->base.max_frame_body, h, why, sizeof why);
    if (st == HS_OK && (size_t)h->body_len + HS_FRAME_HEADER_BYTES != len) {
        snprintf(why, sizeof why, "%s frame of %zu bytes whose header says %u body bytes",
                 hs_msg_type_str(h->type), len, h->body_len);
        st = HS_ERR_FORMAT;
    }
    if (st == HS_OK)
        st =
            hs_frame_body_check(h, (const uint8_t *)frame + HS_FRAME_HEADER_BYTES, why, sizeof why);
    if (st != HS_OK) {
        conn_fail_peer(c, st, why);
        return false;
    }
    return true;
}

/* require_rdma: the first message shows which lanes carry the connection. */
static bool lanes_ok(ucx_conn_t *c)
{
    if (c->lanes_checked) return true;
    c->lanes_checked = true;
    hs__ucx_conn_refresh_describe(c);
    hs_info("connection from %s: %s", c->base.peer, c->base.describe);
    if (!c->tp->base.cfg.require_rdma || hs__ucx_describe_has_rdma(c->base.describe)) return true;
    char why[HS__TP_DESCRIBE_CAP + 512];
    snprintf(
        why, sizeof why,
        "RDMA is required but UCX carries %s over '%s' (no rc/dc/ud verbs lane): "
        "check the RDMA NIC, its link and UCX_NET_DEVICES/UCX_TLS, or run without --require-rdma",
        c->base.peer, c->base.describe);
    hs_error("%s", why);
    hs__ucx_conn_begin_close(c, HS_ERR_UNSUPPORTED, why, true);
    return false;
}

ucs_status_t hs__ucx_am_frame_cb(void *arg, const void *header, size_t header_length, void *data,
                                 size_t length, const ucp_am_recv_param_t *param)
{
    ucx_tp_t *tp = arg;
    ucx_conn_t *c = conn_by_ep(tp, param);
    if (!c || c->closing) return UCS_OK;
    tp->activity++;
    if (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) {
        /* frames always travel eager; drop the data, cut the peer off */
        conn_fail_peer(c, HS_ERR_PROTO, "a control frame arrived as a rendezvous message");
        return UCS_OK;
    }
    if (!lanes_ok(c)) return UCS_OK;
    hs_frame_header_t h;
    if (!frame_check(c, data, length, &h)) return UCS_OK;
    hs__tp_deliver_frame(&c->base, h.type, (const uint8_t *)data + HS_FRAME_HEADER_BYTES,
                         h.body_len, 0);
    return UCS_OK;
}

ucs_status_t hs__ucx_am_payload_cb(void *arg, const void *header, size_t header_length, void *data,
                                   size_t length, const ucp_am_recv_param_t *param)
{
    ucx_tp_t *tp = arg;
    bool rndv = (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0;
    /* what a refused rendezvous returns: UCX then completes the sender's
     * request with this error (never as delivered) */
    const ucs_status_t refuse = rndv ? UCS_ERR_REJECTED : UCS_OK;
    ucx_conn_t *c = conn_by_ep(tp, param);
    if (!c || c->closing) return refuse;
    tp->activity++;
    if (!lanes_ok(c)) return refuse;
    hs_frame_header_t h;
    if (!frame_check(c, header, header_length, &h)) return refuse;
    if (length == 0) {
        conn_fail_peer(c, HS_ERR_PROTO, "an empty payload");
        return refuse;
    }
    if (!hs__tp_deliver_frame(&c->base, h.type, (const uint8_t *)header + HS_FRAME_HEADER_BYTES,
                              h.body_len, length)) {
        if (!c->closing) {
            char why[160];
            snprintf(why, sizeof why, "a payload of %zu bytes after a %s frame was not accepted",
                     length, hs_msg_type_str(h.type));
            conn_fail_peer(c, HS_ERR_PROTO, why);
        }
        return refuse;
    }
    ucx_op_t *op = hs__ucx_op_get(tp, OP_RECV, c);
    if (!op) {
        /* cannot track it, so cannot report it: the connection goes */
        hs__ucx_conn_begin_close(c, HS_ERR_NOMEM, "out of memory for a payload receive", false);
        return refuse;
    }
    op->cookie = c->pl_cookie;
    if (c->closing) { /* the callee accepted, then closed */
        op_done(tp, op, UCS_ERR_CANCELED);
        return refuse;
    }
    if (!rndv) {
        memcpy(c->pl_dest, data, length);
        op_done(tp, op, UCS_OK);
        return UCS_OK;
    }
    ucp_request_param_t prm = {
        .op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA,
        .cb.recv_am = recv_cb,
        .user_data = op,
    };
    ucp_mem_h memh = hs__ucx_region_memh(tp, c, c->pl_dest, length);
    if (memh) {
        prm.op_attr_mask |= UCP_OP_ATTR_FIELD_MEMH;
        prm.memh = memh;
    }
    ucs_status_ptr_t r = ucp_am_recv_data_nbx(tp->worker, data, c->pl_dest, length, &prm);
    if (r == NULL) {
        op_done(tp, op, UCS_OK);
        return UCS_OK;
    }
    if (UCS_PTR_IS_ERR(r)) {
        char why[160];
        snprintf(why, sizeof why, "receiving a %zu-byte payload failed: %s", length,
                 ucs_status_string(UCS_PTR_STATUS(r)));
        op_done(tp, op, UCS_PTR_STATUS(r));
        hs__ucx_conn_begin_close(c, HS_ERR_IO, why, false);
        return UCS_OK;
    }
    return UCS_INPROGRESS;
}

ucs_status_t hs__ucx_am_close_cb(void *arg, const void *header, size_t header_length, void *data,
                                 size_t length, const ucp_am_recv_param_t *param)
{
    ucx_tp_t *tp = arg;
    ucx_conn_t *c = conn_by_ep(tp, param);
    if (!c || c->closing) return UCS_OK;
    char why[160];
    snprintf(why, sizeof why, "peer %s closed the connection", c->base.peer);
    hs__ucx_conn_begin_close(c, HS_ERR_CLOSED, why, false);
    return UCS_OK;
}

hs_status_t hs__ucx_recv_payload(hs_tp_conn_t *conn, void *dest, uint64_t bytes, uint64_t cookie)
{
    ucx_conn_t *c = conn_of(conn); /* transport.c checked the call and the size */
    (void)bytes;
    c->pl_dest = dest;
    c->pl_cookie = cookie;
    return HS_OK;
}

/* ---- sending -------------------------------------------------------------- */

hs_status_t hs__ucx_send(hs_tp_conn_t *conn, const void *frame, size_t frame_len)
{
    ucx_conn_t *c = conn_of(conn);
    if (c->closing) return HS_ERR_CLOSED;
    return hs__ucx_send_am(c, AM_FRAME, frame, frame_len);
}

hs_status_t hs__ucx_send_payload(hs_tp_conn_t *conn, const void *frame, size_t frame_len,
                                 const void *payload, uint64_t payload_len, hs_tp_send_cb cb,
                                 void *cb_arg)
{
    ucx_conn_t *c = conn_of(conn);
    ucx_tp_t *tp = c->tp;
    if (c->closing) return HS_ERR_CLOSED;
    if (frame_len > tp->max_am_header) {
        hs_error("a %zu-byte frame cannot announce a payload over UCX (at most %zu bytes): "
                 "keep DONE frames small",
                 frame_len, tp->max_am_header);
        return HS_ERR_INVALID;
    }
    ucx_op_t *op = hs__ucx_op_get(tp, OP_SEND_PAYLOAD, c);
    if (!op) return HS_ERR_NOMEM;
    if (op_set_frame(op, frame, frame_len) != HS_OK) {
        hs__ucx_op_put(tp, op);
        return HS_ERR_NOMEM;
    }
    op->cb = cb;
    op->cb_arg = cb_arg;
    ucp_request_param_t prm = {
        .op_attr_mask =
            UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_FLAGS,
        .flags = UCP_AM_SEND_FLAG_REPLY,
        .cb.send = hs__ucx_send_cb,
        .user_data = op,
    };
    ucp_mem_h memh = hs__ucx_region_memh(tp, c, payload, payload_len);
    if (memh) {
        prm.op_attr_mask |= UCP_OP_ATTR_FIELD_MEMH;
        prm.memh = memh;
    }
    ucs_status_ptr_t r =
        ucp_am_send_nbx(c->ep, AM_PAYLOAD, op->frame, frame_len, payload, payload_len, &prm);
    if (r == NULL) {
        op_done(tp, op, UCS_OK); /* the callback runs from progress, never from here */
        return HS_OK;
    }
    if (UCS_PTR_IS_ERR(r)) {
        op->cb = NULL;
        hs__ucx_op_put(tp, op);
        hs_error("ucx payload send to %s failed: %s", c->base.peer,
                 ucs_status_string(UCS_PTR_STATUS(r)));
        return HS_ERR_IO;
    }
    return HS_OK;
}

void hs__ucx_close(hs_tp_conn_t *conn, hs_status_t reason)
{
    ucx_conn_t *c = conn_of(conn);
    char why[96];
    snprintf(why, sizeof why, "closed by this side (%s)", hs_status_str(reason));
    hs__ucx_conn_begin_close(c, reason, why, true);
}

ucs_status_t hs__ucx_ep_create_to(ucx_tp_t *tp, ucx_conn_t *c, const void *addr)
{
    ucp_ep_params_t ep = {
        .field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                      UCP_EP_PARAM_FIELD_ERR_HANDLER,
        .address = addr,
        .err_mode = UCP_ERR_HANDLING_MODE_PEER,
        .err_handler = {.cb = err_cb, .arg = c},
    };
    return ucp_ep_create(tp->worker, &ep, &c->ep);
}
