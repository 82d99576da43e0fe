/* SPDX-License-Identifier: Apache-2.0 */
/* options.c - the consumer's option table: one entry per setting of
 * hs_consumer_config_t that a caller chooses, with its type, default,
 * bounds, unit, command-line flag and help. The defaults of
 * hs_consumer_config_default, the bounds hs_consumer_create checks, the
 * parser and --help of hs-consumer, Python's Consumer keywords and
 * docs/cli.md all come from it (through hs_consumer_option_info). */
#include "options_int.h"

#include "hsflow.h"
#include "hs_log.h"
#include "hs_parse.h"
#include "hs_proto.h" /* hs_layout_parse */

#include <assert.h>
#include <ctype.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

typedef enum {
    T_BOOL,   /* bool */
    T_U32,    /* uint32_t */
    T_INT,    /* int; "none" is -1 where min is -1 */
    T_DOUBLE, /* double */
    T_GIB,    /* a uint64_t of bytes, given in GiB (a double) */
    T_STRING, /* const char *, the caller's */
    T_ENUM,   /* an int enum: choices[i] is values[i] */
} opt_type_t;

/* A string's form beyond "any text": NULL, or why it is not that form. */
typedef const char *(*opt_check_fn)(const char *value, char *why, size_t cap);

typedef struct {
    const char *name;
    opt_type_t type;
    size_t at; /* offset in hs_consumer_config_t (FIELD or MORE) */
    const char *dflt;
    double min, max;
    const char *unit, *flag, *metavar, *help;
    /* optional */
    bool min_open;
    const char *choices; /* "a|b" */
    int values[4];       /* T_ENUM: the value of each choice */
    opt_check_fn check;  /* T_STRING */
    bool shared_flag;    /* hs-consumer parses it with its network flags */
} option_t;

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

/* An entry: the columns every option has, then those it needs of the
 * optional ones (.min_open, .choices, .values, .check, .shared_flag). */
#define OPT(name_, type_, at_, dflt_, min_, max_, unit_, flag_, metavar_, help_, ...)              \
    {                                                                                              \
        .name = name_, .type = type_, .at = at_, .dflt = dflt_, .min = min_, .max = max_,          \
        .unit = unit_, .flag = flag_, .metavar = metavar_, .help = help_, __VA_ARGS__              \
    }

/* clang-format off */
static const option_t options[] = {
    /* name, type, where, default, min, max, unit, flag, metavar, help */
    OPT("cache_gb", T_GIB, FIELD(cache_bytes), "4", 1.0 / 1024, 1 << 20, "GiB", "cache-gb", "N",
     "host-RAM cache in GiB, fractions allowed, at least 1 MiB (0.0009765625); more than the "
     "memory this process can get (MemAvailable, or the cgroup's limit less its usage) is "
     "refused, since it would be OOM-killed once it fills; the caches other consumers on this "
     "node have claimed and not yet filled are counted too"),
    OPT("force", T_BOOL, FIELD(force), "", 0, 0, "", "force", "",
     "start with such a --cache-gb anyway (a warning instead)"),
    OPT("epochs", T_U32, FIELD(epochs), "1", 1, 1000000, "", "epochs", "E", "epochs to deliver"),
    OPT("gpu", T_INT, FIELD(gpu), "none", -1, 1023, "", "gpu", "none|K",
     "deliver batches to GPU K, or keep them in host memory: none"),
    OPT("order", T_ENUM, FIELD(order), "arrival", 0, 0, "", "order", "arrival|plan",
     "delivery order: as verified (arrival) or strict plan order (plan)",
     .choices = "arrival|plan", .values = {HS_ORDER_ARRIVAL, HS_ORDER_PLAN}),
    OPT("rank", T_U32, FIELD(rank), "0", 0, (1 << 20) - 1, "", "rank", "R",
     "data-parallel ranks (with --world W): this consumer delivers only rank R's shard of each "
     "epoch of a plan shared by W consumers (one per trainer GPU), the same number of batches "
     "per epoch on every rank; each rank has its own port, cache, journal and state"),
    OPT("world", T_U32, FIELD(world), "1", 1, 1 << 20, "", "world", "W",
     "the number of data-parallel ranks (consumers) sharing the plan; give every rank the same"),
    OPT("uneven", T_ENUM, FIELD(uneven), "drop", 0, 0, "", "uneven", "drop|repeat",
     "batches left over when an epoch does not divide by W: skipped (drop; counted) or the "
     "short ranks take batches from the epoch's start (repeat)",
     .choices = "drop|repeat", .values = {HS_UNEVEN_DROP, HS_UNEVEN_REPEAT}),
    OPT("prefetch", T_U32, FIELD(prefetch), "4", 1, 64, "", "prefetch", "N",
     "most tickets queued per producer worker; each producer asks its own number and gets the "
     "lesser; a producer's tickets pin at most a fair share of the cache (capacity / ready "
     "producers, at least one batch), whatever workers it claims"),
    OPT("lease_timeout_s", T_DOUBLE, FIELD(lease_timeout_s), "60", 0, 1e6, "s", "lease-timeout", "S",
     "a producer holding tickets that shows no progress for S seconds (no finished batch, no "
     "payload bytes arriving, no heartbeat from a computing worker: it was stopped or hangs) is "
     "dropped and its tickets go back to the queue (0 = never)"),
    OPT("lease_min_tokens_per_s", T_DOUBLE, FIELD(lease_min_tokens_per_s), "200", 0, 1e9,
     "tokens/s", "lease-min-rate", "R",
     "heartbeats without a finished batch hold tickets for at most the lease timeout plus the "
     "plan's largest batch at R tokens/s (lower it for slow CPU forwards)", .min_open = true),
    OPT("verify_synthetic", T_BOOL, FIELD(verify_synthetic), "", 0, 0, "", "verify-synthetic", "",
     "check every hidden-state element against the synthetic source"),
    OPT("deliver", T_ENUM, FIELD(deliver), "bf16", 0, 0, "", "deliver", "bf16|fp8",
     "how an fp8 run (producers' --hs-dtype fp8) reaches the trainer: bf16 (dequantised on the "
     "--gpu as part of the copy) or fp8 (the raw e4m3 bytes and per-token scales)",
     .choices = "bf16|fp8", .values = {HS_HIDDEN_BF16, HS_HIDDEN_FP8}),
    OPT("verify_threads", T_U32, FIELD(verify_threads), "1", 1, 64, "", "verify-threads", "N",
     "checksum threads; raise it when the status line says this consumer's verification is the "
     "limit"),
    OPT("handshake_timeout_s", T_DOUBLE, FIELD(handshake_timeout_s), "15", 0, 1e6, "s",
     "handshake-timeout", "S",
     "a peer must finish its handshake S seconds after connecting, and send each page of its "
     "plan within S", .min_open = true),
    OPT("no_producer_warn_s", T_DOUBLE, FIELD(no_producer_warn_s), "30", 0, 1e6, "s",
     "no-producer-warn", "S", "warn when no producer has connected for S seconds",
     .min_open = true),
    OPT("metrics", T_STRING, FIELD(metrics), "", 0, 0, "", "metrics", "HOST:PORT",
     "serve Prometheus metrics at http://HOST:PORT/metrics (no secret: at most 16 connections, "
     "4 from one address, 5 s idle)", .check = check_hostport),
    OPT("journal", T_STRING, FIELD(journal), "", 0, 0, "", "journal", "FILE",
     "record every released batch; a restarted consumer with the same journal skips them and "
     "resumes each epoch where it stopped"),
    OPT("expect_plan", T_STRING, FIELD(expect_plan), "", 0, 0, "", "expect-plan", "HASH",
     "pin the run: refuse every producer whose plan hash differs, the first to connect too, and "
     "wait for the right ones (unset: the first complete plan defines the run)",
     .check = check_hash),
    OPT("expect_dataset", T_STRING, FIELD(expect_dataset), "", 0, 0, "", "expect-dataset", "FP",
     "pin the dataset: refuse producers whose dataset fingerprint differs", .check = check_hash),
    OPT("expect_layout", T_STRING, FIELD(expect_layout), "", 0, 0, "", "expect-layout",
     "H=N,layers=L1,L2,...,dtype=bf16",
     "pin the layout: refuse producers with another --hidden-size or --layers. `hs-data plan "
     "FILE --hidden-size H --layers L1,L2,...` prints all three flags", .check = check_layout),
    OPT("expect_target", T_STRING, FIELD(expect_target), "", 0, 0, "", "expect-target", "FP",
     "pin the target: refuse producers and a --store whose target (model config and weights) "
     "has another fingerprint, naming both; a producer logs its own (\"target DIR: fingerprint "
     "FP\")", .check = check_hash),
    OPT("store", T_STRING, FIELD(store), "", 0, 0, "", "store", "DIR",
     "keep every verified batch once on disk in DIR (made if missing), bound to the dataset, "
     "layout (dtype included), plan and target (the fingerprint of its config and weights; a "
     "store replayed alone logs it and --summary-json holds it): later epochs and later runs of "
     "that plan read it back, verified, instead of asking producers, which get only what DIR "
     "lacks; a complete store needs no producer. A store of another run refuses the producers, "
     "naming what differs. Written off the trainer's path; a full disk stops it growing (one "
     "warning). One consumer per DIR (locked while it runs): give each rank a store of its own. "
     "hsflow-data store info|verify|export DIR reads it (docs/store.md)", .check = check_nonempty),
    OPT("transport", T_STRING, FIELD(transport), "auto", 0, 0, "", "transport", "KIND",
     "auto, shm, tcp or ucx (auto, per producer: shared memory with producers on this host, ucx "
     "where an RDMA device is present, else tcp); shm takes producers on this host only",
     .choices = "auto|shm|tcp|ucx", .shared_flag = true),
    OPT("secret_file", T_STRING, FIELD(secret_file), "", 0, 0, "", "secret-file", "FILE",
     "shared secret: producers must prove they hold it (HMAC)", .shared_flag = true),
    OPT("insecure", T_BOOL, FIELD(insecure), "", 0, 0, "", "insecure", "",
     "accept non-loopback producers without a secret", .shared_flag = true),
    OPT("require_rdma", T_BOOL, FIELD(require_rdma), "", 0, 0, "", "require-rdma", "",
     "fail instead of running without an RDMA lane (no silent TCP)", .shared_flag = true),
    OPT("max_producers", T_U32, MORE(0), "0", 0, 1 << 16, "", "max-producers", "N",
     "producers admitted at once; one more is refused at its HELLO, naming this flag (0 = any)"),
    OPT("shm_copiers", T_U32, MORE(1), "0", 0, 8, "", "shm-copiers", "N",
     "threads that copy same-host producers' batches out of their shared memory into the cache "
     "(0 = half the CPUs, 1 to 4)"),
    OPT("peer_timeout_s", T_U32, FIELD(peer_timeout_s), "10", 0, 86400, "s", "", "S",
     "a connected peer silent this long is closed (0 = 10)"),
};
/* clang-format on */

#define N_OPTIONS (sizeof(options) / sizeof(options[0]))

static const option_t *option_find(const char *name)
{
    for (size_t i = 0; i < N_OPTIONS; i++)
        if (!strcmp(options[i].name, name)) return &options[i];
    return NULL;
}

static const char *type_name(opt_type_t t)
{
    static const char *names[] = {"bool", "u32", "int", "double", "double", "string", "enum"};
    return names[t];
}

/* Each option's environment variable: HS_ and its flag in capitals, '-'
 * as '_' ("" without a flag); made once. */
static char envs[N_OPTIONS][64];
static pthread_once_t envs_once = PTHREAD_ONCE_INIT;

static void envs_make(void)
{
    for (size_t i = 0; i < N_OPTIONS; i++) {
        const char *flag = options[i].flag;
        if (!flag[0]) continue;
        size_t j = (size_t)snprintf(envs[i], sizeof(envs[i]), "HS_");
        for (const char *c = flag; *c && j + 1 < sizeof(envs[i]); c++)
            envs[i][j++] = *c == '-' ? '_' : (char)toupper((unsigned char)*c);
        envs[i][j] = 0;
    }
}

uint32_t hs_consumer_option_count(void) { return (uint32_t)N_OPTIONS; }

hs_status_t hs_consumer_option_info(uint32_t i, hs_option_info_t *out)
{
    if (i >= N_OPTIONS || !out) return HS_ERR_INVALID;
    const option_t *o = &options[i];
    pthread_once(&envs_once, envs_make);
    *out = (hs_option_info_t){.name = o->name,
                              .type = type_name(o->type),
                              .flag = o->flag,
                              .env = envs[i],
                              .metavar = o->metavar,
                              .default_text = o->dflt,
                              .unit = o->unit,
                              .choices = o->choices ? o->choices : "",
                              .help = o->help,
                              .min = o->min,
                              .max = o->max,
                              .min_open = o->min_open,
                              .shared_flag = o->shared_flag};
    return HS_OK;
}

/* ---- values, read and written through the option's place in cfg ---- */

static void *slot(hs_consumer_config_t *cfg, const option_t *o) { return (char *)cfg + o->at; }

static const void *slot_c(const hs_consumer_config_t *cfg, const option_t *o)
{
    return (const char *)cfg + o->at;
}

/* A number option's value in its unit (GiB for T_GIB); an enum's value. */
static double value_get(const hs_consumer_config_t *cfg, const option_t *o)
{
    const void *p = slot_c(cfg, o);
    uint32_t u;
    int i;
    uint64_t b;
    double d;
    switch (o->type) {
    case T_U32:
        memcpy(&u, p, sizeof(u));
        return u;
    case T_INT:
    case T_ENUM:
        memcpy(&i, p, sizeof(i));
        return i;
    case T_GIB:
        memcpy(&b, p, sizeof(b));
        return (double)b / (double)(1ull << 30);
    case T_DOUBLE:
        memcpy(&d, p, sizeof(d));
        return d;
    default:
        return 0;
    }
}

/* "from 1 to 64", "more than 0 and at most 1e+09" */
static void bounds_text(const option_t *o, char *buf, size_t cap)
{
    snprintf(buf, cap, "%s %.10g %s %.10g", o->min_open ? "more than" : "from", o->min,
             o->min_open ? "and at most" : "to", o->max);
}

/* "expected 'arrival' or 'plan'" */
static void choices_text(const char *choices, char *buf, size_t cap)
{
    size_t n = (size_t)snprintf(buf, cap, "expected '");
    for (const char *c = choices; *c && n + 8 < cap; c++) {
        if (*c != '|') {
            buf[n++] = *c;
            continue;
        }
        const char *sep = strchr(c + 1, '|') ? "', '" : "' or '";
        n += (size_t)snprintf(buf + n, cap - n, "%s", sep);
    }
    snprintf(buf + n, cap - n, "'");
}

/* What a number option expects: "expected a whole number from 1 to 64". */
static void expect_text(const option_t *o, char *buf, size_t cap)
{
    char b[96];
    bounds_text(o, b, sizeof(b));
    if (o->type == T_ENUM) {
        choices_text(o->choices, buf, cap);
    } else if (o->type == T_BOOL) {
        snprintf(buf, cap, "expected 1 or 0 (true/false, yes/no, on/off)");
    } else if (o->type == T_U32 || o->type == T_INT) {
        snprintf(buf, cap, "expected %sa whole number %s%s%s", o->min == -1 ? "none or " : "", b,
                 o->unit[0] ? " " : "", o->unit);
    } else {
        snprintf(buf, cap, "expected %s %s", o->unit[0] ? o->unit : "a number", b);
    }
}

static bool in_bounds(const option_t *o, double v)
{
    if (o->type == T_ENUM) {
        size_t n = 1;
        for (const char *c = o->choices; *c; c++)
            n += *c == '|';
        for (size_t i = 0; i < n; i++)
            if (o->values[i] == (int)v) return true;
        return false;
    }
    bool above = o->min_open ? v > o->min : v >= o->min;
    return above && v <= o->max; /* false for NaN */
}

/* The index of `value` among "a|b|c", or -1. */
static int choice_index(const char *choices, const char *value)
{
    size_t len = strlen(value);
    int i = 0;
    for (const char *c = choices; c; i++) {
        const char *end = strchr(c, '|');
        size_t n = end ? (size_t)(end - c) : strlen(c);
        if (n == len && !strncmp(c, value, n)) return i;
        c = end ? end + 1 : NULL;
    }
    return -1;
}

static bool parse_bool(const char *v, bool *out)
{
    static const char *yes[] = {"1", "true", "yes", "on"}, *no[] = {"0", "false", "no", "off"};
    for (size_t i = 0; i < 4; i++) {
        if (!strcasecmp(v, yes[i])) return (*out = true);
        if (!strcasecmp(v, no[i])) return !(*out = false);
    }
    return false;
}

/* Parses `value` by o's type into cfg; false when it does not parse or is
 * out of bounds (why written). */
static bool value_set(hs_consumer_config_t *cfg, const option_t *o, const char *value, char *why,
                      size_t cap)
{
    void *p = slot(cfg, o);
    uint64_t u;
    double d;
    bool ok;
    switch (o->type) {
    case T_BOOL:
        if (!parse_bool(value, &ok)) break;
        memcpy(p, &ok, sizeof(ok));
        return true;
    case T_STRING:
        if (o->choices && choice_index(o->choices, value) < 0) {
            choices_text(o->choices, why, cap);
            return false;
        }
        if (o->check && o->check(value, why, cap)) return false;
        memcpy(p, &value, sizeof(value));
        return true;
    case T_ENUM: {
        int i = choice_index(o->choices, value);
        if (i < 0) break;
        memcpy(p, &o->values[i], sizeof(int));
        return true;
    }
    case T_U32:
        if (hs_parse_u64(value, &u) != HS_OK || !in_bounds(o, (double)u)) break;
        uint32_t u32 = (uint32_t)u;
        memcpy(p, &u32, sizeof(u32));
        return true;
    case T_INT: {
        int i = -1;
        bool none = o->min == -1 && !strcmp(value, "none");
        if (!none && (hs_parse_u64(value, &u) != HS_OK || !in_bounds(o, (double)u))) break;
        if (!none) i = (int)u;
        memcpy(p, &i, sizeof(i));
        return true;
    }
    case T_DOUBLE:
        if (hs_parse_double(value, &d) != HS_OK || !in_bounds(o, d)) break;
        memcpy(p, &d, sizeof(d));
        return true;
    case T_GIB:
        if (hs_parse_double(value, &d) != HS_OK || !in_bounds(o, d)) break;
        u = (uint64_t)(d * (double)(1ull << 30));
        memcpy(p, &u, sizeof(u));
        return true;
    }
    expect_text(o, why, cap);
    return false;
}

hs_status_t hs_consumer_config_set(hs_consumer_config_t *cfg, const char *name, const char *value,
                                   char *why, size_t why_cap)
{
    char buf[256];
    if (!why || !why_cap) {
        why = buf;
        why_cap = sizeof(buf);
    }
    const option_t *o = name ? option_find(name) : NULL;
    if (!cfg) {
        snprintf(why, why_cap, "no configuration given (cfg is NULL)");
    } else if (!o) {
        snprintf(why, why_cap, "unknown option '%s': hs_consumer_option_info lists them",
                 name ? name : "(null)");
    } else if (!value) {
        snprintf(why, why_cap, "no value given");
    } else if (value_set(cfg, o, value, why, why_cap)) {
        return HS_OK;
    }
    if (why == buf)
        hs_error("consumer: option %s '%s': %s", name ? name : "(null)", value ? value : "", why);
    return HS_ERR_INVALID;
}

void hs_consumer_config_default(hs_consumer_config_t *cfg)
{
    memset(cfg, 0, sizeof(*cfg));
    for (size_t i = 0; i < N_OPTIONS; i++) {
        const option_t *o = &options[i];
        if (!o->dflt[0]) continue; /* zero: false, NULL, 0 */
        char why[256];
        bool ok = value_set(cfg, o, o->dflt, why, sizeof(why));
        assert(ok && "an option's default is within its bounds");
        (void)ok;
    }
    cfg->listen_host = "0.0.0.0";
    cfg->listen_port = 7000;
    cfg->status_interval_s = 5;
}

hs_status_t hs__consumer_options_check(const hs_consumer_config_t *cfg, char *why, size_t cap)
{
    for (size_t i = 0; i < N_OPTIONS; i++) {
        const option_t *o = &options[i];
        if (o->type == T_BOOL || o->type == T_STRING) continue;
        double v = value_get(cfg, o);
        if (o->type == T_INT && v == -1 && o->min == -1) continue;
        if (in_bounds(o, v)) continue;
        char e[160];
        expect_text(o, e, sizeof(e));
        snprintf(why, cap, "%s %.10g: %s%s%s%s", o->name, v, e, o->flag[0] ? " (--" : "", o->flag,
                 o->flag[0] ? ")" : "");
        return HS_ERR_INVALID;
    }
    return HS_OK;
}

/* hs__consumer_fault_set()'s spec: a test hook, not an option */
static const char *fault_spec;

void hs__consumer_fault_set(const char *spec) { fault_spec = spec; }

const char *hs__consumer_fault(void) { return fault_spec; }

static const option_t *option_typed(const char *name, opt_type_t type)
{
    const option_t *o = option_find(name);
    assert(o && o->type == type && "an option of this name and type");
    return o;
}

uint32_t hs__consumer_option_u32(const hs_consumer_config_t *cfg, const char *name)
{
    return (uint32_t)value_get(cfg, option_typed(name, T_U32));
}

double hs__consumer_option_double(const hs_consumer_config_t *cfg, const char *name)
{
    return value_get(cfg, option_typed(name, T_DOUBLE));
}
