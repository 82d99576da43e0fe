/* SPDX-License-Identifier: Apache-2.0 */
/* sock_int.h - the TCP socket layer under both transports (sock.c): name
 * resolution, listening sockets, accept, and connects bounded by a deadline.
 * The TCP transport carries its connections on these sockets; the UCX
 * transport runs its bootstrap exchange on them.
 *
 * Every socket made here is non-blocking and close-on-exec, and belongs to
 * the caller once returned. Deadlines are hs_now_ns() values; UINT64_MAX is
 * "no deadline".
 */
#ifndef HS_SOCK_INT_H
#define HS_SOCK_INT_H

#include <sys/socket.h>
#include <stdint.h>
#include <stdbool.h>
#include <stddef.h>

#include "hsflow.h"

#ifdef __cplusplus
extern "C" {
#endif

struct addrinfo;

#define HS__SOCK_BACKLOG 128
#define HS__SOCK_RETRY_MS 50 /* pause between connect attempts */

/* Runs on a socket before it binds or connects (socket options). */
typedef void (*hs__sock_tune_cb)(int fd, void *arg);

/* Resolves host:port for listening (passive) or connecting; "[::1]" as
 * given on a command line works too. The caller frees *out with
 * freeaddrinfo(). Logs what was wrong (HS_ERR_INVALID). */
HS_MUST_CHECK hs_status_t hs__sock_resolve(const char *host, uint16_t port, bool passive,
                                           struct addrinfo **out);

/* Listens on host:port: the first resolved address that binds, with
 * SO_REUSEADDR (and an IPv6 "::" taking IPv4 too). tune (NULL: none) runs
 * before bind; listening sockets pass their options on to accepted ones.
 * On success *fd is the caller's, *bound_port (may be NULL) the port bound
 * (the one the system chose for port 0), and "<what> listening on ADDR" is
 * logged. On failure nothing is left open and the reason is logged. */
HS_MUST_CHECK hs_status_t hs__sock_listen(const char *what, const char *host, uint16_t port,
                                          hs__sock_tune_cb tune, void *arg, int *fd,
                                          uint16_t *bound_port);

/* One accept4() on a non-blocking listener, through EINTR and ECONNABORTED
 * (a client that gave up in the queue). The accepted socket, or -1 with
 * errno: EAGAIN/EWOULDBLOCK when the queue is empty; anything else is a
 * failure of the listener (hs__tp_accept_failed). */
int hs__sock_accept(int lfd, struct sockaddr_storage *peer, socklen_t *peer_len);

/* Whether a connect, or the I/O just after it, that failed with `err` may
 * work if tried again: nobody listening yet (ECONNREFUSED), a peer that is
 * not up yet (EHOSTUNREACH, ETIMEDOUT from the system), one restarting
 * (ECONNRESET, ECONNABORTED, EPIPE), or an interrupted or busy call (EINTR,
 * EAGAIN, EINPROGRESS, EALREADY). Anything else (ENETUNREACH: no route to
 * that network, EACCES/EPERM: refused by a local policy, EADDRNOTAVAIL,
 * EAFNOSUPPORT, EINVAL...) will not mend by waiting. */
bool hs__sock_errno_retryable(int err);

/* Connects to one of the addresses `ai` (tried in turn), each attempt a
 * non-blocking connect() waited on with poll() until deadline_ns, so that a
 * SYN sent into a black hole ends at the deadline too. An attempt that fails
 * with a retryable errno (hs__sock_errno_retryable) is tried again every
 * HS__SOCK_RETRY_MS until the deadline; any other failure ends it at once.
 * tune (NULL: none) runs on every socket before it connects.
 * Returns HS_OK with *fd (the caller's) and *used (the address that
 * answered, an element of ai); HS_ERR_TIMEOUT at the deadline; HS_ERR_IO for
 * a failure that does not mend by waiting. On failure why[cap] says what
 * failed last ("Connection refused"...) and nothing is logged: the caller
 * logs it once, with what it was connecting for. */
HS_MUST_CHECK hs_status_t hs__sock_connect(const struct addrinfo *ai, uint64_t deadline_ns,
                                           hs__sock_tune_cb tune, void *arg, int *fd,
                                           const struct addrinfo **used, char *why, size_t whycap);

/* Milliseconds until deadline_ns for poll(): -1 for none, 0 once passed. */
int hs__sock_ms_left(uint64_t deadline_ns);

/* Sends or receives exactly len bytes on a non-blocking socket, waiting
 * with poll() until deadline_ns. false with errno set: ETIMEDOUT at the
 * deadline, ECONNRESET for an end of stream. */
bool hs__sock_io(int fd, void *buf, size_t len, bool writing, uint64_t deadline_ns);

#ifdef __cplusplus
}
#endif
#endif /* HS_SOCK_INT_H */
