/* SPDX-License-Identifier: Apache-2.0 */
/* fuzz_frame.c - the 16-byte control frame header and whole-frame decoding
 * (proto/frame.c, hs_msg_decode_frame).
 *
 * The input is a frame as a peer would send it. It is decoded three ways:
 * as is (bad magic, version, type, length or crc must be refused); with its
 * length and crc made consistent, so that the body reaches the message
 * decoder of the type the header names; and the header alone against a
 * small body limit. A frame that decodes must decode again, to the same
 * message, once packed. */
#include <stdlib.h>
#include <string.h>

#include "hs_proto.h"

static void decode_and_repack(const uint8_t *frame, size_t len)
{
    char why[512];
    uint16_t type;
    ProtobufCMessage *m = NULL;
    if (hs_msg_decode_frame(frame, len, &type, &m, why, sizeof why) != HS_OK) return;
    size_t cap = hs_msg_frame_size(m), got;
    uint8_t *again = malloc(cap);
    if (!again) abort();
    if (hs_msg_pack(type, m, again, cap, &got) != HS_OK || got != cap) abort();
    uint16_t type2;
    ProtobufCMessage *m2 = NULL;
    if (hs_msg_decode_frame(again, got, &type2, &m2, why, sizeof why) != HS_OK || type2 != type)
        abort(); /* a frame we accepted, packed by us, must be accepted */
    hs_msg_free(m2);
    free(again);
    hs_msg_free(m);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char why[512];
    decode_and_repack(data, size);
    if (size < HS_FRAME_HEADER_BYTES) return 0;

    hs_frame_header_t h;
    if (hs_frame_header_decode(data, HS_FRAME_MAX_BODY, &h, why, sizeof why) == HS_OK) {
        if (h.body_len <= size - HS_FRAME_HEADER_BYTES)
            if (hs_frame_body_check(&h, data + HS_FRAME_HEADER_BYTES, why, sizeof why) != HS_OK)
                return 0; /* refused with a reason: what most inputs get */
    }
    if (hs_frame_header_decode(data, 64, &h, why, sizeof why) != HS_OK)
        why[0] = 0; /* refused with a reason: what most inputs get */

    /* Length and crc consistent with the bytes that follow. */
    uint8_t *f = malloc(size);
    if (!f) abort();
    memcpy(f, data, size);
    uint32_t body_len = (uint32_t)(size - HS_FRAME_HEADER_BYTES);
    uint16_t type = (uint16_t)(f[6] | f[7] << 8);
    hs_frame_header_encode(f, type, f + HS_FRAME_HEADER_BYTES, body_len);
    memcpy(f, data, 8); /* keep the input's magic, version and type */
    decode_and_repack(f, size);
    free(f);
    return 0;
}
