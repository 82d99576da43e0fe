/* SPDX-License-Identifier: Apache-2.0 */
/* fuzz_dataset_common.h - what the dataset harnesses check on a dataset the
 * reader accepted: every sequence is non-empty, within the token arrays,
 * with ids >= 0 and masks 0/1, and the lengths add up to the total. */
#ifndef FUZZ_DATASET_COMMON_H
#define FUZZ_DATASET_COMMON_H

#include <stdlib.h>

#include "hs_data.h"

static void fuzz_dataset_check(const hs_dataset_t *ds)
{
    uint64_t n = hs_dataset_count(ds), total = 0;
    if (n == 0) abort();
    for (uint64_t i = 0; i < n; i++) {
        uint32_t len = hs_dataset_seq_len(ds, i);
        const int32_t *ids = hs_dataset_ids(ds, i);
        const uint8_t *mask = hs_dataset_mask(ds, i);
        if (len == 0 || !ids || !mask) abort();
        for (uint32_t t = 0; t < len; t++)
            if (ids[t] < 0 || mask[t] > 1) abort();
        total += len;
    }
    if (total != hs_dataset_total_tokens(ds)) abort();
    if (hs_dataset_ids(ds, n) || hs_dataset_seq_len(ds, n)) abort();
}

#endif
