/* SPDX-License-Identifier: Apache-2.0 */
/* worker.c - the producer's workers (DESIGN §5): one thread per device
 * takes tickets from the shared queue, fills one of its two staging buffers
 * (ids, mask, cu_seqlens, hidden states, header, checksum) and hands it to
 * the network thread, which sends it straight from that buffer and gives it
 * back when the send completes. So worker k computes batch n+1 while batch
 * n is on the wire. */
#include "worker_int.h"
#include "hs_status.h"
#include "hs_log.h"
#include "hs_time.h"

#include <stdlib.h>
#include <time.h>

/* ---- ticket records --------------------------------------------------------- */

/* A slab of ticket records, kept until the producer is freed. */
struct ticket_slab {
    struct ticket_slab *next;
    uint32_t n;
    ticket_t t[];
};

hs_status_t hs__ticket_pool_grow(producer_t *pr, uint32_t n)
{
    ticket_slab_t *s = calloc(1, sizeof(*s) + (size_t)n * sizeof(ticket_t));
    if (!s) return HS_ERR_NOMEM;
    s->n = n;
    s->next = pr->sh.ticket_slabs;
    pr->sh.ticket_slabs = s;
    pr->sh.ticket_records += n;
    for (uint32_t i = 0; i < n; i++)
        hs__ticket_put(pr, &s->t[i]);
    return HS_OK;
}

void hs__ticket_pool_free(producer_t *pr)
{
    while (pr->sh.ticket_slabs) {
        ticket_slab_t *s = pr->sh.ticket_slabs;
        pr->sh.ticket_slabs = s->next;
        free(s);
    }
    pr->sh.ticket_free = NULL;
    pr->sh.tickets = pr->sh.tickets_tail = NULL;
}

ticket_t *hs__ticket_get(producer_t *pr)
{
    if (!pr->sh.ticket_free) {
        /* More tickets held than workers x prefetch per consumer: a consumer
         * that tickets beyond what HELLO offered. Another slab as large as
         * the pool, so this happens a few times at most. */
        uint32_t n = pr->sh.ticket_records ? pr->sh.ticket_records : 64;
        hs_debug("tickets: %u records in use, adding %u", pr->sh.ticket_records, n);
        if (hs__ticket_pool_grow(pr, n) != HS_OK) return NULL;
    }
    ticket_t *t = pr->sh.ticket_free;
    pr->sh.ticket_free = t->next;
    return t;
}

void hs__ticket_put(producer_t *pr, ticket_t *t)
{
    t->next = pr->sh.ticket_free;
    pr->sh.ticket_free = t;
}

void hs__ticket_pop(producer_t *pr, ticket_t *out)
{
    ticket_t *t = pr->sh.tickets;
    pr->sh.tickets = t->next;
    if (!pr->sh.tickets) pr->sh.tickets_tail = NULL;
    *out = *t;
    out->next = NULL;
    hs__ticket_put(pr, t);
}

/* ---- workers ---------------------------------------------------------------- */

hs_status_t hs__worker_fill_meta(producer_t *pr, const ticket_t *t, uint8_t *region,
                                 hs_batch_view_t *v)
{
    const hs_layout_t *layout = &pr->cfg->layout;
    *v = hs_batch_view(region, t->n_seqs, t->n_tokens, layout);
    hs_batch_header_init(v->header, t->epoch, t->batch, t->n_seqs, t->n_tokens, layout,
                         hs_plan_hash(pr->plan));
    return hs_plan_fill_batch(pr->plan, pr->ds, t->batch, v);
}

/* Writes the batch of ticket t into region: metadata from the plan, hidden
 * states from the source, then the header and checksum. */
static hs_status_t fill_batch(producer_t *pr, worker_t *w, const ticket_t *t, uint8_t *region)
{
    const hs_layout_t *layout = &pr->cfg->layout;
    hs_batch_view_t v;
    hs_status_t st = hs__worker_fill_meta(pr, t, region, &v);
    if (st != HS_OK) return st;
    if (pr->cfg->source == HS_SOURCE_SYNTHETIC) {
        hs_batch_synth_fill_seal(&v, layout, t->bytes, w->checksum);
        return HS_OK;
    }
    uint64_t row = hs_layout_row_elems(layout);
    bool fp8 = layout->dtype == HS_DTYPE_FP8;
    uint16_t *out = fp8 ? w->fp8_scratch : v.hidden;
    st = hs_model_forward_cpu(pr->model, v.input_ids, v.cu_seqlens, (int)t->n_seqs, layout->layers,
                              (int)layout->n_layers, out, HS_MODEL_OUT_BF16, row);
    if (st != HS_OK) return st;
    for (uint32_t i = 0; fp8 && i < t->n_tokens; i++) {
        uint64_t bad;
        if (hs_fp8_quantize_row_bf16(out + i * row, row, v.hidden_fp8 + i * row, &v.scales[i],
                                     &bad) != HS_OK) {
            hs_error("batch %u/%u: token %u's hidden state %llu (layer %d) is not finite; it "
                     "cannot be quantised to fp8: check the model's weights",
                     t->epoch, t->batch, i, (unsigned long long)bad,
                     layout->layers[bad / layout->hidden_size]);
            return HS_ERR_INVALID;
        }
    }
    hs_batch_seal(region, t->bytes);
    return HS_OK;
}

void *hs__worker_cpu_main(void *arg)
{
    worker_t *w = arg;
    producer_t *pr = w->pr;
    pthread_mutex_lock(&pr->sh.lock);
    for (;;) {
        double t_wait = hs_now_s();
        staging_t *st = NULL;
        while (!pr->sh.stop) {
            st = NULL;
            for (uint32_t i = 0; i < w->n_staging; i++)
                if (!w->staging[i].busy) st = &w->staging[i];
            if (pr->sh.tickets && st) break;
            w->t_stall = t_wait;
            pthread_cond_wait(&pr->sh.cond, &pr->sh.lock);
        }
        w->t_stall = 0;
        if (pr->sh.stop) break;
        ticket_t tk, *t = &tk;
        hs__ticket_pop(pr, &tk);
        st->busy = true;
        double t0 = hs_now_s();
        if (pr->sh.t_start > 0)
            w->stall_s += t0 - (t_wait > pr->sh.t_start ? t_wait : pr->sh.t_start);
        w->computing = true;
        w->t_progress = t0;
        pthread_mutex_unlock(&pr->sh.lock);

        hs_status_t rc = fill_batch(pr, w, t, st->buf);
        double t1 = hs_now_s();
        outgoing_t *o = &st->out;

        pthread_mutex_lock(&pr->sh.lock);
        w->busy_s += t1 - t0;
        w->computing = false;
        w->t_progress = t1;
        if (rc != HS_OK) {
            hs_error("worker %u: batch %u/%u failed: %s", w->index, t->epoch, t->batch,
                     hs_status_str(rc));
            pr->sh.result = rc;
            pr->sh.stop = true;
            st->busy = false;
            pthread_cond_broadcast(&pr->sh.cond);
            hs_tp_wakeup(pr->tp);
            break;
        }
        w->batches++;
        w->tokens += t->n_tokens;
        w->bytes += t->bytes;
        o->t = *t;
        o->st = st;
        o->worker = w->index;
        o->checksum = ((hs_batch_header_t *)st->buf)->checksum;
        o->compute_ns = (uint64_t)((t1 - t0) * 1e9);
        hs_trace("worker %u: batch %u/%u (%.1f MiB) filled in %.1f ms", w->index, t->epoch,
                 t->batch, (double)t->bytes / (1 << 20), 1e3 * (t1 - t0));
        o->next = pr->sh.outbox;
        pr->sh.outbox = o;
        st->queued = true;
        hs_tp_wakeup(pr->tp);
    }
    pthread_mutex_unlock(&pr->sh.lock);
    return NULL;
}

/* A batch whose forward and D2H are queued on the GPU. */
typedef struct {
    ticket_t t;
    staging_t *st; /* NULL: none */
    int slot;
} inflight_t;

/* Waits for an in-flight batch's hidden states, seals it, hands it over. */
static hs_status_t gpu_finish(producer_t *pr, worker_t *w, inflight_t *f)
{
    hs__gpu_batch_times_t times = {0};
    hs_status_t rc = hs__gpu_batch_wait(w->gpu_w, f->slot, &times);
    double ms = times.forward_ms;
    if (rc == HS_OK) hs_batch_seal(f->st->buf, f->t.bytes);
    outgoing_t *o = &f->st->out;
    pthread_mutex_lock(&pr->sh.lock);
    if (rc != HS_OK) {
        hs_error("worker %u (gpu %d): batch %u/%u failed: %s", w->index, w->gpu, f->t.epoch,
                 f->t.batch, hs_status_str(rc));
        pr->sh.result = rc;
        pr->sh.stop = true;
        f->st->busy = false;
        pthread_cond_broadcast(&pr->sh.cond);
        pthread_mutex_unlock(&pr->sh.lock);
        hs_tp_wakeup(pr->tp);
        return HS_ERR_CUDA;
    }
    w->busy_s += ms * 1e-3; /* GPU busy: forward time from CUDA events */
    w->d2h_s += times.d2h_ms * 1e-3;
    w->d2h_bytes += times.d2h_bytes;
    w->t_progress = hs_now_s();
    w->batches++;
    w->tokens += f->t.n_tokens;
    w->bytes += f->t.bytes;
    o->t = f->t;
    o->st = f->st;
    o->worker = w->index;
    o->checksum = ((hs_batch_header_t *)f->st->buf)->checksum;
    o->compute_ns = (uint64_t)(ms * 1e6);
    o->next = pr->sh.outbox;
    pr->sh.outbox = o;
    f->st->queued = true;
    pthread_mutex_unlock(&pr->sh.lock);
    hs_trace("worker %u (gpu %d): batch %u/%u forward %.1f ms, device-to-host %.2f ms", w->index,
             w->gpu, f->t.epoch, f->t.batch, ms, times.d2h_ms);
    hs_tp_wakeup(pr->tp);
    return HS_OK;
}

/* One GPU: launch batch k+1 before finishing batch k, so the forward of one
 * overlaps the D2H, checksum and send of the other. */
void *hs__worker_gpu_main(void *arg)
{
    worker_t *w = arg;
    producer_t *pr = w->pr;
    inflight_t pending = {0};
    pthread_mutex_lock(&pr->sh.lock);
    for (;;) {
        double t_wait = hs_now_s();
        int slot = -1;
        while (!pr->sh.stop) {
            slot = -1;
            for (uint32_t i = 0; i < w->n_staging; i++)
                if (!w->staging[i].busy) slot = (int)i;
            if (pr->sh.tickets && slot >= 0) break;
            /* Nothing to launch yet. Finish the batch on the GPU once its
             * hidden states are out; until then wait in short steps for a
             * staging buffer (the one being sent) or a ticket, so the next
             * forward is queued before this one ends and the GPU never waits
             * for a checksum or a send. */
            if (pending.st && hs__gpu_batch_done(w->gpu_w, pending.slot)) {
                pthread_mutex_unlock(&pr->sh.lock);
                hs_status_t rc = gpu_finish(pr, w, &pending);
                pending.st = NULL;
                pthread_mutex_lock(&pr->sh.lock);
                w->computing = false;
                if (rc != HS_OK) break;
                t_wait = hs_now_s();
                continue;
            }
            if (pending.st) {
                struct timespec dl;
                clock_gettime(CLOCK_REALTIME, &dl);
                dl.tv_nsec += 2000000;
                if (dl.tv_nsec >= 1000000000L) {
                    dl.tv_sec++;
                    dl.tv_nsec -= 1000000000L;
                }
                pthread_cond_timedwait(&pr->sh.cond, &pr->sh.lock, &dl);
                continue;
            }
            w->t_stall = t_wait;
            pthread_cond_wait(&pr->sh.cond, &pr->sh.lock);
        }
        w->t_stall = 0;
        if (pr->sh.stop) break;
        staging_t *st = &w->staging[slot];
        ticket_t tk, *t = &tk;
        hs__ticket_pop(pr, &tk);
        st->busy = true;
        if (pr->sh.t_start > 0 && !pending.st)
            w->stall_s += hs_now_s() - (t_wait > pr->sh.t_start ? t_wait : pr->sh.t_start);
        w->computing = true;
        w->t_progress = hs_now_s();
        pthread_mutex_unlock(&pr->sh.lock);

        hs_batch_view_t v;
        hs_status_t rc = hs__worker_fill_meta(pr, t, st->buf, &v);
        if (rc == HS_OK) rc = hs__gpu_batch_launch(w->gpu_w, slot, &v, t->n_seqs, t->n_tokens);
        if (rc != HS_OK) {
            hs_error("worker %u (gpu %d): cannot launch batch %u/%u: %s", w->index, w->gpu,
                     t->epoch, t->batch, hs_status_str(rc));
            pthread_mutex_lock(&pr->sh.lock);
            st->busy = false;
            pr->sh.result = rc;
            pr->sh.stop = true;
            pthread_cond_broadcast(&pr->sh.cond);
            hs_tp_wakeup(pr->tp);
            break;
        }
        if (pending.st) {
            rc = gpu_finish(pr, w, &pending);
            pending.st = NULL;
        }
        pending = (inflight_t){tk, st, slot};
        pthread_mutex_lock(&pr->sh.lock);
        if (rc != HS_OK) break;
    }
    pthread_mutex_unlock(&pr->sh.lock);
    if (pending.st) {
        /* the GPU must be done with the buffers; the batch is not sent, so a
         * failure here loses nothing, but says the GPU is in trouble */
        hs__gpu_batch_times_t times;
        hs_status_t wait = hs__gpu_batch_wait(w->gpu_w, pending.slot, &times);
        if (wait != HS_OK)
            hs_warn("worker %u (gpu %d): the batch in flight at exit failed: %s", w->index, w->gpu,
                    hs_status_str(wait));
    }
    return NULL;
}
