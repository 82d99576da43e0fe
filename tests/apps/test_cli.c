/* SPDX-License-Identifier: Apache-2.0 */
/* test_cli - the commands' shared command line (apps/hs_cli.h): HS_*
 * variables for every flag, the command line winning, --help and mistakes
 * answered with main's exit status, --version found before "--". */
#include <check.h>
#include <getopt.h>
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
    tcase_add_test(tc, version_is_asked_only_before_a_double_dash);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
