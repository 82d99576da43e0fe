/* SPDX-License-Identifier: Apache-2.0 */
/* fuzz_ucx_addr.c - libFuzzer harness for the check of a peer's UCX worker
 * address (transport/ucx_addr.c), which runs on every address before UCX
 * reads it. Input: an address as it would arrive in an AUTH or ACCEPT.
 * Whatever the walk accepts must lie inside the input; the address filtered
 * against itself must keep every entry and parse back; filtered against
 * the first seed's layout (one entry of each kind) it must parse back too. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ucx_addr_int.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static hs__ucx_addr_t a, back;
    static uint8_t out[1 << 17];
    char why[256];
    if (size > sizeof out) return 0;
    if (hs__ucx_addr_parse(data, size, &a, why, sizeof why) != HS_OK) return 0;
    if (a.header_end > size || a.n_entries > HS__UCX_ADDR_MAX_ENTRIES) abort();
    for (uint32_t i = 0; i < a.n_entries; i++) {
        const hs__ucx_addr_entry_t *e = &a.entries[i];
        if (e->dev_start < a.header_end || e->dev_len_at < e->dev_start ||
            e->dev_end < e->dev_len_at || e->start < e->dev_end || e->len_at < e->start ||
            e->end <= e->len_at || e->end > size || e->md_index >= HS__UCX_ADDR_MAX_MD)
            abort();
    }
    size_t n = 0;
    hs_status_t st = hs__ucx_addr_filter(data, size, &a, out, &n, why, sizeof why);
    if (a.n_entries == 0) {
        if (st == HS_OK) abort();
        return 0;
    }
    if (st != HS_OK || n > size || hs__ucx_addr_parse(out, n, &back, why, sizeof why) != HS_OK ||
        back.n_entries != a.n_entries)
        abort();
    return 0;
}
