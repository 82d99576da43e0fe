/* SPDX-License-Identifier: Apache-2.0 */
/* ranks.c - consumers of one run learning of each other (docs/ranks.md).
 *
 * Two consumers that both claim rank r with producers of their own would
 * each deliver rank r's shard: every batch of it twice. No consumer talks to
 * another; their producers carry what they see (RANKS, hsflow.proto):
 *   hops 0  a producer tells each consumer it feeds which consumers (rank,
 *           instance id, start time) it is connected to now;
 *   hops 1  a consumer whose producers' reports name two instances of one
 *           rank passes those claims to its producers (once per instance);
 *   hops 2  each producer passes them on to its consumers of that rank.
 * A consumer told of another instance of its own rank compares start times
 * (then instance ids): the later one stops, naming both; the earlier one
 * says so and goes on. Two claimants are found when some consumer is fed by
 * a producer of each, or one producer feeds both (it refuses that itself). */
#include "consumer_int.h"
#include "hs_log.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Whether claim a (start, id) came before claim b. */
static bool claim_before(uint64_t start_a, uint64_t id_a, uint64_t start_b, uint64_t id_b)
{
    return start_a != start_b ? start_a < start_b : id_a < id_b;
}

static bool peer_live(const peer_t *p)
{
    return p->conn && !p->dropped && !p->bye_sent &&
           (p->state == PEER_READY || p->state == PEER_SENDING_PLAN);
}

/* Another instance claims this consumer's rank: the later of the two stops. */
static void own_rank_claimed(hs_consumer_t *c, const peer_t *p, const rank_claim_t *o)
{
    double dt_s = ((double)c->started_unix_ms - (double)o->started_unix_ms) / 1e3;
    if (claim_before(c->started_unix_ms, c->instance_id, o->started_unix_ms, o->instance_id)) {
        if (c->net.ranks_yielded_to == o->instance_id) return;
        c->net.ranks_yielded_to = o->instance_id;
        hs_warn("another consumer claims rank %u of %u too: %s (instance %016" PRIx64
                ", started %.3f s after this one), seen through producer %s; it started later "
                "and stops, this one goes on. Give each consumer its own --rank",
                c->cfg.rank, c->cfg.world, o->name, o->instance_id, -dt_s, p->name);
        return;
    }
    if (c->stop) return;
    hs__consumer_fatal(c,
                       "two consumers claim rank %u of %u: this one, %s (instance %016" PRIx64
                       "), and %s (instance %016" PRIx64 ", started %.3f s earlier), seen "
                       "through producer %s. This one started later and stops: both would "
                       "deliver rank %u's batches. Give each consumer its own --rank",
                       c->cfg.rank, c->cfg.world, c->name, c->instance_id, o->name, o->instance_id,
                       dt_s, p->name, c->cfg.rank);
    /* (after the reason is set) nothing more to the trainer, not even what is ready: it is this
     * consumer's batches that the other one delivers too */
    pthread_mutex_lock(&c->delivery.lock);
    c->delivery.halted = true;
    pthread_cond_broadcast(&c->delivery.cond);
    pthread_mutex_unlock(&c->delivery.lock);
}

static bool relayed(const hs_consumer_t *c, uint64_t id)
{
    for (uint32_t i = 0; i < c->net.n_ranks_relayed; i++)
        if (c->net.ranks_relayed[i] == id) return true;
    return false;
}

static void relay_mark(hs_consumer_t *c, uint64_t id)
{
    uint32_t cap = sizeof(c->net.ranks_relayed) / sizeof(c->net.ranks_relayed[0]);
    if (relayed(c, id)) return;
    if (c->net.n_ranks_relayed == cap) { /* the oldest goes: at worst one is passed on again */
        memmove(c->net.ranks_relayed, c->net.ranks_relayed + 1,
                (cap - 1) * sizeof(c->net.ranks_relayed[0]));
        c->net.n_ranks_relayed--;
    }
    c->net.ranks_relayed[c->net.n_ranks_relayed++] = id;
}

/* Passes claims of rank `rank` by several instances (those in the live
 * producers' reports; at most HS_MSG_MAX_CLAIMS) to every producer that
 * speaks RANKS, unless each was passed on already. */
static void relay_rank(hs_consumer_t *c, uint32_t rank, uint32_t world)
{
    Hsflow__RankClaim cm[HS_MSG_MAX_CLAIMS], *cp[HS_MSG_MAX_CLAIMS];
    size_t n = 0;
    bool fresh = false;
    for (peer_t *p = c->net.peers; p; p = p->next) {
        if (!peer_live(p)) continue;
        for (uint32_t i = 0; i < p->n_claims && n < HS_MSG_MAX_CLAIMS; i++) {
            const rank_claim_t *k = &p->claims[i];
            if (k->rank != rank || k->world != world) continue;
            bool dup = false;
            for (size_t j = 0; j < n && !dup; j++)
                dup = cm[j].instance_id == k->instance_id;
            if (dup) continue;
            Hsflow__RankClaim init = HSFLOW__RANK_CLAIM__INIT;
            cm[n] = init;
            cm[n].rank = k->rank;
            cm[n].world = k->world;
            cm[n].instance_id = k->instance_id;
            cm[n].started_unix_ms = k->started_unix_ms;
            cm[n].consumer_name = (char *)k->name;
            cp[n] = &cm[n];
            fresh |= !relayed(c, k->instance_id);
            n++;
        }
    }
    if (n < 2 || !fresh) return;
    for (size_t j = 0; j < n; j++)
        relay_mark(c, cm[j].instance_id);
    hs_warn("producers report %zu consumers claiming rank %u of %u (%s, %s%s); telling the "
            "producers, so the later ones stop",
            n, rank, world, cm[0].consumer_name, cm[1].consumer_name, n > 2 ? ", ..." : "");
    Hsflow__Ranks r = HSFLOW__RANKS__INIT;
    r.hops = 1;
    r.n_claims = n;
    r.claims = cp;
    for (peer_t *p = c->net.peers; p; p = p->next)
        if (peer_live(p) && p->speaks_ranks) hs__peer_send_msg(c, p, HS_MSG_RANKS, &r.base);
}

/* Every rank that the live producers' reports give two instances. */
static void relay_collisions(hs_consumer_t *c)
{
    for (peer_t *p = c->net.peers; p; p = p->next) {
        if (!peer_live(p)) continue;
        for (uint32_t i = 0; i < p->n_claims; i++) {
            const rank_claim_t *a = &p->claims[i];
            bool other = false;
            for (peer_t *q = c->net.peers; q && !other; q = q->next) {
                if (!peer_live(q)) continue;
                for (uint32_t j = 0; j < q->n_claims && !other; j++)
                    other = q->claims[j].rank == a->rank && q->claims[j].world == a->world &&
                            q->claims[j].instance_id != a->instance_id;
            }
            if (other) relay_rank(c, a->rank, a->world);
        }
    }
}

void hs__on_ranks(hs_consumer_t *c, peer_t *p, const uint8_t *body, uint32_t len)
{
    char why[256];
    ProtobufCMessage *m;
    if (hs_msg_unpack(HS_MSG_RANKS, body, len, &m, why, sizeof(why)) != HS_OK) {
        hs__peer_drop(c, p, HS_ERR_FORMAT, "bad RANKS: %s", why);
        return;
    }
    Hsflow__Ranks *r = (Hsflow__Ranks *)m;
    if (r->hops == 1) {
        hs_msg_free(m);
        hs__peer_drop(c, p, HS_ERR_PROTO, "RANKS with hops 1 (a consumer's) from a producer");
        return;
    }
    p->speaks_ranks = true;
    uint32_t n = (uint32_t)r->n_claims; /* <= HS_MSG_MAX_CLAIMS, checked by unpack */
    rank_claim_t *cl = n ? calloc(n, sizeof(*cl)) : NULL;
    if (n && !cl) {
        hs_msg_free(m);
        hs_warn("out of memory for %u rank claims of producer %s; ignored", n, p->name);
        return;
    }
    for (uint32_t i = 0; i < n; i++) {
        const Hsflow__RankClaim *k = r->claims[i];
        cl[i].rank = k->rank;
        cl[i].world = k->world;
        cl[i].instance_id = k->instance_id;
        cl[i].started_unix_ms = k->started_unix_ms;
        snprintf(cl[i].name, sizeof(cl[i].name), "%s", k->consumer_name ? k->consumer_name : "");
    }
    uint32_t hops = r->hops;
    hs_msg_free(m);
    for (uint32_t i = 0; i < n; i++)
        if (cl[i].rank == c->cfg.rank && cl[i].world == c->cfg.world &&
            cl[i].instance_id != c->instance_id)
            own_rank_claimed(c, p, &cl[i]);
    if (hops != 0) {
        free(cl);
        return;
    }
    free(p->claims);
    p->claims = cl;
    p->n_claims = n;
    relay_collisions(c);
}
