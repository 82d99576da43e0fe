/* SPDX-License-Identifier: Apache-2.0 */
/* fuzz_state.c - the consumer's resume state (consumer/state.c), the JSON a
 * trainer saves in its checkpoint and gives back through --resume-state or
 * Consumer(resume=...): version, plan, counts, the partial epochs and their
 * base64 bitmaps.
 *
 * Input: the state's text. An accepted state encodes to text that decodes
 * again and encodes to the same text; bound to its own plan (up to 65536
 * batches per epoch and 64 epochs, to keep each run short) it holds exactly
 * the batches it counts. */
#include <stdlib.h>
#include <string.h>

#include "state_int.h"

static char *encode(const hs_state_t *s, size_t *len)
{
    if (hs_state_encode(s, NULL, 0, len) != HS_ERR_NOSPACE) abort();
    char *buf = malloc(*len + 1);
    if (!buf || hs_state_encode(s, buf, *len + 1, len) != HS_OK) abort();
    return buf;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char why[512];
    hs_state_t *s = NULL, *again = NULL, *bound = NULL;
    if (hs_state_decode((const char *)data, size, &s, why, sizeof why) != HS_OK) return 0;
    size_t n1, n2;
    char *t1 = encode(s, &n1);
    if (hs_state_decode(t1, n1, &again, why, sizeof why) != HS_OK) abort();
    char *t2 = encode(again, &n2);
    if (n1 != n2 || memcmp(t1, t2, n1) != 0) abort(); /* encoding is canonical */

    uint32_t epochs = hs_state_epochs(s), n = hs_state_n_batches(s);
    uint64_t plan = hs_state_plan_hash(s);
    hs_state_order_t order = strstr(t1, "\"order\":\"plan\"") ? HS_STATE_PLAN : HS_STATE_ARRIVAL;
    if (hs_state_has_plan(s) && n >= 1 && n <= 65536 && epochs >= 1 && epochs <= 64 &&
        hs_state_check_run(s, epochs, order, why, sizeof why) == HS_OK &&
        hs_state_check_plan(s, plan, n, why, sizeof why) == HS_OK &&
        hs_state_bind(s, plan, n, epochs, order, &bound) == HS_OK) {
        uint64_t have = 0;
        for (uint32_t e = 0; e < epochs; e++)
            for (uint32_t b = 0; b < n; b++)
                have += hs_state_has(bound, e, b);
        if (have != hs_state_delivered(bound) || have != hs_state_delivered(s)) abort();
        free(hs_state_done_bits(bound));
        hs_state_mark(bound, epochs - 1, n - 1);
        free(encode(bound, &n1));
    }
    hs_state_destroy(bound);
    free(t1);
    free(t2);
    hs_state_destroy(again);
    hs_state_destroy(s);
    return 0;
}
