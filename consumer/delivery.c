/* SPDX-License-Identifier: Apache-2.0 */
/* delivery.c - the trainer's side: hs_consumer_next() and release() take
 * batches off the delivery queue the network thread fills, straight from
 * their cache slots or through the GPU's two device buffers, and give the
 * slots back; hs_consumer_unget() takes back a batch that never reached the
 * trainer; hs_consumer_state_save() writes the position. */
#include "consumer_int.h"
#include "hs_log.h"
#include "hs_time.h"
#include "hs_memory.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ---- the network thread's side ---------------------------------------------- */

/* Room for ncap batches in the ready ring, keeping their order; under lock. */
static hs_status_t ready_grow(hs__consumer_delivery_t *d, uint32_t ncap)
{
    hs_sched_item_t *q = malloc(ncap * sizeof(*q));
    if (!q) return HS_ERR_NOMEM;
    for (uint32_t i = 0; i < d->ready_n; i++)
        q[i] = d->ready[(d->ready_head + i) % d->ready_cap];
    free(d->ready);
    d->ready = q;
    d->ready_cap = ncap;
    d->ready_head = 0;
    return HS_OK;
}

/* Room for ncap released tickets; under lock. */
static hs_status_t released_grow(hs__consumer_delivery_t *d, uint32_t ncap)
{
    uint64_t *r = realloc(d->released, ncap * sizeof(uint64_t));
    if (!r) return HS_ERR_NOMEM;
    d->released = r;
    d->released_cap = ncap;
    return HS_OK;
}

hs_status_t hs__delivery_plan(hs_consumer_t *c, uint32_t batches)
{
    hs__consumer_delivery_t *d = &c->delivery;
    hs_status_t st = HS_OK;
    pthread_mutex_lock(&d->lock);
    if (batches > d->ready_cap) st = ready_grow(d, batches);
    if (st == HS_OK && batches > d->released_cap) st = released_grow(d, batches);
    pthread_mutex_unlock(&d->lock);
    if (st != HS_OK) hs_error("out of memory for delivery queues of %u batches", batches);
    return st;
}

bool hs__delivery_push(hs_consumer_t *c, const hs_sched_item_t *it)
{
    hs__consumer_delivery_t *d = &c->delivery;
    pthread_mutex_lock(&d->lock);
    /* Grows rarely: the ring never holds more batches than the cache. */
    if (d->ready_n == d->ready_cap && ready_grow(d, d->ready_cap ? d->ready_cap * 2 : 64)) {
        pthread_mutex_unlock(&d->lock);
        hs_warn("out of memory growing the delivery queue; retrying");
        return false;
    }
    d->ready[(d->ready_head + d->ready_n++) % d->ready_cap] = *it;
    pthread_mutex_unlock(&d->lock);
    return true;
}

void hs__delivery_finish(hs_consumer_t *c)
{
    pthread_mutex_lock(&c->delivery.lock);
    c->delivery.finished = true;
    pthread_mutex_unlock(&c->delivery.lock);
    pthread_cond_broadcast(&c->delivery.cond);
}

/* Retires the scheduler records of batches the trainer released. */
void hs__released_collect(hs_consumer_t *c)
{
    uint64_t tickets[256];
    uint32_t n;
    do {
        pthread_mutex_lock(&c->delivery.lock);
        n = c->delivery.released_n < 256 ? c->delivery.released_n : 256;
        c->delivery.released_n -= n;
        if (n) memcpy(tickets, c->delivery.released + c->delivery.released_n, n * sizeof(uint64_t));
        pthread_mutex_unlock(&c->delivery.lock);
        for (uint32_t i = 0; i < n; i++)
            if (hs_sched_release(c->net.sched, tickets[i]) != HS_OK)
                hs_error("consumer: released ticket %llu is not one the scheduler handed out",
                         (unsigned long long)tickets[i]);
    } while (n == 256);
}

/* Takes the next deliverable batch off the ready ring, waiting up to
 * timeout_ms (-1 forever, 0 not at all). Counts the wait as trainer starve. */
static hs_status_t ready_pop(hs_consumer_t *c, hs_sched_item_t *it, int timeout_ms)
{
    double t0 = hs_now_s();
    struct timespec dl;
    clock_gettime(CLOCK_REALTIME, &dl);
    if (timeout_ms > 0) {
        dl.tv_sec += timeout_ms / 1000;
        dl.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
        if (dl.tv_nsec >= 1000000000L) {
            dl.tv_sec++;
            dl.tv_nsec -= 1000000000L;
        }
    }
    hs_status_t st = HS_OK;
    pthread_mutex_lock(&c->delivery.lock);
    c->delivery.t_wait = t0; /* the figures count a wait in progress */
    while (!c->delivery.ready_n || c->delivery.halted) {
        if (c->delivery.finished || c->stop || c->delivery.halted) {
            st = c->fatal[0] ? HS_ERR_NOSPACE : HS_ERR_CLOSED;
            if (c->delivery.t_end == 0) c->delivery.t_end = hs_now_s();
            break;
        }
        if (timeout_ms == 0) {
            st = HS_ERR_TIMEOUT;
            break;
        }
        if (timeout_ms < 0)
            pthread_cond_wait(&c->delivery.cond, &c->delivery.lock);
        else if (pthread_cond_timedwait(&c->delivery.cond, &c->delivery.lock, &dl) == ETIMEDOUT) {
            st = HS_ERR_TIMEOUT;
            break;
        }
    }
    c->delivery.t_wait = 0;
    if (c->delivery.t_start > 0)
        c->delivery.starve_s += hs_now_s() - (t0 > c->delivery.t_start ? t0 : c->delivery.t_start);
    if (st == HS_OK) {
        *it = c->delivery.ready[c->delivery.ready_head];
        c->delivery.ready_head = (c->delivery.ready_head + 1) % c->delivery.ready_cap;
        c->delivery.ready_n--;
    }
    pthread_mutex_unlock(&c->delivery.lock);
    return st;
}

/* ---- batches the trainer holds ----------------------------------------------- */

/* Records a batch handed to the trainer; HS_ERR_NOMEM (logged) when there is
 * no room for it: the caller does not hand it out. */
static hs_status_t handed_add(hs_consumer_t *c, const hs_sched_item_t *it, uint16_t *rows)
{
    hs__consumer_handed_t *h = &c->handed;
    if (h->n == h->cap) {
        uint32_t ncap = h->cap ? h->cap * 2 : 16;
        hs__handed_t *v = realloc(h->v, ncap * sizeof(*v));
        if (!v) {
            hs_error("out of memory recording the batches the trainer holds (%u)", h->n);
            return HS_ERR_NOMEM;
        }
        h->v = v;
        h->cap = ncap;
    }
    h->v[h->n++] = (hs__handed_t){it->ticket, it->slot_offset, it->epoch, it->batch, rows};
    return HS_OK;
}

/* Host delivery of an fp8 run: a buffer for one batch's bf16 rows, from
 * those released before or new (only when the trainer holds more batches
 * at once than ever); NULL (logged) when out of memory. */
static uint16_t *rows_get(hs_consumer_t *c)
{
    hs__consumer_handed_t *h = &c->handed;
    if (h->n_free) return h->free_rows[--h->n_free];
    if (h->n_rows == h->cap_rows) {
        uint32_t ncap = h->cap_rows ? h->cap_rows * 2 : 4;
        uint16_t **f = realloc(h->free_rows, ncap * sizeof(*f));
        if (!f) return NULL;
        h->free_rows = f;
        h->cap_rows = ncap;
    }
    uint64_t bytes = (uint64_t)c->run.token_budget * hs_layout_row_elems(&c->run.layout) * 2;
    uint16_t *r = hs_aligned_alloc(256, bytes);
    if (!r) {
        hs_error("out of memory for %.1f MiB of dequantised rows", (double)bytes / (1 << 20));
        return NULL;
    }
    h->n_rows++;
    return r;
}

/* Gives a buffer of rows_get() back (NULL: nothing). There is room: the
 * list holds at most the n_rows buffers ever made. */
static void rows_put(hs_consumer_t *c, uint16_t *rows)
{
    if (rows) c->handed.free_rows[c->handed.n_free++] = rows;
}

/* Takes the record of the batch `b` names off the list into *out: it must
 * be one handed out and not released, ticket, epoch, batch and (on the host)
 * slot alike. HS_ERR_INVALID (logged) otherwise, the list unchanged. */
/* The index in the list of the record of the batch `b` names (its ticket),
 * -1 when none; *same: whether its epoch, batch and (on the host) slot are
 * those of the record. */
static int64_t handed_find(const hs_consumer_t *c, const hs_batch_t *b, bool *same)
{
    const hs__consumer_handed_t *h = &c->handed;
    for (uint32_t i = 0; i < h->n; i++) {
        const hs__handed_t *r = &h->v[i];
        if (r->ticket != b->ticket) continue;
        *same = r->epoch == b->epoch && r->batch == b->batch &&
                (b->on_device || r->slot_offset == b->handle);
        return i;
    }
    return -1;
}

/* Whether `b` is the batch hs_consumer_unget() gave back. */
static bool is_held(const hs_consumer_t *c, const hs_batch_t *b)
{
    return c->handed.has_held && c->handed.held.ticket == b->ticket;
}

static hs_status_t handed_take(hs_consumer_t *c, const hs_batch_t *b, hs__handed_t *out)
{
    hs__consumer_handed_t *h = &c->handed;
    bool same;
    int64_t i = handed_find(c, b, &same);
    if (i < 0) {
        hs_error("release of batch %u of epoch %u (ticket %llu), which the trainer does not "
                 "hold: it was released already or never handed out; nothing was freed or "
                 "recorded",
                 b->batch, b->epoch, (unsigned long long)b->ticket);
        return HS_ERR_INVALID;
    }
    if (!same) {
        hs_error("release of batch %u of epoch %u with the identity of batch %u of epoch %u "
                 "(ticket %llu): pass the hs_batch_t that hs_consumer_next() filled, unchanged",
                 b->batch, b->epoch, h->v[i].batch, h->v[i].epoch, (unsigned long long)b->ticket);
        return HS_ERR_INVALID;
    }
    if (is_held(c, b)) {
        hs_error("release of batch %u of epoch %u, which hs_consumer_unget() gave back: it never "
                 "reached the trainer, and the next hs_consumer_next() hands it out again; "
                 "nothing was freed or recorded",
                 b->batch, b->epoch);
        return HS_ERR_INVALID;
    }
    *out = h->v[i];
    h->v[i] = h->v[--h->n];
    return HS_OK;
}

/* Puts a batch taken by ready_pop() back at the front of the ring (it could
 * not be handed out); the ring has room, as it just held it. */
static void ready_unpop(hs_consumer_t *c, const hs_sched_item_t *it)
{
    pthread_mutex_lock(&c->delivery.lock);
    c->delivery.ready_head =
        (c->delivery.ready_head + c->delivery.ready_cap - 1) % c->delivery.ready_cap;
    c->delivery.ready[c->delivery.ready_head] = *it;
    c->delivery.ready_n++;
    pthread_mutex_unlock(&c->delivery.lock);
}

/* An fp8 run's batches reach the trainer as bf16 rows (dequantised). */
static bool dequantising(const hs_consumer_t *c)
{
    return c->run.layout.dtype == HS_DTYPE_FP8 && c->cfg.deliver != HS_HIDDEN_FP8;
}

/* The hs_batch_t of the batch in `region`; `rows`: its dequantised bf16
 * rows (fp8 run delivered as bf16), else NULL. */
static void batch_from_view(hs_consumer_t *c, const hs_sched_item_t *it, uint8_t *region,
                            const uint16_t *rows, hs_batch_t *out)
{
    hs_batch_view_t v = hs_batch_view(region, it->n_seqs, it->n_tokens, &c->run.layout);
    memset(out, 0, sizeof(*out));
    out->epoch = it->epoch;
    out->batch = it->batch;
    out->n_seqs = it->n_seqs;
    out->n_tokens = it->n_tokens;
    out->hidden_size = c->run.layout.hidden_size;
    out->n_layers = c->run.layout.n_layers;
    out->layers = c->run.layout.layers;
    out->cu_seqlens = v.cu_seqlens;
    out->sample_ids = v.sample_ids;
    out->input_ids = v.input_ids;
    out->loss_mask = v.loss_mask;
    out->hidden = rows ? rows : v.hidden;
    out->hidden_dtype = out->hidden ? HS_HIDDEN_BF16 : HS_HIDDEN_FP8;
    if (!out->hidden) {
        out->hidden_fp8 = v.hidden_fp8;
        out->hidden_scales = v.scales;
    }
    out->bytes = it->bytes;
    out->handle = it->slot_offset;
    out->ticket = it->ticket;
}

/* The cache slot of a batch is free again: give it back and tell the
 * network thread (from the trainer, or from the copy stream's callback).
 * HS_ERR_NOT_FOUND (logged) for an offset where no slot in use starts. */
static hs_status_t slot_done(hs_consumer_t *c, uint64_t offset, uint64_t ticket)
{
    /* A slot the store's writer still reads is freed by the writer. */
    if (!(c->store && hs_store_slot_release(c->store, offset))) {
        hs_status_t st = hs_cache_free(c->cache, offset);
        if (st != HS_OK) return st; /* nothing was given back: nothing to tell */
    }
    pthread_mutex_lock(&c->delivery.lock);
    if (c->delivery.released_n == c->delivery.released_cap)
        (void)released_grow(&c->delivery,
                            c->delivery.released_cap ? c->delivery.released_cap * 2 : 64);
    if (c->delivery.released_n < c->delivery.released_cap)
        c->delivery.released[c->delivery.released_n++] = ticket;
    pthread_mutex_unlock(&c->delivery.lock);
    hs_tp_wakeup(c->tp); /* room for new tickets */
    return HS_OK;
}

static void gpu_copied(void *arg)
{
    gpu_copy_done_t *d = arg;
    if (slot_done(d->c, d->slot_offset, d->ticket) != HS_OK)
        hs_error("gpu delivery: the copied batch's slot was not in use (ticket %llu)",
                 (unsigned long long)d->ticket);
}

/* Starts the H2D copy of `it` into device buffer `buf`. */
static hs_status_t gpu_start_copy(hs_consumer_t *c, int buf, const hs_sched_item_t *it)
{
    uint64_t max_bytes;
    pthread_mutex_lock(&c->delivery.lock);
    max_bytes = c->delivery.max_batch_bytes;
    pthread_mutex_unlock(&c->delivery.lock);
    hs_status_t st = hs__loader_reserve(c->gpu.loader, max_bytes);
    if (st != HS_OK) return st;
    hs__loader_fp8_t fp8, *dq = NULL;
    if (dequantising(c)) {
        const hs_layout_t *l = &c->run.layout;
        hs_batch_offsets_t o = hs_batch_offsets(it->n_seqs, it->n_tokens, l);
        fp8 = (hs__loader_fp8_t){o.hidden, o.scales, it->n_tokens, (int64_t)hs_layout_row_elems(l)};
        dq = &fp8;
        st = hs__loader_reserve_rows(c->gpu.loader,
                                     (uint64_t)c->run.token_budget * hs_layout_row_elems(l) * 2);
        if (st != HS_OK) return st;
    }
    c->gpu.item[buf] = *it;
    /* The copy's callback may run after this buffer has been refilled, so it
     * gets its own record of the slot to free (a small ring: at most two
     * copies are queued at once). */
    gpu_copy_done_t *d = &c->gpu.done[c->gpu.done_next++ % HS_GPU_DONE_RING];
    *d = (gpu_copy_done_t){c, it->slot_offset, it->ticket};
    st = hs__loader_copy(c->gpu.loader, buf, c->cache, it->slot_offset, it->bytes, dq, gpu_copied,
                         d);
    if (st == HS_OK) c->gpu.inflight = buf;
    return st;
}

static hs_status_t next_gpu(hs_consumer_t *c, hs_batch_t *out, int timeout_ms)
{
    hs_status_t st;
    if (c->gpu.cur >= 0) { /* taking the next batch ends the previous one */
        int prev = c->gpu.cur;
        c->gpu.cur = -1;
        st = hs__loader_consumed(c->gpu.loader, prev);
        if (st != HS_OK) return st; /* a CUDA failure, logged */
    }
    if (c->gpu.inflight < 0) {
        hs_sched_item_t it;
        st = ready_pop(c, &it, timeout_ms);
        if (st != HS_OK) return st;
        st = gpu_start_copy(c, c->gpu.last == 0 ? 1 : 0, &it);
        if (st != HS_OK) return st;
    }
    int buf = c->gpu.inflight;
    void *dptr, *drows;
    st = hs__loader_hand_over(c->gpu.loader, buf, &dptr, &drows);
    if (st != HS_OK) return st;
    if ((st = handed_add(c, &c->gpu.item[buf], NULL)) != HS_OK) return st;
    c->gpu.inflight = -1;
    c->gpu.cur = c->gpu.last = buf;
    batch_from_view(c, &c->gpu.item[buf], dptr, dequantising(c) ? drows : NULL, out);
    out->on_device = true;
    out->handle = (uint64_t)buf;
    /* Counted as soon as it is handed out (hs_consumer_unget() undoes this),
     * even when the prefetch below fails. */
    pthread_mutex_lock(&c->delivery.lock);
    c->delivery.batches_delivered++;
    c->delivery.tokens_delivered += out->n_tokens;
    if (c->delivery.position) hs_state_mark(c->delivery.position, out->epoch, out->batch);
    pthread_mutex_unlock(&c->delivery.lock);

    /* Prefetch: copy the next ready batch while the trainer works on this one. */
    hs_sched_item_t it;
    if (ready_pop(c, &it, 0) == HS_OK) {
        st = gpu_start_copy(c, 1 - buf, &it);
        if (st != HS_OK) return st;
    }
    uint64_t bytes;
    double secs;
    hs__loader_stats(c->gpu.loader, &bytes, &secs);
    pthread_mutex_lock(&c->delivery.lock);
    c->delivery.h2d_bytes = bytes;
    c->delivery.h2d_s = secs;
    pthread_mutex_unlock(&c->delivery.lock);
    return HS_OK;
}

/* Hands out again the batch hs_consumer_unget() gave back: counted and
 * marked as when it first went out. */
static hs_status_t next_held(hs_consumer_t *c, hs_batch_t *out)
{
    *out = c->handed.held;
    c->handed.has_held = false;
    pthread_mutex_lock(&c->delivery.lock);
    c->delivery.held_back = false;
    c->delivery.batches_delivered++;
    c->delivery.tokens_delivered += out->n_tokens;
    if (!out->on_device) c->delivery.in_trainer++;
    if (c->delivery.position) hs_state_mark(c->delivery.position, out->epoch, out->batch);
    pthread_mutex_unlock(&c->delivery.lock);
    return HS_OK;
}

hs_status_code_t hs_consumer_next(hs_consumer_t *c, hs_batch_t *out, int timeout_ms)
{
    if (c->handed.has_held) return next_held(c, out);
    if (c->gpu.loader) return next_gpu(c, out, timeout_ms);
    hs_sched_item_t it;
    hs_status_t st = ready_pop(c, &it, timeout_ms);
    if (st != HS_OK) return st;
    uint8_t *region = (uint8_t *)hs_cache_base(c->cache) + it.slot_offset;
    uint16_t *rows = NULL;
    if (dequantising(c) && !(rows = rows_get(c))) st = HS_ERR_NOMEM;
    if (st == HS_OK && (st = handed_add(c, &it, rows)) != HS_OK) rows_put(c, rows);
    if (st != HS_OK) {
        ready_unpop(c, &it);
        return st;
    }
    if (rows) { /* no GPU to do it on: the rows are dequantised here */
        hs_batch_view_t v = hs_batch_view(region, it.n_seqs, it.n_tokens, &c->run.layout);
        uint64_t n = hs_layout_row_elems(&c->run.layout);
        for (uint32_t t = 0; t < it.n_tokens; t++)
            hs_fp8_dequantize_row_bf16(v.hidden_fp8 + t * n, n, v.scales[t], rows + t * n);
    }
    pthread_mutex_lock(&c->delivery.lock);
    c->delivery.batches_delivered++;
    c->delivery.tokens_delivered += it.n_tokens;
    c->delivery.in_trainer++;
    if (c->delivery.position) hs_state_mark(c->delivery.position, it.epoch, it.batch);
    pthread_mutex_unlock(&c->delivery.lock);
    batch_from_view(c, &it, region, rows, out);
    return HS_OK;
}

/* The journal's line for a released batch. One that could not be recorded
 * (logged) does not hold the batch back: it was trained, and the caller
 * learns that a restart may repeat it. */
static hs_status_t record_release(hs_consumer_t *c, const hs__handed_t *h)
{
    return c->journal ? hs_journal_append(c->journal, h->epoch, h->batch) : HS_OK;
}

hs_status_code_t hs_consumer_release(hs_consumer_t *c, const hs_batch_t *batch)
{
    if (!c || !batch) {
        hs_error("hs_consumer_release: needs a consumer and a batch");
        return HS_ERR_INVALID;
    }
    /* Only a batch the trainer holds now: its ticket names it for good, so a
     * stale hs_batch_t (released before, its slot granted to another batch
     * since) frees and records nothing. */
    hs__handed_t h;
    if (handed_take(c, batch, &h) != HS_OK) return HS_ERR_INVALID;
    if (c->gpu.loader) {
        /* The trainer is done with it: record that first. The host slot went
         * back when its copy finished; this only ends the trainer's use of
         * the device buffer, if it is still the one handed out. */
        hs_status_t recorded = record_release(c, &h);
        if (c->gpu.cur < 0 || c->gpu.item[c->gpu.cur].ticket != h.ticket) return recorded;
        int buf = c->gpu.cur;
        c->gpu.cur = -1;
        hs_status_t st = hs__loader_consumed(c->gpu.loader, buf);
        return st != HS_OK ? st : recorded;
    }
    hs_status_t recorded = record_release(c, &h);
    rows_put(c, h.rows);
    if (slot_done(c, h.slot_offset, h.ticket) != HS_OK) return HS_ERR_INVALID; /* cannot happen */
    pthread_mutex_lock(&c->delivery.lock);
    c->delivery.in_trainer--;
    pthread_mutex_unlock(&c->delivery.lock);
    return recorded;
}

hs_status_code_t hs_consumer_unget(hs_consumer_t *c, const hs_batch_t *batch)
{
    if (!c || !batch) {
        hs_error("hs_consumer_unget: needs a consumer and a batch");
        return HS_ERR_INVALID;
    }
    bool same;
    if (handed_find(c, batch, &same) < 0 || !same || is_held(c, batch)) {
        hs_error("hs_consumer_unget of batch %u of epoch %u (ticket %llu), which the trainer does "
                 "not hold: give back only the hs_batch_t that hs_consumer_next() filled, "
                 "unchanged and not released; nothing was changed",
                 batch->batch, batch->epoch, (unsigned long long)batch->ticket);
        return HS_ERR_INVALID;
    }
    if (c->handed.has_held) {
        hs_error("hs_consumer_unget of batch %u of epoch %u while batch %u of epoch %u waits to go "
                 "out again: take that one with hs_consumer_next() first",
                 batch->batch, batch->epoch, c->handed.held.batch, c->handed.held.epoch);
        return HS_ERR_INVALID;
    }
    c->handed.held = *batch;
    c->handed.has_held = true;
    pthread_mutex_lock(&c->delivery.lock);
    c->delivery.held_back = true;
    c->delivery.batches_delivered--;
    c->delivery.tokens_delivered -= batch->n_tokens;
    if (!batch->on_device) c->delivery.in_trainer--;
    if (c->delivery.position) hs_state_unmark(c->delivery.position, batch->epoch, batch->batch);
    pthread_mutex_unlock(&c->delivery.lock);
    return HS_OK;
}

bool hs_consumer_holds(const hs_consumer_t *c, const hs_batch_t *batch)
{
    bool same;
    return c && batch && handed_find(c, batch, &same) >= 0 && same && !is_held(c, batch);
}

hs_status_code_t hs_consumer_state_save(hs_consumer_t *c, char *buf, size_t cap, size_t *len)
{
    if (!c || !len) {
        hs_error("hs_consumer_state_save: needs a consumer and somewhere to put the length");
        return HS_ERR_INVALID;
    }
    pthread_mutex_lock(&c->delivery.lock);
    hs_status_t st =
        hs_state_encode(c->delivery.position ? c->delivery.position : c->run.resume, buf, cap, len);
    pthread_mutex_unlock(&c->delivery.lock);
    return st;
}
