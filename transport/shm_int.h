/* SPDX-License-Identifier: Apache-2.0 */
/* shm_int.h - shared memory between a producer and a consumer on one host
 * (shm.c), carried by the TCP transport's connection code (tcp_int.h).
 *
 * A shared-memory connection is a TCP-transport connection whose socket is
 * a Unix stream socket in the abstract namespace, named after the
 * consumer's TCP port ("\0hsflow-shm-<port>"). Abstract names belong to one
 * network namespace, so only a process on the consumer's host and in its
 * network namespace reaches it. Control frames travel on that socket as on
 * TCP; payloads stay in the producer's memory:
 *
 * - Segments. hs_tp_mem_alloc() on a producer makes each staging buffer a
 *   memfd of its own (sealed against shrinking and growing, page-locked
 *   where RLIMIT_MEMLOCK allows), mapped read-write by the producer. The
 *   segments of one producer are its ring. A consumer maps a segment
 *   read-only, once per connection, after the peer was trusted
 *   (hs_tp_conn_set_trusted: the HMAC proof or the loopback rule passed).
 *   A producer never maps the consumer's cache.
 * - Preamble. Each side sends SHM_PREAMBLE_BYTES first: magic, version, pid
 *   and the kernel's boot id; a different boot id or a peer of another user
 *   (SO_PEERCRED; root excepted) is refused before any frame is read.
 * - Messages. The transport's 8-byte prefix carries a tag in its top byte
 *   (on shared-memory connections only; on TCP it is the payload length):
 *     0 PLAIN    prefix = payload length; payload bytes follow the frame on
 *                the socket (memory outside any segment)
 *     1 RING     prefix = tag | payload length; the frame, then a 24-byte
 *                descriptor: segment u32, reserved u32, offset u64, token u64
 *     2 ATTACH   16 bytes: segment u32, reserved u32, size u64; the memfd
 *                travels with it (SCM_RIGHTS)
 *     3 RELEASE  16 bytes: token u64, status u64 (consumer to producer: the
 *                payload of that descriptor was copied out, its memory is
 *                the producer's again)
 * - Receive. A RING descriptor is checked before its frame is delivered
 *   (a segment this connection attached, offset + length inside it, the
 *   length the prefix said); a bad one is a protocol error and closes the
 *   connection with nothing delivered. An accepted payload is copied from
 *   the mapping into `dest` in one pass by a copier thread (shm_copy_int.h),
 *   then, on the loop thread, RELEASE goes back and on_payload runs. The receiver verifies its copy
 * (the checksum of what landed in `dest`), so a producer writing into its segment after DONE, or
 * dying in the middle, changes nothing delivered.
 */
#ifndef HS_SHM_INT_H
#define HS_SHM_INT_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/un.h>
#include <stddef.h>

#include "hsflow.h"
#include "hs_transport.h"

#ifdef __cplusplus
extern "C" {
#endif

#define SHM_PREAMBLE_BYTES 64u
#define SHM_MAGIC "HSFLSHM1"
#define SHM_VERSION 1u
#define SHM_SEGS_MAX 256u               /* segments per producer, and per connection */
#define SHM_SEG_MAX_BYTES (64ull << 30) /* one segment */
#define SHM_FDS_MAX 4u                  /* descriptors received and not yet attached */
#define SHM_DESC_BYTES 24u              /* RING descriptor */
#define SHM_TAG_SHIFT 56
#define SHM_TAG_PLAIN 0u
#define SHM_TAG_RING 1u
#define SHM_TAG_ATTACH 2u
#define SHM_TAG_RELEASE 3u
#define SHM_LEN_MASK ((1ull << SHM_TAG_SHIFT) - 1)
#define SHM_BOOT_ID_BYTES 40u

typedef enum { SHM_OFF = 0, SHM_AUTO = 1, SHM_ONLY = 2 } shm_mode_t;

/* One segment a producer allocated (hs_tp_mem_alloc). */
typedef struct {
    int fd;
    uint8_t *base;
    uint64_t len;
    bool locked; /* mlock() held */
} shm_seg_t;

/* A producer's segments: its ring. */
typedef struct {
    shm_seg_t segs[SHM_SEGS_MAX];
    uint32_t n;
    bool lock_warned;
} shm_ring_t;

/* A payload sent from a segment whose RELEASE has not come yet. */
typedef struct {
    uint64_t token;
    hs_tp_send_cb cb;
    void *cb_arg;
} shm_pending_t;

/* Shared-memory state of one connection (NULL on TCP connections). */
typedef struct shm_conn {
    /* preamble: the peer's, read before anything else */
    uint8_t pre[SHM_PREAMBLE_BYTES];
    uint32_t pre_len;
    bool pre_done;
    pid_t peer_pid;
    uid_t peer_uid;
    /* receiving side: descriptors that came with ATTACH, and the segments
     * mapped read-only, by segment id */
    int fds[SHM_FDS_MAX];
    uint32_t n_fds;
    const uint8_t *map[SHM_SEGS_MAX];
    uint64_t map_len[SHM_SEGS_MAX];
    uint32_t n_mapped;
    uint64_t mapped_bytes;
    /* the RING descriptor of the frame being received */
    bool rx_ring;
    uint32_t rx_seg;
    uint64_t rx_off, rx_token;
    /* sending side: segments attached on this connection, and payloads
     * waiting for their RELEASE */
    bool attached[SHM_SEGS_MAX];
    shm_pending_t *pending;
    uint32_t n_pending, cap_pending;
    uint64_t next_token;
    uint64_t ring_payloads, plain_payloads; /* sent or received */
} shm_conn_t;

/* The kernel's boot id (/proc/sys/kernel/random/boot_id), NUL-terminated,
 * into out[SHM_BOOT_ID_BYTES]; "" when unreadable. */
void hs__shm_boot_id(char *out);
/* Fills buf[SHM_PREAMBLE_BYTES] with this process's preamble. */
void hs__shm_preamble_make(uint8_t *buf);
/* Checks a peer's preamble; why[cap] says what was wrong. */
HS_MUST_CHECK hs_status_t hs__shm_preamble_check(const uint8_t *buf, pid_t *pid, char *why,
                                                 size_t cap);
/* The abstract socket address for a consumer's TCP port. */
socklen_t hs__shm_addr(uint16_t port, struct sockaddr_un *sa);
/* Whether host resolves to an address of this machine (loopback, or one an
 * interface holds). */
bool hs__shm_host_is_local(const char *host);

/* Segments (producer side). */
HS_MUST_CHECK hs_status_t hs__shm_ring_alloc(shm_ring_t *r, size_t len, void **out);
/* The segment holding [p, p + len) whole, or -1. */
int hs__shm_ring_find(const shm_ring_t *r, const void *p, uint64_t len, uint64_t *offset);
/* false when p is not a segment of r */
bool hs__shm_ring_free(shm_ring_t *r, void *p);
void hs__shm_ring_destroy(shm_ring_t *r);

shm_conn_t *hs__shm_conn_new(void);
/* Unmaps, closes pending descriptors and frees (pending sends must have
 * been failed by the caller). NULL ok. */
void hs__shm_conn_free(shm_conn_t *s);
/* Receiving side. An ATTACH: maps the oldest received descriptor as
 * segment `seg` of `size` bytes after checking it (trusted peer, a sealed
 * memfd of at least that size, a new segment id, the bounds). */
HS_MUST_CHECK hs_status_t hs__shm_attach(shm_conn_t *s, bool trusted, uint32_t seg, uint64_t size,
                                         char *why, size_t cap);
/* Takes file descriptors that came in control messages; false (all of them
 * closed) when more than SHM_FDS_MAX would be pending. */
bool hs__shm_take_fds(shm_conn_t *s, struct msghdr *msg);
/* Checks a RING descriptor against the connection's segments. */
HS_MUST_CHECK hs_status_t hs__shm_desc_check(const shm_conn_t *s, uint32_t seg, uint64_t off,
                                             uint64_t len, char *why, size_t cap);
/* Sending side: remembers a payload until its RELEASE (token out). */
HS_MUST_CHECK hs_status_t hs__shm_pending_add(shm_conn_t *s, hs_tp_send_cb cb, void *cb_arg,
                                              uint64_t *token);
/* Removes the payload of `token`; false when none is pending with it. */
bool hs__shm_pending_take(shm_conn_t *s, uint64_t token, shm_pending_t *out);

#ifdef __cplusplus
}
#endif
#endif /* HS_SHM_INT_H */
