/* SPDX-License-Identifier: Apache-2.0 */
/* dataset_int.h - the dataset internals shared by the files of data/:
 *
 *   dataset.c        the dataset object: open (the format told by content),
 *                    close, the accessors, a dataset built from arrays
 *   dataset_jsonl.c  the JSONL reader: lines, their fast and full parsers
 *   dataset_hst.c    the .hst reader: an image checked field by field, the
 *                    read-only mapping of a file and its SIGBUS guard
 *   dataset_write.c  the .hst writers: hs_dataset_write_hst, and the
 *                    streaming import and summary of a JSONL file
 *
 * The .hst ("hsflow tokens") file format, version 1, all little-endian
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
#ifndef HS_DATASET_INT_H
#define HS_DATASET_INT_H

#include <stdatomic.h>
#include <stdbool.h>
#include <sys/stat.h>

#include "hs_data.h"

#define HS__HST_MAGIC "HSTK"
#define HS__HST_VERSION 1u
#define HS__HST_HEADER_BYTES 64u
#define HS__HST_CRC_OFFSET 60u

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
    /* takes map_slot off the SIGBUS guard at close (set by the .hst reader,
     * so the dataset object needs no call into it) */
    void (*map_release)(int slot);
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

/* ---- dataset.c ----------------------------------------------------------- */

/* Opens `path` for reading a dataset; *is_hst says which format it holds.
 * Returns the fd or -1 (logged, *st set). */
int hs__dataset_open_fd(const char *path, bool *is_hst, uint64_t *size, hs_status_t *st);

/* A zeroed dataset of `format` with no file behind it; NULL without memory. */
hs_dataset_t *hs__dataset_alloc(hs_dataset_format_t format);
/* XXH3-64 of the canonical body (see hs_dataset_fingerprint). */
uint64_t hs__body_fingerprint(const uint64_t *offsets, uint64_t n, const int32_t *ids,
                              const uint8_t *mask, uint64_t total);

/* ---- dataset_jsonl.c ----------------------------------------------------- */

/* The tokens of one parsed line, reused from line to line: the capacity
 * grows to the longest line, never with the number of lines. */
typedef struct {
    int32_t *ids;
    uint8_t *mask;
    size_t cap;
    size_t len;
} hs__jsonl_line_t;
void hs__jsonl_line_free(hs__jsonl_line_t *l);

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
} hs__line_reader_t;

/* Starts reading fd (named `path` in messages) from its first byte. */
hs_status_t hs__line_reader_init(hs__line_reader_t *r, const char *path, int fd);
void hs__line_reader_free(hs__line_reader_t *r);
/* The next sequence of the file: 1 with *l filled, 0 at the end, < 0 an
 * hs_status_t (logged). Blank lines are skipped, a BOM on line 1 too. */
int hs__jsonl_next(hs__line_reader_t *r, hs__jsonl_line_t *l);
/* The non-blank lines of the file (what hs__jsonl_next will hand out, if every
 * line parses). */
int hs__jsonl_count_lines(hs__line_reader_t *r, uint64_t *n, hs_dataset_progress_cb cb, void *arg,
                          uint64_t size);
/* Logs that `path` holds no sequence, saying what a line should look like. */
void hs__jsonl_no_sequences(const char *path);
/* Loads the JSONL file open as fd into a dataset of its own memory. */
hs_status_t hs__dataset_load_jsonl(const char *path, int fd, hs_dataset_t **out);

/* ---- dataset_hst.c ------------------------------------------------------- */

/* Checks an .hst image p[size] field by field; when it is sound, *out is a
 * dataset whose ids and mask point into the image (the caller gives the
 * dataset the image to keep) and whose offsets are its own copy, the one
 * that was checked. */
hs_status_t hs__hst_parse(const char *path, const uint8_t *p, uint64_t size, hs_dataset_t **out);
/* Maps the .hst file open as fd, guarded, and checks it (hs__hst_parse). */
hs_status_t hs__dataset_load_hst(const char *path, int fd, hs_dataset_t **out);
/* Takes a mapping's slot (ds->map_slot, -1 = none) off the SIGBUS guard. */
void hs__hst_unregister(int slot);

/* ---- dataset.c ------------------------------------------------------------ */

/* Writes buf[len] to fd, resuming after short writes and EINTR. */
hs_status_t hs__write_all(int fd, const void *buf, size_t len);

/* ---- the plan's option table (options.c) ---- */

/* Every number and choice of cfg within its option's bounds: HS_OK, or
 * HS_ERR_INVALID with why[cap] naming the first that is not. */
hs_status_t hs__plan_config_check(const hs_plan_config_t *cfg, char *why, size_t cap);

#endif /* HS_DATASET_INT_H */
