/* SPDX-License-Identifier: Apache-2.0 */
/* options_int.h - the consumer's option table (options.c) as the library
 * uses it: the bounds hs_consumer_create checks, and the values of the
 * options kept in hs_consumer_config_t.more. */
#ifndef HS_OPTIONS_INT_H
#define HS_OPTIONS_INT_H

#include "hsflow.h"

#include <stddef.h>

/* Every number and choice of cfg within its option's bounds: HS_OK, or
 * HS_ERR_INVALID with why[cap] naming the first option that is not
 * ("cache_gb 0.0001: expected GiB from 0.0009765625 to 1048576"). */
HS_MUST_CHECK hs_status_t hs__consumer_options_check(const hs_consumer_config_t *cfg, char *why,
                                                     size_t cap);

/* The value of the u32 / double option `name` of cfg, wherever it is kept
 * (an option kept in cfg->more has no field of its own). `name` must be an
 * option of that type (asserted). */
uint32_t hs__consumer_option_u32(const hs_consumer_config_t *cfg, const char *name);
double hs__consumer_option_double(const hs_consumer_config_t *cfg, const char *name);

/* Tests: faults injected into what every consumer created after this call
 * receives, "corrupt=N,cut=N,delay_ms=MS" (hs-consumer --fault, checked
 * where the transport starts); NULL = none. The string is the caller's and
 * must outlive those consumers (argv or the environment). Process-wide;
 * main's thread, before hs_consumer_create. */
void hs__consumer_fault_set(const char *spec);
const char *hs__consumer_fault(void);

#endif /* HS_OPTIONS_INT_H */
