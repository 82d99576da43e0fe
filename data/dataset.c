/* SPDX-License-Identifier: Apache-2.0 */
/* dataset.c - the dataset object: its allocation, the body fingerprint,
 * opening a file's descriptor, the accessors, close, and a dataset built
 * from arrays. Opening by format is dataset_open.c; the readers are
 * dataset_jsonl.c and dataset_hst.c, the writers dataset_write.c;
 * dataset_int.h has the .hst format. */
#include "dataset_int.h"
#include "hs_log.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#define XXH_STATIC_LINKING_ONLY /* XXH3_state_t on the stack */
#include <xxhash.h>

uint64_t hs__body_fingerprint(const uint64_t *offsets, uint64_t n, const int32_t *ids,
                              const uint8_t *mask, uint64_t total)
{
    XXH3_state_t st;
    XXH3_64bits_reset(&st);
    XXH3_64bits_update(&st, offsets, (size_t)(n + 1) * sizeof(uint64_t));
    XXH3_64bits_update(&st, ids, (size_t)total * sizeof(int32_t));
    XXH3_64bits_update(&st, mask, (size_t)total);
    return XXH3_64bits_digest(&st);
}

hs_status_t hs__write_all(int fd, const void *buf, size_t len)
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

hs_dataset_t *hs__dataset_alloc(hs_dataset_format_t format)
{
    hs_dataset_t *ds = calloc(1, sizeof(*ds));
    if (ds) {
        ds->format = format;
        ds->map_slot = -1;
        ds->fd = -1;
    }
    return ds;
}

/* Opens `path` for reading a dataset; *is_hst says which format it holds.
 * Returns the fd or -1 (logged, *st set). */
int hs__dataset_open_fd(const char *path, bool *is_hst, uint64_t *size, hs_status_t *st)
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
              memcmp(magic, HS__HST_MAGIC, 4) == 0;
    *size = (uint64_t)sb.st_size;
    return fd;
}

/* ---- public API ------------------------------------------------------------ */

void hs_dataset_close(hs_dataset_t *ds)
{
    if (!ds) return;
    if (ds->map_release) ds->map_release(ds->map_slot);
    if (ds->map) munmap(ds->map, ds->map_len);
    if (ds->fd >= 0) close(ds->fd);
    free(ds->path);
    free(ds->own_image);
    free(ds->own_offsets);
    free(ds->own_ids);
    free(ds->own_mask);
    free(ds);
}

hs_dataset_format_t hs_dataset_format(const hs_dataset_t *ds) { return ds->format; }
uint64_t hs_dataset_count(const hs_dataset_t *ds) { return ds->n; }
uint64_t hs_dataset_total_tokens(const hs_dataset_t *ds) { return ds->total; }
uint64_t hs_dataset_fingerprint(const hs_dataset_t *ds) { return ds->fingerprint; }

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
    hs_dataset_t *ds = hs__dataset_alloc(HS_DATASET_JSONL);
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
    ds->fingerprint = hs__body_fingerprint(ds->offsets, n, ds->ids, ds->mask, total);
    *out = ds;
    return HS_OK;
}
