/* SPDX-License-Identifier: Apache-2.0 */
/* fuzz_msg.c - every control message's decode and validation (proto/msg.c):
 * HELLO, AUTH, WELCOME, TICKET, DONE, STATS, ERROR, BYE, PLAN, CHALLENGE.
 *
 * Input: one byte choosing the message type (its value modulo 12, so that
 * 0 and 11, which name no message, are tried too), then the protobuf body.
 * A body that unpacks and validates must survive a pack/unpack round trip
 * byte for byte, and the fields the consumer and producer read next
 * (the layout of a HELLO, the texts of ERROR and BYE) are read here too. */
#include <stdlib.h>
#include <string.h>

#include "hs_proto.h"

static uint8_t *pack(uint16_t type, const ProtobufCMessage *m, size_t *len)
{
    size_t cap = hs_msg_frame_size(m);
    uint8_t *buf = malloc(cap);
    if (!buf) abort();
    /* A message that passed validation must be packable by us. */
    if (hs_msg_pack(type, m, buf, cap, len) != HS_OK || *len != cap) abort();
    return buf;
}

static void use(uint16_t type, const ProtobufCMessage *m)
{
    char why[512], text[600];
    uint8_t frame[HS_MSG_TEXT_MAX + 64];
    size_t n;
    switch (type) {
    case HS_MSG_HELLO: {
        const Hsflow__Hello *h = (const Hsflow__Hello *)m;
        hs_layout_t l;
        if (hs_layout_from_msg(h->layout, &l, why, sizeof why) == HS_OK) {
            hs_layout_describe(&l, text, sizeof text);
            (void)hs_layout_token_bytes(&l);
            (void)hs_batch_bytes(1, 1, &l);
        }
        break;
    }
    case HS_MSG_ERROR: {
        const Hsflow__Error *e = (const Hsflow__Error *)m;
        if (hs_msg_error_frame(e->code, e->text, frame, sizeof frame, &n) != HS_OK) abort();
        break;
    }
    case HS_MSG_BYE: {
        const Hsflow__Bye *b = (const Hsflow__Bye *)m;
        if (hs_msg_error_frame(HS_ERR_PROTO, b->reason, frame, sizeof frame, &n) != HS_OK) abort();
        break;
    }
    default:
        break;
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1) return 0;
    uint16_t type = (uint16_t)(data[0] % (HS_MSG_TYPE_MAX + 2));
    const uint8_t *body = data + 1;
    uint32_t len = (uint32_t)(size - 1);
    char why[512];
    ProtobufCMessage *m = NULL;
    if (hs_msg_unpack(type, body, len, &m, why, sizeof why) != HS_OK) return 0;
    if (hs_msg_validate(type, m, why, sizeof why) != HS_OK) abort();
    use(type, m);

    size_t n1, n2;
    uint8_t *f1 = pack(type, m, &n1);
    uint16_t t2;
    ProtobufCMessage *m2 = NULL;
    if (hs_msg_decode_frame(f1, n1, &t2, &m2, why, sizeof why) != HS_OK || t2 != type) abort();
    uint8_t *f2 = pack(type, m2, &n2);
    if (n1 != n2 || memcmp(f1, f2, n1) != 0) abort(); /* packing is canonical */
    free(f1);
    free(f2);
    hs_msg_free(m2);
    hs_msg_free(m);
    return 0;
}
