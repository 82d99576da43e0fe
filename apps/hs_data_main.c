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
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include "hs_cli.h"
#include "hsflow.h"
#include "hs_log.h"
#include "hs_time.h"
#include "hs_shuffle.h"
#include "hs_parse.h"
#include "hs_version.h"
#include "hs_data.h"
#include "hs_proto.h"

enum { CMD_IMPORT = 1, CMD_INFO = 2, CMD_PLAN = 4, CMD_SYNTH = 8, CMD_ALL = 15 };

enum {
    OPT_TOKEN_BUDGET = 256,
    OPT_MAX_SEQ_LEN,
    OPT_OVERFLOW,
    OPT_SEED,
    OPT_EPOCHS,
    OPT_SEQUENCES,
    OPT_MIN_LEN,
    OPT_MAX_LEN,
    OPT_VOCAB,
    OPT_LOG_LEVEL,
    OPT_STATUS_INTERVAL,
    OPT_HIDDEN_SIZE,
    OPT_LAYERS,
};

static const struct option long_opts[] = {
    {"token-budget", required_argument, NULL, OPT_TOKEN_BUDGET},
    {"max-seq-len", required_argument, NULL, OPT_MAX_SEQ_LEN},
    {"overflow", required_argument, NULL, OPT_OVERFLOW},
    {"seed", required_argument, NULL, OPT_SEED},
    {"epochs", required_argument, NULL, OPT_EPOCHS},
    {"sequences", required_argument, NULL, OPT_SEQUENCES},
    {"min-len", required_argument, NULL, OPT_MIN_LEN},
    {"max-len", required_argument, NULL, OPT_MAX_LEN},
    {"vocab", required_argument, NULL, OPT_VOCAB},
    {"log-level", required_argument, NULL, OPT_LOG_LEVEL},
    {"status-interval", required_argument, NULL, OPT_STATUS_INTERVAL},
    {"hidden-size", required_argument, NULL, OPT_HIDDEN_SIZE},
    {"layers", required_argument, NULL, OPT_LAYERS},
    {"help", no_argument, NULL, 'h'},
    {NULL, 0, NULL, 0},
};

/* Which commands each option applies to (indexed by option - OPT_TOKEN_BUDGET). */
static const int opt_cmds[] = {
    CMD_PLAN,  CMD_PLAN,  CMD_PLAN,  CMD_PLAN | CMD_SYNTH,
    CMD_PLAN,  CMD_SYNTH, CMD_SYNTH, CMD_SYNTH,
    CMD_SYNTH, CMD_ALL,   CMD_PLAN,  CMD_PLAN,
    CMD_PLAN,
};

typedef struct {
    uint64_t token_budget; /* 0 = not given */
    uint64_t max_seq_len;
    hs_overflow_t overflow;
    uint64_t seed;
    uint64_t epochs;
    uint64_t sequences; /* 0 = not given */
    uint64_t min_len, max_len, vocab;
    double status_interval; /* plan progress; 0 = 5 s, < 0 = never */
    uint64_t hidden_size;   /* plan: the producers' layout, for --expect-layout; 0 = not given */
    const char *layers;
} opts_t;

static void usage(FILE *f)
{
    fprintf(
        f,
        "usage: hs-data COMMAND ARGS [OPTIONS]\n"
        "\n"
        "Prepare and inspect the token datasets hsflow producers read.\n"
        "\n"
        "commands:\n"
        "  import IN OUT.hst    convert a dataset (JSONL or .hst) to hsflow's binary .hst\n"
        "                       format; prints sequences, tokens and fingerprint\n"
        "  info FILE            format, sequences, tokens, min/mean/max length, fingerprint\n"
        "  plan FILE            pack FILE into batches as a producer would; prints batches,\n"
        "                       fill, truncated/dropped sequences, plan hash, batch shapes,\n"
        "                       and the hs-consumer flags that pin the run to it\n"
        "  synth OUT.jsonl      write a random JSONL dataset (demos and tests)\n"
        "\n"
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
        "through a link) and writes through a temporary file renamed at the end.\n"
        "\n"
        "plan options:\n"
        "  --token-budget N     tokens per batch (required; K/M suffixes, e.g. 64K)\n"
        "  --max-seq-len M      longest sequence kept whole (default: the token budget)\n"
        "  --overflow P         what to do with longer sequences: truncate (default) or drop\n"
        "  --seed S             seed of the per-epoch batch order (default 0)\n"
        "  --epochs E           show the batch order of the first E epochs (default 1)\n"
        "  --status-interval S  a progress line every S seconds while a large plan is\n"
        "                       built (default 5; 0 = none)\n"
        "  --hidden-size H      the producers' hidden size and captured --layers: with both,\n"
        "  --layers L1,L2,...   the pin line also has --expect-layout\n"
        "synth options:\n"
        "  --sequences N        how many sequences (required)\n"
        "  --min-len A          shortest sequence (default 16)\n"
        "  --max-len B          longest sequence (default 2048)\n"
        "  --seed S             random seed (default 0)\n"
        "  --vocab V            token ids are drawn from 0..V-1 (default 32000)\n"
        "common:\n"
        "  --log-level L        error, warn, info, debug or trace (default info)\n"
        "  -h, --help           this text\n"
        "  --version            the release, git checkout and build options\n"
        "\n"
        "Every option can also come from the environment: --token-budget as\n"
        "HS_TOKEN_BUDGET, --max-seq-len as HS_MAX_SEQ_LEN, and so on; the command line wins.\n"
        "\n"
        "examples:\n"
        "  hs-data synth demo.jsonl --sequences 20000 --min-len 64 --max-len 8192 --seed 1\n"
        "  hs-data import demo.jsonl demo.hst\n"
        "  hs-data info demo.hst\n"
        "  hs-data plan demo.hst --token-budget 64K --max-seq-len 8192 --overflow drop --seed 7\n"
        "  HS_TOKEN_BUDGET=32768 hs-data plan demo.hst --epochs 3\n"
        "  hs-data plan demo.hst --token-budget 64K --hidden-size 4096 --layers 2,16,29\n");
}

static int die_usage(const char *fmt, const char *a, const char *b)
{
    fprintf(stderr, "hs-data: ");
    fprintf(stderr, fmt, a, b);
    fprintf(stderr, "\nrun `hs-data --help` for usage and examples\n");
    return 2;
}

static const char *opt_name(int id)
{
    for (const struct option *o = long_opts; o->name; o++)
        if (o->val == id) return o->name;
    return "?";
}

/* Applies one option value; `src` names where it came from for messages.
 * Returns 0 or 2 (usage error, message printed). */
static int opt_apply(opts_t *o, int id, const char *val, const char *src)
{
    uint64_t v = 0;
    switch (id) {
    case OPT_TOKEN_BUDGET:
    case OPT_MAX_SEQ_LEN:
    case OPT_SEQUENCES:
    case OPT_MIN_LEN:
    case OPT_MAX_LEN:
    case OPT_VOCAB:
        if (hs_parse_size(val, &v) != HS_OK || v == 0 || v > INT32_MAX)
            return die_usage("%s: '%s' is not a count in 1..2147483647 (e.g. 65536 or 64K)", src,
                             val);
        if (id == OPT_TOKEN_BUDGET) o->token_budget = v;
        if (id == OPT_MAX_SEQ_LEN) o->max_seq_len = v;
        if (id == OPT_SEQUENCES) o->sequences = v;
        if (id == OPT_MIN_LEN) o->min_len = v;
        if (id == OPT_MAX_LEN) o->max_len = v;
        if (id == OPT_VOCAB) o->vocab = v;
        return 0;
    case OPT_OVERFLOW:
        if (hs_overflow_parse(val, &o->overflow) != HS_OK)
            return die_usage("%s: '%s' is not an overflow policy; use truncate or drop", src, val);
        return 0;
    case OPT_SEED:
        if (hs_parse_u64(val, &o->seed) != HS_OK)
            return die_usage("%s: '%s' is not an unsigned 64-bit seed", src, val);
        return 0;
    case OPT_EPOCHS:
        if (hs_parse_u64(val, &v) != HS_OK || v == 0 || v > 1000000)
            return die_usage("%s: '%s' is not a number of epochs in 1..1000000", src, val);
        o->epochs = v;
        return 0;
    case OPT_HIDDEN_SIZE:
        if (hs_parse_u64(val, &v) != HS_OK || v == 0 || v > 65536)
            return die_usage("%s: '%s' is not a hidden size in 1..65536", src, val);
        o->hidden_size = v;
        return 0;
    case OPT_LAYERS:
        o->layers = val; /* checked with the hidden size (pin_layout) */
        return 0;
    case OPT_STATUS_INTERVAL: {
        double d;
        if (hs_parse_double(val, &d) != HS_OK || d < 0 || d > 1e6)
            return die_usage("%s: '%s' is not seconds >= 0 (0 = no progress lines)", src, val);
        o->status_interval = d > 0 ? d : -1;
        return 0;
    }
    case OPT_LOG_LEVEL: {
        static const char *names[] = {"error", "warn", "info", "debug", "trace"};
        for (int i = 0; i < 5; i++) {
            if (strcasecmp(val, names[i]) == 0) {
                hs_log_set_level((hs_log_level_t)i);
                return 0;
            }
        }
        return die_usage("%s: '%s' is not a log level; use error, warn, info, debug or trace", src,
                         val);
    }
    }
    return 2;
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
static int pin_layout(const opts_t *o, char *buf, size_t cap)
{
    buf[0] = 0;
    if (!o->hidden_size && !o->layers) return 0;
    if (!o->hidden_size || !o->layers)
        return die_usage("%s: give --hidden-size and --layers together%s (they print the "
                         "--expect-layout of the run)",
                         o->layers ? "--layers" : "--hidden-size", "");
    char spec[512], why[160];
    snprintf(spec, sizeof(spec), "H=%" PRIu64 ",layers=%s,dtype=bf16", o->hidden_size, o->layers);
    hs_layout_t l;
    if (hs_layout_parse(spec, &l, why, sizeof(why)) != HS_OK)
        return die_usage("--layers %s: %s", o->layers, why);
    hs_layout_spec(&l, buf, cap);
    return 0;
}

static int cmd_plan(const char *path, const opts_t *o)
{
    hs_dataset_t *ds = NULL;
    hs_plan_t *plan = NULL;
    uint32_t *order = NULL;
    int rc = 1;
    char layout[512];
    if (pin_layout(o, layout, sizeof(layout))) return 2;
    if (hs_dataset_open(path, &ds) != HS_OK) return 1;
    hs_plan_config_t cfg = {
        .token_budget = (uint32_t)o->token_budget,
        .max_seq_len = (uint32_t)o->max_seq_len,
        .overflow = o->overflow,
        .seed = o->seed,
        .progress_interval_s = o->status_interval,
    };
    double t0 = hs_now_s();
    if (hs_plan_build(ds, &cfg, &plan) != HS_OK) goto out;
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
    uint64_t epochs = o->epochs ? o->epochs : 1;
    for (uint64_t e = 0; e < epochs; e++) {
        hs_plan_epoch_order(plan, (uint32_t)e, order);
        printf("epoch %-7" PRIu64 " order:", e);
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

static int cmd_synth(const char *path, const opts_t *o)
{
    uint64_t min_len = o->min_len ? o->min_len : 16, max_len = o->max_len ? o->max_len : 2048;
    uint64_t vocab = o->vocab ? o->vocab : 32000;
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
    for (uint64_t i = 0; i < o->sequences; i++) {
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
    printf("wrote %s: %" PRIu64 " sequences, %" PRIu64 " tokens (lengths %" PRIu64 "..%" PRIu64
           ", vocab %" PRIu64 ", seed %" PRIu64 ")\n",
           path, o->sequences, total, min_len, max_len, vocab, o->seed);
    return 0;
}

int main(int argc, char **argv)
{
    if (hs_cli_wants_version(argc, argv)) {
        hs_version_print(stdout, "hs-data");
        return 0;
    }
    hs_log_set_tag("hs-data");
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    const char *cmd_name = argv[1];
    int cmd = 0;
    if (!strcmp(cmd_name, "-h") || !strcmp(cmd_name, "--help") || !strcmp(cmd_name, "help")) {
        usage(stdout);
        return 0;
    }
    if (!strcmp(cmd_name, "import"))
        cmd = CMD_IMPORT;
    else if (!strcmp(cmd_name, "info"))
        cmd = CMD_INFO;
    else if (!strcmp(cmd_name, "plan"))
        cmd = CMD_PLAN;
    else if (!strcmp(cmd_name, "synth"))
        cmd = CMD_SYNTH;
    else
        return die_usage("unknown command '%s'%s; use import, info, plan or synth", cmd_name, "");

    opts_t o = {.overflow = HS_OVERFLOW_TRUNCATE, .epochs = 1};
    /* environment first (only options that apply to this command), then the
     * command line, which wins */
    for (const struct option *lo = long_opts; lo->name; lo++) {
        if (lo->val < OPT_TOKEN_BUDGET || !(opt_cmds[lo->val - OPT_TOKEN_BUDGET] & cmd)) continue;
        const char *v = hs_env_for_flag(lo->name);
        if (!v) continue;
        char src[64] = "HS_";
        for (size_t i = 0, j = 3; lo->name[i] && j + 1 < sizeof(src); i++, j++)
            src[j] = lo->name[i] == '-' ? '_' : (char)(lo->name[i] & ~0x20);
        if (opt_apply(&o, lo->val, v, src)) return 2;
    }
    opterr = 0;
    optind = 2;
    int c;
    while ((c = getopt_long(argc, argv, ":h", long_opts, NULL)) != -1) {
        if (c == 'h') {
            usage(stdout);
            return 0;
        }
        if (c == '?') return die_usage("unknown option '%s'%s", argv[optind - 1], "");
        if (c == ':') return die_usage("option '%s' needs a value%s", argv[optind - 1], "");
        if (!(opt_cmds[c - OPT_TOKEN_BUDGET] & cmd))
            return die_usage("--%s does not apply to '%s'", opt_name(c), cmd_name);
        char src[64];
        snprintf(src, sizeof(src), "--%s", opt_name(c));
        if (opt_apply(&o, c, optarg, src)) return 2;
    }
    int npos = argc - optind;
    char **pos = argv + optind;
    int want = cmd == CMD_IMPORT ? 2 : 1;
    if (npos != want) {
        static const char *forms[] = {"", "import IN OUT.hst", "info FILE", "", "plan FILE", "", "",
                                      "", "synth OUT.jsonl"};
        return die_usage("wrong number of arguments; usage: hs-data %s%s", forms[cmd],
                         " [OPTIONS]");
    }
    switch (cmd) {
    case CMD_IMPORT:
        return cmd_import(pos[0], pos[1]);
    case CMD_INFO:
        return cmd_info(pos[0]);
    case CMD_PLAN:
        if (!o.token_budget)
            return die_usage("plan needs --token-budget N (or HS_TOKEN_BUDGET), e.g. %s%s",
                             "--token-budget 64K", "");
        if (o.max_seq_len > o.token_budget) {
            fprintf(stderr,
                    "hs-data: --max-seq-len %" PRIu64 " is above --token-budget %" PRIu64
                    "; a sequence must fit one batch\n",
                    o.max_seq_len, o.token_budget);
            return 2;
        }
        return cmd_plan(pos[0], &o);
    case CMD_SYNTH:
        if (!o.sequences)
            return die_usage("synth needs --sequences N (or HS_SEQUENCES), e.g. %s%s",
                             "--sequences 10000", "");
        return cmd_synth(pos[0], &o);
    }
    return 2;
}
