/* SPDX-License-Identifier: Apache-2.0 */
/* consumer_int.h - the consumer engine's state, shared by the consumer/ sources. */
#ifndef HS_CONSUMER_INT_H
#define HS_CONSUMER_INT_H

#include <pthread.h>
#include <stdarg.h>
#include <sodium.h>

#include "hsflow.h"
#include "hs_common.h"
#include "hs_proto.h"
#include "hs_transport.h"
#include "cache_int.h"
#include "sched_int.h"
#include "gpu_loader_int.h"
#include "metrics_int.h"
#include "journal_int.h"
#include "state_int.h"

typedef enum {
    PEER_NEW,          /* waiting for HELLO */
    PEER_AUTH,         /* CHALLENGE sent, waiting for AUTH */
    PEER_SENDING_PLAN, /* WELCOME(need_plan) sent, PLAN pages coming */
    PEER_WAIT_PLAN,    /* admitted; WELCOME once another producer's plan is in */
    PEER_READY,        /* gets tickets */
    PEER_GONE,         /* connection closed; waits for its payloads to settle */
} peer_state_t;

/* What a producer's HELLO offers; becomes the run once its plan is complete. */
typedef struct {
    hs_layout_t layout;
    uint64_t plan_hash, seed;
    uint32_t n_batches, token_budget; /* n_batches in 1..HS_PLAN_MAX_BATCHES */
} run_offer_t;

/* A plan being received: the offer of the peer asked for it and the pages so
 * far. None of it is the run (nor in the journal) until every page is in and
 * checked; when its sender leaves, it is discarded whole. */
typedef struct {
    uint64_t sender; /* peer id sending the PLAN pages */
    run_offer_t offer;
    uint32_t received;           /* batches received so far */
    uint32_t cap;                /* entries allocated in n_seqs and n_tokens */
    uint32_t *n_seqs, *n_tokens; /* [cap], grown as pages arrive */
    double t_page;               /* when the last page came (or the plan was asked for) */
} pending_plan_t;

/* One producer connection. Owned by the network thread. */
typedef struct peer {
    struct peer *next;
    hs_tp_conn_t *conn; /* NULL once closed */
    uint64_t id;        /* scheduler connection id, never reused */
    peer_state_t state;
    char name[300];
    uint32_t workers, prefetch;
    run_offer_t offer;
    uint32_t receiving; /* payloads accepted and still landing */
    uint32_t verifying; /* payloads with the checksum threads */
    uint8_t client_nonce[HS_AUTH_NONCE_BYTES];
    uint8_t server_nonce[HS_AUTH_NONCE_BYTES];
    uint8_t *hello_body; /* kept for the AUTH check */
    uint32_t hello_len;
    double stall_pct, tokens_per_s;
    double t_done_frame; /* when the last DONE arrived (trace timing) */
    double t_accept;     /* when the connection arrived */
    double t_progress;   /* last sign of progress while it holds tickets (lease clock) */
    bool has_stats;
    bool bye_sent; /* told the run is over; its frames are ignored */
    bool dropped;  /* peer_drop() ran: told, logged and counted once */
} peer_t;

typedef struct verify_job {
    struct verify_job *next;
    uint64_t peer_id, ticket_id;
    hs_sched_item_t item;
    hs_status_t status;
    double t_queued;
    char why[256];
} verify_job_t;

typedef struct {
    hs_sched_item_t item; /* the batch in this device buffer */
} gpu_slot_t;

/* What the copy-done callback frees: the slot and ticket of one copy. */
typedef struct {
    struct hs_consumer *c;
    uint64_t slot_offset, ticket;
} gpu_copy_done_t;
#define HS_GPU_DONE_RING 8

struct hs_consumer {
    hs_consumer_config_t cfg;
    char name[128];
    uint64_t session_id;
    hs_auth_key_t key;
    bool have_secret;

    hs_cache_t *cache;
    hs_tp_t *tp;
    uint16_t port;
    pthread_t net_thread;
    _Atomic bool stop; /* written by destroy and fatal paths, read by every thread */
    char fatal[256];

    /* network thread only */
    peer_t *peers;
    uint64_t next_peer_id;
    uint8_t frame_buf[HS_FRAME_MAX_BODY + HS_FRAME_HEADER_BYTES];
    bool have_run, all_queued;
    pending_plan_t *pending; /* the plan being received, or NULL */
    /* the run, set once by plan_complete() */
    hs_layout_t layout;
    uint64_t plan_hash, seed;
    uint32_t n_batches, token_budget;
    uint64_t tokens_per_epoch;
    hs_sched_t *sched;
    bool cache_registered;     /* the whole cache is registered with the transport */
    hs_msg_arena_t done_arena; /* the network thread decodes every DONE here */
    uint64_t n_seen, n_dropped, n_proto_errors, leases_returned;
    double t_last_status, status_interval, handshake_timeout_s;
    /* last time a producer was connected (under lock), and how long none may
     * be before the status line says so (no_producer_warn_s of the config, 30 s) */
    double t_producer_seen, no_producer_warn_s;

    /* checksum threads */
    pthread_t *verify_threads;
    uint32_t n_verify;
    pthread_mutex_t vlock;
    pthread_cond_t vcond;
    verify_job_t *vjobs, *vdone;
    uint32_t vjobs_n;
    bool vstop;

    /* shared with the trainer, under lock */
    pthread_mutex_t lock;
    pthread_cond_t cond;
    hs_sched_item_t *ready; /* ring of deliverable batches */
    uint32_t ready_head, ready_n, ready_cap;
    uint64_t *released; /* tickets released by the trainer, for the scheduler */
    uint32_t released_n, released_cap;
    bool finished;
    uint64_t batches_planned, batches_delivered, tokens_delivered, bytes_received;
    uint64_t checksum_failures, in_trainer;
    double t_start, t_end, starve_s;
    hs_consumer_stats_t snap; /* network thread's figures */
    char waiting[160];        /* what start-up waits for ("" once running); lock */
    uint64_t max_batch_bytes;
    uint64_t h2d_bytes;
    double h2d_s;

    /* GPU delivery (trainer's thread only) */
    hs__loader_t *loader;
    hs_metrics_t *metrics;
    hs_journal_t *journal; /* resume journal, or NULL */
    /* The resume state given at create (cfg.resume_state), else an empty one;
     * and, once the plan is known, the position: every batch handed to the
     * trainer, that state's included (under lock). */
    hs_state_t *resume, *position;
    bool resume_given;
    uint64_t batches_resumed;
    gpu_slot_t gpu_slot[2];
    gpu_copy_done_t gpu_done[HS_GPU_DONE_RING];
    uint32_t gpu_done_next;
    int gpu_cur;      /* buffer handed to the trainer, -1 none */
    int gpu_inflight; /* buffer being copied, not yet handed, -1 none */
    int gpu_last;     /* buffer handed most recently */
};

#endif /* HS_CONSUMER_INT_H */
