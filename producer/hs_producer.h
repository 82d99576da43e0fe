/* SPDX-License-Identifier: Apache-2.0 */
/* hs_producer.h - the producer engine: reads the dataset, builds the shared
 * plan, connects to the consumer, and runs one worker per device that turns
 * tickets into sealed batch regions sent straight from staging buffers.
 *
 * Ownership: the config's strings are borrowed for the duration of
 * hs_producer_run(); the engine owns everything it allocates and frees it
 * before returning. */
#ifndef HS_PRODUCER_H
#define HS_PRODUCER_H

#include <signal.h>
#include <stdint.h>
#include <stdbool.h>

#include "hsflow.h"
#include "hs_proto.h"
#include "hs_model.h" /* hs_model_attn_t */

#ifdef __cplusplus
extern "C" {
#endif

#define HS_PRODUCER_MAX_WORKERS 64
#define HS_PRODUCER_MAX_LINKS 64 /* consumers (ranks) one producer feeds */

/* The consumers a producer feeds (--to): one per data-parallel rank. */
typedef struct {
    uint32_t n;
    char host[HS_PRODUCER_MAX_LINKS][256];
    uint16_t port[HS_PRODUCER_MAX_LINKS];
} hs_producer_addrs_t;

/* Parses "HOST:PORT[,HOST:PORT...]", where a port may be a range LO-HI
 * (host:7000-7007 is eight addresses), into *out. HS_ERR_INVALID, logged
 * with the part that is wrong, for a malformed list, more than
 * HS_PRODUCER_MAX_LINKS addresses, or one address given twice. */
HS_MUST_CHECK hs_status_t hs_producer_parse_to(const char *s, hs_producer_addrs_t *out);

/* EXTERNAL: the library caller fills the hidden states (hs_producer_next). */
typedef enum { HS_SOURCE_SYNTHETIC = 1, HS_SOURCE_MODEL = 2, HS_SOURCE_EXTERNAL = 3 } hs_source_t;

/* The settings a caller chooses have an option each in the producer's
 * table (producer/options.c, docs/cli.md): hs_producer_config_default sets
 * them, hs_producer_config_set sets one by name, hs_producer_config_check
 * holds a config to their bounds and to each other. */
typedef struct {
    const char *to_list; /* every consumer, "HOST:PORT[,HOST:PORT...]" (hs_producer_parse_to),
                          * parsed when the run starts; used when `to` is NULL */
    const char *to_host; /* consumer address (when `to` and to_list are NULL or empty) */
    uint16_t to_port;
    const hs_producer_addrs_t *to; /* every consumer to feed, or NULL; borrowed */
    const char *data_path;         /* JSONL or .hst */
    uint32_t token_budget;
    uint32_t max_seq_len; /* 0 = token_budget */
    int overflow;         /* hs_overflow_t: truncate or drop */
    uint64_t seed;
    hs_layout_t layout; /* hidden size and captured layers; with a model, a
                         * hidden size of 0 means the model's */
    hs_source_t source;
    const char *model_dir; /* HS_SOURCE_MODEL */
    int weights;           /* the model's Linear weights: hs_model_weights_t (0 = as stored) */
    int dflash_layers;     /* > 0: layers = DFlash's default set for this many draft layers */
    bool eagle3_layers;    /* layers = EAGLE-3's default set (hs_model_eagle3_layers) */
    uint32_t n_workers;
    int gpu_ids[HS_PRODUCER_MAX_WORKERS]; /* -1 = CPU worker */
    uint32_t prefetch;                    /* tickets each worker wants queued */
    const char *secret_file;
    const char *transport;   /* "auto", "shm", "tcp", "ucx" */
    const char *net_devices; /* UCX_NET_DEVICES list; NULL = UCX's choice */
    bool require_rdma;       /* refuse to run without an RDMA lane */
    uint32_t connect_timeout_s;
    bool reconnect;           /* when the consumer goes away mid-run, connect again (for up to
                               * connect_timeout_s) instead of exiting */
    const char *summary_json; /* NULL = none */
    const char *name;         /* identity in logs; NULL = host:pid */
    /* Non-NULL: once *stop_requested is non-zero (a signal handler sets it),
     * hs_producer_run() stops: queued tickets are dropped (the consumer gives
     * them to other producers), batches being computed are finished and
     * sent, then BYE; it returns HS_OK. */
    volatile sig_atomic_t *stop_requested;
    double status_interval_s; /* seconds between status lines; 0 = 5, negative = never */
    /* Transport tuning and test faults, as hs_consumer_config_t's. */
    uint64_t tcp_sockbuf;
    bool ucx_no_memh;
    const char *fault;
    /* Preflight: share of each GPU's memory kept free (default 0.10), the
     * dense bf16 peak its MFU is measured against (0 = the H100/H200's
     * 989.4 TFLOP/s) and timed runs per shape (0 = 3). */
    double preflight_headroom;
    double preflight_peak_tflops;
    uint32_t preflight_iters;
    /* The forward's attention kernel (hs_model_set_attn; hs-producer:
     * HS_ATTN_BACKEND=mma); HS_MODEL_ATTN_AUTO by default. */
    hs_model_attn_t attn;
    /* Staging buffers per worker (2..STAGING_MAX of producer_int.h); 0 = 2.
     * hs_producer_open() gives its caller 3 by default. */
    uint32_t staging_buffers;
    /* The target computing the states, announced in HELLO (hsflow.h,
     * hs_target_fingerprint). HS_SOURCE_EXTERNAL: the caller's, never 0,
     * with a name for logs and stores; otherwise set when the producer opens
     * (the model folder's fingerprint, or the synthetic source's). */
    uint64_t target_fingerprint;
    const char *target_name;
} hs_producer_config_t;

/* Every setting at the default of its option (hs_producer_option_info). */
void hs_producer_config_default(hs_producer_config_t *cfg);

/* The number of options of the producer's table, and the i-th
 * (0..count-1) into *out (static strings): how hs-producer spells it, its
 * environment variable, type, default, bounds and help. HS_ERR_INVALID past
 * the end. */
uint32_t hs_producer_option_count(void);
HS_MUST_CHECK hs_status_t hs_producer_option_info(uint32_t i, hs_option_info_t *out);
/* Sets the option `name` ("token_budget") from its text ("64K", "auto",
 * "model", "true"), checked against its type and bounds. HS_ERR_INVALID
 * for an unknown name or a bad value, with why[why_cap] (when not NULL)
 * saying what was expected, else logged; cfg is then unchanged. A string
 * option keeps the pointer `value` (the caller's, for as long as cfg is
 * used). */
HS_MUST_CHECK hs_status_t hs_producer_config_set(hs_producer_config_t *cfg, const char *name,
                                                 const char *value, char *why, size_t why_cap);
/* Every option within its bounds and the options consistent with each
 * other (a consumer to feed, unless `preflight`: the config is for
 * hs_producer_preflight; --data; one layer set; --model with --source
 * model; ...): HS_OK, or HS_ERR_INVALID with why[cap] naming the option in
 * hs-producer's spelling ("--source model needs --model DIR").
 * hs_producer_run checks its config with it. */
HS_MUST_CHECK hs_status_t hs_producer_config_check(const hs_producer_config_t *cfg, bool preflight,
                                                   char *why, size_t cap);

/* Runs until the consumer says BYE (HS_OK), or a requested stop is done
 * (HS_OK, see stop_requested), or fails: HS_ERR_CLOSED when the consumer
 * vanished, HS_ERR_MISMATCH/HS_ERR_AUTH when it refused us, others
 * for local problems. Every error is logged once with what to do. */
HS_MUST_CHECK hs_status_t hs_producer_run(const hs_producer_config_t *cfg);

/* Runs every batch shape the plan can produce at cfg->token_budget on each
 * GPU of cfg->gpu_ids (model from cfg->model_dir) and prints a table of peak
 * memory, us/token, tokens/s and MFU. HS_ERR_NOSPACE when a shape does not
 * fit with headroom. With cfg->token_budget == 0 ("auto") it finds the largest
 * budget that fits and returns it in *budget_out. HS_ERR_UNSUPPORTED without
 * CUDA or GPUs. (producer/preflight.c) */
HS_MUST_CHECK hs_status_t hs_producer_preflight(const hs_producer_config_t *cfg,
                                                uint32_t *budget_out);

/* Tests: "lie" makes the PLAN pages this process sends claim one token
 * fewer per batch than its plan holds (the plan hash unchanged), as a peer
 * lying about its shapes would; NULL or "" = none. Process-wide
 * (hs-producer: HS_PLAN_FAULT). */
void hs_producer_plan_fault_set(const char *spec);

/* Parses a "--gpus" value into cfg->n_workers and cfg->gpu_ids: "cpu:N" for
 * N CPU workers, or "0,1,2" for one worker per GPU id. */
HS_MUST_CHECK hs_status_t hs_producer_parse_devices(const char *s, hs_producer_config_t *cfg);

#ifdef __cplusplus
}
#endif
#endif /* HS_PRODUCER_H */
