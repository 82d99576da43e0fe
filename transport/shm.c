/* SPDX-License-Identifier: Apache-2.0 */
/* shm.c - shared memory between a producer and a consumer on one host
 * (shm_int.h): the preamble, segments (memfd rings), descriptors passed and
 * mapped, RING descriptors checked, payloads waiting for their RELEASE. */
#include "shm_int.h"
#include "hs_log.h"
#include "hs_bytes.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "hs_transport_int.h"
#include "sock_int.h"

/* ---- identity ------------------------------------------------------------- */

void hs__shm_boot_id(char *out)
{
    out[0] = '\0';
    FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
    if (!f) return;
    if (!fgets(out, (int)SHM_BOOT_ID_BYTES, f)) out[0] = '\0';
    fclose(f);
    out[strcspn(out, "\n")] = '\0';
}

/* magic[8] | version u32 | pid u32 | boot id[40] | zero[8] */
void hs__shm_preamble_make(uint8_t *buf)
{
    memset(buf, 0, SHM_PREAMBLE_BYTES);
    memcpy(buf, SHM_MAGIC, 8);
    hs_le32_store(buf + 8, SHM_VERSION);
    hs_le32_store(buf + 12, (uint32_t)getpid());
    hs__shm_boot_id((char *)buf + 16);
}

hs_status_t hs__shm_preamble_check(const uint8_t *buf, pid_t *pid, char *why, size_t cap)
{
    if (memcmp(buf, SHM_MAGIC, 8) != 0) {
        snprintf(why, cap, "not an hsflow shared-memory peer (bad preamble)");
        return HS_ERR_FORMAT;
    }
    uint32_t v = hs_le32_load(buf + 8);
    if (v != SHM_VERSION) {
        snprintf(why, cap,
                 "shared-memory protocol version %u, this side speaks %u: run the same "
                 "hsflow on both sides",
                 v, SHM_VERSION);
        return HS_ERR_MISMATCH;
    }
    char mine[SHM_BOOT_ID_BYTES], theirs[SHM_BOOT_ID_BYTES];
    hs__shm_boot_id(mine);
    memcpy(theirs, buf + 16, SHM_BOOT_ID_BYTES);
    theirs[SHM_BOOT_ID_BYTES - 1] = '\0';
    if (!mine[0] || strcmp(mine, theirs) != 0) {
        snprintf(why, cap,
                 "the peer runs on another kernel (boot id '%s', ours '%s'): shared "
                 "memory needs one host; use --transport tcp",
                 theirs, mine);
        return HS_ERR_MISMATCH;
    }
    *pid = (pid_t)hs_le32_load(buf + 12);
    return HS_OK;
}

socklen_t hs__shm_addr(uint16_t port, struct sockaddr_un *sa)
{
    memset(sa, 0, sizeof *sa);
    sa->sun_family = AF_UNIX;
    int n = snprintf(sa->sun_path + 1, sizeof sa->sun_path - 1, "hsflow-shm-%u", port);
    return (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + (size_t)n);
}

bool hs__shm_host_is_local(const char *host)
{
    struct addrinfo *ai = NULL;
    if (hs__sock_resolve(host, 1, false, &ai) != HS_OK) return false;
    bool local = false;
    for (struct addrinfo *a = ai; a && !local; a = a->ai_next) {
        if (hs__tp_addr_is_loopback(a->ai_addr)) {
            local = true;
            break;
        }
        /* an address this machine holds can be bound to */
        int fd = socket(a->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
        if (fd < 0) continue;
        struct sockaddr_storage ss;
        memcpy(&ss, a->ai_addr, a->ai_addrlen);
        if (ss.ss_family == AF_INET)
            ((struct sockaddr_in *)&ss)->sin_port = 0;
        else if (ss.ss_family == AF_INET6)
            ((struct sockaddr_in6 *)&ss)->sin6_port = 0;
        if (bind(fd, (struct sockaddr *)&ss, a->ai_addrlen) == 0) local = true;
        close(fd);
    }
    freeaddrinfo(ai);
    return local;
}

/* ---- segments (producer side) --------------------------------------------- */

hs_status_t hs__shm_ring_alloc(shm_ring_t *r, size_t len, void **out)
{
    if (r->n >= SHM_SEGS_MAX) {
        hs_error("a producer shares at most %u staging buffers; use fewer workers or staging "
                 "buffers",
                 SHM_SEGS_MAX);
        return HS_ERR_NOSPACE;
    }
    long page = sysconf(_SC_PAGESIZE);
    uint64_t size = ((uint64_t)len + (uint64_t)page - 1) / (uint64_t)page * (uint64_t)page;
    if (size == 0 || size > SHM_SEG_MAX_BYTES) {
        hs_error("a shared staging buffer of %zu bytes: give 1 byte to %llu GiB", len,
                 SHM_SEG_MAX_BYTES >> 30);
        return HS_ERR_INVALID;
    }
    int fd = memfd_create("hsflow-ring", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0) {
        hs_error("memfd_create for a shared staging buffer failed: %m");
        return HS_ERR_IO;
    }
    if (ftruncate(fd, (off_t)size) != 0) {
        hs_error("cannot size a shared staging buffer to %llu bytes: %m", (unsigned long long)size);
        goto err_fd;
    }
    /* every page allocated now: a consumer maps only whole segments, and
     * populates its mapping at once instead of faulting in the first copy */
    if (fallocate(fd, 0, 0, (off_t)size) != 0) {
        hs_error("cannot allocate a shared staging buffer of %llu bytes: %m (is the memory "
                 "limit too small?)",
                 (unsigned long long)size);
        goto err_fd;
    }
    if (fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
        hs_error("cannot seal a shared staging buffer: %m");
        goto err_fd;
    }
    void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
        hs_error("cannot map a shared staging buffer of %llu bytes: %m", (unsigned long long)size);
        goto err_fd;
    }
    shm_seg_t *s = &r->segs[r->n];
    s->fd = fd;
    s->base = p;
    s->len = size;
    s->locked = mlock(p, size) == 0;
    if (!s->locked && !r->lock_warned) {
        hs_warn("shared staging buffers are not page-locked (mlock: %m): raise the locked-memory "
                "limit (ulimit -l) for steady copies");
        r->lock_warned = true;
    }
    r->n++;
    *out = p;
    return HS_OK;
err_fd:
    close(fd);
    return HS_ERR_IO;
}

int hs__shm_ring_find(const shm_ring_t *r, const void *p, uint64_t len, uint64_t *offset)
{
    const uint8_t *b = p;
    for (uint32_t i = 0; i < r->n; i++) {
        const shm_seg_t *s = &r->segs[i];
        if (!s->base || b < s->base || b >= s->base + s->len) continue;
        uint64_t off = (uint64_t)(b - s->base);
        if (len > s->len - off) return -1;
        *offset = off;
        return (int)i;
    }
    return -1;
}

bool hs__shm_ring_free(shm_ring_t *r, void *p)
{
    for (uint32_t i = 0; i < r->n; i++) {
        shm_seg_t *s = &r->segs[i];
        if (s->base != p) continue;
        munmap(s->base, s->len);
        close(s->fd);
        s->base = NULL; /* ids are never reused: a consumer may have it mapped */
        s->fd = -1;
        s->len = 0;
        return true;
    }
    return false;
}

void hs__shm_ring_destroy(shm_ring_t *r)
{
    for (uint32_t i = 0; i < r->n; i++)
        if (r->segs[i].base) (void)hs__shm_ring_free(r, r->segs[i].base);
    r->n = 0;
}

/* ---- connections ---------------------------------------------------------- */

shm_conn_t *hs__shm_conn_new(void) { return calloc(1, sizeof(shm_conn_t)); }

void hs__shm_conn_free(shm_conn_t *s)
{
    if (!s) return;
    for (uint32_t i = 0; i < s->n_fds; i++)
        close(s->fds[i]);
    for (uint32_t i = 0; i < SHM_SEGS_MAX; i++)
        if (s->map[i]) munmap((void *)s->map[i], s->map_len[i]);
    free(s->pending);
    free(s);
}

bool hs__shm_take_fds(shm_conn_t *s, struct msghdr *msg)
{
    bool ok = true;
    for (struct cmsghdr *cm = CMSG_FIRSTHDR(msg); cm; cm = CMSG_NXTHDR(msg, cm)) {
        if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS) continue;
        size_t n = (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        for (size_t i = 0; i < n; i++) {
            int fd;
            memcpy(&fd, CMSG_DATA(cm) + i * sizeof(int), sizeof fd);
            if (ok && s->n_fds < SHM_FDS_MAX) {
                s->fds[s->n_fds++] = fd;
            } else {
                close(fd);
                ok = false;
            }
        }
    }
    if (msg->msg_flags & MSG_CTRUNC) ok = false;
    return ok;
}

hs_status_t hs__shm_attach(shm_conn_t *s, bool trusted, uint32_t seg, uint64_t size, char *why,
                           size_t cap)
{
    if (s->n_fds == 0) {
        snprintf(why, cap, "a shared-memory segment was offered without its descriptor");
        return HS_ERR_PROTO;
    }
    int fd = s->fds[0];
    memmove(s->fds, s->fds + 1, (s->n_fds - 1) * sizeof(int));
    s->n_fds--;
    hs_status_t st = HS_ERR_PROTO;
    struct stat sb;
    int seals;
    if (!trusted) {
        snprintf(why, cap,
                 "a shared-memory segment was offered before the peer proved itself "
                 "(the handshake comes first)");
    } else if (seg >= SHM_SEGS_MAX) {
        snprintf(why, cap, "shared-memory segment %u is out of range (at most %u)", seg,
                 SHM_SEGS_MAX);
    } else if (s->map[seg]) {
        snprintf(why, cap, "shared-memory segment %u was offered twice", seg);
    } else if (size == 0 || size > SHM_SEG_MAX_BYTES) {
        snprintf(why, cap, "a shared-memory segment of %llu bytes (1 byte to %llu GiB)",
                 (unsigned long long)size, SHM_SEG_MAX_BYTES >> 30);
    } else if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode) || (uint64_t)sb.st_size < size) {
        snprintf(why, cap, "shared-memory segment %u is not a file of %llu bytes", seg,
                 (unsigned long long)size);
    } else if ((uint64_t)sb.st_blocks * 512u < size) {
        /* sparse: reading it would allocate memory on this side */
        snprintf(why, cap, "shared-memory segment %u has holes (%llu of %llu bytes allocated)", seg,
                 (unsigned long long)sb.st_blocks * 512u, (unsigned long long)size);
    } else if ((seals = fcntl(fd, F_GET_SEALS)) < 0 || !(seals & F_SEAL_SHRINK)) {
        /* a file that can shrink under our mapping would fault our reads */
        snprintf(why, cap, "shared-memory segment %u is not a memfd sealed against shrinking", seg);
    } else {
        void *p = mmap(NULL, size, PROT_READ, MAP_SHARED | MAP_POPULATE, fd, 0);
        if (p == MAP_FAILED) {
            snprintf(why, cap, "cannot map shared-memory segment %u of %llu bytes: %s", seg,
                     (unsigned long long)size, strerror(errno));
            st = HS_ERR_IO;
        } else {
            s->map[seg] = p;
            s->map_len[seg] = size;
            s->n_mapped++;
            s->mapped_bytes += size;
            st = HS_OK;
        }
    }
    close(fd); /* the mapping keeps the memory */
    return st;
}

hs_status_t hs__shm_desc_check(const shm_conn_t *s, uint32_t seg, uint64_t off, uint64_t len,
                               char *why, size_t cap)
{
    if (seg >= SHM_SEGS_MAX || !s->map[seg]) {
        snprintf(why, cap,
                 "a payload descriptor names shared-memory segment %u, which this "
                 "connection never attached",
                 seg);
        return HS_ERR_PROTO;
    }
    if (len == 0 || off > s->map_len[seg] || len > s->map_len[seg] - off) {
        snprintf(why, cap,
                 "a payload descriptor for bytes [%llu, +%llu) lies outside "
                 "shared-memory segment %u of %llu bytes",
                 (unsigned long long)off, (unsigned long long)len, seg,
                 (unsigned long long)s->map_len[seg]);
        return HS_ERR_PROTO;
    }
    return HS_OK;
}

hs_status_t hs__shm_pending_add(shm_conn_t *s, hs_tp_send_cb cb, void *cb_arg, uint64_t *token)
{
    if (s->n_pending == s->cap_pending) {
        uint32_t ncap = s->cap_pending ? s->cap_pending * 2 : 16;
        shm_pending_t *n = realloc(s->pending, ncap * sizeof *n);
        if (!n) return HS_ERR_NOMEM;
        s->pending = n;
        s->cap_pending = ncap;
    }
    uint64_t t = ++s->next_token;
    s->pending[s->n_pending++] = (shm_pending_t){.token = t, .cb = cb, .cb_arg = cb_arg};
    *token = t;
    return HS_OK;
}

bool hs__shm_pending_take(shm_conn_t *s, uint64_t token, shm_pending_t *out)
{
    for (uint32_t i = 0; i < s->n_pending; i++) {
        if (s->pending[i].token != token) continue;
        *out = s->pending[i];
        memmove(s->pending + i, s->pending + i + 1, (s->n_pending - i - 1) * sizeof *out);
        s->n_pending--;
        return true;
    }
    return false;
}
