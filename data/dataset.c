/* SPDX-License-Identifier: Apache-2.0 */
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
#include "hs_data.h"

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
    /* JSONL / arrays / an .hst image from memory: heap storage the arrays
     * point into */
    uint8_t *own_image;
    uint64_t *own_offsets;
    int32_t *own_ids;
    uint8_t *own_mask;
};

/* ---- small helpers ------------------------------------------------------ */

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

#define JSONL_HINT                                                                                 \
    "fix or remove this line (each line must be a JSON object such as "                            \
    "{\"input_ids\": [1, 2, 3], \"loss_mask\": [0, 1, 1]}, loss_mask optional)"

static void jsonl_fail(const char *path, uint64_t lineno, const char *what)
{
    hs_error("%s:%" PRIu64 ": %s; " JSONL_HINT, path, lineno, what);
}

/* The tokens of one parsed line, reused from line to line: the capacity
 * grows to the longest line, never with the number of lines. */
typedef struct {
    int32_t *ids;
    uint8_t *mask;
    size_t cap;
    size_t len;
} jsonl_line_t;

static bool line_reserve(jsonl_line_t *l, size_t n)
{
    if (n <= l->cap) return true;
    size_t cap = l->cap ? l->cap : 4096;
    while (cap < n) {
        if (cap > SIZE_MAX / 8) return false;
        cap *= 2;
    }
    int32_t *ids = realloc(l->ids, cap * sizeof(int32_t));
    if (!ids) return false;
    l->ids = ids;
    uint8_t *mask = realloc(l->mask, cap);
    if (!mask) return false;
    l->mask = mask;
    l->cap = cap;
    return true;
}

static void line_free(jsonl_line_t *l)
{
    free(l->ids);
    free(l->mask);
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

/* The full parser of one non-blank, NUL-terminated line (cJSON): fills l or
 * logs what is wrong. Every line the fast parser below does not take comes
 * here, so this decides what is accepted and what each error says. */
static hs_status_t jsonl_parse_line_full(const char *path, uint64_t lineno, const char *line,
                                         jsonl_line_t *l)
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
    /* A key given twice means one thing to one reader and another to the
     * next (cJSON takes the first, Python's json the last): refused, so no
     * tool trains on a sequence the others would not see. */
    for (int k = 0; k < 2; k++) {
        const char *key = k == 0 ? "input_ids" : "loss_mask";
        int seen = 0;
        for (const cJSON *it = root->child; it; it = it->next)
            seen += it->string && strcmp(it->string, key) == 0;
        if (seen > 1) {
            snprintf(what, sizeof(what),
                     "\"%s\" appears %d times (readers disagree on which one counts); keep one",
                     key, seen);
            jsonl_fail(path, lineno, what);
            goto out;
        }
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
    if (!line_reserve(l, len)) {
        hs_error("%s:%" PRIu64 ": out of memory for a line of %zu tokens", path, lineno, len);
        st = HS_ERR_NOMEM;
        goto out;
    }
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
        l->ids[k] = (int32_t)d;
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
            l->mask[k] = (uint8_t)v;
        }
    } else {
        memset(l->mask, 1, len);
    }
    l->len = len;
    st = HS_OK;
out:
    cJSON_Delete(root);
    return st;
}

static const char *skip_ws(const char *p, const char *end)
{
    while (p < end && (*p == ' ' || *p == '\t' || *p == '\r' || *p == '\n'))
        p++;
    return p;
}

static bool is_digit(char c)
{
    return (unsigned)(c - '0') <= 9u;
}

/* Parses one array of input_ids (what = 1) or loss_mask (what = 2) at p
 * (its '['), in the plain form writers produce: non-negative integers
 * without fraction or exponent, 0/1/true/false. Returns the end or NULL. */
static const char *fast_array(const char *p, const char *end, int what, int32_t *ids, uint8_t *mask,
                              size_t *n_out)
{
    size_t n = 0;
    if (p >= end || *p != '[') return NULL;
    p = skip_ws(p + 1, end);
    if (p < end && *p == ']') {
        *n_out = 0;
        return p + 1;
    }
    for (;;) {
        if (p >= end) return NULL;
        if (what == 1) {
            if (!is_digit(*p)) return NULL;
            uint32_t v = (uint32_t)(*p++ - '0');
            if (v == 0 && p < end && is_digit(*p)) return NULL; /* leading zero */
            while (p < end && is_digit(*p)) {
                v = v * 10u + (uint32_t)(*p++ - '0');
                if (v > INT32_MAX) return NULL;
            }
            if (p < end && (*p == '.' || *p == 'e' || *p == 'E')) return NULL;
            ids[n++] = (int32_t)v;
        } else {
            if (*p == '0' || *p == '1') {
                mask[n++] = (uint8_t)(*p++ - '0');
                if (p < end && (is_digit(*p) || *p == '.' || *p == 'e' || *p == 'E')) return NULL;
            } else if (end - p >= 4 && memcmp(p, "true", 4) == 0) {
                mask[n++] = 1;
                p += 4;
            } else if (end - p >= 5 && memcmp(p, "false", 5) == 0) {
                mask[n++] = 0;
                p += 5;
            } else {
                return NULL;
            }
        }
        p = skip_ws(p, end);
        if (p < end && *p == ',') {
            p = skip_ws(p + 1, end);
            continue;
        }
        if (p < end && *p == ']') break;
        return NULL;
    }
    *n_out = n;
    return p + 1;
}

/* The fast parser: takes a line only when it is exactly an object of
 * "input_ids" and optionally "loss_mask" (or null), each once, in the plain
 * form of fast_array, and valid; it then means what the full parser would
 * make of it. Anything else (other keys, escapes, exponents, errors) returns
 * false and goes to the full parser. */
static bool jsonl_parse_line_fast(const char *p, const char *end, jsonl_line_t *l)
{
    /* an array of a line of B bytes has at most B/2 + 1 elements */
    if (!line_reserve(l, (size_t)(end - p) / 2 + 1)) return false;
    size_t n_ids = 0, n_mask = 0;
    bool have_ids = false, have_mask = false, mask_null = false;
    p = skip_ws(p, end);
    if (p >= end || *p != '{') return false;
    p++;
    for (;;) {
        p = skip_ws(p, end);
        if (p >= end || *p != '"') return false;
        const char *key = ++p;
        while (p < end && *p != '"' && *p != '\\')
            p++;
        if (p >= end || *p != '"' || p - key != 9) return false;
        int what = memcmp(key, "input_ids", 9) == 0 ? 1 : memcmp(key, "loss_mask", 9) == 0 ? 2 : 0;
        if (what == 0 || (what == 1 && have_ids) || (what == 2 && have_mask)) return false;
        p = skip_ws(p + 1, end);
        if (p >= end || *p != ':') return false;
        p = skip_ws(p + 1, end);
        if (what == 2 && end - p >= 4 && memcmp(p, "null", 4) == 0) {
            p += 4;
            mask_null = true;
        } else {
            p = fast_array(p, end, what, l->ids, l->mask, what == 1 ? &n_ids : &n_mask);
            if (!p) return false;
        }
        if (what == 1) have_ids = true;
        if (what == 2) have_mask = true;
        p = skip_ws(p, end);
        if (p < end && *p == ',') {
            p++;
            continue;
        }
        if (p < end && *p == '}') break;
        return false;
    }
    if (skip_ws(p + 1, end) != end || !have_ids || n_ids == 0) return false;
    if (have_mask && !mask_null) {
        if (n_mask != n_ids) return false;
    } else {
        memset(l->mask, 1, n_ids);
    }
    l->len = n_ids;
    return true;
}

/* Reads a file line by line through one buffer (grown to the longest line
 * only). Each line is handed out without its '\n' and NUL-terminated in
 * place. */
typedef struct {
    const char *path;
    int fd;
    char *buf;
    size_t cap, start, end;
    bool eof;
    uint64_t lineno;
    uint64_t consumed; /* bytes of the file handed out as lines so far */
} line_reader_t;

#define LINE_READER_CHUNK (4u << 20)

static hs_status_t reader_init(line_reader_t *r, const char *path, int fd)
{
    memset(r, 0, sizeof(*r));
    r->path = path;
    r->fd = fd;
    r->cap = LINE_READER_CHUNK;
    r->buf = malloc(r->cap + 1);
    if (!r->buf) return HS_ERR_NOMEM;
    if (lseek(fd, 0, SEEK_SET) < 0) {
        hs_error("%s: cannot seek to the start: %m", path);
        return HS_ERR_IO;
    }
    (void)posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
    return HS_OK;
}

static void reader_free(line_reader_t *r)
{
    free(r->buf);
    r->buf = NULL;
}

/* 1: a line in [*s, *s + *len); 0: end of file; < 0: an hs_status_t. */
static int reader_next(line_reader_t *r, char **s, size_t *len)
{
    for (;;) {
        char *nl = r->end > r->start ? memchr(r->buf + r->start, '\n', r->end - r->start) : NULL;
        if (nl || (r->eof && r->end > r->start)) {
            char *line = r->buf + r->start;
            size_t n = nl ? (size_t)(nl - line) : r->end - r->start;
            line[n] = '\0'; /* the '\n', or the spare byte after the buffer */
            r->start += n + (nl ? 1 : 0);
            r->consumed += n + (nl ? 1 : 0);
            r->lineno++;
            *s = line;
            *len = n;
            return 1;
        }
        if (r->eof) return 0;
        if (r->start > 0) { /* move the partial line to the front */
            memmove(r->buf, r->buf + r->start, r->end - r->start);
            r->end -= r->start;
            r->start = 0;
        }
        if (r->end == r->cap) { /* a line longer than the buffer */
            if (r->cap > SIZE_MAX / 4) return HS_ERR_NOMEM;
            char *nb = realloc(r->buf, r->cap * 2 + 1);
            if (!nb) {
                hs_error("%s:%" PRIu64 ": out of memory for a line of more than %zu bytes", r->path,
                         r->lineno + 1, r->cap);
                return HS_ERR_NOMEM;
            }
            r->buf = nb;
            r->cap *= 2;
        }
        ssize_t got = read(r->fd, r->buf + r->end, r->cap - r->end);
        if (got < 0) {
            if (errno == EINTR) continue;
            hs_error("%s: read failed after line %" PRIu64 ": %m", r->path, r->lineno);
            return HS_ERR_IO;
        }
        if (got == 0) r->eof = true;
        r->end += (size_t)got;
    }
}

static bool line_is_blank(const char *s, size_t len)
{
    for (size_t i = 0; i < len; i++)
        if (s[i] != ' ' && s[i] != '\t' && s[i] != '\r' && s[i] != '\n') return false;
    return true;
}

/* The next sequence of the file: 1 with *l filled, 0 at the end, < 0 an
 * hs_status_t (logged). Blank lines are skipped, a BOM on line 1 too. */
static int jsonl_next(line_reader_t *r, jsonl_line_t *l)
{
    char *s;
    size_t len;
    int got;
    while ((got = reader_next(r, &s, &len)) == 1) {
        if (r->lineno == 1 && len >= 3 && memcmp(s, "\xEF\xBB\xBF", 3) == 0) { /* UTF-8 BOM */
            s += 3;
            len -= 3;
        }
        if (line_is_blank(s, len)) continue;
        if (memchr(s, '\0', len)) {
            jsonl_fail(r->path, r->lineno, "the line contains a NUL byte (is this a binary file?)");
            return HS_ERR_FORMAT;
        }
        if (jsonl_parse_line_fast(s, s + len, l)) return 1;
        hs_status_t st = jsonl_parse_line_full(r->path, r->lineno, s, l);
        return st == HS_OK ? 1 : st;
    }
    return got;
}

/* The non-blank lines of the file (what jsonl_next will hand out, if every
 * line parses). */
static int jsonl_count_lines(line_reader_t *r, uint64_t *n, hs_dataset_progress_cb cb, void *arg,
                             uint64_t size)
{
    char *s;
    size_t len;
    int got;
    uint64_t count = 0, next_report = 0;
    while ((got = reader_next(r, &s, &len)) == 1) {
        if (r->lineno == 1 && len >= 3 && memcmp(s, "\xEF\xBB\xBF", 3) == 0) {
            s += 3;
            len -= 3;
        }
        if (!line_is_blank(s, len)) count++;
        if (cb && r->consumed >= next_report) {
            cb(arg, "scan", r->consumed, size, count);
            next_report = r->consumed + (64u << 20);
        }
    }
    *n = count;
    return got;
}

typedef struct {
    uint64_t *offsets;
    size_t offsets_cap;
    int32_t *ids;
    size_t ids_cap;
    uint8_t *mask;
    size_t mask_cap;
    uint64_t n, total;
} jsonl_build_t;

static hs_status_t jsonl_append(const char *path, uint64_t lineno, const jsonl_line_t *l,
                                jsonl_build_t *b)
{
    if (grow((void **)&b->ids, &b->ids_cap, b->total + l->len, sizeof(int32_t)) ||
        grow((void **)&b->mask, &b->mask_cap, b->total + l->len, 1) ||
        grow((void **)&b->offsets, &b->offsets_cap, b->n + 2, sizeof(uint64_t))) {
        hs_error("%s:%" PRIu64 ": out of memory after %" PRIu64 " tokens", path, lineno, b->total);
        return HS_ERR_NOMEM;
    }
    memcpy(b->ids + b->total, l->ids, l->len * sizeof(int32_t));
    memcpy(b->mask + b->total, l->mask, l->len);
    if (b->n == 0) b->offsets[0] = 0;
    b->total += l->len;
    b->n++;
    b->offsets[b->n] = b->total;
    return HS_OK;
}

static void jsonl_no_sequences(const char *path)
{
    hs_error("%s: no sequences (the file is empty or only blank lines); give it one JSON "
             "object per line such as {\"input_ids\": [1, 2, 3]}",
             path);
}

static hs_status_t dataset_load_jsonl(const char *path, int fd, hs_dataset_t **out)
{
    jsonl_build_t b = {0};
    jsonl_line_t l = {0};
    line_reader_t r;
    hs_status_t st = reader_init(&r, path, fd);
    int got;
    if (st != HS_OK) goto err_free;
    while ((got = jsonl_next(&r, &l)) == 1) {
        if (l.len > UINT32_MAX) {
            hs_error("%s:%" PRIu64 ": the sequence has more than 2^32-1 tokens", path, r.lineno);
            st = HS_ERR_FORMAT;
            goto err_free;
        }
        st = jsonl_append(path, r.lineno, &l, &b);
        if (st != HS_OK) goto err_free;
    }
    if (got < 0) {
        st = (hs_status_t)got;
        goto err_free;
    }
    if (b.n == 0) {
        jsonl_no_sequences(path);
        st = HS_ERR_FORMAT;
        goto err_free;
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
    reader_free(&r);
    line_free(&l);
    *out = ds;
    return HS_OK;

err_free:
    reader_free(&r);
    line_free(&l);
    free(b.offsets);
    free(b.ids);
    free(b.mask);
    return st;
}

/* ---- .hst ----------------------------------------------------------------- */

#define HST_HINT "re-create it with `hs-data import IN.jsonl OUT.hst`"

/* Checks an .hst image p[size] field by field; when it is sound, *out is a
 * dataset whose ids and mask point into the image (the caller gives the
 * dataset the image to keep) and whose offsets are its own copy, the one
 * that was checked. */
static hs_status_t hst_parse(const char *path, const uint8_t *p, uint64_t size, hs_dataset_t **out)
{
    if (size < HST_HEADER_BYTES) {
        hs_error("%s: truncated .hst file: %" PRIu64 " bytes, the header alone is %u; " HST_HINT,
                 path, size, HST_HEADER_BYTES);
        return HS_ERR_FORMAT;
    }
    uint16_t version = hs_le16_load(p + 4), hbytes = hs_le16_load(p + 6);
    if (version != HST_VERSION) {
        hs_error("%s: .hst version %u, this build reads version %u; " HST_HINT, path, version,
                 HST_VERSION);
        return HS_ERR_FORMAT;
    }
    if (hbytes != HST_HEADER_BYTES) {
        hs_error("%s: corrupt .hst header (header size %u, expected %u); " HST_HINT, path, hbytes,
                 HST_HEADER_BYTES);
        return HS_ERR_FORMAT;
    }
    uint32_t crc = hs_crc32c(0, p, HST_CRC_OFFSET);
    if (crc != hs_le32_load(p + HST_CRC_OFFSET)) {
        hs_error("%s: corrupt .hst header (CRC-32C 0x%08x, stored 0x%08x); " HST_HINT, path, crc,
                 hs_le32_load(p + HST_CRC_OFFSET));
        return HS_ERR_CHECKSUM;
    }
    uint64_t n = hs_le64_load(p + 8), total = hs_le64_load(p + 16), fp = hs_le64_load(p + 24);
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
        return HS_ERR_FORMAT;
    }
    /* The index is copied out of the image before it is checked: the file
     * behind a mapping can be rewritten in place while it is used, and every
     * read of ids and mask is placed by these offsets, so they must be the
     * ones validated here (8 bytes per sequence of private memory). */
    const int32_t *ids = (const int32_t *)(p + HST_HEADER_BYTES + (n + 1) * 8);
    const uint8_t *mask = (const uint8_t *)(ids + total);
    if (n + 1 > SIZE_MAX / sizeof(uint64_t)) return HS_ERR_NOMEM;
    uint64_t *offsets = malloc((size_t)(n + 1) * sizeof(uint64_t));
    if (!offsets) return HS_ERR_NOMEM;
    memcpy(offsets, p + HST_HEADER_BYTES, (size_t)(n + 1) * sizeof(uint64_t));
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
    uint64_t fp_now = body_fingerprint(offsets, n, ids, mask, total);
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

    hs_dataset_t *ds = dataset_alloc(HS_DATASET_HST);
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

static hs_status_t dataset_load_hst(const char *path, int fd, hs_dataset_t **out)
{
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        hs_error("%s: stat failed: %m", path);
        return HS_ERR_IO;
    }
    uint64_t size = (uint64_t)sb.st_size;
    if (size < HST_HEADER_BYTES) return hst_parse(path, NULL, size, out); /* says so */
    if (size > SIZE_MAX) return HS_ERR_NOMEM;
    void *map = mmap(NULL, (size_t)size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (map == MAP_FAILED) {
        hs_error("%s: mmap of %" PRIu64 " bytes failed: %m", path, size);
        return HS_ERR_IO;
    }
    int slot = hst_register(map, (size_t)size); /* reading it may already fault */
    hs_dataset_t *ds;
    hs_status_t st = hst_parse(path, map, size, &ds);
    if (st != HS_OK) {
        hst_unregister(slot);
        munmap(map, (size_t)size);
        return st;
    }
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
}

/* ---- public API ------------------------------------------------------------ */

hs_status_t hs_dataset_open(const char *path, hs_dataset_t **out)
{
    if (!path || !out) return HS_ERR_INVALID;
    /* O_NONBLOCK: a FIFO would otherwise hold open() until a writer comes;
     * it changes nothing for the regular files read below. */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
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
        st = dataset_load_jsonl(path, fd, &ds);
        close(fd);
    }
    if (st != HS_OK) return st;
    hs_debug("dataset %s: %s, %" PRIu64 " sequences, %" PRIu64 " tokens, fingerprint %016" PRIx64
             ", loaded in %.3f s",
             path, ds->format == HS_DATASET_HST ? "hst" : "jsonl", ds->n, ds->total,
             ds->fingerprint, (double)(hs_now_ns() - t0) * 1e-9);
    *out = ds;
    return HS_OK;
}

static hs_status_t write_all(int fd, const void *buf, size_t len);

hs_status_t hs_dataset_open_memory(const void *buf, size_t len, const char *name,
                                   hs_dataset_t **out)
{
    if ((!buf && len) || !name || !out) return HS_ERR_INVALID;
    hs_status_t st;
    hs_dataset_t *ds = NULL;
    if (len >= 4 && memcmp(buf, HST_MAGIC, 4) == 0) {
        uint8_t *image = malloc(len);
        if (!image) return HS_ERR_NOMEM;
        memcpy(image, buf, len);
        st = hst_parse(name, image, len, &ds);
        if (st != HS_OK) {
            free(image);
            return st;
        }
        ds->own_image = image;
    } else {
        /* The JSONL reader reads a descriptor: hand it one over the bytes. */
        int fd = memfd_create("hs-dataset", MFD_CLOEXEC);
        if (fd < 0) {
            hs_error("%s: memfd_create failed: %m", name);
            return HS_ERR_IO;
        }
        st = write_all(fd, buf, len);
        if (st != HS_OK || lseek(fd, 0, SEEK_SET) != 0) {
            hs_error("%s: cannot copy %zu bytes into a memory file: %m", name, len);
            close(fd);
            return HS_ERR_IO;
        }
        st = dataset_load_jsonl(name, fd, &ds);
        close(fd);
        if (st != HS_OK) return st;
    }
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
    free(ds->own_image);
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

static void hst_header(uint8_t h[HST_HEADER_BYTES], uint64_t n, uint64_t total, uint64_t fp)
{
    uint16_t version = HST_VERSION, hbytes = HST_HEADER_BYTES;
    memset(h, 0, HST_HEADER_BYTES);
    memcpy(h, HST_MAGIC, 4);
    memcpy(h + 4, &version, 2);
    memcpy(h + 6, &hbytes, 2);
    memcpy(h + 8, &n, 8);
    memcpy(h + 16, &total, 8);
    memcpy(h + 24, &fp, 8);
    uint32_t crc = hs_crc32c(0, h, HST_CRC_OFFSET);
    memcpy(h + HST_CRC_OFFSET, &crc, 4);
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
    uint8_t h[HST_HEADER_BYTES];
    hst_header(h, ds->n, ds->total, ds->fingerprint);

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

/* ---- streaming import and summary ------------------------------------------ */

#define STREAM_BUF_BYTES (1u << 20)
#define COPY_BUF_BYTES (4u << 20)

/* Buffered writes at an advancing position of a file (pwrite), so several
 * regions of one file can be written side by side. */
typedef struct {
    int fd;
    const char *name; /* for messages */
    uint64_t pos;     /* file position of buf[0] */
    uint8_t *buf;
    size_t len;
} pos_writer_t;

static hs_status_t pwrite_all(int fd, const void *buf, size_t len, uint64_t pos)
{
    const uint8_t *p = buf;
    while (len > 0) {
        ssize_t w = pwrite(fd, p, len, (off_t)pos);
        if (w < 0) {
            if (errno == EINTR) continue;
            return HS_ERR_IO;
        }
        p += w;
        pos += (uint64_t)w;
        len -= (size_t)w;
    }
    return HS_OK;
}

static hs_status_t pw_flush(pos_writer_t *w)
{
    if (pwrite_all(w->fd, w->buf, w->len, w->pos) != HS_OK) {
        hs_error("%s: write failed: %m; check free disk space", w->name);
        return HS_ERR_IO;
    }
    w->pos += w->len;
    w->len = 0;
    return HS_OK;
}

static hs_status_t pw_put(pos_writer_t *w, const void *data, size_t n)
{
    const uint8_t *s = data;
    while (n > 0) {
        size_t k = STREAM_BUF_BYTES - w->len < n ? STREAM_BUF_BYTES - w->len : n;
        memcpy(w->buf + w->len, s, k);
        w->len += k;
        s += k;
        n -= k;
        if (w->len == STREAM_BUF_BYTES && pw_flush(w) != HS_OK) return HS_ERR_IO;
    }
    return HS_OK;
}

/* Reads [pos, pos + len) of fd in chunks into the hash; with to_fd >= 0 also
 * writes each chunk there at to_pos onwards. */
static hs_status_t hash_copy(int fd, const char *name, uint64_t pos, uint64_t len, XXH3_state_t *h,
                             int to_fd, const char *to_name, uint64_t to_pos, uint8_t *buf,
                             hs_dataset_progress_cb cb, void *arg, uint64_t *done,
                             uint64_t total_bytes)
{
    while (len > 0) {
        size_t want = len < COPY_BUF_BYTES ? (size_t)len : COPY_BUF_BYTES;
        ssize_t got = pread(fd, buf, want, (off_t)pos);
        if (got < 0 && errno == EINTR) continue;
        if (got <= 0) {
            hs_error("%s: read back failed at byte %" PRIu64 ": %s", name, pos,
                     got < 0 ? strerror(errno) : "the file is shorter than written");
            return HS_ERR_IO;
        }
        XXH3_64bits_update(h, buf, (size_t)got);
        if (to_fd >= 0 && pwrite_all(to_fd, buf, (size_t)got, to_pos) != HS_OK) {
            hs_error("%s: write failed: %m; check free disk space", to_name);
            return HS_ERR_IO;
        }
        pos += (uint64_t)got;
        to_pos += (uint64_t)got;
        len -= (uint64_t)got;
        *done += (uint64_t)got;
        if (cb) cb(arg, "hash", *done, total_bytes, 0);
    }
    return HS_OK;
}

static void summary_start(hs_dataset_summary_t *s, hs_dataset_format_t format)
{
    memset(s, 0, sizeof(*s));
    s->format = format;
    s->min_len = UINT32_MAX;
}

static void summary_add(hs_dataset_summary_t *s, const uint8_t *mask, uint32_t len)
{
    uint64_t loss = 0;
    for (uint32_t t = 0; t < len; t++)
        loss += mask[t];
    s->n++;
    s->total += len;
    s->loss += loss;
    if (len < s->min_len) s->min_len = len;
    if (len > s->max_len) s->max_len = len;
    s->hist[31 - __builtin_clz(len)]++;
}

static void summary_of_dataset(const hs_dataset_t *ds, hs_dataset_summary_t *s)
{
    summary_start(s, ds->format);
    for (uint64_t i = 0; i < ds->n; i++)
        summary_add(s, hs_dataset_mask(ds, i), hs_dataset_seq_len(ds, i));
    s->fingerprint = ds->fingerprint;
}

/* Streams the JSONL file `path` (open as in_fd, in_size bytes) into an .hst
 * written at offset 0 of out_fd (an empty file called out_name): a first
 * pass counts the sequences, which places the arrays; the second parses each
 * line once, writing offsets and ids in place and the mask to spool_fd; the
 * mask is then copied after the ids while the body is hashed, and the header
 * goes in last. Memory: a few fixed buffers and the longest line. */
static hs_status_t jsonl_stream_hst(const char *path, int in_fd, uint64_t in_size, int out_fd,
                                    const char *out_name, int spool_fd, hs_dataset_progress_cb cb,
                                    void *arg, hs_dataset_summary_t *sum)
{
    line_reader_t r = {0};
    jsonl_line_t l = {0};
    uint8_t *bufs = malloc(3 * (size_t)STREAM_BUF_BYTES + COPY_BUF_BYTES);
    pos_writer_t w_off = {out_fd, out_name, HST_HEADER_BYTES, NULL, 0};
    pos_writer_t w_ids = {out_fd, out_name, 0, NULL, 0};
    pos_writer_t w_mask = {spool_fd, "the mask spool file", 0, NULL, 0};
    uint64_t n = 0;
    int got = 0;
    hs_status_t st = bufs ? reader_init(&r, path, in_fd) : HS_ERR_NOMEM;
    if (st != HS_OK) goto out;
    w_off.buf = bufs;
    w_ids.buf = bufs + STREAM_BUF_BYTES;
    w_mask.buf = bufs + 2 * (size_t)STREAM_BUF_BYTES;
    uint8_t *copy_buf = bufs + 3 * (size_t)STREAM_BUF_BYTES;

    got = jsonl_count_lines(&r, &n, cb, arg, in_size);
    if (got < 0) {
        st = (hs_status_t)got;
        goto out;
    }
    if (n == 0) {
        jsonl_no_sequences(path);
        st = HS_ERR_FORMAT;
        goto out;
    }
    reader_free(&r);
    st = reader_init(&r, path, in_fd);
    if (st != HS_OK) goto out;

    summary_start(sum, HS_DATASET_JSONL);
    uint64_t zero = 0, next_report = 0;
    w_ids.pos = HST_HEADER_BYTES + (n + 1) * sizeof(uint64_t);
    st = pw_put(&w_off, &zero, sizeof(zero));
    while (st == HS_OK && (got = jsonl_next(&r, &l)) == 1) {
        if (l.len > UINT32_MAX) {
            hs_error("%s:%" PRIu64 ": the sequence has more than 2^32-1 tokens", path, r.lineno);
            st = HS_ERR_FORMAT;
            break;
        }
        if (sum->n == n) break; /* more lines than counted: reported below */
        summary_add(sum, l.mask, (uint32_t)l.len);
        st = pw_put(&w_off, &sum->total, sizeof(sum->total));
        if (st == HS_OK) st = pw_put(&w_ids, l.ids, l.len * sizeof(int32_t));
        if (st == HS_OK) st = pw_put(&w_mask, l.mask, l.len);
        if (cb && r.consumed >= next_report) {
            cb(arg, "parse", r.consumed, in_size, sum->n);
            next_report = r.consumed + (16u << 20);
        }
    }
    if (st != HS_OK) goto out;
    if (got < 0) {
        st = (hs_status_t)got;
        goto out;
    }
    if (got == 1 || sum->n != n) {
        hs_error("%s: the file changed while it was read (%" PRIu64 " sequences counted, then "
                 "%s%" PRIu64 "); import it again once nothing writes to it",
                 path, n, got == 1 ? "more than " : "", sum->n);
        st = HS_ERR_IO;
        goto out;
    }
    if ((st = pw_flush(&w_off)) != HS_OK || (st = pw_flush(&w_ids)) != HS_OK ||
        (st = pw_flush(&w_mask)) != HS_OK)
        goto out;
    if (cb) cb(arg, "parse", in_size, in_size, sum->n);

    XXH3_state_t h;
    XXH3_64bits_reset(&h);
    uint64_t ids_end = w_ids.pos, body = ids_end - HST_HEADER_BYTES + sum->total, done = 0;
    st = hash_copy(out_fd, out_name, HST_HEADER_BYTES, ids_end - HST_HEADER_BYTES, &h, -1, NULL, 0,
                   copy_buf, cb, arg, &done, body);
    if (st == HS_OK)
        st = hash_copy(spool_fd, "the mask spool file", 0, sum->total, &h, out_fd, out_name,
                       ids_end, copy_buf, cb, arg, &done, body);
    if (st != HS_OK) goto out;
    sum->fingerprint = XXH3_64bits_digest(&h);
    uint8_t head[HST_HEADER_BYTES];
    hst_header(head, n, sum->total, sum->fingerprint);
    if (pwrite_all(out_fd, head, sizeof(head), 0) != HS_OK) {
        hs_error("%s: write failed: %m; check free disk space", out_name);
        st = HS_ERR_IO;
    }
out:
    reader_free(&r);
    line_free(&l);
    free(bufs);
    return st;
}

/* A file nobody else can open, removed when closed: in `dir`. */
static int open_unlinked(const char *dir)
{
#ifdef O_TMPFILE
    int fd = open(dir, O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
    if (fd >= 0) return fd;
#endif
    size_t cap = strlen(dir) + 32;
    char *t = malloc(cap);
    if (!t) return -1;
    snprintf(t, cap, "%s/.hs-spool.XXXXXX", dir);
    int fd2 = mkstemp(t);
    if (fd2 >= 0) unlink(t);
    free(t);
    return fd2;
}

/* Opens `path` for reading a dataset; *is_hst says which format it holds.
 * Returns the fd or -1 (logged, *st set). */
static int dataset_open_fd(const char *path, bool *is_hst, uint64_t *size, hs_status_t *st)
{
    /* O_NONBLOCK: a FIFO would otherwise hold open() until a writer comes;
     * it changes nothing for the regular files read below. */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
    if (fd < 0) {
        int e = errno;
        hs_error("%s: cannot open dataset: %s; give a JSONL or .hst file", path, strerror(e));
        *st = e == ENOENT ? HS_ERR_NOT_FOUND : HS_ERR_IO;
        return -1;
    }
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        hs_error("%s: not a regular file; give a JSONL or .hst file", path);
        close(fd);
        *st = HS_ERR_INVALID;
        return -1;
    }
    char magic[4] = {0};
    *is_hst = pread(fd, magic, sizeof(magic), 0) == (ssize_t)sizeof(magic) &&
              memcmp(magic, HST_MAGIC, 4) == 0;
    *size = (uint64_t)sb.st_size;
    return fd;
}

static char *dir_of(const char *path)
{
    const char *slash = strrchr(path, '/');
    if (!slash) return strdup(".");
    if (slash == path) return strdup("/");
    return strndup(path, (size_t)(slash - path));
}

hs_status_t hs_dataset_import(const char *in, const char *out, hs_dataset_progress_cb cb,
                              void *cb_arg, hs_dataset_summary_t *sum)
{
    if (!in || !out) return HS_ERR_INVALID;
    const char *inputs[] = {in};
    if (hs_outfile_check(out, inputs, 1) != HS_OK) return HS_ERR_INVALID; /* logged */
    bool is_hst = false;
    uint64_t size = 0;
    hs_status_t st = HS_OK;
    hs_dataset_summary_t s;
    int in_fd = dataset_open_fd(in, &is_hst, &size, &st);
    if (in_fd < 0) return st;
    if (is_hst) {
        close(in_fd);
        hs_dataset_t *ds = NULL;
        if ((st = hs_dataset_open(in, &ds)) != HS_OK) return st;
        st = hs_dataset_write_hst(ds, out);
        if (st == HS_OK) summary_of_dataset(ds, &s);
        hs_dataset_close(ds);
        if (st == HS_OK && sum) *sum = s;
        return st;
    }

    char *dir = dir_of(out);
    size_t plen = strlen(out);
    char *tmp = malloc(plen + 16);
    int out_fd = -1, spool_fd = -1;
    if (!dir || !tmp) {
        st = HS_ERR_NOMEM;
        goto out;
    }
    snprintf(tmp, plen + 16, "%s.tmp.XXXXXX", out);
    out_fd = mkstemp(tmp);
    if (out_fd < 0) {
        hs_error("%s: cannot create temporary file %s: %m; check the folder exists and is writable",
                 out, tmp);
        st = HS_ERR_IO;
        goto out;
    }
    (void)fchmod(out_fd, 0644); /* mkstemp makes 0600; a dataset is meant to be shared */
    spool_fd = open_unlinked(dir);
    if (spool_fd < 0) {
        hs_error("%s: cannot create a temporary file in %s: %m", out, dir);
        st = HS_ERR_IO;
        goto err_unlink;
    }
    st = jsonl_stream_hst(in, in_fd, size, out_fd, tmp, spool_fd, cb, cb_arg, &s);
    if (st != HS_OK) goto err_unlink;
    if (fsync(out_fd) != 0) {
        hs_error("%s: fsync failed: %m", tmp);
        st = HS_ERR_IO;
        goto err_unlink;
    }
    int rc = close(out_fd);
    out_fd = -1;
    if (rc != 0) {
        hs_error("%s: close failed: %m", tmp);
        st = HS_ERR_IO;
        goto err_unlink;
    }
    if (rename(tmp, out) != 0) {
        hs_error("cannot rename %s to %s: %m", tmp, out);
        st = HS_ERR_IO;
        goto err_unlink;
    }
    if (sum) *sum = s;
    goto out;

err_unlink:
    unlink(tmp);
out:
    if (out_fd >= 0) close(out_fd);
    if (spool_fd >= 0) close(spool_fd);
    close(in_fd);
    free(tmp);
    free(dir);
    return st;
}

hs_status_t hs_dataset_summarize(const char *path, hs_dataset_progress_cb cb, void *cb_arg,
                                 hs_dataset_summary_t *sum)
{
    if (!path || !sum) return HS_ERR_INVALID;
    bool is_hst = false;
    uint64_t size = 0;
    hs_status_t st = HS_OK;
    hs_dataset_summary_t s;
    int in_fd = dataset_open_fd(path, &is_hst, &size, &st);
    if (in_fd < 0) return st;
    if (is_hst) {
        close(in_fd);
        hs_dataset_t *ds = NULL;
        if ((st = hs_dataset_open(path, &ds)) != HS_OK) return st;
        summary_of_dataset(ds, sum);
        hs_dataset_close(ds);
        return HS_OK;
    }
    const char *dir = getenv("TMPDIR");
    if (!dir || !*dir) dir = "/var/tmp";
    int out_fd = open_unlinked(dir), spool_fd = out_fd >= 0 ? open_unlinked(dir) : -1;
    if (spool_fd < 0) {
        hs_error("%s: cannot create a temporary file in %s: %m; set TMPDIR to a writable folder "
                 "with room for 5 bytes per token",
                 path, dir);
        st = HS_ERR_IO;
    } else {
        st = jsonl_stream_hst(path, in_fd, size, out_fd, dir, spool_fd, cb, cb_arg, &s);
        if (st == HS_OK) *sum = s;
    }
    if (out_fd >= 0) close(out_fd);
    if (spool_fd >= 0) close(spool_fd);
    close(in_fd);
    return st;
}
