/* SPDX-License-Identifier: Apache-2.0 */
/* options.c - the machinery of an option table (hs_options.h): values
 * read from text by type and written at their row's place in a config,
 * bounds, the messages for a value out of them, and hs_option_info_t. */
#include "hs_options.h"

#include "hs_log.h"
#include "hs_parse.h"

#include <assert.h>
#include <ctype.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

static const char *type_name(hs_opt_type_t t)
{
    static const char *names[] = {"bool",   "u32",    "u32",    "u64", "int",
                                  "double", "double", "string", "enum"};
    return names[t];
}

static const hs_opt_t *row_find(const hs_opt_table_t *t, const char *name)
{
    for (size_t i = 0; i < t->n; i++)
        if (!strcmp(t->opts[i].name, name)) return &t->opts[i];
    return NULL;
}

/* The environment variables of every table, made once per table. */
static pthread_mutex_t envs_lock = PTHREAD_MUTEX_INITIALIZER;

static void envs_make(hs_opt_table_t *t)
{
    for (size_t i = 0; i < t->n; i++) {
        const char *flag = t->opts[i].flag;
        char *env = t->envs[i];
        if (!flag[0]) continue;
        size_t j = (size_t)snprintf(env, HS_OPT_ENV_CAP, "HS_");
        for (const char *c = flag; *c && j + 1 < HS_OPT_ENV_CAP; c++)
            env[j++] = *c == '-' ? '_' : (char)toupper((unsigned char)*c);
        env[j] = 0;
    }
}

hs_status_t hs_opt_table_info(hs_opt_table_t *t, uint32_t i, hs_option_info_t *out)
{
    if (i >= t->n || !out) return HS_ERR_INVALID;
    const hs_opt_t *o = &t->opts[i];
    pthread_mutex_lock(&envs_lock);
    if (!t->envs_made) envs_make(t);
    t->envs_made = true;
    pthread_mutex_unlock(&envs_lock);
    *out = (hs_option_info_t){.name = o->name,
                              .type = type_name(o->type),
                              .flag = o->flag,
                              .env = t->envs[i],
                              .metavar = o->metavar,
                              .default_text = o->dflt,
                              .unit = o->unit,
                              .choices = o->choices ? o->choices : "",
                              .help = o->help,
                              .min = o->min,
                              .max = o->max,
                              .min_open = o->min_open,
                              .shared_flag = o->shared_flag};
    return HS_OK;
}

/* ---- values, read and written through the row's place in cfg ---- */

/* A number row's value in its unit (GiB for HS_OPT_GIB); an enum's value. */
static double value_get(const void *cfg, const hs_opt_t *o)
{
    const void *p = (const char *)cfg + o->at;
    uint32_t u;
    int i;
    uint64_t b;
    double d;
    switch (o->type) {
    case HS_OPT_U32:
    case HS_OPT_SIZE:
        memcpy(&u, p, sizeof(u));
        return u;
    case HS_OPT_INT:
    case HS_OPT_ENUM:
        memcpy(&i, p, sizeof(i));
        return i;
    case HS_OPT_U64:
        memcpy(&b, p, sizeof(b));
        return (double)b;
    case HS_OPT_GIB:
        memcpy(&b, p, sizeof(b));
        return (double)b / (double)(1ull << 30);
    case HS_OPT_DOUBLE:
        memcpy(&d, p, sizeof(d));
        return d;
    default:
        return 0;
    }
}

/* Writes the number v (in the row's unit) at the row's place. */
static void value_put(void *cfg, const hs_opt_t *o, double v)
{
    void *p = (char *)cfg + o->at;
    uint32_t u;
    int i;
    uint64_t b;
    switch (o->type) {
    case HS_OPT_U32:
    case HS_OPT_SIZE:
        u = (uint32_t)v;
        memcpy(p, &u, sizeof(u));
        return;
    case HS_OPT_INT:
    case HS_OPT_ENUM:
        i = (int)v;
        memcpy(p, &i, sizeof(i));
        return;
    case HS_OPT_U64:
        b = (uint64_t)v;
        memcpy(p, &b, sizeof(b));
        return;
    case HS_OPT_GIB:
        b = (uint64_t)(v * (double)(1ull << 30));
        memcpy(p, &b, sizeof(b));
        return;
    case HS_OPT_DOUBLE:
        memcpy(p, &v, sizeof(v));
        return;
    default:
        return;
    }
}

/* "from 1 to 64", "more than 0 and at most 1e+09" */
static void bounds_text(const hs_opt_t *o, char *buf, size_t cap)
{
    snprintf(buf, cap, "%s %.10g %s %.10g", o->min_open ? "more than" : "from", o->min,
             o->min_open ? "and at most" : "to", o->max);
}

/* "expected 'arrival' or 'plan'" */
static void choices_text(const char *choices, char *buf, size_t cap)
{
    size_t n = (size_t)snprintf(buf, cap, "expected '");
    for (const char *c = choices; *c && n + 8 < cap; c++) {
        if (*c != '|') {
            buf[n++] = *c;
            continue;
        }
        const char *sep = strchr(c + 1, '|') ? "', '" : "' or '";
        n += (size_t)snprintf(buf + n, cap - n, "%s", sep);
    }
    snprintf(buf + n, cap - n, "'");
}

/* What a row expects: "expected a whole number from 1 to 64". */
static void expect_text(const hs_opt_t *o, char *buf, size_t cap)
{
    char b[96], w[40] = "";
    bounds_text(o, b, sizeof(b));
    if (o->word && o->word[0]) snprintf(w, sizeof(w), "%s or ", o->word);
    if (o->type == HS_OPT_ENUM || (o->type == HS_OPT_BOOL && o->choices)) {
        choices_text(o->choices, buf, cap);
    } else if (o->type == HS_OPT_BOOL) {
        snprintf(buf, cap, "expected 1 or 0 (true/false, yes/no, on/off)");
    } else if (o->type == HS_OPT_SIZE) {
        snprintf(buf, cap, "expected %sa whole number %s%s%s, K and M suffixes allowed (64K)", w, b,
                 o->unit[0] ? " " : "", o->unit);
    } else if (o->type == HS_OPT_U32 || o->type == HS_OPT_INT || o->type == HS_OPT_U64) {
        snprintf(buf, cap, "expected %sa whole number %s%s%s", w, b, o->unit[0] ? " " : "",
                 o->unit);
    } else {
        snprintf(buf, cap, "expected %s%s %s", w, o->unit[0] ? o->unit : "a number", b);
    }
}

/* v within the bounds (or among the choices); the word's value apart */
static bool in_range(const hs_opt_t *o, double v)
{
    if (o->type == HS_OPT_ENUM) {
        size_t n = 1;
        for (const char *c = o->choices; *c; c++)
            n += *c == '|';
        for (size_t i = 0; i < n; i++)
            if (o->values[i] == (int)v) return true;
        return false;
    }
    bool above = o->min_open ? v > o->min : v >= o->min;
    return above && v <= o->max; /* false for NaN */
}

/* v a value the option may hold: in range, or the word's (given as text
 * only by its spelling) */
static bool in_bounds(const hs_opt_t *o, double v)
{
    return (o->word && v == o->word_value) || in_range(o, v);
}

/* The index of `value` among "a|b|c", or -1. */
static int choice_index(const char *choices, const char *value)
{
    size_t len = strlen(value);
    int i = 0;
    for (const char *c = choices; c; i++) {
        const char *end = strchr(c, '|');
        size_t n = end ? (size_t)(end - c) : strlen(c);
        if (n == len && !strncmp(c, value, n)) return i;
        c = end ? end + 1 : NULL;
    }
    return -1;
}

static bool parse_bool(const char *v, bool *out)
{
    static const char *yes[] = {"1", "true", "yes", "on"}, *no[] = {"0", "false", "no", "off"};
    for (size_t i = 0; i < 4; i++) {
        if (!strcasecmp(v, yes[i])) return (*out = true);
        if (!strcasecmp(v, no[i])) return !(*out = false);
    }
    return false;
}

/* Parses `value` by o's type into cfg; false when it does not parse or is
 * out of bounds (why written), cfg unchanged. */
static bool value_set(void *cfg, const hs_opt_t *o, const char *value, char *why, size_t cap)
{
    void *p = (char *)cfg + o->at;
    uint64_t u;
    double d;
    bool ok;
    if (o->parse) return !o->parse(cfg, value, why, cap);
    if (o->word && o->word[0] && !strcmp(value, o->word)) {
        value_put(cfg, o, o->word_value);
        return true;
    }
    switch (o->type) {
    case HS_OPT_BOOL:
        if (o->choices) { /* spelled by two choices: the first false, the second true */
            int i = choice_index(o->choices, value);
            if (i < 0) break;
            ok = i == 1;
        } else if (!parse_bool(value, &ok)) {
            break;
        }
        memcpy(p, &ok, sizeof(ok));
        return true;
    case HS_OPT_STRING:
        if (o->choices && choice_index(o->choices, value) < 0) {
            choices_text(o->choices, why, cap);
            return false;
        }
        if (o->check && o->check(value, why, cap)) return false;
        memcpy(p, &value, sizeof(value));
        return true;
    case HS_OPT_ENUM: {
        int i = choice_index(o->choices, value);
        if (i < 0) break;
        memcpy(p, &o->values[i], sizeof(int));
        return true;
    }
    case HS_OPT_U64: /* beyond a double's 53 bits: written as parsed */
        if (hs_parse_u64(value, &u) != HS_OK || !in_range(o, (double)u)) break;
        memcpy(p, &u, sizeof(u));
        return true;
    case HS_OPT_SIZE:
        if (hs_parse_size(value, &u) != HS_OK || !in_range(o, (double)u)) break;
        value_put(cfg, o, (double)u);
        return true;
    case HS_OPT_U32:
    case HS_OPT_INT:
        if (hs_parse_u64(value, &u) != HS_OK || !in_range(o, (double)u)) break;
        value_put(cfg, o, (double)u);
        return true;
    case HS_OPT_DOUBLE:
    case HS_OPT_GIB:
        if (hs_parse_double(value, &d) != HS_OK || !in_range(o, d)) break;
        value_put(cfg, o, d);
        return true;
    }
    expect_text(o, why, cap);
    return false;
}

hs_status_t hs_opt_table_set(const hs_opt_table_t *t, void *cfg, const char *name,
                             const char *value, char *why, size_t why_cap)
{
    char buf[256];
    if (!why || !why_cap) {
        why = buf;
        why_cap = sizeof(buf);
    }
    const hs_opt_t *o = name ? row_find(t, name) : NULL;
    if (!cfg) {
        snprintf(why, why_cap, "no configuration given (cfg is NULL)");
    } else if (!o) {
        snprintf(why, why_cap, "unknown option '%s': hs_%s_option_info lists them",
                 name ? name : "(null)", t->owner);
    } else if (!value) {
        snprintf(why, why_cap, "no value given");
    } else if (value_set(cfg, o, value, why, why_cap)) {
        return HS_OK;
    }
    if (why == buf)
        hs_error("%s: option %s '%s': %s", t->owner, name ? name : "(null)", value ? value : "",
                 why);
    return HS_ERR_INVALID;
}

void hs_opt_table_defaults(const hs_opt_table_t *t, void *cfg, size_t cfg_size)
{
    memset(cfg, 0, cfg_size);
    for (size_t i = 0; i < t->n; i++) {
        const hs_opt_t *o = &t->opts[i];
        if (!o->dflt[0]) continue; /* zero: false, NULL, 0 */
        char why[256];
        bool ok = value_set(cfg, o, o->dflt, why, sizeof(why));
        assert(ok && "an option's default is within its bounds");
        (void)ok;
    }
}

hs_status_t hs_opt_table_check(const hs_opt_table_t *t, const void *cfg, char *why, size_t cap)
{
    for (size_t i = 0; i < t->n; i++) {
        const hs_opt_t *o = &t->opts[i];
        if (o->type == HS_OPT_BOOL || o->type == HS_OPT_STRING) continue;
        double v = value_get(cfg, o);
        if (in_bounds(o, v)) continue;
        char e[160];
        expect_text(o, e, sizeof(e));
        snprintf(why, cap, "%s %.10g: %s%s%s%s", o->name, v, e, o->flag[0] ? " (--" : "", o->flag,
                 o->flag[0] ? ")" : "");
        return HS_ERR_INVALID;
    }
    return HS_OK;
}

double hs_opt_table_get(const hs_opt_table_t *t, const void *cfg, const char *name,
                        hs_opt_type_t type)
{
    const hs_opt_t *o = row_find(t, name);
    assert(o && o->type == type && "an option of this name and type");
    (void)type;
    return value_get(cfg, o);
}
