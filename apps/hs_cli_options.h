/* SPDX-License-Identifier: Apache-2.0 */
/* hs_cli_options.h - a command's flags that come from a module's option
 * table (hs_consumer_option_info, hs_producer_option_info): their
 * getopt_long entries, their parsing into the module's config, their
 * --help lines and their rows of docs/cli.md. The command's own flags and
 * the network flags (hs_cli_net.h) stay in its main. Main's thread only. */
#ifndef HS_CLI_OPTIONS_H
#define HS_CLI_OPTIONS_H

#include <getopt.h>
#include <stdbool.h>
#include <stdio.h>

#include "hsflow.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The getopt value of the table's option i is HS_CLI_OPTION_BASE + i
 * (+ the table's offset). */
#define HS_CLI_OPTION_BASE 0x5000

/* A table as a command sees it. */
typedef struct {
    const char *prog; /* "hs-consumer": bad values are printed under it */
    uint32_t (*count)(void);
    hs_status_t (*info)(uint32_t i, hs_option_info_t *out);
    /* the module's by-name setter on the command's config */
    hs_status_t (*set)(void *cfg, const char *name, const char *value, char *why, size_t cap);
    /* option i's getopt value is HS_CLI_OPTION_BASE + offset + i: a command
     * that parses several tables at once gives each its own (0, 256, ...) */
    int offset;
} hs_cli_options_t;

/* Appends the table's flags (those the command parses itself, not the
 * shared network ones) to longopts[*n..cap), advancing *n; false when they
 * do not fit. */
bool hs_cli_options_add(const hs_cli_options_t *t, struct option *longopts, size_t *n, size_t cap);
/* A command's getopt_long table: its own flags (n_own of them), then the
 * table's, then the terminating entry, in out[cap]; false when they do not
 * fit. */
bool hs_cli_options_getopt(const hs_cli_options_t *t, const struct option *own, size_t n_own,
                           struct option *out, size_t cap);
/* One parsed option into cfg: 0 when `opt` is a table flag and its value
 * good, 2 when the value is bad (printed as "PROG: --FLAG 'VALUE' (FROM):
 * what was expected"), -1 when `opt` is not a table flag. A string value is
 * kept as given (argv or the environment). */
int hs_cli_options_apply(const hs_cli_options_t *t, void *cfg, int opt, const char *arg,
                         const char *from);
/* The --help lines of the table's flags, wrapped as the rest of --help. */
void hs_cli_options_help(const hs_cli_options_t *t, FILE *out);
/* A section of docs/cli.md: `intro` (Markdown), then every option of the
 * table, its flag, environment variable, Python keyword, type, default,
 * bounds and help, as a Markdown table. */
void hs_cli_options_markdown(const hs_cli_options_t *t, const char *intro, FILE *out);

#ifdef __cplusplus
}
#endif
#endif /* HS_CLI_OPTIONS_H */
