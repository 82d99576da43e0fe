/* SPDX-License-Identifier: Apache-2.0 */
/* dataset_hst.c - the .hst reader (the format is in dataset_int.h): an image
 * checked field by field before it is trusted, a file mapped read-only with
 * its arrays used in place, without a copy, and the guard that keeps a file
 * shrinking under its mapping from killing the process (hs_dataset_check). */
#include "dataset_int.h"
#include "hs_log.h"
#include "hs_checksum.h"
#include "hs_bytes.h"

#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the .hst reader maps little-endian arrays in place; big-endian hosts are not supported"
#endif

/* ---- a .hst file that shrinks under its mapping ----------------------------
 *
 * Reading a page of a mapping past the end of its file raises SIGBUS, which
 * would kill the whole process when someone truncates or rewrites the .hst in
 * place while it runs. The handler below catches faults inside registered
 * .hst mappings, backs the rest of that mapping with zero pages so the read
 * completes, and flags the mapping; hs_dataset_check() then fails every batch
 * read since, naming the file.
 *
 * The handler is installed only while a .hst mapping is registered: the
 * first registration saves the disposition in place and installs it, the
 * last unregistration puts the saved one back (unless the process installed
 * another meanwhile, which stays). In between, every other SIGBUS goes to the
 * saved handler, called from this one; a default or ignored disposition is
 * put back for a fault to come again and get it. */

#define HST_MAX_MAPS 64

static struct {
    atomic_uintptr_t start;
    size_t len;
    atomic_bool shrunk;
} hst_maps[HST_MAX_MAPS];
/* Under hst_lock (the handler only reads hst_old_bus and hst_page, which
 * are set before it is installed): */
static int hst_n_maps;               /* registered mappings */
static bool hst_installed;           /* hst_on_sigbus installed, hst_old_bus saved */
static struct sigaction hst_old_bus; /* the disposition it replaced */
static uintptr_t hst_page;
static pthread_mutex_t hst_lock = PTHREAD_MUTEX_INITIALIZER; /* registration only */

/* A SIGBUS that is not ours: to the disposition that was there before.
 * si_code <= 0: sent by kill() or sigqueue(), not raised by a fault. */
static void hst_chain(int sig, siginfo_t *si, void *uc)
{
    if (hst_old_bus.sa_handler == SIG_IGN && si->si_code <= 0) return;
    if (hst_old_bus.sa_handler == SIG_DFL || hst_old_bus.sa_handler == SIG_IGN) {
        /* a fault comes again on return and gets it (an ignored one kills);
         * a sent signal has to be sent again */
        sigaction(SIGBUS, &hst_old_bus, NULL);
        if (si->si_code <= 0) raise(sig);
    } else if (hst_old_bus.sa_flags & SA_SIGINFO) {
        hst_old_bus.sa_sigaction(sig, si, uc);
    } else {
        hst_old_bus.sa_handler(sig);
    }
}

static void hst_on_sigbus(int sig, siginfo_t *si, void *uc)
{
    uintptr_t a = (uintptr_t)si->si_addr;
    for (int i = 0; i < HST_MAX_MAPS && si->si_code > 0; i++) {
        uintptr_t s = atomic_load(&hst_maps[i].start);
        if (!s || a < s || a >= s + hst_maps[i].len) continue;
        uintptr_t pg = a & ~(hst_page - 1);
        if (mmap((void *)pg, s + hst_maps[i].len - pg, PROT_READ,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0) == MAP_FAILED)
            break; /* cannot patch it: as if unhandled */
        atomic_store(&hst_maps[i].shrunk, true);
        return; /* the faulting read now sees zeros */
    }
    hst_chain(sig, si, uc);
}

/* Saves the disposition in place and installs hst_on_sigbus (hst_lock
 * held). */
static bool hst_install_handler(void)
{
    hst_page = (uintptr_t)sysconf(_SC_PAGESIZE);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = hst_on_sigbus;
    sa.sa_flags = SA_SIGINFO;
    sigemptyset(&sa.sa_mask);
    if (sigaction(SIGBUS, NULL, &hst_old_bus) != 0 || sigaction(SIGBUS, &sa, NULL) != 0) {
        hs_warn("cannot install the SIGBUS handler that guards .hst mappings: %m");
        return false;
    }
    return true;
}

/* Puts back the disposition saved by hst_install_handler, unless hst_on_sigbus
 * is no longer the one in place (hst_lock held). */
static void hst_restore_handler(void)
{
    struct sigaction now;
    if (sigaction(SIGBUS, NULL, &now) == 0 && (now.sa_flags & SA_SIGINFO) &&
        now.sa_sigaction == hst_on_sigbus)
        sigaction(SIGBUS, &hst_old_bus, NULL);
}

/* Registers a mapping with the handler, installing it for the first one; -1
 * when every slot is taken (the dataset still works, unguarded). */
static int hst_register(void *map, size_t len)
{
    int slot = -1;
    pthread_mutex_lock(&hst_lock);
    for (int i = 0; i < HST_MAX_MAPS && slot < 0; i++) {
        if (atomic_load(&hst_maps[i].start)) continue;
        if (!hst_installed) hst_installed = hst_install_handler();
        hst_n_maps++;
        hst_maps[i].len = len;
        atomic_store(&hst_maps[i].shrunk, false);
        atomic_store(&hst_maps[i].start, (uintptr_t)map);
        slot = i;
    }
    pthread_mutex_unlock(&hst_lock);
    if (slot < 0) hs_warn("more than %d .hst files open: this one is not guarded", HST_MAX_MAPS);
    return slot;
}

void hs__hst_unregister(int slot)
{
    if (slot < 0) return;
    pthread_mutex_lock(&hst_lock);
    atomic_store(&hst_maps[slot].start, (uintptr_t)0);
    if (--hst_n_maps == 0 && hst_installed) {
        hst_restore_handler();
        hst_installed = false;
    }
    pthread_mutex_unlock(&hst_lock);
}

/* ---- .hst ----------------------------------------------------------------- */

#define HST_HINT "re-create it with `hs-data import IN.jsonl OUT.hst`"

hs_status_t hs__hst_parse(const char *path, const uint8_t *p, uint64_t size, hs_dataset_t **out)
{
    if (size < HS__HST_HEADER_BYTES) {
        hs_error("%s: truncated .hst file: %" PRIu64 " bytes, the header alone is %u; " HST_HINT,
                 path, size, HS__HST_HEADER_BYTES);
        return HS_ERR_FORMAT;
    }
    uint16_t version = hs_le16_load(p + 4), hbytes = hs_le16_load(p + 6);
    if (version != HS__HST_VERSION) {
        hs_error("%s: .hst version %u, this build reads version %u; " HST_HINT, path, version,
                 HS__HST_VERSION);
        return HS_ERR_FORMAT;
    }
    if (hbytes != HS__HST_HEADER_BYTES) {
        hs_error("%s: corrupt .hst header (header size %u, expected %u); " HST_HINT, path, hbytes,
                 HS__HST_HEADER_BYTES);
        return HS_ERR_FORMAT;
    }
    uint32_t crc = hs_crc32c(0, p, HS__HST_CRC_OFFSET);
    if (crc != hs_le32_load(p + HS__HST_CRC_OFFSET)) {
        hs_error("%s: corrupt .hst header (CRC-32C 0x%08x, stored 0x%08x); " HST_HINT, path, crc,
                 hs_le32_load(p + HS__HST_CRC_OFFSET));
        return HS_ERR_CHECKSUM;
    }
    uint64_t n = hs_le64_load(p + 8), total = hs_le64_load(p + 16), fp = hs_le64_load(p + 24);
    /* expected = 64 + 8(n+1) + 5T, computed without overflow */
    uint64_t expected = 0, a, b;
    bool overflow = __builtin_add_overflow(n, 1, &a) || __builtin_mul_overflow(a, 8, &a) ||
                    __builtin_mul_overflow(total, 5, &b) ||
                    __builtin_add_overflow(a, b, &expected) ||
                    __builtin_add_overflow(expected, HS__HST_HEADER_BYTES, &expected);
    if (n == 0 || overflow || expected != size) {
        hs_error("%s: .hst file is %" PRIu64 " bytes but its header says %" PRIu64
                 " sequences and %" PRIu64
                 " tokens (%s); the file is truncated or corrupt; " HST_HINT,
                 path, size, n, total,
                 n == 0                           ? "no sequences"
                 : (!overflow && expected < size) ? "trailing bytes"
                                                  : "that needs more bytes than the file has");
        return HS_ERR_FORMAT;
    }
    /* The index is copied out of the image before it is checked: the file
     * behind a mapping can be rewritten in place while it is used, and every
     * read of ids and mask is placed by these offsets, so they must be the
     * ones validated here (8 bytes per sequence of private memory). */
    const int32_t *ids = (const int32_t *)(p + HS__HST_HEADER_BYTES + (n + 1) * 8);
    const uint8_t *mask = (const uint8_t *)(ids + total);
    if (n + 1 > SIZE_MAX / sizeof(uint64_t)) return HS_ERR_NOMEM;
    uint64_t *offsets = malloc((size_t)(n + 1) * sizeof(uint64_t));
    if (!offsets) return HS_ERR_NOMEM;
    memcpy(offsets, p + HS__HST_HEADER_BYTES, (size_t)(n + 1) * sizeof(uint64_t));
    hs_status_t st = HS_ERR_FORMAT;
    if (offsets[0] != 0 || offsets[n] != total) {
        hs_error("%s: corrupt .hst offsets (first %" PRIu64 ", last %" PRIu64
                 ", expected 0 and %" PRIu64 "); " HST_HINT,
                 path, offsets[0], offsets[n], total);
        goto err_free;
    }
    for (uint64_t i = 0; i < n; i++) {
        if (offsets[i + 1] <= offsets[i] || offsets[i + 1] > total ||
            offsets[i + 1] - offsets[i] > UINT32_MAX) {
            hs_error("%s: corrupt .hst offsets: sequence %" PRIu64 " spans [%" PRIu64 ", %" PRIu64
                     ") of %" PRIu64 " tokens (offsets must increase, each sequence 1..2^32-1 "
                     "tokens); " HST_HINT,
                     path, i, offsets[i], offsets[i + 1], total);
            goto err_free;
        }
    }
    uint64_t fp_now = hs__body_fingerprint(offsets, n, ids, mask, total);
    if (fp_now != fp) {
        hs_error("%s: .hst content checksum mismatch (XXH3 0x%016" PRIx64
                 ", header says 0x%016" PRIx64 "): the file is corrupt; " HST_HINT,
                 path, fp_now, fp);
        st = HS_ERR_CHECKSUM;
        goto err_free;
    }
    /* values: a file with a valid checksum but written by a faulty tool */
    for (uint64_t t = 0; t < total; t++) {
        if (ids[t] < 0 || mask[t] > 1) {
            hs_error("%s: token %" PRIu64 " has input_id %d / loss_mask %u (ids must be >= 0, "
                     "mask 0 or 1); " HST_HINT,
                     path, t, ids[t], mask[t]);
            goto err_free;
        }
    }

    hs_dataset_t *ds = hs__dataset_alloc(HS_DATASET_HST);
    if (!ds) {
        st = HS_ERR_NOMEM;
        goto err_free;
    }
    ds->n = n;
    ds->total = total;
    ds->offsets = ds->own_offsets = offsets;
    ds->ids = ids;
    ds->mask = mask;
    ds->fingerprint = fp;
    *out = ds;
    return HS_OK;

err_free:
    free(offsets);
    return st;
}

hs_status_t hs__dataset_load_hst(const char *path, int fd, hs_dataset_t **out)
{
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        hs_error("%s: stat failed: %m", path);
        return HS_ERR_IO;
    }
    uint64_t size = (uint64_t)sb.st_size;
    if (size < HS__HST_HEADER_BYTES) return hs__hst_parse(path, NULL, size, out); /* says so */
    if (size > SIZE_MAX) return HS_ERR_NOMEM;
    void *map = mmap(NULL, (size_t)size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (map == MAP_FAILED) {
        hs_error("%s: mmap of %" PRIu64 " bytes failed: %m", path, size);
        return HS_ERR_IO;
    }
    int slot = hst_register(map, (size_t)size); /* reading it may already fault */
    hs_dataset_t *ds;
    hs_status_t st = hs__hst_parse(path, map, size, &ds);
    if (st != HS_OK) {
        hs__hst_unregister(slot);
        munmap(map, (size_t)size);
        return st;
    }
    ds->map = map;
    ds->map_len = (size_t)size;
    ds->map_slot = slot;
    ds->map_release = hs__hst_unregister;
    ds->opened = sb;
    ds->fd = fcntl(fd, F_DUPFD_CLOEXEC, 0); /* kept to notice changes; -1 only skips that */
    ds->path = strdup(path);
    if (!ds->path) {
        hs_dataset_close(ds);
        return HS_ERR_NOMEM;
    }
    if (slot >= 0 && atomic_load(&hst_maps[slot].shrunk)) {
        hs_error("%s: the file shrank while it was being validated; " HST_HINT, path);
        hs_dataset_close(ds);
        return HS_ERR_IO;
    }
    *out = ds;
    return HS_OK;
}

hs_status_t hs_dataset_check(const hs_dataset_t *ds)
{
    if (!ds || ds->format != HS_DATASET_HST) return HS_OK;
    bool shrunk = ds->map_slot >= 0 && atomic_load(&hst_maps[ds->map_slot].shrunk);
    struct stat now;
    bool changed =
        ds->fd >= 0 && fstat(ds->fd, &now) == 0 &&
        (now.st_size != ds->opened.st_size || now.st_mtim.tv_sec != ds->opened.st_mtim.tv_sec ||
         now.st_mtim.tv_nsec != ds->opened.st_mtim.tv_nsec ||
         now.st_ctim.tv_sec != ds->opened.st_ctim.tv_sec ||
         now.st_ctim.tv_nsec != ds->opened.st_ctim.tv_nsec);
    if (!shrunk && !changed) return HS_OK;
    if (!atomic_exchange(&((hs_dataset_t *)ds)->reported, true)) {
        long long size_now = changed ? (long long)now.st_size : -1;
        hs_error("%s: the file was %s while in use (%lld bytes when opened%s%lld); what is read "
                 "from it can no longer be trusted. Restore it and restart; to replace a .hst "
                 "file, write a new one and rename it over the old (hs-data import does), never "
                 "truncate or rewrite it in place",
                 ds->path, shrunk ? "truncated" : "modified", (long long)ds->opened.st_size,
                 size_now >= 0 ? ", now " : "", size_now >= 0 ? size_now : 0);
    }
    return HS_ERR_IO;
}
