/* SPDX-License-Identifier: Apache-2.0 */
/* test_sched.c - the ticket scheduler: exactly-once delivery under random
 * leases, fills, failed verifications and disconnects (with a real cache
 * behind it), returned leases first and in order with their slots, ticket
 * checks, PLAN and ARRIVAL delivery orders, epochs, resume and finished();
 * tables planned at create for the items alive at once do not grow. */
#include <check.h>
#include <stdlib.h>
#include <string.h>
#include <stdio.h>

#include "cache_int.h"
#include "common/alloc_count.h"
#include "sched_int.h"
#include "hs_log.h"
#include "hs_shuffle.h"

#define SEED 0x5eedull

static hs_sched_t *sched_new(uint32_t n, uint32_t epochs, hs_sched_order_t order, uint64_t *bytes)
{
    static uint64_t ones[4096];
    for (uint32_t i = 0; i < n; i++)
        ones[i] = 1000 + i;
    hs_sched_config_t cfg = {.n_batches = n,
                             .bytes = bytes ? bytes : ones,
                             .epochs = epochs,
                             .seed = SEED,
                             .order = order};
    hs_sched_t *s;
    ck_assert_int_eq(hs_sched_create(&cfg, &s), HS_OK);
    return s;
}

static uint64_t lease(hs_sched_t *s, uint64_t conn, uint64_t slot, hs_sched_item_t *it)
{
    ck_assert(hs_sched_peek(s, it));
    uint64_t t = 0;
    ck_assert_int_eq(hs_sched_lease(s, conn, it->has_slot ? it->slot_offset : slot, &t), HS_OK);
    ck_assert_uint_gt(t, 0);
    return t;
}

/* Deliver the next ready item and release it; returns its ticket or 0. */
static uint64_t deliver(hs_sched_t *s, hs_sched_item_t *it)
{
    if (!hs_sched_next_ready(s, it)) return 0;
    ck_assert_int_eq(it->state, HS_SCHED_FILLED);
    ck_assert_int_eq(hs_sched_delivered(s, it->ticket), HS_OK);
    ck_assert_int_eq(hs_sched_release(s, it->ticket), HS_OK);
    return it->ticket;
}

/* ---- the big one ---------------------------------------------------------- */

#define N_CONN 5
#define MAX_HELD 64

typedef struct {
    uint64_t id;
    uint64_t tickets[MAX_HELD];
    uint32_t n;
} fake_conn_t;

static void run_random_interleaving(hs_sched_order_t order, uint64_t seed)
{
    const uint32_t n = 53, epochs = 4;
    uint64_t bytes[53];
    uint64_t st = seed;
    for (uint32_t i = 0; i < n; i++)
        bytes[i] = 4096 + hs_splitmix64(&st) % (256u << 10);
    hs_cache_t *cache;
    ck_assert_int_eq(hs_cache_create(2ull << 20, 0, &cache), HS_OK); /* ~12 average batches */
    hs_sched_config_t cfg = {
        .n_batches = n, .bytes = bytes, .epochs = epochs, .seed = SEED, .order = order};
    hs_sched_t *s;
    ck_assert_int_eq(hs_sched_create(&cfg, &s), HS_OK);

    fake_conn_t conns[N_CONN];
    uint64_t next_conn = 1;
    for (int i = 0; i < N_CONN; i++)
        conns[i] = (fake_conn_t){.id = next_conn++, .n = 0};
    uint64_t stale[256];
    uint32_t n_stale = 0;
    uint8_t seen[4][53] = {{0}};
    uint32_t perms[4][53];
    for (uint32_t e = 0; e < epochs; e++)
        hs_permutation(SEED, e, n, perms[e]);
    uint64_t n_delivered = 0, n_returned = 0, last_seq = 0, n_requeued = 0;

    uint64_t steps = 0;
    while (!hs_sched_finished(s)) {
        ck_assert_msg(++steps < 1000000, "no progress after %llu steps", (unsigned long long)steps);
        fake_conn_t *c = &conns[hs_splitmix64(&st) % N_CONN];
        uint32_t action = (uint32_t)(hs_splitmix64(&st) % 100);
        hs_sched_item_t it;
        if (action < 40) { /* lease, if the cache has room */
            if (c->n == MAX_HELD || !hs_sched_peek(s, &it)) continue;
            uint64_t slot = it.slot_offset;
            if (!it.has_slot) {
                hs_cache_slot_t cs;
                if (hs_cache_reserve(cache, it.bytes, &cs) != HS_OK) continue;
                slot = cs.offset;
            }
            uint64_t t;
            ck_assert_int_eq(hs_sched_lease(s, c->id, slot, &t), HS_OK);
            c->tickets[c->n++] = t;
        } else if (action < 75) { /* a DONE arrives */
            if (!c->n) continue;
            uint32_t k = (uint32_t)(hs_splitmix64(&st) % c->n);
            uint64_t t = c->tickets[k];
            ck_assert_int_eq(hs_sched_lookup(s, c->id, t, &it), HS_OK);
            ck_assert_uint_eq(it.bytes, bytes[it.batch]);
            ck_assert(hs_cache_contains(cache, (uint8_t *)hs_cache_base(cache) + it.slot_offset,
                                        it.bytes));
            /* no other connection can claim it */
            ck_assert_int_eq(hs_sched_lookup(s, conns[(c - conns + 1) % N_CONN].id, t, &it),
                             HS_ERR_NOT_FOUND);
            if (hs_splitmix64(&st) % 20 == 0) {
                ck_assert_int_eq(hs_sched_requeue(s, c->id, t), HS_OK); /* bad checksum */
                n_requeued++;
                if (n_stale < 256) stale[n_stale++] = t;
            } else {
                ck_assert_int_eq(hs_sched_fill(s, c->id, t), HS_OK);
            }
            c->tickets[k] = c->tickets[--c->n];
        } else if (action < 97) { /* the trainer takes one */
            if (!hs_sched_next_ready(s, &it)) continue;
            ck_assert_int_eq(hs_sched_delivered(s, it.ticket), HS_OK);
            ck_assert_msg(!seen[it.epoch][it.batch], "epoch %u batch %u delivered twice", it.epoch,
                          it.batch);
            seen[it.epoch][it.batch] = 1;
            if (order == HS_SCHED_PLAN) {
                ck_assert_uint_eq(it.seq, n_delivered); /* strictly the plan */
                ck_assert_uint_eq(it.batch, perms[it.epoch][it.pos]);
            }
            last_seq = it.seq;
            n_delivered++;
            ck_assert_int_eq(hs_sched_release(s, it.ticket), HS_OK);
            ck_assert_int_eq(hs_cache_free(cache, it.slot_offset), HS_OK);
        } else { /* the connection dies and comes back as a new one */
            uint32_t held = c->n;
            ck_assert_uint_eq(hs_sched_leases_of(s, c->id), held);
            ck_assert_uint_eq(hs_sched_return_leases(s, c->id), held);
            ck_assert_uint_eq(hs_sched_leases_of(s, c->id), 0);
            for (uint32_t i = 0; i < held && n_stale < 256; i++)
                stale[n_stale++] = c->tickets[i];
            n_returned += held;
            *c = (fake_conn_t){.id = next_conn++, .n = 0};
        }
        /* late DONEs for retired tickets are refused, whoever sends them */
        if (n_stale && steps % 7 == 0) {
            uint64_t t = stale[hs_splitmix64(&st) % n_stale];
            for (int i = 0; i < N_CONN; i++) {
                ck_assert_int_eq(hs_sched_lookup(s, conns[i].id, t, &it), HS_ERR_NOT_FOUND);
                ck_assert_int_eq(hs_sched_fill(s, conns[i].id, t), HS_ERR_NOT_FOUND);
            }
        }
    }
    (void)last_seq;
    for (uint32_t e = 0; e < epochs; e++)
        for (uint32_t b = 0; b < n; b++)
            ck_assert_msg(seen[e][b], "epoch %u batch %u never delivered", e, b);
    hs_sched_stats_t ss;
    hs_sched_stats(s, &ss);
    ck_assert_uint_eq(ss.planned, (uint64_t)n * epochs);
    ck_assert_uint_eq(ss.delivered, (uint64_t)n * epochs);
    ck_assert_uint_eq(n_delivered, (uint64_t)n * epochs);
    ck_assert_uint_eq(ss.duplicates, 0);
    ck_assert_uint_eq(ss.returned, n_returned);
    ck_assert_uint_eq(ss.requeued, n_requeued);
    ck_assert_uint_gt(n_returned, 10); /* the run did exercise disconnects */
    ck_assert_uint_gt(n_requeued, 5);
    ck_assert_uint_eq(ss.issued, ss.delivered + n_returned + n_requeued);
    ck_assert_uint_eq(ss.pending + ss.leased + ss.filled + ss.delivering, 0);
    ck_assert(!hs_sched_peek(s, &(hs_sched_item_t){0}));
    hs_cache_stats_t cs;
    hs_cache_stats(cache, &cs);
    ck_assert_uint_eq(cs.used, 0); /* every slot came back exactly once */
    hs_sched_destroy(s);
    hs_cache_destroy(cache);
}

START_TEST(every_item_is_delivered_exactly_once_over_random_leases_fills_and_disconnects)
{
    for (uint64_t seed = 1; seed <= 4; seed++)
        run_random_interleaving(HS_SCHED_ARRIVAL, seed);
}
END_TEST

START_TEST(plan_order_stays_exactly_once_and_in_order_over_random_interleavings)
{
    for (uint64_t seed = 1; seed <= 4; seed++)
        run_random_interleaving(HS_SCHED_PLAN, seed);
}
END_TEST

/* ---- focused behaviours --------------------------------------------------------- */

START_TEST(bytes_of_a_connection_follow_its_leases_through_fill_requeue_and_return)
{
    hs_sched_t *s = sched_new(10, 1, HS_SCHED_ARRIVAL, NULL); /* batch b is 1000 + b bytes */
    hs_sched_item_t it[4];
    uint64_t tk[4], sum = 0;
    for (int i = 0; i < 4; i++) {
        tk[i] = lease(s, 1, 100 * (uint64_t)i, &it[i]);
        sum += it[i].bytes;
        ck_assert_uint_eq(hs_sched_bytes_of(s, 1), sum);
    }
    ck_assert_uint_eq(hs_sched_bytes_of(s, 2), 0);
    ck_assert_int_eq(hs_sched_fill(s, 1, tk[0]), HS_OK);
    sum -= it[0].bytes;
    ck_assert_uint_eq(hs_sched_bytes_of(s, 1), sum);
    ck_assert_int_eq(hs_sched_requeue(s, 1, tk[1]), HS_OK);
    sum -= it[1].bytes;
    ck_assert_uint_eq(hs_sched_bytes_of(s, 1), sum);
    /* the requeued item, leased again by another connection, counts there */
    hs_sched_item_t again;
    lease(s, 2, 0, &again);
    ck_assert_uint_eq(again.batch, it[1].batch);
    ck_assert_uint_eq(hs_sched_bytes_of(s, 2), it[1].bytes);
    ck_assert_uint_eq(hs_sched_return_leases(s, 1), 2);
    ck_assert_uint_eq(hs_sched_bytes_of(s, 1), 0);
    ck_assert_uint_eq(hs_sched_leases_of(s, 1), 0);
    hs_sched_destroy(s);
}
END_TEST

START_TEST(returned_leases_go_to_the_front_in_plan_order_and_keep_their_slots)
{
    hs_sched_t *s = sched_new(10, 1, HS_SCHED_ARRIVAL, NULL);
    uint32_t perm[10];
    hs_permutation(SEED, 0, 10, perm);
    hs_sched_item_t it;
    uint64_t tk[5];
    /* A holds plan positions 0, 2, 4; B holds 1, 3; slot = 1000 * (pos + 1) */
    for (uint32_t p = 0; p < 5; p++) {
        tk[p] = lease(s, p % 2 ? 2 : 1, 1000 * (p + 1), &it);
        ck_assert_uint_eq(it.pos, p);
        ck_assert_uint_eq(it.batch, perm[p]);
        ck_assert(!it.has_slot);
    }
    ck_assert_uint_eq(hs_sched_leases_of(s, 1), 3);
    ck_assert_uint_eq(hs_sched_return_leases(s, 1), 3);
    ck_assert_uint_eq(hs_sched_return_leases(s, 1), 0);
    ck_assert(hs_sched_peek(s, &it));
    ck_assert(it.has_slot);
    ck_assert_uint_eq(it.pos, 0);
    ck_assert_uint_eq(it.slot_offset, 1000);
    ck_assert_uint_eq(it.batch, perm[0]);
    /* B dies too: its items join A's, all in plan order */
    ck_assert_uint_eq(hs_sched_return_leases(s, 2), 2);
    hs_sched_stats_t ss;
    hs_sched_stats(s, &ss);
    ck_assert_uint_eq(ss.pending_returned, 5);
    ck_assert_uint_eq(ss.leased, 0);
    uint64_t t;
    ck_assert_int_eq(hs_sched_lease(s, 3, 777, &t), HS_ERR_INVALID); /* not its slot */
    for (uint32_t p = 0; p < 5; p++) {
        uint64_t nt = lease(s, 3, 0, &it);
        ck_assert(it.has_slot);
        ck_assert_uint_eq(it.pos, p);
        ck_assert_uint_eq(it.slot_offset, 1000 * (p + 1));
        ck_assert_uint_gt(nt, tk[4]); /* fresh ticket ids */
        ck_assert_int_eq(hs_sched_lookup(s, 3, nt, &it), HS_OK);
        ck_assert_uint_eq(it.slot_offset, 1000 * (p + 1));
    }
    /* then the queue continues with items never leased */
    ck_assert(hs_sched_peek(s, &it));
    ck_assert(!it.has_slot);
    ck_assert_uint_eq(it.pos, 5);
    hs_sched_destroy(s);
}
END_TEST

START_TEST(lookup_rejects_a_ticket_held_by_another_connection_and_stale_tickets)
{
    hs_sched_t *s = sched_new(4, 1, HS_SCHED_ARRIVAL, NULL);
    hs_sched_item_t it, got;
    uint64_t t1 = lease(s, 1, 0, &it);
    ck_assert_int_eq(hs_sched_lookup(s, 1, t1, &got), HS_OK);
    ck_assert_uint_eq(got.batch, it.batch);
    ck_assert_uint_eq(got.conn, 1);
    ck_assert_int_eq(got.state, HS_SCHED_LEASED);
    ck_assert_int_eq(hs_sched_lookup(s, 2, t1, &got), HS_ERR_NOT_FOUND);
    ck_assert_int_eq(hs_sched_fill(s, 2, t1), HS_ERR_NOT_FOUND);
    ck_assert_int_eq(hs_sched_requeue(s, 2, t1), HS_ERR_NOT_FOUND);
    ck_assert_int_eq(hs_sched_lookup(s, 1, 0, &got), HS_ERR_NOT_FOUND);
    ck_assert_int_eq(hs_sched_lookup(s, 1, t1 + 1000, &got), HS_ERR_NOT_FOUND);
    /* conn 1 dies; conn 3 gets the same item under a new ticket */
    ck_assert_uint_eq(hs_sched_return_leases(s, 1), 1);
    ck_assert_int_eq(hs_sched_lookup(s, 1, t1, &got), HS_ERR_NOT_FOUND);
    uint64_t t2 = lease(s, 3, 0, &got);
    ck_assert_uint_ne(t2, t1);
    ck_assert_uint_eq(got.batch, it.batch);
    ck_assert_int_eq(hs_sched_fill(s, 1, t1), HS_ERR_NOT_FOUND); /* the late DONE */
    ck_assert_int_eq(hs_sched_fill(s, 3, t1), HS_ERR_NOT_FOUND);
    ck_assert_int_eq(hs_sched_fill(s, 3, t2), HS_OK);
    /* a second DONE for a filled ticket is not a lease any more */
    ck_assert_int_eq(hs_sched_lookup(s, 3, t2, &got), HS_ERR_NOT_FOUND);
    ck_assert_int_eq(hs_sched_fill(s, 3, t2), HS_ERR_NOT_FOUND);
    ck_assert_int_eq(hs_sched_get(s, t2, &got), HS_OK);
    ck_assert_int_eq(got.state, HS_SCHED_FILLED);
    ck_assert_int_eq(hs_sched_get(s, t1, &got), HS_ERR_NOT_FOUND);
    hs_sched_destroy(s);
}
END_TEST

START_TEST(plan_order_delivers_strictly_in_plan_order_when_fills_arrive_out_of_order)
{
    const uint32_t n = 9;
    hs_sched_t *s = sched_new(n, 2, HS_SCHED_PLAN, NULL);
    uint32_t perm[2][9];
    hs_permutation(SEED, 0, n, perm[0]);
    hs_permutation(SEED, 1, n, perm[1]);
    hs_sched_item_t it;
    uint64_t tk[18];
    for (uint32_t i = 0; i < 2 * n; i++)
        tk[i] = lease(s, 1 + i % 3, i * 4096, &it);
    /* fill everything in reverse: nothing is ready until the first is */
    for (uint32_t i = 2 * n; i-- > 1;) {
        ck_assert_int_eq(hs_sched_fill(s, 1 + i % 3, tk[i]), HS_OK);
        ck_assert(!hs_sched_next_ready(s, &it));
    }
    ck_assert_int_eq(hs_sched_delivered(s, tk[5]), HS_ERR_INVALID); /* not next */
    ck_assert_int_eq(hs_sched_fill(s, 1, tk[0]), HS_OK);
    for (uint32_t i = 0; i < 2 * n; i++) {
        ck_assert_uint_eq(deliver(s, &it), tk[i]);
        ck_assert_uint_eq(it.epoch, i / n);
        ck_assert_uint_eq(it.pos, i % n);
        ck_assert_uint_eq(it.batch, perm[i / n][i % n]);
    }
    ck_assert(!hs_sched_next_ready(s, &it));
    ck_assert(hs_sched_finished(s));
    hs_sched_destroy(s);
}
END_TEST

START_TEST(arrival_order_delivers_in_fill_order)
{
    const uint32_t n = 12;
    hs_sched_t *s = sched_new(n, 1, HS_SCHED_ARRIVAL, NULL);
    hs_sched_item_t it;
    uint64_t tk[12];
    for (uint32_t i = 0; i < n; i++)
        tk[i] = lease(s, 7, i * 4096, &it);
    uint32_t fill_order[12] = {5, 0, 11, 3, 2, 9, 1, 10, 4, 8, 6, 7};
    for (uint32_t i = 0; i < 6; i++)
        ck_assert_int_eq(hs_sched_fill(s, 7, tk[fill_order[i]]), HS_OK);
    for (uint32_t i = 0; i < 3; i++)
        ck_assert_uint_eq(deliver(s, &it), tk[fill_order[i]]);
    for (uint32_t i = 6; i < n; i++)
        ck_assert_int_eq(hs_sched_fill(s, 7, tk[fill_order[i]]), HS_OK);
    for (uint32_t i = 3; i < n; i++) {
        ck_assert_uint_eq(deliver(s, &it), tk[fill_order[i]]);
        ck_assert_uint_eq(it.slot_offset, fill_order[i] * 4096u);
    }
    ck_assert(hs_sched_finished(s));
    /* a delivered ticket cannot be delivered again */
    ck_assert_int_eq(hs_sched_delivered(s, tk[0]), HS_ERR_INVALID);
    hs_sched_destroy(s);
}
END_TEST

START_TEST(delivering_out_of_the_head_in_arrival_order_keeps_the_ready_list_intact)
{
    hs_sched_t *s = sched_new(4, 1, HS_SCHED_ARRIVAL, NULL);
    hs_sched_item_t it;
    uint64_t tk[4];
    for (uint32_t i = 0; i < 4; i++)
        tk[i] = lease(s, 1, i * 4096, &it);
    for (uint32_t i = 0; i < 4; i++)
        ck_assert_int_eq(hs_sched_fill(s, 1, tk[i]), HS_OK);
    /* the tail, then the middle: the rest still come oldest first */
    ck_assert_int_eq(hs_sched_delivered(s, tk[3]), HS_OK);
    ck_assert_int_eq(hs_sched_delivered(s, tk[1]), HS_OK);
    ck_assert_uint_eq(deliver(s, &it), tk[0]);
    ck_assert_uint_eq(deliver(s, &it), tk[2]);
    ck_assert_uint_eq(deliver(s, &it), 0);
    ck_assert(hs_sched_finished(s));
    hs_sched_destroy(s);
}
END_TEST

START_TEST(finished_only_after_every_item_of_every_epoch)
{
    hs_sched_t *s = sched_new(3, 2, HS_SCHED_ARRIVAL, NULL);
    hs_sched_item_t it;
    uint64_t tk[6];
    for (uint32_t i = 0; i < 6; i++) {
        ck_assert(!hs_sched_finished(s));
        tk[i] = lease(s, 1, i * 4096, &it);
        ck_assert_uint_eq(it.epoch,
                          i / 3); /* next epoch's tickets issue before this one is delivered */
    }
    ck_assert(!hs_sched_peek(s, &it));
    uint64_t t;
    ck_assert_int_eq(hs_sched_lease(s, 1, 0, &t), HS_ERR_NOT_FOUND);
    for (uint32_t i = 0; i < 6; i++) {
        ck_assert(!hs_sched_finished(s));
        ck_assert_int_eq(hs_sched_fill(s, 1, tk[i]), HS_OK);
        ck_assert(!hs_sched_finished(s));
        ck_assert_uint_eq(deliver(s, &it), tk[i]);
    }
    ck_assert(hs_sched_finished(s));
    hs_sched_stats_t ss;
    hs_sched_stats(s, &ss);
    ck_assert_uint_eq(ss.delivered, 6);
    ck_assert_uint_eq(ss.released, 6);
    hs_sched_destroy(s);
}
END_TEST

START_TEST(requeue_after_failed_verification_puts_the_item_first_with_its_slot)
{
    hs_sched_t *s = sched_new(5, 1, HS_SCHED_PLAN, NULL);
    hs_sched_item_t it, first;
    uint64_t t0 = lease(s, 1, 8192, &first);
    uint64_t t1 = lease(s, 2, 4096 * 9, &it);
    ck_assert_int_eq(hs_sched_fill(s, 2, t1), HS_OK);
    ck_assert_int_eq(hs_sched_requeue(s, 1, t0), HS_OK);
    ck_assert_uint_eq(hs_sched_leases_of(s, 1), 0);
    ck_assert(hs_sched_peek(s, &it));
    ck_assert(it.has_slot);
    ck_assert_uint_eq(it.slot_offset, 8192);
    ck_assert_uint_eq(it.batch, first.batch);
    uint64_t t2 = lease(s, 2, 0, &it);
    ck_assert_int_eq(hs_sched_fill(s, 1, t0), HS_ERR_NOT_FOUND);
    ck_assert(!hs_sched_next_ready(s, &it)); /* PLAN: the requeued item is first */
    ck_assert_int_eq(hs_sched_fill(s, 2, t2), HS_OK);
    ck_assert_uint_eq(deliver(s, &it), t2);
    ck_assert_uint_eq(it.batch, first.batch);
    ck_assert_uint_eq(deliver(s, &it), t1);
    hs_sched_stats_t ss;
    hs_sched_stats(s, &ss);
    ck_assert_uint_eq(ss.requeued, 1);
    hs_sched_destroy(s);
}
END_TEST

START_TEST(resume_skips_batches_already_delivered)
{
    const uint32_t n = 10;
    uint64_t bytes[10];
    uint32_t toks[10];
    for (uint32_t i = 0; i < n; i++) {
        bytes[i] = 100 + i;
        toks[i] = 10 * i;
    }
    uint32_t perm1[10];
    hs_permutation(SEED, 1, n, perm1);
    /* the trainer had acknowledged the first 4 of epoch 1 in plan order, and
     * one more out of order */
    uint8_t done[2] = {0};
    for (uint32_t p = 0; p < 4; p++)
        done[perm1[p] / 8] |= (uint8_t)(1u << (perm1[p] % 8));
    done[perm1[7] / 8] |= (uint8_t)(1u << (perm1[7] % 8));
    hs_sched_config_t cfg = {.n_batches = n,
                             .bytes = bytes,
                             .n_tokens = toks,
                             .epochs = 3,
                             .seed = SEED,
                             .order = HS_SCHED_PLAN,
                             .start_epoch = 1,
                             .start_done = done};
    hs_sched_t *s;
    ck_assert_int_eq(hs_sched_create(&cfg, &s), HS_OK);
    hs_sched_stats_t ss;
    hs_sched_stats(s, &ss);
    ck_assert_uint_eq(ss.planned, 2 * n - 5);
    ck_assert_uint_eq(ss.pending, 2 * n - 5);
    uint32_t expect_pos[] = {4, 5, 6, 8, 9};
    hs_sched_item_t it;
    uint64_t tk[15];
    for (uint32_t i = 0; i < 15; i++) {
        tk[i] = lease(s, 1, i * 4096, &it);
        if (i < 5) {
            ck_assert_uint_eq(it.epoch, 1);
            ck_assert_uint_eq(it.pos, expect_pos[i]);
            ck_assert_uint_eq(it.batch, perm1[expect_pos[i]]);
        } else {
            ck_assert_uint_eq(it.epoch, 2);
            ck_assert_uint_eq(it.pos, i - 5);
        }
        ck_assert_uint_eq(it.bytes, 100 + it.batch);
        ck_assert_uint_eq(it.n_tokens, 10 * it.batch);
    }
    ck_assert(!hs_sched_peek(s, &it));
    for (uint32_t i = 15; i-- > 0;)
        ck_assert_int_eq(hs_sched_fill(s, 1, tk[i]), HS_OK);
    for (uint32_t i = 0; i < 15; i++)
        ck_assert_uint_eq(deliver(s, &it), tk[i]);
    ck_assert(hs_sched_finished(s));
    hs_sched_destroy(s);
}
END_TEST

START_TEST(many_tickets_in_flight_survive_table_growth)
{
    const uint32_t n = 3000;
    hs_sched_t *s = sched_new(n, 1, HS_SCHED_ARRIVAL, NULL);
    static uint64_t tk[3000];
    hs_sched_item_t it;
    for (uint32_t i = 0; i < n; i++)
        tk[i] = lease(s, 1 + i % 4, i, &it);
    /* return two conns' leases, re-lease them, then fill all in a scrambled order */
    ck_assert_uint_eq(hs_sched_return_leases(s, 2), n / 4);
    ck_assert_uint_eq(hs_sched_return_leases(s, 4), n / 4);
    for (uint32_t i = 0; i < n; i++) {
        if (i % 4 == 1 || i % 4 == 3) {
            tk[i] = lease(s, 5, 0, &it);
            ck_assert_uint_eq(it.slot_offset, i); /* plan order, slot kept */
        }
    }
    for (uint32_t k = 0; k < n; k++) {
        uint32_t i = (uint32_t)((k * 7919ull) % n);
        uint64_t conn = (i % 4 == 1 || i % 4 == 3) ? 5 : 1 + i % 4;
        ck_assert_int_eq(hs_sched_lookup(s, conn, tk[i], &it), HS_OK);
        ck_assert_uint_eq(it.slot_offset, i);
        ck_assert_int_eq(hs_sched_fill(s, conn, tk[i]), HS_OK);
    }
    for (uint32_t i = 0; i < n; i++)
        ck_assert_uint_ne(deliver(s, &it), 0);
    ck_assert(hs_sched_finished(s));
    hs_sched_destroy(s);
}
END_TEST

START_TEST(create_refuses_malformed_plans)
{
    uint64_t bytes[3] = {10, 0, 10};
    hs_sched_t *s = NULL;
    hs_sched_config_t cfg = {.n_batches = 3, .bytes = bytes, .epochs = 1};
    ck_assert_int_eq(hs_sched_create(&cfg, &s), HS_ERR_INVALID); /* a 0-byte batch */
    bytes[1] = 10;
    cfg.n_batches = 0;
    ck_assert_int_eq(hs_sched_create(&cfg, &s), HS_ERR_INVALID);
    cfg.n_batches = 3;
    cfg.start_epoch = 1;
    ck_assert_int_eq(hs_sched_create(&cfg, &s), HS_ERR_INVALID);
    cfg.start_epoch = 0;
    cfg.order = (hs_sched_order_t)7;
    ck_assert_int_eq(hs_sched_create(&cfg, &s), HS_ERR_INVALID);
    ck_assert_ptr_null(s);
    ck_assert_int_eq(hs_sched_order_parse("plan", &cfg.order), HS_OK);
    ck_assert_int_eq(cfg.order, HS_SCHED_PLAN);
    ck_assert_str_eq(hs_sched_order_str(cfg.order), "plan");
    hs_sched_order_t o = HS_SCHED_PLAN;
    ck_assert_int_eq(hs_sched_order_parse("arrival", &o), HS_OK);
    ck_assert_int_eq(o, HS_SCHED_ARRIVAL);
    ck_assert_int_eq(hs_sched_order_parse("Plan", &o), HS_ERR_INVALID);
    ck_assert_int_eq(o, HS_SCHED_ARRIVAL);
    ck_assert_int_eq(hs_sched_create(&cfg, &s), HS_OK);
    hs_sched_destroy(s);
    hs_sched_destroy(NULL);
}
END_TEST

/* ---- ranks: shards ------------------------------------------------------------ */

/* Runs rank `rank` of `world` through `epochs` epochs (lease, fill, deliver
 * one by one), counting each delivery in seen[e * n + b], adding its tokens
 * to tokens_of_epoch[e] and its batch id to order_out[k] when given. */
static void run_rank(uint32_t n, const uint32_t *tokens, uint32_t epochs, uint32_t rank,
                     uint32_t world, hs_shard_uneven_t uneven, hs_sched_order_t order,
                     uint32_t *seen, uint64_t *tokens_of_epoch, uint32_t *order_out)
{
    static uint64_t bytes[4096];
    for (uint32_t i = 0; i < n; i++)
        bytes[i] = 1000 + i;
    hs_sched_config_t cfg = {.n_batches = n,
                             .bytes = bytes,
                             .n_tokens = tokens,
                             .epochs = epochs,
                             .seed = SEED,
                             .order = order,
                             .rank = rank,
                             .world = world,
                             .uneven = uneven};
    hs_sched_t *s;
    ck_assert_int_eq(hs_sched_create(&cfg, &s), HS_OK);
    hs_sched_stats_t st;
    hs_sched_stats(s, &st);
    uint32_t m = hs_shard_per_rank(n, world, uneven);
    ck_assert_uint_eq(st.per_epoch, m);
    ck_assert_uint_eq(st.planned, (uint64_t)m * epochs);
    hs_sched_item_t it;
    uint32_t k = 0;
    while (hs_sched_peek(s, &it)) {
        uint64_t t = lease(s, 1, 0, &it);
        ck_assert_int_eq(hs_sched_fill(s, 1, t), HS_OK);
        ck_assert_uint_ne(deliver(s, &it), 0);
        seen[it.epoch * n + it.batch]++;
        if (tokens_of_epoch) tokens_of_epoch[it.epoch] += tokens ? tokens[it.batch] : 0;
        if (order_out) order_out[k] = it.batch;
        k++;
    }
    ck_assert_uint_eq(k, (uint64_t)m * epochs);
    ck_assert(hs_sched_finished(s));
    hs_sched_destroy(s);
}

static void check_union(uint32_t n, uint32_t world, uint32_t epochs, hs_shard_uneven_t uneven)
{
    uint32_t tokens[512];
    uint64_t st = 77;
    for (uint32_t b = 0; b < n; b++)
        tokens[b] = 100 + (uint32_t)(hs_splitmix64(&st) % 4000);
    uint32_t *all = calloc((size_t)epochs * n, sizeof(uint32_t));
    uint32_t *mine = calloc((size_t)epochs * n, sizeof(uint32_t));
    uint64_t tok[8][4] = {{0}};
    for (uint32_t r = 0; r < world; r++) {
        memset(mine, 0, (size_t)epochs * n * sizeof(uint32_t));
        run_rank(n, tokens, epochs, r, world, uneven, HS_SCHED_ARRIVAL, mine, tok[r], NULL);
        for (uint32_t i = 0; i < epochs * n; i++) {
            ck_assert_uint_le(mine[i], 1); /* a rank never gets a batch twice in an epoch */
            all[i] += mine[i];
        }
    }
    uint32_t m = hs_shard_per_rank(n, world, uneven);
    for (uint32_t e = 0; e < epochs; e++) {
        uint32_t once = 0, twice = 0, none = 0;
        for (uint32_t b = 0; b < n; b++) {
            uint32_t c = all[e * n + b];
            once += c == 1;
            twice += c >= 2;
            none += c == 0;
        }
        if (uneven == HS_SHARD_DROP) {
            ck_assert_uint_eq(twice, 0);
            ck_assert_uint_eq(none, n % world); /* the tail, skipped */
            ck_assert_uint_eq(once, world * m);
        } else {
            uint32_t extra = 0;
            for (uint32_t b = 0; b < n; b++)
                extra += all[e * n + b] - 1;
            ck_assert_uint_eq(none, 0);
            ck_assert_uint_eq(extra, world * m - n); /* taken again by the short ranks */
        }
        if (n < world) continue;
        /* token counts balanced: within one batch's worth of each other (two
         * with repeat, where a short rank's extra batch is of any size) */
        uint64_t lo = UINT64_MAX, hi = 0;
        for (uint32_t r = 0; r < world; r++) {
            if (tok[r][e] < lo) lo = tok[r][e];
            if (tok[r][e] > hi) hi = tok[r][e];
        }
        ck_assert_msg(hi - lo <= (uneven == HS_SHARD_DROP ? 4100u : 8200u),
                      "epoch %u: rank tokens %llu..%llu", e, (unsigned long long)lo,
                      (unsigned long long)hi);
    }
    free(all);
    free(mine);
}

START_TEST(every_batch_goes_to_exactly_one_rank_and_every_rank_gets_as_many_with_drop)
{
    check_union(103, 4, 3, HS_SHARD_DROP);
    check_union(100, 4, 2, HS_SHARD_DROP);
    check_union(7, 3, 2, HS_SHARD_DROP);
}
END_TEST

START_TEST(repeat_gives_the_short_ranks_batches_from_the_epoch_start_never_their_own)
{
    check_union(103, 4, 3, HS_SHARD_REPEAT);
    check_union(101, 4, 2, HS_SHARD_REPEAT);
    check_union(5, 8, 2, HS_SHARD_REPEAT); /* fewer batches than ranks */
    check_union(9, 2, 2, HS_SHARD_REPEAT);
}
END_TEST

START_TEST(token_counts_stay_balanced_across_ranks_with_skewed_lengths)
{
    /* a few very large batches among many small ones */
    uint32_t n = 400, world = 4, tokens[400];
    for (uint32_t b = 0; b < n; b++)
        tokens[b] = b < 40 ? 60000 : 500 + b;
    uint64_t tok[4][1] = {{0}};
    uint32_t *seen = calloc(n, sizeof(uint32_t));
    uint64_t total = 0;
    for (uint32_t r = 0; r < world; r++) {
        run_rank(n, tokens, 1, r, world, HS_SHARD_DROP, HS_SCHED_ARRIVAL, seen, tok[r], NULL);
        total += tok[r][0];
    }
    for (uint32_t r = 0; r < world; r++) {
        double share = (double)tok[r][0] / ((double)total / world);
        ck_assert_msg(share > 0.99 && share < 1.01, "rank %u has %.3f of a fair share", r, share);
    }
    free(seen);
}
END_TEST

START_TEST(plan_order_of_a_rank_is_reproducible_and_differs_between_ranks_and_epochs)
{
    uint32_t n = 50, a[100], b[100], c[100];
    uint32_t *seen = calloc(2 * n, sizeof(uint32_t));
    run_rank(n, NULL, 2, 1, 3, HS_SHARD_DROP, HS_SCHED_PLAN, seen, NULL, a);
    run_rank(n, NULL, 2, 1, 3, HS_SHARD_DROP, HS_SCHED_PLAN, seen, NULL, b);
    run_rank(n, NULL, 2, 2, 3, HS_SHARD_DROP, HS_SCHED_PLAN, seen, NULL, c);
    uint32_t m = hs_shard_per_rank(n, 3, HS_SHARD_DROP);
    ck_assert_uint_eq(m, 16);
    ck_assert_mem_eq(a, b, 2 * m * sizeof(uint32_t));
    ck_assert(memcmp(a, c, m * sizeof(uint32_t)) != 0);
    ck_assert(memcmp(a, a + m, m * sizeof(uint32_t)) != 0); /* a new deal per epoch */
    free(seen);
}
END_TEST

START_TEST(a_resumed_rank_delivers_the_rest_of_its_own_shard_only)
{
    uint32_t n = 30, world = 3, m = 10;
    uint32_t full[20];
    uint32_t *seen = calloc(2 * n, sizeof(uint32_t));
    run_rank(n, NULL, 2, 2, world, HS_SHARD_DROP, HS_SCHED_PLAN, seen, NULL, full);
    /* the first 4 of epoch 0 were delivered before */
    uint8_t done[(2 * 30 + 7) / 8] = {0};
    for (uint32_t i = 0; i < 4; i++)
        done[full[i] / 8] |= (uint8_t)(1u << (full[i] % 8));
    static uint64_t bytes[30];
    for (uint32_t i = 0; i < n; i++)
        bytes[i] = 1000 + i;
    hs_sched_config_t cfg = {.n_batches = n,
                             .bytes = bytes,
                             .epochs = 2,
                             .seed = SEED,
                             .order = HS_SCHED_PLAN,
                             .resume_done = done,
                             .rank = 2,
                             .world = world};
    hs_sched_t *s;
    ck_assert_int_eq(hs_sched_create(&cfg, &s), HS_OK);
    hs_sched_stats_t st;
    hs_sched_stats(s, &st);
    ck_assert_uint_eq(st.planned, 2 * m - 4);
    hs_sched_item_t it;
    uint32_t k = 4;
    while (hs_sched_peek(s, &it)) {
        uint64_t t = lease(s, 1, 0, &it);
        ck_assert_int_eq(hs_sched_fill(s, 1, t), HS_OK);
        ck_assert_uint_ne(deliver(s, &it), 0);
        ck_assert_uint_eq(it.batch, full[k]);
        k++;
    }
    ck_assert_uint_eq(k, 2 * m);
    hs_sched_destroy(s);
    free(seen);
}
END_TEST

START_TEST(a_rank_outside_the_world_and_drop_with_too_few_batches_are_refused)
{
    uint64_t bytes[4] = {1, 1, 1, 1};
    hs_sched_config_t cfg = {.n_batches = 4, .bytes = bytes, .epochs = 1, .rank = 4, .world = 4};
    hs_sched_t *s = NULL;
    ck_assert_int_eq(hs_sched_create(&cfg, &s), HS_ERR_INVALID);
    cfg.rank = 0;
    cfg.world = 5;
    ck_assert_int_eq(hs_sched_create(&cfg, &s), HS_ERR_INVALID);
    cfg.uneven = HS_SHARD_REPEAT;
    ck_assert_int_eq(hs_sched_create(&cfg, &s), HS_OK);
    hs_sched_destroy(s);
    hs_shard_uneven_t u;
    ck_assert_int_eq(hs_shard_uneven_parse("repeat", &u), HS_OK);
    ck_assert_int_eq(u, HS_SHARD_REPEAT);
    ck_assert_int_eq(hs_shard_uneven_parse("pad", &u), HS_ERR_INVALID);
}
END_TEST

/* 1000 items in plan order, 10 more leased at once each round up to
 * `alive`, filled newest first (so the filled ones wait for the oldest); the allocations made
 * after the first round, or UINT64_MAX when the run went wrong. No Check assertion
 * inside: they allocate. */
static uint64_t allocations_with_alive(uint32_t live_plan, uint32_t alive)
{
    static uint64_t bytes[50];
    for (uint32_t i = 0; i < 50; i++)
        bytes[i] = 4096;
    hs_sched_config_t cfg = {.n_batches = 50,
                             .bytes = bytes,
                             .epochs = 20,
                             .seed = SEED,
                             .order = HS_SCHED_PLAN,
                             .live_plan = live_plan};
    hs_sched_t *s;
    if (hs_sched_create(&cfg, &s) != HS_OK) return UINT64_MAX;
    uint64_t tickets[256], delivered = 0, n_alloc = 0;
    bool bad = false;
    /* the first round adds the connection's entry: counted from the second */
    for (uint32_t round = 0; !hs_sched_finished(s) && !bad; round++) {
        if (round == 1) alloc_count_start(1, SIZE_MAX);
        uint32_t n = 0;
        hs_sched_item_t it;
        uint32_t now_alive = 10 * (round + 1) < alive ? 10 * (round + 1) : alive;
        while (n < now_alive && hs_sched_peek(s, &it))
            bad |= hs_sched_lease(s, 1, it.has_slot ? it.slot_offset : 0, &tickets[n++]) != HS_OK;
        while (n)
            bad |= hs_sched_fill(s, 1, tickets[--n]) != HS_OK;
        while (hs_sched_next_ready(s, &it)) {
            bad |= hs_sched_delivered(s, it.ticket) != HS_OK;
            bad |= hs_sched_release(s, it.ticket) != HS_OK;
            delivered++;
        }
    }
    n_alloc = alloc_count_stop();
    hs_sched_destroy(s);
    return bad || delivered != 1000 ? UINT64_MAX : n_alloc;
}

START_TEST(tables_planned_for_the_items_alive_at_once_do_not_grow)
{
    if (!ALLOC_COUNT_WORKS) {
        printf("sanitizer build: its allocator is not interposed; count skipped\n");
        return;
    }
    ck_assert_uint_eq(allocations_with_alive(200, 200), 0);
    /* unplanned, the same run grows its tables */
    uint64_t grown = allocations_with_alive(0, 200);
    ck_assert_uint_ne(grown, UINT64_MAX);
    ck_assert_uint_gt(grown, 0);
}
END_TEST

int main(void)
{
    hs_log_set_level(HS_LOG_WARN);
    Suite *s = suite_create("sched");
    TCase *tc = tcase_create("all");
    tcase_add_test(tc,
                   every_item_is_delivered_exactly_once_over_random_leases_fills_and_disconnects);
    tcase_add_test(tc, plan_order_stays_exactly_once_and_in_order_over_random_interleavings);
    tcase_add_test(tc, returned_leases_go_to_the_front_in_plan_order_and_keep_their_slots);
    tcase_add_test(tc, bytes_of_a_connection_follow_its_leases_through_fill_requeue_and_return);
    tcase_add_test(tc, lookup_rejects_a_ticket_held_by_another_connection_and_stale_tickets);
    tcase_add_test(tc, plan_order_delivers_strictly_in_plan_order_when_fills_arrive_out_of_order);
    tcase_add_test(tc, arrival_order_delivers_in_fill_order);
    tcase_add_test(tc, delivering_out_of_the_head_in_arrival_order_keeps_the_ready_list_intact);
    tcase_add_test(tc, finished_only_after_every_item_of_every_epoch);
    tcase_add_test(tc, requeue_after_failed_verification_puts_the_item_first_with_its_slot);
    tcase_add_test(tc, resume_skips_batches_already_delivered);
    tcase_add_test(tc, many_tickets_in_flight_survive_table_growth);
    tcase_add_test(tc, create_refuses_malformed_plans);
    tcase_add_test(tc, every_batch_goes_to_exactly_one_rank_and_every_rank_gets_as_many_with_drop);
    tcase_add_test(tc, repeat_gives_the_short_ranks_batches_from_the_epoch_start_never_their_own);
    tcase_add_test(tc, token_counts_stay_balanced_across_ranks_with_skewed_lengths);
    tcase_add_test(tc, plan_order_of_a_rank_is_reproducible_and_differs_between_ranks_and_epochs);
    tcase_add_test(tc, a_resumed_rank_delivers_the_rest_of_its_own_shard_only);
    tcase_add_test(tc, a_rank_outside_the_world_and_drop_with_too_few_batches_are_refused);
    tcase_add_test(tc, tables_planned_for_the_items_alive_at_once_do_not_grow);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
