/* SPDX-License-Identifier: Apache-2.0 */
/* sock.c - the TCP socket layer under both transports (sock_int.h). */
#include "sock_int.h"
#include "hs_log.h"
#include "hs_time.h"

#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "hs_transport_int.h"

hs_status_t hs__sock_resolve(const char *host, uint16_t port, bool passive, struct addrinfo **out)
{
    struct addrinfo hints = {0};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_NUMERICSERV | (passive ? AI_PASSIVE : 0);
    char ps[8];
    snprintf(ps, sizeof ps, "%u", port);
    char h[256];
    size_t n = strlen(host);
    if (n >= 2 && host[0] == '[' && host[n - 1] == ']' && n - 2 < sizeof h) {
        memcpy(h, host + 1, n - 2);
        h[n - 2] = '\0';
    } else if (n < sizeof h) {
        memcpy(h, host, n + 1);
    } else {
        hs_error("host name of %zu characters is too long", n);
        return HS_ERR_INVALID;
    }
    int rc = getaddrinfo(h[0] ? h : NULL, ps, &hints, out);
    if (rc != 0) {
        hs_error("cannot resolve '%s' port %u: %s; give an IP address or a resolvable host name",
                 host, port, gai_strerror(rc));
        return HS_ERR_INVALID;
    }
    return HS_OK;
}

/* ---- listening ------------------------------------------------------------ */

hs_status_t hs__sock_listen(const char *what, const char *host, uint16_t port,
                            hs__sock_tune_cb tune, void *arg, int *fd_out, uint16_t *bound_port)
{
    struct addrinfo *ai = NULL;
    hs_status_t st = hs__sock_resolve(host, port, true, &ai);
    if (st != HS_OK) return st;
    int fd = -1, err = 0;
    for (struct addrinfo *a = ai; a; a = a->ai_next) {
        fd = socket(a->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (fd < 0) {
            err = errno;
            continue;
        }
        int one = 1, zero = 0;
        (void)setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (a->ai_family == AF_INET6) /* "::" takes IPv4 too */
            (void)setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero);
        if (tune) tune(fd, arg);
        if (bind(fd, a->ai_addr, a->ai_addrlen) == 0 && listen(fd, HS__SOCK_BACKLOG) == 0) break;
        err = errno;
        close(fd);
        fd = -1;
    }
    freeaddrinfo(ai);
    if (fd < 0) {
        hs_error("cannot listen on %s port %u: %s; choose a free port or a local address", host,
                 port, strerror(err));
        return HS_ERR_IO;
    }
    struct sockaddr_storage ss;
    socklen_t len = sizeof ss;
    uint16_t p = port;
    char addr[HS__TP_PEER_CAP] = "?";
    if (getsockname(fd, (struct sockaddr *)&ss, &len) == 0) {
        hs__tp_addr_format((struct sockaddr *)&ss, addr, sizeof addr);
        if (ss.ss_family == AF_INET) p = ntohs(((struct sockaddr_in *)&ss)->sin_port);
        if (ss.ss_family == AF_INET6) p = ntohs(((struct sockaddr_in6 *)&ss)->sin6_port);
    }
    hs_info("%s listening on %s", what, addr);
    *fd_out = fd;
    if (bound_port) *bound_port = p;
    return HS_OK;
}

int hs__sock_accept(int lfd, struct sockaddr_storage *peer, socklen_t *peer_len)
{
    for (;;) {
        *peer_len = sizeof *peer;
        int fd = accept4(lfd, (struct sockaddr *)peer, peer_len, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd >= 0 || (errno != EINTR && errno != ECONNABORTED)) return fd;
    }
}

/* ---- connecting ----------------------------------------------------------- */

bool hs__sock_errno_retryable(int err)
{
    switch (err) {
    case ECONNREFUSED:
    case EHOSTUNREACH:
    case ETIMEDOUT:
    case ECONNRESET:
    case ECONNABORTED:
    case EPIPE:
    case EINTR:
    case EAGAIN:
#if EWOULDBLOCK != EAGAIN
    case EWOULDBLOCK:
#endif
    case EINPROGRESS:
    case EALREADY:
        return true;
    default:
        return false;
    }
}

int hs__sock_ms_left(uint64_t deadline_ns)
{
    if (deadline_ns == UINT64_MAX) return -1;
    uint64_t now = hs_now_ns();
    return now >= deadline_ns ? 0 : (int)((deadline_ns - now + 999999) / 1000000);
}

/* One non-blocking connect to `a`, waited on until deadline_ns: the
 * connected socket, or -1 with errno set (ETIMEDOUT at the deadline). */
static int connect_once(const struct addrinfo *a, uint64_t deadline_ns, hs__sock_tune_cb tune,
                        void *arg)
{
    int fd = socket(a->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) return -1;
    if (tune) tune(fd, arg);
    int e = 0;
    if (connect(fd, a->ai_addr, a->ai_addrlen) == 0) return fd;
    e = errno;
    if (e == EINPROGRESS || e == EINTR) { /* EINTR: the connect goes on in the background */
        struct pollfd p = {.fd = fd, .events = POLLOUT};
        int r;
        do {
            r = poll(&p, 1, hs__sock_ms_left(deadline_ns));
        } while (r < 0 && errno == EINTR);
        int soerr = 0;
        socklen_t sl = sizeof soerr;
        if (r == 0)
            e = ETIMEDOUT;
        else if (r < 0)
            e = errno;
        else if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &sl) != 0)
            e = errno;
        else if (soerr != 0)
            e = soerr;
        else
            return fd;
    }
    close(fd);
    errno = e;
    return -1;
}

hs_status_t hs__sock_connect(const struct addrinfo *ai, uint64_t deadline_ns, hs__sock_tune_cb tune,
                             void *arg, int *fd_out, const struct addrinfo **used, char *why,
                             size_t whycap)
{
    int err = 0;
    for (;;) {
        bool retry = false;
        for (const struct addrinfo *a = ai; a; a = a->ai_next) {
            int fd = connect_once(a, deadline_ns, tune, arg);
            if (fd >= 0) {
                *fd_out = fd;
                *used = a;
                return HS_OK;
            }
            /* a failure that does not mend on one address may still leave
             * another (an IPv6 and an IPv4 one) to try */
            err = errno;
            if (hs__sock_errno_retryable(err)) retry = true;
        }
        uint64_t now = hs_now_ns();
        if (!retry) {
            snprintf(why, whycap, "%s (not retried: waiting does not mend it)", strerror(err));
            return HS_ERR_IO;
        }
        if (now >= deadline_ns) break;
        uint64_t nap = (uint64_t)HS__SOCK_RETRY_MS * 1000000u;
        if (deadline_ns - now < nap) nap = deadline_ns - now;
        struct timespec ts = {.tv_sec = 0, .tv_nsec = (long)nap};
        nanosleep(&ts, NULL);
    }
    snprintf(why, whycap, "%s", strerror(err));
    return HS_ERR_TIMEOUT;
}

bool hs__sock_io(int fd, void *buf, size_t len, bool writing, uint64_t deadline_ns)
{
    size_t done = 0;
    while (done < len) {
        struct pollfd p = {.fd = fd, .events = writing ? POLLOUT : POLLIN};
        int r = poll(&p, 1, hs__sock_ms_left(deadline_ns));
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
            if (r == 0) errno = ETIMEDOUT;
            return false;
        }
        ssize_t n = writing ? send(fd, (uint8_t *)buf + done, len - done, MSG_NOSIGNAL)
                            : recv(fd, (uint8_t *)buf + done, len - done, 0);
        if (n < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) continue;
        if (n <= 0) {
            if (n == 0) errno = ECONNRESET;
            return false;
        }
        done += (size_t)n;
    }
    return true;
}
