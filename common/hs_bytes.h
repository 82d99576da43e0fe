/* SPDX-License-Identifier: Apache-2.0 */
/* hs_bytes.h - little-endian loads and stores at any alignment. */
#ifndef HS_BYTES_H
#define HS_BYTES_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Loads and stores of unsigned integers at any alignment, least significant
 * byte first, whatever the host's byte order: every on-disk and on-wire
 * integer of the project goes through these. */
static inline uint16_t hs_le16_load(const void *p)
{
    const uint8_t *b = (const uint8_t *)p;
    return (uint16_t)(b[0] | b[1] << 8);
}
static inline uint32_t hs_le32_load(const void *p)
{
    const uint8_t *b = (const uint8_t *)p;
    return (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24;
}
static inline uint64_t hs_le64_load(const void *p)
{
    const uint8_t *b = (const uint8_t *)p;
    return (uint64_t)hs_le32_load(b) | (uint64_t)hs_le32_load(b + 4) << 32;
}
static inline void hs_le16_store(void *p, uint16_t v)
{
    uint8_t *b = (uint8_t *)p;
    b[0] = (uint8_t)v;
    b[1] = (uint8_t)(v >> 8);
}
static inline void hs_le32_store(void *p, uint32_t v)
{
    uint8_t *b = (uint8_t *)p;
    for (int i = 0; i < 4; i++)
        b[i] = (uint8_t)(v >> (8 * i));
}
static inline void hs_le64_store(void *p, uint64_t v)
{
    uint8_t *b = (uint8_t *)p;
    hs_le32_store(b, (uint32_t)v);
    hs_le32_store(b + 4, (uint32_t)(v >> 32));
}

#ifdef __cplusplus
}
#endif

#endif /* HS_BYTES_H */
