/* SPDX-License-Identifier: Apache-2.0 */
/* target.c - the fingerprint of the target that computes a run's states
 * (hsflow.h, hs_target_fingerprint): config.json and the content of every
 * *.safetensors file of the model folder, each weight file hashed once and
 * its hash kept in the folder's cache file (.hsflow-target) under the
 * file's size, mtime, ctime and inode, so a later load hashes only what
 * changed. A folder this user cannot write (or a cache file another user
 * owns) is hashed whole every time. */
#include "hsflow.h"

#include "hs_log.h"
#include "hs_time.h"
#include "hs_bytes.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#define XXH_STATIC_LINKING_ONLY /* XXH3_state_t on the stack */
#include <xxhash.h>

#define TARGET_MAX_FILES 4096u
#define TARGET_CACHE_NAME ".hsflow-target"
#define TARGET_CACHE_MAGIC "hsflow-target-cache 1"
#define TARGET_CACHE_MAX_BYTES (1u << 20)
#define TARGET_READ_CHUNK (8u << 20)

/* One weight file: what keys its cached hash, and the hash. */
typedef struct {
    char name[256];
    uint64_t size, mtime_ns, ctime_ns, ino, hash;
    bool hashed;
} target_file_t;

uint64_t hs_target_synthetic_fingerprint(void)
{
    /* The synthetic source's one parameter is the version of its value
     * function (hs_synth_value); the layout is checked on its own. */
    static const char id[] = "hsflow synthetic source, hs_synth_value v1";
    return XXH3_64bits(id, sizeof(id) - 1);
}

/* XXH3-64 of the whole of fd; false with errno set. */
static bool hash_fd(int fd, uint8_t *buf, uint64_t *out, uint64_t *bytes)
{
    XXH3_state_t st;
    XXH3_64bits_reset(&st);
    for (;;) {
        ssize_t r = read(fd, buf, TARGET_READ_CHUNK);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) return false;
        if (r == 0) break;
        XXH3_64bits_update(&st, buf, (size_t)r);
        *bytes += (uint64_t)r;
    }
    *out = XXH3_64bits_digest(&st);
    return true;
}

/* Opens NAME inside the folder as a regular file; through a link only when
 * `follow` (the weights of a Hugging Face cache are links to its blobs). */
static int open_regular(int dfd, const char *name, struct stat *sb, bool follow)
{
    int fd = openat(dfd, name, O_RDONLY | (follow ? 0 : O_NOFOLLOW) | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) return -1;
    if (fstat(fd, sb) != 0 || !S_ISREG(sb->st_mode)) {
        close(fd);
        errno = EINVAL;
        return -1;
    }
    return fd;
}

static uint64_t ns_of(struct timespec t) { return (uint64_t)t.tv_sec * 1000000000ull + t.tv_nsec; }

static int file_cmp(const void *a, const void *b)
{
    return strcmp(((const target_file_t *)a)->name, ((const target_file_t *)b)->name);
}

/* The folder's *.safetensors files (regular, names of 1..255 bytes), sorted
 * by name, with what keys their cache entry. */
static hs_status_t list_weights(const char *dir, int dfd, target_file_t **out, uint32_t *n_out)
{
    int lfd = dup(dfd);
    DIR *d = lfd >= 0 ? fdopendir(lfd) : NULL;
    if (!d) {
        if (lfd >= 0) close(lfd);
        hs_error("target %s: cannot list the folder: %m", dir);
        return HS_ERR_IO;
    }
    target_file_t *f = calloc(TARGET_MAX_FILES, sizeof(*f));
    uint32_t n = 0;
    struct dirent *e;
    hs_status_t st = f ? HS_OK : HS_ERR_NOMEM;
    while (st == HS_OK && (e = readdir(d))) {
        size_t len = strlen(e->d_name);
        if (len < 13 || len >= sizeof(f->name) || strcmp(e->d_name + len - 12, ".safetensors"))
            continue;
        struct stat sb;
        if (fstatat(dfd, e->d_name, &sb, AT_SYMLINK_NOFOLLOW) != 0) continue;
        if (S_ISLNK(sb.st_mode) && fstatat(dfd, e->d_name, &sb, 0) != 0) continue;
        if (!S_ISREG(sb.st_mode)) continue;
        if (n == TARGET_MAX_FILES) {
            hs_error("target %s: more than %u safetensors files; is this a model folder?", dir,
                     TARGET_MAX_FILES);
            st = HS_ERR_INVALID;
            break;
        }
        memcpy(f[n].name, e->d_name, len + 1);
        f[n].size = (uint64_t)sb.st_size;
        f[n].mtime_ns = ns_of(sb.st_mtim);
        f[n].ctime_ns = ns_of(sb.st_ctim);
        f[n].ino = (uint64_t)sb.st_ino;
        n++;
    }
    closedir(d);
    if (st != HS_OK) {
        free(f);
        return st;
    }
    if (n == 0) {
        free(f);
        hs_error("target %s: no *.safetensors file: give the folder of the model's weights", dir);
        return HS_ERR_INVALID;
    }
    qsort(f, n, sizeof(*f), file_cmp);
    *out = f;
    *n_out = n;
    return HS_OK;
}

/* Takes each file's hash from the cache where its key still matches. A
 * cache that is not a small regular file of this user is not read. */
static void cache_read(int dfd, target_file_t *f, uint32_t n)
{
    struct stat sb;
    int fd = open_regular(dfd, TARGET_CACHE_NAME, &sb, false);
    if (fd < 0) return;
    if (sb.st_uid != geteuid() || sb.st_size > TARGET_CACHE_MAX_BYTES || (sb.st_mode & 022)) {
        close(fd);
        return;
    }
    char *text = malloc((size_t)sb.st_size + 1);
    ssize_t r = text ? read(fd, text, (size_t)sb.st_size) : -1;
    close(fd);
    if (r != (ssize_t)sb.st_size) {
        free(text);
        return;
    }
    text[r] = 0;
    char *save = NULL, *line = strtok_r(text, "\n", &save);
    if (!line || strcmp(line, TARGET_CACHE_MAGIC) != 0) {
        free(text);
        return;
    }
    while ((line = strtok_r(NULL, "\n", &save))) {
        char *tab = strchr(line, '\t');
        target_file_t k;
        if (!tab) continue;
        *tab = 0;
        if (sscanf(tab + 1, "%" SCNu64 " %" SCNu64 " %" SCNu64 " %" SCNu64 " %16" SCNx64, &k.size,
                   &k.mtime_ns, &k.ctime_ns, &k.ino, &k.hash) != 5)
            continue;
        for (uint32_t i = 0; i < n; i++)
            if (!f[i].hashed && !strcmp(f[i].name, line) && f[i].size == k.size &&
                f[i].mtime_ns == k.mtime_ns && f[i].ctime_ns == k.ctime_ns && f[i].ino == k.ino) {
                f[i].hash = k.hash;
                f[i].hashed = true;
            }
    }
    free(text);
}

/* Writes the cache beside the weights (a temporary file renamed over it);
 * a folder this user cannot write keeps none, silently. */
static void cache_write(const char *dir, int dfd, const target_file_t *f, uint32_t n)
{
    char tmp[64];
    snprintf(tmp, sizeof(tmp), "%s.%ld.tmp", TARGET_CACHE_NAME, (long)getpid());
    (void)unlinkat(dfd, tmp, 0); /* a stale one of a crashed process of this pid */
    int fd = openat(dfd, tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (fd < 0) {
        hs_debug("target %s: no fingerprint cache kept (%m)", dir);
        return;
    }
    FILE *out = fdopen(fd, "w");
    bool ok = out && fprintf(out, "%s\n", TARGET_CACHE_MAGIC) > 0;
    for (uint32_t i = 0; ok && i < n; i++)
        if (!strpbrk(f[i].name, "\t\n"))
            ok = fprintf(
                     out, "%s\t%" PRIu64 " %" PRIu64 " %" PRIu64 " %" PRIu64 " %016" PRIx64 "\n",
                     f[i].name, f[i].size, f[i].mtime_ns, f[i].ctime_ns, f[i].ino, f[i].hash) > 0;
    ok = out && fclose(out) == 0 && ok;
    if (!out) close(fd);
    if (!ok || renameat(dfd, tmp, dfd, TARGET_CACHE_NAME) != 0) {
        hs_debug("target %s: the fingerprint cache could not be written (%m)", dir);
        unlinkat(dfd, tmp, 0);
    }
}

/* XXH3-64 of config.json, whole (bounded: a config is a few KB). */
static hs_status_t hash_config(const char *dir, int dfd, uint8_t *buf, uint64_t *out)
{
    struct stat sb;
    int fd = open_regular(dfd, "config.json", &sb, true);
    uint64_t bytes = 0;
    if (fd < 0) {
        hs_error("target %s: cannot open config.json as a regular file: %m; give the model's "
                 "folder",
                 dir);
        return HS_ERR_IO;
    }
    bool ok = sb.st_size <= (64 << 20) && hash_fd(fd, buf, out, &bytes);
    close(fd);
    if (!ok) {
        hs_error("target %s: cannot read config.json (or it is over 64 MiB)", dir);
        return HS_ERR_IO;
    }
    return HS_OK;
}

/* Hashes the files the cache did not give; the bytes read into *bytes. */
static hs_status_t hash_weights(const char *dir, int dfd, target_file_t *f, uint32_t n,
                                uint8_t *buf, uint64_t *bytes, uint32_t *files)
{
    for (uint32_t i = 0; i < n; i++) {
        if (f[i].hashed) continue;
        struct stat sb;
        int fd = open_regular(dfd, f[i].name, &sb, true);
        uint64_t got = 0;
        bool ok = fd >= 0 && hash_fd(fd, buf, &f[i].hash, &got);
        if (fd >= 0) close(fd);
        if (!ok) {
            hs_error("target %s: cannot read %s: %m", dir, f[i].name);
            return HS_ERR_IO;
        }
        if (got != f[i].size || (uint64_t)sb.st_size != f[i].size) {
            hs_error("target %s: %s changed while it was hashed; start again once the weights "
                     "are in place",
                     dir, f[i].name);
            return HS_ERR_IO;
        }
        f[i].hashed = true;
        *bytes += got;
        (*files)++;
    }
    return HS_OK;
}

hs_status_t hs_target_fingerprint(const char *model_dir, uint64_t *out)
{
    if (!model_dir || !model_dir[0] || !out) return HS_ERR_INVALID;
    int dfd = open(model_dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0) {
        hs_error("target %s: cannot open the folder: %m; give the model's folder", model_dir);
        return HS_ERR_IO;
    }
    double t0 = hs_now_s();
    target_file_t *f = NULL;
    uint32_t n = 0;
    uint64_t config = 0, bytes = 0;
    uint32_t read_files = 0;
    uint8_t *buf = malloc(TARGET_READ_CHUNK);
    hs_status_t st = buf ? hash_config(model_dir, dfd, buf, &config) : HS_ERR_NOMEM;
    if (st == HS_OK) st = list_weights(model_dir, dfd, &f, &n);
    if (st == HS_OK) {
        cache_read(dfd, f, n);
        st = hash_weights(model_dir, dfd, f, n, buf, &bytes, &read_files);
    }
    if (st == HS_OK) {
        if (read_files) cache_write(model_dir, dfd, f, n);
        XXH3_state_t xs;
        XXH3_64bits_reset(&xs);
        XXH3_64bits_update(&xs, "HSTARGET1", 9);
        uint8_t le[8];
        hs_le64_store(le, config);
        XXH3_64bits_update(&xs, le, 8);
        for (uint32_t i = 0; i < n; i++) {
            XXH3_64bits_update(&xs, f[i].name, strlen(f[i].name) + 1);
            hs_le64_store(le, f[i].size);
            XXH3_64bits_update(&xs, le, 8);
            hs_le64_store(le, f[i].hash);
            XXH3_64bits_update(&xs, le, 8);
        }
        uint64_t fp = XXH3_64bits_digest(&xs);
        *out = fp ? fp : 1; /* 0 means "not said" on the wire */
        hs_info("target %s: fingerprint %016" PRIx64 " (config.json and %u weight file(s): %u read "
                "and hashed, %.2f GB in %.1f s; %u unchanged since %s)",
                model_dir, *out, n, read_files, (double)bytes / 1e9, hs_now_s() - t0,
                n - read_files, TARGET_CACHE_NAME);
    }
    free(buf);
    free(f);
    close(dfd);
    return st;
}
