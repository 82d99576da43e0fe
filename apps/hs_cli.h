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

#ifdef __cplusplus
}
#endif
#endif /* HS_CLI_H */
