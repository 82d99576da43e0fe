/* dataset.c - load token datasets from JSONL or .hst files, write .hst.
 *
 * .hst ("hsflow tokens") file format, version 1, all little-endian
 * (docs/hst-format.md has the same with examples):
 *
 *   off  size        field
 *   0    4           magic "HSTK"
 *   4    2           version (1)
 *   6    2           header size in bytes (64)
 *   8    8           n: number of sequences (>= 1)
 *   16   8           T: total tokens
 *   24   8           fingerprint: XXH3-64 (seed 0) of the body below
 *   32   28          reserved, zero
 *   60   4           CRC-32C of header bytes [0, 60)
 *   64   8 (n+1)     offsets (u64): offsets[0] = 0, strictly increasing,
 *                    offsets[n] = T; sequence i is tokens [offsets[i], offsets[i+1])
 *   ..   4 T         input_ids (i32, each >= 0)
 *   ..   T           loss_mask (u8, each 0 or 1)
 *
 * The file is exactly 64 + 8(n+1) + 5T bytes. The body (everything after the
 * header) is the dataset's canonical form, so its XXH3 is both the integrity
 * check and the dataset fingerprint, identical for the JSONL the file was
 * imported from. Loading maps the file read-only and checks every field
 * before trusting it; the arrays are used in place, without a copy. */
#include "dataset_int.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#define XXH_STATIC_LINKING_ONLY /* XXH3_state_t on the stack */
#include <xxhash.h>

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the .hst reader maps little-endian arrays in place; big-endian hosts are not supported"
#endif

#define HST_MAGIC "HSTK"
#define HST_VERSION 1u
#define HST_HEADER_BYTES 64u
#define HST_CRC_OFFSET 60u

struct hs_dataset {
    hs_dataset_format_t format;
    uint64_t n;
    uint64_t total;
    const uint64_t *offsets; /* n+1 entries */
    const int32_t *ids;      /* total entries */
    const uint8_t *mask;     /* total entries */
    uint64_t fingerprint;
    /* .hst: the read-only mapping the arrays point into, and the file
     * behind it (see hs_dataset_check) */
    void *map;
    size_t map_len;
    int map_slot; /* index in hst_maps, -1 = none */
    int fd;
    struct stat opened; /* size and mtime when validated */
    char *path;
    atomic_bool reported;
    /* JSONL / arrays: heap storage the arrays point into */
    uint64_t *own_offsets;
    int32_t *own_ids;
    uint8_t *own_mask;
};

/* ---- small helpers ------------------------------------------------------ */

static uint64_t load_u64(const uint8_t *p)
{
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}

static uint32_t load_u32(const uint8_t *p)
{
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

static uint16_t load_u16(const uint8_t *p)
{
    uint16_t v;
    memcpy(&v, p, 2);
    return v;
}

/* Grows *p (elements of `elem` bytes, capacity *cap) to hold `need`. */
static hs_status_t grow(void **p, size_t *cap, size_t need, size_t elem)
{
    if (need <= *cap) return HS_OK;
    size_t ncap = *cap ? *cap : 1024;
    while (ncap < need) {
        if (ncap > SIZE_MAX / 2 / elem) return HS_ERR_NOMEM;
        ncap *= 2;
    }
    void *np = realloc(*p, ncap * elem);
    if (!np) return HS_ERR_NOMEM;
    *p = np;
    *cap = ncap;
    return HS_OK;
}

static uint64_t body_fingerprint(const uint64_t *offsets, uint64_t n, const int32_t *ids,
                                 const uint8_t *mask, uint64_t total)
{
    XXH3_state_t st;
    XXH3_64bits_reset(&st);
    XXH3_64bits_update(&st, offsets, (size_t)(n + 1) * sizeof(uint64_t));
    XXH3_64bits_update(&st, ids, (size_t)total * sizeof(int32_t));
    XXH3_64bits_update(&st, mask, (size_t)total);
    return XXH3_64bits_digest(&st);
}

static hs_dataset_t *dataset_alloc(hs_dataset_format_t format)
{
    hs_dataset_t *ds = calloc(1, sizeof(*ds));
    if (ds) {
        ds->format = format;
        ds->map_slot = -1;
        ds->fd = -1;
    }
    return ds;
}

/* ---- a .hst file that shrinks under its mapping ----------------------------
 *
 * Reading a page of a mapping past the end of its file raises SIGBUS, which
 * would kill the whole process when someone truncates or rewrites the .hst in
 * place while it runs. The handler below catches faults inside registered
 * .hst mappings, backs the rest of that mapping with zero pages so the read
 * completes, and flags the mapping; hs_dataset_check() then fails every batch
 * read since, naming the file. Faults elsewhere go to the handler that was
 * installed before. */

#define HST_MAX_MAPS 64

static struct {
    atomic_uintptr_t start;
    size_t len;
    atomic_bool shrunk;
} hst_maps[HST_MAX_MAPS];
static struct sigaction hst_old_bus;
static uintptr_t hst_page;
static pthread_once_t hst_once = PTHREAD_ONCE_INIT;
static pthread_mutex_t hst_lock = PTHREAD_MUTEX_INITIALIZER; /* registration only */

static void hst_on_sigbus(int sig, siginfo_t *si, void *uc)
{
    (void)uc;
    uintptr_t a = (uintptr_t)si->si_addr;
    for (int i = 0; i < HST_MAX_MAPS; i++) {
        uintptr_t s = atomic_load(&hst_maps[i].start);
        if (!s || a < s || a >= s + hst_maps[i].len) continue;
        uintptr_t pg = a & ~(hst_page - 1);
        if (mmap((void *)pg, s + hst_maps[i].len - pg, PROT_READ,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0) == MAP_FAILED)
            break; /* cannot patch it: die as if unhandled */
        atomic_store(&hst_maps[i].shrunk, true);
        return; /* the faulting read now sees zeros */
    }
    /* Not ours: restore the previous disposition; the access faults again
     * and gets it. */
    (void)sig;
    sigaction(SIGBUS, &hst_old_bus, NULL);
}

static void hst_install_handler(void)
{
    hst_page = (uintptr_t)sysconf(_SC_PAGESIZE);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = hst_on_sigbus;
    sa.sa_flags = SA_SIGINFO;
    sigemptyset(&sa.sa_mask);
    if (sigaction(SIGBUS, &sa, &hst_old_bus) != 0)
        hs_warn("cannot install the SIGBUS handler that guards .hst mappings: %m");
}

/* Registers a mapping with the handler; -1 when every slot is taken (the
 * dataset still works, unguarded). */
static int hst_register(void *map, size_t len)
{
    pthread_once(&hst_once, hst_install_handler);
    int slot = -1;
    pthread_mutex_lock(&hst_lock);
    for (int i = 0; i < HST_MAX_MAPS && slot < 0; i++) {
        if (atomic_load(&hst_maps[i].start)) continue;
        hst_maps[i].len = len;
        atomic_store(&hst_maps[i].shrunk, false);
        atomic_store(&hst_maps[i].start, (uintptr_t)map);
        slot = i;
    }
    pthread_mutex_unlock(&hst_lock);
    if (slot < 0) hs_warn("more than %d .hst files open: this one is not guarded", HST_MAX_MAPS);
    return slot;
}

static void hst_unregister(int slot)
{
    if (slot < 0) return;
    pthread_mutex_lock(&hst_lock);
    atomic_store(&hst_maps[slot].start, (uintptr_t)0);
    pthread_mutex_unlock(&hst_lock);
}

/* ---- JSONL ---------------------------------------------------------------- */

typedef struct {
    uint64_t *offsets;
    size_t offsets_cap;
    int32_t *ids;
    size_t ids_cap;
    uint8_t *mask;
    size_t mask_cap;
    uint64_t n, total;
} jsonl_build_t;

#define JSONL_HINT                                                                                 \
    "fix or remove this line (each line must be a JSON object such as "                            \
    "{\"input_ids\": [1, 2, 3], \"loss_mask\": [0, 1, 1]}, loss_mask optional)"

static void jsonl_fail(const char *path, uint64_t lineno, const char *what)
{
    hs_error("%s:%" PRIu64 ": %s; " JSONL_HINT, path, lineno, what);
}

/* Short printable form of a JSON value for error messages. */
static void json_brief(const cJSON *item, char *buf, size_t cap)
{
    char *s = cJSON_PrintUnformatted(item);
    if (!s) {
        snprintf(buf, cap, "?");
        return;
    }
    if (strlen(s) >= cap && cap > 4) {
        memcpy(buf, s, cap - 4);
        memcpy(buf + cap - 4, "...", 4);
    } else {
        snprintf(buf, cap, "%s", s);
    }
    cJSON_free(s);
}

/* One non-blank line: appends its sequence to b, or logs what is wrong. */
static hs_status_t jsonl_parse_line(const char *path, uint64_t lineno, const char *line,
                                    jsonl_build_t *b)
{
    char what[256], brief[48];
    hs_status_t st = HS_ERR_FORMAT;
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithOpts(line, &end, 1);
    if (!root) {
        size_t col = end ? (size_t)(end - line) + 1 : 1;
        snprintf(what, sizeof(what), "not valid JSON (error near column %zu)", col);
        jsonl_fail(path, lineno, what);
        return HS_ERR_FORMAT;
    }
    if (!cJSON_IsObject(root)) {
        jsonl_fail(path, lineno, "the line is not a JSON object");
        goto out;
    }
    const cJSON *ids = cJSON_GetObjectItemCaseSensitive(root, "input_ids");
    if (!ids) {
        jsonl_fail(path, lineno, "\"input_ids\" is missing");
        goto out;
    }
    if (!cJSON_IsArray(ids)) {
        jsonl_fail(path, lineno, "\"input_ids\" is not an array");
        goto out;
    }
    size_t len = (size_t)cJSON_GetArraySize(ids);
    if (len == 0) {
        jsonl_fail(path, lineno,
                   "\"input_ids\" is empty (every sequence needs at least one token)");
        goto out;
    }
    const cJSON *mask = cJSON_GetObjectItemCaseSensitive(root, "loss_mask");
    if (mask && cJSON_IsNull(mask)) mask = NULL;
    if (mask && !cJSON_IsArray(mask)) {
        jsonl_fail(path, lineno, "\"loss_mask\" is not an array");
        goto out;
    }
    if (mask && (size_t)cJSON_GetArraySize(mask) != len) {
        snprintf(what, sizeof(what), "loss_mask has %d entries, input_ids has %zu",
                 cJSON_GetArraySize(mask), len);
        jsonl_fail(path, lineno, what);
        goto out;
    }

    if (grow((void **)&b->ids, &b->ids_cap, b->total + len, sizeof(int32_t)) ||
        grow((void **)&b->mask, &b->mask_cap, b->total + len, 1) ||
        grow((void **)&b->offsets, &b->offsets_cap, b->n + 2, sizeof(uint64_t))) {
        hs_error("%s:%" PRIu64 ": out of memory after %" PRIu64 " tokens", path, lineno, b->total);
        st = HS_ERR_NOMEM;
        goto out;
    }
    int32_t *dst_ids = b->ids + b->total;
    uint8_t *dst_mask = b->mask + b->total;
    size_t k = 0;
    for (const cJSON *it = ids->child; it; it = it->next, k++) {
        double d = cJSON_IsNumber(it) ? it->valuedouble : -1.0;
        if (!cJSON_IsNumber(it) || !(d >= 0.0 && d < 2147483648.0) || d != floor(d)) {
            json_brief(it, brief, sizeof(brief));
            snprintf(what, sizeof(what),
                     "input_ids[%zu] is not an integer in 0..2147483647 (got %s)", k, brief);
            jsonl_fail(path, lineno, what);
            goto out;
        }
        dst_ids[k] = (int32_t)d;
    }
    k = 0;
    if (mask) {
        for (const cJSON *it = mask->child; it; it = it->next, k++) {
            int v = -1;
            if (cJSON_IsBool(it))
                v = cJSON_IsTrue(it) ? 1 : 0;
            else if (cJSON_IsNumber(it) && (it->valuedouble == 0.0 || it->valuedouble == 1.0))
                v = (int)it->valuedouble;
            if (v < 0) {
                json_brief(it, brief, sizeof(brief));
                snprintf(what, sizeof(what), "loss_mask[%zu] is not 0 or 1 (got %s)", k, brief);
                jsonl_fail(path, lineno, what);
                goto out;
            }
            dst_mask[k] = (uint8_t)v;
        }
    } else {
        memset(dst_mask, 1, len);
    }
    if (b->n == 0) b->offsets[0] = 0;
    b->total += len;
    b->n++;
    b->offsets[b->n] = b->total;
    st = HS_OK;
out:
    cJSON_Delete(root);
    return st;
}

static bool line_is_blank(const char *s, size_t len)
{
    for (size_t i = 0; i < len; i++)
        if (s[i] != ' ' && s[i] != '\t' && s[i] != '\r' && s[i] != '\n') return false;
    return true;
}

static hs_status_t dataset_load_jsonl(const char *path, FILE *f, hs_dataset_t **out)
{
    jsonl_build_t b = {0};
    char *line = NULL;
    size_t linecap = 0;
    ssize_t len;
    uint64_t lineno = 0;
    hs_status_t st = HS_OK;

    while ((len = getline(&line, &linecap, f)) >= 0) {
        lineno++;
        char *s = line;
        if (lineno == 1 && len >= 3 && memcmp(s, "\xEF\xBB\xBF", 3) == 0) { /* UTF-8 BOM */
            s += 3;
            len -= 3;
        }
        if (line_is_blank(s, (size_t)len)) continue;
        if (strlen(s) != (size_t)len) {
            jsonl_fail(path, lineno, "the line contains a NUL byte (is this a binary file?)");
            st = HS_ERR_FORMAT;
            goto err_free;
        }
        st = jsonl_parse_line(path, lineno, s, &b);
        if (st != HS_OK) goto err_free;
    }
    if (ferror(f)) {
        hs_error("%s: read failed after line %" PRIu64 ": %m", path, lineno);
        st = HS_ERR_IO;
        goto err_free;
    }
    if (b.n == 0) {
        hs_error("%s: no sequences (the file is empty or only blank lines); give it one JSON "
                 "object per line such as {\"input_ids\": [1, 2, 3]}",
                 path);
        st = HS_ERR_FORMAT;
        goto err_free;
    }
    for (uint64_t i = 0; i < b.n; i++) {
        if (b.offsets[i + 1] - b.offsets[i] > UINT32_MAX) {
            hs_error("%s: sequence %" PRIu64 " has more than 2^32-1 tokens", path, i);
            st = HS_ERR_FORMAT;
            goto err_free;
        }
    }

    hs_dataset_t *ds = dataset_alloc(HS_DATASET_JSONL);
    if (!ds) {
        st = HS_ERR_NOMEM;
        goto err_free;
    }
    ds->n = b.n;
    ds->total = b.total;
    ds->offsets = ds->own_offsets = b.offsets;
    ds->ids = ds->own_ids = b.ids;
    ds->mask = ds->own_mask = b.mask;
    ds->fingerprint = body_fingerprint(ds->offsets, ds->n, ds->ids, ds->mask, ds->total);
    free(line);
    *out = ds;
    return HS_OK;

err_free:
    free(line);
    free(b.offsets);
    free(b.ids);
    free(b.mask);
    return st;
}

/* ---- .hst ----------------------------------------------------------------- */

#define HST_HINT "re-create it with `hs-data import IN.jsonl OUT.hst`"

static hs_status_t dataset_load_hst(const char *path, int fd, hs_dataset_t **out)
{
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        hs_error("%s: stat failed: %m", path);
        return HS_ERR_IO;
    }
    uint64_t size = (uint64_t)sb.st_size;
    if (size < HST_HEADER_BYTES) {
        hs_error("%s: truncated .hst file: %" PRIu64 " bytes, the header alone is %u; " HST_HINT,
                 path, size, HST_HEADER_BYTES);
        return HS_ERR_FORMAT;
    }
    if (size > SIZE_MAX) return HS_ERR_NOMEM;
    void *map = mmap(NULL, (size_t)size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (map == MAP_FAILED) {
        hs_error("%s: mmap of %" PRIu64 " bytes failed: %m", path, size);
        return HS_ERR_IO;
    }
    const uint8_t *p = map;
    hs_status_t st = HS_ERR_FORMAT;
    int slot = hst_register(map, (size_t)size); /* reading it may already fault */

    uint16_t version = load_u16(p + 4), hbytes = load_u16(p + 6);
    if (version != HST_VERSION) {
        hs_error("%s: .hst version %u, this build reads version %u; " HST_HINT, path, version,
                 HST_VERSION);
        goto err_unmap;
    }
    if (hbytes != HST_HEADER_BYTES) {
        hs_error("%s: corrupt .hst header (header size %u, expected %u); " HST_HINT, path, hbytes,
                 HST_HEADER_BYTES);
        goto err_unmap;
    }
    uint32_t crc = hs_crc32c(0, p, HST_CRC_OFFSET);
    if (crc != load_u32(p + HST_CRC_OFFSET)) {
        hs_error("%s: corrupt .hst header (CRC-32C 0x%08x, stored 0x%08x); " HST_HINT, path, crc,
                 load_u32(p + HST_CRC_OFFSET));
        st = HS_ERR_CHECKSUM;
        goto err_unmap;
    }
    uint64_t n = load_u64(p + 8), total = load_u64(p + 16), fp = load_u64(p + 24);
    /* expected = 64 + 8(n+1) + 5T, computed without overflow */
    uint64_t expected = 0, a, b;
    bool overflow = __builtin_add_overflow(n, 1, &a) || __builtin_mul_overflow(a, 8, &a) ||
                    __builtin_mul_overflow(total, 5, &b) ||
                    __builtin_add_overflow(a, b, &expected) ||
                    __builtin_add_overflow(expected, HST_HEADER_BYTES, &expected);
    if (n == 0 || overflow || expected != size) {
        hs_error("%s: .hst file is %" PRIu64 " bytes but its header says %" PRIu64
                 " sequences and %" PRIu64
                 " tokens (%s); the file is truncated or corrupt; " HST_HINT,
                 path, size, n, total,
                 n == 0                           ? "no sequences"
                 : (!overflow && expected < size) ? "trailing bytes"
                                                  : "that needs more bytes than the file has");
        goto err_unmap;
    }
    const uint64_t *offsets = (const uint64_t *)(p + HST_HEADER_BYTES);
    const int32_t *ids = (const int32_t *)(offsets + n + 1);
    const uint8_t *mask = (const uint8_t *)(ids + total);
    if (offsets[0] != 0 || offsets[n] != total) {
        hs_error("%s: corrupt .hst offsets (first %" PRIu64 ", last %" PRIu64
                 ", expected 0 and %" PRIu64 "); " HST_HINT,
                 path, offsets[0], offsets[n], total);
        goto err_unmap;
    }
    for (uint64_t i = 0; i < n; i++) {
        if (offsets[i + 1] <= offsets[i] || offsets[i + 1] > total ||
            offsets[i + 1] - offsets[i] > UINT32_MAX) {
            hs_error("%s: corrupt .hst offsets: sequence %" PRIu64 " spans [%" PRIu64 ", %" PRIu64
                     ") of %" PRIu64 " tokens (offsets must increase, each sequence 1..2^32-1 "
                     "tokens); " HST_HINT,
                     path, i, offsets[i], offsets[i + 1], total);
            goto err_unmap;
        }
    }
    uint64_t fp_now = body_fingerprint(offsets, n, ids, mask, total);
    if (fp_now != fp) {
        hs_error("%s: .hst content checksum mismatch (XXH3 0x%016" PRIx64
                 ", header says 0x%016" PRIx64 "): the file is corrupt; " HST_HINT,
                 path, fp_now, fp);
        st = HS_ERR_CHECKSUM;
        goto err_unmap;
    }
    /* values: a file with a valid checksum but written by a faulty tool */
    for (uint64_t t = 0; t < total; t++) {
        if (ids[t] < 0 || mask[t] > 1) {
            hs_error("%s: token %" PRIu64 " has input_id %d / loss_mask %u (ids must be >= 0, "
                     "mask 0 or 1); " HST_HINT,
                     path, t, ids[t], mask[t]);
            goto err_unmap;
        }
    }

    hs_dataset_t *ds = dataset_alloc(HS_DATASET_HST);
    if (!ds) {
        st = HS_ERR_NOMEM;
        goto err_unmap;
    }
    ds->n = n;
    ds->total = total;
    ds->offsets = offsets;
    ds->ids = ids;
    ds->mask = mask;
    ds->fingerprint = fp;
    ds->map = map;
    ds->map_len = (size_t)size;
    ds->map_slot = slot;
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

err_unmap:
    hst_unregister(slot);
    munmap(map, (size_t)size);
    return st;
}

/* ---- public API ------------------------------------------------------------ */

hs_status_t hs_dataset_open(const char *path, hs_dataset_t **out)
{
    if (!path || !out) return HS_ERR_INVALID;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        int e = errno;
        hs_error("%s: cannot open dataset: %s; give a JSONL or .hst file", path, strerror(e));
        return e == ENOENT ? HS_ERR_NOT_FOUND : HS_ERR_IO;
    }
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        hs_error("%s: not a regular file; give a JSONL or .hst file", path);
        close(fd);
        return HS_ERR_INVALID;
    }
    char magic[4] = {0};
    ssize_t got = pread(fd, magic, sizeof(magic), 0);
    hs_status_t st;
    hs_dataset_t *ds = NULL;
    uint64_t t0 = hs_now_ns();
    if (got == (ssize_t)sizeof(magic) && memcmp(magic, HST_MAGIC, 4) == 0) {
        st = dataset_load_hst(path, fd, &ds);
        close(fd);
    } else {
        FILE *f = fdopen(fd, "r");
        if (!f) {
            hs_error("%s: fdopen failed: %m", path);
            close(fd);
            return HS_ERR_IO;
        }
        st = dataset_load_jsonl(path, f, &ds);
        fclose(f);
    }
    if (st != HS_OK) return st;
    hs_debug("dataset %s: %s, %" PRIu64 " sequences, %" PRIu64 " tokens, fingerprint %016" PRIx64
             ", loaded in %.3f s",
             path, ds->format == HS_DATASET_HST ? "hst" : "jsonl", ds->n, ds->total,
             ds->fingerprint, (double)(hs_now_ns() - t0) * 1e-9);
    *out = ds;
    return HS_OK;
}

void hs_dataset_close(hs_dataset_t *ds)
{
    if (!ds) return;
    hst_unregister(ds->map_slot);
    if (ds->map) munmap(ds->map, ds->map_len);
    if (ds->fd >= 0) close(ds->fd);
    free(ds->path);
    free(ds->own_offsets);
    free(ds->own_ids);
    free(ds->own_mask);
    free(ds);
}

hs_dataset_format_t hs_dataset_format(const hs_dataset_t *ds)
{
    return ds->format;
}
uint64_t hs_dataset_count(const hs_dataset_t *ds)
{
    return ds->n;
}
uint64_t hs_dataset_total_tokens(const hs_dataset_t *ds)
{
    return ds->total;
}
uint64_t hs_dataset_fingerprint(const hs_dataset_t *ds)
{
    return ds->fingerprint;
}

hs_status_t hs_dataset_check(const hs_dataset_t *ds)
{
    if (!ds || ds->format != HS_DATASET_HST) return HS_OK;
    bool shrunk = ds->map_slot >= 0 && atomic_load(&hst_maps[ds->map_slot].shrunk);
    struct stat now;
    bool changed =
        ds->fd >= 0 && fstat(ds->fd, &now) == 0 &&
        (now.st_size != ds->opened.st_size || now.st_mtim.tv_sec != ds->opened.st_mtim.tv_sec ||
         now.st_mtim.tv_nsec != ds->opened.st_mtim.tv_nsec);
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

uint32_t hs_dataset_seq_len(const hs_dataset_t *ds, uint64_t i)
{
    if (i >= ds->n) return 0;
    return (uint32_t)(ds->offsets[i + 1] - ds->offsets[i]);
}

const int32_t *hs_dataset_ids(const hs_dataset_t *ds, uint64_t i)
{
    return i < ds->n ? ds->ids + ds->offsets[i] : NULL;
}

const uint8_t *hs_dataset_mask(const hs_dataset_t *ds, uint64_t i)
{
    return i < ds->n ? ds->mask + ds->offsets[i] : NULL;
}

hs_status_t hs_dataset_from_arrays(uint64_t n, const uint32_t *lens, const int32_t *ids,
                                   const uint8_t *mask, hs_dataset_t **out)
{
    if (!out || n == 0 || !lens || !ids) return HS_ERR_INVALID;
    uint64_t total = 0;
    for (uint64_t i = 0; i < n; i++) {
        if (lens[i] == 0) {
            hs_error("dataset: sequence %" PRIu64 " is empty; every sequence needs a token", i);
            return HS_ERR_INVALID;
        }
        total += lens[i];
    }
    for (uint64_t t = 0; t < total; t++) {
        if (ids[t] < 0 || (mask && mask[t] > 1)) {
            hs_error("dataset: token %" PRIu64 " has a negative id or a mask other than 0/1", t);
            return HS_ERR_INVALID;
        }
    }
    hs_dataset_t *ds = dataset_alloc(HS_DATASET_JSONL);
    if (!ds) return HS_ERR_NOMEM;
    ds->own_offsets = malloc((size_t)(n + 1) * sizeof(uint64_t));
    ds->own_ids = malloc((size_t)total * sizeof(int32_t));
    ds->own_mask = malloc((size_t)total);
    if (!ds->own_offsets || !ds->own_ids || !ds->own_mask) {
        hs_dataset_close(ds);
        return HS_ERR_NOMEM;
    }
    ds->own_offsets[0] = 0;
    for (uint64_t i = 0; i < n; i++)
        ds->own_offsets[i + 1] = ds->own_offsets[i] + lens[i];
    memcpy(ds->own_ids, ids, (size_t)total * sizeof(int32_t));
    if (mask)
        memcpy(ds->own_mask, mask, (size_t)total);
    else
        memset(ds->own_mask, 1, (size_t)total);
    ds->n = n;
    ds->total = total;
    ds->offsets = ds->own_offsets;
    ds->ids = ds->own_ids;
    ds->mask = ds->own_mask;
    ds->fingerprint = body_fingerprint(ds->offsets, n, ds->ids, ds->mask, total);
    *out = ds;
    return HS_OK;
}

static hs_status_t write_all(int fd, const void *buf, size_t len)
{
    const uint8_t *p = buf;
    while (len > 0) {
        size_t chunk = len < (1u << 30) ? len : (1u << 30);
        ssize_t w = write(fd, p, chunk);
        if (w < 0) {
            if (errno == EINTR) continue;
            return HS_ERR_IO;
        }
        p += w;
        len -= (size_t)w;
    }
    return HS_OK;
}

hs_status_t hs_dataset_write_hst(const hs_dataset_t *ds, const char *path)
{
    if (!ds || !path) return HS_ERR_INVALID;
    uint8_t h[HST_HEADER_BYTES] = {0};
    uint16_t version = HST_VERSION, hbytes = HST_HEADER_BYTES;
    memcpy(h, HST_MAGIC, 4);
    memcpy(h + 4, &version, 2);
    memcpy(h + 6, &hbytes, 2);
    memcpy(h + 8, &ds->n, 8);
    memcpy(h + 16, &ds->total, 8);
    memcpy(h + 24, &ds->fingerprint, 8);
    uint32_t crc = hs_crc32c(0, h, HST_CRC_OFFSET);
    memcpy(h + HST_CRC_OFFSET, &crc, 4);

    size_t plen = strlen(path);
    char *tmp = malloc(plen + 16);
    if (!tmp) return HS_ERR_NOMEM;
    snprintf(tmp, plen + 16, "%s.tmp.XXXXXX", path);
    int fd = mkstemp(tmp);
    if (fd < 0) {
        hs_error("%s: cannot create temporary file %s: %m; check the folder exists and is writable",
                 path, tmp);
        free(tmp);
        return HS_ERR_IO;
    }
    hs_status_t st = HS_ERR_IO;
    (void)fchmod(fd, 0644); /* mkstemp makes 0600; a dataset is meant to be shared */
    if (write_all(fd, h, sizeof(h)) || write_all(fd, ds->offsets, (size_t)(ds->n + 1) * 8) ||
        write_all(fd, ds->ids, (size_t)ds->total * 4) ||
        write_all(fd, ds->mask, (size_t)ds->total)) {
        hs_error("%s: write failed: %m; check free disk space", tmp);
        goto err_unlink;
    }
    if (fsync(fd) != 0) {
        hs_error("%s: fsync failed: %m", tmp);
        goto err_unlink;
    }
    if (close(fd) != 0) {
        fd = -1;
        hs_error("%s: close failed: %m", tmp);
        goto err_unlink;
    }
    fd = -1;
    if (rename(tmp, path) != 0) {
        hs_error("cannot rename %s to %s: %m", tmp, path);
        goto err_unlink;
    }
    free(tmp);
    return HS_OK;

err_unlink:
    if (fd >= 0) close(fd);
    unlink(tmp);
    free(tmp);
    return st;
}
