/* SPDX-License-Identifier: Apache-2.0 */
/* handshake_int.h - how a producer joins (handshake.c): HELLO, the
 * CHALLENGE / AUTH exchange when a secret is set, WELCOME, and the plan
 * exchange that defines the run (PLAN pages from one producer, checked,
 * then bound to the journal and the resume state, and the scheduler built).
 *
 * Threads: the network thread only, except hs__resume_load(), which runs in
 * hs_consumer_create() before any thread starts. The run it defines
 * (hs__consumer_run_t) is read by the other threads once have_run is set. */
#ifndef HS_HANDSHAKE_INT_H
#define HS_HANDSHAKE_INT_H

#include "hsflow.h"
#include "peers_int.h"
#include "state_int.h"

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

/* The run as the configuration pins it (expect_plan, expect_layout,
 * expect_dataset, expect_target): what is not pinned is not checked. Fixed at create. */
typedef struct {
    bool plan, layout, dataset, target; /* which are pinned */
    uint64_t plan_hash, dataset_fingerprint, target_fingerprint;
    hs_layout_t layout_v;
} hs__run_expect_t;

/* Parses the config's expectations into *out; HS_ERR_INVALID (logged,
 * naming the field and the form expected) for a malformed one. */
HS_MUST_CHECK hs_status_t hs__expect_parse(const hs_consumer_config_t *cfg, hs__run_expect_t *out);

/* Stops the consumer on a problem of its own configuration that no producer
 * can fix; the trainer's next call returns. The network thread. */
void hs__consumer_fatal(hs_consumer_t *c, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* The frames of the handshake, from the network thread's frame callback. */
void hs__on_hello(hs_consumer_t *c, peer_t *p, const uint8_t *body, uint32_t len);
void hs__on_auth(hs_consumer_t *c, peer_t *p, const uint8_t *body, uint32_t len);
void hs__on_plan(hs_consumer_t *c, peer_t *p, const uint8_t *body, uint32_t len);

/* The store's run becomes this run (before any producer is admitted),
 * bound to the journal and resume state as a producer's plan would be; a
 * store whose run does not fit them stops the consumer, naming why. */
void hs__run_from_store(hs_consumer_t *c);

/* Discards the pending plan whole (NULL ok): its sender left, or destroy. */
void hs__plan_discard(hs_consumer_t *c);
/* The pending plan's sender is gone: the longest-waiting admitted peer
 * sends its own plan from the start. With none, the next peer admitted does. */
void hs__plan_restart(hs_consumer_t *c);
/* Drops peers whose handshake, or whose plan pages, stopped for longer
 * than the handshake timeout. */
void hs__handshake_expire(hs_consumer_t *c, double now);

/* The resume state of the config (checked against the run's epochs and
 * order now, against the plan when a producer offers one), else an empty
 * state, into c->run.resume. Logs what is wrong. */
HS_MUST_CHECK hs_status_t hs__resume_load(hs_consumer_t *c, const hs_consumer_config_t *cfg);

#endif /* HS_HANDSHAKE_INT_H */
