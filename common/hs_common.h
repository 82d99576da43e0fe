/* SPDX-License-Identifier: Apache-2.0 */
/* hs_common.h - status codes, logging, clocks, checksums and small parsers
 * shared by every hsflow module.
 *
 * Ownership: nothing here allocates except hs_aligned_alloc(), whose memory
 * the caller frees with hs_aligned_free(). */
#ifndef HS_COMMON_H
#define HS_COMMON_H

#include <stddef.h>
#include <stdint.h>
#include <stdbool.h>
#include <stdio.h>

#include "hsflow.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- status ------------------------------------------------------------ */

/* hs_status_t and its values live in the public header, hsflow.h. */
const char *hs_status_str(hs_status_t status);

/* ---- logging ------------------------------------------------------------ */

/* Level from HS_LOG_LEVEL (error, warn, info, debug, trace; default info). */
typedef enum { HS_LOG_ERROR, HS_LOG_WARN, HS_LOG_INFO, HS_LOG_DEBUG, HS_LOG_TRACE } hs_log_level_t;

void hs_log_set_level(hs_log_level_t level);
hs_log_level_t hs_log_get_level(void);
/* Tag printed in front of every line, e.g. "consumer" or "producer[2]". */
void hs_log_set_tag(const char *tag);
void hs_log_write(hs_log_level_t level, const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

#define hs_log(level, ...)                                                                         \
    do {                                                                                           \
        if ((level) <= hs_log_get_level()) hs_log_write((level), __FILE__, __LINE__, __VA_ARGS__); \
    } while (0)
#define hs_error(...) hs_log(HS_LOG_ERROR, __VA_ARGS__)
#define hs_warn(...) hs_log(HS_LOG_WARN, __VA_ARGS__)
#define hs_info(...) hs_log(HS_LOG_INFO, __VA_ARGS__)
#define hs_debug(...) hs_log(HS_LOG_DEBUG, __VA_ARGS__)
#define hs_trace(...) hs_log(HS_LOG_TRACE, __VA_ARGS__)

/* ---- time ------------------------------------------------------------- */

uint64_t hs_now_ns(void); /* CLOCK_MONOTONIC */
double hs_now_s(void);

/* ---- recent windows of counters ----------------------------------------
 * The status lines show rates and shares over the last HS_WINDOW_SPAN_S
 * seconds beside the run's averages: a window keeps samples of up to
 * HS_WINDOW_VALUES counters (time-ordered, at least HS_WINDOW_EVERY_S
 * apart), and the figures over the window are (now - base) / (t_now -
 * t_base). Zero-initialised is empty. Not thread-safe: the caller locks. */
#define HS_WINDOW_SPAN_S 30.0
#define HS_WINDOW_EVERY_S 1.0
#define HS_WINDOW_VALUES 6
#define HS_WINDOW_SAMPLES 40 /* > HS_WINDOW_SPAN_S / HS_WINDOW_EVERY_S */
typedef struct {
    double t;
    double v[HS_WINDOW_VALUES];
} hs_window_sample_t;
typedef struct {
    hs_window_sample_t s[HS_WINDOW_SAMPLES];
    uint32_t head, n; /* oldest sample, count */
} hs_window_t;
/* Sets *base to the window's baseline for the counters `now`: the newest
 * sample at least HS_WINDOW_SPAN_S older than now, else the oldest; false
 * (base untouched) when no sample is older than now. Then records now as a
 * sample when the newest is HS_WINDOW_EVERY_S old or there is none. */
bool hs_window_take(hs_window_t *w, const hs_window_sample_t *now, hs_window_sample_t *base);

/* ---- checksums -------------------------------------------------------- */

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

/* ---- the plan hash ---------------------------------------------------- */

/* The plan hash a run is pinned by (--expect-plan) and every producer
 * proves: BLAKE2b of "HSPLAN02", the plan's basis (XXH3-64 of what defines
 * it: the dataset fingerprint, the planning flags and the samples of every
 * batch; hs_plan_basis()), n, then n_seqs[n] and n_tokens[n] as u32
 * little-endian, cut to 64 bits. A consumer, which has no dataset, checks
 * the batch shapes a producer sends (PLAN pages) or a store holds against
 * it: no other shapes give a pinned hash short of breaking BLAKE2b. */
uint64_t hs_plan_hash_of(uint64_t basis, uint32_t n, const uint32_t *n_seqs,
                         const uint32_t *n_tokens);

/* ---- deterministic shuffles ------------------------------------------- */

/* splitmix64 step: the project's one PRNG for plans and synthetic data. */
static inline uint64_t hs_splitmix64(uint64_t *state)
{
    uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
/* The batch order of `epoch`: a Fisher-Yates permutation of 0..n-1 seeded by
 * (seed, epoch). Producers and consumer call it to agree on the plan. */
void hs_permutation(uint64_t seed, uint32_t epoch, uint32_t n, uint32_t *out);

/* ---- little-endian bytes ---------------------------------------------- */

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

/* ---- memory ------------------------------------------------------------ */

void *hs_aligned_alloc(size_t alignment, size_t size); /* NULL on failure */
void hs_aligned_free(void *p);
static inline size_t hs_align_up(size_t x, size_t a) { return (x + a - 1) / a * a; }

/* ---- output files ------------------------------------------------------ */

/* A file written whole or not at all, never onto one of the program's inputs.
 * hs_outfile_open() creates a temporary file next to PATH (PATH.tmp.<pid>.<n>,
 * mode 0666 minus the umask, or the mode of the file it replaces);
 * hs_outfile_commit() flushes, fsyncs and renames it over PATH; a failed write
 * or a crash leaves PATH untouched. hs-forward, hs-data and the summaries use
 * it.
 *
 * hs_outfile_check(): HS_ERR_INVALID, logged naming both paths, when PATH is
 * the same file as one of inputs[0..n_inputs) (same device and inode, so a
 * symlink or hard link to an input counts), or lies directly inside an input
 * that is a folder, or is a folder itself. NULL or missing inputs are
 * skipped; a PATH that does not exist yet is fine. Call it before the work
 * that leads to the output, so a mistake costs nothing.
 *
 * Ownership: hs_outfile_open() sets *out only on success; the stream belongs
 * to the outfile (do not fclose it). commit and abort both free the outfile;
 * abort removes the temporary file and accepts NULL. */
typedef struct hs_outfile hs_outfile_t;
HS_MUST_CHECK hs_status_t hs_outfile_check(const char *path, const char *const *inputs,
                                           int n_inputs);
HS_MUST_CHECK hs_status_t hs_outfile_open(const char *path, const char *const *inputs, int n_inputs,
                                          hs_outfile_t **out);
FILE *hs_outfile_stream(hs_outfile_t *f);
HS_MUST_CHECK hs_status_t hs_outfile_commit(hs_outfile_t *f);
void hs_outfile_abort(hs_outfile_t *f);

/* ---- memory this process may take --------------------------------------- */

/* MemAvailable, and the tightest memory limit among this process's cgroup and
 * its parents (cgroup v2 memory.max, else v1 memory.limit_in_bytes) with that
 * cgroup's usage less its inactive page cache. Nothing here fails: a figure
 * that cannot be read is 0 (unknown / no limit). */
typedef struct {
    uint64_t mem_available; /* bytes, /proc/meminfo MemAvailable; 0 = unknown */
    uint64_t cgroup_limit;  /* bytes; 0 = no cgroup limit found */
    uint64_t cgroup_used;   /* bytes in use in that cgroup, less inactive page cache */
    char cgroup_file[512];  /* the file the limit was read from */
} hs_mem_limits_t;

/* The stand-in system hsflow_set_system_root() set, "" for the real one. */
const char *hs_sys_root(void);
/* Reads /proc and /sys/fs/cgroup under hs_sys_root(). */
void hs_mem_limits(hs_mem_limits_t *out);
/* The same under `root` ("" = the real system). */
void hs_mem_limits_at(const char *root, hs_mem_limits_t *out);
/* What may still be allocated: the smaller of MemAvailable and the cgroup's
 * limit minus its usage; UINT64_MAX when neither is known. */
uint64_t hs_mem_room(const hs_mem_limits_t *m);

/* The node's registry of host memory promised to caches (memclaim.c):
 * caches are mapped without reserving and fill later, so a consumer counts
 * what the node's other live consumers have claimed and not yet taken.
 * hs_mem_claim_open() takes the registry's lock and reads the other claims
 * (stale ones, of processes gone, are removed); hs_mem_claim_commit()
 * records this one and lets the next process in; the claim lasts until
 * hs_mem_claim_release() (NULL ok) or the process's end. A registry that
 * cannot be used is warned about and counts nothing; only HS_ERR_NOMEM
 * fails open. *out is the caller's to release. The folder is the one
 * hs_mem_claim_registry_set() named (hs-consumer: $HS_MEM_REGISTRY), else
 * dev/shm/hsflow-cache-<uid> under a stand-in system (hs_sys_root()), else
 * /dev/shm/hsflow-cache-<uid>, else $XDG_RUNTIME_DIR/hsflow-cache: one per
 * user (mode 0700, owned by this user, else not used), so only this user's
 * consumers count each other. Its lock is waited for at most 5 s. */
typedef struct hs_mem_claim hs_mem_claim_t;
/* The registry's folder; NULL or "" = the default above. Copied;
 * process-wide; before the first hs_mem_claim_open(). */
void hs_mem_claim_registry_set(const char *dir);
HS_MUST_CHECK hs_status_t hs_mem_claim_open(hs_mem_claim_t **out);
/* Bytes the other live claims still have to take (their size less their
 * process's resident memory). */
uint64_t hs_mem_claim_others(const hs_mem_claim_t *m);
/* The largest other claim, described (who, pid, sizes); "" with none.
 * *n_others: how many there are. Valid until release. */
const char *hs_mem_claim_others_text(const hs_mem_claim_t *m, unsigned *n_others);
/* Entries of the registry that are not claims of this user (a wrong name,
 * owner, type, size or content), skipped and counted. */
unsigned hs_mem_claim_skipped(const hs_mem_claim_t *m);
/* The registry's folder; "" when none is used (not found, or refused). */
const char *hs_mem_claim_dir(const hs_mem_claim_t *m);
/* Records `bytes` claimed by `who` (a line of text, e.g. the consumer's
 * rank and address) and releases the registry's lock. */
HS_MUST_CHECK hs_status_t hs_mem_claim_commit(hs_mem_claim_t *m, uint64_t bytes, const char *who);
void hs_mem_claim_release(hs_mem_claim_t *m);

/* ---- parsing (CLI, env) ------------------------------------------------- */

/* Parse an unsigned integer with an optional K, M, G or T suffix (powers of
 * 1024; "KiB"/"KB" spellings accepted too). */
HS_MUST_CHECK hs_status_t hs_parse_size(const char *s, uint64_t *out);
/* Parse a decimal u64 / i64 / double; the whole string must be consumed. */
HS_MUST_CHECK hs_status_t hs_parse_u64(const char *s, uint64_t *out);
HS_MUST_CHECK hs_status_t hs_parse_i64(const char *s, int64_t *out);
HS_MUST_CHECK hs_status_t hs_parse_double(const char *s, double *out);
/* Parse "1,9,17" into out[0..*n); fails if more than cap entries. */
HS_MUST_CHECK hs_status_t hs_parse_int_list(const char *s, int *out, int cap, int *n);
/* Split "host:port"; host copied into host[hostcap]. "[::1]:7000" works. */
HS_MUST_CHECK hs_status_t hs_parse_hostport(const char *s, char *host, size_t hostcap,
                                            uint16_t *port);

/* "0.1.0 (git f08d450)": the release and, when built from a checkout, its
 * git describe. Static. */
const char *hs_version_line(void);
/* "PROGRAM VERSION-LINE\nbuild: OPTIONS\n" to out, for --version. */
void hs_version_print(FILE *out, const char *program);
#ifdef __cplusplus
}
#endif
#endif /* HS_COMMON_H */
