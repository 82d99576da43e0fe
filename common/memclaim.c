/* SPDX-License-Identifier: Apache-2.0 */
/* memclaim.c - the node's registry of host memory promised to caches.
 *
 * A cache is mapped without reserving and fills as batches arrive, so each
 * consumer checking its size alone against MemAvailable would let several
 * on one node promise the same free memory, and all be OOM-killed as their
 * caches fill. Each claim is a file in one folder per node
 * (hs_mem_claim_registry_set(); under the stand-in system's dev/shm when
 * hsflow_set_system_root() set one; default /dev/shm/hsflow-cache, else
 * $XDG_RUNTIME_DIR/hsflow-cache):
 *
 *   <pid>.<n>.claim    "pid PID\nbytes N\nwho TEXT\n", flock()ed (exclusive)
 *                      by its owner for as long as it lives
 *
 * A claim whose lock can be taken belongs to a process that is gone (the
 * kernel drops a dead process's locks): it is stale, ignored and removed.
 * A live claim still to be taken is its bytes less its process's resident
 * memory (VmRSS: what it has already taken is out of MemAvailable). Reading
 * the claims and adding one happen under an exclusive flock() of the
 * folder's .lock file, so of two consumers starting at once, the second
 * sees the first. */
#include "hs_common.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#define CLAIM_MAX_BYTES 4096 /* a claim file is read up to this much */
#define CLAIM_SCAN_MAX 4096  /* claim files looked at, at most */

struct hs_mem_claim {
    int lock_fd; /* the registry's .lock, held from open to commit */
    int own_fd;  /* our claim file, locked while we live; -1 before commit */
    char dir[512];
    char own_path[600];
    uint64_t others;       /* what the other live claims still have to take */
    unsigned n_others;     /* live claims of other processes */
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
    const char *root = hs_sys_root();
    if (*root) { /* a stand-in system (tests) is a node of its own */
        char dev[512];
        snprintf(dev, sizeof dev, "%.490s/dev", root);
        (void)mkdir(dev, 0755);
        snprintf(dev, sizeof dev, "%.490s/dev/shm", root);
        (void)mkdir(dev, 01777);
        return (size_t)snprintf(out, cap, "%s/hsflow-cache", dev) < cap;
    }
    struct stat st;
    if (stat("/dev/shm", &st) == 0 && S_ISDIR(st.st_mode))
        return (size_t)snprintf(out, cap, "/dev/shm/hsflow-cache") < cap;
    const char *xdg = getenv("XDG_RUNTIME_DIR");
    if (xdg && *xdg) return (size_t)snprintf(out, cap, "%s/hsflow-cache", xdg) < cap;
    return false;
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

/* One claim file of another process: counted when live, removed when
 * stale. The file is read bounded and parsed field by field. */
static void claim_scan_one(hs_mem_claim_t *m, const char *name, uint64_t *largest)
{
    char path[1100];
    snprintf(path, sizeof path, "%s/%s", m->dir, name);
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    if (fd < 0) return;
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return;
    }
    if (flock(fd, LOCK_SH | LOCK_NB) == 0) { /* nobody holds it: its owner is gone */
        if (unlink(path) == 0) hs_debug("memory registry: removed the stale claim %s", path);
        close(fd);
        return;
    }
    char buf[CLAIM_MAX_BYTES + 1];
    ssize_t n = read(fd, buf, CLAIM_MAX_BYTES);
    close(fd);
    if (n <= 0) return;
    buf[n] = 0;
    long pid = 0;
    uint64_t bytes = 0;
    char who[300] = "";
    char *save = NULL;
    for (char *line = strtok_r(buf, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        if (!strncmp(line, "pid ", 4))
            pid = strtol(line + 4, NULL, 10);
        else if (!strncmp(line, "bytes ", 6))
            bytes = strtoull(line + 6, NULL, 10);
        else if (!strncmp(line, "who ", 4))
            snprintf(who, sizeof who, "%s", line + 4);
    }
    if (pid <= 0 || bytes == 0) return;
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

hs_status_t hs_mem_claim_open(hs_mem_claim_t **out)
{
    hs_mem_claim_t *m = calloc(1, sizeof *m);
    if (!m) return HS_ERR_NOMEM;
    m->lock_fd = m->own_fd = -1;
    *out = m;
    if (!registry_dir(m->dir, sizeof m->dir)) {
        hs_debug("memory registry: no /dev/shm nor XDG_RUNTIME_DIR; other caches not counted");
        return HS_OK;
    }
    /* sticky and open to all, like /tmp: every user's consumers meet here */
    if (mkdir(m->dir, 01777) == 0) (void)chmod(m->dir, 01777);
    char lock[600];
    snprintf(lock, sizeof lock, "%s/.lock", m->dir);
    m->lock_fd = open(lock, O_RDONLY | O_CREAT | O_CLOEXEC, 0644);
    if (m->lock_fd >= 0 && flock(m->lock_fd, LOCK_EX) != 0) {
        close(m->lock_fd);
        m->lock_fd = -1;
    }
    if (m->lock_fd < 0) {
        hs_warn("memory registry %s: cannot use it (%m); the caches of other consumers on this "
                "node are not counted against --cache-gb",
                m->dir);
        m->dir[0] = 0;
        return HS_OK;
    }
    DIR *d = opendir(m->dir);
    if (!d) return HS_OK;
    uint64_t largest = 0;
    unsigned seen = 0;
    struct dirent *e;
    while ((e = readdir(d)) && seen < CLAIM_SCAN_MAX) {
        size_t len = strlen(e->d_name);
        if (len < 7 || strcmp(e->d_name + len - 6, ".claim")) continue;
        seen++;
        claim_scan_one(m, e->d_name, &largest);
    }
    closedir(d);
    return HS_OK;
}

uint64_t hs_mem_claim_others(const hs_mem_claim_t *m) { return m ? m->others : 0; }

const char *hs_mem_claim_others_text(const hs_mem_claim_t *m, unsigned *n_others)
{
    if (n_others) *n_others = m ? m->n_others : 0;
    return m && m->n_others ? m->others_text : "";
}

hs_status_t hs_mem_claim_commit(hs_mem_claim_t *m, uint64_t bytes, const char *who)
{
    if (!m || m->own_fd >= 0) return HS_ERR_INVALID;
    hs_status_t st = HS_OK;
    if (m->dir[0]) {
        static _Atomic unsigned counter;
        snprintf(m->own_path, sizeof m->own_path, "%s/%ld.%u.claim", m->dir, (long)getpid(),
                 counter++);
        int fd = open(m->own_path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
        if (fd < 0 || flock(fd, LOCK_EX | LOCK_NB) != 0) {
            hs_warn("memory registry: cannot record this cache's claim in %s (%m); other "
                    "consumers on this node will not count it",
                    m->own_path);
            if (fd >= 0) {
                close(fd);
                unlink(m->own_path);
            }
            m->own_path[0] = 0;
        } else {
            char text[512];
            int n = snprintf(text, sizeof text, "pid %ld\nbytes %" PRIu64 "\nwho %s\n",
                             (long)getpid(), bytes, who ? who : "");
            if (n < 0 || (size_t)n >= sizeof text) n = (int)sizeof text - 1;
            if (write(fd, text, (size_t)n) != n)
                hs_warn("memory registry: writing %s failed: %m", m->own_path);
            m->own_fd = fd;
        }
    }
    if (m->lock_fd >= 0) {
        close(m->lock_fd); /* lets the next consumer in, which now sees this claim */
        m->lock_fd = -1;
    }
    return st;
}

void hs_mem_claim_release(hs_mem_claim_t *m)
{
    if (!m) return;
    if (m->own_fd >= 0) {
        unlink(m->own_path);
        close(m->own_fd);
    }
    if (m->lock_fd >= 0) close(m->lock_fd);
    free(m);
}
