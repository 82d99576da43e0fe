/* SPDX-License-Identifier: Apache-2.0 */
/* sysmem.c - how much memory this process may still take: MemAvailable from
 * /proc/meminfo and the tightest memory limit of its cgroup and the cgroup's
 * parents (v2 memory.max / memory.current, v1 memory.limit_in_bytes /
 * memory.usage_in_bytes), less the inactive page cache the kernel would
 * reclaim before it kills anything. */
#include "hsflow.h"
#include "hs_memclaim.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The first u64 of a file ("max" and unreadable files give UINT64_MAX). */
static uint64_t read_u64_file(const char *path)
{
    FILE *f = fopen(path, "r");
    if (!f) return UINT64_MAX;
    uint64_t v;
    int ok = fscanf(f, "%" SCNu64, &v) == 1;
    fclose(f);
    return ok ? v : UINT64_MAX;
}

/* `key value` from a memory.stat or meminfo style file, 0 when absent. */
static uint64_t read_key(const char *path, const char *key)
{
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    char line[256];
    size_t klen = strlen(key);
    uint64_t v = 0;
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, key, klen) == 0 && (line[klen] == ' ' || line[klen] == ':')) {
            char *p = line + klen + 1;
            v = strtoull(p, NULL, 10);
            break;
        }
    }
    fclose(f);
    return v;
}

/* This process's cgroup path: v2 ("0::/a/b") when `v1` is false, else the
 * v1 hierarchy holding the memory controller ("7:memory:/a/b"). */
static bool own_cgroup(const char *root, bool v1, char *out, size_t cap)
{
    char path[512];
    snprintf(path, sizeof path, "%s/proc/self/cgroup", root);
    FILE *f = fopen(path, "r");
    if (!f) return false;
    char line[1024];
    bool found = false;
    while (!found && fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = 0;
        char *c1 = strchr(line, ':'), *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
        if (!c2) continue;
        *c1 = *c2 = 0;
        const char *ctrls = c1 + 1;
        if (!v1 && !strcmp(line, "0") && !*ctrls) {
            found = true;
        } else if (v1) {
            char list[256];
            snprintf(list, sizeof list, ",%s,", ctrls);
            found = strstr(list, ",memory,") != NULL;
        }
        if (found) snprintf(out, cap, "%s", c2 + 1);
    }
    fclose(f);
    return found;
}

/* Walks from the cgroup at base+rel up to base and keeps the level that
 * leaves the least room. */
static void walk_levels(const char *base, const char *rel, bool v1, hs_mem_limits_t *m)
{
    const char *lim_name = v1 ? "memory.limit_in_bytes" : "memory.max";
    const char *use_name = v1 ? "memory.usage_in_bytes" : "memory.current";
    const char *inactive = v1 ? "total_inactive_file" : "inactive_file";
    char cg[512], path[768];
    snprintf(cg, sizeof cg, "%s", rel);
    uint64_t best_room = UINT64_MAX;
    for (;;) {
        size_t len = strlen(cg);
        while (len > 0 && cg[len - 1] == '/')
            cg[--len] = 0; /* "" is the hierarchy's root, else "/a/b" */
        snprintf(path, sizeof path, "%s%s/%s", base, cg, lim_name);
        uint64_t limit = read_u64_file(path);
        if (limit != UINT64_MAX && limit < (1ull << 62)) { /* v1 says "no limit" with ~2^63 */
            char upath[768], spath[768];
            snprintf(upath, sizeof upath, "%s%s/%s", base, cg, use_name);
            snprintf(spath, sizeof spath, "%s%s/memory.stat", base, cg);
            uint64_t used = read_u64_file(upath);
            if (used == UINT64_MAX) used = 0;
            uint64_t reclaimable = read_key(spath, inactive);
            used = used > reclaimable ? used - reclaimable : 0;
            uint64_t room = limit > used ? limit - used : 0;
            if (room < best_room) {
                best_room = room;
                m->cgroup_limit = limit;
                m->cgroup_used = used;
                snprintf(m->cgroup_file, sizeof m->cgroup_file, "%.511s", path);
            }
        }
        char *slash = strrchr(cg, '/');
        if (len == 0 || !slash) break;
        *slash = 0; /* one level up */
    }
}

void hs_mem_limits_at(const char *root, hs_mem_limits_t *out)
{
    memset(out, 0, sizeof(*out));
    char path[768], rel[512];
    snprintf(path, sizeof path, "%s/proc/meminfo", root);
    out->mem_available = read_key(path, "MemAvailable") * 1024; /* kB */
    if (own_cgroup(root, false, rel, sizeof rel)) {
        snprintf(path, sizeof path, "%.500s/sys/fs/cgroup", root);
        walk_levels(path, rel, false, out);
    }
    if (!out->cgroup_limit && own_cgroup(root, true, rel, sizeof rel)) {
        snprintf(path, sizeof path, "%.500s/sys/fs/cgroup/memory", root);
        walk_levels(path, rel, true, out);
    }
}

static char g_sys_root[512]; /* "" = the real system */

void hsflow_set_system_root(const char *root)
{
    snprintf(g_sys_root, sizeof g_sys_root, "%s", root ? root : "");
}

const char *hs_sys_root(void) { return g_sys_root; }

void hs_mem_limits(hs_mem_limits_t *out) { hs_mem_limits_at(g_sys_root, out); }

uint64_t hs_mem_room(const hs_mem_limits_t *m)
{
    uint64_t room = m->mem_available ? m->mem_available : UINT64_MAX;
    if (m->cgroup_limit) {
        uint64_t cg = m->cgroup_limit > m->cgroup_used ? m->cgroup_limit - m->cgroup_used : 0;
        if (cg < room) room = cg;
    }
    return room;
}
