/* SPDX-License-Identifier: Apache-2.0 */
/* sched.c - ticket scheduler: plan cursors, lease records, a ticket hash and
 * the ready list. See sched_int.h for the state machine. */
#include "sched_int.h"
#include "ticket_table_int.h"
#include "hs_log.h"
#include "hs_shuffle.h"

#include <assert.h>
#include <stdlib.h>
#include <string.h>

#define NIL UINT32_MAX

/* One live item: leased, returned (pending with a slot), filled or being
 * delivered. Items never leased have no record: they are the plan cursor. */
typedef struct {
    uint64_t seq, ticket, conn, slot;
    uint32_t epoch, batch;
    uint32_t link; /* next in the ready list, or in the free list */
    uint8_t state; /* hs_sched_state_t */
    bool live;
    bool payload; /* LEASED: its payload was accepted */
} sched_rec_t;

typedef struct {
    uint64_t conn;
    uint32_t leases;
    uint64_t bytes; /* payload bytes of those leases */
} sched_conn_t;

/* a cursor over the plan: (epoch, pos) with the epoch's permutation */
typedef struct {
    uint32_t epoch, pos;
    uint32_t *perm;
} sched_cursor_t;

struct hs_sched {
    uint32_t n, epochs, start_epoch;
    uint32_t m;        /* batches of this rank per epoch (n without ranks) */
    uint32_t rank;     /* with shard */
    hs_shard_t *shard; /* NULL without ranks */
    uint64_t seed;
    hs_sched_order_t order;
    uint64_t *bytes;
    uint32_t *n_seqs, *n_tokens; /* NULL when not given */
    uint64_t *done;              /* delivered bitmap over (epoch - start_epoch) * n + batch */
    uint32_t *order_scratch;     /* [n] an epoch's order, at create */

    sched_cursor_t issue, deliver; /* deliver is used in PLAN order only */

    sched_rec_t *recs;
    uint32_t cap_recs, free_rec;

    hs__ticket_table_t tickets; /* ticket -> record index */

    uint32_t *ret; /* returned items, sorted by seq DEScending: the front is the last */
    uint32_t n_ret, cap_ret;

    uint32_t ready_head, ready_tail; /* ARRIVAL: fill order; PLAN: seq order */

    sched_conn_t *conns;
    uint32_t n_conns, cap_conns;

    uint64_t next_ticket;
    uint64_t planned, fresh_taken;
    uint64_t leased, filled, delivering, issued, delivered, released, returned, requeued,
        duplicates;
};

hs_status_t hs_sched_order_parse(const char *str, hs_sched_order_t *out)
{
    if (str && strcmp(str, "arrival") == 0) {
        *out = HS_SCHED_ARRIVAL;
        return HS_OK;
    }
    if (str && strcmp(str, "plan") == 0) {
        *out = HS_SCHED_PLAN;
        return HS_OK;
    }
    hs_error("sched: unknown delivery order '%s'; use arrival (as completed) or plan (strict plan "
             "order)",
             str ? str : "(null)");
    return HS_ERR_INVALID;
}

const char *hs_sched_order_str(hs_sched_order_t order)
{
    return order == HS_SCHED_PLAN ? "plan" : order == HS_SCHED_ARRIVAL ? "arrival" : "unknown";
}

/* ---- small helpers ------------------------------------------------------- */

static hs_status_t sched_grow(void **arr, uint32_t *cap, uint32_t need, size_t elem)
{
    if (need <= *cap) return HS_OK;
    uint32_t ncap = *cap ? *cap : 16;
    while (ncap < need)
        ncap *= 2;
    void *p = realloc(*arr, (size_t)ncap * elem);
    if (!p) {
        hs_error("sched: out of memory growing a table to %u entries", ncap);
        return HS_ERR_NOMEM;
    }
    *arr = p;
    *cap = ncap;
    return HS_OK;
}

static bool sched_done_get(const hs_sched_t *s, uint32_t epoch, uint32_t batch)
{
    uint64_t i = (uint64_t)(epoch - s->start_epoch) * s->n + batch;
    return s->done[i / 64] >> (i % 64) & 1;
}

static void sched_done_set(hs_sched_t *s, uint32_t epoch, uint32_t batch)
{
    uint64_t i = (uint64_t)(epoch - s->start_epoch) * s->n + batch;
    s->done[i / 64] |= 1ull << (i % 64);
}

/* The cursor's order of `epoch`: this rank's shard, or the whole plan's. */
static void sched_order(hs_sched_t *s, uint32_t epoch, uint32_t *out)
{
    if (s->shard)
        hs_shard_deal(s->shard, epoch, s->rank, out);
    else
        hs_permutation(s->seed, epoch, s->n, out);
}

/* Move the cursor to the first position at or after it whose item is not
 * delivered yet (only resumed items are delivered ahead of a cursor). */
static void sched_cursor_settle(hs_sched_t *s, sched_cursor_t *c)
{
    while (c->epoch < s->epochs) {
        if (c->pos == s->m) {
            c->epoch++;
            c->pos = 0;
            if (c->epoch < s->epochs) sched_order(s, c->epoch, c->perm);
            continue;
        }
        if (!sched_done_get(s, c->epoch, c->perm[c->pos])) break;
        c->pos++;
    }
}

static uint64_t sched_cursor_seq(const hs_sched_t *s, const sched_cursor_t *c)
{
    return (uint64_t)c->epoch * s->m + c->pos;
}

static void sched_item_fill(const hs_sched_t *s, uint32_t epoch, uint32_t batch, uint64_t seq,
                            hs_sched_item_t *it)
{
    memset(it, 0, sizeof *it);
    it->epoch = epoch;
    it->batch = batch;
    it->seq = seq;
    it->pos = (uint32_t)(seq - (uint64_t)epoch * s->m);
    it->bytes = s->bytes[batch];
    it->n_seqs = s->n_seqs ? s->n_seqs[batch] : 0;
    it->n_tokens = s->n_tokens ? s->n_tokens[batch] : 0;
}

static void sched_item_from_rec(const hs_sched_t *s, const sched_rec_t *r, hs_sched_item_t *it)
{
    sched_item_fill(s, r->epoch, r->batch, r->seq, it);
    it->has_slot = true;
    it->slot_offset = r->slot;
    it->ticket = r->ticket;
    it->conn = r->state == HS_SCHED_LEASED ? r->conn : 0;
    it->state = (hs_sched_state_t)r->state;
    it->payload = r->state == HS_SCHED_LEASED && r->payload;
}

/* Room for `live` records and as many tickets, at create (the tables are
 * empty): the free list runs from the lowest index, as lease leaves it. */
static hs_status_t sched_plan_live(hs_sched_t *s, uint32_t live)
{
    uint32_t old = s->cap_recs;
    if (sched_grow((void **)&s->recs, &s->cap_recs, live, sizeof *s->recs)) return HS_ERR_NOMEM;
    for (uint32_t i = s->cap_recs; i-- > old;) {
        s->recs[i].live = false;
        s->recs[i].link = s->free_rec;
        s->free_rec = i;
    }
    return hs__ticket_table_reserve(&s->tickets, live);
}

/* ---- connections ------------------------------------------------------- */

static sched_conn_t *sched_conn_find(const hs_sched_t *s, uint64_t conn)
{
    for (uint32_t i = 0; i < s->n_conns; i++)
        if (s->conns[i].conn == conn) return &s->conns[i];
    return NULL;
}

static void sched_conn_dec(hs_sched_t *s, uint64_t conn, uint64_t bytes)
{
    sched_conn_t *c = sched_conn_find(s, conn);
    assert(c && c->leases > 0 && c->bytes >= bytes);
    c->bytes -= bytes;
    if (--c->leases == 0) *c = s->conns[--s->n_conns];
}

uint32_t hs_sched_leases_of(const hs_sched_t *s, uint64_t conn)
{
    const sched_conn_t *c = sched_conn_find(s, conn);
    return c ? c->leases : 0;
}

uint64_t hs_sched_bytes_of(const hs_sched_t *s, uint64_t conn)
{
    const sched_conn_t *c = sched_conn_find(s, conn);
    return c ? c->bytes : 0;
}

/* ---- create / destroy ------------------------------------------------------ */

hs_status_t hs_sched_create(const hs_sched_config_t *cfg, hs_sched_t **out)
{
    if (cfg->n_batches == 0 || !cfg->bytes) {
        hs_error("sched: the plan has no batches; check the dataset and the token budget");
        return HS_ERR_INVALID;
    }
    if (cfg->epochs == 0 || cfg->start_epoch >= cfg->epochs) {
        hs_error("sched: start epoch %u is not below the number of epochs %u; check --epochs and "
                 "the resume state",
                 cfg->start_epoch, cfg->epochs);
        return HS_ERR_INVALID;
    }
    if (cfg->order != HS_SCHED_ARRIVAL && cfg->order != HS_SCHED_PLAN) {
        hs_error("sched: unknown delivery order %d; use arrival or plan", (int)cfg->order);
        return HS_ERR_INVALID;
    }
    uint32_t world = cfg->world ? cfg->world : 1;
    if (cfg->rank >= world) {
        hs_error("sched: rank %u is not below the world size %u; ranks are 0..%u", cfg->rank, world,
                 world - 1);
        return HS_ERR_INVALID;
    }
    if (cfg->uneven != HS_SHARD_DROP && cfg->uneven != HS_SHARD_REPEAT) {
        hs_error("sched: unknown --uneven mode %d; use drop or repeat", (int)cfg->uneven);
        return HS_ERR_INVALID;
    }
    uint32_t m = world > 1 ? hs_shard_per_rank(cfg->n_batches, world, cfg->uneven) : cfg->n_batches;
    uint64_t n_items = (uint64_t)(cfg->epochs - cfg->start_epoch) * m;
    uint64_t n_bits = (uint64_t)(cfg->epochs - cfg->start_epoch) * cfg->n_batches;
    if (n_bits > (1ull << 40)) {
        hs_error("sched: %llu work items is more than this scheduler tracks; run fewer epochs",
                 (unsigned long long)n_bits);
        return HS_ERR_INVALID;
    }
    for (uint32_t b = 0; b < cfg->n_batches; b++) {
        if (cfg->bytes[b] == 0) {
            hs_error("sched: batch %u of the plan has 0 bytes; the plan is malformed", b);
            return HS_ERR_INVALID;
        }
    }

    hs_sched_t *s = calloc(1, sizeof *s);
    if (!s) return HS_ERR_NOMEM;
    uint32_t n = cfg->n_batches;
    s->n = n;
    s->m = m;
    s->rank = cfg->rank;
    if (world > 1) {
        hs_status_t st =
            hs_shard_create(n, cfg->n_tokens, cfg->seed, world, cfg->uneven, &s->shard);
        if (st) {
            free(s);
            return st;
        }
    }
    s->epochs = cfg->epochs;
    s->start_epoch = cfg->start_epoch;
    s->seed = cfg->seed;
    s->order = cfg->order;
    s->ready_head = s->ready_tail = NIL;
    s->free_rec = NIL;
    s->next_ticket = 1;
    s->bytes = malloc(n * sizeof *s->bytes);
    s->n_seqs = cfg->n_seqs ? malloc(n * sizeof *s->n_seqs) : NULL;
    s->n_tokens = cfg->n_tokens ? malloc(n * sizeof *s->n_tokens) : NULL;
    s->done = calloc((n_bits + 63) / 64, sizeof *s->done);
    s->issue.perm = malloc(n * sizeof(uint32_t));
    s->deliver.perm = malloc(n * sizeof(uint32_t));
    s->order_scratch = malloc(n * sizeof(uint32_t));
    hs_status_t tst = hs__ticket_table_init(&s->tickets, 64);
    if (!s->bytes || (cfg->n_seqs && !s->n_seqs) || (cfg->n_tokens && !s->n_tokens) || !s->done ||
        !s->issue.perm || !s->deliver.perm || !s->order_scratch || tst != HS_OK) {
        hs_error("sched: out of memory for a plan of %u batches x %u epochs", n, cfg->epochs);
        hs_sched_destroy(s);
        return HS_ERR_NOMEM;
    }
    uint32_t live =
        cfg->live_plan < HS_SCHED_LIVE_PLAN_MAX ? cfg->live_plan : HS_SCHED_LIVE_PLAN_MAX;
    if (live && sched_plan_live(s, live) != HS_OK) {
        hs_sched_destroy(s);
        return HS_ERR_NOMEM;
    }
    memcpy(s->bytes, cfg->bytes, n * sizeof *s->bytes);
    if (s->n_seqs) memcpy(s->n_seqs, cfg->n_seqs, n * sizeof *s->n_seqs);
    if (s->n_tokens) memcpy(s->n_tokens, cfg->n_tokens, n * sizeof *s->n_tokens);

    s->planned = n_items;
    if (cfg->resume_done) {
        for (uint32_t e = cfg->start_epoch; e < cfg->epochs; e++)
            for (uint32_t b = 0; b < n; b++) {
                uint64_t i = (uint64_t)(e - cfg->start_epoch) * n + b;
                if (cfg->resume_done[i / 8] >> (i % 8) & 1) sched_done_set(s, e, b);
            }
    } else if (cfg->start_done) {
        for (uint32_t b = 0; b < n; b++)
            if (cfg->start_done[b / 8] >> (b % 8) & 1) sched_done_set(s, cfg->start_epoch, b);
    }
    if (cfg->resume_done || cfg->start_done) {
        /* only the resumed batches of this rank's shard count */
        uint32_t last = cfg->resume_done ? cfg->epochs : cfg->start_epoch + 1;
        for (uint32_t e = cfg->start_epoch; e < last; e++) {
            sched_order(s, e, s->order_scratch);
            for (uint32_t p = 0; p < m; p++)
                if (sched_done_get(s, e, s->order_scratch[p])) s->planned--;
        }
    }
    s->issue.epoch = s->deliver.epoch = cfg->start_epoch;
    sched_order(s, cfg->start_epoch, s->issue.perm);
    memcpy(s->deliver.perm, s->issue.perm, m * sizeof(uint32_t));
    sched_cursor_settle(s, &s->issue);
    sched_cursor_settle(s, &s->deliver);
    *out = s;
    return HS_OK;
}

void hs_sched_destroy(hs_sched_t *s)
{
    if (!s) return;
    free(s->bytes);
    free(s->n_seqs);
    free(s->n_tokens);
    free(s->done);
    free(s->issue.perm);
    free(s->deliver.perm);
    free(s->order_scratch);
    hs_shard_destroy(s->shard);
    free(s->recs);
    hs__ticket_table_fini(&s->tickets);
    free(s->ret);
    free(s->conns);
    free(s);
}

/* ---- leasing ----------------------------------------------------------------- */

bool hs_sched_peek(const hs_sched_t *s, hs_sched_item_t *out)
{
    if (s->n_ret) {
        sched_item_from_rec(s, &s->recs[s->ret[s->n_ret - 1]], out);
        return true;
    }
    if (s->issue.epoch >= s->epochs) return false;
    const sched_cursor_t *c = &s->issue;
    sched_item_fill(s, c->epoch, c->perm[c->pos], sched_cursor_seq(s, c), out);
    out->state = HS_SCHED_PENDING;
    return true;
}

hs_status_t hs_sched_lease(hs_sched_t *s, uint64_t conn, uint64_t slot_offset, uint64_t *ticket)
{
    if (!s->n_ret && s->issue.epoch >= s->epochs) return HS_ERR_NOT_FOUND;
    if (s->n_ret && s->recs[s->ret[s->n_ret - 1]].slot != slot_offset) {
        hs_error("sched: leasing a returned item with slot %llu, but it keeps slot %llu",
                 (unsigned long long)slot_offset,
                 (unsigned long long)s->recs[s->ret[s->n_ret - 1]].slot);
        return HS_ERR_INVALID;
    }
    /* every allocation first, so a failure changes nothing */
    hs_status_t st = hs__ticket_table_reserve(&s->tickets, 1);
    if (st) return st;
    sched_conn_t *c = sched_conn_find(s, conn);
    if (!c) {
        st = sched_grow((void **)&s->conns, &s->cap_conns, s->n_conns + 1, sizeof *s->conns);
        if (st) return st;
    }
    uint32_t idx;
    if (s->n_ret) {
        idx = s->ret[--s->n_ret];
    } else {
        if (s->free_rec == NIL) {
            uint32_t old = s->cap_recs;
            st = sched_grow((void **)&s->recs, &s->cap_recs, old + 1, sizeof *s->recs);
            if (st) return st;
            for (uint32_t i = s->cap_recs; i-- > old;) {
                s->recs[i].live = false;
                s->recs[i].link = s->free_rec;
                s->free_rec = i;
            }
        }
        idx = s->free_rec;
        sched_rec_t *r = &s->recs[idx];
        s->free_rec = r->link;
        sched_cursor_t *cur = &s->issue;
        *r = (sched_rec_t){.seq = sched_cursor_seq(s, cur),
                           .epoch = cur->epoch,
                           .batch = cur->perm[cur->pos],
                           .slot = slot_offset,
                           .link = NIL,
                           .live = true};
        cur->pos++;
        sched_cursor_settle(s, cur);
        s->fresh_taken++;
    }
    sched_rec_t *r = &s->recs[idx];
    r->ticket = s->next_ticket++;
    r->conn = conn;
    r->state = HS_SCHED_LEASED;
    r->payload = false;
    hs__ticket_table_put(&s->tickets, r->ticket, idx);
    if (!c) {
        c = &s->conns[s->n_conns++];
        *c = (sched_conn_t){.conn = conn, .leases = 0};
    }
    c->leases++;
    c->bytes += s->bytes[r->batch];
    s->leased++;
    s->issued++;
    *ticket = r->ticket;
    return HS_OK;
}

/* The record of `ticket` if `conn` holds it as a lease, else NIL. */
static uint32_t sched_leased_rec(const hs_sched_t *s, uint64_t conn, uint64_t ticket)
{
    uint32_t idx = hs__ticket_table_find(&s->tickets, ticket);
    if (idx == NIL) return NIL;
    const sched_rec_t *r = &s->recs[idx];
    return r->state == HS_SCHED_LEASED && r->conn == conn ? idx : NIL;
}

hs_status_t hs_sched_lookup(const hs_sched_t *s, uint64_t conn, uint64_t ticket,
                            hs_sched_item_t *out)
{
    uint32_t idx = sched_leased_rec(s, conn, ticket);
    if (idx == NIL) return HS_ERR_NOT_FOUND;
    sched_item_from_rec(s, &s->recs[idx], out);
    return HS_OK;
}

hs_status_t hs_sched_payload_accept(hs_sched_t *s, uint64_t conn, uint64_t ticket)
{
    uint32_t idx = sched_leased_rec(s, conn, ticket);
    if (idx == NIL) return HS_ERR_NOT_FOUND;
    if (s->recs[idx].payload) return HS_ERR_BUSY;
    s->recs[idx].payload = true;
    return HS_OK;
}

hs_status_t hs_sched_get(const hs_sched_t *s, uint64_t ticket, hs_sched_item_t *out)
{
    uint32_t idx = hs__ticket_table_find(&s->tickets, ticket);
    if (idx == NIL) return HS_ERR_NOT_FOUND;
    sched_item_from_rec(s, &s->recs[idx], out);
    return HS_OK;
}

/* Retire the lease of record idx and put the item back in the queue by seq.
 * The returned array has room (ensured by the caller). */
static void sched_unlease(hs_sched_t *s, uint32_t idx)
{
    sched_rec_t *r = &s->recs[idx];
    hs__ticket_table_del(&s->tickets, r->ticket);
    sched_conn_dec(s, r->conn, s->bytes[r->batch]);
    r->ticket = 0;
    r->conn = 0;
    r->state = HS_SCHED_PENDING;
    r->payload = false;
    s->leased--;
    /* descending by seq: find the first entry with a smaller seq */
    uint32_t at = 0;
    while (at < s->n_ret && s->recs[s->ret[at]].seq > r->seq)
        at++;
    memmove(&s->ret[at + 1], &s->ret[at], (s->n_ret - at) * sizeof *s->ret);
    s->ret[at] = idx;
    s->n_ret++;
}

hs_status_t hs_sched_requeue(hs_sched_t *s, uint64_t conn, uint64_t ticket)
{
    uint32_t idx = sched_leased_rec(s, conn, ticket);
    if (idx == NIL) return HS_ERR_NOT_FOUND;
    hs_status_t st = sched_grow((void **)&s->ret, &s->cap_ret, s->n_ret + 1, sizeof *s->ret);
    if (st) return st;
    sched_unlease(s, idx);
    s->requeued++;
    return HS_OK;
}

uint32_t hs_sched_return_leases(hs_sched_t *s, uint64_t conn)
{
    uint32_t n = hs_sched_leases_of(s, conn);
    if (n == 0) return 0;
    /* Without room to requeue them, the items would be lost: the only
     * failure here is out of memory, after which nothing can go on. */
    if (sched_grow((void **)&s->ret, &s->cap_ret, s->n_ret + n, sizeof *s->ret)) return 0;
    uint32_t count = 0;
    for (uint32_t i = 0; i < s->cap_recs && count < n; i++) {
        const sched_rec_t *r = &s->recs[i];
        if (r->live && r->state == HS_SCHED_LEASED && r->conn == conn) {
            sched_unlease(s, i);
            count++;
        }
    }
    s->returned += count;
    return count;
}

/* ---- delivery ----------------------------------------------------------------- */

hs_status_t hs_sched_fill(hs_sched_t *s, uint64_t conn, uint64_t ticket)
{
    uint32_t idx = sched_leased_rec(s, conn, ticket);
    if (idx == NIL) return HS_ERR_NOT_FOUND;
    sched_rec_t *r = &s->recs[idx];
    sched_conn_dec(s, conn, s->bytes[r->batch]);
    r->state = HS_SCHED_FILLED;
    r->link = NIL;
    s->leased--;
    s->filled++;
    if (s->order == HS_SCHED_ARRIVAL || s->ready_head == NIL ||
        s->recs[s->ready_tail].seq < r->seq) {
        /* append */
        if (s->ready_tail == NIL)
            s->ready_head = idx;
        else
            s->recs[s->ready_tail].link = idx;
        s->ready_tail = idx;
        return HS_OK;
    }
    /* PLAN: insert by seq */
    uint32_t *pp = &s->ready_head;
    while (*pp != NIL && s->recs[*pp].seq < r->seq)
        pp = &s->recs[*pp].link;
    r->link = *pp;
    *pp = idx;
    return HS_OK;
}

bool hs_sched_next_ready(const hs_sched_t *s, hs_sched_item_t *out)
{
    if (s->ready_head == NIL) return false;
    const sched_rec_t *r = &s->recs[s->ready_head];
    if (s->order == HS_SCHED_PLAN &&
        (s->deliver.epoch >= s->epochs || r->seq != sched_cursor_seq(s, &s->deliver)))
        return false;
    sched_item_from_rec(s, r, out);
    return true;
}

/* The record of `ticket` when it is in `state`, else NIL, logged as
 * "sched: ticket N is not <state_text>, it cannot be <verb>". */
static uint32_t sched_rec_in(const hs_sched_t *s, uint64_t ticket, int state,
                             const char *state_text, const char *verb)
{
    uint32_t idx = hs__ticket_table_find(&s->tickets, ticket);
    if (idx != NIL && (int)s->recs[idx].state == state) return idx;
    hs_error("sched: ticket %llu is not %s, it cannot be %s", (unsigned long long)ticket,
             state_text, verb);
    return NIL;
}

hs_status_t hs_sched_delivered(hs_sched_t *s, uint64_t ticket)
{
    uint32_t idx = sched_rec_in(s, ticket, HS_SCHED_FILLED, "ready", "delivered");
    if (idx == NIL) return HS_ERR_INVALID;
    sched_rec_t *r = &s->recs[idx];
    if (s->order == HS_SCHED_PLAN &&
        (idx != s->ready_head || r->seq != sched_cursor_seq(s, &s->deliver))) {
        hs_error("sched: ticket %llu (epoch %u batch %u) is not next in plan order",
                 (unsigned long long)ticket, r->epoch, r->batch);
        return HS_ERR_INVALID;
    }
    if (sched_done_get(s, r->epoch, r->batch)) {
        /* cannot happen: one record per item; counted so a test can see it */
        s->duplicates++;
        hs_error("sched: epoch %u batch %u was already delivered; refusing a duplicate", r->epoch,
                 r->batch);
        return HS_ERR_INVALID;
    }
    /* unlink from the ready list */
    uint32_t *pp = &s->ready_head, prev = NIL;
    while (*pp != idx) {
        prev = *pp;
        pp = &s->recs[*pp].link;
    }
    *pp = r->link;
    if (s->ready_tail == idx) s->ready_tail = prev;
    r->link = NIL;

    sched_done_set(s, r->epoch, r->batch);
    r->state = HS_SCHED_DELIVERED;
    s->filled--;
    s->delivering++;
    s->delivered++;
    if (s->order == HS_SCHED_PLAN) {
        s->deliver.pos++;
        sched_cursor_settle(s, &s->deliver);
    }
    return HS_OK;
}

hs_status_t hs_sched_release(hs_sched_t *s, uint64_t ticket)
{
    uint32_t idx = sched_rec_in(s, ticket, HS_SCHED_DELIVERED, "being delivered", "released");
    if (idx == NIL) return HS_ERR_INVALID;
    hs__ticket_table_del(&s->tickets, ticket);
    sched_rec_t *r = &s->recs[idx];
    r->live = false;
    r->link = s->free_rec;
    s->free_rec = idx;
    s->delivering--;
    s->released++;
    return HS_OK;
}

bool hs_sched_finished(const hs_sched_t *s) { return s->delivered == s->planned; }

void hs_sched_stats(const hs_sched_t *s, hs_sched_stats_t *out)
{
    hs_sched_stats_t st = {
        .planned = s->planned,
        .pending = s->planned - s->fresh_taken + s->n_ret,
        .pending_returned = s->n_ret,
        .leased = s->leased,
        .filled = s->filled,
        .delivering = s->delivering,
        .issued = s->issued,
        .delivered = s->delivered,
        .released = s->released,
        .returned = s->returned,
        .requeued = s->requeued,
        .duplicates = s->duplicates,
        .per_epoch = s->m,
        .skipped =
            s->shard && s->shard->uneven == HS_SHARD_DROP ? s->n - s->m * s->shard->world : 0,
        .repeated =
            s->shard && s->shard->uneven == HS_SHARD_REPEAT ? s->m * s->shard->world - s->n : 0,
        .issue_epoch = s->issue.epoch,
        .deliver_epoch = s->deliver.epoch,
    };
    *out = st;
}
