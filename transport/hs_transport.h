/* SPDX-License-Identifier: Apache-2.0 */
/* hs_transport.h - the one interface every transport implements (TCP here,
 * UCX in transport/ucx.c, a fault injector for tests).
 *
 * Model: a transport instance owns one event loop, driven by
 * hs_tp_progress() from a single thread (the "loop thread"). Every callback
 * runs on that thread, inside hs_tp_progress(). All other hs_tp_* calls must
 * be made from the loop thread too, except hs_tp_wakeup(), which any thread
 * may call to make a blocked hs_tp_progress() return early.
 *
 * Messages are complete control frames (hs_proto.h: 16-byte header + body).
 * The transport delimits frames and checks their header and crc; a bad frame
 * gets an ERROR frame back (best effort) and the connection is closed with
 * on_close(HS_ERR_FORMAT: bad magic, type or oversized body; HS_ERR_MISMATCH:
 * other protocol version; HS_ERR_CHECKSUM: body crc). It never parses the
 * protobuf body. Other on_close reasons: HS_ERR_CLOSED the peer closed between
 * messages (or the transport was destroyed); HS_ERR_IO reset, socket error,
 * peer failure, or the stream ended inside a message; HS_ERR_PROTO a payload
 * was not accepted; for hs_tp_close(), the reason given there.
 *
 * Bulk payloads travel next to a control frame (the DONE): the sender calls
 * hs_tp_send_payload(frame, payload); the receiver gets on_frame() for the
 * frame with `payload_bytes` set, and, inside that callback, either calls
 * hs_tp_recv_payload(conn, dest, bytes) to have the payload land straight in
 * `dest`, or does not, in which case the connection is closed (the payload
 * was refused). No transport writes a payload byte anywhere but `dest`, and
 * only after a size that equals `payload_bytes` was accepted.
 *
 * Ownership: hs_tp_send() copies the frame before returning. For
 * hs_tp_send_payload() the frame is copied, while the payload buffer belongs
 * to the transport until its completion callback runs (exactly once, with
 * HS_OK or an error, possibly after the connection closed). `dest` of
 * hs_tp_recv_payload() belongs to the transport until on_payload() runs for
 * it (exactly once). A function that fails never calls its callback.
 */
#ifndef HS_TRANSPORT_H
#define HS_TRANSPORT_H

#include <stdint.h>
#include <stdbool.h>
#include <stddef.h>

#include "hsflow.h"
#include "hs_proto.h" /* hs_auth_key_t */

#ifdef __cplusplus
extern "C" {
#endif

typedef struct hs_tp hs_tp_t;
typedef struct hs_tp_conn hs_tp_conn_t;

/* TCP: hsflow's own TCP. UCX: UCX (RDMA, shared memory, its own TCP).
 * SHM: shared memory with a peer on this host (a consumer takes only such
 * producers; a producer fails when its consumer is not on its host). AUTO:
 * chosen per link: hs_tp_create() makes it UCX where the build has UCX and
 * an RDMA device is present (UCX then without its TCP transport), else
 * hsflow's TCP with shared memory for every peer on the same host (the
 * same kernel, reached through a local address). */
typedef enum { HS_TP_TCP = 1, HS_TP_UCX = 2, HS_TP_SHM = 3, HS_TP_AUTO = 4 } hs_tp_kind_t;

typedef struct {
    /* Consumer side: a new peer connected. Returning non-OK closes it (and
     * on_close runs for it later, like for every connection seen here). */
    hs_status_t (*on_accept)(void *arg, hs_tp_conn_t *conn);
    /* A complete, crc-checked frame. `body` is valid only during the call.
     * payload_bytes > 0 when a payload follows the frame (see above). */
    void (*on_frame)(void *arg, hs_tp_conn_t *conn, uint16_t type, const uint8_t *body,
                     uint32_t body_len, uint64_t payload_bytes);
    /* The payload accepted with hs_tp_recv_payload() finished (HS_OK) or
     * failed; `cookie` is the value given there. */
    void (*on_payload)(void *arg, hs_tp_conn_t *conn, uint64_t cookie, hs_status_t status);
    /* The connection is gone (peer closed, error, or hs_tp_close()). After
     * this returns the conn pointer is invalid. `reason` is HS_ERR_CLOSED for
     * an orderly close. */
    void (*on_close)(void *arg, hs_tp_conn_t *conn, hs_status_t reason, const char *why);
} hs_tp_callbacks_t;

typedef void (*hs_tp_send_cb)(void *arg, hs_status_t status);

typedef struct {
    hs_tp_kind_t kind;
    uint32_t max_frame_body; /* 0 = HS_FRAME_MAX_BODY */
    /* Seconds of silence after which a peer counts as failed (0 = 10 s). */
    uint32_t peer_timeout_s;
    /* UCX: device list for UCX_NET_DEVICES (NULL = UCX's choice; copied) and
     * whether a connection without an RDMA lane is refused (with TCP,
     * require_rdma makes hs_tp_create fail). Other UCX_* variables apply. */
    const char *net_devices;
    bool require_rdma;
    /* Who may connect, and what a peer must prove. auth_key: the shared key
     * (hs_auth_load_secret) or NULL; the caller keeps ownership of its key,
     * hs_tp_create() copies it and the transport wipes its copy at destroy.
     * allow_remote: without a key, whether peers off loopback may connect
     * (the consumer's --insecure). UCX enforces both in its bootstrap, before
     * anything a peer sends reaches UCX: with a key an HMAC challenge-response
     * both ways, without one the loopback rule, and a refused peer is told
     * why. TCP only carries them: its owner applies the rule in on_accept and
     * the HMAC in its own handshake (frames are safe to parse before). */
    const hs_auth_key_t *auth_key;
    bool allow_remote;
    /* TCP: SO_SNDBUF/SO_RCVBUF in bytes (at most 1 GiB); 0 = 16 MiB where
     * net.core.rmem_max and wmem_max allow it, else the kernel's autotuning;
     * HS_TP_SOCKBUF_AUTOTUNE = always the kernel's autotuning. */
    uint64_t tcp_sockbuf;
    /* Shared memory, receiving side: threads that copy payloads out of the
     * producers' segments (1..8; 0 = half the CPUs, 1 to 4). */
    uint32_t shm_copiers;
    /* UCX: send payloads without their registered memory handle, so UCX
     * registers on the fly (for comparisons only). */
    bool ucx_no_memh;
    /* Tests: faults to inject into this end, "corrupt=N,cut=N,delay_ms=MS"
     * (any of them, comma-separated; see fault.c); NULL or "" = none. */
    const char *fault;
} hs_tp_config_t;

#define HS_TP_SOCKBUF_AUTOTUNE UINT64_MAX
#define HS_TP_SOCKBUF_MAX (1ull << 30)

/* "tcp socket buffers 16 MiB, ucx memory handles on, fault none": the
 * tuning of `cfg` in words, for the effective settings a process logs. */
void hs_tp_config_describe(const hs_tp_config_t *cfg, char *buf, size_t cap);

/* Creates a transport with its event loop; `cb` is copied, `arg` is passed
 * to every callback. Fails with HS_ERR_UNSUPPORTED for a kind not built in. */
HS_MUST_CHECK hs_status_t hs_tp_create(const hs_tp_config_t *cfg, const hs_tp_callbacks_t *cb,
                                       void *arg, hs_tp_t **out);
/* Closes every connection (on_close runs for each, after the failure
 * callbacks of its pending sends and receive), then frees. NULL is ok. Not
 * from inside a callback. */
void hs_tp_destroy(hs_tp_t *tp);

/* Listens on host:port ("0.0.0.0", "::", "127.0.0.1"; port 0 picks one).
 * The bound port is returned in *bound_port when not NULL. Both kinds listen
 * on a TCP port; UCX swaps worker addresses there, then carries the
 * connection over whatever UCX selects (RDMA, shared memory, its own TCP). */
HS_MUST_CHECK hs_status_t hs_tp_listen(hs_tp_t *tp, const char *host, uint16_t port,
                                       uint16_t *bound_port);
/* Connects (blocking, up to timeout_ms, retrying while the peer is not yet
 * listening; timeout_ms < 0 waits forever). Fails with HS_ERR_TIMEOUT when
 * nobody answered in time. UCX: returns once the endpoint is wired up, which
 * needs the peer's loop running; events of this transport's other
 * connections may be delivered meanwhile, so connect before serving others.
 * With require_rdma, a connection without an RDMA lane fails with
 * HS_ERR_UNSUPPORTED. */
HS_MUST_CHECK hs_status_t hs_tp_connect(hs_tp_t *tp, const char *host, uint16_t port,
                                        int timeout_ms, hs_tp_conn_t **out);
/* hs_tp_connect's flags. QUIET: a peer that cannot be reached (nobody
 * listening, no route, the timeout) is logged at INFO, not ERROR: for a
 * caller that expects it and tries again, such as a producer's --reconnect.
 * A refusal (authentication, another version) is an ERROR still. */
enum { HS_TP_CONNECT_QUIET = 1u << 0 };
/* hs_tp_connect with flags (HS_TP_CONNECT_*). */
HS_MUST_CHECK hs_status_t hs_tp_connect_flags(hs_tp_t *tp, const char *host, uint16_t port,
                                              int timeout_ms, unsigned flags, hs_tp_conn_t **out);

HS_MUST_CHECK hs_status_t hs_tp_send(hs_tp_conn_t *conn, const void *frame, size_t frame_len);
HS_MUST_CHECK hs_status_t hs_tp_send_payload(hs_tp_conn_t *conn, const void *frame,
                                             size_t frame_len, const void *payload,
                                             uint64_t payload_len, hs_tp_send_cb cb, void *cb_arg);
/* Only inside on_frame() for a frame with payload_bytes > 0, and only with
 * bytes == payload_bytes. */
HS_MUST_CHECK hs_status_t hs_tp_recv_payload(hs_tp_conn_t *conn, void *dest, uint64_t bytes,
                                             uint64_t cookie);

/* hs_tp_recv_payload, and where the transport copies the payload itself
 * (out of a producer's shared memory) it also computes hs_checksum64() of
 * dest[sum_from, bytes), reading back the bytes it wrote while they are
 * still in cache: one pass instead of a copy and a second read. Inside
 * on_payload(HS_OK) for it, hs_tp_conn_payload_checksum() gives that value;
 * it describes dest as written, so whatever the sender does to its memory
 * afterwards changes nothing. */
HS_MUST_CHECK hs_status_t hs_tp_recv_payload_sum(hs_tp_conn_t *conn, void *dest, uint64_t bytes,
                                                 uint64_t cookie, uint64_t sum_from);
/* Only inside on_payload(): the checksum hs_tp_recv_payload_sum asked for,
 * when the transport computed it (false: compute it yourself). */
bool hs_tp_conn_payload_checksum(const hs_tp_conn_t *conn, uint64_t *sum);

/* Sends what is queued (best effort, bounded by a short linger), then closes;
 * on_close runs from a later hs_tp_progress(). */
void hs_tp_close(hs_tp_conn_t *conn, hs_status_t reason);

/* Runs the loop for at most timeout_ms (-1 = until something happens,
 * 0 = poll). Returns HS_OK or an error of the transport itself; HS_ERR_BUSY
 * when called from inside a callback. */
HS_MUST_CHECK hs_status_t hs_tp_progress(hs_tp_t *tp, int timeout_ms);
/* Thread-safe: makes the current or next hs_tp_progress() return soon. */
void hs_tp_wakeup(hs_tp_t *tp);

/* Allocates `len` bytes of memory to send payloads from (a producer's
 * staging), page-aligned and zeroed. Where the transport shares memory with
 * peers on this host (shm, auto) it is a sealed memfd segment, page-locked
 * where the locked-memory limit allows, that a consumer on this host maps
 * read-only and copies from; elsewhere plain memory, registered as by
 * hs_tp_mem_register(). The memory belongs to the transport: give it back
 * with hs_tp_mem_free(), or hs_tp_destroy() unmaps it (after the failure
 * callbacks of the sends still using it). */
HS_MUST_CHECK hs_status_t hs_tp_mem_alloc(hs_tp_t *tp, size_t len, void **out);
void hs_tp_mem_free(hs_tp_t *tp, void *p); /* NULL ok */
/* The transport this hs_tp_t is after hs_tp_create() resolved AUTO (AUTO
 * stays AUTO when it became TCP with shared memory for local peers). */
hs_tp_kind_t hs_tp_get_kind(const hs_tp_t *tp);
/* That in words: "tcp", "ucx", "shm (producers on this host only)", "auto:
 * shared memory on this host, tcp across hosts". */
const char *hs_tp_kind_describe(const hs_tp_t *tp);

/* Registers memory that payloads will be sent from or received into (UCX
 * maps it once and passes the handle with every payload inside it; TCP does
 * nothing). Unregistered memory still works, slower. Stays registered until
 * hs_tp_destroy(). */
HS_MUST_CHECK hs_status_t hs_tp_mem_register(hs_tp_t *tp, void *addr, size_t len);

/* Peer address as "1.2.3.4:5678", and whether it is a loopback address. */
const char *hs_tp_conn_peer(const hs_tp_conn_t *conn);
bool hs_tp_conn_is_loopback(const hs_tp_conn_t *conn);
/* What carries this connection, e.g. "tcp" or "ucx: rc_mlx5/mlx5_0:1". */
const char *hs_tp_conn_describe(const hs_tp_conn_t *conn);
/* "tcp", "shm" or "ucx": the transport of this connection, in one word. */
const char *hs_tp_conn_kind(const hs_tp_conn_t *conn);
/* The owner vouches for the peer (it proved the shared secret, or passed
 * the loopback rule): from now on a peer on this host may hand over its
 * shared memory. Before this, a segment offered is a protocol error and
 * nothing of it is mapped. */
void hs_tp_conn_set_trusted(hs_tp_conn_t *conn);
/* Sets the largest frame body this connection accepts from now on: 0 gives
 * back the transport's max_frame_body, anything larger than that is an
 * error (HS_ERR_INVALID). A consumer keeps peers it has not admitted yet on
 * a small limit, so that an unauthenticated connection cannot make the
 * transport buffer a maximal frame. A frame over the limit closes the
 * connection with HS_ERR_FORMAT, as an oversized one always did. */
HS_MUST_CHECK hs_status_t hs_tp_conn_set_max_frame(hs_tp_conn_t *conn, uint32_t max_body);
/* Payload bytes received on this connection so far, counted as they arrive
 * (a payload still landing included), into *bytes; false when the
 * transport sees a payload only once it has landed whole (UCX). For lease
 * clocks: bytes arriving are progress. */
bool hs_tp_conn_payload_bytes_in(const hs_tp_conn_t *conn, uint64_t *bytes);
/* Opaque per-connection pointer for the owner of the callbacks. */
void hs_tp_conn_set_user(hs_tp_conn_t *conn, void *user);
void *hs_tp_conn_get_user(const hs_tp_conn_t *conn);

HS_MUST_CHECK hs_status_t hs_tp_kind_parse(const char *s,
                                           hs_tp_kind_t *out); /* "tcp", "ucx", "shm", "auto" */
const char *hs_tp_kind_str(hs_tp_kind_t kind);
bool hs_tp_kind_available(hs_tp_kind_t kind);

#ifdef __cplusplus
}
#endif
#endif /* HS_TRANSPORT_H */
