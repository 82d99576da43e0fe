/* SPDX-License-Identifier: Apache-2.0 */
/* consumer_int.h - the consumer engine's state, shared by the consumer/
 * sources, one part per thread domain:
 *
 *   fixed at create    configuration, identity, cache, transport, journal;
 *                      read by every thread (the cache and the journal have
 *                      locks of their own)
 *   run                the run and its plan (handshake.c): the network
 *                      thread writes it; fixed once have_run is set
 *   net                the network thread's own: peers, scheduler, frame
 *                      buffer, counters
 *   verify             the checksum threads (verify.c; a lock of its own)
 *   delivery           shared by the network thread and the trainer, under
 *                      delivery.lock (delivery.c)
 *   gpu, handed        GPU delivery and the batches the trainer holds, the
 *                      trainer's thread (delivery.c)
 *
 * The parts: peers.c (peer registry), handshake.c (handshake, auth and plan
 * exchange), tickets.c (tickets, payloads and verdicts), verify.c (verify
 * pool), delivery.c (trainer API and GPU double buffering), stats.c
 * (figures, status line, JSON) and consumer.c (create, destroy and the
 * network thread's loop). */
#ifndef HS_CONSUMER_INT_H
#define HS_CONSUMER_INT_H

#include <pthread.h>
#include <stdarg.h>
#include <sodium.h>
#include <stdint.h>
#include <stdbool.h>

#include "hsflow.h"
#include "hs_window.h"
#include "hs_memclaim.h"
#include "hs_proto.h"
#include "hs_transport.h"
#include "cache_int.h"
#include "sched_int.h"
#include "journal_int.h"
#include "state_int.h"
#include "peers_int.h"
#include "handshake_int.h"
#include "tickets_int.h"
#include "verify_int.h"
#include "delivery_int.h"
#include "stats_int.h"
#include "store_int.h"

/* The scheduler's connection id for batches read from the store (peer ids
 * count up from 1 and never reach it). */
#define HS__STORE_CONN UINT64_MAX

/* The run and its plan: written by the network thread (handshake.c); once
 * have_run is set the layout and plan are fixed, and the checksum threads
 * and the trainer read them (a job or a batch reaches them after). */
typedef struct {
    bool have_run;
    pending_plan_t *pending; /* the plan being received, or NULL */
    /* the run, set once by plan_complete() */
    hs_layout_t layout;
    uint64_t plan_hash, seed;
    uint32_t n_batches, token_budget;
    uint64_t tokens_per_epoch;
    uint64_t target_fingerprint; /* the target computing the states (never 0 once set) */
    char target_name[256];
    /* The resume state given at create (cfg.resume_state), else an empty
     * one; set at create, read by the network thread and, under the
     * delivery lock, by hs_consumer_state_save(). */
    hs_state_t *resume;
    bool resume_given;
} hs__consumer_run_t;

/* The network thread's own: nothing else touches it while it runs. */
typedef struct {
    pthread_t thread;
    peer_t *peers;
    uint64_t next_peer_id;
    uint8_t *frame_buf;       /* [HS__FRAME_BUF_BYTES], what it sends is packed here */
    bool all_queued;          /* every batch is on the delivery queue; BYE sent */
    hs_sched_t *sched;        /* NULL until the run is defined */
    bool cache_registered;    /* the whole cache is registered with the transport */
    hs_msg_arena_t msg_arena; /* every DONE and STATS is decoded here */
    uint64_t n_seen, n_dropped, n_proto_errors, leases_returned;
    uint64_t n_seen_shm, n_seen_tcp, n_seen_ucx; /* admitted, by transport */
    /* the store: reads with the checksum threads now, and batches read
     * back (hits), ticketed for want of them (misses), failing their check */
    uint32_t store_inflight;
    uint64_t store_hits, store_misses, store_bad;
    double t_last_status;
    /* RANKS: instances this consumer has told its producers about, so a
     * collision is passed on once (bounded; see ranks.c) */
    uint64_t ranks_relayed[64];
    uint32_t n_ranks_relayed;
    uint64_t ranks_yielded_to; /* a later claimant of our rank we warned about */
} hs__consumer_net_t;

struct hs_consumer {
    /* fixed at create */
    hs_consumer_config_t cfg;
    char name[128];
    uint64_t session_id;
    /* this process among the consumers of the run (WELCOME, RANKS) */
    uint64_t instance_id, started_unix_ms;
    hs_auth_key_t key;
    bool have_secret;
    hs_cache_t *cache;         /* own lock */
    hs_mem_claim_t *mem_claim; /* the cache's claim in the node's registry */
    hs_tp_t *tp;               /* the network thread's; hs_tp_wakeup() from any thread */
    uint16_t port;
    struct hs_metrics *metrics; /* its own thread reads hs_consumer_stats() */
    hs_journal_t *journal;      /* resume journal, or NULL; own lock */
    hs_store_t *store;          /* --store, or NULL; own lock and writer thread */
    hs__run_expect_t expect;    /* the run the configuration pins */
    /* from the config, defaults resolved: status line period, handshake
     * bound, how long no producer may be connected before the status line
     * says so */
    double status_interval, handshake_timeout_s, no_producer_warn_s;

    _Atomic bool stop; /* written by destroy and fatal paths, read by every thread */
    char fatal[256];   /* why it stopped on its own; set before stop */

    hs__consumer_run_t run;
    hs__consumer_net_t net;
    hs__verify_pool_t *verify;
    hs__consumer_delivery_t delivery;
    hs__consumer_gpu_t gpu;
    hs__consumer_handed_t handed; /* the trainer's thread */
    hs_window_t window;           /* recent figures (stats.c), under delivery.lock */
};

/* The store's free callback (hs_store_free_cb; arg: the consumer). */
void hs__store_slot_free(void *arg, uint64_t offset);

#endif /* HS_CONSUMER_INT_H */
