/* SPDX-License-Identifier: Apache-2.0 */
/* state.c - the resume state; see state_int.h. */
#include "state_int.h"
#include "hs_log.h"

#include <cjson/cJSON.h>
#include <inttypes.h>
#include <math.h>
#include <sodium.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hs_proto.h"
#include "sched_int.h"

#define B64 sodium_base64_VARIANT_ORIGINAL

typedef struct {
    uint32_t epoch, count;
} state_row_t;

struct hs_state {
    bool has_plan, bound;
    uint64_t plan_hash;
    uint32_t n, epochs; /* batches per epoch (0 without a plan), epochs of the run */
    size_t stride;      /* bytes of one epoch's bitmap */
    hs_state_order_t order;
    uint32_t base;        /* every epoch before it is delivered in full */
    uint32_t n_rows;      /* decoded: the partial epochs; bound: every epoch from base on */
    state_row_t *rows;    /* by epoch, increasing */
    uint8_t *bits;        /* n_rows * stride */
    uint64_t delivered;   /* all epochs */
    uint32_t rank, world; /* world 0 or 1: the whole plan */
    hs_uneven_t uneven;
};

/* Batches of one epoch this state's rank gets. */
static uint32_t state_per_epoch(const hs_state_t *s)
{
    return s->world > 1 ? hs_shard_per_rank(s->n, s->world, (hs_shard_uneven_t)s->uneven) : s->n;
}

void hs_state_set_shard(hs_state_t *s, uint32_t rank, uint32_t world, hs_consumer_uneven_t uneven)
{
    s->rank = rank;
    s->world = world;
    s->uneven = uneven;
}

hs_status_t hs_state_check_shard(const hs_state_t *s, uint32_t rank, uint32_t world,
                                 hs_consumer_uneven_t uneven, char *why, size_t whycap)
{
    uint32_t sw = s->world ? s->world : 1, w = world ? world : 1;
    if (s->rank != rank || sw != w || (w > 1 && s->uneven != uneven)) {
        snprintf(why, whycap,
                 "the resume state belongs to rank %u of %u (--uneven %s), this consumer is rank "
                 "%u of %u (--uneven %s): give each rank its own state, with --rank %u --world %u",
                 s->rank, sw, hs_shard_uneven_str((hs_shard_uneven_t)s->uneven), rank, w,
                 hs_shard_uneven_str((hs_shard_uneven_t)uneven), s->rank, sw);
        return HS_ERR_MISMATCH;
    }
    return HS_OK;
}

static const char *order_str(hs_state_order_t o) { return o == HS_STATE_PLAN ? "plan" : "arrival"; }

static hs_status_t bad(char *why, size_t whycap, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static hs_status_t bad(char *why, size_t whycap, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, whycap, fmt, ap);
    va_end(ap);
    return HS_ERR_FORMAT;
}

void hs_state_destroy(hs_state_t *s)
{
    if (!s) return;
    free(s->rows);
    free(s->bits);
    free(s);
}

hs_status_t hs_state_create_empty(uint32_t epochs, hs_state_order_t order, hs_state_t **out)
{
    hs_state_t *s = calloc(1, sizeof(*s));
    if (!s) return HS_ERR_NOMEM;
    s->epochs = epochs;
    s->order = order;
    *out = s;
    return HS_OK;
}

/* The row holding `epoch`, or -1. */
static int64_t state_row_of(const hs_state_t *s, uint32_t epoch)
{
    if (epoch < s->base) return -1;
    if (s->bound) return epoch - s->base < s->n_rows ? (int64_t)(epoch - s->base) : -1;
    uint32_t lo = 0, hi = s->n_rows;
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo) / 2;
        if (s->rows[mid].epoch < epoch)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < s->n_rows && s->rows[lo].epoch == epoch ? (int64_t)lo : -1;
}

static bool row_bit(const hs_state_t *s, uint32_t row, uint32_t batch)
{
    return s->bits[(size_t)row * s->stride + batch / 8] >> (batch % 8) & 1;
}

uint32_t hs_state_epochs_done(const hs_state_t *s)
{
    uint32_t k = s->base;
    while (k < s->epochs && s->n) {
        int64_t r = state_row_of(s, k);
        if (r < 0 || s->rows[r].count < state_per_epoch(s)) break;
        k++;
    }
    return s->n ? k : 0;
}

bool hs_state_has(const hs_state_t *s, uint32_t epoch, uint32_t batch)
{
    if (!s->has_plan || batch >= s->n || epoch >= s->epochs) return false;
    if (epoch < s->base) return true;
    int64_t r = state_row_of(s, epoch);
    return r >= 0 && row_bit(s, (uint32_t)r, batch);
}

bool hs_state_has_plan(const hs_state_t *s) { return s->has_plan; }
uint64_t hs_state_plan_hash(const hs_state_t *s) { return s->plan_hash; }
uint32_t hs_state_n_batches(const hs_state_t *s) { return s->n; }
uint32_t hs_state_epochs(const hs_state_t *s) { return s->epochs; }
uint64_t hs_state_delivered(const hs_state_t *s) { return s->delivered; }

/* ---- decode ----------------------------------------------------------------- */

/* A whole number in [lo, hi] under `key` of `o`; `what` names the object. */
static hs_status_t get_uint(const cJSON *o, const char *what, const char *key, double lo, double hi,
                            uint64_t *out, char *why, size_t whycap)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!v) return bad(why, whycap, "%s has no \"%s\"", what, key);
    double d = v->valuedouble;
    if (!cJSON_IsNumber(v) || d != floor(d) || d < lo || d > hi)
        return bad(why, whycap, "%s: \"%s\" must be a whole number in %.0f..%.0f", what, key, lo,
                   hi);
    *out = (uint64_t)d;
    return HS_OK;
}

static unsigned popcount8(uint8_t x) { return (unsigned)__builtin_popcount(x); }

/* "rank", "world" and "uneven", absent for a state of one rank. */
static hs_status_t decode_shard_fields(const cJSON *root, hs_state_t *s, char *why, size_t whycap)
{
    const char *top = "resume state";
    if (!cJSON_GetObjectItemCaseSensitive(root, "world")) return HS_OK;
    uint64_t w, r;
    hs_status_t st = get_uint(root, top, "world", 1, 1u << 20, &w, why, whycap);
    if (st) return st;
    if ((st = get_uint(root, top, "rank", 0, (double)w - 1, &r, why, whycap))) return st;
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, "uneven");
    if (cJSON_IsString(v) && !strcmp(v->valuestring, "drop"))
        s->uneven = HS_UNEVEN_DROP;
    else if (cJSON_IsString(v) && !strcmp(v->valuestring, "repeat"))
        s->uneven = HS_UNEVEN_REPEAT;
    else
        return bad(why, whycap, "resume state: \"uneven\" must be \"drop\" or \"repeat\"");
    s->world = (uint32_t)w;
    s->rank = (uint32_t)r;
    return HS_OK;
}

/* The fields of a state with a plan (root checked to be an object). */
static hs_status_t decode_plan_fields(const cJSON *root, hs_state_t *s, char *why, size_t whycap)
{
    const char *top = "resume state";
    uint64_t u;
    hs_status_t st =
        get_uint(root, top, "batches_per_epoch", 1, HS_PLAN_MAX_BATCHES, &u, why, whycap);
    if (st) return st;
    s->n = (uint32_t)u;
    s->stride = ((size_t)s->n + 7) / 8;
    if ((st = get_uint(root, top, "epochs_done", 0, s->epochs, &u, why, whycap))) return st;
    s->base = (uint32_t)u;
    uint64_t delivered;
    if ((st = get_uint(root, top, "delivered", 0, (double)s->epochs * s->n, &delivered, why,
                       whycap)))
        return st;

    const cJSON *partial = cJSON_GetObjectItemCaseSensitive(root, "partial");
    if (!cJSON_IsArray(partial))
        return bad(why, whycap, "resume state has no \"partial\" array of epochs in progress");
    int np = cJSON_GetArraySize(partial);
    if ((uint64_t)np > s->epochs - s->base)
        return bad(why, whycap,
                   "resume state lists %d epochs in progress, but only %u of its %u epochs are "
                   "not done",
                   np, s->epochs - s->base, s->epochs);

    /* First pass: every field and bitmap length, so that what is allocated
     * below is bounded by the text itself. */
    size_t b64_len = sodium_base64_encoded_len(s->stride, B64) - 1;
    uint64_t prev = 0, sum = (uint64_t)s->base * state_per_epoch(s);
    int i = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, partial)
    {
        char what[64];
        snprintf(what, sizeof(what), "resume state: partial[%d]", i);
        if (!cJSON_IsObject(e)) return bad(why, whycap, "%s is not an object", what);
        uint64_t ep, count;
        if ((st = get_uint(e, what, "epoch", s->base, (double)s->epochs - 1, &ep, why, whycap)))
            return st;
        if (i > 0 && ep <= prev)
            return bad(why, whycap, "%s: epoch %" PRIu64 " does not follow epoch %" PRIu64, what,
                       ep, prev);
        if ((st = get_uint(e, what, "count", 0, s->n, &count, why, whycap))) return st;
        const cJSON *bm = cJSON_GetObjectItemCaseSensitive(e, "bitmap");
        if (!cJSON_IsString(bm))
            return bad(why, whycap, "%s has no \"bitmap\" string (base64)", what);
        size_t got = strlen(bm->valuestring);
        if (got != b64_len)
            return bad(why, whycap,
                       "%s: the bitmap has %zu base64 characters, %zu are needed for %u "
                       "batches per epoch",
                       what, got, b64_len, s->n);
        prev = ep;
        sum += count;
        i++;
    }
    if (sum != delivered)
        return bad(why, whycap,
                   "resume state: \"delivered\" is %" PRIu64 " but its epochs hold %" PRIu64
                   " batches; the state was altered or cut short",
                   delivered, sum);

    s->n_rows = (uint32_t)np;
    s->rows = calloc(np ? (size_t)np : 1, sizeof(*s->rows));
    s->bits = calloc(np ? (size_t)np * s->stride : 1, 1);
    if (!s->rows || !s->bits) return HS_ERR_NOMEM;
    i = 0;
    cJSON_ArrayForEach(e, partial)
    {
        const cJSON *bm = cJSON_GetObjectItemCaseSensitive(e, "bitmap");
        uint8_t *row = s->bits + (size_t)i * s->stride;
        size_t bin_len = 0;
        if (sodium_base642bin(row, s->stride, bm->valuestring, b64_len, NULL, &bin_len, NULL,
                              B64) != 0 ||
            bin_len != s->stride)
            return bad(why, whycap, "resume state: partial[%d]: the bitmap is not valid base64", i);
        if (s->n % 8 && row[s->stride - 1] >> (s->n % 8))
            return bad(why, whycap,
                       "resume state: partial[%d]: the bitmap marks batches past the %u of an "
                       "epoch",
                       i, s->n);
        uint64_t bits = 0;
        for (size_t k = 0; k < s->stride; k++)
            bits += popcount8(row[k]);
        s->rows[i].epoch = (uint32_t)cJSON_GetObjectItemCaseSensitive(e, "epoch")->valuedouble;
        s->rows[i].count = (uint32_t)cJSON_GetObjectItemCaseSensitive(e, "count")->valuedouble;
        if (bits != s->rows[i].count)
            return bad(why, whycap,
                       "resume state: partial[%d]: \"count\" is %u but the bitmap holds %" PRIu64
                       " batches",
                       i, s->rows[i].count, bits);
        i++;
    }
    s->delivered = delivered;
    return HS_OK;
}

hs_status_t hs_state_decode(const char *text, size_t len, hs_state_t **out, char *why,
                            size_t whycap)
{
    if (len > HS_STATE_MAX_BYTES)
        return bad(why, whycap,
                   "resume state is %zu bytes, more than the %u MiB a state can be; is it a "
                   "state saved by hsflow?",
                   len, HS_STATE_MAX_BYTES >> 20);
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(text, len, &end, false);
    if (!root) {
        size_t at = end && end >= text && end <= text + len ? (size_t)(end - text) : 0;
        return bad(why, whycap, "resume state is not valid JSON (at byte %zu of %zu)", at, len);
    }
    hs_status_t st = HS_ERR_FORMAT;
    hs_state_t *s = NULL;
    /* One JSON value and nothing after it but white space, as json.loads
     * takes it: bytes appended to a state are not a state. */
    size_t at = end && end >= text && end <= text + len ? (size_t)(end - text) : len;
    size_t tail = at;
    while (tail < len &&
           (text[tail] == ' ' || text[tail] == '\t' || text[tail] == '\n' || text[tail] == '\r'))
        tail++;
    if (tail < len) {
        bad(why, whycap,
            "resume state has %zu bytes after its JSON object (from byte %zu of %zu); give the "
            "state exactly as it was saved",
            len - at, at, len);
        goto err;
    }
    s = calloc(1, sizeof(*s));
    if (!s) {
        st = HS_ERR_NOMEM;
        goto err;
    }
    if (!cJSON_IsObject(root)) {
        bad(why, whycap, "resume state is not a JSON object");
        goto err;
    }
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, "hsflow_state");
    if (!cJSON_IsNumber(v)) {
        bad(why, whycap,
            "not an hsflow resume state (no \"hsflow_state\" version); give what "
            "hs_consumer_state_save / Consumer.state_dict() returned");
        goto err;
    }
    if (v->valuedouble != HS_STATE_VERSION) {
        bad(why, whycap,
            "resume state version %g, this hsflow reads version %d: resume with the hsflow "
            "release that saved it",
            v->valuedouble, HS_STATE_VERSION);
        goto err;
    }
    uint64_t u;
    if ((st = get_uint(root, "resume state", "epochs", 1, HS_STATE_MAX_EPOCHS, &u, why, whycap)))
        goto err;
    s->epochs = (uint32_t)u;
    st = HS_ERR_FORMAT;
    v = cJSON_GetObjectItemCaseSensitive(root, "order");
    if (cJSON_IsString(v) && !strcmp(v->valuestring, "arrival"))
        s->order = HS_STATE_ARRIVAL;
    else if (cJSON_IsString(v) && !strcmp(v->valuestring, "plan"))
        s->order = HS_STATE_PLAN;
    else {
        bad(why, whycap, "resume state: \"order\" must be \"arrival\" or \"plan\"");
        goto err;
    }
    if ((st = decode_shard_fields(root, s, why, whycap))) goto err;
    st = HS_ERR_FORMAT;
    v = cJSON_GetObjectItemCaseSensitive(root, "plan");
    if (cJSON_IsNull(v)) {
        /* saved before the plan was known: nothing was delivered */
        const cJSON *p = cJSON_GetObjectItemCaseSensitive(root, "partial");
        const cJSON *d = cJSON_GetObjectItemCaseSensitive(root, "delivered");
        if ((p && cJSON_GetArraySize(p) > 0) || (d && (!cJSON_IsNumber(d) || d->valuedouble))) {
            bad(why, whycap, "resume state without a plan lists delivered batches");
            goto err;
        }
        *out = s;
        cJSON_Delete(root);
        return HS_OK;
    }
    unsigned long long hash;
    int used = 0;
    if (!cJSON_IsString(v) || strlen(v->valuestring) != 16 ||
        sscanf(v->valuestring, "%16llx%n", &hash, &used) != 1 || used != 16) {
        bad(why, whycap, "resume state: \"plan\" must be the plan hash, 16 hex digits");
        goto err;
    }
    s->has_plan = true;
    s->plan_hash = hash;
    if ((st = decode_plan_fields(root, s, why, whycap))) goto err;
    cJSON_Delete(root);
    *out = s;
    return HS_OK;
err:
    cJSON_Delete(root);
    hs_state_destroy(s);
    return st;
}

/* ---- checks and binding ------------------------------------------------------ */

hs_status_t hs_state_check_run(const hs_state_t *s, uint32_t epochs, hs_state_order_t order,
                               char *why, size_t whycap)
{
    if (s->epochs != epochs) {
        snprintf(why, whycap,
                 "the resume state was saved by a run of %u epoch(s), this consumer runs %u: give "
                 "--epochs %u (the state belongs to that run)",
                 s->epochs, epochs, s->epochs);
        return HS_ERR_MISMATCH;
    }
    if (s->order != order) {
        snprintf(why, whycap,
                 "the resume state was saved with --order %s, this consumer delivers in %s "
                 "order: give --order %s",
                 order_str(s->order), order_str(order), order_str(s->order));
        return HS_ERR_MISMATCH;
    }
    return HS_OK;
}

hs_status_t hs_state_check_plan(const hs_state_t *s, uint64_t plan_hash, uint32_t n_batches,
                                char *why, size_t whycap)
{
    if (!s->has_plan) return HS_OK;
    if (s->plan_hash != plan_hash || s->n != n_batches) {
        snprintf(why, whycap,
                 "the resume state was saved for plan %016" PRIx64 " (%u batches/epoch), the "
                 "producer offers plan %016" PRIx64 " (%u): start the producers with that run's "
                 "--data, --token-budget, --max-seq-len and --seed, or resume without the state",
                 s->plan_hash, s->n, plan_hash, n_batches);
        return HS_ERR_MISMATCH;
    }
    return HS_OK;
}

hs_status_t hs_state_bind(const hs_state_t *from, uint64_t plan_hash, uint32_t n_batches,
                          uint32_t epochs, hs_state_order_t order, hs_state_t **out)
{
    if (n_batches == 0 || epochs == 0 || (from && from->has_plan && from->n != n_batches))
        return HS_ERR_INVALID;
    hs_state_t *s = calloc(1, sizeof(*s));
    if (!s) return HS_ERR_NOMEM;
    s->has_plan = s->bound = true;
    s->plan_hash = plan_hash;
    s->n = n_batches;
    s->epochs = epochs;
    s->order = order;
    s->stride = ((size_t)n_batches + 7) / 8;
    if (from) hs_state_set_shard(s, from->rank, from->world, from->uneven);
    s->base = from && from->has_plan ? hs_state_epochs_done(from) : 0;
    if (s->base > epochs) s->base = epochs;
    s->n_rows = epochs - s->base;
    s->rows = calloc(s->n_rows ? s->n_rows : 1, sizeof(*s->rows));
    s->bits = calloc(s->n_rows ? (size_t)s->n_rows * s->stride : 1, 1);
    if (!s->rows || !s->bits) {
        hs_error("resume state: out of memory for %u epoch(s) of %u batches", s->n_rows, n_batches);
        hs_state_destroy(s);
        return HS_ERR_NOMEM;
    }
    for (uint32_t r = 0; r < s->n_rows; r++)
        s->rows[r].epoch = s->base + r;
    if (from && from->has_plan) {
        for (uint32_t r = 0; r < from->n_rows; r++) {
            uint32_t e = from->rows[r].epoch;
            if (e < s->base || e >= epochs) continue;
            memcpy(s->bits + (size_t)(e - s->base) * s->stride,
                   from->bits + (size_t)r * from->stride, s->stride);
            s->rows[e - s->base].count = from->rows[r].count;
        }
        s->delivered = from->delivered;
    }
    *out = s;
    return HS_OK;
}

void hs_state_mark(hs_state_t *s, uint32_t epoch, uint32_t batch)
{
    if (!s->bound || epoch < s->base || epoch - s->base >= s->n_rows || batch >= s->n) return;
    uint8_t *byte = s->bits + (size_t)(epoch - s->base) * s->stride + batch / 8;
    uint8_t mask = (uint8_t)(1u << (batch % 8));
    if (*byte & mask) return;
    *byte |= mask;
    s->rows[epoch - s->base].count++;
    s->delivered++;
}

void hs_state_unmark(hs_state_t *s, uint32_t epoch, uint32_t batch)
{
    if (!s->bound || epoch < s->base || epoch - s->base >= s->n_rows || batch >= s->n) return;
    uint8_t *byte = s->bits + (size_t)(epoch - s->base) * s->stride + batch / 8;
    uint8_t mask = (uint8_t)(1u << (batch % 8));
    if (!(*byte & mask)) return;
    *byte &= (uint8_t)~mask;
    s->rows[epoch - s->base].count--;
    s->delivered--;
}

uint8_t *hs_state_done_bits(const hs_state_t *s)
{
    uint32_t k = hs_state_epochs_done(s);
    uint64_t nbits = (uint64_t)(s->epochs - k) * s->n;
    uint8_t *bits = calloc(nbits / 8 + 1, 1);
    if (!bits) return NULL;
    for (uint32_t r = 0; r < s->n_rows; r++) {
        uint32_t e = s->rows[r].epoch;
        if (e < k || !s->rows[r].count) continue;
        for (uint32_t b = 0; b < s->n; b++)
            if (row_bit(s, r, b)) {
                uint64_t i = (uint64_t)(e - k) * s->n + b;
                bits[i / 8] |= (uint8_t)(1u << (i % 8));
            }
    }
    return bits;
}

/* ---- encode ------------------------------------------------------------------ */

/* Appends to buf[cap] while there is room, and counts every byte anyway. */
typedef struct {
    char *buf;
    size_t cap, len;
} writer_t;

static void wr_printf(writer_t *w, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void wr_printf(writer_t *w, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    bool room = w->buf && w->len < w->cap;
    int n = vsnprintf(room ? w->buf + w->len : NULL, room ? w->cap - w->len : 0, fmt, ap);
    va_end(ap);
    if (n > 0) w->len += (size_t)n;
}

static void wr_base64(writer_t *w, const uint8_t *bin, size_t n)
{
    size_t need = sodium_base64_encoded_len(n, B64); /* with the NUL */
    if (w->buf && w->len + need <= w->cap) sodium_bin2base64(w->buf + w->len, need, bin, n, B64);
    w->len += need - 1;
}

hs_status_t hs_state_encode(const hs_state_t *s, char *buf, size_t cap, size_t *len)
{
    writer_t w = {buf, buf ? cap : 0, 0};
    wr_printf(&w, "{\"hsflow_state\":%d,", HS_STATE_VERSION);
    if (s->has_plan)
        wr_printf(&w, "\"plan\":\"%016" PRIx64 "\",", s->plan_hash);
    else
        wr_printf(&w, "\"plan\":null,");
    uint32_t k = hs_state_epochs_done(s);
    wr_printf(&w,
              "\"batches_per_epoch\":%u,\"epochs\":%u,\"order\":\"%s\",\"delivered\":%" PRIu64
              ",\"epochs_done\":%u",
              s->n, s->epochs, order_str(s->order), s->delivered, k);
    if (s->world > 1)
        wr_printf(&w, ",\"rank\":%u,\"world\":%u,\"uneven\":\"%s\"", s->rank, s->world,
                  hs_shard_uneven_str((hs_shard_uneven_t)s->uneven));
    wr_printf(&w, ",\"partial\":[");
    bool first = true;
    for (uint32_t r = 0; r < s->n_rows; r++) {
        if (s->rows[r].epoch < k || !s->rows[r].count) continue;
        wr_printf(&w, "%s{\"epoch\":%u,\"count\":%u,\"bitmap\":\"", first ? "" : ",",
                  s->rows[r].epoch, s->rows[r].count);
        wr_base64(&w, s->bits + (size_t)r * s->stride, s->stride);
        wr_printf(&w, "\"}");
        first = false;
    }
    wr_printf(&w, "]}");
    *len = w.len;
    return w.len < w.cap ? HS_OK : HS_ERR_NOSPACE;
}
