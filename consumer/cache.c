/* SPDX-License-Identifier: Apache-2.0 */
/* cache.c - host-RAM cache: an mmap'd region carved into 4096-aligned slots
 * by a best-fit allocator over address-ordered, coalescing extents, prepared
 * (pinned / prefaulted) chunk by chunk in the background. See cache_int.h. */
#include "cache_int.h"
#include "hs_log.h"
#include "hs_time.h"
#include "hs_memory.h"
#include "hs_memclaim.h"

#include <errno.h>
#include <pthread.h>
#include <time.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include <stdio.h>

#ifdef HS_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23 /* Linux 5.14 */
#endif

#define HS_CACHE_HUGE_ALIGN (2ull << 20)

/* One piece of the prepared prefix [0, ready_end): a live slot or a free
 * extent. The array is sorted by offset and tiles the prefix exactly; two
 * free blocks are never adjacent. Its length is at most 2 * slots + 1. */
typedef struct {
    uint64_t offset;
    uint64_t bytes;
    bool used;
} hs_cache_block_t;

struct hs_cache {
    pthread_mutex_t lock; /* guards everything below except the prepare_* fields */
    pthread_cond_t prepared_cv;
    uint8_t *base;
    uint64_t capacity;
    uint64_t map_bytes; /* what was mmap'd (capacity rounded up to 2 MiB) */
    uint32_t flags;

    hs_cache_block_t *blocks;
    uint32_t n_blocks, cap_blocks;
    uint64_t ready_end;
    uint64_t used, high_water, n_slots, n_reserve_fail;

    /* preparation; prepare_lock serialises hs_cache_prepare_next() */
    pthread_mutex_t prepare_lock;
    uint64_t chunk_bytes;
    uint64_t pinned_end; /* [0, pinned_end) registered, in chunk_bytes pieces */
    int cuda_device;
    bool pin_wanted; /* pinning asked for and possible in this build */
    bool pin;        /* still trying to pin */
    bool pin_failed;
    bool stopping;
    double prepare_s;
    bool has_thread;
    pthread_t thread;

    /* registration with a transport (hs_cache_register_next) */
    uint64_t registered_end; /* [0, registered_end) registered, chunk by chunk */
    bool registered_whole;   /* ... and the whole region in one piece */
};

/* ---- block array ------------------------------------------------------- */

static hs_status_t cache_blocks_insert(hs_cache_t *c, uint32_t at, hs_cache_block_t b)
{
    if (c->n_blocks == c->cap_blocks) {
        uint32_t ncap = c->cap_blocks ? c->cap_blocks * 2 : 64;
        hs_cache_block_t *nb = realloc(c->blocks, (size_t)ncap * sizeof *nb);
        if (!nb) {
            hs_error("cache: out of memory growing the slot table to %u entries", ncap);
            return HS_ERR_NOMEM;
        }
        c->blocks = nb;
        c->cap_blocks = ncap;
    }
    memmove(&c->blocks[at + 1], &c->blocks[at], (size_t)(c->n_blocks - at) * sizeof *c->blocks);
    c->blocks[at] = b;
    c->n_blocks++;
    return HS_OK;
}

static void cache_blocks_remove(hs_cache_t *c, uint32_t at)
{
    memmove(&c->blocks[at], &c->blocks[at + 1], (size_t)(c->n_blocks - at - 1) * sizeof *c->blocks);
    c->n_blocks--;
}

/* Index of the last block whose offset <= off, or -1. */
static int64_t cache_blocks_find(const hs_cache_t *c, uint64_t off)
{
    int64_t lo = 0, hi = (int64_t)c->n_blocks - 1, ans = -1;
    while (lo <= hi) {
        int64_t mid = lo + (hi - lo) / 2;
        if (c->blocks[mid].offset <= off) {
            ans = mid;
            lo = mid + 1;
        } else {
            hi = mid - 1;
        }
    }
    return ans;
}

/* Append [ready_end, ready_end + bytes) to the prepared prefix. Lock held. */
static hs_status_t cache_grow_locked(hs_cache_t *c, uint64_t bytes)
{
    if (c->n_blocks && !c->blocks[c->n_blocks - 1].used) {
        c->blocks[c->n_blocks - 1].bytes += bytes;
    } else {
        hs_cache_block_t b = {.offset = c->ready_end, .bytes = bytes, .used = false};
        hs_status_t st = cache_blocks_insert(c, c->n_blocks, b);
        if (st) return st;
    }
    c->ready_end += bytes;
    return HS_OK;
}

/* ---- preparation --------------------------------------------------------- */

static void cache_prefault(uint8_t *p, uint64_t len)
{
    if (madvise(p, len, MADV_POPULATE_WRITE) == 0) return;
    /* older kernels: touch one byte per page */
    long pg = sysconf(_SC_PAGESIZE);
    for (uint64_t o = 0; o < len; o += (uint64_t)pg)
        ((volatile uint8_t *)p)[o] = 0;
}

/* Pin [p, p+len); false (after one warning) if pinning does not work here. */
static bool cache_pin_chunk(hs_cache_t *c, uint8_t *p, uint64_t len)
{
#ifdef HS_HAVE_CUDA
    cudaError_t e = cudaSetDevice(c->cuda_device);
    if (e == cudaSuccess) e = cudaHostRegister(p, len, cudaHostRegisterPortable);
    if (e == cudaSuccess) return true;
    hs_warn(
        "cache: cudaHostRegister of %llu bytes at offset %llu failed (%s); the remaining "
        "%.1f GiB of the cache stay unpinned, so host-to-device copies from them will be slower",
        (unsigned long long)len, (unsigned long long)(p - c->base), cudaGetErrorString(e),
        (double)(c->capacity - (uint64_t)(p - c->base)) / (1ull << 30));
    (void)cudaGetLastError(); /* so later CUDA calls do not report this error again */
    return false;
#else
    (void)c;
    (void)p;
    (void)len;
    return false;
#endif
}

bool hs_cache_prepare_next(hs_cache_t *c)
{
    pthread_mutex_lock(&c->prepare_lock);
    pthread_mutex_lock(&c->lock);
    uint64_t off = c->ready_end;
    bool stop = c->stopping;
    pthread_mutex_unlock(&c->lock);
    if (stop || off >= c->capacity) {
        pthread_mutex_unlock(&c->prepare_lock);
        return false;
    }
    uint64_t len = c->capacity - off < c->chunk_bytes ? c->capacity - off : c->chunk_bytes;

    double t0 = hs_now_s();
    bool pinned = false;
    if (c->pin) {
        pinned = cache_pin_chunk(c, c->base + off, len);
        if (!pinned) c->pin = false;
    }
    if (!pinned && (c->flags & HS_CACHE_PREFAULT)) cache_prefault(c->base + off, len);
    double dt = hs_now_s() - t0;

    pthread_mutex_lock(&c->lock);
    if (pinned)
        c->pinned_end = off + len;
    else if (c->pin_wanted)
        c->pin_failed = true;
    c->prepare_s += dt;
    hs_status_t st = cache_grow_locked(c, len);
    bool done = c->ready_end >= c->capacity;
    if (done) pthread_cond_broadcast(&c->prepared_cv);
    double total_s = c->prepare_s;
    uint64_t pinned_end = c->pinned_end;
    pthread_mutex_unlock(&c->lock);
    pthread_mutex_unlock(&c->prepare_lock);
    if (st) return false; /* logged; only a failed realloc of the slot table */
    if (done)
        hs_info("cache: %.1f GiB ready (%.1f GiB pinned) after %.1f s of preparation",
                (double)c->capacity / (1ull << 30), (double)pinned_end / (1ull << 30), total_s);
    return !done;
}

static void *cache_prepare_main(void *arg)
{
    hs_cache_t *c = arg;
    /* A short pause between chunks: back-to-back cudaHostRegister calls can
     * keep other threads' CUDA calls (the loader's copies) waiting for the
     * driver until the whole cache is pinned. */
    while (hs_cache_prepare_next(c)) {
        struct timespec pause = {0, 2000000};
        nanosleep(&pause, NULL);
    }
    return NULL;
}

void hs_cache_wait_prepared(hs_cache_t *c)
{
    pthread_mutex_lock(&c->lock);
    while (c->ready_end < c->capacity && !c->stopping)
        pthread_cond_wait(&c->prepared_cv, &c->lock);
    pthread_mutex_unlock(&c->lock);
}

/* ---- create / destroy ---------------------------------------------------- */

hs_status_t hs_cache_create(uint64_t capacity, uint32_t flags, hs_cache_t **out)
{
    hs_cache_config_t cfg = {
        .capacity = capacity, .flags = flags, .chunk_bytes = 0, .cuda_device = -1};
    return hs_cache_create_ex(&cfg, out);
}

/* Before mapping a cache of `bytes`: is there that much memory to give
 * (hs_mem_room: MemAvailable and the cgroup limit), less `others` bytes that
 * the node's other caches still have to take (described in others_text)?
 * The region is mapped without reserving, so an oversized cache would start
 * and be OOM-killed only once it fills. HS_ERR_NOSPACE, logged with the
 * figures and what to do, when it does not fit; with `force`, a warning. */
static hs_status_t check_room(uint64_t bytes, bool force, uint64_t others, unsigned n_others,
                              const char *others_text)
{
    hs_mem_limits_t m;
    hs_mem_limits(&m);
    uint64_t sys_room = hs_mem_room(&m);
    uint64_t room = sys_room > others ? sys_room - others : 0;
    if (bytes <= room) return HS_OK;
    const double GiB = (double)(1ull << 30);
    char avail[64], cgroup[700], other[800] = "";
    if (m.mem_available)
        snprintf(avail, sizeof avail, "%.2f GiB", (double)m.mem_available / GiB);
    else
        snprintf(avail, sizeof avail, "unknown");
    if (m.cgroup_limit)
        snprintf(cgroup, sizeof cgroup, "%.2f GiB with %.2f GiB in use (%s)",
                 (double)m.cgroup_limit / GiB, (double)m.cgroup_used / GiB, m.cgroup_file);
    else
        snprintf(cgroup, sizeof cgroup, "none");
    if (n_others)
        snprintf(other, sizeof other,
                 ", less %.2f GiB that %u other consumer%s on this node will still take (%s%s)",
                 (double)others / GiB, n_others, n_others > 1 ? "s" : "", others_text,
                 n_others > 1 ? ", the largest" : "");
    double fit = (double)room * 0.9 / GiB; /* leave the process some room of its own */
    if (force) {
        hs_warn("cache: %.2f GiB is more than this machine can give (%.2f GiB): MemAvailable %s, "
                "cgroup limit %s%s; going on because of --force: expect the OOM killer once the "
                "caches fill",
                (double)bytes / GiB, (double)room / GiB, avail, cgroup, other);
        return HS_OK;
    }
    hs_error("cache: --cache-gb %.2f is more than this machine can give (%.2f GiB): MemAvailable "
             "%s, cgroup limit %s%s; the cache would start and be OOM-killed once it fills. Give "
             "--cache-gb (cache_gb) %.1f or less (free memory, raise the limit or stop another "
             "consumer for more), or add --force (force=True from Python) to start anyway",
             (double)bytes / GiB, (double)room / GiB, avail, cgroup, other, fit);
    return HS_ERR_NOSPACE;
}

hs_status_t hs_cache_claim_room(uint64_t bytes, bool force, const char *who, hs_mem_claim_t **out)
{
    hs_mem_claim_t *m;
    hs_status_t st = hs_mem_claim_open(&m);
    if (st != HS_OK) return st;
    unsigned n_others;
    const char *text = hs_mem_claim_others_text(m, &n_others);
    st = check_room(bytes, force, hs_mem_claim_others(m), n_others, text);
    if (st == HS_OK) st = hs_mem_claim_commit(m, bytes, who);
    if (st != HS_OK) {
        hs_mem_claim_release(m);
        return st;
    }
    *out = m;
    return HS_OK;
}

hs_status_t hs_cache_create_ex(const hs_cache_config_t *cfg, hs_cache_t **out)
{
    hs_status_t st = HS_ERR_INVALID;
    uint64_t pg = (uint64_t)sysconf(_SC_PAGESIZE);
    if (pg < HS_CACHE_SLOT_ALIGN) pg = HS_CACHE_SLOT_ALIGN;
    uint64_t capacity = cfg->capacity / pg * pg;
    if (capacity == 0) {
        hs_error(
            "cache: capacity of %llu bytes is less than one page (%llu); give a larger cache size",
            (unsigned long long)cfg->capacity, (unsigned long long)pg);
        return HS_ERR_INVALID;
    }
    uint64_t chunk = cfg->chunk_bytes ? hs_align_up(cfg->chunk_bytes, pg) : HS_CACHE_DEFAULT_CHUNK;

    hs_cache_t *c = calloc(1, sizeof *c);
    if (!c) return HS_ERR_NOMEM;
    c->capacity = capacity;
    c->flags = cfg->flags;
    c->chunk_bytes = chunk;
    pthread_mutex_init(&c->lock, NULL);
    pthread_mutex_init(&c->prepare_lock, NULL);
    pthread_cond_init(&c->prepared_cv, NULL);

    /* Map 2 MiB more than needed and trim, so the base is 2 MiB aligned and
     * transparent huge pages can back the whole region. */
    uint64_t align = capacity >= HS_CACHE_HUGE_ALIGN ? HS_CACHE_HUGE_ALIGN : pg;
    uint64_t span = capacity + align;
    void *m = mmap(NULL, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                   -1, 0);
    if (m == MAP_FAILED) {
        hs_error("cache: mmap of %llu bytes failed: %m; lower the cache size",
                 (unsigned long long)span);
        st = HS_ERR_NOMEM;
        goto err_free;
    }
    uintptr_t a = ((uintptr_t)m + align - 1) / align * align;
    uint64_t head = a - (uintptr_t)m, tail = span - head - capacity;
    if (head) munmap(m, head);
    if (tail) munmap((uint8_t *)a + capacity, tail);
    c->base = (uint8_t *)a;
    c->map_bytes = capacity;
    (void)madvise(c->base, capacity, MADV_HUGEPAGE); /* best effort */

    bool want_pin = cfg->flags & HS_CACHE_PIN_CUDA;
#ifdef HS_HAVE_CUDA
    if (want_pin) {
        int dev = cfg->cuda_device;
        cudaError_t e = dev >= 0 ? cudaSuccess : cudaGetDevice(&dev);
        if (e != cudaSuccess) {
            hs_warn("cache: no CUDA device to pin the cache with (%s); using it unpinned",
                    cudaGetErrorString(e));
            (void)cudaGetLastError();
            want_pin = false;
            c->pin_failed = true;
        }
        c->cuda_device = dev;
    }
#else
    if (want_pin) hs_debug("cache: built without CUDA, the cache is not pinned");
    want_pin = false;
#endif
    c->pin = c->pin_wanted = want_pin;

    if (!want_pin && !(cfg->flags & HS_CACHE_PREFAULT)) {
        /* nothing to prepare: all usable at once */
        st = cache_grow_locked(c, capacity);
        if (st) goto err_unmap;
    } else if (!(cfg->flags & HS_CACHE_MANUAL_PREPARE)) {
        if (pthread_create(&c->thread, NULL, cache_prepare_main, c) != 0) {
            hs_error("cache: cannot start the preparation thread: %m");
            st = HS_ERR_NOMEM;
            goto err_unmap;
        }
        c->has_thread = true;
    }
    hs_info("cache: %.2f GiB at %p, %s", (double)capacity / (1ull << 30), (void *)c->base,
            want_pin                           ? "pinning in the background"
            : (cfg->flags & HS_CACHE_PREFAULT) ? "prefaulting in the background"
                                               : "unpinned");
    *out = c;
    return HS_OK;

err_unmap:
    munmap(c->base, c->map_bytes);
err_free:
    free(c->blocks);
    pthread_cond_destroy(&c->prepared_cv);
    pthread_mutex_destroy(&c->prepare_lock);
    pthread_mutex_destroy(&c->lock);
    free(c);
    return st;
}

void hs_cache_destroy(hs_cache_t *c)
{
    if (!c) return;
    pthread_mutex_lock(&c->lock);
    c->stopping = true;
    pthread_cond_broadcast(&c->prepared_cv);
    pthread_mutex_unlock(&c->lock);
    if (c->has_thread) pthread_join(c->thread, NULL);
#ifdef HS_HAVE_CUDA
    for (uint64_t off = 0; off < c->pinned_end; off += c->chunk_bytes) {
        cudaError_t e = cudaHostUnregister(c->base + off);
        if (e != cudaSuccess)
            hs_warn("cache: cudaHostUnregister at offset %llu: %s", (unsigned long long)off,
                    cudaGetErrorString(e));
    }
#endif
    munmap(c->base, c->map_bytes);
    free(c->blocks);
    pthread_cond_destroy(&c->prepared_cv);
    pthread_mutex_destroy(&c->prepare_lock);
    pthread_mutex_destroy(&c->lock);
    free(c);
}

/* ---- slots ----------------------------------------------------------------- */

/* Where in free block b a slot of `need` bytes may start: its offset, or
 * the first chunk boundary inside it when a registered cache is not yet
 * registered whole (the slot must then lie inside one registered chunk).
 * Lock held. */
static bool cache_slot_place(const hs_cache_t *c, const hs_cache_block_t *b, uint64_t need,
                             uint64_t *at)
{
    uint64_t o = b->offset, end = b->offset + b->bytes;
    if ((c->flags & HS_CACHE_REGISTERED) && !c->registered_whole) {
        uint64_t chunk = c->chunk_bytes;
        if (need > chunk) return false; /* waits for the whole region */
        if (o / chunk != (o + need - 1) / chunk) o = (o / chunk + 1) * chunk;
        if (end > c->registered_end) end = c->registered_end;
    }
    if (o + need > end) return false;
    *at = o;
    return true;
}

hs_status_t hs_cache_plan_slots(hs_cache_t *c, uint64_t slots)
{
    uint64_t need = 2 * slots + 1; /* the most blocks that many slots make */
    if (need > UINT32_MAX) need = UINT32_MAX;
    hs_status_t st = HS_OK;
    pthread_mutex_lock(&c->lock);
    if (need > c->cap_blocks) {
        hs_cache_block_t *nb = realloc(c->blocks, (size_t)need * sizeof *nb);
        if (nb) {
            c->blocks = nb;
            c->cap_blocks = (uint32_t)need;
        } else {
            st = HS_ERR_NOMEM;
        }
    }
    pthread_mutex_unlock(&c->lock);
    if (st != HS_OK)
        hs_error("cache: out of memory for a slot table of %llu entries", (unsigned long long)need);
    return st;
}

hs_status_t hs_cache_reserve(hs_cache_t *c, uint64_t bytes, hs_cache_slot_t *out)
{
    if (bytes == 0) {
        hs_error(
            "cache: reserve of an empty slot; every batch has a header, so its size cannot be 0");
        return HS_ERR_INVALID;
    }
    if (bytes > c->capacity) {
        hs_error(
            "cache: a slot of %llu bytes can never fit a cache of %llu bytes; raise the cache size "
            "or lower the token budget",
            (unsigned long long)bytes, (unsigned long long)c->capacity);
        return HS_ERR_INVALID;
    }
    uint64_t need = hs_align_up(bytes, HS_CACHE_SLOT_ALIGN);
    hs_status_t st = HS_OK;
    pthread_mutex_lock(&c->lock);
    /* best fit: the smallest free extent that holds `need`, lowest address on ties */
    int64_t best = -1;
    uint64_t best_at = 0;
    for (uint32_t i = 0; i < c->n_blocks; i++) {
        const hs_cache_block_t *b = &c->blocks[i];
        uint64_t at;
        if (b->used || b->bytes < need || !cache_slot_place(c, b, need, &at)) continue;
        if (best < 0 || b->bytes < c->blocks[best].bytes) {
            best = i;
            best_at = at;
            if (b->bytes == need) break;
        }
    }
    if (best < 0) {
        c->n_reserve_fail++;
        st = HS_ERR_NOSPACE;
        goto out_unlock;
    }
    hs_cache_block_t *b = &c->blocks[best];
    if (best_at > b->offset) { /* the slot starts at a chunk boundary inside b */
        hs_cache_block_t front = {.offset = b->offset, .bytes = best_at - b->offset, .used = false};
        st = cache_blocks_insert(c, (uint32_t)best, front);
        if (st) goto out_unlock;
        best++;
        b = &c->blocks[best]; /* the array may have moved */
        b->offset = best_at;
        b->bytes -= front.bytes;
    }
    uint64_t off = b->offset;
    if (b->bytes > need) {
        hs_cache_block_t rest = {.offset = off + need, .bytes = b->bytes - need, .used = false};
        st = cache_blocks_insert(c, (uint32_t)best + 1, rest);
        if (st) goto out_unlock;
        b = &c->blocks[best]; /* the array may have moved */
        b->bytes = need;
    }
    b->used = true;
    c->used += need;
    c->n_slots++;
    if (c->used > c->high_water) c->high_water = c->used;
    out->offset = off;
    out->bytes = need;
    out->ptr = c->base + off;
out_unlock:
    pthread_mutex_unlock(&c->lock);
    return st;
}

hs_status_t hs_cache_free(hs_cache_t *c, uint64_t offset)
{
    pthread_mutex_lock(&c->lock);
    int64_t i = cache_blocks_find(c, offset);
    if (i < 0 || c->blocks[i].offset != offset || !c->blocks[i].used) {
        pthread_mutex_unlock(&c->lock);
        hs_error("cache: free of offset %llu, where no slot starts (double free?)",
                 (unsigned long long)offset);
        return HS_ERR_NOT_FOUND;
    }
    hs_cache_block_t *b = &c->blocks[i];
    b->used = false;
    c->used -= b->bytes;
    c->n_slots--;
    if ((uint32_t)i + 1 < c->n_blocks && !c->blocks[i + 1].used) {
        b->bytes += c->blocks[i + 1].bytes;
        cache_blocks_remove(c, (uint32_t)i + 1);
    }
    if (i > 0 && !c->blocks[i - 1].used) {
        c->blocks[i - 1].bytes += c->blocks[i].bytes;
        cache_blocks_remove(c, (uint32_t)i);
    }
    pthread_mutex_unlock(&c->lock);
    return HS_OK;
}

bool hs_cache_register_next(hs_cache_t *c, hs_cache_register_cb reg, void *arg)
{
    pthread_mutex_lock(&c->lock);
    uint64_t from = c->registered_end, ready = c->ready_end;
    bool whole = c->registered_whole;
    pthread_mutex_unlock(&c->lock);
    if (whole) return false;
    uint64_t len = 0;
    if (from < c->capacity) {
        if (ready <= from) return true; /* the next chunk is not prepared yet */
        len = ready - from < c->chunk_bytes ? ready - from : c->chunk_bytes;
        (void)reg(arg, c->base + from, len); /* on failure: logged, slower but usable */
    } else {
        /* every chunk registered: the whole region in one piece, so that a
         * slot may cross chunk boundaries from now on */
        (void)reg(arg, c->base, c->capacity);
    }
    pthread_mutex_lock(&c->lock);
    c->registered_end = from + len;
    /* one chunk is the whole region */
    if (len == 0 || (from == 0 && len == c->capacity)) c->registered_whole = true;
    whole = c->registered_whole;
    pthread_mutex_unlock(&c->lock);
    return !whole;
}

bool hs_cache_contains(const hs_cache_t *c, const void *p, uint64_t bytes)
{
    uintptr_t a = (uintptr_t)p, base = (uintptr_t)c->base;
    if (a < base || a - base >= c->capacity || bytes > c->capacity - (a - base)) return false;
    uint64_t off = a - base;
    hs_cache_t *mc = (hs_cache_t *)c; /* the lock is the only thing touched */
    pthread_mutex_lock(&mc->lock);
    int64_t i = cache_blocks_find(c, off);
    bool in =
        i >= 0 && c->blocks[i].used && off + bytes <= c->blocks[i].offset + c->blocks[i].bytes;
    pthread_mutex_unlock(&mc->lock);
    return in;
}

void *hs_cache_base(const hs_cache_t *c) { return c->base; }
uint64_t hs_cache_chunk_bytes(const hs_cache_t *c) { return c->chunk_bytes; }

hs_status_t hs_cache_copy_to_device(const hs_cache_t *c, void *dst, uint64_t offset, uint64_t bytes,
                                    void *stream)
{
    if (offset > c->capacity || bytes > c->capacity - offset) {
        hs_error("cache: copy of %llu bytes at offset %llu runs past the cache's %llu bytes",
                 (unsigned long long)bytes, (unsigned long long)offset,
                 (unsigned long long)c->capacity);
        return HS_ERR_INVALID;
    }
#ifdef HS_HAVE_CUDA
    uint8_t *d = dst;
    while (bytes) {
        uint64_t piece = c->chunk_bytes - offset % c->chunk_bytes;
        if (piece > bytes) piece = bytes;
        cudaError_t e = cudaMemcpyAsync(d, c->base + offset, piece, cudaMemcpyHostToDevice,
                                        (cudaStream_t)stream);
        if (e != cudaSuccess) {
            hs_error("cache: cudaMemcpyAsync of %llu bytes from cache offset %llu failed: %s",
                     (unsigned long long)piece, (unsigned long long)offset, cudaGetErrorString(e));
            return HS_ERR_CUDA;
        }
        d += piece;
        offset += piece;
        bytes -= piece;
    }
    return HS_OK;
#else
    (void)dst;
    (void)stream;
    hs_error(
        "cache: this build has no CUDA; copy from hs_cache_base() + offset on the host instead");
    return HS_ERR_UNSUPPORTED;
#endif
}
uint64_t hs_cache_capacity(const hs_cache_t *c) { return c->capacity; }

void hs_cache_stats(const hs_cache_t *c, hs_cache_stats_t *out)
{
    hs_cache_t *mc = (hs_cache_t *)c;
    hs_cache_stats_t s = {0};
    pthread_mutex_lock(&mc->lock);
    s.capacity = c->capacity;
    s.ready_bytes = c->ready_end;
    s.used = c->used;
    s.n_slots = c->n_slots;
    s.high_water = c->high_water;
    s.n_reserve_fail = c->n_reserve_fail;
    for (uint32_t i = 0; i < c->n_blocks; i++) {
        const hs_cache_block_t *b = &c->blocks[i];
        if (b->used) continue;
        s.free_bytes += b->bytes;
        s.n_free_extents++;
        if (b->bytes > s.largest_free) s.largest_free = b->bytes;
    }
    s.pinned_bytes = c->pinned_end;
    s.prepare_s = c->prepare_s;
    s.prepared = c->ready_end >= c->capacity;
    s.pin_failed = c->pin_failed;
    pthread_mutex_unlock(&mc->lock);
    *out = s;
}
