/* SPDX-License-Identifier: Apache-2.0 */
/* region.c - the layout and the batch region (DESIGN §1): offsets, header,
 * seal/verify, and the synthetic hidden states used by tests and by the
 * synthetic producer source.
 *
 * Region: [header 256][cu_seqlens i32 n+1][sample_ids u64 n][input_ids i32 T]
 *         [loss_mask u8 T][hidden bf16 T*k*H], each part 256-aligned.
 * The region is little-endian; so is every host hsflow builds for. */
#include "hs_float.h"
#include "hs_region.h"
#include "hs_log.h"
#include "hs_checksum.h"
#include "hs_shuffle.h"
#include "hs_memory.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <xxhash.h>

_Static_assert(sizeof(hs_batch_header_t) == HS_BATCH_HEADER_BYTES,
               "batch header must be 256 bytes");
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "hsflow's batch region and frames assume a little-endian host"
#endif

#define HS_LAYOUT_MAX_HIDDEN 65536u

__attribute__((format(printf, 3, 4))) static void say(char *why, size_t whycap, const char *fmt,
                                                      ...)
{
    va_list ap;
    va_start(ap, fmt);
    if (why && whycap) vsnprintf(why, whycap, fmt, ap);
    va_end(ap);
}

/* ---- layout ------------------------------------------------------------ */

hs_status_t hs_layout_validate(const hs_layout_t *l, char *why, size_t whycap)
{
    if (l->hidden_size < 1 || l->hidden_size > HS_LAYOUT_MAX_HIDDEN) {
        say(why, whycap, "hidden size %u is out of range 1..%u", l->hidden_size,
            HS_LAYOUT_MAX_HIDDEN);
        return HS_ERR_INVALID;
    }
    if (!hs_dtype_info(l->dtype)) {
        char known[64] = "";
        size_t n = 0, count;
        const hs_dtype_info_t *t = hs_dtype_table(&count);
        for (size_t i = 0; i < count && n < sizeof known; i++)
            n += (size_t)snprintf(known + n, sizeof known - n, "%s%s = %u", i ? ", " : "",
                                  t[i].name, t[i].id);
        say(why, whycap, "dtype %u is not supported (%s)", l->dtype, known);
        return HS_ERR_INVALID;
    }
    if (l->n_layers < 1 || l->n_layers > HS_MAX_LAYERS) {
        say(why, whycap, "%u captured layers, expected 1..%u", l->n_layers, HS_MAX_LAYERS);
        return HS_ERR_INVALID;
    }
    for (uint32_t i = 0; i < l->n_layers; i++) {
        if (l->layers[i] < 0) {
            say(why, whycap,
                "captured layer %d is negative: layers are output_hidden_states "
                "indices (0 = embeddings)",
                l->layers[i]);
            return HS_ERR_INVALID;
        }
        if (i > 0 && l->layers[i] <= l->layers[i - 1]) {
            say(why, whycap, "captured layers must be strictly increasing, got %d after %d",
                l->layers[i], l->layers[i - 1]);
            return HS_ERR_INVALID;
        }
    }
    return HS_OK;
}

hs_status_t hs_layout_check(const hs_layout_t *layout)
{
    char why[160];
    hs_status_t st = hs_layout_validate(layout, why, sizeof why);
    if (st != HS_OK) hs_error("invalid layout: %s", why);
    return st;
}

uint64_t hs_layout_id(const hs_layout_t *l)
{
    /* Canonical form: u32 H, u32 dtype, u32 k, i32 layers[k], little-endian. */
    uint8_t buf[12 + 4 * HS_MAX_LAYERS];
    uint32_t k = l->n_layers <= HS_MAX_LAYERS ? l->n_layers : HS_MAX_LAYERS;
    uint32_t head[3] = {l->hidden_size, l->dtype, l->n_layers};
    memcpy(buf, head, sizeof head);
    memcpy(buf + 12, l->layers, 4u * k);
    return XXH3_64bits(buf, 12 + 4u * k);
}

void hs_layout_describe(const hs_layout_t *l, char *buf, size_t cap)
{
    if (!buf || !cap) return;
    size_t n = (size_t)snprintf(buf, cap, "H=%u dtype=%s layers=[", l->hidden_size,
                                hs_dtype_str(l->dtype));
    uint32_t k = l->n_layers <= HS_MAX_LAYERS ? l->n_layers : HS_MAX_LAYERS;
    for (uint32_t i = 0; i < k && n < cap; i++)
        n += (size_t)snprintf(buf + n, cap - n, "%s%d", i ? "," : "", l->layers[i]);
    if (n < cap) snprintf(buf + n, cap - n, "]");
}

void hs_layout_spec(const hs_layout_t *l, char *buf, size_t cap)
{
    if (!buf || !cap) return;
    size_t n = (size_t)snprintf(buf, cap, "H=%u,layers=", l->hidden_size);
    uint32_t k = l->n_layers <= HS_MAX_LAYERS ? l->n_layers : HS_MAX_LAYERS;
    for (uint32_t i = 0; i < k && n < cap; i++)
        n += (size_t)snprintf(buf + n, cap - n, "%s%d", i ? "," : "", l->layers[i]);
    if (n < cap) snprintf(buf + n, cap - n, ",dtype=%s", hs_dtype_str(l->dtype));
}

/* One number of a layout spec: decimal digits only, at most `max`. */
static bool spec_number(const char *s, size_t len, uint64_t max, uint64_t *out)
{
    if (len == 0 || len > 10) return false;
    uint64_t v = 0;
    for (size_t i = 0; i < len; i++) {
        if (s[i] < '0' || s[i] > '9') return false;
        v = v * 10 + (uint64_t)(s[i] - '0');
    }
    if (v > max) return false;
    *out = v;
    return true;
}

hs_status_t hs_layout_parse(const char *spec, hs_layout_t *out, char *why, size_t whycap)
{
    hs_layout_t l;
    memset(&l, 0, sizeof l);
    l.dtype = HS_DTYPE_BF16;
    bool have_h = false, have_layers = false, have_dtype = false;
    enum { KEY_NONE, KEY_LAYERS } last = KEY_NONE;
    if (!spec || !*spec) {
        say(why, whycap, "empty layout; expected H=4096,layers=2,16,29,dtype=bf16");
        return HS_ERR_INVALID;
    }
    const char *p = spec;
    for (;;) {
        size_t len = strcspn(p, ",");
        const char *eq = memchr(p, '=', len);
        if (eq) {
            size_t klen = (size_t)(eq - p), vlen = len - klen - 1;
            const char *v = eq + 1;
            uint64_t num;
            if (klen == 1 && (*p == 'H' || *p == 'h')) {
                if (have_h || !spec_number(v, vlen, HS_LAYOUT_MAX_HIDDEN, &num) || num == 0) {
                    say(why, whycap, "H= must be given once, a hidden size 1..%u",
                        HS_LAYOUT_MAX_HIDDEN);
                    return HS_ERR_INVALID;
                }
                l.hidden_size = (uint32_t)num;
                have_h = true;
                last = KEY_NONE;
            } else if (klen == 6 && !strncmp(p, "layers", 6)) {
                if (have_layers || !spec_number(v, vlen, INT32_MAX, &num)) {
                    say(why, whycap, "layers= must be given once, layer indices such as 2,16,29");
                    return HS_ERR_INVALID;
                }
                l.layers[l.n_layers++] = (int32_t)num;
                have_layers = true;
                last = KEY_LAYERS;
            } else if (klen == 5 && !strncmp(p, "dtype", 5)) {
                char name[8] = "";
                if (vlen < sizeof name) memcpy(name, v, vlen);
                if (have_dtype || vlen >= sizeof name || hs_dtype_parse(name, &l.dtype) != HS_OK) {
                    char names[64];
                    say(why, whycap, "dtype= must be given once and be %s",
                        hs_dtype_names(names, sizeof names, NULL, ", ", " or "));
                    return HS_ERR_INVALID;
                }
                have_dtype = true;
                last = KEY_NONE;
            } else {
                say(why, whycap, "unknown key '%.*s'; expected H=, layers= and dtype=", (int)klen,
                    p);
                return HS_ERR_INVALID;
            }
        } else {
            uint64_t num;
            if (last != KEY_LAYERS || !spec_number(p, len, INT32_MAX, &num)) {
                say(why, whycap,
                    "'%.*s' is not KEY=VALUE nor a layer index after layers=", (int)len, p);
                return HS_ERR_INVALID;
            }
            if (l.n_layers == HS_MAX_LAYERS) {
                say(why, whycap, "more than %d layers", HS_MAX_LAYERS);
                return HS_ERR_INVALID;
            }
            l.layers[l.n_layers++] = (int32_t)num;
        }
        if (!p[len]) break;
        p += len + 1;
    }
    if (!have_h || !have_layers) {
        say(why, whycap, "%s missing; expected H=4096,layers=2,16,29,dtype=bf16",
            !have_h ? "H=" : "layers=");
        return HS_ERR_INVALID;
    }
    hs_status_t st = hs_layout_validate(&l, why, whycap);
    if (st != HS_OK) return st;
    *out = l;
    return HS_OK;
}

/* ---- region ------------------------------------------------------------ */

hs_batch_offsets_t hs_batch_offsets(uint32_t n_seqs, uint32_t n_tokens, const hs_layout_t *layout)
{
    hs_batch_offsets_t o;
    uint64_t a = HS_BATCH_ALIGN, T = n_tokens;
    o.cu_seqlens = HS_BATCH_HEADER_BYTES;
    o.sample_ids = hs_align_up(o.cu_seqlens + 4ull * ((uint64_t)n_seqs + 1), a);
    o.input_ids = hs_align_up(o.sample_ids + 8ull * n_seqs, a);
    o.loss_mask = hs_align_up(o.input_ids + 4ull * T, a);
    o.hidden = hs_align_up(o.loss_mask + T, a);
    /* the values, then (fp8) one scale per token; an unknown dtype counts as bf16 */
    const hs_dtype_info_t *d = hs_dtype_info(layout->dtype);
    uint64_t elem = d ? d->elem_bytes : 2, scale = d ? d->row_scale_bytes : 0;
    o.scales = hs_align_up(o.hidden + T * hs_layout_row_elems(layout) * elem, a);
    o.total = scale ? hs_align_up(o.scales + scale * T, a) : o.scales;
    return o;
}

uint64_t hs_batch_bytes(uint32_t n_seqs, uint32_t n_tokens, const hs_layout_t *layout)
{
    return hs_batch_offsets(n_seqs, n_tokens, layout).total;
}

hs_batch_view_t hs_batch_view(void *region, uint32_t n_seqs, uint32_t n_tokens,
                              const hs_layout_t *layout)
{
    hs_batch_offsets_t o = hs_batch_offsets(n_seqs, n_tokens, layout);
    uint8_t *r = region;
    hs_batch_view_t v = {
        .header = (hs_batch_header_t *)r,
        .cu_seqlens = (int32_t *)(r + o.cu_seqlens),
        .sample_ids = (uint64_t *)(r + o.sample_ids),
        .input_ids = (int32_t *)(r + o.input_ids),
        .loss_mask = r + o.loss_mask,
    };
    if (layout->dtype == HS_DTYPE_FP8) {
        v.hidden_fp8 = r + o.hidden;
        v.scales = (float *)(r + o.scales);
    } else {
        v.hidden = (uint16_t *)(r + o.hidden);
    }
    return v;
}

void hs_batch_header_init(hs_batch_header_t *h, uint32_t epoch, uint32_t index, uint32_t n_seqs,
                          uint32_t n_tokens, const hs_layout_t *layout, uint64_t plan_hash)
{
    memset(h, 0, sizeof *h);
    h->magic = HS_BATCH_MAGIC;
    h->version = HS_BATCH_VERSION;
    h->dtype = (uint16_t)layout->dtype;
    h->epoch = epoch;
    h->index = index;
    h->n_seqs = n_seqs;
    h->n_tokens = n_tokens;
    h->hidden_size = layout->hidden_size;
    h->n_layers = layout->n_layers;
    h->layout_id = hs_layout_id(layout);
    h->total_bytes = hs_batch_bytes(n_seqs, n_tokens, layout);
    h->plan_hash = plan_hash;
}

/* Threads that seal a batch of `bytes`: one below 64 MiB, else up to 4
 * (one thread hashes ~6 GB/s: 60 ms for a 384 MiB batch, time a producer's
 * worker would otherwise not spend queueing its next forward). */
static int seal_threads(uint64_t bytes)
{
    if (bytes < (64u << 20)) return 1;
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    return cpus >= 4 ? 4 : cpus > 1 ? (int)cpus : 1;
}

void hs_batch_seal(void *region, uint64_t total_bytes)
{
    hs_batch_header_t *h = region;
    uint64_t payload = total_bytes - HS_BATCH_HEADER_BYTES;
    h->checksum = hs_checksum64_parallel((const uint8_t *)region + HS_BATCH_HEADER_BYTES, payload,
                                         seal_threads(payload));
}

/* cu_seqlens of n sequences must go 0 = c[0] < c[1] < ... < c[n] = T. */
static hs_status_t check_cu_seqlens(const int32_t *cu, uint32_t n, uint32_t T, char *why,
                                    size_t whycap)
{
    if (cu[0] != 0) {
        say(why, whycap, "cu_seqlens[0] is %d, expected 0", cu[0]);
        return HS_ERR_FORMAT;
    }
    for (uint32_t i = 1; i <= n; i++) {
        if (cu[i] <= cu[i - 1]) {
            say(why, whycap, "cu_seqlens[%u] = %d after %d: sequences must be non-empty", i, cu[i],
                cu[i - 1]);
            return HS_ERR_FORMAT;
        }
    }
    if ((uint32_t)cu[n] != T || cu[n] < 0) {
        say(why, whycap, "cu_seqlens[%u] is %d, expected the token count %u", n, cu[n], T);
        return HS_ERR_FORMAT;
    }
    return HS_OK;
}

hs_status_t hs_batch_verify(const void *region, uint64_t bytes, uint32_t epoch, uint32_t index,
                            uint32_t n_seqs, uint32_t n_tokens, const hs_layout_t *layout,
                            char *why, size_t whycap)
{
    return hs_batch_verify_sum(region, bytes, epoch, index, n_seqs, n_tokens, layout, NULL, why,
                               whycap);
}

hs_status_t hs_batch_verify_sum(const void *region, uint64_t bytes, uint32_t epoch, uint32_t index,
                                uint32_t n_seqs, uint32_t n_tokens, const hs_layout_t *layout,
                                const uint64_t *body_sum, char *why, size_t whycap)
{
    const hs_batch_header_t *h = region;
    uint64_t want_bytes = hs_batch_bytes(n_seqs, n_tokens, layout);
    if (bytes < HS_BATCH_HEADER_BYTES) {
        say(why, whycap, "batch of %" PRIu64 " bytes is shorter than its header", bytes);
        return HS_ERR_FORMAT;
    }
    if (h->magic != HS_BATCH_MAGIC) {
        say(why, whycap, "batch magic 0x%08x, expected 0x%08x: not an hsflow batch", h->magic,
            HS_BATCH_MAGIC);
        return HS_ERR_FORMAT;
    }
    if (h->version != HS_BATCH_VERSION) {
        say(why, whycap,
            "batch format version %u, this side reads %u: run the same hsflow "
            "release on both sides",
            h->version, HS_BATCH_VERSION);
        return HS_ERR_MISMATCH;
    }
#define EXPECT(field, want, fmt)                                                                   \
    do {                                                                                           \
        if (h->field != (want)) {                                                                  \
            say(why, whycap, "batch header " #field " is %" fmt ", the ticket says %" fmt,         \
                h->field, (want));                                                                 \
            return HS_ERR_MISMATCH;                                                                \
        }                                                                                          \
    } while (0)
    EXPECT(dtype, (uint16_t)layout->dtype, PRIu16);
    EXPECT(epoch, epoch, PRIu32);
    EXPECT(index, index, PRIu32);
    EXPECT(n_seqs, n_seqs, PRIu32);
    EXPECT(n_tokens, n_tokens, PRIu32);
    EXPECT(hidden_size, layout->hidden_size, PRIu32);
    EXPECT(n_layers, layout->n_layers, PRIu32);
    EXPECT(layout_id, hs_layout_id(layout), PRIx64);
    EXPECT(total_bytes, want_bytes, PRIu64);
#undef EXPECT
    if (bytes != want_bytes) {
        say(why, whycap, "batch region is %" PRIu64 " bytes, its shape needs %" PRIu64, bytes,
            want_bytes);
        return HS_ERR_MISMATCH;
    }
    for (size_t i = 0; i < sizeof h->reserved; i++) {
        if (h->reserved[i]) {
            say(why, whycap, "batch header reserved byte %zu is 0x%02x, expected 0",
                i + (size_t)(h->reserved - (const uint8_t *)h), h->reserved[i]);
            return HS_ERR_FORMAT;
        }
    }
    hs_batch_offsets_t o = hs_batch_offsets(n_seqs, n_tokens, layout);
    hs_status_t st = check_cu_seqlens((const int32_t *)((const uint8_t *)region + o.cu_seqlens),
                                      n_seqs, n_tokens, why, whycap);
    if (st != HS_OK) return st;
    uint64_t sum = body_sum ? *body_sum
                            : hs_checksum64((const uint8_t *)region + HS_BATCH_HEADER_BYTES,
                                            bytes - HS_BATCH_HEADER_BYTES);
    if (sum != h->checksum) {
        say(why, whycap,
            "batch (epoch %u, index %u) checksum 0x%016" PRIx64 ", header says "
            "0x%016" PRIx64 ": corrupted in transit or in memory",
            epoch, index, sum, h->checksum);
        return HS_ERR_CHECKSUM;
    }
    if (layout->dtype == HS_DTYPE_FP8) {
        /* The checksum proves the bytes are the producer's; these prove the
         * producer's rows mean numbers (a NaN scale would turn a row into
         * +-0.0, a huge one into infinities). */
        uint64_t row = hs_layout_row_elems(layout);
        const uint8_t *q = (const uint8_t *)region + o.hidden;
        const float *scales = (const float *)((const uint8_t *)region + o.scales);
        for (uint32_t t = 0; t < n_tokens; t++) {
            char rwhy[160];
            if (hs_fp8_row_check(q + (uint64_t)t * row, row, scales[t], rwhy, sizeof rwhy) !=
                HS_OK) {
                say(why, whycap,
                    "batch (epoch %u, index %u) token %u: %s: the producer sent a row that "
                    "cannot be dequantised",
                    epoch, index, t, rwhy);
                return HS_ERR_FORMAT;
            }
        }
    }
    return HS_OK;
}

/* ---- synthetic hidden states ------------------------------------------- */

/* One 64-bit mix per (sample, layer, pos); channels then walk an odd stride
 * through the low 10 bits. 0x3C00 | x<0x400 keeps the bf16 exponent in
 * 0x78..0x7F: every value is a finite number in [2^-7, 2). */
#define SYNTH_STRIDE 0x9E3u

static inline uint32_t synth_base(uint64_t sample_id, int32_t layer, uint32_t pos)
{
    uint64_t s = sample_id;
    uint64_t x = hs_splitmix64(&s);
    s = x ^ ((uint64_t)(uint32_t)layer << 32 | pos);
    return (uint32_t)(hs_splitmix64(&s) >> 32);
}

static inline uint16_t synth_at(uint32_t base, uint32_t channel)
{
    return (uint16_t)(0x3C00u | ((base + channel * SYNTH_STRIDE) & 0x03FFu));
}

uint16_t hs_synth_value(uint64_t sample_id, int32_t layer, uint32_t pos, uint32_t channel)
{
    return synth_at(synth_base(sample_id, layer, pos), channel);
}

static void synth_row(uint16_t *restrict row, uint32_t base, uint32_t H)
{
    for (uint32_t c = 0; c < H; c++)
        row[c] = synth_at(base, c);
}

/* The sequence range [lo, hi) of sequence s, clamped to [0, T]. */
static void seq_range(const int32_t *cu, uint32_t s, uint32_t T, uint32_t *lo, uint32_t *hi)
{
    int64_t a = cu[s], b = cu[s + 1];
    if (a < 0) a = 0;
    if (b > (int64_t)T) b = T;
    if (b < a) b = a;
    *lo = (uint32_t)a;
    *hi = (uint32_t)b;
}

/* Token t of a sequence at position pos: its k rows of synthetic values,
 * bf16, into row[k*H]. */
static void synth_token(uint16_t *restrict row, uint64_t sample_id, uint32_t pos,
                        const hs_layout_t *layout)
{
    uint32_t H = layout->hidden_size;
    for (uint32_t j = 0; j < layout->n_layers; j++)
        synth_row(row + (uint64_t)j * H, synth_base(sample_id, layout->layers[j], pos), H);
}

/* fp8: the synthetic row of a token, quantised; `tmp` holds k*H bf16. */
static void synth_token_fp8(uint8_t *restrict q, float *scale, uint16_t *restrict tmp,
                            uint64_t sample_id, uint32_t pos, const hs_layout_t *layout)
{
    synth_token(tmp, sample_id, pos, layout);
    uint64_t bad;
    if (hs_fp8_quantize_row_bf16(tmp, hs_layout_row_elems(layout), q, scale, &bad) != HS_OK)
        *scale = 0; /* cannot happen: synthetic values are finite by construction */
}

/* Scratch for one token's bf16 row in an fp8 layout: on the stack up to
 * 64 KiB, else the heap (NULL when out of memory). */
#define SYNTH_STACK_ELEMS 32768u

void hs_batch_synth_fill(hs_batch_view_t *v, const hs_layout_t *layout)
{
    uint32_t n = v->header->n_seqs, T = v->header->n_tokens;
    uint64_t row_elems = hs_layout_row_elems(layout);
    uint16_t stack[SYNTH_STACK_ELEMS], *tmp = stack;
    bool fp8 = layout->dtype == HS_DTYPE_FP8;
    if (fp8 && row_elems > SYNTH_STACK_ELEMS && !(tmp = malloc(row_elems * 2))) return;
    for (uint32_t s = 0; s < n; s++) {
        uint32_t lo, hi;
        seq_range(v->cu_seqlens, s, T, &lo, &hi);
        for (uint32_t t = lo; t < hi; t++) {
            if (fp8)
                synth_token_fp8(v->hidden_fp8 + t * row_elems, &v->scales[t], tmp, v->sample_ids[s],
                                t - lo, layout);
            else
                synth_token(v->hidden + t * row_elems, v->sample_ids[s], t - lo, layout);
        }
    }
    if (tmp != stack) free(tmp);
}

void hs_batch_synth_fill_seal(hs_batch_view_t *v, const hs_layout_t *layout, uint64_t total_bytes,
                              hs_checksum_stream_t *cs)
{
    if (layout->dtype == HS_DTYPE_FP8) { /* rows and scales apart: fill, then hash */
        hs_batch_synth_fill(v, layout);
        hs_batch_seal(v->header, total_bytes);
        return;
    }
    uint32_t n = v->header->n_seqs, T = v->header->n_tokens;
    uint64_t row_elems = hs_layout_row_elems(layout);
    const uint8_t *region = (const uint8_t *)v->header;
    const uint8_t *hidden = (const uint8_t *)v->hidden;
    hs_checksum_stream_reset(cs);
    hs_checksum_stream_update(cs, region + HS_BATCH_HEADER_BYTES,
                              (size_t)(hidden - region) - HS_BATCH_HEADER_BYTES);
    /* Each row is hashed right after it is written, while it is in cache. */
    uint32_t done = 0;
    for (uint32_t s = 0; s < n; s++) {
        uint32_t lo, hi;
        seq_range(v->cu_seqlens, s, T, &lo, &hi);
        for (uint32_t t = lo; t < hi; t++) {
            uint16_t *row = v->hidden + t * row_elems;
            synth_token(row, v->sample_ids[s], t - lo, layout);
            hs_checksum_stream_update(cs, row, row_elems * 2);
            done = t + 1;
        }
    }
    const uint8_t *end = hidden + (uint64_t)done * row_elems * 2;
    hs_checksum_stream_update(cs, end, (size_t)(region + total_bytes - end));
    v->header->checksum = hs_checksum_stream_final(cs);
}

/* The first difference of an fp8 token row from its synthetic twin. */
static hs_status_t synth_check_fp8(const hs_batch_view_t *v, const hs_layout_t *layout,
                                   uint16_t *tmp, uint8_t *want, uint64_t sample_id, uint32_t t,
                                   uint32_t pos, char *why, size_t whycap)
{
    uint64_t row_elems = hs_layout_row_elems(layout);
    float scale;
    synth_token_fp8(want, &scale, tmp, sample_id, pos, layout);
    const uint8_t *row = v->hidden_fp8 + t * row_elems;
    if (hs_f32_bits(v->scales[t]) != hs_f32_bits(scale)) {
        say(why, whycap, "sample %" PRIu64 " pos %u: fp8 scale %.9g, expected %.9g", sample_id, pos,
            v->scales[t], scale);
        return HS_ERR_MISMATCH;
    }
    if (!memcmp(row, want, row_elems)) return HS_OK;
    for (uint64_t i = 0; i < row_elems; i++)
        if (row[i] != want[i]) {
            uint32_t H = layout->hidden_size;
            say(why, whycap,
                "sample %" PRIu64 " layer %d pos %u channel %u: fp8 0x%02x, expected 0x%02x",
                sample_id, layout->layers[i / H], pos, (uint32_t)(i % H), row[i], want[i]);
            break;
        }
    return HS_ERR_MISMATCH;
}

hs_status_t hs_batch_synth_check(const hs_batch_view_t *v, const hs_layout_t *layout, char *why,
                                 size_t whycap)
{
    uint32_t n = v->header->n_seqs, T = v->header->n_tokens;
    uint32_t H = layout->hidden_size, k = layout->n_layers;
    uint64_t row_elems = hs_layout_row_elems(layout);
    hs_status_t st = check_cu_seqlens(v->cu_seqlens, n, T, why, whycap);
    if (st != HS_OK) return st;
    /* fp8: a token's expected row is rebuilt in scratch, on the stack for
     * rows up to SYNTH_STACK_ELEMS values (no allocation per batch) */
    uint16_t stack_tmp[SYNTH_STACK_ELEMS], *tmp = NULL;
    uint8_t stack_want[SYNTH_STACK_ELEMS], *want = NULL;
    bool heap = row_elems > SYNTH_STACK_ELEMS;
    if (layout->dtype == HS_DTYPE_FP8) {
        tmp = heap ? malloc(row_elems * 2) : stack_tmp;
        want = heap ? malloc(row_elems) : stack_want;
        if (!tmp || !want) {
            if (heap) free(tmp), free(want);
            say(why, whycap, "out of memory for a %" PRIu64 "-value row", row_elems);
            return HS_ERR_NOMEM;
        }
    }
    for (uint32_t s = 0; s < n && st == HS_OK; s++) {
        uint32_t lo = (uint32_t)v->cu_seqlens[s], hi = (uint32_t)v->cu_seqlens[s + 1];
        for (uint32_t t = lo; t < hi && st == HS_OK; t++) {
            if (want) {
                st =
                    synth_check_fp8(v, layout, tmp, want, v->sample_ids[s], t, t - lo, why, whycap);
                continue;
            }
            for (uint32_t j = 0; j < k; j++) {
                const uint16_t *row = v->hidden + t * row_elems + (uint64_t)j * H;
                uint32_t base = synth_base(v->sample_ids[s], layout->layers[j], t - lo);
                /* Branch-free scan of the row first; locate only on a miss. */
                uint32_t diff = 0;
                for (uint32_t c = 0; c < H; c++)
                    diff |= (uint32_t)(row[c] ^ synth_at(base, c));
                if (!diff) continue;
                for (uint32_t c = 0; c < H; c++) {
                    if (row[c] != synth_at(base, c)) {
                        say(why, whycap,
                            "sample %" PRIu64 " layer %d pos %u channel %u: got 0x%04x, "
                            "expected 0x%04x",
                            v->sample_ids[s], layout->layers[j], t - lo, c, row[c],
                            synth_at(base, c));
                        st = HS_ERR_MISMATCH;
                        break;
                    }
                }
                if (st != HS_OK) break;
            }
        }
    }
    if (heap) {
        free(tmp);
        free(want);
    }
    return st;
}
