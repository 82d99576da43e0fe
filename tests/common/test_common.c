/* test_common.c - parsers, CRC-32C and the chunked payload checksum. */
#include <check.h>
#include <stdlib.h>
#include <string.h>

#include "hs_common.h"

START_TEST(crc32c_matches_the_castagnoli_check_value)
{
    ck_assert_uint_eq(hs_crc32c(0, "123456789", 9), 0xe3069283u);
    /* incremental == one shot */
    uint32_t c = hs_crc32c(0, "1234", 4);
    ck_assert_uint_eq(hs_crc32c(c, "56789", 5), 0xe3069283u);
}
END_TEST

START_TEST(checksum64_is_the_combination_of_chunk_hashes)
{
    size_t len = 3 * HS_CHECKSUM_CHUNK + 12345;
    uint8_t *buf = malloc(len);
    for (size_t i = 0; i < len; i++) buf[i] = (uint8_t)(i * 2654435761u >> 13);
    uint64_t h[4];
    for (int i = 0; i < 4; i++) {
        size_t off = (size_t)i * HS_CHECKSUM_CHUNK;
        size_t l = len - off < HS_CHECKSUM_CHUNK ? len - off : HS_CHECKSUM_CHUNK;
        h[i] = hs_checksum64_chunk(buf + off, l);
    }
    uint64_t whole = hs_checksum64(buf, len);
    ck_assert_uint_eq(whole, hs_checksum64_combine(h, 4));
    buf[len / 2] ^= 1;
    ck_assert_uint_ne(whole, hs_checksum64(buf, len));
    free(buf);
}
END_TEST

START_TEST(checksum64_handles_more_chunks_than_its_stack_buffer)
{
    size_t n = 70;
    size_t len = n * HS_CHECKSUM_CHUNK - 1;
    uint8_t *buf = calloc(1, len);
    uint64_t *h = malloc(n * sizeof(uint64_t));
    for (size_t i = 0; i < n; i++) {
        size_t off = i * HS_CHECKSUM_CHUNK;
        size_t l = len - off < HS_CHECKSUM_CHUNK ? len - off : HS_CHECKSUM_CHUNK;
        h[i] = hs_checksum64_chunk(buf + off, l);
    }
    ck_assert_uint_eq(hs_checksum64(buf, len), hs_checksum64_combine(h, n));
    free(h);
    free(buf);
}
END_TEST

START_TEST(checksum_stream_equals_one_shot_for_any_split)
{
    size_t len = 2 * HS_CHECKSUM_CHUNK + 777;
    uint8_t *buf = malloc(len);
    for (size_t i = 0; i < len; i++) buf[i] = (uint8_t)(i * 40503u >> 7);
    hs_checksum_stream_t *s = hs_checksum_stream_create();
    size_t splits[] = {1, 4096, 24576, HS_CHECKSUM_CHUNK, 3 * HS_CHECKSUM_CHUNK};
    for (size_t k = 0; k < sizeof(splits) / sizeof(splits[0]); k++) {
        hs_checksum_stream_reset(s);
        for (size_t off = 0; off < len; off += splits[k])
            hs_checksum_stream_update(s, buf + off, len - off < splits[k] ? len - off : splits[k]);
        ck_assert_uint_eq(hs_checksum_stream_final(s), hs_checksum64(buf, len));
    }
    hs_checksum_stream_reset(s);
    ck_assert_uint_eq(hs_checksum_stream_final(s), hs_checksum64(buf, 0));
    hs_checksum_stream_reset(s);
    hs_checksum_stream_update(s, buf, HS_CHECKSUM_CHUNK);
    ck_assert_uint_eq(hs_checksum_stream_final(s), hs_checksum64(buf, HS_CHECKSUM_CHUNK));
    hs_checksum_stream_destroy(s);
    free(buf);
}
END_TEST

START_TEST(parsers_accept_good_input_and_reject_bad)
{
    uint64_t v;
    ck_assert_int_eq(hs_parse_size("64G", &v), HS_OK);
    ck_assert_uint_eq(v, 64ull << 30);
    ck_assert_int_eq(hs_parse_size("3MiB", &v), HS_OK);
    ck_assert_uint_eq(v, 3ull << 20);
    ck_assert_int_eq(hs_parse_size("12", &v), HS_OK);
    ck_assert_uint_eq(v, 12);
    ck_assert_int_eq(hs_parse_size("-1", &v), HS_ERR_INVALID);
    ck_assert_int_eq(hs_parse_size("1X", &v), HS_ERR_INVALID);
    ck_assert_int_eq(hs_parse_size("", &v), HS_ERR_INVALID);
    ck_assert_int_eq(hs_parse_u64("12a", &v), HS_ERR_INVALID);

    int l[4], n;
    ck_assert_int_eq(hs_parse_int_list("1,9,17", l, 4, &n), HS_OK);
    ck_assert_int_eq(n, 3);
    ck_assert_int_eq(l[2], 17);
    ck_assert_int_eq(hs_parse_int_list("1,,2", l, 4, &n), HS_ERR_INVALID);
    ck_assert_int_eq(hs_parse_int_list("1,2,", l, 4, &n), HS_ERR_INVALID);
    ck_assert_int_eq(hs_parse_int_list("1,2,3,4,5", l, 4, &n), HS_ERR_INVALID);

    char host[64];
    uint16_t port;
    ck_assert_int_eq(hs_parse_hostport("127.0.0.1:7000", host, sizeof host, &port), HS_OK);
    ck_assert_str_eq(host, "127.0.0.1");
    ck_assert_uint_eq(port, 7000);
    ck_assert_int_eq(hs_parse_hostport("[::1]:80", host, sizeof host, &port), HS_OK);
    ck_assert_str_eq(host, "::1");
    ck_assert_int_eq(hs_parse_hostport("host:99999", host, sizeof host, &port), HS_ERR_INVALID);
    ck_assert_int_eq(hs_parse_hostport("host", host, sizeof host, &port), HS_ERR_INVALID);
}
END_TEST

START_TEST(flags_map_to_hs_environment_variables)
{
    setenv("HS_CACHE_GB", "12", 1);
    ck_assert_str_eq(hs_env_for_flag("cache-gb"), "12");
    unsetenv("HS_CACHE_GB");
    ck_assert_ptr_null(hs_env_for_flag("cache-gb"));
}
END_TEST

int main(void)
{
    Suite *s = suite_create("common");
    TCase *tc = tcase_create("all");
    tcase_add_test(tc, crc32c_matches_the_castagnoli_check_value);
    tcase_add_test(tc, checksum64_is_the_combination_of_chunk_hashes);
    tcase_add_test(tc, checksum64_handles_more_chunks_than_its_stack_buffer);
    tcase_add_test(tc, checksum_stream_equals_one_shot_for_any_split);
    tcase_add_test(tc, parsers_accept_good_input_and_reject_bad);
    tcase_add_test(tc, flags_map_to_hs_environment_variables);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
