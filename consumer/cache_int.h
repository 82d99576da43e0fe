/* SPDX-License-Identifier: Apache-2.0 */
/* cache_int.h - the consumer's host-RAM cache: one page-aligned region carved
 * into variable-size slots, one per ticket (DESIGN §2, §5).
 *
 * The region is mmap'd once at create and never grows or moves. Slots start
 * on 4096-byte boundaries and their sizes are rounded up to 4096. Free space
 * is a list of address-ordered extents that coalesce on free; reserve picks
 * the best fit (smallest extent that fits, lowest address on ties), which
 * keeps large extents whole for the large batches.
 *
 * Preparation: with HS_CACHE_PIN_CUDA (built with CUDA) and/or
 * HS_CACHE_PREFAULT the region is prepared chunk by chunk (registered with
 * cudaHostRegister / touched), in address order, on a background thread; only
 * the prepared prefix of the region is handed out, so the cache "grows" as
 * chunks become ready and producers can start at once. If pinning fails (no
 * GPU at run time) one warning is logged and the rest is used unpinned.
 * Without either flag the whole region is usable at once.
 *
 * Registration with a transport (HS_CACHE_REGISTERED, hs_cache_register_next):
 * the owner registers the prepared region with its transport one chunk at a
 * time, so that no single call maps a large cache before producers can
 * start, then, once every chunk is registered, the whole region in one piece.
 * A transport (UCX) hands a payload a memory handle only when one
 * registration holds all of it, so until the whole region is registered a
 * slot is placed only inside one registered chunk, and a slot larger than a
 * chunk waits for the whole region: every slot reserve hands out lies inside
 * memory already registered, and nothing is registered on the data path.
 *
 * Threads: every function may be called from any thread (one mutex); reserve
 * typically runs on the network thread and free on the trainer's thread.
 *
 * Ownership: the cache owns the region; a slot's memory belongs to whoever
 * reserved it until hs_cache_free(). hs_cache_destroy() unmaps everything,
 * live slots included. */
#ifndef HS_CACHE_INT_H
#define HS_CACHE_INT_H

#include <stdbool.h>
#include <stdint.h>

#include "hsflow.h"
#include "hs_memclaim.h"

#ifdef __cplusplus
extern "C" {
#endif

#define HS_CACHE_SLOT_ALIGN 4096u
#define HS_CACHE_DEFAULT_CHUNK (1ull << 30) /* preparation unit: 1 GiB */

/* hs_cache_create flags */
enum {
    HS_CACHE_PIN_CUDA = 1u << 0, /* cudaHostRegister the region (ignored without CUDA) */
    HS_CACHE_PREFAULT = 1u << 1, /* touch every page before handing it out */
    /* Do not start the background thread: the caller prepares the region by
     * calling hs_cache_prepare_next() until it returns false. */
    HS_CACHE_MANUAL_PREPARE = 1u << 2,
    /* Slots only inside memory registered by hs_cache_register_next(). */
    HS_CACHE_REGISTERED = 1u << 3,
};

typedef struct hs_cache hs_cache_t;

typedef struct {
    uint64_t offset; /* from the region's base; multiple of HS_CACHE_SLOT_ALIGN */
    uint64_t bytes;  /* the requested size rounded up to HS_CACHE_SLOT_ALIGN */
    void *ptr;       /* base + offset */
} hs_cache_slot_t;

typedef struct {
    uint64_t capacity;     /* region size */
    uint64_t ready_bytes;  /* prepared prefix that reserve may hand out */
    uint64_t used;         /* bytes in live slots */
    uint64_t free_bytes;   /* ready bytes not in a slot */
    uint64_t largest_free; /* largest free extent: the largest reserve that succeeds now */
    uint64_t n_slots;      /* live slots */
    uint64_t n_free_extents;
    uint64_t pinned_bytes;   /* registered with CUDA */
    uint64_t high_water;     /* most bytes ever in live slots at once */
    uint64_t n_reserve_fail; /* reserves answered HS_ERR_NOSPACE */
    double prepare_s;        /* time spent pinning/prefaulting so far */
    bool prepared;           /* every chunk is ready */
    bool pin_failed;         /* pinning was asked for and did not work */
} hs_cache_stats_t;

typedef struct {
    uint64_t capacity;    /* bytes; rounded DOWN to the page size */
    uint32_t flags;       /* HS_CACHE_* */
    uint64_t chunk_bytes; /* preparation unit; 0 = HS_CACHE_DEFAULT_CHUNK */
    int cuda_device;      /* device whose context registers the region; -1 = the
                           * creating thread's current device */
} hs_cache_config_t;

/* Map a region of `capacity` bytes, rounded DOWN to the page size so the
 * cache never holds more than asked. flags: HS_CACHE_*. The cache is usable
 * on return; with PIN_CUDA/PREFAULT only its prepared part is handed out. */
HS_MUST_CHECK hs_status_t hs_cache_create(uint64_t capacity, uint32_t flags, hs_cache_t **out);
HS_MUST_CHECK hs_status_t hs_cache_create_ex(const hs_cache_config_t *cfg, hs_cache_t **out);
/* Stops preparation, unregisters and unmaps. Accepts NULL. */
void hs_cache_destroy(hs_cache_t *c);

/* Before mapping a cache of `bytes`: is there that much memory to give
 * (MemAvailable and the cgroup limit), with the node's other consumers
 * counted? The region is mapped without reserving, so an oversized cache
 * would start and be OOM-killed only once it fills. What the other live
 * claims of the node's registry (hs_mem_claim_t) have still to take comes
 * off the room, and the refusal names the largest of them. On success
 * (also with `force`) `bytes` is claimed for `who` until
 * hs_mem_claim_release(*out), so the next consumer on the node counts it;
 * *out is set only then. */
HS_MUST_CHECK hs_status_t hs_cache_claim_room(uint64_t bytes, bool force, const char *who,
                                              hs_mem_claim_t **out);

/* Carve a slot of at least `bytes` (rounded up to 4096) out of the prepared
 * region. HS_ERR_NOSPACE when no free extent fits now (free a slot, or wait
 * for preparation, then retry); HS_ERR_INVALID when `bytes` is 0 or larger
 * than the whole cache (it can never fit). `out` is set only on success. */
HS_MUST_CHECK hs_status_t hs_cache_reserve(hs_cache_t *c, uint64_t bytes, hs_cache_slot_t *out);
/* Room in the slot table for `slots` live slots at once, so that reserve
 * and free do not grow it while no more are live (the owner's plan of its
 * most batches in the cache). HS_ERR_NOMEM (logged); the table then grows
 * as before. */
HS_MUST_CHECK hs_status_t hs_cache_plan_slots(hs_cache_t *c, uint64_t slots);
/* Give back the slot that starts at `offset`; it merges with free
 * neighbours. HS_ERR_NOT_FOUND (logged) if no live slot starts there. */
HS_MUST_CHECK hs_status_t hs_cache_free(hs_cache_t *c, uint64_t offset);
/* True when [p, p+bytes) lies entirely inside one live slot. */
bool hs_cache_contains(const hs_cache_t *c, const void *p, uint64_t bytes);

void *hs_cache_base(const hs_cache_t *c);
uint64_t hs_cache_capacity(const hs_cache_t *c);
void hs_cache_stats(const hs_cache_t *c, hs_cache_stats_t *out);

/* CUDA rejects (invalid argument) one copy whose host range spans two
 * cudaHostRegister registrations, and the cache is registered one chunk at a
 * time: copies from the cache must be split at multiples of the chunk size
 * from the base. Split copies run at full pinned speed (55 GB/s H2D measured
 * on an H200 with 256 MiB and 1 GiB chunks). */
uint64_t hs_cache_chunk_bytes(const hs_cache_t *c);
/* Queue the copy of cache bytes [offset, offset+bytes) to device memory
 * `dst` on `stream` (a cudaStream_t; NULL = the default stream), split at
 * chunk boundaries. The range must lie inside the region; the caller keeps
 * the slot alive until the stream has passed the copy. HS_ERR_CUDA (logged)
 * if a copy cannot be queued; HS_ERR_UNSUPPORTED in a build without CUDA. */
HS_MUST_CHECK hs_status_t hs_cache_copy_to_device(const hs_cache_t *c, void *dst, uint64_t offset,
                                                  uint64_t bytes, void *stream);

/* Prepare the next chunk on the calling thread (HS_CACHE_MANUAL_PREPARE).
 * Returns false when every chunk is already prepared. */
bool hs_cache_prepare_next(hs_cache_t *c);
/* Block until every chunk is prepared (or the cache is being destroyed). */
void hs_cache_wait_prepared(hs_cache_t *c);

/* Registers memory of the cache with a transport: reg(arg, addr, len) is
 * called on the calling thread, without the cache's lock held. */
typedef hs_status_t (*hs_cache_register_cb)(void *arg, void *addr, uint64_t len);
/* Registers the next piece through `reg`: the next prepared chunk, or, once
 * every chunk is registered (and there is more than one), the whole region
 * in one piece; with HS_CACHE_REGISTERED, reserve then places slots inside
 * what is registered (see the top). A registration that fails (reg logs why)
 * is passed over: slots go there all the same and move slower. Returns true
 * while there is more to register (some of it perhaps not prepared yet);
 * false once the whole region is registered. One caller at a time. */
bool hs_cache_register_next(hs_cache_t *c, hs_cache_register_cb reg, void *arg);

#ifdef __cplusplus
}
#endif
#endif /* HS_CACHE_INT_H */
