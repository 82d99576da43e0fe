/* SPDX-License-Identifier: Apache-2.0 */
/* options.c - the consumer's option table: one entry per setting of
 * hs_consumer_config_t that a caller chooses, with its type, default,
 * bounds, unit, command-line flag and help. The defaults of
 * hs_consumer_config_default, the bounds hs_consumer_create checks, the
 * parser and --help of hs-consumer, Python's Consumer keywords and
 * docs/cli.md all come from it (through hs_consumer_option_info); the
 * machinery of a table is common/hs_options.h. */
#include "options_int.h"

#include "hsflow.h"
#include "hs_options.h"
#include "hs_parse.h"
#include "hs_proto.h" /* hs_layout_parse */

#include <stdio.h>
#include <string.h>

static const char *check_hostport(const char *v, char *why, size_t cap)
{
    char host[256];
    uint16_t port;
    if (hs_parse_hostport(v, host, sizeof(host), &port) == HS_OK) return NULL;
    snprintf(why, cap, "expected HOST:PORT, e.g. 0.0.0.0:9400");
    return why;
}

/* 16 hex digits (an optional 0x, fewer digits), as hs-data plan prints a hash. */
static const char *check_hash(const char *v, char *why, size_t cap)
{
    const char *s = v;
    if (s[0] == '0' && (s[1] == 'x' || s[1] == 'X')) s += 2;
    size_t n = strlen(s);
    if (n > 0 && n <= 16 && strspn(s, "0123456789abcdefABCDEF") == n) return NULL;
    snprintf(why, cap,
             "expected 16 hex digits, as hs-data plan prints them (a producer logs "
             "its target's)");
    return why;
}

static const char *check_layout(const char *v, char *why, size_t cap)
{
    hs_layout_t l;
    char e[160];
    if (hs_layout_parse(v, &l, e, sizeof(e)) == HS_OK) return NULL;
    snprintf(why, cap, "%s (e.g. H=4096,layers=2,16,29,dtype=bf16)", e);
    return why;
}

static const char *check_nonempty(const char *v, char *why, size_t cap)
{
    if (v[0]) return NULL;
    snprintf(why, cap, "expected a folder, e.g. /data/hs-store");
    return why;
}

#define FIELD(f) offsetof(hs_consumer_config_t, f)
#define MORE(i) (offsetof(hs_consumer_config_t, more) + (i) * sizeof(uint64_t))

/* clang-format off */
static const hs_opt_t options[] = {
    /* name, type, where, default, min, max, unit, flag, metavar, help */
    HS_OPT("cache_gb", HS_OPT_GIB, FIELD(cache_bytes), "4", 1.0 / 1024, 1 << 20, "GiB", "cache-gb", "N",
     "host-RAM cache in GiB, fractions allowed, at least 1 MiB (0.0009765625); more than the "
     "memory this process can get (MemAvailable, or the cgroup's limit less its usage) is "
     "refused, since it would be OOM-killed once it fills; the caches other consumers on this "
     "node have claimed and not yet filled are counted too"),
    HS_OPT("force", HS_OPT_BOOL, FIELD(force), "", 0, 0, "", "force", "",
     "start with such a --cache-gb anyway (a warning instead)"),
    HS_OPT("epochs", HS_OPT_U32, FIELD(epochs), "1", 1, 1000000, "", "epochs", "E", "epochs to deliver"),
    HS_OPT("gpu", HS_OPT_INT, FIELD(gpu), "none", -1, 1023, "", "gpu", "none|K",
     "deliver batches to GPU K, or keep them in host memory: none", .word = "none",
     .word_value = -1),
    HS_OPT("order", HS_OPT_ENUM, FIELD(order), "arrival", 0, 0, "", "order", "arrival|plan",
     "delivery order: as verified (arrival) or strict plan order (plan)",
     .choices = "arrival|plan", .values = {HS_ORDER_ARRIVAL, HS_ORDER_PLAN}),
    HS_OPT("rank", HS_OPT_U32, FIELD(rank), "0", 0, (1 << 20) - 1, "", "rank", "R",
     "data-parallel ranks (with --world W): this consumer delivers only rank R's shard of each "
     "epoch of a plan shared by W consumers (one per trainer GPU), the same number of batches "
     "per epoch on every rank; each rank has its own port, cache, journal and state"),
    HS_OPT("world", HS_OPT_U32, FIELD(world), "1", 1, 1 << 20, "", "world", "W",
     "the number of data-parallel ranks (consumers) sharing the plan; give every rank the same"),
    HS_OPT("uneven", HS_OPT_ENUM, FIELD(uneven), "drop", 0, 0, "", "uneven", "drop|repeat",
     "batches left over when an epoch does not divide by W: skipped (drop; counted) or the "
     "short ranks take batches from the epoch's start (repeat)",
     .choices = "drop|repeat", .values = {HS_UNEVEN_DROP, HS_UNEVEN_REPEAT}),
    HS_OPT("prefetch", HS_OPT_U32, FIELD(prefetch), "4", 1, 64, "", "prefetch", "N",
     "most tickets queued per producer worker; each producer asks its own number and gets the "
     "lesser; a producer's tickets pin at most a fair share of the cache (capacity / ready "
     "producers, at least one batch), whatever workers it claims"),
    HS_OPT("lease_timeout_s", HS_OPT_DOUBLE, FIELD(lease_timeout_s), "60", 0, 1e6, "s", "lease-timeout", "S",
     "a producer holding tickets that shows no progress for S seconds (no finished batch, no "
     "payload bytes arriving, no heartbeat from a computing worker: it was stopped or hangs) is "
     "dropped and its tickets go back to the queue (0 = never)"),
    HS_OPT("lease_min_tokens_per_s", HS_OPT_DOUBLE, FIELD(lease_min_tokens_per_s), "200", 0, 1e9,
     "tokens/s", "lease-min-rate", "R",
     "heartbeats without a finished batch hold tickets for at most the lease timeout plus the "
     "plan's largest batch at R tokens/s (lower it for slow CPU forwards)", .min_open = true),
    HS_OPT("verify_synthetic", HS_OPT_BOOL, FIELD(verify_synthetic), "", 0, 0, "", "verify-synthetic", "",
     "check every hidden-state element against the synthetic source"),
    HS_OPT("deliver", HS_OPT_ENUM, FIELD(deliver), "bf16", 0, 0, "", "deliver", "bf16|fp8",
     "how an fp8 run (producers' --hs-dtype fp8) reaches the trainer: bf16 (dequantised on the "
     "--gpu as part of the copy) or fp8 (the raw e4m3 bytes and per-token scales)",
     .choices = "bf16|fp8", .values = {HS_HIDDEN_BF16, HS_HIDDEN_FP8}),
    HS_OPT("verify_threads", HS_OPT_U32, FIELD(verify_threads), "1", 1, 64, "", "verify-threads", "N",
     "checksum threads; raise it when the status line says this consumer's verification is the "
     "limit"),
    HS_OPT("handshake_timeout_s", HS_OPT_DOUBLE, FIELD(handshake_timeout_s), "15", 0, 1e6, "s",
     "handshake-timeout", "S",
     "a peer must finish its handshake S seconds after connecting, and send each page of its "
     "plan within S", .min_open = true),
    HS_OPT("no_producer_warn_s", HS_OPT_DOUBLE, FIELD(no_producer_warn_s), "30", 0, 1e6, "s",
     "no-producer-warn", "S", "warn when no producer has connected for S seconds",
     .min_open = true),
    HS_OPT("metrics", HS_OPT_STRING, FIELD(metrics), "", 0, 0, "", "metrics", "HOST:PORT",
     "serve Prometheus metrics at http://HOST:PORT/metrics (no secret: at most 16 connections, "
     "4 from one address, 5 s idle)", .check = check_hostport),
    HS_OPT("journal", HS_OPT_STRING, FIELD(journal), "", 0, 0, "", "journal", "FILE",
     "record every released batch; a restarted consumer with the same journal skips them and "
     "resumes each epoch where it stopped"),
    HS_OPT("expect_plan", HS_OPT_STRING, FIELD(expect_plan), "", 0, 0, "", "expect-plan", "HASH",
     "pin the run: refuse every producer whose plan hash differs, the first to connect too, and "
     "wait for the right ones (unset: the first complete plan defines the run)",
     .check = check_hash),
    HS_OPT("expect_dataset", HS_OPT_STRING, FIELD(expect_dataset), "", 0, 0, "", "expect-dataset", "FP",
     "pin the dataset: refuse producers whose dataset fingerprint differs", .check = check_hash),
    HS_OPT("expect_layout", HS_OPT_STRING, FIELD(expect_layout), "", 0, 0, "", "expect-layout",
     "H=N,layers=L1,L2,...,dtype=bf16",
     "pin the layout: refuse producers with another --hidden-size or --layers. `hs-data plan "
     "FILE --hidden-size H --layers L1,L2,...` prints all three flags", .check = check_layout),
    HS_OPT("expect_target", HS_OPT_STRING, FIELD(expect_target), "", 0, 0, "", "expect-target", "FP",
     "pin the target: refuse producers and a --store whose target (model config and weights) "
     "has another fingerprint, naming both; a producer logs its own (\"target DIR: fingerprint "
     "FP\")", .check = check_hash),
    HS_OPT("store", HS_OPT_STRING, FIELD(store), "", 0, 0, "", "store", "DIR",
     "keep every verified batch once on disk in DIR (made if missing), bound to the dataset, "
     "layout (dtype included), plan and target (the fingerprint of its config and weights; a "
     "store replayed alone logs it and --summary-json holds it): later epochs and later runs of "
     "that plan read it back, verified, instead of asking producers, which get only what DIR "
     "lacks; a complete store needs no producer. A store of another run refuses the producers, "
     "naming what differs. Written off the trainer's path; a full disk stops it growing (one "
     "warning). One consumer per DIR (locked while it runs): give each rank a store of its own. "
     "hsflow-data store info|verify|export DIR reads it (docs/store.md)", .check = check_nonempty),
    HS_OPT("transport", HS_OPT_STRING, FIELD(transport), "auto", 0, 0, "", "transport", "KIND",
     "auto, shm, tcp or ucx (auto, per producer: shared memory with producers on this host, ucx "
     "where an RDMA device is present, else tcp); shm takes producers on this host only",
     .choices = "auto|shm|tcp|ucx", .shared_flag = true),
    HS_OPT("secret_file", HS_OPT_STRING, FIELD(secret_file), "", 0, 0, "", "secret-file", "FILE",
     "shared secret: producers must prove they hold it (HMAC)", .shared_flag = true),
    HS_OPT("insecure", HS_OPT_BOOL, FIELD(insecure), "", 0, 0, "", "insecure", "",
     "accept non-loopback producers without a secret", .shared_flag = true),
    HS_OPT("require_rdma", HS_OPT_BOOL, FIELD(require_rdma), "", 0, 0, "", "require-rdma", "",
     "fail instead of running without an RDMA lane (no silent TCP)", .shared_flag = true),
    HS_OPT("max_producers", HS_OPT_U32, MORE(0), "0", 0, 1 << 16, "", "max-producers", "N",
     "producers admitted at once; one more is refused at its HELLO, naming this flag (0 = any)"),
    HS_OPT("shm_copiers", HS_OPT_U32, MORE(1), "0", 0, 8, "", "shm-copiers", "N",
     "threads that copy same-host producers' batches out of their shared memory into the cache "
     "(0 = half the CPUs, 1 to 4)"),
    HS_OPT("peer_timeout_s", HS_OPT_U32, FIELD(peer_timeout_s), "10", 0, 86400, "s", "", "S",
     "a connected peer silent this long is closed (0 = 10)"),
};
/* clang-format on */

#define N_OPTIONS (sizeof(options) / sizeof(options[0]))

static char envs[N_OPTIONS][HS_OPT_ENV_CAP];
static hs_opt_table_t table = {"consumer", options, N_OPTIONS, envs, false};

uint32_t hs_consumer_option_count(void) { return (uint32_t)N_OPTIONS; }

hs_status_t hs_consumer_option_info(uint32_t i, hs_option_info_t *out)
{
    return hs_opt_table_info(&table, i, out);
}

hs_status_t hs_consumer_config_set(hs_consumer_config_t *cfg, const char *name, const char *value,
                                   char *why, size_t why_cap)
{
    return hs_opt_table_set(&table, cfg, name, value, why, why_cap);
}

void hs_consumer_config_default(hs_consumer_config_t *cfg)
{
    hs_opt_table_defaults(&table, cfg, sizeof(*cfg));
    cfg->listen_host = "0.0.0.0";
    cfg->listen_port = 7000;
    cfg->status_interval_s = 5;
}

hs_status_t hs__consumer_options_check(const hs_consumer_config_t *cfg, char *why, size_t cap)
{
    return hs_opt_table_check(&table, cfg, why, cap);
}

/* hs__consumer_fault_set()'s spec: a test hook, not an option */
static const char *fault_spec;

void hs__consumer_fault_set(const char *spec) { fault_spec = spec; }

const char *hs__consumer_fault(void) { return fault_spec; }

uint32_t hs__consumer_option_u32(const hs_consumer_config_t *cfg, const char *name)
{
    return (uint32_t)hs_opt_table_get(&table, cfg, name, HS_OPT_U32);
}

double hs__consumer_option_double(const hs_consumer_config_t *cfg, const char *name)
{
    return hs_opt_table_get(&table, cfg, name, HS_OPT_DOUBLE);
}
