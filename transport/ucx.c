/* SPDX-License-Identifier: Apache-2.0 */
/* ucx.c - the UCX transport (UCX 1.13 UCP active messages): its life cycle
 * and the progress loop. The parts:
 *   ucx_ctx.c          the UCX context and worker, the devices UCX may use
 *   ucx_describe.c     what an endpoint runs over, in one line
 *   ucx_data.c         operations, connections, sending, receiving, closing
 *   ucx_boot_server.c  the bootstrap's listening side (accept, HELLO, AUTH)
 *   ucx_boot_client.c  the bootstrap's connecting side (hs_tp_connect)
 *   ucx_mem.c          memory registration
 * and ucx_int.h, what they share.
 *
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

#include "ucx_int.h"
#include "hs_log.h"
#include "hs_time.h"

#include <assert.h>
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

static void ucx_describe(hs_tp_conn_t *conn) { hs__ucx_conn_refresh_describe(conn_of(conn)); }

/* Waits for the worker up to ms without spinning. */
void hs__ucx_worker_wait(ucx_tp_t *tp, int ms)
{
    if (ucp_worker_progress(tp->worker)) return;
    if (ucp_worker_arm(tp->worker) == UCS_ERR_BUSY) return;
    struct pollfd p = {.fd = tp->efd, .events = POLLIN};
    (void)poll(&p, 1, ms);
}

void hs__ucx_worker_drain(ucx_tp_t *tp)
{
    for (int i = 0; i < 4096 && ucp_worker_progress(tp->worker); i++) {
    }
}

/* ---- loop ----------------------------------------------------------------- */

static void step(ucx_tp_t *tp)
{
    hs__ucx_worker_drain(tp);
    hs__ucx_process_done(tp);
    hs__ucx_advance_closes(tp);
    hs__ucx_process_done(tp);
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
    hs_status_t st = hs__ucx_sockets_poll(tp, 0, false);
    if (st == HS_OK && tp->activity == a0 && timeout_ms != 0 && !woken) {
        int ms = timeout_ms;
        if (tp->n_closing > 0 && (ms < 0 || ms > UCX_CLOSING_POLL_MS)) ms = UCX_CLOSING_POLL_MS;
        if (ucp_worker_arm(tp->worker) == UCS_OK) st = hs__ucx_sockets_poll(tp, ms, true);
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

/* ---- life cycle ----------------------------------------------------------- */

static hs_status_t ucx_create(const hs_tp_config_t *cfg, hs_tp_t **out)
{
    ucx_tp_t *tp = calloc(1, sizeof *tp);
    if (!tp) return HS_ERR_NOMEM;
    tp->base.cfg = *cfg;
    tp->use_memh = !cfg->ucx_no_memh;
    const char *nd = cfg->net_devices && cfg->net_devices[0] ? cfg->net_devices : NULL;
    if (nd && getenv("UCX_NET_DEVICES"))
        hs_warn("net devices '%s' given: overriding UCX_NET_DEVICES='%s'", nd,
                getenv("UCX_NET_DEVICES"));
    tp->devices_chosen = nd || getenv("UCX_NET_DEVICES");
    if (hs__ucx_ctx_open(tp, nd) != HS_OK) {
        free(tp);
        return HS_ERR_IO;
    }
    *out = &tp->base;
    return HS_OK;
}

static void ucx_destroy(hs_tp_t *t)
{
    ucx_tp_t *tp = tp_of(t);
    tp->in_progress = true;
    tp->destroying = true;
    uint64_t now = hs_now_ns();
    for (ucx_conn_t *c = tp->conns; c; c = c->next) {
        hs__ucx_conn_begin_close(c, HS_ERR_CLOSED, "transport destroyed", true);
        /* short linger: the close message and what is queued, then go */
        uint64_t d = now + 500000000ull;
        if (c->linger_deadline_ns > d) c->linger_deadline_ns = d;
    }
    while (tp->conns) {
        step(tp);
        if (tp->conns) hs__ucx_worker_wait(tp, UCX_CLOSING_POLL_MS);
    }
    hs__ucx_process_done(tp);
    while (tp->pending)
        hs__ucx_pending_free(tp, tp->pending);
    for (size_t i = 0; i < tp->n_lfds; i++)
        close(tp->lfds[i]);
    free(tp->lfds);
    free(tp->lfd_resume_ns);
    hs__ucx_ctx_close(tp);
    free(tp->regions);
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
    .listen = hs__ucx_listen,
    .connect = hs__ucx_connect,
    .send = hs__ucx_send,
    .send_payload = hs__ucx_send_payload,
    .recv_payload = hs__ucx_recv_payload,
    .close = hs__ucx_close,
    .progress = ucx_progress,
    .wakeup = ucx_wakeup,
    .mem_register = hs__ucx_mem_register,
    .describe = ucx_describe,
};
