/* SPDX-License-Identifier: Apache-2.0 */
/* hs_time.h - the monotonic clock. */
#ifndef HS_TIME_H
#define HS_TIME_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

uint64_t hs_now_ns(void); /* CLOCK_MONOTONIC */
double hs_now_s(void);

#ifdef __cplusplus
}
#endif

#endif /* HS_TIME_H */
