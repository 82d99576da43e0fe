/* SPDX-License-Identifier: Apache-2.0 */
/* ucx_hello.c - packing and checking the UCX bootstrap records (layout in
 * ucx_hello_int.h). Nothing here needs UCX: the checks run before a single
 * byte from the peer reaches it. */
#include "ucx_hello_int.h"
#include "hs_bytes.h"

#include <stdio.h>
#include <string.h>

static const char *type_name(uint16_t type)
{
    switch (type) {
    case HS__UCX_BOOT_HELLO:
        return "HELLO";
    case HS__UCX_BOOT_CHALLENGE:
        return "CHALLENGE";
    case HS__UCX_BOOT_AUTH:
        return "AUTH";
    case HS__UCX_BOOT_ACCEPT:
        return "ACCEPT";
    case HS__UCX_BOOT_REFUSE:
        return "REFUSE";
    }
    return "?";
}

hs_status_t hs__ucx_boot_head_parse(const uint8_t head[HS__UCX_BOOT_HEAD], hs__ucx_boot_head_t *out,
                                    char *why, size_t whycap)
{
    uint32_t magic = hs_le32_load(head);
    uint32_t version = hs_le16_load(head + 4);
    uint16_t type = hs_le16_load(head + 6);
    uint32_t len = hs_le32_load(head + 8);
    if (magic != HS__UCX_BOOT_MAGIC) {
        snprintf(why, whycap,
                 "not an hsflow UCX bootstrap (magic 0x%08x): is the peer using --transport tcp?",
                 magic);
        return HS_ERR_FORMAT;
    }
    if (version != HS__UCX_BOOT_VERSION) {
        snprintf(why, whycap,
                 "UCX bootstrap version %u, this side speaks %u: run the same hsflow release on "
                 "both sides",
                 version, HS__UCX_BOOT_VERSION);
        return HS_ERR_MISMATCH;
    }
    uint32_t lo, hi;
    switch (type) {
    case HS__UCX_BOOT_HELLO:
    case HS__UCX_BOOT_CHALLENGE:
        lo = hi = HS__UCX_BOOT_NONCE_BODY;
        break;
    case HS__UCX_BOOT_AUTH:
    case HS__UCX_BOOT_ACCEPT:
        lo = HS__UCX_BOOT_MAC + 1;
        hi = HS__UCX_BOOT_MAC + HS__UCX_BOOT_ADDR_MAX;
        break;
    case HS__UCX_BOOT_REFUSE:
        lo = 4;
        hi = 4 + HS__UCX_BOOT_TEXT_MAX;
        break;
    default:
        snprintf(why, whycap, "unknown UCX bootstrap record type %u", type);
        return HS_ERR_FORMAT;
    }
    if (len < lo || len > hi) {
        snprintf(why, whycap, "UCX bootstrap %s record with a %u-byte body (%u to %u allowed)",
                 type_name(type), len, lo, hi);
        return HS_ERR_FORMAT;
    }
    out->type = type;
    out->body_len = len;
    return HS_OK;
}

hs_status_t hs__ucx_hello_parse(const uint8_t *buf, size_t len, hs__ucx_boot_msg_t *out, char *why,
                                size_t whycap)
{
    if (!buf || len < HS__UCX_BOOT_HEAD) {
        snprintf(why, whycap, "UCX bootstrap record of %zu bytes is shorter than its %u-byte head",
                 len, HS__UCX_BOOT_HEAD);
        return HS_ERR_FORMAT;
    }
    hs__ucx_boot_head_t h;
    hs_status_t st = hs__ucx_boot_head_parse(buf, &h, why, whycap);
    if (st != HS_OK) return st;
    if (len - HS__UCX_BOOT_HEAD != h.body_len) {
        snprintf(why, whycap, "UCX bootstrap %s record of %zu bytes whose head says %u body bytes",
                 type_name(h.type), len, h.body_len);
        return HS_ERR_FORMAT;
    }
    const uint8_t *b = buf + HS__UCX_BOOT_HEAD;
    hs__ucx_boot_msg_t m;
    memset(&m, 0, sizeof m);
    m.type = h.type;
    switch (h.type) {
    case HS__UCX_BOOT_HELLO:
    case HS__UCX_BOOT_CHALLENGE:
        m.flags = hs_le32_load(b);
        if (m.flags & ~HS__UCX_BOOT_FLAG_KEY) {
            snprintf(why, whycap, "UCX bootstrap %s with unknown flags 0x%x", type_name(h.type),
                     m.flags);
            return HS_ERR_FORMAT;
        }
        m.nonce = b + 4;
        break;
    case HS__UCX_BOOT_AUTH:
    case HS__UCX_BOOT_ACCEPT:
        m.mac = b;
        m.addr = b + HS__UCX_BOOT_MAC;
        m.addr_len = h.body_len - HS__UCX_BOOT_MAC;
        break;
    case HS__UCX_BOOT_REFUSE: {
        int32_t s = (int32_t)hs_le32_load(b);
        /* only an error the peer could mean; anything else reads as a
         * protocol error */
        m.status = s < 0 && s >= HS_ERR_BUSY ? (hs_status_t)s : HS_ERR_PROTO;
        size_t n = h.body_len - 4;
        for (size_t i = 0; i < n; i++) {
            uint8_t ch = b[4 + i];
            m.text[i] = ch >= 0x20 && ch < 0x7f ? (char)ch : '?';
        }
        m.text[n] = '\0';
        break;
    }
    }
    *out = m;
    return HS_OK;
}

void hs__ucx_boot_head_pack(uint8_t out[HS__UCX_BOOT_HEAD], uint16_t type, uint32_t body_len)
{
    hs_le32_store(out, HS__UCX_BOOT_MAGIC);
    hs_le16_store(out + 4, HS__UCX_BOOT_VERSION);
    hs_le16_store(out + 6, type);
    hs_le32_store(out + 8, body_len);
}

void hs__ucx_boot_pack_nonce(uint8_t out[HS__UCX_BOOT_HELLO_BYTES], uint16_t type, uint32_t flags,
                             const uint8_t nonce[HS__UCX_BOOT_NONCE])
{
    hs__ucx_boot_head_pack(out, type, HS__UCX_BOOT_NONCE_BODY);
    hs_le32_store(out + HS__UCX_BOOT_HEAD, flags);
    memcpy(out + HS__UCX_BOOT_HEAD + 4, nonce, HS__UCX_BOOT_NONCE);
}

size_t hs__ucx_boot_pack_refuse(uint8_t *buf, size_t cap, hs_status_t status, const char *text)
{
    size_t n = text ? strlen(text) : 0;
    if (n > HS__UCX_BOOT_TEXT_MAX) n = HS__UCX_BOOT_TEXT_MAX;
    size_t total = HS__UCX_BOOT_HEAD + 4 + n;
    if (cap < total) return 0;
    hs__ucx_boot_head_pack(buf, HS__UCX_BOOT_REFUSE, (uint32_t)(4 + n));
    hs_le32_store(buf + HS__UCX_BOOT_HEAD, (uint32_t)(int32_t)status);
    if (n) memcpy(buf + HS__UCX_BOOT_HEAD + 4, text, n);
    return total;
}
