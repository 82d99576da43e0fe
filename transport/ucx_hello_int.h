/* SPDX-License-Identifier: Apache-2.0 */
/* ucx_hello_int.h - the records of the UCX transport's bootstrap (ucx.c):
 * how they are laid out, packed and checked. Kept apart from ucx.c so that
 * they build without UCX and can be fuzzed.
 *
 * Every record, all integers little-endian:
 *
 *   magic u32 "HSUX" | version u16 | type u16 | body_len u32 | body
 *
 * (version 1 had addr_len where type and body_len are now: a version-1 peer
 * is told which version this side speaks and cut off). The exchange:
 *
 *   client HELLO     flags u32 | client nonce[32]              (36 bytes)
 *   server CHALLENGE flags u32 | server nonce[32]              (36 bytes)
 *   client AUTH      mac[32] | UCX worker address              (33..32+64 KiB)
 *   server ACCEPT    mac[32] | UCX worker address              (33..32+64 KiB)
 *   either REFUSE    status i32 | text, then the sender closes (4..4+255)
 *
 * flags bit 0 (HS__UCX_BOOT_FLAG_KEY): the sender holds a shared secret.
 * With a secret, the client's mac is hs_auth_producer_mac(key, server nonce,
 * client nonce, the client's whole HELLO record) and the server answers
 * ACCEPT with hs_auth_consumer_mac(key, client nonce, server nonce) only
 * after it checked the client's; without a secret both macs are zeros. */
#ifndef HS_UCX_HELLO_INT_H
#define HS_UCX_HELLO_INT_H

#include <stdint.h>
#include <stddef.h>

#include "hsflow.h"

#ifdef __cplusplus
extern "C" {
#endif

#define HS__UCX_BOOT_MAGIC 0x58555348u /* "HSUX" */
#define HS__UCX_BOOT_VERSION 2u
#define HS__UCX_BOOT_HEAD 12u
#define HS__UCX_BOOT_NONCE 32u
#define HS__UCX_BOOT_MAC 32u
#define HS__UCX_BOOT_ADDR_MAX (64u << 10)
#define HS__UCX_BOOT_TEXT_MAX 255u
#define HS__UCX_BOOT_FLAG_KEY 1u
/* HELLO and CHALLENGE: flags + nonce */
#define HS__UCX_BOOT_NONCE_BODY (4u + HS__UCX_BOOT_NONCE)
#define HS__UCX_BOOT_HELLO_BYTES (HS__UCX_BOOT_HEAD + HS__UCX_BOOT_NONCE_BODY)
/* the largest record: AUTH or ACCEPT with the largest address */
#define HS__UCX_BOOT_RECORD_MAX (HS__UCX_BOOT_HEAD + HS__UCX_BOOT_MAC + HS__UCX_BOOT_ADDR_MAX)

typedef enum {
    HS__UCX_BOOT_HELLO = 1,
    HS__UCX_BOOT_CHALLENGE = 2,
    HS__UCX_BOOT_AUTH = 3,
    HS__UCX_BOOT_ACCEPT = 4,
    HS__UCX_BOOT_REFUSE = 5,
} hs__ucx_boot_type_t;

typedef struct {
    uint16_t type;
    uint32_t body_len;
} hs__ucx_boot_head_t;

/* A checked record. The pointers point into the buffer given to
 * hs__ucx_hello_parse() and are valid as long as it is. */
typedef struct {
    uint16_t type;
    uint32_t flags;       /* HELLO, CHALLENGE */
    const uint8_t *nonce; /* HELLO, CHALLENGE: HS__UCX_BOOT_NONCE bytes */
    const uint8_t *mac;   /* AUTH, ACCEPT: HS__UCX_BOOT_MAC bytes */
    const uint8_t *addr;  /* AUTH, ACCEPT: addr_len bytes, 0 < addr_len <= ADDR_MAX */
    uint32_t addr_len;
    hs_status_t status;                   /* REFUSE: a negative hs_status_t */
    char text[HS__UCX_BOOT_TEXT_MAX + 1]; /* REFUSE: printable, NUL-terminated */
} hs__ucx_boot_msg_t;

/* Checks a record head: magic, version, a known type and a body length that
 * type allows (so the caller may allocate body_len bytes). HS_ERR_FORMAT for
 * anything malformed, HS_ERR_MISMATCH for another version; `why` says what
 * was wrong. *out set on success. */
HS_MUST_CHECK hs_status_t hs__ucx_boot_head_parse(const uint8_t head[HS__UCX_BOOT_HEAD],
                                                  hs__ucx_boot_head_t *out, char *why,
                                                  size_t whycap);
/* Checks one complete record, buf[0, len): the head as above and
 * len == HS__UCX_BOOT_HEAD + body_len, then the body by type. Any bytes are
 * safe to give. *out set on success. */
HS_MUST_CHECK hs_status_t hs__ucx_hello_parse(const uint8_t *buf, size_t len,
                                              hs__ucx_boot_msg_t *out, char *why, size_t whycap);

/* Writes a record head into out[HS__UCX_BOOT_HEAD]. */
void hs__ucx_boot_head_pack(uint8_t out[HS__UCX_BOOT_HEAD], uint16_t type, uint32_t body_len);
/* HELLO or CHALLENGE into out[HS__UCX_BOOT_HELLO_BYTES]. */
void hs__ucx_boot_pack_nonce(uint8_t out[HS__UCX_BOOT_HELLO_BYTES], uint16_t type, uint32_t flags,
                             const uint8_t nonce[HS__UCX_BOOT_NONCE]);
/* REFUSE with `text` (cut to HS__UCX_BOOT_TEXT_MAX bytes) into buf[cap];
 * returns its length (0 when cap is too small). */
size_t hs__ucx_boot_pack_refuse(uint8_t *buf, size_t cap, hs_status_t status, const char *text);

#ifdef __cplusplus
}
#endif
#endif /* HS_UCX_HELLO_INT_H */
