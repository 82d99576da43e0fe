/* SPDX-License-Identifier: Apache-2.0 */
/* journal.c - the resume journal; see journal_int.h. */
#include "journal_int.h"
#include "hs_log.h"
#include "hs_time.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "sched_int.h"

struct hs_journal {
    FILE *f;
    char path[512];
    bool has_header, bound;
    bool discarded; /* what was read is ignored; hs_journal_rewrite replaces it */
    uint64_t plan_hash;
    uint32_t n_batches, epochs, start_epoch;
    uint64_t (*entries)[2]; /* (epoch, batch) read at open */
    size_t n_entries, cap_entries;
    uint8_t *done; /* after bind: bitmap from start_epoch on */
    uint64_t count;
    double t_sync;
    /* The syncer thread runs fdatasync off the caller's (the trainer's)
     * thread: append only flags a sync as due, under `lock` (never held
     * across a system call). `file_lock` keeps `f` open under a sync against
     * rewrite swapping it. Without the thread (it could not start), append
     * syncs inline. */
    pthread_mutex_t lock, file_lock;
    pthread_cond_t wake;
    pthread_t syncer;
    bool syncer_running, sync_due, stopping;
    uint32_t file_rank, file_world; /* from the header (world 0: none given) */
    char file_uneven[16];
    uint32_t rank, world; /* this consumer's */
    hs_uneven_t uneven;
};

static void *syncer_main(void *arg)
{
    hs_journal_t *j = arg;
    pthread_mutex_lock(&j->lock);
    for (;;) {
        while (!j->sync_due && !j->stopping)
            pthread_cond_wait(&j->wake, &j->lock);
        if (!j->sync_due) break;
        j->sync_due = false;
        pthread_mutex_unlock(&j->lock);
        pthread_mutex_lock(&j->file_lock);
        if (fdatasync(fileno(j->f)) != 0)
            hs_warn("journal %s: fdatasync failed: %m (the lines are written; a power loss may "
                    "lose the last second of them)",
                    j->path);
        pthread_mutex_unlock(&j->file_lock);
        pthread_mutex_lock(&j->lock);
    }
    pthread_mutex_unlock(&j->lock);
    return NULL;
}

/* Starts the syncer once; if it cannot start, append syncs inline. */
static void syncer_start(hs_journal_t *j)
{
    if (j->syncer_running) return;
    int e = pthread_create(&j->syncer, NULL, syncer_main, j);
    if (e != 0) {
        errno = e;
        hs_warn("journal %s: cannot start its sync thread: %m; the trainer's thread syncs the "
                "file instead",
                j->path);
        return;
    }
    j->syncer_running = true;
}

static void syncer_stop(hs_journal_t *j)
{
    if (!j->syncer_running) return;
    pthread_mutex_lock(&j->lock);
    j->stopping = true;
    pthread_cond_signal(&j->wake);
    pthread_mutex_unlock(&j->lock);
    pthread_join(j->syncer, NULL);
    j->syncer_running = false;
}

/* " rank=R world=W uneven=U" for a header, or "" for one rank. */
static const char *journal_shard_str(const hs_journal_t *j, char *buf, size_t cap)
{
    if (j->world > 1)
        snprintf(buf, cap, " rank=%u world=%u uneven=%s", j->rank, j->world,
                 hs_shard_uneven_str((hs_shard_uneven_t)j->uneven));
    else
        buf[0] = 0;
    return buf;
}

hs_status_t hs_journal_set_shard(hs_journal_t *j, uint32_t rank, uint32_t world,
                                 hs_consumer_uneven_t uneven, char *why, size_t whycap)
{
    uint32_t w = world ? world : 1, fw = j->file_world ? j->file_world : 1;
    const char *u = hs_shard_uneven_str((hs_shard_uneven_t)uneven);
    if (j->has_header && !j->discarded &&
        (j->file_rank != rank || fw != w || (w > 1 && strcmp(j->file_uneven, u) != 0))) {
        snprintf(why, whycap,
                 "journal %s belongs to rank %u of %u (--uneven %s), this consumer is rank %u of "
                 "%u (--uneven %s): give each rank its own --journal",
                 j->path, j->file_rank, fw, fw > 1 ? j->file_uneven : "drop", rank, w, u);
        return HS_ERR_MISMATCH;
    }
    j->rank = rank;
    j->world = w;
    j->uneven = uneven;
    return HS_OK;
}

static hs_status_t read_existing(hs_journal_t *j, FILE *f)
{
    char line[256];
    unsigned long lineno = 0;
    while (fgets(line, sizeof(line), f)) {
        lineno++;
        size_t len = strlen(line);
        bool complete = len && line[len - 1] == '\n';
        if (!complete) {
            if (!feof(f)) {
                hs_error("journal %s:%lu: line too long; this is not an hsflow journal", j->path,
                         lineno);
                return HS_ERR_FORMAT;
            }
            hs_warn("journal %s:%lu: last line cut short (a crash while writing?); ignoring it",
                    j->path, lineno);
            break;
        }
        if (lineno == 1) {
            unsigned long long plan;
            unsigned batches;
            int version, used = 0;
            if (sscanf(line, "hsflow-journal %d plan=%16llx batches=%u%n", &version, &plan,
                       &batches, &used) != 3 ||
                version != 1 || batches == 0) {
                hs_error("journal %s:1: not an hsflow journal header (expected \"hsflow-journal 1 "
                         "plan=... batches=...\"); move the file away or give another --journal",
                         j->path);
                return HS_ERR_FORMAT;
            }
            unsigned rk, wd;
            char un[16];
            if (sscanf(line + used, " rank=%u world=%u uneven=%15s", &rk, &wd, un) == 3) {
                if (wd == 0 || rk >= wd) {
                    hs_error("journal %s:1: rank %u of %u in the header is not a rank; move the "
                             "file away or give another --journal",
                             j->path, rk, wd);
                    return HS_ERR_FORMAT;
                }
                j->file_rank = rk;
                j->file_world = wd;
                snprintf(j->file_uneven, sizeof(j->file_uneven), "%s", un);
            }
            j->has_header = true;
            j->plan_hash = plan;
            j->n_batches = batches;
            continue;
        }
        unsigned long e, b;
        char *end;
        errno = 0;
        e = strtoul(line, &end, 10);
        char *p = end;
        b = strtoul(p, &end, 10);
        if (errno || end == p || (*end != '\n') || e > 1000000 || b >= j->n_batches) {
            hs_error("journal %s:%lu: expected \"<epoch> <batch>\" with batch < %u, got \"%.*s\"",
                     j->path, lineno, j->n_batches, (int)(len - 1), line);
            return HS_ERR_FORMAT;
        }
        if (j->n_entries == j->cap_entries) {
            size_t ncap = j->cap_entries ? j->cap_entries * 2 : 1024;
            void *n = realloc(j->entries, ncap * sizeof(*j->entries));
            if (!n) return HS_ERR_NOMEM;
            j->entries = n;
            j->cap_entries = ncap;
        }
        j->entries[j->n_entries][0] = e;
        j->entries[j->n_entries][1] = b;
        j->n_entries++;
    }
    return HS_OK;
}

hs_status_t hs_journal_open(const char *path, hs_journal_t **out)
{
    hs_journal_t *j = calloc(1, sizeof(*j));
    if (!j) return HS_ERR_NOMEM;
    pthread_mutex_init(&j->lock, NULL);
    pthread_mutex_init(&j->file_lock, NULL);
    pthread_cond_init(&j->wake, NULL);
    snprintf(j->path, sizeof(j->path), "%s", path);
    hs_status_t st = HS_OK;
    FILE *r = fopen(path, "r");
    if (r) {
        st = read_existing(j, r);
        fclose(r);
        if (st != HS_OK) goto err;
    } else if (errno != ENOENT) {
        hs_error("journal %s: cannot read it: %m", path);
        st = HS_ERR_IO;
        goto err;
    }
    j->f = fopen(path, "a");
    if (!j->f) {
        hs_error("journal %s: cannot open it for appending: %m", path);
        st = HS_ERR_IO;
        goto err;
    }
    if (j->has_header)
        hs_info("journal %s: %zu released batch(es) of plan %016" PRIx64 " to skip", path,
                j->n_entries, j->plan_hash);
    *out = j;
    return HS_OK;
err:
    pthread_cond_destroy(&j->wake);
    pthread_mutex_destroy(&j->file_lock);
    pthread_mutex_destroy(&j->lock);
    free(j->entries);
    free(j);
    return st;
}

void hs_journal_close(hs_journal_t *j)
{
    if (!j) return;
    syncer_stop(j);
    if (j->f) {
        fflush(j->f);
        fdatasync(fileno(j->f));
        fclose(j->f);
    }
    pthread_cond_destroy(&j->wake);
    pthread_mutex_destroy(&j->file_lock);
    pthread_mutex_destroy(&j->lock);
    free(j->entries);
    free(j->done);
    free(j);
}

hs_status_t hs_journal_check(const hs_journal_t *j, uint64_t plan_hash, uint32_t n_batches,
                             char *why, size_t whycap)
{
    if (j->has_header && !j->discarded &&
        (j->plan_hash != plan_hash || j->n_batches != n_batches)) {
        snprintf(why, whycap,
                 "journal %s was written for plan %016" PRIx64 " (%u batches/epoch), the producer "
                 "offers plan %016" PRIx64 " (%u): start the producers with that run's data and "
                 "flags, or move the journal away to start afresh",
                 j->path, j->plan_hash, j->n_batches, plan_hash, n_batches);
        return HS_ERR_MISMATCH;
    }
    return HS_OK;
}

hs_status_t hs_journal_bind(hs_journal_t *j, uint64_t plan_hash, uint32_t n_batches,
                            uint32_t epochs, char *why, size_t whycap)
{
    hs_status_t st = hs_journal_check(j, plan_hash, n_batches, why, whycap);
    if (st != HS_OK) return st;
    for (size_t i = 0; i < j->n_entries; i++)
        if (j->entries[i][0] >= epochs) {
            snprintf(why, whycap,
                     "journal %s has a batch of epoch %" PRIu64 ", this run has %u "
                     "epoch(s): give --epochs %" PRIu64 " or more",
                     j->path, j->entries[i][0], epochs, j->entries[i][0] + 1);
            return HS_ERR_MISMATCH;
        }
    /* An epoch is finished when it holds every batch of it, each once: a
     * line repeated would count for a batch that was never released. */
    uint64_t *per_epoch = calloc(epochs, sizeof(uint64_t));
    uint8_t *seen = calloc((uint64_t)epochs * n_batches / 8 + 1, 1);
    if (!per_epoch || !seen) {
        free(per_epoch);
        free(seen);
        return HS_ERR_NOMEM;
    }
    for (size_t i = 0; i < j->n_entries; i++) {
        uint64_t e = j->entries[i][0], bit = e * n_batches + j->entries[i][1];
        if (seen[bit / 8] >> (bit % 8) & 1) {
            snprintf(why, whycap,
                     "journal %s records batch %" PRIu64 " of epoch %" PRIu64 " twice (entry %zu): "
                     "a journal holds each released batch once, so this one was damaged or "
                     "written by another process; move it away to start afresh, or resume from "
                     "the trainer's checkpoint (--resume-state)",
                     j->path, j->entries[i][1], e, i + 1);
            free(per_epoch);
            free(seen);
            return HS_ERR_FORMAT;
        }
        seen[bit / 8] |= (uint8_t)(1u << (bit % 8));
        per_epoch[e]++;
    }
    free(seen);
    uint32_t start = 0, want = j->world > 1 ? hs_shard_per_rank(n_batches, j->world,
                                                                (hs_shard_uneven_t)j->uneven)
                                            : n_batches;
    while (start < epochs && per_epoch[start] >= want)
        start++;
    free(per_epoch);
    uint64_t bits = (uint64_t)(epochs - start) * n_batches;
    free(j->done);
    j->done = calloc(bits / 8 + 1, 1);
    if (!j->done) return HS_ERR_NOMEM;
    j->count = 0;
    for (size_t i = 0; i < j->n_entries; i++) {
        uint64_t e = j->entries[i][0], b = j->entries[i][1];
        if (e < start) {
            j->count++;
            continue;
        }
        uint64_t bit = (e - start) * n_batches + b;
        if (!(j->done[bit / 8] >> (bit % 8) & 1)) {
            j->done[bit / 8] |= (uint8_t)(1u << (bit % 8));
            j->count++;
        }
    }
    if (!j->has_header && !j->discarded) {
        char sh[96];
        fprintf(j->f, "hsflow-journal 1 plan=%016" PRIx64 " batches=%u%s\n", plan_hash, n_batches,
                journal_shard_str(j, sh, sizeof(sh)));
        fflush(j->f);
        j->has_header = true;
    }
    j->plan_hash = plan_hash;
    j->n_batches = n_batches;
    j->start_epoch = start;
    j->epochs = epochs;
    j->bound = true;
    syncer_start(j);
    return HS_OK;
}

uint32_t hs_journal_start_epoch(const hs_journal_t *j) { return j->start_epoch; }
uint64_t hs_journal_count(const hs_journal_t *j) { return j->count; }
const uint8_t *hs_journal_done(const hs_journal_t *j) { return j->done; }

hs_status_t hs_journal_append(hs_journal_t *j, uint32_t epoch, uint32_t batch)
{
    if (!j->bound) return HS_ERR_INVALID;
    if (epoch >= j->epochs || batch >= j->n_batches) { /* a line no restart could read */
        hs_error("journal %s: batch %u of epoch %u is not in the run (%u epochs of %u batches); "
                 "not recorded",
                 j->path, batch, epoch, j->epochs, j->n_batches);
        return HS_ERR_INVALID;
    }
    uint64_t bit = (uint64_t)(epoch - j->start_epoch) * j->n_batches + batch;
    if (epoch < j->start_epoch || (j->done[bit / 8] >> (bit % 8) & 1)) {
        hs_error("journal %s: batch %u of epoch %u is recorded as released already; not recorded "
                 "again",
                 j->path, batch, epoch);
        return HS_ERR_INVALID;
    }
    if (fprintf(j->f, "%u %u\n", epoch, batch) < 0 || fflush(j->f) != 0) {
        hs_error("journal %s: write failed: %m (the run goes on; a restart may repeat batches)",
                 j->path);
        return HS_ERR_IO;
    }
    j->done[bit / 8] |= (uint8_t)(1u << (bit % 8));
    j->count++;
    double now = hs_now_s();
    if (now - j->t_sync >= 1.0) {
        j->t_sync = now;
        if (j->syncer_running) {
            pthread_mutex_lock(&j->lock);
            j->sync_due = true;
            pthread_cond_signal(&j->wake);
            pthread_mutex_unlock(&j->lock);
        } else {
            fdatasync(fileno(j->f));
        }
    }
    return HS_OK;
}

void hs_journal_discard(hs_journal_t *j)
{
    if (j->n_entries || j->has_header)
        hs_info("journal %s: its %zu entries give way to the resume state; it will be rewritten "
                "to match the state once the plan is known",
                j->path, j->n_entries);
    j->n_entries = 0;
    j->has_header = false;
    j->discarded = true;
}

hs_status_t hs_journal_rewrite(hs_journal_t *j, const hs_state_t *s)
{
    if (!j->bound || !hs_state_has_plan(s) || hs_state_n_batches(s) != j->n_batches)
        return HS_ERR_INVALID;
    char tmp[sizeof(j->path) + 8];
    snprintf(tmp, sizeof(tmp), "%s.tmp", j->path);
    FILE *f = fopen(tmp, "w");
    if (!f) {
        hs_error("journal %s: cannot write it: %m", tmp);
        return HS_ERR_IO;
    }
    uint32_t n = j->n_batches, epochs_done = hs_state_epochs_done(s);
    char sh[96];
    bool bad = fprintf(f, "hsflow-journal 1 plan=%016" PRIx64 " batches=%u%s\n",
                       hs_state_plan_hash(s), n, journal_shard_str(j, sh, sizeof(sh))) < 0;
    for (uint32_t e = 0; e < epochs_done && !bad; e++)
        for (uint32_t b = 0; b < n; b++)
            bad |= fprintf(f, "%u %u\n", e, b) < 0;
    for (uint32_t e = epochs_done; e < j->epochs && !bad; e++)
        for (uint32_t b = 0; b < n; b++)
            if (hs_state_has(s, e, b)) bad |= fprintf(f, "%u %u\n", e, b) < 0;
    bad |= fflush(f) != 0;
    bad |= fsync(fileno(f)) != 0;
    bad |= fclose(f) != 0;
    if (bad || rename(tmp, j->path) != 0) {
        hs_error("journal %s: cannot rewrite it: %m (the run goes on; the journal is not "
                 "updated)",
                 j->path);
        unlink(tmp);
        return HS_ERR_IO;
    }
    FILE *nf = fopen(j->path, "a");
    if (!nf) {
        hs_error("journal %s: cannot open it for appending: %m", j->path);
        return HS_ERR_IO;
    }
    uint8_t *done = hs_state_done_bits(s);
    if (!done) {
        fclose(nf);
        return HS_ERR_NOMEM;
    }
    pthread_mutex_lock(&j->file_lock);
    fclose(j->f);
    j->f = nf;
    pthread_mutex_unlock(&j->file_lock);
    free(j->done);
    j->done = done;
    j->start_epoch = epochs_done;
    j->count = hs_state_delivered(s);
    j->has_header = true;
    j->discarded = false;
    j->plan_hash = hs_state_plan_hash(s);
    hs_info("journal %s: rewritten to the resume state's %llu batch(es)", j->path,
            (unsigned long long)j->count);
    return HS_OK;
}
