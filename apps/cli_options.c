/* SPDX-License-Identifier: Apache-2.0 */
/* cli_options.c - a command's flags from a module's option table
 * (hs_cli_options.h): getopt_long entries, parsing through the module's
 * by-name setter, and the --help lines and docs/cli.md rows printed from
 * its option info. */
#include "hs_cli_options.h"
#include "hs_cli.h"

#include <string.h>
#include <stdio.h>

/* The columns of --help: flags from 2, their text from 25, lines up to 92. */
#define HELP_INDENT 25
#define HELP_WIDTH 92

static bool option_parsed_here(const hs_option_info_t *o) { return o->flag[0] && !o->shared_flag; }

bool hs_cli_options_add(const hs_cli_options_t *t, struct option *longopts, size_t *n, size_t cap)
{
    for (uint32_t i = 0; i < t->count(); i++) {
        hs_option_info_t o;
        if (t->info(i, &o) != HS_OK || !option_parsed_here(&o)) continue;
        if (*n >= cap) return false;
        bool is_bool = !strcmp(o.type, "bool");
        longopts[(*n)++] = (struct option){o.flag, is_bool ? no_argument : required_argument, NULL,
                                           HS_CLI_OPTION_BASE + t->offset + (int)i};
    }
    return true;
}

bool hs_cli_options_getopt(const hs_cli_options_t *t, const struct option *own, size_t n_own,
                           struct option *out, size_t cap)
{
    if (cap == 0 || n_own > cap - 1) return false;
    memcpy(out, own, n_own * sizeof(*own));
    size_t n = n_own;
    if (!hs_cli_options_add(t, out, &n, cap - 1)) return false;
    out[n] = (struct option){NULL, 0, NULL, 0};
    return true;
}

int hs_cli_options_apply(const hs_cli_options_t *t, void *cfg, int opt, const char *arg,
                         const char *from)
{
    hs_option_info_t o;
    int base = HS_CLI_OPTION_BASE + t->offset;
    if (opt < base || t->info((uint32_t)(opt - base), &o) != HS_OK) return -1;
    char why[256];
    if (t->set(cfg, o.name, arg ? arg : "1", why, sizeof why) == HS_OK) return 0;
    return hs_cli_bad(t->prog, o.flag, arg, from, why);
}

/* The help of o with its default: "... (default 4)". */
static void help_text(const hs_option_info_t *o, char *buf, size_t cap)
{
    bool show_default = o->default_text[0] && strcmp(o->type, "bool");
    snprintf(buf, cap, "%s%s%s%s", o->help, show_default ? " (default " : "",
             show_default ? o->default_text : "", show_default ? ")" : "");
}

/* Prints text from column `col` on, wrapped at HELP_WIDTH, continuation
 * lines indented to HELP_INDENT. */
static void help_wrap(FILE *out, const char *text, size_t col)
{
    const char *s = text;
    while (*s) {
        size_t room = HELP_WIDTH - col, n = strlen(s);
        if (n > room) { /* break at the last space that fits */
            n = room;
            while (n > 0 && s[n] != ' ')
                n--;
            if (n == 0) n = strcspn(s, " ");
        }
        fprintf(out, "%.*s\n", (int)n, s);
        s += n;
        while (*s == ' ')
            s++;
        if (*s) fprintf(out, "%*s", HELP_INDENT, "");
        col = HELP_INDENT;
    }
}

void hs_cli_options_help(const hs_cli_options_t *t, FILE *out)
{
    for (uint32_t i = 0; i < t->count(); i++) {
        hs_option_info_t o;
        if (t->info(i, &o) != HS_OK || !option_parsed_here(&o)) continue;
        char left[128], text[2048];
        snprintf(left, sizeof left, "--%s%s%s", o.flag, o.metavar[0] ? " " : "", o.metavar);
        help_text(&o, text, sizeof text);
        int w = fprintf(out, "  %-*s ", HELP_INDENT - 3, left);
        if (w > HELP_INDENT) w += fprintf(out, " "); /* a long flag: two spaces before its text */
        help_wrap(out, text, (size_t)w);
    }
}

/* text with '|' escaped, for a Markdown table's cell */
static void md_cell(FILE *out, const char *text)
{
    for (const char *c = text; *c; c++) {
        if (*c == '|') fputc('\\', out);
        fputc(*c, out);
    }
}

/* "1 to 64", "more than 0, at most 1e+09", "" */
static void md_bounds(FILE *out, const hs_option_info_t *o)
{
    if (strcmp(o->type, "u32") && strcmp(o->type, "u64") && strcmp(o->type, "int") &&
        strcmp(o->type, "double")) {
        md_cell(out, o->choices);
        return;
    }
    fprintf(out, "%s%.10g%s%.10g", o->min_open ? "more than " : "", o->min,
            o->min_open ? ", at most " : " to ", o->max);
}

void hs_cli_options_markdown(const hs_cli_options_t *t, const char *intro, FILE *out)
{
    fputs(intro, out);
    fputs("| name (Python, C) | flag | environment | type | default | bounds | what it does |\n"
          "|---|---|---|---|---|---|---|\n",
          out);
    for (uint32_t i = 0; i < t->count(); i++) {
        hs_option_info_t o;
        if (t->info(i, &o) != HS_OK) continue;
        fprintf(out, "| `%s` | ", o.name);
        if (o.flag[0]) {
            fprintf(out, "`--%s%s", o.flag, o.metavar[0] ? " " : "");
            md_cell(out, o.metavar);
            fprintf(out, "`%s", o.shared_flag ? " (shared)" : "");
        }
        fprintf(out, " | %s%s%s | %s%s%s | %s | ", o.env[0] ? "`" : "", o.env, o.env[0] ? "`" : "",
                o.type, o.unit[0] ? ", " : "", o.unit, o.default_text);
        md_bounds(out, &o);
        fputs(" | ", out);
        md_cell(out, o.help);
        fputs(" |\n", out);
    }
}
