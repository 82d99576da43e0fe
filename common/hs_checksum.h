/* SPDX-License-Identifier: Apache-2.0 */
/* hs_checksum.h - CRC-32C of control frames and the chunked XXH3-64
 * checksum of payloads.
 *
 * Ownership: a checksum stream is created and destroyed by its caller
 * (hs_checksum_stream_create/destroy); the other functions only read. */
#ifndef HS_CHECKSUM_H
#define HS_CHECKSUM_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* CRC-32C (Castagnoli), used for control frame bodies. `crc` is the running
 * value (start with 0). SSE4.2 when the CPU has it. */
uint32_t hs_crc32c(uint32_t crc, const void *data, size_t len);

/* Payload checksum: XXH3-64 of each HS_CHECKSUM_CHUNK-byte chunk, then
 * XXH3-64 of the array of chunk hashes (little-endian u64). Chunking lets a
 * GPU or several threads compute it in parallel with the same result. */
#define HS_CHECKSUM_CHUNK (1u << 20)
uint64_t hs_checksum64(const void *data, size_t len);
/* The same value, the chunks hashed by up to `threads` threads (1 or less:
 * this thread alone, as does any failure to start one). For the sealing
 * of whole batches, hundreds of MB, where one thread's ~6 GB/s would hold
 * up the caller. */
uint64_t hs_checksum64_parallel(const void *data, size_t len, int threads);
/* Parts of the same computation, for callers that split the work. */
uint64_t hs_checksum64_chunk(const void *chunk, size_t len);
uint64_t hs_checksum64_combine(const uint64_t *chunk_hashes, size_t n_chunks);

/* The same checksum computed incrementally, for data hashed as it is written
 * or received (still hot in cache). Feed the bytes in order, any split. */
typedef struct hs_checksum_stream hs_checksum_stream_t;
hs_checksum_stream_t *hs_checksum_stream_create(void);    /* NULL on failure */
void hs_checksum_stream_destroy(hs_checksum_stream_t *s); /* NULL ok */
void hs_checksum_stream_reset(hs_checksum_stream_t *s);
void hs_checksum_stream_update(hs_checksum_stream_t *s, const void *data, size_t len);
/* == hs_checksum64() of everything fed since the reset. */
uint64_t hs_checksum_stream_final(hs_checksum_stream_t *s);

#ifdef __cplusplus
}
#endif

#endif /* HS_CHECKSUM_H */
