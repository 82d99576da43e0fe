/* SPDX-License-Identifier: Apache-2.0 */
/* store.c - the consumer's hidden-state store; see store_int.h. */
#include "store_int.h"
#include "hs_log.h"
#include "hs_checksum.h"
#include "hs_plan_hash.h"
#include "hs_outfile.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

_Static_assert(sizeof(hs_store_rec_t) == HS_STORE_REC_BYTES, "index record is 64 bytes");

#define PLAN_MAGIC 0x31505348u        /* "HSP1" */
#define STORE_VERSION 2               /* 1: before the plan hash covered the shapes */
#define MANIFEST_MAX_BYTES (1u << 20) /* store.json is a few hundred bytes */
#define SHARD_MAX 100000u             /* shard-NNNNN */
#define INDEX_RECS_PER_BATCH 4u       /* index_max_bytes() */
#define INDEX_RECS_SLACK 4096u

/* Where a stored batch lies. */
typedef struct {
    uint32_t shard; /* UINT32_MAX: not stored */
    uint64_t offset, bytes, checksum;
} store_loc_t;

typedef struct {
    uint32_t batch;
    uint64_t slot, bytes;
    bool released; /* the trainer is done with the slot: the writer frees it */
} store_job_t;

struct hs_store {
    char dir[1024];
    int dir_fd; /* the folder, opened once: every file is opened inside it */
    bool has_run, bound, writable;
    hs_store_run_t run;
    /* records read at open, kept until bind checks them against the plan */
    hs_store_rec_t *recs;
    size_t n_recs;
    uint64_t index_bytes; /* valid length of index.hsi */
    uint32_t next_shard;  /* this session writes shard-<next_shard> */
    uint64_t dropped;

    pthread_mutex_t lock;
    pthread_cond_t cond;
    store_loc_t *loc; /* [n_batches] after bind */
    uint8_t *queued;  /* [n_batches] a job for it is in the queue */
    store_job_t jobs[HS_STORE_QUEUE_MAX];
    uint32_t head, n_jobs;
    uint64_t queued_bytes, queue_cap;
    bool stopping, thread_running;
    bool halted; /* a write failed: nothing more is queued */
    pthread_t thread;
    const uint8_t *cache_base;
    hs_store_free_cb free_cb;
    void *free_arg;
    hs_store_stats_t st;

    int lock_fd; /* DIR/lock, flock()ed while the store is open; -1: none */

    /* the writer's own */
    int shard_fd, index_fd;
    uint64_t shard_end;
    uint64_t fault_enospc, fault_kill; /* tests: the Nth write fails / kills */
};

static void path_of(const hs_store_t *s, const char *name, char *out, size_t cap)
{
    snprintf(out, cap, "%s/%s", s->dir, name);
}

uint64_t hs_store_rec_seal(const hs_store_rec_t *r)
{
    return hs_checksum64(r, offsetof(hs_store_rec_t, seal));
}

const char *hs_store_dir(const hs_store_t *s) { return s->dir; }

const hs_store_run_t *hs_store_run(const hs_store_t *s) { return s->has_run ? &s->run : NULL; }

/* ---- opening a file of the store -------------------------------------------- */

/* A store's folder may be writable by others (a group's shared store), so
 * every file is opened inside the folder's descriptor, never through a
 * symbolic link (O_NOFOLLOW), without waiting on a FIFO or device
 * (O_NONBLOCK, cleared once the file is known to be regular), and only when
 * it is a regular file. One opened for writing must also have no other name
 * (a hard link), since it is truncated. Returns the descriptor, or -1 with
 * what is wrong in why ("" and errno ENOENT when the file is missing). */
static int store_file_open(const hs_store_t *s, const char *name, int flags, char *why,
                           size_t whycap)
{
    why[0] = 0;
    int fd = openat(s->dir_fd, name, flags | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0666);
    if (fd < 0) {
        int e = errno;
        if (e == ELOOP)
            snprintf(why, whycap, "it is a symbolic link, which a store never follows");
        else if (e == ENXIO)
            snprintf(why, whycap, "it is a FIFO or socket, not a regular file");
        else if (e != ENOENT)
            snprintf(why, whycap, "%s", strerror(e));
        errno = e;
        return -1;
    }
    struct stat sb;
    const char *bad = NULL;
    if (fstat(fd, &sb) != 0)
        bad = strerror(errno);
    else if (!S_ISREG(sb.st_mode))
        bad = S_ISDIR(sb.st_mode)    ? "it is a folder, not a regular file"
              : S_ISFIFO(sb.st_mode) ? "it is a FIFO, not a regular file"
                                     : "it is a device or socket, not a regular file";
    else if ((flags & O_ACCMODE) != O_RDONLY && sb.st_nlink > 1)
        bad = "it has another name (a hard link), so writing it would change that file too";
    else if (fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK) != 0)
        bad = strerror(errno);
    if (bad) {
        snprintf(why, whycap, "%s", bad);
        close(fd);
        errno = EINVAL;
        return -1;
    }
    return fd;
}

/* What a failed store_file_open() or store_file_slurp() (errno) makes of
 * the store: a link, FIFO, device or oversized file where a store file
 * belongs is no store of ours (HS_ERR_FORMAT); the rest is I/O. */
static hs_status_t store_file_status(int e)
{
    return e == ELOOP || e == ENXIO || e == EINVAL || e == EFBIG ? HS_ERR_FORMAT : HS_ERR_IO;
}

/* The whole of a small file of the store into a new buffer (NUL-terminated),
 * at most `max` bytes, refused by its size before anything is read. NULL
 * with the reason in why ("" when the file is missing). */
static char *store_file_slurp(const hs_store_t *s, const char *name, size_t max, size_t *len,
                              char *why, size_t whycap)
{
    int fd = store_file_open(s, name, O_RDONLY, why, whycap);
    if (fd < 0) return NULL;
    struct stat sb;
    char *buf = NULL;
    int e = 0;
    if (fstat(fd, &sb) != 0)
        e = errno;
    else if ((uint64_t)sb.st_size > max)
        e = EFBIG;
    else if (!(buf = malloc(max + 1)))
        e = ENOMEM;
    size_t n = 0;
    while (buf && n <= max) {
        ssize_t r = read(fd, buf + n, max + 1 - n);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) e = errno;
        if (r <= 0) break;
        n += (size_t)r;
    }
    close(fd);
    if (!e && n > max) e = EFBIG; /* it grew while being read */
    if (e) {
        if (e == EFBIG)
            snprintf(why, whycap, "it is %llu bytes or more, more than the %zu it can be",
                     (unsigned long long)(n > (uint64_t)sb.st_size ? n : (uint64_t)sb.st_size),
                     max);
        else
            snprintf(why, whycap, "%s", strerror(e));
        free(buf);
        errno = e;
        return NULL;
    }
    buf[n] = 0;
    *len = n;
    return buf;
}

/* ---- reading what is there ------------------------------------------------- */

static bool json_hex(const cJSON *o, const char *key, uint64_t *out)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!cJSON_IsString(v)) return false;
    const char *t = v->valuestring;
    size_t n = strlen(t);
    if (n == 0 || n > 16 || strspn(t, "0123456789abcdef") != n) return false;
    *out = strtoull(t, NULL, 16);
    return true;
}

static bool json_u32(const cJSON *o, const char *key, uint32_t lo, uint32_t hi, uint32_t *out)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!cJSON_IsNumber(v) || v->valuedouble < lo || v->valuedouble > hi ||
        v->valuedouble != (double)(uint32_t)v->valuedouble)
        return false;
    *out = (uint32_t)v->valuedouble;
    return true;
}

static hs_status_t read_manifest(hs_store_t *s)
{
    char path[1100], bad[160];
    path_of(s, "store.json", path, sizeof(path));
    size_t len;
    char *text = store_file_slurp(s, "store.json", MANIFEST_MAX_BYTES, &len, bad, sizeof bad);
    if (!text) {
        if (!bad[0]) return HS_OK; /* a new store */
        hs_status_t st = store_file_status(errno);
        hs_error("store %s: cannot read it: %s; give --store a folder of this run's store, or an "
                 "empty one",
                 path, bad);
        return st;
    }
    cJSON *root = cJSON_ParseWithLength(text, len);
    free(text);
    hs_store_run_t *r = &s->run;
    const cJSON *fmt = root ? cJSON_GetObjectItemCaseSensitive(root, "format") : NULL;
    const cJSON *layout = root ? cJSON_GetObjectItemCaseSensitive(root, "layout") : NULL;
    const cJSON *model = root ? cJSON_GetObjectItemCaseSensitive(root, "model") : NULL;
    uint32_t version = 0;
    char why[160] = "";
    if (root && json_u32(root, "version", 1, STORE_VERSION - 1, &version)) {
        cJSON_Delete(root);
        hs_error("store %s: version %u, written by an earlier hsflow whose plan hash did not "
                 "cover the batch shapes nor name the target: its states cannot be checked; "
                 "move the store away and give --store a new folder",
                 path, version);
        return HS_ERR_FORMAT;
    }
    bool ok = root && cJSON_IsString(fmt) && !strcmp(fmt->valuestring, "hsflow-store") &&
              json_u32(root, "version", STORE_VERSION, STORE_VERSION, &version) &&
              json_hex(root, "dataset_fingerprint", &r->dataset_fingerprint) &&
              json_hex(root, "plan_hash", &r->plan_hash) &&
              json_hex(root, "plan_basis", &r->plan_basis) && json_hex(root, "seed", &r->seed) &&
              json_hex(root, "target_fingerprint", &r->target_fingerprint) &&
              r->target_fingerprint != 0 &&
              json_u32(root, "n_batches", 1, HS_PLAN_MAX_BATCHES, &r->n_batches) &&
              json_u32(root, "token_budget", 1, UINT32_MAX, &r->token_budget) &&
              cJSON_IsString(layout) && cJSON_IsString(model) &&
              hs_layout_parse(layout->valuestring, &r->layout, why, sizeof(why)) == HS_OK;
    if (ok) snprintf(r->model, sizeof(r->model), "%s", model->valuestring);
    cJSON_Delete(root);
    if (!ok) {
        hs_error("store %s: not an hsflow store record%s%s (format, version 2, "
                 "dataset_fingerprint, plan_hash, plan_basis, seed, n_batches, token_budget, "
                 "layout, target_fingerprint, model); "
                 "give --store an empty folder or one an hsflow consumer wrote",
                 path, why[0] ? ": " : "", why);
        return HS_ERR_FORMAT;
    }
    /* the plan's shape */
    path_of(s, "plan.bin", path, sizeof(path));
    uint64_t want = 8 + 8ull * r->n_batches + 8;
    char *bin = store_file_slurp(s, "plan.bin", (size_t)want, &len, bad, sizeof bad);
    uint32_t head[2];
    uint64_t seal;
    if (!bin || len != want || (memcpy(head, bin, 8), head[0] != PLAN_MAGIC) ||
        head[1] != r->n_batches || (memcpy(&seal, bin + want - 8, 8), 0) ||
        seal != hs_checksum64(bin, (size_t)want - 8)) {
        hs_error(
            "store %s: %s%s; the store's plan is lost: move the store away and start a new one",
            path, !bin ? "cannot read it: " : "",
            !bin ? (bad[0] ? bad : "it is missing")
                 : "not the plan of store.json (its length, count or checksum is wrong)");
        free(bin);
        return HS_ERR_FORMAT;
    }
    r->n_seqs = malloc(4ull * r->n_batches);
    r->n_tokens = malloc(4ull * r->n_batches);
    if (!r->n_seqs || !r->n_tokens) {
        free(bin);
        return HS_ERR_NOMEM;
    }
    memcpy(r->n_seqs, bin + 8, 4ull * r->n_batches);
    memcpy(r->n_tokens, bin + 8 + 4ull * r->n_batches, 4ull * r->n_batches);
    free(bin);
    for (uint32_t b = 0; b < r->n_batches; b++)
        if (r->n_seqs[b] == 0 || r->n_tokens[b] < r->n_seqs[b] ||
            r->n_tokens[b] > r->token_budget) {
            hs_error("store %s: batch %u has %u sequences and %u tokens (budget %u): the plan is "
                     "damaged; move the store away and start a new one",
                     path, b, r->n_seqs[b], r->n_tokens[b], r->token_budget);
            return HS_ERR_FORMAT;
        }
    uint64_t got = hs_plan_hash_of(r->plan_basis, r->n_batches, r->n_seqs, r->n_tokens);
    if (got != r->plan_hash) {
        hs_error("store %s: its batch shapes hash to %016" PRIx64 ", not to the plan %016" PRIx64
                 " of store.json: the plan was not the run's (written by a producer that lied "
                 "about its shapes, or altered); move the store away and start a new one",
                 path, got, r->plan_hash);
        return HS_ERR_FORMAT;
    }
    s->has_run = true;
    return HS_OK;
}

/* Size of shard i, or -1 when it is missing. */
static int64_t shard_size(const hs_store_t *s, uint32_t i)
{
    char name[32];
    snprintf(name, sizeof(name), "shard-%05u.hsd", i);
    struct stat sb; /* a link or anything but a regular file holds nothing */
    return fstatat(s->dir_fd, name, &sb, AT_SYMLINK_NOFOLLOW) == 0 && S_ISREG(sb.st_mode)
               ? (int64_t)sb.st_size
               : -1;
}

/* The next shard number: one past every shard-NNNNN.hsd in the folder. */
static hs_status_t scan_shards(hs_store_t *s)
{
    DIR *d = opendir(s->dir);
    if (!d) {
        hs_error("store %s: cannot list it: %m", s->dir);
        return HS_ERR_IO;
    }
    struct dirent *e;
    while ((e = readdir(d))) {
        unsigned n;
        char tail[8];
        if (sscanf(e->d_name, "shard-%5u.%7s", &n, tail) == 2 && !strcmp(tail, "hsd") &&
            n + 1 > s->next_shard && n < SHARD_MAX)
            s->next_shard = n + 1;
    }
    closedir(d);
    return HS_OK;
}

/* The largest index.hsi a plan of n batches can need: a record per batch,
 * and as many again for batches written anew after a crash or a failed
 * check, plus room for small plans. A larger file is not an index of this
 * store and is not read into memory. */
static uint64_t index_max_bytes(uint32_t n_batches)
{
    return HS_STORE_REC_BYTES * (INDEX_RECS_PER_BATCH * (uint64_t)n_batches + INDEX_RECS_SLACK);
}

/* Reads index.hsi: records whose seal, magic and plan check and whose shard
 * holds all they name; the rest counted as dropped. A torn tail (a partial
 * record) is left out of index_bytes, so the writer cuts it off. */
static hs_status_t read_index(hs_store_t *s)
{
    char path[1100], bad[160];
    path_of(s, "index.hsi", path, sizeof(path));
    int fd = store_file_open(s, "index.hsi", O_RDONLY, bad, sizeof bad);
    if (fd < 0) {
        if (!bad[0]) return HS_OK;
        hs_status_t st = store_file_status(errno);
        hs_error("store %s: cannot read it: %s; move the store away and start a new one", path,
                 bad);
        return st;
    }
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        close(fd);
        return HS_ERR_IO;
    }
    uint64_t max = index_max_bytes(s->run.n_batches);
    if ((uint64_t)sb.st_size > max) {
        close(fd);
        hs_error("store %s: %llu bytes is more than the index of a plan of %u batches can be "
                 "(%llu); it is not this store's index and is not read: move the store away and "
                 "start a new one",
                 path, (unsigned long long)sb.st_size, s->run.n_batches, (unsigned long long)max);
        return HS_ERR_FORMAT;
    }
    uint64_t n = (uint64_t)sb.st_size / HS_STORE_REC_BYTES;
    if ((uint64_t)sb.st_size % HS_STORE_REC_BYTES) {
        hs_warn("store %s: its last record is cut short (%llu bytes; a crash while writing): "
                "it is dropped and that batch will be computed again",
                path, (unsigned long long)((uint64_t)sb.st_size % HS_STORE_REC_BYTES));
        s->dropped++;
    }
    s->recs = malloc((n ? n : 1) * sizeof(*s->recs));
    if (!s->recs) {
        close(fd);
        return HS_ERR_NOMEM;
    }
    uint64_t got = 0;
    while (got < n * HS_STORE_REC_BYTES) {
        ssize_t r = pread(fd, (uint8_t *)s->recs + got, n * HS_STORE_REC_BYTES - got, (off_t)got);
        if (r <= 0) {
            if (r < 0 && errno == EINTR) continue;
            hs_error("store %s: read failed: %m", path);
            close(fd);
            return HS_ERR_IO;
        }
        got += (uint64_t)r;
    }
    close(fd);
    s->n_recs = (size_t)n;
    s->index_bytes = n * HS_STORE_REC_BYTES;
    return HS_OK;
}

/* One consumer per store: an exclusive flock() on DIR/lock (opened inside
 * the folder, never through a link), held until close. Two writers would
 * each take shard 0 and rewrite the other's index. A folder this user
 * cannot write has no writer to fear: it is opened without the lock. */
static hs_status_t store_lock(hs_store_t *s)
{
    int dfd = s->dir_fd;
    int fd = openat(dfd, "lock", O_RDWR | O_CREAT | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0666);
    if (fd < 0 && (errno == EACCES || errno == EROFS))
        fd = openat(dfd, "lock", O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    int err = errno;
    if (fd < 0 && (err == EACCES || err == EROFS || err == ENOENT)) return HS_OK; /* read only */
    struct stat sb;
    if (fd < 0 || fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        errno = fd < 0 ? err : EINVAL;
        hs_error("store %s: its lock file cannot be opened as a regular file (%m); remove "
                 "%s/lock and start again",
                 s->dir, s->dir);
        if (fd >= 0) close(fd);
        return HS_ERR_IO;
    }
    if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
        char holder[32] = "";
        ssize_t n = pread(fd, holder, sizeof(holder) - 1, 0);
        holder[n > 0 ? n : 0] = 0;
        holder[strspn(holder, "0123456789")] = 0; /* a pid, or nothing */
        char who[48] = "";
        if (holder[0]) snprintf(who, sizeof(who), " (pid %s)", holder);
        hs_error("store %s is in use by another consumer%s: a store has one consumer at a time; "
                 "give each rank (each consumer) a --store of its own, such as %s-rank0, "
                 "%s-rank1, ..., or wait for that consumer to end",
                 s->dir, who, s->dir, s->dir);
        close(fd);
        return HS_ERR_BUSY;
    }
    char pid[24];
    int len = snprintf(pid, sizeof(pid), "%ld\n", (long)getpid());
    if (ftruncate(fd, 0) == 0) (void)!pwrite(fd, pid, (size_t)len, 0);
    s->lock_fd = fd;
    return HS_OK;
}

hs_status_t hs_store_open(const char *dir, hs_store_t **out)
{
    if (!dir || !dir[0] || strlen(dir) >= 1000) {
        hs_error("store: give --store a folder path of 1 to 999 bytes");
        return HS_ERR_INVALID;
    }
    if (mkdir(dir, 0777) != 0 && errno != EEXIST) {
        hs_error("store %s: cannot make the folder: %m; give --store a folder this user can "
                 "write",
                 dir);
        return HS_ERR_IO;
    }
    struct stat sb;
    if (stat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode)) {
        hs_error("store %s: not a folder; give --store a folder", dir);
        return HS_ERR_IO;
    }
    int dir_fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dir_fd < 0) {
        hs_error("store %s: cannot open the folder: %m; give --store a folder this user can read",
                 dir);
        return HS_ERR_IO;
    }
    hs_store_t *s = calloc(1, sizeof(*s));
    if (!s) {
        close(dir_fd);
        return HS_ERR_NOMEM;
    }
    snprintf(s->dir, sizeof(s->dir), "%s", dir);
    s->dir_fd = dir_fd;
    pthread_mutex_init(&s->lock, NULL);
    pthread_cond_init(&s->cond, NULL);
    s->shard_fd = s->index_fd = s->lock_fd = -1;
    hs_status_t st = store_lock(s);
    if (st == HS_OK) st = read_manifest(s);
    if (st == HS_OK) st = scan_shards(s);
    if (st == HS_OK && s->has_run) st = read_index(s);
    if (st != HS_OK) {
        hs_store_close(s);
        return st;
    }
    *out = s;
    return HS_OK;
}

/* ---- checking a run against the store ---------------------------------------- */

hs_status_t hs_store_check(const hs_store_t *s, uint64_t dataset_fingerprint,
                           const hs_layout_t *layout, uint64_t plan_hash, uint32_t n_batches,
                           uint64_t target_fingerprint, const char *model, char *why, size_t whycap)
{
    if (!s->has_run) return HS_OK;
    const hs_store_run_t *r = &s->run;
    size_t n = 0;
    why[0] = 0;
#define SAY(...)                                                                                   \
    do {                                                                                           \
        if (n < whycap) n += (size_t)snprintf(why + n, whycap - n, __VA_ARGS__);                   \
    } while (0)
    if (dataset_fingerprint && dataset_fingerprint != r->dataset_fingerprint)
        SAY("%sdataset fingerprint %016" PRIx64 ", the store holds %016" PRIx64, n ? "; " : "",
            dataset_fingerprint, r->dataset_fingerprint);
    if (hs_layout_id(layout) != hs_layout_id(&r->layout)) {
        char a[160], b[160];
        hs_layout_spec(layout, a, sizeof(a));
        hs_layout_spec(&r->layout, b, sizeof(b));
        SAY("%slayout %s, the store holds %s", n ? "; " : "", a, b);
    }
    if (plan_hash != r->plan_hash || n_batches != r->n_batches)
        SAY("%splan %016" PRIx64 " (%u batches), the store holds %016" PRIx64 " (%u batches)",
            n ? "; " : "", plan_hash, n_batches, r->plan_hash, r->n_batches);
    if (target_fingerprint != r->target_fingerprint)
        SAY("%starget %016" PRIx64 " ('%.100s'), the store holds the states of %016" PRIx64
            " ('%.100s')",
            n ? "; " : "", target_fingerprint, model ? model : "", r->target_fingerprint, r->model);
#undef SAY
    if (!n) return HS_OK;
    if (n < whycap)
        snprintf(why + n, whycap - n,
                 " (store %s): start it with that run's data, model and flags, or give "
                 "another --store",
                 s->dir);
    return HS_ERR_MISMATCH;
}

/* ---- bind ------------------------------------------------------------------- */

static hs_status_t write_plan(hs_store_t *s, const hs_store_run_t *r)
{
    char path[1100];
    path_of(s, "plan.bin", path, sizeof(path));
    uint64_t len = 8 + 8ull * r->n_batches;
    uint8_t *buf = malloc(len + 8);
    if (!buf) return HS_ERR_NOMEM;
    uint32_t head[2] = {PLAN_MAGIC, r->n_batches};
    memcpy(buf, head, 8);
    memcpy(buf + 8, r->n_seqs, 4ull * r->n_batches);
    memcpy(buf + 8 + 4ull * r->n_batches, r->n_tokens, 4ull * r->n_batches);
    uint64_t seal = hs_checksum64(buf, (size_t)len);
    memcpy(buf + len, &seal, 8);
    hs_outfile_t *f;
    hs_status_t st = hs_outfile_open(path, NULL, 0, &f);
    if (st == HS_OK) {
        if (fwrite(buf, 1, (size_t)len + 8, hs_outfile_stream(f)) != len + 8) {
            hs_outfile_abort(f);
            st = HS_ERR_IO;
        } else {
            st = hs_outfile_commit(f);
        }
    }
    free(buf);
    return st;
}

static hs_status_t write_manifest(hs_store_t *s, const hs_store_run_t *r)
{
    char path[1100], spec[160];
    path_of(s, "store.json", path, sizeof(path));
    hs_layout_spec(&r->layout, spec, sizeof(spec));
    cJSON *root = cJSON_CreateObject();
    char hex[5][20];
    snprintf(hex[0], sizeof(hex[0]), "%016" PRIx64, r->dataset_fingerprint);
    snprintf(hex[1], sizeof(hex[1]), "%016" PRIx64, r->plan_hash);
    snprintf(hex[2], sizeof(hex[2]), "%016" PRIx64, r->seed);
    snprintf(hex[3], sizeof(hex[3]), "%016" PRIx64, r->plan_basis);
    snprintf(hex[4], sizeof(hex[4]), "%016" PRIx64, r->target_fingerprint);
    bool ok = root && cJSON_AddStringToObject(root, "format", "hsflow-store") &&
              cJSON_AddNumberToObject(root, "version", STORE_VERSION) &&
              cJSON_AddStringToObject(root, "dataset_fingerprint", hex[0]) &&
              cJSON_AddStringToObject(root, "layout", spec) &&
              cJSON_AddStringToObject(root, "dtype", hs_dtype_str(r->layout.dtype)) &&
              cJSON_AddStringToObject(root, "plan_hash", hex[1]) &&
              cJSON_AddStringToObject(root, "plan_basis", hex[3]) &&
              cJSON_AddStringToObject(root, "seed", hex[2]) &&
              cJSON_AddNumberToObject(root, "n_batches", r->n_batches) &&
              cJSON_AddNumberToObject(root, "token_budget", r->token_budget) &&
              cJSON_AddStringToObject(root, "target_fingerprint", hex[4]) &&
              cJSON_AddStringToObject(root, "model", r->model);
    char *text = ok ? cJSON_Print(root) : NULL;
    cJSON_Delete(root);
    if (!text) return HS_ERR_NOMEM;
    hs_outfile_t *f;
    hs_status_t st = hs_outfile_open(path, NULL, 0, &f);
    if (st == HS_OK) {
        if (fprintf(hs_outfile_stream(f), "%s\n", text) < 0) {
            hs_outfile_abort(f);
            st = HS_ERR_IO;
        } else {
            st = hs_outfile_commit(f);
        }
    }
    cJSON_free(text);
    return st;
}

/* The records read at open against the bound plan: each that checks gives
 * its batch's location (a later record of a batch wins). */
static void index_apply(hs_store_t *s)
{
    const hs_store_run_t *r = &s->run;
    int64_t sizes_cache_shard = -2, size = -1;
    for (size_t i = 0; i < s->n_recs; i++) {
        const hs_store_rec_t *rec = &s->recs[i];
        bool ok = rec->magic == HS_STORE_REC_MAGIC && rec->seal == hs_store_rec_seal(rec) &&
                  rec->plan_hash == r->plan_hash && rec->batch < r->n_batches &&
                  rec->shard < SHARD_MAX && rec->offset % HS_STORE_ALIGN == 0 &&
                  rec->n_seqs == r->n_seqs[rec->batch] &&
                  rec->n_tokens == r->n_tokens[rec->batch] &&
                  rec->bytes == hs_batch_bytes(rec->n_seqs, rec->n_tokens, &r->layout);
        if (ok) {
            if ((int64_t)rec->shard != sizes_cache_shard) {
                sizes_cache_shard = rec->shard;
                size = shard_size(s, rec->shard);
            }
            ok = size >= 0 && rec->offset + rec->bytes <= (uint64_t)size;
        }
        if (!ok) {
            s->dropped++;
            continue;
        }
        store_loc_t *l = &s->loc[rec->batch];
        if (l->shard == UINT32_MAX) {
            s->st.batches++;
            s->st.bytes += rec->bytes;
        }
        *l = (store_loc_t){rec->shard, rec->offset, rec->bytes, rec->checksum};
    }
    free(s->recs);
    s->recs = NULL;
    s->n_recs = 0;
    s->st.dropped = s->dropped;
    if (s->dropped)
        hs_warn("store %s: %llu index record(s) dropped (cut short, sealed wrong, or naming bytes "
                "their shard lacks: a crash while writing); those batches are computed again",
                s->dir, (unsigned long long)s->dropped);
}

static void *writer_main(void *arg);

static char g_fault[64]; /* hs_store_fault_set(); "" = none */

void hs_store_fault_set(const char *spec)
{
    snprintf(g_fault, sizeof g_fault, "%s", spec ? spec : "");
}

/* The test hook of hs_store_fault_set(), "enospc=N" or "kill=N": the Nth
 * write of this session fails as with a full disk, or writes half its
 * region and kills the process. */
static void fault_parse(hs_store_t *s)
{
    const char *f = g_fault;
    unsigned long long n;
    if (!f[0]) return;
    if (sscanf(f, "enospc=%llu", &n) == 1)
        s->fault_enospc = n;
    else if (sscanf(f, "kill=%llu", &n) == 1)
        s->fault_kill = n;
    else
        hs_warn("store fault '%s' is not enospc=N or kill=N; ignored", f);
}

hs_status_t hs_store_bind(hs_store_t *s, const hs_store_run_t *run, const void *cache_base,
                          uint64_t queue_bytes, hs_store_free_cb free_cb, void *free_arg)
{
    if (s->bound) return HS_OK;
    if (!s->has_run) {
        hs_store_run_t *r = &s->run;
        *r = *run;
        r->n_seqs = malloc(4ull * run->n_batches);
        r->n_tokens = malloc(4ull * run->n_batches);
        if (!r->n_seqs || !r->n_tokens) return HS_ERR_NOMEM;
        memcpy(r->n_seqs, run->n_seqs, 4ull * run->n_batches);
        memcpy(r->n_tokens, run->n_tokens, 4ull * run->n_batches);
        s->has_run = true;
        s->writable = write_plan(s, r) == HS_OK && write_manifest(s, r) == HS_OK;
        if (!s->writable)
            hs_warn("store %s: cannot record the run in it (see above); the run goes on without "
                    "storing",
                    s->dir);
    } else {
        s->writable = true;
    }
    s->loc = malloc((size_t)s->run.n_batches * sizeof(*s->loc));
    s->queued = calloc(s->run.n_batches, 1);
    if (!s->loc || !s->queued) return HS_ERR_NOMEM;
    for (uint32_t b = 0; b < s->run.n_batches; b++)
        s->loc[b].shard = UINT32_MAX;
    index_apply(s);
    s->bound = true;
    s->cache_base = cache_base;
    s->queue_cap = queue_bytes;
    s->free_cb = free_cb;
    s->free_arg = free_arg;
    fault_parse(s);
    hs_info("store %s: %llu of %u batches stored (%.2f GB), %s, plan %016" PRIx64
            ", target %016" PRIx64 " (%s)%s",
            s->dir, (unsigned long long)s->st.batches, s->run.n_batches, (double)s->st.bytes / 1e9,
            hs_dtype_str(s->run.layout.dtype), s->run.plan_hash, s->run.target_fingerprint,
            s->run.model, s->writable ? "" : "; read only");
    if (!s->writable || s->st.batches == s->run.n_batches) {
        s->writable = s->writable && s->st.batches < s->run.n_batches;
        return HS_OK;
    }
    int e = pthread_create(&s->thread, NULL, writer_main, s);
    if (e != 0) {
        errno = e;
        hs_warn("store %s: cannot start its writer thread: %m; nothing more is stored", s->dir);
        s->writable = false;
        return HS_OK;
    }
    s->thread_running = true;
    return HS_OK;
}

/* ---- lookups ------------------------------------------------------------------ */

bool hs_store_has(const hs_store_t *s, uint32_t batch)
{
    hs_store_t *m = (hs_store_t *)s;
    if (!s->bound || batch >= s->run.n_batches) return false;
    pthread_mutex_lock(&m->lock);
    bool has = s->loc[batch].shard != UINT32_MAX;
    pthread_mutex_unlock(&m->lock);
    return has;
}

void hs_store_forget(hs_store_t *s, uint32_t batch)
{
    if (!s->bound || batch >= s->run.n_batches) return;
    pthread_mutex_lock(&s->lock);
    if (s->loc[batch].shard != UINT32_MAX) {
        s->st.batches--;
        s->st.bytes -= s->loc[batch].bytes;
        s->st.forgotten++;
        s->loc[batch].shard = UINT32_MAX;
    }
    pthread_mutex_unlock(&s->lock);
}

hs_status_t hs_store_read(hs_store_t *s, uint32_t batch, void *dst, uint64_t bytes, char *why,
                          size_t whycap)
{
    if (!s->bound || batch >= s->run.n_batches) return HS_ERR_NOT_FOUND;
    pthread_mutex_lock(&s->lock);
    store_loc_t l = s->loc[batch];
    pthread_mutex_unlock(&s->lock);
    if (l.shard == UINT32_MAX) return HS_ERR_NOT_FOUND;
    if (l.bytes != bytes) {
        snprintf(why, whycap,
                 "stored region of batch %u is %" PRIu64 " bytes, the plan says %" PRIu64, batch,
                 l.bytes, bytes);
        return HS_ERR_FORMAT;
    }
    char name[32], path[1100], bad[160];
    snprintf(name, sizeof(name), "shard-%05u.hsd", l.shard);
    path_of(s, name, path, sizeof(path));
    int fd = store_file_open(s, name, O_RDONLY, bad, sizeof bad);
    if (fd < 0) {
        snprintf(why, whycap, "cannot open %s: %s", path, bad[0] ? bad : strerror(errno));
        return HS_ERR_IO;
    }
    uint64_t got = 0;
    while (got < bytes) {
        ssize_t r = pread(fd, (uint8_t *)dst + got, bytes - got, (off_t)(l.offset + got));
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
            snprintf(why, whycap, "%s: read of batch %u at %" PRIu64 " failed: %s", path, batch,
                     l.offset + got, r < 0 ? strerror(errno) : "end of file");
            close(fd);
            return HS_ERR_IO;
        }
        got += (uint64_t)r;
    }
    close(fd);
    const hs_batch_header_t *h = dst;
    if (h->magic != HS_BATCH_MAGIC || h->index != batch || h->total_bytes != bytes ||
        h->checksum != l.checksum) {
        snprintf(why, whycap,
                 "%s at %" PRIu64 ": the region's header (batch %u, %" PRIu64
                 " bytes, checksum %016" PRIx64 ") is not the one the index recorded",
                 path, l.offset, h->index, h->total_bytes, h->checksum);
        return HS_ERR_FORMAT;
    }
    pthread_mutex_lock(&s->lock);
    s->st.reads++;
    s->st.read_bytes += bytes;
    pthread_mutex_unlock(&s->lock);
    return HS_OK;
}

void hs_store_stats(const hs_store_t *s, hs_store_stats_t *out)
{
    hs_store_t *m = (hs_store_t *)s;
    pthread_mutex_lock(&m->lock);
    *out = s->st;
    pthread_mutex_unlock(&m->lock);
}

/* ---- the writer ------------------------------------------------------------------ */

bool hs_store_submit(hs_store_t *s, uint32_t batch, uint64_t slot_offset, uint64_t bytes)
{
    if (!s->thread_running || batch >= s->run.n_batches) return false;
    bool queued = false;
    pthread_mutex_lock(&s->lock);
    if (!s->halted && !s->stopping && s->loc[batch].shard == UINT32_MAX && !s->queued[batch]) {
        if (s->n_jobs == HS_STORE_QUEUE_MAX ||
            (s->n_jobs && s->queued_bytes + bytes > s->queue_cap)) {
            s->st.skipped++;
        } else {
            s->jobs[(s->head + s->n_jobs++) % HS_STORE_QUEUE_MAX] =
                (store_job_t){batch, slot_offset, bytes, false};
            s->queued[batch] = 1;
            s->queued_bytes += bytes;
            queued = true;
            pthread_cond_signal(&s->cond);
        }
    }
    pthread_mutex_unlock(&s->lock);
    return queued;
}

bool hs_store_slot_release(hs_store_t *s, uint64_t slot_offset)
{
    if (!s->thread_running) return false;
    bool held = false;
    pthread_mutex_lock(&s->lock);
    for (uint32_t i = 0; i < s->n_jobs; i++) {
        store_job_t *j = &s->jobs[(s->head + i) % HS_STORE_QUEUE_MAX];
        if (j->slot == slot_offset && !j->released) {
            j->released = true;
            held = true;
            break;
        }
    }
    pthread_mutex_unlock(&s->lock);
    return held;
}

/* pwrite all of it; false with errno set. */
static bool write_all(int fd, const void *buf, uint64_t len, uint64_t off)
{
    uint64_t done = 0;
    while (done < len) {
        ssize_t w = pwrite(fd, (const uint8_t *)buf + done, len - done, (off_t)(off + done));
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) {
            if (w == 0) errno = EIO;
            return false;
        }
        done += (uint64_t)w;
    }
    return true;
}

/* Opens this session's shard and the index (cutting a torn tail off it). */
static bool writer_files(hs_store_t *s)
{
    char name[32], path[1100], bad[160] = "";
    if (s->next_shard >= SHARD_MAX) {
        hs_warn("store %s: %u shards already; nothing more is stored", s->dir, SHARD_MAX);
        return false;
    }
    snprintf(name, sizeof(name), "shard-%05u.hsd", s->next_shard);
    path_of(s, name, path, sizeof(path));
    /* truncated only once it is known to be a file of the store's own */
    s->shard_fd = store_file_open(s, name, O_WRONLY | O_CREAT, bad, sizeof bad);
    if (s->shard_fd >= 0 && ftruncate(s->shard_fd, 0) != 0) {
        snprintf(bad, sizeof bad, "%s", strerror(errno));
        close(s->shard_fd);
        s->shard_fd = -1;
    }
    if (s->shard_fd >= 0) {
        path_of(s, "index.hsi", path, sizeof(path));
        s->index_fd = store_file_open(s, "index.hsi", O_WRONLY | O_CREAT, bad, sizeof bad);
        if (s->index_fd >= 0 && ftruncate(s->index_fd, (off_t)s->index_bytes) != 0) {
            snprintf(bad, sizeof bad, "%s", strerror(errno));
            close(s->index_fd);
            s->index_fd = -1;
        }
    }
    if (s->shard_fd < 0 || s->index_fd < 0) {
        hs_warn("store %s: cannot open %s for writing: %s; nothing more is stored", s->dir, path,
                bad[0] ? bad : strerror(errno));
        return false;
    }
    s->shard_end = 0;
    return true;
}

/* Writes one region and its record. false when the store stops growing
 * (logged once: a full disk, or another write error). */
static bool writer_one(hs_store_t *s, const store_job_t *j)
{
    if ((s->shard_fd < 0 || s->shard_end + j->bytes > HS_STORE_SHARD_BYTES) && s->shard_fd >= 0) {
        close(s->shard_fd);
        s->shard_fd = -1;
        s->next_shard++;
    }
    if (s->shard_fd < 0 && !writer_files(s)) return false;
    const uint8_t *region = s->cache_base + j->slot;
    uint64_t pos = (s->shard_end + HS_STORE_ALIGN - 1) / HS_STORE_ALIGN * HS_STORE_ALIGN;
    uint64_t nth = s->st.writes + 1;
    bool ok;
    if (s->fault_kill && nth == s->fault_kill) {
        /* tests: a crash in the middle of a region */
        (void)!write_all(s->shard_fd, region, j->bytes / 2, pos);
        fdatasync(s->shard_fd);
        raise(SIGKILL);
    }
    if (s->fault_enospc && nth == s->fault_enospc) {
        ok = write_all(s->shard_fd, region, j->bytes / 2, pos);
        errno = ENOSPC;
        ok = false;
    } else {
        ok = write_all(s->shard_fd, region, j->bytes, pos) && fdatasync(s->shard_fd) == 0;
    }
    hs_store_rec_t rec = {0};
    if (ok) {
        const hs_batch_header_t *h = (const hs_batch_header_t *)region;
        rec = (hs_store_rec_t){.magic = HS_STORE_REC_MAGIC,
                               .batch = j->batch,
                               .shard = s->next_shard,
                               .n_seqs = s->run.n_seqs[j->batch],
                               .n_tokens = s->run.n_tokens[j->batch],
                               .offset = pos,
                               .bytes = j->bytes,
                               .checksum = h->checksum,
                               .plan_hash = s->run.plan_hash};
        rec.seal = hs_store_rec_seal(&rec);
        /* The region is on disk before its record is written, so a record
         * lost to a crash costs a recomputation, never a torn delivery: the
         * index is not synced per record (the kernel writes it back). */
        ok = write_all(s->index_fd, &rec, sizeof(rec), s->index_bytes);
        if (!ok) {
            int e = errno;
            (void)!ftruncate(s->index_fd, (off_t)s->index_bytes);
            errno = e;
        }
    }
    if (!ok) {
        int e = errno;
        (void)!ftruncate(s->shard_fd, (off_t)s->shard_end); /* no torn region left behind */
        errno = e;
        if (e == ENOSPC || e == EDQUOT) {
            hs_warn("store %s: the disk is full (%m) after %llu batch(es) stored: the store stops "
                    "growing here and the run goes on; free room (or give a larger disk) and a "
                    "later run stores the rest",
                    s->dir, (unsigned long long)s->st.batches);
            pthread_mutex_lock(&s->lock);
            s->st.full = true;
            pthread_mutex_unlock(&s->lock);
        } else {
            hs_warn("store %s: writing batch %u failed: %m; nothing more is stored this run",
                    s->dir, j->batch);
        }
        return false;
    }
    s->shard_end = pos + j->bytes;
    s->index_bytes += sizeof(rec);
    pthread_mutex_lock(&s->lock);
    s->loc[j->batch] = (store_loc_t){rec.shard, pos, j->bytes, rec.checksum};
    s->st.batches++;
    s->st.bytes += j->bytes;
    s->st.writes++;
    s->st.write_bytes += j->bytes;
    pthread_mutex_unlock(&s->lock);
    return true;
}

static void *writer_main(void *arg)
{
    hs_store_t *s = arg;
    bool growing = true;
    pthread_mutex_lock(&s->lock);
    for (;;) {
        while (!s->n_jobs && !s->stopping)
            pthread_cond_wait(&s->cond, &s->lock);
        if (!s->n_jobs) break; /* stopping, and every queued region is written */
        store_job_t j = s->jobs[s->head];
        pthread_mutex_unlock(&s->lock);
        if (growing) growing = writer_one(s, &j);
        pthread_mutex_lock(&s->lock);
        if (!growing) s->halted = true;
        /* the job is still at the head: submit only appends */
        j.released = s->jobs[s->head].released;
        s->head = (s->head + 1) % HS_STORE_QUEUE_MAX;
        s->n_jobs--;
        s->queued[j.batch] = 0;
        s->queued_bytes -= j.bytes;
        if (j.released) {
            pthread_mutex_unlock(&s->lock);
            s->free_cb(s->free_arg, j.slot);
            pthread_mutex_lock(&s->lock);
        }
    }
    pthread_mutex_unlock(&s->lock);
    return NULL;
}

void hs_store_close(hs_store_t *s)
{
    if (!s) return;
    if (s->thread_running) {
        pthread_mutex_lock(&s->lock);
        s->stopping = true;
        pthread_cond_signal(&s->cond);
        pthread_mutex_unlock(&s->lock);
        pthread_join(s->thread, NULL);
        if (s->st.writes)
            hs_info("store %s: %llu batch(es) written this run (%.2f GB), %llu of %u stored, "
                    "%llu skipped (writer busy)",
                    s->dir, (unsigned long long)s->st.writes, (double)s->st.write_bytes / 1e9,
                    (unsigned long long)s->st.batches, s->run.n_batches,
                    (unsigned long long)s->st.skipped);
    }
    if (s->shard_fd >= 0) close(s->shard_fd);
    if (s->index_fd >= 0) {
        fdatasync(s->index_fd);
        close(s->index_fd);
    }
    if (s->lock_fd >= 0) close(s->lock_fd); /* and the lock with it */
    if (s->dir_fd >= 0) close(s->dir_fd);
    pthread_cond_destroy(&s->cond);
    pthread_mutex_destroy(&s->lock);
    free(s->recs);
    free(s->loc);
    free(s->queued);
    free(s->run.n_seqs);
    free(s->run.n_tokens);
    free(s);
}
