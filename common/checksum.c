/* SPDX-License-Identifier: Apache-2.0 */
/* checksum.c - CRC-32C for control frames and chunked XXH3-64 for payloads.
 *
 * CRC-32C: hardware crc32 instruction (SSE4.2) when present, else a
 * byte-wise table. Both give the standard Castagnoli value (crc32c("123456789")
 * = 0xe3069283). No Debian library packages CRC-32C, hence the 40 lines here. */
#include "hsflow.h"
#include "hs_checksum.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

static uint32_t crc_table[256];
static int crc_table_ready;

static void crc_table_init(void)
{
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++)
            c = (c >> 1) ^ (0x82F63B78u & (0u - (c & 1u)));
        crc_table[i] = c;
    }
    __atomic_store_n(&crc_table_ready, 1, __ATOMIC_RELEASE);
}

static uint32_t crc32c_soft(uint32_t crc, const uint8_t *p, size_t len)
{
    if (!__atomic_load_n(&crc_table_ready, __ATOMIC_ACQUIRE)) crc_table_init();
    while (len--)
        crc = crc_table[(crc ^ *p++) & 0xff] ^ (crc >> 8);
    return crc;
}

#if defined(__x86_64__)
__attribute__((target("sse4.2"))) static uint32_t crc32c_hw(uint32_t crc, const uint8_t *p,
                                                            size_t len)
{
    uint64_t c = crc;
    while (len >= 8) {
        uint64_t v;
        memcpy(&v, p, 8);
        c = __builtin_ia32_crc32di(c, v);
        p += 8;
        len -= 8;
    }
    uint32_t c32 = (uint32_t)c;
    while (len--)
        c32 = __builtin_ia32_crc32qi(c32, *p++);
    return c32;
}
#endif

uint32_t hs_crc32c(uint32_t crc, const void *data, size_t len)
{
    crc = ~crc;
#if defined(__x86_64__)
    if (__builtin_cpu_supports("sse4.2"))
        crc = crc32c_hw(crc, data, len);
    else
#endif
        crc = crc32c_soft(crc, data, len);
    return ~crc;
}

uint64_t hs_checksum64_chunk(const void *chunk, size_t len) { return XXH3_64bits(chunk, len); }

uint64_t hs_checksum64_combine(const uint64_t *chunk_hashes, size_t n_chunks)
{
    /* Hash of the little-endian array; x86 and the GPUs we target are LE. */
    return XXH3_64bits(chunk_hashes, n_chunks * sizeof(uint64_t));
}

uint64_t hs_checksum64(const void *data, size_t len)
{
    const uint8_t *p = data;
    uint64_t acc[64];
    size_t n = 0;
    XXH3_state_t *st = NULL;
    /* Stream the chunk hashes through a small buffer so any size works
     * without allocation in the common case. */
    for (size_t off = 0; off < len || (len == 0 && n == 0); off += HS_CHECKSUM_CHUNK) {
        size_t l = len - off < HS_CHECKSUM_CHUNK ? len - off : HS_CHECKSUM_CHUNK;
        if (n == 64) {
            if (!st) {
                st = XXH3_createState();
                if (!st) return 0;
                XXH3_64bits_reset(st);
            }
            XXH3_64bits_update(st, acc, sizeof(acc));
            n = 0;
        }
        acc[n++] = hs_checksum64_chunk(p + off, l);
        if (len == 0) break;
    }
    if (!st) return hs_checksum64_combine(acc, n);
    XXH3_64bits_update(st, acc, n * sizeof(uint64_t));
    uint64_t h = XXH3_64bits_digest(st);
    XXH3_freeState(st);
    return h;
}

struct chunk_job {
    const uint8_t *data;
    size_t len;
    uint64_t *hashes;
    size_t first, last; /* chunks [first, last) */
};

static void *hash_chunks(void *arg)
{
    struct chunk_job *j = arg;
    for (size_t c = j->first; c < j->last; c++) {
        size_t off = c * (size_t)HS_CHECKSUM_CHUNK;
        size_t l = j->len - off < HS_CHECKSUM_CHUNK ? j->len - off : HS_CHECKSUM_CHUNK;
        j->hashes[c] = hs_checksum64_chunk(j->data + off, l);
    }
    return NULL;
}

enum { PARALLEL_MAX_THREADS = 16 };

uint64_t hs_checksum64_parallel(const void *data, size_t len, int threads)
{
    size_t n_chunks = (len + HS_CHECKSUM_CHUNK - 1) / HS_CHECKSUM_CHUNK;
    if (threads < 1) threads = 1;
    if ((size_t)threads > n_chunks) threads = (int)n_chunks; /* n_chunks may be 0 */
    if (threads > PARALLEL_MAX_THREADS) threads = PARALLEL_MAX_THREADS;
    uint64_t *hashes = threads > 1 ? malloc(n_chunks * sizeof(uint64_t)) : NULL;
    if (!hashes) return hs_checksum64(data, len);
    struct chunk_job jobs[PARALLEL_MAX_THREADS];
    pthread_t tids[PARALLEL_MAX_THREADS];
    bool started[PARALLEL_MAX_THREADS] = {false};
    for (int i = 0; i < threads; i++) {
        jobs[i] = (struct chunk_job){data, len, hashes, n_chunks * (size_t)i / (size_t)threads,
                                     n_chunks * (size_t)(i + 1) / (size_t)threads};
        /* job 0 runs here; a thread that does not start runs here too */
        if (i > 0) started[i] = pthread_create(&tids[i], NULL, hash_chunks, &jobs[i]) == 0;
    }
    hash_chunks(&jobs[0]);
    for (int i = 1; i < threads; i++) {
        if (started[i])
            pthread_join(tids[i], NULL);
        else
            hash_chunks(&jobs[i]);
    }
    uint64_t h = hs_checksum64_combine(hashes, n_chunks);
    free(hashes);
    return h;
}

struct hs_checksum_stream {
    XXH3_state_t *chunk; /* the chunk being fed */
    XXH3_state_t *outer; /* over the finished chunks' hashes */
    size_t in_chunk;     /* bytes fed to `chunk` */
    uint64_t n_chunks;
};

hs_checksum_stream_t *hs_checksum_stream_create(void)
{
    hs_checksum_stream_t *s = calloc(1, sizeof(*s));
    if (!s) return NULL;
    s->chunk = XXH3_createState();
    s->outer = XXH3_createState();
    if (!s->chunk || !s->outer) {
        hs_checksum_stream_destroy(s);
        return NULL;
    }
    hs_checksum_stream_reset(s);
    return s;
}

void hs_checksum_stream_destroy(hs_checksum_stream_t *s)
{
    if (!s) return;
    XXH3_freeState(s->chunk);
    XXH3_freeState(s->outer);
    free(s);
}

void hs_checksum_stream_reset(hs_checksum_stream_t *s)
{
    XXH3_64bits_reset(s->chunk);
    XXH3_64bits_reset(s->outer);
    s->in_chunk = 0;
    s->n_chunks = 0;
}

static void stream_close_chunk(hs_checksum_stream_t *s)
{
    uint64_t h = XXH3_64bits_digest(s->chunk);
    XXH3_64bits_update(s->outer, &h, sizeof(h));
    XXH3_64bits_reset(s->chunk);
    s->in_chunk = 0;
    s->n_chunks++;
}

void hs_checksum_stream_update(hs_checksum_stream_t *s, const void *data, size_t len)
{
    const uint8_t *p = data;
    while (len) {
        size_t room = HS_CHECKSUM_CHUNK - s->in_chunk;
        size_t n = len < room ? len : room;
        XXH3_64bits_update(s->chunk, p, n);
        s->in_chunk += n;
        p += n;
        len -= n;
        if (s->in_chunk == HS_CHECKSUM_CHUNK) stream_close_chunk(s);
    }
}

uint64_t hs_checksum_stream_final(hs_checksum_stream_t *s)
{
    /* A partial last chunk, or the one (empty) chunk of an empty input. */
    if (s->in_chunk || s->n_chunks == 0) stream_close_chunk(s);
    return XXH3_64bits_digest(s->outer);
}
