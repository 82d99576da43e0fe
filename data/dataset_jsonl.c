/* SPDX-License-Identifier: Apache-2.0 */
/* dataset_jsonl.c - the JSONL reader: a file read line by line through one
 * buffer, each line taken by a fast parser when it is in the plain form
 * writers produce and by cJSON otherwise (which decides what is accepted and
 * what each error says); whole files into a dataset of its own memory. */
#include "dataset_int.h"
#include "hs_log.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

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

#define JSONL_HINT                                                                                 \
    "fix or remove this line (each line must be a JSON object such as "                            \
    "{\"input_ids\": [1, 2, 3], \"loss_mask\": [0, 1, 1]}, loss_mask optional)"

static void jsonl_fail(const char *path, uint64_t lineno, const char *what)
{
    hs_error("%s:%" PRIu64 ": %s; " JSONL_HINT, path, lineno, what);
}

static bool line_reserve(hs__jsonl_line_t *l, size_t n)
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

void hs__jsonl_line_free(hs__jsonl_line_t *l)
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
                                         hs__jsonl_line_t *l)
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

static bool is_digit(char c) { return (unsigned)(c - '0') <= 9u; }

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
static bool jsonl_parse_line_fast(const char *p, const char *end, hs__jsonl_line_t *l)
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

#define LINE_READER_CHUNK (4u << 20)

hs_status_t hs__line_reader_init(hs__line_reader_t *r, const char *path, int fd)
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

void hs__line_reader_free(hs__line_reader_t *r)
{
    free(r->buf);
    r->buf = NULL;
}

/* 1: a line in [*s, *s + *len); 0: end of file; < 0: an hs_status_t. */
static int reader_next(hs__line_reader_t *r, char **s, size_t *len)
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

int hs__jsonl_next(hs__line_reader_t *r, hs__jsonl_line_t *l)
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

int hs__jsonl_count_lines(hs__line_reader_t *r, uint64_t *n, hs_dataset_progress_cb cb, void *arg,
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

static hs_status_t jsonl_append(const char *path, uint64_t lineno, const hs__jsonl_line_t *l,
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

void hs__jsonl_no_sequences(const char *path)
{
    hs_error("%s: no sequences (the file is empty or only blank lines); give it one JSON "
             "object per line such as {\"input_ids\": [1, 2, 3]}",
             path);
}

hs_status_t hs__dataset_load_jsonl(const char *path, int fd, hs_dataset_t **out)
{
    jsonl_build_t b = {0};
    hs__jsonl_line_t l = {0};
    hs__line_reader_t r;
    hs_status_t st = hs__line_reader_init(&r, path, fd);
    int got;
    if (st != HS_OK) goto err_free;
    while ((got = hs__jsonl_next(&r, &l)) == 1) {
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
        hs__jsonl_no_sequences(path);
        st = HS_ERR_FORMAT;
        goto err_free;
    }

    hs_dataset_t *ds = hs__dataset_alloc(HS_DATASET_JSONL);
    if (!ds) {
        st = HS_ERR_NOMEM;
        goto err_free;
    }
    ds->n = b.n;
    ds->total = b.total;
    ds->offsets = ds->own_offsets = b.offsets;
    ds->ids = ds->own_ids = b.ids;
    ds->mask = ds->own_mask = b.mask;
    ds->fingerprint = hs__body_fingerprint(ds->offsets, ds->n, ds->ids, ds->mask, ds->total);
    hs__line_reader_free(&r);
    hs__jsonl_line_free(&l);
    *out = ds;
    return HS_OK;

err_free:
    hs__line_reader_free(&r);
    hs__jsonl_line_free(&l);
    free(b.offsets);
    free(b.ids);
    free(b.mask);
    return st;
}
