/* SPDX-License-Identifier: Apache-2.0 */
/* fuzz_hst.c - the .hst token file reader (data/dataset_hst.c): header
 * magic, version, size and CRC-32C, the counts against the file size, the
 * offsets, the body fingerprint, token values.
 *
 * Input: an .hst file's bytes ("HSTK" is put in front when missing). Each
 * input is read as is, then with its header CRC made right, then with its
 * body fingerprint made right too, so that mutations reach the checks past
 * each integrity check. An accepted dataset is walked in full. */
#include <stdint.h>
#include <string.h>
#include <xxhash.h>

#include "fuzz_dataset_common.h"
#include "hs_checksum.h"

static void try_open(const uint8_t *p, size_t n)
{
    hs_dataset_t *ds = NULL;
    if (hs_dataset_open_memory(p, n, "fuzz.hst", &ds) != HS_OK) return;
    if (hs_dataset_format(ds) != HS_DATASET_HST) abort();
    fuzz_dataset_check(ds);
    hs_dataset_close(ds);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    uint8_t *p = malloc(size + 4);
    if (!p) abort();
    size_t n = size;
    if (size >= 4 && memcmp(data, "HSTK", 4) == 0) {
        memcpy(p, data, size);
    } else {
        memcpy(p, "HSTK", 4);
        memcpy(p + 4, data, size);
        n += 4;
    }
    try_open(p, n);
    if (n >= 64) {
        uint32_t crc = hs_crc32c(0, p, 60);
        memcpy(p + 60, &crc, 4);
        try_open(p, n);
        uint64_t fp = XXH3_64bits(p + 64, n - 64); /* the body is offsets, ids, mask */
        memcpy(p + 24, &fp, 8);
        crc = hs_crc32c(0, p, 60);
        memcpy(p + 60, &crc, 4);
        try_open(p, n);
    }
    free(p);
    return 0;
}
