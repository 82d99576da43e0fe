/* SPDX-License-Identifier: Apache-2.0 */
/* memclaim.c - the node's registry of host memory promised to caches.
 *
 * A cache is mapped without reserving and fills as batches arrive, so each
 * consumer checking its size alone against MemAvailable would let several
 * on one node promise the same free memory, and all be OOM-killed as their
 * caches fill. Each claim is a file in one folder per user and node
 * (hs_mem_claim_registry_set(); under the stand-in system's dev/shm when
 * hsflow_set_system_root() set one; default /dev/shm/hsflow-cache-<uid>,
 * else $XDG_RUNTIME_DIR/hsflow-cache):
 *
 *   <pid>.<n>.claim    "pid PID\nbytes N\nwho TEXT\n", flock()ed (exclusive)
 *                      by its owner for as long as it lives
 *
 * The folder is the user's own: made with mode 0700, and used only when it
 * is a folder (not a link) owned by this user, so no other local user can
 * lock it, plant claims in it or point its files elsewhere; one that fails
 * is warned about and not used. Every file in it is opened inside it, with
 * O_NOFOLLOW | O_NONBLOCK, and used only when it is a regular file of this
 * user; a claim is at most CLAIM_MAX_BYTES long, its figures bounded and
 * its text reduced to printable ASCII. Every entry is looked at (none can
 * hide a claim behind others): what is not a claim is skipped and counted.
 *
 * A claim whose lock can be taken belongs to a process that is gone (the
 * kernel drops a dead process's locks): it is stale, ignored and removed.
 * A live claim still to be taken is its bytes less its process's resident
 * memory (VmRSS: what it has already taken is out of MemAvailable). Reading
 * the claims and adding one happen under an exclusive flock() of the
 * folder's .lock file, so of two consumers starting at once, the second
 * sees the first; that lock is waited for at most LOCK_WAIT_MS. */
#include "hsflow.h"
#include "hs_log.h"
#include "hs_time.h"
#include "hs_memclaim.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/types.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define CLAIM_MAX_BYTES 4096         /* a claim file is at most this long */
#define CLAIM_MAX_CLAIM (1ull << 50) /* 1 PiB: more is no cache of a node */
#define CLAIM_WHO_MAX 200            /* characters of a claim's text kept */
#define LOCK_WAIT_MS 5000            /* the registry's lock is waited for this long */
#define LOCK_POLL_MS 5

struct hs_mem_claim {
    int dir_fd;  /* the registry's folder, checked; open from open to commit */
    int lock_fd; /* the registry's .lock, held from open to commit */
    int own_fd;  /* our claim file, locked while we live; -1 before commit */
    char dir[512];
    char own_path[600];
    uint64_t others;       /* what the other live claims still have to take */
    unsigned n_others;     /* live claims of other processes */
    unsigned n_skipped;    /* entries that are not claims of this user */
    char others_text[600]; /* the largest of them, described */
};

static char g_registry[512]; /* hs_mem_claim_registry_set(); "" = the default */

void hs_mem_claim_registry_set(const char *dir)
{
    snprintf(g_registry, sizeof g_registry, "%s", dir ? dir : "");
}

/* The registry's folder into out; false when none can be named. */
static bool registry_dir(char *out, size_t cap)
{
    if (g_registry[0]) return (size_t)snprintf(out, cap, "%s", g_registry) < cap;
    unsigned uid = (unsigned)geteuid();
    const char *root = hs_sys_root();
    if (*root) { /* a stand-in system (tests) is a node of its own */
        char dev[512];
        snprintf(dev, sizeof dev, "%.490s/dev", root);
        (void)mkdir(dev, 0755);
        snprintf(dev, sizeof dev, "%.490s/dev/shm", root);
        (void)mkdir(dev, 01777);
        return (size_t)snprintf(out, cap, "%s/hsflow-cache-%u", dev, uid) < cap;
    }
    struct stat st;
    if (stat("/dev/shm", &st) == 0 && S_ISDIR(st.st_mode))
        return (size_t)snprintf(out, cap, "/dev/shm/hsflow-cache-%u", uid) < cap;
    const char *xdg = getenv("XDG_RUNTIME_DIR");
    if (xdg && *xdg) return (size_t)snprintf(out, cap, "%s/hsflow-cache", xdg) < cap;
    return false;
}

/* Opens the registry's folder, making it (0700) when missing: a folder,
 * not a link, owned by this user and closed to others. -1, warned about,
 * when it is not one. */
static int registry_open_dir(const char *dir)
{
    uid_t uid = geteuid();
    if (mkdir(dir, 0700) != 0 && errno != EEXIST) {
        hs_warn("memory registry %s: cannot make it (%m); the caches of other consumers on this "
                "node are not counted against --cache-gb",
                dir);
        return -1;
    }
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0) {
        hs_warn("memory registry %s: cannot open it (%m: a link or not a folder?); the caches of "
                "other consumers on this node are not counted against --cache-gb; remove it, or "
                "set HS_MEM_REGISTRY to a folder of your own",
                dir);
        if (fd >= 0) close(fd);
        return -1;
    }
    if (st.st_uid != uid) {
        hs_warn("memory registry %s: owned by uid %u, not by this user (uid %u), so its claims "
                "cannot be trusted; the caches of other consumers on this node are not counted "
                "against --cache-gb; remove it (it is not this user's), or set HS_MEM_REGISTRY "
                "to a folder of your own",
                dir, (unsigned)st.st_uid, (unsigned)uid);
        close(fd);
        return -1;
    }
    if ((st.st_mode & 077) && fchmod(fd, 0700) == 0)
        hs_info("memory registry %s: was open to others (mode %03o), now 0700", dir,
                (unsigned)(st.st_mode & 0777));
    return fd;
}

/* Opens `name` inside the registry: never through a link, never waiting on
 * a FIFO, and only a regular file of this user (O_NONBLOCK cleared then).
 * -1 otherwise (errno ENOENT when it is missing). */
static int registry_file_open(int dir_fd, const char *name, int flags, mode_t mode)
{
    int fd = openat(dir_fd, name, flags | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, mode);
    if (fd < 0) return -1;
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != geteuid() ||
        st.st_size > CLAIM_MAX_BYTES || fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK) != 0) {
        close(fd);
        errno = EINVAL;
        return -1;
    }
    return fd;
}

/* Takes the registry's lock, waiting at most LOCK_WAIT_MS. */
static int registry_lock(hs_mem_claim_t *m)
{
    int fd = registry_file_open(m->dir_fd, ".lock", O_RDWR | O_CREAT, 0600);
    if (fd < 0) {
        hs_warn("memory registry %s: its .lock %s; the caches of other consumers on this node are "
                "not counted against --cache-gb; remove it",
                m->dir,
                errno == ELOOP    ? "is a symbolic link"
                : errno == EINVAL ? "is not a regular file of this user (a FIFO, device, folder or "
                                    "another user's file)"
                                  : "cannot be made");
        return -1;
    }
    const uint64_t deadline = hs_now_ns() + LOCK_WAIT_MS * 1000000ull;
    for (;;) {
        if (flock(fd, LOCK_EX | LOCK_NB) == 0) return fd;
        if (errno != EWOULDBLOCK && errno != EINTR) {
            hs_warn("memory registry %s: cannot lock it (%m); the caches of other consumers on "
                    "this node are not counted against --cache-gb",
                    m->dir);
            break;
        }
        if (hs_now_ns() >= deadline) {
            hs_warn("memory registry %s: its lock has been held by another process of this user "
                    "for over %u s (a consumer stuck while it starts?); the caches of other "
                    "consumers on this node are not counted against --cache-gb",
                    m->dir, LOCK_WAIT_MS / 1000);
            break;
        }
        struct timespec pause = {0, LOCK_POLL_MS * 1000000L};
        nanosleep(&pause, NULL);
    }
    close(fd);
    return -1;
}

/* Resident bytes of process `pid` (VmRSS), 0 when unknown. Read from the
 * same system as MemAvailable: under a stand-in system (hs_sys_root(),
 * tests) its own /proc, so the figures of this process cannot leak in. */
static uint64_t process_rss(long pid)
{
    char path[600], line[256];
    snprintf(path, sizeof path, "%.500s/proc/%ld/status", hs_sys_root(), pid);
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    uint64_t kb = 0;
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, "VmRSS:", 6)) {
            kb = strtoull(line + 6, NULL, 10);
            break;
        }
    fclose(f);
    return kb <= UINT64_MAX / 1024 ? kb * 1024 : 0;
}

/* `s` is 1 to `max_digits` decimal digits, then `end`; the value into *out
 * (no overflow: at most 19 digits). */
static bool parse_digits(const char *s, unsigned max_digits, const char *end, uint64_t *out)
{
    uint64_t v = 0;
    unsigned n = 0;
    for (; *s >= '0' && *s <= '9'; s++, n++) {
        if (n == max_digits) return false;
        v = v * 10 + (uint64_t)(*s - '0');
    }
    if (n == 0 || strcmp(s, end) != 0) return false;
    *out = v;
    return true;
}

/* A claim's name, <pid>.<n>.claim: its pid into *pid. */
static bool claim_name(const char *name, long *pid)
{
    const char *dot = strchr(name, '.');
    char head[16];
    uint64_t v, n;
    if (!dot || (size_t)(dot - name) >= sizeof head) return false;
    memcpy(head, name, (size_t)(dot - name));
    head[dot - name] = 0;
    if (!parse_digits(head, 10, "", &v) || v == 0 || v > INT32_MAX) return false;
    if (!parse_digits(dot + 1, 10, ".claim", &n)) return false;
    *pid = (long)v;
    return true;
}

/* `text` as printable ASCII (anything else becomes '?'), at most `cap`-1. */
static void sanitise(char *out, size_t cap, const char *text)
{
    size_t i = 0;
    for (; text[i] && i + 1 < cap; i++)
        out[i] = text[i] >= 0x20 && text[i] < 0x7f ? text[i] : '?';
    out[i] = 0;
}

/* A claim's content, checked: its pid (the name's), bytes (1 .. 1 PiB) and
 * text (sanitised). False for anything else. */
static bool claim_parse(char *buf, long name_pid, uint64_t *bytes, char *who, size_t whocap)
{
    uint64_t pid = 0, n = 0;
    bool have_pid = false, have_bytes = false;
    who[0] = 0;
    char *save = NULL;
    for (char *line = strtok_r(buf, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        if (!strncmp(line, "pid ", 4))
            have_pid = parse_digits(line + 4, 10, "", &pid);
        else if (!strncmp(line, "bytes ", 6))
            have_bytes = parse_digits(line + 6, 19, "", &n);
        else if (!strncmp(line, "who ", 4))
            sanitise(who, whocap, line + 4);
    }
    if (!have_pid || !have_bytes || pid != (uint64_t)name_pid || n == 0 || n > CLAIM_MAX_CLAIM)
        return false;
    *bytes = n;
    return true;
}

/* One entry of the registry: a live claim is counted, a stale one removed,
 * anything else skipped and counted. */
static void claim_scan_one(hs_mem_claim_t *m, const char *name, uint64_t *largest)
{
    long pid;
    if (!strcmp(name, ".") || !strcmp(name, "..") || !strcmp(name, ".lock")) return;
    if (!claim_name(name, &pid)) {
        m->n_skipped++;
        return;
    }
    int fd = registry_file_open(m->dir_fd, name, O_RDONLY, 0);
    if (fd < 0) {
        if (errno != ENOENT) m->n_skipped++; /* gone meanwhile: its owner released it */
        return;
    }
    if (flock(fd, LOCK_SH | LOCK_NB) == 0) { /* nobody holds it: its owner is gone */
        if (unlinkat(m->dir_fd, name, 0) == 0)
            hs_debug("memory registry: removed the stale claim %s/%s", m->dir, name);
        close(fd);
        return;
    }
    char buf[CLAIM_MAX_BYTES + 1];
    ssize_t n = read(fd, buf, CLAIM_MAX_BYTES);
    close(fd);
    uint64_t bytes;
    char who[CLAIM_WHO_MAX + 1];
    if (n > 0) buf[n] = 0;
    if (n <= 0 || !claim_parse(buf, pid, &bytes, who, sizeof who)) {
        m->n_skipped++;
        return;
    }
    uint64_t rss = process_rss(pid);
    uint64_t pending = bytes > rss ? bytes - rss : 0;
    m->others = m->others + pending < m->others ? UINT64_MAX : m->others + pending;
    m->n_others++;
    if (pending >= *largest) {
        *largest = pending;
        const double GiB = (double)(1ull << 30);
        snprintf(m->others_text, sizeof m->others_text,
                 "%s (pid %ld) claimed %.2f GiB, %.2f GiB of it still to fill", who[0] ? who : "?",
                 pid, (double)bytes / GiB, (double)pending / GiB);
    }
}

/* Reads every entry of the registry (see the top). */
static void registry_scan(hs_mem_claim_t *m)
{
    int fd = dup(m->dir_fd);
    DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
    if (!d) {
        if (fd >= 0) close(fd);
        hs_warn("memory registry %s: cannot list it (%m); the caches of other consumers on this "
                "node are not counted against --cache-gb",
                m->dir);
        return;
    }
    uint64_t largest = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        claim_scan_one(m, e->d_name, &largest);
    closedir(d);
    if (m->n_skipped)
        hs_warn("memory registry %s: skipped %u entr%s that %s no claim of this user's consumers "
                "(remove %s)",
                m->dir, m->n_skipped, m->n_skipped == 1 ? "y" : "ies",
                m->n_skipped == 1 ? "is" : "are", m->n_skipped == 1 ? "it" : "them");
}

hs_status_t hs_mem_claim_open(hs_mem_claim_t **out)
{
    hs_mem_claim_t *m = calloc(1, sizeof *m);
    if (!m) return HS_ERR_NOMEM;
    m->dir_fd = m->lock_fd = m->own_fd = -1;
    *out = m;
    if (!registry_dir(m->dir, sizeof m->dir)) {
        hs_debug("memory registry: no /dev/shm nor XDG_RUNTIME_DIR; other caches not counted");
        m->dir[0] = 0;
        return HS_OK;
    }
    m->dir_fd = registry_open_dir(m->dir);
    if (m->dir_fd >= 0) m->lock_fd = registry_lock(m);
    if (m->lock_fd < 0) {
        if (m->dir_fd >= 0) close(m->dir_fd);
        m->dir_fd = -1;
        m->dir[0] = 0;
        return HS_OK;
    }
    registry_scan(m);
    return HS_OK;
}

uint64_t hs_mem_claim_others(const hs_mem_claim_t *m) { return m ? m->others : 0; }

const char *hs_mem_claim_others_text(const hs_mem_claim_t *m, unsigned *n_others)
{
    if (n_others) *n_others = m ? m->n_others : 0;
    return m && m->n_others ? m->others_text : "";
}

unsigned hs_mem_claim_skipped(const hs_mem_claim_t *m) { return m ? m->n_skipped : 0; }

const char *hs_mem_claim_dir(const hs_mem_claim_t *m) { return m ? m->dir : ""; }

hs_status_t hs_mem_claim_commit(hs_mem_claim_t *m, uint64_t bytes, const char *who)
{
    if (!m || m->own_fd >= 0) return HS_ERR_INVALID;
    if (m->dir_fd >= 0) {
        static _Atomic unsigned counter;
        char name[64];
        snprintf(name, sizeof name, "%ld.%u.claim", (long)getpid(), counter++);
        snprintf(m->own_path, sizeof m->own_path, "%s/%s", m->dir, name);
        int fd =
            openat(m->dir_fd, name, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
        if (fd < 0 || flock(fd, LOCK_EX | LOCK_NB) != 0) {
            hs_warn("memory registry: cannot record this cache's claim in %s (%m); other "
                    "consumers on this node will not count it",
                    m->own_path);
            if (fd >= 0) {
                close(fd);
                unlinkat(m->dir_fd, name, 0);
            }
            m->own_path[0] = 0;
        } else {
            char text[512], safe[CLAIM_WHO_MAX + 1];
            sanitise(safe, sizeof safe, who ? who : "");
            int n =
                snprintf(text, sizeof text, "pid %ld\nbytes %" PRIu64 "\nwho %s\n", (long)getpid(),
                         bytes < CLAIM_MAX_CLAIM ? bytes : (uint64_t)CLAIM_MAX_CLAIM, safe);
            if (n < 0 || (size_t)n >= sizeof text) n = (int)sizeof text - 1;
            if (write(fd, text, (size_t)n) != n)
                hs_warn("memory registry: writing %s failed: %m", m->own_path);
            m->own_fd = fd;
        }
        close(m->dir_fd);
        m->dir_fd = -1;
    }
    if (m->lock_fd >= 0) {
        close(m->lock_fd); /* lets the next consumer in, which now sees this claim */
        m->lock_fd = -1;
    }
    return HS_OK;
}

void hs_mem_claim_release(hs_mem_claim_t *m)
{
    if (!m) return;
    if (m->own_fd >= 0) {
        unlink(m->own_path); /* in a folder of this user's alone */
        close(m->own_fd);
    }
    if (m->lock_fd >= 0) close(m->lock_fd);
    if (m->dir_fd >= 0) close(m->dir_fd);
    free(m);
}
