/* SPDX-License-Identifier: Apache-2.0 */
/* msg.c - control messages: hsflow.proto messages packed into frames,
 * unpacked from them and validated field by field.
 *
 * protobuf-c only checks that the bytes decode; everything a peer could use
 * to make us misbehave (nonce lengths, array lengths, counts, string sizes)
 * is checked here, so the rest of hsflow can trust a decoded message. */
#include "hs_proto.h"
#include "hs_log.h"
#include "hs_memory.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const ProtobufCMessageDescriptor *const descriptors[HS_MSG_TYPE_MAX + 1] = {
    [HS_MSG_HELLO] = &hsflow__hello__descriptor,
    [HS_MSG_AUTH] = &hsflow__auth__descriptor,
    [HS_MSG_WELCOME] = &hsflow__welcome__descriptor,
    [HS_MSG_TICKET] = &hsflow__ticket__descriptor,
    [HS_MSG_DONE] = &hsflow__done__descriptor,
    [HS_MSG_STATS] = &hsflow__stats__descriptor,
    [HS_MSG_ERROR] = &hsflow__error__descriptor,
    [HS_MSG_BYE] = &hsflow__bye__descriptor,
    [HS_MSG_PLAN] = &hsflow__plan__descriptor,
    [HS_MSG_CHALLENGE] = &hsflow__challenge__descriptor,
    [HS_MSG_RANKS] = &hsflow__ranks__descriptor,
};

const ProtobufCMessageDescriptor *hs_msg_descriptor(uint16_t type)
{
    return type <= HS_MSG_TYPE_MAX ? descriptors[type] : NULL;
}

__attribute__((format(printf, 3, 4))) static hs_status_t bad(char *why, size_t whycap,
                                                             const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    if (why && whycap) vsnprintf(why, whycap, fmt, ap);
    va_end(ap);
    return HS_ERR_FORMAT;
}

/* Names and free text end up in logs: no control bytes (terminal escapes),
 * except that free text may hold tabs and newlines. UTF-8 passes through. */
static hs_status_t check_string(const char *field, const char *s, size_t max, bool name,
                                bool required, char *why, size_t whycap)
{
    size_t n = s ? strlen(s) : 0;
    if (required && n == 0) return bad(why, whycap, "%s is empty", field);
    if (n >= max)
        return bad(why, whycap, "%s is %zu bytes long, the limit is %zu", field, n, max - 1);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        bool ok = (c >= 0x20 && c != 0x7f) || (!name && (c == '\t' || c == '\n'));
        if (!ok) return bad(why, whycap, "%s has control byte 0x%02x at offset %zu", field, c, i);
    }
    return HS_OK;
}

/* protobuf-c keeps the fields it does not know (a newer peer's), but it also
 * takes a key of field number 0 when that key is written in more bytes than
 * needed. No encoder writes one, and once re-encoded the message no longer
 * decodes: refuse it. */
static hs_status_t check_unknown(const char *what, const ProtobufCMessage *m, char *why,
                                 size_t whycap)
{
    for (unsigned i = 0; i < m->n_unknown_fields; i++)
        if (m->unknown_fields[i].tag == 0)
            return bad(why, whycap, "%s has a field numbered 0, which protobuf does not allow",
                       what);
    return HS_OK;
}

static hs_status_t check_bytes(const char *field, ProtobufCBinaryData b, size_t want, bool optional,
                               char *why, size_t whycap)
{
    if (b.len == want || (optional && b.len == 0)) return HS_OK;
    return bad(why, whycap, "%s is %zu bytes, expected %zu%s", field, b.len, want,
               optional ? " or none" : "");
}

/* Percentages get 1 point of slack: a sender divides times read moments apart,
 * and dropping a producer over a rounded statistic would be absurd. */
static hs_status_t check_pct(const char *field, double v, char *why, size_t whycap)
{
    if (isfinite(v) && v >= 0.0 && v <= 101.0) return HS_OK;
    return bad(why, whycap, "%s is %g, expected a percentage in 0..100", field, v);
}

static hs_status_t check_layout_msg(const char *field, const Hsflow__Layout *l, char *why,
                                    size_t whycap)
{
    if (!l) return bad(why, whycap, "%s is missing", field);
    hs_status_t st = check_unknown(field, &l->base, why, whycap);
    if (st != HS_OK) return st;
    if (l->n_layers < 1 || l->n_layers > HS_MAX_LAYERS)
        return bad(why, whycap, "%s.layers has %zu entries, expected 1..%u", field, l->n_layers,
                   HS_MAX_LAYERS);
    hs_layout_t t = {l->hidden_size, l->dtype, (uint32_t)l->n_layers, {0}};
    memcpy(t.layers, l->layers, l->n_layers * sizeof(int32_t));
    char sub[160];
    if (hs_layout_validate(&t, sub, sizeof sub) != HS_OK)
        return bad(why, whycap, "%s: %s", field, sub);
    return HS_OK;
}

static hs_status_t check_hello(const Hsflow__Hello *m, char *why, size_t whycap)
{
    hs_status_t st;
    if ((st = check_string("hello.producer_name", m->producer_name, HS_MSG_NAME_MAX, true, true,
                           why, whycap)))
        return st;
    if ((st = check_string("hello.target_name", m->target_name, HS_MSG_TEXT_MAX, true, false, why,
                           whycap)))
        return st;
    if (m->workers < 1 || m->workers > HS_MSG_MAX_WORKERS)
        return bad(why, whycap, "hello.workers is %u, expected 1..%u", m->workers,
                   HS_MSG_MAX_WORKERS);
    if (m->prefetch_per_worker > HS_MSG_MAX_PREFETCH)
        return bad(why, whycap, "hello.prefetch_per_worker is %u, expected 0..%u",
                   m->prefetch_per_worker, HS_MSG_MAX_PREFETCH);
    if ((st = check_layout_msg("hello.layout", m->layout, why, whycap))) return st;
    if (m->n_batches < 1) return bad(why, whycap, "hello.n_batches is 0: the plan has no batches");
    if (m->n_batches > HS_PLAN_MAX_BATCHES)
        return bad(why, whycap,
                   "hello.n_batches is %u, more than the %u batches an epoch may have: raise "
                   "--token-budget or split the data",
                   m->n_batches, HS_PLAN_MAX_BATCHES);
    if (m->token_budget < 1) return bad(why, whycap, "hello.token_budget is 0");
    if (m->max_seq_len < 1) return bad(why, whycap, "hello.max_seq_len is 0");
    if (m->target_fingerprint == 0)
        return bad(why, whycap,
                   "hello.target_fingerprint is 0: the producer does not say which target "
                   "computes its states");
    return check_bytes("hello.client_nonce", m->client_nonce, HS_AUTH_NONCE_BYTES, false, why,
                       whycap);
}

static hs_status_t check_welcome(const Hsflow__Welcome *m, char *why, size_t whycap)
{
    hs_status_t st;
    if ((st = check_bytes("welcome.server_mac", m->server_mac, HS_AUTH_MAC_BYTES, true, why,
                          whycap)))
        return st;
    if ((st = check_string("welcome.consumer_name", m->consumer_name, HS_MSG_NAME_MAX, true, false,
                           why, whycap)))
        return st;
    if (m->epochs < 1) return bad(why, whycap, "welcome.epochs is 0");
    if (m->start_epoch > m->epochs)
        return bad(why, whycap, "welcome.start_epoch %u is past welcome.epochs %u", m->start_epoch,
                   m->epochs);
    if (m->order > 1) return bad(why, whycap, "welcome.order is %u, expected 0 or 1", m->order);
    if (m->prefetch_per_worker > HS_MSG_MAX_PREFETCH)
        return bad(why, whycap, "welcome.prefetch_per_worker is %u, expected 0..%u",
                   m->prefetch_per_worker, HS_MSG_MAX_PREFETCH);
    return HS_OK;
}

static hs_status_t check_ranks(const Hsflow__Ranks *m, char *why, size_t whycap)
{
    if (m->hops > 2) return bad(why, whycap, "ranks.hops is %u, expected 0..2", m->hops);
    if (m->n_claims > HS_MSG_MAX_CLAIMS)
        return bad(why, whycap, "ranks.claims has %zu entries, the limit is %u", m->n_claims,
                   HS_MSG_MAX_CLAIMS);
    for (size_t i = 0; i < m->n_claims; i++) {
        const Hsflow__RankClaim *c = m->claims[i];
        hs_status_t st;
        if ((st = check_unknown("ranks.claims", &c->base, why, whycap)) != HS_OK) return st;
        if (!c->instance_id) return bad(why, whycap, "ranks.claims[%zu].instance_id is 0", i);
        if (c->world < 1 || c->rank >= c->world)
            return bad(why, whycap, "ranks.claims[%zu] is rank %u of %u", i, c->rank, c->world);
        if ((st = check_string("ranks.claims.consumer_name", c->consumer_name, HS_MSG_NAME_MAX,
                               true, false, why, whycap)))
            return st;
    }
    return HS_OK;
}

static hs_status_t check_plan(const Hsflow__Plan *m, char *why, size_t whycap)
{
    if (m->n_n_seqs != m->n_n_tokens)
        return bad(why, whycap, "plan.n_seqs has %zu entries but plan.n_tokens has %zu",
                   m->n_n_seqs, m->n_n_tokens);
    size_t n = m->n_n_seqs;
    if (n < 1 || n > HS_PLAN_PAGE_MAX)
        return bad(why, whycap, "plan page has %zu batches, expected 1..%u", n, HS_PLAN_PAGE_MAX);
    if ((uint64_t)m->first_batch + n > UINT32_MAX)
        return bad(why, whycap, "plan.first_batch %u + %zu batches overflows the batch id",
                   m->first_batch, n);
    for (size_t i = 0; i < n; i++) {
        if (m->n_seqs[i] < 1 || m->n_tokens[i] < m->n_seqs[i])
            return bad(why, whycap,
                       "plan batch %llu has %u sequences and %u tokens: expected at least one "
                       "sequence and one token per sequence",
                       (unsigned long long)m->first_batch + i, m->n_seqs[i], m->n_tokens[i]);
    }
    return HS_OK;
}

static hs_status_t check_ticket(const Hsflow__Ticket *m, char *why, size_t whycap)
{
    if (m->n_seqs < 1 || m->n_tokens < m->n_seqs)
        return bad(why, whycap,
                   "ticket.n_seqs %u / ticket.n_tokens %u: expected 1 <= n_seqs <= n_tokens",
                   m->n_seqs, m->n_tokens);
    if (m->bytes < HS_BATCH_HEADER_BYTES)
        return bad(why, whycap, "ticket.bytes is %llu, smaller than a batch header",
                   (unsigned long long)m->bytes);
    return HS_OK;
}

static hs_status_t check_done(const Hsflow__Done *m, char *why, size_t whycap)
{
    if (m->bytes < HS_BATCH_HEADER_BYTES)
        return bad(why, whycap, "done.bytes is %llu, smaller than a batch header",
                   (unsigned long long)m->bytes);
    return HS_OK;
}

static hs_status_t check_stats(const Hsflow__Stats *m, char *why, size_t whycap)
{
    hs_status_t st;
    if (m->worker_count > HS_MSG_MAX_WORKERS || m->n_workers > HS_MSG_MAX_WORKERS)
        return bad(why, whycap, "stats reports %u workers (%zu entries), the limit is %u",
                   m->worker_count, m->n_workers, HS_MSG_MAX_WORKERS);
    if (m->n_workers > m->worker_count)
        return bad(why, whycap, "stats.workers has %zu entries but stats.worker_count is %u",
                   m->n_workers, m->worker_count);
    if ((st = check_pct("stats.stall_pct", m->stall_pct, why, whycap))) return st;
    if (!isfinite(m->tokens_per_s) || m->tokens_per_s < 0)
        return bad(why, whycap, "stats.tokens_per_s is %g", m->tokens_per_s);
    for (size_t i = 0; i < m->n_workers; i++) {
        const Hsflow__WorkerStats *w = m->workers[i];
        char f[64];
        snprintf(f, sizeof f, "stats.workers[%zu]", i);
        if ((st = check_unknown(f, &w->base, why, whycap))) return st;
        if (w->worker >= m->worker_count)
            return bad(why, whycap, "stats.workers[%zu].worker is %u, expected < %u", i, w->worker,
                       m->worker_count);
        snprintf(f, sizeof f, "stats.workers[%zu].busy_pct", i);
        if ((st = check_pct(f, w->busy_pct, why, whycap))) return st;
        snprintf(f, sizeof f, "stats.workers[%zu].stall_pct", i);
        if ((st = check_pct(f, w->stall_pct, why, whycap))) return st;
    }
    return HS_OK;
}

hs_status_t hs_msg_validate(uint16_t type, const ProtobufCMessage *msg, char *why, size_t whycap)
{
    const ProtobufCMessageDescriptor *d = hs_msg_descriptor(type);
    if (!d) return bad(why, whycap, "unknown message type %u", type);
    if (!msg || msg->descriptor != d)
        return bad(why, whycap, "message is not a %s (%s)", hs_msg_type_str(type),
                   msg ? msg->descriptor->name : "null");
    hs_status_t st = check_unknown(hs_msg_type_str(type), msg, why, whycap);
    if (st != HS_OK) return st;
    switch ((hs_msg_type_t)type) {
    case HS_MSG_HELLO:
        return check_hello((const Hsflow__Hello *)msg, why, whycap);
    case HS_MSG_AUTH:
        return check_bytes("auth.mac", ((const Hsflow__Auth *)msg)->mac, HS_AUTH_MAC_BYTES, false,
                           why, whycap);
    case HS_MSG_CHALLENGE:
        return check_bytes("challenge.server_nonce", ((const Hsflow__Challenge *)msg)->server_nonce,
                           HS_AUTH_NONCE_BYTES, false, why, whycap);
    case HS_MSG_WELCOME:
        return check_welcome((const Hsflow__Welcome *)msg, why, whycap);
    case HS_MSG_PLAN:
        return check_plan((const Hsflow__Plan *)msg, why, whycap);
    case HS_MSG_RANKS:
        return check_ranks((const Hsflow__Ranks *)msg, why, whycap);
    case HS_MSG_TICKET:
        return check_ticket((const Hsflow__Ticket *)msg, why, whycap);
    case HS_MSG_DONE:
        return check_done((const Hsflow__Done *)msg, why, whycap);
    case HS_MSG_STATS:
        return check_stats((const Hsflow__Stats *)msg, why, whycap);
    case HS_MSG_ERROR: {
        const Hsflow__Error *e = (const Hsflow__Error *)msg;
        if (e->code >= 0)
            return bad(why, whycap, "error.code is %d, expected a negative status", e->code);
        return check_string("error.text", e->text, HS_MSG_TEXT_MAX, false, false, why, whycap);
    }
    case HS_MSG_BYE:
        return check_string("bye.reason", ((const Hsflow__Bye *)msg)->reason, HS_MSG_TEXT_MAX,
                            false, false, why, whycap);
    }
    return bad(why, whycap, "unknown message type %u", type);
}

size_t hs_msg_frame_size(const ProtobufCMessage *msg)
{
    return HS_FRAME_HEADER_BYTES + protobuf_c_message_get_packed_size(msg);
}

hs_status_t hs_msg_pack(uint16_t type, const ProtobufCMessage *msg, uint8_t *buf, size_t cap,
                        size_t *frame_len)
{
    char why[256];
    if (hs_msg_validate(type, msg, why, sizeof why) != HS_OK) {
        hs_error("refusing to send an invalid %s message: %s", hs_msg_type_str(type), why);
        return HS_ERR_INVALID;
    }
    size_t body = protobuf_c_message_get_packed_size(msg);
    if (body > HS_FRAME_MAX_BODY || HS_FRAME_HEADER_BYTES + body > cap) return HS_ERR_NOSPACE;
    size_t got = protobuf_c_message_pack(msg, buf + HS_FRAME_HEADER_BYTES);
    if (got != body) {
        hs_error("protobuf-c packed %zu bytes of %s, expected %zu", got, hs_msg_type_str(type),
                 body);
        return HS_ERR_INVALID;
    }
    hs_frame_header_encode(buf, type, buf + HS_FRAME_HEADER_BYTES, (uint32_t)body);
    *frame_len = HS_FRAME_HEADER_BYTES + body;
    return HS_OK;
}

hs_status_t hs_msg_unpack(uint16_t type, const uint8_t *body, uint32_t len, ProtobufCMessage **out,
                          char *why, size_t whycap)
{
    return hs_msg_unpack_in(NULL, type, body, len, out, why, whycap);
}

hs_status_t hs_msg_unpack_in(hs_msg_arena_t *a, uint16_t type, const uint8_t *body, uint32_t len,
                             ProtobufCMessage **out, char *why, size_t whycap)
{
    const ProtobufCMessageDescriptor *d = hs_msg_descriptor(type);
    if (!d) return bad(why, whycap, "unknown frame type %u", type);
    if (len > HS_FRAME_MAX_BODY)
        return bad(why, whycap, "%s body of %u bytes exceeds the limit of %u",
                   hs_msg_type_str(type), len, HS_FRAME_MAX_BODY);
    static const uint8_t empty[1];
    /* a second message while one is alive comes from the heap */
    ProtobufCAllocator *alloc = a && !a->live ? &a->alloc : NULL;
    if (a && a->live) a->heap_allocs++;
    if (alloc) {
        a->used = 0;
        a->live = true;
    }
    ProtobufCMessage *m = protobuf_c_message_unpack(d, alloc, len, len ? body : empty);
    if (alloc) {
        a->live = m != NULL;
        a->top = m;
    }
    if (!m)
        return bad(why, whycap,
                   "%s body of %u bytes does not decode: truncated or not a %s message",
                   hs_msg_type_str(type), len, hs_msg_type_str(type));
    hs_status_t st = hs_msg_validate(type, m, why, whycap);
    if (st != HS_OK) {
        hs_msg_free_in(a, m);
        return st;
    }
    *out = m;
    return HS_OK;
}

hs_status_t hs_msg_decode_frame(const uint8_t *frame, size_t len, uint16_t *type,
                                ProtobufCMessage **out, char *why, size_t whycap)
{
    if (len < HS_FRAME_HEADER_BYTES)
        return bad(why, whycap, "frame of %zu bytes is shorter than its %u-byte header", len,
                   HS_FRAME_HEADER_BYTES);
    hs_frame_header_t h;
    hs_status_t st = hs_frame_header_decode(frame, HS_FRAME_MAX_BODY, &h, why, whycap);
    if (st != HS_OK) return st;
    if (len - HS_FRAME_HEADER_BYTES != h.body_len)
        return bad(why, whycap, "%s frame holds %zu body bytes, its header says %u",
                   hs_msg_type_str(h.type), len - HS_FRAME_HEADER_BYTES, h.body_len);
    const uint8_t *body = frame + HS_FRAME_HEADER_BYTES;
    if ((st = hs_frame_body_check(&h, body, why, whycap)) != HS_OK) return st;
    ProtobufCMessage *m;
    if ((st = hs_msg_unpack(h.type, body, h.body_len, &m, why, whycap)) != HS_OK) return st;
    *type = h.type;
    *out = m;
    return HS_OK;
}

void hs_msg_free(ProtobufCMessage *msg)
{
    if (msg) protobuf_c_message_free_unpacked(msg, NULL);
}

/* ---- arena ---------------------------------------------------------------- */

static void *arena_alloc(void *data, size_t size)
{
    hs_msg_arena_t *a = data;
    size_t at = hs_align_up(a->used, 8);
    if (at <= sizeof a->buf && size <= sizeof a->buf - at) {
        a->used = at + size;
        return (uint8_t *)a->buf + at;
    }
    a->heap_allocs++;
    return malloc(size);
}

static void arena_free(void *data, void *p)
{
    hs_msg_arena_t *a = data;
    uintptr_t b = (uintptr_t)p, buf = (uintptr_t)a->buf;
    if (b >= buf && b - buf < sizeof a->buf) return; /* back with the reset */
    free(p);
}

void hs_msg_arena_init(hs_msg_arena_t *a)
{
    memset(a, 0, sizeof *a);
    a->alloc.alloc = arena_alloc;
    a->alloc.free = arena_free;
    a->alloc.allocator_data = a;
}

void hs_msg_free_in(hs_msg_arena_t *a, ProtobufCMessage *msg)
{
    if (!msg) return;
    /* arena_free() frees what came from the heap and leaves the arena's own
     * memory, so it frees a message that went to the heap whole as well */
    protobuf_c_message_free_unpacked(msg, a ? &a->alloc : NULL);
    if (a && msg == a->top) {
        a->top = NULL;
        a->used = 0;
        a->live = false;
    }
}

hs_status_t hs_msg_error_frame(hs_status_t code, const char *text, uint8_t *buf, size_t cap,
                               size_t *frame_len)
{
    char t[HS_MSG_TEXT_MAX];
    size_t n = 0;
    /* Keep only what validation accepts, so a message built from any text
     * (e.g. a peer-supplied name) always goes out. */
    for (const char *p = text ? text : ""; *p && n < sizeof t - 1; p++) {
        unsigned char c = (unsigned char)*p;
        t[n++] = (c >= 0x20 && c != 0x7f) || c == '\t' || c == '\n' ? (char)c : '?';
    }
    t[n] = '\0';
    Hsflow__Error e = HSFLOW__ERROR__INIT;
    e.code = code < 0 ? code : HS_ERR_PROTO;
    e.text = t;
    return hs_msg_pack(HS_MSG_ERROR, &e.base, buf, cap, frame_len);
}

void hs_layout_to_msg(const hs_layout_t *layout, Hsflow__Layout *msg, int32_t *layers_storage)
{
    hsflow__layout__init(msg);
    uint32_t k = layout->n_layers <= HS_MAX_LAYERS ? layout->n_layers : HS_MAX_LAYERS;
    memcpy(layers_storage, layout->layers, k * sizeof(int32_t));
    msg->hidden_size = layout->hidden_size;
    msg->dtype = layout->dtype;
    msg->n_layers = k;
    msg->layers = layers_storage;
    msg->layout_id = hs_layout_id(layout);
}

hs_status_t hs_layout_from_msg(const Hsflow__Layout *msg, hs_layout_t *out, char *why,
                               size_t whycap)
{
    hs_status_t st = check_layout_msg("layout", msg, why, whycap);
    if (st != HS_OK) return st;
    hs_layout_t l = {msg->hidden_size, msg->dtype, (uint32_t)msg->n_layers, {0}};
    memcpy(l.layers, msg->layers, msg->n_layers * sizeof(int32_t));
    uint64_t id = hs_layout_id(&l);
    if (id != msg->layout_id) {
        if (why && whycap)
            snprintf(why, whycap,
                     "layout id 0x%016llx does not match its fields (id 0x%016llx): the peer "
                     "computes layout ids differently; run the same hsflow release on both sides",
                     (unsigned long long)msg->layout_id, (unsigned long long)id);
        return HS_ERR_MISMATCH;
    }
    *out = l;
    return HS_OK;
}
