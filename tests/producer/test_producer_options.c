/* SPDX-License-Identifier: Apache-2.0 */
/* test_producer_options.c - the producer's option table:
 * hs_producer_config_set for each type, bounds and unknown names refused
 * with the config unchanged, the defaults from the table, and
 * hs_producer_config_check naming the option of each check between
 * options; the library producer's config (hs_producer_client_config_set)
 * from the rows it shares with that table. */
#include <check.h>
#include <stdio.h>
#include <string.h>

#include "hs_producer.h"

static void set_ok(hs_producer_config_t *cfg, const char *name, const char *value)
{
    char why[256] = "";
    ck_assert_msg(hs_producer_config_set(cfg, name, value, why, sizeof why) == HS_OK, "%s=%s: %s",
                  name, value, why);
}

/* set must fail, cfg unchanged, and why must hold `expect` */
static void set_bad(const char *name, const char *value, const char *expect)
{
    hs_producer_config_t cfg, before;
    hs_producer_config_default(&cfg);
    before = cfg;
    char why[256] = "";
    ck_assert_int_eq(hs_producer_config_set(&cfg, name, value, why, sizeof why), HS_ERR_INVALID);
    ck_assert_msg(strstr(why, expect), "%s=%s: '%s' lacks '%s'", name, value, why, expect);
    ck_assert_int_eq(memcmp(&cfg, &before, sizeof cfg), 0);
}

START_TEST(defaults_come_from_the_table)
{
    hs_producer_config_t cfg;
    hs_producer_config_default(&cfg);
    ck_assert_uint_eq(cfg.token_budget, 65536);
    ck_assert_uint_eq(cfg.prefetch, 2);
    ck_assert_uint_eq(cfg.connect_timeout_s, 30);
    ck_assert_int_eq(cfg.source, HS_SOURCE_SYNTHETIC);
    ck_assert_uint_eq(cfg.n_workers, 1);
    ck_assert_int_eq(cfg.gpu_ids[0], -1);
    ck_assert_str_eq(cfg.transport, "auto");
    ck_assert_uint_eq(cfg.layout.dtype, HS_DTYPE_BF16);
    ck_assert(cfg.status_interval_s == 5);
    ck_assert(cfg.preflight_headroom == 0.1);
    ck_assert_uint_eq(cfg.to_port, 7000);
    hs_option_info_t info;
    bool seen = false;
    for (uint32_t i = 0; i < hs_producer_option_count(); i++) {
        ck_assert_int_eq(hs_producer_option_info(i, &info), HS_OK);
        if (!strcmp(info.name, "token_budget")) {
            ck_assert_str_eq(info.env, "HS_TOKEN_BUDGET");
            ck_assert_str_eq(info.flag, "token-budget");
            seen = true;
        }
    }
    ck_assert(seen);
    ck_assert_int_eq(hs_producer_option_info(hs_producer_option_count(), &info), HS_ERR_INVALID);
}
END_TEST

START_TEST(each_type_is_set_from_text)
{
    hs_producer_config_t cfg;
    hs_producer_config_default(&cfg);
    set_ok(&cfg, "token_budget", "64K"); /* a size */
    ck_assert_uint_eq(cfg.token_budget, 65536);
    set_ok(&cfg, "token_budget", "auto");
    ck_assert_uint_eq(cfg.token_budget, 0);
    set_ok(&cfg, "seed", "18446744073709551615"); /* u64, all of it */
    ck_assert(cfg.seed == UINT64_MAX);
    set_ok(&cfg, "overflow", "drop");
    ck_assert_int_eq(cfg.overflow, 1);
    set_ok(&cfg, "hs_dtype", "fp8");
    ck_assert_uint_eq(cfg.layout.dtype, HS_DTYPE_FP8);
    set_ok(&cfg, "layers", "2,16,29");
    ck_assert_uint_eq(cfg.layout.n_layers, 3);
    ck_assert_int_eq(cfg.layout.layers[2], 29);
    set_ok(&cfg, "gpus", "0,1,2");
    ck_assert_uint_eq(cfg.n_workers, 3);
    ck_assert_int_eq(cfg.gpu_ids[1], 1);
    set_ok(&cfg, "status_interval_s", "0"); /* off */
    ck_assert(cfg.status_interval_s < 0);
    set_ok(&cfg, "preflight_headroom", "20%");
    ck_assert(cfg.preflight_headroom > 0.19 && cfg.preflight_headroom < 0.21);
    set_ok(&cfg, "eagle3_layers", "yes");
    ck_assert(cfg.eagle3_layers);
}
END_TEST

START_TEST(bad_values_are_refused_naming_what_was_expected)
{
    set_bad("token_budget", "abc", "auto or a whole number from 1");
    set_bad("hidden_size", "0", "from 1 to 65536");
    set_bad("max_seq_len", "0", "from 1");
    set_bad("dflash_layers", "0", "from 1 to 32");
    set_bad("source", "magic", "'synthetic' or 'model'");
    set_bad("layers", "3,2", "increasing");
    set_bad("gpus", "cpu:0", "cpu:N");
    set_bad("to", "nowhere", "HOST:PORT");
    set_bad("transport", "pigeon", "'auto', 'shm', 'tcp' or 'ucx'");
    set_bad("frobnicate", "1", "unknown option 'frobnicate'");
}
END_TEST

/* A config of a synthetic run that passes; each case breaks one thing. */
static hs_producer_config_t good(void)
{
    hs_producer_config_t cfg;
    hs_producer_config_default(&cfg);
    set_ok(&cfg, "to", "127.0.0.1:7000");
    set_ok(&cfg, "data", "data.jsonl");
    set_ok(&cfg, "layers", "1,2");
    set_ok(&cfg, "hidden_size", "64");
    return cfg;
}

static void check_bad(const hs_producer_config_t *cfg, bool preflight, const char *expect)
{
    char why[256] = "";
    ck_assert_int_eq(hs_producer_config_check(cfg, preflight, why, sizeof why), HS_ERR_INVALID);
    ck_assert_msg(strstr(why, expect), "'%s' lacks '%s'", why, expect);
}

START_TEST(checks_between_options_name_the_option)
{
    char why[256];
    hs_producer_config_t cfg = good();
    ck_assert_int_eq(hs_producer_config_check(&cfg, false, why, sizeof why), HS_OK);
    cfg.to_list = NULL;
    check_bad(&cfg, false, "--to HOST:PORT is required");
    cfg = good();
    cfg.data_path = NULL;
    check_bad(&cfg, false, "--data FILE is required");
    cfg = good();
    set_ok(&cfg, "max_seq_len", "5000");
    set_ok(&cfg, "token_budget", "4096");
    check_bad(&cfg, false, "--max-seq-len 5000 is larger than --token-budget 4096");
    cfg = good();
    set_ok(&cfg, "dflash_layers", "3");
    check_bad(&cfg, false, "give one of --layers, --dflash-layers and --eagle3-layers");
    cfg = good();
    set_ok(&cfg, "source", "model");
    check_bad(&cfg, false, "--source model needs --model DIR");
    cfg = good();
    set_ok(&cfg, "token_budget", "auto");
    check_bad(&cfg, false, "measure the built-in model");
    cfg = good();
    cfg.layout.hidden_size = 0;
    check_bad(&cfg, false, "--source synthetic needs --hidden-size H");
    cfg = good();
    cfg.prefetch = 0; /* bounds too, for a config filled in C */
    check_bad(&cfg, false, "prefetch 0: expected a whole number from 1 to 64 (--prefetch)");
}
END_TEST

/* hs_producer_client_config_set, from the rows the producer's table
 * shares with it */
static void client_bad(const char *name, const char *value, const char *expect)
{
    hs_producer_client_config_t cfg, before;
    hs_producer_client_config_default(&cfg);
    before = cfg;
    char why[256] = "";
    ck_assert_int_eq(hs_producer_client_config_set(&cfg, name, value, why, sizeof why),
                     HS_ERR_INVALID);
    ck_assert_msg(strstr(why, expect), "%s=%s: '%s' lacks '%s'", name, value, why, expect);
    ck_assert_int_eq(memcmp(&cfg, &before, sizeof cfg), 0);
}

static void client_ok(hs_producer_client_config_t *cfg, const char *name, const char *value)
{
    char why[256] = "";
    ck_assert_msg(hs_producer_client_config_set(cfg, name, value, why, sizeof why) == HS_OK,
                  "%s=%s: %s", name, value, why);
}

START_TEST(the_client_config_is_set_by_name_from_the_shared_rows)
{
    hs_producer_client_config_t cfg;
    hs_producer_client_config_default(&cfg);
    ck_assert_uint_eq(cfg.token_budget, 65536); /* the producer table's defaults */
    ck_assert_uint_eq(cfg.prefetch, 2);
    ck_assert_uint_eq(cfg.connect_timeout_s, 30);
    ck_assert_str_eq(cfg.transport, "auto");
    ck_assert(!cfg.overflow_drop);
    ck_assert_int_eq(cfg.hs_dtype, HS_HIDDEN_BF16);
    ck_assert(cfg.status_interval_s == 5);
    ck_assert_uint_eq(cfg.staging_buffers, 3);
    ck_assert(!cfg.to && !cfg.data_path && !cfg.layers && !cfg.name && !cfg.secret_file);
    ck_assert_uint_eq(cfg.max_seq_len, 0);

    client_ok(&cfg, "overflow", "drop"); /* a choice into a bool */
    ck_assert(cfg.overflow_drop);
    client_ok(&cfg, "overflow", "truncate");
    ck_assert(!cfg.overflow_drop);
    client_ok(&cfg, "hs_dtype", "fp8"); /* the client's enum values */
    ck_assert_int_eq(cfg.hs_dtype, HS_HIDDEN_FP8);
    client_ok(&cfg, "token_budget", "4K");
    ck_assert_uint_eq(cfg.token_budget, 4096);
    client_ok(&cfg, "max_seq_len", "0"); /* 0 = the budget, as the struct says */
    ck_assert_uint_eq(cfg.max_seq_len, 0);
    client_ok(&cfg, "staging_buffers", "0");
    ck_assert_uint_eq(cfg.staging_buffers, 0);
    client_ok(&cfg, "staging_buffers", "2");
    ck_assert_uint_eq(cfg.staging_buffers, 2);
    client_ok(&cfg, "status_interval_s", "0"); /* 0 = the default 5, negative = off */
    ck_assert(cfg.status_interval_s == 0);
    client_ok(&cfg, "status_interval_s", "-1");
    ck_assert(cfg.status_interval_s == -1);
    client_ok(&cfg, "seed", "18446744073709551615");
    ck_assert(cfg.seed == UINT64_MAX);
    client_ok(&cfg, "data", "train.hst");
    ck_assert_str_eq(cfg.data_path, "train.hst");
    client_ok(&cfg, "to", "127.0.0.1:7000-7001");
    client_ok(&cfg, "reconnect", "true");
    ck_assert(cfg.reconnect);

    /* the producer table's bounds, named */
    client_bad("token_budget", "0", "expected a whole number from 1 to 1073741824 tokens");
    client_bad("token_budget", "auto", "expected a whole number"); /* hs-producer's only */
    client_bad("prefetch", "0", "from 1 to 64");
    client_bad("hidden_size", "-1", "from 1 to 65536");
    client_bad("staging_buffers", "1", "expected 0 or a whole number from 2 to 4");
    client_bad("staging_buffers", "5", "from 2 to 4");
    client_bad("overflow", "wrap", "expected 'truncate' or 'drop'");
    client_bad("hs_dtype", "int4", "expected 'bf16' or 'fp8'");
    client_bad("transport", "rdma", "expected 'auto', 'shm', 'tcp' or 'ucx'");
    client_bad("status_interval_s", "nan", "expected seconds");
    client_bad("layers", "2,16", "unknown option 'layers': expected one of to, data,");
}
END_TEST

int main(void)
{
    Suite *s = suite_create("producer_options");
    TCase *tc = tcase_create("table");
    tcase_add_test(tc, defaults_come_from_the_table);
    tcase_add_test(tc, each_type_is_set_from_text);
    tcase_add_test(tc, bad_values_are_refused_naming_what_was_expected);
    tcase_add_test(tc, checks_between_options_name_the_option);
    tcase_add_test(tc, the_client_config_is_set_by_name_from_the_shared_rows);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
