/* SPDX-License-Identifier: Apache-2.0 */
/* fuzz_jsonl.c - the JSONL dataset reader (data/dataset_jsonl.c): one
 * {"input_ids": [...], "loss_mask": [...]} object per line, blank lines,
 * a UTF-8 BOM, NUL bytes, numbers out of range.
 *
 * Input: a file's bytes, read through hs_dataset_open_memory exactly as
 * hs_dataset_open reads a file. An accepted dataset is walked in full and
 * must give the same fingerprint when read again. */
#include <string.h>

#include "fuzz_dataset_common.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size >= 4 && memcmp(data, "HSTK", 4) == 0) return 0; /* fuzz_hst's ground */
    hs_dataset_t *ds = NULL, *again = NULL;
    if (hs_dataset_open_memory(data, size, "fuzz.jsonl", &ds) != HS_OK) return 0;
    if (hs_dataset_format(ds) != HS_DATASET_JSONL) abort();
    fuzz_dataset_check(ds);
    if (hs_dataset_open_memory(data, size, "fuzz.jsonl", &again) != HS_OK ||
        hs_dataset_fingerprint(again) != hs_dataset_fingerprint(ds))
        abort();
    hs_dataset_close(again);
    hs_dataset_close(ds);
    return 0;
}
