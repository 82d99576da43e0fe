/* SPDX-License-Identifier: Apache-2.0 */
/* transport.c - the public hs_tp_* entry points: argument checks that do not
 * depend on the backend, dispatch through hs_tp_ops_t, transport kinds, and
 * the helpers the backends share (frame checks, peer addresses, resolving,
 * the ERROR frame). */
#include "hs_transport_int.h"
#include "hs_status.h"
#include "hs_log.h"
#include "hs_time.h"
#include "hs_memory.h"

#include "hs_devices.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

static const hs_tp_ops_t *ops_for_kind(hs_tp_kind_t kind)
{
    switch (kind) {
    case HS_TP_TCP:
    case HS_TP_SHM:
    case HS_TP_AUTO:
        return &hs__tp_tcp_ops;
    case HS_TP_UCX:
#ifdef HS_HAVE_UCX
        return &hs__tp_ucx_ops;
#else
        return NULL;
#endif
    }
    return NULL;
}

/* ---- kinds ---------------------------------------------------------------- */

bool hs_tp_kind_available(hs_tp_kind_t kind) { return ops_for_kind(kind) != NULL; }

const char *hs_tp_kind_str(hs_tp_kind_t kind)
{
    switch (kind) {
    case HS_TP_TCP:
        return "tcp";
    case HS_TP_UCX:
        return "ucx";
    case HS_TP_SHM:
        return "shm";
    case HS_TP_AUTO:
        return "auto";
    }
    return "?";
}

hs_status_t hs_tp_kind_parse(const char *s, hs_tp_kind_t *out)
{
    if (!s || !out) return HS_ERR_INVALID;
    hs_tp_kind_t k;
    if (strcasecmp(s, "tcp") == 0) {
        k = HS_TP_TCP;
    } else if (strcasecmp(s, "ucx") == 0) {
        k = HS_TP_UCX;
        if (!hs_tp_kind_available(k)) {
            hs_error("transport 'ucx' was asked for but this build has no UCX: "
                     "install UCX (libucx-dev) and rebuild, or use --transport tcp");
            return HS_ERR_UNSUPPORTED;
        }
    } else if (strcasecmp(s, "shm") == 0) {
        k = HS_TP_SHM;
    } else if (strcasecmp(s, "auto") == 0) {
        k = HS_TP_AUTO;
    } else {
        hs_error("unknown transport '%s': use auto, shm, ucx or tcp", s);
        return HS_ERR_INVALID;
    }
    *out = k;
    return HS_OK;
}

/* ---- life cycle ----------------------------------------------------------- */

void hs_tp_config_describe(const hs_tp_config_t *cfg, char *buf, size_t cap)
{
    char sockbuf[48];
    if (cfg->tcp_sockbuf == HS_TP_SOCKBUF_AUTOTUNE)
        snprintf(sockbuf, sizeof sockbuf, "autotuned");
    else if (cfg->tcp_sockbuf)
        snprintf(sockbuf, sizeof sockbuf, "%llu bytes", (unsigned long long)cfg->tcp_sockbuf);
    else
        snprintf(sockbuf, sizeof sockbuf, "16 MiB where net.core allows, else autotuned");
    snprintf(buf, cap, "tcp socket buffers %s, ucx memory handles %s, fault %s", sockbuf,
             cfg->ucx_no_memh ? "off" : "on RDMA lanes",
             cfg->fault && *cfg->fault ? cfg->fault : "none");
}

hs_status_t hs_tp_create(const hs_tp_config_t *cfg, const hs_tp_callbacks_t *cb, void *arg,
                         hs_tp_t **out)
{
    if (!cfg || !cb || !out || !cb->on_frame || !cb->on_close) {
        hs_error("hs_tp_create: config, on_frame, on_close and out are required");
        return HS_ERR_INVALID;
    }
    hs_tp_config_t c = *cfg;
    if (c.kind == HS_TP_AUTO && hs_tp_kind_available(HS_TP_UCX) &&
        (c.require_rdma || hs_dev_rdma_count() > 0)) {
        /* RDMA here: UCX, given its RDMA and shared-memory transports only,
         * so it opens no TCP listener of its own (docs/security.md) */
        c.kind = HS_TP_UCX;
        if (!getenv("UCX_TLS")) setenv("UCX_TLS", "^tcp", 0);
        hs_info("transport auto: an RDMA device is present, using UCX (UCX_TLS=%s)",
                getenv("UCX_TLS"));
    } else if (c.kind == HS_TP_UCX && !c.require_rdma && hs_dev_rdma_count() == 0) {
        hs_warn("--transport ucx without an RDMA device: UCX runs over TCP, with listeners of its "
                "own whose idle connections nothing bounds (docs/security.md); --transport auto "
                "uses hsflow's TCP and shared memory instead");
    }
    const hs_tp_ops_t *ops = ops_for_kind(c.kind);
    if (!ops) {
        hs_error("transport '%s' is not built into this hsflow: use tcp, or rebuild with UCX",
                 hs_tp_kind_str(cfg->kind));
        return HS_ERR_UNSUPPORTED;
    }
    if (c.require_rdma && c.kind != HS_TP_UCX) {
        hs_error("RDMA was required but the transport is '%s': use --transport ucx (or auto) "
                 "with --require-rdma",
                 hs_tp_kind_str(c.kind));
        return HS_ERR_UNSUPPORTED;
    }
    if (c.max_frame_body == 0) c.max_frame_body = HS_FRAME_MAX_BODY;
    if (c.max_frame_body > HS_FRAME_MAX_BODY) {
        hs_error("transport max_frame_body %u exceeds the protocol limit %u", c.max_frame_body,
                 HS_FRAME_MAX_BODY);
        return HS_ERR_INVALID;
    }
    if (c.peer_timeout_s == 0) c.peer_timeout_s = 10;
    if (c.tcp_sockbuf > HS_TP_SOCKBUF_MAX && c.tcp_sockbuf != HS_TP_SOCKBUF_AUTOTUNE) {
        hs_error("TCP socket buffer of %llu bytes: give at most 1 GiB, or 0 for autotuning",
                 (unsigned long long)c.tcp_sockbuf);
        return HS_ERR_INVALID;
    }
    c.fault = NULL; /* read once below, not kept */
    char *nd = NULL;
    if (c.net_devices) {
        nd = strdup(c.net_devices);
        if (!nd) return HS_ERR_NOMEM;
        c.net_devices = nd;
    }
    hs_tp_t *tp = NULL;
    hs_status_t st = ops->create(&c, &tp);
    if (st != HS_OK) {
        free(nd);
        return st;
    }
    tp->ops = ops;
    tp->cfg = c;
    tp->cb = *cb;
    tp->arg = arg;
    tp->net_devices = nd;
    if (cfg->auth_key) {
        tp->key = *cfg->auth_key;
        tp->cfg.auth_key = &tp->key;
    }
    st = hs__tp_fault_wrap(cfg->fault, &tp->cb, &tp->arg, &tp->fault);
    if (st != HS_OK) {
        hs_tp_destroy(tp);
        return st;
    }
    *out = tp;
    return HS_OK;
}

void hs_tp_destroy(hs_tp_t *tp)
{
    if (!tp) return;
    char *nd = tp->net_devices;
    hs__tp_fault_t *f = tp->fault;
    void **heap = tp->heap_mem;
    uint32_t n_heap = tp->n_heap_mem;
    hs_auth_key_clear(&tp->key);          /* no handshake runs during destroy */
    tp->ops->destroy(tp);                 /* callbacks may still run through the fault layer */
    for (uint32_t i = 0; i < n_heap; i++) /* no send uses them any more */
        hs_aligned_free(heap[i]);
    free(heap);
    free(nd);
    hs__tp_fault_free(f);
}

hs_status_t hs_tp_listen(hs_tp_t *tp, const char *host, uint16_t port, uint16_t *bound_port)
{
    if (!tp || !host) return HS_ERR_INVALID;
    if (!tp->cb.on_accept) {
        hs_error("hs_tp_listen: the transport was created without an on_accept callback");
        return HS_ERR_INVALID;
    }
    return tp->ops->listen(tp, host, port, bound_port);
}

hs_status_t hs_tp_connect(hs_tp_t *tp, const char *host, uint16_t port, int timeout_ms,
                          hs_tp_conn_t **out)
{
    return hs_tp_connect_flags(tp, host, port, timeout_ms, 0, out);
}

hs_status_t hs_tp_connect_flags(hs_tp_t *tp, const char *host, uint16_t port, int timeout_ms,
                                unsigned flags, hs_tp_conn_t **out)
{
    if (!tp || !host || !out) return HS_ERR_INVALID;
    if (port == 0) {
        hs_error("cannot connect to %s port 0: give the consumer's port", host);
        return HS_ERR_INVALID;
    }
    if (flags & ~(unsigned)HS_TP_CONNECT_QUIET) {
        hs_error("hs_tp_connect_flags: unknown flags 0x%x", flags & ~(unsigned)HS_TP_CONNECT_QUIET);
        return HS_ERR_INVALID;
    }
    return tp->ops->connect(tp, host, port, timeout_ms, flags, out);
}

/* ---- data ----------------------------------------------------------------- */

hs_status_t hs__tp_frame_check(const void *frame, size_t frame_len, uint32_t max_body)
{
    if (!frame || frame_len < HS_FRAME_HEADER_BYTES) {
        hs_error("refusing to send a frame of %zu bytes: a frame has a %u-byte header", frame_len,
                 HS_FRAME_HEADER_BYTES);
        return HS_ERR_INVALID;
    }
    hs_frame_header_t h;
    char why[160];
    if (hs_frame_header_decode(frame, max_body, &h, why, sizeof why) != HS_OK) {
        hs_error("refusing to send a bad frame: %s", why);
        return HS_ERR_INVALID;
    }
    if ((size_t)h.body_len + HS_FRAME_HEADER_BYTES != frame_len) {
        hs_error("refusing to send a %s frame of %zu bytes whose header says %u body bytes",
                 hs_msg_type_str(h.type), frame_len, h.body_len);
        return HS_ERR_INVALID;
    }
    return HS_OK;
}

hs_status_t hs_tp_send(hs_tp_conn_t *conn, const void *frame, size_t frame_len)
{
    if (!conn) return HS_ERR_INVALID;
    hs_status_t st = hs__tp_frame_check(frame, frame_len, conn->tp->cfg.max_frame_body);
    if (st != HS_OK) return st;
    return conn->tp->ops->send(conn, frame, frame_len);
}

hs_status_t hs_tp_send_payload(hs_tp_conn_t *conn, const void *frame, size_t frame_len,
                               const void *payload, uint64_t payload_len, hs_tp_send_cb cb,
                               void *cb_arg)
{
    if (!conn || !payload || payload_len == 0) {
        hs_error("hs_tp_send_payload: a payload of at least one byte is required "
                 "(send a plain frame with hs_tp_send otherwise)");
        return HS_ERR_INVALID;
    }
    hs_status_t st = hs__tp_frame_check(frame, frame_len, conn->tp->cfg.max_frame_body);
    if (st != HS_OK) return st;
    return conn->tp->ops->send_payload(conn, frame, frame_len, payload, payload_len, cb, cb_arg);
}

hs_status_t hs_tp_recv_payload(hs_tp_conn_t *conn, void *dest, uint64_t bytes, uint64_t cookie)
{
    if (!conn || !dest || bytes == 0) return HS_ERR_INVALID;
    if (conn->offer_bytes == 0 || conn->offer_accepted) {
        hs_error("hs_tp_recv_payload on %s outside on_frame() of a frame with a payload, "
                 "or twice for one payload",
                 conn->peer);
        return HS_ERR_INVALID;
    }
    if (bytes != conn->offer_bytes) {
        hs_error("hs_tp_recv_payload on %s for %llu bytes, but %llu bytes follow the frame",
                 conn->peer, (unsigned long long)bytes, (unsigned long long)conn->offer_bytes);
        return HS_ERR_INVALID;
    }
    if (conn->tp->fault) hs__tp_fault_note_recv(conn->tp->fault, conn, dest, bytes, cookie);
    hs_status_t st = conn->tp->ops->recv_payload(conn, dest, bytes, cookie);
    if (st == HS_OK) conn->offer_accepted = true;
    conn->sum_wanted = false;
    return st;
}

hs_status_t hs_tp_recv_payload_sum(hs_tp_conn_t *conn, void *dest, uint64_t bytes, uint64_t cookie,
                                   uint64_t sum_from)
{
    hs_status_t st = hs_tp_recv_payload(conn, dest, bytes, cookie);
    if (st == HS_OK && sum_from <= bytes) {
        conn->sum_wanted = true;
        conn->sum_from = sum_from;
    }
    return st;
}

bool hs_tp_conn_payload_checksum(const hs_tp_conn_t *conn, uint64_t *sum)
{
    if (!conn || !conn->sum_valid) return false;
    *sum = conn->sum;
    return true;
}

bool hs__tp_deliver_frame(hs_tp_conn_t *conn, uint16_t type, const uint8_t *body, uint32_t body_len,
                          uint64_t payload_bytes)
{
    hs_tp_t *tp = conn->tp;
    conn->offer_bytes = payload_bytes;
    conn->offer_accepted = false;
    tp->cb.on_frame(tp->arg, conn, type, body, body_len, payload_bytes);
    bool accepted = conn->offer_accepted;
    conn->offer_bytes = 0;
    conn->offer_accepted = false;
    return accepted;
}

void hs_tp_close(hs_tp_conn_t *conn, hs_status_t reason)
{
    if (!conn) return;
    conn->tp->ops->close(conn, reason);
}

hs_status_t hs_tp_progress(hs_tp_t *tp, int timeout_ms)
{
    if (!tp) return HS_ERR_INVALID;
    return tp->ops->progress(tp, timeout_ms);
}

void hs_tp_wakeup(hs_tp_t *tp)
{
    if (tp) tp->ops->wakeup(tp);
}

hs_status_t hs_tp_mem_alloc(hs_tp_t *tp, size_t len, void **out)
{
    if (!tp || !len || !out) return HS_ERR_INVALID;
    if (tp->ops->mem_alloc) {
        hs_status_t st = tp->ops->mem_alloc(tp, len, out);
        if (st != HS_ERR_UNSUPPORTED) return st;
    }
    if (tp->n_heap_mem == tp->cap_heap_mem) {
        uint32_t cap = tp->cap_heap_mem ? 2 * tp->cap_heap_mem : 16;
        void **grown = realloc(tp->heap_mem, cap * sizeof(*grown));
        if (!grown) return HS_ERR_NOMEM;
        tp->heap_mem = grown;
        tp->cap_heap_mem = cap;
    }
    void *p = hs_aligned_alloc(4096, len);
    if (!p) {
        hs_error("cannot allocate %.1f MiB of payload memory", (double)len / (1 << 20));
        return HS_ERR_NOMEM;
    }
    tp->heap_mem[tp->n_heap_mem++] = p;
    memset(p, 0, len);
    hs_status_t reg = hs_tp_mem_register(tp, p, len);
    if (reg != HS_OK)
        hs_warn("payload memory of %.1f MiB is not registered with the transport (%s); it is "
                "sent all the same, registered per send",
                (double)len / (1 << 20), hs_status_str(reg));
    *out = p;
    return HS_OK;
}

void hs_tp_mem_free(hs_tp_t *tp, void *p)
{
    if (!tp || !p) return;
    if (tp->ops->mem_free && tp->ops->mem_free(tp, p)) return;
    for (uint32_t i = 0; i < tp->n_heap_mem; i++) {
        if (tp->heap_mem[i] == p) {
            tp->heap_mem[i] = tp->heap_mem[--tp->n_heap_mem];
            hs_aligned_free(p);
            return;
        }
    }
    hs_error("hs_tp_mem_free: %p is not payload memory of this transport; not freed", p);
}

hs_tp_kind_t hs_tp_get_kind(const hs_tp_t *tp) { return tp ? tp->cfg.kind : HS_TP_TCP; }

const char *hs_tp_kind_describe(const hs_tp_t *tp)
{
    switch (hs_tp_get_kind(tp)) {
    case HS_TP_AUTO:
        return "auto: shared memory on this host, tcp across hosts";
    case HS_TP_SHM:
        return "shm: producers on this host only";
    default:
        return hs_tp_kind_str(hs_tp_get_kind(tp));
    }
}

hs_status_t hs_tp_mem_register(hs_tp_t *tp, void *addr, size_t len)
{
    if (!tp || !addr || len == 0) return HS_ERR_INVALID;
    hs_status_t st = tp->ops->mem_register(tp, addr, len);
    if (st == HS_OK) tp->mem_registrations++;
    return st;
}

/* ---- connection info ------------------------------------------------------ */

const char *hs_tp_conn_peer(const hs_tp_conn_t *conn) { return conn ? conn->peer : "?"; }

bool hs_tp_conn_is_loopback(const hs_tp_conn_t *conn)
{
    return conn && hs__tp_addr_is_loopback((const struct sockaddr *)&conn->peer_addr);
}

bool hs_tp_conn_payload_bytes_in(const hs_tp_conn_t *conn, uint64_t *bytes)
{
    if (!conn->payload_bytes_counted) return false;
    *bytes = conn->payload_bytes_in;
    return true;
}

const char *hs_tp_conn_kind(const hs_tp_conn_t *conn)
{
    if (!conn) return "?";
    if (conn->tp->ops->conn_kind) return conn->tp->ops->conn_kind(conn);
    return conn->tp->ops->name;
}

void hs_tp_conn_set_trusted(hs_tp_conn_t *conn)
{
    if (conn) conn->trusted = true;
}

const char *hs_tp_conn_describe(const hs_tp_conn_t *conn)
{
    if (!conn) return "?";
    if (conn->tp->ops->describe) conn->tp->ops->describe((hs_tp_conn_t *)conn);
    return conn->describe;
}

hs_status_t hs_tp_conn_set_max_frame(hs_tp_conn_t *conn, uint32_t max_body)
{
    if (!conn) return HS_ERR_INVALID;
    uint32_t full = conn->tp->cfg.max_frame_body;
    if (max_body > full) {
        hs_error("connection %s: a frame limit of %u bytes exceeds the transport's %u", conn->peer,
                 max_body, full);
        return HS_ERR_INVALID;
    }
    conn->max_frame_body = max_body ? max_body : full;
    return HS_OK;
}

void hs_tp_conn_set_user(hs_tp_conn_t *conn, void *user)
{
    if (conn) conn->user = user;
}

void *hs_tp_conn_get_user(const hs_tp_conn_t *conn) { return conn ? conn->user : NULL; }

/* ---- addresses ------------------------------------------------------------ */

bool hs__tp_addr_is_loopback(const struct sockaddr *sa)
{
    if (!sa) return false;
    if (sa->sa_family == AF_UNIX) return true; /* shared memory: this host */
    if (sa->sa_family == AF_INET) {
        const struct sockaddr_in *in = (const struct sockaddr_in *)sa;
        return (ntohl(in->sin_addr.s_addr) >> 24) == 127;
    }
    if (sa->sa_family == AF_INET6) {
        const struct in6_addr *a = &((const struct sockaddr_in6 *)sa)->sin6_addr;
        if (IN6_IS_ADDR_LOOPBACK(a)) return true;
        return IN6_IS_ADDR_V4MAPPED(a) && a->s6_addr[12] == 127;
    }
    return false;
}

void hs__tp_addr_format(const struct sockaddr *sa, char *buf, size_t cap)
{
    char host[INET6_ADDRSTRLEN] = "?";
    if (sa && sa->sa_family == AF_INET) {
        const struct sockaddr_in *in = (const struct sockaddr_in *)sa;
        inet_ntop(AF_INET, &in->sin_addr, host, sizeof host);
        snprintf(buf, cap, "%s:%u", host, ntohs(in->sin_port));
    } else if (sa && sa->sa_family == AF_INET6) {
        const struct sockaddr_in6 *in6 = (const struct sockaddr_in6 *)sa;
        inet_ntop(AF_INET6, &in6->sin6_addr, host, sizeof host);
        snprintf(buf, cap, "[%s]:%u", host, ntohs(in6->sin6_port));
    } else if (sa && sa->sa_family == AF_UNIX) {
        snprintf(buf, cap, "shm");
    } else {
        snprintf(buf, cap, "?");
    }
}

void hs__tp_conn_set_peer(hs_tp_conn_t *conn, const struct sockaddr *sa, socklen_t len)
{
    memset(&conn->peer_addr, 0, sizeof conn->peer_addr);
    if (sa && len > 0 && (size_t)len <= sizeof conn->peer_addr) memcpy(&conn->peer_addr, sa, len);
    hs__tp_addr_format((const struct sockaddr *)&conn->peer_addr, conn->peer, sizeof conn->peer);
}

/* ---- listeners ----------------------------------------------------------- */

void hs__tp_accept_failed(hs_tp_t *tp, int err, uint64_t *resume_ns)
{
    uint64_t now = hs_now_ns();
    tp->accept_refused++;
    *resume_ns = now + (uint64_t)HS__TP_ACCEPT_PAUSE_MS * 1000000u;
    if (tp->accept_last_log_ns && now - tp->accept_last_log_ns < HS__TP_ACCEPT_LOG_MS * 1000000ull)
        return;
    const char *hint = err == EMFILE || err == ENFILE
                           ? "the open-file limit is reached: raise ulimit -n, or lower the number "
                             "of connections"
                           : "check the system's socket limits";
    hs_warn("cannot accept connections: %s; %llu accept(s) failed%s, pausing each for %d ms; %s",
            strerror(err), (unsigned long long)tp->accept_refused,
            tp->accept_last_log_ns ? " since the last report" : "", HS__TP_ACCEPT_PAUSE_MS, hint);
    tp->accept_refused = 0;
    tp->accept_last_log_ns = now;
}

/* ---- ERROR frame ---------------------------------------------------------- */

size_t hs__tp_error_frame(hs_status_t code, const char *text, uint8_t *buf, size_t cap)
{
    size_t len = 0;
    if (hs_msg_error_frame(code, text, buf, cap, &len) != HS_OK) return 0;
    return len;
}
