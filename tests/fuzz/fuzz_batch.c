/* SPDX-License-Identifier: Apache-2.0 */
/* fuzz_batch.c - the batch region checks (common/region.c): hs_batch_verify,
 * which the consumer runs on every payload a producer delivers, and
 * hs_batch_synth_check behind --verify-synthetic.
 *
 * Input: a mode byte, then the ticket (sequences, tokens, hidden size,
 * layers, epoch, index; kept small so that each run is fast), then bytes.
 *   mode 0: the bytes are the region, as a hostile producer could send it.
 *   mode 1: a well-formed synthetic batch is built from the bytes (sequence
 *           lengths, sample ids, tokens), then up to four bytes of it are
 *           flipped where the input says.
 * Oracles: an intact batch verifies and passes the synthetic check, and its
 * one-pass seal equals fill + seal; a batch with any byte changed outside
 * the unchecked plan_hash field is refused. */
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "hs_proto.h"
#include "hs_checksum.h"
#include "hs_memory.h"

typedef struct {
    const uint8_t *p;
    size_t n;
} input_t;

static uint32_t take(input_t *in)
{
    if (!in->n) return 0;
    in->n--;
    return *in->p++;
}

static uint32_t take32(input_t *in)
{
    uint32_t v = 0;
    for (int i = 0; i < 4; i++)
        v |= take(in) << (8 * i);
    return v;
}

static void *region_alloc(uint64_t bytes)
{
    void *r = aligned_alloc(HS_BATCH_ALIGN, hs_align_up(bytes ? bytes : 1, HS_BATCH_ALIGN));
    if (!r) abort();
    return r;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    input_t in = {data, size};
    char why[512];
    uint32_t mode = take(&in) & 1;
    uint32_t n = 1 + take(&in) % 8;
    uint32_t T = n + take(&in) % 48;
    hs_layout_t l = {1 + take(&in) % 40, HS_DTYPE_BF16, 1 + take(&in) % 3, {0}};
    int32_t layer = 0;
    for (uint32_t i = 0; i < l.n_layers; i++) {
        layer += (int32_t)(take(&in) % 8) + (i ? 1 : 0);
        l.layers[i] = layer;
    }
    if (hs_layout_validate(&l, why, sizeof why) != HS_OK) abort();
    uint32_t epoch = take(&in) % 4, index = take(&in);
    hs_batch_offsets_t o = hs_batch_offsets(n, T, &l);

    if (mode == 0) {
        uint8_t *r = region_alloc(in.n);
        memcpy(r, in.p, in.n);
        if (hs_batch_verify(r, in.n, epoch, index, n, T, &l, why, sizeof why) == HS_OK) {
            hs_batch_view_t v = hs_batch_view(r, n, T, &l);
            if (hs_batch_synth_check(&v, &l, why, sizeof why) != HS_OK)
                why[0] = 0; /* refused with a reason: what most inputs get */
        }
        free(r);
        return 0;
    }

    /* mode 1: a well-formed batch from the input's lengths and ids */
    uint8_t *r = region_alloc(o.total);
    memset(r, 0, o.total);
    hs_batch_view_t v = hs_batch_view(r, n, T, &l);
    hs_batch_header_init(v.header, epoch, index, n, T, &l, take32(&in));
    uint32_t left = T;
    v.cu_seqlens[0] = 0;
    for (uint32_t s = 0; s < n; s++) {
        uint32_t room = left - (n - s - 1); /* each later sequence keeps one token */
        uint32_t len = s + 1 == n ? left : 1 + take(&in) % room;
        left -= len;
        v.cu_seqlens[s + 1] = v.cu_seqlens[s] + (int32_t)len;
        v.sample_ids[s] = take32(&in);
    }
    for (uint32_t t = 0; t < T; t++) {
        v.input_ids[t] = (int32_t)(take(&in) << 8 | take(&in));
        v.loss_mask[t] = (uint8_t)(take(&in) & 1);
    }
    hs_checksum_stream_t *cs = hs_checksum_stream_create();
    if (!cs) abort();
    hs_batch_synth_fill_seal(&v, &l, o.total, cs);
    hs_checksum_stream_destroy(cs);
    uint64_t one_pass = v.header->checksum;
    hs_batch_synth_fill(&v, &l);
    hs_batch_seal(r, o.total);
    if (v.header->checksum != one_pass) abort(); /* the two seals must agree */
    if (hs_batch_verify(r, o.total, epoch, index, n, T, &l, why, sizeof why) != HS_OK) abort();
    if (hs_batch_synth_check(&v, &l, why, sizeof why) != HS_OK) abort();

    uint8_t *orig = malloc(o.total);
    if (!orig) abort();
    memcpy(orig, r, o.total);
    for (int i = 0; i < 4 && in.n >= 3; i++) {
        uint32_t at = (take(&in) | take(&in) << 8 | take(&in) << 16) % (uint32_t)o.total;
        r[at] ^= (uint8_t)take(&in);
    }
    bool changed = false;
    for (uint64_t i = 0; i < o.total && !changed; i++) {
        bool unchecked = i >= offsetof(hs_batch_header_t, plan_hash) &&
                         i < offsetof(hs_batch_header_t, plan_hash) + 8;
        changed = r[i] != orig[i] && !unchecked;
    }
    hs_status_t st = hs_batch_verify(r, o.total, epoch, index, n, T, &l, why, sizeof why);
    if (changed && st == HS_OK) abort(); /* a changed batch went through */
    if (st == HS_OK && hs_batch_synth_check(&v, &l, why, sizeof why) != HS_OK) abort();
    free(orig);
    free(r);
    return 0;
}
