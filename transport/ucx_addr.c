/* SPDX-License-Identifier: Apache-2.0 */
/* ucx_addr.c - checking and filtering a peer's UCX 1.13 worker address
 * (layout and reasons in ucx_addr_int.h). Nothing here needs UCX. */
#include "ucx_addr_int.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#define HDR_DEBUG_INFO 0x01u
#define HDR_WORKER_UUID 0x02u
#define HDR_CLIENT_ID 0x04u
#define HDR_AM_ONLY 0x08u
#define HDR_KNOWN (HDR_DEBUG_INFO | HDR_WORKER_UUID | HDR_CLIENT_ID | HDR_AM_ONLY)

#define FLAG_LAST 0x80u
#define IFACE_HAS_EP 0x40u
#define IFACE_LEN_MASK 0x3fu
#define DEV_NUM_PATHS 0x40u
#define DEV_SYS_DEVICE 0x20u
#define DEV_LEN_MASK 0x1fu
#define MD_EMPTY_DEV 0x80u
#define MD_MASK_V1 0x1fu
#define MD_MASK_V2 0x7fu
#define NULL_RESOURCE 0xffu

#define ATTR_V1_BYTES 16u /* overhead, bandwidth, lat_ovh (float) + prio_cap_flags */
#define ATTR_V2_BYTES 8u  /* 3 x fp8, prio, seg_size u16, flags u16 */

typedef struct {
    const uint8_t *b;
    size_t len, at;
    char *why;
    size_t whycap;
} walk_t;

static bool take(walk_t *w, size_t n, const char *what)
{
    if (n > w->len - w->at) {
        snprintf(w->why, w->whycap,
                 "UCX worker address of %zu bytes ends inside its %s (at byte %zu, %zu more "
                 "needed)",
                 w->len, what, w->at, n);
        return false;
    }
    w->at += n;
    return true;
}

/* A length or index byte under `mask`; in v2 the value `mask` itself means
 * the real value is in the next byte. */
static bool byte_extended(walk_t *w, unsigned version, unsigned mask, const char *what,
                          unsigned *out)
{
    if (!take(w, 1, what)) return false;
    unsigned v = w->b[w->at - 1] & mask;
    if (version == 2 && v == mask) {
        if (!take(w, 1, what)) return false;
        v = w->b[w->at - 1];
    }
    *out = v;
    return true;
}

static bool attr_ok(walk_t *w, unsigned version, size_t at)
{
    if (version != 1) return true;
    float f[3];
    memcpy(f, w->b + at, sizeof f);
    if (!isfinite(f[0]) || !isfinite(f[1]) || !isfinite(f[2]) || f[1] == 0.0f) {
        snprintf(w->why, w->whycap,
                 "UCX worker address with transport attributes that are not numbers (at byte %zu)",
                 at);
        return false;
    }
    return true;
}

hs_status_t hs__ucx_addr_parse(const uint8_t *buf, size_t len, hs__ucx_addr_t *out, char *why,
                               size_t whycap)
{
    walk_t w = {buf, buf ? len : 0, 0, why, whycap};
    if (len > UINT32_MAX) {
        snprintf(why, whycap, "UCX worker address of %zu bytes is too long", len);
        return HS_ERR_FORMAT;
    }
    if (!take(&w, 1, "header")) return HS_ERR_FORMAT;
    out->version = (buf[0] & 0x0fu) + 1u; /* UCP_OBJECT_VERSION_V1 is 0 */
    if (out->version == 1) {
        out->flags = buf[0] >> 4;
    } else if (out->version == 2) {
        if (buf[0] & 0xf0u) {
            snprintf(why, whycap, "UCX worker address v2 with unknown header bits 0x%02x", buf[0]);
            return HS_ERR_FORMAT;
        }
        if (!take(&w, 1, "header")) return HS_ERR_FORMAT;
        out->flags = buf[1];
    } else {
        snprintf(why, whycap,
                 "UCX worker address of version %u: UCX 1.13 packs versions 1 and 2 (a "
                 "different UCX release on the peer, or not a worker address)",
                 out->version);
        return HS_ERR_FORMAT;
    }
    if (out->flags & ~HDR_KNOWN) {
        snprintf(why, whycap, "UCX worker address with unknown header flags 0x%x", out->flags);
        return HS_ERR_FORMAT;
    }
    /* UCX unpacks the uuid of a v1 address whether or not the flag says */
    if ((out->version == 1 || (out->flags & HDR_WORKER_UUID)) && !take(&w, 8, "worker uuid"))
        return HS_ERR_FORMAT;
    if ((out->flags & HDR_CLIENT_ID) && !take(&w, 8, "client id")) return HS_ERR_FORMAT;
    if (out->flags & HDR_DEBUG_INFO) {
        if (!take(&w, 1, "worker name")) return HS_ERR_FORMAT;
        if (!take(&w, buf[w.at - 1], "worker name")) return HS_ERR_FORMAT;
    }
    out->header_end = (uint32_t)w.at;
    out->n_devices = out->n_entries = 0;
    if (w.at < w.len && buf[w.at] == NULL_RESOURCE) {
        w.at++; /* no device at all */
    } else {
        bool last_dev = false;
        while (!last_dev) {
            size_t dev_start = w.at;
            unsigned md, dev_len;
            if (w.at >= w.len) {
                take(&w, 1, "device list");
                return HS_ERR_FORMAT;
            }
            bool empty = (buf[w.at] & MD_EMPTY_DEV) != 0;
            if (!byte_extended(&w, out->version, out->version == 1 ? MD_MASK_V1 : MD_MASK_V2,
                               "memory domain index", &md))
                return HS_ERR_FORMAT;
            if (md >= HS__UCX_ADDR_MAX_MD) {
                snprintf(why, whycap,
                         "UCX worker address with memory domain index %u (UCX holds at most %u)",
                         md, HS__UCX_ADDR_MAX_MD);
                return HS_ERR_FORMAT;
            }
            size_t dev_len_at = w.at;
            if (w.at >= w.len) {
                take(&w, 1, "device address length");
                return HS_ERR_FORMAT;
            }
            unsigned dflags = buf[w.at] & ~DEV_LEN_MASK;
            last_dev = (dflags & FLAG_LAST) != 0;
            if (!byte_extended(&w, out->version, DEV_LEN_MASK, "device address length", &dev_len))
                return HS_ERR_FORMAT;
            if ((dflags & DEV_NUM_PATHS) && !take(&w, 1, "number of paths")) return HS_ERR_FORMAT;
            if ((dflags & DEV_SYS_DEVICE) && !take(&w, 1, "system device")) return HS_ERR_FORMAT;
            if (!take(&w, dev_len, "device address")) return HS_ERR_FORMAT;
            size_t dev_end = w.at;
            bool last_tl = empty;
            while (!last_tl) {
                if (out->n_entries >= HS__UCX_ADDR_MAX_ENTRIES) {
                    snprintf(why, whycap,
                             "UCX worker address with more than %u transport entries (UCX's "
                             "limit)",
                             HS__UCX_ADDR_MAX_ENTRIES);
                    return HS_ERR_FORMAT;
                }
                hs__ucx_addr_entry_t *e = &out->entries[out->n_entries];
                e->start = (uint32_t)w.at;
                if (!take(&w, 2, "transport name checksum")) return HS_ERR_FORMAT;
                memcpy(&e->tl_csum, buf + e->start, 2);
                size_t attr_at = w.at;
                if (!take(&w, out->version == 1 ? ATTR_V1_BYTES : ATTR_V2_BYTES,
                          "transport attributes"))
                    return HS_ERR_FORMAT;
                if (!attr_ok(&w, out->version, attr_at)) return HS_ERR_FORMAT;
                e->len_at = (uint32_t)w.at;
                if (w.at >= w.len) {
                    take(&w, 1, "interface address length");
                    return HS_ERR_FORMAT;
                }
                unsigned iflags = buf[w.at] & ~IFACE_LEN_MASK;
                last_tl = (iflags & FLAG_LAST) != 0;
                if (iflags & IFACE_HAS_EP) {
                    snprintf(why, whycap,
                             "UCX worker address with endpoint addresses (at byte %zu): a worker "
                             "address has none",
                             w.at);
                    return HS_ERR_FORMAT;
                }
                unsigned iface_len;
                if (!byte_extended(&w, out->version, IFACE_LEN_MASK, "interface address length",
                                   &iface_len) ||
                    !take(&w, iface_len, "interface address"))
                    return HS_ERR_FORMAT;
                e->end = (uint32_t)w.at;
                e->md_index = (uint8_t)md;
                e->dev_addr_len = (uint8_t)dev_len;
                e->iface_addr_len = (uint8_t)iface_len;
                e->device = out->n_devices;
                e->dev_start = (uint32_t)dev_start;
                e->dev_len_at = (uint32_t)dev_len_at;
                e->dev_end = (uint32_t)dev_end;
                out->n_entries++;
            }
            out->n_devices++;
        }
    }
    if (w.at != w.len) {
        snprintf(why, whycap,
                 "UCX worker address of %zu bytes has %zu bytes after its last device (not an "
                 "address UCX 1.13 packed)",
                 w.len, w.len - w.at);
        return HS_ERR_FORMAT;
    }
    return HS_OK;
}

static bool entry_known(const hs__ucx_addr_entry_t *e, const hs__ucx_addr_t *mine)
{
    for (uint32_t i = 0; i < mine->n_entries; i++) {
        const hs__ucx_addr_entry_t *m = &mine->entries[i];
        if (m->tl_csum == e->tl_csum && m->dev_addr_len == e->dev_addr_len &&
            m->iface_addr_len == e->iface_addr_len)
            return true;
    }
    return false;
}

hs_status_t hs__ucx_addr_filter(const uint8_t *peer, size_t len, const hs__ucx_addr_t *mine,
                                uint8_t *out, size_t *out_len, char *why, size_t whycap)
{
    hs__ucx_addr_t a; /* about 5 KiB */
    hs_status_t st = hs__ucx_addr_parse(peer, len, &a, why, whycap);
    if (st != HS_OK) return st;
    size_t n = a.header_end;
    memcpy(out, peer, n);
    size_t last_dev_len_at = 0, kept = 0;
    for (uint32_t i = 0; i < a.n_entries;) {
        uint32_t dev = a.entries[i].device;
        size_t last_len_at = 0;
        bool dev_written = false;
        for (; i < a.n_entries && a.entries[i].device == dev; i++) {
            const hs__ucx_addr_entry_t *e = &a.entries[i];
            if (!entry_known(e, mine)) continue;
            if (!dev_written) {
                size_t dn = e->dev_end - e->dev_start;
                memcpy(out + n, peer + e->dev_start, dn);
                last_dev_len_at = n + (e->dev_len_at - e->dev_start);
                out[last_dev_len_at] &= (uint8_t)~FLAG_LAST;
                n += dn;
                dev_written = true;
            }
            size_t en = e->end - e->start;
            memcpy(out + n, peer + e->start, en);
            last_len_at = n + (e->len_at - e->start);
            out[last_len_at] &= (uint8_t)~FLAG_LAST;
            n += en;
            kept++;
        }
        if (dev_written) out[last_len_at] |= FLAG_LAST;
    }
    if (kept == 0) {
        snprintf(why, whycap,
                 "none of the %u transports in the peer's UCX worker address is one this side "
                 "has (check UCX_TLS and UCX_NET_DEVICES on both sides)",
                 a.n_entries);
        return HS_ERR_UNSUPPORTED;
    }
    out[last_dev_len_at] |= FLAG_LAST;
    *out_len = n;
    return HS_OK;
}
