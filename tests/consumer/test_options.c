/* SPDX-License-Identifier: Apache-2.0 */
/* test_options.c - the consumer's option table: hs_consumer_config_set for
 * each type, its bounds and unknown names refused with a message, the
 * defaults equal to the table's, and hs_consumer_create's checks holding a
 * config to the same bounds. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hsflow.h"
#include "options_int.h"

static hs_option_info_t info_of(const char *name)
{
    hs_option_info_t info;
    for (uint32_t i = 0; i < hs_consumer_option_count(); i++) {
        ck_assert_int_eq(hs_consumer_option_info(i, &info), HS_OK);
        if (!strcmp(info.name, name)) return info;
    }
    ck_abort_msg("no option %s", name);
    return info;
}

/* set must succeed */
static void set_ok(hs_consumer_config_t *cfg, const char *name, const char *value)
{
    char why[256] = "";
    ck_assert_msg(hs_consumer_config_set(cfg, name, value, why, sizeof why) == HS_OK, "%s=%s: %s",
                  name, value, why);
}

/* set must fail, cfg unchanged, and why must hold `expect` */
static void set_bad(const char *name, const char *value, const char *expect)
{
    hs_consumer_config_t cfg, before;
    hs_consumer_config_default(&cfg);
    before = cfg;
    char why[256] = "";
    ck_assert_int_eq(hs_consumer_config_set(&cfg, name, value, why, sizeof why), HS_ERR_INVALID);
    ck_assert_msg(strstr(why, expect), "%s=%s: '%s' lacks '%s'", name, value, why, expect);
    ck_assert_int_eq(memcmp(&cfg, &before, sizeof cfg), 0);
}

START_TEST(test_each_type_is_set_from_text)
{
    hs_consumer_config_t cfg;
    hs_consumer_config_default(&cfg);
    set_ok(&cfg, "epochs", "3"); /* u32 */
    ck_assert_uint_eq(cfg.epochs, 3);
    set_ok(&cfg, "cache_gb", "0.5"); /* GiB into bytes */
    ck_assert_uint_eq(cfg.cache_bytes, 512ull << 20);
    set_ok(&cfg, "lease_timeout_s", "2.5"); /* double */
    ck_assert(cfg.lease_timeout_s == 2.5);
    set_ok(&cfg, "force", "true"); /* bool */
    ck_assert(cfg.force);
    set_ok(&cfg, "force", "0");
    ck_assert(!cfg.force);
    set_ok(&cfg, "gpu", "3"); /* int, with none */
    ck_assert_int_eq(cfg.gpu, 3);
    set_ok(&cfg, "gpu", "none");
    ck_assert_int_eq(cfg.gpu, -1);
    set_ok(&cfg, "order", "plan"); /* enum */
    ck_assert_int_eq(cfg.order, HS_ORDER_PLAN);
    set_ok(&cfg, "deliver", "fp8");
    ck_assert_int_eq(cfg.deliver, HS_HIDDEN_FP8);
    const char *store = "/tmp/store";
    set_ok(&cfg, "store", store); /* string: the pointer is kept */
    ck_assert_ptr_eq(cfg.store, store);
    set_ok(&cfg, "transport", "tcp"); /* string among choices */
    ck_assert_str_eq(cfg.transport, "tcp");
    set_ok(&cfg, "expect_plan", "3f2a9c0d5e6b7a81");
    set_ok(&cfg, "expect_layout", "H=4096,layers=2,16,29,dtype=bf16");
}
END_TEST

START_TEST(test_bounds_and_forms_are_refused_naming_them)
{
    set_bad("epochs", "0", "from 1 to 1000000");
    set_bad("epochs", "1.5", "whole number");
    set_bad("prefetch", "65", "from 1 to 64");
    set_bad("cache_gb", "0.0005", "GiB from 0.0009765625 to 1048576");
    set_bad("cache_gb", "abc", "GiB");
    set_bad("lease_min_tokens_per_s", "0", "more than 0");
    set_bad("lease_timeout_s", "-1", "s from 0 to 1000000");
    set_bad("lease_timeout_s", "nan", "from 0");
    set_bad("gpu", "-3", "none or a whole number");
    set_bad("order", "random", "expected 'arrival' or 'plan'");
    set_bad("transport", "rdma", "expected 'auto', 'shm', 'tcp' or 'ucx'");
    set_bad("force", "maybe", "expected 1 or 0");
    set_bad("expect_plan", "xyz", "16 hex digits");
    set_bad("expect_layout", "nonsense", "e.g. H=4096");
    set_bad("metrics", "nowhere", "HOST:PORT");
    set_bad("store", "", "a folder");
    set_bad("no_such_option", "1", "unknown option 'no_such_option'");
    set_bad("epochs", NULL, "no value given");
    char why[128];
    ck_assert_int_eq(hs_consumer_config_set(NULL, "epochs", "1", why, sizeof why), HS_ERR_INVALID);
    ck_assert_int_eq(hs_consumer_option_info(0, NULL), HS_ERR_INVALID);
}
END_TEST

START_TEST(test_defaults_are_the_tables)
{
    hs_consumer_config_t def, cfg;
    hs_consumer_config_default(&def);
    memset(&cfg, 0, sizeof cfg);
    cfg.listen_host = def.listen_host;
    cfg.listen_port = def.listen_port;
    cfg.status_interval_s = def.status_interval_s;
    for (uint32_t i = 0; i < hs_consumer_option_count(); i++) {
        hs_option_info_t o;
        ck_assert_int_eq(hs_consumer_option_info(i, &o), HS_OK);
        if (o.default_text[0]) set_ok(&cfg, o.name, o.default_text);
    }
    /* strings compare by their text: "auto" is the table's, not def's pointer */
    ck_assert_str_eq(cfg.transport, def.transport);
    cfg.transport = def.transport;
    ck_assert_int_eq(memcmp(&cfg, &def, sizeof cfg), 0);
    ck_assert_uint_eq(def.cache_bytes, 4ull << 30);
    ck_assert_int_eq(def.gpu, -1);
    ck_assert_uint_eq(def.world, 1);
    hs_option_info_t o;
    ck_assert_int_eq(hs_consumer_option_info(hs_consumer_option_count(), &o), HS_ERR_INVALID);
}
END_TEST

START_TEST(test_info_names_flag_env_and_bounds)
{
    hs_option_info_t o = info_of("cache_gb");
    ck_assert_str_eq(o.flag, "cache-gb");
    ck_assert_str_eq(o.env, "HS_CACHE_GB");
    ck_assert_str_eq(o.type, "double");
    ck_assert_str_eq(o.unit, "GiB");
    ck_assert(o.min == 1.0 / 1024 && o.max == 1 << 20 && !o.min_open);
    o = info_of("lease_min_tokens_per_s");
    ck_assert_str_eq(o.env, "HS_LEASE_MIN_RATE");
    ck_assert(o.min_open);
    ck_assert_str_eq(info_of("order").choices, "arrival|plan");
    ck_assert_str_eq(info_of("peer_timeout_s").env, "");
    /* an option kept in cfg.more: set by name, read by name */
    hs_consumer_config_t cfg;
    hs_consumer_config_default(&cfg);
    ck_assert_uint_eq(hs__consumer_option_u32(&cfg, "max_producers"), 0);
    set_ok(&cfg, "max_producers", "3");
    ck_assert_uint_eq(hs__consumer_option_u32(&cfg, "max_producers"), 3);
    ck_assert_str_eq(info_of("max_producers").env, "HS_MAX_PRODUCERS");
}
END_TEST

START_TEST(test_create_checks_the_same_bounds)
{
    hs_consumer_config_t cfg;
    hs_consumer_config_default(&cfg);
    char why[256];
    ck_assert_int_eq(hs__consumer_options_check(&cfg, why, sizeof why), HS_OK);
    cfg.cache_bytes = 1u << 20; /* the smallest cache: 1 MiB */
    ck_assert_int_eq(hs__consumer_options_check(&cfg, why, sizeof why), HS_OK);
    cfg.cache_bytes = (1u << 20) - 1;
    ck_assert_int_eq(hs__consumer_options_check(&cfg, why, sizeof why), HS_ERR_INVALID);
    ck_assert_msg(strstr(why, "cache_gb") && strstr(why, "--cache-gb"), "%s", why);
    hs_consumer_config_default(&cfg);
    cfg.verify_threads = 65;
    ck_assert_int_eq(hs__consumer_options_check(&cfg, why, sizeof why), HS_ERR_INVALID);
    ck_assert_msg(strstr(why, "verify_threads 65: expected a whole number from 1 to 64"), "%s",
                  why);
    hs_consumer_config_default(&cfg);
    cfg.uneven = (hs_uneven_t)7;
    ck_assert_int_eq(hs__consumer_options_check(&cfg, why, sizeof why), HS_ERR_INVALID);
    ck_assert_msg(strstr(why, "'drop' or 'repeat'"), "%s", why);
    hs_consumer_t *c = NULL;
    hs_consumer_config_default(&cfg);
    cfg.epochs = 0;
    ck_assert_int_eq(hs_consumer_create(&cfg, &c), HS_ERR_INVALID);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("options");
    TCase *tc = tcase_create("options");
    tcase_add_test(tc, test_each_type_is_set_from_text);
    tcase_add_test(tc, test_bounds_and_forms_are_refused_naming_them);
    tcase_add_test(tc, test_defaults_are_the_tables);
    tcase_add_test(tc, test_info_names_flag_env_and_bounds);
    tcase_add_test(tc, test_create_checks_the_same_bounds);
    suite_add_tcase(s, tc);
    SRunner *r = srunner_create(s);
    srunner_run_all(r, CK_NORMAL);
    int failed = srunner_ntests_failed(r);
    srunner_free(r);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
