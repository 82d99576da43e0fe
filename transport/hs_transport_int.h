/* SPDX-License-Identifier: Apache-2.0 */
/* hs_transport_int.h - the private interface between transport.c (the public
 * hs_tp_* entry points) and each backend (tcp.c, ucx.c).
 *
 * A backend allocates its own transport and connection objects, each with
 * the common part (hs_tp_t / hs_tp_conn_t below) as its first member, and
 * fills one hs_tp_ops_t. transport.c checks arguments that do not depend on
 * the backend, then dispatches. Ownership rules are those of hs_transport.h.
 */
#ifndef HS_TRANSPORT_INT_H
#define HS_TRANSPORT_INT_H

#include <sys/socket.h>

#include "hs_proto.h"
#include "hs_transport.h"

#ifdef __cplusplus
extern "C" {
#endif

#define HS__TP_PEER_CAP 64      /* "[ffff:...:ffff]:65535" fits */
#define HS__TP_DESCRIBE_CAP 256 /* hs_tp_conn_describe() text */

typedef struct hs_tp_ops hs_tp_ops_t;

/* Fault injection for tests (fault.c, hs_tp_config_t.fault): wraps the
 * callbacks when `spec` names a fault, else leaves them and sets *out NULL. */
typedef struct hs__tp_fault hs__tp_fault_t;
HS_MUST_CHECK hs_status_t hs__tp_fault_wrap(const char *spec, hs_tp_callbacks_t *cb, void **arg,
                                            hs__tp_fault_t **out);
void hs__tp_fault_note_recv(hs__tp_fault_t *f, hs_tp_conn_t *conn, void *dest, uint64_t bytes,
                            uint64_t cookie);
void hs__tp_fault_free(hs__tp_fault_t *f);

/* Common head of every backend's transport object. */
struct hs_tp {
    const hs_tp_ops_t *ops;
    /* defaults filled in; cfg.net_devices points at net_devices, cfg.auth_key
     * at key (or is NULL) */
    hs_tp_config_t cfg;
    hs_tp_callbacks_t cb;
    void *arg;
    char *net_devices;     /* owned copy of cfg->net_devices, or NULL */
    hs_auth_key_t key;     /* copy of *cfg->auth_key, wiped at destroy */
    hs__tp_fault_t *fault; /* cfg.fault in effect, or NULL */
    /* Tests only: loopback peers count as remote for the loopback rule, so
     * that it can be tested on one host. */
    bool loopback_is_remote;
    /* UCX bootstrap: peers that proved themselves (their worker address went
     * to UCX) and peers refused before that; for tests and the logs. */
    uint64_t boot_passed, boot_refused;
    /* Memory registration, for tests and the logs: hs_tp_mem_register()
     * calls that succeeded, and payloads that moved from or into memory no
     * registration holds whole (UCX then registers it on the fly, on the
     * data path: slower; rendezvous receives and every payload send). */
    uint64_t mem_registrations, payloads_unregistered;
    uint64_t payloads_with_memh; /* UCX: payloads that went with their memory handle */
    /* Shared memory (shm_int.h), for tests and the logs: segments mapped
     * from peers, peers and messages refused, payloads copied out of a
     * segment and payloads that came over the socket instead. */
    uint64_t shm_mapped, shm_refused, shm_ring_payloads, shm_plain_payloads;
    /* Listeners pause after a failed accept (hs__tp_accept_failed). */
    uint64_t accept_refused, accept_last_log_ns;
    /* Payload memory hs_tp_mem_alloc() took from the heap (where the backend
     * has no memory of its own to give): freed by hs_tp_mem_free() or, after
     * the backend's destroy has run the last send callbacks, by
     * hs_tp_destroy(). */
    void **heap_mem;
    uint32_t n_heap_mem, cap_heap_mem;
};

/* Common head of every backend's connection object. */
struct hs_tp_conn {
    hs_tp_t *tp;
    void *user;
    struct sockaddr_storage peer_addr; /* ss_family AF_UNSPEC when unknown */
    char peer[HS__TP_PEER_CAP];
    char describe[HS__TP_DESCRIBE_CAP];
    /* The payload offered by the frame being delivered (hs__tp_deliver_frame):
     * its size, 0 outside such an on_frame(), and whether it was accepted. */
    uint64_t offer_bytes;
    bool offer_accepted;
    /* Largest frame body accepted from the peer now (hs_tp_conn_set_max_frame);
     * the backend sets it to cfg.max_frame_body when it creates the
     * connection and checks every incoming frame header against it. */
    uint32_t max_frame_body;
    /* Payload bytes received so far, when the backend sees them arrive
     * (payload_bytes_counted; hs_tp_conn_payload_bytes_in). */
    uint64_t payload_bytes_in;
    bool payload_bytes_counted;
    /* The owner vouched for the peer (hs_tp_conn_set_trusted). */
    bool trusted;
    /* hs_tp_recv_payload_sum: the checksum of dest[sum_from, bytes) is
     * wanted; sum_valid and sum while on_payload runs for a payload whose
     * copy computed it (shared memory). */
    bool sum_wanted, sum_valid;
    uint64_t sum_from, sum;
};

/* Runs on_frame() for a checked frame. When payload_bytes > 0 it returns
 * whether the callee accepted the payload with hs_tp_recv_payload(), which
 * checks, for every backend, that it is called inside this on_frame(), once,
 * with exactly payload_bytes; the backend's recv_payload then only records
 * where the payload goes. */
bool hs__tp_deliver_frame(hs_tp_conn_t *conn, uint16_t type, const uint8_t *body, uint32_t body_len,
                          uint64_t payload_bytes);

/* What a backend provides. Arguments were checked by transport.c: pointers
 * are not NULL, frames passed hs__tp_frame_check(), payload_len > 0. */
struct hs_tp_ops {
    const char *name;
    /* Allocates the backend object (at least sizeof(hs_tp_t), zeroed head is
     * filled by the caller afterwards) and starts its loop. cfg has defaults
     * applied. On failure nothing is left allocated. */
    hs_status_t (*create)(const hs_tp_config_t *cfg, hs_tp_t **out);
    void (*destroy)(hs_tp_t *tp);
    hs_status_t (*listen)(hs_tp_t *tp, const char *host, uint16_t port, uint16_t *bound_port);
    hs_status_t (*connect)(hs_tp_t *tp, const char *host, uint16_t port, int timeout_ms,
                           unsigned flags, hs_tp_conn_t **out);
    hs_status_t (*send)(hs_tp_conn_t *conn, const void *frame, size_t frame_len);
    hs_status_t (*send_payload)(hs_tp_conn_t *conn, const void *frame, size_t frame_len,
                                const void *payload, uint64_t payload_len, hs_tp_send_cb cb,
                                void *cb_arg);
    hs_status_t (*recv_payload)(hs_tp_conn_t *conn, void *dest, uint64_t bytes, uint64_t cookie);
    void (*close)(hs_tp_conn_t *conn, hs_status_t reason);
    hs_status_t (*progress)(hs_tp_t *tp, int timeout_ms);
    void (*wakeup)(hs_tp_t *tp);
    hs_status_t (*mem_register)(hs_tp_t *tp, void *addr, size_t len);
    /* Optional: refreshes conn->describe (what carries it may change after
     * the connection is set up). */
    void (*describe)(hs_tp_conn_t *conn);
    /* Optional: payload memory the backend can share (hs_tp_mem_alloc);
     * NULL = hs_aligned_alloc + mem_register. mem_free takes what mem_alloc
     * gave. */
    hs_status_t (*mem_alloc)(hs_tp_t *tp, size_t len, void **out);
    bool (*mem_free)(hs_tp_t *tp, void *p);
    /* Optional: "tcp", "shm" or "ucx" for one connection; NULL = ops->name. */
    const char *(*conn_kind)(const hs_tp_conn_t *conn);
};

extern const hs_tp_ops_t hs__tp_tcp_ops;
#ifdef HS_HAVE_UCX
extern const hs_tp_ops_t hs__tp_ucx_ops;
#endif

/* ---- helpers shared by the backends (transport.c) ---------------------- */

/* Checks an outgoing frame: at least a header, a header that decodes with
 * `max_body`, and frame_len == header + body_len. The frame's own crc is not
 * recomputed (the receiver checks it). */
HS_MUST_CHECK hs_status_t hs__tp_frame_check(const void *frame, size_t frame_len,
                                             uint32_t max_body);

/* Fills conn->peer_addr and conn->peer ("1.2.3.4:5678", "[::1]:5678"). */
void hs__tp_conn_set_peer(hs_tp_conn_t *conn, const struct sockaddr *sa, socklen_t len);
/* 127.0.0.0/8, ::1 and ::ffff:127.x.x.x. */
bool hs__tp_addr_is_loopback(const struct sockaddr *sa);
/* "1.2.3.4:5678" / "[::1]:5678" into buf[cap]. */
void hs__tp_addr_format(const struct sockaddr *sa, char *buf, size_t cap);

/* A listener's accept() failed with `err` (not EAGAIN, EINTR or
 * ECONNABORTED): typically EMFILE/ENFILE when the descriptor limit is
 * reached, which leaves the listening socket readable, so polling it again
 * at once would spin. The caller stops polling that listener until
 * *resume_ns (HS__TP_ACCEPT_PAUSE_MS from now); the failures are counted
 * and logged at most once per HS__TP_ACCEPT_LOG_MS, with their number. */
#define HS__TP_ACCEPT_PAUSE_MS 200
#define HS__TP_ACCEPT_LOG_MS 2000
void hs__tp_accept_failed(hs_tp_t *tp, int err, uint64_t *resume_ns);

/* The ERROR frame a transport sends before it closes a connection for a
 * protocol error, encoded into buf[cap]; returns its length or 0 when it
 * cannot be built (then the connection is just closed). */
size_t hs__tp_error_frame(hs_status_t code, const char *text, uint8_t *buf, size_t cap);

/* UCX (ucx.c): whether a connection's lanes as hs_tp_conn_describe() gives
 * them ("ucx: rc_mlx5/mlx5_0:1[am,bw] ...") include an RDMA transport (rc,
 * dc or ud verbs; not the rdmacm connection manager). */
bool hs__ucx_describe_has_rdma(const char *d);

#ifdef __cplusplus
}
#endif
#endif /* HS_TRANSPORT_INT_H */
