/* SPDX-License-Identifier: Apache-2.0 */
/* plan.c - deterministic packing of a dataset into token-budget batches.
 *
 * Packing is first-fit-decreasing: sequences sorted longest first (ties by
 * sample id) each go into the lowest-numbered batch that still has room, a
 * new batch opening when none has. Finding "the first batch with at least
 * len tokens free" uses a max segment tree over the batches' free space, so
 * the whole plan costs O(n log n). Long sequences fill the first batches and
 * the short ones top up their leftover room, so batches come out nearly full
 * while sequences of similar length still tend to share a batch. */
#include "hs_data.h"
#include "dataset_int.h" /* hs__plan_config_check */
#include "hs_region.h"   /* hs_batch_view_t */
#include "hs_log.h"
#include "hs_time.h"
#include "hs_plan_hash.h"
#include "hs_shuffle.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#define XXH_STATIC_LINKING_ONLY /* XXH3_state_t on the stack */
#include <xxhash.h>

struct hs_plan {
    hs_plan_config_t cfg;
    uint64_t fingerprint;
    uint64_t basis, hash;
    uint32_t n_batches;
    uint64_t *batch_start;  /* n_batches+1 indices into sample_ids/lengths */
    uint32_t *batch_tokens; /* n_batches */
    uint64_t *sample_ids;   /* n_kept, batch by batch */
    uint32_t *lengths;      /* n_kept */
    hs_plan_stats_t stats;
};

typedef struct {
    uint64_t id;
    uint32_t len;
    uint32_t bin;
} plan_item_t;

const char *hs_overflow_str(hs_overflow_t policy)
{
    return policy == HS_OVERFLOW_DROP ? "drop" : "truncate";
}

hs_status_t hs_overflow_parse(const char *s, hs_overflow_t *out)
{
    if (!s) return HS_ERR_INVALID;
    if (strcasecmp(s, "truncate") == 0) {
        *out = HS_OVERFLOW_TRUNCATE;
        return HS_OK;
    }
    if (strcasecmp(s, "drop") == 0) {
        *out = HS_OVERFLOW_DROP;
        return HS_OK;
    }
    return HS_ERR_INVALID;
}

static int item_cmp(const void *pa, const void *pb)
{
    const plan_item_t *a = pa, *b = pb;
    if (a->len != b->len) return a->len > b->len ? -1 : 1;
    return (a->id > b->id) - (a->id < b->id);
}

static void hash_u32(XXH3_state_t *st, uint32_t v) { XXH3_64bits_update(st, &v, 4); }
static void hash_u64(XXH3_state_t *st, uint64_t v) { XXH3_64bits_update(st, &v, 8); }

/* Canonical little-endian form of everything that defines the plan: its
 * basis, which the plan hash binds to the batch shapes (plan_seal). */
static uint64_t plan_compute_basis(const hs_plan_t *p, uint64_t n_kept)
{
    XXH3_state_t st;
    XXH3_64bits_reset(&st);
    XXH3_64bits_update(&st, "HSPLAN01", 8);
    hash_u64(&st, p->fingerprint);
    hash_u32(&st, p->cfg.token_budget);
    hash_u32(&st, p->cfg.max_seq_len);
    hash_u32(&st, (uint32_t)p->cfg.overflow);
    hash_u64(&st, p->cfg.seed);
    hash_u32(&st, p->n_batches);
    hash_u64(&st, n_kept);
    XXH3_64bits_update(&st, p->batch_start, ((size_t)p->n_batches + 1) * sizeof(uint64_t));
    XXH3_64bits_update(&st, p->sample_ids, (size_t)n_kept * sizeof(uint64_t));
    XXH3_64bits_update(&st, p->lengths, (size_t)n_kept * sizeof(uint32_t));
    return XXH3_64bits_digest(&st);
}

/* The plan hash: the basis and every batch's shape (hs_plan_hash_of). */
static hs_status_t plan_seal(hs_plan_t *p)
{
    uint32_t *n_seqs = malloc(((size_t)p->n_batches + 1) * sizeof(uint32_t));
    if (!n_seqs) return HS_ERR_NOMEM;
    for (uint32_t b = 0; b < p->n_batches; b++)
        n_seqs[b] = (uint32_t)(p->batch_start[b + 1] - p->batch_start[b]);
    p->hash = hs_plan_hash_of(p->basis, p->n_batches, n_seqs, p->batch_tokens);
    free(n_seqs);
    return HS_OK;
}

/* First-fit-decreasing over sorted items; sets each item's bin and returns
 * the number of bins, with bin_tokens[b] their fill (bin_tokens has room for
 * n entries). */
/* Progress of a long plan (millions of sequences): a line every
 * progress_interval_s seconds, checked every 2^16 sequences so the loops
 * stay tight. */
typedef struct {
    double interval, t_last, t_start; /* interval < 0: never */
} plan_progress_t;

static void plan_progress_init(plan_progress_t *pg, double interval_s)
{
    pg->interval = interval_s == 0 ? 5.0 : interval_s;
    pg->t_start = pg->t_last = hs_now_s();
}

static void plan_progress(plan_progress_t *pg, const char *what, uint64_t i, uint64_t n)
{
    if ((i & 0xffff) || i == 0 || pg->interval < 0) return;
    double now = hs_now_s();
    if (now - pg->t_last < pg->interval) return;
    pg->t_last = now;
    hs_info("plan: %s %" PRIu64 " of %" PRIu64 " sequences (%.0f%%, %.1f s so far)", what, i, n,
            100.0 * (double)i / (double)n, now - pg->t_start);
}

static hs_status_t plan_pack(plan_item_t *items, uint64_t n, uint32_t budget, uint64_t *n_bins_out,
                             uint32_t **bin_tokens_out, plan_progress_t *pg)
{
    uint64_t leaves = 1;
    while (leaves < n)
        leaves *= 2;
    /* tree[1] is the root; leaves at [leaves, 2*leaves); each node holds the
     * largest free space below it. Unopened batches have the whole budget,
     * and there are always more leaves than items, so a fit always exists. */
    uint32_t *tree = malloc((size_t)(2 * leaves) * sizeof(uint32_t));
    if (!tree) return HS_ERR_NOMEM;
    for (uint64_t i = 0; i < 2 * leaves; i++)
        tree[i] = budget;
    uint64_t n_bins = 0;
    for (uint64_t i = 0; i < n; i++) {
        plan_progress(pg, "packed", i, n);
        uint32_t len = items[i].len;
        uint64_t node = 1;
        while (node < leaves)
            node = tree[2 * node] >= len ? 2 * node : 2 * node + 1;
        uint64_t bin = node - leaves;
        tree[node] -= len;
        for (node /= 2; node >= 1; node /= 2) {
            uint32_t l = tree[2 * node], r = tree[2 * node + 1];
            tree[node] = l > r ? l : r;
        }
        items[i].bin = (uint32_t)bin;
        if (bin + 1 > n_bins) n_bins = bin + 1;
    }
    uint32_t *bin_tokens = malloc((size_t)(n_bins ? n_bins : 1) * sizeof(uint32_t));
    if (!bin_tokens) {
        free(tree);
        return HS_ERR_NOMEM;
    }
    for (uint64_t b = 0; b < n_bins; b++)
        bin_tokens[b] = budget - tree[leaves + b];
    free(tree);
    *n_bins_out = n_bins;
    *bin_tokens_out = bin_tokens;
    return HS_OK;
}

hs_status_t hs_plan_build(const hs_dataset_t *ds, const hs_plan_config_t *cfg, hs_plan_t **out)
{
    if (!ds || !cfg || !out) return HS_ERR_INVALID;
    hs_plan_config_t c = *cfg;
    char why[256];
    if (hs__plan_config_check(&c, why, sizeof(why)) != HS_OK) {
        hs_error("plan: %s", why);
        return HS_ERR_INVALID;
    }
    if (c.max_seq_len == 0) c.max_seq_len = c.token_budget;
    if (c.max_seq_len > c.token_budget) {
        hs_error("plan: max sequence length %" PRIu32 " exceeds the token budget %" PRIu32
                 "; a sequence must fit in one batch: lower --max-seq-len or raise --token-budget",
                 c.max_seq_len, c.token_budget);
        return HS_ERR_INVALID;
    }

    hs_status_t st = HS_ERR_NOMEM;
    uint64_t n = hs_dataset_count(ds);
    hs_plan_t *p = calloc(1, sizeof(*p));
    plan_item_t *items = malloc((size_t)(n ? n : 1) * sizeof(plan_item_t));
    uint32_t *bin_tokens = NULL;
    if (!p || !items) goto err_free;
    p->cfg = c;
    p->fingerprint = hs_dataset_fingerprint(ds);
    p->stats.n_samples = n;
    p->stats.max_seq_len = c.max_seq_len;

    plan_progress_t pg;
    plan_progress_init(&pg, c.progress_interval_s);
    uint64_t k = 0;
    for (uint64_t i = 0; i < n; i++) {
        plan_progress(&pg, "measured", i, n);
        uint32_t len = hs_dataset_seq_len(ds, i);
        if (len > c.max_seq_len) {
            if (c.overflow == HS_OVERFLOW_DROP) {
                p->stats.n_dropped++;
                p->stats.tokens_dropped += len;
                continue;
            }
            p->stats.n_truncated++;
            p->stats.tokens_dropped += len - c.max_seq_len;
            len = c.max_seq_len;
        }
        items[k].id = i;
        items[k].len = len;
        items[k].bin = 0;
        k++;
    }
    if (k == 0) {
        hs_error("plan: all %" PRIu64 " sequences are longer than max sequence length %" PRIu32
                 " and the overflow policy is drop; use --overflow truncate or raise --max-seq-len",
                 n, c.max_seq_len);
        st = HS_ERR_INVALID;
        goto err_free;
    }
    if (pg.interval >= 0 && hs_now_s() - pg.t_start >= pg.interval)
        hs_info("plan: sorting %" PRIu64 " sequences by length", k);
    qsort(items, (size_t)k, sizeof(*items), item_cmp);

    uint64_t n_bins = 0;
    st = plan_pack(items, k, c.token_budget, &n_bins, &bin_tokens, &pg);
    if (st != HS_OK) goto err_free;
    if (n_bins > UINT32_MAX) {
        hs_error("plan: %" PRIu64 " batches do not fit 32-bit batch ids; raise --token-budget",
                 n_bins);
        st = HS_ERR_INVALID;
        goto err_free;
    }
    st = HS_ERR_NOMEM;
    p->n_batches = (uint32_t)n_bins;
    p->batch_tokens = bin_tokens;
    bin_tokens = NULL;
    p->batch_start = calloc((size_t)n_bins + 1, sizeof(uint64_t));
    p->sample_ids = malloc((size_t)k * sizeof(uint64_t));
    p->lengths = malloc((size_t)k * sizeof(uint32_t));
    if (!p->batch_start || !p->sample_ids || !p->lengths) goto err_free;

    /* counting sort by batch, stable, so each batch stays longest first */
    for (uint64_t i = 0; i < k; i++)
        p->batch_start[items[i].bin + 1]++;
    for (uint64_t b = 0; b < n_bins; b++)
        p->batch_start[b + 1] += p->batch_start[b];
    uint64_t *cursor = malloc((size_t)n_bins * sizeof(uint64_t));
    if (!cursor) goto err_free;
    memcpy(cursor, p->batch_start, (size_t)n_bins * sizeof(uint64_t));
    for (uint64_t i = 0; i < k; i++) {
        uint64_t at = cursor[items[i].bin]++;
        p->sample_ids[at] = items[i].id;
        p->lengths[at] = items[i].len;
    }
    free(cursor);
    free(items);
    items = NULL;

    p->stats.n_kept = k;
    p->stats.n_batches = p->n_batches;
    p->stats.min_batch_tokens = UINT32_MAX;
    for (uint32_t b = 0; b < p->n_batches; b++) {
        uint32_t t = p->batch_tokens[b];
        p->stats.tokens += t;
        if (t > p->stats.max_batch_tokens) p->stats.max_batch_tokens = t;
        if (t < p->stats.min_batch_tokens) p->stats.min_batch_tokens = t;
    }
    p->stats.mean_fill_pct =
        100.0 * (double)p->stats.tokens / ((double)p->n_batches * (double)c.token_budget);
    p->basis = plan_compute_basis(p, k);
    st = plan_seal(p);
    if (st != HS_OK) goto err_free;
    hs_debug("plan: %" PRIu64 " sequences -> %" PRIu32 " batches, budget %" PRIu32
             ", fill %.1f%%, hash %016" PRIx64,
             k, p->n_batches, c.token_budget, p->stats.mean_fill_pct, p->hash);
    if (pg.t_last > pg.t_start) /* progress was shown: say it is done */
        hs_info("plan: %" PRIu64 " sequences in %" PRIu32 " batches, built in %.1f s", k,
                p->n_batches, hs_now_s() - pg.t_start);
    *out = p;
    return HS_OK;

err_free:
    free(bin_tokens);
    free(items);
    hs_plan_destroy(p);
    return st;
}

void hs_plan_destroy(hs_plan_t *plan)
{
    if (!plan) return;
    free(plan->batch_start);
    free(plan->batch_tokens);
    free(plan->sample_ids);
    free(plan->lengths);
    free(plan);
}

uint32_t hs_plan_n_batches(const hs_plan_t *plan) { return plan->n_batches; }
uint64_t hs_plan_hash(const hs_plan_t *plan) { return plan->hash; }
uint64_t hs_plan_basis(const hs_plan_t *plan) { return plan->basis; }
uint64_t hs_plan_fingerprint(const hs_plan_t *plan) { return plan->fingerprint; }
const hs_plan_config_t *hs_plan_config(const hs_plan_t *plan) { return &plan->cfg; }
void hs_plan_stats(const hs_plan_t *plan, hs_plan_stats_t *out) { *out = plan->stats; }

void hs_plan_warn_lost(const hs_plan_t *plan, const char *data)
{
    const hs_plan_stats_t *s = &plan->stats;
    if (s->tokens_dropped == 0) return;
    uint64_t total = s->tokens + s->tokens_dropped;
    hs_warn("%s: %" PRIu64 " of %" PRIu64 " tokens (%.2f%%) are lost to max seq len %" PRIu32
            " (%" PRIu64 " of %" PRIu64 " sequences truncated, %" PRIu64
            " dropped): raise --max-seq-len (and --token-budget) to train on them",
            data, s->tokens_dropped, total, 100.0 * (double)s->tokens_dropped / (double)total,
            plan->cfg.max_seq_len, s->n_truncated, s->n_samples, s->n_dropped);
}

hs_status_t hs_plan_batch(const hs_plan_t *plan, uint32_t id, hs_plan_batch_t *out)
{
    if (!plan || !out || id >= plan->n_batches) return HS_ERR_INVALID;
    uint64_t s = plan->batch_start[id];
    out->n_seqs = (uint32_t)(plan->batch_start[id + 1] - s);
    out->n_tokens = plan->batch_tokens[id];
    out->sample_ids = plan->sample_ids + s;
    out->lengths = plan->lengths + s;
    return HS_OK;
}

void hs_plan_epoch_order(const hs_plan_t *plan, uint32_t epoch, uint32_t *out)
{
    hs_permutation(plan->cfg.seed, epoch, plan->n_batches, out);
}

hs_status_t hs_plan_fill_batch(const hs_plan_t *plan, const hs_dataset_t *ds, uint32_t batch_id,
                               struct hs_batch_view *view)
{
    hs_plan_batch_t b;
    if (!ds || !view || hs_plan_batch(plan, batch_id, &b) != HS_OK) {
        hs_error("plan: batch %" PRIu32 " does not exist (the plan has %" PRIu32 " batches)",
                 batch_id, plan ? plan->n_batches : 0);
        return HS_ERR_INVALID;
    }
    if (hs_dataset_fingerprint(ds) != plan->fingerprint) {
        hs_error("plan: dataset fingerprint %016" PRIx64 " differs from the plan's %016" PRIx64
                 "; build the plan from the dataset you fill batches from",
                 hs_dataset_fingerprint(ds), plan->fingerprint);
        return HS_ERR_MISMATCH;
    }
    uint32_t t = 0;
    view->cu_seqlens[0] = 0;
    for (uint32_t j = 0; j < b.n_seqs; j++) {
        uint64_t id = b.sample_ids[j];
        uint32_t len = b.lengths[j];
        memcpy(view->input_ids + t, hs_dataset_ids(ds, id), (size_t)len * sizeof(int32_t));
        memcpy(view->loss_mask + t, hs_dataset_mask(ds, id), len);
        view->sample_ids[j] = id;
        t += len;
        view->cu_seqlens[j + 1] = (int32_t)t;
    }
    return hs_dataset_check(ds); /* the file did not change under us while we read */
}
