/* SPDX-License-Identifier: Apache-2.0 */
/* hs_consumer_options_int.h - hs-consumer's flags that come from the
 * consumer's option table (hs_consumer_option_info): their getopt_long
 * entries, their parsing into hs_consumer_config_t, their --help lines and
 * docs/cli.md. The command's own flags (--listen, --loopback, ...) and the
 * network flags it shares with hs-producer stay in hs_consumer_main.c and
 * hs_cli_net.h. Main's thread only. */
#ifndef HS_CONSUMER_OPTIONS_INT_H
#define HS_CONSUMER_OPTIONS_INT_H

#include <getopt.h>
#include <stdio.h>

#include "hsflow.h"

/* The getopt value of the table's option i is HS__CLI_OPTION_BASE + i. */
#define HS__CLI_OPTION_BASE 0x5000

/* Appends the table's flags (those hs-consumer parses itself) to
 * longopts[*n..cap), advancing *n; false when they do not fit. */
bool hs__cli_options_add(struct option *longopts, size_t *n, size_t cap);
/* One parsed option into cfg: 0 when `opt` is a table flag and its value
 * good, 2 when the value is bad (printed as "hs-consumer: --FLAG 'VALUE'
 * (FROM): what was expected"), -1 when `opt` is not a table flag. A string
 * value is kept as given (argv or the environment). */
int hs__cli_options_apply(hs_consumer_config_t *cfg, int opt, const char *arg, const char *from);
/* The --help lines of the table's flags, wrapped as the rest of --help. */
void hs__cli_options_help(FILE *out);
/* docs/cli.md: every option of the table, its flag, environment variable,
 * Python keyword, type, default, bounds and help, as Markdown. */
void hs__cli_options_markdown(FILE *out);

#endif /* HS_CONSUMER_OPTIONS_INT_H */
