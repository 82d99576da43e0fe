/* SPDX-License-Identifier: Apache-2.0 */
/* ucx_addr_int.h - checking a peer's UCX worker address before UCX sees it.
 * Kept apart from ucx.c so that it builds without UCX and can be fuzzed.
 *
 * UCX 1.13 trusts a worker address completely: ucp_ep_create() reads it
 * without a length, asserts on an unknown version (random bytes abort the
 * process) and hands each transport its device and interface addresses at
 * the lengths the address claims. So a peer's address is first walked here
 * in the layout UCX 1.13's src/ucp/wireup/address.c packs (non-unified mode,
 * address versions 1 and 2), every length and count checked against the
 * buffer, and refused unless the walk ends exactly at its last byte; then
 * only the entries that this process's own address also has (same transport
 * name checksum, same device and interface address lengths) are kept, in a
 * copy rebuilt in the same layout, so that every transport reads an address
 * of the size it packs itself.
 *
 * The layout (v1 | v2; lengths in bytes):
 *   header     1: version (low 4 bits, 0) | flags (high 4 bits)
 *            | 2: version (1), flags
 *   uuid       8, v1 always (UCX unpacks it there), v2 with flag bit 1
 *   client id  8, with flag bit 2
 *   name       1 + n, with flag bit 0 (debug info)
 *   devices until one has the LAST bit, or the single byte 0xff (none):
 *     md         1: 0x80 empty device | index (v1 5 bits, v2 7 bits: 127
 *                   means the index is in the next byte)
 *     dev len    1: 0x80 last | 0x40 paths follow | 0x20 sys device
 *                   follows | length (5 bits; v2: 31 = in the next byte)
 *     paths 1, sys device 1, device address
 *     transports (none when empty) until one has the LAST bit:
 *       tl name checksum 2, attributes (v1 16, v2 8),
 *       iface len 1: 0x80 last | 0x40 endpoint addresses follow | length
 *                    (6 bits; v2: 63 = in the next byte), iface address
 * A worker address never carries endpoint addresses (UCX packs them only
 * for an endpoint): one that claims to is refused. */
#ifndef HS_UCX_ADDR_INT_H
#define HS_UCX_ADDR_INT_H

#include <stdint.h>
#include <stddef.h>

#include "hsflow.h"

#ifdef __cplusplus
extern "C" {
#endif

/* UCP_MAX_RESOURCES in UCX 1.13: the most transport entries UCX unpacks */
#define HS__UCX_ADDR_MAX_ENTRIES 128u
/* md indices UCX 1.13 can hold in its 64-bit md maps */
#define HS__UCX_ADDR_MAX_MD 64u
/* bytes of zeros after an address handed to UCX (see hs__ucx_addr_filter) */
#define HS__UCX_ADDR_PAD 256u

/* One transport entry of a parsed address; offsets into the buffer. */
typedef struct {
    uint16_t tl_csum; /* as packed (host order of the packer) */
    uint8_t md_index;
    uint8_t dev_addr_len;
    uint8_t iface_addr_len;
    uint32_t device;     /* index of its device in the address */
    uint32_t dev_start;  /* the device's md byte */
    uint32_t dev_len_at; /* the device's length byte (LAST flag) */
    uint32_t dev_end;    /* end of the device address */
    uint32_t start;      /* the tl name checksum */
    uint32_t len_at;     /* the iface length byte (LAST flag) */
    uint32_t end;        /* end of the iface address */
} hs__ucx_addr_entry_t;

typedef struct {
    unsigned version;    /* 1 or 2 (UCX's address versions) */
    unsigned flags;      /* header flags */
    uint32_t header_end; /* offset of the first device */
    uint32_t n_devices;
    uint32_t n_entries;
    hs__ucx_addr_entry_t entries[HS__UCX_ADDR_MAX_ENTRIES];
} hs__ucx_addr_t;

/* Walks buf[0, len) as a UCX 1.13 worker address (layout above). HS_OK when
 * every length and count stays inside the buffer and the walk ends at its
 * last byte; else HS_ERR_FORMAT with `why` saying what was wrong. Any bytes
 * are safe to give. *out set on success. */
HS_MUST_CHECK hs_status_t hs__ucx_addr_parse(const uint8_t *buf, size_t len, hs__ucx_addr_t *out,
                                             char *why, size_t whycap);

/* Parses `peer` and writes to out[0, *out_len) the same address with only
 * the entries `mine` (this process's own address, parsed) has too: the same
 * tl name checksum, device address length and iface address length. out
 * must hold len bytes (the result is never longer). HS_ERR_FORMAT for an
 * address that does not parse, HS_ERR_UNSUPPORTED when no entry is left (no
 * transport in common); `why` says which. */
HS_MUST_CHECK hs_status_t hs__ucx_addr_filter(const uint8_t *peer, size_t len,
                                              const hs__ucx_addr_t *mine, uint8_t *out,
                                              size_t *out_len, char *why, size_t whycap);

#ifdef __cplusplus
}
#endif
#endif /* HS_UCX_ADDR_INT_H */
