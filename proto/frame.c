/* SPDX-License-Identifier: Apache-2.0 */
/* frame.c - the 16-byte control frame header (DESIGN §3):
 *   magic u32 | version u16 | type u16 | body_len u32 | crc32c(body) u32
 * all little-endian. Decoding rejects a bad header before anyone allocates
 * for its body. */
#include "hs_proto.h"
#include "hs_checksum.h"
#include "hs_bytes.h"

#include <stdio.h>
#include <string.h>

const char *hs_msg_type_str(uint16_t type)
{
    static const char *names[] = {"?",     "HELLO", "AUTH", "WELCOME", "TICKET",    "DONE",
                                  "STATS", "ERROR", "BYE",  "PLAN",    "CHALLENGE", "RANKS"};
    return type <= HS_MSG_TYPE_MAX ? names[type] : "?";
}

void hs_frame_header_encode(uint8_t out[HS_FRAME_HEADER_BYTES], uint16_t type, const void *body,
                            uint32_t body_len)
{
    hs_le32_store(out, HS_FRAME_MAGIC);
    hs_le16_store(out + 4, HS_PROTO_VERSION);
    hs_le16_store(out + 6, type);
    hs_le32_store(out + 8, body_len);
    hs_le32_store(out + 12, hs_crc32c(0, body, body_len));
}

hs_status_t hs_frame_header_decode(const uint8_t in[HS_FRAME_HEADER_BYTES], uint32_t max_body,
                                   hs_frame_header_t *out, char *why, size_t whycap)
{
    hs_frame_header_t h = {hs_le32_load(in), hs_le16_load(in + 4), hs_le16_load(in + 6),
                           hs_le32_load(in + 8), hs_le32_load(in + 12)};
    if (h.magic != HS_FRAME_MAGIC) {
        snprintf(why, whycap,
                 "bad frame magic 0x%08x (expected 0x%08x): peer is not an hsflow peer", h.magic,
                 HS_FRAME_MAGIC);
        return HS_ERR_FORMAT;
    }
    if (h.version != HS_PROTO_VERSION) {
        snprintf(
            why, whycap,
            "protocol version %u, this side speaks %u: run the same hsflow release on both sides",
            h.version, HS_PROTO_VERSION);
        return HS_ERR_MISMATCH;
    }
    if (h.type == 0 || h.type > HS_MSG_TYPE_MAX) {
        snprintf(why, whycap, "unknown frame type %u", h.type);
        return HS_ERR_FORMAT;
    }
    if (h.body_len > max_body) {
        snprintf(why, whycap, "%s frame body of %u bytes exceeds the limit of %u",
                 hs_msg_type_str(h.type), h.body_len, max_body);
        return HS_ERR_FORMAT;
    }
    *out = h;
    return HS_OK;
}

hs_status_t hs_frame_body_check(const hs_frame_header_t *h, const void *body, char *why,
                                size_t whycap)
{
    uint32_t crc = hs_crc32c(0, body, h->body_len);
    if (crc != h->body_crc) {
        snprintf(why, whycap,
                 "%s frame body crc32c 0x%08x, header says 0x%08x: corrupted in transit",
                 hs_msg_type_str(h->type), crc, h->body_crc);
        return HS_ERR_CHECKSUM;
    }
    return HS_OK;
}
