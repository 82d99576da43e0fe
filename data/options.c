/* SPDX-License-Identifier: Apache-2.0 */
/* options.c - the batch plan's option table: one entry per setting of
 * hs_plan_config_t, with its type, default, bounds, unit, flag and help.
 * hs_plan_config_default's defaults, the bounds hs_plan_build holds a
 * config to, and hs-data plan's flags, --help and part of docs/cli.md come
 * from it (through hs_plan_option_info); the machinery of a table is
 * common/hs_options.h. hs_plan_build also holds the check between options
 * (max_seq_len <= token_budget). */
#include "hs_data.h"

#include "dataset_int.h" /* hs__plan_config_check */
#include "hs_options.h"
#include "hs_parse.h"

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* "0 = none" on the command line; negative in the config (0 there is 5). */
static const char *parse_progress_interval(void *cfg, const char *v, char *why, size_t cap)
{
    double d;
    if (hs_parse_double(v, &d) != HS_OK || !(d >= 0) || d > 1e6) {
        snprintf(why, cap, "expected seconds from 0 to 1000000 (0 = no progress lines)");
        return why;
    }
    ((hs_plan_config_t *)cfg)->progress_interval_s = d > 0 ? d : -1;
    return NULL;
}

#define FIELD(f) offsetof(hs_plan_config_t, f)

/* clang-format off */
static const hs_opt_t options[] = {
    /* name, type, where, default, min, max, unit, flag, metavar, help */
    HS_OPT("token_budget", HS_OPT_SIZE, FIELD(token_budget), "", 1, INT32_MAX, "tokens",
     "token-budget", "N", "tokens per batch (required; K/M suffixes, e.g. 64K)"),
    HS_OPT("max_seq_len", HS_OPT_SIZE, FIELD(max_seq_len), "", 1, INT32_MAX, "tokens",
     "max-seq-len", "M", "longest sequence kept whole (unset: the token budget)", .word = ""),
    HS_OPT("overflow", HS_OPT_ENUM, FIELD(overflow), "truncate", 0, 0, "", "overflow",
     "truncate|drop", "what to do with longer sequences: keep their first M tokens "
     "(truncate) or leave them out (drop)",
     .choices = "truncate|drop", .values = {HS_OVERFLOW_TRUNCATE, HS_OVERFLOW_DROP}),
    HS_OPT("seed", HS_OPT_U64, FIELD(seed), "0", 0, 18446744073709551615.0, "", "seed", "S",
     "seed of the per-epoch batch order"),
    HS_OPT("progress_interval_s", HS_OPT_DOUBLE, FIELD(progress_interval_s), "5", 0, 1e6, "s",
     "status-interval", "S",
     "a progress line every S seconds while a large plan is built; 0 = none",
     .parse = parse_progress_interval, .word = "", .word_value = -1),
};
/* clang-format on */

#define N_OPTIONS (sizeof(options) / sizeof(options[0]))

static char envs[N_OPTIONS][HS_OPT_ENV_CAP];
static hs_opt_table_t table = {"plan", options, N_OPTIONS, envs, false};

uint32_t hs_plan_option_count(void) { return (uint32_t)N_OPTIONS; }

hs_status_t hs_plan_option_info(uint32_t i, hs_option_info_t *out)
{
    return hs_opt_table_info(&table, i, out);
}

void hs_plan_config_default(hs_plan_config_t *cfg)
{
    hs_opt_table_defaults(&table, cfg, sizeof(*cfg));
}

hs_status_t hs_plan_config_set(hs_plan_config_t *cfg, const char *name, const char *value,
                               char *why, size_t why_cap)
{
    return hs_opt_table_set(&table, cfg, name, value, why, why_cap);
}

hs_status_t hs__plan_config_check(const hs_plan_config_t *cfg, char *why, size_t cap)
{
    return hs_opt_table_check(&table, cfg, why, cap);
}
