/* SPDX-License-Identifier: Apache-2.0 */
/* hs_parse.h - parsers of flag and environment values (sizes, numbers,
 * lists, host:port).
 *
 * Each returns HS_OK with the value in its output parameters, or
 * HS_ERR_INVALID; nothing is logged and nothing allocated. */
#ifndef HS_PARSE_H
#define HS_PARSE_H

#include <stddef.h>
#include <stdint.h>

#include "hsflow.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Parse an unsigned integer with an optional K, M, G or T suffix (powers of
 * 1024; "KiB"/"KB" spellings accepted too). */
HS_MUST_CHECK hs_status_t hs_parse_size(const char *s, uint64_t *out);
/* Parse a decimal u64 / i64 / double; the whole string must be consumed. */
HS_MUST_CHECK hs_status_t hs_parse_u64(const char *s, uint64_t *out);
HS_MUST_CHECK hs_status_t hs_parse_i64(const char *s, int64_t *out);
HS_MUST_CHECK hs_status_t hs_parse_double(const char *s, double *out);
/* Parse "1,9,17" into out[0..*n); fails if more than cap entries. */
HS_MUST_CHECK hs_status_t hs_parse_int_list(const char *s, int *out, int cap, int *n);
/* Split "host:port"; host copied into host[hostcap]. "[::1]:7000" works. */
HS_MUST_CHECK hs_status_t hs_parse_hostport(const char *s, char *host, size_t hostcap,
                                            uint16_t *port);

#ifdef __cplusplus
}
#endif

#endif /* HS_PARSE_H */
