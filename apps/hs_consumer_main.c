/* SPDX-License-Identifier: Apache-2.0 */
/* hs_consumer_main.c - the hs-consumer command: listens for producers, fills
 * the host-RAM cache through tickets, and consumes every batch itself (or
 * feeds the trainer through the library); --loopback N also starts N local
 * producers, so one command runs the whole pipeline on one machine. */
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <limits.h>

#include "hsflow.h"
#include "hs_status.h"
#include "hs_log.h"
#include "hs_time.h"
#include "hs_outfile.h"
#include "hs_memclaim.h"
#include "hs_parse.h"
#include "hs_version.h"
#include "hs_cli_net.h"
#include "hs_devices.h"
#include "hs_proto.h"
#include "hs_consumer_files_int.h"
#include "hs_consumer_loopback_int.h"
#include "hs_cli_options.h"
#include "options_int.h" /* hs__consumer_fault_set */
#include "store_int.h"   /* hs_store_fault_set */
#include "verify_int.h"  /* hs__verify_fault_set */

#define MAX_LOOPBACK 64

/* --help: the command's head, the option table's flags, then its own. */
static const char usage_head[] =
    "usage: hs-consumer --listen HOST:PORT --cache-gb N --epochs E [options]\n"
    "       hs-consumer --loopback N [consumer options] -- [hs-producer options]\n"
    "       hs-consumer --loopback N [consumer options] -- COMMAND [its arguments]\n"
    "\n"
    "Receives packed hidden states from hs-producer processes into a host-RAM cache,\n"
    "hands out work tickets so producers never overrun it, verifies every batch and\n"
    "delivers each batch of each epoch exactly once.\n"
    "\n"
    "options (each also settable as HS_<NAME>, e.g. HS_CACHE_GB=64):\n"
    "  --listen HOST:PORT     address to listen on (default 0.0.0.0:7000)\n";

static const char usage_tail[] =
    "  --secret-file FILE     shared secret: producers must prove they hold it (HMAC)\n"
    "  --insecure             accept non-loopback producers without a secret\n"
    "  --transport KIND       auto, shm, tcp or ucx (default auto, per producer: shared memory\n"
    "                         with producers on this host, ucx where an RDMA device is\n"
    "                         present, else tcp); shm takes producers on this host only\n"
    "  --nic auto|NAME[:PORT][,...]  RDMA devices UCX may use (UCX_NET_DEVICES): auto = the\n"
    "                         port nearest --gpu, else the first active one; without any RDMA\n"
    "                         device, auto leaves the choice to UCX (default: UCX's choice)\n"
    "  --require-rdma         fail instead of running without an RDMA lane (no silent TCP)\n"
    "  --list-devices         print RDMA devices, ports, link state and speed, and the NIC\n"
    "                         nearest each GPU, then exit\n"
    "  --train-ms MS          hold each batch MS milliseconds before releasing it (a stand-in\n"
    "                         for trainer time; default 0)\n"
    "  --summary-json FILE    write the end-of-run summary as JSON (\"-\" = stdout), also when\n"
    "                         stopped by SIGTERM/SIGINT (the first signal stops cleanly, keeping\n"
    "                         summary and journal consistent; a second one exits at once)\n"
    "  --status-interval S    seconds between status lines (default 5; 0 = off); with\n"
    "                         --loopback its producers inherit it. Rates, starve and the\n"
    "                         limit are over the last 30 s, the run's averages in brackets\n"
    "  --tcp-sockbuf SIZE     TCP socket buffers, e.g. 16M, at most 1G; 0 = the kernel's\n"
    "                         autotuning (default: 16M where net.core.rmem_max and wmem_max\n"
    "                         allow it, else autotuning)\n"
    "  --ucx-memh 1|0         0 = receive payloads without their registered UCX memory handle\n"
    "                         (for comparisons only; default 1)\n"
    "  --fault SPEC           tests only: inject faults into what arrives here,\n"
    "                         corrupt=N,cut=N,delay_ms=MS (Nth payload / Nth frame)\n"
    "  --stats-jsonl FILE     append the figures as one JSON line per second, \"time\" in\n"
    "                         Unix seconds (plot: python -m hsflow.plot FILE -o run.png)\n"
    "  --resume-state FILE    start from a saved position (--save-state, or the trainer's\n"
    "                         Consumer.state_dict()): deliver exactly the batches it does not\n"
    "                         name; it must come from the same plan, --epochs and --order.\n"
    "                         With --journal too, the state wins and the journal is rewritten\n"
    "  --save-state FILE      write this run's position (every batch delivered so far) to FILE\n"
    "                         at exit and every --save-state-interval, atomically\n"
    "  --save-state-interval S  seconds between --save-state writes (default 10; 0 = at exit\n"
    "                         only)\n"
    "  --loopback N           run N local hs-producer processes against 127.0.0.1; the\n"
    "                         arguments after -- (at least --data and the layout) go to each\n"
    "                         of them; --loopback sets their --to and --name. When they start\n"
    "                         with a word, it is the producer command to run instead\n"
    "                         (hsflow-produce, python3 -m hsflow.produce, a script), with\n"
    "                         --to and --name added after its arguments\n"
    "  -h, --help             this text\n"
    "  --help-markdown        print docs/cli.md (the table's options as Markdown)\n"
    "  --version              the release, git checkout and build options\n"
    "\n"
    "examples:\n"
    "  hs-consumer --listen 0.0.0.0:7000 --cache-gb 64 --epochs 2 --secret-file /etc/hsflow.key\n"
    "  hs-consumer --loopback 3 --cache-gb 1 --epochs 2 --verify-synthetic -- \\\n"
    "      --data data.jsonl --token-budget 8192 --hidden-size 1024 --layers 2,16,29 \\\n"
    "      --source synthetic --gpus cpu:1\n"
    "  hs-consumer --loopback 2 --cache-gb 1 --epochs 2 --save-state pos.json -- ...\n"
    "  hs-consumer --loopback 2 --cache-gb 1 --epochs 2 --resume-state pos.json -- ...\n"
    "  hs-consumer --loopback 2 --cache-gb 1 --epochs 1 --store /data/hs-store -- ...\n"
    "  hs-consumer --loopback 1 --cache-gb 4 --epochs 1 -- hsflow-produce --engine vllm \\\n"
    "      --model /models/target --data train.hst --token-budget 16K --layers 2,16,29\n"
    "  hs-consumer --listen 0.0.0.0:7000 --cache-gb 64 --epochs 5 --store /data/hs-store\n"
    "  hs-consumer --list-devices\n"
    "  hs-consumer --listen 0.0.0.0:7000 --cache-gb 64 --secret-file KEY \\\n"
    "      --expect-plan 3f2a9c0d5e6b7a81 --expect-dataset 9d41c07be2f35a10 \\\n"
    "      --expect-layout H=4096,layers=2,16,29,dtype=bf16\n"
    "  hs-consumer --listen 0.0.0.0:7000 --gpu 3 --nic auto --require-rdma --secret-file KEY\n";

typedef struct {
    hs_consumer_config_t cfg;
    hs_cli_net_t net; /* --transport, --nic, --secret-file, ... */
    char host[256];
    int loopback;
    unsigned train_ms;
    const char *summary_json;
    const char *stats_jsonl;
    const char *resume_state; /* file */
    const char *save_state;   /* file */
    double save_state_interval;
} options_t;

enum {
    OPT_LISTEN = 1000,
    OPT_TRAIN_MS,
    OPT_SUMMARY,
    OPT_STATUS,
    OPT_LOOPBACK,
    OPT_STATS_JSONL,
    OPT_RESUME_STATE,
    OPT_SAVE_STATE,
    OPT_SAVE_STATE_INTERVAL,
    OPT_HELP_MARKDOWN,
};

/* The command's own flags; the option table's are added to them (main). */
static const struct option own_options[] = {
    {"listen", required_argument, NULL, OPT_LISTEN},
    {"train-ms", required_argument, NULL, OPT_TRAIN_MS},
    {"summary-json", required_argument, NULL, OPT_SUMMARY},
    {"status-interval", required_argument, NULL, OPT_STATUS},
    {"loopback", required_argument, NULL, OPT_LOOPBACK},
    {"stats-jsonl", required_argument, NULL, OPT_STATS_JSONL},
    {"resume-state", required_argument, NULL, OPT_RESUME_STATE},
    {"save-state", required_argument, NULL, OPT_SAVE_STATE},
    {"save-state-interval", required_argument, NULL, OPT_SAVE_STATE_INTERVAL},
    HS_CLI_NET_OPTIONS,
    HS_CLI_NET_OPTION_INSECURE,
    {"help", no_argument, NULL, 'h'},
    {"help-markdown", no_argument, NULL, OPT_HELP_MARKDOWN},
};

/* The getopt_long table: the command's flags, the option table's, the end. */
#define N_OWN_OPTIONS (sizeof(own_options) / sizeof(own_options[0]))
static struct option long_options[N_OWN_OPTIONS + 128];

static hs_status_t config_set(void *cfg, const char *name, const char *value, char *why, size_t cap)
{
    return hs_consumer_config_set(cfg, name, value, why, cap);
}

/* The consumer's option table as hs-consumer parses and prints it. */
static const hs_cli_options_t table = {"hs-consumer", hs_consumer_option_count,
                                       hs_consumer_option_info, config_set, 0};

/* The head of docs/cli.md (hs-consumer --help-markdown). */
static const char markdown_intro[] =
    "# hs-consumer options\n\n"
    "<!-- Generated by `hs-consumer --help-markdown` from the consumer's option table\n"
    "     (consumer/options.c); edit the table, then `cmake --build build --target\n"
    "     docs-cli`. A test fails while this file and the table differ. -->\n\n"
    "Every setting of the consumer, as each front end spells it: the hs-consumer flag,\n"
    "its environment variable (the command line wins), the keyword argument of\n"
    "Python's `hsflow.Consumer`, and the name `hs_consumer_config_set()` takes in C.\n"
    "The bounds are checked by all of them and again by `hs_consumer_create()`. A flag\n"
    "marked *shared* is parsed with hs-producer's network flags. `hs-consumer --help`\n"
    "also lists the command's own flags (`--listen`, `--loopback`, `--status-interval`,\n"
    "`--save-state`, `--resume-state`, `--train-ms`, ...).\n\n";

static int bad(const char *flag, const char *arg, const char *from, const char *expect)
{
    return hs_cli_bad("hs-consumer", flag, arg, from, expect);
}

static int apply(void *ctx, int opt, const char *arg, const char *from)
{
    options_t *o = ctx;
    uint64_t u;
    double d;
    int net = hs_cli_net_apply(&o->net, "hs-consumer", opt, arg, from);
    if (net >= 0) return net;
    int from_table = hs_cli_options_apply(&table, &o->cfg, opt, arg, from);
    if (from_table >= 0) return from_table;
    switch (opt) {
    case 'h':
        fputs(usage_head, stdout);
        hs_cli_options_help(&table, stdout);
        fputs(usage_tail, stdout);
        return 3;
    case OPT_HELP_MARKDOWN:
        hs_cli_options_markdown(&table, markdown_intro, stdout);
        return 3;
    case OPT_LISTEN: {
        uint16_t port;
        if (hs_parse_hostport(arg, o->host, sizeof(o->host), &port) != HS_OK)
            return bad("listen", arg, from, "expected HOST:PORT, e.g. 0.0.0.0:7000");
        o->cfg.listen_host = o->host;
        o->cfg.listen_port = port;
        return 0;
    }
    case OPT_TRAIN_MS:
        if (hs_parse_u64(arg, &u) != HS_OK || u > 600000)
            return bad("train-ms", arg, from, "expected milliseconds, 0..600000");
        o->train_ms = (unsigned)u;
        return 0;
    case OPT_SUMMARY:
        o->summary_json = arg;
        return 0;
    case OPT_STATS_JSONL:
        o->stats_jsonl = arg;
        return 0;
    case OPT_RESUME_STATE:
        if (!arg[0]) return bad("resume-state", arg, from, "expected a state file");
        o->resume_state = arg;
        return 0;
    case OPT_SAVE_STATE:
        if (!arg[0]) return bad("save-state", arg, from, "expected a file to write");
        o->save_state = arg;
        return 0;
    case OPT_SAVE_STATE_INTERVAL:
        if (hs_parse_double(arg, &d) != HS_OK || d < 0 || d > 1e6)
            return bad("save-state-interval", arg, from, "expected seconds >= 0");
        o->save_state_interval = d;
        return 0;
    case OPT_STATUS:
        if (hs_parse_double(arg, &d) != HS_OK || d < 0 || d > 1e6)
            return bad("status-interval", arg, from, "expected seconds >= 0 (0 = off)");
        o->cfg.status_interval_s = d > 0 ? d : -1;
        setenv("HS_STATUS_INTERVAL", arg, 1); /* for the --loopback producers */
        return 0;
    case OPT_LOOPBACK:
        if (hs_parse_u64(arg, &u) != HS_OK || u == 0 || u > MAX_LOOPBACK)
            return bad("loopback", arg, from, "expected 1..64 producers");
        o->loopback = (int)u;
        return 0;
    }
    return 2;
}

/* One rule for every file this command writes (--summary-json,
 * --stats-jsonl, --save-state, and --journal, which it also reads): none may
 * be, or link to, a file it reads (--secret-file, --resume-state, the
 * journal) nor another of its outputs. The one exception: --save-state may
 * be the --resume-state file, which is read whole before anything is
 * written. Appended files are held to it as well as replaced ones. Returns 0
 * or 2 (printed). */
static int check_outputs(const options_t *o)
{
    const char *summary = o->summary_json && strcmp(o->summary_json, "-") ? o->summary_json : NULL;
    struct {
        const char *flag, *path;
        const char *others[6];
    } outs[] = {
        {"summary-json",
         summary,
         {o->cfg.secret_file, o->resume_state, o->cfg.journal, o->stats_jsonl, o->save_state}},
        {"stats-jsonl",
         o->stats_jsonl,
         {o->cfg.secret_file, o->resume_state, o->cfg.journal, o->save_state}},
        {"save-state", o->save_state, {o->cfg.secret_file, o->cfg.journal}},
        {"journal", o->cfg.journal, {o->cfg.secret_file, o->resume_state, o->save_state}},
    };
    for (size_t i = 0; i < sizeof(outs) / sizeof(outs[0]); i++) {
        if (!outs[i].path) continue;
        if (hs_outfile_check(outs[i].path, outs[i].others, 6) != HS_OK) {
            fprintf(stderr, "hs-consumer: --%s %s: give it a file of its own\n", outs[i].flag,
                    outs[i].path);
            return 2;
        }
    }
    return 0;
}

int main(int argc, char **argv)
{
    if (hs_cli_wants_version(argc, argv)) {
        hs_version_print(stdout, "hs-consumer");
        return 0;
    }
    options_t o = {0};
    hs_consumer_config_default(&o.cfg);
    o.save_state_interval = 10;
    snprintf(o.host, sizeof(o.host), "0.0.0.0");
    o.cfg.listen_host = o.host;
    hs_log_set_tag("consumer");
    if (!hs_cli_options_getopt(&table, own_options, N_OWN_OPTIONS, long_options,
                               sizeof(long_options) / sizeof(long_options[0]))) {
        fprintf(stderr, "hs-consumer: more options than its getopt table holds\n");
        return 1;
    }
    /* Settings of the library's parts, read here and nowhere else; test
     * hooks: a stand-in system for the memory this process may take and for
     * device discovery, the node's cache registry, faults of the store, slow
     * checksum threads. */
    hsflow_set_system_root(getenv("HS_SYSTEM_ROOT"));
    hs_mem_claim_registry_set(getenv("HS_MEM_REGISTRY"));
    hs_dev_sysfs_root_set(getenv("HS_SYSFS_ROOT"));
    hs_store_fault_set(getenv("HS_STORE_FAULT"));
    hs__verify_fault_set(getenv("HS_VERIFY_FAULT"));

    /* Arguments after "--" belong to the loopback producers. */
    int split = argc;
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--")) {
            split = i;
            break;
        }
    int first;
    int rc = hs_cli_parse(split, argv, "h", long_options, apply, &o, &first);
    if (rc == 3) return 0;
    if (rc) {
        fprintf(stderr, "run hs-consumer --help for the options\n");
        return 2;
    }
    if (first < split) {
        fprintf(stderr, "hs-consumer: unexpected argument '%s' (producer options go after --)\n",
                argv[first]);
        return 2;
    }
    if (split < argc && !o.loopback) {
        fprintf(stderr, "hs-consumer: arguments after -- are for --loopback producers; add "
                        "--loopback N\n");
        return 2;
    }
    int n_producer_args = split < argc ? argc - split - 1 : 0;
    if (o.loopback && n_producer_args == 0) {
        fprintf(stderr,
                "hs-consumer: --loopback %d starts hs-producer processes, which need their "
                "options after --, e.g.\n  hs-consumer --loopback %d --cache-gb 1 -- --data "
                "data.jsonl --token-budget 8192 --hidden-size 1024 --layers 2,16,29 --source "
                "synthetic\n(or a producer command after --: -- hsflow-produce --model M ...)\n",
                o.loopback, o.loopback);
        return 2;
    }
    for (int i = split + 1; i < argc; i++) {
        if (!strcmp(argv[i], "--to") || !strncmp(argv[i], "--to=", 5) ||
            !strcmp(argv[i], "--name") || !strncmp(argv[i], "--name=", 7)) {
            fprintf(stderr,
                    "hs-consumer: '%s' after --: --loopback sets each local producer's --to and "
                    "--name itself; drop it\n",
                    argv[i]);
            return 2;
        }
    }
    HS_CLI_NET_CONFIGURE(&o.cfg, &o.net);
    hs__consumer_fault_set(o.net.fault);
    o.cfg.insecure = o.net.insecure;
    if (check_outputs(&o) != 0) return 2;
    if (o.net.list_devices) return hs_dev_list_print(stdout) == HS_OK ? 0 : 1;
    if (hs_cli_net_resolve(&o.net, "hs-consumer", o.cfg.gpu) != 0) return 2;
    o.cfg.net_devices = o.net.net_devices;
    if (o.loopback) {
        snprintf(o.host, sizeof(o.host), "127.0.0.1");
        if (!hs_env_for_flag("listen")) o.cfg.listen_port = 0;
    }
    if (o.cfg.rank >= o.cfg.world) {
        fprintf(stderr,
                "hs-consumer: --rank %u is not below --world %u: ranks are 0..%u; give every "
                "rank the same --world\n",
                o.cfg.rank, o.cfg.world, o.cfg.world - 1);
        return 2;
    }
    hs_info("config: rank %u of %u, uneven %s", o.cfg.rank, o.cfg.world,
            o.cfg.uneven == HS_UNEVEN_REPEAT ? "repeat" : "drop");
    if (o.cfg.expect_plan || o.cfg.expect_layout || o.cfg.expect_dataset || o.cfg.expect_target)
        hs_info("config: run pinned to plan %s, layout %s, dataset %s, target %s",
                o.cfg.expect_plan ? o.cfg.expect_plan : "any",
                o.cfg.expect_layout ? o.cfg.expect_layout : "any",
                o.cfg.expect_dataset ? o.cfg.expect_dataset : "any",
                o.cfg.expect_target ? o.cfg.expect_target : "any");
    hs_info("config: listen %s:%u, cache %.3f GiB, epochs %u, gpu %d, order %s, prefetch %u, "
            "lease-timeout %g s, verify-synthetic %s, transport %s, net devices %s, require-rdma "
            "%s, loopback %d, "
            "journal %s, resume-state %s, save-state %s every %.1f s, store %s",
            o.cfg.listen_host, o.cfg.listen_port, (double)o.cfg.cache_bytes / (1 << 30),
            o.cfg.epochs, o.cfg.gpu, o.cfg.order == HS_ORDER_PLAN ? "plan" : "arrival",
            o.cfg.prefetch, o.cfg.lease_timeout_s, o.cfg.verify_synthetic ? "on" : "off",
            o.cfg.transport, o.cfg.net_devices ? o.cfg.net_devices : "ucx's choice",
            o.cfg.require_rdma ? "on" : "off", o.loopback, o.cfg.journal ? o.cfg.journal : "off",
            o.resume_state ? o.resume_state : "off", o.save_state ? o.save_state : "off",
            o.save_state_interval, o.cfg.store ? o.cfg.store : "off");

    /* The first SIGINT/SIGTERM stops the run cleanly (summary, journal). */
    volatile sig_atomic_t *interrupted = hs_cli_signals_install("hs-consumer", NULL);

    FILE *jsonl = NULL;
    if (o.stats_jsonl && !(jsonl = fopen(o.stats_jsonl, "a"))) {
        fprintf(stderr, "hs-consumer: --stats-jsonl %s: cannot open it for appending: %m\n",
                o.stats_jsonl);
        return 2;
    }
    char *resume_text = NULL;
    if (o.resume_state) {
        if (!(resume_text = hs__cli_read_state_file(o.resume_state))) return 2;
        o.cfg.resume_state = resume_text;
    }
    hs_consumer_t *c;
    hs_status_code_t cst = hs_consumer_create(&o.cfg, &c);
    free(resume_text); /* copied by create */
    /* 2: a bad state file, or a --cache-gb the machine cannot give */
    if (cst != HS_OK)
        return cst == HS_ERR_FORMAT || cst == HS_ERR_MISMATCH || cst == HS_ERR_NOSPACE ||
                       cst == HS_ERR_BUSY
                   ? 2
                   : 1;
    char *state_buf = NULL;
    size_t state_cap = 0;
    double t_state = hs_now_s();

    pid_t pids[MAX_LOOPBACK] = {0};
    int alive = 0;
    if (o.loopback) {
        char bin[PATH_MAX];
        char **pargs = argv + split + 1;
        hs__cli_producer_path(hs__cli_loopback_has_command(n_producer_args, pargs) ? pargs[0]
                                                                                   : NULL,
                              bin, sizeof(bin));
        for (int i = 0; i < o.loopback; i++) {
            pids[i] = hs__cli_spawn_producer(bin, hs_consumer_port(c), i, n_producer_args, pargs);
            if (pids[i] > 0) alive++;
        }
        hs_info("started %d local producer(s): %s --to 127.0.0.1:%u ...", alive, bin,
                hs_consumer_port(c));
    }

    int exit_code = 0;
    hs_batch_t b;
    double t_jsonl = 0;
    for (; !exit_code;) {
        if (jsonl && hs_now_s() - t_jsonl >= 1.0) {
            t_jsonl = hs_now_s();
            hs__cli_write_stats_line(c, jsonl);
        }
        if (o.save_state && o.save_state_interval > 0 &&
            hs_now_s() - t_state >= o.save_state_interval) {
            t_state = hs_now_s();
            hs_status_t saved = hs__cli_save_state(c, o.save_state, &state_buf, &state_cap);
            if (saved != HS_OK) /* the file keeps the last state written; the exit's save decides */
                hs_warn("--save-state %s: not updated (%s); trying again in %.0f s", o.save_state,
                        hs_status_str(saved), o.save_state_interval);
        }
        if (*interrupted) {
            hs_warn("interrupted: stopping before the run is complete");
            exit_code = 130;
            break;
        }
        hs_status_code_t st = hs_consumer_next(c, &b, 250);
        if (st == HS_OK) {
            if (o.train_ms) usleep(o.train_ms * 1000u);
            hs_status_code_t rs = hs_consumer_release(c, &b);
            /* HS_ERR_IO: the journal could not record it (logged); the run goes on */
            if (rs == HS_OK || rs == HS_ERR_IO) continue;
            exit_code = 1; /* the library said why */
            break;
        }
        if (st == -9 /* HS_ERR_CLOSED: every batch delivered */) break;
        if (st != -11 /* HS_ERR_TIMEOUT */) {
            exit_code = 1;
            break;
        }
        /* Loopback: if every producer is gone and work remains, nobody will finish it. */
        for (int i = 0; i < o.loopback; i++) {
            int status;
            if (pids[i] > 0 && waitpid(pids[i], &status, WNOHANG) == pids[i]) {
                pids[i] = 0;
                alive--;
                if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
                    hs_warn("local producer %d ended with %s %d", i,
                            WIFEXITED(status) ? "exit code" : "signal",
                            WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status));
            }
        }
        if (o.loopback && alive == 0) {
            hs_error("every local producer has exited and the run is not complete");
            exit_code = 1;
            break;
        }
    }

    if (jsonl) {
        hs__cli_write_stats_line(c, jsonl);
        fclose(jsonl);
    }
    hs_consumer_stats_t s;
    hs_consumer_stats(c, &s);
    if (o.save_state) {
        if (hs__cli_save_state(c, o.save_state, &state_buf, &state_cap) != HS_OK) {
            if (!exit_code) exit_code = 1;
        } else {
            hs_info("position saved to %s (%llu batch(es) delivered in all)", o.save_state,
                    (unsigned long long)(s.batches_delivered + s.batches_resumed));
        }
    }
    free(state_buf);
    hs_consumer_destroy(c);
    hs_cli_net_fini(&o.net);
    if (o.loopback) {
        for (int i = 0; i < o.loopback; i++) {
            if (pids[i] <= 0) continue;
            if (exit_code) kill(pids[i], SIGTERM);
            int status;
            waitpid(pids[i], &status, 0);
        }
    }
    double secs = s.seconds > 0 ? s.seconds : 1e-9;
    bool complete = (s.batches_planned > 0 || s.batches_resumed > 0) &&
                    s.batches_delivered == s.batches_planned;
    if (s.batches_resumed)
        printf("hsflow resume: %llu batch(es) delivered in an earlier run were skipped (%s)\n",
               (unsigned long long)s.batches_resumed, o.resume_state ? "resume state" : "journal");
    printf("hsflow summary: %llu/%llu batches delivered (%s), %llu duplicates, %llu checksum "
           "failures, %llu protocol errors, %.3f GB in %.2f s = %.3f GB/s, %.0f tokens/s, "
           "%llu producers seen (%llu dropped), %llu tickets re-issued, starve %.1f%%; "
           "the last %.0f s: %.0f tokens/s, starve %.1f%%, verify %.0f%%\n",
           (unsigned long long)s.batches_delivered, (unsigned long long)s.batches_planned,
           complete ? "complete" : "INCOMPLETE", (unsigned long long)s.duplicates,
           (unsigned long long)s.checksum_failures, (unsigned long long)s.protocol_errors,
           (double)s.bytes_received / 1e9, s.seconds, (double)s.bytes_received / secs / 1e9,
           (double)s.tokens_delivered / secs, (unsigned long long)s.producers_seen,
           (unsigned long long)s.producers_dropped, (unsigned long long)s.leases_returned,
           s.starve_pct, s.window_s, s.recent_tokens_per_s, s.recent_starve_pct,
           s.recent_verify_pct);
    char limit[256];
    hs_consumer_bottleneck_text(&s, limit, sizeof(limit));
    printf("hsflow summary: epoch %u/%u, %.1f%% of the run; producer stall %.1f%%; %s\n", s.epoch,
           s.epochs, s.run_pct, s.producer_stall_pct, limit);
    /* This process's CPU (its receive, copy and verify threads); the
     * producers --loopback started are children and not in it. */
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) == 0) {
        double user = (double)ru.ru_utime.tv_sec + ru.ru_utime.tv_usec * 1e-6;
        double sys = (double)ru.ru_stime.tv_sec + ru.ru_stime.tv_usec * 1e-6;
        double gb = (double)s.bytes_received / 1e9;
        printf("hsflow summary: consumer CPU %.2f s (user %.2f, system %.2f), %.3f CPU s per GB "
               "delivered\n",
               user + sys, user, sys, gb > 0 ? (user + sys) / gb : 0.0);
    }
    if (o.summary_json) {
        char json[4096];
        hs_consumer_stats_json(&s, json, sizeof(json));
        if (!strcmp(o.summary_json, "-")) {
            fputs(json, stdout);
        } else {
            /* Whole or not at all: a reader never sees half a summary. */
            hs_outfile_t *f;
            if (hs_outfile_open(o.summary_json, NULL, 0, &f) != HS_OK) return 1;
            fputs(json, hs_outfile_stream(f));
            if (hs_outfile_commit(f) != HS_OK) return 1;
        }
    }
    if (!exit_code && !complete) exit_code = 1;
    return exit_code;
}
