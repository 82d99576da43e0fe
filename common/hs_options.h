/* SPDX-License-Identifier: Apache-2.0 */
/* hs_options.h - the machinery of an option table: a module's settings as
 * rows (name, type, place in its config struct, default, bounds, unit,
 * flag, metavar, help), and what every table does with them: the defaults,
 * setting one by name from text, the bounds check of a whole config, and
 * hs_option_info_t (hsflow.h) for the commands' --help and docs/cli.md.
 * consumer/options.c, producer/options.c (hs-producer's table and the
 * library producer's, hs_producer_client_config_t) and data/options.c hold
 * the tables.
 *
 * Ownership: rows and tables are static; a string option keeps the
 * caller's pointer. Nothing allocates; nothing is logged except by
 * hs_opt_table_set without a `why` buffer. */
#ifndef HS_OPTIONS_H
#define HS_OPTIONS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "hsflow.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    HS_OPT_BOOL,   /* bool; with .choices "a|b", a is false and b true */
    HS_OPT_U32,    /* uint32_t */
    HS_OPT_SIZE,   /* uint32_t, with K, M, G suffixes (hs_parse_size) */
    HS_OPT_U64,    /* uint64_t */
    HS_OPT_INT,    /* int */
    HS_OPT_DOUBLE, /* double */
    HS_OPT_GIB,    /* a uint64_t of bytes, given in GiB (a double) */
    HS_OPT_STRING, /* const char *, the caller's */
    HS_OPT_ENUM,   /* an int enum: choices[i] is values[i] */
} hs_opt_type_t;

/* A string's form beyond "any text": NULL, or why it is not that form. */
typedef const char *(*hs_opt_check_fn)(const char *value, char *why, size_t cap);
/* A value read by the row itself into the config at `cfg` (wherever it
 * lands there): NULL, cfg written; or why not, cfg unchanged. */
typedef const char *(*hs_opt_parse_fn)(void *cfg, const char *value, char *why, size_t cap);

typedef struct {
    const char *name;
    hs_opt_type_t type;
    size_t at; /* offset of its field in the config struct */
    const char *dflt;
    double min, max;
    const char *unit, *flag, *metavar, *help;
    /* optional */
    bool min_open;
    const char *choices;   /* "a|b": HS_OPT_ENUM, HS_OPT_BOOL, HS_OPT_STRING */
    int values[4];         /* HS_OPT_ENUM: the value of each choice */
    hs_opt_check_fn check; /* HS_OPT_STRING */
    hs_opt_parse_fn parse; /* reads the text instead of the type's parser */
    bool shared_flag;      /* the command parses it with its network flags */
    /* A value outside the bounds the option may hold ("none" for -1, or 0
     * for "not set"): word_value, spelled `word` in text ("" = it cannot
     * be given, only left at its default). */
    const char *word;
    double word_value;
} hs_opt_t;

#define HS_OPT_ENV_CAP 64

/* A table: its rows, and room for each row's environment variable. */
typedef struct {
    const char *owner; /* "consumer": logged messages start with it */
    const hs_opt_t *opts;
    size_t n;
    char (*envs)[HS_OPT_ENV_CAP]; /* n of them, filled once by hs_opt_table_info */
    bool envs_made;
} hs_opt_table_t;

/* An entry: the columns every option has, then those it needs of the
 * optional ones (.min_open, .choices, .values, .check, .parse,
 * .shared_flag, .word, .word_value). */
#define HS_OPT(name_, type_, at_, dflt_, min_, max_, unit_, flag_, metavar_, help_, ...)           \
    {                                                                                              \
        .name = name_, .type = type_, .at = at_, .dflt = dflt_, .min = min_, .max = max_,          \
        .unit = unit_, .flag = flag_, .metavar = metavar_, .help = help_, __VA_ARGS__              \
    }

/* Row i as hs_option_info_t: HS_ERR_INVALID when i is past the end. Its env
 * is HS_ and the flag in capitals, '-' as '_' ("" without a flag). */
HS_MUST_CHECK hs_status_t hs_opt_table_info(hs_opt_table_t *t, uint32_t i, hs_option_info_t *out);

/* Every row at its default; the rest of cfg (cfg_size bytes) zero. */
void hs_opt_table_defaults(const hs_opt_table_t *t, void *cfg, size_t cfg_size);

/* Sets the row `name` of cfg from its text, checked against its type and
 * bounds: HS_OK, or HS_ERR_INVALID with why[why_cap] saying what was
 * expected (logged as "OWNER: option NAME 'VALUE': ..." when why is NULL);
 * cfg is then unchanged. */
HS_MUST_CHECK hs_status_t hs_opt_table_set(const hs_opt_table_t *t, void *cfg, const char *name,
                                           const char *value, char *why, size_t why_cap);

/* Every number and choice of cfg within its row's bounds: HS_OK, or
 * HS_ERR_INVALID with why[cap] naming the first that is not
 * ("cache_gb 0.0001: expected GiB from 0.0009765625 to 1048576 (--cache-gb)"). */
HS_MUST_CHECK hs_status_t hs_opt_table_check(const hs_opt_table_t *t, const void *cfg, char *why,
                                             size_t cap);

/* The value of the number or enum row `name` of cfg in its unit (GiB for
 * HS_OPT_GIB); `name` must be a row of that type (asserted). */
double hs_opt_table_get(const hs_opt_table_t *t, const void *cfg, const char *name,
                        hs_opt_type_t type);

#ifdef __cplusplus
}
#endif

#endif /* HS_OPTIONS_H */
