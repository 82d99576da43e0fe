/* SPDX-License-Identifier: Apache-2.0 */
/* ucx.c - the UCX transport (UCX 1.13 UCP active messages): its life cycle,
 * the progress loop and the description of an endpoint. The parts:
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

/* ---- endpoint description ---------------------------------------------- */

/* A one-line summary of ucp_ep_print_info(), e.g.
 *   "ucx: tcp/lo[am,bw] tcp/eth0[bw] cm=rdmacm rndv>=8192"
 * from lines such as
 *   lane[1]:  1:tcp/lo.0 md[1] -> md[1]/tcp/sysdev[255] rma_bw#0 am am_bw#0 wireup
 *   am_send: 0..<egr/short>..8185..<egr/zcopy>..8192..<rndv>..(inf)
 * The whole text is logged at trace level. */
void hs__ucx_conn_refresh_describe(ucx_conn_t *c)
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
    c->lanes_known = true;
    c->memh_lanes = n <= 4 || hs__ucx_describe_has_rdma(out); /* unread lanes: as if RDMA */
}

bool hs__ucx_describe_has_rdma(const char *d)
{
    /* rc_verbs, rc_mlx5, dc_mlx5, ud_verbs, ud_mlx5 (not "cm=rdmacm") */
    static const char *tls[] = {" rc_", " dc_", " ud_", " rc/", " dc/", " ud/"};
    for (size_t i = 0; i < sizeof tls / sizeof tls[0]; i++)
        if (strstr(d, tls[i])) return true;
    return false;
}

static void ucx_describe(hs_tp_conn_t *conn)
{
    hs__ucx_conn_refresh_describe(conn_of(conn));
}

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

hs_status_t hs__ucx_peer_addr(ucx_tp_t *tp, const uint8_t *addr, size_t len, uint8_t **out,
                              char *why, size_t whycap)
{
    uint8_t *buf = calloc(1, len + HS__UCX_ADDR_PAD);
    if (!buf) {
        snprintf(why, whycap, "out of memory for a %zu-byte UCX worker address", len);
        return HS_ERR_NOMEM;
    }
    size_t n = 0;
    hs_status_t st = hs__ucx_addr_filter(addr, len, tp->my_parsed, buf, &n, why, whycap);
    if (st != HS_OK) {
        free(buf);
        return st;
    }
    *out = buf;
    return HS_OK;
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
    tp->efd = -1;
    tp->use_memh = !cfg->ucx_no_memh;
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
    {
        char why[256];
        tp->my_parsed = malloc(sizeof *tp->my_parsed);
        if (!tp->my_parsed) goto err_worker;
        if (hs__ucx_addr_parse((const uint8_t *)tp->my_addr, tp->my_addr_len, tp->my_parsed, why,
                               sizeof why) != HS_OK) {
            /* peers' addresses could not be checked: none would be safe */
            hs_error("this UCX packs its own worker address in a layout hsflow does not know (%s): "
                     "hsflow checks peers' addresses in UCX 1.13's layout, without "
                     "UCX_UNIFIED_MODE; use UCX 1.13 or --transport tcp",
                     why);
            goto err_worker;
        }
    }
    ucp_worker_attr_t wa = {.field_mask = UCP_WORKER_ATTR_FIELD_MAX_AM_HEADER};
    tp->max_am_header = ucp_worker_query(tp->worker, &wa) == UCS_OK ? wa.max_am_header : 0;
    static const unsigned ids[] = {AM_FRAME, AM_PAYLOAD, AM_CLOSE};
    ucp_am_recv_callback_t cbs[] = {hs__ucx_am_frame_cb, hs__ucx_am_payload_cb,
                                    hs__ucx_am_close_cb};
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
    free(tp->my_parsed);
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
    ucp_worker_release_address(tp->worker, tp->my_addr);
    free(tp->my_parsed);
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
