/* SPDX-License-Identifier: Apache-2.0 */
/* hsflow.h - the public C API of libhsflow.
 *
 * A consumer listens for producers, hands out work tickets so they can never
 * overrun its host-RAM cache, verifies every batch, and delivers batches one
 * at a time to the trainer:
 *
 *     hs_consumer_config_t cfg;
 *     hs_consumer_config_default(&cfg);
 *     cfg.listen_host = "0.0.0.0"; cfg.listen_port = 7000;
 *     cfg.cache_bytes = 64ull << 30; cfg.epochs = 2;
 *     hs_consumer_t *c;
 *     if (hs_consumer_create(&cfg, &c) != HS_OK) ...;
 *     hs_batch_t b;
 *     while (hs_consumer_next(c, &b, -1) == HS_OK) {
 *         train(b.hidden, b.input_ids, b.loss_mask, b.cu_seqlens, b.n_tokens);
 *         hs_consumer_release(c, &b);
 *     }
 *     hs_consumer_destroy(c);
 *
 * Ownership: a batch's memory belongs to the consumer; the pointers in an
 * hs_batch_t stay valid until hs_consumer_release() of that batch. Every
 * batch taken with hs_consumer_next() must be released exactly once.
 * Threads: hs_consumer_next()/release() may be called from any one thread
 * (the trainer's); the consumer runs its own network thread. */
#ifndef HSFLOW_H
#define HSFLOW_H

#include <stddef.h>
#include <stdint.h>
#include <stdbool.h>

#ifdef __cplusplus
extern "C" {
#endif

/* On every function of this header: libhsflow.so exports these and nothing
 * else (the library is built with hidden visibility and an export map). */
#if defined(__GNUC__) || defined(__clang__)
#define HSFLOW_API __attribute__((visibility("default")))
#else
#define HSFLOW_API
#endif

/* The release; CMake reads the project version from this line. */
#define HSFLOW_VERSION_STRING "0.1.0"

/* The release this library was built as (HSFLOW_VERSION_STRING of its
 * build); `git describe` of the checkout it was built from ("" outside a
 * checkout); the build options in one line ("CUDA on (sm_90, toolkit 12.4),
 * UCX 1.13.1, cuBLASLt 12.4, cuDNN not linked, RelWithDebInfo"). Static
 * strings, never NULL. */
HSFLOW_API const char *hsflow_version(void);
HSFLOW_API const char *hsflow_git_describe(void);
HSFLOW_API const char *hsflow_build_info(void);

/* The folder standing in for / where the consumer reads the memory it may
 * take (proc/meminfo, proc/self/cgroup, sys/fs/cgroup) and keeps the node's
 * registry of cache claims (dev/shm/hsflow-cache): tests stand a fake
 * system there. NULL or "" = the real system (the default). Copied;
 * process-wide; call it before hs_consumer_create. hs-consumer and the
 * Python binding set it from HS_SYSTEM_ROOT. */
HSFLOW_API void hsflow_set_system_root(const char *root);

/* The one status of every call: 0 is success, every error is negative.
 * hsflow_status_str() names one. */
typedef enum {
    HS_OK = 0,
    HS_ERR_INVALID = -1,      /* bad argument, flag or value */
    HS_ERR_NOMEM = -2,        /* allocation failed */
    HS_ERR_IO = -3,           /* read/write/open failed (errno logged) */
    HS_ERR_FORMAT = -4,       /* malformed file or frame */
    HS_ERR_PROTO = -5,        /* peer broke the protocol */
    HS_ERR_MISMATCH = -6,     /* version, layout or plan differs from the peer's */
    HS_ERR_AUTH = -7,         /* authentication failed or required */
    HS_ERR_CHECKSUM = -8,     /* checksum did not match */
    HS_ERR_CLOSED = -9,       /* peer or object closed */
    HS_ERR_AGAIN = -10,       /* would block; try later */
    HS_ERR_TIMEOUT = -11,     /* deadline passed */
    HS_ERR_NOSPACE = -12,     /* cache or buffer full */
    HS_ERR_NOT_FOUND = -13,   /* no such item */
    HS_ERR_UNSUPPORTED = -14, /* not built in or not available here */
    HS_ERR_CUDA = -15,        /* CUDA or cuBLAS call failed */
    HS_ERR_BUSY = -16,        /* resource in use */
} hs_status_t;
/* On a call whose status must be looked at: the compiler warns where one is
 * dropped (a cast to void does not silence it; handle the status). */
#if defined(__GNUC__) || defined(__clang__)
#define HS_MUST_CHECK __attribute__((warn_unused_result))
#else
#define HS_MUST_CHECK
#endif
/* The name the API used for hs_status_t before it was public; the same type. */
typedef hs_status_t hs_status_code_t;
HSFLOW_API const char *hsflow_status_str(hs_status_t status);

/* The synthetic source's hidden states (--source synthetic): the bf16 bits
 * of (sample id, layer index, token position within its sequence,
 * channel), what --verify-synthetic checks every byte against; a trainer's
 * own pipeline can be checked against it too (hsflow.synthetic_hidden is
 * the same in numpy). */
HSFLOW_API uint16_t hs_synth_value(uint64_t sample_id, int32_t layer, uint32_t pos,
                                   uint32_t channel);

/* The target that computes a run's hidden states, as a fingerprint (never
 * 0) that every producer announces: a run, and its store, hold the states of
 * one target, and a producer or a store of another is refused.
 * hs_target_fingerprint(): a Hugging Face model folder's config.json and
 * the content of every *.safetensors file in it (XXH3-64 each, combined
 * with their names and sizes). Weights are read once: each file's hash is
 * kept in the folder's .hsflow-target under its size, mtime, ctime and
 * inode, so a later call reads only files that changed; a folder this user
 * cannot write is read whole each time. HS_ERR_IO or HS_ERR_INVALID
 * (logged, naming the file) for a folder without config.json or weights.
 * hs_target_synthetic_fingerprint(): the synthetic source's (hs_synth_value
 * and hsflow.synthetic: its version is its one parameter). */
HSFLOW_API HS_MUST_CHECK hs_status_t hs_target_fingerprint(const char *model_dir, uint64_t *out);
HSFLOW_API uint64_t hs_target_synthetic_fingerprint(void);

/* The checksum a batch region's header holds, over the len bytes after its
 * 256-byte header (XXH3-64 of 1 MiB chunks, combined): what the consumer
 * verifies every batch with, for tools that check stored regions
 * (hsflow-data store verify). */
HSFLOW_API uint64_t hs_checksum64(const void *data, size_t len);

typedef enum { HS_ORDER_ARRIVAL = 0, HS_ORDER_PLAN = 1 } hs_order_t;
/* Ranks: what happens to the batches of an epoch that do not divide evenly
 * among the ranks (DESIGN §11). */
typedef enum {
    HS_UNEVEN_DROP = 0,   /* skip them (counted); every rank gets n / world */
    HS_UNEVEN_REPEAT = 1, /* the short ranks take batches from the epoch's start */
} hs_uneven_t;

/* The longest resume state text accepted (hs_consumer_config_t.resume_state). */
/* How hidden states travel and how they reach the trainer: bf16, or fp8
 * (float8_e4m3fn values and one fp32 scale per token over all of its
 * captured layers, amax / 448; half the bytes). */
typedef enum {
    HS_HIDDEN_BF16 = 1,
    HS_HIDDEN_FP8 = 2,
} hs_hidden_dtype_t;

/* Quantises rows of bf16 hidden states (bf16 bits, [rows][n]) to fp8 the
 * way every hsflow producer does: per row scale = amax / 448 (1 for a row of
 * zeros), q = e4m3(value / scale) rounded to nearest even, into q
 * ([rows][n]) and scales ([rows]); what a library producer of an fp8 run
 * fills hs_work_t.hidden_fp8 and hidden_scales with. HS_ERR_INVALID (-1)
 * for a NaN or infinite value, with *bad_row (when not NULL) its row; the
 * outputs are then meaningless. */
HSFLOW_API HS_MUST_CHECK hs_status_t hs_fp8_quantize_rows(const uint16_t *x, uint64_t rows,
                                                          uint64_t n, uint8_t *q, float *scales,
                                                          uint64_t *bad_row);

#define HS_CONSUMER_STATE_MAX_BYTES (64u << 20)

typedef struct {
    const char *listen_host; /* default "0.0.0.0" */
    uint16_t listen_port;    /* default 7000; 0 picks a free port */
    uint64_t cache_bytes;    /* host-RAM cache size; default 4 GiB */
    uint32_t epochs;         /* default 1 */
    int gpu;                 /* -1 = host delivery (default) */
    hs_order_t order;        /* default HS_ORDER_ARRIVAL */
    uint32_t prefetch;       /* most tickets per producer worker (a producer asks its own
                                number; it gets the lesser); default 4 */
    bool verify_synthetic;   /* check every element against the synthetic source */
    bool insecure;           /* accept non-loopback peers without a secret */
    const char *secret_file; /* shared secret for HMAC auth; NULL = none */
    const char *transport;   /* "auto", "shm", "tcp", "ucx"; default "auto" */
    uint32_t verify_threads; /* checksum threads; default 1 */
    uint32_t peer_timeout_s; /* default 10 */
    const char *net_devices; /* UCX: device list for UCX_NET_DEVICES; NULL = UCX's choice */
    bool require_rdma;       /* UCX: refuse connections without an RDMA lane */
    const char *metrics;     /* "HOST:PORT": Prometheus /metrics there; NULL = off */
    const char *journal;     /* resume journal file; NULL = off */
    /* Resume state: the text hs_consumer_state_save() wrote (the caller's;
     * copied at create), or NULL to start afresh. The consumer then delivers
     * exactly the batches that state does not name. With a journal as well,
     * the state wins: it is given when the trainer restarts from the
     * checkpoint that holds it, and batches the journal recorded after that
     * checkpoint were never trained into the weights resumed; the journal
     * is rewritten to the state's batches once the plan is known. */
    const char *resume_state;
    /* A producer holding tickets that shows no progress (no DONE, no payload
     * bytes, no heartbeat from a computing worker) for this long is dropped
     * and its tickets go back to the queue. Default 60 s; 0 = never. */
    double lease_timeout_s;
    /* Start even when cache_bytes is more than the memory this process can
     * get (MemAvailable, the cgroup limit less its usage): warn instead of
     * failing with HS_ERR_NOSPACE. Default false. */
    bool force;
    /* Data-parallel ranks (DESIGN §11): this consumer delivers only rank
     * `rank`'s shard of each epoch of a plan shared by `world` consumers,
     * the same number of batches per epoch on every rank. Defaults 0 and 1
     * (the whole plan). Journal and resume state belong to one rank. */
    uint32_t rank;
    uint32_t world;
    hs_uneven_t uneven; /* default HS_UNEVEN_DROP */
    /* Timing (hs-consumer: --status-interval, --handshake-timeout,
     * --no-producer-warn). status_interval_s: seconds between status lines,
     * default 5, negative = never. handshake_timeout_s: a peer must complete
     * its handshake this long after connecting, and send each PLAN page
     * within it; default 15. no_producer_warn_s: warn when no producer has
     * connected for this long; default 30. */
    double status_interval_s;
    double handshake_timeout_s;
    double no_producer_warn_s;
    /* Transport tuning (--tcp-sockbuf, --ucx-memh). tcp_sockbuf: TCP socket
     * buffers in bytes, at most 1 GiB; 0 = 16 MiB where net.core.rmem_max
     * and wmem_max allow it, else the kernel's autotuning; UINT64_MAX = the
     * kernel's autotuning always. ucx_no_memh: receive payloads without
     * their registered memory handle (for comparisons only). */
    uint64_t tcp_sockbuf;
    bool ucx_no_memh;
    /* Not read: it held a test hook (now hs-consumer's --fault alone);
     * kept so that the fields after it stay where they are. */
    const char *reserved0;
    /* Pin the run (--expect-plan, --expect-layout, --expect-dataset; the
     * values `hs-data plan` prints): a producer whose plan hash, layout or
     * dataset fingerprint differs is refused, naming what differs and the
     * value expected, whether it is the first to connect or not, and the
     * consumer waits on for the right ones. NULL = not pinned (the first
     * complete plan defines the run). Forms: expect_plan and expect_dataset
     * 16 hex digits ("3f2a9c0d5e6b7a81"); expect_layout
     * "H=4096,layers=2,16,29,dtype=bf16". A malformed one fails create with
     * HS_ERR_INVALID. */
    const char *expect_plan;
    const char *expect_layout;
    const char *expect_dataset;
    /* How the hidden states of an fp8 run reach the trainer (--deliver):
     * HS_HIDDEN_BF16 (0 means the same; default) dequantised, on the GPU
     * as part of the host-to-device step; HS_HIDDEN_FP8 the raw e4m3 bytes
     * and scales (hs_batch_t.hidden_fp8, hidden_scales). A bf16 run is
     * delivered as bf16 either way. */
    hs_hidden_dtype_t deliver;
    /* Heartbeats alone (no finished batch, no payload bytes) hold a
     * producer's tickets for at most lease_timeout_s plus the plan's largest
     * batch at this rate (--lease-min-rate); default 200 tokens/s. */
    double lease_min_tokens_per_s;
    /* A store folder (--store; docs/store.md), or NULL for none: each
     * batch's verified region is written there once, the first time it is
     * delivered, bound to the dataset, layout, plan and model; later epochs
     * and later runs of the same plan read it back (verified) instead of
     * ticketing a producer, and a complete store needs no producer at all.
     * A store of another run refuses its producers, naming what differs. */
    const char *store;
    /* Pin the target (--expect-target; 16 hex digits, the fingerprint a
     * producer logs as "target DIR: fingerprint F", hs_target_fingerprint):
     * a producer or a store of another target is refused, naming both.
     * NULL = the run's target is its first producer's (or its store's). */
    const char *expect_target;
    /* Settings newer than the fields above: each is an option of the table
     * (hs_consumer_option_info), set by name with hs_consumer_config_set
     * and defaulted by hs_consumer_config_default; the slots are the
     * library's to lay out. */
    uint64_t more[16];
} hs_consumer_config_t;

/* One batch, as views into consumer-owned memory (host or device). */
typedef struct {
    uint32_t epoch;
    uint32_t batch; /* batch id in the plan */
    uint32_t n_seqs;
    uint32_t n_tokens;         /* T */
    uint32_t hidden_size;      /* H */
    uint32_t n_layers;         /* k */
    const int32_t *layers;     /* the k captured layer indices */
    const int32_t *cu_seqlens; /* n_seqs + 1 */
    const uint64_t *sample_ids;
    const int32_t *input_ids; /* T */
    const uint8_t *loss_mask; /* T */
    const uint16_t *hidden;   /* bf16 bits, [T][k*H] row-major; NULL when delivered as fp8 */
    bool on_device;           /* pointers are device pointers */
    uint64_t bytes;           /* size of the whole batch region */
    uint64_t handle;          /* internal; for hs_consumer_release */
    uint64_t ticket;          /* internal; for hs_consumer_release */
    /* An fp8 run delivered as fp8 (cfg.deliver HS_HIDDEN_FP8): hidden_dtype
     * HS_HIDDEN_FP8, `hidden` NULL and these set; otherwise HS_HIDDEN_BF16
     * and NULL (an fp8 run is dequantised: on the GPU as part of the copy,
     * on the host into a buffer of the consumer's). */
    hs_hidden_dtype_t hidden_dtype;
    const uint8_t *hidden_fp8;  /* e4m3, [T][k*H] row-major */
    const float *hidden_scales; /* [T]: value = e4m3 * scale */
} hs_batch_t;

typedef struct {
    uint64_t batches_planned; /* to deliver in this run, all epochs; 0 until the plan is known */
    uint64_t batches_resumed; /* skipped: released in an earlier run (journal) */
    uint64_t batches_delivered;
    uint64_t duplicates;
    uint64_t checksum_failures;
    uint64_t protocol_errors;
    uint64_t producers_connected, producers_seen, producers_dropped;
    uint64_t bytes_received; /* payload bytes that landed in the cache */
    uint64_t tokens_delivered;
    uint64_t tickets_out;
    uint64_t leases_returned; /* tickets that went back to the queue */
    uint64_t cache_capacity, cache_used, cache_high_water;
    uint64_t cache_ready_bytes; /* pinned (with a GPU) and usable so far */
    double cache_prepare_s;     /* time spent pinning the cache so far */
    double seconds;             /* since the first ticket */
    double starve_pct;          /* trainer waited for data */
    double producer_stall_pct;  /* reported by producers (mean) */
    uint64_t h2d_bytes;         /* GPU delivery: bytes copied to the GPU */
    double h2d_gbytes_per_s;    /* ... over the copy time (of an fp8 run delivered as bf16: the copy
                                   and its dequantisation) */
    uint32_t epochs;
    bool finished;
    /* Progress and the limit, from the rates since the first ticket. */
    uint32_t epoch;               /* epoch being delivered, 1..epochs; 0 before the plan */
    double run_pct;               /* of the run's batches delivered (resumed ones count) */
    double eta_epoch_s;           /* to the end of this epoch; -1 while unknown */
    double eta_run_s;             /* to the end of the run; -1 while unknown */
    double supply_batches_per_s;  /* batches the producers gave */
    double trainer_batches_per_s; /* batches the trainer took while it had data */
    int32_t bottleneck;           /* hs_bottleneck_t, from the recent window */
    /* With a store (cfg.store): batches read back from it and verified
     * (hits), ticketed to a producer because it lacked them (misses),
     * written this run, not written because the writer was busy (a later
     * epoch stores them), read back and failing their check (computed
     * again), held now, and whether the disk filled (0/1). */
    uint64_t store_hits, store_misses, store_writes, store_skipped, store_bad;
    uint64_t store_batches, store_bytes_written, store_full;
    /* The recent window: the last 30 s (less early in the run), the span of
     * the figures below. The limit and the ETAs come from these; the ETAs
     * stay -1 until the window is long enough to be stable (5 s and 5
     * batches). */
    double window_s;
    double recent_tokens_per_s;
    double recent_gbytes_per_s;
    double recent_supply_batches_per_s;
    double recent_trainer_batches_per_s; /* while it had data; 0 when it never had */
    double recent_starve_pct;
    /* The consumer's own verification: the share of their time its checksum
     * threads spent checking, since the first ticket and over the window. */
    uint32_t verify_threads;
    double verify_pct;
    double recent_verify_pct;
    /* Producers by the transport that carries them: connected now, and
     * admitted since the start (shared memory, hsflow's TCP, UCX). */
    uint64_t producers_shm, producers_tcp, producers_ucx;
    uint64_t producers_seen_shm, producers_seen_tcp, producers_seen_ucx;
    /* The target whose states the run delivers (hs_target_fingerprint): its
     * fingerprint (0 until the run is defined) and name, from the producer
     * that defined the run or from the store. */
    uint64_t target_fingerprint;
    char target_name[256];
} hs_consumer_stats_t;

/* Which side limits the run, from the recent window's figures: the trainer
 * waits for data most of the time while producers have tickets
 * (producers), producers wait for tickets while the trainer has data
 * (trainer), or both wait at once: the batches are in between, on the wire
 * (network) or in the consumer's own checksum threads when those are busy
 * most of the time, 60% or more (verify; --verify-threads lifts it). When neither
 * side waits much, none is (balanced). */
typedef enum {
    HS_BOTTLENECK_UNKNOWN = 0, /* too early to tell */
    HS_BOTTLENECK_PRODUCERS = 1,
    HS_BOTTLENECK_TRAINER = 2,
    HS_BOTTLENECK_NETWORK = 3,
    HS_BOTTLENECK_VERIFY = 4,
    HS_BOTTLENECK_BALANCED = 5,
} hs_bottleneck_t;
/* "unknown", "producers", "trainer", "network", "verify", "balanced". */
HSFLOW_API const char *hs_bottleneck_str(int32_t bottleneck);
/* The limit as one plain sentence ("producers are the limit: 3 producers
 * give 0.48 batch/s, the trainer waits for data 81% of the time"), every
 * figure from the recent window, into buf[cap]; returns the length it needs
 * (as snprintf). */
HSFLOW_API int hs_consumer_bottleneck_text(const hs_consumer_stats_t *s, char *buf, size_t cap);

typedef struct hs_consumer hs_consumer_t;

/* Every setting at the default of its option (hs_consumer_option_info). */
HSFLOW_API void hs_consumer_config_default(hs_consumer_config_t *cfg);

/* One setting of the consumer's option table: how hs-consumer spells it
 * (--FLAG, and HS_ENV in the environment), how Python's Consumer does
 * (the keyword argument `name`), and the bounds hs_consumer_create and
 * hs_consumer_config_set hold it to. Static strings, never NULL. */
typedef struct {
    const char *name;         /* "cache_gb": hs_consumer_config_set's name */
    const char *type;         /* "bool", "u32", "int", "double", "string" or "enum" */
    const char *flag;         /* "cache-gb" for --cache-gb; "" when hs-consumer has none */
    const char *env;          /* "HS_CACHE_GB"; "" when hs-consumer has none */
    const char *metavar;      /* "N", "arrival|plan"; "" for a bool */
    const char *default_text; /* "4"; "" when unset */
    const char *unit;         /* "GiB", "s", "tokens/s"; "" for none */
    const char *choices;      /* enum and checked strings: "arrival|plan"; "" for any */
    const char *help;         /* one paragraph, unwrapped */
    double min, max;          /* numbers: the bounds, in `unit`; both 0 for the others */
    bool min_open;            /* more than min, not min itself */
    bool shared_flag;         /* hs-consumer parses the flag with hs-producer's network flags */
} hs_option_info_t;

/* The number of options, and the i-th (0..count-1) into *out:
 * HS_ERR_INVALID past the end. */
HSFLOW_API uint32_t hs_consumer_option_count(void);
HSFLOW_API HS_MUST_CHECK hs_status_t hs_consumer_option_info(uint32_t i, hs_option_info_t *out);
/* Sets the option `name` ("cache_gb") from its text ("64", "0.5", "plan",
 * "true"), checked against its type and bounds. HS_ERR_INVALID for an
 * unknown name or a bad value, with why[why_cap] (when not NULL) saying
 * what was expected ("expected GiB from 0.0009765625 to 1048576"), else
 * logged; cfg is then unchanged. A string option keeps the pointer `value`
 * (the caller's, until hs_consumer_create has copied what it needs). */
HSFLOW_API HS_MUST_CHECK hs_status_t hs_consumer_config_set(hs_consumer_config_t *cfg,
                                                            const char *name, const char *value,
                                                            char *why, size_t why_cap);
/* Validates the config, allocates the cache, starts listening and the
 * network thread. On failure nothing is left running. */
HSFLOW_API HS_MUST_CHECK hs_status_t hs_consumer_create(const hs_consumer_config_t *cfg,
                                                        hs_consumer_t **out);
/* The port actually bound (useful with listen_port 0). */
HSFLOW_API uint16_t hs_consumer_port(const hs_consumer_t *c);
/* The metrics endpoint's port (0 when off). */
HSFLOW_API uint16_t hs_consumer_metrics_port(const hs_consumer_t *c);
/* Waits up to timeout_ms (-1 = forever) for the next verified batch.
 * Returns 0 with *out set, HS_ERR_TIMEOUT (-11), or HS_ERR_CLOSED (-9) once
 * every batch of every epoch has been delivered (or the consumer stopped);
 * HS_ERR_NOSPACE (-12) when the consumer stopped on a problem of its own
 * that no producer can fix (its cache cannot hold the plan's largest batch,
 * the journal or resume state does not fit the plan, out of memory, another
 * consumer of the run claims its rank and started earlier: then not even a
 * batch already verified is handed out; logged once, naming it); with a GPU (cfg.gpu >= 0) also
 * HS_ERR_CUDA (-15) when a copy to the device failed (logged). */
HSFLOW_API HS_MUST_CHECK hs_status_t hs_consumer_next(hs_consumer_t *c, hs_batch_t *out,
                                                      int timeout_ms);
/* Gives the batch's cache slot back; new tickets can then be issued.
 * Returns 0, HS_ERR_INVALID (-1, logged; nothing freed, nothing journaled)
 * for a batch the trainer does not hold now: one this consumer did not hand
 * out, one released before (even once its slot or device buffer holds
 * another batch: a delivery is named by its ticket, never reused), one
 * given back with hs_consumer_unget(), or an
 * hs_batch_t whose epoch, batch or slot were changed; with a GPU
 * HS_ERR_CUDA (-15, logged), and
 * with a journal HS_ERR_IO (-3, logged) when the journal could not record
 * the release: the batch is released all the same, and a restart from that
 * journal may deliver it again. */
HSFLOW_API HS_MUST_CHECK hs_status_t hs_consumer_release(hs_consumer_t *c, const hs_batch_t *batch);
/* Gives back a batch hs_consumer_next() handed out that never reached the
 * trainer (a binding interrupted between the two, e.g. by a signal):
 * it is no longer counted as delivered nor in the position, nothing is
 * journaled, its memory stays as it is, and the next hs_consumer_next()
 * returns it again, before any other. Returns 0, or HS_ERR_INVALID (-1,
 * logged; nothing changed) for a batch the trainer does not hold, or while
 * another one given back waits to go out. Do not release it. */
HSFLOW_API HS_MUST_CHECK hs_status_t hs_consumer_unget(hs_consumer_t *c, const hs_batch_t *batch);
/* Whether the trainer holds `batch` now: hs_consumer_next() handed it out,
 * unchanged, and it was neither released nor given back. Quiet (a binding
 * asks before a release it may have done already). */
HSFLOW_API bool hs_consumer_holds(const hs_consumer_t *c, const hs_batch_t *batch);
/* The consumer's position, for the trainer's checkpoint: every batch that
 * hs_consumer_next() has handed out so far (the one the trainer holds now
 * included, and those of the resume state it started from), as compact JSON
 * (DESIGN §12). Writes it with a NUL into buf[cap] and sets *len to its
 * length without the NUL. With buf NULL or cap <= that length it returns
 * HS_ERR_NOSPACE (-12) and still sets *len: call with cap 0 to ask for the
 * size. Call it from the trainer's thread (between next() calls the
 * position does not move). */
HSFLOW_API HS_MUST_CHECK hs_status_t hs_consumer_state_save(hs_consumer_t *c, char *buf, size_t cap,
                                                            size_t *len);
HSFLOW_API void hs_consumer_stats(hs_consumer_t *c, hs_consumer_stats_t *out);
/* The summary as a JSON object into buf[cap]; returns the length it needs
 * (as snprintf). Keys: batches_planned, batches_delivered, duplicates,
 * checksum_failures, bytes, seconds, tokens_per_s, gbytes_per_s, ... */
HSFLOW_API int hs_consumer_stats_json(const hs_consumer_stats_t *s, char *buf, size_t cap);
/* One-line live status into buf. */
HSFLOW_API void hs_consumer_status_line(hs_consumer_t *c, char *buf, size_t cap);
/* Tells producers BYE, stops the network thread, frees everything. NULL ok. */
HSFLOW_API void hs_consumer_destroy(hs_consumer_t *c);

/* ---- producer side, for targets the built-in decoder does not cover -------
 *
 * The caller computes the hidden states itself (e.g. a PyTorch model) and
 * hsflow does the rest: the shared plan, the handshake, tickets, packing,
 * checksums and the transfer.
 *
 *     hs_producer_t *p;
 *     hs_producer_open(&cfg, &p);
 *     hs_work_t w;
 *     while (hs_producer_next(p, &w, -1) == 0) {
 *         forward(w.input_ids, w.cu_seqlens, w.n_seqs, w.hidden);   // write [T][k*H] bf16
 *         hs_producer_submit(p, &w);
 *     }
 *     hs_producer_close(p);
 *
 * Ownership: the pointers of an hs_work_t point into a staging buffer that
 * belongs to the producer; the caller may write `hidden` (and only that)
 * until hs_producer_submit(). At most staging_buffers batches (three by
 * default) are taken or on the wire at once: with three, a caller that
 * queues batch N+1's work before it submits N still has a buffer for N+2
 * while N is sent. */

#define HS_PRODUCER_STAGING_MAX 4 /* staging buffers a producer of this API may have */

typedef struct {
    const char *to;        /* consumer "HOST:PORT" */
    const char *data_path; /* JSONL or .hst; the same for every producer of a run */
    uint32_t token_budget;
    uint32_t max_seq_len; /* 0 = token_budget */
    bool overflow_drop;   /* drop (true) or truncate (false) longer sequences */
    uint64_t seed;
    uint32_t hidden_size;
    const int32_t *layers; /* captured output_hidden_states indices, increasing */
    uint32_t n_layers;
    uint32_t prefetch;          /* tickets to keep queued; 0 = 2 */
    const char *secret_file;    /* NULL = none */
    const char *transport;      /* NULL = "auto" */
    const char *name;           /* NULL = host:pid */
    uint32_t connect_timeout_s; /* 0 = 30 */
    bool reconnect; /* lost consumer: connect again for up to connect_timeout_s and carry on */
    /* how the hidden states travel: HS_HIDDEN_BF16 (0 means the same) or
     * HS_HIDDEN_FP8, filled as hs_work_t.hidden_fp8 and hidden_scales */
    hs_hidden_dtype_t hs_dtype;
    double status_interval_s; /* seconds between the library's status lines; 0 = 5, < 0 = off */
    /* batch-sized host buffers, 2..HS_PRODUCER_STAGING_MAX; 0 = 3. Two save
     * one batch's memory, but then a caller that computes batch N+1 before
     * it submits N waits for N's whole send before it can take N+2. */
    uint32_t staging_buffers;
    /* The target that computes the hidden states (never 0: hs_producer_open
     * refuses it): hs_target_fingerprint() of its model folder,
     * hs_target_synthetic_fingerprint() for hs_synth_value's states, or a
     * 64-bit fingerprint of the caller's own. A run and its store hold one
     * target; a consumer refuses a producer of another. target_name names it
     * in logs and stores (NULL = "unnamed"). */
    uint64_t target_fingerprint;
    const char *target_name;
} hs_producer_client_config_t;

typedef struct {
    uint64_t ticket;
    uint32_t epoch, batch, n_seqs, n_tokens, hidden_size, n_layers;
    const int32_t *cu_seqlens;  /* n_seqs + 1 */
    const uint64_t *sample_ids; /* dataset indices of the sequences */
    const int32_t *input_ids;   /* T */
    const uint8_t *loss_mask;   /* T */
    uint16_t *hidden;           /* to fill: bf16 bits, [T][k*H] row-major; NULL for fp8 */
    uint64_t bytes;
    uint64_t handle; /* internal */
    /* hs_dtype HS_HIDDEN_FP8: to fill instead of `hidden`, each token's row
     * quantised as hs_fp8_quantize_row_bf16 does (scale = amax / 448, 1 for
     * a row of zeros; e4m3 of value / scale, nearest even, within +-448) */
    uint8_t *hidden_fp8;  /* [T][k*H] */
    float *hidden_scales; /* [T] */
} hs_work_t;

typedef struct hs_producer hs_producer_t;

/* Every setting at its option's default (token_budget 65536, prefetch 2,
 * transport "auto", connect_timeout_s 30, status_interval_s 5,
 * staging_buffers 3, ...); the rest zero or NULL. The options are
 * hs-producer's where the setting is the same (hs_producer_option_info for
 * their bounds), plus staging_buffers and target_name. */
HSFLOW_API void hs_producer_client_config_default(hs_producer_client_config_t *cfg);
/* Sets the option `name` of cfg ("token_budget", "overflow", "hs_dtype",
 * "staging_buffers", ...: the field's name, "data" for data_path and
 * "overflow" ("truncate" or "drop") for overflow_drop) from its text,
 * checked against its type and bounds. HS_ERR_INVALID for an unknown name
 * or a bad value, with why[why_cap] (when not NULL) saying what was
 * expected, else logged; cfg is then unchanged. A string option keeps the
 * pointer `value` (the caller's, until hs_producer_open returns). layers,
 * target_fingerprint and n_layers are not options: set the fields. */
HSFLOW_API HS_MUST_CHECK hs_status_t hs_producer_client_config_set(hs_producer_client_config_t *cfg,
                                                                   const char *name,
                                                                   const char *value, char *why,
                                                                   size_t why_cap);
/* Loads the dataset, builds the plan, connects and starts the network thread. */
HSFLOW_API HS_MUST_CHECK hs_status_t hs_producer_open(const hs_producer_client_config_t *cfg,
                                                      hs_producer_t **out);
/* Next ticketed batch with ids, mask and cu_seqlens filled in. HS_ERR_CLOSED
 * (-9) when the consumer said the run is over; HS_ERR_TIMEOUT (-11). */
HSFLOW_API HS_MUST_CHECK hs_status_t hs_producer_next(hs_producer_t *p, hs_work_t *out,
                                                      int timeout_ms);
/* Seals (checksum) and sends the batch; its buffer comes back to the producer.
 * HS_ERR_INVALID (logged) for a batch not taken with hs_producer_next or
 * already submitted. */
HSFLOW_API HS_MUST_CHECK hs_status_t hs_producer_submit(hs_producer_t *p, const hs_work_t *work);
/* Says BYE if the run is not over, stops, frees. NULL ok. */
HSFLOW_API void hs_producer_close(hs_producer_t *p);

/* What hs_producer_open() planned: the plan hash (the one every producer of
 * the run must share), batches per epoch, and the staging buffers every
 * hs_work_t points into (each `staging_bytes` long, NULL past the last,
 * owned by the producer until hs_producer_close()), so a caller can
 * page-lock them once for device-to-host copies straight into them. */
typedef struct {
    uint64_t plan_hash;
    uint32_t n_batches;
    uint32_t max_batch_tokens;
    void *staging[HS_PRODUCER_STAGING_MAX];
    uint64_t staging_bytes;
} hs_producer_info_t;

HSFLOW_API HS_MUST_CHECK hs_status_t hs_producer_info(const hs_producer_t *p,
                                                      hs_producer_info_t *out);

#ifdef __cplusplus
}
#endif
#endif /* HSFLOW_H */
