/* SPDX-License-Identifier: Apache-2.0 */
/* test_cli - the commands' shared command line (apps/hs_cli.h): HS_*
 * variables for every flag, the command line winning, --help and mistakes
 * answered with main's exit status, --version found before "--". */
#include <check.h>
#include <getopt.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hs_cli.h"

START_TEST(flags_map_to_hs_environment_variables)
{
    setenv("HS_CACHE_GB", "12", 1);
    ck_assert_str_eq(hs_env_for_flag("cache-gb"), "12");
    unsetenv("HS_CACHE_GB");
    ck_assert_ptr_null(hs_env_for_flag("cache-gb"));
}
END_TEST

/* hs_cli_parse_flags: a flag from HS_* unless the command line gives it,
 * --help and mistakes answered with the exit status main returns. */
static int usage_out, usage_err;
static void count_usage(FILE *out) { *(out == stdout ? &usage_out : &usage_err) += 1; }
static int apply_name(void *ctx, int opt, const char *arg, const char *from)
{
    ck_assert_int_ne(opt, 'h'); /* --help is hs_cli_parse_flags' own */
    if (!strcmp(arg, "bad")) return hs_cli_bad("test", "name", arg, from, "not bad");
    *(const char **)ctx = arg;
    return 0;
}

START_TEST(cli_flags_take_the_environment_answer_help_and_refuse_operands)
{
    static const struct option opts[] = {
        {"name", required_argument, 0, 'n'}, {"help", no_argument, 0, 'h'}, {0, 0, 0, 0}};
    char prog[] = "prog", name[] = "--name", cli[] = "cli", bad[] = "bad", help[] = "--help",
         extra[] = "extra";
    const char *got = NULL;
    setenv("HS_NAME", "env", 1);
    char *only_env[] = {prog, NULL};
    ck_assert_int_eq(hs_cli_parse_flags(1, only_env, opts, apply_name, &got, "prog", count_usage),
                     -1);
    ck_assert_str_eq(got, "env");
    char *both[] = {prog, name, cli, NULL};
    ck_assert_int_eq(hs_cli_parse_flags(3, both, opts, apply_name, &got, "prog", count_usage), -1);
    ck_assert_str_eq(got, "cli");
    unsetenv("HS_NAME");
    ck_assert_int_eq(usage_out + usage_err, 0);
    char *asks_help[] = {prog, help, NULL};
    ck_assert_int_eq(hs_cli_parse_flags(2, asks_help, opts, apply_name, &got, "prog", count_usage),
                     0);
    ck_assert_int_eq(usage_out, 1);
    char *bad_value[] = {prog, name, bad, NULL};
    ck_assert_int_eq(hs_cli_parse_flags(3, bad_value, opts, apply_name, &got, "prog", count_usage),
                     2);
    char *operand[] = {prog, extra, NULL};
    ck_assert_int_eq(hs_cli_parse_flags(2, operand, opts, apply_name, &got, "prog", count_usage),
                     2);
    ck_assert_int_eq(usage_err, 2);
}
END_TEST

/* hs_cli_parse_table: each kind stores where its flag says, the environment
 * first, and a bad value of an HS_CLI_FN flag is a mistake (exit status 2). */
static int parse_pair(void *dst, const char *arg)
{
    int *p = dst;
    return sscanf(arg, "%d/%d", &p[0], &p[1]) != 2;
}

START_TEST(cli_table_stores_each_kind)
{
    const char *name = NULL, *script = "default";
    int iters = 0, pair[2] = {0, 0};
    double peak = 0;
    bool only = false;
    const hs_cli_flag_t flags[] = {HS_CLI_STR("name", &name),
                                   HS_CLI_INT("iters", &iters),
                                   HS_CLI_DOUBLE("peak", &peak),
                                   HS_CLI_TRUE("only", &only),
                                   HS_CLI_CLEAR("no-script", &script),
                                   HS_CLI_FN("pair", parse_pair, pair, "NK/NV"),
                                   {0}};
    char prog[] = "prog", n[] = "--name", nv[] = "cli", i[] = "--iters", iv[] = "7", p[] = "--peak",
         pv[] = "2.5", o[] = "--only", ns[] = "--no-script", pr[] = "--pair", prv[] = "16/48",
         bad[] = "16";
    setenv("HS_NAME", "env", 1);
    setenv("HS_ITERS", "3", 1);
    char *env_only[] = {prog, NULL};
    ck_assert_int_eq(hs_cli_parse_table(1, env_only, flags, "prog", count_usage), -1);
    ck_assert_str_eq(name, "env");
    ck_assert_int_eq(iters, 3);
    char *all[] = {prog, n, nv, i, iv, p, pv, o, ns, pr, prv, NULL};
    ck_assert_int_eq(hs_cli_parse_table(11, all, flags, "prog", count_usage), -1);
    unsetenv("HS_NAME");
    unsetenv("HS_ITERS");
    ck_assert_str_eq(name, "cli");
    ck_assert_int_eq(iters, 7);
    ck_assert(peak == 2.5);
    ck_assert(only);
    ck_assert_ptr_null(script);
    ck_assert_int_eq(pair[0], 16);
    ck_assert_int_eq(pair[1], 48);
    int err = usage_err;
    char *bad_pair[] = {prog, pr, bad, NULL};
    ck_assert_int_eq(hs_cli_parse_table(3, bad_pair, flags, "prog", count_usage), 2);
    ck_assert_int_eq(usage_err, err + 1);
}
END_TEST

START_TEST(version_is_asked_only_before_a_double_dash)
{
    char prog[] = "prog", version[] = "--version", dd[] = "--", other[] = "--cache-gb";
    char *asks[] = {prog, other, version, NULL};
    ck_assert(hs_cli_wants_version(3, asks));
    char *after[] = {prog, dd, version, NULL};
    ck_assert(!hs_cli_wants_version(3, after));
    char *none[] = {prog, other, NULL};
    ck_assert(!hs_cli_wants_version(2, none));
}
END_TEST

int main(void)
{
    Suite *s = suite_create("cli");
    TCase *tc = tcase_create("all");
    tcase_add_test(tc, flags_map_to_hs_environment_variables);
    tcase_add_test(tc, cli_flags_take_the_environment_answer_help_and_refuse_operands);
    tcase_add_test(tc, cli_table_stores_each_kind);
    tcase_add_test(tc, version_is_asked_only_before_a_double_dash);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
