/* SPDX-License-Identifier: Apache-2.0 */
/* dataset_open.c - hs_dataset_open and hs_dataset_open_memory: the format
 * told apart by content, then the JSONL reader (dataset_jsonl.c) or the .hst
 * reader (dataset_hst.c); see hs_data.h. */
#include "dataset_int.h"
#include "hs_log.h"
#include "hs_time.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include <stdio.h>

hs_status_t hs_dataset_open(const char *path, hs_dataset_t **out)
{
    if (!path || !out) return HS_ERR_INVALID;
    bool is_hst = false;
    uint64_t size = 0;
    hs_status_t st = HS_OK;
    int fd = hs__dataset_open_fd(path, &is_hst, &size, &st);
    if (fd < 0) return st;
    hs_dataset_t *ds = NULL;
    uint64_t t0 = hs_now_ns();
    st = is_hst ? hs__dataset_load_hst(path, fd, &ds) : hs__dataset_load_jsonl(path, fd, &ds);
    close(fd);
    if (st != HS_OK) return st;
    hs_debug("dataset %s: %s, %" PRIu64 " sequences, %" PRIu64 " tokens, fingerprint %016" PRIx64
             ", loaded in %.3f s",
             path, ds->format == HS_DATASET_HST ? "hst" : "jsonl", ds->n, ds->total,
             ds->fingerprint, (double)(hs_now_ns() - t0) * 1e-9);
    *out = ds;
    return HS_OK;
}

hs_status_t hs_dataset_open_memory(const void *buf, size_t len, const char *name,
                                   hs_dataset_t **out)
{
    if ((!buf && len) || !name || !out) return HS_ERR_INVALID;
    hs_status_t st;
    hs_dataset_t *ds = NULL;
    if (len >= 4 && memcmp(buf, HS__HST_MAGIC, 4) == 0) {
        uint8_t *image = malloc(len);
        if (!image) return HS_ERR_NOMEM;
        memcpy(image, buf, len);
        st = hs__hst_parse(name, image, len, &ds);
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
        st = hs__write_all(fd, buf, len);
        if (st != HS_OK || lseek(fd, 0, SEEK_SET) != 0) {
            hs_error("%s: cannot copy %zu bytes into a memory file: %m", name, len);
            close(fd);
            return HS_ERR_IO;
        }
        st = hs__dataset_load_jsonl(name, fd, &ds);
        close(fd);
        if (st != HS_OK) return st;
    }
    *out = ds;
    return HS_OK;
}
