/* SPDX-License-Identifier: Apache-2.0 */
/* hs_producer_main.c - the hs-producer command: computes the hidden states a
 * consumer asks for (one worker per device) and streams them to it. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hs_producer.h"
#include "hs_cli_net.h"
#include "hs_devices.h"
#include "hs_model.h"
#include "hs_data.h"
#include "preflight_int.h" /* --preflight-headroom */
#include "hs_status.h"
#include "hs_log.h"
#include "hs_outfile.h"
#include "hs_parse.h"
#include "hs_version.h"

static const char usage[] =
    "usage: hs-producer --to HOST:PORT --data FILE --token-budget N --layers L1,L2,...\n"
    "                   [--hidden-size H] [--source synthetic|model] [--gpus cpu:N|0,1,2] "
    "[options]\n"
    "\n"
    "Computes packed hidden states of the batches a consumer tickets and streams them to\n"
    "it. Every producer of a run must use the same --data, --token-budget, --max-seq-len,\n"
    "--seed, --hidden-size and --layers: the consumer checks the plan hash and layout.\n"
    "\n"
    "options (each also settable as HS_<NAME>, e.g. HS_TOKEN_BUDGET=65536):\n"
    "  --to HOST:PORT         the consumer (hs-consumer --listen); for data-parallel ranks\n"
    "                         every rank's address, HOST:PORT,HOST:PORT,... or a range\n"
    "                         HOST:7000-7007: tickets are taken from all of them, a slower\n"
    "                         rank simply holds fewer; a set whose ranks or world sizes do not\n"
    "                         fit together is refused\n"
    "  --data FILE            dataset: JSONL lines {\"input_ids\": [...], \"loss_mask\": [...]}\n"
    "                         or a .hst file from hs-data import\n"
    "  --token-budget N|auto  tokens per batch (default 65536); auto: the largest that fits\n"
    "                         every GPU with headroom (runs the preflight first)\n"
    "  --preflight            run each batch shape the budget allows once per GPU, print\n"
    "                         peak memory, us/token, tokens/s and MFU, and exit (non-zero\n"
    "                         when the budget does not fit)\n"
    "  --max-seq-len M        longer sequences are truncated or dropped (default: the budget)\n"
    "  --overflow truncate|drop  what to do with sequences longer than --max-seq-len\n"
    "  --seed S               epoch shuffle seed (default 0)\n"
    "  --layers L1,L2,...     captured layers as Hugging Face output_hidden_states indices\n"
    "                         (0 = embeddings, i = output of decoder layer i-1)\n"
    "  --dflash-layers N      DFlash's default layer set for an N-layer drafter (needs --model)\n"
    "  --eagle3-layers        EAGLE-3's default set 2,N/2,N-3,N for an N-layer model (needs\n"
    "                         --model; checked against the depth before any weight is read)\n"
    "  --hidden-size H        hidden size (taken from the model with --source model)\n"
    "  --hs-dtype bf16|fp8    how hidden states travel and wait in the cache: bf16 (default),\n"
    "                         or fp8 (e4m3 and one fp32 scale per token over its captured\n"
    "                         layers, amax / 448: half the bytes); the consumer must agree\n"
    "  --source synthetic|model  synthetic: deterministic bytes the consumer can verify\n"
    "                         (--verify-synthetic); model: the built-in target forward\n"
    "  --model DIR            Hugging Face model folder (config.json + *.safetensors): Llama,\n"
    "                         Qwen2/3, Mistral, or Qwen3.5/3.6 (text decoder, VL checkpoints\n"
    "                         too; FP8 checkpoints with 128x128 block scales as well)\n"
    "  --dtype auto|bf16|fp8  the model's Linear weights: auto (as stored, default; an FP8\n"
    "                         checkpoint runs its GEMMs in fp8), bf16 (dequantise FP8 at\n"
    "                         load) or fp8 (quantise a bf16 checkpoint at load in 128x128\n"
    "                         blocks; fp8 GEMMs need an H100/H200)\n"
    "  --gpus cpu:N|LIST      N CPU workers, or one worker per GPU id (default cpu:1)\n"
    "  --prefetch N           tickets each worker keeps queued (default 2)\n"
    "  --secret-file FILE     shared secret for the HMAC handshake\n"
    "  --transport KIND       auto, shm, tcp or ucx (default auto: shared memory with a\n"
    "                         consumer on this host, ucx where an RDMA device is present,\n"
    "                         else tcp); shm fails unless the consumer is on this host\n"
    "  --nic auto|NAME[:PORT][,...]  RDMA devices UCX may use (UCX_NET_DEVICES): auto = the\n"
    "                         port nearest the first GPU of --gpus, else the first active one;\n"
    "                         without any RDMA device, auto leaves the choice to UCX\n"
    "                         (default: UCX's choice)\n"
    "  --require-rdma         fail instead of running without an RDMA lane (no silent TCP)\n"
    "  --list-devices         print RDMA devices, ports, link state and speed, and the NIC\n"
    "                         nearest each GPU, then exit\n"
    "  --connect-timeout S    seconds to keep trying to reach the consumer (default 30)\n"
    "  --reconnect            when the consumer goes away mid-run, connect again (for up to\n"
    "                         --connect-timeout) and carry on with a restarted consumer; also\n"
    "                         rejoin when the consumer took our tickets back (--lease-timeout)\n"
    "  --status-interval S    seconds between status lines, and between progress lines while\n"
    "                         a large plan is built (default 5; 0 = off)\n"
    "  --tcp-sockbuf SIZE     TCP socket buffers, e.g. 16M, at most 1G; 0 = the kernel's\n"
    "                         autotuning (default: 16M where net.core.rmem_max and wmem_max\n"
    "                         allow it, else autotuning)\n"
    "  --ucx-memh 1|0         0 = send payloads without their registered UCX memory handle\n"
    "                         (for comparisons only; default 1)\n"
    "  --preflight-headroom F share of each GPU's memory the preflight keeps free: 0.1 or\n"
    "                         10% (default 10%)\n"
    "  --preflight-peak-tflops T  the dense bf16 peak the preflight's MFU is measured\n"
    "                         against (default 989.4, an H100/H200 SXM)\n"
    "  --preflight-iters N    timed runs of each shape in the preflight (default 3)\n"
    "  --fault SPEC           tests only: inject faults into what arrives here,\n"
    "                         corrupt=N,cut=N,delay_ms=MS\n"
    "  --summary-json FILE    write this producer's summary as JSON\n"
    "  --name NAME            identity in the consumer's logs (default host:pid)\n"
    "  -h, --help             this text\n"
    "  --version              the release, git checkout and build options\n"
    "\n"
    "SIGTERM or SIGINT (Ctrl-C) stops cleanly: the batches being computed are finished and\n"
    "sent, the queued tickets go back to the consumer for the other producers, BYE, exit 0.\n"
    "A second signal exits at once. A producer whose .hst file is truncated or rewritten in\n"
    "place while it runs stops with an error naming the file (exit 2).\n"
    "\n"
    "exit status (the same for hsflow-produce):\n"
    "  0  the run is over, or stopped cleanly by a signal\n"
    "  1  the run failed: no consumer within --connect-timeout, the consumer lost, a worker\n"
    "     failed\n"
    "  2  bad flags, model or data, or refused by the consumer (plan, layout, dataset,\n"
    "     version, secret): the same command fails again until they are fixed\n"
    "  3  out of memory: the budget does not fit (lower --token-budget)\n"
    "  128+N  a second signal N\n"
    "\n"
    "examples:\n"
    "  hs-producer --to drafter:7000 --data train.hst --token-budget 65536 \\\n"
    "      --source model --model /models/Llama-3.1-8B --layers 2,16,29 --gpus 0,1,2\n"
    "  hs-producer --to 127.0.0.1:7000 --data data.jsonl --token-budget 8192 \\\n"
    "      --hidden-size 1024 --layers 2,16,29 --source synthetic --gpus cpu:3\n"
    "  hs-producer --list-devices\n"
    "  hs-producer --to drafter:7000 --gpus 0,1,2 --nic auto --require-rdma ...\n"
    "  hs-producer --to drafter1:7000-7003,drafter2:7000-7003 --gpus 0,1,2,3 ...  # 8 ranks\n";

enum {
    OPT_TO = 1000,
    OPT_DATA,
    OPT_BUDGET,
    OPT_MAXLEN,
    OPT_OVERFLOW,
    OPT_SEED,
    OPT_LAYERS,
    OPT_DFLASH,
    OPT_EAGLE3,
    OPT_HIDDEN,
    OPT_HS_DTYPE,
    OPT_SOURCE,
    OPT_MODEL,
    OPT_DTYPE,
    OPT_GPUS,
    OPT_PREFETCH,
    OPT_CONNECT_TIMEOUT,
    OPT_SUMMARY,
    OPT_NAME,
    OPT_PREFLIGHT,
    OPT_RECONNECT,
    OPT_STATUS_INTERVAL,
    OPT_PREFLIGHT_HEADROOM,
    OPT_PREFLIGHT_PEAK,
    OPT_PREFLIGHT_ITERS,
};

static const struct option long_options[] = {
    {"to", required_argument, NULL, OPT_TO},
    {"data", required_argument, NULL, OPT_DATA},
    {"hs-dtype", required_argument, NULL, OPT_HS_DTYPE},
    {"token-budget", required_argument, NULL, OPT_BUDGET},
    {"max-seq-len", required_argument, NULL, OPT_MAXLEN},
    {"overflow", required_argument, NULL, OPT_OVERFLOW},
    {"seed", required_argument, NULL, OPT_SEED},
    {"layers", required_argument, NULL, OPT_LAYERS},
    {"dflash-layers", required_argument, NULL, OPT_DFLASH},
    {"eagle3-layers", no_argument, NULL, OPT_EAGLE3},
    {"hidden-size", required_argument, NULL, OPT_HIDDEN},
    {"source", required_argument, NULL, OPT_SOURCE},
    {"model", required_argument, NULL, OPT_MODEL},
    {"dtype", required_argument, NULL, OPT_DTYPE},
    {"gpus", required_argument, NULL, OPT_GPUS},
    {"prefetch", required_argument, NULL, OPT_PREFETCH},
    {"connect-timeout", required_argument, NULL, OPT_CONNECT_TIMEOUT},
    {"summary-json", required_argument, NULL, OPT_SUMMARY},
    {"name", required_argument, NULL, OPT_NAME},
    {"preflight", no_argument, NULL, OPT_PREFLIGHT},
    {"reconnect", no_argument, NULL, OPT_RECONNECT},
    {"status-interval", required_argument, NULL, OPT_STATUS_INTERVAL},
    {"preflight-headroom", required_argument, NULL, OPT_PREFLIGHT_HEADROOM},
    {"preflight-peak-tflops", required_argument, NULL, OPT_PREFLIGHT_PEAK},
    {"preflight-iters", required_argument, NULL, OPT_PREFLIGHT_ITERS},
    HS_CLI_NET_OPTIONS,
    {"help", no_argument, NULL, 'h'},
    {NULL, 0, NULL, 0},
};

typedef struct {
    hs_producer_config_t cfg;
    char host[256];
    hs_producer_addrs_t to; /* --to */
    bool have_to, have_layers, have_budget, preflight, budget_auto;
    int dflash_layers;
    bool eagle3_layers;
    const char *layers_arg;
    hs_cli_net_t net; /* --transport, --nic, --secret-file, ... */
} options_t;

static int bad(const char *flag, const char *arg, const char *from, const char *expect)
{
    return hs_cli_bad("hs-producer", flag, arg, from, expect);
}

static int apply(void *ctx, int opt, const char *arg, const char *from)
{
    options_t *o = ctx;
    hs_producer_config_t *c = &o->cfg;
    uint64_t u;
    double d;
    int net = hs_cli_net_apply(&o->net, "hs-producer", opt, arg, from);
    if (net >= 0) return net;
    switch (opt) {
    case 'h':
        fputs(usage, stdout);
        return 3;
    case OPT_TO:
        if (hs_producer_parse_to(arg, &o->to) != HS_OK)
            return bad("to", arg, from,
                       "expected HOST:PORT, a list HOST:PORT,HOST:PORT (one per rank) or a range "
                       "HOST:7000-7007");
        c->to = &o->to;
        c->to_host = o->to.host[0];
        c->to_port = o->to.port[0];
        o->have_to = true;
        return 0;
    case OPT_DATA:
        c->data_path = arg;
        return 0;
    case OPT_BUDGET:
        if (!strcmp(arg, "auto")) {
            o->budget_auto = true;
            c->token_budget = 0;
            return 0;
        }
        o->budget_auto = false;
        if (hs_parse_size(arg, &u) != HS_OK || u == 0 || u > (1u << 30))
            return bad("token-budget", arg, from, "expected tokens per batch, e.g. 65536 or 64K");
        c->token_budget = (uint32_t)u;
        o->have_budget = true;
        return 0;
    case OPT_MAXLEN:
        if (hs_parse_size(arg, &u) != HS_OK || u == 0 || u > (1u << 30))
            return bad("max-seq-len", arg, from, "expected a length in tokens");
        c->max_seq_len = (uint32_t)u;
        return 0;
    case OPT_OVERFLOW: {
        hs_overflow_t ov;
        if (hs_overflow_parse(arg, &ov) != HS_OK)
            return bad("overflow", arg, from, "expected truncate or drop");
        c->overflow = (int)ov;
        return 0;
    }
    case OPT_SEED:
        if (hs_parse_u64(arg, &u) != HS_OK) return bad("seed", arg, from, "expected an integer");
        c->seed = u;
        return 0;
    case OPT_LAYERS:
        o->layers_arg = arg;
        return 0;
    case OPT_DFLASH:
        if (hs_parse_u64(arg, &u) != HS_OK || u == 0 || u > HS_MAX_LAYERS)
            return bad("dflash-layers", arg, from, "expected 1..32 draft layers");
        o->dflash_layers = (int)u;
        return 0;
    case OPT_HIDDEN:
        if (hs_parse_u64(arg, &u) != HS_OK || u == 0 || u > 65536)
            return bad("hidden-size", arg, from, "expected 1..65536");
        c->layout.hidden_size = (uint32_t)u;
        return 0;
    case OPT_HS_DTYPE:
        if (hs_dtype_parse(arg, &c->layout.dtype) != HS_OK)
            return bad("hs-dtype", arg, from, "expected bf16 or fp8");
        return 0;
    case OPT_SOURCE:
        if (!strcmp(arg, "synthetic"))
            c->source = HS_SOURCE_SYNTHETIC;
        else if (!strcmp(arg, "model"))
            c->source = HS_SOURCE_MODEL;
        else
            return bad("source", arg, from, "expected synthetic or model");
        return 0;
    case OPT_MODEL:
        c->model_dir = arg;
        return 0;
    case OPT_DTYPE: {
        hs_model_weights_t w;
        if (hs_model_weights_parse(arg, &w) != HS_OK)
            return bad("dtype", arg, from, "expected auto, bf16 or fp8");
        c->weights = (int)w;
        return 0;
    }
    case OPT_GPUS:
        if (hs_producer_parse_devices(arg, c) != HS_OK)
            return bad("gpus", arg, from,
                       "expected cpu:N (N CPU workers) or distinct GPU ids such as 0,1,2");
        return 0;
    case OPT_PREFETCH:
        if (hs_parse_u64(arg, &u) != HS_OK || u == 0 || u > 64)
            return bad("prefetch", arg, from, "expected 1..64");
        c->prefetch = (uint32_t)u;
        return 0;
    case OPT_CONNECT_TIMEOUT:
        if (hs_parse_u64(arg, &u) != HS_OK || u > 86400)
            return bad("connect-timeout", arg, from, "expected seconds");
        c->connect_timeout_s = (uint32_t)u;
        return 0;
    case OPT_SUMMARY:
        c->summary_json = arg;
        return 0;
    case OPT_NAME:
        c->name = arg;
        return 0;
    case OPT_PREFLIGHT:
        o->preflight = true;
        return 0;
    case OPT_RECONNECT:
        c->reconnect = true;
        return 0;
    case OPT_EAGLE3:
        o->eagle3_layers = true;
        return 0;
    case OPT_STATUS_INTERVAL:
        if (hs_parse_double(arg, &d) != HS_OK || d < 0 || d > 1e6)
            return bad("status-interval", arg, from, "expected seconds >= 0 (0 = off)");
        c->status_interval_s = d > 0 ? d : -1;
        return 0;
    case OPT_PREFLIGHT_HEADROOM:
        if (hs__preflight_headroom_parse(arg, &c->preflight_headroom) != HS_OK)
            return bad("preflight-headroom", arg, from,
                       "expected a fraction in [0, 1) such as 0.1, or a percentage such as 10%");
        return 0;
    case OPT_PREFLIGHT_PEAK:
        if (hs_parse_double(arg, &d) != HS_OK || !(d >= 1) || d > 1e6)
            return bad("preflight-peak-tflops", arg, from, "expected TFLOP/s such as 989.4");
        c->preflight_peak_tflops = d;
        return 0;
    case OPT_PREFLIGHT_ITERS:
        if (hs_parse_u64(arg, &u) != HS_OK || u == 0 || u > 100)
            return bad("preflight-iters", arg, from, "expected 1..100");
        c->preflight_iters = (uint32_t)u;
        return 0;
    }
    return 2;
}

/* Cross-flag checks; returns 0 or prints what is wrong and returns 2. */
static int check(options_t *o)
{
    hs_producer_config_t *c = &o->cfg;
    if (!o->have_to && !o->preflight)
        return fprintf(stderr, "hs-producer: --to HOST:PORT is required\n"), 2;
    if ((o->preflight || o->budget_auto) && c->source != HS_SOURCE_MODEL)
        return fprintf(stderr, "hs-producer: --preflight and --token-budget auto measure the "
                               "built-in model: add --source model --model DIR\n"),
               2;
    if ((o->preflight || o->budget_auto) && c->gpu_ids[0] < 0)
        return fprintf(stderr, "hs-producer: --preflight and --token-budget auto run on GPUs: "
                               "give --gpus 0,1,...\n"),
               2;
    if (!c->data_path) return fprintf(stderr, "hs-producer: --data FILE is required\n"), 2;
    if (c->token_budget && c->max_seq_len > c->token_budget)
        return fprintf(stderr,
                       "hs-producer: --max-seq-len %u is larger than --token-budget %u: a "
                       "sequence must fit in one batch\n",
                       c->max_seq_len, c->token_budget),
               2;
    if (c->source == HS_SOURCE_MODEL && !c->model_dir)
        return fprintf(stderr, "hs-producer: --source model needs --model DIR\n"), 2;
    if (c->source == HS_SOURCE_SYNTHETIC && c->model_dir)
        return fprintf(stderr, "hs-producer: --model is only used with --source model\n"), 2;
    if (!!o->layers_arg + !!o->dflash_layers + !!o->eagle3_layers > 1)
        return fprintf(stderr, "hs-producer: give one of --layers, --dflash-layers and "
                               "--eagle3-layers, not several\n"),
               2;
    if (o->eagle3_layers && c->source != HS_SOURCE_MODEL)
        return fprintf(stderr, "hs-producer: --eagle3-layers needs --source model (the layer "
                               "count comes from the model)\n"),
               2;
    if (!o->layers_arg && !o->dflash_layers && !o->eagle3_layers)
        return fprintf(stderr, "hs-producer: --layers L1,L2,... is required (e.g. 2,16,29)\n"), 2;
    if (o->dflash_layers && c->source != HS_SOURCE_MODEL)
        return fprintf(stderr, "hs-producer: --dflash-layers needs --source model (the layer "
                               "count comes from the model)\n"),
               2;
    if (o->layers_arg) {
        int layers[HS_MAX_LAYERS], n;
        if (hs_parse_int_list(o->layers_arg, layers, HS_MAX_LAYERS, &n) != HS_OK)
            return fprintf(stderr,
                           "hs-producer: --layers '%s': expected up to %d comma-separated "
                           "indices such as 2,16,29\n",
                           o->layers_arg, HS_MAX_LAYERS),
                   2;
        for (int i = 0; i < n; i++) {
            if (layers[i] < 0 || (i && layers[i] <= layers[i - 1]))
                return fprintf(stderr,
                               "hs-producer: --layers '%s': indices must be >= 0 and "
                               "strictly increasing\n",
                               o->layers_arg),
                       2;
            c->layout.layers[i] = layers[i];
        }
        c->layout.n_layers = (uint32_t)n;
    }
    if (c->source == HS_SOURCE_SYNTHETIC && !c->layout.hidden_size)
        return fprintf(stderr, "hs-producer: --source synthetic needs --hidden-size H\n"), 2;
    const char *inputs[] = {c->data_path, c->secret_file, c->model_dir};
    if (c->summary_json && hs_outfile_check(c->summary_json, inputs, 3) != HS_OK)
        return fprintf(stderr, "hs-producer: --summary-json %s: give another file\n",
                       c->summary_json),
               2;
    return 0;
}

/* The exit status of a run, the table of --help (hsflow-produce follows it
 * too): 2 for what the same command would meet again (flags, data, model,
 * a refusal by the consumer), 3 out of memory, 1 a failure of the run. */
static int exit_code(hs_status_t st)
{
    switch (st) {
    case HS_OK:
        return 0;
    case HS_ERR_INVALID:
    case HS_ERR_NOT_FOUND:
    case HS_ERR_FORMAT:
    case HS_ERR_IO:
    case HS_ERR_MISMATCH:
    case HS_ERR_AUTH:
    case HS_ERR_UNSUPPORTED:
        return 2;
    case HS_ERR_NOMEM:
        return 3;
    default:
        return 1;
    }
}

int main(int argc, char **argv)
{
    if (hs_cli_wants_version(argc, argv)) {
        hs_version_print(stdout, "hs-producer");
        return 0;
    }
    options_t o = {0};
    hs_producer_config_default(&o.cfg);
    o.cfg.layout.dtype = HS_DTYPE_BF16;
    /* Settings of the library's parts, read here and nowhere else: the
     * forward's attention kernel (docs/forward-bench.md) and, for tests, a
     * stand-in /sys for device discovery. */
    o.cfg.attn = hs_model_attn_parse(getenv("HS_ATTN_BACKEND"));
    hs_dev_sysfs_root_set(getenv("HS_SYSFS_ROOT"));
    hs_producer_plan_fault_set(getenv("HS_PLAN_FAULT"));
    hs_log_set_tag("producer");
    int first;
    int rc = hs_cli_parse(argc, argv, "h", long_options, apply, &o, &first);
    if (rc == 3) return 0;
    if (rc) {
        fprintf(stderr, "run hs-producer --help for the options\n");
        return 2;
    }
    if (first < argc) {
        fprintf(stderr, "hs-producer: unexpected argument '%s'\n", argv[first]);
        return 2;
    }
    HS_CLI_NET_CONFIGURE(&o.cfg, &o.net);
    o.cfg.fault = o.net.fault;
    if (o.net.list_devices) return hs_dev_list_print(stdout) == HS_OK ? 0 : 1;
    if (check(&o)) return 2;
    if (o.cfg.name) {
        char tag[48];
        snprintf(tag, sizeof(tag), "producer %s", o.cfg.name);
        hs_log_set_tag(tag);
    }
    o.cfg.dflash_layers = o.dflash_layers;
    o.cfg.eagle3_layers = o.eagle3_layers;
    /* --preflight opens no connection: nothing of the network to check */
    if (!o.preflight &&
        hs_cli_net_resolve(&o.net, "hs-producer", o.cfg.n_workers ? o.cfg.gpu_ids[0] : -1) != 0)
        return 2;
    o.cfg.net_devices = o.net.net_devices;
    /* The first SIGTERM/SIGINT asks the engine to stop cleanly (finish the
     * batches in progress, leave the queued tickets to the other producers,
     * say BYE, exit 0). */
    o.cfg.stop_requested = hs_cli_signals_install(
        "hs-producer", "hs-producer: stopping: finishing the batches in progress, then BYE "
                       "(signal again to exit at once)\n");
    hs_status_t st;
    if (o.preflight || o.budget_auto) {
        /* the budget does not fit: exit 3 as out of memory, see exit_code */
        uint32_t budget = o.cfg.token_budget;
        st = hs_producer_preflight(&o.cfg, &budget);
        if (st != HS_OK) {
            fprintf(stderr, "hs-producer: preflight %s: %s\n",
                    st == HS_ERR_NOSPACE ? "refused this budget" : "failed", hs_status_str(st));
            return st == HS_ERR_NOSPACE ? 3 : exit_code(st);
        }
        if (o.preflight) return 0;
        hs_info("--token-budget auto: %u tokens", budget);
        o.cfg.token_budget = budget;
    }
    st = hs_producer_run(&o.cfg);
    hs_cli_net_fini(&o.net);
    return exit_code(st);
}
