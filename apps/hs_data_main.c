/* SPDX-License-Identifier: Apache-2.0 */
/* hs_data_main.c - hs-data: import, inspect, plan and synthesise token datasets.
 *
 *   hs-data import IN OUT.hst    JSONL (or .hst) -> .hst
 *   hs-data info FILE            format, counts, lengths, fingerprint
 *   hs-data plan FILE ...        the batch plan a producer would build
 *   hs-data synth OUT.jsonl ...  a random JSONL dataset
 *
 * Exit status: 0 ok, 1 the operation failed, 2 bad command line. */
#include <getopt.h>
#include <stdbool.h>
#include <inttypes.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include "hs_cli.h"
#include "hs_cli_options.h"
#include "hs_options.h"
#include "hsflow.h"
#include "hs_log.h"
#include "hs_time.h"
#include "hs_shuffle.h"
#include "hs_parse.h"
#include "hs_version.h"
#include "hs_data.h"
#include "hs_proto.h"

/* ---- the options ------------------------------------------------------------
 *
 * One table per command that has options, the command's rows written once:
 * plan's are the plan library's (data/options.c: the bounds hs_plan_build
 * checks) and three of hs-data's own; synth's and every command's are
 * hs-data's. Each gives that command's flags (getopt), their HS_* variables,
 * their --help lines and their part of docs/cli.md. */

/* plan: the library's plan settings, then what hs-data plan prints */
typedef struct {
    hs_plan_config_t plan;
    uint32_t epochs;      /* the batch order of this many epochs is shown */
    uint32_t hidden_size; /* with layers: the pin line's --expect-layout; 0 = not given */
    const char *layers;
} plan_opts_t;

typedef struct {
    uint32_t sequences; /* 0 = not given */
    uint32_t min_len, max_len, vocab;
    uint64_t seed;
} synth_opts_t;

typedef struct {
    int log_level; /* hs_log_level_t */
} common_opts_t;

static const char *parse_log_level(void *cfg, const char *v, char *why, size_t cap)
{
    static const char *names[] = {"error", "warn", "info", "debug", "trace"};
    for (int i = 0; i < 5; i++) {
        if (strcasecmp(v, names[i]) == 0) {
            ((common_opts_t *)cfg)->log_level = i;
            return NULL;
        }
    }
    snprintf(why, cap, "expected error, warn, info, debug or trace");
    return why;
}

/* clang-format off */
static const hs_opt_t plan_rows[] = {
    /* name, type, where, default, min, max, unit, flag, metavar, help */
    HS_OPT("epochs", HS_OPT_U32, offsetof(plan_opts_t, epochs), "1", 1, 1000000, "", "epochs", "E",
     "show the batch order of the first E epochs"),
    HS_OPT("hidden_size", HS_OPT_U32, offsetof(plan_opts_t, hidden_size), "", 1, 65536, "",
     "hidden-size", "H", "the producers' hidden size; with --layers, the pin line also has "
     "--expect-layout", .word = ""),
    HS_OPT("layers", HS_OPT_STRING, offsetof(plan_opts_t, layers), "", 0, 0, "", "layers",
     "L1,L2,...", "the producers' captured layers, with --hidden-size"),
};
static const hs_opt_t synth_rows[] = {
    HS_OPT("sequences", HS_OPT_SIZE, offsetof(synth_opts_t, sequences), "", 1, INT32_MAX, "",
     "sequences", "N", "how many sequences (required)"),
    HS_OPT("min_len", HS_OPT_SIZE, offsetof(synth_opts_t, min_len), "16", 1, INT32_MAX, "tokens",
     "min-len", "A", "shortest sequence"),
    HS_OPT("max_len", HS_OPT_SIZE, offsetof(synth_opts_t, max_len), "2048", 1, INT32_MAX, "tokens",
     "max-len", "B", "longest sequence"),
    HS_OPT("seed", HS_OPT_U64, offsetof(synth_opts_t, seed), "0", 0, 18446744073709551615.0, "",
     "seed", "S", "random seed"),
    HS_OPT("vocab", HS_OPT_SIZE, offsetof(synth_opts_t, vocab), "32000", 1, INT32_MAX, "", "vocab",
     "V", "token ids are drawn from 0..V-1"),
};
/* an enum read by parse_log_level (five levels: more than .values holds) */
static const hs_opt_t common_rows[] = {
    HS_OPT("log_level", HS_OPT_ENUM, offsetof(common_opts_t, log_level), "info", 0, 0, "",
     "log-level", "L", "error, warn, info, debug or trace",
     .choices = "error|warn|info|debug|trace", .parse = parse_log_level),
};
/* clang-format on */

#define N_ROWS(a) (sizeof(a) / sizeof((a)[0]))

static char plan_envs[N_ROWS(plan_rows)][HS_OPT_ENV_CAP];
static char synth_envs[N_ROWS(synth_rows)][HS_OPT_ENV_CAP];
static char common_envs[N_ROWS(common_rows)][HS_OPT_ENV_CAP];
static hs_opt_table_t plan_table = {"hs-data plan", plan_rows, N_ROWS(plan_rows), plan_envs, false};
static hs_opt_table_t synth_table = {"hs-data synth", synth_rows, N_ROWS(synth_rows), synth_envs,
                                     false};
static hs_opt_table_t common_table = {"hs-data", common_rows, N_ROWS(common_rows), common_envs,
                                      false};

/* plan's table: the library's rows (hs_plan_option_info), then plan_rows */
static uint32_t plan_count(void) { return hs_plan_option_count() + (uint32_t)N_ROWS(plan_rows); }

static hs_status_t plan_info(uint32_t i, hs_option_info_t *out)
{
    uint32_t n = hs_plan_option_count();
    return i < n ? hs_plan_option_info(i, out) : hs_opt_table_info(&plan_table, i - n, out);
}

static hs_status_t plan_set(void *cfg, const char *name, const char *value, char *why, size_t cap)
{
    for (size_t i = 0; i < N_ROWS(plan_rows); i++)
        if (!strcmp(plan_rows[i].name, name))
            return hs_opt_table_set(&plan_table, cfg, name, value, why, cap);
    return hs_plan_config_set(&((plan_opts_t *)cfg)->plan, name, value, why, cap);
}

static uint32_t synth_count(void) { return (uint32_t)N_ROWS(synth_rows); }

static hs_status_t synth_info(uint32_t i, hs_option_info_t *out)
{
    return hs_opt_table_info(&synth_table, i, out);
}

static hs_status_t synth_set(void *cfg, const char *name, const char *value, char *why, size_t cap)
{
    return hs_opt_table_set(&synth_table, cfg, name, value, why, cap);
}

static uint32_t common_count(void) { return (uint32_t)N_ROWS(common_rows); }

static hs_status_t common_info(uint32_t i, hs_option_info_t *out)
{
    return hs_opt_table_info(&common_table, i, out);
}

static hs_status_t common_set(void *cfg, const char *name, const char *value, char *why, size_t cap)
{
    return hs_opt_table_set(&common_table, cfg, name, value, why, cap);
}

/* A command's table at offset 0, every command's after it. */
static const hs_cli_options_t plan_options = {"hs-data", plan_count, plan_info, plan_set, 0};
static const hs_cli_options_t synth_options = {"hs-data", synth_count, synth_info, synth_set, 0};
static const hs_cli_options_t common_options = {"hs-data", common_count, common_info, common_set,
                                                256};

typedef struct {
    plan_opts_t plan;
    synth_opts_t synth;
    common_opts_t common;
} opts_t;

/* The commands: their operands, what they do (--help), their table. */
typedef struct {
    const char *name, *operands;
    int n_operands;
    const char *about;             /* --help's lines, indented to the column of the flags' help */
    const hs_cli_options_t *table; /* NULL: only every command's options */
    size_t at;                     /* where the table's config is in opts_t */
} command_t;

static const command_t commands[] = {
    {"import", "IN OUT.hst", 2,
     "convert a dataset (JSONL or .hst) to hsflow's binary .hst\n"
     "                         format; prints sequences, tokens and fingerprint\n",
     NULL, 0},
    {"info", "FILE", 1, "format, sequences, tokens, min/mean/max length, fingerprint\n", NULL, 0},
    {"plan", "FILE", 1,
     "pack FILE into batches as a producer would; prints batches,\n"
     "                         fill, truncated/dropped sequences, plan hash, batch shapes,\n"
     "                         and the hs-consumer flags that pin the run to it\n",
     &plan_options, offsetof(opts_t, plan)},
    {"synth", "OUT.jsonl", 1, "write a random JSONL dataset (demos and tests)\n", &synth_options,
     offsetof(opts_t, synth)},
};
#define N_COMMANDS (sizeof(commands) / sizeof(commands[0]))

static const char usage_about[] =
    "A JSONL dataset has one JSON object per line: {\"input_ids\": [1, 2, 3]} with an\n"
    "optional \"loss_mask\": [0, 1, 1] (default all ones); a line giving either key\n"
    "twice is refused. The format of a file is recognised by its content, not its\n"
    "name. Conversations and text become such a file with `python -m hsflow.data\n"
    "prepare` (docs/data.md).\n"
    "\n"
    "import and info stream the file: their memory does not grow with it (info on a\n"
    "JSONL file writes a temporary .hst, 5 bytes per token, to $TMPDIR, default\n"
    "/var/tmp, for the fingerprint). On a terminal they show their progress on\n"
    "stderr; both end with the elapsed time. import refuses an OUT that is IN (also\n"
    "through a link) and writes through a temporary file renamed at the end.\n";

static const char usage_help_markdown[] =
    "  --help-markdown        print hs-data's part of docs/cli.md (its options as Markdown)\n";

static const char usage_common[] =
    "  -h, --help             this text\n"
    "  --version              the release, git checkout and build options\n";

static const char usage_env[] =
    "\n"
    "Every option can also come from the environment: --token-budget as\n"
    "HS_TOKEN_BUDGET, --max-seq-len as HS_MAX_SEQ_LEN, and so on; the command line wins.\n";

/* one a line; `hs-data COMMAND --help` shows those of COMMAND */
static const char usage_examples[] =
    "  hs-data synth demo.jsonl --sequences 20000 --min-len 64 --max-len 8192 --seed 1\n"
    "  hs-data import demo.jsonl demo.hst\n"
    "  hs-data info demo.hst\n"
    "  hs-data plan demo.hst --token-budget 64K --max-seq-len 8192 --overflow drop --seed 7\n"
    "  HS_TOKEN_BUDGET=32768 hs-data plan demo.hst --epochs 3\n"
    "  hs-data plan demo.hst --token-budget 64K --hidden-size 4096 --layers 2,16,29\n";

/* `hs-data --help` (cmd NULL): every command; `hs-data COMMAND --help`: one. */
static void usage(FILE *f, const command_t *cmd)
{
    if (cmd) {
        char left[64];
        snprintf(left, sizeof(left), "%s %s", cmd->name, cmd->operands);
        fprintf(f, "usage: hs-data %s [OPTIONS]\n\n  %-22s %s", left, left, cmd->about);
        if (cmd == &commands[0] || cmd == &commands[1]) fprintf(f, "\n%s", usage_about);
        if (cmd->table) {
            fprintf(f, "\noptions:\n");
            hs_cli_options_help(cmd->table, f);
        }
    } else {
        fprintf(f, "usage: hs-data COMMAND ARGS [OPTIONS]\n"
                   "\n"
                   "Prepare and inspect the token datasets hsflow producers read.\n"
                   "\n"
                   "commands:\n");
        for (size_t i = 0; i < N_COMMANDS; i++) {
            char left[64];
            snprintf(left, sizeof(left), "%s %s", commands[i].name, commands[i].operands);
            fprintf(f, "  %-22s %s", left, commands[i].about);
        }
        fprintf(f, "\n%s", usage_about);
        for (size_t i = 0; i < N_COMMANDS; i++) {
            if (!commands[i].table) continue;
            fprintf(f, "\n%s options:\n", commands[i].name);
            hs_cli_options_help(commands[i].table, f);
        }
    }
    fprintf(f, "\nevery command:\n");
    hs_cli_options_help(&common_options, f);
    fputs(usage_common, f);
    if (!cmd) fputs(usage_help_markdown, f);
    fputs(usage_env, f);
    if (!cmd) {
        fprintf(f, "\nexamples:\n%s", usage_examples);
        return;
    }
    fprintf(f, "\nexamples:\n");
    char word[32];
    snprintf(word, sizeof(word), "hs-data %s ", cmd->name);
    for (const char *l = usage_examples; *l;) {
        size_t n = strcspn(l, "\n");
        const char *w = strstr(l, word);
        if (w && w < l + n) fprintf(f, "%.*s\n", (int)n, l);
        l += n + (l[n] == '\n');
    }
}

/* The head of hs-data's part of docs/cli.md (hs-data --help-markdown). */
static const char markdown_intro[] =
    "\n# hs-data options\n\n"
    "<!-- Generated by `hs-data --help-markdown` from hs-data's option tables (the\n"
    "     plan's in data/options.c, the rest in apps/hs_data_main.c); edit a table,\n"
    "     then `cmake --build build --target docs-cli`. A test fails while this file\n"
    "     and the tables differ. -->\n\n"
    "The options of each hs-data command, as the command line and the environment\n"
    "spell them (the command line wins). The plan's are the settings of\n"
    "`hs_plan_config_t`: the name is what `hs_plan_config_set()` takes in C, and\n"
    "`hs_plan_build()` checks the same bounds.\n";

static void markdown(FILE *f)
{
    fputs(markdown_intro, f);
    char head[128];
    for (size_t i = 0; i < N_COMMANDS; i++) {
        if (!commands[i].table) continue;
        snprintf(head, sizeof(head), "\n## hs-data %s %s\n\n", commands[i].name,
                 commands[i].operands);
        hs_cli_options_markdown(commands[i].table, head, f);
    }
    hs_cli_options_markdown(&common_options, "\n## every command\n\n", f);
}

static int die_usage(const char *fmt, const char *a, const char *b)
{
    fprintf(stderr, "hs-data: ");
    fprintf(stderr, fmt, a, b);
    fprintf(stderr, "\nrun `hs-data --help` for usage and examples\n");
    return 2;
}

/* The flag ("token-budget") of argument `arg` ("--token-budget" or
 * "--token-budget=64K") when another command than `cmd` takes it, or NULL. */
static const char *flag_owner(const char *arg, const command_t *cmd)
{
    if (strncmp(arg, "--", 2) != 0) return NULL;
    size_t len = strcspn(arg + 2, "=");
    for (size_t i = 0; i < N_COMMANDS; i++) {
        const hs_cli_options_t *t = commands[i].table;
        if (!t || &commands[i] == cmd) continue;
        for (uint32_t j = 0; j < t->count(); j++) {
            hs_option_info_t o;
            if (t->info(j, &o) == HS_OK && strlen(o.flag) == len && !strncmp(o.flag, arg + 2, len))
                return o.flag;
        }
    }
    return NULL;
}

/* The environment's values of table t's flags into cfg: 0, or 2 after a bad
 * one (printed, naming the variable and its flag). */
static int options_from_env(const hs_cli_options_t *t, void *cfg)
{
    for (uint32_t i = 0; i < t->count(); i++) {
        hs_option_info_t o;
        if (t->info(i, &o) != HS_OK || !o.flag[0]) continue;
        const char *v = hs_env_for_flag(o.flag);
        char why[256];
        if (!v || t->set(cfg, o.name, v, why, sizeof(why)) == HS_OK) continue;
        fprintf(stderr, "hs-data: %s '%s' (environment variable for --%s): %s\n", o.env, v, o.flag,
                why);
        fprintf(stderr, "run `hs-data --help` for usage and examples\n");
        return 2;
    }
    return 0;
}

/* ---- commands --------------------------------------------------------------- */

/* Progress of import and info on stderr, when it is a terminal: one line
 * redrawn at most 4 times a second, erased before the result is printed. */
typedef struct {
    bool tty;
    double t0, stage_t0, last;
    const char *cmd, *stage;
} progress_t;

static void progress_cb(void *arg, const char *stage, uint64_t done, uint64_t total, uint64_t seqs)
{
    progress_t *p = arg;
    if (!p->tty) return;
    double now = hs_now_s();
    if (!p->stage || strcmp(p->stage, stage) != 0) {
        p->stage = stage;
        p->stage_t0 = now;
    } else if (now - p->last < 0.25) {
        return;
    }
    p->last = now;
    double in_stage = now - p->stage_t0, rate = in_stage > 0 ? (double)done / in_stage : 0;
    char eta[32] = "";
    if (rate > 0 && done < total)
        snprintf(eta, sizeof(eta), ", %.0f s left", (double)(total - done) / rate);
    char seqs_text[48] = "";
    if (seqs) snprintf(seqs_text, sizeof(seqs_text), ", %" PRIu64 " sequences", seqs);
    fprintf(stderr, "\r\033[K%s: %s %.2f/%.2f GB (%.0f%%), %.0f MB/s%s%s, %.0f s", p->cmd, stage,
            (double)done / 1e9, (double)total / 1e9,
            total ? 100.0 * (double)done / (double)total : 100.0, rate / 1e6, seqs_text, eta,
            now - p->t0);
    fflush(stderr);
}

static void progress_end(progress_t *p)
{
    if (p->tty && p->stage) fprintf(stderr, "\r\033[K");
}

static double file_gb(const char *path)
{
    struct stat sb;
    return stat(path, &sb) == 0 ? (double)sb.st_size / 1e9 : 0.0;
}

static int cmd_import(const char *in, const char *out)
{
    progress_t p = {.tty = isatty(STDERR_FILENO), .t0 = hs_now_s(), .cmd = "hs-data import"};
    hs_dataset_summary_t s;
    double gb = file_gb(in);
    hs_status_t st = hs_dataset_import(in, out, progress_cb, &p, &s);
    progress_end(&p);
    if (st != HS_OK) return 1;
    double took = hs_now_s() - p.t0;
    printf("wrote %s: %" PRIu64 " sequences, %" PRIu64 " tokens, fingerprint %016" PRIx64
           " in %.2f s (%.2f GB read, %.0f MB/s)\n",
           out, s.n, s.total, s.fingerprint, took, gb, took > 0 ? gb * 1e3 / took : 0.0);
    return 0;
}

static int cmd_info(const char *path)
{
    progress_t p = {.tty = isatty(STDERR_FILENO), .t0 = hs_now_s(), .cmd = "hs-data info"};
    hs_dataset_summary_t s;
    double gb = file_gb(path);
    hs_status_t st = hs_dataset_summarize(path, progress_cb, &p, &s);
    progress_end(&p);
    if (st != HS_OK) return 1;
    double took = hs_now_s() - p.t0;
    uint64_t n = s.n, total = s.total;
    printf("file          %s\n", path);
    printf("format        %s\n", s.format == HS_DATASET_HST ? "hst" : "jsonl");
    printf("sequences     %" PRIu64 "\n", n);
    printf("tokens        %" PRIu64 "\n", total);
    printf("length        min %" PRIu32 ", mean %.1f, max %" PRIu32 "\n", s.min_len,
           (double)total / (double)n, s.max_len);
    printf("loss tokens   %" PRIu64 " (%.1f%% of tokens have loss_mask 1)\n", s.loss,
           100.0 * (double)s.loss / (double)total);
    printf("fingerprint   %016" PRIx64 "\n", s.fingerprint);
    printf("read in       %.2f s (%.2f GB, %.0f MB/s)\n", took, gb,
           took > 0 ? gb * 1e3 / took : 0.0);
    printf("lengths:\n");
    for (int b = 0; b < 33; b++) {
        if (!s.hist[b]) continue;
        uint64_t lo = 1ull << b, hi = (2ull << b) - 1;
        printf("  %8" PRIu64 "..%-8" PRIu64 " %10" PRIu64 " sequences (%5.1f%%)\n", lo, hi,
               s.hist[b], 100.0 * (double)s.hist[b] / (double)n);
    }
    return 0;
}

/* The layout --hidden-size and --layers give, as --expect-layout takes it,
 * into buf; "" when neither is given. 2 (message printed) when only one is
 * or they are not a valid layout. */
static int pin_layout(const plan_opts_t *o, char *buf, size_t cap)
{
    buf[0] = 0;
    if (!o->hidden_size && !o->layers) return 0;
    if (!o->hidden_size || !o->layers)
        return die_usage("%s: give --hidden-size and --layers together%s (they print the "
                         "--expect-layout of the run)",
                         o->layers ? "--layers" : "--hidden-size", "");
    char spec[512], why[160];
    snprintf(spec, sizeof(spec), "H=%" PRIu32 ",layers=%s,dtype=bf16", o->hidden_size, o->layers);
    hs_layout_t l;
    if (hs_layout_parse(spec, &l, why, sizeof(why)) != HS_OK)
        return die_usage("--layers %s: %s", o->layers, why);
    hs_layout_spec(&l, buf, cap);
    return 0;
}

static int cmd_plan(const char *path, const plan_opts_t *o)
{
    hs_dataset_t *ds = NULL;
    hs_plan_t *plan = NULL;
    uint32_t *order = NULL;
    int rc = 1;
    char layout[512];
    if (pin_layout(o, layout, sizeof(layout))) return 2;
    if (hs_dataset_open(path, &ds) != HS_OK) return 1;
    double t0 = hs_now_s();
    if (hs_plan_build(ds, &o->plan, &plan) != HS_OK) goto out;
    double took = hs_now_s() - t0;
    hs_plan_stats_t s;
    hs_plan_stats(plan, &s);
    const hs_plan_config_t *c = hs_plan_config(plan);

    printf("dataset       %s (%" PRIu64 " sequences, %" PRIu64 " tokens, fingerprint %016" PRIx64
           ")\n",
           path, s.n_samples, hs_dataset_total_tokens(ds), hs_dataset_fingerprint(ds));
    printf("config        token budget %" PRIu32 ", max seq len %" PRIu32
           ", overflow %s, seed %" PRIu64 "\n",
           c->token_budget, c->max_seq_len, hs_overflow_str(c->overflow), c->seed);
    printf("batches       %" PRIu32 " per epoch (planned in %.3f s)\n", s.n_batches, took);
    printf("fill          mean %.2f%%, batch tokens min %" PRIu32 " max %" PRIu32 "\n",
           s.mean_fill_pct, s.min_batch_tokens, s.max_batch_tokens);
    printf("kept          %" PRIu64 " sequences, %" PRIu64 " tokens per epoch\n", s.n_kept,
           s.tokens);
    printf("truncated     %" PRIu64 " sequences\n", s.n_truncated);
    printf("dropped       %" PRIu64 " sequences\n", s.n_dropped);
    printf("tokens lost   %" PRIu64 " (%.2f%%) to truncation and dropping\n", s.tokens_dropped,
           100.0 * (double)s.tokens_dropped / (double)hs_dataset_total_tokens(ds));
    hs_plan_warn_lost(plan, path);
    printf("plan hash     %016" PRIx64 "\n", hs_plan_hash(plan));
    /* What pins a consumer to this run, in the form its flags take. */
    printf("pin           --expect-plan %016" PRIx64 " --expect-dataset %016" PRIx64 "%s%s\n",
           hs_plan_hash(plan), hs_dataset_fingerprint(ds), *layout ? " --expect-layout " : "",
           layout);

    /* batch shapes, bucketed by sequences per batch (powers of two) */
    struct {
        uint64_t batches, tokens;
        uint32_t max_tokens, longest;
    } sh[33] = {{0}};
    for (uint32_t b = 0; b < s.n_batches; b++) {
        hs_plan_batch_t pb;
        if (hs_plan_batch(plan, b, &pb) != HS_OK) goto out;
        int k = 31 - __builtin_clz(pb.n_seqs);
        sh[k].batches++;
        sh[k].tokens += pb.n_tokens;
        if (pb.n_tokens > sh[k].max_tokens) sh[k].max_tokens = pb.n_tokens;
        if (pb.lengths[0] > sh[k].longest) sh[k].longest = pb.lengths[0];
    }
    printf("batch shapes (sequences per batch):\n");
    printf("  %-13s %9s %7s %12s %11s %12s\n", "sequences", "batches", "share", "mean tokens",
           "max tokens", "longest seq");
    for (int k = 0; k < 33; k++) {
        if (!sh[k].batches) continue;
        char range[32];
        uint64_t lo = 1ull << k, hi = (2ull << k) - 1;
        if (lo == hi)
            snprintf(range, sizeof(range), "%" PRIu64, lo);
        else
            snprintf(range, sizeof(range), "%" PRIu64 "..%" PRIu64, lo, hi);
        printf("  %-13s %9" PRIu64 " %6.1f%% %12.1f %11" PRIu32 " %12" PRIu32 "\n", range,
               sh[k].batches, 100.0 * (double)sh[k].batches / s.n_batches,
               (double)sh[k].tokens / (double)sh[k].batches, sh[k].max_tokens, sh[k].longest);
    }

    order = malloc((size_t)s.n_batches * sizeof(uint32_t));
    if (!order) goto out;
    for (uint32_t e = 0; e < o->epochs; e++) {
        hs_plan_epoch_order(plan, e, order);
        printf("epoch %-7" PRIu32 " order:", e);
        uint32_t show = s.n_batches < 16 ? s.n_batches : 16;
        for (uint32_t i = 0; i < show; i++)
            printf(" %" PRIu32, order[i]);
        printf("%s\n", show < s.n_batches ? " ..." : "");
    }
    rc = 0;
out:
    free(order);
    hs_plan_destroy(plan);
    hs_dataset_close(ds);
    return rc;
}

static int cmd_synth(const char *path, const synth_opts_t *o)
{
    uint64_t min_len = o->min_len, max_len = o->max_len, vocab = o->vocab;
    if (min_len > max_len) {
        fprintf(stderr,
                "hs-data: --min-len %" PRIu64 " is above --max-len %" PRIu64 "; give min <= max\n",
                min_len, max_len);
        return 2;
    }
    size_t plen = strlen(path);
    char *tmp = malloc(plen + 16);
    if (!tmp) return 1;
    snprintf(tmp, plen + 16, "%s.tmp.XXXXXX", path);
    int fd = mkstemp(tmp);
    if (fd >= 0) (void)fchmod(fd, 0644); /* mkstemp makes 0600; datasets are shared */
    FILE *f = fd >= 0 ? fdopen(fd, "w") : NULL;
    if (!f) {
        hs_error("%s: cannot create %s: %m; check the folder exists and is writable", path, tmp);
        if (fd >= 0) close(fd);
        free(tmp);
        return 1;
    }
    uint64_t rng = o->seed ^ 0x5EEDDA7A5EEDDA7Aull, total = 0;
    for (uint32_t i = 0; i < o->sequences; i++) {
        uint64_t len = min_len + hs_splitmix64(&rng) % (max_len - min_len + 1);
        /* a prompt of up to half the sequence carries no loss, like chat data */
        uint64_t prompt = hs_splitmix64(&rng) % (len / 2 + 1);
        fputs("{\"input_ids\":[", f);
        for (uint64_t t = 0; t < len; t++)
            fprintf(f, t ? ",%" PRIu64 : "%" PRIu64, hs_splitmix64(&rng) % vocab);
        fputs("],\"loss_mask\":[", f);
        for (uint64_t t = 0; t < len; t++)
            fputs(t ? (t < prompt ? ",0" : ",1") : (t < prompt ? "0" : "1"), f);
        fputs("]}\n", f);
        total += len;
    }
    int bad = ferror(f) | (fflush(f) != 0) | (fsync(fileno(f)) != 0);
    bad |= fclose(f) != 0;
    if (bad || rename(tmp, path) != 0) {
        hs_error("%s: write failed: %m; check free disk space", path);
        unlink(tmp);
        free(tmp);
        return 1;
    }
    free(tmp);
    printf("wrote %s: %" PRIu32 " sequences, %" PRIu64 " tokens (lengths %" PRIu64 "..%" PRIu64
           ", vocab %" PRIu64 ", seed %" PRIu64 ")\n",
           path, o->sequences, total, min_len, max_len, vocab, o->seed);
    return 0;
}

/* hs-data COMMAND's getopt table: -h/--help, the command's table, every
 * command's; false when it does not fit. */
static bool long_options_make(const command_t *cmd, struct option *lo, size_t cap)
{
    size_t n = 0;
    lo[n++] = (struct option){"help", no_argument, NULL, 'h'};
    if (cmd->table && !hs_cli_options_add(cmd->table, lo, &n, cap - 1)) return false;
    if (!hs_cli_options_add(&common_options, lo, &n, cap - 1)) return false;
    lo[n] = (struct option){NULL, 0, NULL, 0};
    return true;
}

int main(int argc, char **argv)
{
    if (hs_cli_wants_version(argc, argv)) {
        hs_version_print(stdout, "hs-data");
        return 0;
    }
    hs_log_set_tag("hs-data");
    if (argc < 2) {
        usage(stderr, NULL);
        return 2;
    }
    const char *cmd_name = argv[1];
    if (!strcmp(cmd_name, "-h") || !strcmp(cmd_name, "--help") || !strcmp(cmd_name, "help")) {
        usage(stdout, NULL);
        return 0;
    }
    if (!strcmp(cmd_name, "--help-markdown")) {
        markdown(stdout);
        return 0;
    }
    const command_t *cmd = NULL;
    for (size_t i = 0; i < N_COMMANDS; i++)
        if (!strcmp(cmd_name, commands[i].name)) cmd = &commands[i];
    if (!cmd)
        return die_usage("unknown command '%s'%s; use import, info, plan or synth", cmd_name, "");

    opts_t o;
    hs_opt_table_defaults(&plan_table, &o.plan, sizeof(o.plan)); /* o.plan.plan zeroed, then */
    hs_plan_config_default(&o.plan.plan);
    hs_opt_table_defaults(&synth_table, &o.synth, sizeof(o.synth));
    hs_opt_table_defaults(&common_table, &o.common, sizeof(o.common));
    void *cfg = (char *)&o + cmd->at;

    /* the environment first (only this command's options), then the
     * command line, which wins */
    if (cmd->table && options_from_env(cmd->table, cfg)) return 2;
    if (options_from_env(&common_options, &o.common)) return 2;
    struct option long_opts[64];
    if (!long_options_make(cmd, long_opts, sizeof(long_opts) / sizeof(long_opts[0]))) {
        fprintf(stderr, "hs-data: more options than its getopt table holds\n");
        return 2;
    }
    opterr = 0;
    optind = 2;
    int c;
    while ((c = getopt_long(argc, argv, ":h", long_opts, NULL)) != -1) {
        if (c == 'h') {
            usage(stdout, cmd);
            return 0;
        }
        if (c == '?') {
            const char *owner = flag_owner(argv[optind - 1], cmd);
            if (owner) return die_usage("--%s does not apply to '%s'", owner, cmd_name);
            return die_usage("unknown option '%s'%s", argv[optind - 1], "");
        }
        if (c == ':') return die_usage("option '%s' needs a value%s", argv[optind - 1], "");
        int rc = cmd->table ? hs_cli_options_apply(cmd->table, cfg, c, optarg, "command line") : -1;
        if (rc < 0)
            rc = hs_cli_options_apply(&common_options, &o.common, c, optarg, "command line");
        if (rc) {
            fprintf(stderr, "run `hs-data --help` for usage and examples\n");
            return 2;
        }
    }
    hs_log_set_level((hs_log_level_t)o.common.log_level);
    int npos = argc - optind;
    char **pos = argv + optind;
    if (npos != cmd->n_operands)
        return die_usage("wrong number of arguments; usage: hs-data %s %s [OPTIONS]", cmd->name,
                         cmd->operands);
    if (!strcmp(cmd->name, "import")) return cmd_import(pos[0], pos[1]);
    if (!strcmp(cmd->name, "info")) return cmd_info(pos[0]);
    if (!strcmp(cmd->name, "plan")) {
        const hs_plan_config_t *p = &o.plan.plan;
        if (!p->token_budget)
            return die_usage("plan needs --token-budget N (or HS_TOKEN_BUDGET), e.g. %s%s",
                             "--token-budget 64K", "");
        if (p->max_seq_len > p->token_budget) {
            fprintf(stderr,
                    "hs-data: --max-seq-len %" PRIu32 " is above --token-budget %" PRIu32
                    "; a sequence must fit one batch\n",
                    p->max_seq_len, p->token_budget);
            return 2;
        }
        return cmd_plan(pos[0], &o.plan);
    }
    if (!o.synth.sequences)
        return die_usage("synth needs --sequences N (or HS_SEQUENCES), e.g. %s%s",
                         "--sequences 10000", "");
    return cmd_synth(pos[0], &o.synth);
}
