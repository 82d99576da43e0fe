/* SPDX-License-Identifier: Apache-2.0 */
/* peers_int.h - the consumer's registry of producer connections (peers.c):
 * one record per connection from accept until its payloads settle, the
 * pre-authentication limits, and sending to or dropping a peer.
 *
 * Threads: the network thread only. Every function here runs on it (the
 * transport's callbacks included), and a peer record is never seen by
 * another thread. */
#ifndef HS_PEERS_INT_H
#define HS_PEERS_INT_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "hsflow.h"
#include "hs_proto.h"
#include "hs_transport.h"

typedef struct hs_consumer hs_consumer_t;

/* Enough for any frame the protocol allows: the network thread's one
 * buffer for packing what it sends. */
#define HS__FRAME_BUF_BYTES (HS_FRAME_MAX_BODY + HS_FRAME_HEADER_BYTES)

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
    uint64_t plan_hash, plan_basis, seed; /* plan_hash == hs_plan_hash_of(plan_basis, shapes) */
    uint64_t dataset_fingerprint;         /* 0 from a producer that did not say */
    uint32_t n_batches, token_budget;     /* n_batches in 1..HS_PLAN_MAX_BATCHES */
    char model[256];                      /* HELLO's target name, cut to fit */
    uint64_t target_fingerprint;          /* HELLO's; never 0 (hs_msg_unpack) */
} run_offer_t;

/* A consumer's claim on a rank, as a producer reported it (RANKS). */
typedef struct {
    uint32_t rank, world;
    uint64_t instance_id, started_unix_ms;
    char name[HS_MSG_NAME_MAX];
} rank_claim_t;

/* One producer connection. Owned by the network thread. */
typedef struct peer {
    struct peer *next;
    hs_tp_conn_t *conn; /* NULL once closed */
    uint64_t id;        /* scheduler connection id, never reused */
    peer_state_t state;
    char name[300];
    uint32_t workers, prefetch;
    run_offer_t offer;
    uint32_t receiving;       /* payloads accepted and still landing */
    uint64_t receiving_bytes; /* ... their bytes */
    uint64_t rx_seen;         /* payload bytes in, at the last lease check */
    uint32_t verifying;       /* payloads with the checksum threads */
    uint8_t client_nonce[HS_AUTH_NONCE_BYTES];
    uint8_t server_nonce[HS_AUTH_NONCE_BYTES];
    uint8_t *hello_body; /* kept for the AUTH check */
    uint32_t hello_len;
    double stall_pct, tokens_per_s;
    double t_done_frame; /* when the last DONE arrived (trace timing) */
    double t_accept;     /* when the connection arrived */
    double t_progress;   /* last real progress while it holds tickets (lease clock) */
    double t_beat;       /* last heartbeat from a computing worker */
    bool has_stats;
    rank_claim_t *claims; /* its last RANKS (hops 0): the consumers it feeds now */
    uint32_t n_claims;
    bool speaks_ranks; /* has sent RANKS: it understands them */
    bool bye_sent;     /* told the run is over; its frames are ignored */
    bool dropped;      /* hs__peer_drop() ran: told, logged and counted once */
} peer_t;

/* RANKS from producer p (ranks.c): learns which consumers claim which rank,
 * passes a collision on, and stops this consumer if it is the later of two
 * claiming its own rank. */
void hs__on_ranks(hs_consumer_t *c, peer_t *p, const uint8_t *body, uint32_t len);

/* Packs `m` into the network thread's frame buffer and sends it; a failure
 * is logged (the connection's close tells the rest). */
void hs__peer_send_msg(hs_consumer_t *c, peer_t *p, uint16_t type, const ProtobufCMessage *m);
/* Tells the peer why (an ERROR frame), logs it and closes the connection;
 * once per peer. The record stays until hs__peer_reap() can free it. */
void hs__peer_drop(hs_consumer_t *c, peer_t *p, hs_status_t code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
peer_t *hs__peer_find(hs_consumer_t *c, uint64_t id); /* NULL when gone */
/* Decodes a frame body from a peer into arena `a` (NULL: the heap); a
 * malformed one drops the peer (NULL). Free with hs_msg_free_in(a, m). */
ProtobufCMessage *hs__peer_unpack_in(hs_consumer_t *c, peer_t *p, hs_msg_arena_t *a, uint16_t type,
                                     const uint8_t *body, uint32_t len);
ProtobufCMessage *hs__peer_unpack(hs_consumer_t *c, peer_t *p, uint16_t type, const uint8_t *body,
                                  uint32_t len);
/* Frees a closed peer once none of its payloads is landing or being
 * verified, returning its leases to the scheduler; otherwise nothing. */
void hs__peer_reap(hs_consumer_t *c, peer_t *p);
/* Frees every record, at destroy (the transport is gone). */
void hs__peers_free(hs_consumer_t *c);

/* The transport's accept callback (arg: the consumer); its close callback
 * is consumer.c's. */
HS_MUST_CHECK hs_status_t hs__peer_accepted(void *arg, hs_tp_conn_t *conn);
/* Counts an admitted producer under the transport that carries it. */
void hs__peer_count_transport(hs_consumer_t *c, const peer_t *p);

#endif /* HS_PEERS_INT_H */
