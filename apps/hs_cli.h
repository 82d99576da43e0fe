/* SPDX-License-Identifier: Apache-2.0 */
/* hs_cli.h - what every command's main shares on its command line: getopt_long
 * with HS_* environment defaults, --help and --version, and the message for a
 * bad value. The library never sees argv: these live with the commands
 * (apps/), not in libhsflow. */
#ifndef HS_CLI_H
#define HS_CLI_H

#include <stdbool.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

/* True when argv (before a "--") holds --version. Checked before the other
 * options, so that `--version` answers whatever else is given; only the
 * command line asks for it, not HS_VERSION in the environment. */
bool hs_cli_wants_version(int argc, char **argv);

/* Value of flag --foo-bar from the environment as HS_FOO_BAR, or NULL. */
const char *hs_env_for_flag(const char *long_name);

/* getopt_long with environment defaults: first every long option found as
 * HS_<NAME> in the environment (flags without an argument count as given
 * when the variable is 1/true/yes), then argv, so the command line wins.
 * `apply` handles one option (getopt's return value and its argument) and
 * returns 0, or non-zero to stop with that value. Returns 0 on success, 2
 * for an unknown option or missing argument (getopt has printed why), or
 * apply's non-zero value. *first_operand gets optind. */
struct option;
typedef int (*hs_cli_apply_cb)(void *ctx, int opt, const char *arg, const char *from);
int hs_cli_parse(int argc, char **argv, const char *shortopts, const struct option *longopts,
                 hs_cli_apply_cb apply, void *ctx, int *first_operand);
/* For an apply callback's bad value: prints "PROG: --FLAG 'ARG' (FROM):
 * EXPECT" to stderr and returns 2. */
int hs_cli_bad(const char *prog, const char *flag, const char *arg, const char *from,
               const char *expect);
/* hs_cli_parse for a program that takes flags and no operands, with -h and
 * --help (opt 'h', which apply never sees) printing usage to stdout. An
 * unknown flag, a bad value (apply's non-zero) or an operand prints usage to
 * stderr. Returns -1 to go on, else the exit status for main: 0 after
 * --help, 2 after a mistake. */
int hs_cli_parse_flags(int argc, char **argv, const struct option *longopts, hs_cli_apply_cb apply,
                       void *ctx, const char *prog, void (*usage)(FILE *out));

/* A flag of a table-driven command line: what --NAME stores where. Tables
 * are written with the macros below, which check dst's type. */
typedef enum {
    HS_CLI_KIND_STR,    /* const char **: the argument (argv's or the environment's, not copied) */
    HS_CLI_KIND_INT,    /* int *: atoi(argument) */
    HS_CLI_KIND_DOUBLE, /* double *: atof(argument) */
    HS_CLI_KIND_TRUE,   /* bool *: true; takes no argument */
    HS_CLI_KIND_CLEAR,  /* const char **: NULL; takes no argument */
    HS_CLI_KIND_FN,     /* fn(dst, argument): 0, or non-zero for a bad value */
} hs_cli_kind_t;
typedef struct {
    const char *name; /* long name without "--"; NULL ends the table */
    hs_cli_kind_t kind;
    void *dst;
    int (*fn)(void *dst, const char *arg); /* HS_CLI_KIND_FN only */
    const char *expect; /* HS_CLI_KIND_FN only: what a good value is, for "--NAME 'ARG': EXPECT" */
} hs_cli_flag_t;
/* clang-format off */
#define HS_CLI_STR(name, p) {(name), HS_CLI_KIND_STR, (1 ? (p) : (const char **)0), NULL, NULL}
#define HS_CLI_INT(name, p) {(name), HS_CLI_KIND_INT, (1 ? (p) : (int *)0), NULL, NULL}
#define HS_CLI_DOUBLE(name, p) {(name), HS_CLI_KIND_DOUBLE, (1 ? (p) : (double *)0), NULL, NULL}
#define HS_CLI_TRUE(name, p) {(name), HS_CLI_KIND_TRUE, (1 ? (p) : (bool *)0), NULL, NULL}
#define HS_CLI_CLEAR(name, p) {(name), HS_CLI_KIND_CLEAR, (1 ? (p) : (const char **)0), NULL, NULL}
#define HS_CLI_FN(name, fn, p, expect) {(name), HS_CLI_KIND_FN, (p), (fn), (expect)}
/* clang-format on */
#define HS_CLI_MAX_FLAGS 31
/* hs_cli_parse_flags over a table of at most HS_CLI_MAX_FLAGS flags (plus
 * -h/--help, which it adds last): each flag stores into its dst as its kind
 * says, the environment first (HS_<NAME>, in table order), then argv. Same
 * return as hs_cli_parse_flags: -1 to go on, else main's exit status. */
int hs_cli_parse_table(int argc, char **argv, const hs_cli_flag_t *flags, const char *prog,
                       void (*usage)(FILE *out));

#ifdef __cplusplus
}
#endif
#endif /* HS_CLI_H */
