/* ucx.c - the UCX transport (UCX 1.13 UCP active messages).
 *
 * One ucp_context + ucp_worker per hs_tp_t. The consumer listens on a TCP
 * socket of its own where the two sides swap UCX worker addresses (see
 * "bootstrap" below for why not a ucp_listener); every connection is then a
 * pair of endpoints created from those addresses with
 * UCP_ERR_HANDLING_MODE_PEER (UCX keepalive, set from peer_timeout_s unless
 * UCX_KEEPALIVE_INTERVAL is set, detects dead peers).
 *
 * Active messages (every send sets UCP_AM_SEND_FLAG_REPLY so the receiver
 * learns the endpoint, which names the connection):
 *   AM_FRAME    data = one complete control frame, always sent eager
 *   AM_PAYLOAD  header = the frame that announces the payload (a DONE),
 *               data = the payload; UCX picks eager or rendezvous by size
 *   AM_CLOSE    no data: orderly close, nothing follows on this endpoint
 * The frame is checked (header, length, crc) before on_frame runs. For a
 * payload, on_frame gets payload_bytes; if the callee accepted with
 * hs_tp_recv_payload(), a rendezvous payload is received with
 * ucp_am_recv_data_nbx() straight into dest (the callback returns
 * UCS_INPROGRESS), an eager one is copied into dest. A refused rendezvous is
 * answered with an error status, so the sender's request fails rather than
 * completing as if delivered, and the endpoint is closed.
 *
 * Progress is event driven: ucp_worker_get_efd + ucp_worker_arm + poll, no
 * spinning while idle; hs_tp_wakeup() is ucp_worker_signal(). Completions
 * the user sees (send callbacks, on_payload) are queued by the UCX callbacks
 * and run after ucp_worker_progress() returns, still inside hs_tp_progress().
 *
 * Close: hs_tp_close() sends AM_CLOSE, flushes the endpoint for up to
 * UCX_LINGER_MS, then closes it (flush mode when the flush completed, else
 * UCP_EP_CLOSE_FLAG_FORCE); UCX fails the requests still outstanding, and
 * on_close runs once all of them reported (or UCX_DRAIN_MS passed).
 */
#include "hs_transport_int.h"
#include "sock_int.h"
#include "ucx_hello_int.h"

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
#include <ucp/api/ucp.h>

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
};

static ucx_conn_t *conn_of(hs_tp_conn_t *c)
{
    return (ucx_conn_t *)c;
}
static ucx_tp_t *tp_of(hs_tp_t *t)
{
    return (ucx_tp_t *)t;
}

/* ---- ops ------------------------------------------------------------------ */

static ucx_op_t *op_get(ucx_tp_t *tp, op_kind_t kind, ucx_conn_t *c)
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
static void op_put(ucx_tp_t *tp, ucx_op_t *op)
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

static void process_done(ucx_tp_t *tp)
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
        op_put(tp, op);
    }
}

static void send_cb(void *request, ucs_status_t status, void *user_data)
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
    send_cb(request, status, user_data);
}

/* ---- endpoint description ---------------------------------------------- */

/* A one-line summary of ucp_ep_print_info(), e.g.
 *   "ucx: tcp/lo[am,bw] tcp/eth0[bw] cm=rdmacm rndv>=8192"
 * from lines such as
 *   lane[1]:  1:tcp/lo.0 md[1] -> md[1]/tcp/sysdev[255] rma_bw#0 am am_bw#0 wireup
 *   am_send: 0..<egr/short>..8185..<egr/zcopy>..8192..<rndv>..(inf)
 * The whole text is logged at trace level. */
static void conn_refresh_describe(ucx_conn_t *c)
{
    if (!c->ep || c->ep_closed || !c->connected) return;
    char *text = NULL;
    size_t size = 0;
    FILE *f = open_memstream(&text, &size);
    if (!f) return;
    ucp_ep_print_info(c->ep, f);
    fclose(f);
    if (!text) return;
    hs_trace("ucx endpoint to %s:\n%s", c->base.peer, text);
    char out[HS__TP_DESCRIBE_CAP];
    size_t n = (size_t)snprintf(out, sizeof out, "ucx:");
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
        char *lane = strstr(line, "lane[");
        char *rndv = strstr(line, "..<rndv>");
        if (lane) {
            char *p = strstr(lane, "]:");
            if (!p) continue;
            p += 2;
            while (*p == ' ')
                p++;
            if (strncmp(p, "cm ", 3) == 0) {
                n +=
                    (size_t)snprintf(out + n, n < sizeof out ? sizeof out - n : 0, " cm=%s", p + 3);
                continue;
            }
            while (*p >= '0' && *p <= '9')
                p++;
            if (*p == ':') p++;
            char tl[64];
            size_t l = strcspn(p, " ");
            if (l == 0 || l >= sizeof tl) continue;
            memcpy(tl, p, l);
            tl[l] = '\0';
            char *slash = strchr(tl, '/');
            char *dot = strrchr(tl, '.'); /* "lo.0" -> "lo": the path index */
            if (slash && dot && dot > slash) *dot = '\0';
            bool am = strstr(p, " am ") || strstr(p, " am\0") || strstr(p, " am_bw");
            bool bw = strstr(p, "am_bw") || strstr(p, "rma_bw");
            n += (size_t)snprintf(out + n, n < sizeof out ? sizeof out - n : 0, " %s[%s%s%s]", tl,
                                  am ? "am" : "", am && bw ? "," : "", bw ? "bw" : "");
        } else if (rndv) {
            /* the number just before "..<rndv>" */
            char *q = rndv;
            while (q > line && q[-1] >= '0' && q[-1] <= '9')
                q--;
            if (q < rndv)
                n += (size_t)snprintf(out + n, n < sizeof out ? sizeof out - n : 0, " rndv>=%.*s",
                                      (int)(rndv - q), q);
        }
    }
    free(text);
    if (n > 4) snprintf(c->base.describe, sizeof c->base.describe, "%s", out);
}

static bool describe_has_rdma(const char *d)
{
    /* rc_verbs, rc_mlx5, dc_mlx5, ud_verbs, ud_mlx5 (not "cm=rdmacm") */
    static const char *tls[] = {" rc_", " dc_", " ud_", " rc/", " dc/", " ud/"};
    for (size_t i = 0; i < sizeof tls / sizeof tls[0]; i++)
        if (strstr(d, tls[i])) return true;
    return false;
}

static void ucx_describe(hs_tp_conn_t *conn)
{
    conn_refresh_describe(conn_of(conn));
}

/* ---- connections --------------------------------------------------------- */

static void conn_begin_close(ucx_conn_t *c, hs_status_t reason, const char *why, bool send_bye);

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
    conn_begin_close(c, HS_ERR_IO, why, false);
}

static ucx_conn_t *conn_alloc(ucx_tp_t *tp)
{
    ucx_conn_t *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    c->base.tp = &tp->base;
    c->base.max_frame_body = tp->base.cfg.max_frame_body;
    c->tp = tp;
    snprintf(c->base.describe, sizeof c->base.describe, "ucx");
    return c;
}

static void conn_link(ucx_tp_t *tp, ucx_conn_t *c)
{
    c->next = tp->conns;
    if (tp->conns) tp->conns->prev = c;
    tp->conns = c;
}

static void conn_unlink(ucx_tp_t *tp, ucx_conn_t *c)
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

/* The handle of a registration that holds [p, p+len) whole, or NULL (UCX
 * then registers the memory itself, on the data path: counted). */
static ucp_mem_h region_memh(ucx_tp_t *tp, const void *p, uint64_t len)
{
    if (!tp->use_memh) return NULL;
    const uint8_t *b = p;
    for (size_t i = 0; i < tp->n_regions; i++) {
        const uint8_t *r = tp->regions[i].addr;
        if (b >= r && b + len <= r + tp->regions[i].len) return tp->regions[i].memh;
    }
    tp->base.payloads_unregistered++;
    return NULL;
}

/* Eager, fire-and-forget AM of the transport's own (frames, close). */
static hs_status_t send_am(ucx_conn_t *c, unsigned id, const void *frame, size_t len)
{
    ucx_tp_t *tp = c->tp;
    if (!c->ep || c->ep_closed) return HS_ERR_CLOSED;
    ucx_op_t *op = op_get(tp, OP_SEND, c);
    if (!op) return HS_ERR_NOMEM;
    if (len > 0 && op_set_frame(op, frame, len) != HS_OK) {
        op_put(tp, op);
        return HS_ERR_NOMEM;
    }
    ucp_request_param_t prm = {
        .op_attr_mask =
            UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_FLAGS,
        .flags = UCP_AM_SEND_FLAG_EAGER | UCP_AM_SEND_FLAG_REPLY,
        .cb.send = send_cb,
        .user_data = op,
    };
    ucs_status_ptr_t r = ucp_am_send_nbx(c->ep, id, NULL, 0, len ? op->frame : NULL, len, &prm);
    if (r == NULL) {
        op_put(tp, op);
        return HS_OK;
    }
    if (UCS_PTR_IS_ERR(r)) {
        op_put(tp, op);
        hs_debug("ucx send to %s failed: %s", c->base.peer, ucs_status_string(UCS_PTR_STATUS(r)));
        return HS_ERR_IO;
    }
    return HS_OK;
}

static void conn_begin_close(ucx_conn_t *c, hs_status_t reason, const char *why, bool send_bye)
{
    if (c->closing) return;
    if (send_bye && !c->failed) (void)send_am(c, AM_CLOSE, NULL, 0);
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
    if (n > 0) (void)send_am(c, AM_FRAME, buf, n);
    conn_begin_close(c, st, why, true); /* the peer learns of it from AM_CLOSE */
}

static void conn_force_close(ucx_conn_t *c)
{
    ucx_tp_t *tp = c->tp;
    c->ep_closed = true;
    c->drain_deadline_ns = hs_now_ns() + (uint64_t)UCX_DRAIN_MS * 1000000u;
    ucx_op_t *op = op_get(tp, OP_CLOSE, c);
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
        .cb.send = send_cb,
        .user_data = op,
    };
    ucs_status_ptr_t r = ucp_ep_close_nbx(c->ep, &prm);
    if (r == NULL || UCS_PTR_IS_ERR(r)) {
        c->close_done = true;
        op_put(tp, op);
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
    conn_unlink(tp, c);
    free(c);
}

/* Moves closing connections along: flush, forced close, wait, on_close. */
static void advance_closes(ucx_tp_t *tp)
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
                ucx_op_t *op = op_get(tp, OP_FLUSH, c);
                if (op) {
                    ucp_request_param_t prm = {
                        .op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA,
                        .cb.send = send_cb,
                        .user_data = op,
                    };
                    ucs_status_ptr_t r = ucp_ep_flush_nbx(c->ep, &prm);
                    if (r == NULL || UCS_PTR_IS_ERR(r)) {
                        c->flushed = true;
                        op_put(tp, op);
                    }
                } else {
                    c->flushed = true;
                }
            }
            if (c->failed || c->flushed || now >= c->linger_deadline_ns) conn_force_close(c);
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
    conn_refresh_describe(c);
    hs_info("connection from %s: %s", c->base.peer, c->base.describe);
    if (!c->tp->base.cfg.require_rdma || describe_has_rdma(c->base.describe)) return true;
    char why[HS__TP_DESCRIBE_CAP + 512];
    snprintf(
        why, sizeof why,
        "RDMA is required but UCX carries %s over '%s' (no rc/dc/ud verbs lane): "
        "check the RDMA NIC, its link and UCX_NET_DEVICES/UCX_TLS, or run without --require-rdma",
        c->base.peer, c->base.describe);
    hs_error("%s", why);
    conn_begin_close(c, HS_ERR_UNSUPPORTED, why, true);
    return false;
}

static ucs_status_t am_frame_cb(void *arg, const void *header, size_t header_length, void *data,
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

static ucs_status_t am_payload_cb(void *arg, const void *header, size_t header_length, void *data,
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
    ucx_op_t *op = op_get(tp, OP_RECV, c);
    if (!op) {
        /* cannot track it, so cannot report it: the connection goes */
        conn_begin_close(c, HS_ERR_NOMEM, "out of memory for a payload receive", false);
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
    ucp_mem_h memh = region_memh(tp, c->pl_dest, length);
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
        conn_begin_close(c, HS_ERR_IO, why, false);
        return UCS_OK;
    }
    return UCS_INPROGRESS;
}

static ucs_status_t am_close_cb(void *arg, const void *header, size_t header_length, void *data,
                                size_t length, const ucp_am_recv_param_t *param)
{
    ucx_tp_t *tp = arg;
    ucx_conn_t *c = conn_by_ep(tp, param);
    if (!c || c->closing) return UCS_OK;
    char why[160];
    snprintf(why, sizeof why, "peer %s closed the connection", c->base.peer);
    conn_begin_close(c, HS_ERR_CLOSED, why, false);
    return UCS_OK;
}

static hs_status_t ucx_recv_payload(hs_tp_conn_t *conn, void *dest, uint64_t bytes, uint64_t cookie)
{
    ucx_conn_t *c = conn_of(conn); /* transport.c checked the call and the size */
    (void)bytes;
    c->pl_dest = dest;
    c->pl_cookie = cookie;
    return HS_OK;
}

/* ---- sending -------------------------------------------------------------- */

static hs_status_t ucx_send(hs_tp_conn_t *conn, const void *frame, size_t frame_len)
{
    ucx_conn_t *c = conn_of(conn);
    if (c->closing) return HS_ERR_CLOSED;
    return send_am(c, AM_FRAME, frame, frame_len);
}

static hs_status_t ucx_send_payload(hs_tp_conn_t *conn, const void *frame, size_t frame_len,
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
    ucx_op_t *op = op_get(tp, OP_SEND_PAYLOAD, c);
    if (!op) return HS_ERR_NOMEM;
    if (op_set_frame(op, frame, frame_len) != HS_OK) {
        op_put(tp, op);
        return HS_ERR_NOMEM;
    }
    op->cb = cb;
    op->cb_arg = cb_arg;
    ucp_request_param_t prm = {
        .op_attr_mask =
            UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_FLAGS,
        .flags = UCP_AM_SEND_FLAG_REPLY,
        .cb.send = send_cb,
        .user_data = op,
    };
    ucp_mem_h memh = region_memh(tp, payload, payload_len);
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
        op_put(tp, op);
        hs_error("ucx payload send to %s failed: %s", c->base.peer,
                 ucs_status_string(UCS_PTR_STATUS(r)));
        return HS_ERR_IO;
    }
    return HS_OK;
}

static void ucx_close(hs_tp_conn_t *conn, hs_status_t reason)
{
    ucx_conn_t *c = conn_of(conn);
    char why[96];
    snprintf(why, sizeof why, "closed by this side (%s)", hs_status_str(reason));
    conn_begin_close(c, reason, why, true);
}

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
 * (Without a secret a loopback peer is trusted: its address goes to UCX as
 * it came, so on a shared host use a secret.) A refused peer gets a REFUSE
 * record saying why. Every length is checked
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

static ucs_status_t ep_create_to(ucx_tp_t *tp, ucx_conn_t *c, const void *addr)
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

static void pending_rec_reset(ucx_pending_t *p)
{
    if (p->rec != p->small) free(p->rec);
    p->rec = p->small;
    p->want = p->got = 0;
}

static void pending_free(ucx_tp_t *tp, ucx_pending_t *p)
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
    pending_free(tp, p);
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
        pending_free(tp, p);
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
        hs_auth_consumer_mac(key, client_nonce, p->server_nonce, mac);
    }
    tp->base.boot_passed++;
    hs_debug("ucx bootstrap: %s passed (%s); creating its endpoint", p->name,
             key                         ? "shared secret"
             : tp->base.cfg.allow_remote ? "insecure"
                                         : "loopback");
    ucx_conn_t *c = conn_alloc(tp);
    if (!c) {
        pending_drop(tp, p, "out of memory");
        return;
    }
    hs__tp_conn_set_peer(&c->base, (struct sockaddr *)&p->peer, p->peer_len);
    ucs_status_t us = ep_create_to(tp, c, m->addr);
    if (us != UCS_OK) {
        char why[160];
        snprintf(why, sizeof why, "cannot reach its UCX worker: %s", ucs_status_string(us));
        free(c);
        pending_drop(tp, p, why);
        return;
    }
    c->connected = true;
    conn_link(tp, c);
    uint8_t head[HS__UCX_BOOT_HEAD];
    hs__ucx_boot_head_pack(head, HS__UCX_BOOT_ACCEPT, (uint32_t)(sizeof mac + tp->my_addr_len));
    struct iovec iov[3] = {{head, sizeof head}, {mac, sizeof mac}, {tp->my_addr, tp->my_addr_len}};
    bool sent = pending_send(p, iov, 3);
    pending_free(tp, p);
    tp->activity++;
    if (!sent) {
        /* the user never saw it: close without on_close */
        c->announced = false;
        conn_begin_close(c, HS_ERR_IO, "could not answer the UCX bootstrap", false);
        return;
    }
    c->announced = true;
    hs_debug("accepted ucx connection from %s", c->base.peer);
    hs_status_t s = tp->base.cb.on_accept(tp->base.arg, &c->base);
    if (s != HS_OK) conn_begin_close(c, s, "connection refused by this side", true);
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
        pending_free(tp, p);
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
static hs_status_t sockets_poll(ucx_tp_t *tp, int ms, bool with_efd)
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
            pending_free(tp, p);
        else
            pending_drop(tp, p, "no complete UCX bootstrap within 10 s");
    }
    if (pf != stack) free(pf);
    if (ps != pstack) free(ps);
    return st;
}

static hs_status_t ucx_listen(hs_tp_t *t, const char *host, uint16_t port, uint16_t *bound_port)
{
    ucx_tp_t *tp = tp_of(t);
    int fd;
    hs_status_t st = hs__sock_listen("ucx transport", host, port, NULL, NULL, &fd, bound_port);
    if (st != HS_OK) return st;
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

/* Waits for the worker up to ms without spinning. */
static void worker_wait(ucx_tp_t *tp, int ms)
{
    if (ucp_worker_progress(tp->worker)) return;
    if (ucp_worker_arm(tp->worker) == UCS_ERR_BUSY) return;
    struct pollfd p = {.fd = tp->efd, .events = POLLIN};
    (void)poll(&p, 1, ms);
}

static void worker_drain(ucx_tp_t *tp)
{
    for (int i = 0; i < 4096 && ucp_worker_progress(tp->worker); i++) {
    }
}

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
    if (key) hs_auth_producer_mac(key, server_nonce, client_nonce, hello, sizeof hello, mac);
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
        hs_auth_consumer_mac(key, client_nonce, server_nonce, expect);
        if (hs_auth_verify(m.mac, expect) != HS_OK) {
            snprintf(last, lastcap,
                     "the consumer could not prove it holds the shared secret: wrong peer or a "
                     "different --secret-file");
            st = HS_ERR_AUTH;
            goto out;
        }
    }
    uint8_t *addr = malloc(m.addr_len);
    if (!addr) {
        st = HS_ERR_NOMEM;
        goto out;
    }
    memcpy(addr, m.addr, m.addr_len);
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

/* Tears down an endpoint the user never saw (no on_close). */
static void conn_discard(ucx_tp_t *tp, ucx_conn_t *c)
{
    if (!c->closing) {
        c->closing = true;
        tp->n_closing++;
    }
    if (!c->ep_closed) conn_force_close(c);
    uint64_t until = hs_now_ns() + 2000000000ull;
    while ((!c->close_done || c->n_ops > 0) && hs_now_ns() < until) {
        worker_wait(tp, 10);
        worker_drain(tp);
        for (ucx_op_t **pp = &tp->done_head; *pp;) {
            ucx_op_t *o = *pp;
            if (o->conn == c) {
                if (o->kind == OP_CLOSE) c->close_done = true;
                *pp = o->dnext;
                if (tp->done_tail == o) {
                    tp->done_tail = NULL;
                    for (ucx_op_t *x = tp->done_head; x; x = x->dnext)
                        tp->done_tail = x;
                }
                op_put(tp, o);
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
    conn_unlink(tp, c);
    free(c);
}

static hs_status_t ucx_connect(hs_tp_t *t, const char *host, uint16_t port, int timeout_ms,
                               hs_tp_conn_t **out)
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
        c = conn_alloc(tp);
        if (!c) {
            free(peer_addr);
            st = HS_ERR_NOMEM;
            break;
        }
        hs__tp_conn_set_peer(&c->base, used->ai_addr, used->ai_addrlen);
        ucs_status_t us = ep_create_to(tp, c, peer_addr);
        free(peer_addr);
        if (us != UCS_OK) {
            snprintf(last, sizeof last, "cannot reach the consumer's UCX worker: %s",
                     ucs_status_string(us));
            free(c);
            c = NULL;
            st = HS_ERR_IO;
            break;
        }
        conn_link(tp, c);
        /* the flush completes once wireup is done, or fails */
        ucx_op_t *op = op_get(tp, OP_FLUSH, c);
        ucp_request_param_t prm = {
            .op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA,
            .cb.send = send_cb,
            .user_data = op,
        };
        ucs_status_ptr_t r = op ? ucp_ep_flush_nbx(c->ep, &prm) : NULL;
        if (op && (r == NULL || UCS_PTR_IS_ERR(r))) {
            if (UCS_PTR_IS_ERR(r)) c->failed = true;
            c->flushed = !UCS_PTR_IS_ERR(r);
            op_put(tp, op);
        }
        while (!c->flushed && !c->failed && hs_now_ns() < deadline) {
            worker_wait(tp, 10);
            worker_drain(tp);
            /* only the transport's own ops may complete here */
            for (ucx_op_t **pp = &tp->done_head; *pp;) {
                ucx_op_t *o = *pp;
                if (o->conn == c && o->kind == OP_FLUSH) {
                    if (o->status == UCS_OK)
                        c->flushed = true;
                    else
                        c->failed = true;
                    *pp = o->dnext;
                    if (tp->done_tail == o) {
                        tp->done_tail = NULL;
                        for (ucx_op_t *x = tp->done_head; x; x = x->dnext)
                            tp->done_tail = x;
                    }
                    op_put(tp, o);
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
            hs_error("cannot connect with UCX to %s port %u: %s; is the consumer running and "
                     "reachable?",
                     host, port, last);
        return st;
    }
    c->connected = true;
    c->announced = true;
    conn_refresh_describe(c);
    hs_info("connected to %s: %s", c->base.peer, c->base.describe);
    c->lanes_checked = true;
    if (tp->base.cfg.require_rdma && !describe_has_rdma(c->base.describe)) {
        hs_error("RDMA is required but UCX connects to %s over '%s' (no rc/dc/ud verbs lane): "
                 "check the RDMA NIC, its link and UCX_NET_DEVICES/UCX_TLS, or run without "
                 "--require-rdma",
                 c->base.peer, c->base.describe);
        (void)send_am(c, AM_CLOSE, NULL, 0);
        tp->in_progress = true;
        conn_discard(tp, c);
        tp->in_progress = false;
        return HS_ERR_UNSUPPORTED;
    }
    *out = &c->base;
    return HS_OK;
}

/* ---- loop ----------------------------------------------------------------- */

static void step(ucx_tp_t *tp)
{
    worker_drain(tp);
    process_done(tp);
    advance_closes(tp);
    process_done(tp);
}

static hs_status_t ucx_progress(hs_tp_t *t, int timeout_ms)
{
    ucx_tp_t *tp = tp_of(t);
    if (tp->in_progress) {
        hs_error("hs_tp_progress called from inside a transport callback");
        return HS_ERR_BUSY;
    }
    tp->in_progress = true;
    uint64_t a0 = tp->activity;
    step(tp);
    bool woken = __atomic_exchange_n(&tp->wake_pending, 0, __ATOMIC_ACQ_REL) != 0;
    hs_status_t st = sockets_poll(tp, 0, false);
    if (st == HS_OK && tp->activity == a0 && timeout_ms != 0 && !woken) {
        int ms = timeout_ms;
        if (tp->n_closing > 0 && (ms < 0 || ms > UCX_CLOSING_POLL_MS)) ms = UCX_CLOSING_POLL_MS;
        if (ucp_worker_arm(tp->worker) == UCS_OK) st = sockets_poll(tp, ms, true);
        step(tp);
        __atomic_store_n(&tp->wake_pending, 0, __ATOMIC_RELEASE);
    }
    tp->in_progress = false;
    return st;
}

static void ucx_wakeup(hs_tp_t *t)
{
    ucx_tp_t *tp = tp_of(t);
    __atomic_store_n(&tp->wake_pending, 1, __ATOMIC_RELEASE);
    (void)ucp_worker_signal(tp->worker);
}

static hs_status_t ucx_mem_register(hs_tp_t *t, void *addr, size_t len)
{
    ucx_tp_t *tp = tp_of(t);
    if (tp->n_regions == tp->cap_regions) {
        size_t ncap = tp->cap_regions ? tp->cap_regions * 2 : 8;
        ucx_region_t *n = realloc(tp->regions, ncap * sizeof *n);
        if (!n) return HS_ERR_NOMEM;
        tp->regions = n;
        tp->cap_regions = ncap;
    }
    ucp_mem_map_params_t p = {
        .field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH,
        .address = addr,
        .length = len,
    };
    ucp_mem_h memh;
    ucs_status_t st = ucp_mem_map(tp->ctx, &p, &memh);
    if (st != UCS_OK) {
        hs_error("ucp_mem_map of %zu bytes at %p failed: %s (locked-memory limit? see ulimit -l)",
                 len, addr, ucs_status_string(st));
        return HS_ERR_IO;
    }
    tp->regions[tp->n_regions++] = (ucx_region_t){addr, len, memh};
    hs_debug("ucx: registered %zu bytes at %p", len, addr);
    return HS_OK;
}

/* ---- life cycle ----------------------------------------------------------- */

static hs_status_t ucx_create(const hs_tp_config_t *cfg, hs_tp_t **out)
{
    ucx_tp_t *tp = calloc(1, sizeof *tp);
    if (!tp) return HS_ERR_NOMEM;
    tp->efd = -1;
    const char *mh = getenv("HS_UCX_MEMH");
    tp->use_memh = !(mh && strcmp(mh, "0") == 0);
    ucp_config_t *config = NULL;
    ucs_status_t st = ucp_config_read(NULL, NULL, &config); /* honours UCX_* variables */
    if (st != UCS_OK) {
        hs_error("reading the UCX configuration failed: %s; check the UCX_* environment variables",
                 ucs_status_string(st));
        goto err_tp;
    }
    if (cfg->net_devices && cfg->net_devices[0]) {
        if (getenv("UCX_NET_DEVICES"))
            hs_warn("net devices '%s' given: overriding UCX_NET_DEVICES='%s'", cfg->net_devices,
                    getenv("UCX_NET_DEVICES"));
        st = ucp_config_modify(config, "NET_DEVICES", cfg->net_devices);
        if (st != UCS_OK) {
            hs_error("UCX rejects net devices '%s': %s; give a list such as mlx5_0:1,eth0",
                     cfg->net_devices, ucs_status_string(st));
            goto err_config;
        }
    }
    if (!getenv("UCX_KEEPALIVE_INTERVAL")) {
        /* a few probes within the peer timeout */
        char v[32];
        uint32_t ms = cfg->peer_timeout_s * 1000u / 3u;
        snprintf(v, sizeof v, "%ums", ms ? ms : 1u);
        (void)ucp_config_modify(config, "KEEPALIVE_INTERVAL", v);
    }
    ucp_params_t params = {
        .field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_NAME,
        .features = UCP_FEATURE_AM | UCP_FEATURE_WAKEUP,
        .name = "hsflow",
    };
    st = ucp_init(&params, config, &tp->ctx);
    if (st != UCS_OK) {
        hs_error("ucp_init failed: %s; check the UCX installation and UCX_* variables",
                 ucs_status_string(st));
        goto err_config;
    }
    ucp_config_release(config);
    config = NULL;
    ucp_worker_params_t wp = {
        .field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE,
        .thread_mode = UCS_THREAD_MODE_SINGLE,
    };
    st = ucp_worker_create(tp->ctx, &wp, &tp->worker);
    if (st != UCS_OK) {
        hs_error("ucp_worker_create failed: %s", ucs_status_string(st));
        goto err_ctx;
    }
    st = ucp_worker_get_efd(tp->worker, &tp->efd);
    if (st != UCS_OK) {
        hs_error("ucp_worker_get_efd failed: %s", ucs_status_string(st));
        goto err_worker;
    }
    st = ucp_worker_get_address(tp->worker, &tp->my_addr, &tp->my_addr_len);
    if (st != UCS_OK) {
        hs_error("ucp_worker_get_address failed: %s", ucs_status_string(st));
        goto err_worker;
    }
    ucp_worker_attr_t wa = {.field_mask = UCP_WORKER_ATTR_FIELD_MAX_AM_HEADER};
    tp->max_am_header = ucp_worker_query(tp->worker, &wa) == UCS_OK ? wa.max_am_header : 0;
    static const unsigned ids[] = {AM_FRAME, AM_PAYLOAD, AM_CLOSE};
    ucp_am_recv_callback_t cbs[] = {am_frame_cb, am_payload_cb, am_close_cb};
    for (int i = 0; i < 3; i++) {
        ucp_am_handler_param_t hp = {
            .field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_FLAGS |
                          UCP_AM_HANDLER_PARAM_FIELD_CB | UCP_AM_HANDLER_PARAM_FIELD_ARG,
            .id = ids[i],
            .flags = UCP_AM_FLAG_WHOLE_MSG,
            .cb = cbs[i],
            .arg = tp,
        };
        st = ucp_worker_set_am_recv_handler(tp->worker, &hp);
        if (st != UCS_OK) {
            hs_error("registering UCX active message handler %u failed: %s", ids[i],
                     ucs_status_string(st));
            goto err_worker;
        }
    }
    *out = &tp->base;
    return HS_OK;

err_worker:
    if (tp->my_addr) ucp_worker_release_address(tp->worker, tp->my_addr);
    ucp_worker_destroy(tp->worker);
err_ctx:
    ucp_cleanup(tp->ctx);
err_config:
    if (config) ucp_config_release(config);
err_tp:
    free(tp);
    return HS_ERR_IO;
}

static void ucx_destroy(hs_tp_t *t)
{
    ucx_tp_t *tp = tp_of(t);
    tp->in_progress = true;
    tp->destroying = true;
    uint64_t now = hs_now_ns();
    for (ucx_conn_t *c = tp->conns; c; c = c->next) {
        conn_begin_close(c, HS_ERR_CLOSED, "transport destroyed", true);
        /* short linger: the close message and what is queued, then go */
        uint64_t d = now + 500000000ull;
        if (c->linger_deadline_ns > d) c->linger_deadline_ns = d;
    }
    while (tp->conns) {
        step(tp);
        if (tp->conns) worker_wait(tp, UCX_CLOSING_POLL_MS);
    }
    process_done(tp);
    while (tp->pending)
        pending_free(tp, tp->pending);
    for (size_t i = 0; i < tp->n_lfds; i++)
        close(tp->lfds[i]);
    free(tp->lfds);
    free(tp->lfd_resume_ns);
    ucp_worker_release_address(tp->worker, tp->my_addr);
    for (size_t i = 0; i < tp->n_regions; i++)
        ucp_mem_unmap(tp->ctx, tp->regions[i].memh);
    free(tp->regions);
    ucp_worker_destroy(tp->worker);
    ucp_cleanup(tp->ctx);
    while (tp->free_ops) {
        ucx_op_t *op = tp->free_ops;
        tp->free_ops = op->dnext;
        free(op->heap_frame);
        free(op);
    }
    free(tp);
}

const hs_tp_ops_t hs__tp_ucx_ops = {
    .name = "ucx",
    .create = ucx_create,
    .destroy = ucx_destroy,
    .listen = ucx_listen,
    .connect = ucx_connect,
    .send = ucx_send,
    .send_payload = ucx_send_payload,
    .recv_payload = ucx_recv_payload,
    .close = ucx_close,
    .progress = ucx_progress,
    .wakeup = ucx_wakeup,
    .mem_register = ucx_mem_register,
    .describe = ucx_describe,
};
