/* SPDX-License-Identifier: Apache-2.0 */
/* options.c - the producer's option table: one entry per setting of
 * hs_producer_config_t that a caller chooses, with its type, default,
 * bounds, unit, command-line flag and help. The defaults of
 * hs_producer_config_default, the bounds hs_producer_config_check holds a
 * config to, the parser and --help of hs-producer and the producer's part
 * of docs/cli.md all come from it (through hs_producer_option_info); the
 * machinery of a table is common/hs_options.h. hs_producer_config_check
 * also holds the checks between options, each in one place. */
#include "hs_producer.h"

#include "hs_data.h" /* hs_overflow_t */
#include "hs_log.h"
#include "hs_model.h"
#include "hs_options.h"
#include "hs_outfile.h"
#include "hs_parse.h"
#include "preflight_int.h" /* hs__preflight_headroom_parse */

#include <stddef.h>
#include <stdio.h>
#include <string.h>

/* ---- the values of --to and --gpus ---- */

hs_status_t hs_producer_parse_to(const char *s, hs_producer_addrs_t *out)
{
    memset(out, 0, sizeof(*out));
    if (!s || !*s) {
        hs_error("--to: expected HOST:PORT[,HOST:PORT...] or HOST:LO-HI, got nothing");
        return HS_ERR_INVALID;
    }
    const char *p = s;
    while (*p) {
        const char *end = strchr(p, ',');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        char item[300];
        if (len == 0 || len >= sizeof(item)) {
            hs_error("--to '%s': an empty or overlong address in the list", s);
            return HS_ERR_INVALID;
        }
        memcpy(item, p, len);
        item[len] = 0;
        char *colon = strrchr(item, ':');
        char *dash = colon ? strchr(colon, '-') : NULL;
        uint64_t lo, hi;
        char host[256];
        uint16_t port;
        if (dash) {
            *dash = 0;
            if (hs_parse_hostport(item, host, sizeof(host), &port) != HS_OK ||
                hs_parse_u64(dash + 1, &hi) != HS_OK || hi > 65535 || hi < port) {
                hs_error(
                    "--to '%s': '%.*s' is not HOST:LO-HI with LO <= HI, e.g. drafter:7000-7007", s,
                    (int)len, p);
                return HS_ERR_INVALID;
            }
            lo = port;
        } else {
            if (hs_parse_hostport(item, host, sizeof(host), &port) != HS_OK) {
                hs_error("--to '%s': '%s' is not HOST:PORT, e.g. drafter:7000", s, item);
                return HS_ERR_INVALID;
            }
            lo = hi = port;
        }
        for (uint64_t q = lo; q <= hi; q++) {
            if (out->n == HS_PRODUCER_MAX_LINKS) {
                hs_error("--to '%s': more than %d consumers; one producer feeds at most that many",
                         s, HS_PRODUCER_MAX_LINKS);
                return HS_ERR_INVALID;
            }
            for (uint32_t i = 0; i < out->n; i++)
                if (out->port[i] == q && !strcmp(out->host[i], host)) {
                    hs_error("--to '%s': %s:%llu is given twice", s, host, (unsigned long long)q);
                    return HS_ERR_INVALID;
                }
            snprintf(out->host[out->n], sizeof(out->host[0]), "%s", host);
            out->port[out->n] = (uint16_t)q;
            out->n++;
        }
        p += len;
        if (*p == ',') p++;
    }
    return HS_OK;
}

hs_status_t hs_producer_parse_devices(const char *s, hs_producer_config_t *cfg)
{
    uint64_t n;
    if (!strncmp(s, "cpu:", 4)) {
        if (hs_parse_u64(s + 4, &n) != HS_OK || n == 0 || n > HS_PRODUCER_MAX_WORKERS)
            return HS_ERR_INVALID;
        cfg->n_workers = (uint32_t)n;
        for (uint32_t i = 0; i < n; i++)
            cfg->gpu_ids[i] = -1;
        return HS_OK;
    }
    int ids[HS_PRODUCER_MAX_WORKERS], cnt;
    if (hs_parse_int_list(s, ids, HS_PRODUCER_MAX_WORKERS, &cnt) != HS_OK) return HS_ERR_INVALID;
    for (int i = 0; i < cnt; i++) {
        if (ids[i] < 0) return HS_ERR_INVALID;
        for (int j = 0; j < i; j++)
            if (ids[j] == ids[i]) return HS_ERR_INVALID;
    }
    cfg->n_workers = (uint32_t)cnt;
    memcpy(cfg->gpu_ids, ids, sizeof(int) * (size_t)cnt);
    return HS_OK;
}

/* ---- the table ---- */

static const char *check_to(const char *v, char *why, size_t cap)
{
    hs_producer_addrs_t addrs;
    if (hs_producer_parse_to(v, &addrs) == HS_OK) return NULL;
    snprintf(why, cap,
             "expected HOST:PORT, a list HOST:PORT,HOST:PORT (one per rank) or a range "
             "HOST:7000-7007");
    return why;
}

static const char *parse_layers(void *cfg, const char *v, char *why, size_t cap)
{
    hs_layout_t *layout = &((hs_producer_config_t *)cfg)->layout;
    int layers[HS_MAX_LAYERS], n;
    bool ok = hs_parse_int_list(v, layers, HS_MAX_LAYERS, &n) == HS_OK;
    for (int i = 0; ok && i < n; i++)
        ok = layers[i] >= 0 && (i == 0 || layers[i] > layers[i - 1]);
    if (!ok) {
        snprintf(why, cap,
                 "expected up to %d comma-separated indices >= 0, strictly increasing, such as "
                 "2,16,29",
                 HS_MAX_LAYERS);
        return why;
    }
    for (int i = 0; i < n; i++)
        layout->layers[i] = layers[i];
    layout->n_layers = (uint32_t)n;
    return NULL;
}

static const char *parse_gpus(void *cfg, const char *v, char *why, size_t cap)
{
    if (hs_producer_parse_devices(v, cfg) == HS_OK) return NULL;
    snprintf(why, cap, "expected cpu:N (N CPU workers) or distinct GPU ids such as 0,1,2");
    return why;
}

static const char *parse_headroom(void *cfg, const char *v, char *why, size_t cap)
{
    if (hs__preflight_headroom_parse(v, &((hs_producer_config_t *)cfg)->preflight_headroom) ==
        HS_OK)
        return NULL;
    snprintf(why, cap, "expected a fraction in [0, 1) such as 0.1, or a percentage such as 10%%");
    return why;
}

/* Status lines at most this many seconds apart (both tables). */
#define STATUS_INTERVAL_MAX 1e6

/* "0 = off" on the command line; negative in the config (0 there is 5). */
static const char *parse_status_interval(void *cfg, const char *v, char *why, size_t cap)
{
    double d;
    if (hs_parse_double(v, &d) != HS_OK || !(d >= 0) || d > STATUS_INTERVAL_MAX) {
        snprintf(why, cap, "expected seconds >= 0 (0 = off)");
        return why;
    }
    ((hs_producer_config_t *)cfg)->status_interval_s = d > 0 ? d : -1;
    return NULL;
}

/* The client config's own: 0 = the default 5, negative = off, as given. */
static const char *parse_client_status_interval(void *cfg, const char *v, char *why, size_t cap)
{
    double d;
    if (hs_parse_double(v, &d) != HS_OK || !(d <= STATUS_INTERVAL_MAX)) {
        snprintf(why, cap, "expected seconds up to %g (0 = the default 5, negative = off)",
                 STATUS_INTERVAL_MAX);
        return why;
    }
    ((hs_producer_client_config_t *)cfg)->status_interval_s = d;
    return NULL;
}

/* ---- the rows both tables hold ----
 *
 * A setting of hs-producer (hs_producer_config_t) that the library's
 * producer (hs_producer_client_config_t) has too: its name, type, default,
 * bounds, flag and help once, here; each table gives the place of its field
 * (at_) and what only it has (a word, a parser, an enum's values). */

/* clang-format off */
#define ROW_TO(at_, ...)                                                                           \
    HS_OPT("to", HS_OPT_STRING, at_, "", 0, 0, "", "to", "HOST:PORT",                              \
     "the consumer (hs-consumer --listen); for data-parallel ranks every rank's address, "         \
     "HOST:PORT,HOST:PORT,... or a range HOST:7000-7007: tickets are taken from all of them, a "   \
     "slower rank simply holds fewer; a set whose ranks or world sizes do not fit together is "    \
     "refused", .check = check_to, __VA_ARGS__)
#define ROW_DATA(at_, ...)                                                                         \
    HS_OPT("data", HS_OPT_STRING, at_, "", 0, 0, "", "data", "FILE",                               \
     "dataset: JSONL lines {\"input_ids\": [...], \"loss_mask\": [...]} or a .hst file from "     \
     "hs-data import", __VA_ARGS__)
#define ROW_TOKEN_BUDGET(at_, ...)                                                                 \
    HS_OPT("token_budget", HS_OPT_SIZE, at_, "65536", 1, 1 << 30, "tokens", "token-budget",        \
     "N|auto", "tokens per batch; auto: the largest that fits every GPU with headroom (runs the "  \
     "preflight first)", __VA_ARGS__)
#define ROW_MAX_SEQ_LEN(at_, ...)                                                                  \
    HS_OPT("max_seq_len", HS_OPT_SIZE, at_, "", 1, 1 << 30, "tokens", "max-seq-len", "M",          \
     "longer sequences are truncated or dropped (unset: the budget)", __VA_ARGS__)
#define ROW_OVERFLOW(type_, at_, ...)                                                              \
    HS_OPT("overflow", type_, at_, "truncate", 0, 0, "", "overflow", "truncate|drop",              \
     "what to do with sequences longer than --max-seq-len", .choices = "truncate|drop",           \
     __VA_ARGS__)
#define ROW_SEED(at_, ...)                                                                         \
    HS_OPT("seed", HS_OPT_U64, at_, "0", 0, 18446744073709551615.0, "", "seed", "S",               \
     "epoch shuffle seed", __VA_ARGS__)
#define ROW_HIDDEN_SIZE(at_, ...)                                                                  \
    HS_OPT("hidden_size", HS_OPT_U32, at_, "", 1, 65536, "", "hidden-size", "H",                   \
     "hidden size (taken from the model with --source model)", __VA_ARGS__)
#define ROW_HS_DTYPE(at_, bf16_, fp8_)                                                             \
    HS_OPT("hs_dtype", HS_OPT_ENUM, at_, "bf16", 0, 0, "", "hs-dtype", "bf16|fp8",                 \
     "how hidden states travel and wait in the cache: bf16, or fp8 (e4m3 and one fp32 scale per "  \
     "token over its captured layers, amax / 448: half the bytes); the consumer must agree",      \
     .choices = "bf16|fp8", .values = {bf16_, fp8_})
#define ROW_PREFETCH(at_, ...)                                                                     \
    HS_OPT("prefetch", HS_OPT_U32, at_, "2", 1, 64, "", "prefetch", "N",                           \
     "tickets each worker keeps queued", __VA_ARGS__)
#define ROW_TRANSPORT(at_, ...)                                                                    \
    HS_OPT("transport", HS_OPT_STRING, at_, "auto", 0, 0, "", "transport", "KIND",                 \
     "auto, shm, tcp or ucx (auto: shared memory with a consumer on this host, ucx where an RDMA " \
     "device is present, else tcp); shm fails unless the consumer is on this host",               \
     .choices = "auto|shm|tcp|ucx", .shared_flag = true, __VA_ARGS__)
#define ROW_SECRET_FILE(at_, ...)                                                                  \
    HS_OPT("secret_file", HS_OPT_STRING, at_, "", 0, 0, "", "secret-file", "FILE",                 \
     "shared secret for the HMAC handshake", .shared_flag = true, __VA_ARGS__)
#define ROW_CONNECT_TIMEOUT(at_, ...)                                                              \
    HS_OPT("connect_timeout_s", HS_OPT_U32, at_, "30", 0, 86400, "s", "connect-timeout", "S",      \
     "seconds to keep trying to reach the consumer", __VA_ARGS__)
#define ROW_RECONNECT(at_, ...)                                                                    \
    HS_OPT("reconnect", HS_OPT_BOOL, at_, "", 0, 0, "", "reconnect", "",                           \
     "when the consumer goes away mid-run, connect again (for up to --connect-timeout) and carry " \
     "on with a restarted consumer; also rejoin when the consumer took our tickets back "         \
     "(--lease-timeout)", __VA_ARGS__)
#define ROW_STATUS_INTERVAL(at_, ...)                                                              \
    HS_OPT("status_interval_s", HS_OPT_DOUBLE, at_, "5", 0, STATUS_INTERVAL_MAX, "s",              \
     "status-interval", "S", "seconds between status lines, and between progress lines while a "   \
     "large plan is built (0 = off)", .word = "", .word_value = -1, __VA_ARGS__)
#define ROW_NAME(at_, ...)                                                                         \
    HS_OPT("name", HS_OPT_STRING, at_, "", 0, 0, "", "name", "NAME",                               \
     "identity in the consumer's logs (unset: host:pid)", __VA_ARGS__)
/* clang-format on */

/* ---- hs-producer's table ---- */

#define FIELD(f) offsetof(hs_producer_config_t, f)

/* clang-format off */
static const hs_opt_t options[] = {
    /* name, type, where, default, min, max, unit, flag, metavar, help */
    ROW_TO(FIELD(to_list)),
    ROW_DATA(FIELD(data_path)),
    ROW_TOKEN_BUDGET(FIELD(token_budget), .word = "auto", .word_value = 0),
    ROW_MAX_SEQ_LEN(FIELD(max_seq_len), .word = ""),
    ROW_OVERFLOW(HS_OPT_ENUM, FIELD(overflow), .values = {HS_OVERFLOW_TRUNCATE, HS_OVERFLOW_DROP}),
    ROW_SEED(FIELD(seed)),
    HS_OPT("layers", HS_OPT_STRING, 0, "", 0, 0, "", "layers", "L1,L2,...",
     "captured layers as Hugging Face output_hidden_states indices (0 = embeddings, i = output "
     "of decoder layer i-1)", .parse = parse_layers),
    HS_OPT("dflash_layers", HS_OPT_INT, FIELD(dflash_layers), "", 1, HS_MAX_LAYERS, "",
     "dflash-layers", "N", "DFlash's default layer set for an N-layer drafter (needs --model)",
     .word = ""),
    HS_OPT("eagle3_layers", HS_OPT_BOOL, FIELD(eagle3_layers), "", 0, 0, "", "eagle3-layers", "",
     "EAGLE-3's default set 2,N/2,N-3,N for an N-layer model (needs --model; checked against the "
     "depth before any weight is read)"),
    ROW_HIDDEN_SIZE(FIELD(layout.hidden_size), .word = ""),
    ROW_HS_DTYPE(FIELD(layout.dtype), HS_DTYPE_BF16, HS_DTYPE_FP8),
    HS_OPT("source", HS_OPT_ENUM, FIELD(source), "synthetic", 0, 0, "", "source",
     "synthetic|model", "synthetic: deterministic bytes the consumer can verify "
     "(--verify-synthetic); model: the built-in target forward",
     .choices = "synthetic|model", .values = {HS_SOURCE_SYNTHETIC, HS_SOURCE_MODEL}),
    HS_OPT("model", HS_OPT_STRING, FIELD(model_dir), "", 0, 0, "", "model", "DIR",
     "Hugging Face model folder (config.json + *.safetensors): Llama, Qwen2/3, Mistral, or "
     "Qwen3.5/3.6 (text decoder, VL checkpoints too; FP8 checkpoints with 128x128 block scales as "
     "well)"),
    HS_OPT("dtype", HS_OPT_ENUM, FIELD(weights), "auto", 0, 0, "", "dtype", "auto|bf16|fp8",
     "the model's Linear weights: auto (as stored; an FP8 checkpoint runs its GEMMs in fp8), bf16 "
     "(dequantise FP8 at load) or fp8 (quantise a bf16 checkpoint at load in 128x128 blocks; fp8 "
     "GEMMs need an H100/H200)", .choices = "auto|bf16|fp8",
     .values = {HS_MODEL_WEIGHTS_AUTO, HS_MODEL_WEIGHTS_BF16, HS_MODEL_WEIGHTS_FP8}),
    HS_OPT("gpus", HS_OPT_STRING, 0, "cpu:1", 0, 0, "", "gpus", "cpu:N|LIST",
     "N CPU workers, or one worker per GPU id", .parse = parse_gpus),
    ROW_PREFETCH(FIELD(prefetch)),
    ROW_TRANSPORT(FIELD(transport)),
    ROW_SECRET_FILE(FIELD(secret_file)),
    HS_OPT("require_rdma", HS_OPT_BOOL, FIELD(require_rdma), "", 0, 0, "", "require-rdma", "",
     "fail instead of running without an RDMA lane (no silent TCP)", .shared_flag = true),
    ROW_CONNECT_TIMEOUT(FIELD(connect_timeout_s)),
    ROW_RECONNECT(FIELD(reconnect)),
    ROW_STATUS_INTERVAL(FIELD(status_interval_s), .parse = parse_status_interval),
    HS_OPT("summary_json", HS_OPT_STRING, FIELD(summary_json), "", 0, 0, "", "summary-json", "FILE",
     "write this producer's summary as JSON"),
    ROW_NAME(FIELD(name)),
    HS_OPT("preflight_headroom", HS_OPT_DOUBLE, FIELD(preflight_headroom), "0.1", 0, 1, "",
     "preflight-headroom", "F",
     "share of each GPU's memory the preflight keeps free: 0.1 or 10%",
     .parse = parse_headroom),
    HS_OPT("preflight_peak_tflops", HS_OPT_DOUBLE, FIELD(preflight_peak_tflops), "989.4", 1, 1e6,
     "TFLOP/s", "preflight-peak-tflops", "T",
     "the dense bf16 peak the preflight's MFU is measured against (989.4: an H100/H200 SXM)",
     .word = ""),
    HS_OPT("preflight_iters", HS_OPT_U32, FIELD(preflight_iters), "3", 1, 100, "",
     "preflight-iters", "N", "timed runs of each shape in the preflight", .word = ""),
};
/* clang-format on */

#define N_OPTIONS (sizeof(options) / sizeof(options[0]))

static char envs[N_OPTIONS][HS_OPT_ENV_CAP];
static hs_opt_table_t table = {"producer", options, N_OPTIONS, envs, false};

uint32_t hs_producer_option_count(void) { return (uint32_t)N_OPTIONS; }

hs_status_t hs_producer_option_info(uint32_t i, hs_option_info_t *out)
{
    return hs_opt_table_info(&table, i, out);
}

hs_status_t hs_producer_config_set(hs_producer_config_t *cfg, const char *name, const char *value,
                                   char *why, size_t why_cap)
{
    return hs_opt_table_set(&table, cfg, name, value, why, why_cap);
}

void hs_producer_config_default(hs_producer_config_t *cfg)
{
    hs_opt_table_defaults(&table, cfg, sizeof(*cfg));
    cfg->to_port = 7000;
}

/* ---- the library producer's table (hs_producer_client_config_t) ----
 *
 * The shared rows at the client struct's fields, where 0 keeps meaning "the
 * default" as the struct says; its own rows after them. `layers` is not a
 * row: the struct points at the caller's int32 array, which text cannot
 * fill. */

#define CLIENT(f) offsetof(hs_producer_client_config_t, f)

/* clang-format off */
static const hs_opt_t client_options[] = {
    ROW_TO(CLIENT(to)),
    ROW_DATA(CLIENT(data_path)),
    ROW_TOKEN_BUDGET(CLIENT(token_budget)),
    ROW_MAX_SEQ_LEN(CLIENT(max_seq_len), .word = "0", .word_value = 0),
    ROW_OVERFLOW(HS_OPT_BOOL, CLIENT(overflow_drop)),
    ROW_SEED(CLIENT(seed)),
    ROW_HIDDEN_SIZE(CLIENT(hidden_size)),
    ROW_PREFETCH(CLIENT(prefetch)),
    ROW_SECRET_FILE(CLIENT(secret_file)),
    ROW_TRANSPORT(CLIENT(transport)),
    ROW_NAME(CLIENT(name)),
    ROW_CONNECT_TIMEOUT(CLIENT(connect_timeout_s)),
    ROW_RECONNECT(CLIENT(reconnect)),
    ROW_HS_DTYPE(CLIENT(hs_dtype), HS_HIDDEN_BF16, HS_HIDDEN_FP8),
    ROW_STATUS_INTERVAL(CLIENT(status_interval_s), .parse = parse_client_status_interval),
    HS_OPT("staging_buffers", HS_OPT_U32, CLIENT(staging_buffers), "3", 2,
     HS_PRODUCER_STAGING_MAX, "", "", "N",
     "batch-sized host buffers; at most that many batches are taken or on the wire at once "
     "(0 = 3)", .word = "0", .word_value = 0),
    HS_OPT("target_name", HS_OPT_STRING, CLIENT(target_name), "", 0, 0, "", "", "NAME",
     "the target's name in logs and stores (unset: unnamed)"),
};
/* clang-format on */

#define N_CLIENT_OPTIONS (sizeof(client_options) / sizeof(client_options[0]))

static char client_envs[N_CLIENT_OPTIONS][HS_OPT_ENV_CAP];
static hs_opt_table_t client_table = {"producer", client_options, N_CLIENT_OPTIONS, client_envs,
                                      false};

void hs_producer_client_config_default(hs_producer_client_config_t *cfg)
{
    hs_opt_table_defaults(&client_table, cfg, sizeof(*cfg));
}

hs_status_t hs_producer_client_config_set(hs_producer_client_config_t *cfg, const char *name,
                                          const char *value, char *why, size_t why_cap)
{
    char buf[256];
    for (size_t i = 0; name && i < N_CLIENT_OPTIONS; i++)
        if (!strcmp(client_options[i].name, name))
            return hs_opt_table_set(&client_table, cfg, name, value, why, why_cap);
    /* unknown: no option_info lists this table's names, so the message does */
    char *w = why && why_cap ? why : buf;
    size_t cap = why && why_cap ? why_cap : sizeof(buf);
    size_t n =
        (size_t)snprintf(w, cap, "unknown option '%s': expected one of", name ? name : "(null)");
    for (size_t i = 0; i < N_CLIENT_OPTIONS && n < cap; i++)
        n += (size_t)snprintf(w + n, cap - n, "%s %s", i ? "," : "", client_options[i].name);
    if (w == buf) hs_error("producer: %s", buf);
    return HS_ERR_INVALID;
}

/* why[cap] = the message; HS_ERR_INVALID */
#define REFUSE(...) (snprintf(why, cap, __VA_ARGS__), HS_ERR_INVALID)

hs_status_t hs_producer_config_check(const hs_producer_config_t *c, bool preflight, char *why,
                                     size_t cap)
{
    if (hs_opt_table_check(&table, c, why, cap) != HS_OK) return HS_ERR_INVALID;
    bool measure = preflight || c->token_budget == 0;
    if (!preflight && !c->to && !c->to_list && !c->to_host)
        return REFUSE("--to HOST:PORT is required");
    if (measure && c->source != HS_SOURCE_MODEL)
        return REFUSE("--preflight and --token-budget auto measure the built-in model: add "
                      "--source model --model DIR");
    if (measure && c->gpu_ids[0] < 0)
        return REFUSE("--preflight and --token-budget auto run on GPUs: give --gpus 0,1,...");
    if (!c->data_path) return REFUSE("--data FILE is required");
    if (c->token_budget && c->max_seq_len > c->token_budget)
        return REFUSE("--max-seq-len %u is larger than --token-budget %u: a sequence must fit in "
                      "one batch",
                      c->max_seq_len, c->token_budget);
    if (c->source == HS_SOURCE_MODEL && !c->model_dir)
        return REFUSE("--source model needs --model DIR");
    if (c->source == HS_SOURCE_SYNTHETIC && c->model_dir)
        return REFUSE("--model is only used with --source model");
    if (!!c->layout.n_layers + !!c->dflash_layers + !!c->eagle3_layers > 1)
        return REFUSE("give one of --layers, --dflash-layers and --eagle3-layers, not several");
    if (c->eagle3_layers && c->source != HS_SOURCE_MODEL)
        return REFUSE("--eagle3-layers needs --source model (the layer count comes from the "
                      "model)");
    if (!c->layout.n_layers && !c->dflash_layers && !c->eagle3_layers)
        return REFUSE("--layers L1,L2,... is required (e.g. 2,16,29)");
    if (c->dflash_layers && c->source != HS_SOURCE_MODEL)
        return REFUSE("--dflash-layers needs --source model (the layer count comes from the "
                      "model)");
    if (c->source == HS_SOURCE_SYNTHETIC && !c->layout.hidden_size)
        return REFUSE("--source synthetic needs --hidden-size H");
    const char *inputs[] = {c->data_path, c->secret_file, c->model_dir};
    if (c->summary_json && hs_outfile_check(c->summary_json, inputs, 3) != HS_OK)
        return REFUSE("--summary-json %s: give another file", c->summary_json);
    return HS_OK;
}
