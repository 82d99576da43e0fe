/* SPDX-License-Identifier: Apache-2.0 */
/* cli.c - getopt_long with HS_* environment defaults (STYLE: every flag is
 * also settable from the environment; the command line wins), and --version. */
#include "hs_cli.h"

#include <assert.h>
#include <ctype.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

static bool env_true(const char *v)
{
    return !strcmp(v, "1") || !strcasecmp(v, "true") || !strcasecmp(v, "yes");
}

int hs_cli_parse(int argc, char **argv, const char *shortopts, const struct option *longopts,
                 hs_cli_apply_cb apply, void *ctx, int *first_operand)
{
    for (const struct option *o = longopts; o->name; o++) {
        const char *v = hs_env_for_flag(o->name);
        if (!v || o->flag) continue;
        if (o->has_arg == no_argument && !env_true(v)) continue;
        char from[96];
        snprintf(from, sizeof(from), "environment variable for --%s", o->name);
        int rc = apply(ctx, o->val, o->has_arg == no_argument ? NULL : v, from);
        if (rc) return rc;
    }
    optind = 1;
    int c;
    while ((c = getopt_long(argc, argv, shortopts, longopts, NULL)) != -1) {
        if (c == '?' || c == ':') return 2;
        int rc = apply(ctx, c, optarg, "command line");
        if (rc) return rc;
    }
    if (first_operand) *first_operand = optind;
    return 0;
}

int hs_cli_bad(const char *prog, const char *flag, const char *arg, const char *from,
               const char *expect)
{
    fprintf(stderr, "%s: --%s '%s' (%s): %s\n", prog, flag, arg ? arg : "", from, expect);
    return 2;
}

/* hs_cli_parse_flags' wrapper around the program's apply: --help is its own. */
typedef struct {
    hs_cli_apply_cb apply;
    void *ctx;
    void (*usage)(FILE *out);
} cli_flags_t;

enum { CLI_HELP = -1 }; /* apply's stop value after --help (a program's own are > 0) */

static int cli_flags_apply(void *ctx, int opt, const char *arg, const char *from)
{
    cli_flags_t *f = ctx;
    if (opt != 'h') return f->apply(f->ctx, opt, arg, from);
    f->usage(stdout);
    return CLI_HELP;
}

int hs_cli_parse_flags(int argc, char **argv, const struct option *longopts, hs_cli_apply_cb apply,
                       void *ctx, const char *prog, void (*usage)(FILE *out))
{
    cli_flags_t f = {apply, ctx, usage};
    int first = argc;
    int rc = hs_cli_parse(argc, argv, "h", longopts, cli_flags_apply, &f, &first);
    if (rc == CLI_HELP) return 0;
    if (rc == 0 && first >= argc) return -1;
    if (rc == 0) fprintf(stderr, "%s: unexpected argument '%s'\n", prog, argv[first]);
    usage(stderr);
    return 2;
}

/* hs_cli_parse_table's apply: a flag's getopt value is 256 + its index. */
typedef struct {
    const hs_cli_flag_t *flags;
    const char *prog;
} cli_table_t;

static int cli_table_apply(void *ctx, int opt, const char *arg, const char *from)
{
    const cli_table_t *t = ctx;
    const hs_cli_flag_t *f = &t->flags[opt - 256];
    switch (f->kind) {
    case HS_CLI_KIND_STR:
        *(const char **)f->dst = arg;
        break;
    case HS_CLI_KIND_INT:
        *(int *)f->dst = atoi(arg);
        break;
    case HS_CLI_KIND_DOUBLE:
        *(double *)f->dst = atof(arg);
        break;
    case HS_CLI_KIND_TRUE:
        *(bool *)f->dst = true;
        break;
    case HS_CLI_KIND_CLEAR:
        *(const char **)f->dst = NULL;
        break;
    case HS_CLI_KIND_FN:
        if (f->fn(f->dst, arg)) return hs_cli_bad(t->prog, f->name, arg, from, f->expect);
        break;
    }
    return 0;
}

int hs_cli_parse_table(int argc, char **argv, const hs_cli_flag_t *flags, const char *prog,
                       void (*usage)(FILE *out))
{
    struct option opts[HS_CLI_MAX_FLAGS + 2];
    int n = 0;
    for (; flags[n].name; n++) {
        assert(n < HS_CLI_MAX_FLAGS);
        const bool takes = flags[n].kind != HS_CLI_KIND_TRUE && flags[n].kind != HS_CLI_KIND_CLEAR;
        opts[n] =
            (struct option){flags[n].name, takes ? required_argument : no_argument, 0, 256 + n};
    }
    opts[n] = (struct option){"help", no_argument, 0, 'h'};
    opts[n + 1] = (struct option){0, 0, 0, 0};
    cli_table_t t = {flags, prog};
    return hs_cli_parse_flags(argc, argv, opts, cli_table_apply, &t, prog, usage);
}

const char *hs_env_for_flag(const char *long_name)
{
    char name[96] = "HS_";
    size_t j = 3;
    for (const char *c = long_name; *c && j + 1 < sizeof(name); c++)
        name[j++] = (*c == '-') ? '_' : (char)toupper((unsigned char)*c);
    name[j] = 0;
    const char *v = getenv(name);
    return (v && *v) ? v : NULL;
}

bool hs_cli_wants_version(int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--")) return false;
        if (!strcmp(argv[i], "--version")) return true;
    }
    return false;
}
