/* SPDX-License-Identifier: Apache-2.0 */
/* dataset_write.c - the .hst writers (the format is in dataset_int.h): a
 * dataset in memory written whole, and a JSONL file streamed into an .hst in
 * bounded memory (hs_dataset_import), which also gives the summary of a JSONL
 * file too large to load (hs_dataset_summarize). Every .hst is written to a
 * temporary file, flushed and renamed over its target. */
#include "dataset_int.h"
#include "hs_log.h"
#include "hs_checksum.h"
#include "hs_outfile.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#define XXH_STATIC_LINKING_ONLY /* XXH3_state_t on the stack */
#include <xxhash.h>

static void hst_header(uint8_t h[HS__HST_HEADER_BYTES], uint64_t n, uint64_t total, uint64_t fp)
{
    uint16_t version = HS__HST_VERSION, hbytes = HS__HST_HEADER_BYTES;
    memset(h, 0, HS__HST_HEADER_BYTES);
    memcpy(h, HS__HST_MAGIC, 4);
    memcpy(h + 4, &version, 2);
    memcpy(h + 6, &hbytes, 2);
    memcpy(h + 8, &n, 8);
    memcpy(h + 16, &total, 8);
    memcpy(h + 24, &fp, 8);
    uint32_t crc = hs_crc32c(0, h, HS__HST_CRC_OFFSET);
    memcpy(h + HS__HST_CRC_OFFSET, &crc, 4);
}

hs_status_t hs_dataset_write_hst(const hs_dataset_t *ds, const char *path)
{
    if (!ds || !path) return HS_ERR_INVALID;
    uint8_t h[HS__HST_HEADER_BYTES];
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
    if (hs__write_all(fd, h, sizeof(h)) ||
        hs__write_all(fd, ds->offsets, (size_t)(ds->n + 1) * 8) ||
        hs__write_all(fd, ds->ids, (size_t)ds->total * 4) ||
        hs__write_all(fd, ds->mask, (size_t)ds->total)) {
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
    hs__line_reader_t r = {0};
    hs__jsonl_line_t l = {0};
    uint8_t *bufs = malloc(3 * (size_t)STREAM_BUF_BYTES + COPY_BUF_BYTES);
    pos_writer_t w_off = {out_fd, out_name, HS__HST_HEADER_BYTES, NULL, 0};
    pos_writer_t w_ids = {out_fd, out_name, 0, NULL, 0};
    pos_writer_t w_mask = {spool_fd, "the mask spool file", 0, NULL, 0};
    uint64_t n = 0;
    int got = 0;
    hs_status_t st = bufs ? hs__line_reader_init(&r, path, in_fd) : HS_ERR_NOMEM;
    if (st != HS_OK) goto out;
    w_off.buf = bufs;
    w_ids.buf = bufs + STREAM_BUF_BYTES;
    w_mask.buf = bufs + 2 * (size_t)STREAM_BUF_BYTES;
    uint8_t *copy_buf = bufs + 3 * (size_t)STREAM_BUF_BYTES;

    got = hs__jsonl_count_lines(&r, &n, cb, arg, in_size);
    if (got < 0) {
        st = (hs_status_t)got;
        goto out;
    }
    if (n == 0) {
        hs__jsonl_no_sequences(path);
        st = HS_ERR_FORMAT;
        goto out;
    }
    hs__line_reader_free(&r);
    st = hs__line_reader_init(&r, path, in_fd);
    if (st != HS_OK) goto out;

    summary_start(sum, HS_DATASET_JSONL);
    uint64_t zero = 0, next_report = 0;
    w_ids.pos = HS__HST_HEADER_BYTES + (n + 1) * sizeof(uint64_t);
    st = pw_put(&w_off, &zero, sizeof(zero));
    while (st == HS_OK && (got = hs__jsonl_next(&r, &l)) == 1) {
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
    uint64_t ids_end = w_ids.pos, body = ids_end - HS__HST_HEADER_BYTES + sum->total, done = 0;
    st = hash_copy(out_fd, out_name, HS__HST_HEADER_BYTES, ids_end - HS__HST_HEADER_BYTES, &h, -1,
                   NULL, 0, copy_buf, cb, arg, &done, body);
    if (st == HS_OK)
        st = hash_copy(spool_fd, "the mask spool file", 0, sum->total, &h, out_fd, out_name,
                       ids_end, copy_buf, cb, arg, &done, body);
    if (st != HS_OK) goto out;
    sum->fingerprint = XXH3_64bits_digest(&h);
    uint8_t head[HS__HST_HEADER_BYTES];
    hst_header(head, n, sum->total, sum->fingerprint);
    if (pwrite_all(out_fd, head, sizeof(head), 0) != HS_OK) {
        hs_error("%s: write failed: %m; check free disk space", out_name);
        st = HS_ERR_IO;
    }
out:
    hs__line_reader_free(&r);
    hs__jsonl_line_free(&l);
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
    int in_fd = hs__dataset_open_fd(in, &is_hst, &size, &st);
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
    int in_fd = hs__dataset_open_fd(path, &is_hst, &size, &st);
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
