/* SPDX-License-Identifier: Apache-2.0 */
/* test_proto.c - control frames and messages, authentication, the batch
 * region and the synthetic hidden states. */
#include <check.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "hs_float.h"
#include "hs_proto.h"
#include "hs_status.h"
#include "hs_checksum.h"
#include "hs_shuffle.h"
#include "hs_memory.h"

static char why[512];

/* ---- helpers ------------------------------------------------------------ */

static hs_layout_t test_layout(void)
{
    /* odd width, not a multiple of 32 */
    hs_layout_t l = {
        .hidden_size = 83, .dtype = HS_DTYPE_BF16, .n_layers = 3, .layers = {2, 16, 29}};
    return l;
}

static uint8_t frame_buf[HS_FRAME_HEADER_BYTES + (1u << 20)];

/* Packs msg as `type`, decodes it back and returns the new message. */
static ProtobufCMessage *round_trip(uint16_t type, const ProtobufCMessage *msg)
{
    size_t len = 0;
    ck_assert_int_eq(hs_msg_pack(type, msg, frame_buf, sizeof frame_buf, &len), HS_OK);
    ck_assert_uint_eq(len, hs_msg_frame_size(msg));
    uint16_t got_type = 0;
    ProtobufCMessage *out = NULL;
    hs_status_t st = hs_msg_decode_frame(frame_buf, len, &got_type, &out, why, sizeof why);
    ck_assert_msg(st == HS_OK, "%s: %s", hs_msg_type_str(type), why);
    ck_assert_uint_eq(got_type, type);
    ck_assert_ptr_nonnull(out);
    return out;
}

/* Packs a message with protobuf-c alone (no validation) and unpacks it. */
static hs_status_t unpack_raw(uint16_t type, const ProtobufCMessage *msg)
{
    static uint8_t body[1u << 20];
    size_t n = protobuf_c_message_pack(msg, body);
    ProtobufCMessage *out = NULL;
    why[0] = '\0';
    hs_status_t st = hs_msg_unpack(type, body, (uint32_t)n, &out, why, sizeof why);
    if (st == HS_OK) {
        ck_assert_ptr_nonnull(out);
        hs_msg_free(out);
    } else {
        ck_assert_ptr_null(out);
    }
    return st;
}

static uint8_t nonce_a[32], nonce_b[32];
static int32_t layer_store[HS_MAX_LAYERS];

static Hsflow__Hello valid_hello(Hsflow__Layout *lm)
{
    hs_layout_t l = test_layout();
    hs_layout_to_msg(&l, lm, layer_store);
    memset(nonce_a, 0xA5, sizeof nonce_a);
    Hsflow__Hello h = HSFLOW__HELLO__INIT;
    h.version = HS_PROTO_VERSION;
    h.producer_name = "node7:4242";
    h.workers = 3;
    h.prefetch_per_worker = 2;
    h.layout = lm;
    h.plan_hash = 0x1122334455667788ull;
    h.n_batches = 1234;
    h.seed = 99;
    h.token_budget = 65536;
    h.max_seq_len = 8192;
    h.dataset_fingerprint = 0xfeedfacecafebeefull;
    h.total_tokens = 80000000;
    h.client_nonce.len = 32;
    h.client_nonce.data = nonce_a;
    h.target_name = "Qwen3-8B";
    h.target_fingerprint = 0x5157454e38420001ull;
    h.total_seqs = 1000001; /* a multi-byte varint in the last field */
    return h;
}

/* ---- framing ------------------------------------------------------------ */

START_TEST(every_message_type_round_trips_through_a_frame)
{
    Hsflow__Layout lm;
    Hsflow__Hello h = valid_hello(&lm);
    Hsflow__Hello *h2 = (Hsflow__Hello *)round_trip(HS_MSG_HELLO, &h.base);
    ck_assert_str_eq(h2->producer_name, "node7:4242");
    ck_assert_str_eq(h2->target_name, "Qwen3-8B");
    ck_assert_uint_eq(h2->workers, 3);
    ck_assert_uint_eq(h2->prefetch_per_worker, 2);
    ck_assert_uint_eq(h2->plan_hash, h.plan_hash);
    ck_assert_uint_eq(h2->n_batches, 1234);
    ck_assert_uint_eq(h2->seed, 99);
    ck_assert_uint_eq(h2->token_budget, 65536);
    ck_assert_uint_eq(h2->max_seq_len, 8192);
    ck_assert_uint_eq(h2->dataset_fingerprint, h.dataset_fingerprint);
    ck_assert_uint_eq(h2->total_tokens, 80000000);
    ck_assert_uint_eq(h2->total_seqs, 1000001);
    ck_assert_uint_eq(h2->client_nonce.len, 32);
    ck_assert_mem_eq(h2->client_nonce.data, nonce_a, 32);
    hs_layout_t l2, l = test_layout();
    ck_assert_int_eq(hs_layout_from_msg(h2->layout, &l2, why, sizeof why), HS_OK);
    ck_assert_uint_eq(hs_layout_id(&l2), hs_layout_id(&l));
    hs_msg_free(&h2->base);

    memset(nonce_b, 0x5A, sizeof nonce_b);
    Hsflow__Challenge c = HSFLOW__CHALLENGE__INIT;
    c.server_nonce = (ProtobufCBinaryData){32, nonce_b};
    Hsflow__Challenge *c2 = (Hsflow__Challenge *)round_trip(HS_MSG_CHALLENGE, &c.base);
    ck_assert_mem_eq(c2->server_nonce.data, nonce_b, 32);
    hs_msg_free(&c2->base);

    Hsflow__Auth a = HSFLOW__AUTH__INIT;
    a.mac = (ProtobufCBinaryData){32, nonce_b};
    Hsflow__Auth *a2 = (Hsflow__Auth *)round_trip(HS_MSG_AUTH, &a.base);
    ck_assert_mem_eq(a2->mac.data, nonce_b, 32);
    hs_msg_free(&a2->base);

    Hsflow__Welcome w = HSFLOW__WELCOME__INIT;
    w.session_id = 77;
    w.epochs = 3;
    w.need_plan = 1;
    w.server_mac = (ProtobufCBinaryData){32, nonce_a};
    w.start_epoch = 1;
    w.consumer_name = "drafter:1";
    w.order = 1;
    w.prefetch_per_worker = 4;
    Hsflow__Welcome *w2 = (Hsflow__Welcome *)round_trip(HS_MSG_WELCOME, &w.base);
    ck_assert_uint_eq(w2->prefetch_per_worker, 4);
    ck_assert_uint_eq(w2->session_id, 77);
    ck_assert_uint_eq(w2->epochs, 3);
    ck_assert(w2->need_plan);
    ck_assert_uint_eq(w2->start_epoch, 1);
    ck_assert_uint_eq(w2->order, 1);
    ck_assert_str_eq(w2->consumer_name, "drafter:1");
    ck_assert_mem_eq(w2->server_mac.data, nonce_a, 32);
    hs_msg_free(&w2->base);

    uint32_t seqs[5] = {8, 16, 32, 64, 1}, toks[5] = {65536, 65000, 60000, 65536, 8192};
    Hsflow__Plan p = HSFLOW__PLAN__INIT;
    p.first_batch = 100;
    p.n_n_seqs = p.n_n_tokens = 5;
    p.n_seqs = seqs;
    p.n_tokens = toks;
    p.last = 1;
    Hsflow__Plan *p2 = (Hsflow__Plan *)round_trip(HS_MSG_PLAN, &p.base);
    ck_assert_uint_eq(p2->first_batch, 100);
    ck_assert_uint_eq(p2->n_n_seqs, 5);
    ck_assert_mem_eq(p2->n_seqs, seqs, sizeof seqs);
    ck_assert_mem_eq(p2->n_tokens, toks, sizeof toks);
    ck_assert(p2->last);
    hs_msg_free(&p2->base);

    Hsflow__Ticket t = HSFLOW__TICKET__INIT;
    t.ticket_id = 5;
    t.epoch = 2;
    t.batch = 17;
    t.bytes = 3ull << 30;
    t.n_seqs = 8;
    t.n_tokens = 65536;
    t.worker_hint = 0xffffffffu;
    t.slot_offset = 1ull << 36;
    Hsflow__Ticket *t2 = (Hsflow__Ticket *)round_trip(HS_MSG_TICKET, &t.base);
    ck_assert_uint_eq(t2->ticket_id, 5);
    ck_assert_uint_eq(t2->epoch, 2);
    ck_assert_uint_eq(t2->batch, 17);
    ck_assert_uint_eq(t2->bytes, 3ull << 30);
    ck_assert_uint_eq(t2->n_seqs, 8);
    ck_assert_uint_eq(t2->n_tokens, 65536);
    ck_assert_uint_eq(t2->worker_hint, 0xffffffffu);
    ck_assert_uint_eq(t2->slot_offset, 1ull << 36);
    hs_msg_free(&t2->base);

    Hsflow__Done d = HSFLOW__DONE__INIT;
    d.ticket_id = 5;
    d.epoch = 2;
    d.batch = 17;
    d.bytes = 3ull << 30;
    d.checksum = 0xdeadbeef01234567ull;
    d.worker = 2;
    d.compute_ns = 123456789;
    Hsflow__Done *d2 = (Hsflow__Done *)round_trip(HS_MSG_DONE, &d.base);
    ck_assert_uint_eq(d2->ticket_id, 5);
    ck_assert_uint_eq(d2->epoch, 2);
    ck_assert_uint_eq(d2->batch, 17);
    ck_assert_uint_eq(d2->bytes, 3ull << 30);
    ck_assert_uint_eq(d2->checksum, 0xdeadbeef01234567ull);
    ck_assert_uint_eq(d2->worker, 2);
    ck_assert_uint_eq(d2->compute_ns, 123456789);
    hs_msg_free(&d2->base);

    Hsflow__WorkerStats ws[2] = {HSFLOW__WORKER_STATS__INIT, HSFLOW__WORKER_STATS__INIT};
    Hsflow__WorkerStats *wp[2] = {&ws[0], &ws[1]};
    ws[0].worker = 0;
    ws[0].busy_pct = 97.5;
    ws[0].tokens = 1000;
    ws[1].worker = 1;
    ws[1].busy_pct = 50;
    ws[1].stall_pct = 12.5;
    Hsflow__Stats s = HSFLOW__STATS__INIT;
    s.worker_count = 2;
    s.n_workers = 2;
    s.workers = wp;
    s.tokens = 2000;
    s.batches = 4;
    s.stall_pct = 6.25;
    s.tokens_per_s = 16000.5;
    s.uptime_ns = 10;
    Hsflow__Stats *s2 = (Hsflow__Stats *)round_trip(HS_MSG_STATS, &s.base);
    ck_assert_uint_eq(s2->n_workers, 2);
    ck_assert_double_eq(s2->workers[0]->busy_pct, 97.5);
    ck_assert_uint_eq(s2->workers[0]->tokens, 1000);
    ck_assert_double_eq(s2->workers[1]->stall_pct, 12.5);
    ck_assert_uint_eq(s2->tokens, 2000);
    ck_assert_uint_eq(s2->batches, 4);
    ck_assert_double_eq(s2->stall_pct, 6.25);
    ck_assert_double_eq(s2->tokens_per_s, 16000.5);
    hs_msg_free(&s2->base);

    Hsflow__Error e = HSFLOW__ERROR__INIT;
    e.code = HS_ERR_MISMATCH;
    e.text = "layout differs: H=4096 vs H=5120";
    Hsflow__Error *e2 = (Hsflow__Error *)round_trip(HS_MSG_ERROR, &e.base);
    ck_assert_int_eq(e2->code, HS_ERR_MISMATCH);
    ck_assert_str_eq(e2->text, e.text);
    hs_msg_free(&e2->base);

    Hsflow__Bye b = HSFLOW__BYE__INIT;
    b.reason = "run complete";
    Hsflow__Bye *b2 = (Hsflow__Bye *)round_trip(HS_MSG_BYE, &b.base);
    ck_assert_str_eq(b2->reason, "run complete");
    hs_msg_free(&b2->base);

    /* an empty BYE is a zero-length body */
    Hsflow__Bye b0 = HSFLOW__BYE__INIT;
    ck_assert_uint_eq(hs_msg_frame_size(&b0.base), HS_FRAME_HEADER_BYTES);
    hs_msg_free(round_trip(HS_MSG_BYE, &b0.base));
}
END_TEST

static size_t packed_ticket(void)
{
    Hsflow__Ticket t = HSFLOW__TICKET__INIT;
    t.ticket_id = 1;
    t.n_seqs = 1;
    t.n_tokens = 100000;
    t.bytes = 1u << 20;
    size_t len = 0;
    ck_assert_int_eq(hs_msg_pack(HS_MSG_TICKET, &t.base, frame_buf, sizeof frame_buf, &len), HS_OK);
    return len;
}

START_TEST(layout_spec_round_trips_and_malformed_specs_are_refused)
{
    hs_layout_t l = test_layout(), back;
    char spec[160], reason[160];
    hs_layout_spec(&l, spec, sizeof(spec));
    ck_assert_str_eq(spec, "H=83,layers=2,16,29,dtype=bf16");
    ck_assert_int_eq(hs_layout_parse(spec, &back, reason, sizeof(reason)), HS_OK);
    ck_assert_uint_eq(hs_layout_id(&back), hs_layout_id(&l));
    /* any order, dtype optional */
    ck_assert_int_eq(hs_layout_parse("layers=2,16,29,H=83", &back, reason, sizeof(reason)), HS_OK);
    ck_assert_uint_eq(hs_layout_id(&back), hs_layout_id(&l));
    /* fp8 round-trips and is another layout */
    ck_assert_int_eq(
        hs_layout_parse("H=83,layers=2,16,29,dtype=fp8", &back, reason, sizeof(reason)), HS_OK);
    ck_assert_uint_eq(back.dtype, HS_DTYPE_FP8);
    hs_layout_spec(&back, spec, sizeof(spec));
    ck_assert_str_eq(spec, "H=83,layers=2,16,29,dtype=fp8");
    ck_assert_uint_ne(hs_layout_id(&back), hs_layout_id(&l));
    static const char *bad[] = {
        "",
        "H=83",
        "layers=2,16",
        "H=83,layers=16,2",
        "H=0,layers=2",
        "H=83,layers=2,H=83",
        "H=83,layers=2,dtype=fp16",
        "H=83,layers=2,dtype=fp8,dtype=fp8",
        "H=83,2,layers=3",
        "H=83,layers=2,,3",
        "H=83,layers=-1",
        "H=83,layers=2,colour=blue",
        "H=99999999999,layers=2",
        "H=8,layers=0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21,22,23,24,25,26,27,28,"
        "29,30,31,32",
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        reason[0] = 0;
        ck_assert_msg(hs_layout_parse(bad[i], &back, reason, sizeof(reason)) == HS_ERR_INVALID,
                      "'%s' was accepted", bad[i]);
        ck_assert_msg(reason[0], "'%s': no reason given", bad[i]);
    }
}
END_TEST

START_TEST(frame_with_bad_magic_is_rejected)
{
    size_t len = packed_ticket();
    frame_buf[0] ^= 0x01;
    hs_frame_header_t h = {0};
    ck_assert_int_eq(hs_frame_header_decode(frame_buf, HS_FRAME_MAX_BODY, &h, why, sizeof why),
                     HS_ERR_FORMAT);
    ck_assert_ptr_nonnull(strstr(why, "magic"));
    ck_assert_uint_eq(h.magic, 0); /* output untouched on failure */
    uint16_t type;
    ProtobufCMessage *m = NULL;
    ck_assert_int_eq(hs_msg_decode_frame(frame_buf, len, &type, &m, why, sizeof why),
                     HS_ERR_FORMAT);
    ck_assert_ptr_null(m);
}
END_TEST

START_TEST(frame_with_another_protocol_version_is_a_mismatch)
{
    packed_ticket();
    frame_buf[4] = HS_PROTO_VERSION + 1;
    hs_frame_header_t h;
    ck_assert_int_eq(hs_frame_header_decode(frame_buf, HS_FRAME_MAX_BODY, &h, why, sizeof why),
                     HS_ERR_MISMATCH);
    ck_assert_ptr_nonnull(strstr(why, "version"));
}
END_TEST

START_TEST(frame_with_unknown_type_is_rejected)
{
    hs_frame_header_t h;
    uint16_t bad_types[] = {0, HS_MSG_TYPE_MAX + 1, 0xffff};
    for (size_t i = 0; i < sizeof bad_types / sizeof bad_types[0]; i++) {
        packed_ticket();
        frame_buf[6] = (uint8_t)bad_types[i];
        frame_buf[7] = (uint8_t)(bad_types[i] >> 8);
        ck_assert_int_eq(hs_frame_header_decode(frame_buf, HS_FRAME_MAX_BODY, &h, why, sizeof why),
                         HS_ERR_FORMAT);
        ck_assert_ptr_nonnull(strstr(why, "type"));
    }
    ProtobufCMessage *m = NULL;
    ck_assert_int_eq(
        hs_msg_unpack(HS_MSG_TYPE_MAX + 1, (const uint8_t *)"", 0, &m, why, sizeof why),
        HS_ERR_FORMAT);
    ck_assert_ptr_null(hs_msg_descriptor(0));
    ck_assert_ptr_null(hs_msg_descriptor(HS_MSG_TYPE_MAX + 1));
}
END_TEST

START_TEST(oversized_body_len_is_rejected_from_the_header_alone)
{
    /* Only the 16 header bytes exist: a decoder that wanted the body (or
     * allocated for it) could not pass this test under ASan. */
    uint8_t hdr[HS_FRAME_HEADER_BYTES];
    hs_frame_header_encode(hdr, HS_MSG_PLAN, NULL, 0);
    uint32_t huge = HS_FRAME_MAX_BODY + 1;
    memcpy(hdr + 8, &huge, 4);
    hs_frame_header_t h;
    ck_assert_int_eq(hs_frame_header_decode(hdr, HS_FRAME_MAX_BODY, &h, why, sizeof why),
                     HS_ERR_FORMAT);
    ck_assert_ptr_nonnull(strstr(why, "exceeds"));
    huge = 0xffffffffu;
    memcpy(hdr + 8, &huge, 4);
    ck_assert_int_eq(hs_frame_header_decode(hdr, HS_FRAME_MAX_BODY, &h, why, sizeof why),
                     HS_ERR_FORMAT);
    /* a tighter limit from the caller is honoured too */
    huge = 1000;
    memcpy(hdr + 8, &huge, 4);
    ck_assert_int_eq(hs_frame_header_decode(hdr, 999, &h, why, sizeof why), HS_ERR_FORMAT);
    ck_assert_int_eq(hs_frame_header_decode(hdr, 1000, &h, why, sizeof why), HS_OK);
    ck_assert_uint_eq(h.body_len, 1000);
    /* unpack refuses an oversized length without touching the body */
    ProtobufCMessage *m = NULL;
    ck_assert_int_eq(hs_msg_unpack(HS_MSG_PLAN, NULL, HS_FRAME_MAX_BODY + 1, &m, why, sizeof why),
                     HS_ERR_FORMAT);
    ck_assert_ptr_null(m);
}
END_TEST

START_TEST(flipped_body_byte_fails_the_crc)
{
    size_t len = packed_ticket();
    for (size_t i = HS_FRAME_HEADER_BYTES; i < len; i++) {
        frame_buf[i] ^= 0x10;
        hs_frame_header_t h;
        ck_assert_int_eq(hs_frame_header_decode(frame_buf, HS_FRAME_MAX_BODY, &h, why, sizeof why),
                         HS_OK);
        ck_assert_int_eq(
            hs_frame_body_check(&h, frame_buf + HS_FRAME_HEADER_BYTES, why, sizeof why),
            HS_ERR_CHECKSUM);
        uint16_t type;
        ProtobufCMessage *m = NULL;
        ck_assert_int_eq(hs_msg_decode_frame(frame_buf, len, &type, &m, why, sizeof why),
                         HS_ERR_CHECKSUM);
        frame_buf[i] ^= 0x10;
    }
    uint16_t type;
    ProtobufCMessage *m = NULL;
    ck_assert_int_eq(hs_msg_decode_frame(frame_buf, len, &type, &m, why, sizeof why), HS_OK);
    hs_msg_free(m);
}
END_TEST

/* protobuf-c takes a key of field number 0 written in three bytes (found by
 * fuzz_msg); the message would not decode again once re-encoded. */
START_TEST(field_number_zero_is_rejected)
{
    static const uint8_t stats[] = {0x81, 0x80, 0x00, 0x00, 0x60, 0x70,
                                    0x00, 0x02, 0x45, 0xd2, 0x28};
    ProtobufCMessage *m = NULL;
    ck_assert_int_eq(hs_msg_unpack(HS_MSG_STATS, stats, sizeof stats, &m, why, sizeof why),
                     HS_ERR_FORMAT);
    ck_assert_ptr_null(m);
    ck_assert_msg(strstr(why, "field numbered 0"), "why: %s", why);
    /* a field this release does not know (number 99) is still fine */
    static const uint8_t future[] = {0x98, 0x06, 0x01};
    ck_assert_int_eq(hs_msg_unpack(HS_MSG_BYE, future, sizeof future, &m, why, sizeof why), HS_OK);
    hs_msg_free(m);
}
END_TEST

START_TEST(truncated_body_fails_to_unpack)
{
    Hsflow__Layout lm;
    Hsflow__Hello hello = valid_hello(&lm);
    size_t len = 0;
    ck_assert_int_eq(hs_msg_pack(HS_MSG_HELLO, &hello.base, frame_buf, sizeof frame_buf, &len),
                     HS_OK);
    uint32_t body_len = (uint32_t)(len - HS_FRAME_HEADER_BYTES);
    ProtobufCMessage *m = NULL;
    /* cut inside the last varint */
    ck_assert_int_eq(hs_msg_unpack(HS_MSG_HELLO, frame_buf + HS_FRAME_HEADER_BYTES, body_len - 1,
                                   &m, why, sizeof why),
                     HS_ERR_FORMAT);
    ck_assert_ptr_null(m);
    /* cut inside the layout: either undecodable or invalid, never accepted */
    for (uint32_t cut = 0; cut < 24; cut++) {
        hs_status_t st = hs_msg_unpack(HS_MSG_HELLO, frame_buf + HS_FRAME_HEADER_BYTES, cut, &m,
                                       why, sizeof why);
        ck_assert_msg(st == HS_ERR_FORMAT, "hello cut at %u bytes was accepted", cut);
    }
    /* a frame whose header promises more body than arrived */
    uint16_t type;
    ck_assert_int_eq(hs_msg_decode_frame(frame_buf, len - 1, &type, &m, why, sizeof why),
                     HS_ERR_FORMAT);
    ck_assert_int_eq(hs_msg_decode_frame(frame_buf, 10, &type, &m, why, sizeof why), HS_ERR_FORMAT);
    /* a re-framed truncated body passes the crc but not the decoder */
    hs_frame_header_encode(frame_buf, HS_MSG_HELLO, frame_buf + HS_FRAME_HEADER_BYTES,
                           body_len - 1);
    ck_assert_int_eq(hs_msg_decode_frame(frame_buf, len - 1, &type, &m, why, sizeof why),
                     HS_ERR_FORMAT);
    ck_assert_ptr_null(m);
}
END_TEST

START_TEST(pack_refuses_small_buffers_and_mistyped_messages)
{
    Hsflow__Ticket t = HSFLOW__TICKET__INIT;
    t.n_seqs = 1;
    t.n_tokens = 1;
    t.bytes = 4096;
    size_t len = 12345;
    size_t need = hs_msg_frame_size(&t.base);
    ck_assert_int_eq(hs_msg_pack(HS_MSG_TICKET, &t.base, frame_buf, need - 1, &len),
                     HS_ERR_NOSPACE);
    ck_assert_uint_eq(len, 12345);
    ck_assert_int_eq(hs_msg_pack(HS_MSG_TICKET, &t.base, frame_buf, need, &len), HS_OK);
    ck_assert_uint_eq(len, need);
    /* a TICKET message sent as DONE is a local bug */
    ck_assert_int_eq(hs_msg_pack(HS_MSG_DONE, &t.base, frame_buf, sizeof frame_buf, &len),
                     HS_ERR_INVALID);
    /* an invalid message is never sent */
    t.n_seqs = 0;
    ck_assert_int_eq(hs_msg_pack(HS_MSG_TICKET, &t.base, frame_buf, sizeof frame_buf, &len),
                     HS_ERR_INVALID);
}
END_TEST

START_TEST(error_frame_carries_code_and_bounded_text)
{
    size_t len;
    ck_assert_int_eq(
        hs_msg_error_frame(HS_ERR_AUTH, "bad proof\x01 from x", frame_buf, sizeof frame_buf, &len),
        HS_OK);
    uint16_t type;
    ProtobufCMessage *m;
    ck_assert_int_eq(hs_msg_decode_frame(frame_buf, len, &type, &m, why, sizeof why), HS_OK);
    ck_assert_uint_eq(type, HS_MSG_ERROR);
    Hsflow__Error *e = (Hsflow__Error *)m;
    ck_assert_int_eq(e->code, HS_ERR_AUTH);
    ck_assert_str_eq(e->text, "bad proof? from x");
    hs_msg_free(m);

    char *big = malloc(3 * HS_MSG_TEXT_MAX);
    memset(big, 'x', 3 * HS_MSG_TEXT_MAX - 1);
    big[3 * HS_MSG_TEXT_MAX - 1] = '\0';
    ck_assert_int_eq(hs_msg_error_frame(HS_ERR_PROTO, big, frame_buf, sizeof frame_buf, &len),
                     HS_OK);
    ck_assert_int_eq(hs_msg_decode_frame(frame_buf, len, &type, &m, why, sizeof why), HS_OK);
    ck_assert_uint_eq(strlen(((Hsflow__Error *)m)->text), HS_MSG_TEXT_MAX - 1);
    hs_msg_free(m);
    free(big);

    /* an error frame never carries success */
    ck_assert_int_eq(hs_msg_error_frame(HS_OK, NULL, frame_buf, sizeof frame_buf, &len), HS_OK);
    ck_assert_int_eq(hs_msg_decode_frame(frame_buf, len, &type, &m, why, sizeof why), HS_OK);
    ck_assert_int_lt(((Hsflow__Error *)m)->code, 0);
    hs_msg_free(m);
    hs_msg_free(NULL);
}
END_TEST

/* ---- validation ---------------------------------------------------------- */

START_TEST(nonces_and_macs_of_the_wrong_size_are_rejected)
{
    static uint8_t bytes[64];
    Hsflow__Layout lm;
    Hsflow__Hello h = valid_hello(&lm);
    ck_assert_int_eq(unpack_raw(HS_MSG_HELLO, &h.base), HS_OK);
    size_t sizes[] = {0, 31, 33, 64};
    for (size_t i = 0; i < 4; i++) {
        h.client_nonce = (ProtobufCBinaryData){sizes[i], bytes};
        ck_assert_int_eq(unpack_raw(HS_MSG_HELLO, &h.base), HS_ERR_FORMAT);
        ck_assert_ptr_nonnull(strstr(why, "hello.client_nonce"));

        Hsflow__Challenge c = HSFLOW__CHALLENGE__INIT;
        c.server_nonce = (ProtobufCBinaryData){sizes[i], bytes};
        ck_assert_int_eq(unpack_raw(HS_MSG_CHALLENGE, &c.base), HS_ERR_FORMAT);
        ck_assert_ptr_nonnull(strstr(why, "challenge.server_nonce"));

        Hsflow__Auth a = HSFLOW__AUTH__INIT;
        a.mac = (ProtobufCBinaryData){sizes[i], bytes};
        ck_assert_int_eq(unpack_raw(HS_MSG_AUTH, &a.base), HS_ERR_FORMAT);
        ck_assert_ptr_nonnull(strstr(why, "auth.mac"));
    }
    /* WELCOME's server_mac is absent without authentication, else 32 bytes */
    Hsflow__Welcome w = HSFLOW__WELCOME__INIT;
    w.epochs = 1;
    ck_assert_int_eq(unpack_raw(HS_MSG_WELCOME, &w.base), HS_OK);
    w.server_mac = (ProtobufCBinaryData){32, bytes};
    ck_assert_int_eq(unpack_raw(HS_MSG_WELCOME, &w.base), HS_OK);
    w.server_mac = (ProtobufCBinaryData){16, bytes};
    ck_assert_int_eq(unpack_raw(HS_MSG_WELCOME, &w.base), HS_ERR_FORMAT);
    ck_assert_ptr_nonnull(strstr(why, "welcome.server_mac"));
    /* the tickets it grants per worker are bounded as HELLO's ask is */
    w.server_mac = (ProtobufCBinaryData){0, NULL};
    w.prefetch_per_worker = HS_MSG_MAX_PREFETCH;
    ck_assert_int_eq(unpack_raw(HS_MSG_WELCOME, &w.base), HS_OK);
    w.prefetch_per_worker = HS_MSG_MAX_PREFETCH + 1;
    ck_assert_int_eq(unpack_raw(HS_MSG_WELCOME, &w.base), HS_ERR_FORMAT);
    ck_assert_ptr_nonnull(strstr(why, "welcome.prefetch_per_worker"));
}
END_TEST

START_TEST(ranks_claims_are_bounded_and_checked)
{
    static Hsflow__RankClaim cl[HS_MSG_MAX_CLAIMS + 1];
    static Hsflow__RankClaim *cp[HS_MSG_MAX_CLAIMS + 1];
    for (uint32_t i = 0; i <= HS_MSG_MAX_CLAIMS; i++) {
        Hsflow__RankClaim init = HSFLOW__RANK_CLAIM__INIT;
        cl[i] = init;
        cl[i].rank = i % 4;
        cl[i].world = 4;
        cl[i].instance_id = 1000 + i;
        cl[i].started_unix_ms = 1764800000000ull + i;
        cl[i].consumer_name = "node:1";
        cp[i] = &cl[i];
    }
    Hsflow__Ranks r = HSFLOW__RANKS__INIT;
    r.claims = cp;
    r.n_claims = HS_MSG_MAX_CLAIMS;
    r.hops = 2;
    ck_assert_int_eq(unpack_raw(HS_MSG_RANKS, &r.base), HS_OK);
    r.n_claims = HS_MSG_MAX_CLAIMS + 1;
    ck_assert_int_eq(unpack_raw(HS_MSG_RANKS, &r.base), HS_ERR_FORMAT);
    ck_assert_ptr_nonnull(strstr(why, "ranks.claims has"));
    r.n_claims = 2;
    r.hops = 3;
    ck_assert_int_eq(unpack_raw(HS_MSG_RANKS, &r.base), HS_ERR_FORMAT);
    ck_assert_ptr_nonnull(strstr(why, "ranks.hops"));
    r.hops = 0;
    cl[1].rank = 4; /* not below its world */
    ck_assert_int_eq(unpack_raw(HS_MSG_RANKS, &r.base), HS_ERR_FORMAT);
    ck_assert_ptr_nonnull(strstr(why, "ranks.claims[1] is rank 4 of 4"));
    cl[1].rank = 1;
    cl[1].instance_id = 0;
    ck_assert_int_eq(unpack_raw(HS_MSG_RANKS, &r.base), HS_ERR_FORMAT);
    ck_assert_ptr_nonnull(strstr(why, "ranks.claims[1].instance_id is 0"));
    cl[1].instance_id = 7;
    cl[1].consumer_name = "evil\x1b[2J";
    ck_assert_int_eq(unpack_raw(HS_MSG_RANKS, &r.base), HS_ERR_FORMAT);
    ck_assert_ptr_nonnull(strstr(why, "control byte"));
    cl[1].consumer_name = "node:2";
    ck_assert_int_eq(unpack_raw(HS_MSG_RANKS, &r.base), HS_OK);
    ck_assert_str_eq(hs_msg_type_str(HS_MSG_RANKS), "RANKS");
}
END_TEST

START_TEST(plan_pages_with_mismatched_or_bad_arrays_are_rejected)
{
    uint32_t seqs[4] = {1, 2, 3, 4}, toks[4] = {10, 20, 30, 40};
    Hsflow__Plan p = HSFLOW__PLAN__INIT;
    p.n_seqs = seqs;
    p.n_tokens = toks;
    p.n_n_seqs = p.n_n_tokens = 4;
    ck_assert_int_eq(unpack_raw(HS_MSG_PLAN, &p.base), HS_OK);

    p.n_n_tokens = 3;
    ck_assert_int_eq(unpack_raw(HS_MSG_PLAN, &p.base), HS_ERR_FORMAT);
    ck_assert_ptr_nonnull(strstr(why, "plan.n_tokens"));
    p.n_n_tokens = 4;

    p.n_n_seqs = p.n_n_tokens = 0;
    ck_assert_int_eq(unpack_raw(HS_MSG_PLAN, &p.base), HS_ERR_FORMAT);
    p.n_n_seqs = p.n_n_tokens = 4;

    seqs[2] = 0; /* a batch without sequences */
    ck_assert_int_eq(unpack_raw(HS_MSG_PLAN, &p.base), HS_ERR_FORMAT);
    ck_assert_ptr_nonnull(strstr(why, "plan batch 2"));
    seqs[2] = 31; /* more sequences than tokens */
    ck_assert_int_eq(unpack_raw(HS_MSG_PLAN, &p.base), HS_ERR_FORMAT);
    seqs[2] = 3;

    p.first_batch = UINT32_MAX - 2; /* ids would wrap */
    ck_assert_int_eq(unpack_raw(HS_MSG_PLAN, &p.base), HS_ERR_FORMAT);
    ck_assert_ptr_nonnull(strstr(why, "first_batch"));
    p.first_batch = 0;

    /* a page larger than HS_PLAN_PAGE_MAX, yet inside the frame limit */
    size_t n = HS_PLAN_PAGE_MAX + 1;
    uint32_t *ones = malloc(n * sizeof *ones);
    for (size_t i = 0; i < n; i++)
        ones[i] = 1;
    p.n_seqs = p.n_tokens = ones;
    p.n_n_seqs = p.n_n_tokens = n;
    ck_assert_uint_le(protobuf_c_message_get_packed_size(&p.base), HS_FRAME_MAX_BODY);
    ck_assert_int_eq(unpack_raw(HS_MSG_PLAN, &p.base), HS_ERR_FORMAT);
    p.n_n_seqs = p.n_n_tokens = HS_PLAN_PAGE_MAX;
    ck_assert_int_eq(unpack_raw(HS_MSG_PLAN, &p.base), HS_OK);
    free(ones);
}
END_TEST

START_TEST(layouts_with_too_many_or_bad_layers_are_rejected)
{
    Hsflow__Layout lm;
    Hsflow__Hello h = valid_hello(&lm);
    int32_t many[HS_MAX_LAYERS + 1];
    for (int i = 0; i <= HS_MAX_LAYERS; i++)
        many[i] = i;
    lm.layers = many;
    lm.n_layers = HS_MAX_LAYERS + 1;
    ck_assert_int_eq(unpack_raw(HS_MSG_HELLO, &h.base), HS_ERR_FORMAT);
    ck_assert_ptr_nonnull(strstr(why, "hello.layout.layers"));
    lm.n_layers = HS_MAX_LAYERS;
    ck_assert_int_eq(unpack_raw(HS_MSG_HELLO, &h.base), HS_OK);
    lm.n_layers = 0;
    ck_assert_int_eq(unpack_raw(HS_MSG_HELLO, &h.base), HS_ERR_FORMAT);
    lm.n_layers = 3;
    many[1] = 0; /* not increasing */
    ck_assert_int_eq(unpack_raw(HS_MSG_HELLO, &h.base), HS_ERR_FORMAT);
    ck_assert_ptr_nonnull(strstr(why, "increasing"));
    many[1] = 1;
    lm.hidden_size = 0;
    ck_assert_int_eq(unpack_raw(HS_MSG_HELLO, &h.base), HS_ERR_FORMAT);
    lm.hidden_size = 64;
    lm.dtype = 7;
    ck_assert_int_eq(unpack_raw(HS_MSG_HELLO, &h.base), HS_ERR_FORMAT);
    lm.dtype = HS_DTYPE_BF16;
    h.layout = NULL;
    ck_assert_int_eq(unpack_raw(HS_MSG_HELLO, &h.base), HS_ERR_FORMAT);
    ck_assert_ptr_nonnull(strstr(why, "hello.layout is missing"));
}
END_TEST

START_TEST(strings_and_counts_are_bounded)
{
    Hsflow__Layout lm;
    Hsflow__Hello h = valid_hello(&lm);
    char name[HS_MSG_NAME_MAX + 8];
    memset(name, 'a', sizeof name - 1);
    name[sizeof name - 1] = '\0';
    h.producer_name = name;
    ck_assert_int_eq(unpack_raw(HS_MSG_HELLO, &h.base), HS_ERR_FORMAT);
    ck_assert_ptr_nonnull(strstr(why, "hello.producer_name"));
    name[HS_MSG_NAME_MAX - 1] = '\0';
    ck_assert_int_eq(unpack_raw(HS_MSG_HELLO, &h.base), HS_OK);
    h.producer_name = "host\x1b[2J:1"; /* terminal escapes never reach the logs */
    ck_assert_int_eq(unpack_raw(HS_MSG_HELLO, &h.base), HS_ERR_FORMAT);
    h.producer_name = "";
    ck_assert_int_eq(unpack_raw(HS_MSG_HELLO, &h.base), HS_ERR_FORMAT);
    h.producer_name = "r\xc3\xa9seau-7:12"; /* UTF-8 is fine */
    ck_assert_int_eq(unpack_raw(HS_MSG_HELLO, &h.base), HS_OK);
    /* a model path may be longer than a name */
    memset(name, 'p', sizeof name - 1);
    h.target_name = name;
    ck_assert_int_eq(unpack_raw(HS_MSG_HELLO, &h.base), HS_OK);
    h.target_name = "m";
    h.producer_name = "h:1";
    h.workers = 0;
    ck_assert_int_eq(unpack_raw(HS_MSG_HELLO, &h.base), HS_ERR_FORMAT);
    ck_assert_ptr_nonnull(strstr(why, "hello.workers"));
    h.workers = 1;
    uint64_t target = h.target_fingerprint; /* a producer must name its target */
    h.target_fingerprint = 0;
    ck_assert_int_eq(unpack_raw(HS_MSG_HELLO, &h.base), HS_ERR_FORMAT);
    ck_assert_ptr_nonnull(strstr(why, "hello.target_fingerprint"));
    h.target_fingerprint = target;

    char *text = malloc(HS_MSG_TEXT_MAX + 1);
    memset(text, 't', HS_MSG_TEXT_MAX);
    text[HS_MSG_TEXT_MAX] = '\0';
    Hsflow__Bye b = HSFLOW__BYE__INIT;
    b.reason = text;
    ck_assert_int_eq(unpack_raw(HS_MSG_BYE, &b.base), HS_ERR_FORMAT);
    ck_assert_ptr_nonnull(strstr(why, "bye.reason"));
    Hsflow__Error e = HSFLOW__ERROR__INIT;
    e.code = HS_ERR_PROTO;
    e.text = text;
    ck_assert_int_eq(unpack_raw(HS_MSG_ERROR, &e.base), HS_ERR_FORMAT);
    free(text);
    e.text = "fine";
    e.code = 3;
    ck_assert_int_eq(unpack_raw(HS_MSG_ERROR, &e.base), HS_ERR_FORMAT);
    ck_assert_ptr_nonnull(strstr(why, "error.code"));

    Hsflow__WorkerStats ws = HSFLOW__WORKER_STATS__INIT;
    Hsflow__WorkerStats *wp = &ws;
    Hsflow__Stats s = HSFLOW__STATS__INIT;
    s.worker_count = 1;
    s.n_workers = 1;
    s.workers = &wp;
    ck_assert_int_eq(unpack_raw(HS_MSG_STATS, &s.base), HS_OK);
    ws.busy_pct = 100.4; /* rounding slack */
    ck_assert_int_eq(unpack_raw(HS_MSG_STATS, &s.base), HS_OK);
    ws.busy_pct = 250;
    ck_assert_int_eq(unpack_raw(HS_MSG_STATS, &s.base), HS_ERR_FORMAT);
    ck_assert_ptr_nonnull(strstr(why, "stats.workers[0].busy_pct"));
    ws.busy_pct = 0.0 / 0.0;
    ck_assert_int_eq(unpack_raw(HS_MSG_STATS, &s.base), HS_ERR_FORMAT);
    ws.busy_pct = 10;
    s.worker_count = HS_MSG_MAX_WORKERS + 1;
    ck_assert_int_eq(unpack_raw(HS_MSG_STATS, &s.base), HS_ERR_FORMAT);

    Hsflow__Ticket t = HSFLOW__TICKET__INIT;
    t.n_seqs = 4;
    t.n_tokens = 3;
    t.bytes = 1 << 20;
    ck_assert_int_eq(unpack_raw(HS_MSG_TICKET, &t.base), HS_ERR_FORMAT);
    ck_assert_ptr_nonnull(strstr(why, "ticket.n_seqs"));
}
END_TEST

START_TEST(layout_message_conversion_checks_the_layout_id)
{
    hs_layout_t l = test_layout(), back;
    Hsflow__Layout lm;
    int32_t store[HS_MAX_LAYERS];
    hs_layout_to_msg(&l, &lm, store);
    ck_assert_uint_eq(lm.n_layers, 3);
    ck_assert_uint_eq(lm.layout_id, hs_layout_id(&l));
    ck_assert_int_eq(hs_layout_from_msg(&lm, &back, why, sizeof why), HS_OK);
    ck_assert_mem_eq(&back, &l, sizeof l);
    lm.layout_id ^= 1;
    memset(&back, 0, sizeof back);
    ck_assert_int_eq(hs_layout_from_msg(&lm, &back, why, sizeof why), HS_ERR_MISMATCH);
    ck_assert_uint_eq(back.hidden_size, 0);
    lm.layout_id ^= 1;
    store[2] = 30; /* the id no longer describes the fields */
    ck_assert_int_eq(hs_layout_from_msg(&lm, &back, why, sizeof why), HS_ERR_MISMATCH);
}
END_TEST

/* ---- auth ---------------------------------------------------------------- */

static void write_file(const char *path, const char *content, mode_t mode)
{
    FILE *f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    fputs(content, f);
    fclose(f);
    chmod(path, mode);
}

static char tmpdir[64];

static void make_tmpdir(void)
{
    snprintf(tmpdir, sizeof tmpdir, "/tmp/hs_test_proto_XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(tmpdir));
}

static void load_key(const char *secret, hs_auth_key_t *key)
{
    char path[128];
    snprintf(path, sizeof path, "%s/secret", tmpdir);
    write_file(path, secret, 0600);
    ck_assert_int_eq(hs_auth_load_secret(path, key), HS_OK);
    unlink(path);
}

START_TEST(auth_proofs_verify_with_the_right_key_only)
{
    make_tmpdir();
    hs_auth_key_t key, other;
    load_key("correct horse battery staple\n", &key);
    load_key("correct horse battery stable\n", &other);
    uint8_t cn[32], sn[32], sn2[32];
    ck_assert_int_eq(hs_auth_nonce(cn), HS_OK);
    ck_assert_int_eq(hs_auth_nonce(sn), HS_OK);
    ck_assert_int_eq(hs_auth_nonce(sn2), HS_OK);
    ck_assert_mem_ne(sn, sn2, 32);
    const char hello[] = "hello body bytes";

    uint8_t p_mac[32], c_check[32];
    ck_assert_int_eq(hs_auth_producer_mac(&key, sn, cn, hello, sizeof hello, p_mac), HS_OK);
    /* consumer recomputes with its own key */
    ck_assert_int_eq(hs_auth_producer_mac(&key, sn, cn, hello, sizeof hello, c_check), HS_OK);
    ck_assert_int_eq(hs_auth_verify(p_mac, c_check), HS_OK);
    /* a producer with the wrong key */
    uint8_t bad[32];
    ck_assert_int_eq(hs_auth_producer_mac(&other, sn, cn, hello, sizeof hello, bad), HS_OK);
    ck_assert_int_eq(hs_auth_verify(bad, c_check), HS_ERR_AUTH);
    /* a recorded proof replayed against a fresh challenge */
    ck_assert_int_eq(hs_auth_producer_mac(&key, sn2, cn, hello, sizeof hello, c_check), HS_OK);
    ck_assert_int_eq(hs_auth_verify(p_mac, c_check), HS_ERR_AUTH);
    /* the proof is bound to the HELLO it came with */
    ck_assert_int_eq(hs_auth_producer_mac(&key, sn, cn, "hello body bytez", sizeof hello, c_check),
                     HS_OK);
    ck_assert_int_eq(hs_auth_verify(p_mac, c_check), HS_ERR_AUTH);

    /* consumer's proof: right key verifies, wrong key or swapped nonces fail */
    uint8_t s_mac[32], s_check[32];
    ck_assert_int_eq(hs_auth_consumer_mac(&key, cn, sn, s_mac), HS_OK);
    ck_assert_int_eq(hs_auth_consumer_mac(&key, cn, sn, s_check), HS_OK);
    ck_assert_int_eq(hs_auth_verify(s_mac, s_check), HS_OK);
    ck_assert_int_eq(hs_auth_consumer_mac(&other, cn, sn, s_check), HS_OK);
    ck_assert_int_eq(hs_auth_verify(s_mac, s_check), HS_ERR_AUTH);
    ck_assert_int_eq(hs_auth_consumer_mac(&key, sn, cn, s_check), HS_OK);
    ck_assert_int_eq(hs_auth_verify(s_mac, s_check), HS_ERR_AUTH);
    /* the two directions never produce the same proof */
    ck_assert_int_eq(hs_auth_consumer_mac(&key, sn, cn, s_check), HS_OK);
    ck_assert_mem_ne(p_mac, s_mac, 32);
    hs_auth_key_clear(&key);
    hs_auth_key_clear(NULL);
    rmdir(tmpdir);
}
END_TEST

START_TEST(secret_files_are_trimmed_and_must_be_long_enough)
{
    make_tmpdir();
    char path[128];
    snprintf(path, sizeof path, "%s/secret", tmpdir);
    hs_auth_key_t a, b, keep;
    memset(&keep, 0x77, sizeof keep);
    b = keep;

    write_file(path, "0123456789abcdef\n", 0600); /* exactly 16 bytes + newline */
    ck_assert_int_eq(hs_auth_load_secret(path, &a), HS_OK);
    write_file(path, "0123456789abcdef", 0600);
    ck_assert_int_eq(hs_auth_load_secret(path, &b), HS_OK);
    ck_assert_mem_eq(&a, &b, sizeof a);

    b = keep;
    write_file(path, "0123456789abcde\n", 0600); /* 15 bytes */
    ck_assert_int_eq(hs_auth_load_secret(path, &b), HS_ERR_INVALID);
    ck_assert_mem_eq(&b, &keep, sizeof b);
    write_file(path, "", 0600);
    ck_assert_int_eq(hs_auth_load_secret(path, &b), HS_ERR_INVALID);
    /* readable by others: still loads, with a warning */
    write_file(path, "0123456789abcdef\n", 0644);
    ck_assert_int_eq(hs_auth_load_secret(path, &b), HS_OK);
    ck_assert_mem_eq(&a, &b, sizeof a);
    unlink(path);
    b = keep;
    ck_assert_int_eq(hs_auth_load_secret(path, &b), HS_ERR_IO);
    ck_assert_mem_eq(&b, &keep, sizeof b);
    ck_assert_int_eq(hs_auth_load_secret(tmpdir, &b), HS_ERR_INVALID); /* a directory */
    rmdir(tmpdir);
}
END_TEST

/* A FIFO, a socket or a directory as the secret file is refused at once:
 * opening a FIFO for reading used to wait for a writer, forever. */
START_TEST(secret_file_that_is_a_fifo_is_refused_without_waiting_for_a_writer)
{
    make_tmpdir();
    char path[128];
    snprintf(path, sizeof path, "%s/secret.fifo", tmpdir);
    ck_assert_int_eq(mkfifo(path, 0600), 0);
    hs_auth_key_t b, keep;
    memset(&keep, 0x77, sizeof keep);
    b = keep;
    alarm(10); /* a load that blocks ends the test (SIGALRM) */
    ck_assert_int_eq(hs_auth_load_secret(path, &b), HS_ERR_INVALID);
    alarm(0);
    ck_assert_mem_eq(&b, &keep, sizeof b);
    unlink(path);
    rmdir(tmpdir);
}
END_TEST

/* ---- batch region -------------------------------------------------------- */

typedef struct {
    void *region;
    uint64_t bytes;
    uint32_t n, T;
    hs_batch_view_t v;
} test_batch_t;

/* n sequences of the given lengths, epoch 3, index 41, synthetic hidden. */
static test_batch_t make_batch(const hs_layout_t *l, uint32_t n, const uint32_t *lens)
{
    test_batch_t b = {0};
    b.n = n;
    for (uint32_t i = 0; i < n; i++)
        b.T += lens[i];
    b.bytes = hs_batch_bytes(n, b.T, l);
    b.region = hs_aligned_alloc(HS_BATCH_ALIGN, b.bytes);
    ck_assert_ptr_nonnull(b.region);
    memset(b.region, 0, b.bytes);
    b.v = hs_batch_view(b.region, n, b.T, l);
    hs_batch_header_init(b.v.header, 3, 41, n, b.T, l, 0xabcdefull);
    b.v.cu_seqlens[0] = 0;
    for (uint32_t i = 0; i < n; i++) {
        b.v.cu_seqlens[i + 1] = b.v.cu_seqlens[i] + (int32_t)lens[i];
        b.v.sample_ids[i] = 1000 + 7ull * i;
    }
    for (uint32_t t = 0; t < b.T; t++) {
        b.v.input_ids[t] = (int32_t)(t * 31 % 151936);
        b.v.loss_mask[t] = (uint8_t)(t & 1);
    }
    hs_batch_synth_fill(&b.v, l);
    hs_batch_seal(b.region, b.bytes);
    return b;
}

START_TEST(batch_offsets_are_aligned_and_total_follows_the_formula)
{
    hs_layout_t l = test_layout();
    uint32_t shapes[][2] = {{1, 1}, {3, 17}, {8, 65536}, {63, 1000}, {64, 1024}, {1000, 1000}};
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        uint32_t n = shapes[i][0], T = shapes[i][1];
        hs_batch_offsets_t o = hs_batch_offsets(n, T, &l);
        uint64_t parts[] = {o.cu_seqlens, o.sample_ids, o.input_ids,
                            o.loss_mask,  o.hidden,     o.total};
        for (size_t p = 0; p < 6; p++)
            ck_assert_uint_eq(parts[p] % HS_BATCH_ALIGN, 0);
        ck_assert_uint_eq(o.cu_seqlens, HS_BATCH_HEADER_BYTES);
        /* each part holds its array and no more than one alignment of slack */
        ck_assert_uint_ge(o.sample_ids - o.cu_seqlens, 4ull * (n + 1));
        ck_assert_uint_lt(o.sample_ids - o.cu_seqlens, 4ull * (n + 1) + HS_BATCH_ALIGN);
        ck_assert_uint_ge(o.input_ids - o.sample_ids, 8ull * n);
        ck_assert_uint_lt(o.input_ids - o.sample_ids, 8ull * n + HS_BATCH_ALIGN);
        ck_assert_uint_ge(o.loss_mask - o.input_ids, 4ull * T);
        ck_assert_uint_lt(o.loss_mask - o.input_ids, 4ull * T + HS_BATCH_ALIGN);
        ck_assert_uint_ge(o.hidden - o.loss_mask, T);
        ck_assert_uint_lt(o.hidden - o.loss_mask, (uint64_t)T + HS_BATCH_ALIGN);
        uint64_t hid = (uint64_t)T * 3 * 83 * 2;
        ck_assert_uint_ge(o.total - o.hidden, hid);
        ck_assert_uint_lt(o.total - o.hidden, hid + HS_BATCH_ALIGN);
        ck_assert_uint_eq(hs_batch_bytes(n, T, &l), o.total);
    }
    /* a worked example: n=3, T=17, k=3, H=83 */
    hs_batch_offsets_t o = hs_batch_offsets(3, 17, &l);
    ck_assert_uint_eq(o.sample_ids, 512);
    ck_assert_uint_eq(o.input_ids, 768);
    ck_assert_uint_eq(o.loss_mask, 1024);
    ck_assert_uint_eq(o.hidden, 1280);
    ck_assert_uint_eq(o.total, 1280 + 8704); /* 17*3*83*2 = 8466 -> 8704 */
    /* DFlash on a 5120-wide target: 5 layers, 65536 tokens is ~3.4 GB */
    hs_layout_t big = {5120, HS_DTYPE_BF16, 5, {1, 10, 19, 28, 37}};
    ck_assert_uint_ge(hs_batch_bytes(8, 65536, &big), 65536ull * 5 * 5120 * 2);
}
END_TEST

START_TEST(verify_accepts_a_sealed_batch)
{
    hs_layout_t l = test_layout();
    uint32_t lens[] = {5, 1, 11};
    test_batch_t b = make_batch(&l, 3, lens);
    ck_assert_int_eq(hs_batch_verify(b.region, b.bytes, 3, 41, 3, 17, &l, why, sizeof why), HS_OK);
    ck_assert_uint_eq(b.v.header->total_bytes, b.bytes);
    ck_assert_uint_eq(b.v.header->plan_hash, 0xabcdefull);
    hs_aligned_free(b.region);
}
END_TEST

START_TEST(verify_rejects_each_wrong_header_field)
{
    hs_layout_t l = test_layout();
    uint32_t lens[] = {5, 1, 11};
    test_batch_t b = make_batch(&l, 3, lens);
    struct {
        const char *name;
        size_t off;
        hs_status_t want;
    } fields[] = {
        {"magic", offsetof(hs_batch_header_t, magic), HS_ERR_FORMAT},
        {"version", offsetof(hs_batch_header_t, version), HS_ERR_MISMATCH},
        {"dtype", offsetof(hs_batch_header_t, dtype), HS_ERR_MISMATCH},
        {"epoch", offsetof(hs_batch_header_t, epoch), HS_ERR_MISMATCH},
        {"index", offsetof(hs_batch_header_t, index), HS_ERR_MISMATCH},
        {"n_seqs", offsetof(hs_batch_header_t, n_seqs), HS_ERR_MISMATCH},
        {"n_tokens", offsetof(hs_batch_header_t, n_tokens), HS_ERR_MISMATCH},
        {"hidden_size", offsetof(hs_batch_header_t, hidden_size), HS_ERR_MISMATCH},
        {"n_layers", offsetof(hs_batch_header_t, n_layers), HS_ERR_MISMATCH},
        {"layout_id", offsetof(hs_batch_header_t, layout_id), HS_ERR_MISMATCH},
        {"total_bytes", offsetof(hs_batch_header_t, total_bytes), HS_ERR_MISMATCH},
        {"checksum", offsetof(hs_batch_header_t, checksum), HS_ERR_CHECKSUM},
        {"reserved", offsetof(hs_batch_header_t, reserved) + 17, HS_ERR_FORMAT},
    };
    uint8_t *r = b.region;
    for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++) {
        r[fields[i].off] ^= 0x02;
        why[0] = '\0';
        hs_status_t st = hs_batch_verify(r, b.bytes, 3, 41, 3, 17, &l, why, sizeof why);
        ck_assert_msg(st == fields[i].want, "header field %s: got %s (%s)", fields[i].name,
                      hs_status_str(st), why);
        ck_assert_msg(why[0] != '\0', "no reason given for %s", fields[i].name);
        r[fields[i].off] ^= 0x02;
        ck_assert_int_eq(hs_batch_verify(r, b.bytes, 3, 41, 3, 17, &l, why, sizeof why), HS_OK);
    }
    /* the ticket's view of the batch differs from the header */
    ck_assert_int_eq(hs_batch_verify(r, b.bytes, 4, 41, 3, 17, &l, why, sizeof why),
                     HS_ERR_MISMATCH);
    ck_assert_ptr_nonnull(strstr(why, "epoch"));
    ck_assert_int_eq(hs_batch_verify(r, b.bytes, 3, 40, 3, 17, &l, why, sizeof why),
                     HS_ERR_MISMATCH);
    hs_layout_t other = l;
    other.layers[0] = 1;
    ck_assert_int_eq(hs_batch_verify(r, b.bytes, 3, 41, 3, 17, &other, why, sizeof why),
                     HS_ERR_MISMATCH);
    ck_assert_ptr_nonnull(strstr(why, "layout_id"));
    /* the region is not the size the shape needs */
    ck_assert_int_eq(
        hs_batch_verify(r, b.bytes - HS_BATCH_ALIGN, 3, 41, 3, 17, &l, why, sizeof why),
        HS_ERR_MISMATCH);
    ck_assert_int_eq(hs_batch_verify(r, 100, 3, 41, 3, 17, &l, why, sizeof why), HS_ERR_FORMAT);
    hs_aligned_free(b.region);
}
END_TEST

START_TEST(verify_rejects_bad_cu_seqlens)
{
    hs_layout_t l = test_layout();
    uint32_t lens[] = {5, 1, 11};
    test_batch_t b = make_batch(&l, 3, lens);
    int32_t *cu = b.v.cu_seqlens; /* 0 5 6 17 */
    int32_t bad[][4] = {
        {1, 5, 6, 17},  /* does not start at 0 */
        {0, 5, 5, 17},  /* empty sequence */
        {0, 6, 5, 17},  /* decreasing */
        {0, 5, 6, 16},  /* does not end at T */
        {0, 5, 6, 18},  /* past T */
        {0, -5, 6, 17}, /* negative */
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        memcpy(cu, bad[i], sizeof bad[i]);
        hs_batch_seal(b.region, b.bytes); /* a well-sealed lie is still rejected */
        ck_assert_msg(hs_batch_verify(b.region, b.bytes, 3, 41, 3, 17, &l, why, sizeof why) ==
                          HS_ERR_FORMAT,
                      "cu_seqlens case %zu accepted", i);
        ck_assert_ptr_nonnull(strstr(why, "cu_seqlens"));
    }
    int32_t good[4] = {0, 5, 6, 17};
    memcpy(cu, good, sizeof good);
    hs_batch_seal(b.region, b.bytes);
    ck_assert_int_eq(hs_batch_verify(b.region, b.bytes, 3, 41, 3, 17, &l, why, sizeof why), HS_OK);
    hs_aligned_free(b.region);
}
END_TEST

START_TEST(flipped_byte_anywhere_in_the_body_fails_the_checksum)
{
    hs_layout_t l = test_layout();
    uint32_t lens[] = {5, 1, 11};
    test_batch_t b = make_batch(&l, 3, lens);
    hs_batch_offsets_t o = hs_batch_offsets(3, 17, &l);
    uint64_t spots[] = {o.sample_ids + 3, o.input_ids + 5, o.loss_mask + 16, o.hidden,
                        o.hidden + 1000,  b.bytes - 1,     o.input_ids - 1 /* padding */};
    uint8_t *r = b.region;
    for (size_t i = 0; i < sizeof spots / sizeof spots[0]; i++) {
        r[spots[i]] ^= 0x80;
        ck_assert_int_eq(hs_batch_verify(r, b.bytes, 3, 41, 3, 17, &l, why, sizeof why),
                         HS_ERR_CHECKSUM);
        ck_assert_ptr_nonnull(strstr(why, "checksum"));
        r[spots[i]] ^= 0x80;
    }
    ck_assert_int_eq(hs_batch_verify(r, b.bytes, 3, 41, 3, 17, &l, why, sizeof why), HS_OK);
    hs_aligned_free(b.region);
}
END_TEST

/* ---- layout --------------------------------------------------------------- */

START_TEST(layout_check_validates_ranges_and_ids_differ)
{
    hs_layout_t l = test_layout();
    ck_assert_int_eq(hs_layout_check(&l), HS_OK);
    char d[128];
    hs_layout_describe(&l, d, sizeof d);
    ck_assert_str_eq(d, "H=83 dtype=bf16 layers=[2,16,29]");
    hs_layout_describe(&l, d, 8); /* truncates safely */
    ck_assert_uint_eq(strlen(d), 7);

    hs_layout_t m = l;
    m.layers[2] = 30;
    ck_assert_uint_ne(hs_layout_id(&l), hs_layout_id(&m));
    m = l;
    m.hidden_size = 84;
    ck_assert_uint_ne(hs_layout_id(&l), hs_layout_id(&m));
    m = l;
    m.layers[3] = 77; /* beyond n_layers: not part of the layout */
    ck_assert_uint_eq(hs_layout_id(&l), hs_layout_id(&m));

    m = l;
    m.hidden_size = 0;
    ck_assert_int_eq(hs_layout_check(&m), HS_ERR_INVALID);
    m.hidden_size = 65537;
    ck_assert_int_eq(hs_layout_check(&m), HS_ERR_INVALID);
    m = l;
    m.n_layers = 0;
    ck_assert_int_eq(hs_layout_check(&m), HS_ERR_INVALID);
    m.n_layers = HS_MAX_LAYERS + 1;
    ck_assert_int_eq(hs_layout_validate(&m, why, sizeof why), HS_ERR_INVALID);
    m = l;
    m.layers[0] = -1;
    ck_assert_int_eq(hs_layout_validate(&m, why, sizeof why), HS_ERR_INVALID);
    ck_assert_ptr_nonnull(strstr(why, "negative"));
    m = l;
    m.layers[1] = 2;
    ck_assert_int_eq(hs_layout_validate(&m, why, sizeof why), HS_ERR_INVALID);
    m = l;
    m.dtype = 3; /* neither bf16 nor fp8 */
    ck_assert_int_eq(hs_layout_validate(&m, why, sizeof why), HS_ERR_INVALID);
}
END_TEST

/* ---- synthetic hidden states ---------------------------------------------- */

START_TEST(synthetic_values_are_finite_bf16_and_vary)
{
    uint32_t seen_lo = 0xffff, seen_hi = 0;
    uint64_t st = 12345;
    for (int i = 0; i < 200000; i++) {
        uint64_t r = hs_splitmix64(&st);
        uint16_t v = hs_synth_value(r, (int32_t)(r >> 59), (uint32_t)(r >> 40) & 0xffff,
                                    (uint32_t)r & 0x1ffff);
        uint32_t exp = (v >> 7) & 0xff;
        ck_assert_uint_ne(exp, 0xff); /* no Inf or NaN */
        ck_assert_uint_ne(exp, 0);    /* no zeros or subnormals */
        if (v < seen_lo) seen_lo = v;
        if (v > seen_hi) seen_hi = v;
    }
    ck_assert_uint_lt(seen_lo, 0x3C10);
    ck_assert_uint_gt(seen_hi, 0x3FF0);
    /* each coordinate changes the value somewhere */
    int diff_s = 0, diff_l = 0, diff_p = 0, diff_c = 0;
    for (uint32_t c = 0; c < 64; c++) {
        uint16_t v = hs_synth_value(5, 3, 7, c);
        diff_s += v != hs_synth_value(6, 3, 7, c);
        diff_l += v != hs_synth_value(5, 4, 7, c);
        diff_p += v != hs_synth_value(5, 3, 8, c);
        diff_c += v != hs_synth_value(5, 3, 7, c + 1);
    }
    ck_assert_int_gt(diff_s, 50);
    ck_assert_int_gt(diff_l, 50);
    ck_assert_int_gt(diff_p, 50);
    ck_assert_int_eq(diff_c, 64);
}
END_TEST

START_TEST(synthetic_fill_matches_the_formula_and_checks_clean)
{
    hs_layout_t l = test_layout();
    uint32_t lens[] = {5, 1, 11, 2};
    test_batch_t b = make_batch(&l, 4, lens);
    ck_assert_int_eq(hs_batch_synth_check(&b.v, &l, why, sizeof why), HS_OK);
    /* spot-check the layout of hidden: [T][k*H], pos restarts per sequence */
    uint32_t H = l.hidden_size, k = l.n_layers;
    for (uint32_t s = 0; s < 4; s++)
        for (int32_t t = b.v.cu_seqlens[s]; t < b.v.cu_seqlens[s + 1]; t++)
            for (uint32_t j = 0; j < k; j++)
                for (uint32_t c = 0; c < H; c += 41)
                    ck_assert_uint_eq(b.v.hidden[(uint64_t)t * k * H + j * H + c],
                                      hs_synth_value(b.v.sample_ids[s], l.layers[j],
                                                     (uint32_t)(t - b.v.cu_seqlens[s]), c));
    hs_aligned_free(b.region);
}
END_TEST

START_TEST(fused_fill_and_seal_equals_fill_then_seal)
{
    hs_layout_t l = test_layout();
    uint32_t lens[] = {300, 1, 77};
    test_batch_t a = make_batch(&l, 3, lens); /* hs_batch_synth_fill + hs_batch_seal */
    test_batch_t b = make_batch(&l, 3, lens);
    memset(b.v.hidden, 0, (size_t)b.T * l.n_layers * l.hidden_size * 2);
    b.v.header->checksum = 0;
    hs_checksum_stream_t *cs = hs_checksum_stream_create();
    hs_batch_synth_fill_seal(&b.v, &l, b.bytes, cs);
    ck_assert_uint_eq(b.v.header->checksum, a.v.header->checksum);
    ck_assert_int_eq(memcmp(a.region, b.region, a.bytes), 0);
    ck_assert_int_eq(hs_batch_verify(b.region, b.bytes, 3, 41, 3, b.T, &l, why, sizeof why), HS_OK);
    hs_checksum_stream_destroy(cs);
    hs_aligned_free(a.region);
    hs_aligned_free(b.region);
}
END_TEST

/* ---- fp8 rows ------------------------------------------------------------ */

/* The value of e4m3 code c (0 .. 0x7e, non-negative), from its definition:
 * bias 7, subnormals m * 2^-9. Written apart from the library's decoder. */
static double e4m3_value(unsigned c)
{
    unsigned e = c >> 3, m = c & 7;
    return e == 0 ? m * ldexp(1.0, -9) : (1.0 + m / 8.0) * ldexp(1.0, (int)e - 7);
}

/* e4m3 of a by brute force: the nearest of the 127 finite non-negative codes,
 * a tie to the even code, saturated at 448. */
static uint8_t e4m3_nearest(double a)
{
    int neg = a < 0 || (a == 0 && signbit(a));
    a = fabs(a);
    unsigned best = 0;
    double best_d = INFINITY;
    for (unsigned c = 0; c <= 0x7e; c++) {
        double d = fabs(e4m3_value(c) - a);
        if (d < best_d || (d == best_d && (c & 1) == 0)) {
            best = c;
            best_d = d;
        }
    }
    if (a >= 448.0) best = 0x7e;
    return (uint8_t)(best | (neg ? 0x80u : 0u));
}

START_TEST(fp8_e4m3_rounds_to_nearest_even_and_saturates_like_its_definition)
{
    /* every finite bf16 value, divided by a few scales, against brute force */
    const float scales[] = {1.0f, 0.0078125f, 3.1f, 1.0f / 448.0f, 1e-3f};
    for (size_t si = 0; si < sizeof scales / sizeof scales[0]; si++)
        for (uint32_t b = 0; b < 0x10000u; b++) {
            if ((b & 0x7f80u) == 0x7f80u) continue; /* infinities and NaN */
            float x = hs_bf16_to_f32((uint16_t)b) / scales[si];
            if (!isfinite(x)) continue;
            uint8_t got = hs_fp8_from_f32(x), want = e4m3_nearest(x);
            ck_assert_msg(got == want, "e4m3(%.9g) = 0x%02x, expected 0x%02x", x, got, want);
        }
    /* every code decodes to its definition and encodes back to itself */
    for (unsigned c = 0; c < 256; c++) {
        if ((c & 0x7f) == 0x7f) {
            ck_assert(isnan(hs_fp8_to_f32((uint8_t)c)));
            continue;
        }
        double v = e4m3_value(c & 0x7f) * ((c & 0x80) ? -1 : 1);
        ck_assert(hs_fp8_to_f32((uint8_t)c) == (float)v);
        if ((c & 0x7f) != 0) ck_assert_uint_eq(hs_fp8_from_f32((float)v), c);
    }
    /* ties: 0.5 * 2^-9 between 0 and the smallest subnormal goes to 0; 464
     * (between 448 and the 480 e4m3 lacks) saturates */
    ck_assert_uint_eq(hs_fp8_from_f32(ldexpf(1.0f, -10)), 0);
    ck_assert_uint_eq(hs_fp8_from_f32(ldexpf(3.0f, -10)), 2);
    ck_assert_uint_eq(hs_fp8_from_f32(464.0f), 0x7e);
    ck_assert_uint_eq(hs_fp8_from_f32(-1e30f), 0xfe);
}
END_TEST

START_TEST(fp8_rows_scale_by_their_amax_refuse_non_finite_values_and_come_back_within_e4m3)
{
    enum { N = 1000 };
    uint16_t x[N], back[N];
    uint8_t q[N];
    float scale;
    uint64_t bad = 0, rng = 9;
    for (int i = 0; i < N; i++) /* values over many binades, both signs */
        x[i] = hs_f32_to_bf16((float)((int64_t)(hs_splitmix64(&rng) % 601) - 300) *
                              ldexpf(1.0f, -(int)(hs_splitmix64(&rng) % 20)));
    x[17] = hs_f32_to_bf16(-320.0f); /* the largest magnitude */
    ck_assert_int_eq(hs_fp8_quantize_row_bf16(x, N, q, &scale, &bad), HS_OK);
    float amax = 0;
    for (int i = 0; i < N; i++)
        amax = fmaxf(amax, fabsf(hs_bf16_to_f32(x[i])));
    ck_assert(amax == 320.0f);
    ck_assert(scale == amax / 448.0f);
    ck_assert_uint_eq(q[17], 0xfe); /* -448 */
    hs_fp8_dequantize_row_bf16(q, N, scale, back);
    for (int i = 0; i < N; i++) {
        float xi = hs_bf16_to_f32(x[i]);
        ck_assert_uint_eq(q[i], e4m3_nearest((double)(xi / scale)));
        /* bf16(e4m3 * scale), the product rounded to float first */
        float prod = (float)((double)hs_fp8_to_f32(q[i]) * (double)scale);
        ck_assert_uint_eq(back[i], hs_f32_to_bf16(prod));
        /* within half an e4m3 step (relative 2^-4) of x, or of the subnormal
         * step (2^-9 * scale) for the smallest */
        double err = fabs((double)hs_bf16_to_f32(back[i]) - xi);
        ck_assert_msg(err <= fabs(xi) / 16 + ldexp(scale, -10) + fabs(xi) / 256,
                      "value %d: %.9g came back as %.9g", i, xi, hs_bf16_to_f32(back[i]));
    }
    /* a row of zeros: scale 1, zeros */
    uint16_t z[8] = {0, 0x8000, 0, 0, 0, 0, 0, 0};
    ck_assert_int_eq(hs_fp8_quantize_row_bf16(z, 8, q, &scale, &bad), HS_OK);
    ck_assert(scale == 1.0f);
    for (int i = 0; i < 8; i++)
        ck_assert_uint_eq(q[i] & 0x7f, 0);
    /* NaN and infinities are refused, naming the index */
    x[400] = 0x7fc0;
    ck_assert_int_eq(hs_fp8_quantize_row_bf16(x, N, q, &scale, &bad), HS_ERR_INVALID);
    ck_assert_uint_eq(bad, 400);
    x[400] = 0xff80; /* -inf */
    x[3] = 0x7f80;   /* +inf first */
    ck_assert_int_eq(hs_fp8_quantize_row_bf16(x, N, q, &scale, &bad), HS_ERR_INVALID);
    ck_assert_uint_eq(bad, 3);
}
END_TEST

START_TEST(fp8_rows_long_and_short_come_back_as_each_values_own_rounding)
{
    /* Rows of 1024 values and more are dequantised through a table of the
     * row's scale; shorter ones value by value: both give every code's
     * bf16(e4m3 * scale), at scales that make subnormal, huge and
     * infinite products. */
    enum { N = 4096 + 7 };
    uint8_t q[N];
    uint16_t out[N + 1];
    for (int i = 0; i < N; i++)
        q[i] = (uint8_t)(i * 7 + i / 256);
    const float scales[] = {1.0f, 0.002232f, 1e-38f, 3e36f, 7.3e-3f};
    for (size_t s = 0; s < sizeof scales / sizeof scales[0]; s++)
        for (int n = 1000; n <= N; n += N - 1000) {
            memset(out, 0xab, sizeof out);
            hs_fp8_dequantize_row_bf16(q, (uint64_t)n, scales[s], out);
            for (int i = 0; i < n; i++)
                ck_assert_msg(out[i] == hs_f32_to_bf16(hs_fp8_to_f32(q[i]) * scales[s]),
                              "n=%d scale %g: value %d (code 0x%02x) gave 0x%04x", n,
                              (double)scales[s], i, q[i], out[i]);
            ck_assert_uint_eq(out[n], 0xabab); /* nothing past the row */
        }
}
END_TEST

/* A sealed fp8 batch whose token `t` has scale `scale` (and, when code >= 0,
 * every code of that row set to `code`), sealed again: only the rows' meaning
 * is wrong, never the checksum. */
static hs_status_t fp8_verify_with(test_batch_t *b, const hs_layout_t *l8, uint32_t t, float scale,
                                   int code, char *reason, size_t reasoncap)
{
    uint64_t row = hs_layout_row_elems(l8);
    float keep = b->v.scales[t];
    uint8_t *saved = malloc(row);
    ck_assert_ptr_nonnull(saved);
    memcpy(saved, b->v.hidden_fp8 + t * row, row);
    b->v.scales[t] = scale;
    if (code >= 0) memset(b->v.hidden_fp8 + t * row, code, row);
    hs_batch_seal(b->region, b->bytes);
    hs_status_t st = hs_batch_verify(b->region, b->bytes, 3, 41, 4, b->T, l8, reason, reasoncap);
    b->v.scales[t] = keep;
    memcpy(b->v.hidden_fp8 + t * row, saved, row);
    hs_batch_seal(b->region, b->bytes);
    free(saved);
    return st;
}

START_TEST(fp8_batches_with_scales_or_codes_that_mean_no_number_are_refused)
{
    hs_layout_t l8 = test_layout();
    l8.dtype = HS_DTYPE_FP8;
    uint32_t lens[] = {5, 1, 11, 2};
    test_batch_t b = make_batch(&l8, 4, lens);
    ck_assert_int_eq(hs_batch_verify(b.region, b.bytes, 3, 41, 4, b.T, &l8, why, sizeof why),
                     HS_OK);
    const float nan = hs_f32_from_bits(0x7fc00000u), inf = hs_f32_from_bits(0x7f800000u);
    struct {
        float scale;
        int code; /* -1: the row's own codes */
        const char *named;
    } bad[] = {
        {nan, -1, "not a finite positive number"},
        {hs_f32_from_bits(0xffc00000u), -1, "not a finite positive number"},
        {inf, -1, "not a finite positive number"},
        {-inf, -1, "not a finite positive number"},
        {-0.01f, -1, "not a finite positive number"},
        {-0.0f, 0, "not a finite positive number"},
        {0.0f, -1, "scale is 0 but the row holds non-zero codes"},
        {0.0f, 0x80 | 0x01, "scale is 0 but the row holds non-zero codes"},
        {1e36f, -1, "past bf16's range"},
        {1.0f, 0x7f, "a NaN"},
        {1.0f, 0xff, "a NaN"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        for (uint32_t t = 0; t < b.T; t += b.T - 1) {
            why[0] = 0;
            hs_status_t st =
                fp8_verify_with(&b, &l8, t, bad[i].scale, bad[i].code, why, sizeof why);
            ck_assert_msg(st == HS_ERR_FORMAT, "case %zu token %u: %s (%s)", i, t,
                          hs_status_str(st), why);
            ck_assert_msg(strstr(why, bad[i].named), "case %zu: %s", i, why);
            char token[32];
            snprintf(token, sizeof token, "token %u:", t);
            ck_assert_msg(strstr(why, token), "case %zu: %s", i, why);
        }
    }
    /* a NaN code anywhere in a row (each byte of a word, and the tail) */
    uint64_t row = hs_layout_row_elems(&l8);
    for (uint64_t at = 0; at < row; at += (at < 24 ? 1 : 37)) {
        uint8_t keep = b.v.hidden_fp8[row + at];
        b.v.hidden_fp8[row + at] = 0x7f;
        hs_batch_seal(b.region, b.bytes);
        ck_assert_int_eq(hs_batch_verify(b.region, b.bytes, 3, 41, 4, b.T, &l8, why, sizeof why),
                         HS_ERR_FORMAT);
        char named[64];
        snprintf(named, sizeof named, "token 1: fp8 value %llu is code 0x7f",
                 (unsigned long long)at);
        ck_assert_msg(strstr(why, named), "at %llu: %s", (unsigned long long)at, why);
        b.v.hidden_fp8[row + at] = keep;
    }
    hs_batch_seal(b.region, b.bytes);
    /* what is a number passes: +0 over zero codes, a tiny and the largest
     * scale a bf16 row can have, codes +-448 */
    ck_assert_int_eq(fp8_verify_with(&b, &l8, 2, 0.0f, 0, why, sizeof why), HS_OK);
    ck_assert_int_eq(fp8_verify_with(&b, &l8, 2, 0.0f, 0x80, why, sizeof why), HS_OK);
    ck_assert_int_eq(fp8_verify_with(&b, &l8, 2, 1e-38f, -1, why, sizeof why), HS_OK);
    ck_assert_int_eq(fp8_verify_with(&b, &l8, 2, 3.3895e38f / 448.0f, 0x7e, why, sizeof why),
                     HS_OK);
    ck_assert_int_eq(fp8_verify_with(&b, &l8, 2, 1.0f, 0xfe, why, sizeof why), HS_OK);
    /* every row a quantiser writes passes, the largest bf16 values included */
    uint16_t x[97];
    uint8_t q[97];
    float scale;
    uint64_t badi;
    for (int i = 0; i < 97; i++)
        x[i] = (uint16_t)(i & 1 ? 0x7f7fu : 0xff7fu);
    ck_assert_int_eq(hs_fp8_quantize_row_bf16(x, 97, q, &scale, &badi), HS_OK);
    ck_assert_int_eq(hs_fp8_row_check(q, 97, scale, why, sizeof why), HS_OK);
    memset(x, 0, sizeof x);
    ck_assert_int_eq(hs_fp8_quantize_row_bf16(x, 97, q, &scale, &badi), HS_OK);
    ck_assert_int_eq(hs_fp8_row_check(q, 97, scale, why, sizeof why), HS_OK);
    hs_aligned_free(b.region);
}
END_TEST

START_TEST(fp8_batches_hold_bytes_and_scales_and_check_every_value)
{
    hs_layout_t l = test_layout(), l8 = l;
    l8.dtype = HS_DTYPE_FP8;
    ck_assert_uint_ne(hs_layout_id(&l), hs_layout_id(&l8));
    uint32_t lens[] = {5, 1, 11, 2};
    test_batch_t a = make_batch(&l, 4, lens), b = make_batch(&l8, 4, lens);
    hs_batch_offsets_t o = hs_batch_offsets(4, b.T, &l8);
    ck_assert_uint_eq(o.scales % HS_BATCH_ALIGN, 0);
    ck_assert_uint_ge(o.scales - o.hidden, (uint64_t)b.T * l.n_layers * l.hidden_size);
    ck_assert_uint_ge(o.total - o.scales, 4ull * b.T);
    ck_assert_ptr_null(b.v.hidden);
    ck_assert_ptr_nonnull(b.v.hidden_fp8);
    ck_assert_int_eq(hs_batch_verify(b.region, b.bytes, 3, 41, 4, b.T, &l8, why, sizeof why),
                     HS_OK);
    ck_assert_int_eq(hs_batch_synth_check(&b.v, &l8, why, sizeof why), HS_OK);
    /* each token's row is the bf16 batch's row quantised */
    uint64_t row = (uint64_t)l.n_layers * l.hidden_size;
    uint8_t *q = malloc(row);
    for (uint32_t t = 0; t < b.T; t++) {
        float scale;
        uint64_t bad;
        ck_assert_int_eq(hs_fp8_quantize_row_bf16(a.v.hidden + t * row, row, q, &scale, &bad),
                         HS_OK);
        ck_assert(scale == b.v.scales[t]);
        ck_assert_int_eq(memcmp(q, b.v.hidden_fp8 + t * row, row), 0);
    }
    free(q);
    /* a flipped byte and a changed scale are each named */
    b.v.hidden_fp8[9 * row + 83 + 80] ^= 1;
    ck_assert_int_eq(hs_batch_synth_check(&b.v, &l8, why, sizeof why), HS_ERR_MISMATCH);
    ck_assert_ptr_nonnull(strstr(why, "sample 1014 layer 16 pos 3 channel 80: fp8"));
    b.v.hidden_fp8[9 * row + 83 + 80] ^= 1;
    b.v.scales[b.T - 1] *= 2;
    ck_assert_int_eq(hs_batch_synth_check(&b.v, &l8, why, sizeof why), HS_ERR_MISMATCH);
    ck_assert_ptr_nonnull(strstr(why, "sample 1021 pos 1: fp8 scale"));
    /* a bf16 ticket does not verify an fp8 batch */
    ck_assert_int_eq(hs_batch_verify(b.region, b.bytes, 3, 41, 4, b.T, &l, why, sizeof why),
                     HS_ERR_MISMATCH);
    /* the fused fill-and-seal gives the same batch */
    test_batch_t c = make_batch(&l8, 4, lens);
    memset(c.v.hidden_fp8, 0, (size_t)(o.total - o.hidden));
    hs_checksum_stream_t *cs = hs_checksum_stream_create();
    hs_batch_synth_fill_seal(&c.v, &l8, c.bytes, cs);
    hs_checksum_stream_destroy(cs);
    b.v.scales[b.T - 1] /= 2;
    ck_assert_int_eq(memcmp(b.region, c.region, b.bytes), 0);
    /* fp8 moves about half the bytes of bf16 for the same batch */
    hs_layout_t big = {.hidden_size = 4096,
                       .dtype = HS_DTYPE_BF16,
                       .n_layers = 3,
                       .layers = {2, 16, 29}},
                big8 = big;
    big8.dtype = HS_DTYPE_FP8;
    ck_assert_uint_le(hs_batch_bytes(64, 1024 * 64, &big8) * 100,
                      hs_batch_bytes(64, 1024 * 64, &big) * 51);
    hs_aligned_free(a.region);
    hs_aligned_free(b.region);
    hs_aligned_free(c.region);
}
END_TEST

START_TEST(synthetic_check_names_a_single_flipped_element)
{
    hs_layout_t l = test_layout();
    uint32_t lens[] = {5, 1, 11, 2};
    test_batch_t b = make_batch(&l, 4, lens);
    /* sequence 2 (sample 1014), its 4th token (pos 3), layer index 16, channel 80 */
    uint32_t t = 6 + 3, j = 1, c = 80;
    uint16_t *e = &b.v.hidden[(uint64_t)t * l.n_layers * l.hidden_size + j * l.hidden_size + c];
    uint16_t orig = *e;
    *e ^= 0x0001;
    ck_assert_int_eq(hs_batch_synth_check(&b.v, &l, why, sizeof why), HS_ERR_MISMATCH);
    char want[160];
    snprintf(want, sizeof want,
             "sample 1014 layer 16 pos 3 channel 80: got 0x%04x, expected 0x%04x",
             (unsigned)(orig ^ 1u), (unsigned)orig);
    ck_assert_str_eq(why, want);
    *e = orig;
    ck_assert_int_eq(hs_batch_synth_check(&b.v, &l, why, sizeof why), HS_OK);
    /* the very last element too */
    b.v.hidden[(uint64_t)b.T * l.n_layers * l.hidden_size - 1] ^= 0x8000;
    ck_assert_int_eq(hs_batch_synth_check(&b.v, &l, why, sizeof why), HS_ERR_MISMATCH);
    ck_assert_ptr_nonnull(strstr(why, "sample 1021 layer 29 pos 1 channel 82"));
    /* a view with broken cu_seqlens is refused, not walked */
    b.v.cu_seqlens[4] = 1 << 30;
    ck_assert_int_eq(hs_batch_synth_check(&b.v, &l, why, sizeof why), HS_ERR_FORMAT);
    hs_aligned_free(b.region);
}
END_TEST

/* The messages of every batch decode into the arena, again and again,
 * without touching the heap; what does not fit still decodes, from the heap,
 * and is counted. */
START_TEST(ticket_and_done_decode_into_an_arena_without_the_heap)
{
    hs_msg_arena_t arena;
    hs_msg_arena_init(&arena);
    uint8_t tbody[128], dbody[128];
    Hsflow__Ticket t = HSFLOW__TICKET__INIT;
    t.ticket_id = 9;
    t.epoch = 1;
    t.batch = 33;
    t.bytes = 64ull << 20;
    t.n_seqs = 3;
    t.n_tokens = 700;
    t.worker_hint = 0xffffffffu;
    t.slot_offset = 1ull << 33;
    size_t tlen = protobuf_c_message_pack(&t.base, tbody);
    Hsflow__Done d = HSFLOW__DONE__INIT;
    d.ticket_id = 9;
    d.epoch = 1;
    d.batch = 33;
    d.bytes = 64ull << 20;
    d.checksum = 0x0123456789abcdefull;
    d.compute_ns = 5;
    size_t dlen = protobuf_c_message_pack(&d.base, dbody);
    for (int i = 0; i < 1000; i++) {
        ProtobufCMessage *m;
        ck_assert_int_eq(
            hs_msg_unpack_in(&arena, HS_MSG_TICKET, tbody, (uint32_t)tlen, &m, why, sizeof(why)),
            HS_OK);
        ck_assert_uint_eq(((Hsflow__Ticket *)m)->slot_offset, 1ull << 33);
        ck_assert_uint_eq(((Hsflow__Ticket *)m)->n_tokens, 700);
        hs_msg_free_in(&arena, m);
        ck_assert_int_eq(
            hs_msg_unpack_in(&arena, HS_MSG_DONE, dbody, (uint32_t)dlen, &m, why, sizeof(why)),
            HS_OK);
        ck_assert_uint_eq(((Hsflow__Done *)m)->checksum, 0x0123456789abcdefull);
        hs_msg_free_in(&arena, m);
    }
    ck_assert_uint_eq(arena.heap_allocs, 0);
    ck_assert(!arena.live);

    /* a second message while the first is alive: from the heap, both intact */
    ProtobufCMessage *m1, *m2;
    ck_assert_int_eq(
        hs_msg_unpack_in(&arena, HS_MSG_TICKET, tbody, (uint32_t)tlen, &m1, why, sizeof(why)),
        HS_OK);
    ck_assert_int_eq(
        hs_msg_unpack_in(&arena, HS_MSG_DONE, dbody, (uint32_t)dlen, &m2, why, sizeof(why)), HS_OK);
    ck_assert_uint_eq(arena.heap_allocs, 1);
    ck_assert_uint_eq(((Hsflow__Ticket *)m1)->batch, 33);
    ck_assert_uint_eq(((Hsflow__Done *)m2)->batch, 33);
    hs_msg_free_in(&arena, m2);
    ck_assert(arena.live);
    hs_msg_free_in(&arena, m1);
    ck_assert(!arena.live);

    /* unknown fields larger than the arena: decoded from the heap as well */
    uint8_t big[3000];
    memcpy(big, dbody, dlen);
    size_t n = dlen;
    big[n++] = 15 << 3 | 2; /* field 15 (unknown), length-delimited */
    big[n++] = 0x80 | (2000 & 0x7f);
    big[n++] = 2000 >> 7;
    memset(big + n, 0x5a, 2000);
    n += 2000;
    hs_status_t st = hs_msg_unpack_in(&arena, HS_MSG_DONE, big, (uint32_t)n, &m1, why, sizeof(why));
    ck_assert_msg(st == HS_OK, "%s", why);
    ck_assert_uint_eq(((Hsflow__Done *)m1)->checksum, 0x0123456789abcdefull);
    ck_assert_uint_gt(arena.heap_allocs, 1);
    hs_msg_free_in(&arena, m1);
    ck_assert(!arena.live);

    /* a body that does not decode leaves the arena free */
    ck_assert_int_ne(
        hs_msg_unpack_in(&arena, HS_MSG_DONE, big, (uint32_t)dlen + 2, &m1, why, sizeof(why)),
        HS_OK);
    ck_assert(!arena.live);
    /* no arena: the heap, as hs_msg_unpack */
    ck_assert_int_eq(
        hs_msg_unpack_in(NULL, HS_MSG_DONE, dbody, (uint32_t)dlen, &m1, why, sizeof(why)), HS_OK);
    hs_msg_free_in(NULL, m1);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("proto");
    TCase *frames = tcase_create("frames");
    tcase_add_test(frames, every_message_type_round_trips_through_a_frame);
    tcase_add_test(frames, ticket_and_done_decode_into_an_arena_without_the_heap);
    tcase_add_test(frames, frame_with_bad_magic_is_rejected);
    tcase_add_test(frames, frame_with_another_protocol_version_is_a_mismatch);
    tcase_add_test(frames, frame_with_unknown_type_is_rejected);
    tcase_add_test(frames, oversized_body_len_is_rejected_from_the_header_alone);
    tcase_add_test(frames, flipped_body_byte_fails_the_crc);
    tcase_add_test(frames, truncated_body_fails_to_unpack);
    tcase_add_test(frames, field_number_zero_is_rejected);
    tcase_add_test(frames, pack_refuses_small_buffers_and_mistyped_messages);
    tcase_add_test(frames, error_frame_carries_code_and_bounded_text);
    suite_add_tcase(s, frames);

    TCase *valid = tcase_create("validation");
    tcase_add_test(valid, nonces_and_macs_of_the_wrong_size_are_rejected);
    tcase_add_test(valid, plan_pages_with_mismatched_or_bad_arrays_are_rejected);
    tcase_add_test(valid, ranks_claims_are_bounded_and_checked);
    tcase_add_test(valid, layouts_with_too_many_or_bad_layers_are_rejected);
    tcase_add_test(valid, strings_and_counts_are_bounded);
    tcase_add_test(valid, layout_message_conversion_checks_the_layout_id);
    suite_add_tcase(s, valid);

    TCase *auth = tcase_create("auth");
    tcase_add_test(auth, auth_proofs_verify_with_the_right_key_only);
    tcase_add_test(auth, secret_files_are_trimmed_and_must_be_long_enough);
    tcase_add_test(auth, secret_file_that_is_a_fifo_is_refused_without_waiting_for_a_writer);
    suite_add_tcase(s, auth);

    TCase *batch = tcase_create("batch");
    tcase_add_test(batch, batch_offsets_are_aligned_and_total_follows_the_formula);
    tcase_add_test(batch, verify_accepts_a_sealed_batch);
    tcase_add_test(batch, verify_rejects_each_wrong_header_field);
    tcase_add_test(batch, verify_rejects_bad_cu_seqlens);
    tcase_add_test(batch, flipped_byte_anywhere_in_the_body_fails_the_checksum);
    tcase_add_test(batch, layout_check_validates_ranges_and_ids_differ);
    tcase_add_test(batch, synthetic_values_are_finite_bf16_and_vary);
    tcase_add_test(batch, synthetic_fill_matches_the_formula_and_checks_clean);
    tcase_add_test(batch, synthetic_check_names_a_single_flipped_element);
    tcase_add_test(batch, fused_fill_and_seal_equals_fill_then_seal);
    tcase_add_test(batch, layout_spec_round_trips_and_malformed_specs_are_refused);
    tcase_add_test(batch, fp8_e4m3_rounds_to_nearest_even_and_saturates_like_its_definition);
    tcase_add_test(batch,
                   fp8_rows_scale_by_their_amax_refuse_non_finite_values_and_come_back_within_e4m3);
    tcase_add_test(batch, fp8_rows_long_and_short_come_back_as_each_values_own_rounding);
    tcase_add_test(batch, fp8_batches_hold_bytes_and_scales_and_check_every_value);
    tcase_add_test(batch, fp8_batches_with_scales_or_codes_that_mean_no_number_are_refused);
    suite_add_tcase(s, batch);

    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
