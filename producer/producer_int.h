/* SPDX-License-Identifier: Apache-2.0 */
/* producer_int.h - the producer engine's state, shared by its parts
 * (DESIGN §2, §5):
 *
 *   producer.c  configuration, open/free, hs_producer_run, the library API
 *   worker.c    worker threads (CPU and GPU): tickets in, filled batches out
 *   session.c   links to the consumers: handshake, PLAN, TICKETs, callbacks
 *   net.c       the network loop: sends, stop and drain, heartbeats
 *   report.c    STATS, the status line and the summary
 *
 * Who owns what: the fields of struct hs_producer above `net` are set by
 * producer_open and only read afterwards, by any thread. `net` is the
 * network thread's alone (and producer_open's before that thread starts).
 * `sh` is shared by the workers, the network thread and the library API's
 * caller, under sh.lock. `api` belongs to the library API's caller. Each
 * worker_t belongs to its thread, except the fields marked "lock". */
#ifndef HS_PRODUCER_INT_H
#define HS_PRODUCER_INT_H

#include <pthread.h>
#include <stdatomic.h>
#include <time.h>

#include "hs_producer.h"
#include "hsflow.h"
#include "hs_data.h"
#include "hs_transport.h"
#include "hs_model.h"
#include "gpu_worker_int.h"
#include "hs_window.h"
#include "hs_checksum.h"

/* Staging buffers (one batch each) per worker. A built-in worker sends one
 * batch while it computes the next: two. A worker of the API gets three
 * unless its config says otherwise: a GPU caller (hsflow-produce) queues
 * batch N+1's forward before it seals and sends N, so with two buffers the
 * ticket of N+2 would wait for N's whole send and the network would idle
 * while the caller seals and launches (docs/pyproducer.md). */
#define STAGING_MAX HS_PRODUCER_STAGING_MAX
#define STAGING_BUILTIN 2
#define STAGING_API_DEFAULT 3

typedef struct ticket {
    struct ticket *next;
    uint64_t id;
    uint32_t epoch, batch, n_seqs, n_tokens;
    uint64_t bytes;
    uint32_t gen;  /* connection generation the ticket came from */
    uint32_t link; /* the consumer (link index) that issued it */
} ticket_t;

typedef struct hs_producer producer_t;
typedef struct ticket_slab ticket_slab_t;

/* One consumer this producer feeds: its connection and handshake. Touched by
 * the network thread only (gen also under sh.lock, see link_drop_tickets). */
typedef struct link {
    producer_t *pr;
    uint32_t index;
    char host[256];
    uint16_t port;
    hs_tp_conn_t *conn;
    bool done;      /* this consumer said BYE, refused us or is gone for good */
    bool welcomed;  /* handshake complete: tickets may come */
    bool lost;      /* connection gone (--reconnect) or not made yet: a try pending */
    bool pending;   /* never connected yet: lost holds its first connection's tries */
    double t_lost;  /* when it was lost (reconnect gives up connect_timeout_s later) */
    double t_try;   /* the last reconnect try */
    uint32_t tries; /* tries since the connection was lost (or not made) */
    uint32_t gen;   /* connection generation, see ticket_t */
    uint8_t client_nonce[HS_AUTH_NONCE_BYTES];
    uint8_t server_nonce[HS_AUTH_NONCE_BYTES];
    uint8_t *hello_body; /* the HELLO body as sent, for the AUTH proof */
    size_t hello_len;
    char consumer_name[256];
    uint32_t rank, world; /* from WELCOME (world 0 before it) */
    /* from WELCOME: the consumer process (0: an older consumer, no RANKS) */
    uint64_t instance_id, started_unix_ms;
} link_t;

/* A filled batch for the network thread: embedded in its staging buffer,
 * which is on the outbox at most once, so handing a batch over allocates
 * nothing. */
typedef struct outgoing {
    struct outgoing *next;
    ticket_t t;
    struct staging *st;
    uint32_t worker;
    uint64_t checksum, compute_ns;
} outgoing_t;

typedef struct staging {
    uint8_t *buf;
    bool busy;      /* taken for a batch until its send completes (lock) */
    bool queued;    /* its record is on the outbox or its batch on the wire (lock) */
    outgoing_t out; /* the record, while queued */
    double t_send;  /* when it was handed to the transport (trace timing) */
    uint32_t gen;   /* external source: generation of the ticket it holds */
    uint32_t link;  /* external source: link of the ticket it holds */
    struct worker *owner;
} staging_t;

typedef struct worker {
    producer_t *pr;
    uint32_t index;
    int gpu; /* -1 = CPU */
    pthread_t thread;
    staging_t staging[STAGING_MAX];
    uint32_t n_staging; /* of staging[] in use */
    /* figures (lock) */
    uint64_t batches, tokens, bytes;
    double busy_s, stall_s;
    double d2h_s;       /* GPU workers: device-to-host copy time (CUDA events) */
    uint64_t d2h_bytes; /* ... and the bytes it moved */
    double t_stall;     /* waits for a ticket since then (counted in the figures); 0 when not */
    double t_taken;     /* external source: when the caller took its batch */
    /* progress, for the heartbeat (lock): when it last took, launched or
     * finished a batch, and whether it holds one now */
    double t_progress;
    bool computing;
    /* CPU workers: the thread's CPU clock, read by the network thread; a
     * worker inside a long forward still computes when it advances */
    clockid_t cpu_clock;
    bool has_cpu_clock;
    uint64_t cpu_ns_seen;
    hs_checksum_stream_t *checksum; /* scratch for sealing */
    uint16_t *fp8_scratch;   /* CPU model source, fp8 layout: the bf16 rows before quantising */
    hs__gpu_worker_t *gpu_w; /* GPU model worker, or NULL */
} worker_t;

/* The network thread's: the links and the state of the run's end. */
typedef struct {
    hs_msg_arena_t ticket_arena; /* every TICKET is decoded here */
    link_t links[HS_PRODUCER_MAX_LINKS];
    uint32_t n_links;
    link_t *connecting; /* the link inside hs_tp_connect, see hs__link_connect */
    uint8_t *frame_buf; /* control frames are packed here */
    bool done;          /* every link is done, or a local failure */
    bool stopping;      /* cfg->stop_requested seen: draining, see begin_stop */
    double t_stop;
    uint32_t tickets_returned; /* dropped while stopping: the consumer reissues them */
    double heartbeat_s;        /* STATS interval: a quarter of the consumer's lease timeout */
    double t_beat;             /* when the last STATS went */
    hs_window_t window;        /* recent figures for STATS and the status line (report.c) */
} producer_net_t;

/* Shared by the workers, the network thread and the API's caller; under lock. */
typedef struct {
    pthread_mutex_t lock;
    pthread_cond_t cond;              /* tickets arrived / staging freed / stop */
    ticket_t *tickets, *tickets_tail; /* queued, oldest first; records of the pool */
    /* Ticket records: slabs planned at open for every ticket the consumers
     * may hold (links x workers x prefetch), taken and given back per
     * ticket (worker_int.h). */
    ticket_t *ticket_free;
    struct ticket_slab *ticket_slabs;
    uint32_t ticket_records;
    outgoing_t *outbox;  /* filled batches for the network thread, newest first */
    bool stop;           /* the workers end */
    bool net_done;       /* the network loop has ended */
    hs_status_t result;  /* the run's; the network thread also sets it without the lock */
    double t_start;      /* the first WELCOME */
    uint32_t epochs;     /* of the run, from WELCOME */
    uint32_t epoch_seen; /* 0-based epoch of the latest ticket */
} producer_shared_t;

/* The library API's caller: the thread running the network loop for it. */
typedef struct {
    bool net_started;
    pthread_t net_thread;
    _Atomic bool close_requested; /* hs_producer_close() before the end; net reads it */
} producer_api_t;

struct hs_producer {
    const hs_producer_config_t *cfg; /* = &config, completed from the model */
    hs_producer_config_t config;
    hs_dataset_t *ds;
    hs_plan_t *plan;
    hs_model_t *model;
    uint64_t max_batch_bytes;
    uint32_t max_batch_seqs;
    hs_auth_key_t key;
    bool have_secret;
    hs_tp_t *tp; /* progressed by the network thread; any thread may wake it */

    producer_net_t net;
    producer_shared_t sh;
    producer_api_t api;
    worker_t workers[HS_PRODUCER_MAX_WORKERS];
};

#endif /* HS_PRODUCER_INT_H */
