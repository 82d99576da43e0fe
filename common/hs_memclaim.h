/* SPDX-License-Identifier: Apache-2.0 */
/* hs_memclaim.h - memory this process may take: the system's and
 * cgroup's limits, and the node's registry of memory promised to caches.
 *
 * Ownership: the limits fill a struct the caller owns; a claim from
 * hs_mem_claim_open() is the caller's, released with hs_mem_claim_release(),
 * and the text it returns is valid until then. */
#ifndef HS_MEMCLAIM_H
#define HS_MEMCLAIM_H

#include <stdint.h>

#include "hsflow.h"

#ifdef __cplusplus
extern "C" {
#endif

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

#ifdef __cplusplus
}
#endif

#endif /* HS_MEMCLAIM_H */
